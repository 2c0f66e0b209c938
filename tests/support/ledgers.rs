//! Test doubles of a [`Ledger`]: an in-memory ledger whose claims pass through a hook, and
//! whose renewals and first finish can be made to fail or to wait for the test.

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
    /// Every renewal fails (the store is unreachable for them).
    renewals_fail: bool,
    /// The first finish waits here until the test lets it go.
    finish_gate: Option<Arc<Gate>>,
}

/// Where a finish stops until the test lets it go: `reached` once it is there.
#[derive(Debug)]
pub struct Gate {
    pub reached: tokio::sync::Notify,
    open: tokio::sync::Semaphore,
    used: std::sync::atomic::AtomicBool,
}

impl Default for Gate {
    fn default() -> Self {
        Gate {
            reached: tokio::sync::Notify::new(),
            open: tokio::sync::Semaphore::new(0),
            used: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl Gate {
    /// Lets the finish waiting at the gate go on.
    pub fn open(&self) {
        self.open.add_permits(1);
    }
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
            renewals_fail: false,
            finish_gate: None,
        }
    }

    /// Every renewal fails, as when the store is unreachable: a lease nobody else renews lapses.
    pub fn renewals_fail(mut self) -> Self {
        self.renewals_fail = true;
        self
    }

    /// The first finish stops at `gate` (a run frozen with its answer in hand).
    pub fn finish_gate(mut self, gate: Arc<Gate>) -> Self {
        self.finish_gate = Some(gate);
        self
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
    fn clock(&self) -> LedgerFuture<'_, idempotent_retry::ledger::LedgerClock> {
        self.inner.clock()
    }
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
        if self.renewals_fail {
            return Box::pin(async { Err(LedgerError::unavailable("the store is unreachable")) });
        }
        self.inner.renew(renew)
    }
    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            if let Some(gate) = &self.finish_gate
                && !gate.used.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                gate.reached.notify_one();
                gate.open.acquire().await.expect("open").forget();
            }
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
