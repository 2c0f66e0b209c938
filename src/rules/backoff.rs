//! Exponential backoff with full jitter, applied inside the cap.
//!
//! ```text
//! ceiling(retry) = min(cap, base * 2^retry)   (saturating: an overflow gives `cap`)
//! delay(retry)   = U[0, ceiling(retry)]       (both ends included, nanosecond resolution)
//! ```
//!
//! `retry` 0 is the wait after the first failed attempt. The jitter is drawn inside the cap,
//! so no delay exceeds it. Both functions are pure: [`full_jitter`] takes its randomness as
//! one uniform `u64` (the client's comes from its generator, seeded with
//! [`ClientBuilder::rng_seed`](crate::ClientBuilder::rng_seed) in tests). Why full jitter,
//! and why inside the cap: `docs/backoff.md`.
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//!
//! use idempotent_retry::backoff;
//!
//! let base = Duration::from_millis(500);
//! let cap = Duration::from_secs(30);
//!
//! for (retry, random) in (0..10).zip([7u64, u64::MAX, 0, 1 << 63, 42, 9, 3, 8, 1, 2]) {
//!     let delay = backoff::full_jitter(retry, base, cap, random);
//!     assert!(delay <= backoff::ceiling(retry, base, cap));
//!     assert!(delay <= cap);
//! }
//! ```

use std::time::Duration;

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
/// use idempotent_retry::backoff;
///
/// let base = Duration::from_millis(500);
/// let cap = Duration::from_secs(30);
///
/// assert_eq!(backoff::ceiling(0, base, cap), Duration::from_millis(500));
/// assert_eq!(backoff::ceiling(3, base, cap), Duration::from_secs(4));
/// assert_eq!(backoff::ceiling(6, base, cap), Duration::from_secs(30));
/// // Overflow falls back to the cap instead of panicking.
/// assert_eq!(backoff::ceiling(u32::MAX, base, cap), cap);
/// ```
#[must_use]
pub fn ceiling(retry: u32, base: Duration, cap: Duration) -> Duration {
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
/// `[0, ceiling(retry, base, cap)]`, both ends included ("full jitter",
/// applied inside the cap).
///
/// `random` is one uniformly distributed 64-bit word, the only source of
/// randomness: the same word gives the same wait. `0` gives zero, `u64::MAX` the
/// ceiling itself; the result never exceeds the ceiling. The mapping and its bias:
/// `docs/backoff.md`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use idempotent_retry::backoff;
///
/// let (base, cap) = (Duration::from_millis(500), Duration::from_secs(30));
/// // The ceiling of the third retry is 2 s; the word picks a point inside it.
/// assert_eq!(backoff::full_jitter(2, base, cap, 0), Duration::ZERO);
/// assert_eq!(backoff::full_jitter(2, base, cap, u64::MAX), Duration::from_secs(2));
/// assert_eq!(backoff::full_jitter(2, base, cap, 1 << 63), Duration::from_secs(1));
/// ```
#[must_use]
pub fn full_jitter(retry: u32, base: Duration, cap: Duration, random: u64) -> Duration {
    let high = u64::try_from(ceiling(retry, base, cap).as_nanos()).unwrap_or(u64::MAX);
    // Lemire's multiply-shift onto `0..=high`: `random * (high + 1) / 2^64`. Both factors fit
    // in 64 bits, so the product fits in 128, and the quotient is at most `high`.
    let span = u128::from(high) + 1;
    let nanos = (u128::from(random) * span) >> 64;
    Duration::from_nanos(u64::try_from(nanos).expect("a 64-bit word scaled onto 0..=high fits"))
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
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn ceiling_sequence_500ms_to_30s() {
        let got: Vec<Duration> = (0..10).map(|r| ceiling(r, MS(500), S(30))).collect();
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
        assert_eq!(ceiling(u32::MAX, MS(500), S(30)), S(30));
        assert_eq!(
            ceiling(u32::MAX, Duration::from_nanos(1), Duration::MAX),
            Duration::MAX
        );
    }

    #[test]
    fn ceiling_shift_overflow_boundaries() {
        // 1 ns * 2^93 fits in a Duration; 2^94 ns does not.
        let one = Duration::from_nanos(1);
        let two_93 = duration_from_nanos(1u128 << 93).unwrap();
        assert_eq!(ceiling(93, one, Duration::MAX), two_93);
        assert_eq!(ceiling(94, one, Duration::MAX), Duration::MAX);
        assert_eq!(ceiling(127, one, Duration::MAX), Duration::MAX);
        assert_eq!(ceiling(128, one, Duration::MAX), Duration::MAX);
        // Large retries with a small base are exact, not collapsed to the cap.
        assert_eq!(
            ceiling(40, one, Duration::MAX),
            Duration::from_nanos(1 << 40)
        );
    }

    #[test]
    fn ceiling_base_max() {
        assert_eq!(ceiling(0, Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(ceiling(1, Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(ceiling(0, Duration::MAX, S(30)), S(30));
        assert_eq!(ceiling(7, Duration::MAX, S(30)), S(30));
    }

    #[test]
    fn ceiling_cap_zero() {
        for retry in [0, 1, 31, 32, 64, u32::MAX] {
            assert_eq!(ceiling(retry, MS(500), Duration::ZERO), Duration::ZERO);
            assert_eq!(
                full_jitter(retry, MS(500), Duration::ZERO, u64::MAX),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn ceiling_base_zero() {
        for retry in [0, 1, 94, 95, 128, u32::MAX] {
            assert_eq!(ceiling(retry, Duration::ZERO, S(30)), Duration::ZERO);
            assert_eq!(
                ceiling(retry, Duration::ZERO, Duration::MAX),
                Duration::ZERO
            );
        }
    }

    #[test]
    fn ceiling_base_above_cap_is_cap() {
        assert_eq!(ceiling(0, S(60), S(30)), S(30));
    }

    #[test]
    fn ceiling_keeps_sub_second_precision() {
        assert_eq!(
            ceiling(3, Duration::new(1, 123_456_789), Duration::MAX),
            Duration::new(8, 987_654_312)
        );
    }

    #[test]
    fn jitter_bounds_are_inclusive() {
        let (base, cap) = (MS(500), S(30));
        for retry in 0..10 {
            let ceiling = ceiling(retry, base, cap);
            assert_eq!(full_jitter(retry, base, cap, u64::MAX), ceiling);
            assert_eq!(full_jitter(retry, base, cap, 0), Duration::ZERO);
        }
    }

    #[test]
    fn jitter_clamps_huge_ceilings_to_u64_nanos() {
        let most = Duration::from_nanos(u64::MAX);
        assert_eq!(full_jitter(0, Duration::MAX, Duration::MAX, u64::MAX), most);
        assert_eq!(
            full_jitter(0, Duration::MAX, Duration::MAX, 0),
            Duration::ZERO
        );
        // Just above the clamp: still bounded by u64::MAX nanos.
        let just_above = most + Duration::from_nanos(1);
        assert_eq!(full_jitter(0, just_above, Duration::MAX, u64::MAX), most);
    }

    #[test]
    fn jitter_scales_the_word_linearly_onto_the_ceiling() {
        // Ceiling 1 s = 10^9 ns: the word's top bits pick the point, in order.
        let quarter = 1u64 << 62;
        assert_eq!(full_jitter(1, MS(500), S(30), quarter), MS(250));
        assert_eq!(full_jitter(1, MS(500), S(30), 2 * quarter), MS(500));
        assert_eq!(full_jitter(1, MS(500), S(30), 3 * quarter), MS(750));
        assert_eq!(full_jitter(1, MS(500), S(30), u64::MAX - 1), S(1));
        // A 1 ns ceiling: the lower half of the words gives 0, the upper half 1 ns.
        let one = Duration::from_nanos(1);
        assert_eq!(full_jitter(0, one, S(1), (1 << 63) - 1), Duration::ZERO);
        assert_eq!(full_jitter(0, one, S(1), 1 << 63), one);
    }

    #[test]
    fn jitter_is_reproducible_with_a_seed() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..8)
                .map(|r| full_jitter(r, MS(500), S(30), rng.next_u64()))
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
                .map(|_| full_jitter(retry, base, cap, rng.next_u64()))
                .sum();
            let mean = (total / n).as_secs_f64();
            let half = ceiling(retry, base, cap).as_secs_f64() / 2.0;
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
            let ceiling = ceiling(retry, base, cap);
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
            random in any::<u64>(),
        ) {
            let delay = full_jitter(retry, base, cap, random);
            prop_assert!(delay <= ceiling(retry, base, cap));
            prop_assert!(delay <= cap);
        }

        #[test]
        fn prop_jitter_grows_with_the_word(
            retry in any_retry(),
            base in any_duration(),
            cap in any_duration(),
            a in any::<u64>(),
            b in any::<u64>(),
        ) {
            let (low, high) = (a.min(b), a.max(b));
            prop_assert!(full_jitter(retry, base, cap, low) <= full_jitter(retry, base, cap, high));
        }

        #[test]
        fn prop_ceiling_monotonic(
            retry in any_retry(),
            base in any_duration(),
            cap in any_duration(),
        ) {
            let next = retry.saturating_add(1);
            prop_assert!(ceiling(retry, base, cap) <= ceiling(next, base, cap));
        }
    }
}
