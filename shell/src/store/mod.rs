//! Object stores for the download engine (issue #11): `s3://`, `gs://` and `az://` through
//! OpenDAL, `oci://` through the project's own client (`crate::oci`). A store lists every object under the model's prefix (the prefix stripped beneath the
//! destination, OME's rule) as the engine's `RemoteFile`s, with the MD5 the store gives where it
//! gives a plain one, and fetches one object into a partial file: resumed from its kept prefix,
//! hashed while streaming, checked for size and MD5 at the end. Planning, adoption, markers, space,
//! progress and placing are the engine's (`download`), shared with `hf://`.

mod capped_transport;
mod config;
mod fetch;
mod gcs_transport;
mod listing;
mod s3_checksum;
#[cfg(test)]
mod tests;

use std::fmt;

pub use config::{Net, StoreAuth, open};
pub use fetch::{fetch_file, fetch_range};
pub use listing::list;

/// Who answers for the bucket.
#[derive(Clone)]
enum Backend {
    /// `list_pages`: the listing pages sent since the listing began (`capped_transport`).
    OpenDal {
        op: opendal::Operator,
        list_pages: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    },
    Oci {
        client: Box<crate::oci::OciClient>,
        bucket: String,
    },
}

/// One model's objects: a client of the bucket (or container) and the model's prefix.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
    /// The key prefix every object of the model starts with (as given in the URI).
    prefix: String,
    /// `s3://bucket/prefix`, to name the source in reasons and in the manifest.
    pub label: String,
    /// A TensorRT-LLM serving model (`shapes::applies`): keep only this node's shape, the alias
    /// (`None`: the Node has no instance-type label).
    pub shape_filter: Option<Option<String>>,
    /// Where the hashes OpenDAL's listing lacks come from.
    checks: Checks,
}

/// The integrity sources beside OpenDAL's listing: S3's signed checksum HEADs, GCS's `crc32c` of the
/// objects without `md5Hash` (tapped from the listing pages).
#[derive(Clone, Debug)]
enum Checks {
    None,
    S3(Box<s3_checksum::Heads>),
    Gcs(std::sync::Arc<gcs_transport::Crc32cSeen>),
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("label", &self.label).finish_non_exhaustive()
    }
}

impl Store {
    /// The object key of a file the listing named `path` (relative to the prefix).
    fn key_of(&self, path: &str) -> String {
        join_key(&self.prefix, path)
    }
}

/// `prefix` + `path` with exactly one `/` between them (none when the prefix is empty).
fn join_key(prefix: &str, path: &str) -> String {
    let prefix = prefix.trim_start_matches('/');
    match prefix {
        "" => path.to_string(),
        p if p.ends_with('/') => format!("{p}{path}"),
        p => format!("{p}/{path}"),
    }
}

/// One failure of a store request or a transfer. Never holds a credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The store refused the credentials or the request (401, 403).
    Denied { what: String, reason: String },
    /// The bucket, container or object does not exist.
    NotFound { what: String },
    /// The store asked to slow down (`Retry-After` when it said how long).
    RateLimited { what: String, retry_after_ms: Option<u64> },
    /// A temporary failure (5xx, network, timeouts) that the store's client marks as retryable.
    Temporary { what: String, reason: String },
    /// No byte for the stall timeout; the partial file keeps what arrived.
    Stalled { what: String, stall_timeout_ms: u64 },
    /// The object ended before its listed size; the partial file keeps what arrived.
    Truncated { path: String, got_bytes: u64, expected_bytes: u64 },
    /// More bytes than listed, or a hash that does not match: the partial file is emptied.
    Integrity { path: String, expected: String, got: String },
    /// Nothing under the prefix.
    Empty { label: String },
    /// An object checked by size only is no longer the version listed (another ETag: uploaded
    /// again since). The download ends; its next attempt lists again and keeps the new
    /// version's bytes apart (`RemoteFile::etag`).
    Changed { path: String },
    /// A configuration, listing or local problem a retry will not fix soon.
    Other { reason: String },
}

impl StoreError {
    /// The store could not answer (as opposed to an answer that says no).
    pub fn unreachable(&self) -> bool {
        matches!(self, StoreError::RateLimited { .. } | StoreError::Temporary { .. } | StoreError::Stalled { .. })
    }

    /// A person must act before a retry can succeed (credentials, a missing bucket or prefix).
    pub fn retry_slowly(&self) -> bool {
        matches!(self, StoreError::Denied { .. } | StoreError::NotFound { .. } | StoreError::Empty { .. })
    }

    /// How long the store asked to wait.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            StoreError::RateLimited { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// Worth another attempt within this download (the partial file keeps what arrived).
    pub fn retry_now(&self) -> bool {
        self.unreachable() || matches!(self, StoreError::Truncated { .. } | StoreError::Integrity { .. })
    }

    fn from_oci(e: crate::oci::OciError) -> StoreError {
        use crate::oci::OciError;
        let retry_after_ms = e.retry_after_ms();
        match e {
            OciError::NotAuthenticated(answer) => {
                StoreError::Denied { what: answer.what.clone(), reason: answer.to_string() }
            }
            OciError::NotFoundOrDenied(answer) => StoreError::NotFound { what: answer.to_string() },
            OciError::RateLimited { answer, .. } => {
                StoreError::RateLimited { what: answer.to_string(), retry_after_ms }
            }
            e if e.is_transient() => StoreError::Temporary { what: String::new(), reason: e.to_string() },
            e => StoreError::Other { reason: e.to_string() },
        }
    }

    fn from_opendal(what: &str, e: &opendal::Error) -> StoreError {
        use opendal::ErrorKind;
        let (what, reason) = (what.to_string(), e.to_string());
        // A credential the signer could not turn into a signature (a token endpoint's refusal) is
        // the credentials' fault, unless OpenDAL marks it temporary.
        let signing = reason.contains("called: reqsign::Sign") && !e.is_temporary();
        match e.kind() {
            ErrorKind::PermissionDenied => StoreError::Denied { what, reason },
            ErrorKind::Unexpected if signing => StoreError::Denied { what, reason },
            ErrorKind::NotFound => StoreError::NotFound { what },
            ErrorKind::RateLimited => StoreError::RateLimited { what, retry_after_ms: None },
            ErrorKind::ConditionNotMatch => StoreError::Changed { path: what },
            _ if e.is_temporary() => StoreError::Temporary { what, reason },
            ErrorKind::Unexpected => StoreError::Temporary { what, reason },
            _ => StoreError::Other { reason: format!("{what}: {reason}") },
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Denied { what, reason } => write!(
                f,
                "{what}: access denied ({}); check the credentials (the Secret named by spec.storage.key)",
                short(reason)
            ),
            StoreError::NotFound { what } => write!(f, "{what}: not found"),
            StoreError::RateLimited { what, .. } => write!(f, "{what}: rate limited by the store"),
            StoreError::Temporary { what, reason } => write!(f, "{what}: {}", short(reason)),
            StoreError::Stalled { what, stall_timeout_ms } => {
                write!(f, "{what}: no data for {stall_timeout_ms} ms, aborted")
            }
            StoreError::Truncated { path, got_bytes, expected_bytes } => {
                write!(f, "{path}: transfer cut at {got_bytes} of {expected_bytes} bytes")
            }
            StoreError::Integrity { path, expected, got } => {
                write!(f, "{path}: downloaded data does not match the store's listing: expected {expected}, got {got}")
            }
            StoreError::Empty { label } => write!(f, "no objects under {label}"),
            StoreError::Changed { path } => {
                write!(f, "{path}: the object was uploaded again since it was listed; listed again at the next attempt")
            }
            StoreError::Other { reason } => write!(f, "{reason}"),
        }
    }
}

/// OpenDAL's errors carry the whole response context: keep a reason to one readable line.
fn short(reason: &str) -> String {
    const REASON_CHARS_MAX: usize = 300;
    let line = reason.lines().next().unwrap_or_default();
    match line.char_indices().nth(REASON_CHARS_MAX) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}
