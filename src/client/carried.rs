//! What a built `reqwest::Request` carries of its [`RequestBuilder`](crate::RequestBuilder)'s
//! options, so that `client.execute(builder.build()?)` runs exactly as `builder.send()`: the
//! key, the policy, the ledger scope and the no-key mark in its extensions (the forms the tower
//! and middleware front ends read, `engine/extension.rs`), the per-attempt timeout as the request's own
//! `timeout()`.
//!
//! `reqwest::Request` keeps its extensions to itself: they are reached through a round trip to
//! `http::Request` and back, which keeps the method, headers, version and extensions. The URL
//! and the body are set aside and put back as they were, since the round trip would turn the
//! URL into an `http::Uri` and back, and a missing body into an empty one.

use http::Extensions;

use crate::engine::settings::Overrides;
use crate::outcome::error::Error;

/// Writes `overrides` into `request`, for [`carried`] to read back.
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when the URL cannot be an `http::Uri`
/// (reqwest could not send it either).
pub(super) fn carry(
    mut request: reqwest::Request,
    overrides: Overrides,
) -> Result<reqwest::Request, Error> {
    if let Some(timeout) = overrides.timeout {
        *request.timeout_mut() = Some(timeout);
    }
    let Overrides {
        key,
        auto_key,
        policy,
        timeout: _,
        scope,
        held: _,
    } = overrides;
    if key.is_none() && auto_key != Some(false) && policy.is_none() && scope.is_none() {
        // Nothing for the extensions: no round trip.
        return Ok(request);
    }
    let rest = Overrides {
        key,
        auto_key,
        policy,
        timeout: None,
        scope,
        held: None,
    };
    let (request, ()) = with_extensions(request, |extensions| rest.into_extensions(extensions))?;
    Ok(request)
}

/// The options `request` carries: those [`carry`] wrote, the extensions a caller put on an
/// `http::Request` before turning it into a `reqwest::Request`, and its own timeout as the
/// per-attempt timeout.
///
/// # Errors
///
/// As [`carry`].
pub(super) fn carried(request: reqwest::Request) -> Result<(reqwest::Request, Overrides), Error> {
    let timeout = request.timeout().copied();
    let (request, from_extensions) =
        with_extensions(request, |extensions| Overrides::from_extensions(extensions))?;
    Ok((
        request,
        Overrides {
            timeout,
            ..from_extensions
        },
    ))
}

/// Runs `f` on `request`'s extensions.
fn with_extensions<R>(
    mut request: reqwest::Request,
    f: impl FnOnce(&mut Extensions) -> R,
) -> Result<(reqwest::Request, R), Error> {
    let url = request.url().clone();
    let body = request.body_mut().take();
    let mut http =
        http::Request::<reqwest::Body>::try_from(request).map_err(Error::builder_from)?;
    let out = f(http.extensions_mut());
    let mut request = reqwest::Request::try_from(http).map_err(Error::builder_from)?;
    *request.url_mut() = url;
    *request.body_mut() = body;
    Ok((request, out))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{Method, Version};

    use super::*;
    use crate::decision::policy::RetryPolicy;
    use crate::keys::key::IdempotencyKey;

    fn request() -> reqwest::Request {
        let mut request = reqwest::Request::new(
            Method::POST,
            "http://user@127.0.0.1:9/a%20b?q=1&r=%7B#frag"
                .parse()
                .expect("a url"),
        );
        *request.version_mut() = Version::HTTP_10;
        request
            .headers_mut()
            .insert("x-one", http::HeaderValue::from_static("1"));
        *request.body_mut() = Some(reqwest::Body::from("payload"));
        request
    }

    #[test]
    fn every_option_goes_into_the_request_and_comes_back() {
        let key = IdempotencyKey::new("k_carried").expect("valid");
        let policy = RetryPolicy::default().with_max_attempts(2);
        let overrides = Overrides {
            key: Some(key.clone()),
            auto_key: Some(false),
            policy: Some(policy),
            timeout: Some(Duration::from_millis(750)),
            scope: Some("stripe.charge".into()),
            held: None,
        };
        let built = carry(request(), overrides).expect("carried");
        assert_eq!(built.timeout(), Some(&Duration::from_millis(750)));
        let (back, read) = carried(built).expect("read back");
        assert_eq!(read.key, Some(key));
        assert_eq!(read.auto_key, Some(false));
        assert_eq!(read.policy, Some(policy));
        assert_eq!(read.timeout, Some(Duration::from_millis(750)));
        assert_eq!(read.scope.as_deref(), Some("stripe.charge"));
        // The request itself is unchanged by the round trips.
        let original = request();
        assert_eq!(back.url(), original.url());
        assert_eq!(back.method(), original.method());
        assert_eq!(back.version(), Version::HTTP_10);
        assert_eq!(back.headers(), original.headers());
        assert_eq!(
            back.body().and_then(reqwest::Body::as_bytes),
            Some(&b"payload"[..])
        );
    }

    #[test]
    fn a_request_without_options_reads_back_none_and_keeps_no_body() {
        let bare = reqwest::Request::new(Method::GET, "http://127.0.0.1:9/".parse().expect("url"));
        let built = carry(bare, Overrides::default()).expect("nothing to carry");
        let (back, read) = carried(built).expect("read back");
        assert!(read.key.is_none() && read.auto_key.is_none() && read.policy.is_none());
        assert!(read.timeout.is_none() && read.scope.is_none());
        assert!(back.body().is_none(), "no body stays no body");
    }
}
