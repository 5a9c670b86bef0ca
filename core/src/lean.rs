//! `spec` decoded straight from the API server's JSON into what the core keeps (issue #8:
//! a tenant's megabytes of `parameters` must never be built into a tree in every agent).
//!
//! The parser visits `spec` and `spec.storage` and keeps only the fields the core decides on,
//! each as a small JSON value, so that a wrong type becomes a Failed reason instead of a decode
//! error that would hide the object. Every other field is skipped by the parser without being
//! allocated (`IgnoredAny`).

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;

use crate::model::{ApiModelSpec, ApiStorageSpec, json_bytes};

/// The fields of `spec.storage` the core keeps.
pub const KEPT_STORAGE_FIELDS: [&str; 5] = ["storageUri", "path", "nodeSelector", "nodeAffinity", "downloadPolicy"];

/// `spec` as decoded: missing, not the right shape, or the kept fields of `spec.storage`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum LeanSpec {
    #[default]
    Missing,
    Malformed(String),
    /// `spec` without `storage`.
    NoStorage,
    /// The kept fields of `spec.storage`, as JSON, with the bytes they take.
    Storage {
        fields: serde_json::Map<String, serde_json::Value>,
        bytes: usize,
    },
}

impl LeanSpec {
    /// Deserialise with `LeanSpec::lenient` from any JSON deserializer (`#[serde(deserialize_with)]`).
    pub fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<LeanSpec, D::Error> {
        d.deserialize_any(SpecVisitor)
    }

    /// The spec the core parses, or why it cannot be kept: missing, malformed, or its kept
    /// fields over `spec_bytes_max` of JSON.
    pub fn into_api(self, spec_bytes_max: usize) -> Result<ApiModelSpec, String> {
        match self {
            LeanSpec::Missing => Err("spec is missing".into()),
            LeanSpec::Malformed(reason) => Err(format!("spec is malformed: {reason}")),
            LeanSpec::NoStorage => Ok(ApiModelSpec { storage: None }),
            LeanSpec::Storage { bytes, .. } if bytes > spec_bytes_max => Err(format!(
                "spec.storage is {bytes} bytes of JSON, over the limit of {spec_bytes_max} bytes: not kept"
            )),
            LeanSpec::Storage { fields, .. } => {
                let storage = ApiStorageSpec::deserialize(serde_json::Value::Object(fields))
                    .map_err(|e| format!("spec is malformed: {e}"))?;
                Ok(ApiModelSpec { storage: Some(storage) })
            }
        }
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = LeanSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a model spec")
    }

    fn visit_unit<E: de::Error>(self) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Missing)
    }

    fn visit_none<E: de::Error>(self) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Missing)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LeanSpec, A::Error> {
        let mut spec = LeanSpec::NoStorage;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "storage" {
                spec = map.next_value_seed(StorageSeed)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(spec)
    }

    // Any other JSON: skipped, and the spec is Failed with the reason.
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<LeanSpec, E> {
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<LeanSpec, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LeanSpec::Malformed("spec is not an object".into()))
    }
}

struct StorageSeed;

impl<'de> de::DeserializeSeed<'de> for StorageSeed {
    type Value = LeanSpec;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<LeanSpec, D::Error> {
        d.deserialize_any(StorageVisitor)
    }
}

struct StorageVisitor;

impl StorageVisitor {
    fn not_an_object() -> LeanSpec {
        LeanSpec::Malformed("spec.storage is not an object".into())
    }
}

impl<'de> Visitor<'de> for StorageVisitor {
    type Value = LeanSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("spec.storage")
    }

    fn visit_unit<E: de::Error>(self) -> Result<LeanSpec, E> {
        Ok(LeanSpec::NoStorage)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LeanSpec, A::Error> {
        let mut fields = serde_json::Map::new();
        let mut bytes = 0;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if KEPT_STORAGE_FIELDS.contains(&key.as_ref()) {
                let value: serde_json::Value = map.next_value()?;
                bytes += key.len() + json_bytes(&value);
                fields.insert(key.into_owned(), value);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(LeanSpec::Storage { fields, bytes })
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<LeanSpec, E> {
        Ok(StorageVisitor::not_an_object())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<LeanSpec, E> {
        Ok(StorageVisitor::not_an_object())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<LeanSpec, E> {
        Ok(StorageVisitor::not_an_object())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<LeanSpec, E> {
        Ok(StorageVisitor::not_an_object())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<LeanSpec, E> {
        Ok(StorageVisitor::not_an_object())
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<LeanSpec, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(StorageVisitor::not_an_object())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Obj {
        #[serde(default, deserialize_with = "LeanSpec::lenient")]
        spec: LeanSpec,
    }

    fn spec(json: &str) -> LeanSpec {
        serde_json::from_str::<Obj>(json).expect("never a decode error").spec
    }

    #[test]
    fn only_the_kept_storage_fields_are_decoded() {
        let blob = "x".repeat(100_000);
        let s = spec(&format!(
            r#"{{"spec":{{"modelFormat":{{"name":"safetensors"}},"storage":{{"storageUri":"hf://o/r","key":"k","parameters":{{"blob":"{blob}"}},"nodeSelector":{{"a":"b"}}}}}}}}"#
        ));
        let LeanSpec::Storage { fields, bytes } = &s else { panic!("{s:?}") };
        assert_eq!(fields.keys().collect::<Vec<_>>(), ["nodeSelector", "storageUri"]);
        assert!(*bytes < 100, "the parameters were skipped, not measured: {bytes}");
        let api = s.into_api(64 * 1024).unwrap();
        assert_eq!(api.storage.unwrap().storage_uri.as_deref(), Some("hf://o/r"));
    }

    #[test]
    fn wrong_shapes_are_reasons_never_decode_errors() {
        assert_eq!(spec(r#"{}"#), LeanSpec::Missing);
        assert_eq!(spec(r#"{"spec":null}"#), LeanSpec::Missing);
        assert_eq!(spec(r#"{"spec":{}}"#), LeanSpec::NoStorage);
        assert!(matches!(spec(r#"{"spec":[1,2]}"#), LeanSpec::Malformed(_)));
        assert!(spec(r#"{"spec":{"storage":"hf://x"}}"#).into_api(1024).unwrap_err().contains("not an object"));
        let wrong_type = spec(r#"{"spec":{"storage":{"storageUri":7}}}"#).into_api(1024).unwrap_err();
        assert!(wrong_type.contains("spec is malformed"), "{wrong_type}");
        let affinity = spec(r#"{"spec":{"storage":{"storageUri":"hf://o/r","nodeAffinity":"x"}}}"#);
        assert!(affinity.into_api(1024).unwrap_err().contains("spec is malformed"));
    }

    #[test]
    fn kept_fields_over_the_limit_are_not_kept() {
        let many: Vec<String> = (0..5_000).map(|i| format!(r#""label-{i}":"value""#)).collect();
        let s = spec(&format!(
            r#"{{"spec":{{"storage":{{"storageUri":"hf://o/r","nodeSelector":{{{}}}}}}}}}"#,
            many.join(",")
        ));
        let reason = s.into_api(64 * 1024).unwrap_err();
        assert!(reason.contains("over the limit of 65536 bytes"), "{reason}");
    }
}
