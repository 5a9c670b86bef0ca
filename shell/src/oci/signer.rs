//! OCI's request signature: draft-cavage HTTP signatures, version 1, `rsa-sha256` (RSASSA-PKCS1-v1_5
//! over SHA-256, through ring) over `date`, `(request-target)` and `host`, with keyId `<tenancy
//! OCID>/<user OCID>/<key fingerprint>` for an API key (UserPrincipal) or `ST$<security token>` for an
//! InstancePrincipal's session key. Object Storage requests are body-less (GET, HEAD): the agent never
//! writes. The one request with a body, the InstancePrincipal's token request, also signs
//! `content-length`, `content-type` and `x-content-sha256` (and not `host`, as the SDKs sign it).

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http::Method;
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject;

use super::OciError;

/// Headers signed, in this order (the order OCI's SDKs use).
const SIGNED_HEADERS: &str = "date (request-target) host";
/// Headers signed on the federation request (the SDKs leave `host` out there).
const BODY_SIGNED_HEADERS: &str = "date (request-target) content-length content-type x-content-sha256";
/// A security token longer than this is refused (OCI's are a few kilobytes).
const TOKEN_BYTES_MAX: usize = 16 * 1024;
/// A PEM longer than this is not an API key.
const PEM_BYTES_MAX: usize = 64 * 1024;
/// Longest OCID accepted (real ones are about 90 characters).
const OCID_BYTES_MAX: usize = 255;

/// An API key ready to sign requests. Its `Debug` shows only the keyId.
pub struct RequestSigner {
    key_id: String,
    key: RsaKeyPair,
    rng: SystemRandom,
}

impl fmt::Debug for RequestSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestSigner").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// `aa:bb:…:ff`: 16 lowercase hex pairs (the MD5 fingerprint the OCI console shows).
fn check_fingerprint(fingerprint: &str) -> Result<(), OciError> {
    let pairs: Vec<&str> = fingerprint.split(':').collect();
    let hex_pair = |p: &&str| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if pairs.len() == 16 && pairs.iter().all(hex_pair) {
        return Ok(());
    }
    Err(OciError::BadConfig {
        reason: format!("fingerprint {fingerprint:?} is not 16 lowercase hex pairs like aa:bb:…"),
    })
}

/// An OCID: non-empty, printable, without the characters that would break the keyId (`/`, `"`, `,`).
pub(super) fn check_ocid(label: &str, ocid: &str) -> Result<(), OciError> {
    let usable = |b: u8| b.is_ascii_graphic() && !matches!(b, b'/' | b'"' | b',' | b'\\');
    if !ocid.is_empty() && ocid.len() <= OCID_BYTES_MAX && ocid.bytes().all(usable) {
        return Ok(());
    }
    Err(OciError::BadConfig { reason: format!("{label} OCID {ocid:?} is not usable") })
}

/// An unencrypted RSA key from a PKCS#8 (`PRIVATE KEY`) or PKCS#1 (`RSA PRIVATE KEY`) PEM.
pub(super) fn load_key(pem: &str, passphrase: Option<&str>) -> Result<RsaKeyPair, OciError> {
    let bad = |reason: String| OciError::BadKey { reason };
    if pem.len() > PEM_BYTES_MAX {
        return Err(bad(format!("larger than {PEM_BYTES_MAX} bytes")));
    }
    if pem.contains("ENCRYPTED") {
        let hint = if passphrase.is_some_and(|p| !p.is_empty()) { "" } else { " (and no passphrase was given)" };
        return Err(bad(format!(
            "passphrase-protected keys are not supported yet{hint}; store the key decrypted \
             (openssl pkey -in key.pem -out key-decrypted.pem)"
        )));
    }
    let der =
        PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| bad(format!("no PEM private key found ({e:?})")))?;
    let key = match &der {
        PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()),
        PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()),
        _ => return Err(bad("not an RSA key (OCI API keys are RSA)".into())),
    };
    key.map_err(|e| bad(format!("not a usable RSA key: {e}")))
}

impl RequestSigner {
    /// A signer for the API key `private_key_pem` of `user` in `tenancy`. An encrypted key is refused
    /// with a clear reason (`passphrase` is not used yet).
    pub fn from_pem(
        tenancy: &str,
        user: &str,
        fingerprint: &str,
        private_key_pem: &str,
        passphrase: Option<&str>,
    ) -> Result<RequestSigner, OciError> {
        check_ocid("tenancy", tenancy)?;
        check_ocid("user", user)?;
        check_fingerprint(fingerprint)?;
        let key = load_key(private_key_pem, passphrase)?;
        Ok(RequestSigner { key_id: format!("{tenancy}/{user}/{fingerprint}"), key, rng: SystemRandom::new() })
    }

    /// A signer for keyId `key_id` (checked by the caller) with `key`.
    pub(super) fn with_key(key_id: String, key: RsaKeyPair) -> RequestSigner {
        RequestSigner { key_id, key, rng: SystemRandom::new() }
    }

    /// A signer for an InstancePrincipal session: keyId `ST$<token>`, the session's key. A token that
    /// is not a JWT's base64url characters (it goes into a header) is refused.
    pub(super) fn for_session(token: &str, key: RsaKeyPair) -> Result<RequestSigner, OciError> {
        let usable = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=');
        if token.is_empty() || token.len() > TOKEN_BYTES_MAX || !token.bytes().all(usable) {
            return Err(OciError::Protocol { reason: "the security token is not a JWT".into() });
        }
        Ok(RequestSigner::with_key(format!("ST${token}"), key))
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn signature(&self, text: &str) -> Result<String, OciError> {
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, text.as_bytes(), &mut signature)
            .map_err(|_| OciError::BadKey { reason: "RSA signing failed".into() })?;
        Ok(BASE64.encode(signature))
    }

    fn header_value(&self, headers: &str, signature: &str) -> String {
        format!(
            "Signature version=\"1\",keyId=\"{}\",algorithm=\"rsa-sha256\",headers=\"{headers}\",signature=\"{signature}\"",
            self.key_id
        )
    }

    /// The `Authorization` and `x-content-sha256` values for a POST of `body` (`content_type`) to
    /// `path_and_query`, dated `date`.
    pub(super) fn body_authorization(
        &self,
        path_and_query: &str,
        date: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(String, String), OciError> {
        use sha2::Digest as _;
        let content_sha256 = BASE64.encode(sha2::Sha256::digest(body));
        let text = format!(
            "date: {date}\n(request-target): post {path_and_query}\ncontent-length: {}\ncontent-type: \
             {content_type}\nx-content-sha256: {content_sha256}",
            body.len()
        );
        let authorization = self.header_value(BODY_SIGNED_HEADERS, &self.signature(&text)?);
        Ok((authorization, content_sha256))
    }

    /// The `Authorization` value for a body-less request: `path_and_query` exactly as sent, `host` as in
    /// the `Host` header, `date` as in the `Date` header.
    pub fn authorization(
        &self,
        method: &Method,
        path_and_query: &str,
        host: &str,
        date: &str,
    ) -> Result<String, OciError> {
        if !matches!(*method, Method::GET | Method::HEAD) {
            return Err(OciError::Unsupported { what: format!("signing a {method} request (with a body)") });
        }
        let text = signing_string(method, path_and_query, host, date);
        Ok(self.header_value(SIGNED_HEADERS, &self.signature(&text)?))
    }
}

/// The text signed: one `name: value` line per signed header, in `SIGNED_HEADERS`' order.
pub(super) fn signing_string(method: &Method, path_and_query: &str, host: &str, date: &str) -> String {
    let method = method.as_str().to_ascii_lowercase();
    format!("date: {date}\n(request-target): {method} {path_and_query}\nhost: {host}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use model_agent_fakeoci::test_keys;

    #[test]
    fn keys_load_from_pkcs8_and_pkcs1_and_refuse_encryption_clearly() {
        let signer =
            |pem| RequestSigner::from_pem(test_keys::TENANCY, test_keys::USER, test_keys::FINGERPRINT, pem, None);
        let a = signer(test_keys::PRIVATE_KEY_PEM).unwrap();
        let b = signer(test_keys::PRIVATE_KEY_PKCS1_PEM).unwrap();
        let sign = |s: &RequestSigner| s.authorization(&Method::GET, "/n/", "h:1", "Thu, 01 Jan 2026 00:00:00 GMT");
        // PKCS#1 v1.5 signatures are deterministic: the same key in both encodings signs alike.
        assert_eq!(sign(&a).unwrap(), sign(&b).unwrap());
        assert!(format!("{a:?}").contains(test_keys::FINGERPRINT) && !format!("{a:?}").contains("PRIVATE"));
        let encrypted = signer(test_keys::ENCRYPTED_PRIVATE_KEY_PEM).unwrap_err().to_string();
        assert!(encrypted.contains("passphrase-protected keys are not supported"), "{encrypted}");
        assert!(matches!(signer("not a key"), Err(OciError::BadKey { .. })));
        assert!(a.authorization(&Method::PUT, "/n/ns/b/b/o/x", "h", "d").is_err());
    }

    #[test]
    fn config_values_are_checked_before_they_reach_the_key_id() {
        let with = |tenancy, user, fingerprint| {
            RequestSigner::from_pem(tenancy, user, fingerprint, test_keys::PRIVATE_KEY_PEM, None).map(|_| ())
        };
        assert!(with(test_keys::TENANCY, test_keys::USER, "C7:C0").is_err());
        assert!(with(test_keys::TENANCY, "ocid1.user/x", test_keys::FINGERPRINT).is_err());
        assert!(with("", test_keys::USER, test_keys::FINGERPRINT).is_err());
        assert!(with(test_keys::TENANCY, test_keys::USER, test_keys::FINGERPRINT).is_ok());
    }

    #[test]
    fn the_signing_string_is_what_the_sdks_sign() {
        let text = signing_string(&Method::HEAD, "/n/ns/b/m/o/a%2Fb", "objectstorage.x:443", "D");
        assert_eq!(text, "date: D\n(request-target): head /n/ns/b/m/o/a%2Fb\nhost: objectstorage.x:443");
    }
}
