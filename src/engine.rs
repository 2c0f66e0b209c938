//! The retry engine every front end drives: settle the key, then send, classify, decide, wait.
//!
//! The reqwest [`Client`](crate::Client) is one front end; others (a tower service, a
//! `reqwest-middleware` middleware) differ only in how an attempt is sent. They implement
//! [`Transport`] for that one step, and the request and response types implement
//! [`RetryRequest`] and [`RetryResponse`]; everything else (keys, classification, backoff,
//! windows, reports, logging) happens here, once, by calling the pure pieces in `policy.rs`,
//! `classify.rs` and `backoff.rs`.
//!
//! The loop has one named step per point where an outside concern plugs in:
//!
//! - [`Operation::begin`]: the key is settled and written into the request; the operation has
//!   not sent anything yet (the `Client` claimed the key in its ledger, if any, just before);
//! - right after `decide`: the [retry budget](crate::RetryBudget) pays for a retry or turns it
//!   into a stop (`BudgetTab::admit`), so the attempt is recorded with what really happens;
//! - [`Operation::record_attempt`]: the ledger records the attempt;
//! - [`Operation::attempt_ended`]: one attempt's outcome and the decision about it are known
//!   (the report and the observers);
//! - [`Operation::retry_decided`]: a retry is about to wait;
//! - `Operation::finish_with_*`: the operation's result is final (the budget is refunded on
//!   success, observers are told; in a run holding a ledger claim the `Client` tells them
//!   instead, after saving the outcome in its ledger).

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use tokio::time::Instant;
use tracing::Instrument;

use crate::budget::{BudgetTab, RetryBudget};
use crate::classify::FailureKind;
use crate::client::Jitter;
use crate::error::{Error, ErrorKind};
use crate::key::IdempotencyKey;
use crate::ledger::{LedgerError, LedgerHandle, LedgerSession};
use crate::observe::{AttemptEvent, Observer, OperationEvent};
use crate::policy::{
    Decision, Observed, OperationState, RetryPolicy, Stop, attempt_budget, decide,
    is_idempotent_method,
};
use crate::report::{AttemptRecord, RetryReport, Wait};
use crate::time::{Clock, Sleeper};

pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A request type the retry engine can send once per attempt.
///
/// Implemented for `reqwest::Request` and for `http::Request<B>` with a cloneable body
/// (`String`, `Bytes`, `http_body_util::Full<Bytes>`, ...). The tower front end accepts any
/// request type that implements it.
pub trait RetryRequest: Sized + Send + 'static {
    /// The request method: it decides whether a key is minted and whether a keyless retry is
    /// safe.
    fn method(&self) -> &Method;

    /// The target host, for the span and [per-host policies](crate::ClientBuilder::policy_for_host).
    fn host(&self) -> Option<&str>;

    /// The request headers, where the key (and the optional attempt number) travel.
    fn headers_mut(&mut self) -> &mut HeaderMap;

    /// A copy to send as one attempt, or `None` when the body cannot be sent twice (the
    /// request then gets one attempt, and a transient failure becomes
    /// [`ErrorKind::BodyNotReplayable`]).
    fn try_clone(&self) -> Option<Self>;

    /// Asks the request to carry its own timeout for this attempt. Returns `false` when it
    /// cannot; the engine then bounds the attempt itself, up to the response head.
    fn set_timeout(&mut self, timeout: Duration) -> bool;

    /// Extensions where a caller may put an [`IdempotencyKey`], a [`RetryPolicy`] or
    /// [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey) for this request only. `None`
    /// when the type has none the engine can read.
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }
}

/// A response type the retry engine can classify and annotate.
///
/// Implemented for `reqwest::Response` and `http::Response<B>`.
pub trait RetryResponse: Send + 'static {
    /// The status.
    fn status(&self) -> StatusCode;

    /// The headers (for `Retry-After` and server retry hints).
    fn headers(&self) -> &HeaderMap;

    /// Where the final [`RetryReport`] goes.
    fn extensions_mut(&mut self) -> &mut http::Extensions;
}

/// How one attempt failed, as a transport reports it.
pub(crate) enum SendError {
    /// Nothing was sent: the request is malformed (a configuration error, not an attempt).
    Refused(Error),
    /// The attempt failed on the way; `kind` says how.
    Failed { kind: FailureKind, source: BoxError },
}

/// Sends one attempt. The only thing a front end implements.
pub(crate) trait Transport<Q: RetryRequest> {
    /// What a successful send produces.
    type Response: RetryResponse;

    /// Waits until the transport can take the next attempt, sending nothing (a tower service's
    /// `poll_ready`). The engine awaits it before it starts the attempt's clock, so a wait for
    /// capacity is never mistaken for a slow attempt. An error means the transport will never
    /// be ready: the operation ends without another attempt.
    fn ready(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Sends one attempt of the request.
    fn send(
        &mut self,
        request: Q,
    ) -> impl Future<Output = Result<Self::Response, SendError>> + Send;

    /// Sends one attempt, given the operation's request it was cloned from (`None` when the
    /// body could not be cloned and the attempt is that request). A transport that may need
    /// the request again within the attempt (the reqwest one, to follow a redirect) clones it
    /// from `original` only when it must, instead of copying every attempt up front.
    fn send_attempt(
        &mut self,
        request: Q,
        original: Option<&Q>,
    ) -> impl Future<Output = Result<Self::Response, SendError>> + Send {
        let _ = original;
        self.send(request)
    }
}

/// Everything the engine needs that is shared by all operations of one front end.
pub(crate) struct Settings {
    pub(crate) policy: RetryPolicy,
    /// Policies by lowercase host name, between the request's own and `policy`.
    pub(crate) host_policies: HashMap<String, RetryPolicy>,
    pub(crate) key_header: HeaderName,
    pub(crate) auto_keys: bool,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) sleeper: Arc<dyn Sleeper>,
    pub(crate) rng: Jitter,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// Carries the attempt number on each attempt when set.
    pub(crate) attempt_header: Option<HeaderName>,
    /// Pays for every retry, shared by all clones of the front end; `None` when turned off.
    pub(crate) budget: Option<RetryBudget>,
    /// The durable operation ledger, if any (claimed by the front end, recorded here).
    pub(crate) ledger: Option<LedgerHandle>,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as("Settings", f)
    }
}

impl Settings {
    /// The policy for a request: its own, else its host's, else the default.
    pub(crate) fn policy_for(&self, own: Option<RetryPolicy>, host: Option<&str>) -> RetryPolicy {
        own.or_else(|| {
            let host = host?.to_ascii_lowercase();
            self.host_policies.get(&host).copied()
        })
        .unwrap_or(self.policy)
    }

    /// Formats the settings as the front end named `name`.
    pub(crate) fn debug_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("policy", &self.policy)
            .field("host_policies", &self.host_policies)
            .field("key_header", &self.key_header)
            .field("auto_keys", &self.auto_keys)
            .field("clock", &self.clock)
            .field("sleeper", &self.sleeper)
            .field(
                "rng",
                &match self.rng {
                    Jitter::Thread => "thread",
                    Jitter::Seeded(_) => "seeded",
                },
            )
            .field("observer", &self.observer)
            .field("attempt_header", &self.attempt_header)
            .field("budget", &self.budget)
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

/// What one request asks for beyond the front end's settings.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    /// A key given by the caller.
    pub(crate) key: Option<IdempotencyKey>,
    /// `Some(false)` turns off the random key for this request.
    pub(crate) auto_key: Option<bool>,
    /// A policy for this request only.
    pub(crate) policy: Option<RetryPolicy>,
    /// A per-attempt timeout for this request only.
    pub(crate) timeout: Option<Duration>,
    /// The ledger claim this run holds: every attempt is recorded through it.
    pub(crate) ledger: Option<Arc<LedgerSession>>,
}

/// Runs one logical operation: settles the key, then retries `request` through `transport`,
/// inside the operation's span ([`operation_span`]).
pub(crate) async fn execute<Q, T>(
    settings: &Settings,
    request: Q,
    overrides: Overrides,
    transport: T,
) -> Result<T::Response, Error>
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    run_operation(settings, request, overrides, transport, true).await
}

/// As [`execute`], for a front end that already runs the whole operation (a ledger's claim
/// and finish around the attempts) inside [`operation_span`]: no second span is opened.
pub(crate) async fn execute_in_span<Q, T>(
    settings: &Settings,
    request: Q,
    overrides: Overrides,
    transport: T,
) -> Result<T::Response, Error>
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    run_operation(settings, request, overrides, transport, false).await
}

/// The `tracing` span one operation runs in: method, host and key.
pub(crate) fn operation_span(
    method: &Method,
    host: Option<&str>,
    key: Option<&IdempotencyKey>,
) -> tracing::Span {
    tracing::info_span!(
        "idempotent_request",
        method = %method,
        host = host.unwrap_or(""),
        key = key.map_or("", IdempotencyKey::as_str),
    )
}

async fn run_operation<Q, T>(
    settings: &Settings,
    mut request: Q,
    overrides: Overrides,
    transport: T,
    open_span: bool,
) -> Result<T::Response, Error>
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    let overrides = match request.extensions() {
        Some(ext) => overrides.or(Overrides::from_extensions(ext)),
        None => overrides,
    };
    let policy = settings.policy_for(overrides.policy, request.host());
    policy.validate()?;
    let method = request.method().clone();
    let key = attach_key(
        request.headers_mut(),
        &method,
        &settings.key_header,
        overrides.key,
        overrides.auto_key.unwrap_or(settings.auto_keys),
    )?;
    let span = open_span.then(|| operation_span(&method, request.host(), key.as_ref()));
    let host = request.host().map(str::to_owned);
    let mut operation = Operation::begin(
        settings,
        &method,
        host.as_deref(),
        key,
        policy,
        overrides.timeout,
    );
    operation.ledger = overrides.ledger;
    let run = operation.run(request, transport);
    match span {
        Some(span) => run.instrument(span).await,
        None => run.await,
    }
}

/// Settles the operation's key and puts it in the request's headers, once, before the first
/// attempt: every attempt is a clone of this request.
pub(crate) fn attach_key(
    headers: &mut HeaderMap,
    method: &Method,
    header: &HeaderName,
    explicit: Option<IdempotencyKey>,
    auto_key: bool,
) -> Result<Option<IdempotencyKey>, Error> {
    let mut values = headers.get_all(header).iter();
    let from_header = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => {
            return Err(Error::builder(format!(
                "the {header} header is set more than once"
            )));
        }
        // The raw bytes are checked, so a value with obs-text (bytes 0x80 and up) or a tab is
        // refused with the offending byte and its index, like any other invalid key.
        (Some(value), None) => Some(
            IdempotencyKey::from_header_bytes(value.as_bytes())
                .map_err(|reason| Error::invalid_key(reason, "set in a header"))?,
        ),
    };
    let in_header = from_header.is_some();
    let key = match (explicit, from_header) {
        (Some(explicit), Some(header_key)) if explicit != header_key => {
            return Err(Error::builder(format!(
                "two different idempotency keys: one given, another in the {header} header"
            )));
        }
        (Some(key), _) | (None, Some(key)) => key,
        (None, None) if auto_key && !is_idempotent_method(method) => IdempotencyKey::random(),
        (None, None) => return Ok(None),
    };
    // A key the caller put in the header stays exactly as given (its bytes are the key's, and
    // its sensitivity flag is kept); only a key from elsewhere is written in.
    if !in_header {
        headers.insert(header.clone(), key.to_header_value());
    }
    Ok(Some(key))
}

/// One logical operation in flight: its policy, state and report.
struct Operation<'s> {
    settings: &'s Settings,
    method: &'s Method,
    host: Option<&'s str>,
    policy: RetryPolicy,
    attempt_timeout: Duration,
    state: OperationState,
    report: RetryReport,
    may_have_executed: bool,
    budget_tab: BudgetTab,
    ledger: Option<Arc<LedgerSession>>,
}

/// What the engine keeps of one attempt's result until it has decided.
struct Outcome<R> {
    result: Result<R, (FailureKind, BoxError)>,
    status: Option<StatusCode>,
}

impl<'s> Operation<'s> {
    /// Hook point: the key is settled and in the request; nothing has been sent.
    fn begin(
        settings: &'s Settings,
        method: &'s Method,
        host: Option<&'s str>,
        key: Option<IdempotencyKey>,
        policy: RetryPolicy,
        timeout: Option<Duration>,
    ) -> Self {
        let started = settings.clock.now();
        Operation {
            settings,
            method,
            host,
            policy,
            attempt_timeout: timeout.unwrap_or(policy.get_attempt_timeout()),
            state: OperationState {
                started,
                attempts: 0,
                keyed: key.is_some(),
                idempotent_method: is_idempotent_method(method),
                // Until a clone fails: then the request goes out once, as it is.
                replayable: true,
            },
            report: RetryReport::new(key),
            may_have_executed: false,
            budget_tab: BudgetTab::default(),
            ledger: None,
        }
    }

    /// The loop: send, classify, decide, wait; the same key on every attempt.
    async fn run<Q, T>(mut self, request: Q, mut transport: T) -> Result<T::Response, Error>
    where
        Q: RetryRequest,
        T: Transport<Q>,
    {
        let mut original = Some(request);
        loop {
            if let Err(source) = transport.ready().await {
                return Err(self.finish_not_ready(source));
            }
            let now = self.settings.clock.now();
            let Some(budget) = attempt_budget(
                self.policy.get_reconcile_window(),
                self.attempt_timeout,
                self.state.started,
                now,
            ) else {
                self.report.elapsed = now.saturating_duration_since(self.state.started);
                let err = Error::operation(
                    ErrorKind::ReconcileWindow,
                    self.report.clone(),
                    self.may_have_executed,
                )
                .with_window(self.policy.get_reconcile_window());
                return Err(self.finish_with_error(err));
            };
            let next = match original.as_ref().and_then(RetryRequest::try_clone) {
                Some(copy) => Some(copy),
                None => {
                    self.state.replayable = false;
                    original.take()
                }
            };
            let Some(mut attempt) = next else {
                // Unreachable by construction (the engine stops before a second attempt of a
                // request that cannot be cloned), but never panic over it.
                self.report.elapsed = now.saturating_duration_since(self.state.started);
                let err = Error::operation(
                    ErrorKind::BodyNotReplayable,
                    self.report.clone(),
                    self.may_have_executed,
                );
                return Err(self.finish_with_error(err));
            };
            let enforced = attempt.set_timeout(budget);
            self.state.attempts += 1;
            let number = self.state.attempts;
            if let Some(name) = &self.settings.attempt_header {
                attempt
                    .headers_mut()
                    .insert(name.clone(), HeaderValue::from(number));
            }
            let attempt_started = now.saturating_duration_since(self.state.started);

            let sent = if enforced {
                transport.send_attempt(attempt, original.as_ref()).await
            } else {
                let send = transport.send_attempt(attempt, original.as_ref());
                match tokio::time::timeout(budget, send).await {
                    Ok(sent) => sent,
                    Err(elapsed) => Err(SendError::Failed {
                        kind: FailureKind::Timeout,
                        source: Box::new(elapsed),
                    }),
                }
            };
            let result = match sent {
                Ok(response) => Ok(response),
                Err(SendError::Failed { kind, source }) => Err((kind, source)),
                Err(SendError::Refused(err)) => return Err(self.finish_with_error(err)),
            };
            let outcome = Outcome {
                status: result.as_ref().ok().map(RetryResponse::status),
                result,
            };
            let decided_at = self.settings.clock.now();
            let decision = self.decide(&outcome, decided_at);
            let decision = self
                .budget_tab
                .admit(self.settings.budget.as_ref(), decision);
            self.report.attempts = number;
            self.report.elapsed = decided_at.saturating_duration_since(self.state.started);
            if let Some(source) = self.record_attempt(&decision).await {
                return Err(self.finish_unrecorded(number, attempt_started, outcome, source));
            }

            match decision {
                Decision::Return => {
                    self.attempt_ended(number, attempt_started, outcome.status, None, None);
                    return match outcome.result {
                        Ok(response) => Ok(self.finish_with_response(response, number)),
                        // `decide` returns `Return` only for responses.
                        Err((_, source)) => {
                            let err =
                                Error::operation(ErrorKind::Transport, self.report.clone(), true)
                                    .with_source(source);
                            Err(self.finish_with_error(err))
                        }
                    };
                }
                Decision::Retry {
                    kind,
                    delay,
                    reason,
                } => {
                    self.may_have_executed |= kind.may_have_executed();
                    let wait = Wait { delay, reason };
                    self.attempt_ended(
                        number,
                        attempt_started,
                        outcome.status,
                        Some(kind),
                        Some(wait),
                    );
                    self.retry_decided(number, kind, outcome.status, wait);
                    // Release the connection before sleeping.
                    drop(outcome);
                    self.settings.sleeper.sleep(delay).await;
                }
                Decision::Stop { kind, stop } => {
                    self.may_have_executed |= kind.is_some_and(FailureKind::may_have_executed);
                    self.attempt_ended(number, attempt_started, outcome.status, kind, None);
                    return Err(self.finish_with_stop(stop, kind, outcome, number));
                }
            }
        }
    }

    /// Feeds the attempt's outcome to the pure decision engine.
    fn decide<R: RetryResponse>(&self, outcome: &Outcome<R>, decided_at: Instant) -> Decision {
        let observed = match &outcome.result {
            Ok(response) => Observed::Response {
                status: response.status(),
                headers: response.headers(),
            },
            Err((kind, _)) => Observed::Failure(*kind),
        };
        let settings = self.settings;
        match &settings.rng {
            Jitter::Thread => decide(
                &self.policy,
                &self.state,
                observed,
                decided_at,
                settings.clock.wall(),
                &mut rand::rng(),
            ),
            Jitter::Seeded(rng) => {
                let mut rng = match rng.lock() {
                    Ok(guard) => guard,
                    Err(poisoned) => poisoned.into_inner(),
                };
                decide(
                    &self.policy,
                    &self.state,
                    observed,
                    decided_at,
                    settings.clock.wall(),
                    &mut *rng,
                )
            }
        }
    }

    /// Hook point: one attempt has ended and the decision about it is made.
    fn attempt_ended(
        &mut self,
        number: u32,
        started: Duration,
        status: Option<StatusCode>,
        failure: Option<FailureKind>,
        wait: Option<Wait>,
    ) {
        if let Some(observer) = &self.settings.observer {
            observer.on_attempt(&AttemptEvent {
                key: self.report.idempotency_key(),
                method: self.method,
                host: self.host,
                attempt: number,
                status,
                failure,
                delay: wait.map(|w| w.delay),
                elapsed: self.report.elapsed,
            });
        }
        self.report.history.push(AttemptRecord {
            number,
            started,
            status,
            failure,
            wait,
        });
    }

    /// Hook point: the attempt is written to the ledger (counted, lease renewed past the wait
    /// and the next attempt). Returns the ledger's error when it could not be.
    async fn record_attempt(&self, decision: &Decision) -> Option<LedgerError> {
        let session = self.ledger.as_ref()?;
        let wait = match decision {
            Decision::Retry { delay, .. } => Some(*delay),
            Decision::Return | Decision::Stop { .. } => None,
        };
        session
            .record_attempt(self.settings.clock.wall(), wait)
            .await
            .err()
    }

    /// Hook point (failure): an attempt was made but could not be recorded. The caller gets
    /// the key, the response if there was one, and "outcome unknown" whenever this or an
    /// earlier attempt may have run; the claim stays in the ledger, so the next run resumes.
    fn finish_unrecorded<R: RetryResponse>(
        mut self,
        number: u32,
        started: Duration,
        outcome: Outcome<R>,
        source: LedgerError,
    ) -> Error {
        let failure = outcome.result.as_ref().err().map(|(kind, _)| *kind);
        self.attempt_ended(number, started, outcome.status, failure, None);
        let message = "an attempt was made but could not be recorded";
        let err = match outcome.result {
            Ok(response) => Error::ledger(self.report.clone(), true, message, source)
                .with_response(response.status(), response),
            Err((kind, _)) => {
                let unknown = self.may_have_executed || kind.may_have_executed();
                Error::ledger(self.report.clone(), unknown, message, source)
                    .with_failure(Some(kind))
            }
        };
        tracing::warn!(
            key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
            attempt = number,
            outcome_unknown = err.is_outcome_unknown(),
            error = %err,
            "attempt not recorded in the ledger"
        );
        self.finish_with_error(err)
    }

    /// Hook point: a retry is decided and about to wait.
    fn retry_decided(
        &mut self,
        number: u32,
        kind: FailureKind,
        status: Option<StatusCode>,
        wait: Wait,
    ) {
        tracing::info!(
            attempt = number,
            outcome = kind.as_str(),
            status = status.map(|s| s.as_u16()),
            delay_ms = u64::try_from(wait.delay.as_millis()).unwrap_or(u64::MAX),
            why = %wait.reason,
            "attempt failed, retrying with the same key"
        );
    }

    /// Hook point (success): the response is the answer.
    fn finish_with_response<R: RetryResponse>(self, mut response: R, attempts: u32) -> R {
        self.budget_tab
            .settle_success(self.settings.budget.as_ref());
        log_final(response.status(), self.report.idempotency_key(), attempts);
        if let Some(observer) = self.observer() {
            observer.on_operation(&OperationEvent {
                key: self.report.idempotency_key(),
                method: self.method,
                host: self.host,
                attempts,
                status: Some(response.status()),
                error: None,
                outcome_unknown: false,
                elapsed: self.report.elapsed,
                ledger_verdict: None,
            });
        }
        response.extensions_mut().insert(self.report);
        response
    }

    /// Hook point (failure): the operation ends without a final answer.
    fn finish_with_stop<R: RetryResponse>(
        self,
        stop: Stop,
        kind: Option<FailureKind>,
        outcome: Outcome<R>,
        number: u32,
    ) -> Error {
        let err = stop_error(
            stop,
            kind,
            self.report.clone(),
            self.may_have_executed,
            &self.policy,
        )
        .with_failure(kind);
        let err = match outcome.result {
            Ok(response) => err.with_response(response.status(), response),
            Err((_, source)) => err.with_source(source),
        };
        tracing::warn!(
            key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
            attempt = number,
            outcome = kind.map_or("final", FailureKind::as_str),
            outcome_unknown = err.is_outcome_unknown(),
            error = %err,
            "operation stopped"
        );
        self.finish_with_error(err)
    }

    /// The transport failed its readiness check before the next attempt: nothing more was
    /// sent, so the outcome is unknown only if an earlier attempt may have run.
    fn finish_not_ready(&mut self, source: BoxError) -> Error {
        self.report.elapsed = self
            .settings
            .clock
            .now()
            .saturating_duration_since(self.state.started);
        let err = Error::operation(
            ErrorKind::Transport,
            self.report.clone(),
            self.may_have_executed,
        )
        .with_failure(Some(FailureKind::Fatal))
        .with_source(source);
        tracing::warn!(
            key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
            attempt = self.state.attempts,
            outcome_unknown = err.is_outcome_unknown(),
            error = %err,
            "the inner service cannot take another attempt; operation stopped"
        );
        self.finish_with_error(err)
    }

    /// The observer to tell at the end of the operation. A run holding a ledger claim has none
    /// here: its front end reports once the ledger's finish has settled what the caller gets.
    fn observer(&self) -> Option<&Arc<dyn Observer>> {
        self.settings
            .observer
            .as_ref()
            .filter(|_| self.ledger.is_none())
    }

    /// Hook point (every error after the key was settled): tells the observer.
    fn finish_with_error(&self, err: Error) -> Error {
        if let Some(observer) = self.observer() {
            observer.on_operation(&OperationEvent {
                key: err.idempotency_key(),
                method: self.method,
                host: self.host,
                attempts: err.attempts(),
                status: err.status(),
                error: Some(err.kind()),
                outcome_unknown: err.is_outcome_unknown(),
                elapsed: err.elapsed(),
                ledger_verdict: None,
            });
        }
        err
    }
}

fn stop_error(
    stop: Stop,
    kind: Option<FailureKind>,
    report: RetryReport,
    unknown: bool,
    policy: &RetryPolicy,
) -> Error {
    match stop {
        Stop::Fatal if kind == Some(FailureKind::TooManyRedirects) => {
            Error::operation(ErrorKind::TooManyRedirects, report, unknown)
        }
        Stop::Exhausted => Error::operation(ErrorKind::AttemptsExhausted, report, unknown),
        Stop::Window => Error::operation(ErrorKind::ReconcileWindow, report, unknown)
            .with_window(policy.get_reconcile_window()),
        Stop::RetryAfterTooLong { asked } => {
            Error::operation(ErrorKind::RetryAfterTooLong, report, unknown).with_retry_after(asked)
        }
        Stop::NotReplayable => Error::operation(ErrorKind::BodyNotReplayable, report, unknown),
        Stop::NotRetrySafe | Stop::Fatal => Error::operation(ErrorKind::Transport, report, unknown),
        Stop::BudgetExhausted => Error::operation(ErrorKind::BudgetExhausted, report, unknown),
    }
}

/// Logs the final response; a 422 on a keyed request (the key reused with another payload, a
/// client bug) at error level, with the key on the event itself so warn/error filters keep it.
fn log_final(status: StatusCode, key: Option<&IdempotencyKey>, attempts: u32) {
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
