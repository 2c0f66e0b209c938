//! Whose clock a ledger compares times on: the caller's, or its own. A fleet that shares one
//! ledger is only as safe as the clock its comparisons use, so a shared store compares on its
//! own clock and reads from the requests only the lengths between their instants. Why, and
//! what each of the crate's ledgers does: `docs/ledger.md`, "Whose clock".

use std::time::SystemTime;

use crate::{
    AttemptUpdate, Claim, Finish, ReconcileClaim, Renew, Resolve, from_millis, later, to_millis,
};

/// Whose clock a [`Ledger`](crate::Ledger) compares times on, as
/// [`Ledger::clock`](crate::Ledger::clock) answers.
///
/// - [`Caller`](Self::Caller): the instants in the requests ([`Claim::now`], a lease's end,
///   [`Claim::window_cutoff`], ...) are compared and stored as they are. Right for a store
///   that one host's processes share (one clock): [`MemoryLedger`](crate::MemoryLedger),
///   `SqliteLedger`.
/// - [`Own`](Self::Own): the ledger reads the present on its own clock (it was `now` when
///   asked) and takes from a request only the lengths between its instants and its own
///   `now` or `at` (the lease, the retention, the window): each request's `on_clock` gives it
///   as the ledger sees it. The times it stores and returns are on its clock. Right for a
///   store that a fleet shares: `PostgresLedger`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerClock {
    /// Compares on the caller's clock.
    Caller,
    /// Compares on its own clock, which read `now` when asked.
    Own {
        /// The ledger's present when it answered.
        now: SystemTime,
    },
}

/// `at` moved from a clock that read `from` to one that reads `to` at the same moment: `to`
/// plus (`at` − `from`), which may be negative. Saturates as [`later`] does, and at the Unix
/// epoch below.
///
/// ```
/// use idempotent_retry_ledger::rebase;
/// use std::time::{Duration, SystemTime};
///
/// let caller = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
/// let ledger = caller - Duration::from_secs(60); // the caller runs 60 s ahead
/// let lease_end = caller + Duration::from_secs(10);
/// assert_eq!(rebase(lease_end, caller, ledger), ledger + Duration::from_secs(10));
/// ```
#[must_use]
pub fn rebase(at: SystemTime, from: SystemTime, to: SystemTime) -> SystemTime {
    match at.duration_since(from) {
        Ok(after) => later(to, after),
        Err(before) => to
            .checked_sub(before.duration())
            .map_or(SystemTime::UNIX_EPOCH, |moved| {
                moved.max(SystemTime::UNIX_EPOCH)
            }),
    }
}

/// The signed length from `from` to `at` in whole milliseconds, saturating: what an
/// own-clock SQL ledger adds to its present.
#[doc(hidden)]
#[must_use]
pub fn millis_after(at: SystemTime, from: SystemTime) -> i64 {
    to_millis(at).saturating_sub(to_millis(from))
}

impl Claim {
    /// This claim as a ledger whose clock reads `now` sees it: every instant moved by the
    /// same amount, so the lease, the retention and the window keep their lengths.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> Claim {
        let from = self.now;
        Claim {
            now,
            lease_until: rebase(self.lease_until, from, now),
            expires_at: rebase(self.expires_at, from, now),
            window_cutoff: rebase(self.window_cutoff, from, now),
            ..self.clone()
        }
    }
}

impl AttemptUpdate {
    /// This update as a ledger whose clock reads `now` sees it: the attempt at `now`, the
    /// lease as long as asked from there.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> AttemptUpdate {
        AttemptUpdate {
            at: now,
            lease_until: rebase(self.lease_until, self.at, now),
            ..self.clone()
        }
    }
}

impl Renew {
    /// This renewal as a ledger whose clock reads `now` sees it: the lease as long as asked
    /// from `now`.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> Renew {
        Renew {
            at: now,
            lease_until: rebase(self.lease_until, self.at, now),
            ..self.clone()
        }
    }
}

impl ReconcileClaim {
    /// This hold as a ledger whose clock reads `now` sees it: the lease as long as asked from
    /// `now`.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> ReconcileClaim {
        ReconcileClaim {
            now,
            lease_until: rebase(self.lease_until, self.now, now),
            ..self.clone()
        }
    }
}

impl Finish {
    /// This finish as a ledger whose clock reads `now` sees it: the last attempt it counts,
    /// if any, stamped `now`.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> Finish {
        Finish {
            last_attempt_at: self.last_attempt_at.map(|_| now),
            ..self.clone()
        }
    }
}

impl Resolve {
    /// The instant this answer's times are measured from: the new window start, else the
    /// note's time, else the retention's end.
    fn reference(&self) -> Option<SystemTime> {
        self.window_from
            .or(self.note.as_ref().map(|note| note.at))
            .or(self.keep_until)
    }

    /// This answer as a ledger whose clock reads `now` sees it: a new window from `now`, the
    /// retention as long as asked from there, the note stamped `now`.
    #[must_use]
    pub fn on_clock(&self, now: SystemTime) -> Resolve {
        let mut moved = self.clone();
        if let Some(from) = self.reference() {
            let shift = |at: SystemTime| rebase(at, from, now);
            moved.window_from = self.window_from.map(shift);
            moved.keep_until = self.keep_until.map(shift);
            if let Some(note) = &mut moved.note {
                note.at = shift(note.at);
            }
        }
        moved
    }

    /// The reference instant in milliseconds, for an own-clock SQL ledger's statement.
    #[doc(hidden)]
    #[must_use]
    pub fn reference_millis(&self) -> Option<i64> {
        self.reference().map(to_millis)
    }
}

/// `ms` as an instant: the inverse of [`to_millis`], for a ledger's clock reading.
#[doc(hidden)]
#[must_use]
pub fn clock_reading(ms: i64) -> LedgerClock {
    LedgerClock::Own {
        now: from_millis(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OperationStatus, ResolutionKind, ResolutionNote};
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
    }

    #[test]
    fn rebase_keeps_lengths_both_ways_and_saturates() {
        assert_eq!(rebase(t(70), t(60), t(0)), t(10));
        assert_eq!(rebase(t(50), t(60), t(0)), t(0) - Duration::from_secs(10));
        assert_eq!(
            rebase(t(0), t(1_000_000_000), SystemTime::UNIX_EPOCH),
            SystemTime::UNIX_EPOCH
        );
        assert_eq!(
            to_millis(rebase(later(t(0), Duration::MAX), t(0), t(60))),
            i64::MAX
        );
        assert_eq!(millis_after(t(0), t(60)), -60_000);
    }

    #[test]
    fn a_request_on_another_clock_keeps_its_lengths() {
        let ahead = Duration::from_secs(60);
        let claim = Claim::builder("k", "f", "w", t(100) + ahead, t(110) + ahead)
            .expires_at(t(3700) + ahead)
            .window_cutoff(t(40) + ahead)
            .build()
            .expect("valid");
        let seen = claim.on_clock(t(100));
        assert_eq!(
            (
                seen.now,
                seen.lease_until,
                seen.expires_at,
                seen.window_cutoff
            ),
            (t(100), t(110), t(3700), t(40))
        );
        let update = AttemptUpdate::new("k", "w", t(5) + ahead, t(15) + ahead).expect("valid");
        let seen = update.on_clock(t(5));
        assert_eq!((seen.at, seen.lease_until), (t(5), t(15)));
        let renew = Renew::new("k", "w", t(5) - ahead, t(15) - ahead).expect("valid");
        let seen = renew.on_clock(t(5));
        assert_eq!((seen.at, seen.lease_until), (t(5), t(15)));
        let hold = ReconcileClaim::new("k", "w", t(5) + ahead, t(25) + ahead).expect("valid");
        assert_eq!(hold.on_clock(t(5)).lease_until, t(25));
        let finish = Finish::new("k", "w", OperationStatus::Unknown, None)
            .expect("valid")
            .with_last_attempt(t(9) + ahead);
        assert_eq!(finish.on_clock(t(9)).last_attempt_at, Some(t(9)));
        let note = ResolutionNote::new(ResolutionKind::NotDone, "probe", t(7) + ahead);
        let resolve = Resolve::new(
            "k",
            "w",
            crate::Resolution::NotDone,
            Some(note),
            t(7) + ahead,
            Duration::from_secs(600),
        )
        .expect("valid");
        let seen = resolve.on_clock(t(7));
        assert_eq!(seen.window_from, Some(t(7)));
        assert_eq!(seen.keep_until, Some(t(607)));
        assert_eq!(seen.note.map(|n| n.at), Some(t(7)));
    }
}
