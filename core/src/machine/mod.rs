//! The reconciler: a pure fold `step(&State, now, Input) -> (State, Vec<Effect>)`.
//!
//! Each step handles the input, fires the timers that are due, then, for every model the step
//! touched: starts placement-exit re-reads, issues the live reads that are due (coalesced into one
//! LIST per kind in a storm), and emits the next effect each incarnation needs. One effect per
//! incarnation is in flight at a time; its outcome comes back as an input.

pub mod io;
pub mod model_state;

use imbl::{OrdMap, OrdSet};

use crate::pcoll::{Map, Set};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use io::*;
use model_state::{Context, IncOp, eligible_now, next_op, want};
pub use model_state::{Fetched, Incarnation, Life, Plan, Published, ReadState, Slot, Want};

use crate::model::{Kind, ModelKey, ModelObject, Uid};
use crate::placement::NodeView;
use crate::prng::{Prng, backoff_ms};
use crate::time::Instant;
use crate::wire::{self, ModelStatus};

/// Who waits for an effect's outcome.
#[derive(Clone, Debug)]
enum Owner {
    Inc { key: ModelKey, uid: Uid, what: IncOp },
    Get { key: ModelKey, deadline: Instant },
    List { kind: Kind, keys: Arc<Vec<ModelKey>>, drift: bool, deadline: Instant },
    Snapshot { requested_seq: u64 },
    Purge { name: String },
    Orphan,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKey {
    /// Shared so that timer entries stay small in the ordered set.
    Inc(Arc<(ModelKey, Uid)>),
    ReadDeadline(EffectId),
    RootProbe,
    Drift,
    Purge(String),
}

/// Per-kind list state.
#[derive(Clone, Debug, Default)]
struct KindSync {
    /// The first list of this kind has completed.
    synced: bool,
    /// Keys seen since the current relist began.
    relisting: Option<Set<ModelKey>>,
    /// The newest LIST of this kind in flight.
    list_inflight: Option<EffectId>,
    /// Keys with an incarnation pending confirmation, and those whose read is due now.
    pending: Set<ModelKey>,
    due: Set<ModelKey>,
}

/// An orphan check: things on the node no known model claims, waiting for fresh LISTs.
#[derive(Clone, Debug, Default)]
struct OrphanCheck {
    labels: Vec<String>,
    entries: Vec<(String, Option<String>)>,
    dirs: Vec<OwnedDir>,
    lists: [Option<EffectId>; 2],
    listed: [Option<Arc<Vec<ModelObject>>>; 2],
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
}

/// The whole core state: an immutable value (clone is O(1)).
#[derive(Clone, Debug)]
pub struct State {
    config: Arc<Config>,
    prng: Prng,
    effect_id_next: u64,
    started: bool,
    /// Values are shared pointers: tree nodes move 8 bytes, not a whole record.
    slots: Map<ModelKey, Arc<Slot>>,
    kinds: [KindSync; 2],
    node: Option<Arc<NodeView>>,
    root: Option<RootProbe>,
    inflight: Map<EffectId, Owner>,
    timers: OrdSet<(Instant, TimerKey)>,
    trash: OrdMap<String, Instant>,
    drift_started: bool,
    snapshot_inflight: Option<EffectId>,
    orphan_check: Option<Arc<OrphanCheck>>,
    shutting_down: bool,
    stats: Stats,
}

/// The fold: the next state and the effects for one input.
pub fn step(state: &State, now: Instant, input: Input) -> (State, Vec<Effect>) {
    let mut next = state.clone();
    let effects = next.handle(now, input);
    (next, effects)
}

/// The earliest instant at which the core wants a `Tick`.
pub fn next_deadline(state: &State) -> Option<Instant> {
    state.next_deadline()
}

/// Scratch of one step.
struct Step {
    now: Instant,
    out: Vec<Effect>,
    /// Models this step touched (deduplicated when the step settles; usually one).
    dirty: Vec<ModelKey>,
}

/// A view of one incarnation, for tests, the simulator and logs.
#[derive(Clone, Debug, PartialEq)]
pub struct IncarnationView {
    pub key: ModelKey,
    pub uid: Uid,
    pub current: bool,
    pub life: Life,
    pub published: Published,
    pub fetched: Fetched,
    pub owned_dir: Option<String>,
    pub busy: bool,
}

/// One readiness check and why it fails.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// Readiness, as a pure function of state.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Vec<Check>,
}

impl State {
    pub fn new(config: Config) -> State {
        State {
            prng: Prng::new(config.seed),
            config: Arc::new(config),
            effect_id_next: 1,
            started: false,
            slots: Map::default(),
            kinds: Default::default(),
            node: None,
            root: None,
            inflight: Map::default(),
            timers: OrdSet::new(),
            trash: OrdMap::new(),
            drift_started: false,
            snapshot_inflight: None,
            orphan_check: None,
            shutting_down: false,
            stats: Stats::default(),
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
        self.timers.get_min().map(|(t, _)| *t)
    }

    pub fn synced(&self, kind: Kind) -> bool {
        self.kinds[kind.index()].synced
    }

    pub fn root(&self) -> Option<&RootProbe> {
        self.root.as_ref()
    }

    pub fn inflight_count(&self) -> usize {
        self.inflight.len()
    }

    /// Handle one input at `now`; returns the effects to execute, in order.
    pub fn handle(&mut self, now: Instant, input: Input) -> Vec<Effect> {
        let mut st = Step { now, out: Vec::new(), dirty: Vec::new() };
        if !self.started {
            self.started = true;
            self.set_timer(now, TimerKey::RootProbe);
        }
        self.on_input(&mut st, input);
        self.fire_timers(&mut st);
        self.settle(&mut st);
        st.out
    }

    // ------------------------------------------------------------------------------------------
    // Inputs
    // ------------------------------------------------------------------------------------------

    fn on_input(&mut self, st: &mut Step, input: Input) {
        match input {
            Input::Watch { kind, event } => self.on_watch(st, kind, event),
            Input::NodeObserved(node) => {
                if self.node.as_deref() != Some(&node) {
                    self.node = Some(Arc::new(node));
                    st.dirty.extend(self.slots.keys().cloned());
                }
            }
            Input::LiveRead { id, result } => self.on_live_read(st, id, result),
            Input::LiveList { id, result } => self.on_live_list(st, id, result),
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
            Input::Tick => {}
            Input::Shutdown => self.shutting_down = true,
        }
    }

    fn on_watch(&mut self, st: &mut Step, kind: Kind, event: WatchEvent) {
        let sync = &mut self.kinds[kind.index()];
        match event {
            WatchEvent::Applied(obj) if obj.key.kind == kind => self.on_object(st, obj),
            WatchEvent::Deleted(obj) if obj.key.kind == kind => {
                self.make_candidate(st, &obj.key, Some(&obj.uid), Cause::WatchDeleted);
            }
            WatchEvent::RelistStarted => sync.relisting = Some(Set::default()),
            WatchEvent::RelistItem(obj) if obj.key.kind == kind => {
                if let Some(seen) = &mut sync.relisting {
                    seen.insert(obj.key.clone());
                }
                self.on_object(st, obj);
            }
            WatchEvent::RelistDone => {
                if let Some(seen) = sync.relisting.take() {
                    let vanished: Vec<ModelKey> = self
                        .slots
                        .iter()
                        .filter(|(k, s)| {
                            k.kind == kind
                                && !seen.contains(*k)
                                && s.current.as_ref().is_some_and(|c| c.life == Life::Observed)
                        })
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in sorted(vanished) {
                        self.make_candidate(st, &key, None, Cause::RelistVanished);
                    }
                }
                self.kinds[kind.index()].synced = true;
                if !self.drift_started && Kind::ALL.iter().all(|k| self.kinds[k.index()].synced) {
                    // The first snapshot comes as soon as every kind is synced: it tells what a
                    // previous run left on the node.
                    self.drift_started = true;
                    self.set_timer(st.now, TimerKey::Drift);
                }
            }
            // An object on the wrong stream: a shell bug. Ignored rather than guessed at.
            WatchEvent::Applied(_) | WatchEvent::Deleted(_) | WatchEvent::RelistItem(_) => {}
        }
    }

    /// An object seen alive (watch, relist or live read).
    fn on_object(&mut self, st: &mut Step, obj: ModelObject) {
        // The common steady-state event changes nothing the core uses: no work to do.
        // (A read-only look: no copy-on-write path is taken for it.)
        if let Some(inc) = self.slots.get(&obj.key).and_then(|s| s.current.as_ref())
            && inc.uid() == &obj.uid
            && inc.obj.deleting == obj.deleting
            && inc.obj.spec == obj.spec
        {
            return;
        }
        let key = obj.key.clone();
        let obj = Arc::new(obj);
        let now = st.now;
        st.dirty.push(key.clone());
        let slot = Arc::make_mut(self.slots.entry(key.clone()).or_insert_with(|| {
            Arc::new(Slot { current: None, former: Vec::new(), indexed_pending: false, indexed_due: false })
        }));
        let mut confirmed = Vec::new();
        if let Some(inc) = slot.find_mut(&obj.uid) {
            // A uid already known: refresh, unless it is confirmed gone (a stale view).
            if !inc.is_confirmed() {
                inc.set_obj(obj.clone(), &self.config.models_root);
                if obj.deleting {
                    confirm(inc, Confirmation::Deleting, &mut confirmed);
                }
            }
        } else {
            let mut inc = Incarnation::new(obj.clone(), self.effect_id_next, &self.config.models_root);
            if obj.deleting {
                confirm(&mut inc, Confirmation::Deleting, &mut confirmed);
            }
            if let Some(mut old) = slot.current.replace(inc) {
                if old.life == Life::Observed {
                    old.life = pending(Cause::UidChanged, now);
                    self.stats.candidates += 1;
                }
                slot.former.push(old);
            }
        }
        self.note_confirmed(st, confirmed);
    }

    /// The incarnation with `uid` (the current one when `None`) becomes a deletion candidate.
    /// (Placement exits are marked by `prepare_key` and never counted as candidates.)
    fn make_candidate(&mut self, st: &mut Step, key: &ModelKey, uid: Option<&Uid>, cause: Cause) {
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        let inc = match uid {
            Some(uid) => slot.find_mut(uid),
            None => slot.current.as_mut(),
        };
        let Some(inc) = inc else { return };
        if inc.life == Life::Observed {
            debug_assert_ne!(cause, Cause::PlacementExit);
            inc.life = pending(cause, st.now);
            self.stats.candidates += 1;
            st.dirty.push(key.clone());
        }
    }

    fn on_live_read(&mut self, st: &mut Step, id: EffectId, result: ReadResult) {
        let Some(Owner::Get { key, deadline }) = self.inflight.get(&id).cloned() else { return };
        self.inflight.remove(&id);
        self.timers.remove(&(deadline, TimerKey::ReadDeadline(id)));
        self.count_read(&result);
        match result {
            ReadResult::Failed(reason) => {
                self.read_failed(st, id, std::slice::from_ref(&key), key.kind, &reason, false)
            }
            found_or_not => self.apply_read(st, id, &key, found_or_not),
        }
    }

    fn on_live_list(&mut self, st: &mut Step, id: EffectId, result: ListResult) {
        let Some(Owner::List { kind, keys, drift, deadline }) = self.inflight.get(&id).cloned() else { return };
        self.inflight.remove(&id);
        self.timers.remove(&(deadline, TimerKey::ReadDeadline(id)));
        let sync = &mut self.kinds[kind.index()];
        if sync.list_inflight == Some(id) {
            sync.list_inflight = None;
        }
        match result {
            ListResult::Failed(reason) => {
                self.stats.reads_failed += 1;
                self.read_failed(st, id, &keys, kind, &reason, true);
                if drift {
                    self.orphan_check = None;
                }
            }
            ListResult::Listed(objects) => {
                self.stats.reads_found += 1;
                let by_key: BTreeMap<&ModelKey, &ModelObject> =
                    objects.iter().filter(|o| o.key.kind == kind).map(|o| (&o.key, o)).collect();
                for key in keys.iter() {
                    let result = match by_key.get(key) {
                        Some(obj) => ReadResult::Found((*obj).clone()),
                        None => ReadResult::NotFound,
                    };
                    self.apply_read(st, id, key, result);
                }
                if drift {
                    self.orphan_list_done(st, id, kind, objects);
                }
            }
        }
    }

    fn count_read(&mut self, result: &ReadResult) {
        match result {
            ReadResult::Found(_) => self.stats.reads_found += 1,
            ReadResult::NotFound => self.stats.reads_not_found += 1,
            ReadResult::Failed(_) => self.stats.reads_failed += 1,
        }
    }

    /// A read answered (Found or NotFound) every incarnation of `key` that awaits it.
    fn apply_read(&mut self, st: &mut Step, id: EffectId, key: &ModelKey, result: ReadResult) {
        let models_root = &self.config.models_root;
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { return };
        let mut confirmed = Vec::new();
        let mut suppressed = Vec::new();
        let found = match result {
            ReadResult::Found(obj) if obj.key == *key => Some(Arc::new(obj)),
            _ => None,
        };
        for inc in slot.all_mut() {
            if !inc.awaits(id) {
                continue;
            }
            let Life::PendingConfirm { cause, .. } = inc.life else { continue };
            match &found {
                None => confirm(inc, Confirmation::NotFound, &mut confirmed),
                Some(obj) if obj.uid != *inc.uid() => confirm(inc, Confirmation::Replaced, &mut confirmed),
                Some(obj) if obj.deleting => {
                    inc.set_obj(obj.clone(), models_root);
                    confirm(inc, Confirmation::Deleting, &mut confirmed);
                }
                Some(obj) => {
                    inc.set_obj(obj.clone(), models_root);
                    inc.life = Life::Observed;
                    if cause == Cause::PlacementExit {
                        inc.exit_confirmed = true;
                    } else {
                        suppressed.push((inc.uid().clone(), cause));
                    }
                }
            }
        }
        self.stats.candidates += normalize(slot, st.now);
        // A uid this node never saw is the live object now: adopt it (below, once the slot is
        // released).
        let adopt = found.filter(|obj| !obj.deleting && slot.all().all(|i| i.uid() != &obj.uid && i.is_confirmed()));
        st.dirty.push(key.clone());
        for (uid, cause) in suppressed {
            self.stats.phantom_deletes_suppressed += 1;
            st.out.push(self.note(Note::PhantomSuppressed { key: key.clone(), uid, cause }));
        }
        self.note_confirmed(st, confirmed);
        if let Some(obj) = adopt {
            self.on_object(st, Arc::unwrap_or_clone(obj));
        }
    }

    fn read_failed(&mut self, st: &mut Step, id: EffectId, keys: &[ModelKey], kind: Kind, reason: &str, shared: bool) {
        let config = self.config.clone();
        // One delay for a whole LIST keeps its retry coalesced (O(kinds) calls, not O(models)).
        let mut shared_delay = None;
        let mut last_delay = None;
        for key in keys {
            let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { continue };
            for inc in slot.all_mut() {
                if !inc.awaits(id) {
                    continue;
                }
                let Life::PendingConfirm { attempt, read, .. } = &mut inc.life else { continue };
                let delay = match shared_delay {
                    Some(d) => d,
                    None => backoff_ms(*attempt, config.retry_delay_ms_min, config.retry_delay_ms_max, &mut self.prng),
                };
                if shared {
                    shared_delay = Some(delay);
                }
                *attempt = attempt.saturating_add(1);
                *read = ReadState::Waiting { at: st.now.plus_ms(delay) };
                last_delay = Some(delay);
                st.dirty.push(key.clone());
            }
        }
        if let Some(retry_in_ms) = last_delay {
            let key = (!shared).then(|| keys.first().cloned()).flatten();
            st.out.push(self.note(Note::ReadFailed { key, kind, reason: reason.to_string(), retry_in_ms }));
        }
    }

    fn on_effect_done(&mut self, st: &mut Step, id: EffectId, outcome: Outcome) {
        let Some(owner) = self.inflight.get(&id).cloned() else { return };
        let now = st.now;
        match owner {
            Owner::Inc { key, uid, what } => {
                self.inflight.remove(&id);
                let config = self.config.clone();
                let Some(inc) = self.slots.get_mut(&key).map(Arc::make_mut).and_then(|s| s.find_mut(&uid)) else {
                    return;
                };
                inc.inflight = None;
                inc.changed_seq = self.effect_id_next;
                st.dirty.push(key.clone());
                match (outcome, what) {
                    (Outcome::Done, what) => {
                        inc.failures = 0;
                        match what {
                            IncOp::Publish { status, reason } => inc.published = Published::Status { status, reason },
                            IncOp::Unpublish => inc.published = Published::Nothing,
                            IncOp::Fetch { plan } => {
                                if let Plan::Download { dest, .. } = &plan {
                                    inc.owned_dir = dest.beneath_root.clone();
                                }
                                inc.fetched = Fetched::Done { plan: Box::new(plan) };
                            }
                            IncOp::Trash { name } => {
                                inc.owned_dir = None;
                                let purge_at = now.plus_ms(config.trash_grace_ms);
                                self.trash.insert(name.clone(), purge_at);
                                self.set_timer(purge_at, TimerKey::Purge(name));
                            }
                        }
                    }
                    (Outcome::Failed(reason), IncOp::Fetch { plan }) => {
                        // The model is Failed on this node (published next), and fetched again later.
                        let delay = inc.failed_once(&config, &mut self.prng);
                        inc.fetched = Fetched::Failed {
                            plan: Box::new(plan),
                            reason: Arc::from(reason.as_str()),
                            retry_at: now.plus_ms(delay),
                        };
                        let note = Note::ModelFailed { key, uid, reason };
                        st.out.push(self.note(note));
                    }
                    (Outcome::Failed(reason), _) => {
                        let delay = inc.failed_once(&config, &mut self.prng);
                        inc.blocked_until = Some(now.plus_ms(delay));
                        self.stats.effects_failed += 1;
                        st.out.push(self.note(Note::EffectFailed { id, reason, retry_in_ms: delay }));
                    }
                }
            }
            Owner::Purge { name } => {
                self.inflight.remove(&id);
                match outcome {
                    Outcome::Done => {
                        self.trash.remove(&name);
                    }
                    Outcome::Failed(reason) => {
                        let delay = self.config.retry_delay_ms_max;
                        self.trash.insert(name.clone(), now.plus_ms(delay));
                        self.set_timer(now.plus_ms(delay), TimerKey::Purge(name));
                        self.stats.effects_failed += 1;
                        st.out.push(self.note(Note::EffectFailed { id, reason, retry_in_ms: delay }));
                    }
                }
            }
            Owner::Orphan => {
                self.inflight.remove(&id);
                match outcome {
                    Outcome::Done => self.stats.orphans_removed += 1,
                    // The next drift pass finds it again.
                    Outcome::Failed(reason) => {
                        self.stats.effects_failed += 1;
                        let retry_in_ms = self.config.drift_period_ms;
                        st.out.push(self.note(Note::EffectFailed { id, reason, retry_in_ms }));
                    }
                }
            }
            // Reads, probes and snapshots answer with their own inputs.
            Owner::Get { .. } | Owner::List { .. } | Owner::Snapshot { .. } => {}
        }
    }

    // ------------------------------------------------------------------------------------------
    // Drift
    // ------------------------------------------------------------------------------------------

    fn on_snapshot(&mut self, st: &mut Step, requested_seq: u64, snap: DriftSnapshot) {
        let now = st.now;
        // Hash sets with a fixed hasher: this pass is O(models) per node every period.
        let owned_by_uid: FxHashMap<&Uid, &OwnedDir> = snap.owned_dirs.iter().map(|d| (&d.uid, d)).collect();
        let mut known_uids: FxHashSet<Uid> = FxHashSet::default();
        let mut claimed_labels: FxHashSet<String> = FxHashSet::default();
        let mut claimed_entries: FxHashSet<String> = FxHashSet::default();
        for (key, shared) in self.slots.iter_mut() {
            let slot = Arc::make_mut(shared);
            let (label_key, cm_key) = (wire::label_key(key), wire::configmap_key(key));
            let label = snap.labels.get(&label_key).and_then(|v| ModelStatus::parse(v));
            let label_present = snap.labels.contains_key(&label_key);
            let entry = snap.entries.get(&cm_key);
            claimed_labels.insert(label_key);
            claimed_entries.insert(cm_key);
            let has_current = slot.current.is_some();
            for (i, inc) in slot.current.iter_mut().chain(slot.former.iter_mut()).enumerate() {
                known_uids.insert(inc.uid().clone());
                // Stale for this incarnation: something changed since the snapshot was asked for.
                if inc.inflight.is_some() || inc.changed_seq > requested_seq {
                    continue;
                }
                let label_is_its = i == 0 || !has_current;
                let entry_is_its = entry.is_some_and(|e| e.uid.as_deref().is_none_or(|u| u == inc.uid().as_str()));
                let seen_label = if label_is_its { label_present } else { false };
                let observed = match (seen_label, entry_is_its) {
                    (false, false) => Published::Nothing,
                    (true, true) => {
                        let entry_status = entry.and_then(|e| e.status);
                        match (&inc.published, label, entry_status) {
                            (Published::Status { status, .. }, Some(l), Some(e)) if *status == l && *status == e => {
                                inc.published.clone()
                            }
                            _ => Published::Drifted,
                        }
                    }
                    _ => Published::Drifted,
                };
                if observed != inc.published {
                    inc.published = observed;
                    st.dirty.push(key.clone());
                }
                match (owned_by_uid.get(inc.uid()), &inc.fetched) {
                    (Some(dir), _) if inc.owned_dir.is_none() => {
                        inc.owned_dir = Some(dir.path.clone());
                        st.dirty.push(key.clone());
                    }
                    // Ready, but the weights are gone from disk: fetch again (#834's drift).
                    (None, Fetched::Done { plan }) if matches!(**plan, Plan::Download { .. }) => {
                        inc.owned_dir = None;
                        inc.fetched = Fetched::No;
                        st.dirty.push(key.clone());
                    }
                    _ => {}
                }
            }
        }
        for name in &snap.trash {
            if !self.trash.contains_key(name) {
                let purge_at = now.plus_ms(self.config.trash_grace_ms);
                self.trash.insert(name.clone(), purge_at);
                self.set_timer(purge_at, TimerKey::Purge(name.clone()));
            }
        }
        // Orphans: what no known model claims. Only fresh LISTs of every kind can make them
        // removable; a snapshot alone never removes anything.
        let check = OrphanCheck {
            labels: snap
                .labels
                .keys()
                .filter(|l| wire::is_model_label(l) && !claimed_labels.contains(l.as_str()))
                .cloned()
                .collect(),
            entries: snap
                .entries
                .iter()
                .filter(|(k, e)| {
                    !claimed_entries.contains(k.as_str())
                        || e.uid.as_ref().is_some_and(|u| !known_uids.contains(&Uid::new(u)))
                })
                .map(|(k, e)| (k.clone(), e.uid.clone()))
                .collect(),
            dirs: snap.owned_dirs.iter().filter(|d| !known_uids.contains(&d.uid)).cloned().collect(),
            ..OrphanCheck::default()
        };
        let any = !check.labels.is_empty() || !check.entries.is_empty() || !check.dirs.is_empty();
        if any && !self.shutting_down && self.orphan_check.is_none() {
            let mut check = check;
            for kind in Kind::ALL {
                check.lists[kind.index()] = Some(self.issue_list(st, kind, true));
            }
            self.orphan_check = Some(Arc::new(check));
        }
    }

    fn orphan_list_done(&mut self, st: &mut Step, id: EffectId, kind: Kind, objects: Vec<ModelObject>) {
        let Some(check) = self.orphan_check.as_mut() else { return };
        if check.lists[kind.index()] != Some(id) {
            return;
        }
        Arc::make_mut(check).listed[kind.index()] = Some(Arc::new(objects));
        if check.listed.iter().any(Option::is_none) {
            return;
        }
        let check = self.orphan_check.take().expect("checked above");
        if self.shutting_down {
            return;
        }
        let listed = check.listed.iter().flatten().flat_map(|v| v.iter());
        let mut labels = BTreeSet::new();
        let mut entries = BTreeSet::new();
        let mut uids = BTreeSet::new();
        for obj in listed {
            labels.insert(wire::label_key(&obj.key));
            entries.insert(wire::configmap_key(&obj.key));
            uids.insert(obj.uid.clone());
        }
        for (key, slot) in self.slots.iter() {
            labels.insert(wire::label_key(key));
            entries.insert(wire::configmap_key(key));
            uids.extend(slot.all().map(|i| i.uid().clone()));
        }
        for label_key in check.labels.iter().filter(|l| !labels.contains(*l)) {
            self.emit(st, Op::RemoveOrphanLabel { label_key: label_key.clone() }, Some(Owner::Orphan));
        }
        for (cm_key, uid) in &check.entries {
            let orphan = match uid {
                Some(u) => !uids.contains(&Uid::new(u)),
                None => !entries.contains(cm_key),
            };
            if orphan {
                self.emit(st, Op::RemoveOrphanEntry { cm_key: cm_key.clone(), uid: uid.clone() }, Some(Owner::Orphan));
            }
        }
        for dir in check.dirs.iter().filter(|d| !uids.contains(&d.uid)) {
            let trash_name = format!("{}-{}", dir.uid, st.now.as_ms());
            let op = Op::TrashDir { key: None, uid: dir.uid.clone(), path: dir.path.clone(), trash_name };
            self.emit(st, op, Some(Owner::Orphan));
        }
    }

    // ------------------------------------------------------------------------------------------
    // Timers
    // ------------------------------------------------------------------------------------------

    fn set_timer(&mut self, at: Instant, key: TimerKey) {
        self.timers.insert((at, key));
    }

    fn fire_timers(&mut self, st: &mut Step) {
        while let Some((at, key)) = self.timers.get_min().cloned() {
            if at > st.now {
                break;
            }
            self.timers.remove(&(at, key.clone()));
            match key {
                TimerKey::Inc(id) => {
                    let (key, uid) = (*id).clone();
                    if let Some(inc) = self.slots.get_mut(&key).map(Arc::make_mut).and_then(|s| s.find_mut(&uid)) {
                        inc.timer_at = None;
                        inc.wake(st.now);
                        st.dirty.push(key);
                    }
                }
                TimerKey::ReadDeadline(id) => self.read_timed_out(st, id),
                TimerKey::RootProbe => {
                    // Any probe answer is news, whichever request it answers: no owner is kept,
                    // so unanswered probes leave nothing behind.
                    self.emit(st, Op::ProbeRoot, None);
                    self.set_timer(st.now.plus_ms(self.config.root_probe_period_ms), TimerKey::RootProbe);
                }
                TimerKey::Drift => {
                    // A snapshot never answered (the API was down) is replaced, not waited for:
                    // at most one is outstanding.
                    if let Some(old) = self.snapshot_inflight.take() {
                        self.inflight.remove(&old);
                    }
                    let requested_seq = self.effect_id_next;
                    let id = self.emit(st, Op::Snapshot, Some(Owner::Snapshot { requested_seq }));
                    self.snapshot_inflight = Some(id);
                    let period = self.config.drift_period_ms;
                    let jitter = self.prng.up_to(period / 10);
                    self.set_timer(st.now.plus_ms(period - jitter), TimerKey::Drift);
                }
                TimerKey::Purge(name) => {
                    let due = self.trash.get(&name).is_some_and(|t| *t <= st.now);
                    if due && !self.shutting_down {
                        self.emit(st, Op::PurgeTrash { name: name.clone() }, Some(Owner::Purge { name }));
                    }
                }
            }
        }
    }

    fn read_timed_out(&mut self, st: &mut Step, id: EffectId) {
        let reason = format!("live read timed out after {} ms", self.config.live_read_timeout_ms);
        match self.inflight.get(&id).cloned() {
            Some(Owner::Get { key, .. }) => {
                self.inflight.remove(&id);
                self.stats.reads_timed_out += 1;
                self.stats.reads_failed += 1;
                self.read_failed(st, id, std::slice::from_ref(&key), key.kind, &reason, false);
            }
            Some(Owner::List { kind, keys, drift, .. }) => {
                self.inflight.remove(&id);
                if self.kinds[kind.index()].list_inflight == Some(id) {
                    self.kinds[kind.index()].list_inflight = None;
                }
                self.stats.reads_timed_out += 1;
                self.stats.reads_failed += 1;
                self.read_failed(st, id, &keys, kind, &reason, true);
                if drift {
                    self.orphan_check = None;
                }
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------------------------------------
    // Settling a step: re-reads, reads, next effects, timers
    // ------------------------------------------------------------------------------------------

    fn settle(&mut self, st: &mut Step) {
        let mut dirty = std::mem::take(&mut st.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for key in &dirty {
            self.prepare_key(st.now, key);
        }
        let mut touched = self.issue_reads(st);
        touched.extend(dirty);
        touched.sort();
        touched.dedup();
        for key in &touched {
            self.settle_key(st, key);
        }
        // Keys marked while issuing reads were driven above.
        debug_assert!(st.dirty.iter().all(|k| touched.binary_search(k).is_ok()));
    }

    /// With one lookup: a model that no longer places here but may have something on the node
    /// is re-read before anything is withdrawn (not a deletion candidate); then the indexes.
    fn prepare_key(&mut self, now: Instant, key: &ModelKey) {
        let node = self.node.as_deref();
        let sync = &mut self.kinds[key.kind.index()];
        let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else {
            reindex_slot(sync, key, None);
            return;
        };
        if let Some(inc) = slot.current.as_mut().filter(|i| i.life == Life::Observed) {
            match eligible_now(inc, node) {
                Some(true) => inc.exit_confirmed = false,
                Some(false) if !inc.exit_confirmed => {
                    let something_here = !matches!(inc.published, Published::Nothing | Published::Unknown)
                        || inc.owned_dir.is_some()
                        || inc.inflight.is_some();
                    if something_here {
                        inc.life = pending(Cause::PlacementExit, now);
                    }
                }
                _ => {}
            }
        }
        reindex_slot(sync, key, Some(slot));
    }

    /// Issue the reads that are due: one LIST per kind when enough keys are due (or one is in
    /// flight already and will be followed by another), else one GET per key.
    fn issue_reads(&mut self, st: &mut Step) -> Vec<ModelKey> {
        let mut touched = Vec::new();
        for kind in Kind::ALL {
            let sync = &self.kinds[kind.index()];
            if sync.due.is_empty() || sync.list_inflight.is_some() {
                // A LIST in flight does not answer candidates made after it was sent: they are
                // read when it returns.
                continue;
            }
            if sync.due.len() >= self.config.coalesce_keys_min {
                touched.extend(sync.pending.iter().cloned());
                self.issue_list(st, kind, false);
            } else {
                for key in sorted(sync.due.iter().cloned().collect()) {
                    let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
                    let id = self.emit(
                        st,
                        Op::LiveGet { key: key.clone() },
                        Some(Owner::Get { key: key.clone(), deadline }),
                    );
                    self.set_timer(deadline, TimerKey::ReadDeadline(id));
                    self.stats.live_gets += 1;
                    if let Some(slot) = self.slots.get_mut(&key).map(Arc::make_mut) {
                        for inc in slot.all_mut().filter(|i| i.read_due()) {
                            set_read(inc, ReadState::InFlight { id });
                        }
                    }
                    touched.push(key);
                }
            }
        }
        // Their indexes are brought up to date when each touched key is settled, right after.
        touched
    }

    /// A quorum LIST of `kind` that answers every incarnation of the kind pending now whose read
    /// is not in flight (due or backing off: answering early is harmless).
    fn issue_list(&mut self, st: &mut Step, kind: Kind, drift: bool) -> EffectId {
        let keys = sorted(self.kinds[kind.index()].pending.iter().cloned().collect());
        let deadline = st.now.plus_ms(self.config.live_read_timeout_ms);
        let id = self.effect_id();
        let mut covered = Vec::new();
        for key in &keys {
            let Some(slot) = self.slots.get_mut(key).map(Arc::make_mut) else { continue };
            let mut any = false;
            for inc in slot.all_mut() {
                if matches!(inc.life, Life::PendingConfirm { read: ReadState::Due | ReadState::Waiting { .. }, .. }) {
                    set_read(inc, ReadState::InFlight { id });
                    any = true;
                }
            }
            if any {
                covered.push(key.clone());
                st.dirty.push(key.clone());
            }
        }
        let owner = Owner::List { kind, keys: Arc::new(covered), drift, deadline };
        self.inflight.insert(id, owner);
        st.out.push(Effect { id, op: Op::LiveList { kind } });
        self.set_timer(deadline, TimerKey::ReadDeadline(id));
        self.kinds[kind.index()].list_inflight = Some(id);
        self.stats.live_lists += 1;
        id
    }

    /// Drive one touched model with a single map lookup: emit what its incarnations need next,
    /// sync their timers and the per-kind indexes, and drop the record once it is empty.
    fn settle_key(&mut self, st: &mut Step, key: &ModelKey) {
        let State { slots, kinds, node, root, config, timers, inflight, effect_id_next, shutting_down, stats, .. } =
            self;
        let sync = &mut kinds[key.kind.index()];
        let Some(shared) = slots.get_mut(key) else {
            reindex_slot(sync, key, None);
            return;
        };
        let slot = Arc::make_mut(shared);
        let mut emitter = Emitter { next_id: effect_id_next, inflight, out: &mut st.out };
        let env =
            Env { node: node.as_deref(), root: root.as_ref(), config, shutting_down: *shutting_down, now: st.now };
        drive(&env, &mut emitter, timers, stats, key, slot);
        sync_timers(timers, key, slot);
        if slot.is_empty() {
            reindex_slot(sync, key, None);
            slots.remove(key);
        } else {
            reindex_slot(sync, key, Some(slot));
        }
    }

    fn effect_id(&mut self) -> EffectId {
        let id = EffectId(self.effect_id_next);
        self.effect_id_next += 1;
        id
    }

    fn emit(&mut self, st: &mut Step, op: Op, owner: Option<Owner>) -> EffectId {
        debug_assert!(!(self.shutting_down && op.is_destructive()), "destructive effect after shutdown: {op:?}");
        Emitter { next_id: &mut self.effect_id_next, inflight: &mut self.inflight, out: &mut st.out }.emit(op, owner)
    }

    fn note(&mut self, note: Note) -> Effect {
        Effect { id: self.effect_id(), op: Op::Note(note) }
    }

    fn note_confirmed(&mut self, st: &mut Step, confirmed: Vec<(ModelKey, Uid, Confirmation)>) {
        for (key, uid, confirmation) in confirmed {
            self.stats.deletes_confirmed += 1;
            st.dirty.push(key.clone());
            st.out.push(self.note(Note::DeleteConfirmed { key, uid, confirmation }));
        }
    }

    // ------------------------------------------------------------------------------------------
    // Views
    // ------------------------------------------------------------------------------------------

    pub fn incarnations(&self) -> Vec<IncarnationView> {
        sorted(self.slots.keys().cloned().collect()).iter().flat_map(|key| views(key, &self.slots[key])).collect()
    }

    pub fn incarnation(&self, key: &ModelKey, uid: &Uid) -> Option<IncarnationView> {
        views(key, self.slots.get(key)?).find(|v| &v.uid == uid)
    }

    pub fn model_count(&self) -> usize {
        self.slots.len()
    }

    /// Pending confirmations: how many, and since when the oldest waits.
    pub fn pending_confirmations(&self) -> (usize, Option<Instant>) {
        let mut count = 0;
        let mut oldest: Option<Instant> = None;
        for kind in Kind::ALL {
            for key in self.kinds[kind.index()].pending.iter() {
                for inc in self.slots.get(key).into_iter().flat_map(|s| s.all()) {
                    if let Life::PendingConfirm { since, cause, .. } = inc.life
                        && cause != Cause::PlacementExit
                    {
                        count += 1;
                        oldest = Some(oldest.map_or(since, |o| o.min(since)));
                    }
                }
            }
        }
        (count, oldest)
    }

    /// Models eligible here that download, i.e. that need a writable models root.
    pub fn models_needing_write(&self) -> Vec<ModelKey> {
        let node = self.node.as_deref();
        let keys = self
            .slots
            .iter()
            .filter_map(|(key, slot)| {
                let inc = slot.current.as_ref()?;
                let downloads = inc.obj.spec().and_then(|s| s.uri.as_ref().ok()).is_some_and(|u| u.downloads());
                (downloads && !inc.is_confirmed() && eligible_now(inc, node) == Some(true)).then(|| key.clone())
            })
            .collect::<Vec<_>>();
        sorted(keys)
    }

    /// Ready iff the first list of every kind completed and the models root exists, is a
    /// readable directory, and is writable when (and only when) write access is required.
    pub fn readiness(&self) -> Readiness {
        let mut checks = Vec::new();
        for kind in Kind::ALL {
            let synced = self.synced(kind);
            checks.push(Check {
                name: format!("{}-synced", kind.plural()),
                ok: synced,
                detail: if synced { "first list completed".into() } else { "waiting for the first list".into() },
            });
        }
        let root_path = &self.config.models_root;
        let (root_ok, root_detail) = match &self.root {
            None => (false, format!("models root {root_path} not probed yet")),
            Some(p) if !p.exists => (false, format!("models root {root_path} does not exist ({})", p.detail)),
            Some(p) if !p.is_dir => (false, format!("models root {root_path} is not a directory")),
            Some(p) if !p.readable => (false, format!("models root {root_path} is not readable ({})", p.detail)),
            Some(_) => (true, format!("models root {root_path} is a readable directory")),
        };
        checks.push(Check { name: "models-root".into(), ok: root_ok, detail: root_detail });
        let needing = self.models_needing_write();
        let required = match self.config.write_check {
            WriteCheck::Always => Some("--models-root-write-check=always".to_string()),
            WriteCheck::Never => None,
            WriteCheck::Auto if needing.is_empty() => None,
            WriteCheck::Auto => {
                let names: Vec<String> = needing.iter().take(5).map(ToString::to_string).collect();
                let more = if needing.len() > 5 { format!(" and {} more", needing.len() - 5) } else { String::new() };
                Some(format!("models that download are placed here: {}{more}", names.join(", ")))
            }
        };
        let writable = self.root.as_ref().is_some_and(|p| p.writable);
        let (ok, detail) = match (required, writable) {
            (None, true) => (true, "write access not required; models root is writable".to_string()),
            (None, false) => (true, "write access not required; models root is read-only".to_string()),
            (Some(why), true) => (true, format!("write access required ({why}); models root is writable")),
            (Some(why), false) => {
                let d = self.root.as_ref().map(|p| p.detail.as_str()).filter(|d| !d.is_empty());
                let d = d.map(|d| format!(" ({d})")).unwrap_or_default();
                (false, format!("models root {root_path} is read-only{d} but write access is required: {why}"))
            }
        };
        checks.push(Check { name: "models-root-writable".into(), ok, detail });
        Readiness { ready: checks.iter().all(|c| c.ok), checks }
    }
}

/// Hands out effect ids and records who waits for each outcome.
struct Emitter<'a> {
    next_id: &'a mut u64,
    inflight: &'a mut Map<EffectId, Owner>,
    out: &'a mut Vec<Effect>,
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

/// The parts of the state a decision about one model reads.
struct Env<'a> {
    node: Option<&'a NodeView>,
    root: Option<&'a RootProbe>,
    config: &'a Config,
    shutting_down: bool,
    now: Instant,
}

/// Emit the next effect of every incarnation of `key` that is free to act, and drop the
/// incarnations that are confirmed gone and fully cleaned up.
fn drive(
    env: &Env,
    emitter: &mut Emitter,
    timers: &mut OrdSet<(Instant, TimerKey)>,
    stats: &mut Stats,
    key: &ModelKey,
    slot: &mut Slot,
) {
    let mut actions: Vec<(Uid, Op, IncOp)> = Vec::new();
    let mut finished: Vec<Uid> = Vec::new();
    let former_owns_dir =
        slot.former.iter().any(|f| f.owned_dir.is_some() && !f.obj.spec().is_some_and(|s| s.reserve_artifact));
    // Earlier incarnations first: the current one acts only once none of them is pending, has an
    // effect in flight, or is given one now.
    let mut former_unsettled = false;
    for inc in slot.former.iter().chain(slot.current.iter()) {
        let is_current = slot.current.as_ref().is_some_and(|c| c.uid() == inc.uid());
        if !is_current && (inc.is_pending() || inc.inflight.is_some()) {
            former_unsettled = true;
        }
        if inc.inflight.is_some() || inc.blocked_until.is_some_and(|t| t > env.now) {
            continue;
        }
        // Any other incarnation not confirmed gone may be the live one and own the label.
        let label_fenced = slot.all().any(|o| o.uid() != inc.uid() && !o.is_confirmed() && o.claims_label());
        let ctx = Context {
            node: env.node,
            root: env.root,
            models_root: &env.config.models_root,
            label_fenced,
            former_owns_dir: is_current && former_owns_dir,
            predecessor_unsettled: is_current && former_unsettled,
        };
        let want = want(inc, &ctx);
        match next_op(key, inc, &want, &ctx, env.now) {
            Some((op, _)) if env.shutting_down && op.is_destructive() => {}
            Some((op, what)) => {
                former_unsettled |= !is_current;
                actions.push((inc.uid().clone(), op, what));
            }
            None if inc.is_confirmed() => finished.push(inc.uid().clone()),
            None => {}
        }
    }
    for (uid, op, what) in actions {
        if let IncOp::Publish { status: ModelStatus::Failed, reason } = &what {
            let reason = reason.as_deref().unwrap_or("Failed").to_string();
            let note = Note::ModelFailed { key: key.clone(), uid: uid.clone(), reason };
            emitter.emit(Op::Note(note), None);
        }
        let owner = Owner::Inc { key: key.clone(), uid: uid.clone(), what };
        let id = emitter.emit(op, Some(owner));
        if let Some(inc) = slot.find_mut(&uid) {
            inc.inflight = Some(id);
        }
    }
    for uid in &finished {
        let timer_at = slot.all().find(|i| i.uid() == uid).and_then(|i| i.timer_at);
        if slot.current.as_ref().is_some_and(|c| c.uid() == uid) {
            slot.current = None;
        } else {
            slot.former.retain(|f| f.uid() != uid);
        }
        if let Some(at) = timer_at {
            timers.remove(&(at, TimerKey::Inc(Arc::new((key.clone(), uid.clone())))));
        }
        stats.cleanups_done += 1;
    }
    if !finished.is_empty() {
        stats.candidates += normalize(slot, env.now);
    }
}

/// Keep a slot's shape true: an incarnation that is alive and unquestioned (`Observed`) is the
/// current one. A former found alive by a live read displaces the current; an empty or
/// confirmed-gone current gives way. A displaced `Observed` current becomes a candidate in turn
/// (returns how many), since two uids cannot both be alive under one name.
fn normalize(slot: &mut Slot, now: Instant) -> u64 {
    let Some(pos) = slot.former.iter().position(|f| f.life == Life::Observed) else { return 0 };
    let revived = slot.former.remove(pos);
    let mut candidates = 0;
    if let Some(mut displaced) = slot.current.replace(revived) {
        if displaced.life == Life::Observed {
            displaced.life = pending(Cause::UidChanged, now);
            candidates += 1;
        }
        slot.former.push(displaced);
    }
    debug_assert!(slot.former.iter().all(|f| f.life != Life::Observed), "one live incarnation per name");
    candidates
}

fn sync_timers(timers: &mut OrdSet<(Instant, TimerKey)>, key: &ModelKey, slot: &mut Slot) {
    for inc in slot.all_mut() {
        let want = inc.wake_at();
        if want == inc.timer_at {
            continue;
        }
        if let Some(at) = inc.timer_at {
            timers.remove(&(at, TimerKey::Inc(Arc::new((key.clone(), inc.uid().clone())))));
        }
        if let Some(at) = want {
            timers.insert((at, TimerKey::Inc(Arc::new((key.clone(), inc.uid().clone())))));
        }
        inc.timer_at = want;
    }
}

/// The slot remembers what is indexed, so the sets are only touched when membership changes.
fn reindex_slot(sync: &mut KindSync, key: &ModelKey, slot: Option<&mut Slot>) {
    let Some(slot) = slot else {
        sync.pending.remove(key);
        sync.due.remove(key);
        return;
    };
    let pending = slot.all().any(Incarnation::is_pending);
    let due = slot.all().any(Incarnation::read_due);
    set_membership(&mut sync.pending, key, &mut slot.indexed_pending, pending);
    set_membership(&mut sync.due, key, &mut slot.indexed_due, due);
}

/// Make `key`'s membership of `set` equal `member`, touching the set only on a change.
fn set_membership(set: &mut Set<ModelKey>, key: &ModelKey, indexed: &mut bool, member: bool) {
    if member == *indexed {
        return;
    }
    *indexed = member;
    if member {
        set.insert(key.clone());
    } else {
        set.remove(key);
    }
}

/// The views of one slot's incarnations, current first.
fn views<'a>(key: &'a ModelKey, slot: &'a Slot) -> impl Iterator<Item = IncarnationView> + 'a {
    slot.all().map(move |inc| IncarnationView {
        key: key.clone(),
        uid: inc.uid().clone(),
        current: slot.current.as_ref().is_some_and(|c| c.uid() == inc.uid()),
        life: inc.life.clone(),
        published: inc.published.clone(),
        fetched: inc.fetched.clone(),
        owned_dir: inc.owned_dir.clone(),
        busy: inc.inflight.is_some(),
    })
}

fn sorted(mut keys: Vec<ModelKey>) -> Vec<ModelKey> {
    keys.sort_unstable();
    keys
}

fn pending(cause: Cause, now: Instant) -> Life {
    Life::PendingConfirm { cause, attempt: 0, since: now, read: ReadState::Due }
}

fn set_read(inc: &mut Incarnation, state: ReadState) {
    if let Life::PendingConfirm { read, .. } = &mut inc.life {
        *read = state;
    }
}

fn confirm(inc: &mut Incarnation, confirmation: Confirmation, out: &mut Vec<(ModelKey, Uid, Confirmation)>) {
    if inc.is_confirmed() {
        return;
    }
    inc.life = Life::Confirmed { confirmation };
    out.push((inc.obj.key.clone(), inc.uid().clone(), confirmation));
}

#[cfg(test)]
mod tests;
