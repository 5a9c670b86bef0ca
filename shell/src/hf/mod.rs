//! The Hugging Face Hub client: resolve a revision to a commit, list the commit's files with their sizes
//! and hashes, and fetch one file into a partial file (resumed, hashed while streaming, verified).
//! Retries and backoff belong to the caller (the core decides them); errors carry the hints.

mod error;
mod fetch;
mod hashing;
mod http;
mod listing;
mod network;
#[cfg(test)]
mod olah_tests;
mod paths;
mod ranged;
#[cfg(test)]
mod tests;
mod writeback;

use std::fmt;

pub use error::HfError;
pub use fetch::{Meter, fetch_file};
pub use hashing::FileHash;
pub use hashing::file_matches;
pub use hashing::{StreamHasher, hash_growing_prefix, hash_prefix};
pub use listing::{RemoteFile, check_sizes, check_unique};
pub use network::{Network, read_ca_bundle};
pub use paths::{REPO_PATH_COMPONENTS_MAX, check_repo_id, check_repo_path, is_commit_sha};
pub use ranged::{RangeAnswer, fetch_range};
pub(crate) use writeback::Writeback;

/// A Hub endpoint and the token for it (sent to that origin only).
#[derive(Clone)]
pub struct HfSource {
    endpoint: String,
    token: Option<String>,
    origin: http::Origin,
    client: http::HttpClient,
    /// For the API requests (revision, tree pages): no byte for this long aborts the request.
    api_stall_timeout_ms: u64,
}

impl fmt::Debug for HfSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = self.token.as_ref().map(|_| "<redacted>");
        f.debug_struct("HfSource").field("endpoint", &self.endpoint).field("token", &token).finish_non_exhaustive()
    }
}

impl HfSource {
    /// `endpoint` is `http(s)://host[:port][/prefix]` (e.g. `https://huggingface.co` or a mirror).
    pub fn new(
        endpoint: &str,
        token: Option<String>,
        connect_timeout_ms: u64,
        api_stall_timeout_ms: u64,
        network: &Network,
    ) -> Result<HfSource, HfError> {
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let bad = |reason: &str| HfError::BadEndpoint { endpoint: endpoint.clone(), reason: reason.to_owned() };
        let uri: ::http::Uri = endpoint.parse().map_err(|_| bad("not a URL"))?;
        if uri.query().is_some() {
            return Err(bad("must not have a query"));
        }
        let origin = http::Origin::of(&uri).ok_or_else(|| bad("must be http:// or https:// with a host"))?;
        let token = token.filter(|t| !t.is_empty());
        let client =
            http::HttpClient::new(connect_timeout_ms, network).map_err(|reason| HfError::Network { reason })?;
        Ok(HfSource { endpoint, token, origin, client, api_stall_timeout_ms })
    }

    #[cfg(test)]
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn credentials(&self) -> http::Credentials<'_> {
        http::Credentials { origin: &self.origin, token: self.token.as_deref() }
    }

    fn url(&self, path_and_query: &str) -> Result<::http::Uri, HfError> {
        let url = format!("{}{path_and_query}", self.endpoint);
        url.parse().map_err(|_| HfError::Protocol { reason: format!("cannot build a URL from {path_and_query:?}") })
    }
}

/// Percent-encodes one URL path segment (a revision: `refs/pr/1` becomes `refs%2Fpr%2F1`).
fn encode_segment(segment: &str) -> String {
    const SEGMENT: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    percent_encoding::utf8_percent_encode(segment, SEGMENT).to_string()
}

/// Percent-encodes a file path, keeping its `/`.
fn encode_path(path: &str) -> String {
    path.split('/').map(encode_segment).collect::<Vec<_>>().join("/")
}
