//! A door into the pure decision engine for the crate's own benchmarks (`benches/decide.rs`).
//!
//! Hidden from the docs and not covered by semver: the engine's shape may change (another
//! front end is meant to share it), and benchmarks only need to time one call.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

use crate::classify::FailureKind;
use crate::decide::{Decision, Observed, OperationState, decide};
use crate::policy::RetryPolicy;
use crate::time::{Clock, TokioClock};

/// Runs one decision (classification, limits, `Retry-After`, full-jitter backoff, window)
/// for a keyed `POST` after attempt number `attempts`, and returns the wait chosen, or
/// `None` when the decision is not a retry. `outcome` is the attempt's status and headers,
/// or how its transport failed.
#[doc(hidden)]
pub fn decide_once<R: rand::Rng + ?Sized>(
    policy: &RetryPolicy,
    attempts: u32,
    outcome: Result<(StatusCode, &HeaderMap), FailureKind>,
    wall: SystemTime,
    rng: &mut R,
) -> Option<Duration> {
    let now = TokioClock.now();
    let state = OperationState {
        started: now,
        attempts,
        keyed: true,
        idempotent_method: false,
        replayable: true,
    };
    let observed = match outcome {
        Ok((status, headers)) => Observed::Response { status, headers },
        Err(kind) => Observed::Failure(kind),
    };
    match decide(policy, &state, observed, now, wall, rng) {
        Decision::Retry { delay, .. } => Some(delay),
        Decision::Return | Decision::Stop { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;
    use crate::test_rng::ConstRng;

    #[test]
    fn decide_once_reports_the_wait_of_a_retry_and_nothing_else() {
        let policy = RetryPolicy::default();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let none = HeaderMap::new();
        let mut top = ConstRng(u64::MAX);
        assert_eq!(
            decide_once(
                &policy,
                1,
                Ok((StatusCode::SERVICE_UNAVAILABLE, &none)),
                wall,
                &mut top
            ),
            Some(Duration::from_millis(500))
        );
        let mut asked = HeaderMap::new();
        asked.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(
            decide_once(
                &policy,
                1,
                Ok((StatusCode::TOO_MANY_REQUESTS, &asked)),
                wall,
                &mut top
            ),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            decide_once(&policy, 1, Err(FailureKind::Timeout), wall, &mut top),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            decide_once(&policy, 1, Ok((StatusCode::OK, &none)), wall, &mut top),
            None
        );
        assert_eq!(
            decide_once(&policy, 5, Err(FailureKind::Timeout), wall, &mut top),
            None,
            "attempts exhausted"
        );
    }
}
