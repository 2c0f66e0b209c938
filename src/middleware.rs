//! The `reqwest-middleware` front end: a `Middleware` that runs the rest of the chain once per
//! attempt.

use std::fmt;
use std::sync::Arc;

use http::Extensions;
use reqwest_middleware::Next;

use crate::client::{Client, ClientBuilder, warn_if_inner_redirected};
use crate::engine;
use crate::engine::settings::{Overrides, Settings};
use crate::engine::transport::{SendError, Transport, reqwest_send_error, send_error};
use crate::outcome::error::Error;

/// A `reqwest-middleware` [`Middleware`](reqwest_middleware::Middleware) that sends each request
/// as one logical operation: one key, settled before the first attempt; the middleware below
/// it and the client run once per attempt.
///
/// Add it outside `reqwest-tracing`'s `TracingMiddleware` and inside middleware that must run
/// once per logical request; never with `reqwest-retry`. It follows no redirect: build the
/// `reqwest::Client` under it with `redirect::Policy::none()`. Why: `docs/middleware.md`.
///
/// **Per request**: `.with_extension(key)` (an [`IdempotencyKey`](crate::IdempotencyKey)),
/// `.with_extension(policy)` (a [`RetryPolicy`](crate::RetryPolicy)) or
/// `.with_extension(WithoutIdempotencyKey)` (no automatic key, as
/// [`without_idempotency_key`](crate::RequestBuilder::without_idempotency_key) on the client;
/// see [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey)) on the `ClientWithMiddleware`'s
/// request builder, or the key header.
///
/// **Ledger**: built from a [`ClientBuilder`] with a [`Ledger`](crate::ledger::Ledger) (or taken from
/// such a [`Client`] with [`Client::middleware`]), it claims, records and finishes each keyed
/// request as the client does, and answers a completed one from the ledger without running
/// the chain; `.with_extension(LedgerScope::new(..))` ([`LedgerScope`](crate::LedgerScope))
/// names the scope.
///
/// **Errors** come back as `reqwest_middleware::Error::Middleware` wrapping this crate's
/// [`Error`]; get it back with [`Error::from_middleware`] or [`Error::from_middleware_mut`].
///
/// # Examples
///
/// ```
/// use idempotent_retry::IdempotentRetryMiddleware;
///
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(IdempotentRetryMiddleware::new())
///     .build();
/// ```
#[derive(Clone)]
pub struct IdempotentRetryMiddleware {
    settings: Arc<Settings>,
}

impl fmt::Debug for IdempotentRetryMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.debug_as("IdempotentRetryMiddleware", f)
    }
}

impl Default for IdempotentRetryMiddleware {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotentRetryMiddleware {
    /// A middleware with every default (see [`ClientBuilder`]'s `# Default` table).
    #[must_use]
    pub fn new() -> Self {
        IdempotentRetryMiddleware {
            settings: Arc::new(ClientBuilder::new().settings_unchecked()),
        }
    }
}

impl ClientBuilder {
    /// Builds a `reqwest-middleware` middleware with these settings instead of a client. The
    /// [`http`](Self::http) client, if any, is not used.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when a policy is invalid or the
    /// attempt header is the key header.
    pub fn build_middleware(self) -> Result<IdempotentRetryMiddleware, Error> {
        Ok(IdempotentRetryMiddleware {
            settings: Arc::new(self.into_settings()?),
        })
    }
}

impl Client {
    /// A `reqwest-middleware` middleware sharing this client's settings (policies, key header,
    /// observer, clock, sleeper, RNG, retry budget and [`Ledger`](crate::ledger::Ledger)).
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::Client;
    /// use idempotent_retry::ledger::MemoryLedger;
    ///
    /// let client = Client::builder().ledger(MemoryLedger::new()).build()?;
    /// let _with_retries = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
    ///     .with(client.middleware())
    ///     .build();
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    #[must_use]
    pub fn middleware(&self) -> IdempotentRetryMiddleware {
        IdempotentRetryMiddleware {
            settings: self.front_end_settings(),
        }
    }
}

impl Error {
    /// This crate's error inside a `reqwest-middleware` error, when the middleware returned it.
    #[must_use]
    pub fn from_middleware(err: &reqwest_middleware::Error) -> Option<&Error> {
        match err {
            reqwest_middleware::Error::Middleware(inner) => inner.downcast_ref::<Error>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }

    /// As [`from_middleware`](Self::from_middleware), mutably (to
    /// [`take_response`](Self::take_response)).
    #[must_use]
    pub fn from_middleware_mut(err: &mut reqwest_middleware::Error) -> Option<&mut Error> {
        match err {
            reqwest_middleware::Error::Middleware(inner) => inner.downcast_mut::<Error>(),
            reqwest_middleware::Error::Reqwest(_) => None,
        }
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for IdempotentRetryMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let overrides = Overrides::from_extensions(extensions);
        let transport = NextTransport {
            next,
            extensions,
            key_header: &self.settings.key_header,
        };
        engine::execute(&self.settings, request, overrides, transport)
            .await
            .map_err(reqwest_middleware::Error::middleware)
    }
}

/// Sends each attempt down the rest of the middleware chain.
struct NextTransport<'a, 'e> {
    next: Next<'a>,
    extensions: &'e mut Extensions,
    key_header: &'e http::HeaderName,
}

impl Transport<reqwest::Request> for NextTransport<'_, '_> {
    type Response = reqwest::Response;

    // `reqwest-tracing` below this middleware opens each attempt's client span and writes its
    // trace context.
    const WIRE_SPANS: bool = false;

    async fn send(&mut self, request: reqwest::Request) -> Result<reqwest::Response, SendError> {
        // The middleware follows no redirect; the client under it may (reqwest's default), with
        // the key on every hop: make that visible.
        let sent = request.url().clone();
        let key = request.headers().get(self.key_header).cloned();
        match self.next.clone().run(request, self.extensions).await {
            Ok(response) => {
                warn_if_inner_redirected(&sent, response.url(), || key);
                Ok(response)
            }
            Err(reqwest_middleware::Error::Reqwest(err)) => Err(reqwest_send_error(err)),
            Err(reqwest_middleware::Error::Middleware(err)) => Err(send_error(err.into())),
        }
    }
}
