//! One file from `resolve/{commit}/{path}` into a partial file: resumed from its kept prefix, hashed while
//! streaming, checked for size and hash at the end.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE};

use super::error::{RequestContext, classify_status};
use super::hashing::{StreamHasher, hash_prefix};
use super::http::{BodyEvent, ByteRange, next_body_event};
use super::listing::RemoteFile;
use super::paths::{check_repo_id, check_repo_path, is_commit_sha};
use super::writeback::Writeback;
use super::{HfError, HfSource, encode_path};

/// In-call resumes after a cut connection that made progress; anything beyond goes back to the caller.
pub(super) const CUT_RESUMES_MAX: u32 = 3;

/// What a transfer has done so far, read by the caller's progress reports while it runs.
#[derive(Debug, Default)]
pub struct Meter {
    /// Bytes of the file held in its partial file (a restart from zero sets it back).
    pub have_bytes: AtomicU64,
    /// Body bytes received over the network.
    pub fetched_bytes: AtomicU64,
}

/// Downloads `file` of `repo_id` at `commit` into `partial`, a file the caller opened (relative to its
/// partial directory's fd, so nothing here goes by path) for reading and writing. On success the partial
/// file holds the verified content (synced); the caller renames it into place. Stalled and Truncated keep
/// the partial for resume; Integrity empties it.
pub async fn fetch_file(
    source: &HfSource,
    repo_id: &str,
    commit: &str,
    file: &RemoteFile,
    partial: File,
    stall_timeout_ms: u64,
    meter: &Meter,
) -> Result<(), HfError> {
    let url = resolve_url(source, repo_id, commit, file)?;
    let mut partial = Partial::open(partial, file, meter).await?;
    let mut cut_resumes = 0;
    loop {
        if partial.len_bytes == file.size_bytes {
            return partial.verify();
        }
        let before_bytes = partial.len_bytes;
        match transfer(source, repo_id, url.clone(), &mut partial, stall_timeout_ms).await {
            Ok(()) => {}
            Err(HfError::Truncated { .. }) if partial.len_bytes > before_bytes && cut_resumes < CUT_RESUMES_MAX => {
                cut_resumes += 1;
            }
            Err(error) => return Err(error),
        }
    }
}

/// `resolve/{commit}/{path}`, after checking every part of it.
pub(super) fn resolve_url(
    source: &HfSource,
    repo_id: &str,
    commit: &str,
    file: &RemoteFile,
) -> Result<http::Uri, HfError> {
    check_repo_id(repo_id)?;
    check_repo_path(&file.path)?;
    if !is_commit_sha(commit) {
        return Err(HfError::Protocol { reason: format!("{commit:?} is not a commit sha") });
    }
    source.url(&format!("/{repo_id}/resolve/{commit}/{}", encode_path(&file.path)))
}

/// One GET from the partial's length to the end of the file (or to a failure).
async fn transfer(
    source: &HfSource,
    repo_id: &str,
    url: http::Uri,
    partial: &mut Partial<'_>,
    stall_timeout_ms: u64,
) -> Result<(), HfError> {
    let range_start = (partial.len_bytes > 0).then_some(partial.len_bytes);
    let range = range_start.map(|start| ByteRange { start, end: None });
    let (response, token_sent) = source.client.get(url, &source.credentials(), range, stall_timeout_ms).await?;
    let path = partial.file.path.as_str();
    match response.status() {
        StatusCode::OK if range_start.is_some() => partial.restart()?,
        StatusCode::OK => {}
        StatusCode::PARTIAL_CONTENT if range_start.is_some() => check_content_range(&response, partial)?,
        StatusCode::RANGE_NOT_SATISFIABLE if range_start.is_some() => {
            partial.restart()?;
            let reason = format!("{path}: range from byte {} refused (file smaller than listed?)", partial.len_bytes);
            return Err(HfError::Protocol { reason });
        }
        status => {
            let context = RequestContext { repo_id, revision: None, path: Some(path), token_sent };
            return Err(classify_status(status, response.headers(), &context));
        }
    }
    let content_length = response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    // Checked: a Content-Length near u64::MAX is a lie, not a reason to wrap.
    let total = |length: u64| partial.len_bytes.checked_add(length);
    if let Some(length) = content_length.filter(|length| total(*length) != Some(partial.file.size_bytes)) {
        let got = total(length)
            .map_or(format!("{length} more bytes (Content-Length)"), |t| format!("{t} bytes (Content-Length)"));
        return Err(partial.discard(format!("{} bytes", partial.file.size_bytes), got));
    }
    stream_body(response.into_body(), partial, stall_timeout_ms).await
}

async fn stream_body(
    mut body: hyper::body::Incoming,
    partial: &mut Partial<'_>,
    stall_timeout_ms: u64,
) -> Result<(), HfError> {
    let size_bytes = partial.file.size_bytes;
    loop {
        match next_body_event(&mut body, stall_timeout_ms).await {
            BodyEvent::Data(data) if partial.len_bytes + data.len() as u64 > size_bytes => {
                return Err(partial.discard(format!("{size_bytes} bytes"), format!("more than {size_bytes} bytes")));
            }
            BodyEvent::Data(data) => partial.append(&data)?,
            BodyEvent::End if partial.len_bytes == size_bytes => return Ok(()),
            BodyEvent::End => return Err(partial.truncated("the body ended early".to_owned())),
            BodyEvent::Cut(reason) => return Err(partial.truncated(reason)),
            BodyEvent::Stalled => {
                let what = format!("{} at byte {}", partial.file.path, partial.len_bytes);
                return Err(HfError::Stalled { what, stall_timeout_ms });
            }
        }
    }
}

/// A 206 must start where the partial ends and describe a file of the listed size.
fn check_content_range(response: &http::Response<hyper::body::Incoming>, partial: &Partial<'_>) -> Result<(), HfError> {
    let header = response.headers().get(CONTENT_RANGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let parsed = header.strip_prefix("bytes ").and_then(|spec| {
        let (range, total) = spec.split_once('/')?;
        let (start, _) = range.split_once('-')?;
        Some((start.trim().parse::<u64>().ok()?, total.trim().parse::<u64>().ok()))
    });
    match parsed {
        Some((start, total)) if start == partial.len_bytes && total.is_none_or(|t| t == partial.file.size_bytes) => {
            Ok(())
        }
        _ => Err(HfError::Protocol {
            reason: format!(
                "{}: Content-Range {header:?} does not continue from byte {}",
                partial.file.path, partial.len_bytes
            ),
        }),
    }
}

/// The partial file and the hash of what it holds.
struct Partial<'a> {
    file: &'a RemoteFile,
    handle: File,
    len_bytes: u64,
    hasher: StreamHasher,
    meter: &'a Meter,
    writeback: Writeback,
}

impl<'a> Partial<'a> {
    /// Hashes the kept prefix of the partial file once; a prefix longer than the file cannot be right and
    /// is dropped.
    async fn open(mut handle: File, file: &'a RemoteFile, meter: &'a Meter) -> Result<Partial<'a>, HfError> {
        let io_error = |e: std::io::Error| HfError::LocalIo { path: partial_name(file), reason: e.to_string() };
        let mut len_bytes = handle.metadata().map_err(io_error)?.len();
        if len_bytes > file.size_bytes {
            handle.set_len(0).map_err(io_error)?;
            len_bytes = 0;
        }
        let hasher = StreamHasher::new(&file.hash, file.size_bytes);
        let reader = handle.try_clone().map_err(io_error)?;
        let hashed = tokio::task::spawn_blocking(move || hash_prefix(&reader, len_bytes, hasher, &|| false)).await;
        let hasher = hashed.map_err(|e| io_error(std::io::Error::other(e)))?.map_err(io_error)?;
        handle.seek(SeekFrom::Start(len_bytes)).map_err(io_error)?;
        meter.have_bytes.store(len_bytes, Ordering::Relaxed);
        Ok(Partial { file, handle, len_bytes, hasher, meter, writeback: Writeback::from(len_bytes) })
    }

    fn io_error(&self, error: std::io::Error) -> HfError {
        HfError::LocalIo { path: partial_name(self.file), reason: error.to_string() }
    }

    fn append(&mut self, data: &[u8]) -> Result<(), HfError> {
        self.handle.write_all(data).map_err(|e| self.io_error(e))?;
        self.hasher.update(data);
        self.len_bytes += data.len() as u64;
        self.writeback.wrote(&self.handle, self.len_bytes);
        self.meter.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.meter.have_bytes.store(self.len_bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Back to zero bytes (a 200 to a ranged request sends the whole file).
    fn restart(&mut self) -> Result<(), HfError> {
        self.handle.set_len(0).map_err(|e| self.io_error(e))?;
        self.handle.seek(SeekFrom::Start(0)).map_err(|e| self.io_error(e))?;
        self.len_bytes = 0;
        self.writeback = Writeback::from(0);
        self.meter.have_bytes.store(0, Ordering::Relaxed);
        self.hasher = StreamHasher::new(&self.file.hash, self.file.size_bytes);
        Ok(())
    }

    fn truncated(&self, reason: String) -> HfError {
        let path = self.file.path.clone();
        HfError::Truncated { path, got_bytes: self.len_bytes, expected_bytes: self.file.size_bytes, reason }
    }

    /// Empties the partial file: its bytes are wrong. Returns the Integrity error to give.
    fn discard(&self, expected: String, got: String) -> HfError {
        self.meter.have_bytes.store(0, Ordering::Relaxed);
        if let Err(error) = self.handle.set_len(0) {
            return self.io_error(error);
        }
        HfError::Integrity { path: self.file.path.clone(), expected, got }
    }

    /// The full file is here: its hash decides whether it is kept (synced) or emptied.
    fn verify(mut self) -> Result<(), HfError> {
        let hasher = std::mem::replace(&mut self.hasher, StreamHasher::new(&self.file.hash, 0));
        let got = hasher.finish_hex();
        if got == self.file.hash.expected_hex() {
            return self.handle.sync_data().map_err(|e| self.io_error(e));
        }
        Err(self.discard(self.file.hash.describe(), got))
    }
}

/// How errors name a partial file (the repo path it is for).
fn partial_name(file: &RemoteFile) -> String {
    format!("partial file of {}", file.path)
}
