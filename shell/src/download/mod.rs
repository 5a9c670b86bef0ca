//! The repository-level download engine for `hf://`: one commit's files into a model's directory beneath
//! the models root (design/downloads.md is the authority).
//!
//! 1. The revision is resolved to a commit once and that commit's tree listed: every file comes from it.
//! 2. The destination is opened through the root's fd. Another uid's marker: nothing is written. No
//!    marker: the directory is adopted (files whose size and hash match are kept, others replaced, files
//!    not in the tree never deleted). This uid's marker is written before the first byte.
//! 3. Free space must cover the bytes still to fetch plus 1 %.
//! 4. Files go into `.model-agent-partial/` (kept across attempts and restarts), are checked for size and
//!    hash, renamed into place and synced; the partial directory goes and the manifest is written last.
//!
//! **Stored manifest rule.** A directory with this uid's marker and a manifest whose commit is the one the
//! revision resolves to, with every file's size on disk as listed, is complete: no byte is fetched and no
//! file re-hashed. When the Hub cannot answer (network error, stall, 5xx or 429 after the retries), the
//! stored manifest stands in for it if the revision is that manifest's commit (a 40-hex sha) or a branch or
//! tag (which cannot be resolved now), and sizes on disk match: a Ready model does not go Failed because
//! the Hub is down. Any other Hub error (not found, gated, unauthorised) is reported.

mod cli;
mod disk;
mod multipart;
mod plan;
mod progress;
mod retry;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_lies;
#[cfg(test)]
mod tests_network;
mod transfer;

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

pub use cli::run_download_command;

use crate::hf::{self, HfError};
use progress::{Reporter, Tally};

/// The Hub endpoint: `HF_ENDPOINT`, else OME's `ENDPOINT`, else the Hub itself.
pub fn endpoint(env: &dyn Fn(&str) -> Option<String>) -> String {
    env("HF_ENDPOINT").or_else(|| env("ENDPOINT")).unwrap_or_else(|| "https://huggingface.co".into())
}

/// How a download runs (the agent's flags; OME's defaults).
#[derive(Clone, Debug)]
pub struct Options {
    /// The Hub endpoint (`HF_ENDPOINT`).
    pub endpoint: String,
    /// Files at once per model (`--concurrency`).
    pub files_concurrency: usize,
    /// Files at least this large are fetched in ranged parts.
    pub multipart_threshold_bytes: u64,
    /// Ranged parts at once per big file (`--multipart-concurrency`).
    pub multipart_concurrency: usize,
    pub connect_timeout_ms: u64,
    /// No byte for this long aborts that request, which resumes from its last byte.
    pub stall_timeout_ms: u64,
    /// `progress` is called at most this often, and once at the end.
    pub progress_period_ms: u64,
    /// Tries per request for 408, 429, 5xx, network errors, stalls and cuts (progress resets the count).
    pub request_attempts_max: u32,
    /// Proxies and extra trusted CAs.
    pub network: hf::Network,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            endpoint: "https://huggingface.co".into(),
            files_concurrency: 4,
            multipart_threshold_bytes: 200 << 20,
            multipart_concurrency: 4,
            connect_timeout_ms: 10_000,
            stall_timeout_ms: 60_000,
            progress_period_ms: 30_000,
            request_attempts_max: 5,
            network: hf::Network::default(),
        }
    }
}

/// One model to download.
#[derive(Clone)]
pub struct Job {
    /// The models root: opened as a directory fd, everything beneath it relative to it.
    pub root: std::path::PathBuf,
    /// The model's directory beneath the root (checked by the core: relative, no `..`).
    pub dest_rel: String,
    /// The model's uid, written into the ownership marker.
    pub uid: String,
    /// `ClusterBaseModel/name` or `BaseModel/ns/name`, for the marker.
    pub key: String,
    /// An object store (`s3://`, `gs://`, `az://`) to list and fetch from instead of the Hub;
    /// `repo_id` then names it (`s3://bucket/prefix`) and `revision` is empty.
    pub store: Option<Arc<crate::store::Store>>,
    /// Other models' uids sharing the directory (same source, same path): a marker naming any
    /// of them is accepted, and the marker then names them all.
    pub co_owners: Vec<String>,
    /// An accepted marker keeps the uids it names besides these (the core does not know them
    /// yet: before its first snapshot).
    pub keep_marked: bool,
    /// Live models of another source using the directory: a marker naming one of them, over
    /// files not of this job's source, is left alone.
    pub other_source: Vec<String>,
    /// The model carries the reserve label: the marker records it for `uid` (and forgets it
    /// when it does not), so that a sweep after a delete no agent saw gives the weights up
    /// rather than trash them.
    pub reserve: bool,
    pub repo_id: String,
    /// Branch, tag or commit sha (`main` when the URI names none).
    pub revision: String,
    pub token: Option<String>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("root", &self.root)
            .field("dest_rel", &self.dest_rel)
            .field("uid", &self.uid)
            .field("repo_id", &self.repo_id)
            .field("revision", &self.revision)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// A progress report (OME's entry `progress`, less phase and time, which the core adds).
#[derive(Clone, Debug, PartialEq)]
pub struct Progress {
    pub total_bytes: u64,
    pub completed_bytes: u64,
    pub total_files: u64,
    pub completed_files: u64,
    /// Over the time since the previous report.
    pub bytes_per_sec: f64,
    /// Body bytes received by this call so far (the metrics' fetched bytes).
    pub fetched_bytes: u64,
}

/// A complete download.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub commit: String,
    pub files: u64,
    pub bytes_total: u64,
    /// Body bytes received in this call (0 when everything was already in place).
    pub bytes_fetched: u64,
    /// Files found in place (size and hash matching) instead of downloaded.
    pub adopted_files: u64,
    /// Transfers whose bytes did not match their hash (fetched again).
    pub integrity_failures: u64,
}

/// Why a download did not finish. Never holds a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownloadError {
    Hub(HfError),
    Store(crate::store::StoreError),
    NoSpace {
        needed_bytes: u64,
        free_bytes: u64,
        root: String,
    },
    /// The directory carries another model's ownership marker: nothing was written.
    OwnedByOther {
        uid: String,
        path: String,
    },
    /// The directory's marker names a live model of another source, or, before the core has read
    /// every marker on the node, a uid it did not give, over files not of this model's source:
    /// nothing was written.
    HeldFromOtherSource {
        uid: String,
        path: String,
        source: String,
    },
    /// The models root's filesystem is read-only.
    ReadOnly,
    Disk(String),
    /// Refused before it began: a scheme this build cannot download, or a token that cannot be
    /// read (the model's Secret, or the model itself).
    NotStarted(String),
    Cancelled,
}

/// Gated, unauthorised and not-found repos wait this long: a person has to act first.
const RETRY_SLOWLY_MS: u64 = 300_000;

impl DownloadError {
    /// One line a user can act on.
    pub fn reason(&self) -> String {
        self.to_string()
    }

    /// The Hub could not answer (network, stall, 5xx, 429 after the retries), as opposed to an
    /// answer that says no.
    pub fn unreachable(&self) -> bool {
        if let DownloadError::Store(error) = self {
            return error.unreachable();
        }
        matches!(
            self,
            DownloadError::Hub(
                HfError::Network { .. }
                    | HfError::Stalled { .. }
                    | HfError::Server { .. }
                    | HfError::RateLimited { .. }
            )
        )
    }

    /// How long the core should wait before the next attempt, when the failure says.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            DownloadError::Hub(error) if error.retry_slowly() => Some(RETRY_SLOWLY_MS),
            DownloadError::Hub(error) => error.retry_after_ms(),
            DownloadError::Store(error) if error.retry_slowly() => Some(RETRY_SLOWLY_MS),
            DownloadError::Store(error) => error.retry_after_ms(),
            _ => None,
        }
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for DownloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownloadError::Hub(error) => write!(f, "{error}"),
            DownloadError::Store(error) => write!(f, "{error}"),
            DownloadError::NoSpace { needed_bytes, free_bytes, root } => {
                write!(f, "needs {} GiB, {} GiB free on {root}", gib(*needed_bytes), gib(*free_bytes))
            }
            DownloadError::OwnedByOther { uid, path } => {
                write!(f, "{path} belongs to another model (uid {uid} in its ownership marker): left alone")
            }
            DownloadError::HeldFromOtherSource { uid, path, source } => write!(
                f,
                "{path} holds files of {source}, and its ownership marker names uid {uid}, a model of another \
                 source or one not known here yet: left alone while that model may use them"
            ),
            DownloadError::ReadOnly => write!(f, "the models root is on a read-only filesystem"),
            DownloadError::Disk(reason) => write!(f, "disk: {reason}"),
            DownloadError::NotStarted(reason) => write!(f, "{reason}"),
            DownloadError::Cancelled => write!(f, "download cancelled"),
        }
    }
}

impl std::error::Error for DownloadError {}

impl From<crate::store::StoreError> for DownloadError {
    fn from(error: crate::store::StoreError) -> DownloadError {
        DownloadError::Store(error)
    }
}

impl From<HfError> for DownloadError {
    fn from(error: HfError) -> DownloadError {
        DownloadError::Hub(error)
    }
}

/// How a download ended.
#[derive(Debug)]
pub struct Ended {
    /// This uid's marker is in the destination: the directory is this uid's to trash.
    pub marked: bool,
    pub result: Result<Finished, DownloadError>,
}

/// Downloads `job`, calling `progress` at most every `progress_period_ms` and once at the end. `cancel`
/// turning true stops every request and file task within about a second; partial files are kept.
pub async fn download(
    job: Job,
    opts: &Options,
    progress: &mut (dyn FnMut(Progress) + Send),
    cancel: watch::Receiver<bool>,
) -> Ended {
    let tally = OnceLock::new();
    let mut marked = false;
    let mut reporter = Reporter::new();
    let period = Duration::from_millis(opts.progress_period_ms.max(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let result = {
        let work = plan::run(&job, opts, &tally, &mut marked, cancel);
        tokio::pin!(work);
        loop {
            tokio::select! {
                result = &mut work => break result,
                _ = ticker.tick() => progress(reporter.report(tally.get().map(Arc::as_ref))),
            }
        }
    };
    progress(reporter.report(tally.get().map(Arc::as_ref)));
    Ended { marked, result }
}

/// The commit `revision` of `repo_id` points at now, each request retried as a download's are.
pub async fn resolve(
    opts: &Options,
    token: Option<String>,
    repo_id: &str,
    revision: &str,
) -> Result<String, DownloadError> {
    let source =
        hf::HfSource::new(&opts.endpoint, token, opts.connect_timeout_ms, opts.stall_timeout_ms, &opts.network)?;
    // Nobody cancels a resolve: it is short, and its outcome is simply not used once unwanted.
    let (_never, cancel) = watch::channel(false);
    Ok(plan::resolve_retrying(&source, repo_id, revision, opts, cancel).await?)
}

/// The commit of the shared copy that the symlink `link` points at, if that copy is complete:
/// `_artifacts/<repo_id>/<commit>` with a manifest of that repo and commit whose sizes match.
pub fn complete_copy_of_link(root: &std::path::Path, link: &str, repo_id: &str) -> Option<String> {
    let copy = crate::links::linked_copy(root, link)?;
    let commit = copy.strip_prefix(&format!("{}/{repo_id}/", crate::links::ARTIFACTS))?;
    let dest = disk::open_dest(root, &copy, false).ok()??;
    let manifest = dest.read_manifest()?;
    let complete = manifest.commit == commit && manifest.repo_id == repo_id && dest.sizes_match(&manifest);
    complete.then(|| commit.to_string())
}

/// The tally the reports read, set once the plan is known.
type TallySlot = OnceLock<Arc<Tally>>;
