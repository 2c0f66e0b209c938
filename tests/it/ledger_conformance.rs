//! The public ledger conformance suite, seen from outside the crate: a correct ledger passes;
//! a ledger that breaks one rule of the contract fails the cases about that rule, by name,
//! with what differed; a ledger that panics is reported, not propagated.

use std::fmt;
use std::sync::Arc;

use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerErrorKind, LedgerFuture, ListFilter,
    MemoryLedger, OperationRecord, ReconcileClaim, Renew, Resolve, SavedResponse,
};
use idempotent_retry_testkit::{ConformanceReport, ledger_conformance};

/// One rule a [`Faulty`] ledger breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Checks for the row, then inserts it in a second step: concurrent claims both insert.
    CheckThenInsert,
    /// Lets anyone record and finish, lease or not.
    NoLeaseCheck,
    /// Answers every renewal with success and writes nothing.
    RenewsNothing,
    /// Restarts the window at every take-over.
    WindowRestarts,
    /// Deletes every expired row, whatever the limit.
    PurgeIgnoresLimit,
    /// Keeps an absent body as an empty one.
    AbsentBodyEmpty,
    /// Ignores the last attempt a finish carries (a ledger written before `Finish` had it).
    IgnoresLastAttempt,
    /// Panics on every read.
    PanicsOnGet,
    /// Says it compares on its own clock, and compares the caller's instants as they are.
    OwnClockInName,
}

/// A [`MemoryLedger`] with one [`Fault`].
#[derive(Clone)]
struct Faulty {
    inner: MemoryLedger,
    fault: Fault,
}

impl fmt::Debug for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({:?})", self.fault)
    }
}

impl Ledger for Faulty {
    fn clock(&self) -> LedgerFuture<'_, idempotent_retry::ledger::LedgerClock> {
        if self.fault == Fault::OwnClockInName {
            let now =
                idempotent_retry::time::Clock::wall(&idempotent_retry::time::TokioClock::new());
            return Box::pin(std::future::ready(Ok(
                idempotent_retry::ledger::LedgerClock::Own { now },
            )));
        }
        self.inner.clock()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        Box::pin(async move {
            if self.fault == Fault::CheckThenInsert && self.inner.get(&claim.key).await?.is_none() {
                // Another claim runs between the check and the insert, which then overwrites.
                tokio::task::yield_now().await;
                let mut inserted = OperationRecord::builder(
                    &claim.key,
                    &claim.fingerprint,
                    claim.now,
                    claim.expires_at,
                )
                .scope(&claim.scope)
                .lease(&claim.owner, claim.lease_until);
                if let (Some(method), Some(url)) = (&claim.method, &claim.url) {
                    inserted = inserted.request(method, url);
                }
                let inserted = inserted.build()?;
                self.inner.claim(claim).await?;
                return Ok(Claimed::New(inserted));
            }
            match self.inner.claim(claim).await? {
                Claimed::TakenOver {
                    mut record,
                    previous,
                } if self.fault == Fault::WindowRestarts => {
                    record.first_attempt_at = claim.now;
                    Ok(Claimed::TakenOver { record, previous })
                }
                other => Ok(other),
            }
        })
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            match self.inner.record_attempt(update).await {
                Err(err)
                    if self.fault == Fault::NoLeaseCheck
                        && err.kind() == LedgerErrorKind::LeaseLost =>
                {
                    Ok(())
                }
                other => other,
            }
        })
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            if self.fault == Fault::RenewsNothing {
                return Ok(());
            }
            match self.inner.renew(renew).await {
                Err(err)
                    if self.fault == Fault::NoLeaseCheck
                        && err.kind() == LedgerErrorKind::LeaseLost =>
                {
                    Ok(())
                }
                other => other,
            }
        })
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let mut finish = finish.clone();
            if self.fault == Fault::IgnoresLastAttempt {
                finish.last_attempt_at = None;
            }
            if self.fault == Fault::AbsentBodyEmpty
                && let Some(response) = &finish.response
                && response.body.is_none()
            {
                finish.response = Some(SavedResponse::new(
                    response.status,
                    response.headers.clone(),
                    Some(Vec::new()),
                ));
            }
            match self.inner.finish(&finish).await {
                Err(err)
                    if self.fault == Fault::NoLeaseCheck
                        && err.kind() == LedgerErrorKind::LeaseLost =>
                {
                    Ok(())
                }
                other => other,
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        assert!(self.fault != Fault::PanicsOnGet, "the get of {key} broke");
        self.inner.get(key)
    }

    fn purge_batch(&self, now: std::time::SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        if self.fault == Fault::PurgeIgnoresLimit {
            self.inner.purge_batch(now, u32::MAX)
        } else {
            self.inner.purge_batch(now, limit)
        }
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

async fn run(fault: Fault) -> ConformanceReport {
    ledger_conformance(|| async move {
        Faulty {
            inner: MemoryLedger::new(),
            fault,
        }
    })
    .await
}

fn failed(report: &ConformanceReport) -> Vec<&str> {
    report.failures().iter().map(|f| f.case()).collect()
}

fn message<'r>(report: &'r ConformanceReport, case: &str) -> &'r str {
    report
        .failures()
        .iter()
        .find(|f| f.case() == case)
        .map(|f| f.message())
        .unwrap_or_else(|| panic!("{case:?} did not fail:\n{report}"))
}

#[tokio::test]
async fn the_memory_ledger_passes_every_case_and_the_report_lists_them() {
    let report = ledger_conformance(|| async { MemoryLedger::new() }).await;
    report.assert_passed();
    assert!(report.passed());
    assert!(report.failures().is_empty());
    let cases: Vec<&str> = report.cases().collect();
    assert_eq!(cases.len(), 24, "{cases:?}");
    for case in [
        "concurrent claims of one key acquire it once",
        "the holder renews its lease, and only the holder",
        "a missed renewal lets another run take over, and refuses the old holder",
        "a lapsed lease is taken over and its holder refused",
        "another request under the same key is not taken over",
        "the window start is kept and its cutoff honoured",
        "saved responses round trip",
        "a purge batch honours its limit",
        "purge_expired deletes every expired row in batches",
        "only unknown rows and dead runs are held to reconcile",
        "a resolution is written by its holder and releases the row",
    ] {
        assert!(cases.contains(&case), "{case:?} not in {cases:?}");
    }
    assert_eq!(
        report.to_string(),
        "ledger conformance: 24 of 24 cases passed"
    );
}

/// Runs the check-then-insert ledger through the suite `runs` times and counts the runs whose
/// report missed the race.
async fn misses_of_check_then_insert(runs: usize) -> usize {
    let mut misses = 0;
    for _ in 0..runs {
        let report = run(Fault::CheckThenInsert).await;
        if failed(&report) != ["concurrent claims of one key acquire it once"] {
            misses += 1;
        }
    }
    misses
}

/// Two threads that keep both cores busy until dropped: the load under which a race left to
/// the scheduler goes unseen.
struct Load(
    Arc<std::sync::atomic::AtomicBool>,
    Vec<std::thread::JoinHandle<()>>,
);

impl Load {
    fn start() -> Load {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Load(stop, threads)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.1.drain(..) {
            let _ = thread.join();
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_racy_claim_is_caught_on_every_run_on_a_current_thread_runtime() {
    assert_eq!(misses_of_check_then_insert(200).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racy_claim_is_caught_on_every_run_on_a_loaded_multi_thread_runtime() {
    let _load = Load::start();
    assert_eq!(misses_of_check_then_insert(200).await, 0);
}

#[tokio::test]
async fn a_ledger_on_its_own_clock_that_compares_the_caller_s_instants_fails_every_skew_case() {
    let report = run(Fault::OwnClockInName).await;
    let cases: Vec<&str> = report.cases().collect();
    assert_eq!(cases.len(), 3, "the own-clock cases only: {cases:?}");
    assert_eq!(failed(&report), cases, "{report}");
    for case in cases {
        let says = message(&report, case);
        assert!(
            says.starts_with("the window's start is on the caller's clock"),
            "{case}: {says}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_checks_then_inserts_fails_the_concurrent_claim_case() {
    let report = run(Fault::CheckThenInsert).await;
    assert_eq!(
        failed(&report),
        ["concurrent claims of one key acquire it once"],
        "{report}"
    );
    let says = message(&report, "concurrent claims of one key acquire it once");
    assert!(
        says.starts_with(
            "claims of a new key: expected exactly one of 16 concurrent claims to acquire the key"
        ),
        "{says}"
    );
}

#[tokio::test]
async fn a_ledger_that_ignores_the_lease_holder_fails_the_lease_cases() {
    let report = run(Fault::NoLeaseCheck).await;
    assert_eq!(
        failed(&report),
        [
            "only the lease holder records and finishes",
            "the holder renews its lease, and only the holder",
            "a missed renewal lets another run take over, and refuses the old holder",
            "finish writes the outcome and releases the lease",
            "a finish counts the last attempt it carries",
            "a lapsed lease is taken over and its holder refused",
            "a succeeded row is never taken over",
        ],
        "{report}"
    );
    assert_eq!(
        message(&report, "only the lease holder records and finishes"),
        "record_attempt by a run without the lease: expected a LeaseLost error, got success (())"
    );
}

#[tokio::test]
async fn a_ledger_that_restarts_the_window_fails_the_window_cases() {
    let report = run(Fault::WindowRestarts).await;
    assert_eq!(
        failed(&report),
        [
            "a lapsed lease is taken over and its holder refused",
            "an unresolved row is taken over with its history",
            "the window start is kept and its cutoff honoured",
        ],
        "{report}"
    );
    let says = message(&report, "the window start is kept and its cutoff honoured");
    assert!(
        says.starts_with(
            "the window start after a take-over of an unknown row: expected SystemTime"
        ),
        "{says}"
    );
}

#[tokio::test]
async fn a_purge_that_ignores_its_limit_fails_the_batch_case() {
    let report = run(Fault::PurgeIgnoresLimit).await;
    assert_eq!(
        failed(&report),
        ["a purge batch honours its limit"],
        "{report}"
    );
    assert_eq!(
        message(&report, "a purge batch honours its limit"),
        "rows a purge batch of at most 2 once 5 rows expired deletes: expected 2, got 5"
    );
}

#[tokio::test]
async fn a_ledger_that_ignores_the_last_attempt_of_a_finish_fails_its_case() {
    let report = run(Fault::IgnoresLastAttempt).await;
    assert_eq!(
        failed(&report),
        ["a finish counts the last attempt it carries"],
        "{report}"
    );
    let says = message(&report, "a finish counts the last attempt it carries");
    assert!(
        says.starts_with("the row after a finish carrying its only attempt: expected"),
        "{says}"
    );
    assert!(says.contains("attempts: 1"), "{says}");
    assert!(says.contains("attempts: 0"), "{says}");
}

#[tokio::test]
async fn a_ledger_that_empties_an_absent_body_fails_the_round_trip() {
    let report = run(Fault::AbsentBodyEmpty).await;
    assert_eq!(failed(&report), ["saved responses round trip"], "{report}");
    let says = message(&report, "saved responses round trip");
    assert!(
        says.starts_with(
            "a body over the limit: the response get returns: expected Some(SavedResponse"
        ),
        "{says}"
    );
    assert!(says.contains("body: None"), "{says}");
    assert!(says.contains("body: Some([])"), "{says}");
}

#[tokio::test]
async fn a_panicking_ledger_is_reported_case_by_case_and_assert_passed_names_them() {
    let report = run(Fault::PanicsOnGet).await;
    assert!(!report.passed());
    // Every case reads a row back, so every case fails, each with the panic's message.
    assert_eq!(report.failures().len(), report.cases().len(), "{report}");
    for failure in report.failures() {
        assert!(
            failure.message().starts_with("panicked: the get of "),
            "{failure}"
        );
    }
    let report = Arc::new(report);
    let shared = Arc::clone(&report);
    let panic = std::panic::catch_unwind(move || shared.assert_passed()).expect_err("failed");
    let text = panic
        .downcast_ref::<String>()
        .expect("assert_passed panics with the report");
    assert!(
        text.starts_with("ledger conformance: 0 of 24 cases passed\n  a new key is inserted in flight: panicked: the get of new broke"),
        "{text}"
    );
    assert_eq!(text, &report.to_string());
}

#[tokio::test]
async fn a_ledger_that_renews_nothing_fails_the_renewal_cases() {
    let report = run(Fault::RenewsNothing).await;
    assert_eq!(
        failed(&report),
        [
            "the holder renews its lease, and only the holder",
            "a missed renewal lets another run take over, and refuses the old holder",
        ],
        "{report}"
    );
    let says = message(&report, "the holder renews its lease, and only the holder");
    assert!(
        says.starts_with("the row after a renewal (the lease's end moved, nothing else): expected"),
        "{says}"
    );
}
