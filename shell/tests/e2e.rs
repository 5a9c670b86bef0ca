//! End-to-end tests against a real kube-apiserver with etcd, started by `scripts/e2e` (through
//! `scripts/kube/with-apiserver`). The agent always runs under the token bound to the RBAC in
//! `deploy/` (not as admin); the tests use the admin identity to play users and the controller.
//! Every test has its own Node and selects its models onto it with a label, so tests never see
//! each other's models.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

const NEEDS: &str = "needs a real kube-apiserver: run by scripts/e2e";

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run these tests through scripts/e2e"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kubectl_as(kubeconfig: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|e| format!("kubectl: {e}"))?;
    if let Some(input) = stdin {
        child.stdin.take().expect("piped").write_all(input.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

fn kubectl(args: &[&str]) -> String {
    kubectl_as(&var("ADMIN_KUBECONFIG"), args, None).unwrap_or_else(|e| panic!("{e}"))
}

fn apply(yaml: &str) {
    kubectl_as(&var("ADMIN_KUBECONFIG"), &["apply", "-f", "-"], Some(yaml)).unwrap_or_else(|e| panic!("{e}"));
}

static SETUP: Once = Once::new();

/// CRDs, namespace, ServiceAccount and RBAC from deploy/, once per run.
fn setup() {
    SETUP.call_once(|| {
        let deploy = repo().join("deploy");
        kubectl(&[
            "apply",
            "-f",
            deploy.join("crds.yaml").to_str().unwrap(),
            "-f",
            deploy.join("rbac.yaml").to_str().unwrap(),
        ]);
        kubectl(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/basemodels.ome.io",
            "crd/clusterbasemodels.ome.io",
        ]);
    });
}

fn node(name: &str) {
    apply(&format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {{e2e: {name}}}\n"));
}

/// A ClusterBaseModel placed on `node` only.
fn model(name: &str, node: &str, uri: &str, path: Option<&str>, finalizer: bool) -> String {
    let path = path.map(|p| format!(", path: \"{p}\"")).unwrap_or_default();
    let fin = if finalizer { "\n  finalizers: [clusterbasemodels.ome.io/finalizer]" } else { "" };
    format!(
        "apiVersion: ome.io/v1beta1\nkind: ClusterBaseModel\nmetadata:\n  name: {name}{fin}\nspec:\n  storage: {{storageUri: \"{uri}\"{path}, nodeSelector: {{e2e: {node}}}}}\n"
    )
}

fn labels(node: &str) -> BTreeMap<String, String> {
    let out = kubectl(&["get", "node", node, "-o", "jsonpath={.metadata.labels}"]);
    serde_json::from_str(&out).unwrap_or_default()
}

fn entries(node: &str) -> BTreeMap<String, serde_json::Value> {
    let Ok(out) =
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["-n", "ome", "get", "cm", node, "-o", "jsonpath={.data}"], None)
    else {
        return BTreeMap::new();
    };
    let data: BTreeMap<String, String> = serde_json::from_str(&out).unwrap_or_default();
    data.into_iter().map(|(k, v)| (k, serde_json::from_str(&v).unwrap_or(serde_json::Value::Null))).collect()
}

fn label_key(name: &str) -> String {
    format!("models.ome.io/clusterbasemodel.{name}")
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("timed out after {timeout:?} waiting for: {what}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The agent binary, running as the RBAC-bound ServiceAccount identity.
struct Agent {
    child: Child,
    port: u16,
    trace: PathBuf,
    log: PathBuf,
}

impl Agent {
    fn start(node: &str, root: &Path, extra: &[&str]) -> Agent {
        Agent::start_as(&var("AGENT_KUBECONFIG"), node, root, extra)
    }

    /// The agent under another kubeconfig (t10: impersonation with the node-name extra).
    fn start_as(kubeconfig: &str, node: &str, root: &Path, extra: &[&str]) -> Agent {
        Agent::launch(Command::new(env!("CARGO_BIN_EXE_model-agent")), kubeconfig, node, root, extra)
    }

    /// `command` runs the agent binary (t13: under setpriv, as another uid).
    fn launch(mut command: Command, kubeconfig: &str, node: &str, root: &Path, extra: &[&str]) -> Agent {
        let dir = Agent::scratch_dir(node);
        std::fs::create_dir_all(&dir).unwrap();
        let (trace, log) = (dir.join("trace.jsonl"), dir.join("agent.log"));
        let port = free_port();
        let child = command
            .env("NODE_NAME", node)
            .args(["--kubeconfig", kubeconfig, "--models-root-dir", root.to_str().unwrap()])
            .args(["--port", &port.to_string(), "--record-trace", trace.to_str().unwrap(), "--log-level", "debug"])
            .args(extra)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the model-agent binary");
        let agent = Agent { child, port, trace, log };
        wait_until("the agent's HTTP server", Duration::from_secs(20), || agent.get("/livez").0 == 200);
        agent
    }

    /// Where the agent's trace and log go.
    fn scratch_dir(node: &str) -> PathBuf {
        std::env::temp_dir().join(format!("model-agent-e2e-{node}"))
    }

    /// (status, body) of a GET on the agent's port; (0, error) when it does not answer.
    fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else { return (0, "no answer".into()) };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (code, body)
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(f64::NAN)
    }

    fn signal(&self, sig: &str) {
        Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status().unwrap();
    }

    /// SIGTERM and wait for the exit; returns how long it took.
    fn stop(mut self) -> Duration {
        let start = Instant::now();
        self.signal("TERM");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "agent exit status {status}; log {}", self.log.display());
        start.elapsed()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Removed ConfigMap entries: (key, the uid the entry carried).
type EntryRemovals = Vec<(String, Option<String>)>;

/// Records every change of this node's model labels and of its ConfigMap entries.
struct Recorder {
    children: Vec<Child>,
    label_removals: Arc<Mutex<Vec<String>>>,
    entry_removals: Arc<Mutex<EntryRemovals>>,
}

impl Recorder {
    fn start(node: &str) -> Recorder {
        let label_removals = Arc::new(Mutex::new(Vec::new()));
        let entry_removals = Arc::new(Mutex::new(Vec::new()));
        let kc = var("ADMIN_KUBECONFIG");
        let spawn = |args: &[&str]| {
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kc)
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut nodes = spawn(&["get", "node", node, "--watch", "-o", "jsonpath={.metadata.labels}{\"\\n\"}"]);
        let mut cms = spawn(&["-n", "ome", "get", "cm", node, "--watch", "-o", "jsonpath={.data}{\"\\n\"}"]);
        let removals = label_removals.clone();
        let out = nodes.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut prev: BTreeMap<String, String> = BTreeMap::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let now: BTreeMap<String, String> = serde_json::from_str(&line).unwrap_or_default();
                for k in prev.keys().filter(|k| k.starts_with("models.ome.io/") && !now.contains_key(*k)) {
                    removals.lock().unwrap().push(k.clone());
                }
                prev = now;
            }
        });
        let removals = entry_removals.clone();
        let out = cms.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut prev: BTreeMap<String, String> = BTreeMap::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let now: BTreeMap<String, String> = serde_json::from_str(&line).unwrap_or_default();
                for (k, v) in prev.iter().filter(|(k, _)| !now.contains_key(*k)) {
                    let uid = serde_json::from_str::<serde_json::Value>(v)
                        .ok()
                        .and_then(|e| e["uid"].as_str().map(str::to_string));
                    removals.lock().unwrap().push((k.clone(), uid));
                }
                prev = now;
            }
        });
        std::thread::sleep(Duration::from_secs(1));
        Recorder { children: vec![nodes, cms], label_removals, entry_removals }
    }

    fn finish(mut self) -> (Vec<String>, EntryRemovals) {
        std::thread::sleep(Duration::from_secs(1));
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let l = self.label_removals.lock().unwrap().clone();
        let e = self.entry_removals.lock().unwrap().clone();
        (l, e)
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("model-agent-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A read-only bind mount of a fresh directory (tests run as root).
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    fn new(name: &str) -> ReadOnlyMount {
        let dir = scratch(name);
        let run =
            |args: &[&str]| assert!(Command::new("mount").args(args).status().unwrap().success(), "mount {args:?}");
        run(&["--bind", dir.to_str().unwrap(), dir.to_str().unwrap()]);
        run(&["-o", "remount,ro,bind", dir.to_str().unwrap()]);
        assert!(std::fs::write(dir.join("probe"), b"x").is_err(), "the mount is read-only");
        ReadOnlyMount(dir)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A ClusterBaseModel that downloads, placed on this node while the agent cannot write its
/// models root: readiness fails naming the model, and its entry and label turn Failed. Returns
/// the verbose readiness body and the entry's reason.
fn place_a_download_on_an_unwritable_root(agent: &Agent, n: &str, name: &str, root: &Path) -> (String, String) {
    let dest = root.join("hf-model");
    apply(&model(name, n, "hf://org/repo", Some(dest.to_str().unwrap()), false));
    wait_until("/healthz not ready", Duration::from_secs(30), || agent.get("/healthz").0 == 500);
    let (_, body) = agent.get("/healthz?verbose");
    assert!(body.contains(&format!("ClusterBaseModel/{name}")), "{body}");
    let cm_key = format!("clusterbasemodel.{name}");
    wait_until("the hf entry Failed", Duration::from_secs(30), || {
        entries(n).get(&cm_key).is_some_and(|e| e["status"] == "Failed")
    });
    let reason = entries(n)[&cm_key]["reason"].as_str().unwrap_or_default().to_string();
    assert_eq!(labels(n).get(&label_key(name)).map(String::as_str), Some("Failed"));
    (body, reason)
}

/// Test 1, the first seed: a local:// model on a read-only models root is Ready and so is the
/// agent. A tenant's BaseModel that must download onto it is Failed on the node and readiness
/// stays 200 (no tenant can stall a rollout); a ClusterBaseModel that must download makes the
/// agent unready, with a reason naming the root and the model, and its entry is Failed with that
/// reason.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t1_read_only_models_root() {
    setup();
    let n = "e2e-ro";
    node(n);
    let root = ReadOnlyMount::new("ro-root");
    let share = scratch("ro-share");
    std::fs::create_dir_all(share.join("llama")).unwrap();
    apply(&model("e2e-ro-local", n, &format!("local://{}", share.join("llama").display()), None, false));
    let agent = Agent::start(n, &root.0, &[]);
    wait_until("label Ready", Duration::from_secs(30), || {
        labels(n).get(&label_key("e2e-ro-local")).map(String::as_str) == Some("Ready")
    });
    let e = entries(n);
    assert_eq!(e["clusterbasemodel.e2e-ro-local"]["status"], "Ready");
    wait_until("/healthz 200 on a read-only root", Duration::from_secs(30), || agent.get("/healthz").0 == 200);
    assert_eq!(agent.metric("model_agent_models_root_writable"), 0.0);

    apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: e2e-tenant}\n");
    let tenant_path = root.0.join("tenant-model");
    apply(&format!(
        "apiVersion: ome.io/v1beta1\nkind: BaseModel\nmetadata: {{name: e2e-ro-tenant, namespace: e2e-tenant}}\nspec:\n  storage: {{storageUri: \"hf://org/repo\", path: \"{}\", nodeSelector: {{e2e: {n}}}}}\n",
        tenant_path.display()
    ));
    wait_until("tenant entry Failed", Duration::from_secs(30), || {
        entries(n).get("e2e-tenant.basemodel.e2e-ro-tenant").is_some_and(|e| e["status"] == "Failed")
    });
    let e = entries(n);
    let reason = e["e2e-tenant.basemodel.e2e-ro-tenant"]["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("read-only"), "{reason}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, body) = agent.get("/healthz?verbose");
    assert_eq!(code, 200, "a tenant's BaseModel never flips readiness: {body}");

    let (body, reason) = place_a_download_on_an_unwritable_root(&agent, n, "e2e-ro-hf", &root.0);
    assert!(body.contains("read-only"), "{body}");
    assert!(reason.contains("read-only") && reason.contains("hf://"), "{reason}");
    assert!(agent.stop() < Duration::from_secs(30));
    kubectl(&["delete", "clusterbasemodel", "e2e-ro-local", "e2e-ro-hf", "--wait=false"]);
    kubectl(&["-n", "e2e-tenant", "delete", "basemodel", "e2e-ro-tenant", "--wait=false"]);
}

/// Test 2: a real delete. With the controller's finalizer on the model (played by the test),
/// the delete sets deletionTimestamp; the agent removes its label and entry; then the test
/// removes the finalizer and the object is gone.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t2_real_delete() {
    setup();
    let n = "e2e-del";
    node(n);
    let root = scratch("del-root");
    let share = scratch("del-share");
    apply(&model("e2e-del-m", n, &format!("local://{}", share.display()), None, true));
    let agent = Agent::start(n, &root, &[]);
    wait_until("label Ready", Duration::from_secs(30), || labels(n).contains_key(&label_key("e2e-del-m")));
    kubectl(&["delete", "clusterbasemodel", "e2e-del-m", "--wait=false"]);
    wait_until("label removed", Duration::from_secs(30), || !labels(n).contains_key(&label_key("e2e-del-m")));
    wait_until("entry removed", Duration::from_secs(30), || !entries(n).contains_key("clusterbasemodel.e2e-del-m"));
    kubectl(&[
        "patch",
        "clusterbasemodel",
        "e2e-del-m",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    wait_until("object gone", Duration::from_secs(30), || {
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["get", "clusterbasemodel", "e2e-del-m"], None).is_err()
    });
    // The cleanup is counted when the write's outcome reaches the core, which may be a moment
    // after the API server shows the write.
    wait_until("cleanup counted", Duration::from_secs(30), || agent.metric("model_agent_cleanups_total") >= 1.0);
    agent.stop();
}

const CRD_CHANGE: &str = "description: changed by the model-agent e2e test";

/// Server-side apply a changed model CRD (both kinds): the API server drops every watch and the
/// agent relists.
fn apply_changed_crds(round: usize) {
    let crds = std::fs::read_to_string(repo().join("deploy/crds.yaml")).unwrap();
    let changed = crds.replace(
        "      openAPIV3Schema:\n        type: object\n",
        &format!("      openAPIV3Schema:\n        type: object\n        {CRD_CHANGE} {round}\n"),
    );
    assert_ne!(changed, crds);
    for doc in changed.split("\n---\n") {
        kubectl_as(
            &var("ADMIN_KUBECONFIG"),
            &["apply", "--server-side", "--force-conflicts", "--field-manager=e2e-ssa", "-f", "-"],
            Some(doc),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn ready_count(n: &str, prefix: &str) -> usize {
    labels(n).iter().filter(|(k, v)| k.contains(prefix) && v.as_str() == "Ready").count()
}

/// Test 3, the second seed, and test 7: with 50 models Ready, server-side apply changed CRDs
/// (both kinds) while watching the node and the ConfigMap for the whole test: zero label removals
/// and zero entry removals. Then the trace the agent recorded replays through the core with the
/// same effects.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t3_crd_server_side_apply_under_load_and_t7_replay() {
    setup();
    let n = "e2e-ssa";
    node(n);
    let root = scratch("ssa-root");
    let share = scratch("ssa-share");
    let recorder = Recorder::start(n);
    let mut yaml = String::new();
    for i in 0..50 {
        std::fs::create_dir_all(share.join(format!("m{i}"))).unwrap();
        yaml.push_str(&model(&format!("e2e-ssa-{i:02}"), n, &format!("local://{}/m{i}", share.display()), None, false));
        yaml.push_str("---\n");
    }
    apply(&yaml);
    let agent = Agent::start(n, &root, &[]);
    wait_until("50 models Ready", Duration::from_secs(60), || ready_count(n, "e2e-ssa-") == 50);
    for round in 0..2 {
        apply_changed_crds(round);
        // The watches drop and come back; give the relists and any live reads time to land.
        std::thread::sleep(Duration::from_secs(8));
        assert_eq!(ready_count(n, "e2e-ssa-"), 50, "round {round}");
    }
    wait_until("the agent sees the models again", Duration::from_secs(30), || agent.get("/readyz").0 == 200);
    let (label_removals, entry_removals) = recorder.finish();
    assert!(label_removals.is_empty(), "labels removed: {label_removals:?}");
    assert!(entry_removals.is_empty(), "entries removed: {entry_removals:?}");
    assert_eq!(ready_count(n, "e2e-ssa-"), 50);
    let trace_path = agent.trace.clone();
    agent.stop();

    // Test 7: the recorded trace replays byte for byte.
    let text = std::fs::read_to_string(&trace_path).unwrap();
    let trace = model_agent_core::trace::parse(&text).expect("the recorded trace parses");
    assert!(trace.steps.len() > 100, "{} steps", trace.steps.len());
    let relists = text.matches("RelistStarted").count();
    assert!(relists >= 4, "the CRD applies made the agent relist ({relists} relists recorded)");
    let (_, divergence) = model_agent_core::trace::replay(&trace);
    assert_eq!(divergence, None);
    let names: Vec<String> = (0..50).map(|i| format!("e2e-ssa-{i:02}")).collect();
    let mut args = vec!["delete", "clusterbasemodel", "--wait=false"];
    args.extend(names.iter().map(String::as_str));
    kubectl(&args);
}

/// Test 4: delete and re-create under the same name. The old uid's cleanup never removes the new
/// object's entry, and the new one ends Ready.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t4_delete_and_recreate_under_the_same_name() {
    setup();
    let n = "e2e-rec";
    node(n);
    let root = scratch("rec-root");
    let share = scratch("rec-share");
    let yaml = model("e2e-rec-m", n, &format!("local://{}", share.display()), None, false);
    apply(&yaml);
    let agent = Agent::start(n, &root, &[]);
    wait_until("label Ready", Duration::from_secs(30), || {
        labels(n).get(&label_key("e2e-rec-m")).map(String::as_str) == Some("Ready")
    });
    let old_uid = kubectl(&["get", "clusterbasemodel", "e2e-rec-m", "-o", "jsonpath={.metadata.uid}"]);
    let recorder = Recorder::start(n);
    kubectl(&["delete", "clusterbasemodel", "e2e-rec-m", "--wait=true"]);
    apply(&yaml);
    let new_uid = kubectl(&["get", "clusterbasemodel", "e2e-rec-m", "-o", "jsonpath={.metadata.uid}"]);
    assert_ne!(old_uid, new_uid);
    wait_until("the new uid's entry, Ready", Duration::from_secs(30), || {
        entries(n)
            .get("clusterbasemodel.e2e-rec-m")
            .is_some_and(|e| e["uid"] == new_uid.as_str() && e["status"] == "Ready")
    });
    wait_until("label Ready", Duration::from_secs(30), || {
        labels(n).get(&label_key("e2e-rec-m")).map(String::as_str) == Some("Ready")
    });
    std::thread::sleep(Duration::from_secs(3));
    let (_, entry_removals) = recorder.finish();
    assert!(!entry_removals.iter().any(|(_, uid)| uid.as_deref() == Some(new_uid.as_str())), "{entry_removals:?}");
    assert_eq!(entries(n)["clusterbasemodel.e2e-rec-m"]["uid"], new_uid.as_str());
    agent.stop();
    kubectl(&["delete", "clusterbasemodel", "e2e-rec-m", "--wait=false"]);
}

/// Running (not gone, not a zombie nobody has reaped yet).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

fn apiserver_pid() -> u32 {
    std::fs::read_to_string(Path::new(&var("KUBE_STATE_DIR")).join("apiserver.pid")).unwrap().trim().parse().unwrap()
}

/// Test 5: the API server stops for a while, then comes back. No destructive effect during the
/// outage, `/livez` stays 200 throughout, and a model deleted meanwhile (unseen by the agent) is
/// cleaned up after the restart.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t5_api_server_outage() {
    setup();
    let n = "e2e-out";
    node(n);
    let root = scratch("out-root");
    let share = scratch("out-share");
    apply(&model("e2e-out-keep", n, &format!("local://{}", share.display()), None, false));
    apply(&model("e2e-out-gone", n, &format!("local://{}", share.display()), None, false));
    let agent = Agent::start(n, &root, &[]);
    wait_until("both Ready", Duration::from_secs(30), || ready_count(n, "e2e-out-") == 2);
    // The agent is paused while the model is really deleted, so it learns of it only later.
    agent.signal("STOP");
    kubectl(&["delete", "clusterbasemodel", "e2e-out-gone", "--wait=true"]);
    let pid = apiserver_pid();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    // Killed outright, as a crash: a graceful stop would wait on the paused agent's watches.
    Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    wait_until("the API server to exit", Duration::from_secs(20), || !alive(pid));
    agent.signal("CONT");
    let cleanups_before = agent.metric("model_agent_cleanups_total");
    for _ in 0..20 {
        assert_eq!(agent.get("/livez").0, 200, "/livez must not depend on the API server");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(agent.metric("model_agent_cleanups_total"), cleanups_before, "no cleanup during the outage");
    let log = std::fs::File::create(Path::new(&var("KUBE_STATE_DIR")).join("apiserver-restarted.log")).unwrap();
    let child = Command::new(&args[0]).args(&args[1..]).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    std::fs::write(Path::new(&var("KUBE_STATE_DIR")).join("apiserver.pid"), child.id().to_string()).unwrap();
    std::mem::forget(child);
    wait_until("the API server back", Duration::from_secs(60), || {
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["get", "--raw", "/readyz"], None).is_ok()
    });
    wait_until("the deleted model cleaned up", Duration::from_secs(60), || {
        !labels(n).contains_key(&label_key("e2e-out-gone")) && !entries(n).contains_key("clusterbasemodel.e2e-out-gone")
    });
    assert_eq!(labels(n).get(&label_key("e2e-out-keep")).map(String::as_str), Some("Ready"));
    agent.stop();
    kubectl(&["delete", "clusterbasemodel", "e2e-out-keep", "--wait=false"]);
}

/// Test 6: the agent's identity is bound only by deploy/'s RBAC: enough to do its job (every
/// other test runs it with this identity), and nothing more.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t6_rbac_is_enough_and_no_more() {
    setup();
    let agent = var("AGENT_KUBECONFIG");
    let can = |args: &[&str]| {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        kubectl_as(&agent, &a, None).map(|o| o.trim() == "yes").unwrap_or(false)
    };
    for allowed in [
        &["watch", "clusterbasemodels.ome.io"][..],
        &["list", "basemodels.ome.io", "--all-namespaces"],
        &["patch", "nodes"],
        &["update", "configmaps", "-n", "ome"],
        &["create", "configmaps", "-n", "ome"],
        &["get", "secrets", "-n", "ome"],
        &["create", "events", "-n", "default"],
    ] {
        assert!(can(allowed), "the agent needs {allowed:?}");
    }
    for denied in [
        &["list", "secrets", "-n", "ome"][..],
        &["watch", "secrets", "-n", "ome"],
        &["get", "secrets", "-n", "default"],
        &["get", "secrets", "--all-namespaces"],
        &["get", "configmaps", "-n", "kube-system"],
        &["delete", "configmaps", "-n", "ome"],
        &["update", "clusterbasemodels.ome.io"],
        &["patch", "clusterbasemodels.ome.io"],
        &["patch", "basemodels.ome.io", "--all-namespaces"],
        &["delete", "nodes"],
        &["delete", "events", "-n", "default"],
        &["update", "events", "-n", "default"],
    ] {
        assert!(!can(denied), "the agent must not be able to {denied:?}");
    }
}

/// `--version` prints the version and exits 0, with no NODE_NAME and no cluster.
#[test]
fn version_is_printed_without_a_cluster() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_model-agent")).arg("--version").env_remove("NODE_NAME").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("model-agent {}\n", env!("CARGO_PKG_VERSION")));
}

/// NODE_NAME is required, with a clear error.
#[test]
fn node_name_is_required() {
    let out = Command::new(env!("CARGO_BIN_EXE_model-agent")).env_remove("NODE_NAME").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NODE_NAME"));
    let _ = NEEDS;
}

/// A FUSE mount whose daemon never answers, not even the kernel's INIT request: every call
/// beneath it (stat, open, statfs) blocks in the kernel, as on a dead hard-mounted NFS share.
/// Dropping it closes the device, which aborts the connection (blocked calls fail with
/// ENOTCONN), and then detaches the mount. Needs root and /dev/fuse, as the other mounts here.
struct HungMount {
    dir: PathBuf,
    device: Option<std::fs::File>,
}

impl HungMount {
    fn new(name: &str) -> HungMount {
        use std::os::fd::AsRawFd;
        let dir = scratch(name);
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .unwrap_or_else(|e| panic!("/dev/fuse: {e} (this test needs root and the fuse device)"));
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let options = c(&format!("fd={},rootmode=40000,user_id=0,group_id=0", device.as_raw_fd()));
        let (source, target, fstype) = (c("model-agent-hung"), c(dir.to_str().unwrap()), c("fuse.model-agent-hung"));
        // SAFETY: every pointer is a NUL-terminated string that outlives the call.
        let rc = unsafe { libc::mount(source.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, options.as_ptr().cast()) };
        assert_eq!(rc, 0, "mounting the hung FUSE filesystem: {}", std::io::Error::last_os_error());
        HungMount { dir, device: Some(device) }
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        drop(self.device.take());
        let target = std::ffi::CString::new(self.dir.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path; MNT_DETACH never blocks on the dead connection.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Test 11: a models root that hangs. Every filesystem call has a deadline: readiness says the
/// root did not answer, a `local://` model beneath it is Failed with that reason (and retried),
/// a model on a healthy share is still Ready, liveness never fails, the calls left stuck in the
/// kernel stay bounded, and SIGTERM still stops the agent within its grace.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t11_a_models_root_that_hangs() {
    setup();
    let n = "e2e-hung";
    node(n);
    let root = HungMount::new("hung-root");
    let share = scratch("hung-share");
    std::fs::create_dir_all(share.join("ok")).unwrap();
    let stuck = format!("local://{}", root.dir.join("stuck").display());
    apply(&model("e2e-hung-stuck", n, &stuck, None, false));
    apply(&model("e2e-hung-ok", n, &format!("local://{}", share.join("ok").display()), None, false));
    let agent = Agent::start(n, &root.dir, &[]);
    let started = Instant::now();
    let (mut live_failures, mut threads_max, mut unreturned_max) = (0, 0, 0.0f64);
    let mut sample = |agent: &Agent| {
        live_failures += usize::from(agent.get("/livez").0 != 200);
        threads_max = threads_max.max(threads_of(agent.child.id()));
        unreturned_max = unreturned_max.max(agent.metric("model_agent_fs_calls_unreturned"));
    };
    wait_until("the healthy share's model Ready", Duration::from_secs(30), || {
        sample(&agent);
        labels(n).get(&label_key("e2e-hung-ok")).map(String::as_str) == Some("Ready")
    });
    wait_until("readiness says the root did not answer", Duration::from_secs(30), || {
        sample(&agent);
        let (code, body) = agent.get("/healthz?verbose");
        code == 500 && body.contains("did not answer within 5 s")
    });
    wait_until("the model beneath the hung root Failed", Duration::from_secs(40), || {
        sample(&agent);
        entries(n).get("clusterbasemodel.e2e-hung-stuck").is_some_and(|e| e["status"] == "Failed")
    });
    let reason = entries(n)["clusterbasemodel.e2e-hung-stuck"]["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("did not answer within 10 s"), "{reason}");
    // Keep going past several probe periods and verification retries.
    while started.elapsed() < Duration::from_secs(60) {
        sample(&agent);
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!("t11: {threads_max} threads at most, {unreturned_max} filesystem calls not returned at most");
    assert_eq!(live_failures, 0, "/livez failed while the root hung");
    assert!((2.0..=8.0).contains(&unreturned_max), "stuck calls are capped at 8: {unreturned_max}");
    assert!(threads_max <= 8 + 8, "threads stay bounded: {threads_max}");
    let stop = agent.stop();
    assert!(stop < Duration::from_secs(25), "SIGTERM took {stop:?} with calls stuck in the kernel");
    kubectl(&["delete", "clusterbasemodel", "e2e-hung-stuck", "e2e-hung-ok", "--wait=false"]);
}

fn uid_of(args: &[&str]) -> String {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "jsonpath={.metadata.uid}"]);
    kubectl(&all)
}

fn base_model(namespace: &str, name: &str, node: &str, uri: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n---\napiVersion: ome.io/v1beta1\nkind: BaseModel\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  storage: {{storageUri: \"{uri}\", nodeSelector: {{e2e: {node}}}}}\n"
    )
}

/// Test 8: colliding label keys. ClusterBaseModel `basemodel.x` and BaseModel `x` in namespace
/// `clusterbasemodel` both map to `models.ome.io/clusterbasemodel.basemodel.x` (and to one
/// ConfigMap key). The ClusterBaseModel owns the key even when it comes second; deleting the
/// BaseModel never removes the live label; deleting the owner hands the key to the BaseModel
/// without the label ever disappearing. Then a namespace named after a victim's 8-hex hash: the
/// younger model never takes the victim's label.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t8_colliding_label_keys() {
    setup();
    let n = "e2e-col";
    node(n);
    let root = scratch("col-root");
    let share = scratch("col-share");
    let uri = format!("local://{}", share.display());
    let shared_label = "models.ome.io/clusterbasemodel.basemodel.x";
    let shared_entry = "clusterbasemodel.basemodel.x";
    apply(&base_model("clusterbasemodel", "x", n, &uri));
    let bm_uid = uid_of(&["-n", "clusterbasemodel", "basemodel", "x"]);
    let agent = Agent::start(n, &root, &[]);
    wait_until("the BaseModel's entry, Ready", Duration::from_secs(30), || {
        entries(n).get(shared_entry).is_some_and(|e| e["uid"] == bm_uid.as_str() && e["status"] == "Ready")
    });
    let recorder = Recorder::start(n);
    apply(&model("basemodel.x", n, &uri, None, false));
    let cbm_uid = uid_of(&["clusterbasemodel", "basemodel.x"]);
    wait_until("the ClusterBaseModel takes the key", Duration::from_secs(30), || {
        entries(n).get(shared_entry).is_some_and(|e| e["uid"] == cbm_uid.as_str() && e["status"] == "Ready")
    });
    kubectl(&["-n", "clusterbasemodel", "delete", "basemodel", "x", "--wait=true"]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(labels(n).get(shared_label).map(String::as_str), Some("Ready"), "the owner's label stays");
    assert_eq!(entries(n)[shared_entry]["uid"], cbm_uid.as_str());
    apply(&base_model("clusterbasemodel", "x", n, &uri));
    let bm_uid = uid_of(&["-n", "clusterbasemodel", "basemodel", "x"]);
    kubectl(&["delete", "clusterbasemodel", "basemodel.x", "--wait=true"]);
    wait_until("the BaseModel takes the key over", Duration::from_secs(30), || {
        entries(n).get(shared_entry).is_some_and(|e| e["uid"] == bm_uid.as_str() && e["status"] == "Ready")
    });
    let (label_removals, _) = recorder.finish();
    assert!(!label_removals.iter().any(|l| l == shared_label), "the shared label never vanished: {label_removals:?}");

    // A long namespace is cut to its hash: a tenant names a namespace after it.
    let victim_ns = "production-inference-serving";
    let victim_name = "llama-3-70b-instruct-awq-quantized-v2";
    let key = model_agent_core::ModelKey::namespaced(victim_ns, victim_name);
    let label = model_agent_core::wire::label_key(&key);
    let (ns, name) = label.strip_prefix("models.ome.io/").unwrap().split_once(".basemodel.").unwrap();
    apply(&base_model(victim_ns, victim_name, n, &uri));
    let victim_uid = uid_of(&["-n", victim_ns, "basemodel", victim_name]);
    let victim_entry = model_agent_core::wire::configmap_key(&key);
    wait_until("the victim Ready", Duration::from_secs(30), || {
        labels(n).get(&label).map(String::as_str) == Some("Ready")
    });
    let recorder = Recorder::start(n);
    std::thread::sleep(Duration::from_secs(1)); // strictly younger by creationTimestamp (1 s)
    apply(&base_model(ns, name, n, &format!("local://{}/missing", share.display())));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(labels(n).get(&label).map(String::as_str), Some("Ready"), "not the attacker's Failed");
    kubectl(&["-n", ns, "delete", "basemodel", name, "--wait=true"]);
    std::thread::sleep(Duration::from_secs(3));
    let (label_removals, _) = recorder.finish();
    assert!(!label_removals.contains(&label), "{label_removals:?}");
    assert_eq!(entries(n)[victim_entry.as_str()]["uid"], victim_uid.as_str());
    // The BaseModel lost the key to the ClusterBaseModel, then again once re-created; the attacker too.
    assert!(agent.metric("model_agent_label_collisions_total") >= 2.0);
    agent.stop();
    kubectl(&["-n", "clusterbasemodel", "delete", "basemodel", "x", "--wait=false"]);
    kubectl(&["-n", victim_ns, "delete", "basemodel", victim_name, "--wait=false"]);
}

/// Resident memory of a process, in KiB: (now, peak).
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The largest `RssAnon` (heap and stacks: what the objects cost, without the binary's own
/// file-backed pages, which grow with the debug binary's size) seen by sampling every 20 ms until
/// `stop` turns true.
fn sample_anon_peak_kib(pid: u32, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { break };
            let anon = status
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok());
            peak = peak.max(anon.unwrap_or(0));
            std::thread::sleep(Duration::from_millis(20));
        }
        peak
    })
}

/// Test 9: hostile object sizes. 20 BaseModels carrying 1 MiB of `parameters` each and 1,000
/// ordinary ClusterBaseModels exist before the agent starts, so its first list holds them all.
/// The agent becomes Ready, never restarts, and its anonymous resident memory (heap and stacks,
/// sampled every 20 ms) stays under 48 MiB. The peak of all resident memory is printed too; in a
/// debug build most of it is the binary's own pages.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t9_memory_under_huge_objects() {
    const HUGE_OBJECTS: usize = 20;
    const ORDINARY_MODELS: usize = 1_000;
    const ANON_KIB_MAX: u64 = 48 * 1024;
    setup();
    let n = "e2e-mem";
    node(n);
    let root = scratch("mem-root");
    apply("apiVersion: v1\nkind: Namespace\nmetadata: {name: e2e-mem}\n");
    let blob = "x".repeat(1 << 20);
    for i in 0..HUGE_OBJECTS {
        // `create`, not `apply`: apply would copy the object into an annotation (over 1.5 MiB).
        let yaml = format!(
            "apiVersion: ome.io/v1beta1\nkind: BaseModel\nmetadata: {{name: huge-{i:02}, namespace: e2e-mem}}\nspec:\n  storage: {{storageUri: \"hf://org/huge\", nodeSelector: {{e2e: {n}}}, parameters: {{blob: \"{blob}\"}}}}\n"
        );
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["create", "-f", "-"], Some(&yaml)).unwrap_or_else(|e| panic!("{e}"));
    }
    for batch in 0..ORDINARY_MODELS / 100 {
        let docs: Vec<String> = (0..100)
            .map(|i| {
                model(&format!("e2e-mem-{:04}", batch * 100 + i), "e2e-mem-elsewhere", "hf://org/repo", None, false)
            })
            .map(|y| y.replacen("metadata:\n", "metadata:\n  labels: {e2e-mem: \"true\"}\n", 1))
            .collect();
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["create", "-f", "-"], Some(&docs.join("---\n"))).unwrap();
    }
    let agent = Agent::start(n, &root, &[]);
    let pid = agent.child.id();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_anon_peak_kib(pid, stop.clone());
    wait_until("Ready", Duration::from_secs(120), || agent.get("/healthz").0 == 200);
    wait_until("the huge models reported", Duration::from_secs(60), || {
        entries(n).keys().filter(|k| k.starts_with("e2e-mem.basemodel.huge-")).count() == HUGE_OBJECTS
    });
    std::thread::sleep(Duration::from_secs(2));
    let (rss, peak) = rss_kib(pid);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let anon_peak = sampler.join().unwrap();
    eprintln!("t9: resident {rss} KiB, peak {peak} KiB, anonymous peak {anon_peak} KiB (limit {ANON_KIB_MAX} KiB)");
    assert!(alive(pid), "the agent never restarts");
    assert!(anon_peak > 0 && anon_peak < ANON_KIB_MAX, "peak anonymous resident memory {anon_peak} KiB");
    assert_eq!(agent.get("/healthz").0, 200);
    agent.stop();
    kubectl(&["delete", "namespace", "e2e-mem", "--wait=false"]);
    kubectl(&["delete", "clusterbasemodel", "-l", "e2e-mem=true", "--wait=false"]);
}

#[path = "e2e/admission.rs"]
mod admission;

#[path = "e2e/pod_security.rs"]
mod pod_security;

#[path = "e2e/non_root.rs"]
mod non_root;

#[path = "e2e/hf.rs"]
mod hf;

#[path = "e2e/shared.rs"]
mod shared;

#[path = "e2e/stores.rs"]
mod stores;

#[path = "e2e/metadata.rs"]
mod metadata;

#[path = "e2e/deploy.rs"]
mod deploy;
