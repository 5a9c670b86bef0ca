//! What the simulator found in the core: each test is the deterministic reproduction of a bug
//! the swarm found, kept once the core was fixed so that it stays fixed.

use model_agent_core::{ModelKey, ModelSpec};
use model_agent_sim::scenario::{Options, SwarmKnobs, new_world};

/// Swarm seed 83, reduced. Six models placed by `gpu=true` on one node; the node's labels are
/// wiped, so all six become placement-exit candidates and the breaker holds them (6 of 6 > 25 %).
/// During the hold one of them is really deleted (no finalizer): the watch DELETED finds the
/// key already pending and adds no read. The labels come back; the Node watch's view cancels
/// the exits (`ExitCancelled`), and with them the delete candidate: the deleted model's label
/// and entry stay on the node for good (no read, relist or drift pass removes them).
/// Fixed by the `Recause` row of `on_candidate`.
#[test]
fn a_delete_during_a_held_placement_exit_is_not_lost() {
    let opts = Options { nodes: 1, models: 6, seed: 1, ..Options::default() };
    let mut w = new_world(&opts);
    w.api.node_labels[0].insert("gpu".into(), "true".into());
    let keys: Vec<ModelKey> = (0..6).map(|i| ModelKey::cluster(&format!("g-{i}"))).collect();
    for (i, key) in keys.iter().enumerate() {
        let mut spec = ModelSpec::simple(&format!("local:///mnt/share/g-{i}"), None);
        spec.node_selector = vec![("gpu".into(), "true".into())];
        w.create(key.clone(), spec, false);
    }
    w.start(0);
    w.run_for(60_000);
    w.wipe_node_labels(0, 120_000);
    w.run_for(30_000);
    w.delete(&keys[0]);
    w.run_for(20 * 60_000);
    w.check_converged();
    assert!(w.violations.is_empty(), "{:#?}\n{}", w.violations, w.history_dump.join("\n"));
}

/// Swarm seeds found on 2026-12-06 by running seeds 0-2,999 and 5,000,000-5,004,300 (every one
/// is a wiped Node or a restart meeting two colliding names, `x` and `basemodel.x`), and one that
/// failed only with a fix as first written. Each failed before the fix named beside it, and each
/// runs in well under a second:
/// - a held model (its keys owned by a ClusterBaseModel that ranks first) whose uid the
///   marker names was no member of its directory, so the other member leaving trashed its
///   weights under its Ready entry (`shared::member_draft`; 5002019, 5002460, 5003578,
///   5003689, 5004044);
/// - the owner published while the loser's publish, sent before the owner arrived, was still
///   in flight: the loser's landed over it (`claims::contest`, `settling`; 5004255);
/// - after a restart on a wiped Node, the ClusterBaseModel was no claimant until the first
///   snapshot, and the BaseModel wrote over its entry (`claims::claimant`; 2280);
/// - and, with the first fix, a directory a held model had owned once was kept for it after another
///   uid's download took the path (`drift::observe_incarnation` takes a directory from a uid
///   when the snapshot shows its marker without the uid; 380).
///
/// And one of another kind, found in seeds 10,000,000-10,007,999: a placement exit during a wipe
/// paired a model read with a Node read sent 22 s later (two Node reads had timed out), and the
/// model had been placed here again in between; its label and entry were removed (a Node
/// witness now pairs only with a model read sent at most one read timeout before it; 10004629).
/// And a liveness failure in the same range: a stale relist brought back a deleted
/// ClusterBaseModel, whose label removal was fenced by the colliding BaseModel, a candidate that
/// had published nothing; that one, being deleted, left without touching the label, and the
/// orphan sweep kept the label because the fresh LIST still showed it, its finalizer held (a
/// model being deleted no longer claims a label in the sweep; 10005080).
#[test]
fn swarm_seeds_found_on_wiped_or_restarted_nodes_pass() {
    for seed in [380, 2280, 5_002_019, 5_002_460, 5_003_578, 5_003_689, 5_004_044, 5_004_255, 10_004_629, 10_005_080] {
        // As they ran when found: without `Action::Source`, which came later.
        let mut knobs = knobs_as_found(seed);
        knobs.weights.source = 0;
        assert_clean_run(seed, knobs);
    }
}

/// Found on 2026-12-07 by the swarm's source switches (`Action::Source`), fixed the same day (README,
/// "Properties checked"): after a restart, a switched co-owner's download sent just after the
/// first snapshot replaced a Ready member's files before that member's own check made it hold
/// them (200000284: now `Op::Download::other_source` and the shell's refusal); a member leaving
/// the directory with its old source's files trashed the directory into which members of
/// another source had since downloaded theirs under a marker naming it (56, 200000144: now a
/// live member whose files are there shares the directory, whatever its source). And one the
/// kept directory record of 120008971's fix brought (200000739): the only member switched
/// source, and its download wrote the withdrawn co-owners of the old source into the marker as
/// co-owners; one of them, placed again, stayed Ready over the new source's files (the record
/// is now dropped as before when its member fetches another source there).
#[test]
fn swarm_seeds_found_by_source_switches_pass() {
    let seeds = [56, 200_000_144, 200_000_284, 200_000_454, 200_001_003, 200_000_490, 200_002_487, 200_000_739];
    for seed in seeds {
        assert_clean_run(seed, knobs_as_found(seed));
    }
}

/// Swarm seeds found on 2026-12-07 by the check that a model is labelled Ready only where its
/// path holds files of its own source (`World::check_ready_on_its_files`; without the fix, 4 of
/// the seeds 200,000,000-200,000,999 failed on it). A model that left a node (its placement
/// exit witnessed) released its directory to a live co-owner of its source and kept its
/// download as done; the co-owner was then deleted and trashed the directory, and in two of
/// them a model of another source downloaded its files there. Placed on the node again, the
/// first model was published Ready at once, on files that were gone (200,000,055,
/// 200,000,269) or another source's (200,000,217, 200,000,739). A release now forgets the fetch
/// into the directory it gives up (`settle::share_step`): placed again, the model fetches
/// again, which costs a listing and a size check while the co-owner's files are still there.
#[test]
fn swarm_seeds_found_by_the_ready_on_its_own_files_check_pass() {
    for seed in [200_000_055, 200_000_217, 200_000_269, 200_000_739] {
        assert_clean_run(seed, knobs_as_found(seed));
    }
}

/// Swarm seed 600,000,047 (found 2026-12-07 by the Ready check, running 600,000,000-600,009,999):
/// a member's leave trashed a directory while another model's incarnation that had fetched into
/// it was no member then; that one kept its fetch as done and was published Ready 11 s later on
/// files that were gone. A trash now forgets every fetch into the directory it removed
/// (`outcomes::forget_fetches_into`).
#[test]
fn swarm_seed_600000047_is_not_ready_on_a_trashed_directory() {
    assert_clean_run(600_000_047, knobs_as_found(600_000_047));
}

/// Swarm seed 7,006,201 (found 2026-12-07 running 7,000,000-7,007,999): a model withdrawn from
/// a node on two agreeing witnesses left its shared copy to the orphan sweep; the node was
/// labelled for it again, but the Node watch lagged 30 s, and the sweep trashed the copy on the
/// core's old Node view although its LISTs showed the model alive. The sweep now waits for a live
/// read of the Node sent since it began before it trashes a copy such a model may use.
#[test]
fn swarm_seed_7006201_keeps_a_copy_on_an_old_node_view() {
    assert_clean_run(7_006_201, knobs_as_found(7_006_201));
}

/// Swarm seed 120,008,971 (found running 120,000,000-120,011,999): a ClusterBaseModel and a
/// BaseModel shared one path on a node, and the marker named both. The node did not match the
/// ClusterBaseModel's nodeSelector: its exit was witnessed and it was withdrawn, leaving the
/// directory to the BaseModel. 56 s later the node was labelled (the ground truth placed the
/// ClusterBaseModel there again) and the BaseModel deleted at the same instant; the Node watch
/// delivered the label 17 s later, and the BaseModel's confirmed delete trashed the directory
/// 8 s after the label, on the exit witnessed a minute before. A leaving member whose marker
/// names another uid now trashes only after a live Node read sent once it began to wait
/// (`tables::awaits_trash_witness`); here that read places the other model again, and the
/// directory is released to it.
#[test]
fn a_co_owner_s_delete_waits_for_a_fresh_node_witness_before_trashing() {
    // As it ran when found: without `Action::Source` (with it the seed runs otherwise).
    let mut knobs = knobs_as_found(120_008_971);
    knobs.weights.source = 0;
    assert_clean_run(120_008_971, knobs);
}

/// Found on 2026-12-07 by the swarm's reserve labels (`Action::Reserve`, a PRNG of its own) and
/// the check that the orphan sweep never trashes the directory of a model deleted while reserved
/// (`World::check_sweep_spares_reserved`). Without the core's `Op::DisownDir`, 46 of the seeds
/// 0-999 fail on that check. With it, three more: 1486 (the model was being deleted when the
/// agent started, its delete confirmed before any snapshot showed its directory) and 200002605
/// (deleted while the first snapshot was out, stale for it) now wait for a snapshot before they
/// are forgotten (`tables::reserved_disown_pending`); 1238 (a reserved model away from the node
/// keeps its directory, and with no fetch known there it counted as of no source, so a model of
/// its own source was refused the directory for good) now counts as of its spec's source there
/// (`shared::reserved_source`).
#[test]
fn swarm_seeds_found_by_reserve_labels_pass() {
    for seed in [1238, 1486, 200_002_605] {
        assert_clean_run(seed, knobs_as_found(seed));
    }
}

/// Found on 2026-12-07 once the marker records the reserve label (`OwnedDir::reserved`) and
/// `World::check_sweep_spares_reserved` holds the sweep to that record: a reserved model deleted
/// while no agent process ran was never seen as reserved, and the next process's sweep trashed
/// its weights as an orphan's. With a sweep that ignores the record, seeds 656 and 842 of 0-1999
/// fail on that check; the sweep now gives such a directory up (`Op::DisownDir` with no key).
#[test]
fn swarm_seeds_of_reserved_models_deleted_while_no_agent_ran_pass() {
    for seed in [656, 842] {
        assert_clean_run(seed, knobs_as_found(seed));
    }
}

/// Once the convergence check holds every marker to the reserve label of the model Ready there
/// (`World::node_reserve_records`), a core that never records a label changed after the
/// download fails 248 of the seeds 0-999 (these three among them); `Op::RecordReserve` records it.
#[test]
fn swarm_seeds_that_change_reserve_labels_find_them_recorded_in_the_markers() {
    for seed in [0, 1, 7] {
        assert_clean_run(seed, knobs_as_found(seed));
    }
}

/// A seed's knobs as it ran when found, before `Action::RemoveCopies` existed (drawn last and
/// from a PRNG of its own, so zero weight runs it as before).
fn knobs_as_found(seed: u64) -> SwarmKnobs {
    let mut knobs = model_agent_sim::scenario::swarm_knobs(seed, None, None);
    knobs.weights.remove_copies = 0;
    knobs
}

/// Seed `seed`'s swarm run with `knobs` is clean.
fn assert_clean_run(seed: u64, knobs: SwarmKnobs) {
    let (r, _, knobs) = model_agent_sim::scenario::swarm_run_knobs(seed, knobs);
    assert!(r.clean(), "seed {seed} ({knobs:?}): {:#?}", r.invariant_violations);
}

/// Found on 2026-12-07 once the swarm removes shared copies by hand (`Action::RemoveCopies`) and
/// the end of a run holds every model Ready through a link to a copy that is there: a core that
/// takes no missing marker at a copy's path for a gone copy fails 315 of the seeds 0-1999
/// (these three among them), its models Ready on nothing for good. A drift snapshot that read
/// everything and shows no marker there now sends them to fetch it again.
#[test]
fn swarm_seeds_that_remove_copies_by_hand_find_them_fetched_again() {
    for seed in [3, 14, 20] {
        let knobs = model_agent_sim::scenario::swarm_knobs(seed, None, None);
        assert!(knobs.weights.remove_copies > 0, "seed {seed} removes copies");
        assert_clean_run(seed, knobs);
    }
}

/// Found on 2026-12-07 by a review's wider run of the swarm (seeds 4,000-19,999; it fails at the
/// session's start too): reserved ClusterBaseModel `v-0002` and BaseModel `v-0004` shared an
/// `oci://` directory; `v-0004` left the node, then `v-0002` was deleted and gave the directory
/// up keeping `v-0004`, alive but away, in the marker; `v-0004`'s delete later made the
/// directory an orphan's, and the sweep trashed the weights `v-0002`'s label kept. A disown now
/// keeps only uids that may stay on the node, and reserved ones (`State::fill_disowns`).
#[test]
fn swarm_seed_12709_keeps_a_reserved_model_s_weights_after_its_co_owner_left() {
    assert_clean_run(12_709, model_agent_sim::scenario::swarm_knobs(12_709, None, None));
}

/// Found with 12709 (fails at the session's start too): at the shared `pair` path, BaseModel
/// `v-0009` had fetched `hf://org/pair-b`, switched to `hf://org/pair` (Failed: another source
/// held the path), and ClusterBaseModel `v-0002` then fetched `hf://org/pair` there; `v-0009`
/// switched back to `pair-b` and, its old fetch still on record, was labelled Ready over
/// `pair`'s files. A download that lands now takes from the directory's other members what
/// they fetched there from another source (`State::forget_other_sources_in`).
#[test]
fn swarm_seed_14278_is_not_ready_over_files_a_co_owner_fetched_since() {
    assert_clean_run(14_278, model_agent_sim::scenario::swarm_knobs(14_278, None, None));
}

/// Found in seeds 22,000–23,999: reserved `v-0033` shared an `oci://` directory with `v-0025`,
/// Ready here, and `v-0030`, of the same source but never placed on the node. `v-0033`'s delete
/// gave the directory up keeping both in the marker; `v-0025`'s delete then left it to
/// `v-0030`, and the sweep trashed it as an orphan's. The core kept to its design (a reserved
/// model's disown leaves the files to the live models that use them, and a non-reserved
/// model's delete may remove them); the simulator's check did not: it held the sweep to the
/// reserved model's claim after the files had passed to a live model using them, where that
/// model's own trash at its delete was never held to it. The
/// claim now passes at the disown when the marker keeps such a model
/// (`World::used_by_a_kept_uid`); one kept only while away still holds it (seed 12709).
#[test]
fn swarm_seed_23100_lets_a_co_owner_that_used_reserved_weights_remove_them() {
    assert_clean_run(23_100, model_agent_sim::scenario::swarm_knobs(23_100, None, None));
}

/// Found in seeds 36,000–37,999: reserved `v-0014` shared the `pair` path with `v-0017`, whose
/// old uid a stale relist had shown again and whose delete was a candidate, its live read out,
/// when `v-0014`'s delete was confirmed. The disown kept that uid in the marker; it was then
/// confirmed gone, and the sweep trashed the weights `v-0014`'s label kept. A disown now keeps
/// no candidate (`State::fill_disowns`).
#[test]
fn swarm_seed_37744_keeps_reserved_weights_from_a_candidate_co_owner() {
    assert_clean_run(37_744, model_agent_sim::scenario::swarm_knobs(37_744, None, None));
}

/// Found in seeds 44,000–59,999 (failing at the round's start too), with seeds 46077 and 58561:
/// reserved
/// `v-0004` left node 2 keeping the `pair` directory with its files from `hf://org/pair`, and
/// switched to `hf://org/pair-b` while away; ClusterBaseModel `basemodel.v-0009`, at the same
/// path, switched to `pair-b` too and stayed Failed for good, the directory held by `v-0004`'s
/// files of another source. A reserved model away now counts as of the source its spec names
/// there, as it would on the node (`shared::member_draft`).
#[test]
fn swarm_seeds_44142_46077_58561_let_a_model_fetch_the_source_a_reserved_holder_names_now() {
    for seed in [44_142, 46_077, 58_561] {
        assert_clean_run(seed, model_agent_sim::scenario::swarm_knobs(seed, None, None));
    }
}

/// Found in seeds 82,000–83,999 (failing at the round's start too): BaseModel
/// `clusterbasemodel/v-0009`, its keys held by ClusterBaseModel `basemodel.v-0009`, left node 1
/// (releasing the `oci://` directory its marker named it in) and was placed there again; held,
/// it never joined the directory back, and a co-owner's delete trashed its weights. A held model
/// placed here stays a member of its own destination when the marker is known to name it there
/// (`shared::member_draft`).
#[test]
fn swarm_seed_82997_keeps_the_weights_of_a_held_model_placed_again() {
    assert_clean_run(82_997, model_agent_sim::scenario::swarm_knobs(82_997, None, None));
}

/// Found in seeds 100,000–119,999 (failing at the round's start too): node 4 restarted and its
/// first BaseModel list was empty (unsynced); `pair`'s marker named BaseModel `team/v-0014`, Ready
/// there on `hf://org/pair-b`, which no record knew. `v-0003`'s download of `hf://org/pair` took
/// that uid as a co-owner, and nothing held it back: `v-0014`'s files were replaced. A uid a
/// marker names that no record knows is of another source for a download until the orphan
/// check's LISTs show it gone (`DirUse::unknown`), and a directory whose marker no snapshot
/// showed since it came into use is downloaded into as before the first snapshot
/// (`DirView::marker_unseen`).
#[test]
fn swarm_seed_102822_replaces_no_files_of_a_model_no_record_knows() {
    assert_clean_run(102_822, model_agent_sim::scenario::swarm_knobs(102_822, None, None));
}

/// Found in seeds 106,000–107,999 on a run the unknown-uid rule shifted: a placement exit's GET
/// was in flight when ClusterBaseModel `v-0015`'s watch DELETED came; the exit became a delete
/// candidate, but the GET, sent before the delete and answering Found, suppressed it as a
/// phantom, and the deleted model's label and entry stayed on node 1 for good. A candidate
/// recaused by a new event takes no answer sent before it (`watch::candidate`).
#[test]
fn swarm_seed_107671_takes_no_read_sent_before_a_delete_that_recaused_an_exit() {
    assert_clean_run(107_671, model_agent_sim::scenario::swarm_knobs(107_671, None, None));
}
