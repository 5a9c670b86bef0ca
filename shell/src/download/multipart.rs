//! A big file in `multipart_concurrency` ranged parts, written with positional writes into one
//! preallocated partial file (never part files assembled later).
//!
//! Resume across restarts: a record beside the partial file (`NAME.parts`) holds each part's span and the
//! offset it reached. A checkpoint reads the offsets first, then syncs the file's data, then writes the
//! record (synced, renamed into place), so a record never claims bytes that are not on disk. The record
//! is written before the file is preallocated: a partial file without a record was written by a single
//! stream, and its length is a contiguous prefix.
//!
//! The file is cut into chunks (16 MiB, more for files over 1 GiB: at most `PARTS_MAX`), handed out in
//! order to `multipart_concurrency` workers, so the file fills from its start. A hasher on a blocking
//! thread follows the contiguous written prefix as it grows, reading it back from the page cache: when the
//! last chunk lands only the tail is left to hash, instead of the whole file after the transfer.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::DownloadError;
use super::disk;
use super::progress::FileSlot;
use super::retry::{Retry, cancelled, pause, until_cancelled};
use super::transfer::{Ctx, Source};
use crate::hf::{self, HfError, RangeAnswer, RemoteFile, StreamHasher};

/// How often the parts' offsets are recorded while they run.
const CHECKPOINT_PERIOD_MS: u64 = 5_000;
const RECORD_BYTES_MAX: u64 = 1 << 20;
/// Chunks per file at most (the record's length, and the requests per file when nothing fails).
const PARTS_MAX: usize = 64;
/// A chunk's size for files up to `PARTS_MAX` times it: small enough that the hashed prefix trails the
/// transfer by a few chunks, large enough that a request's setup is noise.
const CHUNK_TARGET_BYTES: u64 = 16 << 20;

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
    /// No more bytes will be written in this call: the prefix hasher stops.
    abandoned: AtomicBool,
}

impl Parts {
    fn have_bytes(&self) -> u64 {
        self.spans.iter().zip(&self.done).map(|((start, _), done)| done.load(Ordering::Relaxed) - start).sum()
    }

    /// The bytes from 0 that every part before has filled.
    fn contiguous_prefix(&self) -> u64 {
        // Acquire: a part stores its offset after the bytes are written (Release).
        let parts =
            self.spans.iter().zip(&self.done).map(|((start, end), done)| [*start, done.load(Ordering::Acquire), *end]);
        filled_prefix(parts)
    }
}

fn record_name(name: &str) -> String {
    format!("{name}.parts")
}

/// Before one stream resumes a partial file the parts left (their record beside it): only the
/// record's contiguous done prefix is content; the rest was preallocated, and its holes read as
/// zeros, which a file checked by size only would take as the object (a review found such a
/// partial accepted without a byte fetched, when flags changed between runs). The file keeps
/// that prefix (none when the record does not fit), and the record goes.
pub(super) fn hand_to_one_stream(partial_dir: &OwnedFd, file: &RemoteFile, name: &str) -> Result<(), DownloadError> {
    let record_at = record_name(name);
    if !disk::exists_at(partial_dir, &record_at) {
        return Ok(());
    }
    let prefix = fitting_record(partial_dir, file, name).map_or(0, |record| filled_prefix(record.parts.into_iter()));
    let handle = disk::open_partial(partial_dir, name)?;
    let len = handle.metadata().map_err(|e| local(file, e))?.len();
    handle.set_len(prefix.min(len)).map_err(|e| local(file, e))?;
    handle.sync_all().map_err(|e| local(file, e))?;
    disk::remove_partial(partial_dir, &record_at);
    Ok(())
}

/// The bytes from 0 that parts (`[start, done, end]`, in order) have filled, each part from
/// where the one before ended.
fn filled_prefix(parts: impl Iterator<Item = [u64; 3]>) -> u64 {
    let mut prefix = 0;
    for [start, done, end] in parts {
        if start != prefix {
            break;
        }
        prefix = done;
        if done < end {
            break;
        }
    }
    prefix
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
    let _abandon_on_exit = Abandon(parts.clone());
    let hashing = follow_prefix(&parts, file, stop);
    let answer = run_parts(ctx, file, name, &parts, slot, stop).await;
    if !matches!(answer, Ok(RangeAnswer::Done)) {
        parts.abandoned.store(true, Ordering::Release);
    }
    // Joined before anything truncates the file it reads.
    let hashed = hashing.await.map_err(|e| DownloadError::Disk(format!("hashing {}: {e}", file.path)));
    checkpoint(ctx, file, name, &parts)?;
    if answer? == RangeAnswer::RangeIgnored {
        let prefix = parts.contiguous_prefix();
        parts.file.set_len(prefix).map_err(|e| local(file, e))?;
        disk::remove_partial(&ctx.partial_dir, &record_name(name));
        slot.meter.have_bytes.store(prefix, Ordering::Relaxed);
        return Ok(Multipart::RangeIgnored);
    }
    let got = match hashed? {
        Ok(hasher) => hasher.finish_hex(),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Err(DownloadError::Cancelled),
        Err(e) => return Err(local(file, e)),
    };
    if got != file.hash.expected_hex() {
        parts.file.set_len(0).map_err(|e| local(file, e))?;
        disk::remove_partial(&ctx.partial_dir, &record_name(name));
        slot.meter.have_bytes.store(0, Ordering::Relaxed);
        let got = format!("{got} (all parts hashed in order)");
        return Err(HfError::Integrity { path: file.path.clone(), expected: file.hash.describe(), got }.into());
    }
    parts.file.sync_data().map_err(|e| local(file, e))?;
    disk::remove_partial(&ctx.partial_dir, &record_name(name));
    Ok(Multipart::Verified)
}

/// Marks the parts abandoned however `fetch` ends (an error, or its future dropped), so that the prefix
/// hasher's thread never waits for bytes that will not come.
struct Abandon(Arc<Parts>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.abandoned.store(true, Ordering::Release);
    }
}

/// The file's hash, computed on a blocking thread that follows the contiguous written prefix; it ends
/// with `Interrupted` once the parts are abandoned or `stop` turns true.
fn follow_prefix(
    parts: &Arc<Parts>,
    file: &RemoteFile,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<std::io::Result<StreamHasher>> {
    let (parts, stop, expected, size) = (parts.clone(), stop.clone(), file.hash.clone(), file.size_bytes);
    tokio::task::spawn_blocking(move || {
        let written = || (!parts.abandoned.load(Ordering::Acquire)).then(|| parts.contiguous_prefix());
        let hasher = StreamHasher::new(&expected, size);
        hf::hash_growing_prefix(&parts.file, size, hasher, &written, &|| *stop.borrow())
    })
}

fn local(file: &RemoteFile, error: std::io::Error) -> DownloadError {
    DownloadError::Disk(format!("partial file of {}: {error}", file.path))
}

/// The partial file with its parts: from the record when it fits this file, else split afresh with the
/// file's contiguous prefix counted as done; recorded, then preallocated.
fn open_parts(ctx: &Ctx, file: &RemoteFile, name: &str) -> Result<Parts, DownloadError> {
    let handle = disk::open_partial(&ctx.partial_dir, name)?;
    let len = handle.metadata().map_err(|e| local(file, e))?.len();
    let record = fitting_record(&ctx.partial_dir, file, name).filter(|_| len == file.size_bytes);
    let triples = match record {
        Some(record) => record.parts,
        None => {
            let prefix = if len <= file.size_bytes { len } else { 0 };
            handle.set_len(prefix).map_err(|e| local(file, e))?;
            let part_bytes = chunk_bytes(file.size_bytes, ctx.opts.multipart_concurrency);
            let starts = (0..file.size_bytes.div_ceil(part_bytes)).map(|i| i * part_bytes);
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
    Ok(Parts { file: handle, spans, done, abandoned: AtomicBool::new(false) })
}

/// 16 MiB chunks, fewer than that when a file has fewer bytes than one per worker, and larger ones for
/// files that would need more than `PARTS_MAX`.
fn chunk_bytes(size_bytes: u64, workers: usize) -> u64 {
    let workers = workers.clamp(1, PARTS_MAX) as u64;
    let per_worker = size_bytes.div_ceil(workers);
    size_bytes.div_ceil(PARTS_MAX as u64).max(CHUNK_TARGET_BYTES.min(per_worker)).max(1)
}

/// The parts record beside partial file `name`, when it reads and is for `file`.
fn fitting_record(partial_dir: &OwnedFd, file: &RemoteFile, name: &str) -> Option<Record> {
    disk::read_small_at(partial_dir, &record_name(name), RECORD_BYTES_MAX)
        .and_then(|bytes| serde_json::from_slice::<Record>(&bytes).ok())
        .filter(|record| record_fits(record, file))
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

/// `multipart_concurrency` workers taking the chunks in order, with checkpoints while they run. The first
/// failure (or a 200 to a ranged request) stops the others and is the answer.
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
    let next_chunk = Arc::new(AtomicUsize::new(0));
    for _ in 0..ctx.opts.multipart_concurrency.clamp(1, PARTS_MAX).min(parts.spans.len()) {
        let args = (ctx.clone(), file.clone(), parts.clone(), slot.clone(), parts_stop.clone());
        tasks.spawn(run_worker(args, next_chunk.clone()));
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

/// Takes the next chunk until none is left; a chunk already done (a resume) costs no request.
async fn run_worker(mut args: PartArgs, next_chunk: Arc<AtomicUsize>) -> Result<RangeAnswer, DownloadError> {
    loop {
        let index = next_chunk.fetch_add(1, Ordering::Relaxed);
        if index >= args.2.spans.len() {
            return Ok(RangeAnswer::Done);
        }
        if run_part(&mut args, index).await? == RangeAnswer::RangeIgnored {
            return Ok(RangeAnswer::RangeIgnored);
        }
    }
}

/// One part from its offset to its end, from the Hub or a store, retried as `Retry` says.
async fn run_part((ctx, file, parts, slot, stop): &mut PartArgs, index: usize) -> Result<RangeAnswer, DownloadError> {
    let mut retry = Retry::new(ctx.opts.request_attempts_max);
    let (done, end) = (&parts.done[index], parts.spans[index].1);
    let (stall_ms, meter) = (ctx.opts.stall_timeout_ms, &slot.meter);
    loop {
        let before = done.load(Ordering::Relaxed);
        let fetch = async {
            match &ctx.source {
                Source::Hub(hub) => {
                    hf::fetch_range(hub, &ctx.repo_id, &ctx.commit, file, &parts.file, (done, end), stall_ms, meter)
                        .await
                        .map_err(DownloadError::Hub)
                }
                Source::Store(store) => {
                    crate::store::fetch_range(store, file, &parts.file, (done, end), stall_ms, meter)
                        .await
                        .map_err(DownloadError::Store)
                }
            }
        };
        let error = match until_cancelled(stop, fetch).await? {
            Ok(answer) => return Ok(answer),
            Err(error) => error,
        };
        let Some(wait) = retry.next_wait_download(&error, done.load(Ordering::Relaxed) > before) else {
            return Err(error);
        };
        pause(stop, wait).await?;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;
    use std::time::Instant;

    use sha2::{Digest, Sha256};

    use super::*;
    use crate::hf::FileHash;

    const CHUNK_BYTES: u64 = 256 << 10;
    const CHUNKS: u64 = 4;
    const WRITE_BYTES: usize = 64 << 10;

    fn content() -> Vec<u8> {
        (0..CHUNK_BYTES * CHUNKS).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn remote(content: &[u8]) -> RemoteFile {
        let sha = Sha256::digest(content).iter().map(|b| format!("{b:02x}")).collect();
        RemoteFile { path: "big.bin".into(), size_bytes: content.len() as u64, hash: FileHash::Sha256(sha), etag: None }
    }

    /// Parts over a preallocated file whose chunk `i` holds its bytes up to `done[i]` (a resumed record).
    fn parts_with(content: &[u8], done: &[u64]) -> Arc<Parts> {
        let file = tempfile::tempfile().unwrap();
        file.set_len(content.len() as u64).unwrap();
        let spans: Vec<(u64, u64)> = (0..CHUNKS).map(|i| (i * CHUNK_BYTES, (i + 1) * CHUNK_BYTES)).collect();
        for ((start, _), done) in spans.iter().zip(done) {
            file.write_all_at(&content[*start as usize..*done as usize], *start).unwrap();
        }
        let done = done.iter().map(|d| AtomicU64::new(*d)).collect();
        Arc::new(Parts { file, spans, done, abandoned: AtomicBool::new(false) })
    }

    /// Writes the rest of chunk `index` in pieces, advancing its offset after each as `fetch_range` does.
    fn finish_part(parts: &Parts, content: &[u8], index: usize) {
        let end = parts.spans[index].1;
        let mut at = parts.done[index].load(Ordering::Relaxed);
        while at < end {
            let next = (at + WRITE_BYTES as u64).min(end);
            parts.file.write_all_at(&content[at as usize..next as usize], at).unwrap();
            parts.done[index].store(next, Ordering::Release);
            at = next;
        }
    }

    fn starts() -> Vec<u64> {
        (0..CHUNKS).map(|i| i * CHUNK_BYTES).collect()
    }

    /// A partial directory holding `name` preallocated to `content`'s size with its first chunk
    /// written, and (when given) a record of `parts`.
    fn left_by_parts(content: &[u8], name: &str, parts: Option<&[[u64; 3]]>) -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let partial = std::fs::File::create(dir.path().join(name)).unwrap();
        partial.set_len(content.len() as u64).unwrap();
        partial.write_all_at(&content[..CHUNK_BYTES as usize], 0).unwrap();
        if let Some(parts) = parts {
            let record = Record { size: content.len() as u64, hash: String::new(), parts: parts.to_vec() };
            std::fs::write(dir.path().join(record_name(name)), serde_json::to_vec(&record).unwrap()).unwrap();
        }
        let fd = std::fs::File::open(dir.path()).unwrap();
        (dir, OwnedFd::from(fd))
    }

    // A review: one stream resumed a partial the parts had preallocated, took its length as
    // fetched, and a file checked by size only was accepted as the zeros of its holes.
    #[test]
    fn one_stream_keeps_only_the_prefix_the_parts_record_says_is_filled() {
        let content = content();
        let file = RemoteFile {
            path: "big.bin".into(),
            size_bytes: content.len() as u64,
            hash: FileHash::SizeOnly,
            etag: None,
        };
        let name = disk::partial_name(&file);
        let len = |dir: &tempfile::TempDir| std::fs::metadata(dir.path().join(&name)).unwrap().len();
        let c = CHUNK_BYTES;
        // The first chunk filled, the second part way, the others not begun.
        let parts = [[0, c, c], [c, c + 10, 2 * c], [2 * c, 2 * c, 3 * c], [3 * c, 3 * c, 4 * c]];
        let (dir, fd) = left_by_parts(&content, &name, Some(&parts));
        hand_to_one_stream(&fd, &file, &name).unwrap();
        assert_eq!(len(&dir), c + 10, "the record's filled prefix");
        assert!(!dir.path().join(record_name(&name)).exists(), "the record goes");
        // A record for another size proves nothing: nothing is kept.
        let other = RemoteFile { size_bytes: content.len() as u64 - 1, ..file.clone() };
        let (dir, fd) = left_by_parts(&content, &name, Some(&parts));
        hand_to_one_stream(&fd, &other, &name).unwrap();
        assert_eq!(len(&dir), 0);
        // A partial with no record is one stream's own: left as it is.
        let (dir, fd) = left_by_parts(&content, &name, None);
        hand_to_one_stream(&fd, &file, &name).unwrap();
        assert_eq!(len(&dir), content.len() as u64);
    }

    #[test]
    fn an_object_checked_by_size_only_resumes_no_partial_of_another_size_or_etag() {
        let file = |size_bytes| RemoteFile { path: "w.bin".into(), size_bytes, hash: FileHash::SizeOnly, etag: None };
        assert_ne!(disk::partial_name(&file(5)), disk::partial_name(&file(7)));
        let uploaded = |etag: &str| RemoteFile { etag: Some(etag.into()), ..file(5) };
        assert_ne!(
            disk::partial_name(&uploaded("\"a-2\"")),
            disk::partial_name(&uploaded("\"b-2\"")),
            "uploaded again"
        );
        assert_eq!(disk::partial_name(&uploaded("\"a-2\"")), disk::partial_name(&uploaded("\"a-2\"")));
        let hashed = |size_bytes| RemoteFile { hash: FileHash::Md5("ab".repeat(16)), ..file(size_bytes) };
        assert_eq!(disk::partial_name(&hashed(5)), disk::partial_name(&hashed(7)), "a hash names the content");
    }

    #[tokio::test]
    async fn parts_landing_out_of_order_are_hashed_in_order_once_the_prefix_is_whole() {
        let (content, (_tx, stop)) = (content(), watch::channel(false));
        let (parts, file) = (parts_with(&content, &starts()), remote(&content));
        let hashing = follow_prefix(&parts, &file, &stop);
        for index in [3, 1, 2] {
            finish_part(&parts, &content, index);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!hashing.is_finished(), "chunk 0 is missing: the hash cannot be done");
        finish_part(&parts, &content, 0);
        let hasher = hashing.await.unwrap().unwrap();
        assert_eq!(hasher.finish_hex(), file.hash.expected_hex());
    }

    #[tokio::test]
    async fn a_resumed_record_with_parts_partly_done_hashes_what_is_there_and_the_rest() {
        let (content, (_tx, stop)) = (content(), watch::channel(false));
        let done = [CHUNK_BYTES, CHUNK_BYTES + CHUNK_BYTES / 3, 2 * CHUNK_BYTES, 4 * CHUNK_BYTES];
        let (parts, file) = (parts_with(&content, &done), remote(&content));
        assert_eq!(parts.contiguous_prefix(), CHUNK_BYTES + CHUNK_BYTES / 3);
        let hashing = follow_prefix(&parts, &file, &stop);
        for index in [2, 1] {
            finish_part(&parts, &content, index);
        }
        let hasher = hashing.await.unwrap().unwrap();
        assert_eq!(hasher.finish_hex(), file.hash.expected_hex());
    }

    #[tokio::test]
    async fn a_wrong_byte_in_a_late_part_gives_another_hash() {
        let (content, (_tx, stop)) = (content(), watch::channel(false));
        let mut served = content.clone();
        served[(2 * CHUNK_BYTES + 7) as usize] ^= 1;
        let (parts, file) = (parts_with(&served, &starts()), remote(&content));
        let hashing = follow_prefix(&parts, &file, &stop);
        for index in [2, 0, 3, 1] {
            finish_part(&parts, &served, index);
        }
        let hasher = hashing.await.unwrap().unwrap();
        assert_ne!(hasher.finish_hex(), file.hash.expected_hex());
    }

    #[tokio::test]
    async fn a_cancel_or_abandoned_parts_end_the_hasher_promptly() {
        let content = content();
        for cancel in [true, false] {
            let (tx, stop) = watch::channel(false);
            let (parts, file) = (parts_with(&content, &starts()), remote(&content));
            let hashing = follow_prefix(&parts, &file, &stop);
            finish_part(&parts, &content, 0);
            let asked = Instant::now();
            if cancel {
                tx.send(true).unwrap();
            } else {
                drop(Abandon(parts.clone()));
            }
            let error = hashing.await.unwrap().err().expect("no hash of an unfinished file");
            assert_eq!(error.kind(), std::io::ErrorKind::Interrupted);
            assert!(asked.elapsed() < Duration::from_secs(1), "took {:?}", asked.elapsed());
        }
    }

    #[test]
    fn chunks_are_16_mib_at_least_one_per_worker_and_at_most_parts_max() {
        assert_eq!(chunk_bytes(480 << 20, 4), 16 << 20);
        assert_eq!(chunk_bytes(5 << 20, 4), (5 << 20) / 4, "a small file still gets one chunk per worker");
        let ten_gib = 10u64 << 30;
        assert_eq!(ten_gib.div_ceil(chunk_bytes(ten_gib, 4)), PARTS_MAX as u64);
        assert_eq!(chunk_bytes(3, 4), 1);
    }
}
