//! Test doubles of a [`Ledger`]: an in-memory ledger whose claims pass through a hook.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, ListFilter,
    MemoryLedger, OperationRecord, ReconcileClaim, Renew, Resolve,
};

type Hook = dyn Fn(&Claim, Claimed) -> Result<Claimed, LedgerError> + Send + Sync;

/// A [`MemoryLedger`] whose every claim's answer goes through `hook` (which may count it,
/// move a clock, fail it or answer something else); everything else is the inner ledger's.
#[derive(Clone)]
pub struct ClaimHook {
    pub inner: MemoryLedger,
    hook: Arc<Hook>,
    /// How long each claim takes before it reaches the inner ledger (real time).
    delay: Duration,
    /// How long each finish takes before it reaches the inner ledger (real time).
    finish_delay: Duration,
}

impl fmt::Debug for ClaimHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimHook")
            .field("inner", &self.inner)
            .finish()
    }
}

impl ClaimHook {
    pub fn new(
        inner: MemoryLedger,
        hook: impl Fn(&Claim, Claimed) -> Result<Claimed, LedgerError> + Send + Sync + 'static,
    ) -> Self {
        ClaimHook {
            inner,
            hook: Arc::new(hook),
            delay: Duration::ZERO,
            finish_delay: Duration::ZERO,
        }
    }

    /// Every finish first waits `delay`.
    pub fn finish_delay(mut self, delay: Duration) -> Self {
        self.finish_delay = delay;
        self
    }

    /// Every claim first waits `delay`, as a slow store's would.
    pub fn claim_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

impl Ledger for ClaimHook {
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        Box::pin(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            let claimed = self.inner.claim(claim).await?;
            (self.hook)(claim, claimed)
        })
    }
    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        self.inner.record_attempt(update)
    }
    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        self.inner.renew(renew)
    }
    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            if !self.finish_delay.is_zero() {
                tokio::time::sleep(self.finish_delay).await;
            }
            self.inner.finish(finish).await
        })
    }
    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        self.inner.get(key)
    }
    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        self.inner.purge_batch(now, limit)
    }
    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        self.inner.claim_unresolved(claim)
    }
    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        self.inner.resolve(resolve)
    }
    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        self.inner.list(filter)
    }
}

pub use idempotent_retry::ledger::sql::ddl_0_1;
