//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`); every
//! function here does nothing without the feature. Names, units and labels: the crate docs'
//! [metrics table](crate#metrics).
//!
//! Why the `metrics` facade and not the OpenTelemetry metrics API: `docs/observability.md`.

use std::time::Duration;

#[cfg(feature = "metrics")]
use http::StatusCode;
#[cfg(feature = "metrics")]
use metrics::Label;

use crate::decision::budget::RetryBudget;
use crate::rules::classify::FailureKind;

/// Histogram, seconds: each request on the wire.
#[cfg(feature = "metrics")]
pub(crate) const REQUEST_DURATION: &str = "http.client.request.duration";
/// Counter: operations ended, by `outcome` and `stop_reason`.
#[cfg(feature = "metrics")]
pub(crate) const OPERATIONS: &str = "idempotent_retry.operations";
/// Counter: retries decided, by `reason`.
#[cfg(feature = "metrics")]
pub(crate) const RETRIES: &str = "idempotent_retry.retries";
/// Counter: retries the budget refused, by `reason`.
#[cfg(feature = "metrics")]
pub(crate) const RETRIES_REFUSED: &str = "idempotent_retry.retries.refused";
/// Counter: operations answered from the ledger, nothing sent.
#[cfg(feature = "metrics")]
pub(crate) const LEDGER_REPLAYS: &str = "idempotent_retry.ledger.replays";
/// Counter: operations the ledger refused, nothing sent, by `reason`.
#[cfg(feature = "metrics")]
pub(crate) const LEDGER_REFUSALS: &str = "idempotent_retry.ledger.refusals";
/// Gauge: tokens in the retry budget.
#[cfg(feature = "metrics")]
pub(crate) const BUDGET_TOKENS: &str = "idempotent_retry.budget.tokens";
/// Gauge, seconds: the ledger's clock minus this worker's, for a ledger on its own clock.
#[cfg(feature = "metrics")]
pub(crate) const LEDGER_CLOCK_OFFSET: &str = "idempotent_retry.ledger.clock_offset";

/// Gauge: operations queued in the outbox and not yet taken.
#[cfg(feature = "metrics")]
pub(crate) const OUTBOX_QUEUED: &str = "idempotent_retry.outbox.queued";
/// Gauge, seconds: how long the oldest queued operation has waited.
#[cfg(feature = "metrics")]
pub(crate) const OUTBOX_OLDEST_AGE: &str = "idempotent_retry.outbox.oldest_age";
/// Counter: operations a dispatcher sent, by `outcome`.
#[cfg(feature = "metrics")]
pub(crate) const OUTBOX_DELIVERED: &str = "idempotent_retry.outbox.delivered";

/// Tells the installed recorder each metric's unit and meaning. Called when a front end's
/// settings are built, so a recorder installed before the client hears it.
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::Unit;
        metrics::describe_histogram!(
            REQUEST_DURATION,
            Unit::Seconds,
            "Duration of HTTP client requests: each request on the wire, attempt or redirect hop"
        );
        metrics::describe_counter!(OPERATIONS, "Operations ended, by outcome and stop reason");
        metrics::describe_counter!(RETRIES, "Retries decided, by the failure that caused them");
        metrics::describe_counter!(RETRIES_REFUSED, "Retries the retry budget refused");
        metrics::describe_counter!(LEDGER_REPLAYS, "Operations answered from the ledger");
        metrics::describe_counter!(LEDGER_REFUSALS, "Operations the ledger refused");
        metrics::describe_gauge!(BUDGET_TOKENS, "Tokens in the retry budget");
        metrics::describe_gauge!(
            LEDGER_CLOCK_OFFSET,
            Unit::Seconds,
            "The ledger's clock minus this worker's, as last measured"
        );
        metrics::describe_gauge!(
            OUTBOX_QUEUED,
            "Operations queued in the outbox, not yet taken"
        );
        metrics::describe_gauge!(
            OUTBOX_OLDEST_AGE,
            Unit::Seconds,
            "How long the oldest queued operation has waited"
        );
        metrics::describe_counter!(OUTBOX_DELIVERED, "Queued operations sent, by outcome");
    }
}

/// One request on the wire being timed: its method and URL as they were when it was sent.
/// The labels are made from them only when the duration is recorded, each value moved into its
/// label rather than copied again, and the static ones (method, protocol version, error type)
/// borrowed as they are.
#[cfg(feature = "metrics")]
#[derive(Debug)]
pub(crate) struct RequestTimer {
    method: &'static str,
    url: Option<reqwest::Url>,
}

#[cfg(feature = "metrics")]
impl RequestTimer {
    /// A request with this method to `url`.
    pub(crate) fn new(method: &'static str, url: Option<reqwest::Url>) -> Self {
        RequestTimer { method, url }
    }

    /// The labels known when the request was sent, with room for `more`.
    fn labels(&self, more: usize) -> Vec<Label> {
        let mut labels = Vec::with_capacity(3 + more);
        labels.push(Label::from_static_parts("http.request.method", self.method));
        if let Some(url) = &self.url {
            labels.push(Label::new(
                "server.address",
                url.host_str().unwrap_or("").to_owned(),
            ));
            if let Some(port) = url.port_or_known_default() {
                labels.push(Label::new("server.port", port.to_string()));
            }
        }
        labels
    }

    /// Records a request that got a response after `took`.
    pub(crate) fn answered(
        self,
        status: StatusCode,
        version: Option<&'static str>,
        took: Duration,
    ) {
        let mut labels = self.labels(3);
        let code = status.as_str();
        labels.push(Label::new("http.response.status_code", code.to_owned()));
        if status.as_u16() >= 400 {
            labels.push(Label::new("error.type", code.to_owned()));
        }
        if let Some(version) = version {
            labels.push(Label::from_static_parts(
                "network.protocol.version",
                version,
            ));
        }
        metrics::histogram!(REQUEST_DURATION, labels).record(took.as_secs_f64());
    }

    /// Records a request that failed as `error_type` after `took`.
    pub(crate) fn failed(self, error_type: &'static str, took: Duration) {
        let mut labels = self.labels(1);
        labels.push(Label::from_static_parts("error.type", error_type));
        metrics::histogram!(REQUEST_DURATION, labels).record(took.as_secs_f64());
    }
}

/// An operation ended.
pub(crate) fn operation(outcome: &'static str, stop_reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(OPERATIONS, "outcome" => outcome, "stop_reason" => stop_reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (outcome, stop_reason);
}

/// The ledger answered an operation from its saved response.
pub(crate) fn ledger_replay() {
    #[cfg(feature = "metrics")]
    metrics::counter!(LEDGER_REPLAYS).increment(1);
}

/// The ledger refused an operation (`reason`: the error kind's name).
pub(crate) fn ledger_refusal(reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(LEDGER_REFUSALS, "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = reason;
}

/// A retry was decided after a failure of `kind`.
pub(crate) fn retry(kind: FailureKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!(RETRIES, "reason" => kind.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// The budget refused a retry after a failure of `kind`.
pub(crate) fn retry_refused(kind: FailureKind) {
    #[cfg(feature = "metrics")]
    metrics::counter!(RETRIES_REFUSED, "reason" => kind.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// The offset of the ledger's clock from this worker's, in seconds, as just measured.
pub(crate) fn ledger_clock_offset(seconds: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(LEDGER_CLOCK_OFFSET).set(seconds);
    #[cfg(not(feature = "metrics"))]
    let _ = seconds;
}

/// Whether a dispatcher should read the backlog for the gauges: only with the feature.
pub(crate) const OUTBOX_GAUGES: bool = cfg!(feature = "metrics");

/// The outbox's backlog, as a dispatcher just read it.
pub(crate) fn outbox_backlog(queued: u64, oldest_age: Option<Duration>) {
    #[cfg(feature = "metrics")]
    {
        #[allow(clippy::cast_precision_loss, reason = "a gauge of rows")]
        metrics::gauge!(OUTBOX_QUEUED).set(queued as f64);
        metrics::gauge!(OUTBOX_OLDEST_AGE).set(oldest_age.unwrap_or_default().as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (queued, oldest_age);
}

/// One queued operation sent, with its outcome (`done`, `not_done`, `unknown`).
pub(crate) fn outbox_delivered(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(OUTBOX_DELIVERED, "outcome" => outcome).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = outcome;
}

/// The budget's tokens, after it admitted, charged or was paid.
pub(crate) fn budget_tokens(budget: Option<&RetryBudget>) {
    #[cfg(feature = "metrics")]
    if let Some(budget) = budget {
        metrics::gauge!(BUDGET_TOKENS).set(f64::from(budget.available()));
    }
    #[cfg(not(feature = "metrics"))]
    let _ = budget;
}
