use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use model_agent_core::machine::CopyUse;
use prometheus_parse::{Sample, Scrape, Value};

use super::*;
use crate::download::{DownloadError, Ended, Finished};

fn render(m: &Metrics) -> String {
    m.render().expect("the metrics encode")
}

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

fn ended(result: Result<Finished, DownloadError>) -> Ended {
    Ended { marked: true, result }
}

fn rate_limited(retry_after_ms: Option<u64>) -> Ended {
    ended(Err(DownloadError::Hub(crate::hf::HfError::RateLimited { retry_after_ms })))
}

fn md5_mismatch() -> Ended {
    let bad = crate::store::StoreError::Integrity { path: "w".into(), expected: "md5 x".into(), got: "y".into() };
    ended(Err(DownloadError::Store(bad)))
}

#[test]
fn per_model_series_go_when_the_model_is_gone() {
    let m = Metrics::default();
    let (kept, gone) = (ModelKey::cluster("kept"), ModelKey::cluster("gone"));
    m.model_outcome(&kept, true);
    m.model_outcome(&gone, false);
    m.download_ended(&gone, &ended(Ok(Finished::default())), Duration::from_secs(1), true);
    m.download_ended(&gone, &rate_limited(None), Duration::ZERO, false);
    m.download_ended(&gone, &md5_mismatch(), Duration::ZERO, true);
    let text = render(&m);
    assert!(has_line(
        &text,
        "model_agent_downloads_success_total{model_type=\"ClusterBaseModel\",namespace=\"\",name=\"kept\"} 1"
    ));
    assert!(text.contains("name=\"gone\"} 1"));
    m.retain_models(|k| *k == kept);
    let text = render(&m);
    assert!(text.contains("name=\"kept\"} 1"));
    assert!(!text.contains("name=\"gone\""), "{text}");
    // A family left without series is not written at all (as Go's client leaves out a vector
    // with no children); the unlabelled verification histogram stays.
    assert!(!text.contains("model_agent_downloads_failed_total"), "{text}");
    assert!(has_line(&text, "model_agent_verification_duration_seconds_count 2"), "{text}");
    assert_eq!(m.models_with_series.lock().unwrap().len(), 1);
}

#[test]
fn a_finished_download_counts_its_bytes_and_its_duration_in_ome_s_buckets() {
    let m = Metrics::default();
    let key = ModelKey::namespaced("t", "m");
    let finished =
        Finished { commit: "c".into(), files: 2, bytes_total: 1234, bytes_fetched: 1000, ..Finished::default() };
    m.download_ended(&key, &ended(Ok(finished)), Duration::from_millis(300), false);
    m.download_ended(&key, &rate_limited(Some(30_000)), Duration::ZERO, false);
    m.download_ended(&key, &ended(Err(DownloadError::Cancelled)), Duration::ZERO, false);
    let text = render(&m);
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
        // The 429's Retry-After, 30 s, in OME's 1·2^k s buckets.
        format!("model_agent_rate_limit_wait_seconds_bucket{{{labels},le=\"16\"}} 0"),
        format!("model_agent_rate_limit_wait_seconds_bucket{{{labels},le=\"32\"}} 1"),
        format!("model_agent_rate_limit_wait_seconds_bucket{{{labels},le=\"512\"}} 1"),
        format!("model_agent_rate_limit_wait_seconds_sum{{{labels}}} 30.0"),
    ] {
        assert!(has_line(&text, &line), "{line} missing from\n{text}");
    }
    assert_eq!(text.matches("model_agent_download_duration_seconds_bucket{").count(), 11, "10 bounds and +Inf");
}

#[test]
fn a_store_download_counts_ome_s_verification_series() {
    let m = Metrics::default();
    let key = ModelKey::cluster("m");
    let ok = Finished { integrity_failures: 2, ..Finished::default() };
    m.download_ended(&key, &ended(Ok(ok)), Duration::from_millis(150), true);
    m.download_ended(&key, &md5_mismatch(), Duration::from_secs(100), true);
    // A Hub download is no verification in OME's sense.
    m.download_ended(&ModelKey::cluster("hf"), &ended(Ok(Finished::default())), Duration::ZERO, false);
    let text = render(&m);
    let labels = "model_type=\"ClusterBaseModel\",namespace=\"\",name=\"m\"";
    for line in [
        format!("model_agent_verifications_total{{{labels},result=\"success\"}} 1"),
        format!("model_agent_verifications_total{{{labels},result=\"failure\"}} 1"),
        format!("model_agent_md5_checksum_failed_total{{{labels}}} 3"),
        "model_agent_verification_duration_seconds_bucket{le=\"0.2\"} 1".to_string(),
        "model_agent_verification_duration_seconds_bucket{le=\"+Inf\"} 2".to_string(),
        "model_agent_verification_duration_seconds_count 2".to_string(),
    ] {
        assert!(has_line(&text, &line), "{line} missing from\n{text}");
    }
    let hf = |l: &&str| l.contains("name=\"hf\"");
    assert!(!text.lines().filter(hf).any(|l| l.starts_with("model_agent_verifications_total")), "{text}");
    assert!(!text.lines().filter(hf).any(|l| l.starts_with("model_agent_md5_checksum_failed_total")), "{text}");
}

#[test]
fn shared_copies_show_their_count_bytes_savings_and_references() {
    let m = Metrics::default();
    let copy = |path: &str, references, bytes| CopyUse { path: path.into(), references, bytes };
    m.core.lock().unwrap().shared_copies =
        vec![copy("_artifacts/org/a/c1", 3, 1000), copy("_artifacts/org/b/c2", 1, 50), copy("_artifacts/o/x/c3", 2, 0)];
    let text = render(&m);
    for line in [
        "model_agent_shared_copies 3",
        "model_agent_shared_copy_bytes 1050",
        "model_agent_shared_bytes_saved 2000",
        "model_agent_shared_copy_references{copy=\"org/a/c1\"} 3",
        "model_agent_shared_copy_references{copy=\"org/b/c2\"} 1",
        "# TYPE model_agent_shared_copy_references gauge",
    ] {
        assert!(has_line(&text, line), "{line} missing from\n{text}");
    }
}

#[test]
fn the_core_s_notes_count_breaker_trips_and_holds_and_label_collisions() {
    use model_agent_core::machine::Note;
    use model_agent_core::{Instant, Uid};
    let m = Metrics::default();
    let text = render(&m);
    for cause in BREAKER_CAUSES {
        assert!(has_line(&text, &format!("model_agent_breaker_trips_total{{cause=\"{cause}\"}} 0")), "{text}");
    }
    let (key, uid, until) = (ModelKey::cluster("a"), Uid::new("u"), Instant::from_ms(5));
    m.note(&Note::BreakerTripped { candidates: 9, placed: 10, until });
    m.note(&Note::NodeLabelsVanished { vanished: 6, had: 10, until });
    m.note(&Note::NodeLabelsVanished { vanished: 7, had: 10, until });
    m.note(&Note::BreakerHeld { key: key.clone(), uid: uid.clone(), until });
    m.note(&Note::KeyCollision { key, uid, owner: ModelKey::cluster("b") });
    m.note(&Note::NodeReadFailed { reason: "x".into(), retry_in_ms: 1 });
    let text = render(&m);
    for line in [
        "model_agent_breaker_trips_total{cause=\"candidates\"} 1",
        "model_agent_breaker_trips_total{cause=\"node_labels_vanished\"} 2",
        "model_agent_breaker_holds_total 1",
        "model_agent_label_collisions_total 1",
    ] {
        assert!(has_line(&text, line), "{line} missing from\n{text}");
    }
}

#[test]
fn download_meters_count_fetched_bytes_and_sum_the_speeds_of_downloads_in_progress() {
    use crate::download::Progress;
    let m = Metrics::default();
    let progress = |fetched_bytes, bytes_per_sec| Progress {
        total_bytes: 0,
        completed_bytes: 0,
        total_files: 0,
        completed_files: 0,
        bytes_per_sec,
        fetched_bytes,
    };
    let (mut a, mut b) = (m.download_meter(), m.download_meter());
    a.report(&progress(1000, 100.4));
    b.report(&progress(500, 50.0));
    a.report(&progress(3000, 200.0));
    let text = render(&m);
    for line in [
        "model_agent_download_fetched_bytes_total 3500",
        "model_agent_download_speed_bytes_per_second 250",
        "model_agent_downloads_in_progress 2",
    ] {
        assert!(has_line(&text, line), "{line} missing from\n{text}");
    }
    drop(a);
    let text = render(&m);
    assert!(has_line(&text, "model_agent_download_speed_bytes_per_second 50"), "{text}");
    assert!(has_line(&text, "model_agent_downloads_in_progress 1"), "{text}");
    drop(b);
    let text = render(&m);
    assert!(has_line(&text, "model_agent_download_speed_bytes_per_second 0"), "{text}");
    assert!(has_line(&text, "model_agent_download_fetched_bytes_total 3500"), "{text}");
}

/// OME's metrics (spec §3.8): exposed name, type, label names, and for histograms the bucket
/// bounds. The `go_*` runtime gauges of that table are Go's own (goroutines, Go heap, Go GC)
/// and have no counterpart in this process.
const OME_METRICS: [(&str, &str, &[&str], &[f64]); 9] = [
    ("model_agent_downloads_success_total", "counter", &MODEL, &[]),
    ("model_agent_downloads_failed_total", "counter", &MODEL, &[]),
    ("model_agent_verifications_total", "counter", &["model_type", "namespace", "name", "result"], &[]),
    ("model_agent_md5_checksum_failed_total", "counter", &MODEL, &[]),
    ("model_agent_rate_limit_total", "counter", &MODEL, &[]),
    ("model_agent_download_duration_seconds", "histogram", &MODEL, &DURATION_BOUNDS),
    ("model_agent_verification_duration_seconds", "histogram", &[], &DURATION_BOUNDS),
    ("model_agent_download_bytes_total", "counter", &MODEL, &[]),
    (
        "model_agent_rate_limit_wait_seconds",
        "histogram",
        &MODEL,
        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0],
    ),
];
const MODEL: [&str; 3] = ["model_type", "namespace", "name"];
const DURATION_BOUNDS: [f64; 10] = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 51.2];

/// Every series this agent adds, each with its label names.
const OWN_METRICS: [(&str, &str, &[&str]); 26] = [
    ("model_agent_phantom_deletes_suppressed_total", "counter", &[]),
    ("model_agent_delete_candidates_total", "counter", &[]),
    ("model_agent_deletes_confirmed_total", "counter", &[]),
    ("model_agent_cleanups_total", "counter", &[]),
    ("model_agent_effect_failures_total", "counter", &[]),
    ("model_agent_live_reads_total", "counter", &["result"]),
    ("model_agent_live_read_requests_total", "counter", &["verb"]),
    ("model_agent_pending_confirmations", "gauge", &[]),
    ("model_agent_pending_confirmation_oldest_seconds", "gauge", &[]),
    ("model_agent_models_root_writable", "gauge", &[]),
    ("model_agent_ready", "gauge", &[]),
    ("model_agent_models", "gauge", &[]),
    ("model_agent_fs_calls_unreturned", "gauge", &[]),
    ("model_agent_shared_copies", "gauge", &[]),
    ("model_agent_shared_copy_bytes", "gauge", &[]),
    ("model_agent_shared_bytes_saved", "gauge", &[]),
    ("model_agent_shared_copy_references", "gauge", &["copy"]),
    ("model_agent_breaker_trips_total", "counter", &["cause"]),
    ("model_agent_breaker_holds_total", "counter", &[]),
    ("model_agent_label_collisions_total", "counter", &[]),
    ("model_agent_download_fetched_bytes_total", "counter", &[]),
    ("model_agent_download_speed_bytes_per_second", "gauge", &[]),
    ("model_agent_downloads_in_progress", "gauge", &[]),
    ("model_agent_watch_errors_total", "counter", &[]),
    ("model_agent_write_errors_total", "counter", &[]),
    ("model_agent_effects_executed_total", "counter", &[]),
];

/// Every per-model series and every labelled family has one series at least.
fn busy_metrics() -> Arc<Metrics> {
    let m = Arc::new(Metrics::default());
    let (hub, store) = (ModelKey::namespaced("team-a", "qwen"), ModelKey::cluster("llama"));
    m.download_ended(
        &hub,
        &ended(Ok(Finished { bytes_total: 10, ..Finished::default() })),
        Duration::from_secs(3),
        false,
    );
    m.download_ended(&hub, &rate_limited(Some(30_000)), Duration::ZERO, false);
    let ok = Finished { integrity_failures: 1, ..Finished::default() };
    m.download_ended(&store, &ended(Ok(ok)), Duration::from_secs(40), true);
    m.download_ended(&store, &md5_mismatch(), Duration::from_secs(1), true);
    m.core.lock().unwrap().shared_copies = vec![CopyUse { path: "_artifacts/org/r/c".into(), references: 2, bytes: 7 }];
    m.core.lock().unwrap().root_writable = None;
    m
}

/// `/metrics` through the HTTP router, as Prometheus scrapes it.
async fn scrape(metrics: Arc<Metrics>) -> (String, String) {
    use http_body_util::BodyExt;
    use tower_service::Service;
    let shared = crate::http::Shared {
        readiness: std::sync::RwLock::new(model_agent_core::machine::Readiness { ready: true, checks: Vec::new() }),
        heartbeat_ms: Default::default(),
        epoch: std::time::Instant::now(),
        stall_ms_max: 30_000,
        metrics,
    };
    let mut router = crate::http::router(Arc::new(shared));
    let request = axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap();
    let response = router.call(request).await.unwrap();
    assert_eq!(response.status(), axum::http::StatusCode::OK);
    let content_type = response.headers()[axum::http::header::CONTENT_TYPE].to_str().unwrap().to_string();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (content_type, String::from_utf8(body.to_vec()).unwrap())
}

/// The TYPE of each family, and the samples `prometheus-parse` read, by name.
fn parse(text: &str) -> (BTreeMap<String, String>, BTreeMap<String, Vec<Sample>>, Scrape) {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("the scrape parses");
    let types: BTreeMap<String, String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').map(|(n, t)| (n.to_string(), t.to_string())).expect("TYPE name type"))
        .collect();
    let mut samples: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for s in &scrape.samples {
        samples.entry(s.metric.clone()).or_default().push(s.clone());
    }
    (types, samples, scrape)
}

fn label_names(sample: &Sample) -> BTreeSet<&str> {
    sample.labels.keys().map(String::as_str).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_scrape_parses_with_ome_s_names_labels_and_buckets() {
    let (content_type, text) = scrape(busy_metrics()).await;
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let (types, samples, scrape) = parse(&text);
    for (name, kind, labels, bounds) in OME_METRICS {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}'s TYPE in\n{text}");
        let found = samples.get(name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        for sample in found {
            assert_eq!(label_names(sample), labels.iter().copied().collect(), "{name}'s labels");
            match &sample.value {
                Value::Histogram(buckets) => {
                    let le: Vec<f64> = buckets.iter().map(|b| b.less_than).collect();
                    let want: Vec<f64> = bounds.iter().copied().chain([f64::INFINITY]).collect();
                    assert_eq!(le, want, "{name}'s buckets");
                }
                Value::Counter(_) => assert!(bounds.is_empty(), "{name} is a counter"),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
    for (name, kind, labels) in OWN_METRICS {
        assert_eq!(types.get(name).map(String::as_str), Some(kind), "{name}'s TYPE in\n{text}");
        let found = samples.get(name).unwrap_or_else(|| panic!("no {name} in\n{text}"));
        assert!(found.iter().all(|s| label_names(s) == labels.iter().copied().collect()), "{name}'s labels");
    }
    // Every family has its HELP, one full stop at its end; no counter is `_total_total`.
    for name in types.keys() {
        let help = scrape.docs.get(name).unwrap_or_else(|| panic!("{name} has no HELP"));
        assert!(help.ends_with('.') && !help.ends_with(".."), "{name}: {help}");
        assert!(!name.ends_with("_total_total"), "{name}");
    }
    assert!(types.iter().all(|(name, kind)| kind != "counter" || name.ends_with("_total")), "{types:?}");
}

/// `prometheus-parse` passes over lines it cannot read: every sample line must be one it read
/// (a histogram's `_sum` and `_count` come out untyped, its buckets as one sample per series).
#[tokio::test(flavor = "current_thread")]
async fn the_parser_reads_every_line_of_a_scrape() {
    let (_, text) = scrape(busy_metrics()).await;
    let (types, samples, _) = parse(&text);
    let sample_lines = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count();
    let read: usize = samples
        .values()
        .flatten()
        .map(|s| match &s.value {
            Value::Histogram(buckets) => buckets.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(read, sample_lines, "{text}");
    for (name, found) in &samples {
        let untyped = found.iter().any(|s| matches!(s.value, Value::Untyped(_)));
        let histogram_part = ["_sum", "_count"]
            .iter()
            .any(|suffix| name.strip_suffix(suffix).is_some_and(|n| types.get(n).is_some_and(|t| t == "histogram")));
        assert!(!untyped || histogram_part, "{name} has no TYPE");
    }
    assert!(text.ends_with('\n') && !text.contains("# EOF"), "Prometheus text 0.0.4, not OpenMetrics");
    assert!(has_line(&text, "model_agent_models_root_writable NaN"), "{text}");
}

fn bench_env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Every per-model series for each of `keys`: a Hub download that ended after a 429, and an
/// object store download verified.
#[inline(never)]
fn bench_populate(m: &Metrics, keys: &[ModelKey]) {
    for key in keys {
        m.download_ended(
            key,
            &ended(Ok(Finished { bytes_total: 1 << 30, ..Finished::default() })),
            Duration::from_secs(9),
            true,
        );
        m.download_ended(key, &rate_limited(Some(30_000)), Duration::ZERO, false);
        m.download_ended(key, &md5_mismatch(), Duration::from_secs(1), true);
    }
}

/// Per-model updates of models that have their series: the hot path's cost.
#[inline(never)]
fn bench_updates(m: &Metrics, keys: &[ModelKey], rounds: usize) {
    for _ in 0..rounds {
        for key in keys {
            m.model_outcome(key, true);
        }
    }
}

#[inline(never)]
fn bench_counters(m: &Metrics, count: usize) {
    for _ in 0..count {
        m.inc(&m.watch_errors);
    }
}

#[inline(never)]
fn bench_scrape(m: &Metrics) -> usize {
    m.render().expect("the metrics encode").len()
}

/// The loop's pruning every 500 ms with every model kept.
#[inline(never)]
fn bench_retain(m: &Metrics, rounds: usize) {
    for _ in 0..rounds {
        m.retain_models(|_| true);
    }
}

/// The workload `scripts/bench-metrics` measures under valgrind, each part in a function of its
/// own: BENCH_MODELS models (1,000) with every per-model series, BENCH_ROUNDS (10) rounds of
/// updates, counter increments and pruning, and one scrape (unless BENCH_SCRAPE=0).
#[test]
#[ignore = "a workload for scripts/bench-metrics (valgrind), not a check"]
fn bench_workload() {
    let (models, rounds) = (bench_env("BENCH_MODELS", 1000), bench_env("BENCH_ROUNDS", 10));
    let keys: Vec<ModelKey> = (0..models).map(|i| ModelKey::namespaced("bench", &format!("model-{i:05}"))).collect();
    let m = Metrics::default();
    bench_populate(&m, &keys);
    bench_updates(&m, &keys, rounds);
    bench_counters(&m, models * rounds);
    bench_retain(&m, rounds);
    if bench_env("BENCH_SCRAPE", 1) == 1 {
        println!("scrape_bytes {}", bench_scrape(&m));
    }
}
