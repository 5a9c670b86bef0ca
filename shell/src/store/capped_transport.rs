//! Limits around the stores' HTTP transport for what OpenDAL reads whole: a listing page and an
//! error's body are read into memory (`HttpTransporter::send`), with no cap of OpenDAL's own, and
//! a listing follows its continuation tokens for as long as the server gives one. So a server that
//! sends an endless page grew memory without bound, and one that answered "truncated" with the
//! same token forever kept a model Updating with no error (a review found both). Object bodies,
//! streamed to disk, pass untouched.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use opendal::{Buffer, HttpBody, HttpTransport};

/// A listing page larger than this is refused (S3's, GCS's and Azure's are at most 1,000, 1,000
/// and 5,000 items of well under 1 KiB); the `gs://` transport's own read of a page keeps to it.
pub const LIST_PAGE_BYTES_MAX: usize = 16 << 20;
/// An error's body larger than this is refused (an S3 or Azure error is a short XML document).
pub const ERROR_BODY_BYTES_MAX: usize = 1 << 20;
/// Listing pages of one listing at most: `listing::OBJECTS_MAX` objects take 1,000 at 1,000 a page.
pub const LIST_PAGES_MAX: usize = 2_000;

/// `inner`, counting listing requests in `list_pages` (reset by each listing) and capping the
/// bodies OpenDAL reads whole.
pub struct CappedTransport<T> {
    pub inner: T,
    pub list_pages: Arc<AtomicUsize>,
}

/// S3's ListObjectsV2 (`list-type=2`), Azure's List Blobs (`comp=list`) and GCS's objects list.
fn is_listing(request: &http::Request<Buffer>) -> bool {
    let query = request.uri().query().unwrap_or_default();
    let s3_or_azure = query.split('&').any(|kv| kv.starts_with("list-type=") || kv == "comp=list");
    request.method() == http::Method::GET && (s3_or_azure || is_gcs_listing(request))
}

/// GCS's objects list (`GET …/storage/v1/b/{bucket}/o?…`).
pub fn is_gcs_listing(request: &http::Request<Buffer>) -> bool {
    let path = request.uri().path();
    request.method() == http::Method::GET && path.contains("/storage/v1/b/") && path.ends_with("/o")
}

impl<T: HttpTransport> HttpTransport for CappedTransport<T> {
    async fn fetch(&self, request: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
        let listing = is_listing(&request);
        if listing && self.list_pages.fetch_add(1, Ordering::Relaxed) >= LIST_PAGES_MAX {
            let why = format!(
                "the listing goes on past {LIST_PAGES_MAX} pages (a server that repeats its continuation token?)"
            );
            return Err(opendal::Error::new(opendal::ErrorKind::Unexpected, why));
        }
        let response = self.inner.fetch(request).await?;
        let cap = match (response.status().is_success(), listing) {
            (false, _) => ERROR_BODY_BYTES_MAX,
            (true, true) => LIST_PAGE_BYTES_MAX,
            (true, false) => return Ok(response),
        };
        let (parts, body) = response.into_parts();
        let body = body.map_inner(|inner| Box::new(Capped { inner, seen_bytes: 0, max_bytes: cap, ended: false }));
        Ok(http::Response::from_parts(parts, body))
    }
}

type Inner = Box<dyn Stream<Item = opendal::Result<Buffer>> + Send + Sync + Unpin + 'static>;

/// A body that ends in an error once it passes `max_bytes`.
struct Capped {
    inner: Inner,
    seen_bytes: usize,
    max_bytes: usize,
    ended: bool,
}

impl Stream for Capped {
    type Item = opendal::Result<Buffer>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(Some(Ok(buffer))) = &next {
            self.seen_bytes = self.seen_bytes.saturating_add(buffer.len());
            if self.seen_bytes > self.max_bytes {
                self.ended = true;
                let why =
                    format!("a response body larger than {} bytes, where at most that is expected", self.max_bytes);
                return Poll::Ready(Some(Err(opendal::Error::new(opendal::ErrorKind::Unexpected, why))));
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every request with `chunks` chunks of 1 MiB, with `status`.
    struct Endless(u16, usize);

    impl HttpTransport for Endless {
        async fn fetch(&self, _: http::Request<Buffer>) -> opendal::Result<http::Response<HttpBody>> {
            let chunk = Buffer::from(vec![b'x'; 1 << 20]);
            let body = HttpBody::new(futures::stream::iter((0..self.1).map(move |_| Ok(chunk.clone()))), None);
            Ok(http::Response::builder().status(self.0).body(body).unwrap())
        }
    }

    async fn read(transport: &CappedTransport<Endless>, uri: &str) -> opendal::Result<usize> {
        let request = http::Request::get(uri).body(Buffer::new()).unwrap();
        let mut body = transport.fetch(request).await?.into_body();
        Ok(body.to_buffer().await?.len())
    }

    #[tokio::test]
    async fn listing_pages_and_error_bodies_are_capped_and_objects_are_not() {
        let capped =
            |status, chunks| CappedTransport { inner: Endless(status, chunks), list_pages: Default::default() };
        let page = read(&capped(200, 17), "http://s3/b?list-type=2&prefix=m%2F").await.unwrap_err();
        assert!(page.to_string().contains("larger than 16777216 bytes"), "{page}");
        assert!(read(&capped(200, 17), "http://az/c?restype=container&comp=list").await.is_err());
        let error = read(&capped(503, 2), "http://s3/b/m/w.bin").await.unwrap_err();
        assert!(error.to_string().contains("larger than 1048576 bytes"), "{error}");
        assert_eq!(read(&capped(200, 40), "http://s3/b/m/w.bin").await.unwrap(), 40 << 20, "an object streams");
        assert_eq!(read(&capped(200, 16), "http://s3/b?list-type=2").await.unwrap(), 16 << 20, "at the cap");
    }

    #[tokio::test]
    async fn a_listing_past_its_page_cap_fails() {
        let transport = CappedTransport { inner: Endless(200, 0), list_pages: Default::default() };
        for _ in 0..LIST_PAGES_MAX {
            read(&transport, "http://s3/b?list-type=2&continuation-token=same").await.unwrap();
        }
        let e = read(&transport, "http://s3/b?list-type=2&continuation-token=same").await.unwrap_err();
        assert!(e.to_string().contains("past 2000 pages"), "{e}");
        let gcs = read(&transport, "http://gcs/storage/v1/b/models/o?pageToken=same").await.unwrap_err();
        assert!(gcs.to_string().contains("past 2000 pages"), "a GCS listing counts too: {gcs}");
        assert_eq!(read(&transport, "http://s3/b/m/w.bin").await.unwrap(), 0, "object reads are not counted");
    }
}
