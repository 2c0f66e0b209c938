//! A request under construction; `send` hands it to the engine's pipeline (`engine/mod.rs`)
//! with the reqwest transport, and `build` turns it into a `reqwest::Request` that carries its
//! options (`carried.rs`) for [`Client::execute`](crate::Client::execute).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;

use super::carried::carry;
use super::copy::Copies;
#[cfg(feature = "multipart")]
use super::multipart;
use super::redirect::AnsweredRedirect;
use super::shared::ClientRef;
use super::transport::execute;
use crate::decision::policy::RetryPolicy;
use crate::engine::settings::Overrides;
use crate::keys::key::IdempotencyKey;
use crate::ledger::HeldRow;
use crate::outcome::error::Error;

/// A request being built; [`send`](Self::send) runs it as one logical operation.
///
/// The methods mirror `reqwest::RequestBuilder`. Errors in arguments (a bad header, a value
/// that fails to serialize) are deferred to [`send`](Self::send) and [`build`](Self::build).
#[must_use = "a RequestBuilder does nothing until you `send` it"]
pub struct RequestBuilder {
    client: Arc<ClientRef>,
    inner: reqwest::RequestBuilder,
    key: Option<IdempotencyKey>,
    auto_key: bool,
    policy: Option<RetryPolicy>,
    timeout: Option<Duration>,
    scope: Option<String>,
    /// The redirects the request was answered with before, followed by the caller.
    answered: Vec<AnsweredRedirect>,
    /// An error found by a method that `reqwest::RequestBuilder` cannot hold (a multipart form
    /// that failed to encode), reported by `send` and `build`.
    deferred: Option<Error>,
    /// The row a dispatcher already took for this operation: the run holds it without a
    /// claim of its own.
    held: Option<HeldRow>,
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
            .field("answered", &self.answered)
            .field("deferred", &self.deferred)
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
            answered: Vec::new(),
            deferred: None,
            held: None,
        }
    }

    /// Sends the operation holding `row`, which a dispatcher took for it: no claim of its own.
    pub(crate) fn held(mut self, row: HeldRow) -> Self {
        self.held = Some(row);
        self
    }

    #[inline]
    fn map(mut self, f: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder) -> Self {
        self.inner = f(self.inner);
        self
    }

    /// Adds a header. A header named like the client's key header is taken as the
    /// operation's key, verbatim (it must still be a valid key).
    #[inline]
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
    #[inline]
    pub fn headers(self, headers: HeaderMap) -> Self {
        self.map(|b| b.headers(headers))
    }

    /// Appends query parameters to the URL.
    #[inline]
    pub fn query<T: Serialize + ?Sized>(self, query: &T) -> Self {
        self.map(|b| b.query(query))
    }

    /// Sets a JSON body (replayable).
    #[inline]
    pub fn json<T: Serialize + ?Sized>(self, json: &T) -> Self {
        self.map(|b| b.json(json))
    }

    /// Sets a URL-encoded form body (replayable).
    #[inline]
    pub fn form<T: Serialize + ?Sized>(self, form: &T) -> Self {
        self.map(|b| b.form(form))
    }

    /// Sets the body. Bytes, strings and vectors can be sent again on every attempt; a
    /// streamed body (`reqwest::Body::wrap_stream`) cannot: it gets one attempt, and if that
    /// attempt fails transiently the error is
    /// [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable). To retry a large
    /// payload, buffer it into `bytes::Bytes` (cloning those is cheap).
    #[inline]
    pub fn body<T: Into<reqwest::Body>>(self, body: T) -> Self {
        self.map(|b| b.body(body))
    }

    /// Sets a `multipart/form-data` body, with its `Content-Type` (and the boundary in it).
    ///
    /// A [`Form`](crate::multipart::Form) whose parts are all in memory (text, bytes, a
    /// `reqwest::Body` made from bytes) is encoded here, once: every attempt sends the same
    /// bytes with the same boundary, so the request has one fingerprint in a
    /// [`Ledger`](crate::ledger::Ledger). A form with a streamed part is sent as a stream, as
    /// [`body`](Self::body) sends one: it gets one attempt, and if that attempt fails
    /// transiently the error is [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable).
    /// [`Form::is_replayable`](crate::multipart::Form::is_replayable) tells which it is.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::Client;
    /// use idempotent_retry::multipart::{Form, Part};
    ///
    /// let form = Form::new()
    ///     .text("purpose", "dispute_evidence")
    ///     .part("file", Part::bytes(&b"%PDF-1.7"[..]).file_name("receipt.pdf"));
    /// assert!(form.is_replayable());
    /// let request = Client::new()
    ///     .post("https://files.example.com/v1/files")
    ///     .multipart(form)
    ///     .build()?;
    /// assert!(request.body().and_then(reqwest::Body::as_bytes).is_some());
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    #[cfg(feature = "multipart")]
    pub fn multipart(mut self, form: multipart::Form) -> Self {
        match form.encode() {
            multipart::Encoded::Buffered { content_type, body } => self.map(|b| {
                b.header(http::header::CONTENT_TYPE, content_type)
                    .body(body)
            }),
            multipart::Encoded::Streamed(form) => self.map(|b| b.multipart(form)),
            multipart::Encoded::Failed(err) => {
                self.deferred.get_or_insert(err);
                self
            }
        }
    }

    /// The HTTP version of every attempt (and of each redirect hop).
    ///
    /// Default: reqwest's (HTTP/1.1, or HTTP/2 when the server offers it over TLS).
    #[inline]
    pub fn version(self, version: http::Version) -> Self {
        self.map(|b| b.version(version))
    }

    /// Sets a bearer token.
    #[inline]
    pub fn bearer_auth<T: fmt::Display>(self, token: T) -> Self {
        self.map(|b| b.bearer_auth(token))
    }

    /// Sets HTTP basic authentication.
    #[inline]
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
    #[inline]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The key for this operation, sent on every attempt. Derive it from stable inputs
    /// ([`IdempotencyKey::derive`], [`IdempotencyKey::for_tool_call`]) so that a retry after a
    /// crash or a redelivery reuses it.
    #[inline]
    pub fn idempotency_key(mut self, key: IdempotencyKey) -> Self {
        self.key = Some(key);
        self
    }

    /// Sends this request without minting a random key. A key given with
    /// [`idempotency_key`](Self::idempotency_key) or as a header is still sent. A
    /// non-idempotent request without a key is retried only when no attempt can have reached
    /// the server.
    #[inline]
    pub fn without_idempotency_key(mut self) -> Self {
        self.auto_key = false;
        self
    }

    /// The retry policy for this request only.
    #[inline]
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// The operation's scope in the client's [`Ledger`](crate::ledger::Ledger) (`stripe.charge`,
    /// `agent.send_email`): what kind of operation the key names, and which retention
    /// applies ([`LedgerOptions::scope_retention`](crate::ledger::LedgerOptions::scope_retention)).
    ///
    /// Default: the URL's host.
    #[inline]
    pub fn ledger_scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Continues an operation whose request was answered with this redirect, and that the
    /// caller follows itself: an HTTP library above the client that follows redirects and
    /// re-issues the hop (httpx's `follow_redirects`, `fetch`'s `redirect: 'follow'`). Build
    /// the request as it was first sent (its URL, method, body and key: the same operation,
    /// and the same row in a [`Ledger`](crate::ledger::Ledger)); `location` is the URL the
    /// redirect's `Location` names, resolved. Call it once per hop, in order.
    ///
    /// Every attempt follows these hops by the client's
    /// [`RedirectPolicy`](crate::RedirectPolicy) rules, whatever its limit, without sending
    /// the requests they answer, and sends the last one: the key and the body go on a hop that
    /// resends the operation to an origin the key may go to, and a hop the policy would not
    /// follow ends each attempt on that redirect. Later redirects are the policy's to follow.
    ///
    /// # Errors
    ///
    /// [`send`](Self::send) fails with [`ErrorKind::Builder`](crate::ErrorKind::Builder) for a
    /// status other than 301, 302, 303, 307 and 308 or a location that is not an `http` or
    /// `https` URL; [`build`](Self::build) always does, as a `reqwest::Request` cannot carry
    /// the hops.
    ///
    /// Default: none; the first attempt goes to the request's URL.
    pub fn after_redirect(mut self, status: http::StatusCode, location: reqwest::Url) -> Self {
        match AnsweredRedirect::new(status, location) {
            Ok(answered) => self.answered.push(answered),
            Err(err) => {
                self.deferred.get_or_insert(err);
            }
        }
        self
    }

    /// Sends the request as one logical operation: one key, as many attempts as the policy
    /// allows.
    ///
    /// The returned response carries a [`RetryReport`](crate::RetryReport) in its extensions. Every status that is
    /// not retried (2xx, most 4xx, 501, ...) is returned as `Ok`, as `reqwest` does.
    /// Redirects are followed by the client's [`RedirectPolicy`](crate::RedirectPolicy): the
    /// response is the last hop's (`response.url()`), and
    /// [`RedirectChain::of`](crate::redirect::RedirectChain::of) lists the hops.
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
    /// - With a [`Ledger`](crate::ledger::Ledger): [`ErrorKind::KeyReuse`](crate::ErrorKind::KeyReuse)
    ///   (the key was recorded for a different request),
    ///   [`ErrorKind::LeaseHeld`](crate::ErrorKind::LeaseHeld) (another run holds it),
    ///   [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow) (its first attempt,
    ///   in an earlier run, is older than the window), all before sending anything;
    ///   [`ErrorKind::Ledger`](crate::ErrorKind::Ledger) when the ledger fails. A keyed
    ///   operation that already succeeded is answered from the ledger, with
    ///   [`RetryReport::is_replayed`](crate::RetryReport::is_replayed) set, and nothing is sent.
    ///
    /// Each error says whether the outcome is unknown and carries the key.
    ///
    /// Dropping the future stops the operation; with a [`Ledger`](crate::ledger::Ledger) the
    /// claim is given back, so the next `send` under the key goes ahead at once. An answer whose
    /// `Content-Length` is at most [`ClientBuilder::answer_read_limit`](crate::ClientBuilder::answer_read_limit)
    /// (1 MiB) is read before `send` returns: a body cut midway is retried with the key. A
    /// longer or unbounded one streams; if it fails midway, its error names the key and says to
    /// send the same request again with it. Both in detail: `docs/sending.md`.
    pub async fn send(self) -> Result<reqwest::Response, Error> {
        let (client, mut request, overrides, answered) = self.into_parts()?;
        let copies = Copies::of_built(&mut request, &client.http);
        execute(&client, request, overrides, copies, &answered).await
    }

    /// Builds the `reqwest::Request`, carrying this builder's options for
    /// [`Client::execute`](crate::Client::execute): `client.execute(builder.build()?)` runs
    /// exactly as `builder.send()` does.
    ///
    /// The key given with [`idempotency_key`](Self::idempotency_key), the
    /// [`policy`](Self::policy), the [`ledger_scope`](Self::ledger_scope) and
    /// [`without_idempotency_key`](Self::without_idempotency_key) ride in the request's
    /// extensions, the forms the tower and middleware front ends read
    /// ([`IdempotencyKey`], [`RetryPolicy`], [`LedgerScope`](crate::LedgerScope),
    /// [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey)); the
    /// [`timeout`](Self::timeout) is the request's own `timeout()`. The key is settled, and
    /// written into the key header, when the request is executed: a key header set with
    /// [`header`](Self::header) is in the built request, a given or random key is not yet.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder): an invalid URL or header, a value
    /// that failed to serialize, a multipart form that failed to encode. What the settle stage
    /// checks (the policy, a zero timeout, the key) is checked by
    /// [`Client::execute`](crate::Client::execute), as by [`send`](Self::send).
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{Client, IdempotencyKey};
    ///
    /// let client = Client::new();
    /// let request = client
    ///     .post("https://api.example.com/v1/charges")
    ///     .idempotency_key(IdempotencyKey::new("charge-42")?)
    ///     .timeout(std::time::Duration::from_secs(5))
    ///     .build()?;
    /// assert_eq!(request.timeout(), Some(&std::time::Duration::from_secs(5)));
    /// // Later, or elsewhere: one operation, with the key and the timeout given above.
    /// let operation = client.execute(request);
    /// # drop(operation);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<reqwest::Request, Error> {
        let (_, request, overrides, answered) = self.into_parts()?;
        if !answered.is_empty() {
            return Err(Error::builder(
                "a request continued after_redirect cannot be built into a reqwest::Request; \
                 send it with RequestBuilder::send",
            ));
        }
        carry(request, overrides)
    }

    /// A copy of this builder, or `None` when its body cannot be copied (a stream, or a
    /// multipart form with a streamed part), as `reqwest::RequestBuilder::try_clone` returns.
    /// Each copy sent is an operation of its own: copies of a builder with a key (given, or in
    /// the key header) all send that key, copies without one each get a random key.
    #[must_use]
    pub fn try_clone(&self) -> Option<RequestBuilder> {
        if self.deferred.is_some() {
            return None;
        }
        Some(RequestBuilder {
            client: Arc::clone(&self.client),
            inner: self.inner.try_clone()?,
            key: self.key.clone(),
            auto_key: self.auto_key,
            policy: self.policy,
            timeout: self.timeout,
            scope: self.scope.clone(),
            answered: self.answered.clone(),
            deferred: None,
            // The row is the original's: a copy claims the key as any request does.
            held: None,
        })
    }

    /// The client, the request, its options and the redirects answered before, or the first
    /// error found while building.
    #[inline]
    fn into_parts(self) -> Result<Parts, Error> {
        let RequestBuilder {
            client,
            inner,
            key,
            auto_key,
            policy,
            timeout,
            scope,
            answered,
            deferred,
            held,
        } = self;
        if let Some(err) = deferred {
            return Err(err);
        }
        let request = inner.build().map_err(Error::builder_from)?;
        let overrides = Overrides {
            key,
            auto_key: Some(auto_key),
            policy,
            timeout,
            scope,
            held,
        };
        Ok((client, request, overrides, answered))
    }
}

/// What [`RequestBuilder::into_parts`] gives.
type Parts = (
    Arc<ClientRef>,
    reqwest::Request,
    Overrides,
    Vec<AnsweredRedirect>,
);
