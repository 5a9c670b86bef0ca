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
    entries: BTreeMap<String, wire::ModelEntry>,
    occupied: BTreeSet<String>,
}

/// Answers every effect as a healthy node would (downloads one step later, so that overlap is
/// seen), snapshots with `owned` as the marked directories, lists with `listed`.
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
            let done = Input::EffectDone { id: e.id, outcome: Outcome::Done };
            let input = match &e.op {
                Op::Resolve { .. } => {
                    seen.resolves += 1;
                    Input::EffectDone { id: e.id, outcome: Outcome::Resolved { commit: COMMIT.into() } }
                }
                Op::Download { uid, dest, co_owners, .. } => {
                    let co = co_owners.iter().map(|u| u.to_string()).collect();
                    seen.downloads.push((uid.to_string(), dest.beneath_root.clone().unwrap(), co));
                    downloading.push(e.id);
                    continue;
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
                Op::TrashDir { path, .. } => {
                    seen.trashed.push(path.clone());
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
                Op::LiveList { kind } => {
                    let objs = listed.iter().filter(|o| o.key.kind == *kind).cloned().collect();
                    Input::LiveList { id: e.id, result: ListResult::Listed(objs) }
                }
                Op::Snapshot => {
                    let snapshot = DriftSnapshot { owned_dirs: owned.to_vec(), ..DriftSnapshot::default() };
                    Input::DriftObserved { id: e.id, snapshot }
                }
                Op::ProbeRoot => Input::RootProbed { id: e.id, probe: RootProbe::healthy(true) },
                Op::LiveGet { .. } | Op::LiveGetNode | Op::CancelDownload { .. } => continue,
                _ => done,
            };
            next.extend(h.input(input));
        }
        seen.concurrent_max = seen.concurrent_max.max(downloading.len());
        if next.is_empty() && downloading.is_empty() {
            return;
        }
        effects = next;
    }
    panic!("effects did not settle");
}

fn delete(h: &mut H, o: &ModelObject) -> Vec<Effect> {
    let e = h.watch(o.key.kind, WatchEvent::Deleted(o.clone()));
    h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::NotFound })
}

fn copy_marked(uids: &[&str]) -> Vec<OwnedDir> {
    uids.iter().map(|u| OwnedDir { path: COPY.into(), uid: Uid::new(u) }).collect()
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
    let owned = [copy_marked(&["c1"]), vec![OwnedDir { path: "qwen".into(), uid: Uid::new("c1") }]].concat();
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
        OwnedDir { path: "shared".into(), uid: Uid::new("p1") },
        OwnedDir { path: "shared".into(), uid: Uid::new("d1") },
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
    let e = h.watch(models[1].key.kind, WatchEvent::Deleted(models[1].clone()));
    assert!(destructive(&e).is_empty());
    let e = h.input(Input::LiveRead { id: one_get(&e), result: ReadResult::Found(models[1].clone()) });
    run(&mut h, e, &mut seen, &copy_marked(&["c1", "a1", "b1"]), &models);
    assert!(seen.unlinks.is_empty() && seen.trashed.is_empty());
}

#[test]
fn the_copy_counts_every_model_that_uses_it_and_its_bytes() {
    let (h, _, _) = three_ready();
    assert_eq!(h.s.shared_copies(), vec![CopyUse { path: COPY.into(), references: 3, bytes: 1000 }]);
}
