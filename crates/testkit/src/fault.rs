//! Faults a [`Receiver`](super::Receiver) can be scripted to produce, and when.

use std::fmt;
use std::time::{Duration, SystemTime};

/// Which delivery a scripted [`Fault`] applies to.
///
/// A delivery is counted when its request has been read completely. When a request matches both
/// a [`Request`](When::Request) and a [`KeyAttempt`](When::KeyAttempt) script, the request-number
/// script wins and the other one stays armed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum When {
    /// The `n`th request to arrive at the receiver, 1 for the first.
    Request(u64),
    /// The `attempt`th request carrying this idempotency key in the key header, 1 for the
    /// first.
    KeyAttempt {
        /// The key, as sent in the key header.
        key: String,
        /// 1 for the first request with this key.
        attempt: u32,
    },
}

impl When {
    /// The `n`th request to arrive (1 for the first).
    #[must_use]
    pub const fn request(n: u64) -> When {
        When::Request(n)
    }

    /// The `attempt`th request carrying `key` (1 for the first).
    #[must_use]
    pub fn key_attempt(key: impl fmt::Display, attempt: u32) -> When {
        When::KeyAttempt {
            key: key.to_string(),
            attempt,
        }
    }
}

/// 9999-12-31T23:59:59Z in seconds since the epoch: the last time an IMF-fixdate can write.
const LAST_HTTP_DATE_SECS: u64 = 253_402_300_799;

/// How a canned answer asks the sender to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryAfter {
    /// `Retry-After: <seconds>`.
    Seconds(u64),
    /// `Retry-After: <IMF-fixdate>`, this long after the receiver's wall clock at answer time
    /// (whole seconds: an HTTP-date has no fraction). A date past the year 9999, the last an
    /// IMF-fixdate can write, is written as 9999-12-31 23:59:59 GMT.
    HttpDate(Duration),
    /// `retry-after-ms: <milliseconds>`.
    Millis(u64),
}

/// An answer given without running the handler: an overloaded front end, a rate limiter, a
/// proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canned {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) retry_after: Option<RetryAfter>,
}

impl Canned {
    /// This status with no extra headers and an empty body.
    #[must_use]
    pub fn new(status: u16) -> Canned {
        Canned {
            status,
            headers: Vec::new(),
            retry_after: None,
        }
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Canned {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Asks the sender to wait.
    #[must_use]
    pub fn retry_after(mut self, wait: RetryAfter) -> Canned {
        self.retry_after = Some(wait);
        self
    }

    /// The status.
    #[must_use]
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The headers at `wall` (a [`RetryAfter::HttpDate`] is resolved against it).
    pub(crate) fn headers_at(&self, wall: SystemTime) -> Vec<(String, String)> {
        let mut headers = self.headers.clone();
        match self.retry_after {
            Some(RetryAfter::Seconds(s)) => {
                headers.push(("Retry-After".to_owned(), s.to_string()));
            }
            Some(RetryAfter::HttpDate(after)) => {
                // Round up to the next whole second so the date is never earlier than asked;
                // saturate at the last second an HTTP-date can write instead of overflowing.
                let last = SystemTime::UNIX_EPOCH + Duration::from_secs(LAST_HTTP_DATE_SECS);
                let at = wall
                    .checked_add(after)
                    .and_then(|at| at.checked_add(Duration::from_millis(999)))
                    .map_or(last, |at| at.min(last));
                headers.push(("Retry-After".to_owned(), httpdate::fmt_http_date(at)));
            }
            Some(RetryAfter::Millis(ms)) => {
                headers.push(("retry-after-ms".to_owned(), ms.to_string()));
            }
            None => {}
        }
        headers
    }
}

/// What goes wrong with one scripted delivery.
///
/// The first three act before the idempotency check (the handler never runs, no key is
/// claimed); [`SlowHandler`](Fault::SlowHandler) acts while the key is claimed; the last two act
/// on the answer, whatever it is (a first run, a replay, a 409).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Reset the connection (`SO_LINGER` 0) after reading the request, before the handler
    /// runs: nothing happened.
    ResetBeforeHandler,
    /// Close the connection cleanly (FIN) after reading the request, without an answer and
    /// without running the handler.
    CloseWithoutReply,
    /// Answer this, without running the handler.
    Respond(Canned),
    /// Hold the claimed key `in_progress` this long before the handler runs, so duplicates meet
    /// a 409. The handler finishes even if the client has given up.
    SlowHandler(Duration),
    /// Run normally (the side effect commits), then reset instead of answering: the response
    /// is lost.
    ResetAfterCommit,
    /// Run normally (the side effect commits), then hold the answer this long before sending it;
    /// a client that hangs up meanwhile gets nothing.
    StallAfterCommit(Duration),
    /// Run normally (the side effect commits), then send the answer's head and only the first
    /// this many bytes of its body (never all of it), then close: the answer is cut mid-body.
    CutBodyAfterCommit(usize),
}

impl Fault {
    /// Answer `status` without running the handler.
    #[must_use]
    pub fn status(status: u16) -> Fault {
        Fault::Respond(Canned::new(status))
    }

    /// Answer `status` with `Retry-After: <secs>`.
    #[must_use]
    pub fn retry_after_secs(status: u16, secs: u64) -> Fault {
        Fault::Respond(Canned::new(status).retry_after(RetryAfter::Seconds(secs)))
    }

    /// Answer `status` with `Retry-After` as an HTTP-date `after` from now.
    #[must_use]
    pub fn retry_after_date(status: u16, after: Duration) -> Fault {
        Fault::Respond(Canned::new(status).retry_after(RetryAfter::HttpDate(after)))
    }

    /// Answer `status` with `retry-after-ms: <ms>`.
    #[must_use]
    pub fn retry_after_ms(status: u16, ms: u64) -> Fault {
        Fault::Respond(Canned::new(status).retry_after(RetryAfter::Millis(ms)))
    }

    /// Answer `status` with the hint `Stripe-Should-Retry: true|false`.
    #[must_use]
    pub fn should_retry(status: u16, retry: bool) -> Fault {
        let value = if retry { "true" } else { "false" };
        Fault::Respond(Canned::new(status).header("Stripe-Should-Retry", value))
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::ResetBeforeHandler => f.write_str("reset before the handler"),
            Fault::CloseWithoutReply => f.write_str("closed without a reply"),
            Fault::Respond(canned) => {
                write!(f, "{}", canned.status)?;
                for (name, value) in &canned.headers {
                    write!(f, " {name}: {value}")?;
                }
                match canned.retry_after {
                    Some(RetryAfter::Seconds(s)) => write!(f, " Retry-After: {s}"),
                    Some(RetryAfter::HttpDate(d)) => {
                        write!(f, " Retry-After: <HTTP-date +{}s>", d.as_secs())
                    }
                    Some(RetryAfter::Millis(ms)) => write!(f, " retry-after-ms: {ms}"),
                    None => Ok(()),
                }
            }
            Fault::SlowHandler(d) => write!(f, "slow handler ({}ms)", d.as_millis()),
            Fault::ResetAfterCommit => f.write_str("reset after commit"),
            Fault::StallAfterCommit(d) => write!(f, "stall {}ms after commit", d.as_millis()),
            Fault::CutBodyAfterCommit(keep) => {
                write!(f, "cut after {keep} bytes of the body, after commit")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn retry_after_forms_are_written_as_the_crate_parses_them() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(1_704_067_200_250);
        let secs = Canned::new(429).retry_after(RetryAfter::Seconds(3));
        assert_eq!(header(&secs.headers_at(wall), "retry-after"), Some("3"));
        let ms = Canned::new(429).retry_after(RetryAfter::Millis(250));
        assert_eq!(header(&ms.headers_at(wall), "retry-after-ms"), Some("250"));

        let date = Canned::new(503).retry_after(RetryAfter::HttpDate(Duration::from_secs(30)));
        let headers = date.headers_at(wall);
        let value = header(&headers, "retry-after").expect("a date");
        assert_eq!(value, "Mon, 01 Jan 2024 00:00:31 GMT");
        // Rounded up to whole seconds: never earlier than asked.
        let asked = idempotent_retry::retry_after::parse(
            &http::HeaderValue::from_str(value).expect("ascii"),
            wall,
        )
        .expect("parsable");
        assert!(asked >= Duration::from_secs(30), "{asked:?}");
        assert!(asked < Duration::from_secs(31), "{asked:?}");
    }

    #[test]
    fn a_date_beyond_the_year_9999_is_written_as_its_last_second() {
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        for after in [
            Duration::MAX,
            Duration::from_secs(u64::MAX / 2),
            Duration::from_secs(LAST_HTTP_DATE_SECS),
        ] {
            let date = Canned::new(503).retry_after(RetryAfter::HttpDate(after));
            assert_eq!(
                header(&date.headers_at(wall), "retry-after"),
                Some("Fri, 31 Dec 9999 23:59:59 GMT"),
                "{after:?}"
            );
        }
    }

    #[test]
    fn faults_describe_themselves() {
        assert_eq!(Fault::ResetAfterCommit.to_string(), "reset after commit");
        assert_eq!(
            Fault::should_retry(503, false).to_string(),
            "503 Stripe-Should-Retry: false"
        );
        assert_eq!(
            Fault::retry_after_ms(429, 50).to_string(),
            "429 retry-after-ms: 50"
        );
        assert_eq!(
            Fault::StallAfterCommit(Duration::from_millis(1_000)).to_string(),
            "stall 1000ms after commit"
        );
        assert_eq!(
            When::key_attempt("k", 2),
            When::KeyAttempt {
                key: "k".to_owned(),
                attempt: 2
            }
        );
    }
}
