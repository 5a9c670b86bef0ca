//! What a download has done so far, summed from each file's meter when a report is due.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::Progress;
use crate::hf::{Meter, RemoteFile};

/// One file still to fetch.
pub(super) struct FileSlot {
    pub size_bytes: u64,
    pub meter: Meter,
    pub placed: AtomicBool,
}

/// The commit's totals, the files found in place so far and the files in flight, shared with the tasks.
#[derive(Default)]
pub(super) struct Tally {
    pub total_bytes: u64,
    pub total_files: u64,
    /// Files in place before any transfer (kept or adopted), counted as they are checked.
    pub kept_bytes: AtomicU64,
    pub kept_files: AtomicU64,
    /// The files to fetch, once the plan is known.
    pub slots: OnceLock<Vec<Arc<FileSlot>>>,
}

impl Tally {
    pub fn new(files: &[RemoteFile]) -> Tally {
        let total_bytes = files.iter().map(|f| f.size_bytes).sum();
        Tally { total_bytes, total_files: files.len() as u64, ..Tally::default() }
    }

    /// A download found complete: everything counts as done.
    pub fn complete(total_files: u64, total_bytes: u64) -> Tally {
        let (kept_bytes, kept_files) = (AtomicU64::new(total_bytes), AtomicU64::new(total_files));
        Tally { total_bytes, total_files, kept_bytes, kept_files, slots: OnceLock::new() }
    }

    pub fn keep(&self, file: &RemoteFile) {
        self.kept_bytes.fetch_add(file.size_bytes, Ordering::Relaxed);
        self.kept_files.fetch_add(1, Ordering::Relaxed);
    }

    fn slots(&self) -> &[Arc<FileSlot>] {
        self.slots.get().map_or(&[], Vec::as_slice)
    }

    pub fn fetched_bytes(&self) -> u64 {
        self.slots().iter().map(|s| s.meter.fetched_bytes.load(Ordering::Relaxed)).sum()
    }

    /// (completed bytes, completed files) now.
    pub fn completed(&self) -> (u64, u64) {
        let mut bytes = self.kept_bytes.load(Ordering::Relaxed);
        let mut files = self.kept_files.load(Ordering::Relaxed);
        for slot in self.slots() {
            if slot.placed.load(Ordering::Relaxed) {
                bytes += slot.size_bytes;
                files += 1;
            } else {
                bytes += slot.meter.have_bytes.load(Ordering::Relaxed).min(slot.size_bytes);
            }
        }
        (bytes, files)
    }
}

/// Turns tallies into reports with the rate over the time since the previous one.
pub(super) struct Reporter {
    last_at: Instant,
    last_fetched_bytes: u64,
}

impl Reporter {
    pub fn new() -> Reporter {
        Reporter { last_at: Instant::now(), last_fetched_bytes: 0 }
    }

    pub fn report(&mut self, tally: Option<&Tally>) -> Progress {
        let Some(tally) = tally else {
            return Progress {
                total_bytes: 0,
                completed_bytes: 0,
                total_files: 0,
                completed_files: 0,
                bytes_per_sec: 0.0,
                fetched_bytes: 0,
            };
        };
        let now = Instant::now();
        let fetched = tally.fetched_bytes();
        let seconds = now.duration_since(self.last_at).as_secs_f64();
        let bytes_per_sec =
            if seconds > 0.0 { fetched.saturating_sub(self.last_fetched_bytes) as f64 / seconds } else { 0.0 };
        (self.last_at, self.last_fetched_bytes) = (now, fetched);
        let (completed_bytes, completed_files) = tally.completed();
        Progress {
            total_bytes: tally.total_bytes,
            completed_bytes,
            total_files: tally.total_files,
            completed_files,
            bytes_per_sec,
            fetched_bytes: fetched,
        }
    }
}
