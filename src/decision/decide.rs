//! The pure decision every front end shares: what follows one attempt.
//!
//! [`decide`] takes the policy, the operation's state so far, what the last attempt produced,
//! the current times and an RNG, and returns a [`Decision`]. It reads no clock, sleeps never and
//! has no I/O: the engine's attempt loop feeds it and carries out what it says. Classification
//! lives in `classify.rs`, delays in `backoff.rs` and `retry_after.rs`, the window rule in
//! `window.rs`; this file only combines them with the policy's limits.
//!
//! One rule lives here whole: an answer that says the operation is still in progress at the
//! receiver ([`FailureKind::InProgress`]) is a wait for the live operation, not a failed
//! attempt. It does not count toward `max_attempts`; its waits back off in a sequence of their
//! own (or as the receiver's `Retry-After` asks) and are bounded by `max_in_progress_wait`,
//! counted from the first such answer, and by the reconcile window. [`OperationState::after`]
//! is how the engine carries a decision into the state the next one reads.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use crate::decision::policy::RetryPolicy;
use crate::outcome::report::WaitReason;
use crate::rules::backoff;
use crate::rules::classify::{FailureKind, StatusClass, classify_status, should_retry_hint};
use crate::rules::retry_after::requested_delay;
use crate::rules::window;

/// One logical operation's state, as the decision engine sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OperationState {
    /// When the first attempt started.
    pub(crate) started: Instant,
    /// Attempts counted toward `max_attempts` so far, the one being decided on included.
    /// Answers that said the operation was in progress are not counted
    /// ([`after`](Self::after) takes them back out).
    pub(crate) attempts: u32,
    /// Whether every attempt carries an idempotency key.
    pub(crate) keyed: bool,
    /// Whether the method is idempotent by definition (RFC 9110 9.2.2).
    pub(crate) idempotent_method: bool,
    /// Whether the request can be sent again (its body can be cloned).
    pub(crate) replayable: bool,
    /// In-progress answers waited out so far: the next such wait's backoff retry number.
    pub(crate) in_progress_waits: u32,
    /// When the first in-progress answer was decided on, if one was: the start of
    /// `max_in_progress_wait`.
    pub(crate) in_progress_since: Option<Instant>,
}

impl OperationState {
    /// The state before the first attempt.
    pub(crate) fn new(started: Instant, keyed: bool, idempotent_method: bool) -> Self {
        OperationState {
            started,
            attempts: 0,
            keyed,
            idempotent_method,
            replayable: true,
            in_progress_waits: 0,
            in_progress_since: None,
        }
    }

    /// Carries `decision`, taken `at`, into the state: an attempt answered "in progress" is
    /// taken back out of the attempts counted toward `max_attempts`, the first such answer
    /// starts the `max_in_progress_wait` clock, and each one waited out advances the
    /// in-progress backoff sequence. Every other decision leaves the state as it is.
    pub(crate) fn after(&mut self, decision: &Decision, at: Instant) {
        let (kind, waits) = match *decision {
            Decision::Return => (None, false),
            Decision::Retry { kind, .. } => (Some(kind), true),
            Decision::Stop { kind, .. } => (kind, false),
        };
        if kind != Some(FailureKind::InProgress) {
            return;
        }
        self.attempts = self.attempts.saturating_sub(1);
        self.in_progress_since.get_or_insert(at);
        if waits {
            self.in_progress_waits = self.in_progress_waits.saturating_add(1);
        }
    }
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
    /// A retry was due but the client's retry budget refused it.
    BudgetExhausted,
    /// The receiver still says the operation is in progress and `max_in_progress_wait` has
    /// run out (`asked: None`), or it asked for a wait that would end past that limit.
    InProgress {
        /// Time since the operation's first in-progress answer.
        waited: Duration,
        /// The receiver's `Retry-After`, when it was what did not fit.
        asked: Option<Duration>,
    },
}

/// Decides what follows an attempt. Pure: same inputs, same decision.
///
/// `wall` gives the wall-clock time, asked only for a response of a retryable status (its
/// `Retry-After` may be an HTTP-date, measured from it): a final response, the common case,
/// reads no clock.
pub(crate) fn decide<R: rand::Rng + ?Sized>(
    policy: &RetryPolicy,
    state: &OperationState,
    observed: Observed<'_>,
    now: Instant,
    wall: impl FnOnce() -> SystemTime,
    rng: &mut R,
) -> Decision {
    let (kind, asked, server_said_retry) = match observed {
        Observed::Response { status, headers } => {
            match classify_status(status, headers, state.keyed) {
                StatusClass::Final => return Decision::Return,
                StatusClass::Retry(kind) => (
                    kind,
                    requested_delay(headers, wall()),
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
    // An answer that says the operation is in progress is a wait for it, not an attempt.
    let in_progress = kind == FailureKind::InProgress;
    if !in_progress && state.attempts >= policy.max_attempts() {
        return stop(Stop::Exhausted);
    }
    if !state.replayable {
        return stop(Stop::NotReplayable);
    }
    let remaining = window::remaining(policy.reconcile_window(), state.started, now);
    if let Some(asked) = asked
        && (asked > policy.max_retry_after() || !window::wait_fits(asked, remaining))
    {
        return stop(Stop::RetryAfterTooLong { asked });
    }
    // The backoff sequence this wait belongs to, and how long it may last at most.
    let (retry, longest) = if in_progress {
        let waited = now.saturating_duration_since(state.in_progress_since.unwrap_or(now));
        let left = policy.max_in_progress_wait().saturating_sub(waited);
        if left.is_zero() {
            return stop(Stop::InProgress {
                waited,
                asked: None,
            });
        }
        if let Some(asked) = asked
            && asked > left
        {
            return stop(Stop::InProgress {
                waited,
                asked: Some(asked),
            });
        }
        (state.in_progress_waits, left)
    } else {
        (state.attempts.saturating_sub(1), Duration::MAX)
    };
    // A backoff wait for an operation in progress is cut to end at the limit, so the last
    // look at it comes when the limit runs out, not before.
    let drawn = backoff::full_jitter(
        retry,
        policy.base_delay(),
        policy.max_delay(),
        rng.next_u64(),
    )
    .min(longest);
    let (delay, reason) = match asked {
        Some(asked) if asked >= drawn => (asked, WaitReason::RetryAfter { asked }),
        _ => (
            drawn,
            WaitReason::Backoff {
                ceiling: backoff::ceiling(retry, policy.base_delay(), policy.max_delay()),
            },
        ),
    };
    // The next attempt must start strictly before the window ends.
    if !window::wait_fits(delay, remaining) {
        return stop(Stop::Window);
    }
    Decision::Retry {
        kind,
        delay,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    use crate::rules::const_rng::ConstRng;

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
            attempts,
            ..OperationState::new(t0(), keyed, idempotent)
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
            wall,
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
            wall,
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
                        wall,
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
        let policy = RetryPolicy::default().with_max_attempts(3);
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
        let policy = policy.with_max_attempts(10);
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
        let policy = RetryPolicy::default().with_reconcile_window(Duration::from_secs(30));
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
        let policy = RetryPolicy::default().with_reconcile_window(Duration::from_secs(10));
        let s = state(1, true, false);
        // 9.6 s in, 400 ms left: a 500 ms wait would cross the end.
        let now = s.started + Duration::from_millis(9600);
        let decision = decide(
            &policy,
            &s,
            status(503, &NO_HEADERS),
            now,
            wall,
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
            wall,
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
                .with_max_attempts(max_attempts)
                .with_base_delay(base)
                .with_max_delay(Duration::from_millis(cap_ms))
                .with_reconcile_window(Duration::from_millis(window_ms));
            let mut rng = StdRng::seed_from_u64(seed);
            let started = t0();
            let mut now = started;
            let mut st = OperationState::new(started, keyed, idempotent);
            for (code, failure, retry_after_ms) in outcomes {
                // An attempt may only start inside the window.
                prop_assert!(now < started + policy.reconcile_window());
                st.attempts += 1;
                prop_assert!(st.attempts <= max_attempts);
                now += Duration::from_millis(attempt_ms).min(
                    (started + policy.reconcile_window()).saturating_duration_since(now));
                let mut h = HeaderMap::new();
                if let Some(ms) = retry_after_ms {
                    h.insert("retry-after-ms", HeaderValue::from(ms));
                }
                let observed = match (code, failure) {
                    (Some(code), _) => status(code, &h),
                    (None, Some(kind)) => Observed::Failure(kind),
                    (None, None) => unreachable!(),
                };
                let decision = decide(&policy, &st, observed, now, wall, &mut rng);
                st.after(&decision, now);
                match decision {
                    Decision::Retry { delay, reason, .. } => {
                        match reason {
                            WaitReason::Backoff { ceiling } => {
                                prop_assert!(delay <= ceiling);
                                prop_assert!(delay <= policy.max_delay());
                            }
                            WaitReason::RetryAfter { asked } => {
                                prop_assert_eq!(delay, asked);
                                prop_assert!(asked <= policy.max_retry_after());
                            }
                        }
                        now += delay;
                        prop_assert!(now < started + policy.reconcile_window());
                        // A retry never goes out unsafely.
                        prop_assert!(keyed || idempotent || failure.is_some_and(FailureKind::never_sent));
                    }
                    Decision::Return | Decision::Stop { .. } => break,
                }
            }
        }
    }

    fn in_progress(
        state: &OperationState,
        now: Instant,
        headers: &HeaderMap,
        word: u64,
    ) -> Decision {
        let policy = RetryPolicy::default().with_max_in_progress_wait(Duration::from_secs(10));
        decide(
            &policy,
            state,
            status(409, headers),
            now,
            wall,
            &mut ConstRng(word),
        )
    }

    #[test]
    fn an_in_progress_answer_is_a_wait_not_a_counted_attempt() {
        let policy = RetryPolicy::default().with_max_attempts(1);
        let mut s = state(1, true, false);
        let decision = run(&policy, &s, status(409, &NO_HEADERS));
        assert_eq!(
            decision,
            Decision::Retry {
                kind: FailureKind::InProgress,
                delay: Duration::from_millis(500),
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_millis(500)
                },
            }
        );
        let at = s.started + Duration::from_millis(20);
        s.after(&decision, at);
        assert_eq!(s.attempts, 0, "the in-progress answer is taken back out");
        assert_eq!(s.in_progress_waits, 1);
        assert_eq!(s.in_progress_since, Some(at));
        // The clock starts at the first such answer only.
        s.attempts += 1;
        s.after(&decision, at + Duration::from_secs(1));
        assert_eq!(s.in_progress_since, Some(at));
        assert_eq!(s.in_progress_waits, 2);
        // Any other decision leaves the state alone; a 503 still counts.
        let before = s;
        s.attempts += 1;
        let other = run(&policy, &s, status(503, &NO_HEADERS));
        assert_eq!(
            other,
            Decision::Stop {
                kind: Some(FailureKind::ServerError),
                stop: Stop::Exhausted
            }
        );
        s.after(&other, at);
        s.after(&Decision::Return, at);
        assert_eq!(s.attempts, before.attempts + 1);
        assert_eq!(s.in_progress_waits, before.in_progress_waits);
    }

    #[test]
    fn in_progress_waits_back_off_in_a_sequence_of_their_own() {
        let policy = RetryPolicy::default();
        // Three waits so far: the ceiling is 500 ms * 2^3, whatever the attempts.
        let mut s = state(1, true, false);
        s.in_progress_waits = 3;
        s.in_progress_since = Some(s.started);
        match run(&policy, &s, status(409, &NO_HEADERS)) {
            Decision::Retry { delay, reason, .. } => {
                assert_eq!(delay, Duration::from_secs(4));
                assert_eq!(
                    reason,
                    WaitReason::Backoff {
                        ceiling: Duration::from_secs(4)
                    }
                );
            }
            other => panic!("expected a wait, got {other:?}"),
        }
        // A failed attempt after them backs off by the attempts alone.
        s.attempts = 2;
        s.in_progress_waits = 9;
        match run(&policy, &s, status(503, &NO_HEADERS)) {
            Decision::Retry { reason, .. } => assert_eq!(
                reason,
                WaitReason::Backoff {
                    ceiling: Duration::from_secs(1)
                }
            ),
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn the_in_progress_limit_cuts_the_last_wait_then_stops() {
        let mut s = state(1, true, false);
        s.in_progress_since = Some(s.started);
        s.in_progress_waits = 6; // a 30 s ceiling
        // 9.8 s into a 10 s limit: the wait is cut to end at the limit.
        let now = s.started + Duration::from_millis(9_800);
        assert_eq!(
            in_progress(&s, now, &NO_HEADERS, MAX),
            Decision::Retry {
                kind: FailureKind::InProgress,
                delay: Duration::from_millis(200),
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_secs(30)
                },
            }
        );
        // At the limit: still in progress, so the operation stops, outcome unknown.
        let now = s.started + Duration::from_secs(10);
        assert_eq!(
            in_progress(&s, now, &NO_HEADERS, MAX),
            Decision::Stop {
                kind: Some(FailureKind::InProgress),
                stop: Stop::InProgress {
                    waited: Duration::from_secs(10),
                    asked: None
                }
            }
        );
        // A zero limit waits for none.
        let policy = RetryPolicy::default().with_max_in_progress_wait(Duration::ZERO);
        assert_eq!(
            run(&policy, &state(1, true, false), status(409, &NO_HEADERS)),
            Decision::Stop {
                kind: Some(FailureKind::InProgress),
                stop: Stop::InProgress {
                    waited: Duration::ZERO,
                    asked: None
                }
            }
        );
    }

    #[test]
    fn retry_after_on_an_in_progress_answer_is_honoured_inside_the_limit() {
        let s = state(1, true, false);
        let h = headers(&[("retry-after", "3")]);
        assert_eq!(
            in_progress(&s, s.started, &h, 0),
            Decision::Retry {
                kind: FailureKind::InProgress,
                delay: Duration::from_secs(3),
                reason: WaitReason::RetryAfter {
                    asked: Duration::from_secs(3)
                },
            }
        );
        // 8 s into a 10 s limit, a request for 3 s more would end past it.
        let mut later = s;
        later.in_progress_since = Some(s.started);
        let now = s.started + Duration::from_secs(8);
        assert_eq!(
            in_progress(&later, now, &h, 0),
            Decision::Stop {
                kind: Some(FailureKind::InProgress),
                stop: Stop::InProgress {
                    waited: Duration::from_secs(8),
                    asked: Some(Duration::from_secs(3))
                }
            }
        );
        // A backoff draw above the asked wait is cut to the limit, never below what was asked.
        let h = headers(&[("retry-after-ms", "1500")]);
        later.in_progress_waits = 8;
        match in_progress(&later, now, &h, MAX) {
            Decision::Retry { delay, .. } => assert_eq!(delay, Duration::from_secs(2)),
            other => panic!("expected a wait, got {other:?}"),
        }
        // Past max_retry_after it is the usual refusal.
        let h = headers(&[("retry-after", "61")]);
        assert!(matches!(
            in_progress(&s, s.started, &h, 0),
            Decision::Stop {
                stop: Stop::RetryAfterTooLong { .. },
                ..
            }
        ));
    }

    #[test]
    fn the_window_bounds_in_progress_waits_too() {
        let policy = RetryPolicy::default().with_reconcile_window(Duration::from_secs(5));
        let s = state(1, true, false);
        let now = s.started + Duration::from_millis(4_800);
        assert_eq!(
            decide(
                &policy,
                &s,
                status(409, &NO_HEADERS),
                now,
                wall,
                &mut ConstRng(MAX)
            ),
            Decision::Stop {
                kind: Some(FailureKind::InProgress),
                stop: Stop::Window
            }
        );
    }

    /// One answer of a receiver to a keyed request: in progress (with a `retry-after-ms`
    /// perhaps), a 503, or the final 200.
    fn keyed_answer() -> impl Strategy<Value = (u16, Option<u64>)> {
        prop_oneof![
            4 => prop::option::of(0u64..5_000).prop_map(|ms| (409u16, ms)),
            1 => Just((503u16, None)),
            1 => Just((200u16, None)),
        ]
    }

    proptest! {
        /// Whatever mix of in-progress answers, failures and Retry-After a receiver gives, the
        /// attempts counted never pass max_attempts and an in-progress answer never uses one
        /// up; every wait for an operation in progress ends within max_in_progress_wait of the
        /// first in-progress answer (and within the window), is at most its own sequence's
        /// ceiling or exactly what was asked; and the operation stops for the in-progress
        /// limit only when that limit has run out or the receiver asked past it.
        #[test]
        fn in_progress_waits_keep_their_own_bound(
            answers in prop::collection::vec(keyed_answer(), 1..60),
            max_attempts in 1u32..6,
            base_ms in 0u64..1_000,
            cap_ms in 0u64..10_000,
            limit_ms in 0u64..30_000,
            window_ms in 1u64..120_000,
            attempt_ms in 1u64..2_000,
            seed in any::<u64>(),
        ) {
            let limit = Duration::from_millis(limit_ms);
            let policy = RetryPolicy::default()
                .with_max_attempts(max_attempts)
                .with_base_delay(Duration::from_millis(base_ms.min(cap_ms)))
                .with_max_delay(Duration::from_millis(cap_ms))
                .with_reconcile_window(Duration::from_millis(window_ms))
                .with_max_in_progress_wait(limit);
            let mut rng = StdRng::seed_from_u64(seed);
            let started = t0();
            let end = started + policy.reconcile_window();
            let mut now = started;
            let mut st = OperationState::new(started, true, false);
            let mut waited_in_progress = Duration::ZERO;
            for (code, retry_after_ms) in answers {
                prop_assert!(now < end);
                st.attempts += 1;
                prop_assert!(st.attempts <= max_attempts);
                now += Duration::from_millis(attempt_ms).min(end.saturating_duration_since(now));
                let mut h = HeaderMap::new();
                if let Some(ms) = retry_after_ms {
                    h.insert("retry-after-ms", HeaderValue::from(ms));
                }
                let decision = decide(&policy, &st, status(code, &h), now, wall, &mut rng);
                let since = st.in_progress_since.unwrap_or(now);
                let asked = retry_after_ms.map(Duration::from_millis);
                match decision {
                    Decision::Return => {
                        prop_assert_eq!(code, 200);
                        break;
                    }
                    Decision::Retry { kind, delay, reason } => {
                        prop_assert!(now + delay < end, "the wait crosses the window");
                        if kind == FailureKind::InProgress {
                            prop_assert!(
                                (now + delay).saturating_duration_since(since) <= limit,
                                "a wait ends past the in-progress limit"
                            );
                            waited_in_progress += delay;
                            match reason {
                                WaitReason::Backoff { ceiling } => {
                                    prop_assert_eq!(ceiling, backoff::ceiling(
                                        st.in_progress_waits, policy.base_delay(), policy.max_delay()));
                                    prop_assert!(delay <= ceiling);
                                    prop_assert!(asked.is_none_or(|asked| asked <= delay));
                                }
                                WaitReason::RetryAfter { asked: told } => {
                                    prop_assert_eq!(Some(told), asked);
                                    prop_assert_eq!(delay, told);
                                }
                            }
                        }
                        st.after(&decision, now);
                        now += delay;
                    }
                    Decision::Stop { kind, stop } => {
                        match stop {
                            Stop::InProgress { waited, asked: told } => {
                                prop_assert_eq!(kind, Some(FailureKind::InProgress));
                                prop_assert_eq!(waited, now.saturating_duration_since(since));
                                match told {
                                    None => prop_assert!(waited >= limit),
                                    Some(told) => {
                                        prop_assert_eq!(Some(told), asked);
                                        prop_assert!(waited < limit && told > limit - waited);
                                    }
                                }
                            }
                            Stop::Exhausted => {
                                prop_assert_ne!(kind, Some(FailureKind::InProgress));
                                prop_assert!(st.attempts >= max_attempts);
                            }
                            Stop::Window | Stop::RetryAfterTooLong { .. } => {}
                            other => prop_assert!(false, "unexpected stop {:?}", other),
                        }
                        break;
                    }
                }
                prop_assert!(waited_in_progress <= limit);
            }
        }

        /// A receiver that answers "in progress" any number of times, then the answer, gives
        /// the answer under any attempt limit when the window and the in-progress limit are
        /// long enough: the waits never use the attempts up.
        #[test]
        fn any_number_of_in_progress_answers_then_the_answer_completes(
            waits in 0usize..200,
            max_attempts in 1u32..4,
            seed in any::<u64>(),
        ) {
            let policy = RetryPolicy::default()
                .with_max_attempts(max_attempts)
                .with_reconcile_window(Duration::MAX)
                .with_max_in_progress_wait(Duration::MAX);
            let mut rng = StdRng::seed_from_u64(seed);
            let mut now = t0();
            let mut st = OperationState::new(now, true, false);
            for _ in 0..waits {
                st.attempts += 1;
                let decision = decide(&policy, &st, status(409, &NO_HEADERS), now, wall, &mut rng);
                let Decision::Retry { kind: FailureKind::InProgress, delay, .. } = decision else {
                    return Err(TestCaseError::fail(format!("{decision:?}")));
                };
                st.after(&decision, now);
                now += delay;
            }
            st.attempts += 1;
            prop_assert_eq!(st.attempts, 1);
            prop_assert_eq!(st.in_progress_waits, u32::try_from(waits).unwrap());
            prop_assert_eq!(
                decide(&policy, &st, status(200, &NO_HEADERS), now, wall, &mut rng),
                Decision::Return
            );
        }
    }
}
