//! The fixtures as the server sees them: hashed files, commits by sha, refs, tree listings.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::Arc;

use sha1::{Digest, Sha1};

use crate::content::{Content, Digests, cached_digests, hex};
use crate::fixtures::{Access, CommitFixture, Fixtures, RepoFixture};

/// One file of one commit, hashed.
#[derive(Debug)]
pub struct HubFile {
    pub path: String,
    pub content: Content,
    pub digests: Digests,
}

impl HubFile {
    pub fn size_bytes(&self) -> u64 {
        self.content.size_bytes()
    }

    pub fn is_lfs(&self) -> bool {
        self.digests.lfs.is_some()
    }
}

#[derive(Debug)]
pub struct HubCommit {
    pub sha: String,
    pub files: BTreeMap<String, Arc<HubFile>>,
}

#[derive(Debug)]
pub struct HubRepo {
    pub id: String,
    pub access: Access,
    pub commits_by_sha: HashMap<String, Arc<HubCommit>>,
    pub shas_by_name: HashMap<String, String>,
    /// Branches and tags → commit sha (a branch wins over a tag of the same name, as in git).
    pub refs: HashMap<String, String>,
}

impl HubRepo {
    /// A branch, a tag, or a full commit sha of this repo.
    pub fn resolve(&self, revision: &str) -> Option<&Arc<HubCommit>> {
        let sha = self.refs.get(revision).map(String::as_str).unwrap_or(revision);
        self.commits_by_sha.get(sha)
    }
}

#[derive(Debug, Default)]
pub struct HubModel {
    pub repos: HashMap<String, HubRepo>,
}

/// A tree API entry.
#[derive(Debug, Clone)]
pub enum TreeEntry {
    File(Arc<HubFile>),
    Directory { path: String, oid: String },
}

impl TreeEntry {
    pub fn path(&self) -> &str {
        match self {
            TreeEntry::File(file) => &file.path,
            TreeEntry::Directory { path, .. } => path,
        }
    }
}

impl HubModel {
    /// Hashes every file (streaming; large generated files take a moment) and links refs.
    pub fn build(fixtures: &Fixtures) -> io::Result<HubModel> {
        let mut model = HubModel::default();
        for fixture in &fixtures.repos {
            let repo = build_repo(fixture)?;
            if model.repos.insert(repo.id.clone(), repo).is_some() {
                return Err(io::Error::other(format!("repo {} defined twice", fixture.id)));
            }
        }
        Ok(model)
    }
}

fn build_repo(fixture: &RepoFixture) -> io::Result<HubRepo> {
    let mut repo = HubRepo {
        id: fixture.id.clone(),
        access: fixture.access.clone(),
        commits_by_sha: HashMap::new(),
        shas_by_name: HashMap::new(),
        refs: HashMap::new(),
    };
    for (name, commit_fixture) in &fixture.commits {
        let commit = build_commit(&fixture.id, name, commit_fixture)?;
        repo.shas_by_name.insert(name.clone(), commit.sha.clone());
        repo.commits_by_sha.insert(commit.sha.clone(), Arc::new(commit));
    }
    // Tags first so that a branch of the same name overwrites it.
    for (ref_name, commit_name) in fixture.tags.iter().chain(&fixture.branches) {
        let sha = repo.shas_by_name.get(commit_name).ok_or_else(|| {
            io::Error::other(format!("{}: ref {ref_name} names unknown commit {commit_name}", fixture.id))
        })?;
        repo.refs.insert(ref_name.clone(), sha.clone());
    }
    Ok(repo)
}

fn build_commit(repo_id: &str, name: &str, fixture: &CommitFixture) -> io::Result<HubCommit> {
    let mut files = BTreeMap::new();
    let mut sha = Sha1::new();
    sha.update(format!("fakehub commit\n{repo_id}\n{name}\n").as_bytes());
    for (path, file) in &fixture.files {
        let digests = cached_digests(&file.content, file.lfs)?;
        sha.update(format!("{path} {}\n", digests.git_oid).as_bytes());
        let hub_file = HubFile { path: path.clone(), content: file.content.clone(), digests };
        files.insert(path.clone(), Arc::new(hub_file));
    }
    Ok(HubCommit { sha: hex(&sha.finalize()), files })
}

impl HubCommit {
    /// Entries under directory `dir` ("" for the root), recursively or one level, sorted by path (a
    /// directory comes right before its contents). `None` when `dir` is not a directory of this commit.
    pub fn tree(&self, dir: &str, recursive: bool) -> Option<Vec<TreeEntry>> {
        let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
        let mut directories = BTreeSet::new();
        let mut entries = Vec::new();
        for (path, file) in self.files.range(prefix.clone()..) {
            let Some(rest) = path.strip_prefix(&prefix) else { break };
            let parts: Vec<&str> = rest.split('/').collect();
            let depth_shown = if recursive { parts.len() - 1 } else { parts.len().min(1) };
            for depth in 1..=depth_shown {
                if depth < parts.len() {
                    directories.insert(format!("{prefix}{}", parts[..depth].join("/")));
                }
            }
            if recursive || parts.len() == 1 {
                entries.push(TreeEntry::File(file.clone()));
            }
        }
        if entries.is_empty() && directories.is_empty() && !dir.is_empty() {
            return None;
        }
        for path in directories {
            let oid = self.directory_oid(&path);
            entries.push(TreeEntry::Directory { path, oid });
        }
        entries.sort_by(|a, b| a.path().cmp(b.path()));
        Some(entries)
    }

    /// A stable stand-in for the git tree id of a directory.
    fn directory_oid(&self, dir: &str) -> String {
        let prefix = format!("{dir}/");
        let mut sha = Sha1::new();
        for (path, file) in self.files.range(prefix.clone()..) {
            if !path.starts_with(&prefix) {
                break;
            }
            sha.update(format!("{path} {}\n", file.digests.git_oid).as_bytes());
        }
        hex(&sha.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit() -> HubCommit {
        let fixture = CommitFixture::new().file("a.txt", "a").file("d/b.txt", "b").file("d/e/c.txt", "c");
        build_commit("o/r", "c1", &fixture).unwrap()
    }

    #[test]
    fn recursive_tree_lists_directories_before_their_files() {
        let paths: Vec<String> = commit().tree("", true).unwrap().iter().map(|e| e.path().to_owned()).collect();
        assert_eq!(paths, ["a.txt", "d", "d/b.txt", "d/e", "d/e/c.txt"]);
    }

    #[test]
    fn flat_tree_lists_one_level() {
        let paths: Vec<String> = commit().tree("", false).unwrap().iter().map(|e| e.path().to_owned()).collect();
        assert_eq!(paths, ["a.txt", "d"]);
        let paths: Vec<String> = commit().tree("d", false).unwrap().iter().map(|e| e.path().to_owned()).collect();
        assert_eq!(paths, ["d/b.txt", "d/e"]);
        assert!(commit().tree("nope", true).is_none());
    }
}
