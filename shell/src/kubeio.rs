//! The API server: watches (turned into core inputs), live reads, and the writer that batches
//! label and ConfigMap changes for this node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, ApiResource, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Config};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use model_agent_core::machine::{
    DriftSnapshot, EffectId, EntryView, Input, ListResult, NodeReadResult, Outcome, ReadResult, WatchEvent,
};
use model_agent_core::placement::NodeView;
use model_agent_core::wire::{self, ModelStatus};
use model_agent_core::{Kind, ModelKey, ModelObject};

use crate::lean_model::LeanModel;
use crate::metrics::Metrics;

/// A live read not answered by then is failed (the core also keeps its own 10 s deadline).
pub const LIVE_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Each request of the writer (the Node's label patch, the ConfigMap's read and write): the
/// client has no read timeout of its own, and one request that never answers held the one batch
/// in flight, so that no label or entry of any model was written again (a review). A request
/// past it fails the batch, which the core retries (every write is idempotent).
pub const WRITE_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `request`, or why it did not answer within `timeout`.
async fn within<T>(
    timeout: Duration,
    what: impl FnOnce() -> String,
    request: impl Future<Output = T>,
) -> Result<T, String> {
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| format!("{} timed out after {} s", what(), timeout.as_secs()))
}
/// Changes written in one node patch and one ConfigMap write, at most.
pub const WRITE_BATCH_MAX: usize = 2_000;
/// ConfigMap read-modify-write attempts on conflicts.
pub const CONFIGMAP_ATTEMPTS_MAX: usize = 8;

pub fn model_resource(kind: Kind) -> ApiResource {
    let gvk = GroupVersionKind::gvk("ome.io", "v1beta1", kind.as_str());
    ApiResource::from_gvk_with_plural(&gvk, kind.plural())
}

/// The API client for requests (each with its own deadline) and the one for the watchers.
pub async fn clients(kubeconfig: Option<&str>) -> Result<(Client, Client), String> {
    let config = client_config(kubeconfig).await?;
    let requests = Client::try_from(config.clone()).map_err(|e| format!("building the API client: {e}"))?;
    Ok((requests, watch_client(config, WATCH_READ_TIMEOUT)?))
}

/// A connection of the watchers' client that sends nothing for this long is dead. kube's watcher
/// asks the server to end each watch call after 290 s and gives up on a silent one 5 s later,
/// but its LIST pages had no deadline: one page on a half-open connection (an API server
/// restarted behind a load balancer, say) stopped that kind's (re)list for good, and the agent
/// saw no change of it again while `/livez` stayed green.
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(330);

/// The watchers' client: every response must keep sending within `read_timeout`, counted from
/// each request (a pooled connection's idle time does not count).
pub fn watch_client(mut config: Config, read_timeout: Duration) -> Result<Client, String> {
    config.read_timeout = Some(read_timeout);
    config.reset_reader_on_write = true;
    Client::try_from(config).map_err(|e| format!("building the watchers' API client: {e}"))
}

async fn client_config(kubeconfig: Option<&str>) -> Result<Config, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| format!("--kubeconfig {path}: {e}"))?;
            Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("--kubeconfig {path}: {e}"))?
        }
        None => Config::infer().await.map_err(|e| format!("no kubeconfig and no in-cluster config: {e}"))?,
    };
    Ok(config)
}

/// One object from the API, as the core keeps it. An object that cannot be identified is
/// logged and skipped: it can never turn into a delete. A spec over `spec_bytes_max`
/// (`Config::object_bytes_max`) is kept as identity and a reason.
pub fn to_model(kind: Kind, obj: LeanModel, spec_bytes_max: usize) -> Option<ModelObject> {
    let name = obj.metadata.name.clone();
    match obj.into_model(kind, spec_bytes_max) {
        Ok(m) => Some(m),
        Err(e) => {
            warn!(kind = %kind, name = ?name, error = %e, "skipping a model object that cannot be identified");
            None
        }
    }
}

/// Objects per page of the watcher's (re)lists and of live LISTs. kube decodes a page with about
/// twice its size in memory, so the peak grows with page size times object size (each object is
/// at most 1.5 MiB, the API server's default): `t9` measured a 64.5 MiB peak at 100 per page with
/// 20 objects of 1 MiB, 53.5 MiB at 10, 37 MiB at 5. The cost is requests: a relist of N objects
/// takes N/10.
pub const WATCH_PAGE_ITEMS: u32 = 10;

/// Watch one model kind (all namespaces) and feed its events, relist boundaries included, to
/// the core. The watcher's default list semantic (a quorum read) is kept.
pub async fn watch_models(
    client: Client,
    kind: Kind,
    spec_bytes_max: usize,
    tx: mpsc::Sender<Input>,
    metrics: Arc<Metrics>,
) {
    let api: Api<LeanModel> = Api::all_with(client, &model_resource(kind));
    let stream = watcher(api, watcher::Config::default().page_size(WATCH_PAGE_ITEMS)).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(watcher::Event::Init) => WatchEvent::RelistStarted,
            Ok(watcher::Event::InitApply(o)) => match to_model(kind, o, spec_bytes_max) {
                Some(m) => WatchEvent::RelistItem(Arc::new(m)),
                None => continue,
            },
            Ok(watcher::Event::InitDone) => WatchEvent::RelistDone,
            Ok(watcher::Event::Apply(o)) => match to_model(kind, o, spec_bytes_max) {
                Some(m) => {
                    debug!(kind = %kind, name = %m.key.name, "watch event: applied");
                    WatchEvent::Applied(Arc::new(m))
                }
                None => continue,
            },
            Ok(watcher::Event::Delete(o)) => match to_model(kind, o, spec_bytes_max) {
                Some(m) => WatchEvent::Deleted(Arc::new(m)),
                None => continue,
            },
            Err(e) => {
                // Never "empty": an error only delays; the watcher relists by itself.
                metrics.inc(&metrics.watch_errors);
                warn!(kind = %kind, error = %e, "watch error; the watcher retries with backoff");
                continue;
            }
        };
        if tx.send(Input::Watch { kind, event }).await.is_err() {
            return;
        }
    }
}

/// Watch this agent's own Node for its labels (eligibility).
pub async fn watch_node(client: Client, node: String, tx: mpsc::Sender<Input>, metrics: Arc<Metrics>) {
    let api: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                let view = NodeView { name: node.clone(), labels: n.metadata.labels.unwrap_or_default() };
                if tx.send(Input::NodeObserved(view)).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                metrics.inc(&metrics.watch_errors);
                warn!(node = %node, error = %e, "node watch error; retrying");
            }
        }
    }
}

fn model_api(client: &Client, key: &ModelKey) -> Api<LeanModel> {
    let ar = model_resource(key.kind);
    match key.kind {
        Kind::ClusterBaseModel => Api::all_with(client.clone(), &ar),
        Kind::BaseModel => Api::namespaced_with(client.clone(), &key.namespace, &ar),
    }
}

/// Quorum GET (no resourceVersion) of one model, bounded in time.
pub async fn live_get(client: &Client, key: &ModelKey, spec_bytes_max: usize) -> ReadResult {
    let api = model_api(client, key);
    match tokio::time::timeout(LIVE_READ_TIMEOUT, api.get_opt(&key.name)).await {
        Err(_) => ReadResult::Failed(format!("GET {key} timed out after {} s", LIVE_READ_TIMEOUT.as_secs())),
        Ok(Err(e)) => ReadResult::Failed(format!("GET {key}: {e}")),
        Ok(Ok(None)) => ReadResult::NotFound,
        Ok(Ok(Some(obj))) => match to_model(key.kind, obj, spec_bytes_max) {
            Some(m) => ReadResult::Found(Arc::new(m)),
            None => ReadResult::Failed(format!("GET {key}: the object cannot be identified")),
        },
    }
}

/// The field manager every write names, so the Node's and the ConfigMap's managed fields say
/// who set the agent's labels and entries (`kubectl get node -o yaml --show-managed-fields`).
pub const FIELD_MANAGER: &str = "model-agent";

fn patch_params() -> PatchParams {
    PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..PatchParams::default() }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() }
}

/// Reads and conflicts (another node's fill won) before a spec fill is given up this time.
const FILL_SPEC_ATTEMPTS_MAX: usize = 3;
/// A spec fill larger than this (a huge `diffusionPipeline`, say) is not written.
const FILL_SPEC_BYTES_MAX: usize = 16 << 10;

/// `--update-model-spec`: fills the empty metadata fields of the live model's spec with a merge
/// patch that carries the resourceVersion read, so of all nodes one write wins and the others
/// read again and find the fields filled. Says what it did; a model gone, another uid or
/// nothing empty is done too.
pub async fn fill_spec(
    client: &Client,
    key: &ModelKey,
    uid: &str,
    metadata: &model_agent_metadata::Metadata,
) -> Result<String, String> {
    let ar = model_resource(key.kind);
    let api: Api<kube::api::DynamicObject> = match key.kind {
        Kind::ClusterBaseModel => Api::all_with(client.clone(), &ar),
        Kind::BaseModel => Api::namespaced_with(client.clone(), &key.namespace, &ar),
    };
    for _ in 0..FILL_SPEC_ATTEMPTS_MAX {
        let read = tokio::time::timeout(LIVE_READ_TIMEOUT, api.get_opt(&key.name)).await;
        let object = match read {
            Err(_) => return Err(format!("GET {key} timed out after {} s", LIVE_READ_TIMEOUT.as_secs())),
            Ok(Err(e)) => return Err(format!("GET {key}: {e}")),
            Ok(Ok(None)) => return Ok("the model is gone".into()),
            Ok(Ok(Some(object))) => object,
        };
        if object.metadata.uid.as_deref() != Some(uid) {
            return Ok("the model was re-created".into());
        }
        let version = object.metadata.resource_version.clone().unwrap_or_default();
        let spec = object.data.get("spec").and_then(|s| s.as_object()).cloned().unwrap_or_default();
        let Some(patch) = model_agent_metadata::spec_merge_patch(&spec, &version, metadata) else {
            return Ok("no empty field to fill".into());
        };
        let bytes = patch.to_string().len();
        if bytes > FILL_SPEC_BYTES_MAX {
            return Ok(format!("not written: the fill is {bytes} bytes, more than {FILL_SPEC_BYTES_MAX}"));
        }
        let fields: Vec<String> = patch["spec"].as_object().map(|f| f.keys().cloned().collect()).unwrap_or_default();
        let (params, body) = (patch_params(), Patch::Merge(&patch));
        let patched = tokio::time::timeout(LIVE_READ_TIMEOUT, api.patch(&key.name, &params, &body));
        match patched.await {
            Err(_) => return Err(format!("PATCH {key} timed out after {} s", LIVE_READ_TIMEOUT.as_secs())),
            Ok(Ok(_)) => return Ok(format!("filled {}", fields.join(", "))),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => continue,
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                return Err(format!(
                    "PATCH {key}: forbidden: --update-model-spec needs deploy/components/update-model-spec/update-model-spec.yaml ({})",
                    s.message
                ));
            }
            Ok(Err(e)) => return Err(format!("PATCH {key}: {e}")),
        }
    }
    Err(format!("PATCH {key}: the model changed under {FILL_SPEC_ATTEMPTS_MAX} attempts in a row"))
}

/// Objects per page of a live LIST: bounds what one response holds in memory.
pub const LIST_PAGE_ITEMS: u32 = WATCH_PAGE_ITEMS;
/// Pages of one live LIST before it is given up as failed (100,000 objects at `LIST_PAGE_ITEMS`).
pub const LIST_PAGES_MAX: usize = 10_000;

/// How long a live LIST may take: `all` of it (the core's deadline, which grows with the models
/// it keeps) and each `page` (a GET's: a silent API server is found as soon as a lone read would).
#[derive(Clone, Copy, Debug)]
pub struct ListDeadlines {
    pub all: Duration,
    pub page: Duration,
}

impl ListDeadlines {
    /// The core's `timeout_ms` for the whole LIST, or a GET's deadline when it gives none.
    pub fn of(timeout_ms: Option<u64>) -> ListDeadlines {
        let all = timeout_ms.map_or(LIVE_READ_TIMEOUT, Duration::from_millis);
        ListDeadlines { all, page: LIVE_READ_TIMEOUT.min(all) }
    }
}

/// Quorum LIST of one kind, paged and followed to the end, bounded in time. An item that cannot
/// be identified, or a continue token that cannot be followed, fails the whole read: a partial
/// list must never answer a candidate as NotFound.
pub async fn live_list(client: &Client, kind: Kind, spec_bytes_max: usize, deadlines: ListDeadlines) -> ListResult {
    let api: Api<LeanModel> = Api::all_with(client.clone(), &model_resource(kind));
    let all = deadlines.all;
    match tokio::time::timeout(all, list_pages(&api, kind, spec_bytes_max, deadlines.page)).await {
        Err(_) => ListResult::Failed(format!("LIST {} timed out after {} ms", kind.plural(), all.as_millis())),
        Ok(Err(reason)) => ListResult::Failed(format!("LIST {}: {reason}", kind.plural())),
        Ok(Ok(objects)) => ListResult::Listed(objects.into_iter().map(Arc::new).collect()),
    }
}

async fn list_pages(
    api: &Api<LeanModel>,
    kind: Kind,
    spec_bytes_max: usize,
    page_timeout: Duration,
) -> Result<Vec<ModelObject>, String> {
    let mut objects = Vec::new();
    let mut token: Option<String> = None;
    for pages in 0..LIST_PAGES_MAX {
        let mut params = ListParams::default().limit(LIST_PAGE_ITEMS);
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = match tokio::time::timeout(page_timeout, api.list(&params)).await {
            Err(_) => return Err(format!("page {} timed out after {} ms", pages + 1, page_timeout.as_millis())),
            Ok(answer) => answer.map_err(|e| e.to_string())?,
        };
        for item in page.items {
            let name = item.metadata.name.clone().unwrap_or_else(|| "<no name>".into());
            objects.push(
                to_model(kind, item, spec_bytes_max).ok_or_else(|| format!("item {name:?} cannot be identified"))?,
            );
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            None => return Ok(objects),
            Some(t) => token = Some(t),
        }
    }
    Err(format!("more than {LIST_PAGES_MAX} pages"))
}

/// Quorum GET of this agent's Node: the second witness of a placement exit.
pub async fn live_get_node(client: &Client, node: &str) -> NodeReadResult {
    let api: Api<Node> = Api::all(client.clone());
    match tokio::time::timeout(LIVE_READ_TIMEOUT, api.get(node)).await {
        Err(_) => NodeReadResult::Failed(format!("GET node {node} timed out after {} s", LIVE_READ_TIMEOUT.as_secs())),
        Ok(Err(e)) => NodeReadResult::Failed(format!("GET node {node}: {e}")),
        Ok(Ok(n)) => {
            let name = n.metadata.name.unwrap_or_default();
            NodeReadResult::Found(NodeView { name, labels: n.metadata.labels.unwrap_or_default() })
        }
    }
}

/// This Node's labels now (for a TensorRT-LLM model's shape), or why they cannot be read.
pub async fn live_node_labels(
    client: &Client,
    node: &str,
) -> Result<std::collections::BTreeMap<String, String>, String> {
    match live_get_node(client, node).await {
        NodeReadResult::Found(view) => Ok(view.labels.into_iter().collect()),
        NodeReadResult::Failed(reason) => Err(reason),
    }
}

/// One write for this node's label and ConfigMap, from one core effect.
#[derive(Clone, Debug)]
pub enum Write {
    Publish { id: EffectId, label_key: String, label: Option<ModelStatus>, cm_key: String, entry: String },
    Unpublish { id: EffectId, label_key: String, remove_label: bool, cm_key: String, uid: String },
    OrphanLabel { id: EffectId, label_key: String },
    OrphanEntry { id: EffectId, cm_key: String, uid: Option<String> },
}

impl Write {
    pub fn id(&self) -> EffectId {
        match self {
            Write::Publish { id, .. }
            | Write::Unpublish { id, .. }
            | Write::OrphanLabel { id, .. }
            | Write::OrphanEntry { id, .. } => *id,
        }
    }
}

/// Applies writes in batches: all label changes of a batch in one patch of this node, all entry
/// changes in one resourceVersion-checked write of this node's ConfigMap. Every effect gets its
/// outcome back on `outcomes`, which never waits on the loop (see `agent`).
///
/// One batch is in flight at a time. An idle writer sends a lone change at once (a fixed pause
/// between batches used to add up to 100 ms to a model's Ready label); the changes that queue
/// while a batch is in flight leave together in the next one, so a burst still costs about one
/// node patch and one ConfigMap write per round trip, whatever its size.
pub async fn writer<F, Fut>(
    mut rx: mpsc::UnboundedReceiver<Write>,
    outcomes: mpsc::UnboundedSender<Input>,
    metrics: Arc<Metrics>,
    mut apply: F,
) where
    F: FnMut(Vec<Write>) -> Fut,
    Fut: std::future::Future<Output = Result<(), BatchError>>,
{
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < WRITE_BATCH_MAX {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let changes = batch.len();
        debug!(changes, "writing a batch");
        let done = apply_split(&mut apply, batch, &metrics).await;
        debug!(changes, elapsed_us = started.elapsed().as_micros() as u64, "wrote a batch");
        for (id, outcome) in done {
            if outcomes.send(Input::EffectDone { id, outcome }).is_err() {
                return;
            }
        }
    }
}

/// Why a batch failed. `rejected`: the API server refused the request itself (a 4xx other
/// than a conflict, throttling or a missing object: the ConfigMap past 1 MiB, say), so the same
/// writes fail the same way however often they are sent.
#[derive(Clone, Debug)]
pub struct BatchError {
    pub reason: String,
    pub rejected: bool,
}

impl From<String> for BatchError {
    fn from(reason: String) -> BatchError {
        BatchError { reason, rejected: false }
    }
}

fn rejects(s: &kube::core::Status) -> bool {
    (400..500).contains(&s.code) && !matches!(s.code, 404 | 408 | 409 | 429)
}

/// A rejected batch is halved, and each half written apart (in order: a later change of a key
/// still lands last), down to `SPLIT_DEPTH_MAX` halvings: one oversized or invalid write fails
/// alone, not the other models' writes sent with it, removals included (a review: one 422 failed
/// every write of its batch, at every retry). Any other failure fails the batch whole, at once.
pub const SPLIT_DEPTH_MAX: usize = 6;

async fn apply_split<F, Fut>(apply: &mut F, batch: Vec<Write>, metrics: &Metrics) -> Vec<(EffectId, Outcome)>
where
    F: FnMut(Vec<Write>) -> Fut,
    Fut: std::future::Future<Output = Result<(), BatchError>>,
{
    let mut done = Vec::with_capacity(batch.len());
    let mut parts = std::collections::VecDeque::from([(batch, 0)]);
    while let Some((part, depth)) = parts.pop_front() {
        let ids: Vec<EffectId> = part.iter().map(Write::id).collect();
        let error = match apply(part.clone()).await {
            Ok(()) => {
                done.extend(ids.into_iter().map(|id| (id, Outcome::Done)));
                continue;
            }
            Err(e) => e,
        };
        if error.rejected && part.len() > 1 && depth < SPLIT_DEPTH_MAX {
            debug!(changes = part.len(), error = %error.reason, "a batch was rejected; writing its halves apart");
            let mut first = part;
            let second = first.split_off(first.len() / 2);
            parts.push_front((second, depth + 1));
            parts.push_front((first, depth + 1));
            continue;
        }
        metrics.inc(&metrics.write_errors);
        warn!(error = %error.reason, changes = ids.len(), "writing labels and ConfigMap failed; the core retries");
        done.extend(ids.into_iter().map(|id| (id, Outcome::Failed(error.reason.clone()))));
    }
    done
}

/// The writer's `apply` against the API server.
pub fn apply_to(client: Client, node: String, namespace: String) -> impl FnMut(Vec<Write>) -> BatchFuture {
    move |batch| {
        let (client, node, namespace) = (client.clone(), node.clone(), namespace.clone());
        Box::pin(async move { apply_batch(&client, &node, &namespace, &batch).await })
    }
}

pub type BatchFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BatchError>> + Send>>;

async fn apply_batch(client: &Client, node: &str, namespace: &str, batch: &[Write]) -> Result<(), BatchError> {
    // Labels: last change per key wins; one merge patch of our own Node (null removes).
    let mut labels: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for w in batch {
        match w {
            Write::Publish { label_key, label: Some(s), .. } => {
                labels.insert(label_key, Some(s.as_str()));
            }
            Write::Unpublish { label_key, remove_label: true, .. } | Write::OrphanLabel { label_key, .. } => {
                labels.insert(label_key, None);
            }
            _ => {}
        }
    }
    debug_assert!(labels.keys().all(|k| wire::is_model_label(k)), "only models.ome.io/ labels");
    // The label first, then the ConfigMap (OME's order), one after the other. Sent at once they
    // shared the apiserver's cores, and the Node patch, which is what a model's Ready waits on,
    // took 22 ms instead of 16 with 1,000 labels (`scripts/bench-agent`: 34 -> 27 ms median).
    // A failed patch does not stop the write: OME's controller holds a model's finalizer while an
    // entry of it is left in any node's ConfigMap, that of a Node since deleted included. The
    // batch is retried whole if either fails; both are idempotent.
    let labelled = if labels.is_empty() { Ok(()) } else { patch_labels(client, node, &labels).await };
    let written = if batch.iter().any(|w| !matches!(w, Write::OrphanLabel { .. })) {
        write_configmap(client, node, namespace, batch).await
    } else {
        Ok(())
    };
    // Rejected only when what failed was rejected: a timeout is no reason to split.
    match (labelled, written) {
        (Ok(()), Ok(())) => Ok(()),
        (Err(e), Ok(())) | (Ok(()), Err(e)) => Err(e),
        (Err(a), Err(b)) => {
            Err(BatchError { reason: format!("{}; {}", a.reason, b.reason), rejected: a.rejected && b.rejected })
        }
    }
}

/// One merge patch of this node's labels (a `None` value removes the label).
async fn patch_labels(client: &Client, node: &str, labels: &BTreeMap<&str, Option<&str>>) -> Result<(), BatchError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({"metadata": {"labels": labels}});
    let started = std::time::Instant::now();
    match within(
        WRITE_REQUEST_TIMEOUT,
        || format!("patching node {node} labels"),
        nodes.patch(node, &patch_params(), &Patch::Merge(&patch)),
    )
    .await?
    {
        Ok(_) => {
            debug!(labels = labels.len(), elapsed_us = started.elapsed().as_micros() as u64, "patched node labels");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.is_not_found() => Err(format!("node {node} not found").into()),
        Err(kube::Error::Api(s)) if rejects(&s) => {
            Err(BatchError { reason: format!("patching node {node} labels: {s}"), rejected: true })
        }
        Err(e) => Err(format!("patching node {node} labels: {e}").into()),
    }
}

/// The ConfigMap side of a batch, in order, under the one entry-ownership rule (`core::wire`).
fn entry_writes(batch: &[Write]) -> Vec<wire::EntryWrite<String>> {
    batch
        .iter()
        .filter_map(|w| match w {
            Write::Publish { cm_key, entry, .. } => {
                Some(wire::EntryWrite::Put { cm_key: cm_key.clone(), value: entry.clone() })
            }
            Write::Unpublish { cm_key, uid, .. } => {
                Some(wire::EntryWrite::Withdraw { cm_key: cm_key.clone(), uid: uid.clone() })
            }
            Write::OrphanEntry { cm_key, uid, .. } => {
                Some(wire::EntryWrite::RemoveOrphan { cm_key: cm_key.clone(), seen_uid: uid.clone() })
            }
            Write::OrphanLabel { .. } => None,
        })
        .collect()
}

/// Read-modify-write of this node's ConfigMap with its resourceVersion: a conflict re-reads and
/// re-applies only this batch's changes (never a merge of a stale snapshot).
async fn write_configmap(client: &Client, node: &str, namespace: &str, batch: &[Write]) -> Result<(), BatchError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let identity = wire::configmap_identity(node);
    for _attempt in 0..CONFIGMAP_ATTEMPTS_MAX {
        let what = || format!("GET configmap {namespace}/{node}");
        let current = within(WRITE_REQUEST_TIMEOUT, what, api.get_opt(&identity.name))
            .await?
            .map_err(|e| format!("{}: {e}", what()))?;
        let exists = current.is_some();
        let mut cm = current.unwrap_or_default();
        let data = cm.data.get_or_insert_with(Default::default);
        let (mut changed, _) = wire::apply_entry_writes(data, &entry_writes(batch));
        // OME's identity labels and annotations, restored if someone removed them (upstream's
        // self-heal recreated the ConfigMap without them and the controller lost the node).
        let md = &mut cm.metadata;
        for (k, v) in &identity.labels {
            if md.labels.get_or_insert_with(Default::default).get(k) != Some(v) {
                md.labels.as_mut().expect("set").insert(k.clone(), v.clone());
                changed = true;
            }
        }
        for (k, v) in &identity.annotations {
            if md.annotations.get_or_insert_with(Default::default).get(k) != Some(v) {
                md.annotations.as_mut().expect("set").insert(k.clone(), v.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        let what = || format!("writing configmap {namespace}/{node}");
        let result = if exists {
            within(WRITE_REQUEST_TIMEOUT, what, api.replace(&identity.name, &post_params(), &cm)).await?
        } else {
            md.name = Some(identity.name.clone());
            md.namespace = Some(namespace.to_string());
            within(WRITE_REQUEST_TIMEOUT, what, api.create(&post_params(), &cm)).await?
        };
        match result {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 409 => {
                debug!("configmap conflict; re-reading");
                continue;
            }
            Err(kube::Error::Api(s)) if rejects(&s) => {
                return Err(BatchError {
                    reason: format!("writing configmap {namespace}/{node}: {s}"),
                    rejected: true,
                });
            }
            Err(e) => return Err(format!("writing configmap {namespace}/{node}: {e}").into()),
        }
    }
    Err(format!("configmap {namespace}/{node}: still conflicting after {CONFIGMAP_ATTEMPTS_MAX} attempts").into())
}

/// What is on the node and in its ConfigMap now (API part of a drift snapshot).
pub async fn snapshot_api(client: &Client, node: &str, namespace: &str) -> Result<DriftSnapshot, String> {
    // Each read bounded like a live read: a drift pass answers within the period's floor
    // (`cli::DRIFT_PERIOD_MS_MIN`), so the next pass never replaces it unanswered.
    let nodes: Api<Node> = Api::all(client.clone());
    let n = within(LIVE_READ_TIMEOUT, || format!("GET node {node}"), nodes.get(node))
        .await?
        .map_err(|e| format!("GET node {node}: {e}"))?;
    let labels = n
        .metadata
        .labels
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| wire::is_model_label(k))
        .map(|(k, v)| (Arc::from(k), Arc::from(v)))
        .collect();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = within(LIVE_READ_TIMEOUT, || format!("GET configmap {namespace}/{node}"), cms.get_opt(node))
        .await?
        .map_err(|e| format!("GET configmap {namespace}/{node}: {e}"))?;
    let entries = cm
        .and_then(|c| c.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let view = EntryView::of(&v);
            (Arc::from(k), view)
        })
        .collect();
    Ok(DriftSnapshot { labels, entries, owned_dirs: vec![], trash: vec![], unread: vec![] })
}

pub fn log_startup(node: &str, namespace: &str) {
    info!(node, namespace, "watching BaseModels (all namespaces), ClusterBaseModels and this node");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review: an API server (or a half-open connection) that accepts and never answers held
    /// the writer's one batch in flight for good, so no label or entry was written again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_silent_api_server_fails_the_writer_s_batch_within_its_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket); // accepted, never answered
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let entry = model_agent_core::wire::ModelEntry::new("m", ModelStatus::Ready).to_json();
        let batch = vec![Write::Publish {
            id: EffectId(1),
            label_key: "models.ome.io/clusterbasemodel.m".into(),
            label: Some(ModelStatus::Ready),
            cm_key: "clusterbasemodel.m".into(),
            entry,
        }];
        let started = std::time::Instant::now();
        let answered =
            tokio::time::timeout(Duration::from_secs(45), apply_batch(&client, "node-1", "ome", &batch)).await;
        let e = answered.expect("the batch had no answer after 45 s").unwrap_err();
        assert!(e.reason.contains("timed out after 10 s") && !e.rejected, "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(25), "the patch and the read each within 10 s");
    }

    fn publish(n: u64) -> Write {
        let entry = model_agent_core::wire::ModelEntry::new(&format!("m{n}"), ModelStatus::Ready).to_json();
        Write::Publish {
            id: EffectId(n),
            label_key: format!("models.ome.io/clusterbasemodel.m{n}"),
            label: Some(ModelStatus::Ready),
            cm_key: format!("clusterbasemodel.m{n}"),
            entry,
        }
    }

    /// Runs the writer over `writes` (one batch), each request answered by `answer`; each id's
    /// outcome, and how many requests it made.
    async fn write_all(
        writes: Vec<Write>,
        answer: fn(&[Write]) -> Result<(), BatchError>,
    ) -> (BTreeMap<u64, Outcome>, usize) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (out_tx, mut out_rx) = mpsc::unbounded_channel();
        let count = writes.len();
        for w in writes {
            tx.send(w).unwrap();
        }
        drop(tx);
        let requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        let apply = move |batch: Vec<Write>| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::future::ready(answer(&batch))
        };
        writer(rx, out_tx, Arc::new(Metrics::default()), apply).await;
        let mut outcomes = BTreeMap::new();
        while let Ok(Input::EffectDone { id, outcome }) = out_rx.try_recv() {
            outcomes.insert(id.0, outcome);
        }
        assert_eq!(outcomes.len(), count, "one outcome per write");
        (outcomes, requests.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// A review: one write the API server rejects (a ConfigMap past 1 MiB: 422) failed every
    /// other model's write in its batch, withdrawals included, at every retry. A rejected batch
    /// is halved until the rejected write fails alone.
    #[tokio::test(flavor = "current_thread")]
    async fn a_rejected_write_fails_alone_and_the_rest_of_its_batch_lands() {
        let answer = |batch: &[Write]| match batch.iter().any(|w| w.id() == EffectId(5)) {
            true => Err(BatchError { reason: "422 the ConfigMap is too long".into(), rejected: true }),
            false => Ok(()),
        };
        let (outcomes, requests) = write_all((0..16).map(publish).collect(), answer).await;
        for (id, outcome) in &outcomes {
            assert_eq!(matches!(outcome, Outcome::Failed(_)), *id == 5, "{id}: {outcome:?}");
        }
        assert!(requests <= 1 + 2 * 4, "halving 16 writes to the one rejected takes {requests} requests");
    }

    /// Any other failure (a timeout, a server error) fails the batch whole at once: the API
    /// server being down is no reason to send each write on its own.
    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_that_failed_otherwise_is_not_split() {
        let answer = |_: &[Write]| Err(BatchError::from("GET configmap timed out after 10 s".to_string()));
        let (outcomes, requests) = write_all((0..16).map(publish).collect(), answer).await;
        assert!(outcomes.values().all(|o| matches!(o, Outcome::Failed(_))));
        assert_eq!(requests, 1);
    }

    /// Every write rejected: the halving stops at `SPLIT_DEPTH_MAX`, so a batch costs a bounded
    /// number of requests (2^7 - 1 at most), not two per write.
    #[tokio::test(flavor = "current_thread")]
    async fn halving_a_batch_whose_every_write_is_rejected_is_bounded() {
        let answer = |_: &[Write]| Err(BatchError { reason: "422".into(), rejected: true });
        let (outcomes, requests) = write_all((0..2_000).map(publish).collect(), answer).await;
        assert!(outcomes.values().all(|o| matches!(o, Outcome::Failed(_))));
        assert_eq!(requests, (1 << (SPLIT_DEPTH_MAX + 1)) - 1);
    }

    /// The API server's answer to a ConfigMap past 1 MiB (a 422 Status, as kube-apiserver
    /// sends it) is a rejection; its 500 is not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_422_from_the_api_server_rejects_the_batch_and_a_500_does_not() {
        for (status, rejected) in [("422 Unprocessable Entity", true), ("500 Internal Server Error", false)] {
            let (port, _) = crate::canned_http::serve(Some("application/json"), move |head| {
                let code: u16 = status[..3].parse().unwrap();
                let failure = format!(
                    r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"ConfigMap \"node-1\" is invalid: []: Too long: must have at most 1048576 bytes","reason":"Invalid","code":{code}}}"#
                );
                // The server reads no request body: a PATCH's is read as the start of the next head.
                if head.contains("PATCH /") {
                    ("200 OK", r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"node-1"}}"#.into())
                } else if head.contains("GET /") {
                    let cm = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"node-1","namespace":"ome","resourceVersion":"1"},"data":{}}"#;
                    ("200 OK", cm.into())
                } else {
                    (status, failure)
                }
            })
            .await;
            let client =
                Client::try_from(kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap())).unwrap();
            let e = apply_batch(&client, "node-1", "ome", &[publish(1)]).await.unwrap_err();
            assert_eq!(e.rejected, rejected, "{status}: {e:?}");
        }
    }

    /// A watcher's LIST on a connection that accepted and never answers fails within the
    /// watchers' read timeout (here 1 s), and the watcher lists again: before, it waited for good.
    #[tokio::test(flavor = "current_thread")]
    async fn a_watcher_s_list_on_a_silent_connection_fails_within_the_read_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                held.push(socket); // accepted, never answered
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        // The watcher's first item is `Init`, before its LIST; the next is what the LIST gave.
        let after_init = |client: Client, wait: Duration| async move {
            let api: Api<LeanModel> = Api::all_with(client, &model_resource(Kind::ClusterBaseModel));
            let stream = watcher(api, watcher::Config::default().page_size(WATCH_PAGE_ITEMS));
            futures::pin_mut!(stream);
            assert!(matches!(stream.next().await, Some(Ok(watcher::Event::Init))));
            tokio::time::timeout(wait, stream.next()).await
        };
        let plain = Client::try_from(config.clone()).unwrap();
        assert!(after_init(plain, Duration::from_secs(3)).await.is_err(), "without a read timeout it waits");
        let answered = after_init(watch_client(config, Duration::from_secs(1)).unwrap(), Duration::from_secs(20)).await;
        let item = answered.expect("the watcher's LIST had no answer after 20 s").expect("an item");
        assert!(item.is_err(), "a silent LIST is an error: {item:?}");
        assert!(accepted.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    }

    /// A ClusterBaseModel LIST served in `pages` pages of one object, each answered after
    /// `delay_ms(page)`: the request's `continue` token names the page asked for.
    /// Served from a runtime of its own, so that a slow page blocks none of the client's threads.
    async fn paged_list_server(pages: usize, delay_ms: fn(usize) -> u64) -> Client {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
            runtime.block_on(async move {
                let (port, _) = crate::canned_http::serve(Some("application/json"), move |head| {
                    let page = head.split_once("continue=").map_or(1, |(_, rest)| {
                        rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or(1)
                    });
                    std::thread::sleep(Duration::from_millis(delay_ms(page)));
                    let next = if page < pages { format!(r#","continue":"{}""#, page + 1) } else { String::new() };
                    let item = format!(r#"{{"metadata":{{"name":"m{page}","uid":"u{page}","resourceVersion":"{page}"}},"spec":{{"storage":{{"storageUri":"hf://o/r"}}}}}}"#);
                    let body = format!(
                        r#"{{"apiVersion":"ome.io/v1beta1","kind":"ClusterBaseModelList","metadata":{{"resourceVersion":"9"{next}}},"items":[{item}]}}"#
                    );
                    ("200 OK", body)
                })
                .await;
                tx.send(port).unwrap();
                std::future::pending::<()>().await;
            });
        });
        let port = rx.recv().unwrap();
        Client::try_from(kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap())).unwrap()
    }

    /// A LIST of thousands of objects took longer than one GET's deadline on a loaded API
    /// server, so every LIST failed and its candidates waited for good: the whole LIST now has
    /// the core's deadline, which grows with the models it keeps.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_list_longer_than_one_page_s_deadline_ends_within_its_own() {
        let client = paged_list_server(6, |_| 300).await;
        let page = Duration::from_millis(1_500);
        let longer = ListDeadlines { all: Duration::from_secs(20), page };
        match live_list(&client, Kind::ClusterBaseModel, 1 << 20, longer).await {
            ListResult::Listed(objects) => assert_eq!(objects.len(), 6),
            ListResult::Failed(reason) => panic!("{reason}"),
        }
        let one_read_s = ListDeadlines { all: page, page };
        match live_list(&client, Kind::ClusterBaseModel, 1 << 20, one_read_s).await {
            ListResult::Failed(reason) => assert!(reason.contains("timed out after 1500 ms"), "{reason}"),
            ListResult::Listed(_) => panic!("six pages of 300 ms fit in 1.5 s"),
        }
    }

    /// A page that never comes fails the LIST within a GET's deadline, however long the whole
    /// LIST may take: a silent API server is found as soon as a lone read would find it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_page_fails_the_live_list_within_one_page_s_deadline() {
        let client = paged_list_server(3, |page| if page == 2 { 60_000 } else { 0 }).await;
        let started = std::time::Instant::now();
        let deadlines = ListDeadlines { all: Duration::from_secs(20), page: Duration::from_millis(300) };
        match live_list(&client, Kind::ClusterBaseModel, 1 << 20, deadlines).await {
            ListResult::Failed(reason) => assert!(reason.contains("page 2 timed out after 300 ms"), "{reason}"),
            ListResult::Listed(_) => panic!("page 2 never came in time"),
        }
        // Far below the 20 s the whole LIST may take: the page's own deadline ended it.
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    }

    #[test]
    fn a_list_without_the_core_s_deadline_takes_a_get_s() {
        let old = ListDeadlines::of(None);
        assert_eq!((old.all, old.page), (LIVE_READ_TIMEOUT, LIVE_READ_TIMEOUT));
        let long = ListDeadlines::of(Some(25_000));
        assert_eq!((long.all, long.page), (Duration::from_secs(25), LIVE_READ_TIMEOUT));
        let short = ListDeadlines::of(Some(2_000));
        assert_eq!((short.all, short.page), (Duration::from_secs(2), Duration::from_secs(2)));
    }
}
