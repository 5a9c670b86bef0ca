//! The client against the project's fake Hub (its own thread and runtime).

use std::path::PathBuf;

use model_agent_fakehub::{CommitFixture, Config, FakeHub, Fault, Fixtures, Listener, RepoFixture, Scope};

use super::*;

const REPO: &str = "org/model";
const LFS_PATH: &str = "model.safetensors";
const LFS_BYTES: u64 = 1 << 20;
const CONNECT_TIMEOUT_MS: u64 = 2_000;
const STALL_TIMEOUT_MS: u64 = 5_000;

fn commit_files(variant: &str) -> CommitFixture {
    let mut commit = CommitFixture::new()
        .file("config.json", format!("{{\"v\":\"{variant}\"}}"))
        .generated_lfs(LFS_PATH, LFS_BYTES, 7);
    for i in 0..5 {
        commit = commit.file(&format!("sub/dir{i}/f{i}.txt"), format!("file {i} {variant}"));
    }
    for i in 0..4 {
        commit = commit.file(&format!("tok/t{i}.json"), vec![b'x'; 100 + i]);
    }
    commit
}

fn hub_with(repos: Vec<RepoFixture>) -> FakeHub {
    let fixtures = repos.into_iter().fold(Fixtures::new(), Fixtures::repo);
    FakeHub::start_with(fixtures, Config { tree_page_size: 3, ..Config::default() }).unwrap()
}

fn public_hub() -> FakeHub {
    let repo = RepoFixture::new(REPO)
        .commit("c1", commit_files("one"))
        .commit("c2", commit_files("two"))
        .branch("main", "c2")
        .tag("v1", "c1");
    hub_with(vec![repo])
}

fn source(hub: &FakeHub, token: Option<&str>) -> HfSource {
    HfSource::new(hub.endpoint(), token.map(str::to_owned), CONNECT_TIMEOUT_MS, STALL_TIMEOUT_MS, &Default::default())
        .unwrap()
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("hf-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn partial(&self) -> PathBuf {
        self.0.join("partial")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn remote_file(source: &HfSource, commit: &str, path: &str) -> RemoteFile {
    let files = source.tree(REPO, commit).await.unwrap();
    files.into_iter().find(|f| f.path == path).unwrap()
}

/// `fetch_file` into a partial file opened here (the engine opens it relative to its partial directory).
async fn fetch(
    source: &HfSource,
    commit: &str,
    file: &RemoteFile,
    partial: &std::path::Path,
    stall_timeout_ms: u64,
) -> Result<(), HfError> {
    let handle = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(partial);
    let meter = Meter::default();
    let result = fetch_file(source, REPO, commit, file, handle.unwrap(), stall_timeout_ms, &meter).await;
    let len = std::fs::metadata(partial).unwrap().len();
    assert_eq!(meter.have_bytes.load(std::sync::atomic::Ordering::Relaxed), len, "the meter follows the partial");
    result
}

fn lfs_fault_file(hub: &FakeHub, fault: Fault) {
    hub.faults().add(fault);
}

#[tokio::test]
async fn resolve_gives_the_commit_of_branches_tags_and_shas() {
    let hub = public_hub();
    let source = source(&hub, None);
    let (c1, c2) = (hub.commit_sha(REPO, "c1").unwrap(), hub.commit_sha(REPO, "c2").unwrap());
    assert_eq!(source.resolve(REPO, "main").await.unwrap(), c2);
    assert_eq!(source.resolve(REPO, "v1").await.unwrap(), c1);
    assert_eq!(source.resolve(REPO, &c1).await.unwrap(), c1);
    let missing = source.resolve(REPO, "nope").await.unwrap_err();
    assert_eq!(missing, HfError::RevisionNotFound { repo_id: REPO.into(), revision: "nope".into() });
    let unknown_sha = "0".repeat(40);
    assert!(matches!(source.resolve(REPO, &unknown_sha).await, Err(HfError::RevisionNotFound { .. })));
    let no_repo = source.resolve("org/none", "main").await.unwrap_err();
    assert_eq!(no_repo, HfError::RepoNotFound { repo_id: "org/none".into(), token_sent: false });
    assert!(no_repo.retry_slowly());
    assert!(matches!(source.resolve("../x", "main").await, Err(HfError::BadRepoId { .. })));
}

#[tokio::test]
async fn tree_follows_every_page_and_gives_sizes_and_hashes() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = hub.commit_sha(REPO, "c1").unwrap();
    let files = source.tree(REPO, &commit).await.unwrap();
    let mut listed: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
    listed.sort();
    let mut expected = hub.paths(REPO, &commit).unwrap();
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(files.len(), 11);
    for file in &files {
        let info = hub.file(REPO, &commit, &file.path).unwrap();
        assert_eq!(file.size_bytes, info.size_bytes, "{}", file.path);
        let hash = info.lfs_sha256.map_or(FileHash::GitBlobSha1(info.git_oid), FileHash::Sha256);
        assert_eq!(file.hash, hash, "{}", file.path);
    }
    let tree_pages = hub.requests().iter().filter(|r| r.uri.contains("/tree/")).count();
    // 11 files and 9 directories (sub, sub/dir0..4, tok, …) at 3 entries a page.
    assert!(tree_pages >= 6, "{tree_pages} pages");
}

#[tokio::test]
async fn lfs_files_come_from_the_cdn_without_the_token() {
    let repo = RepoFixture::new(REPO).commit("c1", commit_files("one")).branch("main", "c1").private("secret");
    let hub = hub_with(vec![repo]);
    let source = source(&hub, Some("secret"));
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    let scratch = Scratch::new("cdn");
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    assert_eq!(std::fs::metadata(scratch.partial()).unwrap().len(), LFS_BYTES);
    let requests = hub.requests();
    let cdn: Vec<_> = requests.iter().filter(|r| r.listener == Listener::Cdn).collect();
    assert!(!cdn.is_empty(), "no CDN request: {requests:?}");
    assert!(cdn.iter().all(|r| !r.authorization && r.status == 200), "{cdn:?}");
    assert!(requests.iter().filter(|r| r.listener == Listener::Hub).all(|r| r.authorization));
}

#[tokio::test]
async fn private_repos_need_their_token() {
    let repo = RepoFixture::new(REPO).commit("c1", commit_files("one")).branch("main", "c1").private("secret");
    let hub = hub_with(vec![repo]);
    let without = source(&hub, None).resolve(REPO, "main").await.unwrap_err();
    assert_eq!(without, HfError::RepoNotFound { repo_id: REPO.into(), token_sent: false });
    let wrong = source(&hub, Some("wrong")).resolve(REPO, "main").await.unwrap_err();
    assert_eq!(wrong, HfError::RepoNotFound { repo_id: REPO.into(), token_sent: true });
    let source = source(&hub, Some("secret"));
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, "config.json").await;
    let scratch = Scratch::new("private");
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    assert_eq!(std::fs::read(scratch.partial()).unwrap(), b"{\"v\":\"one\"}");
}

#[tokio::test]
async fn gated_files_say_gated_and_retry_slowly() {
    let repo = RepoFixture::new(REPO).commit("c1", commit_files("one")).branch("main", "c1").gated(&["granted"]);
    let hub = hub_with(vec![repo]);
    let scratch = Scratch::new("gated");
    for (token, token_sent) in [(None, false), (Some("other"), true)] {
        let source = source(&hub, token);
        let commit = source.resolve(REPO, "main").await.unwrap();
        let file = remote_file(&source, &commit, "config.json").await;
        let error = fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap_err();
        assert_eq!(error, HfError::Gated { repo_id: REPO.into(), token_sent });
        assert!(error.retry_slowly() && error.to_string().contains("gated"));
    }
    let source = source(&hub, Some("granted"));
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
}

#[tokio::test]
async fn rate_limits_carry_retry_after() {
    let hub = public_hub();
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 7, scope: Scope::Hub });
    let error = source(&hub, None).resolve(REPO, "main").await.unwrap_err();
    assert_eq!(error, HfError::RateLimited { retry_after_ms: Some(7000) });
    assert_eq!(error.retry_after_ms(), Some(7000));
    assert!(!error.retry_slowly());
    hub.faults().add(Fault::ServerError { count: 1, status: 503, scope: Scope::Hub });
    let error = source(&hub, None).resolve(REPO, "main").await.unwrap_err();
    assert_eq!(error, HfError::Server { status: 503, retry_after_ms: None });
}

#[tokio::test]
async fn a_cut_transfer_resumes_from_the_kept_prefix() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    let scratch = Scratch::new("cut");
    let truncate = |count| Fault::Truncate { repo: REPO.into(), path: LFS_PATH.into(), after_bytes: 100_000, count };
    // More cuts than the call resumes by itself: the caller sees Truncated with the prefix kept.
    lfs_fault_file(&hub, truncate(super::fetch::CUT_RESUMES_MAX + 1));
    let error = fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap_err();
    assert!(matches!(error, HfError::Truncated { .. }), "{error}");
    let kept = std::fs::metadata(scratch.partial()).unwrap().len();
    assert!(kept > 0 && kept < LFS_BYTES, "kept {kept}");
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    let served = hub.bytes_served(REPO, LFS_PATH);
    assert!(served <= LFS_BYTES + LFS_BYTES / 10, "served {served} for {LFS_BYTES}");
    let ranged = hub.requests().iter().filter(|r| r.listener == Listener::Cdn && r.range.is_some()).count();
    assert!(ranged >= 1);
}

#[tokio::test]
async fn a_stalled_transfer_ends_within_the_stall_timeout_and_keeps_its_prefix() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    let scratch = Scratch::new("stall");
    let stall =
        Fault::Stall { repo: REPO.into(), path: LFS_PATH.into(), after_bytes: 200_000, stall_ms: 20_000, count: 1 };
    hub.faults().add(stall);
    let started = std::time::Instant::now();
    let error = fetch(&source, &commit, &file, &scratch.partial(), 500).await.unwrap_err();
    assert!(matches!(error, HfError::Stalled { stall_timeout_ms: 500, .. }), "{error}");
    assert!(started.elapsed() < std::time::Duration::from_millis(3_000), "{:?}", started.elapsed());
    assert!(std::fs::metadata(scratch.partial()).unwrap().len() > 0);
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
}

#[tokio::test]
async fn a_corrupt_body_is_an_integrity_error_and_the_partial_is_emptied() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let scratch = Scratch::new("corrupt");
    for path in [LFS_PATH, "config.json"] {
        let file = remote_file(&source, &commit, path).await;
        hub.faults().add(Fault::Corrupt { repo: REPO.into(), path: path.into(), count: 1 });
        let error = fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap_err();
        assert!(matches!(&error, HfError::Integrity { path: p, .. } if p == path), "{error}");
        assert_eq!(std::fs::metadata(scratch.partial()).unwrap().len(), 0, "the wrong bytes are kept");
    }
}

#[tokio::test]
async fn a_range_answered_whole_restarts_and_still_verifies() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    let scratch = Scratch::new("ignore-range");
    // A kept prefix of wrong bytes: only a restart from zero can verify.
    std::fs::write(scratch.partial(), vec![0u8; 1000]).unwrap();
    hub.faults().add(Fault::IgnoreRange { repo: REPO.into(), path: LFS_PATH.into(), count: 1 });
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    let cdn: Vec<_> = hub.requests().into_iter().filter(|r| r.listener == Listener::Cdn).collect();
    assert_eq!(cdn.len(), 1);
    assert_eq!(cdn[0].range.as_deref(), Some("bytes=1000-"));
    assert_eq!(std::fs::metadata(scratch.partial()).unwrap().len(), LFS_BYTES);
}

#[tokio::test]
async fn a_complete_partial_is_verified_without_a_request() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, "config.json").await;
    let scratch = Scratch::new("complete");
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    hub.clear_requests();
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
    assert!(hub.requests().is_empty());
}

#[test]
fn debug_never_shows_the_token() {
    let source = HfSource::new("https://huggingface.co/", Some("hf_secret".into()), 1, 1, &Default::default()).unwrap();
    assert!(!format!("{source:?}").contains("hf_secret"));
    assert_eq!(source.endpoint(), "https://huggingface.co");
    assert!(matches!(HfSource::new("ftp://x", None, 1, 1, &Default::default()), Err(HfError::BadEndpoint { .. })));
}

#[tokio::test]
async fn a_rate_limited_cdn_is_returned_to_the_caller_with_its_wait() {
    let hub = public_hub();
    let source = source(&hub, None);
    let commit = source.resolve(REPO, "main").await.unwrap();
    let file = remote_file(&source, &commit, LFS_PATH).await;
    let scratch = Scratch::new("cdn-429");
    hub.faults().add(Fault::RateLimit { count: 1, retry_after_s: 2, scope: Scope::Cdn });
    let error = fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap_err();
    assert_eq!(error.retry_after_ms(), Some(2000), "{error}");
    hub.faults().add(Fault::ServerError { count: 1, status: 502, scope: Scope::Cdn });
    let error = fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap_err();
    assert_eq!(error, HfError::Server { status: 502, retry_after_ms: None });
    fetch(&source, &commit, &file, &scratch.partial(), STALL_TIMEOUT_MS).await.unwrap();
}
