//! The reconcile window: how long one logical operation may be retried, counted from its first
//! attempt. This file is the one place the rule is computed; the decision (`decide.rs`), the
//! attempt loop, the ledger's claim and the ledgers themselves call it.
//!
//! The rule: an attempt may start only while the window is open, strictly before
//! `first attempt + window`; a wait (backoff or `Retry-After`) is taken only if the next attempt
//! would still start inside it; an attempt's timeout is clipped so it ends with the window.
//! With a [`Ledger`](crate::ledger::Ledger) the window spans runs: it counts from the operation's first
//! attempt in its first run (`first_attempt_at`, wall-clock time shared by every worker), so a
//! later run gets only what is left.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// What is left of a window of `length` that opened at `started`, at `now` (monotonic time,
/// within one run). Zero once it has closed.
pub(crate) fn remaining(length: Duration, started: Instant, now: Instant) -> Duration {
    length.saturating_sub(now.saturating_duration_since(started))
}

/// Whether a wait of `delay` still lets the next attempt start inside a window with
/// `remaining` left: strictly before it closes.
pub(crate) fn wait_fits(delay: Duration, remaining: Duration) -> bool {
    delay < remaining
}

/// The timeout for an attempt starting at `now`: the per-attempt timeout, shortened so the
/// attempt cannot outlive the window. `None` when the window has closed.
pub(crate) fn attempt_budget(
    length: Duration,
    timeout: Duration,
    started: Instant,
    now: Instant,
) -> Option<Duration> {
    let remaining = remaining(length, started, now);
    if remaining.is_zero() {
        None
    } else {
        Some(timeout.min(remaining))
    }
}

pub(crate) use idempotent_retry_ledger::window::{cutoff, is_open};

/// What a run starting at `now` has left of a window of `length` that opened at
/// `first_attempt_at` in an earlier run (zero when it has closed). A clock that reads earlier
/// than `first_attempt_at` (skew between workers) counts as no time spent.
pub(crate) fn left_after_earlier_runs(
    length: Duration,
    first_attempt_at: SystemTime,
    now: SystemTime,
) -> Duration {
    length.saturating_sub(now.duration_since(first_attempt_at).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> Instant {
        crate::time::Clock::now(&crate::time::TokioClock)
    }

    #[test]
    fn attempt_budget_is_clipped_to_the_window() {
        let start = t0();
        let window = Duration::from_secs(10);
        let timeout = Duration::from_secs(30);
        assert_eq!(attempt_budget(window, timeout, start, start), Some(window));
        assert_eq!(
            attempt_budget(window, Duration::from_secs(1), start, start),
            Some(Duration::from_secs(1))
        );
        assert_eq!(attempt_budget(window, timeout, start, start + window), None);
        assert_eq!(
            remaining(window, start, start + Duration::from_secs(4)),
            Duration::from_secs(6)
        );
        assert_eq!(remaining(window, start, start + window * 2), Duration::ZERO);
    }

    #[test]
    fn a_wait_must_end_strictly_inside_the_window() {
        let left = Duration::from_secs(5);
        assert!(wait_fits(Duration::from_millis(4_999), left));
        assert!(!wait_fits(left, left));
        assert!(!wait_fits(Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn across_runs_the_window_counts_from_the_first_attempt() {
        let first = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let day = Duration::from_secs(86_400);
        let later = first + Duration::from_secs(3_600);
        assert_eq!(
            left_after_earlier_runs(day, first, later),
            day - Duration::from_secs(3_600)
        );
        assert_eq!(
            left_after_earlier_runs(day, first, first + day),
            Duration::ZERO
        );
        // A clock behind the first run's counts as nothing spent.
        assert_eq!(left_after_earlier_runs(day, later, first), day);
        // Open strictly inside: a row first attempted exactly at the cutoff is outside.
        let cut = cutoff(later, Duration::from_secs(3_600));
        assert_eq!(cut, first);
        assert!(!is_open(first, cut));
        assert!(is_open(first + Duration::from_millis(1), cut));
        assert_eq!(cutoff(first, Duration::MAX), SystemTime::UNIX_EPOCH);
    }
}
