//! What can go wrong talking to OCI Object Storage, as reasons a user can act on (OCI's error `code`
//! and `opc-request-id` included, for Oracle support), with hints for the caller's backoff.

use std::fmt;
use std::time::SystemTime;

use http::{HeaderMap, StatusCode};

/// A `Retry-After` further away than this is capped: a misbehaving server must not park a model for days.
const RETRY_AFTER_MS_MAX: u64 = 60 * 60 * 1000;

/// What OCI said about a refused request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAnswer {
    /// `GET /n/ns/b/bucket/o` (no query: it may hold object names only).
    pub what: String,
    pub status: u16,
    /// OCI's error code (`NotAuthenticated`, `BucketNotFound`, …), when the body had one.
    pub code: Option<String>,
    pub message: Option<String>,
    pub request_id: Option<String>,
}

/// One failure of an Object Storage request or a body read. Never holds a key or a signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OciError {
    BadConfig {
        reason: String,
    },
    /// The API key cannot be used (unreadable PEM, not RSA, passphrase-protected).
    BadKey {
        reason: String,
    },
    Unsupported {
        what: String,
    },
    /// The InstancePrincipal cannot get a token: the metadata service's answer, the instance
    /// certificate, or the federation service's refusal.
    InstancePrincipal {
        reason: String,
    },
    /// 401: the signature, key, fingerprint, tenancy, user or clock is wrong.
    NotAuthenticated(ServiceAnswer),
    /// 403 or 404 (OCI answers 404 `BucketNotFound`/`NotAuthorizedOrNotFound` for both).
    NotFoundOrDenied(ServiceAnswer),
    RateLimited {
        answer: ServiceAnswer,
        retry_after_ms: Option<u64>,
    },
    /// 5xx or 408.
    Server {
        answer: ServiceAnswer,
        retry_after_ms: Option<u64>,
    },
    UnexpectedStatus(ServiceAnswer),
    Network {
        reason: String,
    },
    /// No byte for the stall timeout.
    Stalled {
        what: String,
        stall_timeout_ms: u64,
    },
    /// The body ended with an error (a closed connection) before its end.
    Cut {
        what: String,
        reason: String,
    },
    /// An answer that does not follow the API (bad JSON, headers, limits passed).
    Protocol {
        reason: String,
    },
}

impl OciError {
    /// How long the server asked us to wait, if it did.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            OciError::RateLimited { retry_after_ms, .. } | OciError::Server { retry_after_ms, .. } => *retry_after_ms,
            _ => None,
        }
    }

    /// Whether trying again may help without a change of configuration.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            OciError::RateLimited { .. }
                | OciError::Server { .. }
                | OciError::Network { .. }
                | OciError::Stalled { .. }
                | OciError::Cut { .. }
        )
    }
}

impl fmt::Display for ServiceAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A HEAD answer has no body, so no code: the status's reason phrase stands in.
        let reason = StatusCode::from_u16(self.status).ok().and_then(|s| s.canonical_reason());
        let code = self.code.as_deref().or(reason).unwrap_or("(no error code)");
        write!(f, "{}: {} {code}", self.what, self.status)?;
        if let Some(message) = &self.message {
            write!(f, ": {message}")?;
        }
        if let Some(id) = &self.request_id {
            write!(f, " (opc-request-id {id})")?;
        }
        Ok(())
    }
}

impl fmt::Display for OciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OciError::BadConfig { reason } => write!(f, "OCI configuration: {reason}"),
            OciError::BadKey { reason } => write!(f, "OCI API key: {reason}"),
            OciError::Unsupported { what } => write!(f, "OCI: {what} is not supported yet"),
            OciError::InstancePrincipal { reason } => write!(f, "OCI InstancePrincipal: {reason}"),
            OciError::NotAuthenticated(answer) => write!(
                f,
                "OCI {answer}; not authenticated: check the API key, its fingerprint, the tenancy and user OCIDs \
                 (for InstancePrincipal: the instance's certificate and token), and the node's clock"
            ),
            OciError::NotFoundOrDenied(answer) => {
                write!(f, "OCI {answer}; check the namespace, bucket and object names and the user's policies")
            }
            OciError::RateLimited { answer, retry_after_ms } => {
                write!(f, "OCI {answer}")?;
                retry_after_ms.map_or(Ok(()), |ms| write!(f, "; retry after {} s", ms.div_ceil(1000)))
            }
            OciError::Server { answer, .. } | OciError::UnexpectedStatus(answer) => write!(f, "OCI {answer}"),
            OciError::Network { reason } => write!(f, "OCI network error: {reason}"),
            OciError::Stalled { what, stall_timeout_ms } => {
                write!(f, "OCI {what}: no byte for {} s", stall_timeout_ms / 1000)
            }
            OciError::Cut { what, reason } => write!(f, "OCI {what}: body cut: {reason}"),
            OciError::Protocol { reason } => write!(f, "OCI protocol error: {reason}"),
        }
    }
}

impl std::error::Error for OciError {}

/// The error for a status the request did not expect; `body` is the (bounded) error body.
pub(super) fn classify_status(status: StatusCode, headers: &HeaderMap, body: &[u8], what: &str) -> OciError {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        code: Option<String>,
        message: Option<String>,
    }
    let parsed: Option<ErrorBody> = serde_json::from_slice(body).ok();
    let (code, message) = parsed.map_or((None, None), |b| (b.code, b.message));
    let request_id = headers.get("opc-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let answer = ServiceAnswer { what: what.to_owned(), status: status.as_u16(), code, message, request_id };
    let retry_after_ms =
        headers.get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(parse_retry_after_ms);
    match status.as_u16() {
        401 => OciError::NotAuthenticated(answer),
        403 | 404 => OciError::NotFoundOrDenied(answer),
        429 => OciError::RateLimited { answer, retry_after_ms },
        408 | 500..=599 => OciError::Server { answer, retry_after_ms },
        _ => OciError::UnexpectedStatus(answer),
    }
}

/// `Retry-After` as seconds or an HTTP date, capped.
pub(super) fn parse_retry_after_ms(value: &str) -> Option<u64> {
    let value = value.trim();
    let ms = match value.parse::<u64>() {
        Ok(seconds) => seconds.saturating_mul(1000),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(SystemTime::now()).map_or(0, |d| d.as_millis() as u64)
        }
    };
    Some(ms.min(RETRY_AFTER_MS_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_classify_with_oci_codes_and_request_ids() {
        let mut headers = HeaderMap::new();
        headers.insert("opc-request-id", "abc".parse().unwrap());
        headers.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        let body = br#"{"code":"NotAuthenticated","message":"The required information was not provided."}"#;
        let error = classify_status(StatusCode::UNAUTHORIZED, &headers, body, "GET /n/");
        let text = error.to_string();
        assert!(text.contains("401 NotAuthenticated") && text.contains("opc-request-id abc"), "{text}");
        let limited = classify_status(StatusCode::TOO_MANY_REQUESTS, &headers, b"not json", "GET /n/");
        assert_eq!(limited.retry_after_ms(), Some(7000));
        assert!(limited.is_transient());
        let missing = classify_status(StatusCode::NOT_FOUND, &HeaderMap::new(), b"", "HEAD x");
        assert!(matches!(missing, OciError::NotFoundOrDenied(_)) && !missing.is_transient());
    }

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_capped() {
        assert_eq!(parse_retry_after_ms("3"), Some(3000));
        assert_eq!(parse_retry_after_ms("99999999"), Some(RETRY_AFTER_MS_MAX));
        assert_eq!(parse_retry_after_ms("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(parse_retry_after_ms("soon"), None);
    }
}
