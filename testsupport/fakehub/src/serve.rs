//! Serving one file's bytes (from the Hub or the CDN): `Range`, HEAD, and the body faults.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use futures::Stream;

use crate::Shared;
use crate::content::{CHUNK_BYTES, Content};
use crate::faults::BodyPlan;
use crate::model::HubFile;

/// How long a failing body waits so that the bytes before the failure reach the client.
const FLUSH_BEFORE_CLOSE_MS: u64 = 100;

/// What a `Range` header asks of a file of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RangeRequest {
    Full,
    Part { start: u64, end_inclusive: u64 },
    Unsatisfiable,
}

/// One `bytes=` range (`a-b`, `a-`, `-n`); anything else (several ranges, other units, garbage) is
/// ignored, which RFC 9110 allows: the whole file is served.
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

/// A request for one file's bytes.
pub(crate) struct FileRequest<'a> {
    pub repo_id: &'a str,
    pub file: &'a Arc<HubFile>,
    pub head: bool,
    pub range: Option<&'a str>,
    /// ETag and the listener's own headers.
    pub headers: Vec<(HeaderName, String)>,
}

pub(crate) fn file_response(shared: &Shared, request: FileRequest<'_>) -> Response {
    let size = request.file.size_bytes();
    let plan = if request.head {
        BodyPlan::default()
    } else {
        shared.faults.take_body_plan(request.repo_id, &request.file.path)
    };
    let range = if plan.ignore_range { RangeRequest::Full } else { parse_range(request.range, size) };
    let mut builder =
        Response::builder().header(ACCEPT_RANGES, "bytes").header(CONTENT_TYPE, "application/octet-stream");
    for (name, value) in &request.headers {
        builder = builder.header(name, HeaderValue::from_str(value).expect("header values are ASCII"));
    }
    let (status, start, end) = match range {
        RangeRequest::Full => (StatusCode::OK, 0, size),
        RangeRequest::Part { start, end_inclusive } => {
            builder = builder.header(CONTENT_RANGE, format!("bytes {start}-{end_inclusive}/{size}"));
            (StatusCode::PARTIAL_CONTENT, start, end_inclusive + 1)
        }
        RangeRequest::Unsatisfiable => {
            let builder =
                builder.status(StatusCode::RANGE_NOT_SATISFIABLE).header(CONTENT_RANGE, format!("bytes */{size}"));
            return builder.body(Body::empty()).expect("valid response");
        }
    };
    // Set by hand so that a truncated or stalled body still announces the full length.
    builder = builder.status(status).header(CONTENT_LENGTH, end - start);
    if request.head {
        return builder.body(Body::empty()).expect("valid response");
    }
    let counter = shared.bytes.counter(request.repo_id, &request.file.path);
    let state = BodyState { file: request.file.clone(), pos: start, end, sent: 0, plan, counter, done: false };
    builder.body(Body::from_stream(body_stream(state))).expect("valid response")
}

struct BodyState {
    file: Arc<HubFile>,
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
                return Err(io::Error::other("fakehub: stalled body, closing"));
            }
            // hyper drops what it still buffers when the body fails: let it flush what was sent first.
            tokio::time::sleep(Duration::from_millis(FLUSH_BEFORE_CLOSE_MS)).await;
            return Err(io::Error::other("fakehub: truncated body, closing"));
        }
        let len = (CHUNK_BYTES as u64).min(self.end - self.pos).min(self.bytes_before_fault()) as usize;
        let chunk = read_chunk(&self.file, self.pos, len).await?;
        if chunk.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "fakehub: content shorter than its size"));
        }
        let chunk = if self.plan.corrupt { corrupt(chunk, self.pos, self.file.size_bytes() / 2) } else { chunk };
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

async fn read_chunk(file: &Arc<HubFile>, offset: u64, len: usize) -> io::Result<Bytes> {
    if let Content::Disk { .. } = file.content {
        let file = file.clone();
        return tokio::task::spawn_blocking(move || file.content.read_at(offset, len))
            .await
            .map_err(io::Error::other)?;
    }
    file.content.read_at(offset, len)
}

/// Flips the byte at file offset `at` if this chunk (starting at `offset`) holds it.
fn corrupt(chunk: Bytes, offset: u64, at: u64) -> Bytes {
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
        assert_eq!(parse_range(Some("bytes=-30"), 10), part(0, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 10), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=3-1"), 10), Full);
        assert_eq!(parse_range(Some("bytes=0-1,4-5"), 10), Full);
        assert_eq!(parse_range(Some("items=0-1"), 10), Full);
    }

    #[test]
    fn corrupt_flips_one_byte_only_where_it_falls() {
        assert_eq!(corrupt(Bytes::from_static(b"abcd"), 10, 12).as_ref(), b"ab\x9cd");
        assert_eq!(corrupt(Bytes::from_static(b"abcd"), 10, 14).as_ref(), b"abcd");
    }
}
