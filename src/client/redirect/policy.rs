//! [`RedirectPolicy`] and the rules it applies: origins, `Location` resolution, the method
//! rewrite, and why a redirect is left unfollowed ([`RedirectStop`]). Pure functions.

use std::fmt;

#[cfg(test)]
use http::header::HeaderValue;
use http::header::{HeaderMap, LOCATION};
use http::{Method, StatusCode};
use reqwest::Url;

use crate::outcome::error::Error;

/// The default number of redirects followed in one attempt (reqwest's default too).
const DEFAULT_MAX_HOPS: u32 = 10;

/// Which redirects the [`Client`](crate::Client) follows, and where the idempotency key may go.
///
/// Set it with [`ClientBuilder::redirects`](crate::ClientBuilder::redirects). The crate follows
/// 301, 302, 303, 307 and 308 itself, inside one attempt. A hop that resends the operation
/// (307, 308; 301 and 302 on any method but `POST`) carries the key to the original origin and to the
/// origins allowed here, and is otherwise left unfollowed: the 3xx is the final response
/// ([`RedirectChain::stopped`](crate::redirect::RedirectChain::stopped) says why). A hop that
/// turns into a `GET` (303; 301 and 302 on a `POST`) drops the body and the key and may go
/// anywhere. Credentials never cross origins. Only the final hop is classified.
///
/// # Errors
///
/// One hop beyond the limit ends the operation with
/// [`ErrorKind::TooManyRedirects`](crate::ErrorKind::TooManyRedirects), outcome unknown, not
/// retried; an unreachable target is
/// [`FailureKind::RedirectTargetUnreachable`](crate::FailureKind::RedirectTargetUnreachable).
///
/// A `reqwest::Client` passed with [`ClientBuilder::http`](crate::ClientBuilder::http) keeps
/// its own redirect setting: build it with `.redirect(reqwest::redirect::Policy::none())`
/// (else [`RedirectChain::inner_client_redirected`](crate::redirect::RedirectChain::inner_client_redirected)).
/// Every rule, origins, and what the ledger saves: `docs/redirects.md`.
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
    pub(super) max_hops: Option<u32>,
    /// Origins (ASCII serialization, `scheme://host[:port]`) the key may go to besides the
    /// original request's.
    pub(super) key_origins: Vec<String>,
    /// The key may go to any origin.
    pub(super) key_to_any_origin: bool,
    /// The first origin given that is not one, reported by `ClientBuilder::build`.
    pub(super) invalid_origin: Option<String>,
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

    /// This policy with room for `answered` more hops: those a request was answered with
    /// before its operation (`answered.rs`), followed even when this policy follows none.
    pub(super) fn with_answered(&self, answered: usize) -> RedirectPolicy {
        let answered = u32::try_from(answered).unwrap_or(u32::MAX);
        RedirectPolicy {
            max_hops: Some(self.max_hops.unwrap_or(0).saturating_add(answered)),
            ..self.clone()
        }
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
pub(super) fn same_target(a: &Url, b: &Url) -> bool {
    // Equal serializations (the common case: the response's URL is the request's) first.
    a == b
        || (a.scheme() == b.scheme()
            && a.host_str() == b.host_str()
            && a.port_or_known_default() == b.port_or_known_default()
            && a.path() == b.path()
            && a.query() == b.query())
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
