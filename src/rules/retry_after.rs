//! How long the server asked us to wait: `Retry-After` and `retry-after-ms`.
//!
//! `Retry-After` (RFC 9110, section 10.2.3) is seconds or an HTTP-date in any of its three
//! formats; `retry-after-ms` (the Stainless SDKs') is milliseconds, with an optional fraction.
//!
//! - A value that does not parse is absent, never zero; an explicit `0` means "retry now".
//! - A date at or before `now` is zero; `now` is the caller's, the wall clock is never read.
//! - Values too large for a [`Duration`] saturate to [`Duration::MAX`].
//! - `retry-after-ms` wins when it parses; of repeated headers, the longest parsable wins.
//!
//! The syntax accepted in detail, and why each rule: `docs/retry-after.md`.
//!
//! # Examples
//!
//! ```
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//!
//! use http::header::RETRY_AFTER;
//! use http::{HeaderMap, HeaderValue};
//! use idempotent_retry::retry_after;
//!
//! // Sun, 06 Nov 1994 08:49:37 GMT
//! let now: SystemTime = UNIX_EPOCH + Duration::from_secs(784_111_777);
//!
//! let mut headers = HeaderMap::new();
//! assert_eq!(retry_after::requested_delay(&headers, now), None);
//!
//! headers.insert(RETRY_AFTER, HeaderValue::from_static("Sun, 06 Nov 1994 08:51:37 GMT"));
//! assert_eq!(retry_after::requested_delay(&headers, now), Some(Duration::from_secs(120)));
//!
//! headers.insert("retry-after-ms", HeaderValue::from_static("1500"));
//! assert_eq!(retry_after::requested_delay(&headers, now), Some(Duration::from_millis(1500)));
//! ```

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue};

/// The Stainless SDKs' millisecond header.
const RETRY_AFTER_MS: &str = "retry-after-ms";

/// Fraction digits of a millisecond value that still carry nanoseconds.
const MILLI_FRACTION_DIGITS: usize = 6;

/// Parses one `Retry-After` value into the time left to wait at `now`.
///
/// Accepts `delay-seconds` (ASCII digits, leading zeros allowed) and the three
/// HTTP-date formats of RFC 9110. Optional whitespace around the value is
/// ignored. Returns:
///
/// - `Some(d)` for a number of seconds; values too large for a [`Duration`]
///   saturate to [`Duration::MAX`];
/// - `Some(date - now)` for a date after `now`, and `Some(Duration::ZERO)` for
///   a date at or before `now`;
/// - `None` for anything else: unparsable means absent, never zero.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
///
/// use http::HeaderValue;
/// use idempotent_retry::retry_after;
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
///
/// let secs = HeaderValue::from_static("120");
/// assert_eq!(retry_after::parse(&secs, now), Some(Duration::from_secs(120)));
///
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:50:07 GMT");
/// assert_eq!(retry_after::parse(&date, now), Some(Duration::from_secs(30)));
///
/// let past = HeaderValue::from_static("Sun, 06 Nov 1994 08:00:00 GMT");
/// assert_eq!(retry_after::parse(&past, now), Some(Duration::ZERO));
///
/// let huge = HeaderValue::from_static("99999999999999999999");
/// assert_eq!(retry_after::parse(&huge, now), Some(Duration::MAX));
///
/// let garbage = HeaderValue::from_static("-1");
/// assert_eq!(retry_after::parse(&garbage, now), None);
/// ```
#[must_use]
pub fn parse(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    // `to_str` refuses anything outside visible ASCII (plus SP and HTAB).
    let text = trim_ows(value.to_str().ok()?);
    if let Some(digits) = decimal_digits(text.as_bytes()) {
        return Some(match digits {
            Digits::Value(secs) => Duration::from_secs(secs),
            Digits::Overflow => Duration::MAX,
        });
    }
    let date = httpdate::parse_http_date(text).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Parses one `retry-after-ms` value: a non-negative number of milliseconds,
/// optionally with a decimal fraction.
///
/// The accepted form is `1*DIGIT [ "." 1*DIGIT ]` with optional surrounding
/// whitespace; the fraction is kept to nanosecond precision (digits beyond the
/// sixth are truncated). Values too large for a [`Duration`] saturate to
/// [`Duration::MAX`]. Signs, exponents, `NaN`, `inf`, a bare `.` or `1500.`,
/// and anything else return `None`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// use http::HeaderValue;
/// use idempotent_retry::retry_after;
///
/// let ms = HeaderValue::from_static("1500");
/// assert_eq!(retry_after::parse_ms(&ms), Some(Duration::from_millis(1500)));
///
/// let fractional = HeaderValue::from_static("1500.5");
/// assert_eq!(retry_after::parse_ms(&fractional), Some(Duration::from_micros(1_500_500)));
///
/// let huge = HeaderValue::from_static("99999999999999999999999");
/// assert_eq!(retry_after::parse_ms(&huge), Some(Duration::MAX));
///
/// assert_eq!(retry_after::parse_ms(&HeaderValue::from_static("-1")), None);
/// assert_eq!(retry_after::parse_ms(&HeaderValue::from_static("NaN")), None);
/// ```
#[must_use]
pub fn parse_ms(value: &HeaderValue) -> Option<Duration> {
    let text = trim_ows(value.to_str().ok()?).as_bytes();
    let (whole, fraction) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => (&text[..dot], Some(&text[dot + 1..])),
        None => (text, None),
    };
    let millis = match decimal_digits(whole)? {
        Digits::Value(ms) => Duration::from_millis(ms),
        Digits::Overflow => return valid_fraction(fraction).then_some(Duration::MAX),
    };
    let Some(fraction) = fraction else {
        return Some(millis);
    };
    if !valid_fraction(Some(fraction)) {
        return None;
    }
    // The first six fraction digits, padded with zeros, are the nanoseconds
    // (always below 1 ms); later digits are below 1 ns.
    let nanos = (0..MILLI_FRACTION_DIGITS).fold(0u64, |nanos, position| {
        let digit = fraction.get(position).copied().and_then(digit_value);
        nanos * 10 + digit.unwrap_or(0)
    });
    Some(
        millis
            .checked_add(Duration::from_nanos(nanos))
            .unwrap_or(Duration::MAX),
    )
}

/// The wait the server requested in `headers`, if any.
///
/// `retry-after-ms` takes precedence when at least one of its values parses
/// (see [`parse_ms`]); otherwise `Retry-After` is used (see
/// [`parse`]; HTTP-dates are measured from `now`). When a header
/// occurs several times, the largest parsable value wins: honouring the
/// longest request is the conservative choice. Unparsable occurrences are
/// ignored, and `None` means the server expressed no parsable wish.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
///
/// use http::header::RETRY_AFTER;
/// use http::{HeaderMap, HeaderValue};
/// use idempotent_retry::retry_after;
///
/// let now = UNIX_EPOCH;
/// let mut headers = HeaderMap::new();
/// headers.append(RETRY_AFTER, HeaderValue::from_static("5"));
/// headers.append(RETRY_AFTER, HeaderValue::from_static("garbage"));
/// headers.append(RETRY_AFTER, HeaderValue::from_static("30"));
/// assert_eq!(retry_after::requested_delay(&headers, now), Some(Duration::from_secs(30)));
///
/// // An unparsable `retry-after-ms` falls back to `Retry-After`.
/// headers.insert("retry-after-ms", HeaderValue::from_static("soon"));
/// assert_eq!(retry_after::requested_delay(&headers, now), Some(Duration::from_secs(30)));
///
/// // A parsable one takes precedence, even when it is shorter.
/// headers.insert("retry-after-ms", HeaderValue::from_static("250"));
/// assert_eq!(retry_after::requested_delay(&headers, now), Some(Duration::from_millis(250)));
/// ```
#[must_use]
pub fn requested_delay(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let millis = headers
        .get_all(RETRY_AFTER_MS)
        .iter()
        .filter_map(parse_ms)
        .max();
    millis.or_else(|| {
        headers
            .get_all(RETRY_AFTER)
            .iter()
            .filter_map(|value| parse(value, now))
            .max()
    })
}

/// A run of ASCII digits read as a `u64`, or the note that it does not fit.
enum Digits {
    Value(u64),
    Overflow,
}

/// Reads `1*DIGIT`. `None` if `bytes` is empty or holds anything but ASCII
/// digits; [`Digits::Overflow`] if the number exceeds `u64::MAX`. One pass,
/// no allocation, whatever the length: after an overflow the remaining bytes
/// are only checked to be digits.
fn decimal_digits(bytes: &[u8]) -> Option<Digits> {
    if bytes.is_empty() {
        return None;
    }
    let mut value = Some(0u64);
    for &b in bytes {
        let digit = digit_value(b)?;
        value = value.and_then(|v| v.checked_mul(10)?.checked_add(digit));
    }
    Some(value.map_or(Digits::Overflow, Digits::Value))
}

/// The value of one ASCII digit.
fn digit_value(b: u8) -> Option<u64> {
    b.is_ascii_digit().then(|| u64::from(b - b'0'))
}

/// `true` if there is no fraction, or it is `1*DIGIT`.
fn valid_fraction(fraction: Option<&[u8]>) -> bool {
    fraction.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit))
}

/// Strips optional whitespace (SP and HTAB, RFC 9110 `OWS`) from both ends.
fn trim_ows(text: &str) -> &str {
    text.trim_matches([' ', '\t'])
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use proptest::prelude::*;

    use super::*;

    /// Sun, 06 Nov 1994 08:49:37 GMT.
    const EXAMPLE_SECS: u64 = 784_111_777;
    /// Fri, 31 Dec 9999 23:59:59 GMT, the last second httpdate accepts.
    const YEAR_9999_SECS: u64 = 253_402_300_799;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn hv(s: &'static str) -> HeaderValue {
        HeaderValue::from_static(s)
    }

    fn parse(s: &'static str, now: SystemTime) -> Option<Duration> {
        super::parse(&hv(s), now)
    }

    fn parse_ms(s: &'static str) -> Option<Duration> {
        super::parse_ms(&hv(s))
    }

    // ---- Retry-After: HTTP-date ---------------------------------------------

    #[test]
    fn all_three_date_forms() {
        let now = at(EXAMPLE_SECS - 30);
        for form in [
            "Sun, 06 Nov 1994 08:49:37 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:49:37 GMT", // RFC 850
            "Sun Nov  6 08:49:37 1994",       // asctime
        ] {
            assert_eq!(parse(form, now), Some(Duration::from_secs(30)), "{form}");
        }
    }

    #[test]
    fn date_at_or_before_now_is_zero() {
        let now = at(EXAMPLE_SECS);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:36 GMT", now),
            Some(Duration::ZERO)
        );
        // Sub-second `now` just after the date.
        let later = now + Duration::from_millis(1);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", later),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn date_keeps_the_sub_second_part_of_now() {
        let now = at(EXAMPLE_SECS - 1) + Duration::from_millis(250);
        assert_eq!(
            parse("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::from_millis(750))
        );
    }

    #[test]
    fn date_1970() {
        let epoch = "Thu, 01 Jan 1970 00:00:00 GMT";
        assert_eq!(parse(epoch, at(EXAMPLE_SECS)), Some(Duration::ZERO));
        assert_eq!(parse(epoch, UNIX_EPOCH), Some(Duration::ZERO));
        assert_eq!(
            parse("Thu, 01 Jan 1970 00:00:10 GMT", UNIX_EPOCH),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn date_year_9999_gives_the_real_difference() {
        assert_eq!(
            parse("Fri, 31 Dec 9999 23:59:59 GMT", at(EXAMPLE_SECS)),
            Some(Duration::from_secs(YEAR_9999_SECS - EXAMPLE_SECS))
        );
        assert_eq!(
            parse("Fri Dec 31 23:59:59 9999", UNIX_EPOCH),
            Some(Duration::from_secs(YEAR_9999_SECS))
        );
    }

    #[test]
    fn rfc850_two_digit_years_pivot_at_70() {
        // httpdate reads 00..=69 as 20xx and 70..=99 as 19xx.
        assert_eq!(
            parse("Thursday, 01-Jan-70 00:00:00 GMT", UNIX_EPOCH),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse("Tuesday, 01-Jan-69 00:00:00 GMT", UNIX_EPOCH),
            Some(Duration::from_secs(3_124_224_000))
        );
        // So 2070 is unreachable through RFC 850: "70" is 1970.
        assert_eq!(
            parse("Wednesday, 01-Jan-70 00:00:00 GMT", UNIX_EPOCH),
            None,
            "weekday of 2070 does not match 1970"
        );
    }

    #[test]
    fn date_with_surrounding_whitespace() {
        let now = at(EXAMPLE_SECS - 30);
        assert_eq!(
            parse(" \tSun, 06 Nov 1994 08:49:37 GMT\t ", now),
            Some(Duration::from_secs(30))
        );
    }

    #[test]
    fn bad_dates_are_absent() {
        let now = at(EXAMPLE_SECS);
        for bad in [
            "Mon, 06 Nov 1994 08:49:37 GMT", // wrong weekday
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 1994 08:49:37",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "sun, 06 nov 1994 08:49:37 gmt",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "Wed, 31 Dec 1969 23:59:59 GMT", // before 1970: rejected, not "past"
            "Sat, 01 Jan 10000 00:00:00 GMT",
            "1994-11-06T08:49:37Z",
            "Sun,  06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse(bad, now), None, "{bad:?}");
        }
    }

    // ---- Retry-After: delay-seconds -----------------------------------------

    #[test]
    fn seconds_forms() {
        let now = at(EXAMPLE_SECS);
        assert_eq!(parse("0", now), Some(Duration::ZERO));
        assert_eq!(parse("1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("000120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("0000", now), Some(Duration::ZERO));
        assert_eq!(parse(" 120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse("\t120\t", now), Some(Duration::from_secs(120)));
        assert_eq!(
            parse("18446744073709551615", now),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn huge_seconds_saturate() {
        let now = at(EXAMPLE_SECS);
        assert_eq!(parse("18446744073709551616", now), Some(Duration::MAX));
        assert_eq!(parse("99999999999999999999", now), Some(Duration::MAX));
        let twenty_k = HeaderValue::from_bytes(&vec![b'9'; 20_000]).unwrap();
        assert_eq!(super::parse(&twenty_k, now), Some(Duration::MAX));
        let mut leading_zeros = vec![b'0'; 20_000];
        leading_zeros.extend_from_slice(b"42");
        let leading_zeros = HeaderValue::from_bytes(&leading_zeros).unwrap();
        assert_eq!(
            super::parse(&leading_zeros, now),
            Some(Duration::from_secs(42))
        );
        // A long run of digits with garbage at the end is still garbage.
        let mut bad_tail = vec![b'9'; 20_000];
        bad_tail.push(b'x');
        let bad_tail = HeaderValue::from_bytes(&bad_tail).unwrap();
        assert_eq!(super::parse(&bad_tail, now), None);
    }

    #[test]
    fn garbage_is_absent_not_zero() {
        let now = at(EXAMPLE_SECS);
        for bad in [
            "", " ", "\t", "-1", "-0", "+5", "1.5", "1e3", "abc", "0x10", "1,2", "5, 10", "1 2",
            "NaN", "inf", "١٢", "120s",
        ] {
            let value = HeaderValue::from_str(bad).unwrap();
            assert_eq!(super::parse(&value, now), None, "{bad:?}");
        }
    }

    #[test]
    fn non_ascii_bytes_are_absent() {
        let now = at(EXAMPLE_SECS);
        for bytes in [
            &b"12\xff"[..],
            b"\xff",
            "１２".as_bytes(),
            "Sun, 06 Nov 1994 08:49:37 GMT\u{a0}".as_bytes(),
        ] {
            let value = HeaderValue::from_bytes(bytes).unwrap();
            assert_eq!(super::parse(&value, now), None, "{bytes:?}");
            assert_eq!(super::parse_ms(&value), None, "{bytes:?}");
        }
    }

    // ---- retry-after-ms ----------------------------------------------------

    #[test]
    fn ms_forms() {
        assert_eq!(parse_ms("0"), Some(Duration::ZERO));
        assert_eq!(parse_ms("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_ms("001500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_ms(" 1500 "), Some(Duration::from_millis(1500)));
        assert_eq!(parse_ms("1500.5"), Some(Duration::from_micros(1_500_500)));
        assert_eq!(parse_ms("0.000001"), Some(Duration::from_nanos(1)));
        assert_eq!(parse_ms("0.0000019"), Some(Duration::from_nanos(1)));
        assert_eq!(
            parse_ms("1.123456789"),
            Some(Duration::from_nanos(1_123_456))
        );
        assert_eq!(parse_ms("2.0"), Some(Duration::from_millis(2)));
        assert_eq!(
            parse_ms("18446744073709551615"),
            Some(Duration::from_millis(u64::MAX))
        );
        assert_eq!(
            parse_ms("18446744073709551615.999999"),
            Some(Duration::from_millis(u64::MAX) + Duration::from_nanos(999_999))
        );
    }

    #[test]
    fn ms_overflow_saturates() {
        assert_eq!(parse_ms("99999999999999999999999"), Some(Duration::MAX));
        assert_eq!(parse_ms("99999999999999999999999.5"), Some(Duration::MAX));
        assert_eq!(parse_ms("99999999999999999999999.x"), None);
    }

    #[test]
    fn ms_garbage_is_absent() {
        for bad in [
            "", " ", ".", ".5", "1500.", "1.2.3", "-1", "-0.5", "+1", "1e3", "1E3", "NaN", "nan",
            "inf", "Infinity", "abc", "1500ms", "0x10", "1,5", "1 500",
        ] {
            assert_eq!(parse_ms(bad), None, "{bad:?}");
        }
    }

    // ---- requested_delay ---------------------------------------------------

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for &(name, value) in pairs {
            map.append(name, hv(value));
        }
        map
    }

    #[test]
    fn nothing_requested() {
        assert_eq!(requested_delay(&HeaderMap::new(), UNIX_EPOCH), None);
        let garbage = headers(&[("retry-after", "soon"), ("retry-after-ms", "later")]);
        assert_eq!(requested_delay(&garbage, UNIX_EPOCH), None);
    }

    #[test]
    fn multiple_disagreeing_retry_after_take_the_largest() {
        let now = at(EXAMPLE_SECS);
        let map = headers(&[
            ("retry-after", "5"),
            ("retry-after", "Sun, 06 Nov 1994 08:51:37 GMT"), // 120 s
            ("retry-after", "garbage"),
            ("retry-after", "60"),
            ("retry-after", "Sun, 06 Nov 1994 08:00:00 GMT"), // past: 0
        ]);
        assert_eq!(requested_delay(&map, now), Some(Duration::from_secs(120)));
    }

    #[test]
    fn an_overflowing_value_among_several_wins() {
        // "Longest wins" holds for a value too large for a `Duration` too: the operation then
        // stops as "asked to wait too long" instead of retrying after the shorter value.
        let map = headers(&[
            ("retry-after", "1"),
            ("retry-after", "99999999999999999999"),
            ("retry-after", "-1"),
        ]);
        assert_eq!(requested_delay(&map, UNIX_EPOCH), Some(Duration::MAX));
        // A year-9999 date is not an overflow but the real (huge) difference.
        let map = headers(&[
            ("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
            ("retry-after", "5"),
        ]);
        assert_eq!(
            requested_delay(&map, UNIX_EPOCH),
            Some(Duration::from_secs(YEAR_9999_SECS))
        );
    }

    #[test]
    fn ms_takes_precedence() {
        let now = at(EXAMPLE_SECS);
        let map = headers(&[("retry-after", "120"), ("retry-after-ms", "1500")]);
        assert_eq!(
            requested_delay(&map, now),
            Some(Duration::from_millis(1500))
        );
        let zero = headers(&[("retry-after", "120"), ("retry-after-ms", "0")]);
        assert_eq!(requested_delay(&zero, now), Some(Duration::ZERO));
    }

    #[test]
    fn garbage_ms_falls_back_to_retry_after() {
        let now = at(EXAMPLE_SECS);
        let map = headers(&[("retry-after-ms", "-5"), ("Retry-After", "3")]);
        assert_eq!(requested_delay(&map, now), Some(Duration::from_secs(3)));
    }

    #[test]
    fn multiple_ms_take_the_largest_parsable() {
        let map = headers(&[
            ("retry-after-ms", "100"),
            ("retry-after-ms", "x"),
            ("retry-after-ms", "2500.25"),
            ("retry-after-ms", "700"),
            ("retry-after", "99"),
        ]);
        assert_eq!(
            requested_delay(&map, UNIX_EPOCH),
            Some(Duration::from_micros(2_500_250))
        );
    }

    #[test]
    fn ms_overflow_wins_and_saturates() {
        let map = headers(&[
            ("retry-after-ms", "99999999999999999999999"),
            ("retry-after", "1"),
        ]);
        assert_eq!(requested_delay(&map, UNIX_EPOCH), Some(Duration::MAX));
    }

    // ---- properties ----------------------------------------------------------

    proptest! {
        #[test]
        fn prop_never_panics_on_arbitrary_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            now_secs in 0u64..=YEAR_9999_SECS,
        ) {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                let now = at(now_secs);
                let _ = super::parse(&value, now);
                let _ = super::parse_ms(&value);
                let mut map = HeaderMap::new();
                map.append(RETRY_AFTER, value.clone());
                map.append(RETRY_AFTER_MS, value);
                let _ = requested_delay(&map, now);
            }
        }

        #[test]
        fn prop_never_panics_on_date_like_text(
            text in "[A-Za-z]{3,9},? [0-9 ]{1,2}[- ][A-Za-z]{3}[- ][0-9]{2,5} [0-9]{2}:[0-9]{2}:[0-9]{2}( GMT)?",
            now_secs in 0u64..=YEAR_9999_SECS,
        ) {
            if let Ok(value) = HeaderValue::from_str(&text) {
                let _ = super::parse(&value, at(now_secs));
            }
        }

        #[test]
        fn prop_u32_seconds_round_trip(secs in any::<u32>(), now_secs in any::<u32>()) {
            let value = HeaderValue::from(secs);
            prop_assert_eq!(
                super::parse(&value, at(u64::from(now_secs))),
                Some(Duration::from_secs(u64::from(secs)))
            );
        }

        #[test]
        fn prop_u64_millis_round_trip(ms in any::<u64>()) {
            prop_assert_eq!(
                super::parse_ms(&HeaderValue::from(ms)),
                Some(Duration::from_millis(ms))
            );
        }

        #[test]
        fn prop_future_dates_round_trip(now_secs in 0u64..YEAR_9999_SECS, ahead in 0u64..10_000_000) {
            let date = at(now_secs.saturating_add(ahead).min(YEAR_9999_SECS));
            let value = HeaderValue::from_str(&httpdate::fmt_http_date(date)).unwrap();
            let now = at(now_secs);
            prop_assert_eq!(
                super::parse(&value, now),
                Some(date.duration_since(now).unwrap())
            );
        }
    }
}
