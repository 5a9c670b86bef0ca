//! One download from start to end: list the commit, decide what is already in place, check space and
//! ownership, fetch the rest, write the manifest.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::disk::{self, Dest, Manifest, ManifestFile};
use super::progress::{FileSlot, Tally};
use super::retry::{Retry, pause, until_cancelled};
use super::transfer::{self, Ctx, Source};
use super::{DownloadError, Finished, Job, Options, TallySlot};
use crate::fsops::Marker;
use crate::hf::{self, HfError, HfSource, RemoteFile, is_commit_sha};

/// Free space asked for beyond the bytes to fetch, in parts per hundred.
const SPACE_MARGIN_PERCENT: u64 = 1;

pub(super) async fn run(
    job: &Job,
    opts: &Options,
    tally: &TallySlot,
    marked: &mut bool,
    mut cancel: watch::Receiver<bool>,
) -> Result<Finished, DownloadError> {
    let source = match &job.store {
        Some(store) => Source::Store(store.clone()),
        None => {
            hf::check_repo_id(&job.repo_id)?;
            let (connect, stall) = (opts.connect_timeout_ms, opts.stall_timeout_ms);
            Source::Hub(HfSource::new(&opts.endpoint, job.token.clone(), connect, stall, &opts.network)?)
        }
    };
    let existing = disk::open_dest(&job.root, &job.dest_rel, false)?;
    let stored = match &existing {
        Some(dest) => owned_manifest(dest, job)?,
        None => None,
    };
    *marked = stored.is_some();
    let stored = stored.flatten();
    let listing = list(&source, job, opts, cancel.clone());
    let (commit, files) = match until_cancelled(&mut cancel, listing).await? {
        Ok(listing) => listing,
        Err(error) => {
            return from_stored(existing.as_ref(), stored.as_ref(), job, error)
                .inspect(|done| set_complete(tally, done));
        }
    };
    let same_commit = stored.as_ref().filter(|m| m.commit == commit && m.repo_id == job.repo_id);
    if let (Some(dest), Some(manifest)) = (&existing, same_commit)
        && manifest_is(manifest, &files)
        && etags_agree(manifest, &files)
        && dest.sizes_match(manifest)
    {
        let done = finished_in_place(manifest, 0);
        set_complete(tally, &done);
        return Ok(done);
    }
    let dest = match existing {
        Some(dest) => dest,
        None => disk::open_dest(&job.root, &job.dest_rel, true)?.expect("created"),
    };
    let tally = tally.get_or_init(|| Arc::new(Tally::new(&files))).clone();
    let prepared = prepare(&dest, &files, (same_commit, stored.as_ref()), job, opts, &tally, &mut cancel).await;
    let todo = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            if !*marked {
                dest.remove_if_created();
            }
            return Err(error);
        }
    };
    *marked = true;
    let ctx = Arc::new(Ctx::new(source, job, &commit, opts, dest)?);
    transfer::fetch_all(ctx.clone(), todo, cancel).await?;
    completed(&ctx, manifest_of(job, &commit, &files), &tally)
}

/// Every file is in place: the manifest is written, then the partial directory goes. The
/// manifest first: a kill between the two then leaves a manifest naming each file's version,
/// where it left neither it nor the records, and a same-size file of an older upload was
/// adopted by its size at the next download (a review). A partial directory left beside a
/// manifest holds only records, and goes at the next download's tidying.
fn completed(ctx: &Ctx, manifest: Manifest, tally: &Tally) -> Result<Finished, DownloadError> {
    ctx.dest.write_manifest(&manifest)?;
    if let Err(error) = ctx.dest.remove_partial_dir() {
        tracing::warn!(dest = %ctx.dest.rel, %error, "the partial directory of a complete download stays");
    }
    let adopted_files = tally.kept_files.load(std::sync::atomic::Ordering::Relaxed);
    let integrity_failures = ctx.integrity_failures.load(std::sync::atomic::Ordering::Relaxed);
    Ok(Finished {
        adopted_files,
        bytes_fetched: tally.fetched_bytes(),
        integrity_failures,
        ..finished_in_place(&manifest, 0)
    })
}

fn set_complete(tally: &TallySlot, done: &Finished) {
    tally.get_or_init(|| Arc::new(Tally::complete(done.files, done.bytes_total)));
}

/// The stored manifest of a directory this uid owns (`Some(None)`: owned, no manifest); `None` for a
/// directory without a marker; a marker that names neither this uid nor one of its co-owners is an
/// error. A marker naming some of the owners is rewritten to name exactly them (the models sharing
/// the directory now), or with `keep_marked` them and every uid it named.
fn owned_manifest(dest: &Dest, job: &Job) -> Result<Option<Option<Manifest>>, DownloadError> {
    let _lock = crate::fsops::marker_lock();
    let Some(marker) = dest.read_marker()? else { return Ok(None) };
    if !marker.names(&job.uid) && !job.co_owners.iter().any(|u| marker.names(u)) {
        return Err(DownloadError::OwnedByOther { uid: marker.uid, path: dest.rel.clone() });
    }
    let manifest = dest.read_manifest();
    if let Some(held) = held_from_other_source(&marker, manifest.as_ref(), job) {
        return Err(held);
    }
    let mut co_owners = job.co_owners.clone();
    if job.keep_marked {
        co_owners.extend(marker.uids().map(str::to_string));
    }
    // This uid's reserve label as the model carries it now; the others' as recorded.
    let reserved = |u: &str| if u == job.uid { job.reserve } else { marker.is_reserved(u) };
    let owners = Marker::new(&job.uid, &job.key, &co_owners).reserving(reserved);
    let mut named: Vec<&str> = marker.uids().collect();
    let mut wanted: Vec<&str> = owners.uids().collect();
    named.sort_unstable();
    wanted.sort_unstable();
    let mut recorded: Vec<&str> = marker.uids().filter(|u| marker.is_reserved(u)).collect();
    recorded.sort_unstable();
    if named != wanted {
        dest.write_marker(&owners)?;
    } else if recorded != owners.reserved
        && let Err(error) = dest.write_marker(&owners)
    {
        // Only the record of a reserve label changed: the files stay usable whatever it says
        // (a read-only root, say); the next download of the directory writes it again.
        tracing::warn!(path = %dest.rel, %error, "could not record the reserve label in the ownership marker");
    }
    Ok(Some(manifest))
}

/// Files not of this job's source that the marker says another model may be using are left
/// alone: the marker names a live model of another source (`other_source`: the core cannot
/// know whether its files are there until its own check ends in this run), or, before the core's
/// first snapshot (`keep_marked`), any uid the core did not give (a model it may not know to
/// use the directory; a directory with no manifest then counts as another source's too). A
/// missing manifest does not count otherwise: two models of different sources refused each
/// other's unfinished directory forever, where one of them finishing settles it.
fn held_from_other_source(marker: &Marker, manifest: Option<&Manifest>, job: &Job) -> Option<DownloadError> {
    if manifest.is_some_and(|m| is_of_job(m, job)) {
        return None;
    }
    let named = || marker.uids().find(|u| job.other_source.iter().any(|o| o == u)).filter(|_| manifest.is_some());
    let unknown = || marker.uids().find(|u| *u != job.uid && !job.co_owners.iter().any(|c| c == u));
    let uid = named().or_else(|| unknown().filter(|_| job.keep_marked))?;
    let source = match manifest {
        Some(m) => format!("{}@{}", m.repo_id, m.revision.as_deref().unwrap_or(&m.commit)),
        None => "an unfinished download".to_string(),
    };
    Some(DownloadError::HeldFromOtherSource { uid: uid.to_string(), path: job.dest_rel.clone(), source })
}

/// The manifest is of the job's source: its repository, and its revision where it says one (one
/// written before revisions were kept is taken by its repository, as then).
fn is_of_job(manifest: &Manifest, job: &Job) -> bool {
    manifest.repo_id == job.repo_id && manifest.revision.as_deref().is_none_or(|r| r == job.revision)
}

/// Resolve once, then the tree of that commit, each request retried as `Retry` says.
async fn list(
    source: &Source,
    job: &Job,
    opts: &Options,
    cancel: watch::Receiver<bool>,
) -> Result<(String, Vec<RemoteFile>), DownloadError> {
    match source {
        Source::Hub(hub) => Ok(list_hub(hub, job, opts, cancel).await?),
        Source::Store(store) => list_store(store, opts, cancel).await,
    }
}

/// Every object under the prefix, retried as `Retry` says; the listing's digest stands for the
/// commit (the same objects, sizes and hashes give the same digest, so a complete directory is
/// recognised by its manifest on restart).
async fn list_store(
    store: &crate::store::Store,
    opts: &Options,
    mut cancel: watch::Receiver<bool>,
) -> Result<(String, Vec<RemoteFile>), DownloadError> {
    let mut retry = Retry::new(opts.request_attempts_max);
    loop {
        match crate::store::list(store).await {
            Ok(files) => return Ok((listing_digest(&files), files)),
            Err(error) => {
                let error = DownloadError::Store(error);
                let wait = retry.next_wait_download(&error, false).ok_or_else(|| error.clone())?;
                let _ = pause(&mut cancel, wait).await;
            }
        }
    }
}

/// 40 hex digits of sha256 over every path, size and hash of a listing.
fn listing_digest(files: &[RemoteFile]) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    for f in files {
        hasher.update(format!("{}\0{}\0{}\n", f.path, f.size_bytes, f.hash.describe()).as_bytes());
    }
    hasher.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect()
}

async fn list_hub(
    source: &HfSource,
    job: &Job,
    opts: &Options,
    mut cancel: watch::Receiver<bool>,
) -> Result<(String, Vec<RemoteFile>), HfError> {
    let commit = resolve_retrying(source, &job.repo_id, &job.revision, opts, cancel.clone()).await?;
    let mut retry = Retry::new(opts.request_attempts_max);
    loop {
        match source.tree(&job.repo_id, &commit).await {
            Ok(files) => return Ok((commit, files)),
            Err(error) => wait_or_give_up(&mut retry, error, &mut cancel).await?,
        }
    }
}

pub(super) async fn resolve_retrying(
    source: &HfSource,
    repo_id: &str,
    revision: &str,
    opts: &Options,
    mut cancel: watch::Receiver<bool>,
) -> Result<String, HfError> {
    let mut retry = Retry::new(opts.request_attempts_max);
    loop {
        match source.resolve(repo_id, revision).await {
            Ok(commit) => return Ok(commit),
            Err(error) => wait_or_give_up(&mut retry, error, &mut cancel).await?,
        }
    }
}

async fn wait_or_give_up(retry: &mut Retry, error: HfError, cancel: &mut watch::Receiver<bool>) -> Result<(), HfError> {
    let wait = retry.next_wait(&error, false).ok_or_else(|| error.clone())?;
    // A cancel during the wait is seen by the caller's own `until_cancelled`.
    let _ = pause(cancel, wait).await;
    Ok(())
}

/// The Hub could not list the commit: the stored manifest stands in when the rule of the module's doc
/// allows it; otherwise the Hub's error.
fn from_stored(
    dest: Option<&Dest>,
    stored: Option<&Manifest>,
    job: &Job,
    error: DownloadError,
) -> Result<Finished, DownloadError> {
    if let (true, Some(dest), Some(manifest)) = (error.unreachable(), dest, stored) {
        let revision_fits = !is_commit_sha(&job.revision) || job.revision == manifest.commit;
        if revision_fits && manifest.repo_id == job.repo_id && dest.sizes_match(manifest) {
            return Ok(finished_in_place(manifest, 0));
        }
    }
    Err(error)
}

fn finished_in_place(manifest: &Manifest, adopted_files: u64) -> Finished {
    Finished {
        commit: manifest.commit.clone(),
        files: manifest.files.len() as u64,
        bytes_total: manifest.files.iter().map(|f| f.size).sum(),
        bytes_fetched: 0,
        adopted_files,
        integrity_failures: 0,
    }
}

fn manifest_of(job: &Job, commit: &str, files: &[RemoteFile]) -> Manifest {
    let file_of = |f: &RemoteFile| {
        let etag = f.size_only_etag().map(str::to_owned);
        ManifestFile { path: f.path.clone(), size: f.size_bytes, etag }
    };
    let files = files.iter().map(file_of).collect();
    Manifest { repo_id: job.repo_id.clone(), revision: Some(job.revision.clone()), commit: commit.to_owned(), files }
}

/// No size-only file the manifest names an ETag for is listed with another (uploaded again at
/// the same size: the listing digest has no ETag).
fn etags_agree(manifest: &Manifest, files: &[RemoteFile]) -> bool {
    let named: HashMap<&str, &str> =
        manifest.files.iter().filter_map(|f| Some((f.path.as_str(), f.etag.as_deref()?))).collect();
    files.iter().all(|f| match (named.get(f.path.as_str()), f.size_only_etag()) {
        (Some(named), Some(listed)) => *named == listed,
        _ => true,
    })
}

/// The manifest lists exactly the tree's files and sizes.
fn manifest_is(manifest: &Manifest, files: &[RemoteFile]) -> bool {
    let mut listed: Vec<(&str, u64)> = manifest.files.iter().map(|f| (f.path.as_str(), f.size)).collect();
    let mut tree: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size_bytes)).collect();
    listed.sort_unstable();
    tree.sort_unstable();
    listed == tree
}

/// What is in place already, what is left to fetch (biggest first, so the long transfers start early),
/// the space for it, and this uid's marker, written before the first byte.
async fn prepare(
    dest: &Dest,
    files: &[RemoteFile],
    (trusted, stored): (Option<&Manifest>, Option<&Manifest>),
    job: &Job,
    opts: &Options,
    tally: &Tally,
    cancel: &mut watch::Receiver<bool>,
) -> Result<Vec<(RemoteFile, Arc<FileSlot>)>, DownloadError> {
    let checks = files_in_place(dest, files, trusted, stored, opts, tally, cancel.clone());
    let in_place = until_cancelled(cancel, checks).await??;
    let placed: Vec<&RemoteFile> = files.iter().zip(&in_place).filter(|(_, kept)| **kept).map(|(f, _)| f).collect();
    let mut todo: Vec<RemoteFile> =
        files.iter().zip(in_place).filter(|(_, kept)| !kept).map(|(file, _)| file.clone()).collect();
    dest.remove_stale_partials(&todo, &placed);
    check_space(dest, &todo)?;
    {
        let _lock = crate::fsops::marker_lock();
        if dest.read_marker()?.is_none() {
            let marker = Marker::new(&job.uid, &job.key, &job.co_owners).reserving(|u| u == job.uid && job.reserve);
            dest.write_marker(&marker)?;
        }
    }
    if !todo.is_empty() {
        // Recorded before the manifest that vouched for them goes (a review: a kill in between
        // left neither, and a same-size file of an older upload was then kept by its size).
        dest.record_kept(&placed)?;
        // An older commit's manifest must not vouch for a directory that is changing (mixed revisions).
        dest.remove_manifest()?;
    }
    todo.sort_by_key(|file| std::cmp::Reverse(file.size_bytes));
    let todo: Vec<_> = todo
        .into_iter()
        .map(|file| {
            let slot =
                FileSlot { size_bytes: file.size_bytes, meter: Default::default(), placed: AtomicBool::new(false) };
            (file, Arc::new(slot))
        })
        .collect();
    let _ = tally.slots.set(todo.iter().map(|(_, slot)| slot.clone()).collect());
    Ok(todo)
}

/// For each file, whether it is in place: listed with its size in this uid's manifest of the same commit
/// and of that size on disk (no hashing), or of the right size and hash (read once, `files_concurrency`
/// at once; adoption).
async fn files_in_place(
    dest: &Dest,
    files: &[RemoteFile],
    trusted: Option<&Manifest>,
    stored: Option<&Manifest>,
    opts: &Options,
    tally: &Tally,
    cancel: watch::Receiver<bool>,
) -> Result<Vec<bool>, DownloadError> {
    let stored_files: HashMap<&str, &ManifestFile> =
        stored.iter().flat_map(|m| m.files.iter()).map(|f| (f.path.as_str(), f)).collect();
    let trusted_files: HashMap<&str, &ManifestFile> =
        trusted.iter().flat_map(|m| m.files.iter()).map(|f| (f.path.as_str(), f)).collect();
    let mut in_place = vec![false; files.len()];
    let mut hashing = JoinSet::new();
    let partial_dir = dest.existing_partial_dir();
    for (index, file) in files.iter().enumerate() {
        let Some(on_disk) = dest.open_existing(&file.path) else { continue };
        let Some(meta) = on_disk.metadata().ok().filter(|m| m.len() == file.size_bytes) else { continue };
        let vouched = trusted_files.get(file.path.as_str()).filter(|m| m.size == file.size_bytes);
        // An object checked by size only: the directory's manifest, of any listing, names the
        // version on disk (none: written before ETags were kept, or a file it does not list:
        // left from an older listing). Another or none is fetched again, whatever the size says
        // (reviews: the old upload's file was kept, and recorded as the new).
        let listed = file.size_only_etag();
        if listed.is_some()
            && stored.is_some()
            && stored_files.get(file.path.as_str()).is_none_or(|m| m.etag.as_deref() != listed)
        {
            continue;
        }
        if vouched.is_some() {
            in_place[index] = true;
            tally.keep(file);
            continue;
        }
        if !disk::size_only_placed_as_listed(partial_dir.as_ref(), file, &meta) {
            continue;
        }
        while hashing.len() >= opts.files_concurrency.max(1) {
            take_hashed(&mut hashing, &mut in_place, files, tally).await?;
        }
        let (file, cancel) = (file.clone(), cancel.clone());
        hashing.spawn_blocking(move || (index, hf::file_matches(&on_disk, &file, &|| *cancel.borrow())));
    }
    while !hashing.is_empty() {
        take_hashed(&mut hashing, &mut in_place, files, tally).await?;
    }
    Ok(in_place)
}

type Hashed = (usize, std::io::Result<bool>);

async fn take_hashed(
    hashing: &mut JoinSet<Hashed>,
    in_place: &mut [bool],
    files: &[RemoteFile],
    tally: &Tally,
) -> Result<(), DownloadError> {
    let Some(joined) = hashing.join_next().await else { return Ok(()) };
    match joined.map_err(|e| DownloadError::Disk(format!("hashing a file to adopt: {e}")))? {
        (index, Ok(true)) => {
            in_place[index] = true;
            tally.keep(&files[index]);
        }
        (_, Ok(false)) => {}
        (_, Err(error)) if error.kind() == std::io::ErrorKind::Interrupted => return Err(DownloadError::Cancelled),
        (_, Err(error)) => return Err(DownloadError::Disk(format!("reading a file to adopt: {error}"))),
    }
    Ok(())
}

/// Free space ≥ the bytes still to fetch (less what partial files already hold) plus 1 %.
fn check_space(dest: &Dest, todo: &[RemoteFile]) -> Result<(), DownloadError> {
    if todo.is_empty() {
        return Ok(());
    }
    let partial_dir = dest.existing_partial_dir();
    let held = |file: &RemoteFile| match &partial_dir {
        Some(dir) => disk::partial_allocated_bytes(dir, &disk::partial_name(file)),
        None => 0,
    };
    let left: u64 = todo.iter().map(|file| file.size_bytes.saturating_sub(held(file))).sum();
    let needed_bytes = left + left * SPACE_MARGIN_PERCENT / 100;
    let free_bytes = dest.free_bytes()?;
    if needed_bytes > free_bytes {
        return Err(DownloadError::NoSpace { needed_bytes, free_bytes, root: dest.root.clone() });
    }
    Ok(())
}
