//! diffusers pipelines: model_index.json and the components beside it.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::capabilities::{Facts, capabilities};
use crate::format::{estimate_model_size_bytes, format_param_count};
use crate::json::{parse_object, str_field};
use crate::limits::CONFIG_JSON_MAX_BYTES;
use crate::output::NameVersion;
use crate::output::{Artifact, Component, DecodedModelConfiguration, DiffusionPipeline, Metadata, ModelConfig};
use crate::parse::context_length;
use crate::safetensors::{Packing, count_dir_params};
use crate::tree::{Budgeted, EntryKind, join, parent};

fn first_str(obj: &Map<String, Value>, keys: &[&str]) -> String {
    keys.iter().find_map(|k| str_field(obj, k)).unwrap_or("").to_string()
}

/// `["diffusers", "AutoencoderKL"]`, `["X"]` or `{"_class_name", "_library"}`.
fn component(value: &Value) -> Option<Component> {
    if let Some(parts) = value.as_array() {
        let parts: Option<Vec<&str>> = parts.iter().map(Value::as_str).collect();
        return match parts?.as_slice() {
            [] => None,
            [kind] => Some(Component { library: String::new(), kind: kind.to_string() }),
            [library, kind, ..] => Some(Component { library: library.to_string(), kind: kind.to_string() }),
        };
    }
    let obj = value.as_object()?;
    let kind = first_str(obj, &["_class_name", "class_name", "className", "type"]);
    let library = first_str(obj, &["_library", "library"]);
    (!kind.is_empty() || !library.is_empty()).then_some(Component { library, kind })
}

/// The pipeline and its diffusers version; an index with nothing of a pipeline is an error.
pub fn parse_pipeline(obj: &Map<String, Value>) -> Result<(DiffusionPipeline, String), String> {
    let class_name = first_str(obj, &["_class_name", "class_name", "className"]);
    let version = first_str(obj, &["_diffusers_version", "diffusers_version"]);
    let mut p = DiffusionPipeline { class_name: Some(class_name).filter(|c| !c.is_empty()), ..Default::default() };
    let mut additional = BTreeMap::new();
    for (key, value) in obj.iter().filter(|(k, _)| !k.starts_with('_')) {
        let Some(c) = component(value) else { continue };
        match key.to_lowercase().as_str() {
            "scheduler" => p.scheduler = Some(c),
            "text_encoder" => p.text_encoder = Some(c),
            "tokenizer" => p.tokenizer = Some(c),
            "transformer" | "unet" => p.transformer = Some(c),
            "vae" => p.vae = Some(c),
            _ => {
                additional.insert(key.clone(), c);
            }
        }
    }
    p.additional_components = additional;
    if p == DiffusionPipeline::default() {
        return Err("model_index.json has no diffusion pipeline metadata".into());
    }
    Ok((p, version))
}

fn has_file(tree: &mut Budgeted, dir: &str, name: &str) -> bool {
    tree.list_dir(dir).is_ok_and(|es| es.iter().any(|e| e.name == name && e.kind == EntryKind::File))
}

/// Upstream's sum: text_encoder, transformer (else unet) and vae are required, each other
/// component counts when it has a config.json; any failure of a required one gives 0.
fn pipeline_params(tree: &mut Budgeted, root: &str, p: &DiffusionPipeline) -> Result<i64, String> {
    let backbone = if has_file(tree, &join(root, "transformer"), "config.json") { "transformer" } else { "unet" };
    let mut total: i64 = 0;
    for name in ["text_encoder", backbone, "vae"] {
        let dir = join(root, name);
        if !has_file(tree, &dir, "config.json") {
            return Err(format!("{dir}/config.json not found"));
        }
        total = total.saturating_add(count_dir_params(tree, &dir, Packing::None)?);
    }
    for name in p.additional_components.keys() {
        let dir = join(root, name);
        if has_file(tree, &dir, "config.json")
            && let Ok(n) = count_dir_params(tree, &dir, Packing::None)
        {
            total = total.saturating_add(n);
        }
    }
    Ok(total)
}

fn text_encoder_context(tree: &mut Budgeted, root: &str) -> u64 {
    let path = join(&join(root, "text_encoder"), "config.json");
    let bytes = tree.read_file(&path, CONFIG_JSON_MAX_BYTES).ok();
    bytes.and_then(|b| parse_object(&b).ok()).map(|o| context_length(&o)).unwrap_or(0)
}

pub fn diffusion_metadata(tree: &mut Budgeted, index_path: &str, obj: &Map<String, Value>) -> Result<Metadata, String> {
    let (pipeline, version) = parse_pipeline(obj)?;
    let root = parent(index_path);
    let (params, parameter_source) = match pipeline_params(tree, root, &pipeline) {
        Ok(n) => (n, "safetensors".to_string()),
        Err(e) => (0, format!("unknown: {e}")),
    };
    let context = text_encoder_context(tree, root);
    let architecture = pipeline.class_name.clone().unwrap_or_default();
    let facts = Facts {
        architecture: &architecture,
        model_type: "diffusers",
        diffusion_pipeline: Some(true),
        has_vision: true,
        is_embedding: false,
    };
    let caps = capabilities(&facts);
    let decoded = DecodedModelConfiguration {
        architecture: architecture.clone(),
        context_length: context as i64,
        has_vision: true,
        is_embedding: false,
        model_size_bytes: if params > 0 { estimate_model_size_bytes(params, "") } else { 0 },
        model_type: "diffusers".into(),
        parameter_count: format_param_count(params),
        torch_dtype: String::new(),
        transformers_version: String::new(),
    };
    let diffusers = NameVersion { name: "diffusers".into(), version: Some(version) };
    let config = ModelConfig {
        model_type: "diffusers".into(),
        model_architecture: architecture,
        model_framework: Some(diffusers.clone()),
        model_format: Some(diffusers),
        model_parameter_size: format_param_count(params),
        max_tokens: context.min(i32::MAX as u64) as i32,
        model_capabilities: caps.into_iter().map(String::from).collect(),
        api_capabilities: vec![],
        decoded_model_configuration: decoded,
        quantization: String::new(),
        artifact: Artifact::default(),
    };
    Ok(Metadata { config, diffusion_pipeline: Some(pipeline), config_path: index_path.into(), parameter_source })
}
