//! Shared copies (#10) end to end: `downloadPolicy: ReuseIfExists` models of one repo and commit
//! share the node's one copy under `_artifacts/`, each model's path a relative symlink to it; two
//! models with one source and one path share that directory. The real agent, the real apiserver,
//! the project's fake Hub.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::hf::{
    BIG, BIG_BYTES, OTHER_REPO, REPO, agent, agent_with, assert_files_match, hub, repo_bytes, trash_entries,
};
use super::{apply, apply_changed_crds, entries, kubectl, labels, node, scratch, wait_until};
use model_agent_fakehub::Fault;

/// A model of `hf://REPO` at `path`, placed on `n`: `kind_meta` is the kind and metadata lines.
fn model_yaml(kind_meta: &str, n: &str, path: &Path, policy: &str) -> String {
    model_of(REPO, kind_meta, n, path, policy)
}

fn model_of(repo: &str, kind_meta: &str, n: &str, path: &Path, policy: &str) -> String {
    format!(
        "apiVersion: ome.io/v1beta1\n{kind_meta}\nspec:\n  storage: {{storageUri: \"hf://{repo}\", path: \"{}\", downloadPolicy: {policy}, nodeSelector: {{e2e: {n}}}}}\n",
        path.display()
    )
}

fn cluster_model(name: &str, n: &str, path: &Path, policy: &str) -> String {
    model_yaml(&format!("kind: ClusterBaseModel\nmetadata: {{name: {name}}}"), n, path, policy)
}

fn base_model(ns: &str, name: &str, n: &str, path: &Path, policy: &str) -> String {
    let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\n");
    namespace + &model_yaml(&format!("kind: BaseModel\nmetadata: {{name: {name}, namespace: {ns}}}"), n, path, policy)
}

fn ready(n: &str, label_key: &str) -> bool {
    labels(n).get(label_key).is_some_and(|v| v == "Ready")
}

fn link_text(path: &Path) -> Option<String> {
    std::fs::read_link(path).ok().map(|t| t.to_string_lossy().into_owned())
}

fn bytes_served(hub: &model_agent_fakehub::FakeHub) -> u64 {
    hub.bytes_served_all().iter().map(|f| f.bytes).sum()
}

/// The uids a directory's ownership marker names.
fn marker_uids(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(".model-agent-owner")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut uids: Vec<String> = std::iter::once(&v["uid"])
        .chain(v["co_owners"].as_array().into_iter().flatten())
        .filter_map(|u| u.as_str().map(str::to_string))
        .collect();
    uids.sort();
    uids
}

/// The v1.2.2 artifact shape: every sharing model's entry names one parent (one of them) at the
/// copy's path, and the parent's `childrenPaths` lists the others' links.
fn check_artifacts(n: &str, keys: &[(&str, PathBuf)], copy: &Path, commit: &str) {
    let all = entries(n);
    let parent = all[keys[0].0]["config"]["artifact"]["parentPath"].clone();
    let parent = parent.as_object().unwrap_or_else(|| panic!("no parentPath in {all:?}")).clone();
    assert_eq!(parent.len(), 1, "{parent:?}");
    let (owner, path) = parent.iter().next().unwrap();
    assert_eq!(path.as_str(), copy.to_str(), "{parent:?}");
    for (cm_key, _) in keys {
        let artifact = &all[*cm_key]["config"]["artifact"];
        assert_eq!(artifact["sha"].as_str(), Some(commit), "{cm_key}: {artifact}");
        assert_eq!(artifact["parentPath"], serde_json::Value::Object(parent.clone()), "{cm_key}");
        let mut children: Vec<&str> =
            artifact["childrenPaths"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
        children.sort_unstable();
        let mut expected: Vec<&str> =
            keys.iter().filter(|(k, _)| k != cm_key).map(|(_, l)| l.to_str().unwrap()).collect();
        expected.sort_unstable();
        match cm_key == owner {
            true => assert_eq!(children, expected, "the owner lists the others' links"),
            false => assert!(children.is_empty(), "{cm_key}: {children:?}"),
        }
    }
}

/// A ClusterBaseModel and two BaseModels in two namespaces on one repo and commit: one download
/// (bytes fetched about once the repo), three relative symlinks, all Ready, the v1.2.2 artifact
/// shape. A phantom-delete storm changes nothing; deleting two keeps the copy; deleting the
/// third sends it to the trash.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t23_shared_copy_one_download_three_links_and_the_last_delete_trashes_it() {
    super::setup();
    let n = "e2e-share";
    node(n);
    let hub = hub();
    let root = scratch("e2e-share-root");
    let agent = agent(&hub, n, &root);
    let commit = hub.commit_sha(REPO, "c1").unwrap();
    let copy = root.join(format!("_artifacts/{REPO}/{commit}"));
    let (c, a, b) = (root.join("c/qwen"), root.join("a/qwen"), root.join("b/qwen"));
    apply(&cluster_model("e2e-share-c", n, &c, "ReuseIfExists"));
    apply(&base_model("e2e-share-a", "qwen", n, &a, "ReuseIfExists"));
    apply(&base_model("e2e-share-b", "qwen", n, &b, "ReuseIfExists"));
    let keys = [
        ("models.ome.io/clusterbasemodel.e2e-share-c", "clusterbasemodel.e2e-share-c", c.clone()),
        ("models.ome.io/e2e-share-a.basemodel.qwen", "e2e-share-a.basemodel.qwen", a.clone()),
        ("models.ome.io/e2e-share-b.basemodel.qwen", "e2e-share-b.basemodel.qwen", b.clone()),
    ];
    wait_until("three models Ready", Duration::from_secs(90), || keys.iter().all(|(l, _, _)| ready(n, l)));
    let served = bytes_served(&hub);
    let repo = repo_bytes(&hub, REPO);
    assert!(served >= repo && served < repo + repo / 10, "one download: {served} bytes for a {repo}-byte repo");
    let target = format!("../_artifacts/{REPO}/{commit}");
    for (_, _, link) in &keys {
        assert_eq!(link_text(link).as_deref(), Some(target.as_str()), "{}", link.display());
    }
    assert_files_match(&hub, REPO, &copy);
    assert_eq!(marker_uids(&copy).len(), 3, "the copy's marker names every model that fetched into it");
    let cm_keys: Vec<(&str, PathBuf)> = keys.iter().map(|(_, k, l)| (*k, l.clone())).collect();
    wait_until("the artifacts settle", Duration::from_secs(10), || {
        std::panic::catch_unwind(|| check_artifacts(n, &cm_keys, &copy, &commit)).is_ok()
    });
    check_artifacts(n, &cm_keys, &copy, &commit);
    // The metrics are refreshed with the agent's status, about every second.
    let references = format!("model_agent_shared_copy_references{{copy=\"{REPO}/{commit}\"}}");
    wait_until("the metrics show one copy used three times", Duration::from_secs(10), || {
        agent.metric("model_agent_shared_copies") == 1.0 && agent.metric(&references) == 3.0
    });
    let saved = agent.metric("model_agent_shared_bytes_saved");
    assert_eq!(saved, 2.0 * repo as f64, "two copies saved");

    // The second seed's storm: every watch dropped twice, the agent relists (whatever the relists
    // show, candidates or none, nothing may change).
    for round in 0..2 {
        apply_changed_crds(100 + round);
    }
    std::thread::sleep(Duration::from_secs(5));
    assert!(keys.iter().all(|(l, _, _)| ready(n, l)), "{:?}", labels(n));
    assert!(keys.iter().all(|(_, _, link)| link_text(link).as_deref() == Some(target.as_str())));
    assert_eq!(trash_entries(&root), 0);

    // A copy that fails validation is repaired in place: the agent restarts, finds the big file
    // cut short, fetches that file alone again; the labels stay Ready throughout (no flapping on
    // a restart, downloads.md).
    agent.stop();
    let big = copy.join(BIG);
    let cut = std::fs::OpenOptions::new().write(true).open(&big).unwrap();
    cut.set_len(BIG_BYTES / 2).unwrap();
    drop(cut);
    let before = bytes_served(&hub);
    let agent = super::hf::agent(&hub, n, &root);
    wait_until("the cut file fetched again", Duration::from_secs(60), || {
        std::fs::metadata(&big).is_ok_and(|m| m.len() == BIG_BYTES)
    });
    assert_files_match(&hub, REPO, &copy);
    let refetched = bytes_served(&hub) - before;
    assert!((BIG_BYTES / 2..=BIG_BYTES).contains(&refetched), "only the bad file: {refetched} bytes");
    wait_until("all Ready after the repair", Duration::from_secs(30), || keys.iter().all(|(l, _, _)| ready(n, l)));

    kubectl(&["delete", "-n", "e2e-share-a", "basemodel", "qwen"]);
    kubectl(&["delete", "-n", "e2e-share-b", "basemodel", "qwen"]);
    wait_until("two links removed", Duration::from_secs(30), || link_text(&a).is_none() && link_text(&b).is_none());
    std::thread::sleep(Duration::from_secs(3));
    assert!(copy.is_dir() && trash_entries(&root) == 0, "the copy stays while the third uses it");
    assert!(ready(n, keys[0].0) && link_text(&c).as_deref() == Some(target.as_str()));
    kubectl(&["delete", "clusterbasemodel", "e2e-share-c"]);
    wait_until("the copy moved to the trash", Duration::from_secs(30), || {
        !copy.exists() && trash_entries(&root) == 1 && link_text(&c).is_none()
    });
    assert!(!labels(n).keys().any(|k| k.contains("e2e-share")), "{:?}", labels(n));
    agent.stop();
}

/// `ReuseIfExists` → `AlwaysDownload`: the link is removed, the model downloads its own copy at
/// its path, the unused shared copy goes. Then two models with one source and one path share
/// that directory and one download; it goes only when neither is alive.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t24_a_policy_switch_and_two_models_on_one_path() {
    super::setup();
    let n = "e2e-share2";
    node(n);
    let hub = hub();
    let root = scratch("e2e-share2-root");
    let agent = agent(&hub, n, &root);
    let commit = hub.commit_sha(REPO, "c1").unwrap();
    let copy = root.join(format!("_artifacts/{REPO}/{commit}"));
    let d = root.join("d/qwen");
    let d_label = "models.ome.io/clusterbasemodel.e2e-share-d";
    apply(&cluster_model("e2e-share-d", n, &d, "ReuseIfExists"));
    wait_until("d Ready through a link", Duration::from_secs(60), || ready(n, d_label) && link_text(&d).is_some());
    apply(&cluster_model("e2e-share-d", n, &d, "AlwaysDownload"));
    wait_until("d's own copy, Ready", Duration::from_secs(60), || {
        link_text(&d).is_none() && d.join(".model-agent-manifest.json").is_file() && ready(n, d_label)
    });
    assert_files_match(&hub, REPO, &d);
    wait_until("the unused shared copy trashed", Duration::from_secs(30), || !copy.exists());

    hub.clear_requests();
    let before = bytes_served(&hub);
    let same = root.join("same");
    let (e_label, f_label) =
        ("models.ome.io/clusterbasemodel.e2e-share-e", "models.ome.io/clusterbasemodel.e2e-share-f");
    apply(&cluster_model("e2e-share-e", n, &same, "AlwaysDownload"));
    apply(&cluster_model("e2e-share-f", n, &same, "AlwaysDownload"));
    wait_until("both on one path Ready", Duration::from_secs(60), || ready(n, e_label) && ready(n, f_label));
    let served = bytes_served(&hub) - before;
    let repo = repo_bytes(&hub, REPO);
    assert!(served < repo + repo / 10, "one download for two models: {served} bytes");
    let uids = |name: &str| super::uid_of(&["clusterbasemodel", name]);
    let mut both = vec![uids("e2e-share-e"), uids("e2e-share-f")];
    both.sort();
    wait_until("the marker names both", Duration::from_secs(10), || marker_uids(&same) == both);
    let trashed = trash_entries(&root);
    kubectl(&["delete", "clusterbasemodel", "e2e-share-e"]);
    wait_until("e's label removed", Duration::from_secs(30), || !labels(n).contains_key(e_label));
    std::thread::sleep(Duration::from_secs(3));
    assert!(same.join(".model-agent-manifest.json").is_file() && ready(n, f_label), "f still uses it");
    kubectl(&["delete", "clusterbasemodel", "e2e-share-f"]);
    wait_until("the shared path trashed", Duration::from_secs(30), || {
        !same.exists() && trash_entries(&root) == trashed + 1
    });
    kubectl(&["delete", "clusterbasemodel", "e2e-share-d"]);
    agent.stop();
}

/// Two models on one path and one source; while the agent is down, the one whose key sorts first
/// is moved to another repository. On restart its download would come before the other's check
/// (so nothing in this run has shown the other's files there yet) and replace the files under a
/// Ready model: the shell refuses it before the first snapshot, the core after. It is Failed,
/// the other stays Ready with its files; once the other is deleted, it downloads its own.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t33_a_co_owner_moved_to_another_repo_while_the_agent_was_down_leaves_the_other_s_files() {
    super::setup();
    let n = "e2e-share3";
    node(n);
    let hub = hub();
    let root = scratch("e2e-share3-root");
    let same = root.join("same");
    let moved =
        |repo: &str| model_of(repo, "kind: ClusterBaseModel\nmetadata: {name: e2e-move-a}", n, &same, "AlwaysDownload");
    let (a_label, b_label) = ("models.ome.io/clusterbasemodel.e2e-move-a", "models.ome.io/clusterbasemodel.e2e-move-b");
    let agent = agent(&hub, n, &root);
    apply(&moved(REPO));
    apply(&cluster_model("e2e-move-b", n, &same, "AlwaysDownload"));
    wait_until("both on one path Ready", Duration::from_secs(60), || ready(n, a_label) && ready(n, b_label));
    let mut both =
        vec![super::uid_of(&["clusterbasemodel", "e2e-move-a"]), super::uid_of(&["clusterbasemodel", "e2e-move-b"])];
    both.sort();
    wait_until("the marker names both", Duration::from_secs(10), || marker_uids(&same) == both);
    agent.stop();

    apply(&moved(OTHER_REPO));
    let agent = super::hf::agent(&hub, n, &root);
    let failed = |label: &str| labels(n).get(label).is_some_and(|v| v == "Failed");
    wait_until("the moved model Failed", Duration::from_secs(60), || failed(a_label));
    // Past its first retry (the backoff starts at a second) and the first snapshot.
    std::thread::sleep(Duration::from_secs(8));
    assert!(failed(a_label) && ready(n, b_label), "{:?}", labels(n));
    assert_files_match(&hub, REPO, &same);
    let b_uid = super::uid_of(&["clusterbasemodel", "e2e-move-b"]);
    // The other's re-check after the first snapshot rewrites the marker to its owners: it alone.
    assert!(marker_uids(&same).contains(&b_uid), "{:?}", marker_uids(&same));
    kubectl(&["delete", "clusterbasemodel", "e2e-move-b"]);
    wait_until("the moved model Ready with its own files", Duration::from_secs(60), || ready(n, a_label));
    assert_files_match(&hub, OTHER_REPO, &same);
    kubectl(&["delete", "clusterbasemodel", "e2e-move-a"]);
    wait_until("the path trashed", Duration::from_secs(30), || !same.exists());
    agent.stop();
}

/// Two models on one path and one source. One leaves the node (its nodeSelector no longer
/// matches) and gives the directory up to the other; the other is deleted and trashes it. Placed
/// on the node again, the first is not Ready on files that are gone: it downloads them again,
/// and its label reads Ready only once they are there.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t34_a_co_owner_placed_again_after_the_other_trashed_the_path_downloads_it_again() {
    super::setup();
    let n = "e2e-share4";
    node(n);
    let hub = hub();
    let root = scratch("e2e-share4-root");
    let same = root.join("same");
    let a_on =
        |to: &str| model_of(REPO, "kind: ClusterBaseModel\nmetadata: {name: e2e-back-a}", to, &same, "AlwaysDownload");
    let (a_label, b_label) = ("models.ome.io/clusterbasemodel.e2e-back-a", "models.ome.io/clusterbasemodel.e2e-back-b");
    let agent = agent(&hub, n, &root);
    apply(&a_on(n));
    apply(&cluster_model("e2e-back-b", n, &same, "AlwaysDownload"));
    wait_until("both on one path Ready", Duration::from_secs(60), || ready(n, a_label) && ready(n, b_label));
    apply(&a_on("e2e-nowhere"));
    wait_until("a's label removed", Duration::from_secs(30), || !labels(n).contains_key(a_label));
    assert!(same.join(".model-agent-manifest.json").is_file() && ready(n, b_label), "b keeps the path");
    kubectl(&["delete", "clusterbasemodel", "e2e-back-b"]);
    wait_until("the path trashed by b, the last one there", Duration::from_secs(30), || !same.exists());
    apply(&a_on(n));
    wait_until("a Ready again", Duration::from_secs(60), || ready(n, a_label));
    assert!(same.join(".model-agent-manifest.json").is_file(), "a labelled Ready on a path that is gone");
    assert_files_match(&hub, REPO, &same);
    kubectl(&["delete", "clusterbasemodel", "e2e-back-a"]);
    wait_until("the path trashed", Duration::from_secs(30), || !same.exists());
    agent.stop();
}

/// A shared copy removed by hand (upstream #834's drift, for a copy): the next drift pass reads
/// the whole root and finds no marker at the copy's path, so its two models go Updating, fetch it
/// again (one download between them) and are Ready on it, their links unchanged.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t38_a_shared_copy_removed_by_hand_is_fetched_again() {
    super::setup();
    let n = "e2e-share-gone";
    node(n);
    let hub = hub();
    let root = scratch("e2e-share-gone-root");
    // The shortest drift period the flag takes (`cli::DRIFT_PERIOD_MS_MIN`).
    let agent = agent_with(&hub, n, &root, &["--drift-period-ms", "60000"]);
    let commit = hub.commit_sha(REPO, "c1").unwrap();
    let copy = root.join(format!("_artifacts/{REPO}/{commit}"));
    let (g, h) = (root.join("g/qwen"), root.join("h/qwen"));
    apply(&cluster_model("e2e-share-gone-g", n, &g, "ReuseIfExists"));
    apply(&cluster_model("e2e-share-gone-h", n, &h, "ReuseIfExists"));
    let keys = ["models.ome.io/clusterbasemodel.e2e-share-gone-g", "models.ome.io/clusterbasemodel.e2e-share-gone-h"];
    wait_until("both Ready", Duration::from_secs(90), || keys.iter().all(|l| ready(n, l)));
    assert_files_match(&hub, REPO, &copy);
    let target = format!("../_artifacts/{REPO}/{commit}");
    let before = bytes_served(&hub);

    // The fetch again stalls 3 s on the big file, so the Updating labels are there to be seen.
    hub.faults().add(Fault::Stall {
        repo: REPO.into(),
        path: BIG.into(),
        after_bytes: 1 << 20,
        stall_ms: 3_000,
        count: 1,
    });
    std::fs::remove_dir_all(&copy).unwrap();
    wait_until("a drift pass sends them to fetch it again", Duration::from_secs(90), || {
        keys.iter().any(|l| labels(n).get(*l).is_some_and(|v| v == "Updating"))
    });
    wait_until("the copy back, both Ready on it", Duration::from_secs(90), || {
        copy.join(".model-agent-owner").exists() && keys.iter().all(|l| ready(n, l))
    });
    assert_files_match(&hub, REPO, &copy);
    let (refetched, repo) = (bytes_served(&hub) - before, repo_bytes(&hub, REPO));
    assert!(refetched >= repo && refetched < repo + repo / 10, "one download: {refetched} bytes for {repo}");
    for link in [&g, &h] {
        assert_eq!(link_text(link).as_deref(), Some(target.as_str()), "{}", link.display());
    }
    assert_eq!(trash_entries(&root), 0, "nothing trashed");
    agent.stop();
}
