//! Property tests: generated interleavings of user actions and faults, run through the simulator
//! with every node running the real core. After every step the safety invariants of
//! `reliability.md` §4.3 must hold (the simulated shell checks each destructive effect against
//! the ground truth when it lands: phantom safety, no action on stale views, UID fencing, no
//! destructive effect after shutdown began, filesystem containment, label and node scope). At
//! quiescence, after the faults heal, the liveness ones must hold: every cleanup done despite
//! read failures, convergence after crashes and restarts, and a second reconcile adds no effect.
//!
//! `PROPTEST_CASES=1000 cargo test -p model-agent-proptests` raises the case count (default 48).
//! A failing case shrinks, and its nodes' traces are written under
//! `target/proptest-traces/` for `model-agent-sim replay FILE`.

use proptest::prelude::*;

use model_agent_core::{Kind, ModelKey, ModelSpec};
use model_agent_sim::scenario::{Options, new_world};
use model_agent_sim::world::{Agent, ListShape, World};

const NODES: usize = 3;
const NAMES: usize = 6;

#[derive(Clone, Debug)]
enum Action {
    Create {
        name: usize,
        uri: u8,
        gpu_only: bool,
    },
    Delete {
        name: usize,
        finalizer: bool,
    },
    Recreate {
        name: usize,
        uri: u8,
    },
    /// A node gains or loses the `gpu=true` label that some models select.
    Placement {
        node: usize,
        gpu: bool,
    },
    Storm {
        kind: Kind,
        shape: u8,
    },
    Outage {
        ms: u64,
    },
    ReadsFail {
        ms: u64,
    },
    ReadTimeouts {
        permille: u64,
    },
    Crash {
        node: usize,
        down_ms: u64,
    },
    Shutdown {
        node: usize,
        exit_ms: u64,
    },
    ReadOnlyRoot {
        node: usize,
        read_only: bool,
    },
    Wait {
        ms: u64,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..NAMES, 0u8..4, any::<bool>()).prop_map(|(name, uri, gpu_only)| Action::Create { name, uri, gpu_only }),
        2 => (0..NAMES, any::<bool>()).prop_map(|(name, finalizer)| Action::Delete { name, finalizer }),
        2 => (0..NAMES, 0u8..4).prop_map(|(name, uri)| Action::Recreate { name, uri }),
        1 => (0..NODES, any::<bool>()).prop_map(|(node, gpu)| Action::Placement { node, gpu }),
        2 => (prop_oneof![Just(Kind::ClusterBaseModel), Just(Kind::BaseModel)], 0u8..4)
            .prop_map(|(kind, shape)| Action::Storm { kind, shape }),
        1 => (1_000u64..600_000).prop_map(|ms| Action::Outage { ms }),
        1 => (1_000u64..1_200_000).prop_map(|ms| Action::ReadsFail { ms }),
        1 => (0u64..500).prop_map(|permille| Action::ReadTimeouts { permille }),
        1 => (0..NODES, 0u64..60_000).prop_map(|(node, down_ms)| Action::Crash { node, down_ms }),
        1 => (0..NODES, 0u64..30_000).prop_map(|(node, exit_ms)| Action::Shutdown { node, exit_ms }),
        1 => (0..NODES, any::<bool>()).prop_map(|(node, read_only)| Action::ReadOnlyRoot { node, read_only }),
        3 => (1u64..120_000).prop_map(|ms| Action::Wait { ms }),
    ]
}

fn key(name: usize) -> ModelKey {
    if name % 3 == 2 {
        ModelKey::namespaced("team", &format!("p-{name}"))
    } else {
        ModelKey::cluster(&format!("p-{name}"))
    }
}

fn spec(name: usize, uri: u8, gpu_only: bool) -> ModelSpec {
    let mut s = match uri {
        0 => ModelSpec::simple(&format!("local:///mnt/share/p-{name}"), None),
        1 => ModelSpec::simple("hf://org/weights", Some(&format!("/mnt/models/p-{name}"))),
        2 => ModelSpec::simple("vendor://nvidia/nim/x", None),
        _ => ModelSpec::simple("oci://n/ns/b/bucket/o/weights", Some("")),
    };
    if gpu_only {
        s.node_selector.push(("gpu".into(), "true".into()));
    }
    s
}

/// Apply one action, then check that no safety invariant broke.
fn apply(w: &mut World, a: &Action) {
    match *a {
        Action::Create { name, uri, gpu_only } => w.create(key(name), spec(name, uri, gpu_only), true),
        Action::Delete { name, finalizer } => {
            if let Some(o) = w.api.objects.get_mut(&key(name)) {
                o.finalizer &= finalizer;
            }
            w.delete(&key(name));
        }
        Action::Recreate { name, uri } => {
            if let Some(o) = w.api.objects.get_mut(&key(name)) {
                o.finalizer = false;
            }
            w.delete(&key(name));
            w.create(key(name), spec(name, uri, false), true);
        }
        Action::Placement { node, gpu } => w.set_node_label(node, "gpu", gpu.then_some("true")),
        Action::Storm { kind, shape } => {
            let shape = match shape {
                0 => ListShape::Empty,
                1 => ListShape::Stale { lag_rv: 3 },
                2 => ListShape::Partial,
                _ => ListShape::Quorum,
            };
            w.crd_change(kind, |_, _| shape);
        }
        Action::Outage { ms } => {
            w.set_outage(true);
            w.run_for(ms);
            w.set_outage(false);
        }
        Action::ReadsFail { ms } => {
            w.api.reads_fail = true;
            w.run_for(ms);
            w.api.reads_fail = false;
        }
        Action::ReadTimeouts { permille } => w.read_timeout_permille = permille,
        Action::Crash { node, down_ms } => {
            w.stop(node);
            w.run_for(down_ms);
            w.start(node);
        }
        Action::Shutdown { node, exit_ms } => {
            if !matches!(w.nodes[node].agent, Agent::Stopped) {
                w.shutdown(node);
                w.run_for(exit_ms);
                w.stop(node);
                w.start(node);
            }
        }
        Action::ReadOnlyRoot { node, read_only } => w.nodes[node].root_writable = !read_only,
        Action::Wait { ms } => w.run_for(ms),
    }
    w.run_for(500);
}

fn run(actions: &[Action], seed: u64) -> Result<(), TestCaseError> {
    let opts = Options { nodes: NODES, models: NAMES, seed, record_traces: true, ..Options::default() };
    let mut w = new_world(&opts);
    for n in 0..NODES {
        w.start(n);
    }
    w.run_for(5_000);
    let fail = |w: &World, phase: &str, detail: String| -> TestCaseError {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../proptest-traces");
        let paths = w.write_traces(&dir, &format!("seed-{seed}")).unwrap_or_default();
        TestCaseError::fail(format!("{phase}: {detail}\ntraces: {paths:?}"))
    };
    for (i, a) in actions.iter().enumerate() {
        apply(&mut w, a);
        if !w.violations.is_empty() {
            return Err(fail(&w, &format!("safety after step {i} ({a:?})"), format!("{:#?}", w.violations)));
        }
    }
    // Liveness: heal every fault and wait out the longest backoff (5 min) and a drift pass.
    w.read_timeout_permille = 0;
    for n in 0..NODES {
        w.nodes[n].root_writable = true;
        if matches!(w.nodes[n].agent, Agent::Stopped) {
            w.start(n);
        }
    }
    w.run_for(15 * 60_000);
    w.check_converged();
    let (expected, done) = w.cleanups();
    if !w.violations.is_empty() || expected != done {
        return Err(fail(&w, "liveness", format!("cleanups {done}/{expected}; {:#?}", w.violations)));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn safety_after_every_step_and_liveness_at_quiescence(
        actions in proptest::collection::vec(action(), 1..40),
        seed in any::<u64>(),
    ) {
        run(&actions, seed)?;
    }
}

/// A fixed regression: delete and re-create under one name while a stale list and read
/// failures are in play (the shape of the first swarm failure).
#[test]
fn regression_stale_list_after_recreate() {
    let actions = vec![
        Action::Create { name: 0, uri: 1, gpu_only: false },
        Action::Wait { ms: 60_000 },
        Action::Recreate { name: 0, uri: 0 },
        Action::Crash { node: 1, down_ms: 5_000 },
        Action::Storm { kind: Kind::ClusterBaseModel, shape: 1 },
        Action::ReadTimeouts { permille: 300 },
        Action::Recreate { name: 0, uri: 1 },
        Action::Storm { kind: Kind::ClusterBaseModel, shape: 1 },
        Action::Wait { ms: 300_000 },
    ];
    run(&actions, 7).unwrap();
}
