//! Leases given back by runs their callers abandoned, while the write is in flight, and claims
//! still in flight on a task of their own.
//!
//! A dropped run cannot await its release (a destructor does not await), so the release goes
//! to a spawned task. Until that task has written it, the ledger still shows the lease; a run
//! of the same key that starts in this process right after (an agent's retry, straight after
//! its own timeout) would find it held. So each release in flight is registered with the
//! client's ledger handle, by key, and a claim first waits for one of its key, for at most the
//! ledger's call timeout: through one client (and its clones) the next run sees the lease
//! released. The registry belongs to the client, not the process: two clients, on two ledgers
//! or one, never wait for each other's keys; to a second client a release in flight looks as it
//! does to another process. A claim that had to wait for its ledger runs on a task registered the same
//! way, so a run of the key that follows a caller dropped mid-claim finds that claim landed and,
//! the caller being gone, given back. Another process sees a release once its write lands, as
//! with any other finish.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One client's releases in flight, by idempotency key; each gate is held until its release is
/// written.
#[derive(Debug, Default)]
pub(crate) struct Releases {
    in_flight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// How many keys `in_flight` holds, so a claim with none to wait for takes no lock.
    count: AtomicUsize,
}

impl Releases {
    fn in_flight(&self) -> MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        // Every change under the lock is one map operation: a panic cannot leave it half-done.
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `release` on a task of its own, registered under `key` until it completes. Without
    /// a tokio runtime (the caller is being torn down with it) nothing runs: the lease then
    /// lapses on its own, as after a crash.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        key: String,
        release: impl Future<Output = ()> + Send + 'static,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&gate)
            .try_lock_owned()
            .expect("a lock made a line above is free");
        if self
            .in_flight()
            .insert(key.clone(), Arc::clone(&gate))
            .is_none()
        {
            self.count.fetch_add(1, Ordering::AcqRel);
        }
        let registry = Arc::clone(self);
        runtime.spawn(async move {
            release.await;
            drop(held);
            let mut map = registry.in_flight();
            if map
                .get(&key)
                .is_some_and(|current| Arc::ptr_eq(current, &gate))
            {
                map.remove(&key);
                registry.count.fetch_sub(1, Ordering::AcqRel);
            }
        });
    }

    /// Waits until no release of `key` is in flight, for at most `limit` (after which the
    /// claim goes ahead and finds the row as the ledger has it).
    pub(crate) async fn settled(&self, key: &str, limit: Duration) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let gate = self.in_flight().get(key).cloned();
        if let Some(gate) = gate {
            let _ = tokio::time::timeout(limit, gate.lock()).await;
        }
    }
}

impl Releases {
    /// Waits until no release of any key is in flight, for at most `limit`; `true` when none
    /// is left.
    pub(crate) async fn all_settled(&self, limit: Duration) -> bool {
        let waited = tokio::time::timeout(limit, async {
            loop {
                let gates: Vec<_> = self.in_flight().values().cloned().collect();
                if gates.is_empty() {
                    return;
                }
                for gate in gates {
                    drop(gate.lock().await);
                }
                // The gate is dropped before its key leaves the map: let the task finish.
                tokio::task::yield_now().await;
            }
        });
        waited.await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_claim_waits_for_its_key_only_and_only_on_its_own_client() {
        let releases = Arc::new(Releases::default());
        let written = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let flag = Arc::clone(&written);
        releases.spawn("a".to_owned(), async move {
            let _ = wait.await;
            flag.store(true, Ordering::SeqCst);
        });
        // Another key does not wait, nor the same key on another client's registry.
        tokio::time::timeout(LIMIT, releases.settled("b", LIMIT))
            .await
            .expect("no release of this key");
        tokio::time::timeout(LIMIT, Releases::default().settled("a", LIMIT))
            .await
            .expect("another client's registry");
        let waiting = tokio::spawn({
            let releases = Arc::clone(&releases);
            async move { releases.settled("a", LIMIT).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the release is not written yet");
        go.send(()).expect("the release waits");
        tokio::time::timeout(LIMIT, waiting)
            .await
            .expect("settled once written")
            .expect("no panic");
        assert!(written.load(Ordering::SeqCst));
    }

    // The bound is tokio's timer (see the module docs): the test reads tokio's paused clock.
    #[allow(clippy::disallowed_methods)]
    #[tokio::test(start_paused = true)]
    async fn a_release_that_never_lands_holds_a_claim_up_for_the_limit_only() {
        let releases = Arc::new(Releases::default());
        releases.spawn("stuck".to_owned(), std::future::pending());
        let started = tokio::time::Instant::now();
        releases.settled("stuck", Duration::from_secs(10)).await;
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn all_settled_waits_for_every_key_and_says_when_one_never_lands() {
        let releases = Arc::new(Releases::default());
        assert!(releases.all_settled(LIMIT).await, "nothing in flight");
        let (go_a, wait_a) = tokio::sync::oneshot::channel::<()>();
        let (go_b, wait_b) = tokio::sync::oneshot::channel::<()>();
        let written = Arc::new(AtomicUsize::new(0));
        for (key, wait) in [("a", wait_a), ("b", wait_b)] {
            let written = Arc::clone(&written);
            releases.spawn(key.to_owned(), async move {
                let _ = wait.await;
                written.fetch_add(1, Ordering::SeqCst);
            });
        }
        let waiting = tokio::spawn({
            let releases = Arc::clone(&releases);
            async move { releases.all_settled(LIMIT).await }
        });
        go_b.send(()).expect("b waits");
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a is not written yet");
        go_a.send(()).expect("a waits");
        assert!(waiting.await.expect("no panic"), "both written");
        assert_eq!(written.load(Ordering::SeqCst), 2);
        assert_eq!(releases.count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn all_settled_gives_up_after_its_limit() {
        let releases = Arc::new(Releases::default());
        releases.spawn("stuck".to_owned(), std::future::pending());
        assert!(!releases.all_settled(Duration::from_secs(3)).await);
    }
}
