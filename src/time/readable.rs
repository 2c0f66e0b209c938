//! Times and durations as people read them in messages: RFC 3339 instants and `1h 2m 5s`
//! durations, never epoch milliseconds or `Debug` seconds.

use std::time::{Duration, SystemTime};

/// A time as RFC 3339, UTC, to the second. RFC 3339 ends with year 9999: a later time (a
/// lease or retention of `Duration::MAX`, "forever") reads as such.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    if write!(text, "{}", humantime::format_rfc3339_seconds(at)).is_err() {
        return "after 9999-12-31T23:59:59Z".to_owned();
    }
    text
}

/// A duration as a person reads it (`31s`, `1h 2m 5s`, `250ms`), to the millisecond.
pub(crate) fn duration(span: Duration) -> String {
    let rounded = Duration::from_millis(u64::try_from(span.as_millis()).unwrap_or(u64::MAX));
    humantime::format_duration(rounded).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_durations_read_as_people_write_them() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_156_517_402);
        assert_eq!(rfc3339(at), "2026-12-01T20:21:57Z");
        assert_eq!(duration(Duration::from_secs(86_400)), "1day");
        assert_eq!(duration(Duration::from_millis(31_250)), "31s 250ms");
        assert_eq!(duration(Duration::from_nanos(1_500_000)), "1ms");
        assert_eq!(duration(Duration::ZERO), "0s");
        let forever = SystemTime::UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(rfc3339(forever), "after 9999-12-31T23:59:59Z");
    }
}
