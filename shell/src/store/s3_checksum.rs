//! S3's `x-amz-checksum-sha256`, the content's SHA-256 for an object uploaded whole with it. S3 gives
//! it only to a HEAD (or GET) that sends `x-amz-checksum-mode: ENABLED`, and refuses an unsigned
//! `x-amz-*` header; OpenDAL's stat sends no such header and its listing has no checksums. So the
//! agent signs that one HEAD itself: with reqsign's SigV4 signer (OpenDAL's own) and the credential
//! chain OpenDAL is given (the same `Arc`), at the URL OpenDAL would use (its presigned stat's, less the
//! query). The HEAD also says what the ETag is: S3's ETag is no MD5 under SSE-KMS or SSE-C, and a
//! listing without ETags (some S3-compatible servers) gets the HEAD's.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqsign_aws_v4::Credential;
use reqsign_core::{ProvideCredentialChain, Signer};

use super::StoreError;

/// The presigned URL only names the object: it is not sent.
const PRESIGN_EXPIRY: Duration = Duration::from_secs(300);

/// The S3 credential chain, shared by OpenDAL's signer and `Heads`.
pub type Chain = Arc<ProvideCredentialChain<Credential>>;

/// The static keys of a Secret, or the AWS default chain (env, profile, web identity, ECS, IMDS).
pub fn chain(keys: Option<(&str, &str, Option<&str>)>) -> Chain {
    let chain = match keys {
        Some((id, secret, token)) => {
            let mut provider = reqsign_aws_v4::StaticCredentialProvider::new(id, secret);
            if let Some(token) = token {
                provider = provider.with_session_token(token);
            }
            ProvideCredentialChain::new().push(provider)
        }
        None => ProvideCredentialChain::new().push(reqsign_aws_v4::DefaultCredentialProvider::new()),
    };
    Arc::new(chain)
}

/// Signed HEADs of one bucket's objects.
#[derive(Clone)]
pub struct Heads {
    op: opendal::Operator,
    signer: Signer<Credential>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Heads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heads").finish_non_exhaustive()
    }
}

/// What a HEAD says about an object's integrity headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeadFacts {
    /// `x-amz-checksum-sha256` of the whole content (not a composite `…-N` one), as hex.
    pub sha256_hex: Option<String>,
    /// The ETag when it can be the content's MD5 (a single-part upload without SSE-KMS or SSE-C).
    pub etag: Option<String>,
    /// SSE-KMS or SSE-C: the ETag is no MD5 of the content.
    pub etag_not_md5: bool,
}

impl Heads {
    pub fn new(op: opendal::Operator, chain: Chain, region: &str, http: reqwest::Client) -> Heads {
        let transport =
            opendal::HttpTransporter::new(opendal_http_transport_reqwest::ReqwestTransport::new(http.clone()));
        let context = reqsign_core::Context::new()
            .with_file_read(reqsign_file_read_tokio::TokioFileRead)
            .with_env(reqsign_core::OsEnv)
            .with_http_send(transport);
        let signer = Signer::new(context, chain, reqsign_aws_v4::RequestSigner::new("s3", region));
        Heads { op, signer, http }
    }

    /// HEAD `key` with `x-amz-checksum-mode: ENABLED`.
    pub async fn head(&self, key: &str) -> Result<HeadFacts, StoreError> {
        let what = format!("HEAD {key} (checksums)");
        let opendal_error = |e: opendal::Error| StoreError::from_opendal(&what, &e);
        let presigned = self.op.presign_stat(key, PRESIGN_EXPIRY).await.map_err(opendal_error)?;
        let uri = presigned.uri();
        let url = format!(
            "{}://{}{}",
            uri.scheme_str().unwrap_or("https"),
            uri.authority().map_or("", |a| a.as_str()),
            uri.path()
        );
        let request = http::Request::head(&url).header("x-amz-checksum-mode", "ENABLED").body(());
        let (mut parts, ()) = request.map_err(|e| StoreError::Other { reason: format!("{what}: {e}") })?.into_parts();
        self.signer
            .sign(&mut parts, None)
            .await
            .map_err(|e| StoreError::Denied { what: what.clone(), reason: format!("signing: {e}") })?;
        let sent = self.http.head(&url).headers(parts.headers).send().await;
        let response = sent.map_err(|e| StoreError::Temporary { what: what.clone(), reason: e.to_string() })?;
        match response.status().as_u16() {
            200 => Ok(facts(response.headers())),
            401 | 403 => Err(StoreError::Denied { what, reason: response.status().to_string() }),
            404 => Err(StoreError::NotFound { what }),
            429 | 503 => Err(StoreError::RateLimited { what, retry_after_ms: None }),
            _ => Err(StoreError::Temporary { what, reason: response.status().to_string() }),
        }
    }
}

/// The integrity facts in a HEAD answer's headers.
pub fn facts(headers: &http::HeaderMap) -> HeadFacts {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let composite = header("x-amz-checksum-type").is_some_and(|t| t.eq_ignore_ascii_case("COMPOSITE"));
    let sha256_hex = header("x-amz-checksum-sha256")
        .filter(|_| !composite)
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v).ok())
        .filter(|bytes| bytes.len() == 32)
        .map(|bytes| bytes.iter().map(|b| format!("{b:02x}")).collect());
    let kms = header("x-amz-server-side-encryption").is_some_and(|v| v.starts_with("aws:kms"));
    let sse_c = header("x-amz-server-side-encryption-customer-algorithm").is_some();
    HeadFacts { sha256_hex, etag: header("etag").map(str::to_owned), etag_not_md5: kms || sse_c }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
        pairs.iter().map(|(k, v)| (http::HeaderName::from_static(k), http::HeaderValue::from_static(v))).collect()
    }

    #[test]
    fn a_whole_object_s_sha256_is_read_and_a_composite_one_is_not() {
        // sha256("hello\n") = 5891b5b5…be03, in base64 as S3 sends it.
        let whole = headers(&[
            ("x-amz-checksum-sha256", "WJG1tSLV3whtD/CxEPvZ0hu0/HFjrzTQgoai6Eb2vgM="),
            ("x-amz-checksum-type", "FULL_OBJECT"),
            ("etag", "\"b1946ac92492d2347c6235b4d2611184\""),
        ]);
        let got = facts(&whole);
        assert_eq!(got.sha256_hex.as_deref(), Some("5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"));
        assert_eq!(got.etag.as_deref(), Some("\"b1946ac92492d2347c6235b4d2611184\""));
        assert!(!got.etag_not_md5);
        let composite = headers(&[
            ("x-amz-checksum-sha256", "WJG1tSLV3whtD/CxEPvZ0hu0/HFjrzTQgoai6Eb2vgM=-3"),
            ("x-amz-checksum-type", "COMPOSITE"),
        ]);
        assert_eq!(facts(&composite).sha256_hex, None);
        assert_eq!(facts(&headers(&[("x-amz-checksum-sha256", "c2hvcnQ=")])).sha256_hex, None);
    }

    #[test]
    fn sse_kms_and_sse_c_etags_are_no_md5() {
        assert!(facts(&headers(&[("x-amz-server-side-encryption", "aws:kms")])).etag_not_md5);
        assert!(facts(&headers(&[("x-amz-server-side-encryption", "aws:kms:dsse")])).etag_not_md5);
        assert!(facts(&headers(&[("x-amz-server-side-encryption-customer-algorithm", "AES256")])).etag_not_md5);
        assert!(!facts(&headers(&[("x-amz-server-side-encryption", "AES256")])).etag_not_md5);
    }
}
