//! Test doubles of a [`Ledger`]: an in-memory ledger whose claims pass through a hook.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotent_retry::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, MemoryLedger,
    OperationRecord,
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
}

/// The table and index exactly as the 0.1 `migrate` created them (it recorded no schema
/// version), with `body_type` for the response body column (`BLOB` in SQLite, `BYTEA` in
/// PostgreSQL). Frozen: the shape a store made by 0.1 has, whatever the schema is now.
pub fn ddl_0_1(body_type: &str) -> String {
    format!(
        "
CREATE TABLE IF NOT EXISTS idempotent_operations (
    key               TEXT PRIMARY KEY,
    scope             TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    status            TEXT NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  BIGINT NOT NULL,
    last_attempt_at   BIGINT,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    response_status   INTEGER,
    response_headers  TEXT,
    response_body     {body_type},
    expires_at        BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotent_operations_expires_at
    ON idempotent_operations (expires_at);"
    )
}
