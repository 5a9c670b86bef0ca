//! The CDN listener: LFS files at signed, expiring URLs. Like a presigned object-store URL, it refuses
//! a request that also carries an `Authorization` header, so a client that forwards the Hub token fails.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Query, State};
use axum::http::header::{AUTHORIZATION, CONTENT_DISPOSITION, ETAG, RANGE};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::Shared;
use crate::content::sha256_hex;
use crate::hub::content_disposition;
use crate::serve::{FileRequest, file_response};

/// Characters escaped in a URL path segment (RFC 3986 keeps unreserved ones).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'&')
    .add(b'+')
    .add(b'=')
    .add(b';')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b'[')
    .add(b']');

fn unix_now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn signature(shared: &Shared, repo_id: &str, commit: &str, path: &str, expires: u64) -> String {
    sha256_hex(format!("{}\n{repo_id}\n{commit}\n{path}\n{expires}", shared.signing_key).as_bytes())[..32].to_owned()
}

/// `{cdn}/repos/{org}/{name}/{commit}/{path}?Expires=…&Signature=…&Key-Pair-Id=…`, valid for the configured TTL.
pub(crate) fn signed_url(shared: &Shared, repo_id: &str, commit: &str, path: &str) -> String {
    let expires = unix_now_s() + shared.config.cdn_url_ttl_s;
    let signature = signature(shared, repo_id, commit, path, expires);
    let encode =
        |s: &str| s.split('/').map(|part| utf8_percent_encode(part, SEGMENT).to_string()).collect::<Vec<_>>().join("/");
    format!(
        "{}/repos/{}/{commit}/{}?Expires={expires}&Signature={signature}&Key-Pair-Id=FAKEHUBKEY",
        shared.cdn_endpoint,
        encode(repo_id),
        encode(path)
    )
}

fn refuse(message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>AccessDenied</Code><Message>{message}</Message></Error>"
    );
    (StatusCode::FORBIDDEN, [(axum::http::header::CONTENT_TYPE, "application/xml")], body).into_response()
}

/// `GET|HEAD /repos/{org}/{name}/{commit}/{path}` on the CDN.
pub(crate) async fn serve(
    State(shared): State<Arc<Shared>>,
    Path((org, name, commit, path)): Path<(String, String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    if headers.contains_key(AUTHORIZATION) {
        return refuse("Only one auth mechanism allowed; only the signed URL is accepted, not an Authorization header");
    }
    let repo_id = format!("{org}/{name}");
    let expires: Option<u64> = query.get("Expires").and_then(|e| e.parse().ok());
    let Some(expires) = expires else { return refuse("Missing Expires") };
    if query.get("Signature").map(String::as_str)
        != Some(signature(&shared, &repo_id, &commit, &path, expires).as_str())
    {
        return refuse("Signature does not match");
    }
    if expires < unix_now_s() {
        return refuse("Request has expired");
    }
    let file =
        shared.model.repos.get(&repo_id).and_then(|r| r.commits_by_sha.get(&commit)).and_then(|c| c.files.get(&path));
    let Some(file) = file else { return (StatusCode::NOT_FOUND, "NoSuchKey").into_response() };
    let Some(lfs) = &file.digests.lfs else { return (StatusCode::NOT_FOUND, "NoSuchKey").into_response() };
    let response_headers =
        vec![(ETAG, format!("\"{}\"", lfs.sha256)), (CONTENT_DISPOSITION, content_disposition(&file.path))];
    let range = headers.get(RANGE).and_then(|r| r.to_str().ok());
    let request =
        FileRequest { repo_id: &repo_id, file, head: method == Method::HEAD, range, headers: response_headers };
    file_response(&shared, request)
}
