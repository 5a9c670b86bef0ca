//! Bounded state (core.md): oversize specs are kept as identity plus a reason; a step emits at
//! most `effects_per_step_max` effects and the rest follow, in order.

use super::tests::*;
use super::*;

fn oversize_json(name: &str, bytes: usize) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "uid": "u-big"},
        "spec": {"storage": {"storageUri": "local:///mnt/models/big", "parameters": {"blob": "x".repeat(bytes)}}},
    })
}

#[test]
fn an_oversize_spec_is_kept_as_identity_and_reported_failed_with_its_size() {
    let big = ModelObject::from_json_bounded(Kind::ClusterBaseModel, &oversize_json("big", 100_000), 65_536).unwrap();
    let reason = big.spec.as_ref().unwrap_err();
    assert!(reason.contains("over the limit of 65536 bytes"), "{reason}");
    let mut h = H::new();
    let e = h.start(true, vec![big]);
    let all = h.settle(e);
    let failed = published(&all);
    assert_eq!(failed.len(), 1, "{all:?}");
    assert_eq!(failed[0].0, ModelStatus::Failed);
    assert!(failed[0].1.as_deref().unwrap().contains("over the limit"), "{failed:?}");
    // Just under the limit the same object is parsed.
    let fits = ModelObject::from_json_bounded(Kind::ClusterBaseModel, &oversize_json("big", 100_000), 200_000).unwrap();
    assert!(fits.spec.is_ok());
}

#[test]
fn a_step_emits_at_most_its_limit_and_the_backlog_follows_in_order() {
    let models: Vec<ModelObject> = (0..10).map(|i| local(&format!("m{i}"), &format!("u{i}"))).collect();
    let unbounded = {
        let mut h = H::new();
        let e = h.start(false, models.clone());
        ops(&h.settle(e))
    };
    let mut h = H::with(Config { effects_per_step_max: 3, ..config() });
    let mut e = h.start(false, models);
    let mut released = Vec::new();
    for _ in 0..100 {
        released.extend(ops(&e));
        let more = h.settle(e.clone());
        released.extend(ops(&more[e.len()..]));
        if h.s.backlog_len() == 0 {
            break;
        }
        assert_eq!(h.s.next_deadline(), Some(Instant(h.now)), "a backlog makes the core due at once");
        e = h.input(Input::Tick);
        assert!(e.len() <= 3, "{e:?}");
    }
    assert_eq!(h.s.backlog_len(), 0);
    assert_eq!(sorted_ops(released), sorted_ops(unbounded));
}

fn ops(effects: &[Effect]) -> Vec<String> {
    effects.iter().map(|e| format!("{:?}", e.op)).collect()
}

fn sorted_ops(mut ops: Vec<String>) -> Vec<String> {
    ops.sort();
    ops
}

#[test]
fn invariants_catch_a_broken_record() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    h.settle(e);
    assert_eq!(h.s.invariants(), Ok(()));
    let key = ModelKey::cluster("m");
    let mut broken = h.s.clone();
    let slot = Arc::make_mut(broken.slots.get_mut(&key).unwrap());
    slot.current.as_mut().unwrap().timer_at = Some(Instant(123)).into();
    assert!(broken.invariants().unwrap_err().contains("not registered"));
    let mut broken = h.s.clone();
    Arc::make_mut(broken.slots.get_mut(&key).unwrap()).current.as_mut().unwrap().inflight = Some(EffectId(999)).into();
    assert!(broken.invariants().unwrap_err().contains("in flight is owned by None"));
    let mut broken = h.s.clone();
    broken.kinds[Kind::ClusterBaseModel.index()].pending.insert(key.clone());
    assert!(broken.invariants().unwrap_err().contains("pending index"));
}

#[test]
#[should_panic(expected = "time went backwards")]
fn time_never_goes_backwards() {
    let mut h = H::new();
    h.now = 1_000;
    h.input(Input::Tick);
    h.now = 999;
    h.input(Input::Tick);
}

/// A list of effects given back carries the next step's output (its room, not its effects); a
/// list grown past the limit is not kept, and a clone of the state keeps no room.
#[test]
fn a_recycled_list_of_effects_carries_the_next_output_within_a_limit() {
    let mut s = State::new(config());
    let first = s.handle(Instant(0), Input::Tick);
    assert!(first.effects.iter().any(|e| matches!(e.op, Op::ProbeRoot)), "{first:?}");
    let room = first.effects.as_ptr();
    s.recycle(first.effects);
    assert_eq!(s.clone().spare_effects.capacity(), 0);
    let second = s.handle(Instant(1), Input::Tick);
    assert!(second.effects.is_empty(), "{second:?}");
    assert_eq!(second.effects.as_ptr(), room, "the given-back list is the output");
    s.recycle(Vec::with_capacity(1_000));
    assert_eq!(s.spare_effects.capacity(), 0, "a large list is dropped");
    s.recycle(second.effects);
    assert!(s.spare_effects.capacity() > 0);
}
