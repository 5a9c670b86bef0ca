//! One byte range of a file written at its offsets in a preallocated partial file, for files fetched in
//! parallel parts. Nothing is hashed here: parts arrive out of order, so the caller's hasher follows the
//! file's contiguous written prefix (download/multipart.rs).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;
use http::header::CONTENT_RANGE;

use super::error::{RequestContext, classify_status};
use super::fetch::{Meter, resolve_url};
use super::http::{BodyEvent, ByteRange, next_body_event};
use super::listing::RemoteFile;
use super::writeback::Writeback;
use super::{HfError, HfSource};

/// How a ranged request ended (failures are errors).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Every byte of the range is written.
    Done,
    /// The server answered 200 (the whole file) to a ranged request: this file needs a single stream.
    RangeIgnored,
}

/// Fetches bytes `done..end` of `file` into `partial` at their own offsets. `done` is the part's resume
/// point: it advances after every write, so the caller can record it (and resume from it) whenever this
/// returns or is dropped.
#[allow(clippy::too_many_arguments, reason = "one request's whole context; a struct would only rename it")]
pub async fn fetch_range(
    source: &HfSource,
    repo_id: &str,
    commit: &str,
    file: &RemoteFile,
    partial: &File,
    (done, end): (&AtomicU64, u64),
    stall_timeout_ms: u64,
    meter: &Meter,
) -> Result<RangeAnswer, HfError> {
    let url = resolve_url(source, repo_id, commit, file)?;
    let start = done.load(Ordering::Relaxed);
    if start >= end {
        return Ok(RangeAnswer::Done);
    }
    let range = ByteRange { start, end: Some(end) };
    let (response, token_sent) = source.client.get(url, &source.credentials(), Some(range), stall_timeout_ms).await?;
    match response.status() {
        StatusCode::PARTIAL_CONTENT => check_part(&response, file, start, end)?,
        StatusCode::OK => return Ok(RangeAnswer::RangeIgnored),
        status => {
            let context = RequestContext { repo_id, revision: None, path: Some(&file.path), token_sent };
            return Err(classify_status(status, response.headers(), &context));
        }
    }
    let mut body = response.into_body();
    let what = |at: u64| format!("{} at byte {at}", file.path);
    let mut writeback = Writeback::from(start);
    loop {
        let at = done.load(Ordering::Relaxed);
        match next_body_event(&mut body, stall_timeout_ms).await {
            BodyEvent::Data(data) if at + data.len() as u64 > end => {
                return Err(HfError::Protocol { reason: format!("{}: more bytes than the range asked", what(at)) });
            }
            BodyEvent::Data(data) => {
                let io_error = |e: std::io::Error| HfError::LocalIo { path: what(at), reason: e.to_string() };
                partial.write_all_at(&data, at).map_err(io_error)?;
                // Release: the prefix hasher reads the bytes below this offset once it sees it.
                done.store(at + data.len() as u64, Ordering::Release);
                writeback.wrote(partial, at + data.len() as u64);
                meter.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                meter.have_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            BodyEvent::End if at == end => return Ok(RangeAnswer::Done),
            BodyEvent::End => return Err(cut(file, at, end, "the body ended early".to_owned())),
            BodyEvent::Cut(reason) => return Err(cut(file, at, end, reason)),
            BodyEvent::Stalled => return Err(HfError::Stalled { what: what(at), stall_timeout_ms }),
        }
    }
}

fn cut(file: &RemoteFile, at: u64, end: u64, reason: String) -> HfError {
    HfError::Truncated { path: file.path.clone(), got_bytes: at, expected_bytes: end, reason }
}

/// A 206 must carry exactly the bytes asked for, of a file of the listed size.
fn check_part(
    response: &http::Response<hyper::body::Incoming>,
    file: &RemoteFile,
    start: u64,
    end: u64,
) -> Result<(), HfError> {
    let header = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let expected = format!("bytes {start}-{}/{}", end - 1, file.size_bytes);
    let star = format!("bytes {start}-{}/*", end - 1);
    if header.trim() == expected || header.trim() == star {
        return Ok(());
    }
    Err(HfError::Protocol { reason: format!("{}: Content-Range {header:?}, asked for {expected:?}", file.path) })
}
