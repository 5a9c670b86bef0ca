//! The client against olah (PyPI), a Hub mirror the project did not write, in its offline mode serving
//! a local git repo. `scripts/olah-check` starts it (`scripts/olah-serve`) and runs this test with the
//! fixture's `OLAH_*` variables; the expected bytes come from the fixture's manifest (sha256sum of the
//! files olah serves), not from olah.
//!
//! What olah 0.5.4 does differently from the Hub (read in its `mirror/repos.py`, `server_*.py`):
//! - revision: any git revision GitPython takes (branch, tag, full or short sha), answered with the full
//!   `sha`; one it does not know is 401 `RepoNotFound` (the Hub: 404 `RevisionNotFound`);
//! - tree: `/tree/{rev}` answers 307 to `/tree/{rev}/`; every entry in one answer (no `Link`, `cursor`
//!   ignored); `oid` is the git blob sha1, `lfs: {oid, size, pointerSize}` only for a blob of 121..149
//!   bytes that parses as a pointer; a directory's `size` is its git tree object's (the Hub: 0);
//! - resolve GET: 200 with a chunked body (no Content-Length, ETag or X-Repo-Commit), `Range` ignored,
//!   LFS bytes from the same origin (no redirect), the whole file read into olah's memory first; a path
//!   not in the commit is 500 (the Hub: 404 `EntryNotFound`); HEAD does give Content-Length, X-Repo-Commit
//!   and an unquoted ETag (sha256 for LFS);
//! - no token checked offline: private and gated repos are not modelled.
//!
//! The client needs nothing for any of these: redirects are followed, a missing `Link` ends the list, a
//! body without Content-Length is counted against the listed size, and a 200 to a ranged GET restarts.

use std::collections::BTreeMap;
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use super::*;

const CONNECT_TIMEOUT_MS: u64 = 2_000;
const STALL_TIMEOUT_MS: u64 = 20_000;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run scripts/olah-check"))
}

/// path -> (sha256, size) from the manifest's "sha256 size path" lines (a path may hold spaces).
fn manifest() -> BTreeMap<String, (String, u64)> {
    let text = std::fs::read_to_string(env("OLAH_MANIFEST")).unwrap();
    let line = |line: &str| {
        let mut parts = line.splitn(3, ' ');
        let (sha, size, path) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        (path.to_owned(), (sha.to_owned(), size.parse::<u64>().unwrap()))
    };
    text.lines().filter(|l| !l.is_empty()).map(line).collect()
}

fn sha256_of(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// One file into the partial file at `partial` (opened here, kept as it is: a resume starts from it).
async fn fetch_into(
    source: &HfSource,
    repo: &str,
    commit: &str,
    file: &RemoteFile,
    partial: &std::path::Path,
) -> Result<(), HfError> {
    let handle = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(partial).unwrap();
    fetch_file(source, repo, commit, file, handle, STALL_TIMEOUT_MS, &Meter::default()).await
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
#[ignore = "needs olah; scripts/olah-check runs it"]
async fn olah_offline_serves_a_repo_the_client_fetches_whole_and_verified() {
    let (repo, commit) = (env("OLAH_REPO"), env("OLAH_COMMIT"));
    let source =
        HfSource::new(&env("OLAH_ENDPOINT"), None, CONNECT_TIMEOUT_MS, STALL_TIMEOUT_MS, &Default::default()).unwrap();

    assert_eq!(source.resolve(&repo, &env("OLAH_REVISION")).await.unwrap(), commit);
    assert_eq!(source.resolve(&repo, &env("OLAH_TAG")).await.unwrap(), env("OLAH_TAG_COMMIT"));
    assert_eq!(source.resolve(&repo, &commit).await.unwrap(), commit);
    // olah's answer to an unknown revision (the Hub's is 404 RevisionNotFound): still an error, not a sha.
    let unknown = source.resolve(&repo, "no-such-branch").await.unwrap_err();
    assert!(matches!(unknown, HfError::RepoNotFound { .. } | HfError::RevisionNotFound { .. }), "{unknown:?}");

    let expected = manifest();
    let files = source.tree(&repo, &commit).await.unwrap();
    let listed: BTreeMap<String, u64> = files.iter().map(|f| (f.path.clone(), f.size_bytes)).collect();
    let wanted: BTreeMap<String, u64> = expected.iter().map(|(p, (_, size))| (p.clone(), *size)).collect();
    assert_eq!(listed, wanted, "olah's tree against the fixture's manifest");
    for file in &files {
        // Files sized 121..149 bytes are sniffed for a pointer: a text file that is not one stays git.
        let is_lfs = file.path.ends_with(".safetensors");
        assert_eq!(matches!(file.hash, FileHash::Sha256(_)), is_lfs, "{}: {:?}", file.path, file.hash);
        if let FileHash::Sha256(sha) = &file.hash {
            assert_eq!(sha, &expected[&file.path].0, "{}: lfs.oid", file.path);
        }
    }

    let scratch = Scratch(std::env::temp_dir().join(format!("hf-olah-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    for (i, file) in files.iter().enumerate() {
        let partial = scratch.0.join(format!("partial-{i}"));
        fetch_into(&source, &repo, &commit, file, &partial).await.unwrap();
        assert_eq!(std::fs::metadata(&partial).unwrap().len(), file.size_bytes, "{}", file.path);
        assert_eq!(sha256_of(&partial), expected[&file.path].0, "{}", file.path);
    }

    // Resume: olah ignores `Range` and sends the whole file with a 200, so the kept half is dropped and
    // the file still ends right.
    let big = files.iter().max_by_key(|f| f.size_bytes).unwrap();
    let partial = scratch.0.join("resumed");
    let whole = scratch.0.join(format!("partial-{}", files.iter().position(|f| f == big).unwrap()));
    let half = std::fs::read(&whole).unwrap()[..(big.size_bytes / 2) as usize].to_vec();
    std::fs::write(&partial, half).unwrap();
    fetch_into(&source, &repo, &commit, big, &partial).await.unwrap();
    assert_eq!(sha256_of(&partial), expected[&big.path].0, "{} after a resume olah ignored", big.path);
}
