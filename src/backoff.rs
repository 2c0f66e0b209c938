//! Exponential backoff with full jitter, applied inside the cap.
//!
//! # Why full jitter
//!
//! When many clients fail at the same moment (a deploy, a brief outage, a
//! throttling burst), plain exponential backoff keeps them in lock step: they
//! all wait 0.5 s, all retry together, all fail together, all wait 1 s, and so
//! on. The AWS Architecture Blog post "Exponential Backoff And Jitter" (2015)
//! simulated this contention: with 100 clients, *full jitter* (draw the whole
//! wait uniformly between zero and the exponential ceiling) cut the total
//! number of calls by more than half compared with plain exponential backoff,
//! which was the clear loser; "equal jitter" was the worst of the jittered
//! variants.
//!
//! The jitter is applied **inside** the cap: the cap bounds the ceiling, and the
//! drawn delay never exceeds it. Some retry crates add jitter *after* capping,
//! so a "30 s cap" can produce waits of up to 60 s; here the cap is a hard
//! upper bound on every delay.
//!
//! # Formula
//!
//! ```text
//! ceiling(retry) = min(cap, base * 2^retry)
//! delay(retry)   = U[0, ceiling(retry)]      (inclusive, nanosecond resolution)
//! ```
//!
//! `retry` counts from zero: `retry = 0` is the wait after the first failed
//! attempt, so its ceiling is `base`. The arithmetic saturates: if
//! `base * 2^retry` does not fit, the ceiling is `cap`, never a panic and never
//! a wrapped-around small value. With `base = 500 ms` and `cap = 30 s` the
//! ceilings are 0.5 s, 1 s, 2 s, 4 s, 8 s, 16 s, 30 s, 30 s, ...
//!
//! Both functions are pure: no clock, and the random number generator is a
//! parameter, so a seeded or fake generator makes every delay reproducible in
//! tests.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! use idempotent_retry::{backoff_ceiling, full_jitter};
//! use rand::SeedableRng;
//! use rand::rngs::StdRng;
//!
//! let base = Duration::from_millis(500);
//! let cap = Duration::from_secs(30);
//! let mut rng = StdRng::seed_from_u64(7);
//!
//! for retry in 0..10 {
//!     let delay = full_jitter(retry, base, cap, &mut rng);
//!     assert!(delay <= backoff_ceiling(retry, base, cap));
//!     assert!(delay <= cap);
//! }
//! ```

use std::time::Duration;

use rand::{Rng, RngExt};

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The upper bound of the wait before retry number `retry`:
/// `min(cap, base * 2^retry)`, computed without overflow.
///
/// `retry = 0` is the wait after the first failed attempt and gives `base`
/// (or `cap`, if `base` is larger). When `base * 2^retry` would not fit in a
/// [`Duration`], the result is `cap`. A zero `base` gives zero for every
/// `retry`. `cap` may be [`Duration::MAX`] to mean "no cap".
///
/// The result is non-decreasing in `retry`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_retry::backoff_ceiling;
///
/// let base = Duration::from_millis(500);
/// let cap = Duration::from_secs(30);
///
/// assert_eq!(backoff_ceiling(0, base, cap), Duration::from_millis(500));
/// assert_eq!(backoff_ceiling(3, base, cap), Duration::from_secs(4));
/// assert_eq!(backoff_ceiling(6, base, cap), Duration::from_secs(30));
/// // Overflow falls back to the cap instead of panicking.
/// assert_eq!(backoff_ceiling(u32::MAX, base, cap), cap);
/// ```
#[must_use]
pub fn backoff_ceiling(retry: u32, base: Duration, cap: Duration) -> Duration {
    if base.is_zero() {
        return Duration::ZERO;
    }
    let cap_nanos = cap.as_nanos();
    // `Duration::MAX` is just under 2^94 ns. `checked_shl` fails only for
    // shifts of 128 or more, and `checked_mul` only for products above
    // 2^128; a non-zero base times such a factor exceeds every cap, so both
    // failures give the cap, as does any product above it.
    let scaled = 1u128
        .checked_shl(retry)
        .and_then(|factor| base.as_nanos().checked_mul(factor));
    match scaled {
        Some(nanos) if nanos < cap_nanos => duration_from_nanos(nanos).unwrap_or(cap),
        _ => cap,
    }
}

/// A random wait before retry number `retry`, drawn uniformly from
/// `[0, backoff_ceiling(retry, base, cap)]`, both ends included ("full
/// jitter", applied inside the cap).
///
/// The draw has nanosecond resolution. Ceilings longer than `u64::MAX`
/// nanoseconds (about 584 years) are clamped to that for sampling, so the
/// result never exceeds the ceiling. The generator is a parameter: pass a
/// seeded one for reproducible delays. `R` may be unsized, so
/// `&mut dyn rand::Rng` works.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_retry::full_jitter;
/// use rand::SeedableRng;
/// use rand::rngs::StdRng;
///
/// let mut rng = StdRng::seed_from_u64(42);
/// let delay = full_jitter(2, Duration::from_millis(500), Duration::from_secs(30), &mut rng);
/// assert!(delay <= Duration::from_secs(2));
///
/// // The same seed gives the same delay.
/// let again = full_jitter(2, Duration::from_millis(500), Duration::from_secs(30), &mut StdRng::seed_from_u64(42));
/// assert_eq!(delay, again);
///
/// // Works through a trait object too.
/// let dyn_rng: &mut dyn rand::Rng = &mut rng;
/// assert!(full_jitter(0, Duration::from_millis(100), Duration::from_secs(1), dyn_rng) <= Duration::from_millis(100));
/// ```
#[must_use]
pub fn full_jitter<R>(retry: u32, base: Duration, cap: Duration, rng: &mut R) -> Duration
where
    R: Rng + ?Sized,
{
    let ceiling = backoff_ceiling(retry, base, cap);
    let high = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    // `0..=high` is never empty, so `random_range` cannot panic here.
    Duration::from_nanos(rng.random_range(0..=high))
}

/// Builds a `Duration` from a nanosecond count, or `None` if the whole seconds
/// do not fit in a `u64`.
fn duration_from_nanos(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / NANOS_PER_SEC).ok()?;
    let sub = u32::try_from(nanos % NANOS_PER_SEC).ok()?;
    Some(Duration::new(secs, sub))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    use crate::test_rng::ConstRng;

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn ceiling_sequence_500ms_to_30s() {
        let got: Vec<Duration> = (0..10)
            .map(|r| backoff_ceiling(r, MS(500), S(30)))
            .collect();
        let want = vec![
            MS(500),
            S(1),
            S(2),
            S(4),
            S(8),
            S(16),
            S(30),
            S(30),
            S(30),
            S(30),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn ceiling_retry_u32_max_is_cap() {
        assert_eq!(backoff_ceiling(u32::MAX, MS(500), S(30)), S(30));
        assert_eq!(
            backoff_ceiling(u32::MAX, Duration::from_nanos(1), Duration::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn ceiling_shift_overflow_boundaries() {
        // 1 ns * 2^93 fits in a Duration; 2^94 ns does not.
        let one = Duration::from_nanos(1);
        let two_93 = duration_from_nanos(1u128 << 93).unwrap();
        assert_eq!(backoff_ceiling(93, one, Duration::MAX), two_93);
        assert_eq!(backoff_ceiling(94, one, Duration::MAX), Duration::MAX);
        assert_eq!(backoff_ceiling(127, one, Duration::MAX), Duration::MAX);
        assert_eq!(backoff_ceiling(128, one, Duration::MAX), Duration::MAX);
        // Large retries with a small base are exact, not collapsed to the cap.
        assert_eq!(
            backoff_ceiling(40, one, Duration::MAX),
            Duration::from_nanos(1 << 40)
        );
    }

    #[test]
    fn ceiling_base_max() {
        assert_eq!(
            backoff_ceiling(0, Duration::MAX, Duration::MAX),
            Duration::MAX
        );
        assert_eq!(
            backoff_ceiling(1, Duration::MAX, Duration::MAX),
            Duration::MAX
        );
        assert_eq!(backoff_ceiling(0, Duration::MAX, S(30)), S(30));
        assert_eq!(backoff_ceiling(7, Duration::MAX, S(30)), S(30));
    }

    #[test]
    fn ceiling_cap_zero() {
        for retry in [0, 1, 31, 32, 64, u32::MAX] {
            assert_eq!(
                backoff_ceiling(retry, MS(500), Duration::ZERO),
                Duration::ZERO
            );
            assert_eq!(
                full_jitter(retry, MS(500), Duration::ZERO, &mut ConstRng(u64::MAX)),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn ceiling_base_zero() {
        for retry in [0, 1, 94, 95, 128, u32::MAX] {
            assert_eq!(
                backoff_ceiling(retry, Duration::ZERO, S(30)),
                Duration::ZERO
            );
            assert_eq!(
                backoff_ceiling(retry, Duration::ZERO, Duration::MAX),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn ceiling_base_above_cap_is_cap() {
        assert_eq!(backoff_ceiling(0, S(60), S(30)), S(30));
    }

    #[test]
    fn ceiling_keeps_sub_second_precision() {
        assert_eq!(
            backoff_ceiling(3, Duration::new(1, 123_456_789), Duration::MAX),
            Duration::new(8, 987_654_312)
        );
    }

    #[test]
    fn jitter_bounds_are_inclusive() {
        let (base, cap) = (MS(500), S(30));
        for retry in 0..10 {
            let ceiling = backoff_ceiling(retry, base, cap);
            assert_eq!(
                full_jitter(retry, base, cap, &mut ConstRng(u64::MAX)),
                ceiling
            );
            assert_eq!(
                full_jitter(retry, base, cap, &mut ConstRng(0)),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn jitter_clamps_huge_ceilings_to_u64_nanos() {
        let most = Duration::from_nanos(u64::MAX);
        assert_eq!(
            full_jitter(0, Duration::MAX, Duration::MAX, &mut ConstRng(u64::MAX)),
            most
        );
        assert_eq!(
            full_jitter(0, Duration::MAX, Duration::MAX, &mut ConstRng(0)),
            Duration::ZERO
        );
        // Just above the clamp: still bounded by u64::MAX nanos.
        let just_above = most + Duration::from_nanos(1);
        assert_eq!(
            full_jitter(0, just_above, Duration::MAX, &mut ConstRng(u64::MAX)),
            most
        );
    }

    #[test]
    fn jitter_accepts_dyn_rng() {
        let mut rng = ConstRng(u64::MAX);
        let dyn_rng: &mut dyn Rng = &mut rng;
        assert_eq!(full_jitter(1, MS(500), S(30), dyn_rng), S(1));
    }

    #[test]
    fn jitter_is_reproducible_with_a_seed() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..8)
                .map(|r| full_jitter(r, MS(500), S(30), &mut rng))
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn jitter_mean_is_half_the_ceiling() {
        let (base, cap) = (MS(500), S(30));
        for (seed, retry) in [(1, 0), (2, 4), (3, 10)] {
            let mut rng = StdRng::seed_from_u64(seed);
            let n = 10_000u32;
            let total: Duration = (0..n)
                .map(|_| full_jitter(retry, base, cap, &mut rng))
                .sum();
            let mean = (total / n).as_secs_f64();
            let half = backoff_ceiling(retry, base, cap).as_secs_f64() / 2.0;
            assert!(
                (mean - half).abs() <= 0.05 * half,
                "retry {retry}: mean {mean} s, expected about {half} s"
            );
        }
    }

    fn any_duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            Just(Duration::ZERO),
            Just(Duration::MAX),
            Just(Duration::from_nanos(u64::MAX)),
            any::<u64>().prop_map(Duration::from_nanos),
            (0u64..100_000).prop_map(Duration::from_millis),
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        ]
    }

    fn any_retry() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..130, any::<u32>()]
    }

    proptest! {
        #[test]
        fn prop_ceiling_never_exceeds_cap_or_product(
            retry in any_retry(),
            base in any_duration(),
            cap in any_duration(),
        ) {
            let ceiling = backoff_ceiling(retry, base, cap);
            prop_assert!(ceiling <= cap);
            // Exact reference computation in u128 where it fits.
            let exact = if base.is_zero() {
                Some(0)
            } else {
                1u128.checked_shl(retry).and_then(|f| base.as_nanos().checked_mul(f))
            };
            match exact {
                Some(n) if n <= cap.as_nanos() => prop_assert_eq!(ceiling.as_nanos(), n),
                _ => prop_assert_eq!(ceiling, cap),
            }
        }

        #[test]
        fn prop_jitter_within_bounds(
            retry in any_retry(),
            base in any_duration(),
            cap in any_duration(),
            seed in any::<u64>(),
        ) {
            let mut rng = StdRng::seed_from_u64(seed);
            let delay = full_jitter(retry, base, cap, &mut rng);
            prop_assert!(delay <= backoff_ceiling(retry, base, cap));
            prop_assert!(delay <= cap);
        }

        #[test]
        fn prop_ceiling_monotonic(
            retry in any_retry(),
            base in any_duration(),
            cap in any_duration(),
        ) {
            let next = retry.saturating_add(1);
            prop_assert!(backoff_ceiling(retry, base, cap) <= backoff_ceiling(next, base, cap));
        }
    }
}
