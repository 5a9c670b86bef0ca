//! HeadObject and GetObject (whole or one byte range) as a stream of chunks, with the integrity headers
//! OCI gives: `Content-MD5` for objects uploaded whole, `opc-multipart-md5` (not the content's MD5) for
//! multipart uploads, and the `opc-meta-md5` metadata OME's uploader sets on them.

use ::http::header::{CONTENT_LENGTH, CONTENT_RANGE, ETAG};
use ::http::{HeaderMap, Method, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::Stream;
use hyper::body::{Bytes, Incoming};

use super::{OciClient, OciError, encode, http};

/// The bytes a ranged GET asks for: from `start` to `end` (exclusive), or to the end of the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: Option<u64>,
}

impl ByteRange {
    pub(super) fn header_value(self) -> String {
        match self.end {
            Some(end) => format!("bytes={}-{}", self.start, end.saturating_sub(1)),
            None => format!("bytes={}-", self.start),
        }
    }
}

/// What an object's bytes must hash to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpectedMd5 {
    /// `Content-MD5`: the object was uploaded whole.
    ContentMd5([u8; 16]),
    /// `opc-meta-md5`: a multipart object whose uploader recorded the content's MD5.
    MetaMd5([u8; 16]),
    /// A multipart object without `opc-meta-md5`: only its size can be checked (OME accepts it so).
    SizeOnly,
}

/// An object's headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectHead {
    /// The whole object's size (from `Content-Range` on a 206).
    pub size_bytes: u64,
    pub etag: Option<String>,
    pub content_md5: Option<String>,
    pub multipart_md5: Option<String>,
    pub meta_md5: Option<String>,
    pub request_id: Option<String>,
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(|v| v.trim().to_owned())
}

fn decode_md5(name: &str, value: &str) -> Result<[u8; 16], OciError> {
    let bytes = BASE64.decode(value).ok().and_then(|b| <[u8; 16]>::try_from(b).ok());
    bytes.ok_or_else(|| OciError::Protocol { reason: format!("{name} {value:?} is not a base64 MD5") })
}

impl ObjectHead {
    fn from_headers(headers: &HeaderMap, size_bytes: u64) -> ObjectHead {
        ObjectHead {
            size_bytes,
            etag: header(headers, ETAG.as_str()),
            content_md5: header(headers, "content-md5"),
            multipart_md5: header(headers, "opc-multipart-md5"),
            meta_md5: header(headers, "opc-meta-md5"),
            request_id: header(headers, "opc-request-id"),
        }
    }

    /// `Content-MD5` when present, else `opc-meta-md5`, else size only; a value that is not a base64 MD5
    /// is an error (never silently unchecked).
    pub fn expected_md5(&self) -> Result<ExpectedMd5, OciError> {
        if let Some(value) = &self.content_md5 {
            return decode_md5("Content-MD5", value).map(ExpectedMd5::ContentMd5);
        }
        if let Some(value) = &self.meta_md5 {
            return decode_md5("opc-meta-md5", value).map(ExpectedMd5::MetaMd5);
        }
        Ok(ExpectedMd5::SizeOnly)
    }
}

fn content_length(headers: &HeaderMap, what: &str) -> Result<u64, OciError> {
    let value = header(headers, CONTENT_LENGTH.as_str());
    value
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| OciError::Protocol { reason: format!("{what}: no Content-Length") })
}

/// `bytes {first}-{last}/{size}` → (first, last, size).
fn parse_content_range(value: &str) -> Option<(u64, u64, u64)> {
    let (range, size) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let (first, last) = range.split_once('-')?;
    let (first, last, size) = (first.parse().ok()?, last.parse().ok()?, size.parse().ok()?);
    (first <= last && last < size).then_some((first, last, size))
}

/// One GetObject answer: its headers and its body, read chunk by chunk.
pub struct ObjectBody {
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "the engine checks what the listing said; tests read the headers")
    )]
    pub head: ObjectHead,
    /// The object offset of the first body byte: the range's start on a 206, 0 on a 200 (a server that
    /// ignored the range: the caller restarts the file from zero).
    pub start: u64,
    /// Body bytes announced (`Content-Length`).
    pub body_bytes: u64,
    received_bytes: u64,
    body: Incoming,
    what: String,
    stall_timeout_ms: u64,
}

impl std::fmt::Debug for ObjectBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBody").field("what", &self.what).field("start", &self.start).finish_non_exhaustive()
    }
}

impl ObjectBody {
    /// The next chunk, `None` at the end; a body shorter or longer than announced is an error.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, OciError> {
        let data = http::next_data(&mut self.body, self.stall_timeout_ms, &self.what).await?;
        let Some(data) = data else {
            if self.received_bytes < self.body_bytes {
                let reason = format!("ended after {} of {} bytes", self.received_bytes, self.body_bytes);
                return Err(OciError::Cut { what: self.what.clone(), reason });
            }
            return Ok(None);
        };
        self.received_bytes += data.len() as u64;
        if self.received_bytes > self.body_bytes {
            let reason = format!("{}: more than the {} bytes announced", self.what, self.body_bytes);
            return Err(OciError::Protocol { reason });
        }
        Ok(Some(data))
    }

    /// The chunks as a stream; it ends after the first error.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, OciError>> + Send + 'static {
        futures::stream::unfold(Some(self), |state| async move {
            let mut body = state?;
            match body.next_chunk().await {
                Ok(Some(chunk)) => Some((Ok(chunk), Some(body))),
                Ok(None) => None,
                Err(error) => Some((Err(error), None)),
            }
        })
    }
}

impl OciClient {
    /// `/n/{namespace}/b/{bucket}/o/{name}`, escaped (`/` in the name is `%2F`).
    fn object_path(&self, bucket: &str, name: &str) -> String {
        format!("{}/{}", self.objects_path(bucket), encode(name))
    }

    pub async fn head_object(&self, bucket: &str, name: &str) -> Result<ObjectHead, OciError> {
        let path = self.object_path(bucket, name);
        let what = format!("HEAD {path}");
        let response = self.signed(Method::HEAD, path, None, &what).await?;
        let response = self.expect(response, &[StatusCode::OK], &what).await?;
        let size_bytes = content_length(response.headers(), &what)?;
        Ok(ObjectHead::from_headers(response.headers(), size_bytes))
    }

    /// GetObject, whole or `range`; the body is left to read.
    pub async fn get_object(&self, bucket: &str, name: &str, range: Option<ByteRange>) -> Result<ObjectBody, OciError> {
        let path = self.object_path(bucket, name);
        let what = format!("GET {path}");
        let response = self.signed(Method::GET, path, range, &what).await?;
        let expected = [StatusCode::OK, StatusCode::PARTIAL_CONTENT];
        let (parts, body) = self.expect(response, &expected, &what).await?.into_parts();
        let body_bytes = content_length(&parts.headers, &what)?;
        let (start, size_bytes) = if parts.status == StatusCode::PARTIAL_CONTENT {
            let value = header(&parts.headers, CONTENT_RANGE.as_str()).unwrap_or_default();
            let bad = |why: &str| OciError::Protocol { reason: format!("{what}: Content-Range {value:?} {why}") };
            let (first, last, size) = parse_content_range(&value).ok_or_else(|| bad("is not bytes A-B/SIZE"))?;
            if range.map(|r| r.start) != Some(first) || last - first + 1 != body_bytes {
                return Err(bad("is not the range asked for"));
            }
            (first, size)
        } else {
            (0, body_bytes)
        };
        let head = ObjectHead::from_headers(&parts.headers, size_bytes);
        let stall_timeout_ms = self.stall_timeout_ms;
        Ok(ObjectBody { head, start, body_bytes, received_bytes: 0, body, what, stall_timeout_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_strictly() {
        assert_eq!(parse_content_range("bytes 0-9/10"), Some((0, 9, 10)));
        assert_eq!(parse_content_range("bytes 5-4/10"), None);
        assert_eq!(parse_content_range("bytes 0-10/10"), None);
        assert_eq!(parse_content_range("bytes */10"), None);
    }

    #[test]
    fn the_expected_md5_follows_omes_order() {
        let md5 = BASE64.encode([7u8; 16]);
        let mut head = ObjectHead {
            size_bytes: 1,
            etag: None,
            content_md5: Some(md5.clone()),
            multipart_md5: None,
            meta_md5: Some(BASE64.encode([8u8; 16])),
            request_id: None,
        };
        assert_eq!(head.expected_md5().unwrap(), ExpectedMd5::ContentMd5([7; 16]));
        head.content_md5 = None;
        assert_eq!(head.expected_md5().unwrap(), ExpectedMd5::MetaMd5([8; 16]));
        head.meta_md5 = None;
        assert_eq!(head.expected_md5().unwrap(), ExpectedMd5::SizeOnly);
        head.meta_md5 = Some("abc-3".into());
        assert!(head.expected_md5().is_err());
        assert_eq!(ByteRange { start: 5, end: Some(10) }.header_value(), "bytes=5-9");
        assert_eq!(ByteRange { start: 5, end: None }.header_value(), "bytes=5-");
    }
}
