//! One HTTP server on `--port`: `/healthz` and `/readyz` (readiness, from the core), `/livez`
//! (the agent's own loop is making progress; never the API server or the filesystem), each with
//! `?verbose`; `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use model_agent_core::machine::Readiness;

use crate::metrics::Metrics;

pub struct Shared {
    pub readiness: RwLock<Readiness>,
    /// Milliseconds since `epoch` when the core loop last ran.
    pub heartbeat_ms: AtomicU64,
    pub epoch: std::time::Instant,
    /// `/livez` fails when the loop has not run for this long.
    pub stall_ms_max: u64,
    pub metrics: Arc<Metrics>,
}

impl Shared {
    pub fn beat(&self) {
        self.heartbeat_ms.store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(readiness))
        .route("/healthz/model-agent-health", get(readiness))
        .route("/readyz", get(readiness))
        .route("/livez", get(liveness))
        .route("/livez/ping", get(liveness))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

fn verbose(q: &Option<String>) -> bool {
    q.as_deref().is_some_and(|q| q.split('&').any(|p| p == "verbose" || p.starts_with("verbose=")))
}

async fn readiness(State(s): State<Arc<Shared>>, RawQuery(q): RawQuery) -> impl IntoResponse {
    let r = s.readiness.read().expect("readiness lock").clone();
    let mut body = String::new();
    for c in &r.checks {
        if c.ok {
            if verbose(&q) {
                body.push_str(&format!("[+]{} ok: {}\n", c.name, c.detail));
            }
        } else {
            body.push_str(&format!("[-]{} failed: {}\n", c.name, c.detail));
        }
    }
    let code = if r.ready { StatusCode::OK } else { StatusCode::INTERNAL_SERVER_ERROR };
    body.push_str(if r.ready { "readyz check passed\n" } else { "readyz check failed\n" });
    if r.ready && !verbose(&q) {
        body = "ok".into();
    }
    (code, body)
}

async fn liveness(State(s): State<Arc<Shared>>, RawQuery(q): RawQuery) -> impl IntoResponse {
    let age_ms = (s.epoch.elapsed().as_millis() as u64).saturating_sub(s.heartbeat_ms.load(Ordering::Relaxed));
    let ok = age_ms <= s.stall_ms_max;
    let line = format!("loop: last ran {:.1} s ago (limit {} s)", age_ms as f64 / 1000.0, s.stall_ms_max / 1000);
    let body = match (ok, verbose(&q)) {
        (true, false) => "ok".to_string(),
        (true, true) => format!("[+]{line}\nlivez check passed\n"),
        (false, _) => format!("[-]{line}\nlivez check failed\n"),
    };
    (if ok { StatusCode::OK } else { StatusCode::INTERNAL_SERVER_ERROR }, body)
}

/// Prometheus text 0.0.4 always, as OME's Go client serves it to a plain Prometheus (no
/// OpenMetrics negotiation: one format, the one every Prometheus scrapes).
async fn metrics(State(s): State<Arc<Shared>>) -> impl IntoResponse {
    match s.metrics.render() {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "encoding the metrics failed\n".to_string(),
        ),
    }
}
