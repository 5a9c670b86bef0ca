//! A file's bytes: inline, a deterministic generated pattern, or a file on disk. Always read in bounded
//! chunks, so a multi-GiB fixture is never held in memory; hashes are computed streaming.

use std::collections::HashMap;
use std::fs::File as StdFile;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

use axum::body::Bytes;
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// Chunk size for hashing and for serving bodies.
pub(crate) const CHUNK_BYTES: usize = 256 * 1024;

/// Where a fixture file's bytes come from.
#[derive(Clone, Debug)]
pub enum Content {
    /// Bytes held in memory (small files).
    Inline(Bytes),
    /// `size_bytes` bytes of a pattern that depends only on `seed` and the offset: any range can be produced
    /// without generating what precedes it.
    Pattern { size_bytes: u64, seed: u64 },
    /// A file on disk, read on demand; it must not change while the server runs.
    Disk { path: PathBuf, size_bytes: u64 },
}

impl Content {
    pub fn size_bytes(&self) -> u64 {
        match self {
            Content::Inline(bytes) => bytes.len() as u64,
            Content::Pattern { size_bytes, .. } | Content::Disk { size_bytes, .. } => *size_bytes,
        }
    }

    /// `len_max` bytes (fewer at the end) starting at `offset`. Blocking for `Disk`.
    pub fn read_at(&self, offset: u64, len_max: usize) -> io::Result<Bytes> {
        let size = self.size_bytes();
        let len = len_max.min(size.saturating_sub(offset) as usize);
        match self {
            Content::Inline(bytes) => Ok(bytes.slice(offset as usize..offset as usize + len)),
            Content::Pattern { seed, .. } => Ok(Bytes::from(pattern_bytes(*seed, offset, len))),
            Content::Disk { path, .. } => {
                let mut buf = vec![0u8; len];
                StdFile::open(path)?.read_exact_at(&mut buf, offset)?;
                Ok(Bytes::from(buf))
            }
        }
    }

    /// Whole content as a vector: for tests that compare small files.
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.size_bytes() as usize);
        let mut offset = 0;
        while offset < self.size_bytes() {
            let chunk = self.read_at(offset, CHUNK_BYTES)?;
            offset += chunk.len() as u64;
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }

    fn for_each_chunk(&self, mut sink: impl FnMut(&[u8])) -> io::Result<()> {
        let mut offset = 0;
        while offset < self.size_bytes() {
            let chunk = self.read_at(offset, CHUNK_BYTES)?;
            if chunk.is_empty() {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "content shorter than its size"));
            }
            offset += chunk.len() as u64;
            sink(&chunk);
        }
        Ok(())
    }
}

/// The pattern's 8-byte block `index` (splitmix64: cheap, and no two nearby blocks alike).
fn pattern_block(seed: u64, index: u64) -> [u8; 8] {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)).to_le_bytes()
}

/// `len` bytes of the pattern from `offset`.
pub fn pattern_bytes(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    let first_block = offset / 8;
    let skip = (offset % 8) as usize;
    let blocks = (skip + len).div_ceil(8) as u64;
    for index in first_block..first_block + blocks {
        out.extend_from_slice(&pattern_block(seed, index));
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

/// A file's hashes as the Hub reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digests {
    /// git blob sha1 (`sha1("blob {len}\0" + bytes)`) of what git stores: the content, or the LFS pointer.
    pub git_oid: String,
    /// sha256 of the content: only for LFS files (the tree API's `lfs.oid`).
    pub lfs: Option<LfsDigest>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LfsDigest {
    pub sha256: String,
    pub pointer_size_bytes: u64,
}

pub fn git_blob_oid(bytes: &[u8]) -> String {
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", bytes.len()).as_bytes());
    hasher.update(bytes);
    hex(&hasher.finalize())
}

/// The pointer file git stores for an LFS file (git-lfs spec v1).
pub fn lfs_pointer(sha256: &str, size_bytes: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size_bytes}\n")
}

/// Hashes `content` in one streaming pass: sha256 for LFS files, the git blob sha1 otherwise.
pub fn digests(content: &Content, lfs: bool) -> io::Result<Digests> {
    if lfs {
        let mut hasher = Sha256::new();
        content.for_each_chunk(|chunk| hasher.update(chunk))?;
        let sha256 = hex(&hasher.finalize());
        let pointer = lfs_pointer(&sha256, content.size_bytes());
        let lfs = LfsDigest { sha256, pointer_size_bytes: pointer.len() as u64 };
        return Ok(Digests { git_oid: git_blob_oid(pointer.as_bytes()), lfs: Some(lfs) });
    }
    let mut hasher = Sha1::new();
    hasher.update(format!("blob {}\0", content.size_bytes()).as_bytes());
    content.for_each_chunk(|chunk| hasher.update(chunk))?;
    Ok(Digests { git_oid: hex(&hasher.finalize()), lfs: None })
}

/// Bump when `pattern_bytes` changes: it keys the digest cache.
const PATTERN_VERSION: u32 = 1;
/// Generated contents at least this large keep their digests in a file under the temp dir: sha256 runs at
/// about 25 MB/s in a debug build, and a test binary starts many servers with the same fixtures.
const DISK_CACHE_FROM_BYTES: u64 = 8 << 20;
const MEMORY_CACHE_ENTRIES_MAX: usize = 10_000;

static DIGEST_CACHE: LazyLock<Mutex<HashMap<String, Digests>>> = LazyLock::new(Default::default);

/// [`digests`], remembered for generated contents (a pure function of seed and size): in memory, and on
/// disk for large ones.
pub(crate) fn cached_digests(content: &Content, lfs: bool) -> io::Result<Digests> {
    let Content::Pattern { size_bytes, seed } = content else { return digests(content, lfs) };
    let key = format!("v{PATTERN_VERSION}-{seed:016x}-{size_bytes}-{}", if lfs { "lfs" } else { "git" });
    if let Some(found) = DIGEST_CACHE.lock().unwrap().get(&key) {
        return Ok(found.clone());
    }
    let disk_path = (*size_bytes >= DISK_CACHE_FROM_BYTES)
        .then(|| std::env::temp_dir().join("model-agent-fakehub-digests").join(&key));
    let from_disk = disk_path
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| parse_cached(&text, lfs));
    let found = match from_disk {
        Some(found) => found,
        None => {
            let computed = digests(content, lfs)?;
            if let Some(path) = &disk_path {
                // Best effort: a cache that cannot be written only costs time.
                let _ = write_cached(path, &computed);
            }
            computed
        }
    };
    let mut cache = DIGEST_CACHE.lock().unwrap();
    if cache.len() >= MEMORY_CACHE_ENTRIES_MAX {
        cache.clear();
    }
    cache.insert(key, found.clone());
    Ok(found)
}

/// `{git_oid}\n` or `{git_oid} {sha256} {pointer_size}\n`.
fn parse_cached(text: &str, lfs: bool) -> Option<Digests> {
    let parts: Vec<&str> = text.trim().split(' ').collect();
    let is_hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    match (lfs, parts.as_slice()) {
        (false, [oid]) if is_hex(oid, 40) => Some(Digests { git_oid: oid.to_string(), lfs: None }),
        (true, [oid, sha256, pointer]) if is_hex(oid, 40) && is_hex(sha256, 64) => {
            let lfs = LfsDigest { sha256: sha256.to_string(), pointer_size_bytes: pointer.parse().ok()? };
            Some(Digests { git_oid: oid.to_string(), lfs: Some(lfs) })
        }
        _ => None,
    }
}

fn write_cached(path: &std::path::Path, digests: &Digests) -> io::Result<()> {
    let text = match &digests.lfs {
        None => format!("{}\n", digests.git_oid),
        Some(lfs) => format!("{} {} {}\n", digests.git_oid, lfs.sha256, lfs.pointer_size_bytes),
    };
    std::fs::create_dir_all(path.parent().expect("in a directory"))?;
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 15) as usize] as char);
    }
    out
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_ranges_agree_with_the_whole() {
        let whole = pattern_bytes(7, 0, 1000);
        for (offset, len) in [(0, 1), (3, 17), (8, 8), (13, 987), (999, 1)] {
            assert_eq!(pattern_bytes(7, offset as u64, len), whole[offset..offset + len]);
        }
        assert_ne!(pattern_bytes(8, 0, 64), whole[..64]);
    }

    #[test]
    fn cached_digests_equal_computed_ones_from_memory_and_disk() {
        let content = Content::Pattern { size_bytes: DISK_CACHE_FROM_BYTES, seed: 0x5eed_cafe };
        for lfs in [true, false] {
            let computed = digests(&content, lfs).unwrap();
            assert_eq!(cached_digests(&content, lfs).unwrap(), computed, "first: computed and stored");
            DIGEST_CACHE.lock().unwrap().clear();
            assert_eq!(cached_digests(&content, lfs).unwrap(), computed, "from disk");
            assert_eq!(cached_digests(&content, lfs).unwrap(), computed, "from memory");
        }
        assert_eq!(parse_cached("zz", false), None);
    }

    #[test]
    fn git_blob_oid_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        assert_eq!(git_blob_oid(b"hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
        assert_eq!(git_blob_oid(b""), "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391");
    }

    #[test]
    fn streaming_digests_equal_one_shot_hashes() {
        let content = Content::Pattern { size_bytes: 3 * CHUNK_BYTES as u64 + 5, seed: 1 };
        let bytes = content.to_vec().unwrap();
        let lfs = digests(&content, true).unwrap();
        assert_eq!(lfs.lfs.as_ref().unwrap().sha256, sha256_hex(&bytes));
        let pointer = lfs_pointer(&sha256_hex(&bytes), bytes.len() as u64);
        assert_eq!(lfs.git_oid, git_blob_oid(pointer.as_bytes()));
        assert_eq!(digests(&content, false).unwrap().git_oid, git_blob_oid(&bytes));
    }
}
