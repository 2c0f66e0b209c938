//! The one door into the pure decision engine, for the crate's benchmarks (`benches/decide.rs`),
//! fuzz targets (`fuzz/`) and property tests (`tests/properties.rs`), which time single
//! decisions or drive whole operations on virtual time; and into a
//! [`RetryBudget`](crate::RetryBudget)'s charges ([`budget`]), for the tests and the herd
//! simulation (`examples/herd.rs`) that drain or refill a bucket by hand.
//!
//! Behind the `internals` feature, hidden from the docs and not covered by semver: it mirrors
//! the engine's internal shape, which may change in any release. The randomness is one word
//! per call, as [`backoff::full_jitter`](crate::rules::backoff::full_jitter) takes it, so a caller
//! replays a decision by passing the same word and needs no generator of ours.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::decision::decide::{self, Decision, Observed, OperationState, Stop};
use crate::decision::policy::RetryPolicy;
use crate::outcome::report::WaitReason;
use crate::rules::classify::FailureKind;
use crate::rules::const_rng::ConstRng;
use crate::time::{Clock, TokioClock};

/// The operation as the engine sees it when one attempt has ended, before any answer said
/// the operation was in progress at the receiver (an in-progress answer decided here is the
/// operation's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecideInput {
    /// Attempts counted toward `max_attempts` so far, the one being decided on included.
    pub attempts: u32,
    /// Whether every attempt carries an idempotency key.
    pub keyed: bool,
    /// Whether the method is idempotent by definition.
    pub idempotent_method: bool,
    /// Whether the request body can be sent again.
    pub replayable: bool,
    /// Time since the first attempt started.
    pub elapsed: Duration,
}

/// What the engine decided, with the stop reason flattened to a stable name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecideStep {
    /// The response is the answer.
    Return,
    /// Wait `delay`, then retry with the same key.
    Retry {
        /// What went wrong with the attempt.
        kind: FailureKind,
        /// The wait before the next attempt.
        delay: Duration,
        /// Why the wait is that long.
        reason: WaitReason,
    },
    /// The operation ends with an error.
    Stop {
        /// What went wrong with the last attempt, if it failed.
        kind: Option<FailureKind>,
        /// `exhausted`, `window`, `retry_after_too_long`, `not_replayable`, `not_retry_safe`,
        /// `fatal`, `budget_exhausted` or `in_progress` (the receiver's in-progress answers
        /// outlasted `max_in_progress_wait`).
        why: &'static str,
        /// For `retry_after_too_long`, what the server asked for; for `in_progress`, what it
        /// asked for when that wait would have ended past the limit.
        asked: Option<Duration>,
    },
}

/// Runs the decision engine once. `outcome` is the attempt's status and headers, or how its
/// transport failed; `wall` is the wall-clock time an HTTP-date is measured from; `random` is
/// the uniform word the full-jitter backoff is drawn from (`0` gives no wait, `u64::MAX` the
/// whole ceiling).
///
/// `None` only when `input.elapsed` is too large to be added to a monotonic instant on this
/// platform (hundreds of billions of years), so the engine cannot be asked.
#[must_use]
pub fn decide(
    policy: &RetryPolicy,
    input: &DecideInput,
    outcome: Result<(StatusCode, &HeaderMap), FailureKind>,
    wall: SystemTime,
    random: u64,
) -> Option<DecideStep> {
    let started = TokioClock.now();
    let now = started.checked_add(input.elapsed)?;
    let state = OperationState {
        attempts: input.attempts,
        replayable: input.replayable,
        ..OperationState::new(started, input.keyed, input.idempotent_method)
    };
    let observed = match outcome {
        Ok((status, headers)) => Observed::Response { status, headers },
        Err(kind) => Observed::Failure(kind),
    };
    Some(
        match decide::decide(
            policy,
            &state,
            observed,
            now,
            || wall,
            &mut ConstRng(random),
        ) {
            Decision::Return => DecideStep::Return,
            Decision::Retry {
                kind,
                delay,
                reason,
            } => DecideStep::Retry {
                kind,
                delay,
                reason,
            },
            Decision::Stop { kind, stop } => {
                let (why, asked) = match stop {
                    Stop::Exhausted => ("exhausted", None),
                    Stop::Window => ("window", None),
                    Stop::RetryAfterTooLong { asked } => ("retry_after_too_long", Some(asked)),
                    Stop::NotReplayable => ("not_replayable", None),
                    Stop::NotRetrySafe => ("not_retry_safe", None),
                    Stop::Fatal => ("fatal", None),
                    Stop::BudgetExhausted => ("budget_exhausted", None),
                    Stop::InProgress { asked, .. } => ("in_progress", asked),
                };
                DecideStep::Stop { kind, why, asked }
            }
        },
    )
}

/// The retry loop's three dealings with a shared [`RetryBudget`](crate::RetryBudget), which
/// only the crate's front ends make: for tests and simulations that drain or refill a bucket
/// by hand. Each is the budget's own method, as the front ends call it.
pub mod budget {
    use crate::decision::budget::RetryBudget;
    use crate::rules::classify::FailureKind;

    /// May a retry after a failure of this kind be sent? `true` when the level is at least
    /// what the retry would cost if it failed; nothing is taken either way, and a refusal is
    /// counted in [`RetryBudget::refused`].
    #[must_use = "`false` means the retry must not be sent"]
    pub fn try_admit(budget: &RetryBudget, failure: FailureKind) -> bool {
        budget.try_admit(failure)
    }

    /// A retry that was sent failed this way: takes its cost from the bucket (the level stops
    /// at zero) and returns the cost.
    pub fn charge_failed_retry(budget: &RetryBudget, failure: FailureKind) -> u32 {
        budget.charge_failed_retry(failure)
    }

    /// An operation succeeded on its first attempt: deposits the success reward, up to the
    /// capacity.
    pub fn record_first_attempt_success(budget: &RetryBudget) {
        budget.record_first_attempt_success();
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn input(attempts: u32, elapsed: Duration) -> DecideInput {
        DecideInput {
            attempts,
            keyed: true,
            idempotent_method: false,
            replayable: true,
            elapsed,
        }
    }

    #[test]
    fn the_budget_door_admits_charges_and_deposits_as_the_front_ends_do() {
        let shared = crate::RetryBudget::new();
        assert!(budget::try_admit(&shared, FailureKind::ServerError));
        assert_eq!(shared.available(), 500, "admitting takes nothing");
        assert_eq!(
            budget::charge_failed_retry(&shared, FailureKind::ServerError),
            5
        );
        assert_eq!(
            budget::charge_failed_retry(&shared, FailureKind::Timeout),
            10
        );
        assert_eq!(shared.available(), 485);
        budget::record_first_attempt_success(&shared);
        assert_eq!(shared.available(), 486);
        assert_eq!(shared.refused(), 0);
    }

    #[test]
    fn decide_mirrors_each_kind_of_decision() {
        let policy = RetryPolicy::default().with_reconcile_window(Duration::from_secs(10));
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let none = HeaderMap::new();
        let unavailable = Ok((StatusCode::SERVICE_UNAVAILABLE, &none));
        assert_eq!(
            decide(
                &policy,
                &input(1, Duration::ZERO),
                unavailable,
                wall,
                u64::MAX
            ),
            Some(DecideStep::Retry {
                kind: FailureKind::ServerError,
                delay: Duration::from_millis(500),
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_millis(500)
                },
            })
        );
        assert_eq!(
            decide(
                &policy,
                &input(1, Duration::ZERO),
                Ok((StatusCode::OK, &none)),
                wall,
                u64::MAX
            ),
            Some(DecideStep::Return)
        );
        // 9.6 s of the 10 s window gone: a 500 ms wait would cross its end.
        assert_eq!(
            decide(
                &policy,
                &input(1, Duration::from_millis(9600)),
                unavailable,
                wall,
                u64::MAX
            ),
            Some(DecideStep::Stop {
                kind: Some(FailureKind::ServerError),
                why: "window",
                asked: None,
            })
        );
        let mut asked = HeaderMap::new();
        asked.insert("retry-after", HeaderValue::from_static("61"));
        assert_eq!(
            decide(
                &policy,
                &input(1, Duration::ZERO),
                Ok((StatusCode::TOO_MANY_REQUESTS, &asked)),
                wall,
                u64::MAX
            ),
            Some(DecideStep::Stop {
                kind: Some(FailureKind::Throttled),
                why: "retry_after_too_long",
                asked: Some(Duration::from_secs(61)),
            })
        );
        assert_eq!(
            decide(
                &policy,
                &input(1, Duration::MAX),
                unavailable,
                wall,
                u64::MAX
            ),
            None,
            "an elapsed time no instant can hold"
        );
    }

    #[test]
    fn the_word_places_the_wait_inside_the_ceiling_and_limits_still_apply() {
        let policy = RetryPolicy::default();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let delay = |attempts, random| match decide(
            &policy,
            &input(attempts, Duration::ZERO),
            Err(FailureKind::Timeout),
            wall,
            random,
        ) {
            Some(DecideStep::Retry { delay, .. }) => Some(delay),
            _ => None,
        };
        // After the second attempt the ceiling is 1 s.
        assert_eq!(delay(2, 0), Some(Duration::ZERO));
        assert_eq!(delay(2, 1 << 63), Some(Duration::from_millis(500)));
        assert_eq!(delay(2, u64::MAX), Some(Duration::from_secs(1)));
        assert_eq!(delay(2, 12345), delay(2, 12345), "same word, same wait");
        assert_eq!(delay(5, u64::MAX), None, "attempts exhausted");
        assert_eq!(
            decide(
                &policy,
                &input(5, Duration::ZERO),
                Err(FailureKind::Timeout),
                wall,
                0
            ),
            Some(DecideStep::Stop {
                kind: Some(FailureKind::Timeout),
                why: "exhausted",
                asked: None,
            })
        );
    }
}
