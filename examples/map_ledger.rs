//! A `Ledger` of your own: operations kept in a `Mutex<HashMap>`, written with the crate's
//! public API only, as it would be outside the crate, then proved and used.
//!
//! Run it with `cargo run --example map_ledger --features testkit`. It
//!
//! 1. runs the crate's ledger conformance suite on it (the process exits non-zero if any case
//!    fails, with the report on stderr);
//! 2. sends one keyed POST through a `Client` with it, against the testkit's loopback
//!    receiver, where the first attempt's answer is lost after the charge committed: the
//!    retry with the same key is answered without a second charge;
//! 3. sends the same operation again (a redelivered job): it is answered from the ledger,
//!    and nothing is sent.
//!
//! It implements the reconciling methods too (`claim_unresolved`, `resolve`, `list`), so a
//! `Reconciler`, `Client::reconcile_unresolved` and the operators' command work on it; a ledger
//! that leaves them to the trait's provided methods still compiles, and answers unresolved
//! rows past their window with `ReconcileWindow` as before.
//!
//! A store with real durability (a database, a key-value service) follows the same shape:
//! the claim's check-and-write in one conditional write (an `INSERT ... ON CONFLICT`, a
//! conditional put), the holder checks in the update's condition.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerErrorKind, LedgerFuture,
    ListFilter, OperationRecord, OperationStatus, ReconcileClaim, Resolve,
};
use idempotent_retry::{Client, RetryReport};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, RecordingSleeper, When};

/// Operations in process memory, one row per idempotency key. Clones share the rows.
#[derive(Debug, Clone, Default)]
struct MapLedger {
    rows: Arc<Mutex<HashMap<String, OperationRecord>>>,
}

impl MapLedger {
    fn rows(&self) -> MutexGuard<'_, HashMap<String, OperationRecord>> {
        // Every change below is made on a clone and stored in one assignment, so a panic while
        // the lock is held leaves no half-written row: a poisoned map is still consistent.
        self.rows.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The claim: check and write under one lock, so concurrent claims of a key cannot both
    /// acquire it.
    fn claim_now(&self, claim: &Claim) -> Result<Claimed, LedgerError> {
        let mut rows = self.rows();
        let Some(row) = rows.get(&claim.key) else {
            let mut builder = OperationRecord::builder(
                &claim.key,
                &claim.fingerprint,
                claim.now,
                claim.expires_at,
            )
            .scope(&claim.scope)
            .lease(&claim.owner, claim.lease_until);
            if let (Some(method), Some(url)) = (&claim.method, &claim.url) {
                builder = builder.request(method, url);
            }
            let record = builder.build()?;
            rows.insert(claim.key.clone(), record.clone());
            return Ok(Claimed::New(record));
        };
        if !claim.may_take_over(row) {
            return Ok(Claimed::Existing(row.clone()));
        }
        // The window start, the attempts and the retention stay; the response goes. A row no
        // receiver saw becomes the claim's request, in a new window.
        let previous = row.status;
        let mut record = row.clone();
        if previous == OperationStatus::NotSent {
            record.scope.clone_from(&claim.scope);
            record.fingerprint.clone_from(&claim.fingerprint);
            record.method.clone_from(&claim.method);
            record.url.clone_from(&claim.url);
            record.first_attempt_at = claim.now;
            record.expires_at = record.expires_at.max(claim.expires_at);
        }
        record.status = OperationStatus::InFlight;
        record.lease_owner = Some(claim.owner.clone());
        record.lease_expires_at = Some(claim.lease_until);
        record.response = None;
        rows.insert(claim.key.clone(), record.clone());
        Ok(Claimed::TakenOver { record, previous })
    }

    /// Changes the row `key` if `owner` holds its lease; refuses with `LeaseLost` otherwise.
    fn as_holder(
        &self,
        key: &str,
        owner: &str,
        change: impl FnOnce(&mut OperationRecord),
    ) -> Result<(), LedgerError> {
        let mut rows = self.rows();
        match rows.get(key) {
            Some(row)
                if row.status == OperationStatus::InFlight
                    && row.lease_owner.as_deref() == Some(owner) =>
            {
                let mut row = row.clone();
                change(&mut row);
                rows.insert(key.to_owned(), row);
                Ok(())
            }
            _ => Err(LedgerError::new(
                LedgerErrorKind::LeaseLost,
                format!("operation {key} is not held by {owner}"),
            )),
        }
    }
}

impl Ledger for MapLedger {
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        Box::pin(std::future::ready(self.claim_now(claim)))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        let result = self.as_holder(&update.key, &update.owner, |row| {
            row.attempts = row.attempts.saturating_add(1);
            row.last_attempt_at = Some(update.at);
            row.lease_expires_at = Some(update.lease_until);
        });
        Box::pin(std::future::ready(result))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        let result = self.as_holder(&finish.key, &finish.owner, |row| {
            row.status = finish.status;
            row.response = finish.response.clone();
            row.lease_owner = None;
            row.lease_expires_at = None;
            if let Some(at) = finish.last_attempt_at {
                row.attempts = row.attempts.saturating_add(1);
                row.last_attempt_at = Some(at);
            }
        });
        Box::pin(std::future::ready(result))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        Box::pin(std::future::ready(Ok(self.rows().get(key).cloned())))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        let mut rows = self.rows();
        let expired: Vec<String> = rows
            .values()
            .filter(|row| row.expires_at <= now)
            .map(|row| row.key.clone())
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect();
        for key in &expired {
            rows.remove(key);
        }
        let deleted = u64::try_from(expired.len()).unwrap_or(u64::MAX);
        Box::pin(std::future::ready(Ok(deleted)))
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        let mut rows = self.rows();
        let claimed = rows.get_mut(&claim.key).map(|row| {
            if !claim.may_take(row) {
                return Claimed::Existing(row.clone());
            }
            let previous = row.status;
            row.status = OperationStatus::InFlight;
            row.lease_owner = Some(claim.owner.clone());
            row.lease_expires_at = Some(claim.lease_until);
            Claimed::TakenOver {
                record: row.clone(),
                previous,
            }
        });
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        let result = self.as_holder(&resolve.key, &resolve.owner, |row| {
            row.status = resolve.status;
            row.response = resolve.response.clone();
            row.lease_owner = None;
            row.lease_expires_at = None;
            if let Some(from) = resolve.window_from {
                row.first_attempt_at = from;
            }
            if let Some(keep) = resolve.keep_until {
                row.expires_at = row.expires_at.max(keep);
            }
            if let Some(note) = &resolve.note {
                row.resolution = Some(note.clone());
            }
        });
        Box::pin(std::future::ready(result))
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        if filter.limit == 0 {
            let refused = LedgerError::new(
                LedgerErrorKind::InvalidInput,
                "list limit must be at least 1",
            );
            return Box::pin(std::future::ready(Err(refused)));
        }
        let mut rows: Vec<OperationRecord> = self
            .rows()
            .values()
            .filter(|row| filter.selects(row))
            .cloned()
            .collect();
        rows.sort_by(|a, b| (a.first_attempt_at, &a.key).cmp(&(b.first_attempt_at, &b.key)));
        rows.truncate(usize::try_from(filter.limit).unwrap_or(usize::MAX));
        Box::pin(std::future::ready(Ok(rows)))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let report = testkit::ledger_conformance(|| async { MapLedger::default() }).await;
    if !report.passed() {
        eprintln!("{report}");
        return ExitCode::FAILURE;
    }
    println!("{report}");
    match one_operation().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One charge through a client keeping its operations in a [`MapLedger`].
async fn one_operation() -> Result<(), Box<dyn StdError>> {
    let receiver = Receiver::builder().scope("shop.charge").start().await?;
    let key = testkit::fixed_key(42);
    // The first attempt charges, then its answer is lost.
    receiver.inject(When::key_attempt(&key, 1), Fault::ResetAfterCommit);
    let ledger = MapLedger::default();
    let client = Client::builder()
        .http(testkit::loopback_http()?)
        .ledger(ledger.clone())
        .sleeper(RecordingSleeper::instant())
        .rng_seed(7)
        .build()?;
    let charge = || {
        client
            .post(receiver.url("/v1/charges"))
            .idempotency_key(key.clone())
            .json(&serde_json::json!({ "amount": 1999, "currency": "eur" }))
    };

    let response = charge().send().await?;
    let status = response.status();
    let attempts = RetryReport::of(&response).map_or(0, RetryReport::attempts);
    let body = response.text().await?;
    println!("sent: {status} after {attempts} attempts: {body}");
    let row = ledger
        .get(key.as_str())
        .await?
        .ok_or("the ledger has no row for the key")?;
    println!(
        "ledger row {}: {} after {} attempts",
        row.key, row.status, row.attempts
    );

    // Redelivered: answered from the ledger, nothing sent.
    let again = charge().send().await?;
    let replayed = RetryReport::of(&again).is_some_and(RetryReport::is_replayed);
    println!(
        "sent again: {} replayed from the ledger: {replayed}",
        again.status()
    );

    let charges = receiver.effects_for(key.as_str());
    println!(
        "charges: {charges}, requests that arrived: {}",
        receiver.arrivals()
    );
    if status != 200 || attempts != 2 || row.status != OperationStatus::Succeeded {
        return Err(format!(
            "expected 200 after 2 attempts, succeeded; got {status} after {attempts}, {}",
            row.status
        )
        .into());
    }
    if !replayed || charges != 1 || receiver.arrivals() != 2 {
        return Err(format!("expected one charge, two arrivals and a replay; got {charges} charges, {} arrivals, replayed {replayed}", receiver.arrivals()).into());
    }
    Ok(())
}
