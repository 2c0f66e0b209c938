//! The attempts stage: send, classify, decide, wait, with the same key on every attempt.
//!
//! One named step per point where an outside concern plugs in:
//!
//! - right after `decide`: the [retry budget](crate::RetryBudget) charges the attempt if it was
//!   a retry that failed, and admits the next retry or turns it into a stop
//!   ([`BudgetTab::admit`]), so the attempt is recorded with what really happens;
//! - [`Attempts::retry_refused`]: the budget refused a retry (the observers'
//!   `on_retry_refused`);
//! - [`Attempts::attempt_starts`]: the ledger counts each attempt as it starts: a retry is
//!   recorded (and the lease renewed) before it is sent, the first attempt is counted by the
//!   finish; a run that lost its lease sends nothing more;
//! - [`Attempts::attempt_ended`]: one attempt's outcome and the decision about it are known
//!   (the report and the observers' `on_attempt`);
//! - [`Attempts::retry_decided`]: a retry is about to wait (an answer that said the operation is
//!   in progress is a wait for it, not counted toward `max_attempts`: `decide.rs`);
//! - `Attempts::finish_with_*`: the stage's result is final. The operation's end (the ledger's
//!   finish, the observers' `on_operation`) belongs to the pipeline in `mod.rs`.

use std::time::Duration;

use http::header::HeaderValue;
use http::{Method, StatusCode};
use tokio::time::Instant;

use crate::decision::budget::BudgetTab;
use crate::decision::decide::{Decision, Observed, OperationState, Stop, decide};
use crate::decision::policy::RetryPolicy;
use crate::engine::settings::{Jitter, Settings};
use crate::engine::transport::{BoxError, SendError, Transport};
use crate::keys::key::{IdempotencyKey, is_idempotent_method};
use crate::ledger::{LedgerError, LedgerRun};
use crate::message::exchange::{RetryRequest, RetryResponse};
use crate::outcome::error::{Error, ErrorKind};
use crate::outcome::exposure::Exposure;
use crate::outcome::observe::{AttemptEvent, RetryRefusedEvent};
use crate::outcome::report::{AttemptRecord, RetryReport, Wait};
use crate::rules::classify::FailureKind;
use crate::rules::window;
use crate::telemetry::{WireTrace, metrics};

use super::settle::Settled;

/// One logical operation's attempts in flight: its policy, state and report.
pub(super) struct Attempts<'s> {
    settings: &'s Settings,
    method: &'s Method,
    host: Option<&'s str>,
    policy: RetryPolicy,
    attempt_timeout: Duration,
    state: OperationState,
    /// Requests sent (or tried), in-progress answers included: the attempt number on the wire,
    /// in the ledger and in the report.
    sent: u32,
    report: RetryReport,
    /// Whether the key was minted at random for this operation (not the caller's).
    minted_key: bool,
    /// Whether the operation may have run, when no ledger run keeps it.
    exposure: Exposure,
    ledger: Option<&'s LedgerRun>,
    budget_tab: BudgetTab<'s>,
    /// The operation's span: each request on the wire gets a CLIENT span under it.
    span: &'s tracing::Span,
}

/// What the engine keeps of one attempt's result until it has decided.
struct Attempted<R> {
    result: Result<R, (FailureKind, BoxError)>,
    status: Option<StatusCode>,
}

impl<'s> Attempts<'s> {
    /// The key is settled and in the request (`key`, moved out of `settled`); nothing has been
    /// sent. `policy` is the run's (with a ledger, its window is what earlier runs left).
    pub(super) fn begin(
        settings: &'s Settings,
        settled: &'s Settled,
        host: Option<&'s str>,
        key: Option<IdempotencyKey>,
        policy: RetryPolicy,
        ledger: Option<&'s LedgerRun>,
    ) -> Self {
        let method = &settled.method;
        let started = settings.clock.now();
        Attempts {
            settings,
            method,
            host,
            policy,
            attempt_timeout: settled.attempt_timeout,
            // Replayable until a clone fails: then the request goes out once, as it is.
            state: OperationState::new(started, key.is_some(), is_idempotent_method(method)),
            sent: 0,
            report: {
                let mut report = RetryReport::new(key);
                report.lease_wait = ledger.map_or(Duration::ZERO, |run| run.lease_wait);
                report
            },
            minted_key: settled.minted_key,
            exposure: Exposure::default(),
            ledger,
            budget_tab: BudgetTab::new(settings.budget.as_ref()),
            span: &settled.span,
        }
    }

    /// The operation is sent again because the ledger did not keep its answer's body: the
    /// report says so.
    pub(super) fn refetching(&mut self) {
        self.report.refetched = true;
    }

    /// What is known of whether the operation ran: the ledger run's, when there is one, so an
    /// abandoned run records it.
    fn exposure(&self) -> &Exposure {
        self.ledger.map_or(&self.exposure, |run| &run.exposure)
    }

    /// The loop: send, classify, decide, wait; the same key on every attempt.
    ///
    /// An `async` block rather than an `async fn`: an `async fn` keeps its arguments twice in
    /// its state (as passed, and as the locals they are moved into), and this state is moved
    /// whole into the future that awaits it.
    pub(super) fn run<Q, T>(
        mut self,
        request: Q,
        mut transport: T,
    ) -> impl Future<Output = Result<T::Response, Error>>
    where
        Q: RetryRequest,
        T: Transport<Q>,
    {
        let mut original = Some(request);
        async move {
            let mut wire = WireTrace::new(self.span.clone(), T::WIRE_SPANS, &self.settings.clock);
            loop {
                if let Err(source) = transport.ready().await {
                    return Err(self.finish_not_ready(source));
                }
                // No attempt is counted (a ledger write) that the window would not let start.
                if self.attempt_budget().is_none() {
                    return Err(self.finish_window_closed());
                }
                if let Some(source) = self.attempt_starts().await {
                    return Err(self.finish_unrecorded(source));
                }
                let now = self.settings.clock.now();
                let Some(budget) = self.attempt_budget() else {
                    return Err(self.finish_window_closed());
                };
                // The attempt's request and the results before `outcome` live in blocks of
                // their own: a local that was borrowed keeps its place in the future's state
                // until its scope ends, whatever awaits come after, and this state is moved
                // whole into the futures that await it.
                let (number, attempt_started, enforced, send) = {
                    let mut attempt = match original
                        .as_ref()
                        .and_then(|original| transport.copy_for_attempt(original))
                    {
                        Some(copy) => copy,
                        None => {
                            self.state.replayable = false;
                            // `decide` stops before a second attempt of a request that cannot
                            // be cloned, so the request is still here for its one attempt.
                            original
                                .take()
                                .expect("a request that cannot be cloned is sent only once")
                        }
                    };
                    let enforced = attempt.set_timeout(budget);
                    // Counted toward `max_attempts` until its answer says the operation is in
                    // progress (`OperationState::after` takes it back out).
                    self.state.attempts += 1;
                    self.sent += 1;
                    let number = self.sent;
                    if let Some(name) = &self.settings.attempt_header {
                        attempt
                            .headers_mut()
                            .insert(name.clone(), HeaderValue::from(number));
                    }
                    let attempt_started = now.saturating_duration_since(self.state.started);

                    self.budget_tab.sending();
                    self.exposure().sending();
                    wire.open(&mut attempt);
                    let send = transport.send_attempt(attempt, original.as_ref(), now, &mut wire);
                    (number, attempt_started, enforced, send)
                };
                // A bounded answer's body is read as part of the attempt, under its timeout: a
                // body cut midway is this attempt's failure (`answer.rs`).
                let (limit, keyed, keep) = (
                    self.settings.answer_read_limit,
                    self.state.keyed,
                    self.ledger.is_some(),
                );
                let send = async move {
                    match send.await {
                        Ok(response) => {
                            super::answer::read_bounded(response, limit, keyed, keep).await
                        }
                        Err(err) => Err(err),
                    }
                };
                let outcome = {
                    let sent = if enforced {
                        send.await
                    } else {
                        match tokio::time::timeout(budget, send).await {
                            Ok(sent) => sent,
                            Err(elapsed) => Err(SendError::Failed {
                                kind: FailureKind::Timeout,
                                source: Box::new(elapsed),
                            }),
                        }
                    };
                    let result = match sent {
                        Ok(response) => {
                            wire.answered(response.status(), response.version());
                            Ok(response)
                        }
                        Err(SendError::Failed { kind, source }) => {
                            wire.failed(kind.as_str());
                            self.exposure().failed(kind);
                            Err((kind, source))
                        }
                        Err(SendError::Refused(err)) => {
                            // Refused before anything went out: the conventions' catch-all.
                            wire.failed("_OTHER");
                            self.exposure().not_sent();
                            self.budget_tab.not_sent();
                            return Err(err);
                        }
                    };
                    Attempted {
                        // An answer whose body was cut still had a status: the history says so.
                        status: match &result {
                            Ok(response) => Some(response.status()),
                            Err((_, source)) => super::answer::cut_status(&**source),
                        },
                        result,
                    }
                };
                let decided_at = self.settings.clock.now();
                let decision = self.decide(&outcome, decided_at);
                let decision = self.budget_tab.admit(decision);
                self.state.after(&decision, decided_at);
                metrics::budget_tokens(self.settings.budget.as_ref());
                if let Decision::Stop {
                    kind: Some(kind),
                    stop: Stop::BudgetExhausted,
                } = decision
                {
                    self.retry_refused(number, kind);
                }
                if outcome.result.is_ok() {
                    // A response is judged by its status: the answer, or a retried or final kind.
                    self.exposure().answered(match decision {
                        Decision::Return => None,
                        Decision::Retry { kind, .. } => Some(kind),
                        Decision::Stop { kind, .. } => kind,
                    });
                }
                self.report.attempts = number;
                self.report.elapsed = decided_at.saturating_duration_since(self.state.started);

                match decision {
                    Decision::Return => {
                        self.attempt_ended(number, attempt_started, outcome.status, None, None);
                        let response = outcome
                            .result
                            .expect("`decide` returns `Return` only for responses");
                        return Ok(self.finish_with_response(response, number));
                    }
                    Decision::Retry {
                        kind,
                        delay,
                        reason,
                    } => {
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
                        // A lease lost during the wait ends it: the next turn stops.
                        crate::ledger::wait_unless_lost(
                            self.ledger.map(|run| &*run.keeper),
                            self.settings.sleeper.sleep(delay),
                        )
                        .await;
                    }
                    Decision::Stop { kind, stop } => {
                        self.attempt_ended(number, attempt_started, outcome.status, kind, None);
                        return Err(self.finish_with_stop(stop, kind, outcome, number));
                    }
                }
            }
        }
    }

    /// Feeds the attempt's outcome to the pure decision.
    fn decide<R: RetryResponse>(&self, outcome: &Attempted<R>, decided_at: Instant) -> Decision {
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
                || settings.clock.wall(),
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
                    || settings.clock.wall(),
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

    /// How long the next attempt may take, from now: its timeout, cut to what is left of the
    /// window; `None` when the window leaves it no time.
    fn attempt_budget(&self) -> Option<Duration> {
        window::attempt_budget(
            self.policy.reconcile_window(),
            self.attempt_timeout,
            self.state.started,
            self.settings.clock.now(),
        )
    }

    /// Hook point (failure): the window ended before the next attempt could start.
    fn finish_window_closed(&mut self) -> Error {
        self.report.elapsed = self
            .settings
            .clock
            .now()
            .saturating_duration_since(self.state.started);
        Error::operation(
            ErrorKind::ReconcileWindow,
            self.report.clone(),
            self.exposure().is_unknown(),
        )
        .with_window(self.policy.reconcile_window())
    }

    /// Hook point: the next attempt is about to start. With a ledger, a run that lost its
    /// lease sends nothing more, and the attempt is counted before it is sent (a retry is
    /// recorded, renewing the lease; the first is counted by the finish). Returns why the
    /// attempt may not be sent.
    async fn attempt_starts(&self) -> Option<LedgerError> {
        let run = self.ledger?;
        if let Some(lost) = run.lease_lost() {
            return Some(lost);
        }
        let at = self.settings.clock.wall();
        run.attempt_starts(self.sent + 1, at).await.err()
    }

    /// Hook point (failure): the next attempt could not be counted in the ledger, or the run
    /// lost its lease, so it was not sent. The caller gets the key, the last status, and
    /// "outcome unknown" whenever an earlier attempt may have run; the row stays in the ledger,
    /// so the next run resumes with the key.
    fn finish_unrecorded(&mut self, source: LedgerError) -> Error {
        self.report.elapsed = self
            .settings
            .clock
            .now()
            .saturating_duration_since(self.state.started);
        let last = self.report.history.last();
        let status = last.and_then(|attempt| attempt.status);
        let failure = last.and_then(|attempt| attempt.failure);
        let lost = self.ledger.is_some_and(|run| run.lease_lost().is_some());
        let message = if lost || source.kind() == crate::ledger::LedgerErrorKind::LeaseLost {
            format!(
                "the run lost its lease, so attempt {} was not sent",
                self.sent + 1
            )
        } else {
            format!(
                "attempt {} could not be recorded, so it was not sent",
                self.sent + 1
            )
        };
        let unknown = self.exposure().is_unknown();
        let err = Error::ledger(self.report.clone(), unknown, message, source)
            .with_status(status)
            .with_failure(failure);
        tracing::warn!(
            key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
            attempt = self.sent,
            outcome_unknown = err.is_outcome_unknown(),
            error = %err,
            "operation stopped by the ledger"
        );
        err
    }

    /// Hook point: the budget refused the retry `decide` chose (the observers'
    /// `on_retry_refused`).
    fn retry_refused(&self, number: u32, kind: FailureKind) {
        metrics::retry_refused(kind);
        if let (Some(observer), Some(budget)) = (&self.settings.observer, &self.settings.budget) {
            observer.on_retry_refused(&RetryRefusedEvent {
                key: self.report.idempotency_key(),
                method: self.method,
                host: self.host,
                attempt: number,
                failure: kind,
                available: budget.available(),
                refused: budget.refused(),
            });
        }
    }

    /// Hook point: a retry is decided and about to wait.
    fn retry_decided(
        &mut self,
        number: u32,
        kind: FailureKind,
        status: Option<StatusCode>,
        wait: Wait,
    ) {
        metrics::retry(kind);
        let delay_ms = u64::try_from(wait.delay.as_millis()).unwrap_or(u64::MAX);
        if kind == FailureKind::InProgress {
            tracing::info!(
                attempt = number,
                outcome = kind.as_str(),
                status = status.map(|s| s.as_u16()),
                delay_ms,
                why = %wait.reason,
                "operation in progress at the receiver, waiting for it with the same key"
            );
        } else {
            tracing::info!(
                attempt = number,
                outcome = kind.as_str(),
                status = status.map(|s| s.as_u16()),
                delay_ms,
                why = %wait.reason,
                "attempt failed, retrying with the same key"
            );
        }
    }

    /// Hook point (success): the response is the answer.
    fn finish_with_response<R: RetryResponse>(mut self, response: R, attempts: u32) -> R {
        self.budget_tab.settle_success();
        metrics::budget_tokens(self.settings.budget.as_ref());
        log_final(
            response.status(),
            self.report.idempotency_key(),
            self.minted_key,
            attempts,
        );
        let mut response = super::answer::note_streamed(
            response,
            self.report.idempotency_key(),
            self.settings.answer_read_limit,
        );
        response.extensions_mut().insert(self.report);
        response
    }

    /// Hook point (failure): the operation ends without a final answer.
    fn finish_with_stop<R: RetryResponse>(
        self,
        stop: Stop,
        kind: Option<FailureKind>,
        outcome: Attempted<R>,
        number: u32,
    ) -> Error {
        let err = stop_error(
            stop,
            kind,
            self.report.clone(),
            self.exposure().is_unknown(),
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
        err
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
            self.exposure().is_unknown(),
        )
        .with_failure(Some(FailureKind::Fatal))
        .with_source(source);
        tracing::warn!(
            key = err.idempotency_key().map_or("", IdempotencyKey::as_str),
            attempt = self.sent,
            outcome_unknown = err.is_outcome_unknown(),
            error = %err,
            "the inner service cannot take another attempt; operation stopped"
        );
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
            .with_window(policy.reconcile_window()),
        Stop::RetryAfterTooLong { asked } => {
            Error::operation(ErrorKind::RetryAfterTooLong, report, unknown).with_retry_after(asked)
        }
        Stop::NotReplayable => Error::operation(ErrorKind::BodyNotReplayable, report, unknown),
        Stop::NotRetrySafe | Stop::Fatal => Error::operation(ErrorKind::Transport, report, unknown),
        Stop::BudgetExhausted => Error::operation(ErrorKind::BudgetExhausted, report, unknown),
        Stop::InProgress { waited, asked } => {
            let err = Error::operation(ErrorKind::StillInProgress, report, unknown)
                .with_in_progress(policy.max_in_progress_wait(), waited);
            match asked {
                Some(asked) => err.with_retry_after(asked),
                None => err,
            }
        }
    }
}

/// Logs the final response. A 422 on a request with the caller's key (the key reused with
/// another payload, a client bug) is logged at error level; with a key `minted` for this
/// operation, which no other request can have carried, it is the server rejecting the request
/// itself, at warn level. Either way the key is on the event itself so warn/error filters keep
/// it.
fn log_final(status: StatusCode, key: Option<&IdempotencyKey>, minted: bool, attempts: u32) {
    match key {
        Some(key) if status == StatusCode::UNPROCESSABLE_ENTITY && !minted => {
            tracing::error!(
                key = key.as_str(),
                attempt = attempts,
                status = status.as_u16(),
                "422 on a keyed request: the key was reused with a different payload"
            );
        }
        Some(key) if status == StatusCode::UNPROCESSABLE_ENTITY => {
            tracing::warn!(
                key = key.as_str(),
                attempt = attempts,
                status = status.as_u16(),
                "422 on a request with an automatic key: the server rejected the request (not \
                 key reuse: the key was minted for this operation); check the payload against \
                 the API"
            );
        }
        _ => {
            tracing::debug!(
                attempt = attempts,
                status = status.as_u16(),
                "final response"
            );
        }
    }
}
