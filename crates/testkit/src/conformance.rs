//! The [`Ledger`] contract as cases: every implementation, this crate's and a user's, runs the
//! same ones through [`ledger_conformance`] (public as `testkit::ledger_conformance`).
//!
//! Each case gets a fresh ledger from the caller's factory and runs on a task of its own, so a
//! case that fails (or an implementation that panics) is reported by name and the other cases
//! still run. The suite returns a [`ConformanceReport`] rather than panicking at the first
//! difference: a test calls [`ConformanceReport::assert_passed`], a program (the `map_ledger`
//! example) prints the report and sets its exit status.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotent_retry_ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerClock, LedgerError, LedgerErrorKind,
    LedgerFuture, ListFilter, OperationRecord, OperationStatus, ReconcileClaim, Renew, Resolution,
    ResolutionKind, ResolutionNote, Resolve, SavedResponse,
};

/// What one case found: `Err` says what differed.
type Verdict = Result<(), String>;

type Case = fn(Arc<dyn Ledger>) -> Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// The step every run begins with: [`Ledger::clock`], which picks the cases.
const CLOCK_CASE: &str = "the ledger says whose clock it compares on";

/// Every case of a ledger on the caller's clock, by name, in the order they run: fixed times.
const CASES: &[(&str, Case)] = &[
    ("a new key is inserted in flight", |l| Box::pin(new_key(l))),
    ("concurrent claims of one key acquire it once", |l| {
        Box::pin(concurrent_claims(l))
    }),
    ("a live lease is not taken", |l| Box::pin(live_lease(l))),
    ("only the lease holder records and finishes", |l| {
        Box::pin(only_the_holder(l))
    }),
    ("an attempt is counted, stamped and renews the lease", |l| {
        Box::pin(record_attempt(l))
    }),
    ("the holder renews its lease, and only the holder", |l| {
        Box::pin(renewal(l))
    }),
    (
        "a missed renewal lets another run take over, and refuses the old holder",
        |l| Box::pin(missed_renewal(l)),
    ),
    ("finish writes the outcome and releases the lease", |l| {
        Box::pin(finish_releases(l))
    }),
    ("a finish counts the last attempt it carries", |l| {
        Box::pin(finish_counts_last_attempt(l))
    }),
    ("a lapsed lease is taken over and its holder refused", |l| {
        Box::pin(lapsed_lease(l))
    }),
    ("an unresolved row is taken over with its history", |l| {
        Box::pin(unresolved_take_over(l))
    }),
    ("a succeeded row is never taken over", |l| {
        Box::pin(succeeded(l))
    }),
    (
        "another request under the same key is not taken over",
        |l| Box::pin(other_fingerprint(l)),
    ),
    (
        "a row no receiver saw is taken by any request in a new window",
        |l| Box::pin(not_sent(l)),
    ),
    ("the window start is kept and its cutoff honoured", |l| {
        Box::pin(window(l))
    }),
    ("saved responses round trip", |l| {
        Box::pin(saved_responses(l))
    }),
    ("purge deletes only expired rows", |l| {
        Box::pin(purge_only_expired(l))
    }),
    ("a purge batch honours its limit", |l| {
        Box::pin(purge_limit(l))
    }),
    ("purge_expired deletes every expired row in batches", |l| {
        Box::pin(purge_expired(l))
    }),
    ("a new row keeps the request's method and URL", |l| {
        Box::pin(request_recorded(l))
    }),
    (
        "only unknown rows and dead runs are held to reconcile",
        |l| Box::pin(hold_unresolved(l)),
    ),
    ("concurrent holds of one row acquire it once", |l| {
        Box::pin(concurrent_holds(l))
    }),
    (
        "a resolution is written by its holder and releases the row",
        |l| Box::pin(resolutions(l)),
    ),
    ("unresolved and list select, order and limit rows", |l| {
        Box::pin(listing(l))
    }),
];

/// Runs the [`Ledger`] conformance suite: every case of the contract the trait documents, each
/// on a fresh ledger from `factory`, and reports which cases failed and what differed.
///
/// The cases cover the claim, the lease, the fingerprint, the window, saved responses,
/// purging, reconciling and listing; the full list: `docs/ledger.md`.
///
/// The first ledger's [`Ledger::clock`] picks the cases. On the caller's clock, the 24
/// cases use fixed times in 2024. On its own clock, 3 cases with callers whose clocks are a
/// minute ahead and a minute behind check that such a caller never takes a live lease, that a
/// dead lease lapses when the ledger's clock says so (real one-second leases: a case takes a
/// few seconds), and that every time stored is the ledger's.
///
/// `factory` must return an **empty** ledger each time (for shared storage: a new database,
/// schema or table), since the purge cases count rows. The cases use keys of their own; a
/// case that fails leaves its ledger as it was for you to inspect.
///
/// # Examples
///
/// ```
/// use idempotent_retry::ledger::MemoryLedger;
/// use idempotent_retry_testkit::ledger_conformance;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let report = ledger_conformance(|| async { MemoryLedger::new() }).await;
/// report.assert_passed();
/// # }
/// ```
///
/// # Panics
///
/// Outside a Tokio runtime, as [`tokio::spawn`] does: each case runs on a task, and the
/// concurrent cases on several. A panic inside a case (in the ledger under test) does not
/// propagate: it is reported as that case's failure. A panic in `factory` propagates.
pub async fn ledger_conformance<F, Fut, L>(mut factory: F) -> ConformanceReport
where
    F: FnMut() -> Fut,
    Fut: Future<Output = L>,
    L: Ledger,
{
    let mut report = ConformanceReport {
        cases: Vec::with_capacity(CASES.len()),
        failures: Vec::new(),
    };
    // The first ledger says whose clock it compares on, then runs the first case.
    let mut first: Option<Arc<dyn Ledger>> = Some(Arc::new(factory().await));
    let cases = match first.as_ref().expect("set above").clock().await {
        Ok(LedgerClock::Caller) => CASES,
        Ok(LedgerClock::Own { .. }) => own_clock::CASES,
        Err(err) => {
            report.cases.push(CLOCK_CASE);
            report.failures.push(ConformanceFailure {
                case: CLOCK_CASE,
                message: format!("expected an answer, got the error \"{err}\""),
            });
            return report;
        }
    };
    for &(name, case) in cases {
        let ledger = match first.take() {
            Some(ledger) => ledger,
            None => Arc::new(factory().await),
        };
        let outcome = match tokio::spawn(case(ledger)).await {
            Ok(outcome) => outcome,
            Err(err) if err.is_panic() => Err(format!("panicked: {}", panic_text(err))),
            Err(err) => Err(format!("did not finish: {err}")),
        };
        report.cases.push(name);
        if let Err(message) = outcome {
            report.failures.push(ConformanceFailure {
                case: name,
                message,
            });
        }
    }
    report
}

fn panic_text(err: tokio::task::JoinError) -> String {
    let payload = err.into_panic();
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-text panic payload".to_owned()
    }
}

/// What [`ledger_conformance`] found: the cases run and those that failed.
///
/// `Display` lists every case that failed with what differed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a report fails nothing until it is checked: call assert_passed"]
pub struct ConformanceReport {
    cases: Vec<&'static str>,
    failures: Vec<ConformanceFailure>,
}

impl ConformanceReport {
    /// Whether every case passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// The names of the cases run, in order.
    #[must_use]
    pub fn cases(&self) -> impl ExactSizeIterator<Item = &'static str> + '_ {
        self.cases.iter().copied()
    }

    /// The cases that failed, in order.
    #[must_use]
    pub fn failures(&self) -> &[ConformanceFailure] {
        &self.failures
    }

    /// Panics, listing every failed case and what differed, unless every case passed: the
    /// assertion to end a test with.
    ///
    /// # Panics
    ///
    /// When a case failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        assert!(self.passed(), "{self}");
    }
}

impl fmt::Display for ConformanceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ledger conformance: {} of {} cases passed",
            self.cases.len() - self.failures.len(),
            self.cases.len()
        )?;
        for failure in &self.failures {
            write!(f, "\n  {failure}")?;
        }
        Ok(())
    }
}

/// One failed case of [`ledger_conformance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConformanceFailure {
    case: &'static str,
    message: String,
}

impl ConformanceFailure {
    /// The case's name, e.g. `a lapsed lease is taken over and its holder refused`.
    #[must_use]
    pub fn case(&self) -> &str {
        self.case
    }

    /// What differed: the step, what the contract expects and what the ledger did.
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConformanceFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.case, self.message)
    }
}

/// Fails the case unless `$got == $want`, naming the step and both values.
macro_rules! ensure_eq {
    ($got:expr, $want:expr, $($step:tt)+) => {{
        let (got, want) = (&$got, &$want);
        if got != want {
            return Err(format!(
                "{}: expected {want:?}, got {got:?}",
                format_args!($($step)+)
            ));
        }
    }};
}

/// Fails the case with the message unless `$cond` holds.
macro_rules! ensure {
    ($cond:expr, $($message:tt)+) => {
        if !$cond {
            return Err(format!($($message)+));
        }
    };
}

mod own_clock;

/// A step that must succeed.
fn ok<T>(result: Result<T, LedgerError>, step: &str) -> Result<T, String> {
    result.map_err(|err| format!("{step}: expected success, got the error \"{err}\""))
}

/// A step that must fail with `kind`.
fn refused<T: fmt::Debug>(
    result: Result<T, LedgerError>,
    kind: LedgerErrorKind,
    step: &str,
) -> Verdict {
    match result {
        Err(err) if err.kind() == kind => Ok(()),
        Err(err) => Err(format!(
            "{step}: expected a {kind:?} error, got the {:?} error \"{err}\"",
            err.kind()
        )),
        Ok(value) => Err(format!(
            "{step}: expected a {kind:?} error, got success ({value:?})"
        )),
    }
}

/// The suite's clock: whole seconds after 2024-01-01T00:00:00Z, stored exactly to the
/// millisecond by every ledger.
fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
}

const SCOPE: &str = "conformance";
const LEASE: u64 = 60;
const RETENTION: u64 = 3600;
const WINDOW: u64 = 600;

/// A claim at `now` with a 60 s lease, an hour's retention and a 10 min window.
fn claim(key: &str, fingerprint: &str, owner: &str, now: u64) -> Claim {
    claim_with(
        key,
        fingerprint,
        owner,
        now,
        at(now) - Duration::from_secs(WINDOW),
    )
}

fn claim_with(key: &str, fingerprint: &str, owner: &str, now: u64, cutoff: SystemTime) -> Claim {
    Claim::builder(key, fingerprint, owner, at(now), at(now + LEASE))
        .scope(SCOPE)
        .expires_at(at(now + RETENTION))
        .window_cutoff(cutoff)
        .build()
        .expect("the suite's claims are valid: lease after, cutoff before the claim")
}

fn update(key: &str, owner: &str, now: u64) -> AttemptUpdate {
    AttemptUpdate::new(key, owner, at(now), at(now + LEASE))
        .expect("the suite's updates are valid: the lease ends after the attempt")
}

fn finish(
    key: &str,
    owner: &str,
    status: OperationStatus,
    response: Option<SavedResponse>,
) -> Finish {
    Finish::new(key, owner, status, response)
        .expect("the suite's finishes are valid: none is in flight")
}

fn name(claimed: &Claimed) -> String {
    match claimed {
        Claimed::New(_) => "New".to_owned(),
        Claimed::TakenOver { previous, .. } => format!("TakenOver (previous {previous})"),
        Claimed::Existing(_) => "Existing".to_owned(),
    }
}

/// The claim must insert a row.
async fn claim_new(
    ledger: &dyn Ledger,
    claim: &Claim,
    step: &str,
) -> Result<OperationRecord, String> {
    match ok(ledger.claim(claim).await, step)? {
        Claimed::New(record) => Ok(record),
        other => Err(format!(
            "{step}: expected New, got {}: {other:?}",
            name(&other)
        )),
    }
}

/// The claim must take the row over; returns it and the status it had.
async fn claim_taken(
    ledger: &dyn Ledger,
    claim: &Claim,
    step: &str,
) -> Result<(OperationRecord, OperationStatus), String> {
    match ok(ledger.claim(claim).await, step)? {
        Claimed::TakenOver { record, previous } => Ok((record, previous)),
        other => Err(format!(
            "{step}: expected TakenOver, got {}: {other:?}",
            name(&other)
        )),
    }
}

/// The claim must leave the row alone and return it as it is.
async fn claim_existing(
    ledger: &dyn Ledger,
    claim: &Claim,
    step: &str,
) -> Result<OperationRecord, String> {
    match ok(ledger.claim(claim).await, step)? {
        Claimed::Existing(record) => Ok(record),
        other => Err(format!(
            "{step}: expected Existing, got {}: {other:?}",
            name(&other)
        )),
    }
}

async fn row(ledger: &dyn Ledger, key: &str, step: &str) -> Result<OperationRecord, String> {
    ok(ledger.get(key).await, step)?
        .ok_or_else(|| format!("{step}: expected a row for {key}, got none"))
}

/// The row a claim at `now` by `owner` inserts.
fn fresh(key: &str, fingerprint: &str, owner: &str, now: u64) -> OperationRecord {
    OperationRecord::builder(key, fingerprint, at(now), at(now + RETENTION))
        .scope(SCOPE)
        .lease(owner, at(now + LEASE))
        .build()
        .expect("an in-flight record with its lease is valid")
}

async fn new_key(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let expected = fresh("new", "f1", "w1", 0);
    let record = claim_new(
        ledger,
        &claim("new", "f1", "w1", 0),
        "the first claim of a key",
    )
    .await?;
    ensure_eq!(record, expected, "the row the first claim returns");
    ensure_eq!(
        ok(ledger.get("new").await, "get after the claim")?,
        Some(expected),
        "get after the claim"
    );
    ensure_eq!(
        ok(
            ledger.get("never-claimed").await,
            "get of a key never claimed"
        )?,
        None,
        "get of a key never claimed"
    );
    Ok(())
}

/// Runs `racers` together on this task and returns their outputs in order. Every one is polled
/// once before any is polled again, and each wake-up polls them all in turn, so every racer
/// reaches its first await point (a ledger's read, before its write) before any goes past it:
/// a ledger that checks, then inserts is caught on every run, whatever the runtime's flavor
/// or the machine's load, and a ledger's own threads and connections still run in parallel.
async fn in_lockstep<'a, T>(racers: Vec<LedgerFuture<'a, T>>) -> Vec<Result<T, LedgerError>> {
    let mut pending: Vec<Option<LedgerFuture<'a, T>>> = racers.into_iter().map(Some).collect();
    let mut done: Vec<Option<Result<T, LedgerError>>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (slot, out) in pending.iter_mut().zip(done.iter_mut()) {
            if let Some(racer) = slot
                && let std::task::Poll::Ready(result) = racer.as_mut().poll(cx)
            {
                *out = Some(result);
                *slot = None;
            }
        }
        if pending.iter().all(Option::is_none) {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    done.into_iter()
        .map(|out| out.expect("every racer finished before the join returned"))
        .collect()
}

async fn concurrent_claims(ledger: Arc<dyn Ledger>) -> Verdict {
    const RACERS: usize = 16;
    async fn race(
        ledger: &Arc<dyn Ledger>,
        run: &str,
        now: u64,
    ) -> Result<Vec<(String, Claimed)>, String> {
        let owners: Vec<String> = (0..RACERS).map(|i| format!("{run}-{i}")).collect();
        let claims: Vec<Claim> = owners
            .iter()
            .map(|owner| claim("race", "f1", owner, now))
            .collect();
        let racers = claims
            .iter()
            .map(|claim| ledger.claim(claim))
            .collect::<Vec<_>>();
        let mut results = Vec::with_capacity(RACERS);
        for (owner, claimed) in owners.into_iter().zip(in_lockstep(racers).await) {
            results.push((owner, ok(claimed, "a concurrent claim")?));
        }
        Ok(results)
    }
    /// Exactly one claim acquired the row (`New` on the first race, `TakenOver` on the
    /// second); every other one saw the winner's lease.
    fn one_winner(
        results: &[(String, Claimed)],
        first: bool,
        race: &str,
    ) -> Result<String, String> {
        let winners: Vec<&str> = results
            .iter()
            .filter(|(_, claimed)| match claimed {
                Claimed::New(_) => first,
                Claimed::TakenOver { .. } => !first,
                _ => false,
            })
            .map(|(owner, _)| owner.as_str())
            .collect();
        let [winner] = winners[..] else {
            let kinds: Vec<String> = results.iter().map(|(_, c)| name(c)).collect();
            return Err(format!(
                "{race}: expected exactly one of {RACERS} concurrent claims to acquire the key, \
                 {} did: {kinds:?}",
                winners.len()
            ));
        };
        for (owner, claimed) in results {
            if owner == winner {
                continue;
            }
            let Claimed::Existing(record) = claimed else {
                return Err(format!(
                    "{race}: the claim by {owner} lost to {winner} but got {}",
                    name(claimed)
                ));
            };
            ensure_eq!(
                record.lease_owner.as_deref(),
                Some(winner),
                "{race}: the lease holder a losing claim sees"
            );
        }
        Ok(winner.to_owned())
    }
    let results = race(&ledger, "a", 0).await?;
    let winner = one_winner(&results, true, "claims of a new key")?;
    ok(
        ledger
            .finish(&finish("race", &winner, OperationStatus::Unknown, None))
            .await,
        "the winner's finish",
    )?;
    let results = race(&ledger, "b", 10).await?;
    let winner = one_winner(&results, false, "claims of an unknown row")?;
    let record = row(&*ledger, "race", "get after the races").await?;
    ensure_eq!(
        record.lease_owner.as_deref(),
        Some(winner.as_str()),
        "the lease holder after the races"
    );
    Ok(())
}

async fn live_lease(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let held = claim_new(ledger, &claim("held", "f1", "w1", 0), "the first claim").await?;
    for now in [10, LEASE - 1] {
        let step = format!("a claim by another run {now} s in, under a {LEASE} s lease");
        let seen = claim_existing(ledger, &claim("held", "f1", "w2", now), &step).await?;
        ensure_eq!(seen, held, "{step}: the row it returns");
    }
    ensure_eq!(
        row(ledger, "held", "get").await?,
        held,
        "the row after the refused claims"
    );
    Ok(())
}

async fn only_the_holder(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let held = claim_new(ledger, &claim("held", "f1", "w1", 0), "the first claim").await?;
    refused(
        ledger.record_attempt(&update("held", "w2", 10)).await,
        LedgerErrorKind::LeaseLost,
        "record_attempt by a run without the lease",
    )?;
    refused(
        ledger
            .finish(&finish("held", "w2", OperationStatus::Succeeded, None))
            .await,
        LedgerErrorKind::LeaseLost,
        "finish by a run without the lease",
    )?;
    ensure_eq!(
        row(ledger, "held", "get").await?,
        held,
        "the row after the refused writes"
    );
    refused(
        ledger.record_attempt(&update("absent", "w1", 10)).await,
        LedgerErrorKind::LeaseLost,
        "record_attempt of a key never claimed",
    )?;
    refused(
        ledger
            .finish(&finish("absent", "w1", OperationStatus::Unknown, None))
            .await,
        LedgerErrorKind::LeaseLost,
        "finish of a key never claimed",
    )?;
    ensure_eq!(
        ok(ledger.get("absent").await, "get")?,
        None,
        "a key never claimed after refused writes"
    );
    Ok(())
}

async fn record_attempt(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    let renewed =
        AttemptUpdate::new("op", "w1", at(20), at(200)).expect("the lease ends after the attempt");
    ok(
        ledger.record_attempt(&renewed).await,
        "the holder's first attempt",
    )?;
    let mut expected = fresh("op", "f1", "w1", 0);
    expected.attempts = 1;
    expected.last_attempt_at = Some(at(20));
    expected.lease_expires_at = Some(at(200));
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after one attempt"
    );
    // The first lease (60 s) has run out, the renewed one (200 s) has not.
    claim_existing(
        ledger,
        &claim("op", "f1", "w2", 100),
        "a claim by another run under the renewed lease",
    )
    .await?;
    ok(
        ledger.record_attempt(&update("op", "w1", 120)).await,
        "the holder's second attempt",
    )?;
    expected.attempts = 2;
    expected.last_attempt_at = Some(at(120));
    expected.lease_expires_at = Some(at(120 + LEASE));
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after two attempts"
    );
    Ok(())
}

fn renewed(key: &str, owner: &str, now: u64, until: u64) -> Renew {
    Renew::new(key, owner, at(now), at(until))
        .expect("the suite's renewals end after they are made")
}

async fn renewal(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger.renew(&renewed("op", "w1", 50, 150)).await,
        "the holder's renewal",
    )?;
    let mut expected = fresh("op", "f1", "w1", 0);
    expected.lease_expires_at = Some(at(150));
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after a renewal (the lease's end moved, nothing else)"
    );
    // The first lease (60 s) has run out, the renewed one (150 s) has not.
    claim_existing(
        ledger,
        &claim("op", "f1", "w2", 100),
        "a claim by another run under the renewed lease",
    )
    .await?;
    refused(
        ledger.renew(&renewed("op", "w2", 100, 400)).await,
        LedgerErrorKind::LeaseLost,
        "a renewal by a run without the lease",
    )?;
    refused(
        ledger.renew(&renewed("absent", "w1", 100, 400)).await,
        LedgerErrorKind::LeaseLost,
        "a renewal of a key never claimed",
    )?;
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after the refused renewals"
    );
    // Lapsed at 150 but taken by nobody: still the holder's, and renewed.
    ok(
        ledger.renew(&renewed("op", "w1", 200, 260)).await,
        "the holder's renewal after its lease lapsed untaken",
    )?;
    claim_existing(
        ledger,
        &claim("op", "f1", "w2", 210),
        "a claim under the lease renewed after it lapsed",
    )
    .await?;
    ok(
        ledger
            .finish(&finish("op", "w1", OperationStatus::Succeeded, None))
            .await,
        "the holder's finish",
    )?;
    refused(
        ledger.renew(&renewed("op", "w1", 220, 280)).await,
        LedgerErrorKind::LeaseLost,
        "a renewal after the finish",
    )?;
    ensure_eq!(
        row(ledger, "op", "get").await?.status,
        OperationStatus::Succeeded,
        "the status after a renewal refused past the finish"
    );
    Ok(())
}

async fn missed_renewal(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger.renew(&renewed("op", "w1", 20, 80)).await,
        "the holder's renewal",
    )?;
    claim_existing(
        ledger,
        &claim("op", "f1", "w2", 79),
        "a claim a second before the renewed lease lapses",
    )
    .await?;
    let (record, previous) = claim_taken(
        ledger,
        &claim("op", "f1", "w2", 80),
        "a claim when the renewed lease lapses",
    )
    .await?;
    ensure_eq!(
        previous,
        OperationStatus::InFlight,
        "the status before the take-over"
    );
    ensure_eq!(
        record.lease_owner.as_deref(),
        Some("w2"),
        "the lease holder after the take-over"
    );
    let taken = row(ledger, "op", "get").await?;
    refused(
        ledger.renew(&renewed("op", "w1", 81, 200)).await,
        LedgerErrorKind::LeaseLost,
        "a renewal by the run whose lease lapsed",
    )?;
    ensure_eq!(
        row(ledger, "op", "get").await?,
        taken,
        "the row after the stale run's renewal"
    );
    ok(
        ledger.renew(&renewed("op", "w2", 90, 150)).await,
        "a renewal by the new holder",
    )?;
    Ok(())
}

async fn finish_counts_last_attempt(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    // One attempt, counted by the finish alone: the claim and the finish are the only writes.
    claim_new(ledger, &claim("one", "f1", "w1", 0), "the first claim").await?;
    let succeeded = finish("one", "w1", OperationStatus::Succeeded, None).with_last_attempt(at(5));
    ok(
        ledger.finish(&succeeded).await,
        "a finish carrying the last attempt",
    )?;
    let expected = OperationRecord::builder("one", "f1", at(0), at(RETENTION))
        .scope(SCOPE)
        .status(OperationStatus::Succeeded)
        .attempts(1)
        .last_attempt_at(at(5))
        .build()
        .expect("a finished record without a lease is valid");
    ensure_eq!(
        row(ledger, "one", "get").await?,
        expected,
        "the row after a finish carrying its only attempt"
    );
    // Recorded attempts, then a last one carried by the finish.
    claim_new(ledger, &claim("three", "f1", "w1", 0), "the first claim").await?;
    for now in [10, 20] {
        ok(
            ledger.record_attempt(&update("three", "w1", now)).await,
            "an attempt",
        )?;
    }
    let unknown = finish("three", "w1", OperationStatus::Unknown, None).with_last_attempt(at(30));
    ok(
        ledger.finish(&unknown).await,
        "a finish carrying the last attempt",
    )?;
    let row_three = row(ledger, "three", "get").await?;
    ensure_eq!(
        (row_three.attempts, row_three.last_attempt_at),
        (3, Some(at(30))),
        "attempts and the last attempt after two records and a finish carrying the third"
    );
    // A refused finish counts nothing.
    refused(
        ledger.finish(&unknown).await,
        LedgerErrorKind::LeaseLost,
        "a second finish carrying an attempt",
    )?;
    let after = row(ledger, "three", "get").await?;
    ensure_eq!(
        after.attempts,
        3,
        "attempts after a refused finish carrying an attempt"
    );
    Ok(())
}

async fn finish_releases(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger.record_attempt(&update("op", "w1", 20)).await,
        "an attempt",
    )?;
    ok(
        ledger.record_attempt(&update("op", "w1", 30)).await,
        "an attempt",
    )?;
    ok(
        ledger
            .finish(&finish("op", "w1", OperationStatus::Unknown, None))
            .await,
        "the holder's finish",
    )?;
    let expected = OperationRecord::builder("op", "f1", at(0), at(RETENTION))
        .scope(SCOPE)
        .status(OperationStatus::Unknown)
        .attempts(2)
        .last_attempt_at(at(30))
        .build()
        .expect("a finished record without a lease is valid");
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after the finish"
    );
    refused(
        ledger.record_attempt(&update("op", "w1", 40)).await,
        LedgerErrorKind::LeaseLost,
        "record_attempt by the run that finished",
    )?;
    refused(
        ledger
            .finish(&finish("op", "w1", OperationStatus::Succeeded, None))
            .await,
        LedgerErrorKind::LeaseLost,
        "a second finish by the run that finished",
    )?;
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after the refused writes"
    );
    Ok(())
}

async fn lapsed_lease(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger.record_attempt(&update("op", "w1", 5)).await,
        "an attempt",
    )?;
    // The lease now lapses at 5 + 60 s: still held a second before, free at that instant.
    claim_existing(
        ledger,
        &claim("op", "f1", "w2", 5 + LEASE - 1),
        "a claim a second before the lease lapses",
    )
    .await?;
    let (record, previous) = claim_taken(
        ledger,
        &claim("op", "f1", "w2", 5 + LEASE),
        "a claim when the lease lapses",
    )
    .await?;
    ensure_eq!(
        previous,
        OperationStatus::InFlight,
        "the status before the take-over"
    );
    let mut expected = fresh("op", "f1", "w2", 0);
    expected.attempts = 1;
    expected.last_attempt_at = Some(at(5));
    expected.lease_expires_at = Some(at(5 + 2 * LEASE));
    ensure_eq!(record, expected, "the row the take-over returns");
    refused(
        ledger.record_attempt(&update("op", "w1", 70)).await,
        LedgerErrorKind::LeaseLost,
        "record_attempt by the run whose lease lapsed",
    )?;
    refused(
        ledger
            .finish(&finish("op", "w1", OperationStatus::Succeeded, None))
            .await,
        LedgerErrorKind::LeaseLost,
        "finish by the run whose lease lapsed",
    )?;
    ensure_eq!(
        row(ledger, "op", "get").await?,
        expected,
        "the row after the stale run's writes"
    );
    ok(
        ledger.record_attempt(&update("op", "w2", 80)).await,
        "record_attempt by the new holder",
    )?;
    Ok(())
}

async fn unresolved_take_over(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let rejected = SavedResponse::new(
        400,
        vec![("content-type".into(), "text/plain".into())],
        Some(b"bad".to_vec()),
    );
    for (key, status, response) in [
        ("unknown", OperationStatus::Unknown, None),
        ("failed", OperationStatus::FailedFinal, Some(rejected)),
    ] {
        claim_new(ledger, &claim(key, "f1", "w1", 0), "the first claim").await?;
        ok(
            ledger.record_attempt(&update(key, "w1", 10)).await,
            "an attempt",
        )?;
        ok(
            ledger.finish(&finish(key, "w1", status, response)).await,
            "the finish",
        )?;
        let step = format!("a claim of a {status} row inside its window");
        let (record, previous) = claim_taken(ledger, &claim(key, "f1", "w2", 20), &step).await?;
        ensure_eq!(previous, status, "{step}: the status before the take-over");
        // The history stays (first attempt, attempts, retention); the response goes: the
        // new run's outcome replaces it.
        let expected = OperationRecord::builder(key, "f1", at(0), at(RETENTION))
            .scope(SCOPE)
            .attempts(1)
            .last_attempt_at(at(10))
            .lease("w2", at(20 + LEASE))
            .build()
            .expect("an in-flight record with its lease is valid");
        ensure_eq!(record, expected, "{step}: the row it returns");
        ensure_eq!(
            row(ledger, key, "get").await?,
            expected,
            "{step}: the row after it"
        );
    }
    Ok(())
}

async fn succeeded(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let answer = SavedResponse::new(
        201,
        vec![("location".into(), "/v1/charges/ch_1".into())],
        Some(b"{\"id\":\"ch_1\"}".to_vec()),
    );
    claim_new(ledger, &claim("done", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger
            .finish(&finish(
                "done",
                "w1",
                OperationStatus::Succeeded,
                Some(answer),
            ))
            .await,
        "the finish",
    )?;
    let done = row(ledger, "done", "get").await?;
    ensure_eq!(
        done.status,
        OperationStatus::Succeeded,
        "the status after the finish"
    );
    for now in [1, WINDOW - 1] {
        let step = format!("a claim of a succeeded row {now} s after its first attempt");
        let seen = claim_existing(ledger, &claim("done", "f1", "w2", now), &step).await?;
        ensure_eq!(seen, done, "{step}: the row it returns");
    }
    refused(
        ledger.record_attempt(&update("done", "w2", 30)).await,
        LedgerErrorKind::LeaseLost,
        "record_attempt on a succeeded row",
    )?;
    ensure_eq!(
        row(ledger, "done", "get").await?,
        done,
        "the succeeded row after the claims"
    );
    Ok(())
}

async fn other_fingerprint(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("unknown", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger
            .finish(&finish("unknown", "w1", OperationStatus::Unknown, None))
            .await,
        "the finish",
    )?;
    let before = row(ledger, "unknown", "get").await?;
    let seen = claim_existing(
        ledger,
        &claim("unknown", "f2", "w2", 10),
        "a claim of an unknown row with another fingerprint",
    )
    .await?;
    ensure_eq!(
        seen,
        before,
        "the row a claim with another fingerprint returns"
    );
    claim_new(ledger, &claim("lapsed", "f1", "w1", 0), "the first claim").await?;
    let lapsed = row(ledger, "lapsed", "get").await?;
    let seen = claim_existing(
        ledger,
        &claim("lapsed", "f2", "w2", 2 * LEASE),
        "a claim of a lapsed lease with another fingerprint",
    )
    .await?;
    ensure_eq!(
        seen,
        lapsed,
        "the row a claim with another fingerprint returns"
    );
    ensure_eq!(
        row(ledger, "unknown", "get").await?,
        before,
        "the unknown row after the claim"
    );
    ensure_eq!(
        row(ledger, "lapsed", "get").await?,
        lapsed,
        "the lapsed row after the claim"
    );
    Ok(())
}

async fn not_sent(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    claim_new(ledger, &claim("free", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger.record_attempt(&update("free", "w1", 1)).await,
        "an attempt that failed to connect",
    )?;
    ok(
        ledger
            .finish(&finish("free", "w1", OperationStatus::NotSent, None))
            .await,
        "the finish",
    )?;
    // Another request, in another scope, long after the first one's window closed.
    let later = 2 * WINDOW;
    let retention = 5 * RETENTION;
    let corrected = Claim::builder("free", "f2", "w2", at(later), at(later + LEASE))
        .scope("corrected")
        .expires_at(at(retention))
        .window_cutoff(at(later) - Duration::from_secs(WINDOW))
        .request("POST", "https://api.example.com/v1/charges")
        .build()
        .expect("a valid claim");
    let (record, previous) = claim_taken(
        ledger,
        &corrected,
        "a claim of a not_sent row with another fingerprint",
    )
    .await?;
    ensure_eq!(previous, OperationStatus::NotSent, "the status it had");
    let mut expected = OperationRecord::builder("free", "f2", at(later), at(retention))
        .scope("corrected")
        .lease("w2", at(later + LEASE))
        .build()
        .expect("an in-flight record with its lease is valid");
    expected.attempts = 1;
    expected.last_attempt_at = Some(at(1));
    expected.method = Some("POST".to_owned());
    expected.url = Some("https://api.example.com/v1/charges".to_owned());
    ensure_eq!(
        record,
        expected,
        "the row taken: the new request in a new window, its attempts kept"
    );
    ensure_eq!(
        row(ledger, "free", "get").await?,
        expected,
        "the row stored"
    );
    Ok(())
}

async fn window(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let second = Duration::from_secs(1);
    claim_new(ledger, &claim("op", "f1", "w1", 0), "the first claim").await?;
    ok(
        ledger
            .finish(&finish("op", "w1", OperationStatus::Unknown, None))
            .await,
        "the first run's finish",
    )?;
    // First attempted at the cutoff: outside the window. A second later: inside.
    claim_existing(
        ledger,
        &claim_with("op", "f1", "w2", 100, at(0)),
        "a claim whose window cutoff is the first attempt",
    )
    .await?;
    let (record, _) = claim_taken(
        ledger,
        &claim_with("op", "f1", "w2", 100, at(0) - second),
        "a claim whose window cutoff is a second before the first attempt",
    )
    .await?;
    ensure_eq!(
        record.first_attempt_at,
        at(0),
        "the window start after a take-over of an unknown row"
    );
    ok(
        ledger
            .finish(&finish("op", "w2", OperationStatus::Unknown, None))
            .await,
        "the second run's finish",
    )?;
    let (record, _) = claim_taken(
        ledger,
        &claim_with("op", "f1", "w3", 200, at(0) - second),
        "a third run's claim",
    )
    .await?;
    ensure_eq!(
        record.first_attempt_at,
        at(0),
        "the window start after a second take-over"
    );
    // The third run dies: its lease (until 260) lapses; the fourth run takes over.
    let (record, previous) = claim_taken(
        ledger,
        &claim_with("op", "f1", "w4", 300, at(0) - second),
        "a claim after the third run's lease lapsed",
    )
    .await?;
    ensure_eq!(
        previous,
        OperationStatus::InFlight,
        "the status the dead run left"
    );
    ensure_eq!(
        record.first_attempt_at,
        at(0),
        "the window start after a lapsed lease's take-over"
    );
    // The fourth run dies too; its window has closed by the next claim: nothing is taken.
    let left = row(ledger, "op", "get").await?;
    let seen = claim_existing(
        ledger,
        &claim_with("op", "f1", "w5", 400, at(1)),
        "a claim after the window closed, under a lapsed lease",
    )
    .await?;
    ensure_eq!(seen, left, "the row a claim outside the window returns");
    ensure_eq!(
        row(ledger, "op", "get").await?.first_attempt_at,
        at(0),
        "the window start at the end"
    );
    Ok(())
}

async fn saved_responses(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let every_byte: Vec<u8> = (0..=255).collect();
    let headers = vec![
        ("content-type".to_owned(), "application/json".to_owned()),
        ("set-cookie".to_owned(), "a=1; Path=/".to_owned()),
        ("set-cookie".to_owned(), "b=2".to_owned()),
        ("location".to_owned(), "/v1/charges/ch_1?x=\"y\"".to_owned()),
        ("x-empty".to_owned(), String::new()),
    ];
    let cases = [
        (
            "every byte",
            Some(SavedResponse::new(201, headers, Some(every_byte))),
        ),
        (
            "an empty body",
            Some(SavedResponse::new(204, Vec::new(), Some(Vec::new()))),
        ),
        (
            "a body over the limit",
            Some(SavedResponse::new(
                200,
                vec![("content-type".into(), "text/plain".into())],
                None,
            )),
        ),
        (
            "a final 4xx",
            Some(SavedResponse::new(
                422,
                Vec::new(),
                Some(b"{\"error\":\"reused key\"}".to_vec()),
            )),
        ),
        (
            "an answer from a redirect's last hop",
            Some(
                SavedResponse::new(200, Vec::new(), Some(b"ok".to_vec()))
                    .answered_at("https://api.example.com/v1/charges/"),
            ),
        ),
        ("no response", None),
    ];
    for (key, response) in cases {
        let status = match &response {
            Some(saved) if saved.status < 400 => OperationStatus::Succeeded,
            _ => OperationStatus::FailedFinal,
        };
        claim_new(ledger, &claim(key, "f1", "w1", 0), "the first claim").await?;
        ok(
            ledger
                .finish(&finish(key, "w1", status, response.clone()))
                .await,
            "the finish",
        )?;
        let stored = row(ledger, key, "get").await?;
        ensure_eq!(stored.response, response, "{key}: the response get returns");
        ensure_eq!(stored.status, status, "{key}: the status get returns");
        if status == OperationStatus::Succeeded {
            let seen = claim_existing(
                ledger,
                &claim(key, "f1", "w2", 10),
                "a claim of a succeeded row",
            )
            .await?;
            ensure_eq!(
                seen.response,
                response,
                "{key}: the response a later claim returns"
            );
        }
    }
    Ok(())
}

/// Claims `key` (fingerprint `f`, owner `w`) with `expires_at` at `expires`.
async fn claim_expiring(ledger: &dyn Ledger, key: &str, expires: u64) -> Verdict {
    let claim = Claim::builder(key, "f", "w", at(0), at(LEASE))
        .scope(SCOPE)
        .expires_at(at(expires))
        .build()
        .expect("a claim with its lease after it is valid");
    claim_new(ledger, &claim, "a claim").await?;
    Ok(())
}

async fn present(ledger: &dyn Ledger, keys: &[&str], want: bool, step: &str) -> Verdict {
    for key in keys {
        let found = ok(ledger.get(key).await, "get")?.is_some();
        ensure!(
            found == want,
            "{step}: expected {key} to be {}",
            if want { "kept" } else { "deleted" }
        );
    }
    Ok(())
}

async fn purge_only_expired(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    for (expires, key) in (100..).zip(["p100", "p101", "p102", "p103"]) {
        claim_expiring(ledger, key, expires).await?;
    }
    // Expiry is about retention, not state: a finished row and one in flight go alike.
    ok(
        ledger
            .finish(&finish(
                "p101",
                "w",
                OperationStatus::Succeeded,
                Some(SavedResponse::new(200, Vec::new(), None)),
            ))
            .await,
        "the finish",
    )?;
    claim_expiring(ledger, "live", 10_000).await?;
    ensure_eq!(
        ok(
            ledger.purge_batch(at(99), 10).await,
            "a purge before any expiry"
        )?,
        0,
        "rows a purge before any expiry deletes"
    );
    ensure_eq!(
        ok(
            ledger.purge_batch(at(102), 10).await,
            "a purge at the third expiry"
        )?,
        3,
        "rows a purge at the third expiry deletes (expires_at at or before now)"
    );
    present(ledger, &["p100", "p101", "p102"], false, "after the purge").await?;
    present(ledger, &["p103", "live"], true, "after the purge").await?;
    Ok(())
}

async fn purge_limit(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    for i in 0..5 {
        claim_expiring(ledger, &format!("p{i}"), 100 + i).await?;
    }
    claim_expiring(ledger, "live", 10_000).await?;
    for want in [2, 2, 1, 0] {
        let step = "a purge batch of at most 2 once 5 rows expired";
        ensure_eq!(
            ok(ledger.purge_batch(at(200), 2).await, step)?,
            want,
            "rows {step} deletes"
        );
    }
    present(
        ledger,
        &["p0", "p1", "p2", "p3", "p4"],
        false,
        "after the batches",
    )
    .await?;
    present(ledger, &["live"], true, "after the batches").await?;
    Ok(())
}

async fn purge_expired(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    for i in 0..5 {
        claim_expiring(ledger, &format!("p{i}"), 100 + i).await?;
    }
    claim_expiring(ledger, "live", 10_000).await?;
    refused(
        ledger.purge_expired(at(200), 0).await,
        LedgerErrorKind::InvalidInput,
        "purge_expired with a limit of 0",
    )?;
    present(ledger, &["p0", "live"], true, "after the refused purge").await?;
    ensure_eq!(
        ok(
            ledger.purge_expired(at(200), 2).await,
            "purge_expired in batches of 2"
        )?,
        5,
        "rows purge_expired in batches of 2 deletes"
    );
    present(
        ledger,
        &["p0", "p1", "p2", "p3", "p4"],
        false,
        "after purge_expired",
    )
    .await?;
    present(ledger, &["live"], true, "after purge_expired").await?;
    ensure_eq!(
        ok(
            ledger.purge_expired(at(200), 2).await,
            "a second purge_expired"
        )?,
        0,
        "rows a second purge_expired deletes"
    );
    Ok(())
}

/// A row finished with `status` by a run first claimed at `now` (one attempt at `now + 1`),
/// or left in flight with no attempt.
async fn finished(
    ledger: &dyn Ledger,
    key: &str,
    scope: &str,
    status: OperationStatus,
    now: u64,
) -> Verdict {
    let claim = Claim::builder(key, "f1", "w1", at(now), at(now + LEASE))
        .scope(scope)
        .expires_at(at(now + RETENTION))
        .build()
        .expect("the suite's claims are valid");
    claim_new(ledger, &claim, "the first claim").await?;
    if status != OperationStatus::InFlight {
        // Recorded on its own, not by the finish: a case about reconciling fails only for
        // what reconciling does.
        ok(
            ledger.record_attempt(&update(key, "w1", now + 1)).await,
            "the attempt",
        )?;
        ok(
            ledger.finish(&finish(key, "w1", status, None)).await,
            "the finish",
        )?;
    }
    Ok(())
}

fn hold(key: &str, owner: &str, now: u64) -> ReconcileClaim {
    ReconcileClaim::new(key, owner, at(now), at(now + LEASE))
        .expect("the suite's holds are valid: the lease ends after the claim")
}

async fn request_recorded(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let url = "https://api.example.com/v1/charges?order=17";
    let claim = Claim::builder("req", "f1", "w1", at(0), at(LEASE))
        .scope(SCOPE)
        .expires_at(at(RETENTION))
        .request("POST", url)
        .build()
        .expect("valid");
    let record = claim_new(ledger, &claim, "a claim that names its request").await?;
    let want = (Some("POST".to_owned()), Some(url.to_owned()));
    ensure_eq!(
        (record.method, record.url),
        want.clone(),
        "the row the claim returns"
    );
    let stored = row(ledger, "req", "get").await?;
    ensure_eq!((stored.method, stored.url), want, "the row get returns");
    ensure_eq!(stored.resolution, None, "a new row's resolution");
    Ok(())
}

async fn hold_unresolved(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    finished(ledger, "unknown", SCOPE, OperationStatus::Unknown, 0).await?;
    let step = "a hold of an unknown row, long past its window";
    let Some(Claimed::TakenOver { record, previous }) = ok(
        ledger.claim_unresolved(&hold("unknown", "r1", 5_000)).await,
        step,
    )?
    else {
        return Err(format!("{step}: expected TakenOver"));
    };
    ensure_eq!(
        previous,
        OperationStatus::Unknown,
        "{step}: the status before"
    );
    let expected = OperationRecord::builder("unknown", "f1", at(0), at(RETENTION))
        .scope(SCOPE)
        .attempts(1)
        .last_attempt_at(at(1))
        .lease("r1", at(5_000 + LEASE))
        .build()
        .expect("valid");
    ensure_eq!(record, expected, "{step}: the row it returns");
    ensure_eq!(
        row(ledger, "unknown", "get").await?,
        expected,
        "{step}: the row after it"
    );
    let step = "a second hold while the first lasts";
    match ok(
        ledger.claim_unresolved(&hold("unknown", "r2", 5_001)).await,
        step,
    )? {
        Some(Claimed::Existing(existing)) => ensure_eq!(existing, expected, "{step}"),
        other => return Err(format!("{step}: expected Existing, got {other:?}")),
    }
    let step = "a run's claim while the hold lasts";
    claim_existing(ledger, &claim("unknown", "f1", "w3", 5_002), step).await?;
    ok(
        ledger.claim_unresolved(&hold("missing", "r1", 0)).await,
        "a hold of a key with no row",
    )?
    .map_or(Ok(()), |found| {
        Err(format!(
            "a hold of a key with no row: expected None, got {found:?}"
        ))
    })?;
    // A run that died: its lease lapsed, so the row may be held.
    finished(ledger, "dead", SCOPE, OperationStatus::InFlight, 0).await?;
    let step = "a hold of a dead run's row before its lease lapsed";
    match ok(
        ledger
            .claim_unresolved(&hold("dead", "r1", LEASE - 1))
            .await,
        step,
    )? {
        Some(Claimed::Existing(_)) => {}
        other => return Err(format!("{step}: expected Existing, got {other:?}")),
    }
    let step = "a hold of a dead run's row once its lease lapsed";
    match ok(
        ledger.claim_unresolved(&hold("dead", "r1", LEASE)).await,
        step,
    )? {
        Some(Claimed::TakenOver { previous, record }) => {
            ensure_eq!(
                previous,
                OperationStatus::InFlight,
                "{step}: the status before"
            );
            ensure_eq!(
                record.lease_owner.as_deref(),
                Some("r1"),
                "{step}: the holder"
            );
        }
        other => return Err(format!("{step}: expected TakenOver, got {other:?}")),
    }
    for (key, status) in [
        ("done", OperationStatus::Succeeded),
        ("failed", OperationStatus::FailedFinal),
    ] {
        finished(ledger, key, SCOPE, status, 0).await?;
        let step = format!("a hold of a {status} row");
        match ok(ledger.claim_unresolved(&hold(key, "r1", 10)).await, &step)? {
            Some(Claimed::Existing(existing)) => {
                ensure_eq!(existing.status, status, "{step}: the row, unchanged");
            }
            other => return Err(format!("{step}: expected Existing, got {other:?}")),
        }
    }
    Ok(())
}

async fn concurrent_holds(ledger: Arc<dyn Ledger>) -> Verdict {
    const RACERS: usize = 16;
    finished(&*ledger, "race", SCOPE, OperationStatus::Unknown, 0).await?;
    let owners: Vec<String> = (0..RACERS).map(|i| format!("r{i}")).collect();
    let holds: Vec<ReconcileClaim> = owners
        .iter()
        .map(|owner| hold("race", owner, 100))
        .collect();
    let racers = holds
        .iter()
        .map(|hold| ledger.claim_unresolved(hold))
        .collect::<Vec<_>>();
    let mut winners = Vec::new();
    for (owner, held) in owners.into_iter().zip(in_lockstep(racers).await) {
        match ok(held, "a concurrent hold")? {
            Some(Claimed::TakenOver { .. }) => winners.push(owner),
            Some(Claimed::Existing(_)) => {}
            other => {
                return Err(format!(
                    "a concurrent hold: expected TakenOver or Existing, got {other:?}"
                ));
            }
        }
    }
    ensure_eq!(
        winners.len(),
        1,
        "holds that acquired the row ({winners:?})"
    );
    let stored = row(&*ledger, "race", "get").await?;
    ensure_eq!(
        stored.lease_owner.as_deref(),
        winners.first().map(String::as_str),
        "the row's holder"
    );
    Ok(())
}

async fn resolutions(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let day = Duration::from_secs(86_400);
    let note = |kind| Some(ResolutionNote::new(kind, "probe (worker a)", at(5_010)));
    // A probe that followed a redirect keeps where its answer came from.
    let answer = SavedResponse::new(
        200,
        vec![("content-type".into(), "application/json".into())],
        Some(br#"{"id":"ch_1"}"#.to_vec()),
    )
    .answered_at("https://api.example.com/v1/charges/ch_1");
    for (key, resolution) in [
        ("done", Resolution::Done(answer.clone())),
        ("not-done", Resolution::NotDone),
        ("again", Resolution::SendAgain),
        ("unknown", Resolution::Unknown),
    ] {
        finished(ledger, key, SCOPE, OperationStatus::Unknown, 0).await?;
        ok(
            ledger.claim_unresolved(&hold(key, "r1", 5_000)).await,
            "the hold",
        )?;
        let write = |owner: &str| {
            Resolve::new(
                key,
                owner,
                resolution.clone(),
                note(ResolutionKind::Done),
                at(5_010),
                day,
            )
            .expect("the suite's resolutions are valid")
        };
        refused(
            ledger.resolve(&write("r2")).await,
            LedgerErrorKind::LeaseLost,
            &format!("{key}: a resolution by another than the holder"),
        )?;
        let write = write("r1");
        ok(
            ledger.resolve(&write).await,
            &format!("{key}: the holder's resolution"),
        )?;
        let mut expected = OperationRecord::builder(
            key,
            "f1",
            write.window_from.unwrap_or(at(0)),
            write
                .keep_until
                .map_or(at(RETENTION), |keep| keep.max(at(RETENTION))),
        )
        .scope(SCOPE)
        .status(write.status)
        .attempts(1)
        .last_attempt_at(at(1));
        if let Some(response) = write.response.clone() {
            expected = expected.response(response);
        }
        if let Some(note) = write.note.clone() {
            expected = expected.resolution(note);
        }
        let expected = expected.build().expect("valid");
        ensure_eq!(
            row(ledger, key, "get").await?,
            expected,
            "{key}: the row after its resolution"
        );
        refused(
            ledger.resolve(&write).await,
            LedgerErrorKind::LeaseLost,
            &format!("{key}: the same resolution again, the hold released"),
        )?;
    }
    // A note with a reason round trips; a later resolution without a note keeps it.
    finished(ledger, "reason", SCOPE, OperationStatus::Unknown, 0).await?;
    ok(
        ledger.claim_unresolved(&hold("reason", "r1", 10)).await,
        "the hold",
    )?;
    let with_reason = ResolutionNote::new(ResolutionKind::SendAgain, "operator alice", at(11))
        .with_reason("the provider keeps keys 30 days");
    let write = Resolve::new(
        "reason",
        "r1",
        Resolution::SendAgain,
        Some(with_reason.clone()),
        at(11),
        day,
    )
    .expect("valid");
    ok(ledger.resolve(&write).await, "a resolution with a reason")?;
    ok(
        ledger.claim_unresolved(&hold("reason", "r2", 20)).await,
        "a second hold",
    )?;
    let write =
        Resolve::new("reason", "r2", Resolution::Unknown, None, at(21), day).expect("valid");
    ok(
        ledger.resolve(&write).await,
        "a second resolution, still unknown",
    )?;
    ensure_eq!(
        row(ledger, "reason", "get").await?.resolution,
        Some(with_reason),
        "the note after a resolution that records none"
    );
    Ok(())
}

async fn listing(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    for (key, scope, status, now) in [
        ("d-unknown", "a", OperationStatus::Unknown, 30),
        ("c-flight", "b", OperationStatus::InFlight, 20),
        ("b-unknown", "a", OperationStatus::Unknown, 20),
        ("a-done", "a", OperationStatus::Succeeded, 10),
        ("e-failed", "b", OperationStatus::FailedFinal, 40),
    ] {
        finished(ledger, key, scope, status, now).await?;
        ensure_eq!(
            row(ledger, key, "get").await?.status,
            status,
            "{key}: the row made"
        );
    }
    let keys = |rows: Vec<OperationRecord>| rows.into_iter().map(|r| r.key).collect::<Vec<_>>();
    let listed = ok(ledger.unresolved(10, at(30)).await, "unresolved, all")?;
    ensure_eq!(
        keys(listed),
        ["b-unknown", "c-flight", "d-unknown"],
        "unresolved rows, oldest first, ties by key"
    );
    let listed = ok(ledger.unresolved(2, at(30)).await, "unresolved, two")?;
    ensure_eq!(
        keys(listed),
        ["b-unknown", "c-flight"],
        "unresolved rows, at most the limit"
    );
    let listed = ok(ledger.unresolved(10, at(29)).await, "unresolved, older")?;
    ensure_eq!(
        keys(listed),
        ["b-unknown", "c-flight"],
        "unresolved rows first attempted at or before the time"
    );
    let listed = ok(ledger.list(&ListFilter::new(10)).await, "list, all")?;
    ensure_eq!(
        keys(listed),
        ["a-done", "b-unknown", "c-flight", "d-unknown", "e-failed"],
        "every row"
    );
    let filter = ListFilter::new(10)
        .scope("a")
        .status(OperationStatus::Unknown);
    let listed = ok(ledger.list(&filter).await, "list by scope and status")?;
    ensure_eq!(
        keys(listed),
        ["b-unknown", "d-unknown"],
        "rows of scope a, unknown"
    );
    let filter = ListFilter::new(10).scope("b").older_than(at(20));
    let listed = ok(ledger.list(&filter).await, "list by scope and age")?;
    ensure_eq!(
        keys(listed),
        ["c-flight"],
        "rows of scope b first attempted by 20 s"
    );
    for (prefix, expected) in [
        ("b-", &["b-unknown"][..]),
        ("c-flight", &["c-flight"]),
        ("c-flight-", &[]),
        ("d", &["d-unknown"]),
        (
            "",
            &["a-done", "b-unknown", "c-flight", "d-unknown", "e-failed"],
        ),
        // Pattern characters are bytes like any other.
        ("%", &[]),
        ("_-unknown", &[]),
        ("B-", &[]),
    ] {
        let listed = ok(
            ledger.list(&ListFilter::new(10).key_prefix(prefix)).await,
            "list by key prefix",
        )?;
        ensure_eq!(
            keys(listed),
            expected,
            "rows whose key starts with {prefix:?}"
        );
    }
    let filter = ListFilter::new(10)
        .key_prefix("d-")
        .status(OperationStatus::Succeeded);
    let listed = ok(ledger.list(&filter).await, "list by key prefix and status")?;
    ensure_eq!(keys(listed), [] as [&str; 0], "rows of key d-, succeeded");
    refused(
        ledger.list(&ListFilter::new(0)).await,
        LedgerErrorKind::InvalidInput,
        "a list limit of 0",
    )?;
    Ok(())
}
