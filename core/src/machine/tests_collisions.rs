//! Colliding label keys (core.md, "Label keys can collide"): one owner per shared key, chosen by
//! a static rank; the loser writes nothing; a shared key is removed only when no other model that
//! may have it remains.

use super::tests::*;
use super::*;

fn created(mut o: ModelObject, at: &str) -> ModelObject {
    o.created = Arc::from(at);
    o
}

/// ClusterBaseModel `basemodel.x` and BaseModel `x` in namespace `clusterbasemodel`.
fn pair() -> (ModelObject, ModelObject) {
    let cbm = obj(&ModelKey::cluster("basemodel.x"), "u-cbm", "local:///mnt/models/cbm", None);
    let bm = obj(&ModelKey::namespaced("clusterbasemodel", "x"), "u-bm", "local:///mnt/models/bm", None);
    assert_eq!(wire::label_key(&cbm.key), wire::label_key(&bm.key), "the keys collide");
    assert_eq!(wire::configmap_key(&cbm.key), wire::configmap_key(&bm.key));
    (created(cbm, "2026-06-01T00:00:00Z"), created(bm, "2026-01-01T00:00:00Z"))
}

/// Who wrote what, in order: (uid, label set) of the Publishes, repeats of one writer folded.
fn publishers(effects: &[Effect]) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = effects
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { uid, label, .. } => Some((uid.as_str().to_string(), label.is_some())),
            _ => None,
        })
        .collect();
    out.dedup();
    out
}

fn removes_label(effects: &[Effect]) -> bool {
    effects.iter().any(|e| matches!(e.op, Op::Unpublish { remove_label: true, .. } | Op::RemoveOrphanLabel { .. }))
}

fn collision_notes(h: &H) -> Vec<(ModelKey, ModelKey)> {
    h.notes
        .iter()
        .filter_map(|n| match n {
            Note::KeyCollision { key, owner, .. } => Some((key.clone(), owner.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_cluster_base_model_owns_a_shared_key_and_the_colliding_base_model_writes_nothing() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone(), bm.clone()]);
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
    assert_eq!(collision_notes(&h), vec![(bm.key.clone(), cbm.key.clone())], "noted once, naming the owner");
    let reason = collision_reason(&bm.key, &cbm.key);
    assert!(reason.contains("ClusterBaseModel/basemodel.x") && reason.contains("clusterbasemodel.basemodel.x"));
}

#[test]
fn a_later_cluster_base_model_takes_over_a_key_a_base_model_held() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![bm.clone()]);
    assert_eq!(publishers(&h.settle(e)), vec![("u-bm".to_string(), true)]);
    let e = h.apply(cbm.clone());
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
    assert!(destructive(&all).is_empty(), "the loser removes nothing: {all:?}");
    assert_eq!(h.view(&bm.key, "u-bm").published, Published::Unknown);
}

#[test]
fn deleting_the_loser_never_removes_the_owner_s_live_label() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone(), bm.clone()]);
    h.settle(e);
    let e = h.apply(deleting(bm.clone()));
    let all = h.settle(e);
    assert!(!removes_label(&all), "{all:?}");
    assert!(publishers(&all).is_empty(), "{all:?}");
    assert!(h.s.incarnation(&bm.key, &bm.uid).is_none(), "the loser's record is gone");
}

#[test]
fn when_the_owner_goes_the_next_in_rank_publishes_and_the_label_stays() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone(), bm.clone()]);
    h.settle(e);
    let e = h.apply(deleting(cbm.clone()));
    let all = h.settle(e);
    assert!(!removes_label(&all), "the shared label is fenced by the live BaseModel: {all:?}");
    assert_eq!(publishers(&all), vec![("u-bm".to_string(), true)], "{all:?}");
    let unpublish = all.iter().position(|e| matches!(e.op, Op::Unpublish { .. })).expect("owner unpublishes");
    let publish = all.iter().position(|e| matches!(e.op, Op::Publish { .. })).expect("next owner publishes");
    assert!(unpublish < publish, "the old owner's entry goes before the new owner's is written: {all:?}");
}

#[test]
fn a_namespace_named_after_a_victim_s_hash_never_takes_its_label() {
    // A long namespace is cut to the 8 hex digits of its hash; a tenant names a namespace so.
    let victim_key = ModelKey::namespaced("production-inference", "llama-3-70b-instruct-awq-quantized-v2");
    let label = wire::label_key(&victim_key);
    let (ns, name) = label.strip_prefix("models.ome.io/").unwrap().split_once(".basemodel.").unwrap();
    let attacker_key = ModelKey::namespaced(ns, name);
    assert_eq!(wire::label_key(&attacker_key), label, "the attacker's key collides");
    let victim = created(obj(&victim_key, "u-victim", "local:///mnt/models/v", None), "2026-01-01T00:00:00Z");
    let attacker = created(obj(&attacker_key, "u-attacker", "local:///mnt/models/a", None), "2026-02-01T00:00:00Z");
    let mut h = H::new();
    let e = h.start(false, vec![victim.clone()]);
    h.settle(e);
    let e = h.apply(attacker.clone());
    let all = h.settle(e);
    assert!(publishers(&all).is_empty(), "the younger model writes nothing: {all:?}");
    let e = h.apply(deleting(attacker));
    let all = h.settle(e);
    assert!(!removes_label(&all) && publishers(&all).is_empty(), "{all:?}");
    assert_eq!(
        h.view(&victim_key, "u-victim").published,
        Published::Status { status: ModelStatus::Ready, reason: None }
    );
}

#[test]
fn equal_rank_is_broken_by_the_smaller_uid_and_every_order_of_arrival_agrees() {
    // Two BaseModels with no creationTimestamp: the uid decides.
    let victim_key = ModelKey::namespaced("production-inference", "llama-3-70b-instruct-awq-quantized-v2");
    let label = wire::label_key(&victim_key);
    let (ns, name) = label.strip_prefix("models.ome.io/").unwrap().split_once(".basemodel.").unwrap();
    let one = obj(&victim_key, "u-b", "local:///mnt/models/1", None);
    let two = obj(&ModelKey::namespaced(ns, name), "u-a", "local:///mnt/models/2", None);
    for order in [vec![one.clone(), two.clone()], vec![two.clone(), one.clone()]] {
        let mut h = H::new();
        let e = h.start(false, vec![]);
        let mut all = h.settle(e);
        for o in order {
            let e = h.apply(o);
            all.extend(h.settle(e));
        }
        let last = publishers(&all).last().cloned();
        assert_eq!(last, Some(("u-a".to_string(), true)), "the smaller uid owns the key: {all:?}");
    }
}

#[test]
fn a_malformed_loser_never_publishes_failed_over_the_owner() {
    let (cbm, mut bm) = pair();
    bm.spec = Err("spec is malformed: missing storage".into());
    let mut h = H::new();
    let e = h.start(false, vec![cbm, bm]);
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
}

#[test]
fn the_claims_index_follows_slots_in_and_out() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone(), bm.clone()]);
    h.settle(e);
    assert_eq!(h.s.claims.colliders(&h.s.slots, &cbm.key), vec![bm.key.clone()]);
    let e = h.apply(deleting(bm.clone()));
    h.settle(e);
    assert!(h.s.claims.colliders(&h.s.slots, &cbm.key).is_empty());
}

#[test]
fn two_colliding_models_leaving_together_remove_the_shared_label() {
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone(), bm.clone()]);
    h.settle(e);
    let e = h.apply(deleting(bm.clone()));
    let mut all = h.settle(e);
    let e = h.apply(deleting(cbm.clone()));
    all.extend(h.settle(e));
    assert!(removes_label(&all), "neither waits for the other: {all:?}");
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn a_new_owner_of_a_shared_key_writes_only_once_the_last_owner_s_removal_landed() {
    // The simulator's swarm, seed 2766: the ClusterBaseModel owner is deleted alone on the key
    // (its removal takes the label), and the colliding BaseModel is created before that removal
    // lands. Were the BaseModel to publish at once, the removal would take its label.
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![cbm.clone()]);
    h.settle(e);
    let e = h.apply(deleting(cbm.clone()));
    let Some(removal) = e.iter().find(|e| matches!(e.op, Op::Unpublish { remove_label: true, .. })) else {
        panic!("the owner's removal takes the label: {e:?}")
    };
    let e = h.apply(bm.clone());
    let early = h.settle(e);
    assert!(publishers(&early).is_empty(), "written before the removal landed: {early:?}");
    let e = h.input(Input::EffectDone { id: removal.id, outcome: Outcome::Done });
    let all = h.settle(e);
    assert_eq!(publishers(&all).first(), Some(&("u-bm".to_string(), true)), "{all:?}");
}

/// The BaseModel `bm` alone on its keys, settled but for its first effect that `left` picks,
/// which stays in flight: the harness and that effect.
fn loser_alone_with_in_flight(bm: &ModelObject, left: impl Fn(&Op) -> bool + Copy) -> (H, Effect) {
    let mut h = H::new();
    let e = h.start(false, vec![]);
    h.settle(e);
    let e = h.apply(bm.clone());
    let e = h.settle_except(e, left);
    let in_flight = e.iter().find(|e| left(&e.op)).expect("the effect left in flight").clone();
    (h, in_flight)
}

#[test]
fn an_owner_waits_for_the_loser_s_publish_in_flight_before_writing_the_shared_keys() {
    // The simulator's swarm, seed 5004255: the BaseModel published first, alone on the key; the
    // ClusterBaseModel, which ranks first, arrived while that publish was in flight. Written at
    // once, the owner's entry would be overwritten by the loser's when it landed.
    let (cbm, bm) = pair();
    let loser = |op: &Op| matches!(op, Op::Publish { uid, .. } if uid.as_str() == "u-bm");
    let (mut h, loser_publish) = loser_alone_with_in_flight(&bm, loser);
    let e = h.apply(cbm.clone());
    let early = h.settle(e);
    assert!(publishers(&early).is_empty(), "written while the loser's publish was in flight: {early:?}");
    let e = h.input(Input::EffectDone { id: loser_publish.id, outcome: Outcome::Done });
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
    assert_eq!(collision_notes(&h), vec![(bm.key.clone(), cbm.key.clone())], "noted once, naming the owner");
}

/// A start on a Node whose labels are wiped, with `pair()`'s ClusterBaseModel placed only by a
/// label: everything settled but the first snapshot, left unanswered. The harness, that
/// snapshot's id, the effects and the ClusterBaseModel.
fn restarted_on_a_wiped_node() -> (H, EffectId, Vec<Effect>, ModelObject) {
    let (cbm, bm) = pair();
    let cbm = gpu_only(cbm);
    let mut h = H::new();
    let e = h.start_on(node(&[]), false, vec![cbm.clone(), bm]);
    let sid = snapshot_request(&e);
    let e = h.settle_except(e, |op| *op == Op::Snapshot);
    (h, sid, e, cbm)
}

#[test]
fn after_a_start_a_model_the_node_s_view_does_not_place_keeps_its_keys_until_a_snapshot_shows_them() {
    // The simulator's swarm, seed 2280: the agent restarted while the Node's labels were wiped.
    // The ClusterBaseModel, which ranks first, is not placed by the wiped view, but its label and
    // entry are still on the node: the BaseModel must not write over them before the first
    // snapshot says what is there, nor after it while they are there.
    let (mut h, sid, e, cbm) = restarted_on_a_wiped_node();
    assert!(publishers(&e).is_empty(), "written before the first snapshot: {e:?}");
    let (label_key, cm_key) = (wire::label_key(&cbm.key), wire::configmap_key(&cbm.key));
    let entry = EntryView { status: Some(ModelStatus::Ready), uid: Some(cbm.uid.clone()) };
    let snapshot = DriftSnapshot {
        labels: [(Arc::from(label_key.as_str()), Arc::from("Ready"))].into(),
        entries: [(Arc::from(cm_key.as_str()), entry)].into(),
        ..DriftSnapshot::default()
    };
    let e = h.input(Input::DriftObserved { id: sid, snapshot });
    let e = h.settle_except(e, |op| matches!(op, Op::LiveGet { .. } | Op::LiveGetNode));
    assert!(publishers(&e).is_empty(), "written over the owner's entry: {e:?}");
}

#[test]
fn after_a_start_a_model_outranked_only_until_the_first_snapshot_publishes_once_it_shows_nothing() {
    let (mut h, sid, _, _) = restarted_on_a_wiped_node();
    let e = h.input(Input::DriftObserved { id: sid, snapshot: DriftSnapshot::default() });
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-bm".to_string(), true)], "{all:?}");
}

#[test]
fn a_colliding_model_created_after_the_first_snapshot_and_not_placed_here_holds_nothing() {
    // A model not known to have nothing here is a claimant only until this process's first
    // snapshot: one created later, that the Node does not place, has nothing here it could lose.
    let (cbm, bm) = pair();
    let cbm = gpu_only(cbm);
    let mut h = H::new();
    let e = h.start(false, vec![bm.clone()]);
    h.settle(e);
    let e = h.apply(cbm.clone());
    let all = h.settle(e);
    assert!(collision_notes(&h).is_empty(), "{:?}", h.notes);
    assert!(publishers(&all).is_empty() && destructive(&all).is_empty(), "{all:?}");
    assert_eq!(h.view(&bm.key, "u-bm").published, Published::Status { status: ModelStatus::Ready, reason: None });
}

#[test]
fn an_owner_does_not_wait_for_a_loser_s_effect_that_writes_no_key() {
    // Only a publish or a removal in flight can land over the owner's keys: a check waiting for
    // a fetch permit (behind long downloads, in the shell) must not hold the owner back.
    let (cbm, bm) = pair();
    let loser_check = |op: &Op| matches!(op, Op::VerifyLocal { uid, .. } if uid.as_str() == "u-bm");
    let (mut h, _) = loser_alone_with_in_flight(&bm, loser_check);
    let e = h.apply(cbm.clone());
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
}

/// After a start with `bm` alone: `bm` becomes a candidate whose read fails, a snapshot shows
/// the node bare (its record: nothing here), then `cbm` publishes and is deleted, its removal of
/// the shared label fenced by `bm`. Returns `bm`'s read, retried and not answered yet.
fn fenced_by_a_candidate_with_nothing_here(h: &mut H, cbm: &ModelObject, bm: &ModelObject) -> EffectId {
    let e = h.watch(Kind::BaseModel, WatchEvent::Deleted(bm.clone().into()));
    h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Failed("503".into()) });
    // While its read is retried, a snapshot shows the node bare: it has nothing here.
    let e = h.advance(300_000);
    let bm_read = one_get(&e);
    h.settle(e);
    assert_eq!(h.view(&bm.key, "u-bm").published, Published::Nothing);
    let e = h.apply(cbm.clone());
    assert_eq!(publishers(&h.settle(e)), vec![("u-cbm".to_string(), true)]);
    let e = h.apply(deleting(cbm.clone()));
    let all = h.settle(e);
    assert!(!removes_label(&all), "fenced by the BaseModel, still a candidate: {all:?}");
    assert!(h.s.incarnation(&cbm.key, &cbm.uid).is_none(), "the owner's record is gone");
    bm_read
}

/// Up to two drift passes whose snapshot shows `cbm`'s label, the sweep's LISTs showing `bm`
/// alive, and (with `node`) the placement exit's two witnesses: `bm` alive, `node` as the
/// Node. What they emitted, up to the pass that removed the label.
fn drift_passes_showing_the_label(
    h: &mut H,
    cbm: &ModelObject,
    bm: &ModelObject,
    node: Option<&NodeView>,
) -> Vec<Effect> {
    let label = (Arc::from(wire::label_key(&cbm.key).as_str()), Arc::from("Ready"));
    let mut out = Vec::new();
    for _ in 0..2 {
        let e = h.advance(300_000);
        let snapshot = DriftSnapshot { labels: [label.clone()].into(), ..DriftSnapshot::default() };
        let mut e = h.input(Input::DriftObserved { id: snapshot_request(&e), snapshot });
        for (id, kind) in lists(&e) {
            let listed = if kind == Kind::BaseModel { vec![bm.clone().into()] } else { vec![] };
            e.extend(h.input(Input::LiveList { id, result: ListResult::Listed(listed) }));
        }
        for _ in 0..usize::from(node.is_some()) * 2 {
            if let Some(id) = gets(&e).first().map(|g| g.0) {
                e.extend(h.input(Input::LiveRead { id, result: ReadResult::Found(bm.clone().into()) }));
            }
            if let Some(w) = e.iter().find(|e| e.op == Op::LiveGetNode).map(|e| e.id) {
                let found = NodeReadResult::Found(node.expect("asked only with a node").clone());
                e.extend(h.input(Input::NodeRead { id: w, result: found }));
            }
        }
        out.extend(h.settle(e));
        if removes_label(&out) {
            break;
        }
    }
    assert!(
        out.iter().any(|e| matches!(&e.op, Op::Unpublish { uid, remove_label: true, .. } if uid.as_str() == "u-bm")),
        "the shared label stuck: {out:?}"
    );
    assert!(publishers(&out).is_empty(), "{out:?}");
    assert_eq!(h.view(&bm.key, "u-bm").life, Life::Withdrawn);
    out
}

#[test]
fn a_shared_label_fenced_by_a_model_that_then_leaves_is_removed_as_an_orphan() {
    // The simulator's swarm, seed 10005080: the owner's removal of the shared label was fenced
    // by the colliding BaseModel, a candidate that had published nothing. Confirmed deleting,
    // the BaseModel left without touching the label, and every orphan sweep kept the label:
    // the fresh LIST still showed the BaseModel, its finalizer held.
    let (cbm, bm) = pair();
    let mut h = H::new();
    let e = h.start(false, vec![bm.clone()]);
    h.settle(e);
    let bm_read = fenced_by_a_candidate_with_nothing_here(&mut h, &cbm, &bm);
    let e = h.input(Input::LiveRead { id: bm_read, result: ReadResult::Found(deleting(bm.clone()).into()) });
    let all = h.settle(e);
    assert!(!removes_label(&all) && h.s.model_count() == 0, "{all:?}");
    let e = h.advance(300_000);
    let label = (Arc::from(wire::label_key(&cbm.key).as_str()), Arc::from("Ready"));
    let snapshot = DriftSnapshot { labels: [label].into(), ..DriftSnapshot::default() };
    let e = h.input(Input::DriftObserved { id: snapshot_request(&e), snapshot });
    let mut out = Vec::new();
    for (id, kind) in lists(&e) {
        let listed = if kind == Kind::BaseModel { vec![deleting(bm.clone()).into()] } else { vec![] };
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(listed) }));
    }
    assert!(removes_label(&out), "a model being deleted claims no label: {out:?}");
}

#[test]
fn a_shared_label_fenced_by_a_model_later_withdrawn_from_the_node_is_removed() {
    // The owner's removal of the shared label is fenced by the colliding BaseModel, placed here
    // and alive. The BaseModel then stops being placed here before it published anything (its
    // check in flight), and is withdrawn on two witnesses. Alive, it is neither confirmed gone
    // nor deleting, so its record claims the label in every orphan sweep: the label must go by
    // its withdrawal, or by a drift pass crediting it with the label.
    let (cbm, bm) = pair();
    let (cbm, bm) = (gpu_only(cbm), gpu_only(bm));
    let placed = node(&[("gpu", "h100"), ("zone", "a"), ("os", "linux")]);
    let mut h = H::new();
    let e = h.start_on(placed, false, vec![cbm.clone(), bm.clone()]);
    let all = h.settle(e);
    assert_eq!(publishers(&all), vec![("u-cbm".to_string(), true)], "{all:?}");
    assert_eq!(h.view(&bm.key, "u-bm").published, Published::Nothing, "held, and the snapshot showed nothing");
    // The owner is deleted; the BaseModel, placed here, fences the label and checks its weights.
    let bm_check = |op: &Op| matches!(op, Op::VerifyLocal { uid, .. } if uid.as_str() == "u-bm");
    let e = h.apply(deleting(cbm.clone()));
    let all = h.settle_except(e, bm_check);
    assert!(!removes_label(&all), "fenced by the live, placed BaseModel: {all:?}");
    assert!(all.iter().any(|e| matches!(e.op, Op::Unpublish { remove_label: false, .. })), "{all:?}");
    assert!(publishers(&all).is_empty(), "{all:?}");
    assert!(h.s.incarnation(&cbm.key, &cbm.uid).is_none(), "the owner's record is gone");
    // No longer held, it cannot know what the shared keys hold (`note_collision`).
    assert_eq!(h.view(&bm.key, "u-bm").published, Published::Unknown);
    let check = all.iter().find(|e| bm_check(&e.op)).expect("the BaseModel checks its weights").id;
    // The Node stops placing the BaseModel (most labels stay: no wipe trips the breaker); both
    // witnesses agree: withdrawn, alive. Its withdrawal takes the label, fenced by no one now.
    let bare = node(&[("zone", "a"), ("os", "linux")]);
    let e = h.input(Input::NodeObserved(bare.clone()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(bm.clone().into()) });
    let e = h.input(Input::NodeRead { id: one_node_get(&e), result: NodeReadResult::Found(bare) });
    let mut all = h.settle(e);
    let e = h.input(Input::EffectDone { id: check, outcome: Outcome::Done });
    all.extend(h.settle(e));
    let v = h.view(&bm.key, "u-bm");
    assert_eq!(v.life, Life::Withdrawn);
    assert_eq!(v.published, Published::Nothing);
    assert!(publishers(&all).is_empty(), "{all:?}");
    assert!(
        all.iter().any(|e| matches!(&e.op, Op::Unpublish { uid, remove_label: true, .. } if uid.as_str() == "u-bm")),
        "the withdrawal removes the shared label: {all:?}"
    );
    // The label is back (a late write of the owner's, say), and the withdrawn BaseModel's record
    // says it has nothing here: a drift pass credits it with the label, and it goes again. The
    // sweep's LISTs, if any, show the BaseModel alive and not deleting.
    drift_passes_showing_the_label(&mut h, &cbm, &bm, None);
}

#[test]
fn a_shared_label_fenced_by_a_model_that_then_has_nothing_here_and_is_unplaced_is_removed() {
    // As above, but the BaseModel is never held in its own record: a pending read (a phantom
    // delete, its GET failing) holds it quietly while a snapshot shows the node bare, so its
    // record says it has nothing here. It fences the owner's removal, is unplaced, and is found
    // alive: with nothing here it has no placement exit, and stays Observed, not placed. A drift
    // pass credits it with the label (`Drifted`), so it exits on two witnesses and withdraws it.
    let (cbm, bm) = pair();
    let (cbm, bm) = (gpu_only(cbm), gpu_only(bm));
    let mut h = H::new();
    let e = h.start_on(node(&[("gpu", "h100"), ("zone", "a"), ("os", "linux")]), false, vec![bm.clone()]);
    h.settle(e);
    let bm_read = fenced_by_a_candidate_with_nothing_here(&mut h, &cbm, &bm);
    let bare = node(&[("zone", "a"), ("os", "linux")]);
    let e = h.input(Input::NodeObserved(bare.clone()));
    let mut all = h.settle(e);
    let e = h.input(Input::LiveRead { id: bm_read, result: ReadResult::Found(bm.clone().into()) });
    all.extend(h.settle(e));
    let v = h.view(&bm.key, "u-bm");
    assert_eq!((v.life, v.published), (Life::Observed, Published::Nothing), "{all:?}");
    assert!(!removes_label(&all) && publishers(&all).is_empty(), "{all:?}");
    drift_passes_showing_the_label(&mut h, &cbm, &bm, Some(&bare));
}
