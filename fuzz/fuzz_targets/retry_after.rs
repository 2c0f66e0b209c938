//! `Retry-After` and `retry-after-ms` parsing against an independent reading of the rules.
//!
//! Input: a first line with the wall-clock `now` (`[-]SECS[.NANOS]` from the Unix epoch; any
//! other text means 784111777, Sun, 06 Nov 1994 08:49:37 GMT), then one header value per line.
//! A line starting with `ms:` is a `retry-after-ms` value, any other a `Retry-After` value.
//!
//! Checked for every value: no panic; a delay-seconds value gives exactly its seconds (or
//! `Duration::MAX` past `u64`), whatever `now` is; an HTTP-date gives the time left until it,
//! zero when it is not after `now`, and never more than the distance to the end of year 9999;
//! anything else (non-ASCII, signs, fractions, exponents, bad dates) gives `None`;
//! `retry-after-ms` accepts exactly `1*DIGIT ["." 1*DIGIT]` with nanosecond truncation. For the
//! whole set of headers: `requested_delay` is the largest parsable `retry-after-ms`, else the
//! largest parsable `Retry-After`, and does not depend on the order the headers came in.

#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderValue};
use idempotent_retry::retry_after;
use libfuzzer_sys::fuzz_target;

/// Sun, 06 Nov 1994 08:49:37 GMT.
const DEFAULT_NOW_SECS: u64 = 784_111_777;
/// Fri, 31 Dec 9999 23:59:59 GMT, the last second an HTTP-date can name.
const YEAR_9999_SECS: u64 = 253_402_300_799;

fuzz_target!(|data: &[u8]| {
    let mut lines = data.split(|&byte| byte == b'\n');
    let now = lines
        .next()
        .and_then(parse_now)
        .unwrap_or(at(DEFAULT_NOW_SECS));

    let mut forward = HeaderMap::new();
    let mut values: Vec<(bool, HeaderValue)> = Vec::new();
    for line in lines {
        let (is_ms, bytes) = match line.strip_prefix(b"ms:") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let Ok(value) = HeaderValue::from_bytes(bytes) else {
            continue;
        };
        check_retry_after(&value, now);
        check_retry_after_ms(&value);
        forward.append(header_name(is_ms), value.clone());
        values.push((is_ms, value));
    }

    let expected = values
        .iter()
        .filter(|(is_ms, _)| *is_ms)
        .filter_map(|(_, value)| retry_after::parse_ms(value))
        .max()
        .or_else(|| {
            values
                .iter()
                .filter(|(is_ms, _)| !*is_ms)
                .filter_map(|(_, value)| retry_after::parse(value, now))
                .max()
        });
    assert_eq!(retry_after::requested_delay(&forward, now), expected);

    let mut backward = HeaderMap::new();
    for (is_ms, value) in values.iter().rev() {
        backward.append(header_name(*is_ms), value.clone());
    }
    assert_eq!(
        retry_after::requested_delay(&backward, now),
        expected,
        "order matters"
    );
});

fn header_name(is_ms: bool) -> http::HeaderName {
    if is_ms {
        http::HeaderName::from_static("retry-after-ms")
    } else {
        RETRY_AFTER
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// `[-]SECS[.NANOS]`, if the platform's `SystemTime` can hold it.
fn parse_now(line: &[u8]) -> Option<SystemTime> {
    let text = std::str::from_utf8(line).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (secs, nanos) = text.split_once('.').unwrap_or((text, "0"));
    let secs: u64 = secs.parse().ok()?;
    let nanos: u32 = nanos.parse().ok().filter(|nanos| *nanos < 1_000_000_000)?;
    let offset = Duration::new(secs, nanos);
    if negative {
        UNIX_EPOCH.checked_sub(offset)
    } else {
        UNIX_EPOCH.checked_add(offset)
    }
}

/// Optional whitespace (SP, HTAB) stripped from both ends.
fn trim_ows(text: &str) -> &str {
    text.trim_matches([' ', '\t'])
}

fn all_digits(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit())
}

fn check_retry_after(value: &HeaderValue, now: SystemTime) {
    let got = retry_after::parse(value, now);
    let Ok(text) = value.to_str() else {
        assert_eq!(got, None, "non-visible-ASCII value parsed: {value:?}");
        return;
    };
    let text = trim_ows(text);
    if all_digits(text) {
        // Only overflow makes a run of digits fail to parse as u64.
        let expected = text
            .parse::<u64>()
            .map_or(Duration::MAX, Duration::from_secs);
        assert_eq!(got, Some(expected), "seconds {text:?}");
        // Seconds do not depend on the clock.
        assert_eq!(retry_after::parse(value, UNIX_EPOCH), got);
        return;
    }
    match httpdate::parse_http_date(text) {
        Ok(date) => {
            let got = got.unwrap_or_else(|| panic!("date {text:?} refused"));
            assert!(date <= at(YEAR_9999_SECS), "date past year 9999: {text:?}");
            if date <= now {
                assert_eq!(got, Duration::ZERO, "past date {text:?} is not zero");
            } else {
                assert_eq!(now.checked_add(got), Some(date), "date {text:?}");
                if let Ok(since_epoch) = now.duration_since(UNIX_EPOCH) {
                    assert!(got <= Duration::from_secs(YEAR_9999_SECS) - since_epoch);
                }
            }
        }
        Err(_) => assert_eq!(got, None, "garbage {text:?} parsed"),
    }
}

fn check_retry_after_ms(value: &HeaderValue) {
    let got = retry_after::parse_ms(value);
    let Ok(text) = value.to_str() else {
        assert_eq!(got, None, "non-visible-ASCII value parsed: {value:?}");
        return;
    };
    let text = trim_ows(text);
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (text, None),
    };
    if !all_digits(whole) || !fraction.is_none_or(all_digits) {
        assert_eq!(got, None, "malformed milliseconds {text:?} parsed");
        return;
    }
    let expected = match whole.parse::<u64>() {
        Err(_) => Duration::MAX,
        Ok(millis) => {
            // The first six fraction digits are nanoseconds; later ones are truncated.
            let fraction = fraction.unwrap_or("");
            let nanos = (0..6).fold(0u64, |nanos, index| {
                let digit = fraction.as_bytes().get(index).map_or(0, |byte| byte - b'0');
                nanos * 10 + u64::from(digit)
            });
            Duration::from_millis(millis) + Duration::from_nanos(nanos)
        }
    };
    assert_eq!(got, Some(expected), "milliseconds {text:?}");
}
