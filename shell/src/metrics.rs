//! The agent's metrics, kept in `prometheus-client`'s registry and served by `/metrics` as
//! Prometheus text 0.0.4 (what OME's Go client serves a plain Prometheus): OME's names, labels
//! and buckets (spec §3.8), and this agent's own (phantom deletes suppressed, pending
//! confirmations, live reads by result, breaker trips and holds, label collisions, download
//! speed, shared copies).
//!
//! Cardinality: the per-model families are labelled by a model's kind, namespace and name, which
//! come from user objects; a model has at most one series in each (two results of verification),
//! and its series go once the agent no longer keeps the model (`retain_models`), so they follow
//! the number of models kept. `copy` (shared copies) has one value per copy in use, at most one
//! per model. Every other label has a fixed set of values.
//!
//! Cost per update: counters and gauges are atomics; a per-model update looks its series up
//! under a read lock with a key of two `Arc` clones, and allocates only for a model's first series.

mod core_gauges;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use model_agent_core::ModelKey;
use model_agent_core::machine::Note;
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

pub use core_gauges::CoreGauges;
/// `text/plain; version=0.0.4; charset=utf-8`, as Go's `expfmt.FmtText`.
pub use prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// OME's per-model labels: `model_type` (the kind), `namespace` (`""` for a ClusterBaseModel)
/// and `name`, in this order.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct ModelLabels(ModelKey);

impl EncodeLabelSet for ModelLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        let key = &self.0;
        [("model_type", key.kind.as_str()), ("namespace", &*key.namespace), ("name", &*key.name)].encode(encoder)
    }
}

/// OME's verification labels: the model's, then `result` (`success` or `failure`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct VerificationLabels {
    model: ModelLabels,
    result: &'static str,
}

impl EncodeLabelSet for VerificationLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        self.model.encode(encoder)?;
        [("result", self.result)].encode(encoder)
    }
}

const VERIFICATION_RESULTS: [&str; 2] = ["success", "failure"];

/// A metric of any type, so that one table registers a struct's metrics.
#[derive(Debug)]
struct Boxed(Box<dyn Metric>);

impl EncodeMetric for Boxed {
    fn encode(&self, encoder: MetricEncoder) -> fmt::Result {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A handle on `metric` (metrics are shared handles: the clone counts into the same values).
fn boxed(metric: &(impl Metric + Clone)) -> Boxed {
    Boxed(Box::new(metric.clone()))
}

/// Registers each (name without `_total`, help without its full stop, metric).
fn register_all<const N: usize>(registry: &mut Registry, table: [(&str, &str, Boxed); N]) {
    for (name, help, metric) in table {
        registry.register(name, help, metric);
    }
}

/// OME's duration buckets: 0.1·2^k s, k = 0..9 (0.1 to 51.2 s).
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 10))
}

/// OME's rate-limit wait buckets: 1·2^k s, k = 0..9 (1 to 512 s).
fn rate_limit_wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// OME's series (spec §3.8). Counters are registered without `_total`: the encoder appends it,
/// so they scrape out as OME's names.
struct Ome {
    downloads_success: Family<ModelLabels, Counter>,
    downloads_failed: Family<ModelLabels, Counter>,
    verifications: Family<VerificationLabels, Counter>,
    md5_checksum_failed: Family<ModelLabels, Counter>,
    rate_limit: Family<ModelLabels, Counter>,
    download_duration: Family<ModelLabels, Histogram>,
    verification_duration: Histogram,
    download_bytes: Family<ModelLabels, Counter>,
    rate_limit_wait: Family<ModelLabels, Histogram>,
}

impl Ome {
    fn new() -> Ome {
        Ome {
            downloads_success: Family::default(),
            downloads_failed: Family::default(),
            verifications: Family::default(),
            md5_checksum_failed: Family::default(),
            rate_limit: Family::default(),
            download_duration: Family::new_with_constructor(duration_histogram),
            verification_duration: duration_histogram(),
            download_bytes: Family::default(),
            rate_limit_wait: Family::new_with_constructor(rate_limit_wait_histogram),
        }
    }

    fn register(&self, r: &mut Registry) {
        let s = self;
        register_all(
            r,
            [
                ("model_agent_downloads_success", "Models made available on this node", boxed(&s.downloads_success)),
                (
                    "model_agent_downloads_failed",
                    "Models that failed to become available on this node",
                    boxed(&s.downloads_failed),
                ),
                (
                    "model_agent_verifications",
                    "Object store downloads verified (sizes and MD5s), by result",
                    boxed(&s.verifications),
                ),
                (
                    "model_agent_md5_checksum_failed",
                    "Object store files whose MD5 did not match",
                    boxed(&s.md5_checksum_failed),
                ),
                ("model_agent_rate_limit", "Downloads the Hub rate-limited (HTTP 429)", boxed(&s.rate_limit)),
                (
                    "model_agent_download_duration_seconds",
                    "Time taken by successful downloads",
                    boxed(&s.download_duration),
                ),
                (
                    "model_agent_verification_duration_seconds",
                    "Time taken by object store downloads and their verification",
                    boxed(&s.verification_duration),
                ),
                (
                    "model_agent_download_bytes",
                    "Bytes of the models downloaded onto this node (their listed sizes)",
                    boxed(&s.download_bytes),
                ),
                (
                    "model_agent_rate_limit_wait_seconds",
                    "The wait a Hub 429 asked for (its Retry-After; 0 when it gave none and the agent's backoff applies)",
                    boxed(&s.rate_limit_wait),
                ),
            ],
        );
    }

    /// Drop every series of `key`.
    fn remove(&self, key: &ModelKey) {
        let model = ModelLabels(key.clone());
        for family in [&self.downloads_success, &self.downloads_failed, &self.md5_checksum_failed, &self.rate_limit] {
            family.remove(&model);
        }
        self.download_bytes.remove(&model);
        self.download_duration.remove(&model);
        self.rate_limit_wait.remove(&model);
        for result in VERIFICATION_RESULTS {
            self.verifications.remove(&VerificationLabels { model: model.clone(), result });
        }
    }
}

/// This agent's own series, beside the core's (`core_gauges`).
struct Own {
    breaker_trips: Family<[(&'static str, &'static str); 1], Counter>,
    breaker_holds: Counter,
    label_collisions: Counter,
    fetched_bytes: Counter,
    download_speed: Gauge,
    downloads_in_progress: Gauge,
}

/// What trips the breaker: many candidates at once, or most of the Node's labels vanishing.
const BREAKER_CAUSES: [&str; 2] = ["candidates", "node_labels_vanished"];

impl Own {
    fn new(r: &mut Registry) -> Own {
        let own = Own {
            breaker_trips: Family::default(),
            breaker_holds: Counter::default(),
            label_collisions: Counter::default(),
            fetched_bytes: Counter::default(),
            download_speed: Gauge::default(),
            downloads_in_progress: Gauge::default(),
        };
        // Both causes from the start, at 0, so that `increase()` sees the first trip.
        for cause in BREAKER_CAUSES {
            own.breaker_trips.get_or_create_owned(&[("cause", cause)]);
        }
        let o = &own;
        register_all(
            r,
            [
                (
                    "model_agent_breaker_trips",
                    "Times the blast-radius breaker started holding destructive decisions, by cause",
                    boxed(&o.breaker_trips),
                ),
                (
                    "model_agent_breaker_holds",
                    "Confirmed withdrawals or cleanups the breaker held for fresher evidence",
                    boxed(&o.breaker_holds),
                ),
                (
                    "model_agent_label_collisions",
                    "Models found sharing another model's label key or ConfigMap key (they write nothing meanwhile)",
                    boxed(&o.label_collisions),
                ),
                (
                    "model_agent_download_fetched_bytes",
                    "Body bytes received from the Hub and object stores, by every download (failed and cancelled ones too)",
                    boxed(&o.fetched_bytes),
                ),
                (
                    "model_agent_download_speed_bytes_per_second",
                    "Bytes per second the downloads in progress receive, summed (each over its last progress period)",
                    boxed(&o.download_speed),
                ),
                (
                    "model_agent_downloads_in_progress",
                    "Downloads transferring now (those waiting for a slot are not counted)",
                    boxed(&o.downloads_in_progress),
                ),
            ],
        );
        own
    }
}

pub struct Metrics {
    registry: Registry,
    pub watch_errors: Counter,
    pub write_errors: Counter,
    pub effects_executed: Counter,
    /// Filesystem calls to the models root that have not returned (stuck or running): the
    /// filesystem gate's own count.
    pub fs_calls_unreturned: Arc<AtomicUsize>,
    /// What the core loop publishes about itself after its steps, read at each scrape.
    pub core: Arc<Mutex<CoreGauges>>,
    ome: Ome,
    /// The models that have per-model series, for `retain_models` (a family cannot be listed).
    /// Its lock is held while a model's series are recorded or removed.
    models_with_series: Mutex<BTreeSet<ModelKey>>,
    own: Own,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::default();
        let ome = Ome::new();
        ome.register(&mut registry);
        let own = Own::new(&mut registry);
        let (watch_errors, write_errors, effects_executed) = Default::default();
        let shell: [(&str, &str, &Counter); 3] = [
            ("model_agent_watch_errors", "Watch errors (the watcher relists by itself)", &watch_errors),
            ("model_agent_write_errors", "Failed label or ConfigMap write batches", &write_errors),
            (
                "model_agent_effects_executed",
                "Effects (writes, reads, filesystem operations, downloads) the agent started",
                &effects_executed,
            ),
        ];
        register_all(&mut registry, shell.map(|(name, help, counter)| (name, help, boxed(counter))));
        let core = Arc::new(Mutex::new(CoreGauges::default()));
        let fs_calls_unreturned = Arc::new(AtomicUsize::new(0));
        registry.register_collector(Box::new(core_gauges::Collector {
            core: core.clone(),
            fs_calls_unreturned: fs_calls_unreturned.clone(),
        }));
        Metrics {
            registry,
            watch_errors,
            write_errors,
            effects_executed,
            fs_calls_unreturned,
            core,
            ome,
            models_with_series: Mutex::default(),
            own,
        }
    }
}

impl Metrics {
    pub fn inc(&self, c: &Counter) {
        c.inc();
    }

    /// Record `record` for `key`'s series, with the model listed for `retain_models`.
    fn per_model(&self, key: &ModelKey, record: impl FnOnce(&ModelLabels)) {
        let mut models = self.models_with_series.lock().expect("metrics lock");
        if !models.contains(key) {
            models.insert(key.clone());
        }
        record(&ModelLabels(key.clone()));
    }

    /// OME's `model_agent_downloads_{success,failed}_total` (local checks count, as upstream's do).
    pub fn model_outcome(&self, key: &ModelKey, ok: bool) {
        self.per_model(key, |model| self.outcome(model, ok));
    }

    fn outcome(&self, model: &ModelLabels, ok: bool) {
        let family = if ok { &self.ome.downloads_success } else { &self.ome.downloads_failed };
        family.get_or_create(model).inc();
    }

    /// One download ended: OME's success or failure count, its 429s and their wait, and for a
    /// success its duration and the bytes it holds (OME counts the listed sizes).
    /// `verified`: an object store's download, whose files were checked against the store's
    /// sizes and MD5s (OME's verification metrics; the duration is the whole download's, as
    /// every file is hashed while it streams).
    pub fn download_ended(&self, key: &ModelKey, end: &crate::download::Ended, took: Duration, verified: bool) {
        use crate::download::DownloadError;
        use crate::hf::HfError;
        self.per_model(key, |model| {
            match &end.result {
                Ok(finished) => {
                    self.outcome(model, true);
                    self.ome.download_bytes.get_or_create(model).inc_by(finished.bytes_total);
                    self.ome.download_duration.get_or_create(model).observe(took.as_secs_f64());
                }
                Err(DownloadError::Cancelled) => {}
                Err(_) => self.outcome(model, false),
            }
            if let Err(DownloadError::Hub(HfError::RateLimited { retry_after_ms })) = &end.result {
                self.ome.rate_limit.get_or_create(model).inc();
                let wait_seconds = retry_after_ms.unwrap_or(0) as f64 / 1000.0;
                self.ome.rate_limit_wait.get_or_create(model).observe(wait_seconds);
            }
            if verified {
                self.store_verified(model, end, took);
            }
        });
    }

    fn store_verified(&self, model: &ModelLabels, end: &crate::download::Ended, took: Duration) {
        use crate::download::DownloadError;
        use crate::store::StoreError;
        let (result, md5_failures) = match &end.result {
            Ok(finished) => ("success", finished.integrity_failures),
            Err(DownloadError::Store(StoreError::Integrity { .. })) => ("failure", 1),
            Err(_) => return,
        };
        self.ome.verifications.get_or_create(&VerificationLabels { model: model.clone(), result }).inc();
        if md5_failures > 0 {
            self.ome.md5_checksum_failed.get_or_create(model).inc_by(md5_failures);
        }
        self.ome.verification_duration.observe(took.as_secs_f64());
    }

    /// Drop the per-model series of models the agent no longer keeps (deleted, or never
    /// coming back), so that `/metrics` neither grows without bound nor names gone models.
    pub fn retain_models(&self, keep: impl Fn(&ModelKey) -> bool) {
        let mut models = self.models_with_series.lock().expect("metrics lock");
        models.retain(|key| {
            let kept = keep(key);
            if !kept {
                self.ome.remove(key);
            }
            kept
        });
    }

    /// Count what the core noted: breaker trips and holds, label collisions.
    pub fn note(&self, note: &Note) {
        let trips = |cause| self.own.breaker_trips.get_or_create_owned(&[("cause", cause)]);
        let counter = match note {
            Note::BreakerTripped { .. } => trips(BREAKER_CAUSES[0]),
            Note::NodeLabelsVanished { .. } => trips(BREAKER_CAUSES[1]),
            Note::BreakerHeld { .. } => self.own.breaker_holds.clone(),
            Note::KeyCollision { .. } => self.own.label_collisions.clone(),
            _ => return,
        };
        counter.inc();
    }

    /// The meter of one download in progress (counted until it is dropped).
    pub fn download_meter(&self) -> DownloadMeter {
        self.own.downloads_in_progress.inc();
        DownloadMeter {
            fetched_bytes: self.own.fetched_bytes.clone(),
            speed: self.own.download_speed.clone(),
            in_progress: self.own.downloads_in_progress.clone(),
            counted_bytes: 0,
            bytes_per_sec: 0,
        }
    }

    /// The exposition (Prometheus text 0.0.4, `CONTENT_TYPE`).
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// One download's share of the fetched bytes and of the speed, from its progress reports; its
/// speed and its place in `downloads_in_progress` go when it is dropped.
pub struct DownloadMeter {
    fetched_bytes: Counter,
    speed: Gauge,
    in_progress: Gauge,
    counted_bytes: u64,
    bytes_per_sec: i64,
}

impl DownloadMeter {
    pub fn report(&mut self, progress: &crate::download::Progress) {
        self.fetched_bytes.inc_by(progress.fetched_bytes.saturating_sub(self.counted_bytes));
        self.counted_bytes = self.counted_bytes.max(progress.fetched_bytes);
        // `as` saturates: a rate beyond i64 is no rate.
        let bytes_per_sec = progress.bytes_per_sec.round() as i64;
        self.speed.inc_by(bytes_per_sec - self.bytes_per_sec);
        self.bytes_per_sec = bytes_per_sec;
    }
}

impl Drop for DownloadMeter {
    fn drop(&mut self) {
        self.speed.dec_by(self.bytes_per_sec);
        self.in_progress.dec();
    }
}
