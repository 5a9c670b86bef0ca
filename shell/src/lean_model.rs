//! The model objects as the shell decodes them from the API server: metadata, and only the
//! spec fields the core keeps (`model_agent_core::lean`). kube's watcher and `Api` decode
//! responses straight into this type, so no `serde_json::Value` tree of a whole object (a
//! tenant's megabytes of `parameters`) is ever built.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::ApiResource;
use kube::core::{DynamicResourceScope, Resource};
use serde::Deserialize;

use model_agent_core::lean::LeanSpec;
use model_agent_core::model::{ApiMetadata, ObjectError};
use model_agent_core::{Kind, ModelObject};

#[derive(Clone, Debug, Deserialize)]
pub struct LeanModel {
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "LeanSpec::lenient")]
    pub spec: LeanSpec,
}

/// The metadata fields the agent reads. The rest is skipped unbuilt: `managedFields[].fieldsV1`
/// mirrors the object's field tree, parts open to any fields included, and built as
/// `ObjectMeta` builds it (a `serde_json::Value`) one object nested about 120 levels deep failed
/// its whole LIST page on serde_json's recursion limit, so that kind's relist restarted for good
/// (a review).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMetadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
}

fn lean_metadata<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMetadata::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        labels: m.labels,
        annotations: m.annotations,
        finalizers: m.finalizers,
        ..ObjectMeta::default()
    })
}

impl Resource for LeanModel {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl LeanModel {
    /// The object the core keeps; a spec over `spec_bytes_max` is kept as identity and a reason.
    pub fn into_model(self, kind: Kind, spec_bytes_max: usize) -> Result<ModelObject, ObjectError> {
        let md = self.metadata;
        // RFC 3339 as the API server wrote it: text order is time order.
        let created = md.creation_timestamp.as_ref().and_then(|t| serde_json::to_value(t).ok());
        let metadata = ApiMetadata {
            name: md.name,
            namespace: md.namespace,
            uid: md.uid,
            resource_version: md.resource_version,
            creation_timestamp: created.and_then(|v| v.as_str().map(str::to_string)),
            deletion_timestamp: md.deletion_timestamp.map(|_| "set".to_string()),
            labels: md.labels.unwrap_or_default(),
            annotations: md.annotations.unwrap_or_default(),
        };
        ModelObject::from_parts(kind, metadata, self.spec.into_api(spec_bytes_max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_model_straight_into_the_lean_form() {
        let blob = "x".repeat(200_000);
        let json = format!(
            r#"{{"apiVersion":"ome.io/v1beta1","kind":"BaseModel","metadata":{{"name":"m","namespace":"t","uid":"u1","resourceVersion":"7","creationTimestamp":"2026-12-03T10:00:00Z","labels":{{"models.ome/reserve-model-artifact":"true"}}}},"spec":{{"storage":{{"storageUri":"hf://o/r","parameters":{{"blob":"{blob}"}}}}}}}}"#
        );
        let lean: LeanModel = serde_json::from_str(&json).unwrap();
        let m = lean.into_model(Kind::BaseModel, 64 * 1024).unwrap();
        assert_eq!((m.key.namespace.as_ref(), m.key.name.as_ref(), m.uid.as_str()), ("t", "m", "u1"));
        assert_eq!(m.created.as_ref(), "2026-12-03T10:00:00Z");
        let spec = m.spec().expect("parameters are skipped, not counted against the limit");
        assert!(spec.reserve_artifact);
        assert_eq!(&*spec.storage_uri, "hf://o/r");
    }

    #[test]
    fn a_malformed_spec_is_kept_as_a_reason_and_the_object_is_not_lost() {
        let json = r#"{"metadata":{"name":"m","uid":"u1","deletionTimestamp":"2026-12-03T10:00:00Z"},"spec":{"storage":{"storageUri":["not","a","string"]}}}"#;
        let m = serde_json::from_str::<LeanModel>(json).unwrap().into_model(Kind::ClusterBaseModel, 1024).unwrap();
        assert!(m.deleting);
        assert!(m.spec.unwrap_err().contains("spec is malformed"));
    }

    /// A review: one object whose managed fields nest deeper than serde_json's recursion limit
    /// failed its whole LIST page (the other objects with it).
    #[test]
    fn a_deep_managed_fields_tree_does_not_fail_the_page() {
        let mut deep = String::from("{}");
        for _ in 0..200 {
            deep = format!(r#"{{"f:k":{deep}}}"#);
        }
        let fields = format!(
            r#"[{{"manager":"kubectl","operation":"Update","fieldsType":"FieldsV1","fieldsV1":{{"f:spec":{deep}}}}}]"#
        );
        let bad = format!(
            r#"{{"metadata":{{"name":"deep","uid":"u2","resourceVersion":"7","labels":{{"a":"b"}},"managedFields":{fields}}},"spec":{{"storage":{{"storageUri":"hf://o/r"}}}}}}"#
        );
        let good = r#"{"metadata":{"name":"m","uid":"u1"},"spec":{"storage":{"storageUri":"hf://o/r"}}}"#;
        let page = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"1"}},"items":[{good},{bad}]}}"#
        );
        let decoded = serde_json::from_str::<kube::core::ObjectList<LeanModel>>(&page).expect("the page decodes");
        let deep = &decoded.items[1].metadata;
        assert_eq!(
            (deep.name.as_deref(), deep.uid.as_deref(), deep.resource_version.as_deref()),
            (Some("deep"), Some("u2"), Some("7"))
        );
        assert_eq!(deep.labels.as_ref().and_then(|l| l.get("a")).map(String::as_str), Some("b"));
    }
}
