//! Upstream's `FormatParamCount`, float for float.

/// 7,615,616,512 → "7.62B"; 7.62e9 → "7.6B" (upstream prints one decimal when value×100 is
/// integral); below 1000 the plain integer.
pub fn format_param_count(count: i64) -> String {
    const UNITS: [(i64, &str); 4] = [(1_000_000_000_000, "T"), (1_000_000_000, "B"), (1_000_000, "M"), (1_000, "K")];
    let Some((unit, suffix)) = UNITS.iter().find(|(unit, _)| count >= *unit) else {
        return count.to_string();
    };
    let value = count as f64 / *unit as f64;
    if value == (value as i64) as f64 {
        return format!("{}{suffix}", value as i64);
    }
    let hundredths = value * 100.0;
    if hundredths == (hundredths as i64) as f64 {
        return format!("{value:.1}{suffix}");
    }
    format!("{value:.2}{suffix}")
}

/// Upstream's `EstimateModelSizeBytes`: bytes per parameter by torch dtype, float32 when unknown.
pub fn estimate_model_size_bytes(param_count: i64, torch_dtype: &str) -> i64 {
    let per_param = match torch_dtype.to_ascii_lowercase().as_str() {
        "float32" | "float" => 4.0,
        "bfloat16" | "bf16" | "float16" | "fp16" | "half" => 2.0,
        "int8" | "fp8" | "float8" | "e4m3" => 1.0,
        "int4" | "4bit" => 0.5,
        _ => 4.0,
    };
    (param_count as f64 * per_param) as i64
}
