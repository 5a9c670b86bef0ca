//! What can go wrong talking to the Hub, as reasons a user can act on, with hints for the caller's backoff.

use std::fmt;
use std::time::SystemTime;

use http::{HeaderMap, StatusCode};

/// A `Retry-After` further away than this is capped: a misbehaving server must not park a model for days.
const RETRY_AFTER_MS_MAX: u64 = 60 * 60 * 1000;

/// One failure of a Hub request or a file transfer. Never holds a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HfError {
    BadRepoId {
        repo_id: String,
        reason: &'static str,
    },
    BadEndpoint {
        endpoint: String,
        reason: String,
    },
    RepoNotFound {
        repo_id: String,
        token_sent: bool,
    },
    RevisionNotFound {
        repo_id: String,
        revision: String,
    },
    EntryNotFound {
        repo_id: String,
        path: String,
    },
    Gated {
        repo_id: String,
        token_sent: bool,
    },
    Unauthorized {
        repo_id: String,
        status: u16,
        token_sent: bool,
    },
    RateLimited {
        retry_after_ms: Option<u64>,
    },
    /// 5xx or 408.
    Server {
        status: u16,
        retry_after_ms: Option<u64>,
    },
    /// Any other status the request did not expect.
    UnexpectedStatus {
        status: u16,
        what: String,
    },
    Network {
        reason: String,
    },
    /// An answer that does not follow the Hub's API (bad JSON, bad sha, bad Content-Range, limits passed).
    Protocol {
        reason: String,
    },
    Integrity {
        path: String,
        expected: String,
        got: String,
    },
    /// The body ended before the file's size; the partial file keeps what arrived.
    Truncated {
        path: String,
        got_bytes: u64,
        expected_bytes: u64,
        reason: String,
    },
    /// No byte for the stall timeout; the partial file keeps what arrived.
    Stalled {
        what: String,
        stall_timeout_ms: u64,
    },
    BadPath {
        path: String,
        reason: &'static str,
    },
    LocalIo {
        path: String,
        reason: String,
    },
}

impl HfError {
    /// How long the server asked the caller to wait before the next attempt.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            HfError::RateLimited { retry_after_ms } | HfError::Server { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// True when retrying soon would fail the same way until a person acts (grants access, fixes the
    /// spec or the token): the caller backs off slowly (e.g. from 5 min). A private repo without a token
    /// looks like RepoNotFound, so that one waits slowly too.
    pub fn retry_slowly(&self) -> bool {
        matches!(
            self,
            HfError::Gated { .. }
                | HfError::Unauthorized { .. }
                | HfError::RepoNotFound { .. }
                | HfError::RevisionNotFound { .. }
                | HfError::EntryNotFound { .. }
                | HfError::BadRepoId { .. }
                | HfError::BadEndpoint { .. }
                | HfError::BadPath { .. }
        )
    }
}

fn token_hint(token_sent: bool) -> &'static str {
    if token_sent {
        "the token sent has no access to it"
    } else {
        "no token was sent: give one (the Secret named by spec.storage.key, parameters.token or HF_TOKEN)"
    }
}

impl fmt::Display for HfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HfError::BadRepoId { repo_id, reason } => write!(f, "bad Hugging Face repo id {repo_id:?}: {reason}"),
            HfError::BadEndpoint { endpoint, reason } => write!(f, "bad Hugging Face endpoint {endpoint:?}: {reason}"),
            HfError::RepoNotFound { repo_id, token_sent } => {
                write!(f, "repo {repo_id} not found (or private and {})", token_hint(*token_sent))
            }
            HfError::RevisionNotFound { repo_id, revision } => {
                write!(f, "revision {revision:?} not found in repo {repo_id}")
            }
            HfError::EntryNotFound { repo_id, path } => write!(f, "file {path:?} not found in repo {repo_id}"),
            HfError::Gated { repo_id, token_sent } => write!(
                f,
                "repo {repo_id} is gated: {}; access is requested on the repo's page",
                token_hint(*token_sent)
            ),
            HfError::Unauthorized { repo_id, status, token_sent } => {
                write!(f, "repo {repo_id} refused access (HTTP {status}): {}", token_hint(*token_sent))
            }
            HfError::RateLimited { retry_after_ms: Some(ms) } => {
                write!(f, "rate limited by the Hub: retry after {ms} ms")
            }
            HfError::RateLimited { retry_after_ms: None } => write!(f, "rate limited by the Hub (no Retry-After)"),
            HfError::Server { status, .. } => write!(f, "the Hub answered HTTP {status}"),
            HfError::UnexpectedStatus { status, what } => write!(f, "unexpected HTTP {status} for {what}"),
            HfError::Network { reason } => write!(f, "network error: {reason}"),
            HfError::Protocol { reason } => write!(f, "unexpected answer from the Hub: {reason}"),
            HfError::Integrity { path, expected, got } => {
                write!(f, "{path}: downloaded data does not match the Hub's manifest: expected {expected}, got {got}")
            }
            HfError::Truncated { path, got_bytes, expected_bytes, reason } => {
                write!(f, "{path}: transfer cut at {got_bytes} of {expected_bytes} bytes ({reason})")
            }
            HfError::Stalled { what, stall_timeout_ms } => {
                write!(f, "{what}: no data for {stall_timeout_ms} ms, aborted")
            }
            HfError::BadPath { path, reason } => write!(f, "refusing file path {path:?} from the Hub: {reason}"),
            HfError::LocalIo { path, reason } => write!(f, "{path}: {reason}"),
        }
    }
}

impl std::error::Error for HfError {}

/// What a failed request was about, to name it in the error.
pub(super) struct RequestContext<'a> {
    pub repo_id: &'a str,
    pub revision: Option<&'a str>,
    /// The file, for a `resolve` request.
    pub path: Option<&'a str>,
    pub token_sent: bool,
}

/// Turns a non-success answer into an error: the Hub's `X-Error-Code` first, the status otherwise.
pub(super) fn classify_status(status: StatusCode, headers: &HeaderMap, context: &RequestContext<'_>) -> HfError {
    let repo_id = context.repo_id.to_owned();
    let token_sent = context.token_sent;
    let code = headers.get("x-error-code").and_then(|v| v.to_str().ok()).unwrap_or("");
    match code {
        "RepoNotFound" => return HfError::RepoNotFound { repo_id, token_sent },
        "RevisionNotFound" => {
            let revision = context.revision.unwrap_or("").to_owned();
            return HfError::RevisionNotFound { repo_id, revision };
        }
        "EntryNotFound" => return HfError::EntryNotFound { repo_id, path: context.path.unwrap_or("").to_owned() },
        "GatedRepo" => return HfError::Gated { repo_id, token_sent },
        _ => {}
    }
    let retry_after_ms =
        headers.get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after_ms);
    match status.as_u16() {
        401 | 403 => HfError::Unauthorized { repo_id, status: status.as_u16(), token_sent },
        404 => match context.path {
            Some(path) => HfError::EntryNotFound { repo_id, path: path.to_owned() },
            None => HfError::RepoNotFound { repo_id, token_sent },
        },
        429 => HfError::RateLimited { retry_after_ms },
        408 | 500..=599 => HfError::Server { status: status.as_u16(), retry_after_ms },
        other => {
            let what = context.path.map_or_else(|| format!("repo {repo_id}"), |p| format!("{p} in repo {repo_id}"));
            HfError::UnexpectedStatus { status: other, what }
        }
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110 §10.2.3), in ms from now, capped.
pub(super) fn parse_retry_after_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(seconds.saturating_mul(1000).min(RETRY_AFTER_MS_MAX));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let wait = when.duration_since(SystemTime::now()).unwrap_or_default();
    Some((wait.as_millis().min(u128::from(RETRY_AFTER_MS_MAX))) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        assert_eq!(parse_retry_after_ms("7"), Some(7000));
        assert_eq!(parse_retry_after_ms(" 0 "), Some(0));
        assert_eq!(parse_retry_after_ms("99999999"), Some(RETRY_AFTER_MS_MAX));
        let later = SystemTime::now() + std::time::Duration::from_secs(120);
        let ms = parse_retry_after_ms(&httpdate::fmt_http_date(later)).unwrap();
        assert!((110_000..=120_000).contains(&ms), "{ms}");
        assert_eq!(parse_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"), Some(0));
        assert_eq!(parse_retry_after_ms("soon"), None);
    }

    #[test]
    fn status_without_error_code_still_names_the_cause() {
        let context = RequestContext { repo_id: "o/r", revision: Some("main"), path: None, token_sent: false };
        let headers = HeaderMap::new();
        let error = classify_status(StatusCode::SERVICE_UNAVAILABLE, &headers, &context);
        assert_eq!(error, HfError::Server { status: 503, retry_after_ms: None });
        let error = classify_status(StatusCode::FORBIDDEN, &headers, &context);
        assert!(error.retry_slowly(), "{error}");
        let error = classify_status(StatusCode::NOT_FOUND, &headers, &context);
        assert_eq!(error, HfError::RepoNotFound { repo_id: "o/r".into(), token_sent: false });
    }
}
