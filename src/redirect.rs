//! Redirects, followed by the crate itself so the key goes only where the caller sends it.
//!
//! `reqwest`'s own redirect support cannot do this: its policy sees neither the method nor the
//! headers, and across origins it strips only credentials, so an idempotency key would travel
//! to any origin a server names, and along on the `GET` that follows a 303. The
//! [`Client`](crate::Client) therefore builds its inner `reqwest::Client` with
//! `redirect::Policy::none()` and follows hops here, inside one attempt, by these rules:
//!
//! | status | next request | body and payload headers | key |
//! |---|---|---|---|
//! | 301, 302 on a `POST` | `GET` | dropped | dropped |
//! | 301, 302 on any other method | same method | kept | kept |
//! | 303 | `GET` (`HEAD` stays `HEAD`) | dropped | dropped |
//! | 307, 308 | same method | kept | kept |
//!
//! A hop that keeps the key (the operation itself is resent) is followed to the original
//! request's origin, and to another origin only when the [`RedirectPolicy`] allows it; a hop
//! that drops the key is a plain read and is followed anywhere. Credentials (`Authorization`,
//! `Cookie`, `Proxy-Authorization`, `WWW-Authenticate`) are removed as soon as a hop leaves the
//! origin it was sent to, as reqwest does. The pure parts (origins, `Location`, the method
//! rewrite) are plain functions with unit tests; [`follow`] is the loop.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HeaderMap, HeaderName,
    HeaderValue, LOCATION, PROXY_AUTHORIZATION, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use http::{Method, StatusCode};
use reqwest::Url;

use crate::classify::FailureKind;
use crate::client::ClientRef;
use crate::engine::SendError;
use crate::error::Error;
use crate::exchange::reqwest_send_error;

/// The default number of redirects followed in one attempt (reqwest's default too).
const DEFAULT_MAX_HOPS: u32 = 10;

/// Which redirects the [`Client`](crate::Client) follows, and where the idempotency key may go.
///
/// Set it with [`ClientBuilder::redirects`](crate::ClientBuilder::redirects). The crate follows
/// 301, 302, 303, 307 and 308 itself, inside one attempt (all hops run under the attempt's
/// timeout, and a retry starts again from the original URL with the same key):
///
/// - 301 and 302 turn a `POST` into a `GET`; 303 turns everything but `HEAD` into a `GET`. That
///   request fetches a result, it is not the operation: it goes without the body, without the
///   payload headers (`Content-Type`, `Content-Length`, `Content-Encoding`,
///   `Transfer-Encoding`) and **without the idempotency key**, to any origin.
/// - 307 and 308 (and 301/302 on methods other than `POST`) resend the operation: same method,
///   same body, same key. They are followed to the origin of the original request and to the
///   origins this policy allows; a redirect that would carry the key to any other origin is
///   not followed, and the caller gets the 3xx itself as the final response
///   ([`RedirectChain::stopped`] says why). A streamed body that cannot be sent twice stops
///   there too.
/// - Across origins, credentials (`Authorization`, `Cookie`, `Proxy-Authorization`,
///   `WWW-Authenticate`) are removed whatever this policy allows, as reqwest does. No `Referer`
///   is added.
/// - A redirect without a `Location`, or with one that is not a valid URL reference, carries
///   user info or names a scheme other than `http`/`https`, is not followed: the 3xx is the
///   final response.
/// - One redirect more than the limit ends the operation with
///   [`ErrorKind::TooManyRedirects`](crate::ErrorKind::TooManyRedirects), not retried (the
///   chain would loop again) and reported as outcome unknown: the request reached at least one
///   server, and a 303 answers a request that has run.
///
/// An origin is a scheme, host and port: `https://api.example.com` and
/// `https://api.example.com:8443` differ, and so do `http://localhost` and `http://127.0.0.1`.
///
/// These rules apply to the client's own `reqwest::Client`. One passed with
/// [`ClientBuilder::http`](crate::ClientBuilder::http) keeps its own redirect setting, and
/// reqwest's default follows up to 10 redirects with the key on every hop, to any origin:
/// build it with `.redirect(reqwest::redirect::Policy::none())`. When the inner client follows
/// a redirect anyway, the crate logs a warning (key, both origins) and sets
/// [`RedirectChain::inner_client_redirected`].
///
/// # Default
///
/// Up to 10 redirects per attempt; the key goes to the original origin only.
///
/// # Examples
///
/// ```
/// use idempotent_retry::{Client, RedirectPolicy};
///
/// // Follow at most 3 hops, and let the key go to the EU endpoint as well.
/// let client = Client::builder()
///     .redirects(RedirectPolicy::limited(3).allow_key_to("https://api-eu.example.com"))
///     .build()?;
/// // Hand every 3xx to the caller.
/// let strict = Client::builder().redirects(RedirectPolicy::none()).build()?;
/// # drop((client, strict));
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct RedirectPolicy {
    /// `None`: no redirect is followed.
    max_hops: Option<u32>,
    /// Origins (ASCII serialization, `scheme://host[:port]`) the key may go to besides the
    /// original request's.
    key_origins: Vec<String>,
    /// The key may go to any origin.
    key_to_any_origin: bool,
    /// The first origin given that is not one, reported by `ClientBuilder::build`.
    invalid_origin: Option<String>,
}

impl Default for RedirectPolicy {
    fn default() -> Self {
        RedirectPolicy::limited(DEFAULT_MAX_HOPS)
    }
}

impl RedirectPolicy {
    /// Follows up to 10 redirects per attempt; the key goes to the original origin only.
    pub fn new() -> Self {
        RedirectPolicy::default()
    }

    /// Follows no redirect: every 3xx is returned to the caller as the final response.
    pub fn none() -> Self {
        RedirectPolicy {
            max_hops: None,
            ..RedirectPolicy::limited(0)
        }
    }

    /// Follows up to `max` redirects per attempt; one more ends the operation with
    /// [`ErrorKind::TooManyRedirects`](crate::ErrorKind::TooManyRedirects). With 0, every
    /// redirect the crate would follow is that error (use [`none`](Self::none) to get the 3xx
    /// instead).
    pub fn limited(max: u32) -> Self {
        RedirectPolicy {
            max_hops: Some(max),
            key_origins: Vec::new(),
            key_to_any_origin: false,
            invalid_origin: None,
        }
    }

    /// Lets redirects that resend the operation (307, 308) carry the key to `origin` too:
    /// `scheme://host` or `scheme://host:port`, `http` or `https`, nothing after it (a `/` at
    /// most). Call it once per origin. Credentials are still removed on the way there.
    ///
    /// Default: none; the key goes to the original request's origin only.
    ///
    /// An origin that cannot be parsed, has another scheme, or carries a path, query, fragment
    /// or user info makes [`ClientBuilder::build`](crate::ClientBuilder::build) fail with
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder).
    pub fn allow_key_to(mut self, origin: &str) -> Self {
        match parse_origin(origin) {
            Some(origin) => self.key_origins.push(origin),
            None => {
                self.invalid_origin.get_or_insert_with(|| origin.to_owned());
            }
        }
        self
    }

    /// Lets redirects that resend the operation carry the key to any origin a server names.
    /// Only for APIs that move operations between hosts you trust all of.
    ///
    /// Default: off.
    pub fn allow_key_to_any_origin(mut self) -> Self {
        self.key_to_any_origin = true;
        self
    }

    /// How many redirects are followed per attempt; `None` when none are.
    #[must_use]
    pub fn max_hops(&self) -> Option<u32> {
        self.max_hops
    }

    /// Whether a redirect that keeps the key may follow to `next`, given the original request
    /// went to `original`.
    #[must_use]
    pub fn allows_key_to(&self, original: &Url, next: &Url) -> bool {
        if same_origin(original, next) || self.key_to_any_origin {
            return true;
        }
        let next = next.origin();
        next.is_tuple()
            && self
                .key_origins
                .iter()
                .any(|allowed| *allowed == next.ascii_serialization())
    }

    /// Checks the origins given to [`allow_key_to`](Self::allow_key_to).
    pub(crate) fn validate(&self) -> Result<(), Error> {
        match &self.invalid_origin {
            None => Ok(()),
            Some(origin) => Err(Error::builder(format!(
                "redirect policy: {origin:?} is not an origin (scheme://host[:port], http or https)"
            ))),
        }
    }
}

/// `scheme://host[:port]` with an `http`/`https` scheme and nothing else, as the ASCII
/// serialization of its origin; `None` otherwise.
fn parse_origin(text: &str) -> Option<String> {
    let url = Url::parse(text).ok()?;
    let bare = matches!(url.scheme(), "http" | "https")
        && url.host().is_some()
        && url.username().is_empty()
        && url.password().is_none()
        && url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none();
    bare.then(|| url.origin().ascii_serialization())
}

/// Whether two URLs have the same origin (scheme, host, port; RFC 6454). URLs with opaque
/// origins (schemes other than the special ones) are never the same origin.
#[must_use]
pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    let a = a.origin();
    a.is_tuple() && a == b.origin()
}

/// Whether two URLs name the same request target on the same origin. The fragment is never
/// sent and reqwest moves user info into `Authorization`, so neither counts.
fn same_target(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
        && a.path() == b.path()
        && a.query() == b.query()
}

/// The target of a redirect: `Location` resolved against the URL that answered (RFC 9110
/// §10.2.2, RFC 3986 §5), or why there is none to follow.
pub(crate) fn resolve_location(current: &Url, headers: &HeaderMap) -> Result<Url, RedirectStop> {
    let mut values = headers.get_all(LOCATION).iter();
    let value = match (values.next(), values.next()) {
        (None, _) => return Err(RedirectStop::MissingLocation),
        (Some(_), Some(_)) => return Err(RedirectStop::InvalidLocation),
        (Some(value), None) => value,
    };
    let text = value.to_str().map_err(|_| RedirectStop::InvalidLocation)?;
    let next = current
        .join(text.trim())
        .map_err(|_| RedirectStop::InvalidLocation)?;
    if !matches!(next.scheme(), "http" | "https") || next.host().is_none() {
        return Err(RedirectStop::UnsupportedScheme);
    }
    if !next.username().is_empty() || next.password().is_some() {
        // Credentials are the caller's to give, never a server's.
        return Err(RedirectStop::InvalidLocation);
    }
    Ok(next)
}

/// What a redirect status does to the request that got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rewrite {
    /// The next request's method.
    pub(crate) method: Method,
    /// Whether the next request is the same operation, resent: method, body and key kept.
    /// Otherwise it is a read: no body, no payload headers, no key.
    pub(crate) resend: bool,
}

/// The next request's method for a redirect status, or `None` for a status this crate does not
/// follow (300, 304, 305, 306, anything outside 3xx).
pub(crate) fn rewrite(status: StatusCode, method: &Method) -> Option<Rewrite> {
    match status {
        StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND if *method == Method::POST => {
            Some(Rewrite {
                method: Method::GET,
                resend: false,
            })
        }
        StatusCode::SEE_OTHER => Some(Rewrite {
            method: if *method == Method::HEAD {
                Method::HEAD
            } else {
                Method::GET
            },
            resend: false,
        }),
        StatusCode::MOVED_PERMANENTLY
        | StatusCode::FOUND
        | StatusCode::TEMPORARY_REDIRECT
        | StatusCode::PERMANENT_REDIRECT => Some(Rewrite {
            method: method.clone(),
            resend: true,
        }),
        _ => None,
    }
}

/// Why a redirect was not followed; the 3xx is then the final response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RedirectStop {
    /// The policy follows no redirect ([`RedirectPolicy::none`]).
    Disabled,
    /// The response has no `Location` header.
    MissingLocation,
    /// `Location` is not a valid URL reference, carries user info, or there are several.
    InvalidLocation,
    /// `Location` names a scheme other than `http` or `https`, or no host.
    UnsupportedScheme,
    /// The redirect resends the operation with its key to an origin the policy does not allow
    /// ([`RedirectPolicy::allow_key_to`]).
    KeyToOtherOrigin,
    /// The redirect resends the operation, and its streamed body cannot be sent twice.
    BodyNotReplayable,
}

impl fmt::Display for RedirectStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RedirectStop::Disabled => "redirects are not followed",
            RedirectStop::MissingLocation => "no location header",
            RedirectStop::InvalidLocation => "invalid location header",
            RedirectStop::UnsupportedScheme => "location is not an http or https url",
            RedirectStop::KeyToOtherOrigin => "the key may not go to the location's origin",
            RedirectStop::BodyNotReplayable => "the streamed body cannot be sent again",
        })
    }
}

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
/// use idempotent_retry::RedirectChain;
///
/// // A response no redirect was involved in has the empty chain.
/// let response = reqwest::Response::from(http::Response::new(""));
/// let chain = RedirectChain::of(&response);
/// assert!(chain.hops().is_empty() && chain.stopped().is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedirectChain {
    hops: Vec<RedirectHop>,
    stopped: Option<RedirectStop>,
    inner_client_redirected: bool,
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
    /// [`Ledger`](crate::Ledger) (nothing was sent) or from the other front ends (which follow
    /// no redirects).
    #[must_use]
    pub fn of(response: &reqwest::Response) -> &RedirectChain {
        response
            .extensions()
            .get::<RedirectChain>()
            .unwrap_or(&EMPTY)
    }

    fn is_empty(&self) -> bool {
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
struct TooManyRedirects {
    limit: u32,
}

impl fmt::Display for TooManyRedirects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "more than {} redirects in one attempt", self.limit)
    }
}

impl StdError for TooManyRedirects {}

/// The attempt's time ran out between two hops.
#[derive(Debug)]
struct HopsTimedOut;

impl fmt::Display for HopsTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the attempt timed out while following redirects")
    }
}

impl StdError for HopsTimedOut {}

/// Logs, once per response, that the inner client followed a redirect on its own. Only
/// origins are logged, never paths or queries. Returns whether it did.
pub(crate) fn warn_if_inner_redirected(
    sent: &Url,
    received: &Url,
    key: Option<&HeaderValue>,
) -> bool {
    if same_target(sent, received) {
        return false;
    }
    tracing::warn!(
        key = key_text(key),
        from = %sent.origin().ascii_serialization(),
        to = %received.origin().ascii_serialization(),
        "the inner reqwest client followed a redirect itself, with every header: build it with \
         redirect::Policy::none() so the key stays on its origin"
    );
    true
}

/// The key as logged: empty when there is none (a key is visible ASCII by construction).
fn key_text(key: Option<&HeaderValue>) -> &str {
    key.and_then(|value| value.to_str().ok()).unwrap_or("")
}

/// What is kept of a request while it is sent: a full copy for the next hop, one without its
/// streamed body, or (when no redirect is followed) only its URL.
enum Retained {
    Full(reqwest::Request),
    BodyLost(reqwest::Request),
    Url(Url),
}

impl Retained {
    fn of(request: &reqwest::Request, policy: &RedirectPolicy) -> Retained {
        if policy.max_hops.is_none() {
            return Retained::Url(request.url().clone());
        }
        match request.try_clone() {
            Some(copy) => Retained::Full(copy),
            None => {
                let mut copy =
                    reqwest::Request::new(request.method().clone(), request.url().clone());
                *copy.headers_mut() = request.headers().clone();
                *copy.version_mut() = request.version();
                Retained::BodyLost(copy)
            }
        }
    }

    /// The URL the request was sent to.
    fn url(&self) -> &Url {
        match self {
            Retained::Full(request) | Retained::BodyLost(request) => request.url(),
            Retained::Url(url) => url,
        }
    }
}

/// What to do with a response.
enum Step {
    /// Return it; `Some` when it is a redirect left unfollowed.
    Final(Option<RedirectStop>),
    /// One redirect more than allowed.
    TooMany(u32),
    /// Send this request next.
    Follow(Box<(reqwest::Request, RedirectHop)>),
}

/// Decides what follows `response` (status, headers, URL), given a copy of the request that
/// produced it.
fn next_step(
    policy: &RedirectPolicy,
    original: &Url,
    key_header: &HeaderName,
    hops_so_far: usize,
    response: &reqwest::Response,
    copy: Retained,
) -> Step {
    let status = response.status();
    let (sent, limit) = match (&copy, policy.max_hops) {
        (Retained::Full(request) | Retained::BodyLost(request), Some(limit)) => (request, limit),
        // Only `none()` keeps no copy.
        (Retained::Url(_), _) | (_, None) => {
            return Step::Final(rewrite(status, &Method::GET).map(|_| RedirectStop::Disabled));
        }
    };
    let Some(Rewrite { method, resend }) = rewrite(status, sent.method()) else {
        return Step::Final(None);
    };
    let current = response.url();
    let to = match resolve_location(current, response.headers()) {
        Ok(to) => to,
        Err(stop) => return Step::Final(Some(stop)),
    };
    let keyed = sent.headers().contains_key(key_header);
    if resend && keyed && !policy.allows_key_to(original, &to) {
        return Step::Final(Some(RedirectStop::KeyToOtherOrigin));
    }
    let mut next = match copy {
        Retained::Full(request) => request,
        Retained::BodyLost(_) if resend => {
            return Step::Final(Some(RedirectStop::BodyNotReplayable));
        }
        Retained::BodyLost(request) => request,
        Retained::Url(_) => return Step::Final(Some(RedirectStop::Disabled)),
    };
    if u32::try_from(hops_so_far).unwrap_or(u32::MAX) >= limit {
        return Step::TooMany(limit);
    }
    if !resend {
        *next.body_mut() = None;
        let headers = next.headers_mut();
        for name in [
            CONTENT_TYPE,
            CONTENT_LENGTH,
            CONTENT_ENCODING,
            TRANSFER_ENCODING,
        ] {
            headers.remove(name);
        }
        headers.remove(key_header);
    }
    if !same_origin(current, &to) {
        strip_credentials(next.headers_mut());
    }
    *next.method_mut() = method.clone();
    *next.url_mut() = to.clone();
    let hop = RedirectHop {
        status,
        from: current.clone(),
        to,
        method,
        key_sent: next.headers().contains_key(key_header),
    };
    Step::Follow(Box::new((next, hop)))
}

/// Removes what reqwest removes when a redirect leaves the origin.
fn strip_credentials(headers: &mut HeaderMap) {
    for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, WWW_AUTHENTICATE] {
        headers.remove(name);
    }
    headers.remove("cookie2");
}

/// What is kept of a hop while it is sent, to build the next one from.
enum Kept<'o> {
    /// The operation's own request, which the engine keeps for later attempts: nothing is
    /// copied unless a redirect comes back. `attempt` is this attempt's attempt-header value.
    Original {
        request: &'o reqwest::Request,
        attempt: Option<HeaderValue>,
    },
    /// A copy made before sending: for later hops, and for a streamed body the engine could
    /// not keep.
    Copy(Box<Retained>),
}

impl Kept<'_> {
    /// The URL the hop was sent to.
    fn url(&self) -> &Url {
        match self {
            Kept::Original { request, .. } => request.url(),
            Kept::Copy(copy) => copy.url(),
        }
    }

    /// The request again, as this hop sent it.
    fn into_retained(
        self,
        policy: &RedirectPolicy,
        attempt_header: Option<&HeaderName>,
    ) -> Retained {
        match self {
            Kept::Copy(copy) => *copy,
            Kept::Original { request, attempt } => {
                let mut copy = Retained::of(request, policy);
                if let (Retained::Full(copy) | Retained::BodyLost(copy), Some(name), Some(value)) =
                    (&mut copy, attempt_header, attempt)
                {
                    copy.headers_mut().insert(name.clone(), value);
                }
                copy
            }
        }
    }
}

/// Sends one attempt through the client's `reqwest::Client` and follows its redirects by the
/// client's [`RedirectPolicy`], all within the attempt's timeout (the request's own, set by
/// the engine).
///
/// `original` is the operation's request the attempt was cloned from, when the engine has it:
/// the first hop is then rebuilt from it only if a redirect comes back, so an attempt without
/// redirects copies nothing.
pub(crate) async fn follow(
    client: &ClientRef,
    mut request: reqwest::Request,
    original: Option<&reqwest::Request>,
) -> Result<reqwest::Response, SendError> {
    let policy = &client.redirects;
    let settings = &*client.settings;
    let key_header = &settings.key_header;
    let started = settings.clock.now();
    let budget = request.timeout().copied();
    let mut chain = RedirectChain::default();
    loop {
        let kept = match original {
            Some(original) if chain.hops.is_empty() => Kept::Original {
                request: original,
                attempt: settings
                    .attempt_header
                    .as_ref()
                    .and_then(|name| request.headers().get(name).cloned()),
            },
            // Made before this hop consumes a streamed body.
            _ => Kept::Copy(Box::new(Retained::of(&request, policy))),
        };
        let key = request.headers().get(key_header).cloned();
        if let Some(budget) = budget {
            let spent = settings.clock.now().saturating_duration_since(started);
            let left = budget.saturating_sub(spent);
            if left == Duration::ZERO {
                return Err(SendError::Failed {
                    kind: FailureKind::Timeout,
                    source: Box::new(HopsTimedOut),
                });
            }
            *request.timeout_mut() = Some(left);
        }
        let response = match client.http.execute(request).await {
            Ok(response) => response,
            Err(err) => {
                let mut failed = reqwest_send_error(err);
                if let SendError::Failed { kind, .. } = &mut failed
                    && !chain.hops.is_empty()
                    && kind.never_sent()
                {
                    // The request reached the server that redirected it, so this is no
                    // proof that the operation never ran.
                    *kind = FailureKind::RedirectTargetUnreachable;
                }
                return Err(failed);
            }
        };
        chain.inner_client_redirected |=
            warn_if_inner_redirected(kept.url(), response.url(), key.as_ref());
        let step = if rewrite(response.status(), &Method::GET).is_none() {
            // Not a redirect: the common case, decided without building anything.
            Step::Final(None)
        } else {
            let first = chain
                .hops
                .first()
                .map_or_else(|| kept.url().clone(), |hop| hop.from.clone());
            let copy = kept.into_retained(policy, settings.attempt_header.as_ref());
            next_step(
                policy,
                &first,
                key_header,
                chain.hops.len(),
                &response,
                copy,
            )
        };
        match step {
            Step::Final(stopped) => {
                chain.stopped = stopped;
                if let Some(stop) = stopped {
                    tracing::debug!(
                        key = key_text(key.as_ref()),
                        status = response.status().as_u16(),
                        why = %stop,
                        "redirect not followed"
                    );
                }
                let mut response = response;
                // Only a chain with something in it costs an entry: `of` reads the rest as empty.
                if !chain.is_empty() {
                    response.extensions_mut().insert(chain);
                }
                return Ok(response);
            }
            Step::TooMany(limit) => {
                return Err(SendError::Failed {
                    kind: FailureKind::TooManyRedirects,
                    source: Box::new(TooManyRedirects { limit }),
                });
            }
            Step::Follow(follow) => {
                let (next, hop) = *follow;
                tracing::debug!(
                    key = key_text(key.as_ref()),
                    status = hop.status.as_u16(),
                    from = %hop.from.origin().ascii_serialization(),
                    to = %hop.to.origin().ascii_serialization(),
                    method = %hop.method,
                    key_sent = hop.key_sent,
                    "following a redirect"
                );
                chain.hops.push(hop);
                // Release the redirect's connection before the next hop.
                drop(response);
                request = next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).expect("valid test url")
    }

    fn location(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            LOCATION,
            HeaderValue::from_str(value).expect("valid test header"),
        );
        headers
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        assert!(same_origin(
            &url("http://a.test/x"),
            &url("http://a.test:80/y?q")
        ));
        assert!(same_origin(
            &url("https://A.test/"),
            &url("https://a.test:443/")
        ));
        assert!(!same_origin(
            &url("http://a.test/"),
            &url("https://a.test/")
        ));
        assert!(!same_origin(
            &url("http://a.test/"),
            &url("http://a.test:8080/")
        ));
        assert!(!same_origin(&url("http://a.test/"), &url("http://b.test/")));
        assert!(!same_origin(
            &url("http://localhost:5000/"),
            &url("http://127.0.0.1:5000/")
        ));
        // Opaque origins are never the same, not even as themselves.
        assert!(!same_origin(
            &url("data:text/plain,x"),
            &url("data:text/plain,x")
        ));
    }

    #[test]
    fn a_target_is_the_same_whatever_its_fragment_and_user_info() {
        let sent = url("http://u:p@a.test/x?q=1#frag");
        assert!(same_target(&sent, &url("http://a.test:80/x?q=1")));
        assert!(!same_target(&sent, &url("http://a.test/x?q=2")));
        assert!(!same_target(&sent, &url("http://a.test/y?q=1")));
        assert!(!same_target(&sent, &url("https://a.test/x?q=1")));
        assert!(!same_target(&sent, &url("http://b.test/x?q=1")));
    }

    #[test]
    fn location_resolves_against_the_url_that_answered() {
        let base = url("http://a.test:8080/v1/charges?x=1");
        let cases = [
            ("/v2/charges", "http://a.test:8080/v2/charges"),
            ("next", "http://a.test:8080/v1/next"),
            ("../up", "http://a.test:8080/up"),
            ("?page=2", "http://a.test:8080/v1/charges?page=2"),
            ("//b.test/x", "http://b.test/x"),
            ("https://c.test/y", "https://c.test/y"),
            ("  /trimmed  ", "http://a.test:8080/trimmed"),
        ];
        for (value, expected) in cases {
            assert_eq!(
                resolve_location(&base, &location(value)),
                Ok(url(expected)),
                "{value}"
            );
        }
    }

    #[test]
    fn bad_locations_are_not_followed() {
        let base = url("http://a.test/");
        assert_eq!(
            resolve_location(&base, &HeaderMap::new()),
            Err(RedirectStop::MissingLocation)
        );
        assert_eq!(
            resolve_location(&base, &location("http://[::1")),
            Err(RedirectStop::InvalidLocation)
        );
        for value in [
            "ftp://a.test/x",
            "file:///etc/passwd",
            "javascript:alert(1)",
            "data:,x",
        ] {
            assert_eq!(
                resolve_location(&base, &location(value)),
                Err(RedirectStop::UnsupportedScheme),
                "{value}"
            );
        }
        for value in ["http://user:pw@a.test/x", "//user@b.test/"] {
            assert_eq!(
                resolve_location(&base, &location(value)),
                Err(RedirectStop::InvalidLocation),
                "{value}"
            );
        }
        let mut two = location("/a");
        two.append(LOCATION, HeaderValue::from_static("/b"));
        assert_eq!(
            resolve_location(&base, &two),
            Err(RedirectStop::InvalidLocation)
        );
        let mut opaque = HeaderMap::new();
        opaque.insert(
            LOCATION,
            HeaderValue::from_bytes(b"/caf\xe9").expect("obs-text is a valid header value"),
        );
        assert_eq!(
            resolve_location(&base, &opaque),
            Err(RedirectStop::InvalidLocation)
        );
    }

    #[test]
    fn methods_are_rewritten_as_browsers_do_and_only_resends_keep_the_key() {
        let read = |method: Method| {
            Some(Rewrite {
                method,
                resend: false,
            })
        };
        let resend = |method: Method| {
            Some(Rewrite {
                method,
                resend: true,
            })
        };
        for status in [StatusCode::MOVED_PERMANENTLY, StatusCode::FOUND] {
            assert_eq!(rewrite(status, &Method::POST), read(Method::GET));
            assert_eq!(rewrite(status, &Method::PUT), resend(Method::PUT));
            assert_eq!(rewrite(status, &Method::GET), resend(Method::GET));
        }
        assert_eq!(
            rewrite(StatusCode::SEE_OTHER, &Method::POST),
            read(Method::GET)
        );
        assert_eq!(
            rewrite(StatusCode::SEE_OTHER, &Method::DELETE),
            read(Method::GET)
        );
        assert_eq!(
            rewrite(StatusCode::SEE_OTHER, &Method::HEAD),
            read(Method::HEAD)
        );
        for status in [
            StatusCode::TEMPORARY_REDIRECT,
            StatusCode::PERMANENT_REDIRECT,
        ] {
            assert_eq!(rewrite(status, &Method::POST), resend(Method::POST));
            assert_eq!(rewrite(status, &Method::PATCH), resend(Method::PATCH));
        }
        for status in [300, 304, 305, 306, 200, 404, 503] {
            let status = StatusCode::from_u16(status).expect("valid status");
            assert_eq!(rewrite(status, &Method::POST), None, "{status}");
        }
    }

    #[test]
    fn the_key_goes_to_the_original_origin_and_to_allowed_ones_only() {
        let original = url("https://api.test/v1/x");
        let policy = RedirectPolicy::default();
        assert!(policy.allows_key_to(&original, &url("https://api.test/v2/y")));
        assert!(!policy.allows_key_to(&original, &url("https://eu.api.test/v1/x")));
        assert!(!policy.allows_key_to(&original, &url("http://api.test/v1/x")));

        let policy = RedirectPolicy::default()
            .allow_key_to("https://eu.api.test")
            .allow_key_to("http://127.0.0.1:8080/");
        assert!(policy.validate().is_ok());
        assert!(policy.allows_key_to(&original, &url("https://eu.api.test/v1/x")));
        assert!(policy.allows_key_to(&original, &url("https://EU.api.test:443/z")));
        assert!(policy.allows_key_to(&original, &url("http://127.0.0.1:8080/z")));
        assert!(!policy.allows_key_to(&original, &url("http://127.0.0.1:8081/z")));
        assert!(!policy.allows_key_to(&original, &url("http://eu.api.test/v1/x")));

        let any = RedirectPolicy::none().allow_key_to_any_origin();
        assert!(any.allows_key_to(&original, &url("http://elsewhere.test/")));
    }

    #[test]
    fn an_origin_that_is_not_one_fails_the_build() {
        for bad in [
            "api.test",
            "https://api.test/v1",
            "https://api.test/?q",
            "https://user@api.test",
            "ftp://api.test",
            "",
            "https://",
        ] {
            let err = RedirectPolicy::default()
                .allow_key_to("https://ok.test")
                .allow_key_to(bad)
                .validate()
                .expect_err(bad);
            assert_eq!(err.kind(), crate::ErrorKind::Builder, "{bad}");
            assert!(err.to_string().contains("redirect policy"), "{err}");
        }
    }

    #[test]
    fn allowed_origins_are_normalized_before_they_are_compared() {
        let original = url("https://api.test/v1/x");
        let policy = RedirectPolicy::default()
            .allow_key_to("HTTPS://EU.Api.Test:443")
            .allow_key_to("http://[::1]:8080/")
            .allow_key_to("http://127.0.0.1:80");
        assert!(policy.validate().is_ok());
        assert!(policy.allows_key_to(&original, &url("https://eu.api.test/v1/x")));
        assert!(policy.allows_key_to(&original, &url("http://[0:0::1]:8080/y")));
        assert!(policy.allows_key_to(&original, &url("http://127.0.0.1/z")));
        assert!(!policy.allows_key_to(&original, &url("http://[::1]/y")));
        assert!(!policy.allows_key_to(&original, &url("https://127.0.0.1/z")));
        // An opaque origin is never the original's, so it matches nothing.
        assert!(!policy.allows_key_to(&url("data:,x"), &url("data:,x")));
    }

    #[test]
    fn the_build_error_names_the_first_origin_that_is_not_one() {
        let err = RedirectPolicy::default()
            .allow_key_to("https://ok.test/")
            .allow_key_to("https://api.test/v1")
            .allow_key_to("ftp://later.test")
            .validate()
            .expect_err("not an origin");
        let text = err.to_string();
        assert!(text.contains("https://api.test/v1"), "{text}");
        assert!(!text.contains("ok.test"), "{text}");
        assert!(!text.contains("later.test"), "{text}");
    }

    #[test]
    fn every_reason_to_stop_reads_differently() {
        let stops = [
            RedirectStop::Disabled,
            RedirectStop::MissingLocation,
            RedirectStop::InvalidLocation,
            RedirectStop::UnsupportedScheme,
            RedirectStop::KeyToOtherOrigin,
            RedirectStop::BodyNotReplayable,
        ];
        let texts: std::collections::HashSet<String> =
            stops.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), stops.len(), "{texts:?}");
        assert!(texts.iter().all(|text| !text.is_empty()), "{texts:?}");
        assert_eq!(
            RedirectStop::KeyToOtherOrigin.to_string(),
            "the key may not go to the location's origin"
        );
    }

    #[test]
    fn defaults_follow_ten_hops_and_none_follows_nothing() {
        assert_eq!(RedirectPolicy::new().max_hops(), Some(10));
        assert_eq!(RedirectPolicy::limited(3).max_hops(), Some(3));
        assert_eq!(RedirectPolicy::none().max_hops(), None);
    }
}
