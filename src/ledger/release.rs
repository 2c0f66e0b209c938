//! Leases given back by runs their callers abandoned, while the write is in flight, and claims
//! still in flight on a task of their own.
//!
//! A dropped run cannot await its release (a destructor does not await), so the release goes
//! to a spawned task. Until that task has written it, the ledger still shows the lease; a run
//! of the same key that starts in this process right after (an agent's retry, straight after
//! its own timeout) would find it held. So each release in flight is registered here, by key,
//! and a claim first waits for one of its key: in this process the next run always sees the
//! lease released. A claim that had to wait for its ledger runs on a task registered the same
//! way, so a run of the key that follows a caller dropped mid-claim finds that claim landed and,
//! the caller being gone, given back. Another process sees a release once its write lands, as
//! with any other finish.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// Releases in flight, by idempotency key; each gate is held until its release is written.
static IN_FLIGHT: LazyLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Mutex::default);

/// How many keys [`IN_FLIGHT`] holds, so a claim with none to wait for takes no lock.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn in_flight() -> MutexGuard<'static, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
    // Every change under the lock is one map operation: a panic cannot leave it half-done.
    IN_FLIGHT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `release` on a task of its own, registered under `key` until it completes. Without a
/// tokio runtime (the caller is being torn down with it) nothing runs: the lease then lapses
/// on its own, as after a crash.
pub(crate) fn spawn(key: String, release: impl Future<Output = ()> + Send + 'static) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let gate = Arc::new(tokio::sync::Mutex::new(()));
    let held = Arc::clone(&gate)
        .try_lock_owned()
        .expect("a lock made a line above is free");
    if in_flight().insert(key.clone(), Arc::clone(&gate)).is_none() {
        COUNT.fetch_add(1, Ordering::AcqRel);
    }
    runtime.spawn(async move {
        release.await;
        drop(held);
        let mut map = in_flight();
        if map
            .get(&key)
            .is_some_and(|current| Arc::ptr_eq(current, &gate))
        {
            map.remove(&key);
            COUNT.fetch_sub(1, Ordering::AcqRel);
        }
    });
}

/// Waits until no release of `key` is in flight in this process.
pub(crate) async fn settled(key: &str) {
    if COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    let gate = in_flight().get(key).cloned();
    if let Some(gate) = gate {
        drop(gate.lock().await);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_claim_waits_for_its_key_only() {
        let written = Arc::new(AtomicBool::new(false));
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let flag = Arc::clone(&written);
        spawn("release-test-a".to_owned(), async move {
            let _ = wait.await;
            flag.store(true, Ordering::SeqCst);
        });
        // Another key does not wait.
        tokio::time::timeout(Duration::from_secs(5), settled("release-test-b"))
            .await
            .expect("no release of this key");
        let waiting = tokio::spawn(settled("release-test-a"));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the release is not written yet");
        go.send(()).expect("the release waits");
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("settled once written")
            .expect("no panic");
        assert!(written.load(Ordering::SeqCst));
    }
}
