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
    /// Zero is refused by [`validate`](Self::validate). There is no upper limit: with
    /// `u32::MAX` the operation is in practice bounded by the
    /// [`reconcile_window`](Self::reconcile_window) and the client's
    /// [retry budget](crate::RetryBudget) instead.
    ///
    /// Default: 5.
    pub const fn max_attempts(mut self, attempts: u32) -> Self {
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
    pub const fn base_delay(mut self, delay: Duration) -> Self {
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
    pub const fn max_delay(mut self, delay: Duration) -> Self {
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
    /// [`Ledger`](crate::Ledger) row's retention (twice the window) is clamped to the latest
    /// time a ledger stores.
    ///
    /// Default: 24 h.
    pub const fn reconcile_window(mut self, window: Duration) -> Self {
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
    pub const fn attempt_timeout(mut self, timeout: Duration) -> Self {
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
    Stop {
        kind: Option<FailureKind>,
        stop: Stop,
    },
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
    /// A retry was due but the client's retry budget could not pay for it.
    BudgetExhausted,
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

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    use crate::test_rng::ConstRng;

    const MAX: u64 = u64::MAX;
    static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

    fn t0() -> Instant {
        crate::time::Clock::now(&crate::time::TokioClock)
    }

    fn wall() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn state(attempts: u32, keyed: bool, idempotent: bool) -> OperationState {
        OperationState {
            started: t0(),
            attempts,
            keyed,
            idempotent_method: idempotent,
            replayable: true,
        }
    }

    fn status(code: u16, headers: &HeaderMap) -> Observed<'_> {
        Observed::Response {
            status: StatusCode::from_u16(code).expect("valid status in test"),
            headers,
        }
    }

    fn run(policy: &RetryPolicy, state: &OperationState, observed: Observed<'_>) -> Decision {
        decide(
            policy,
            state,
            observed,
            state.started,
            wall(),
            &mut ConstRng(MAX),
        )
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn final_statuses_are_returned() {
        let policy = RetryPolicy::default();
        for code in [200, 201, 204, 302, 400, 404, 422, 501, 505] {
            assert_eq!(
                run(&policy, &state(1, true, false), status(code, &NO_HEADERS)),
                Decision::Return,
                "{code}"
            );
        }
    }

    #[test]
    fn server_error_retries_with_full_jitter_ceiling() {
        let policy = RetryPolicy::default();
        let decision = run(&policy, &state(1, true, false), status(503, &NO_HEADERS));
        assert_eq!(
            decision,
            Decision::Retry {
                kind: FailureKind::ServerError,
                delay: Duration::from_millis(500),
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_millis(500)
                },
            }
        );
        // The third retry's ceiling is 500 ms * 2^3; a zero word draws zero.
        let decision = decide(
            &policy,
            &state(4, true, false),
            status(503, &NO_HEADERS),
            t0(),
            wall(),
            &mut ConstRng(0),
        );
        assert_eq!(
            decision,
            Decision::Retry {
                kind: FailureKind::ServerError,
                delay: Duration::ZERO,
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_secs(4)
                },
            }
        );
    }

    #[test]
    fn seeded_rng_gives_a_reproducible_delay_sequence() {
        let policy = RetryPolicy::default();
        let delays = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (1..5)
                .map(|n| {
                    let s = state(n, true, false);
                    match decide(
                        &policy,
                        &s,
                        status(503, &NO_HEADERS),
                        s.started,
                        wall(),
                        &mut rng,
                    ) {
                        Decision::Retry { delay, .. } => delay,
                        other => panic!("expected a retry, got {other:?}"),
                    }
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(delays(7), delays(7));
        assert_ne!(delays(7), delays(8));
    }

    #[test]
    fn stops_after_max_attempts() {
        let policy = RetryPolicy::default().max_attempts(3);
        assert!(matches!(
            run(&policy, &state(2, true, false), status(503, &NO_HEADERS)),
            Decision::Retry { .. }
        ));
        assert_eq!(
            run(&policy, &state(3, true, false), status(503, &NO_HEADERS)),
            Decision::Stop {
                kind: Some(FailureKind::ServerError),
                stop: Stop::Exhausted
            }
        );
    }

    #[test]
    fn retry_after_is_a_floor() {
        let policy = RetryPolicy::default();
        let h = headers(&[("retry-after", "2")]);
        assert_eq!(
            run(&policy, &state(1, true, false), status(429, &h)),
            Decision::Retry {
                kind: FailureKind::Throttled,
                delay: Duration::from_secs(2),
                reason: WaitReason::RetryAfter {
                    asked: Duration::from_secs(2)
                },
            }
        );
        // Backoff above the asked delay wins: retry 4 draws up to 8 s.
        let h = headers(&[("retry-after-ms", "10")]);
        let policy = policy.max_attempts(10);
        match run(&policy, &state(5, true, false), status(503, &h)) {
            Decision::Retry { delay, reason, .. } => {
                assert_eq!(delay, Duration::from_secs(8));
                assert!(matches!(reason, WaitReason::Backoff { .. }));
            }
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn retry_after_too_long_stops_at_once() {
        let policy = RetryPolicy::default();
        let h = headers(&[("retry-after", "61")]);
        assert_eq!(
            run(&policy, &state(1, true, false), status(429, &h)),
            Decision::Stop {
                kind: Some(FailureKind::Throttled),
                stop: Stop::RetryAfterTooLong {
                    asked: Duration::from_secs(61)
                }
            }
        );
        // Within max_retry_after but past the window's end.
        let policy = RetryPolicy::default().reconcile_window(Duration::from_secs(30));
        let h = headers(&[("retry-after", "30")]);
        assert_eq!(
            run(&policy, &state(1, true, false), status(503, &h)),
            Decision::Stop {
                kind: Some(FailureKind::ServerError),
                stop: Stop::RetryAfterTooLong {
                    asked: Duration::from_secs(30)
                }
            }
        );
        // Garbage is absent, not zero: plain backoff.
        let h = headers(&[("retry-after", "soon")]);
        assert!(matches!(
            run(&policy, &state(1, true, false), status(503, &h)),
            Decision::Retry {
                reason: WaitReason::Backoff { .. },
                ..
            }
        ));
    }

    #[test]
    fn never_waits_past_the_window() {
        let policy = RetryPolicy::default().reconcile_window(Duration::from_secs(10));
        let s = state(1, true, false);
        // 9.6 s in, 400 ms left: a 500 ms wait would cross the end.
        let now = s.started + Duration::from_millis(9600);
        let decision = decide(
            &policy,
            &s,
            status(503, &NO_HEADERS),
            now,
            wall(),
            &mut ConstRng(MAX),
        );
        assert_eq!(
            decision,
            Decision::Stop {
                kind: Some(FailureKind::ServerError),
                stop: Stop::Window
            }
        );
        // With a zero draw the wait fits.
        let decision = decide(
            &policy,
            &s,
            status(503, &NO_HEADERS),
            now,
            wall(),
            &mut ConstRng(0),
        );
        assert!(matches!(decision, Decision::Retry { .. }));
    }

    #[test]
    fn keyless_non_idempotent_requests_are_resent_only_when_never_sent() {
        let policy = RetryPolicy::default();
        let post = state(1, false, false);
        for code in [429, 503] {
            assert_eq!(
                run(&policy, &post, status(code, &NO_HEADERS)),
                Decision::Return
            );
        }
        assert_eq!(
            run(
                &policy,
                &post,
                Observed::Failure(FailureKind::ConnectionReset)
            ),
            Decision::Stop {
                kind: Some(FailureKind::ConnectionReset),
                stop: Stop::NotRetrySafe
            }
        );
        assert_eq!(
            run(&policy, &post, Observed::Failure(FailureKind::Timeout)),
            Decision::Stop {
                kind: Some(FailureKind::Timeout),
                stop: Stop::NotRetrySafe
            }
        );
        for kind in [FailureKind::Connect, FailureKind::Dns] {
            assert!(matches!(
                run(&policy, &post, Observed::Failure(kind)),
                Decision::Retry { .. }
            ));
        }
        // The server may say a retry is safe.
        let h = headers(&[("x-should-retry", "true")]);
        assert!(matches!(
            run(&policy, &post, status(503, &h)),
            Decision::Retry { .. }
        ));
        // Idempotent methods retry without a key.
        let get = state(1, false, true);
        assert!(matches!(
            run(
                &policy,
                &get,
                Observed::Failure(FailureKind::ConnectionReset)
            ),
            Decision::Retry { .. }
        ));
    }

    #[test]
    fn conflict_is_retried_only_with_a_key() {
        let policy = RetryPolicy::default();
        assert!(matches!(
            run(&policy, &state(1, true, false), status(409, &NO_HEADERS)),
            Decision::Retry {
                kind: FailureKind::InProgress,
                ..
            }
        ));
        assert_eq!(
            run(&policy, &state(1, false, true), status(409, &NO_HEADERS)),
            Decision::Return
        );
    }

    #[test]
    fn unreplayable_bodies_and_fatal_errors_stop() {
        let policy = RetryPolicy::default();
        let mut s = state(1, true, false);
        s.replayable = false;
        assert_eq!(
            run(&policy, &s, status(503, &NO_HEADERS)),
            Decision::Stop {
                kind: Some(FailureKind::ServerError),
                stop: Stop::NotReplayable
            }
        );
        assert_eq!(run(&policy, &s, status(200, &NO_HEADERS)), Decision::Return);
        assert_eq!(
            run(
                &policy,
                &state(1, true, false),
                Observed::Failure(FailureKind::Fatal)
            ),
            Decision::Stop {
                kind: Some(FailureKind::Fatal),
                stop: Stop::Fatal
            }
        );
    }

    #[test]
    fn validation_names_the_setting() {
        let cases = [
            (RetryPolicy::default().max_attempts(0), "max_attempts"),
            (
                RetryPolicy::default()
                    .base_delay(Duration::from_secs(10))
                    .max_delay(Duration::from_secs(1)),
                "base_delay",
            ),
            (
                RetryPolicy::default().reconcile_window(Duration::ZERO),
                "reconcile_window",
            ),
            (
                RetryPolicy::default().attempt_timeout(Duration::ZERO),
                "attempt_timeout",
            ),
        ];
        for (policy, name) in cases {
            let err = policy.validate().expect_err(name);
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains(name), "{err}");
        }
        let extreme = RetryPolicy::default()
            .max_attempts(u32::MAX)
            .max_delay(Duration::MAX)
            .reconcile_window(Duration::MAX)
            .attempt_timeout(Duration::MAX)
            .max_retry_after(Duration::MAX);
        assert!(extreme.validate().is_ok());
    }

    #[test]
    fn getters_return_what_the_setters_set() {
        let policy = RetryPolicy::new()
            .max_attempts(7)
            .base_delay(Duration::from_millis(3))
            .max_delay(Duration::from_secs(4))
            .reconcile_window(Duration::from_secs(5))
            .attempt_timeout(Duration::from_secs(6))
            .max_retry_after(Duration::from_secs(8));
        assert_eq!(policy.get_max_attempts(), 7);
        assert_eq!(policy.get_base_delay(), Duration::from_millis(3));
        assert_eq!(policy.get_max_delay(), Duration::from_secs(4));
        assert_eq!(policy.get_reconcile_window(), Duration::from_secs(5));
        assert_eq!(policy.get_attempt_timeout(), Duration::from_secs(6));
        assert_eq!(policy.get_max_retry_after(), Duration::from_secs(8));
        let defaults = RetryPolicy::default();
        assert_eq!(defaults.get_max_attempts(), 5);
        assert_eq!(defaults.get_base_delay(), Duration::from_millis(500));
        assert_eq!(defaults.get_max_delay(), Duration::from_secs(30));
        assert_eq!(
            defaults.get_reconcile_window(),
            Duration::from_secs(24 * 3600)
        );
        assert_eq!(defaults.get_attempt_timeout(), Duration::from_secs(30));
        assert_eq!(defaults.get_max_retry_after(), Duration::from_secs(60));
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
    }

    fn outcome() -> impl Strategy<Value = (Option<u16>, Option<FailureKind>, Option<u64>)> {
        let kinds = prop::sample::select(vec![
            FailureKind::Dns,
            FailureKind::Connect,
            FailureKind::Timeout,
            FailureKind::ConnectionReset,
            FailureKind::ConnectionClosed,
        ]);
        prop_oneof![
            (
                prop::sample::select(vec![200u16, 400, 408, 409, 422, 429, 500, 502, 503, 504]),
                prop::option::of(0u64..200_000)
            )
                .prop_map(|(code, ms)| (Some(code), None, ms)),
            kinds.prop_map(|k| (None, Some(k), None)),
        ]
    }

    proptest! {
        /// Simulates whole operations on a virtual clock: whatever the server does, the engine
        /// never exceeds max_attempts, never waits past the window, and never waits longer
        /// than the cap unless the server asked for it within the limit.
        #[test]
        fn operations_respect_every_limit(
            outcomes in prop::collection::vec(outcome(), 1..40),
            max_attempts in 1u32..12,
            base_ms in 0u64..2_000,
            cap_ms in 0u64..60_000,
            window_ms in 1u64..300_000,
            seed in any::<u64>(),
            keyed in any::<bool>(),
            idempotent in any::<bool>(),
            attempt_ms in 1u64..5_000,
        ) {
            let base = Duration::from_millis(base_ms.min(cap_ms));
            let policy = RetryPolicy::default()
                .max_attempts(max_attempts)
                .base_delay(base)
                .max_delay(Duration::from_millis(cap_ms))
                .reconcile_window(Duration::from_millis(window_ms));
            let mut rng = StdRng::seed_from_u64(seed);
            let started = t0();
            let mut now = started;
            let mut st = OperationState { started, attempts: 0, keyed, idempotent_method: idempotent, replayable: true };
            for (code, failure, retry_after_ms) in outcomes {
                // An attempt may only start inside the window.
                prop_assert!(now < started + policy.get_reconcile_window());
                st.attempts += 1;
                prop_assert!(st.attempts <= max_attempts);
                now += Duration::from_millis(attempt_ms).min(
                    (started + policy.get_reconcile_window()).saturating_duration_since(now));
                let mut h = HeaderMap::new();
                if let Some(ms) = retry_after_ms {
                    h.insert("retry-after-ms", HeaderValue::from(ms));
                }
                let observed = match (code, failure) {
                    (Some(code), _) => status(code, &h),
                    (None, Some(kind)) => Observed::Failure(kind),
                    (None, None) => unreachable!(),
                };
                match decide(&policy, &st, observed, now, wall(), &mut rng) {
                    Decision::Retry { delay, reason, .. } => {
                        match reason {
                            WaitReason::Backoff { ceiling } => {
                                prop_assert!(delay <= ceiling);
                                prop_assert!(delay <= policy.get_max_delay());
                            }
                            WaitReason::RetryAfter { asked } => {
                                prop_assert_eq!(delay, asked);
                                prop_assert!(asked <= policy.get_max_retry_after());
                            }
                        }
                        now += delay;
                        prop_assert!(now < started + policy.get_reconcile_window());
                        // A retry never goes out unsafely.
                        prop_assert!(keyed || idempotent || failure.is_some_and(FailureKind::never_sent));
                    }
                    Decision::Return | Decision::Stop { .. } => break,
                }
            }
        }
    }
}
