//! A process killed mid-flight, inside one test process.
//!
//! Dropping a future (a timeout, an aborted task) runs its destructors: that is cancellation,
//! which the crate handles by releasing its ledger lease at once. A process that is killed runs
//! nothing. [`die_when`] polls a future until a condition holds and then forgets it, so none of
//! its destructors run and whatever it held (a ledger lease, a connection) is left exactly as a
//! killed process leaves it.

use std::future::Future;

/// Polls `work` until `until` completes, then forgets `work` without dropping it. Panics if
/// `work` finishes first (the test meant to kill it mid-flight).
pub async fn die_when<W, U>(work: W, until: U)
where
    W: Future,
    W::Output: std::fmt::Debug,
    U: Future,
{
    // The "process" dies here: no destructor of `work` runs.
    std::mem::forget(poll_until(work, until).await);
}

/// Polls `work` until `until` completes, then drops it: a caller that gives up (its own
/// timeout, a `select!`), at exactly the point `until` marks. Panics if `work` finishes first.
pub async fn drop_when<W, U>(work: W, until: U)
where
    W: Future,
    W::Output: std::fmt::Debug,
    U: Future,
{
    drop(poll_until(work, until).await);
}

/// `work`, polled until `until` completes and handed back unfinished.
async fn poll_until<W, U>(work: W, until: U) -> std::pin::Pin<Box<W>>
where
    W: Future,
    W::Output: std::fmt::Debug,
    U: Future,
{
    let mut work = Box::pin(work);
    tokio::select! {
        biased;
        _ = until => {}
        done = &mut work => panic!("the work finished before it could be stopped: {done:?}"),
    }
    work
}
