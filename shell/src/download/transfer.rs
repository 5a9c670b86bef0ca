//! The files still to fetch, `files_concurrency` at once, each on a task of its own; big ones in parts.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::disk::{self, Dest};
use super::multipart::{self, Multipart};
use super::progress::FileSlot;
use super::retry::{Retry, cancelled, pause, until_cancelled};
use super::{DownloadError, Job, Options};
use crate::hf::{self, HfError, HfSource, RemoteFile};
use crate::store::StoreError;

/// Where the files come from (one per download: its size does not matter).
#[allow(clippy::large_enum_variant, reason = "one value per download, never moved in a loop")]
pub(super) enum Source {
    Hub(HfSource),
    Store(Arc<crate::store::Store>),
}

/// What every transfer task of one download shares.
pub(super) struct Ctx {
    pub source: Source,
    pub repo_id: String,
    pub commit: String,
    pub opts: Options,
    pub dest: Dest,
    pub partial_dir: OwnedFd,
    /// Transfers whose bytes did not match their hash (each fetched again).
    pub integrity_failures: std::sync::atomic::AtomicU64,
}

impl Ctx {
    pub fn new(source: Source, job: &Job, commit: &str, opts: &Options, dest: Dest) -> Result<Ctx, DownloadError> {
        let partial_dir = dest.open_partial_dir()?;
        let (repo_id, commit, opts) = (job.repo_id.clone(), commit.to_owned(), opts.clone());
        Ok(Ctx { source, repo_id, commit, opts, dest, partial_dir, integrity_failures: Default::default() })
    }
}

/// Fetches and places every file. The first failure stops the others (their partial files are kept) and
/// is the one returned; `cancel` stops them all the same way.
pub(super) async fn fetch_all(
    ctx: Arc<Ctx>,
    todo: Vec<(RemoteFile, Arc<FileSlot>)>,
    mut cancel: watch::Receiver<bool>,
) -> Result<(), DownloadError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let mut queue = todo.into_iter();
    let mut first_error = None;
    loop {
        while first_error.is_none() && tasks.len() < ctx.opts.files_concurrency.max(1) {
            let Some((file, slot)) = queue.next() else { break };
            tasks.spawn(fetch_one(ctx.clone(), file, slot, stop_rx.clone()));
        }
        if tasks.is_empty() {
            break;
        }
        tokio::select! {
            Some(joined) = tasks.join_next() => {
                let result = joined.unwrap_or_else(|e| Err(DownloadError::Disk(format!("a transfer task failed: {e}"))));
                if let (Err(error), None) = (result, &first_error) {
                    first_error = Some(error);
                    let _ = stop_tx.send(true);
                }
            }
            () = cancelled(&mut cancel), if first_error.is_none() => {
                first_error = Some(DownloadError::Cancelled);
                let _ = stop_tx.send(true);
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One file: in ranged parts when it is big (a single stream if the server ignores ranges), then renamed
/// into place.
async fn fetch_one(
    ctx: Arc<Ctx>,
    file: RemoteFile,
    slot: Arc<FileSlot>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), DownloadError> {
    let name = disk::partial_name(&file);
    let opts = &ctx.opts;
    // A file smaller than its part count (an empty one, under a tiny threshold) goes in one stream.
    let in_parts = file.size_bytes >= opts.multipart_threshold_bytes
        && opts.multipart_concurrency > 1
        && file.size_bytes >= opts.multipart_concurrency as u64;
    let mut verified = false;
    let mut integrity_failures = 0;
    while in_parts && !verified {
        match multipart::fetch(&ctx, &file, &name, &slot, &mut stop).await {
            Ok(Multipart::Verified) => verified = true,
            Ok(Multipart::RangeIgnored) => break,
            Err(DownloadError::Hub(HfError::Integrity { .. }))
                if integrity_failures + 1 < opts.request_attempts_max =>
            {
                integrity_failures += 1;
                ctx.integrity_failures.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => return Err(error),
        }
    }
    if !verified {
        fetch_single(&ctx, &file, &name, &slot, &mut stop).await?;
    }
    if let Some(meta) = disk::partial_metadata(&ctx.partial_dir, &name) {
        disk::record_placed(&ctx.partial_dir, &file, &meta);
    }
    ctx.dest.place(&ctx.partial_dir, &name, &file.path)?;
    slot.placed.store(true, Ordering::Relaxed);
    Ok(())
}

/// One stream from the partial file's kept prefix to the end, from the Hub or a store, retried
/// as `Retry` says.
async fn fetch_single(
    ctx: &Ctx,
    file: &RemoteFile,
    name: &str,
    slot: &FileSlot,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), DownloadError> {
    let mut retry = Retry::new(ctx.opts.request_attempts_max);
    let (stall_ms, meter) = (ctx.opts.stall_timeout_ms, &slot.meter);
    multipart::hand_to_one_stream(&ctx.partial_dir, file, name)?;
    loop {
        let partial = disk::open_partial(&ctx.partial_dir, name)?;
        let before = meter.have_bytes.load(Ordering::Relaxed);
        let fetch = async {
            match &ctx.source {
                Source::Hub(hub) => hf::fetch_file(hub, &ctx.repo_id, &ctx.commit, file, partial, stall_ms, meter)
                    .await
                    .map_err(DownloadError::Hub),
                Source::Store(store) => {
                    crate::store::fetch_file(store, file, partial, stall_ms, meter).await.map_err(DownloadError::Store)
                }
            }
        };
        let error = match until_cancelled(stop, fetch).await? {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        if matches!(error, DownloadError::Store(StoreError::Integrity { .. })) {
            ctx.integrity_failures.fetch_add(1, Ordering::Relaxed);
        }
        // Bytes that did not verify are gone: that is no progress.
        let progressed = meter.have_bytes.load(Ordering::Relaxed) > before;
        let Some(wait) = retry.next_wait_download(&error, progressed) else { return Err(error) };
        pause(stop, wait).await?;
    }
}
