//! `model-agent`: the imperative shell. It turns watches, reads, probes and time into core
//! inputs, executes the core's effects against the API server and the node, serves health and
//! metrics, and records traces. All decisions are the core's.

mod fsgate;
mod fsops;
mod http;
mod kubeio;
mod lean_model;
mod metrics;
mod modelfiles;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use model_agent_core::machine::{Config, Effect, Input, Note, Op, Outcome, WriteCheck};
use model_agent_core::{Instant, State, trace};

use crate::kubeio::Write;
use crate::metrics::{CoreGauges, Metrics};

const USAGE: &str = "\
model-agent: makes LLM model weights available on this node and reports them (OME-compatible)

USAGE: model-agent [FLAGS]     (env NODE_NAME is required)
       model-agent inspect DIR [--annotations k=v ...]
                               print the metadata `config` the agent would publish for DIR
                               and the spec fields it would fill, as JSON

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
  --num-download-worker N          concurrent fetches (5)
  --download-retry, --concurrency, --multipart-concurrency, --node-name
                                   accepted for OME compatibility; --node-name is ignored (NODE_NAME)";

/// Inputs queued for the core at most; watchers wait when it is full (backpressure).
const INPUT_QUEUE_MAX: usize = 10_000;
/// The loop wakes at least this often (heartbeat, status).
const LOOP_WAKE_MS_MAX: u64 = 1_000;
/// In-flight work is given this long after SIGTERM; the process exits well within 30 s.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Threads for blocking filesystem work at most.
const BLOCKING_THREADS_MAX: usize = 4;
/// Concurrent live reads at most.
const LIVE_READS_CONCURRENT_MAX: usize = 8;

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
            "--log-format" => {
                cli.log_json = match value()?.as_str() {
                    "json" => true,
                    "text" => false,
                    other => return Err(format!("--log-format must be text or json, not {other:?}")),
                }
            }
            "--num-download-worker" => {
                cli.fetch_workers = value()?.parse().map_err(|_| "--num-download-worker: not a number")?;
            }
            "--node-label-retry" | "--download-retry" | "--concurrency" | "--multipart-concurrency" | "--node-name" => {
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
    match runtime.block_on(run(cli, node_name)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Everything effect executors need.
#[derive(Clone)]
struct Ctx {
    client: Client,
    node: String,
    namespace: String,
    root: PathBuf,
    inputs: mpsc::Sender<Input>,
    writes: mpsc::Sender<Write>,
    metrics: Arc<Metrics>,
    inflight: Arc<AtomicUsize>,
    reads: Arc<tokio::sync::Semaphore>,
    fetches: Arc<tokio::sync::Semaphore>,
    spec_bytes_max: usize,
    fs: fsgate::FsGate,
    /// A root probe is in flight (it may be stuck in the kernel): at most one at a time.
    probing: Arc<std::sync::atomic::AtomicBool>,
}

async fn run(cli: Cli, node_name: String) -> Result<(), String> {
    let client = kubeio::client(cli.kubeconfig.as_deref()).await?;
    let seed =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let config = Config { seed, write_check: cli.write_check, ..Config::new(&node_name, &cli.models_root) };
    let mut recorder = match &cli.record_trace {
        Some(path) => {
            let file = std::fs::File::create(path).map_err(|e| format!("--record-trace {}: {e}", path.display()))?;
            let mut w = std::io::BufWriter::new(file);
            writeln!(w, "{}", trace::header_line(&config)).map_err(|e| e.to_string())?;
            Some(w)
        }
        None => None,
    };
    let spec_bytes_max = config.object_bytes_max;
    let mut state = State::new(config);
    let metrics = Arc::new(Metrics::default());
    let epoch = std::time::Instant::now();
    let shared = Arc::new(http::Shared {
        readiness: RwLock::new(state.readiness()),
        heartbeat_ms: Default::default(),
        epoch,
        stall_ms_max: 30_000,
        metrics: metrics.clone(),
    });
    shared.beat();

    let listener = tokio::net::TcpListener::bind((cli.bind_address, cli.port))
        .await
        .map_err(|e| format!("--metrics-bind-address {} --port {}: {e}", cli.bind_address, cli.port))?;
    let (stop_http_tx, stop_http_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, http::router(shared.clone()))
            .with_graceful_shutdown(async {
                let _ = stop_http_rx.await;
            })
            .into_future(),
    );
    info!(address = %cli.bind_address, port = cli.port, "serving /healthz /readyz /livez /metrics");

    let (in_tx, mut in_rx) = mpsc::channel::<Input>(INPUT_QUEUE_MAX);
    let (w_tx, w_rx) = mpsc::channel::<Write>(INPUT_QUEUE_MAX);
    let writer = tokio::spawn(kubeio::writer(
        client.clone(),
        node_name.clone(),
        cli.namespace.clone(),
        w_rx,
        in_tx.clone(),
        metrics.clone(),
    ));
    kubeio::log_startup(&node_name, &cli.namespace);
    let watchers = vec![
        tokio::spawn(kubeio::watch_node(client.clone(), node_name.clone(), in_tx.clone(), metrics.clone())),
        tokio::spawn(kubeio::watch_models(
            client.clone(),
            model_agent_core::Kind::BaseModel,
            spec_bytes_max,
            in_tx.clone(),
            metrics.clone(),
        )),
        tokio::spawn(kubeio::watch_models(
            client.clone(),
            model_agent_core::Kind::ClusterBaseModel,
            spec_bytes_max,
            in_tx.clone(),
            metrics.clone(),
        )),
    ];
    let ctx = Ctx {
        client,
        node: node_name,
        namespace: cli.namespace.clone(),
        root: PathBuf::from(&cli.models_root),
        inputs: in_tx.clone(),
        writes: w_tx,
        metrics: metrics.clone(),
        inflight: Arc::new(AtomicUsize::new(0)),
        reads: Arc::new(tokio::sync::Semaphore::new(LIVE_READS_CONCURRENT_MAX)),
        spec_bytes_max,
        fetches: Arc::new(tokio::sync::Semaphore::new(cli.fetch_workers.max(1))),
        fs: fsgate::FsGate::counting(metrics.fs_calls_unreturned.clone()),
        probing: Default::default(),
    };

    // Persistent streams: a signal that arrives while the loop is busy is not lost.
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut shutdown_at: Option<tokio::time::Instant> = None;
    let mut last_status = tokio::time::Instant::now() - Duration::from_secs(10);
    loop {
        let now_ms = epoch.elapsed().as_millis() as u64;
        let wake_ms =
            state.next_deadline().map_or(LOOP_WAKE_MS_MAX, |d| d.as_ms().saturating_sub(now_ms).min(LOOP_WAKE_MS_MAX));
        let input = tokio::select! {
            biased;
            _ = sigterm.recv(), if shutdown_at.is_none() => Some(Input::Shutdown),
            _ = sigint.recv(), if shutdown_at.is_none() => Some(Input::Shutdown),
            received = in_rx.recv() => received,
            _ = tokio::time::sleep(Duration::from_millis(wake_ms)) => Some(Input::Tick),
        };
        let Some(input) = input else { break };
        if input == Input::Shutdown {
            info!("shutdown requested: no new destructive effect; finishing in-flight work");
            shutdown_at = Some(tokio::time::Instant::now());
            for w in &watchers {
                w.abort();
            }
        }
        let now = Instant(epoch.elapsed().as_millis() as u64);
        let output = state.handle(now, input.clone());
        if let Some(w) = &mut recorder
            && let Err(e) = writeln!(w, "{}", trace::step_line(now, &input, &output))
        {
            warn!(error = %e, "--record-trace: writing failed; recording stops");
            recorder = None;
        }
        for note in &output.notes {
            log_note(note);
        }
        for effect in output.effects {
            dispatch(&ctx, effect).await;
        }
        shared.beat();
        if last_status.elapsed() >= Duration::from_millis(500) {
            last_status = tokio::time::Instant::now();
            publish_status(&state, &shared, &metrics, now);
            if let Some(w) = &mut recorder {
                let _ = w.flush();
            }
        }
        if let Some(at) = shutdown_at {
            let idle = ctx.inflight.load(Ordering::SeqCst) == 0;
            if idle || at.elapsed() >= SHUTDOWN_GRACE {
                if !idle {
                    warn!(
                        in_flight = ctx.inflight.load(Ordering::SeqCst),
                        "abandoning in-flight work at the shutdown deadline"
                    );
                }
                break;
            }
        }
    }
    // Workers are joined before their channels close: the writer finishes its batch.
    drop(ctx);
    drop(in_tx);
    let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    if let Some(mut w) = recorder {
        let _ = w.flush();
    }
    let _ = stop_http_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    info!("stopped");
    Ok(())
}

fn publish_status(state: &State, shared: &http::Shared, metrics: &Metrics, now: Instant) {
    let readiness = state.readiness();
    let was_ready = shared.readiness.read().expect("readiness lock").ready;
    // Once ready, and then every minute (relists parse every object again).
    let minute = now.as_ms() / 60_000 != now.as_ms().saturating_sub(500) / 60_000;
    if readiness.ready && (!was_ready || minute) {
        release_freed_memory();
    }
    metrics.retain_models(|key| state.knows(key));
    let (pending, oldest) = state.pending_confirmations();
    *metrics.core.lock().expect("metrics lock") = CoreGauges {
        stats: state.stats().clone(),
        pending_confirmations: pending,
        oldest_pending_seconds: oldest.map_or(0.0, |o| now.ms_since(o) as f64 / 1000.0),
        models: state.model_count(),
        root_writable: state.root().map(|r| r.writable),
        ready: readiness.ready,
    };
    *shared.readiness.write().expect("readiness lock") = readiness;
}

/// The first lists parse every model object in full and keep only a lean copy; glibc keeps the
/// freed pages. Give them back once the agent is ready and every minute after, so that its
/// resident size stays near what it holds (see README, memory).
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the OS; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Start executing one effect; its outcome comes back to the core as an input.
async fn dispatch(ctx: &Ctx, effect: Effect) {
    let Effect { id, op } = effect;
    match op {
        Op::Publish { label_key, label, cm_key, entry, .. } => {
            let w = Write::Publish { id, label_key, label, cm_key, entry: entry.to_json() };
            let _ = ctx.writes.send(w).await;
        }
        Op::Unpublish { uid, label_key, remove_label, cm_key, .. } => {
            let w = Write::Unpublish { id, label_key, remove_label, cm_key, uid: uid.as_str().to_string() };
            let _ = ctx.writes.send(w).await;
        }
        Op::RemoveOrphanLabel { label_key } => {
            let _ = ctx.writes.send(Write::OrphanLabel { id, label_key }).await;
        }
        Op::RemoveOrphanEntry { cm_key, uid } => {
            let uid = uid.map(|u| u.as_str().to_string());
            let _ = ctx.writes.send(Write::OrphanEntry { id, cm_key, uid }).await;
        }
        Op::LiveGet { key } => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            Some(Input::LiveRead { id, result: kubeio::live_get(&c.client, &key, c.spec_bytes_max).await })
        }),
        Op::LiveGetNode => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            Some(Input::NodeRead { id, result: kubeio::live_get_node(&c.client, &c.node).await })
        }),
        Op::LiveList { kind } => spawn(ctx, async move |c: Ctx| {
            let _permit = c.reads.acquire().await;
            Some(Input::LiveList { id, result: kubeio::live_list(&c.client, kind, c.spec_bytes_max).await })
        }),
        Op::VerifyLocal { key, path, .. } => spawn(ctx, async move |c: Ctx| {
            let _permit = c.fetches.acquire().await;
            let p = PathBuf::from(&path);
            let what = format!("verifying {path}");
            let result =
                c.fs.call(&what, fsgate::VERIFY_DEADLINE, move || fsops::verify_local(&p)).await.and_then(|r| r);
            c.metrics.model_outcome(&key, result.is_ok());
            Some(Input::EffectDone { id, outcome: outcome(result) })
        }),
        Op::Download { key, storage_uri, .. } => spawn(ctx, async move |c: Ctx| {
            // No downloader for any scheme is built in yet: say so plainly (the model is Failed
            // with this reason and retried with backoff), never pretend.
            c.metrics.model_outcome(&key, false);
            let reason = format!("downloading {storage_uri} is not supported by this build of model-agent");
            Some(Input::EffectDone { id, outcome: Outcome::Failed(reason) })
        }),
        Op::TrashDir { uid, path, trash_name, .. } => spawn(ctx, async move |c: Ctx| {
            let root = c.root.clone();
            let what = format!("moving {path} to the trash");
            let work = move || fsops::trash_dir(&root, &path, &uid, &trash_name);
            let result = c.fs.call(&what, fsgate::TRASH_DEADLINE, work).await.and_then(|r| r);
            Some(Input::EffectDone { id, outcome: outcome(result) })
        }),
        Op::PurgeTrash { name } => spawn(ctx, async move |c: Ctx| {
            let root = c.root.clone();
            let what = format!("purging trash entry {name}");
            let work = move || fsops::purge_trash(&root, &name);
            let result = c.fs.call(&what, fsgate::PURGE_DEADLINE, work).await.and_then(|r| r);
            Some(Input::EffectDone { id, outcome: outcome(result) })
        }),
        Op::ProbeRoot => spawn(ctx, async move |c: Ctx| Some(Input::RootProbed { id, probe: probe_root(&c).await })),
        Op::Snapshot => spawn(ctx, async move |c: Ctx| {
            let mut snapshot = match kubeio::snapshot_api(&c.client, &c.node, &c.namespace).await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "drift snapshot failed; the next period asks again");
                    return None;
                }
            };
            let root = c.root.clone();
            let scanned =
                c.fs.call("scanning the models root", fsgate::TRASH_DEADLINE, move || fsops::scan(&root)).await;
            let (owned, trash) = match scanned {
                Ok(found) => found,
                Err(e) => {
                    warn!(error = %e, "drift snapshot failed; the next period asks again");
                    return None;
                }
            };
            snapshot.owned_dirs = owned;
            snapshot.trash = trash;
            Some(Input::DriftObserved { id, snapshot })
        }),
    }
}

/// Probe the models root, at most one probe at a time: while an earlier probe is stuck in the
/// kernel, the answer is at once that the root has not answered.
async fn probe_root(c: &Ctx) -> model_agent_core::machine::RootProbe {
    use model_agent_core::machine::RootProbe;
    if c.probing.swap(true, Ordering::SeqCst) {
        return RootProbe::unanswered(format!(
            "did not answer within {}: an earlier probe has not returned",
            fsgate::duration_text(fsgate::PROBE_DEADLINE)
        ));
    }
    // Cleared when the probe returns, or when the gate drops it unrun.
    let (root, probing) = (c.root.clone(), ClearOnDrop(c.probing.clone()));
    let work = move || {
        let _probing = probing;
        fsops::probe_root(&root)
    };
    match c.fs.call("probing the models root", fsgate::PROBE_DEADLINE, work).await {
        Ok(probe) => probe,
        Err(e) => {
            warn!(error = %e, "models root probe failed");
            RootProbe::unanswered(format!("did not answer within {}", fsgate::duration_text(fsgate::PROBE_DEADLINE)))
        }
    }
}

struct ClearOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn outcome(result: Result<(), String>) -> Outcome {
    match result {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Failed(e),
    }
}

/// Run one effect's work in a task, counted as in flight until its input is queued.
fn spawn<F>(ctx: &Ctx, work: impl FnOnce(Ctx) -> F + Send + 'static)
where
    F: std::future::Future<Output = Option<Input>> + Send + 'static,
{
    let c = ctx.clone();
    c.inflight.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        let inputs = c.inputs.clone();
        let inflight = c.inflight.clone();
        c.metrics.inc(&c.metrics.effects_executed);
        if let Some(input) = work(c).await {
            let _ = inputs.send(input).await;
        }
        inflight.fetch_sub(1, Ordering::SeqCst);
    });
}

fn log_note(note: &Note) {
    match note {
        Note::PhantomSuppressed { key, uid, cause } => {
            warn!(model = %key, uid = %uid, cause = ?cause, "phantom delete suppressed: a live read shows the model alive")
        }
        Note::DeleteConfirmed { key, uid, confirmation } => {
            info!(model = %key, uid = %uid, confirmation = ?confirmation, "deletion confirmed; cleaning up this node")
        }
        Note::ModelFailed { key, uid, reason } => {
            warn!(model = %key, uid = %uid, reason = %reason, "model failed on this node")
        }
        Note::ReadFailed { key, kind, reason, retry_in_ms } => {
            warn!(model = ?key, kind = %kind, reason = %reason, retry_in_ms, "live read failed; the candidate stays pending")
        }
        Note::EffectFailed { id, reason, retry_in_ms } => {
            warn!(effect = ?id, reason = %reason, retry_in_ms, "effect failed; retrying")
        }
        Note::BreakerTripped { candidates, placed, until } => {
            warn!(
                candidates,
                placed,
                hold_until_ms = until.as_ms(),
                "blast-radius breaker tripped: destructive decisions held"
            )
        }
        Note::BreakerHeld { key, uid, until } => {
            info!(model = %key, uid = %uid, hold_until_ms = until.as_ms(), "withdrawal or cleanup held by the breaker; read again after the hold")
        }
        Note::NodeReadFailed { reason, retry_in_ms } => {
            warn!(reason = %reason, retry_in_ms, "live read of this Node failed; placement exits wait")
        }
        Note::ExitCancelled { key, uid } => {
            info!(model = %key, uid = %uid, "placement exit cancelled: the live Node still places the model here")
        }
        Note::NodeLabelsVanished { vanished, had, until } => {
            warn!(
                vanished,
                had,
                hold_until_ms = until.as_ms(),
                "most of this Node's labels vanished at once: destructive decisions held"
            )
        }
        Note::KeyCollision { key, uid, owner } => {
            let reason = model_agent_core::machine::collision_reason(key, owner);
            warn!(model = %key, uid = %uid, owner = %owner, reason = %reason, "model failed on this node: its label key collides")
        }
    }
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
    fn bad_flags_are_clear_errors() {
        assert!(parse_cli(args("--models-root-write-check maybe")).unwrap_err().contains("auto, always or never"));
        assert!(parse_cli(args("--port")).unwrap_err().contains("needs a value"));
        assert!(parse_cli(args("--bogus 1")).unwrap_err().contains("unknown flag"));
        assert!(parse_cli(args("--models-root-dir relative")).unwrap_err().contains("absolute"));
        assert!(parse_cli(args("--log-format xml")).unwrap_err().contains("text or json"));
        assert!(parse_cli(args("--metrics-bind-address :8080")).unwrap_err().contains("the port is --port"));
    }
}
