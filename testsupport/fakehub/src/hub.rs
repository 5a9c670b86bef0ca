//! The Hub listener: the revision and tree APIs and `resolve`, with the Hub's access rules and error codes.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, ETAG, HOST, LINK, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Shared;
use crate::cdn::signed_url;
use crate::content::{hex, sha256_hex};
use crate::fixtures::Access;
use crate::model::{HubCommit, HubFile, HubRepo, TreeEntry};
use crate::serve::{FileRequest, file_response};

const X_ERROR_CODE: HeaderName = HeaderName::from_static("x-error-code");
const X_ERROR_MESSAGE: HeaderName = HeaderName::from_static("x-error-message");
const X_REPO_COMMIT: HeaderName = HeaderName::from_static("x-repo-commit");
const X_LINKED_ETAG: HeaderName = HeaderName::from_static("x-linked-etag");
const X_LINKED_SIZE: HeaderName = HeaderName::from_static("x-linked-size");
/// Fixed dates: fixtures have no history.
const FIXTURE_DATE: &str = "2024-01-01T00:00:00.000Z";

/// An error as the Hub sends it: `X-Error-Code`, `X-Error-Message` and `{"error": …}`.
#[derive(Debug)]
pub(crate) struct HubError {
    status: StatusCode,
    code: Option<&'static str>,
    message: String,
    repo_commit: Option<String>,
}

impl HubError {
    fn new(status: StatusCode, code: Option<&'static str>, message: impl Into<String>) -> Self {
        HubError { status, code, message: message.into(), repo_commit: None }
    }
}

impl IntoResponse for HubError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(json!({ "error": self.message }))).into_response();
        let headers = response.headers_mut();
        if let Some(code) = self.code {
            headers.insert(X_ERROR_CODE, HeaderValue::from_static(code));
        }
        if let Ok(value) = self.message.parse() {
            headers.insert(X_ERROR_MESSAGE, value);
        }
        if let Some(commit) = self.repo_commit.and_then(|c| c.parse().ok()) {
            headers.insert(X_REPO_COMMIT, commit);
        }
        response
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(axum::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

/// What the caller wants: metadata (revision, tree) or file bytes. Gated repos on the Hub show their
/// metadata to anyone and gate only the files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    Api,
    Files,
}

/// The Hub's answers: a missing or private repo is RepoNotFound (401 without a token, 404 with one),
/// a gated one is GatedRepo (401 without a token, 403 with one not granted).
fn check_access<'a>(
    shared: &'a Shared,
    repo_id: &str,
    token: Option<&str>,
    gate: Gate,
) -> Result<&'a HubRepo, HubError> {
    let not_found_status = if token.is_some() { StatusCode::NOT_FOUND } else { StatusCode::UNAUTHORIZED };
    let not_found = || HubError::new(not_found_status, Some("RepoNotFound"), "Repository not found");
    let repo = shared.model.repos.get(repo_id).ok_or_else(not_found)?;
    match &repo.access {
        Access::Public => Ok(repo),
        Access::Private { token: needed } if token == Some(needed.as_str()) => Ok(repo),
        Access::Private { .. } => Err(not_found()),
        Access::Gated { api_too: false, .. } if gate == Gate::Api => Ok(repo),
        Access::Gated { granted_tokens, .. } if token.is_some_and(|t| granted_tokens.iter().any(|g| g == t)) => {
            Ok(repo)
        }
        Access::Gated { .. } if token.is_none() => {
            let message = format!(
                "Access to model {repo_id} is restricted. You must have access to it and be authenticated to access it. Please log in."
            );
            Err(HubError::new(StatusCode::UNAUTHORIZED, Some("GatedRepo"), message))
        }
        Access::Gated { .. } => {
            let message = format!(
                "Access to model {repo_id} is restricted and you are not in the authorized list. Ask for access on the repo's page."
            );
            Err(HubError::new(StatusCode::FORBIDDEN, Some("GatedRepo"), message))
        }
    }
}

fn resolve_revision<'a>(repo: &'a HubRepo, revision: &str) -> Result<&'a Arc<HubCommit>, HubError> {
    let message = format!("Invalid rev id: {revision}");
    repo.resolve(revision).ok_or_else(|| HubError::new(StatusCode::NOT_FOUND, Some("RevisionNotFound"), message))
}

/// `GET /api/models/{org}/{name}` (default branch `main`).
pub(crate) async fn model_info(
    State(shared): State<Arc<Shared>>,
    Path((org, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    revision_info(State(shared), Path((org, name, "main".to_owned())), headers).await
}

/// `GET /api/models/{org}/{name}/revision/{revision}`.
pub(crate) async fn revision_info(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    let repo_id = format!("{org}/{name}");
    let repo = check_access(&shared, &repo_id, bearer_token(&headers), Gate::Api)?;
    let commit = resolve_revision(repo, &revision)?;
    let siblings: Vec<Value> = commit.files.keys().map(|path| json!({ "rfilename": path })).collect();
    let used_storage: u64 = commit.files.values().map(|f| f.size_bytes()).sum();
    let gated = match &repo.access {
        Access::Gated { .. } => json!("manual"),
        _ => json!(false),
    };
    Ok(Json(json!({
        "_id": &sha256_hex(repo_id.as_bytes())[..24],
        "id": repo_id,
        "modelId": repo_id,
        "author": org,
        "sha": commit.sha,
        "lastModified": FIXTURE_DATE,
        "createdAt": FIXTURE_DATE,
        "private": matches!(repo.access, Access::Private { .. }),
        "gated": gated,
        "disabled": false,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "spaces": [],
        "usedStorage": used_storage,
    }))
    .into_response())
}

#[derive(Deserialize)]
pub(crate) struct TreeQuery {
    recursive: Option<String>,
    cursor: Option<String>,
}

/// `GET /api/models/{org}/{name}/tree/{revision}`.
pub(crate) async fn tree_root(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision)): Path<(String, String, String)>,
    query: Query<TreeQuery>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    tree(&shared, &format!("{org}/{name}"), &revision, "", &query, &uri, &headers)
}

/// `GET /api/models/{org}/{name}/tree/{revision}/{path}`.
pub(crate) async fn tree_dir(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision, dir)): Path<(String, String, String, String)>,
    query: Query<TreeQuery>,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    let dir = dir.trim_end_matches('/');
    tree(&shared, &format!("{org}/{name}"), &revision, dir, &query, &uri, &headers)
}

fn tree(
    shared: &Shared,
    repo_id: &str,
    revision: &str,
    dir: &str,
    query: &TreeQuery,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, HubError> {
    let repo = check_access(shared, repo_id, bearer_token(headers), Gate::Api)?;
    let commit = resolve_revision(repo, revision)?;
    let recursive = query.recursive.as_deref().is_some_and(|r| matches!(r.to_ascii_lowercase().as_str(), "true" | "1"));
    let Some(entries) = commit.tree(dir, recursive) else {
        let message = format!("{dir} does not exist on \"{revision}\"");
        return Err(HubError::new(StatusCode::NOT_FOUND, Some("EntryNotFound"), message));
    };
    let start = match query.cursor.as_deref().map(decode_cursor) {
        None => 0,
        Some(Some(start)) if start <= entries.len() => start,
        Some(_) => return Err(HubError::new(StatusCode::BAD_REQUEST, None, "Invalid cursor")),
    };
    let end = entries.len().min(start + shared.config.tree_page_size.max(1));
    let page: Vec<Value> = entries[start..end].iter().map(tree_entry_json).collect();
    let mut response = Json(page).into_response();
    if end < entries.len() {
        let link = format!("<{}>; rel=\"next\"", next_page_url(shared, uri, headers, end));
        response.headers_mut().insert(LINK, link.parse().expect("ASCII link"));
    }
    Ok(response)
}

fn tree_entry_json(entry: &TreeEntry) -> Value {
    match entry {
        TreeEntry::Directory { path, oid } => json!({ "type": "directory", "oid": oid, "size": 0, "path": path }),
        TreeEntry::File(file) => {
            let mut value =
                json!({ "type": "file", "oid": file.digests.git_oid, "size": file.size_bytes(), "path": file.path });
            if let Some(lfs) = &file.digests.lfs {
                value["lfs"] =
                    json!({ "oid": lfs.sha256, "size": file.size_bytes(), "pointerSize": lfs.pointer_size_bytes });
            }
            value
        }
    }
}

/// Cursors are opaque to clients (the Hub's are too): hex of `fakehub:{index}`.
fn encode_cursor(index: usize) -> String {
    hex(format!("fakehub:{index}").as_bytes())
}

fn decode_cursor(cursor: &str) -> Option<usize> {
    let bytes: Option<Vec<u8>> = (0..cursor.len())
        .step_by(2)
        .map(|i| cursor.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()?.strip_prefix("fakehub:")?.parse().ok()
}

/// The same URL (absolute, on the host the client used) with the next page's cursor.
fn next_page_url(shared: &Shared, uri: &Uri, headers: &HeaderMap, next: usize) -> String {
    let host = headers.get(HOST).and_then(|h| h.to_str().ok()).map(str::to_owned);
    let origin = host.map(|h| format!("http://{h}")).unwrap_or_else(|| shared.hub_endpoint.clone());
    let kept: Vec<&str> =
        uri.query().unwrap_or("").split('&').filter(|p| !p.is_empty() && !p.starts_with("cursor=")).collect();
    let mut query = kept.join("&");
    if !query.is_empty() {
        query.push('&');
    }
    format!("{origin}{}?{query}cursor={}", uri.path(), encode_cursor(next))
}

/// `GET|HEAD /{org}/{name}/resolve/{revision}/{path}`: regular files from here, LFS files by 302 to the CDN.
pub(crate) async fn resolve(
    State(shared): State<Arc<Shared>>,
    Path((org, name, revision, path)): Path<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, HubError> {
    let repo_id = format!("{org}/{name}");
    let repo = check_access(&shared, &repo_id, bearer_token(&headers), Gate::Files)?;
    let commit = resolve_revision(repo, &revision)?;
    let Some(file) = commit.files.get(&path) else {
        let error = HubError::new(StatusCode::NOT_FOUND, Some("EntryNotFound"), "Entry not found");
        return Err(HubError { repo_commit: Some(commit.sha.clone()), ..error });
    };
    if file.is_lfs() {
        return Ok(lfs_redirect(&shared, &repo_id, commit, file, method == Method::HEAD));
    }
    let headers_out = vec![
        (ETAG, format!("\"{}\"", file.digests.git_oid)),
        (X_REPO_COMMIT, commit.sha.clone()),
        (CONTENT_DISPOSITION, content_disposition(&file.path)),
    ];
    let range = headers.get(axum::http::header::RANGE).and_then(|r| r.to_str().ok());
    let request = FileRequest { repo_id: &repo_id, file, head: method == Method::HEAD, range, headers: headers_out };
    Ok(file_response(&shared, request))
}

fn lfs_redirect(shared: &Shared, repo_id: &str, commit: &HubCommit, file: &HubFile, head: bool) -> Response {
    let lfs = file.digests.lfs.as_ref().expect("LFS file");
    let location = signed_url(shared, repo_id, &commit.sha, &file.path);
    let body = format!("Found. Redirecting to {location}");
    let mut response = Response::builder()
        .status(StatusCode::FOUND)
        .header(LOCATION, &location)
        .header(X_REPO_COMMIT, &commit.sha)
        .header(X_LINKED_ETAG, format!("\"{}\"", lfs.sha256))
        .header(X_LINKED_SIZE, file.size_bytes())
        .header(ETAG, format!("\"{}\"", file.digests.git_oid))
        .header(CONTENT_LENGTH, body.len());
    if !head {
        response = response.header(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8");
    }
    let body = if head { axum::body::Body::empty() } else { axum::body::Body::from(body) };
    response.body(body).expect("valid response")
}

/// As the Hub and its CDN send it (the name percent-encoded in `filename*`).
pub(crate) fn content_disposition(path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    let encoded = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
    let ascii: String = name.chars().map(|c| if c.is_ascii_graphic() && c != '"' { c } else { '_' }).collect();
    format!("inline; filename*=UTF-8''{encoded}; filename=\"{ascii}\";")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        assert_eq!(decode_cursor(&encode_cursor(42)), Some(42));
        assert_eq!(decode_cursor("zz"), None);
        assert_eq!(decode_cursor("abc"), None);
    }
}
