//! The cases for a ledger on its own clock ([`LedgerClock::Own`]): callers whose clocks are a
//! minute ahead of the ledger's or a minute behind. Such a ledger takes from a request only
//! the lengths between its instants, so a skewed caller never takes a live lease, a dead
//! lease lapses when the ledger's clock says so, and the times it stores are its own.
//!
//! The leases are short and real (a second): a case reads the ledger's clock before and
//! after each call and judges the call by those readings, never by how fast the machine ran.
//! Every wait is bounded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idempotent_retry_ledger::{
    AttemptUpdate, Claim, Claimed, Ledger, LedgerClock, LedgerErrorKind, OperationRecord,
    ReconcileClaim, Renew,
};

use super::{Case, Verdict, ok, refused};

/// How far the skewed callers' clocks are from the ledger's.
const SKEW: Duration = Duration::from_secs(60);
/// The lease of the suite's claims: real time, short so a dead run's lapses within the case.
const LEASE: Duration = Duration::from_secs(1);
/// How long a case waits, on the ledger's clock, past a lease's end for it to lapse.
const LAPSE_BOUND: Duration = Duration::from_secs(5);
/// Between two claims of a caller waiting for a lease to lapse.
const POLL: Duration = Duration::from_millis(50);

/// Every case, by name, in the order they run.
pub(super) const CASES: &[(&str, Case)] = &[
    (
        "a caller whose clock is ahead never takes a live lease, nor purges a kept row",
        |l| Box::pin(ahead(l)),
    ),
    (
        "a caller whose clock is behind never takes a live lease, and a dead lease lapses on time",
        |l| Box::pin(behind(l)),
    ),
    (
        "a skewed caller's renewal and attempt run from the ledger's present",
        |l| Box::pin(renewal(l)),
    ),
];

/// The ledger's present, on its own clock.
async fn clock(ledger: &dyn Ledger) -> Result<SystemTime, String> {
    match ok(ledger.clock().await, "read the ledger's clock")? {
        LedgerClock::Own { now } => Ok(now),
        LedgerClock::Caller => Err("the ledger answered Own once and Caller later".into()),
    }
}

/// A caller's clock: the ledger's present moved by the skew.
#[derive(Debug, Clone, Copy)]
enum Caller {
    Ahead,
    Behind,
}

impl Caller {
    fn reads(self, ledger_now: SystemTime) -> SystemTime {
        match self {
            Caller::Ahead => ledger_now + SKEW,
            Caller::Behind => ledger_now - SKEW,
        }
    }
}

/// A claim of `key` by `owner` on `caller`'s clock (read at `ledger_now`): the suite's lease,
/// an hour's retention, a ten-minute window.
fn claim(key: &str, owner: &str, caller: Caller, ledger_now: SystemTime) -> Claim {
    let now = caller.reads(ledger_now);
    Claim::builder(key, "f1", owner, now, now + LEASE)
        .scope(super::SCOPE)
        .expires_at(now + Duration::from_secs(3600))
        .window_cutoff(now - Duration::from_secs(600))
        .build()
        .expect("the suite's claims are valid: lease after, cutoff before the claim")
}

/// `at` lies in `[from, to]`, to the millisecond the SQL ledgers keep.
fn between(at: SystemTime, from: SystemTime, to: SystemTime) -> bool {
    let slack = Duration::from_millis(1);
    at + slack >= from && at <= to + slack
}

/// Claims `key` anew on `caller`'s clock and checks that the row's times are the ledger's:
/// its window starts between the clock readings around the claim, its lease one lease later.
async fn first_claim(
    ledger: &dyn Ledger,
    key: &str,
    caller: Caller,
) -> Result<OperationRecord, String> {
    let before = clock(ledger).await?;
    let claimed = ok(
        ledger.claim(&claim(key, "w1", caller, before)).await,
        "the first claim",
    )?;
    let after = clock(ledger).await?;
    let Claimed::New(record) = claimed else {
        return Err(format!("the first claim: expected New, got {claimed:?}"));
    };
    let stored = ok(ledger.get(key).await, "get after the claim")?
        .ok_or("get after the claim: expected the row, got none")?;
    ensure!(
        stored == record,
        "the first claim returned {record:?} but stored {stored:?}"
    );
    ensure!(
        between(record.first_attempt_at, before, after),
        "the window's start is on the caller's clock ({caller:?} by {SKEW:?}): \
         {:?} is not between the ledger's readings {before:?} and {after:?}",
        record.first_attempt_at
    );
    ensure!(
        record.lease_expires_at == Some(record.first_attempt_at + LEASE),
        "the lease lasts {LEASE:?} from the ledger's present: expected {:?}, got {:?}",
        Some(record.first_attempt_at + LEASE),
        record.lease_expires_at
    );
    Ok(record)
}

async fn ahead(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let record = first_claim(ledger, "ahead", Caller::Behind).await?;
    let lease_end = record.lease_expires_at.expect("checked: in flight");
    let now = clock(ledger).await?;
    let claimed = ok(
        ledger
            .claim(&claim("ahead", "w2", Caller::Ahead, now))
            .await,
        "a claim by a caller a minute ahead",
    )?;
    let after = clock(ledger).await?;
    if !matches!(claimed, Claimed::Existing(_)) && after < lease_end {
        return Err(format!(
            "a caller a minute ahead took a live lease (it ends at {lease_end:?}, the ledger \
             read {after:?} after the claim): {claimed:?}"
        ));
    }
    let hold = ReconcileClaim::new(
        "ahead",
        "reconciler",
        Caller::Ahead.reads(now),
        Caller::Ahead.reads(now) + LEASE,
    )
    .expect("the lease ends after the hold");
    let held = ok(
        ledger.claim_unresolved(&hold).await,
        "a hold by a reconciler a minute ahead",
    )?;
    let after = clock(ledger).await?;
    if !matches!(held, Some(Claimed::Existing(_))) && after < lease_end {
        return Err(format!(
            "a reconciler a minute ahead held a live run's row (its lease ends at \
             {lease_end:?}, the ledger read {after:?}): {held:?}"
        ));
    }
    // The row is kept for an hour on the ledger's clock: a purge two hours ahead of it on the
    // caller's clock deletes nothing.
    let purged = ok(
        ledger
            .purge_batch(now + Duration::from_secs(7200), 10)
            .await,
        "a purge by a caller two hours ahead",
    )?;
    ensure_eq!(purged, 0, "a purge by a caller two hours ahead");
    ensure!(
        ok(ledger.get("ahead").await, "get after the purge")?.is_some(),
        "a purge by a caller two hours ahead deleted a row kept for an hour"
    );
    Ok(())
}

async fn behind(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    let record = first_claim(ledger, "behind", Caller::Ahead).await?;
    let lease_end = record.lease_expires_at.expect("checked: in flight");
    // The holder is dead: it never renews. A caller a minute behind claims until it takes the
    // row, which must be neither before the lease's end nor long after it.
    let mut polls = 0u32;
    let taken = loop {
        let before = clock(ledger).await?;
        let claimed = ok(
            ledger
                .claim(&claim("behind", "w2", Caller::Behind, before))
                .await,
            "a claim by a caller a minute behind",
        )?;
        let after = clock(ledger).await?;
        match claimed {
            Claimed::TakenOver { record, .. } => {
                ensure!(
                    after >= lease_end,
                    "a caller a minute behind took a live lease (it ends at {lease_end:?}, \
                     the ledger read {after:?} after the claim)"
                );
                ensure!(
                    record.lease_expires_at.is_some_and(|until| between(
                        until,
                        before + LEASE,
                        after + LEASE
                    )),
                    "the taken lease lasts {LEASE:?} from the ledger's present (between \
                     {before:?} and {after:?}): got {:?}",
                    record.lease_expires_at
                );
                break record;
            }
            Claimed::Existing(_) => {
                ensure!(
                    before < lease_end,
                    "a dead lease did not lapse on time: it ended at {lease_end:?}, and a \
                     claim the ledger began at {before:?} was refused"
                );
                ensure!(
                    before < lease_end + LAPSE_BOUND && polls < 1000,
                    "a dead lease was still held {LAPSE_BOUND:?} after its end"
                );
            }
            Claimed::New(_) => return Err("a claim of an existing row inserted a new one".into()),
        }
        polls += 1;
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        taken.first_attempt_at == record.first_attempt_at,
        "the take-over kept the window's start: expected {:?}, got {:?}",
        record.first_attempt_at,
        taken.first_attempt_at
    );
    let late = AttemptUpdate::new(
        "behind",
        "w1",
        Caller::Ahead.reads(clock(ledger).await?),
        Caller::Ahead.reads(clock(ledger).await?) + LEASE,
    )
    .expect("the lease ends after the attempt");
    refused(
        ledger.record_attempt(&late).await,
        LedgerErrorKind::LeaseLost,
        "the dead holder's attempt after the take-over",
    )
}

async fn renewal(ledger: Arc<dyn Ledger>) -> Verdict {
    let ledger = &*ledger;
    first_claim(ledger, "renewed", Caller::Behind).await?;
    let long = Duration::from_secs(300);
    for (caller, step) in [(Caller::Ahead, "ahead"), (Caller::Behind, "behind")] {
        let before = clock(ledger).await?;
        let at = caller.reads(before);
        ok(
            ledger
                .renew(&Renew::new("renewed", "w1", at, at + long).expect("valid"))
                .await,
            &format!("a renewal by the holder, its clock a minute {step}"),
        )?;
        let after = clock(ledger).await?;
        let row = ok(ledger.get("renewed").await, "get after the renewal")?
            .ok_or("get after the renewal: expected the row, got none")?;
        ensure!(
            row.lease_expires_at
                .is_some_and(|until| between(until, before + long, after + long)),
            "a renewal by a holder a minute {step} lasts {long:?} from the ledger's present \
             (between {before:?} and {after:?}): got {:?}",
            row.lease_expires_at
        );
        let before = clock(ledger).await?;
        let at = caller.reads(before);
        ok(
            ledger
                .record_attempt(&AttemptUpdate::new("renewed", "w1", at, at + long).expect("valid"))
                .await,
            &format!("an attempt by the holder, its clock a minute {step}"),
        )?;
        let after = clock(ledger).await?;
        let row = ok(ledger.get("renewed").await, "get after the attempt")?
            .ok_or("get after the attempt: expected the row, got none")?;
        ensure!(
            row.last_attempt_at
                .is_some_and(|stamp| between(stamp, before, after)),
            "an attempt by a holder a minute {step} is stamped on the ledger's clock \
             (between {before:?} and {after:?}): got {:?}",
            row.last_attempt_at
        );
    }
    Ok(())
}
