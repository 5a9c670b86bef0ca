//! One object's headers and bytes: `Range` (206 with `Content-Range`, 416), `Content-MD5` for objects
//! uploaded whole (omitted on 206, whose body is not the object), `opc-multipart-md5` for multipart ones,
//! `opc-meta-*`, and the body faults.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, LAST_MODIFIED};
use axum::response::Response;
use futures::Stream;
use model_agent_fakehub::Content;

use crate::Shared;
use crate::api::{CREATED_UNIX_S, oci_error};
use crate::faults::BodyPlan;
use crate::fixtures::StoredObject;

/// Bytes per body chunk.
const CHUNK_BYTES: usize = 256 * 1024;
/// How long a failing body waits so that the bytes before the failure reach the client.
const FLUSH_BEFORE_CLOSE_MS: u64 = 100;

/// What a `Range` header asks of an object of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    Full,
    Part { start: u64, end_inclusive: u64 },
    Unsatisfiable,
}

/// One `bytes=` range (`a-b`, `a-`, `-n`); anything else is ignored (the whole object is served).
pub(crate) fn parse_range(header: Option<&str>, size_bytes: u64) -> RangeRequest {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else { return RangeRequest::Full };
    let Some((first, last)) = spec.trim().split_once('-') else { return RangeRequest::Full };
    if spec.contains(',') {
        return RangeRequest::Full;
    }
    let parse = |s: &str| s.trim().parse::<u64>().ok();
    let (start, end_inclusive) = match (first.trim().is_empty(), parse(first), parse(last)) {
        (true, _, Some(0)) => return RangeRequest::Unsatisfiable,
        (true, _, Some(suffix)) => (size_bytes.saturating_sub(suffix), size_bytes.saturating_sub(1)),
        (false, Some(start), None) if last.trim().is_empty() => (start, size_bytes.saturating_sub(1)),
        (false, Some(start), Some(end)) if start <= end => (start, end.min(size_bytes.saturating_sub(1))),
        _ => return RangeRequest::Full,
    };
    if start >= size_bytes {
        return RangeRequest::Unsatisfiable;
    }
    RangeRequest::Part { start, end_inclusive }
}

pub(crate) struct ObjectRequest<'a> {
    pub bucket: &'a str,
    pub object: &'a Arc<StoredObject>,
    pub head: bool,
    pub range: Option<&'a str>,
}

fn object_headers(object: &StoredObject) -> axum::http::response::Builder {
    let last_modified = SystemTime::UNIX_EPOCH + Duration::from_secs(CREATED_UNIX_S);
    let mut builder = Response::builder()
        .header(ACCEPT_RANGES, "bytes")
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(ETAG, &object.etag)
        .header(LAST_MODIFIED, httpdate::fmt_http_date(last_modified))
        .header("storage-tier", "Standard");
    if object.multipart_parts.is_some() {
        builder = builder.header("opc-multipart-md5", &object.listed_md5);
    }
    for (key, value) in &object.metadata {
        builder = builder.header(format!("opc-meta-{key}"), value);
    }
    builder
}

pub(crate) fn object_response(shared: &Shared, request: ObjectRequest<'_>) -> Response {
    let object = request.object;
    let size = object.size_bytes();
    let mut builder = object_headers(object);
    let (status, start, end) = match parse_range(request.range, size) {
        RangeRequest::Full => (StatusCode::OK, 0, size),
        RangeRequest::Part { start, end_inclusive } => {
            builder = builder.header(CONTENT_RANGE, format!("bytes {start}-{end_inclusive}/{size}"));
            (StatusCode::PARTIAL_CONTENT, start, end_inclusive + 1)
        }
        RangeRequest::Unsatisfiable => {
            let mut response =
                oci_error(StatusCode::RANGE_NOT_SATISFIABLE, "InvalidRange", "The range is not satisfiable");
            let value = format!("bytes */{size}").parse().expect("ASCII");
            response.headers_mut().insert(CONTENT_RANGE, value);
            return response;
        }
    };
    if status == StatusCode::OK && object.multipart_parts.is_none() {
        builder = builder.header("content-md5", &object.content_md5);
    }
    // Set by hand so that a truncated or stalled body still announces the full length.
    builder = builder.status(status).header(CONTENT_LENGTH, end - start);
    if request.head {
        return builder.body(Body::empty()).expect("valid response");
    }
    let plan = shared.faults.take_body_plan(request.bucket, &object.name);
    let counter = shared.bytes.counter(request.bucket, &object.name);
    let state = BodyState { object: object.clone(), pos: start, end, sent: 0, plan, counter, done: false };
    builder.body(Body::from_stream(body_stream(state))).expect("valid response")
}

struct BodyState {
    object: Arc<StoredObject>,
    pos: u64,
    end: u64,
    /// Body bytes sent so far (the fault thresholds count these).
    sent: u64,
    plan: BodyPlan,
    counter: Arc<AtomicU64>,
    done: bool,
}

impl BodyState {
    /// Body bytes that may go out before the next fault fires.
    fn bytes_before_fault(&self) -> u64 {
        let thresholds = [self.plan.truncate_after_bytes, self.plan.stall.map(|(after, _)| after)];
        thresholds.into_iter().flatten().map(|t| t.saturating_sub(self.sent)).min().unwrap_or(u64::MAX)
    }

    async fn next_chunk(&mut self) -> io::Result<Bytes> {
        if self.bytes_before_fault() == 0 {
            self.done = true;
            if let Some((_, stall_ms)) = self.plan.stall.filter(|(after, _)| self.sent >= *after) {
                tokio::time::sleep(Duration::from_millis(stall_ms)).await;
                return Err(io::Error::other("fakeoci: stalled body, closing"));
            }
            // hyper drops what it still buffers when the body fails: let it flush what was sent first.
            tokio::time::sleep(Duration::from_millis(FLUSH_BEFORE_CLOSE_MS)).await;
            return Err(io::Error::other("fakeoci: truncated body, closing"));
        }
        let len = (CHUNK_BYTES as u64).min(self.end - self.pos).min(self.bytes_before_fault()) as usize;
        let chunk = read_chunk(&self.object, self.pos, len).await?;
        if chunk.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "fakeoci: content shorter than its size"));
        }
        let chunk =
            if self.plan.wrong_bytes { flip_byte(chunk, self.pos, self.object.size_bytes() / 2) } else { chunk };
        self.pos += chunk.len() as u64;
        self.sent += chunk.len() as u64;
        self.counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        Ok(chunk)
    }
}

fn body_stream(state: BodyState) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    futures::stream::unfold(state, |mut state| async move {
        if state.done || state.pos >= state.end {
            return None;
        }
        let item = state.next_chunk().await;
        state.done |= item.is_err();
        Some((item, state))
    })
}

async fn read_chunk(object: &Arc<StoredObject>, offset: u64, len: usize) -> io::Result<Bytes> {
    if let Content::Disk { .. } = object.content {
        let object = object.clone();
        return tokio::task::spawn_blocking(move || object.content.read_at(offset, len))
            .await
            .map_err(io::Error::other)?;
    }
    object.content.read_at(offset, len)
}

/// Flips the byte at object offset `at` if this chunk (starting at `offset`) holds it.
fn flip_byte(chunk: Bytes, offset: u64, at: u64) -> Bytes {
    if at < offset || at >= offset + chunk.len() as u64 {
        return chunk;
    }
    let mut bytes = chunk.to_vec();
    bytes[(at - offset) as usize] ^= 0xff;
    Bytes::from(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_rfc_9110_says() {
        use RangeRequest::*;
        let part = |start, end_inclusive| Part { start, end_inclusive };
        assert_eq!(parse_range(None, 10), Full);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), part(0, 3));
        assert_eq!(parse_range(Some("bytes=4-"), 10), part(4, 9));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), part(5, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), part(7, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=3-1"), 10), Full);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Full);
    }

    #[test]
    fn flip_byte_flips_one_byte_only_where_it_falls() {
        assert_eq!(flip_byte(Bytes::from_static(b"abcd"), 10, 12).as_ref(), b"ab\x9cd");
        assert_eq!(flip_byte(Bytes::from_static(b"abcd"), 10, 14).as_ref(), b"abcd");
    }
}
