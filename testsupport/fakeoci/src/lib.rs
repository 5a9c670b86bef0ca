//! A fake OCI Object Storage for tests: the native API's GetNamespace, ListObjects (`nextStartWith`
//! paging), HeadObject and GetObject (`Range`), with every request's signature checked against one RSA
//! public key (401 `NotAuthenticated` otherwise, as OCI answers), `Content-MD5`, `opc-multipart-md5` and
//! `opc-meta-md5`, fault switches, a request log and per-object byte counters.
//!
//! ```no_run
//! use model_agent_fakeoci::{BucketFixture, FakeOci, Fixtures, ObjectFixture};
//! let bucket = BucketFixture::new("models")
//!     .object(ObjectFixture::inline("llama/config.json", "{}"))
//!     .object(ObjectFixture::generated("llama/model.safetensors", 1 << 20, 7).multipart(3).with_meta_md5());
//! let oci = FakeOci::start(Fixtures::new().bucket(bucket))?;
//! println!("{} {} {}", oci.endpoint(), oci.namespace(), oci.key_id());
//! # Ok::<(), std::io::Error>(())
//! ```

mod admin;
mod api;
mod auth;
mod faults;
mod fixtures;
mod instance;
mod keys;
mod serve;

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST, RANGE, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tokio::sync::oneshot;

pub use auth::{AuthRefusal, SignedRequest, sign_request, sign_request_with, signing_string};
pub use faults::{Fault, Faults, ObjectBytes, RequestRecord};
pub use fixtures::{BucketFixture, Fixtures, ObjectFixture, StoredObject};
pub use instance::InstanceConfig;
pub use keys::{CertificateParts, PrivateKey, PublicKey, certificate_parts, fingerprint_of_spki, test_keys};
pub use model_agent_fakehub::{Content, pattern_bytes};

/// A request body (POST, PUT, PATCH) larger than this is refused (413) before its signature is checked.
pub(crate) const REQUEST_BODY_BYTES_MAX: usize = 1 << 20;

/// Server settings; `Config::default()` accepts the crate's test key (`test_keys`).
#[derive(Clone, Debug)]
pub struct Config {
    pub namespace: String,
    pub tenancy: String,
    pub user: String,
    /// `-----BEGIN PUBLIC KEY-----` (SubjectPublicKeyInfo) PEM; its fingerprint completes the keyId.
    pub public_key_pem: String,
    /// How far `date` may be from the server's clock (OCI: 5 minutes).
    pub clock_skew_max_s: u64,
    /// Objects per ListObjects page at most, whatever `limit` asks (OCI: 1000).
    pub list_page_size: usize,
    /// Request log entries kept (oldest dropped first).
    pub requests_max: usize,
    pub worker_threads: usize,
    pub bind_ip: IpAddr,
    /// 0: any free port.
    pub port: u16,
    /// The fake instance behind the metadata and federation endpoints (InstancePrincipal).
    pub instance: InstanceConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            namespace: "fakens".into(),
            tenancy: test_keys::TENANCY.into(),
            user: test_keys::USER.into(),
            public_key_pem: test_keys::PUBLIC_KEY_PEM.into(),
            clock_skew_max_s: 300,
            list_page_size: api::LIST_LIMIT_MAX,
            requests_max: 100_000,
            worker_threads: 2,
            bind_ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            instance: InstanceConfig::default(),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) buckets: BTreeMap<String, BTreeMap<String, Arc<StoredObject>>>,
    pub(crate) verifier: auth::Verifier,
    pub(crate) sessions: Arc<instance::Sessions>,
    pub(crate) faults: Faults,
    pub(crate) log: faults::RequestLog,
    pub(crate) bytes: faults::ByteCounters,
    pub(crate) config: Config,
    pub(crate) endpoint: String,
    request_ids: AtomicU64,
}

/// A running fake (its own thread and runtime, so a test may block freely); dropping it stops the listener
/// and ends open connections.
pub struct FakeOci {
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

fn build_buckets(fixtures: &Fixtures) -> io::Result<BTreeMap<String, BTreeMap<String, Arc<StoredObject>>>> {
    let mut buckets = BTreeMap::new();
    for bucket in &fixtures.buckets {
        let objects: &mut BTreeMap<_, _> = buckets.entry(bucket.name.clone()).or_default();
        for object in &bucket.objects {
            objects.insert(object.name.clone(), StoredObject::build(object)?);
        }
    }
    Ok(buckets)
}

impl FakeOci {
    pub fn start(fixtures: Fixtures) -> io::Result<FakeOci> {
        FakeOci::start_with(fixtures, Config::default())
    }

    /// Hashes every object (streaming), binds the listener, and serves until dropped.
    pub fn start_with(fixtures: Fixtures, config: Config) -> io::Result<FakeOci> {
        let key = PublicKey::from_pem(&config.public_key_pem).map_err(io::Error::other)?;
        let key_id = format!("{}/{}/{}", config.tenancy, config.user, key.fingerprint);
        let clock_skew_max = Duration::from_secs(config.clock_skew_max_s);
        let sessions = Arc::new(instance::Sessions::default());
        let listener = std::net::TcpListener::bind(SocketAddr::new(config.bind_ip, config.port))?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            buckets: build_buckets(&fixtures)?,
            verifier: auth::Verifier { key_id, key, clock_skew_max, sessions: sessions.clone() },
            sessions,
            faults: Faults::default(),
            log: faults::RequestLog::new(config.requests_max),
            bytes: faults::ByteCounters::default(),
            endpoint: format!("http://{}", listener.local_addr()?),
            request_ids: AtomicU64::new(0),
            config,
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(shared.config.worker_threads.max(1))
            .thread_name("fakeoci")
            .enable_all()
            .build()?;
        let (shutdown, stop) = oneshot::channel();
        let serving = shared.clone();
        let thread = std::thread::Builder::new().name("fakeoci".into()).spawn(move || {
            runtime.block_on(serve_until_stopped(serving, listener, stop));
            // Ends connections still open (a stalled body, a keep-alive client) instead of waiting for them.
            runtime.shutdown_timeout(Duration::from_secs(1));
        })?;
        Ok(FakeOci { shared, shutdown: Some(shutdown), thread: Some(thread) })
    }

    /// `http://127.0.0.1:PORT`: the Object Storage endpoint.
    pub fn endpoint(&self) -> &str {
        &self.shared.endpoint
    }

    pub fn namespace(&self) -> &str {
        &self.shared.config.namespace
    }

    /// `tenancy/user/fingerprint`: the only keyId accepted.
    pub fn key_id(&self) -> &str {
        &self.shared.verifier.key_id
    }

    pub fn fingerprint(&self) -> &str {
        &self.shared.verifier.key.fingerprint
    }

    /// An object as served (its MD5s, ETag, metadata and content).
    pub fn object(&self, bucket: &str, name: &str) -> Option<Arc<StoredObject>> {
        self.shared.buckets.get(bucket)?.get(name).cloned()
    }

    /// The names in `bucket`, sorted.
    pub fn names(&self, bucket: &str) -> Vec<String> {
        self.shared.buckets.get(bucket).map(|objects| objects.keys().cloned().collect()).unwrap_or_default()
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Every request so far (admin requests excluded), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.snapshot()
    }

    /// Body bytes sent for `object` of `bucket` so far.
    pub fn bytes_served(&self, bucket: &str, object: &str) -> u64 {
        self.shared.bytes.get(bucket, object)
    }

    pub fn bytes_served_all(&self) -> Vec<ObjectBytes> {
        self.shared.bytes.snapshot()
    }

    /// The fake instance metadata service's base, for `OCI_METADATA_BASE_URL`: `http://127.0.0.1:PORT/opc/v2`.
    pub fn metadata_base_url(&self) -> String {
        format!("{}/opc/v2", self.shared.endpoint)
    }

    /// The fake federation service's base (it answers `POST {base}/v1/x509`): the endpoint itself.
    pub fn federation_base_url(&self) -> &str {
        &self.shared.endpoint
    }

    /// Security tokens the fake federation issued so far.
    pub fn tokens_issued(&self) -> u64 {
        self.shared.sessions.issued()
    }

    /// Every token issued so far stops working: requests signed with it get 401.
    pub fn revoke_tokens(&self) {
        self.shared.sessions.revoke_all();
    }

    /// Forgets the request log and the byte counters.
    pub fn clear_requests(&self) {
        self.shared.log.clear();
        self.shared.bytes.clear();
    }
}

impl Drop for FakeOci {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve_until_stopped(shared: Arc<Shared>, listener: std::net::TcpListener, stop: oneshot::Receiver<()>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => panic!("fakeoci: cannot use the bound listener: {error}"),
    };
    tokio::select! {
        result = axum::serve(listener, router(shared)) => eprintln!("fakeoci: listener ended: {result:?}"),
        _ = stop => {}
    }
}

fn router(shared: Arc<Shared>) -> Router {
    let observed = Router::new()
        .route("/n", get(api::get_namespace))
        .route("/n/", get(api::get_namespace))
        .route("/n/{namespace}/b/{bucket}/o", get(api::list_objects))
        .route("/n/{namespace}/b/{bucket}/o/{*object}", get(api::object).head(api::object))
        .fallback(api::not_found)
        .layer(middleware::from_fn_with_state(shared.clone(), observe));
    let identity = instance::router().layer(middleware::from_fn_with_state(shared.clone(), observe_identity));
    admin::router().merge(identity).merge(observed).with_state(shared)
}

/// Logs a metadata or federation request (the federation's refusal reason included); they carry no
/// Object Storage signature and get no Object Storage faults.
async fn observe_identity(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let request_id = format!("fakeoci-{:016x}", shared.request_ids.fetch_add(1, Ordering::Relaxed) + 1);
    let mut record = request_record(&request, &request_id);
    let mut response = next.run(request).await;
    record.auth_refused = response.extensions().get::<instance::RefusalNote>().map(|note| note.0.clone());
    response.headers_mut().insert("opc-request-id", HeaderValue::from_str(&request_id).expect("ASCII"));
    record.status = response.status().as_u16();
    shared.log.push(record);
    response
}

/// Logs every request, answers the armed request faults (429, 503), checks the signature (401), and tags
/// every answer with `opc-request-id` (and `opc-client-request-id` when sent).
async fn observe(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let request_id = format!("fakeoci-{:016x}", shared.request_ids.fetch_add(1, Ordering::Relaxed) + 1);
    let client_request_id = request.headers().get("opc-client-request-id").cloned();
    let mut record = request_record(&request, &request_id);
    let mut response = match shared.faults.take_request_fault() {
        Some(fault) => fault_response(fault),
        None => match authenticate(&shared, request).await {
            Ok(request) => next.run(request).await,
            Err((refusal, response)) => {
                record.auth_refused = refusal.map(|r| r.to_string());
                response
            }
        },
    };
    let headers = response.headers_mut();
    headers.insert("opc-request-id", HeaderValue::from_str(&request_id).expect("ASCII"));
    if let Some(client_request_id) = client_request_id {
        headers.insert("opc-client-request-id", client_request_id);
    }
    record.status = response.status().as_u16();
    shared.log.push(record);
    response
}

fn fault_response(fault: faults::RequestFault) -> Response {
    let (status, code, message) = match fault.status {
        429 => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", "Too many requests for the tenancy"),
        _ => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "The service is temporarily unavailable"),
    };
    let mut response = api::oci_error(status, code, message);
    response.headers_mut().insert(RETRY_AFTER, fault.retry_after_s.into());
    response
}

/// The request again (its body read, for methods that have one) if its signature verifies; otherwise
/// why not and OCI's 401 (or 413 for a body too large to check).
async fn authenticate(shared: &Shared, request: Request) -> Result<Request, (Option<AuthRefusal>, Response)> {
    let (parts, body) = request.into_parts();
    let has_body = matches!(parts.method, Method::POST | Method::PUT | Method::PATCH);
    let body = if has_body {
        match axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await {
            Ok(bytes) => Some(bytes),
            Err(_) => {
                let message = format!("The request body is larger than {REQUEST_BODY_BYTES_MAX} bytes");
                return Err((None, api::oci_error(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge", &message)));
            }
        }
    } else {
        None
    };
    let path_and_query = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let signed =
        SignedRequest { method: &parts.method, path_and_query, headers: &parts.headers, body: body.as_deref() };
    if let Err(refusal) = shared.verifier.verify(&signed, SystemTime::now()) {
        let message = match refusal {
            AuthRefusal::StaleDate(_) => format!("The request is not authenticated: {refusal}"),
            _ => "The required information to complete authentication was not provided or was incorrect.".into(),
        };
        return Err((Some(refusal), api::oci_error(StatusCode::UNAUTHORIZED, "NotAuthenticated", &message)));
    }
    Ok(Request::from_parts(parts, body.map_or_else(Body::empty, Body::from)))
}

fn request_record(request: &Request, request_id: &str) -> RequestRecord {
    let header = |name: HeaderName| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    RequestRecord {
        method: request.method().to_string(),
        uri: request.uri().path_and_query().map_or_else(|| request.uri().path().to_owned(), |pq| pq.to_string()),
        host: header(HOST),
        range: header(RANGE),
        authorization: request.headers().contains_key(AUTHORIZATION),
        auth_refused: None,
        status: 0,
        opc_request_id: request_id.to_owned(),
    }
}
