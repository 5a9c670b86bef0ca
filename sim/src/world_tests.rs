//! The simulated shell's checks of shared copies (issue 10): what counts as a copy's user when
//! it is trashed, and what is left over at quiescence.

use super::*;
use model_agent_core::machine::EffectId;
use model_agent_core::model::DownloadPolicy;

const ROOT: &str = "/mnt/models";

/// `ReuseIfExists` on `hf://org/qwen` at `<root>/<path>`.
fn reuse(path: &str) -> ModelSpec {
    ModelSpec {
        download_policy: DownloadPolicy::ReuseIfExists,
        ..ModelSpec::simple("hf://org/qwen", Some(&format!("{ROOT}/{path}")))
    }
}

/// One node, and `team-a/qwen` (live, placed there) with the copy its spec names.
fn world() -> (World, Uid, String) {
    let mut w = World::new(1, AgentKind::Core, 1);
    let spec = reuse("a/qwen");
    let copy = oracle::copy_dir(&spec).expect("a copy");
    w.create(ModelKey::namespaced("team-a", "qwen"), spec, true);
    let uid = w.api.objects.values().next().expect("created").uid.clone();
    (w, uid, copy)
}

fn link(copy: &str, uid: &str, generation: u32) -> Link {
    Link { copy: copy.to_string(), uid: Uid::new(uid), generation }
}

fn trash(w: &mut World, uid: &str, path: &str) {
    let op = Op::TrashDir { key: None, uid: Uid::new(uid), path: path.to_string(), trash_name: format!("{uid}-1") };
    w.execute(0, &Effect { id: EffectId(1), op });
}

#[test]
fn trashing_a_copy_a_live_model_links_to_is_damage_whatever_uid_made_the_link() {
    for maker in ["uid-team-a-qwen", "an-older-uid-of-the-name"] {
        let (mut w, uid, copy) = world();
        let maker = if maker.starts_with("uid") { uid.as_str().to_string() } else { maker.to_string() };
        // The marker names only a model gone since; the live model's path links to the copy.
        w.nodes[0].dirs.insert(copy.clone(), [Uid::new("gone")].into());
        w.nodes[0].links.insert("a/qwen".into(), link(&copy, &maker, 0));
        trash(&mut w, "gone", &copy);
        assert_eq!(w.counters.dir_removals_live, 1, "made by {maker}");
        assert_eq!(w.counters.copies_trashed, 1);
        assert!(w.violations[0].contains(&format!("weights of live uid {uid}")), "{:?}", w.violations);
    }
}

#[test]
fn trashing_a_copy_whose_marker_names_a_live_model_using_it_is_damage() {
    let (mut w, uid, copy) = world();
    // Downloaded into the copy, not linked yet.
    w.nodes[0].dirs.insert(copy.clone(), [uid.clone(), Uid::new("gone")].into());
    trash(&mut w, "gone", &copy);
    assert_eq!(w.counters.dir_removals_live, 1, "{:?}", w.violations);
}

#[test]
fn trashing_a_copy_no_live_model_uses_is_cleanup() {
    let (mut w, uid, copy) = world();
    // The live model downloaded its own copy at its path; the marker of the shared one names it.
    let mut own = reuse("a/qwen");
    own.download_policy = DownloadPolicy::AlwaysDownload;
    w.update(&ModelKey::namespaced("team-a", "qwen"), own);
    w.nodes[0].dirs.insert(copy.clone(), [uid.clone()].into());
    trash(&mut w, "gone", &copy);
    assert!(w.nodes[0].dirs.contains_key(&copy), "a marker not naming the uid leaves it in place");
    trash(&mut w, uid.as_str(), &copy);
    assert_eq!((w.counters.dir_removals, w.counters.dir_removals_live), (1, 0), "{:?}", w.violations);
    assert!(w.violations.is_empty());
}

/// The node's leftover problems at quiescence, as text.
fn leftovers(w: &World) -> Vec<String> {
    let expects = w.expects();
    let placed: Vec<&Expect> = expects.iter().filter(|e| w.api.placed(&e.spec, 0)).collect();
    let mut problems = Vec::new();
    w.node_links(0, &placed, &mut problems);
    problems.into_iter().map(|(_, _, p)| p).collect()
}

#[test]
fn at_quiescence_a_copy_no_live_model_uses_and_a_stale_link_are_left_over() {
    let (mut w, uid, copy) = world();
    w.nodes[0].dirs.insert(copy.clone(), [uid.clone()].into());
    w.nodes[0].links.insert("a/qwen".into(), link(&copy, uid.as_str(), 0));
    assert!(leftovers(&w).is_empty(), "{:?}", leftovers(&w));
    // Its model deleted: the copy and this process's link are left over.
    w.api.objects.clear();
    let problems = leftovers(&w);
    assert!(problems.iter().any(|p| p.contains("stale link a/qwen")), "{problems:?}");
    assert!(problems.iter().any(|p| p.contains(&format!("shared copy {copy} is in place"))), "{problems:?}");
}

#[test]
fn a_link_an_earlier_process_left_is_counted_not_held_against_this_one() {
    let (mut w, uid, copy) = world();
    w.nodes[0].generation = 2;
    w.nodes[0].links.insert("b/qwen".into(), link(&copy, "gone", 1));
    w.nodes[0].links.insert("a/qwen".into(), link(&copy, uid.as_str(), 1));
    w.nodes[0].dirs.insert(copy, [uid].into());
    assert!(leftovers(&w).is_empty(), "{:?}", leftovers(&w));
    assert_eq!(w.orphan_links(), 1, "b/qwen: no live model's path");
}

/// Two nodes, three `vendor://` models, settled: then one node's labels and entries are tampered
/// with. The convergence check must name each problem, on that node only, labels in key order.
#[test]
fn the_convergence_check_names_wrong_missing_and_stale_labels_and_entries() {
    let mut w = World::new(2, AgentKind::Core, 1);
    for name in ["a", "b", "c"] {
        w.create(ModelKey::cluster(name), ModelSpec::simple("vendor://nvidia/nim/x", None), true);
    }
    w.start(0);
    w.start(1);
    w.run_for(60_000);
    w.check_converged();
    assert!(w.violations.is_empty(), "{:#?}", w.violations);
    let label = |name: &str| wire::label_key(&ModelKey::cluster(name));
    w.api.labels[1].insert(label("c").into(), "Failed".into());
    w.api.labels[1].remove(label("a").as_str());
    w.api.labels[1].insert("models.ome.io/clusterbasemodel.gone".into(), "Ready".into());
    w.api.entries[1].remove(wire::configmap_key(&ModelKey::cluster("b")).as_str());
    w.check_converged();
    let found: Vec<&str> = w.violations.iter().map(|v| v.split_once(' ').expect("t=").1).collect();
    assert_eq!(
        found,
        [
            "node 1: liveness: entry clusterbasemodel.b is None, expected Ready of uid-b-2",
            "node 1: liveness: label models.ome.io/clusterbasemodel.a is None, expected Ready",
            "node 1: liveness: label models.ome.io/clusterbasemodel.c is Some(\"Failed\"), expected Ready",
            "node 1: liveness: stale label models.ome.io/clusterbasemodel.gone",
        ],
        "{:#?}",
        w.violations
    );
}
