//! Per-architecture loaders as data: what upstream's registered loader for each `model_type`
//! answers for vision, embedding and quantisation, and its fallback when safetensors cannot be
//! counted. Unknown types get upstream's `GenericModelConfig` behaviour.

/// How a loader decides `IsEmbedding`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Embedding {
    Never,
    Always,
    /// True when this key is present (Qwen3 embedding checkpoints carry `similarity_fn_name`).
    IfKey(&'static str),
}

/// How a loader estimates parameters without safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Upstream's generic estimate (dense, or MoE when experts are declared).
    Estimate,
    /// A published size (upstream's DeepSeek V3 loader answers 685B).
    Fixed(i64),
}

#[derive(Clone, Copy, Debug)]
pub struct Profile {
    pub vision: bool,
    pub embedding: Embedding,
    /// Some upstream loaders (mistral, bert, phi3, gemma3) always report no quantisation.
    pub reads_quantization: bool,
    /// (hidden_size, num_hidden_layers, parameters) that upstream's loaders hard-code.
    pub known_sizes: &'static [(u64, u64, i64)],
    pub fallback: Fallback,
}

const TEXT: Profile = Profile {
    vision: false,
    embedding: Embedding::Never,
    reads_quantization: true,
    known_sizes: &[],
    fallback: Fallback::Estimate,
};
const VISION: Profile = Profile { vision: true, ..TEXT };

/// The loader registered for a `model_type`, or `None` for the generic fallback.
pub fn profile(model_type: &str) -> Option<Profile> {
    let p = match model_type {
        "llama" => Profile { known_sizes: LLAMA_SIZES, ..TEXT },
        // Baseline's mistral loader answered IsEmbedding = true for every mistral model; later
        // upstream keeps EMBEDDING for MistralModel (e5-mistral) only, by the architecture rule.
        "mistral" => Profile { reads_quantization: false, known_sizes: &[(4096, 32, 7_000_000_000)], ..TEXT },
        "bert" => Profile { embedding: Embedding::Always, reads_quantization: false, known_sizes: BERT_SIZES, ..TEXT },
        "phi3" => Profile { reads_quantization: false, known_sizes: &[(3072, 32, 3_800_000_000)], ..TEXT },
        "gemma" | "gemma2" | "gemma3_text" => Profile { reads_quantization: false, ..TEXT },
        "gemma3" => Profile { reads_quantization: false, known_sizes: &[(5376, 62, 32_000_000_000)], ..VISION },
        "qwen3" => Profile { embedding: Embedding::IfKey("similarity_fn_name"), known_sizes: QWEN3_SIZES, ..TEXT },
        "qwen2_vl" | "qwen2_5_vl" => Profile { known_sizes: QWEN2_VL_SIZES, ..VISION },
        "qwen3_vl" | "qwen3_vl_moe" | "qwen3_5" | "qwen3_5_moe" => VISION,
        "llava" | "mllama" | "phi3_v" | "deepseek_vl_v2" | "janus" | "multi_modality" | "llama4" => VISION,
        "deepseek_v3" => Profile { fallback: Fallback::Fixed(685_000_000_000), ..TEXT },
        "gpt_oss" => Profile { known_sizes: &[(2880, 24, 20_000_000_000), (2880, 36, 120_000_000_000)], ..TEXT },
        "qwen2" | "qwen3_moe" | "mixtral" | "kimi_k2" | "phi" | "phimoe" | "phi3small" | "qwen" | "baichuan"
        | "chatglm" | "cohere" | "command-r" | "dbrx" | "exaone" | "internlm" | "internlm2" | "minicpm"
        | "minicpm3" | "stablelm" | "xverse" => TEXT,
        _ => return None,
    };
    Some(p)
}

const LLAMA_SIZES: &[(u64, u64, i64)] = &[
    (8192, 80, 70_000_000_000),
    (8192, 82, 70_000_000_000),
    (16384, 126, 405_000_000_000),
    (3072, 28, 3_000_000_000),
    (2048, 16, 1_000_000_000),
];
const BERT_SIZES: &[(u64, u64, i64)] = &[(768, 12, 110_000_000), (1024, 24, 340_000_000)];
const QWEN3_SIZES: &[(u64, u64, i64)] = &[(2560, 36, 4_000_000_000), (4096, 36, 8_000_000_000)];
const QWEN2_VL_SIZES: &[(u64, u64, i64)] =
    &[(1536, 28, 2_000_000_000), (3584, 28, 7_000_000_000), (8192, 80, 72_000_000_000)];

/// The architecture numbers the estimate needs, filled from nested configs when zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub hidden_size: u64,
    pub num_hidden_layers: u64,
    pub intermediate_size: u64,
    pub vocab_size: u64,
    pub routed_experts: u64,
    pub shared_experts: u64,
    pub moe_intermediate_size: u64,
}

/// Upstream's generic estimate: embeddings plus ~12·h² per layer, or its MoE variant.
pub fn estimate_params(s: &Shape) -> i64 {
    if s.hidden_size == 0 || s.num_hidden_layers == 0 {
        return 0;
    }
    let (h, layers, vocab) = (s.hidden_size as i128, s.num_hidden_layers as i128, s.vocab_size as i128);
    let total = if s.routed_experts > 0 {
        let ffn = s.intermediate_size as i128;
        let moe_ffn = if s.moe_intermediate_size > 0 { s.moe_intermediate_size as i128 } else { ffn };
        let (routed, shared) = (s.routed_experts as i128, s.shared_experts as i128);
        let per_layer = 4 * h * h + shared * 2 * h * ffn + routed * 2 * h * moe_ffn + h * routed + 2 * h;
        h * vocab + layers * per_layer
    } else {
        vocab * h + layers * 12 * h * h
    };
    total.clamp(0, i64::MAX as i128) as i64
}

/// Parameters without safetensors: a hard-coded size, else the profile's fallback.
pub fn fallback_params(profile: Option<&Profile>, shape: &Shape) -> i64 {
    let Some(p) = profile else { return estimate_params(shape) };
    let known = p.known_sizes.iter().find(|(h, l, _)| *h == shape.hidden_size && *l == shape.num_hidden_layers);
    match (known, p.fallback) {
        (Some((_, _, n)), _) => *n,
        (None, Fallback::Fixed(n)) => n,
        (None, Fallback::Estimate) => estimate_params(shape),
    }
}
