//! `fakehub`: runs the fake Hub by hand or for a script. Prints one JSON line with the endpoints, then
//! serves until killed.
//!
//! ```text
//! fakehub [--page-size N] [--hub-port P] [--cdn-port P] [--lfs-from-bytes N]
//!         [--dir ORG/NAME=DIR]... [--generated ORG/NAME:PATH=SIZE_BYTES]...
//!         [--private ORG/NAME=TOKEN]... [--gated ORG/NAME=TOKEN]...
//! ```
//! Every repo gets one commit `c1` with branch `main` and tag `v1`. Without a repo option it serves a demo
//! repo `fakehub/demo` (two small files and an LFS file of 3 MiB).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use model_agent_fakehub::{CommitFixture, Config, FakeHub, Fixtures, RepoFixture};

#[derive(Default)]
struct Args {
    config: Config,
    lfs_from_bytes: u64,
    commits: BTreeMap<String, CommitFixture>,
    private: BTreeMap<String, String>,
    gated: BTreeMap<String, String>,
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1).collect()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("fakehub: {message}\nusage: see the doc comment of testsupport/fakehub/src/main.rs");
            return ExitCode::from(2);
        }
    };
    let hub = match FakeHub::start_with(fixtures(&args), args.config.clone()) {
        Ok(hub) => hub,
        Err(error) => {
            eprintln!("fakehub: {error}");
            return ExitCode::FAILURE;
        }
    };
    let admin = format!("{}/_fakehub", hub.endpoint());
    println!("{}", serde_json::json!({ "endpoint": hub.endpoint(), "cdn": hub.cdn_endpoint(), "admin": admin }));
    loop {
        std::thread::park();
    }
}

fn fixtures(args: &Args) -> Fixtures {
    let mut commits = args.commits.clone();
    if commits.is_empty() {
        let demo = CommitFixture::new()
            .file("config.json", "{\"model_type\": \"demo\"}\n")
            .file("README.md", "# demo\n")
            .generated_lfs("model.safetensors", 3 << 20, 1);
        commits.insert("fakehub/demo".into(), demo);
    }
    let mut fixtures = Fixtures::new();
    for (id, commit) in commits {
        let mut repo = RepoFixture::new(&id).commit("c1", commit).branch("main", "c1").tag("v1", "c1");
        if let Some(token) = args.private.get(&id) {
            repo = repo.private(token);
        }
        if let Some(token) = args.gated.get(&id) {
            repo = repo.gated(&[token]);
        }
        fixtures = fixtures.repo(repo);
    }
    fixtures
}

fn parse(raw: Vec<String>) -> Result<Args, String> {
    let mut args = Args { lfs_from_bytes: 1 << 20, ..Args::default() };
    let mut iter = raw.into_iter();
    while let Some(flag) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--page-size" => args.config.tree_page_size = number(&value)? as usize,
            "--hub-port" => args.config.hub_port = number(&value)? as u16,
            "--cdn-port" => args.config.cdn_port = number(&value)? as u16,
            "--lfs-from-bytes" => args.lfs_from_bytes = number(&value)?,
            "--dir" => {
                let (id, dir) = value.split_once('=').ok_or("--dir wants ORG/NAME=DIR")?;
                let commit = CommitFixture::from_dir(&PathBuf::from(dir), args.lfs_from_bytes)
                    .map_err(|e| format!("{dir}: {e}"))?;
                args.commits.insert(id.to_owned(), commit);
            }
            "--generated" => {
                let (target, size) = value.split_once('=').ok_or("--generated wants ORG/NAME:PATH=SIZE_BYTES")?;
                let (id, path) = target.split_once(':').ok_or("--generated wants ORG/NAME:PATH=SIZE_BYTES")?;
                // Distinct paths, distinct bytes; the same path, the same bytes on every run.
                let seed =
                    u64::from_str_radix(&model_agent_fakehub::sha256_hex(path.as_bytes())[..16], 16).expect("hex");
                let commit = args.commits.remove(id).unwrap_or_default().generated_lfs(path, number(size)?, seed);
                args.commits.insert(id.to_owned(), commit);
            }
            "--private" => {
                let (id, token) = value.split_once('=').ok_or("--private wants ORG/NAME=TOKEN")?;
                args.private.insert(id.to_owned(), token.to_owned());
            }
            "--gated" => {
                let (id, token) = value.split_once('=').ok_or("--gated wants ORG/NAME=TOKEN")?;
                args.gated.insert(id.to_owned(), token.to_owned());
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(args)
}
