//! The retry policy: how long and how often one logical operation is retried. Configuration
//! only; the decision that applies it is `decide.rs`.

use std::time::Duration;

use crate::outcome::error::Error;
/// How long and how often to retry one logical operation.
///
/// # Default
///
/// [`RetryPolicy::new()`] holds the defaults listed, with their reasons, in the crate's
/// [defaults table](crate#defaults).
///
/// # Server-requested waits
///
/// The wait before a retry is the longer of the jittered backoff and the server's
/// `Retry-After` or `retry-after-ms` (unparsable counts as absent). A request longer than
/// [`max_retry_after`](Self::max_retry_after), or than the window has left, ends the operation
/// with [`ErrorKind::RetryAfterTooLong`](crate::ErrorKind::RetryAfterTooLong), the request in
/// [`Error::retry_after`](crate::Error::retry_after). Every parsing rule:
/// `docs/retry-after.md`.
///
/// The setters do not validate; [`ClientBuilder::build`](crate::ClientBuilder::build) and
/// [`RequestBuilder::send`](crate::RequestBuilder::send) call [`validate`](Self::validate).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idempotent_retry::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .with_max_attempts(3)
///     .with_base_delay(Duration::from_millis(200))
///     .with_reconcile_window(Duration::from_secs(6 * 3600)); // a provider keeping keys 6 h
/// assert!(policy.validate().is_ok());
/// assert!(RetryPolicy::default().with_max_attempts(0).validate().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct RetryPolicy {
    max_attempts: u32,
    base_delay: Duration,
    max_delay: Duration,
    reconcile_window: Duration,
    attempt_timeout: Duration,
    max_retry_after: Duration,
    max_in_progress_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy (see the crate's [defaults table](crate#defaults)).
    pub const fn new() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            reconcile_window: Duration::from_secs(24 * 3600),
            attempt_timeout: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
            max_in_progress_wait: Duration::from_secs(60),
        }
    }

    /// The most attempts per operation, the first one included. Must be at least 1; 1 turns
    /// retries off.
    ///
    /// Zero is refused by [`validate`](Self::validate). There is no upper limit: with
    /// `u32::MAX` the operation is in practice bounded by the
    /// [`reconcile_window`](Self::reconcile_window) and the client's
    /// [retry budget](crate::RetryBudget) instead.
    ///
    /// Default: 5.
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The backoff ceiling for the first retry; it doubles for each retry after that, up to
    /// [`max_delay`](Self::max_delay). Must not exceed `max_delay`
    /// ([`validate`](Self::validate) refuses it).
    ///
    /// Zero makes every backoff wait zero (retries follow each other at once, still within the
    /// attempt limit, the window and the budget). Doubling saturates: a ceiling that would
    /// overflow is `max_delay`.
    ///
    /// Default: 500 ms.
    pub const fn with_base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The cap on the backoff ceiling. The wait is drawn uniformly from zero up to the
    /// ceiling, so no backoff wait exceeds it (a server's `Retry-After` may, up to
    /// [`max_retry_after`](Self::max_retry_after)).
    ///
    /// Zero (with a zero `base_delay`) turns backoff waits off. `Duration::MAX` means no cap;
    /// a wait is then drawn from at most `u64::MAX` nanoseconds (about 584 years), and a wait
    /// that would end past the [`reconcile_window`](Self::reconcile_window) ends the operation
    /// with [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow) instead of
    /// sleeping.
    ///
    /// Default: 30 s.
    pub const fn with_max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How long after the first attempt started the operation may still be retried. No wait
    /// ends past it and no attempt starts after it; when the next wait would cross it, the
    /// operation ends with [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow):
    /// the caller must reconcile (look the operation up by its key), not retry. Keep it
    /// shorter than the receiver keeps keys. Must be positive
    /// ([`validate`](Self::validate) refuses zero).
    ///
    /// `Duration::MAX` means no window; every computation with it saturates, and a
    /// [`Ledger`](crate::ledger::Ledger) row's retention (twice the window) is clamped to the latest
    /// time a ledger stores.
    ///
    /// Default: 24 h.
    pub const fn with_reconcile_window(mut self, window: Duration) -> Self {
        self.reconcile_window = window;
        self
    }

    /// The limit for each attempt, from connecting until the response body has been read. An
    /// attempt never runs past the end of the reconcile window either. Must be positive
    /// ([`validate`](Self::validate) refuses zero).
    ///
    /// `Duration::MAX` means no per-attempt limit (only the window's); the timers it arms
    /// saturate instead of overflowing.
    ///
    /// Default: 30 s.
    pub const fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The longest wait a server may ask for with `Retry-After` or `retry-after-ms`. A longer
    /// request ends the operation at once with
    /// [`ErrorKind::RetryAfterTooLong`](crate::ErrorKind::RetryAfterTooLong) instead of
    /// sleeping.
    ///
    /// Zero honours only `Retry-After: 0`; `Duration::MAX` honours any wait that ends inside
    /// the [`reconcile_window`](Self::reconcile_window) (a longer one still ends the operation
    /// with `RetryAfterTooLong`).
    ///
    /// Default: 60 s.
    pub const fn with_max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// How long an operation waits for a receiver that says the operation is still in progress
    /// there: a `409 Conflict` on a keyed request
    /// ([`FailureKind::InProgress`](crate::FailureKind::InProgress)), the answer of Stripe and
    /// most idempotency middlewares while another request with the key (often one of this
    /// operation's own attempts, timed out or dropped by its caller) is still running.
    ///
    /// Such an answer is a wait for the live operation, not a failed attempt: it does not
    /// count toward [`max_attempts`](Self::max_attempts). Between two of them the operation
    /// backs off with the usual capped full jitter, in a sequence of its own (the first wait
    /// drawn below [`base_delay`](Self::base_delay), doubling up to
    /// [`max_delay`](Self::max_delay)), or waits what the receiver's `Retry-After` asks (up to
    /// [`max_retry_after`](Self::max_retry_after)). This limit is counted from the
    /// operation's first in-progress answer: no wait for one ends past it (a backoff wait is
    /// shortened to end there), and an in-progress answer at or after it, or one whose
    /// `Retry-After` would end past it, ends the operation with
    /// [`ErrorKind::StillInProgress`](crate::ErrorKind::StillInProgress), outcome unknown. The
    /// [`reconcile_window`](Self::reconcile_window) bounds these waits too. Why: the
    /// `docs/in-progress.md` page in the package.
    ///
    /// Zero waits for none: the first in-progress answer ends the operation.
    /// `Duration::MAX` waits as long as the reconcile window allows.
    ///
    /// Default: 1 min.
    pub const fn with_max_in_progress_wait(mut self, limit: Duration) -> Self {
        self.max_in_progress_wait = limit;
        self
    }

    /// The configured maximum number of attempts
    /// (set with [`with_max_attempts`](Self::with_max_attempts)).
    #[must_use]
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The configured base delay (set with [`with_base_delay`](Self::with_base_delay)).
    #[must_use]
    pub const fn base_delay(&self) -> Duration {
        self.base_delay
    }

    /// The configured backoff cap (set with [`with_max_delay`](Self::with_max_delay)).
    #[must_use]
    pub const fn max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The configured reconcile window
    /// (set with [`with_reconcile_window`](Self::with_reconcile_window)).
    #[must_use]
    pub const fn reconcile_window(&self) -> Duration {
        self.reconcile_window
    }

    /// The configured per-attempt timeout
    /// (set with [`with_attempt_timeout`](Self::with_attempt_timeout)).
    #[must_use]
    pub const fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The configured longest honoured server-requested wait
    /// (set with [`with_max_retry_after`](Self::with_max_retry_after)).
    #[must_use]
    pub const fn max_retry_after(&self) -> Duration {
        self.max_retry_after
    }

    /// The configured limit on waiting for an operation the receiver reports in progress
    /// (set with [`with_max_in_progress_wait`](Self::with_max_in_progress_wait)).
    #[must_use]
    pub const fn max_in_progress_wait(&self) -> Duration {
        self.max_in_progress_wait
    }

    /// Checks that the settings make sense together.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::Builder`](crate::ErrorKind::Builder) error naming the setting when
    /// `max_attempts` is 0, `base_delay` exceeds `max_delay`, or `reconcile_window` or
    /// `attempt_timeout` is zero.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_attempts == 0 {
            return Err(Error::builder("max_attempts must be at least 1"));
        }
        if self.base_delay > self.max_delay {
            return Err(Error::builder(format!(
                "base_delay ({}) exceeds max_delay ({})",
                crate::time::readable::duration(self.base_delay),
                crate::time::readable::duration(self.max_delay)
            )));
        }
        if self.reconcile_window.is_zero() {
            return Err(Error::builder("reconcile_window must be positive"));
        }
        if self.attempt_timeout.is_zero() {
            return Err(Error::builder("attempt_timeout must be positive"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_setting() {
        let cases = [
            (RetryPolicy::default().with_max_attempts(0), "max_attempts"),
            (
                RetryPolicy::default()
                    .with_base_delay(Duration::from_secs(10))
                    .with_max_delay(Duration::from_secs(1)),
                "base_delay",
            ),
            (
                RetryPolicy::default().with_reconcile_window(Duration::ZERO),
                "reconcile_window",
            ),
            (
                RetryPolicy::default().with_attempt_timeout(Duration::ZERO),
                "attempt_timeout",
            ),
        ];
        for (policy, name) in cases {
            let err = policy.validate().expect_err(name);
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains(name), "{err}");
        }
        let extreme = RetryPolicy::default()
            .with_max_attempts(u32::MAX)
            .with_max_delay(Duration::MAX)
            .with_reconcile_window(Duration::MAX)
            .with_attempt_timeout(Duration::MAX)
            .with_max_retry_after(Duration::MAX)
            .with_max_in_progress_wait(Duration::MAX);
        assert!(extreme.validate().is_ok());
        let no_waits = RetryPolicy::default().with_max_in_progress_wait(Duration::ZERO);
        assert!(no_waits.validate().is_ok());
    }

    #[test]
    fn getters_return_what_the_setters_set() {
        let policy = RetryPolicy::new()
            .with_max_attempts(7)
            .with_base_delay(Duration::from_millis(3))
            .with_max_delay(Duration::from_secs(4))
            .with_reconcile_window(Duration::from_secs(5))
            .with_attempt_timeout(Duration::from_secs(6))
            .with_max_retry_after(Duration::from_secs(8))
            .with_max_in_progress_wait(Duration::from_secs(9));
        assert_eq!(policy.max_attempts(), 7);
        assert_eq!(policy.base_delay(), Duration::from_millis(3));
        assert_eq!(policy.max_delay(), Duration::from_secs(4));
        assert_eq!(policy.reconcile_window(), Duration::from_secs(5));
        assert_eq!(policy.attempt_timeout(), Duration::from_secs(6));
        assert_eq!(policy.max_retry_after(), Duration::from_secs(8));
        assert_eq!(policy.max_in_progress_wait(), Duration::from_secs(9));
        let defaults = RetryPolicy::default();
        assert_eq!(defaults.max_attempts(), 5);
        assert_eq!(defaults.base_delay(), Duration::from_millis(500));
        assert_eq!(defaults.max_delay(), Duration::from_secs(30));
        assert_eq!(defaults.reconcile_window(), Duration::from_secs(24 * 3600));
        assert_eq!(defaults.attempt_timeout(), Duration::from_secs(30));
        assert_eq!(defaults.max_retry_after(), Duration::from_secs(60));
        assert_eq!(defaults.max_in_progress_wait(), Duration::from_secs(60));
    }
}
