//! OCI Object Storage through its native API, with no SDK (no usable Rust one exists): requests signed
//! with OCI's HTTP signature scheme (`signer`) by an API key or an instance's session (`instance`:
//! InstancePrincipal's token exchange), every object under a prefix listed through
//! `nextStartWith` pages (`listing`), HeadObject and ranged GetObject as a byte stream (`objects`).
//! Retries and backoff belong to the caller; errors carry OCI's code, `opc-request-id` and
//! `Retry-After`. Checked against `testsupport/fakeoci`, itself checked against the official Python SDK.

mod config;
mod error;
mod http;
mod instance;
mod listing;
mod objects;
mod signer;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use ::http::header::{AUTHORIZATION, DATE, HOST, RANGE, USER_AGENT};
use ::http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

pub use config::{InstanceEndpoints, OciAuth, OciConfig, UserPrincipal};
pub use error::OciError;

pub use listing::ListLimits;

#[cfg(test)]
pub use objects::ObjectBody;
pub use objects::{ByteRange, ExpectedMd5};
pub use signer::RequestSigner;

use crate::hf::Network;

/// An error body read at most (OCI's are a few hundred bytes of JSON).
const ERROR_BODY_BYTES_MAX: usize = 16 * 1024;
/// GetNamespace's answer at most (a JSON string).
#[cfg_attr(not(test), allow(dead_code, reason = "GetNamespace is for checks: the URI names the namespace"))]
const NAMESPACE_BODY_BYTES_MAX: usize = 1024;
const USER_AGENT_VALUE: &str = concat!("model-agent/", env!("CARGO_PKG_VERSION"));
/// Everything but RFC 3986's unreserved characters is escaped in a path segment or a query value (as
/// the SDKs' `quote(…, safe='')` does), so `/` in an object name is `%2F`.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// How long the client waits: to connect, and for any byte of an answer (head or body).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub connect_ms: u64,
    pub stall_ms: u64,
}

/// Who signs: one API key, or an instance's sessions.
#[derive(Clone)]
enum Principal {
    ApiKey(Arc<RequestSigner>),
    Instance(Arc<instance::InstancePrincipal>),
}

impl Principal {
    async fn signer(&self) -> Result<Arc<RequestSigner>, OciError> {
        match self {
            Principal::ApiKey(signer) => Ok(signer.clone()),
            Principal::Instance(instance) => instance.signer().await,
        }
    }

    /// After a 401: whether another signer may do better (an instance's renewed token).
    async fn forget(&self, used: &Arc<RequestSigner>) -> bool {
        match self {
            Principal::ApiKey(_) => false,
            Principal::Instance(instance) => {
                instance.forget(used).await;
                true
            }
        }
    }
}

/// A client of one namespace's Object Storage (cheap to clone; one connection pool).
#[derive(Clone)]
pub struct OciClient {
    /// Set at construction, or from the instance's region at the first request.
    endpoint: Arc<tokio::sync::OnceCell<config::Endpoint>>,
    namespace: String,
    principal: Principal,
    http: http::OciHttp,
    stall_timeout_ms: u64,
}

impl fmt::Debug for OciClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key_id = match &self.principal {
            Principal::ApiKey(signer) => signer.key_id(),
            Principal::Instance(_) => "InstancePrincipal",
        };
        f.debug_struct("OciClient")
            .field("endpoint", &self.endpoint.get().map(|e| &e.base))
            .field("namespace", &self.namespace)
            .field("key_id", &key_id)
            .finish_non_exhaustive()
    }
}

/// `s` escaped for one path segment or one query value.
fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

impl OciClient {
    /// Checks the configuration and loads the key; no request is sent.
    /// Checks the configuration and loads the key; no request is sent (an InstancePrincipal asks for its
    /// first token at the first request).
    pub fn new(config: &OciConfig, timeouts: Timeouts, network: &Network) -> Result<OciClient, OciError> {
        let endpoint = config::endpoint(config)?;
        config::check_namespace(&config.namespace)?;
        let principal = match &config.auth {
            OciAuth::UserPrincipal(p) => Principal::ApiKey(Arc::new(RequestSigner::from_pem(
                &p.tenancy,
                &p.user,
                &p.fingerprint,
                &p.private_key_pem,
                p.passphrase.as_deref(),
            )?)),
            OciAuth::InstancePrincipal(endpoints) => {
                Principal::Instance(Arc::new(instance::InstancePrincipal::new(endpoints.clone(), timeouts, network)?))
            }
        };
        if endpoint.is_none() && matches!(principal, Principal::ApiKey(_)) {
            return Err(OciError::BadConfig { reason: "neither an endpoint nor a region is set".into() });
        }
        let http = http::OciHttp::new(timeouts.connect_ms, network)?;
        let namespace = config.namespace.clone();
        let endpoint = Arc::new(tokio::sync::OnceCell::new_with(endpoint));
        Ok(OciClient { endpoint, namespace, principal, http, stall_timeout_ms: timeouts.stall_ms })
    }

    /// The endpoint set, else the instance's region's.
    async fn endpoint(&self) -> Result<&config::Endpoint, OciError> {
        let of_instance = || async {
            let Principal::Instance(instance) = &self.principal else {
                unreachable!("an API key client has its endpoint from the start")
            };
            config::region_endpoint(&instance.region().await?)
        };
        self.endpoint.get_or_try_init(of_instance).await
    }

    /// GetNamespace: the namespace of the key's tenancy (a cheap check of the credentials).
    #[cfg_attr(not(test), allow(dead_code, reason = "for checks and tests: the URI names the namespace"))]
    pub async fn get_namespace(&self) -> Result<String, OciError> {
        let what = "GET /n/";
        let response = self.signed(Method::GET, "/n/".into(), None, what).await?;
        let body = self.expect(response, &[StatusCode::OK], what).await?.into_body();
        let bytes = http::read_body(body, NAMESPACE_BODY_BYTES_MAX, self.stall_timeout_ms, what).await?;
        serde_json::from_slice(&bytes).map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })
    }

    /// `/n/{namespace}/b/{bucket}/o`, escaped.
    fn objects_path(&self, bucket: &str) -> String {
        format!("/n/{}/b/{}/o", encode(&self.namespace), encode(bucket))
    }

    /// Sends one signed, body-less request; an InstancePrincipal whose token is refused (401) renews it
    /// and sends the request once more.
    async fn signed(
        &self,
        method: Method,
        path_and_query: String,
        range: Option<ByteRange>,
        what: &str,
    ) -> Result<Response<Incoming>, OciError> {
        let signer = self.principal.signer().await?;
        let response = self.send_signed(&signer, &method, &path_and_query, range, what).await?;
        if response.status() != StatusCode::UNAUTHORIZED || !self.principal.forget(&signer).await {
            return Ok(response);
        }
        let signer = self.principal.signer().await?;
        self.send_signed(&signer, &method, &path_and_query, range, what).await
    }

    async fn send_signed(
        &self,
        signer: &RequestSigner,
        method: &Method,
        path_and_query: &str,
        range: Option<ByteRange>,
        what: &str,
    ) -> Result<Response<Incoming>, OciError> {
        let endpoint = self.endpoint().await?;
        let date = httpdate::fmt_http_date(SystemTime::now());
        let host = &endpoint.host;
        let authorization = signer.authorization(method, path_and_query, host, &date)?;
        let mut request = Request::builder()
            .method(method.clone())
            .uri(format!("{}{path_and_query}", endpoint.base))
            .header(HOST, host)
            .header(DATE, date)
            .header(AUTHORIZATION, authorization)
            .header(USER_AGENT, USER_AGENT_VALUE);
        if let Some(range) = range {
            request = request.header(RANGE, range.header_value());
        }
        let request = request
            .body(Full::new(hyper::body::Bytes::new()))
            .map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })?;
        self.http.send(request, self.stall_timeout_ms, what).await
    }

    /// The response if its status is one of `expected`; otherwise the error it says (its body read, bounded).
    async fn expect(
        &self,
        response: Response<Incoming>,
        expected: &[StatusCode],
        what: &str,
    ) -> Result<Response<Incoming>, OciError> {
        if expected.contains(&response.status()) {
            return Ok(response);
        }
        let (parts, body) = response.into_parts();
        // An unreadable error body still leaves the status to report.
        let body = http::read_body(body, ERROR_BODY_BYTES_MAX, self.stall_timeout_ms, what).await.unwrap_or_default();
        Err(error::classify_status(parts.status, &parts.headers, &body, what))
    }
}
