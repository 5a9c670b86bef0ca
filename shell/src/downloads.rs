//! Executes `Op::Download` and `Op::CancelDownload`. A download runs on a runtime of its own
//! (multi-threaded: its file writes and hashing block a thread, and the loop's runtime must never
//! wait on the disk); the loop's task only waits for it. It reports progress to the core as it
//! goes and its end as `Outcome::Downloaded`. Cancelled downloads keep their partial files.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use model_agent_core::dest_path::DestPath;
use model_agent_core::machine::{DownloadEnd, DownloadResult, EffectId, Input, Outcome};
use model_agent_core::storage_uri::StorageUri;
use model_agent_core::wire::{DownloadProgress, ModelConfig};
use model_agent_core::{ModelKey, Uid};

use crate::agent::Ctx;
use crate::download::{self, DownloadError, Ended, Job, Options, Progress};
use crate::store::Store;

/// The download runtime's handle, the engine's options and the cancel switch of every download
/// not yet ended.
#[derive(Clone)]
pub struct Downloads {
    runtime: tokio::runtime::Handle,
    options: Arc<Options>,
    /// Object stores' HTTP (the same roots, CA bundle, proxies and timeouts as the Hub's).
    /// Built at the first object-store download: a node serving only `hf://` or `local://` never
    /// loads its TLS roots a second time.
    store_net: Arc<std::sync::OnceLock<Result<crate::store::Net, String>>>,
    /// `INSTANCE_TYPE_MAP` or the built-in map, for TensorRT-LLM models' shape.
    instance_types: Arc<crate::shapes::InstanceTypes>,
    cancels: Arc<Mutex<HashMap<EffectId, watch::Sender<bool>>>>,
}

impl Downloads {
    pub fn new(
        runtime: tokio::runtime::Handle,
        options: Options,
        instance_types: crate::shapes::InstanceTypes,
    ) -> Downloads {
        let store_net = Arc::default();
        let instance_types = Arc::new(instance_types);
        Downloads { runtime, options: Arc::new(options), store_net, instance_types, cancels: Default::default() }
    }

    /// Stop one download (the core asked); its outcome follows as usual.
    pub fn cancel(&self, id: EffectId) {
        if let Some(switch) = self.cancels.lock().expect("cancels lock").get(&id) {
            let _ = switch.send(true);
        }
    }

    /// Shutdown: stop every download now (partial files are kept, the next start resumes).
    pub fn cancel_all(&self) {
        for switch in self.cancels.lock().expect("cancels lock").values() {
            let _ = switch.send(true);
        }
    }

    /// The cancel switch of download `id`, made when the effect is dispatched so that a cancel
    /// that comes before the download's task runs is not lost.
    pub fn register(&self, id: EffectId) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        self.cancels.lock().expect("cancels lock").insert(id, tx);
        rx
    }

    fn store_net(&self) -> &Result<crate::store::Net, String> {
        let o = &self.options;
        self.store_net.get_or_init(|| crate::store::Net::new(&o.network, o.connect_timeout_ms, o.stall_timeout_ms))
    }

    fn forget(&self, id: EffectId) {
        self.cancels.lock().expect("cancels lock").remove(&id);
    }
}

/// What one download needs from the effect.
pub struct Request {
    pub id: EffectId,
    pub key: ModelKey,
    pub uid: Uid,
    pub storage_uri: String,
    pub dest: DestPath,
    /// Read the downloaded config files for the Ready entry's metadata.
    pub parse_metadata: bool,
    pub owners: Owners,
}

/// Who else the directory's marker may name, as the core sees it (`Op::Download`).
pub struct Owners {
    /// Other uids sharing `dest`: a marker naming any of them is accepted, and then names all.
    pub co_owners: Vec<Uid>,
    /// Keep the uids an accepted marker names besides these (`Op::Download::keep_marked`).
    pub keep_marked: bool,
    /// Live models of another source using `dest` (`Op::Download::other_source`).
    pub other_source: Vec<Uid>,
    /// The model carries the reserve label (`Op::Download::reserve`).
    pub reserve: bool,
}

/// Runs in the loop's task for the effect (counted in flight).
pub async fn execute(c: Ctx, request: Request, mut cancel: watch::Receiver<bool>) -> Option<Input> {
    let id = request.id;
    let permit = tokio::select! {
        permit = c.fetches.acquire() => permit.ok(),
        _ = cancel.wait_for(|cancelled| *cancelled) => None,
    };
    let end = match permit {
        None => DownloadEnd { marked: false, result: DownloadResult::Cancelled },
        Some(_permit) => {
            let started = std::time::Instant::now();
            let end = run(&c, &request, cancel).await;
            let from_store = !request.storage_uri.starts_with("hf://");
            c.metrics.download_ended(&request.key, &end, started.elapsed(), from_store);
            log_end(&request, &end);
            let metadata = match end.result.is_ok() && request.parse_metadata {
                true => crate::agent::model_metadata(&c, &request.key, request.dest.absolute()).await,
                false => None,
            };
            core_end(end, metadata)
        }
    };
    c.downloads.forget(id);
    Some(Input::EffectDone { id, outcome: Outcome::Downloaded(end) })
}

async fn run(c: &Ctx, request: &Request, cancel: watch::Receiver<bool>) -> Ended {
    let failed = |reason: String| Ended { marked: false, result: Err(DownloadError::NotStarted(reason)) };
    let Some(dest_rel) = request.dest.beneath_root().map(str::to_string) else {
        return failed(format!("{} is not beneath the models root", request.dest.absolute()));
    };
    let (repo_id, revision, token, store) = match source_of(c, request).await {
        Ok(source) => source,
        Err(reason) => return failed(reason),
    };
    let job = Job {
        store,
        root: c.root.clone(),
        dest_rel,
        uid: request.uid.as_str().to_string(),
        key: request.key.to_string(),
        co_owners: request.owners.co_owners.iter().map(|u| u.as_str().to_string()).collect(),
        keep_marked: request.owners.keep_marked,
        other_source: request.owners.other_source.iter().map(|u| u.as_str().to_string()).collect(),
        reserve: request.owners.reserve,
        repo_id,
        revision,
        token,
    };
    let (options, outcomes, id) = (c.downloads.options.clone(), c.outcomes.clone(), request.id);
    let meter = c.metrics.download_meter();
    let work = c.downloads.runtime.spawn(download_reporting(job, options, (outcomes, id, meter), cancel));
    work.await.unwrap_or_else(|e| failed(format!("the download task ended abnormally: {e}")))
}

/// The repository (or store), revision, Hub token and store of a download, read at each attempt.
async fn source_of(c: &Ctx, request: &Request) -> Result<(String, String, Option<String>, Option<Arc<Store>>), String> {
    let (key, uid) = (&request.key, request.uid.as_str());
    match StorageUri::parse(&request.storage_uri).map_err(|e| e.to_string())? {
        StorageUri::HuggingFace { org, repo, revision } => {
            let token = crate::credentials::hf_token(&c.client, key, uid, &c.namespace).await?;
            Ok((format!("{org}/{repo}"), revision, token, None))
        }
        uri @ (StorageUri::S3 { .. } | StorageUri::Gcs { .. } | StorageUri::Azure { .. } | StorageUri::Oci { .. }) => {
            let auth = crate::credentials::store_auth(&c.client, key, uid, &c.namespace).await?;
            let net = c.downloads.store_net().as_ref().map_err(Clone::clone)?;
            let mut store = crate::store::open(&uri, &auth, net)?;
            if crate::shapes::applies(auth.model_format.as_deref(), auth.metadata_type.as_deref()) {
                let labels = crate::kubeio::live_node_labels(&c.client, &c.node).await?;
                store.shape_filter = Some(c.downloads.instance_types.alias(&labels));
            }
            Ok((store.label.clone(), String::new(), None, Some(Arc::new(store))))
        }
        _ => Err(format!("downloading {} is not supported by this build of model-agent", request.storage_uri)),
    }
}

/// `Op::Resolve`: the commit an `hf://` revision points at now (`Outcome::Resolved`). When the Hub
/// cannot answer (network, stall, 5xx, 429), the copy that the model's symlink already points at
/// stands in if it is complete (the stored-manifest rule of `download`), so that a Ready shared
/// model does not go Failed because the Hub is down.
pub async fn resolve(c: &Ctx, id: EffectId, key: &ModelKey, uid: &Uid, storage_uri: &str, link: &str) -> Input {
    let failed = |reason: String, retry_after_ms: Option<u64>| {
        let result = DownloadResult::Failed { reason, retry_after_ms };
        Input::EffectDone { id, outcome: Outcome::Downloaded(DownloadEnd { marked: false, result }) }
    };
    let (repo_id, revision) = match StorageUri::parse(storage_uri) {
        Ok(StorageUri::HuggingFace { org, repo, revision }) => (format!("{org}/{repo}"), revision),
        Ok(_) => return failed(format!("{storage_uri} has no revision to resolve"), None),
        Err(e) => return failed(e.to_string(), None),
    };
    let token = match crate::credentials::hf_token(&c.client, key, uid.as_str(), &c.namespace).await {
        Ok(token) => token,
        Err(reason) => return failed(reason, None),
    };
    let (options, repo) = (c.downloads.options.clone(), repo_id.clone());
    let work = c.downloads.runtime.spawn(async move { download::resolve(&options, token, &repo, &revision).await });
    let answer = work
        .await
        .unwrap_or_else(|e| Err(DownloadError::NotStarted(format!("the resolve task ended abnormally: {e}"))));
    match answer {
        Ok(commit) => Input::EffectDone { id, outcome: Outcome::Resolved { commit } },
        Err(error) if error.unreachable() => {
            let (root, link) = (c.root.clone(), link.to_string());
            let kept = c.fs.call("reading the model's link", crate::fsgate::VERIFY_DEADLINE, move || {
                download::complete_copy_of_link(&root, &link, &repo_id)
            });
            match kept.await {
                Ok(Some(commit)) => {
                    model_log!(info, key, uid, commit = %commit, reason = %error, "the Hub cannot answer; the linked shared copy is complete and stands in");
                    Input::EffectDone { id, outcome: Outcome::Resolved { commit } }
                }
                _ => failed(error.reason(), error.retry_after_ms()),
            }
        }
        Err(error) => failed(error.reason(), error.retry_after_ms()),
    }
}

/// The engine, with its progress reports sent to the core as `Input::DownloadProgress` and
/// counted by the download's meter.
async fn download_reporting(
    job: Job,
    options: Arc<Options>,
    (outcomes, id, mut meter): (tokio::sync::mpsc::UnboundedSender<Input>, EffectId, crate::metrics::DownloadMeter),
    cancel: watch::Receiver<bool>,
) -> Ended {
    let mut report: Box<dyn FnMut(Progress) + Send> = Box::new(move |p: Progress| {
        meter.report(&p);
        let _ = outcomes.send(Input::DownloadProgress { id, progress: wire_progress(&p) });
    });
    download::download(job, &options, &mut *report, cancel).await
}

/// OME's progress schema; the time is the shell's (the core never reads a clock).
fn wire_progress(p: &Progress) -> DownloadProgress {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    DownloadProgress {
        phase: "downloading".into(),
        total_bytes: clamp(p.total_bytes),
        completed_bytes: clamp(p.completed_bytes),
        total_files: clamp(p.total_files),
        completed_files: clamp(p.completed_files),
        speed_bytes_per_sec: p.bytes_per_sec.round(),
        last_updated: k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .map_or_else(|_| String::new(), |t| t.to_string()),
    }
}

fn core_end(end: Ended, metadata: Option<Box<ModelConfig>>) -> DownloadEnd {
    let result = match end.result {
        Ok(finished) => DownloadResult::Done { commit: finished.commit, metadata, bytes: finished.bytes_total },
        Err(DownloadError::Cancelled) => DownloadResult::Cancelled,
        Err(error) => DownloadResult::Failed { reason: error.reason(), retry_after_ms: error.retry_after_ms() },
    };
    DownloadEnd { marked: end.marked, result }
}

fn log_end(request: &Request, end: &Ended) {
    let (key, uid, dest) = (&request.key, &request.uid, &request.dest.absolute());
    match &end.result {
        Ok(f) => {
            model_log!(info, key, uid, dest = %dest, commit = %f.commit, files = f.files, bytes_fetched = f.bytes_fetched, adopted_files = f.adopted_files, "download complete")
        }
        Err(DownloadError::Cancelled) => {
            model_log!(info, key, uid, dest = %dest, "download cancelled; partial files kept")
        }
        Err(e) => model_log!(warn, key, uid, dest = %dest, reason = %e, "download failed"),
    }
}
