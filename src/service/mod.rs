//! The tower front end: a `Service` that runs each request as one logical operation.
//!
//! Tower's layout: the layer in `layer.rs`, the service here, its future in `future.rs`. The
//! service only sends attempts; keys, classification, backoff and windows are the engine's.
//! Beside them: `scope.rs`, the ledger scope of a request that carries no extensions, and
//! `boxed.rs`, the layer that boxes a response body a ledger could not rebuild.
//!
//! May import: time, keys, rules, message, outcome, decision, telemetry, ledger, engine, client.

mod boxed;
mod future;
mod layer;
mod scope;

use std::any::Any;
use std::fmt;
use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::client::warn_if_inner_redirected;
use crate::engine;
use crate::engine::settings::{Overrides, Settings};
use crate::engine::transport::{BoxError, SendError, Transport, send_error};
use crate::message::exchange::{RetryRequest, RetryResponse};
use crate::outcome::error::{Error, Target};
use scope::ScopeRules;

pub use boxed::{BoxResponseBody, BoxResponseBodyLayer};
pub use future::ResponseFuture;
pub use layer::IdempotentRetryLayer;

/// A tower `Service` that sends each request as one logical operation: one idempotency key,
/// settled before the first attempt, on every attempt; retries by the crate's rules.
///
/// It wraps any `Service<R>` whose request type implements [`RetryRequest`]
/// (`http::Request<B>` with a cloneable body, `reqwest::Request`) and whose response implements
/// [`RetryResponse`] (`http::Response<B>`, `reqwest::Response`); `reqwest::Client` is one.
/// The inner service must be `Clone`: the response future owns a clone and calls it once per
/// attempt, waiting for readiness before each.
///
/// **Per request**: put an [`IdempotencyKey`](crate::IdempotencyKey), a
/// [`RetryPolicy`](crate::RetryPolicy), [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey)
/// (no automatic key) or a [`LedgerScope`](crate::LedgerScope) in an `http::Request`'s
/// extensions, or set the key header yourself. (`reqwest::Request` has no public extensions:
/// use the key header, the [scope header](IdempotentRetryLayer::SCOPE_HEADER),
/// [per-host policies](crate::ClientBuilder::policy_for_host) and
/// [`auto_keys`](crate::ClientBuilder::auto_keys) on the layer's builder, and
/// [scopes by path prefix](IdempotentRetryLayer::scope_for_path_prefix) on the layer.)
///
/// **Errors**: the service's error is the crate's [`Error`], with the inner service's error as
/// its source; [`Error::take_response_as`] returns the last response in the inner service's
/// response type.
///
/// **Ledger**: with a [`Ledger`](crate::ledger::Ledger), the request's body must be one the
/// ledger can fingerprint and the response's one it can rebuild
/// ([`RetryRequest::fingerprint`], [`RetryResponse::from_saved`]; over hyper, use
/// [`IdempotentRetryLayer::box_response_body`]); otherwise the request is refused with
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder), nothing claimed or sent. A row's scope
/// is found as on [`IdempotentRetryLayer`].
///
/// Readiness, per-attempt timeouts and what dropping the [`ResponseFuture`] does:
/// `docs/tower.md`.
#[derive(Clone)]
pub struct IdempotentRetry<S> {
    inner: S,
    settings: Arc<Settings>,
    scopes: Arc<ScopeRules>,
}

impl<S: fmt::Debug> fmt::Debug for IdempotentRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentRetry")
            .field("inner", &self.inner)
            .field("settings", &self.settings)
            .field("scopes", &self.scopes)
            .finish()
    }
}

impl<S> IdempotentRetry<S> {
    /// Wraps `inner` with the default settings. Use [`IdempotentRetryLayer`] for others.
    pub fn new(inner: S) -> Self {
        tower::Layer::layer(&IdempotentRetryLayer::new(), inner)
    }

    pub(crate) fn from_parts(inner: S, settings: Arc<Settings>, scopes: Arc<ScopeRules>) -> Self {
        IdempotentRetry {
            inner,
            settings,
            scopes,
        }
    }

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

impl<S, R> tower::Service<R> for IdempotentRetry<S>
where
    R: RetryRequest,
    S: tower::Service<R> + Clone + Send + 'static,
    S::Response: RetryResponse,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = Error;
    type Future = ResponseFuture<S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|err| Error::not_ready(err.into()))
    }

    fn call(&mut self, mut request: R) -> Self::Future {
        // The ready service goes with the future (tower's contract: `call` follows a ready
        // `poll_ready`); a fresh clone stays behind for the next call.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        let settings = Arc::clone(&self.settings);
        // The scope header comes off here, before the engine clones the request for any
        // attempt; the scope goes in as this front end's override, as the `Client`'s
        // `ledger_scope` does.
        let scope = scope::settle_scope(&mut request, &self.scopes)
            .map_err(|err| err.for_request(Target::of(&request)));
        ResponseFuture::new(async move {
            let overrides = Overrides {
                scope: scope?,
                ..Overrides::default()
            };
            let transport = ServiceTransport {
                service,
                ready: true,
                key_header: settings.key_header.clone(),
            };
            engine::execute(&settings, request, overrides, transport).await
        })
    }
}

/// Sends each attempt through the inner service.
struct ServiceTransport<S> {
    service: S,
    /// Whether `poll_ready` has returned ready since the last call.
    ready: bool,
    /// The key header, for the warning about an inner client that redirects on its own.
    key_header: http::HeaderName,
}

impl<S, R> Transport<R> for ServiceTransport<S>
where
    R: RetryRequest,
    S: tower::Service<R> + Send,
    S::Response: RetryResponse,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = S::Response;

    async fn ready(&mut self) -> Result<(), BoxError> {
        if !self.ready {
            poll_fn(|cx| self.service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            self.ready = true;
        }
        Ok(())
    }

    async fn send(&mut self, request: R) -> Result<S::Response, SendError> {
        // The engine awaited `ready` just before; this only guards the contract.
        if !self.ready {
            poll_fn(|cx| self.service.poll_ready(cx))
                .await
                .map_err(|err| send_error(err.into()))?;
        }
        self.ready = false;
        // The layer follows no redirect, but a `reqwest::Client` under it may (reqwest's
        // default), with the key on every hop. Only reqwest's types know their URL, so they
        // are recognized by type rather than by widening the public request/response traits.
        let sent = (&request as &dyn Any)
            .downcast_ref::<reqwest::Request>()
            .map(|request| {
                let key = request.headers().get(&self.key_header).cloned();
                (request.url().clone(), key)
            });
        let response = self
            .service
            .call(request)
            .await
            .map_err(|err| send_error(err.into()))?;
        if let (Some((url, key)), Some(received)) = (
            sent,
            (&response as &dyn Any).downcast_ref::<reqwest::Response>(),
        ) {
            warn_if_inner_redirected(&url, received.url(), || key);
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_and_layer_are_clone_send_sync() {
        fn check<T: Clone + Send + Sync + fmt::Debug + 'static>() {}
        check::<IdempotentRetryLayer>();
        check::<IdempotentRetry<reqwest::Client>>();
    }
}
