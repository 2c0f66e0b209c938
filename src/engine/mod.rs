//! The operation pipeline every front end drives: one sequence of stages, owned here.
//!
//! A front end (the reqwest [`Client`](crate::Client), the tower service, the
//! `reqwest-middleware` middleware) differs from the others only in how one attempt is sent:
//! it implements [`Transport`] for that step, its request and response types implement
//! [`RetryRequest`] and [`RetryResponse`], and it calls [`execute`]. Everything else happens
//! here, once:
//!
//! 1. **settle** (`settle.rs`): the request's overrides, the policy, the key written into the
//!    request before any attempt exists;
//! 2. **claim** (`ledger/session.rs`, with a ledger and a key): the fingerprint, the claim under
//!    a lease, or an answer with nothing sent (the saved response replayed, `KeyReuse`,
//!    `LeaseHeld`, `ReconcileWindow`); the run's window is what earlier runs left of it;
//! 3. **attempts** (`attempts.rs`): send, classify, decide, charge a failed retry and admit the
//!    next one from the budget, record the attempt, wait;
//! 4. **finish** (`ledger/session.rs`): the outcome and the saved response written, the lease
//!    released; a run dropped before this releases its lease on a spawned task;
//! 5. **observe** ([`operation_ended`]): the observers hear how the operation ended, once,
//!    after the ledger has settled what the caller gets.
//!
//! Every stage runs inside the operation's `idempotent_request` span (INTERNAL; its attributes
//! recorded at the end by `telemetry/operation.rs`); each request on the wire gets a CLIENT
//! span under it from the attempts stage (`telemetry/wire.rs`).
//!
//! May import: time, keys, rules, message, outcome, decision, telemetry, ledger.

mod answer;
mod attempts;
pub(crate) mod extension;
pub(crate) mod settings;
mod settle;
pub(crate) mod transport;

use std::time::Duration;

use http::Method;
use tracing::Instrument;

use crate::engine::settings::{Overrides, Settings};
use crate::engine::transport::Transport;
use crate::keys::key::IdempotencyKey;
use crate::ledger::{self, Begin, LedgerHandle};
use crate::message::exchange::{self, RetryRequest, RetryResponse};
use crate::outcome::error::{Error, Target};
use crate::outcome::observe::{LedgerVerdict, OperationEvent};
use crate::outcome::report::RetryReport;
use crate::telemetry::operation;

use attempts::Attempts;
use settle::Settled;

/// Runs one logical operation through every stage.
///
/// Settling happens when the future is first polled, as the rest does. The stages are
/// `async` blocks rather than `async fn`s: an `async fn` keeps its arguments twice in its
/// state (as passed, and as the locals they are moved into), and each stage's state is moved
/// whole into the one that awaits it, so on the way to the first attempt every byte saved is
/// a byte not copied, once per level.
///
/// # Errors
///
/// Whatever stopped the operation, as an [`Error`] with its kind, key, outcome, and the
/// request's method and URL.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice in the future's state"
)]
pub(crate) fn execute<Q, T>(
    settings: &Settings,
    mut request: Q,
    overrides: Overrides,
    transport: T,
) -> impl Future<Output = Result<T::Response, Error>>
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    async move {
        // What every error of the operation names: its method and URL, taken before the
        // request moves into the stages.
        let target = Target::of(&request);
        let settled = match settle::settle(settings, &mut request, overrides) {
            Ok(settled) => settled,
            Err(err) => return Err(err.for_request(target)),
        };
        let span = settled.span.clone();
        // Awaited where it is made: a stages future kept in a local first is copied
        // (kilobytes) into the place it is polled from.
        run(settings, request, settled, transport)
            .instrument(span)
            .await
            .map_err(|err| err.for_request(target))
    }
}

/// The stages after settle.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice in the future's state"
)]
fn run<Q, T>(
    settings: &Settings,
    request: Q,
    mut settled: Settled,
    transport: T,
) -> impl Future<Output = Result<T::Response, Error>>
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    async move {
        // The host outlives the request (moved into the attempts) only for those who read it:
        // the observers' events and the ledger's default scope. Without either, nothing is
        // copied.
        let host = (settings.observer.is_some() || settings.ledger.is_some())
            .then(|| request.host().map(str::to_owned))
            .flatten();
        // The key moves into the stage that reports it: no copy on the way.
        // So is a row a dispatcher took: it moves into the run that holds it.
        let held = settled.held.take();
        let (mut result, verdict) = match (&settings.ledger, settled.key.take()) {
            // Boxed: the claim's and the finish's states are kilobytes that an operation
            // without a ledger would otherwise carry (and copy at every level it is awaited
            // from) for nothing; beside a ledger's write, one allocation is noise.
            (Some(handle), Some(key)) => {
                Box::pin(ledgered(
                    settings,
                    handle,
                    (key, held),
                    request,
                    &settled,
                    host.as_deref(),
                    transport,
                ))
                .await
            }
            (_, key) => {
                let attempts = Attempts::begin(
                    settings,
                    &settled,
                    host.as_deref(),
                    key,
                    settled.policy,
                    None,
                );
                (attempts.run(request, transport).await, None)
            }
        };
        operation::ended(&settled.span, &result, verdict);
        operation_ended(
            settings,
            &settled.method,
            host.as_deref(),
            &mut result,
            verdict,
        );
        result
    }
}

/// Claim, attempts and finish, for a keyed operation with a ledger. Returns how the ledger
/// settled it when nothing was sent.
async fn ledgered<Q, T>(
    settings: &Settings,
    handle: &LedgerHandle,
    (key, held): (IdempotencyKey, Option<crate::ledger::HeldRow>),
    request: Q,
    settled: &Settled,
    host: Option<&str>,
    transport: T,
) -> (Result<T::Response, Error>, Option<LedgerVerdict>)
where
    Q: RetryRequest,
    T: Transport<Q>,
{
    let refused = |err: Error| (Err(err), Some(LedgerVerdict::Refused));
    let Some(fingerprint) = request.fingerprint() else {
        return refused(Error::builder(
            "a request recorded in a ledger needs a buffered body (a stream, or a body type the \
             ledger cannot read, cannot be fingerprinted); nothing was sent",
        ));
    };
    if !ledger::can_replay::<T::Response>() {
        return refused(Error::builder(exchange::not_replayable::<T::Response>()));
    }
    let window = settled.policy.reconcile_window();
    let operation = ledger::Operation {
        key: &key,
        method: settled.method.as_str(),
        scope: settled
            .scope
            .clone()
            .unwrap_or_else(|| host.unwrap_or("").to_owned()),
        fingerprint,
        window,
        attempt_timeout: settled.attempt_timeout,
    };
    let begun = match held {
        // A dispatcher took the row already: the run holds it from the start.
        Some(held) => ledger::resume(handle, &settings.clock, operation, held).await,
        None => {
            ledger::claim(
                handle,
                &settings.clock,
                &*settings.sleeper,
                settings.observer.as_deref(),
                operation,
            )
            .await
        }
    };
    let run = match begun {
        Ok(Begin::Proceed(run)) => run,
        Ok(Begin::Replay(response)) => return (Ok(response), Some(LedgerVerdict::Replayed)),
        Ok(Begin::Refetch { window_left }) => {
            // Sent again with its key, without holding the row: the row keeps its record.
            let mut attempts = Attempts::begin(
                settings,
                settled,
                host,
                Some(key),
                settled.policy.with_reconcile_window(window_left),
                None,
            );
            attempts.refetching();
            return (attempts.run(request, transport).await, None);
        }
        Err(err) => return refused(err),
    };
    // The window counts from the operation's first attempt, in earlier runs included: this
    // run has what is left (zero ends it before its first attempt, with `ReconcileWindow`).
    let left = run.window_left(window, settings.clock.wall());
    // The lease is renewed beside the attempts and the finish, on this task, until the
    // outcome is written.
    let keeper = std::sync::Arc::clone(&run.keeper);
    let finished = ledger::kept(&keeper, async {
        let attempts = Attempts::begin(
            settings,
            settled,
            host,
            Some(key),
            settled.policy.with_reconcile_window(left),
            Some(&run),
        );
        let result = attempts.run(request, transport).await;
        run.finish(result).await
    })
    .await;
    (finished, None)
}

/// The observe stage: tells the observers how the operation ended, once its result is final.
fn operation_ended<R: RetryResponse>(
    settings: &Settings,
    method: &Method,
    host: Option<&str>,
    result: &mut Result<R, Error>,
    ledger_verdict: Option<LedgerVerdict>,
) {
    let Some(observer) = &settings.observer else {
        return;
    };
    let event = match result {
        Ok(response) => {
            let status = response.status();
            let report = response.extensions_mut().get::<RetryReport>();
            OperationEvent {
                key: report.and_then(RetryReport::idempotency_key),
                method,
                host,
                attempts: report.map_or(0, RetryReport::attempts),
                status: Some(status),
                error: None,
                outcome_unknown: false,
                elapsed: report.map_or(Duration::ZERO, RetryReport::elapsed),
                ledger_verdict,
            }
        }
        Err(err) => OperationEvent {
            key: err.idempotency_key(),
            method,
            host,
            attempts: err.attempts(),
            status: err.status(),
            error: Some(err.kind()),
            outcome_unknown: err.is_outcome_unknown(),
            elapsed: err.elapsed(),
            ledger_verdict,
        },
    };
    observer.on_operation(&event);
}
