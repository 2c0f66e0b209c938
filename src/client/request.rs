//! A request under construction; `send` hands it to the engine's pipeline (`engine/mod.rs`)
//! with the reqwest transport.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;

use super::shared::ClientRef;
use super::transport::ReqwestTransport;
use crate::engine;
use crate::error::Error;
use crate::key::IdempotencyKey;
use crate::policy::RetryPolicy;
use crate::settings::Overrides;

/// A request being built; [`send`](Self::send) runs it as one logical operation.
///
/// The methods mirror `reqwest::RequestBuilder`. Errors in arguments (a bad header, a value
/// that fails to serialize) are deferred to [`send`](Self::send).
#[must_use = "a RequestBuilder does nothing until you `send` it"]
pub struct RequestBuilder {
    client: Arc<ClientRef>,
    inner: reqwest::RequestBuilder,
    key: Option<IdempotencyKey>,
    auto_key: bool,
    policy: Option<RetryPolicy>,
    timeout: Option<Duration>,
    scope: Option<String>,
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("auto_key", &self.auto_key)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl RequestBuilder {
    pub(crate) fn new(client: Arc<ClientRef>, inner: reqwest::RequestBuilder) -> Self {
        let auto_key = client.settings.auto_keys;
        RequestBuilder {
            client,
            inner,
            key: None,
            auto_key,
            policy: None,
            timeout: None,
            scope: None,
        }
    }

    fn map(mut self, f: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder) -> Self {
        self.inner = f(self.inner);
        self
    }

    /// Adds a header. A header named like the client's key header is taken as the
    /// operation's key, verbatim (it must still be a valid key).
    pub fn header<K, V>(self, key: K, value: V) -> Self
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<http::Error>,
    {
        self.map(|b| b.header(key, value))
    }

    /// Adds several headers.
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.map(|b| b.headers(headers))
    }

    /// Appends query parameters to the URL.
    pub fn query<T: Serialize + ?Sized>(self, query: &T) -> Self {
        self.map(|b| b.query(query))
    }

    /// Sets a JSON body (replayable).
    pub fn json<T: Serialize + ?Sized>(self, json: &T) -> Self {
        self.map(|b| b.json(json))
    }

    /// Sets a URL-encoded form body (replayable).
    pub fn form<T: Serialize + ?Sized>(self, form: &T) -> Self {
        self.map(|b| b.form(form))
    }

    /// Sets the body. Bytes, strings and vectors can be sent again on every attempt; a
    /// streamed body (`reqwest::Body::wrap_stream`) cannot: it gets one attempt, and if that
    /// attempt fails transiently the error is
    /// [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable). To retry a large
    /// payload, buffer it into `bytes::Bytes` (cloning those is cheap).
    pub fn body<T: Into<reqwest::Body>>(self, body: T) -> Self {
        self.map(|b| b.body(body))
    }

    /// Sets a bearer token.
    pub fn bearer_auth<T: fmt::Display>(self, token: T) -> Self {
        self.map(|b| b.bearer_auth(token))
    }

    /// Sets HTTP basic authentication.
    pub fn basic_auth<U: fmt::Display, P: fmt::Display>(
        self,
        username: U,
        password: Option<P>,
    ) -> Self {
        self.map(|b| b.basic_auth(username, password))
    }

    /// The timeout for each attempt of this request, overriding the policy's
    /// [`attempt_timeout`](RetryPolicy::attempt_timeout). Like that setting it must be
    /// positive ([`send`](Self::send) refuses zero with
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder)); any longer value is accepted, and
    /// every attempt still ends with the policy's reconcile window.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The key for this operation, sent on every attempt. Derive it from stable inputs
    /// ([`IdempotencyKey::derive`], [`IdempotencyKey::for_tool_call`]) so that a retry after a
    /// crash or a redelivery reuses it.
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Sends this request without minting a random key. A key given with
    /// [`idempotency_key`](Self::idempotency_key) or as a header is still sent. A
    /// non-idempotent request without a key is retried only when no attempt can have reached
    /// the server.
    pub fn without_idempotency_key(mut self) -> Self {
        self.auto_key = false;
        self
    }

    /// The retry policy for this request only.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The operation's scope in the client's [`Ledger`](crate::Ledger) (`stripe.charge`,
    /// `agent.send_email`): what kind of operation the key names, and which retention
    /// applies ([`LedgerOptions::scope_retention`](crate::LedgerOptions::scope_retention)).
    ///
    /// Default: the URL's host.
    pub fn ledger_scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Sends the request as one logical operation: one key, as many attempts as the policy
    /// allows.
    ///
    /// The returned response carries a [`RetryReport`](crate::RetryReport) in its extensions. Every status that is
    /// not retried (2xx, most 4xx, 501, ...) is returned as `Ok`, as `reqwest` does.
    /// Redirects are followed by the client's [`RedirectPolicy`](crate::RedirectPolicy): the
    /// response is the last hop's (`response.url()`), and
    /// [`RedirectChain::of`](crate::RedirectChain::of) lists the hops.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::Builder`](crate::ErrorKind::Builder): invalid policy, URL or header, a zero
    ///   [`timeout`](Self::timeout), or two different keys.
    /// - [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey): a key header set by the caller is not a valid key.
    /// - [`ErrorKind::AttemptsExhausted`](crate::ErrorKind::AttemptsExhausted), [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow),
    ///   [`ErrorKind::RetryAfterTooLong`](crate::ErrorKind::RetryAfterTooLong): the operation stopped without a final answer; the
    ///   last response, if any, can be taken with [`Error::take_response`](crate::Error::take_response).
    /// - [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable): a streamed body's one attempt failed transiently.
    /// - [`ErrorKind::Transport`](crate::ErrorKind::Transport): a transport failure that was not retried.
    /// - [`ErrorKind::TooManyRedirects`](crate::ErrorKind::TooManyRedirects): a redirect chain
    ///   longer than the client's [`RedirectPolicy`](crate::RedirectPolicy) allows; not retried.
    /// - With a [`Ledger`](crate::Ledger): [`ErrorKind::KeyReuse`](crate::ErrorKind::KeyReuse)
    ///   (the key was recorded for a different request),
    ///   [`ErrorKind::InProgress`](crate::ErrorKind::InProgress) (another run holds it),
    ///   [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow) (its first attempt,
    ///   in an earlier run, is older than the window), all before sending anything;
    ///   [`ErrorKind::Ledger`](crate::ErrorKind::Ledger) when the ledger fails. A keyed
    ///   operation that already succeeded is answered from the ledger, with
    ///   [`RetryReport::is_replayed`](crate::RetryReport::is_replayed) set, and nothing is sent.
    ///
    /// Each error says whether the outcome is unknown and carries the key.
    ///
    /// # Cancellation
    ///
    /// Dropping the future (a timeout around `send`, a `select!`) stops the operation where it
    /// is. A retry paid for and not yet sent gives its tokens back to the
    /// [`RetryBudget`](crate::RetryBudget); with a [`Ledger`](crate::Ledger), the claim is given
    /// back on a spawned task, recorded as outcome unknown if an attempt may have reached the
    /// server, so the next `send` with the key goes ahead at once with the same key and window.
    pub async fn send(self) -> Result<reqwest::Response, Error> {
        let RequestBuilder {
            client,
            inner,
            key,
            auto_key,
            policy,
            timeout,
            scope,
        } = self;
        let request = inner.build().map_err(Error::builder_from)?;
        let overrides = Overrides {
            key,
            auto_key: Some(auto_key),
            policy,
            timeout,
            scope,
        };
        engine::execute(
            &client.settings,
            request,
            overrides,
            ReqwestTransport(&client),
        )
        .await
    }
}
