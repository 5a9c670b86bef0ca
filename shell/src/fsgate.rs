//! Filesystem calls with a deadline, for a models root that may hang (a dead NFS server, a
//! stuck FUSE daemon). A call runs on a thread of its own and the caller waits at most its
//! deadline; a call the kernel never returns keeps its thread, so the number of calls not yet
//! returned is capped, and past the cap new calls fail at once instead of piling up. Nothing
//! here blocks the loop, so liveness never depends on the filesystem, and the process can exit
//! with calls still stuck (plain threads are not joined, unlike tokio's blocking pool).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Deadline of a root probe; a probe past it is a failed probe (readiness says so).
pub const PROBE_DEADLINE: Duration = Duration::from_secs(5);
/// Deadline of a `local://` verification; past it the effect fails and is retried with backoff.
pub const VERIFY_DEADLINE: Duration = Duration::from_secs(10);
/// Reading a model's config files for its metadata (the reader gives up at its own 10 s).
pub const PARSE_DEADLINE: Duration = Duration::from_secs(15);
/// Deadline of moving a directory to the trash, and of the snapshot's scan.
pub const TRASH_DEADLINE: Duration = Duration::from_secs(30);
/// Deadline of a purge: a tree of many files takes a while on a healthy disk.
pub const PURGE_DEADLINE: Duration = Duration::from_secs(120);
/// Filesystem calls not yet returned at most (each holds a thread while the kernel holds it).
pub const CALLS_MAX: usize = 8;
/// Stack of a filesystem call's thread: the calls are shallow (the deepest is a purge's
/// recursion of at most `fsops::REMOVE_DEPTH_MAX` small frames).
const CALL_STACK_BYTES: usize = 256 * 1024;

/// Counts calls that have not returned, including those whose caller gave up.
#[derive(Clone, Default)]
pub struct FsGate {
    unreturned: Arc<AtomicUsize>,
}

impl FsGate {
    /// A gate whose count is `unreturned` (shared with the metrics, which show it live).
    pub fn counting(unreturned: Arc<AtomicUsize>) -> FsGate {
        FsGate { unreturned }
    }
}

/// Decrements the count when the call's closure returns (or unwinds).
struct Returned(Arc<AtomicUsize>);

impl Drop for Returned {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FsGate {
    /// Calls that have not returned yet (stuck or running).
    #[cfg(test)]
    fn unreturned(&self) -> usize {
        self.unreturned.load(Ordering::SeqCst)
    }

    /// Run `work` on its own thread and wait at most `deadline` for it. `what` names the call
    /// in errors ("verifying /mnt/models/x").
    pub async fn call<T: Send + 'static>(
        &self,
        what: &str,
        deadline: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        let before = self.unreturned.fetch_add(1, Ordering::SeqCst);
        let guard = Returned(self.unreturned.clone());
        if before >= CALLS_MAX {
            return Err(format!(
                "{what}: not started: {before} earlier calls to the models root have not returned (at most {CALLS_MAX})"
            ));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned =
            std::thread::Builder::new().name("fs-call".into()).stack_size(CALL_STACK_BYTES).spawn(move || {
                // Counted as returned before the caller hears of it; a panic drops `tx` unsent.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                drop(guard);
                if let Ok(value) = result {
                    let _ = tx.send(value);
                }
            });
        if let Err(e) = spawned {
            return Err(format!("{what}: no thread for the call: {e}"));
        }
        match tokio::time::timeout(deadline, rx).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(_)) => Err(format!("{what}: the call panicked")),
            Err(_) => Err(format!("{what}: the models root did not answer within {}", duration_text(deadline))),
        }
    }
}

impl FsGate {
    /// `call`, but at most one of a kind at a time, `running` saying one has not returned. A
    /// call stuck in the kernel would otherwise be joined by one more each time it is asked
    /// again (a probe every few seconds, a scan every drift period) until they fill the gate
    /// and every other call on the root is refused; while it is stuck, another fails at once.
    pub async fn call_alone<T: Send + 'static>(
        &self,
        running: &Arc<AtomicBool>,
        what: &str,
        deadline: Duration,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, String> {
        if running.swap(true, Ordering::SeqCst) {
            return Err(format!("{what}: not started: {ONE_BEFORE_UNRETURNED}"));
        }
        // Cleared when the work returns, or when the gate drops it unrun.
        let clear = ClearOnDrop(running.clone());
        self.call(what, deadline, move || {
            let _clear = clear;
            work()
        })
        .await
    }
}

/// How `call_alone` ends an error when the call of its kind before has not returned.
pub const ONE_BEFORE_UNRETURNED: &str = "the one before has not returned";

struct ClearOnDrop(Arc<AtomicBool>);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// "5 s", or "20 ms" below a second.
pub fn duration_text(d: Duration) -> String {
    if d >= Duration::from_secs(1) { format!("{} s", d.as_secs()) } else { format!("{} ms", d.as_millis()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_that_never_returns_fails_at_its_deadline_and_the_rest_are_capped() {
        let gate = FsGate::default();
        assert_eq!(gate.call("quick", Duration::from_secs(5), || 7).await, Ok(7));
        assert_eq!(gate.unreturned(), 0);
        // Calls that block until released, as a dead NFS server blocks stat(2).
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        for i in 0..CALLS_MAX {
            let rx = release_rx.clone();
            let e = gate.call("stat", Duration::from_millis(20), move || rx.lock().unwrap().recv()).await;
            assert_eq!(e.unwrap_err(), "stat: the models root did not answer within 20 ms", "call {i}");
        }
        assert_eq!(gate.unreturned(), CALLS_MAX);
        // Past the cap, a call fails at once without a thread.
        let e = gate.call("probe", Duration::from_secs(60), || ()).await.unwrap_err();
        assert!(e.contains("8 earlier calls to the models root have not returned"), "{e}");
        assert_eq!(gate.unreturned(), CALLS_MAX, "the refused call is not counted");
        // The filesystem answers again: the stuck threads return and calls run again.
        for _ in 0..CALLS_MAX {
            release_tx.send(()).unwrap();
        }
        for _ in 0..200 {
            if gate.unreturned() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(gate.unreturned(), 0);
        assert_eq!(gate.call("quick", Duration::from_secs(5), || 8).await, Ok(8));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_alone_stuck_in_the_kernel_takes_one_thread_however_often_it_is_asked() {
        let (gate, scanning) = (FsGate::default(), Arc::new(AtomicBool::new(false)));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let e = gate.call_alone(&scanning, "scan", Duration::from_millis(20), move || release_rx.recv().is_ok()).await;
        assert_eq!(e.unwrap_err(), "scan: the models root did not answer within 20 ms");
        for _ in 0..2 * CALLS_MAX {
            let e = gate.call_alone(&scanning, "scan", Duration::from_secs(60), || true).await.unwrap_err();
            assert_eq!(e, "scan: not started: the one before has not returned");
        }
        assert_eq!(gate.unreturned(), 1, "only the stuck call holds a thread");
        // Calls of other kinds still run.
        assert_eq!(gate.call("probe", Duration::from_secs(5), || 3).await, Ok(3));
        release_tx.send(()).unwrap();
        for _ in 0..200 {
            if !scanning.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!((gate.unreturned(), scanning.load(Ordering::SeqCst)), (0, false));
        assert_eq!(gate.call_alone(&scanning, "scan", Duration::from_secs(5), || false).await, Ok(false));
        assert!(!scanning.load(Ordering::SeqCst), "cleared once the call returned");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_call_alone_refused_by_a_full_gate_leaves_its_kind_free() {
        let (gate, scanning) = (FsGate::default(), Arc::new(AtomicBool::new(false)));
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        for _ in 0..CALLS_MAX {
            let rx = release_rx.clone();
            let _ = gate.call("stat", Duration::from_millis(5), move || rx.lock().unwrap().recv()).await;
        }
        let e = gate.call_alone(&scanning, "scan", Duration::from_secs(5), || ()).await.unwrap_err();
        assert!(e.starts_with("scan: not started: 8 earlier calls"), "{e}");
        assert!(!scanning.load(Ordering::SeqCst), "the unrun call does not hold its kind");
        for _ in 0..CALLS_MAX {
            release_tx.send(()).unwrap();
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panicking_call_is_an_error_and_is_not_left_counted() {
        let gate = FsGate::default();
        let e = gate.call("boom", Duration::from_secs(5), || -> u8 { panic!("boom") }).await.unwrap_err();
        assert_eq!(e, "boom: the call panicked");
        assert_eq!(gate.unreturned(), 0);
    }
}
