//! Writeback started as bytes arrive, so the disk works while the network does and the sync before
//! a file is kept has little left to wait for (a client that never syncs leaves all of it to the
//! kernel's flusher, after it has exited).

use std::fs::File;
use std::os::fd::AsRawFd;

/// Bytes written before their writeback is started.
pub(crate) const WRITEBACK_CHUNK_BYTES: u64 = 8 << 20;

/// The bytes of one file, or one part of it, written but not yet sent to the disk.
pub(crate) struct Writeback {
    from: u64,
}

impl Writeback {
    pub fn from(offset: u64) -> Writeback {
        Writeback { from: offset }
    }

    /// `written_to` is the end of the bytes written so far, from `from` on.
    pub fn wrote(&mut self, file: &File, written_to: u64) {
        if written_to < self.from + WRITEBACK_CHUNK_BYTES {
            return;
        }
        // SAFETY: sync_file_range reads only its integer arguments; the fd is open for `file`'s lifetime.
        // SYNC_FILE_RANGE_WRITE starts writeback without waiting for it. An error here is ignored:
        // the fsync before the file is kept reports the disk's errors.
        let _ = unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                self.from as libc::off64_t,
                (written_to - self.from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        self.from = written_to;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writeback_starts_once_a_chunk_is_written_and_then_from_its_end() {
        let path = std::env::temp_dir().join(format!("writeback-test-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(3 * WRITEBACK_CHUNK_BYTES).unwrap();
        let mut writeback = Writeback::from(100);
        writeback.wrote(&file, 100 + WRITEBACK_CHUNK_BYTES - 1);
        assert_eq!(writeback.from, 100, "less than a chunk: nothing started");
        writeback.wrote(&file, 100 + WRITEBACK_CHUNK_BYTES);
        assert_eq!(writeback.from, 100 + WRITEBACK_CHUNK_BYTES);
        writeback.wrote(&file, 3 * WRITEBACK_CHUNK_BYTES);
        assert_eq!(writeback.from, 3 * WRITEBACK_CHUNK_BYTES);
        let _ = std::fs::remove_file(&path);
    }
}
