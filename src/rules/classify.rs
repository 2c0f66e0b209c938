//! Classification: what one attempt's outcome means for the operation.
//!
//! Classification is data, not control flow: an attempt becomes a [`FailureKind`] (or a final
//! answer), and the decision in `decide.rs` turns that into a decision. Status and
//! headers are classified before anyone reads the body, so a parsed error body can never change
//! the decision. Transport errors are classified by their type and by walking their
//! `source()` chain for `io::ErrorKind`s and hyper's error predicates, never by matching on
//! `to_string()`.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use http::{HeaderMap, StatusCode};

/// Why an attempt did not produce a final answer.
///
/// Each kind says whether it is worth retrying ([`is_transient`](Self::is_transient)) and
/// whether the server may have executed the request ([`may_have_executed`](Self::may_have_executed)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The host name could not be resolved. The request never left.
    Dns,
    /// The connection could not be established (refused, unreachable, TLS handshake failed,
    /// connect timeout). The request never left.
    Connect,
    /// The attempt timed out after the connection was made: the server may be executing it.
    Timeout,
    /// The connection was reset, aborted or broken after the request was sent.
    ConnectionReset,
    /// The connection closed before a complete response arrived (incomplete message, stream
    /// refused or cancelled by the peer).
    ConnectionClosed,
    /// A 5xx other than 501 Not Implemented and 505 HTTP Version Not Supported, or an invalid
    /// status from 600 to 999, which RFC 9110 (section 15) says to handle as a 5xx.
    ServerError,
    /// 429 Too Many Requests: the server refused the request without executing it.
    Throttled,
    /// 409 Conflict on a keyed request: the first attempt with this key is still running.
    ///
    /// Waited out, not counted as a failed attempt: it does not count toward
    /// [`RetryPolicy::max_attempts`](crate::RetryPolicy::max_attempts), and the waits are
    /// bounded by [`RetryPolicy::max_in_progress_wait`](crate::RetryPolicy::max_in_progress_wait)
    /// and the reconcile window.
    InProgress,
    /// 408 Request Timeout: the server gave up waiting for the request before executing it.
    RequestTimeout,
    /// The server said to retry (`Stripe-Should-Retry: true` or `x-should-retry: true`) on a
    /// status that is otherwise final.
    ServerHint,
    /// A transport error that retrying will not fix (a redirect loop, a failing request body
    /// stream, a malformed request).
    Fatal,
    /// The redirect chain was longer than the [`RedirectPolicy`](crate::RedirectPolicy)
    /// allows. Not retried: the next attempt would loop again.
    TooManyRedirects,
    /// A redirect was followed and its target could not be resolved or connected to. Retried
    /// from the original URL; unlike [`Dns`](Self::Dns) and [`Connect`](Self::Connect) the
    /// request did leave, to the server that redirected it.
    RedirectTargetUnreachable,
}

impl FailureKind {
    /// Whether another attempt may succeed.
    #[must_use]
    pub const fn is_transient(self) -> bool {
        !matches!(self, FailureKind::Fatal | FailureKind::TooManyRedirects)
    }

    /// Whether the server may have executed the request in this attempt.
    ///
    /// `false` only where the request provably did not run: it never left this machine
    /// ([`Dns`](Self::Dns), [`Connect`](Self::Connect)) or the server refused it before
    /// executing it ([`Throttled`](Self::Throttled), [`RequestTimeout`](Self::RequestTimeout)).
    #[must_use]
    pub const fn may_have_executed(self) -> bool {
        !matches!(
            self,
            FailureKind::Dns
                | FailureKind::Connect
                | FailureKind::Throttled
                | FailureKind::RequestTimeout
        )
    }

    /// Whether the request provably never reached the server, so even a non-idempotent
    /// request without a key may be sent again.
    #[must_use]
    pub const fn never_sent(self) -> bool {
        matches!(self, FailureKind::Dns | FailureKind::Connect)
    }

    /// A short stable name, for logs and metrics.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureKind::Dns => "dns",
            FailureKind::Connect => "connect",
            FailureKind::Timeout => "timeout",
            FailureKind::ConnectionReset => "connection_reset",
            FailureKind::ConnectionClosed => "connection_closed",
            FailureKind::ServerError => "server_error",
            FailureKind::Throttled => "throttled",
            FailureKind::InProgress => "in_progress",
            FailureKind::RequestTimeout => "request_timeout",
            FailureKind::ServerHint => "server_hint",
            FailureKind::Fatal => "fatal",
            FailureKind::TooManyRedirects => "too_many_redirects",
            FailureKind::RedirectTargetUnreachable => "redirect_target_unreachable",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Dns => "dns lookup failed",
            FailureKind::Connect => "connect failed",
            FailureKind::Timeout => "attempt timed out",
            FailureKind::ConnectionReset => "connection reset",
            FailureKind::ConnectionClosed => "connection closed before a complete response",
            FailureKind::ServerError => "server error",
            FailureKind::Throttled => "throttled",
            FailureKind::InProgress => "first attempt still in progress",
            FailureKind::RequestTimeout => "server timed out waiting for the request",
            FailureKind::ServerHint => "server asked for a retry",
            FailureKind::Fatal => "non-transient transport error",
            FailureKind::TooManyRedirects => "too many redirects",
            FailureKind::RedirectTargetUnreachable => "redirect target unreachable",
        })
    }
}

/// What a response's status and headers mean, before any body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatusClass {
    /// A final answer: hand the response to the caller.
    Final,
    /// Worth retrying.
    Retry(FailureKind),
}

/// The server's explicit retry hint, if any: `Stripe-Should-Retry` or `x-should-retry`
/// carrying `true` or `false` (ASCII case-insensitive). Anything else is no hint.
pub(crate) fn should_retry_hint(headers: &HeaderMap) -> Option<bool> {
    ["stripe-should-retry", "x-should-retry"]
        .iter()
        .flat_map(|name| headers.get_all(*name))
        .find_map(|value| {
            let value = value.to_str().ok()?.trim();
            if value.eq_ignore_ascii_case("true") {
                Some(true)
            } else if value.eq_ignore_ascii_case("false") {
                Some(false)
            } else {
                None
            }
        })
}

/// Classifies a response by status and headers alone.
///
/// `keyed` says whether the request carried an idempotency key: a 409 only means "the first
/// attempt is still running" when there is a key to be running under.
pub(crate) fn classify_status(status: StatusCode, headers: &HeaderMap, keyed: bool) -> StatusClass {
    // Informational, success and redirect answers are final whatever the headers say.
    if status.as_u16() < 400 {
        return StatusClass::Final;
    }
    let by_status = match status.as_u16() {
        408 => Some(FailureKind::RequestTimeout),
        409 if keyed => Some(FailureKind::InProgress),
        429 => Some(FailureKind::Throttled),
        501 | 505 => None,
        500..=599 => Some(FailureKind::ServerError),
        // Not a valid status (valid ones are 100..=599), yet hyper accepts any three digits
        // from 100 up. RFC 9110 section 15: a client should treat it as a 5xx, so it is
        // retried like a 500 (and, like a 500, may have run). Without this it would be a
        // final answer handed back as `Ok`.
        600..=999 => Some(FailureKind::ServerError),
        _ => None,
    };
    match (should_retry_hint(headers), by_status) {
        (Some(false), _) => StatusClass::Final,
        (Some(true), kind) => StatusClass::Retry(kind.unwrap_or(FailureKind::ServerHint)),
        (None, Some(kind)) => StatusClass::Retry(kind),
        (None, None) => StatusClass::Final,
    }
}

/// Classifies a reqwest transport error.
///
/// Connect-phase failures come first (a reset during the TLS handshake still means the request
/// never left), then timeouts, then the error's source chain.
pub(crate) fn classify_reqwest_error(err: &reqwest::Error) -> FailureKind {
    if err.is_connect() {
        return if err.is_dns() {
            FailureKind::Dns
        } else {
            FailureKind::Connect
        };
    }
    if err.is_timeout() {
        return FailureKind::Timeout;
    }
    if err.is_builder() || err.is_redirect() || err.is_decode() || err.is_upgrade() {
        return FailureKind::Fatal;
    }
    if let Some(kind) = classify_source_chain(err) {
        return kind;
    }
    if err.is_body() {
        // The request body stream itself failed: retrying resends the same failing stream.
        return FailureKind::Fatal;
    }
    if err.is_request() {
        // Sending failed for a reason not named above (for example an HTTP/2 stream error):
        // the request may or may not have been processed.
        return FailureKind::ConnectionClosed;
    }
    FailureKind::Fatal
}

/// Walks an error's `source()` chain for the shapes that say what happened on the wire.
pub(crate) fn classify_source_chain(err: &(dyn StdError + 'static)) -> Option<FailureKind> {
    let mut current: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(kind) = e
            .downcast_ref::<io::Error>()
            .and_then(|io| classify_io(io.kind()))
        {
            return Some(kind);
        }
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_timeout() {
                return Some(FailureKind::Timeout);
            }
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                // Keep walking: an io::Error below may say "reset", which is more precise.
                if let Some(kind) = e.source().and_then(classify_source_chain) {
                    return Some(kind);
                }
                return Some(FailureKind::ConnectionClosed);
            }
        }
        current = e.source();
    }
    None
}

fn classify_io(kind: io::ErrorKind) -> Option<FailureKind> {
    use io::ErrorKind as K;
    match kind {
        K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
            Some(FailureKind::ConnectionReset)
        }
        K::UnexpectedEof | K::NotConnected => Some(FailureKind::ConnectionClosed),
        K::TimedOut => Some(FailureKind::Timeout),
        K::ConnectionRefused | K::AddrNotAvailable => Some(FailureKind::Connect),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    fn class(code: u16, keyed: bool) -> StatusClass {
        let status = StatusCode::from_u16(code).expect("valid status in test");
        classify_status(status, &HeaderMap::new(), keyed)
    }

    #[test]
    fn statuses_follow_the_table() {
        for code in [
            200, 201, 204, 301, 304, 400, 401, 403, 404, 410, 422, 501, 505,
        ] {
            assert_eq!(class(code, true), StatusClass::Final, "{code}");
        }
        for code in [500, 502, 503, 504, 507, 599] {
            assert_eq!(
                class(code, true),
                StatusClass::Retry(FailureKind::ServerError),
                "{code}"
            );
        }
        assert_eq!(
            class(429, false),
            StatusClass::Retry(FailureKind::Throttled)
        );
        assert_eq!(
            class(408, false),
            StatusClass::Retry(FailureKind::RequestTimeout)
        );
        assert_eq!(
            class(409, true),
            StatusClass::Retry(FailureKind::InProgress)
        );
        assert_eq!(class(409, false), StatusClass::Final);
    }

    #[test]
    fn invalid_statuses_600_to_999_are_handled_as_5xx() {
        for code in [600, 700, 998, 999] {
            assert_eq!(
                class(code, false),
                StatusClass::Retry(FailureKind::ServerError),
                "{code}"
            );
        }
        // As with a 5xx, the server's hint still wins.
        let no = headers(&[("x-should-retry", "false")]);
        let s999 = StatusCode::from_u16(999).expect("http accepts 100..=999");
        assert_eq!(classify_status(s999, &no, true), StatusClass::Final);
        // `http` itself refuses anything outside 100..=999: no status can be out of range here.
        assert!(StatusCode::from_u16(1000).is_err() && StatusCode::from_u16(99).is_err());
    }

    #[test]
    fn server_hints_override_status_rules() {
        let no = headers(&[("stripe-should-retry", "false")]);
        let yes = headers(&[("x-should-retry", "TRUE")]);
        let garbage = headers(&[("x-should-retry", "maybe")]);
        let s503 = StatusCode::SERVICE_UNAVAILABLE;
        let s400 = StatusCode::BAD_REQUEST;
        assert_eq!(classify_status(s503, &no, true), StatusClass::Final);
        assert_eq!(
            classify_status(s400, &yes, true),
            StatusClass::Retry(FailureKind::ServerHint)
        );
        assert_eq!(
            classify_status(s503, &yes, true),
            StatusClass::Retry(FailureKind::ServerError)
        );
        assert_eq!(
            classify_status(s503, &garbage, true),
            StatusClass::Retry(FailureKind::ServerError)
        );
        assert_eq!(classify_status(s400, &garbage, true), StatusClass::Final);
        // Success stays success even if a server says "retry".
        assert_eq!(
            classify_status(StatusCode::OK, &yes, true),
            StatusClass::Final
        );
    }

    #[test]
    fn io_kinds_in_the_source_chain() {
        #[derive(Debug)]
        struct Wrapper(io::Error);
        impl fmt::Display for Wrapper {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("wrapper")
            }
        }
        impl StdError for Wrapper {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let cases = [
            (
                io::ErrorKind::ConnectionReset,
                Some(FailureKind::ConnectionReset),
            ),
            (
                io::ErrorKind::ConnectionAborted,
                Some(FailureKind::ConnectionReset),
            ),
            (
                io::ErrorKind::BrokenPipe,
                Some(FailureKind::ConnectionReset),
            ),
            (
                io::ErrorKind::UnexpectedEof,
                Some(FailureKind::ConnectionClosed),
            ),
            (io::ErrorKind::TimedOut, Some(FailureKind::Timeout)),
            (io::ErrorKind::ConnectionRefused, Some(FailureKind::Connect)),
            (io::ErrorKind::PermissionDenied, None),
        ];
        for (kind, expected) in cases {
            let err = Wrapper(io::Error::new(kind, "x"));
            assert_eq!(classify_source_chain(&err), expected, "{kind:?}");
        }
    }

    #[test]
    fn execution_facts() {
        assert!(!FailureKind::Connect.may_have_executed());
        assert!(!FailureKind::Dns.may_have_executed());
        assert!(!FailureKind::Throttled.may_have_executed());
        assert!(FailureKind::Timeout.may_have_executed());
        assert!(FailureKind::ConnectionReset.may_have_executed());
        assert!(FailureKind::ServerError.may_have_executed());
        assert!(FailureKind::InProgress.may_have_executed());
        assert!(FailureKind::Dns.never_sent() && FailureKind::Connect.never_sent());
        assert!(!FailureKind::Throttled.never_sent());
        assert!(!FailureKind::Fatal.is_transient());
    }
}
