//! Where a model's weights live on the node, and which paths the agent refuses to act on.
//!
//! `spec.storage.path` is user input that upstream passed verbatim to `RemoveAll`. Here a path
//! is only ever acted on when it is absolute, free of `..` and NUL, and, for schemes that write
//! (downloads), strictly beneath the models root. The shell still resolves it beneath the root's
//! directory fd without following symlinks; this is the lexical half of that defence.

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;

use crate::model::ModelSpec;
use crate::storage_uri::{Provisioning, StorageUri};

/// Longest path the agent accepts (PATH_MAX).
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest single component (NAME_MAX).
pub const COMPONENT_BYTES_MAX: usize = 255;

/// A validated destination: one string, as every model that fetches keeps one in its record,
/// in its plan and in each effect (the part beneath the root is a suffix of the absolute path).
/// Serialised as the two paths.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "DestPathParts", try_from = "DestPathParts")]
pub struct DestPath {
    /// Normalised absolute path (no `.` components, no repeated or trailing `/`). Shared: a plan
    /// to verify the path holds it too.
    absolute: Arc<str>,
    /// Where the path relative to the models root starts in `absolute`; 0 when it is not
    /// beneath the root (a relative path never starts at the leading `/`).
    beneath_at: u32,
}

impl DestPath {
    /// `absolute` (normalised), beneath the root from byte `beneath_at` (0: not beneath it).
    fn new(absolute: &str, beneath_at: usize) -> DestPath {
        debug_assert!(absolute.len() <= PATH_BYTES_MAX && absolute.is_char_boundary(beneath_at));
        let beneath_at = u32::try_from(beneath_at).expect("a path is at most PATH_BYTES_MAX bytes");
        DestPath { absolute: Arc::from(absolute), beneath_at }
    }

    /// `absolute` as it is relative to `root` (both normalised, or `root` with its trailing `/`
    /// trimmed: `""` for the filesystem root); at most `PATH_BYTES_MAX` bytes.
    pub fn under_root(absolute: &str, root: &str) -> DestPath {
        let beneath_at = relative_part(root, absolute).map_or(0, |rel| absolute.len() - rel.len());
        DestPath::new(absolute, beneath_at)
    }

    /// Normalised absolute path (no `.` components, no repeated or trailing `/`).
    pub fn absolute(&self) -> &str {
        &self.absolute
    }

    /// `absolute`, shared.
    pub fn absolute_shared(&self) -> &Arc<str> {
        &self.absolute
    }

    /// The same path relative to the models root, when it is beneath it.
    pub fn beneath_root(&self) -> Option<&str> {
        (self.beneath_at > 0).then(|| &self.absolute[self.beneath_at as usize..])
    }
}

impl std::fmt::Debug for DestPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestPath")
            .field("absolute", &self.absolute())
            .field("beneath_root", &self.beneath_root())
            .finish()
    }
}

/// `DestPath` as it is serialised (traces, effects): both paths.
#[derive(Serialize, Deserialize)]
struct DestPathParts {
    absolute: String,
    beneath_root: Option<String>,
}

impl From<DestPath> for DestPathParts {
    fn from(d: DestPath) -> Self {
        DestPathParts { beneath_root: d.beneath_root().map(str::to_string), absolute: d.absolute().into() }
    }
}

impl TryFrom<DestPathParts> for DestPath {
    type Error = String;

    fn try_from(parts: DestPathParts) -> Result<Self, String> {
        if parts.absolute.len() > PATH_BYTES_MAX {
            return Err(format!("a path of {} bytes, over {PATH_BYTES_MAX}", parts.absolute.len()));
        }
        let Some(rel) = parts.beneath_root.filter(|r| !r.is_empty()) else {
            return Ok(DestPath::new(&parts.absolute, 0));
        };
        let beneath_at = parts.absolute.len().saturating_sub(rel.len());
        let suffix = beneath_at > 0 && parts.absolute.ends_with(&*rel) && parts.absolute[..beneath_at].ends_with('/');
        if !suffix {
            return Err(format!("{rel:?} is not the end of the path {:?} beneath its root", parts.absolute));
        }
        Ok(DestPath::new(&parts.absolute, beneath_at))
    }
}

/// Names beneath the models root that the agent keeps for its own files: the trash
/// (`.model-agent-trash`, whose entries are purged), markers, partial files, manifests.
pub const AGENT_NAME_PREFIX: &str = ".model-agent-";

/// Lexically normalise an absolute path, rejecting what the agent must never act on. Borrowed
/// when it is normal already, as nearly every path is.
pub fn normalize_absolute(path: &str) -> Result<Cow<'_, str>, String> {
    // Nearly every path is normal already: one scan of its bytes, no copy.
    if path.len() <= PATH_BYTES_MAX && is_normal_absolute(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    if !path.starts_with('/') {
        return Err(format!("the path {path:?} is relative; an absolute path is required"));
    }
    if path.len() > PATH_BYTES_MAX {
        return Err(format!("the path is longer than {PATH_BYTES_MAX} bytes"));
    }
    let mut parts = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("the path {path:?} contains '..'")),
            c if c.len() > COMPONENT_BYTES_MAX => {
                return Err(format!("a component of {path:?} is longer than {COMPONENT_BYTES_MAX} bytes"));
            }
            c => parts.push(c),
        }
    }
    Ok(Cow::Owned(format!("/{}", parts.join("/"))))
}

/// An absolute path (`/` first) with no NUL byte and no component empty, `.`, `..` or longer
/// than `COMPONENT_BYTES_MAX`: what `normalize_absolute` returns unchanged.
fn is_normal_absolute(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut start = 1;
    for at in 1..=path.len() {
        match path.get(at) {
            None | Some(b'/') => {
                let component = &path[start..at];
                if matches!(component, b"" | b"." | b"..") || component.len() > COMPONENT_BYTES_MAX {
                    return false;
                }
                start = at + 1;
            }
            Some(0) => return false,
            Some(_) => {}
        }
    }
    true
}

/// `rel` when `path` is strictly beneath `root` (both normalised), else `None`.
pub fn relative_to(root: &str, path: &str) -> Option<String> {
    relative_part(root, path).map(str::to_string)
}

fn relative_part<'a>(root: &str, path: &'a str) -> Option<&'a str> {
    let rest = if root == "/" { path.strip_prefix('/')? } else { path.strip_prefix(root)?.strip_prefix('/')? };
    (!rest.is_empty()).then_some(rest)
}

/// The destination for a model's weights: `spec.storage.path`, or `<root>/<storageUri>` when it
/// is empty (OME's rule). `Ok(None)` when the scheme does not use a node path (vendor, pvc).
pub fn dest_path(spec: &ModelSpec, models_root: &str) -> Result<Option<DestPath>, String> {
    let Ok(uri) = &spec.uri else { return Ok(None) };
    let provisioning = uri.provisioning();
    let user_path = spec.path.as_deref().filter(|p| !p.is_empty());
    let raw: Cow<str> = match (provisioning, user_path, uri) {
        (Provisioning::Nothing | Provisioning::NotOnNodes, _, _) => return Ok(None),
        (_, Some(p), _) => Cow::Borrowed(p),
        (Provisioning::VerifyLocal, None, StorageUri::Local { path }) => Cow::Borrowed(path),
        (_, None, _) => Cow::Owned(format!("{}/{}", models_root.trim_end_matches('/'), spec.storage_uri)),
    };
    let root = normalize_absolute(models_root).map_err(|e| format!("models root: {e}"))?;
    let absolute = normalize_absolute(&raw).map_err(|e| format!("spec.storage.path rejected: {e}"))?;
    let dest = DestPath::under_root(&absolute, &root);
    if let Some(name) = dest.beneath_root().and_then(|rel| rel.split('/').find(|c| c.starts_with(AGENT_NAME_PREFIX))) {
        return Err(format!(
            "spec.storage.path rejected: {:?} is inside {name:?}, a name the agent keeps for its own \
             files beneath the models root (its trash is purged)",
            dest.absolute()
        ));
    }
    if provisioning == Provisioning::Download && dest.beneath_root().is_none() {
        return Err(format!(
            "spec.storage.path rejected: {:?} is not beneath the models root {root:?}; \
             {} downloads only go beneath it",
            dest.absolute(),
            uri.scheme()
        ));
    }
    Ok(Some(dest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(uri: &str, path: Option<&str>) -> Result<Option<DestPath>, String> {
        dest_path(&ModelSpec::simple(uri, path), "/mnt/models")
    }

    #[test]
    fn explicit_path_beneath_root() {
        let d = dest("hf://a/b", Some("/mnt/models/llama//8b/")).unwrap().unwrap();
        assert_eq!(d.absolute(), "/mnt/models/llama/8b");
        assert_eq!(d.beneath_root(), Some("llama/8b"));
    }

    #[test]
    fn empty_path_derives_from_the_uri_like_ome() {
        let d = dest("hf://org/model", Some("")).unwrap().unwrap();
        assert_eq!(d.absolute(), "/mnt/models/hf:/org/model");
        assert_eq!(d.beneath_root(), Some("hf:/org/model"));
        assert_eq!(dest("hf://org/model", None).unwrap().unwrap().absolute(), "/mnt/models/hf:/org/model");
    }

    /// A review: a path inside the trash folder passed every check, the scan listed the live
    /// directory as a trash entry, and the core purged it after its grace period.
    #[test]
    fn a_path_inside_the_agent_s_own_names_is_rejected_with_a_reason() {
        for path in ["/mnt/models/.model-agent-trash/llama", "/mnt/models/team/.model-agent-partial/x"] {
            for uri in ["hf://o/r", "local:///mnt/models/x"] {
                let e = dest(uri, Some(path)).unwrap_err();
                assert!(e.contains("a name the agent keeps for its own files"), "{uri} {path}: {e}");
            }
        }
        assert!(dest("local:///data/.model-agent-trash/x", None).is_ok(), "outside the root: not the agent's");
        assert!(dest("hf://o/r", Some("/mnt/models/team/model-agent-x")).is_ok());
    }

    #[test]
    fn hostile_paths_are_rejected_with_a_reason() {
        for (path, why) in [
            ("relative/dir", "relative"),
            ("/mnt/models/../../etc", "'..'"),
            ("/mnt/models/a/..", "'..'"),
            ("/mnt/models/a\0b", "NUL"),
            ("/etc", "not beneath the models root"),
            ("/mnt/models", "not beneath the models root"),
            ("/mnt/models-other/x", "not beneath the models root"),
            ("/", "not beneath the models root"),
        ] {
            let err = dest("oci://n/a/b/c/o/d", Some(path)).expect_err(path);
            assert!(err.contains(why), "{path}: {err}");
            assert!(err.starts_with("spec.storage.path rejected"), "{err}");
        }
        let long = format!("/mnt/models/{}", "a".repeat(300));
        assert!(dest("hf://a/b", Some(&long)).unwrap_err().contains("longer than 255"));
        let very_long = format!("/mnt/models{}", "/abc".repeat(1100));
        assert!(dest("hf://a/b", Some(&very_long)).unwrap_err().contains("longer than 4096"));
    }

    #[test]
    fn serialised_as_both_paths_and_read_back_only_when_one_ends_the_other() {
        let d = dest("hf://a/b", Some("/mnt/models/llama/8b")).unwrap().unwrap();
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json, serde_json::json!({"absolute": "/mnt/models/llama/8b", "beneath_root": "llama/8b"}));
        assert_eq!(serde_json::from_value::<DestPath>(json).unwrap(), d);
        let outside = dest("local:///data/x", None).unwrap().unwrap();
        let json = serde_json::to_value(&outside).unwrap();
        assert_eq!(json, serde_json::json!({"absolute": "/data/x", "beneath_root": null}));
        assert_eq!(serde_json::from_value::<DestPath>(json).unwrap(), outside);
        for (absolute, rel) in [("/mnt/models/a", "b"), ("/mnt/models/xa", "a"), ("/a", "/a"), ("a", "a")] {
            let json = serde_json::json!({"absolute": absolute, "beneath_root": rel});
            assert!(serde_json::from_value::<DestPath>(json).is_err(), "{absolute} {rel}");
        }
        let too_long = format!("/mnt/models{}", "/abc".repeat(1100));
        for rel in [None, Some("abc")] {
            let json = serde_json::json!({"absolute": too_long, "beneath_root": rel});
            let err = serde_json::from_value::<DestPath>(json).unwrap_err().to_string();
            assert!(err.contains("over 4096"), "{err}");
        }
    }

    #[test]
    fn a_copy_whose_path_would_be_too_long_is_refused_with_a_reason() {
        let commit = "a".repeat(40);
        let root = format!("/mnt{}", "/abcd".repeat(815));
        let err = crate::machine::shared::copy_dest(&root, "org", "repo", &commit).unwrap_err();
        assert!(err.contains("would be a path of"), "{err}");
        let ok = crate::machine::shared::copy_dest("/mnt/models", "org", "repo", &commit).unwrap();
        assert_eq!(ok.beneath_root(), Some(&*format!("_artifacts/org/repo/{commit}")));
    }

    #[test]
    fn a_copy_beneath_the_filesystem_root_is_beneath_it() {
        let d = DestPath::under_root("/_artifacts/o/r/c", "/");
        assert_eq!((d.absolute(), d.beneath_root()), ("/_artifacts/o/r/c", Some("_artifacts/o/r/c")));
        assert_eq!(DestPath::under_root("/mnt/modelsx/a", "/mnt/models").beneath_root(), None);
    }

    #[test]
    fn normal_paths_come_back_as_they_are_and_others_normalised() {
        for (path, normal) in [
            ("/", "/"),
            ("/mnt/models/m", "/mnt/models/m"),
            ("/mnt/models/m/", "/mnt/models/m"),
            ("//mnt///models/./m/.", "/mnt/models/m"),
            ("/.", "/"),
            ("/a.b/.c/..d", "/a.b/.c/..d"),
        ] {
            assert_eq!(normalize_absolute(path).as_deref(), Ok(normal), "{path}");
        }
        assert!(normalize_absolute("/a/../b").unwrap_err().contains("'..'"));
        assert!(normalize_absolute(&format!("/{}", "x".repeat(256))).unwrap_err().contains("longer than 255"));
    }

    /// The byte scan agrees with the definition by components on every path of up to seven
    /// bytes over `/`, `.`, `a` and NUL (and on components at and over the length limit).
    #[test]
    fn the_byte_scan_agrees_with_the_components() {
        let by_components = |p: &str| {
            let normal = |c: &str| !matches!(c, "" | "." | "..") && c.len() <= COMPONENT_BYTES_MAX;
            p.starts_with('/') && !p.contains('\0') && p[1..].split('/').all(normal)
        };
        let mut paths = vec![String::new()];
        for _ in 0..7 {
            let longer: Vec<String> =
                paths.iter().flat_map(|p| ['/', '.', 'a', '\0'].map(|c| format!("{p}{c}"))).collect();
            paths.extend(longer);
        }
        paths.dedup();
        let limit = "x".repeat(COMPONENT_BYTES_MAX);
        paths.extend([format!("/{limit}"), format!("/{limit}x"), format!("/a/{limit}/b"), format!("/a/{limit}x/b")]);
        for p in &paths {
            assert_eq!(is_normal_absolute(p.as_bytes()), by_components(p), "{p:?}");
        }
    }

    #[test]
    fn local_may_live_outside_the_root_but_must_still_be_sane() {
        let d = dest("local:///data/share/m", None).unwrap().unwrap();
        assert_eq!(d.absolute(), "/data/share/m");
        assert_eq!(d.beneath_root(), None);
        let d = dest("local:///ignored", Some("/mnt/models/m")).unwrap().unwrap();
        assert_eq!(d.beneath_root(), Some("m"));
        assert!(dest("local://relative/m", None).unwrap_err().contains("relative"));
        assert!(dest("local:///a/../b", None).unwrap_err().contains("'..'"));
    }

    #[test]
    fn vendor_and_pvc_have_no_node_path() {
        assert_eq!(dest("vendor://v/t/p", Some("/../../x")), Ok(None));
        assert_eq!(dest("pvc://c/s", None), Ok(None));
        assert_eq!(dest("bogus://x", None), Ok(None));
    }

    #[test]
    fn relative_to_root() {
        assert_eq!(relative_to("/", "/a"), Some("a".into()));
        assert_eq!(relative_to("/mnt/models", "/mnt/models/a/b"), Some("a/b".into()));
        assert_eq!(relative_to("/mnt/models", "/mnt/models"), None);
        assert_eq!(relative_to("/mnt/models", "/mnt/modelsx/a"), None);
    }
}
