//! The dispatcher: reads the operations that are due from the client's ledger and sends each
//! through the client under its stored key, a bounded number at once, until told to stop.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::keys::key::IdempotencyKey;
use crate::ledger::LedgerError;
use crate::ledger::outbox::{Backlog, DueQuery, QueuedOperation};
use crate::outcome::error::{Error, ErrorKind};
use crate::outcome::operation_outcome::Outcome;
use crate::outcome::report::RetryReport;
use crate::telemetry::metrics;

/// Headers added to an operation at send time (its credentials).
type HeaderSource = Arc<dyn Fn(&QueuedOperation) -> HeaderMap + Send + Sync>;
/// Run after an operation's outcome is written.
type OutcomeHook = Arc<dyn Fn(&Delivery) + Send + Sync>;

/// How one queued operation's send ended, as the ledger recorded it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// Its idempotency key.
    pub key: String,
    /// Its ledger scope.
    pub scope: String,
    /// Done (with the final status), not done, or unknown (then the reconcilers resolve it).
    pub outcome: Outcome,
    /// Whether the answer was the ledger's, nothing sent (another dispatcher, or the caller,
    /// had sent it).
    pub replayed: bool,
    /// Why it ended without a final answer, for people.
    pub error: Option<String>,
    /// The error's kind, when it ended with one.
    pub error_kind: Option<ErrorKind>,
}

/// What one pass of [`Dispatcher::dispatch_due`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchPass {
    /// Operations found due and sent (or answered from the ledger).
    pub due: usize,
    /// Ended with a final answer.
    pub done: usize,
    /// Ended certainly not done (no attempt can have run; sent again later when no receiver
    /// saw it).
    pub not_done: usize,
    /// Ended with the outcome unknown: the reconcilers' now.
    pub unknown: usize,
}

/// Sends the operations queued through the outbox ([`Enqueue`](super::Enqueue)) once their
/// transactions have committed: each under its stored key, through the client (its policy,
/// retry budget, `Retry-After`, window and ledger), the outcome written to its row.
///
/// Any number of dispatchers, in one process or many, may share a ledger: the client's claim
/// lets one send a row at a time, and one that meets a row another is sending waits for its
/// answer (the client's [`LeaseHeldPolicy`](crate::ledger::LeaseHeldPolicy)).
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`batch`](Self::batch) | 64 due rows read per pass |
/// | [`concurrency`](Self::concurrency) | 16 sends at once |
/// | [`idle_poll`](Self::idle_poll) | 1 s between passes that found less than a batch |
/// | [`not_sent_after`](Self::not_sent_after) | 30 s |
/// | [`resend_unknown_after`](Self::resend_unknown_after) | never |
/// | [`headers_for`](Self::headers_for) | none: the client's default headers only |
/// | [`on_outcome`](Self::on_outcome) | none |
#[derive(Clone)]
pub struct Dispatcher {
    client: Client,
    batch: u32,
    concurrency: usize,
    idle_poll: Duration,
    headers_for: Option<HeaderSource>,
    on_outcome: Option<OutcomeHook>,
    wake: Arc<Notify>,
    not_sent_after: Duration,
    unknown_after: Option<Duration>,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .field("idle_poll", &self.idle_poll)
            .field("not_sent_after", &self.not_sent_after)
            .field("resend_unknown_after", &self.unknown_after)
            .field("headers_for", &self.headers_for.is_some())
            .field("on_outcome", &self.on_outcome.is_some())
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher sending through `client`, whose ledger holds the queue.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`] when the client has no ledger.
    pub fn new(client: Client) -> Result<Dispatcher, Error> {
        if client.ledger().is_none() {
            return Err(Error::builder(
                "a Dispatcher sends the operations queued in a ledger: build the client with \
                 ClientBuilder::ledger (the SqliteLedger or PostgresLedger the operations \
                 were queued in)",
            ));
        }
        Ok(Dispatcher {
            client,
            batch: 64,
            concurrency: 16,
            idle_poll: Duration::from_secs(1),
            headers_for: None,
            on_outcome: None,
            wake: Arc::new(Notify::new()),
            not_sent_after: Duration::from_secs(30),
            unknown_after: None,
        })
    }

    /// At most this many due rows read per pass (at least 1). Default: 64.
    #[must_use]
    pub fn batch(mut self, rows: u32) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// At most this many sends at once (at least 1). Default: 16.
    #[must_use]
    pub fn concurrency(mut self, sends: usize) -> Self {
        self.concurrency = sends.max(1);
        self
    }

    /// How long [`run_until`](Self::run_until) waits after a pass that found less than a
    /// batch, unless [`waker`](Self::waker) is notified first. Default: 1 s.
    #[must_use]
    pub fn idle_poll(mut self, wait: Duration) -> Self {
        self.idle_poll = wait;
        self
    }

    /// How long after its last attempt an operation no receiver saw (every attempt failed to
    /// connect, or an operator released it) is sent again. Default: 30 s.
    #[must_use]
    pub fn not_sent_after(mut self, wait: Duration) -> Self {
        self.not_sent_after = wait;
        self
    }

    /// Sends an operation whose outcome is unknown again under its key, this long after its
    /// last attempt, as the client's own retries would: for a receiver that keeps its keys at
    /// least as long as the client's reconcile window (Stripe's keep them 24 hours), so the
    /// send is answered from its store if the first one ran. Past the window the client
    /// refuses (`ReconcileWindow`) and the row stays unknown. Default: never (unknown outcomes
    /// are the reconcilers', `Client::reconcile_unresolved`).
    #[must_use]
    pub fn resend_unknown_after(mut self, wait: Duration) -> Self {
        self.unknown_after = Some(wait);
        self
    }

    /// Headers added to each operation at send time: its credentials, which the ledger never
    /// stores (`Authorization` for its scope, say). They replace stored headers of the same
    /// name. Default: none.
    #[must_use]
    pub fn headers_for(
        mut self,
        source: impl Fn(&QueuedOperation) -> HeaderMap + Send + Sync + 'static,
    ) -> Self {
        self.headers_for = Some(Arc::new(source));
        self
    }

    /// Run after each operation's outcome is written to the ledger (so a hook that fails or
    /// a process that dies in it loses nothing: the row says what happened). Default: none.
    #[must_use]
    pub fn on_outcome(mut self, hook: impl Fn(&Delivery) + Send + Sync + 'static) -> Self {
        self.on_outcome = Some(Arc::new(hook));
        self
    }

    /// Wakes [`run_until`](Self::run_until) from its idle wait: notify it after a commit
    /// that queued something, or from a PostgreSQL `LISTEN` on
    /// `idempotent_retry_queued` (`outbox::postgres::listen`, feature `postgres`).
    #[must_use]
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// One pass: the rows due now (at most a batch), each sent through the client, at most
    /// [`concurrency`](Self::concurrency) at once. Returns when every send has ended.
    /// Dropping the future abandons the sends in progress: each gives its lease back at once,
    /// its row left not sent (sent again 30 s later) or unknown (for the reconcilers).
    ///
    /// # Errors
    ///
    /// The ledger's error when the due rows cannot be read (nothing was sent).
    pub async fn dispatch_due(&self) -> Result<DispatchPass, LedgerError> {
        let Some(ledger) = self.client.ledger() else {
            return Ok(DispatchPass::default());
        };
        let now = self.client.inner.settings.clock.wall();
        let query = DueQuery::new(now, self.batch)
            .not_sent_after(self.not_sent_after)
            .unknown_after(self.unknown_after);
        let due = ledger.due(&query).await?;
        let mut pass = DispatchPass {
            due: due.len(),
            ..DispatchPass::default()
        };
        let mut waiting = due.into_iter();
        let mut sending = JoinSet::new();
        loop {
            while sending.len() < self.concurrency {
                let Some(operation) = waiting.next() else {
                    break;
                };
                sending.spawn(deliver(
                    self.client.clone(),
                    operation,
                    self.headers_for.clone(),
                ));
            }
            let Some(joined) = sending.join_next().await else {
                break;
            };
            let delivery = joined.unwrap_or_else(|join| Delivery {
                key: String::new(),
                scope: String::new(),
                outcome: Outcome::Unknown { key: None },
                replayed: false,
                error: Some(format!("the send's task ended without an answer: {join}")),
                error_kind: None,
            });
            let outcome = match delivery.outcome {
                Outcome::Done { .. } => {
                    pass.done += 1;
                    "done"
                }
                Outcome::NotDone { .. } => {
                    pass.not_done += 1;
                    "not_done"
                }
                Outcome::Unknown { .. } => {
                    pass.unknown += 1;
                    "unknown"
                }
            };
            metrics::outbox_delivered(outcome);
            if let Some(hook) = &self.on_outcome {
                hook(&delivery);
            }
        }
        Ok(pass)
    }

    /// How many operations wait (queued, not yet taken) and how long the oldest has waited.
    /// With the feature `metrics`, [`run_until`](Self::run_until) reads it after every pass
    /// for the gauges `idempotent_retry.outbox.queued` and `idempotent_retry.outbox.oldest_age`.
    ///
    /// # Errors
    ///
    /// The ledger's error when it cannot be read.
    pub async fn backlog(&self) -> Result<Backlog, LedgerError> {
        let Some(ledger) = self.client.ledger() else {
            return Ok(Backlog::default());
        };
        ledger
            .backlog(self.client.inner.settings.clock.wall())
            .await
    }

    /// Passes until `shutdown` completes: the next pass at once after a full batch, otherwise
    /// after [`idle_poll`](Self::idle_poll) or a [`waker`](Self::waker) notification. A pass
    /// in progress when `shutdown` completes finishes first (each send is bounded by the
    /// client's policy), so no lease is left behind; nothing more is read.
    ///
    /// # Errors
    ///
    /// The ledger's error when the due rows cannot be read; the sends already made are
    /// written.
    pub async fn run_until(&self, shutdown: impl Future<Output = ()>) -> Result<(), LedgerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let pass = self.dispatch_due().await?;
            if metrics::OUTBOX_GAUGES {
                match self.backlog().await {
                    Ok(backlog) => metrics::outbox_backlog(backlog.queued, backlog.oldest_age),
                    Err(err) => {
                        tracing::warn!(error = %err, "could not read the outbox's backlog for its gauges")
                    }
                }
            }
            let full = pass.due >= usize::try_from(self.batch).unwrap_or(usize::MAX);
            // After a full batch, only a look at `shutdown`; otherwise a wait for it, the idle
            // poll or the waker, whichever comes first.
            let mut idle = std::pin::pin!(self.client.inner.settings.sleeper.sleep(if full {
                Duration::ZERO
            } else {
                self.idle_poll
            }));
            let mut woken = std::pin::pin!(self.wake.notified());
            let stop = std::future::poll_fn(|cx| {
                if shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                if full || idle.as_mut().poll(cx).is_ready() || woken.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                Poll::Pending
            })
            .await;
            if stop {
                return Ok(());
            }
        }
    }
}

/// Sends one operation under its key; what its row now says.
async fn deliver(
    client: Client,
    operation: QueuedOperation,
    headers_for: Option<HeaderSource>,
) -> Delivery {
    let refused = |why: String| Delivery {
        key: operation.key.clone(),
        scope: operation.scope.clone(),
        outcome: Outcome::NotDone { key: None },
        replayed: false,
        error: Some(why),
        error_kind: Some(ErrorKind::Builder),
    };
    let Ok(method) = Method::from_bytes(operation.method.as_bytes()) else {
        return refused(format!(
            "stored method {:?} is not a method",
            operation.method
        ));
    };
    let key = match IdempotencyKey::new(operation.key.clone()) {
        Ok(key) => key,
        Err(err) => return refused(format!("stored key is not a key: {err}")),
    };
    let mut headers = HeaderMap::with_capacity(operation.headers.len());
    for (name, value) in &operation.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => return refused(format!("stored header {name:?} is not a valid header")),
        }
    }
    if let Some(source) = &headers_for {
        for (name, value) in source(&operation) {
            if let Some(name) = name {
                headers.insert(name, value);
            }
        }
    }
    let result = client
        .request(method, operation.url.as_str())
        .headers(headers)
        .body(operation.body.clone())
        .idempotency_key(key)
        .ledger_scope(operation.scope.clone())
        .send()
        .await;
    let outcome = Outcome::of(&result);
    let (replayed, error, error_kind) = match &result {
        Ok(response) => (
            RetryReport::of(response).is_some_and(RetryReport::is_replayed),
            None,
            None,
        ),
        Err(err) => (false, Some(err.to_string()), Some(err.kind())),
    };
    Delivery {
        key: operation.key,
        scope: operation.scope,
        outcome,
        replayed,
        error,
        error_kind,
    }
}
