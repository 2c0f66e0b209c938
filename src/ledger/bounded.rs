//! Every ledger call bounded: a call that does not answer within
//! [`LedgerOptions::call_timeout`](super::LedgerOptions::call_timeout) fails with
//! [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable), so a frozen database
//! holds an operation up for that long, never for ever.
//!
//! Measured on tokio's timer, not on the client's injected [`Sleeper`]: a database's silence
//! is real time, and a test's virtual sleeper, which answers every sleep at once, would
//! otherwise fail every ledger call that does not answer on its first poll. Under tokio's
//! paused clock the bound still advances only when nothing else can run.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, ListFilter,
    OperationRecord, ReconcileClaim, Renew, Resolve,
};
use crate::time::readable::duration as human;
use crate::time::{Sleeper, TokioSleeper};

/// `call`, or an `Unavailable` error naming `what` once `limit` has passed on `sleeper`. The
/// call is dropped when it times out (every [`Ledger`] leaves a dropped call's row as it was or
/// as the call would have left it).
///
/// # Errors
///
/// The call's own error, or `Unavailable` when it timed out.
pub(crate) async fn within<T>(
    sleeper: &dyn Sleeper,
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, LedgerError>>,
) -> Result<T, LedgerError> {
    let mut call = std::pin::pin!(call);
    let mut deadline = sleeper.sleep(limit);
    let timed_out = std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = call.as_mut().poll(cx) {
            return Poll::Ready(Some(result));
        }
        deadline.as_mut().poll(cx).map(|()| None)
    })
    .await;
    timed_out.unwrap_or_else(|| {
        Err(LedgerError::unavailable(format!(
            "{what}: the ledger did not answer within {} (LedgerOptions::call_timeout); is the \
             database reachable?",
            human(limit)
        )))
    })
}

/// A ledger whose every call but the claim is bounded by [`within`]. The claim is bounded by
/// the run that makes it (`session.rs`), which also gives back a claim that lands after it
/// stopped waiting.
#[derive(Debug)]
pub(crate) struct Bounded {
    pub(crate) inner: Arc<dyn Ledger>,
    pub(crate) limit: Duration,
}

impl Bounded {
    fn call<'a, T: Send + 'a>(
        &'a self,
        what: &'static str,
        call: LedgerFuture<'a, T>,
    ) -> LedgerFuture<'a, T> {
        Box::pin(within(&TokioSleeper, self.limit, what, call))
    }
}

impl Ledger for Bounded {
    fn clock(&self) -> LedgerFuture<'_, super::LedgerClock> {
        self.call("cannot read the ledger's clock", self.inner.clock())
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        self.inner.claim(claim)
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        self.call(
            "cannot record the attempt",
            self.inner.record_attempt(update),
        )
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        self.call("cannot renew the lease", self.inner.renew(renew))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        self.call("cannot record the outcome", self.inner.finish(finish))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        self.call("cannot read the operation", self.inner.get(key))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        self.call("cannot purge", self.inner.purge_batch(now, limit))
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        self.call(
            "cannot hold the operation to reconcile it",
            self.inner.claim_unresolved(claim),
        )
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        self.call("cannot record the resolution", self.inner.resolve(resolve))
    }

    fn unresolved(
        &self,
        limit: u32,
        older_than: SystemTime,
    ) -> LedgerFuture<'_, Vec<OperationRecord>> {
        self.call(
            "cannot list unresolved operations",
            self.inner.unresolved(limit, older_than),
        )
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        self.call("cannot list operations", self.inner.list(filter))
    }

    fn due<'a>(
        &'a self,
        query: &'a super::outbox::DueQuery,
    ) -> LedgerFuture<'a, Vec<super::outbox::QueuedOperation>> {
        self.call("cannot read the due operations", self.inner.due(query))
    }

    fn take_due<'a>(
        &'a self,
        take: &'a super::outbox::TakeDue,
    ) -> LedgerFuture<'a, Vec<super::outbox::Taken>> {
        self.call("cannot take the due operations", self.inner.take_due(take))
    }

    fn backlog(&self, now: SystemTime) -> LedgerFuture<'_, super::outbox::Backlog> {
        self.call(
            "cannot count the queued operations",
            self.inner.backlog(now),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerErrorKind;

    // The bound is tokio's timer (see the module docs): the test reads tokio's paused clock.
    #[allow(clippy::disallowed_methods)]
    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_fails_after_the_limit_and_one_that_does_answers() {
        let never = std::future::pending::<Result<(), LedgerError>>();
        let started = tokio::time::Instant::now();
        let err = within(
            &TokioSleeper,
            Duration::from_secs(10),
            "cannot claim",
            never,
        )
        .await
        .expect_err("a frozen ledger");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable);
        assert_eq!(
            err.to_string(),
            "ledger unavailable: cannot claim: the ledger did not answer within 10s \
             (LedgerOptions::call_timeout); is the database reachable?"
        );
        let answered = within(&TokioSleeper, Duration::from_secs(10), "x", async { Ok(7) })
            .await
            .expect("answered");
        assert_eq!(answered, 7);
    }
}
