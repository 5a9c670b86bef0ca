//! Where the Object Storage API is and who the agent is to it: endpoint (default
//! `https://objectstorage.{region}.oraclecloud.com`, the region given or, for an InstancePrincipal,
//! the instance's), namespace, and the principal (OME's `auth` values: `UserPrincipal` with an API key,
//! `InstancePrincipal`, the default; `ResourcePrincipal` and `OkeWorkloadIdentity` are refused).

use std::fmt;

use http::Uri;

use super::OciError;
pub use super::instance::InstanceEndpoints;

/// Longest region identifier accepted (real ones: `us-ashburn-1`, `eu-frankfurt-1`, …).
const REGION_BYTES_MAX: usize = 64;

/// An API key of one user (OME's `UserPrincipal`). Its `Debug` never shows the key or the passphrase.
#[derive(Clone)]
pub struct UserPrincipal {
    pub tenancy: String,
    pub user: String,
    /// `aa:bb:…`, as the console shows it for the key.
    pub fingerprint: String,
    pub private_key_pem: String,
    /// Encrypted keys are refused for now (with a reason saying so).
    pub passphrase: Option<String>,
}

impl fmt::Debug for UserPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserPrincipal")
            .field("tenancy", &self.tenancy)
            .field("user", &self.user)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

/// Who signs the requests.
#[derive(Clone, Debug)]
pub enum OciAuth {
    UserPrincipal(UserPrincipal),
    /// The instance's own certificate from the metadata service, exchanged for session tokens.
    InstancePrincipal(InstanceEndpoints),
}

impl OciAuth {
    /// OME's `storage.parameters["auth"]` names (default `InstancePrincipal`); only the name is checked here.
    pub fn kind_from_parameter(value: Option<&str>) -> Result<&'static str, OciError> {
        match value.unwrap_or("InstancePrincipal") {
            "UserPrincipal" => Ok("UserPrincipal"),
            "InstancePrincipal" => Ok("InstancePrincipal"),
            other @ ("ResourcePrincipal" | "OkeWorkloadIdentity") => {
                Err(OciError::Unsupported { what: format!("auth {other}") })
            }
            other => Err(OciError::BadConfig {
                reason: format!("auth {other:?} is not one of UserPrincipal, InstancePrincipal"),
            }),
        }
    }
}

#[derive(Clone, Debug)]
pub struct OciConfig {
    /// `http(s)://host[:port]`, no path; `None`: the region's public endpoint.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// The tenancy's Object Storage namespace (from the `oci://n/{namespace}/…` URI).
    pub namespace: String,
    pub auth: OciAuth,
}

/// A checked endpoint: the base to prefix paths with and the `Host` header value (signed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Endpoint {
    /// `scheme://authority`, without a trailing `/`.
    pub base: String,
    pub host: String,
    pub uri: Uri,
}

pub(super) fn check_region(region: &str) -> Result<(), OciError> {
    let usable = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
    if !region.is_empty() && region.len() <= REGION_BYTES_MAX && region.bytes().all(usable) {
        return Ok(());
    }
    Err(OciError::BadConfig { reason: format!("region {region:?} is not a region identifier like us-ashburn-1") })
}

/// The endpoint given, or the region's; `None` when neither is set.
pub(super) fn endpoint(config: &OciConfig) -> Result<Option<Endpoint>, OciError> {
    match (&config.endpoint, &config.region) {
        (Some(endpoint), _) if !endpoint.trim().is_empty() => {
            parse_endpoint(endpoint.trim().trim_end_matches('/')).map(Some)
        }
        (_, Some(region)) => region_endpoint(region).map(Some),
        _ => Ok(None),
    }
}

/// `https://objectstorage.{region}.oraclecloud.com`.
pub(super) fn region_endpoint(region: &str) -> Result<Endpoint, OciError> {
    check_region(region)?;
    parse_endpoint(&format!("https://objectstorage.{region}.oraclecloud.com"))
}

fn parse_endpoint(text: &str) -> Result<Endpoint, OciError> {
    let bad = |reason: &str| OciError::BadConfig { reason: format!("endpoint {text:?} {reason}") };
    let uri: Uri = text.parse().map_err(|_| bad("is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("must be http:// or https://"));
    }
    if uri.path() != "/" || uri.query().is_some() {
        return Err(bad("must not have a path or a query"));
    }
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("must not hold credentials"));
    }
    let host = authority.as_str().to_owned();
    Ok(Endpoint { base: format!("{}://{host}", uri.scheme_str().unwrap_or("https")), host, uri })
}

/// A namespace is one path segment of letters, digits and `-`/`_` (OCI's are lowercase alphanumerics).
pub(super) fn check_namespace(namespace: &str) -> Result<(), OciError> {
    let usable = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if !namespace.is_empty() && namespace.len() <= 256 && namespace.bytes().all(usable) {
        return Ok(());
    }
    Err(OciError::BadConfig { reason: format!("namespace {namespace:?} is not usable") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(endpoint: Option<&str>, region: Option<&str>) -> OciConfig {
        OciConfig {
            endpoint: endpoint.map(str::to_owned),
            region: region.map(str::to_owned),
            namespace: "ns".into(),
            auth: OciAuth::InstancePrincipal(InstanceEndpoints::default()),
        }
    }

    #[test]
    fn the_endpoint_defaults_to_the_regions_and_is_checked() {
        let by_region = endpoint(&config(None, Some("us-ashburn-1"))).unwrap().unwrap();
        assert_eq!(by_region.base, "https://objectstorage.us-ashburn-1.oraclecloud.com");
        assert_eq!(by_region.host, "objectstorage.us-ashburn-1.oraclecloud.com");
        let local = endpoint(&config(Some("http://127.0.0.1:9000/"), Some("ignored"))).unwrap().unwrap();
        assert_eq!((local.base.as_str(), local.host.as_str()), ("http://127.0.0.1:9000", "127.0.0.1:9000"));
        assert!(endpoint(&config(None, Some("us/evil"))).is_err());
        assert_eq!(endpoint(&config(None, None)).unwrap(), None, "the instance's region, for an InstancePrincipal");
        assert!(endpoint(&config(Some("ftp://x"), None)).is_err());
        assert!(endpoint(&config(Some("https://x/prefix"), None)).is_err());
        assert!(endpoint(&config(Some("https://u:p@x"), None)).is_err());
    }

    #[test]
    fn auth_parameters_read_omes_names() {
        assert_eq!(OciAuth::kind_from_parameter(None).unwrap(), "InstancePrincipal");
        assert_eq!(OciAuth::kind_from_parameter(Some("UserPrincipal")).unwrap(), "UserPrincipal");
        assert!(matches!(OciAuth::kind_from_parameter(Some("ResourcePrincipal")), Err(OciError::Unsupported { .. })));
        assert!(matches!(OciAuth::kind_from_parameter(Some("auth_type")), Err(OciError::BadConfig { .. })));
        assert!(check_namespace("axaxnpcrorw5").is_ok() && check_namespace("a/b").is_err());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let principal = UserPrincipal {
            tenancy: "t".into(),
            user: "u".into(),
            fingerprint: "f".into(),
            private_key_pem: "-----BEGIN PRIVATE KEY-----secret".into(),
            passphrase: Some("pass".into()),
        };
        let text = format!("{principal:?}");
        assert!(!text.contains("secret") && !text.contains("pass"), "{text}");
    }
}
