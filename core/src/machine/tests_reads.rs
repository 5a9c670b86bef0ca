//! Live reads under the default configuration: the coalescing window, a lone candidate's
//! immediate GET, LIST failures and LIST answers as evidence.

use super::tests::*;
use super::*;

const WINDOW_MS: u64 = 500;

/// A node (default configuration) with `n` Ready local:// ClusterBaseModels `c0`..; their objects.
fn ready_many(n: usize) -> (H, Vec<ModelObject>) {
    let mut h = H::with(Config::new("node-1", ROOT));
    assert_eq!(h.s.config().coalesce_window_ms, WINDOW_MS);
    let objs: Vec<ModelObject> = (0..n).map(|i| local(&format!("c{i}"), &format!("u{i}"))).collect();
    let e = h.start(false, objs.clone());
    h.settle(e);
    (h, objs)
}

fn delete(h: &mut H, o: &ModelObject) -> Vec<Effect> {
    h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(o.clone().into()))
}

fn listed(objs: &[ModelObject], gone: &[&str]) -> ListResult {
    ListResult::Listed(objs.iter().filter(|o| !gone.contains(&&*o.key.name)).cloned().map(Arc::new).collect())
}

fn key(name: &str) -> ModelKey {
    ModelKey::cluster(name)
}

/// A relist of ClusterBaseModels that misses `missing`: they come due together, so one LIST
/// goes out (and the window opens); its id.
fn storm(h: &mut H, objs: &[ModelObject], missing: &[&str]) -> EffectId {
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    for o in objs.iter().filter(|o| !missing.contains(&&*o.key.name)) {
        h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(o.clone().into()));
    }
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(gets(&e).is_empty(), "{e:?}");
    let l = lists(&e);
    assert_eq!(l.len(), 1, "{e:?}");
    l[0].0
}

#[test]
fn a_lone_candidate_is_read_at_once_with_a_get() {
    let (mut h, objs) = ready_many(4);
    let e = delete(&mut h, &objs[1]);
    assert_eq!(gets(&e), vec![(gets(&e)[0].0, key("c1"))], "no added latency for one delete");
    assert!(lists(&e).is_empty());
    // A GET opens no window: the next lone delete is read at once too.
    h.now += 100;
    assert_eq!(gets(&delete(&mut h, &objs[2])).len(), 1);
}

#[test]
fn keys_due_within_the_window_share_one_list() {
    let (mut h, objs) = ready_many(8);
    let first = storm(&mut h, &objs, &["c0", "c1"]);
    h.now += 10;
    h.input(Input::LiveList { id: first, result: listed(&objs, &[]) });
    for o in &objs[2..5] {
        h.now += 100;
        let e = delete(&mut h, o);
        assert!(gets(&e).is_empty() && lists(&e).is_empty(), "waits for the window: {e:?}");
    }
    let e = h.advance(WINDOW_MS - 310 - 1);
    assert!(gets(&e).is_empty() && lists(&e).is_empty());
    let e = h.advance(1);
    let l = lists(&e);
    assert_eq!(l.len(), 1, "one LIST when the window closes: {e:?}");
    assert!(gets(&e).is_empty());
    h.input(Input::LiveList { id: l[0].0, result: listed(&objs, &[]) });
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 5);
    assert_eq!((h.s.stats().live_gets, h.s.stats().live_lists), (0, 2));
}

#[test]
fn a_lone_straggler_in_the_window_is_a_get_when_it_closes() {
    let (mut h, objs) = ready_many(4);
    let first = storm(&mut h, &objs, &["c0", "c1"]);
    h.input(Input::LiveList { id: first, result: listed(&objs, &[]) });
    h.now += 200;
    assert!(gets(&delete(&mut h, &objs[2])).is_empty());
    let e = h.advance(WINDOW_MS - 200);
    assert_eq!(gets(&e).iter().map(|(_, k)| k.clone()).collect::<Vec<_>>(), vec![key("c2")]);
    assert!(lists(&e).is_empty());
}

#[test]
fn keys_due_while_a_list_is_in_flight_go_out_when_it_ends() {
    let (mut h, objs) = ready_many(20);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let half: Vec<ModelObject> = objs[..10].to_vec();
    for o in &half {
        h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(o.clone().into()));
    }
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    let (list, _) = lists(&e)[0];
    // The window closes while the LIST is still in flight; two more deletes arrive.
    h.advance(WINDOW_MS + 100);
    assert!(gets(&delete(&mut h, &objs[0])).is_empty());
    assert!(lists(&delete(&mut h, &objs[1])).is_empty());
    let e = h.input(Input::LiveList { id: list, result: listed(&objs, &[]) });
    let l = lists(&e);
    assert_eq!(l.len(), 1, "the keys that waited go out together as the LIST ends: {e:?}");
    assert!(gets(&e).is_empty());
    h.input(Input::LiveList { id: l[0].0, result: listed(&objs, &[]) });
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 12);
    assert_eq!(h.s.pending_confirmations().0, 0);
}

#[test]
fn a_failed_list_retries_all_its_keys_with_one_delay_and_drops_none() {
    let (mut h, objs) = ready_many(20);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let mut id = lists(&h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone))[0].0;
    for attempt in 1..=4u32 {
        let e = h.input(Input::LiveList { id, result: ListResult::Failed("etcd leader changed".into()) });
        assert!(destructive(&e).is_empty());
        let delays: BTreeSet<u64> = objs.iter().map(|o| read_retry_in(&h, &o.key, o.uid.as_str())).collect();
        assert_eq!(delays.len(), 1, "one shared delay: {delays:?}");
        for o in &objs {
            assert_eq!(pending_cause(&h.view(&o.key, o.uid.as_str())), Some((Cause::RelistVanished, attempt)));
        }
        let delay = *delays.first().unwrap();
        let mut e = h.advance(delay - 1);
        e.extend(h.advance(1));
        let l = lists(&e);
        assert_eq!(l.len(), 1, "one LIST again, whatever the window: {e:?}");
        assert!(gets(&e).is_empty());
        id = l[0].0;
    }
    h.input(Input::LiveList { id, result: listed(&objs, &[]) });
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 20, "every key answered, none dropped");
    assert_eq!(h.s.pending_confirmations().0, 0);
}

#[test]
fn a_key_a_list_shows_gone_is_evidence_as_a_get_s_not_found_is() {
    // By a GET: c1 deleted alone.
    let (mut by_get, objs) = ready_many(20);
    let id = one_get(&delete(&mut by_get, &objs[1]));
    let get_out = by_get.input(Input::LiveRead { id, result: ReadResult::NotFound });
    // By a LIST: c1 and c2 vanish from a relist; the LIST shows c2 only.
    let (mut by_list, _) = ready_many(20);
    let list = storm(&mut by_list, &objs, &["c1", "c2"]);
    let list_out = by_list.input(Input::LiveList { id: list, result: listed(&objs, &["c1"]) });
    for (h, out) in [(&by_get, &get_out), (&by_list, &list_out)] {
        assert_eq!(h.view(&key("c1"), "u1").life, Life::Confirmed { confirmation: Confirmation::NotFound });
        let d = destructive(out);
        assert!(matches!(d[..], [Op::Unpublish { key, remove_label: true, .. }] if &*key.name == "c1"), "{d:?}");
        assert!(h.notes.iter().any(|n| matches!(n, Note::DeleteConfirmed { key, .. } if &*key.name == "c1")));
    }
    assert_eq!(by_list.view(&key("c2"), "u2").life, Life::Observed);
}

#[test]
fn a_few_keys_among_many_models_stay_gets() {
    let (mut h, objs) = ready_many(100);
    let models_per_key = h.s.config().coalesce_models_per_key_max;
    assert!(100 / models_per_key > 2, "2 keys are fewer than one per {models_per_key} of 100 models");
    let first = storm(&mut h, &objs, &["c0", "c1", "c2", "c3", "c4"]);
    h.input(Input::LiveList { id: first, result: listed(&objs, &[]) });
    delete(&mut h, &objs[10]);
    delete(&mut h, &objs[11]);
    let e = h.advance(WINDOW_MS);
    assert!(lists(&e).is_empty(), "a LIST of 100 models for 2 keys: {e:?}");
    assert_eq!(gets(&e).len(), 2);
}

#[test]
fn a_config_recorded_before_the_window_reads_as_before() {
    let mut json = serde_json::to_value(Config::new("node-1", ROOT)).unwrap();
    let fields = json.as_object_mut().unwrap();
    fields.remove("coalesce_window_ms");
    fields.remove("coalesce_models_per_key_max");
    fields.insert("coalesce_keys_min".into(), 16.into());
    let old: Config = serde_json::from_value(json).unwrap();
    assert_eq!((old.coalesce_window_ms, old.coalesce_models_per_key_max), (0, 0));
    let mut h = H::with(old);
    let objs: Vec<ModelObject> = (0..4).map(|i| local(&format!("c{i}"), &format!("u{i}"))).collect();
    let e = h.start(false, objs.clone());
    h.settle(e);
    one_get(&delete(&mut h, &objs[0]));
    h.now += 10;
    one_get(&delete(&mut h, &objs[1]));
    assert_eq!(h.s.next_deadline(), Some(Instant(10_000)), "no window timer: the reads' deadline is next");
}

/// The LIST of a storm pages through every object of its kind: one GET's deadline for
/// thousands of objects failed every LIST on a loaded API server and its candidates waited for
/// good. Its deadline grows with the models kept (`live_list_ms_per_model`), and the shell is
/// given it; a trace's configuration without it keeps one GET's deadline.
#[test]
fn a_list_s_deadline_grows_with_the_models_kept() {
    let (mut h, objs) = ready_many(400);
    let per_model = h.s.config().live_list_ms_per_model;
    assert_eq!(per_model, LIVE_LIST_MS_PER_MODEL_DEFAULT);
    let timeout_ms = 10_000 + 400 * per_model;
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    let sent: Vec<_> = e.iter().filter(|x| matches!(x.op, Op::LiveList { .. })).collect();
    assert_eq!(sent.len(), 1, "{e:?}");
    assert_eq!(sent[0].op, Op::LiveList { kind: Kind::ClusterBaseModel, timeout_ms: Some(timeout_ms) });
    let id = sent[0].id;
    h.advance(timeout_ms - 1);
    assert_eq!(h.s.stats().reads_timed_out, 0, "still within its deadline past a GET's");
    h.input(Input::LiveList { id, result: listed(&objs, &["c7"]) });
    assert_eq!(h.s.stats().phantom_deletes_suppressed, 399);
    assert!(h.s.pending_confirmations().0 <= 1);

    let mut old = H::with(Config { live_list_ms_per_model: 0, ..Config::new("node-1", ROOT) });
    let e = old.start(false, objs.clone());
    old.settle(e);
    old.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let e = old.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    assert!(e.iter().any(|x| x.op == Op::LiveList { kind: Kind::ClusterBaseModel, timeout_ms: None }), "{e:?}");
    old.advance(10_000);
    assert_eq!(old.s.stats().reads_timed_out, 1, "one GET's deadline");
}

#[test]
fn a_list_s_deadline_is_capped() {
    let config = Config { live_list_ms_per_model: 1_000_000, ..Config::new("node-1", ROOT) };
    let mut h = H::with(config);
    let objs: Vec<ModelObject> = (0..3).map(|i| local(&format!("c{i}"), &format!("u{i}"))).collect();
    let e = h.start(false, objs);
    h.settle(e);
    h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone);
    let wanted = Op::LiveList { kind: Kind::ClusterBaseModel, timeout_ms: Some(LIVE_LIST_TIMEOUT_MS_MAX) };
    assert!(e.iter().any(|x| x.op == wanted), "{e:?}");
}
