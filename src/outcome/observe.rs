//! A hook for metrics: told about every attempt, every operation and every retry the budget
//! refuses, by every front end.
//!
//! The `tracing` span and events are for people reading logs; an [`Observer`] is for code
//! (counters, histograms, alerts on outcome-unknown operations). It is called synchronously
//! from the retry loop, so it must be quick and must not block: increment, record, return.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::keys::key::IdempotencyKey;
use crate::outcome::error::ErrorKind;
use crate::rules::classify::FailureKind;

/// Receives an event after each attempt, at the end of each operation, and when the retry
/// budget refuses a retry.
///
/// Every method does nothing by default; implement the ones you need. Install it with
/// [`ClientBuilder::observer`](crate::ClientBuilder::observer); the tower layer and the
/// middleware built from the same builder call it too. For a single callback, a closure is
/// enough: [`ClientBuilder::on_attempt`](crate::ClientBuilder::on_attempt), [`ClientBuilder::on_operation`](crate::ClientBuilder::on_operation).
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use idempotent_retry::observe::{AttemptEvent, OperationEvent};
/// use idempotent_retry::{Client, Observer};
///
/// #[derive(Debug, Default)]
/// struct Metrics {
///     retries: AtomicU64,
///     unknown: AtomicU64,
/// }
///
/// impl Observer for Metrics {
///     fn on_attempt(&self, event: &AttemptEvent<'_>) {
///         if event.delay.is_some() {
///             self.retries.fetch_add(1, Ordering::Relaxed);
///         }
///     }
///     fn on_operation(&self, event: &OperationEvent<'_>) {
///         if event.outcome_unknown {
///             self.unknown.fetch_add(1, Ordering::Relaxed);
///         }
///     }
/// }
///
/// let client = Client::builder().observer(Metrics::default()).build()?;
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
pub trait Observer: Send + Sync + fmt::Debug + 'static {
    /// Called once per attempt, after the decision about it is made and before any wait.
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        let _ = event;
    }

    /// Called once per operation, when its result is final: a response is returned or an error
    /// is. Not called for requests refused before the key was settled (bad URL or policy).
    ///
    /// With a [`Ledger`](crate::ledger::Ledger), an operation the ledger settles before anything is
    /// sent is reported too, with `attempts` 0 and [`OperationEvent::ledger_verdict`] set: a
    /// succeeded operation answered from its saved response, or one refused
    /// ([`KeyReuse`](crate::ErrorKind::KeyReuse), [`LeaseHeld`](crate::ErrorKind::LeaseHeld),
    /// [`ReconcileWindow`](crate::ErrorKind::ReconcileWindow), or
    /// [`Ledger`](crate::ErrorKind::Ledger) when the claim could not be written).
    fn on_operation(&self, event: &OperationEvent<'_>) {
        let _ = event;
    }

    /// Called when the [`RetryBudget`](crate::RetryBudget) refuses a retry, before the
    /// operation ends with [`ErrorKind::BudgetExhausted`] (its
    /// [`on_attempt`](Self::on_attempt) and [`on_operation`](Self::on_operation) follow).
    /// Count these: a client that sheds retries against a healthy service needs a larger
    /// budget ([`RetryBudgetConfig::with_capacity`](crate::RetryBudgetConfig::with_capacity)).
    fn on_retry_refused(&self, event: &RetryRefusedEvent<'_>) {
        let _ = event;
    }

    /// Called each time a run looks at its key in the ledger and finds it held by another
    /// live run, before it waits
    /// ([`LedgerOptions::on_lease_held`](crate::ledger::LedgerOptions::on_lease_held)); tell
    /// a person once the wait is long (idemcurl prints a line after a second).
    fn on_lease_wait(&self, event: &LeaseWaitEvent<'_>) {
        let _ = event;
    }
}

/// A run waiting for another run that holds its key, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeaseWaitEvent<'a> {
    /// The key both runs send.
    pub key: &'a IdempotencyKey,
    /// The holder's lease token: the worker's name (set with
    /// [`LedgerOptions::worker`](crate::ledger::LedgerOptions::worker)), `/`, the run's token.
    pub holder: Option<&'a str>,
    /// When the holder's lease ends unless it is renewed.
    pub lease_until: std::time::SystemTime,
    /// How long this run has waited so far.
    pub waited: std::time::Duration,
}

/// One attempt, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AttemptEvent<'a> {
    /// The key the attempt carried.
    pub key: Option<&'a IdempotencyKey>,
    /// The request method.
    pub method: &'a Method,
    /// The target host.
    pub host: Option<&'a str>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The response status, when a response arrived.
    pub status: Option<StatusCode>,
    /// How the attempt failed; `None` when its response is the operation's answer.
    pub failure: Option<FailureKind>,
    /// The wait before the next attempt; `None` when no attempt follows.
    pub delay: Option<Duration>,
    /// Time since the first attempt started, at the end of this one.
    pub elapsed: Duration,
}

/// A retry the [`RetryBudget`](crate::RetryBudget) refused, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RetryRefusedEvent<'a> {
    /// The key the operation's attempts carried.
    pub key: Option<&'a IdempotencyKey>,
    /// The request method.
    pub method: &'a Method,
    /// The target host.
    pub host: Option<&'a str>,
    /// The attempt whose retry was refused (1 for the first): the attempts sent.
    pub attempt: u32,
    /// How that attempt failed.
    pub failure: FailureKind,
    /// Tokens in the budget when it refused.
    pub available: u32,
    /// Retries the budget has refused so far, this one included
    /// ([`RetryBudget::refused`](crate::RetryBudget::refused)).
    pub refused: u64,
}

/// One finished operation, as an [`Observer`] sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OperationEvent<'a> {
    /// The key every attempt carried.
    pub key: Option<&'a IdempotencyKey>,
    /// The request method.
    pub method: &'a Method,
    /// The target host.
    pub host: Option<&'a str>,
    /// How many attempts were sent.
    pub attempts: u32,
    /// The status of the returned response, or of the last response kept by the error.
    pub status: Option<StatusCode>,
    /// `None` when a response was returned; otherwise why the operation failed.
    pub error: Option<ErrorKind>,
    /// Whether the server may have executed an operation that ended in an error (see
    /// [`Error::is_outcome_unknown`](crate::Error::is_outcome_unknown)).
    pub outcome_unknown: bool,
    /// Time from the first attempt to the end of the last one; zero when nothing was sent.
    pub elapsed: Duration,
    /// `Some` when the [`Ledger`](crate::ledger::Ledger) settled the operation before its first
    /// attempt, so nothing was sent; `None` when the operation ran its attempts (or the client
    /// has no ledger).
    pub ledger_verdict: Option<LedgerVerdict>,
}

/// How a [`Ledger`](crate::ledger::Ledger) settled an operation before anything was sent, as
/// [`OperationEvent::ledger_verdict`] reports it.
///
/// # Examples
///
/// Counting what the ledger spared the server, and what it refused:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use idempotent_retry::{Client, Observer};
/// use idempotent_retry::observe::{LedgerVerdict, OperationEvent};
/// use idempotent_retry::ledger::MemoryLedger;
///
/// #[derive(Debug, Default)]
/// struct LedgerMetrics {
///     replayed: AtomicU64,
///     refused: AtomicU64,
/// }
///
/// impl Observer for LedgerMetrics {
///     fn on_operation(&self, event: &OperationEvent<'_>) {
///         match event.ledger_verdict {
///             Some(LedgerVerdict::Replayed) => self.replayed.fetch_add(1, Ordering::Relaxed),
///             Some(LedgerVerdict::Refused) => self.refused.fetch_add(1, Ordering::Relaxed),
///             _ => 0,
///         };
///     }
/// }
///
/// let client = Client::builder()
///     .ledger(MemoryLedger::new())
///     .observer(LedgerMetrics::default())
///     .build()?;
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LedgerVerdict {
    /// The operation had already succeeded: its saved response was returned
    /// ([`RetryReport::is_replayed`](crate::RetryReport::is_replayed)); `status` is the saved
    /// status, `error` is `None`.
    Replayed,
    /// The ledger's record, or a failure to read or write it, stopped the operation: `error`
    /// says which ([`KeyReuse`](crate::ErrorKind::KeyReuse),
    /// [`LeaseHeld`](crate::ErrorKind::LeaseHeld),
    /// [`ReconcileWindow`](crate::ErrorKind::ReconcileWindow),
    /// [`Ledger`](crate::ErrorKind::Ledger), or [`Builder`](crate::ErrorKind::Builder) for a
    /// streamed body that cannot be fingerprinted or a response type that cannot be rebuilt).
    Refused,
}

/// Two observers, called in the order they were added.
#[derive(Debug)]
pub(crate) struct Chain(pub(crate) Arc<dyn Observer>, pub(crate) Arc<dyn Observer>);

impl Observer for Chain {
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        self.0.on_attempt(event);
        self.1.on_attempt(event);
    }

    fn on_operation(&self, event: &OperationEvent<'_>) {
        self.0.on_operation(event);
        self.1.on_operation(event);
    }

    fn on_retry_refused(&self, event: &RetryRefusedEvent<'_>) {
        self.0.on_retry_refused(event);
        self.1.on_retry_refused(event);
    }

    fn on_lease_wait(&self, event: &LeaseWaitEvent<'_>) {
        self.0.on_lease_wait(event);
        self.1.on_lease_wait(event);
    }
}

/// A closure given to [`ClientBuilder::on_attempt`](crate::ClientBuilder::on_attempt).
pub(crate) struct OnAttempt<F>(pub(crate) F);

impl<F> fmt::Debug for OnAttempt<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnAttempt(<closure>)")
    }
}

impl<F> Observer for OnAttempt<F>
where
    F: Fn(&AttemptEvent<'_>) + Send + Sync + 'static,
{
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        (self.0)(event);
    }
}

/// A closure given to [`ClientBuilder::on_operation`](crate::ClientBuilder::on_operation).
pub(crate) struct OnOperation<F>(pub(crate) F);

impl<F> fmt::Debug for OnOperation<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnOperation(<closure>)")
    }
}

impl<F> Observer for OnOperation<F>
where
    F: Fn(&OperationEvent<'_>) + Send + Sync + 'static,
{
    fn on_operation(&self, event: &OperationEvent<'_>) {
        (self.0)(event);
    }
}
