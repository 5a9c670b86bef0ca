//! Named scenarios (the incidents and the failure mechanisms of `reliability.md` §1.1), the
//! report each run prints, and the swarm: many seeds with fault knobs drawn from each, a safety
//! phase with faults, then a liveness phase with the faults healed.

use serde::Serialize;
use std::collections::BTreeMap;

use model_agent_core::prng::Prng;
use model_agent_core::{Kind, ModelKey, ModelSpec};

use crate::world::{AgentKind, ListShape, World};

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
];

#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: usize,
    pub models: usize,
    pub seed: u64,
    pub agent: AgentKind,
    pub timeline: bool,
    pub record_traces: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { nodes: 10, models: 50, seed: 1, agent: AgentKind::Core, timeline: false, record_traces: false }
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
    w
}

/// Run a named scenario.
pub fn run(name: &str, opts: &Options) -> Result<(Report, World), String> {
    let mut w = new_world(opts);
    let mut extra = BTreeMap::new();
    let m = opts.models;
    match name {
        // The second seed: a server-side apply of the model CRDs drops every watch; relists are
        // served empty, stale or part-way by a cache that is being rebuilt.
        "crd-ssa" => {
            populate(&mut w, m, false);
            start_fleet(&mut w);
            for kind in [Kind::ClusterBaseModel, Kind::BaseModel] {
                w.crd_change(kind, |_, prng| bad_list(prng, m));
                w.run_for(2 * MINUTE);
            }
            heal_and_settle(&mut w, 10);
        }
        // Ten minutes without an API server; some models are deleted meanwhile.
        "apiserver-outage" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 15);
        }
        // A relist from a lagging server: new models missing, deleted ones still shown.
        "stale-relist" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 10);
        }
        // Lists answered before the server synced: empty (node-feature-discovery #1802).
        "unsynced-empty" => {
            populate(&mut w, m, false);
            start_fleet(&mut w);
            for kind in Kind::ALL {
                w.crd_change(kind, |_, _| ListShape::Empty);
            }
            heal_and_settle(&mut w, 10);
        }
        // Delete and re-create under the same name while some nodes miss the DELETED event.
        "delete-recreate" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 10);
        }
        // Live reads fail for an hour (with a phantom storm and real deletes meanwhile).
        "read-failures" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 15);
        }
        // Every model really deleted: every cleanup must complete.
        "real-mass-delete" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
            for key in &keys {
                w.delete(key);
            }
            heal_and_settle(&mut w, 10);
            extra.insert("objects_left".into(), w.api.objects.len().into());
            if !w.api.objects.is_empty() {
                w.violation(format!("{} objects still held by their finalizer", w.api.objects.len()));
            }
        }
        // SIGTERM to half the fleet in the middle of a relist storm with real deletes.
        "shutdown-mid-storm" => {
            let keys = populate(&mut w, m, false);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 10);
        }
        // The first seed: read-only roots serving local:// models; then a DaemonSet rolling update
        // with maxUnavailable 1 must complete.
        "readonly-root" => {
            for n in 0..opts.nodes {
                w.nodes[n].root_writable = false;
            }
            populate(&mut w, m, true);
            start_fleet(&mut w);
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
            heal_and_settle(&mut w, 5);
        }
        other => return Err(format!("unknown scenario {other:?}; known: {}", SCENARIOS.join(", "))),
    }
    let mut report = Report::from_world(name, opts, &w);
    report.extra = extra;
    Ok((report, w))
}

/// Knobs drawn from one seed for a swarm run.
#[derive(Clone, Debug, Serialize)]
pub struct SwarmKnobs {
    pub nodes: usize,
    pub models: usize,
    pub minutes: u64,
    pub storm_permille: u64,
    pub outage_permille: u64,
    pub read_fail_permille: u64,
    pub crash_permille: u64,
    pub shutdown_permille: u64,
    pub delete_permille: u64,
    pub recreate_permille: u64,
    pub read_timeout_permille: u64,
    pub read_only_nodes: usize,
}

pub fn swarm_knobs(seed: u64, nodes: Option<usize>, models: Option<usize>) -> SwarmKnobs {
    let mut p = Prng::new(seed.wrapping_mul(0x9E37_79B9).wrapping_add(17));
    let nodes = nodes.unwrap_or(2 + p.up_to(5) as usize);
    SwarmKnobs {
        nodes,
        models: models.unwrap_or(5 + p.up_to(30) as usize),
        minutes: 20 + p.up_to(20),
        storm_permille: p.up_to(300),
        outage_permille: p.up_to(80),
        read_fail_permille: p.up_to(150),
        crash_permille: p.up_to(150),
        shutdown_permille: p.up_to(80),
        delete_permille: p.up_to(300),
        recreate_permille: p.up_to(200),
        read_timeout_permille: p.up_to(200),
        read_only_nodes: p.up_to(nodes as u64 / 2) as usize,
    }
}

/// One swarm run: a safety phase with faults drawn from the seed, then the liveness phase.
pub fn swarm_run(seed: u64, nodes: Option<usize>, models: Option<usize>) -> (Report, World, SwarmKnobs) {
    let k = swarm_knobs(seed, nodes, models);
    let opts = Options { nodes: k.nodes, models: k.models, seed, record_traces: true, ..Options::default() };
    let mut w = new_world(&opts);
    for n in 0..k.read_only_nodes {
        w.nodes[n].root_writable = false;
    }
    let mut keys = populate(&mut w, k.models, false);
    let mut next_model = k.models;
    start_fleet(&mut w);
    w.read_timeout_permille = k.read_timeout_permille;
    let mut p = Prng::new(seed ^ 0xFA_17);
    let chance = |p: &mut Prng, permille: u64| p.up_to(999) < permille;
    for _minute in 0..k.minutes {
        if chance(&mut p, k.storm_permille) {
            let kind = if p.up_to(1) == 0 { Kind::ClusterBaseModel } else { Kind::BaseModel };
            let models = k.models;
            w.crd_change(kind, |_, prng| bad_list(prng, models));
        }
        if chance(&mut p, k.outage_permille) && !w.api.down {
            w.set_outage(true);
        } else if w.api.down && p.up_to(2) == 0 {
            w.set_outage(false);
        }
        w.api.reads_fail = chance(&mut p, k.read_fail_permille);
        if chance(&mut p, k.delete_permille) && !keys.is_empty() {
            let key = keys.remove(p.up_to(keys.len() as u64 - 1) as usize);
            if p.up_to(1) == 0
                && let Some(o) = w.api.objects.get_mut(&key)
            {
                o.finalizer = false;
            }
            w.delete(&key);
        }
        if chance(&mut p, k.recreate_permille) && !keys.is_empty() {
            let key = keys[p.up_to(keys.len() as u64 - 1) as usize].clone();
            if let Some(o) = w.api.objects.get_mut(&key) {
                o.finalizer = false;
            }
            w.delete(&key);
            let i: usize = key.name[2..].parse().expect("swarm names");
            let (_, spec) = model(i, p.up_to(9));
            w.create(key, spec, true);
        }
        if p.up_to(4) == 0 {
            let (key, spec) = model(next_model, p.up_to(9));
            next_model += 1;
            w.create(key.clone(), spec, true);
            keys.push(key);
        }
        if chance(&mut p, k.crash_permille) {
            let n = p.up_to(k.nodes as u64 - 1) as usize;
            w.stop(n);
            w.run_for(1 + p.up_to(20_000));
            w.start(n);
        }
        if chance(&mut p, k.shutdown_permille) {
            let n = p.up_to(k.nodes as u64 - 1) as usize;
            if !matches!(w.nodes[n].agent, crate::world::Agent::Stopped) {
                w.shutdown(n);
                w.run_for(p.up_to(10_000));
                w.stop(n);
                w.run_for(p.up_to(30_000));
                w.start(n);
            }
        }
        w.run_for(MINUTE);
    }
    // Liveness: faults healed, every node running; enough time for the longest backoff (5 min)
    // and a drift pass.
    for n in 0..k.nodes {
        if matches!(w.nodes[n].agent, crate::world::Agent::Stopped) {
            w.start(n);
        }
    }
    heal_and_settle(&mut w, 15);
    let report = Report::from_world("swarm", &opts, &w);
    (report, w, k)
}
