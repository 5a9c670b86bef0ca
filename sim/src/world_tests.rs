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

// ---------------------------------------------------------------------------------------------
// Same path, same source (README): a directory's files carry their source
// ---------------------------------------------------------------------------------------------

const PAIR: &str = "hf://org/pair";
const PAIR_B: &str = "hf://org/pair-b";

/// One node, no agent: `u` (of `hf://org/pair`) and `x` (of `hf://org/pair-b`), both at
/// `/mnt/models/pair`, whose marker names both and whose files are `u`'s source; `u` is
/// labelled Ready on the node by its own uid. A minute passes.
fn pair_world() -> (World, Uid, Uid) {
    let mut w = World::new(1, AgentKind::Core, 1);
    w.create(ModelKey::cluster("u"), ModelSpec::simple(PAIR, Some("/mnt/models/pair")), true);
    w.create(ModelKey::cluster("x"), ModelSpec::simple(PAIR_B, Some("/mnt/models/pair")), true);
    let uid = |name: &str| w.api.objects[&ModelKey::cluster(name)].uid.clone();
    let (u, x) = (uid("u"), uid("x"));
    w.nodes[0].dirs.insert("pair".into(), [u.clone(), x.clone()].into());
    w.nodes[0].files.insert("pair".into(), Arc::from(PAIR));
    label(&mut w, "u", ModelStatus::Ready, &u);
    w.run_for(60_000);
    (w, u, x)
}

fn label(w: &mut World, name: &str, status: ModelStatus, writer: &Uid) {
    let key = wire::label_key(&ModelKey::cluster(name));
    set_shared(&mut w.api.labels[0], &mut w.api.strings, &key, status.as_str());
    set_shared(&mut w.label_writer[0], &mut w.api.strings, &key, writer.as_str());
}

/// `uid` downloads `storage_uri` into `/mnt/models/pair`.
fn download_pair(w: &mut World, uid: &Uid, storage_uri: &str, co_owners: &[&Uid], keep_marked: bool) -> Input {
    download_naming(w, uid, storage_uri, (co_owners, keep_marked), &[])
}

/// The same, with the live models of another source the core names (`other_source`).
fn download_naming(
    w: &mut World,
    uid: &Uid,
    storage_uri: &str,
    (co_owners, keep_marked): (&[&Uid], bool),
    other_source: &[&Uid],
) -> Input {
    let op = Op::Download {
        key: ModelKey::cluster("x"),
        uid: uid.clone(),
        storage_uri: storage_uri.into(),
        dest: model_agent_core::dest_path::DestPath::under_root("/mnt/models/pair", ROOT),
        parse_metadata: false,
        co_owners: co_owners.iter().map(|u| (*u).clone()).collect(),
        keep_marked,
        other_source: other_source.iter().map(|u| (*u).clone()).collect(),
        reserve: false,
    };
    w.execute(0, &Effect { id: EffectId(7), op }).expect("a download answers")
}

/// The reserve records of the marker at `pair`, as the next snapshot shows them.
fn reserve_records(w: &mut World) -> Vec<(String, bool)> {
    let Some(Input::DriftObserved { snapshot, .. }) = w.execute(0, &Effect { id: EffectId(9), op: Op::Snapshot })
    else {
        panic!("a snapshot answers");
    };
    snapshot.owned_dirs.iter().filter(|d| d.path == "pair").map(|d| (d.uid.as_str().to_string(), d.reserved)).collect()
}

/// The simulated marker records a download's reserve label as the shell's does (this uid's as
/// the op says, the others' kept), and a sweep that trashes a directory whose marker records a
/// reserved uid is a violation, whenever that model was deleted.
#[test]
fn the_marker_records_the_reserve_label_and_the_sweep_may_not_trash_a_recorded_directory() {
    let (mut w, u, x) = pair_world();
    let download = |w: &mut World, uid: &Uid, other: &Uid, reserve: bool| {
        let op = Op::Download {
            key: ModelKey::cluster("u"),
            uid: uid.clone(),
            storage_uri: PAIR.into(),
            dest: model_agent_core::dest_path::DestPath::under_root("/mnt/models/pair", ROOT),
            parse_metadata: false,
            co_owners: vec![other.clone()],
            keep_marked: false,
            other_source: Vec::new(),
            reserve,
        };
        assert!(!failed(&w.execute(0, &Effect { id: EffectId(7), op }).expect("a download answers")));
    };
    let (us, xs) = (u.as_str().to_string(), x.as_str().to_string());
    download(&mut w, &u, &x, true);
    assert_eq!(reserve_records(&mut w), [(us.clone(), true), (xs.clone(), false)]);
    download(&mut w, &x, &u, true);
    assert_eq!(reserve_records(&mut w), [(us.clone(), true), (xs.clone(), true)]);
    download(&mut w, &u, &x, false);
    assert_eq!(reserve_records(&mut w), [(us.clone(), false), (xs.clone(), true)]);
    // A record alone changes that uid's flag in a marker that names it, and nothing else.
    let record = |w: &mut World, uid: &Uid, reserved: bool| {
        let op = Op::RecordReserve { key: ModelKey::cluster("u"), uid: uid.clone(), path: "pair".into(), reserved };
        assert!(!failed(&w.execute(0, &Effect { id: EffectId(8), op }).expect("a record answers")));
    };
    record(&mut w, &u, true);
    record(&mut w, &x, false);
    record(&mut w, &Uid::new("uid-of-no-model"), true);
    assert_eq!(reserve_records(&mut w), [(us.clone(), true), (xs.clone(), false)]);
    record(&mut w, &u, false);
    record(&mut w, &x, true);
    assert_eq!(reserve_records(&mut w), [(us, false), (xs, true)]);
    let as_reserved = |w: &World| w.violations.iter().filter(|v| v.contains("as reserved")).count();
    assert_eq!(as_reserved(&w), 0);
    trash(&mut w, x.as_str(), "pair");
    assert_eq!(as_reserved(&w), 1, "{:?}", w.violations);
}

fn failed(input: &Input) -> bool {
    matches!(input, Input::EffectDone { outcome: model_agent_core::machine::Outcome::Failed(_), .. })
}

#[test]
fn a_download_over_a_live_ready_model_s_files_of_another_source_is_damage() {
    let (mut w, _, x) = pair_world();
    let answer = download_pair(&mut w, &x, PAIR_B, &[], false);
    assert!(!failed(&answer), "after the snapshot the shell accepts it: the marker names x");
    assert_eq!(w.nodes[0].files["pair"].as_ref(), PAIR_B, "the files are x's source now");
    assert_eq!(w.counters.other_source_replaced, 1, "{:?}", w.violations);
    let text = "a download of hf://org/pair-b by uid uid-x-2 replaced the files of live Ready ClusterBaseModel/u";
    assert!(w.violations[0].contains(text), "{:?}", w.violations);
}

#[test]
fn a_download_over_another_source_harms_no_model_that_is_not_live_ready_and_there() {
    type Change = fn(&mut World, &Uid);
    let changes: [(&str, Change); 6] = [
        ("its label Failed", |w, u| label(w, "u", ModelStatus::Failed, u)),
        ("its label written by another uid", |w, _| label(w, "u", ModelStatus::Ready, &Uid::new("older"))),
        ("deleted", |w, _| w.delete(&ModelKey::cluster("u"))),
        ("moved to another path", |w, _| {
            w.update(&ModelKey::cluster("u"), ModelSpec::simple(PAIR, Some("/mnt/models/elsewhere")));
            w.run_for(60_000);
        }),
        ("switched to the download's source itself", |w, _| {
            w.update(&ModelKey::cluster("u"), ModelSpec::simple(PAIR_B, Some("/mnt/models/pair")));
            w.run_for(60_000);
        }),
        ("changed a moment ago (the download may have been decided before)", |w, _| {
            w.update(&ModelKey::cluster("u"), ModelSpec::simple(PAIR, Some("/mnt/models/pair")));
        }),
    ];
    for (what, change) in changes {
        let (mut w, u, x) = pair_world();
        change(&mut w, &u);
        download_pair(&mut w, &x, PAIR_B, &[], false);
        assert!(w.violations.is_empty(), "u {what}: {:?}", w.violations);
    }
    // Nor is a download of the files' own source, nor one into a directory whose files no
    // download completed.
    let (mut w, u, _) = pair_world();
    download_pair(&mut w, &u, PAIR, &[], false);
    let (mut w2, _, x) = pair_world();
    w2.nodes[0].files.clear();
    download_pair(&mut w2, &x, PAIR_B, &[], false);
    assert!(w.violations.is_empty() && w2.violations.is_empty(), "{:?} {:?}", w.violations, w2.violations);
}

#[test]
fn before_the_first_snapshot_a_marker_naming_an_unknown_uid_over_another_source_is_refused() {
    // As the shell's `held_from_other_source`: the core has not given u, and the files are of
    // another repository: nothing is written.
    let (mut w, u, x) = pair_world();
    let answer = download_pair(&mut w, &x, PAIR_B, &[], true);
    assert!(failed(&answer), "{answer:?}");
    assert_eq!(w.counters.other_source_refusals, 1);
    assert_eq!(w.nodes[0].files["pair"].as_ref(), PAIR, "left alone");
    assert_eq!(w.nodes[0].dirs["pair"], [u.clone(), x.clone()].into());
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    // Another revision of the same repository is another source too (the manifest keeps it).
    let (mut w, _, x) = pair_world();
    assert!(failed(&download_pair(&mut w, &x, "hf://org/pair@v2", &[], true)));
    // After the snapshot, a live model of another source the core names: refused too.
    let (mut w, u, x) = pair_world();
    assert!(failed(&download_naming(&mut w, &x, PAIR_B, (&[], false), &[&u])));
    assert_eq!(w.nodes[0].files["pair"].as_ref(), PAIR, "left alone");
    // Not refused: a uid the core gave, files of the download's own source, and after the first
    // snapshot a uid the core does not name.
    let (mut w, u, x) = pair_world();
    assert!(!failed(&download_pair(&mut w, &x, PAIR_B, &[&u], true)));
    let (mut w, u, x) = pair_world();
    assert!(!failed(&download_naming(&mut w, &x, PAIR, (&[], true), &[&u])));
    let (mut w, _, x) = pair_world();
    assert!(!failed(&download_pair(&mut w, &x, PAIR_B, &[], false)));
    assert_eq!(w.counters.other_source_refusals, 0);
}

#[test]
fn trashing_files_of_another_source_than_a_member_s_does_not_harm_that_member() {
    // u leaves; x (of another source) is named by the marker but its weights are not there.
    let (mut w, u, _) = pair_world();
    w.delete(&ModelKey::cluster("u"));
    trash(&mut w, u.as_str(), "pair");
    assert_eq!((w.counters.dir_removals, w.counters.dir_removals_live), (1, 0), "{:?}", w.violations);
    assert!(!w.nodes[0].files.contains_key("pair"), "the files went with it");
    // The same with the files of x's source: x's weights.
    let (mut w, u, x) = pair_world();
    w.nodes[0].files.insert("pair".into(), Arc::from(PAIR_B));
    w.delete(&ModelKey::cluster("u"));
    trash(&mut w, u.as_str(), "pair");
    assert_eq!(w.counters.dir_removals_live, 1);
    assert!(w.violations[0].contains(&format!("weights of live uid {x} at pair")), "{:?}", w.violations);
}

/// Swarm seed 700004880: x switched to the files' source 3 ms before u's leave trashed them.
/// The agent may have decided on x's old spec, so a trash within the spec-view window is not
/// held against it; the same trash once that window has passed is.
#[test]
fn trashing_files_a_member_switched_to_just_now_is_not_held_against_the_agent() {
    let switch_x_to_pair = |w: &mut World| {
        let x = ModelKey::cluster("x");
        let spec = ModelSpec::simple(PAIR, Some("/mnt/models/pair"));
        w.update(
            &x,
            ModelSpec { storage_uri: spec.storage_uri, uri: spec.uri, ..(**w.api.objects[&x].spec()).clone() },
        );
    };
    let (mut w, u, _) = pair_world();
    switch_x_to_pair(&mut w);
    w.delete(&ModelKey::cluster("u"));
    trash(&mut w, u.as_str(), "pair");
    assert_eq!((w.counters.dir_removals, w.counters.dir_removals_live), (1, 0), "{:?}", w.violations);

    let (mut w, u, x) = pair_world();
    switch_x_to_pair(&mut w);
    w.delete(&ModelKey::cluster("u"));
    w.run_for(w.spec_view_window_ms() + 1);
    trash(&mut w, u.as_str(), "pair");
    assert_eq!(w.counters.dir_removals_live, 1);
    assert!(w.violations[0].contains(&format!("weights of live uid {x} at pair")), "{:?}", w.violations);
}

/// Two models share `/mnt/models/pair` (same source), settle Ready; then one switches its
/// storage URI, with and without a restart of the agent while it changes, over several seeds:
/// no files of the other (still Ready) are replaced, and the fleet converges (the switched one
/// Failed while the other holds the directory). Some seeds take the restart window: the
/// switched model's download comes before the core knows the other, and the simulated shell
/// refuses it as the real one does.
#[test]
fn a_co_owner_switching_source_never_replaces_the_other_s_files_with_or_without_a_restart() {
    let mut refusals = 0;
    for seed in 1..=12 {
        for restart in [None, Some((0, 5_000))] {
            let mut w = World::new(1, AgentKind::Core, seed);
            for name in [0, 4] {
                w.create(crate::vocab::key(name), crate::vocab::spec(name, 5, false), true);
            }
            w.start(0);
            w.run_for(60_000);
            crate::vocab::apply(&mut w, &crate::vocab::Action::Source { pick: seed as usize, restart });
            w.run_for(10 * 60_000);
            w.check_converged();
            assert!(w.violations.is_empty(), "seed {seed} {restart:?}: {:#?}", w.violations);
            assert_eq!(w.counters.source_switches, 1);
            refusals += w.counters.other_source_refusals;
        }
    }
    assert!(refusals > 0, "no seed took the restart window");
}
