//! `model-agent`: the imperative shell. It turns watches, reads, probes and time into core
//! inputs, executes the core's effects against the API server and the node, serves health and
//! metrics, and records traces. All decisions are the core's.

/// A log line about one model: its kind, namespace, name and uid as fields of their own (so that
/// a log query can select a model, a namespace or an incarnation), then the line's own fields and
/// message. `model_log!(warn, key, uid, reason = %r, "text")`; `uid` is anything `Display`
/// (`""` where the line is about the name, not one incarnation).
macro_rules! model_log {
    ($level:ident, $key:expr, $uid:expr, $($rest:tt)+) => {{
        let key: &model_agent_core::ModelKey = &$key;
        tracing::$level!(
            kind = key.kind.as_str(),
            namespace = %key.namespace,
            name = %key.name,
            uid = %$uid,
            $($rest)+
        )
    }};
}

mod agent;
#[cfg(test)]
mod canned_http;
mod cli;
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

use model_agent_core::machine::Config;
use model_agent_core::{Kind, State, trace};

use crate::agent::{Agent, Ctx, Inbox, Queues, WATCH_QUEUE_MAX};
use crate::cli::Cli;
use crate::metrics::Metrics;

/// Threads of the download runtime (transfers, file writes and hashing; never the loop's).
const DOWNLOAD_THREADS: usize = 2;

/// Threads for blocking filesystem work at most.
const BLOCKING_THREADS_MAX: usize = 4;

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
            return Err(format!("inspect: unknown flag {arg:?} (model-agent --help)"));
        } else if taking_annotations {
            insert_annotation(&mut annotations, &arg)?;
        } else if dir.replace(PathBuf::from(&arg)).is_some() {
            return Err("inspect takes one DIR".to_string());
        }
    }
    Ok((dir.ok_or("inspect needs a DIR")?, annotations))
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
    // --help and --version exit 0; a bad flag exits 2 with clap's reason.
    let cli = <Cli as clap::Parser>::parse_from(std::iter::once("model-agent".to_string()).chain(args));
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
    if cli.log_json() {
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
    let (client, watching) = kubeio::clients(cli.kubeconfig.as_deref()).await?;
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let config = Config {
        seed,
        write_check: cli.write_check,
        update_model_spec: cli.update_model_spec,
        drift_period_ms: cli.drift_period_ms,
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
        tokio::spawn(kubeio::watch_node(watching.clone(), node_name.clone(), watch_tx.clone(), metrics.clone())),
        tokio::spawn(kubeio::watch_models(
            watching.clone(),
            Kind::BaseModel,
            spec_bytes_max,
            watch_tx.clone(),
            metrics.clone(),
        )),
        tokio::spawn(kubeio::watch_models(watching, Kind::ClusterBaseModel, spec_bytes_max, watch_tx, metrics.clone())),
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

    fn cli(line: &str) -> Cli {
        <Cli as clap::Parser>::try_parse_from(std::iter::once("model-agent").chain(line.split_whitespace())).unwrap()
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
    }

    #[test]
    fn a_log_line_about_a_model_carries_its_kind_namespace_name_and_uid() {
        #[derive(Clone, Default)]
        struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
        let key = model_agent_core::ModelKey::namespaced("team-a", "qwen");
        tracing::subscriber::with_default(subscriber, || {
            model_log!(warn, key, "u-1", reason = "disk full", "model failed on this node");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let fields = &line["fields"];
        assert_eq!(
            (&fields["kind"], &fields["namespace"], &fields["name"], &fields["uid"], &fields["reason"]),
            (&"BaseModel".into(), &"team-a".into(), &"qwen".into(), &"u-1".into(), &"disk full".into()),
            "{text}"
        );
        assert_eq!(fields["message"], "model failed on this node");
    }

    #[test]
    fn download_flags_reach_the_engine() {
        let opts = download_options(&cli("--multipart-threshold 1048576 --concurrency 999 --ca-bundle /etc/ca.pem"));
        assert_eq!((opts.multipart_threshold_bytes, opts.files_concurrency), (1 << 20, cli::CONCURRENCY_MAX));
        assert_eq!(opts.network.ca_bundle, Some(PathBuf::from("/etc/ca.pem")));
        assert_eq!(download_options(&cli("")).multipart_threshold_bytes, 200 << 20);
    }
}
