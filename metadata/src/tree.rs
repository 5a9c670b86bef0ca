//! What the parser needs from a model directory, as a trait the shell implements (through a
//! directory fd) and tests implement in memory. The crate itself does no I/O: it decides which
//! names to list and read, and how much, and keeps the budget.

use crate::limits::*;

/// One directory entry. `size_bytes` is only meaningful for files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    pub size_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    /// Symlinks, sockets, ...: never followed nor read.
    Other,
}

/// Why a read did not happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsError {
    NotFound,
    /// The file is larger than the caller's cap; nothing was read.
    TooLarge {
        size_bytes: u64,
        cap_bytes: u64,
    },
    DeadlineExceeded,
    Other(String),
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsError::NotFound => write!(f, "not found"),
            FsError::TooLarge { size_bytes, cap_bytes } => {
                write!(f, "{size_bytes} bytes is over the {cap_bytes}-byte cap; not read")
            }
            FsError::DeadlineExceeded => write!(f, "deadline exceeded"),
            FsError::Other(e) => write!(f, "{e}"),
        }
    }
}

/// A model directory, addressed by '/'-separated paths relative to its root ("" is the root).
pub trait ModelFiles {
    /// The entries of a directory, in any order.
    fn list_dir(&mut self, rel_dir: &str) -> Result<Vec<Entry>, FsError>;
    /// The whole file, or `TooLarge` without reading when it is over `cap_bytes`.
    fn read_file(&mut self, rel_path: &str, cap_bytes: u64) -> Result<Vec<u8>, FsError>;
    /// At most `len_bytes` from `offset_bytes` (fewer at end of file).
    fn read_range(&mut self, rel_path: &str, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError>;
}

/// Wraps a `ModelFiles` and enforces the per-parse budget, so no implementation can be led
/// into unbounded work by a hostile tree.
pub struct Budgeted<'a> {
    inner: &'a mut dyn ModelFiles,
    dirs_listed_count: usize,
    entries_seen_count: usize,
    read_bytes: u64,
}

impl<'a> Budgeted<'a> {
    pub fn new(inner: &'a mut dyn ModelFiles) -> Budgeted<'a> {
        Budgeted { inner, dirs_listed_count: 0, entries_seen_count: 0, read_bytes: 0 }
    }

    /// Sorted by name, so every search is deterministic (upstream walks lexically).
    pub fn list_dir(&mut self, rel_dir: &str) -> Result<Vec<Entry>, FsError> {
        if self.dirs_listed_count >= DIRS_LISTED_MAX_COUNT {
            return Err(FsError::Other(format!("more than {DIRS_LISTED_MAX_COUNT} directories listed")));
        }
        self.dirs_listed_count += 1;
        let mut entries = self.inner.list_dir(rel_dir)?;
        self.entries_seen_count += entries.len();
        if self.entries_seen_count > DIR_ENTRIES_SEEN_MAX_COUNT {
            return Err(FsError::Other(format!("more than {DIR_ENTRIES_SEEN_MAX_COUNT} directory entries")));
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    pub fn read_file(&mut self, rel_path: &str, cap_bytes: u64) -> Result<Vec<u8>, FsError> {
        let cap_bytes = cap_bytes.min(self.remaining_bytes());
        let data = self.inner.read_file(rel_path, cap_bytes)?;
        self.charge(data.len() as u64, cap_bytes)?;
        Ok(data)
    }

    pub fn read_range(&mut self, rel_path: &str, offset_bytes: u64, len_bytes: u64) -> Result<Vec<u8>, FsError> {
        if len_bytes > self.remaining_bytes() {
            return Err(FsError::Other(format!("the {TOTAL_READ_MAX_BYTES}-byte read budget is spent")));
        }
        let data = self.inner.read_range(rel_path, offset_bytes, len_bytes)?;
        self.charge(data.len() as u64, len_bytes)?;
        Ok(data)
    }

    fn remaining_bytes(&self) -> u64 {
        TOTAL_READ_MAX_BYTES.saturating_sub(self.read_bytes)
    }

    /// An implementation that returns more than asked is cut off here, not trusted.
    fn charge(&mut self, got_bytes: u64, cap_bytes: u64) -> Result<(), FsError> {
        if got_bytes > cap_bytes {
            return Err(FsError::TooLarge { size_bytes: got_bytes, cap_bytes });
        }
        self.read_bytes += got_bytes;
        Ok(())
    }
}

/// Join two relative paths.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_string() } else { format!("{dir}/{name}") }
}

/// The directory part of a relative path ("" for the root).
pub fn parent(rel_path: &str) -> &str {
    rel_path.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}
