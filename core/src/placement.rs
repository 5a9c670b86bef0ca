//! Node eligibility: `spec.storage.nodeSelector` and required `nodeAffinity` terms, with
//! Kubernetes' semantics (not upstream OME's): `NotIn` on a missing label matches, `Gt`/`Lt` on
//! non-integers do not match and say why, `matchFields` supports `metadata.name`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::model::ModelSpec;
use crate::storage_uri::StorageUri;

/// `corev1.NodeSelectorTerm`: expressions and fields are ANDed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    #[serde(default)]
    pub match_expressions: Vec<NodeSelectorRequirement>,
    #[serde(default)]
    pub match_fields: Vec<NodeSelectorRequirement>,
}

/// `corev1.NodeSelectorRequirement`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSelectorRequirement {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

/// `corev1.NodeSelectorOperator`, parsed once when the spec is decoded (not matched as text on
/// every evaluation). An operator Kubernetes does not define is kept, so that the model is
/// reported with it, and matches no node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
    #[default]
    Missing,
    Unknown(String),
}

impl From<String> for Operator {
    fn from(s: String) -> Operator {
        match s.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" => Operator::Gt,
            "Lt" => Operator::Lt,
            "" => Operator::Missing,
            _ => Operator::Unknown(s),
        }
    }
}

impl From<Operator> for String {
    fn from(op: Operator) -> String {
        op.as_str().to_string()
    }
}

impl Operator {
    pub fn as_str(&self) -> &str {
        match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
            Operator::Gt => "Gt",
            Operator::Lt => "Lt",
            Operator::Missing => "",
            Operator::Unknown(s) => s,
        }
    }
}

/// The node as eligibility sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// The verdict, with the reason a person needs when it is "no".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    Eligible,
    NotEligible(String),
}

impl Placement {
    pub fn is_eligible(&self) -> bool {
        matches!(self, Placement::Eligible)
    }
}

/// Is the model placed on this node?
pub fn placement(spec: &ModelSpec, node: &NodeView) -> Placement {
    if let Ok(StorageUri::Pvc { .. }) = spec.uri {
        return Placement::NotEligible("pvc:// models are served from the PVC, never placed on nodes".into());
    }
    for (k, v) in &spec.node_selector {
        match node.labels.get(k) {
            Some(actual) if actual == v => {}
            Some(actual) => {
                return Placement::NotEligible(format!("nodeSelector {k}={v}: node has {k}={actual}"));
            }
            None => return Placement::NotEligible(format!("nodeSelector {k}={v}: node has no label {k}")),
        }
    }
    if spec.required_terms.is_empty() {
        // An empty term list is rejected by API validation for pods; OME treats it as "no
        // constraint", and so do we.
        return Placement::Eligible;
    }
    let mut reasons = Vec::new();
    for (i, term) in spec.required_terms.iter().enumerate() {
        match term_matches(term, node) {
            Ok(()) => return Placement::Eligible,
            Err(reason) => reasons.push(format!("term {i}: {reason}")),
        }
    }
    Placement::NotEligible(format!("no required nodeAffinity term matches ({})", reasons.join("; ")))
}

/// Does `spec`'s placement read any node label for which `label` is true? (Its nodeSelector
/// keys and its affinity's `matchExpressions` keys; `matchFields` read the name only.) A change
/// of the node's labels that touches none of them cannot change the verdict.
pub fn reads_label(spec: &ModelSpec, label: impl Fn(&str) -> bool) -> bool {
    spec.node_selector.iter().any(|(k, _)| label(k))
        || spec.required_terms.iter().any(|t| t.match_expressions.iter().any(|r| label(&r.key)))
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeView) -> Result<(), String> {
    if term.match_expressions.is_empty() && term.match_fields.is_empty() {
        return Err("an empty term matches no node".into());
    }
    for req in &term.match_expressions {
        requirement_matches(req, node.labels.get(&req.key).map(String::as_str))?;
    }
    for req in &term.match_fields {
        if req.key != "metadata.name" {
            return Err(format!("matchFields key {:?} is not supported (only metadata.name)", req.key));
        }
        if !matches!(req.operator, Operator::In | Operator::NotIn) {
            return Err(format!("matchFields operator {:?} is not allowed (only In, NotIn)", req.operator.as_str()));
        }
        requirement_matches(req, Some(&node.name))?;
    }
    Ok(())
}

/// One requirement against the value of its key (`None` when the node lacks the label).
pub fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> Result<(), String> {
    let key = &req.key;
    let values = &req.values;
    match &req.operator {
        Operator::In => match value {
            Some(v) if values.iter().any(|x| x == v) => Ok(()),
            Some(v) => Err(format!("{key}={v} is not In {values:?}")),
            None => Err(format!("{key} is missing (In {values:?})")),
        },
        Operator::NotIn => match value {
            Some(v) if values.iter().any(|x| x == v) => Err(format!("{key}={v} is in NotIn {values:?}")),
            _ => Ok(()),
        },
        Operator::Exists => value.map(|_| ()).ok_or_else(|| format!("{key} does not exist")),
        Operator::DoesNotExist => match value {
            Some(_) => Err(format!("{key} exists (DoesNotExist)")),
            None => Ok(()),
        },
        op @ (Operator::Gt | Operator::Lt) => {
            let op_name = op.as_str();
            let [bound] = values.as_slice() else {
                return Err(format!("{key} {op_name} needs exactly one value, has {}", values.len()));
            };
            let bound: i64 =
                bound.parse().map_err(|_| format!("{key} {op_name} {bound:?}: the value is not an integer"))?;
            let Some(v) = value else {
                return Err(format!("{key} is missing ({op_name} {bound})"));
            };
            let v: i64 = v.parse().map_err(|_| format!("{key}={v:?} is not an integer ({op_name} {bound})"))?;
            let ok = if *op == Operator::Gt { v > bound } else { v < bound };
            if ok { Ok(()) } else { Err(format!("{key}={v} is not {op_name} {bound}")) }
        }
        other => Err(format!("unknown operator {:?} on {key}", other.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::requirement;

    fn node(labels: &[(&str, &str)]) -> NodeView {
        NodeView { name: "node-1".into(), labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
    }

    fn spec_with(terms: Vec<NodeSelectorTerm>) -> ModelSpec {
        let mut s = ModelSpec::simple("hf://a/b", None);
        s.required_terms = terms;
        s
    }

    fn term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm { match_expressions: exprs, match_fields: vec![] }
    }

    #[test]
    fn no_constraints_means_every_node() {
        assert_eq!(placement(&ModelSpec::simple("hf://a/b", None), &node(&[])), Placement::Eligible);
    }

    #[test]
    fn pvc_is_never_eligible() {
        let p = placement(&ModelSpec::simple("pvc://claim/sub", None), &node(&[]));
        assert!(matches!(p, Placement::NotEligible(r) if r.contains("pvc://")));
    }

    #[test]
    fn node_selector_needs_every_pair() {
        let mut s = ModelSpec::simple("hf://a/b", None);
        s.node_selector.push(("gpu".into(), "h100".into()));
        s.node_selector.push(("zone".into(), "a".into()));
        assert!(placement(&s, &node(&[("gpu", "h100"), ("zone", "a")])).is_eligible());
        let p = placement(&s, &node(&[("gpu", "h100"), ("zone", "b")]));
        assert_eq!(p, Placement::NotEligible("nodeSelector zone=a: node has zone=b".into()));
        let p = placement(&s, &node(&[("gpu", "h100")]));
        assert_eq!(p, Placement::NotEligible("nodeSelector zone=a: node has no label zone".into()));
    }

    #[test]
    fn operators_follow_kubernetes() {
        let r = |op: &str, vals: &[&str], v: Option<&str>| requirement_matches(&requirement("k", op, vals), v);
        assert!(r("In", &["a", "b"], Some("a")).is_ok());
        assert!(r("In", &["a"], Some("c")).is_err());
        assert!(r("In", &["a"], None).is_err());
        // Kubernetes: NotIn matches a node without the label (upstream OME does not).
        assert!(r("NotIn", &["a"], None).is_ok());
        assert!(r("NotIn", &["a"], Some("b")).is_ok());
        assert!(r("NotIn", &["a"], Some("a")).is_err());
        assert!(r("Exists", &[], Some("")).is_ok());
        assert!(r("Exists", &[], None).is_err());
        assert!(r("DoesNotExist", &[], None).is_ok());
        assert!(r("DoesNotExist", &[], Some("x")).is_err());
        assert!(r("Gt", &["4"], Some("8")).is_ok());
        assert!(r("Gt", &["8"], Some("8")).is_err());
        assert!(r("Lt", &["8"], Some("4")).is_ok());
        assert!(r("Lt", &["-1"], Some("4")).is_err());
        assert!(r("Gt", &["4"], None).is_err());
        // Non-integers never match and say why (upstream falls back to comparing strings).
        assert_eq!(r("Gt", &["4"], Some("b")), Err("k=\"b\" is not an integer (Gt 4)".into()));
        assert_eq!(r("Lt", &["x"], Some("1")), Err("k Lt \"x\": the value is not an integer".into()));
        assert!(r("Gt", &["1", "2"], Some("3")).unwrap_err().contains("exactly one value"));
        assert!(r("Near", &[], Some("3")).unwrap_err().contains("unknown operator \"Near\""));
        assert!(r("", &[], Some("3")).unwrap_err().contains("unknown operator \"\""));
        // Parsed once, written back byte for byte.
        for op in ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Near"] {
            let parsed: Operator = serde_json::from_value(serde_json::json!(op)).unwrap();
            assert_eq!(serde_json::to_value(&parsed).unwrap(), serde_json::json!(op));
        }
    }

    #[test]
    fn terms_are_ored_and_expressions_anded() {
        let s = spec_with(vec![
            term(vec![requirement("gpu", "In", &["h100"]), requirement("zone", "In", &["a"])]),
            term(vec![requirement("cpu-only", "Exists", &[])]),
        ]);
        assert!(placement(&s, &node(&[("gpu", "h100"), ("zone", "a")])).is_eligible());
        assert!(placement(&s, &node(&[("cpu-only", "1")])).is_eligible());
        let p = placement(&s, &node(&[("gpu", "h100"), ("zone", "b")]));
        let Placement::NotEligible(reason) = p else { panic!() };
        assert!(reason.contains("term 0: zone=b is not In"), "{reason}");
        assert!(reason.contains("term 1: cpu-only does not exist"), "{reason}");
    }

    #[test]
    fn empty_term_matches_nothing() {
        let s = spec_with(vec![NodeSelectorTerm::default()]);
        assert!(!placement(&s, &node(&[("a", "b")])).is_eligible());
    }

    #[test]
    fn match_fields_on_metadata_name() {
        let fields = |op: &str, vals: &[&str]| NodeSelectorTerm {
            match_expressions: vec![],
            match_fields: vec![requirement("metadata.name", op, vals)],
        };
        assert!(placement(&spec_with(vec![fields("In", &["node-1"])]), &node(&[])).is_eligible());
        assert!(!placement(&spec_with(vec![fields("In", &["node-2"])]), &node(&[])).is_eligible());
        assert!(placement(&spec_with(vec![fields("NotIn", &["node-2"])]), &node(&[])).is_eligible());
        let p = placement(&spec_with(vec![fields("Exists", &[])]), &node(&[]));
        assert!(matches!(p, Placement::NotEligible(r) if r.contains("only In, NotIn")));
        let other = NodeSelectorTerm {
            match_expressions: vec![],
            match_fields: vec![requirement("metadata.uid", "In", &["x"])],
        };
        let p = placement(&spec_with(vec![other]), &node(&[]));
        assert!(matches!(p, Placement::NotEligible(r) if r.contains("only metadata.name")));
        // A label named metadata.name does not stand in for the node name.
        let label_term = term(vec![requirement("metadata.name", "In", &["node-1"])]);
        assert!(!placement(&spec_with(vec![label_term]), &node(&[])).is_eligible());
    }
}
