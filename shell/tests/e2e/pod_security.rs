//! The shipped DaemonSet's pod against the Pod Security Standards: the hostPath volume (the
//! models root) needs the privileged level; nothing else in the pod falls short of Restricted.

use serde_json::{Value, json};

use super::{kubectl_as, repo, var};

/// The DaemonSet's pod template as a Pod in `namespace`.
fn agent_pod(namespace: &str) -> Value {
    let text = std::fs::read_to_string(repo().join("deploy/daemonset.yaml")).unwrap();
    let daemonset: Value = serde_yaml::from_str(&text).unwrap();
    let template = &daemonset["spec"]["template"];
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "model-agent-pss", "namespace": namespace, "labels": template["metadata"]["labels"]},
           "spec": template["spec"]})
}

fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten())
        .collect()
}

/// Baseline's controls (those that can apply to this pod's fields), as the Pod Security
/// Standards name them.
fn baseline_violations(spec: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[host] == true {
            found.push(format!("host namespaces ({host})"));
        }
    }
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    for v in volumes.iter().filter(|v| v.get("hostPath").is_some()) {
        found.push(format!("hostPath volumes (volume {})", v["name"]));
    }
    for c in containers(spec) {
        let sc = &c["securityContext"];
        if sc["privileged"] == true {
            found.push("privileged".into());
        }
        if sc["capabilities"]["add"].as_array().is_some_and(|a| !a.is_empty()) {
            found.push("non-default capabilities".into());
        }
        if c["ports"].as_array().into_iter().flatten().any(|p| p.get("hostPort").is_some()) {
            found.push("hostPort".into());
        }
        if sc["procMount"].as_str().is_some_and(|m| m != "Default") {
            found.push("procMount".into());
        }
    }
    let unconfined = |sc: &Value| sc["seccompProfile"]["type"] == "Unconfined";
    if unconfined(&spec["securityContext"]) || containers(spec).iter().any(|c| unconfined(&c["securityContext"])) {
        found.push("seccompProfile".into());
    }
    if spec["securityContext"]["sysctls"].as_array().is_some_and(|s| !s.is_empty()) {
        found.push("forbidden sysctls".into());
    }
    found
}

/// Restricted's controls beyond Baseline's.
fn restricted_violations(spec: &Value) -> Vec<String> {
    let mut found = baseline_violations(spec);
    const ALLOWED: [&str; 8] =
        ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];
    for v in spec["volumes"].as_array().into_iter().flatten() {
        let kinds = v.as_object().unwrap().keys().filter(|k| *k != "name");
        for kind in kinds.filter(|k| !ALLOWED.contains(&k.as_str())) {
            found.push(format!("restricted volume types (volume {} uses {kind})", v["name"]));
        }
    }
    let pod = &spec["securityContext"];
    for c in containers(spec) {
        let sc = &c["securityContext"];
        let either = |field: &str| if sc.get(field).is_some() { &sc[field] } else { &pod[field] };
        if sc["allowPrivilegeEscalation"] != false {
            found.push("allowPrivilegeEscalation != false".into());
        }
        if either("runAsNonRoot") != true {
            found.push("runAsNonRoot != true".into());
        }
        if either("runAsUser") == 0 {
            found.push("runAsUser=0".into());
        }
        if !matches!(either("seccompProfile")["type"].as_str(), Some("RuntimeDefault" | "Localhost")) {
            found.push("seccompProfile".into());
        }
        if !sc["capabilities"]["drop"].as_array().is_some_and(|d| d.contains(&json!("ALL"))) {
            found.push("unrestricted capabilities (drop ALL)".into());
        }
        let adds = sc["capabilities"]["add"].as_array().cloned().unwrap_or_default();
        if adds.iter().any(|a| a != "NET_BIND_SERVICE") {
            found.push("unrestricted capabilities (add)".into());
        }
    }
    found
}

/// The pod template, checked against the Standards' controls as written (v1.20, the test API
/// server, has no PodSecurity admission: see t12 for the real one on a newer server). The one
/// shortfall at Baseline and at Restricted is the models root's hostPath volume.
#[test]
fn the_agent_pod_is_restricted_but_for_its_host_path_volume() {
    let spec = &agent_pod("ome")["spec"];
    assert_eq!(baseline_violations(spec), ["hostPath volumes (volume \"host-models\")"]);
    assert_eq!(
        restricted_violations(spec),
        ["hostPath volumes (volume \"host-models\")", "restricted volume types (volume \"host-models\" uses hostPath)"]
    );
    let sc = &spec["securityContext"];
    assert_eq!((&sc["runAsUser"], &sc["runAsGroup"]), (&json!(65532), &json!(65532)));
    let container = &spec["containers"][0]["securityContext"];
    assert_eq!(container["readOnlyRootFilesystem"], true);
}

/// PodSecurity admission came with 1.23 (beta, on by default), as did autoscaling/v2. The
/// server's /version cannot tell: the test server's build reports v0.0.0-master.
fn serves_pod_security() -> bool {
    kubectl_as(&var("ADMIN_KUBECONFIG"), &["get", "--raw", "/apis/autoscaling/v2"], None).is_ok()
}

/// Test 12: Pod Security admission on the shipped pod (server-side dry-run creates in namespaces
/// that enforce each level): privileged admits it; baseline and restricted refuse it, naming only
/// the hostPath volume. PodSecurity admission exists from Kubernetes 1.23 (on by default, and
/// scripts/kube/start does not disable it); the v1.20 test server has none, so there this test
/// only says so and the unit test above is the check.
#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t12_pod_security_admits_the_agent_only_where_privileged() {
    super::setup();
    if !serves_pod_security() {
        eprintln!("t12: NOT RUN: the API server is older than 1.23 and has no PodSecurity admission");
        return;
    }
    for level in ["privileged", "baseline", "restricted"] {
        let ns = format!("e2e-pss-{level}");
        let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": ns, "labels": {"pod-security.kubernetes.io/enforce": level}}});
        kubectl_as(&var("ADMIN_KUBECONFIG"), &["apply", "-f", "-"], Some(&namespace.to_string())).unwrap();
        let pod = agent_pod(&ns).to_string();
        let verdict = kubectl_as(&var("ADMIN_KUBECONFIG"), &["create", "--dry-run=server", "-f", "-"], Some(&pod));
        match (level, verdict) {
            ("privileged", verdict) => assert!(verdict.is_ok(), "privileged admits the agent: {verdict:?}"),
            (_, Ok(out)) => panic!("{level} must refuse the hostPath volume: {out}"),
            (_, Err(e)) => {
                assert!(e.contains("hostPath"), "{level}: {e}");
                for other in ["runAsNonRoot", "capabilities", "allowPrivilegeEscalation", "seccompProfile"] {
                    assert!(!e.contains(other), "{level} names only the hostPath volume: {e}");
                }
            }
        }
    }
}
