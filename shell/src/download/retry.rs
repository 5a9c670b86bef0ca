//! Per-request retries: which errors are worth another try soon, and how long to wait before it.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use tokio::sync::watch;

use super::DownloadError;
use crate::hf::HfError;

const BACKOFF_BASE_MS: u64 = 500;
const BACKOFF_MAX_MS: u64 = 30_000;
/// A longer `Retry-After` goes back to the caller (the core backs off that long, without a task waiting).
pub(super) const RETRY_AFTER_WAIT_MS_MAX: u64 = 60_000;

/// The failures of one request in a row (progress resets them: a slow transfer that keeps moving is
/// never given up on).
pub(super) struct Retry {
    attempts_max: u32,
    failures: u32,
}

impl Retry {
    pub fn new(attempts_max: u32) -> Retry {
        Retry { attempts_max: attempts_max.max(1), failures: 0 }
    }

    /// After `error`: how long to wait before trying again, or `None` to give up and report it.
    pub fn next_wait(&mut self, error: &HfError, progressed: bool) -> Option<Duration> {
        self.next((retriable(error), error.retry_after_ms()), progressed)
    }

    /// The same for a transfer's failure, from the Hub or an object store.
    pub fn next_wait_download(&mut self, error: &DownloadError, progressed: bool) -> Option<Duration> {
        match error {
            DownloadError::Hub(error) => self.next_wait(error, progressed),
            DownloadError::Store(error) => self.next((error.retry_now(), error.retry_after_ms()), progressed),
            _ => None,
        }
    }

    fn next(&mut self, (retriable, retry_after_ms): (bool, Option<u64>), progressed: bool) -> Option<Duration> {
        if !retriable {
            return None;
        }
        if progressed {
            self.failures = 0;
        }
        self.failures += 1;
        if self.failures >= self.attempts_max {
            return None;
        }
        if let Some(after_ms) = retry_after_ms {
            return (after_ms <= RETRY_AFTER_WAIT_MS_MAX).then(|| Duration::from_millis(after_ms + jitter_ms(250)));
        }
        if progressed {
            return Some(Duration::ZERO);
        }
        let backoff_ms = BACKOFF_BASE_MS.saturating_mul(1 << (self.failures - 1).min(16)).min(BACKOFF_MAX_MS);
        // ±50 %: a fleet that failed together does not retry together.
        Some(Duration::from_millis(backoff_ms / 2 + jitter_ms(backoff_ms)))
    }
}

/// 408, 429, 5xx, network errors, stalls and cuts, and a transfer whose bytes did not verify.
fn retriable(error: &HfError) -> bool {
    matches!(
        error,
        HfError::RateLimited { .. }
            | HfError::Server { .. }
            | HfError::Network { .. }
            | HfError::Stalled { .. }
            | HfError::Truncated { .. }
            | HfError::Integrity { .. }
    )
}

/// A random wait in `0..below_ms` (the std hasher's random keys; no generator to carry around).
fn jitter_ms(below_ms: u64) -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher
        .write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.finish() % below_ms.max(1)
}

/// Resolves when `cancel` turns true; never if its sender is gone (nobody can cancel any more).
pub(super) async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// `work`, unless `cancel` turns true first.
pub(super) async fn until_cancelled<T>(
    cancel: &mut watch::Receiver<bool>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, DownloadError> {
    if *cancel.borrow() {
        return Err(DownloadError::Cancelled);
    }
    tokio::select! {
        biased;
        () = cancelled(cancel) => Err(DownloadError::Cancelled),
        out = work => Ok(out),
    }
}

/// Sleeps `wait`, unless cancelled first.
pub(super) async fn pause(cancel: &mut watch::Receiver<bool>, wait: Duration) -> Result<(), DownloadError> {
    until_cancelled(cancel, tokio::time::sleep(wait)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_retry_after_and_give_up_on_what_waiting_cannot_fix() {
        let mut retry = Retry::new(5);
        let limited = HfError::RateLimited { retry_after_ms: Some(2_000) };
        let wait = retry.next_wait(&limited, false).unwrap();
        assert!(wait >= Duration::from_millis(2_000) && wait < Duration::from_millis(2_250), "{wait:?}");
        let too_long = HfError::RateLimited { retry_after_ms: Some(RETRY_AFTER_WAIT_MS_MAX + 1) };
        assert_eq!(Retry::new(5).next_wait(&too_long, false), None);
        let gated = HfError::Gated { repo_id: "o/r".into(), token_sent: false };
        assert_eq!(Retry::new(5).next_wait(&gated, false), None);
        let server = HfError::Server { status: 503, retry_after_ms: None };
        let mut retry = Retry::new(3);
        assert!(retry.next_wait(&server, false).unwrap() <= Duration::from_millis(750));
        assert!(retry.next_wait(&server, false).unwrap() <= Duration::from_millis(1_500));
        assert_eq!(retry.next_wait(&server, false), None, "the third failure in a row gives up");
        let mut retry = Retry::new(2);
        for _ in 0..10 {
            assert_eq!(retry.next_wait(&server, true), Some(Duration::ZERO), "progress resets the count");
        }
    }
}
