//! Shared copies (`ReuseIfExists`) and same-path reuse: one rule per test.

use super::tests::*;
use super::*;
use crate::model::{DownloadPolicy, ModelSpec};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const COPY: &str = "_artifacts/org/repo/0123456789abcdef0123456789abcdef01234567";

fn reuse(key: &ModelKey, uid: &str, path: &str) -> ModelObject {
    let mut spec = ModelSpec::simple("hf://org/repo@main", Some(path));
    spec.download_policy = DownloadPolicy::ReuseIfExists;
    ModelObject { spec: Ok(Arc::new(spec)), ..obj(key, uid, "hf://org/repo@main", Some(path)) }
}

fn three() -> Vec<ModelObject> {
    vec![
        reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen"),
        reuse(&ModelKey::namespaced("team-a", "qwen"), "a1", "/mnt/models/a/qwen"),
        reuse(&ModelKey::namespaced("team-b", "qwen"), "b1", "/mnt/models/b/qwen"),
    ]
}

/// What the fake node did, as the driver answered.
#[derive(Default)]
struct Seen {
    resolves: usize,
    /// (uid, dest, co_owners) of every download, in order.
    downloads: Vec<(String, String, Vec<String>)>,
    /// Downloads in flight at once, at most.
    concurrent_max: usize,
    links: Vec<(String, String)>,
    unlinks: Vec<(String, String)>,
    trashed: Vec<String>,
    /// (uid, path) of every `DisownDir`.
    disowned: Vec<(String, String)>,
    entries: BTreeMap<String, wire::ModelEntry>,
    occupied: BTreeSet<String>,
    /// When set, the uids each marker names: downloads rewrite them as the shell does, and
    /// snapshots report them (rather than `run`'s `owned`).
    markers: Option<BTreeMap<String, BTreeSet<String>>>,
    /// Leave snapshots unanswered, kept here.
    snapshots_held: Option<Vec<EffectId>>,
    /// `Op::LiveList`s answered.
    lists: usize,
}

impl Seen {
    fn snapshot(&self, owned: &[OwnedDir]) -> DriftSnapshot {
        let Some(markers) = &self.markers else {
            return DriftSnapshot { owned_dirs: owned.to_vec(), ..DriftSnapshot::default() };
        };
        let marked = markers.iter().flat_map(|(path, uids)| uids.iter().map(move |u| (path, u)));
        let owned_dirs =
            marked.map(|(path, uid)| OwnedDir { path: path.clone(), uid: Uid::new(uid), reserved: false }).collect();
        DriftSnapshot { owned_dirs, ..DriftSnapshot::default() }
    }

    /// As the shell moves a directory to the trash (`fsops::trash_dir`): when markers are
    /// followed, only one whose marker names `uid`.
    fn trash(&mut self, path: &str, uid: &Uid) -> Outcome {
        if self.markers.is_some() && !self.names(path, uid) {
            return Outcome::Failed(format!("{path}: not {uid}'s: left alone"));
        }
        self.trashed.push(path.to_string());
        if let Some(markers) = self.markers.as_mut() {
            markers.remove(path);
        }
        Outcome::Done
    }

    /// The marker at `path` names `uid` (markers followed).
    fn names(&self, path: &str, uid: &Uid) -> bool {
        let named = self.markers.as_ref().and_then(|m| m.get(path));
        named.is_some_and(|named| named.contains(uid.as_str()))
    }

    /// As the shell gives a directory up (`fsops::disown_dir`): the marker keeps the uids of
    /// `keep` it names.
    fn disown(&mut self, path: &str, uid: &Uid, keep: &[Uid]) {
        self.disowned.push((uid.to_string(), path.to_string()));
        if let Some(named) = self.markers.as_mut().and_then(|m| m.get_mut(path)) {
            named.retain(|u| *u != uid.as_str() && keep.iter().any(|k| k.as_str() == u));
        }
    }

    /// As the shell rewrites a marker it accepts (`owned_manifest`, `Marker::new`).
    fn mark(&mut self, dest: &str, uid: &Uid, co_owners: &[Uid], keep_marked: bool) {
        let Some(markers) = &mut self.markers else { return };
        let owners = co_owners.iter().chain([uid]).map(|u| u.to_string());
        let named = markers.entry(dest.to_string()).or_default();
        if !keep_marked {
            named.clear();
        }
        named.extend(owners);
    }
}

/// Answers every effect as a healthy node would (downloads one step later, so that overlap is
/// seen), snapshots with `owned` as the marked directories, lists with `listed`, a live read of
/// the Node with the Node as last seen.
fn run(h: &mut H, mut effects: Vec<Effect>, seen: &mut Seen, owned: &[OwnedDir], listed: &[ModelObject]) {
    let mut downloading: Vec<EffectId> = Vec::new();
    for _ in 0..200 {
        let mut next = Vec::new();
        for id in std::mem::take(&mut downloading) {
            let result = DownloadResult::Done { commit: COMMIT.into(), metadata: None, bytes: 1000 };
            let outcome = Outcome::Downloaded(DownloadEnd { marked: true, result });
            next.extend(h.input(Input::EffectDone { id, outcome }));
        }
        for e in &effects {
            if let Some(input) = answer(h, e, seen, (owned, listed), &mut downloading) {
                next.extend(h.input(input));
            }
        }
        seen.concurrent_max = seen.concurrent_max.max(downloading.len());
        if next.is_empty() && downloading.is_empty() {
            return;
        }
        effects = next;
    }
    panic!("effects did not settle");
}

/// `run`'s answer to one effect; none for an effect left unanswered (a download answers in the
/// next round, from `downloading`).
fn answer(
    h: &H,
    e: &Effect,
    seen: &mut Seen,
    (owned, listed): (&[OwnedDir], &[ModelObject]),
    downloading: &mut Vec<EffectId>,
) -> Option<Input> {
    let done = Input::EffectDone { id: e.id, outcome: Outcome::Done };
    let input = match &e.op {
        Op::Resolve { .. } => {
            seen.resolves += 1;
            Input::EffectDone { id: e.id, outcome: Outcome::Resolved { commit: COMMIT.into() } }
        }
        Op::Download { uid, dest, co_owners, keep_marked, .. } => {
            let co = co_owners.iter().map(|u| u.to_string()).collect();
            let dest = dest.beneath_root().map(str::to_string).unwrap();
            seen.mark(&dest, uid, co_owners, *keep_marked);
            seen.downloads.push((uid.to_string(), dest, co));
            downloading.push(e.id);
            return None;
        }
        Op::Link { link, .. } if seen.occupied.contains(link) => {
            Input::EffectDone { id: e.id, outcome: Outcome::Occupied(format!("{link} is a directory")) }
        }
        Op::Link { link, copy, .. } => {
            seen.links.push((link.clone(), copy.clone()));
            done
        }
        Op::Unlink { link, copy, .. } => {
            seen.unlinks.push((link.clone(), copy.clone()));
            done
        }
        Op::TrashDir { path, uid, .. } => Input::EffectDone { id: e.id, outcome: seen.trash(path, uid) },
        Op::DisownDir { uid, path, keep, .. } => {
            seen.disown(path, uid, keep);
            done
        }
        Op::Publish { cm_key, entry, .. } => {
            seen.entries.insert(cm_key.clone(), (**entry).clone());
            done
        }
        Op::Unpublish { cm_key, .. } => {
            seen.entries.remove(cm_key);
            done
        }
        Op::LiveList { kind, .. } => {
            seen.lists += 1;
            let objs = listed.iter().filter(|o| o.key.kind == *kind).cloned().map(Arc::new).collect();
            Input::LiveList { id: e.id, result: ListResult::Listed(objs) }
        }
        Op::Snapshot if seen.snapshots_held.is_some() => {
            seen.snapshots_held.as_mut().expect("checked").push(e.id);
            return None;
        }
        Op::Snapshot => Input::DriftObserved { id: e.id, snapshot: seen.snapshot(owned) },
        Op::ProbeRoot => Input::RootProbed { id: e.id, probe: RootProbe::healthy(true) },
        // The Node as this agent last saw it: a trash of a directory whose marker names
        // other uids waits for such a witness.
        Op::LiveGetNode => match h.s.node.as_deref() {
            Some(node) => Input::NodeRead { id: e.id, result: NodeReadResult::Found(node.clone()) },
            None => return None,
        },
        Op::LiveGet { .. } | Op::CancelDownload { .. } => return None,
        _ => done,
    };
    Some(input)
}

/// Three drift passes, five minutes apart (each with its sweep), answered by `run` with `listed`.
fn drift_passes(h: &mut H, seen: &mut Seen, listed: &[ModelObject]) {
    for _ in 0..3 {
        let e = h.advance(300_000);
        run(h, e, seen, &[], listed);
    }
}

/// `a`, placed only where the gpu label is, and `b`, placed everywhere: one source, one path.
fn pair_at_shared() -> (ModelObject, ModelObject) {
    let at = Some("/mnt/models/shared");
    (
        gpu_only(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at)),
        obj(&ModelKey::cluster("b"), "b1", "hf://org/repo", at),
    )
}

/// A node that places `gpu_only` models, and the same node once the label is gone.
fn gpu_and_cpu() -> (NodeView, NodeView) {
    (node(&[("gpu", "h100"), ("zone", "a"), ("os", "linux")]), node(&[("zone", "a"), ("os", "linux")]))
}

/// The node changes to `now`, which no longer places `m`: the model read and the Node read agree.
fn leave_node(h: &mut H, m: &ModelObject, now: NodeView) -> Vec<Effect> {
    let e = h.input(Input::NodeObserved(now.clone()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(m.clone().into()) });
    h.input(Input::NodeRead { id: one_node_get(&e), result: NodeReadResult::Found(now) })
}

fn delete(h: &mut H, o: &ModelObject) -> Vec<Effect> {
    let e = h.watch(o.key.kind, WatchEvent::Deleted(o.clone().into()));
    h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound })
}

fn copy_marked(uids: &[&str]) -> Vec<OwnedDir> {
    uids.iter().map(|u| OwnedDir { path: COPY.into(), uid: Uid::new(u), reserved: false }).collect()
}

/// Three models, one copy: ready, and where every download went.
fn three_ready() -> (H, Seen, Vec<ModelObject>) {
    let mut h = H::new();
    let models = three();
    let e = h.start(true, models.clone());
    let mut seen = Seen::default();
    run(&mut h, e, &mut seen, &[], &models);
    (h, seen, models)
}

#[test]
fn three_models_of_one_commit_share_one_copy_downloaded_one_at_a_time() {
    let (h, seen, models) = three_ready();
    assert_eq!(seen.resolves, 3);
    assert!(seen.downloads.iter().all(|(_, dest, _)| dest == COPY), "{:?}", seen.downloads);
    assert_eq!(seen.concurrent_max, 1, "one download into the copy at a time");
    // The later ones name the earlier in the marker, so the marker ends up naming all three.
    let (_, _, last_co) = seen.downloads.last().unwrap();
    assert_eq!(last_co.len(), 2, "{:?}", seen.downloads);
    let mut links = seen.links.clone();
    links.sort();
    assert_eq!(
        links,
        vec![("a/qwen".into(), COPY.into()), ("b/qwen".into(), COPY.into()), ("qwen".into(), COPY.into())]
    );
    for m in &models {
        let v = h.view(&m.key, m.uid.as_str());
        assert_eq!(v.published, Published::Status { status: ModelStatus::Ready, reason: None }, "{}", m.key);
    }
}

#[test]
fn the_entries_carry_the_v1_2_2_artifact_shape_with_one_owner_and_its_children() {
    let (_, seen, models) = three_ready();
    let copy_abs = format!("{ROOT}/{COPY}");
    let keys: Vec<String> = models.iter().map(|m| wire::configmap_key(&m.key)).collect();
    let mut owners = BTreeSet::new();
    for key in &keys {
        let artifact = seen.entries[key].config.as_ref().expect("config").artifact.clone();
        assert_eq!(artifact.sha, COMMIT);
        let parent = artifact.parent_path.unwrap();
        assert_eq!(parent.values().collect::<Vec<_>>(), vec![&copy_abs]);
        owners.extend(parent.keys().cloned());
    }
    assert_eq!(owners.len(), 1, "one owner: {owners:?}");
    let owner = owners.into_iter().next().unwrap();
    let children = seen.entries[&owner].config.as_ref().unwrap().artifact.children_paths.clone().unwrap();
    assert_eq!(children.len(), 2, "the owner lists the other two links: {children:?}");
    for key in keys.iter().filter(|k| **k != owner) {
        assert_eq!(seen.entries[key].config.as_ref().unwrap().artifact.children_paths, Some(vec![]));
    }
}

#[test]
fn deleting_models_removes_only_their_links_and_the_last_one_leaves_the_copy_to_the_sweep() {
    let (mut h, mut seen, models) = three_ready();
    let live: Vec<ModelObject> = models[2..].to_vec();
    for m in &models[..2] {
        let e = delete(&mut h, m);
        run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &live);
    }
    assert_eq!(seen.unlinks.len(), 2);
    assert!(seen.trashed.is_empty(), "the copy stays while one model uses it");
    let e = delete(&mut h, &models[2]);
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &[]);
    assert_eq!(seen.unlinks.len(), 3);
    assert!(seen.trashed.is_empty(), "a member never trashes a copy itself");
    // The sweep's snapshot follows within a second; fresh LISTs show nobody; then the trash.
    let e = h.advance(shared::SWEEP_DELAY_MS);
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &[]);
    assert_eq!(seen.trashed, vec![COPY.to_string()]);
}

#[test]
fn a_listed_model_that_may_use_the_copy_keeps_it() {
    let (mut h, mut seen, models) = three_ready();
    for m in &models {
        let e = delete(&mut h, m);
        run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &[]);
    }
    // A new model of the same repo that this agent has not seen yet is in the fresh LIST.
    let newcomer = reuse(&ModelKey::cluster("late"), "l1", "/mnt/models/late");
    let e = h.advance(shared::SWEEP_DELAY_MS);
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), std::slice::from_ref(&newcomer));
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

#[test]
fn switching_to_always_download_unlinks_then_downloads_its_own_copy() {
    let (mut h, mut seen, models) = three_ready();
    let downloads_before = seen.downloads.len();
    let own = obj(&models[0].key, "c1", "hf://org/repo@main", Some("/mnt/models/qwen"));
    let e = h.apply(own);
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &models);
    assert_eq!(seen.unlinks, vec![("qwen".to_string(), COPY.to_string())]);
    let (_, dest, _) = &seen.downloads[downloads_before];
    assert_eq!(dest, "qwen", "its own copy at its path");
    assert!(seen.trashed.is_empty(), "the shared copy stays for the other two");
}

#[test]
fn the_last_user_switching_to_its_own_download_leaves_the_copy_to_the_sweep() {
    let mut h = H::new();
    let models = vec![reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen")];
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &[], &models);
    let own = vec![obj(&models[0].key, "c1", "hf://org/repo@main", Some("/mnt/models/qwen"))];
    let e = h.apply(own[0].clone());
    let owned =
        [copy_marked(&["c1"]), vec![OwnedDir { path: "qwen".into(), uid: Uid::new("c1"), reserved: false }]].concat();
    run(&mut h, e, &mut seen, &owned, &own);
    assert_eq!(seen.unlinks, vec![("qwen".to_string(), COPY.to_string())]);
    assert!(seen.trashed.is_empty());
    // Its marker still names the live uid, but a copy is kept by its users only.
    let e = h.advance(shared::SWEEP_DELAY_MS);
    run(&mut h, e, &mut seen, &owned, &own);
    assert_eq!(seen.trashed, vec![COPY.to_string()]);
    assert_eq!(h.s.shared_copies(), vec![]);
}

#[test]
fn a_path_already_taken_is_never_replaced_and_the_model_downloads_its_own_copy() {
    let mut h = H::new();
    let m = reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen");
    let e = h.start(true, vec![m.clone()]);
    let mut seen = Seen { occupied: ["qwen".to_string()].into(), ..Seen::default() };
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert!(seen.links.is_empty());
    let dests: Vec<&str> = seen.downloads.iter().map(|(_, d, _)| d.as_str()).collect();
    assert_eq!(dests, vec![COPY, "qwen"], "the copy first, then its own once the link was refused");
    assert!(h.notes.iter().any(|n| matches!(n, Note::LinkRefused { .. })));
    assert_eq!(h.view(&m.key, "c1").published, Published::Status { status: ModelStatus::Ready, reason: None });
}

#[test]
fn a_path_inside_the_shared_copies_folder_is_failed() {
    let mut h = H::new();
    let m = obj(&ModelKey::cluster("x"), "x1", "hf://org/repo", Some("/mnt/models/_artifacts/org/repo/abc"));
    let e = h.start(true, vec![m.clone()]);
    let mut seen = Seen::default();
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert!(seen.downloads.is_empty());
    let entry = &seen.entries["clusterbasemodel.x"];
    assert_eq!(entry.status, ModelStatus::Failed);
    assert!(entry.reason.as_deref().unwrap().contains("_artifacts"), "{entry:?}");
}

#[test]
fn two_models_on_one_path_with_one_source_share_it_and_the_last_one_trashes_it() {
    let mut h = H::new();
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", Some("/mnt/models/shared"));
    let e = h.start(true, vec![a.clone(), b.clone()]);
    let mut seen = Seen::default();
    run(&mut h, e, &mut seen, &[], &[a.clone(), b.clone()]);
    assert_eq!(seen.concurrent_max, 1);
    assert_eq!(seen.downloads.len(), 2);
    assert_eq!(seen.downloads[1].2.len(), 1, "the second names the first as co-owner: {:?}", seen.downloads);
    for m in [&a, &b] {
        assert_eq!(
            h.view(&m.key, m.uid.as_str()).published,
            Published::Status { status: ModelStatus::Ready, reason: None }
        );
    }
    let marked = [
        OwnedDir { path: "shared".into(), uid: Uid::new("p1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("d1"), reserved: false },
    ];
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&b));
    assert!(seen.trashed.is_empty(), "decode still uses it");
    let e = delete(&mut h, &b);
    run(&mut h, e, &mut seen, &marked, &[]);
    assert_eq!(seen.trashed, vec!["shared".to_string()]);
}

#[test]
fn a_phantom_delete_of_a_sharing_model_changes_nothing() {
    let (mut h, mut seen, models) = three_ready();
    let e = h.watch(models[1].key.kind, WatchEvent::Deleted(models[1].clone().into()));
    assert!(destructive(&e).is_empty());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(models[1].clone().into()) });
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &models);
    assert!(seen.unlinks.is_empty() && seen.trashed.is_empty());
}

#[test]
fn the_copy_counts_every_model_that_uses_it_and_its_bytes() {
    let (h, _, _) = three_ready();
    assert_eq!(h.s.shared_copies(), vec![CopyUse { path: COPY.into(), references: 3, bytes: 1000 }]);
}

/// Answers every effect as a healthy node would, snapshots showing `owned`, but leaves every
/// download and read unanswered: they are returned for the test to answer.
fn answer_holding_downloads(h: &mut H, mut effects: Vec<Effect>, owned: &[OwnedDir], seen: &mut Seen) -> Vec<Effect> {
    let mut held = Vec::new();
    while !effects.is_empty() {
        let mut next = Vec::new();
        for e in &effects {
            let input = match &e.op {
                Op::Download { .. }
                | Op::LiveGet { .. }
                | Op::LiveGetNode
                | Op::LiveList { .. }
                | Op::CancelDownload { .. } => {
                    held.push(e.clone());
                    continue;
                }
                Op::TrashDir { path, .. } => {
                    seen.trashed.push(path.clone());
                    Input::EffectDone { id: e.id, outcome: Outcome::Done }
                }
                Op::Snapshot => {
                    let snapshot = DriftSnapshot { owned_dirs: owned.to_vec(), ..DriftSnapshot::default() };
                    Input::DriftObserved { id: e.id, snapshot }
                }
                Op::ProbeRoot => Input::RootProbed { id: e.id, probe: RootProbe::healthy(true) },
                Op::Resolve { .. } => {
                    Input::EffectDone { id: e.id, outcome: Outcome::Resolved { commit: COMMIT.into() } }
                }
                _ => Input::EffectDone { id: e.id, outcome: Outcome::Done },
            };
            next.extend(h.input(input));
        }
        effects = next;
    }
    held
}

fn downloads(effects: &[Effect]) -> Vec<(Uid, EffectId)> {
    effects
        .iter()
        .filter_map(|e| if let Op::Download { uid, .. } = &e.op { Some((uid.clone(), e.id)) } else { None })
        .collect()
}

#[test]
fn a_model_leaving_before_its_download_ran_never_trashes_the_path_another_model_uses() {
    // After a restart the marker names both. One downloads (one at a time), and the other
    // moves to other nodes while it waits: it owns the directory, but fetched nothing in this
    // run, so its source is unknown. The directory is the other model's now.
    let mut h = H::new();
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", Some("/mnt/models/shared"));
    let owned = [
        OwnedDir { path: "shared".into(), uid: Uid::new("p1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("d1"), reserved: false },
    ];
    let mut seen = Seen::default();
    let e = h.start(true, vec![a.clone(), b.clone()]);
    let mut held = downloads(&answer_holding_downloads(&mut h, e, &owned, &mut seen));
    // The next drift pass shows both markers to the one waiting.
    let e = h.advance(h.s.config().drift_period_ms * 2);
    held.extend(downloads(&answer_holding_downloads(&mut h, e, &owned, &mut seen)));
    let [(first, download)] = &held[..] else { panic!("one download at a time: {held:?}") };
    let (leaving, stays) = if first.as_str() == "d1" { (&a, &b) } else { (&b, &a) };
    assert_eq!(h.view(&leaving.key, leaving.uid.as_str()).owned_dir.as_deref(), Some("shared"));
    // It no longer matches this node: both witnesses agree, and it is withdrawn.
    let moved = gpu_only(leaving.clone());
    let e = h.apply(moved.clone());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(moved.into()) });
    let e = h.input(Input::NodeRead { id: one_node_get(&e), result: NodeReadResult::Found(node(&[])) });
    answer_holding_downloads(&mut h, e, &owned, &mut seen);
    assert_eq!(h.view(&leaving.key, leaving.uid.as_str()).life, Life::Withdrawn);
    let result = DownloadResult::Done { commit: COMMIT.into(), metadata: None, bytes: 1000 };
    let done = Input::EffectDone { id: *download, outcome: Outcome::Downloaded(DownloadEnd { marked: true, result }) };
    let e = h.input(done);
    answer_holding_downloads(&mut h, e, &owned, &mut seen);
    assert!(seen.trashed.is_empty(), "{} still uses it: {:?}", stays.key, seen.trashed);
    let v = h.view(&stays.key, stays.uid.as_str());
    assert_eq!(v.published, Published::Status { status: ModelStatus::Ready, reason: None });
}

#[test]
fn a_name_recreated_while_its_predecessor_owned_a_shared_path_goes_on_at_once() {
    // `prefill` is placed on other nodes, but the marker here names it too (the snapshot shows
    // it): it owns the path it shares with `decode`, and its placement exit is being read.
    let mut h = H::new();
    let a = gpu_only(obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared")));
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", Some("/mnt/models/shared"));
    let owned = [
        OwnedDir { path: "shared".into(), uid: Uid::new("p1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("d1"), reserved: false },
    ];
    let mut seen = Seen::default();
    let e = h.start(true, vec![a.clone(), b.clone()]);
    let left = answer_holding_downloads(&mut h, e, &owned, &mut seen);
    assert_eq!(h.view(&a.key, "p1").owned_dir.as_deref(), Some("shared"));
    let read = left.iter().find(|e| matches!(&e.op, Op::LiveGet { key } if *key == a.key)).expect("exit read").id;
    // Re-created under the same name, another source at another path, placed here. The read
    // answers with the new uid: the old one leaves the path to `decode` (nothing to trash,
    // nothing published) in the step that lets the new one go on.
    let a2 = obj(&a.key, "p2", "hf://org/other", Some("/mnt/models/other"));
    let e = h.apply(a2.clone());
    let mut reads = vec![read];
    reads.extend(gets(&answer_holding_downloads(&mut h, e, &owned, &mut seen)).into_iter().map(|(id, _)| id));
    let mut left = Vec::new();
    for id in reads {
        let e = h.input(Input::LiveRead { id, result: ReadResult::Found(a2.clone().into()) });
        left.extend(answer_holding_downloads(&mut h, e, &owned, &mut seen));
    }
    assert!(seen.trashed.is_empty(), "decode still uses it: {:?}", seen.trashed);
    let p2 = left.iter().find_map(|e| match &e.op {
        Op::Download { uid, dest, .. } if uid.as_str() == "p2" => dest.beneath_root().map(str::to_string),
        _ => None,
    });
    assert_eq!(p2.as_deref(), Some("other"), "{left:?}");
}

/// `prefill` (p1) and BaseModel `x` (x1, held by ClusterBaseModel `basemodel.x`), both of
/// `hf://org/repo` into `shared`.
fn prefill_and_held() -> (ModelObject, ModelObject, ModelObject) {
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let owner = obj(&ModelKey::cluster("basemodel.x"), "o1", "vendor://nvidia/nim/x", None);
    let held = obj(&ModelKey::namespaced("clusterbasemodel", "x"), "x1", "hf://org/repo", Some("/mnt/models/shared"));
    (a, owner, held)
}

/// `prefill_and_held` started with `marked` as the markers, then `prefill` deleted: x1 owns
/// `shared`, and nothing was trashed. The harness, what it saw, the owner and the held model.
fn prefill_left(marked: &[OwnedDir]) -> (H, Seen, ModelObject, ModelObject) {
    let (a, owner, held) = prefill_and_held();
    let models = vec![a.clone(), owner.clone(), held.clone()];
    let mut h = H::new();
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, marked, &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"));
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, marked, &[owner.clone(), held.clone()]);
    assert!(seen.trashed.is_empty(), "x1's weights are there: {:?}", seen.trashed);
    (h, seen, owner, held)
}

#[test]
fn a_model_whose_keys_another_holds_does_not_keep_a_path_it_never_wrote() {
    // BaseModel `x` in namespace `clusterbasemodel` maps to the keys of ClusterBaseModel
    // `basemodel.x`, which ranks first: `x` writes nothing here, so it does not use the path it
    // names with `prefill`, and the last model that wrote there trashes it.
    let mut h = H::new();
    let (a, owner, held) = prefill_and_held();
    let models = vec![a.clone(), owner.clone(), held.clone()];
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &[], &models);
    assert_eq!(seen.downloads.iter().map(|(uid, _, _)| uid.as_str()).collect::<Vec<_>>(), vec!["p1"]);
    let e = delete(&mut h, &a);
    let marked = [OwnedDir { path: "shared".into(), uid: Uid::new("p1"), reserved: false }];
    run(&mut h, e, &mut seen, &marked, &[owner, held]);
    assert_eq!(seen.trashed, vec!["shared".to_string()]);
}

#[test]
fn a_held_model_the_marker_names_keeps_the_path_when_the_other_member_leaves() {
    // The simulator's swarm, seed 5002019: BaseModel `x` in namespace `clusterbasemodel`
    // downloaded into the shared path before a restart, and now ClusterBaseModel `basemodel.x`,
    // which ranks first, holds its keys. `prefill`, the other member, leaves: x's weights stay
    // (its entry may still say Ready). Once x leaves too, the path goes.
    let marked = ["p1", "x1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let (mut h, mut seen, owner, held) = prefill_left(&marked);
    let e = delete(&mut h, &held);
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&owner));
    assert_eq!(seen.trashed, vec!["shared".to_string()]);
}

#[test]
fn a_re_check_before_the_first_snapshot_keeps_a_held_model_s_uid_in_the_marker() {
    // After a restart `prefill` checks `shared` again before the first snapshot has said that
    // x1, whose keys ClusterBaseModel `basemodel.x` holds, owns it too. Had the marker been
    // rewritten to name p1 alone, the snapshot would take `shared` from x1, and `prefill`
    // leaving would trash x1's weights.
    let (a, owner, held) = prefill_and_held();
    let models = vec![a.clone(), owner.clone(), held.clone()];
    let named: BTreeSet<String> = ["p1", "x1"].map(String::from).into();
    let markers = Some(BTreeMap::from([("shared".to_string(), named.clone())]));
    let mut seen = Seen { markers, snapshots_held: Some(Vec::new()), ..Seen::default() };
    let mut h = H::new();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &[], &models);
    let downloads: Vec<&str> = seen.downloads.iter().map(|(uid, _, _)| uid.as_str()).collect();
    assert_eq!(downloads, vec!["p1"], "the re-check ran before the first snapshot");
    assert_eq!(seen.markers.as_ref().unwrap()["shared"], named);
    let mut e = Vec::new();
    for id in seen.snapshots_held.take().unwrap() {
        e.extend(h.input(Input::DriftObserved { id, snapshot: seen.snapshot(&[]) }));
    }
    run(&mut h, e, &mut seen, &[], &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"));
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], &[owner, held]);
    assert!(seen.trashed.is_empty(), "x1's weights are there: {:?}", seen.trashed);
}

#[test]
fn a_held_model_forgets_a_path_whose_marker_no_longer_names_it() {
    // The simulator's swarm, seed 380: another uid's download took the path a held model had
    // owned, and the held model, a member of it as its owner, kept it from being trashed for good.
    let mut h = H::new();
    let (_, owner, held) = prefill_and_held();
    let models = vec![owner.clone(), held.clone()];
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &[OwnedDir { path: "shared".into(), uid: Uid::new("x1"), reserved: false }], &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"));
    let e = h.advance(h.s.config().drift_period_ms * 2);
    run(&mut h, e, &mut seen, &[OwnedDir { path: "shared".into(), uid: Uid::new("p9"), reserved: false }], &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir, None);
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

#[test]
fn a_scan_that_missed_a_marker_takes_no_directory_from_a_held_model() {
    let (a, owner, held) = prefill_and_held();
    let models = vec![a.clone(), owner.clone(), held.clone()];
    let marked = ["p1", "x1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let mut h = H::new();
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &marked, &models);
    // One snapshot shows no marker at all (the shell's scan could not open the root).
    let e = h.advance(h.s.config().drift_period_ms * 2);
    run(&mut h, e, &mut seen, &[], &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"));
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &marked, &[owner, held]);
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

#[test]
fn a_uid_in_two_markers_owns_the_one_it_would_fetch_into_and_leaves_one_another_took() {
    // A marker names a uid until a download rewrites it: x1 is also named in `aaa`, a directory
    // it used once. It owns `shared`, where it would fetch; once p9 took `shared`, it owns none
    // of it.
    // In the shell's order (sorted by path): `aaa` comes first.
    let mut marked = vec![OwnedDir { path: "aaa".into(), uid: Uid::new("x1"), reserved: false }];
    marked.extend(["p1", "x1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false }));
    let (mut h, mut seen, owner, held) = prefill_left(&marked);
    let e = h.advance(h.s.config().drift_period_ms * 2);
    let later = [
        OwnedDir { path: "aaa".into(), uid: Uid::new("x1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("p9"), reserved: false },
    ];
    run(&mut h, e, &mut seen, &later, &[owner, held.clone()]);
    assert_ne!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"), "still owns the path p9 took");
}

#[test]
fn an_older_uid_a_stale_list_brings_back_never_trashes_the_path_its_successor_downloaded() {
    // After a restart `m` (uid n1) downloaded into its path, which the marker says it shares
    // with its predecessor o1 (same source, same path). A stale list shows o1 again: the live
    // read confirms it replaced, and its cleanup must leave n1's directory alone.
    let mut h = H::new();
    let old = obj(&ModelKey::cluster("m"), "o1", "hf://org/repo", Some("/mnt/models/m"));
    let new = obj(&ModelKey::cluster("m"), "n1", "hf://org/repo", Some("/mnt/models/m"));
    let owned = [
        OwnedDir { path: "m".into(), uid: Uid::new("o1"), reserved: false },
        OwnedDir { path: "m".into(), uid: Uid::new("n1"), reserved: false },
    ];
    let mut seen = Seen::default();
    let e = h.start(true, vec![new.clone()]);
    run(&mut h, e, &mut seen, &owned, std::slice::from_ref(&new));
    assert_eq!(seen.downloads, vec![("n1".to_string(), "m".to_string(), vec!["o1".to_string()])]);
    let mut e = h.watch(Kind::ClusterBaseModel, WatchEvent::RelistStarted);
    e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistItem(old.clone().into())));
    e.extend(h.watch(Kind::ClusterBaseModel, WatchEvent::RelistDone));
    let mut left = answer_holding_downloads(&mut h, e, &owned, &mut seen);
    // The read goes unanswered past a drift pass, whose snapshot shows o1's marker too.
    let e = h.advance(h.s.config().drift_period_ms * 2);
    left.extend(answer_holding_downloads(&mut h, e, &owned, &mut seen));
    assert_eq!(h.view(&old.key, "o1").owned_dir.as_deref(), Some("m"));
    // Every read of `m` now finds n1.
    for _ in 0..20 {
        for (id, _) in gets(&std::mem::take(&mut left)) {
            let e = h.input(Input::LiveRead { id, result: ReadResult::Found(new.clone().into()) });
            left.extend(answer_holding_downloads(&mut h, e, &owned, &mut seen));
        }
        let e = h.advance(30_000);
        left.extend(answer_holding_downloads(&mut h, e, &owned, &mut seen));
    }
    assert!(seen.trashed.is_empty(), "n1 downloaded there: {:?}", seen.trashed);
    assert_eq!(h.view(&new.key, "n1").published, Published::Status { status: ModelStatus::Ready, reason: None });
}

#[test]
fn a_model_being_deleted_does_not_keep_the_copy() {
    let mut h = H::new();
    let m = reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen");
    let mut seen = Seen::default();
    let e = h.start(true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    // Deleted, with a finalizer still held: the fresh LISTs show it, being deleted.
    let going = deleting(m.clone());
    let e = h.apply(going.clone());
    run(&mut h, e, &mut seen, &copy_marked(&["c1"]), std::slice::from_ref(&going));
    let e = h.advance(shared::SWEEP_DELAY_MS);
    run(&mut h, e, &mut seen, &copy_marked(&["c1"]), std::slice::from_ref(&going));
    assert_eq!(seen.unlinks, vec![("qwen".to_string(), COPY.to_string())]);
    assert_eq!(seen.trashed, vec![COPY.to_string()]);
}

#[test]
fn a_model_moved_away_from_a_copy_others_use_asks_for_no_snapshot_after_each_one() {
    let (mut h, mut seen, models) = three_ready();
    let marked = copy_marked(&["c1", "a1", "b1"]);
    let moved = gpu_only(models[1].clone());
    let e = h.apply(moved.clone());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(moved.clone().into()) });
    let e = h.input(Input::NodeRead { id: one_node_get(&e), result: NodeReadResult::Found(node(&[])) });
    let listed = vec![models[0].clone(), moved, models[2].clone()];
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(seen.unlinks, vec![("a/qwen".to_string(), COPY.to_string())]);
    // Each snapshot shows the marker naming a1 too; the two others still use the copy.
    let mut snapshots = 0;
    for _ in 0..60 {
        let e = h.advance(1_000);
        snapshots += e.iter().filter(|e| e.op == Op::Snapshot).count();
        run(&mut h, e, &mut seen, &marked, &listed);
    }
    assert!(snapshots <= 1, "{snapshots} snapshots in a minute");
    assert!(seen.trashed.is_empty());
}

#[test]
fn a_model_back_on_a_node_that_trashed_its_directory_downloads_again() {
    let mut h = H::new();
    let m = gpu_only(obj(&ModelKey::cluster("m"), "u1", "hf://org/repo", Some("/mnt/models/m")));
    let (gpu, cpu) = gpu_and_cpu();
    let mut seen = Seen::default();
    let e = h.start_on(gpu.clone(), true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert_eq!(seen.downloads.len(), 1);
    // The node loses its gpu label: both witnesses agree, the directory goes to the trash.
    let e = leave_node(&mut h, &m, cpu);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert_eq!(seen.trashed, vec!["m".to_string()]);
    // Back: its weights are gone, so it is Updating and downloads them again before Ready.
    let e = h.input(Input::NodeObserved(gpu));
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert_eq!(seen.downloads.len(), 2, "{:?}", seen.downloads);
}

/// Answer the LISTs among `left` with `m` alone (and what follows, holding downloads and reads).
fn answer_lists(h: &mut H, left: &mut Vec<Effect>, m: &ModelObject, owned: &[OwnedDir], seen: &mut Seen) {
    while !lists(left).is_empty() {
        for (id, kind) in lists(&std::mem::take(left)) {
            let listed = if kind == m.key.kind { vec![Arc::new(m.clone())] } else { vec![] };
            let e = h.input(Input::LiveList { id, result: ListResult::Listed(listed) });
            left.extend(answer_holding_downloads(h, e, owned, seen));
        }
    }
}

#[test]
fn the_sweep_never_trashes_a_copy_while_a_cancelled_download_into_it_still_runs() {
    let mut h = H::new();
    let m = gpu_only(reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen"));
    let cpu = node(&[("zone", "a"), ("os", "linux")]);
    let mut seen = Seen::default();
    let e = h.start_on(node(&[("gpu", "h100"), ("zone", "a"), ("os", "linux")]), true, vec![m.clone()]);
    let marked = copy_marked(&["c1"]);
    let mut left = answer_holding_downloads(&mut h, e, &marked, &mut seen);
    let download = downloads(&left);
    assert_eq!(download.len(), 1);
    answer_lists(&mut h, &mut left, &m, &marked, &mut seen);
    // The node loses its gpu label mid-download: withdrawn, the download is cancelled, and the
    // copy has no user left. The sweep follows, while the download has not stopped yet.
    let e = leave_node(&mut h, &m, cpu);
    let mut left = answer_holding_downloads(&mut h, e, &marked, &mut seen);
    assert!(left.iter().any(|e| matches!(e.op, Op::CancelDownload { .. })));
    for _ in 0..5 {
        let e = h.advance(shared::SWEEP_DELAY_MS);
        left.extend(answer_holding_downloads(&mut h, e, &marked, &mut seen));
        answer_lists(&mut h, &mut left, &m, &marked, &mut seen);
    }
    assert!(seen.trashed.is_empty(), "trashed while the download runs: {:?}", seen.trashed);
    // Once it stopped, the copy goes.
    let end = DownloadEnd { marked: true, result: DownloadResult::Cancelled };
    let e = h.input(Input::EffectDone { id: download[0].1, outcome: Outcome::Downloaded(end) });
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&m));
    let e = h.advance(shared::SWEEP_DELAY_MS);
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&m));
    assert_eq!(seen.trashed, vec![COPY.to_string()]);
}

#[test]
fn a_model_joining_a_path_being_trashed_downloads_only_once_the_trash_landed() {
    let mut h = H::new();
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", Some("/mnt/models/shared"));
    let mut seen = Seen::default();
    let e = h.start(true, vec![a.clone()]);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    // `prefill` is deleted: its directory goes to the trash. `decode` arrives meanwhile.
    let mut pending = delete(&mut h, &a);
    let mut trash = None;
    let mut held = Vec::new();
    let mut joined = false;
    while !pending.is_empty() || !joined {
        if pending.is_empty() {
            joined = true;
            pending = h.apply(b.clone());
        }
        let mut next = Vec::new();
        for e in std::mem::take(&mut pending) {
            match &e.op {
                Op::TrashDir { .. } => trash = Some(e.id),
                Op::Download { .. } => held.push(e.clone()),
                Op::Publish { .. } | Op::Unpublish { .. } => {
                    next.extend(h.input(Input::EffectDone { id: e.id, outcome: Outcome::Done }));
                }
                _ => {}
            }
        }
        pending = next;
    }
    let trash = trash.expect("prefill's directory is trashed");
    assert!(held.is_empty(), "a download into a directory being trashed: {held:?}");
    let e = h.input(Input::EffectDone { id: trash, outcome: Outcome::Done });
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&b));
    assert_eq!(seen.downloads.last().map(|(uid, dest, _)| (uid.as_str(), dest.as_str())), Some(("d1", "shared")));
}

#[test]
fn a_copy_whose_marker_names_a_model_another_holds_is_shared_with_it() {
    // BaseModel clusterbasemodel/x fetched the copy before ClusterBaseModel basemodel.x, which
    // ranks first for the same keys, came: it writes nothing now, but it owns the copy (the
    // marker names it). The copy's path names what is in it, so qwen shares it.
    let mut h = H::new();
    let owner = obj(&ModelKey::cluster("basemodel.x"), "o1", "vendor://nvidia/nim/x", None);
    let held = reuse(&ModelKey::namespaced("clusterbasemodel", "x"), "x1", "/mnt/models/x");
    let q = reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen");
    let models = vec![owner, held, q];
    let mut seen = Seen::default();
    let e = h.start(true, models.clone());
    run(&mut h, e, &mut seen, &copy_marked(&["x1"]), &models);
    let (uid, dest, co) = seen.downloads.last().expect("qwen downloads").clone();
    assert_eq!((uid.as_str(), dest.as_str()), ("c1", COPY));
    assert!(co.contains(&"x1".to_string()), "the marker names x1: {co:?}");
}

#[test]
fn a_name_re_created_with_its_own_download_at_its_path_waits_for_the_old_link_to_go() {
    // After SIGTERM no link is removed; the new uid must not download into the old one's link.
    let mut h = H::new();
    let m = reuse(&ModelKey::cluster("qwen"), "c1", "/mnt/models/qwen");
    let mut seen = Seen::default();
    let e = h.start(true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&m));
    assert_eq!(seen.links, vec![("qwen".to_string(), COPY.to_string())]);
    h.input(Input::Shutdown);
    let own = obj(&m.key, "c2", "hf://org/repo@main", Some("/mnt/models/qwen"));
    let e = h.apply(own.clone());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(own.clone().into()) });
    run(&mut h, e, &mut seen, &copy_marked(&["c1"]), std::slice::from_ref(&own));
    assert!(seen.unlinks.is_empty(), "no removal after SIGTERM");
    assert!(!seen.downloads.iter().any(|(uid, dest, _)| uid == "c2" && dest == "qwen"), "{:?}", seen.downloads);
}

#[test]
fn a_co_owner_whose_source_changed_never_downloads_over_the_other_s_files() {
    // Two models share a path with one source; one's storage URI changes. Its download would
    // be accepted (the marker names it) and write another source's files under the other,
    // still Ready: it is Failed instead, until the other no longer uses the path.
    let mut h = H::new();
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/repo", Some("/mnt/models/shared"));
    let marked = ["p1", "d1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let e = h.start(true, vec![a.clone(), b.clone()]);
    let mut seen = Seen::default();
    run(&mut h, e, &mut seen, &marked, &[a.clone(), b.clone()]);
    let before = seen.downloads.len();
    let moved = obj(&ModelKey::cluster("decode"), "d1", "hf://org/other", Some("/mnt/models/shared"));
    let e = h.apply(moved.clone());
    let statuses: Vec<ModelStatus> = e
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { uid, label: Some(status), .. } if uid.as_str() == "d1" => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(statuses, vec![ModelStatus::Failed], "no Updating before it: {e:?}");
    run(&mut h, e, &mut seen, &marked, &[a.clone(), moved.clone()]);
    assert_eq!(seen.downloads.len(), before, "nothing fetched over prefill's files: {:?}", seen.downloads);
    let ready = Published::Status { status: ModelStatus::Ready, reason: None };
    assert_eq!(h.view(&a.key, "p1").published, ready);
    match h.view(&moved.key, "d1").published {
        Published::Status { status: ModelStatus::Failed, reason: Some(reason) } => {
            let named = ["/mnt/models/shared", "ClusterBaseModel/prefill", "hf://org/repo", "hf://org/other"];
            assert!(named.iter().all(|n| reason.contains(n)), "{reason}")
        }
        other => panic!("decode should be Failed with a reason: {other:?}"),
    }
    // Once prefill leaves (and its files with it), decode downloads its own source there.
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&moved));
    assert_eq!(seen.trashed, vec!["shared".to_string()]);
    assert_eq!(
        seen.downloads[before..].iter().map(|d| (d.0.as_str(), d.1.as_str())).collect::<Vec<_>>(),
        vec![("d1", "shared")]
    );
    assert_eq!(h.view(&moved.key, "d1").published, ready);
}

#[test]
fn a_download_sent_after_the_first_snapshot_names_the_live_models_of_another_source_there() {
    // After a restart: prefill (p1) and decode (d1) shared `shared` with hf://org/repo, both
    // Ready; decode's URI changed to hf://org/other while the agent was down. Here the first
    // snapshot answers before the Node view arrives (downloads wait for it, the snapshot not),
    // so the first download goes out with `keep_marked` off (review of fc24fda).
    let mut h = H::new();
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", Some("/mnt/models/shared"));
    let moved = obj(&ModelKey::cluster("decode"), "d1", "hf://org/other", Some("/mnt/models/shared"));
    let mut out = Vec::new();
    for kind in Kind::ALL {
        out.extend(h.watch(kind, WatchEvent::RelistStarted));
        for o in [&a, &moved].into_iter().filter(|o| o.key.kind == kind) {
            out.extend(h.watch(kind, WatchEvent::RelistItem(o.clone().into())));
        }
        out.extend(h.watch(kind, WatchEvent::RelistDone));
    }
    let marked: Vec<OwnedDir> =
        ["p1", "d1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false }).to_vec();
    let mut later = Vec::new();
    let label_keys = [a.key.clone(), moved.key.clone()].map(|k| wire::label_key(&k));
    let ready: BTreeMap<Arc<str>, Arc<str>> =
        label_keys.iter().map(|k| (Arc::from(k.as_str()), Arc::from("Ready"))).collect();
    for e in &out {
        match &e.op {
            Op::Snapshot => later.extend(h.input(Input::DriftObserved {
                id: e.id,
                snapshot: DriftSnapshot {
                    owned_dirs: marked.clone(),
                    labels: ready.clone(),
                    ..DriftSnapshot::default()
                },
            })),
            Op::ProbeRoot => later.extend(h.input(Input::RootProbed { id: e.id, probe: RootProbe::healthy(true) })),
            _ => {}
        }
    }
    assert!(!out.iter().chain(&later).any(|e| matches!(e.op, Op::Download { .. })), "no Node view yet");
    let labels = [a.key.clone(), moved.key.clone()].map(|k| wire::label_key(&k));
    let mut e = h.input(Input::NodeObserved(node(&[(&labels[0], "Ready"), (&labels[1], "Ready")])));
    let mut all = Vec::new();
    for _ in 0..20 {
        if e.iter().any(|e| matches!(e.op, Op::Download { .. })) {
            all.extend(e);
            break;
        }
        let mut next = Vec::new();
        for x in &e {
            match &x.op {
                Op::LiveGet { .. } | Op::LiveGetNode | Op::LiveList { .. } => {}
                Op::ProbeRoot => next.extend(h.input(Input::RootProbed { id: x.id, probe: RootProbe::healthy(true) })),
                _ => next.extend(h.input(Input::EffectDone { id: x.id, outcome: Outcome::Done })),
            }
        }
        all.extend(e);
        e = next;
    }
    // Nothing in this run has shown prefill's files there (its own check comes after), so the
    // core's rule cannot hold decode back: the download names prefill, and the shell, which
    // reads the manifest, refuses to replace files of another source for it.
    assert_eq!(download_owners(&all), vec![("d1".to_string(), Vec::<String>::new(), false, vec!["p1".to_string()])]);
}

/// Each download's (uid, co_owners, keep_marked, other_source).
fn download_owners(effects: &[Effect]) -> Vec<(String, Vec<String>, bool, Vec<String>)> {
    let names = |uids: &[Uid]| uids.iter().map(|u| u.to_string()).collect();
    let owners = |e: &Effect| match &e.op {
        Op::Download { uid, co_owners, keep_marked, other_source, .. } => {
            Some((uid.to_string(), names(co_owners), *keep_marked, names(other_source)))
        }
        _ => None,
    };
    effects.iter().filter_map(owners).collect()
}

#[test]
fn a_member_leaving_never_trashes_files_another_source_downloaded_there_since() {
    // Swarm seeds 56 and 200000144: prefill held org/repo at the path; decode (org/other) was
    // Failed for it. Prefill moves to org/other: decode downloads it there with prefill as a
    // co-owner and is Ready. Prefill is deleted before its own download: it last fetched
    // org/repo, so decode did not count as sharing, and its leave trashed decode's files.
    let mut h = H::new();
    let path = Some("/mnt/models/shared");
    let a = obj(&ModelKey::cluster("prefill"), "p1", "hf://org/repo", path);
    let b = obj(&ModelKey::cluster("decode"), "d1", "hf://org/other", path);
    let marked = ["p1", "d1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let mut seen = Seen::default();
    let e = h.start(true, vec![a.clone()]);
    run(&mut h, e, &mut seen, &marked[..1], std::slice::from_ref(&a));
    let e = h.apply(b.clone());
    run(&mut h, e, &mut seen, &marked[..1], &[a.clone(), b.clone()]);
    assert!(matches!(h.view(&b.key, "d1").published, Published::Status { status: ModelStatus::Failed, .. }));
    let moved = obj(&a.key, "p1", "hf://org/other", path);
    let e = h.apply(moved.clone());
    let download = |e: &[Effect], who: &str| {
        e.iter().find(|e| matches!(&e.op, Op::Download { uid, .. } if uid.as_str() == who)).map(|e| e.id)
    };
    let mut pending = e;
    let mut decode_download = None;
    for _ in 0..20 {
        decode_download = decode_download.or(download(&pending, "d1"));
        let mut next = Vec::new();
        for e in &pending {
            if matches!(e.op, Op::Publish { .. }) {
                next.extend(h.input(Input::EffectDone { id: e.id, outcome: Outcome::Done }));
            }
        }
        pending = next;
    }
    let decode_download = decode_download.expect("decode downloads its source with prefill as a co-owner");
    let mut e = delete(&mut h, &moved);
    let result = DownloadResult::Done { commit: COMMIT.into(), metadata: None, bytes: 1000 };
    let outcome = Outcome::Downloaded(DownloadEnd { marked: true, result });
    e.extend(h.input(Input::EffectDone { id: decode_download, outcome }));
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&b));
    assert_eq!(seen.trashed, Vec::<String>::new(), "decode's files stay");
    let ready = Published::Status { status: ModelStatus::Ready, reason: None };
    assert_eq!(h.view(&b.key, "d1").published, ready);
}

/// Swarm seed 120008971: `a` shares a path with `b` (one source, the marker names both). The
/// Node loses the label `a` needs: both witnesses agree, `a` is withdrawn and leaves the
/// directory to `b`. Later the label comes back, but the Node watch has not delivered it yet,
/// and `b` is deleted. `a`'s weights may be needed again: the directory is trashed only after a
/// Node read sent after `b` left shows that `a` is still not placed here.
#[test]
fn a_co_owner_leaving_never_trashes_a_withdrawn_co_owner_s_weights_on_an_old_witness() {
    let mut h = H::new();
    let (a, b) = pair_at_shared();
    let (gpu, cpu) = gpu_and_cpu();
    let both = [a.clone(), b.clone()];
    let marked = [
        OwnedDir { path: "shared".into(), uid: Uid::new("a1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("b1"), reserved: false },
    ];
    let mut seen = Seen::default();
    let e = h.start_on(gpu.clone(), true, both.to_vec());
    run(&mut h, e, &mut seen, &marked, &both);
    assert_eq!(seen.downloads.len(), 2, "{:?}", seen.downloads);
    // The gpu label goes: both witnesses agree, `a` is withdrawn, `b` keeps the directory.
    let e = leave_node(&mut h, &a, cpu);
    run(&mut h, e, &mut seen, &marked, &both);
    assert_eq!(h.view(&a.key, "a1").life, Life::Withdrawn);
    assert!(seen.trashed.is_empty(), "b still uses it");
    // A minute later the label is back on the Node (its watch lags) and `b` is deleted.
    h.advance(60_000);
    let e = delete(&mut h, &b);
    let mut left = Vec::new();
    let mut e = e;
    // Complete what `b`'s cleanup asks, leaving any read for the test.
    for _ in 0..10 {
        let mut next = Vec::new();
        for x in std::mem::take(&mut e) {
            match &x.op {
                Op::TrashDir { path, .. } => {
                    seen.trashed.push(path.clone());
                    next.extend(h.input(Input::EffectDone { id: x.id, outcome: Outcome::Done }));
                }
                Op::LiveGet { .. } | Op::LiveGetNode | Op::LiveList { .. } | Op::Snapshot => left.push(x),
                _ => next.extend(h.input(Input::EffectDone { id: x.id, outcome: Outcome::Done })),
            }
        }
        e = next;
    }
    assert!(
        seen.trashed.is_empty(),
        "trashed on the witness of a minute ago: {:?} (reads asked: {left:?})",
        seen.trashed
    );
    // The fresh Node read places `a` again: its weights stay.
    if let Some(id) = left.iter().find(|x| x.op == Op::LiveGetNode).map(|x| x.id) {
        let e = h.input(Input::NodeRead { id, result: NodeReadResult::Found(gpu) });
        run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&a));
    }
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

#[test]
fn a_withdrawn_co_owner_returning_after_the_other_trashed_the_directory_downloads_again() {
    // `a` and `b` share a path with one source. `a` leaves the node (its label goes) and
    // releases the directory to `b`; `b` is then deleted and trashes it. `a`, placed here again,
    // must not be Ready on files that are gone: it downloads them again first.
    let mut h = H::new();
    let (a, b) = pair_at_shared();
    let (gpu, cpu) = gpu_and_cpu();
    let both = [a.clone(), b.clone()];
    let marked = ["a1", "b1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let mut seen = Seen::default();
    let e = h.start_on(gpu.clone(), true, both.to_vec());
    run(&mut h, e, &mut seen, &marked, &both);
    assert_eq!(seen.downloads.len(), 2, "{:?}", seen.downloads);
    let e = leave_node(&mut h, &a, cpu);
    run(&mut h, e, &mut seen, &marked, &both);
    assert_eq!(h.view(&a.key, "a1").life, Life::Withdrawn);
    assert!(seen.trashed.is_empty(), "b still uses it");
    let e = delete(&mut h, &b);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    assert_eq!(seen.trashed, vec!["shared".to_string()], "b, the last one there, trashes it");
    // `a` is placed here again: Updating, a download, and only then Ready.
    let downloads = seen.downloads.len();
    let e = h.input(Input::NodeObserved(gpu));
    let published: Vec<ModelStatus> = e
        .iter()
        .filter_map(|e| match &e.op {
            Op::Publish { uid, label: Some(status), .. } if uid.as_str() == "a1" => Some(*status),
            _ => None,
        })
        .collect();
    assert_ne!(published.first(), Some(&ModelStatus::Ready), "Ready on trashed files: {e:?}");
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    assert_eq!(seen.downloads.len(), downloads + 1, "{:?}", seen.downloads);
    let ready = Published::Status { status: ModelStatus::Ready, reason: None };
    assert_eq!(h.view(&a.key, "a1").published, ready);
}

#[test]
fn a_withdrawn_co_owner_returning_after_another_source_took_the_directory_is_not_ready_on_its_files() {
    // `a` and `c` share a path with one source; `b` names the same path with another and is
    // Failed while they hold it. `a` leaves the node and releases the directory to `c`; `c` is
    // deleted and trashes it; `b` downloads its own source there. `a`, placed here again, is
    // never Ready on `b`'s files.
    let mut h = H::new();
    let a = gpu_only(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", Some("/mnt/models/shared")));
    let b = obj(&ModelKey::cluster("b"), "b1", "hf://org/other", Some("/mnt/models/shared"));
    let c = obj(&ModelKey::cluster("c"), "c1", "hf://org/repo", Some("/mnt/models/shared"));
    let (gpu, cpu) = gpu_and_cpu();
    let all = [a.clone(), b.clone(), c.clone()];
    let mut seen = Seen { markers: Some(BTreeMap::new()), ..Seen::default() };
    let e = h.start_on(gpu.clone(), true, all.to_vec());
    run(&mut h, e, &mut seen, &[], &all);
    let uids = |seen: &Seen| seen.downloads.iter().map(|d| d.0.clone()).collect::<Vec<_>>();
    assert_eq!(uids(&seen), ["a1", "c1"]);
    let e = leave_node(&mut h, &a, cpu);
    run(&mut h, e, &mut seen, &[], &all);
    assert_eq!(h.view(&a.key, "a1").life, Life::Withdrawn);
    let e = delete(&mut h, &c);
    run(&mut h, e, &mut seen, &[], &[a.clone(), b.clone()]);
    assert_eq!(seen.trashed, vec!["shared".to_string()]);
    assert_eq!(uids(&seen), ["a1", "c1", "b1"], "b downloads its source once the path is free");
    let e = h.input(Input::NodeObserved(gpu));
    run(&mut h, e, &mut seen, &[], &[a.clone(), b.clone()]);
    assert_eq!(uids(&seen), ["a1", "c1", "b1"], "nothing over b's files");
    match h.view(&a.key, "a1").published {
        Published::Status { status: ModelStatus::Failed, .. } => {}
        other => panic!("a must be Failed while b holds the path: {other:?}"),
    }
}

#[test]
fn the_sweep_never_trashes_a_copy_a_model_placed_again_may_use_on_an_old_node_view() {
    // `m` uses the node's copy; the node loses the label `m` selects, both witnesses agree, and
    // `m` is withdrawn, leaving the copy to the sweep. The label comes back, but its watch event
    // lags: the sweep's LISTs show `m` alive while the core's Node view does not place it. The
    // copy stays once a live read of the Node, sent for the sweep, places `m` again.
    let mut h = H::new();
    let m = gpu_only(reuse(&ModelKey::cluster("m"), "u1", "/mnt/models/m"));
    let (gpu, cpu) = gpu_and_cpu();
    let marked = copy_marked(&["u1"]);
    let listed = [m.clone()];
    let mut seen = Seen::default();
    let e = h.start_on(gpu.clone(), true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(seen.links.len(), 1, "{:?}", seen.links);
    let e = leave_node(&mut h, &m, cpu.clone());
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(h.view(&m.key, "u1").life, Life::Withdrawn);
    assert_eq!(seen.unlinks.len(), 1);
    // The sweep: its snapshot shows the copy, its LISTs show `m`, and the Node (read live, as
    // the API server serves it now) carries the label again.
    let mut e = h.advance(shared::SWEEP_DELAY_MS);
    let mut node_reads = 0;
    for _ in 0..50 {
        let mut next = Vec::new();
        for x in std::mem::take(&mut e) {
            let input = match &x.op {
                Op::LiveGetNode => {
                    node_reads += 1;
                    // While the read is out, the watch repeats the old view (it lags): the
                    // read's answer is the newer evidence all the same.
                    next.extend(h.input(Input::NodeObserved(cpu.clone())));
                    Some(Input::NodeRead { id: x.id, result: NodeReadResult::Found(gpu.clone()) })
                }
                _ => answer(&h, &x, &mut seen, (&marked, &listed), &mut Vec::new()),
            };
            next.extend(input.map(|i| h.input(i)).unwrap_or_default());
        }
        e = next;
    }
    assert!(seen.trashed.is_empty(), "the copy `m` uses trashed on an old Node view: {:?}", seen.trashed);
    assert!(node_reads >= 1, "the sweep asked for no live read of the Node");
}

/// Reserved `a` (gpu only) and `b` share `shared`, Ready on the gpu node; `a` leaves it, then
/// `b` is deleted (it releases the directory to `a`). The harness and `a`.
fn reserved_a_away_and_b_deleted(seen: &mut Seen, marked: &[OwnedDir]) -> (H, ModelObject) {
    let mut h = H::new();
    let (a, b) = pair_at_shared();
    let a = reserved(a);
    let (gpu, cpu) = gpu_and_cpu();
    let both = [a.clone(), b.clone()];
    let e = h.start_on(gpu, true, both.to_vec());
    run(&mut h, e, seen, marked, &both);
    let e = leave_node(&mut h, &a, cpu);
    run(&mut h, e, seen, marked, &both);
    assert_eq!(h.view(&a.key, "a1").life, Life::Withdrawn);
    let e = delete(&mut h, &b);
    run(&mut h, e, seen, marked, std::slice::from_ref(&a));
    (h, a)
}

#[test]
fn a_reserved_model_that_leaves_keeps_its_directory_when_a_co_owner_is_deleted() {
    // `a` carries the reserve label: its weights stay on the node when it goes. It leaves the
    // node while `b` shares its path; `b` is then deleted. `b` releases the directory to `a`
    // rather than trashing it.
    let marked = ["a1", "b1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let mut seen = Seen::default();
    let (mut h, a) = reserved_a_away_and_b_deleted(&mut seen, &marked);
    assert!(seen.trashed.is_empty(), "a reserved model's weights trashed: {:?}", seen.trashed);
    // `a` is deleted while away from the node: it gives the directory up, so that no sweep
    // takes it for an orphan's once `a` is forgotten.
    assert!(seen.disowned.is_empty(), "given up while `a` lives: {:?}", seen.disowned);
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &marked[1..], &[]);
    assert_eq!(seen.disowned, vec![("a1".to_string(), "shared".to_string())]);
    assert!(seen.trashed.is_empty(), "a reserved model's weights trashed: {:?}", seen.trashed);
    assert_eq!(h.s.model_count(), 0);
}

#[test]
fn a_model_withdrawn_from_a_copy_the_sweep_keeps_asks_for_no_snapshot_each_second() {
    // `m` leaves the node and the copy it used has no other member; the sweep keeps the copy,
    // which a listed model placed here may use. Each snapshot shows the marker naming `m`: it
    // must not take the copy again, release it and ask for the sweep again, a second later.
    let mut h = H::new();
    let m = gpu_only(reuse(&ModelKey::cluster("m"), "u1", "/mnt/models/m"));
    let newcomer = reuse(&ModelKey::cluster("late"), "l1", "/mnt/models/late");
    let (gpu, cpu) = gpu_and_cpu();
    let marked = copy_marked(&["u1"]);
    let mut seen = Seen::default();
    let e = h.start_on(gpu, true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &marked, std::slice::from_ref(&m));
    let e = leave_node(&mut h, &m, cpu);
    let listed = [m.clone(), newcomer];
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(h.view(&m.key, "u1").life, Life::Withdrawn);
    let mut snapshots = 0;
    for _ in 0..30 {
        let e = h.advance(1_000);
        snapshots += e.iter().filter(|e| e.op == Op::Snapshot).count();
        run(&mut h, e, &mut seen, &marked, &listed);
    }
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
    assert!(snapshots <= 1, "{snapshots} snapshots in 30 s");
}

/// Swarm seed 7003956: the sweep's first live read of the Node timed out and its retry came
/// 14 s after the LISTs, which no longer showed a change of a model that may use the copy (its
/// nodeSelector removed meanwhile). Copies parked for a witness are decided on the read sent
/// for them or not at all: on a failed one they wait for the next sweep, with fresh LISTs.
#[test]
fn a_copy_parked_for_a_node_witness_is_not_decided_on_a_retried_read() {
    let mut h = H::new();
    let m = gpu_only(reuse(&ModelKey::cluster("m"), "u1", "/mnt/models/m"));
    let (gpu, cpu) = gpu_and_cpu();
    let marked = copy_marked(&["u1"]);
    let listed = [m.clone()];
    let mut seen = Seen::default();
    let e = h.start_on(gpu, true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &marked, &listed);
    let e = leave_node(&mut h, &m, cpu.clone());
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(h.view(&m.key, "u1").life, Life::Withdrawn);
    let (mut node_reads, mut e) = (0, h.advance(shared::SWEEP_DELAY_MS));
    for _ in 0..20 {
        for _ in 0..50 {
            let mut next = Vec::new();
            for x in std::mem::take(&mut e) {
                let input = match &x.op {
                    Op::LiveGetNode => {
                        node_reads += 1;
                        let result = match node_reads {
                            1 => NodeReadResult::Failed("timed out".into()),
                            _ => NodeReadResult::Found(cpu.clone()),
                        };
                        Some(Input::NodeRead { id: x.id, result })
                    }
                    _ => answer(&h, &x, &mut seen, (&marked, &listed), &mut Vec::new()),
                };
                next.extend(input.map(|i| h.input(i)).unwrap_or_default());
            }
            e = next;
        }
        e = h.advance(1_000);
    }
    assert!(node_reads >= 2, "the read was tried again ({node_reads})");
    assert!(seen.trashed.is_empty(), "trashed on a retried witness, on old LISTs: {:?}", seen.trashed);
}

#[test]
fn a_copy_waiting_for_a_node_witness_holds_back_no_other_orphan() {
    // As above, but the live reads of the Node fail: the copy waits, and an orphan label the
    // same sweep found (a model no one knows) is removed meanwhile.
    let mut h = H::new();
    let m = gpu_only(reuse(&ModelKey::cluster("m"), "u1", "/mnt/models/m"));
    let (gpu, cpu) = gpu_and_cpu();
    let marked = copy_marked(&["u1"]);
    let listed = [m.clone()];
    let mut seen = Seen::default();
    let e = h.start_on(gpu, true, vec![m.clone()]);
    run(&mut h, e, &mut seen, &marked, &listed);
    let e = leave_node(&mut h, &m, cpu);
    run(&mut h, e, &mut seen, &marked, &listed);
    assert_eq!(h.view(&m.key, "u1").life, Life::Withdrawn);
    let ghost: Arc<str> = Arc::from("models.ome.io/clusterbasemodel.ghost");
    let mut snapshot = seen.snapshot(&marked);
    snapshot.labels.insert(ghost.clone(), Arc::from("Ready"));
    let mut e = h.advance(shared::SWEEP_DELAY_MS);
    let mut removed = Vec::new();
    for _ in 0..50 {
        let mut next = Vec::new();
        for x in std::mem::take(&mut e) {
            let input = match &x.op {
                Op::Snapshot => Some(Input::DriftObserved { id: x.id, snapshot: snapshot.clone() }),
                Op::LiveGetNode => Some(Input::NodeRead { id: x.id, result: NodeReadResult::Failed("503".into()) }),
                Op::RemoveOrphanLabel { label_key } => {
                    removed.push(label_key.clone());
                    Some(Input::EffectDone { id: x.id, outcome: Outcome::Done })
                }
                _ => answer(&h, &x, &mut seen, (&marked, &listed), &mut Vec::new()),
            };
            next.extend(input.map(|i| h.input(i)).unwrap_or_default());
        }
        e = next;
    }
    assert!(seen.trashed.is_empty(), "trashed without a Node witness: {:?}", seen.trashed);
    assert_eq!(removed, vec![ghost.to_string()], "the orphan label waits for nothing");
}

// ---- Reserved models' directories (found by a review of the disown) ---------------------------

#[test]
fn the_sweep_after_a_disown_spares_a_directory_still_naming_a_released_co_owner() {
    // Reserved `a` and `b` share a path; `a` leaves the node, `b` is deleted and releases the
    // directory to `a` (its uid stays in the marker); `a` is deleted and gives it up. The marker
    // must not be left naming `b1` alone, a uid of no model, which the sweep would take for an
    // orphan's.
    let mut seen = Seen { markers: Some(BTreeMap::new()), ..Seen::default() };
    let (mut h, a) = reserved_a_away_and_b_deleted(&mut seen, &[]);
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], &[]);
    assert_eq!(seen.disowned, vec![("a1".to_string(), "shared".to_string())]);
    drift_passes(&mut h, &mut seen, &[]);
    assert!(seen.trashed.is_empty(), "a reserved model's weights trashed: {:?}", seen.trashed);
}

#[test]
fn a_reserved_model_deleted_while_a_co_owner_downloads_gives_its_directory_up_after() {
    let mut h = H::new();
    let a = reserved(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", Some("/mnt/models/shared")));
    let b = reserved(obj(&ModelKey::cluster("b"), "b1", "hf://org/repo", Some("/mnt/models/shared")));
    let mut seen = Seen::default();
    let e = h.start(true, vec![a.clone()]);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    let e = h.apply(b.clone());
    let all = h.settle_except(e, |op| matches!(op, Op::Download { .. }));
    let dl =
        all.iter().find(|e| matches!(&e.op, Op::Download { uid, .. } if uid.as_str() == "b1")).expect("b downloads");
    assert!(matches!(&dl.op, Op::Download { co_owners, .. } if co_owners.iter().any(|u| u.as_str() == "a1")));
    let dl = dl.id;
    let e = h.watch(a.key.kind, WatchEvent::Deleted(a.clone().into()));
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound });
    h.settle(e);
    assert_eq!(h.s.model_count(), 2, "`a` waits for the download to end, not forgotten");
    let result = DownloadResult::Done { commit: COMMIT.into(), metadata: None, bytes: 1000 };
    let e = h.input(Input::EffectDone { id: dl, outcome: Outcome::Downloaded(DownloadEnd { marked: true, result }) });
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&b));
    let e = h.advance(300_000);
    let left = [
        OwnedDir { path: "shared".into(), uid: Uid::new("a1"), reserved: false },
        OwnedDir { path: "shared".into(), uid: Uid::new("b1"), reserved: false },
    ];
    run(&mut h, e, &mut seen, &left, std::slice::from_ref(&b));
    assert!(seen.disowned.contains(&("a1".to_string(), "shared".to_string())), "{:?}", seen.disowned);
    assert!(seen.trashed.is_empty(), "reserved weights trashed: {:?}", seen.trashed);
}

#[test]
fn a_stale_snapshot_s_disowned_uid_goes_at_the_next_disown() {
    // A snapshot asked for before `a` gave the directory up lands after it and names `a1`
    // again: `c`'s download writes it back into the marker. The next disown there (`b`, also
    // reserved) keeps only live members, so no uid of a model gone is left to make it an orphan.
    let mut h = H::new();
    let a = reserved(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", Some("/mnt/models/shared")));
    let b = reserved(obj(&ModelKey::cluster("b"), "b1", "hf://org/repo", Some("/mnt/models/shared")));
    let mut seen = Seen { markers: Some(BTreeMap::new()), ..Seen::default() };
    let both = [a.clone(), b.clone()];
    let e = h.start(true, both.to_vec());
    run(&mut h, e, &mut seen, &[], &both);
    let stale = seen.snapshot(&[]);
    seen.snapshots_held = Some(Vec::new());
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &[], &both);
    let sid = seen.snapshots_held.as_mut().unwrap().pop().expect("a snapshot asked for");
    seen.snapshots_held = None;
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&b));
    let e = h.input(Input::DriftObserved { id: sid, snapshot: stale });
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&b));
    let c = obj(&ModelKey::cluster("c"), "c1", "hf://org/repo", Some("/mnt/models/shared"));
    let e = h.apply(c.clone());
    run(&mut h, e, &mut seen, &[], &[b.clone(), c.clone()]);
    let e = delete(&mut h, &b);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&c));
    let named = &seen.markers.as_ref().unwrap()["shared"];
    assert!(!named.contains("a1") && !named.contains("b1") && named.contains("c1"), "{named:?}");
}

// Found by a second review: the disown's first `keep` (the directory's live members, read while
// keys settle one by one) left out a live reserved model away from the node, and a co-owner's
// delete then trashed its weights. `keep` is now filled once every key of the step has
// settled.

/// `o` with the reserve label.
fn reserved(mut o: ModelObject) -> ModelObject {
    Arc::make_mut(o.spec.as_mut().unwrap()).reserve_artifact = true;
    o
}

/// Reserved `a`, reserved `w` (gpu only: away from a cpu node) and `x`, all at `shared`; the cpu
/// node.
fn reserved_trio() -> (ModelObject, ModelObject, ModelObject, NodeView) {
    let at = Some("/mnt/models/shared");
    let a = reserved(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at));
    let w = reserved(gpu_only(obj(&ModelKey::cluster("w"), "w1", "hf://org/repo", at)));
    let x = obj(&ModelKey::cluster("x"), "x1", "hf://org/repo", at);
    (a, w, x, gpu_and_cpu().1)
}

/// A node whose marker at `shared` names `uids`; snapshots held when `hold`.
fn marked_at_shared(uids: &[&str], hold: bool) -> Seen {
    let named: BTreeSet<String> = uids.iter().map(|s| s.to_string()).collect();
    let markers = Some(BTreeMap::from([("shared".to_string(), named)]));
    Seen { markers, snapshots_held: hold.then(Vec::new), ..Seen::default() }
}

/// `w`'s exit from the node: its live reads (`gets`) and the Node's agree.
fn exit_witnessed(h: &mut H, gets: Vec<EffectId>, w: &ModelObject, node: &NodeView) -> Vec<Effect> {
    let mut e = Vec::new();
    for id in gets {
        e.extend(h.input(Input::LiveRead { id, result: ReadResult::Found(w.clone().into()) }));
    }
    for x in e.clone() {
        if matches!(x.op, Op::LiveGetNode) {
            e.extend(h.input(Input::NodeRead { id: x.id, result: NodeReadResult::Found(node.clone()) }));
        }
    }
    e
}

/// `x` is deleted and three sweeps pass: `w`'s weights stay.
fn x_deleted_then_sweeps_spare_w(h: &mut H, seen: &mut Seen, x: &ModelObject, w: &ModelObject) {
    let e = delete(h, x);
    run(h, e, seen, &[], std::slice::from_ref(w));
    drift_passes(h, seen, std::slice::from_ref(w));
    assert!(seen.trashed.is_empty(), "the weights of live reserved w1 trashed: {:?}", seen.trashed);
}

#[test]
fn a_disown_at_the_first_snapshot_keeps_a_reserved_model_away_in_the_marker() {
    // After a restart: reserved `a` was deleted (finalizer held), reserved `w` is away from the
    // node (its nodeSelector), `x` is placed; all three share `shared`, whose marker names all.
    let (a, w, x, cpu) = reserved_trio();
    let mut seen = marked_at_shared(&["a1", "w1", "x1"], false);
    let mut h = H::new();
    let e = h.start_on(cpu, true, vec![deleting(a), w.clone(), x.clone()]);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    x_deleted_then_sweeps_spare_w(&mut h, &mut seen, &x, &w);
}

#[test]
fn a_disown_on_a_snapshot_stale_for_a_reserved_model_away_keeps_it_in_the_marker() {
    let (a, w, x, cpu) = reserved_trio();
    let mut seen = marked_at_shared(&["a1", "w1", "x1"], true);
    let mut h = H::new();
    let e = h.start_on(cpu.clone(), true, vec![deleting(a), w.clone(), x.clone()]);
    let gets: Vec<EffectId> = e.iter().filter(|e| matches!(e.op, Op::LiveGet { .. })).map(|e| e.id).collect();
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    let sid = seen.snapshots_held.as_mut().unwrap().pop().expect("the first snapshot asked");
    seen.snapshots_held = None;
    // What `w`'s exit does lands after the snapshot was asked for.
    let e = exit_witnessed(&mut h, gets, &w, &cpu);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    let snap = seen.snapshot(&[]);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    x_deleted_then_sweeps_spare_w(&mut h, &mut seen, &x, &w);
}

// Found by a third review: a disown before the first snapshot, after a `keep_marked` download:
// the marker keeps w1 (the download kept it) but the core recorded only the download's owners.
// The disown now waits for the first snapshot, and `keep` has every live model naming the path.
#[test]
fn a_disown_before_the_first_snapshot_after_a_keep_marked_download_keeps_a_reserved_model_away() {
    let (a, w, x, cpu) = reserved_trio();
    let mut seen = marked_at_shared(&["a1", "w1", "x1"], true);
    let mut h = H::new();
    let e = h.start_on(cpu, true, vec![a.clone(), w.clone(), x.clone()]);
    run(&mut h, e, &mut seen, &[], &[a.clone(), w.clone(), x.clone()]);
    // `a` is deleted before the first snapshot is answered.
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    let held = std::mem::take(seen.snapshots_held.as_mut().unwrap());
    seen.snapshots_held = None;
    for sid in held {
        let snap = seen.snapshot(&[]);
        let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
        run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    }
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    x_deleted_then_sweeps_spare_w(&mut h, &mut seen, &x, &w);
    assert!(seen.markers.as_ref().unwrap().get("shared").is_some_and(|m| m.contains("w1")), "{:?}", seen.markers);
}

// Also from the third review: as `a_disown_on_a_snapshot_stale_for_a_reserved_model_away_keeps_it_in_the_marker`,
// with no third member, so that no record of `shared` may exist when the snapshot comes: the
// marker still names live w1 after the disown.
#[test]
fn a_disown_on_a_stale_snapshot_with_no_record_of_the_directory_keeps_w() {
    let (a, w, _, cpu) = reserved_trio();
    let mut seen = marked_at_shared(&["a1", "w1"], true);
    let mut h = H::new();
    let e = h.start_on(cpu.clone(), true, vec![deleting(a), w.clone()]);
    let gets: Vec<EffectId> = e.iter().filter(|e| matches!(e.op, Op::LiveGet { .. })).map(|e| e.id).collect();
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&w));
    let sid = seen.snapshots_held.as_mut().unwrap().pop().expect("the first snapshot asked");
    seen.snapshots_held = None;
    let e = exit_witnessed(&mut h, gets, &w, &cpu);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&w));
    let snap = seen.snapshot(&[]);
    let e = h.input(Input::DriftObserved { id: sid, snapshot: snap });
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&w));
    assert!(seen.markers.as_ref().unwrap().get("shared").is_some_and(|m| m.contains("w1")), "{:?}", seen.markers);
}

/// The models using the copy, three Ready, then a drift snapshot that shows no marker at the
/// copy's path and could not read `unread`: the effects of that snapshot's step.
fn copy_not_shown(unread: &[&str]) -> (H, Seen, Vec<ModelObject>, Vec<Effect>) {
    let (mut h, mut seen, models) = three_ready();
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &models);
    let e = h.advance(300_000);
    assert_eq!(e.iter().filter(|e| e.op == Op::Snapshot).count(), 1);
    let shown = Seen { markers: Some(BTreeMap::new()), ..Seen::default() };
    let mut snapshot = shown.snapshot(&[]);
    snapshot.unread = unread.iter().map(|u| u.to_string()).collect();
    let e = e
        .into_iter()
        .flat_map(|x| match &x.op {
            Op::Snapshot => h.input(Input::DriftObserved { id: x.id, snapshot: snapshot.clone() }),
            _ => vec![x],
        })
        .collect();
    (h, seen, models, e)
}

fn updating(e: &[Effect]) -> usize {
    e.iter().filter(|e| matches!(&e.op, Op::Publish { label: Some(ModelStatus::Updating), .. })).count()
}

#[test]
fn models_of_a_copy_gone_from_disk_fetch_it_again() {
    // #834's drift for a shared copy: the snapshot read everything and shows no marker at the
    // copy's path (someone removed it by hand). The models using it are not left Ready on
    // nothing: they fetch it again, and are Ready once it is back.
    let (mut h, mut seen, models, e) = copy_not_shown(&[]);
    assert_eq!(updating(&e), 3, "{e:?}");
    let downloads = seen.downloads.len();
    let mut gone = Seen { markers: Some(BTreeMap::new()), ..Seen::default() };
    run(&mut h, e, &mut gone, &copy_marked(&["c1", "a1", "b1"]), &models);
    assert!(!gone.downloads.is_empty(), "fetched again: {:?}", gone.downloads);
    assert!(gone.downloads.iter().all(|(_, dest, _)| dest == COPY), "{:?}", gone.downloads);
    seen.downloads.extend(gone.downloads);
    assert!(seen.downloads.len() > downloads);
    let ready = Published::Status { status: ModelStatus::Ready, reason: None };
    for m in &models {
        assert_eq!(h.view(&m.key, m.uid.as_str()).published, ready, "{}", m.key);
    }
}

#[test]
fn a_copy_the_scan_could_not_read_is_not_taken_for_gone() {
    // downloads.md: a scan error never triggers a re-download. No marker shown at the copy's
    // path, but the scan could not read the subtree it lies in (or the root): its models stay
    // Ready and fetch nothing.
    for unread in [&["_artifacts"][..], &["_artifacts/org"], &[COPY], &["x", ""]] {
        let (_, _, _, e) = copy_not_shown(unread);
        assert_eq!(updating(&e), 0, "unread {unread:?}: {e:?}");
        assert!(!e.iter().any(|e| matches!(e.op, Op::Download { .. })), "unread {unread:?}: {e:?}");
    }
    // A directory whose name only begins like the copy's parent is not its parent.
    let (_, _, _, e) = copy_not_shown(&["_artifacts/o", "_artifacts/org/repo2"]);
    assert_eq!(updating(&e), 3, "{e:?}");
}

// Swarm seed 12709: reserved `b` and `a` shared a directory; `a` left the node, then `b` was
// deleted and gave the directory up keeping `a`, alive but away, in the marker. `a`'s delete
// later made the directory an orphan's, and the sweep trashed the weights `b` kept. A disown now
// keeps only the uids that may stay on the node (and reserved ones, which keep their directory
// while away); a marker left naming no one goes, and a directory without one is never trashed.
#[test]
fn a_reserved_model_s_disown_keeps_no_co_owner_that_left_the_node() {
    let (a, b) = pair_at_shared();
    let b = reserved(b);
    let (gpu, cpu) = gpu_and_cpu();
    let both = [a.clone(), b.clone()];
    let mut seen = marked_at_shared(&["a1", "b1"], false);
    let mut h = H::new();
    let e = h.start_on(gpu, true, both.to_vec());
    run(&mut h, e, &mut seen, &[], &both);
    let e = leave_node(&mut h, &a, cpu);
    run(&mut h, e, &mut seen, &[], &both);
    assert_eq!(h.view(&a.key, "a1").life, Life::Withdrawn);
    let e = delete(&mut h, &b);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    assert_eq!(seen.disowned, vec![("b1".to_string(), "shared".to_string())]);
    let named = seen.markers.as_ref().unwrap().get("shared");
    assert!(named.is_none_or(|n| !n.contains("a1")), "a1, away, kept in the marker: {named:?}");
    // `a` is deleted too, and sweeps pass: `b`'s weights stay.
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], &[]);
    drift_passes(&mut h, &mut seen, &[]);
    assert!(seen.trashed.is_empty(), "the weights reserved b1 kept trashed: {:?}", seen.trashed);
}

/// Reserved `b` and `a` Ready at `shared`; `a`'s delete is a candidate, its live read left out
/// (returned), when `b`'s delete is confirmed (the LISTs then show `a` when `a_lives`).
fn reserved_gone_while_a_co_owner_is_a_candidate(a_lives: bool) -> (H, Seen, ModelObject, EffectId) {
    let at = Some("/mnt/models/shared");
    let a = obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at);
    let b = reserved(obj(&ModelKey::cluster("b"), "b1", "hf://org/repo", at));
    let both = [a.clone(), b.clone()];
    let mut seen = marked_at_shared(&["a1", "b1"], false);
    let mut h = H::new();
    let e = h.start_on(gpu_and_cpu().0, true, both.to_vec());
    run(&mut h, e, &mut seen, &[], &both);
    assert_eq!(seen.downloads.len(), 2, "{:?}", seen.downloads);
    let e = h.watch(Kind::ClusterBaseModel, WatchEvent::Deleted(a.clone().into()));
    let a_read = one_get(&e);
    run(&mut h, e, &mut seen, &[], &[]);
    let e = delete(&mut h, &b);
    let listed = if a_lives { std::slice::from_ref(&a) } else { &[] };
    run(&mut h, e, &mut seen, &[], listed);
    assert_eq!(seen.disowned, vec![("b1".to_string(), "shared".to_string())]);
    (h, seen, a, a_read)
}

// Swarm seed 37744: reserved `b` shared a directory with `a`, whose delete was a candidate (a
// stale list had shown it again, its live read was out) when `b`'s delete was confirmed. `b`'s
// disown kept `a` in the marker as a model that may stay; `a` was then confirmed gone, and the
// sweep trashed the weights `b`'s label kept. A candidate is not kept: gone, it would leave the
// files to the sweep; alive, it fetches them again.
#[test]
fn a_reserved_model_s_disown_keeps_no_co_owner_whose_delete_is_a_candidate() {
    let (mut h, mut seen, _, a_read) = reserved_gone_while_a_co_owner_is_a_candidate(false);
    let named = seen.markers.as_ref().unwrap().get("shared");
    assert!(named.is_none_or(|n| !n.contains("a1")), "a1, a candidate, kept in the marker: {named:?}");
    // `a` is confirmed gone, and sweeps pass: `b`'s weights stay.
    let e = h.input(Input::LiveRead { id: a_read, result: ReadResult::NotFound });
    run(&mut h, e, &mut seen, &[], &[]);
    drift_passes(&mut h, &mut seen, &[]);
    assert!(seen.trashed.is_empty(), "the weights reserved b1 kept trashed: {:?}", seen.trashed);
}

// The other way the candidate of seed 37744 can end: its delete was a phantom. Left out of the
// marker by the reserved model's disown, it learns from the next snapshot that no marker names
// it, and fetches the weights again: Ready on them, in a marker of its own.
#[test]
fn a_candidate_left_out_of_a_reserved_model_s_disown_fetches_again_when_it_lives() {
    let (mut h, mut seen, a, a_read) = reserved_gone_while_a_co_owner_is_a_candidate(true);
    assert!(!seen.names("shared", &Uid::new("a1")));
    let e = h.input(Input::LiveRead { id: a_read, result: ReadResult::Found(a.clone().into()) });
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    assert_eq!(h.view(&a.key, "a1").life, Life::Observed);
    let e = h.advance(300_000);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&a));
    assert_eq!(seen.downloads.len(), 3, "a fetches again: {:?}", seen.downloads);
    assert!(seen.names("shared", &Uid::new("a1")));
    assert_eq!(seen.entries.get("clusterbasemodel.a").map(|e| e.status), Some(ModelStatus::Ready));
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

/// `o` with another source, as a later version of the same object.
fn switched(o: &ModelObject, uri: &str, version: &str) -> ModelObject {
    let mut o = o.clone();
    Arc::make_mut(o.spec.as_mut().unwrap()).storage_uri = Arc::from(uri);
    let parsed = crate::storage_uri::StorageUri::parse(uri).map_err(|e| e.to_string());
    Arc::make_mut(o.spec.as_mut().unwrap()).uri = parsed;
    o.resource_version = Arc::from(version);
    o
}

// Swarm seed 44142: reserved `w` left the node keeping the directory with its files from `repo`,
// and switched to `repo-b` while away; `x`, at the same path, switched to `repo-b` too, and was
// Failed for good: the directory held `w`'s files of another source. Here, `w` would replace
// those files itself; away, it counts as of the source its spec names there, as it would here.
#[test]
fn a_reserved_model_away_counts_as_of_the_source_its_spec_names_now() {
    let at = Some("/mnt/models/shared");
    let w = reserved(gpu_only(obj(&ModelKey::cluster("w"), "w1", "hf://org/repo", at)));
    let x = obj(&ModelKey::cluster("x"), "x1", "hf://org/repo", at);
    let (gpu, cpu) = gpu_and_cpu();
    let mut seen = marked_at_shared(&["w1", "x1"], false);
    let mut h = H::new();
    let e = h.start_on(gpu, true, vec![w.clone(), x.clone()]);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    assert_eq!(seen.downloads.len(), 2, "{:?}", seen.downloads);
    let e = leave_node(&mut h, &w, cpu);
    run(&mut h, e, &mut seen, &[], &[w.clone(), x.clone()]);
    assert_eq!(h.view(&w.key, "w1").life, Life::Withdrawn);
    let w_b = switched(&w, "hf://org/repo-b", "2");
    let e = h.apply(w_b.clone());
    run(&mut h, e, &mut seen, &[], &[w_b.clone(), x.clone()]);
    let x_b = switched(&x, "hf://org/repo-b", "3");
    let e = h.apply(x_b.clone());
    run(&mut h, e, &mut seen, &[], &[w_b.clone(), x_b.clone()]);
    let last = seen.downloads.last().unwrap();
    assert_eq!((last.0.as_str(), last.1.as_str()), ("x1", "shared"), "x fetches repo-b there: {:?}", seen.downloads);
    assert_eq!(seen.entries.get("clusterbasemodel.x").map(|e| e.status), Some(ModelStatus::Ready));
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
}

// Swarm seed 82997: held BaseModel `x` (its keys ClusterBaseModel `basemodel.x`'s) left the
// node, releasing the directory its marker names it in to `prefill`, and was placed here again.
// Held, it never joined the directory back, so `prefill`'s delete trashed its weights once the
// Node witness came. A held model placed here stays a member of its own destination when the
// marker there is known to name it.
#[test]
fn a_held_model_placed_again_keeps_the_weights_the_marker_names_it_for() {
    let (a, owner, held) = prefill_and_held();
    let held = gpu_only(held);
    let (gpu, cpu) = gpu_and_cpu();
    let models = vec![a.clone(), owner.clone(), held.clone()];
    let marked = ["p1", "x1"].map(|u| OwnedDir { path: "shared".into(), uid: Uid::new(u), reserved: false });
    let mut h = H::new();
    let mut seen = Seen::default();
    let e = h.start_on(gpu.clone(), true, models.clone());
    run(&mut h, e, &mut seen, &marked, &models);
    assert_eq!(h.view(&held.key, "x1").owned_dir.as_deref(), Some("shared"));
    let e = leave_node(&mut h, &held, cpu);
    run(&mut h, e, &mut seen, &marked, &models);
    assert_eq!(h.view(&held.key, "x1").life, Life::Withdrawn);
    assert_eq!(h.view(&held.key, "x1").owned_dir, None, "released to prefill");
    let e = h.input(Input::NodeObserved(gpu));
    run(&mut h, e, &mut seen, &marked, &models);
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &marked, &[owner, held]);
    assert!(seen.trashed.is_empty(), "x1's weights trashed: {:?}", seen.trashed);
}

/// The first download of `m1` (hf://org/new at `pair`) after a start whose BaseModel list was
/// empty (unsynced), while `pair`'s marker names `x1`, a BaseModel of another source no record
/// knows. The orphan check's LISTs show `x1` as `x1_listed` says (None: not listed; Some: listed,
/// being deleted or not); `m1` arrives before the first snapshot, or after it (`m_late`).
fn first_download_over_a_marker_naming_an_unknown_uid(
    x1_listed: Option<bool>,
    (m_late, m1_marked): (bool, bool),
) -> Vec<(String, Vec<String>, bool, Vec<String>)> {
    let mut h = H::new();
    let m = obj(&ModelKey::cluster("m"), "m1", "hf://org/new", Some("/mnt/models/pair"));
    let x1 = obj(&ModelKey::namespaced("team", "x"), "x1", "hf://org/old", Some("/mnt/models/pair"));
    let mut pending = Vec::new();
    for kind in Kind::ALL {
        pending.extend(h.watch(kind, WatchEvent::RelistStarted));
        if kind == Kind::ClusterBaseModel && !m_late {
            pending.extend(h.watch(kind, WatchEvent::RelistItem(m.clone().into())));
        }
        pending.extend(h.watch(kind, WatchEvent::RelistDone));
    }
    let marker = if m1_marked { &["m1", "x1"][..] } else { &["x1"][..] };
    let owned_dirs: Vec<OwnedDir> =
        marker.iter().map(|u| OwnedDir { path: "pair".into(), uid: Uid::new(u), reserved: false }).collect();
    let (mut all, mut later) = (Vec::new(), vec![Input::NodeObserved(node(&[]))]);
    if m_late {
        later.insert(0, Input::Watch { kind: Kind::ClusterBaseModel, event: WatchEvent::Applied(m.clone().into()) });
    }
    for _ in 0..60 {
        let mut next = Vec::new();
        for x in &pending {
            let input = match &x.op {
                Op::Snapshot => {
                    let snapshot = DriftSnapshot { owned_dirs: owned_dirs.clone(), ..DriftSnapshot::default() };
                    Input::DriftObserved { id: x.id, snapshot }
                }
                Op::ProbeRoot => Input::RootProbed { id: x.id, probe: RootProbe::healthy(true) },
                Op::LiveList { kind, .. } => {
                    let listed = match (kind, x1_listed) {
                        (Kind::BaseModel, Some(deleting)) => vec![Arc::new(ModelObject { deleting, ..x1.clone() })],
                        (Kind::ClusterBaseModel, _) => vec![Arc::new(m.clone())],
                        _ => Vec::new(),
                    };
                    Input::LiveList { id: x.id, result: ListResult::Listed(listed) }
                }
                Op::LiveGet { .. } | Op::LiveGetNode | Op::Download { .. } => continue,
                _ => Input::EffectDone { id: x.id, outcome: Outcome::Done },
            };
            next.extend(h.input(input));
        }
        all.append(&mut pending);
        if next.is_empty() && !later.is_empty() {
            next = h.input(later.remove(0));
        }
        pending = next;
    }
    download_owners(&all)
}

/// Swarm seed 102822: after a start whose BaseModel list was empty, a marker named a live
/// BaseModel of another source no record knew. Its uid went to the download as a co-owner and
/// nothing held the download back: the files that model was Ready on were replaced. A uid the
/// marker names that no record knows is of another source for the download (the shell replaces
/// no other source's files for it) until the orphan check's LISTs show it gone.
#[test]
fn a_marker_naming_a_uid_no_record_knows_holds_a_download_back_until_lists_show_it_gone() {
    let owners = |other: &[&str]| {
        let other: Vec<String> = other.iter().map(|u| u.to_string()).collect();
        vec![("m1".to_string(), vec!["x1".to_string()], false, other)]
    };
    let first_download = first_download_over_a_marker_naming_an_unknown_uid;
    assert_eq!(first_download(Some(false), (false, false)), owners(&["x1"]), "alive");
    assert_eq!(first_download(None, (false, false)), owners(&[]), "gone");
    assert_eq!(first_download(Some(true), (false, false)), owners(&[]), "being deleted");
}

/// The gap the rule above left: a directory no known model used when the last snapshot showed
/// its marker (`m` comes after it) had no record of that marker, and `m`'s download into it
/// went with no co-owner and no other source. Where the marker names `m1` too, the shell then
/// took the directory for `m1`'s and replaced `x1`'s files. The snapshot's record of a
/// directory no model uses, whose marker names a uid no record knows, is kept at rest and
/// taken by the model that comes to use it (`State::dirs_rested`).
#[test]
fn a_directory_that_comes_into_use_after_the_snapshot_keeps_its_marker_s_unknown_uid() {
    let first_download = first_download_over_a_marker_naming_an_unknown_uid;
    let owners = |owners: &[&str], other: &[&str]| {
        let strings = |uids: &[&str]| uids.iter().map(|u| u.to_string()).collect::<Vec<_>>();
        vec![("m1".to_string(), strings(owners), false, strings(other))]
    };
    assert_eq!(first_download(Some(false), (true, false)), owners(&["x1"], &["x1"]), "x1's marker");
    assert_eq!(first_download(Some(false), (true, true)), owners(&["x1"], &["x1"]), "m1's and x1's marker");
    assert_eq!(first_download(Some(false), (false, true)), owners(&["x1"], &["x1"]), "m1's and x1's, m known");
}

/// A review (of the unknown-uid rule): the same start as swarm seed 102822 (the BaseModel list empty, unsynced), `shared`'s
/// marker naming `a1` (ClusterBaseModel `a`, known) and `u1` (BaseModel `team/u`, alive, Ready
/// there on the same source, no record knows it). `a` is deleted: its cleanup must not trash
/// the directory while the marker names a uid no record knows and the LISTs show alive.
#[test]
fn a_co_owner_s_delete_never_trashes_a_directory_whose_marker_names_a_live_unknown_uid() {
    let mut h = H::new();
    let at = Some("/mnt/models/shared");
    let a = obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at);
    let u = obj(&ModelKey::namespaced("team", "u"), "u1", "hf://org/repo", at);
    let mut seen = Seen::default();
    let markers: BTreeSet<String> = ["a1", "u1"].iter().map(|s| s.to_string()).collect();
    seen.markers = Some([("shared".to_string(), markers)].into_iter().collect());
    // Only `a` in the first lists; `u` is alive (the LISTs show it).
    let e = h.start(true, vec![a.clone()]);
    let listed = [a.clone(), u.clone()];
    run(&mut h, e, &mut seen, &[], &listed);
    drift_passes(&mut h, &mut seen, &listed);
    let using = h.s.dirs.get("shared").cloned();
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&u));
    drift_passes(&mut h, &mut seen, std::slice::from_ref(&u));
    assert!(
        seen.trashed.is_empty(),
        "live u1's weights trashed by a's delete: {:?} (dir record before: {using:?})",
        seen.trashed
    );
}

/// A review (of the unknown-uid rule): as above, but `a` carries the reserve label: its delete gives the directory up
/// (`DisownDir`). The marker must keep `u1` (alive, the LISTs show it, no record knows it):
/// with `keep` left without it, the marker goes and `u`'s files are no one's.
#[test]
fn a_reserved_co_owner_s_disown_keeps_a_live_unknown_uid_in_the_marker() {
    let mut h = H::new();
    let at = Some("/mnt/models/shared");
    let a = reserved(obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at));
    let u = obj(&ModelKey::namespaced("team", "u"), "u1", "hf://org/repo", at);
    let mut seen = marked_at_shared(&["a1", "u1"], false);
    let e = h.start(true, vec![a.clone()]);
    let listed = [a.clone(), u.clone()];
    run(&mut h, e, &mut seen, &[], &listed);
    drift_passes(&mut h, &mut seen, &listed);
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&u));
    assert_eq!(seen.disowned, vec![("a1".to_string(), "shared".to_string())]);
    assert!(seen.names("shared", &Uid::new("u1")), "the disown wrote live u1 out of the marker: {:?}", seen.markers);
}

/// `run`, but every download of `refused` fails (the shell refuses it: another source's files).
fn run_refusing(h: &mut H, mut effects: Vec<Effect>, seen: &mut Seen, listed: &[ModelObject], refused: &str) {
    for _ in 0..200 {
        let mut next = Vec::new();
        let mut downloading = Vec::new();
        for e in &effects {
            if let Op::Download { uid, .. } = &e.op
                && uid.as_str() == refused
            {
                let outcome = Outcome::Failed("held from another source".into());
                next.extend(h.input(Input::EffectDone { id: e.id, outcome }));
                continue;
            }
            if let Some(input) = answer(h, e, seen, (&[], listed), &mut downloading) {
                next.extend(h.input(input));
            }
        }
        for id in downloading {
            let result = DownloadResult::Done { commit: COMMIT.into(), metadata: None, bytes: 1000 };
            let outcome = Outcome::Downloaded(DownloadEnd { marked: true, result });
            next.extend(h.input(Input::EffectDone { id, outcome }));
        }
        if next.is_empty() {
            return;
        }
        effects = next;
    }
    panic!("effects did not settle");
}

/// A review (of the unknown-uid rule): a uid a snapshot found unknown in `shared`'s marker (`u1`, Ready there from
/// hf://org/old before a restart whose BaseModel list was empty) becomes known (its watch
/// event comes late) and is deleted before the next snapshot; `a` (hf://org/new at the same
/// path, refused over `u1`'s files) stays. `u`'s trash lands and its record is dropped:
/// `unregister` remembers `u1` gone in `shared` while `DirUse::unknown` still names it.
#[test]
fn an_unknown_uid_that_becomes_known_and_is_deleted_keeps_the_dir_invariants() {
    let mut h = H::new();
    let at = Some("/mnt/models/shared");
    let a = obj(&ModelKey::cluster("a"), "a1", "hf://org/new", at);
    let u = obj(&ModelKey::namespaced("team", "u"), "u1", "hf://org/old", at);
    let mut seen = marked_at_shared(&["u1"], false);
    let e = h.start(true, vec![a.clone()]);
    // The orphan check's LISTs show `u1` alive: it stays unknown.
    let listed = [a.clone(), u.clone()];
    run_refusing(&mut h, e, &mut seen, &listed, "a1");
    assert_eq!(
        h.s.dirs.get("shared").map(|d| d.unknown.clone()),
        Some(vec![Uid::new("u1")]),
        "unknown after the snapshot"
    );
    let e = h.apply(u.clone());
    run_refusing(&mut h, e, &mut seen, &listed, "a1");
    let e = delete(&mut h, &u);
    run_refusing(&mut h, e, &mut seen, std::slice::from_ref(&a), "a1");
    assert_eq!(h.s.invariants(), Ok(()));
}

/// A review (of the rested records): as `a_co_owner_s_delete_never_trashes_a_directory_whose_marker_names_a_live_unknown_uid`,
/// but `a` comes after the snapshot and the orphan check (its watch event lags): `shared`'s
/// record was at rest then (`State::dirs_rested`), and the check's LISTs showing `u1` alive were
/// never recorded in it (`forget_unknown_gone` reads `State::dirs` only). `a` joins, downloads
/// (same source as `u1`'s files) and is deleted before the next drift pass: its cleanup must not
/// trash the directory while the marker names `u1`, alive.
#[test]
fn a_delete_after_joining_a_rested_directory_never_trashes_a_live_unknown_uid_s_weights() {
    let mut h = H::new();
    let at = Some("/mnt/models/shared");
    let a = obj(&ModelKey::cluster("a"), "a1", "hf://org/repo", at);
    let u = obj(&ModelKey::namespaced("team", "u"), "u1", "hf://org/repo", at);
    let mut seen = marked_at_shared(&["a1", "u1"], false);
    // No model known at first; the LISTs show both alive.
    let e = h.start(true, vec![]);
    let listed = [a.clone(), u.clone()];
    run(&mut h, e, &mut seen, &[], &listed);
    drift_passes(&mut h, &mut seen, &listed);
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
    let rested = h.s.dirs_rested.get("shared").cloned();
    // `a`'s watch event comes now.
    let e = h.apply(a.clone());
    run(&mut h, e, &mut seen, &[], &listed);
    let using = h.s.dirs.get("shared").cloned();
    let e = delete(&mut h, &a);
    run(&mut h, e, &mut seen, &[], std::slice::from_ref(&u));
    assert!(
        seen.trashed.is_empty(),
        "live u1's weights trashed by a's delete: {:?}\n rested: {rested:?}\n in use: {using:?}",
        seen.trashed
    );
}

/// A review (of the rested records): a directory no known model uses whose marker names a known uid (`k1`, a
/// model now at another path) and one of a model gone (`g1`). The snapshot leaves it at rest
/// with `g1` unknown; since 6c03566 each snapshot adds `g1` to the orphan check, whose LISTs show
/// it gone: `forget_gone` then drops the rested record (no unknown uid left), and the next
/// snapshot's `rest_shown` makes a fresh one (its `gone` empty) with `g1` unknown again. Two
/// LISTs every drift period, for as long as the marker stays (nothing sweeps it: `k1` claims it).
#[test]
fn a_rested_directory_naming_a_gone_uid_is_not_listed_for_every_period() {
    let mut h = H::new();
    let k = obj(&ModelKey::cluster("k"), "k1", "hf://org/repo", Some("/mnt/models/k"));
    let mut seen = marked_at_shared(&["k1", "g1"], false);
    let e = h.start(true, vec![k.clone()]);
    let listed = [k.clone()];
    run(&mut h, e, &mut seen, &[], &listed);
    drift_passes(&mut h, &mut seen, &listed);
    let before = seen.lists;
    for _ in 0..10 {
        let e = h.advance(300_000);
        run(&mut h, e, &mut seen, &[], &listed);
    }
    assert!(seen.trashed.is_empty(), "{:?}", seen.trashed);
    assert_eq!(
        seen.lists - before,
        0,
        "LISTs over 10 drift periods for a gone uid already shown gone (rested: {:?})",
        h.s.dirs_rested.get("shared")
    );
}
