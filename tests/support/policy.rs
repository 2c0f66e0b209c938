//! The retry policy the loopback suites share.

use std::time::Duration;

use idempotent_retry::RetryPolicy;

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Millisecond backoff so real-clock cases are quick; attempts long enough (5 s) that a loaded
/// machine never trips them by accident, so hit counts are exact.
pub fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(ms(1))
        .with_max_delay(ms(5))
        .with_attempt_timeout(Duration::from_secs(5))
}
