//! TensorRT-LLM engines are built per GPU: an object store holds one tree per GPU shape
//! (`.../H100/...`, `.../A100-80G/...`), and a node fetches only its own. OME's rule: a model with
//! `spec.modelFormat.name: tensorrtllm` and `spec.additionalMetadata.type` `Serving` (or unset)
//! keeps only the objects whose name contains `/<alias>/`, where the alias is the node's
//! instance type (`node.kubernetes.io/instance-type`, else `beta.kubernetes.io/instance-type`)
//! through a map: `INSTANCE_TYPE_MAP` (JSON; invalid JSON stops the start, as upstream), else
//! the built-in one below (OME's table). An unknown type is its own alias.

use std::collections::BTreeMap;

use crate::hf::RemoteFile;

/// OME's built-in map of instance types to GPU short names.
const BUILT_IN: [(&str, &str); 19] = [
    ("BM.GPU.A10.4", "A10"),
    ("BM.GPU.A100-v2.8", "A100-80G"),
    ("BM.GPU4.8", "A100-40G"),
    ("BM.GPU.B4.8", "A100-40G"),
    ("BM.GPU.H100.8", "H100"),
    ("BM.GPU.H100-NC.8", "H100"),
    ("BM.GPU.H200.8", "H200"),
    ("BM.GPU.H200-NC.8", "H200"),
    ("BM.GPU.B200.8", "B200"),
    ("p5.48xlarge", "H100"),
    ("Standard_ND96isr_H100_v5", "H100"),
    ("a3-highgpu-8g", "H100"),
    ("gd-8xh100ib-i128", "H100"),
    ("gd-8xh200ib-i128", "H200"),
    ("gd-8xl40-i128", "L40"),
    ("gpu-h100-sxm", "H100"),
    ("gpu-h200-sxm", "H200"),
    ("gpu-b200-sxm", "B200"),
    ("gpu-l40s", "L40S"),
];

/// Instance type → GPU short name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTypes(BTreeMap<String, String>);

impl InstanceTypes {
    /// From `INSTANCE_TYPE_MAP`'s value: unset, empty or `{}` is the built-in map; anything else
    /// must be a JSON object of strings.
    pub fn from_env(value: Option<&str>) -> Result<InstanceTypes, String> {
        let text = value.map(str::trim).unwrap_or_default();
        if text.is_empty() {
            return Ok(InstanceTypes::built_in());
        }
        let map: BTreeMap<String, String> = serde_json::from_str(text)
            .map_err(|e| format!("INSTANCE_TYPE_MAP is not a JSON object of instance type to GPU name: {e}"))?;
        Ok(if map.is_empty() { InstanceTypes::built_in() } else { InstanceTypes(map) })
    }

    fn built_in() -> InstanceTypes {
        InstanceTypes(BUILT_IN.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    /// The node's shape alias from its labels; `None` without an instance-type label.
    pub fn alias(&self, labels: &BTreeMap<String, String>) -> Option<String> {
        let instance_type = ["node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"]
            .iter()
            .find_map(|k| labels.get(*k))
            .filter(|v| !v.is_empty())?;
        Some(self.0.get(instance_type).cloned().unwrap_or_else(|| instance_type.clone()))
    }
}

/// Does OME's filter apply to this model (`modelFormat.name`, `additionalMetadata.type`)?
pub fn applies(model_format: Option<&str>, metadata_type: Option<&str>) -> bool {
    model_format == Some("tensorrtllm") && metadata_type.is_none_or(|t| t.is_empty() || t == "Serving")
}

/// The files whose full object key (`key_of`) contains `/<alias>/`; none left is the reason.
pub fn keep_shape(
    files: Vec<RemoteFile>,
    alias: Option<&str>,
    key_of: impl Fn(&str) -> String,
) -> Result<Vec<RemoteFile>, String> {
    let Some(alias) = alias.filter(|a| !a.is_empty()) else {
        return Err("a TensorRT-LLM model needs the node's shape: this Node has no instance-type label".into());
    };
    let needle = format!("/{alias}/");
    let kept: Vec<RemoteFile> =
        files.into_iter().filter(|f| format!("/{}", key_of(&f.path)).contains(&needle)).collect();
    if kept.is_empty() {
        return Err(format!("no objects for shape {alias}"));
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::FileHash;

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_alias_comes_from_the_instance_type_through_the_map() {
        let map = InstanceTypes::from_env(None).unwrap();
        assert_eq!(
            map.alias(&labels(&[("node.kubernetes.io/instance-type", "BM.GPU.H100.8")])).as_deref(),
            Some("H100")
        );
        assert_eq!(map.alias(&labels(&[("beta.kubernetes.io/instance-type", "p5.48xlarge")])).as_deref(), Some("H100"));
        assert_eq!(map.alias(&labels(&[("node.kubernetes.io/instance-type", "odd")])).as_deref(), Some("odd"));
        assert_eq!(map.alias(&labels(&[])), None);
        let custom = InstanceTypes::from_env(Some(r#"{"odd":"X1"}"#)).unwrap();
        assert_eq!(custom.alias(&labels(&[("node.kubernetes.io/instance-type", "odd")])).as_deref(), Some("X1"));
        assert_eq!(InstanceTypes::from_env(Some(" {} ")).unwrap(), map, "an empty map is the built-in one");
        assert!(InstanceTypes::from_env(Some("{nope")).unwrap_err().contains("INSTANCE_TYPE_MAP"));
    }

    #[test]
    fn only_serving_tensorrt_llm_models_are_filtered() {
        assert!(applies(Some("tensorrtllm"), None));
        assert!(applies(Some("tensorrtllm"), Some("Serving")));
        assert!(!applies(Some("tensorrtllm"), Some("Building")));
        assert!(!applies(Some("safetensors"), None));
        assert!(!applies(None, None));
    }

    #[test]
    fn only_the_node_s_shape_is_kept_by_its_full_object_name() {
        let file = |p: &str| RemoteFile { path: p.into(), size_bytes: 1, hash: FileHash::SizeOnly, etag: None };
        let files = vec![file("H100/rank0.engine"), file("A100-80G/rank0.engine"), file("config.json")];
        let key_of = |p: &str| format!("models/llama-trt/{p}");
        let kept = keep_shape(files.clone(), Some("H100"), key_of).unwrap();
        assert_eq!(kept, vec![file("H100/rank0.engine")]);
        assert_eq!(keep_shape(files.clone(), Some("B200"), key_of).unwrap_err(), "no objects for shape B200");
        assert!(keep_shape(files, None, key_of).unwrap_err().contains("instance-type"));
    }
}
