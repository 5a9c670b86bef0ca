//! The `gs://` HTTP transport, around the stores' reqwest one, does two things OpenDAL does not:
//! - GCS's `crc32c` for the objects that have no `md5Hash` (composite objects: `compose`, parallel
//!   composite uploads). OpenDAL's listing reads GCS's JSON but passes on only `md5Hash`, so the
//!   listing pages are tapped on their way to OpenDAL (a page is at most 1,000 items; the body is
//!   handed on unchanged), keeping, by object name, the `crc32c` of each object without `md5Hash`.
//! - A service account's `token_uri`. OpenDAL's signer (reqsign) always posts the signed JWT to
//!   `https://oauth2.googleapis.com/token` and ignores the JSON's `token_uri`; Google's own libraries
//!   use `token_uri`. So a token request to Google's endpoint goes to the `token_uri` instead when the
//!   JSON names another (https, or http on a loopback address for tests). The JWT's `aud` stays
//!   Google's endpoint, as reqsign writes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use opendal::raw::oio::ReadStream;
use opendal::{Buffer, HttpBody, HttpTransport};
use serde::Deserialize;

use super::capped_transport::{LIST_PAGE_BYTES_MAX, is_gcs_listing};

/// The `crc32c` (8 hex digits) of each listed object without `md5Hash`, by object name.
#[derive(Debug, Default)]
pub struct Crc32cSeen(Mutex<HashMap<String, String>>);

impl Crc32cSeen {
    pub fn of(&self, name: &str) -> Option<String> {
        self.0.lock().expect("crc32c lock").get(name).cloned()
    }

    /// Keeps what one listing page says (a page that does not parse is left to OpenDAL to refuse).
    fn record(&self, page: &[u8]) {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            items: Vec<Item>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Item {
            name: String,
            md5_hash: Option<String>,
            crc32c: Option<String>,
        }
        let Ok(page) = serde_json::from_slice::<Page>(page) else { return };
        let mut seen = self.0.lock().expect("crc32c lock");
        for item in page.items.into_iter().filter(|i| i.md5_hash.as_deref().is_none_or(str::is_empty)) {
            if let Some(hex) = item.crc32c.as_deref().and_then(crc32c_hex) {
                seen.insert(item.name, hex);
            }
        }
    }
}

/// GCS's `crc32c`: base64 of the 4 big-endian bytes.
fn crc32c_hex(base64: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(base64.trim()).ok()?;
    (bytes.len() == 4).then(|| bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where reqsign sends a service account's signed JWT.
const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";

/// `inner`, with GCS listing pages (`GET …/storage/v1/b/{bucket}/o?…`) read into `seen` on the way,
/// and Google's token requests sent to `token_uri` when it is set.
pub struct GcsTransport<T> {
    pub inner: T,
    pub seen: Arc<Crc32cSeen>,
    pub token_uri: Option<http::Uri>,
}

/// A service account JSON's `token_uri` when it is not Google's endpoint: `Ok(None)` for Google's
/// (or none); `Err` for a URI the signed JWT must not go to (plain http off loopback, not a URL).
pub fn token_uri_of(service_account_json: &str) -> Result<Option<http::Uri>, String> {
    #[derive(Deserialize)]
    struct Account {
        token_uri: Option<String>,
    }
    let Ok(Account { token_uri: Some(text) }) = serde_json::from_str::<Account>(service_account_json) else {
        return Ok(None);
    };
    if text.trim() == GOOGLE_TOKEN_URI {
        return Ok(None);
    }
    let bad = |why: &str| format!("the service account's token_uri {text:?} {why}");
    let uri: http::Uri = text.trim().parse().map_err(|_| bad("is not a URL"))?;
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    match uri.scheme_str() {
        Some("https") => Ok(Some(uri)),
        Some("http") if loopback => Ok(Some(uri)),
        _ => Err(bad("must be https (http only on a loopback address)")),
    }
}

impl<T: HttpTransport> HttpTransport for GcsTransport<T> {
    async fn fetch(&self, mut request: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let listing = is_gcs_listing(&request);
        if let Some(token_uri) = &self.token_uri
            && request.method() == http::Method::POST
            && request.uri() == GOOGLE_TOKEN_URI
        {
            *request.uri_mut() = token_uri.clone();
            request.headers_mut().remove(http::header::HOST);
        }
        let response = self.inner.fetch(request).await?;
        if !listing || !response.status().is_success() {
            return Ok(response);
        }
        let (parts, mut body) = response.into_parts();
        let mut chunks = Vec::new();
        let mut len = 0;
        loop {
            let chunk = body.read().await?;
            if chunk.is_empty() {
                break;
            }
            len += chunk.len();
            if len > LIST_PAGE_BYTES_MAX {
                let why = format!("a GCS listing page larger than {LIST_PAGE_BYTES_MAX} bytes");
                return Err(opendal::Error::new(opendal::ErrorKind::Unexpected, why));
            }
            chunks.push(chunk);
        }
        let page: Buffer = chunks.into_iter().flatten().collect();
        self.seen.record(&page.to_bytes());
        let body = HttpBody::new(futures::stream::iter([Ok(page)]), Some(len as u64));
        Ok(http::Response::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every request with `body`, and keeps the URI it was sent to.
    struct Canned(&'static str, Arc<Mutex<Vec<String>>>);

    impl HttpTransport for Canned {
        async fn fetch(&self, request: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            self.1.lock().unwrap().push(request.uri().to_string());
            let body = Buffer::from(self.0.as_bytes().to_vec());
            let len = body.len() as u64;
            Ok(http::Response::new(HttpBody::new(futures::stream::iter([Ok(body)]), Some(len))))
        }
    }

    const PAGE: &str = r#"{"kind":"storage#objects","items":[
        {"name":"m/whole.bin","md5Hash":"sZRqySSS0jR8YjW00mERhA==","crc32c":"AAAAAA=="},
        {"name":"m/composite.bin","crc32c":"4waSgw==","componentCount":2},
        {"name":"m/odd.bin","crc32c":"not base64"}]}"#;

    async fn through(uri: &str) -> (Arc<Crc32cSeen>, String) {
        let seen = Arc::new(Crc32cSeen::default());
        let tap = GcsTransport { inner: Canned(PAGE, Default::default()), seen: seen.clone(), token_uri: None };
        let request = http::Request::get(uri).body(Buffer::new()).unwrap();
        let mut body = tap.fetch(request).await.unwrap().into_body();
        let text = String::from_utf8(body.to_buffer().await.unwrap().to_vec()).unwrap();
        (seen, text)
    }

    #[tokio::test]
    async fn token_requests_go_to_the_service_account_s_token_uri() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let token_uri = token_uri_of(r#"{"token_uri": "http://127.0.0.1:9/token"}"#).unwrap();
        let inner = Canned("{}", sent.clone());
        let transport = GcsTransport { inner, seen: Default::default(), token_uri };
        for (method, uri) in [("POST", GOOGLE_TOKEN_URI), ("GET", "https://storage.googleapis.com/storage/v1/b/m/o")] {
            let request = http::Request::builder().method(method).uri(uri).body(Buffer::new()).unwrap();
            transport.fetch(request).await.unwrap();
        }
        assert_eq!(
            *sent.lock().unwrap(),
            ["http://127.0.0.1:9/token", "https://storage.googleapis.com/storage/v1/b/m/o"]
        );
        assert_eq!(token_uri_of(&format!(r#"{{"token_uri": "{GOOGLE_TOKEN_URI}"}}"#)).unwrap(), None);
        assert_eq!(token_uri_of(r#"{"type": "service_account"}"#).unwrap(), None);
        assert!(token_uri_of(r#"{"token_uri": "https://oauth2.p.googleapis.com/token"}"#).unwrap().is_some());
        assert!(token_uri_of(r#"{"token_uri": "http://tokens.example/token"}"#).unwrap_err().contains("https"));
    }

    #[tokio::test]
    async fn listing_pages_give_the_crc32c_of_objects_without_md5_and_pass_on_unchanged() {
        let (seen, text) = through("http://gcs/storage/v1/b/models/o?prefix=m%2F").await;
        assert_eq!(text, PAGE, "OpenDAL reads the same page");
        assert_eq!(seen.of("m/composite.bin").as_deref(), Some("e3069283"));
        assert_eq!(seen.of("m/whole.bin"), None, "md5Hash is used for it");
        assert_eq!(seen.of("m/odd.bin"), None);
        let (seen, _) = through("http://gcs/download/storage/v1/b/models/o/m%2Fcomposite.bin?alt=media").await;
        assert_eq!(seen.of("m/composite.bin"), None, "media downloads are not read");
    }
}
