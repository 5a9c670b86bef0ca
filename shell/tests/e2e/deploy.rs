//! `deploy/` as a kustomize base with components: each renders with `kubectl kustomize`, and
//! what the test server (v1.20) knows is applied with a server-side dry run.

use std::path::Path;

use super::{kubectl_as, repo, scratch, var};

/// A kustomization in `dir` that names the base and `components` (paths relative to `dir`:
/// kustomize refuses absolute ones).
fn overlay(dir: &Path, components: &[&str]) -> String {
    let deploy = repo().join("deploy").canonicalize().unwrap();
    let up = dir.components().count() - 1;
    let rel = format!("{}{}", "../".repeat(up), deploy.to_str().unwrap().trim_start_matches('/'));
    let listed: Vec<String> = components.iter().map(|c| format!("{rel}/components/{c}")).collect();
    let text = format!("resources: [{rel}]\ncomponents: [{}]\n", listed.join(", "));
    std::fs::write(dir.join("kustomization.yaml"), text).unwrap();
    let admin = var("ADMIN_KUBECONFIG");
    kubectl_as(&admin, &["kustomize", dir.to_str().unwrap()], None).unwrap_or_else(|e| panic!("{components:?}: {e}"))
}

fn kinds(rendered: &str) -> Vec<String> {
    rendered.lines().filter_map(|l| l.strip_prefix("kind: ")).map(str::to_string).collect()
}

#[test]
#[ignore = "needs a real kube-apiserver: run by scripts/e2e"]
fn t22_deploy_renders_with_every_component_and_dry_runs_on_the_server() {
    super::setup();
    let admin = var("ADMIN_KUBECONFIG");
    let dry_run = |rendered: &str, what: &str| {
        let out = kubectl_as(&admin, &["apply", "--dry-run=server", "-f", "-"], Some(rendered));
        out.unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    // Components whose kinds the v1.20 server has: rendered and dry-run applied.
    for (name, components, expect) in [
        ("base", &[][..], "ome-model-agent-daemonset"),
        ("update-model-spec", &["update-model-spec"][..], "- --update-model-spec"),
        ("read-only-root", &["read-only-root"][..], "readOnly: true"),
        ("pod-security", &["pod-security-privileged"][..], "pod-security.kubernetes.io/enforce: privileged"),
    ] {
        let rendered = overlay(&scratch(&format!("kustomize-{name}")), components);
        assert!(rendered.contains(expect), "{name}: {expect:?} not in\n{rendered}");
        assert!(rendered.contains("name: ome-model-agent-daemonset\n  namespace: ome"), "{name}: OME's names");
        let applied = dry_run(&rendered, name);
        assert!(applied.contains("daemonset.apps/ome-model-agent-daemonset"), "{name}: {applied}");
    }
    // ValidatingAdmissionPolicy (1.30+) and PodMonitor (prometheus-operator's CRD) are unknown to
    // the test server: rendered and checked, not applied.
    let rendered = overlay(&scratch("kustomize-all"), &["admission-policies", "pod-monitor", "update-model-spec"]);
    let kinds = kinds(&rendered);
    for kind in ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "PodMonitor", "DaemonSet"] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} not rendered: {kinds:?}");
    }
}
