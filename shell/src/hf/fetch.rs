//! One file from `resolve/{commit}/{path}` into a partial file: resumed from its kept prefix, hashed while
//! streaming, checked for size and hash at the end.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use http::StatusCode;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE};

use super::error::{RequestContext, classify_status};
use super::hashing::StreamHasher;
use super::http::{BodyEvent, next_body_event};
use super::listing::RemoteFile;
use super::paths::{check_repo_id, check_repo_path, is_commit_sha};
use super::{HfError, HfSource, encode_path};

/// In-call resumes after a cut connection that made progress; anything beyond goes back to the caller.
pub(super) const CUT_RESUMES_MAX: u32 = 3;
const PREFIX_READ_CHUNK_BYTES: usize = 1 << 20;

/// Downloads `file` of `repo_id` at `commit` into `partial_path`. On success the partial file holds the
/// verified content (synced); the caller renames it into place. Stalled and Truncated keep the partial
/// for resume; Integrity removes it.
pub async fn fetch_file(
    source: &HfSource,
    repo_id: &str,
    commit: &str,
    file: &RemoteFile,
    partial_path: &Path,
    stall_timeout_ms: u64,
) -> Result<(), HfError> {
    check_repo_id(repo_id)?;
    check_repo_path(&file.path)?;
    if !is_commit_sha(commit) {
        return Err(HfError::Protocol { reason: format!("{commit:?} is not a commit sha") });
    }
    let url = source.url(&format!("/{repo_id}/resolve/{commit}/{}", encode_path(&file.path)))?;
    let mut partial = Partial::open(partial_path, file).await?;
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

/// One GET from the partial's length to the end of the file (or to a failure).
async fn transfer(
    source: &HfSource,
    repo_id: &str,
    url: http::Uri,
    partial: &mut Partial<'_>,
    stall_timeout_ms: u64,
) -> Result<(), HfError> {
    let range_start = (partial.len_bytes > 0).then_some(partial.len_bytes);
    let (response, token_sent) = source.client.get(url, &source.credentials(), range_start, stall_timeout_ms).await?;
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
    if let Some(length) = content_length.filter(|length| partial.len_bytes + length != partial.file.size_bytes) {
        let got = format!("{} bytes (Content-Length)", partial.len_bytes + length);
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
    path: PathBuf,
    handle: File,
    len_bytes: u64,
    hasher: StreamHasher,
}

impl<'a> Partial<'a> {
    /// Opens (or creates) the partial file and hashes its kept prefix once; a prefix longer than the file
    /// cannot be right and is dropped.
    async fn open(path: &Path, file: &'a RemoteFile) -> Result<Partial<'a>, HfError> {
        let io_error = |e: std::io::Error| HfError::LocalIo { path: path.display().to_string(), reason: e.to_string() };
        let mut handle =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).map_err(io_error)?;
        let mut len_bytes = handle.metadata().map_err(io_error)?.len();
        if len_bytes > file.size_bytes {
            handle.set_len(0).map_err(io_error)?;
            len_bytes = 0;
        }
        let hasher = StreamHasher::new(&file.hash, file.size_bytes);
        let reader = handle.try_clone().map_err(io_error)?;
        let hashed = tokio::task::spawn_blocking(move || hash_prefix(reader, len_bytes, hasher)).await;
        let hasher = hashed.map_err(|e| io_error(std::io::Error::other(e)))?.map_err(io_error)?;
        handle.seek(SeekFrom::Start(len_bytes)).map_err(io_error)?;
        Ok(Partial { file, path: path.to_owned(), handle, len_bytes, hasher })
    }

    fn io_error(&self, error: std::io::Error) -> HfError {
        HfError::LocalIo { path: self.path.display().to_string(), reason: error.to_string() }
    }

    fn append(&mut self, data: &[u8]) -> Result<(), HfError> {
        self.handle.write_all(data).map_err(|e| self.io_error(e))?;
        self.hasher.update(data);
        self.len_bytes += data.len() as u64;
        Ok(())
    }

    /// Back to zero bytes (a 200 to a ranged request sends the whole file).
    fn restart(&mut self) -> Result<(), HfError> {
        self.handle.set_len(0).map_err(|e| self.io_error(e))?;
        self.handle.seek(SeekFrom::Start(0)).map_err(|e| self.io_error(e))?;
        self.len_bytes = 0;
        self.hasher = StreamHasher::new(&self.file.hash, self.file.size_bytes);
        Ok(())
    }

    fn truncated(&self, reason: String) -> HfError {
        let path = self.file.path.clone();
        HfError::Truncated { path, got_bytes: self.len_bytes, expected_bytes: self.file.size_bytes, reason }
    }

    /// Removes the partial file: its bytes are wrong. Returns the Integrity error to give.
    fn discard(&self, expected: String, got: String) -> HfError {
        if let Err(error) = std::fs::remove_file(&self.path) {
            return self.io_error(error);
        }
        HfError::Integrity { path: self.file.path.clone(), expected, got }
    }

    /// The full file is here: its hash decides whether it is kept (synced) or removed.
    fn verify(self) -> Result<(), HfError> {
        let got = self.hasher.finish_hex();
        if got == self.file.hash.expected_hex() {
            let synced = self.handle.sync_data();
            return synced
                .map_err(|e| HfError::LocalIo { path: self.path.display().to_string(), reason: e.to_string() });
        }
        let _ = std::fs::remove_file(&self.path);
        Err(HfError::Integrity { path: self.file.path.clone(), expected: self.file.hash.describe(), got })
    }
}

/// Hashes the first `len_bytes` of `reader` into `hasher` (blocking: a prefix can be gigabytes).
fn hash_prefix(mut reader: File, len_bytes: u64, mut hasher: StreamHasher) -> std::io::Result<StreamHasher> {
    reader.seek(SeekFrom::Start(0))?;
    let mut buffer = vec![0u8; PREFIX_READ_CHUNK_BYTES];
    let mut left_bytes = len_bytes;
    while left_bytes > 0 {
        let want = buffer.len().min(usize::try_from(left_bytes).unwrap_or(usize::MAX));
        let got = reader.read(&mut buffer[..want])?;
        if got == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "partial file shrank while hashed"));
        }
        hasher.update(&buffer[..got]);
        left_bytes -= got as u64;
    }
    Ok(hasher)
}
