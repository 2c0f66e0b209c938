//! An operator frees one key by hand: the row becomes [`NotSent`](OperationStatus::NotSent),
//! with who and why recorded, so the next request under the key is sent, whatever it is.

use std::time::{Duration, SystemTime};

use crate::keys::key::IdempotencyKey;
use crate::ledger::{
    Claim, Claimed, Ledger, LedgerError, OperationRecord, OperationStatus, ResolutionKind,
    ResolutionNote, Resolve, later, require,
};

/// How long the operator's hold lasts if the release is interrupted between its two writes.
const HOLD: Duration = Duration::from_secs(60);

/// What [`release_by_hand`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The row is [`NotSent`](OperationStatus::NotSent) now, its release recorded; it had this
    /// status before.
    Released(OperationStatus),
    /// Refused: the operation may have run (it has this status, or a saved answer), and a new
    /// request under the key could then be a second effect or a refusal by the receiver.
    /// Nothing changed; `force` releases it anyway.
    MayHaveRun(OperationStatus),
    /// Refused whatever `force` says: the operation succeeded, and its receiver answers the key
    /// with its saved response. Send a different request under a new key.
    Succeeded,
    /// A live lease holds the row (a run is sending it, or a reconciler asking): nothing
    /// changed; try again once it lapses.
    Busy,
    /// The ledger has no row for the key.
    Missing,
}

/// Frees `key` by hand: its row becomes [`NotSent`](OperationStatus::NotSent), with a
/// resolution note of kind [`Released`](ResolutionKind::Released) by `operator {operator}` at
/// `now` and `reason`, keeping its attempts. The next request sent under the key is sent (the
/// same request or another), in a new reconcile window.
///
/// A row whose operation may have run ([`Unknown`](OperationStatus::Unknown),
/// [`InFlight`](OperationStatus::InFlight) under a lapsed lease, or
/// [`FailedFinal`](OperationStatus::FailedFinal) with a saved answer) is refused unless
/// `force`; a [`Succeeded`](OperationStatus::Succeeded) row always is. A row that no receiver
/// has seen frees itself ([`NotSent`](OperationStatus::NotSent)); this is for the rows an
/// operator knows more about.
///
/// The row is held under an operator's lease (60 s) between its two writes, as a run holds it,
/// so no run sends the key meanwhile.
///
/// # Errors
///
/// [`LedgerErrorKind::InvalidInput`](crate::ledger::LedgerErrorKind::InvalidInput) for an empty key,
/// operator name or reason; the ledger's error from a read or a write.
///
/// # Examples
///
/// ```
/// use idempotent_retry::ledger::MemoryLedger;
/// use idempotent_retry::reconcile::{release_by_hand, Released};
/// use std::time::{Duration, SystemTime};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), idempotent_retry::ledger::LedgerError> {
/// let ledger = MemoryLedger::new();
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
/// let released = release_by_hand(&ledger, "order-17", "alice", "INC-7: wrong port", false, now).await?;
/// assert_eq!(released, Released::Missing); // an empty ledger
/// # Ok(()) }
/// ```
pub async fn release_by_hand(
    ledger: &dyn Ledger,
    key: &str,
    operator: &str,
    reason: &str,
    force: bool,
    now: SystemTime,
) -> Result<Released, LedgerError> {
    require("the key", key)?;
    require("the operator's name", operator)?;
    require("the reason", reason)?;
    let Some(row) = ledger.get(key).await? else {
        return Ok(Released::Missing);
    };
    if let Some(refused) = refusal(&row, force, now) {
        return Ok(refused);
    }
    let by = format!("operator {operator}");
    let owner = [by.as_str(), IdempotencyKey::random().as_str()].join("/");
    // The row's own request, so the claim takes it over as it is: inside any window (the
    // epoch as the cutoff), keeping its scope, request and expiry.
    let mut builder = Claim::builder(
        key,
        row.fingerprint.as_str(),
        owner.as_str(),
        now,
        later(now, HOLD),
    )
    .scope(row.scope.as_str())
    .expires_at(row.expires_at);
    // A row written before 0.2 records neither; one of a relative URI, no URL.
    if let Some(method) = &row.method {
        builder = builder.method(method.as_str());
    }
    if let Some(url) = &row.url {
        builder = builder.url(url.as_str());
    }
    let claim = builder.build()?;
    let previous = match ledger.claim(&claim).await? {
        Claimed::TakenOver {
            mut record,
            previous,
        } => {
            if previous == OperationStatus::InFlight {
                super::count_dead_runs_attempt(ledger, &mut record, &owner, now, HOLD).await;
            }
            previous
        }
        // Purged in between: the claim made a row of its own, which is released too.
        Claimed::New(_) => OperationStatus::NotSent,
        Claimed::Existing(row) => {
            return Ok(refusal(&row, force, now).unwrap_or(Released::Busy));
        }
    };
    let note = ResolutionNote::new(ResolutionKind::Released, by, now).with_reason(reason);
    let resolve = Resolve::released(key, owner, note)?;
    ledger.resolve(&resolve).await?;
    Ok(Released::Released(previous))
}

/// Why `row` may not be released at `now`, if it may not.
fn refusal(row: &OperationRecord, force: bool, now: SystemTime) -> Option<Released> {
    match row.status {
        OperationStatus::Succeeded => Some(Released::Succeeded),
        OperationStatus::InFlight if row.lease_expires_at.is_some_and(|until| until > now) => {
            Some(Released::Busy)
        }
        OperationStatus::Unknown | OperationStatus::InFlight if !force => {
            Some(Released::MayHaveRun(row.status))
        }
        OperationStatus::FailedFinal if row.response.is_some() && !force => {
            Some(Released::MayHaveRun(row.status))
        }
        _ => None,
    }
}
