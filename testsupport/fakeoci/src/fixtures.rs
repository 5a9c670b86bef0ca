//! Buckets and objects defined in code, and what the store computes of them at start: the MD5 OCI reports
//! (plain for objects uploaded whole; `<md5 of the parts' md5s>-<parts>` for multipart uploads), an ETag,
//! and the user metadata (`opc-meta-*`).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use md5::{Digest, Md5};
use model_agent_fakehub::Content;
use sha2::Sha256;

/// Objects a directory fixture may hold at most: fixtures are small by intent.
const DIR_FILES_MAX: usize = 10_000;
/// Parts of a multipart object at most (OCI's limit).
const PARTS_MAX: u32 = 10_000;
/// Chunk size for hashing.
const HASH_CHUNK_BYTES: usize = 256 * 1024;

/// All buckets a server holds.
#[derive(Clone, Debug, Default)]
pub struct Fixtures {
    pub(crate) buckets: Vec<BucketFixture>,
}

impl Fixtures {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn bucket(mut self, bucket: BucketFixture) -> Self {
        self.buckets.push(bucket);
        self
    }
}

#[derive(Clone, Debug)]
pub struct BucketFixture {
    pub(crate) name: String,
    pub(crate) objects: Vec<ObjectFixture>,
}

impl BucketFixture {
    pub fn new(name: &str) -> Self {
        BucketFixture { name: name.to_owned(), objects: vec![] }
    }

    pub fn object(mut self, object: ObjectFixture) -> Self {
        self.objects.push(object);
        self
    }

    /// Every file under `dir` as an object named `prefix` + its relative path (read from disk on demand).
    pub fn from_dir(mut self, prefix: &str, dir: &Path) -> io::Result<Self> {
        let mut pending = vec![dir.to_path_buf()];
        while let Some(current) = pending.pop() {
            for entry in std::fs::read_dir(&current)? {
                let path = entry?.path();
                let meta = std::fs::symlink_metadata(&path)?;
                if meta.is_dir() {
                    pending.push(path);
                    continue;
                }
                if !meta.is_file() {
                    continue;
                }
                if self.objects.len() >= DIR_FILES_MAX {
                    return Err(io::Error::other(format!("more than {DIR_FILES_MAX} files under {}", dir.display())));
                }
                let relative = path.strip_prefix(dir).expect("under dir").to_string_lossy().into_owned();
                let content = Content::Disk { path: path.clone(), size_bytes: meta.len() };
                self.objects.push(ObjectFixture::new(&format!("{prefix}{relative}"), content));
            }
        }
        Ok(self)
    }
}

/// One object: its name, bytes, and how it was uploaded.
#[derive(Clone, Debug)]
pub struct ObjectFixture {
    pub(crate) name: String,
    pub(crate) content: Content,
    /// `Some(n)`: uploaded in `n` parts (its MD5 and ETag are then not the content's MD5).
    pub(crate) multipart_parts: Option<u32>,
    /// Set `opc-meta-md5` (base64 of the content's MD5), as OME's uploader does for multipart objects.
    pub(crate) meta_md5: bool,
    pub(crate) metadata: Vec<(String, String)>,
}

impl ObjectFixture {
    pub fn new(name: &str, content: Content) -> Self {
        ObjectFixture { name: name.to_owned(), content, multipart_parts: None, meta_md5: false, metadata: vec![] }
    }

    pub fn inline(name: &str, bytes: impl Into<Bytes>) -> Self {
        ObjectFixture::new(name, Content::Inline(bytes.into()))
    }

    /// `size_bytes` of a deterministic pattern (never held in memory).
    pub fn generated(name: &str, size_bytes: u64, seed: u64) -> Self {
        ObjectFixture::new(name, Content::Pattern { size_bytes, seed })
    }

    /// Uploaded in `parts` parts (1..=10,000).
    pub fn multipart(mut self, parts: u32) -> Self {
        assert!((1..=PARTS_MAX).contains(&parts), "parts {parts} out of 1..={PARTS_MAX}");
        self.multipart_parts = Some(parts);
        self
    }

    /// With `opc-meta-md5` set to the content's MD5 (base64).
    pub fn with_meta_md5(mut self) -> Self {
        self.meta_md5 = true;
        self
    }

    /// User metadata `opc-meta-{key}: {value}` (key without the prefix, lowercase).
    pub fn metadata(mut self, key: &str, value: &str) -> Self {
        self.metadata.push((key.to_lowercase(), value.to_owned()));
        self
    }
}

/// An object as the store serves it.
#[derive(Debug)]
pub struct StoredObject {
    pub name: String,
    pub content: Content,
    /// Base64 of the content's MD5.
    pub content_md5: String,
    /// What ListObjects reports as `md5`: `content_md5`, or `<base64 md5 of part md5s>-<parts>`.
    pub listed_md5: String,
    pub multipart_parts: Option<u32>,
    pub etag: String,
    /// `opc-meta-*` metadata, key without the prefix.
    pub metadata: BTreeMap<String, String>,
}

impl StoredObject {
    pub fn size_bytes(&self) -> u64 {
        self.content.size_bytes()
    }

    /// Hashes the fixture (streaming) and derives what OCI would report.
    pub(crate) fn build(fixture: &ObjectFixture) -> io::Result<Arc<StoredObject>> {
        let size = fixture.content.size_bytes();
        let part_bytes = fixture.multipart_parts.map(|parts| size.div_ceil(parts as u64).max(1));
        let (whole, parts) = hash_content(&fixture.content, part_bytes)?;
        let content_md5 = BASE64.encode(whole);
        let listed_md5 = match fixture.multipart_parts {
            None => content_md5.clone(),
            Some(_) => {
                let mut of_parts = Md5::new();
                parts.iter().for_each(|part| of_parts.update(part));
                format!("{}-{}", BASE64.encode(of_parts.finalize()), parts.len())
            }
        };
        let mut metadata: BTreeMap<String, String> = fixture.metadata.iter().cloned().collect();
        if fixture.meta_md5 {
            metadata.insert("md5".into(), content_md5.clone());
        }
        Ok(Arc::new(StoredObject {
            name: fixture.name.clone(),
            etag: etag_of(&fixture.name, &listed_md5),
            content: fixture.content.clone(),
            content_md5,
            listed_md5,
            multipart_parts: fixture.multipart_parts,
            metadata,
        }))
    }
}

/// The whole content's MD5 and, with `part_bytes`, each part's MD5.
fn hash_content(content: &Content, part_bytes: Option<u64>) -> io::Result<([u8; 16], Vec<[u8; 16]>)> {
    let (mut whole, mut part, mut parts) = (Md5::new(), Md5::new(), Vec::new());
    let (mut offset, mut in_part) = (0u64, 0u64);
    while offset < content.size_bytes() {
        let room = part_bytes.map_or(u64::MAX, |p| p - in_part);
        let chunk = content.read_at(offset, (HASH_CHUNK_BYTES as u64).min(room) as usize)?;
        if chunk.is_empty() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "content shorter than its size"));
        }
        whole.update(&chunk);
        part.update(&chunk);
        offset += chunk.len() as u64;
        in_part += chunk.len() as u64;
        if Some(in_part) == part_bytes || (part_bytes.is_some() && offset == content.size_bytes()) {
            parts.push(std::mem::take(&mut part).finalize().into());
            in_part = 0;
        }
    }
    Ok((whole.finalize().into(), parts))
}

/// An opaque ETag in OCI's UUID-like shape, stable for a name and content.
fn etag_of(name: &str, md5: &str) -> String {
    let digest = Sha256::digest(format!("{name}\0{md5}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5s_are_plain_for_whole_uploads_and_of_parts_for_multipart() {
        let bytes = b"0123456789".to_vec();
        let whole = StoredObject::build(&ObjectFixture::inline("a", bytes.clone())).unwrap();
        assert_eq!(whole.content_md5, BASE64.encode(Md5::digest(&bytes)));
        assert_eq!(whole.listed_md5, whole.content_md5);
        let multipart = StoredObject::build(&ObjectFixture::inline("a", bytes.clone()).multipart(3)).unwrap();
        let mut of_parts = Md5::new();
        for part in [&bytes[..4], &bytes[4..8], &bytes[8..]] {
            of_parts.update(Md5::digest(part));
        }
        assert_eq!(multipart.listed_md5, format!("{}-3", BASE64.encode(of_parts.finalize())));
        assert_eq!(multipart.content_md5, whole.content_md5);
        assert!(!multipart.metadata.contains_key("md5"));
        let tagged = StoredObject::build(&ObjectFixture::inline("a", bytes).multipart(3).with_meta_md5()).unwrap();
        assert_eq!(tagged.metadata.get("md5"), Some(&whole.content_md5));
    }
}
