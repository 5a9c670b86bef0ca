//! The checkers' own answers to "where should this model be, and where do its weights go",
//! written apart from the core (as VOPR's checker is apart from the replica) so that a bug in
//! `core::placement` or `core::dest_path` cannot hide itself by agreeing with itself.
//!
//! - Placement follows Kubernetes' `NodeSelectorRequirement` semantics (kube-scheduler's
//!   `nodeaffinity` plugin): every `nodeSelector` pair must equal a node label; required terms
//!   are ORed, expressions within a term ANDed; an empty term matches nothing; `NotIn` and
//!   `DoesNotExist` match a node without the label; `Gt`/`Lt` take exactly one integer value and
//!   never match a non-integer label; `matchFields` supports only `metadata.name` with `In` and
//!   `NotIn`; an unknown operator matches nothing. `pvc://` models are never placed on nodes.
//! - The destination follows OME's `getDestPath` (`ome-model-agent.md` §3.2): `spec.storage.path`
//!   when non-empty, else `<models root>/<storageUri>`, here compared lexically (repeated `/` and
//!   `.` collapse; a path with `..` or outside the root has no directory beneath it).

use std::collections::BTreeMap;

use model_agent_core::ModelSpec;
use model_agent_core::placement::NodeSelectorRequirement;

/// The scheme of a storage URI, as written (`hf` for `hf://org/m`): what comes before the first
/// `://`, found from the colons (a byte search) rather than by a substring searcher built for
/// every call (the checks ask this of every model on every node).
pub fn scheme(storage_uri: &str) -> &str {
    storage_uri
        .match_indices(':')
        .find(|(at, _)| storage_uri[at + 1..].starts_with("//"))
        .map_or("", |(at, _)| &storage_uri[..at])
}

/// Schemes whose weights the agent writes onto the node.
pub fn downloads(storage_uri: &str) -> bool {
    matches!(scheme(storage_uri), "oci" | "hf" | "s3" | "gs" | "az" | "github")
}

/// The directory a `local://` model is verified at: the path when set, else the URI's path.
pub fn local_path(spec: &ModelSpec) -> Option<String> {
    let uri_path = spec.storage_uri.strip_prefix("local://")?;
    Some(spec.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| uri_path.to_string()))
}

/// `downloadPolicy: ReuseIfExists` on `hf://`: the node keeps one copy per commit.
pub fn reuses(spec: &ModelSpec) -> bool {
    scheme(&spec.storage_uri) == "hf" && spec.download_policy == model_agent_core::model::DownloadPolicy::ReuseIfExists
}

/// The commit the simulated Hub resolves an `hf://org/repo[@revision]` URI to: a revision that
/// is a commit already (7 to 64 lowercase hex digits) is itself; any other (`main` when none
/// is given) is a fixed hash of `org/repo@revision`.
pub fn commit_of(storage_uri: &str) -> Option<String> {
    let rest = storage_uri.strip_prefix("hf://")?;
    let (repo, revision) = rest.split_once('@').unwrap_or((rest, "main"));
    let pinned = (7..=64).contains(&revision.len()) && revision.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if pinned {
        return Some(revision.to_string());
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{repo}@{revision}").bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    Some(format!("{h:016x}{:016x}{:08x}", h.rotate_left(17), h >> 32))
}

/// The repository a storage URI names, what the shell's manifest records of a download's
/// source (`repo_id`): an `hf://` URI without its `@revision`, any other URI as it is.
pub fn repository(storage_uri: &str) -> &str {
    if storage_uri.starts_with("hf://") {
        storage_uri.split_once('@').map_or(storage_uri, |(repo, _)| repo)
    } else {
        storage_uri
    }
}

/// Where a `ReuseIfExists` model's weights are on a node, beneath the root: the node's one copy
/// of its commit, `_artifacts/<org>/<repo>/<commit>` (issue 10).
pub fn copy_dir(spec: &ModelSpec) -> Option<String> {
    if !reuses(spec) {
        return None;
    }
    let rest = spec.storage_uri.strip_prefix("hf://")?;
    let repo = rest.split_once('@').map_or(rest, |(r, _)| r);
    let (org, name) = repo.split_once('/')?;
    Some(format!("_artifacts/{org}/{name}/{}", commit_of(&spec.storage_uri)?))
}

/// Is the model placed on the node `name` with `labels`?
pub fn placed(spec: &ModelSpec, name: &str, labels: &BTreeMap<String, String>) -> bool {
    if scheme(&spec.storage_uri) == "pvc" {
        return false;
    }
    if !spec.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    spec.required_terms.is_empty()
        || spec.required_terms.iter().any(|term| {
            let any = !term.match_expressions.is_empty() || !term.match_fields.is_empty();
            any && term.match_expressions.iter().all(|r| matches(r, labels.get(&r.key).map(String::as_str)))
                && term.match_fields.iter().all(|r| {
                    r.key == "metadata.name" && matches!(r.operator.as_str(), "In" | "NotIn") && matches(r, Some(name))
                })
        })
}

/// One requirement against the node's value for its key (`None`: the node lacks it).
fn matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let listed = value.is_some_and(|v| r.values.iter().any(|x| x == v));
    match r.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let [bound] = r.values.as_slice() else { return false };
            let (Ok(bound), Some(Ok(v))) = (bound.parse::<i64>(), value.map(str::parse::<i64>)) else { return false };
            if r.operator.as_str() == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// The directory beneath `root` a downloading model's weights go to (relative to the root), or
/// `None` when the model does not download or its destination is not strictly beneath the root.
pub fn download_dir(spec: &ModelSpec, root: &str) -> Option<String> {
    if !downloads(&spec.storage_uri) {
        return None;
    }
    let raw = match spec.path.as_deref() {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => format!("{root}/{}", spec.storage_uri),
    };
    let path = components(&raw)?;
    let root = components(root)?;
    (path.len() > root.len() && path.starts_with(&root)).then(|| path[root.len()..].join("/"))
}

/// The components of an absolute path, `.` and empty ones dropped; `None` for `..` or a
/// relative path.
fn components(path: &str) -> Option<Vec<&str>> {
    if !path.starts_with('/') {
        return None;
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    (!parts.contains(&"..")).then_some(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_agent_core::model::requirement;
    use model_agent_core::placement::{NodeSelectorTerm, NodeView, placement};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn with_terms(terms: Vec<NodeSelectorTerm>) -> ModelSpec {
        let mut s = ModelSpec::simple("hf://a/b", None);
        s.required_terms = terms;
        s
    }

    fn exprs(r: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm { match_expressions: r, match_fields: vec![] }
    }

    /// The colon search gives what a substring search for `://` gives, on URIs with colons
    /// before, inside and after the separator, and with none.
    #[test]
    fn the_scheme_is_the_text_before_the_first_separator() {
        let uris = [
            "hf://org/m",
            "local:///mnt/m",
            "a:b://c",
            "a:/b://c",
            "a:",
            "a:/",
            "://x",
            "x",
            "",
            ":",
            "::/://",
            "s3://b/p:q://r",
            "hf:/org/m",
            "oci://n/b/o",
        ];
        for uri in uris {
            let expected = uri.split_once("://").map_or("", |(s, _)| s);
            assert_eq!(scheme(uri), expected, "{uri:?}");
        }
    }

    #[test]
    fn kubernetes_operator_semantics() {
        let ok = |op: &str, vals: &[&str], l: &[(&str, &str)]| {
            placed(&with_terms(vec![exprs(vec![requirement("k", op, vals)])]), "n", &labels(l))
        };
        assert!(ok("In", &["a"], &[("k", "a")]) && !ok("In", &["a"], &[]));
        assert!(ok("NotIn", &["a"], &[]) && !ok("NotIn", &["a"], &[("k", "a")]));
        assert!(ok("Exists", &[], &[("k", "")]) && !ok("Exists", &[], &[]));
        assert!(ok("DoesNotExist", &[], &[]) && !ok("DoesNotExist", &[], &[("k", "x")]));
        assert!(ok("Gt", &["4"], &[("k", "8")]) && !ok("Gt", &["4"], &[("k", "b")]));
        assert!(ok("Lt", &["4"], &[("k", "-1")]) && !ok("Lt", &["4", "5"], &[("k", "1")]));
        assert!(!ok("Near", &[], &[("k", "1")]));
        assert!(!placed(&with_terms(vec![NodeSelectorTerm::default()]), "n", &labels(&[])));
        let fields = |key: &str, op: &str| NodeSelectorTerm {
            match_expressions: vec![],
            match_fields: vec![requirement(key, op, &["n"])],
        };
        assert!(placed(&with_terms(vec![fields("metadata.name", "In")]), "n", &labels(&[])));
        assert!(!placed(&with_terms(vec![fields("metadata.name", "Exists")]), "n", &labels(&[])));
        assert!(!placed(&with_terms(vec![fields("metadata.uid", "In")]), "n", &labels(&[])));
        assert!(!placed(&ModelSpec::simple("pvc://c/s", None), "n", &labels(&[])));
    }

    /// The oracle and the core agree on the selectors the simulator generates (and the
    /// oracle's tests above pin the semantics independently).
    #[test]
    fn agrees_with_the_core_on_simulated_shapes() {
        let mut s = ModelSpec::simple("local:///x", None);
        s.node_selector = vec![("pool".into(), "a".into())];
        for l in [labels(&[]), labels(&[("pool", "a")]), labels(&[("pool", "b")])] {
            let view = NodeView { name: "n".into(), labels: l.clone() };
            assert_eq!(placed(&s, "n", &l), placement(&s, &view).is_eligible());
        }
    }

    #[test]
    fn one_copy_per_commit() {
        let reuse = |uri: &str| {
            let mut s = ModelSpec::simple(uri, Some("/mnt/models/x"));
            s.download_policy = model_agent_core::model::DownloadPolicy::ReuseIfExists;
            s
        };
        let main = copy_dir(&reuse("hf://org/m")).unwrap();
        assert_eq!(copy_dir(&reuse("hf://org/m@main")), Some(main.clone()));
        assert!(main.starts_with("_artifacts/org/m/") && main.len() == "_artifacts/org/m/".len() + 40, "{main}");
        assert_ne!(copy_dir(&reuse("hf://org/m@v2")), Some(main));
        assert_eq!(copy_dir(&reuse("hf://org/m@0123abc")), Some("_artifacts/org/m/0123abc".into()));
        assert_eq!(copy_dir(&ModelSpec::simple("hf://org/m", Some("/mnt/models/x"))), None);
    }

    #[test]
    fn ome_destination_rule() {
        let dir = |uri: &str, path: Option<&str>| download_dir(&ModelSpec::simple(uri, path), "/mnt/models");
        assert_eq!(dir("hf://org/m", Some("/mnt/models/m")), Some("m".into()));
        assert_eq!(dir("hf://org/m", Some("")), Some("hf:/org/m".into()));
        assert_eq!(dir("hf://org/m", None), Some("hf:/org/m".into()));
        assert_eq!(dir("hf://org/m", Some("/mnt/models//a/./b/")), Some("a/b".into()));
        assert_eq!(dir("hf://org/m", Some("/mnt/models")), None);
        assert_eq!(dir("hf://org/m", Some("/mnt/models/../etc")), None);
        assert_eq!(dir("hf://org/m", Some("/etc")), None);
        assert_eq!(dir("local:///mnt/models/x", None), None);
        assert_eq!(dir("vendor://a/b/c", None), None);
    }
}
