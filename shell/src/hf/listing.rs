//! The revision API (a branch, tag or sha to a commit sha) and the paginated tree API (the files).

use std::collections::BTreeSet;

use http::StatusCode;
use http::header::LINK;
use serde::Deserialize;

use super::error::{RequestContext, classify_status};
use super::hashing::FileHash;
use super::http::{read_body, resolve_location};
use super::paths::{check_repo_id, check_repo_path, is_commit_sha};
use super::{HfError, HfSource, encode_segment};

/// A revision answer holds every file name: big repos give megabytes.
const REVISION_BODY_BYTES_MAX: usize = 64 << 20;
/// A tree page is 1000 entries on the Hub (a few hundred KiB).
const TREE_PAGE_BODY_BYTES_MAX: usize = 32 << 20;
const TREE_PAGES_MAX: usize = 10_000;
const TREE_FILES_MAX: usize = 1_000_000;

/// One file of a commit, as the tree API describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    pub path: String,
    pub size_bytes: u64,
    pub hash: FileHash,
    /// An object store's ETag for the object as listed (none on the Hub): what names the
    /// version of an object checked by size only (`FileHash::SizeOnly`), whose partial file is
    /// kept under it and whose reads ask for it (`If-Match`), so that the bytes of two uploads of
    /// the same size are never taken for one.
    pub etag: Option<String>,
}

impl RemoteFile {
    /// The ETag this file's version is known by, when its size is all that checks it.
    pub fn size_only_etag(&self) -> Option<&str> {
        (self.hash == FileHash::SizeOnly).then_some(self.etag.as_deref()).flatten()
    }
}

#[derive(Deserialize)]
struct RevisionJson {
    sha: String,
}

#[derive(Deserialize)]
struct TreeEntryJson {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    oid: String,
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    oid: String,
    size: u64,
}

impl HfSource {
    /// The commit sha `revision` (branch, tag or sha, checked to exist) points at now.
    pub async fn resolve(&self, repo_id: &str, revision: &str) -> Result<String, HfError> {
        check_repo_id(repo_id)?;
        let url = self.url(&format!("/api/models/{repo_id}/revision/{}", encode_segment(revision)))?;
        let context = RequestContext { repo_id, revision: Some(revision), path: None, token_sent: false };
        let what = format!("revision {revision:?} of {repo_id}");
        let body = self.get_api(url, context, REVISION_BODY_BYTES_MAX, &what).await?.0;
        let answer: RevisionJson = serde_json::from_slice(&body)
            .map_err(|e| HfError::Protocol { reason: format!("{what}: bad JSON: {e}") })?;
        let sha = answer.sha.to_ascii_lowercase();
        if !is_commit_sha(&sha) {
            return Err(HfError::Protocol { reason: format!("{what}: {:?} is not a commit sha", answer.sha) });
        }
        if is_commit_sha(revision) && sha != revision {
            return Err(HfError::Protocol { reason: format!("{what}: the Hub answered another commit, {sha}") });
        }
        Ok(sha)
    }

    /// Every file of `commit` (directories skipped), following the pages to the end, each path checked.
    pub async fn tree(&self, repo_id: &str, commit: &str) -> Result<Vec<RemoteFile>, HfError> {
        check_repo_id(repo_id)?;
        let mut url = self.url(&format!("/api/models/{repo_id}/tree/{}?recursive=true", encode_segment(commit)))?;
        let mut files = Vec::new();
        for page in 0..TREE_PAGES_MAX {
            let context = RequestContext { repo_id, revision: Some(commit), path: None, token_sent: false };
            let what = format!("file list of {repo_id} at {commit} (page {})", page + 1);
            let (body, link) = self.get_api(url.clone(), context, TREE_PAGE_BODY_BYTES_MAX, &what).await?;
            let entries: Vec<TreeEntryJson> = serde_json::from_slice(&body)
                .map_err(|e| HfError::Protocol { reason: format!("{what}: bad JSON: {e}") })?;
            for entry in entries {
                if let Some(file) = remote_file(entry)? {
                    if files.len() >= TREE_FILES_MAX {
                        let reason = format!("{repo_id} has over {TREE_FILES_MAX} files, more than this agent takes");
                        return Err(HfError::Protocol { reason });
                    }
                    files.push(file);
                }
            }
            match link.as_deref().and_then(next_link) {
                Some(next) => url = resolve_location(&url, next)?,
                None => {
                    check_sizes(&files)
                        .map_err(|reason| HfError::Protocol { reason: format!("{repo_id}: {reason}") })?;
                    return check_unique(files);
                }
            }
        }
        Err(HfError::Protocol { reason: format!("file list of {repo_id} has over {TREE_PAGES_MAX} pages") })
    }

    /// GET an API URL: the body (at most `bytes_max`) and the `Link` header of a 200, an error otherwise.
    async fn get_api(
        &self,
        url: http::Uri,
        mut context: RequestContext<'_>,
        bytes_max: usize,
        what: &str,
    ) -> Result<(Vec<u8>, Option<String>), HfError> {
        let stall_timeout_ms = self.api_stall_timeout_ms;
        let (response, token_sent) = self.client.get(url, &self.credentials(), None, stall_timeout_ms).await?;
        context.token_sent = token_sent;
        if response.status() != StatusCode::OK {
            return Err(classify_status(response.status(), response.headers(), &context));
        }
        let link = response.headers().get(LINK).and_then(|l| l.to_str().ok()).map(str::to_owned);
        let body = read_body(response.into_body(), bytes_max, stall_timeout_ms, what).await?;
        Ok((body, link))
    }
}

/// A tree entry as a file to fetch; `None` for a directory.
fn remote_file(entry: TreeEntryJson) -> Result<Option<RemoteFile>, HfError> {
    match entry.kind.as_str() {
        "directory" => return Ok(None),
        "file" => {}
        other => {
            return Err(HfError::Protocol { reason: format!("{}: unknown tree entry type {other:?}", entry.path) });
        }
    }
    check_repo_path(&entry.path)?;
    let is_hex = |text: &str, len: usize| text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit());
    let (size_bytes, hash) = match entry.lfs {
        Some(lfs) if is_hex(&lfs.oid, 64) => (lfs.size, FileHash::Sha256(lfs.oid.to_ascii_lowercase())),
        None if is_hex(&entry.oid, 40) => (entry.size, FileHash::GitBlobSha1(entry.oid.to_ascii_lowercase())),
        _ => return Err(HfError::Protocol { reason: format!("{}: the tree gives no usable hash", entry.path) }),
    };
    Ok(Some(RemoteFile { path: entry.path, size_bytes, hash, etag: None }))
}

/// The URL of `rel="next"` in a `Link` header.
fn next_link(header: &str) -> Option<&str> {
    header.split(',').find_map(|link| {
        let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
        let is_next = params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        is_next.then_some(target)
    })
}

/// One listed file's size at most (1 PiB): far above any weights, and low enough that the
/// sums over a listing stay far from overflowing.
pub const FILE_BYTES_MAX: u64 = 1 << 50;
/// A listing's bytes at most (64 PiB): every sum and margin on them fits a `u64`.
pub const LISTING_BYTES_MAX: u64 = 1 << 56;

/// Sizes the download's arithmetic can hold: a server listing `u64::MAX` is lying, and a sum
/// that wraps would pass the space check (a review made one panic in a debug build).
pub fn check_sizes(files: &[RemoteFile]) -> Result<(), String> {
    let mut total: u64 = 0;
    for file in files {
        if file.size_bytes > FILE_BYTES_MAX {
            return Err(format!(
                "{} is listed at {} bytes, more than this agent takes (1 PiB)",
                file.path, file.size_bytes
            ));
        }
        total = total.saturating_add(file.size_bytes);
    }
    if total > LISTING_BYTES_MAX {
        return Err(format!("the files add up to {total} bytes, more than this agent takes (64 PiB)"));
    }
    Ok(())
}

/// No path twice, and no file where another file needs a directory (`a` and `a/b`).
pub fn check_unique(files: Vec<RemoteFile>) -> Result<Vec<RemoteFile>, HfError> {
    let mut paths = BTreeSet::new();
    for file in &files {
        if !paths.insert(file.path.as_str()) {
            return Err(HfError::BadPath { path: file.path.clone(), reason: "listed twice" });
        }
    }
    for file in &files {
        let parents = file.path.match_indices('/').map(|(at, _)| &file.path[..at]);
        if let Some(parent) = parents.into_iter().find(|parent| paths.contains(parent)) {
            return Err(HfError::BadPath { path: parent.to_owned(), reason: "is a file and a directory" });
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_links_are_found_among_others() {
        assert_eq!(next_link("<http://h/a?cursor=1>; rel=\"next\""), Some("http://h/a?cursor=1"));
        assert_eq!(next_link("<http://h/p>; rel=\"prev\", <http://h/n>; rel=next"), Some("http://h/n"));
        assert_eq!(next_link("<http://h/p>; rel=\"prev\""), None);
    }

    #[test]
    fn duplicate_and_file_directory_clashes_are_rejected() {
        let file = |path: &str| RemoteFile {
            path: path.into(),
            size_bytes: 1,
            hash: FileHash::Sha256("0".repeat(64)),
            etag: None,
        };
        assert!(check_unique(vec![file("a/b"), file("a/c")]).is_ok());
        assert!(matches!(check_unique(vec![file("a"), file("a")]), Err(HfError::BadPath { .. })));
        let clash = check_unique(vec![file("a/b/c"), file("a/b")]);
        assert_eq!(clash, Err(HfError::BadPath { path: "a/b".into(), reason: "is a file and a directory" }));
    }

    #[test]
    fn tree_entries_need_a_usable_hash() {
        let entry =
            |oid: &str| TreeEntryJson { kind: "file".into(), path: "f".into(), size: 3, oid: oid.into(), lfs: None };
        assert!(remote_file(entry(&"ab".repeat(20))).unwrap().is_some());
        assert!(matches!(remote_file(entry("zz")), Err(HfError::Protocol { .. })));
        let hostile = TreeEntryJson { path: "../x".into(), ..entry(&"ab".repeat(20)) };
        assert!(matches!(remote_file(hostile), Err(HfError::BadPath { .. })));
    }
}
