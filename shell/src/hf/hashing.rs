//! The hashes the tree API gives per file, computed while streaming.

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// What a file's bytes must hash to (lowercase hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileHash {
    /// LFS files: `lfs.oid`.
    Sha256(String),
    /// Other files: the git blob oid, sha1 of `blob {size}\0` and the content.
    GitBlobSha1(String),
}

impl FileHash {
    pub fn expected_hex(&self) -> &str {
        match self {
            FileHash::Sha256(hex) | FileHash::GitBlobSha1(hex) => hex,
        }
    }

    fn algorithm(&self) -> &'static str {
        match self {
            FileHash::Sha256(_) => "sha256",
            FileHash::GitBlobSha1(_) => "git blob sha1",
        }
    }

    pub fn describe(&self) -> String {
        format!("{} {}", self.algorithm(), self.expected_hex())
    }
}

/// A running hash of one file's content.
pub(super) enum StreamHasher {
    Sha256(Sha256),
    GitBlobSha1(Sha1),
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
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            StreamHasher::Sha256(hasher) => hasher.update(bytes),
            StreamHasher::GitBlobSha1(hasher) => hasher.update(bytes),
        }
    }

    pub fn finish_hex(self) -> String {
        match self {
            StreamHasher::Sha256(hasher) => hex(&hasher.finalize()),
            StreamHasher::GitBlobSha1(hasher) => hex(&hasher.finalize()),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_blob_sha1_matches_git() {
        // `printf 'hello\n' | git hash-object --stdin`
        let expected = FileHash::GitBlobSha1("ce013625030ba8dba906f756967f9e9ca394464a".into());
        let mut hasher = StreamHasher::new(&expected, 6);
        hasher.update(b"hel");
        hasher.update(b"lo\n");
        assert_eq!(hasher.finish_hex(), expected.expected_hex());
    }

    #[test]
    fn sha256_of_empty_input() {
        let expected = FileHash::Sha256("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into());
        assert_eq!(StreamHasher::new(&expected, 0).finish_hex(), expected.expected_hex());
    }
}
