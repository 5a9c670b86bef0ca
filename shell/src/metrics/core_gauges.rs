//! What the core counts and knows, and the filesystem gate's count: read at each scrape from what
//! the loop last published, so that publishing costs one assignment every 500 ms.
//! Counters are named without `_total` here too: the encoder appends it.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use model_agent_core::machine::{CopyUse, Stats};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

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
    pub shared_copies: Vec<CopyUse>,
}

#[derive(Debug)]
pub(super) struct Collector {
    pub core: Arc<Mutex<CoreGauges>>,
    pub fs_calls_unreturned: Arc<AtomicUsize>,
}

impl prometheus_client::collector::Collector for Collector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let core = self.core.lock().expect("metrics lock");
        counters(&mut encoder, &core.stats)?;
        live_reads(&mut encoder, &core.stats)?;
        gauges(&mut encoder, &core, self.fs_calls_unreturned.load(Ordering::Relaxed))?;
        shared_copies(&mut encoder, &core.shared_copies)
    }
}

fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge<N: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> fmt::Result {
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

fn counters(encoder: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    for (name, help, value) in [
        (
            "model_agent_phantom_deletes_suppressed",
            "Deletion candidates a live read showed alive (same uid, not deleting).",
            st.phantom_deletes_suppressed,
        ),
        (
            "model_agent_delete_candidates",
            "Deleted, tombstone, relist-vanished and uid-changed notifications.",
            st.candidates,
        ),
        (
            "model_agent_deletes_confirmed",
            "Deletions confirmed by NotFound, a new uid or a deletionTimestamp.",
            st.deletes_confirmed,
        ),
        ("model_agent_cleanups", "Model incarnations cleaned up on this node.", st.cleanups_done),
        ("model_agent_effect_failures", "Effects that failed and are retried with backoff.", st.effects_failed),
    ] {
        counter(encoder, name, help, value)?;
    }
    Ok(())
}

/// Live reads by result and by verb (fixed label values).
fn live_reads(encoder: &mut DescriptorEncoder, st: &Stats) -> fmt::Result {
    let help = "Live reads of the API server by result.";
    let mut family = encoder.encode_descriptor("model_agent_live_reads", help, None, MetricType::Counter)?;
    for (result, value) in [
        ("found", st.reads_found),
        ("not_found", st.reads_not_found),
        ("failed", st.reads_failed - st.reads_timed_out.min(st.reads_failed)),
        ("timed_out", st.reads_timed_out),
    ] {
        ConstCounter::new(value).encode(family.encode_family(&[("result", result)])?)?;
    }
    let help = "Live reads sent, by verb.";
    let mut family = encoder.encode_descriptor("model_agent_live_read_requests", help, None, MetricType::Counter)?;
    for (verb, value) in [("get", st.live_gets), ("list", st.live_lists)] {
        ConstCounter::new(value).encode(family.encode_family(&[("verb", verb)])?)?;
    }
    Ok(())
}

fn gauges(encoder: &mut DescriptorEncoder, core: &CoreGauges, fs_calls_unreturned: usize) -> fmt::Result {
    for (name, help, value) in [
        (
            "model_agent_pending_confirmations",
            "Deletion candidates waiting for a live read to answer.",
            core.pending_confirmations,
        ),
        ("model_agent_ready", "1 when the agent is ready (readiness, as /readyz).", usize::from(core.ready)),
        ("model_agent_models", "Models the agent keeps track of.", core.models),
        (
            "model_agent_fs_calls_unreturned",
            "Filesystem calls to the models root not returned yet (a hung mount keeps them).",
            fs_calls_unreturned,
        ),
    ] {
        gauge(encoder, name, help, value)?;
    }
    let writable = match core.root_writable {
        Some(writable) => f64::from(u8::from(writable)),
        None => f64::NAN,
    };
    for (name, help, value) in [
        (
            "model_agent_pending_confirmation_oldest_seconds",
            "Age of the oldest pending confirmation.",
            core.oldest_pending_seconds,
        ),
        (
            "model_agent_models_root_writable",
            "1 when the models root is writable, 0 when read-only (NaN before the first probe).",
            writable,
        ),
    ] {
        gauge(encoder, name, help, value)?;
    }
    Ok(())
}

/// Shared copies (`downloadPolicy: ReuseIfExists`): how many, their bytes, the bytes a copy
/// per model would have taken on top, and each copy's references (labelled by its path under
/// `_artifacts/`, one series per copy in use).
fn shared_copies(encoder: &mut DescriptorEncoder, copies: &[CopyUse]) -> fmt::Result {
    let bytes: u64 = copies.iter().map(|c| c.bytes).sum();
    let saved: u64 = copies.iter().map(|c| c.bytes.saturating_mul(c.references.saturating_sub(1) as u64)).sum();
    for (name, help, value) in [
        (
            "model_agent_shared_copies",
            "Shared copies (one per repository commit) models on this node use.",
            copies.len() as u64,
        ),
        ("model_agent_shared_copy_bytes", "Bytes of the shared copies on this node.", bytes),
        (
            "model_agent_shared_bytes_saved",
            "Bytes a copy per model would take beyond the shared copies (bytes x (references - 1)).",
            saved,
        ),
    ] {
        gauge(encoder, name, help, value)?;
    }
    if copies.is_empty() {
        return Ok(());
    }
    let help = "Models on this node that use each shared copy.";
    let mut family = encoder.encode_descriptor("model_agent_shared_copy_references", help, None, MetricType::Gauge)?;
    for c in copies {
        let copy = c.path.strip_prefix("_artifacts/").unwrap_or(&c.path);
        ConstGauge::new(c.references as u64).encode(family.encode_family(&[("copy", copy)])?)?;
    }
    Ok(())
}
