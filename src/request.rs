//! A request under construction, and the retry loop that sends it.

use std::fmt;
use std::time::Duration;

use http::StatusCode;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use tracing::Instrument;

use crate::classify::{FailureKind, classify_reqwest_error};
use crate::client::{Client, ClientRef, Jitter};
use crate::error::{Error, ErrorKind};
use crate::key::IdempotencyKey;
use crate::policy::{
    Decision, Observed, OperationState, RetryPolicy, Stop, attempt_budget, decide,
    is_idempotent_method,
};
use crate::report::{AttemptRecord, RetryReport, Wait};

/// A request being built; [`send`](Self::send) runs it as one logical operation.
///
/// The methods mirror `reqwest::RequestBuilder`. Errors in arguments (a bad header, a value
/// that fails to serialize) are deferred to [`send`](Self::send).
#[must_use = "a RequestBuilder does nothing until you `send` it"]
pub struct RequestBuilder {
    client: Client,
    inner: reqwest::RequestBuilder,
    key: Option<IdempotencyKey>,
    auto_key: bool,
    policy: Option<RetryPolicy>,
    timeout: Option<Duration>,
}

impl fmt::Debug for RequestBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("inner", &self.inner)
            .field("key", &self.key)
            .field("auto_key", &self.auto_key)
            .field("policy", &self.policy)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RequestBuilder {
    pub(crate) fn new(client: Client, inner: reqwest::RequestBuilder) -> Self {
        let auto_key = client.inner.auto_keys;
        RequestBuilder {
            client,
            inner,
            key: None,
            auto_key,
            policy: None,
            timeout: None,
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
    /// [`attempt_timeout`](RetryPolicy::attempt_timeout).
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

    /// Sends the request as one logical operation: one key, as many attempts as the policy
    /// allows.
    ///
    /// The returned response carries a [`RetryReport`] in its extensions. Every status that is
    /// not retried (2xx, most 4xx, 501, ...) is returned as `Ok`, as `reqwest` does.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::Builder`]: invalid policy, URL or header, or two different keys.
    /// - [`ErrorKind::InvalidKey`]: a key header set by the caller is not a valid key.
    /// - [`ErrorKind::AttemptsExhausted`], [`ErrorKind::ReconcileWindow`],
    ///   [`ErrorKind::RetryAfterTooLong`]: the operation stopped without a final answer; the
    ///   last response, if any, can be taken with [`Error::take_response`].
    /// - [`ErrorKind::BodyNotReplayable`]: a streamed body's one attempt failed transiently.
    /// - [`ErrorKind::Transport`]: a transport failure that was not retried.
    ///
    /// Each error says whether the outcome is unknown and carries the key.
    pub async fn send(self) -> Result<reqwest::Response, Error> {
        let RequestBuilder {
            client,
            inner,
            key,
            auto_key,
            policy,
            timeout,
        } = self;
        let policy = policy.unwrap_or(client.inner.policy);
        policy.validate()?;
        let mut request = inner.build().map_err(Error::builder_from)?;
        let key = attach_key(&mut request, &client.inner.key_header, key, auto_key)?;
        let span = tracing::info_span!(
            "idempotent_request",
            method = %request.method(),
            host = request.url().host_str().unwrap_or(""),
            key = key.as_ref().map_or("", IdempotencyKey::as_str),
        );
        run(&client.inner, request, key, policy, timeout)
            .instrument(span)
            .await
    }
}

/// Settles the operation's key and puts it in the request's headers, once, before the first
/// attempt: every attempt is a clone of this request.
fn attach_key(
    request: &mut reqwest::Request,
    header: &HeaderName,
    explicit: Option<IdempotencyKey>,
    auto_key: bool,
) -> Result<Option<IdempotencyKey>, Error> {
    let mut values = request.headers().get_all(header).iter();
    let from_header = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => {
            return Err(Error::builder(format!(
                "the {header} header is set more than once"
            )));
        }
        (Some(value), None) => {
            let text = value
                .to_str()
                .map_err(|_| Error::builder(format!("the {header} header is not visible ASCII")))?;
            Some(
                IdempotencyKey::new(text)
                    .map_err(|reason| Error::invalid_key(reason, "set in a header"))?,
            )
        }
    };
    let key = match (explicit, from_header) {
        (Some(explicit), Some(header_key)) if explicit != header_key => {
            return Err(Error::builder(format!(
                "two different idempotency keys: one given, another in the {header} header"
            )));
        }
        (Some(key), _) | (None, Some(key)) => key,
        (None, None) if auto_key && !is_idempotent_method(request.method()) => {
            IdempotencyKey::random()
        }
        (None, None) => return Ok(None),
    };
    request
        .headers_mut()
        .insert(header.clone(), key.to_header_value());
    Ok(Some(key))
}

/// The retry loop: send, classify, decide, wait; the same key on every attempt.
async fn run(
    client: &ClientRef,
    request: reqwest::Request,
    key: Option<IdempotencyKey>,
    policy: RetryPolicy,
    timeout: Option<Duration>,
) -> Result<reqwest::Response, Error> {
    let attempt_timeout = timeout.unwrap_or(policy.get_attempt_timeout());
    let started = client.clock.now();
    let mut state = OperationState {
        started,
        attempts: 0,
        keyed: key.is_some(),
        idempotent_method: is_idempotent_method(request.method()),
        // Until a clone fails: then the request goes out once, as it is.
        replayable: true,
    };
    let mut report = RetryReport::new(key);
    let mut may_have_executed = false;
    let mut original = Some(request);

    loop {
        let now = client.clock.now();
        let Some(budget) =
            attempt_budget(policy.get_reconcile_window(), attempt_timeout, started, now)
        else {
            report.elapsed = now.saturating_duration_since(started);
            return Err(
                Error::operation(ErrorKind::ReconcileWindow, report, may_have_executed)
                    .with_window(policy.get_reconcile_window()),
            );
        };
        let next = match original.as_ref().and_then(reqwest::Request::try_clone) {
            Some(copy) => Some(copy),
            None => {
                state.replayable = false;
                original.take()
            }
        };
        let Some(mut attempt) = next else {
            // Unreachable by construction (the engine stops before a second attempt of a
            // request that cannot be cloned), but never panic over it.
            report.elapsed = now.saturating_duration_since(started);
            return Err(Error::operation(
                ErrorKind::BodyNotReplayable,
                report,
                may_have_executed,
            ));
        };
        *attempt.timeout_mut() = Some(budget);
        state.attempts += 1;
        let number = state.attempts;
        let attempt_started = now.saturating_duration_since(started);

        let result = match client.http.execute(attempt).await {
            // reqwest refused the request before sending anything (an unsupported scheme,
            // say): a configuration error, not an attempt.
            Err(err) if err.is_builder() => return Err(Error::builder_from(err)),
            other => other,
        };

        let observed = match &result {
            Ok(response) => Observed::Response {
                status: response.status(),
                headers: response.headers(),
            },
            Err(err) => Observed::Failure(classify_reqwest_error(err)),
        };
        let decided_at = client.clock.now();
        let decision = match &client.rng {
            Jitter::Thread => decide(
                &policy,
                &state,
                observed,
                decided_at,
                client.clock.wall(),
                &mut rand::rng(),
            ),
            Jitter::Seeded(rng) => {
                let mut rng = match rng.lock() {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
                decide(
                    &policy,
                    &state,
                    observed,
                    decided_at,
                    client.clock.wall(),
                    &mut *rng,
                )
            }
        };
        let status = result.as_ref().ok().map(reqwest::Response::status);
        report.attempts = number;
        report.elapsed = decided_at.saturating_duration_since(started);

        match decision {
            Decision::Return => {
                report.history.push(AttemptRecord {
                    number,
                    started: attempt_started,
                    status,
                    failure: None,
                    wait: None,
                });
                return match result {
                    Ok(mut response) => {
                        log_final(&response, report.idempotency_key(), number);
                        response.extensions_mut().insert(report);
                        Ok(response)
                    }
                    // `decide` returns `Return` only for responses.
                    Err(err) => {
                        Err(Error::operation(ErrorKind::Transport, report, true).with_source(err))
                    }
                };
            }
            Decision::Retry {
                kind,
                delay,
                reason,
            } => {
                may_have_executed |= kind.may_have_executed();
                report.history.push(AttemptRecord {
                    number,
                    started: attempt_started,
                    status,
                    failure: Some(kind),
                    wait: Some(Wait { delay, reason }),
                });
                tracing::info!(
                    attempt = number,
                    outcome = kind.as_str(),
                    status = status.map(|s| s.as_u16()),
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    why = %reason,
                    "attempt failed, retrying with the same key"
                );
                // Release the connection before sleeping.
                drop(result);
                client.sleeper.sleep(delay).await;
            }
            Decision::Stop { kind, stop } => {
                may_have_executed |= kind.is_some_and(FailureKind::may_have_executed);
                report.history.push(AttemptRecord {
                    number,
                    started: attempt_started,
                    status,
                    failure: kind,
                    wait: None,
                });
                let err = stop_error(stop, report, may_have_executed, &policy).with_failure(kind);
                let err = match result {
                    Ok(response) => err.with_response(response),
                    Err(source) => err.with_source(source),
                };
                tracing::warn!(
                    key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
                    attempt = number,
                    outcome = kind.map_or("final", FailureKind::as_str),
                    outcome_unknown = err.is_outcome_unknown(),
                    error = %err,
                    "operation stopped"
                );
                return Err(err);
            }
        }
    }
}

fn stop_error(stop: Stop, report: RetryReport, unknown: bool, policy: &RetryPolicy) -> Error {
    match stop {
        Stop::Exhausted => Error::operation(ErrorKind::AttemptsExhausted, report, unknown),
        Stop::Window => Error::operation(ErrorKind::ReconcileWindow, report, unknown)
            .with_window(policy.get_reconcile_window()),
        Stop::RetryAfterTooLong { asked } => {
            Error::operation(ErrorKind::RetryAfterTooLong, report, unknown).with_retry_after(asked)
        }
        Stop::NotReplayable => Error::operation(ErrorKind::BodyNotReplayable, report, unknown),
        Stop::NotRetrySafe | Stop::Fatal => Error::operation(ErrorKind::Transport, report, unknown),
    }
}

/// Logs the final response; a 422 on a keyed request (the key reused with another payload, a
/// client bug) at error level, with the key on the event itself so warn/error filters keep it.
fn log_final(response: &reqwest::Response, key: Option<&IdempotencyKey>, attempts: u32) {
    let status = response.status();
    if let Some(key) = key
        && status == StatusCode::UNPROCESSABLE_ENTITY
    {
        tracing::error!(
            key = key.as_str(),
            attempt = attempts,
            status = status.as_u16(),
            "422 on a keyed request: the key was reused with a different payload"
        );
    } else {
        tracing::debug!(
            attempt = attempts,
            status = status.as_u16(),
            "final response"
        );
    }
}
