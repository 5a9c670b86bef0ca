//! The shared copies' symlinks (issue #10): a `ReuseIfExists` model's path becomes a relative
//! symlink to the node's one copy of its commit under `_artifacts/`. A link is made only where
//! nothing is, and removed only while it still points at the copy it was made for: a directory,
//! a file or another link that someone put there is never touched. Everything is resolved beneath
//! the models root's fd, one component at a time, never through a symlink.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::readlinkat;
use nix::unistd::{UnlinkatFlags, fsync, symlinkat, unlinkat};

use crate::fsops;

/// The shared copies' folder beneath the root (the core's `shared::ARTIFACTS_DIR`).
pub const ARTIFACTS: &str = model_agent_core::machine::shared::ARTIFACTS_DIR;

/// What `make_link` found or did.
#[derive(Debug, PartialEq, Eq)]
pub enum Linked {
    Made,
    /// The same link was already there (a restart, a retry).
    AlreadyThere,
    /// Something else is at the link's path, left alone: why.
    Occupied(String),
}

/// Plain components of a path beneath the root; `..` or an empty path is refused.
fn components(rel: &str) -> Result<Vec<&str>, String> {
    let parts: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if parts.is_empty() || parts.contains(&"..") {
        return Err(format!("{rel:?} is not a path beneath the models root"));
    }
    Ok(parts)
}

/// The link's text: `copy` as seen from the directory that holds `link`, both beneath the root
/// (`a/qwen` → `../_artifacts/org/repo/<commit>`), so the link stays right wherever the root is
/// mounted. The copy must be inside `_artifacts/`.
pub fn relative_target(link: &str, copy: &str) -> Result<String, String> {
    let (link_parts, copy_parts) = (components(link)?, components(copy)?);
    if copy_parts.first() != Some(&ARTIFACTS) || copy_parts.len() < 2 {
        return Err(format!("{copy:?} is not a shared copy under {ARTIFACTS}/"));
    }
    if link_parts.first() == Some(&ARTIFACTS) {
        return Err(format!("{link:?} is inside {ARTIFACTS}/"));
    }
    let ups = "../".repeat(link_parts.len() - 1);
    Ok(format!("{ups}{}", copy_parts.join("/")))
}

/// Where `link` lives: its parent directory (created beneath the root when `create`) and its name.
fn open_parent(root: &Path, link: &str, create: bool) -> Result<Option<(OwnedFd, String)>, String> {
    let parts = components(link)?;
    let (name, parents) = parts.split_last().expect("components are never empty");
    let root_fd = fsops::open_root(root)?;
    let parent = parents.join("/");
    let opened = match create {
        true => fsops::create_beneath(&root_fd, &parent),
        false => fsops::open_beneath(&root_fd, &parent),
    };
    match opened {
        Ok(fd) => Ok(Some((fd, name.to_string()))),
        Err(e) if !create && e.is_gone() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The text of the symlink `name` in `parent`; `None` when nothing is there or it is not a link.
fn read_link(parent: &OwnedFd, name: &str) -> Result<Option<String>, String> {
    match readlinkat(parent.as_fd(), name) {
        Ok(text) => Ok(Some(text.to_string_lossy().into_owned())),
        Err(Errno::ENOENT | Errno::EINVAL) => Ok(None),
        Err(e) => Err(format!("{name}: {e}")),
    }
}

/// Make `link` a relative symlink to `copy`, only where nothing is.
pub fn make_link(root: &Path, link: &str, copy: &str) -> Result<Linked, String> {
    let target = relative_target(link, copy)?;
    let (parent, name) = open_parent(root, link, true)?.expect("created");
    match symlinkat(target.as_str(), parent.as_fd(), name.as_str()) {
        Ok(()) => {
            fsync(parent.as_fd()).map_err(|e| format!("{link}: syncing its directory: {e}"))?;
            Ok(Linked::Made)
        }
        Err(Errno::EEXIST) => Ok(match read_link(&parent, &name)? {
            Some(found) if found == target => Linked::AlreadyThere,
            Some(found) => Linked::Occupied(format!("{link} is a symlink to {found:?}, not to {target:?}")),
            None => Linked::Occupied(format!("{link} exists and is not a symlink (left as it is)")),
        }),
        Err(e) => Err(format!("{link}: symlink: {e}")),
    }
}

/// Remove `link` only if it is still the symlink to `copy`; true when it was removed. Nothing
/// there, or anything else there, is left alone.
pub fn remove_link(root: &Path, link: &str, copy: &str) -> Result<bool, String> {
    let target = relative_target(link, copy)?;
    let Some((parent, name)) = open_parent(root, link, false)? else { return Ok(false) };
    if read_link(&parent, &name)?.as_deref() != Some(target.as_str()) {
        return Ok(false);
    }
    match unlinkat(parent.as_fd(), name.as_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(true),
        Err(e) => Err(format!("{link}: unlink: {e}")),
    }
}

/// The copy (beneath the root) that the symlink `link` points to, if it is one of this agent's.
pub fn linked_copy(root: &Path, link: &str) -> Option<String> {
    let (parent, name) = open_parent(root, link, false).ok()??;
    let text = read_link(&parent, &name).ok()??;
    let ups = components(link).ok()?.len() - 1;
    let copy = text.strip_prefix(&"../".repeat(ups))?;
    (relative_target(link, copy).ok()? == text).then(|| copy.to_string())
}

/// Is `rel` beneath the root a real directory (not a symlink)? For tests and checks.
#[cfg(test)]
fn is_real_dir(root: &Path, rel: &str) -> bool {
    let Ok(root_fd) = fsops::open_root(root) else { return false };
    fsops::open_beneath(&root_fd, rel).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const COPY: &str = "_artifacts/org/repo/0123456789abcdef0123456789abcdef01234567";

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(COPY)).unwrap();
        std::fs::write(dir.path().join(COPY).join("config.json"), b"{}").unwrap();
        dir
    }

    #[test]
    fn the_target_is_relative_to_the_links_directory() {
        assert_eq!(relative_target("qwen", COPY).unwrap(), COPY);
        assert_eq!(relative_target("a/b/qwen", COPY).unwrap(), format!("../../{COPY}"));
        assert_eq!(relative_target("./a//qwen", COPY).unwrap(), format!("../{COPY}"));
        assert!(relative_target("a/../../etc", COPY).is_err());
        assert!(relative_target("qwen", "elsewhere/x").is_err());
        assert!(relative_target("_artifacts/x", COPY).is_err());
        assert!(relative_target("", COPY).is_err());
    }

    #[test]
    fn a_link_is_made_where_nothing_is_and_reads_through_to_the_copy() {
        let root = root();
        assert_eq!(make_link(root.path(), "team/qwen", COPY), Ok(Linked::Made));
        assert_eq!(std::fs::read(root.path().join("team/qwen/config.json")).unwrap(), b"{}");
        assert_eq!(make_link(root.path(), "team/qwen", COPY), Ok(Linked::AlreadyThere));
        assert_eq!(linked_copy(root.path(), "team/qwen").as_deref(), Some(COPY));
        assert!(!is_real_dir(root.path(), "team/qwen"), "a symlink is never opened as a directory");
    }

    #[test]
    fn a_directory_a_file_or_another_link_at_the_path_is_occupied_and_left_alone() {
        let root = root();
        std::fs::create_dir_all(root.path().join("dir/x")).unwrap();
        std::fs::write(root.path().join("file"), b"mine").unwrap();
        std::os::unix::fs::symlink("/elsewhere", root.path().join("other")).unwrap();
        for path in ["dir", "file", "other"] {
            assert!(matches!(make_link(root.path(), path, COPY), Ok(Linked::Occupied(_))), "{path}");
            assert_eq!(remove_link(root.path(), path, COPY), Ok(false), "{path}");
        }
        assert!(root.path().join("dir/x").is_dir());
        assert_eq!(std::fs::read(root.path().join("file")).unwrap(), b"mine");
        assert_eq!(std::fs::read_link(root.path().join("other")).unwrap(), Path::new("/elsewhere"));
        assert_eq!(linked_copy(root.path(), "other"), None);
    }

    #[test]
    fn a_link_is_removed_only_while_it_points_at_its_copy() {
        let root = root();
        make_link(root.path(), "a/qwen", COPY).unwrap();
        let other = "_artifacts/org/repo/fedcba9876543210fedcba9876543210fedcba98";
        assert_eq!(remove_link(root.path(), "a/qwen", other), Ok(false));
        assert!(root.path().join("a/qwen").symlink_metadata().unwrap().is_symlink());
        assert_eq!(remove_link(root.path(), "a/qwen", COPY), Ok(true));
        assert!(root.path().join("a/qwen").symlink_metadata().is_err());
        assert!(root.path().join(COPY).join("config.json").is_file(), "the copy stays");
        assert_eq!(remove_link(root.path(), "a/qwen", COPY), Ok(false), "nothing there");
        assert_eq!(remove_link(root.path(), "missing/qwen", COPY), Ok(false));
    }

    #[test]
    fn a_symlinked_parent_is_never_followed() {
        let root = root();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("evil")).unwrap();
        assert!(make_link(root.path(), "evil/qwen", COPY).is_err());
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    }
}
