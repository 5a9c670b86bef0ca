//! A fake Hugging Face Hub for tests: the revision and tree APIs, `resolve` (regular files served here, LFS
//! files by 302 to a second "CDN" listener that refuses `Authorization`), `Range`, private and gated repos
//! with the Hub's `X-Error-Code`s, fault switches, a request log and per-file byte counters.
//!
//! ```no_run
//! use model_agent_fakehub::{CommitFixture, FakeHub, Fixtures, RepoFixture};
//! let commit = CommitFixture::new().file("config.json", "{}").generated_lfs("model.safetensors", 1 << 20, 7);
//! let hub = FakeHub::start(Fixtures::new().repo(RepoFixture::new("org/model").commit("c1", commit).branch("main", "c1")))?;
//! println!("{}", hub.endpoint());
//! # Ok::<(), std::io::Error>(())
//! ```

mod admin;
mod cdn;
mod content;
mod faults;
mod fixtures;
mod hub;
mod model;
mod serve;

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST, RANGE, RETRY_AFTER};
use axum::http::{HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::oneshot;

pub use content::{Content, Digests, LfsDigest, git_blob_oid, lfs_pointer, pattern_bytes, sha256_hex};
pub use faults::{Fault, Faults, FileBytes, Listener, RequestRecord, Scope};
pub use fixtures::{Access, CommitFixture, FileFixture, Fixtures, RepoFixture};

/// Server settings; `Config::default()` is the Hub's behaviour on loopback ports chosen by the OS.
#[derive(Clone, Debug)]
pub struct Config {
    /// Tree entries per page (the Hub uses 1000; tests use a few to exercise pagination).
    pub tree_page_size: usize,
    /// How long a CDN URL stays valid.
    pub cdn_url_ttl_s: u64,
    /// Request log entries kept (oldest dropped first).
    pub requests_max: usize,
    pub worker_threads: usize,
    pub bind_ip: IpAddr,
    /// 0: any free port.
    pub hub_port: u16,
    pub cdn_port: u16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tree_page_size: 1000,
            cdn_url_ttl_s: 3600,
            requests_max: 100_000,
            worker_threads: 2,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            hub_port: 0,
            cdn_port: 0,
        }
    }
}

/// State shared by both listeners.
pub(crate) struct Shared {
    pub(crate) model: model::HubModel,
    pub(crate) faults: Faults,
    pub(crate) log: faults::RequestLog,
    pub(crate) bytes: faults::ByteCounters,
    pub(crate) config: Config,
    pub(crate) hub_endpoint: String,
    pub(crate) cdn_endpoint: String,
    pub(crate) signing_key: String,
}

/// A running fake Hub (its own thread and runtime, so a test may block freely); dropping it stops both
/// listeners and ends open connections.
pub struct FakeHub {
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What the tree API says of one file, for tests to compare against.
#[derive(Clone, Debug)]
pub struct FileInfo {
    pub size_bytes: u64,
    pub git_oid: String,
    pub lfs_sha256: Option<String>,
    pub content: Content,
}

impl FakeHub {
    pub fn start(fixtures: Fixtures) -> io::Result<FakeHub> {
        FakeHub::start_with(fixtures, Config::default())
    }

    /// Hashes every fixture file (streaming), binds both listeners, and serves until dropped.
    pub fn start_with(fixtures: Fixtures, config: Config) -> io::Result<FakeHub> {
        let model = model::HubModel::build(&fixtures)?;
        let hub_listener = std::net::TcpListener::bind(SocketAddr::new(config.bind_ip, config.hub_port))?;
        let cdn_listener = std::net::TcpListener::bind(SocketAddr::new(config.bind_ip, config.cdn_port))?;
        hub_listener.set_nonblocking(true)?;
        cdn_listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            model,
            faults: Faults::default(),
            log: faults::RequestLog::new(config.requests_max),
            bytes: faults::ByteCounters::default(),
            hub_endpoint: format!("http://{}", hub_listener.local_addr()?),
            cdn_endpoint: format!("http://{}", cdn_listener.local_addr()?),
            signing_key: sha256_hex(
                format!("{:?}{:?}", std::time::SystemTime::now(), hub_listener.local_addr()?).as_bytes(),
            ),
            config,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(shared.config.worker_threads.max(1))
            .thread_name("fakehub")
            .enable_all()
            .build()?;
        let (shutdown, stop) = oneshot::channel();
        let serving = shared.clone();
        let thread = std::thread::Builder::new().name("fakehub".into()).spawn(move || {
            runtime.block_on(serve_until_stopped(serving, hub_listener, cdn_listener, stop));
            // Ends connections still open (a stalled body, a keep-alive client) instead of waiting for them.
            runtime.shutdown_timeout(Duration::from_secs(1));
        })?;
        Ok(FakeHub { shared, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`: the Hub (`HF_ENDPOINT`).
    pub fn endpoint(&self) -> &str {
        &self.shared.hub_endpoint
    }

    /// `http://127.0.0.1:PORT`: the CDN that LFS downloads are redirected to.
    pub fn cdn_endpoint(&self) -> &str {
        &self.shared.cdn_endpoint
    }

    /// The sha of the commit named `commit_name` in the fixtures of `repo_id`.
    pub fn commit_sha(&self, repo_id: &str, commit_name: &str) -> Option<String> {
        self.shared.model.repos.get(repo_id)?.shas_by_name.get(commit_name).cloned()
    }

    /// What `revision` (branch, tag or sha) of `repo_id` holds at `path`.
    pub fn file(&self, repo_id: &str, revision: &str, path: &str) -> Option<FileInfo> {
        let file = self.shared.model.repos.get(repo_id)?.resolve(revision)?.files.get(path)?.clone();
        Some(FileInfo {
            size_bytes: file.size_bytes(),
            git_oid: file.digests.git_oid.clone(),
            lfs_sha256: file.digests.lfs.as_ref().map(|l| l.sha256.clone()),
            content: file.content.clone(),
        })
    }

    /// The paths of `revision` of `repo_id`.
    pub fn paths(&self, repo_id: &str, revision: &str) -> Option<Vec<String>> {
        Some(self.shared.model.repos.get(repo_id)?.resolve(revision)?.files.keys().cloned().collect())
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Every request so far (admin requests excluded), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.snapshot()
    }

    /// Body bytes sent for `path` of `repo_id` so far, Hub and CDN together.
    pub fn bytes_served(&self, repo_id: &str, path: &str) -> u64 {
        self.shared.bytes.get(repo_id, path)
    }

    pub fn bytes_served_all(&self) -> Vec<FileBytes> {
        self.shared.bytes.snapshot()
    }

    /// Forgets the request log and the byte counters.
    pub fn clear_requests(&self) {
        self.shared.log.clear();
        self.shared.bytes.clear();
    }
}

impl Drop for FakeHub {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve_until_stopped(
    shared: Arc<Shared>,
    hub: std::net::TcpListener,
    cdn: std::net::TcpListener,
    stop: oneshot::Receiver<()>,
) {
    let (hub, cdn) = match (tokio::net::TcpListener::from_std(hub), tokio::net::TcpListener::from_std(cdn)) {
        (Ok(hub), Ok(cdn)) => (hub, cdn),
        (Err(error), _) | (_, Err(error)) => panic!("fakehub: cannot use the bound listeners: {error}"),
    };
    let hub_app = hub_router(shared.clone());
    let cdn_app = cdn_router(shared);
    tokio::select! {
        result = axum::serve(hub, hub_app) => eprintln!("fakehub: hub listener ended: {result:?}"),
        result = axum::serve(cdn, cdn_app) => eprintln!("fakehub: cdn listener ended: {result:?}"),
        _ = stop => {}
    }
}

fn hub_router(shared: Arc<Shared>) -> Router {
    let observed = Router::new()
        .route("/api/models/{org}/{name}", get(hub::model_info))
        .route("/api/models/{org}/{name}/revision/{revision}", get(hub::revision_info))
        .route("/api/models/{org}/{name}/tree/{revision}", get(hub::tree_root))
        .route("/api/models/{org}/{name}/tree/{revision}/{*path}", get(hub::tree_dir))
        .route("/{org}/{name}/resolve/{revision}/{*path}", get(hub::resolve).head(hub::resolve))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state((shared.clone(), Listener::Hub), observe));
    admin::router().merge(observed).with_state(shared)
}

fn cdn_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/repos/{org}/{name}/{commit}/{*path}", get(cdn::serve).head(cdn::serve))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state((shared.clone(), Listener::Cdn), observe))
        .with_state(shared)
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// Logs every request and answers the armed request-level faults (429, 5xx) before any handler.
async fn observe(State((shared, listener)): State<(Arc<Shared>, Listener)>, request: Request, next: Next) -> Response {
    let mut record = request_record(&shared, listener, &request);
    let response = match shared.faults.take_request_fault(listener) {
        Some(faults::RequestFault::RateLimit { retry_after_s }) => {
            let body = "Too Many Requests: fakehub rate limit";
            (StatusCode::TOO_MANY_REQUESTS, [(RETRY_AFTER, retry_after_s.to_string())], body).into_response()
        }
        Some(faults::RequestFault::ServerError { status }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            (status, "fakehub: injected server error").into_response()
        }
        None => next.run(request).await,
    };
    record.status = response.status().as_u16();
    shared.log.push(record);
    response
}

fn request_record(shared: &Shared, listener: Listener, request: &Request) -> RequestRecord {
    let header = |name: HeaderName| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let endpoint = if listener == Listener::Hub { &shared.hub_endpoint } else { &shared.cdn_endpoint };
    RequestRecord {
        listener,
        port: endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(0),
        method: request.method().to_string(),
        uri: request.uri().path_and_query().map_or_else(|| request.uri().path().to_owned(), |pq| pq.to_string()),
        host: header(HOST),
        range: header(RANGE),
        authorization: request.headers().contains_key(AUTHORIZATION),
        status: 0,
    }
}
