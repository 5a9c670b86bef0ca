//! From config bytes (and the safetensors beside them) to `Metadata`.

use serde_json::{Map, Value};

use crate::arch::{self, Embedding, Profile, Shape};
use crate::capabilities::{Facts, capabilities};
use crate::format::{estimate_model_size_bytes, format_param_count};
use crate::json::{object_field, str_field, uint_field};
use crate::output::{Artifact, DecodedModelConfiguration, Metadata, ModelConfig, NameVersion};
use crate::safetensors::{count_dir_params, packing_of};
use crate::tree::{Budgeted, parent};

/// Where multimodal configs keep their language model, in upstream's probing order.
pub const NESTED_CONFIG_KEYS: [&str; 3] = ["text_config", "llm_config", "language_config"];
/// Context-length keys, first non-zero wins.
pub const CONTEXT_LENGTH_KEYS: [&str; 5] =
    ["max_position_embeddings", "max_sequence_length", "max_seq_len", "seq_length", "model_max_length"];

/// The fields of a transformers config.json that metadata is made of.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConfigFacts {
    pub model_type: String,
    pub architecture: String,
    pub torch_dtype: String,
    pub transformers_version: String,
    pub quant_method: String,
    pub shape: Shape,
    pub context_length: u64,
    pub has_vision_config: bool,
}

/// The first nested language-model config present, as upstream probes.
fn nested_config(obj: &Map<String, Value>) -> Option<&Map<String, Value>> {
    NESTED_CONFIG_KEYS.iter().find_map(|k| object_field(obj, k))
}

/// maxTokens: the first non-zero context-length key at the top level, else in the nested
/// configs. (The baseline never set maxTokens; its loaders mostly read one key.)
pub fn context_length(obj: &Map<String, Value>) -> u64 {
    let first = |o: &Map<String, Value>| CONTEXT_LENGTH_KEYS.iter().find_map(|k| uint_field(o, k));
    first(obj).or_else(|| NESTED_CONFIG_KEYS.iter().filter_map(|k| object_field(obj, k)).find_map(first)).unwrap_or(0)
}

pub fn config_facts(obj: &Map<String, Value>) -> ConfigFacts {
    let nested = nested_config(obj);
    let text = |k: &str| str_field(obj, k).or_else(|| nested.and_then(|n| str_field(n, k))).unwrap_or("").to_string();
    let num = |k: &str| uint_field(obj, k).or_else(|| nested.and_then(|n| uint_field(n, k))).unwrap_or(0);
    let experts = ["n_routed_experts", "num_local_experts", "num_experts"].iter().map(|k| num(k)).find(|n| *n > 0);
    let architecture = obj.get("architectures").and_then(Value::as_array).and_then(|a| a.first());
    let quant = object_field(obj, "quantization_config").and_then(|q| str_field(q, "quant_method"));
    ConfigFacts {
        model_type: str_field(obj, "model_type").unwrap_or("").to_string(),
        architecture: architecture.and_then(Value::as_str).unwrap_or("").to_string(),
        torch_dtype: text("torch_dtype"),
        transformers_version: text("transformers_version"),
        quant_method: quant.unwrap_or("").to_string(),
        shape: Shape {
            hidden_size: num("hidden_size"),
            num_hidden_layers: num("num_hidden_layers"),
            intermediate_size: num("intermediate_size"),
            vocab_size: num("vocab_size"),
            routed_experts: experts.unwrap_or(0),
            shared_experts: num("n_shared_experts"),
            moe_intermediate_size: num("moe_intermediate_size"),
        },
        context_length: context_length(obj),
        has_vision_config: obj.contains_key("vision_config"),
    }
}

/// Upstream maps the quant method onto the two values its CRD then knew.
pub fn quantization(quant_method: &str) -> &'static str {
    let m = quant_method.to_lowercase();
    if m.contains("int4") {
        "int4"
    } else if m.contains("fp8") {
        "fp8"
    } else {
        ""
    }
}

fn is_embedding(profile: Option<&Profile>, obj: &Map<String, Value>) -> bool {
    match profile.map(|p| p.embedding) {
        Some(Embedding::Always) => true,
        Some(Embedding::IfKey(k)) => obj.contains_key(k),
        Some(Embedding::Never) | None => false,
    }
}

/// Metadata of a transformers model whose config.json is at `config_path`.
pub fn transformers_metadata(tree: &mut Budgeted, config_path: &str, obj: &Map<String, Value>) -> Metadata {
    let facts = config_facts(obj);
    let profile = arch::profile(&facts.model_type);
    let (params, parameter_source) = match count_dir_params(tree, parent(config_path), packing_of(obj)) {
        Ok(n) => (n, "safetensors".to_string()),
        Err(e) => (arch::fallback_params(profile.as_ref(), &facts.shape), format!("estimated: {e}")),
    };
    let has_vision = profile.map(|p| p.vision).unwrap_or(facts.has_vision_config);
    let embedding = is_embedding(profile.as_ref(), obj);
    let reads_quant = profile.is_none_or(|p| p.reads_quantization);
    let quant = if reads_quant { quantization(&facts.quant_method) } else { "" };
    let caps = capabilities(&Facts {
        architecture: &facts.architecture,
        model_type: &facts.model_type,
        diffusion_pipeline: None,
        has_vision,
        is_embedding: embedding,
    });
    let framework_version = Some(facts.transformers_version.clone()).filter(|v| !v.is_empty());
    let decoded = DecodedModelConfiguration {
        architecture: facts.architecture.clone(),
        context_length: facts.context_length as i64,
        has_vision,
        is_embedding: embedding,
        model_size_bytes: if params > 0 { estimate_model_size_bytes(params, &facts.torch_dtype) } else { 0 },
        model_type: facts.model_type.clone(),
        parameter_count: format_param_count(params),
        torch_dtype: facts.torch_dtype.clone(),
        transformers_version: facts.transformers_version.clone(),
    };
    let config = ModelConfig {
        model_type: facts.model_type,
        model_architecture: facts.architecture,
        model_framework: Some(NameVersion { name: "transformers".into(), version: framework_version }),
        model_format: Some(NameVersion { name: "safetensors".into(), version: Some("1.0.0".into()) }),
        model_parameter_size: format_param_count(params),
        max_tokens: facts.context_length.min(i32::MAX as u64) as i32,
        model_capabilities: caps.into_iter().map(String::from).collect(),
        api_capabilities: vec![],
        decoded_model_configuration: decoded,
        quantization: quant.to_string(),
        artifact: Artifact::default(),
    };
    Metadata { config, diffusion_pipeline: None, config_path: config_path.to_string(), parameter_source }
}
