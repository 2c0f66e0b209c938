//! The client's side of the ledger: claim before the first attempt, record after each, finish
//! at the end. Three calls, so they can move into any retry loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{HeaderName, HeaderValue, StatusCode};
use reqwest::ResponseBuilderExt;

use super::body::{Capped, read_capped};
use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerOptions, OperationRecord,
    OperationStatus, SavedResponse, earlier, later, request_fingerprint,
};
use crate::classify::{FailureKind, classify_source_chain};
use crate::engine::Settings;
use crate::error::{Error, ErrorKind};
use crate::key::IdempotencyKey;
use crate::observe::{LedgerVerdict, OperationEvent};
use crate::policy::RetryPolicy;
use crate::report::RetryReport;

/// A client's ledger and how it uses it.
#[derive(Debug, Clone)]
pub(crate) struct LedgerHandle {
    pub(crate) ledger: Arc<dyn Ledger>,
    pub(crate) options: Arc<LedgerOptions>,
}

/// How many times a claim looks again when the row changes between its statements (another
/// run finished or its lease lapsed in that instant).
const CLAIM_ROUNDS: u32 = 3;

/// What to do after consulting the ledger.
#[derive(Debug)]
pub(crate) enum Begin {
    /// No ledger, or no key to record the operation by: send as usual.
    Unledgered,
    /// This run holds the operation: send, recording each attempt.
    Proceed(LedgerSession),
    /// The operation already succeeded: its saved response, nothing sent.
    Replay(reqwest::Response),
}

/// A run that holds an operation's lease.
#[derive(Debug)]
pub(crate) struct LedgerSession {
    handle: LedgerHandle,
    key: IdempotencyKey,
    owner: String,
    first_attempt_at: SystemTime,
    /// An earlier run may have executed the operation.
    prior_unknown: bool,
    attempt_timeout: Duration,
}

/// Claims the operation before its first attempt. Nothing is sent unless this returns
/// `Proceed` (or `Unledgered`). When the ledger settles the operation here (a replay, a
/// refusal, a failed claim), the observer is told, as the engine tells it at the end of a run.
pub(crate) async fn begin_operation(
    client: &Settings,
    request: &reqwest::Request,
    key: Option<&IdempotencyKey>,
    scope: Option<String>,
    policy: &RetryPolicy,
    attempt_timeout: Duration,
) -> Result<Begin, Error> {
    let begun = claim_operation(client, request, key, scope, policy, attempt_timeout).await;
    settled_at_claim(client, request, &begun);
    begun
}

/// Hook point: tells the observer about an operation the ledger settled before any attempt.
fn settled_at_claim(client: &Settings, request: &reqwest::Request, begun: &Result<Begin, Error>) {
    let Some(observer) = &client.observer else {
        return;
    };
    let method = request.method();
    let host = request.url().host_str();
    let event = match begun {
        Ok(Begin::Unledgered | Begin::Proceed(_)) => return,
        Ok(Begin::Replay(response)) => OperationEvent {
            key: RetryReport::of(response).and_then(RetryReport::idempotency_key),
            method,
            host,
            attempts: 0,
            status: Some(response.status()),
            error: None,
            outcome_unknown: false,
            elapsed: Duration::ZERO,
            ledger_verdict: Some(LedgerVerdict::Replayed),
        },
        Err(err) => OperationEvent {
            key: err.idempotency_key(),
            method,
            host,
            attempts: 0,
            status: err.status(),
            error: Some(err.kind()),
            outcome_unknown: err.is_outcome_unknown(),
            elapsed: Duration::ZERO,
            ledger_verdict: Some(LedgerVerdict::Refused),
        },
    };
    observer.on_operation(&event);
}

/// Hook point: tells the observer how a run that held the claim ended, once the ledger's
/// finish has settled what the caller gets (it may turn a response into an
/// [`ErrorKind::Ledger`] error, or mark an error's outcome unknown because of an earlier run).
pub(crate) fn finished(
    client: &Settings,
    method: &http::Method,
    host: Option<&str>,
    result: &Result<reqwest::Response, Error>,
) {
    let Some(observer) = &client.observer else {
        return;
    };
    let event = match result {
        Ok(response) => {
            let report = RetryReport::of(response);
            OperationEvent {
                key: report.and_then(RetryReport::idempotency_key),
                method,
                host,
                attempts: report.map_or(0, RetryReport::attempts),
                status: Some(response.status()),
                error: None,
                outcome_unknown: false,
                elapsed: report.map_or(Duration::ZERO, RetryReport::elapsed),
                ledger_verdict: None,
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
            ledger_verdict: None,
        },
    };
    observer.on_operation(&event);
}

async fn claim_operation(
    client: &Settings,
    request: &reqwest::Request,
    key: Option<&IdempotencyKey>,
    scope: Option<String>,
    policy: &RetryPolicy,
    attempt_timeout: Duration,
) -> Result<Begin, Error> {
    let (Some(handle), Some(key)) = (&client.ledger, key) else {
        return Ok(Begin::Unledgered);
    };
    let Some(fingerprint) = request_fingerprint(request) else {
        return Err(Error::builder(
            "a request recorded in a ledger needs a buffered body (a stream cannot be fingerprinted)",
        ));
    };
    let options = &handle.options;
    let scope = scope.unwrap_or_else(|| request.url().host_str().unwrap_or("").to_owned());
    let window = policy.get_reconcile_window();
    let retention = options.retention_for(&scope).max(window.saturating_mul(2));
    let owner = format!("{}/{}", options.worker, IdempotencyKey::random());
    let mut waited = Duration::ZERO;
    let mut rounds = 0;
    loop {
        let now = client.clock.wall();
        let claim = Claim {
            key: key.as_str().to_owned(),
            scope: scope.clone(),
            fingerprint: fingerprint.clone(),
            owner: owner.clone(),
            now,
            lease_until: later(now, attempt_timeout.saturating_add(options.lease_slack)),
            expires_at: later(now, retention),
            window_cutoff: earlier(now, window),
        };
        let claimed = handle.ledger.claim(&claim).await.map_err(|source| {
            Error::ledger(
                RetryReport::new(Some(key.clone())),
                false,
                "could not claim the operation; nothing was sent",
                source,
            )
        })?;
        let existing = match claimed {
            Claimed::New(record) => {
                return Ok(Begin::Proceed(session(
                    handle,
                    key,
                    owner,
                    &record,
                    false,
                    attempt_timeout,
                )));
            }
            Claimed::TakenOver { record, previous } => {
                let prior_unknown = matches!(
                    previous,
                    OperationStatus::Unknown | OperationStatus::InFlight
                );
                tracing::info!(
                    key = key.as_str(),
                    previous = previous.as_str(),
                    attempts = record.attempts,
                    "resuming an operation recorded in the ledger"
                );
                return Ok(Begin::Proceed(session(
                    handle,
                    key,
                    owner,
                    &record,
                    prior_unknown,
                    attempt_timeout,
                )));
            }
            Claimed::Existing(record) => record,
        };
        let report = RetryReport::new(Some(key.clone()));
        if existing.fingerprint != fingerprint {
            tracing::error!(
                key = key.as_str(),
                scope = existing.scope.as_str(),
                "idempotency key reused for a different request"
            );
            return Err(Error::operation(ErrorKind::KeyReuse, report, false).with_message(
                format!(
                    "the ledger holds key {key} for a different request (scope {}); nothing was sent",
                    existing.scope
                ),
            ));
        }
        if existing.status == OperationStatus::Succeeded {
            return replay(&existing, request, key).map(Begin::Replay);
        }
        let unresolved = matches!(
            existing.status,
            OperationStatus::Unknown | OperationStatus::InFlight
        );
        if existing.first_attempt_at <= claim.window_cutoff {
            return Err(
                Error::operation(ErrorKind::ReconcileWindow, report, unresolved)
                    .with_window(window)
                    .with_message(format!(
                        "first attempted {} ago",
                        humantime_ago(now, existing.first_attempt_at)
                    )),
            );
        }
        let live_lease = existing.status == OperationStatus::InFlight
            && existing.lease_expires_at.is_some_and(|until| until > now);
        if live_lease {
            if let super::InProgressPolicy::Wait { poll, max_wait } = options.in_progress
                && waited < max_wait
                && !poll.is_zero()
            {
                let step = poll.min(max_wait - waited);
                client.sleeper.sleep(step).await;
                waited += step;
                continue;
            }
            return Err(
                Error::operation(ErrorKind::InProgress, report, true).with_message(format!(
                    "held by {} until {} ms after the epoch; nothing was sent",
                    existing.lease_owner.as_deref().unwrap_or("?"),
                    existing.lease_expires_at.map_or(0, super::to_millis)
                )),
            );
        }
        // The row changed between the claim's statements: look again.
        rounds += 1;
        if rounds >= CLAIM_ROUNDS {
            return Err(Error::operation(ErrorKind::InProgress, report, unresolved)
                .with_message("the operation's row kept changing; nothing was sent"));
        }
    }
}

fn session(
    handle: &LedgerHandle,
    key: &IdempotencyKey,
    owner: String,
    record: &OperationRecord,
    prior_unknown: bool,
    attempt_timeout: Duration,
) -> LedgerSession {
    LedgerSession {
        handle: handle.clone(),
        key: key.clone(),
        owner,
        first_attempt_at: record.first_attempt_at,
        prior_unknown,
        attempt_timeout,
    }
}

fn humantime_ago(now: SystemTime, then: SystemTime) -> String {
    format!("{:?}", now.duration_since(then).unwrap_or_default())
}

/// The saved response of a succeeded operation, as a response; no request is sent.
fn replay(
    record: &OperationRecord,
    request: &reqwest::Request,
    key: &IdempotencyKey,
) -> Result<reqwest::Response, Error> {
    let corrupt = |what: String| {
        Error::ledger(
            RetryReport::new(Some(key.clone())),
            false,
            "could not replay the saved response; nothing was sent",
            LedgerError::corrupt(what),
        )
    };
    let Some(saved) = &record.response else {
        return Err(corrupt(format!(
            "succeeded operation {key} has no saved response"
        )));
    };
    let status = StatusCode::from_u16(saved.status)
        .map_err(|_| corrupt(format!("saved status {} is not a status", saved.status)))?;
    let mut builder = http::Response::builder()
        .status(status)
        .url(request.url().clone());
    for (name, value) in &saved.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| corrupt(format!("saved header name {name:?} is invalid")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| corrupt(format!("saved header value {value:?} is invalid")))?;
        builder = builder.header(name, value);
    }
    let body = saved.body.clone().unwrap_or_default();
    let response = builder
        .body(body)
        .map_err(|err| corrupt(format!("saved response cannot be rebuilt: {err}")))?;
    let mut response = reqwest::Response::from(response);
    let mut report = RetryReport::new(Some(key.clone()));
    report.replayed = true;
    report.replay_body_missing = saved.body.is_none();
    tracing::info!(
        key = key.as_str(),
        status = status.as_u16(),
        "replayed the saved response; no request sent"
    );
    response.extensions_mut().insert(report);
    Ok(response)
}

impl LedgerSession {
    /// The policy for this run: its reconcile window shortened by the time that passed since
    /// the operation's first attempt, in earlier runs included.
    pub(crate) fn remaining_window(&self, policy: RetryPolicy, now: SystemTime) -> RetryPolicy {
        let spent = now
            .duration_since(self.first_attempt_at)
            .unwrap_or_default();
        let window = policy.get_reconcile_window();
        policy.reconcile_window(window.saturating_sub(spent))
    }

    /// Records one attempt that just ended, and renews the lease past the wait and the next
    /// attempt (`wait` is `None` when no attempt follows).
    pub(crate) async fn record_attempt(
        &self,
        at: SystemTime,
        wait: Option<Duration>,
    ) -> Result<(), LedgerError> {
        let reach = wait
            .unwrap_or_default()
            .saturating_add(self.attempt_timeout)
            .saturating_add(self.handle.options.lease_slack);
        let update = AttemptUpdate {
            key: self.key.as_str().to_owned(),
            owner: self.owner.clone(),
            at,
            lease_until: later(at, reach),
        };
        self.handle.ledger.record_attempt(&update).await
    }

    /// Writes the run's outcome and releases the lease. A response's body is read to save it,
    /// up to [`LedgerOptions::max_body`] (a longer one is handed back unread past that point
    /// and not saved), then handed back. When the outcome cannot be written, the caller gets an
    /// [`ErrorKind::Ledger`] error carrying the key (and the response, when there was one).
    pub(crate) async fn finish(
        &self,
        result: Result<reqwest::Response, Error>,
    ) -> Result<reqwest::Response, Error> {
        match result {
            Ok(response) => self.finish_response(response).await,
            Err(err) => self.finish_error(err).await,
        }
    }

    async fn finish_error(&self, mut err: Error) -> Result<reqwest::Response, Error> {
        if self.prior_unknown {
            err.mark_outcome_unknown();
        }
        let status = if err.is_outcome_unknown() {
            OperationStatus::Unknown
        } else {
            OperationStatus::FailedFinal
        };
        match self.write(status, None).await {
            Ok(()) => Err(err),
            // The run already failed over the ledger: that error says it all.
            Err(_) if err.kind() == ErrorKind::Ledger => Err(err),
            Err(source) => {
                let unknown = err.is_outcome_unknown();
                let response = err.take_response();
                let message = format!("the operation's outcome ({err}) could not be recorded");
                let ledger_err = Error::ledger(err.report().clone(), unknown, message, source);
                Err(match response {
                    Some(response) => ledger_err.with_response(response.status(), response),
                    None => ledger_err,
                })
            }
        }
    }

    async fn finish_response(
        &self,
        mut response: reqwest::Response,
    ) -> Result<reqwest::Response, Error> {
        let report = response
            .extensions_mut()
            .remove::<RetryReport>()
            .unwrap_or_else(|| RetryReport::new(Some(self.key.clone())));
        let status = response.status();
        let version = response.version();
        let url = response.url().clone();
        let headers = response.headers().clone();
        let options = &self.handle.options;
        // Read no more than the ledger saves: a longer body goes back to the caller unread
        // past the cap, and is not saved.
        let (saved_body, body) =
            match read_capped(reqwest::Body::from(response), options.max_body).await {
                Ok(Capped::Whole(bytes)) => (Some(bytes.to_vec()), reqwest::Body::from(bytes)),
                Ok(Capped::Over(body)) => (None, body),
                Err(source) => {
                    // The server answered, but the answer was cut or stalled: it may well have run.
                    let failure = if source.is_timeout() {
                        FailureKind::Timeout
                    } else {
                        classify_source_chain(&source).unwrap_or(FailureKind::ConnectionClosed)
                    };
                    let err = Error::operation(ErrorKind::Transport, report, true)
                        .with_failure(Some(failure))
                        .with_source(source);
                    return self.finish_error(err).await;
                }
            };
        let saved = SavedResponse {
            status: status.as_u16(),
            headers: options
                .saved_headers
                .iter()
                .flat_map(|name| {
                    headers.get_all(name).iter().filter_map(move |value| {
                        value
                            .to_str()
                            .ok()
                            .map(|value| (name.as_str().to_owned(), value.to_owned()))
                    })
                })
                .collect(),
            body: saved_body,
        };
        let outcome = outcome_of(status);
        let written = self.write(outcome, Some(saved)).await;
        let mut rebuilt = http::Response::builder()
            .status(status)
            .version(version)
            .url(url);
        if let Some(slot) = rebuilt.headers_mut() {
            *slot = headers;
        }
        let mut rebuilt = match rebuilt.body(body) {
            Ok(rebuilt) => reqwest::Response::from(rebuilt),
            // Unreachable: every part came from a valid response.
            Err(err) => {
                return Err(Error::operation(ErrorKind::Transport, report, true).with_source(err));
            }
        };
        match written {
            Ok(()) => {
                rebuilt.extensions_mut().insert(report);
                Ok(rebuilt)
            }
            Err(source) => Err(Error::ledger(
                report,
                true,
                "the response arrived but could not be recorded",
                source,
            )
            .with_response(status, rebuilt)),
        }
    }

    async fn write(
        &self,
        status: OperationStatus,
        response: Option<SavedResponse>,
    ) -> Result<(), LedgerError> {
        let finish = Finish {
            key: self.key.as_str().to_owned(),
            owner: self.owner.clone(),
            status,
            response,
        };
        self.handle.ledger.finish(&finish).await
    }
}

/// What a final response says about the operation. Below 400 it ran and is replayed from now
/// on, except a redirect that was not followed (301, 302, 307, 308: the policy refused the
/// hop, or it had no usable `Location`): that server only pointed elsewhere and ran nothing, so
/// a later run, perhaps allowed to follow it, sends the operation again with the same key. A
/// 303 points at the result of an operation that ran, so it counts as done.
fn outcome_of(status: StatusCode) -> OperationStatus {
    let unfollowed_redirect = matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    );
    if status.as_u16() < 400 && !unfollowed_redirect {
        OperationStatus::Succeeded
    } else {
        OperationStatus::FailedFinal
    }
}
