//! A big file in `multipart_concurrency` ranged parts, written with positional writes into one
//! preallocated partial file (never part files assembled later).
//!
//! Resume across restarts: a record beside the partial file (`NAME.parts`) holds each part's span and the
//! offset it reached. A checkpoint reads the offsets first, then syncs the file's data, then writes the
//! record (synced, renamed into place), so a record never claims bytes that are not on disk. The record
//! is written before the file is preallocated: a partial file without a record was written by a single
//! stream, and its length is a contiguous prefix.
//!
//! Parts arrive out of order, so a streaming hash is impossible: the whole file is hashed once at the end.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::DownloadError;
use super::disk;
use super::progress::FileSlot;
use super::retry::{Retry, cancelled, pause, until_cancelled};
use super::transfer::{Ctx, Source};
use crate::hf::{self, HfError, RangeAnswer, RemoteFile};

/// How often the parts' offsets are recorded while they run.
const CHECKPOINT_PERIOD_MS: u64 = 5_000;
const RECORD_BYTES_MAX: u64 = 1 << 20;
const PARTS_MAX: usize = 64;

pub(super) enum Multipart {
    /// The file is complete, hashed, synced; the record is gone.
    Verified,
    /// The server answered a ranged request with the whole file: the partial now holds a contiguous prefix
    /// (no record) for a single stream to continue.
    RangeIgnored,
}

/// Each part's `[start, done, end)`, and what the record is for.
#[derive(Serialize, Deserialize)]
struct Record {
    size: u64,
    hash: String,
    parts: Vec<[u64; 3]>,
}

/// The partial file and where each part is.
struct Parts {
    file: File,
    spans: Vec<(u64, u64)>,
    done: Vec<AtomicU64>,
}

impl Parts {
    fn have_bytes(&self) -> u64 {
        self.spans.iter().zip(&self.done).map(|((start, _), done)| done.load(Ordering::Relaxed) - start).sum()
    }

    /// The bytes from 0 that every part before has filled.
    fn contiguous_prefix(&self) -> u64 {
        let mut prefix = 0;
        for ((start, end), done) in self.spans.iter().zip(&self.done) {
            let done = done.load(Ordering::Relaxed);
            if *start != prefix {
                break;
            }
            prefix = done;
            if done < *end {
                break;
            }
        }
        prefix
    }
}

fn record_name(name: &str) -> String {
    format!("{name}.parts")
}

pub(super) async fn fetch(
    ctx: &Arc<Ctx>,
    file: &RemoteFile,
    name: &str,
    slot: &Arc<FileSlot>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Multipart, DownloadError> {
    let parts = Arc::new(open_parts(ctx, file, name)?);
    slot.meter.have_bytes.store(parts.have_bytes(), Ordering::Relaxed);
    let answer = run_parts(ctx, file, name, &parts, slot, stop).await;
    checkpoint(ctx, file, name, &parts)?;
    if answer? == RangeAnswer::RangeIgnored {
        let prefix = parts.contiguous_prefix();
        parts.file.set_len(prefix).map_err(|e| local(file, e))?;
        disk::remove_partial(&ctx.partial_dir, &record_name(name));
        slot.meter.have_bytes.store(prefix, Ordering::Relaxed);
        return Ok(Multipart::RangeIgnored);
    }
    let (reader, remote, stop_hash) = (parts.file.try_clone().map_err(|e| local(file, e))?, file.clone(), stop.clone());
    let hashed = tokio::task::spawn_blocking(move || hf::file_matches(&reader, &remote, &|| *stop_hash.borrow()));
    match hashed.await.map_err(|e| DownloadError::Disk(format!("hashing {}: {e}", file.path)))? {
        Ok(true) => {}
        Ok(false) => {
            parts.file.set_len(0).map_err(|e| local(file, e))?;
            disk::remove_partial(&ctx.partial_dir, &record_name(name));
            slot.meter.have_bytes.store(0, Ordering::Relaxed);
            let (expected, got) = (file.hash.describe(), "other content (hashed after all parts)".to_owned());
            return Err(HfError::Integrity { path: file.path.clone(), expected, got }.into());
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Err(DownloadError::Cancelled),
        Err(e) => return Err(local(file, e)),
    }
    parts.file.sync_data().map_err(|e| local(file, e))?;
    disk::remove_partial(&ctx.partial_dir, &record_name(name));
    Ok(Multipart::Verified)
}

fn local(file: &RemoteFile, error: std::io::Error) -> DownloadError {
    DownloadError::Disk(format!("partial file of {}: {error}", file.path))
}

/// The partial file with its parts: from the record when it fits this file, else split afresh with the
/// file's contiguous prefix counted as done; recorded, then preallocated.
fn open_parts(ctx: &Ctx, file: &RemoteFile, name: &str) -> Result<Parts, DownloadError> {
    let handle = disk::open_partial(&ctx.partial_dir, name)?;
    let len = handle.metadata().map_err(|e| local(file, e))?.len();
    let record = disk::read_small_at(&ctx.partial_dir, &record_name(name), RECORD_BYTES_MAX)
        .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
        .filter(|record| record_fits(record, file) && len == file.size_bytes);
    let triples = match record {
        Some(record) => record.parts,
        None => {
            let prefix = if len <= file.size_bytes { len } else { 0 };
            handle.set_len(prefix).map_err(|e| local(file, e))?;
            let count = ctx.opts.multipart_concurrency.clamp(1, PARTS_MAX) as u64;
            let part_bytes = file.size_bytes.div_ceil(count).max(1);
            let starts = (0..count).map(|i| i * part_bytes).filter(|start| *start < file.size_bytes);
            let triples: Vec<[u64; 3]> = starts
                .map(|start| {
                    let end = (start + part_bytes).min(file.size_bytes);
                    [start, prefix.clamp(start, end), end]
                })
                .collect();
            write_record(ctx, file, name, &triples)?;
            preallocate(&handle, file.size_bytes).map_err(|e| local(file, e))?;
            triples
        }
    };
    let spans = triples.iter().map(|[start, _, end]| (*start, *end)).collect();
    let done = triples.iter().map(|[_, done, _]| AtomicU64::new(*done)).collect();
    Ok(Parts { file: handle, spans, done })
}

/// The record is for this file and its parts tile it in order.
fn record_fits(record: &Record, file: &RemoteFile) -> bool {
    let mut next = 0;
    for [start, done, end] in &record.parts {
        if *start != next || !(start <= done && done <= end) || start >= end {
            return false;
        }
        next = *end;
    }
    record.size == file.size_bytes && record.hash == file.hash.expected_hex() && next == file.size_bytes
}

fn write_record(ctx: &Ctx, file: &RemoteFile, name: &str, parts: &[[u64; 3]]) -> Result<(), DownloadError> {
    let record = Record { size: file.size_bytes, hash: file.hash.expected_hex().to_owned(), parts: parts.to_vec() };
    let bytes = serde_json::to_vec(&record).expect("a record serialises");
    disk::write_synced_at(&ctx.partial_dir, &record_name(name), &bytes, disk::PARTIAL_DIR)
}

/// Offsets first, then the data synced, then the record: it never claims bytes not on disk.
fn checkpoint(ctx: &Ctx, file: &RemoteFile, name: &str, parts: &Parts) -> Result<(), DownloadError> {
    let triples: Vec<[u64; 3]> = parts
        .spans
        .iter()
        .zip(&parts.done)
        .map(|((start, end), done)| [*start, done.load(Ordering::Relaxed), *end])
        .collect();
    parts.file.sync_data().map_err(|e| local(file, e))?;
    write_record(ctx, file, name, &triples)
}

/// Reserves the file's blocks (so a full disk shows now, not mid-transfer); a sparse length where the
/// filesystem cannot.
fn preallocate(handle: &File, size_bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let length = libc::off_t::try_from(size_bytes).map_err(std::io::Error::other)?;
    // SAFETY: fallocate on a descriptor this function borrows; no memory is passed.
    if unsafe { libc::fallocate(handle.as_raw_fd(), 0, 0, length) } == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error() {
        error if error.raw_os_error() == Some(libc::EOPNOTSUPP) => handle.set_len(size_bytes),
        error => Err(error),
    }
}

/// Every unfinished part on a task of its own, with checkpoints while they run. The first failure (or a
/// 200 to a ranged request) stops the others and is the answer.
async fn run_parts(
    ctx: &Arc<Ctx>,
    file: &RemoteFile,
    name: &str,
    parts: &Arc<Parts>,
    slot: &Arc<FileSlot>,
    stop: &mut watch::Receiver<bool>,
) -> Result<RangeAnswer, DownloadError> {
    let (parts_stop_tx, parts_stop) = watch::channel(false);
    let mut tasks = JoinSet::new();
    for index in 0..parts.spans.len() {
        let args = (ctx.clone(), file.clone(), parts.clone(), slot.clone(), parts_stop.clone());
        tasks.spawn(run_part(args, index));
    }
    let mut ticker = tokio::time::interval(Duration::from_millis(CHECKPOINT_PERIOD_MS));
    let mut answer = Ok(RangeAnswer::Done);
    while !tasks.is_empty() {
        tokio::select! {
            Some(joined) = tasks.join_next() => {
                let result = joined.unwrap_or_else(|e| Err(DownloadError::Disk(format!("a part task failed: {e}"))));
                if matches!(answer, Ok(RangeAnswer::Done)) && !matches!(result, Ok(RangeAnswer::Done)) {
                    answer = result;
                    let _ = parts_stop_tx.send(true);
                }
            }
            () = cancelled(stop), if !*parts_stop_tx.borrow() => {
                answer = Err(DownloadError::Cancelled);
                let _ = parts_stop_tx.send(true);
            }
            _ = ticker.tick() => checkpoint(ctx, file, name, parts)?,
        }
    }
    answer
}

type PartArgs = (Arc<Ctx>, RemoteFile, Arc<Parts>, Arc<FileSlot>, watch::Receiver<bool>);

/// One part from its offset to its end, from the Hub or a store, retried as `Retry` says.
async fn run_part((ctx, file, parts, slot, mut stop): PartArgs, index: usize) -> Result<RangeAnswer, DownloadError> {
    let mut retry = Retry::new(ctx.opts.request_attempts_max);
    let (done, end) = (&parts.done[index], parts.spans[index].1);
    let (stall_ms, meter) = (ctx.opts.stall_timeout_ms, &slot.meter);
    loop {
        let before = done.load(Ordering::Relaxed);
        let fetch = async {
            match &ctx.source {
                Source::Hub(hub) => {
                    hf::fetch_range(hub, &ctx.repo_id, &ctx.commit, &file, &parts.file, (done, end), stall_ms, meter)
                        .await
                        .map_err(DownloadError::Hub)
                }
                Source::Store(store) => {
                    crate::store::fetch_range(store, &file, &parts.file, (done, end), stall_ms, meter)
                        .await
                        .map_err(DownloadError::Store)
                }
            }
        };
        let error = match until_cancelled(&mut stop, fetch).await? {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let Some(wait) = retry.next_wait_download(&error, done.load(Ordering::Relaxed) > before) else {
            return Err(error);
        };
        pause(&mut stop, wait).await?;
    }
}
