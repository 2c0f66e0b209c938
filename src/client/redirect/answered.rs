//! Redirects a request was answered with before its operation started, and that the caller
//! followed itself: an HTTP library above the client that follows redirects on its own (httpx's
//! `follow_redirects`, `fetch`'s `redirect: 'follow'`) re-issues the hop, and the operation is
//! continued from there. Every attempt replays them through the same rules as a live redirect
//! (`policy.rs`) without sending the requests they answered, then sends the last hop.

use http::header::{HeaderValue, LOCATION};
use http::{Method, StatusCode};
use reqwest::{ResponseBuilderExt as _, Url};

use super::policy::rewrite;
use crate::outcome::error::Error;

/// One redirect the request was answered with: its status and the URL its `Location` named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AnsweredRedirect {
    pub(crate) status: StatusCode,
    pub(crate) location: Url,
}

impl AnsweredRedirect {
    /// A redirect this crate follows (301, 302, 303, 307, 308) to an `http` or `https` URL.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) for any other status or scheme.
    pub(crate) fn new(status: StatusCode, location: Url) -> Result<AnsweredRedirect, Error> {
        if rewrite(status, &Method::GET).is_none() {
            return Err(Error::builder(format!(
                "after_redirect: {status} is not a redirect this client follows; pass 301, 302, \
                 303, 307 or 308"
            )));
        }
        if !matches!(location.scheme(), "http" | "https") || !location.has_host() {
            return Err(Error::builder(format!(
                "after_redirect: the location {location} is not an http or https URL; pass the \
                 absolute URL the redirect's Location header names"
            )));
        }
        Ok(AnsweredRedirect { status, location })
    }

    /// The redirect as the response `from` answered with, for the follow loop to decide on as
    /// it decides on a live one. Its body is empty: nothing was received now.
    pub(super) fn response(&self, from: &Url) -> reqwest::Response {
        let location = HeaderValue::from_str(self.location.as_str())
            .expect("a parsed URL serializes to visible ASCII");
        let response = http::Response::builder()
            .status(self.status)
            .header(LOCATION, location)
            .url(from.clone())
            .body(Vec::new())
            .expect("a status, a header and a URL that are valid by construction");
        reqwest::Response::from(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_followed_statuses_and_web_urls_are_answered_redirects() {
        let to = Url::parse("https://a.test/x").expect("valid test url");
        for status in [301, 302, 303, 307, 308] {
            let status = StatusCode::from_u16(status).expect("valid status");
            assert!(
                AnsweredRedirect::new(status, to.clone()).is_ok(),
                "{status}"
            );
        }
        for status in [200, 300, 304, 404] {
            let status = StatusCode::from_u16(status).expect("valid status");
            let err = AnsweredRedirect::new(status, to.clone()).expect_err("not a redirect");
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains("pass 301"), "{err}");
        }
        let ftp = Url::parse("ftp://a.test/x").expect("valid test url");
        let err = AnsweredRedirect::new(StatusCode::FOUND, ftp).expect_err("not http");
        assert!(
            err.to_string().contains("not an http or https URL"),
            "{err}"
        );
    }

    #[test]
    fn the_answered_redirect_reads_as_the_response_it_was() {
        let from = Url::parse("http://a.test/charge").expect("valid test url");
        let answered = AnsweredRedirect {
            status: StatusCode::PERMANENT_REDIRECT,
            location: Url::parse("http://a.test/charge/").expect("valid test url"),
        };
        let response = answered.response(&from);
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.url(), &from);
        assert_eq!(
            super::super::policy::resolve_location(&from, response.headers()),
            Ok(answered.location)
        );
    }
}
