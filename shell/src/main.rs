//! `model-agent`: the imperative shell. It turns watches, reads, probes and time into core
//! inputs, executes the core's effects against the API server and the node, serves health and
//! metrics, and records traces. All decisions are the core's.

mod agent;
mod credentials;
mod download;
mod downloads;
mod events;
mod fsgate;
mod fsops;
mod hf;
mod http;
mod kubeio;
mod lean_model;
mod links;
mod metrics;
mod modelfiles;
mod oci;
mod shapes;
mod store;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tracing::{error, info, warn};

use model_agent_core::machine::{Config, WriteCheck};
use model_agent_core::{Kind, State, trace};

use crate::agent::{Agent, Ctx, Inbox, Queues, WATCH_QUEUE_MAX};
use crate::metrics::Metrics;

const USAGE: &str = "\
model-agent: makes LLM model weights available on this node and reports them (OME-compatible)

USAGE: model-agent [FLAGS]     (env NODE_NAME is required)
       model-agent inspect DIR [--annotations k=v ...]
                               print the metadata `config` the agent would publish for DIR
                               and the spec fields it would fill, as JSON
       model-agent download --models-root-dir ROOT --dest REL [--uid U] [--concurrency N]
                            [--multipart-concurrency N] [--multipart-threshold BYTES]
                            [--ca-bundle FILE] [--param K=V ...] URI
                               download one model into ROOT/REL: hf://org/repo[@rev] (endpoint
                               from HF_ENDPOINT, else ENDPOINT; token from HF_TOKEN), or s3://,
                               gs://, az:// (--param endpoint=..., region=...; credentials from
                               each cloud's environment); progress on stderr, a JSON line
                               {commit, files, bytes_total, bytes_fetched, seconds} on stdout

  --version, -V                    print the version and exit
  --port N                         health and metrics port (8080)
  --metrics-bind-address IP        address the health and metrics server binds (0.0.0.0, every
                                   address; 127.0.0.1 keeps /metrics, which names models, on the node)
  --models-root-dir DIR            models root on the node (/mnt/models)
  --namespace NS                   namespace of the per-node ConfigMap (ome)
  --models-root-write-check MODE   auto | always | never (auto: only when a model placed here downloads)
  --kubeconfig FILE                kubeconfig (default: in-cluster, or $KUBECONFIG)
  --record-trace FILE              record every core input and its effects as JSON lines
  --log-level LEVEL                error | warn | info | debug | trace (info; env LOG_LEVEL)
  --log-format FORMAT              text | json (text)
  --node-label-retry N             accepted for OME compatibility (the core retries with backoff)
  --num-download-worker N          models fetched at once (5)
  --concurrency N                  files at once per downloading model (4)
  --multipart-concurrency N        ranged parts at once per file of --multipart-threshold or more (4)
  --multipart-threshold BYTES      files this large or larger download in ranged parts (209715200)
  --download-progress-period-ms N  how often a download's progress goes into its entry (30000, OME's)
  --ca-bundle FILE                 PEM certificates trusted for downloads beside the system's roots
  --update-model-spec[=BOOL]       fill a Ready model's empty spec metadata fields from its config
                                   files (false; needs deploy/components/update-model-spec/update-model-spec.yaml)
  --download-retry, --node-name    accepted for OME compatibility; --node-name is ignored (NODE_NAME)

ENV: NODE_NAME (required); HF_ENDPOINT, else ENDPOINT (https://huggingface.co); HF_TOKEN (the
     last resort for a Hub token, after the model's Secret and parameters.token); downloads go
     through HTTPS_PROXY, HTTP_PROXY, ALL_PROXY except NO_PROXY (as curl reads them), and trust
     SSL_CERT_FILE or SSL_CERT_DIR instead of the system's roots when set";

/// `--concurrency` and `--multipart-concurrency` at most (open connections per model).
const CONCURRENCY_MAX: usize = 64;

/// Threads of the download runtime (transfers, file writes and hashing; never the loop's).
const DOWNLOAD_THREADS: usize = 2;

/// Threads for blocking filesystem work at most.
const BLOCKING_THREADS_MAX: usize = 4;

#[derive(Debug)]
struct Cli {
    port: u16,
    bind_address: std::net::IpAddr,
    models_root: String,
    namespace: String,
    write_check: WriteCheck,
    kubeconfig: Option<String>,
    record_trace: Option<PathBuf>,
    log_level: String,
    log_json: bool,
    fetch_workers: usize,
    /// Files at once per model, and ranged parts at once per big file.
    files_concurrency: usize,
    multipart_concurrency: usize,
    multipart_threshold_bytes: u64,
    progress_period_ms: u64,
    ca_bundle: Option<PathBuf>,
    update_model_spec: bool,
}

fn parse_cli(args: Vec<String>) -> Result<Cli, String> {
    let mut cli = Cli {
        port: 8080,
        bind_address: std::net::IpAddr::from([0, 0, 0, 0]),
        models_root: "/mnt/models".into(),
        namespace: "ome".into(),
        write_check: WriteCheck::Auto,
        kubeconfig: None,
        record_trace: None,
        log_level: std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".into()),
        log_json: false,
        fetch_workers: 5,
        files_concurrency: 4,
        multipart_concurrency: 4,
        multipart_threshold_bytes: 200 << 20,
        progress_period_ms: 30_000,
        ca_bundle: None,
        update_model_spec: false,
    };
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next()).ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => cli.port = value()?.parse().map_err(|_| "--port: not a port number")?,
            "--metrics-bind-address" => {
                let v = value()?;
                cli.bind_address = v
                    .parse()
                    .map_err(|_| format!("--metrics-bind-address: {v:?} is not an IP address (the port is --port)"))?;
            }
            "--models-root-dir" => cli.models_root = value()?,
            "--namespace" => cli.namespace = value()?,
            "--models-root-write-check" => cli.write_check = value()?.parse()?,
            "--kubeconfig" => cli.kubeconfig = Some(value()?),
            "--record-trace" => cli.record_trace = Some(PathBuf::from(value()?)),
            "--log-level" => cli.log_level = value()?,
            "--log-format" => cli.log_json = log_format_is_json(&value()?)?,
            "--num-download-worker" => {
                cli.fetch_workers = value()?.parse().map_err(|_| "--num-download-worker: not a number")?;
            }
            "--concurrency" => cli.files_concurrency = positive(&flag, &value()?)?.min(CONCURRENCY_MAX),
            "--multipart-concurrency" => {
                cli.multipart_concurrency = positive(&flag, &value()?)?.min(CONCURRENCY_MAX);
            }
            "--multipart-threshold" => cli.multipart_threshold_bytes = positive(&flag, &value()?)? as u64,
            "--download-progress-period-ms" => {
                cli.progress_period_ms = positive(&flag, &value()?)? as u64;
            }
            "--ca-bundle" => cli.ca_bundle = Some(PathBuf::from(value()?)),
            "--update-model-spec" => cli.update_model_spec = switch(&flag, inline.as_deref())?,
            "--node-label-retry" | "--download-retry" | "--node-name" => {
                value()?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown flag {other:?}\n\n{USAGE}")),
        }
    }
    if !cli.models_root.starts_with('/') {
        return Err(format!("--models-root-dir must be absolute, not {:?}", cli.models_root));
    }
    Ok(cli)
}

fn log_format_is_json(v: &str) -> Result<bool, String> {
    match v {
        "json" => Ok(true),
        "text" => Ok(false),
        other => Err(format!("--log-format must be text or json, not {other:?}")),
    }
}

/// A switch: alone it means true, and `=false` turns it off again.
fn switch(flag: &str, inline: Option<&str>) -> Result<bool, String> {
    match inline {
        None | Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(format!("{flag} takes true or false, not {other:?}")),
    }
}

fn positive(flag: &str, v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{flag}: {v:?} is not a positive number")),
    }
}

/// `inspect DIR [--annotations k=v ...]`: the directory and the model's annotations.
fn parse_inspect(args: Vec<String>) -> Result<(PathBuf, BTreeMap<String, String>), String> {
    let mut dir = None;
    let mut annotations = BTreeMap::new();
    let mut taking_annotations = false;
    for arg in args {
        if arg == "--annotations" {
            taking_annotations = true;
        } else if let Some(kv) = arg.strip_prefix("--annotations=") {
            insert_annotation(&mut annotations, kv)?;
        } else if arg.starts_with("--") || arg == "-h" {
            return Err(format!("inspect: unknown flag {arg:?}\n\n{USAGE}"));
        } else if taking_annotations {
            insert_annotation(&mut annotations, &arg)?;
        } else if dir.replace(PathBuf::from(&arg)).is_some() {
            return Err(format!("inspect takes one DIR\n\n{USAGE}"));
        }
    }
    Ok((dir.ok_or(format!("inspect needs a DIR\n\n{USAGE}"))?, annotations))
}

fn insert_annotation(annotations: &mut BTreeMap<String, String>, kv: &str) -> Result<(), String> {
    let (k, v) = kv.split_once('=').ok_or(format!("--annotations: {kv:?} is not k=v"))?;
    annotations.insert(k.to_string(), v.to_string());
    Ok(())
}

fn run_inspect(args: Vec<String>) -> ExitCode {
    let result = parse_inspect(args).and_then(|(dir, annotations)| modelfiles::inspect(&dir, &annotations));
    match result {
        Ok(json) => {
            println!("{json}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("model-agent: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // A subcommand only as the first word: every other first word stays a flag, as before.
    if args.first().is_some_and(|a| a == "inspect") {
        return run_inspect(args.split_off(1));
    }
    if args.first().is_some_and(|a| a == "download") {
        return download::run_download_command(args.split_off(1));
    }
    if args.iter().any(|a| a == "--version" || a == "-V") {
        println!("{}", version());
        return ExitCode::SUCCESS;
    }
    let cli = match parse_cli(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("model-agent: {e}");
            return ExitCode::from(2);
        }
    };
    let node_name = match std::env::var("NODE_NAME") {
        Ok(n) if !n.is_empty() => n,
        _ => {
            eprintln!(
                "model-agent: the NODE_NAME environment variable is not set (the DaemonSet sets it from spec.nodeName)"
            );
            return ExitCode::from(2);
        }
    };
    if let Err(e) = check_network(&cli) {
        eprintln!("model-agent: {e}");
        return ExitCode::from(2);
    }
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if cli.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    // Few blocking threads (filesystem work): each one can hold a malloc arena of its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(BLOCKING_THREADS_MAX)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let download_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(DOWNLOAD_THREADS)
        .max_blocking_threads(BLOCKING_THREADS_MAX)
        .thread_name("download")
        .enable_all()
        .build()
        .expect("the download runtime");
    let options = download_options(&cli);
    info!(network = ?options.network, "downloads go through");
    for e in hf::Network::root_certificate_errors() {
        warn!("a trusted root could not be loaded: {e}");
    }
    // As upstream: an INSTANCE_TYPE_MAP that is not JSON stops the start.
    let instance_types = match shapes::InstanceTypes::from_env(std::env::var("INSTANCE_TYPE_MAP").ok().as_deref()) {
        Ok(map) => map,
        Err(e) => {
            error!("{e}");
            return ExitCode::from(2);
        }
    };
    let downloads = downloads::Downloads::new(download_runtime.handle().clone(), options, instance_types);
    let result = runtime.block_on(run(cli, node_name, downloads));
    // Cancelled downloads have stopped by now; what is stuck in the kernel is left behind.
    download_runtime.shutdown_timeout(Duration::from_secs(2));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// `model-agent <version>`, as `--version` prints it.
fn version() -> String {
    format!("model-agent {}", env!("CARGO_PKG_VERSION"))
}

/// A CA bundle or a proxy that cannot be used fails the start, not every download later.
fn check_network(cli: &Cli) -> Result<(), String> {
    if let Some(path) = cli.ca_bundle.as_deref() {
        hf::read_ca_bundle(path).map_err(|e| format!("--ca-bundle: {e}"))?;
    }
    download_options(cli).network.check()
}

/// The engine's options from the flags and OME's environment variables.
fn download_options(cli: &Cli) -> download::Options {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    download::Options {
        endpoint: download::endpoint(&env),
        files_concurrency: cli.files_concurrency,
        multipart_concurrency: cli.multipart_concurrency,
        multipart_threshold_bytes: cli.multipart_threshold_bytes,
        progress_period_ms: cli.progress_period_ms,
        network: hf::Network::from_env(&env, cli.ca_bundle.clone()),
        ..download::Options::default()
    }
}

async fn run(cli: Cli, node_name: String, downloads: downloads::Downloads) -> Result<(), String> {
    let client = kubeio::client(cli.kubeconfig.as_deref()).await?;
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let config = Config {
        seed,
        write_check: cli.write_check,
        update_model_spec: cli.update_model_spec,
        ..Config::new(&node_name, &cli.models_root)
    };
    let recorder = match &cli.record_trace {
        Some(path) => Some(start_trace(path, &config)?),
        None => None,
    };
    let spec_bytes_max = config.object_bytes_max;
    let state = State::new(config);
    let metrics = Arc::new(Metrics::default());
    let shared = Arc::new(http::Shared {
        readiness: RwLock::new(state.readiness()),
        heartbeat_ms: Default::default(),
        epoch: std::time::Instant::now(),
        stall_ms_max: 30_000,
        metrics: metrics.clone(),
    });
    shared.beat();
    let (stop_http, server) = serve_http(&cli, shared.clone()).await?;

    let Queues { watch_tx, watch_rx, outcomes_tx, outcomes_rx, writes_tx, writes_rx } = Queues::new(WATCH_QUEUE_MAX);
    let apply = kubeio::apply_to(client.clone(), node_name.clone(), cli.namespace.clone());
    let writer = tokio::spawn(kubeio::writer(writes_rx, outcomes_tx.clone(), metrics.clone(), apply));
    kubeio::log_startup(&node_name, &cli.namespace);
    let watchers = [
        tokio::spawn(kubeio::watch_node(client.clone(), node_name.clone(), watch_tx.clone(), metrics.clone())),
        tokio::spawn(kubeio::watch_models(
            client.clone(),
            Kind::BaseModel,
            spec_bytes_max,
            watch_tx.clone(),
            metrics.clone(),
        )),
        tokio::spawn(kubeio::watch_models(
            client.clone(),
            Kind::ClusterBaseModel,
            spec_bytes_max,
            watch_tx,
            metrics.clone(),
        )),
    ];
    let ctx = Ctx::new(
        (client, node_name, cli.namespace.clone(), PathBuf::from(&cli.models_root)),
        outcomes_tx,
        writes_tx,
        (metrics, downloads),
        (cli.fetch_workers, spec_bytes_max),
    );
    let watchers = watchers.iter().map(|w| w.abort_handle()).collect();
    let mut agent = Agent { state, ctx, shared, recorder, watchers };
    let mut inbox = Inbox { watch: watch_rx, outcomes: outcomes_rx };
    agent.drive(&mut inbox, stop_signal()?).await;
    // The writer's queue closes with the agent's executors: it finishes its batch first.
    drop(agent);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    let _ = stop_http.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    info!("stopped");
    Ok(())
}

fn start_trace(path: &std::path::Path, config: &Config) -> Result<std::io::BufWriter<std::fs::File>, String> {
    let file = std::fs::File::create(path).map_err(|e| format!("--record-trace {}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    writeln!(w, "{}", trace::header_line(config)).map_err(|e| e.to_string())?;
    Ok(w)
}

type Server = tokio::task::JoinHandle<std::io::Result<()>>;

async fn serve_http(
    cli: &Cli,
    shared: Arc<http::Shared>,
) -> Result<(tokio::sync::oneshot::Sender<()>, Server), String> {
    let listener = tokio::net::TcpListener::bind((cli.bind_address, cli.port))
        .await
        .map_err(|e| format!("--metrics-bind-address {} --port {}: {e}", cli.bind_address, cli.port))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, http::router(shared))
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .into_future(),
    );
    info!(address = %cli.bind_address, port = cli.port, "serving /healthz /readyz /livez /metrics");
    Ok((stop_tx, server))
}

/// Resolves at the first SIGTERM or SIGINT. The streams exist from here on, so a signal that
/// arrives while the loop is busy is not lost.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    Ok(async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn inspect_takes_a_dir_and_repeated_or_listed_annotations() {
        let (dir, ann) = parse_inspect(args("/m --annotations a=1 b=2 --annotations=c=x=y")).unwrap();
        assert_eq!(dir, PathBuf::from("/m"));
        assert_eq!(ann.len(), 3);
        assert_eq!(ann["c"], "x=y");
        assert!(parse_inspect(args("--annotations a=1")).is_err(), "a DIR is required");
        assert!(parse_inspect(args("/m --annotations nokv")).is_err());
        assert!(parse_inspect(args("/m /n")).is_err());
        // The agent's own flags are untouched: `inspect` is only a subcommand as the first word.
        assert!(parse_cli(args("inspect /m")).is_err());
    }

    #[test]
    fn flags_are_ome_compatible_with_defaults() {
        let c = parse_cli(vec![]).unwrap();
        assert_eq!((c.port, c.models_root.as_str(), c.namespace.as_str()), (8080, "/mnt/models", "ome"));
        assert_eq!(c.write_check, WriteCheck::Auto);
        assert_eq!(c.fetch_workers, 5);
        assert_eq!(c.bind_address.to_string(), "0.0.0.0");
        assert_eq!(parse_cli(args("--metrics-bind-address ::1")).unwrap().bind_address.to_string(), "::1");
        let c = parse_cli(args(
            "--port 9090 --models-root-dir /mnt/data/models --namespace x --node-label-retry 5 \
             --num-download-worker 2 --download-retry 3 --concurrency 4 --multipart-concurrency 4 \
             --node-name ignored --models-root-write-check=never --log-level debug --record-trace /tmp/t",
        ))
        .unwrap();
        assert_eq!(
            (c.port, c.models_root.as_str(), c.namespace.as_str(), c.fetch_workers),
            (9090, "/mnt/data/models", "x", 2)
        );
        assert_eq!(c.write_check, WriteCheck::Never);
        assert_eq!(c.record_trace, Some(PathBuf::from("/tmp/t")));
    }

    #[test]
    fn download_flags_reach_the_engine() {
        let c = parse_cli(args("--multipart-threshold 1048576 --concurrency 999 --ca-bundle /etc/ca.pem")).unwrap();
        let opts = download_options(&c);
        assert_eq!((opts.multipart_threshold_bytes, opts.files_concurrency), (1 << 20, CONCURRENCY_MAX));
        assert_eq!(opts.network.ca_bundle, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(download_options(&parse_cli(vec![]).unwrap()).multipart_threshold_bytes, 200 << 20);
        assert!(parse_cli(args("--multipart-threshold 0")).unwrap_err().contains("positive"));
        assert!(!parse_cli(vec![]).unwrap().update_model_spec, "off by default");
        assert!(parse_cli(args("--update-model-spec --port 1")).unwrap().update_model_spec);
        assert!(!parse_cli(args("--update-model-spec=false")).unwrap().update_model_spec);
        assert!(parse_cli(args("--update-model-spec=yes")).is_err());
    }

    #[test]
    fn bad_flags_are_clear_errors() {
        assert!(parse_cli(args("--models-root-write-check maybe")).unwrap_err().contains("auto, always or never"));
        assert!(parse_cli(args("--port")).unwrap_err().contains("needs a value"));
        assert!(parse_cli(args("--bogus 1")).unwrap_err().contains("unknown flag"));
        assert!(parse_cli(args("--models-root-dir relative")).unwrap_err().contains("absolute"));
        assert!(parse_cli(args("--log-format xml")).unwrap_err().contains("text or json"));
        assert!(parse_cli(args("--metrics-bind-address :8080")).unwrap_err().contains("the port is --port"));
    }
}
