//! Test helpers: an in-memory model directory, fixture loading, and safetensors generation.
#![allow(dead_code, reason = "each test binary uses a subset")]

use std::collections::BTreeMap;
use std::path::Path;

use model_agent_metadata::{Entry, EntryKind, FsError, ModelFiles};

/// A model directory in memory: file path → bytes; directories are implied by paths.
#[derive(Default, Clone)]
pub struct MemTree {
    pub files: BTreeMap<String, Vec<u8>>,
    /// Files that claim a size but have no bytes (to show they are never read).
    pub sizes_only: BTreeMap<String, u64>,
    pub read_ranges: Vec<(String, u64, u64)>,
}

impl MemTree {
    pub fn with(mut self, path: &str, bytes: impl Into<Vec<u8>>) -> MemTree {
        self.files.insert(path.to_string(), bytes.into());
        self
    }

    fn size_of(&self, path: &str) -> Option<u64> {
        self.files.get(path).map(|b| b.len() as u64).or_else(|| self.sizes_only.get(path).copied())
    }
}

impl ModelFiles for MemTree {
    fn list_dir(&mut self, rel_dir: &str) -> Result<Vec<Entry>, FsError> {
        let prefix = if rel_dir.is_empty() { String::new() } else { format!("{rel_dir}/") };
        let mut out: BTreeMap<String, Entry> = BTreeMap::new();
        let paths: Vec<String> = self.files.keys().chain(self.sizes_only.keys()).cloned().collect();
        for path in paths {
            let Some(rest) = path.strip_prefix(&prefix) else { continue };
            let (name, kind) = match rest.split_once('/') {
                Some((dir, _)) => (dir.to_string(), EntryKind::Dir),
                None => (rest.to_string(), EntryKind::File),
            };
            let size_bytes = if kind == EntryKind::File { self.size_of(&path).unwrap_or(0) } else { 0 };
            out.insert(name.clone(), Entry { name, kind, size_bytes });
        }
        if out.is_empty() && !rel_dir.is_empty() {
            return Err(FsError::NotFound);
        }
        Ok(out.into_values().collect())
    }

    fn read_file(&mut self, rel_path: &str, cap_bytes: u64) -> Result<Vec<u8>, FsError> {
        let size_bytes = self.size_of(rel_path).ok_or(FsError::NotFound)?;
        if size_bytes > cap_bytes {
            return Err(FsError::TooLarge { size_bytes, cap_bytes });
        }
        self.files.get(rel_path).cloned().ok_or(FsError::Other("no bytes".into()))
    }

    fn read_range(&mut self, rel_path: &str, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError> {
        self.read_ranges.push((rel_path.to_string(), offset_bytes, len_bytes));
        let bytes = self.files.get(rel_path).ok_or(FsError::NotFound)?;
        let start = (offset_bytes as usize).min(bytes.len());
        let end = (start + len_bytes as usize).min(bytes.len());
        Ok(bytes[start..end].to_vec())
    }
}

/// (name, dtype, shape)
pub type Tensor = (String, String, Vec<u64>);

fn dtype_bytes(dtype: &str) -> u64 {
    match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        _ => 1,
    }
}

/// Tensor data is written when a file's data is at most this; larger files keep a real header
/// and end where the data would start (the parser never reads past the header).
const INLINE_DATA_MAX_BYTES: u64 = 64 * 1024;

/// A real safetensors file: 8-byte little-endian header length, JSON header padded with
/// spaces to 8 bytes, then the data (zeros) when small.
pub fn safetensors_file(tensors: &[Tensor]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let len = shape.iter().product::<u64>() * dtype_bytes(dtype);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut json = serde_json::to_vec(&header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    if offset <= INLINE_DATA_MAX_BYTES {
        out.resize(out.len() + offset as usize, 0);
    }
    out
}

/// `name.{0..3}.x` → name.0.x … name.3.x
fn expand(name: &str) -> Vec<String> {
    let Some((head, rest)) = name.split_once('{') else { return vec![name.to_string()] };
    let (range, tail) = rest.split_once('}').unwrap();
    let (a, b) = range.split_once("..").unwrap();
    let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
    (a..=b).flat_map(|i| expand(&format!("{head}{i}{tail}"))).collect()
}

/// tensors.txt: `shard FILE` starts a file, `NAME DTYPE d1,d2` adds tensors, `index` writes
/// model.safetensors.index.json for the shards.
pub fn generate_safetensors(dir: &str, spec: &str) -> Vec<(String, Vec<u8>)> {
    let mut shards: Vec<(String, Vec<Tensor>)> = Vec::new();
    let mut index = false;
    for line in spec.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["shard", file] => shards.push((file.to_string(), vec![])),
            ["index"] => index = true,
            [name, dtype, shape] => {
                let shape: Vec<u64> = shape.split(',').map(|d| d.parse().unwrap()).collect();
                let shard = &mut shards.last_mut().expect("a shard line first").1;
                shard.extend(expand(name).into_iter().map(|n| (n, dtype.to_string(), shape.clone())));
            }
            _ => panic!("bad tensors.txt line {line:?}"),
        }
    }
    let join = |f: &str| if dir.is_empty() { f.to_string() } else { format!("{dir}/{f}") };
    let mut out = Vec::new();
    let mut weight_map = serde_json::Map::new();
    for (file, tensors) in &shards {
        for (name, _, _) in tensors {
            weight_map.insert(name.clone(), file.clone().into());
        }
        out.push((join(file), safetensors_file(tensors)));
    }
    if index {
        let body = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
        out.push((join("model.safetensors.index.json"), serde_json::to_vec_pretty(&body).unwrap()));
    }
    out
}

/// Load a fixture directory into memory, turning each tensors.txt into safetensors files.
pub fn load_fixture(name: &str) -> MemTree {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut tree = MemTree::default();
    load_dir(&root, "", &mut tree);
    tree
}

fn load_dir(dir: &Path, rel: &str, tree: &mut MemTree) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().to_string();
        let child = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        if e.file_type().unwrap().is_dir() {
            load_dir(&e.path(), &child, tree);
        } else if name == "tensors.txt" {
            for (path, bytes) in generate_safetensors(rel, &std::fs::read_to_string(e.path()).unwrap()) {
                tree.files.insert(path, bytes);
            }
        } else {
            tree.files.insert(child, std::fs::read(e.path()).unwrap());
        }
    }
}

pub fn fixture_names() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut names: Vec<String> =
        std::fs::read_dir(root).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
    names.sort();
    names
}
