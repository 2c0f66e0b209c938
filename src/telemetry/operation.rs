//! The operation's INTERNAL span: what the caller asked for, and at its end how it went.
//!
//! The logical operation is not an HTTP client span (the conventions keep that kind for each
//! request on the wire, `wire.rs`); its own attributes are namespaced `idempotent_retry.*`.

use http::Method;
use tracing::field::Empty;

use crate::keys::key::IdempotencyKey;
use crate::message::exchange::RetryResponse;
use crate::outcome::error::Error;
use crate::outcome::observe::LedgerVerdict;
use crate::outcome::operation_outcome::Outcome;
use crate::outcome::report::RetryReport;

use super::metrics;

/// Opens the `idempotent_request` span of one operation. The key is an attribute only when
/// `with_key` (the caller opted in: a key can be derived from private inputs, and it is one
/// value per operation in every backend that indexes attributes).
pub(crate) fn open(
    method: &Method,
    host: Option<&str>,
    key: Option<&IdempotencyKey>,
    with_key: bool,
) -> tracing::Span {
    tracing::info_span!(
        "idempotent_request",
        otel.kind = "internal",
        otel.status_code = Empty,
        http.request.method = %method,
        server.address = host.unwrap_or(""),
        idempotent_retry.idempotency_key = key.filter(|_| with_key).map(IdempotencyKey::as_str),
        idempotent_retry.attempts = Empty,
        idempotent_retry.outcome = Empty,
        idempotent_retry.stop_reason = Empty,
    )
}

/// Records how the operation ended: on the span, attempts, outcome, why it stopped and an
/// error status when it ended without a response; the operation and ledger counters (feature
/// `metrics`).
pub(crate) fn ended<R: RetryResponse>(
    span: &tracing::Span,
    result: &Result<R, Error>,
    verdict: Option<LedgerVerdict>,
) {
    // Nothing records it: no report to look up.
    if span.is_disabled() && !cfg!(feature = "metrics") {
        return;
    }
    let (attempts, stop) = match result {
        Ok(response) => {
            let report = response.extensions().and_then(RetryReport::from_extensions);
            let replayed = verdict == Some(LedgerVerdict::Replayed)
                || report.is_some_and(RetryReport::is_replayed);
            (
                report.map_or(0, RetryReport::attempts),
                if replayed { "replayed" } else { "answered" },
            )
        }
        Err(err) => (err.attempts(), err.kind().as_str()),
    };
    let outcome = Outcome::of(result).as_str();
    metrics::operation(outcome, stop);
    match verdict {
        Some(LedgerVerdict::Replayed) => metrics::ledger_replay(),
        Some(LedgerVerdict::Refused) => metrics::ledger_refusal(stop),
        None => {}
    }
    if span.is_disabled() {
        return;
    }
    if result.is_err() {
        span.record("otel.status_code", "error");
    }
    span.record("idempotent_retry.attempts", attempts);
    span.record("idempotent_retry.outcome", outcome);
    span.record("idempotent_retry.stop_reason", stop);
}
