//! The opt-in spec write-back as data: which empty spec fields the agent would fill, as a JSON
//! merge patch with a resourceVersion precondition, so of all nodes one write wins and the
//! others' patches conflict and find the fields filled.

use serde_json::{Map, Value, json};

use crate::output::{Metadata, SpecModelConfiguration};

fn is_empty(spec: &Map<String, Value>, key: &str) -> bool {
    match spec.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

/// The spec fields to fill: only empty ones, only with non-empty values. Unlike the baseline,
/// `modelConfiguration` is filled only when empty too (the baseline overwrote it on every
/// node, every time); `maxTokens` is left to the controller, which fills it from the entry.
pub fn spec_fill(spec: &Map<String, Value>, meta: &Metadata) -> Map<String, Value> {
    let c = &meta.config;
    let mut fill = Map::new();
    let mut put = |key: &str, value: Value, has_value: bool| {
        if has_value && is_empty(spec, key) {
            fill.insert(key.to_string(), value);
        }
    };
    put("modelType", json!(c.model_type), !c.model_type.is_empty());
    put("modelArchitecture", json!(c.model_architecture), !c.model_architecture.is_empty());
    put("modelFramework", json!(c.model_framework), c.model_framework.is_some());
    let format_named =
        spec.get("modelFormat").and_then(|f| f.get("name")).and_then(Value::as_str).is_some_and(|n| !n.is_empty());
    if !format_named && let Some(f) = &c.model_format {
        fill.insert("modelFormat".into(), json!(f));
    }
    let mut put = |key: &str, value: Value, has_value: bool| {
        if has_value && is_empty(spec, key) {
            fill.insert(key.to_string(), value);
        }
    };
    put("modelParameterSize", json!(c.model_parameter_size), !c.model_parameter_size.is_empty());
    put("modelCapabilities", json!(c.model_capabilities), !c.model_capabilities.is_empty());
    put("quantization", json!(c.quantization), !c.quantization.is_empty());
    let summary = SpecModelConfiguration::from(&c.decoded_model_configuration);
    put("modelConfiguration", json!(summary), true);
    put("diffusionPipeline", json!(meta.diffusion_pipeline), meta.diffusion_pipeline.is_some());
    fill
}

/// The merge patch body, or `None` when nothing is empty. `resource_version` is the version the
/// spec was read at; the API server refuses the patch if the object changed since.
pub fn spec_merge_patch(spec: &Map<String, Value>, resource_version: &str, meta: &Metadata) -> Option<Value> {
    let fill = spec_fill(spec, meta);
    if fill.is_empty() {
        return None;
    }
    Some(json!({"metadata": {"resourceVersion": resource_version}, "spec": fill}))
}
