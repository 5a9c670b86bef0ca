//! The node's filesystem: models-root probes, `local://` checks, ownership markers, trash.
//!
//! Everything destructive is resolved beneath the models root's directory fd, one component at a
//! time with `O_NOFOLLOW`, so a symlink planted anywhere on the path cannot redirect a move or a
//! delete outside the root. A directory is only moved to the trash when its marker names the uid
//! being cleaned up.

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{AccessFlags, access};

use model_agent_core::Uid;
use model_agent_core::machine::{OwnedDir, RootProbe};

/// The marker file an agent writes into each directory it downloads.
pub const MARKER: &str = ".model-agent-owner";
/// The trash folder beneath the models root.
pub const TRASH: &str = ".model-agent-trash";
/// How deep the snapshot looks for markers beneath the root.
pub const SCAN_DEPTH_MAX: usize = 6;
/// How many directories a snapshot scan visits at most.
pub const SCAN_DIRS_MAX: usize = 100_000;

/// Exists, is a directory, readable, writable (and why not).
pub fn probe_root(root: &Path) -> RootProbe {
    let meta = match fs::metadata(root) {
        Ok(m) => m,
        Err(e) => {
            return RootProbe { exists: false, is_dir: false, readable: false, writable: false, detail: e.to_string() };
        }
    };
    if !meta.is_dir() {
        return RootProbe {
            exists: true,
            is_dir: false,
            readable: false,
            writable: false,
            detail: "not a directory".into(),
        };
    }
    let readable = fs::read_dir(root).map(|mut d| d.next().is_none_or(|e| e.is_ok()));
    let (readable, mut detail) = match readable {
        Ok(ok) => (ok, String::new()),
        Err(e) => (false, e.to_string()),
    };
    let read_only_mount = nix::sys::statvfs::statvfs(root)
        .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
        .unwrap_or(false);
    let writable = !read_only_mount && access(root, AccessFlags::W_OK).is_ok();
    if read_only_mount {
        detail = "mounted read-only".into();
    } else if !writable && detail.is_empty() {
        detail = "no write permission".into();
    }
    RootProbe { exists: true, is_dir: true, readable, writable, detail }
}

/// A `local://` directory must exist, be a directory and be readable. Never writes.
pub fn verify_local(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    access(path, AccessFlags::R_OK | AccessFlags::X_OK).map_err(|e| format!("{}: not readable: {e}", path.display()))
}

/// The marker's content.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    pub uid: String,
    pub key: String,
}

fn open_root(root: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(root, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| format!("{}: {e}", root.display()))
}

/// Open a directory `rel` beneath `root_fd`, one component at a time, refusing symlinks.
fn open_beneath(root_fd: &OwnedFd, rel: &str) -> Result<OwnedFd, String> {
    let mut fd = root_fd.try_clone().map_err(|e| e.to_string())?;
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(format!("{rel:?} contains '..'"));
        }
        fd = openat(fd.as_fd(), c, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| format!("{rel}: component {c:?}: {e}"))?;
    }
    Ok(fd)
}

fn split_parent(rel: &str) -> Result<(&str, &str), String> {
    let rel = rel.trim_matches('/');
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("{rel:?} names no directory"));
    }
    Ok((parent, name))
}

/// Read the marker of directory `rel` beneath the root, without following symlinks.
pub fn read_marker(root: &Path, rel: &str) -> Result<Option<Marker>, String> {
    let root_fd = open_root(root)?;
    let dir = open_beneath(&root_fd, rel)?;
    read_marker_in(&dir, rel)
}

/// The marker of an already opened directory (`rel` only names it in errors).
fn read_marker_in(dir: &OwnedFd, rel: &str) -> Result<Option<Marker>, String> {
    let fd = match openat(dir.as_fd(), MARKER, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(format!("{rel}/{MARKER}: {e}")),
    };
    let mut text = String::new();
    std::io::Read::read_to_string(&mut fs::File::from(fd), &mut text).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map(Some).map_err(|e| format!("{rel}/{MARKER}: {e}"))
}

/// Write the marker into directory `rel` (creating it beneath the root) for `uid`.
#[cfg_attr(not(test), allow(dead_code, reason = "the downloader writes markers; no scheme has one built in yet"))]
pub fn write_marker(root: &Path, rel: &str, marker: &Marker) -> Result<(), String> {
    let root_fd = open_root(root)?;
    let mut fd = root_fd.try_clone().map_err(|e| e.to_string())?;
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(format!("{rel:?} contains '..'"));
        }
        match mkdirat(fd.as_fd(), c, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(format!("{rel}: mkdir {c:?}: {e}")),
        }
        fd = openat(fd.as_fd(), c, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| format!("{rel}: component {c:?}: {e}"))?;
    }
    let tmp = format!("{MARKER}.tmp");
    let file = openat(
        fd.as_fd(),
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )
    .map_err(|e| format!("{rel}/{tmp}: {e}"))?;
    let text = serde_json::to_string(marker).expect("marker serialises");
    std::io::Write::write_all(&mut fs::File::from(file), text.as_bytes()).map_err(|e| e.to_string())?;
    renameat(fd.as_fd(), tmp.as_str(), fd.as_fd(), MARKER).map_err(|e| format!("{rel}/{MARKER}: {e}"))
}

/// Move directory `rel` (beneath the root) to the trash as `trash_name`, only if it is a real
/// directory whose marker names `uid`. A missing directory is already gone: success.
pub fn trash_dir(root: &Path, rel: &str, uid: &Uid, trash_name: &str) -> Result<(), String> {
    if trash_name.contains('/') || trash_name.starts_with('.') {
        return Err(format!("bad trash name {trash_name:?}"));
    }
    let (parent, name) = split_parent(rel)?;
    let root_fd = open_root(root)?;
    let parent_fd = match open_beneath(&root_fd, parent) {
        Ok(fd) => fd,
        Err(e) if e.contains("ENOENT") => return Ok(()),
        Err(e) => return Err(e),
    };
    match fstatat(parent_fd.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(nix::errno::Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(format!("{rel}: {e}")),
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR => {
            return Err(format!("{rel} is not a directory (a symlink or file is never moved)"));
        }
        Ok(_) => {}
    }
    // The marker is read through the same parent fd the rename uses, not a second walk by name.
    let dir = openat(parent_fd.as_fd(), name, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| format!("{rel}: {e}"))?;
    match read_marker_in(&dir, rel)? {
        Some(m) if m.uid == uid.as_str() => {}
        Some(m) => return Err(format!("{rel} belongs to uid {}, not {uid}: left alone", m.uid)),
        None => return Err(format!("{rel} has no ownership marker: left alone")),
    }
    match mkdirat(root_fd.as_fd(), TRASH, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
        Err(e) => return Err(format!("{TRASH}: {e}")),
    }
    let trash_fd = open_beneath(&root_fd, TRASH)?;
    renameat(parent_fd.as_fd(), name, trash_fd.as_fd(), trash_name)
        .map_err(|e| format!("{rel} -> {TRASH}/{trash_name}: {e}"))
}

/// Delete one trash entry for good. The trash folder is the agent's own; the entry is removed
/// with `remove_dir_all`, which does not follow symlinks inside it.
pub fn purge_trash(root: &Path, name: &str) -> Result<(), String> {
    if name.contains('/') || name.is_empty() || name.starts_with('.') {
        return Err(format!("bad trash name {name:?}"));
    }
    let trash = root.join(TRASH);
    match fs::symlink_metadata(&trash) {
        Ok(m) if m.file_type().is_symlink() => return Err(format!("{} is a symlink: refused", trash.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.to_string()),
        Ok(_) => {}
    }
    let path = trash.join(name);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(m) if m.is_dir() => fs::remove_dir_all(&path).map_err(|e| format!("{}: {e}", path.display())),
        Ok(_) => fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display())),
    }
}

/// Directories carrying a marker beneath the root (bounded depth and count), and trash entries.
pub fn scan(root: &Path) -> (Vec<OwnedDir>, Vec<String>) {
    let mut owned = Vec::new();
    let mut stack: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
    let mut visited = 0;
    while let Some((rel, depth)) = stack.pop() {
        visited += 1;
        if visited > SCAN_DIRS_MAX {
            break;
        }
        let Ok(entries) = fs::read_dir(root.join(&rel)) else { continue };
        for entry in entries.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            if depth == 0 && name == TRASH {
                continue;
            }
            let child = rel.join(&name);
            if ft.is_file() && name == MARKER {
                if let Some(rel_str) = rel.to_str()
                    && let Ok(Some(m)) = read_marker(root, rel_str)
                {
                    owned.push(OwnedDir { path: rel_str.to_string(), uid: Uid::new(&m.uid) });
                }
            } else if ft.is_dir() && depth < SCAN_DEPTH_MAX {
                stack.push((child, depth + 1));
            }
        }
    }
    owned.sort();
    let trash = fs::read_dir(root.join(TRASH))
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect())
        .unwrap_or_default();
    (owned, trash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("model-agent-fsops-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn marker(uid: &str) -> Marker {
        Marker { uid: uid.into(), key: "ClusterBaseModel/m".into() }
    }

    #[test]
    fn probe_reports_a_writable_directory_and_a_missing_one() {
        let root = tmp("probe");
        let p = probe_root(&root);
        assert!(p.exists && p.is_dir && p.readable && p.writable, "{p:?}");
        let p = probe_root(&root.join("missing"));
        assert!(!p.exists && p.detail.contains("No such file"));
        fs::write(root.join("file"), b"x").unwrap();
        assert!(!probe_root(&root.join("file")).is_dir);
    }

    #[test]
    fn verify_local_checks_a_readable_directory() {
        let root = tmp("verify");
        assert!(verify_local(&root).is_ok());
        assert!(verify_local(&root.join("nope")).unwrap_err().contains("No such file"));
    }

    #[test]
    fn owned_directories_are_found_trashed_and_purged() {
        let root = tmp("trash");
        write_marker(&root, "a/b", &marker("u1")).unwrap();
        fs::write(root.join("a/b/weights.bin"), b"w").unwrap();
        write_marker(&root, "c", &marker("u2")).unwrap();
        let (owned, trash) = scan(&root);
        assert_eq!(
            owned,
            vec![
                OwnedDir { path: "a/b".into(), uid: Uid::new("u1") },
                OwnedDir { path: "c".into(), uid: Uid::new("u2") },
            ]
        );
        assert!(trash.is_empty());
        // Another uid's directory is left alone.
        assert!(trash_dir(&root, "a/b", &Uid::new("u2"), "u2-1").unwrap_err().contains("belongs to uid u1"));
        trash_dir(&root, "a/b", &Uid::new("u1"), "u1-1").unwrap();
        assert!(!root.join("a/b").exists());
        assert!(root.join(TRASH).join("u1-1/weights.bin").exists());
        let (owned, trash) = scan(&root);
        assert_eq!(owned.len(), 1);
        assert_eq!(trash, vec!["u1-1".to_string()]);
        // Trashing again is a no-op; purging removes it for good.
        trash_dir(&root, "a/b", &Uid::new("u1"), "u1-2").unwrap();
        purge_trash(&root, "u1-1").unwrap();
        assert!(!root.join(TRASH).join("u1-1").exists());
        assert!(purge_trash(&root, "../c").is_err());
    }

    #[test]
    fn symlinks_never_lead_a_trash_outside_the_root() {
        let root = tmp("symlink-root");
        let outside = tmp("symlink-outside");
        write_marker(&outside, "victim", &marker("u1")).unwrap();
        fs::write(outside.join("victim/precious"), b"keep").unwrap();
        // A symlinked parent component, and a symlink as the directory itself.
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("victim"), root.join("direct")).unwrap();
        let e = trash_dir(&root, "link/victim", &Uid::new("u1"), "t1").unwrap_err();
        assert!(e.contains("link"), "{e}");
        let e = trash_dir(&root, "direct", &Uid::new("u1"), "t2").unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
        assert!(trash_dir(&root, "../x", &Uid::new("u1"), "t3").is_err());
        assert_eq!(fs::read(outside.join("victim/precious")).unwrap(), b"keep");
        // The scan does not follow the links either.
        assert!(scan(&root).0.is_empty());
    }

    #[test]
    fn unmarked_directories_are_never_trashed() {
        let root = tmp("unmarked");
        fs::create_dir_all(root.join("user-data")).unwrap();
        let e = trash_dir(&root, "user-data", &Uid::new("u1"), "t").unwrap_err();
        assert!(e.contains("no ownership marker"));
        assert!(root.join("user-data").exists());
    }
}
