//! The destination on disk, always through directory fds: the models root is opened once, every component
//! beneath it with `O_NOFOLLOW` (a symlink planted anywhere is refused, never followed), and every file is
//! opened, renamed and synced relative to its parent's fd.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::DownloadError;
use crate::fsops::{self, DIR_FLAGS, FileError, MARKER, Marker, open_file_at};
use crate::hf::RemoteFile;
use model_agent_core::dest_path::AGENT_NAME_PREFIX;

/// Partial files, beneath the destination (same filesystem as their final place).
pub(super) const PARTIAL_DIR: &str = ".model-agent-partial";
/// What a complete download holds (written last).
pub(super) const MANIFEST: &str = ".model-agent-manifest.json";
/// A manifest of a million files is about 100 MB; anything larger is not ours.
const MANIFEST_BYTES_MAX: u64 = 256 << 20;

/// The manifest of a complete download: the commit and every file with its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Manifest {
    pub repo_id: String,
    /// The revision the download asked for (the URI's branch, tag or commit; empty for an object
    /// store): with `repo_id`, the source as the core compares it. Absent in manifests written
    /// before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    pub commit: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ManifestFile {
    pub path: String,
    pub size: u64,
    /// The ETag of an object checked by size only (`RemoteFile::etag`): the version the file on
    /// disk is. Absent for any other file, and in manifests written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// The destination directory, opened beneath the models root.
pub(super) struct Dest {
    /// The models root as given (for messages).
    pub root: String,
    pub rel: String,
    pub dir: OwnedFd,
    /// Whether this call created the directory itself (so an early failure can remove it, still empty).
    pub created: bool,
    parent: OwnedFd,
    name: String,
}

pub(super) fn disk_error(what: &str, errno: Errno) -> DownloadError {
    match errno {
        Errno::EROFS => DownloadError::ReadOnly,
        Errno::ELOOP => DownloadError::Disk(format!("{what}: a symlink is in the way (never followed)")),
        errno => DownloadError::Disk(format!("{what}: {}", errno.desc())),
    }
}

fn file_error(what: &str, error: FileError) -> DownloadError {
    match error {
        FileError::Sys(errno) => disk_error(what, errno),
        FileError::NotRegular => DownloadError::Disk(format!("{what}: {error}")),
    }
}

fn io_error(what: &str, error: std::io::Error) -> DownloadError {
    match error.raw_os_error() {
        Some(code) => disk_error(what, Errno::from_raw(code)),
        None => DownloadError::Disk(format!("{what}: {error}")),
    }
}

/// Opens `rel` beneath `root`; creates missing components when `create`, else `None` if it is missing.
pub(super) fn open_dest(root: &Path, rel: &str, create: bool) -> Result<Option<Dest>, DownloadError> {
    let root_name = root.display().to_string();
    let mut parent = fsops::open_root_errno(root).map_err(|e| disk_error(&root_name, e))?;
    let components: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    let Some((last, parents)) = components.split_last() else {
        return Err(DownloadError::Disk(format!("{rel:?} names no directory beneath {root_name}")));
    };
    if components.contains(&"..") {
        return Err(DownloadError::Disk(format!("{rel:?} contains '..'")));
    }
    if components.iter().any(|c| c.starts_with(AGENT_NAME_PREFIX)) {
        return Err(DownloadError::Disk(format!("{rel:?} is inside a name the agent keeps for its own files")));
    }
    for component in parents {
        match open_dir_at(&parent, component, create, rel)? {
            Some((fd, _)) => parent = fd,
            None => return Ok(None),
        }
    }
    let Some((dir, created)) = open_dir_at(&parent, last, create, rel)? else { return Ok(None) };
    Ok(Some(Dest { root: root_name, rel: rel.to_owned(), dir, created, parent, name: (*last).to_owned() }))
}

/// One directory beneath `parent`, made first when `create` (mode 0755); says whether it was made here.
fn open_dir_at(
    parent: &OwnedFd,
    name: &str,
    create: bool,
    rel: &str,
) -> Result<Option<(OwnedFd, bool)>, DownloadError> {
    let mut created = false;
    if create {
        match mkdirat(parent.as_fd(), name, Mode::from_bits_truncate(0o755)) {
            Ok(()) => created = true,
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(disk_error(&format!("{rel}: mkdir {name:?}"), e)),
        }
    }
    match openat(parent.as_fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some((fd, created))),
        Err(Errno::ENOENT) if !create => Ok(None),
        Err(Errno::ENOTDIR | Errno::ELOOP) if is_symlink(parent, name) => {
            Err(DownloadError::Disk(format!("{rel}: {name:?} is a symlink (never followed)")))
        }
        Err(Errno::ENOTDIR) => Err(DownloadError::Disk(format!("{rel}: {name:?} is not a directory"))),
        Err(e) => Err(disk_error(&format!("{rel}: {name:?}"), e)),
    }
}

fn is_symlink(parent: &OwnedFd, name: &str) -> bool {
    let stat = fstatat(parent.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW);
    stat.is_ok_and(|st| {
        nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT
            == nix::sys::stat::SFlag::S_IFLNK
    })
}

impl Dest {
    pub fn read_marker(&self) -> Result<Option<Marker>, DownloadError> {
        fsops::read_marker_in(&self.dir, &self.rel).map_err(DownloadError::Disk)
    }

    /// Writes the marker (a synced temporary renamed over it), then syncs the directory.
    pub fn write_marker(&self, marker: &Marker) -> Result<(), DownloadError> {
        let text = serde_json::to_vec(marker).expect("a marker serialises");
        self.write_synced(MARKER, &text)
    }

    /// Removes the directory if this call created it and it is still empty (an early failure).
    pub fn remove_if_created(&self) {
        if self.created {
            let _ = unlinkat(self.parent.as_fd(), self.name.as_str(), UnlinkatFlags::RemoveDir);
        }
    }

    /// Bytes available to this agent on the destination's filesystem.
    pub fn free_bytes(&self) -> Result<u64, DownloadError> {
        #[cfg(test)]
        if let Some(free) = super::tests::free_bytes_seam(&self.root) {
            return Ok(free);
        }
        let stats = nix::sys::statvfs::fstatvfs(self.dir.as_fd()).map_err(|e| disk_error(&self.rel, e))?;
        Ok((stats.blocks_available() as u64).saturating_mul(stats.fragment_size() as u64))
    }

    pub fn read_manifest(&self) -> Option<Manifest> {
        serde_json::from_slice(&read_small_at(&self.dir, MANIFEST, MANIFEST_BYTES_MAX)?).ok()
    }

    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), DownloadError> {
        self.write_synced(MANIFEST, &serde_json::to_vec(manifest).expect("a manifest serialises"))
    }

    /// Removes the manifest (synced): from the first byte on, the directory is no longer that commit.
    pub fn remove_manifest(&self) -> Result<(), DownloadError> {
        match unlinkat(self.dir.as_fd(), MANIFEST, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => sync_dir(&self.dir, &self.rel),
            Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(disk_error(&format!("{}/{MANIFEST}", self.rel), e)),
        }
    }

    fn write_synced(&self, name: &str, bytes: &[u8]) -> Result<(), DownloadError> {
        write_synced_at(&self.dir, name, bytes, &self.rel)
    }

    /// The partial directory, made if missing (0700: what is in it is not verified yet).
    pub fn open_partial_dir(&self) -> Result<OwnedFd, DownloadError> {
        let made = match mkdirat(self.dir.as_fd(), PARTIAL_DIR, Mode::from_bits_truncate(0o700)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(disk_error(&format!("{}/{PARTIAL_DIR}", self.rel), e)),
        };
        let dir = openat(self.dir.as_fd(), PARTIAL_DIR, DIR_FLAGS, Mode::empty())
            .map_err(|e| disk_error(&format!("{}/{PARTIAL_DIR}", self.rel), e))?;
        // Without its stamp a directory reads as one from before the records (files kept by
        // size): one that cannot be stamped (a full root) is not left behind (a review).
        if made && let Err(error) = write_synced_at(&dir, PLACED_RECORDS_STAMP, b"", PARTIAL_DIR) {
            let _ = self.remove_partial_dir();
            return Err(error);
        }
        Ok(dir)
    }

    /// The partial directory if it is there (nothing is made).
    pub fn existing_partial_dir(&self) -> Option<OwnedFd> {
        openat(self.dir.as_fd(), PARTIAL_DIR, DIR_FLAGS, Mode::empty()).ok()
    }

    pub fn remove_partial_dir(&self) -> Result<(), DownloadError> {
        fsops::remove_tree_at(&self.dir, PARTIAL_DIR, 0).map_err(DownloadError::Disk)
    }

    /// The file at repo path `path` if it is a regular file (its parents real directories).
    pub fn open_existing(&self, path: &str) -> Option<File> {
        let (parent, name) = self.walk_parents(path, false).ok()??;
        open_file_at(&parent, name, OFlag::O_RDONLY, Mode::empty()).ok().map(File::from)
    }

    /// Whether every file of `manifest` is on disk with its size (no hashing).
    pub fn sizes_match(&self, manifest: &Manifest) -> bool {
        manifest.files.iter().all(|f| self.existing_size(&f.path) == Some(f.size))
    }

    pub fn existing_size(&self, path: &str) -> Option<u64> {
        self.open_existing(path).and_then(|file| file.metadata().ok()).map(|m| m.len())
    }

    /// Renames partial `partial_name` to repo path `path` (parents made beneath the destination, never
    /// through a symlink), then syncs the directory it landed in. The file itself was synced before.
    pub fn place(&self, partial_dir: &OwnedFd, partial_name: &str, path: &str) -> Result<(), DownloadError> {
        let what = format!("{}/{path}", self.rel);
        let (parent, name) = self.walk_parents(path, true)?.expect("parents are made");
        renameat(partial_dir.as_fd(), partial_name, parent.as_fd(), name).map_err(|e| disk_error(&what, e))?;
        sync_dir(&parent, &what)
    }

    /// The directory holding repo path `path` and its last component; `None` when a parent is missing
    /// and `create` is false.
    fn walk_parents<'p>(&self, path: &'p str, create: bool) -> Result<Option<(OwnedFd, &'p str)>, DownloadError> {
        let (parents, name) = path.rsplit_once('/').unwrap_or(("", path));
        let mut dir = self.dir.try_clone().map_err(|e| io_error(&self.rel, e))?;
        for component in parents.split('/').filter(|c| !c.is_empty()) {
            match open_dir_at(&dir, component, create, &format!("{}/{path}", self.rel))? {
                Some((fd, _)) => dir = fd,
                None => return Ok(None),
            }
        }
        Ok(Some((dir, name)))
    }
}

/// Writes `name` in `dir` whole or not at all: a synced temporary renamed over it, then the directory
/// synced (`what` names the directory in errors).
pub(super) fn write_synced_at(dir: &OwnedFd, name: &str, bytes: &[u8], what: &str) -> Result<(), DownloadError> {
    let tmp = format!("{name}.tmp");
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC;
    let fd = open_file_at(dir, tmp.as_str(), flags, Mode::from_bits_truncate(0o644))
        .map_err(|e| file_error(&format!("{what}/{tmp}"), e))?;
    let mut file = File::from(fd);
    file.write_all(bytes).and_then(|()| file.sync_all()).map_err(|e| io_error(&format!("{what}/{tmp}"), e))?;
    renameat(dir.as_fd(), tmp.as_str(), dir.as_fd(), name).map_err(|e| disk_error(&format!("{what}/{name}"), e))?;
    sync_dir(dir, what)
}

/// Reads a small file of `dir` (at most `bytes_max`); `None` if it is missing or unreadable.
pub(super) fn read_small_at(dir: &OwnedFd, name: &str, bytes_max: u64) -> Option<Vec<u8>> {
    let fd = open_file_at(dir, name, OFlag::O_RDONLY, Mode::empty()).ok()?;
    let mut bytes = Vec::new();
    File::from(fd).take(bytes_max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

fn sync_dir(dir: &OwnedFd, what: &str) -> Result<(), DownloadError> {
    let dup = dir.try_clone().map_err(|e| io_error(what, e))?;
    File::from(dup).sync_all().map_err(|e| io_error(what, e))
}

/// A partial file's name: a hash of its repo path and expected content, so a hostile or deep path never
/// becomes a name, and a file that changed between commits never resumes the other content's bytes.
/// An object checked by size only has no content hash: its size and its listed ETag stand in,
/// so that an object uploaded again never resumes the old one's bytes, whatever its size (a
/// checkpoint of the same shape has files of the same sizes).
pub(super) fn partial_name(file: &RemoteFile) -> String {
    let mut hasher = Sha256::new();
    hasher.update(file.path.as_bytes());
    hasher.update([0]);
    hasher.update(file.hash.expected_hex().as_bytes());
    if file.hash == crate::hf::FileHash::SizeOnly {
        hasher.update([0]);
        hasher.update(file.size_bytes.to_be_bytes());
        if let Some(etag) = &file.etag {
            hasher.update([0]);
            hasher.update(etag.as_bytes());
        }
    }
    hasher.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect()
}

/// Entries of the partial directory considered when it is tidied (it holds one or two per file
/// still to fetch and one per file placed: past this, the rest stay until the download ends).
const PARTIAL_NAMES_MAX: usize = 100_000;

/// The record, in the partial directory, that this download placed `file` as listed now: for an
/// object checked by size only, the version it was (its ETag is in the name).
fn placed_name(file: &RemoteFile) -> String {
    format!("{}.placed", partial_name(file))
}

/// In a partial directory whose files placed carry `.placed` records (written when it is made):
/// one made before them (an upgrade mid-download) has none, and what it placed is kept by size
/// once, then recorded.
const PLACED_RECORDS_STAMP: &str = "placed-records";

/// What a `.placed` record holds: the inode of the file it vouches for, so that it vouches for
/// no other file at that path (one written before the rename that places the file, which keeps
/// the inode, and the process killed in between). Not the device: NFS, overlayfs and btrfs
/// number it at mount time, and a reboot mid-download would make every record vouch for nothing
/// (a review); the record and the file are on one filesystem, the rename proves it.
fn inode_text(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    meta.ino().to_string()
}

/// Records that the file `meta` describes is `file` as listed now (only for an object checked
/// by size only whose ETag is known: nothing else needs it), and that this directory keeps such
/// records. Written before a fetched file is renamed into place: a kill in between leaves no
/// placed file without its record. A record that cannot be written costs a fetch again at the
/// next attempt, never a wrong file.
pub(super) fn record_placed(partial_dir: &OwnedFd, file: &RemoteFile, meta: &std::fs::Metadata) {
    if file.size_only_etag().is_some() {
        if !exists_at(partial_dir, PLACED_RECORDS_STAMP) {
            let _ = write_synced_at(partial_dir, PLACED_RECORDS_STAMP, b"", PARTIAL_DIR);
        }
        let _ = write_synced_at(partial_dir, &placed_name(file), inode_text(meta).as_bytes(), PARTIAL_DIR);
    }
}

/// The metadata of partial file `name`, for its record before it is placed.
pub(super) fn partial_metadata(partial_dir: &OwnedFd, name: &str) -> Option<std::fs::Metadata> {
    let fd = open_file_at(partial_dir, name, OFlag::O_RDONLY, Mode::empty()).ok()?;
    File::from(fd).metadata().ok()
}

/// May a file of `file`'s size found on disk, with no manifest to vouch for it, be kept as
/// `file`? An object checked by size only while a download is under way (its partial
/// directory there, keeping records) only if an attempt of it recorded it in place as the
/// version listed now: a file an earlier attempt placed from another upload of the same size
/// is not (a review: the model was left with files of two uploads). With no download under
/// way, it is adopted by size, as before (and recorded then: `Dest::record_kept`).
pub(super) fn size_only_placed_as_listed(
    partial_dir: Option<&OwnedFd>,
    file: &RemoteFile,
    on_disk: &std::fs::Metadata,
) -> bool {
    match (partial_dir, file.size_only_etag()) {
        (Some(dir), Some(_)) => {
            let record = read_small_at(dir, &placed_name(file), 64);
            // The inode only: the record is on the file's own filesystem (a rename put it there),
            // whose device number a remount may change.
            record.is_some_and(|r| r == inode_text(on_disk).as_bytes()) || !exists_at(dir, PLACED_RECORDS_STAMP)
        }
        _ => true,
    }
}

impl Dest {
    /// Removes from the partial directory whatever is for no file of `keep` (still to fetch, or
    /// placed): a partial of a version listed no more (another commit, an object uploaded again)
    /// would stay beside the new one's, counted against the space, until the download ends (a
    /// review: each upload during an unfinished download left one more, and the space check
    /// failed for good).
    pub fn remove_stale_partials(&self, todo: &[RemoteFile], placed: &[&RemoteFile]) {
        let Some(dir) = self.existing_partial_dir() else { return };
        let mut keep: std::collections::HashSet<String> = placed.iter().map(|f| placed_name(f)).collect();
        keep.insert(PLACED_RECORDS_STAMP.to_string());
        for name in todo.iter().map(partial_name) {
            keep.insert(format!("{name}.parts"));
            keep.insert(name);
        }
        let Ok(names) = fsops::list_names(&dir, PARTIAL_NAMES_MAX) else { return };
        for name in names.iter().filter(|name| !keep.contains(*name)) {
            remove_partial(&dir, name);
        }
    }

    /// With files still to fetch, what this attempt kept in place is recorded as the version
    /// listed now, so that the next attempt keeps it too (a review: a file kept by size, with no
    /// partial directory yet, was fetched again whole at the next attempt, and the space check
    /// could then fail for good).
    pub fn record_kept(&self, kept: &[&RemoteFile]) -> Result<(), DownloadError> {
        let dir = self.open_partial_dir()?;
        // Only an object checked by size only has a record: no other file is opened for one.
        for file in kept.iter().filter(|f| f.size_only_etag().is_some()) {
            if let Some(meta) = self.open_existing(&file.path).and_then(|f| f.metadata().ok()) {
                record_placed(&dir, file, &meta);
            }
        }
        Ok(())
    }
}

/// Opens (or creates) a file in the partial directory for reading and writing, never through a symlink.
pub(super) fn open_partial(partial_dir: &OwnedFd, name: &str) -> Result<File, DownloadError> {
    let flags = OFlag::O_RDWR | OFlag::O_CREAT;
    let fd = open_file_at(partial_dir, name, flags, Mode::from_bits_truncate(0o644))
        .map_err(|e| file_error(&format!("{PARTIAL_DIR}/{name}"), e))?;
    Ok(File::from(fd))
}

/// Bytes a partial file already holds on disk (allocated blocks: a preallocated file counts in full).
pub(super) fn partial_allocated_bytes(partial_dir: &OwnedFd, name: &str) -> u64 {
    fstatat(partial_dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| (st.st_blocks as u64).saturating_mul(512).min(st.st_size as u64))
        .unwrap_or(0)
}

/// Is there an entry `name` in `dir` (a symlink counts, unfollowed)?
pub(super) fn exists_at(dir: &OwnedFd, name: &str) -> bool {
    fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

/// Removes one file of the partial directory (missing is fine).
pub(super) fn remove_partial(partial_dir: &OwnedFd, name: &str) {
    let _ = unlinkat(partial_dir.as_fd(), name, UnlinkatFlags::NoRemoveDir);
}

#[cfg(test)]
mod hostile_tests {
    use super::*;

    /// A review: files of a model directory are opened O_RDONLY|O_NOFOLLOW without O_NONBLOCK (the
    /// type is checked after the open): a FIFO at a weights path blocks open(2) for good. The
    /// download planner calls this directly on one of the download runtime's 2 worker threads
    /// (`sizes_match`, `files_in_place`), so two such directories stall every download and resolve;
    /// cancelling cannot reach a thread blocked in the kernel.
    #[test]
    fn a_pipe_at_a_weights_path_never_hangs_the_size_check() {
        let root = tempfile::tempdir().unwrap();
        let dest = open_dest(root.path(), "m", true).unwrap().unwrap();
        let fifo = root.path().join("m/model.safetensors");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
        let file = ManifestFile { path: "model.safetensors".into(), size: 0, etag: None };
        let manifest = Manifest { repo_id: "o/r".into(), revision: None, commit: "c".into(), files: vec![file] };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(dest.sizes_match(&manifest));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
        }
        assert_eq!(got, Ok(false), "sizes_match did not return within 5 s: blocked opening a FIFO");
    }

    /// A review: a destination inside the trash folder was downloaded into, listed as a trash
    /// entry by the scan and purged. The core refuses such a path; the destination does too.
    #[test]
    fn a_destination_inside_the_agent_s_own_names_is_refused() {
        let root = tempfile::tempdir().unwrap();
        for rel in [".model-agent-trash/llama", "team/.model-agent-partial"] {
            let e = open_dest(root.path(), rel, true).err().expect(rel);
            assert!(e.to_string().contains("a name the agent keeps"), "{rel}: {e}");
        }
        assert!(!root.path().join(".model-agent-trash").exists(), "nothing made");
    }
}
