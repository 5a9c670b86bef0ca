//! What goes into the core (inputs) and what comes out (effects), as plain data.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::dest_path::DestPath;
use crate::model::{Kind, ModelKey, ModelObject, Uid};
use crate::placement::NodeView;
use crate::time::Instant;
use crate::wire::{DownloadProgress, EntryOwner, ModelConfig, ModelEntry, ModelStatus};

/// `--models-root-write-check`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteCheck {
    /// Writable only when a model eligible here downloads (the default).
    #[default]
    Auto,
    Always,
    Never,
}

impl std::str::FromStr for WriteCheck {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(WriteCheck::Auto),
            "always" => Ok(WriteCheck::Always),
            "never" => Ok(WriteCheck::Never),
            other => Err(format!("--models-root-write-check must be auto, always or never, not {other:?}")),
        }
    }
}

/// The core's configuration. Part of every trace's first line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    pub node_name: String,
    pub models_root: String,
    pub write_check: WriteCheck,
    /// Seeds the core's PRNG (backoff jitter, drift period jitter).
    pub seed: u64,
    /// A live GET or LIST not answered by then counts as failed.
    pub live_read_timeout_ms: u64,
    pub retry_delay_ms_min: u64,
    pub retry_delay_ms_max: u64,
    /// From this many keys of one kind due for a read at once, one LIST replaces the GETs.
    pub coalesce_keys_min: usize,
    /// Keys of one kind that fall due within this long after a read of the kind was sent (or
    /// while a LIST of it is in flight) wait and go out together when the window closes, so a
    /// storm's stragglers share one LIST. A lone candidate with no recent read of its kind is
    /// read at once. 0 (traces recorded before the window): no window.
    #[serde(default)]
    pub coalesce_window_ms: u64,
    /// A LIST costs the API server O(models of the kind), a GET O(1): a LIST is sent only when
    /// it answers at least one due key per this many models kept, so a few keys among
    /// thousands of models stay GETs. A relist storm (every key at once) always coalesces.
    /// 0 (traces recorded before it): no such limit.
    #[serde(default)]
    pub coalesce_models_per_key_max: usize,
    /// A LIST pages through every object of its kind, so its deadline is `live_read_timeout_ms`
    /// and this much for each model kept (at most `LIVE_LIST_TIMEOUT_MS_MAX`): one GET's
    /// deadline for thousands of objects failed every LIST on a loaded API server, and the
    /// candidates waited for good. 0 (traces recorded before it): one GET's deadline.
    #[serde(default)]
    pub live_list_ms_per_model: u64,
    pub drift_period_ms: u64,
    pub root_probe_period_ms: u64,
    /// How long a trashed directory is kept before it is purged.
    pub trash_grace_ms: u64,
    /// The blast-radius breaker trips when, within `breaker_window_ms`, more than
    /// `breaker_percent` of the models placed here, and at least `breaker_models_min`, become
    /// candidates for withdrawal or cleanup; it then holds every destructive decision until
    /// live reads sent `breaker_hold_ms` later confirm it.
    pub breaker_percent: u32,
    pub breaker_models_min: u32,
    pub breaker_window_ms: u64,
    pub breaker_hold_ms: u64,
    /// A model whose spec is larger (compact JSON) is kept as identity plus a Failed reason;
    /// applied where the shell (or the simulator) decodes objects.
    #[serde(default = "object_bytes_max_default")]
    pub object_bytes_max: usize,
    /// A step emits at most this many effects; the rest follow at the next steps, in order.
    #[serde(default = "effects_per_step_max_default")]
    pub effects_per_step_max: usize,
    /// `--update-model-spec`: once a model is Ready with metadata, fill its spec's empty fields
    /// (`Op::FillSpec`, once per incarnation). Off: the agent never writes a model.
    #[serde(default)]
    pub update_model_spec: bool,
}

// Traces recorded before these limits existed still replay.
fn object_bytes_max_default() -> usize {
    crate::model::OBJECT_BYTES_MAX_DEFAULT
}

fn effects_per_step_max_default() -> usize {
    EFFECTS_PER_STEP_MAX_DEFAULT
}

pub const EFFECTS_PER_STEP_MAX_DEFAULT: usize = 1024;

/// 5 ms an object: a loaded API server took more than 3.3 ms for each of 3,000 objects in pages
/// of 10 (the shell's `LIST_PAGE_ITEMS`); an idle one about 0.3 ms.
pub const LIVE_LIST_MS_PER_MODEL_DEFAULT: u64 = 5;
/// No LIST is given longer than 10 minutes (120,000 models at the default).
pub const LIVE_LIST_TIMEOUT_MS_MAX: u64 = 600_000;

impl Config {
    pub fn new(node_name: &str, models_root: &str) -> Config {
        Config {
            node_name: node_name.to_string(),
            models_root: models_root.to_string(),
            write_check: WriteCheck::Auto,
            seed: 0,
            live_read_timeout_ms: 10_000,
            retry_delay_ms_min: 1_000,
            retry_delay_ms_max: 300_000,
            coalesce_keys_min: 2,
            coalesce_window_ms: 500,
            coalesce_models_per_key_max: 32,
            live_list_ms_per_model: LIVE_LIST_MS_PER_MODEL_DEFAULT,
            drift_period_ms: 300_000,
            root_probe_period_ms: 10_000,
            trash_grace_ms: 3_600_000,
            breaker_percent: 25,
            breaker_models_min: 5,
            breaker_window_ms: 60_000,
            breaker_hold_ms: 300_000,
            object_bytes_max: crate::model::OBJECT_BYTES_MAX_DEFAULT,
            effects_per_step_max: EFFECTS_PER_STEP_MAX_DEFAULT,
            update_model_spec: false,
        }
    }
}

/// One event of a kind's watch stream (kube-runtime's watcher events, renamed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
///
/// Objects come shared (`Arc`): a fleet's simulator hands one copy of an object to every node,
/// and the core keeps what it is given rather than a copy of it (serialised as the object).
pub enum WatchEvent {
    Applied(Arc<ModelObject>),
    /// A watch DELETED: only a candidate until a live read confirms it.
    Deleted(Arc<ModelObject>),
    /// `Init`: a (re)list begins; objects known now and not listed by `RelistDone` are candidates.
    RelistStarted,
    RelistItem(Arc<ModelObject>),
    RelistDone,
}

/// Result of a live (quorum, uncached) GET of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ReadResult {
    Found(Arc<ModelObject>),
    NotFound,
    /// Any error, timeouts included. Never means "not found".
    Failed(String),
}

/// Result of a live (quorum) LIST of one kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ListResult {
    Listed(Vec<Arc<ModelObject>>),
    Failed(String),
}

/// Result of a live (quorum) GET of this agent's own Node: the second witness of a placement exit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeReadResult {
    Found(NodeView),
    Failed(String),
}

/// Outcome of an effect that has one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Done,
    Failed(String),
    /// How an `Op::Download` or an `Op::VerifyLocal` ended (a plain `Done` or `Failed` is
    /// also accepted for either).
    Downloaded(DownloadEnd),
    /// The commit an `Op::Resolve` found.
    Resolved {
        commit: String,
    },
    /// `Op::Link` found something else at the link's path (a directory, a file, another link):
    /// left alone, and the model downloads its own copy there.
    Occupied(String),
}

/// How a download ended, and what it left on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadEnd {
    /// The destination carries this uid's ownership marker (written before the first byte), so
    /// the directory is this uid's to trash whatever the result; without it, it is not.
    pub marked: bool,
    pub result: DownloadResult,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownloadResult {
    /// Every file is in place and verified; `commit` is the revision it came from (the entry's
    /// `config.artifact.sha`; empty for a check). `metadata` is what the model's config files
    /// say, for the Ready entry's `config` (at most `wire::MODEL_CONFIG_BYTES_MAX` as JSON; a
    /// larger one is dropped).
    Done {
        commit: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<Box<ModelConfig>>,
        /// The bytes of every file of the model (for the shared copies' metrics).
        #[serde(default)]
        bytes: u64,
    },
    /// The source may ask to wait at least `retry_after_ms` (a 429's `Retry-After`, a gated repo).
    Failed { reason: String, retry_after_ms: Option<u64> },
    /// Stopped because the core asked (`Op::CancelDownload`); its partial files are kept.
    Cancelled,
}

/// What the shell found at the models root.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootProbe {
    pub exists: bool,
    pub is_dir: bool,
    pub readable: bool,
    pub writable: bool,
    /// Why a check failed (the OS error, "mounted read-only", ...), for probes and logs.
    #[serde(default)]
    pub detail: String,
    /// False when the filesystem did not answer within the shell's deadline (a dead NFS
    /// share): nothing is known about the root, and `detail` says how long was waited.
    #[serde(default = "answered_by_default")]
    pub answered: bool,
}

fn answered_by_default() -> bool {
    true
}

impl RootProbe {
    pub fn healthy(writable: bool) -> RootProbe {
        RootProbe { exists: true, is_dir: true, readable: true, writable, detail: String::new(), answered: true }
    }

    /// A probe the filesystem did not answer: `detail` says why ("did not answer within 5 s").
    pub fn unanswered(detail: String) -> RootProbe {
        RootProbe { exists: false, is_dir: false, readable: false, writable: false, detail, answered: false }
    }
}

/// A directory under the models root carrying this agent's ownership marker.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OwnedDir {
    /// Path relative to the models root.
    pub path: String,
    pub uid: Uid,
    /// The marker records that `uid` carried the reserve label when its download last ran: the
    /// orphan sweep gives such a directory up rather than trash it (the model may have been
    /// deleted while no agent ran, and upstream never removes a reserved model's files).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reserved: bool,
}

/// What is on the node and in the API now, for drift reconciliation. Taken by the shell with
/// fresh reads when the core asks for it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DriftSnapshot {
    /// This node's labels under `models.ome.io/`, with their values. Shared strings: the
    /// simulator hands over the ones it holds instead of copying a thousand keys a snapshot.
    pub labels: BTreeMap<Arc<str>, Arc<str>>,
    /// This node's ConfigMap entries: key → (status, uid recorded in the entry).
    pub entries: BTreeMap<Arc<str>, EntryView>,
    /// Directories with this agent's ownership marker.
    pub owned_dirs: Vec<OwnedDir>,
    /// Names of entries in the trash folder.
    pub trash: Vec<String>,
    /// Directories beneath the root the scan could not read, where a marker may have been
    /// missed (`""`: the root itself, or a walk stopped at its limit). A directory there whose
    /// marker the scan did not show is unknown, not gone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unread: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryView {
    /// `None` when the value is not a ModelEntry the agent understands.
    pub status: Option<ModelStatus>,
    pub uid: Option<Uid>,
}

impl EntryView {
    /// The view of a stored value.
    pub fn of(value: &str) -> EntryView {
        match ModelEntry::from_json(value) {
            Ok(e) => EntryView { status: Some(e.status), uid: e.uid.as_deref().map(Uid::new) },
            Err(_) => EntryView { status: None, uid: None },
        }
    }

    /// `wire::entry_is_of(&self.owner(), uid)` without making the owner (a drift pass asks it
    /// of every entry): the uid an unreadable entry carries claims nothing.
    pub fn is_of(&self, uid: &str) -> bool {
        let claimed = self.status.and(self.uid.as_ref()).map(Uid::as_str);
        crate::wire::claim_is_of(claimed, uid)
    }

    pub fn owner(&self) -> EntryOwner {
        match (&self.status, &self.uid) {
            (None, _) => EntryOwner::Unreadable,
            (Some(_), None) => EntryOwner::Anonymous,
            (Some(_), Some(uid)) => EntryOwner::Uid(uid.as_str().to_string()),
        }
    }
}

/// Stable id of one effect; its outcome comes back with the same id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EffectId(pub u64);

impl fmt::Debug for EffectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Every input the core handles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Input {
    Watch {
        kind: Kind,
        event: WatchEvent,
    },
    /// The agent's own Node (labels), for eligibility.
    NodeObserved(NodeView),
    LiveRead {
        id: EffectId,
        result: ReadResult,
    },
    LiveList {
        id: EffectId,
        result: ListResult,
    },
    NodeRead {
        id: EffectId,
        result: NodeReadResult,
    },
    EffectDone {
        id: EffectId,
        outcome: Outcome,
    },
    RootProbed {
        id: EffectId,
        probe: RootProbe,
    },
    DriftObserved {
        id: EffectId,
        snapshot: DriftSnapshot,
    },
    /// How far the download `id` has come (the shell reports at most every 30 s, OME's cadence).
    DownloadProgress {
        id: EffectId,
        progress: DownloadProgress,
    },
    /// Nothing happened but time passed (a timer the shell was asked to wake for).
    Tick,
    /// SIGTERM: from now on no new destructive effect.
    Shutdown,
}

/// What the core asks the shell to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    pub id: EffectId,
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Quorum GET (no resourceVersion) of one model, answered by `Input::LiveRead`.
    LiveGet { key: ModelKey },
    /// Quorum LIST of one kind, answered by `Input::LiveList`. The shell gives it `timeout_ms`
    /// in all (each page still a GET's deadline); none: one GET's deadline (older traces).
    LiveList {
        kind: Kind,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
    },
    /// Quorum GET of this agent's Node, answered by `Input::NodeRead`.
    LiveGetNode,
    /// Set this node's label for the model (when `label` is set) and write its ConfigMap entry.
    Publish {
        key: ModelKey,
        uid: Uid,
        label_key: String,
        label: Option<ModelStatus>,
        cm_key: String,
        entry: Box<ModelEntry>,
    },
    /// Destructive. Remove this node's label for the model (only when `remove_label`: another
    /// incarnation may own it) and its ConfigMap entry, only if that entry belongs to `uid`.
    Unpublish { key: ModelKey, uid: Uid, label_key: String, remove_label: bool, cm_key: String },
    /// Check that a `local://` directory exists and is readable. Never writes. With
    /// `parse_metadata`, the answer is `Outcome::Downloaded` (unmarked) carrying what the
    /// directory's config files say; a plain `Done` means no metadata.
    VerifyLocal {
        key: ModelKey,
        uid: Uid,
        path: String,
        #[serde(default)]
        parse_metadata: bool,
    },
    /// Download into `dest` and mark the directory as owned by `uid`; answered by
    /// `Outcome::Downloaded`, with `Input::DownloadProgress` on the way. With `parse_metadata`,
    /// its `Done` carries what the downloaded config files say.
    Download {
        key: ModelKey,
        uid: Uid,
        storage_uri: String,
        dest: DestPath,
        #[serde(default)]
        parse_metadata: bool,
        /// Other models sharing `dest` (same source, same directory): a marker naming any of
        /// them, or `uid`, is accepted, and the marker then names all of them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        co_owners: Vec<Uid>,
        /// The markers are not known yet (before this process's first snapshot): a marker that
        /// is accepted keeps every uid it names besides the owners', rather than naming exactly
        /// them (a model whose keys another holds may own the directory and not be known to).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        keep_marked: bool,
        /// Live models of another source using `dest`: where the marker names one of them and
        /// the directory's files are not of this download's source, it is refused (those files
        /// may be that model's, before anything in this run has shown them there).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        other_source: Vec<Uid>,
        /// The model carries the reserve label: the marker records it for `uid`
        /// (`OwnedDir::reserved`), and forgets it when it does not.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        reserve: bool,
    },
    /// Resolve an `hf://` revision to its commit (`Outcome::Resolved`). When the source cannot
    /// answer, the shell may answer with the commit of the copy the symlink at `link` (beneath
    /// the root) points to, if that copy is complete.
    Resolve { key: ModelKey, uid: Uid, storage_uri: String, link: String },
    /// Make `link` (beneath the root) a relative symlink to the shared copy `copy` (beneath
    /// the root), only where nothing exists; the same link already there is `Done`, anything
    /// else `Outcome::Occupied`.
    Link { key: ModelKey, uid: Uid, link: String, copy: String },
    /// Destructive. Remove the symlink `link` only if it still points to `copy`; anything else
    /// there is left alone (`Done`).
    Unlink { key: ModelKey, uid: Uid, link: String, copy: String },
    /// Fill the empty metadata fields of the live model's spec (if it is still `uid`) from the
    /// config files in `dir`, with a merge patch that carries the resourceVersion read, so that
    /// of all nodes one write wins. Nothing to fill, or a model gone, is `Done`; a failure is
    /// not retried for this incarnation.
    FillSpec { key: ModelKey, uid: Uid, dir: String },
    /// Stop the download `download` (no outcome of its own: the download's outcome follows).
    CancelDownload { download: EffectId },
    /// Destructive. Move a directory the agent owns (its marker says `uid`) to
    /// `<root>/.model-agent-trash/<trash_name>`; a directory whose marker differs is left alone.
    TrashDir { key: Option<ModelKey>, uid: Uid, path: String, trash_name: String },
    /// Give up the directory `path` of a reserved model confirmed gone, leaving its files in
    /// place: the marker keeps only the uids of `keep` it names (those that may be of live
    /// models), and goes when it names none, so no later sweep takes the weights for an orphan's
    /// (a uid left over in the marker, of a model gone, would make it one). A marker that does
    /// not name `uid`, or none, is `Done`. With no `key`: the orphan sweep's, for a directory
    /// whose marker records a reserved uid of no model (`OwnedDir::reserved`).
    DisownDir { key: Option<ModelKey>, uid: Uid, path: String, keep: Vec<Uid> },
    /// Record in the marker of `path` (beneath the root) whether `uid` carries the reserve label
    /// now (`OwnedDir::reserved`): the label changed since its download recorded it. A marker
    /// that does not name `uid`, or none, is `Done` (nothing to record).
    RecordReserve { key: ModelKey, uid: Uid, path: String, reserved: bool },
    /// Destructive. Delete one entry of the trash folder for good.
    PurgeTrash { name: String },
    /// Destructive. Remove a `models.ome.io/` label no model claims (confirmed by fresh LISTs).
    RemoveOrphanLabel { label_key: String },
    /// Destructive. Remove a ConfigMap entry no model claims (only if it still has `uid`).
    RemoveOrphanEntry { cm_key: String, uid: Option<Uid> },
    /// Answer with `Input::RootProbed`.
    ProbeRoot,
    /// Answer with `Input::DriftObserved`, or `Outcome::Failed` when the API reads or the scan
    /// of the root fail (nothing at all leaves it to the next drift pass).
    Snapshot,
}

impl Input {
    /// The kind of input, for tallies and profiles (`watch-applied`, `effect-done`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Input::Watch { event, .. } => match event {
                WatchEvent::Applied(_) => "watch-applied",
                WatchEvent::Deleted(_) => "watch-deleted",
                WatchEvent::RelistStarted => "relist-started",
                WatchEvent::RelistItem(_) => "relist-item",
                WatchEvent::RelistDone => "relist-done",
            },
            Input::NodeObserved(_) => "node-observed",
            Input::LiveRead { .. } => "live-read",
            Input::LiveList { .. } => "live-list",
            Input::NodeRead { .. } => "node-read",
            Input::EffectDone { .. } => "effect-done",
            Input::RootProbed { .. } => "root-probed",
            Input::DriftObserved { .. } => "drift-observed",
            Input::DownloadProgress { .. } => "download-progress",
            Input::Tick => "tick",
            Input::Shutdown => "shutdown",
        }
    }
}

impl Op {
    /// The kind of effect, for tallies and profiles (`publish`, `live-get`, ...).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Op::LiveGet { .. } => "live-get",
            Op::LiveList { .. } => "live-list",
            Op::LiveGetNode => "live-get-node",
            Op::Publish { .. } => "publish",
            Op::Unpublish { .. } => "unpublish",
            Op::VerifyLocal { .. } => "verify-local",
            Op::Download { .. } => "download",
            Op::Resolve { .. } => "resolve",
            Op::Link { .. } => "link",
            Op::Unlink { .. } => "unlink",
            Op::FillSpec { .. } => "fill-spec",
            Op::CancelDownload { .. } => "cancel-download",
            Op::TrashDir { .. } => "trash-dir",
            Op::DisownDir { .. } => "disown-dir",
            Op::RecordReserve { .. } => "record-reserve",
            Op::PurgeTrash { .. } => "purge-trash",
            Op::RemoveOrphanLabel { .. } => "remove-orphan-label",
            Op::RemoveOrphanEntry { .. } => "remove-orphan-entry",
            Op::ProbeRoot => "probe-root",
            Op::Snapshot => "snapshot",
        }
    }

    /// Effects that remove something; none is emitted after shutdown begins.
    pub fn is_destructive(&self) -> bool {
        matches!(
            self,
            Op::Unpublish { .. }
                | Op::Unlink { .. }
                | Op::TrashDir { .. }
                | Op::PurgeTrash { .. }
                | Op::RemoveOrphanLabel { .. }
                | Op::RemoveOrphanEntry { .. }
        )
    }
}

/// Why a model became a deletion candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Cause {
    /// A watch DELETED event.
    WatchDeleted,
    /// Known before a relist and absent from it (a tombstone in client-go's terms).
    RelistVanished,
    /// The watch showed another uid under the same name.
    UidChanged,
    /// The model stopped matching this node; its object and this Node are re-read before
    /// anything is withdrawn.
    PlacementExit,
    /// A deletionTimestamp arrived while the blast-radius breaker holds: re-read after the hold.
    MarkedDeleting,
}

/// What confirmed a deletion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Confirmation {
    NotFound,
    Replaced,
    Deleting,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Note {
    /// A live read found the same uid alive: the candidate was a phantom and nothing was removed.
    PhantomSuppressed { key: ModelKey, uid: Uid, cause: Cause },
    /// A deletion was confirmed; cleanup of this uid follows.
    DeleteConfirmed { key: ModelKey, uid: Uid, confirmation: Confirmation },
    /// A model is Failed on this node.
    ModelFailed { key: ModelKey, uid: Uid, reason: String },
    /// A live read failed; the candidate stays pending and is read again later.
    ReadFailed { key: Option<ModelKey>, kind: Kind, reason: String, retry_in_ms: u64 },
    /// A shell effect failed and will be retried.
    EffectFailed { id: EffectId, reason: String, retry_in_ms: u64 },
    /// Too many candidates at once: destructive decisions are held until `until`.
    BreakerTripped { candidates: u32, placed: u32, until: Instant },
    /// More than half of this Node's labels vanished in one view (`vanished` of `had`): a wipe
    /// until proven otherwise, so the breaker holds destructive decisions until `until`.
    NodeLabelsVanished { vanished: usize, had: usize, until: Instant },
    /// A confirmed withdrawal or cleanup was held by the breaker; it is read again at `until`.
    BreakerHeld { key: ModelKey, uid: Uid, until: Instant },
    /// A live read of this Node failed; placement exits wait and it is read again.
    NodeReadFailed { reason: String, retry_in_ms: u64 },
    /// A placement exit was cancelled: the live Node places the model here (the Node watch lagged).
    ExitCancelled { key: ModelKey, uid: Uid },
    /// This model's label key or ConfigMap key is also `owner`'s, which ranks first: this model
    /// writes nothing on this node (`collision_reason` says why) until the key is free.
    KeyCollision { key: ModelKey, uid: Uid, owner: ModelKey },
    /// Something else is at a `ReuseIfExists` model's path: it downloads its own copy there.
    LinkRefused { key: ModelKey, uid: Uid, reason: String },
}
