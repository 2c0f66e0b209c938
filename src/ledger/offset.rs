//! How far this worker's clock is from its ledger's, for a ledger on its own clock
//! ([`LedgerClock::Own`]): measured when the client first uses the ledger and again once a
//! minute, logged at WARN above a second, and exposed as the metric
//! `idempotent_retry.ledger.clock_offset`. The ledger compares on its own clock whatever the
//! offset; the client uses it only to read the ledger's times on its own clock (the window
//! left, a lease's end in a message). Why: `docs/ledger.md`, "Whose clock".

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{Ledger, LedgerClock, OperationRecord, rebase};
use crate::time::Clock;
use crate::time::readable::duration as human;

/// An offset above this is logged at WARN.
pub(crate) const WARN_ABOVE: Duration = Duration::from_secs(1);

/// How long a measurement is used before the next claim measures again.
const FRESH_FOR: Duration = Duration::from_secs(60);

/// The ledger's clock minus this worker's, as last measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Offset {
    /// The ledger compares on the caller's clock: nothing to measure, ever.
    Caller,
    /// The ledger's clock read `ledger` when this worker's read `worker`.
    Own {
        worker: SystemTime,
        ledger: SystemTime,
    },
}

impl Offset {
    /// `record`, its times moved from the ledger's clock to this worker's.
    pub(crate) fn to_worker(self, mut record: OperationRecord) -> OperationRecord {
        if let Offset::Own { worker, ledger } = self {
            let moved = |at: SystemTime| rebase(at, ledger, worker);
            record.first_attempt_at = moved(record.first_attempt_at);
            record.last_attempt_at = record.last_attempt_at.map(moved);
            record.lease_expires_at = record.lease_expires_at.map(moved);
            record.expires_at = moved(record.expires_at);
        }
        record
    }

    /// `at`, an instant on this worker's clock, on the ledger's.
    pub(crate) fn to_ledger(self, at: SystemTime) -> SystemTime {
        match self {
            Offset::Caller => at,
            Offset::Own { worker, ledger } => rebase(at, worker, ledger),
        }
    }

    /// Whether the ledger compares on its own clock.
    pub(crate) fn is_own(self) -> bool {
        matches!(self, Offset::Own { .. })
    }

    /// The offset in seconds, positive when the ledger's clock is ahead of this worker's.
    pub(crate) fn seconds(self) -> f64 {
        match self {
            Offset::Caller => 0.0,
            Offset::Own { worker, ledger } => match ledger.duration_since(worker) {
                Ok(ahead) => ahead.as_secs_f64(),
                Err(behind) => -behind.duration().as_secs_f64(),
            },
        }
    }
}

/// The last measurement, shared by the clones of a front end.
#[derive(Debug, Default)]
pub(crate) struct ClockOffset {
    /// The offset and when it was measured, on the client's monotonic clock.
    last: Mutex<Option<(Offset, Instant)>>,
}

impl ClockOffset {
    /// The offset, measured again when the last measurement is older than a minute (never for
    /// a ledger on the caller's clock). A measurement that fails keeps the last one (none yet:
    /// the caller's clock is assumed) and is logged: the claim that follows meets the same
    /// ledger and reports its error.
    pub(crate) async fn current(&self, ledger: &dyn Ledger, clock: &dyn Clock) -> Offset {
        let last = *self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((offset, at)) = last
            && (offset == Offset::Caller || clock.now().saturating_duration_since(at) < FRESH_FOR)
        {
            return offset;
        }
        let sent = clock.wall();
        let answer = ledger.clock().await;
        let back = clock.wall();
        let offset = match answer {
            Ok(LedgerClock::Caller) => Offset::Caller,
            Ok(LedgerClock::Own { now }) => {
                // The ledger read its clock between the two readings of ours: their midpoint.
                let trip = back.duration_since(sent).unwrap_or_default();
                let offset = Offset::Own {
                    worker: sent + trip / 2,
                    ledger: now,
                };
                report(offset, trip);
                offset
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not read the ledger's clock; the offset from this worker's clock is not known");
                return last.map_or(Offset::Caller, |(offset, _)| offset);
            }
        };
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some((offset, clock.now()));
        offset
    }
}

/// Logs an offset above [`WARN_ABOVE`] and sets the metric.
fn report(offset: Offset, trip: Duration) {
    let seconds = offset.seconds();
    crate::telemetry::metrics::ledger_clock_offset(seconds);
    let size = Duration::from_secs_f64(seconds.abs());
    if size > WARN_ABOVE {
        let side = if seconds > 0.0 { "behind" } else { "ahead of" };
        tracing::warn!(
            offset_seconds = seconds,
            round_trip_ms = u64::try_from(trip.as_millis()).unwrap_or(u64::MAX),
            "this worker's clock is {} {side} the ledger's: the ledger compares leases and \
             windows on its own clock, so no live run is taken over, but this worker's own \
             readings (Retry-After dates, messages) differ by that much; sync the worker's and \
             the database's clocks (NTP)",
            human(size)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
    }

    #[test]
    fn a_record_moves_to_the_worker_s_clock_and_the_offset_has_a_sign() {
        let ahead = Offset::Own {
            worker: t(60),
            ledger: t(0),
        };
        assert!((ahead.seconds() + 60.0).abs() < 1e-9);
        let record = OperationRecord::builder("k", "f", t(10), t(3600))
            .lease("w", t(20))
            .last_attempt_at(t(15))
            .build()
            .expect("valid");
        let moved = ahead.to_worker(record.clone());
        assert_eq!(moved.first_attempt_at, t(70));
        assert_eq!(moved.lease_expires_at, Some(t(80)));
        assert_eq!(moved.last_attempt_at, Some(t(75)));
        assert_eq!(moved.expires_at, t(3660));
        assert_eq!(Offset::Caller.to_worker(record.clone()), record);
        assert_eq!(ahead.to_ledger(t(70)), t(10));
        assert_eq!(Offset::Caller.to_ledger(t(70)), t(70));
        assert!(Offset::Caller.seconds().abs() < f64::EPSILON);
        let behind = Offset::Own {
            worker: t(0),
            ledger: t(60),
        };
        assert!((behind.seconds() - 60.0).abs() < 1e-9);
    }
}
