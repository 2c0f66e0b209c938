//! The retry policy and the pure decision engine every front end shares.
//!
//! [`decide`] takes the policy, the operation's state so far, what the last attempt produced,
//! the current times and an RNG, and returns a [`Decision`]. It reads no clock, sleeps never and
//! has no I/O: the reqwest loop in `request.rs` (and any other front end) feeds it and carries
//! out what it says. Classification lives in `classify.rs`, delays in `backoff.rs` and
//! `retry_after.rs`; this file only combines them with the limits.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use crate::backoff::{backoff_ceiling, full_jitter};
use crate::classify::{FailureKind, StatusClass, classify_status, should_retry_hint};
use crate::error::Error;
use crate::report::WaitReason;
use crate::retry_after::requested_delay;

/// How long and how often to retry one logical operation.
///
/// # Default
///
/// | setting | default | why |
/// |---|---|---|
/// | [`max_attempts`](Self::max_attempts) | 5 | the first attempt and four retries |
/// | [`base_delay`](Self::base_delay) | 500 ms | the first backoff ceiling (Stripe and OpenAI SDKs use 0.5 s) |
/// | [`max_delay`](Self::max_delay) | 30 s | the backoff cap; jitter is drawn inside it |
/// | [`reconcile_window`](Self::reconcile_window) | 24 h | Stripe v1 may prune a key after 24 h: a later retry would be a new request |
/// | [`attempt_timeout`](Self::attempt_timeout) | 30 s | each attempt, response body included |
/// | [`max_retry_after`](Self::max_retry_after) | 60 s | the longest server-requested wait honoured |
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
///     .max_attempts(3)
///     .base_delay(Duration::from_millis(200))
///     .reconcile_window(Duration::from_secs(6 * 3600)); // a provider keeping keys 6 h
/// assert!(policy.validate().is_ok());
/// assert!(RetryPolicy::default().max_attempts(0).validate().is_err());
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
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy (see the table above).
    pub const fn new() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
            reconcile_window: Duration::from_secs(24 * 3600),
            attempt_timeout: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(60),
        }
    }

    /// The most attempts per operation, the first one included. Must be at least 1; 1 turns
    /// retries off.
    ///
    /// Default: 5.
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The backoff ceiling for the first retry; it doubles for each retry after that, up to
    /// [`max_delay`](Self::max_delay). Must not exceed `max_delay`.
    ///
    /// Default: 500 ms.
    pub const fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// The cap on the backoff ceiling. The wait is drawn uniformly from zero up to the
    /// ceiling, so no backoff wait exceeds it (a server's `Retry-After` may, up to
    /// [`max_retry_after`](Self::max_retry_after)).
    ///
    /// Default: 30 s.
    pub const fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// How long after the first attempt started the operation may still be retried. No wait
    /// ends past it and no attempt starts after it; when the next wait would cross it, the
    /// operation ends with [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow):
    /// the caller must reconcile (look the operation up by its key), not retry. Keep it
    /// shorter than the receiver keeps keys. Must be positive.
    ///
    /// Default: 24 h.
    pub const fn reconcile_window(mut self, window: Duration) -> Self {
        self.reconcile_window = window;
        self
    }

    /// The limit for each attempt, from connecting until the response body has been read. An
    /// attempt never runs past the end of the reconcile window either. Must be positive.
    ///
    /// Default: 30 s.
    pub const fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The longest wait a server may ask for with `Retry-After` or `retry-after-ms`. A longer
    /// request ends the operation at once with
    /// [`ErrorKind::RetryAfterTooLong`](crate::ErrorKind::RetryAfterTooLong) instead of
    /// sleeping.
    ///
    /// Default: 60 s.
    pub const fn max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// The configured maximum number of attempts.
    #[must_use]
    pub const fn get_max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The configured base delay.
    #[must_use]
    pub const fn get_base_delay(&self) -> Duration {
        self.base_delay
    }

    /// The configured backoff cap.
    #[must_use]
    pub const fn get_max_delay(&self) -> Duration {
        self.max_delay
    }

    /// The configured reconcile window.
    #[must_use]
    pub const fn get_reconcile_window(&self) -> Duration {
        self.reconcile_window
    }

    /// The configured per-attempt timeout.
    #[must_use]
    pub const fn get_attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The configured longest honoured server-requested wait.
    #[must_use]
    pub const fn get_max_retry_after(&self) -> Duration {
        self.max_retry_after
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
                "base_delay ({:?}) exceeds max_delay ({:?})",
                self.base_delay, self.max_delay
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

/// One logical operation's state, as the decision engine sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OperationState {
    /// When the first attempt started.
    pub(crate) started: Instant,
    /// Attempts made so far, the one being decided on included.
    pub(crate) attempts: u32,
    /// Whether every attempt carries an idempotency key.
    pub(crate) keyed: bool,
    /// Whether the method is idempotent by definition (RFC 9110 9.2.2).
    pub(crate) idempotent_method: bool,
    /// Whether the request can be sent again (its body can be cloned).
    pub(crate) replayable: bool,
}

/// What the last attempt produced.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Observed<'a> {
    Response {
        status: StatusCode,
        headers: &'a HeaderMap,
    },
    Failure(FailureKind),
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub(crate) enum Decision {
    /// The response is the answer: hand it to the caller.
    Return,
    /// Wait, then send another attempt with the same key.
    Retry {
        kind: FailureKind,
        delay: Duration,
        reason: WaitReason,
    },
    /// End the operation with an error.
    Stop { kind: Option<FailureKind>, stop: Stop },
}

/// Why an operation stopped without a final answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// `max_attempts` reached.
    Exhausted,
    /// The next wait would end past the reconcile window.
    Window,
    /// The server asked for a wait longer than allowed or than the window has left.
    RetryAfterTooLong { asked: Duration },
    /// A retry was due but the body cannot be sent again.
    NotReplayable,
    /// A transport failure after the request may have reached the server, on a request with
    /// neither a key nor an idempotent method: resending could repeat the side effect.
    NotRetrySafe,
    /// A transport failure that retrying cannot fix.
    Fatal,
}

/// Decides what follows an attempt. Pure: same inputs, same decision.
pub(crate) fn decide<R: rand::Rng + ?Sized>(
    policy: &RetryPolicy,
    state: &OperationState,
    observed: Observed<'_>,
    now: Instant,
    wall: SystemTime,
    rng: &mut R,
) -> Decision {
    let (kind, asked, server_said_retry) = match observed {
        Observed::Response { status, headers } => {
            match classify_status(status, headers, state.keyed) {
                StatusClass::Final => return Decision::Return,
                StatusClass::Retry(kind) => (
                    kind,
                    requested_delay(headers, wall),
                    should_retry_hint(headers) == Some(true),
                ),
            }
        }
        Observed::Failure(kind) if !kind.is_transient() => {
            return Decision::Stop {
                kind: Some(kind),
                stop: Stop::Fatal,
            };
        }
        Observed::Failure(kind) => (kind, None, false),
    };
    let stop = |stop| Decision::Stop {
        kind: Some(kind),
        stop,
    };

    // Without a key, a non-idempotent request is sent again only when it provably never
    // left, or when the server itself says a retry is safe.
    if !state.keyed && !state.idempotent_method && !kind.never_sent() && !server_said_retry {
        return match observed {
            Observed::Response { .. } => Decision::Return,
            Observed::Failure(_) => stop(Stop::NotRetrySafe),
        };
    }
    if state.attempts >= policy.max_attempts {
        return stop(Stop::Exhausted);
    }
    if !state.replayable {
        return stop(Stop::NotReplayable);
    }
    let remaining = policy
        .reconcile_window
        .saturating_sub(now.saturating_duration_since(state.started));
    if let Some(asked) = asked
        && (asked > policy.max_retry_after || asked >= remaining)
    {
        return stop(Stop::RetryAfterTooLong { asked });
    }
    let retry = state.attempts.saturating_sub(1);
    let backoff = full_jitter(retry, policy.base_delay, policy.max_delay, rng);
    let (delay, reason) = match asked {
        Some(asked) if asked >= backoff => (asked, WaitReason::RetryAfter { asked }),
        _ => (
            backoff,
            WaitReason::Backoff {
                ceiling: backoff_ceiling(retry, policy.base_delay, policy.max_delay),
            },
        ),
    };
    // The next attempt must start strictly before the window ends.
    if delay >= remaining {
        return stop(Stop::Window);
    }
    Decision::Retry {
        kind,
        delay,
        reason,
    }
}

/// The timeout for an attempt starting at `now`: the per-attempt timeout, shortened so the
/// attempt cannot outlive the reconcile window. `None` when the window has ended.
pub(crate) fn attempt_budget(
    window: Duration,
    timeout: Duration,
    started: Instant,
    now: Instant,
) -> Option<Duration> {
    let remaining = window.saturating_sub(now.saturating_duration_since(started));
    if remaining.is_zero() {
        None
    } else {
        Some(timeout.min(remaining))
    }
}

/// Whether a method is idempotent by definition (RFC 9110 9.2.2), so it may be retried
/// without a key.
pub(crate) fn is_idempotent_method(method: &http::Method) -> bool {
    use http::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
        Method::TRACE,
    ]
    .contains(method)
}
