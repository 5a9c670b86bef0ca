//! `model-agent download`: one `hf://`, `s3://`, `gs://` or `az://` model into a directory beneath a
//! models root, outside any cluster (the benchmark runs this). Progress lines go to stderr, one JSON
//! line to stdout at the end. A store's `spec.storage.parameters` are `--param k=v`; its credentials
//! come from the environment (each cloud's chain: `AWS_ACCESS_KEY_ID`, `AZURE_STORAGE_KEY`, ...).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use super::{Job, Options, Progress, download};

/// How often the command prints progress.
const CLI_PROGRESS_PERIOD_MS: u64 = 2_000;
/// Threads of the download runtime: transfers and hashing both use them.
const WORKER_THREADS: usize = 4;

#[derive(Debug)]
struct Args {
    job: Job,
    opts: Options,
}

/// `download --models-root-dir ROOT --dest REL [--uid U] [--concurrency N] [--multipart-concurrency N]
/// [--multipart-threshold BYTES] [--ca-bundle FILE] [--param K=V ...] URI`; the endpoint, token,
/// store credentials and proxies from the environment.
fn parse(args: Vec<String>, env: &dyn Fn(&str) -> Option<String>) -> Result<Args, String> {
    let (mut root, mut dest, mut uid, mut uri) = (None, None, "model-agent-cli".to_owned(), None);
    let mut auth = crate::store::StoreAuth::default();
    let endpoint = super::endpoint(env);
    let network = crate::hf::Network::from_env(env, None);
    let mut opts = Options { endpoint, network, progress_period_ms: CLI_PROGRESS_PERIOD_MS, ..Options::default() };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next()).ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|_| format!("{flag}: {v:?} is not a number"));
        match flag.as_str() {
            "--models-root-dir" => root = Some(PathBuf::from(value()?)),
            "--dest" => dest = Some(value()?),
            "--uid" => uid = value()?,
            "--concurrency" => opts.files_concurrency = number(value()?)?.max(1) as usize,
            "--multipart-concurrency" => opts.multipart_concurrency = number(value()?)?.max(1) as usize,
            "--multipart-threshold" => opts.multipart_threshold_bytes = number(value()?)?,
            "--ca-bundle" => opts.network.ca_bundle = Some(PathBuf::from(value()?)),
            "--param" => {
                let kv = value()?;
                let (k, v) = kv.split_once('=').ok_or(format!("--param {kv:?}: expected KEY=VALUE"))?;
                auth.parameters.insert(k.to_owned(), v.to_owned());
            }
            other if other.starts_with("--") => return Err(format!("download: unknown flag {other:?}")),
            _ if uri.is_none() => uri = Some(arg),
            _ => return Err("download takes one hf:// URI".into()),
        }
    }
    let root = root.ok_or("download needs --models-root-dir")?;
    let dest_rel = dest.ok_or("download needs --dest")?;
    if dest_rel.starts_with('/') || dest_rel.split('/').any(|c| c == "..") {
        return Err(format!("--dest {dest_rel:?} must be relative, without '..'"));
    }
    let uri = uri.ok_or("download needs a URI: hf://org/repo[@rev], s3://, gs:// or az://")?;
    let key = format!("cli/{dest_rel}");
    let job = Job {
        root,
        dest_rel,
        uid,
        key,
        repo_id: String::new(),
        revision: String::new(),
        token: None,
        co_owners: Vec::new(),
        keep_marked: false,
        other_source: Vec::new(),
        reserve: false,
        store: None,
    };
    let job = match uri.starts_with("hf://") {
        true => {
            let (repo_id, revision) = parse_hf_uri(&uri)?;
            Job { repo_id, revision, token: env("HF_TOKEN").filter(|t| !t.is_empty()), ..job }
        }
        false => {
            let parsed = model_agent_core::storage_uri::StorageUri::parse(&uri).map_err(|e| e.to_string())?;
            let net = crate::store::Net::new(&opts.network, opts.connect_timeout_ms, opts.stall_timeout_ms)?;
            let store = crate::store::open(&parsed, &auth, &net)?;
            Job { repo_id: store.label.clone(), store: Some(std::sync::Arc::new(store)), ..job }
        }
    };
    Ok(Args { job, opts })
}

/// `hf://org/repo[@rev]` as (repo id, revision; `main` when absent).
fn parse_hf_uri(uri: &str) -> Result<(String, String), String> {
    let rest = uri.strip_prefix("hf://").ok_or(format!("{uri:?} is not an hf:// URI"))?;
    let (repo_id, revision) = rest.split_once('@').unwrap_or((rest, "main"));
    if repo_id.is_empty() || revision.is_empty() {
        return Err(format!("{uri:?}: expected hf://org/repo[@revision]"));
    }
    Ok((repo_id.to_owned(), revision.to_owned()))
}

fn print_progress(progress: Progress) {
    eprintln!(
        "model-agent download: {}/{} files, {}/{} bytes, {:.1} MiB/s",
        progress.completed_files,
        progress.total_files,
        progress.completed_bytes,
        progress.total_bytes,
        progress.bytes_per_sec / f64::from(1 << 20)
    );
}

/// Runs the subcommand; SIGINT or SIGTERM cancels (partial files are kept for the next run).
pub fn run_download_command(args: Vec<String>) -> ExitCode {
    let Args { job, opts } = match parse(args, &|name| std::env::var(name).ok()) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("model-agent: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(WORKER_THREADS).enable_all().build();
    let Ok(runtime) = runtime else {
        eprintln!("model-agent: cannot start a tokio runtime");
        return ExitCode::from(1);
    };
    let started = Instant::now();
    let ended = runtime.block_on(async {
        let (cancel_tx, cancel) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = cancel_tx.send(true);
        });
        download(job, &opts, &mut print_progress, cancel).await
    });
    match ended.result {
        Ok(finished) => {
            let line = serde_json::json!({
                "commit": finished.commit,
                "files": finished.files,
                "bytes_total": finished.bytes_total,
                "bytes_fetched": finished.bytes_fetched,
                "seconds": started.elapsed().as_secs_f64(),
            });
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("model-agent download: {}", error.reason());
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_and_environment_make_the_job() {
        let env = |name: &str| match name {
            "ENDPOINT" => Some("http://mirror:1".to_owned()),
            "HF_TOKEN" => Some("hf_x".to_owned()),
            _ => None,
        };
        let line = "--models-root-dir /m --dest a/b --concurrency 8 --multipart-threshold=1024 hf://o/r@v1";
        let Args { job, opts } = parse(words(line), &env).unwrap();
        assert_eq!((job.repo_id.as_str(), job.revision.as_str(), job.dest_rel.as_str()), ("o/r", "v1", "a/b"));
        assert_eq!(
            (opts.endpoint.as_str(), opts.files_concurrency, opts.multipart_threshold_bytes),
            ("http://mirror:1", 8, 1024)
        );
        assert_eq!(job.token.as_deref(), Some("hf_x"));
        assert!(!format!("{job:?}").contains("hf_x"));
        let Args { job, opts } = parse(words("--models-root-dir /m --dest d hf://o/r"), &|_| None).unwrap();
        assert_eq!((job.revision.as_str(), opts.endpoint.as_str()), ("main", "https://huggingface.co"));
        for bad in
            ["--dest d hf://o/r", "--models-root-dir /m --dest ../d hf://o/r", "--models-root-dir /m --dest d ftp://b"]
        {
            assert!(parse(words(bad), &|_| None).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_store_uri_takes_its_parameters_from_param_flags() {
        let line = "--models-root-dir /m --dest d --param endpoint=http://127.0.0.1:9 --param region=r s3://b/p";
        let Args { job, .. } = parse(words(line), &|_| None).unwrap();
        assert_eq!(job.repo_id, "s3://b/p");
        assert!(job.store.is_some());
        assert!(parse(words("--models-root-dir /m --dest d --param nokv s3://b/p"), &|_| None).is_err());
    }
}
