//! The real `huggingface_hub` (PyPI, pinned in scripts/py-tools) against the fake: snapshot_download of
//! branches, a tag, a commit, a private repo with its token, a granted gated repo, byte for byte; the errors
//! it raises for a gated repo without a token and missing repos and revisions; list_repo_tree through the
//! fake's pagination. Run by scripts/fakehub-check, which sets MODEL_AGENT_PYTHON.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use model_agent_fakehub::{FakeHub, Listener};
use serde_json::{Value, json};

struct Case {
    name: &'static str,
    repo: &'static str,
    revision: String,
    token: Option<&'static str>,
    /// The Python exception class expected; `None`: the download succeeds.
    error: Option<&'static str>,
}

fn cases(hub: &FakeHub) -> Vec<Case> {
    let case =
        |name, repo, revision: &str, token, error| Case { name, repo, revision: revision.to_owned(), token, error };
    let c1 = hub.commit_sha(MODEL, "c1").unwrap();
    vec![
        case("main", MODEL, "main", None, None),
        case("branch-dev", MODEL, "dev", None, None),
        case("tag", MODEL, "v1.0", None, None),
        case("commit", MODEL, &c1, None, None),
        case("pr-ref", MODEL, "refs/pr/1", None, None),
        case("private", PRIVATE, "main", Some(PRIVATE_TOKEN), None),
        case("gated-granted", GATED, "main", Some(GRANTED_TOKEN), None),
        case("gated-anonymous", GATED, "main", None, Some("GatedRepoError")),
        case("gated-not-granted", GATED, "main", Some("hf_not_granted"), Some("GatedRepoError")),
        case("gated-api-anonymous", GATED_API, "main", None, Some("GatedRepoError")),
        case("private-anonymous", PRIVATE, "main", None, Some("RepositoryNotFoundError")),
        case("missing-repo", "org/nope", "main", None, Some("RepositoryNotFoundError")),
        case("missing-revision", MODEL, "nope", None, Some("RevisionNotFoundError")),
    ]
}

fn python() -> String {
    std::env::var("MODEL_AGENT_PYTHON")
        .expect("MODEL_AGENT_PYTHON: the venv python from scripts/py-tools (run scripts/fakehub-check)")
}

fn run_client(hub: &FakeHub, work: &Path, cases: &[Case]) -> Value {
    let downloads: Vec<Value> = cases
        .iter()
        .map(|c| json!({"name": c.name, "repo": c.repo, "revision": c.revision, "token": c.token, "local_dir": work.join(c.name)}))
        .collect();
    let spec = json!({"endpoint": hub.endpoint(), "downloads": downloads, "tree": {"repo": MODEL, "revision": "main"}});
    let spec_path = work.join("spec.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hf_client.py");
    let output = Command::new(python())
        .arg(script)
        .arg(&spec_path)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_TOKEN")
        .env("HF_HOME", work.join("hf-home"))
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_ETAG_TIMEOUT", "10")
        .env("HF_HUB_DOWNLOAD_TIMEOUT", "10")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "huggingface_hub client failed:\n{stderr}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&output.stdout)))
}

/// Files under `dir`, relative, without huggingface_hub's own `.cache` folder.
fn files_on_disk(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(dir).unwrap().to_str().unwrap().to_owned();
            if relative == ".cache" {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else {
                files.insert(relative, std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

fn check_download(hub: &FakeHub, work: &Path, case: &Case, result: &Value) {
    if let Some(error) = case.error {
        let bases: Vec<&str> =
            result["bases"].as_array().map(|b| b.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        assert!(bases.contains(&error), "{}: expected {error}, got {result}", case.name);
        return;
    }
    assert!(result.get("ok").is_some(), "{}: {result}", case.name);
    let on_disk = files_on_disk(&work.join(case.name));
    let expected: BTreeMap<String, Vec<u8>> = hub
        .paths(case.repo, &case.revision)
        .unwrap()
        .into_iter()
        .map(|path| {
            let bytes = fixture_bytes(hub, case.repo, &case.revision, &path);
            (path, bytes)
        })
        .collect();
    assert_eq!(on_disk.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "{}", case.name);
    for (path, bytes) in &expected {
        assert!(on_disk[path] == *bytes, "{}: {path} differs from the fixture", case.name);
    }
}

fn check_tree(hub: &FakeHub, tree: &Value) {
    let entries = tree.as_array().unwrap();
    let file_paths: Vec<&str> =
        entries.iter().filter(|e| e["type"] == "file").map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(file_paths, hub.paths(MODEL, "main").unwrap(), "every file, across pages of 3");
    for entry in entries.iter().filter(|e| e["type"] == "file") {
        let info = hub.file(MODEL, "main", entry["path"].as_str().unwrap()).unwrap();
        assert_eq!(entry["size"].as_u64(), Some(info.size_bytes));
        assert_eq!(entry["blob_id"].as_str(), Some(info.git_oid.as_str()));
        assert_eq!(entry["lfs"]["sha256"].as_str(), info.lfs_sha256.as_deref());
    }
    assert!(entries.iter().any(|e| e["type"] == "directory" && e["path"] == "tokenizer/extra"));
}

#[test]
#[ignore = "needs huggingface_hub from PyPI: run by scripts/fakehub-check"]
fn huggingface_hub_downloads_from_the_fake_and_raises_its_errors() {
    let hub = start();
    let work: PathBuf = std::env::temp_dir().join(format!("fakehub-hf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let cases = cases(&hub);
    let result = run_client(&hub, &work, &cases);
    eprintln!("huggingface_hub {}: {}", result["version"], result["downloads"]);
    for case in &cases {
        check_download(&hub, &work, case, &result["downloads"][case.name]);
    }
    check_tree(&hub, &result["tree"]);
    let log = hub.requests();
    let cdn = log.iter().filter(|r| r.listener == Listener::Cdn).collect::<Vec<_>>();
    assert!(!cdn.is_empty(), "LFS files came from the CDN");
    assert!(cdn.iter().all(|r| !r.authorization && r.status == 200), "the CDN never saw the token: {cdn:?}");
    let pages = log.iter().filter(|r| r.uri.contains("/tree/") && r.uri.contains("cursor=")).count();
    assert!(pages >= 3, "huggingface_hub followed Link: rel=next ({pages} follow-up pages)");
    std::fs::remove_dir_all(&work).unwrap();
}
