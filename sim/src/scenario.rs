//! Named scenarios (the incidents and the failure mechanisms of `reliability.md` §1.1), the
//! report each run prints, and the swarm: many seeds with fault knobs drawn from each, a safety
//! phase with faults, then a liveness phase with the faults healed.

use serde::Serialize;
use std::collections::BTreeMap;

use model_agent_core::prng::Prng;
use model_agent_core::wire;
use model_agent_core::{Kind, ModelKey, ModelSpec};

use crate::world::{AgentKind, ListShape, Timing, World};
use crate::{oracle, vocab};

pub const SCENARIOS: &[&str] = &[
    "crd-ssa",
    "apiserver-outage",
    "stale-relist",
    "unsynced-empty",
    "delete-recreate",
    "read-failures",
    "real-mass-delete",
    "shutdown-mid-storm",
    "readonly-root",
    "stale-read",
    "node-label-wipe",
    "label-collision",
    "shared-copy",
];

#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    pub models: usize,
    pub seed: u64,
    pub agent: AgentKind,
    pub timeline: bool,
    pub record_traces: bool,
    /// The core's invariants and the history of states after every step (the default); the
    /// benchmark turns them off to time the agents alone, and checks the invariants once at the end.
    pub audit_every_step: bool,
    /// Time each step by kind (`World::profile`).
    pub profile_steps: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            nodes: 10,
            models: 50,
            seed: 1,
            agent: AgentKind::Core,
            timeline: false,
            record_traces: false,
            audit_every_step: true,
            profile_steps: false,
        }
    }
}

/// What one run reports (`--json` prints it as one object).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub agent: AgentKind,
    pub nodes: usize,
    pub models: usize,
    pub seed: u64,
    pub label_removals_live: u64,
    pub entry_removals_live: u64,
    pub dir_removals_live: u64,
    pub phantom_deletes_suppressed: u64,
    pub api_get: u64,
    pub api_list: u64,
    pub cleanups_done: u64,
    pub cleanups_expected: u64,
    pub invariant_violations: Vec<String>,
    pub invariant_violation_count: u64,
    pub virtual_seconds: f64,
    pub label_removals: u64,
    pub entry_removals: u64,
    pub dir_removals: u64,
    pub events_processed: u64,
    /// The last steps (inputs, effects, state) of the node the first violation was about.
    pub history: Vec<String>,
    /// Scenario-specific results (e.g. `rollout_completed`).
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Report {
    pub fn from_world(scenario: &str, opts: &Options, world: &World) -> Report {
        let c = &world.counters;
        let (expected, done) = world.cleanups();
        Report {
            scenario: scenario.to_string(),
            agent: opts.agent,
            nodes: opts.nodes,
            models: opts.models,
            seed: opts.seed,
            label_removals_live: c.label_removals_live,
            entry_removals_live: c.entry_removals_live,
            dir_removals_live: c.dir_removals_live,
            phantom_deletes_suppressed: c.phantom_deletes_suppressed,
            api_get: c.api_get,
            api_list: c.api_list,
            cleanups_done: done,
            cleanups_expected: expected,
            invariant_violations: world.violations.clone(),
            invariant_violation_count: world.violation_count,
            virtual_seconds: world.now as f64 / 1000.0,
            label_removals: c.label_removals,
            entry_removals: c.entry_removals,
            dir_removals: c.dir_removals,
            events_processed: world.events_processed,
            history: world.history_dump.clone(),
            extra: BTreeMap::new(),
        }
    }

    /// No damage, no violation, every cleanup done.
    pub fn clean(&self) -> bool {
        self.invariant_violation_count == 0
            && self.label_removals_live == 0
            && self.entry_removals_live == 0
            && self.dir_removals_live == 0
            && self.cleanups_done == self.cleanups_expected
    }
}

const MINUTE: u64 = 60_000;

/// Models: 20% namespaced BaseModels, the rest ClusterBaseModels; 60% `local://`, 30% `hf://`
/// (downloaded beneath the root), 10% `vendor://`.
pub fn model(i: usize, uri_kind: u64) -> (ModelKey, ModelSpec) {
    let name = format!("m-{i:05}");
    let key = if i % 5 == 4 { ModelKey::namespaced("team", &name) } else { ModelKey::cluster(&name) };
    let spec = match uri_kind {
        0..=5 => ModelSpec::simple(&format!("local:///mnt/share/{name}"), None),
        6..=8 => ModelSpec::simple("hf://org/weights", Some(&format!("/mnt/models/{name}"))),
        _ => ModelSpec::simple("vendor://nvidia/nim/weights", None),
    };
    (key, spec)
}

fn populate(w: &mut World, models: usize, local_only: bool) -> Vec<ModelKey> {
    (0..models)
        .map(|i| {
            let (key, spec) = model(i, if local_only { 0 } else { (i as u64 * 7) % 10 });
            w.create(key.clone(), spec, true);
            key
        })
        .collect()
}

fn start_fleet(w: &mut World) {
    for node in 0..w.nodes.len() {
        w.start(node);
    }
    w.run_for(MINUTE);
}

fn heal_and_settle(w: &mut World, minutes: u64) {
    w.read_timeout_permille = 0;
    w.timing = Timing::default();
    w.api.reads_fail = false;
    if w.api.down {
        w.set_outage(false);
    }
    w.run_for(minutes * MINUTE);
    w.check_converged();
}

fn bad_list(prng: &mut Prng, models: usize) -> ListShape {
    match prng.up_to(2) {
        0 => ListShape::Empty,
        1 => ListShape::Stale { lag_rv: (models as u64 / 2).max(1) },
        _ => ListShape::Partial,
    }
}

pub fn new_world(opts: &Options) -> World {
    let mut w = World::new(opts.nodes, opts.agent, opts.seed);
    if opts.timeline {
        w.marks = Some(Vec::new());
    }
    w.record_traces = opts.record_traces;
    w.audit_every_step = opts.audit_every_step;
    w.profile = opts.profile_steps.then(Box::default);
    w
}

/// Run a named scenario.
pub fn run(name: &str, opts: &Options) -> Result<(Report, World), String> {
    let mut w = new_world(opts);
    let mut extra = Extra::new();
    match name {
        "crd-ssa" => crd_ssa(&mut w, opts, &mut extra),
        "apiserver-outage" => apiserver_outage(&mut w, opts, &mut extra),
        "stale-relist" => stale_relist(&mut w, opts, &mut extra),
        "unsynced-empty" => unsynced_empty(&mut w, opts, &mut extra),
        "delete-recreate" => delete_recreate(&mut w, opts, &mut extra),
        "read-failures" => read_failures(&mut w, opts, &mut extra),
        "real-mass-delete" => real_mass_delete(&mut w, opts, &mut extra),
        "shutdown-mid-storm" => shutdown_mid_storm(&mut w, opts, &mut extra),
        "readonly-root" => readonly_root(&mut w, opts, &mut extra),
        "stale-read" => stale_read(&mut w, opts, &mut extra),
        "node-label-wipe" => node_label_wipe(&mut w, opts, &mut extra),
        "label-collision" => label_collision(&mut w, opts, &mut extra),
        "shared-copy" => shared_copy(&mut w, opts, &mut extra),
        other => return Err(format!("unknown scenario {other:?}; known: {}", SCENARIOS.join(", "))),
    }
    if !w.audit_every_step {
        w.check_invariants_now();
    }
    let mut report = Report::from_world(name, opts, &w);
    report.extra = extra;
    Ok((report, w))
}

type Extra = BTreeMap<String, serde_json::Value>;

/// The second seed: a server-side apply of the model CRDs drops every watch; relists are
/// served empty, stale or part-way by a cache that is being rebuilt.
fn crd_ssa(w: &mut World, opts: &Options, _extra: &mut Extra) {
    let m = opts.models;
    populate(w, m, false);
    start_fleet(w);
    for kind in [Kind::ClusterBaseModel, Kind::BaseModel] {
        w.crd_change(kind, |_, prng| bad_list(prng, m));
        w.run_for(2 * MINUTE);
    }
    heal_and_settle(w, 10);
}

/// Ten minutes without an API server; some models are deleted meanwhile.
fn apiserver_outage(w: &mut World, opts: &Options, extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    w.set_outage(true);
    let before = w.counters.label_removals + w.counters.entry_removals + w.counters.dir_removals;
    for key in keys.iter().step_by(10) {
        w.delete(key);
    }
    w.run_for(10 * MINUTE);
    let during = w.counters.label_removals + w.counters.entry_removals + w.counters.dir_removals - before;
    extra.insert("destructive_effects_during_outage".into(), during.into());
    if during > 0 {
        w.violation(format!("{during} destructive effects landed during the outage"));
    }
    heal_and_settle(w, 15);
}

/// A relist from a lagging server: new models missing, deleted ones still shown.
fn stale_relist(w: &mut World, opts: &Options, _extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    let rv_before = w.api.rv;
    for key in keys.iter().step_by(7) {
        w.delete(key);
    }
    for i in m..m + m / 5 {
        let (key, spec) = model(i, 0);
        w.create(key, spec, true);
    }
    w.run_for(MINUTE);
    let lag_rv = w.api.rv - rv_before;
    for node in 0..opts.nodes {
        for kind in Kind::ALL {
            w.relist(node, kind, ListShape::Stale { lag_rv });
        }
    }
    heal_and_settle(w, 10);
}

/// Lists answered before the server synced: empty (node-feature-discovery #1802).
fn unsynced_empty(w: &mut World, opts: &Options, _extra: &mut Extra) {
    let m = opts.models;
    populate(w, m, false);
    start_fleet(w);
    for kind in Kind::ALL {
        w.crd_change(kind, |_, _| ListShape::Empty);
    }
    heal_and_settle(w, 10);
}

/// Delete and re-create under the same name while some nodes miss the DELETED event.
fn delete_recreate(w: &mut World, opts: &Options, _extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    let cut: Vec<usize> = (0..opts.nodes).filter(|n| n % 3 == 0).collect();
    for &n in &cut {
        w.nodes[n].connected = false;
    }
    for key in keys.iter().step_by(4) {
        // No finalizer here: the DELETED event is the only notice, and some nodes miss it.
        w.api.objects.get_mut(key).expect("created").finalizer = false;
        w.delete(key);
        let i: usize = key.name[2..].parse().expect("scenario names");
        let (_, spec) = model(i, (i as u64 * 7) % 10);
        w.create(key.clone(), spec, true);
    }
    w.run_for(10_000);
    for &n in &cut {
        w.nodes[n].connected = true;
        for kind in Kind::ALL {
            w.relist(n, kind, ListShape::Quorum);
        }
    }
    heal_and_settle(w, 10);
}

/// Live reads fail for an hour (with a phantom storm and real deletes meanwhile).
fn read_failures(w: &mut World, opts: &Options, extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    w.api.reads_fail = true;
    for key in keys.iter().step_by(5) {
        w.api.objects.get_mut(key).expect("created").finalizer = false;
        w.delete(key);
    }
    w.crd_change(Kind::ClusterBaseModel, |_, _| ListShape::Empty);
    w.run_for(30 * MINUTE);
    let pending: usize = (0..opts.nodes)
        .map(|n| match &w.nodes[n].agent {
            crate::world::Agent::Core(s) => s.pending_confirmations().0,
            _ => 0,
        })
        .sum();
    extra.insert("pending_confirmations_during_failures".into(), pending.into());
    w.run_for(30 * MINUTE);
    heal_and_settle(w, 15);
}

/// Every model really deleted: every cleanup must complete.
fn real_mass_delete(w: &mut World, opts: &Options, extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    for key in &keys {
        w.delete(key);
    }
    heal_and_settle(w, 10);
    extra.insert("objects_left".into(), w.api.objects.len().into());
    if !w.api.objects.is_empty() {
        w.violation(format!("{} objects still held by their finalizer", w.api.objects.len()));
    }
}

/// SIGTERM to half the fleet in the middle of a relist storm with real deletes.
fn shutdown_mid_storm(w: &mut World, opts: &Options, _extra: &mut Extra) {
    let m = opts.models;
    let keys = populate(w, m, false);
    start_fleet(w);
    for key in keys.iter().step_by(10) {
        w.delete(key);
    }
    for kind in Kind::ALL {
        w.crd_change(kind, |_, _| ListShape::Empty);
    }
    w.run_for(1_500);
    let half: Vec<usize> = (0..opts.nodes).filter(|n| n % 2 == 0).collect();
    for &n in &half {
        w.shutdown(n);
    }
    w.run_for(5_000);
    for &n in &half {
        w.stop(n);
    }
    w.run_for(30_000);
    for &n in &half {
        w.start(n);
    }
    heal_and_settle(w, 10);
}

/// The first seed: read-only roots serving local:// models; then a DaemonSet rolling update
/// with maxUnavailable 1 must complete.
fn readonly_root(w: &mut World, opts: &Options, extra: &mut Extra) {
    let m = opts.models;
    for n in 0..opts.nodes {
        w.nodes[n].root_writable = false;
    }
    populate(w, m, true);
    start_fleet(w);
    let ready = (0..opts.nodes).filter(|&n| w.ready(n)).count();
    extra.insert("nodes_ready".into(), ready.into());
    let mut updated = 0;
    'rollout: for n in 0..opts.nodes {
        w.stop(n);
        w.run_for(1_000);
        w.start(n);
        for _ in 0..120 {
            w.run_for(1_000);
            if w.ready(n) {
                updated += 1;
                continue 'rollout;
            }
        }
        break;
    }
    extra.insert("nodes_updated".into(), updated.into());
    let completed = updated == opts.nodes;
    extra.insert("rollout_completed".into(), completed.into());
    if !completed {
        w.violation(format!("rolling update stalled: {updated} of {} nodes updated", opts.nodes));
    }
    heal_and_settle(w, 5);
}

fn selecting(uri: &str, path: Option<&str>, pool: &str) -> ModelSpec {
    let mut s = ModelSpec::simple(uri, path);
    s.node_selector = vec![("pool".into(), pool.into())];
    s
}

/// How many (node, key) pairs have a `Ready` label.
fn ready_labels(w: &World, keys: &[ModelKey]) -> usize {
    let ready =
        |n: usize, k: &ModelKey| w.api.labels[n].get(wire::label_key(k).as_str()).is_some_and(|v| &**v == "Ready");
    (0..w.nodes.len()).map(|n| keys.iter().filter(|k| ready(n, k)).count()).sum()
}

/// Issue 7, hole 1, both directions, with live-read answers arriving 3-4 s after they were
/// served, so that newer watch events overtake them. Every node has pool=a; `--models` filler
/// ClusterBaseModels are placed everywhere; three `hf://` ClusterBaseModels (A) and three
/// `local://` BaseModels (B) select pool=a (three, under the breaker's minimum of five, so the
/// ordering rule alone must hold).
/// - A: the user moves each to pool=b (v2: the core's placement-exit GET is served with v2),
///   then back to pool=a (v3) 1 s later, before that answer arrives. The core withdraws nothing
///   (`phase_a_withdrawals` 0) and keeps every label Ready.
/// - B: a relist served empty makes each a candidate; its GET is served with pool=a; 1 s later
///   the user moves it to pool=b, before that answer arrives. The older answer must not
///   re-place it: a minute later no node still has its label (`phase_b_labels_left` 0).
///
/// The upstream model does no live reads, so read latency cannot reach it; it trusts the watch
/// as it arrives. In A it removes each model's label, entry and weights on v2 and downloads
/// them again on v3 (`phase_a_withdrawals`, `phase_a_downloads`); in B it acts on the empty
/// relist and removes the labels of live, placed models (damage).
fn stale_read(w: &mut World, opts: &Options, extra: &mut Extra) {
    for n in 0..opts.nodes {
        w.api.node_labels[n].insert("pool".into(), "a".into());
    }
    for i in 0..opts.models {
        let spec = ModelSpec::simple(&format!("local:///mnt/share/f-{i:04}"), None);
        w.create(ModelKey::cluster(&format!("f-{i:04}")), spec, true);
    }
    let a_spec = |i: usize, pool: &str| selecting("hf://org/weights", Some(&format!("/mnt/models/a-{i}")), pool);
    let b_spec = |i: usize, pool: &str| selecting(&format!("local:///mnt/share/b-{i}"), None, pool);
    let a: Vec<ModelKey> = (0..3).map(|i| ModelKey::cluster(&format!("a-{i}"))).collect();
    let b: Vec<ModelKey> = (0..3).map(|i| ModelKey::namespaced("team", &format!("b-{i}"))).collect();
    for i in 0..3 {
        w.create(a[i].clone(), a_spec(i, "a"), true);
        w.create(b[i].clone(), b_spec(i, "a"), true);
    }
    start_fleet(w);
    w.timing = Timing { read_ms_min: 3_000, read_ms_max: 4_000, relist_ms_max: 100, ..Timing::default() };
    let (withdrawals, downloads) = (w.counters.withdrawals(), w.counters.downloads);
    a.iter().enumerate().for_each(|(i, k)| w.update(k, a_spec(i, "b")));
    w.run_for(1_000);
    a.iter().enumerate().for_each(|(i, k)| w.update(k, a_spec(i, "a")));
    w.run_for(MINUTE);
    let phase_a = w.counters.withdrawals() - withdrawals;
    extra.insert("phase_a_withdrawals".into(), phase_a.into());
    extra.insert("phase_a_downloads".into(), (w.counters.downloads - downloads).into());
    extra.insert("phase_a_labels_ready".into(), format!("{}/{}", ready_labels(w, &a), 3 * opts.nodes).into());
    if opts.agent == AgentKind::Core && phase_a > 0 {
        w.violation(format!("an older read answer undid a newer view: {phase_a} withdrawals"));
    }
    w.run_for(2 * MINUTE);
    for n in 0..opts.nodes {
        w.relist(n, Kind::BaseModel, ListShape::Empty);
    }
    w.run_for(1_000);
    b.iter().enumerate().for_each(|(i, k)| w.update(k, b_spec(i, "b")));
    w.run_for(MINUTE);
    let left =
        (0..opts.nodes).map(|n| b.iter().filter(|k| w.api.labels[n].contains_key(wire::label_key(k).as_str())).count());
    extra.insert("phase_b_labels_left".into(), left.sum::<usize>().into());
    heal_and_settle(w, 10);
}

/// Issue 7, hole 2 (node-feature-discovery #1802): every label of every node vanishes for 90 s,
/// for the Node watch and live GETs alike, then comes back. Three in five models select
/// pool=a, far over the breaker's 25 %: the core holds their exits, reads again 5 min later,
/// finds the labels back and withdraws nothing (`wipe_withdrawals` 0). A user creates a model
/// 30 s into the wipe, and one that selects pool=a after it.
/// Then a real mass delete of 40 % of the models (over the breaker too) must still complete,
/// after the hold (`mass_delete_done_s`).
///
/// The upstream model has no Node watch, so the wipe alone makes it withdraw nothing; but the
/// add during the wipe makes it GET the wiped Node and keep it, so the model created after the
/// wipe is never placed (a liveness failure). It deletes at once on the mass delete.
fn node_label_wipe(w: &mut World, opts: &Options, extra: &mut Extra) {
    for n in 0..opts.nodes {
        w.api.node_labels[n].insert("pool".into(), "a".into());
        w.api.node_labels[n].insert("zone".into(), format!("z{}", n % 3));
    }
    let keys: Vec<ModelKey> = (0..opts.models)
        .map(|i| {
            let (key, mut spec) = model(i, (i as u64 * 7) % 10);
            if i % 5 < 3 {
                spec.node_selector = vec![("pool".into(), "a".into())];
            }
            w.create(key.clone(), spec, true);
            key
        })
        .collect();
    start_fleet(w);
    let before = w.counters.withdrawals();
    for n in 0..opts.nodes {
        w.wipe_node_labels(n, 90_000);
    }
    w.run_for(30_000);
    w.create(ModelKey::cluster("during-wipe"), ModelSpec::simple("vendor://nvidia/nim/x", None), true);
    w.run_for(70_000);
    w.create(ModelKey::cluster("after-wipe"), selecting("vendor://nvidia/nim/y", None, "a"), true);
    w.run_for(10 * MINUTE);
    let withdrawals = w.counters.withdrawals() - before;
    extra.insert("wipe_withdrawals".into(), withdrawals.into());
    if opts.agent == AgentKind::Core && withdrawals > 0 {
        w.violation(format!("a transient wipe of node labels made {withdrawals} withdrawals"));
    }
    let doomed: Vec<ModelKey> = keys.iter().enumerate().filter(|(i, _)| i % 5 < 2).map(|(_, k)| k.clone()).collect();
    extra.insert("mass_deleted".into(), doomed.len().into());
    let t0 = w.now;
    doomed.iter().for_each(|k| w.delete(k));
    while doomed.iter().any(|k| w.api.objects.contains_key(k)) && w.now - t0 < 20 * MINUTE {
        w.run_for(10_000);
    }
    let left = doomed.iter().filter(|k| w.api.objects.contains_key(k)).count();
    extra.insert("mass_delete_done_s".into(), ((w.now - t0) / 1000).into());
    if left > 0 {
        w.violation(format!("a real mass delete did not complete: {left} objects held by their finalizer"));
    }
    heal_and_settle(w, 10);
}

/// Issue 7, hole 3: ClusterBaseModel `basemodel.x` and BaseModel `x` in namespace
/// `clusterbasemodel` share one node label and one ConfigMap key. The BaseModel comes first
/// and owns the key; the ClusterBaseModel arrives and, ranking first, takes it over
/// (`cbm_entries`: nodes whose entry carries its uid). The BaseModel is then deleted: the
/// shared label must stay on every node (`shared_label_missing` 0; the upstream model removes
/// the live ClusterBaseModel's label on every node). `--models` filler models run alongside.
fn label_collision(w: &mut World, opts: &Options, extra: &mut Extra) {
    populate(w, opts.models, false);
    let bm = ModelKey::namespaced("clusterbasemodel", "x");
    let cbm = ModelKey::cluster("basemodel.x");
    let shared_label = wire::label_key(&cbm);
    assert_eq!(shared_label, wire::label_key(&bm), "the keys collide");
    w.create(bm.clone(), ModelSpec::simple("local:///mnt/share/bm-x", None), false);
    start_fleet(w);
    w.create(cbm.clone(), ModelSpec::simple("local:///mnt/share/cbm-x", None), false);
    w.run_for(MINUTE);
    let cbm_uid = w.api.objects.get(&cbm).map(|o| o.uid.as_str().to_string()).unwrap_or_default();
    let cm_key = wire::configmap_key(&cbm);
    let owned = (0..opts.nodes)
        .filter(|n| w.api.entries[*n].get(cm_key.as_str()).is_some_and(|e| e.uid.as_deref() == Some(cbm_uid.as_str())))
        .count();
    extra.insert("cbm_entries".into(), owned.into());
    w.delete(&bm);
    w.run_for(30_000);
    let missing = (0..opts.nodes).filter(|n| !w.api.labels[*n].contains_key(shared_label.as_str())).count();
    extra.insert("shared_label_missing".into(), missing.into());
    if opts.agent == AgentKind::Core && (missing > 0 || owned < opts.nodes) {
        w.violation(format!("shared key: {missing} nodes lost the label, {owned} of {} show the owner", opts.nodes));
    }
    heal_and_settle(w, 10);
}

/// Issue 10, one copy per revision. The cast: ClusterBaseModels and BaseModels in three
/// namespaces with `downloadPolicy: ReuseIfExists` on `hf://org/qwen` (and two on `@v2`, a
/// second commit), each at a path of its own that each node links to its one copy of the
/// commit under `_artifacts/`; and three models of one source at one path (`AlwaysDownload`),
/// which share that directory. `--models` / 2 filler models run alongside. For 15 minutes,
/// drawn from the seed: deletes, re-creates (some switching to `AlwaysDownload` at the same
/// path), policy switches in place, selector and node label changes that move models between
/// nodes, and CRD storms served empty, stale or part-way (phantom deletes). Then the cast is
/// restored, placed everywhere, and the `@v2` models are deleted: that copy must leave every
/// node. The world's checks: no copy (or shared path) is trashed while a live model placed on
/// that node uses it, and at quiescence every model links to its copy, no link is stale and no
/// copy is left that no live model placed there uses. `copies_made`, `links_made`, `unlinks`
/// and `copies_trashed` show the sharing happened (the core must make copies, several links
/// and trash at least one copy).
fn shared_copy(w: &mut World, opts: &Options, extra: &mut Extra) {
    populate(w, opts.models / 2, false);
    vocab::label_fleet(w);
    let cast = shared_cast();
    for m in &cast {
        w.create(m.key.clone(), m.spec(true, false), true);
    }
    start_fleet(w);
    let mut p = Prng::new(opts.seed ^ 0x5AA_2ED);
    for _ in 0..45 {
        for _ in 0..2 {
            shared_churn(w, &mut p, &cast, opts.models);
        }
        w.run_for(20_000);
    }
    for m in &cast {
        match w.api.objects.get(&m.key).filter(|o| !o.deleting()) {
            Some(_) => w.update(&m.key, m.spec(true, false)),
            None => w.create(m.key.clone(), m.spec(true, false), true),
        }
    }
    w.run_for(2 * MINUTE);
    cast.iter().filter(|m| m.role == Role::Reuse { v2: true }).for_each(|m| w.delete(&m.key));
    heal_and_settle(w, 10);
    let c = w.counters.clone();
    let counts = [("copies_made", c.copies_made), ("links_made", c.links_made), ("unlinks", c.unlinks)];
    for (name, n) in counts.into_iter().chain([("copies_trashed", c.copies_trashed)]) {
        extra.insert(name.into(), n.into());
    }
    extra.insert("orphan_links".into(), w.orphan_links().into());
    let exercised = c.copies_made > 0 && c.links_made >= 3 && c.unlinks > 0 && c.copies_trashed > 0;
    if opts.agent == AgentKind::Core && !exercised {
        w.violation(format!("the run did not exercise shared copies: {c:?}"));
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// `ReuseIfExists` on `hf://org/qwen` (`@v2` when `v2`).
    Reuse { v2: bool },
    /// `hf://org/pair` at `/mnt/models/pair`, with every other model of this role.
    SamePath,
}

struct CastMember {
    key: ModelKey,
    role: Role,
}

impl CastMember {
    /// Its spec: `reuse` false makes a `Reuse` member download its own copy at its path.
    fn spec(&self, reuse: bool, selects: bool) -> ModelSpec {
        let mut s = match self.role {
            Role::Reuse { v2 } => {
                let dir = if self.key.namespace.is_empty() { "cluster" } else { &self.key.namespace };
                let uri = if v2 { "hf://org/qwen@v2" } else { "hf://org/qwen" };
                let mut s = ModelSpec::simple(uri, Some(&format!("/mnt/models/{dir}/{}", self.key.name)));
                if reuse {
                    s.download_policy = model_agent_core::model::DownloadPolicy::ReuseIfExists;
                }
                s
            }
            Role::SamePath => ModelSpec::simple("hf://org/pair", Some("/mnt/models/pair")),
        };
        if selects {
            s.node_selector.push((vocab::SELECTOR.0.into(), vocab::SELECTOR.1.into()));
        }
        s
    }
}

fn shared_cast() -> Vec<CastMember> {
    let reuse = |key: ModelKey, v2: bool| CastMember { key, role: Role::Reuse { v2 } };
    let mut cast: Vec<CastMember> = (0..3).map(|i| reuse(ModelKey::cluster(&format!("qwen-{i}")), false)).collect();
    for ns in ["team-a", "team-b", "team-c"] {
        cast.push(reuse(ModelKey::namespaced(ns, "qwen"), false));
    }
    cast.push(reuse(ModelKey::cluster("qwen-v2"), true));
    cast.push(reuse(ModelKey::namespaced("team-a", "qwen-v2"), true));
    for key in [ModelKey::cluster("prefill"), ModelKey::cluster("decode"), ModelKey::namespaced("team-b", "router")] {
        cast.push(CastMember { key, role: Role::SamePath });
    }
    cast
}

/// One action drawn from `p` on a member of `cast` or on the fleet.
fn shared_churn(w: &mut World, p: &mut Prng, cast: &[CastMember], models: usize) {
    let m = &cast[p.up_to(cast.len() as u64 - 1) as usize];
    let live = w.api.objects.get(&m.key).filter(|o| !o.deleting()).map(|o| o.spec().clone());
    let reuses = live.as_ref().is_some_and(|s| oracle::reuses(s));
    let selects = live.as_ref().is_some_and(|s| !s.node_selector.is_empty());
    match p.up_to(9) {
        0 => {
            if let Some(o) = w.api.objects.get_mut(&m.key) {
                o.finalizer &= p.up_to(1) == 0;
            }
            w.delete(&m.key);
        }
        1 => {
            if let Some(o) = w.api.objects.get_mut(&m.key) {
                o.finalizer = false;
            }
            w.delete(&m.key);
            let spec = m.spec(p.up_to(3) != 0, p.up_to(2) == 0);
            w.create(m.key.clone(), spec, true);
        }
        2 => w.create(m.key.clone(), m.spec(true, p.up_to(2) == 0), true),
        3 if live.is_some() => w.update(&m.key, m.spec(reuses, !selects)),
        4 if live.is_some() && m.role != Role::SamePath => w.update(&m.key, m.spec(!reuses, selects)),
        5 => {
            let node = p.up_to(w.nodes.len() as u64 - 1) as usize;
            let present = !w.api.node_labels[node].contains_key(vocab::SELECTOR.0);
            w.set_node_label(node, vocab::SELECTOR.0, present.then_some(vocab::SELECTOR.1));
        }
        6 => {
            let kind = if p.up_to(1) == 0 { Kind::ClusterBaseModel } else { Kind::BaseModel };
            w.crd_change(kind, |_, prng| bad_list(prng, models));
        }
        _ => {}
    }
}

/// Knobs drawn from one seed for a swarm run.
#[derive(Clone, Debug, Serialize)]
pub struct SwarmKnobs {
    pub nodes: usize,
    pub models: usize,
    pub minutes: u64,
    /// Per-mille chances of each action of [`vocab::Action`] in one minute.
    pub weights: vocab::Weights,
    pub read_timeout_permille: u64,
    /// Live-read answers arrive up to this long after being served (past the core's 10 s
    /// deadline for some seeds).
    pub read_ms_max: u64,
    pub node_watch_ms_max: u64,
    pub read_only_nodes: usize,
}

pub fn swarm_knobs(seed: u64, nodes: Option<usize>, models: Option<usize>) -> SwarmKnobs {
    let mut p = Prng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(17));
    let nodes = nodes.unwrap_or(2 + p.up_to(5) as usize);
    let weights = vocab::Weights {
        storm: p.up_to(300),
        outage: p.up_to(80),
        read_fail: p.up_to(150),
        crash: p.up_to(150),
        shutdown: p.up_to(80),
        delete: p.up_to(300),
        recreate: p.up_to(200),
        create: 200,
        reselect: p.up_to(200),
        node_label: p.up_to(100),
        wipe: p.up_to(100),
        source: 0,
        reserve: 0,
        remove_copies: 0,
    };
    let mut k = SwarmKnobs {
        nodes,
        models: models.unwrap_or(5 + p.up_to(30) as usize),
        minutes: 20 + p.up_to(20),
        weights,
        read_timeout_permille: p.up_to(200),
        read_ms_max: [30, 500, 3_000, 12_000][p.up_to(3) as usize],
        node_watch_ms_max: [50, 2_000, 30_000][p.up_to(2) as usize],
        read_only_nodes: p.up_to(nodes as u64 / 2) as usize,
    };
    // Drawn last, so that the knobs before it are what they were before this action existed:
    // none in half of the seeds, 2-15 % a minute in the others.
    k.weights.source = if p.up_to(1) == 0 { 0 } else { 20 + p.up_to(130) };
    k.weights.reserve = if p.up_to(1) == 0 { 0 } else { 20 + p.up_to(180) };
    k.weights.remove_copies = if p.up_to(1) == 0 { 0 } else { 10 + p.up_to(90) };
    k
}

/// One swarm run: a safety phase with actions and faults drawn from the seed (from the shared
/// vocabulary, [`vocab`]), then the liveness phase with the faults healed.
pub fn swarm_run(seed: u64, nodes: Option<usize>, models: Option<usize>) -> (Report, World, SwarmKnobs) {
    swarm_run_knobs(seed, swarm_knobs(seed, nodes, models))
}

/// One swarm run with the knobs given (a seed's own, or changed: with `weights.source` 0 a
/// seed runs as it did before `Action::Source` existed).
pub fn swarm_run_knobs(seed: u64, k: SwarmKnobs) -> (Report, World, SwarmKnobs) {
    let opts = Options { nodes: k.nodes, models: k.models, seed, record_traces: true, ..Options::default() };
    let mut w = new_world(&opts);
    for n in 0..k.read_only_nodes {
        w.nodes[n].root_writable = false;
    }
    vocab::label_fleet(&mut w);
    let mut p = Prng::new(seed ^ 0xFA_17);
    let mut names: Vec<usize> = (0..k.models).collect();
    for &name in &names {
        let a = vocab::Action::Create { name, uri: vocab::draw_uri(&mut p), selects: p.up_to(3) == 0 };
        vocab::apply(&mut w, &a);
    }
    let mut next_name = k.models;
    // `Action::Source` is drawn from a PRNG of its own: a seed that draws none runs as before.
    let mut q = Prng::new(seed ^ 0x50_0CE);
    // As are `Action::Reserve` and `Action::RemoveCopies`.
    let mut r = Prng::new(seed ^ 0x2E_5E2E);
    let mut c = Prng::new(seed ^ 0xC0_91E5);
    start_fleet(&mut w);
    w.read_timeout_permille = k.read_timeout_permille;
    let latency = vocab::Action::Latency { read_ms_max: k.read_ms_max, node_watch_ms_max: k.node_watch_ms_max };
    vocab::apply(&mut w, &latency);
    for _minute in 0..k.minutes {
        let minute = vocab::draw_minute(&mut p, &k.weights, k.nodes, &mut names, &mut next_name);
        // First, after the last minute's wait (the directory's members are more often settled
        // Ready than right after the minute's creates and faults).
        let extra = vocab::draw_source(&mut q, &k.weights, k.nodes).into_iter();
        let extra = extra.chain(vocab::draw_reserve(&mut r, &k.weights));
        let extra = extra.chain(vocab::draw_remove_copies(&mut c, &k.weights, k.nodes));
        for a in extra.chain(minute) {
            vocab::apply(&mut w, &a);
        }
    }
    // Liveness: faults healed, every node running; enough time for the longest backoff (5 min),
    // a breaker hold (5 min) and a drift pass.
    for n in 0..k.nodes {
        w.nodes[n].root_writable = n >= k.read_only_nodes;
        if matches!(w.nodes[n].agent, crate::world::Agent::Stopped) {
            w.start(n);
        }
    }
    heal_and_settle(&mut w, 20);
    let mut report = Report::from_world("swarm", &opts, &w);
    let c = &w.counters;
    for (name, n) in [("source_switches", c.source_switches), ("other_source_refusals", c.other_source_refusals)] {
        report.extra.insert(name.into(), n.into());
    }
    (report, w, k)
}
