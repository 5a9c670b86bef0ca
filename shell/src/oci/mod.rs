//! OCI Object Storage through its native API, with no SDK (no usable Rust one exists): requests signed
//! with OCI's HTTP signature scheme (`signer`), every object under a prefix listed through
//! `nextStartWith` pages (`listing`), HeadObject and ranged GetObject as a byte stream (`objects`).
//! Retries and backoff belong to the caller; errors carry OCI's code, `opc-request-id` and
//! `Retry-After`. Checked against `testsupport/fakeoci`, itself checked against the official Python SDK.

mod config;
mod error;
mod http;
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
use http_body_util::Empty;
use hyper::body::Incoming;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

pub use config::{OciAuth, OciConfig, UserPrincipal};
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

/// A client of one namespace's Object Storage (cheap to clone; one connection pool).
#[derive(Clone)]
pub struct OciClient {
    endpoint: config::Endpoint,
    namespace: String,
    signer: Arc<RequestSigner>,
    http: http::OciHttp,
    stall_timeout_ms: u64,
}

impl fmt::Debug for OciClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OciClient")
            .field("endpoint", &self.endpoint.base)
            .field("namespace", &self.namespace)
            .field("key_id", &self.signer.key_id())
            .finish_non_exhaustive()
    }
}

/// `s` escaped for one path segment or one query value.
fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

impl OciClient {
    /// Checks the configuration and loads the key; no request is sent.
    pub fn new(config: &OciConfig, timeouts: Timeouts, network: &Network) -> Result<OciClient, OciError> {
        let endpoint = config::endpoint(config)?;
        config::check_namespace(&config.namespace)?;
        let signer = match &config.auth {
            OciAuth::UserPrincipal(p) => RequestSigner::from_pem(
                &p.tenancy,
                &p.user,
                &p.fingerprint,
                &p.private_key_pem,
                p.passphrase.as_deref(),
            )?,
            OciAuth::InstancePrincipal => {
                return Err(OciError::Unsupported {
                    what: "auth InstancePrincipal (use UserPrincipal with an API key)".into(),
                });
            }
        };
        let http = http::OciHttp::new(timeouts.connect_ms, network)?;
        let namespace = config.namespace.clone();
        Ok(OciClient { endpoint, namespace, signer: Arc::new(signer), http, stall_timeout_ms: timeouts.stall_ms })
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

    /// Sends one signed, body-less request.
    async fn signed(
        &self,
        method: Method,
        path_and_query: String,
        range: Option<ByteRange>,
        what: &str,
    ) -> Result<Response<Incoming>, OciError> {
        let date = httpdate::fmt_http_date(SystemTime::now());
        let host = &self.endpoint.host;
        let authorization = self.signer.authorization(&method, &path_and_query, host, &date)?;
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", self.endpoint.base))
            .header(HOST, host)
            .header(DATE, date)
            .header(AUTHORIZATION, authorization)
            .header(USER_AGENT, USER_AGENT_VALUE);
        if let Some(range) = range {
            request = request.header(RANGE, range.header_value());
        }
        let request = request.body(Empty::new()).map_err(|e| OciError::Protocol { reason: format!("{what}: {e}") })?;
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
