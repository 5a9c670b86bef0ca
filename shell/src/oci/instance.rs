//! OME's default `auth: InstancePrincipal`, written from OCI's documented protocol and read against the
//! public SDKs (oci-go-sdk `common/auth`, oci-python-sdk `oci/auth`):
//! - the instance metadata service (`http://169.254.169.254/opc/v2`, every request with
//!   `Authorization: Bearer Oracle`, never through a proxy) gives the instance's certificate
//!   (`identity/cert.pem`), its key (`identity/key.pem`), the intermediate certificate
//!   (`identity/intermediate.pem`) and the region (`instance/canonicalRegionName`);
//! - the certificate's subject names the tenancy (`opc-tenant:` or `opc-identity:`);
//! - the agent makes a session RSA key pair and asks the federation service (`POST
//!   https://auth.{region}.oraclecloud.com/v1/x509`, body `{certificate, publicKey,
//!   intermediateCertificates, fingerprintAlgorithm: "SHA256"}`, signed with the instance key over
//!   `date (request-target) content-length content-type x-content-sha256`, keyId
//!   `{tenancy}/fed-x509-sha256/{SHA-256 of the certificate}`) for a security token, a JWT bound to the
//!   session's public key;
//! - Object Storage requests are then signed with keyId `ST${token}` and the session key. The token is
//!   renewed (with a new session key and the metadata read again: certificates rotate) before its `exp`,
//!   and once after a 401.
//!
//! Both endpoints can be moved (tests, other realms) with the Go SDK's variables:
//! `OCI_METADATA_BASE_URL` and `OCI_SDK_AUTH_CLIENT_REGION_URL` (the federation base, before `/v1/x509`).
//! Tested only against the project's fakes (testsupport/fakeoci), not against OCI.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, DATE, HOST, USER_AGENT};
use ::http::{Request, StatusCode, Uri};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use http_body_util::Full;
use hyper::body::Bytes;
use ring::signature::RsaKeyPair;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::{OciError, Timeouts, USER_AGENT_VALUE, config, error, http, signer};
use crate::hf::Network;
use signer::RequestSigner;

pub const METADATA_URL_ENV: &str = "OCI_METADATA_BASE_URL";
pub const FEDERATION_URL_ENV: &str = "OCI_SDK_AUTH_CLIENT_REGION_URL";
const METADATA_URL_DEFAULT: &str = "http://169.254.169.254/opc/v2";
/// One metadata answer at most (a PEM chain is a few kilobytes).
const METADATA_BODY_BYTES_MAX: usize = 64 * 1024;
/// The federation's answer at most (a JWT of a few kilobytes).
const TOKEN_BODY_BYTES_MAX: usize = 64 * 1024;
/// What the SDKs make.
const SESSION_KEY_BITS: usize = 2048;
/// A token is renewed half-way through its life, and at most this long before its `exp` (the Go
/// SDK's margin; OCI's tokens live about 20 minutes).
const RENEW_MARGIN_S_MAX: u64 = 300;
const CONTENT_TYPE_JSON: &str = "application/json";

/// Where the metadata and federation services are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceEndpoints {
    /// `http://169.254.169.254/opc/v2`, or `OCI_METADATA_BASE_URL`.
    pub metadata_base_url: String,
    /// `OCI_SDK_AUTH_CLIENT_REGION_URL`; `None`: `https://auth.{instance's region}.oraclecloud.com`.
    pub federation_base_url: Option<String>,
}

impl Default for InstanceEndpoints {
    fn default() -> Self {
        InstanceEndpoints { metadata_base_url: METADATA_URL_DEFAULT.into(), federation_base_url: None }
    }
}

impl InstanceEndpoints {
    /// The defaults, moved by the variables `env` gives (empty ones are unset).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> InstanceEndpoints {
        let set = |name| env(name).map(|v| v.trim().trim_end_matches('/').to_owned()).filter(|v| !v.is_empty());
        InstanceEndpoints {
            metadata_base_url: set(METADATA_URL_ENV).unwrap_or_else(|| METADATA_URL_DEFAULT.into()),
            federation_base_url: set(FEDERATION_URL_ENV),
        }
    }
}

/// What the instance is, as the metadata service says: what the token request sends and signs with.
struct Identity {
    certificate_b64: String,
    intermediates_b64: Vec<String>,
    /// The instance key, keyId `{tenancy}/fed-x509-sha256/{fingerprint}`.
    signer: RequestSigner,
}

struct Session {
    signer: Arc<RequestSigner>,
    renew_at: SystemTime,
}

/// The instance's principal: a session renewed as needed, shared by every request of one client.
pub(super) struct InstancePrincipal {
    endpoints: InstanceEndpoints,
    metadata: http::OciHttp,
    federation: http::OciHttp,
    stall_timeout_ms: u64,
    region: tokio::sync::OnceCell<String>,
    session: tokio::sync::Mutex<Option<Session>>,
}

fn failure(reason: String) -> OciError {
    OciError::InstancePrincipal { reason }
}

/// An `http(s)://` base URL without a query.
fn check_base_url(url: &str, variable: &str) -> Result<Uri, OciError> {
    let bad = |why: &str| OciError::BadConfig { reason: format!("{variable} {url:?} {why}") };
    let uri: Uri = url.parse().map_err(|_| bad("is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        return Err(bad("must be http(s)://host[:port][/path]"));
    }
    if uri.query().is_some() || uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(bad("must have no query and no credentials"));
    }
    Ok(uri)
}

impl InstancePrincipal {
    /// Checks the endpoints; nothing is asked yet.
    pub fn new(
        endpoints: InstanceEndpoints,
        timeouts: Timeouts,
        network: &Network,
    ) -> Result<InstancePrincipal, OciError> {
        check_base_url(&endpoints.metadata_base_url, METADATA_URL_ENV)?;
        if let Some(url) = &endpoints.federation_base_url {
            check_base_url(url, FEDERATION_URL_ENV)?;
        }
        // The metadata service is link-local: a proxy could not reach it (and must not see the key).
        let direct = Network { ca_bundle: network.ca_bundle.clone(), ..Network::default() };
        Ok(InstancePrincipal {
            metadata: http::OciHttp::new(timeouts.connect_ms, &direct)?,
            federation: http::OciHttp::new(timeouts.connect_ms, network)?,
            endpoints,
            stall_timeout_ms: timeouts.stall_ms,
            region: tokio::sync::OnceCell::new(),
            session: tokio::sync::Mutex::new(None),
        })
    }

    /// The instance's region, asked once.
    pub async fn region(&self) -> Result<String, OciError> {
        let asked = self.region.get_or_try_init(|| async {
            let region = self.metadata_text("instance/canonicalRegionName").await?.trim().to_owned();
            config::check_region(&region)?;
            Ok::<_, OciError>(region)
        });
        asked.await.cloned()
    }

    /// The current session's signer, renewed first when its token is near its `exp`.
    pub async fn signer(&self) -> Result<Arc<RequestSigner>, OciError> {
        let mut session = self.session.lock().await;
        if let Some(current) = session.as_ref().filter(|s| SystemTime::now() < s.renew_at) {
            return Ok(current.signer.clone());
        }
        let renewed = self.renew().await?;
        let signer = renewed.signer.clone();
        *session = Some(renewed);
        Ok(signer)
    }

    /// Drops the session `used` belongs to (its token was refused): the next `signer` renews it.
    pub async fn forget(&self, used: &Arc<RequestSigner>) {
        let mut session = self.session.lock().await;
        if session.as_ref().is_some_and(|s| Arc::ptr_eq(&s.signer, used)) {
            *session = None;
        }
    }

    async fn renew(&self) -> Result<Session, OciError> {
        let identity = self.identity().await?;
        let made = tokio::task::spawn_blocking(make_session_key).await;
        let (session_key, public_key_b64) = made.map_err(|e| failure(format!("making the session key: {e}")))??;
        let token = self.request_token(&identity, &public_key_b64).await?;
        let renew_at = renew_time(&token, SystemTime::now())?;
        let signer = RequestSigner::for_session(&token, session_key)?;
        Ok(Session { signer: Arc::new(signer), renew_at })
    }

    async fn identity(&self) -> Result<Identity, OciError> {
        let certificate = self.metadata_text("identity/cert.pem").await?;
        let key = self.metadata_text("identity/key.pem").await?;
        let intermediate = self.metadata_text("identity/intermediate.pem").await?;
        identity_of(&certificate, &key, &intermediate)
    }

    /// One metadata value, as text.
    async fn metadata_text(&self, path: &str) -> Result<String, OciError> {
        let url = format!("{}/{path}", self.endpoints.metadata_base_url);
        let what = format!("GET {url} (instance metadata)");
        let request = Request::get(&url)
            .header(AUTHORIZATION, "Bearer Oracle")
            .header(USER_AGENT, USER_AGENT_VALUE)
            .body(Full::new(Bytes::new()))
            .map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })?;
        let response = self.metadata.send(request, self.stall_timeout_ms, &what).await.map_err(|e| match e {
            OciError::Network { reason } => OciError::Network {
                reason: format!("{reason} (InstancePrincipal needs the metadata service of an OCI instance)"),
            },
            other => other,
        })?;
        let (parts, body) = response.into_parts();
        let bytes = http::read_body(body, METADATA_BODY_BYTES_MAX, self.stall_timeout_ms, &what).await?;
        match parts.status {
            StatusCode::OK => String::from_utf8(bytes).map_err(|_| failure(format!("{what}: not text"))),
            status if status.is_server_error() => Err(error::classify_status(status, &parts.headers, &bytes, &what)),
            status => Err(failure(format!("{what}: {status} (is the node an OCI instance?)"))),
        }
    }

    /// Asks the federation service for a token bound to the session's public key.
    async fn request_token(&self, identity: &Identity, public_key_b64: &str) -> Result<String, OciError> {
        let base = match &self.endpoints.federation_base_url {
            Some(base) => base.clone(),
            None => format!("https://auth.{}.oraclecloud.com", self.region().await?),
        };
        let url = check_base_url(&format!("{base}/v1/x509"), FEDERATION_URL_ENV)?;
        let (path, host) = (url.path().to_owned(), url.authority().map(|a| a.to_string()).unwrap_or_default());
        let body = serde_json::json!({
            "certificate": identity.certificate_b64,
            "publicKey": public_key_b64,
            "intermediateCertificates": identity.intermediates_b64,
            "fingerprintAlgorithm": "SHA256",
        })
        .to_string();
        let date = httpdate::fmt_http_date(SystemTime::now());
        let (authorization, content_sha256) =
            identity.signer.body_authorization(&path, &date, CONTENT_TYPE_JSON, body.as_bytes())?;
        let what = format!("POST {url} (InstancePrincipal token)");
        let request = Request::post(&url)
            .header(HOST, host)
            .header(DATE, date)
            .header(CONTENT_TYPE, CONTENT_TYPE_JSON)
            .header(CONTENT_LENGTH, body.len())
            .header("x-content-sha256", content_sha256)
            .header(AUTHORIZATION, authorization)
            .header(USER_AGENT, USER_AGENT_VALUE)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })?;
        let (parts, body) = self.federation.send(request, self.stall_timeout_ms, &what).await?.into_parts();
        let bytes = http::read_body(body, TOKEN_BODY_BYTES_MAX, self.stall_timeout_ms, &what).await?;
        token_of_answer(parts.status, &parts.headers, &bytes, &what)
    }
}

/// The token of a 200 answer; the refusal as an error otherwise (429 and 5xx stay retryable).
fn token_of_answer(
    status: StatusCode,
    headers: &::http::HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<String, OciError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        token: String,
    }
    if status == StatusCode::OK {
        let answer: Answer =
            serde_json::from_slice(body).map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })?;
        return Ok(answer.token);
    }
    match error::classify_status(status, headers, body, what) {
        transient @ (OciError::RateLimited { .. } | OciError::Server { .. }) => Err(transient),
        OciError::NotAuthenticated(answer)
        | OciError::NotFoundOrDenied(answer)
        | OciError::UnexpectedStatus(answer) => {
            Err(failure(format!("the federation service refused the instance certificate: {answer}")))
        }
        other => Err(other),
    }
}

/// The identity from the metadata's three PEMs.
fn identity_of(certificate_pem: &str, key_pem: &str, intermediate_pem: &str) -> Result<Identity, OciError> {
    let certificate = CertificateDer::from_pem_slice(certificate_pem.as_bytes())
        .map_err(|e| failure(format!("identity/cert.pem is not a PEM certificate ({e:?})")))?;
    let intermediates: Result<Vec<String>, _> = CertificateDer::pem_slice_iter(intermediate_pem.as_bytes())
        .map(|c| c.map(|c| BASE64.encode(c.as_ref())))
        .collect();
    let intermediates_b64 =
        intermediates.map_err(|e| failure(format!("identity/intermediate.pem is not PEM certificates ({e:?})")))?;
    let tenancy = tenancy_of(certificate.as_ref())?;
    signer::check_ocid("tenancy", &tenancy)?;
    let fingerprint = hex_pairs(ring::digest::digest(&ring::digest::SHA256, certificate.as_ref()).as_ref());
    let key = signer::load_key(key_pem, None)
        .map_err(|e| failure(format!("identity/key.pem: {}", e.to_string().trim_start_matches("OCI API key: "))))?;
    let key_id = format!("{tenancy}/fed-x509-sha256/{fingerprint}");
    Ok(Identity {
        certificate_b64: BASE64.encode(certificate.as_ref()),
        intermediates_b64,
        signer: RequestSigner::with_key(key_id, key),
    })
}

/// The tenancy OCID in the certificate's subject: an attribute `opc-tenant:OCID` (or `opc-identity:OCID`).
fn tenancy_of(der: &[u8]) -> Result<String, OciError> {
    use x509_cert::der::{Decode, Tag, Tagged};
    let certificate = x509_cert::Certificate::from_der(der)
        .map_err(|e| failure(format!("identity/cert.pem does not parse as X.509: {e}")))?;
    let texts = [Tag::Utf8String, Tag::PrintableString, Tag::Ia5String, Tag::TeletexString];
    let subject = &certificate.tbs_certificate.subject;
    let values = subject.0.iter().flat_map(|rdn| rdn.0.iter()).map(|attribute| &attribute.value);
    for value in values.filter(|v| texts.contains(&v.tag())) {
        let text = std::str::from_utf8(value.value()).unwrap_or_default();
        if let Some(tenancy) = text.strip_prefix("opc-tenant:").or_else(|| text.strip_prefix("opc-identity:")) {
            return Ok(tenancy.to_owned());
        }
    }
    Err(failure("the instance certificate's subject names no tenancy (opc-tenant:)".into()))
}

/// `aa:bb:…`, lowercase, as the Go SDK writes the fingerprint.
fn hex_pairs(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A fresh session key: ring's key pair (it signs) and the public key's DER, base64 (what is sent).
fn make_session_key() -> Result<(RsaKeyPair, String), OciError> {
    use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey};
    let bad = |what: &str, e: &dyn std::fmt::Display| failure(format!("making the session key: {what}: {e}"));
    let private =
        rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, SESSION_KEY_BITS).map_err(|e| bad("generating", &e))?;
    let pkcs8 = private.to_pkcs8_der().map_err(|e| bad("encoding", &e))?;
    let public = private.to_public_key().to_public_key_der().map_err(|e| bad("encoding", &e))?;
    let key = RsaKeyPair::from_pkcs8(pkcs8.as_bytes()).map_err(|e| bad("loading", &e))?;
    Ok((key, BASE64.encode(public.as_bytes())))
}

/// When to renew a token: half-way to its `exp`, and at most `RENEW_MARGIN_S_MAX` before it.
fn renew_time(token: &str, now: SystemTime) -> Result<SystemTime, OciError> {
    let protocol = |why: &str| OciError::Protocol { reason: format!("the security token {why}") };
    let payload = token.split('.').nth(1).ok_or_else(|| protocol("is not a JWT"))?;
    let claims = BASE64URL.decode(payload.trim_end_matches('=')).map_err(|_| protocol("is not base64url"))?;
    let claims: serde_json::Value = serde_json::from_slice(&claims).map_err(|_| protocol("has no JSON claims"))?;
    let exp_s = claims.get("exp").and_then(serde_json::Value::as_f64).ok_or_else(|| protocol("has no exp"))?;
    let exp = UNIX_EPOCH + Duration::from_secs_f64(exp_s.max(0.0));
    let life = exp.duration_since(now).map_err(|_| protocol("had expired when issued (is the node's clock right?)"))?;
    Ok(exp - (life / 2).min(Duration::from_secs(RENEW_MARGIN_S_MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_agent_fakeoci::test_keys;

    fn token_with(claims: &str) -> String {
        format!("e30.{}.c2ln", BASE64URL.encode(claims))
    }

    #[test]
    fn tokens_are_renewed_half_way_and_at_most_five_minutes_before_exp() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let at = |claims: &str| renew_time(&token_with(claims), now);
        assert_eq!(at(r#"{"exp":1001200}"#).unwrap(), now + Duration::from_secs(900), "20 min: 5 min before");
        assert_eq!(at(r#"{"exp":1000004}"#).unwrap(), now + Duration::from_secs(2), "4 s: half-way");
        assert!(at(r#"{"exp":999999}"#).unwrap_err().to_string().contains("clock"));
        assert!(at(r#"{"iat":1}"#).unwrap_err().to_string().contains("no exp"));
        assert!(renew_time("not-a-jwt", now).is_err());
    }

    #[test]
    fn the_identity_names_the_tenancy_and_the_certificate_s_sha256() {
        let identity = identity_of(
            test_keys::INSTANCE_CERT_PEM,
            test_keys::INSTANCE_KEY_PEM,
            test_keys::INSTANCE_INTERMEDIATE_PEM,
        )
        .unwrap();
        let expected = format!("{}/fed-x509-sha256/{}", test_keys::TENANCY, test_keys::INSTANCE_CERT_SHA256);
        assert_eq!(identity.signer.key_id(), expected);
        assert_eq!(identity.intermediates_b64.len(), 1);
        let no_tenant = identity_of(test_keys::INSTANCE_INTERMEDIATE_PEM, test_keys::INSTANCE_KEY_PEM, "");
        assert!(no_tenant.err().unwrap().to_string().contains("names no tenancy"));
        let bad_key = identity_of(test_keys::INSTANCE_CERT_PEM, "junk", "").err().unwrap().to_string();
        assert!(bad_key.contains("identity/key.pem") && !bad_key.contains("API key"), "{bad_key}");
    }

    #[test]
    fn endpoints_come_from_the_sdk_variables() {
        let env = |name: &str| match name {
            METADATA_URL_ENV => Some("http://127.0.0.1:9/opc/v2/".to_owned()),
            FEDERATION_URL_ENV => Some(" ".to_owned()),
            _ => None,
        };
        let endpoints = InstanceEndpoints::from_env(&env);
        assert_eq!(endpoints.metadata_base_url, "http://127.0.0.1:9/opc/v2");
        assert_eq!(endpoints.federation_base_url, None, "empty is unset");
        assert_eq!(InstanceEndpoints::from_env(&|_| None), InstanceEndpoints::default());
        let timeouts = Timeouts { connect_ms: 1, stall_ms: 1 };
        let bad = InstanceEndpoints { metadata_base_url: "ftp://x".into(), federation_base_url: None };
        assert!(InstancePrincipal::new(bad, timeouts, &Network::default()).is_err());
    }

    #[test]
    fn session_keys_sign_what_their_public_half_verifies() {
        use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
        use rsa::pkcs1::EncodeRsaPublicKey;
        use rsa::pkcs8::DecodePublicKey;
        let (key, public_b64) = make_session_key().unwrap();
        let public = rsa::RsaPublicKey::from_public_key_der(&BASE64.decode(public_b64).unwrap()).unwrap();
        let signer = RequestSigner::for_session("a.b.c", key).unwrap();
        assert_eq!(signer.key_id(), "ST$a.b.c");
        let header = signer.authorization(&::http::Method::GET, "/n/", "h", "d").unwrap();
        let signature = BASE64.decode(header.rsplit("signature=\"").next().unwrap().trim_end_matches('"')).unwrap();
        let text = signer::signing_string(&::http::Method::GET, "/n/", "h", "d");
        let pkcs1 = public.to_pkcs1_der().unwrap();
        let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, pkcs1.as_bytes());
        assert!(verifier.verify(text.as_bytes(), &signature).is_ok());
        let (other, _) = make_session_key().unwrap();
        assert!(RequestSigner::for_session("a\"b", other).is_err(), "a token that would break the header");
    }
}
