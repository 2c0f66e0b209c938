//! The future returned by [`IdempotentRetry`](crate::IdempotentRetry).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::outcome::error::Error;

/// The response future of [`IdempotentRetry`](crate::IdempotentRetry): the whole operation,
/// every attempt and wait included.
///
/// It is boxed: the loop's state (the request kept for cloning, the service, the report)
/// lives across awaits, and boxing keeps this type nameable without exposing it.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<R> {
    inner: Pin<Box<dyn Future<Output = Result<R, Error>> + Send + 'static>>,
}

impl<R> ResponseFuture<R> {
    pub(crate) fn new(future: impl Future<Output = Result<R, Error>> + Send + 'static) -> Self {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<R> Future for ResponseFuture<R> {
    type Output = Result<R, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R> fmt::Debug for ResponseFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
