//! Kubernetes Events on a model that turned Failed on this node, so `kubectl describe` shows why
//! and where. Fire and forget, and rate limited: a storm of failures (a root turning read-only
//! under a thousand models) must not become a storm of writes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};

use model_agent_core::{Kind, ModelKey, Uid};

use crate::kubeio::FIELD_MANAGER;

/// Events per minute at most, from one agent.
const EVENTS_PER_MINUTE_MAX: u32 = 30;
/// An event's message at most (the API server takes 1 KiB of note for events.k8s.io).
const MESSAGE_BYTES_MAX: usize = 1_000;
pub const REASON: &str = "FailedOnNode";

#[derive(Clone)]
pub struct Events {
    client: Client,
    node: String,
    budget: Arc<Mutex<Budget>>,
}

/// Events sent in the current minute.
struct Budget {
    minute_from: Instant,
    sent: u32,
}

impl Budget {
    fn take(&mut self, now: Instant) -> bool {
        if now.duration_since(self.minute_from) >= Duration::from_secs(60) {
            (self.minute_from, self.sent) = (now, 0);
        }
        self.sent = self.sent.saturating_add(1);
        self.sent <= EVENTS_PER_MINUTE_MAX
    }
}

impl Events {
    pub fn new(client: Client, node: String) -> Events {
        let budget = Budget { minute_from: Instant::now(), sent: 0 };
        Events { client, node, budget: Arc::new(Mutex::new(budget)) }
    }

    /// One Warning event on the model (in its namespace; `default` for a ClusterBaseModel, as
    /// for any cluster-scoped object), unless this minute's budget is spent.
    pub fn failed(&self, key: &ModelKey, uid: &Uid, reason: &str) {
        if !self.take() {
            model_log!(debug, key, uid, "event not sent: at most {EVENTS_PER_MINUTE_MAX} a minute");
            return;
        }
        let event = failed_event(key, uid, &self.node, reason);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let (key, uid) = (key.clone(), uid.clone());
        tokio::spawn(async move {
            let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
            // Bounded: a silent API server would otherwise keep each task (30 a minute) for good.
            match tokio::time::timeout(crate::kubeio::WRITE_REQUEST_TIMEOUT, api.create(&params, &event)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => model_log!(warn, key, uid, error = %e, "could not record the Failed event"),
                Err(_) => {
                    model_log!(warn, key, uid, "could not record the Failed event: the API server did not answer")
                }
            }
        });
    }

    fn take(&self) -> bool {
        self.budget.lock().unwrap_or_else(|e| e.into_inner()).take(Instant::now())
    }
}

fn failed_event(key: &ModelKey, uid: &Uid, node: &str, reason: &str) -> Event {
    let (kind, namespace) = match key.kind {
        Kind::ClusterBaseModel => ("ClusterBaseModel", None),
        Kind::BaseModel => ("BaseModel", Some(key.namespace.to_string())),
    };
    let mut message = format!("node {node}: {reason}");
    if message.len() > MESSAGE_BYTES_MAX {
        let cut = (0..=MESSAGE_BYTES_MAX).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
        message.truncate(cut);
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", key.name)),
            namespace: Some(namespace.clone().unwrap_or_else(|| "default".into())),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("ome.io/v1beta1".into()),
            kind: Some(kind.into()),
            name: Some(key.name.to_string()),
            namespace,
            uid: Some(uid.as_str().to_string()),
            ..ObjectReference::default()
        },
        reason: Some(REASON.into()),
        message: Some(message),
        type_: Some("Warning".into()),
        source: Some(EventSource { component: Some("model-agent".into()), host: Some(node.into()) }),
        reporting_component: Some("model-agent".into()),
        reporting_instance: Some(node.into()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Event::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_thirty_events_a_minute() {
        let start = Instant::now();
        let mut budget = Budget { minute_from: start, sent: 0 };
        assert!((0..EVENTS_PER_MINUTE_MAX).all(|_| budget.take(start)));
        assert!(!budget.take(start + Duration::from_secs(59)), "the 31st in the minute");
        assert!(budget.take(start + Duration::from_secs(60)), "a new minute");
    }

    #[test]
    fn the_event_names_the_model_the_node_and_the_reason() {
        let key = ModelKey::namespaced("team-a", "llama");
        let e = failed_event(&key, &Uid::new("u-1"), "gpu-7", "gated: ask for access");
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        let o = &e.involved_object;
        assert_eq!(
            (o.kind.as_deref(), o.name.as_deref(), o.uid.as_deref()),
            (Some("BaseModel"), Some("llama"), Some("u-1"))
        );
        assert_eq!(e.message.as_deref(), Some("node gpu-7: gated: ask for access"));
        let cluster = failed_event(&ModelKey::cluster("m"), &Uid::new("u"), "n", &"é".repeat(2_000));
        assert_eq!(cluster.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(cluster.involved_object.namespace, None);
        assert!(cluster.message.unwrap().len() <= MESSAGE_BYTES_MAX);
    }
}
