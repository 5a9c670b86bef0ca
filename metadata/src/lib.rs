//! Model metadata, pure: from the bytes of config.json / model_index.json and safetensors
//! headers to OME's `ModelEntry.config` and the spec fields the agent may fill. The crate does
//! no I/O: the caller implements [`ModelFiles`] (the shell through a directory fd with a
//! deadline, tests in memory) and every read goes through a budget ([`limits`]).

pub mod arch;
pub mod capabilities;
pub mod diffusion;
pub mod discovery;
pub mod format;
pub mod json;
pub mod limits;
pub mod output;
pub mod parse;
pub mod safetensors;
pub mod tree;
pub mod writeback;

use std::collections::BTreeMap;

pub use format::format_param_count;
pub use json::to_go_json;
pub use output::{Metadata, ModelConfig};
pub use tree::{Entry, EntryKind, FsError, ModelFiles};
pub use writeback::{spec_fill, spec_merge_patch};

use discovery::Found;
use limits::CONFIG_JSON_MAX_BYTES;
use tree::Budgeted;

/// The annotation that turns parsing off for a model.
pub const SKIP_CONFIG_PARSING_ANNOTATION: &str = "ome.oracle.com/skip-config-parsing";

/// What parsing a model directory gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Metadata to publish as the entry's `config`.
    Parsed(Box<Metadata>),
    /// The annotation asked not to parse: publish no `config`, say nothing.
    Skipped,
    /// No config, or one that cannot be read or parsed: the model is still Ready, without
    /// `config`, and this says why (upstream returned an error and wrote nothing).
    WithoutConfig { reason: String },
}

/// Upstream compares the annotation's value case-insensitively with "true".
pub fn skip_requested(annotations: &BTreeMap<String, String>) -> bool {
    annotations.get(SKIP_CONFIG_PARSING_ANNOTATION).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Parse the model directory behind `files`.
pub fn parse_model_dir(files: &mut dyn ModelFiles, annotations: &BTreeMap<String, String>) -> Outcome {
    if skip_requested(annotations) {
        return Outcome::Skipped;
    }
    let mut tree = Budgeted::new(files);
    let without = |reason: String| Outcome::WithoutConfig { reason };
    let found = match discovery::discover(&mut tree) {
        Ok(f) => f,
        Err(e) => return without(format!("cannot search the model directory: {e}")),
    };
    let (path, is_index) = match found {
        Found::ModelIndex(p) => (p, true),
        Found::Config(p) => (p, false),
        Found::Neither => return without("no model_index.json or config.json found".into()),
    };
    let bytes = match tree.read_file(&path, CONFIG_JSON_MAX_BYTES) {
        Ok(b) => b,
        Err(e) => return without(format!("{path}: {e}")),
    };
    let obj = match json::parse_object(&bytes) {
        Ok(o) => o,
        Err(e) => return without(format!("{path}: {e}")),
    };
    if is_index {
        return match diffusion::diffusion_metadata(&mut tree, &path, &obj) {
            Ok(m) => Outcome::Parsed(Box::new(m)),
            Err(e) => without(format!("{path}: {e}")),
        };
    }
    if json::str_field(&obj, "model_type").is_none() {
        return without(format!("{path}: model_type is missing or empty"));
    }
    Outcome::Parsed(Box::new(parse::transformers_metadata(&mut tree, &path, &obj)))
}
