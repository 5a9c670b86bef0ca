//! One test per transition of `core.md`'s tables, and the behaviour around them.

use super::*;
use crate::model::{ModelSpec, requirement};
use crate::placement::NodeSelectorTerm;

pub(super) const ROOT: &str = "/mnt/models";

/// The configuration these tests were written for: every due read goes out at once (no
/// coalescing window), a LIST only from 16 keys. `tests_reads.rs` covers the default's window.
pub(super) fn config() -> Config {
    Config {
        coalesce_keys_min: 16,
        coalesce_window_ms: 0,
        coalesce_models_per_key_max: 0,
        ..Config::new("node-1", ROOT)
    }
}

pub(super) fn obj(key: &ModelKey, uid: &str, uri: &str, path: Option<&str>) -> ModelObject {
    ModelObject {
        key: key.clone(),
        uid: Uid::new(uid),
        resource_version: Arc::from("1"),
        created: Arc::from(""),
        deleting: false,
        spec: Ok(Arc::new(ModelSpec::simple(uri, path))),
    }
}

pub(super) fn deleting(mut o: ModelObject) -> ModelObject {
    o.deleting = true;
    o
}

pub(super) fn local(name: &str, uid: &str) -> ModelObject {
    obj(&ModelKey::cluster(name), uid, &format!("local:///mnt/models/{name}"), None)
}

/// Ready at once, with no I/O: the plainest model that publishes.
pub(super) fn vendor(name: &str, uid: &str) -> ModelObject {
    obj(&ModelKey::cluster(name), uid, "vendor://nvidia/nim/llama", None)
}

pub(super) fn hf(name: &str, uid: &str) -> ModelObject {
    obj(&ModelKey::cluster(name), uid, "hf://org/repo", Some(&format!("/mnt/models/{name}")))
}

pub(super) fn node(labels: &[(&str, &str)]) -> NodeView {
    NodeView { name: "node-1".into(), labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// Drives a core by hand; `auto` answers effects that are not under test.
pub(super) struct H {
    pub(super) s: State,
    pub(super) now: u64,
    /// How `settle` answers root probes.
    writable: bool,
    /// Every note so far.
    pub(super) notes: Vec<Note>,
}

impl H {
    pub(super) fn new() -> H {
        H::with(config())
    }

    pub(super) fn with(config: Config) -> H {
        H { s: State::new(config), now: 0, writable: true, notes: Vec::new() }
    }

    pub(super) fn input(&mut self, input: Input) -> Vec<Effect> {
        let out = self.s.handle(Instant(self.now), input);
        self.notes.extend(out.notes);
        out.effects
    }

    pub(super) fn advance(&mut self, ms: u64) -> Vec<Effect> {
        self.now += ms;
        self.input(Input::Tick)
    }

    pub(super) fn watch(&mut self, kind: Kind, event: WatchEvent) -> Vec<Effect> {
        self.input(Input::Watch { kind, event })
    }

    pub(super) fn apply(&mut self, o: ModelObject) -> Vec<Effect> {
        let kind = o.key.kind;
        self.watch(kind, WatchEvent::Applied(o.into()))
    }

    /// Node observed, root probed (writable or not), both kinds listed with `objs`.
    pub(super) fn start(&mut self, writable: bool, objs: Vec<ModelObject>) -> Vec<Effect> {
        self.start_on(node(&[]), writable, objs)
    }

    pub(super) fn start_on(&mut self, node: NodeView, writable: bool, objs: Vec<ModelObject>) -> Vec<Effect> {
        self.writable = writable;
        let mut out = self.input(Input::NodeObserved(node));
        out.extend(self.answer_probes(&out.clone(), writable));
        for kind in Kind::ALL {
            out.extend(self.watch(kind, WatchEvent::RelistStarted));
            for o in objs.iter().filter(|o| o.key.kind == kind) {
                out.extend(self.watch(kind, WatchEvent::RelistItem(o.clone().into())));
            }
            out.extend(self.watch(kind, WatchEvent::RelistDone));
        }
        out
    }

    pub(super) fn answer_probes(&mut self, effects: &[Effect], writable: bool) -> Vec<Effect> {
        let mut out = Vec::new();
        for e in effects {
            if e.op == Op::ProbeRoot {
                out.extend(self.input(Input::RootProbed { id: e.id, probe: RootProbe::healthy(writable) }));
            }
        }
        out
    }

    /// Complete every publish/fetch/cleanup effect successfully, and every snapshot with an
    /// empty node, until nothing more comes (reads are left to the test).
    pub(super) fn settle(&mut self, effects: Vec<Effect>) -> Vec<Effect> {
        self.settle_except(effects, |_| false)
    }

    /// As `settle`, but an effect whose op `left` picks is never answered: it stays in flight.
    /// Returns every effect, those left included.
    pub(super) fn settle_except(&mut self, mut effects: Vec<Effect>, left: impl Fn(&Op) -> bool) -> Vec<Effect> {
        let mut all = Vec::new();
        for _ in 0..100 {
            let mut next = Vec::new();
            for e in effects.iter().filter(|e| !left(&e.op)) {
                let input = match &e.op {
                    Op::Publish { .. }
                    | Op::Unpublish { .. }
                    | Op::VerifyLocal { .. }
                    | Op::Download { .. }
                    | Op::TrashDir { .. }
                    | Op::DisownDir { .. }
                    | Op::RecordReserve { .. }
                    | Op::PurgeTrash { .. }
                    | Op::RemoveOrphanLabel { .. }
                    | Op::RemoveOrphanEntry { .. } => Input::EffectDone { id: e.id, outcome: Outcome::Done },
                    Op::ProbeRoot => Input::RootProbed { id: e.id, probe: RootProbe::healthy(self.writable) },
                    Op::Snapshot => Input::DriftObserved { id: e.id, snapshot: DriftSnapshot::default() },
                    _ => continue,
                };
                next.extend(self.input(input));
            }
            all.extend(effects);
            if next.is_empty() {
                return all;
            }
            effects = next;
        }
        panic!("effects did not settle");
    }

    pub(super) fn view(&self, key: &ModelKey, uid: &str) -> IncarnationView {
        self.s.incarnation(key, &Uid::new(uid)).unwrap_or_else(|| panic!("no incarnation {key} {uid}"))
    }
}

pub(super) fn gets(effects: &[Effect]) -> Vec<(EffectId, ModelKey)> {
    effects
        .iter()
        .filter_map(|e| if let Op::LiveGet { key } = &e.op { Some((e.id, key.clone())) } else { None })
        .collect()
}

pub(super) fn lists(effects: &[Effect]) -> Vec<(EffectId, Kind)> {
    effects
        .iter()
        .filter_map(|e| if let Op::LiveList { kind, .. } = &e.op { Some((e.id, *kind)) } else { None })
        .collect()
}

pub(super) fn destructive(effects: &[Effect]) -> Vec<&Op> {
    effects.iter().map(|e| &e.op).filter(|op| op.is_destructive()).collect()
}

pub(super) fn published(effects: &[Effect]) -> Vec<(ModelStatus, Option<String>)> {
    effects
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { entry, .. } => Some((entry.status, entry.reason.clone())),
            _ => None,
        })
        .collect()
}

pub(super) fn one_node_get(effects: &[Effect]) -> EffectId {
    let ids: Vec<EffectId> = effects.iter().filter(|e| e.op == Op::LiveGetNode).map(|e| e.id).collect();
    assert_eq!(ids.len(), 1, "one live read of the Node: {effects:?}");
    ids[0]
}

pub(super) fn one_get(effects: &[Effect]) -> EffectId {
    let g = gets(effects);
    assert_eq!(g.len(), 1, "expected one LiveGet in {effects:#?}");
    g[0].0
}

/// A node with one Ready local:// model `m`.
pub(super) fn ready_local() -> (H, ModelKey) {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    h.settle(e);
    let key = ModelKey::cluster("m");
    assert_eq!(h.view(&key, "u1").published, Published::Status { status: ModelStatus::Ready, reason: None });
    (h, key)
}

/// Milliseconds until the pending read of `key`'s incarnation `uid` is retried.
pub(super) fn read_retry_in(h: &H, key: &ModelKey, uid: &str) -> u64 {
    match h.view(key, uid).life {
        Life::PendingConfirm { read: ReadState::Waiting { at }, .. } => at.as_ms() - h.now,
        other => panic!("not backing off: {other:?}"),
    }
}

pub(super) fn pending_cause(v: &IncarnationView) -> Option<(Cause, u32)> {
    match v.life {
        Life::PendingConfirm { cause, attempt, .. } => Some((cause, attempt)),
        _ => None,
    }
}

// ---- Table 1: events on an Observed model --------------------------------------------------

#[test]
fn observed_watch_deleted_becomes_pending_with_a_live_read() {
    let (mut h, key) = ready_local();
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::WatchDeleted, 0)));
    assert_eq!(gets(&e), vec![(gets(&e)[0].0, key.clone())]);
    assert!(destructive(&e).is_empty());
    // The read has a 10 s deadline.
    assert_eq!(h.s.next_deadline(), Some(Instant(h.now + 10_000)));
}

#[test]
fn observed_relist_vanished_becomes_pending_never_cleaned_up_directly() {
    let (mut h, key) = ready_local();
    let mut e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone));
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::RelistVanished, 0)));
    assert_eq!(gets(&e).len(), 1);
    assert!(destructive(&e).is_empty());
}

#[test]
fn observed_applied_with_deletion_timestamp_is_confirmed_deleting_and_cleaned() {
    let (mut h, key) = ready_local();
    let e = h.apply(deleting(local("m", "u1")));
    assert!(gets(&e).is_empty(), "positive evidence needs no read");
    assert!(matches!(
        destructive(&e)[..],
        [Op::Unpublish { uid, remove_label: true, .. }] if uid.as_str() == "u1"
    ));
    assert_eq!(h.view(&key, "u1").life, Life::Confirmed { confirmation: Confirmation::Deleting });
    h.settle(e);
    assert!(h.s.incarnation(&key, &Uid::new("u1")).is_none(), "cleaned up and dropped");
    assert_eq!(h.s.stats().cleanups_done, 1);
}

// ---- Table 2: live read results for a PendingConfirm model ---------------------------------

pub(super) fn pending_local() -> (H, ModelKey, EffectId) {
    let (mut h, key) = ready_local();
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    let id = one_get(&e);
    (h, key, id)
}

#[test]
fn pending_not_found_is_confirmed_and_cleaned_up() {
    let (mut h, key, id) = pending_local();
    let e = h.input(Input::LiveRead { id, result: ReadResult::NotFound });
    assert_eq!(h.view(&key, "u1").life, Life::Confirmed { confirmation: Confirmation::NotFound });
    let d = destructive(&e);
    assert!(matches!(d[..], [Op::Unpublish { remove_label: true, .. }]), "{d:?}");
    let all = h.settle(e);
    assert!(!all.iter().any(|e| matches!(e.op, Op::TrashDir { .. })), "local:// weights are never touched");
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn pending_found_other_uid_cleans_the_old_uid_only() {
    let (mut h, key, id) = pending_local();
    let e = h.input(Input::LiveRead { id, result: ReadResult::Found(local("m", "u2").into()) });
    assert_eq!(h.view(&key, "u1").life, Life::Confirmed { confirmation: Confirmation::Replaced });
    assert_eq!(h.view(&key, "u2").life, Life::Observed);
    assert!(h.view(&key, "u2").current);
    for op in destructive(&e) {
        match op {
            // The label is u2's now: u1's cleanup must not remove it; the entry only if it is u1's.
            Op::Unpublish { uid, remove_label, .. } => {
                assert_eq!(uid.as_str(), "u1");
                assert!(!remove_label);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    h.settle(e);
    assert!(h.s.incarnation(&key, &Uid::new("u1")).is_none());
    assert_eq!(h.view(&key, "u2").published, Published::Status { status: ModelStatus::Ready, reason: None });
}

#[test]
fn pending_found_same_uid_deleting_is_confirmed() {
    let (mut h, key, id) = pending_local();
    let e = h.input(Input::LiveRead { id, result: ReadResult::Found(deleting(local("m", "u1")).into()) });
    assert_eq!(h.view(&key, "u1").life, Life::Confirmed { confirmation: Confirmation::Deleting });
    assert_eq!(destructive(&e).len(), 1);
}

#[test]
fn pending_found_same_uid_alive_is_a_suppressed_phantom() {
    let (mut h, key, id) = pending_local();
    let e = h.input(Input::LiveRead { id, result: ReadResult::Found(local("m", "u1").into()) });
    assert_eq!(h.view(&key, "u1").life, Life::Observed);
    assert!(destructive(&e).is_empty());
    assert!(matches!(&h.notes[..], [.., Note::PhantomSuppressed { cause: Cause::WatchDeleted, .. }]));
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 1);
    // Still Ready: nothing to republish.
    assert!(published(&e).is_empty());
    assert_eq!(h.s.pending_confirmations().0, 0);
}

#[test]
fn pending_failed_read_retries_with_backoff_and_never_cleans_up() {
    let (mut h, key, id) = pending_local();
    let e = h.input(Input::LiveRead { id, result: ReadResult::Failed("503".into()) });
    assert!(destructive(&e).is_empty());
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::WatchDeleted, 1)));
    let at = read_retry_in(&h, &key, "u1");
    assert!((750..=1000).contains(&at), "first retry after ~1 s, got {at}");
    assert!(gets(&h.advance(at - 1)).is_empty());
    let e = h.advance(1);
    assert_eq!(gets(&e).len(), 1, "read again after the backoff");
}

#[test]
fn pending_reads_time_out_after_10s_and_late_answers_are_ignored() {
    let (mut h, key, id) = pending_local();
    let e = h.advance(10_000);
    assert!(destructive(&e).is_empty());
    assert_eq!(h.s.stats().reads_timed_out, 1);
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::WatchDeleted, 1)));
    // The timed-out read answers late with NotFound: it must not confirm anything.
    let e = h.input(Input::LiveRead { id, result: ReadResult::NotFound });
    assert!(e.is_empty());
    assert!(h.view(&key, "u1").life != Life::Confirmed { confirmation: Confirmation::NotFound });
}

#[test]
fn pending_has_no_attempt_limit_and_backoff_caps_at_5_minutes() {
    let (mut h, key, mut id) = pending_local();
    let mut last_delay = 0;
    for attempt in 1..=40u32 {
        h.input(Input::LiveRead { id, result: ReadResult::Failed("connection refused".into()) });
        assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::WatchDeleted, attempt)));
        let delay = read_retry_in(&h, &key, "u1");
        assert!(delay <= 300_000, "attempt {attempt}: {delay}");
        last_delay = delay;
        let probes = h.advance(delay - 1);
        assert!(gets(&probes).is_empty(), "not before the backoff");
        let e = h.advance(1);
        id = one_get(&e);
    }
    assert!(last_delay >= 225_000, "backoff reached the cap: {last_delay}");
    let (count, oldest) = h.s.pending_confirmations();
    assert_eq!(count, 1);
    assert!(h.now - oldest.unwrap().as_ms() > 3_600_000, "visible with its age");
    // And when the API answers at last, the cleanup happens.
    let e = h.input(Input::LiveRead { id, result: ReadResult::NotFound });
    assert_eq!(destructive(&e).len(), 1);
}

#[test]
fn a_second_candidate_event_adds_no_read() {
    let (mut h, _key, _id) = pending_local();
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    assert!(gets(&e).is_empty());
    let mut e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone));
    assert!(gets(&e).is_empty() && lists(&e).is_empty());
}

#[test]
fn pending_survives_relists_until_a_read_answers() {
    let (mut h, key, id) = pending_local();
    // A relist that lists it again does not resolve it: only a live read does.
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(pending_cause(&h.view(&key, "u1")).is_some());
    h.input(Input::LiveRead { id, result: ReadResult::Found(local("m", "u1").into()) });
    assert_eq!(h.view(&key, "u1").life, Life::Observed);
}

// ---- Coalescing, relists, fencing, shutdown -------------------------------------------------

#[test]
fn a_relist_storm_is_answered_by_one_list_per_kind() {
    let mut h = H::new();
    let mut objs: Vec<ModelObject> = (0..100).map(|i| local(&format!("c{i}"), &format!("cu{i}"))).collect();
    objs.extend(
        (0..50).map(|i| obj(&ModelKey::namespaced("ns", &format!("b{i}")), &format!("bu{i}"), "vendor://v/t/p", None)),
    );
    let e = h.start(false, objs.clone());
    h.settle(e);
    // Both kinds relist and come back empty (the CRD-apply storm with an empty cache).
    let mut e = Vec::new();
    for kind in Kind::ALL {
        e.extend(h.watch(kind, WatchEvent::RelistStarted));
        e.extend(h.watch(kind, WatchEvent::RelistDone));
    }
    assert!(gets(&e).is_empty());
    let l = lists(&e);
    assert_eq!(l.len(), 2, "one LIST per kind: {l:?}");
    assert!(destructive(&e).is_empty());
    // The lists show every object alive except c7 (really deleted).
    let mut out = Vec::new();
    for (id, kind) in l {
        let listed =
            objs.iter().filter(|o| o.key.kind == kind && &*o.key.name != "c7").cloned().map(Arc::new).collect();
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(listed) }));
    }
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 149);
    assert_eq!(h.s.stats().live_gets, 0);
    assert_eq!(h.s.stats().live_lists, 2);
    // 150 of 150 models became candidates at once: the breaker holds c7's cleanup until fresh
    // reads after the hold confirm it.
    assert!(destructive(&out).is_empty());
    assert!(h.notes.iter().any(|n| matches!(n, Note::BreakerTripped { candidates: 150, placed: 150, .. })));
    assert!(h.notes.iter().any(|n| matches!(n, Note::BreakerHeld { key, .. } if &*key.name == "c7")));
    let e = h.advance(300_000);
    let id = one_get(&e);
    let out = h.input(Input::LiveRead { id, result: ReadResult::NotFound });
    let d = destructive(&out);
    assert!(matches!(d[..], [Op::Unpublish { key, .. }] if &*key.name == "c7"), "{d:?}");
}

#[test]
fn a_failed_list_retries_as_one_list() {
    let mut h = H::new();
    let objs: Vec<ModelObject> = (0..20).map(|i| local(&format!("c{i}"), &format!("u{i}"))).collect();
    let e = h.start(false, objs.clone());
    h.settle(e);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    let (id, _) = lists(&e)[0];
    let e = h.input(Input::LiveList { id, result: ListResult::Failed("etcd leader changed".into()) });
    assert!(destructive(&e).is_empty());
    let delay = h.s.next_deadline().unwrap().as_ms() - h.now;
    let e = h.advance(delay);
    assert_eq!(lists(&e).len(), 1);
    assert!(gets(&e).is_empty(), "the retry stays coalesced");
}

#[test]
fn a_record_dropped_during_a_relist_leaves_its_seen_keys_so_an_unlisted_model_still_vanishes() {
    // A key seen and then dropped (its delete confirmed, cleaned up) must not stand in for one
    // the relist never listed (a shortcut that compares counts would miss `n`).
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1"), local("n", "u2")]);
    h.settle(e);
    let (m, n) = (ModelKey::cluster("m"), ModelKey::cluster("n"));
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound });
    h.settle(e);
    assert!(!h.s.knows(&m), "m's record is dropped once its cleanup landed");
    assert_eq!(h.s.model_count(), 1);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert_eq!(pending_cause(&h.view(&n, "u2")), Some((Cause::RelistVanished, 0)));
    assert_eq!(gets(&e).len(), 1);
}

/// The mark of a relist is on the record: a name listed, dropped, then made again by a watch
/// event before the relist ends is questioned (one read), and the read keeps it.
#[test]
fn a_record_made_again_during_a_relist_is_questioned_once_and_kept() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    h.settle(e);
    let m = ModelKey::cluster("m");
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound });
    h.settle(e);
    assert!(!h.s.knows(&m));
    let e = h.apply(local("m", "u3"));
    h.settle(e);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert_eq!(pending_cause(&h.view(&m, "u3")), Some((Cause::RelistVanished, 0)));
    assert!(destructive(&e).is_empty());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(local("m", "u3").into()) });
    assert!(destructive(&h.settle(e)).is_empty());
    assert_eq!(h.view(&m, "u3").life, Life::Observed);
}

/// Relist numbers wrap past `u32::MAX` to 1, never to 0 (the number of a record never listed):
/// a record listed by the last number before the wrap is questioned by the first after it.
#[test]
fn relist_numbers_wrap_to_one_and_still_question_the_unlisted() {
    let (mut h, key) = ready_local();
    h.s.kinds[Kind::ClusterBaseModel.index()].relist_at = u32::MAX - 1;
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(e.is_empty(), "listed by relist u32::MAX: {e:?}");
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    assert_eq!(h.s.kinds[Kind::ClusterBaseModel.index()].relist_at, 1);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::RelistVanished, 0)));
    assert_eq!(gets(&e).len(), 1);
}

#[test]
fn a_full_relist_questions_nothing() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1"), local("n", "u2")]);
    h.settle(e);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("n", "u2").into()));
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(h.view(&ModelKey::cluster("n"), "u2").life, Life::Observed);
}

#[test]
fn a_restarted_relist_resets_its_buffer() {
    let (mut h, key) = ready_local();
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
    // The list failed part-way: kube's watcher starts again with another Init.
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert_eq!(pending_cause(&h.view(&key, "u1")), Some((Cause::RelistVanished, 0)));
    assert_eq!(gets(&e).len(), 1);
}

#[test]
fn readiness_waits_for_the_first_list_and_never_treats_unsynced_as_empty() {
    let mut h = H::new();
    let e = h.input(Input::NodeObserved(node(&[])));
    h.answer_probes(&e, true);
    assert!(!h.s.readiness().ready);
    let c = h.s.readiness().checks;
    assert!(c.iter().any(|c| c.name == "clusterbasemodels-synced" && !c.ok));
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(!h.s.readiness().ready, "BaseModels not listed yet");
    h.watch(Kind::BaseModel, WatchEvent::RelistStarted);
    h.watch(Kind::BaseModel, WatchEvent::RelistDone);
    assert!(h.s.readiness().ready);
}

#[test]
fn delete_and_recreate_never_lets_the_old_uid_touch_the_new_one() {
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "a")]);
    let all = h.settle(e);
    assert!(all.iter().any(|e| matches!(&e.op, Op::Download { uid, .. } if uid.as_str() == "a")));
    let key = ModelKey::cluster("m");
    assert_eq!(h.view(&key, "a").owned_dir.as_deref(), Some("m"));
    // The watch shows B under the same name before A's delete was confirmed.
    let e = h.apply(hf("m", "b"));
    assert_eq!(pending_cause(&h.view(&key, "a")), Some((Cause::UidChanged, 0)));
    assert!(destructive(&e).is_empty());
    assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })), "B waits for A's directory to go");
    let id = one_get(&e);
    let e = h.input(Input::LiveRead { id, result: ReadResult::Found(hf("m", "b").into()) });
    let all = h.settle(e);
    let mut saw_trash = false;
    for e in &all {
        match &e.op {
            Op::Unpublish { uid, remove_label, .. } => {
                assert_eq!(uid.as_str(), "a");
                assert!(!remove_label, "B claims the label");
            }
            Op::TrashDir { uid, path, .. } => {
                assert_eq!(uid.as_str(), "a");
                assert_eq!(path, "m");
                saw_trash = true;
            }
            Op::Publish { uid, .. } | Op::Download { uid, .. } => assert_eq!(uid.as_str(), "b"),
            _ => {}
        }
    }
    assert!(saw_trash);
    let b = h.view(&key, "b");
    assert_eq!(b.published, Published::Status { status: ModelStatus::Ready, reason: None });
    assert!(h.s.incarnation(&key, &Uid::new("a")).is_none());
    // B's download came after A's directory was moved away.
    let trash_at = all.iter().position(|e| matches!(e.op, Op::TrashDir { .. })).unwrap();
    let download_at =
        all.iter().position(|e| matches!(&e.op, Op::Download { uid, .. } if uid.as_str() == "b")).unwrap();
    assert!(trash_at < download_at);
}

#[test]
fn no_destructive_effect_after_shutdown() {
    let (mut h, key, id) = pending_local();
    h.input(Input::Shutdown);
    let e = h.input(Input::LiveRead { id, result: ReadResult::NotFound });
    assert_eq!(h.view(&key, "u1").life, Life::Confirmed { confirmation: Confirmation::NotFound });
    assert!(destructive(&e).is_empty());
    let e = h.apply(deleting(local("other", "u9")));
    assert!(destructive(&e).is_empty());
    assert!(destructive(&h.advance(10_000_000)).is_empty());
}

// ---- Availability ---------------------------------------------------------------------------

fn verifications(effects: &[Effect]) -> Vec<Effect> {
    effects.iter().filter(|e| matches!(e.op, Op::VerifyLocal { .. })).cloned().collect()
}

#[test]
fn local_model_is_verified_then_ready() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    // Nothing published and no label: the check goes first, with no Updating write before it.
    assert!(published(&e).is_empty(), "{e:?}");
    let [Effect { id: vid, op: Op::VerifyLocal { path, .. } }] = &verifications(&e)[..] else { panic!("{e:?}") };
    assert_eq!(path, "/mnt/models/m");
    let e = h.input(Input::EffectDone { id: *vid, outcome: Outcome::Done });
    let [Effect { op: Op::Publish { label_key, label, cm_key, entry, .. }, .. }] = &e[..] else { panic!("{e:?}") };
    assert_eq!(label_key, "models.ome.io/clusterbasemodel.m");
    assert_eq!(*label, Some(ModelStatus::Ready));
    assert_eq!(cm_key, "clusterbasemodel.m");
    assert_eq!(entry.to_json(), r#"{"name":"m","status":"Ready","uid":"u1"}"#);
    assert!(h.s.readiness().ready, "read-only root, local:// only: ready");
}

#[test]
fn local_model_with_a_label_of_another_state_is_announced_updating_before_its_check() {
    for (label, published_first) in [("Failed", Some(ModelStatus::Updating)), ("Ready", None)] {
        let mut h = H::new();
        let e = h.start_on(node(&[("models.ome.io/clusterbasemodel.m", label)]), false, vec![local("m", "u1")]);
        let (publishes, checks) = (published(&e), verifications(&e).len());
        match published_first {
            Some(status) => assert_eq!((publishes, checks), (vec![(status, None)], 0), "{label}: {e:?}"),
            // Ready after a restart stays Ready while it is checked again.
            None => assert_eq!((publishes, checks), (vec![], 1), "{label}: {e:?}"),
        }
    }
}

#[test]
fn local_model_missing_is_failed_with_reason_and_verified_again_later() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let check = verifications(&e)[0].id;
    let e = h.input(Input::EffectDone { id: check, outcome: Outcome::Failed("/mnt/models/m does not exist".into()) });
    assert_eq!(published(&e), vec![(ModelStatus::Failed, Some("/mnt/models/m does not exist".into()))]);
    let e = h.settle(e);
    assert!(!e.iter().any(|e| matches!(e.op, Op::VerifyLocal { .. })));
    let delay = h.s.next_deadline().unwrap().as_ms() - h.now;
    let e = h.advance(delay);
    assert!(e.iter().any(|e| matches!(e.op, Op::VerifyLocal { .. })), "verified again without going Updating");
    assert!(published(&e).is_empty());
    let failed = h.notes.iter().filter(|n| matches!(n, Note::ModelFailed { .. })).count();
    assert_eq!(failed, 1, "a failed model is noted once, not once per outcome and once per publish");
}

#[test]
fn vendor_is_ready_without_io_and_pvc_is_never_placed() {
    let mut h = H::new();
    let v = obj(&ModelKey::cluster("v"), "uv", "vendor://nvidia/nim/llama", None);
    let p = obj(&ModelKey::cluster("p"), "up", "pvc://claim/llama", None);
    let e = h.start(false, vec![v, p]);
    let all = h.settle(e);
    assert_eq!(published(&all), vec![(ModelStatus::Ready, None)]);
    assert!(!all.iter().any(|e| matches!(e.op, Op::VerifyLocal { .. } | Op::Download { .. })));
    assert!(all.iter().all(|e| !matches!(&e.op, Op::Publish { key, .. } if &*key.name == "p")));
}

#[test]
fn downloading_model_owns_its_dir_and_trashes_it_after_a_confirmed_delete() {
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "u1")]);
    let all = h.settle(e);
    let dl = all.iter().find_map(|e| {
        if let Op::Download { dest, storage_uri, .. } = &e.op { Some((dest, storage_uri)) } else { None }
    });
    let (dest, uri) = dl.expect("a download");
    assert_eq!(dest.absolute(), "/mnt/models/m");
    assert_eq!(uri, "hf://org/repo");
    let key = ModelKey::cluster("m");
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(hf("m", "u1").into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound });
    let all = h.settle(e);
    let ops: Vec<&Op> = destructive(&all);
    assert!(matches!(ops[..], [Op::Unpublish { .. }, Op::TrashDir { path, .. }] if path == "m"), "{ops:?}");
    assert!(h.s.incarnation(&key, &Uid::new("u1")).is_none());
    // Purged after the grace period, not before.
    let e = h.advance(3_600_000 - 1);
    assert!(!e.iter().any(|e| matches!(e.op, Op::PurgeTrash { .. })));
    let e = h.advance(1);
    assert!(e.iter().any(|e| matches!(&e.op, Op::PurgeTrash { name } if name.starts_with("u1-"))));
}

/// `hf("m", uid)` with the reserve label.
fn reserved_hf(name: &str, uid: &str) -> ModelObject {
    let mut o = hf(name, uid);
    Arc::make_mut(o.spec.as_mut().unwrap()).reserve_artifact = true;
    o
}

/// A snapshot showing `m`'s marker naming `u1`.
fn marked_m_u1() -> DriftSnapshot {
    DriftSnapshot {
        owned_dirs: vec![OwnedDir { path: "m".into(), uid: Uid::new("u1"), reserved: false }],
        ..DriftSnapshot::default()
    }
}

fn disowns_of_m_u1(effects: &[Effect]) -> usize {
    let of_m_u1 = |op: &Op| matches!(op, Op::DisownDir { uid, path, .. } if uid.as_str() == "u1" && path == "m");
    effects.iter().filter(|e| of_m_u1(&e.op)).count()
}

/// The download tells the shell whether the model carries the reserve label, for the marker
/// to record it (`OwnedDir::reserved`).
#[test]
fn a_download_carries_the_reserve_label_of_its_model() {
    for (o, reserve) in [(reserved_hf("m", "u1"), true), (hf("m", "u1"), false)] {
        let mut h = H::new();
        let e = h.start(true, vec![o]);
        let all = h.settle(e);
        let downloads: Vec<bool> = all
            .iter()
            .filter_map(|e| if let Op::Download { reserve, .. } = e.op { Some(reserve) } else { None })
            .collect();
        assert_eq!(downloads, [reserve], "{all:?}");
    }
}

fn records(effects: &[Effect]) -> Vec<(String, bool)> {
    let record = |e: &Effect| match &e.op {
        Op::RecordReserve { path, reserved, .. } => Some((path.clone(), *reserved)),
        _ => None,
    };
    effects.iter().filter_map(record).collect()
}

/// The reserve label added to a model Ready here, or removed, goes into its directory's marker
/// (`Op::RecordReserve`) once, and not again once recorded; a model downloaded with the label has
/// it recorded by the download itself.
#[test]
fn a_reserve_label_changed_after_the_download_is_recorded_in_the_marker() {
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "u1")]);
    let all = h.settle(e);
    assert!(records(&all).is_empty(), "{all:?}");
    let e = h.apply(reserved_hf("m", "u1"));
    let all = h.settle(e);
    assert_eq!(records(&all), [("m".to_string(), true)], "{all:?}");
    let churn = |e: &Effect| matches!(e.op, Op::Download { .. } | Op::Publish { .. } | Op::Unpublish { .. });
    assert!(!all.iter().any(churn), "nothing else changes: {all:?}");
    let e = h.advance(600_000);
    assert!(records(&h.settle(e)).is_empty(), "recorded: not again");
    let e = h.apply(hf("m", "u1"));
    assert_eq!(records(&h.settle(e)), [("m".to_string(), false)]);
    let mut h = H::new();
    let e = h.start(true, vec![reserved_hf("m", "u1")]);
    let all = h.settle(e);
    assert!(records(&all).is_empty(), "the download recorded it: {all:?}");
}

/// A record that fails holds back nothing of the model's (a label change after it is recorded at
/// once, with no backoff), and is taken as written until a snapshot shows the marker's record
/// otherwise, which sends it again.
#[test]
fn a_failed_reserve_record_holds_nothing_back_and_a_snapshot_sends_it_again() {
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "u1")]);
    h.settle(e);
    let e = h.apply(reserved_hf("m", "u1"));
    let record = e.iter().find(|e| matches!(e.op, Op::RecordReserve { .. })).expect("a record").id;
    let e = h.input(Input::EffectDone { id: record, outcome: Outcome::Failed("EIO".into()) });
    assert!(records(&e).is_empty(), "taken as written: {e:?}");
    let e = h.apply(hf("m", "u1"));
    let record = e.iter().find(|e| matches!(e.op, Op::RecordReserve { reserved: false, .. }));
    let record = record.expect("at once, no backoff").id;
    let e = h.input(Input::EffectDone { id: record, outcome: Outcome::Failed("EIO".into()) });
    h.settle(e);
    // The label is back: recorded again (this one lands).
    let e = h.apply(reserved_hf("m", "u1"));
    let all = h.settle(e);
    assert_eq!(records(&all), [("m".to_string(), true)]);
    let e = h.advance(300_000);
    let sid = snapshot_request(&e);
    let marked = |reserved| DriftSnapshot {
        owned_dirs: vec![OwnedDir { path: "m".into(), uid: Uid::new("u1"), reserved }],
        ..DriftSnapshot::default()
    };
    let e = h.input(Input::DriftObserved { id: sid, snapshot: marked(false) });
    assert_eq!(records(&h.settle(e)), [("m".to_string(), true)], "the snapshot showed it unrecorded");
}

/// A record waits while another member's download writes the directory's marker (their writes
/// would race), and goes once that download has landed.
#[test]
fn a_reserve_record_waits_for_another_member_s_download_into_the_directory() {
    let mut h = H::new();
    let at = Some("/mnt/models/shared");
    let p = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", at);
    let d = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", at);
    let e = h.start(true, vec![p.clone(), d]);
    h.settle(e);
    let e = h.apply(obj(&ModelKey::cluster("third"), "c1", "hf://org/repo", at));
    let held = h.settle_except(e, |op| matches!(op, Op::Download { .. }));
    let download = held.iter().find(|e| matches!(e.op, Op::Download { .. })).expect("c1 downloads").id;
    let mut reserved = p;
    Arc::make_mut(reserved.spec.as_mut().unwrap()).reserve_artifact = true;
    let e = h.apply(reserved);
    let all = h.settle_except(e, |op| matches!(op, Op::Download { .. }));
    assert!(records(&all).is_empty(), "not while c1 writes the marker: {all:?}");
    let e = h.input(Input::EffectDone { id: download, outcome: Outcome::Done });
    assert_eq!(records(&h.settle(e)), [("shared".to_string(), true)]);
}

#[test]
fn reserved_artifacts_are_never_trashed() {
    let mut h = H::new();
    let o = reserved_hf("m", "u1");
    let e = h.start(true, vec![o.clone()]);
    h.settle(e);
    let e = h.apply(deleting(o));
    let all = h.settle(e);
    assert!(!all.iter().any(|e| matches!(e.op, Op::TrashDir { .. })));
    assert_eq!(disowns_of_m_u1(&all), 1, "{all:?}");
    assert_eq!(h.s.model_count(), 0);
}

/// A reserved model's weights outlive it: once its delete is confirmed it gives its directory
/// up (`Op::DisownDir`), and until that lands its uid claims the directory, so a sweep meanwhile
/// finds no orphan there; a failed disown is tried again, never dropped.
#[test]
fn a_deleted_reserved_model_gives_its_directory_up_before_it_is_forgotten() {
    let mut h = H::new();
    let o = reserved_hf("m", "u1");
    let e = h.start(true, vec![o.clone()]);
    h.settle(e);
    let e = h.apply(deleting(o));
    let held: Vec<Effect> = h.settle_except(e, |op| matches!(op, Op::DisownDir { .. }));
    let disown = held.iter().find(|e| matches!(e.op, Op::DisownDir { .. })).expect("a disown").id;
    let e = h.advance(300_000);
    let sid = snapshot_request(&e);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: marked_m_u1() });
    let mut out = Vec::new();
    for (id, _) in lists(&e) {
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(vec![]) }));
    }
    let all = h.settle(out);
    assert!(!all.iter().any(|e| matches!(e.op, Op::TrashDir { .. })), "{all:?}");
    assert_eq!(h.s.model_count(), 1, "kept until its directory is given up");
    let e = h.input(Input::EffectDone { id: disown, outcome: Outcome::Failed("EIO".into()) });
    assert!(!e.iter().any(|e| matches!(e.op, Op::DisownDir { .. })), "not at once: after a backoff");
    let e = h.advance(600_000);
    let all = h.settle(e);
    assert_eq!(all.iter().filter(|e| matches!(e.op, Op::DisownDir { .. })).count(), 1, "{all:?}");
    assert_eq!(h.s.model_count(), 0);
}

/// Swarm seed 1486: the reserved model was already being deleted when the agent started, so
/// its delete was confirmed before any snapshot had shown its directory. It stays until one has
/// (a snapshot asked for since it last changed), then gives that directory up; forgotten at
/// once, the sweep would have trashed the weights as an orphan's.
#[test]
fn a_reserved_model_gone_before_the_first_snapshot_waits_for_it_to_give_its_directory_up() {
    let mut h = H::new();
    let o = reserved_hf("m", "u1");
    let e = h.start(true, vec![deleting(o)]);
    let held = h.settle_except(e, |op| *op == Op::Snapshot);
    assert!(!held.iter().any(|e| matches!(e.op, Op::DisownDir { .. } | Op::TrashDir { .. })), "{held:?}");
    assert_eq!(h.s.model_count(), 1, "kept until a snapshot shows its directory");
    let sid = snapshot_request(&held);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: marked_m_u1() });
    let mut out = e.clone();
    for (id, _) in lists(&e) {
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(vec![]) }));
    }
    let all = h.settle(out);
    assert!(!all.iter().any(|e| matches!(e.op, Op::TrashDir { .. })), "{all:?}");
    assert_eq!(disowns_of_m_u1(&all), 1, "{all:?}");
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn download_on_a_read_only_root_fails_with_a_reason_and_makes_the_node_unready() {
    let mut h = H::new();
    let e = h.start(false, vec![local("l", "ul")]);
    h.settle(e);
    assert!(h.s.readiness().ready);
    let e = h.apply(hf("big", "ub"));
    let p = published(&e);
    assert_eq!(p.len(), 1);
    let (status, reason) = &p[0];
    assert_eq!(*status, ModelStatus::Failed);
    let reason = reason.as_deref().unwrap();
    assert!(reason.contains("/mnt/models is read-only") && reason.contains("hf://"), "{reason}");
    assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })));
    let r = h.s.readiness();
    assert!(!r.ready);
    let w = r.checks.iter().find(|c| c.name == "models-root-writable").unwrap();
    assert!(w.detail.contains("read-only") && w.detail.contains("ClusterBaseModel/big"), "{}", w.detail);
    // The root becomes writable: the model downloads and the node is ready again.
    h.settle(e);
    h.writable = true;
    let e = h.advance(10_000);
    let probe = e.iter().find(|e| e.op == Op::ProbeRoot).unwrap().id;
    let e = h.input(Input::RootProbed { id: probe, probe: RootProbe::healthy(true) });
    assert!(e.iter().any(|e| matches!(e.op, Op::Download { .. })));
    assert!(h.s.readiness().ready);
}

#[test]
fn a_tenant_s_base_model_cannot_flip_readiness() {
    let mut h = H::new();
    let e = h.start(false, vec![local("l", "ul")]);
    h.settle(e);
    // One hf:// BaseModel with no selector: eligible everywhere, on a read-only root.
    let b = obj(&ModelKey::namespaced("tenant", "big"), "ub", "hf://org/repo", Some("/mnt/models/big"));
    let e = h.apply(b);
    let p = published(&e);
    assert!(matches!(&p[..], [(ModelStatus::Failed, Some(r))] if r.contains("read-only")), "{p:?}");
    let r = h.s.readiness();
    assert!(r.ready, "{r:?}");
    assert!(h.s.models_needing_write().is_empty());
}

#[test]
fn write_check_always_and_never() {
    let mut cfg = config();
    cfg.write_check = WriteCheck::Always;
    let mut h = H::with(cfg.clone());
    h.start(false, vec![]);
    assert!(!h.s.readiness().ready);
    cfg.write_check = WriteCheck::Never;
    let mut h = H::with(cfg);
    h.start(false, vec![hf("m", "u")]);
    assert!(h.s.readiness().ready);
}

#[test]
fn readiness_needs_a_readable_directory() {
    let mut h = H::new();
    let e = h.start(true, vec![]);
    assert!(h.s.readiness().ready);
    let _ = e;
    let e = h.advance(10_000);
    let probe = e.iter().find(|e| e.op == Op::ProbeRoot).unwrap().id;
    let missing = RootProbe {
        exists: false,
        is_dir: false,
        readable: false,
        writable: false,
        detail: "ENOENT".into(),
        answered: true,
    };
    h.input(Input::RootProbed { id: probe, probe: missing });
    let r = h.s.readiness();
    assert!(!r.ready);
    assert!(r.checks.iter().any(|c| c.name == "models-root" && c.detail.contains("does not exist")));
}

#[test]
fn a_root_that_does_not_answer_is_not_ready_and_holds_downloads_until_it_answers() {
    let mut h = H::new();
    let e = h.start(true, vec![]);
    h.settle(e);
    let e = h.advance(10_000);
    let probe = e.iter().find(|e| e.op == Op::ProbeRoot).unwrap().id;
    h.input(Input::RootProbed { id: probe, probe: RootProbe::unanswered("did not answer within 5 s".into()) });
    let r = h.s.readiness();
    assert!(!r.ready);
    let check = r.checks.iter().find(|c| c.name == "models-root").unwrap();
    assert_eq!(check.detail, "models root /mnt/models did not answer within 5 s");
    // A model that downloads is neither fetched nor failed while the root is unknown.
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Applied(hf("m", "a").into()));
    let all = h.settle(e);
    assert!(!all.iter().any(|e| matches!(e.op, Op::Download { .. } | Op::Publish { .. })), "{all:?}");
    // The root answers again: the download starts.
    let e = h.advance(10_000);
    let all = h.settle(e);
    assert!(all.iter().any(|e| matches!(e.op, Op::Download { .. })), "{all:?}");
    assert!(h.s.readiness().ready);
}

#[test]
fn hostile_or_invalid_models_are_failed_and_never_acted_on() {
    let mut h = H::new();
    let escape = obj(&ModelKey::cluster("x"), "ux", "hf://org/repo", Some("/mnt/models/../../etc"));
    let outside = obj(&ModelKey::cluster("y"), "uy", "oci://n/a/b/c/o/d", Some("/var/lib"));
    let bad_uri = obj(&ModelKey::cluster("z"), "uz", "ftp://x/y", None);
    let mut broken = local("w", "uw");
    broken.spec = Err("spec.storage is missing".into());
    let e = h.start(true, vec![escape, outside, bad_uri, broken]);
    let all = h.settle(e);
    assert!(!all.iter().any(|e| matches!(e.op, Op::Download { .. } | Op::VerifyLocal { .. } | Op::TrashDir { .. })));
    let p = published(&all);
    assert_eq!(p.len(), 4);
    assert!(p.iter().all(|(s, _)| *s == ModelStatus::Failed));
    let reasons: Vec<String> = p.into_iter().map(|(_, r)| r.unwrap()).collect();
    assert!(reasons.iter().any(|r| r.contains("'..'")));
    assert!(reasons.iter().any(|r| r.contains("not beneath the models root")));
    assert!(reasons.iter().any(|r| r.contains("unknown scheme")));
    assert!(reasons.iter().any(|r| r.contains("invalid model: spec.storage is missing")));
}

#[test]
fn a_failed_effect_is_retried_with_backoff() {
    let mut h = H::new();
    let e = h.start(false, vec![vendor("m", "u1")]);
    let pid = e.iter().find(|e| matches!(e.op, Op::Publish { .. })).unwrap().id;
    let e = h.input(Input::EffectDone { id: pid, outcome: Outcome::Failed("apiserver 500".into()) });
    assert!(e.is_empty());
    assert!(matches!(&h.notes[..], [.., Note::EffectFailed { .. }]));
    let delay = h.s.next_deadline().unwrap().as_ms() - h.now;
    assert!((750..=1000).contains(&delay));
    let e = h.advance(delay);
    assert_eq!(published(&e), vec![(ModelStatus::Ready, None)]);
}

#[test]
fn a_publish_that_failed_from_nothing_is_still_withdrawn() {
    // The failed Ready may have half landed (label patched, ConfigMap write failed): a delete
    // before the retry must still remove what may be on the node.
    let mut h = H::new();
    let m = with_node_selector(vendor("m", "u1"), "zone", "a");
    let e = h.start(false, vec![m.clone()]);
    h.settle(e);
    let key = ModelKey::cluster("m");
    assert_eq!(h.view(&key, "u1").published, Published::Nothing, "not placed yet: nothing published");
    let e = h.input(Input::NodeObserved(node(&[("zone", "a")])));
    let [Effect { id, op: Op::Publish { .. } }] = &e[..] else { panic!("{e:?}") };
    let e = h.input(Input::EffectDone { id: *id, outcome: Outcome::Failed("configmap write: 500".into()) });
    assert!(e.is_empty(), "{e:?}");
    let mut e = h.apply(deleting(m));
    e.extend(h.advance(5_000));
    let e = h.settle(e);
    assert!(e.iter().any(|e| matches!(e.op, Op::Unpublish { .. })), "withdrawn after the backoff: {e:?}");
}

#[test]
fn an_unchanged_ready_label_is_not_flipped_to_updating_on_restart() {
    // The label is on the first Node view, or comes later in a change of model labels only (the
    // kind of change that settles only the models it concerns), while m's state is unknown.
    let ready = node(&[("models.ome.io/clusterbasemodel.m", "Ready")]);
    for label_later in [false, true] {
        let mut h = H::new();
        let e = h.input(Input::NodeObserved(if label_later { node(&[]) } else { ready.clone() }));
        h.answer_probes(&e, false);
        h.watch(Kind::BaseModel, WatchEvent::RelistStarted);
        h.watch(Kind::BaseModel, WatchEvent::RelistDone);
        h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
        let mut e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(local("m", "u1").into()));
        if label_later {
            e.extend(h.input(Input::NodeObserved(ready.clone())));
        }
        // Nothing is decided until every kind is listed (a colliding model may rank first).
        assert!(e.is_empty(), "{e:?}");
        e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone));
        assert!(published(&e).is_empty(), "label later: {label_later}, {e:?}");
        assert!(e.iter().any(|e| matches!(e.op, Op::VerifyLocal { .. })));
    }
}

#[test]
fn a_model_seen_deleting_at_start_is_cleaned_up() {
    let mut h = H::new();
    let e = h.start(false, vec![deleting(local("m", "u1"))]);
    assert!(matches!(destructive(&e)[..], [Op::Unpublish { .. }]), "{e:#?}");
    assert!(published(&e).is_empty());
}

// ---- Placement --------------------------------------------------------------------------------

pub(super) fn gpu_only(mut o: ModelObject) -> ModelObject {
    let spec = Arc::make_mut(o.spec.as_mut().unwrap());
    spec.required_terms =
        vec![NodeSelectorTerm { match_expressions: vec![requirement("gpu", "In", &["h100"])], match_fields: vec![] }];
    o
}

#[test]
fn placement_moving_away_is_confirmed_then_cleans_up_this_node_only() {
    let mut h = H::new();
    let e = h.input(Input::NodeObserved(node(&[("gpu", "h100"), ("zone", "a"), ("os", "linux")])));
    h.answer_probes(&e, true);
    let m = gpu_only(hf("m", "u1"));
    for kind in Kind::ALL {
        h.watch(kind, WatchEvent::RelistStarted);
        let e = if kind == Kind::ClusterBaseModel {
            h.watch(kind, WatchEvent::RelistItem(m.clone().into()))
        } else {
            vec![]
        };
        h.settle(e);
        let e = h.watch(kind, WatchEvent::RelistDone);
        h.settle(e);
    }
    let key = ModelKey::cluster("m");
    assert_eq!(h.view(&key, "u1").owned_dir.as_deref(), Some("m"));
    // The node loses its gpu label.
    let e = h.input(Input::NodeObserved(node(&[("zone", "a"), ("os", "linux")])));
    assert!(destructive(&e).is_empty(), "withdrawal waits for a live read");
    let id = one_get(&e);
    let e = h.input(Input::LiveRead { id, result: ReadResult::Found(m.clone().into()) });
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 0, "not a phantom delete");
    assert!(destructive(&e).is_empty(), "the model witness alone is not enough");
    let id = one_node_get(&e);
    let e = h.input(Input::NodeRead { id, result: NodeReadResult::Found(node(&[("zone", "a"), ("os", "linux")])) });
    let all = h.settle(e);
    let d = destructive(&all);
    assert!(matches!(d[..], [Op::Unpublish { remove_label: true, .. }, Op::TrashDir { .. }]), "{d:?}");
    let v = h.view(&key, "u1");
    assert_eq!(v.life, Life::Withdrawn, "the model itself lives on, withdrawn from this node");
    assert_eq!(v.published, Published::Nothing);
    // Placed here again: it comes back.
    let e = h.input(Input::NodeObserved(node(&[("gpu", "h100")])));
    assert!(e.iter().any(|e| matches!(e.op, Op::Publish { .. })));
}

#[test]
fn a_node_witness_sent_long_after_the_model_read_pairs_with_a_new_model_read() {
    // The simulator's swarm, seed 10004629: the model read agreed, the Node did not answer for
    // 20 s, and the model was placed here again meanwhile. A Node witness that late is paired
    // with a model read of its own time, never with the old one.
    let mut h = H::new();
    let m = gpu_only(hf("m", "u1"));
    let e = h.start_on(node(&[("gpu", "h100")]), true, vec![m.clone()]);
    h.settle(e);
    let e = h.input(Input::NodeObserved(node(&[])));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(m.clone().into()) });
    let first_node_read = one_node_get(&e);
    let timeout = h.s.config().live_read_timeout_ms;
    let mut late = Vec::new();
    for _ in 0..100 {
        late = h.advance(1_000);
        if late.iter().any(|e| e.op == Op::LiveGetNode) && h.now > timeout * 2 {
            break;
        }
    }
    let retried = late.iter().find(|e| e.op == Op::LiveGetNode).expect("the Node read is retried").id;
    assert_ne!(retried, first_node_read);
    let e = h.input(Input::NodeRead { id: retried, result: NodeReadResult::Found(node(&[])) });
    assert!(destructive(&e).is_empty(), "withdrawn on a model read {} ms old: {e:?}", h.now);
    let mut after = e;
    after.extend(h.advance(1_000));
    assert!(!gets(&after).is_empty() || !lists(&after).is_empty(), "the model is read again: {after:?}");
}

#[test]
fn models_never_placed_here_cause_no_effects() {
    let mut h = H::new();
    let e = h.start(true, vec![gpu_only(hf("m", "u1"))]);
    let all = h.settle(e);
    assert!(all.iter().all(|e| matches!(e.op, Op::ProbeRoot | Op::Snapshot)), "{all:?}");
    assert!(h.s.readiness().ready, "no downloading model is placed here");
}

// ---- Drift ------------------------------------------------------------------------------------

pub(super) fn snapshot_request(effects: &[Effect]) -> EffectId {
    effects.iter().find(|e| e.op == Op::Snapshot).expect("a snapshot request").id
}

#[test]
fn drift_restores_a_missing_label_for_a_ready_model() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let sid = snapshot_request(&e);
    h.settle(e.into_iter().filter(|e| e.op != Op::Snapshot).collect());
    // The snapshot was asked for before the model settled: stale for it, so ignored.
    let e = h.input(Input::DriftObserved { id: sid, snapshot: DriftSnapshot::default() });
    assert!(published(&e).is_empty());
    let e = h.advance(300_000);
    let sid = snapshot_request(&e);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: DriftSnapshot::default() });
    assert_eq!(published(&e), vec![(ModelStatus::Ready, None)], "label and entry restored");
}

#[test]
fn drift_removes_orphans_only_after_fresh_lists_show_no_owner() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let sid = snapshot_request(&e);
    let snap = DriftSnapshot {
        labels: BTreeMap::from([
            ("models.ome.io/clusterbasemodel.gone".into(), "Ready".into()),
            ("models.ome.io/clusterbasemodel.late".into(), "Ready".into()),
            ("kubernetes.io/hostname".into(), "node-1".into()),
            // Under the prefix but not OME's shapes or values: someone else's, left alone.
            ("models.ome.io/gpu-pool".into(), "Ready".into()),
            ("models.ome.io/clusterbasemodel.pinned".into(), "true".into()),
        ]),
        entries: BTreeMap::from([
            ("clusterbasemodel.gone".into(), EntryView { status: Some(ModelStatus::Ready), uid: Some(Uid::new("ug")) }),
            ("settings".into(), EntryView { status: None, uid: None }),
        ]),
        owned_dirs: vec![OwnedDir { path: "gone".into(), uid: Uid::new("ug"), reserved: false }],
        trash: vec![],
        unread: vec![],
    };
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
    assert!(destructive(&e).is_empty(), "a snapshot alone removes nothing");
    let l = lists(&e);
    assert_eq!(l.len(), 2);
    // The fresh lists show `late` (created since the agent's view) but not `gone`.
    let mut out = Vec::new();
    for (id, kind) in l {
        let listed = if kind == Kind::ClusterBaseModel {
            vec![local("late", "ul").into(), local("m", "u1").into()]
        } else {
            vec![]
        };
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(listed) }));
    }
    let d = destructive(&out);
    assert_eq!(d.len(), 3, "{d:?}");
    assert!(d.iter().any(|op| matches!(op, Op::RemoveOrphanLabel { label_key } if label_key.ends_with(".gone"))));
    assert!(d.iter().any(|op| matches!(op, Op::RemoveOrphanEntry { cm_key, uid } if cm_key == "clusterbasemodel.gone" && uid.as_ref().map(Uid::as_str) == Some("ug"))));
    assert!(d.iter().any(|op| matches!(op, Op::TrashDir { uid, key: None, .. } if uid.as_str() == "ug")));
    assert!(!d.iter().any(|op| matches!(op, Op::RemoveOrphanLabel { label_key } if label_key.ends_with(".late"))));
}

/// A model deleted while no agent ran is unknown to this one, and its directory an orphan's;
/// when the marker records it as reserved, the sweep gives the directory up (the marker goes,
/// the files stay, as upstream keeps a reserved model's files), and trashes only the others.
#[test]
fn the_sweep_gives_up_a_directory_whose_marker_records_a_reserved_model() {
    let mut h = H::new();
    let e = h.start(true, vec![local("m", "u1")]);
    let sid = snapshot_request(&e);
    let owned = |path: &str, uid: &str, reserved: bool| OwnedDir { path: path.into(), uid: Uid::new(uid), reserved };
    let snap = DriftSnapshot {
        owned_dirs: vec![owned("gone", "ug", false), owned("kept", "ux", false), owned("kept", "uk", true)],
        ..DriftSnapshot::default()
    };
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
    assert!(destructive(&e).is_empty(), "a snapshot alone removes nothing");
    let mut out = Vec::new();
    for (id, _) in lists(&e) {
        out.extend(h.input(Input::LiveList { id, result: ListResult::Listed(vec![]) }));
    }
    let trashed: Vec<&str> = out
        .iter()
        .filter_map(|e| if let Op::TrashDir { path, .. } = &e.op { Some(path.as_str()) } else { None })
        .collect();
    assert_eq!(trashed, ["gone"], "{out:?}");
    let disowns: Vec<&Effect> = out.iter().filter(|e| matches!(e.op, Op::DisownDir { .. })).collect();
    assert_eq!(disowns.len(), 1, "{out:?}");
    let Op::DisownDir { key, uid, path, keep } = &disowns[0].op else { unreachable!() };
    assert_eq!((key, uid.as_str(), path.as_str()), (&None, "uk", "kept"));
    assert!(keep.is_empty(), "no live model may be in that marker: {keep:?}");
    // A model at that path waits for the marker to go (its download would find it another
    // model's), then downloads, adopting what verifies.
    let e = h.apply(hf("kept", "un"));
    let all = h.settle(e);
    assert!(!all.iter().any(|e| matches!(e.op, Op::Download { .. })), "{all:?}");
    let e = h.input(Input::EffectDone { id: disowns[0].id, outcome: Outcome::Done });
    assert!(destructive(&e).is_empty(), "{e:?}");
    let all = h.settle(e);
    assert!(all.iter().any(|e| matches!(&e.op, Op::Download { uid, .. } if uid.as_str() == "un")), "{all:?}");
}

#[test]
fn drift_lists_that_fail_remove_nothing() {
    let mut h = H::new();
    let e = h.start(false, vec![]);
    let sid = snapshot_request(&e);
    let snap = DriftSnapshot {
        labels: BTreeMap::from([("models.ome.io/clusterbasemodel.x".into(), "Ready".into())]),
        ..DriftSnapshot::default()
    };
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
    let l = lists(&e);
    let e1 = h.input(Input::LiveList { id: l[0].0, result: ListResult::Listed(vec![]) });
    let e2 = h.input(Input::LiveList { id: l[1].0, result: ListResult::Failed("timeout".into()) });
    assert!(destructive(&e1).is_empty() && destructive(&e2).is_empty());
}

/// Weights whose marker a snapshot no longer shows are fetched again, but only where the scan
/// read: a directory it could not read (or the root, or a walk cut at its limit) may hold the
/// marker it missed, and a model there stays Ready as it is.
#[test]
fn drift_downloads_again_when_the_weights_vanished() {
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "u1")]);
    h.settle(e);
    h.advance(1);
    let snap = |unread: &[&str]| DriftSnapshot {
        labels: BTreeMap::from([("models.ome.io/clusterbasemodel.m".into(), "Ready".into())]),
        entries: BTreeMap::from([(
            "clusterbasemodel.m".into(),
            EntryView { status: Some(ModelStatus::Ready), uid: Some(Uid::new("u1")) },
        )]),
        owned_dirs: vec![],
        trash: vec![],
        unread: unread.iter().map(|u| u.to_string()).collect(),
    };
    for unread in [&[""][..], &["m"], &["a", "m"]] {
        let e = h.advance(300_000);
        let sid = snapshot_request(&e);
        let e = h.input(Input::DriftObserved { id: sid, snapshot: snap(unread) });
        let all = h.settle(e);
        assert!(published(&all).is_empty() && !all.iter().any(|e| matches!(e.op, Op::Download { .. })), "{all:?}");
    }
    // A directory beside it, or one whose name merely begins like its path, proves nothing.
    let e = h.advance(300_000);
    let sid = snapshot_request(&e);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap(&["mm", "n/m"]) });
    assert_eq!(published(&e), vec![(ModelStatus::Updating, None)]);
    let all = h.settle(e);
    assert!(all.iter().any(|e| matches!(e.op, Op::Download { .. })));
}

// ---- Totality, determinism, traces ------------------------------------------------------------

#[test]
fn every_input_is_handled_in_every_state_without_panic() {
    // Build one state holding every life: Observed, PendingConfirm (due, waiting, in flight) and
    // Confirmed (cleanup in flight), then feed every kind of input, including nonsense.
    let mut h = H::new();
    let e = h.start(true, vec![local("obs", "u1"), local("pend", "u2"), hf("conf", "u3"), local("wait", "u4")]);
    h.settle(e);
    h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("pend", "u2").into()));
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("wait", "u4").into()));
    let _ = e;
    h.apply(deleting(hf("conf", "u3")));
    let garbage = EffectId(999_999);
    let inputs = vec![
        Input::Tick,
        Input::LiveRead { id: garbage, result: ReadResult::NotFound },
        Input::LiveList { id: garbage, result: ListResult::Listed(vec![]) },
        Input::EffectDone { id: garbage, outcome: Outcome::Done },
        Input::RootProbed { id: garbage, probe: RootProbe::healthy(false) },
        Input::DriftObserved { id: garbage, snapshot: DriftSnapshot::default() },
        Input::Watch { kind: Kind::BaseModel, event: WatchEvent::Applied(local("wrong-stream", "u5").into()) },
        Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::RelistDone },
        Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::RelistItem(local("obs", "u1").into()) },
        Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::Deleted(local("unknown", "u6").into()) },
        Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::Applied(local("conf", "u3").into()) },
        Input::NodeObserved(node(&[("a", "b")])),
        Input::Shutdown,
        Input::Tick,
    ];
    for input in inputs {
        for id in 1..200 {
            // Answer whatever might be in flight, with every kind of answer.
            let _ = step(
                &h.s,
                Instant(h.now),
                Input::EffectDone { id: EffectId(id), outcome: Outcome::Failed("x".into()) },
            );
            let _ = step(
                &h.s,
                Instant(h.now),
                Input::LiveRead { id: EffectId(id), result: ReadResult::Found(local("pend", "u2").into()) },
            );
            let _ = step(
                &h.s,
                Instant(h.now),
                Input::LiveList { id: EffectId(id), result: ListResult::Failed("x".into()) },
            );
        }
        h.input(input);
        h.now += 7_000;
    }
    // The pending confirmation of "conf" ended in cleanup before shutdown; nothing is lost.
    assert!(h.s.incarnation(&ModelKey::cluster("obs"), &Uid::new("u1")).is_some());
}

#[test]
fn step_is_a_pure_fold() {
    let (h, _key) = ready_local();
    let before = h.s.clone();
    let input = Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::Deleted(local("m", "u1").into()) };
    let (s1, e1) = step(&before, Instant(5), input.clone());
    let (s2, e2) = step(&before, Instant(5), input);
    assert_eq!(e1, e2);
    assert_eq!(s1.incarnations(), s2.incarnations());
    assert_eq!(before.incarnations(), h.s.incarnations(), "the previous state is untouched");
    assert_ne!(before.incarnations(), s1.incarnations());
}

#[test]
fn one_seed_reproduces_jitter_and_another_changes_it() {
    let run = |seed: u64| {
        let mut cfg = config();
        cfg.seed = seed;
        let mut h = H::with(cfg);
        let e = h.start(false, vec![local("m", "u1")]);
        h.settle(e);
        let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(local("m", "u1").into()));
        h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Failed("x".into()) });
        h.s.next_deadline()
    };
    assert_eq!(run(1), run(1));
    assert!((1..20).any(|s| run(s) != run(0)));
}

#[test]
fn a_recorded_trace_replays_byte_for_byte() {
    use crate::trace::{Recorder, parse, replay};
    let cfg = config();
    let mut rec = Recorder::new(&cfg);
    let mut s = State::new(cfg);
    let mut now = 0;
    let mut feed = |s: &mut State, input: Input, now: u64| {
        let output = s.handle(Instant(now), input.clone());
        rec.record(Instant(now), &input, &output);
        output.effects
    };
    let e = feed(&mut s, Input::NodeObserved(node(&[])), now);
    feed(&mut s, Input::RootProbed { id: e[0].id, probe: RootProbe::healthy(true) }, now);
    for kind in Kind::ALL {
        feed(&mut s, Input::Watch { kind, event: WatchEvent::RelistStarted }, now);
        feed(
            &mut s,
            Input::Watch { kind, event: WatchEvent::RelistItem(hf(&format!("m-{kind}"), "u").clone().into()) },
            now,
        )
        .len();
        feed(&mut s, Input::Watch { kind, event: WatchEvent::RelistDone }, now);
    }
    now += 1500;
    let e = feed(
        &mut s,
        Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::Deleted(hf("m-ClusterBaseModel", "u").into()) },
        now,
    );
    let get = gets(&e)[0].0;
    feed(&mut s, Input::LiveRead { id: get, result: ReadResult::Failed("x".into()) }, now);
    feed(&mut s, Input::Tick, now + 5000);
    let text = rec.text();
    let trace = parse(&text).unwrap();
    let (_, divergence) = replay(&trace);
    assert_eq!(divergence, None);
    // A different seed diverges where jitter shows.
    let mut other = trace.clone();
    other.config.seed = 99;
    assert!(replay(&other).1.is_some());
    assert!(parse("").unwrap_err().contains("no header"));
    assert!(parse(&text.replace("\"version\":2", "\"version\":7")).unwrap_err().contains("version 7"));
}

/// Started, the first snapshot failed (or left unanswered); every later one is answered by
/// `answer` at the second it is asked (`None`: left unanswered). The seconds at which one was
/// asked, to 269 s (the regular drift pass comes 270-300 s after the start).
fn snapshots_asked_s(first_fails: bool, answer: impl Fn(u64, EffectId) -> Option<Input>) -> Vec<u64> {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let id = snapshot_request(&e);
    h.settle(e.into_iter().filter(|e| e.op != Op::Snapshot).collect());
    if first_fails {
        h.input(Input::EffectDone { id, outcome: Outcome::Failed("drift snapshot: 503".into()) });
    }
    let mut asked_s = Vec::new();
    for s in 1..270 {
        let e = h.advance(1_000);
        let Some(ask) = e.iter().find(|e| e.op == Op::Snapshot) else { continue };
        asked_s.push(s);
        if let Some(input) = answer(s, ask.id) {
            h.input(input);
        }
    }
    asked_s
}

#[test]
fn a_failed_first_snapshot_is_asked_for_again_sooner_and_sooner_no_more_once_one_came() {
    let fail = |id| Some(Input::EffectDone { id, outcome: Outcome::Failed("drift snapshot: 503".into()) });
    let observed = |id| Some(Input::DriftObserved { id, snapshot: DriftSnapshot::default() });
    assert_eq!(snapshots_asked_s(true, |_, id| fail(id)), vec![10, 30, 70, 150]);
    let came_at_30 = snapshots_asked_s(true, |s, id| if s == 30 { observed(id) } else { fail(id) });
    assert_eq!(came_at_30, vec![10, 30]);
    // A slow one is waited for, not replaced; one that never answers waits for the drift pass.
    assert_eq!(snapshots_asked_s(false, |_, _| None), Vec::<u64>::new());
}

#[test]
fn a_failed_snapshot_after_the_first_one_waits_for_the_next_drift_pass() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let first = snapshot_request(&e);
    h.settle(e.into_iter().filter(|e| e.op != Op::Snapshot).collect());
    h.input(Input::DriftObserved { id: first, snapshot: DriftSnapshot::default() });
    let e = h.advance(300_000);
    let second = snapshot_request(&e);
    h.input(Input::EffectDone { id: second, outcome: Outcome::Failed("drift snapshot: 503".into()) });
    let retry_in_ms: Vec<u64> = h
        .notes
        .iter()
        .filter_map(|n| match n {
            Note::EffectFailed { id, retry_in_ms, .. } if *id == second => Some(*retry_in_ms),
            _ => None,
        })
        .collect();
    assert_eq!(retry_in_ms, vec![300_000]);
    for _ in 0..269 {
        assert!(!h.advance(1_000).iter().any(|e| e.op == Op::Snapshot));
    }
}

#[test]
fn an_unanswered_snapshot_does_not_block_later_drift_passes() {
    let mut h = H::new();
    let e = h.start(false, vec![local("m", "u1")]);
    let first = snapshot_request(&e);
    h.settle(e.into_iter().filter(|e| e.op != Op::Snapshot).collect());
    let e = h.advance(300_000);
    let second = snapshot_request(&e);
    assert_ne!(first, second);
    // The late answer to the replaced request is ignored; the new one is used.
    assert!(h.input(Input::DriftObserved { id: first, snapshot: DriftSnapshot::default() }).is_empty());
    let e = h.input(Input::DriftObserved { id: second, snapshot: DriftSnapshot::default() });
    assert_eq!(published(&e), vec![(ModelStatus::Ready, None)]);
    // Unanswered probes leave nothing in flight.
    let before = h.s.inflight_count();
    for _ in 0..10 {
        h.advance(10_000);
    }
    assert!(h.s.inflight_count() <= before + 1);
}

#[test]
fn a_stale_list_showing_an_old_uid_never_overwrites_the_live_one() {
    // The node knows only B (restarted after A was deleted and B created under the same name).
    let mut h = H::new();
    let e = h.start(true, vec![hf("m", "b")]);
    h.settle(e);
    let key = ModelKey::cluster("m");
    // A lagging server lists the deleted A.
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let mut e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(hf("m", "a").into()));
    e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone));
    assert!(published(&e).is_empty(), "A must not overwrite B's entry: {e:#?}");
    assert!(destructive(&e).is_empty());
    assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })));
    // The live read shows B: B is current again, and A is confirmed gone without touching B.
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(hf("m", "b").into()) });
    assert!(h.view(&key, "b").current);
    let all = h.settle(e);
    let e2 = gets(&all);
    let all = if let Some((id, _)) = e2.first() {
        let e = h.input(Input::LiveRead { id: *id, result: ReadResult::Found(hf("m", "b").into()) });
        h.settle(e)
    } else {
        all
    };
    for e in &all {
        match &e.op {
            Op::Unpublish { uid, remove_label, .. } => {
                assert_eq!(uid.as_str(), "a");
                assert!(!remove_label);
            }
            Op::TrashDir { .. } => panic!("A never had a directory here"),
            Op::Publish { uid, .. } => assert_eq!(uid.as_str(), "b"),
            _ => {}
        }
    }
    assert!(h.s.incarnation(&key, &Uid::new("a")).is_none());
    assert_eq!(h.view(&key, "b").life, Life::Observed);
    assert_eq!(h.view(&key, "b").owned_dir.as_deref(), Some("m"), "B's weights untouched");
}

#[test]
fn a_new_uid_waits_until_the_old_uid_s_effects_have_landed() {
    // A's publish is still in flight when A is replaced by B: B must not publish until A's
    // effect has landed, or A's late write could overwrite B's entry.
    let mut h = H::new();
    let e = h.start(false, vec![]);
    h.settle(e);
    let e = h.apply(vendor("m", "a"));
    let a_publish = e.iter().find(|e| matches!(e.op, Op::Publish { .. })).unwrap().id;
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(vendor("m", "a").into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(vendor("m", "b").into()) });
    assert!(published(&e).is_empty(), "B waits for A's publish to land: {e:#?}");
    let e = h.input(Input::EffectDone { id: a_publish, outcome: Outcome::Done });
    // Now A's cleanup runs (keeping the label B will claim), then B proceeds.
    let all = h.settle(e);
    let first_b = all.iter().position(|e| matches!(&e.op, Op::Publish { uid, .. } if uid.as_str() == "b")).unwrap();
    let a_unpublish =
        all.iter().position(|e| matches!(&e.op, Op::Unpublish { uid, .. } if uid.as_str() == "a")).unwrap();
    assert!(a_unpublish < first_b);
}

/// `o`, placed only on nodes whose label `key` reads `value`.
fn with_node_selector(mut o: ModelObject, key: &str, value: &str) -> ModelObject {
    Arc::make_mut(o.spec.as_mut().unwrap()).node_selector = vec![(key.to_string(), value.to_string())];
    o
}

#[test]
fn a_change_of_model_labels_only_still_places_a_model_whose_selector_names_one() {
    let mut h = H::new();
    // Its placement names a model label: the echo of a label write changes only model labels,
    // and such a model is still settled by it.
    let follower = with_node_selector(vendor("follower", "u2"), "models.ome.io/clusterbasemodel.leader", "Ready");
    let e = h.start_on(node(&[("zone", "a")]), false, vec![vendor("leader", "u1"), follower]);
    assert_eq!(published(&e), vec![(ModelStatus::Ready, None)], "the leader only: {e:?}");
    // The Node's echo: only a model label changed; the follower's selector now matches.
    let e = h.input(Input::NodeObserved(node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.leader", "Ready")])));
    let labels: Vec<&str> = e
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { label_key, .. } => Some(label_key.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(labels, vec!["models.ome.io/clusterbasemodel.follower"], "{e:?}");
}

#[test]
fn only_a_change_confined_to_model_labels_skips_the_other_models() {
    use super::evidence::changes_only_model_labels;
    let a = node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.m", "Updating")]);
    let ready = node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.m", "Ready")]);
    let gone = node(&[("zone", "a")]);
    let added = node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.m", "Updating"), ("models.ome.io/x", "y")]);
    let zone = node(&[("zone", "b"), ("models.ome.io/clusterbasemodel.m", "Updating")]);
    let other = node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.m", "Updating"), ("gpu", "h100")]);
    let prefix_only = node(&[("zone", "a"), ("models.ome.io/clusterbasemodel.m", "Updating"), ("models.ome.iox", "1")]);
    let renamed = NodeView { name: "node-2".into(), ..a.clone() };
    for (new, only) in [
        (&ready, true),
        (&gone, true),
        (&added, true),
        (&a, true),
        (&zone, false),
        (&other, false),
        (&prefix_only, false),
    ] {
        assert_eq!(changes_only_model_labels(&a, new), only, "{new:?}");
        assert_eq!(changes_only_model_labels(new, &a), only, "reversed: {new:?}");
    }
    assert!(!changes_only_model_labels(&a, &renamed));
}

/// A review: a Failed reason was published whole. A storage URI that fits the spec's limit but
/// does not parse made an entry of about 60 KiB on every node the model is placed on, and a few
/// dozen such models (any tenant may create BaseModels) filled the ConfigMap past 1 MiB.
#[test]
fn a_failed_reason_in_an_entry_is_bounded() {
    let mut h = H::new();
    let uri = format!("ftp://{}", "x".repeat(60_000));
    assert!(uri.len() < Config::new("node-1", ROOT).object_bytes_max, "the spec is kept");
    let bad = obj(&ModelKey::namespaced("tenant", "m"), "u1", &uri, None);
    let e = h.start(true, vec![bad]);
    let all = h.settle(e);
    let sizes: Vec<usize> = all
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { entry, .. } => Some(entry.to_json().len()),
            _ => None,
        })
        .collect();
    assert!(!sizes.is_empty());
    assert!(sizes.iter().all(|&n| n <= 2 * wire::REASON_BYTES_MAX), "entry JSON sizes: {sizes:?}");
}
