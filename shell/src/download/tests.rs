//! The engine against the project's fake Hub.

use std::sync::Mutex;

/// Free bytes the space check sees for a models root (the one seam: tests cannot fill a disk).
static FREE_BYTES: Mutex<Vec<(String, u64)>> = Mutex::new(Vec::new());

pub(super) fn free_bytes_seam(root: &str) -> Option<u64> {
    FREE_BYTES.lock().unwrap().iter().find(|(r, _)| r == root).map(|(_, free)| *free)
}
