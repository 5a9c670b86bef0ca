//! Fault switches, the request log and per-object byte counters: settable and readable while the server
//! runs, from the library or through the admin endpoint.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One fault switch. Each applies to its next `count` matching requests, then is spent. Object faults match
/// GET requests for object `object` of bucket `bucket`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// 429 `TooManyRequests` with `Retry-After: {retry_after_s}`, before the signature is checked.
    RateLimit { count: u32, retry_after_s: u64 },
    /// 503 `ServiceUnavailable` with `Retry-After: {retry_after_s}`.
    ServiceUnavailable { count: u32, retry_after_s: u64 },
    /// The full `Content-Length`, then the connection closes after `after_bytes` body bytes.
    Truncate { bucket: String, object: String, after_bytes: u64, count: u32 },
    /// `after_bytes` body bytes, then nothing for `stall_ms`, then the connection closes.
    Stall { bucket: String, object: String, after_bytes: u64, stall_ms: u64, count: u32 },
    /// Wrong bytes served (one byte flipped in the middle of the object), with the right headers: the
    /// download's MD5 does not match `Content-MD5` / `opc-meta-md5`.
    WrongBytes { bucket: String, object: String, count: u32 },
}

impl Fault {
    fn count_mut(&mut self) -> &mut u32 {
        match self {
            Fault::RateLimit { count, .. }
            | Fault::ServiceUnavailable { count, .. }
            | Fault::Truncate { count, .. }
            | Fault::Stall { count, .. }
            | Fault::WrongBytes { count, .. } => count,
        }
    }

    fn object(&self) -> Option<(&str, &str)> {
        match self {
            Fault::Truncate { bucket, object, .. }
            | Fault::Stall { bucket, object, .. }
            | Fault::WrongBytes { bucket, object, .. } => Some((bucket, object)),
            Fault::RateLimit { .. } | Fault::ServiceUnavailable { .. } => None,
        }
    }
}

/// What a request-level fault answers instead: status and `Retry-After`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RequestFault {
    pub status: u16,
    pub retry_after_s: u64,
}

/// What happens to one object body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct BodyPlan {
    pub truncate_after_bytes: Option<u64>,
    pub stall: Option<(u64, u64)>,
    pub wrong_bytes: bool,
}

/// The armed faults, in the order they were added.
#[derive(Debug, Default)]
pub struct Faults {
    armed: Mutex<Vec<Fault>>,
}

impl Faults {
    pub fn add(&self, fault: Fault) {
        self.armed.lock().unwrap().push(fault);
    }

    pub fn clear(&self) {
        self.armed.lock().unwrap().clear();
    }

    /// The faults still armed, with their remaining counts.
    pub fn armed(&self) -> Vec<Fault> {
        self.armed.lock().unwrap().clone()
    }

    /// Spends one count of the first request-level fault.
    pub(crate) fn take_request_fault(&self) -> Option<RequestFault> {
        let mut armed = self.armed.lock().unwrap();
        let index = armed.iter().position(|fault| fault.object().is_none())?;
        let answer = match armed[index] {
            Fault::RateLimit { retry_after_s, .. } => RequestFault { status: 429, retry_after_s },
            Fault::ServiceUnavailable { retry_after_s, .. } => RequestFault { status: 503, retry_after_s },
            _ => unreachable!("filtered above"),
        };
        spend(&mut armed, index);
        Some(answer)
    }

    /// Spends one count of each object fault for (`bucket`, `object`) and says what to do to the body.
    pub(crate) fn take_body_plan(&self, bucket: &str, object: &str) -> BodyPlan {
        let mut armed = self.armed.lock().unwrap();
        let mut plan = BodyPlan::default();
        let mut index = 0;
        while index < armed.len() {
            if armed[index].object() != Some((bucket, object)) {
                index += 1;
                continue;
            }
            match armed[index] {
                Fault::Truncate { after_bytes, .. } => plan.truncate_after_bytes = Some(after_bytes),
                Fault::Stall { after_bytes, stall_ms, .. } => plan.stall = Some((after_bytes, stall_ms)),
                Fault::WrongBytes { .. } => plan.wrong_bytes = true,
                Fault::RateLimit { .. } | Fault::ServiceUnavailable { .. } => {}
            }
            if !spend(&mut armed, index) {
                index += 1;
            }
        }
        plan
    }
}

/// Spends one count; removes the fault when spent and says so.
fn spend(armed: &mut Vec<Fault>, index: usize) -> bool {
    let count = armed[index].count_mut();
    *count = count.saturating_sub(1);
    if *count == 0 {
        armed.remove(index);
        return true;
    }
    false
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    pub host: Option<String>,
    pub range: Option<String>,
    pub authorization: bool,
    /// Why the signature was refused (401), if it was.
    pub auth_refused: Option<String>,
    pub status: u16,
    pub opc_request_id: String,
}

/// The last `entries_max` requests (older ones are dropped and counted).
#[derive(Debug)]
pub struct RequestLog {
    entries: Mutex<VecDeque<RequestRecord>>,
    entries_max: usize,
    dropped: AtomicU64,
}

impl RequestLog {
    pub fn new(entries_max: usize) -> Self {
        RequestLog { entries: Mutex::new(VecDeque::new()), entries_max, dropped: AtomicU64::new(0) }
    }

    pub fn push(&self, record: RequestRecord) {
        let mut entries = self.entries.lock().unwrap();
        if entries.len() >= self.entries_max {
            entries.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        entries.push_back(record);
    }

    pub fn snapshot(&self) -> Vec<RequestRecord> {
        self.entries.lock().unwrap().iter().cloned().collect()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn clear(&self) {
        self.entries.lock().unwrap().clear();
        self.dropped.store(0, Ordering::Relaxed);
    }
}

/// Body bytes sent per object (`bucket` + `object`), counted as they are handed to the socket.
#[derive(Debug, Default)]
pub struct ByteCounters {
    by_object: Mutex<BTreeMap<(String, String), Arc<AtomicU64>>>,
}

impl ByteCounters {
    pub(crate) fn counter(&self, bucket: &str, object: &str) -> Arc<AtomicU64> {
        let mut by_object = self.by_object.lock().unwrap();
        by_object.entry((bucket.to_owned(), object.to_owned())).or_default().clone()
    }

    pub fn get(&self, bucket: &str, object: &str) -> u64 {
        let by_object = self.by_object.lock().unwrap();
        by_object.get(&(bucket.to_owned(), object.to_owned())).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn snapshot(&self) -> Vec<ObjectBytes> {
        let by_object = self.by_object.lock().unwrap();
        let entries = by_object.iter();
        entries
            .map(|((bucket, object), c)| ObjectBytes {
                bucket: bucket.clone(),
                object: object.clone(),
                bytes: c.load(Ordering::Relaxed),
            })
            .collect()
    }

    pub fn clear(&self) {
        self.by_object.lock().unwrap().clear();
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectBytes {
    pub bucket: String,
    pub object: String,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_faults_are_spent_in_order() {
        let faults = Faults::default();
        faults.add(Fault::WrongBytes { bucket: "b".into(), object: "o".into(), count: 1 });
        faults.add(Fault::RateLimit { count: 2, retry_after_s: 1 });
        faults.add(Fault::ServiceUnavailable { count: 1, retry_after_s: 3 });
        let rate_limit = Some(RequestFault { status: 429, retry_after_s: 1 });
        assert_eq!(faults.take_request_fault(), rate_limit);
        assert_eq!(faults.take_request_fault(), rate_limit);
        assert_eq!(faults.take_request_fault(), Some(RequestFault { status: 503, retry_after_s: 3 }));
        assert_eq!(faults.take_request_fault(), None);
        assert_eq!(faults.armed().len(), 1, "the object fault is left");
    }

    #[test]
    fn body_plans_combine_and_spend_object_faults() {
        let faults = Faults::default();
        faults.add(Fault::Truncate { bucket: "b".into(), object: "o".into(), after_bytes: 5, count: 1 });
        faults.add(Fault::WrongBytes { bucket: "b".into(), object: "o".into(), count: 2 });
        assert_eq!(faults.take_body_plan("b", "other"), BodyPlan::default());
        let plan = faults.take_body_plan("b", "o");
        assert_eq!((plan.truncate_after_bytes, plan.wrong_bytes), (Some(5), true));
        let plan = faults.take_body_plan("b", "o");
        assert_eq!((plan.truncate_after_bytes, plan.wrong_bytes), (None, true));
        assert_eq!(faults.take_body_plan("b", "o"), BodyPlan::default());
        assert!(faults.armed().is_empty());
    }

    #[test]
    fn faults_read_from_admin_json() {
        let fault: Fault = serde_json::from_str(r#"{"kind":"rate_limit","count":3,"retry_after_s":2}"#).unwrap();
        assert_eq!(fault, Fault::RateLimit { count: 3, retry_after_s: 2 });
        let json = r#"{"kind":"wrong_bytes","bucket":"b","object":"m/w.bin","count":1}"#;
        let fault: Fault = serde_json::from_str(json).unwrap();
        assert_eq!(fault, Fault::WrongBytes { bucket: "b".into(), object: "m/w.bin".into(), count: 1 });
    }
}
