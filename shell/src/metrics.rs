//! Prometheus text exposition of the agent's metrics: OME's names where they apply, and new ones
//! for this design (phantom deletes suppressed, pending confirmations, live reads by result,
//! models root writable).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use model_agent_core::ModelKey;
use model_agent_core::machine::Stats;

/// What the core loop publishes about itself after its steps.
#[derive(Clone, Debug, Default)]
pub struct CoreGauges {
    pub stats: Stats,
    pub pending_confirmations: usize,
    pub oldest_pending_seconds: f64,
    pub models: usize,
    pub root_writable: Option<bool>,
    pub ready: bool,
    /// The shared copies models use on this node (#10).
    pub shared_copies: Vec<model_agent_core::machine::CopyUse>,
}

#[derive(Default)]
pub struct Metrics {
    pub watch_errors: AtomicU64,
    pub write_errors: AtomicU64,
    pub effects_executed: AtomicU64,
    /// Filesystem calls to the models root that have not returned (stuck or running): the
    /// filesystem gate's own count.
    pub fs_calls_unreturned: Arc<AtomicUsize>,
    /// OME's per-model series, labelled model_type (the kind), namespace and name.
    downloads_success: Mutex<BTreeMap<ModelKey, u64>>,
    downloads_failed: Mutex<BTreeMap<ModelKey, u64>>,
    rate_limits: Mutex<BTreeMap<ModelKey, u64>>,
    download_bytes: Mutex<BTreeMap<ModelKey, u64>>,
    download_seconds: Mutex<BTreeMap<ModelKey, Histogram>>,
    /// OME's object-store verification series: per model and result, MD5 failures per model, and
    /// the durations (no labels).
    verifications: Mutex<BTreeMap<(ModelKey, &'static str), u64>>,
    md5_failed: Mutex<BTreeMap<ModelKey, u64>>,
    verification_seconds: Mutex<Histogram>,
    pub core: Mutex<CoreGauges>,
}

impl Metrics {
    pub fn inc(&self, c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// OME's `model_agent_downloads_{success,failed}_total` (local checks count, as upstream's do).
    pub fn model_outcome(&self, key: &ModelKey, ok: bool) {
        let map = if ok { &self.downloads_success } else { &self.downloads_failed };
        *map.lock().expect("metrics lock").entry(key.clone()).or_default() += 1;
    }

    /// One download ended: OME's success or failure count, its 429s, and for a success its
    /// duration and the bytes it holds (OME counts the listed sizes).
    /// `verified`: an object store's download, whose files were checked against the store's
    /// sizes and MD5s (OME's verification metrics; the duration is the whole download's, as
    /// every file is hashed while it streams).
    pub fn download_ended(
        &self,
        key: &ModelKey,
        end: &crate::download::Ended,
        took: std::time::Duration,
        verified: bool,
    ) {
        use crate::download::DownloadError;
        match &end.result {
            Ok(finished) => {
                self.model_outcome(key, true);
                *self.download_bytes.lock().expect("metrics lock").entry(key.clone()).or_default() +=
                    finished.bytes_total;
                self.download_seconds
                    .lock()
                    .expect("metrics lock")
                    .entry(key.clone())
                    .or_default()
                    .observe(took.as_secs_f64());
            }
            Err(DownloadError::Cancelled) => {}
            Err(_) => self.model_outcome(key, false),
        }
        if verified {
            self.store_verified(key, end, took);
        }
        if crate::downloads::rate_limited(end) {
            *self.rate_limits.lock().expect("metrics lock").entry(key.clone()).or_default() += 1;
        }
    }

    fn store_verified(&self, key: &ModelKey, end: &crate::download::Ended, took: std::time::Duration) {
        use crate::download::DownloadError;
        use crate::store::StoreError;
        let (result, md5_failures) = match &end.result {
            Ok(finished) => ("success", finished.integrity_failures),
            Err(DownloadError::Store(StoreError::Integrity { .. })) => ("failure", 1),
            Err(_) => return,
        };
        *self.verifications.lock().expect("metrics lock").entry((key.clone(), result)).or_default() += 1;
        if md5_failures > 0 {
            *self.md5_failed.lock().expect("metrics lock").entry(key.clone()).or_default() += md5_failures;
        }
        self.verification_seconds.lock().expect("metrics lock").observe(took.as_secs_f64());
    }

    /// Drop the per-model series of models the agent no longer keeps (deleted, or never
    /// coming back), so that `/metrics` neither grows without bound nor names gone models.
    pub fn retain_models(&self, keep: impl Fn(&ModelKey) -> bool) {
        for map in [&self.downloads_success, &self.downloads_failed, &self.rate_limits, &self.download_bytes] {
            map.lock().expect("metrics lock").retain(|key, _| keep(key));
        }
        self.download_seconds.lock().expect("metrics lock").retain(|key, _| keep(key));
        self.verifications.lock().expect("metrics lock").retain(|(key, _), _| keep(key));
        self.md5_failed.lock().expect("metrics lock").retain(|key, _| keep(key));
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        self.render_model_series(&mut s);
        self.render_durations(&mut s);
        self.render_verifications(&mut s);
        render_core(&mut s, &self.core.lock().expect("metrics lock").clone());
        self.render_shell(&mut s);
        s
    }

    /// OME's per-model series.
    fn render_model_series(&self, s: &mut String) {
        for (name, help, map) in [
            ("model_agent_downloads_success_total", "Models made available on this node.", &self.downloads_success),
            (
                "model_agent_downloads_failed_total",
                "Models that failed to become available on this node.",
                &self.downloads_failed,
            ),
            ("model_agent_rate_limit_total", "Downloads the Hub rate-limited (HTTP 429).", &self.rate_limits),
            (
                "model_agent_download_bytes_total",
                "Bytes of the models downloaded onto this node.",
                &self.download_bytes,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
            for (key, v) in map.lock().expect("metrics lock").iter() {
                let _ = writeln!(
                    s,
                    "{name}{{model_type=\"{}\",namespace=\"{}\",name=\"{}\"}} {v}",
                    esc(key.kind.as_str()),
                    esc(&key.namespace),
                    esc(&key.name)
                );
            }
        }
    }

    /// OME's `model_agent_download_duration_seconds`: buckets 0.1·2^k s, k = 0..9.
    fn render_durations(&self, s: &mut String) {
        let name = "model_agent_download_duration_seconds";
        let _ = writeln!(s, "# HELP {name} Time taken by successful downloads.\n# TYPE {name} histogram");
        for (key, h) in self.download_seconds.lock().expect("metrics lock").iter() {
            let labels = format!(
                "model_type=\"{}\",namespace=\"{}\",name=\"{}\"",
                esc(key.kind.as_str()),
                esc(&key.namespace),
                esc(&key.name)
            );
            let mut cumulative = 0;
            for (k, count) in h.buckets.iter().enumerate() {
                cumulative += count;
                let _ = writeln!(s, "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}", go_float(bucket_bound(k)));
            }
            let _ = writeln!(s, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(s, "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {}", h.sum, h.count);
        }
    }

    /// OME's `model_agent_verifications_total{result}`, `model_agent_md5_checksum_failed_total`
    /// and `model_agent_verification_duration_seconds` (no labels, buckets 0.1·2^k s).
    fn render_verifications(&self, s: &mut String) {
        let name = "model_agent_verifications_total";
        let _ = writeln!(s, "# HELP {name} Object store downloads verified, by result.\n# TYPE {name} counter");
        for ((key, result), v) in self.verifications.lock().expect("metrics lock").iter() {
            let _ = writeln!(s, "{name}{{{},result=\"{result}\"}} {v}", model_labels(key));
        }
        let name = "model_agent_md5_checksum_failed_total";
        let _ = writeln!(s, "# HELP {name} Object store files whose MD5 did not match.\n# TYPE {name} counter");
        for (key, v) in self.md5_failed.lock().expect("metrics lock").iter() {
            let _ = writeln!(s, "{name}{{{}}} {v}", model_labels(key));
        }
        let name = "model_agent_verification_duration_seconds";
        let _ = writeln!(
            s,
            "# HELP {name} Time taken by object store downloads and their verification.\n# TYPE {name} histogram"
        );
        let h = self.verification_seconds.lock().expect("metrics lock").clone();
        let mut cumulative = 0;
        for (k, count) in h.buckets.iter().enumerate() {
            cumulative += count;
            let _ = writeln!(s, "{name}_bucket{{le=\"{}\"}} {cumulative}", go_float(bucket_bound(k)));
        }
        let _ = writeln!(s, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", h.count, h.sum, h.count);
    }

    /// What the shell itself counts.
    fn render_shell(&self, s: &mut String) {
        counter(
            s,
            "model_agent_watch_errors_total",
            "Watch errors (the watcher relists by itself).",
            self.watch_errors.load(Ordering::Relaxed),
        );
        gauge(
            s,
            "model_agent_fs_calls_unreturned",
            "Filesystem calls to the models root not returned yet (a hung mount keeps them).",
            self.fs_calls_unreturned.load(Ordering::Relaxed) as f64,
        );
        counter(
            s,
            "model_agent_write_errors_total",
            "Failed label or ConfigMap write batches.",
            self.write_errors.load(Ordering::Relaxed),
        );
    }
}

const DURATION_BUCKETS: usize = 10;

fn model_labels(key: &ModelKey) -> String {
    format!(
        "model_type=\"{}\",namespace=\"{}\",name=\"{}\"",
        esc(key.kind.as_str()),
        esc(&key.namespace),
        esc(&key.name)
    )
}

fn bucket_bound(k: usize) -> f64 {
    0.1 * (1u64 << k) as f64
}

/// Prometheus' Go client writes bounds with the shortest exact text (`0.1`, `0.2`, `51.2`).
fn go_float(v: f64) -> String {
    let text = format!("{v:.1}");
    text.strip_suffix(".0").map_or(text.clone(), str::to_string)
}

#[derive(Clone, Debug, Default)]
struct Histogram {
    buckets: [u64; DURATION_BUCKETS],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(k) = (0..DURATION_BUCKETS).find(|&k| seconds <= bucket_bound(k)) {
            self.buckets[k] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

fn counter(s: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

fn gauge(s: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
}

/// Shared copies (`downloadPolicy: ReuseIfExists`): how many, their bytes, the bytes a copy
/// per model would have taken on top, and each copy's references (labelled by its path under
/// `_artifacts/`, one series per copy in use).
fn render_shared(s: &mut String, copies: &[model_agent_core::machine::CopyUse]) {
    let bytes: u64 = copies.iter().map(|c| c.bytes).sum();
    let saved: u64 = copies.iter().map(|c| c.bytes.saturating_mul(c.references.saturating_sub(1) as u64)).sum();
    gauge(
        s,
        "model_agent_shared_copies",
        "Shared copies (one per repository commit) models on this node use.",
        copies.len() as f64,
    );
    gauge(s, "model_agent_shared_copy_bytes", "Bytes of the shared copies on this node.", bytes as f64);
    gauge(
        s,
        "model_agent_shared_bytes_saved",
        "Bytes a copy per model would take beyond the shared copies (bytes x (references - 1)).",
        saved as f64,
    );
    let name = "model_agent_shared_copy_references";
    let _ = writeln!(s, "# HELP {name} Models on this node that use each shared copy.\n# TYPE {name} gauge");
    for c in copies {
        let copy = c.path.strip_prefix("_artifacts/").unwrap_or(&c.path);
        let _ = writeln!(s, "{name}{{copy=\"{}\"}} {}", esc(copy), c.references);
    }
}

/// Live reads by result and by verb.
fn render_reads(s: &mut String, st: &model_agent_core::machine::Stats) {
    let _ = writeln!(
        s,
        "# HELP model_agent_live_reads_total Live reads of the API server by result.\n# TYPE model_agent_live_reads_total counter"
    );
    for (result, v) in [
        ("found", st.reads_found),
        ("not_found", st.reads_not_found),
        ("failed", st.reads_failed - st.reads_timed_out.min(st.reads_failed)),
        ("timed_out", st.reads_timed_out),
    ] {
        let _ = writeln!(s, "model_agent_live_reads_total{{result=\"{result}\"}} {v}");
    }
    let _ = writeln!(
        s,
        "# HELP model_agent_live_read_requests_total Live reads sent, by verb.\n# TYPE model_agent_live_read_requests_total counter"
    );
    let _ = writeln!(s, "model_agent_live_read_requests_total{{verb=\"get\"}} {}", st.live_gets);
    let _ = writeln!(s, "model_agent_live_read_requests_total{{verb=\"list\"}} {}", st.live_lists);
}

/// What the core counts and knows.
fn render_core(s: &mut String, core: &CoreGauges) {
    let st = &core.stats;
    counter(
        s,
        "model_agent_phantom_deletes_suppressed_total",
        "Deletion candidates a live read showed alive (same uid, not deleting).",
        st.phantom_deletes_suppressed,
    );
    counter(
        s,
        "model_agent_delete_candidates_total",
        "Deleted, tombstone, relist-vanished and uid-changed notifications.",
        st.candidates,
    );
    counter(
        s,
        "model_agent_deletes_confirmed_total",
        "Deletions confirmed by NotFound, a new uid or a deletionTimestamp.",
        st.deletes_confirmed,
    );
    counter(s, "model_agent_cleanups_total", "Model incarnations cleaned up on this node.", st.cleanups_done);
    gauge(
        s,
        "model_agent_pending_confirmations",
        "Deletion candidates waiting for a live read to answer.",
        core.pending_confirmations as f64,
    );
    gauge(
        s,
        "model_agent_pending_confirmation_oldest_seconds",
        "Age of the oldest pending confirmation.",
        core.oldest_pending_seconds,
    );
    render_reads(s, st);
    let writable = match core.root_writable {
        Some(true) => 1.0,
        Some(false) => 0.0,
        None => f64::NAN,
    };
    gauge(s, "model_agent_models_root_writable", "1 when the models root is writable, 0 when read-only.", writable);
    gauge(
        s,
        "model_agent_ready",
        "1 when the agent is ready (readiness, as /readyz).",
        if core.ready { 1.0 } else { 0.0 },
    );
    gauge(s, "model_agent_models", "Models the agent keeps track of.", core.models as f64);
    render_shared(s, &core.shared_copies);
    counter(
        s,
        "model_agent_effect_failures_total",
        "Effects that failed and are retried with backoff.",
        st.effects_failed,
    );
}

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_model_series_go_when_the_model_is_gone() {
        let m = Metrics::default();
        let (kept, gone) = (ModelKey::cluster("kept"), ModelKey::cluster("gone"));
        m.model_outcome(&kept, true);
        m.model_outcome(&gone, false);
        let text = m.render();
        assert!(text.contains(
            "model_agent_downloads_success_total{model_type=\"ClusterBaseModel\",namespace=\"\",name=\"kept\"} 1"
        ));
        assert!(text.contains("name=\"gone\"} 1"));
        m.retain_models(|k| *k == kept);
        let text = m.render();
        assert!(text.contains("name=\"kept\"} 1"));
        assert!(!text.contains("name=\"gone\""), "{text}");
        // The family's HELP and TYPE stay, with no series.
        assert!(text.contains("# TYPE model_agent_downloads_failed_total counter"));
    }

    #[test]
    fn a_finished_download_counts_its_bytes_and_its_duration_in_ome_s_buckets() {
        use crate::download::{DownloadError, Ended, Finished};
        let m = Metrics::default();
        let key = ModelKey::namespaced("t", "m");
        let finished =
            Finished { commit: "c".into(), files: 2, bytes_total: 1234, bytes_fetched: 1000, ..Finished::default() };
        m.download_ended(
            &key,
            &Ended { marked: true, result: Ok(finished) },
            std::time::Duration::from_millis(300),
            false,
        );
        let limited = DownloadError::Hub(crate::hf::HfError::RateLimited { retry_after_ms: Some(1000) });
        m.download_ended(&key, &Ended { marked: true, result: Err(limited) }, std::time::Duration::ZERO, false);
        m.download_ended(
            &key,
            &Ended { marked: true, result: Err(DownloadError::Cancelled) },
            std::time::Duration::ZERO,
            false,
        );
        let text = m.render();
        let labels = "model_type=\"BaseModel\",namespace=\"t\",name=\"m\"";
        for line in [
            format!("model_agent_downloads_success_total{{{labels}}} 1"),
            format!("model_agent_downloads_failed_total{{{labels}}} 1"),
            format!("model_agent_rate_limit_total{{{labels}}} 1"),
            format!("model_agent_download_bytes_total{{{labels}}} 1234"),
            format!("model_agent_download_duration_seconds_bucket{{{labels},le=\"0.2\"}} 0"),
            format!("model_agent_download_duration_seconds_bucket{{{labels},le=\"0.4\"}} 1"),
            format!("model_agent_download_duration_seconds_bucket{{{labels},le=\"51.2\"}} 1"),
            format!("model_agent_download_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 1"),
            format!("model_agent_download_duration_seconds_count{{{labels}}} 1"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert_eq!(text.matches("model_agent_download_duration_seconds_bucket{").count(), 11, "10 bounds and +Inf");
    }

    #[test]
    fn a_store_download_counts_ome_s_verification_series() {
        use crate::download::{DownloadError, Ended, Finished};
        use crate::store::StoreError;
        let m = Metrics::default();
        let key = ModelKey::cluster("m");
        let ok = Finished { integrity_failures: 2, ..Finished::default() };
        m.download_ended(&key, &Ended { marked: true, result: Ok(ok) }, std::time::Duration::from_millis(150), true);
        let bad = StoreError::Integrity { path: "w".into(), expected: "md5 x".into(), got: "y".into() };
        let bad = Ended { marked: true, result: Err(DownloadError::Store(bad)) };
        m.download_ended(&key, &bad, std::time::Duration::from_secs(100), true);
        // A Hub download is no verification in OME's sense.
        m.download_ended(
            &ModelKey::cluster("hf"),
            &Ended { marked: true, result: Ok(Finished::default()) },
            std::time::Duration::ZERO,
            false,
        );
        let text = m.render();
        let labels = "model_type=\"ClusterBaseModel\",namespace=\"\",name=\"m\"";
        for line in [
            format!("model_agent_verifications_total{{{labels},result=\"success\"}} 1"),
            format!("model_agent_verifications_total{{{labels},result=\"failure\"}} 1"),
            format!("model_agent_md5_checksum_failed_total{{{labels}}} 3"),
            "model_agent_verification_duration_seconds_bucket{le=\"0.2\"} 1".to_string(),
            "model_agent_verification_duration_seconds_bucket{le=\"+Inf\"} 2".to_string(),
            "model_agent_verification_duration_seconds_count 2".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("name=\"hf\"} 1\nmodel_agent_md5"), "{text}");
        assert!(!text.lines().any(|l| l.starts_with("model_agent_verifications_total") && l.contains("\"hf\"")));
    }

    #[test]
    fn shared_copies_show_their_count_bytes_savings_and_references() {
        use model_agent_core::machine::CopyUse;
        let m = Metrics::default();
        let copy = |path: &str, references, bytes| CopyUse { path: path.into(), references, bytes };
        m.core.lock().unwrap().shared_copies = vec![
            copy("_artifacts/org/a/c1", 3, 1000),
            copy("_artifacts/org/b/c2", 1, 50),
            copy("_artifacts/o/x/c3", 2, 0),
        ];
        let text = m.render();
        for line in [
            "model_agent_shared_copies 3",
            "model_agent_shared_copy_bytes 1050",
            "model_agent_shared_bytes_saved 2000",
            "model_agent_shared_copy_references{copy=\"org/a/c1\"} 3",
            "model_agent_shared_copy_references{copy=\"org/b/c2\"} 1",
            "# TYPE model_agent_shared_copy_references gauge",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
    }
}
