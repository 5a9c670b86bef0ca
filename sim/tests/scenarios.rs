//! Every scenario for the core: no damage, no violated invariant, every cleanup done. The upstream
//! model shows the damage where the upstream agent did it. Runs are deterministic and traces the
//! fleet records replay byte for byte.

use model_agent_core::ModelSpec;
use model_agent_core::model::DownloadPolicy;
use model_agent_sim::oracle;
use model_agent_sim::scenario::{self, Options, SCENARIOS};
use model_agent_sim::world::AgentKind;

fn opts(agent: AgentKind) -> Options {
    Options { nodes: 6, models: 40, seed: 7, agent, ..Options::default() }
}

#[test]
fn every_scenario_is_clean_for_the_core() {
    for name in SCENARIOS {
        let (r, _) = scenario::run(name, &opts(AgentKind::Core)).unwrap();
        assert!(r.invariant_violations.is_empty(), "{name}: {:#?}", r.invariant_violations);
        assert_eq!((r.label_removals_live, r.entry_removals_live, r.dir_removals_live), (0, 0, 0), "{name}");
        assert_eq!(r.cleanups_done, r.cleanups_expected, "{name}");
    }
}

#[test]
fn the_upstream_model_shows_the_damage_where_upstream_did_it() {
    for name in ["crd-ssa", "unsynced-empty", "stale-relist", "read-failures", "shutdown-mid-storm"] {
        let (r, _) = scenario::run(name, &opts(AgentKind::Upstream)).unwrap();
        assert!(r.label_removals_live > 0, "{name}: upstream removed no live label");
    }
    let (r, _) = scenario::run("readonly-root", &opts(AgentKind::Upstream)).unwrap();
    assert_eq!(r.extra["rollout_completed"], false, "upstream's W_OK readiness stalls the rollout");
    let (r, _) = scenario::run("readonly-root", &opts(AgentKind::Core)).unwrap();
    assert_eq!(r.extra["rollout_completed"], true);
    assert_eq!(r.extra["nodes_ready"], 6);
}

#[test]
fn the_crd_apply_storm_costs_a_few_reads_per_node() {
    let o = Options { nodes: 20, models: 200, ..opts(AgentKind::Core) };
    let (r, _) = scenario::run("crd-ssa", &o).unwrap();
    assert!(r.phantom_deletes_suppressed > 0);
    let per_node = (r.api_get + r.api_list) as f64 / o.nodes as f64;
    assert!(per_node < 3.0, "{} GETs + {} LISTs over {} nodes", r.api_get, r.api_list, o.nodes);
}

/// Issue 14: at most 3 live reads per node in the storm at every fleet size (about one LIST per
/// kind per node; the stragglers share a window's LIST), and no damage. Timed without the
/// per-step audit (the invariants are checked once at the end; `every_scenario_is_clean_for_the_core`
/// audits every step).
#[test]
fn the_crd_apply_storm_costs_at_most_3_reads_per_node_at_every_fleet_size() {
    for (nodes, models) in [(10, 10), (50, 50), (100, 100), (200, 50), (50, 200)] {
        for seed in [1, 7] {
            let o = Options { nodes, models, seed, audit_every_step: false, ..opts(AgentKind::Core) };
            let (r, _) = scenario::run("crd-ssa", &o).unwrap();
            let at = format!("{nodes} nodes x {models} models, seed {seed}");
            assert!(r.phantom_deletes_suppressed > 0, "{at}: no storm");
            let per_node = (r.api_get + r.api_list) as f64 / nodes as f64;
            assert!(per_node <= 3.0, "{at}: {} GETs + {} LISTs over {nodes} nodes", r.api_get, r.api_list);
            assert_eq!((r.label_removals_live, r.entry_removals_live, r.dir_removals_live), (0, 0, 0), "{at}");
            assert!(r.invariant_violations.is_empty(), "{at}: {:#?}", r.invariant_violations);
        }
    }
}

#[test]
fn read_failures_keep_candidates_pending_and_visible_then_clean_up() {
    let (r, _) = scenario::run("read-failures", &opts(AgentKind::Core)).unwrap();
    assert!(r.extra["pending_confirmations_during_failures"].as_u64().unwrap() > 0);
    assert!(r.cleanups_expected > 0);
    assert_eq!(r.cleanups_done, r.cleanups_expected);
}

#[test]
fn one_seed_reproduces_a_run_and_another_differs() {
    let json = |seed| {
        let (r, _) = scenario::run("crd-ssa", &Options { seed, ..opts(AgentKind::Core) }).unwrap();
        serde_json::to_string(&r).unwrap()
    };
    assert_eq!(json(3), json(3));
    assert_ne!(json(3), json(4));
}

#[test]
fn swarm_of_50_seeds_passes() {
    let (mut cancelled, mut links, mut copies_trashed, mut removed_by_hand) = (0, 0, 0, 0);
    for seed in 0..50 {
        let (r, world, knobs) = scenario::swarm_run(seed, None, None);
        assert!(r.clean(), "seed {seed} ({knobs:?}): {:#?}", r.invariant_violations);
        cancelled += world.counters.downloads_cancelled;
        links += world.counters.links_made;
        copies_trashed += world.counters.copies_trashed;
        removed_by_hand += world.counters.copies_removed_by_hand;
    }
    // The swarm covers a delete or placement exit during a download (the simulator checks the
    // directory is trashed only after the download stopped). Rare (2 of seeds 0-299 since the
    // unknown-uid rule shifted the runs): looked for further when these 50 have none.
    let cancels = |seed| scenario::swarm_run(seed, None, None).1.counters.downloads_cancelled;
    assert!(cancelled > 0 || (50..500).any(|seed| cancels(seed) > 0), "no seed cancelled a download");
    // And shared copies: models linked to one, and copies that lost their last user trashed.
    assert!(links > 0 && copies_trashed > 0, "links {links}, copies trashed {copies_trashed}");
    // And copies removed by hand, which the end of each run finds fetched again.
    assert!(removed_by_hand > 0, "no seed removed a copy by hand");
}

#[test]
fn one_copy_per_revision_is_shared_kept_while_used_and_trashed_once_unused() {
    let (r, world) = scenario::run("shared-copy", &opts(AgentKind::Core)).unwrap();
    assert!(r.clean(), "{:#?}", r.invariant_violations);
    let count = |k: &str| r.extra[k].as_u64().unwrap();
    assert!(count("copies_made") > 0 && count("links_made") >= 3 && count("unlinks") > 0, "{:?}", r.extra);
    assert!(count("copies_trashed") > 0, "{:?}", r.extra);
    // Every `@v2` model was deleted at the end: that copy left every node; the other stayed.
    let spec = |uri: &str| ModelSpec { download_policy: DownloadPolicy::ReuseIfExists, ..ModelSpec::simple(uri, None) };
    let (v2, main) = (oracle::copy_dir(&spec("hf://org/qwen@v2")), oracle::copy_dir(&spec("hf://org/qwen")));
    for node in &world.nodes {
        assert!(!node.dirs.contains_key(&v2.clone().unwrap()));
        assert!(node.dirs.contains_key(&main.clone().unwrap()));
        // (A model that downloaded its own copy at its path while `AlwaysDownload` keeps it.)
        assert!(node.links.values().any(|l| Some(&l.copy) == main.as_ref()), "{:?}", node.links);
    }
}

#[test]
fn the_fleet_s_recorded_traces_replay_byte_for_byte() {
    let o = Options { record_traces: true, ..opts(AgentKind::Core) };
    let (_, world) = scenario::run("delete-recreate", &o).unwrap();
    for node in &world.nodes {
        let text = node.recorder.as_ref().unwrap().text();
        let trace = model_agent_core::trace::parse(&text).unwrap();
        assert!(trace.steps.len() > 10);
        let (_, divergence) = model_agent_core::trace::replay(&trace);
        assert_eq!(divergence, None);
    }
}

#[test]
fn unknown_scenarios_are_a_clear_error() {
    let err = scenario::run("nope", &Options::default()).err().unwrap();
    assert!(err.contains("unknown scenario \"nope\"") && err.contains("crd-ssa"));
}
