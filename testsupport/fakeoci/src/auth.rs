//! OCI's request signatures (draft-cavage HTTP signatures, version 1, rsa-sha256), checked as Object
//! Storage checks them: `Authorization: Signature version="1",keyId="<tenancy>/<user>/<fingerprint>",
//! algorithm="rsa-sha256",headers="(request-target) host date",signature="<base64>"`. Every request must
//! sign `(request-target)`, `host` and `date` (or `x-date`); a request with a body (POST, PUT, PATCH)
//! must also sign `content-length`, `content-type` and `x-content-sha256`, which must be the body's —
//! except PutObject and UploadPart, whose bodies OCI exempts. The date must be within the allowed skew.

use std::fmt;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderMap, Method};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};
use sha2::{Digest, Sha256};

use crate::keys::{PrivateKey, PublicKey};

/// An `Authorization` header longer than this is refused unread.
const AUTHORIZATION_BYTES_MAX: usize = 8 * 1024;
/// Signed headers per request at most.
const SIGNED_HEADERS_MAX: usize = 32;
const GENERIC_HEADERS: [&str; 2] = ["(request-target)", "host"];
const BODY_HEADERS: [&str; 3] = ["content-length", "content-type", "x-content-sha256"];

/// Why a request was refused (401 NotAuthenticated); recorded in the request log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    MissingAuthorization,
    Malformed(String),
    UnknownKeyId(String),
    MissingSignedHeader(String),
    /// A header listed as signed is absent from the request.
    AbsentHeader(String),
    BadSignature,
    /// `date` (or `x-date`) is unreadable or further from the server's clock than allowed.
    StaleDate(String),
    BodyHashMismatch,
    /// `ST$<token>` with a token the fake federation issued that has expired or was revoked.
    TokenExpired,
}

impl fmt::Display for AuthRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthRefusal::MissingAuthorization => write!(f, "no Authorization header"),
            AuthRefusal::Malformed(why) => write!(f, "malformed Authorization header: {why}"),
            AuthRefusal::UnknownKeyId(key_id) => write!(f, "unknown keyId {key_id:?}"),
            AuthRefusal::MissingSignedHeader(name) => write!(f, "the signature must cover {name:?}"),
            AuthRefusal::AbsentHeader(name) => write!(f, "signed header {name:?} is not in the request"),
            AuthRefusal::BadSignature => write!(f, "the signature does not verify with the key"),
            AuthRefusal::StaleDate(why) => write!(f, "date: {why}"),
            AuthRefusal::BodyHashMismatch => write!(f, "x-content-sha256 is not the body's"),
            AuthRefusal::TokenExpired => write!(f, "the security token has expired or was revoked"),
        }
    }
}

/// What the fake accepts: one API key (one keyId), and the session keys its federation registered
/// (keyId `ST$<token>`, while the token is valid).
#[derive(Clone, Debug)]
pub(crate) struct Verifier {
    pub key_id: String,
    pub key: PublicKey,
    pub clock_skew_max: Duration,
    pub sessions: std::sync::Arc<crate::instance::Sessions>,
}

/// The parts of a request a signature covers.
pub struct SignedRequest<'a> {
    pub method: &'a Method,
    /// Path and query exactly as sent.
    pub path_and_query: &'a str,
    pub headers: &'a HeaderMap,
    /// Only for methods with a body; `None` when the body was not read (exempt).
    pub body: Option<&'a [u8]>,
}

impl Verifier {
    pub fn verify(&self, request: &SignedRequest<'_>, now: SystemTime) -> Result<(), AuthRefusal> {
        let key_for = |key_id: &str| match key_id.strip_prefix("ST$") {
            Some(token) => self.sessions.key_for(token, now),
            None if key_id == self.key_id => Ok(self.key.clone()),
            None => Err(AuthRefusal::UnknownKeyId(key_id.to_owned())),
        };
        verify_signed(request, now, self.clock_skew_max, &GENERIC_HEADERS, &key_for)
    }
}

/// Checks `request`'s signature with the key `key_for` gives for its keyId: the signature must cover
/// `generic` and a date, and the body headers for a request with a body.
pub(crate) fn verify_signed(
    request: &SignedRequest<'_>,
    now: SystemTime,
    clock_skew_max: Duration,
    generic: &[&str],
    key_for: &dyn Fn(&str) -> Result<PublicKey, AuthRefusal>,
) -> Result<(), AuthRefusal> {
    let value = request.headers.get("authorization").ok_or(AuthRefusal::MissingAuthorization)?;
    if value.len() > AUTHORIZATION_BYTES_MAX {
        return Err(AuthRefusal::Malformed("too long".into()));
    }
    let value = value.to_str().map_err(|_| AuthRefusal::Malformed("not ASCII".into()))?;
    let params = parse_authorization(value)?;
    let key = key_for(&params.key_id)?;
    let date_header = required_headers(request, &params.headers, generic)?;
    let signing_string = signing_string(request, &params.headers)?;
    let signature = BASE64.decode(&params.signature).map_err(|_| AuthRefusal::Malformed("signature".into()))?;
    let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &key.pkcs1_der);
    verifier.verify(signing_string.as_bytes(), &signature).map_err(|_| AuthRefusal::BadSignature)?;
    check_date(request.headers, date_header, now, clock_skew_max)?;
    if let Some(body) = request.body
        && params.headers.iter().any(|h| h == "x-content-sha256")
    {
        let sent = request.headers.get("x-content-sha256").and_then(|v| v.to_str().ok()).unwrap_or("");
        if sent != BASE64.encode(Sha256::digest(body)) {
            return Err(AuthRefusal::BodyHashMismatch);
        }
    }
    Ok(())
}

fn check_date(headers: &HeaderMap, name: &str, now: SystemTime, clock_skew_max: Duration) -> Result<(), AuthRefusal> {
    let text = headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
    let date = httpdate::parse_http_date(text)
        .map_err(|_| AuthRefusal::StaleDate(format!("{name} {text:?} is not an HTTP date")))?;
    let skew = now.duration_since(date).or_else(|e| Ok::<_, ()>(e.duration())).unwrap_or_default();
    if skew > clock_skew_max {
        let max_s = clock_skew_max.as_secs();
        return Err(AuthRefusal::StaleDate(format!("{name} {text:?} is more than {max_s} s from the server's clock")));
    }
    Ok(())
}

/// PutObject (`/o/{name}`) and UploadPart (`/u/{name}`) bodies need not be signed.
fn body_exempt(request: &SignedRequest<'_>) -> bool {
    let path = request.path_and_query.split('?').next().unwrap_or("");
    *request.method == Method::PUT && (path.contains("/o/") || path.contains("/u/"))
}

/// Checks the signature covers what OCI requires; returns the date header it covers.
fn required_headers(
    request: &SignedRequest<'_>,
    signed: &[String],
    generic: &[&str],
) -> Result<&'static str, AuthRefusal> {
    let covers = |name: &str| signed.iter().any(|h| h == name);
    let missing = |name: &str| AuthRefusal::MissingSignedHeader(name.to_owned());
    let date = if covers("x-date") { "x-date" } else { "date" };
    for name in generic.iter().chain([&date]) {
        if !covers(name) {
            return Err(missing(name));
        }
    }
    let has_body = matches!(*request.method, Method::POST | Method::PUT | Method::PATCH);
    if has_body
        && !body_exempt(request)
        && let Some(name) = BODY_HEADERS.iter().find(|name| !covers(name))
    {
        return Err(missing(name));
    }
    Ok(date)
}

/// `name: value` lines in the order of the `headers` parameter, joined by `\n`.
pub fn signing_string(request: &SignedRequest<'_>, signed: &[String]) -> Result<String, AuthRefusal> {
    let mut lines = Vec::with_capacity(signed.len());
    for name in signed {
        if name == "(request-target)" {
            lines.push(format!(
                "(request-target): {} {}",
                request.method.as_str().to_lowercase(),
                request.path_and_query
            ));
            continue;
        }
        let value = request.headers.get(name.as_str()).ok_or_else(|| AuthRefusal::AbsentHeader(name.clone()))?;
        let value = value.to_str().map_err(|_| AuthRefusal::AbsentHeader(name.clone()))?;
        lines.push(format!("{name}: {}", value.trim()));
    }
    Ok(lines.join("\n"))
}

/// The parameters of `Signature k="v",…`.
#[derive(Debug, PartialEq, Eq)]
struct SignatureParams {
    key_id: String,
    headers: Vec<String>,
    signature: String,
}

fn parse_authorization(value: &str) -> Result<SignatureParams, AuthRefusal> {
    let malformed = |why: &str| AuthRefusal::Malformed(why.to_owned());
    let params = value.strip_prefix("Signature ").ok_or_else(|| malformed("not a Signature"))?;
    let (mut version, mut key_id, mut algorithm, mut headers, mut signature) = (None, None, None, None, None);
    for param in params.split(',') {
        let (name, quoted) = param.trim().split_once('=').ok_or_else(|| malformed("parameter without '='"))?;
        let value = quoted.strip_prefix('"').and_then(|v| v.strip_suffix('"')).ok_or_else(|| malformed("unquoted"))?;
        let slot = match name {
            "version" => &mut version,
            "keyId" => &mut key_id,
            "algorithm" => &mut algorithm,
            "headers" => &mut headers,
            "signature" => &mut signature,
            _ => return Err(malformed("unknown parameter")),
        };
        *slot = Some(value.to_owned());
    }
    if version.as_deref() != Some("1") {
        return Err(malformed("version must be \"1\""));
    }
    if algorithm.as_deref() != Some("rsa-sha256") {
        return Err(malformed("algorithm must be \"rsa-sha256\""));
    }
    // draft-cavage: without `headers`, only `date` is signed (which OCI then refuses as too little).
    let headers: Vec<String> = headers.as_deref().unwrap_or("date").split(' ').map(str::to_lowercase).collect();
    if headers.len() > SIGNED_HEADERS_MAX {
        return Err(malformed("too many signed headers"));
    }
    let key_id = key_id.ok_or_else(|| malformed("no keyId"))?;
    Ok(SignatureParams { key_id, headers, signature: signature.ok_or_else(|| malformed("no signature"))? })
}

/// Signs a request as OCI's SDKs do: sets `date` (if absent) and `authorization` in `headers`, signing
/// `date (request-target) host`, plus the body headers when `body` is given (`x-content-sha256` and
/// `content-length` are set from it). For the fake's tests and tools; `host` must already be set.
pub fn sign_request(
    key: &PrivateKey,
    key_id: &str,
    method: &Method,
    path_and_query: &str,
    headers: &mut HeaderMap,
    body: Option<&[u8]>,
) {
    sign_request_with(key, key_id, (method, path_and_query), headers, body, &["date", "(request-target)", "host"]);
}

/// `sign_request` with the generic headers given: the federation request signs `date (request-target)`
/// without `host`, as the SDKs do.
pub fn sign_request_with(
    key: &PrivateKey,
    key_id: &str,
    (method, path_and_query): (&Method, &str),
    headers: &mut HeaderMap,
    body: Option<&[u8]>,
    generic: &[&str],
) {
    if !headers.contains_key("date") {
        headers.insert("date", httpdate::fmt_http_date(SystemTime::now()).parse().expect("ASCII"));
    }
    let mut signed: Vec<String> = generic.iter().map(|h| h.to_string()).collect();
    if let Some(body) = body {
        headers.insert("x-content-sha256", BASE64.encode(Sha256::digest(body)).parse().expect("ASCII"));
        headers.insert("content-length", body.len().into());
        headers.entry("content-type").or_insert("application/json".parse().expect("ASCII"));
        signed.extend(BODY_HEADERS.map(String::from));
    }
    let request = SignedRequest { method, path_and_query, headers, body };
    let text = signing_string(&request, &signed).expect("every signed header was set");
    let signature = BASE64.encode(key.sign(text.as_bytes()));
    let value = format!(
        "Signature version=\"1\",keyId=\"{key_id}\",algorithm=\"rsa-sha256\",headers=\"{}\",signature=\"{signature}\"",
        signed.join(" ")
    );
    headers.insert("authorization", value.parse().expect("ASCII"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::test_keys;

    fn verifier() -> Verifier {
        let key = PublicKey::from_pem(test_keys::PUBLIC_KEY_PEM).unwrap();
        let key_id = format!("{}/{}/{}", test_keys::TENANCY, test_keys::USER, key.fingerprint);
        Verifier { key_id, key, clock_skew_max: Duration::from_secs(300), sessions: Default::default() }
    }

    fn signed_headers(key_pem: &str, method: &Method, target: &str, body: Option<&[u8]>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9".parse().unwrap());
        let key = PrivateKey::from_pem(key_pem).unwrap();
        sign_request(&key, &verifier().key_id, method, target, &mut headers, body);
        headers
    }

    #[test]
    fn a_signed_request_verifies_and_any_change_breaks_it() {
        let v = verifier();
        let now = SystemTime::now();
        let target = "/n/ns/b/bucket/o?prefix=a%2Fb&limit=3";
        let headers = signed_headers(test_keys::PRIVATE_KEY_PEM, &Method::GET, target, None);
        let request =
            |target, headers| SignedRequest { method: &Method::GET, path_and_query: target, headers, body: None };
        assert_eq!(v.verify(&request(target, &headers), now), Ok(()));
        assert_eq!(v.verify(&request("/n/ns/b/bucket/o?prefix=a", &headers), now), Err(AuthRefusal::BadSignature));
        let mut moved = headers.clone();
        moved.insert("host", "127.0.0.1:10".parse().unwrap());
        assert_eq!(v.verify(&request(target, &moved), now), Err(AuthRefusal::BadSignature));
        let other = signed_headers(test_keys::OTHER_PRIVATE_KEY_PEM, &Method::GET, target, None);
        assert_eq!(v.verify(&request(target, &other), now), Err(AuthRefusal::BadSignature));
        let later = now + Duration::from_secs(301);
        assert!(matches!(v.verify(&request(target, &headers), later), Err(AuthRefusal::StaleDate(_))));
        assert_eq!(v.verify(&request(target, &HeaderMap::new()), now), Err(AuthRefusal::MissingAuthorization));
    }

    #[test]
    fn bodies_must_be_signed_except_put_object() {
        let v = verifier();
        let now = SystemTime::now();
        let (target, body) = ("/n/ns/b/bucket/actions/renameObject", &b"{}"[..]);
        let signed = signed_headers(test_keys::PRIVATE_KEY_PEM, &Method::POST, target, Some(body));
        let request = |headers, body| SignedRequest { method: &Method::POST, path_and_query: target, headers, body };
        assert_eq!(v.verify(&request(&signed, Some(body)), now), Ok(()));
        assert_eq!(v.verify(&request(&signed, Some(b"{} ")), now), Err(AuthRefusal::BodyHashMismatch));
        let unsigned_body = signed_headers(test_keys::PRIVATE_KEY_PEM, &Method::POST, target, None);
        let refused = v.verify(&request(&unsigned_body, Some(body)), now);
        assert_eq!(refused, Err(AuthRefusal::MissingSignedHeader("content-length".into())));
        let put = signed_headers(test_keys::PRIVATE_KEY_PEM, &Method::PUT, "/n/ns/b/bucket/o/x", None);
        let put_request =
            SignedRequest { method: &Method::PUT, path_and_query: "/n/ns/b/bucket/o/x", headers: &put, body: None };
        assert_eq!(v.verify(&put_request, now), Ok(()));
    }

    #[test]
    fn authorization_parameters_parse_strictly() {
        let ok = r#"Signature version="1",keyId="t/u/f",algorithm="rsa-sha256",headers="date (request-target) host",signature="c2ln""#;
        let params = parse_authorization(ok).unwrap();
        assert_eq!(params.headers, ["date", "(request-target)", "host"]);
        assert_eq!(params.key_id, "t/u/f");
        assert!(parse_authorization(&ok.replace("rsa-sha256", "hmac-sha256")).is_err());
        assert!(parse_authorization(&ok.replace("version=\"1\"", "version=\"2\"")).is_err());
        assert!(parse_authorization("Bearer x").is_err());
    }
}
