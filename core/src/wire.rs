//! OME's wire contracts, byte for byte: node label keys and values, the per-node ConfigMap's
//! identity and keys, and the `ModelEntry` JSON (`ome-model-agent.md` §3.3, §3.4).

use serde::{Deserialize, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;

use crate::model::{Kind, ModelKey};

/// Domain of the node labels.
pub const LABEL_DOMAIN: &str = "models.ome.io";
/// Longest label name after `models.ome.io/`.
pub const MAX_LABEL_NAME_LENGTH: usize = 49;
/// Longest ConfigMap key.
pub const MAX_CONFIGMAP_KEY_LENGTH: usize = 253;
/// Label on the per-node ConfigMap that the controller selects on.
pub const CONFIGMAP_STATUS_LABEL: &str = "models.ome/basemodel-status";
pub const CONFIGMAP_NODE_LABEL: &str = "node";
pub const CONFIGMAP_NODE_NAME_ANNOTATION: &str = "models.ome.io/node-name";
pub const CONFIGMAP_MANAGED_BY_ANNOTATION: &str = "models.ome.io/managed-by";

const CLUSTER_LABEL_NAME_BUDGET: usize = MAX_LABEL_NAME_LENGTH - "clusterbasemodel.".len(); // 32
const BASE_LABEL_BUDGET: usize = MAX_LABEL_NAME_LENGTH - ".basemodel.".len(); // 38
const CLUSTER_CM_NAME_BUDGET: usize = MAX_CONFIGMAP_KEY_LENGTH - "clusterbasemodel.".len(); // 236
const BASE_CM_BUDGET: usize = MAX_CONFIGMAP_KEY_LENGTH - ".basemodel.".len(); // 242
const NAMESPACE_BUDGET_MAX: usize = 8;

// The budgets are OME's numbers; these are the relations the code relies on.
const _: () = assert!(CLUSTER_LABEL_NAME_BUDGET == 32 && BASE_LABEL_BUDGET == 38);
const _: () = assert!(CLUSTER_CM_NAME_BUDGET == 236 && BASE_CM_BUDGET == 242);
// A label name is at most 63 characters (Kubernetes), and the prefix plus name fit a key.
const _: () = assert!(MAX_LABEL_NAME_LENGTH <= 63);
// A truncated name keeps the 8 hex digits, a dash and at least one character.
const _: () =
    assert!(NAMESPACE_BUDGET_MAX == HASH_HEX_DIGITS && BASE_LABEL_BUDGET > NAMESPACE_BUDGET_MAX + HASH_HEX_DIGITS + 1);
// A truncated ConfigMap key implies a truncated label (`is_truncated` checks the label only).
const _: () = assert!(CLUSTER_LABEL_NAME_BUDGET <= CLUSTER_CM_NAME_BUDGET && BASE_LABEL_BUDGET <= BASE_CM_BUDGET);
const HASH_HEX_DIGITS: usize = 8;

/// First 8 hex digits of sha256(s).
fn hash8(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// OME's `truncateWithHash`: unchanged when it fits, else `hash8 + "-" + the last chars`, and
/// only the hash when there is no room for a suffix.
pub fn truncate_with_hash(s: &str, len_max: usize) -> String {
    if s.len() <= len_max {
        return s.to_string();
    }
    let hash = hash8(s);
    if len_max <= hash.len() + 1 {
        return hash[..hash.len().min(len_max)].to_string();
    }
    let keep = len_max - hash.len() - 1;
    // Names are DNS labels (ASCII); fall back to a char boundary for anything else.
    let mut start = s.len() - keep;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("{hash}-{}", &s[start..])
}

/// A Failed reason's bytes at most, in the ConfigMap entry and in what the core keeps: a
/// reason may quote what a user wrote (a storage URI of up to the spec's limit), and a few
/// dozen entries of 60 KiB filled a node's ConfigMap past the API server's 1 MiB (a review).
pub const REASON_BYTES_MAX: usize = 1024;

/// `reason`, cut at a character boundary to at most `REASON_BYTES_MAX` bytes with `…` at the end
/// when it is longer.
pub fn bounded_reason(reason: &str) -> Cow<'_, str> {
    if reason.len() <= REASON_BYTES_MAX {
        return Cow::Borrowed(reason);
    }
    let mut end = REASON_BYTES_MAX - '…'.len_utf8();
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &reason[..end]))
}

/// `truncate_with_hash`, borrowing what fits (nearly every name: no allocation).
fn truncated(s: &str, len_max: usize) -> Cow<'_, str> {
    if s.len() <= len_max { Cow::Borrowed(s) } else { Cow::Owned(truncate_with_hash(s, len_max)) }
}

/// Split a namespace/name pair into a budget the way OME does for BaseModels.
fn split_namespaced<'a>(namespace: &'a str, name: &'a str, budget: usize) -> (Cow<'a, str>, Cow<'a, str>) {
    if namespace.len() + name.len() <= budget {
        return (Cow::Borrowed(namespace), Cow::Borrowed(name));
    }
    let ns_budget = namespace.len().min(NAMESPACE_BUDGET_MAX);
    let name_budget = budget - ns_budget;
    (truncated(namespace, ns_budget), truncated(name, name_budget))
}

/// The node label key for a model (`models.ome.io/clusterbasemodel.<name>` or
/// `models.ome.io/<ns>.basemodel.<name>`). The controller computes the same key: a contract.
pub fn label_key(key: &ModelKey) -> String {
    let mut out = String::new();
    write_label_key(key, &mut out);
    out
}

/// `label_key` into `out` (cleared first): a pass over every model reuses one buffer.
pub fn write_label_key(key: &ModelKey, out: &mut String) {
    out.clear();
    match key.kind {
        Kind::ClusterBaseModel => {
            let name = truncated(&key.name, CLUSTER_LABEL_NAME_BUDGET);
            out.extend([LABEL_DOMAIN, "/clusterbasemodel.", &name]);
        }
        Kind::BaseModel => {
            let (ns, name) = split_namespaced(&key.namespace, &key.name, BASE_LABEL_BUDGET);
            out.extend([LABEL_DOMAIN, "/", &ns, ".basemodel.", &name]);
        }
    }
}

/// Does OME cut this model's keys to a hash and a suffix? (The label budget is the smaller, so
/// a truncated ConfigMap key implies a truncated label.) Only such keys collide without their
/// text showing the other model's name.
pub fn is_truncated(key: &ModelKey) -> bool {
    match key.kind {
        Kind::ClusterBaseModel => key.name.len() > CLUSTER_LABEL_NAME_BUDGET,
        Kind::BaseModel => key.namespace.len() + key.name.len() > BASE_LABEL_BUDGET,
    }
}

/// Is this a node label the agent manages?
pub fn is_model_label(label: &str) -> bool {
    label.strip_prefix(LABEL_DOMAIN).is_some_and(|rest| rest.starts_with('/'))
}

/// Is this a ConfigMap key of one of OME's two shapes (`clusterbasemodel.<name>`,
/// `<ns>.basemodel.<name>`)? Only such entries are orphan-sweep candidates.
pub fn is_model_entry_key(cm_key: &str) -> bool {
    if cm_key.strip_prefix("clusterbasemodel.").is_some_and(|name| !name.is_empty()) {
        return true;
    }
    cm_key.split_once(".basemodel.").is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

/// Is this node label one OME's agent writes: one of the two key shapes under
/// `models.ome.io/`, with a value Ready, Updating or Failed? Only such labels are orphan-sweep
/// candidates; anything else under the prefix belongs to someone else and is left alone.
pub fn is_model_status_label(label: &str, value: &str) -> bool {
    let shaped = label.strip_prefix(LABEL_DOMAIN).and_then(|r| r.strip_prefix('/')).is_some_and(is_model_entry_key);
    shaped && ModelStatus::parse(value).is_some()
}

/// The key of a model's entry in the per-node ConfigMap.
pub fn configmap_key(key: &ModelKey) -> String {
    let mut out = String::new();
    write_configmap_key(key, &mut out);
    out
}

/// `configmap_key` into `out` (cleared first).
pub fn write_configmap_key(key: &ModelKey, out: &mut String) {
    out.clear();
    match key.kind {
        Kind::ClusterBaseModel => {
            out.extend(["clusterbasemodel.", &truncated(&key.name, CLUSTER_CM_NAME_BUDGET)]);
        }
        Kind::BaseModel => {
            let (ns, name) = split_namespaced(&key.namespace, &key.name, BASE_CM_BUDGET);
            out.extend([&ns, ".basemodel.", &name]);
        }
    }
}

/// The per-node ConfigMap's name (the node name), labels and annotations.
pub struct ConfigMapIdentity {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// A label value's bytes at most (the API server's rule).
const LABEL_VALUE_BYTES_MAX: usize = 63;

/// OME's identity. A Node name may have up to 253 characters, a label value 63: the `node` label
/// of a longer name would make every write of the ConfigMap fail (OME's create does); it is left
/// out then, and the annotation still names the node (the controller selects on the status label).
pub fn configmap_identity(node_name: &str) -> ConfigMapIdentity {
    let mut labels = BTreeMap::from([(CONFIGMAP_STATUS_LABEL.to_string(), "true".to_string())]);
    if node_name.len() <= LABEL_VALUE_BYTES_MAX {
        labels.insert(CONFIGMAP_NODE_LABEL.to_string(), node_name.to_string());
    }
    ConfigMapIdentity {
        name: node_name.to_string(),
        labels,
        annotations: BTreeMap::from([
            (CONFIGMAP_NODE_NAME_ANNOTATION.to_string(), node_name.to_string()),
            (CONFIGMAP_MANAGED_BY_ANNOTATION.to_string(), "model-agent".to_string()),
        ]),
    }
}

/// A model's state on a node, as label value and entry status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ModelStatus {
    Ready,
    Updating,
    Failed,
    /// Accepted by the controller in entries; never a label value (the label is removed instead).
    Deleted,
}

impl ModelStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelStatus::Ready => "Ready",
            ModelStatus::Updating => "Updating",
            ModelStatus::Failed => "Failed",
            ModelStatus::Deleted => "Deleted",
        }
    }

    pub fn parse(s: &str) -> Option<ModelStatus> {
        match s {
            "Ready" => Some(ModelStatus::Ready),
            "Updating" => Some(ModelStatus::Updating),
            "Failed" => Some(ModelStatus::Failed),
            "Deleted" => Some(ModelStatus::Deleted),
            _ => None,
        }
    }
}

/// One ConfigMap value: OME's `ModelEntry`, field for field and in Go's order, plus two fields
/// of this agent that the controller ignores (`uid`, `reason`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    pub name: String,
    pub status: ModelStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<DownloadProgress>,
    /// The uid of the model incarnation this entry belongs to: cleanup of another uid keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Why the model is Failed on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A model's metadata, as the entry's JSON (Go-escaped), at most: a config.json with a huge
/// string must neither grow the core nor push the node's ConfigMap past the API server's 1 MiB,
/// which holds every model's entry. Real summaries are about 1 KiB.
pub const MODEL_CONFIG_BYTES_MAX: usize = 4 << 10;

/// Whether `config` is small enough to keep and publish.
pub fn model_config_fits(config: &ModelConfig) -> bool {
    serde_json::to_string(config).is_ok_and(|json| go_escape(json).len() <= MODEL_CONFIG_BYTES_MAX)
}

/// OME's `ModelConfig`. Go's `omitempty` on every field but `artifact`, a struct, which Go
/// always emits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_architecture: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_framework: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub model_format: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_parameter_size: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_tokens: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_capabilities: Vec<String>,
    /// Go decodes this into a map, so keys come out sorted (serde_json's default map is sorted).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub decoded_model_configuration: serde_json::Map<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub quantization: String,
    #[serde(default)]
    pub artifact: Artifact,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// OME's `Artifact`: no `omitempty`; a nil map or slice is `null`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    #[serde(default)]
    pub sha: String,
    #[serde(default)]
    pub parent_path: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub children_paths: Option<Vec<String>>,
}

/// OME's `DownloadProgress`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DownloadProgress {
    pub phase: String,
    pub total_bytes: i64,
    pub completed_bytes: i64,
    pub total_files: i64,
    pub completed_files: i64,
    #[serde(serialize_with = "go_float")]
    pub speed_bytes_per_sec: f64,
    pub last_updated: String,
}

/// Go's `encoding/json` writes an integral float without a fraction (`100`, not `100.0`).
fn go_float<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 { s.serialize_i64(*v as i64) } else { s.serialize_f64(*v) }
}

impl ModelEntry {
    /// A bare entry with a status (what the agent writes before metadata is known).
    pub fn new(name: &str, status: ModelStatus) -> ModelEntry {
        ModelEntry { name: name.to_string(), status, config: None, progress: None, uid: None, reason: None }
    }

    /// The JSON string stored as the ConfigMap value.
    /// Go's `encoding/json` bytes: it escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings,
    /// which serde_json writes as they are (an architecture or a reason may hold them).
    pub fn to_json(&self) -> String {
        go_escape(serde_json::to_string(self).expect("ModelEntry always serialises"))
    }

    pub fn from_json(s: &str) -> Result<ModelEntry, String> {
        serde_json::from_str(s).map_err(|e| format!("ConfigMap entry is not a ModelEntry: {e}"))
    }
}

/// Outside strings JSON holds none of these characters, so replacing them everywhere escapes
/// exactly the strings' ones.
fn go_escape(json: String) -> String {
    if !json.contains(['<', '>', '&', '\u{2028}', '\u{2029}']) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// Who a ConfigMap entry says it belongs to. The agent writes its uid into every entry;
/// OME's own agent writes none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryOwner {
    /// Not a ModelEntry: nobody can be shown to own it.
    Unreadable,
    /// A ModelEntry without a uid (written by OME's agent, or before uids).
    Anonymous,
    Uid(String),
}

impl EntryOwner {
    /// The owner of a stored value.
    pub fn of(value: &str) -> EntryOwner {
        match ModelEntry::from_json(value) {
            Err(_) => EntryOwner::Unreadable,
            Ok(ModelEntry { uid: None, .. }) => EntryOwner::Anonymous,
            Ok(ModelEntry { uid: Some(uid), .. }) => EntryOwner::Uid(uid),
        }
    }

    /// The uid as an orphan sweep records it (`None` for anonymous and unreadable entries).
    pub fn uid(&self) -> Option<&str> {
        match self {
            EntryOwner::Uid(u) => Some(u),
            EntryOwner::Anonymous | EntryOwner::Unreadable => None,
        }
    }
}

/// The entry-ownership rule, in one place: may this entry be taken as `uid`'s? Its own entry,
/// and one no other uid has claimed (anonymous or unreadable), are; another uid's never is.
/// The core decides drift with it; the shell and the simulator remove entries with it.
pub fn entry_is_of(owner: &EntryOwner, uid: &str) -> bool {
    claim_is_of(owner.uid(), uid)
}

/// `entry_is_of` for an entry that names `claimed` (`EntryOwner::uid`: none for an anonymous
/// or unreadable one), for a reader that has the uid without an `EntryOwner`.
pub fn claim_is_of(claimed: Option<&str>, uid: &str) -> bool {
    claimed.is_none_or(|c| c == uid)
}

/// One change to a node's ConfigMap data, from one effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryWrite<V> {
    /// Publish: write `value` (the entry of the publishing uid).
    Put { cm_key: String, value: V },
    /// Unpublish: remove the entry only if it is `uid`'s (`entry_is_of`).
    Withdraw { cm_key: String, uid: String },
    /// Orphan sweep: remove the entry only if its owner is still the one the snapshot saw
    /// (`seen_uid`; `None` for anonymous or unreadable), so a rewrite since then is kept.
    RemoveOrphan { cm_key: String, seen_uid: Option<String> },
}

/// A stored entry value whose owner can be read: the JSON text (shell) or a parsed form (sim).
pub trait EntryValue: PartialEq + Clone {
    fn owner(&self) -> EntryOwner;
}

impl EntryValue for String {
    fn owner(&self) -> EntryOwner {
        EntryOwner::of(self)
    }
}

impl<V> EntryWrite<V> {
    fn cm_key(&self) -> &String {
        match self {
            EntryWrite::Put { cm_key, .. }
            | EntryWrite::Withdraw { cm_key, .. }
            | EntryWrite::RemoveOrphan { cm_key, .. } => cm_key,
        }
    }

    /// Does this write remove an entry whose owner is `owner`?
    fn removes(&self, owner: &EntryOwner) -> bool {
        match self {
            EntryWrite::Put { .. } => false,
            EntryWrite::Withdraw { uid, .. } => entry_is_of(owner, uid),
            EntryWrite::RemoveOrphan { seen_uid, .. } => owner.uid() == seen_uid.as_deref(),
        }
    }
}

/// A ConfigMap's data as the entry writers see it: the shell's sorted map (the API's type), or
/// the simulator's per-node hash map.
pub trait EntryData<K, V> {
    fn entry_mut(&mut self, cm_key: &str) -> Option<&mut V>;
    fn entry(&self, cm_key: &str) -> Option<&V>;
    fn insert_entry(&mut self, cm_key: K, value: V);
    fn remove_entry(&mut self, cm_key: &str);
}

impl<K: Ord + Borrow<str>, V> EntryData<K, V> for BTreeMap<K, V> {
    fn entry_mut(&mut self, cm_key: &str) -> Option<&mut V> {
        self.get_mut(cm_key)
    }
    fn entry(&self, cm_key: &str) -> Option<&V> {
        self.get(cm_key)
    }
    fn insert_entry(&mut self, cm_key: K, value: V) {
        self.insert(cm_key, value);
    }
    fn remove_entry(&mut self, cm_key: &str) {
        self.remove(cm_key);
    }
}

impl<K: Eq + std::hash::Hash + Borrow<str>, V, S: std::hash::BuildHasher> EntryData<K, V>
    for std::collections::HashMap<K, V, S>
{
    fn entry_mut(&mut self, cm_key: &str) -> Option<&mut V> {
        self.get_mut(cm_key)
    }
    fn entry(&self, cm_key: &str) -> Option<&V> {
        self.get(cm_key)
    }
    fn insert_entry(&mut self, cm_key: K, value: V) {
        self.insert(cm_key, value);
    }
    fn remove_entry(&mut self, cm_key: &str) {
        self.remove(cm_key);
    }
}

/// An `EntryWrite::Put`: the value is set whoever owned the key (the ownership rule binds
/// withdrawals only); returns whether anything changed. Copies the key only for a new entry.
/// `new_key` makes the map's key for a new entry (the simulator shares one copy across nodes).
pub fn put_entry<K, V: EntryValue>(
    data: &mut impl EntryData<K, V>,
    cm_key: &str,
    value: &V,
    new_key: impl FnOnce(&str) -> K,
) -> bool {
    match data.entry_mut(cm_key) {
        Some(held) if held == value => false,
        Some(held) => {
            held.clone_from(value);
            true
        }
        None => {
            data.insert_entry(new_key(cm_key), value.clone());
            true
        }
    }
}

/// Apply `writes`, in order, to a ConfigMap's data; returns whether anything changed and the
/// entries removed with their owners (for logs and the simulator's checks).
pub fn apply_entry_writes<K: for<'a> From<&'a str>, V: EntryValue>(
    data: &mut impl EntryData<K, V>,
    writes: &[EntryWrite<V>],
) -> (bool, Vec<(String, EntryOwner)>) {
    let mut changed = false;
    let mut removed = Vec::new();
    for w in writes {
        if let EntryWrite::Put { cm_key, value } = w {
            changed |= put_entry(data, cm_key, value, |k| K::from(k));
            continue;
        }
        let Some(owner) = data.entry(w.cm_key().as_str()).map(EntryValue::owner) else { continue };
        if w.removes(&owner) {
            data.remove_entry(w.cm_key().as_str());
            removed.push((w.cm_key().clone(), owner));
            changed = true;
        }
    }
    (changed, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_entry_ownership_rule_row_by_row() {
        let of = |uid: Option<&str>| {
            ModelEntry { uid: uid.map(str::to_string), ..ModelEntry::new("m", ModelStatus::Ready) }.to_json()
        };
        let data = || {
            BTreeMap::from([
                ("mine".to_string(), of(Some("u1"))),
                ("theirs".to_string(), of(Some("u2"))),
                ("anonymous".to_string(), of(None)),
                ("garbage".to_string(), "{".to_string()),
            ])
        };
        let withdraw = |k: &str| EntryWrite::Withdraw { cm_key: k.to_string(), uid: "u1".to_string() };
        let mut d = data();
        let (changed, removed) = apply_entry_writes(
            &mut d,
            &[withdraw("mine"), withdraw("theirs"), withdraw("anonymous"), withdraw("garbage"), withdraw("absent")],
        );
        assert!(changed);
        let removed: Vec<&str> = removed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(removed, ["mine", "anonymous", "garbage"], "another uid's entry is never withdrawn");
        assert_eq!(d.keys().collect::<Vec<_>>(), ["theirs"]);
        let orphan = |k: &str, seen: Option<&str>| EntryWrite::RemoveOrphan {
            cm_key: k.to_string(),
            seen_uid: seen.map(str::to_string),
        };
        let mut d = data();
        let (_, removed) = apply_entry_writes(
            &mut d,
            &[
                orphan("mine", Some("u9")),
                orphan("theirs", Some("u2")),
                orphan("anonymous", None),
                orphan("garbage", None),
            ],
        );
        let removed: Vec<&str> = removed.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(removed, ["theirs", "anonymous", "garbage"], "an entry rewritten since the snapshot is kept");
        let mut d = data();
        let put = EntryWrite::Put { cm_key: "mine".to_string(), value: of(Some("u1")) };
        assert_eq!(apply_entry_writes(&mut d, &[put]), (false, vec![]), "an identical write changes nothing");
    }

    #[test]
    fn a_hash_map_of_entries_takes_the_same_writes_as_the_sorted_map() {
        let of = |uid: &str| ModelEntry { uid: Some(uid.into()), ..ModelEntry::new("m", ModelStatus::Ready) }.to_json();
        let sorted = BTreeMap::from([("mine".to_string(), of("u1")), ("theirs".to_string(), of("u2"))]);
        let hashed: std::collections::HashMap<String, String> = sorted.clone().into_iter().collect();
        let writes = [
            EntryWrite::Withdraw { cm_key: "mine".into(), uid: "u1".into() },
            EntryWrite::Withdraw { cm_key: "theirs".into(), uid: "u1".into() },
            EntryWrite::Put { cm_key: "new".into(), value: of("u3") },
            EntryWrite::Put { cm_key: "theirs".into(), value: of("u2") },
            EntryWrite::RemoveOrphan { cm_key: "new".into(), seen_uid: Some("u9".into()) },
        ];
        let (mut a, mut b) = (sorted, hashed);
        let (from_sorted, from_hashed) = (apply_entry_writes(&mut a, &writes), apply_entry_writes(&mut b, &writes));
        assert_eq!(from_sorted, from_hashed);
        assert_eq!(from_sorted.1.len(), 1, "only the withdrawn entry of u1 goes: {from_sorted:?}");
        assert_eq!(a, b.into_iter().collect::<BTreeMap<_, _>>());
        assert_eq!(a.keys().collect::<Vec<_>>(), ["new", "theirs"]);
        assert!(put_entry(&mut a, "new", &of("u4"), |k: &str| k.to_string()), "a changed value is written");
    }

    #[test]
    fn label_keys_match_the_worked_examples() {
        assert_eq!(
            label_key(&ModelKey::cluster("qwen2-5-7b-instruct")),
            "models.ome.io/clusterbasemodel.qwen2-5-7b-instruct"
        );
        assert_eq!(
            label_key(&ModelKey::namespaced("llama-demo", "llama-3-1-8b-instruct")),
            "models.ome.io/llama-demo.basemodel.llama-3-1-8b-instruct"
        );
        assert_eq!(
            label_key(&ModelKey::cluster("deepseek-r1-distill-llama-70b-instruct-v2")),
            "models.ome.io/clusterbasemodel.ef186515-l-llama-70b-instruct-v2"
        );
        assert_eq!(
            label_key(&ModelKey::namespaced("a-very-long-namespace-name", "a-very-long-model-name-for-testing")),
            "models.ome.io/e6d70258.basemodel.cae39cc0-odel-name-for-testing"
        );
    }

    #[test]
    fn label_key_boundaries() {
        // 32 characters fit; 33 are truncated to exactly 32.
        let n32 = "a".repeat(32);
        assert_eq!(label_key(&ModelKey::cluster(&n32)), format!("models.ome.io/clusterbasemodel.{n32}"));
        let n33 = "b".repeat(33);
        let k = label_key(&ModelKey::cluster(&n33));
        let name = k.strip_prefix("models.ome.io/clusterbasemodel.").unwrap();
        assert_eq!(name.len(), 32);
        assert!(name.ends_with(&"b".repeat(23)));
        // ns + name of 38 fit; a short namespace keeps its full length in the split.
        let (ns, nm) = ("team", "m".repeat(34));
        assert_eq!(label_key(&ModelKey::namespaced(ns, &nm)), format!("models.ome.io/team.basemodel.{nm}"));
        let nm35 = "m".repeat(35);
        let k = label_key(&ModelKey::namespaced("team", &nm35));
        let tail = k.strip_prefix("models.ome.io/team.basemodel.").unwrap();
        assert_eq!(tail.len(), 34);
        for key in [k, label_key(&ModelKey::namespaced(&"n".repeat(60), &"m".repeat(60)))] {
            assert!(key.len() - "models.ome.io/".len() <= MAX_LABEL_NAME_LENGTH, "{key}");
        }
    }

    #[test]
    fn configmap_keys() {
        assert_eq!(configmap_key(&ModelKey::cluster("qwen2-5-7b-instruct")), "clusterbasemodel.qwen2-5-7b-instruct");
        assert_eq!(
            configmap_key(&ModelKey::namespaced("llama-demo", "llama-3-1-8b-instruct")),
            "llama-demo.basemodel.llama-3-1-8b-instruct"
        );
        // Names up to 236 characters are kept whole; longer ones are truncated to 236.
        let n = "x".repeat(236);
        assert_eq!(configmap_key(&ModelKey::cluster(&n)), format!("clusterbasemodel.{n}"));
        let long = "y".repeat(300);
        let k = configmap_key(&ModelKey::cluster(&long));
        assert_eq!(k.len(), MAX_CONFIGMAP_KEY_LENGTH);
        assert!(k.starts_with(&format!("clusterbasemodel.{}-", hash8(&long))));
        let k = configmap_key(&ModelKey::namespaced(&"n".repeat(20), &"m".repeat(240)));
        assert_eq!(k.len(), MAX_CONFIGMAP_KEY_LENGTH);
        assert!(k.starts_with(&format!("{}.basemodel.", hash8(&"n".repeat(20)))));
    }

    #[test]
    fn a_node_name_too_long_for_a_label_value_is_left_out_of_the_labels() {
        let at_limit = "n".repeat(63);
        assert_eq!(configmap_identity(&at_limit).labels.get(CONFIGMAP_NODE_LABEL), Some(&at_limit));
        let long = format!("{}.example.internal", "n".repeat(60));
        let identity = configmap_identity(&long);
        assert_eq!(identity.labels.len(), 1, "{:?}", identity.labels);
        assert_eq!(identity.annotations.get(CONFIGMAP_NODE_NAME_ANNOTATION), Some(&long));
        assert_eq!(identity.name, long);
    }

    #[test]
    fn a_long_reason_is_cut_at_a_character_boundary() {
        assert_eq!(bounded_reason("short"), "short");
        let long = format!("x{}", "é".repeat(2000));
        let cut = bounded_reason(&long);
        assert!(cut.len() <= REASON_BYTES_MAX && cut.len() > REASON_BYTES_MAX - 8, "{}", cut.len());
        assert!(cut.ends_with('…') && long.starts_with(cut.trim_end_matches('…')));
    }

    #[test]
    fn truncate_with_hash_rules() {
        assert_eq!(truncate_with_hash("short", 8), "short");
        assert_eq!(truncate_with_hash("a-very-long-namespace-name", 8), "e6d70258");
        assert_eq!(truncate_with_hash("abcdefghijk", 4), hash8("abcdefghijk")[..4].to_string());
        assert_eq!(truncate_with_hash("abcdefghijklmnop", 12), format!("{}-{}", hash8("abcdefghijklmnop"), "nop"));
    }

    #[test]
    fn configmap_identity_is_ome_s() {
        let id = configmap_identity("gpu-node-1");
        assert_eq!(id.name, "gpu-node-1");
        assert_eq!(
            serde_json::to_string(&id.labels).unwrap(),
            r#"{"models.ome/basemodel-status":"true","node":"gpu-node-1"}"#
        );
        assert_eq!(
            serde_json::to_string(&id.annotations).unwrap(),
            r#"{"models.ome.io/managed-by":"model-agent","models.ome.io/node-name":"gpu-node-1"}"#
        );
        assert!(is_model_label("models.ome.io/clusterbasemodel.x"));
        assert!(!is_model_label("models.ome/reserve-model-artifact"));
        assert!(!is_model_label("models.ome.iox/y"));
    }

    #[test]
    fn only_ome_s_two_key_shapes_with_status_values_are_sweepable() {
        assert!(is_model_status_label("models.ome.io/clusterbasemodel.x", "Ready"));
        assert!(is_model_status_label("models.ome.io/ns.basemodel.x", "Failed"));
        assert!(is_model_status_label("models.ome.io/ns.basemodel.x", "Updating"));
        assert!(!is_model_status_label("models.ome.io/ns.basemodel.x", "true"));
        assert!(!is_model_status_label("models.ome.io/gpu-pool", "Ready"));
        assert!(!is_model_status_label("models.ome.io/clusterbasemodel.", "Ready"));
        assert!(!is_model_status_label("models.ome.io/.basemodel.x", "Ready"));
        assert!(is_model_entry_key("clusterbasemodel.x") && is_model_entry_key("ns.basemodel.x"));
        assert!(!is_model_entry_key("settings") && !is_model_entry_key("ns.basemodel."));
    }

    const EXAMPLE_1: &str = r#"{"name":"qwen2-5-7b-instruct","status":"Ready","config":{"modelType":"qwen2","modelArchitecture":"Qwen2ForCausalLM","modelFramework":{"name":"transformers","version":"4.43.1"},"modelFormat":{"name":"safetensors","version":"1.0.0"},"modelParameterSize":"7.62B","maxTokens":32768,"modelCapabilities":["TEXT_TO_TEXT"],"decodedModelConfiguration":{"architecture":"Qwen2ForCausalLM","context_length":32768,"has_vision":false,"is_embedding":false,"model_size_bytes":15231233024,"model_type":"qwen2","parameter_count":"7.62B","torch_dtype":"bfloat16","transformers_version":"4.43.1"},"artifact":{"sha":"a09a…","parentPath":{"clusterbasemodel.qwen2-5-7b-instruct":"/mnt/data/models/qwen"},"childrenPaths":[]}}}"#;
    const EXAMPLE_2: &str = r#"{"name":"m","status":"Ready","config":{"modelType":"llama","artifact":{"sha":"","parentPath":null,"childrenPaths":null}}}"#;
    const EXAMPLE_3: &str = r#"{"name":"m","status":"Updating","progress":{"phase":"downloading","totalBytes":100,"completedBytes":50,"totalFiles":10,"completedFiles":5,"speedBytesPerSec":1234.5,"lastUpdated":"2026-01-01T00:00:00Z"}}"#;

    #[test]
    fn entry_json_matches_example_1_byte_for_byte() {
        let decoded = json!({"architecture":"Qwen2ForCausalLM","context_length":32768,"has_vision":false,
            "is_embedding":false,"model_size_bytes":15231233024_u64,"model_type":"qwen2",
            "parameter_count":"7.62B","torch_dtype":"bfloat16","transformers_version":"4.43.1"});
        let entry = ModelEntry {
            config: Some(ModelConfig {
                model_type: "qwen2".into(),
                model_architecture: "Qwen2ForCausalLM".into(),
                model_framework: BTreeMap::from([
                    ("name".into(), "transformers".into()),
                    ("version".into(), "4.43.1".into()),
                ]),
                model_format: BTreeMap::from([
                    ("name".into(), "safetensors".into()),
                    ("version".into(), "1.0.0".into()),
                ]),
                model_parameter_size: "7.62B".into(),
                max_tokens: 32768,
                model_capabilities: vec!["TEXT_TO_TEXT".into()],
                decoded_model_configuration: decoded.as_object().unwrap().clone(),
                artifact: Artifact {
                    sha: "a09a…".into(),
                    parent_path: Some(BTreeMap::from([(
                        "clusterbasemodel.qwen2-5-7b-instruct".into(),
                        "/mnt/data/models/qwen".into(),
                    )])),
                    children_paths: Some(vec![]),
                },
                ..ModelConfig::default()
            }),
            ..ModelEntry::new("qwen2-5-7b-instruct", ModelStatus::Ready)
        };
        assert_eq!(entry.to_json(), EXAMPLE_1);
        assert_eq!(ModelEntry::from_json(EXAMPLE_1).unwrap(), entry);
    }

    #[test]
    fn entry_json_matches_example_2_artifact_always_present() {
        let entry = ModelEntry {
            config: Some(ModelConfig { model_type: "llama".into(), ..ModelConfig::default() }),
            ..ModelEntry::new("m", ModelStatus::Ready)
        };
        assert_eq!(entry.to_json(), EXAMPLE_2);
        assert_eq!(ModelEntry::from_json(EXAMPLE_2).unwrap(), entry);
    }

    #[test]
    fn entry_json_matches_example_3_progress() {
        let entry = ModelEntry {
            progress: Some(DownloadProgress {
                phase: "downloading".into(),
                total_bytes: 100,
                completed_bytes: 50,
                total_files: 10,
                completed_files: 5,
                speed_bytes_per_sec: 1234.5,
                last_updated: "2026-01-01T00:00:00Z".into(),
            }),
            ..ModelEntry::new("m", ModelStatus::Updating)
        };
        assert_eq!(entry.to_json(), EXAMPLE_3);
        assert_eq!(ModelEntry::from_json(EXAMPLE_3).unwrap(), entry);
        // Go prints an integral float64 without a fraction.
        let mut whole = entry.clone();
        whole.progress.as_mut().unwrap().speed_bytes_per_sec = 2048.0;
        assert!(whole.to_json().contains(r#""speedBytesPerSec":2048,"#));
    }

    #[test]
    fn extra_fields_follow_the_ome_fields_and_are_omitted_when_empty() {
        assert_eq!(ModelEntry::new("m", ModelStatus::Updating).to_json(), r#"{"name":"m","status":"Updating"}"#);
        let e = ModelEntry {
            uid: Some("u-1".into()),
            reason: Some("models root is read-only".into()),
            ..ModelEntry::new("m", ModelStatus::Failed)
        };
        assert_eq!(e.to_json(), r#"{"name":"m","status":"Failed","uid":"u-1","reason":"models root is read-only"}"#);
        assert_eq!(ModelEntry::from_json(&e.to_json()).unwrap(), e);
    }

    #[test]
    fn entries_escape_html_characters_as_go_does() {
        // Go: json.Marshal(ModelEntry{Name: "m", Status: "Failed"}) with this reason.
        let e = ModelEntry { reason: Some("a<b>&c\u{2028}".into()), ..ModelEntry::new("m", ModelStatus::Failed) };
        assert_eq!(e.to_json(), r#"{"name":"m","status":"Failed","reason":"a\u003cb\u003e\u0026c\u2028"}"#);
        assert_eq!(ModelEntry::from_json(&e.to_json()).unwrap(), e);
        // An entry written by upstream OME (no uid) still parses; garbage is a clear error.
        assert_eq!(ModelEntry::from_json(r#"{"name":"m","status":"Deleted"}"#).unwrap().status, ModelStatus::Deleted);
        assert!(ModelEntry::from_json("{").unwrap_err().contains("not a ModelEntry"));
    }
}
