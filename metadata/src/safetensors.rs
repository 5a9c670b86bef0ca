//! safetensors headers (8-byte little-endian length, then JSON), counted exactly and
//! quant-aware. Tensor data is never read.

use serde_json::{Map, Value};

use crate::limits::{SAFETENSORS_FILES_MAX_COUNT, SAFETENSORS_HEADER_MAX_BYTES, SAFETENSORS_INDEX_MAX_BYTES};
use crate::limits::{SAFETENSORS_PREFIX_BYTES, TOTAL_READ_MAX_BYTES};
use crate::tree::{Budgeted, EntryKind, join};

/// How a quantised checkpoint packs several logical weights into one stored element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Packing {
    /// Unquantised, or 8-bit: one element is one parameter, and nothing is skipped.
    #[default]
    None,
    /// 8-bit float with scale tensors (DeepSeek/Kimi FP8): elements count once, scales are skipped.
    ScalesOnly,
    /// 4-bit integers (AWQ, GPTQ, compressed-tensors pack-quantized): I32 ×8, I16 ×4, U8 ×2.
    Int4,
    /// 4-bit floats (MXFP4, NVFP4): U8/I8 ×2.
    Fp4,
}

/// The header length from the 8-byte prefix; over the cap it is refused before anything else
/// is read.
pub fn header_len_bytes(prefix: &[u8]) -> Result<u64, String> {
    let bytes: [u8; 8] = prefix.try_into().map_err(|_| format!("{} bytes, not an 8-byte length", prefix.len()))?;
    let len = u64::from_le_bytes(bytes);
    if len > SAFETENSORS_HEADER_MAX_BYTES {
        return Err(format!("header of {len} bytes is over the {SAFETENSORS_HEADER_MAX_BYTES}-byte cap; not read"));
    }
    Ok(len)
}

/// Parameters in one header. `__metadata__` and scalars are skipped as upstream does; a zero or
/// negative dimension, or an overflow, is an error (upstream then falls back to the estimate).
pub fn count_header_params(header: &[u8], packing: Packing) -> Result<i64, String> {
    let map: Map<String, Value> = serde_json::from_slice(header).map_err(|e| format!("header is not JSON: {e}"))?;
    let mut total: i64 = 0;
    for (name, tensor) in &map {
        if name == "__metadata__" || (packing != Packing::None && is_quant_auxiliary(name)) {
            continue;
        }
        let count = tensor_params(name, tensor)?;
        let count = count.checked_mul(packing_factor(packing, tensor)).ok_or("parameter count overflows")?;
        total = total.checked_add(count).ok_or("parameter count overflows")?;
    }
    Ok(total)
}

fn tensor_params(name: &str, tensor: &Value) -> Result<i64, String> {
    let shape = tensor.get("shape").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
    let mut count: i64 = 1;
    for (i, dim) in shape.iter().enumerate() {
        let dim = dim.as_i64().filter(|d| *d > 0).ok_or(format!("tensor {name:?} has invalid dimension {i}"))?;
        count = count.checked_mul(dim).ok_or(format!("tensor {name:?} overflows"))?;
    }
    // A scalar (empty shape) is metadata, not a weight.
    Ok(if shape.is_empty() { 0 } else { count })
}

fn packing_factor(packing: Packing, tensor: &Value) -> i64 {
    let dtype = tensor.get("dtype").and_then(Value::as_str).unwrap_or("");
    match (packing, dtype) {
        (Packing::Int4, "I32") => 8,
        (Packing::Int4, "I16") => 4,
        (Packing::Int4, "U8") => 2,
        (Packing::Fp4, "U8" | "I8") => 2,
        _ => 1,
    }
}

/// Scales, zero points and shape records of quantised checkpoints: not parameters.
fn is_quant_auxiliary(name: &str) -> bool {
    const SUFFIXES: [&str; 10] = [
        "_scale",
        "_scale_inv",
        "_scale_2",
        "_scales",
        ".scales",
        "qzeros",
        "_zero_point",
        ".g_idx",
        "weight_shape",
        ".input_scale",
    ];
    SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The shard names in `model.safetensors.index.json`'s weight map, sorted and unique.
pub fn index_shards(index: &[u8]) -> Result<Vec<String>, String> {
    let map = crate::json::parse_object(index)?;
    let weights = map.get("weight_map").and_then(Value::as_object).ok_or("index has no weight_map")?;
    let mut shards: Vec<String> = Vec::new();
    for shard in weights.values() {
        let shard = shard.as_str().filter(|s| !s.is_empty()).ok_or("index names an empty shard")?;
        if shard.contains('/') || shard == ".." {
            return Err(format!("index names a shard outside its directory: {shard:?}"));
        }
        shards.push(shard.to_string());
    }
    shards.sort();
    shards.dedup();
    if shards.is_empty() {
        return Err("index has no weight mappings".into());
    }
    Ok(shards)
}

/// Exact parameter count of the safetensors beside a config file in `dir`: the index's shards
/// when `model.safetensors.index.json` is there, else every `*.safetensors` file.
pub fn count_dir_params(tree: &mut Budgeted, dir: &str, packing: Packing) -> Result<i64, String> {
    let entries = tree.list_dir(dir).map_err(|e| format!("{dir:?}: {e}"))?;
    let is_file = |name: &str| entries.iter().any(|e| e.name == name && e.kind == EntryKind::File);
    let shards = if is_file("model.safetensors.index.json") {
        let index_path = join(dir, "model.safetensors.index.json");
        let bytes =
            tree.read_file(&index_path, SAFETENSORS_INDEX_MAX_BYTES).map_err(|e| format!("{index_path}: {e}"))?;
        index_shards(&bytes).map_err(|e| format!("{index_path}: {e}"))?
    } else {
        let names = entries.iter().filter(|e| e.kind == EntryKind::File && e.name.ends_with(".safetensors"));
        names.map(|e| e.name.clone()).collect()
    };
    if shards.is_empty() {
        return Err(format!("no .safetensors files in {dir:?}"));
    }
    if shards.len() > SAFETENSORS_FILES_MAX_COUNT {
        return Err(format!("{} safetensors files, over {SAFETENSORS_FILES_MAX_COUNT}", shards.len()));
    }
    let mut total: i64 = 0;
    for shard in shards {
        let count = count_file_params(tree, &join(dir, &shard), packing)?;
        total = total.checked_add(count).ok_or("parameter count overflows")?;
    }
    Ok(total)
}

fn count_file_params(tree: &mut Budgeted, path: &str, packing: Packing) -> Result<i64, String> {
    let prefix = tree.read_range(path, 0, SAFETENSORS_PREFIX_BYTES).map_err(|e| format!("{path}: {e}"))?;
    let len = header_len_bytes(&prefix).map_err(|e| format!("{path}: {e}"))?;
    debug_assert!(len <= TOTAL_READ_MAX_BYTES);
    let header = tree.read_range(path, SAFETENSORS_PREFIX_BYTES, len).map_err(|e| format!("{path}: {e}"))?;
    if header.len() as u64 != len {
        return Err(format!("{path}: header truncated ({} of {len} bytes)", header.len()));
    }
    count_header_params(&header, packing).map_err(|e| format!("{path}: {e}"))
}

/// Which packing a config's `quantization_config` declares.
pub fn packing_of(config: &Map<String, Value>) -> Packing {
    let Some(q) = config.get("quantization_config").and_then(Value::as_object) else {
        return Packing::None;
    };
    let text = |k: &str| q.get(k).and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
    let (method, algo, format) = (text("quant_method"), text("quant_algo"), text("format"));
    if method.contains("fp4") || algo.contains("fp4") || format.contains("fp4") {
        return Packing::Fp4;
    }
    let bits = q.get("bits").or_else(|| q.get("w_bit")).and_then(Value::as_u64);
    let bnb_4bit = q.get("load_in_4bit").and_then(Value::as_bool) == Some(true);
    if method.contains("int4") || bits == Some(4) || bnb_4bit || format == "pack-quantized" || declares_4bit_groups(q) {
        return Packing::Int4;
    }
    Packing::ScalesOnly
}

/// compressed-tensors: `config_groups.*.weights.num_bits == 4`.
fn declares_4bit_groups(q: &Map<String, Value>) -> bool {
    let Some(groups) = q.get("config_groups").and_then(Value::as_object) else { return false };
    groups.values().any(|g| g.pointer("/weights/num_bits").and_then(Value::as_u64) == Some(4))
}
