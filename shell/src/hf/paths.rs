//! Repo ids and file paths from the Hub are hostile input: they become names under the models root.

use super::HfError;

/// Linux's NAME_MAX.
const COMPONENT_BYTES_MAX: usize = 255;
/// Linux's PATH_MAX.
const PATH_BYTES_MAX: usize = 4096;
/// The Hub's limit on a repo name (and on an org name).
const REPO_ID_PART_BYTES_MAX: usize = 96;
/// Directories a repo path may go down at most: the purge of a trashed directory stops at
/// `fsops::REMOVE_DEPTH_MAX` (64) levels, and a tree it cannot remove would stay on disk for good.
pub const REPO_PATH_COMPONENTS_MAX: usize = 48;
/// Names the agent keeps in a model's directory (`.model-agent-owner`, `-partial`, `-trash`, …): a repo
/// file so named could overwrite the ownership marker or land in the partial directory.
use model_agent_core::dest_path::AGENT_NAME_PREFIX;

/// Checks a file path of the tree API before it is used under a model's directory.
pub fn check_repo_path(path: &str) -> Result<(), HfError> {
    let bad = |reason| Err(HfError::BadPath { path: path.to_owned(), reason });
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > PATH_BYTES_MAX {
        return bad("longer than 4096 bytes");
    }
    if path.contains('\0') {
        return bad("contains NUL");
    }
    if path.contains('\\') {
        return bad("contains a backslash");
    }
    if path.starts_with('/') {
        return bad("absolute");
    }
    if path.split('/').count() > REPO_PATH_COMPONENTS_MAX {
        return bad("has more than 48 components");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("has an empty component"),
            "." | ".." => return bad("has a . or .. component"),
            _ if component.len() > COMPONENT_BYTES_MAX => return bad("has a component longer than 255 bytes"),
            _ if component.starts_with(AGENT_NAME_PREFIX) => {
                return bad("uses a name reserved for the agent's own files");
            }
            _ => {}
        }
    }
    Ok(())
}

/// `org/name` (or a legacy `name`), each part `[A-Za-z0-9][A-Za-z0-9._-]*`, so that it can go into a
/// URL path unencoded and never names another endpoint.
pub fn check_repo_id(repo_id: &str) -> Result<(), HfError> {
    let bad = |reason| Err(HfError::BadRepoId { repo_id: repo_id.to_owned(), reason });
    let parts: Vec<&str> = repo_id.split('/').collect();
    if parts.len() > 2 {
        return bad("has more than one '/'");
    }
    for part in parts {
        if part.is_empty() || part.len() > REPO_ID_PART_BYTES_MAX {
            return bad("each part must be 1 to 96 characters");
        }
        if !part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')) {
            return bad("only letters, digits, '.', '_' and '-' are allowed");
        }
        if !part.as_bytes()[0].is_ascii_alphanumeric() || part.contains("..") {
            return bad("a part must start with a letter or digit and hold no '..'");
        }
    }
    Ok(())
}

/// A full commit sha as the Hub gives it: 40 lowercase hex digits.
pub fn is_commit_sha(text: &str) -> bool {
    text.len() == 40 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(path: &str) -> &'static str {
        match check_repo_path(path) {
            Err(HfError::BadPath { reason, path: named }) => {
                assert_eq!(named, path);
                reason
            }
            other => panic!("{path:?} was accepted: {other:?}"),
        }
    }

    #[test]
    fn hostile_paths_are_rejected_with_their_reason() {
        assert_eq!(reason("/etc/passwd"), "absolute");
        assert_eq!(reason("a/../../b"), "has a . or .. component");
        assert_eq!(reason(".."), "has a . or .. component");
        assert_eq!(reason("./a"), "has a . or .. component");
        assert_eq!(reason("a//b"), "has an empty component");
        assert_eq!(reason("a/"), "has an empty component");
        assert_eq!(reason(""), "empty");
        assert_eq!(reason("a\0b"), "contains NUL");
        assert_eq!(reason("a\\..\\b"), "contains a backslash");
        assert_eq!(reason(&"x".repeat(256)), "has a component longer than 255 bytes");
        assert_eq!(reason(&["y"; 2049].join("/")), "longer than 4096 bytes");
        assert_eq!(reason(&["y"; REPO_PATH_COMPONENTS_MAX + 1].join("/")), "has more than 48 components");
        assert_eq!(reason(".model-agent-owner"), "uses a name reserved for the agent's own files");
        assert_eq!(reason("sub/.model-agent-partial/x"), "uses a name reserved for the agent's own files");
        assert_eq!(reason(".model-agent-trash"), "uses a name reserved for the agent's own files");
    }

    #[test]
    fn ordinary_paths_pass() {
        for path in ["config.json", "a/b/c.safetensors", ".gitattributes", "..hidden", &"x".repeat(255)] {
            check_repo_path(path).unwrap();
        }
        check_repo_path(&["y"; REPO_PATH_COMPONENTS_MAX].join("/")).unwrap();
    }

    #[test]
    fn repo_ids_are_checked() {
        for good in ["org/model", "gpt2", "Org-1/m.v2_x"] {
            check_repo_id(good).unwrap();
        }
        for bad in ["", "/x", "a/b/c", "a/..", "a/.x", "a b/c", "a/%2e", "a/b?c", &format!("a/{}", "m".repeat(97))] {
            assert!(matches!(check_repo_id(bad), Err(HfError::BadRepoId { .. })), "{bad:?}");
        }
    }

    #[test]
    fn commit_shas_are_40_lowercase_hex() {
        assert!(is_commit_sha(&"a1".repeat(20)));
        assert!(!is_commit_sha(&"A1".repeat(20)));
        assert!(!is_commit_sha("main"));
    }
}
