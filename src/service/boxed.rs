//! A layer that boxes response bodies, for services whose own body a ledger cannot rebuild to
//! replay a saved response (hyper's `Incoming`): inside the retry layer, it turns
//! `http::Response<B>` into `http::Response<BoxBody<Bytes, BoxError>>`, one of the bodies the
//! ledger saves and rebuilds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::Body;

use crate::engine::transport::BoxError;

/// Wraps a service in [`BoxResponseBody`]: its responses' bodies boxed as
/// `BoxBody<Bytes, Box<dyn Error + Send + Sync>>`.
///
/// Put it inside [`IdempotentRetryLayer`](crate::IdempotentRetryLayer) over a service whose
/// response body a [`Ledger`](crate::ledger::Ledger) cannot rebuild, hyper's `Incoming` above all; the
/// simplest way is [`IdempotentRetryLayer::box_response_body`](crate::IdempotentRetryLayer::box_response_body),
/// which stacks the two in that order.
///
/// # Examples
///
/// ```
/// use idempotent_retry::Client;
/// use idempotent_retry::ledger::MemoryLedger;
/// use tower::ServiceBuilder;
///
/// let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
///     .build_http::<http_body_util::Full<bytes::Bytes>>();
/// let layer = Client::builder().ledger(MemoryLedger::new()).build_layer()?;
/// // The retry layer outside, this one inside it, over the hyper client.
/// let service = ServiceBuilder::new()
///     .layer(layer.box_response_body())
///     .service(hyper);
/// # drop(service);
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use]
pub struct BoxResponseBodyLayer {
    _priv: (),
}

impl BoxResponseBodyLayer {
    /// The layer; it has no settings.
    pub const fn new() -> Self {
        BoxResponseBodyLayer { _priv: () }
    }
}

impl<S> tower::Layer<S> for BoxResponseBodyLayer {
    type Service = BoxResponseBody<S>;

    fn layer(&self, inner: S) -> BoxResponseBody<S> {
        BoxResponseBody { inner }
    }
}

/// A service whose responses are the inner service's with the body boxed as
/// `BoxBody<Bytes, Box<dyn Error + Send + Sync>>` (the body's error converted with `Into`),
/// which a [`Ledger`](crate::ledger::Ledger) can save and rebuild. Built by [`BoxResponseBodyLayer`].
///
/// It takes any `http::Response<B>` whose body yields `Bytes` and is `Send + Sync + 'static`,
/// with an error that converts into `Box<dyn Error + Send + Sync>` (hyper's `Incoming`, any
/// `http_body` body). Its errors are the inner service's, untouched; its future is boxed.
#[derive(Clone)]
pub struct BoxResponseBody<S> {
    inner: S,
}

impl<S: fmt::Debug> fmt::Debug for BoxResponseBody<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoxResponseBody")
            .field("inner", &self.inner)
            .finish()
    }
}

impl<S> BoxResponseBody<S> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// The body boxed with the error type the ledger's boxed bodies have.
type Boxed = BoxBody<Bytes, BoxError>;

impl<S, R, B> tower::Service<R> for BoxResponseBody<S>
where
    S: tower::Service<R, Response = http::Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<Boxed>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| body.map_err(Into::into).boxed()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::exchange::RetryResponse;
    use tower::{Layer, Service};

    #[derive(Clone)]
    struct Answer;

    impl Service<()> for Answer {
        type Response = http::Response<http_body_util::Full<Bytes>>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            let mut response = http::Response::new(http_body_util::Full::new(Bytes::from("ok")));
            *response.status_mut() = http::StatusCode::CREATED;
            std::future::ready(Ok(response))
        }
    }

    #[tokio::test]
    async fn the_response_keeps_its_head_and_bytes_in_a_body_the_ledger_rebuilds() {
        let mut service = BoxResponseBodyLayer::new().layer(Answer);
        let response = service.call(()).await.expect("infallible");
        assert_eq!(response.status(), http::StatusCode::CREATED);
        let body = response.into_body().collect().await.expect("body");
        assert_eq!(body.to_bytes(), "ok");
        assert!(
            http::Response::<Boxed>::from_saved(http::Response::new(Bytes::new())).is_some(),
            "the boxed body is one a ledger rebuilds"
        );
    }
}
