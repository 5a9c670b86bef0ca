//! Fault switches, the request log and per-file byte counters: settable and readable while the server runs,
//! from the library or through the admin endpoint.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Which listener a request-level fault applies to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    All,
    Hub,
    Cdn,
}

/// The listener a request arrived on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Listener {
    Hub,
    Cdn,
}

impl Scope {
    fn covers(self, listener: Listener) -> bool {
        matches!((self, listener), (Scope::All, _) | (Scope::Hub, Listener::Hub) | (Scope::Cdn, Listener::Cdn))
    }
}

/// One fault switch. Each applies to its next `count` matching requests, then is spent. File faults match
/// GET requests for `path` of repo `repo` (on the Hub for regular files, on the CDN for LFS files).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// 429 with `Retry-After: {retry_after_s}`.
    RateLimit {
        count: u32,
        retry_after_s: u64,
        #[serde(default)]
        scope: Scope,
    },
    /// `status` (a 5xx) with a short body.
    ServerError {
        count: u32,
        status: u16,
        #[serde(default)]
        scope: Scope,
    },
    /// The full `Content-Length`, then the connection closes after `after_bytes` body bytes.
    Truncate { repo: String, path: String, after_bytes: u64, count: u32 },
    /// `after_bytes` body bytes, then nothing for `stall_ms`, then the connection closes.
    Stall { repo: String, path: String, after_bytes: u64, stall_ms: u64, count: u32 },
    /// The body has one byte flipped (in the middle of the file), so it does not match its hash.
    Corrupt { repo: String, path: String, count: u32 },
    /// `Range` is ignored: 200 with the whole file (as some mirrors do).
    IgnoreRange { repo: String, path: String, count: u32 },
}

impl Fault {
    fn count_mut(&mut self) -> &mut u32 {
        match self {
            Fault::RateLimit { count, .. }
            | Fault::ServerError { count, .. }
            | Fault::Truncate { count, .. }
            | Fault::Stall { count, .. }
            | Fault::Corrupt { count, .. }
            | Fault::IgnoreRange { count, .. } => count,
        }
    }

    fn file(&self) -> Option<(&str, &str)> {
        match self {
            Fault::Truncate { repo, path, .. }
            | Fault::Stall { repo, path, .. }
            | Fault::Corrupt { repo, path, .. }
            | Fault::IgnoreRange { repo, path, .. } => Some((repo, path)),
            Fault::RateLimit { .. } | Fault::ServerError { .. } => None,
        }
    }
}

/// What a request-level fault makes the server answer instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestFault {
    RateLimit { retry_after_s: u64 },
    ServerError { status: u16 },
}

/// What happens to one file body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodyPlan {
    pub truncate_after_bytes: Option<u64>,
    pub stall: Option<(u64, u64)>,
    pub corrupt: bool,
    pub ignore_range: bool,
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

    /// Spends one count of the first request-level fault that covers `listener`.
    pub(crate) fn take_request_fault(&self, listener: Listener) -> Option<RequestFault> {
        let mut armed = self.armed.lock().unwrap();
        let index = armed.iter().position(|fault| match fault {
            Fault::RateLimit { scope, .. } | Fault::ServerError { scope, .. } => scope.covers(listener),
            _ => false,
        })?;
        let answer = match armed[index] {
            Fault::RateLimit { retry_after_s, .. } => RequestFault::RateLimit { retry_after_s },
            Fault::ServerError { status, .. } => RequestFault::ServerError { status },
            _ => unreachable!("filtered above"),
        };
        spend(&mut armed, index);
        Some(answer)
    }

    /// Spends one count of each file fault for (`repo`, `path`) and says what to do to the body.
    pub(crate) fn take_body_plan(&self, repo: &str, path: &str) -> BodyPlan {
        let mut armed = self.armed.lock().unwrap();
        let mut plan = BodyPlan::default();
        let mut index = 0;
        while index < armed.len() {
            if armed[index].file() != Some((repo, path)) {
                index += 1;
                continue;
            }
            match armed[index] {
                Fault::Truncate { after_bytes, .. } => plan.truncate_after_bytes = Some(after_bytes),
                Fault::Stall { after_bytes, stall_ms, .. } => plan.stall = Some((after_bytes, stall_ms)),
                Fault::Corrupt { .. } => plan.corrupt = true,
                Fault::IgnoreRange { .. } => plan.ignore_range = true,
                Fault::RateLimit { .. } | Fault::ServerError { .. } => {}
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
    pub listener: Listener,
    /// The port of the listener that took it.
    pub port: u16,
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    /// The `Host` header.
    pub host: Option<String>,
    pub range: Option<String>,
    pub authorization: bool,
    pub status: u16,
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

/// Body bytes sent per file (`repo` + `path`), on either listener, counted as they are handed to the socket.
#[derive(Debug, Default)]
pub struct ByteCounters {
    by_file: Mutex<BTreeMap<(String, String), Arc<AtomicU64>>>,
}

impl ByteCounters {
    pub(crate) fn counter(&self, repo: &str, path: &str) -> Arc<AtomicU64> {
        let mut by_file = self.by_file.lock().unwrap();
        by_file.entry((repo.to_owned(), path.to_owned())).or_default().clone()
    }

    pub fn get(&self, repo: &str, path: &str) -> u64 {
        let by_file = self.by_file.lock().unwrap();
        by_file.get(&(repo.to_owned(), path.to_owned())).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn snapshot(&self) -> Vec<FileBytes> {
        let by_file = self.by_file.lock().unwrap();
        let files = by_file.iter();
        files
            .map(|((repo, path), c)| FileBytes {
                repo: repo.clone(),
                path: path.clone(),
                bytes: c.load(Ordering::Relaxed),
            })
            .collect()
    }

    pub fn clear(&self) {
        self.by_file.lock().unwrap().clear();
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBytes {
    pub repo: String,
    pub path: String,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_faults_are_spent_in_order() {
        let faults = Faults::default();
        faults.add(Fault::RateLimit { count: 2, retry_after_s: 1, scope: Scope::Hub });
        faults.add(Fault::ServerError { count: 1, status: 503, scope: Scope::All });
        assert_eq!(faults.take_request_fault(Listener::Cdn), Some(RequestFault::ServerError { status: 503 }));
        assert_eq!(faults.take_request_fault(Listener::Cdn), None);
        assert_eq!(faults.take_request_fault(Listener::Hub), Some(RequestFault::RateLimit { retry_after_s: 1 }));
        assert_eq!(faults.take_request_fault(Listener::Hub), Some(RequestFault::RateLimit { retry_after_s: 1 }));
        assert_eq!(faults.take_request_fault(Listener::Hub), None);
    }

    #[test]
    fn body_plans_combine_and_spend_file_faults() {
        let faults = Faults::default();
        let (repo, path) = ("o/r".to_string(), "f".to_string());
        faults.add(Fault::Truncate { repo: repo.clone(), path: path.clone(), after_bytes: 5, count: 1 });
        faults.add(Fault::Corrupt { repo: repo.clone(), path: path.clone(), count: 2 });
        assert_eq!(faults.take_body_plan("o/r", "other"), BodyPlan::default());
        let plan = faults.take_body_plan("o/r", "f");
        assert_eq!((plan.truncate_after_bytes, plan.corrupt), (Some(5), true));
        let plan = faults.take_body_plan("o/r", "f");
        assert_eq!((plan.truncate_after_bytes, plan.corrupt), (None, true));
        assert_eq!(faults.take_body_plan("o/r", "f"), BodyPlan::default());
        assert!(faults.armed().is_empty());
    }

    #[test]
    fn faults_read_from_admin_json() {
        let fault: Fault = serde_json::from_str(r#"{"kind":"rate_limit","count":3,"retry_after_s":2}"#).unwrap();
        assert_eq!(fault, Fault::RateLimit { count: 3, retry_after_s: 2, scope: Scope::All });
    }
}
