//! One object into a partial file: resumed from its kept prefix (hashed once), streamed from the
//! store, hashed while written, checked for size and MD5 at the end. A big object comes in ranged
//! parts instead (`fetch_range`, driven by the engine's `multipart`): each part streams straight
//! to its offsets in the partial file, so nothing but the HTTP bodies' own buffers is held. Both
//! start the writeback of every 8 MiB they write, so the sync before a file is kept waits little.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;

use super::{Backend, Store, StoreError};
use crate::hf::{Meter, RemoteFile, StreamHasher, Writeback, hash_prefix};

/// Downloads `file` into `partial` (opened by the caller beneath its partial directory). On
/// success the partial file holds the verified content, synced. Stalled and Truncated keep the
/// partial for a resume; Integrity empties it.
pub async fn fetch_file(
    store: &Store,
    file: &RemoteFile,
    mut partial: File,
    stall_timeout_ms: u64,
    meter: &Meter,
) -> Result<(), StoreError> {
    let (mut have, mut hasher) = kept_prefix(&partial, file, meter).await?;
    if have < file.size_bytes {
        let key = store.key_of(&file.path);
        let what = format!("{} ({key})", file.path);
        let (mut stream, from) = open_stream(store, (&key, file), (have, file.size_bytes), &what).await?;
        if from != have {
            // The server sent the whole object: start the file again.
            (have, hasher) = (0, StreamHasher::new(&file.hash, file.size_bytes));
            partial.set_len(0).map_err(|e| local(file, e))?;
        }
        partial.seek(SeekFrom::Start(have)).map_err(|e| local(file, e))?;
        let mut writeback = Writeback::from(have);
        let stall = Duration::from_millis(stall_timeout_ms);
        loop {
            let next = tokio::time::timeout(stall, stream.next()).await;
            let bytes = match next {
                Err(_) => return Err(StoreError::Stalled { what, stall_timeout_ms }),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(cut(file, have, &e)),
                Ok(Some(Ok(bytes))) => bytes,
            };
            if have + bytes.len() as u64 > file.size_bytes {
                return Err(emptied(partial, file, "more bytes than listed".into()));
            }
            partial.write_all(&bytes).map_err(|e| local(file, e))?;
            hasher.update(&bytes);
            have += bytes.len() as u64;
            writeback.wrote(&partial, have);
            meter.have_bytes.store(have, Ordering::Relaxed);
            meter.fetched_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
    }
    if have < file.size_bytes {
        return Err(StoreError::Truncated {
            path: file.path.clone(),
            got_bytes: have,
            expected_bytes: file.size_bytes,
        });
    }
    let got = hasher.finish_hex();
    if got != file.hash.expected_hex() {
        return Err(emptied(partial, file, got));
    }
    partial.sync_all().map_err(|e| local(file, e))
}

type ByteStream = futures::stream::BoxStream<'static, Result<hyper::body::Bytes, StoreError>>;

/// The object's bytes from `have` to `size` as one streamed request, and the offset the stream
/// starts at (0 when a server ignored the range). An object checked by size only is read as the
/// version listed (`If-Match`, and its ETag stat'ed or, on OCI, the answer's compared): the bytes
/// of another upload of the same size are `Changed`, not taken for the rest of the file.
async fn open_stream(
    store: &Store,
    (key, file): (&str, &RemoteFile),
    (have, size): (u64, u64),
    what: &str,
) -> Result<(ByteStream, u64), StoreError> {
    let changed = || StoreError::Changed { path: file.path.clone() };
    let asked = file.size_only_etag();
    match &store.backend {
        Backend::OpenDal { op, .. } => {
            // A failed `If-Match` is `Changed` (`StoreError::from_opendal`).
            let opendal_error = |e: opendal::Error| StoreError::from_opendal(what, &e);
            // A server may ignore `If-Match` on a GET (s3s-fs does): the version is stat'ed first.
            if let Some(etag) = asked {
                let meta = op.stat_with(key).if_match(etag).await.map_err(opendal_error)?;
                if !super::listing::answer_is_version(etag, meta.etag()) {
                    return Err(changed());
                }
            }
            let reader = match asked {
                Some(etag) => op.reader_with(key).if_match(etag).await,
                None => op.reader_with(key).await,
            };
            let reader = reader.map_err(opendal_error)?;
            let stream = reader.into_bytes_stream(have..size).await.map_err(opendal_error)?;
            let (what, path) = (what.to_string(), file.path.clone());
            let stream = stream.map(move |r| r.map_err(|e| stream_error(&e, &what, &path)));
            Ok((stream.boxed(), have))
        }
        Backend::Oci { client, bucket } => {
            let range = crate::oci::ByteRange { start: have, end: Some(size) };
            let body = client.get_object(bucket, key, Some(range)).await.map_err(StoreError::from_oci)?;
            if let Some(asked) = asked
                && !super::listing::answer_is_version(asked, body.head.etag.as_deref())
            {
                return Err(changed());
            }
            let from = body.start;
            Ok((body.into_stream().map(|r| r.map_err(StoreError::from_oci)).boxed(), from))
        }
    }
}

/// An error of OpenDAL's byte stream (it sends the request when first polled): a failed
/// `If-Match` is `Changed`, anything else temporary (the partial file keeps what arrived).
fn stream_error(e: &std::io::Error, what: &str, path: &str) -> StoreError {
    let inner = e.get_ref().and_then(|inner| inner.downcast_ref::<opendal::Error>());
    match inner.map(opendal::Error::kind) {
        Some(opendal::ErrorKind::ConditionNotMatch) => StoreError::Changed { path: path.to_string() },
        _ => StoreError::Temporary { what: what.to_string(), reason: e.to_string() },
    }
}

/// Bytes `done..end` of `file` written at their own offsets in `partial` (preallocated by the
/// caller); `done` advances after every write, so the caller can record it and resume from it.
pub async fn fetch_range(
    store: &Store,
    file: &RemoteFile,
    partial: &File,
    (done, end): (&std::sync::atomic::AtomicU64, u64),
    stall_timeout_ms: u64,
    meter: &Meter,
) -> Result<crate::hf::RangeAnswer, StoreError> {
    use std::os::unix::fs::FileExt;
    let start = done.load(Ordering::Relaxed);
    if start >= end {
        return Ok(crate::hf::RangeAnswer::Done);
    }
    let key = store.key_of(&file.path);
    let what = format!("{} ({key}) at byte {start}", file.path);
    let (mut stream, from) = open_stream(store, (&key, file), (start, end), &what).await?;
    if from != start {
        return Ok(crate::hf::RangeAnswer::RangeIgnored);
    }
    let stall = Duration::from_millis(stall_timeout_ms);
    let mut writeback = Writeback::from(start);
    loop {
        let at = done.load(Ordering::Relaxed);
        let bytes = match tokio::time::timeout(stall, stream.next()).await {
            Err(_) => return Err(StoreError::Stalled { what, stall_timeout_ms }),
            Ok(None) if at == end => return Ok(crate::hf::RangeAnswer::Done),
            Ok(None) => {
                return Err(StoreError::Truncated { path: file.path.clone(), got_bytes: at, expected_bytes: end });
            }
            Ok(Some(Err(e))) => return Err(cut(file, at, &e)),
            Ok(Some(Ok(bytes))) => bytes,
        };
        if at + bytes.len() as u64 > end {
            return Err(StoreError::Other { reason: format!("{what}: more bytes than the range asked") });
        }
        partial.write_all_at(&bytes, at).map_err(|e| local(file, e))?;
        // Release: the prefix hasher reads the bytes below this offset once it sees it.
        done.store(at + bytes.len() as u64, Ordering::Release);
        writeback.wrote(partial, at + bytes.len() as u64);
        meter.fetched_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        meter.have_bytes.fetch_add(bytes.len() as u64, Ordering::Relaxed);
    }
}

/// What the partial file holds already, hashed (blocking, on a thread of its own); a partial
/// longer than the object starts again from zero.
async fn kept_prefix(partial: &File, file: &RemoteFile, meter: &Meter) -> Result<(u64, StreamHasher), StoreError> {
    let len = partial.metadata().map_err(|e| local(file, e))?.len();
    let reader = partial.try_clone().map_err(|e| local(file, e))?;
    let (expected, size) = (file.hash.clone(), file.size_bytes);
    let keep = if len <= size { len } else { 0 };
    if keep == 0 {
        reader.set_len(0).map_err(|e| local(file, e))?;
    }
    let hashed =
        tokio::task::spawn_blocking(move || hash_prefix(&reader, keep, StreamHasher::new(&expected, size), &|| false));
    let hasher = hashed.await.map_err(|e| StoreError::Other { reason: e.to_string() })?.map_err(|e| local(file, e))?;
    meter.have_bytes.store(keep, Ordering::Relaxed);
    Ok((keep, hasher))
}

/// An error mid-stream keeps what arrived: a retry resumes from there.
fn cut(file: &RemoteFile, have: u64, error: &StoreError) -> StoreError {
    match error {
        StoreError::Temporary { .. } | StoreError::Other { .. } => {
            StoreError::Truncated { path: file.path.clone(), got_bytes: have, expected_bytes: file.size_bytes }
        }
        other => other.clone(),
    }
}

fn emptied(partial: File, file: &RemoteFile, got: String) -> StoreError {
    let _ = partial.set_len(0);
    StoreError::Integrity { path: file.path.clone(), expected: file.hash.describe(), got }
}

fn local(file: &RemoteFile, e: std::io::Error) -> StoreError {
    StoreError::Other { reason: format!("{}: partial file: {e}", file.path) }
}
