//! From a model's URI, `spec.storage.parameters` and its Secret to an OpenDAL operator.
//!
//! | scheme | parameters | Secret keys (`spec.storage.key`) | otherwise |
//! |---|---|---|---|
//! | `s3://bucket/prefix` | `endpoint`, `region` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN` | the AWS chain: env, web identity, instance metadata |
//! | `gs://bucket/prefix` | `endpoint`, `anonymous: "true"` | a service-account JSON (`parameters.secretKey`, else the only key, else one ending in `.json`; its `token_uri` honoured) | `GOOGLE_APPLICATION_CREDENTIALS`, VM metadata |
//! | `az://account/container/prefix` | `endpoint` | `AZURE_STORAGE_KEY` (or `accountKey`), `AZURE_STORAGE_SAS_TOKEN` (or `sasToken`) | `AZURE_STORAGE_KEY` in the agent's env |
//! | `oci://n/ns/b/bucket/o/prefix` | `auth` (OME's: `InstancePrincipal`, the default, or `UserPrincipal`; `ResourcePrincipal` and `OkeWorkloadIdentity` are refused), `region`, `endpoint` | `tenancy`, `user`, `fingerprint`, `privateKey` (PEM), optional `passphrase` (also `OCI_TENANCY`, `OCI_USER`, `OCI_FINGERPRINT`, `OCI_PRIVATE_KEY`) | — |

use std::collections::BTreeMap;

use base64::Engine as _;
use opendal::Operator;
use opendal::services::{Azblob, Gcs, S3};
use opendal_http_transport_reqwest::ReqwestTransport;

use model_agent_core::storage_uri::StorageUri;

use super::{Checks, Store};

/// What the model says about reaching its store: its `spec.storage.parameters` (strings only)
/// and the data of the Secret `spec.storage.key` names (empty without one). Never logged.
#[derive(Clone, Default)]
pub struct StoreAuth {
    pub parameters: BTreeMap<String, String>,
    pub secret: BTreeMap<String, String>,
    /// Where the Secret came from, to name it in reasons: `namespace/name`.
    pub secret_name: Option<String>,
    /// `spec.modelFormat.name` and `spec.additionalMetadata.type`, for the TensorRT-LLM filter.
    pub model_format: Option<String>,
    pub metadata_type: Option<String>,
}

impl StoreAuth {
    fn param(&self, name: &str) -> Option<&str> {
        self.parameters.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    fn secret_value(&self, names: &[&str]) -> Option<&str> {
        names.iter().find_map(|n| self.secret.get(*n)).map(String::as_str).filter(|v| !v.is_empty())
    }
}

/// How the stores reach the network: OpenDAL's HTTP client, and for `oci://` the agent's own
/// network settings and timeouts (the OCI client has its own HTTP stack, the Hub's).
#[derive(Clone)]
pub struct Net {
    pub http: reqwest::Client,
    pub network: crate::hf::Network,
    pub timeouts: crate::oci::Timeouts,
}

impl Net {
    pub fn new(network: &crate::hf::Network, connect_timeout_ms: u64, stall_timeout_ms: u64) -> Result<Net, String> {
        let http = http_client(network, connect_timeout_ms, stall_timeout_ms)?;
        let timeouts = crate::oci::Timeouts { connect_ms: connect_timeout_ms, stall_ms: stall_timeout_ms };
        Ok(Net { http, network: network.clone(), timeouts })
    }
}

/// A client of `uri`'s bucket with the model's prefix, its HTTP through `net` (the agent's TLS
/// roots, CA bundle and proxies). `Err`: why the model cannot be fetched as given.
pub fn open(uri: &StorageUri, auth: &StoreAuth, net: &Net) -> Result<Store, String> {
    if let StorageUri::Oci { namespace, bucket, prefix } = uri {
        let client = oci(namespace, auth, net)?;
        let backend = super::Backend::Oci { client: Box::new(client), bucket: bucket.clone() };
        let label = format!("oci://n/{namespace}/b/{bucket}/o/{prefix}");
        return Ok(Store { backend, prefix: prefix.clone(), label, shape_filter: None, checks: Checks::None });
    }
    let http = net.http.clone();
    let reqwest = || ReqwestTransport::new(http.clone());
    let list_pages = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let capped = |inner| super::capped_transport::CappedTransport { inner, list_pages: list_pages.clone() };
    let (op, prefix, label, checks) = match uri {
        StorageUri::S3 { bucket, prefix } => {
            let (op, chain, region) = s3(bucket, auth)?;
            let op = with_transport(op, opendal::HttpTransporter::new(capped(reqwest())));
            let heads = super::s3_checksum::Heads::new(op.clone(), chain, &region, http.clone());
            (op, prefix, format!("s3://{bucket}/{prefix}"), Checks::S3(Box::new(heads)))
        }
        StorageUri::Gcs { bucket, prefix } => {
            let (op, token_uri) = gcs(bucket, auth)?;
            let seen = std::sync::Arc::new(super::gcs_transport::Crc32cSeen::default());
            let transport = super::gcs_transport::GcsTransport { inner: reqwest(), seen: seen.clone(), token_uri };
            let transport =
                super::capped_transport::CappedTransport { inner: transport, list_pages: list_pages.clone() };
            let op = with_transport(op, opendal::HttpTransporter::new(transport));
            (op, prefix, format!("gs://{bucket}/{prefix}"), Checks::Gcs(seen))
        }
        StorageUri::Azure { account, container, prefix } => {
            let op = with_transport(azure(account, container, auth)?, opendal::HttpTransporter::new(capped(reqwest())));
            (op, prefix, format!("az://{account}/{container}/{prefix}"), Checks::None)
        }
        other => return Err(format!("{other:?} is not an object store this agent reads with OpenDAL")),
    };
    let backend = super::Backend::OpenDal { op, list_pages };
    Ok(Store { backend, prefix: prefix.clone(), label, shape_filter: None, checks })
}

/// `op` with its HTTP through `transporter`.
fn with_transport(op: Operator, transporter: opendal::HttpTransporter) -> Operator {
    let context = op.base_context().with_http_transport(transporter);
    op.with_context(context)
}

/// OCI's client for `namespace`: OME's `auth` parameter, `UserPrincipal` with the API key from the
/// Secret or `InstancePrincipal` (the default) with the instance's identity (its metadata and
/// federation endpoints movable by `OCI_METADATA_BASE_URL` and `OCI_SDK_AUTH_CLIENT_REGION_URL`).
fn oci(namespace: &str, auth: &StoreAuth, net: &Net) -> Result<crate::oci::OciClient, String> {
    use crate::oci::{InstanceEndpoints, OciAuth, OciClient, OciConfig, UserPrincipal};
    let kind = OciAuth::kind_from_parameter(auth.param("auth")).map_err(|e| e.to_string())?;
    let principal = match kind {
        "UserPrincipal" => {
            let need = |names: &[&str], what: &str| {
                auth.secret_value(names).map(str::to_string).ok_or_else(|| secret_missing(auth, what))
            };
            OciAuth::UserPrincipal(UserPrincipal {
                tenancy: need(&["tenancy", "OCI_TENANCY"], "tenancy")?,
                user: need(&["user", "OCI_USER"], "user")?,
                fingerprint: need(&["fingerprint", "OCI_FINGERPRINT"], "fingerprint")?,
                private_key_pem: need(&["privateKey", "OCI_PRIVATE_KEY"], "privateKey (PEM)")?,
                passphrase: auth.secret_value(&["passphrase", "OCI_PASSPHRASE"]).map(str::to_string),
            })
        }
        _ => OciAuth::InstancePrincipal(InstanceEndpoints::from_env(&|name| std::env::var(name).ok())),
    };
    let config = OciConfig {
        endpoint: auth.param("endpoint").map(str::to_string),
        region: auth.param("region").map(str::to_string),
        namespace: namespace.to_string(),
        auth: principal,
    };
    OciClient::new(&config, net.timeouts, &net.network).map_err(|e| e.to_string())
}

fn built(result: opendal::Result<Operator>, label: &str) -> Result<Operator, String> {
    result.map_err(|e| format!("{label}: {}", super::short(&e.to_string())))
}

/// The S3 operator, its credential chain (shared with the checksum HEADs) and its region.
fn s3(bucket: &str, auth: &StoreAuth) -> Result<(Operator, super::s3_checksum::Chain, String), String> {
    let mut b = S3::default().root("/").bucket(bucket);
    if let Some(endpoint) = auth.param("endpoint") {
        b = b.endpoint(endpoint);
    }
    // A custom endpoint (MinIO, Ceph, a test server) rarely has a region of its own; else OpenDAL's
    // order: the parameter, then AWS_REGION, AWS_DEFAULT_REGION.
    let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    let region = match (auth.param("region"), auth.param("endpoint")) {
        (Some(region), _) => Some(region.to_string()),
        (None, Some(_)) => Some("us-east-1".to_string()),
        (None, None) => env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")),
    };
    if let Some(region) = &region {
        b = b.region(region);
    }
    let id = auth.secret_value(&["AWS_ACCESS_KEY_ID", "accessKeyId"]);
    let key = auth.secret_value(&["AWS_SECRET_ACCESS_KEY", "secretAccessKey"]);
    let chain = match (id, key) {
        (Some(id), Some(key)) => {
            b = b.disable_config_load().disable_ec2_metadata();
            let token = auth.secret_value(&["AWS_SESSION_TOKEN", "sessionToken"]);
            super::s3_checksum::chain(Some((id, key, token)))
        }
        (None, None) if auth.secret_name.is_none() => super::s3_checksum::chain(None),
        _ => return Err(secret_missing(auth, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")),
    };
    b = b.credential_provider_chain(reqsign_core::ProvideCredentialChain::new().push(chain.clone()));
    let op = built(Operator::new(b), &format!("s3://{bucket}"))?;
    Ok((op, chain, region.unwrap_or_default()))
}

/// The GCS operator, and the service account's `token_uri` when it is not Google's (see `gcs_transport`).
fn gcs(bucket: &str, auth: &StoreAuth) -> Result<(Operator, Option<http::Uri>), String> {
    let mut b = Gcs::default().root("/").bucket(bucket);
    if let Some(endpoint) = auth.param("endpoint") {
        b = b.endpoint(endpoint);
    }
    let mut token_uri = None;
    if auth.secret_name.is_some() {
        let json = service_account_json(auth)?;
        let secret = auth.secret_name.as_deref().unwrap_or_default();
        token_uri = super::gcs_transport::token_uri_of(json).map_err(|e| format!("Secret {secret}: {e}"))?;
        b = b.credential(&base64::engine::general_purpose::STANDARD.encode(json)).disable_vm_metadata();
    } else if auth.param("anonymous") == Some("true") {
        b = b.skip_signature().disable_vm_metadata().disable_config_load();
    }
    Ok((built(Operator::new(b), &format!("gs://{bucket}"))?, token_uri))
}

/// The service-account JSON in the Secret: `parameters.secretKey`, else its only key, else the
/// one key ending in `.json`.
fn service_account_json(auth: &StoreAuth) -> Result<&str, String> {
    let json_keys: Vec<&String> = auth.secret.keys().filter(|k| k.ends_with(".json")).collect();
    let chosen = match (auth.param("secretKey"), auth.secret.len(), json_keys.as_slice()) {
        (Some(k), _, _) => auth.secret.get(k),
        (None, 1, _) => auth.secret.values().next(),
        (None, _, [one]) => auth.secret.get(*one),
        _ => None,
    };
    chosen.map(String::as_str).ok_or_else(|| secret_missing(auth, "a service-account JSON"))
}

fn azure(account: &str, container: &str, auth: &StoreAuth) -> Result<Operator, String> {
    let endpoint =
        auth.param("endpoint").map_or_else(|| format!("https://{account}.blob.core.windows.net"), str::to_string);
    let mut b = Azblob::default().root("/").container(container).endpoint(&endpoint).account_name(account);
    let key = auth.secret_value(&["AZURE_STORAGE_KEY", "accountKey"]);
    let sas = auth.secret_value(&["AZURE_STORAGE_SAS_TOKEN", "sasToken"]);
    match (key, sas) {
        (Some(key), _) => b = b.account_key(key),
        (None, Some(sas)) => b = b.sas_token(sas),
        (None, None) if auth.secret_name.is_none() => {
            if let Ok(key) = std::env::var("AZURE_STORAGE_KEY") {
                b = b.account_key(&key);
            }
        }
        (None, None) => return Err(secret_missing(auth, "AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN")),
    }
    built(Operator::new(b), &format!("az://{account}/{container}"))
}

fn secret_missing(auth: &StoreAuth, wanted: &str) -> String {
    let name = auth.secret_name.as_deref().unwrap_or("(none)");
    let mut keys: Vec<&str> = auth.secret.keys().map(String::as_str).collect();
    keys.sort_unstable();
    format!("Secret {name} (spec.storage.key) lacks {wanted}; it has keys {keys:?}")
}

/// The HTTP client every store request goes through: the agent's TLS roots and CA bundle,
/// connect and read timeouts, HTTP/1.1 (several connections for parallel ranges).
fn http_client(
    network: &crate::hf::Network,
    connect_timeout_ms: u64,
    stall_timeout_ms: u64,
) -> Result<reqwest::Client, String> {
    let tls = network.tls_config()?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(std::time::Duration::from_millis(connect_timeout_ms))
        .read_timeout(std::time::Duration::from_millis(stall_timeout_ms))
        .http1_only()
        .build()
        .map_err(|e| format!("building the object stores' HTTP client: {e}"))
}
