//! The reconcile window as the ledger applies it: a row first attempted at or before the
//! cutoff is outside its window and is not taken over. The client computes the cutoff from
//! its policy's window; the SQL ledgers state the same comparison in their claim
//! (`first_attempt_at > cutoff`).

use std::time::{Duration, SystemTime};

/// The instant at or before which an operation first attempted is outside a window of
/// `length`, seen at `now` (wall-clock time, across runs and workers). The Unix epoch when
/// the window reaches back past it.
///
/// ```
/// use idempotent_retry_ledger::window::{cutoff, is_open};
/// use std::time::{Duration, SystemTime};
///
/// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
/// let cut = cutoff(now, Duration::from_secs(600));
/// assert!(is_open(now - Duration::from_secs(599), cut));
/// assert!(!is_open(now - Duration::from_secs(600), cut));
/// ```
#[must_use]
pub fn cutoff(now: SystemTime, length: Duration) -> SystemTime {
    now.checked_sub(length).unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Whether an operation first attempted at `first_attempt_at` is still inside its window,
/// given the [`cutoff`]: strictly after it.
#[must_use]
pub fn is_open(first_attempt_at: SystemTime, cutoff: SystemTime) -> bool {
    first_attempt_at > cutoff
}
