//! A `Ledger` of your own over a key-value store with conditional writes (the shape of
//! DynamoDB's conditional put, etcd's compare-and-swap or Redis `WATCH`), written with the
//! crate's public API only, as it would be outside the crate, then proved and used.
//!
//! Run it with `cargo run --example map_ledger`. It
//!
//! 1. runs the ledger conformance suite of `idempotent-retry-testkit` on it (the process exits
//!    non-zero if any case fails, with the report on stderr);
//! 2. sends one keyed POST through a `Client` with it, against the testkit's loopback
//!    receiver, where the first attempt's answer is lost after the charge committed: the
//!    retry with the same key is answered without a second charge;
//! 3. sends the same operation again (a redelivered job): it is answered from the ledger,
//!    and nothing is sent.
//!
//! The ledger is the storage and nothing else: every rule is the contract's own
//! ([`Claim::may_take_over`] and [`Claim::take_over`], [`AttemptUpdate::apply`],
//! [`Finish::apply`], [`ReconcileClaim::may_take`] and [`ReconcileClaim::hold`],
//! [`Resolve::apply`], [`ListFilter::apply`]), applied to a copy of the row that is written
//! back only if nobody wrote it in between. A lost race reads the row again and decides
//! again, so two workers' claims of one key acquire it once. The trait has no optional
//! method: a ledger that leaves out reconciling or listing does not compile.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerClock, LedgerError, LedgerFuture,
    ListFilter, OperationRecord, OperationStatus, ReconcileClaim, Renew, Resolve,
};
use idempotent_retry::{Client, RetryReport};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, RecordingSleeper, When};

/// A stand-in for a key-value service: each value has a version, and a write names the
/// version it read (`None`: the key must be absent), failing if another write came first.
#[derive(Debug, Default)]
struct Store {
    items: Mutex<HashMap<String, (u64, OperationRecord)>>,
}

impl Store {
    fn items(&self) -> MutexGuard<'_, HashMap<String, (u64, OperationRecord)>> {
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read(&self, key: &str) -> Option<(u64, OperationRecord)> {
        self.items().get(key).cloned()
    }

    /// Writes `row` if the key is still at version `read`; whether it was.
    fn put_if(&self, read: Option<u64>, row: OperationRecord) -> bool {
        let mut items = self.items();
        let now = items.get(&row.key).map(|(version, _)| *version);
        if now != read {
            return false;
        }
        let next = now.map_or(1, |v| v + 1);
        items.insert(row.key.clone(), (next, row));
        true
    }
}

/// Operations in the [`Store`], one item per idempotency key. Clones share the store.
#[derive(Debug, Clone, Default)]
struct MapLedger {
    store: Arc<Store>,
}

impl MapLedger {
    /// Reads the row, lets `decide` change a copy of it (or leave it), and writes it back
    /// if nobody wrote in between; reads and decides again otherwise.
    fn update<T>(
        &self,
        key: &str,
        mut decide: impl FnMut(Option<&mut OperationRecord>) -> Result<(T, bool), LedgerError>,
    ) -> Result<T, LedgerError> {
        loop {
            let read = self.store.read(key);
            let version = read.as_ref().map(|(v, _)| *v);
            let mut row = read.map(|(_, row)| row);
            let (answer, write) = decide(row.as_mut())?;
            match row {
                Some(row) if write => {
                    if self.store.put_if(version, row) {
                        return Ok(answer);
                    }
                }
                _ => return Ok(answer),
            }
        }
    }

    /// A holder's write: the rule's `apply` on the row, refused when there is none.
    fn as_holder(
        &self,
        key: &str,
        apply: impl Fn(&mut OperationRecord) -> Result<(), LedgerError>,
    ) -> Result<(), LedgerError> {
        self.update(key, |row| match row {
            Some(row) => apply(row).map(|()| ((), true)),
            None => Err(LedgerError::lease_lost(key)),
        })
    }
}

impl Ledger for MapLedger {
    fn clock(&self) -> LedgerFuture<'_, LedgerClock> {
        // One process's map: it compares on its callers' clock.
        Box::pin(std::future::ready(Ok(LedgerClock::Caller)))
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        let claimed = loop {
            let Some((version, mut row)) = self.store.read(&claim.key) else {
                let row = claim.new_row();
                if self.store.put_if(None, row.clone()) {
                    break Claimed::New(row);
                }
                continue;
            };
            if !claim.may_take_over(&row) {
                break Claimed::Existing(row);
            }
            let previous = claim.take_over(&mut row);
            if self.store.put_if(Some(version), row.clone()) {
                break Claimed::TakenOver {
                    record: row,
                    previous,
                };
            }
        };
        Box::pin(std::future::ready(Ok(claimed)))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        let written = self.as_holder(&update.key, |row| update.apply(row));
        Box::pin(std::future::ready(written))
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        let written = self.as_holder(&renew.key, |row| renew.apply(row));
        Box::pin(std::future::ready(written))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        let written = self.as_holder(&finish.key, |row| finish.apply(row));
        Box::pin(std::future::ready(written))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        let row = self.store.read(key).map(|(_, row)| row);
        Box::pin(std::future::ready(Ok(row)))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        let mut items = self.store.items();
        let doomed: Vec<String> = items
            .values()
            .filter(|(_, row)| row.expires_at <= now)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, row)| row.key.clone())
            .collect();
        for key in &doomed {
            items.remove(key);
        }
        Box::pin(std::future::ready(Ok(doomed.len() as u64)))
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        let held = self.update(&claim.key, |row| {
            Ok(match row {
                None => (None, false),
                Some(row) if !claim.may_take(row) => (Some(Claimed::Existing(row.clone())), false),
                Some(row) => {
                    let previous = claim.hold(row);
                    let record = row.clone();
                    (Some(Claimed::TakenOver { record, previous }), true)
                }
            })
        });
        Box::pin(std::future::ready(held))
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        let written = self.as_holder(&resolve.key, |row| resolve.apply(row));
        Box::pin(std::future::ready(written))
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        let items = self.store.items();
        let listed = filter.apply(items.values().map(|(_, row)| row));
        Box::pin(std::future::ready(listed))
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
