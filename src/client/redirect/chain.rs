//! What the caller is told of the redirects behind a response ([`RedirectChain`],
//! [`RedirectHop`]), the follow loop's errors, and the warning for an inner client that
//! redirected on its own.

use std::error::Error as StdError;
use std::fmt;

use http::header::HeaderValue;
use http::{Method, StatusCode};
use reqwest::Url;

use super::policy::{RedirectStop, same_target};

/// One redirect the [`Client`](crate::Client) followed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedirectHop {
    /// The redirect's status (301, 302, 303, 307 or 308).
    pub status: StatusCode,
    /// The URL that answered with the redirect.
    pub from: Url,
    /// Where the next request went.
    pub to: Url,
    /// The next request's method.
    pub method: Method,
    /// Whether the next request carried the idempotency key (it resent the operation and the
    /// operation had a key).
    pub key_sent: bool,
}

/// The redirects behind one response of the [`Client`](crate::Client): every hop followed in
/// the attempt that produced it, why the chain stopped when the response is a redirect that
/// was not followed, and whether the inner client redirected on its own. The final URL is
/// `response.url()`.
///
/// Each attempt starts again from the original URL, so the chain is the last attempt's only.
///
/// ```
/// use idempotent_retry::redirect::RedirectChain;
///
/// // A response no redirect was involved in has the empty chain.
/// let response = reqwest::Response::from(http::Response::new(""));
/// let chain = RedirectChain::of(&response);
/// assert!(chain.hops().is_empty() && chain.stopped().is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedirectChain {
    pub(super) hops: Vec<RedirectHop>,
    pub(super) stopped: Option<RedirectStop>,
    pub(super) inner_client_redirected: bool,
}

/// The chain of every response no redirect was involved in.
static EMPTY: RedirectChain = RedirectChain {
    hops: Vec::new(),
    stopped: None,
    inner_client_redirected: false,
};

impl RedirectChain {
    /// The chain behind a response of [`RequestBuilder::send`](crate::RequestBuilder::send).
    /// Empty when no redirect was involved, and for responses replayed from a
    /// [`Ledger`](crate::ledger::Ledger) (nothing was sent) or from the other front ends (which follow
    /// no redirects).
    #[must_use]
    pub fn of(response: &reqwest::Response) -> &RedirectChain {
        response
            .extensions()
            .get::<RedirectChain>()
            .unwrap_or(&EMPTY)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.hops.is_empty() && self.stopped.is_none() && !self.inner_client_redirected
    }

    /// The redirects followed, in order; empty when the first response was final.
    #[must_use]
    pub fn hops(&self) -> &[RedirectHop] {
        &self.hops
    }

    /// Why the response, a redirect, was not followed; `None` when it is not a redirect this
    /// crate follows (or it is not a 3xx).
    #[must_use]
    pub fn stopped(&self) -> Option<RedirectStop> {
        self.stopped
    }

    /// Whether the inner `reqwest::Client` followed a redirect itself (its response URL was
    /// not the URL sent), outside these rules: the key may have gone to another origin. Build
    /// the client with `redirect::Policy::none()`.
    #[must_use]
    pub fn inner_client_redirected(&self) -> bool {
        self.inner_client_redirected
    }
}

/// One redirect more than the policy allows.
#[derive(Debug)]
pub(super) struct TooManyRedirects {
    pub(super) limit: u32,
}

impl fmt::Display for TooManyRedirects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than {} redirects in one attempt", self.limit)
    }
}

impl StdError for TooManyRedirects {}

/// The attempt's time ran out between two hops.
#[derive(Debug)]
pub(super) struct HopsTimedOut;

impl fmt::Display for HopsTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the attempt timed out while following redirects")
    }
}

impl StdError for HopsTimedOut {}

/// Logs, once per response, that the inner client followed a redirect on its own. Only
/// origins are logged, never paths or queries. Returns whether it did. `key` gives the key
/// sent, asked only for the log line.
pub(crate) fn warn_if_inner_redirected(
    sent: &Url,
    received: &Url,
    key: impl FnOnce() -> Option<HeaderValue>,
) -> bool {
    if same_target(sent, received) {
        return false;
    }
    tracing::warn!(
        key = key_text(key().as_ref()),
        from = %sent.origin().ascii_serialization(),
        to = %received.origin().ascii_serialization(),
        "the inner reqwest client followed a redirect itself, with every header: build it with \
         redirect::Policy::none() so the key stays on its origin"
    );
    true
}

/// The key as logged: empty when there is none (a key is visible ASCII by construction).
pub(super) fn key_text(key: Option<&HeaderValue>) -> &str {
    key.and_then(|value| value.to_str().ok()).unwrap_or("")
}
