//! Which file describes the model: model_index.json first (diffusion pipelines), then
//! config.json at the root, in safetensors/, pytorch_model/, model/, then a bounded search.

use crate::limits::SEARCH_DEPTH_MAX_DIRS;
use crate::tree::{Budgeted, EntryKind, FsError, join};

pub const MODEL_INDEX_JSON: &str = "model_index.json";
pub const CONFIG_JSON: &str = "config.json";
/// Where checkpoints commonly keep config.json when it is not at the root.
pub const CONFIG_SUBDIRS: [&str; 3] = ["safetensors", "pytorch_model", "model"];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    ModelIndex(String),
    Config(String),
    Neither,
}

fn has_file(tree: &mut Budgeted, dir: &str, name: &str) -> Result<bool, FsError> {
    match tree.list_dir(dir) {
        Ok(entries) => Ok(entries.iter().any(|e| e.name == name && e.kind == EntryKind::File)),
        Err(FsError::NotFound) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Depth-first in name order, as upstream's `filepath.Walk`, but at most
/// `SEARCH_DEPTH_MAX_DIRS` below the root, never into hidden directories (.cache holds
/// half-downloaded files) and never through symlinks. The first hit wins (upstream's SkipDir
/// let a later directory's hit overwrite it).
fn search(tree: &mut Budgeted, dir: &str, name: &str, depth: usize) -> Result<Option<String>, FsError> {
    let entries = match tree.list_dir(dir) {
        Ok(e) => e,
        Err(FsError::NotFound) if !dir.is_empty() => return Ok(None),
        Err(e) => return Err(e),
    };
    for e in entries {
        match e.kind {
            EntryKind::File if e.name == name => return Ok(Some(join(dir, &e.name))),
            EntryKind::Dir if depth < SEARCH_DEPTH_MAX_DIRS && !e.name.starts_with('.') => {
                if let Some(hit) = search(tree, &join(dir, &e.name), name, depth + 1)? {
                    return Ok(Some(hit));
                }
            }
            _ => {}
        }
    }
    Ok(None)
}

pub fn discover(tree: &mut Budgeted) -> Result<Found, FsError> {
    if let Some(index) = search(tree, "", MODEL_INDEX_JSON, 0)? {
        return Ok(Found::ModelIndex(index));
    }
    if has_file(tree, "", CONFIG_JSON)? {
        return Ok(Found::Config(CONFIG_JSON.into()));
    }
    for sub in CONFIG_SUBDIRS {
        if has_file(tree, sub, CONFIG_JSON)? {
            return Ok(Found::Config(join(sub, CONFIG_JSON)));
        }
    }
    Ok(search(tree, "", CONFIG_JSON, 0)?.map(Found::Config).unwrap_or(Found::Neither))
}
