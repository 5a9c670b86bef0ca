//! The loop that owns the core: it takes inputs, hands each effect to an executor and publishes
//! readiness and metrics. It never waits on an executor: writes leave on the writer's queue and
//! every other effect on a task of its own, and executors report on a queue of their own that the
//! loop drains first. So no chain of full queues can lead back to the loop (issue #8: with one
//! bounded queue each way, the loop waited on the writer while the writer waited on the loop).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc;
use tracing::{info, warn};

use model_agent_core::ModelKey;
use model_agent_core::machine::{DownloadEnd, DownloadResult, Effect, EffectId, Input, Note, Op, Outcome, RootProbe};
use model_agent_core::wire::ModelConfig;
use model_agent_core::{Instant, State, trace};

use crate::downloads::{self, Downloads};
use crate::kubeio::{self, Write};
use crate::metrics::{CoreGauges, Metrics};
use crate::{fsgate, fsops, http, links, modelfiles};

/// Inputs from the watchers queued for the core at most; a watcher waits when it is full, which
/// holds back its stream from the API server. Nothing else waits on the loop.
pub const WATCH_QUEUE_MAX: usize = 10_000;
/// The loop wakes at least this often (heartbeat, status).
const LOOP_WAKE_MS_MAX: u64 = 1_000;
/// Readiness and metrics are published at most this often.
const STATUS_INTERVAL: Duration = Duration::from_millis(500);
/// In-flight work is given this long after SIGTERM; the process exits well within 30 s.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Concurrent live reads at most.
pub const LIVE_READS_CONCURRENT_MAX: usize = 8;

/// The loop's queues. Watchers → loop is bounded (backpressure on the watch streams). Loop →
/// writer and executors → loop have no capacity of their own: each holds at most one message
/// per effect in flight, and the core bounds those (one per incarnation, plus its reads; see
/// ARCHITECTURE.md, limits). A bound there could only be met by waiting, which is the cycle.
pub struct Queues {
    pub watch_tx: mpsc::Sender<Input>,
    pub watch_rx: mpsc::Receiver<Input>,
    pub outcomes_tx: mpsc::UnboundedSender<Input>,
    pub outcomes_rx: mpsc::UnboundedReceiver<Input>,
    pub writes_tx: mpsc::UnboundedSender<Write>,
    pub writes_rx: mpsc::UnboundedReceiver<Write>,
}

impl Queues {
    pub fn new(watch_queue_max: usize) -> Queues {
        let (watch_tx, watch_rx) = mpsc::channel(watch_queue_max);
        let (outcomes_tx, outcomes_rx) = mpsc::unbounded_channel();
        let (writes_tx, writes_rx) = mpsc::unbounded_channel();
        Queues { watch_tx, watch_rx, outcomes_tx, outcomes_rx, writes_tx, writes_rx }
    }
}

/// Everything effect executors need.
#[derive(Clone)]
pub struct Ctx {
    pub client: Client,
    pub node: String,
    pub namespace: String,
    pub root: PathBuf,
    /// Where every executor reports (never waits).
    pub outcomes: mpsc::UnboundedSender<Input>,
    pub writes: mpsc::UnboundedSender<Write>,
    pub metrics: Arc<Metrics>,
    pub inflight: Arc<AtomicUsize>,
    pub reads: Arc<tokio::sync::Semaphore>,
    pub fetches: Arc<tokio::sync::Semaphore>,
    pub spec_bytes_max: usize,
    pub fs: fsgate::FsGate,
    /// A root probe is in flight (it may be stuck in the kernel): at most one at a time.
    pub probing: Arc<AtomicBool>,
    /// A drift snapshot's scan is in flight (it may be stuck): at most one at a time.
    pub scanning: Arc<AtomicBool>,
    pub downloads: Downloads,
    /// Warning events on models that turn Failed here.
    pub events: crate::events::Events,
}

impl Ctx {
    /// Executors for this node and models root, reporting on `outcomes`, writing through `writes`.
    pub fn new(
        (client, node, namespace, root): (Client, String, String, PathBuf),
        outcomes: mpsc::UnboundedSender<Input>,
        writes: mpsc::UnboundedSender<Write>,
        (metrics, downloads): (Arc<Metrics>, Downloads),
        (fetch_workers, spec_bytes_max): (usize, usize),
    ) -> Ctx {
        Ctx {
            events: crate::events::Events::new(client.clone(), node.clone()),
            client,
            node,
            namespace,
            root,
            outcomes,
            writes,
            fs: fsgate::FsGate::counting(metrics.fs_calls_unreturned.clone()),
            metrics,
            inflight: Arc::new(AtomicUsize::new(0)),
            reads: Arc::new(tokio::sync::Semaphore::new(LIVE_READS_CONCURRENT_MAX)),
            fetches: Arc::new(tokio::sync::Semaphore::new(fetch_workers.max(1))),
            spec_bytes_max,
            probing: Default::default(),
            scanning: Default::default(),
            downloads,
        }
    }
}

/// The core and what the loop keeps around it.
pub struct Agent {
    pub state: State,
    pub ctx: Ctx,
    pub shared: Arc<http::Shared>,
    pub recorder: Option<std::io::BufWriter<std::fs::File>>,
    /// Aborted at shutdown: no new watch events once SIGTERM is in.
    pub watchers: Vec<tokio::task::AbortHandle>,
}

/// The loop's receiving ends.
pub struct Inbox {
    pub watch: mpsc::Receiver<Input>,
    pub outcomes: mpsc::UnboundedReceiver<Input>,
}

impl Agent {
    /// Run until shutdown (`stop` resolves) has finished its in-flight work, or its grace is out,
    /// or every input source has closed.
    pub async fn drive(&mut self, inbox: &mut Inbox, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut shutdown_at: Option<tokio::time::Instant> = None;
        let mut last_status = tokio::time::Instant::now() - STATUS_INTERVAL;
        let mut watch_open = true;
        loop {
            let wake = Duration::from_millis(self.wake_ms());
            let input = tokio::select! {
                biased;
                _ = &mut stop, if shutdown_at.is_none() => Input::Shutdown,
                Some(done) = inbox.outcomes.recv() => done,
                received = inbox.watch.recv(), if watch_open => match received {
                    Some(input) => input,
                    None => {
                        watch_open = false;
                        continue;
                    }
                },
                _ = tokio::time::sleep(wake) => Input::Tick,
            };
            if input == Input::Shutdown {
                info!("shutdown requested: no new destructive effect; finishing in-flight work");
                shutdown_at = Some(tokio::time::Instant::now());
                self.watchers.iter().for_each(tokio::task::AbortHandle::abort);
                // Downloads stop at once and keep their partial files: the next start resumes.
                self.ctx.downloads.cancel_all();
            }
            self.step(input);
            if last_status.elapsed() >= STATUS_INTERVAL {
                last_status = tokio::time::Instant::now();
                self.publish_status();
            }
            if shutdown_at.is_some_and(|at| self.shutdown_done(at)) {
                break;
            }
        }
        self.publish_status();
    }

    fn now(&self) -> Instant {
        Instant(self.shared.epoch.elapsed().as_millis() as u64)
    }

    fn wake_ms(&self) -> u64 {
        let now_ms = self.now().as_ms();
        self.state.next_deadline().map_or(LOOP_WAKE_MS_MAX, |d| d.as_ms().saturating_sub(now_ms).min(LOOP_WAKE_MS_MAX))
    }

    /// One input through the core; its effects leave at once, none is waited for.
    pub fn step(&mut self, input: Input) {
        let now = self.now();
        let output = self.state.handle(now, input.clone());
        if let Some(w) = &mut self.recorder
            && let Err(e) = writeln!(w, "{}", trace::step_line(now, &input, &output))
        {
            warn!(error = %e, "--record-trace: writing failed; recording stops");
            self.recorder = None;
        }
        for note in &output.notes {
            log_note(note);
            self.ctx.metrics.note(note);
            if let Note::ModelFailed { key, uid, reason } = note {
                self.ctx.events.failed(key, uid, reason);
            }
        }
        let mut effects = output.effects;
        for effect in effects.drain(..) {
            dispatch(&self.ctx, effect);
        }
        // Its room carries the next step's effects.
        self.state.recycle(effects);
        self.shared.beat();
    }

    fn shutdown_done(&self, at: tokio::time::Instant) -> bool {
        let inflight = self.ctx.inflight.load(Ordering::SeqCst);
        if inflight > 0 && at.elapsed() >= SHUTDOWN_GRACE {
            warn!(in_flight = inflight, "abandoning in-flight work at the shutdown deadline");
        }
        inflight == 0 || at.elapsed() >= SHUTDOWN_GRACE
    }

    fn publish_status(&mut self) {
        let now = self.now();
        let (state, shared, metrics) = (&self.state, &self.shared, &self.ctx.metrics);
        let readiness = state.readiness();
        let was_ready = shared.readiness.read().expect("readiness lock").ready;
        // Once ready, and then every minute (relists parse every object again).
        let minute = now.as_ms() / 60_000 != now.as_ms().saturating_sub(500) / 60_000;
        if readiness.ready && (!was_ready || minute) {
            release_freed_memory();
        }
        metrics.retain_models(|key| state.knows(key));
        let (pending, oldest) = state.pending_confirmations();
        *metrics.core.lock().expect("metrics lock") = CoreGauges {
            stats: state.stats().clone(),
            pending_confirmations: pending,
            oldest_pending_seconds: oldest.map_or(0.0, |o| now.ms_since(o) as f64 / 1000.0),
            models: state.model_count(),
            root_writable: state.root().map(|r| r.writable),
            ready: readiness.ready,
            shared_copies: state.shared_copies(),
        };
        *shared.readiness.write().expect("readiness lock") = readiness;
        if let Some(w) = &mut self.recorder {
            let _ = w.flush();
        }
    }
}

/// The first lists parse every model object in full and keep only a lean copy; glibc keeps the
/// freed pages. Give them back once the agent is ready and every minute after, so that its
/// resident size stays near what it holds (see README, memory).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the OS; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Start executing one effect; its outcome comes back to the core on the outcomes queue. Never
/// waits: a write is queued for the writer, everything else runs on a task of its own.
fn dispatch(ctx: &Ctx, Effect { id, op }: Effect) {
    match op {
        Op::Publish { label_key, label, cm_key, entry, .. } => {
            tracing::debug!(label_key, label = ?label, "publish queued for the writer");
            queue_write(ctx, Write::Publish { id, label_key, label, cm_key, entry: entry.to_json() })
        }
        Op::Unpublish { uid, label_key, remove_label, cm_key, .. } => {
            let uid = uid.as_str().to_string();
            queue_write(ctx, Write::Unpublish { id, label_key, remove_label, cm_key, uid })
        }
        Op::RemoveOrphanLabel { label_key } => queue_write(ctx, Write::OrphanLabel { id, label_key }),
        Op::RemoveOrphanEntry { cm_key, uid } => {
            queue_write(ctx, Write::OrphanEntry { id, cm_key, uid: uid.map(|u| u.as_str().to_string()) })
        }
        Op::LiveGet { key } => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            Some(Input::LiveRead { id, result: kubeio::live_get(&c.client, &key, c.spec_bytes_max).await })
        }),
        Op::LiveGetNode => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            Some(Input::NodeRead { id, result: kubeio::live_get_node(&c.client, &c.node).await })
        }),
        Op::LiveList { kind, timeout_ms } => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            let deadlines = kubeio::ListDeadlines::of(timeout_ms);
            Some(Input::LiveList { id, result: kubeio::live_list(&c.client, kind, c.spec_bytes_max, deadlines).await })
        }),
        Op::VerifyLocal { key, path, parse_metadata, .. } => {
            spawn(ctx, async move |c: Ctx| Some(verify_local(&c, id, &key, &path, parse_metadata).await))
        }
        Op::Download { key, uid, storage_uri, dest, parse_metadata, co_owners, keep_marked, other_source, reserve } => {
            let cancel = ctx.downloads.register(id);
            let owners = downloads::Owners { co_owners, keep_marked, other_source, reserve };
            let request = downloads::Request { id, key, uid, storage_uri, dest, parse_metadata, owners };
            spawn(ctx, async move |c: Ctx| downloads::execute(c, request, cancel).await)
        }
        Op::CancelDownload { download } => ctx.downloads.cancel(download),
        Op::Resolve { key, uid, storage_uri, link } => {
            spawn(ctx, async move |c: Ctx| Some(downloads::resolve(&c, id, &key, &uid, &storage_uri, &link).await))
        }
        Op::Link { link, copy, .. } => spawn(ctx, async move |c: Ctx| Some(make_link(&c, id, link, copy).await)),
        Op::Unlink { link, copy, .. } => spawn(ctx, async move |c: Ctx| Some(remove_link(&c, id, link, copy).await)),
        Op::FillSpec { key, uid, dir } => {
            spawn(ctx, async move |c: Ctx| Some(fill_spec(&c, id, &key, uid.as_str(), &dir).await))
        }
        op @ (Op::TrashDir { .. } | Op::DisownDir { .. } | Op::RecordReserve { .. } | Op::PurgeTrash { .. }) => {
            dispatch_on_root(ctx, id, op)
        }
        Op::ProbeRoot => spawn(ctx, async move |c: Ctx| Some(Input::RootProbed { id, probe: probe_root(&c).await })),
        Op::Snapshot => spawn(ctx, async move |c: Ctx| {
            Some(match snapshot(&c).await {
                Ok(snapshot) => Input::DriftObserved { id, snapshot },
                Err(reason) => Input::EffectDone { id, outcome: Outcome::Failed(reason) },
            })
        }),
    }
}

/// The effects that are one call on the models root through the filesystem gate.
fn dispatch_on_root(ctx: &Ctx, id: EffectId, op: Op) {
    match op {
        Op::TrashDir { uid, path, trash_name, .. } => {
            let what = format!("moving {path} to the trash");
            spawn_on_root(ctx, id, what, fsgate::TRASH_DEADLINE, move |root| {
                fsops::trash_dir(root, &path, &uid, &trash_name)
            })
        }
        Op::DisownDir { uid, path, keep, .. } => {
            let what = format!("giving {path} up");
            spawn_on_root(ctx, id, what, fsgate::TRASH_DEADLINE, move |root| {
                fsops::disown_dir(root, &path, &uid, &keep)
            })
        }
        Op::RecordReserve { uid, path, reserved, .. } => {
            let what = format!("recording the reserve label of {uid:?} in {path}'s marker");
            spawn_on_root(ctx, id, what, fsgate::TRASH_DEADLINE, move |root| {
                fsops::record_reserve(root, &path, &uid, reserved)
            })
        }
        Op::PurgeTrash { name } => {
            let what = format!("purging trash entry {name}");
            spawn_on_root(ctx, id, what, fsgate::PURGE_DEADLINE, move |root| fsops::purge_trash(root, &name))
        }
        other => unreachable!("not a call on the models root: {}", other.kind_name()),
    }
}

/// `Op::Link`: the model's path a relative symlink to its shared copy, only where nothing is.
async fn make_link(c: &Ctx, id: EffectId, link: String, copy: String) -> Input {
    let root = c.root.clone();
    let what = format!("linking {link} to {copy}");
    let result = c.fs.call(&what, fsgate::TRASH_DEADLINE, move || links::make_link(&root, &link, &copy)).await;
    let outcome = match result.and_then(|r| r) {
        Ok(links::Linked::Made | links::Linked::AlreadyThere) => Outcome::Done,
        Ok(links::Linked::Occupied(reason)) => Outcome::Occupied(reason),
        Err(e) => Outcome::Failed(e),
    };
    Input::EffectDone { id, outcome }
}

/// `Op::Unlink`: the symlink removed only while it still points at its copy.
async fn remove_link(c: &Ctx, id: EffectId, link: String, copy: String) -> Input {
    let root = c.root.clone();
    let what = format!("removing the link {link} to {copy}");
    let result = c.fs.call(&what, fsgate::TRASH_DEADLINE, move || links::remove_link(&root, &link, &copy)).await;
    Input::EffectDone { id, outcome: outcome(result.and_then(|r| r).map(|_| ())) }
}

/// The writer takes it in its next batch. Its queue closes only after the loop has stopped; if
/// the writer ever stopped early, the write fails and the core retries it with backoff.
fn queue_write(ctx: &Ctx, write: Write) {
    let id = write.id();
    if ctx.writes.send(write).is_err() {
        let outcome = Outcome::Failed("the writer has stopped".into());
        let _ = ctx.outcomes.send(Input::EffectDone { id, outcome });
    }
}

/// The API part and the disk part of a drift snapshot, or why either failed (logged with the
/// core's note of when it asks again).
async fn snapshot(c: &Ctx) -> Result<model_agent_core::machine::DriftSnapshot, String> {
    let mut snapshot = match kubeio::snapshot_api(&c.client, &c.node, &c.namespace).await {
        Ok(s) => s,
        Err(e) => return Err(format!("drift snapshot: {e}")),
    };
    let root = c.root.clone();
    let scan = move || fsops::scan(&root);
    let scanned = c.fs.call_alone(&c.scanning, "scanning the models root", fsgate::TRASH_DEADLINE, scan).await;
    let (owned, trash, unread) = match scanned {
        Ok(found) => found,
        Err(e) => return Err(format!("drift snapshot: {e}")),
    };
    if !unread.is_empty() {
        tracing::warn!(unread = ?unread, "the drift scan could not read these directories beneath the models root: what they hold is taken as unknown, not gone");
    }
    snapshot.owned_dirs = owned;
    snapshot.trash = trash;
    snapshot.unread = unread;
    Ok(snapshot)
}

/// Probe the models root, at most one probe at a time: while an earlier probe is stuck in the
/// kernel, the answer is at once that the root has not answered.
async fn probe_root(c: &Ctx) -> RootProbe {
    let root = c.root.clone();
    let work = move || fsops::probe_root(&root);
    match c.fs.call_alone(&c.probing, "probing the models root", fsgate::PROBE_DEADLINE, work).await {
        Ok(probe) => probe,
        Err(e) => {
            warn!(error = %e, "models root probe failed");
            let why =
                if e.ends_with(fsgate::ONE_BEFORE_UNRETURNED) { ": an earlier probe has not returned" } else { "" };
            RootProbe::unanswered(format!(
                "did not answer within {}{why}",
                fsgate::duration_text(fsgate::PROBE_DEADLINE)
            ))
        }
    }
}

/// `Op::VerifyLocal`: the check, then (when asked) what the directory's config files say.
async fn verify_local(c: &Ctx, id: EffectId, key: &ModelKey, path: &str, parse_metadata: bool) -> Input {
    let _permit = c.fetches.acquire().await;
    let (p, what) = (PathBuf::from(path), format!("verifying {path}"));
    let started = std::time::Instant::now();
    let result = c.fs.call(&what, fsgate::VERIFY_DEADLINE, move || fsops::verify_local(&p)).await.and_then(|r| r);
    tracing::debug!(path, elapsed_us = started.elapsed().as_micros() as u64, "verified a local path");
    c.metrics.model_outcome(key, result.is_ok());
    let outcome = match result {
        Ok(()) if parse_metadata => {
            let metadata = model_metadata(c, key, path).await;
            tracing::debug!(path, elapsed_us = started.elapsed().as_micros() as u64, "read a local path's metadata");
            let result = DownloadResult::Done { commit: String::new(), metadata, bytes: 0 };
            Outcome::Downloaded(DownloadEnd { marked: false, result })
        }
        result => outcome(result),
    };
    Input::EffectDone { id, outcome }
}

/// `Op::FillSpec`: the directory's metadata again, then the live model's empty fields filled.
async fn fill_spec(c: &Ctx, id: EffectId, key: &ModelKey, uid: &str, dir: &str) -> Input {
    // Parses take a fetch permit, as checks and downloads do: many fills after a restart must
    // not fill the filesystem gate and starve the root probe.
    let permit = c.fetches.acquire().await;
    let parsed = read_metadata(c, dir, modelfiles::parse).await;
    drop(permit);
    let result = match parsed {
        Err(reason) => Ok(format!("nothing to fill: {reason}")),
        Ok(metadata) => {
            let _permit = c.reads.acquire().await;
            kubeio::fill_spec(&c.client, key, uid, &metadata).await
        }
    };
    match &result {
        Ok(what) => model_log!(info, key, uid, "spec write-back: {what}"),
        Err(reason) => model_log!(warn, key, uid, reason = %reason, "spec write-back failed"),
    }
    Input::EffectDone { id, outcome: outcome(result.map(|_| ())) }
}

/// What the config files in `dir` say, for the model's Ready entry; none (logged) when they say
/// nothing usable, which never fails the model.
pub async fn model_metadata(c: &Ctx, key: &ModelKey, dir: &str) -> Option<Box<ModelConfig>> {
    match read_metadata(c, dir, modelfiles::model_config).await {
        Ok(config) => Some(Box::new(config)),
        Err(reason) => {
            model_log!(info, key, "", dir, reason = %reason, "Ready without metadata in its entry");
            None
        }
    }
}

/// `read` (the models root, the directory) on the filesystem gate, within the parse deadline.
async fn read_metadata<T: Send + 'static>(
    c: &Ctx,
    dir: &str,
    read: fn(&Path, &Path) -> Result<T, String>,
) -> Result<T, String> {
    let (what, path, root) = (format!("reading the metadata of {dir}"), PathBuf::from(dir), c.root.clone());
    c.fs.call(&what, fsgate::PARSE_DEADLINE, move || read(&root, &path)).await.and_then(|r| r)
}

fn outcome(result: Result<(), String>) -> Outcome {
    match result {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Failed(e),
    }
}

/// Run one effect's work in a task, counted as in flight until its input is queued.
/// One blocking call on the models root (`what` names it in errors), through the filesystem
/// gate with its deadline; its result is the effect's outcome.
fn spawn_on_root(
    ctx: &Ctx,
    id: EffectId,
    what: String,
    deadline: std::time::Duration,
    work: impl FnOnce(&std::path::Path) -> Result<(), String> + Send + 'static,
) {
    spawn(ctx, async move |c: Ctx| {
        let root = c.root.clone();
        let result = c.fs.call(&what, deadline, move || work(&root)).await.and_then(|r| r);
        Some(Input::EffectDone { id, outcome: outcome(result) })
    })
}

fn spawn<F>(ctx: &Ctx, work: impl FnOnce(Ctx) -> F + Send + 'static)
where
    F: std::future::Future<Output = Option<Input>> + Send + 'static,
{
    let c = ctx.clone();
    c.inflight.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let (outcomes, inflight) = (c.outcomes.clone(), c.inflight.clone());
        c.metrics.inc(&c.metrics.effects_executed);
        if let Some(input) = work(c).await {
            let _ = outcomes.send(input);
        }
        inflight.fetch_sub(1, Ordering::SeqCst);
    });
}

fn log_note(note: &Note) {
    match note {
        Note::PhantomSuppressed { key, uid, cause } => {
            model_log!(warn, key, uid, cause = ?cause, "phantom delete suppressed: a live read shows the model alive")
        }
        Note::DeleteConfirmed { key, uid, confirmation } => {
            model_log!(info, key, uid, confirmation = ?confirmation, "deletion confirmed; cleaning up this node")
        }
        Note::ModelFailed { key, uid, reason } => {
            model_log!(warn, key, uid, reason = %reason, "model failed on this node")
        }
        Note::ReadFailed { key, kind, reason, retry_in_ms } => match key {
            Some(key) => {
                model_log!(warn, key, "", reason = %reason, retry_in_ms, "live read failed; the candidate stays pending")
            }
            None => warn!(kind = %kind, reason = %reason, retry_in_ms, "live list failed; the candidates stay pending"),
        },
        Note::EffectFailed { id, reason, retry_in_ms } => {
            warn!(effect = ?id, reason = %reason, retry_in_ms, "effect failed; retrying")
        }
        Note::BreakerTripped { candidates, placed, until } => {
            warn!(
                candidates,
                placed,
                hold_until_ms = until.as_ms(),
                "blast-radius breaker tripped: destructive decisions held"
            )
        }
        Note::BreakerHeld { key, uid, until } => {
            model_log!(
                info,
                key,
                uid,
                hold_until_ms = until.as_ms(),
                "withdrawal or cleanup held by the breaker; read again after the hold"
            )
        }
        Note::NodeReadFailed { reason, retry_in_ms } => {
            warn!(reason = %reason, retry_in_ms, "live read of this Node failed; placement exits wait")
        }
        Note::ExitCancelled { key, uid } => {
            model_log!(info, key, uid, "placement exit cancelled: the live Node still places the model here")
        }
        Note::NodeLabelsVanished { vanished, had, until } => {
            warn!(
                vanished,
                had,
                hold_until_ms = until.as_ms(),
                "most of this Node's labels vanished at once: destructive decisions held"
            )
        }
        Note::KeyCollision { key, uid, owner } => {
            let reason = model_agent_core::machine::collision_reason(key, owner);
            model_log!(warn, key, uid, owner = %owner, reason = %reason, "model failed on this node: its label key collides")
        }
        Note::LinkRefused { key, uid, reason } => {
            model_log!(warn, key, uid, reason = %reason, "something else is at the model's path: it downloads its own copy there instead of linking to the shared one")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_agent_core::machine::{Config, WatchEvent};
    use model_agent_core::model::ModelSpec;
    use model_agent_core::placement::NodeView;
    use model_agent_core::{Kind, ModelKey, ModelObject, Uid};
    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicU64;

    const MODELS: usize = 20_000;
    /// How long a stage of the test waits for the agent before it goes on anyway (a stalled agent
    /// then shows as a timeout of the whole test, not as a hang).
    const STAGE_WAIT: Duration = Duration::from_secs(60);

    fn model(root: &str, i: usize, resource_version: &str) -> ModelObject {
        let name = format!("m-{i}");
        ModelObject {
            key: ModelKey::cluster(&name),
            uid: Uid::new(&format!("uid-{i}")),
            resource_version: Arc::from(resource_version),
            created: Arc::from(""),
            deleting: false,
            spec: Ok(Arc::new(ModelSpec::simple(&format!("local://{root}/{name}"), None))),
        }
    }

    async fn wait_until(what: impl Fn() -> bool) {
        let started = tokio::time::Instant::now();
        while !what() && started.elapsed() < STAGE_WAIT {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The watchers: both kinds listed with 20,000 placed `local://` models, then (once most of
    /// their writes are queued and the writer is stalled) 20,000 more watch events, twice the
    /// watch queue: with the loop waiting on the writer this backlog would never drain.
    async fn feed(tx: mpsc::Sender<Input>, root: String, writes_queued: Arc<AtomicU64>, fed: Arc<AtomicBool>) {
        let send = async |input: Input| tx.send(input).await.expect("the loop is gone");
        send(Input::NodeObserved(NodeView { name: "node-1".into(), labels: Default::default() })).await;
        send(Input::Watch { kind: Kind::BaseModel, event: WatchEvent::RelistStarted }).await;
        send(Input::Watch { kind: Kind::BaseModel, event: WatchEvent::RelistDone }).await;
        let kind = Kind::ClusterBaseModel;
        send(Input::Watch { kind, event: WatchEvent::RelistStarted }).await;
        for i in 0..MODELS {
            send(Input::Watch { kind, event: WatchEvent::RelistItem(model(&root, i, "1").into()) }).await;
        }
        send(Input::Watch { kind, event: WatchEvent::RelistDone }).await;
        wait_until(|| writes_queued.load(Ordering::SeqCst) as usize > WATCH_QUEUE_MAX).await;
        for i in 0..MODELS {
            send(Input::Watch { kind, event: WatchEvent::Applied(model(&root, i, "2").into()) }).await;
        }
        fed.store(true, Ordering::SeqCst);
    }

    /// Counts the writes the loop queues on their way to the writer.
    async fn count_writes(
        mut from: mpsc::UnboundedReceiver<Write>,
        to: mpsc::UnboundedSender<Write>,
        queued: Arc<AtomicU64>,
    ) {
        while let Some(w) = from.recv().await {
            queued.fetch_add(1, Ordering::SeqCst);
            let _ = to.send(w);
        }
    }

    fn models_root() -> PathBuf {
        let root = std::env::temp_dir().join(format!("model-agent-loop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for i in 0..MODELS {
            std::fs::create_dir_all(root.join(format!("m-{i}"))).unwrap();
        }
        root
    }

    #[tokio::test(flavor = "current_thread")]
    async fn twenty_thousand_placed_models_and_a_watch_backlog_never_stall_the_loop_or_the_writer() {
        let root = models_root();
        let root_text = root.to_str().unwrap().to_string();
        let q = Queues::new(WATCH_QUEUE_MAX);
        let (to_writer, writer_rx) = mpsc::unbounded_channel();
        let (writes_queued, fed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        tokio::spawn(count_writes(q.writes_rx, to_writer, writes_queued.clone()));
        // The API seam: the writer's first batch waits until the watch backlog is all sent, as a
        // slow API server would; then every batch lands. Labels written are recorded.
        let labelled = Arc::new(Mutex::new(HashSet::new()));
        let (labelled_in, fed_in, batches) = (labelled.clone(), fed.clone(), Arc::new(AtomicU64::new(0)));
        let apply = move |batch: Vec<Write>| {
            let (labelled, fed, batches) = (labelled_in.clone(), fed_in.clone(), batches.clone());
            async move {
                if batches.fetch_add(1, Ordering::SeqCst) == 0 {
                    wait_until(|| fed.load(Ordering::SeqCst)).await;
                }
                for w in batch {
                    if let Write::Publish { label_key, label: Some(_), .. } = w {
                        labelled.lock().unwrap().insert(label_key);
                    }
                }
                Ok(())
            }
        };
        let metrics = Arc::new(Metrics::default());
        tokio::spawn(kubeio::writer(writer_rx, q.outcomes_tx.clone(), metrics.clone(), apply));
        tokio::spawn(feed(q.watch_tx.clone(), root_text.clone(), writes_queued.clone(), fed.clone()));

        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let place = (client, "node-1".to_string(), "ome".to_string(), root.clone());
        let types = crate::shapes::InstanceTypes::from_env(None).unwrap();
        let downloads = Downloads::new(tokio::runtime::Handle::current(), crate::download::Options::default(), types);
        let ctx = Ctx::new(place, q.outcomes_tx, q.writes_tx, (metrics.clone(), downloads), (5, 64 * 1024));
        let state = State::new(Config::new("node-1", &root_text));
        let shared = Arc::new(http::Shared {
            readiness: std::sync::RwLock::new(state.readiness()),
            heartbeat_ms: Default::default(),
            epoch: std::time::Instant::now(),
            stall_ms_max: 30_000,
            metrics,
        });
        let mut agent = Agent { state, ctx, shared, recorder: None, watchers: Vec::new() };
        let mut inbox = Inbox { watch: q.watch_rx, outcomes: q.outcomes_rx };
        let all_labelled = labelled.clone();
        let stop = async move { wait_until(|| all_labelled.lock().unwrap().len() == MODELS).await };
        let driven = tokio::time::timeout(Duration::from_secs(300), agent.drive(&mut inbox, stop)).await;

        assert!(driven.is_ok(), "the loop stalled: {} writes queued", writes_queued.load(Ordering::SeqCst));
        assert!(fed.load(Ordering::SeqCst), "the watch backlog never drained while the writer was stalled");
        assert!(
            writes_queued.load(Ordering::SeqCst) as usize > WATCH_QUEUE_MAX,
            "more writes queued than the watch queue holds"
        );
        assert_eq!(labelled.lock().unwrap().len(), MODELS, "every placed model is labelled");
        assert!(agent.state.readiness().ready, "{:?}", agent.state.readiness());
        assert_eq!(agent.ctx.inflight.load(Ordering::SeqCst), 0, "shutdown waited for the work in flight");
        let _ = std::fs::remove_dir_all(&root);
    }
}
