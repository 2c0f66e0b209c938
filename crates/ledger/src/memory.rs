//! The in-memory ledger: one process, no durability.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, ListFilter,
    OperationRecord, ReconcileClaim, Renew, Resolve,
};

/// A [`Ledger`] in process memory.
///
/// It gives one process everything but durability: concurrent runs of one key exclude each
/// other, a finished operation is replayed, the window is kept across `send`s of the same
/// key. It dies with the process; for keys that must outlive it, use `SqliteLedger` or
/// `PostgresLedger`. Clones share the rows.
///
/// # Examples
///
/// ```
/// use idempotent_retry_ledger::MemoryLedger;
///
/// let ledger = MemoryLedger::new();
/// // `Client::builder().ledger(ledger.clone())` in `idempotent-retry`; clones share the rows.
/// assert!(ledger.clone().is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryLedger {
    rows: Arc<Mutex<HashMap<String, OperationRecord>>>,
}

impl MemoryLedger {
    /// An empty ledger.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How many rows it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds no rows.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, OperationRecord>> {
        // A panic while holding the lock cannot leave a row half-written (each rule writes a
        // row only after its checks, and nothing between its field writes can panic), so a
        // poisoned map is still consistent.
        self.rows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn claim_now(&self, claim: &Claim) -> Claimed {
        let mut rows = self.lock();
        let Some(row) = rows.get_mut(&claim.key) else {
            let record = claim.new_row();
            rows.insert(claim.key.clone(), record.clone());
            return Claimed::New(record);
        };
        if !claim.may_take_over(row) {
            return Claimed::Existing(row.clone());
        }
        let previous = claim.take_over(row);
        Claimed::TakenOver {
            record: row.clone(),
            previous,
        }
    }

    /// Applies `write` to the row of `key`, or answers the lease lost when there is none.
    fn write(
        &self,
        key: &str,
        write: impl FnOnce(&mut OperationRecord) -> Result<(), LedgerError>,
    ) -> Result<(), LedgerError> {
        match self.lock().get_mut(key) {
            Some(row) => write(row),
            None => Err(LedgerError::lease_lost(key)),
        }
    }
}

impl Ledger for MemoryLedger {
    fn clock(&self) -> LedgerFuture<'_, crate::LedgerClock> {
        // One process, one clock: the caller's.
        Box::pin(std::future::ready(Ok(crate::LedgerClock::Caller)))
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        let claimed = self.claim_now(claim);
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        let result = self.write(&update.key, |row| update.apply(row));
        Box::pin(std::future::ready(result))
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        let result = self.write(&renew.key, |row| renew.apply(row));
        Box::pin(std::future::ready(result))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        let result = self.write(&finish.key, |row| finish.apply(row));
        Box::pin(std::future::ready(result))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        let row = self.lock().get(key).cloned();
        Box::pin(std::future::ready(Ok(row)))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        let mut rows = self.lock();
        let doomed: Vec<String> = rows
            .values()
            .filter(|row| row.expires_at <= now)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|row| row.key.clone())
            .collect();
        for key in &doomed {
            rows.remove(key);
        }
        let deleted = u64::try_from(doomed.len()).unwrap_or(u64::MAX);
        Box::pin(std::future::ready(Ok(deleted)))
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        let mut rows = self.lock();
        let claimed = rows.get_mut(&claim.key).map(|row| {
            if !claim.may_take(row) {
                return Claimed::Existing(row.clone());
            }
            let previous = claim.hold(row);
            Claimed::TakenOver {
                record: row.clone(),
                previous,
            }
        });
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        let result = self.write(&resolve.key, |row| resolve.apply(row));
        Box::pin(std::future::ready(result))
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        let listed = filter.apply(self.lock().values());
        Box::pin(std::future::ready(listed))
    }
}
