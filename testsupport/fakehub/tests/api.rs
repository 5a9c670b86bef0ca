//! The revision and tree APIs, access rules and error codes.

mod common;

use common::*;
use model_agent_fakehub::{git_blob_oid, lfs_pointer, sha256_hex};
use serde_json::Value;

#[test]
fn revision_resolves_branches_tags_and_commits() {
    let hub = start();
    let c1 = hub.commit_sha(MODEL, "c1").unwrap();
    let c2 = hub.commit_sha(MODEL, "c2").unwrap();
    assert_ne!(c1, c2);
    assert_eq!(c1.len(), 40);
    let cases = [("main", &c2), ("dev", &c1), ("v1.0", &c1), ("refs%2Fpr%2F1", &c1), (c1.as_str(), &c1)];
    for (revision, expected) in cases {
        let reply = get(&format!("{}/api/models/{MODEL}/revision/{revision}", hub.endpoint()));
        assert_eq!(reply.status, 200, "{revision}");
        let info = reply.json();
        assert_eq!(info["id"], MODEL);
        assert_eq!(&info["sha"], expected.as_str(), "{revision}");
        let siblings: Vec<&str> =
            info["siblings"].as_array().unwrap().iter().map(|s| s["rfilename"].as_str().unwrap()).collect();
        let paths = hub.paths(MODEL, revision.replace("%2F", "/").as_str()).unwrap();
        assert_eq!(siblings, paths.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let default = get(&format!("{}/api/models/{MODEL}", hub.endpoint())).json();
    assert_eq!(default["sha"], c2.as_str(), "no revision: the default branch");
}

#[test]
fn missing_repo_and_revision_answer_the_hubs_error_codes() {
    let hub = start();
    let reply = get(&format!("{}/api/models/org/nope/revision/main", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (401, Some("RepoNotFound")), "anonymous: 401");
    let with_token = [("Authorization", "Bearer hf_someone")];
    let reply = request("GET", &format!("{}/api/models/org/nope/revision/main", hub.endpoint()), &with_token);
    assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("RepoNotFound")), "authenticated: 404");
    let reply = get(&format!("{}/api/models/{MODEL}/revision/nope", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("RevisionNotFound")));
    assert!(reply.json()["error"].as_str().unwrap().contains("nope"));
    let reply = get(&format!("{}/api/models/{MODEL}/tree/nope?recursive=true", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("RevisionNotFound")));
    let reply = get(&format!("{}/{MODEL}/resolve/main/nope.txt", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("EntryNotFound")));
    assert_eq!(reply.header("x-repo-commit"), hub.commit_sha(MODEL, "c2").as_deref());
}

#[test]
fn private_repo_needs_its_token_everywhere() {
    let hub = start();
    let urls = [
        format!("{}/api/models/{PRIVATE}/revision/main", hub.endpoint()),
        format!("{}/api/models/{PRIVATE}/tree/main?recursive=true", hub.endpoint()),
        format!("{}/{PRIVATE}/resolve/main/config.json", hub.endpoint()),
    ];
    for url in &urls {
        let reply = get(url);
        assert_eq!((reply.status, reply.header("x-error-code")), (401, Some("RepoNotFound")), "{url}");
        let reply = request("GET", url, &[("Authorization", "Bearer wrong")]);
        assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("RepoNotFound")), "{url}");
        let bearer = format!("Bearer {PRIVATE_TOKEN}");
        assert_eq!(request("GET", url, &[("Authorization", &bearer)]).status, 200, "{url}");
    }
    let info = request("GET", &urls[0], &[("Authorization", &format!("Bearer {PRIVATE_TOKEN}"))]).json();
    assert_eq!(info["private"], true);
}

#[test]
fn gated_repo_shows_metadata_and_gates_files() {
    let hub = start();
    assert_eq!(get(&format!("{}/api/models/{GATED}/revision/main", hub.endpoint())).json()["gated"], "manual");
    assert_eq!(get(&format!("{}/api/models/{GATED}/tree/main", hub.endpoint())).status, 200);
    for path in ["config.json", "w.bin"] {
        let url = format!("{}/{GATED}/resolve/main/{path}", hub.endpoint());
        let reply = request("HEAD", &url, &[]);
        assert_eq!((reply.status, reply.header("x-error-code")), (401, Some("GatedRepo")), "{path}");
        let reply = request("GET", &url, &[("Authorization", "Bearer not-granted")]);
        assert_eq!((reply.status, reply.header("x-error-code")), (403, Some("GatedRepo")), "{path}");
        let granted = format!("Bearer {GRANTED_TOKEN}");
        assert!(matches!(request("GET", &url, &[("Authorization", &granted)]).status, 200 | 302), "{path}");
    }
    let reply = get(&format!("{}/api/models/{GATED_API}/revision/main", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (401, Some("GatedRepo")), "gated_api_too");
}

/// Follows `Link: <…>; rel="next"` to the end; returns the entries and the number of pages.
fn all_pages(first_url: &str) -> (Vec<Value>, usize) {
    let (mut entries, mut pages, mut url) = (Vec::new(), 0, Some(first_url.to_owned()));
    while let Some(current) = url.take() {
        let reply = get(&current);
        assert_eq!(reply.status, 200, "{current}");
        entries.extend(reply.json().as_array().unwrap().iter().cloned());
        pages += 1;
        assert!(pages <= 100, "pagination never ends");
        url = reply.header("link").map(|link| {
            assert!(link.ends_with("; rel=\"next\""), "{link}");
            link[1..link.find('>').unwrap()].to_owned()
        });
    }
    (entries, pages)
}

#[test]
fn recursive_tree_is_paginated_and_carries_the_hashes() {
    let hub = start();
    let c2 = hub.commit_sha(MODEL, "c2").unwrap();
    for recursive in ["true", "1", "True"] {
        let (entries, pages) =
            all_pages(&format!("{}/api/models/{MODEL}/tree/{c2}?recursive={recursive}", hub.endpoint()));
        let paths: Vec<&str> = entries.iter().map(|e| e["path"].as_str().unwrap()).collect();
        let expected = [
            "README.md",
            "added.bin",
            "config.json",
            WEIGHTS,
            "tokenizer",
            "tokenizer/extra",
            "tokenizer/extra/special.txt",
            "tokenizer/tokenizer.json",
            "weights",
            "weights/part-00001.bin",
        ];
        assert_eq!(paths, expected);
        assert_eq!(pages, 4, "10 entries in pages of 3");
        for entry in &entries {
            check_entry(&hub, &c2, entry);
        }
    }
}

fn check_entry(hub: &model_agent_fakehub::FakeHub, commit: &str, entry: &Value) {
    let path = entry["path"].as_str().unwrap();
    let Some(file) = hub.file(MODEL, commit, path) else {
        assert_eq!((entry["type"].as_str(), entry["size"].as_u64()), (Some("directory"), Some(0)), "{path}");
        return;
    };
    let bytes = file.content.to_vec().unwrap();
    assert_eq!(entry["type"], "file");
    assert_eq!(entry["size"].as_u64(), Some(bytes.len() as u64), "{path}");
    if path.ends_with(".bin") || path.ends_with(".safetensors") {
        let sha256 = sha256_hex(&bytes);
        assert_eq!(entry["lfs"]["oid"].as_str(), Some(sha256.as_str()), "{path}");
        assert_eq!(entry["lfs"]["size"].as_u64(), Some(bytes.len() as u64));
        let pointer = lfs_pointer(&sha256, bytes.len() as u64);
        assert_eq!(entry["lfs"]["pointerSize"].as_u64(), Some(pointer.len() as u64));
        assert_eq!(entry["oid"].as_str(), Some(git_blob_oid(pointer.as_bytes()).as_str()), "git stores the pointer");
    } else {
        assert!(entry.get("lfs").is_none(), "{path}");
        assert_eq!(entry["oid"].as_str(), Some(git_blob_oid(&bytes).as_str()), "{path}");
    }
}

#[test]
fn flat_and_subdirectory_trees() {
    let hub = start();
    let (entries, _) = all_pages(&format!("{}/api/models/{MODEL}/tree/main", hub.endpoint()));
    let paths: Vec<&str> = entries.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["README.md", "added.bin", "config.json", WEIGHTS, "tokenizer", "weights"]);
    let (entries, _) = all_pages(&format!("{}/api/models/{MODEL}/tree/main/tokenizer?recursive=false", hub.endpoint()));
    let paths: Vec<&str> = entries.iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["tokenizer/extra", "tokenizer/tokenizer.json"]);
    let reply = get(&format!("{}/api/models/{MODEL}/tree/main/nope", hub.endpoint()));
    assert_eq!((reply.status, reply.header("x-error-code")), (404, Some("EntryNotFound")));
    let reply = get(&format!("{}/api/models/{MODEL}/tree/main?cursor=garbage", hub.endpoint()));
    assert_eq!(reply.status, 400);
}

#[test]
fn next_link_uses_the_host_the_client_asked() {
    let hub = start();
    let port = hub.endpoint().rsplit(':').next().unwrap();
    let reply = get(&format!("http://localhost:{port}/api/models/{MODEL}/tree/main?recursive=true&expand=false"));
    let link = reply.header("link").unwrap();
    assert!(
        link.starts_with(&format!(
            "<http://localhost:{port}/api/models/{MODEL}/tree/main?recursive=true&expand=false&cursor="
        )),
        "{link}"
    );
}
