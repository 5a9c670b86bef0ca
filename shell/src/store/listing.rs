//! Every object under the model's prefix, as the engine's files: the path beneath the destination
//! (the prefix stripped, OME's rule), the size, and the hash the store gives: S3's whole-object
//! `x-amz-checksum-sha256` (a signed HEAD per object), else a plain MD5 (S3's single-part ETag
//! without SSE-KMS/SSE-C, GCS's `md5Hash`, Azure's `Content-MD5`, OCI's `md5` or `opc-meta-md5`),
//! else GCS's `crc32c` (composite objects), else the size only.

use base64::Engine as _;
use futures::TryStreamExt;

use super::{Backend, Checks, Store, StoreError};
use crate::hf::{FileHash, RemoteFile, check_repo_path, check_sizes, check_unique};

/// Objects of one model at most: a listing is held in memory whole.
pub const OBJECTS_MAX: usize = 1_000_000;
/// S3 checksum HEADs in flight at once.
const HEADS_CONCURRENCY: usize = 16;
/// A listing longer than this gets no checksum HEADs (one request per object would be the
/// download's bulk): its objects keep the listing's MD5.
const HEADS_OBJECTS_MAX: usize = 10_000;

/// Every object under the prefix, sorted by path (a TensorRT-LLM model's only for this node's
/// shape). Keys ending in `/` (folder placeholders) are skipped; a key whose path cannot be a file
/// name beneath the destination is an error.
pub async fn list(store: &Store) -> Result<Vec<RemoteFile>, StoreError> {
    let dir = listing_dir(&store.prefix);
    let files = match &store.backend {
        Backend::OpenDal { op, list_pages } => {
            list_pages.store(0, std::sync::atomic::Ordering::Relaxed);
            list_opendal(store, op, &dir).await?
        }
        Backend::Oci { client, bucket } => list_oci(store, client, bucket, &dir).await?,
    };
    if files.is_empty() {
        return Err(StoreError::Empty { label: store.label.clone() });
    }
    // As the Hub's tree: a key twice, or a file where another needs a directory, would have two
    // transfers write one partial file or a rename fail on every retry.
    let refused = |reason: String| StoreError::Other { reason: format!("{}: {reason}", store.label) };
    check_sizes(&files).map_err(refused)?;
    let mut files = check_unique(files).map_err(|e| refused(e.to_string()))?;
    match &store.checks {
        Checks::S3(heads) if files.len() <= HEADS_OBJECTS_MAX => with_s3_checksums(store, heads, &mut files).await?,
        Checks::Gcs(seen) => {
            for file in files.iter_mut().filter(|f| f.hash == FileHash::SizeOnly) {
                file.hash = seen.of(&store.key_of(&file.path)).map_or(FileHash::SizeOnly, FileHash::Crc32c);
            }
        }
        _ => {}
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    match &store.shape_filter {
        None => Ok(files),
        Some(alias) => crate::shapes::keep_shape(files, alias.as_deref(), |p| store.key_of(p))
            .map_err(|reason| StoreError::Other { reason: format!("{}: {reason}", store.label) }),
    }
}

/// An object's path beneath the destination: its key less the listed folder, checked.
fn path_of<'k>(store: &Store, dir: &str, key: &'k str) -> Result<Option<&'k str>, StoreError> {
    let dir = dir.trim_start_matches('/');
    let Some(path) = key.strip_prefix(dir) else { return Ok(None) };
    check_repo_path(path).map_err(|e| StoreError::Other { reason: format!("{}: {e}", store.label) })?;
    Ok(Some(path))
}

fn too_many(store: &Store) -> StoreError {
    StoreError::Other { reason: format!("{}: more than {OBJECTS_MAX} objects", store.label) }
}

async fn list_opendal(store: &Store, op: &opendal::Operator, dir: &str) -> Result<Vec<RemoteFile>, StoreError> {
    let what = format!("listing {}", store.label);
    let mut lister = op.lister_with(dir).recursive(true).await.map_err(|e| StoreError::from_opendal(&what, &e))?;
    let mut files = Vec::new();
    while let Some(entry) = lister.try_next().await.map_err(|e| StoreError::from_opendal(&what, &e))? {
        let key = entry.path().trim_start_matches('/');
        if key.ends_with('/') || entry.metadata().is_dir() {
            continue;
        }
        let Some(path) = path_of(store, dir, key)? else { continue };
        let meta = entry.metadata();
        let hash = md5_of(meta.content_md5(), meta.etag()).map_or(FileHash::SizeOnly, FileHash::Md5);
        let etag = listed_etag(meta.etag());
        files.push(RemoteFile { path: path.to_string(), size_bytes: meta.content_length(), hash, etag });
        if files.len() > OBJECTS_MAX {
            return Err(too_many(store));
        }
    }
    Ok(files)
}

/// OCI's listing (its own limits); an object whose listed MD5 is a multipart one is asked for its
/// `opc-meta-md5` (HeadObject), else checked by size only.
async fn list_oci(
    store: &Store,
    client: &crate::oci::OciClient,
    bucket: &str,
    dir: &str,
) -> Result<Vec<RemoteFile>, StoreError> {
    use crate::oci::{ExpectedMd5, ListLimits};
    let prefix = dir.trim_start_matches('/');
    let objects = client.list_objects(bucket, prefix, ListLimits::default()).await.map_err(StoreError::from_oci)?;
    let mut files = Vec::new();
    for object in objects {
        if object.name.ends_with('/') {
            continue;
        }
        let Some(path) = path_of(store, prefix, &object.name)? else { continue };
        let hash = match md5_of(object.md5.as_deref(), None) {
            Some(md5) => FileHash::Md5(md5),
            None => {
                let head = client.head_object(bucket, &object.name).await.map_err(StoreError::from_oci)?;
                match head.expected_md5().map_err(StoreError::from_oci)? {
                    ExpectedMd5::ContentMd5(md5) | ExpectedMd5::MetaMd5(md5) => FileHash::Md5(hex(&md5)),
                    ExpectedMd5::SizeOnly => FileHash::SizeOnly,
                }
            }
        };
        let etag = listed_etag(object.etag.as_deref());
        files.push(RemoteFile { path: path.to_string(), size_bytes: object.size_bytes, hash, etag });
    }
    Ok(files)
}

/// Each object's hash from a signed HEAD: its whole-object sha256 when it has one, else the listed
/// MD5 (or the HEAD's ETag when the listing had none) unless SSE-KMS or SSE-C make the ETag no MD5.
async fn with_s3_checksums(
    store: &Store,
    heads: &super::s3_checksum::Heads,
    files: &mut [RemoteFile],
) -> Result<(), StoreError> {
    use futures::FutureExt as _;
    use futures::StreamExt as _;
    // Owned, boxed futures: borrowed ones would make the download task's future not `Send`.
    let asks: Vec<_> = files
        .iter()
        .map(|f| {
            let (heads, key) = (heads.clone(), store.key_of(&f.path));
            async move { heads.head(&key).await }.boxed()
        })
        .collect();
    let mut answers = futures::stream::iter(asks).buffered(HEADS_CONCURRENCY);
    for file in files.iter_mut() {
        let facts = answers.next().await.expect("one answer per key")?;
        // A listing without ETags (s3s-fs lists none; S3 does): the HEAD's names the version.
        if file.etag.is_none() {
            file.etag = listed_etag(facts.etag.as_deref());
        }
        file.hash = match (facts.sha256_hex, &file.hash) {
            (Some(sha256), _) => FileHash::Sha256(sha256),
            _ if facts.etag_not_md5 => FileHash::SizeOnly,
            (None, FileHash::SizeOnly) => md5_of(None, facts.etag.as_deref()).map_or(FileHash::SizeOnly, FileHash::Md5),
            (None, listed) => listed.clone(),
        };
    }
    Ok(())
}

/// Longer ETags are not kept (no store sends one near this): the object is then read as before,
/// by size alone.
const ETAG_BYTES_MAX: usize = 1024;

/// An ETag as a listing gave it, in its quoted form (`"…"`, as `If-Match` takes it): S3 and
/// OpenDAL's Azure lister quote it, OCI does not. A weak one (`W/"…"`) is not kept: `If-Match`
/// compares strongly, so a server would refuse it every time.
pub(super) fn listed_etag(etag: Option<&str>) -> Option<String> {
    let etag = etag?.trim();
    if etag.is_empty() || etag.len() > ETAG_BYTES_MAX || etag.bytes().any(|b| b.is_ascii_control()) {
        return None;
    }
    if etag.starts_with("W/") {
        return None;
    }
    Some(if etag.starts_with('"') { etag.to_string() } else { format!("\"{etag}\"") })
}

/// Does an answer's ETag name the version `asked` (a listed ETag)? One without an ETag cannot
/// tell and is taken; a weak one (a proxy may weaken it) is compared by its value.
pub(super) fn answer_is_version(asked: &str, answered: Option<&str>) -> bool {
    let Some(answered) = answered.map(str::trim) else { return true };
    listed_etag(Some(answered.strip_prefix("W/").unwrap_or(answered))).is_none_or(|answered| answered == asked)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
