//! GCS's `crc32c` for the objects that have no `md5Hash` (composite objects: `compose`, parallel
//! composite uploads). OpenDAL's listing reads GCS's JSON but passes on only `md5Hash`, so the `gs://`
//! HTTP transport taps the listing pages on their way to OpenDAL (a page is at most 1,000 items; the
//! body is handed on unchanged) and keeps, by object name, the `crc32c` of each object without
//! `md5Hash`. No extra request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use opendal::raw::oio::ReadStream;
use opendal::{Buffer, HttpBody, HttpTransport};
use serde::Deserialize;

/// A listing page larger than this is refused (GCS's are at most 1,000 items of about 1 KiB).
const LIST_PAGE_BYTES_MAX: usize = 16 << 20;

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

/// `inner`, with GCS listing pages (`GET …/storage/v1/b/{bucket}/o?…`) read into `seen` on the way.
pub struct ListingTap<T> {
    pub inner: T,
    pub seen: Arc<Crc32cSeen>,
}

fn is_listing(request: &http::Request<Buffer>) -> bool {
    let path = request.uri().path();
    request.method() == http::Method::GET && path.contains("/storage/v1/b/") && path.ends_with("/o")
}

impl<T: HttpTransport> HttpTransport for ListingTap<T> {
    async fn fetch(&self, request: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let listing = is_listing(&request);
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

    /// Answers every request with `body`.
    struct Canned(&'static str);

    impl HttpTransport for Canned {
        async fn fetch(&self, _: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
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
        let tap = ListingTap { inner: Canned(PAGE), seen: seen.clone() };
        let request = http::Request::get(uri).body(Buffer::new()).unwrap();
        let mut body = tap.fetch(request).await.unwrap().into_body();
        let text = String::from_utf8(body.to_buffer().await.unwrap().to_vec()).unwrap();
        (seen, text)
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
