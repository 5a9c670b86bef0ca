//! What OCI's `InstancePrincipal` authentication talks to, faked on the same listener: the instance
//! metadata service (`GET /opc/v2/instance/region`, `…/canonicalRegionName`, `…/identity/cert.pem`,
//! `key.pem`, `intermediate.pem`; only with `Authorization: Bearer Oracle`, else 401) and the federation
//! service (`POST /v1/x509`). The federation checks what the real one is documented to: the request is
//! signed with the instance certificate's key, keyId `{tenancy}/fed-x509-sha256/{SHA-256 of the
//! certificate, lowercase hex pairs}` for `fingerprintAlgorithm: "SHA256"` (the Go SDK) or
//! `{tenancy}/fed-x509/{SHA-1, uppercase}` without it (the Python SDK), covering `date
//! (request-target)` and the body headers; the certificate is the fake instance's, its intermediate is
//! sent. It answers `{"token": JWT}` and registers the request's `publicKey` as the session key: Object
//! Storage requests signed with keyId `ST${token}` and that key are then accepted until the token's
//! `exp` (or `revoke_tokens`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64URL};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::api::oci_error;
use crate::auth::{AuthRefusal, SignedRequest, verify_signed};
use crate::keys::{PublicKey, certificate_parts, test_keys};
use crate::{REQUEST_BODY_BYTES_MAX, Shared};

/// Tokens kept at most (a test makes a handful; a runaway client must not grow the map forever).
const TOKENS_MAX: usize = 10_000;

/// The fake instance: its region, identity (certificate, key, intermediate) and how long tokens live.
#[derive(Clone, Debug)]
pub struct InstanceConfig {
    pub region: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub intermediate_pem: String,
    /// The `exp` of an issued token, from its issue (OCI's last about 20 minutes).
    pub token_ttl_s: u64,
}

impl Default for InstanceConfig {
    fn default() -> Self {
        InstanceConfig {
            region: "us-ashburn-1".into(),
            cert_pem: test_keys::INSTANCE_CERT_PEM.into(),
            key_pem: test_keys::INSTANCE_KEY_PEM.into(),
            intermediate_pem: test_keys::INSTANCE_INTERMEDIATE_PEM.into(),
            token_ttl_s: 1200,
        }
    }
}

/// The tokens the federation issued and their session keys.
#[derive(Debug, Default)]
pub struct Sessions {
    by_token: Mutex<BTreeMap<String, SessionEntry>>,
    issued: AtomicU64,
}

/// A session key and when its token stops working.
#[derive(Debug)]
struct SessionEntry(PublicKey, SystemTime);

impl Sessions {
    /// The session key of `token`, while it is valid.
    pub(crate) fn key_for(&self, token: &str, now: SystemTime) -> Result<PublicKey, AuthRefusal> {
        let tokens = self.by_token.lock().unwrap();
        match tokens.get(token) {
            Some(SessionEntry(key, expires)) if now < *expires => Ok(key.clone()),
            Some(_) => Err(AuthRefusal::TokenExpired),
            None => Err(AuthRefusal::UnknownKeyId(format!("ST${token}"))),
        }
    }

    /// Every token issued so far stops working (as after a revocation or a clock jump).
    pub fn revoke_all(&self) {
        for SessionEntry(_, expires) in self.by_token.lock().unwrap().values_mut() {
            *expires = UNIX_EPOCH;
        }
    }

    /// Tokens issued so far.
    pub fn issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    fn issue(&self, key: PublicKey, expires: SystemTime, claims: serde_json::Value) -> String {
        let serial = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        let header = BASE64URL.encode(br#"{"alg":"RS256","typ":"JWT","kid":"fakeoci"}"#);
        let mut claims = claims;
        claims["jti"] = format!("fakeoci-token-{serial}").into();
        let token = format!("{header}.{}.{}", BASE64URL.encode(claims.to_string()), BASE64URL.encode(b"fakeoci"));
        let mut tokens = self.by_token.lock().unwrap();
        if tokens.len() >= TOKENS_MAX {
            tokens.clear();
        }
        tokens.insert(token.clone(), SessionEntry(key, expires));
        token
    }
}

/// The metadata paths served (under `/opc/v2/`).
const METADATA_PATHS: [&str; 5] = [
    "instance/region",
    "instance/canonicalRegionName",
    "identity/cert.pem",
    "identity/key.pem",
    "identity/intermediate.pem",
];

pub(crate) fn router() -> Router<std::sync::Arc<Shared>> {
    let metadata_routes = METADATA_PATHS.iter().map(|path| format!("/opc/v2/{path}"));
    metadata_routes
        .fold(Router::new().route("/v1/x509", post(federation)), |router, path| router.route(&path, get(metadata)))
}

/// One metadata value, for `Authorization: Bearer Oracle` only (the v2 endpoint's rule).
async fn metadata(State(shared): State<std::sync::Arc<Shared>>, uri: Uri, request: Request) -> Response {
    let bearer = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    if bearer != Some("Bearer Oracle") {
        return (StatusCode::UNAUTHORIZED, "Authorization: Bearer Oracle is required\n").into_response();
    }
    let instance = &shared.config.instance;
    let text = match uri.path().rsplit('/').next().unwrap_or("") {
        "region" | "canonicalRegionName" => &instance.region,
        "cert.pem" => &instance.cert_pem,
        "key.pem" => &instance.key_pem,
        _ => &instance.intermediate_pem,
    };
    ([(CONTENT_TYPE, "text/plain")], text.clone()).into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FederationRequest {
    certificate: String,
    public_key: String,
    #[serde(default)]
    intermediate_certificates: Vec<String>,
    fingerprint_algorithm: Option<String>,
}

/// Why the federation refused a request, for the request log (`auth_refused`).
#[derive(Clone, Debug)]
pub(crate) struct RefusalNote(pub String);

fn refused(why: &str) -> Response {
    let mut response = oci_error(
        StatusCode::UNAUTHORIZED,
        "NotAuthenticated",
        &format!("The federation request is not authenticated: {why}"),
    );
    response.extensions_mut().insert(RefusalNote(why.to_owned()));
    response
}

/// `POST /v1/x509`: checks the request (see the module's doc) and issues a token.
async fn federation(State(shared): State<std::sync::Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await else {
        return oci_error(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", "body too large");
    };
    let Ok(asked) = serde_json::from_slice::<FederationRequest>(&body) else {
        return oci_error(StatusCode::BAD_REQUEST, "InvalidParameter", "not a federation request");
    };
    let (tenancy, subject, key_id) = match expected_identity(&shared, &asked) {
        Ok(found) => found,
        Err(why) => return refused(&why),
    };
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let signed = SignedRequest { method: &parts.method, path_and_query, headers: &parts.headers, body: Some(&body) };
    let now = SystemTime::now();
    let clock_skew_max = Duration::from_secs(shared.config.clock_skew_max_s);
    let cert_key = instance_key(&shared).expect("the instance certificate was parsed above");
    let key_for = |sent: &str| {
        if sent == key_id { Ok(cert_key.clone()) } else { Err(AuthRefusal::UnknownKeyId(sent.to_owned())) }
    };
    if let Err(refusal) = verify_signed(&signed, now, clock_skew_max, &["(request-target)"], &key_for) {
        return refused(&refusal.to_string());
    }
    let Some(session_key) = BASE64.decode(&asked.public_key).ok().and_then(|d| PublicKey::from_spki_der(&d).ok())
    else {
        return oci_error(StatusCode::BAD_REQUEST, "InvalidParameter", "publicKey is not an RSA public key");
    };
    let ttl = Duration::from_secs(shared.config.instance.token_ttl_s);
    let issued_s = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let claims = serde_json::json!({
        "sub": subject, "tenant": tenancy, "ptype": "instance", "iss": "authService.oracle.com",
        "iat": issued_s, "exp": issued_s + ttl.as_secs(),
    });
    let token = shared.sessions.issue(session_key, now + ttl, claims);
    let body = serde_json::json!({ "token": token }).to_string();
    Response::builder().header(CONTENT_TYPE, "application/json").body(Body::from(body)).expect("valid response")
}

/// The fake instance certificate's public key.
fn instance_key(shared: &Shared) -> Option<PublicKey> {
    let der = CertificateDer::from_pem_slice(shared.config.instance.cert_pem.as_bytes()).ok()?;
    PublicKey::from_spki_der(&certificate_parts(der.as_ref())?.spki_der).ok()
}

fn der_of_pem(pem: &str) -> Option<Vec<u8>> {
    CertificateDer::from_pem_slice(pem.as_bytes()).ok().map(|d| d.as_ref().to_vec())
}

/// The tenancy and instance the request's certificate names, and the keyId it must be signed with;
/// `Err` when the certificate is not the fake instance's or its intermediate is missing.
fn expected_identity(shared: &Shared, asked: &FederationRequest) -> Result<(String, String, String), String> {
    let instance = &shared.config.instance;
    let sent = BASE64.decode(&asked.certificate).map_err(|_| "certificate is not base64 DER".to_string())?;
    if Some(&sent) != der_of_pem(&instance.cert_pem).as_ref() {
        return Err("the certificate is not one this service issued".into());
    }
    let intermediate = der_of_pem(&instance.intermediate_pem).map(|d| BASE64.encode(d));
    if !asked.intermediate_certificates.iter().any(|c| Some(c) == intermediate.as_ref()) {
        return Err("the certificate's intermediate is missing from intermediateCertificates".into());
    }
    let parts = certificate_parts(&sent).ok_or("the certificate does not parse")?;
    let value = |prefix: &str| parts.subject_values.iter().find_map(|v| v.strip_prefix(prefix).map(str::to_owned));
    let tenancy = value("opc-tenant:").ok_or("the certificate names no opc-tenant")?;
    let subject = parts.subject_values.first().cloned().unwrap_or_default();
    let key_id = match asked.fingerprint_algorithm.as_deref() {
        Some("SHA256") => format!("{tenancy}/fed-x509-sha256/{}", hex_pairs(&Sha256::digest(&sent), false)),
        None => format!("{tenancy}/fed-x509/{}", hex_pairs(&sha1::Sha1::digest(&sent), true)),
        Some(other) => return Err(format!("fingerprintAlgorithm {other:?} is not SHA256")),
    };
    Ok((tenancy, subject, key_id))
}

fn hex_pairs(bytes: &[u8], upper: bool) -> String {
    let pairs: Vec<String> =
        bytes.iter().map(|b| if upper { format!("{b:02X}") } else { format!("{b:02x}") }).collect();
    pairs.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_carry_their_claims_and_expire() {
        let sessions = Sessions::default();
        let key = PublicKey::from_pem(test_keys::PUBLIC_KEY_PEM).unwrap();
        let now = SystemTime::now();
        let token = sessions.issue(key, now + Duration::from_secs(60), serde_json::json!({"exp": 5}));
        let payload = BASE64URL.decode(token.split('.').nth(1).unwrap()).unwrap();
        let claims: serde_json::Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!((claims["exp"].as_u64(), claims["jti"].as_str()), (Some(5), Some("fakeoci-token-1")));
        assert!(sessions.key_for(&token, now).is_ok());
        assert_eq!(sessions.key_for(&token, now + Duration::from_secs(61)).unwrap_err(), AuthRefusal::TokenExpired);
        sessions.revoke_all();
        assert_eq!(sessions.key_for(&token, now).unwrap_err(), AuthRefusal::TokenExpired);
        assert!(matches!(sessions.key_for("other", now), Err(AuthRefusal::UnknownKeyId(_))));
        assert_eq!(sessions.issued(), 1);
    }

    #[test]
    fn fingerprints_are_written_as_each_sdk_writes_them() {
        let der = der_of_pem(test_keys::INSTANCE_CERT_PEM).unwrap();
        assert_eq!(hex_pairs(&Sha256::digest(&der), false), test_keys::INSTANCE_CERT_SHA256);
        assert_eq!(hex_pairs(&[0xab, 0x01], true), "AB:01");
    }
}
