//! The hashes the Hub's tree API and the object stores give per file, computed while streaming.

use std::fs::File;
use std::os::unix::fs::FileExt;

use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::listing::RemoteFile;

const READ_CHUNK_BYTES: usize = 1 << 20;
/// How often a hash that caught up with a growing file looks for more bytes.
const FOLLOW_POLL_MS: u64 = 5;

/// What a file's bytes must hash to (lowercase hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileHash {
    /// LFS files: `lfs.oid`.
    Sha256(String),
    /// Other files: the git blob oid, sha1 of `blob {size}\0` and the content.
    GitBlobSha1(String),
    /// Object stores: the object's MD5 (`Content-MD5`, a plain ETag, `md5Hash`, `opc-meta-md5`).
    Md5(String),
    /// GCS objects without `md5Hash` (composite objects): their `crc32c` (Castagnoli), 8 hex
    /// digits, big-endian as GCS encodes it. (S3's `x-amz-checksum-sha256` is a `Sha256`.)
    Crc32c(String),
    /// An object store object without a usable MD5 (a multipart ETag): checked by size only.
    SizeOnly,
}

impl FileHash {
    pub fn expected_hex(&self) -> &str {
        match self {
            FileHash::Sha256(hex) | FileHash::GitBlobSha1(hex) | FileHash::Md5(hex) | FileHash::Crc32c(hex) => hex,
            FileHash::SizeOnly => "",
        }
    }

    fn algorithm(&self) -> &'static str {
        match self {
            FileHash::Sha256(_) => "sha256",
            FileHash::GitBlobSha1(_) => "git blob sha1",
            FileHash::Md5(_) => "md5",
            FileHash::Crc32c(_) => "crc32c",
            FileHash::SizeOnly => "size only",
        }
    }

    pub fn describe(&self) -> String {
        format!("{} {}", self.algorithm(), self.expected_hex())
    }
}

/// A running hash of one file's content.
pub enum StreamHasher {
    Sha256(Sha256),
    GitBlobSha1(Sha1),
    Md5(md5::Md5),
    Crc32c(crc_fast::Digest),
    SizeOnly,
}

impl StreamHasher {
    /// Starts the hash that `expected` uses; git blobs hash their header (with the final size) first.
    pub fn new(expected: &FileHash, size_bytes: u64) -> Self {
        match expected {
            FileHash::Sha256(_) => StreamHasher::Sha256(Sha256::new()),
            FileHash::GitBlobSha1(_) => {
                let mut hasher = Sha1::new();
                hasher.update(format!("blob {size_bytes}\0").as_bytes());
                StreamHasher::GitBlobSha1(hasher)
            }
            FileHash::Md5(_) => StreamHasher::Md5(<md5::Md5 as md5::Digest>::new()),
            FileHash::Crc32c(_) => StreamHasher::Crc32c(crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi)),
            FileHash::SizeOnly => StreamHasher::SizeOnly,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            StreamHasher::Sha256(hasher) => hasher.update(bytes),
            StreamHasher::GitBlobSha1(hasher) => hasher.update(bytes),
            StreamHasher::Md5(hasher) => md5::Digest::update(hasher, bytes),
            StreamHasher::Crc32c(digest) => digest.update(bytes),
            StreamHasher::SizeOnly => {}
        }
    }

    pub fn finish_hex(self) -> String {
        match self {
            StreamHasher::Sha256(hasher) => hex(&hasher.finalize()),
            StreamHasher::GitBlobSha1(hasher) => hex(&hasher.finalize()),
            StreamHasher::Md5(hasher) => hex(&md5::Digest::finalize(hasher)),
            StreamHasher::Crc32c(digest) => format!("{:08x}", digest.finalize()),
            StreamHasher::SizeOnly => String::new(),
        }
    }
}

/// Hashes the first `len_bytes` of `reader` into `hasher` with positional reads (blocking: a prefix can be
/// gigabytes; one fixed buffer). `stop` is asked between chunks; true ends it with `Interrupted`.
pub fn hash_prefix(
    reader: &File,
    len_bytes: u64,
    hasher: StreamHasher,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<StreamHasher> {
    hash_growing_prefix(reader, len_bytes, hasher, &|| Some(len_bytes), stop)
}

/// Hashes bytes `0..size_bytes` of `reader` as the written prefix grows, so that a file fetched in
/// parts is hashed while they arrive (blocking; one fixed buffer). `written()` is how many bytes from 0
/// are in the file now, `None` once no more will come (the transfer was abandoned); that, or `stop`
/// turning true, ends it with `Interrupted`. Caught up, it looks again every `FOLLOW_POLL_MS`.
pub fn hash_growing_prefix(
    reader: &File,
    size_bytes: u64,
    mut hasher: StreamHasher,
    written: &dyn Fn() -> Option<u64>,
    stop: &dyn Fn() -> bool,
) -> std::io::Result<StreamHasher> {
    if let StreamHasher::SizeOnly = hasher {
        // Nothing to hash: the bytes are not read.
        return Ok(hasher);
    }
    let interrupted = || std::io::Error::new(std::io::ErrorKind::Interrupted, "stopped while hashing");
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    let mut offset = 0;
    while offset < size_bytes {
        let Some(ready) = written().filter(|_| !stop()) else { return Err(interrupted()) };
        let ready = ready.min(size_bytes);
        if ready <= offset {
            std::thread::sleep(std::time::Duration::from_millis(FOLLOW_POLL_MS));
            continue;
        }
        let want = buffer.len().min(usize::try_from(ready - offset).unwrap_or(usize::MAX));
        let got = reader.read_at(&mut buffer[..want], offset)?;
        if got == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "file shrank while hashed"));
        }
        hasher.update(&buffer[..got]);
        offset += got as u64;
    }
    Ok(hasher)
}

/// Whether `reader` holds exactly `remote`'s content: its size, then its hash, read once (blocking).
pub fn file_matches(reader: &File, remote: &RemoteFile, stop: &dyn Fn() -> bool) -> std::io::Result<bool> {
    if reader.metadata()?.len() != remote.size_bytes {
        return Ok(false);
    }
    let hasher = hash_prefix(reader, remote.size_bytes, StreamHasher::new(&remote.hash, remote.size_bytes), stop)?;
    Ok(hasher.finish_hex() == remote.hash.expected_hex())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hex `expected`'s hasher gives for `pieces`, fed one after the other.
    fn hashed(expected: &FileHash, pieces: &[&[u8]]) -> String {
        let mut hasher = StreamHasher::new(expected, pieces.iter().map(|p| p.len() as u64).sum());
        pieces.iter().for_each(|piece| hasher.update(piece));
        hasher.finish_hex()
    }

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let expected = FileHash::GitBlobSha1("ce013625030ba8dba906f756967f9e9ca394464a".into());
        assert_eq!(hashed(&expected, &[b"hel", b"lo\n"]), expected.expected_hex());
    }

    #[test]
    fn md5_matches_md5sum_and_size_only_checks_nothing_but_size() {
        // `printf 'hello\n' | md5sum`
        let expected = FileHash::Md5("b1946ac92492d2347c6235b4d2611184".into());
        assert_eq!(hashed(&expected, &[b"hello\n"]), expected.expected_hex());
        assert_eq!(hashed(&FileHash::SizeOnly, &[b"hello\n"]), FileHash::SizeOnly.expected_hex());
    }

    #[test]
    fn crc32c_is_castagnoli_as_gcs_gives_it() {
        // RFC 3720's check value: crc32c("123456789") = e3069283; GCS's base64 of it is "4waSgw==".
        let expected = FileHash::Crc32c("e3069283".into());
        assert_eq!(hashed(&expected, &[b"1234", b"56789"]), expected.expected_hex());
        assert_eq!(hashed(&expected, &[]), "00000000");
        assert_eq!(expected.describe(), "crc32c e3069283");
    }

    #[test]
    fn sha256_of_empty_input() {
        let expected = FileHash::Sha256("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into());
        assert_eq!(StreamHasher::new(&expected, 0).finish_hex(), expected.expected_hex());
    }
}
