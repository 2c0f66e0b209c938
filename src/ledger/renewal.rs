//! A run's lease kept alive on its own timer: renewed every third of
//! [`LedgerOptions::lease`](super::LedgerOptions::lease) while the run lives (during an attempt,
//! a wait, the finish), so a short lease never lapses under a live run, and a dead run's key is
//! free within one lease.
//!
//! The keeper is a future polled beside the run's own work on the same task ([`kept`]): no task
//! is spawned, and when the run's work ends (or its caller drops it) the keeper ends with it.
//! Its timer is tokio's, not the client's injected [`Sleeper`](crate::time::Sleeper): a lease
//! lapses in real time, and a test's virtual sleeper, which answers every sleep at once, would
//! renew in a loop. Under tokio's paused clock it still advances only when nothing else can run.
//!
//! A renewal that fails is tried again (every tenth of the lease) until the lease would end;
//! then, or at once when another run holds the row, the lease is lost: the run sends nothing
//! more ([`LeaseKeeper::lost`]).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::{Ledger, LedgerError, LedgerErrorKind, Renew, later};
use crate::time::Clock;
use crate::time::readable::duration as human;

/// Now on tokio's clock, the keeper's timer (not the client's injected one: see the module's
/// docs).
pub(crate) fn real_now() -> Instant {
    crate::time::TokioClock::new().now()
}

/// How long after it was set a lease is renewed: a third of its length, never more often
/// than every millisecond however short it is.
pub(crate) fn renew_every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// What the keeper and the run share of one lease.
#[derive(Debug)]
pub(crate) struct LeaseKeeper {
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    key: String,
    owner: String,
    lease: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the lease in the ledger was last set (the claim, a record, a renewal): it ends one
    /// lease after this.
    renewed_at: Instant,
    /// Why the run lost its lease, once it has.
    lost: Option<(LedgerErrorKind, String)>,
}

impl LeaseKeeper {
    /// The lease of `key` held by `owner`, set at `renewed_at` for `lease`.
    pub(crate) fn new(
        ledger: Arc<dyn Ledger>,
        clock: Arc<dyn Clock>,
        key: String,
        owner: String,
        lease: Duration,
        renewed_at: Instant,
    ) -> Self {
        LeaseKeeper {
            ledger,
            clock,
            key,
            owner,
            lease,
            state: Mutex::new(State {
                renewed_at,
                lost: None,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lease was set again at `at` by another write of the run (an attempt's record).
    pub(crate) fn renewed(&self, at: Instant) {
        let mut state = self.state();
        state.renewed_at = state.renewed_at.max(at);
    }

    /// The client's wall clock, as every time the run writes is read.
    pub(crate) fn wall(&self) -> std::time::SystemTime {
        self.clock.wall()
    }

    /// Why the run lost its lease, if it has: it must send nothing more.
    pub(crate) fn lost(&self) -> Option<LedgerError> {
        let state = self.state();
        let (kind, message) = state.lost.as_ref()?;
        Some(LedgerError::new(*kind, message.clone()))
    }

    /// The renewal every third of the lease, until the lease is lost. Never ends while the
    /// lease is kept; a zero lease renews nothing.
    pub(crate) async fn keep(&self) {
        if self.lease.is_zero() {
            return std::future::pending().await;
        }
        let every = renew_every(self.lease);
        let retry_every = (self.lease / 10).max(Duration::from_millis(1));
        loop {
            // A lease too long for the clock (`Duration::MAX`) never needs renewing.
            let Some(due) = self.state().renewed_at.checked_add(every) else {
                return std::future::pending().await;
            };
            tokio::time::sleep_until(due).await;
            let renewed_at = self.state().renewed_at;
            // Another write may have renewed the lease meanwhile: wait for the new due time.
            if renewed_at
                .checked_add(every)
                .is_none_or(|due| due > real_now())
            {
                continue;
            }
            let Some(ends) = renewed_at.checked_add(self.lease) else {
                return std::future::pending().await;
            };
            loop {
                let left = ends.saturating_duration_since(real_now());
                if left.is_zero() {
                    self.lose(LedgerError::unavailable(format!(
                        "could not renew the lease of operation {} before it ended ({}, \
                         LedgerOptions::lease): the run sends nothing more, and another run \
                         may take the key over",
                        self.key,
                        human(self.lease)
                    )));
                    return std::future::pending().await;
                }
                let started = real_now();
                let at = self.clock.wall();
                let renewal = Renew::new(
                    self.key.as_str(),
                    self.owner.as_str(),
                    at,
                    later(at, self.lease),
                );
                let written = match renewal {
                    Ok(renewal) => {
                        super::bounded::within(
                            &crate::time::TokioSleeper,
                            left,
                            "cannot renew the lease",
                            self.ledger.renew(&renewal),
                        )
                        .await
                    }
                    Err(err) => Err(err),
                };
                match written {
                    Ok(()) => {
                        let mut state = self.state();
                        state.renewed_at = state.renewed_at.max(started);
                        break;
                    }
                    Err(err) if err.kind() == LedgerErrorKind::LeaseLost => {
                        self.lose(err);
                        return std::future::pending().await;
                    }
                    Err(err) => {
                        tracing::warn!(
                            key = self.key.as_str(),
                            error = %err,
                            "could not renew the lease; trying again within it"
                        );
                        let left = ends.saturating_duration_since(real_now());
                        tokio::time::sleep(retry_every.min(left)).await;
                    }
                }
            }
        }
    }

    fn lose(&self, err: LedgerError) {
        tracing::warn!(
            key = self.key.as_str(),
            error = %err,
            "the run lost its lease: it sends nothing more"
        );
        self.state()
            .lost
            .get_or_insert_with(|| (err.kind(), err.message().to_owned()));
    }
}

/// `work`, with `keeper` renewing the lease beside it on the same task; ends when `work` does.
/// The keeper is polled first, so a lease it finds lost is seen by `work` in the same poll.
pub(crate) async fn kept<F: Future>(keeper: &LeaseKeeper, work: F) -> F::Output {
    let mut keep = std::pin::pin!(keeper.keep());
    let mut work = std::pin::pin!(work);
    std::future::poll_fn(|cx| {
        // The keeper never ends on its own (lost or not, it stays pending).
        let _ = keep.as_mut().poll(cx);
        work.as_mut().poll(cx)
    })
    .await
}

/// A wait of `sleep` that ends early, with `true`, once `keeper` has lost the lease.
pub(crate) async fn wait_unless_lost(
    keeper: Option<&LeaseKeeper>,
    sleep: impl Future<Output = ()>,
) -> bool {
    let mut sleep = std::pin::pin!(sleep);
    std::future::poll_fn(|cx| {
        if keeper.is_some_and(|keeper| keeper.state().lost.is_some()) {
            return Poll::Ready(true);
        }
        sleep.as_mut().poll(cx).map(|()| false)
    })
    .await
}
