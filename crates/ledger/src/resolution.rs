//! Settling an operation whose outcome is unknown: what a reconciler can answer
//! ([`Resolution`]), what the row keeps of it ([`ResolutionNote`]), and the two writes that
//! settle it under a lease, as every run's writes are: [`ReconcileClaim`] takes the lease of an
//! unresolved row, [`Resolve`] writes the answer and gives the lease back. The mapping from an
//! answer to the row's new status and window is [`Resolve::new`], the one place it is stated.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use super::{LedgerError, OperationRecord, OperationStatus, SavedResponse, require};

/// What a `Reconciler` (or an operator) found out about an operation
/// whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Resolution {
    /// It ran: this is the response to save and replay from now on. The row becomes
    /// [`Succeeded`](OperationStatus::Succeeded) (or [`FailedFinal`](OperationStatus::FailedFinal)
    /// for a status of 400 or more, which a later run sends again), and the next run with the
    /// key is answered from it with nothing sent.
    Done(SavedResponse),
    /// It did not run: the next run may send it anew, with the same key and a new reconcile
    /// window counted from the resolution. The row becomes
    /// [`FailedFinal`](OperationStatus::FailedFinal).
    NotDone,
    /// It may have run, but the receiver still holds the key (its retention outlasts the
    /// window): the next run sends it again with the same key, in a new window, and the
    /// receiver replays its answer if it ran. The row stays
    /// [`Unknown`](OperationStatus::Unknown) until that run ends.
    SendAgain,
    /// Still cannot tell: the row stays [`Unknown`](OperationStatus::Unknown) and nothing is
    /// sent.
    Unknown,
}

impl Resolution {
    /// The kind recorded in the row, `None` for [`Unknown`](Self::Unknown) (nothing is
    /// recorded).
    #[must_use]
    pub fn kind(&self) -> Option<ResolutionKind> {
        match self {
            Resolution::Done(_) => Some(ResolutionKind::Done),
            Resolution::NotDone => Some(ResolutionKind::NotDone),
            Resolution::SendAgain => Some(ResolutionKind::SendAgain),
            Resolution::Unknown => None,
        }
    }
}

/// How an operation was resolved, as the row records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResolutionKind {
    /// [`Resolution::Done`].
    Done,
    /// [`Resolution::NotDone`].
    NotDone,
    /// [`Resolution::SendAgain`].
    SendAgain,
    /// Freed by an operator (`release_by_hand`): the row became
    /// [`NotSent`](OperationStatus::NotSent), so the next request under the key is sent.
    Released,
}

impl ResolutionKind {
    /// The name stored in the `resolution` column.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ResolutionKind::Done => "done",
            ResolutionKind::NotDone => "not_done",
            ResolutionKind::SendAgain => "send_again",
            ResolutionKind::Released => "released",
        }
    }
}

impl fmt::Display for ResolutionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses a stored resolution name, as [`ResolutionKind::as_str`] spells it.
impl FromStr for ResolutionKind {
    type Err = LedgerError;

    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) for any other text.
    fn from_str(text: &str) -> Result<Self, LedgerError> {
        match text {
            "done" => Ok(ResolutionKind::Done),
            "not_done" => Ok(ResolutionKind::NotDone),
            "send_again" => Ok(ResolutionKind::SendAgain),
            "released" => Ok(ResolutionKind::Released),
            other => Err(LedgerError::corrupt(format!(
                "unknown resolution {other:?}"
            ))),
        }
    }
}

/// The last resolution of an operation, as its row keeps it: how, by whom, when and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResolutionNote {
    /// How it was resolved.
    pub kind: ResolutionKind,
    /// Who resolved it: the reconciler's name and the worker (`http-probe (worker a)`), or the
    /// operator (`operator alice`).
    pub by: String,
    /// When.
    pub at: SystemTime,
    /// Why, when an operator said so.
    pub reason: Option<String>,
}

impl ResolutionNote {
    /// A note that `by` resolved the operation as `kind` at `at`, with no reason.
    #[must_use]
    pub fn new(kind: ResolutionKind, by: impl Into<String>, at: SystemTime) -> Self {
        ResolutionNote {
            kind,
            by: by.into(),
            at,
            reason: None,
        }
    }

    /// The same note with a reason.
    #[must_use]
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// A request to hold an unresolved operation's row while it is reconciled, so no run and no
/// other reconciler acts on the key meanwhile.
///
/// [`Ledger::claim_unresolved`](super::Ledger::claim_unresolved) takes the row exactly when
/// [`may_take`](Self::may_take) holds, in one atomic step.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReconcileClaim {
    /// The idempotency key.
    pub key: String,
    /// The reconciling run's lease token, unique per run.
    pub owner: String,
    /// The time of the claim.
    pub now: SystemTime,
    /// When the lease lapses.
    pub lease_until: SystemTime,
}

impl ReconcileClaim {
    /// A claim of `key`'s row by lease token `owner`, made at `now`, held until `lease_until`.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](super::LedgerErrorKind::InvalidInput) when the key
    /// or the token is empty, or when the lease ends before the claim is made.
    pub fn new(
        key: impl Into<String>,
        owner: impl Into<String>,
        now: SystemTime,
        lease_until: SystemTime,
    ) -> Result<Self, LedgerError> {
        let claim = ReconcileClaim {
            key: key.into(),
            owner: owner.into(),
            now,
            lease_until,
        };
        require("the key", &claim.key)?;
        require("the lease token", &claim.owner)?;
        if claim.lease_until < claim.now {
            return Err(LedgerError::invalid(format!(
                "the lease of operation {} ends before its claim",
                claim.key
            )));
        }
        Ok(claim)
    }

    /// Whether this claim may take `row`: it is [`Unknown`](OperationStatus::Unknown), or in
    /// flight under a lease that lapsed at or before [`now`](Self::now) (its run died). Its
    /// window and fingerprint do not matter: reconciling is for rows past their window too.
    #[must_use]
    pub fn may_take(&self, row: &OperationRecord) -> bool {
        reconcilable(row, self.now)
    }

    /// Holds `row` (when [`may_take`](Self::may_take) allows it): in flight under this
    /// claim's lease. Returns its status before. A [`Ledger`](super::Ledger) outside this
    /// crate calls it on the row it stores, after [`may_take`](Self::may_take), in one atomic
    /// step.
    pub fn hold(&self, row: &mut OperationRecord) -> OperationStatus {
        let previous = row.status;
        row.status = OperationStatus::InFlight;
        row.lease_owner = Some(self.owner.clone());
        row.lease_expires_at = Some(self.lease_until);
        previous
    }
}

/// Whether `row` may be held to reconcile it at `now`: unknown, or in flight under a lease that
/// lapsed at or before `now` (its run died). A live lease is a run still sending, or another
/// reconciler asking.
#[must_use]
pub fn reconcilable(row: &OperationRecord, now: SystemTime) -> bool {
    match row.status {
        OperationStatus::Unknown => true,
        OperationStatus::InFlight => row.lease_expires_at.is_none_or(|until| until <= now),
        _ => false,
    }
}

/// A reconciler's answer written to the row it holds, releasing the lease.
///
/// [`Resolve::new`] builds it from a [`Resolution`]; a [`Ledger`](super::Ledger) writes the
/// fields as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resolve {
    /// The idempotency key.
    pub key: String,
    /// The reconciling run's lease token.
    pub owner: String,
    /// The row's status now.
    pub status: OperationStatus,
    /// The response to replay, for an operation found done.
    pub response: Option<SavedResponse>,
    /// A new start of the reconcile window (`first_attempt_at`), when the operation may be sent
    /// again; `None` keeps it.
    pub window_from: Option<SystemTime>,
    /// Keep the row at least until then: `expires_at` becomes the later of the two.
    pub keep_until: Option<SystemTime>,
    /// What to record of the resolution; `None` leaves the row's last note as it was.
    pub note: Option<ResolutionNote>,
}

impl Resolve {
    /// The write that frees `key` by hand, by the run holding lease token `owner`: the row
    /// becomes [`NotSent`](OperationStatus::NotSent) with no response and `note` (of kind
    /// [`Released`](ResolutionKind::Released)), its window and retention kept, so the next
    /// request under the key is sent.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](super::LedgerErrorKind::InvalidInput) when the key
    /// or the lease token is empty.
    pub fn released(
        key: impl Into<String>,
        owner: impl Into<String>,
        note: ResolutionNote,
    ) -> Result<Self, LedgerError> {
        let resolve = Resolve {
            key: key.into(),
            owner: owner.into(),
            status: OperationStatus::NotSent,
            response: None,
            window_from: None,
            keep_until: None,
            note: Some(note),
        };
        require("the key", &resolve.key)?;
        require("the lease token", &resolve.owner)?;
        Ok(resolve)
    }

    /// Writes this answer to `row` as [`Ledger::resolve`](super::Ledger::resolve) describes,
    /// if this run holds its lease (see [`OperationRecord::check_held_by`]): the status and
    /// response, a new window start and a longer retention when set, the note when set, and
    /// the lease released.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`](super::LedgerErrorKind::LeaseLost) when the run does
    /// not hold the lease; the row is unchanged.
    pub fn apply(&self, row: &mut OperationRecord) -> Result<(), LedgerError> {
        row.check_held_by(&self.key, &self.owner)?;
        row.status = self.status;
        row.lease_owner = None;
        row.lease_expires_at = None;
        row.response.clone_from(&self.response);
        if let Some(from) = self.window_from {
            row.first_attempt_at = from;
        }
        if let Some(keep) = self.keep_until {
            row.expires_at = row.expires_at.max(keep);
        }
        if let Some(note) = &self.note {
            row.resolution = Some(note.clone());
        }
        Ok(())
    }

    /// The write that records `resolution` of `key`, by the run holding lease token `owner`,
    /// resolved by `by` at `at`; `retention` is how long a reopened row must be kept from then.
    ///
    /// | resolution | status | response | window |
    /// |---|---|---|---|
    /// | `Done(r)`, status below 400 | succeeded | `r` | kept |
    /// | `Done(r)`, 400 or more | failed_final | `r` | kept |
    /// | `NotDone` | failed_final | none | from `at` |
    /// | `SendAgain` | unknown | none | from `at` |
    /// | `Unknown` | unknown | none | kept, and no note |
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](super::LedgerErrorKind::InvalidInput) when the key
    /// or the lease token is empty.
    pub fn new(
        key: impl Into<String>,
        owner: impl Into<String>,
        resolution: Resolution,
        note: Option<ResolutionNote>,
        at: SystemTime,
        retention: std::time::Duration,
    ) -> Result<Self, LedgerError> {
        let note = match resolution.kind() {
            Some(kind) => note.map(|note| ResolutionNote { kind, ..note }),
            None => None,
        };
        let reopened = Some(at);
        let keep = Some(super::later(at, retention));
        let (status, response, window_from, keep_until) = match resolution {
            Resolution::Done(response) => {
                let status = if response.status < 400 {
                    OperationStatus::Succeeded
                } else {
                    OperationStatus::FailedFinal
                };
                (status, Some(response), None, None)
            }
            Resolution::NotDone => (OperationStatus::FailedFinal, None, reopened, keep),
            Resolution::SendAgain => (OperationStatus::Unknown, None, reopened, keep),
            Resolution::Unknown => (OperationStatus::Unknown, None, None, None),
        };
        let resolve = Resolve {
            key: key.into(),
            owner: owner.into(),
            status,
            response,
            window_from,
            keep_until,
            note,
        };
        require("the key", &resolve.key)?;
        require("the lease token", &resolve.owner)?;
        Ok(resolve)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
    }

    #[test]
    fn each_resolution_maps_to_one_status_window_and_note() {
        let day = Duration::from_secs(86_400);
        let note = || Some(ResolutionNote::new(ResolutionKind::Done, "probe", t(9)));
        let done = Resolve::new(
            "k",
            "w",
            Resolution::Done(SavedResponse::new(201, Vec::new(), Some(b"ok".to_vec()))),
            note(),
            t(9),
            day,
        )
        .expect("valid");
        assert_eq!(done.status, OperationStatus::Succeeded);
        assert_eq!((done.window_from, done.keep_until), (None, None));
        assert_eq!(done.note.map(|n| n.kind), Some(ResolutionKind::Done));
        let refused = Resolve::new(
            "k",
            "w",
            Resolution::Done(SavedResponse::new(402, Vec::new(), None)),
            note(),
            t(9),
            day,
        )
        .expect("valid");
        assert_eq!(refused.status, OperationStatus::FailedFinal);
        let not_done =
            Resolve::new("k", "w", Resolution::NotDone, note(), t(9), day).expect("valid");
        assert_eq!(not_done.status, OperationStatus::FailedFinal);
        assert_eq!(not_done.window_from, Some(t(9)));
        assert_eq!(not_done.keep_until, Some(t(9) + day));
        assert_eq!(not_done.note.map(|n| n.kind), Some(ResolutionKind::NotDone));
        let again =
            Resolve::new("k", "w", Resolution::SendAgain, note(), t(9), day).expect("valid");
        assert_eq!(again.status, OperationStatus::Unknown);
        assert_eq!(again.window_from, Some(t(9)));
        let unknown =
            Resolve::new("k", "w", Resolution::Unknown, note(), t(9), day).expect("valid");
        assert_eq!(unknown.status, OperationStatus::Unknown);
        assert_eq!((unknown.window_from, unknown.note), (None, None));
        let err = Resolve::new("k", "", Resolution::NotDone, None, t(9), day).expect_err("empty");
        assert!(
            err.to_string()
                .contains("the lease token must not be empty")
        );
    }

    #[test]
    fn kinds_round_trip_and_refuse_garbage() {
        for kind in [
            ResolutionKind::Done,
            ResolutionKind::NotDone,
            ResolutionKind::SendAgain,
        ] {
            assert_eq!(kind.as_str().parse::<ResolutionKind>().ok(), Some(kind));
        }
        assert!("maybe".parse::<ResolutionKind>().is_err());
    }

    #[test]
    fn a_reconcile_claim_takes_unknown_rows_and_dead_runs_only() {
        let claim = ReconcileClaim::new("k", "r", t(100), t(160)).expect("valid");
        let row = |status| OperationRecord::builder("k", "f", t(0), t(3600)).status(status);
        let unknown = row(OperationStatus::Unknown).build().expect("valid");
        assert!(claim.may_take(&unknown));
        let live = row(OperationStatus::InFlight)
            .lease("w", t(101))
            .build()
            .expect("valid");
        assert!(!claim.may_take(&live));
        let dead = row(OperationStatus::InFlight)
            .lease("w", t(100))
            .build()
            .expect("valid");
        assert!(claim.may_take(&dead));
        for status in [OperationStatus::Succeeded, OperationStatus::FailedFinal] {
            assert!(!claim.may_take(&row(status).build().expect("valid")));
        }
        assert!(ReconcileClaim::new("k", "r", t(100), t(99)).is_err());
    }
}
