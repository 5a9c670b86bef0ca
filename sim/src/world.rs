//! The simulated world: a virtual clock, one seeded PRNG, the API server, and a fleet of nodes,
//! each running an agent (the real core, or the upstream model) behind a simulated shell that
//! executes effects against the ground truth. Every destructive effect is checked against the
//! ground truth at the moment it lands.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};

use model_agent_core::machine::{
    Config, DownloadEnd, DownloadResult, DriftSnapshot, Effect, Input, ListResult, NodeReadResult, Note, Op, Output,
    OwnedDir, ReadResult, RootProbe, WatchEvent,
};
use model_agent_core::placement::NodeView;
use model_agent_core::prng::Prng;
use model_agent_core::trace::Recorder;
use model_agent_core::wire::{self, EntryWrite, ModelStatus};
use model_agent_core::{Instant, Kind, ModelKey, ModelSpec, State, Uid};
use serde::Serialize;

use crate::api::{Api, Change, StoredEntry, set_shared};
use crate::history::{HISTORY_PRINTED, History, Step};
use crate::oracle;
use crate::upstream::Upstream;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    Core,
    Upstream,
}

impl AgentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentKind::Core => "core",
            AgentKind::Upstream => "upstream",
        }
    }
}

pub enum Agent {
    Core(Box<State>),
    Upstream(Box<Upstream>),
    /// The process is not running (crashed, or exited after SIGTERM).
    Stopped,
}

/// How a relist is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListShape {
    /// A quorum list: the truth.
    Quorum,
    /// From a server lagging this many resourceVersions behind; the watch then replays from there.
    Stale { lag_rv: u64 },
    /// Answered before the server's cache synced: empty (the node-feature-discovery #1802 shape).
    Empty,
    /// A page fails part-way: the watcher starts over with another Init, then lists correctly.
    Partial,
}

/// Latencies (ms): each `_max` draw is uniform in 1..=max, each `_min`/`_max` pair in min..=max.
#[derive(Clone, Debug)]
pub struct Timing {
    pub watch_ms_max: u64,
    /// From an effect's emission to the moment the shell executes it (a live read is then
    /// served: its answer holds the object as it is at that instant).
    pub effect_ms_max: u64,
    pub download_ms_max: u64,
    pub relist_ms_max: u64,
    /// From a live read being served to its answer reaching the agent: an answer may arrive
    /// after newer watch events for the same object (or after the core's read deadline).
    pub read_ms_min: u64,
    pub read_ms_max: u64,
    /// How far the Node watch lags the Node object (per node, in order).
    pub node_watch_ms_min: u64,
    pub node_watch_ms_max: u64,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            watch_ms_max: 50,
            effect_ms_max: 20,
            download_ms_max: 5_000,
            relist_ms_max: 2_000,
            read_ms_min: 1,
            read_ms_max: 30,
            node_watch_ms_min: 1,
            node_watch_ms_max: 50,
        }
    }
}

pub struct SimNode {
    pub agent: Agent,
    /// Bumped at every (re)start: effects and deliveries of an earlier process are dropped.
    pub generation: u32,
    pub root_writable: bool,
    /// `local://` paths that do not exist on this node.
    pub missing_local: BTreeSet<String>,
    /// Directories beneath the models root with this agent's ownership marker (path → the
    /// uids it names).
    pub dirs: BTreeMap<String, BTreeSet<Uid>>,
    /// (path, uid) where the marker at `path` records `uid` as reserved (`OwnedDir::reserved`);
    /// pruned with the marker (`prune_reserved_marks`).
    pub reserved_marks: BTreeSet<(String, Uid)>,
    /// What source each directory's files are from: the storage URI of the last download that
    /// completed into it (the shell's manifest, written last). A cancelled download leaves it as
    /// it was; a trashed directory takes it along.
    pub files: BTreeMap<String, Arc<str>>,
    /// Symlinks the agent made beneath the root, by path.
    pub links: BTreeMap<String, Link>,
    /// Paths where something the agent did not make is in the way of a link.
    pub occupied: BTreeSet<String>,
    pub trash: BTreeSet<String>,
    /// Downloads sent and not yet executed: (directory, uid) → (process generation, effect). A
    /// trash by that uid while the running process's download runs is a violation (cancel, wait,
    /// then trash); another uid's download there fails on the marker, as in the real shell.
    downloads_running: BTreeMap<(String, Uid), (u32, model_agent_core::machine::EffectId)>,
    /// Downloads the core cancelled before they executed: they stop with their marker written.
    downloads_cancelled: BTreeSet<model_agent_core::machine::EffectId>,
    pub connected: bool,
    stream_at: [u64; 2],
    /// The Node watch's position: its deliveries stay in order.
    node_stream_at: u64,
    wake_at: Option<u64>,
    pub shutdown: bool,
    pub restarts: u32,
    /// When the running agent process started.
    pub started_at: u64,
    /// Uid → the reserve label of the newest view of it delivered to the running agent process
    /// (only uids it was shown reserved): an agent cannot keep for a model what it never saw
    /// reserved (a label set during an outage, the model gone before the agent reconnected).
    pub reserve_views: BTreeMap<Uid, bool>,
    pub recorder: Option<Recorder>,
    /// The last steps of this node's agent (kept across restarts, cleared by none).
    pub history: History,
}

impl SimNode {
    /// The marker at `path` records `uid` as reserved, or no longer does.
    fn set_reserved_mark(&mut self, path: &str, uid: &Uid, reserved: bool) {
        let mark = (path.to_string(), uid.clone());
        match reserved {
            true => _ = self.reserved_marks.insert(mark),
            false => _ = self.reserved_marks.remove(&mark),
        }
    }

    /// Forgets the reserve records of uids the marker at `path` no longer names (a marker
    /// rewritten or removed takes its records along, as the shell's does).
    fn prune_reserved_marks(&mut self, path: &str) {
        if self.reserved_marks.is_empty() {
            return;
        }
        let marker = self.dirs.get(path);
        self.reserved_marks.retain(|(p, uid)| p != path || marker.is_some_and(|m| m.contains(uid)));
    }
}

/// A symlink to a shared copy (issue 10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    /// The copy it points at, beneath the root.
    pub copy: String,
    /// The uid whose `Op::Link` made it (or last found it in place).
    pub uid: Uid,
    /// The agent process that did: a link an earlier process left is unknown to this one (the
    /// snapshot does not report symlinks).
    pub generation: u32,
}

/// What happened, for the report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Counters {
    pub label_removals: u64,
    pub entry_removals: u64,
    pub dir_removals: u64,
    /// Destructive effects against an object alive, with that uid, and placed on that node.
    pub label_removals_live: u64,
    pub entry_removals_live: u64,
    pub dir_removals_live: u64,
    pub api_get: u64,
    pub api_list: u64,
    pub phantom_deletes_suppressed: u64,
    pub deletes_confirmed: u64,
    /// Withdrawals the agents asked for (`Unpublish`, `TrashDir`), right or wrong.
    pub unpublish_effects: u64,
    pub trash_effects: u64,
    pub downloads: u64,
    /// Downloads the core cancelled before they landed (a delete or exit during a download).
    pub downloads_cancelled: u64,
    /// Shared copies (`_artifacts/...`) a download created on a node, symlinks made to them,
    /// symlinks removed, and copies moved to the trash (issue 10).
    pub copies_made: u64,
    pub links_made: u64,
    pub unlinks: u64,
    pub copies_trashed: u64,
    /// Shared copies removed by hand (`Action::RemoveCopies`).
    pub copies_removed_by_hand: u64,
    /// Downloads the simulated shell refused before the core's first snapshot because the
    /// marker names a uid it was not given, over files of another source (`HeldFromOtherSource`).
    pub other_source_refusals: u64,
    /// Models at a same-path directory whose storage URI the swarm switched (`Action::Source`).
    pub source_switches: u64,
    /// Reserve labels the swarm turned on or off (`Action::Reserve`).
    pub reserve_toggles: u64,
    /// Downloads that replaced the files of a live, Ready model of another source (damage).
    pub other_source_replaced: u64,
}

impl Counters {
    pub fn withdrawals(&self) -> u64 {
        self.unpublish_effects + self.trash_effects
    }
}

/// One mark on the timeline picture.
#[derive(Clone, Debug)]
pub struct Mark {
    pub t: u64,
    pub node: usize,
    pub what: MarkKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkKind {
    /// A candidate that a live read showed alive.
    Phantom,
    /// A deletion confirmed.
    Confirmed,
    Read,
    /// A destructive effect that was right.
    Cleanup,
    /// A destructive effect against a live object.
    Damage(Removed),
    Relist,
}

/// What a damaging effect removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    Label,
    Entry,
    Dir,
}

enum Ev {
    Deliver {
        node: usize,
        generation: u32,
        kind: Kind,
        event: WatchEvent,
    },
    Execute {
        node: usize,
        generation: u32,
        effect: Effect,
    },
    /// A live read's answer, computed when it was served, arriving now.
    Answer {
        node: usize,
        generation: u32,
        input: Input,
    },
    /// The Node watch shows the node as it was when the change was made.
    NodeDeliver {
        node: usize,
        generation: u32,
        view: NodeView,
    },
    /// A list's events, in order (a relist's start, items and end): one entry, not one per item,
    /// as the events of one instant on one stream would run back to back anyway.
    DeliverList {
        node: usize,
        generation: u32,
        kind: Kind,
        events: Vec<WatchEvent>,
    },
    /// A wipe of the node's labels may end now.
    WipeEnd {
        node: usize,
    },
    Wake {
        node: usize,
        generation: u32,
    },
}

/// Violations kept per run; more are counted but not stored.
pub const VIOLATIONS_KEPT_MAX: usize = 100;

pub struct World {
    pub now: u64,
    pub prng: Prng,
    seed: u64,
    /// Per instant, its events in the order they were scheduled (which is the order they run).
    queue: BTreeMap<u64, VecDeque<Ev>>,
    pub api: Api,
    pub nodes: Vec<SimNode>,
    pub agent_kind: AgentKind,
    pub config: Config,
    pub timing: Timing,
    pub counters: Counters,
    pub violations: Vec<String>,
    pub violation_count: u64,
    /// Per node, the uids that were ever published there: what a real delete must clean up.
    /// (Per node rather than one map of pairs: 10^6 pairs make every lookup a long walk.)
    pub published_ever: Vec<FxHashSet<Arc<str>>>,
    /// Per node, which uid last wrote each label (labels carry no uid of their own).
    pub label_writer: Vec<FxHashMap<Arc<str>, Arc<str>>>,
    /// Per mille of live reads that never answer (the core's deadline must catch them).
    pub read_timeout_permille: u64,
    pub marks: Option<Vec<Mark>>,
    /// Wall time by kind of step (`bench --by-kind`); `None` reads no clock.
    pub profile: Option<Box<crate::profile::StepProfile>>,
    pub record_traces: bool,
    /// Check the core's invariants and keep the history after every step (see `Options`).
    pub audit_every_step: bool,
    pub events_processed: u64,
    /// The last steps of the node the first violation was about.
    pub history_dump: Vec<String>,
    /// Per node, uid → the last instant the ground truth did not place that uid on that node
    /// (recorded when a Node's labels or a model's spec change).
    unplaced_until: Vec<BTreeMap<String, u64>>,
    /// The last instant each model's spec was written (created or changed by the user).
    spec_written_at: BTreeMap<ModelKey, u64>,
    /// The last instant a user's change gave each model another storage URI.
    source_changed_at: BTreeMap<ModelKey, u64>,
    /// Uids deleted while they carried the reserve label (set before the agents' view of specs
    /// may lag), with the instant of the delete.
    reserved_deleted_at: BTreeMap<Uid, u64>,
    /// Per node, directories whose marker named such a uid when it was deleted (path → uid), until
    /// a download completes there or its disown leaves the marker to a live model using the files
    /// (`used_by_a_kept_uid`): the marker may no longer name it (given up, rewritten) while the
    /// files are still its.
    reserved_paths: Vec<BTreeMap<String, Uid>>,
    /// Per node, shared copies removed by hand (`Action::RemoveCopies`) and not downloaded since:
    /// a Ready label on one is not held against the agent, which learns of the removal at its
    /// next drift pass (the end of a run checks that it did).
    removed_by_hand: Vec<BTreeSet<String>>,
}

impl World {
    pub fn new(nodes: usize, agent_kind: AgentKind, seed: u64) -> World {
        let config = Config::new("node", "/mnt/models");
        World {
            now: 0,
            prng: Prng::new(seed ^ 0x5EED_0F51_u64),
            seed,
            queue: BTreeMap::new(),
            api: Api::new(nodes),
            nodes: (0..nodes)
                .map(|_| SimNode {
                    agent: Agent::Stopped,
                    generation: 0,
                    root_writable: true,
                    missing_local: BTreeSet::new(),
                    dirs: BTreeMap::new(),
                    reserved_marks: BTreeSet::new(),
                    files: BTreeMap::new(),
                    links: BTreeMap::new(),
                    occupied: BTreeSet::new(),
                    trash: BTreeSet::new(),
                    downloads_running: BTreeMap::new(),
                    downloads_cancelled: BTreeSet::new(),
                    connected: false,
                    stream_at: [0, 0],
                    node_stream_at: 0,
                    wake_at: None,
                    shutdown: false,
                    restarts: 0,
                    started_at: 0,
                    reserve_views: BTreeMap::new(),
                    recorder: None,
                    history: History::default(),
                })
                .collect(),
            agent_kind,
            config,
            timing: Timing::default(),
            counters: Counters::default(),
            violations: Vec::new(),
            violation_count: 0,
            published_ever: vec![FxHashSet::default(); nodes],
            label_writer: vec![FxHashMap::default(); nodes],
            read_timeout_permille: 0,
            marks: None,
            profile: None,
            record_traces: false,
            audit_every_step: true,
            events_processed: 0,
            history_dump: Vec::new(),
            unplaced_until: vec![BTreeMap::new(); nodes],
            spec_written_at: BTreeMap::new(),
            source_changed_at: BTreeMap::new(),
            reserved_deleted_at: BTreeMap::new(),
            reserved_paths: vec![BTreeMap::new(); nodes],
            removed_by_hand: vec![BTreeSet::new(); nodes],
        }
    }

    fn schedule(&mut self, t: u64, ev: Ev) {
        self.queue.entry(t).or_default().push_back(ev);
    }

    fn latency(&mut self, max: u64) -> u64 {
        1 + self.prng.up_to(max.saturating_sub(1))
    }

    /// Uniform in min..=max (no draw when the range is one value).
    fn span(&mut self, min: u64, max: u64) -> u64 {
        if max <= min { min } else { min + self.prng.up_to(max - min) }
    }

    pub fn violation(&mut self, text: String) {
        self.violation_count += 1;
        if self.violations.len() < VIOLATIONS_KEPT_MAX {
            self.violations.push(format!("t={}ms {text}", self.now));
        }
    }

    /// A violation about one node (and maybe one model): the first one also keeps the last
    /// steps of that node's history for the report.
    pub fn violation_on(&mut self, node: usize, key: Option<&ModelKey>, text: String) {
        if self.history_dump.is_empty() {
            self.history_dump = self.nodes[node].history.dump(node, key, HISTORY_PRINTED);
        }
        self.violation(format!("node {node}: {text}"));
    }

    fn mark(&mut self, node: usize, what: MarkKind) {
        if let Some(marks) = &mut self.marks {
            marks.push(Mark { t: self.now, node, what });
        }
    }

    // ------------------------------------------------------------------------------------------
    // Running
    // ------------------------------------------------------------------------------------------

    /// Process every event up to `t` (inclusive), then set the clock to `t`.
    pub fn run_until(&mut self, t: u64) {
        while let Some(mut instant) = self.queue.first_entry() {
            if *instant.key() > t {
                break;
            }
            self.now = *instant.key();
            let ev = instant.get_mut().pop_front().expect("an instant in the queue has an event");
            if instant.get().is_empty() {
                instant.remove();
            }
            self.events_processed += 1;
            self.process(ev);
        }
        self.now = t;
    }

    pub fn run_for(&mut self, ms: u64) {
        self.run_until(self.now + ms);
    }

    fn process(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { node, generation, kind, event } => {
                if self.nodes[node].generation == generation && self.nodes[node].connected {
                    self.feed(node, Input::Watch { kind, event });
                }
            }
            Ev::DeliverList { node, generation, kind, events } => {
                // Counted as the events they are (the first one is counted by the caller).
                self.events_processed += events.len().saturating_sub(1) as u64;
                for event in events {
                    if self.nodes[node].generation == generation && self.nodes[node].connected {
                        self.feed(node, Input::Watch { kind, event });
                    }
                }
            }
            Ev::Execute { node, generation, effect } => {
                if self.nodes[node].generation == generation
                    && let Some(input) = self.execute_timed(node, &effect)
                {
                    if matches!(effect.op, Op::LiveGet { .. } | Op::LiveGetNode | Op::LiveList { .. }) {
                        let at = self.now + self.span(self.timing.read_ms_min, self.timing.read_ms_max);
                        self.schedule(at, Ev::Answer { node, generation, input });
                    } else {
                        self.feed(node, input);
                    }
                }
            }
            Ev::Answer { node, generation, input } => {
                if self.nodes[node].generation == generation {
                    self.feed(node, input);
                }
            }
            Ev::NodeDeliver { node, generation, view } => {
                if self.nodes[node].generation == generation && self.nodes[node].connected {
                    self.feed(node, Input::NodeObserved(view));
                }
            }
            Ev::WipeEnd { node } => {
                if self.api.wiped_until[node].is_some_and(|t| t <= self.now) {
                    self.record_unplaced(Some(node), None);
                    self.api.wiped_until[node] = None;
                    self.node_changed(node);
                }
            }
            Ev::Wake { node, generation } => {
                if self.nodes[node].generation == generation {
                    self.nodes[node].wake_at = None;
                    self.feed(node, Input::Tick);
                }
            }
        }
    }

    fn check_invariants(&mut self, node: usize) {
        let broken = match &self.nodes[node].agent {
            Agent::Core(state) => state.invariants().err(),
            _ => None,
        };
        if let Some(broken) = broken {
            self.violation_on(node, None, format!("core invariant broken: {broken}"));
        }
    }

    /// Every node's core invariants, now (after a run that did not check them at every step).
    pub fn check_invariants_now(&mut self) {
        for node in 0..self.nodes.len() {
            self.check_invariants(node);
        }
    }

    /// Hand one input to a node's agent and schedule what it asks for.
    pub fn feed(&mut self, node: usize, input: Input) {
        self.note_reserve_views(node, &input);
        let now = Instant(self.now);
        let audit = self.audit_every_step;
        // Kept for the history and the recorder only (a benchmark run has neither).
        let kept = (audit || self.nodes[node].recorder.is_some()).then(|| input.clone());
        let timed = self.profile.is_some().then(|| (input.kind_name(), std::time::Instant::now()));
        let (output, state) = match &mut self.nodes[node].agent {
            Agent::Core(state) => (state.handle(now, input), audit.then(|| (**state).clone())),
            Agent::Upstream(up) => (Output { effects: up.handle(now, input), notes: Vec::new() }, None),
            Agent::Stopped => return,
        };
        if let (Some(profile), Some((kind, started))) = (&mut self.profile, timed) {
            profile.add(crate::profile::Side::Handle, kind, started);
        }
        if let (Some(rec), Some(kept)) = (&mut self.nodes[node].recorder, &kept) {
            rec.record(now, kept, &output);
        }
        if let (true, Some(input)) = (audit, kept) {
            let (effects, notes) = (output.effects.clone(), output.notes.clone());
            self.nodes[node].history.push(Step { t: self.now, input, effects, notes, state });
            // The core's own invariants after every step, in release builds too (the core checks
            // them itself only in debug builds).
            self.check_invariants(node);
        }
        for note in &output.notes {
            self.note(node, note);
        }
        let generation = self.nodes[node].generation;
        let mut effects = output.effects;
        for effect in effects.drain(..) {
            if self.nodes[node].shutdown && effect.op.is_destructive() {
                let text = format!("destructive effect after shutdown began: {:?}", effect.op);
                self.violation_on(node, None, text);
            }
            match &effect.op {
                Op::Unpublish { .. } => self.counters.unpublish_effects += 1,
                Op::TrashDir { .. } => self.counters.trash_effects += 1,
                Op::Download { dest, uid, .. } => {
                    self.counters.downloads += 1;
                    if let Some(path) = dest.beneath_root() {
                        let running = (generation, effect.id);
                        self.nodes[node].downloads_running.insert((path.to_string(), uid.clone()), running);
                    }
                }
                _ => {}
            }
            let delay = match effect.op {
                Op::Download { .. } => self.latency(self.timing.download_ms_max),
                _ => self.latency(self.timing.effect_ms_max),
            };
            self.schedule(self.now + delay, Ev::Execute { node, generation, effect });
        }
        if let Agent::Core(state) = &mut self.nodes[node].agent {
            state.recycle(effects);
        }
        let deadline = match &self.nodes[node].agent {
            Agent::Core(state) => state.next_deadline().map(Instant::as_ms),
            _ => None,
        };
        if let Some(t) = deadline {
            let t = t.max(self.now);
            if self.nodes[node].wake_at.is_none_or(|w| t < w) {
                self.nodes[node].wake_at = Some(t);
                self.schedule(t, Ev::Wake { node, generation });
            }
        }
    }

    fn note(&mut self, node: usize, note: &Note) {
        match note {
            Note::PhantomSuppressed { .. } => {
                self.counters.phantom_deletes_suppressed += 1;
                self.mark(node, MarkKind::Phantom);
            }
            Note::DeleteConfirmed { .. } => {
                self.counters.deletes_confirmed += 1;
                self.mark(node, MarkKind::Confirmed);
            }
            _ => {}
        }
    }

    // ------------------------------------------------------------------------------------------
    // The simulated shell
    // ------------------------------------------------------------------------------------------

    fn execute_timed(&mut self, node: usize, effect: &Effect) -> Option<Input> {
        let Some(started) = self.profile.is_some().then(std::time::Instant::now) else {
            return self.execute(node, effect);
        };
        let input = self.execute(node, effect);
        if let Some(profile) = &mut self.profile {
            profile.add(crate::profile::Side::Execute, effect.op.kind_name(), started);
        }
        input
    }

    /// A live read of a model, of the Node or of a kind, with the read faults in force; `None`
    /// when it is lost (timed out).
    fn exec_read(&mut self, node: usize, id: model_agent_core::machine::EffectId, op: &Op) -> Option<Input> {
        match op {
            Op::LiveList { .. } => self.counters.api_list += 1,
            _ => self.counters.api_get += 1,
        }
        let fault = self.read_fault(node)?;
        Some(match (op, fault) {
            (Op::LiveGet { .. }, Some(reason)) => Input::LiveRead { id, result: ReadResult::Failed(reason) },
            (Op::LiveGet { key }, None) => {
                let result = self.api.get(key).map_or(ReadResult::NotFound, ReadResult::Found);
                Input::LiveRead { id, result }
            }
            (Op::LiveGetNode, Some(reason)) => Input::NodeRead { id, result: NodeReadResult::Failed(reason) },
            (Op::LiveGetNode, None) => Input::NodeRead { id, result: NodeReadResult::Found(self.api.node_view(node)) },
            (Op::LiveList { .. }, Some(reason)) => Input::LiveList { id, result: ListResult::Failed(reason) },
            (Op::LiveList { kind, .. }, None) => {
                Input::LiveList { id, result: ListResult::Listed(self.api.list(*kind, None)) }
            }
            _ => unreachable!("exec_read is given live reads only"),
        })
    }

    fn execute(&mut self, node: usize, effect: &Effect) -> Option<Input> {
        let id = effect.id;
        let down = self.api.down;
        let unavailable = || Input::EffectDone { id, outcome: fail("the API server is unavailable") };
        match &effect.op {
            Op::LiveGet { .. } | Op::LiveGetNode | Op::LiveList { .. } => self.exec_read(node, id, &effect.op),
            Op::Publish { key, uid, label_key, label, cm_key, entry } => {
                self.exec_publish(node, id, (key, uid), (label_key, label), (cm_key, entry))
            }
            Op::Unpublish { key, uid, label_key, remove_label, cm_key } => {
                self.exec_unpublish(node, id, (key, uid), (label_key, *remove_label), cm_key)
            }
            Op::VerifyLocal { path, .. } => {
                let missing = self.nodes[node].missing_local.contains(path);
                Some(Input::EffectDone { id, outcome: local_outcome(path, missing) })
            }
            Op::Download { dest, uid, storage_uri, co_owners, keep_marked, other_source, reserve, .. } => self
                .exec_download(node, id, (dest, storage_uri), (uid, *reserve), (co_owners, *keep_marked, other_source)),
            Op::Resolve { storage_uri, .. } => Some(resolved(id, storage_uri)),
            Op::Link { uid, link, copy, .. } => Some(self.exec_link(node, id, uid, link, copy)),
            Op::Unlink { link, copy, .. } => Some(self.exec_unlink(node, id, link, copy)),
            // Never asked for: the simulated shell reports no metadata.
            Op::FillSpec { .. } => Some(if down { unavailable() } else { done(id) }),
            // Stopped when it would have executed: it then reports Cancelled, its marker written.
            Op::CancelDownload { download } => self.exec_cancel(node, *download),
            Op::TrashDir { key, uid, path, trash_name } => {
                self.exec_trash(node, id, key.is_none(), (uid, path, trash_name))
            }
            Op::DisownDir { uid, path, keep, .. } => Some(self.exec_disown(node, id, uid, path, keep)),
            Op::RecordReserve { uid, path, reserved, .. } => {
                Some(self.exec_record_reserve(node, id, uid, path, *reserved))
            }
            Op::PurgeTrash { name } => {
                self.nodes[node].trash.remove(name);
                Some(done(id))
            }
            Op::RemoveOrphanLabel { label_key } => {
                Some(if down { unavailable() } else { self.exec_remove_orphan_label(node, id, label_key) })
            }
            Op::RemoveOrphanEntry { cm_key, uid } => self.exec_remove_orphan_entry(node, id, cm_key, uid.as_ref()),
            Op::ProbeRoot => {
                let probe = RootProbe::healthy(self.nodes[node].root_writable);
                let probe =
                    if probe.writable { probe } else { RootProbe { detail: "mounted read-only".into(), ..probe } };
                Some(Input::RootProbed { id, probe })
            }
            Op::Snapshot => self.exec_snapshot(node, id),
        }
    }

    fn exec_remove_orphan_label(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        label_key: &str,
    ) -> Input {
        self.check_label_scope(node, label_key);
        if self.api.labels[node].remove(label_key).is_some() {
            self.removed_label(node, label_key);
        }
        done(id)
    }

    fn exec_publish(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        (key, uid): (&ModelKey, &Uid),
        (label_key, label): (&str, &Option<ModelStatus>),
        (cm_key, entry): (&str, &wire::ModelEntry),
    ) -> Option<Input> {
        let unavailable = || Input::EffectDone { id, outcome: fail("the API server is unavailable") };
        if self.api.down {
            return Some(unavailable());
        }
        self.check_label_scope(node, label_key);
        // Another live uid's entry is overwritten only by a colliding model that
        // outranks it (ClusterBaseModel, then older, then smaller uid).
        if let Some(other) = self.api.entries[node].get(cm_key).and_then(|e| e.uid.as_deref())
            && other != uid.as_str()
            && let Some(theirs) = self.api.live_here(other, node)
            && !self.api.outranks(key, uid.as_str(), theirs)
        {
            let other = other.to_string();
            self.violation_on(node, Some(key), format!("{key} uid {uid} overwrote the entry of live uid {other}"));
        }
        if let Some(status) = label {
            set_shared(&mut self.api.labels[node], &mut self.api.strings, label_key, status.as_str());
            set_shared(&mut self.label_writer[node], &mut self.api.strings, label_key, uid.as_str());
        }
        if *label == Some(ModelStatus::Ready) {
            self.check_ready_on_its_files(node, uid);
        }
        let api = &mut self.api;
        let held = api.entries[node].get(cm_key);
        // Most publishes rewrite what is there: the uid is looked up among the shared strings
        // only for a write that changes something.
        if held.is_none_or(|h| h.status != entry.status || h.uid.as_deref() != entry.uid.as_deref()) {
            let value = StoredEntry { status: entry.status, uid: entry.uid.as_deref().map(|u| api.strings.get(u)) };
            wire::put_entry(&mut api.entries[node], cm_key, &value, |k| api.strings.get(k));
        }
        if !self.published_ever[node].contains(uid.as_str()) {
            self.published_ever[node].insert(self.api.strings.get(uid.as_str()));
        }
        Some(Input::EffectDone { id, outcome: model_agent_core::machine::Outcome::Done })
    }

    fn exec_unpublish(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        (key, uid): (&ModelKey, &Uid),
        (label_key, remove_label): (&str, bool),
        cm_key: &str,
    ) -> Option<Input> {
        let unavailable = || Input::EffectDone { id, outcome: fail("the API server is unavailable") };
        if self.api.down {
            return Some(unavailable());
        }
        self.check_label_scope(node, label_key);
        if remove_label && self.api.labels[node].remove(label_key).is_some() {
            self.removed_label(node, label_key);
        }
        let withdraw = EntryWrite::Withdraw { cm_key: cm_key.to_string(), uid: uid.as_str().to_string() };
        let (_, removed) = wire::apply_entry_writes(&mut self.api.entries[node], &[withdraw]);
        if !removed.is_empty() {
            self.removed_entry(node, uid.as_str(), cm_key);
            if let Some(change) = self.api.controller_check(key) {
                self.fanout(change);
            }
        }
        Some(done(id))
    }

    fn exec_cancel(&mut self, node: usize, download: model_agent_core::machine::EffectId) -> Option<Input> {
        self.counters.downloads_cancelled += 1;
        self.nodes[node].downloads_cancelled.insert(download);
        None
    }

    fn exec_download(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        (dest, storage_uri): (&model_agent_core::dest_path::DestPath, &str),
        (uid, reserve): (&Uid, bool),
        marker_rule: (&[Uid], bool, &[Uid]),
    ) -> Option<Input> {
        let cancelled = self.nodes[node].downloads_cancelled.remove(&id);
        if let Some(path) = dest.beneath_root() {
            let key = (path.to_string(), uid.clone());
            if self.nodes[node].downloads_running.get(&key).is_some_and(|(_, running)| *running == id) {
                self.nodes[node].downloads_running.remove(&key);
            }
        }
        if !self.nodes[node].root_writable {
            return Some(Input::EffectDone { id, outcome: fail("read-only file system") });
        }
        let Some(path) = dest.beneath_root() else {
            self.violation_on(node, None, format!("download outside the models root: {}", dest.absolute()));
            return Some(Input::EffectDone { id, outcome: fail("outside the models root") });
        };
        let owners = match self.download_owners(node, (dest, storage_uri), uid, marker_rule) {
            Ok(owners) => owners,
            Err(reason) => return Some(Input::EffectDone { id, outcome: fail(&reason) }),
        };
        if let Some(link) = self.nodes[node].links.get(path) {
            // As the shell does: a symlinked destination is refused. A process must never try
            // one it made or knows of; one an earlier process left is beyond what it can know.
            if link.generation == self.nodes[node].generation {
                self.violation_on(node, None, format!("download into {path}, which is a symlink"));
            }
            return Some(Input::EffectDone { id, outcome: fail(&format!("{path} is a symlink (never followed)")) });
        }
        let marked = self.nodes[node].dirs.insert(path.to_string(), owners);
        // As the shell records it: this uid's reserve label as the op carries it, the others'
        // as the marker had them (none for a marker made now).
        let n = &mut self.nodes[node];
        if reserve || !n.reserved_marks.is_empty() {
            n.set_reserved_mark(path, uid, reserve);
            n.prune_reserved_marks(path);
        }
        self.counters.copies_made += u64::from(marked.is_none() && is_copy(path));
        if cancelled {
            let end = DownloadEnd { marked: true, result: DownloadResult::Cancelled };
            return Some(Input::EffectDone { id, outcome: model_agent_core::machine::Outcome::Downloaded(end) });
        }
        let before = self.nodes[node].files.insert(path.to_string(), Arc::from(storage_uri));
        // A live model downloaded there since: the files are its now.
        self.reserved_paths[node].remove(path);
        self.removed_by_hand[node].remove(path);
        if let (Some(before), Some(marked)) = (before, marked) {
            self.check_replaced(node, path, (uid, storage_uri), (&before, &marked));
        }
        Some(done(id))
    }

    /// The uids the marker names once a download into `path` starts, or why the shell refuses
    /// it, as the real shell decides (`download::plan::owned_manifest`): a marker that names
    /// none of the owners (this uid and its co-owners) is another model's. Files not of this
    /// download's source (its whole URI: the shell's manifest keeps repository and revision)
    /// are left alone while the marker names a live model of another source the core gave
    /// (`other_source`), or, before the core's first snapshot (`keep_marked`), any uid outside
    /// the owners, files or none (`HeldFromOtherSource`). The marker then names the owners, and
    /// with `keep_marked` every uid it named too.
    fn download_owners(
        &mut self,
        node: usize,
        (dest, storage_uri): (&model_agent_core::dest_path::DestPath, &str),
        uid: &Uid,
        (co_owners, keep_marked, other_source): (&[Uid], bool, &[Uid]),
    ) -> Result<BTreeSet<Uid>, String> {
        let (path, absolute) = (dest.beneath_root().unwrap_or_default(), dest.absolute());
        let mut owners: BTreeSet<Uid> = co_owners.iter().chain(std::iter::once(uid)).cloned().collect();
        let n = &self.nodes[node];
        let Some(marker) = n.dirs.get(path) else { return Ok(owners) };
        if marker.is_disjoint(&owners) {
            return Err(format!("{absolute} belongs to uids {marker:?}"));
        }
        let files = n.files.get(path);
        if files.is_none_or(|f| **f != *storage_uri) {
            let named = || marker.iter().find(|u| other_source.contains(u)).filter(|_| files.is_some());
            let unknown = || marker.iter().find(|u| !owners.contains(*u)).filter(|_| keep_marked);
            if let Some(holder) = named().or_else(unknown) {
                self.counters.other_source_refusals += 1;
                let files = files.map_or("an unfinished download", |f| &**f);
                return Err(format!(
                    "{path} holds files of {files}, and its ownership marker names uid {holder}, a model of \
                     another source or one not known here yet: left alone while that model may use them"
                ));
            }
        }
        if keep_marked {
            owners.extend(marker.iter().cloned());
        }
        Ok(owners)
    }

    /// A download of `storage_uri` by `uid` completed into `path`, whose files were of `before`
    /// and whose marker named `marked`: damage when a uid it named is a model alive and placed
    /// here whose spec still wants `before`'s files at `path`, labelled Ready on this node by
    /// that uid (README, "Same path, same source"). Decided from the ground truth alone. Not
    /// held against the agent: a shared copy (its path names its commit), and a model whose
    /// spec or placement changed within `decision_window_ms` (the download may have been
    /// decided before the agent could know).
    fn check_replaced(
        &mut self,
        node: usize,
        path: &str,
        (uid, storage_uri): (&Uid, &str),
        (before, marked): (&str, &BTreeSet<Uid>),
    ) {
        if is_copy(path) || before == storage_uri {
            return;
        }
        let since = self.now.saturating_sub(self.decision_window_ms());
        let harmed = marked.iter().filter(|u| *u != uid).find_map(|u| {
            let obj = self.api.live_here(u.as_str(), node)?;
            let wants = *obj.spec().storage_uri == *before
                && oracle::download_dir(obj.spec(), &self.config.models_root).as_deref() == Some(path);
            let label = wire::label_key(&obj.key);
            let ready = self.api.labels[node].get(label.as_str()).is_some_and(|v| **v == *ModelStatus::Ready.as_str())
                && self.label_writer[node].get(label.as_str()).is_some_and(|w| **w == *u.as_str());
            let moved = self.unplaced_until[node].get(u.as_str()).is_some_and(|&t| t >= since);
            let changed = self.spec_written_at.get(&obj.key).is_some_and(|&t| t >= since);
            (wants && ready && !moved && !changed).then(|| obj.key.clone())
        });
        if let Some(key) = harmed {
            self.counters.other_source_replaced += 1;
            self.mark(node, MarkKind::Damage(Removed::Dir));
            let text = format!(
                "a download of {storage_uri} by uid {uid} replaced the files of live Ready {key} from {before} at {path}"
            );
            self.violation_on(node, Some(&key), text);
        }
    }

    /// A Ready label for a model that downloads where the node holds no files of the source it
    /// was fetched from, at its path or in its shared copy: it would be served weights that are
    /// gone or another model's. The core's claim is its own record of the fetch (it may not have
    /// seen a newer spec yet); the upstream model's, the spec. Decided from the ground truth
    /// (only the agents change what a node's directories hold), with no allowance.
    fn check_ready_on_its_files(&mut self, node: usize, uid: &Uid) {
        let Some(obj) = self.api.live_here(uid.as_str(), node) else { return };
        let (key, spec) = (&obj.key, obj.spec());
        let download_dir;
        let claim: Option<(&str, &str)> = match &self.nodes[node].agent {
            Agent::Core(state) => state.fetched_into(key, uid),
            _ if oracle::reuses(spec) => None,
            _ => {
                download_dir = oracle::download_dir(spec, &self.config.models_root);
                download_dir.as_deref().map(|dir| (&*spec.storage_uri, dir))
            }
        };
        let Some((source, dir)) = claim else { return };
        if self.removed_by_hand[node].contains(dir) {
            return;
        }
        let held = self.nodes[node].files.get(dir);
        // A shared copy's path names its commit: whoever downloaded it, it is this one's.
        if held.is_some_and(|h| **h == *source || is_copy(dir)) {
            return;
        }
        let text = format!("{key} uid {uid} labelled Ready on {dir}, which holds {held:?}, not {source}'s files");
        let key = key.clone();
        self.violation_on(node, Some(&key), text);
    }

    /// The orphan sweep is about to trash `path`: damage when its marker names a model deleted
    /// while it carried the reserve label, whose delete the running agent process saw (it
    /// started before; a process that started after never knew the model was reserved) and
    /// which it was last shown reserved. The
    /// agent gives such a directory up when the delete is confirmed (`Op::DisownDir`).
    /// What the running agent process was last shown of each uid's reserve label, from the
    /// objects in an input (none is kept for a model never shown reserved).
    fn note_reserve_views(&mut self, node: usize, input: &Input) {
        let objects: &[Arc<model_agent_core::ModelObject>] = match input {
            Input::Watch {
                event: WatchEvent::Applied(o) | WatchEvent::Deleted(o) | WatchEvent::RelistItem(o), ..
            } => std::slice::from_ref(o),
            Input::LiveRead { result: ReadResult::Found(o), .. } => std::slice::from_ref(o),
            Input::LiveList { result: ListResult::Listed(objs), .. } => objs,
            _ => return,
        };
        let views = &mut self.nodes[node].reserve_views;
        for o in objects {
            match o.spec().is_some_and(|s| s.reserve_artifact) {
                true => _ = views.insert(o.uid.clone(), true),
                false if !views.is_empty() => {
                    if let Some(v) = views.get_mut(&o.uid) {
                        *v = false;
                    }
                }
                false => {}
            }
        }
    }

    /// Not checked for shared copies: a reserved model's link to one is removed at its delete,
    /// and the copy goes to the sweep when no live model may use it (README, "Not done").
    fn check_sweep_spares_reserved(&mut self, node: usize, path: &str) {
        if is_copy(path) {
            return;
        }
        let started_at = self.nodes[node].started_at;
        let Some(marker) = self.nodes[node].dirs.get(path) else { return };
        let shown = &self.nodes[node].reserve_views;
        let kept_for = self.reserved_paths[node].get(path);
        let reserved = marker.iter().chain(kept_for).find(|u| {
            self.reserved_deleted_at.get(*u).is_some_and(|&t| t >= started_at) && shown.get(*u) == Some(&true)
        });
        if let Some(uid) = reserved.cloned() {
            let text =
                format!("the sweep trashes {path}, the weights of reserved uid {uid} deleted since this agent started");
            self.violation_on(node, None, text);
        }
        // Whenever it was deleted: the marker says the model was reserved.
        let n = &self.nodes[node];
        let recorded = n
            .dirs
            .get(path)
            .into_iter()
            .flatten()
            .find(|u| n.reserved_marks.contains(&(path.to_string(), (*u).clone())));
        if let Some(uid) = recorded.cloned() {
            let text = format!("the sweep trashes {path}, whose marker records uid {uid} as reserved");
            self.violation_on(node, None, text);
        }
    }

    /// `by_sweep`: the orphan sweep's (no model's), checked by `check_sweep_spares_reserved`.
    fn exec_trash(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        by_sweep: bool,
        (uid, path, trash_name): (&Uid, &str, &str),
    ) -> Option<Input> {
        if path.starts_with('/') || path.split('/').any(|c| c == "..") {
            self.violation_on(node, None, format!("trash of a path not beneath the root: {path}"));
            return Some(Input::EffectDone { id, outcome: fail("refused") });
        }
        if by_sweep {
            self.check_sweep_spares_reserved(node, path);
        }
        let generation = self.nodes[node].generation;
        let running = self.nodes[node].downloads_running.iter().any(|((p, _), (g, _))| p == path && *g == generation);
        if running {
            self.violation_on(node, None, format!("{path} trashed while a download into it still runs"));
        }
        if self.nodes[node].dirs.get(path).is_some_and(|marker| marker.contains(uid)) {
            let marker = self.nodes[node].dirs.remove(path).expect("checked");
            self.nodes[node].prune_reserved_marks(path);
            let files = self.nodes[node].files.remove(path);
            self.nodes[node].trash.insert(trash_name.to_string());
            self.counters.dir_removals += 1;
            self.counters.copies_trashed += u64::from(is_copy(path));
            match self.user_of(node, path, &marker, files.as_deref()) {
                Some(user) => {
                    self.counters.dir_removals_live += 1;
                    self.mark(node, MarkKind::Damage(Removed::Dir));
                    let key = self.api.key_of(user.as_str());
                    self.violation_on(
                        node,
                        key.as_ref(),
                        format!("weights of live uid {user} at {path} moved to trash"),
                    );
                }
                None => self.mark(node, MarkKind::Cleanup),
            }
        }
        Some(done(id))
    }

    /// A live uid placed here that uses `path`: one its marker names whose weights are there
    /// (its own download's path, unless the files there are of another source than its; or
    /// its shared copy; a marker of one owner names the user of anything but a copy), or one
    /// whose path holds a symlink to it (a shared copy). A model whose storage URI became that
    /// of the files within `spec_view_window_ms` is not held against the agent: the trash may
    /// have been decided on its old spec, which named other files (swarm seed 700004880: the
    /// change came 3 ms before the trash).
    fn user_of(&self, node: usize, path: &str, marker: &BTreeSet<Uid>, files: Option<&str>) -> Option<Uid> {
        let root = &self.config.models_root;
        let since = self.now.saturating_sub(self.spec_view_window_ms());
        let switched_to_files = |o: &crate::api::ApiObject| {
            files.is_some() && self.source_changed_at.get(&o.key).is_some_and(|&t| t >= since)
        };
        let keeps = |o: &crate::api::ApiObject| {
            (oracle::download_dir(o.spec(), root).as_deref() == Some(path)
                && files.is_none_or(|f| *f == *o.spec().storage_uri)
                && !switched_to_files(o))
                || oracle::copy_dir(o.spec()).as_deref() == Some(path)
                || (marker.len() == 1 && !is_copy(path))
        };
        let named = marker.iter().find(|u| self.damages(u.as_str(), node).is_some_and(keeps)).cloned();
        named.or_else(|| self.linked_user(node, path))
    }

    /// A live uid placed here whose path holds a symlink to the copy `path`: the uid that made
    /// it, or the model whose path it is (a re-created one may find its predecessor's link).
    fn linked_user(&self, node: usize, path: &str) -> Option<Uid> {
        let root = &self.config.models_root;
        let links = self.nodes[node].links.iter().filter(|(_, l)| l.copy == path);
        links.into_iter().find_map(|(link, l)| {
            let maker = self.damages(l.uid.as_str(), node).map(|o| o.uid.clone());
            maker.or_else(|| {
                let owner = self.api.objects.values().find(|o| {
                    oracle::download_dir(o.spec(), root).as_deref() == Some(link.as_str())
                        && oracle::copy_dir(o.spec()).as_deref() == Some(path)
                })?;
                self.damages(owner.uid.as_str(), node).map(|o| o.uid.clone())
            })
        })
    }

    /// A symlink where nothing is (on a writable root); the same link already there is done
    /// (and is now `uid`'s); anything else is occupied.
    fn exec_link(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        uid: &Uid,
        link: &str,
        copy: &str,
    ) -> Input {
        let n = &mut self.nodes[node];
        let occupied = n.occupied.contains(link) || n.dirs.contains_key(link);
        let outcome =
            |reason: String| Input::EffectDone { id, outcome: model_agent_core::machine::Outcome::Occupied(reason) };
        if !n.root_writable {
            return Input::EffectDone { id, outcome: fail("read-only file system") };
        }
        let made = Link { copy: copy.to_string(), uid: uid.clone(), generation: n.generation };
        match n.links.get_mut(link) {
            Some(l) if l.copy == copy => {
                *l = made;
                done(id)
            }
            Some(_) => outcome("another link".into()),
            None if occupied => outcome(format!("{link} exists")),
            None => {
                n.links.insert(link.to_string(), made);
                self.counters.links_made += 1;
                done(id)
            }
        }
    }

    /// A marker naming `uid` keeps only the uids of `keep` it names, and goes when it names
    /// none; the files stay.
    fn exec_disown(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        uid: &Uid,
        path: &str,
        keep: &[Uid],
    ) -> Input {
        let n = &mut self.nodes[node];
        if !n.root_writable {
            return Input::EffectDone { id, outcome: fail("read-only file system") };
        }
        if let Some(marker) = n.dirs.get_mut(path).filter(|m| m.contains(uid)) {
            marker.retain(|u| u != uid && keep.contains(u));
            if marker.is_empty() {
                n.dirs.remove(path);
            }
            n.prune_reserved_marks(path);
        }
        if self.reserved_paths[node].contains_key(path) && self.used_by_a_kept_uid(node, path) {
            // The files are as much a live model's here that uses them: its delete may remove
            // them, as the core's own trash at its delete always could (swarm seed 23100, where
            // they went by the sweep once it left them to a model never placed here).
            self.reserved_paths[node].remove(path);
        }
        done(id)
    }

    /// Does the marker of `path`, as a disown left it, name a live model placed on `node` whose
    /// download directory `path` is? A uid only named (away from the node, never placed here)
    /// does not use the files.
    fn used_by_a_kept_uid(&self, node: usize, path: &str) -> bool {
        let root = &self.config.models_root;
        let Some(marker) = self.nodes[node].dirs.get(path) else { return false };
        marker.iter().any(|u| {
            self.api
                .live_here(u.as_str(), node)
                .is_some_and(|o| oracle::download_dir(o.spec(), root).as_deref() == Some(path))
        })
    }

    /// As the shell's `fsops::record_reserve`: only a marker that names `uid` records it.
    fn exec_record_reserve(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        uid: &Uid,
        path: &str,
        reserved: bool,
    ) -> Input {
        let n = &mut self.nodes[node];
        if !n.root_writable {
            return Input::EffectDone { id, outcome: fail("read-only file system") };
        }
        if n.dirs.get(path).is_some_and(|m| m.contains(uid)) {
            n.set_reserved_mark(path, uid, reserved);
        }
        done(id)
    }

    /// Removed only while it points at `copy`; anything else there is left alone.
    fn exec_unlink(&mut self, node: usize, id: model_agent_core::machine::EffectId, link: &str, copy: &str) -> Input {
        let n = &mut self.nodes[node];
        if !n.root_writable {
            return Input::EffectDone { id, outcome: fail("read-only file system") };
        }
        if n.links.get(link).is_some_and(|l| l.copy == copy) {
            n.links.remove(link);
            self.counters.unlinks += 1;
        }
        done(id)
    }

    fn exec_remove_orphan_entry(
        &mut self,
        node: usize,
        id: model_agent_core::machine::EffectId,
        cm_key: &str,
        uid: Option<&Uid>,
    ) -> Option<Input> {
        if self.api.down {
            return Some(Input::EffectDone { id, outcome: fail("the API server is unavailable") });
        }
        let seen_uid = uid.map(|u| u.as_str().to_string());
        let sweep = EntryWrite::RemoveOrphan { cm_key: cm_key.to_string(), seen_uid: seen_uid.clone() };
        let (_, removed) = wire::apply_entry_writes(&mut self.api.entries[node], &[sweep]);
        if !removed.is_empty() {
            self.removed_entry(node, seen_uid.as_deref().unwrap_or(""), cm_key);
        }
        Some(done(id))
    }

    /// The API part and the disk part; `Failed` while the API server is down, as the shell answers.
    fn exec_snapshot(&mut self, node: usize, id: model_agent_core::machine::EffectId) -> Option<Input> {
        if self.api.down {
            return Some(Input::EffectDone { id, outcome: fail("drift snapshot: 503 Service Unavailable") });
        }
        let mut snapshot: DriftSnapshot = self.api.snapshot(node);
        snapshot.owned_dirs = self.nodes[node]
            .dirs
            .iter()
            .flat_map(|(path, uids)| uids.iter().map(move |uid| (path, uid)))
            .map(|(path, uid)| {
                let marks = &self.nodes[node].reserved_marks;
                let reserved = !marks.is_empty() && marks.contains(&(path.clone(), uid.clone()));
                OwnedDir { path: path.clone(), uid: uid.clone(), reserved }
            })
            .collect();
        snapshot.trash = self.nodes[node].trash.iter().cloned().collect();
        Some(Input::DriftObserved { id, snapshot })
    }

    /// The faults a live read meets: `None` when it never answers (the core's deadline must
    /// catch it), `Some(Some(reason))` when it fails, `Some(None)` when the server answers.
    fn read_fault(&mut self, node: usize) -> Option<Option<String>> {
        self.mark(node, MarkKind::Read);
        if self.prng.up_to(999) < self.read_timeout_permille {
            return None;
        }
        let failing = self.api.down || self.api.reads_fail;
        Some(failing.then(|| "503 Service Unavailable".to_string()))
    }

    /// A removal is damage when the uid is alive and placed on `node` now, and was placed
    /// throughout the last read round trip (`staleness_ms`): an agent cannot know of a change
    /// younger than its freshest read, so a removal racing such a change is not held against it.
    fn damages(&self, uid: &str, node: usize) -> Option<&crate::api::ApiObject> {
        let obj = self.api.live_here(uid, node)?;
        let since = self.now.saturating_sub(self.staleness_ms());
        let raced = self.unplaced_until[node].get(uid).is_some_and(|&t| t >= since);
        (!raced).then_some(obj)
    }

    /// The longest a read served just before a decision takes to answer, plus the flights of
    /// the read request and of the decided effect.
    fn staleness_ms(&self) -> u64 {
        2 * self.timing.effect_ms_max + self.timing.read_ms_max
    }

    /// How old the agent's view of a model's spec may be when it decides: a watch event's
    /// flight behind a relist, and a read's round trip.
    fn spec_view_window_ms(&self) -> u64 {
        self.timing.relist_ms_max + self.timing.watch_ms_max + self.staleness_ms()
    }

    /// How long before a download lands the agent may have decided it, on a view of the world
    /// that long old: a watch event's flight behind a relist, the download's own flight, and a
    /// read's round trip.
    fn decision_window_ms(&self) -> u64 {
        self.timing.relist_ms_max + self.timing.watch_ms_max + self.timing.download_ms_max + self.staleness_ms()
    }

    /// Before the ground truth changes for `node` (every node when `None`) or for `key`
    /// (every model when `None`): note what is unplaced up to now.
    fn record_unplaced(&mut self, node: Option<usize>, key: Option<&ModelKey>) {
        let nodes: Vec<usize> = node.map_or_else(|| (0..self.nodes.len()).collect(), |n| vec![n]);
        let objects: Vec<&crate::api::ApiObject> = match key {
            Some(k) => self.api.objects.get(k).into_iter().collect(),
            None => self.api.objects.values().collect(),
        };
        let mut unplaced = Vec::new();
        for o in objects {
            for &n in &nodes {
                if !self.api.placed(o.spec(), n) {
                    unplaced.push((n, o.uid.as_str().to_string()));
                }
            }
        }
        for (n, uid) in unplaced {
            self.unplaced_until[n].insert(uid, self.now);
        }
    }

    fn check_label_scope(&mut self, node: usize, label_key: &str) {
        if !wire::is_model_label(label_key) {
            self.violation_on(node, None, format!("label {label_key} is outside models.ome.io/"));
        }
    }

    /// A label removal is damage when the uid that wrote it is alive and placed on this node.
    fn removed_label(&mut self, node: usize, label_key: &str) {
        self.counters.label_removals += 1;
        let writer = self.label_writer[node].remove(label_key);
        let live = writer.as_deref().and_then(|uid| self.damages(uid, node));
        if let Some(obj) = live {
            let (key, uid) = (obj.key.clone(), obj.uid.clone());
            self.counters.label_removals_live += 1;
            self.mark(node, MarkKind::Damage(Removed::Label));
            self.violation_on(node, Some(&key), format!("label {label_key} of live {key} (uid {uid}) removed"));
        } else {
            self.mark(node, MarkKind::Cleanup);
        }
    }

    fn removed_entry(&mut self, node: usize, uid: &str, cm_key: &str) {
        self.counters.entry_removals += 1;
        if self.damages(uid, node).is_some() {
            self.counters.entry_removals_live += 1;
            self.mark(node, MarkKind::Damage(Removed::Entry));
            let key = self.api.key_of(uid);
            self.violation_on(node, key.as_ref(), format!("entry {cm_key} of live uid {uid} removed"));
        }
    }

    // ------------------------------------------------------------------------------------------
    // Watch streams
    // ------------------------------------------------------------------------------------------

    fn deliver(&mut self, node: usize, kind: Kind, event: WatchEvent, at: u64) {
        let n = &mut self.nodes[node];
        let t = at.max(n.stream_at[kind.index()]);
        n.stream_at[kind.index()] = t;
        let generation = n.generation;
        self.schedule(t, Ev::Deliver { node, generation, kind, event });
    }

    /// Send a change to every connected node's watch.
    pub fn fanout(&mut self, change: Change) {
        let (kind, event) = match change {
            Change::Applied(obj) => (obj.key.kind, WatchEvent::Applied(obj)),
            Change::Deleted(obj) => (obj.key.kind, WatchEvent::Deleted(obj)),
        };
        for node in 0..self.nodes.len() {
            if self.nodes[node].connected && !matches!(self.nodes[node].agent, Agent::Stopped) {
                let at = self.now + self.latency(self.timing.watch_ms_max);
                self.deliver(node, kind, event.clone(), at);
            }
        }
    }

    /// The node's watch of `kind` restarts with a list served as `shape`.
    pub fn relist(&mut self, node: usize, kind: Kind, shape: ListShape) {
        let at = self.now + self.latency(self.timing.relist_ms_max);
        self.mark(node, MarkKind::Relist);
        match shape {
            ListShape::Quorum => self.deliver_list(node, kind, self.api.list(kind, None), at),
            ListShape::Empty => self.deliver_list(node, kind, vec![], at),
            ListShape::Partial => {
                let full = self.api.list(kind, None);
                let mut events = Vec::with_capacity(full.len() / 2 + full.len() + 3);
                events.push(WatchEvent::RelistStarted);
                events.extend(full.iter().take(full.len() / 2).cloned().map(WatchEvent::RelistItem));
                push_list(&mut events, full);
                self.deliver_batch(node, kind, events, at);
            }
            ListShape::Stale { lag_rv } => {
                let rv = self.api.rv.saturating_sub(lag_rv);
                self.deliver_list(node, kind, self.api.list(kind, Some(rv)), at);
                // The watch resumes from the stale resourceVersion and replays what came after.
                for change in self.api.changes_since(kind, rv) {
                    let event = match change {
                        Change::Applied(o) => WatchEvent::Applied(o),
                        Change::Deleted(o) => WatchEvent::Deleted(o),
                    };
                    self.deliver(node, kind, event, at + 1);
                }
            }
        }
    }

    fn deliver_list(&mut self, node: usize, kind: Kind, objects: Vec<Arc<model_agent_core::ModelObject>>, at: u64) {
        let mut events = Vec::with_capacity(objects.len() + 2);
        push_list(&mut events, objects);
        self.deliver_batch(node, kind, events, at);
    }

    /// Like `deliver` for each event in turn, as one queue entry.
    fn deliver_batch(&mut self, node: usize, kind: Kind, events: Vec<WatchEvent>, at: u64) {
        let n = &mut self.nodes[node];
        let t = at.max(n.stream_at[kind.index()]);
        n.stream_at[kind.index()] = t;
        let generation = n.generation;
        self.schedule(t, Ev::DeliverList { node, generation, kind, events });
    }

    // ------------------------------------------------------------------------------------------
    // Actions
    // ------------------------------------------------------------------------------------------

    /// Start (or restart) a node's agent: a fresh process with the disk as it was.
    pub fn start(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.generation += 1;
        n.started_at = self.now;
        n.reserve_views.clear();
        n.restarts += u32::from(n.generation > 1);
        n.shutdown = false;
        n.wake_at = None;
        n.connected = !self.api.down;
        n.stream_at = [self.now, self.now];
        n.node_stream_at = self.now;
        let mut config = self.config.clone();
        config.node_name = crate::api::node_name(node);
        config.seed = self.seed.wrapping_mul(1_000_003).wrapping_add(node as u64 * 7919 + n.generation as u64);
        n.recorder = self.record_traces.then(|| Recorder::new(&config));
        n.agent = match self.agent_kind {
            AgentKind::Core => Agent::Core(Box::new(State::new(config))),
            AgentKind::Upstream => Agent::Upstream(Box::new(Upstream::new(&self.config.models_root))),
        };
        let view = self.api.node_view(node);
        self.feed(node, Input::NodeObserved(view));
        if !self.api.down {
            for kind in Kind::ALL {
                self.relist(node, kind, ListShape::Quorum);
            }
        }
    }

    pub fn stop(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        n.agent = Agent::Stopped;
        n.generation += 1;
        n.connected = false;
        n.wake_at = None;
    }

    /// SIGTERM: the agent is told, and its process is gone `exit_ms` later.
    pub fn shutdown(&mut self, node: usize) {
        self.nodes[node].shutdown = true;
        self.feed(node, Input::Shutdown);
    }

    /// Change a label of a node's Node object; its agent sees the new node when the Node watch
    /// delivers it. During a wipe the change lands in the labels that come back.
    pub fn set_node_label(&mut self, node: usize, key: &str, value: Option<&str>) {
        self.record_unplaced(Some(node), None);
        match value {
            Some(v) => self.api.node_labels[node].insert(key.to_string(), v.to_string()),
            None => self.api.node_labels[node].remove(key),
        };
        self.node_changed(node);
    }

    /// An operator removes the node's shared copies by hand: their directories, files and
    /// markers (`rm -rf _artifacts/...`); the links to them stay, dangling.
    pub fn remove_copies_by_hand(&mut self, node: usize) {
        let n = &mut self.nodes[node];
        let copies: BTreeSet<String> = n.dirs.keys().chain(n.files.keys()).filter(|p| is_copy(p)).cloned().collect();
        for path in &copies {
            n.dirs.remove(path);
            n.files.remove(path);
            n.prune_reserved_marks(path);
        }
        self.counters.copies_removed_by_hand += copies.len() as u64;
        self.removed_by_hand[node].extend(copies);
    }

    /// Every label of the node vanishes for `ms` (node-feature-discovery #1802): its watch and
    /// live GETs show none, then they all come back. Overlapping wipes extend each other.
    pub fn wipe_node_labels(&mut self, node: usize, ms: u64) {
        let until = self.now + ms;
        let was = self.api.wiped_until[node];
        self.record_unplaced(Some(node), None);
        self.api.wiped_until[node] = Some(was.map_or(until, |w| w.max(until)));
        if was.is_none() {
            self.node_changed(node);
        }
        self.schedule(until, Ev::WipeEnd { node });
    }

    /// The Node object changed: its watch delivers the node as it is now, after the Node
    /// watch's lag and in order with its earlier deliveries.
    pub fn node_changed(&mut self, node: usize) {
        if !self.nodes[node].connected || matches!(self.nodes[node].agent, Agent::Stopped) {
            return;
        }
        let lag = self.span(self.timing.node_watch_ms_min, self.timing.node_watch_ms_max);
        let n = &mut self.nodes[node];
        let t = (self.now + lag).max(n.node_stream_at);
        n.node_stream_at = t;
        let (generation, view) = (n.generation, self.api.node_view(node));
        self.schedule(t, Ev::NodeDeliver { node, generation, view });
    }

    /// Write each node's recorded trace into `dir`; returns the paths.
    pub fn write_traces(&self, dir: &std::path::Path, prefix: &str) -> std::io::Result<Vec<String>> {
        std::fs::create_dir_all(dir)?;
        let mut paths = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some(rec) = &node.recorder {
                let path = dir.join(format!("{prefix}-node-{i}.trace.jsonl"));
                std::fs::write(&path, rec.text())?;
                paths.push(path.display().to_string());
            }
        }
        Ok(paths)
    }

    pub fn create(&mut self, key: ModelKey, spec: ModelSpec, finalizer: bool) {
        if let Some(change) = self.api.create(key.clone(), Arc::new(spec), finalizer) {
            self.spec_written_at.insert(key, self.now);
            self.fanout(change);
        }
    }

    /// The user changes a model's spec.
    pub fn update(&mut self, key: &ModelKey, spec: ModelSpec) {
        self.record_unplaced(None, Some(key));
        self.spec_written_at.insert(key.clone(), self.now);
        if self.api.objects.get(key).is_some_and(|o| o.spec().storage_uri != spec.storage_uri) {
            self.source_changed_at.insert(key.clone(), self.now);
        }
        if let Some(change) = self.api.spec_update(key, Arc::new(spec)) {
            self.fanout(change);
        }
    }

    pub fn delete(&mut self, key: &ModelKey) {
        let settled = |t: u64| t + self.spec_view_window_ms() <= self.now;
        let reserved = self.api.objects.get(key).filter(|o| o.spec().reserve_artifact && !o.deleting());
        if let Some(o) = reserved.filter(|_| self.spec_written_at.get(key).is_none_or(|&t| settled(t))) {
            self.reserved_deleted_at.insert(o.uid.clone(), self.now);
            for (n, node) in self.nodes.iter().enumerate() {
                for (path, _) in node.dirs.iter().filter(|(p, m)| m.contains(&o.uid) && !is_copy(p)) {
                    self.reserved_paths[n].insert(path.clone(), o.uid.clone());
                }
            }
        }
        for change in self.api.delete(key) {
            self.fanout(change);
        }
    }

    /// The API server goes away (`down`) or comes back; coming back, every watch relists.
    pub fn set_outage(&mut self, down: bool) {
        self.api.down = down;
        for node in 0..self.nodes.len() {
            if matches!(self.nodes[node].agent, Agent::Stopped) {
                continue;
            }
            self.nodes[node].connected = !down;
            if !down {
                for kind in Kind::ALL {
                    self.relist(node, kind, ListShape::Quorum);
                }
                self.node_changed(node);
            }
        }
    }

    /// A CRD change: every watch of `kind` drops and relists; `shape` says how each list is served.
    pub fn crd_change(&mut self, kind: Kind, mut shape: impl FnMut(usize, &mut Prng) -> ListShape) {
        for node in 0..self.nodes.len() {
            if matches!(self.nodes[node].agent, Agent::Stopped) || !self.nodes[node].connected {
                continue;
            }
            let s = shape(node, &mut self.prng);
            self.relist(node, kind, s);
            if s != ListShape::Quorum {
                // The broken list is followed, a little later, by the watch expiring and a good one.
                let later = self.latency(30_000);
                self.nodes[node].stream_at[kind.index()] += later;
                self.relist(node, kind, ListShape::Quorum);
            }
        }
    }

    // ------------------------------------------------------------------------------------------
    // Checks
    // ------------------------------------------------------------------------------------------

    pub fn ready(&self, node: usize) -> bool {
        match &self.nodes[node].agent {
            Agent::Core(s) => s.readiness().ready,
            Agent::Upstream(u) => u.synced() && self.nodes[node].root_writable,
            Agent::Stopped => false,
        }
    }

    /// Liveness at quiescence: every node's labels, entries and directories are a function of
    /// the ground truth (decided by the simulator's own oracle), nothing is pending, and a
    /// second reconcile adds no effect.
    pub fn check_converged(&mut self) {
        // What each live object needs, computed once (not once per node).
        let expects = self.expects();
        let mut problems = Vec::new();
        // Nodes that place the same models have the same key owners: worked out once per set.
        let mut owners_of: FxHashMap<Vec<usize>, Vec<usize>> = FxHashMap::default();
        for node in 0..self.nodes.len() {
            if !matches!(self.nodes[node].agent, Agent::Stopped) {
                let placed: Vec<usize> =
                    (0..expects.len()).filter(|&i| self.api.placed(&expects[i].spec, node)).collect();
                let owners = owners_of.entry(placed.clone()).or_insert_with_key(|placed| key_owners(&expects, placed));
                self.node_converged(node, &expects, (&placed, owners), &mut problems);
            }
        }
        for (node, key, p) in problems {
            self.violation_on(node, key.as_ref(), format!("liveness: {p}"));
        }
    }

    /// What each live object needs on a node where the oracle places it.
    fn expects(&self) -> Vec<Expect> {
        let root = &self.config.models_root;
        let expect = |o: &crate::api::ApiObject| Expect {
            key: o.key.clone(),
            label_key: wire::label_key(&o.key),
            cm_key: wire::configmap_key(&o.key),
            uid: o.uid.clone(),
            downloads: oracle::downloads(&o.spec().storage_uri),
            reuses: oracle::reuses(o.spec()),
            local_path: oracle::local_path(o.spec()),
            dir: oracle::download_dir(o.spec(), root),
            copy: oracle::copy_dir(o.spec()),
            spec: o.spec().clone(),
            rank: (o.key.kind != Kind::ClusterBaseModel, o.created_rv, o.uid.as_str().to_string()),
        };
        self.api.objects.values().filter(|o| !o.deleting()).map(expect).collect()
    }

    /// What one node should show, against what it shows.
    fn node_converged(
        &self,
        node: usize,
        expects: &[Expect],
        (placed, owners): (&[usize], &[usize]),
        problems: &mut Vec<(usize, Option<ModelKey>, String)>,
    ) {
        let n = &self.nodes[node];
        let mut expected_labels: FxHashMap<&str, (&'static str, &ModelKey)> = FxHashMap::default();
        // Membership by index, for the holders' filter below (a search of `placed` for every
        // pair of models was most of this check at a thousand models a node).
        let mut is_placed = vec![false; expects.len()];
        placed.iter().for_each(|&i| is_placed[i] = true);
        for e in owners.iter().map(|&i| &expects[i]) {
            let local_missing = e.local_path.as_ref().is_some_and(|p| n.missing_local.contains(p));
            // Two models may name one directory: the one whose marker it holds is Ready.
            let taken =
                e.dir.as_ref().and_then(|p| n.dirs.get(p)).is_some_and(|marker| !marker.contains(&e.uid)) && !e.reuses;
            // A reserved model keeps its directory while it is away from the node, too.
            let holders = expects.iter().enumerate().filter(|(i, u)| is_placed[*i] || u.spec.reserve_artifact);
            let held = other_source_there(n, e, holders.map(|(_, u)| u));
            let failed = (e.downloads && (!n.root_writable || taken || held)) || local_missing;
            let status = if failed { ModelStatus::Failed } else { ModelStatus::Ready };
            expected_labels.insert(&e.label_key, (status.as_str(), &e.key));
            match self.api.entries[node].get(e.cm_key.as_str()) {
                Some(s) if s.status == status && s.uid.as_deref().is_none_or(|u| u == e.uid.as_str()) => {}
                other => problems.push((
                    node,
                    Some(e.key.clone()),
                    format!("entry {} is {other:?}, expected {status:?} of {}", e.cm_key, e.uid),
                )),
            }
            if let Some(problem) = (status == ModelStatus::Ready).then(|| copy_problem(n, e)).flatten() {
                problems.push((node, Some(e.key.clone()), problem));
            }
        }
        let labels = &self.api.labels[node];
        let mut wrong: Vec<(&str, &str, &ModelKey)> = expected_labels
            .iter()
            .filter(|(k, (v, _))| labels.get(**k).map(|held| &**held) != Some(*v))
            .map(|(k, (v, key))| (*k, *v, *key))
            .collect();
        // In label order, as a sorted map would give them.
        wrong.sort_unstable_by_key(|(k, _, _)| *k);
        for (k, v, key) in wrong {
            let text = format!("label {k} is {:?}, expected {v}", labels.get(k));
            problems.push((node, Some(key.clone()), text));
        }
        let mut stale: Vec<&Arc<str>> = labels.keys().filter(|k| !expected_labels.contains_key(&***k)).collect();
        // In label order too (the labels are a hash map).
        stale.sort_unstable();
        for k in stale {
            let key = self.label_writer[node].get(k).and_then(|uid| self.api.key_of(uid));
            problems.push((node, key, format!("stale label {k}")));
        }
        let placed: Vec<&Expect> = placed.iter().map(|&i| &expects[i]).collect();
        self.node_links(node, &placed, problems);
        self.node_reserve_records(node, owners.iter().map(|&i| &expects[i]), problems);
        self.node_leftovers(node, problems);
    }

    /// Every model Ready here whose own directory's marker names it has its reserve label
    /// recorded there as it carries it now: a delete while no agent runs keeps or takes the
    /// weights as the label says (`Op::RecordReserve`, `OwnedDir::reserved`).
    fn node_reserve_records<'e>(
        &self,
        node: usize,
        owners: impl Iterator<Item = &'e Expect>,
        problems: &mut Vec<(usize, Option<ModelKey>, String)>,
    ) {
        let n = &self.nodes[node];
        // Where no marker records anything, only a reserved model can be wrong.
        let recording = !n.reserved_marks.is_empty();
        for e in owners.filter(|e| e.downloads && !e.reuses && (recording || e.spec.reserve_artifact)) {
            let Some(dir) = e.dir.as_ref().filter(|d| !is_copy(d)) else { continue };
            let ready = self.api.labels[node].get(e.label_key.as_str()).is_some_and(|v| &**v == "Ready");
            if !ready || !n.dirs.get(dir).is_some_and(|m| m.contains(&e.uid)) {
                continue;
            }
            let recorded = recording && n.reserved_marks.contains(&(dir.clone(), e.uid.clone()));
            if recorded != e.spec.reserve_artifact {
                let label = e.spec.reserve_artifact;
                let text = format!("the marker at {dir} records {}'s reserve label as {recorded}, not {label}", e.uid);
                problems.push((node, Some(e.key.clone()), text));
            }
        }
    }

    /// Every symlink this process knows of is the path of a live model placed here that uses
    /// that copy, and every copy in place is such a model's: nothing is left unreferenced. (A
    /// link an earlier process left is counted by `orphan_links`.)
    fn node_links(&self, node: usize, placed: &[&Expect], problems: &mut Vec<(usize, Option<ModelKey>, String)>) {
        let n = &self.nodes[node];
        let used_from = |path: &str, copy: &str| {
            placed.iter().any(|e| e.dir.as_deref() == Some(path) && e.copy.as_deref() == Some(copy))
        };
        for (path, link) in n.links.iter().filter(|(_, l)| l.generation == n.generation) {
            if !used_from(path, &link.copy) {
                let key = self.api.key_of(link.uid.as_str());
                problems.push((node, key, format!("stale link {path} -> {} (made by {})", link.copy, link.uid)));
            }
        }
        // A copy stays while a model placed here may use it (README: the sweep keeps it for any
        // such model the LISTs show, one whose keys another model holds included).
        for copy in n.dirs.keys().filter(|p| is_copy(p)) {
            if !placed.iter().any(|e| e.copy.as_deref() == Some(copy.as_str())) {
                problems.push((node, None, format!("shared copy {copy} is in place with no live model using it")));
            }
        }
    }

    /// Symlinks an earlier agent process left that no live model placed on their node uses
    /// (its model was deleted, or moved, while no process knew of the link): the snapshot does
    /// not report symlinks, so no later process can remove them.
    pub fn orphan_links(&self) -> usize {
        let root = &self.config.models_root;
        let used = |node: usize, path: &str, copy: &str| {
            self.api.objects.values().any(|o| {
                !o.deleting()
                    && self.api.placed(o.spec(), node)
                    && oracle::download_dir(o.spec(), root).as_deref() == Some(path)
                    && oracle::copy_dir(o.spec()).as_deref() == Some(copy)
            })
        };
        let node_orphans = |(node, n): (usize, &SimNode)| {
            n.links.iter().filter(|(path, l)| l.generation != n.generation && !used(node, path, &l.copy)).count()
        };
        self.nodes.iter().enumerate().map(node_orphans).sum()
    }

    /// Entries and directories of deleted uids, pending work, and a second reconcile's effects.
    fn node_leftovers(&self, node: usize, problems: &mut Vec<(usize, Option<ModelKey>, String)>) {
        let live = |uid: &str| self.api.key_of(uid).is_some();
        let mut stale: Vec<_> =
            self.api.entries[node].iter().filter(|(_, e)| e.uid.as_ref().is_some_and(|u| !live(u))).collect();
        // In key order (the entries are a hash map).
        stale.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (k, e) in stale {
            problems.push((node, None, format!("stale entry {k} of uid {:?}", e.uid)));
        }
        for (path, uids) in &self.nodes[node].dirs {
            if !uids.iter().any(|u| live(u.as_str())) && !is_copy(path) {
                problems.push((node, None, format!("directory {path} of deleted uids {uids:?} still in place")));
            }
        }
        if let Agent::Core(state) = &self.nodes[node].agent {
            let (pending, _) = state.pending_confirmations();
            if pending > 0 {
                problems.push((node, None, format!("{pending} confirmations still pending")));
            }
            // Idempotence: one more reconcile of an unchanged world adds no work.
            let (_, output) = model_agent_core::step(state, Instant(self.now), Input::Tick);
            for e in output.effects.iter().filter(|e| !matches!(e.op, Op::ProbeRoot | Op::Snapshot)) {
                problems.push((node, None, format!("a second reconcile still emits {:?}", e.op)));
            }
        }
    }

    /// (expected, done): every (node, uid) that was published and whose object is gone must be
    /// cleaned up on that node.
    pub fn cleanups(&self) -> (u64, u64) {
        let live: BTreeSet<&str> = self.api.objects.values().map(|o| o.uid.as_str()).collect();
        let mut expected = 0;
        let mut done = 0;
        let published = self.published_ever.iter().enumerate();
        for (node, uid) in published.flat_map(|(node, uids)| uids.iter().map(move |uid| (node, &**uid))) {
            if live.contains(uid) {
                continue;
            }
            expected += 1;
            let entry_left = self.api.entries[node].values().any(|e| e.uid.as_deref() == Some(uid));
            // A directory another live uid shares is theirs now, and a copy is kept by its users
            // (`node_links` checks those); a link is the model's own (one an earlier process
            // left is `orphan_links`).
            let n = &self.nodes[node];
            let theirs = |m: &BTreeSet<Uid>| m.contains(&Uid::new(uid)) && m.iter().all(|u| !live.contains(u.as_str()));
            let dir_left = n.dirs.iter().any(|(path, m)| !is_copy(path) && theirs(m));
            let link_left = n.links.values().any(|l| l.uid.as_str() == uid && l.generation == n.generation);
            let dir_left = dir_left || link_left;
            if !entry_left && !dir_left {
                done += 1;
            }
        }
        (expected, done)
    }
}

/// What one live object needs on a node where the oracle places it.
struct Expect {
    key: ModelKey,
    label_key: String,
    cm_key: String,
    uid: Uid,
    downloads: bool,
    /// `ReuseIfExists` on `hf://`: a symlink to the node's copy, never Failed for a marker.
    reuses: bool,
    local_path: Option<String>,
    dir: Option<String>,
    /// The shared copy a `ReuseIfExists` model links its path to.
    copy: Option<String>,
    spec: Arc<ModelSpec>,
    /// Rank among models whose keys collide: ClusterBaseModel first, then older, then uid.
    rank: (bool, u64, String),
}

/// What is wrong with the shared copy of `e`, Ready on node `n`: its path must link to the
/// node's copy, which must be there (one removed by hand must have been fetched again), or
/// (something else was there) hold its own files.
fn copy_problem(n: &SimNode, e: &Expect) -> Option<String> {
    let (Some(dir), Some(copy)) = (&e.dir, &e.copy) else { return None };
    let linked = n.links.get(dir).is_some_and(|l| l.copy == *copy);
    let own = n.dirs.get(dir).is_some_and(|marker| marker.contains(&e.uid));
    match (linked, own) {
        (false, false) => Some(format!("{dir} does not link to the copy {copy}")),
        (true, _) if !n.files.contains_key(copy) => Some(format!("Ready on the copy {copy}, which is not there")),
        _ => None,
    }
}

/// Does another live model placed on the node (or reserved, placed or not) hold `e`'s
/// directory, with files of its own source that is not `e`'s (its marker names it)? Then `e` must not download over them and is
/// Failed (README, "Same path, same source"). A shared copy's path names its source.
fn other_source_there<'a>(n: &SimNode, e: &Expect, mut placed: impl Iterator<Item = &'a Expect>) -> bool {
    let Some(dir) = e.dir.as_ref().filter(|d| !e.reuses && !is_copy(d)) else { return false };
    let (Some(files), Some(marker)) = (n.files.get(dir), n.dirs.get(dir)) else { return false };
    **files != *e.spec.storage_uri
        && placed.any(|u| {
            u.uid != e.uid && u.dir.as_ref() == Some(dir) && *u.spec.storage_uri == **files && marker.contains(&u.uid)
        })
}

/// The models placed on a node that own their keys: where two share a label key or a
/// ConfigMap key, only the first in rank is reported (core.md, "Label keys can collide").
/// The models placed here that own their keys: none of lower rank shares their label key or
/// their ConfigMap key. Ranks are unique (they end with the uid), so the lowest of each key's
/// group owns it; one pass per key kind instead of comparing every pair.
fn key_owners(expects: &[Expect], placed: &[usize]) -> Vec<usize> {
    type Rank = (bool, u64, String);
    let lowest = |key: fn(&Expect) -> &str| {
        let mut lowest: FxHashMap<&str, &Rank> = FxHashMap::default();
        for e in placed.iter().map(|&i| &expects[i]) {
            let slot = lowest.entry(key(e)).or_insert(&e.rank);
            if e.rank < **slot {
                *slot = &e.rank;
            }
        }
        lowest
    };
    let (by_label, by_entry) = (lowest(|e| &e.label_key), lowest(|e| &e.cm_key));
    let owns = |e: &Expect| by_label[e.label_key.as_str()] == &e.rank && by_entry[e.cm_key.as_str()] == &e.rank;
    placed.iter().copied().filter(|&i| owns(&expects[i])).collect()
}

#[cfg(test)]
#[path = "world_tests.rs"]
mod tests;

/// The simulated Hub answers every revision with its commit (`oracle::commit_of`).
fn resolved(id: model_agent_core::EffectId, storage_uri: &str) -> Input {
    let commit = oracle::commit_of(storage_uri).unwrap_or_default();
    Input::EffectDone { id, outcome: model_agent_core::machine::Outcome::Resolved { commit } }
}

/// Is `path` (beneath the root) a shared copy?
/// A relist's events: its start, one item per object, its end.
fn push_list(events: &mut Vec<WatchEvent>, objects: Vec<Arc<model_agent_core::ModelObject>>) {
    events.push(WatchEvent::RelistStarted);
    events.extend(objects.into_iter().map(WatchEvent::RelistItem));
    events.push(WatchEvent::RelistDone);
}

fn is_copy(path: &str) -> bool {
    path.starts_with("_artifacts/")
}

fn done(id: model_agent_core::EffectId) -> Input {
    Input::EffectDone { id, outcome: model_agent_core::machine::Outcome::Done }
}

fn fail(reason: &str) -> model_agent_core::machine::Outcome {
    model_agent_core::machine::Outcome::Failed(reason.to_string())
}

/// A `local://` check: the path is there, or it is not.
fn local_outcome(path: &str, missing: bool) -> model_agent_core::machine::Outcome {
    if missing { fail(&format!("{path} does not exist")) } else { model_agent_core::machine::Outcome::Done }
}
