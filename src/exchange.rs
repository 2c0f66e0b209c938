//! The request and response types the engine works with, and the reqwest transport.
//!
//! `reqwest::Request` enforces the attempt timeout itself (from connecting until the body has
//! been read); `http::Request` has no such setting, so the engine bounds those attempts up to
//! the response head.

use std::time::Duration;

use http::header::HeaderMap;
use http::{Method, StatusCode};

use crate::classify::classify_reqwest_error;
#[cfg(any(feature = "tower", feature = "middleware"))]
use crate::classify::{FailureKind, classify_source_chain};
use crate::client::ClientRef;
#[cfg(any(feature = "tower", feature = "middleware"))]
use crate::engine::BoxError;
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

/// Sends each attempt with the client's `reqwest::Client`, following redirects by the client's
/// [`RedirectPolicy`](crate::RedirectPolicy) (`redirect.rs`).
pub(crate) struct ReqwestTransport<'a>(pub(crate) &'a ClientRef);

impl Transport<reqwest::Request> for ReqwestTransport<'_> {
    type Response = reqwest::Response;

    async fn send(&mut self, request: reqwest::Request) -> Result<reqwest::Response, SendError> {
        crate::redirect::follow(self.0, request, None).await
    }

    async fn send_attempt(
        &mut self,
        request: reqwest::Request,
        original: Option<&reqwest::Request>,
    ) -> Result<reqwest::Response, SendError> {
        crate::redirect::follow(self.0, request, original).await
    }
}

impl<B: Clone + Send + 'static> RetryRequest for http::Request<B> {
    fn method(&self) -> &Method {
        http::Request::method(self)
    }

    fn host(&self) -> Option<&str> {
        self.uri().host()
    }

    fn headers_mut(&mut self) -> &mut HeaderMap {
        http::Request::headers_mut(self)
    }

    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn set_timeout(&mut self, _timeout: Duration) -> bool {
        false
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(http::Request::extensions(self))
    }
}

impl<B: Send + 'static> RetryResponse for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        http::Response::extensions_mut(self)
    }
}

/// Classifies an error from another layer (a tower service, a middleware below ours).
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) fn send_error(err: BoxError) -> SendError {
    if let Some(reqwest) = err.downcast_ref::<reqwest::Error>()
        && reqwest.is_builder()
    {
        return SendError::Refused(Error::builder_from_boxed(err));
    }
    SendError::Failed {
        kind: classify_boxed(&*err),
        source: err,
    }
}

/// Classifies an error of unknown type: a reqwest error anywhere in the chain is classified as
/// the client classifies it; a timeout layer's `Elapsed` is a timeout; hyper-util's connect
/// errors never left; otherwise the chain's `io` and hyper errors decide, and anything
/// unrecognised is fatal (not retried: the safe reading of an unknown failure).
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) fn classify_boxed(err: &(dyn std::error::Error + 'static)) -> FailureKind {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(reqwest) = e.downcast_ref::<reqwest::Error>() {
            return classify_reqwest_error(reqwest);
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return FailureKind::Timeout;
        }
        #[cfg(feature = "tower")]
        if e.is::<tower::timeout::error::Elapsed>() {
            return FailureKind::Timeout;
        }
        #[cfg(feature = "tower")]
        if let Some(legacy) = e.downcast_ref::<hyper_util::client::legacy::Error>()
            && legacy.is_connect()
        {
            return FailureKind::Connect;
        }
        current = e.source();
    }
    classify_source_chain(err).unwrap_or(FailureKind::Fatal)
}
