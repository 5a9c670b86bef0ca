//! Repos defined in code: commits (path → content, LFS or not), branches and tags, who may read.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use axum::body::Bytes;

use crate::content::Content;

/// Files in one directory walk at most: a fixture directory is small by intent.
const DIR_FILES_MAX: usize = 10_000;

/// All repos a server holds.
#[derive(Clone, Debug, Default)]
pub struct Fixtures {
    pub(crate) repos: Vec<RepoFixture>,
}

impl Fixtures {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn repo(mut self, repo: RepoFixture) -> Self {
        self.repos.push(repo);
        self
    }
}

/// Who may read a repo.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Access {
    #[default]
    Public,
    /// Private: only this Bearer token sees it; without it the Hub says RepoNotFound.
    Private { token: String },
    /// Gated: anyone sees its metadata and tree (as on the Hub), only granted tokens read files;
    /// `api_too` also gates the revision and tree endpoints.
    Gated { granted_tokens: Vec<String>, api_too: bool },
}

/// One repo: `org/name`, named commits, refs pointing at them.
#[derive(Clone, Debug)]
pub struct RepoFixture {
    pub(crate) id: String,
    pub(crate) commits: Vec<(String, CommitFixture)>,
    pub(crate) branches: Vec<(String, String)>,
    pub(crate) tags: Vec<(String, String)>,
    pub(crate) access: Access,
}

impl RepoFixture {
    /// `id` is `org/name`.
    pub fn new(id: &str) -> Self {
        assert_eq!(id.split('/').count(), 2, "repo id {id:?} must be org/name");
        RepoFixture { id: id.to_owned(), commits: vec![], branches: vec![], tags: vec![], access: Access::Public }
    }

    /// Adds a commit known in the fixture as `name` (its sha is derived from the repo, name and files).
    pub fn commit(mut self, name: &str, commit: CommitFixture) -> Self {
        self.commits.push((name.to_owned(), commit));
        self
    }

    /// Points branch `branch` at the commit named `commit_name`.
    pub fn branch(mut self, branch: &str, commit_name: &str) -> Self {
        self.branches.push((branch.to_owned(), commit_name.to_owned()));
        self
    }

    pub fn tag(mut self, tag: &str, commit_name: &str) -> Self {
        self.tags.push((tag.to_owned(), commit_name.to_owned()));
        self
    }

    /// Private repo readable only with `Authorization: Bearer {token}`.
    pub fn private(mut self, token: &str) -> Self {
        self.access = Access::Private { token: token.to_owned() };
        self
    }

    /// Gated repo: files need one of `granted_tokens`.
    pub fn gated(mut self, granted_tokens: &[&str]) -> Self {
        let granted_tokens = granted_tokens.iter().map(|t| t.to_string()).collect();
        self.access = Access::Gated { granted_tokens, api_too: false };
        self
    }

    /// Gated repo whose revision and tree endpoints are gated too (stricter than the Hub).
    pub fn gated_api_too(mut self, granted_tokens: &[&str]) -> Self {
        let granted_tokens = granted_tokens.iter().map(|t| t.to_string()).collect();
        self.access = Access::Gated { granted_tokens, api_too: true };
        self
    }
}

/// A fixture file: its bytes and whether git stores it through LFS.
#[derive(Clone, Debug)]
pub struct FileFixture {
    pub content: Content,
    pub lfs: bool,
}

/// One commit's files, path (with `/`) → file.
#[derive(Clone, Debug, Default)]
pub struct CommitFixture {
    pub(crate) files: BTreeMap<String, FileFixture>,
}

impl CommitFixture {
    pub fn new() -> Self {
        Self::default()
    }

    /// A regular (non-LFS) file.
    pub fn file(self, path: &str, bytes: impl Into<Bytes>) -> Self {
        self.with(path, Content::Inline(bytes.into()), false)
    }

    /// An LFS file held in memory.
    pub fn lfs_file(self, path: &str, bytes: impl Into<Bytes>) -> Self {
        self.with(path, Content::Inline(bytes.into()), true)
    }

    /// An LFS file of `size_bytes` generated from `seed` (see [`crate::pattern_bytes`]).
    pub fn generated_lfs(self, path: &str, size_bytes: u64, seed: u64) -> Self {
        self.with(path, Content::Pattern { size_bytes, seed }, true)
    }

    pub fn with(mut self, path: &str, content: Content, lfs: bool) -> Self {
        assert!(valid_path(path), "fixture path {path:?} must be relative, with no empty, . or .. part");
        self.files.insert(path.to_owned(), FileFixture { content, lfs });
        self
    }

    /// The files under `dir` (read on demand, so large files stay on disk); files of at least
    /// `lfs_from_bytes` bytes are LFS. Symlinks and special files are skipped.
    pub fn from_dir(dir: &Path, lfs_from_bytes: u64) -> io::Result<Self> {
        let mut commit = CommitFixture::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(current) = pending.pop() {
            for entry in std::fs::read_dir(&current)? {
                let entry = entry?;
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    pending.push(entry.path());
                    continue;
                }
                if !kind.is_file() {
                    continue;
                }
                if commit.files.len() >= DIR_FILES_MAX {
                    return Err(io::Error::other(format!("{} has over {DIR_FILES_MAX} files", dir.display())));
                }
                let relative = entry.path().strip_prefix(dir).map_err(io::Error::other)?.to_path_buf();
                let relative = relative.to_str().ok_or_else(|| io::Error::other("non-UTF-8 path"))?.to_owned();
                let size_bytes = entry.metadata()?.len();
                let content = Content::Disk { path: entry.path(), size_bytes };
                commit = commit.with(&relative, content, size_bytes >= lfs_from_bytes);
            }
        }
        Ok(commit)
    }

    pub fn files(&self) -> &BTreeMap<String, FileFixture> {
        &self.files
    }
}

fn valid_path(path: &str) -> bool {
    !path.is_empty() && path.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}
