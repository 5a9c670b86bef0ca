//! Every object under the model's prefix, as the engine's files: the path beneath the destination
//! (the prefix stripped, OME's rule), the size, and the MD5 where the store gives a plain one.

use base64::Engine as _;
use futures::TryStreamExt;

use super::{Store, StoreError};
use crate::hf::{FileHash, RemoteFile, check_repo_path};

/// Objects of one model at most: a listing is held in memory whole.
pub const OBJECTS_MAX: usize = 1_000_000;

/// Every object under the prefix, sorted by path. Keys ending in `/` (folder placeholders) are
/// skipped; a key whose path cannot be a file name beneath the destination is an error.
pub async fn list(store: &Store) -> Result<Vec<RemoteFile>, StoreError> {
    let dir = listing_dir(&store.prefix);
    let what = format!("listing {}", store.label);
    let mut lister =
        store.op.lister_with(&dir).recursive(true).await.map_err(|e| StoreError::from_opendal(&what, &e))?;
    let mut files = Vec::new();
    while let Some(entry) = lister.try_next().await.map_err(|e| StoreError::from_opendal(&what, &e))? {
        let key = entry.path().trim_start_matches('/');
        if key.ends_with('/') || entry.metadata().is_dir() {
            continue;
        }
        let Some(path) = key.strip_prefix(dir.trim_start_matches('/')) else { continue };
        check_repo_path(path).map_err(|e| StoreError::Other { reason: format!("{}: {e}", store.label) })?;
        let meta = entry.metadata();
        let hash = md5_of(meta.content_md5(), meta.etag()).map_or(FileHash::SizeOnly, FileHash::Md5);
        files.push(RemoteFile { path: path.to_string(), size_bytes: meta.content_length(), hash });
        if files.len() > OBJECTS_MAX {
            return Err(StoreError::Other { reason: format!("{}: more than {OBJECTS_MAX} objects", store.label) });
        }
    }
    if files.is_empty() {
        return Err(StoreError::Empty { label: store.label.clone() });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    match &store.shape_filter {
        None => Ok(files),
        Some(alias) => crate::shapes::keep_shape(files, alias.as_deref(), |p| store.key_of(p))
            .map_err(|reason| StoreError::Other { reason: format!("{}: {reason}", store.label) }),
    }
}

/// The prefix as a folder: `models/llama` lists `models/llama/...`; an empty prefix is the bucket.
fn listing_dir(prefix: &str) -> String {
    let prefix = prefix.trim_start_matches('/');
    match prefix {
        "" => "/".to_string(),
        p if p.ends_with('/') => p.to_string(),
        p => format!("{p}/"),
    }
}

/// The object's MD5 as lowercase hex: `Content-MD5` / `md5Hash` (base64 or hex), else an ETag
/// that is a plain MD5 (S3's single-part ETag; a multipart ETag `…-N` is no hash of the content).
pub fn md5_of(content_md5: Option<&str>, etag: Option<&str>) -> Option<String> {
    if let Some(md5) = content_md5.and_then(md5_text) {
        return Some(md5);
    }
    let etag = etag?.trim_start_matches("W/").trim_matches('"');
    (etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| etag.to_ascii_lowercase())
}

fn md5_text(text: &str) -> Option<String> {
    let text = text.trim().trim_matches('"');
    if text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some(text.to_ascii_lowercase());
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(text).ok()?;
    (bytes.len() == 16).then(|| bytes.iter().map(|b| format!("{b:02x}")).collect())
}
