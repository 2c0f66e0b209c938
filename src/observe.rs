//! A hook for metrics: told about every attempt and every operation, by every front end.
//!
//! The `tracing` span and events are for people reading logs; an [`Observer`] is for code
//! (counters, histograms, alerts on outcome-unknown operations). It is called synchronously
//! from the retry loop, so it must be quick and must not block: increment, record, return.

use std::fmt;
use std::time::Duration;

use http::{Method, StatusCode};

use crate::classify::FailureKind;
use crate::error::ErrorKind;
use crate::key::IdempotencyKey;

/// Receives an event after each attempt and at the end of each operation.
///
/// Both methods do nothing by default; implement the ones you need. Install it with
/// [`ClientBuilder::observer`](crate::ClientBuilder::observer); the tower layer and the
/// middleware built from the same builder call it too.
///
/// # Examples
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use idempotent_retry::{AttemptEvent, Client, Observer, OperationEvent};
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
    fn on_operation(&self, event: &OperationEvent<'_>) {
        let _ = event;
    }
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
    /// Time from the first attempt to the end of the last one.
    pub elapsed: Duration,
}
