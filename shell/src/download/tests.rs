//! The engine against the project's fake Hub (its own thread and runtime).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use model_agent_fakehub::{CommitFixture, Config, FakeHub, Fault, Fixtures, Listener, RepoFixture, Scope};
use tokio::sync::watch;

use super::disk::{MANIFEST, PARTIAL_DIR};
use super::*;
use crate::fsops::MARKER;

/// Free bytes the space check sees for a models root (the one seam: tests cannot fill a disk).
static FREE_BYTES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

pub(super) fn free_bytes_seam(root: &str) -> Option<u64> {
    FREE_BYTES.lock().unwrap().iter().find(|(r, _)| r == root).map(|(_, free)| *free)
}

pub(super) const REPO: &str = "org/model";
const LFS: &str = "model.safetensors";
const LFS_BYTES: u64 = 1 << 20;
const BIG: &str = "big/weights.bin";
const BIG_BYTES: u64 = 3 << 20;
const UID: &str = "uid-1";

fn commit_files(variant: &str) -> CommitFixture {
    let mut commit = CommitFixture::new()
        .file("config.json", format!("{{\"v\":\"{variant}\"}}"))
        .generated_lfs(LFS, LFS_BYTES, 7)
        .generated_lfs(BIG, BIG_BYTES, 11);
    for i in 0..4 {
        commit = commit.file(&format!("sub/dir{i}/f{i}.txt"), format!("file {i} {variant}"));
    }
    commit
}

pub(super) fn hub() -> FakeHub {
    hub_with(Config { tree_page_size: 4, ..Config::default() })
}

pub(super) fn hub_with(config: Config) -> FakeHub {
    let repo = RepoFixture::new(REPO)
        .commit("c1", commit_files("one"))
        .commit("c2", commit_files("two"))
        .branch("main", "c2")
        .branch("old", "c1");
    FakeHub::start_with(Fixtures::new().repo(repo), config).unwrap()
}

/// A models root of its own, removed at the end.
pub(super) struct Root(pub(super) PathBuf);

impl Root {
    pub(super) fn new(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("download-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Root(dir)
    }

    pub(super) fn dest(&self) -> PathBuf {
        self.0.join("models/m")
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn opts(hub: &FakeHub) -> Options {
    Options {
        endpoint: hub.endpoint().to_owned(),
        files_concurrency: 3,
        multipart_threshold_bytes: u64::MAX,
        multipart_concurrency: 4,
        connect_timeout_ms: 2_000,
        stall_timeout_ms: 5_000,
        progress_period_ms: 50,
        request_attempts_max: 3,
        network: Default::default(),
    }
}

pub(super) fn job(root: &Root, revision: &str) -> Job {
    Job {
        root: root.0.clone(),
        dest_rel: "models/m".into(),
        uid: UID.into(),
        key: "ClusterBaseModel/m".into(),
        repo_id: REPO.into(),
        revision: revision.into(),
        token: None,
        co_owners: Vec::new(),
        keep_marked: false,
        other_source: Vec::new(),
        reserve: false,
        store: None,
    }
}

/// Runs a download to its end (never cancelled); returns how it ended and every progress report.
pub(super) async fn run(job: Job, opts: &Options) -> (Ended, Vec<Progress>) {
    let (_keep, cancel) = watch::channel(false);
    let mut reports = Vec::new();
    let ended = download(job, opts, &mut |p| reports.push(p), cancel).await;
    (ended, reports)
}

pub(super) fn finished(ended: Ended) -> Finished {
    assert!(ended.marked, "a finished download is marked");
    ended.result.unwrap_or_else(|e| panic!("download failed: {e}"))
}

/// Every file of `commit` is in `dest` with the Hub's bytes.
pub(super) fn assert_all_files(hub: &FakeHub, dest: &Path, commit: &str) {
    for path in hub.paths(REPO, commit).unwrap() {
        let expected = hub.file(REPO, commit, &path).unwrap().content.to_vec().unwrap();
        let got = std::fs::read(dest.join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(got == expected, "{path}: wrong bytes");
    }
}

fn repo_bytes(hub: &FakeHub, commit: &str) -> u64 {
    hub.paths(REPO, commit).unwrap().iter().map(|p| hub.file(REPO, commit, p).unwrap().size_bytes).sum()
}

fn served_all(hub: &FakeHub) -> u64 {
    hub.bytes_served_all().iter().map(|f| f.bytes).sum()
}

fn marker_uid(dest: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dest.join(MARKER)).ok()?;
    Some(serde_json::from_str::<crate::fsops::Marker>(&text).unwrap().uid)
}

#[tokio::test]
async fn a_full_download_places_every_file_verified_with_marker_and_manifest() {
    let (hub, root) = (hub(), Root::new("full"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let started = Instant::now();
    let (ended, reports) = run(job(&root, "main"), &opts(&hub)).await;
    let periods = started.elapsed().as_millis() as usize / opts(&hub).progress_period_ms as usize;
    assert!(!reports.is_empty() && reports.len() <= periods + 1, "{} reports in {periods} periods", reports.len());
    let done = finished(ended);
    assert_eq!(done.commit, commit);
    assert_eq!(done.files, hub.paths(REPO, &commit).unwrap().len() as u64);
    assert_eq!(
        (done.bytes_total, done.bytes_fetched, done.adopted_files),
        (repo_bytes(&hub, &commit), done.bytes_total, 0)
    );
    assert_all_files(&hub, &root.dest(), &commit);
    assert_eq!(marker_uid(&root.dest()).as_deref(), Some(UID));
    let manifest: disk::Manifest = serde_json::from_slice(&std::fs::read(root.dest().join(MANIFEST)).unwrap()).unwrap();
    assert_eq!((manifest.commit.as_str(), manifest.files.len() as u64), (commit.as_str(), done.files));
    assert!(!root.dest().join(PARTIAL_DIR).exists(), "the partial directory is removed");
    let last = reports.last().unwrap();
    assert_eq!((last.completed_bytes, last.completed_files), (last.total_bytes, last.total_files));
    assert_eq!(last.total_bytes, done.bytes_total);
    let tree_and_files = hub.requests().iter().filter(|r| r.uri.contains("/revision/")).count();
    assert_eq!(tree_and_files, 1, "the revision is resolved once");
}

#[tokio::test]
async fn a_complete_model_restarts_with_no_byte_fetched_and_an_older_branch_replaces_what_changed() {
    let (hub, root) = (hub(), Root::new("restart"));
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    hub.clear_requests();
    let (ended, reports) = run(job(&root, "main"), &opts(&hub)).await;
    let again = finished(ended);
    assert_eq!((again.bytes_fetched, served_all(&hub)), (0, 0));
    let last = reports.last().unwrap();
    assert_eq!((last.completed_files, last.completed_bytes), (again.files, again.bytes_total), "{last:?}");
    let extra = root.dest().join("notes.txt");
    std::fs::write(&extra, "mine").unwrap();
    let old = finished(run(job(&root, "old"), &opts(&hub)).await.0);
    assert_eq!(old.commit, hub.commit_sha(REPO, "c1").unwrap());
    assert_all_files(&hub, &root.dest(), &old.commit);
    assert!(old.bytes_fetched < LFS_BYTES, "only the small files differ: {}", old.bytes_fetched);
    assert_eq!(std::fs::read_to_string(extra).unwrap(), "mine", "files not in the tree are never deleted");
}

#[tokio::test]
async fn a_cut_file_resumes_in_the_next_run_and_a_stalled_one_in_the_same_run() {
    let (hub, root) = (hub(), Root::new("resume"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let once = Options { request_attempts_max: 1, ..opts(&hub) };
    hub.faults().add(Fault::Truncate { repo: REPO.into(), path: LFS.into(), after_bytes: 100_000, count: 20 });
    let ended = run(job(&root, "main"), &once).await.0;
    assert!(matches!(ended.result, Err(DownloadError::Hub(HfError::Truncated { .. }))), "{:?}", ended.result);
    assert!(ended.marked);
    assert!(!root.dest().join(LFS).exists());
    hub.faults().clear();
    let stall = Fault::Stall { repo: REPO.into(), path: BIG.into(), after_bytes: 500_000, stall_ms: 30_000, count: 1 };
    hub.faults().add(stall);
    let started = Instant::now();
    finished(run(job(&root, "main"), &Options { stall_timeout_ms: 300, ..opts(&hub) }).await.0);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_all_files(&hub, &root.dest(), &commit);
    let served = served_all(&hub);
    let size = repo_bytes(&hub, &commit);
    assert!(served <= size + size / 10, "served {served} for a repo of {size}");
}

/// Runs a download and cancels it once `ready` says so; returns how it ended and how long the cancel took.
async fn run_cancelled(job: Job, opts: &Options, ready: impl Fn() -> bool) -> (Ended, Duration) {
    let (cancel_tx, cancel) = watch::channel(false);
    let sent_at = Mutex::new(None);
    let cancel_later = async {
        while !ready() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The Hub counts bytes handed to its socket: give the client time to take them (the stall holds
        // the server back meanwhile).
        tokio::time::sleep(Duration::from_millis(300)).await;
        *sent_at.lock().unwrap() = Some(Instant::now());
        cancel_tx.send(true).unwrap();
        std::future::pending::<()>().await;
    };
    let mut ignore = |_| {};
    let ended = tokio::select! {
        ended = download(job, opts, &mut ignore, cancel) => ended,
        () = cancel_later => unreachable!(),
    };
    let took = sent_at.lock().unwrap().expect("cancelled").elapsed();
    (ended, took)
}

fn partial_bytes(dest: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dest.join(PARTIAL_DIR)) else { return 0 };
    entries.map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_promptly_keeps_partials_and_the_next_run_resumes() {
    let (hub, root) = (hub(), Root::new("cancel"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let opts = Options { multipart_threshold_bytes: 2 << 20, stall_timeout_ms: 30_000, ..opts(&hub) };
    for path in [LFS, BIG] {
        let stall =
            Fault::Stall { repo: REPO.into(), path: path.into(), after_bytes: 200_000, stall_ms: 60_000, count: 8 };
        hub.faults().add(stall);
    }
    let (ended, took) = run_cancelled(job(&root, "main"), &opts, || {
        hub.bytes_served(REPO, LFS) >= 200_000 && hub.bytes_served(REPO, BIG) >= 4 * 200_000
    })
    .await;
    assert_eq!(ended.result, Err(DownloadError::Cancelled));
    assert!(took < Duration::from_secs(1), "the cancel took {took:?}");
    assert!(ended.marked && marker_uid(&root.dest()).as_deref() == Some(UID));
    assert!(partial_bytes(&root.dest()) > 0, "partial files are kept");
    let records = std::fs::read_dir(root.dest().join(PARTIAL_DIR)).unwrap();
    let records = records.filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".parts"));
    assert_eq!(records.count(), 1, "the big file's parts are recorded");
    hub.faults().clear();
    finished(run(job(&root, "main"), &opts).await.0);
    assert_all_files(&hub, &root.dest(), &commit);
    for (path, size) in [(LFS, LFS_BYTES), (BIG, BIG_BYTES)] {
        let served = hub.bytes_served(REPO, path);
        assert!(served <= size + size / 10, "{path}: served {served} for {size}");
    }
}

/// A finished download's files (no marker, manifest or partials) copied into a fresh root.
fn foreign_copy(hub: &FakeHub, name: &str) -> Root {
    let root = Root::new(name);
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    for path in hub.paths(REPO, &commit).unwrap() {
        let target = root.dest().join(&path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, hub.file(REPO, &commit, &path).unwrap().content.to_vec().unwrap()).unwrap();
    }
    root
}

#[tokio::test]
async fn a_directory_without_a_marker_is_adopted_and_only_wrong_files_are_refetched() {
    let hub = hub();
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let files = hub.paths(REPO, &commit).unwrap().len() as u64;
    let root = foreign_copy(&hub, "adopt");
    let done = finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert_eq!((done.bytes_fetched, done.adopted_files, served_all(&hub)), (0, files, 0));
    assert_eq!(marker_uid(&root.dest()).as_deref(), Some(UID));
    let root = foreign_copy(&hub, "adopt-corrupt");
    let mut bytes = std::fs::read(root.dest().join(LFS)).unwrap();
    bytes[1234] ^= 0xff;
    std::fs::write(root.dest().join(LFS), bytes).unwrap();
    std::fs::write(root.dest().join("extra.bin"), "unrelated").unwrap();
    hub.clear_requests();
    let done = finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert_eq!((done.bytes_fetched, done.adopted_files), (LFS_BYTES, files - 1));
    assert_eq!(served_all(&hub), LFS_BYTES);
    assert_all_files(&hub, &root.dest(), &commit);
    assert_eq!(std::fs::read_to_string(root.dest().join("extra.bin")).unwrap(), "unrelated");
}

#[tokio::test]
async fn another_uids_directory_is_never_written() {
    let (hub, root) = (hub(), Root::new("other"));
    std::fs::create_dir_all(root.dest()).unwrap();
    std::fs::write(root.dest().join(MARKER), r#"{"uid":"uid-2","key":"BaseModel/ns/x"}"#).unwrap();
    let ended = run(job(&root, "main"), &opts(&hub)).await.0;
    assert!(!ended.marked);
    let error = ended.result.unwrap_err();
    assert_eq!(error, DownloadError::OwnedByOther { uid: "uid-2".into(), path: "models/m".into() });
    assert!(error.reason().contains("uid-2"), "{}", error.reason());
    let names: Vec<_> = std::fs::read_dir(root.dest()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from(MARKER)]);
    assert!(hub.requests().is_empty(), "the Hub is not even asked");
}

/// Same-path reuse (#10): a second model with the same source and path finds the first one's
/// marker, checks the files in place (fetching nothing) and the marker then names both owners.
#[tokio::test]
async fn a_co_owner_finds_the_files_in_place_and_the_marker_then_names_both() {
    let (hub, root) = (hub(), Root::new("co-owned"));
    let first = finished(run(job(&root, "main"), &opts(&hub)).await.0);
    let served = served_all(&hub);
    let second = Job { uid: "uid-2".into(), co_owners: vec![UID.into()], ..job(&root, "main") };
    let done = finished(run(second, &opts(&hub)).await.0);
    assert_eq!((done.commit, done.bytes_fetched), (first.commit, 0));
    assert_eq!(served_all(&hub), served, "nothing fetched again");
    let text = std::fs::read_to_string(root.dest().join(MARKER)).unwrap();
    let marker: crate::fsops::Marker = serde_json::from_str(&text).unwrap();
    let mut named: Vec<&str> = marker.uids().collect();
    named.sort_unstable();
    assert_eq!(named, vec![UID, "uid-2"]);
    // A model that shares with neither is still refused.
    let stranger = Job { uid: "uid-3".into(), co_owners: vec!["uid-4".into()], ..job(&root, "main") };
    let error = run(stranger, &opts(&hub)).await.0.result.unwrap_err();
    assert!(matches!(error, DownloadError::OwnedByOther { .. }), "{error}");
}

/// The marker records the reserve label of the model downloading as it carries it now, at its
/// first download and at every re-check after (a label added or removed since), and keeps a
/// co-owner's record as it was; nothing is fetched again for it.
#[tokio::test]
async fn the_marker_records_the_reserve_label_at_every_download() {
    let (hub, root) = (hub(), Root::new("reserve-recorded"));
    let recorded = |root: &Root| {
        let text = std::fs::read_to_string(root.dest().join(MARKER)).unwrap();
        serde_json::from_str::<crate::fsops::Marker>(&text).unwrap().reserved
    };
    finished(run(Job { reserve: true, ..job(&root, "main") }, &opts(&hub)).await.0);
    assert_eq!(recorded(&root), [UID]);
    let served = served_all(&hub);
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert!(recorded(&root).is_empty(), "the label was removed since");
    let second = Job { uid: "uid-2".into(), co_owners: vec![UID.into()], reserve: true, ..job(&root, "main") };
    finished(run(second, &opts(&hub)).await.0);
    assert_eq!(recorded(&root), ["uid-2"]);
    let first_again = Job { co_owners: vec!["uid-2".into()], reserve: true, ..job(&root, "main") };
    finished(run(first_again, &opts(&hub)).await.0);
    assert_eq!(recorded(&root), [UID, "uid-2"], "the co-owner's record is kept");
    assert_eq!(served_all(&hub), served, "nothing fetched again");
}

fn marker_uids(root: &Root) -> Vec<String> {
    let text = std::fs::read_to_string(root.dest().join(MARKER)).unwrap();
    let marker: crate::fsops::Marker = serde_json::from_str(&text).unwrap();
    let mut named: Vec<String> = marker.uids().map(str::to_string).collect();
    named.sort_unstable();
    named
}

/// Before the core's first snapshot it does not know what a marker names: a re-check then keeps
/// every uid the marker named (a model whose keys another holds may own the files), and after
/// it the marker names exactly the owners the core gives.
#[tokio::test]
async fn a_re_check_before_the_first_snapshot_keeps_the_uids_the_marker_named() {
    let (hub, root) = (hub(), Root::new("keep-marked"));
    let held = Job { uid: "uid-held".into(), co_owners: vec![UID.into()], ..job(&root, "main") };
    finished(run(held, &opts(&hub)).await.0);
    assert_eq!(marker_uids(&root), vec![UID, "uid-held"]);
    let early = Job { keep_marked: true, ..job(&root, "main") };
    finished(run(early, &opts(&hub)).await.0);
    assert_eq!(marker_uids(&root), vec![UID, "uid-held"], "the held uid stays named");
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert_eq!(marker_uids(&root), vec![UID], "once the core knows, exactly its owners");
}

/// A model whose source changed while the agent was down, in a directory it shared with another:
/// before the core's first snapshot, a marker naming a uid the core did not give, over files of
/// another source, is left alone (the other may be live and not yet known); once the core knows
/// (its co-owners, or after the snapshot) the download goes ahead.
#[tokio::test]
async fn before_the_first_snapshot_files_of_another_source_that_an_unknown_uid_holds_are_not_overwritten() {
    const OTHER: &str = "org/other";
    let other = RepoFixture::new(OTHER).commit("d1", commit_files("other")).branch("main", "d1");
    let repo = RepoFixture::new(REPO).commit("c2", commit_files("two")).branch("main", "c2");
    let hub = FakeHub::start_with(Fixtures::new().repo(repo).repo(other), Config::default()).unwrap();
    let root = Root::new("other-source");
    let held = Job { uid: "uid-held".into(), co_owners: vec![UID.into()], ..job(&root, "main") };
    let commit = finished(run(held, &opts(&hub)).await.0).commit;
    let asked = hub.requests().len();
    let moved = Job { repo_id: OTHER.into(), keep_marked: true, ..job(&root, "main") };
    let ended = run(moved.clone(), &opts(&hub)).await.0;
    let error = ended.result.unwrap_err();
    let source = format!("{REPO}@main");
    let expected = DownloadError::HeldFromOtherSource { uid: "uid-held".into(), path: "models/m".into(), source };
    assert_eq!(error, expected);
    assert!(error.reason().contains("uid-held") && error.reason().contains(REPO), "{}", error.reason());
    assert!(!ended.marked);
    assert_eq!(hub.requests().len(), asked, "the Hub is not even asked");
    assert_all_files(&hub, &root.dest(), &commit);
    assert_eq!(marker_uids(&root), vec![UID, "uid-held"], "the marker is not rewritten");
    // Both moved to the new source: the core gives the other as a co-owner.
    let both = Job { co_owners: vec!["uid-held".into()], ..moved.clone() };
    finished(run(both, &opts(&hub)).await.0);
    assert_eq!(marker_uids(&root), vec![UID, "uid-held"]);
    let config = || std::fs::read_to_string(root.dest().join("config.json")).unwrap();
    assert_eq!(config(), r#"{"v":"other"}"#);
    // Once the core knows (after its snapshot), any marker: the core's own rule has decided.
    let known = Job { repo_id: REPO.into(), keep_marked: false, ..moved.clone() };
    finished(run(known, &opts(&hub)).await.0);
    assert_eq!((marker_uids(&root), config()), (vec![UID.to_string()], r#"{"v":"two"}"#.to_string()));
    // A marker naming only this uid: its own files to replace, snapshot or not.
    finished(run(moved, &opts(&hub)).await.0);
    assert_eq!(config(), r#"{"v":"other"}"#);
}

/// A live model of another source that the core names (`other_source`) keeps the files its
/// marker may give it, snapshot or not, whether the change was of repository or of revision
/// only; a download of the files' own source goes ahead. Before the snapshot, a directory with
/// no manifest (an update cut short) counts as another source's.
#[tokio::test]
async fn files_of_another_source_a_live_model_named_in_the_marker_may_use_are_not_overwritten() {
    let (hub, root) = (hub(), Root::new("named-other"));
    let held = Job { uid: "uid-held".into(), co_owners: vec![UID.into()], ..job(&root, "main") };
    let commit = finished(run(held, &opts(&hub)).await.0).commit;
    let moved = Job { other_source: vec!["uid-held".into()], ..job(&root, "old") };
    let error = run(moved.clone(), &opts(&hub)).await.0.result.unwrap_err();
    let source = format!("{REPO}@main");
    assert_eq!(error, DownloadError::HeldFromOtherSource { uid: "uid-held".into(), path: "models/m".into(), source });
    assert_all_files(&hub, &root.dest(), &commit);
    // A manifest written before revisions were kept is taken by its repository.
    let manifest_text = std::fs::read_to_string(root.dest().join(MANIFEST)).unwrap();
    let mut manifest: serde_json::Value = serde_json::from_str(&manifest_text).unwrap();
    assert_eq!(manifest["revision"], "main");
    manifest.as_object_mut().unwrap().remove("revision");
    std::fs::write(root.dest().join(MANIFEST), manifest.to_string()).unwrap();
    let moved_repo = Job { repo_id: "org/gone".into(), ..moved.clone() };
    let error = run(moved_repo, &opts(&hub)).await.0.result.unwrap_err();
    assert!(
        matches!(&error, DownloadError::HeldFromOtherSource { source, .. } if *source == format!("{REPO}@{commit}"))
    );
    // Before the snapshot, no manifest: refused too. After it, no manifest is not another
    // source's (two models of different sources would refuse each other's cut directory).
    std::fs::remove_file(root.dest().join(MANIFEST)).unwrap();
    let early = Job { keep_marked: true, ..moved.clone() };
    let error = run(early, &opts(&hub)).await.0.result.unwrap_err();
    assert!(matches!(&error, DownloadError::HeldFromOtherSource { source, .. } if source == "an unfinished download"));
    assert_all_files(&hub, &root.dest(), &commit);
    // Its own source's files: checked in place; the marker then names its owners only.
    let same = Job { other_source: vec!["uid-held".into()], ..job(&root, "main") };
    let done = finished(run(same, &opts(&hub)).await.0);
    assert_eq!((done.commit, marker_uids(&root)), (commit, vec![UID.to_string()]));
}

/// `Op::Resolve` when the Hub cannot answer: the copy a model's symlink points at stands in
/// only while it is complete.
#[tokio::test]
async fn a_linked_copy_stands_in_for_the_hub_only_while_complete() {
    let (hub, root) = (hub(), Root::new("linked-copy"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let copy = format!("{}/{REPO}/{commit}", crate::links::ARTIFACTS);
    finished(run(Job { dest_rel: copy.clone(), ..job(&root, &commit) }, &opts(&hub)).await.0);
    assert_eq!(crate::links::make_link(&root.0, "team/m", &copy), Ok(crate::links::Linked::Made));
    assert_eq!(super::complete_copy_of_link(&root.0, "team/m", REPO), Some(commit.clone()));
    assert_eq!(super::complete_copy_of_link(&root.0, "team/m", "org/other"), None, "another repo");
    assert_eq!(super::complete_copy_of_link(&root.0, "nothing/here", REPO), None);
    let path = hub.paths(REPO, &commit).unwrap().into_iter().next().unwrap();
    std::fs::write(root.0.join(&copy).join(&path), b"cut").unwrap();
    assert_eq!(super::complete_copy_of_link(&root.0, "team/m", REPO), None, "a file's size is off");
}

#[tokio::test]
async fn too_little_space_fails_before_the_first_byte_and_names_the_root() {
    let (hub, root) = (hub(), Root::new("space"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let size = repo_bytes(&hub, &commit);
    FREE_BYTES.lock().unwrap().push((root.0.display().to_string(), size));
    let ended = run(job(&root, "main"), &opts(&hub)).await.0;
    let Err(DownloadError::NoSpace { needed_bytes, free_bytes, .. }) = &ended.result else {
        panic!("{:?}", ended.result);
    };
    assert_eq!((*needed_bytes, *free_bytes), (size + size / 100, size), "1 % beyond the bytes to fetch");
    let reason = ended.result.as_ref().unwrap_err().reason();
    assert!(reason.starts_with("needs ") && reason.ends_with(&format!("GiB free on {}", root.0.display())), "{reason}");
    assert!(!ended.marked && !root.dest().exists(), "nothing is left behind");
    assert_eq!(served_all(&hub), 0);
    FREE_BYTES.lock().unwrap().retain(|(r, _)| *r != root.0.display().to_string());
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
}

fn ranged_cdn_requests(hub: &FakeHub) -> Vec<String> {
    let requests = hub.requests().into_iter().filter(|r| r.listener == Listener::Cdn && r.uri.contains("weights.bin"));
    requests.filter_map(|r| r.range).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_file_comes_in_ranged_parts_or_in_one_stream_when_ranges_are_ignored() {
    let hub = hub();
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let opts = Options { multipart_threshold_bytes: 2 << 20, ..opts(&hub) };
    let root = Root::new("parts");
    finished(run(job(&root, "main"), &opts).await.0);
    assert_all_files(&hub, &root.dest(), &commit);
    let mut ranges = ranged_cdn_requests(&hub);
    ranges.sort();
    let part = BIG_BYTES / 4;
    let mut expected: Vec<String> = (0..4).map(|i| format!("bytes={}-{}", i * part, (i + 1) * part - 1)).collect();
    expected.sort();
    assert_eq!(ranges, expected);
    assert_eq!(hub.bytes_served(REPO, BIG), BIG_BYTES);
    for count in [1, 100] {
        hub.clear_requests();
        hub.faults().add(Fault::IgnoreRange { repo: REPO.into(), path: BIG.into(), count });
        let root = Root::new(&format!("parts-ignored-{count}"));
        finished(run(job(&root, "main"), &opts).await.0);
        assert_all_files(&hub, &root.dest(), &commit);
        let whole = hub.requests().iter().filter(|r| r.uri.contains("weights.bin") && r.status == 200).count();
        assert!(whole >= 1, "a 200 was answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_parts_resume_in_the_same_run_and_a_wrong_whole_is_fetched_again() {
    let hub = hub();
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    let opts = Options { multipart_threshold_bytes: 2 << 20, stall_timeout_ms: 300, ..opts(&hub) };
    let stall = Fault::Stall { repo: REPO.into(), path: BIG.into(), after_bytes: 100_000, stall_ms: 30_000, count: 4 };
    hub.faults().add(stall);
    let root = Root::new("parts-stalled");
    finished(run(job(&root, "main"), &opts).await.0);
    assert_all_files(&hub, &root.dest(), &commit);
    let served = hub.bytes_served(REPO, BIG);
    assert!(served <= BIG_BYTES + BIG_BYTES / 10, "served {served} for {BIG_BYTES}");
    hub.clear_requests();
    // Every part's body is marked corrupt; only the part holding the middle byte has it flipped.
    hub.faults().add(Fault::Corrupt { repo: REPO.into(), path: BIG.into(), count: 4 });
    let root = Root::new("parts-corrupt");
    finished(run(job(&root, "main"), &opts).await.0);
    assert_all_files(&hub, &root.dest(), &commit);
    assert_eq!(hub.bytes_served(REPO, BIG), 2 * BIG_BYTES, "the parts are hashed as a whole, then fetched again");
}

#[tokio::test]
async fn rate_limits_are_waited_out_as_retry_after_says() {
    let (hub, root) = (hub(), Root::new("429"));
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 1, scope: Scope::Hub });
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 1, scope: Scope::Cdn });
    let started = Instant::now();
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert!(started.elapsed() >= Duration::from_secs(2), "both waits are honoured: {:?}", started.elapsed());
    let limited = hub.requests().iter().filter(|r| r.status == 429).count();
    assert_eq!(limited, 2);
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 3_600, scope: Scope::Hub });
    let error = run(job(&Root::new("429-long"), "main"), &opts(&hub)).await.0.result.unwrap_err();
    assert_eq!(error.retry_after_ms(), Some(3_600_000), "a long wait goes back to the core");
}

#[tokio::test]
async fn a_hub_that_is_down_leaves_a_complete_model_finished_from_its_manifest() {
    let (hub, root) = (hub(), Root::new("down"));
    let commit = hub.commit_sha(REPO, "c2").unwrap();
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    hub.faults().add(Fault::ServerError { count: 10_000, status: 503, scope: Scope::All });
    let opts = Options { request_attempts_max: 2, ..opts(&hub) };
    for revision in ["main", commit.as_str()] {
        let done = finished(run(job(&root, revision), &opts).await.0);
        assert_eq!((done.commit.as_str(), done.bytes_fetched), (commit.as_str(), 0));
    }
    let other_sha = hub.commit_sha(REPO, "c1").unwrap();
    let ended = run(job(&root, &other_sha), &opts).await.0;
    assert!(matches!(ended.result, Err(DownloadError::Hub(HfError::Server { status: 503, .. }))));
    hub.faults().clear();
    let once = Options { request_attempts_max: 1, ..opts.clone() };
    hub.faults().add(Fault::Truncate { repo: REPO.into(), path: "config.json".into(), after_bytes: 1, count: 20 });
    assert!(run(job(&root, "old"), &once).await.0.result.is_err(), "the move to c1 is cut short");
    hub.faults().add(Fault::ServerError { count: 10_000, status: 503, scope: Scope::All });
    let ended = run(job(&root, "main"), &opts).await.0;
    assert!(ended.result.is_err(), "a directory between two commits is not finished from the old manifest");
    hub.faults().clear();
    finished(run(job(&root, "main"), &opts).await.0);
    hub.faults().add(Fault::ServerError { count: 10_000, status: 503, scope: Scope::All });
    std::fs::remove_file(root.dest().join("config.json")).unwrap();
    let ended = run(job(&root, "main"), &opts).await.0;
    assert!(matches!(ended.result, Err(DownloadError::Hub(HfError::Server { .. }))), "sizes no longer match");
}

#[tokio::test]
async fn symlinks_in_the_destination_are_never_followed() {
    let (hub, root) = (hub(), Root::new("symlinks"));
    let outside = root.0.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("precious"), "keep").unwrap();
    std::fs::create_dir_all(root.dest()).unwrap();
    std::os::unix::fs::symlink(outside.join("precious"), root.dest().join("config.json")).unwrap();
    std::os::unix::fs::symlink(&outside, root.dest().join("sub")).unwrap();
    let ended = run(job(&root, "main"), &opts(&hub)).await.0;
    let Err(DownloadError::Disk(reason)) = &ended.result else { panic!("{:?}", ended.result) };
    assert!(reason.contains("symlink"), "{reason}");
    std::fs::remove_file(root.dest().join("sub")).unwrap();
    finished(run(job(&root, "main"), &opts(&hub)).await.0);
    assert!(!root.dest().join("config.json").is_symlink(), "a symlink at a file's name is replaced, not followed");
    assert_eq!(std::fs::read_to_string(outside.join("precious")).unwrap(), "keep");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing was written outside");
    std::fs::remove_dir_all(root.dest()).unwrap();
    std::os::unix::fs::symlink(&outside, root.dest()).unwrap();
    let ended = run(job(&root, "main"), &opts(&hub)).await.0;
    assert!(matches!(ended.result, Err(DownloadError::Disk(_))) && !ended.marked, "{:?}", ended.result);
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "a symlinked destination is refused");
}

#[test]
fn a_read_only_filesystem_is_its_own_error() {
    assert_eq!(disk::disk_error("models/m", nix::errno::Errno::EROFS), DownloadError::ReadOnly);
    let other = disk::disk_error("models/m", nix::errno::Errno::EACCES);
    assert!(matches!(&other, DownloadError::Disk(reason) if reason.starts_with("models/m: ")), "{other:?}");
}

#[test]
fn reasons_never_hold_the_token_and_slow_retries_are_five_minutes() {
    let gated = DownloadError::Hub(HfError::Gated { repo_id: REPO.into(), token_sent: true });
    assert_eq!(gated.retry_after_ms(), Some(300_000));
    let limited = DownloadError::Hub(HfError::RateLimited { retry_after_ms: Some(7_000) });
    assert_eq!(limited.retry_after_ms(), Some(7_000));
    let space = DownloadError::NoSpace { needed_bytes: 3 << 30, free_bytes: 1 << 29, root: "/mnt/models".into() };
    assert_eq!(space.reason(), "needs 3.0 GiB, 0.5 GiB free on /mnt/models");
}

#[test]
fn the_download_future_can_be_spawned() {
    fn spawnable<T: Send + 'static>(_: &T) {}
    let opts = Box::leak(Box::new(Options::default()));
    let report: &'static mut (dyn FnMut(Progress) + Send) = Box::leak(Box::new(|_: Progress| {}));
    let root = Root::new("send");
    let work = download(job(&root, "main"), opts, report, watch::channel(false).1);
    spawnable(&work);
}

const UPLOADED_BYTES: u64 = 200_000;

/// The fake OCI store with `m/w.bin` (`UPLOADED_BYTES`, from `seed`) and, with `small`,
/// `m/a.bin` (its bytes and seed), both uploaded in parts (checked by size only); with `cut`,
/// every read of `w.bin` ends half-way.
fn uploaded_in_parts(seed: u64, small: Option<(u64, u64)>, cut: bool) -> model_agent_fakeoci::FakeOci {
    use model_agent_fakeoci::{BucketFixture, FakeOci, Fault, Fixtures, ObjectFixture};
    let mut bucket =
        BucketFixture::new("models").object(ObjectFixture::generated("m/w.bin", UPLOADED_BYTES, seed).multipart(2));
    if let Some((small_bytes, small_seed)) = small {
        bucket = bucket.object(ObjectFixture::generated("m/a.bin", small_bytes, small_seed).multipart(2));
    }
    let oci = FakeOci::start(Fixtures::new().bucket(bucket)).unwrap();
    if cut {
        let (bucket, object) = ("models".into(), "m/w.bin".into());
        oci.faults().add(Fault::Truncate { bucket, object, after_bytes: UPLOADED_BYTES / 2, count: 100 });
    }
    oci
}

/// A job downloading `oci://…/models/o/m` from `oci` into `root`.
fn oci_job(oci: &model_agent_fakeoci::FakeOci, root: &Root) -> Job {
    use model_agent_fakeoci::test_keys;
    let net = crate::store::Net::new(&Default::default(), 2_000, 2_000).unwrap();
    let namespace = oci.namespace().into();
    let uri = model_agent_core::storage_uri::StorageUri::Oci { namespace, bucket: "models".into(), prefix: "m".into() };
    let strings = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let auth = crate::store::StoreAuth {
        parameters: strings(&[("auth", "UserPrincipal"), ("endpoint", oci.endpoint())]),
        secret: strings(&[
            ("tenancy", test_keys::TENANCY),
            ("user", test_keys::USER),
            ("fingerprint", test_keys::FINGERPRINT),
            ("privateKey", test_keys::PRIVATE_KEY_PEM),
        ]),
        secret_name: None,
        model_format: None,
        metadata_type: None,
    };
    let store = crate::store::open(&uri, &auth, &net).unwrap();
    Job { repo_id: store.label.clone(), store: Some(std::sync::Arc::new(store)), ..job(root, "main") }
}

/// A review (of the size-only versions): an object checked by size only (OCI, uploaded in
/// parts) is cut half-way; it is uploaded again (same size, another ETag) before the next
/// attempt. That attempt keeps the new version apart under another partial name, as it should,
/// but the old version's partial stayed beside it for as long as the download did not finish:
/// every re-upload during an unfinished download left one more (a multipart partial is
/// preallocated to the object's full size), and on a root with room for one copy the space
/// check then failed for good.
#[tokio::test]
async fn the_partial_of_an_object_uploaded_again_is_not_kept_beside_the_new_version() {
    let root = Root::new("uploaded-again");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    let first = uploaded_in_parts(3, None, true);
    let ended = run(oci_job(&first, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    let partial_file =
        |e: &std::fs::DirEntry| e.file_name().to_str().is_some_and(|n| n.len() == 40 && !n.contains('.'));
    let partials = || std::fs::read_dir(root.dest().join(PARTIAL_DIR)).unwrap().flatten().filter(partial_file).count();
    assert_eq!(partials(), 1, "the first version's partial");
    // Uploaded again: same name, same size, other bytes and ETag.
    drop(first);
    let second = uploaded_in_parts(4, None, true);
    let ended = run(oci_job(&second, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut again: {:?}", ended.result.as_ref().map(|_| ()));
    assert_eq!(
        (partials(), partial_bytes(&root.dest())),
        (1, UPLOADED_BYTES / 2),
        "the first version's partial is kept beside the second's, and counts against the space check"
    );
}

/// A review (of the size-only versions): the same re-upload, but the model has two objects
/// checked by size only (a checkpoint of one shape: same sizes). The first attempt places the
/// small one and is cut in the big one; both are uploaded again; the next attempt kept the
/// placed file of the first upload (its size matched: `files_in_place`), fetched the big one of
/// the second, and wrote a manifest for a model made of two uploads.
#[tokio::test]
async fn a_file_placed_from_an_earlier_upload_is_not_kept_in_a_model_of_the_new_one() {
    use model_agent_fakeoci::pattern_bytes;
    let root = Root::new("two-uploads");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    let first = uploaded_in_parts(3, Some((1_000, 13)), true);
    let ended = run(oci_job(&first, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    let placed = std::fs::read(root.dest().join("a.bin")).expect("a.bin placed by the first attempt");
    assert_eq!(placed, pattern_bytes(13, 0, 1_000), "the first upload's a.bin");
    drop(first);
    let second = uploaded_in_parts(4, Some((1_000, 14)), false);
    finished(run(oci_job(&second, &root), &opts).await.0);
    let w = std::fs::read(root.dest().join("w.bin")).unwrap();
    assert_eq!(w, pattern_bytes(4, 0, UPLOADED_BYTES as usize), "the second upload's w.bin");
    let a = std::fs::read(root.dest().join("a.bin")).unwrap();
    assert!(
        a == pattern_bytes(14, 0, 1_000),
        "a.bin is still the first upload's beside the second upload's w.bin: a model of two uploads"
    );
}

/// A review (of the placed records): a size-only file adopted by its size in an attempt that
/// did not finish (a pre-filled directory, or a Ready model whose listing gained a file) had no
/// `.placed` record: the next attempt found the partial directory that attempt made and fetched
/// it again whole, though it is the version listed and was accepted one attempt earlier; on a
/// root with room for what is left of w.bin but not for a.bin again (its copy on disk does not
/// count), every attempt failed with NoSpace.
#[tokio::test]
async fn a_file_adopted_in_an_unfinished_attempt_is_not_fetched_again() {
    const A: u64 = 1_000_000;
    let root = Root::new("review-adopted-refetch");
    std::fs::create_dir_all(root.dest()).unwrap();
    std::fs::write(root.dest().join("a.bin"), model_agent_fakeoci::pattern_bytes(13, 0, A as usize)).unwrap();
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    let oci = uploaded_in_parts(3, Some((A, 13)), true);
    let ended = run(oci_job(&oci, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    assert_eq!(oci.bytes_served("models", "m/a.bin"), 0, "a.bin adopted by size in the first attempt");
    oci.faults().clear();
    FREE_BYTES.lock().unwrap().push((root.0.display().to_string(), 500_000));
    let ended = run(oci_job(&oci, &root), &opts).await.0;
    FREE_BYTES.lock().unwrap().retain(|(r, _)| *r != root.0.display().to_string());
    let done = finished(ended);
    assert_eq!(
        (oci.bytes_served("models", "m/a.bin"), done.adopted_files),
        (0, 1),
        "a.bin, adopted one attempt earlier as the same version, is fetched again whole"
    );
}

/// A review (of the placed records): the agent killed after a.bin's `.placed` record was written
/// and before the rename that places it (the record is written first: a kill after the rename
/// left a placed file with no record, fetched again whole and, on a root without room for two
/// copies, failing the space check for good). The path holds a file of the first upload, of the
/// same size: the record names the partial file's inode, not that file's, so it is not kept; the
/// next attempt places the partial, whose bytes count in the space check.
#[tokio::test]
async fn a_kill_between_a_record_and_its_rename_keeps_no_other_file_and_needs_no_space_again() {
    const A: u64 = 1_000_000;
    let root = Root::new("kill-before-rename");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    let oci = uploaded_in_parts(3, Some((A, 14)), true);
    let ended = run(oci_job(&oci, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    let partial_dir = root.dest().join(PARTIAL_DIR);
    let records: Vec<String> = std::fs::read_dir(&partial_dir)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".placed")).map(str::to_owned))
        .collect();
    assert_eq!(records.len(), 1, "a.bin's record");
    // Undo the rename, and put a file of the first upload at the path.
    std::fs::rename(root.dest().join("a.bin"), partial_dir.join(&records[0])).unwrap();
    std::fs::write(root.dest().join("a.bin"), model_agent_fakeoci::pattern_bytes(13, 0, A as usize)).unwrap();
    oci.faults().clear();
    FREE_BYTES.lock().unwrap().push((root.0.display().to_string(), 500_000));
    let ended = run(oci_job(&oci, &root), &opts).await.0;
    FREE_BYTES.lock().unwrap().retain(|(r, _)| *r != root.0.display().to_string());
    assert!(ended.result.is_ok(), "500 kB free, 100 kB of w.bin left to fetch: {:?}", ended.result.map(|_| ()));
    let a = std::fs::read(root.dest().join("a.bin")).unwrap();
    assert!(a == model_agent_fakeoci::pattern_bytes(14, 0, A as usize), "a.bin is the upload listed");
    assert_eq!(oci.bytes_served("models", "m/a.bin"), A, "a.bin fetched once, by the first attempt");
}

/// `root`'s model downloaded whole from a store where a.bin (`a_bytes`) is of upload 13.
async fn ready_on_the_first_upload(root: &Root, opts: &Options, a_bytes: u64) {
    let first = uploaded_in_parts(3, Some((a_bytes, 13)), false);
    finished(run(oci_job(&first, root), opts).await.0);
}

/// a.bin on disk is upload 14's (the one `oci` lists), not upload 13's.
fn assert_a_is_the_second_upload(root: &Root, a_bytes: u64, oci: &model_agent_fakeoci::FakeOci) {
    use model_agent_fakeoci::pattern_bytes;
    let a = std::fs::read(root.dest().join("a.bin")).unwrap();
    assert!(
        a == pattern_bytes(14, 0, a_bytes as usize),
        "a.bin is the first upload's ({}) while the listing names the second's; a.bin bytes served: {}",
        a == pattern_bytes(13, 0, a_bytes as usize),
        oci.bytes_served("models", "m/a.bin")
    );
}

/// The Ready model's w.bin is lost on disk and a.bin uploaded again (upload 14, same size): an
/// attempt cut in w.bin, then one that finishes; a.bin must then be upload 14's.
async fn w_lost_and_a_uploaded_again(root: &Root, opts: &Options, a_bytes: u64) {
    std::fs::remove_file(root.dest().join("w.bin")).unwrap();
    let second = uploaded_in_parts(3, Some((a_bytes, 14)), true);
    let ended = run(oci_job(&second, root), opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    second.faults().clear();
    finished(run(oci_job(&second, root), opts).await.0);
    assert_a_is_the_second_upload(root, a_bytes, &second);
}

/// A review (of the placed records): a Ready model's w.bin is lost on disk and a.bin is uploaded again (same size, other
/// bytes and ETag: the listing's digest is unchanged). The attempt keeps a.bin by the trusted
/// manifest (which knows no ETag) and `Dest::record_kept` records it as the version listed now;
/// it is cut, and the next attempt kept the first upload's a.bin by that record beside the
/// listing's new ETag. The manifest now keeps each size-only file's ETag: one it names another
/// version by is fetched again.
#[tokio::test]
async fn a_file_kept_by_the_manifest_is_not_recorded_as_the_version_listed() {
    const A: u64 = 1_000;
    let root = Root::new("trusted-recorded");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    assert!(root.dest().join(MANIFEST).exists());
    w_lost_and_a_uploaded_again(&root, &opts, A).await;
}

/// A review (of the inode records): a node reboot (or a remount of the models root) between two attempts gives the
/// filesystem another st_dev (NFS, overlayfs and btrfs get an anonymous device number at each
/// mount; device-mapper minors follow activation order). a.bin, placed and recorded by the first
/// attempt as the version listed, is the same file, same inode: only the device number in its
/// record differs. It is fetched again whole, and on a root with room for what is left of w.bin
/// but not for a.bin again, every attempt fails with NoSpace (the record is removed as stale).
#[tokio::test]
async fn a_remount_that_renumbers_the_device_never_fails_the_space_check_for_good() {
    const A: u64 = 1_000_000;
    let root = Root::new("remount");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    let oci = uploaded_in_parts(3, Some((A, 14)), true);
    let ended = run(oci_job(&oci, &root), &opts).await.0;
    assert!(ended.result.is_err(), "cut: {:?}", ended.result.as_ref().map(|_| ()));
    let partial_dir = root.dest().join(PARTIAL_DIR);
    let record = std::fs::read_dir(&partial_dir)
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(".placed")))
        .expect("a.bin's record")
        .path();
    // A remount keeps the inode and may renumber the device: the record names the inode alone
    // (with the device in it, every later attempt fetched a.bin again and failed for space).
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(root.dest().join("a.bin")).unwrap().ino();
    assert_eq!(std::fs::read_to_string(&record).unwrap(), ino.to_string(), "the record names the inode alone");
    oci.faults().clear();
    FREE_BYTES.lock().unwrap().push((root.0.display().to_string(), 500_000));
    let first = run(oci_job(&oci, &root), &opts).await.0;
    let second = run(oci_job(&oci, &root), &opts).await.0;
    FREE_BYTES.lock().unwrap().retain(|(r, _)| *r != root.0.display().to_string());
    assert!(
        first.result.is_ok() || second.result.is_ok(),
        "500 kB free, 100 kB of w.bin left to fetch, a.bin placed as listed: {:?} then {:?}",
        first.result.map(|_| ()),
        second.result.map(|_| ())
    );
}

/// A review (of the inode records): the same as `a_file_kept_by_the_manifest_is_not_recorded_as_the_version_listed`,
/// but the Ready model's manifest was written by the agent before this change (no `etag`): every
/// Ready model at the upgrade has one. a.bin of the first upload is kept by it and recorded as
/// the version listed now; the model ends with the first upload's a.bin.
#[tokio::test]
async fn a_manifest_from_before_the_etags_does_not_vouch_for_a_file_uploaded_again() {
    const A: u64 = 1_000;
    let root = Root::new("upgrade-manifest");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    // The manifest as the agent before the upgrade wrote it.
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.dest().join(MANIFEST)).unwrap()).unwrap();
    for file in manifest["files"].as_array_mut().unwrap() {
        file.as_object_mut().unwrap().remove("etag");
    }
    std::fs::write(root.dest().join(MANIFEST), manifest.to_string()).unwrap();
    w_lost_and_a_uploaded_again(&root, &opts, A).await;
}

/// A review (of the inode records): a Ready model (its manifest names a.bin's ETag) whose listing changes (a file is
/// added: another digest, so the manifest is not of the commit listed) while a.bin is uploaded
/// again at the same size. The manifest that says which version a.bin is is not consulted:
/// a.bin is adopted by its size (no download under way), recorded as the version listed, and
/// the model ends with the first upload's a.bin beside the new listing's other files.
#[tokio::test]
async fn a_manifest_of_another_listing_still_says_which_version_a_file_is() {
    use model_agent_fakeoci::{BucketFixture, FakeOci, Fixtures, ObjectFixture};
    const A: u64 = 1_000;
    let root = Root::new("other-listing");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    let bucket = BucketFixture::new("models")
        .object(ObjectFixture::generated("m/w.bin", UPLOADED_BYTES, 3).multipart(2))
        .object(ObjectFixture::generated("m/a.bin", A, 14).multipart(2))
        .object(ObjectFixture::generated("m/config.json", 100, 7));
    let second = FakeOci::start(Fixtures::new().bucket(bucket)).unwrap();
    finished(run(oci_job(&second, &root), &opts).await.0);
    assert_a_is_the_second_upload(&root, A, &second);
}

/// A review (of the stored manifests): a Ready model's manifest of another listing that does not list a.bin (it was
/// deleted from the bucket for a while: the file stayed on disk, the agent removes no unlisted
/// file). a.bin is uploaded again at the same size: no manifest entry decides, no download is
/// under way (no partial directory), and the first upload's a.bin is kept by its size.
#[tokio::test]
async fn a_manifest_without_the_path_does_not_let_an_old_upload_be_kept() {
    use model_agent_fakeoci::{BucketFixture, FakeOci, Fixtures, ObjectFixture};
    const A: u64 = 1_000;
    let root = Root::new("r5-absent-entry");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    // a.bin deleted from the bucket: the model is downloaded again, a.bin stays on disk unlisted.
    let bucket =
        BucketFixture::new("models").object(ObjectFixture::generated("m/w.bin", UPLOADED_BYTES, 3).multipart(2));
    let without = FakeOci::start(Fixtures::new().bucket(bucket)).unwrap();
    finished(run(oci_job(&without, &root), &opts).await.0);
    drop(without);
    assert!(root.dest().join("a.bin").exists(), "the agent keeps the unlisted file");
    // a.bin uploaded again, same size, another version.
    let third = uploaded_in_parts(3, Some((A, 14)), false);
    finished(run(oci_job(&third, &root), &opts).await.0);
    assert_a_is_the_second_upload(&root, A, &third);
}

/// A review (of the stored manifests): a Ready model (its manifest names a.bin's ETag) and a.bin uploaded again at the same
/// size, nothing else changed: the listing digest has no ETag, so the fast path (`manifest_is` +
/// `sizes_match`) says complete, and the first upload's a.bin stays while the manifest's ETag
/// differs from the listed one.
#[tokio::test]
async fn the_fast_path_does_not_keep_a_file_the_manifest_names_another_version_by() {
    const A: u64 = 1_000;
    let root = Root::new("r5-fast-path");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    let second = uploaded_in_parts(3, Some((A, 14)), false);
    finished(run(oci_job(&second, &root), &opts).await.0);
    assert_a_is_the_second_upload(&root, A, &second);
}

/// A review (of the end of a download): the partial directory went before the manifest was
/// written, so a kill (or a failed manifest write) in between left neither the manifest nor the
/// records, and a same-size file of an older upload was adopted by its size at the next
/// download. The manifest is written first now: the state a kill leaves is a manifest naming
/// each file's version beside a partial directory of records, and an upload since is fetched.
#[tokio::test]
async fn a_kill_at_the_end_of_a_download_keeps_no_file_of_an_older_upload() {
    const A: u64 = 1_000;
    let root = Root::new("kill-at-the-end");
    let hub = hub();
    let opts = Options { request_attempts_max: 1, ..opts(&hub) };
    ready_on_the_first_upload(&root, &opts, A).await;
    assert!(root.dest().join(MANIFEST).exists() && !root.dest().join(PARTIAL_DIR).exists());
    // As a kill after the manifest and before the partial directory went leaves it.
    std::fs::create_dir(root.dest().join(PARTIAL_DIR)).unwrap();
    std::fs::write(root.dest().join(PARTIAL_DIR).join("placed-records"), b"").unwrap();
    let second = uploaded_in_parts(3, Some((A, 14)), false);
    finished(run(oci_job(&second, &root), &opts).await.0);
    let a = std::fs::read(root.dest().join("a.bin")).unwrap();
    assert!(a == model_agent_fakeoci::pattern_bytes(14, 0, A as usize), "a.bin is the upload listed");
    assert!(!root.dest().join(PARTIAL_DIR).exists(), "the partial directory went at this download");
}
