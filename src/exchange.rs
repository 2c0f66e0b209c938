//! The request and response types the engine works with, and the reqwest transport.
//!
//! `reqwest::Request` enforces the attempt timeout itself (from connecting until the body has
//! been read); `http::Request` has no such setting, so the engine bounds those attempts up to
//! the response head.

use std::time::Duration;

use http::header::HeaderMap;
use http::{Method, StatusCode};

use crate::classify::classify_reqwest_error;
use crate::engine::{RetryRequest, RetryResponse, SendError, Transport};
use crate::error::Error;

impl RetryRequest for reqwest::Request {
    fn method(&self) -> &Method {
        reqwest::Request::method(self)
    }

    fn host(&self) -> Option<&str> {
        self.url().host_str()
    }

    fn headers_mut(&mut self) -> &mut HeaderMap {
        reqwest::Request::headers_mut(self)
    }

    fn try_clone(&self) -> Option<Self> {
        reqwest::Request::try_clone(self)
    }

    fn set_timeout(&mut self, timeout: Duration) -> bool {
        *self.timeout_mut() = Some(timeout);
        true
    }
}

impl RetryResponse for reqwest::Response {
    fn status(&self) -> StatusCode {
        reqwest::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        reqwest::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        reqwest::Response::extensions_mut(self)
    }
}

/// Turns a reqwest error into the engine's view of a failed attempt.
pub(crate) fn reqwest_send_error(err: reqwest::Error) -> SendError {
    if err.is_builder() {
        // reqwest refused the request before sending anything (an unsupported scheme, say): a
        // configuration error, not an attempt.
        SendError::Refused(Error::builder_from(err))
    } else {
        SendError::Failed {
            kind: classify_reqwest_error(&err),
            source: Box::new(err),
        }
    }
}

/// Sends each attempt with `reqwest::Client::execute`.
pub(crate) struct ReqwestTransport<'a>(pub(crate) &'a reqwest::Client);

impl Transport<reqwest::Request> for ReqwestTransport<'_> {
    type Response = reqwest::Response;

    async fn send(&mut self, request: reqwest::Request) -> Result<reqwest::Response, SendError> {
        self.0.execute(request).await.map_err(reqwest_send_error)
    }
}
