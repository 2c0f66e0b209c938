//! Settling operations whose outcome is unknown (the public face is the crate's
//! [`reconcile`](crate::reconcile) module): reconcilers per scope, the hold a reconciler takes
//! on a row, sweeps, and resolutions and releases by hand. Here rather than above the ledger
//! session because a run's claim that meets an unknown outcome past its window asks the scope's
//! reconciler before it answers.

mod hand_release;
mod probe;
mod reconciler;

pub use crate::ledger::{Resolution, ResolutionKind, ResolutionNote};
pub use hand_release::{Released, release_by_hand};
pub use probe::HttpProbe;
pub use reconciler::{ReconcileFn, ReconcileFuture, Reconciler, SendAgain, reconcile_fn};

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::keys::key::IdempotencyKey;
use crate::ledger::{
    AttemptUpdate, Claimed, Ledger, LedgerError, LedgerOptions, OperationRecord, OperationStatus,
    ReconcileClaim, Resolve, later,
};
use crate::time::Clock;

/// The reconcilers of one front end: one for every scope, and one per scope over it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reconcilers {
    pub(crate) default: Option<Arc<dyn Reconciler>>,
    pub(crate) by_scope: HashMap<String, Arc<dyn Reconciler>>,
}

impl Reconcilers {
    /// The reconciler for `scope`: its own, else the default.
    pub(crate) fn for_scope(&self, scope: &str) -> Option<&Arc<dyn Reconciler>> {
        self.by_scope.get(scope).or(self.default.as_ref())
    }
}

/// How one operation's reconciling ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reconciled {
    /// The reconciler answered, and the row records it (see [`Resolution`] for what each
    /// answer does to the next run).
    Resolved(ResolutionKind),
    /// The reconciler could not tell: the row stays unknown, nothing is sent.
    StillUnknown,
    /// A live lease holds the row (a run sending it, or another reconciler): nothing done.
    Busy,
    /// The row is not unresolved (it has this status): nothing to reconcile.
    Settled(OperationStatus),
    /// No reconciler is set for the row's scope (this one): nothing done.
    NoReconciler(String),
    /// The ledger has no row for the key (never claimed, or purged).
    Missing,
}

/// What one sweep of unresolved operations did, by outcome.
///
/// `Display` prints one line: `12 unresolved: 7 done, 2 not done, 0 send again, 1 still
/// unknown, 1 busy, 1 settled, 0 without a reconciler, 0 failed`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Rows looked at.
    pub unresolved: u64,
    /// Found done: replayed from now on.
    pub done: u64,
    /// Found not done: the next run sends it in a new window.
    pub not_done: u64,
    /// To send again with the same key in a new window.
    pub send_again: u64,
    /// The reconciler could not tell.
    pub still_unknown: u64,
    /// Held by a live lease (a run, or another sweeper).
    pub busy: u64,
    /// Settled by someone else between the listing and the hold.
    pub settled: u64,
    /// No reconciler for their scope.
    pub no_reconciler: u64,
    /// The ledger failed for them (each logged at `warn` with its key).
    pub failed: u64,
}

impl SweepReport {
    fn count(&mut self, outcome: &Reconciled) {
        let counter = match outcome {
            Reconciled::Resolved(ResolutionKind::Done) => &mut self.done,
            Reconciled::Resolved(ResolutionKind::NotDone) => &mut self.not_done,
            Reconciled::Resolved(ResolutionKind::SendAgain) => &mut self.send_again,
            Reconciled::StillUnknown => &mut self.still_unknown,
            Reconciled::Busy => &mut self.busy,
            // A sweep never releases a row; an operator does, and is counted as settling it
            // (as any kind a later release of the ledger adds).
            Reconciled::Settled(_) | Reconciled::Missing | Reconciled::Resolved(_) => {
                &mut self.settled
            }
            Reconciled::NoReconciler(_) => &mut self.no_reconciler,
        };
        *counter += 1;
    }
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} unresolved: {} done, {} not done, {} send again, {} still unknown, {} busy, \
             {} settled, {} without a reconciler, {} failed",
            self.unresolved,
            self.done,
            self.not_done,
            self.send_again,
            self.still_unknown,
            self.busy,
            self.settled,
            self.no_reconciler,
            self.failed
        )
    }
}

/// What reconciling needs besides the key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context<'a> {
    pub(crate) ledger: &'a dyn Ledger,
    pub(crate) options: &'a LedgerOptions,
    pub(crate) reconcilers: &'a Reconcilers,
    pub(crate) clock: &'a dyn Clock,
    /// How long the hold lasts: the attempt timeout (a probe is an attempt of its own).
    pub(crate) attempt_timeout: Duration,
    /// The reconcile window of a row reopened by the answer, which it must outlive.
    pub(crate) window: Duration,
}

/// A row held to be reconciled: the row as held, and the hold's lease token.
struct Held {
    row: OperationRecord,
    owner: String,
}

/// Holds `key`'s row under a lease of `lease` from `now` by a token of `worker`, if it is
/// unresolved and not held; otherwise says why not.
async fn hold(
    ledger: &dyn Ledger,
    key: &str,
    worker: &str,
    now: SystemTime,
    lease: Duration,
) -> Result<Result<Held, Reconciled>, LedgerError> {
    let owner = format!("{worker}/{}", IdempotencyKey::random());
    let claim = ReconcileClaim::new(key, owner.clone(), now, later(now, lease))?;
    Ok(match ledger.claim_unresolved(&claim).await? {
        None => Err(Reconciled::Missing),
        Some(Claimed::TakenOver {
            mut record,
            previous,
        }) => {
            if previous == OperationStatus::InFlight {
                count_dead_runs_attempt(ledger, &mut record, &owner, now, lease).await;
            }
            Ok(Held { row: record, owner })
        }
        Some(Claimed::Existing(row)) if row.status == OperationStatus::InFlight => {
            Err(Reconciled::Busy)
        }
        Some(Claimed::Existing(row) | Claimed::New(row)) => Err(Reconciled::Settled(row.status)),
    })
}

/// Counts, under the hold of `owner`, the attempt a run that died holding `row` left
/// uncounted (a run counts its first attempt when it finishes, its others as they start), so
/// `attempts` is the requests that may have reached the receiver. A failure is logged: the count
/// is the only thing it would have changed.
pub(crate) async fn count_dead_runs_attempt(
    ledger: &dyn Ledger,
    row: &mut OperationRecord,
    owner: &str,
    now: SystemTime,
    lease: Duration,
) {
    let counted = match AttemptUpdate::new(row.key.as_str(), owner, now, later(now, lease)) {
        Ok(update) => ledger.record_attempt(&update).await,
        Err(err) => Err(err),
    };
    match counted {
        Ok(()) => {
            row.attempts = row.attempts.saturating_add(1);
            row.last_attempt_at = Some(now);
        }
        Err(err) => tracing::warn!(
            key = row.key.as_str(),
            error = %err,
            "could not count the attempt of the run that died holding the operation"
        ),
    }
}

/// Writes `resolution` of the held row, recorded as by `by` at `at` with `reason`, keeping a
/// reopened row for `retention`, and releases the hold.
async fn settle(
    ledger: &dyn Ledger,
    held: Held,
    resolution: Resolution,
    by: String,
    reason: Option<&str>,
    at: SystemTime,
    retention: Duration,
) -> Result<Reconciled, LedgerError> {
    let kind = resolution.kind();
    let note = kind.map(|kind| {
        let note = ResolutionNote::new(kind, by, at);
        match reason {
            Some(reason) => note.with_reason(reason),
            None => note,
        }
    });
    let write = Resolve::new(held.row.key, held.owner, resolution, note, at, retention)?;
    ledger.resolve(&write).await?;
    tracing::info!(
        key = write.key.as_str(),
        resolution = kind.map_or("unknown", ResolutionKind::as_str),
        by = write.note.as_ref().map_or("", |note| note.by.as_str()),
        "reconciled an operation whose outcome was unknown"
    );
    Ok(kind.map_or(Reconciled::StillUnknown, Reconciled::Resolved))
}

/// Reconciles the operation `key`: holds its row if it is unresolved and not held, asks the
/// scope's reconciler, writes the answer and releases the row.
///
/// # Errors
///
/// The ledger's error, from the hold or the write ([`LeaseLost`](super::LedgerErrorKind::LeaseLost)
/// when the answer came after the hold lapsed and another run took the row).
pub(crate) async fn reconcile(cx: Context<'_>, key: &str) -> Result<Reconciled, LedgerError> {
    let Some(row) = cx.ledger.get(key).await? else {
        return Ok(Reconciled::Missing);
    };
    if !row.status.is_unresolved() {
        return Ok(Reconciled::Settled(row.status));
    }
    let Some(reconciler) = cx.reconcilers.for_scope(&row.scope) else {
        return Ok(Reconciled::NoReconciler(row.scope));
    };
    let lease = cx.attempt_timeout.saturating_add(cx.options.lease);
    let held = match hold(cx.ledger, key, &cx.options.worker, cx.clock.wall(), lease).await? {
        Ok(held) => held,
        Err(outcome) => return Ok(outcome),
    };
    let resolution = match reconciler.reconcile(&held.row).await {
        Resolution::Done(saved) => Resolution::Done(crate::ledger::seal::seal(
            &cx.options.seal_keys,
            &held.row.key,
            &held.row.fingerprint,
            saved,
        )),
        other => other,
    };
    let by = format!("{} (worker {})", reconciler.name(), cx.options.worker);
    let retention = cx
        .options
        .retention_for(&held.row.scope)
        .max(cx.window.saturating_mul(2));
    let at = cx.clock.wall();
    settle(cx.ledger, held, resolution, by, None, at, retention).await
}

/// One batch of a sweep: at most `limit` unresolved rows first attempted at or before
/// `older_than`, oldest first, each reconciled in turn under its own hold.
///
/// # Errors
///
/// The ledger's error when the rows cannot be listed; a failure on one row is counted and the
/// sweep goes on.
pub(crate) async fn sweep(
    cx: Context<'_>,
    limit: u32,
    older_than: SystemTime,
) -> Result<SweepReport, LedgerError> {
    let rows = cx.ledger.unresolved(limit, older_than).await?;
    let mut report = SweepReport::default();
    for row in rows {
        report.unresolved += 1;
        match reconcile(cx, &row.key).await {
            Ok(outcome) => report.count(&outcome),
            Err(err) => {
                tracing::warn!(key = row.key.as_str(), error = %err, "could not reconcile an operation");
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

/// How long an operator's hold lasts: the write follows at once.
const BY_HAND_LEASE: Duration = Duration::from_secs(60);

/// Resolves the unresolved operation `key` by hand, as an operator who knows what happened:
/// the same hold and write as a [`Reconciler`]'s answer, recorded as by `operator {operator}`
/// at `now` with the `reason`. A row reopened for sending (`NotDone`, `SendAgain`) is kept at
/// least as long again as its first retention.
///
/// A row that is not unresolved, or is held by a live lease (a run is sending it, or a
/// reconciler asking), is left alone and the answer says so.
///
/// # Errors
///
/// [`LedgerErrorKind::InvalidInput`](crate::ledger::LedgerErrorKind::InvalidInput) for an empty key or
/// operator name; the ledger's error from the hold or the write.
///
/// # Examples
///
/// ```
/// use idempotent_retry::ledger::{Ledger, MemoryLedger};
/// use idempotent_retry::reconcile::{Reconciled, Resolution, resolve_by_hand};
/// use std::time::{Duration, SystemTime};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idempotent_retry::ledger::LedgerError> {
/// let ledger = MemoryLedger::new();
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
/// let reason = Some("no charge in the provider's dashboard");
/// let outcome = resolve_by_hand(&ledger, "order-17", Resolution::NotDone, "alice", reason, now).await?;
/// assert_eq!(outcome, Reconciled::Missing); // an empty ledger
/// # Ok(()) }
/// ```
pub async fn resolve_by_hand(
    ledger: &dyn Ledger,
    key: &str,
    resolution: Resolution,
    operator: &str,
    reason: Option<&str>,
    now: SystemTime,
) -> Result<Reconciled, LedgerError> {
    crate::ledger::require("the operator's name", operator)?;
    let worker = format!("operator {operator}");
    let held = match hold(ledger, key, &worker, now, BY_HAND_LEASE).await? {
        Ok(held) => held,
        Err(outcome) => return Ok(outcome),
    };
    let retention = held
        .row
        .expires_at
        .duration_since(held.row.first_attempt_at)
        .unwrap_or_default();
    settle(ledger, held, resolution, worker, reason, now, retention).await
}
