//! What is published: OME's `ModelConfig` (the `config` of a ConfigMap `ModelEntry`), with
//! upstream's Go field order, names and `omitempty`, so `json::to_go_json` is byte-identical.

use std::collections::BTreeMap;

use serde::Serialize;

/// `{"name", "version"}`: a Go map, so keys come out sorted (name < version).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NameVersion {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The 9-key summary. Upstream decodes it into a Go map, so keys are in sorted order here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecodedModelConfiguration {
    pub architecture: String,
    pub context_length: i64,
    pub has_vision: bool,
    pub is_embedding: bool,
    pub model_size_bytes: i64,
    pub model_type: String,
    pub parameter_count: String,
    pub torch_dtype: String,
    pub transformers_version: String,
}

/// The same summary as upstream's struct marshals it into `spec.modelConfiguration`
/// (declaration order, not sorted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SpecModelConfiguration {
    pub model_type: String,
    pub architecture: String,
    pub context_length: i64,
    pub parameter_count: String,
    pub has_vision: bool,
    pub is_embedding: bool,
    pub transformers_version: String,
    pub torch_dtype: String,
    pub model_size_bytes: i64,
}

impl From<&DecodedModelConfiguration> for SpecModelConfiguration {
    fn from(d: &DecodedModelConfiguration) -> Self {
        SpecModelConfiguration {
            model_type: d.model_type.clone(),
            architecture: d.architecture.clone(),
            context_length: d.context_length,
            parameter_count: d.parameter_count.clone(),
            has_vision: d.has_vision,
            is_embedding: d.is_embedding,
            transformers_version: d.transformers_version.clone(),
            torch_dtype: d.torch_dtype.clone(),
            model_size_bytes: d.model_size_bytes,
        }
    }
}

/// OME's `Artifact`: no omitempty, nil map/slice is `null`. The agent fills it for shared
/// Hugging Face artifacts; the parser always leaves it empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub sha: String,
    pub parent_path: Option<BTreeMap<String, String>>,
    pub children_paths: Option<Vec<String>>,
}

/// OME's `ModelConfig`, field for field in Go's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfig {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model_type: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model_architecture: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_framework: Option<NameVersion>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_format: Option<NameVersion>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model_parameter_size: String,
    #[serde(skip_serializing_if = "is_zero")]
    pub max_tokens: i32,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub model_capabilities: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub api_capabilities: Vec<String>,
    pub decoded_model_configuration: DecodedModelConfiguration,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub quantization: String,
    /// A Go struct: `omitempty` has no effect, so it is always present.
    pub artifact: Artifact,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

/// One diffusers component: `[library, type]` in model_index.json.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Component {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub library: String,
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
}

/// OME's `DiffusionPipelineSpec` as the CRD spells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffusionPipeline {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<Component>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_encoder: Option<Component>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<Component>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transformer: Option<Component>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vae: Option<Component>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_components: BTreeMap<String, Component>,
}

/// Everything the parser learnt about one model directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub config: ModelConfig,
    pub diffusion_pipeline: Option<DiffusionPipeline>,
    /// Where the config was found, relative to the model directory.
    pub config_path: String,
    /// How the parameter count was obtained ("safetensors", or why the estimate was used).
    pub parameter_source: String,
}
