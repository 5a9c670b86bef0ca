//! The reconciler: a pure fold `step(&State, now, Input) -> (State, Vec<Effect>)`.
//!
//! Each step handles the input, fires the timers that are due, then, for every model the step
//! touched: starts placement-exit re-reads, issues the live reads that are due (coalesced into one
//! LIST per kind in a storm), and emits the next effect each incarnation needs. One effect per
//! incarnation is in flight at a time; its outcome comes back as an input.

/// `settle::InPlace` over the state's fields other than `slots` (a record borrowed from it can
/// be settled in place).
macro_rules! in_place {
    ($state:expr, $now:expr) => {
        settle::InPlace {
            claims: &$state.claims,
            kinds: &mut $state.kinds,
            timers: &mut $state.timers,
            node: $state.node.as_deref(),
            waiting: &$state.node_reads.waiting,
            models_root: &$state.config.models_root,
            now: $now,
        }
    };
}

mod breaker;
mod claims;
mod drift;
mod evidence;
mod invariants;
pub mod io;
mod outcomes;
mod readiness;
mod reads;
pub mod records;
mod settle;
pub mod shared;
pub mod tables;
mod timers;
mod views;
mod watch;

use imbl::OrdMap;

use crate::compact::WordOption;
use crate::pcoll::{Map, RunSet, Set};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use breaker::Breaker;
use claims::Claims;
pub use claims::collision_reason;
use drift::OrphanCheck;
pub use io::*;
pub use readiness::{Check, Readiness};
pub use records::{
    DownloadRun, FetchDone, FetchFailed, Fetched, Incarnation, Life, Plan, Published, ReadState, Sent, Slot,
};
pub use tables::Want;
use tables::{Context, IncOp, eligible_now, next_op, want};
use timers::sync_timers;
pub use views::{CopyUse, IncarnationView};

use crate::model::{Kind, ModelKey, ModelObject, Uid};
use crate::placement::{NodeView, placement};
use crate::prng::{Prng, backoff_ms};
use crate::time::Instant;
use crate::wire::{self, ModelStatus};

/// Who waits for an effect's outcome.
#[derive(Clone, Debug)]
enum Owner {
    Inc {
        key: ModelKey,
        uid: Uid,
        what: IncOp,
    },
    Get {
        key: ModelKey,
        deadline: Instant,
        sent: Sent,
    },
    List {
        kind: Kind,
        keys: Arc<Vec<ModelKey>>,
        purpose: ListPurpose,
        deadline: Instant,
        sent: Sent,
    },
    NodeGet {
        deadline: Instant,
        sent: Sent,
    },
    Snapshot {
        requested_seq: u64,
    },
    Purge {
        name: String,
    },
    /// An orphan's removal; `dir` when it trashes or gives up a directory (nothing is fetched
    /// into it until the outcome); `gives_up` for a directory whose marker records a reserved
    /// model (its files stay).
    Orphan {
        dir: Option<Arc<str>>,
        gives_up: bool,
    },
}

/// Why a LIST was sent: to answer pending candidates only, or also for the orphan sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListPurpose {
    Candidates,
    OrphanSweep,
}

/// The newest live read of this agent's Node: the second witness of placement exits.
#[derive(Clone, Debug)]
struct NodeWitness {
    node: Arc<NodeView>,
    sent: Sent,
}

/// Live reads of the Node: the newest answer, the one in flight, and the backoff.
#[derive(Clone, Debug, Default)]
struct NodeReads {
    witness: Option<NodeWitness>,
    inflight: Option<(EffectId, Sent)>,
    attempt: u32,
    retry_at: Option<Instant>,
    /// Placement exits whose model read agreed, waiting for a witness sent after them.
    waiting: Set<ModelKey>,
    /// Some waiting exit needs a witness newer than the newest one.
    wanted: bool,
    /// Models waiting to trash a directory whose marker names other uids: a witness sent after
    /// they began to wait (`Share::trash_after_seq`) settles them again.
    trash_waiting: Set<ModelKey>,
    /// The step whose input changed the Node view: a trash waits past it (the models it placed
    /// again register in the directories they use as they settle, after it).
    view_changed_seq: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    Inc(IncTimer),
    ReadDeadline(EffectId),
    NodeReadRetry,
    RootProbe,
    Drift,
    /// The first snapshot failed: ask again (`State::snapshot_retry`).
    SnapshotRetry,
    /// A snapshot soon after a shared copy lost its last member (the orphan sweep decides).
    Sweep,
    Purge(String),
}

/// An incarnation's timer. Ordered by the key's hash first, so that the ordered set compares
/// two words, not two names (timers of one instant fire in any order: each only wakes its
/// incarnation and marks its key, and the step sorts the keys it touched).
#[derive(Clone, Debug)]
struct IncTimer {
    key: ModelKey,
    uid: Uid,
}

/// The timer of the incarnation `uid` of `key`.
fn inc_timer(key: &ModelKey, uid: &Uid) -> TimerKey {
    TimerKey::Inc(IncTimer { key: key.clone(), uid: uid.clone() })
}

impl PartialEq for IncTimer {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.uid == other.uid
    }
}

impl Eq for IncTimer {}

impl PartialOrd for IncTimer {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for IncTimer {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let hashed = |t: &IncTimer| t.key.fingerprint();
        hashed(self).cmp(&hashed(other)).then_with(|| self.key.cmp(&other.key)).then_with(|| self.uid.cmp(&other.uid))
    }
}

/// Which set the next timer is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerSource {
    Timers,
    Deadlines,
    /// The read window of this kind closes (`KindSync::window_at`). Kept beside its kind, not
    /// in `timers`: one more variant of `TimerKey` slows every comparison in that set (measured
    /// with `scripts/bench-core-instructions`), and a window opens with most reads.
    Window(Kind),
}

/// Per-kind list state.
#[derive(Clone, Debug, Default)]
struct KindSync {
    /// The first list of this kind has completed.
    synced: bool,
    /// A relist is under way: the slots it listed carry its number (`Slot::listed_in`). The
    /// mark is on the record, so a record dropped and made again during the relist (its
    /// removal confirmed, then an `Applied` under its name) is questioned at `RelistDone` even
    /// if the relist had listed the name: one more read, never a removal. A shell's watcher does
    /// not interleave watch events with a relist's items, so this needs a shell bug to happen.
    relisting: bool,
    /// The number of the newest relist of this kind (the first is 1; 0 marks no relist).
    relist_at: u32,
    /// The newest LIST of this kind in flight.
    list_inflight: Option<EffectId>,
    /// Keys with an incarnation pending confirmation, and those whose read is due now.
    pending: Set<ModelKey>,
    due: Set<ModelKey>,
    /// When the coalescing window of this kind's reads closes: due keys wait until then. A
    /// timer (`next_timer`'s `TimerSource::Window`); its closing is all it does, and the keys
    /// go out in `issue_reads` in the same step.
    window_at: Option<Instant>,
}

impl KindSync {
    /// Due keys wait: for the LIST in flight, or for the window to close.
    fn reads_held(&self) -> bool {
        self.list_inflight.is_some() || self.window_at.is_some()
    }
}

/// Counters, for metrics and the simulator's reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub candidates: u64,
    pub phantom_deletes_suppressed: u64,
    pub deletes_confirmed: u64,
    pub cleanups_done: u64,
    pub live_gets: u64,
    pub live_lists: u64,
    pub reads_found: u64,
    pub reads_not_found: u64,
    pub reads_failed: u64,
    pub reads_timed_out: u64,
    pub effects_failed: u64,
    pub orphans_removed: u64,
    /// Orphan directories given up rather than trashed: their marker recorded a reserved model.
    pub orphans_given_up: u64,
}

/// The whole core state: an immutable value (clone is O(1)).
#[derive(Clone, Debug)]
pub struct State {
    config: Arc<Config>,
    prng: Prng,
    effect_id_next: u64,
    /// Steps handled so far: orders inputs of one millisecond (newest view wins).
    seq: u64,
    started: bool,
    /// Values are shared pointers: tree nodes move 8 bytes, not a whole record.
    slots: Map<ModelKey, Arc<Slot>>,
    /// Which slots map to each label key and ConfigMap key (collisions are rare but real).
    claims: Claims,
    kinds: [KindSync; 2],
    node: Option<Arc<NodeView>>,
    /// The step that gave `node`.
    node_seq: u64,
    node_reads: NodeReads,
    breaker: Breaker,
    root: Option<RootProbe>,
    inflight: Map<EffectId, Owner>,
    /// Every timer but the live reads' deadlines, which are apart in `deadlines`.
    timers: RunSet<(Instant, TimerKey)>,
    /// `TimerKey::ReadDeadline` timers, as (instant, read): added in this order (a read's
    /// deadline is its sending time plus one timeout), so adding one is an append.
    deadlines: RunSet<(Instant, EffectId)>,
    trash: OrdMap<String, Instant>,
    drift_started: bool,
    /// The step that asked for the newest snapshot observed, once one has been since this
    /// process started: until then, what a previous run left on the node is unknown
    /// (`claims::contest`).
    snapshot_seen: Option<u64>,
    /// Until the first snapshot comes: when a failed one is asked for again, and how many have
    /// failed (what waits for the first snapshot should not wait a whole drift period).
    snapshot_retry: Option<Instant>,
    snapshot_failures: u32,
    snapshot_inflight: Option<EffectId>,
    orphan_check: Option<Arc<OrphanCheck>>,
    /// Who uses each directory beneath the root that a download writes into or a model owns.
    dirs: Map<Arc<str>, Arc<shared::DirUse>>,
    /// Directories no model uses whose marker names a uid no record knows (nearly always none),
    /// as the last snapshot showed them or their last member left them: the record a model
    /// coming to use one takes (`shared::rest_shown`). At most one per directory the last
    /// snapshot showed or a model used since.
    dirs_rested: Map<Arc<str>, Arc<shared::DirUse>>,
    /// Directories an orphan sweep is moving to the trash.
    dirs_trashing: Set<Arc<str>>,
    /// A `TimerKey::Sweep` is set.
    sweep_set: bool,
    shutting_down: bool,
    stats: Stats,
    /// Effects over `effects_per_step_max` wait here, in order, for the next step; a non-empty
    /// backlog makes the core due at once. Bounded by what the models kept can need (at most
    /// one effect in flight per incarnation, one read per key, one snapshot, one probe).
    backlog: imbl::Vector<Effect>,
    /// The `now` of the latest step: time never goes backwards.
    now_last: Instant,
    /// Why a live read that timed out failed (from the config), kept rather than formatted
    /// for every timeout.
    read_timed_out: Arc<str>,
    /// Empty buffers for the next step's touched keys and due keys (their capacity only; a
    /// clone gets none).
    spare_keys: Vec<ModelKey>,
    spare_due: Vec<ModelKey>,
    /// An emptied list of effects a caller gave back (`recycle`), for the next step's output.
    spare_effects: Vec<Effect>,
}

/// What one step returns: effects for the shell to execute, in order, and notes for people
/// (logs, metrics), kept apart as str0m keeps events apart from transmits.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Output {
    pub effects: Vec<Effect>,
    pub notes: Vec<Note>,
}

/// The fold: the next state and the output for one input.
pub fn step(state: &State, now: Instant, input: Input) -> (State, Output) {
    let mut next = state.clone();
    let output = next.handle(now, input);
    (next, output)
}

/// The earliest instant at which the core wants a `Tick`.
pub fn next_deadline(state: &State) -> Option<Instant> {
    state.next_deadline()
}

/// Scratch of one step.
struct Step {
    now: Instant,
    seq: u64,
    /// Incarnations with something here that became candidates this step (for the breaker).
    candidates_here: u32,
    /// Destructive decisions of this step's input, taken once the breaker has counted it.
    verdicts: Vec<Verdict>,
    out: Vec<Effect>,
    notes: Vec<Note>,
    /// Models this step touched (deduplicated when the step settles; usually one).
    dirty: Vec<ModelKey>,
    /// A shared copy lost its last member this step: a snapshot follows soon.
    copy_released: bool,
    /// Models whose directory's membership changed this step: they decide again.
    dir_affected: Vec<ModelKey>,
}

impl Step {
    /// The effects, notes and touched keys; the other buffers are empty by now.
    #[inline(always)]
    fn into_parts(self) -> (Vec<Effect>, Vec<Note>, Vec<ModelKey>) {
        let Step { out, notes, dirty, verdicts, dir_affected, .. } = self;
        release_empty(verdicts);
        release_empty(dir_affected);
        (out, notes, dirty)
    }
}

/// Drops a buffer without a call when it never allocated (a step's buffers nearly always).
#[inline]
fn release_empty<T>(buffer: Vec<T>) {
    if buffer.capacity() == 0 {
        // Nothing to free: forgetting an unallocated vector leaks nothing.
        std::mem::forget(buffer);
    } else {
        drop(buffer);
    }
}

impl State {
    pub fn new(config: Config) -> State {
        State {
            prng: Prng::new(config.seed),
            read_timed_out: Arc::from(format!("live read timed out after {} ms", config.live_read_timeout_ms)),
            spare_keys: Vec::new(),
            spare_due: Vec::new(),
            spare_effects: Vec::new(),
            config: Arc::new(config),
            effect_id_next: 1,
            seq: 0,
            started: false,
            slots: Map::default(),
            claims: Claims::default(),
            kinds: Default::default(),
            node: None,
            node_seq: 0,
            node_reads: NodeReads::default(),
            breaker: Breaker::default(),
            root: None,
            inflight: Map::default(),
            timers: RunSet::new(),
            deadlines: RunSet::new(),
            trash: OrdMap::new(),
            drift_started: false,
            snapshot_seen: None,
            snapshot_retry: None,
            snapshot_failures: 0,
            snapshot_inflight: None,
            orphan_check: None,
            dirs: Map::default(),
            dirs_rested: Map::default(),
            dirs_trashing: Set::default(),
            sweep_set: false,
            shutting_down: false,
            stats: Stats::default(),
            backlog: imbl::Vector::new(),
            now_last: Instant::ZERO,
        }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    pub fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        if self.backlog_releasable() {
            return Some(self.now_last);
        }
        self.next_timer().map(|(at, _)| at)
    }

    /// Gives back a step's list of effects once the caller has taken them out, so that the
    /// next step's output reuses its room instead of allocating (a caller that never gives one
    /// back loses nothing). A list that grew large is dropped.
    pub fn recycle(&mut self, mut effects: Vec<Effect>) {
        const SPARE_EFFECTS_MAX: usize = 16;
        effects.clear();
        if effects.capacity() <= SPARE_EFFECTS_MAX && effects.capacity() > self.spare_effects.capacity() {
            self.spare_effects = effects;
        }
    }

    /// Effects decided but held for the next step (`effects_per_step_max`).
    pub fn backlog_len(&self) -> usize {
        self.backlog.len()
    }

    pub fn synced(&self, kind: Kind) -> bool {
        self.kinds[kind.index()].synced
    }

    /// Whether the core keeps any incarnation of `key` (the shell drops metric series of models
    /// it no longer keeps).
    pub fn knows(&self, key: &ModelKey) -> bool {
        self.slots.contains_key(key)
    }

    pub fn root(&self) -> Option<&RootProbe> {
        self.root.as_ref()
    }

    pub fn inflight_count(&self) -> usize {
        self.inflight.len()
    }

    /// Handle one input at `now`; returns the effects to execute, in order, and the notes.
    pub fn handle(&mut self, now: Instant, input: Input) -> Output {
        debug_assert!(now >= self.now_last, "time went backwards: {now:?} after {:?}", self.now_last);
        // A clock that steps back (a replayed trace edited by hand) is held at the latest time.
        let now = now.max(self.now_last);
        self.now_last = now;
        self.seq += 1;
        let mut st = Step {
            now,
            seq: self.seq,
            candidates_here: 0,
            verdicts: Vec::new(),
            out: std::mem::take(&mut self.spare_effects),
            notes: Vec::new(),
            dirty: std::mem::take(&mut self.spare_keys),
            copy_released: false,
            dir_affected: Vec::new(),
        };
        if !self.started {
            self.started = true;
            self.set_timer(now, TimerKey::RootProbe);
        }
        self.on_input(&mut st, input);
        if self.idle_after(&st) {
            // Most inputs change nothing (a watch event of a model as it is, a repeated
            // deletion of a model already in question, a late answer): the rest of the step
            // would find nothing to do.
            let (effects, notes, dirty) = st.into_parts();
            release_empty(std::mem::replace(&mut self.spare_keys, dirty));
            return Output { effects, notes };
        }
        self.fire_timers(&mut st);
        if st.candidates_here > 0 {
            self.count_candidates(&mut st);
        }
        if !st.verdicts.is_empty() {
            self.apply_verdicts(&mut st);
        }
        self.settle(&mut st);
        self.fill_disowns(&mut st);
        let (out, notes, dirty) = st.into_parts();
        release_empty(dirty);
        let effects = self.release_effects(out);
        #[cfg(debug_assertions)]
        if self.invariants_due()
            && let Err(broken) = self.invariants()
        {
            panic!("invariant broken after step {} at {now:?}: {broken}", self.seq);
        }
        Output { effects, notes }
    }

    /// Would the rest of the step, after its input, do nothing? Nothing was marked or decided,
    /// no timer is due, no read is due (and free to go: not held by a LIST in flight or a
    /// window, whose end is an input or a timer) or wanted, and no effect waits in the
    /// backlog. (The
    /// invariants hold still: the input changed nothing they read.)
    fn idle_after(&self, st: &Step) -> bool {
        st.dirty.is_empty()
            && st.out.is_empty()
            && st.notes.is_empty()
            && st.verdicts.is_empty()
            && st.candidates_here == 0
            && st.dir_affected.is_empty()
            && !st.copy_released
            && self.next_timer().is_none_or(|(at, _)| at > st.now)
            && self.kinds.iter().all(|k| k.due.is_empty() || k.reads_held())
            && !self.node_reads.wanted
            && self.backlog.is_empty()
    }

    /// Debug builds check the invariants after every step while the state is small, and then
    /// every (models / 32)-th step, so a debug agent's step stays O(1) amortised even with
    /// 20,000 models. The simulator and the property tests check after every step regardless.
    #[cfg(debug_assertions)]
    fn invariants_due(&self) -> bool {
        const SLOTS_CHECKED_PER_STEP: u64 = 32;
        let every = (self.slots.len() as u64 / SLOTS_CHECKED_PER_STEP).max(1);
        self.seq.is_multiple_of(every)
    }

    /// At most `effects_per_step_max` effects leave per step, the backlog's first. After
    /// shutdown, a destructive effect still waiting stays where it is: it never leaves.
    fn release_effects(&mut self, decided: Vec<Effect>) -> Vec<Effect> {
        let limit = self.config.effects_per_step_max.max(1);
        if self.backlog.is_empty() && decided.len() <= limit {
            return decided;
        }
        self.backlog.extend(decided);
        if !self.shutting_down {
            // Every effect may leave: the first `limit`, without rebuilding the rest.
            let rest = self.backlog.split_off(limit.min(self.backlog.len()));
            return std::mem::replace(&mut self.backlog, rest).into_iter().collect();
        }
        let mut released = Vec::new();
        let mut kept = imbl::Vector::new();
        for effect in std::mem::take(&mut self.backlog) {
            if released.len() < limit && !(self.shutting_down && effect.op.is_destructive()) {
                released.push(effect);
            } else {
                kept.push_back(effect);
            }
        }
        self.backlog = kept;
        debug_assert!(released.len() <= limit);
        released
    }

    /// Could the backlog release anything at the next step?
    fn backlog_releasable(&self) -> bool {
        self.backlog.iter().any(|e| !(self.shutting_down && e.op.is_destructive()))
    }

    // ------------------------------------------------------------------------------------------
    // Inputs
    // ------------------------------------------------------------------------------------------

    fn on_input(&mut self, st: &mut Step, input: Input) {
        match input {
            Input::Watch { kind, event } => self.on_watch(st, kind, event),
            Input::NodeObserved(node) => self.adopt_node(st, node, st.seq),
            Input::NodeRead { id, result } => self.on_node_read(st, id, Some(result)),
            Input::LiveRead { id, result } => self.finish_read(st, id, reads::ReadEnd::Get(result)),
            Input::LiveList { id, result } => self.finish_read(st, id, reads::ReadEnd::List(result)),
            Input::EffectDone { id, outcome } => self.on_effect_done(st, id, outcome),
            Input::RootProbed { probe, .. } => {
                if self.root.as_ref() != Some(&probe) {
                    self.root = Some(probe);
                    st.dirty.extend(self.slots.keys().cloned());
                }
            }
            Input::DriftObserved { id, snapshot } => {
                if let Some(Owner::Snapshot { requested_seq }) = self.inflight.get(&id).cloned() {
                    self.inflight.remove(&id);
                    self.snapshot_inflight = None;
                    self.on_snapshot(st, requested_seq, snapshot);
                }
            }
            Input::DownloadProgress { id, progress } => self.on_download_progress(st, id, progress),
            Input::Tick => {}
            Input::Shutdown => self.shutting_down = true,
        }
    }

    fn effect_id(&mut self) -> EffectId {
        let id = EffectId(self.effect_id_next);
        self.effect_id_next += 1;
        id
    }

    fn emit(&mut self, st: &mut Step, op: Op, owner: Option<Owner>) -> EffectId {
        debug_assert!(!(self.shutting_down && op.is_destructive()), "destructive effect after shutdown: {op:?}");
        Emitter {
            next_id: &mut self.effect_id_next,
            inflight: &mut self.inflight,
            out: &mut st.out,
            notes: &mut st.notes,
        }
        .emit(op, owner)
    }
}

/// Hands out effect ids and records who waits for each outcome.
struct Emitter<'a> {
    next_id: &'a mut u64,
    inflight: &'a mut Map<EffectId, Owner>,
    out: &'a mut Vec<Effect>,
    notes: &'a mut Vec<Note>,
}

impl Emitter<'_> {
    fn emit(&mut self, op: Op, owner: Option<Owner>) -> EffectId {
        let id = EffectId(*self.next_id);
        *self.next_id += 1;
        if let Some(owner) = owner {
            self.inflight.insert(id, owner);
        }
        self.out.push(Effect { id, op });
        id
    }
}

fn sorted(mut keys: Vec<ModelKey>) -> Vec<ModelKey> {
    keys.sort_unstable();
    keys
}

fn pending(cause: Cause, now: Instant, seq: u64) -> Life {
    Life::PendingConfirm {
        cause,
        attempt: 0,
        since: now,
        since_seq: seq,
        fresh_after: Instant::ZERO,
        read: ReadState::Due,
    }
}

fn set_read(inc: &mut Incarnation, state: ReadState) {
    if let Life::PendingConfirm { read, .. } = &mut inc.life {
        *read = state;
    }
}

/// A destructive decision about one uid, and when its evidence was sent (the breaker's input).
#[derive(Clone, Debug)]
struct Verdict {
    key: ModelKey,
    uid: Uid,
    decision: Decision,
    evidence_at: Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Confirm(Confirmation),
    Withdraw,
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bounds;
#[cfg(test)]
mod tests_collisions;
#[cfg(test)]
mod tests_downloads;
#[cfg(test)]
mod tests_reads;
#[cfg(test)]
mod tests_shared;
#[cfg(test)]
mod tests_views;
