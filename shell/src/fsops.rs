//! The node's filesystem: models-root probes, `local://` checks, ownership markers, trash.
//!
//! Everything destructive is resolved beneath the models root's directory fd, one component at a
//! time with `O_NOFOLLOW`, so a symlink planted anywhere on the path cannot redirect a move or a
//! delete outside the root. A directory is only moved to the trash when its marker names the uid
//! being cleaned up.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{AccessFlags, UnlinkatFlags, access, unlinkat};

/// How every directory beneath the root is opened: never through a symlink.
pub(crate) const DIR_FLAGS: OFlag =
    OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

use model_agent_core::Uid;
use model_agent_core::dest_path::AGENT_NAME_PREFIX;
use model_agent_core::machine::{OwnedDir, RootProbe};

/// The marker file an agent writes into each directory it downloads.
pub const MARKER: &str = ".model-agent-owner";
/// A marker names a few uids (about 40 bytes each); a larger file in its place is not the agent's
/// and is never read whole.
pub const MARKER_BYTES_MAX: u64 = 4 << 20;
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
            return RootProbe {
                exists: false,
                is_dir: false,
                readable: false,
                writable: false,
                detail: e.to_string(),
                answered: true,
            };
        }
    };
    if !meta.is_dir() {
        return RootProbe {
            exists: true,
            is_dir: false,
            readable: false,
            writable: false,
            detail: "not a directory".into(),
            answered: true,
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
    RootProbe { exists: true, is_dir: true, readable, writable, detail, answered: true }
}

/// A `local://` directory must exist, be a directory and be readable. Never writes.
pub fn verify_local(path: &Path) -> Result<(), String> {
    let meta = fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    access(path, AccessFlags::R_OK | AccessFlags::X_OK).map_err(|e| format!("{}: not readable: {e}", path.display()))
}

/// The marker's content. A directory that several models share (same source, same path) names
/// every owner: `uid` first, the others in `co_owners` (absent from a marker of one owner, so
/// markers written before sharing read the same). `reserved` names the uids that carried the
/// reserve label when their download last ran (absent when none did, so markers written before
/// it read the same): a sweep after a delete no agent saw gives their directory up instead of
/// trashing it.
#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Marker {
    pub uid: String,
    pub key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub co_owners: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<String>,
}

impl Marker {
    pub fn new(uid: &str, key: &str, co_owners: &[String]) -> Marker {
        let mut co_owners: Vec<String> = co_owners.iter().filter(|u| *u != uid).cloned().collect();
        co_owners.sort();
        co_owners.dedup();
        Marker { uid: uid.to_string(), key: key.to_string(), co_owners, reserved: Vec::new() }
    }

    /// The same owners, recording as reserved those of its uids that `reserved` says are.
    pub fn reserving(mut self, reserved: impl Fn(&str) -> bool) -> Marker {
        let mut flagged: Vec<String> = self.uids().filter(|u| reserved(u)).map(str::to_string).collect();
        flagged.sort();
        self.reserved = flagged;
        self
    }

    /// Does the marker record `uid` as reserved?
    pub fn is_reserved(&self, uid: &str) -> bool {
        self.reserved.iter().any(|u| u == uid) && self.names(uid)
    }

    /// Every uid the marker names.
    pub fn uids(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.uid.as_str()).chain(self.co_owners.iter().map(String::as_str))
    }

    pub fn names(&self, uid: &str) -> bool {
        self.uids().any(|u| u == uid)
    }
}

/// The models root itself, as the operator gave it: a symlink there is followed (as the probe
/// and the `local://` check follow it; refusing it made the probe say Ready while nothing beneath
/// could be read or written). Everything beneath it is opened from this fd, never through one.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd, String> {
    open_root_errno(root).map_err(|e| format!("{}: {e}", root.display()))
}

/// `open_root`, its errno kept.
pub(crate) fn open_root_errno(root: &Path) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_CLOEXEC);
    nix::fcntl::open(root, flags, Mode::empty())
}

/// Why a directory beneath the root could not be opened: the call's errno (ENOENT: it is not
/// there) and a message naming the path. Matched on the errno, never on the message, which names
/// the path and may hold any text.
#[derive(Debug)]
pub(crate) struct BeneathError {
    pub errno: Errno,
    pub message: String,
}

impl BeneathError {
    pub fn is_gone(&self) -> bool {
        self.errno == Errno::ENOENT
    }
}

impl From<BeneathError> for String {
    fn from(e: BeneathError) -> String {
        e.message
    }
}

/// How every file beneath the root is opened: never through a symlink, and never waiting on a
/// pipe or a device (`O_NONBLOCK`; a pipe in a marker's or a weight's place blocked `open` for
/// good). Regular files ignore `O_NONBLOCK`.
const FILE_FLAGS: OFlag = OFlag::O_NOFOLLOW.union(OFlag::O_NONBLOCK).union(OFlag::O_CLOEXEC);

/// Why a file beneath the root could not be opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileError {
    Sys(Errno),
    /// A pipe, device or socket: never read or written.
    NotRegular,
}

impl std::fmt::Display for FileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FileError::Sys(e) => write!(f, "{e}"),
            FileError::NotRegular => f.write_str("not a regular file (a pipe, device or socket is never opened)"),
        }
    }
}

/// Opens `name` in `dir` with `flags` (read, write, create, ...) as a regular file only.
pub(crate) fn open_file_at(dir: &OwnedFd, name: &str, flags: OFlag, mode: Mode) -> Result<OwnedFd, FileError> {
    let fd = match openat(dir.as_fd(), name, flags | FILE_FLAGS, mode) {
        Ok(fd) => fd,
        // A pipe opened for writing with no reader, or a device without one behind it.
        Err(Errno::ENXIO) => return Err(FileError::NotRegular),
        Err(e) => return Err(FileError::Sys(e)),
    };
    let st = fstat(fd.as_fd()).map_err(FileError::Sys)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(FileError::NotRegular);
    }
    Ok(fd)
}

/// Open a directory `rel` beneath `root_fd`, one component at a time, refusing symlinks.
pub(crate) fn open_beneath(root_fd: &OwnedFd, rel: &str) -> Result<OwnedFd, BeneathError> {
    let failed = |errno: Errno, message: String| BeneathError { errno, message };
    let mut fd = root_fd.try_clone().map_err(|e| failed(Errno::EBADF, e.to_string()))?;
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(failed(Errno::EINVAL, format!("{rel:?} contains '..'")));
        }
        fd = openat(fd.as_fd(), c, DIR_FLAGS, Mode::empty())
            .map_err(|e| failed(e, format!("{rel}: component {c:?}: {e}")))?;
    }
    Ok(fd)
}

/// Open directory `rel` beneath `root_fd`, creating what is missing, one component at a time,
/// refusing symlinks.
pub(crate) fn create_beneath(root_fd: &OwnedFd, rel: &str) -> Result<OwnedFd, BeneathError> {
    let failed = |errno: Errno, message: String| BeneathError { errno, message };
    let mut fd = root_fd.try_clone().map_err(|e| failed(Errno::EBADF, e.to_string()))?;
    for c in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if c == ".." {
            return Err(failed(Errno::EINVAL, format!("{rel:?} contains '..'")));
        }
        match mkdirat(fd.as_fd(), c, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(failed(e, format!("{rel}: mkdir {c:?}: {e}"))),
        }
        fd = openat(fd.as_fd(), c, DIR_FLAGS, Mode::empty())
            .map_err(|e| failed(e, format!("{rel}: component {c:?}: {e}")))?;
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

/// The marker of an already opened directory (`rel` only names it in errors).
pub(crate) fn read_marker_in(dir: &OwnedFd, rel: &str) -> Result<Option<Marker>, String> {
    let fd = match open_file_at(dir, MARKER, OFlag::O_RDONLY, Mode::empty()) {
        Ok(fd) => fd,
        Err(FileError::Sys(Errno::ENOENT)) => return Ok(None),
        Err(e) => return Err(format!("{rel}/{MARKER}: {e}")),
    };
    let mut text = String::new();
    let mut file = std::io::Read::take(fs::File::from(fd), MARKER_BYTES_MAX + 1);
    std::io::Read::read_to_string(&mut file, &mut text).map_err(|e| format!("{rel}/{MARKER}: {e}"))?;
    if text.len() as u64 > MARKER_BYTES_MAX {
        return Err(format!("{rel}/{MARKER}: longer than {MARKER_BYTES_MAX} bytes: not the agent's"));
    }
    serde_json::from_str(&text).map(Some).map_err(|e| format!("{rel}/{MARKER}: {e}"))
}

/// Write the marker into directory `rel` (creating it beneath the root) for `uid`.
#[cfg_attr(not(test), allow(dead_code, reason = "the downloader writes markers; no scheme has one built in yet"))]
pub fn write_marker(root: &Path, rel: &str, marker: &Marker) -> Result<(), String> {
    let root_fd = open_root(root)?;
    let fd = create_beneath(&root_fd, rel)?;
    write_marker_in(&fd, rel, marker)
}

/// Every read-modify-write of a marker in this process holds this lock (downloads, disowns,
/// reserve records run on different threads): none can write back a marker another changed
/// since it read it.
static MARKER_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn marker_lock() -> std::sync::MutexGuard<'static, ()> {
    MARKER_WRITES.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `Op::RecordReserve`: the marker of `rel` records whether `uid` carries the reserve label,
/// the rest of it unchanged. No directory, no marker, or a marker that does not name `uid`:
/// nothing to record. A symlink in the path is refused.
pub fn record_reserve(root: &Path, rel: &str, uid: &Uid, reserved: bool) -> Result<(), String> {
    rewrite_marker_naming(root, rel, uid, |dir, marker| {
        if marker.is_reserved(uid.as_str()) == reserved {
            return Ok(());
        }
        let flag = |u: &str| if u == uid.as_str() { reserved } else { marker.is_reserved(u) };
        write_marker_in(dir, rel, &Marker::new(&marker.uid, &marker.key, &marker.co_owners).reserving(flag))
    })
}

/// `rewrite(dir, marker)` under the marker lock, for the marker of `rel` when it names `uid`;
/// no directory, no marker, or one that does not name `uid`: nothing to do. A symlink in the
/// path is refused.
fn rewrite_marker_naming(
    root: &Path,
    rel: &str,
    uid: &Uid,
    rewrite: impl FnOnce(&OwnedFd, Marker) -> Result<(), String>,
) -> Result<(), String> {
    let root_fd = open_root(root)?;
    let dir = match open_beneath(&root_fd, rel) {
        Ok(fd) => fd,
        Err(e) if e.is_gone() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let _lock = marker_lock();
    match read_marker_in(&dir, rel)?.filter(|m| m.names(uid.as_str())) {
        Some(marker) => rewrite(&dir, marker),
        None => Ok(()),
    }
}

/// `uid` gives directory `rel` up (a reserved model's weights, kept after its delete): the
/// marker keeps only the uids of `keep` it names (those that may be of live models), and is
/// removed when it names none, so no sweep takes the directory for an orphan's (a uid left over
/// of a model gone would make it one). The files are never touched. No directory, no marker, or
/// a marker that does not name `uid`: nothing to do. A symlink in the path is refused.
pub fn disown_dir(root: &Path, rel: &str, uid: &Uid, keep: &[Uid]) -> Result<(), String> {
    rewrite_marker_naming(root, rel, uid, |dir, marker| {
        let kept = |u: &&str| *u != uid.as_str() && keep.iter().any(|k| k.as_str() == *u);
        let rest: Vec<String> = marker.uids().filter(kept).map(str::to_string).collect();
        match rest.split_first() {
            None => {
                unlinkat(dir.as_fd(), MARKER, UnlinkatFlags::NoRemoveDir).map_err(|e| format!("{rel}/{MARKER}: {e}"))
            }
            // The key names the model that first wrote the marker; it only appears in messages.
            Some((first, others)) => {
                let rest = Marker::new(first, &marker.key, others).reserving(|u| marker.is_reserved(u));
                write_marker_in(dir, rel, &rest)
            }
        }
    })
}

/// Replace the marker of an opened directory at once (a temporary file, synced, renamed over
/// it; the directory synced after): a power loss leaves the old marker or the new one, never an
/// empty one.
fn write_marker_in(fd: &OwnedFd, rel: &str, marker: &Marker) -> Result<(), String> {
    let tmp = format!("{MARKER}.tmp");
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
    let file = open_file_at(fd, tmp.as_str(), flags, Mode::from_bits_truncate(0o644))
        .map_err(|e| format!("{rel}/{tmp}: {e}"))?;
    let text = serde_json::to_string(marker).expect("marker serialises");
    let mut file = fs::File::from(file);
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(|e| format!("{rel}/{tmp}: {e}"))?;
    file.sync_all().map_err(|e| format!("{rel}/{tmp}: {e}"))?;
    renameat(fd.as_fd(), tmp.as_str(), fd.as_fd(), MARKER).map_err(|e| format!("{rel}/{MARKER}: {e}"))?;
    nix::unistd::fsync(fd.as_fd()).map_err(|e| format!("{rel}: {e}"))
}

/// Move directory `rel` (beneath the root) to the trash as `trash_name`, only if it is a real
/// directory whose marker names `uid`. A missing directory is already gone: success. The entry
/// that lands in the trash is compared (device and inode) with the directory whose marker was
/// read; if someone swapped it in between, it is moved back and nothing is trashed.
pub fn trash_dir(root: &Path, rel: &str, uid: &Uid, trash_name: &str) -> Result<(), String> {
    check_trash_name(trash_name)?;
    let (parent, name) = split_parent(rel)?;
    let root_fd = open_root(root)?;
    let parent_fd = match open_beneath(&root_fd, parent) {
        Ok(fd) => fd,
        Err(e) if e.is_gone() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let dir = match openat(parent_fd.as_fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            return Err(format!("{rel} is not a directory (a symlink or file is never moved)"));
        }
        Err(e) => return Err(format!("{rel}: {e}")),
    };
    match read_marker_in(&dir, rel)? {
        Some(m) if m.names(uid.as_str()) => no_other_model_beneath(&dir, rel, &m)?,
        Some(m) => return Err(format!("{rel} belongs to uid {}, not {uid}: left alone", m.uid)),
        None => return Err(format!("{rel} has no ownership marker: left alone")),
    }
    let checked = identity(fstat(dir.as_fd()).map_err(|e| format!("{rel}: {e}"))?);
    match mkdirat(root_fd.as_fd(), TRASH, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(format!("{TRASH}: {e}")),
    }
    let trash_fd = open_trash(&root_fd)?.ok_or(format!("{TRASH} vanished"))?;
    move_if_still(checked, (&parent_fd, name), (&trash_fd, trash_name), rel)
}

/// Directories beneath one being trashed that are looked through for another model's marker, at
/// most: past it the directory is left alone.
pub const TRASH_CHECK_DIRS_MAX: usize = 100_000;

/// Refuses when a directory beneath `dir` (about to be trashed, its marker `marker`) carries a
/// marker naming a uid that `marker` does not: another model's weights at a path nested inside
/// (`a/b` inside `a`), which the trash would take along. A review found the purge deleting them.
/// Walked from `dir`'s fd one component at a time, never through a symlink.
fn no_other_model_beneath(dir: &OwnedFd, rel: &str, marker: &Marker) -> Result<(), String> {
    let mut stack: Vec<(String, usize)> = vec![(String::new(), 0)];
    let mut visited = 0;
    while let Some((sub, depth)) = stack.pop() {
        visited += 1;
        if visited > TRASH_CHECK_DIRS_MAX || depth > REMOVE_DEPTH_MAX {
            return Err(format!(
                "{rel}: too many or too deep directories to look through for other models' markers: left alone"
            ));
        }
        let at = open_beneath(dir, &sub)?;
        let path = |name: &str| if sub.is_empty() { name.to_string() } else { format!("{sub}/{name}") };
        if !sub.is_empty()
            && let Some(other) = read_marker_in(&at, &format!("{rel}/{sub}"))?
            && let Some(uid) = other.uids().find(|u| !marker.names(u))
        {
            return Err(format!(
                "{rel}/{sub} holds the weights of uid {uid}, which {rel}'s marker does not name: left alone"
            ));
        }
        let entries = list_entries(&at, SCAN_ENTRIES_PER_DIR_MAX)?;
        if entries.len() >= SCAN_ENTRIES_PER_DIR_MAX {
            return Err(format!(
                "{rel}/{sub}: more than {SCAN_ENTRIES_PER_DIR_MAX} entries to look through: left alone"
            ));
        }
        for (name, listed) in entries {
            if entry_type(&at, &name, listed) == Some(Type::Directory) && !name.starts_with(AGENT_NAME_PREFIX) {
                stack.push((path(&name), depth + 1));
            }
        }
    }
    Ok(())
}

/// Rename `from` to `to` (never over an existing entry), then make sure what moved is the
/// directory `checked` identified (device and inode); if someone swapped another one in since,
/// move it back and trash nothing.
fn move_if_still(
    checked: (u64, u64),
    (from_fd, from): (&OwnedFd, &str),
    (to_fd, to): (&OwnedFd, &str),
    rel: &str,
) -> Result<(), String> {
    renameat2(from_fd.as_fd(), from, to_fd.as_fd(), to, RenameFlags::RENAME_NOREPLACE)
        .map_err(|e| format!("{rel} -> {TRASH}/{to}: {e}"))?;
    let moved = fstatat(to_fd.as_fd(), to, AtFlags::AT_SYMLINK_NOFOLLOW).map(identity);
    if moved != Ok(checked) {
        let back = renameat2(to_fd.as_fd(), to, from_fd.as_fd(), from, RenameFlags::RENAME_NOREPLACE);
        return Err(format!("{rel} was replaced while being trashed: moved back ({back:?}), nothing trashed"));
    }
    Ok(())
}

/// Delete one trash entry for good, walking from the root's fd: the trash folder is opened
/// with `O_NOFOLLOW | O_DIRECTORY` (a symlink in its place is refused) and every entry beneath
/// it is removed with `unlinkat` relative to its parent's fd, so nothing outside is reached.
pub fn purge_trash(root: &Path, name: &str) -> Result<(), String> {
    check_trash_name(name)?;
    let root_fd = open_root(root)?;
    match open_trash(&root_fd)? {
        None => Ok(()),
        Some(trash_fd) => remove_tree_at(&trash_fd, name, 0).map_err(|e| format!("{TRASH}/{name}: {e}")),
    }
}

/// Trash entries are named by the core: one plain component, never hidden.
fn check_trash_name(name: &str) -> Result<(), String> {
    if name.contains('/') || name.is_empty() || name.starts_with('.') {
        return Err(format!("bad trash name {name:?}"));
    }
    Ok(())
}

/// How deep `remove_tree_at` descends at most (each level holds one descriptor).
pub const REMOVE_DEPTH_MAX: usize = 64;
/// Names read from one directory before removing them (then the directory is read again).
const REMOVE_BATCH_NAMES_MAX: usize = 1_024;

// Every repo path the downloader accepts is one the purge removes.
const _: () = assert!(crate::hf::REPO_PATH_COMPONENTS_MAX + 2 < REMOVE_DEPTH_MAX);

/// Remove `name` beneath `parent` and everything in it, never following a symlink: a symlink is
/// unlinked itself, a directory is opened with `O_NOFOLLOW` and emptied through its own fd.
pub(crate) fn remove_tree_at(parent: &OwnedFd, name: &str, depth: usize) -> Result<(), String> {
    remove_raw_tree_at(parent, OsStr::new(name), depth)
}

/// `remove_tree_at` for any name, UTF-8 or not: what a user put in a model's directory is
/// removed with it (a name the listing skipped left the directory never empty, for good).
fn remove_raw_tree_at(parent: &OwnedFd, name: &OsStr, depth: usize) -> Result<(), String> {
    let shown = name.to_string_lossy();
    let dir = match openat(parent.as_fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        // Not a directory (a file, or a symlink that O_NOFOLLOW refused): unlink the entry itself.
        Err(Errno::ELOOP | Errno::ENOTDIR) => return unlink_entry(parent, name, UnlinkatFlags::NoRemoveDir),
        Err(e) => return Err(format!("{shown}: {e}")),
    };
    if depth >= REMOVE_DEPTH_MAX {
        return Err(format!("{shown}: deeper than {REMOVE_DEPTH_MAX} levels: left for an operator"));
    }
    loop {
        let names = list_raw_names(&dir, REMOVE_BATCH_NAMES_MAX)?;
        if names.is_empty() {
            break;
        }
        for child in &names {
            remove_raw_tree_at(&dir, child, depth + 1).map_err(|e| format!("{shown}/{e}"))?;
        }
    }
    unlink_entry(parent, name, UnlinkatFlags::RemoveDir)
}

fn unlink_entry(parent: &OwnedFd, name: &OsStr, flags: UnlinkatFlags) -> Result<(), String> {
    match unlinkat(parent.as_fd(), name, flags) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(format!("{}: {e}", name.to_string_lossy())),
    }
}

/// Up to `names_max` entry names of an open directory (not `.` or `..`), as bytes.
fn list_raw_names(dir: &OwnedFd, names_max: usize) -> Result<Vec<OsString>, String> {
    let fd = dir.try_clone().map_err(|e| e.to_string())?;
    let mut d = Dir::from_fd(fd).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push(OsStr::from_bytes(name).to_os_string());
        if out.len() >= names_max {
            break;
        }
    }
    Ok(out)
}

/// Up to `names_max` entry names of an open directory (not `.` or `..`), read through a
/// duplicate of its fd.
pub(crate) fn list_names(dir: &OwnedFd, names_max: usize) -> Result<Vec<String>, String> {
    Ok(list_entries(dir, names_max)?.into_iter().map(|(name, _)| name).collect())
}

/// Up to `names_max` entries of an open directory with their types where the filesystem
/// reports them. Names that are not UTF-8 are skipped: the agent never created them.
fn list_entries(dir: &OwnedFd, names_max: usize) -> Result<Vec<(String, Option<Type>)>, String> {
    let fd = dir.try_clone().map_err(|e| e.to_string())?;
    let mut d = Dir::from_fd(fd).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| e.to_string())?;
        let Ok(name) = entry.file_name().to_str() else { continue };
        if name == "." || name == ".." {
            continue;
        }
        out.push((name.to_string(), entry.file_type()));
        if out.len() >= names_max {
            break;
        }
    }
    Ok(out)
}

/// The trash folder beneath the root, opened with `O_NOFOLLOW | O_DIRECTORY`; `None` if absent.
fn open_trash(root_fd: &OwnedFd) -> Result<Option<OwnedFd>, String> {
    match openat(root_fd.as_fd(), TRASH, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP | Errno::ENOTDIR) => Err(format!("{TRASH} is not a directory (a symlink is refused)")),
        Err(e) => Err(format!("{TRASH}: {e}")),
    }
}

fn identity(st: FileStat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

/// Trash entries read at most per snapshot.
pub const TRASH_ENTRIES_MAX: usize = 10_000;

/// Directories carrying a marker beneath the root (bounded depth and count), trash entries, and
/// the directories the walk could not read (`DriftSnapshot::unread`: `""` for the root itself or
/// a walk stopped at its limit), where a marker may have been missed. Every directory is opened
/// from the root's fd one component at a time with `O_NOFOLLOW`.
pub fn scan(root: &Path) -> (Vec<OwnedDir>, Vec<String>, Vec<String>) {
    let Ok(root_fd) = open_root(root) else { return (Vec::new(), Vec::new(), vec![String::new()]) };
    let (mut owned, mut unread) = (Vec::new(), Vec::new());
    let mut stack: Vec<(String, usize)> = vec![(String::new(), 0)];
    let mut visited = 0;
    while let Some((rel, depth)) = stack.pop() {
        visited += 1;
        if visited > SCAN_DIRS_MAX || unread.len() >= SCAN_UNREAD_MAX {
            unread = vec![String::new()];
            break;
        }
        let entries = open_beneath(&root_fd, &rel)
            .ok()
            .and_then(|dir| Some((list_entries(&dir, SCAN_ENTRIES_PER_DIR_MAX).ok()?, dir)));
        let Some((entries, dir)) = entries else {
            unread.push(rel);
            continue;
        };
        // A listing cut at its limit may have left out a marker or a directory.
        if entries.len() >= SCAN_ENTRIES_PER_DIR_MAX {
            unread.push(rel.clone());
        }
        // Opened by name, not looked for in the listing: a marker rewritten (renamed over)
        // while the directory is listed may be left out of the listing on some filesystems.
        match read_marker_in(&dir, &rel) {
            Ok(Some(m)) => {
                let dir = |uid: &str| OwnedDir { path: rel.clone(), uid: Uid::new(uid), reserved: m.is_reserved(uid) };
                owned.extend(m.uids().map(dir));
            }
            Ok(None) => {}
            Err(_) => unread.push(rel.clone()),
        }
        for (name, kind) in entries {
            if (depth == 0 && name == TRASH) || name == MARKER {
                continue;
            }
            let child = |name: String| if rel.is_empty() { name } else { format!("{rel}/{name}") };
            match entry_type(&dir, &name, kind) {
                // Shared copies moved to another disk behind a symlink: never followed, so what
                // they hold is unknown, not gone (their models keep their fetch). Elsewhere a
                // symlink is most often a model's link to its copy: not reported, or a node of
                // a thousand models would count its whole root unread.
                Some(Type::Symlink) => {
                    let link = child(name);
                    if model_agent_core::machine::shared::in_artifacts(&link) {
                        unread.push(link);
                    }
                }
                // Below the deepest level walked, a directory is not read: unknown, not empty.
                Some(Type::Directory) => match depth < SCAN_DEPTH_MAX {
                    true => stack.push((child(name), depth + 1)),
                    false => unread.push(child(name)),
                },
                _ => {}
            }
        }
    }
    owned.sort();
    unread.sort();
    let trash = match open_trash(&root_fd) {
        Ok(Some(fd)) => list_names(&fd, TRASH_ENTRIES_MAX).unwrap_or_default(),
        _ => Vec::new(),
    };
    (owned, trash, unread)
}

/// Directories a scan reports it could not read at most; past this, the whole root counts as
/// unread.
pub const SCAN_UNREAD_MAX: usize = 1_000;

/// Entries read from one directory at most by a snapshot scan.
pub const SCAN_ENTRIES_PER_DIR_MAX: usize = 100_000;

/// An entry's type as the listing gave it, else from one `fstatat` that never follows a link
/// (anything neither a directory nor a symlink is then `File`); `None` when neither tells.
fn entry_type(dir: &OwnedFd, name: &str, listed: Option<Type>) -> Option<Type> {
    listed.or_else(|| {
        let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => Some(Type::Directory),
            SFlag::S_IFLNK => Some(Type::Symlink),
            _ => Some(Type::File),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("model-agent-fsops-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn marker(uid: &str) -> Marker {
        Marker::new(uid, "ClusterBaseModel/m", &[])
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
        let (owned, trash, _) = scan(&root);
        assert_eq!(
            owned,
            vec![
                OwnedDir { path: "a/b".into(), uid: Uid::new("u1"), reserved: false },
                OwnedDir { path: "c".into(), uid: Uid::new("u2"), reserved: false },
            ]
        );
        assert!(trash.is_empty());
        // Another uid's directory is left alone.
        assert!(trash_dir(&root, "a/b", &Uid::new("u2"), "u2-1").unwrap_err().contains("belongs to uid u1"));
        trash_dir(&root, "a/b", &Uid::new("u1"), "u1-1").unwrap();
        assert!(!root.join("a/b").exists());
        assert!(root.join(TRASH).join("u1-1/weights.bin").exists());
        let (owned, trash, _) = scan(&root);
        assert_eq!(owned.len(), 1);
        assert_eq!(trash, vec!["u1-1".to_string()]);
        // Trashing again is a no-op; purging removes it for good.
        trash_dir(&root, "a/b", &Uid::new("u1"), "u1-2").unwrap();
        purge_trash(&root, "u1-1").unwrap();
        assert!(!root.join(TRASH).join("u1-1").exists());
        assert!(purge_trash(&root, "../c").is_err());
    }

    #[test]
    fn a_marker_of_several_owners_is_scanned_for_each_and_trashed_by_any() {
        let root = tmp("co-owned");
        write_marker(&root, "m", &Marker::new("u2", "BaseModel/ns/m", &["u1".into(), "u2".into()])).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u2","key":"BaseModel/ns/m","co_owners":["u1"]}"#);
        let (owned, _, _) = scan(&root);
        let uids: Vec<&str> = owned.iter().map(|d| d.uid.as_str()).collect();
        assert_eq!(uids, vec!["u1", "u2"]);
        assert!(trash_dir(&root, "m", &Uid::new("u3"), "u3-1").is_err());
        trash_dir(&root, "m", &Uid::new("u1"), "u1-1").unwrap();
        assert!(!root.join("m").exists());
        // A marker of one owner is written as before sharing (no co_owners key).
        write_marker(&root, "n", &marker("u1")).unwrap();
        let text = fs::read_to_string(root.join("n").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u1","key":"ClusterBaseModel/m"}"#);
    }

    /// The marker records reserved uids byte for byte as written, reads markers written before
    /// it did, and the scan reports each uid's record; a disown keeps the records of the uids
    /// it keeps.
    #[test]
    fn a_marker_records_reserved_uids_and_the_scan_and_a_disown_keep_them() {
        let root = tmp("reserved-marker");
        let m = Marker::new("u1", "BaseModel/ns/m", &["u2".into(), "u3".into()]).reserving(|u| u != "u2");
        write_marker(&root, "m", &m).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u1","key":"BaseModel/ns/m","co_owners":["u2","u3"],"reserved":["u1","u3"]}"#);
        let old: Marker = serde_json::from_str(r#"{"uid":"u1","key":"BaseModel/ns/m"}"#).unwrap();
        assert_eq!(old, Marker::new("u1", "BaseModel/ns/m", &[]));
        // A record of a uid the marker does not name counts for nothing.
        let stray: Marker = serde_json::from_str(r#"{"uid":"u1","key":"k","reserved":["u9"]}"#).unwrap();
        assert!(!stray.is_reserved("u9") && !stray.is_reserved("u1"));
        let reserved = |owned: &[OwnedDir]| -> Vec<(String, bool)> {
            owned.iter().map(|d| (d.uid.as_str().to_string(), d.reserved)).collect()
        };
        let (owned, _, _) = scan(&root);
        assert_eq!(reserved(&owned), [("u1".into(), true), ("u2".into(), false), ("u3".into(), true)]);
        disown_dir(&root, "m", &Uid::new("u1"), &[Uid::new("u2"), Uid::new("u3")]).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u2","key":"BaseModel/ns/m","co_owners":["u3"],"reserved":["u3"]}"#);
        let (owned, _, _) = scan(&root);
        assert_eq!(reserved(&owned), [("u2".into(), false), ("u3".into(), true)]);
    }

    /// A reserve record changes only this uid's flag in a marker that names it, and writes
    /// nothing otherwise (no marker, no directory, another model's marker, the same record).
    #[test]
    fn recording_a_reserve_label_changes_only_that_uid_s_record() {
        let root = tmp("record-reserve");
        let m = Marker::new("u1", "BaseModel/ns/m", &["u2".into()]).reserving(|u| u == "u2");
        write_marker(&root, "m", &m).unwrap();
        record_reserve(&root, "m", &Uid::new("u1"), true).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u1","key":"BaseModel/ns/m","co_owners":["u2"],"reserved":["u1","u2"]}"#);
        record_reserve(&root, "m", &Uid::new("u2"), false).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u1","key":"BaseModel/ns/m","co_owners":["u2"],"reserved":["u1"]}"#);
        record_reserve(&root, "m", &Uid::new("u9"), true).unwrap();
        record_reserve(&root, "gone", &Uid::new("u1"), true).unwrap();
        fs::create_dir_all(root.join("unmarked")).unwrap();
        record_reserve(&root, "unmarked", &Uid::new("u1"), true).unwrap();
        assert!(!root.join("gone").exists() && !root.join("unmarked").join(MARKER).exists());
        assert_eq!(fs::read_to_string(root.join("m").join(MARKER)).unwrap(), text);
    }

    #[test]
    fn disowning_takes_the_uid_out_of_the_marker_and_never_touches_the_files() {
        let root = tmp("disown");
        // u2 stays; u3, of a model gone, goes with u1.
        write_marker(&root, "m", &Marker::new("u1", "BaseModel/ns/m", &["u2".into(), "u3".into()])).unwrap();
        fs::write(root.join("m/weights.bin"), b"w").unwrap();
        write_marker(&root, "a/b", &Marker::new("u1", "BaseModel/ns/b", &["u3".into()])).unwrap();
        fs::write(root.join("a/b/weights.bin"), b"w").unwrap();
        let keep = [Uid::new("u2"), Uid::new("u9")];
        disown_dir(&root, "m", &Uid::new("u1"), &keep).unwrap();
        let text = fs::read_to_string(root.join("m").join(MARKER)).unwrap();
        assert_eq!(text, r#"{"uid":"u2","key":"BaseModel/ns/m"}"#);
        disown_dir(&root, "a/b", &Uid::new("u1"), &keep).unwrap();
        assert!(!root.join("a/b").join(MARKER).exists());
        assert!(root.join("a/b/weights.bin").exists() && root.join("m/weights.bin").exists());
        let (owned, _, _) = scan(&root);
        assert_eq!(owned, vec![OwnedDir { path: "m".into(), uid: Uid::new("u2"), reserved: false }]);
        // Not named, no marker, no directory: nothing to do. No sweep can trash `a/b` now.
        disown_dir(&root, "m", &Uid::new("u9"), &[]).unwrap();
        disown_dir(&root, "a/b", &Uid::new("u1"), &[]).unwrap();
        disown_dir(&root, "gone", &Uid::new("u1"), &[]).unwrap();
        assert!(trash_dir(&root, "a/b", &Uid::new("u1"), "u1-1").unwrap_err().contains("no ownership marker"));
        assert_eq!(fs::read_to_string(root.join("m").join(MARKER)).unwrap(), text);
    }

    #[test]
    fn disowning_never_follows_a_symlink_out_of_the_root() {
        let root = tmp("disown-link");
        let outside = tmp("disown-outside");
        write_marker(&outside, "m", &marker("u1")).unwrap();
        std::os::unix::fs::symlink(outside.join("m"), root.join("m")).unwrap();
        assert!(disown_dir(&root, "m", &Uid::new("u1"), &[]).is_err());
        assert!(outside.join("m").join(MARKER).exists(), "the marker outside is left alone");
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

    /// What the scan could not read it says (a marker it cannot parse, a root it cannot open),
    /// so that the core takes the weights there as unknown, not gone; a symlink is not unread,
    /// and a clean walk reports nothing.
    #[test]
    fn the_scan_names_what_it_could_not_read() {
        let root = tmp("scan-unread");
        write_marker(&root, "a/ok", &marker("u1")).unwrap();
        fs::create_dir_all(root.join("b/torn")).unwrap();
        fs::write(root.join("b/torn").join(MARKER), b"{\"uid\":").unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("link")).unwrap();
        let (owned, _, unread) = scan(&root);
        assert_eq!(owned.len(), 1);
        assert_eq!(unread, ["b/torn"]);
        fs::remove_file(root.join("b/torn").join(MARKER)).unwrap();
        assert!(scan(&root).2.is_empty());
        let (owned, trash, unread) = scan(&root.join("no-such-root"));
        assert!(owned.is_empty() && trash.is_empty());
        assert_eq!(unread, [""], "the root itself");
        // Below the deepest level walked: the marker there is not read, and the scan says so.
        let deep = (1..=SCAN_DEPTH_MAX + 1).map(|d| format!("d{d}")).collect::<Vec<_>>().join("/");
        write_marker(&root, &deep, &marker("u9")).unwrap();
        let (owned, _, unread) = scan(&root);
        assert!(!owned.iter().any(|d| d.uid.as_str() == "u9"), "{owned:?}");
        assert_eq!(unread, std::slice::from_ref(&deep));
        // Shared copies behind a symlink (moved to another disk) are not followed: unread. A
        // model's link elsewhere (`link` above) is not reported.
        let elsewhere = tmp("scan-unread-elsewhere");
        fs::create_dir_all(elsewhere.join("org/repo/c1")).unwrap();
        fs::create_dir_all(root.join("_artifacts/o2")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("org"), root.join("_artifacts/org")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("org/repo"), root.join("_artifacts/o2/repo")).unwrap();
        let (_, _, unread) = scan(&root);
        assert_eq!(unread, ["_artifacts/o2/repo", "_artifacts/org", &deep]);
        fs::remove_dir_all(root.join("_artifacts")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("_artifacts")).unwrap();
        assert_eq!(scan(&root).2, ["_artifacts", &deep]);
    }

    #[test]
    fn unmarked_directories_are_never_trashed() {
        let root = tmp("unmarked");
        fs::create_dir_all(root.join("user-data")).unwrap();
        let e = trash_dir(&root, "user-data", &Uid::new("u1"), "t").unwrap_err();
        assert!(e.contains("no ownership marker"));
        assert!(root.join("user-data").exists());
    }

    /// How long each racer test races at most, and the attempts it makes at most (the review's
    /// racer won against a path-based purge after about 20,000 attempts).
    const RACE_TIME: Duration = Duration::from_secs(3);
    const RACE_ATTEMPTS_MAX: usize = 50_000;
    /// A loaded host can let the racer keep the trash a symlink for all of `RACE_TIME`: the
    /// purge race then goes on until one purge has landed, up to this long.
    const RACE_TIME_MAX: Duration = Duration::from_secs(30);

    /// A thread that swaps `place` between a real directory and a symlink to `target` until
    /// stopped. What the code under test removes is put back (a new directory, a new link).
    fn racer(place: PathBuf, target: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
        std::thread::spawn(move || {
            let parked = place.with_extension("parked");
            let link = place.with_extension("link");
            let mut swaps = 0;
            while !stop.load(Ordering::Relaxed) {
                if fs::symlink_metadata(&link).is_err() {
                    let _ = std::os::unix::fs::symlink(&target, &link);
                }
                if fs::symlink_metadata(&place).is_err() {
                    let _ = fs::create_dir(&place);
                }
                let _ = fs::rename(&place, &parked);
                let _ = fs::rename(&link, &place);
                std::thread::yield_now();
                let _ = fs::rename(&place, &link);
                let _ = fs::rename(&parked, &place);
                swaps += 1;
            }
            swaps
        })
    }

    fn precious(outside: &Path) -> PathBuf {
        let victim = outside.join("victim");
        fs::create_dir_all(&victim).unwrap();
        fs::write(victim.join("precious"), b"keep").unwrap();
        victim.join("precious")
    }

    #[test]
    fn a_racer_swapping_the_trash_folder_for_a_symlink_never_reaches_outside() {
        let root = tmp("race-trash");
        let outside = tmp("race-trash-outside");
        let keep = precious(&outside);
        fs::create_dir(root.join(TRASH)).unwrap();
        // The real trash folder, wherever the racer has moved it.
        let real = nix::fcntl::open(&root.join(TRASH), DIR_FLAGS, Mode::empty()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = racer(root.join(TRASH), outside.clone(), stop.clone());
        let (started, mut purged) = (Instant::now(), 0);
        for _ in 0..RACE_ATTEMPTS_MAX {
            let elapsed = started.elapsed();
            if (elapsed > RACE_TIME && purged > 0) || elapsed > RACE_TIME_MAX {
                break;
            }
            let _ = mkdirat(real.as_fd(), "victim", Mode::from_bits_truncate(0o755));
            if purge_trash(&root, "victim").is_ok() && fstatat(real.as_fd(), "victim", AtFlags::empty()).is_err() {
                purged += 1;
            } else if purged == 0 {
                // The racer may be off the CPU with the trash a symlink (a loaded host: CI once
                // ran out of attempts with 0 purges and 238 swaps): give it the CPU to swap back.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert!(keep.exists(), "a file outside the root was removed");
        assert!(purged > 0 && swaps > 0, "the race ran: {purged} purges, {swaps} swaps");
    }

    #[test]
    fn a_racer_swapping_a_directory_inside_a_trash_entry_never_reaches_outside() {
        let root = tmp("race-entry");
        let outside = tmp("race-entry-outside");
        let keep = precious(&outside);
        let entry = root.join(TRASH).join("entry");
        fs::create_dir_all(entry.join("sub")).unwrap();
        let entry_fd = nix::fcntl::open(&entry, DIR_FLAGS, Mode::empty()).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = racer(entry.join("sub"), outside.join("victim"), stop.clone());
        let started = Instant::now();
        let mut attempts = 0;
        while started.elapsed() < RACE_TIME && attempts < RACE_ATTEMPTS_MAX {
            attempts += 1;
            // Refill the real `sub` through the entry's fd, then purge the entry's contents
            // (not the entry: the racer keeps using it).
            let sub = openat(entry_fd.as_fd(), "sub", DIR_FLAGS, Mode::empty());
            if let Ok(sub) = sub {
                let _ = mkdirat(sub.as_fd(), "weights", Mode::from_bits_truncate(0o755));
            }
            let _ = remove_tree_at(&entry_fd, "sub", 1);
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        assert!(keep.exists(), "a file outside the root was removed");
        assert!(swaps > 0 && attempts > 0);
    }

    #[test]
    fn purge_refuses_a_symlinked_trash_and_removes_nested_trees_and_links_only() {
        let root = tmp("purge-tree");
        let outside = tmp("purge-tree-outside");
        let keep = precious(&outside);
        let entry = root.join(TRASH).join("e");
        fs::create_dir_all(entry.join("a/b/c")).unwrap();
        fs::write(entry.join("a/b/c/w.bin"), b"w").unwrap();
        std::os::unix::fs::symlink(outside.join("victim"), entry.join("a/link")).unwrap();
        purge_trash(&root, "e").unwrap();
        assert!(!entry.exists());
        assert!(keep.exists(), "the link was removed, not what it points at");
        // A symlink in the trash folder's place is refused, not followed.
        fs::remove_dir(root.join(TRASH)).unwrap();
        std::os::unix::fs::symlink(&outside, root.join(TRASH)).unwrap();
        assert!(purge_trash(&root, "victim").unwrap_err().contains("symlink is refused"));
        assert!(keep.exists());
        assert!(scan(&root).1.is_empty(), "the trash is not listed through a symlink");
    }

    #[test]
    fn a_directory_swapped_in_after_its_marker_was_read_is_moved_back() {
        // The swap between the marker check and the rename, made deterministic: the identity
        // checked is that of the owned directory, but what sits at the name is another one.
        let root = tmp("swapped");
        write_marker(&root, "owned", &marker("u1")).unwrap();
        fs::create_dir_all(root.join("m/intruder-content")).unwrap();
        let root_fd = open_root(&root).unwrap();
        let owned = fstatat(root_fd.as_fd(), "owned", AtFlags::AT_SYMLINK_NOFOLLOW).map(identity).unwrap();
        mkdirat(root_fd.as_fd(), TRASH, Mode::from_bits_truncate(0o700)).unwrap();
        let trash_fd = open_trash(&root_fd).unwrap().unwrap();
        let e = move_if_still(owned, (&root_fd, "m"), (&trash_fd, "t1"), "m").unwrap_err();
        assert!(e.contains("replaced while being trashed"), "{e}");
        assert!(root.join("m/intruder-content").is_dir(), "the swapped-in directory is back in place");
        assert!(!root.join(TRASH).join("t1").exists(), "nothing was trashed");
        // The same call with the right identity moves it.
        let intruder = fstatat(root_fd.as_fd(), "m", AtFlags::AT_SYMLINK_NOFOLLOW).map(identity).unwrap();
        move_if_still(intruder, (&root_fd, "m"), (&trash_fd, "t1"), "m").unwrap();
        assert!(root.join(TRASH).join("t1/intruder-content").is_dir() && !root.join("m").exists());
    }

    #[test]
    fn trashing_onto_a_taken_trash_name_never_replaces_it() {
        let root = tmp("swap-back");
        write_marker(&root, "m", &marker("u1")).unwrap();
        trash_dir(&root, "m", &Uid::new("u1"), "t1").unwrap();
        write_marker(&root, "m", &marker("u1")).unwrap();
        let e = trash_dir(&root, "m", &Uid::new("u1"), "t1").unwrap_err();
        assert!(e.contains("EEXIST") || e.contains("exists"), "{e}");
        assert!(root.join("m").exists() && root.join(TRASH).join("t1").exists());
    }

    /// Runs `work` on a thread of its own; `None` when it has not returned within `limit`.
    fn returns_within<T: Send + 'static>(limit: Duration, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(work());
        });
        rx.recv_timeout(limit).ok()
    }

    /// Opens a FIFO for writing without blocking, so that a reader stuck in open(2) returns.
    fn unblock_fifo(path: &Path) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path);
    }

    /// A FIFO named `.model-agent-owner` in any directory of the root (a user's own directory,
    /// no model's) makes the scan's open(2) of the marker block for good: the drift scan never
    /// returns, and every later scan is refused ("the one before has not returned").
    #[test]
    fn a_pipe_in_a_marker_s_place_never_hangs_the_scan() {
        let root = tmp("fifo-marker");
        write_marker(&root, "m", &marker("u1")).unwrap();
        fs::create_dir_all(root.join("user-data")).unwrap();
        let fifo = root.join("user-data").join(MARKER);
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        let r = root.clone();
        let scanned = returns_within(Duration::from_secs(5), move || scan(&r));
        unblock_fifo(&fifo);
        let (owned, _, unread) = scanned.expect("scan did not return within 5 s: blocked opening a FIFO marker");
        assert_eq!(owned.len(), 1);
        assert_eq!(unread, ["user-data"]);
    }

    /// A trash entry holding a name that is not UTF-8 (a user's file in a model directory, "names
    /// with odd bytes") is never purged: the listing skips the name, and the directory is then
    /// never empty (ENOTEMPTY), on every purge, for good.
    #[test]
    fn a_trash_entry_holding_a_name_that_is_not_utf8_is_purged() {
        use std::os::unix::ffi::OsStrExt;
        let root = tmp("purge-odd-name");
        let entry = root.join(TRASH).join("u1-1");
        fs::create_dir_all(entry.join("sub")).unwrap();
        fs::write(entry.join("weights.bin"), b"w").unwrap();
        fs::write(entry.join("sub").join(std::ffi::OsStr::from_bytes(b"caf\xe9.txt")), b"x").unwrap();
        let result = purge_trash(&root, "u1-1");
        assert_eq!(result, Ok(()), "the purge failed");
        assert!(!entry.exists(), "the trash entry is still there");
    }

    /// A review: two models whose paths nest (`a` for u1, `a/b` for u2, both downloads). u1's
    /// delete moved `a` to the trash with u2's weights in it (the trash read only `a`'s marker),
    /// and the purge deleted them.
    #[test]
    fn trashing_a_directory_never_takes_another_model_s_directory_inside_it() {
        let root = tmp("nested");
        write_marker(&root, "a", &marker("u1")).unwrap();
        fs::write(root.join("a/w1.bin"), b"1").unwrap();
        write_marker(&root, "a/b", &marker("u2")).unwrap();
        fs::write(root.join("a/b/w2.bin"), b"2").unwrap();
        let (owned, _, _) = scan(&root);
        assert_eq!(owned.len(), 2, "both are owned: {owned:?}");
        let result = trash_dir(&root, "a", &Uid::new("u1"), "u1-1");
        assert!(
            root.join("a/b/w2.bin").exists(),
            "u2's weights went to the trash with u1's directory (trash_dir: {result:?})"
        );
    }

    /// The "already gone" test matches "ENOENT" anywhere in the error text, which names the path:
    /// a directory named `ENOENT...` behind a symlink (or any other error) is taken for gone, and
    /// trash_dir/disown_dir report success without doing anything.
    #[test]
    fn an_error_on_a_path_naming_enoent_is_not_taken_for_gone() {
        let root = tmp("enoent-name");
        let outside = tmp("enoent-outside");
        write_marker(&outside, "m", &marker("u1")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("ENOENT-models")).unwrap();
        let result = trash_dir(&root, "ENOENT-models/m", &Uid::new("u1"), "t1");
        assert!(result.is_err(), "a symlinked parent was reported as trashed (Ok), nothing moved");
    }

    /// A models root given as a path whose last component is a symlink (`/mnt/models` ->
    /// `/data/models`): the probe (path-based, follows it) reports it ready and writable, while
    /// every fd-based operation opens it with O_NOFOLLOW and fails (ELOOP): the scan reads
    /// nothing, no marker is written, no download starts, and readiness says all is well.
    #[test]
    fn a_root_the_probe_calls_ready_is_one_the_scan_can_read() {
        let real = tmp("real-root");
        let link = real.with_extension("link");
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let probe = probe_root(&link);
        assert!(probe.readable && probe.writable, "{probe:?}");
        let written = write_marker(&link, "m", &marker("u1"));
        let (_, _, unread) = scan(&link);
        assert!(
            written.is_ok() && unread.is_empty(),
            "probe ready, yet marker write {written:?} and scan unread {unread:?}"
        );
    }

    /// A review: a Hub or store path 70 directories deep was downloaded, and once the model was
    /// deleted its trash entry was never purged (the purge stops at 64 levels). Repo paths now
    /// have at most 48 components, and one of the deepest is purged.
    #[test]
    fn every_tree_the_downloader_accepts_is_one_the_purge_removes() {
        let too_deep = format!("{}/w.bin", vec!["d"; 70].join("/"));
        assert!(crate::hf::check_repo_path(&too_deep).is_err());
        let deepest = format!("{}/w.bin", vec!["d"; crate::hf::REPO_PATH_COMPONENTS_MAX - 1].join("/"));
        crate::hf::check_repo_path(&deepest).unwrap();
        let root = tmp("deepest-purge");
        let entry = root.join(TRASH).join("u1-1").join("model");
        fs::create_dir_all(entry.join(Path::new(&deepest).parent().unwrap())).unwrap();
        fs::write(entry.join(&deepest), b"w").unwrap();
        assert_eq!(purge_trash(&root, "u1-1"), Ok(()));
        assert!(!root.join(TRASH).join("u1-1").exists());
    }
}
