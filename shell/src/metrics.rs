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

    /// Drop the per-model series of models the agent no longer keeps (deleted, or never
    /// coming back), so that `/metrics` neither grows without bound nor names gone models.
    pub fn retain_models(&self, keep: impl Fn(&ModelKey) -> bool) {
        for map in [&self.downloads_success, &self.downloads_failed] {
            map.lock().expect("metrics lock").retain(|key, _| keep(key));
        }
    }

    pub fn render(&self) -> String {
        let mut s = String::new();
        self.render_model_series(&mut s);
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

fn counter(s: &mut String, name: &str, help: &str, v: u64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
}

fn gauge(s: &mut String, name: &str, help: &str, v: f64) {
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
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
}
