//! `hf://` downloads end to end: the real agent, the real apiserver, and the project's fake Hub
//! (started in this test process on loopback ports; never the internet).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use model_agent_fakehub::{CommitFixture, FakeHub, Fault, Fixtures, RepoFixture, git_blob_oid, sha256_hex};

use super::{Agent, apply, entries, kubectl, label_key, labels, node, scratch, var, wait_until};

pub(super) const REPO: &str = "org/e2e";
/// Another repository, with other bytes at the same paths (t33).
pub(super) const OTHER_REPO: &str = "org/e2e-other";
pub(super) const BIG: &str = "weights/model-00001.safetensors";
pub(super) const BIG_BYTES: u64 = 4 << 20;
const SMALL_LFS: &str = "tokenizer.model";
const TOKEN: &str = "hf_e2e_secret_token";

pub(super) fn hub() -> FakeHub {
    let commit = CommitFixture::new()
        .file("config.json", r#"{"model_type":"llama","architectures":["LlamaForCausalLM"]}"#)
        .file("sub/dir/notes.txt", "nested")
        .generated_lfs(SMALL_LFS, 1 << 20, 3)
        .generated_lfs(BIG, BIG_BYTES, 5);
    let repo = |id: &str| RepoFixture::new(id).commit("c1", commit.clone()).branch("main", "c1");
    let other = CommitFixture::new()
        .file("config.json", r#"{"model_type":"mistral","architectures":["MistralForCausalLM"]}"#)
        .generated_lfs(BIG, BIG_BYTES, 9);
    let fixtures = Fixtures::new()
        .repo(repo(REPO))
        .repo(RepoFixture::new(OTHER_REPO).commit("c1", other).branch("main", "c1"))
        .repo(repo("org/private").private(TOKEN))
        .repo(repo("org/gated").gated(&[TOKEN]));
    FakeHub::start(fixtures).expect("the fake Hub")
}

pub(super) fn repo_bytes(hub: &FakeHub, repo: &str) -> u64 {
    let paths = hub.paths(repo, "main").unwrap();
    paths.iter().map(|p| hub.file(repo, "main", p).unwrap().size_bytes).sum()
}

/// The agent pointed at `hub`, reporting progress every half second.
pub(super) fn agent(hub: &FakeHub, n: &str, root: &Path) -> Agent {
    agent_with(hub, n, root, &[])
}

/// `agent` with more flags.
pub(super) fn agent_with(hub: &FakeHub, n: &str, root: &Path, extra: &[&str]) -> Agent {
    let mut command = Command::new(env!("CARGO_BIN_EXE_model-agent"));
    command.env("HF_ENDPOINT", hub.endpoint()).env_remove("HF_TOKEN");
    let flags: Vec<&str> = ["--download-progress-period-ms", "500"].iter().chain(extra).copied().collect();
    Agent::launch(command, &var("AGENT_KUBECONFIG"), n, root, &flags)
}

/// A ClusterBaseModel of `uri` into `dest`, placed on `n`; `storage_extra` goes into `storage`.
fn hf_model(name: &str, n: &str, uri: &str, dest: &Path, storage_extra: &str) -> String {
    format!(
        "apiVersion: ome.io/v1beta1\nkind: ClusterBaseModel\nmetadata:\n  name: {name}\nspec:\n  storage: {{storageUri: \"{uri}\", path: \"{}\", nodeSelector: {{e2e: {n}}}{storage_extra}}}\n",
        dest.display()
    )
}

fn entry(n: &str, name: &str) -> serde_json::Value {
    entries(n).get(&format!("clusterbasemodel.{name}")).cloned().unwrap_or(serde_json::Value::Null)
}

/// Every file of the repo is in `dir` with the size and hash the tree API gives, complete and
/// owned (its marker there).
pub(super) fn assert_files_match(hub: &FakeHub, repo: &str, dir: &Path) {
    assert_repo_files(hub, repo, dir);
    assert!(dir.join(".model-agent-owner").exists(), "the ownership marker is there");
}

/// Every file of the repo is in `dir` with the size and hash the tree API gives, and no partial
/// file is left.
fn assert_repo_files(hub: &FakeHub, repo: &str, dir: &Path) {
    for path in hub.paths(repo, "main").unwrap() {
        let info = hub.file(repo, "main", &path).unwrap();
        let bytes = std::fs::read(dir.join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(bytes.len() as u64, info.size_bytes, "{path}");
        match &info.lfs_sha256 {
            Some(sha) => assert_eq!(&sha256_hex(&bytes), sha, "{path}"),
            None => assert_eq!(git_blob_oid(&bytes), info.git_oid, "{path}"),
        }
    }
    assert!(!dir.join(".model-agent-partial").exists(), "no partial files are left");
}

pub(super) fn trash_entries(root: &Path) -> usize {
    std::fs::read_dir(root.join(".model-agent-trash")).map(|d| d.count()).unwrap_or(0)
}

/// The node label's value for ClusterBaseModel `name` on `n` ("" when there is none).
pub(super) fn status(n: &str, name: &str) -> String {
    labels(n).get(&label_key(name)).cloned().unwrap_or_default()
}

/// A started download: the Hub, the models root, the model's directory and the agent.
struct Downloading {
    hub: FakeHub,
    root: PathBuf,
    dest: PathBuf,
    agent: Agent,
}

/// Node `n`, an agent on a fresh root, and ClusterBaseModel `name` downloading `hf://REPO` into
/// `<root>/<dest>`; the big file stalls once after `after_bytes` for `stall_ms`.
fn start_stalled(n: &str, name: &str, dest: &str, (after_bytes, stall_ms): (u64, u64)) -> Downloading {
    node(n);
    let hub = hub();
    hub.faults().add(Fault::Stall { repo: REPO.into(), path: BIG.into(), after_bytes, stall_ms, count: 1 });
    let root = scratch(&format!("{n}-root"));
    let dest = root.join(dest);
    let agent = agent(&hub, n, &root);
    apply(&hf_model(name, n, &format!("hf://{REPO}"), &dest, ""));
    Downloading { hub, root, dest, agent }
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t14_hf_download_reports_progress_then_ready_and_a_delete_trashes_it() {
    super::setup();
    let (n, name) = ("e2e-hf", "e2e-hf-m");
    // The big file stalls for 3 s once: long enough to see the download's progress.
    let Downloading { hub, root, dest, agent } = start_stalled(n, name, "org/e2e", (1 << 20, 3_000));
    wait_until("progress in the entry while the label is Updating", Duration::from_secs(30), || {
        let e = entry(n, name);
        e["status"] == "Updating"
            && e["progress"]["totalBytes"].as_u64() == Some(repo_bytes(&hub, REPO))
            && status(n, name) == "Updating"
    });
    wait_until("label Ready", Duration::from_secs(60), || status(n, name) == "Ready");
    let e = entry(n, name);
    assert_eq!(e["status"], "Ready");
    assert!(e.get("progress").is_none(), "progress is cleared on Ready: {e}");
    let artifact = &e["config"]["artifact"];
    assert_eq!(artifact["sha"].as_str(), hub.commit_sha(REPO, "c1").as_deref(), "{e}");
    assert_eq!(artifact["parentPath"][format!("clusterbasemodel.{name}")], dest.to_str().unwrap());
    assert_eq!(artifact["childrenPaths"], serde_json::json!([]));
    // The downloaded config.json's metadata is beside the artifact.
    assert_eq!(
        (e["config"]["modelType"].as_str(), e["config"]["modelArchitecture"].as_str()),
        (Some("llama"), Some("LlamaForCausalLM")),
        "{e}"
    );
    assert_files_match(&hub, REPO, &dest);
    assert!(
        agent.metric(
            "model_agent_download_bytes_total{model_type=\"ClusterBaseModel\",namespace=\"\",name=\"e2e-hf-m\"}"
        ) >= repo_bytes(&hub, REPO) as f64
    );
    // Every byte came over the wire; the download is over, so it adds no speed.
    assert!(agent.metric("model_agent_download_fetched_bytes_total") >= repo_bytes(&hub, REPO) as f64);
    assert_eq!(agent.metric("model_agent_downloads_in_progress"), 0.0);
    assert_eq!(agent.metric("model_agent_download_speed_bytes_per_second"), 0.0);
    assert_scrape_has_the_download(&agent, name);
    kubectl(&["delete", "clusterbasemodel", name]);
    wait_until("label removed", Duration::from_secs(30), || !labels(n).contains_key(&label_key(name)));
    wait_until("the directory moved to the trash", Duration::from_secs(30), || {
        !dest.exists() && trash_entries(&root) == 1
    });
    agent.stop();
}

/// The running agent's `/metrics`, read by `prometheus-parse`: the download's duration in OME's
/// buckets under OME's labels, and its success counted.
fn assert_scrape_has_the_download(agent: &super::Agent, name: &str) {
    use prometheus_parse::{Scrape, Value};
    let (code, body) = agent.get("/metrics");
    assert_eq!(code, 200);
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("/metrics parses");
    let of_model = |metric: &str| {
        scrape.samples.iter().find(|s| {
            s.metric == metric
                && s.labels.get("name") == Some(name)
                && s.labels.get("model_type") == Some("ClusterBaseModel")
        })
    };
    let duration = of_model("model_agent_download_duration_seconds").expect("the download's duration");
    let Value::Histogram(buckets) = &duration.value else { panic!("{duration:?}") };
    let bounds: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
    assert_eq!(bounds, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2, f64::INFINITY]);
    let success = of_model("model_agent_downloads_success_total").expect("the success counted");
    assert_eq!(success.value, Value::Counter(1.0));
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t15_hf_token_from_a_secret_and_a_gated_repo_without_one_fails_with_the_reason() {
    super::setup();
    let n = "e2e-hf-token";
    node(n);
    let hub = hub();
    apply(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: e2e-hf-token\n  namespace: ome\nstringData:\n  hf-token: {TOKEN}\n"
    ));
    let root = scratch("hf-token-root");
    let _agent = agent(&hub, n, &root);
    let with_secret = ", key: e2e-hf-token, parameters: {secretKey: hf-token}";
    apply(&hf_model("e2e-hf-private", n, "hf://org/private", &root.join("private"), with_secret));
    apply(&hf_model("e2e-hf-gated", n, "hf://org/gated", &root.join("gated"), ""));
    apply(&hf_model("e2e-hf-nosecret", n, "hf://org/private", &root.join("nosecret"), ", key: e2e-hf-missing"));
    wait_until("the private repo Ready with the Secret's token", Duration::from_secs(60), || {
        status(n, "e2e-hf-private") == "Ready"
    });
    assert_files_match(&hub, "org/private", &root.join("private"));
    wait_until("the gated repo Failed", Duration::from_secs(60), || status(n, "e2e-hf-gated") == "Failed");
    let reason = entry(n, "e2e-hf-gated")["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("gated"), "{reason}");
    // `kubectl describe` shows why, and on which node: a Warning event on the model.
    wait_until("a Failed event on the gated model", Duration::from_secs(30), || {
        let selector = "involvedObject.kind=ClusterBaseModel,involvedObject.name=e2e-hf-gated";
        let out = kubectl(&["get", "events", "-n", "default", "--field-selector", selector, "-o", "json"]);
        let events: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        events["items"].as_array().is_some_and(|items| {
            items.iter().any(|e| {
                e["reason"] == "FailedOnNode"
                    && e["type"] == "Warning"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(&format!("node {n}: ")) && m.contains("gated"))
            })
        })
    });
    wait_until("a missing Secret Failed", Duration::from_secs(60), || status(n, "e2e-hf-nosecret") == "Failed");
    let reason = entry(n, "e2e-hf-nosecret")["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("Secret ome/e2e-hf-missing") && reason.contains("not found"), "{reason}");
    // The token went to the Hub only, and it is in no trace the agent wrote.
    let trace = std::fs::read_to_string(Agent::scratch_dir(n).join("trace.jsonl")).unwrap();
    assert!(!trace.contains(TOKEN), "the token is in the trace");
    for name in ["e2e-hf-private", "e2e-hf-gated", "e2e-hf-nosecret"] {
        kubectl(&["delete", "clusterbasemodel", name]);
    }
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t16_a_delete_during_a_download_cancels_it_and_trashes_the_directory() {
    super::setup();
    let (n, name) = ("e2e-hf-cancel", "e2e-hf-cancel-m");
    let Downloading { hub, root, dest, agent } = start_stalled(n, name, "cancel", (1 << 20, 120_000));
    wait_until("the big file half fetched", Duration::from_secs(30), || hub.bytes_served(REPO, BIG) >= 1 << 20);
    assert_eq!(status(n, name), "Updating");
    kubectl(&["delete", "clusterbasemodel", name]);
    // The Hub stalls for two minutes: only a cancel ends the download this soon.
    wait_until("label and entry removed", Duration::from_secs(20), || {
        !labels(n).contains_key(&label_key(name)) && entry(n, name).is_null()
    });
    wait_until("nothing left outside the trash", Duration::from_secs(20), || {
        !dest.exists() && trash_entries(&root) == 1
    });
    let log = std::fs::read_to_string(Agent::scratch_dir(n).join("agent.log")).unwrap();
    assert!(log.contains("download cancelled"), "the agent says it cancelled");
    agent.stop();
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t17_a_killed_download_resumes_and_a_directory_ome_downloaded_is_adopted() {
    super::setup();
    let (n, name) = ("e2e-hf-resume", "e2e-hf-resume-m");
    let Downloading { hub, root, dest, agent: first } = start_stalled(n, name, "resume", (3 << 20, 120_000));
    wait_until("3 MiB of the big file fetched", Duration::from_secs(30), || hub.bytes_served(REPO, BIG) >= 3 << 20);
    std::thread::sleep(Duration::from_millis(500));
    drop(first); // SIGKILL mid-download
    hub.faults().clear();
    let second = agent(&hub, n, &root);
    wait_until("label Ready after the restart", Duration::from_secs(60), || status(n, name) == "Ready");
    assert_files_match(&hub, REPO, &dest);
    let served: u64 = hub.bytes_served_all().iter().filter(|f| f.repo == REPO).map(|f| f.bytes).sum();
    let size = repo_bytes(&hub, REPO);
    assert!(served as f64 <= 1.1 * size as f64, "fetched {served} bytes across the two runs for a {size}-byte repo");
    // OME's agent downloaded this directory: the same files, no marker, no manifest.
    let ome_dir = adopt_fixture(&dest, &root.join("from-ome"));
    let before = hub.bytes_served(REPO, BIG);
    apply(&hf_model("e2e-hf-adopt", n, &format!("hf://{REPO}"), &ome_dir, ""));
    wait_until("the adopted model Ready", Duration::from_secs(60), || status(n, "e2e-hf-adopt") == "Ready");
    assert_eq!(hub.bytes_served(REPO, BIG), before, "no weights downloaded again");
    assert_files_match(&hub, REPO, &ome_dir);
    for m in [name, "e2e-hf-adopt"] {
        kubectl(&["delete", "clusterbasemodel", m]);
    }
    second.stop();
}

/// A copy of a downloaded directory without this agent's marker and manifest: what OME's own
/// agent leaves behind.
fn adopt_fixture(from: &Path, to: &Path) -> PathBuf {
    let status = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(status.success());
    std::fs::remove_file(to.join(".model-agent-owner")).unwrap();
    let _ = std::fs::remove_file(to.join(".model-agent-manifest.json"));
    to.to_path_buf()
}

/// `OLAH_MANIFEST`'s lines: sha256, size and path of every file at the fixture's main.
fn olah_manifest() -> Vec<(String, u64, String)> {
    let text = std::fs::read_to_string(var("OLAH_MANIFEST")).expect("the olah fixture's manifest");
    let line = |l: &str| {
        let mut parts = l.splitn(3, ' ');
        let (sha, size, path) = (parts.next()?, parts.next()?, parts.next()?);
        Some((sha.to_string(), size.parse().ok()?, path.to_string()))
    };
    text.lines().map(|l| line(l).unwrap_or_else(|| panic!("manifest line {l:?}"))).collect()
}

#[test]
#[ignore = "needs a real kube-apiserver and olah (a Hub the project did not write): run by scripts/e2e"]
fn t18_hf_downloads_from_olah_a_hub_the_project_did_not_write() {
    super::setup();
    let n = "e2e-olah";
    node(n);
    let (endpoint, repo) = (var("OLAH_ENDPOINT"), var("OLAH_REPO"));
    let root = scratch("olah-root");
    let mut command = Command::new(env!("CARGO_BIN_EXE_model-agent"));
    command.env("HF_ENDPOINT", &endpoint).env_remove("HF_TOKEN");
    // Files from 1 MiB on are asked for in ranged parts; olah ignores Range and answers 200 whole.
    let _agent = Agent::launch(command, &var("AGENT_KUBECONFIG"), n, &root, &["--multipart-threshold", "1048576"]);
    apply(&hf_model("e2e-olah-main", n, &format!("hf://{repo}"), &root.join("main"), ""));
    let tag = var("OLAH_TAG");
    apply(&hf_model("e2e-olah-tag", n, &format!("hf://{repo}@{tag}"), &root.join("tag"), ""));
    for name in ["e2e-olah-main", "e2e-olah-tag"] {
        wait_until(&format!("{name} Ready"), Duration::from_secs(90), || status(n, name) == "Ready");
    }
    assert_eq!(entry(n, "e2e-olah-main")["config"]["artifact"]["sha"], var("OLAH_COMMIT"));
    for (sha, size, path) in olah_manifest() {
        let bytes = std::fs::read(root.join("main").join(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!((bytes.len() as u64, sha256_hex(&bytes)), (size, sha), "{path}");
    }
    // The tag is resolved to its own commit, and every file comes from it.
    assert_eq!(entry(n, "e2e-olah-tag")["config"]["artifact"]["sha"], var("OLAH_TAG_COMMIT"));
    let config = std::fs::read_to_string(root.join("tag/config.json")).unwrap();
    assert!(config.contains("\"version\": 1"), "config.json of the tag: {config}");
    assert!(!root.join("tag/weights").exists(), "a file of main in the tag's directory");
    for name in ["e2e-olah-main", "e2e-olah-tag"] {
        kubectl(&["delete", "clusterbasemodel", name]);
    }
}

/// A tmpfs of `mib` MiB mounted on `dir`; unmounted on drop.
struct SmallFilesystem(PathBuf);

impl SmallFilesystem {
    fn new(dir: &Path, mib: u64) -> SmallFilesystem {
        let args = ["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs", dir.to_str().unwrap()];
        assert!(Command::new("mount").args(args).status().unwrap().success(), "mount {args:?}");
        SmallFilesystem(dir.to_path_buf())
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Writes `path` until the filesystem is full.
fn fill(path: &Path) {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    // What did not fit in the last chunk, byte by byte.
    while file.write_all(&[0]).is_ok() {}
}

#[test]
#[ignore = "needs a real kube-apiserver and root (mount): run by scripts/e2e"]
fn t19_a_disk_that_fills_mid_download_fails_it_and_it_resumes_once_there_is_room() {
    super::setup();
    let (n, name) = ("e2e-hf-full", "e2e-hf-full-m");
    node(n);
    let hub = hub();
    hub.faults().add(Fault::Stall {
        repo: REPO.into(),
        path: BIG.into(),
        after_bytes: 1 << 20,
        stall_ms: 3_000,
        count: 1,
    });
    let root = scratch(&format!("{n}-root"));
    // Room for the repo (about 5 MiB) and the space check's margin, not for anything else as well.
    let _tmpfs = SmallFilesystem::new(&root, 8);
    let dest = root.join("model");
    let agent = agent(&hub, n, &root);
    apply(&hf_model(name, n, &format!("hf://{REPO}"), &dest, ""));
    wait_until("the big file started", Duration::from_secs(30), || hub.bytes_served(REPO, BIG) >= 1 << 20);
    // Another writer takes the rest of the disk while the download waits for the Hub.
    let filler = root.join("filler");
    fill(&filler);
    wait_until("label Failed", Duration::from_secs(30), || status(n, name) == "Failed");
    let reason = entry(n, name)["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("No space left on device"), "{reason}");
    let fetched_before = hub.bytes_served(REPO, BIG);
    std::fs::remove_file(&filler).unwrap();
    wait_until("label Ready once there is room", Duration::from_secs(90), || status(n, name) == "Ready");
    assert_files_match(&hub, REPO, &dest);
    // The partial file was kept: the retry resumed it instead of starting from zero.
    assert!(hub.bytes_served(REPO, BIG) < fetched_before + BIG_BYTES, "the big file was fetched again whole");
    assert_eq!(agent.get("/healthz").0, 200, "a full disk is no readiness matter");
    kubectl(&["delete", "clusterbasemodel", name]);
    agent.stop();
}

/// A reserved model (`label` the reserve label's value) downloaded by a first agent on node
/// `n`, Ready: the hub, the root, its directory and that agent.
fn a_reserved_model_ready(n: &str, name: &str, label: &str) -> (FakeHub, PathBuf, PathBuf, Agent) {
    node(n);
    let hub = hub();
    let root = scratch(&format!("{n}-root"));
    let dest = root.join("kept");
    let first = agent(&hub, n, &root);
    let labels = format!("metadata:\n  labels: {{models.ome/reserve-model-artifact: \"{label}\"}}\n");
    apply(&hf_model(name, n, &format!("hf://{REPO}"), &dest, "").replace("metadata:\n", &labels));
    wait_until("label Ready", Duration::from_secs(60), || status(n, name) == "Ready");
    assert_files_match(&hub, REPO, &dest);
    (hub, root, dest, first)
}

/// A directory whose marker names a uid no model has: the next sweep trashes it, which shows the
/// sweep ran.
fn a_ghost_directory(root: &Path) -> PathBuf {
    let ghost = root.join("ghost");
    std::fs::create_dir_all(&ghost).unwrap();
    std::fs::write(ghost.join(".model-agent-owner"), r#"{"uid":"uid-of-no-model","key":"ClusterBaseModel/ghost"}"#)
        .unwrap();
    ghost
}

/// A model carrying the reserve label keeps its weights on the node after its delete, as
/// upstream does, and no later orphan sweep takes them: the agent gives the directory up (the
/// marker goes) when the delete is confirmed. A restart runs the sweep at once; a directory
/// whose marker names a uid no model has is trashed by it, which shows the sweep ran.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t35_a_reserved_model_s_weights_outlive_its_delete_and_the_sweep_after_a_restart() {
    super::setup();
    let (n, name) = ("e2e-reserve", "e2e-reserve-m");
    let (hub, root, dest, first) = a_reserved_model_ready(n, name, "True");
    kubectl(&["delete", "clusterbasemodel", name]);
    wait_until("label removed", Duration::from_secs(30), || !labels(n).contains_key(&label_key(name)));
    wait_until("the directory given up", Duration::from_secs(30), || !dest.join(".model-agent-owner").exists());
    first.stop();
    let ghost = a_ghost_directory(&root);
    let agent = agent(&hub, n, &root);
    wait_until("the sweep trashed the ghost's directory", Duration::from_secs(60), || !ghost.exists());
    assert!(dest.join(BIG).is_file(), "the reserved model's weights were taken");
    assert_eq!(trash_entries(&root), 1, "only the ghost's directory is in the trash");
    agent.stop();
}

/// A reserved model deleted while no agent runs is unknown to the next one, and its directory
/// an orphan's; the marker records that the model was reserved when it downloaded, so the next
/// agent's sweep gives the directory up (the marker goes, the weights stay, as upstream keeps
/// them) instead of trashing it. A ghost's directory, of no reserved model, shows the sweep ran.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t36_a_reserved_model_deleted_while_the_agent_is_down_keeps_its_weights() {
    super::setup();
    let (n, name) = ("e2e-reserve-down", "e2e-reserve-down-m");
    let (hub, root, dest, first) = a_reserved_model_ready(n, name, "true");
    let marker: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dest.join(".model-agent-owner")).unwrap()).unwrap();
    assert_eq!(marker["reserved"], serde_json::json!([marker["uid"]]), "{marker}");
    deleted_while_down_keeps_its_weights((n, name), &hub, (&root, &dest), first);
}

/// The agent stops, the model is deleted, the next agent's sweep trashes a ghost's directory and
/// gives the model's up (the marker goes) with every file of the repo in place.
fn deleted_while_down_keeps_its_weights(
    (n, name): (&str, &str),
    hub: &FakeHub,
    (root, dest): (&Path, &Path),
    first: Agent,
) {
    first.stop();
    kubectl(&["delete", "clusterbasemodel", name, "--wait=true"]);
    let ghost = a_ghost_directory(root);
    let agent = agent(hub, n, root);
    wait_until("the sweep trashed the ghost's directory", Duration::from_secs(60), || !ghost.exists());
    wait_until("the directory given up", Duration::from_secs(30), || !dest.join(".model-agent-owner").exists());
    assert_repo_files(hub, REPO, dest);
    assert_eq!(trash_entries(root), 1, "only the ghost's directory is in the trash");
    agent.stop();
}

/// The reserve label added to a model already Ready goes into its marker while the agent runs
/// (`Op::RecordReserve`), with no download and no change of its label; deleted while the agent
/// is down, the model then keeps its weights as in t36.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t37_a_reserve_label_added_later_is_recorded_and_keeps_the_weights_after_a_delete_while_down() {
    super::setup();
    let (n, name) = ("e2e-reserve-later", "e2e-reserve-later-m");
    let (hub, root, dest, first) = a_reserved_model_ready(n, name, "false");
    let marker = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dest.join(".model-agent-owner")).unwrap()).unwrap()
    };
    assert!(marker().get("reserved").is_none(), "{}", marker());
    let served = hub.bytes_served(REPO, BIG);
    kubectl(&["label", "clusterbasemodel", name, "models.ome/reserve-model-artifact=true", "--overwrite"]);
    wait_until("the label recorded", Duration::from_secs(30), || {
        marker()["reserved"] == serde_json::json!([marker()["uid"]])
    });
    assert_eq!(status(n, name), "Ready");
    assert_eq!(hub.bytes_served(REPO, BIG), served, "nothing downloaded again");
    deleted_while_down_keeps_its_weights((n, name), &hub, (&root, &dest), first);
}
