//! The model domain: identity of a model, the API server's JSON for BaseModel and ClusterBaseModel
//! (only the fields the agent needs), and the lean object the core keeps per model.
//!
//! The core never keeps whole API objects: a `ModelObject` holds the identity, the deletion marker
//! and the parsed spec. That keeps memory per model small (see README, memory figures).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::placement::{NodeSelectorRequirement, NodeSelectorTerm};
use crate::storage_uri::StorageUri;

/// The two model kinds of `ome.io/v1beta1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// Namespaced `BaseModel`.
    BaseModel,
    /// Cluster-scoped `ClusterBaseModel`.
    ClusterBaseModel,
}

impl Kind {
    pub const ALL: [Kind; 2] = [Kind::BaseModel, Kind::ClusterBaseModel];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::BaseModel => "BaseModel",
            Kind::ClusterBaseModel => "ClusterBaseModel",
        }
    }

    /// The plural resource name used in API paths.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::BaseModel => "basemodels",
            Kind::ClusterBaseModel => "clusterbasemodels",
        }
    }

    pub fn index(self) -> usize {
        match self {
            Kind::BaseModel => 0,
            Kind::ClusterBaseModel => 1,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A model's identity: kind, namespace (empty for cluster-scoped) and name.
/// Names can be reused; every destructive decision also checks the [`Uid`].
///
/// Interned: one shared allocation holds the parts and their hash, so a clone is a reference
/// count, hashing writes one word, and comparing a key with a clone of itself (the core's maps,
/// sets and timers hold clones of the key its object arrived with) never reads the text. Keys
/// built apart compare by their text, as before. The parts read as fields (`key.name`).
#[derive(Clone)]
pub struct ModelKey(Arc<KeyParts>);

/// The parts of a [`ModelKey`].
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyParts {
    pub kind: Kind,
    pub namespace: Arc<str>,
    /// Not shared with anything else: a box, without the reference counts of an `Arc`.
    pub name: Box<str>,
    /// Of the three fields above; never compared (equal parts have equal hashes).
    hash: u64,
    /// The first 16 bytes of the name, zero-padded, as two big-endian words: names that differ
    /// there compare as two integers.
    name_words: [u64; 2],
}

/// The serialised shape of a key (traces, effects): `{"kind", "namespace"?, "name"}`.
#[derive(Serialize, Deserialize)]
struct KeyWire<'a> {
    kind: Kind,
    #[serde(default, skip_serializing_if = "str_is_empty", borrow)]
    namespace: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
}

fn str_is_empty(s: &str) -> bool {
    s.is_empty()
}

/// One shared empty namespace for every cluster-scoped key, not an allocation each.
fn empty() -> Arc<str> {
    thread_local! { static EMPTY: Arc<str> = Arc::from(""); }
    EMPTY.with(Arc::clone)
}

impl ModelKey {
    pub fn cluster(name: &str) -> Self {
        ModelKey::from_parts(Kind::ClusterBaseModel, empty(), Box::from(name))
    }

    pub fn namespaced(namespace: &str, name: &str) -> Self {
        ModelKey::from_parts(Kind::BaseModel, Arc::from(namespace), Box::from(name))
    }

    fn from_parts(kind: Kind, namespace: Arc<str>, name: Box<str>) -> Self {
        let mut h = rustc_hash::FxHasher::default();
        (kind, &*namespace, &*name).hash(&mut h);
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            for (i, b) in name.bytes().skip(at).take(8).enumerate() {
                bytes[i] = b;
            }
            u64::from_be_bytes(bytes)
        };
        let name_words = [word(0), word(8)];
        ModelKey(Arc::new(KeyParts { kind, namespace, name, hash: h.finish(), name_words }))
    }
}

impl ModelKey {
    /// The hash of the parts: equal keys have equal fingerprints.
    pub(crate) fn fingerprint(&self) -> u64 {
        self.0.hash
    }
}

impl std::ops::Deref for ModelKey {
    type Target = KeyParts;
    fn deref(&self) -> &KeyParts {
        &self.0
    }
}

impl PartialEq for ModelKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.hash == other.hash && *self.0 == *other.0)
    }
}

impl Eq for ModelKey {}

impl PartialOrd for ModelKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Kind, then namespace, then name (the hash is equal whenever those are).
impl Ord for ModelKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        let namespace = |a: &Arc<str>, b: &Arc<str>| {
            if Arc::ptr_eq(a, b) { std::cmp::Ordering::Equal } else { text_cmp(a, b) }
        };
        // Zero-padded prefixes that differ order as the texts do (the shorter text is the
        // one padded where they first differ); equal ones need the texts.
        let name = |a: &KeyParts, b: &KeyParts| match a.name_words.cmp(&b.name_words) {
            std::cmp::Ordering::Equal => text_cmp(&a.name, &b.name),
            unequal => unequal,
        };
        self.kind
            .cmp(&other.kind)
            .then_with(|| namespace(&self.namespace, &other.namespace))
            .then_with(|| name(&self.0, &other.0))
    }
}

/// `a.cmp(b)` for short texts, eight bytes at a time (names differ early, and a call to
/// `memcmp` costs more than the comparison).
fn text_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    const WORD: usize = 8;
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut at = 0;
    while at + WORD <= a.len() && at + WORD <= b.len() {
        let word = |s: &[u8]| u64::from_be_bytes(s[at..at + WORD].try_into().expect("eight bytes"));
        match word(a).cmp(&word(b)) {
            std::cmp::Ordering::Equal => at += WORD,
            unequal => return unequal,
        }
    }
    a[at..].cmp(&b[at..])
}

impl Hash for ModelKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl Serialize for ModelKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let wire = KeyWire { kind: self.kind, namespace: (&*self.namespace).into(), name: (&*self.name).into() };
        wire.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ModelKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = KeyWire::deserialize(d)?;
        Ok(match wire.kind {
            Kind::ClusterBaseModel if wire.namespace.is_empty() => ModelKey::cluster(&wire.name),
            kind => ModelKey::from_parts(kind, Arc::from(&*wire.namespace), Box::from(&*wire.name)),
        })
    }
}

impl fmt::Debug for ModelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for ModelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::ClusterBaseModel => write!(f, "ClusterBaseModel/{}", self.name),
            Kind::BaseModel => write!(f, "BaseModel/{}/{}", self.namespace, self.name),
        }
    }
}

/// The API server's unique id of one object incarnation. Never reused.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Uid(pub Arc<str>);

impl Uid {
    pub fn new(s: &str) -> Self {
        Uid(Arc::from(s))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `spec.storage.downloadPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DownloadPolicy {
    #[default]
    AlwaysDownload,
    ReuseIfExists,
}

// ---------------------------------------------------------------------------------------------
// The API server's JSON (subset). Unknown fields are ignored; every field is optional so that a
// malformed object still yields its identity and a clear error instead of a dropped event.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiMetadata {
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub creation_timestamp: Option<String>,
    pub deletion_timestamp: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

fn too_big(bytes: usize, bytes_max: usize) -> String {
    format!("spec is {bytes} bytes of JSON, over the limit of {bytes_max} bytes: not kept")
}

/// `spec` of BaseModel / ClusterBaseModel (`BaseModelSpec`), the fields the agent reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiModelSpec {
    pub storage: Option<ApiStorageSpec>,
}

/// `spec.storage` (`StorageSpec`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiStorageSpec {
    pub storage_uri: Option<String>,
    pub path: Option<String>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    pub node_affinity: Option<ApiNodeAffinity>,
    pub download_policy: Option<DownloadPolicy>,
}

/// `corev1.NodeAffinity`: only the required terms matter to the agent.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiNodeAffinity {
    pub required_during_scheduling_ignored_during_execution: Option<ApiNodeSelector>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiNodeSelector {
    #[serde(default)]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

// ---------------------------------------------------------------------------------------------
// The lean model the core keeps.
// ---------------------------------------------------------------------------------------------

/// What the core keeps of one model object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelObject {
    pub key: ModelKey,
    pub uid: Uid,
    /// `metadata.resourceVersion`, kept for traces and logs only (never compared for ordering).
    #[serde(default)]
    pub resource_version: Arc<str>,
    /// `metadata.deletionTimestamp` is set: positive evidence the object is being deleted.
    #[serde(default)]
    pub deleting: bool,
    /// `metadata.creationTimestamp` (RFC 3339, as the API server writes it, so text order is
    /// time order): ranks models whose label keys collide (older first).
    #[serde(default)]
    pub created: Arc<str>,
    /// The spec as parsed, or why it could not be (the model is then Failed where it applies).
    pub spec: Result<Arc<ModelSpec>, String>,
}

/// The parsed spec: what eligibility, the destination path and availability need.
/// `Eq`, so that comparing two `Arc<ModelSpec>` short-circuits on the pointer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// Shared: every plan to fetch the model holds it.
    pub storage_uri: Arc<str>,
    /// `Ok(uri)`, or the parse error (the model is Failed on nodes where it is eligible).
    pub uri: Result<StorageUri, String>,
    /// `spec.storage.path`; `None` and `Some("")` both mean "derive from the models root".
    pub path: Option<String>,
    /// `nodeSelector` pairs, sorted by key. A small sorted list, not a map: a B-tree leaf costs
    /// about 540 bytes per model for what is usually one pair (see README, memory).
    pub node_selector: Vec<(String, String)>,
    /// Required node-affinity terms (ORed); empty means no constraint.
    pub required_terms: Vec<NodeSelectorTerm>,
    /// Kept for the download issues (`ReuseIfExists` decides whether a download runs). What only
    /// a download reads (`storage.key`, `parameters`, `modelFormat`, `additionalMetadata`) is not
    /// kept: the shell reads the live object when it downloads, so a tenant's megabytes of
    /// parameters never stay in every agent's memory.
    pub download_policy: DownloadPolicy,
    /// Label `models.ome/reserve-model-artifact=true`: the agent never moves the weights.
    pub reserve_artifact: bool,
    /// Annotation `ome.oracle.com/skip-config-parsing=true`.
    pub skip_config_parsing: bool,
}

/// Why an API object cannot even be identified. Such an object is ignored (and logged by the
/// shell); it never becomes a delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectError {
    MissingName,
    MissingUid,
    MissingNamespace,
    NotJson(String),
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::MissingName => f.write_str("metadata.name is missing"),
            ObjectError::MissingUid => f.write_str("metadata.uid is missing"),
            ObjectError::MissingNamespace => f.write_str("metadata.namespace is missing on a BaseModel"),
            ObjectError::NotJson(e) => write!(f, "not a model object: {e}"),
        }
    }
}

impl std::error::Error for ObjectError {}

pub const RESERVE_ARTIFACT_LABEL: &str = "models.ome/reserve-model-artifact";
pub const SKIP_CONFIG_PARSING_ANNOTATION: &str = "ome.oracle.com/skip-config-parsing";

/// A spec larger than this (serialised JSON) is kept as identity plus a Failed reason
/// (core.md, "Bounded state"; `Config::object_bytes_max`).
pub const OBJECT_BYTES_MAX_DEFAULT: usize = 64 * 1024;

/// Counts bytes written, to measure a JSON value's size without building the text.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size of `value` as compact JSON.
pub fn json_bytes(value: &serde_json::Value) -> usize {
    let mut count = ByteCount(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

impl ModelObject {
    /// Parse one object from the API server's JSON, with the default spec size limit.
    pub fn from_json(kind: Kind, json: &serde_json::Value) -> Result<ModelObject, ObjectError> {
        ModelObject::from_json_bounded(kind, json, OBJECT_BYTES_MAX_DEFAULT)
    }

    /// Parse one object, borrowing the JSON (no copy of the tree); a spec over `spec_bytes_max`
    /// is not parsed: the model keeps its identity and a Failed reason.
    pub fn from_json_bounded(
        kind: Kind,
        json: &serde_json::Value,
        spec_bytes_max: usize,
    ) -> Result<ModelObject, ObjectError> {
        // Deserialised from borrowed parts: the tree is never copied.
        let fields = json.as_object().ok_or_else(|| ObjectError::NotJson("not a JSON object".into()))?;
        let metadata = match fields.get("metadata") {
            None => ApiMetadata::default(),
            Some(md) => ApiMetadata::deserialize(md).map_err(|e| ObjectError::NotJson(e.to_string()))?,
        };
        let spec = match fields.get("spec").filter(|v| !v.is_null()) {
            None => Err("spec is missing".to_string()),
            Some(v) if json_bytes(v) > spec_bytes_max => Err(too_big(json_bytes(v), spec_bytes_max)),
            Some(v) => ApiModelSpec::deserialize(v).map_err(|e| format!("spec is malformed: {e}")),
        };
        ModelObject::from_parts(kind, metadata, spec)
    }

    /// Build the lean object from its metadata and its spec (parsed, or why not): the shell's
    /// path, which decodes both straight from the API's bytes (`lean::LeanSpec`).
    pub fn from_parts(
        kind: Kind,
        md: ApiMetadata,
        spec: Result<ApiModelSpec, String>,
    ) -> Result<ModelObject, ObjectError> {
        let name = md.name.filter(|n| !n.is_empty()).ok_or(ObjectError::MissingName)?;
        let uid = md.uid.filter(|u| !u.is_empty()).ok_or(ObjectError::MissingUid)?;
        let key = match kind {
            Kind::ClusterBaseModel => ModelKey::cluster(&name),
            Kind::BaseModel => {
                let ns = md.namespace.filter(|n| !n.is_empty()).ok_or(ObjectError::MissingNamespace)?;
                ModelKey::namespaced(&ns, &name)
            }
        };
        let reserve = md.labels.get(RESERVE_ARTIFACT_LABEL).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let skip_parse =
            md.annotations.get(SKIP_CONFIG_PARSING_ANNOTATION).is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let spec = spec.and_then(|spec| ModelSpec::from_api(spec, reserve, skip_parse).map(Arc::new));
        Ok(ModelObject {
            key,
            uid: Uid(Arc::from(uid.as_str())),
            resource_version: Arc::from(md.resource_version.unwrap_or_default().as_str()),
            created: Arc::from(md.creation_timestamp.unwrap_or_default().as_str()),
            deleting: md.deletion_timestamp.is_some(),
            spec,
        })
    }

    pub fn spec(&self) -> Option<&ModelSpec> {
        self.spec.as_deref().ok()
    }
}

impl ModelSpec {
    pub fn from_api(
        spec: ApiModelSpec,
        reserve_artifact: bool,
        skip_config_parsing: bool,
    ) -> Result<ModelSpec, String> {
        let storage = spec.storage.ok_or("spec.storage is missing")?;
        let storage_uri = storage.storage_uri.filter(|u| !u.is_empty()).ok_or("spec.storage.storageUri is missing")?;
        let required_terms = storage
            .node_affinity
            .and_then(|a| a.required_during_scheduling_ignored_during_execution)
            .map(|s| s.node_selector_terms)
            .unwrap_or_default();
        let uri = StorageUri::parse(&storage_uri).map_err(|e| e.to_string());
        Ok(ModelSpec {
            uri,
            storage_uri: storage_uri.into(),
            path: storage.path,
            node_selector: storage.node_selector.into_iter().collect(),
            required_terms,
            download_policy: storage.download_policy.unwrap_or_default(),
            reserve_artifact,
            skip_config_parsing,
        })
    }

    /// A spec for tests and the simulator: storage URI and path, no selectors.
    pub fn simple(storage_uri: &str, path: Option<&str>) -> ModelSpec {
        ModelSpec {
            storage_uri: storage_uri.into(),
            uri: StorageUri::parse(storage_uri).map_err(|e| e.to_string()),
            path: path.map(str::to_string),
            node_selector: Vec::new(),
            required_terms: Vec::new(),
            download_policy: DownloadPolicy::AlwaysDownload,
            reserve_artifact: false,
            skip_config_parsing: false,
        }
    }
}

/// Convenience for building requirement lists in tests.
pub fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: crate::placement::Operator::from(operator.to_string()),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Keys order by kind, namespace and name as texts, whatever their lengths.
    #[test]
    fn keys_order_by_their_text() {
        let texts = [
            "",
            "a",
            "a\0",
            "a\0b",
            "ab",
            "abcdefgh",
            "abcdefgh1",
            "abcdefgi",
            "abcdefghabcdefgh",
            "abcdefghabcdefgh1",
            "abcdefghabcdefgg9",
            "b",
            "model-01",
            "model-012",
        ];
        for x in texts {
            for y in texts {
                assert_eq!(text_cmp(x, y), x.cmp(y), "{x:?} {y:?}");
                let (kx, ky) = (ModelKey::namespaced(x, y), ModelKey::namespaced(y, x));
                assert_eq!(kx.cmp(&ky), (x, y).cmp(&(y, x)), "{x:?} {y:?}");
                assert_eq!(ModelKey::cluster(x).cmp(&ModelKey::cluster(y)), x.cmp(y));
            }
        }
        assert!(ModelKey::namespaced("z", "z") < ModelKey::cluster("a"), "BaseModel first");
    }

    #[test]
    fn parses_a_cluster_base_model_from_api_json() {
        let obj = json!({
            "apiVersion": "ome.io/v1beta1", "kind": "ClusterBaseModel",
            "metadata": {"name": "llama", "uid": "u-1", "resourceVersion": "42",
                          "labels": {"models.ome/reserve-model-artifact": "TRUE"},
                          "annotations": {"ome.oracle.com/skip-config-parsing": "true"},
                          "managedFields": [{"manager": "kubectl"}]},
            "spec": {
                "modelFormat": {"name": "safetensors", "version": "1.0.0"},
                "additionalMetadata": {"type": "Training"},
                "storage": {
                    "storageUri": "hf://meta-llama/Llama-3.1-8B@v2",
                    "path": "/mnt/models/llama",
                    "key": "hf-token",
                    "parameters": {"secretKey": "tok"},
                    "downloadPolicy": "ReuseIfExists",
                    "nodeSelector": {"gpu": "h100"},
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                    ]}}
                }
            },
            "status": {"state": "Ready"}
        });
        let m = ModelObject::from_json(Kind::ClusterBaseModel, &obj).unwrap();
        assert_eq!(m.key, ModelKey::cluster("llama"));
        assert_eq!(m.uid.as_str(), "u-1");
        assert_eq!(&*m.resource_version, "42");
        assert!(!m.deleting);
        let spec = m.spec().unwrap();
        assert!(spec.reserve_artifact);
        assert!(spec.skip_config_parsing);
        assert_eq!(spec.path.as_deref(), Some("/mnt/models/llama"));
        assert_eq!(spec.node_selector, vec![("gpu".to_string(), "h100".to_string())]);
        assert_eq!(spec.required_terms.len(), 1);
        assert_eq!(spec.required_terms[0].match_expressions[0], requirement("zone", "In", &["a", "b"]));
        assert_eq!(spec.download_policy, DownloadPolicy::ReuseIfExists);
        assert!(matches!(spec.uri, Ok(StorageUri::HuggingFace { ref revision, .. }) if revision == "v2"));
    }

    #[test]
    fn parses_a_namespaced_base_model_being_deleted() {
        let obj = json!({"metadata": {"name": "m", "namespace": "team", "uid": "u",
                         "deletionTimestamp": "2026-01-01T00:00:00Z"},
                         "spec": {"storage": {"storageUri": "local:///mnt/models/m"}}});
        let m = ModelObject::from_json(Kind::BaseModel, &obj).unwrap();
        assert_eq!(m.key, ModelKey::namespaced("team", "m"));
        assert!(m.deleting);
        assert_eq!(m.spec().unwrap().path, None);
    }

    #[test]
    fn identity_errors_are_errors_and_spec_errors_are_kept() {
        let no_uid = json!({"metadata": {"name": "m"}, "spec": {}});
        assert_eq!(ModelObject::from_json(Kind::ClusterBaseModel, &no_uid), Err(ObjectError::MissingUid));
        let no_name = json!({"metadata": {"uid": "u"}});
        assert_eq!(ModelObject::from_json(Kind::ClusterBaseModel, &no_name), Err(ObjectError::MissingName));
        let no_ns = json!({"metadata": {"uid": "u", "name": "m"}});
        assert_eq!(ModelObject::from_json(Kind::BaseModel, &no_ns), Err(ObjectError::MissingNamespace));
        assert!(matches!(ModelObject::from_json(Kind::BaseModel, &json!([1])), Err(ObjectError::NotJson(_))));

        let no_storage = json!({"metadata": {"uid": "u", "name": "m"}, "spec": {}});
        let m = ModelObject::from_json(Kind::ClusterBaseModel, &no_storage).unwrap();
        assert_eq!(m.spec, Err("spec.storage is missing".to_string()));

        let bad_types = json!({"metadata": {"uid": "u", "name": "m"},
                               "spec": {"storage": {"storageUri": 7}}});
        let m = ModelObject::from_json(Kind::ClusterBaseModel, &bad_types).unwrap();
        assert!(m.spec.unwrap_err().starts_with("spec is malformed"));

        let bad_uri = json!({"metadata": {"uid": "u", "name": "m"},
                             "spec": {"storage": {"storageUri": "ftp://x"}}});
        let m = ModelObject::from_json(Kind::ClusterBaseModel, &bad_uri).unwrap();
        assert!(m.spec().unwrap().uri.is_err());
    }
}
