//! Every bound the parser keeps. Names end in their unit.

/// A safetensors header (the JSON after the 8-byte length) is refused above this, unread,
/// as upstream does.
pub const SAFETENSORS_HEADER_MAX_BYTES: u64 = 10 * 1024 * 1024;
/// config.json, model_index.json and a component's config.json: real ones are a few KiB.
pub const CONFIG_JSON_MAX_BYTES: u64 = 4 * 1024 * 1024;
/// model.safetensors.index.json: a trillion-parameter MoE's weight map is ~15 MB.
pub const SAFETENSORS_INDEX_MAX_BYTES: u64 = 32 * 1024 * 1024;
/// The recursive search for model_index.json / config.json goes this many directories below
/// the model root at most (upstream walks the whole tree).
pub const SEARCH_DEPTH_MAX_DIRS: usize = 4;
/// Directories listed by one parse at most (searches plus the safetensors directory).
pub const DIRS_LISTED_MAX_COUNT: usize = 256;
/// Directory entries looked at by one parse at most.
pub const DIR_ENTRIES_SEEN_MAX_COUNT: usize = 100_000;
/// safetensors files whose headers one parse reads at most (DeepSeek V3 has 163 shards).
pub const SAFETENSORS_FILES_MAX_COUNT: usize = 2_048;
/// Bytes read by one parse at most, all files together.
pub const TOTAL_READ_MAX_BYTES: u64 = 512 * 1024 * 1024;
/// Length of the safetensors length prefix.
pub const SAFETENSORS_PREFIX_BYTES: u64 = 8;
