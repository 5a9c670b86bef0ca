//! The admin endpoint on the same listener, so that another process (a script, the agent's e2e test) can
//! flip faults and read the log: `/_fakeoci/faults`, `/_fakeoci/requests`, `/_fakeoci/bytes`. Unsigned,
//! not logged, never faulted.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::Shared;
use crate::faults::{Fault, ObjectBytes};

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route("/_fakeoci/faults", get(armed_faults).post(add_fault).delete(clear_faults))
        .route("/_fakeoci/requests", get(requests).delete(clear_requests))
        .route("/_fakeoci/bytes", get(bytes))
}

async fn armed_faults(State(shared): State<Arc<Shared>>) -> Json<Vec<Fault>> {
    Json(shared.faults.armed())
}

/// Body: one [`Fault`] as JSON, e.g. `{"kind":"rate_limit","count":3,"retry_after_s":1}`.
async fn add_fault(State(shared): State<Arc<Shared>>, Json(fault): Json<Fault>) -> StatusCode {
    shared.faults.add(fault);
    StatusCode::NO_CONTENT
}

async fn clear_faults(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.faults.clear();
    StatusCode::NO_CONTENT
}

async fn requests(State(shared): State<Arc<Shared>>) -> Json<Value> {
    Json(json!({ "requests": shared.log.snapshot(), "dropped": shared.log.dropped() }))
}

/// Forgets the request log and the byte counters.
async fn clear_requests(State(shared): State<Arc<Shared>>) -> StatusCode {
    shared.log.clear();
    shared.bytes.clear();
    StatusCode::NO_CONTENT
}

async fn bytes(State(shared): State<Arc<Shared>>) -> Json<Vec<ObjectBytes>> {
    Json(shared.bytes.snapshot())
}
