//! Per-model records: one `Slot` per name, holding the current incarnation (uid) and earlier
//! ones still awaiting confirmation or cleanup.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use thin_vec::ThinVec;

use super::io::{Cause, Confirmation, EffectId};
use crate::compact::WordOption;
use crate::dest_path::{DestPath, dest_path};
use crate::model::{ModelKey, ModelObject, Uid};
use crate::time::Instant;
use crate::wire::ModelStatus;

/// Where an incarnation stands on existence and placement (core.md's tables; `tables.rs`).
/// A `Suppressed` candidate (a live read found the same uid alive) goes straight back to
/// `Observed` in the same step; it is counted and noted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Life {
    Observed,
    /// Something about this uid awaits live evidence before anything is removed.
    PendingConfirm {
        cause: Cause,
        attempt: u32,
        since: Instant,
        /// The step that made it pending: evidence must be sent after it.
        since_seq: u64,
        /// Evidence sent before this instant does not count (the blast-radius breaker's hold).
        fresh_after: Instant,
        read: ReadState,
    },
    /// Alive, but two live witnesses agree it no longer places here: withdraw from this node.
    /// Leaves when a newer view places it here again, or the uid is deleted.
    Withdrawn,
    /// Gone for good (uids are never reused): cleanup runs, then the record is dropped.
    Confirmed {
        confirmation: Confirmation,
    },
}

/// When a request was sent: the step (orders it against events of the same millisecond) and
/// the instant (for the breaker's hold).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Sent {
    pub seq: u64,
    pub at: Instant,
}

/// The live read of a pending incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadState {
    /// To be read now (a GET, or part of a LIST).
    Due,
    /// Backing off after a failed read, or held by the breaker.
    Waiting { at: Instant },
    /// Answered only by the read with this id: a read issued before the candidate never answers it.
    InFlight { id: EffectId },
    /// A placement exit whose model read (sent then) found the uid alive: the second witness,
    /// a live read of this Node, decides.
    ModelAnswered { sent: Sent },
}

/// What this agent believes is on the wire (node label and ConfigMap entry) for an incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Published {
    /// Not known yet (after a start, before the first snapshot).
    Unknown,
    Nothing,
    Status {
        status: ModelStatus,
        reason: Option<Arc<str>>,
    },
    /// Something is there that is not what the agent wrote (a snapshot disagreed).
    Drifted,
}

/// The fetch (verify or download) of the weights.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// Boxed: every incarnation carries this field, and a record with the outcome inline was the
/// largest field of every model's state (48 bytes against 16).
pub enum Fetched {
    No,
    Done(Box<FetchDone>),
    Failed(Box<FetchFailed>),
}

/// A fetch that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchDone {
    pub plan: Plan,
    /// The commit a download came from (`None` for a check, or an outcome without one).
    #[serde(default)]
    pub commit: Option<Arc<str>>,
    /// What the model's config files say (at most `wire::MODEL_CONFIG_BYTES_MAX` as JSON).
    #[serde(default)]
    pub metadata: Option<Arc<crate::wire::ModelConfig>>,
    /// The bytes of every file (0 for a check).
    #[serde(default)]
    pub bytes: u64,
    /// The reserve label the directory's marker records for this uid, as far as this process
    /// knows: the download's (`Op::Download::reserve`), then each `Op::RecordReserve` that landed.
    #[serde(default)]
    pub reserve_recorded: bool,
}

/// A fetch that failed: tried again at `retry_at`, or when the plan changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchFailed {
    pub plan: Plan,
    pub reason: Arc<str>,
    pub retry_at: Instant,
}

/// How the weights are made available; a changed plan (new URI or path) fetches again.
///
/// A verify's and an own download's strings are shared with the record's destination and the
/// object's spec: a settle builds such a plan without allocating, and compares it with the one
/// it has by pointer first. A shared copy's pinned URI and paths are made at each settle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Plan {
    Verify {
        path: Arc<str>,
    },
    Download {
        storage_uri: Arc<str>,
        dest: DestPath,
    },
    /// `ReuseIfExists` on `hf://`: resolve the revision to its commit first (`Op::Resolve`).
    Resolve {
        storage_uri: Arc<str>,
    },
    /// The node's one copy of a commit (`_artifacts/<org>/<repo>/<commit>`, `storage_uri`
    /// pinned to that commit), and this model's relative symlink `link` to it.
    Shared {
        storage_uri: Arc<str>,
        copy: DestPath,
        link: DestPath,
    },
}

impl Plan {
    /// What a download of this plan fetches and into which directory beneath the root:
    /// incarnations with the same pair share one directory (`shared.rs`).
    pub fn fetch_into(&self) -> Option<(&Arc<str>, &str)> {
        match self {
            Plan::Download { storage_uri, dest } => Some((storage_uri, dest.beneath_root()?)),
            Plan::Shared { storage_uri, copy, .. } => Some((storage_uri, copy.beneath_root()?)),
            Plan::Verify { .. } | Plan::Resolve { .. } => None,
        }
    }
}

/// What a downloading incarnation owns and shares with others (`shared.rs`): boxed, as most
/// never download.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Share {
    /// The directory beneath the models root that this agent downloaded for this uid.
    pub owned_dir: Option<String>,
    /// The commit a `ReuseIfExists` revision resolved to: (storage URI, commit).
    pub resolved: Option<Box<(String, String)>>,
    /// The symlink this agent made, or found in place, for this uid: (link, copy), both beneath
    /// the root.
    pub link: Option<Box<(String, String)>>,
    /// Something else is at this link path: the model downloads its own copy there instead.
    pub refused_at: Option<Box<str>>,
    /// The directory this incarnation is a member of in `State::dirs`, and as what.
    pub registered: Option<(Arc<str>, super::shared::Member)>,
    /// The shape of the artifact last published (its owner and children): a change republishes.
    pub artifact_digest: u64,
    /// Leaving, it would trash a directory whose marker names other uids (seq of the step it
    /// began to wait): the trash waits for a Node witness sent at or after that step.
    pub trash_after_seq: Option<u64>,
    /// A reserved model gone that gave its directory up (`Op::DisownDir`): it waits for no
    /// snapshot (`tables::reserved_disown_pending`).
    pub disowned: bool,
}

/// A download in flight (`Incarnation::inflight` is its id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownloadRun {
    pub id: EffectId,
    /// Shared with the effect's `IncOp::Fetch`.
    pub plan: Arc<Plan>,
    /// `Op::CancelDownload` was sent: the outcome is awaited, nothing more is asked.
    pub cancel_sent: bool,
    /// The other uids the download writes into the marker.
    pub co_owners: Vec<Uid>,
    /// The reserve label it records in the marker for this uid (`Op::Download::reserve`).
    pub reserve: bool,
}

/// One object incarnation (one uid) and its progress on this node.
#[derive(Clone, Debug)]
pub struct Incarnation {
    pub obj: Arc<ModelObject>,
    /// `dest_path` of the spec, computed when the spec changes (not on every decision).
    pub dest: Result<Option<DestPath>, String>,
    pub life: Life,
    pub published: Published,
    pub fetched: Fetched,
    /// The step whose event gave `obj`: a read sent before it never replaces `obj` (newest view
    /// wins).
    pub view_seq: u64,
    pub inflight: WordOption<EffectId>,
    /// Set while the effect in flight is a download: boxed, as few incarnations download.
    pub download: Option<Box<DownloadRun>>,
    /// Consecutive failed effects, for backoff; reset on success.
    pub failures: u32,
    pub blocked_until: WordOption<Instant>,
    /// Step of the last effect outcome or of creation: a snapshot requested before it is stale
    /// for this incarnation (milliseconds cannot order events of one instant).
    pub changed_seq: u64,
    /// The instant registered in the timer set for this incarnation.
    pub timer_at: WordOption<Instant>,
    /// A colliding model that owns this one's shared label or entry key (noted when it changes).
    pub held_by: Option<ModelKey>,
    /// `Op::FillSpec` has landed for this incarnation (with `Config::update_model_spec`).
    pub spec_filled: bool,
    /// Resolution, link and directory membership of a download (`None` for most models).
    pub share: Option<Box<Share>>,
}

impl Incarnation {
    pub fn new(obj: Arc<ModelObject>, seq: u64, models_root: &str) -> Incarnation {
        Incarnation {
            dest: dest_of(&obj, models_root),
            obj,
            life: Life::Observed,
            published: Published::Unknown,
            fetched: Fetched::No,
            view_seq: seq,
            inflight: WordOption::NONE,
            download: None,
            failures: 0,
            blocked_until: WordOption::NONE,
            changed_seq: seq,
            timer_at: WordOption::NONE,
            held_by: None,
            spec_filled: false,
            share: None,
        }
    }

    /// Take a view of the same object that arrived at step `seq`, unless a newer one is kept.
    pub fn set_obj(&mut self, obj: Arc<ModelObject>, seq: u64, models_root: &str) {
        if seq < self.view_seq {
            return;
        }
        if obj.spec != self.obj.spec {
            self.dest = dest_of(&obj, models_root);
        }
        self.obj = obj;
        self.view_seq = seq;
    }

    /// Count one more failed effect; the backoff delay before the next attempt.
    pub fn failed_once(&mut self, config: &super::io::Config, prng: &mut crate::prng::Prng) -> u64 {
        let delay = crate::prng::backoff_ms(self.failures, config.retry_delay_ms_min, config.retry_delay_ms_max, prng);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub fn uid(&self) -> &Uid {
        &self.obj.uid
    }

    pub fn awaits(&self, id: EffectId) -> bool {
        matches!(self.life, Life::PendingConfirm { read: ReadState::InFlight { id: r }, .. } if r == id)
    }

    pub fn read_due(&self) -> bool {
        matches!(self.life, Life::PendingConfirm { read: ReadState::Due, .. })
    }

    pub fn is_pending(&self) -> bool {
        matches!(self.life, Life::PendingConfirm { .. })
    }

    pub fn is_confirmed(&self) -> bool {
        matches!(self.life, Life::Confirmed { .. })
    }

    /// Its spec carries the reserve label: the agent never moves its weights.
    pub fn is_reserved(&self) -> bool {
        self.obj.spec().is_some_and(|s| s.reserve_artifact)
    }

    /// Neither withdrawn from this node nor confirmed gone: it may stay placed here.
    pub fn may_stay(&self) -> bool {
        matches!(self.life, Life::Observed | Life::PendingConfirm { .. })
    }

    /// A placement exit waiting for the Node witness.
    pub fn awaits_node_witness(&self) -> bool {
        matches!(self.life, Life::PendingConfirm { read: ReadState::ModelAnswered { .. }, .. })
    }

    /// Might this incarnation have a label, an entry, weights or a link on this node?
    pub fn something_here(&self) -> bool {
        !matches!(self.published, Published::Nothing | Published::Unknown)
            || self.owned_dir().is_some()
            || self.inflight.is_some()
            || self.link().is_some()
    }

    /// The symlink this agent made for this uid: (link, copy), both beneath the root.
    pub fn link(&self) -> Option<&(String, String)> {
        self.share.as_ref().and_then(|s| s.link.as_deref())
    }

    /// The commit `storage_uri` resolved to for this uid, if it has.
    pub fn resolved_for(&self, storage_uri: &str) -> Option<&str> {
        let (uri, commit) = self.share.as_ref()?.resolved.as_deref()?;
        (uri == storage_uri).then_some(commit.as_str())
    }

    /// The directory beneath the models root that this agent downloaded for this uid.
    pub fn owned_dir(&self) -> Option<&str> {
        self.share.as_ref()?.owned_dir.as_deref()
    }

    pub fn set_owned_dir(&mut self, dir: Option<String>) {
        if dir.is_some() || self.share.is_some() {
            self.share_mut().owned_dir = dir;
        }
    }

    pub fn share_mut(&mut self) -> &mut Share {
        self.share.get_or_insert_with(Box::default)
    }

    /// After a failed effect: a publish may have half landed (the label patched, the ConfigMap
    /// write failed), so what was Nothing is Unknown now and a withdrawal still removes it.
    pub fn effect_failed(&mut self, what: &super::tables::IncOp) {
        if matches!(what, super::tables::IncOp::Publish { .. }) && self.published == Published::Nothing {
            self.published = Published::Unknown;
        }
    }

    /// Might this incarnation have a label on the node? Conservative: unknown counts as yes.
    pub fn claims_label(&self) -> bool {
        !matches!(self.published, Published::Nothing) || self.inflight.is_some()
    }

    /// The earliest instant this incarnation wants to be woken at.
    pub fn wake_at(&self) -> Option<Instant> {
        let read = match self.life {
            Life::PendingConfirm { read: ReadState::Waiting { at }, .. } => Some(at),
            _ => None,
        };
        let fetch = match self.fetched {
            Fetched::Failed(ref failed) => Some(failed.retry_at),
            _ => None,
        };
        let earlier = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, None) => a,
            (None, b) => b,
        };
        earlier(earlier(read, self.blocked_until.get()), fetch)
    }

    /// Wake: timers that have passed move their state on.
    pub fn wake(&mut self, now: Instant) {
        if let Life::PendingConfirm { read: read @ ReadState::Waiting { .. }, .. } = &mut self.life
            && matches!(read, ReadState::Waiting { at } if *at <= now)
        {
            *read = ReadState::Due;
        }
        if self.blocked_until.is_some_and(|t| t <= now) {
            self.blocked_until = WordOption::NONE;
        }
        if matches!(&self.fetched, Fetched::Failed(failed) if failed.retry_at <= now) {
            self.fetched = Fetched::No;
        }
    }
}

fn dest_of(obj: &ModelObject, models_root: &str) -> Result<Option<DestPath>, String> {
    match obj.spec() {
        Some(spec) => dest_path(spec, models_root),
        None => Ok(None),
    }
}

/// All incarnations that share one name.
#[derive(Clone, Debug)]
/// The node label key and ConfigMap key are not kept: they are derived from the name where
/// needed (publishing, drift), which saves two allocations per model.
pub struct Slot {
    /// The newest uid seen under this name.
    pub current: Option<Incarnation>,
    /// Older uids: pending confirmation or being cleaned up. Not bounded by a number: each is a
    /// distinct object that existed, and each leaves once confirmed and cleaned. A thin vector
    /// (one word): most names never have a former uid.
    pub former: ThinVec<Incarnation>,
    /// What the per-kind pending/due indexes hold for this name.
    pub indexed_pending: bool,
    pub indexed_due: bool,
    /// The relist of this name's kind (`KindSync::relist_at`) that last listed it: a mark on the
    /// record instead of a set of the keys listed, which cost a persistent-set insertion per
    /// item of every relist.
    pub listed_in: u32,
    /// The step of the newest watch event about this name (any uid): a live read sent before
    /// it never brings back a uid the record no longer holds.
    pub event_seq: u64,
}

// The record every model keeps on every node (README, "bytes per model"): a field that would
// grow it past this is boxed or packed (`compact::WordOption`).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Slot>() <= 232, "the per-model record grew");

impl Slot {
    pub fn is_empty(&self) -> bool {
        self.current.is_none() && self.former.is_empty()
    }

    pub fn all(&self) -> impl Iterator<Item = &Incarnation> {
        self.current.iter().chain(self.former.iter())
    }

    /// Does every incarnation satisfy `f` (true for none)? Without an iterator chain: this is
    /// asked of every record a step settles.
    #[inline]
    pub fn every(&self, f: impl Fn(&Incarnation) -> bool) -> bool {
        self.current.as_ref().is_none_or(&f) && self.former.iter().all(f)
    }

    /// Does some incarnation satisfy `f`?
    #[inline]
    pub fn some(&self, f: impl Fn(&Incarnation) -> bool) -> bool {
        self.current.as_ref().is_some_and(&f) || self.former.iter().any(f)
    }

    pub fn all_mut(&mut self) -> impl Iterator<Item = &mut Incarnation> {
        self.current.iter_mut().chain(self.former.iter_mut())
    }

    pub fn find_mut(&mut self, uid: &Uid) -> Option<&mut Incarnation> {
        self.all_mut().find(|i| i.uid() == uid)
    }
}
