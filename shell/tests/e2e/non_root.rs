//! The agent as the DaemonSet runs it: uid and gid 65532, no supplementary groups.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{
    Agent, apply, kubectl, label_key, labels, model, node, place_a_download_on_an_unwritable_root, scratch, var,
    wait_until,
};

const AGENT_UID: u32 = 65532;

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
}

/// Copies of what the agent reads that uid 65532 may be unable to reach where they are (the
/// binary under a build directory, the kubeconfig and CA in a 0700 state directory).
struct Reachable {
    dir: PathBuf,
    binary: PathBuf,
    kubeconfig: PathBuf,
}

impl Reachable {
    fn new() -> Reachable {
        let dir = scratch("uid-files");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let binary = dir.join("model-agent");
        std::fs::copy(env!("CARGO_BIN_EXE_model-agent"), &binary).unwrap();
        let ca = dir.join("ca.crt");
        std::fs::copy(Path::new(&var("KUBE_STATE_DIR")).join("pki/ca.crt"), &ca).unwrap();
        let text = std::fs::read_to_string(var("AGENT_KUBECONFIG")).unwrap();
        let mut config: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        for cluster in config["clusters"].as_array_mut().unwrap() {
            cluster["cluster"]["certificate-authority"] = serde_json::json!(ca);
        }
        let kubeconfig = dir.join("agent.kubeconfig");
        std::fs::write(&kubeconfig, config.to_string()).unwrap();
        for f in [&binary, &ca, &kubeconfig] {
            let mode = if f == &binary { 0o755 } else { 0o644 };
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        Reachable { dir, binary, kubeconfig }
    }

    fn start(&self, node: &str, root: &Path) -> Agent {
        let trace_dir = Agent::scratch_dir(node);
        let _ = std::fs::remove_dir_all(&trace_dir);
        std::fs::create_dir_all(&trace_dir).unwrap();
        chown(&trace_dir, AGENT_UID);
        let mut setpriv = Command::new("setpriv");
        let id = AGENT_UID.to_string();
        setpriv.args(["--reuid", &id, "--regid", &id, "--clear-groups"]).arg(&self.binary);
        let agent = Agent::launch(setpriv, self.kubeconfig.to_str().unwrap(), node, root, &[]);
        let status = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id())).unwrap();
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string();
        assert_eq!(uids.split_whitespace().skip(1).collect::<Vec<_>>(), [id.as_str(); 4], "{uids}");
        agent
    }
}

impl Drop for Reachable {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Test 13: the agent as uid/gid 65532 (setpriv, as `runAsUser`/`runAsGroup` would). With a
/// models root owned by 65532 it is Ready, the root writable; with a root owned by root (0755, what
/// a hostPath DirectoryOrCreate makes) it serves a local:// model, and a ClusterBaseModel that
/// downloads makes it unready with a reason that says the root has no write permission, and that
/// model's entry is Failed with it.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t13_the_agent_as_uid_65532() {
    super::setup();
    let n = "e2e-uid";
    node(n);
    let files = Reachable::new();
    let share = scratch("uid-share");
    std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o755)).unwrap();
    apply(&model("e2e-uid-local", n, &format!("local://{}", share.display()), None, false));

    let owned = scratch("uid-root-owned");
    chown(&owned, AGENT_UID);
    let agent = files.start(n, &owned);
    wait_until("Ready on a root owned by 65532", Duration::from_secs(30), || agent.get("/healthz").0 == 200);
    wait_until("the local model Ready", Duration::from_secs(30), || {
        labels(n).get(&label_key("e2e-uid-local")).map(String::as_str) == Some("Ready")
    });
    assert_eq!(agent.metric("model_agent_models_root_writable"), 1.0);
    agent.stop();

    let roots = scratch("uid-root-roots");
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = files.start(n, &roots);
    wait_until("Ready with local:// only", Duration::from_secs(30), || agent.get("/healthz").0 == 200);
    assert_eq!(agent.metric("model_agent_models_root_writable"), 0.0);
    let (body, reason) = place_a_download_on_an_unwritable_root(&agent, n, "e2e-uid-hf", &roots);
    assert!(body.contains("no write permission"), "{body}");
    assert!(reason.contains("no write permission"), "{reason}");
    agent.stop();
    kubectl(&["delete", "clusterbasemodel", "e2e-uid-local", "e2e-uid-hf", "--wait=false"]);
}
