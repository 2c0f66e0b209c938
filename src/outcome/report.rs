//! What happened during one logical operation: attempts, waits, the key.
//!
//! Every response returned by [`RequestBuilder::send`](crate::RequestBuilder::send) carries a
//! [`RetryReport`] in its extensions, and every [`Error`](crate::Error) carries one too.

use std::time::Duration;

use http::StatusCode;

use crate::keys::key::IdempotencyKey;
use crate::rules::classify::FailureKind;

/// The account of one logical operation.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), idempotent_retry::Error> {
/// use idempotent_retry::{Client, RetryReport};
///
/// let client = Client::new();
/// let response = client.post("https://api.example.com/v1/charges").send().await?;
/// if let Some(report) = RetryReport::of(&response) {
///     println!("{} attempts, key {:?}", report.attempts(), report.idempotency_key());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryReport {
    pub(crate) key: Option<IdempotencyKey>,
    pub(crate) attempts: u32,
    pub(crate) elapsed: Duration,
    pub(crate) history: Vec<AttemptRecord>,
    pub(crate) replayed: bool,
    pub(crate) replay_body_missing: bool,
    /// How long the claim waited for another run's lease.
    pub(crate) lease_wait: Duration,
    /// Why the answer was not recorded by this run, when it was not.
    pub(crate) unrecorded: Option<String>,
    /// The ledger held the operation as succeeded without its body: it was sent again.
    pub(crate) refetched: bool,
}

impl RetryReport {
    /// The report attached to a response returned by
    /// [`RequestBuilder::send`](crate::RequestBuilder::send).
    ///
    /// `None` only if something removed it from the response's extensions.
    #[must_use]
    pub fn of(response: &reqwest::Response) -> Option<&RetryReport> {
        response.extensions().get::<RetryReport>()
    }

    /// The report in a response's extensions, for front ends whose response is not a
    /// `reqwest::Response` (an `http::Response<B>` from the tower service).
    ///
    /// ```
    /// use idempotent_retry::RetryReport;
    ///
    /// let response = http::Response::new(());
    /// assert!(RetryReport::from_extensions(response.extensions()).is_none());
    /// ```
    #[must_use]
    pub fn from_extensions(extensions: &http::Extensions) -> Option<&RetryReport> {
        extensions.get::<RetryReport>()
    }

    pub(crate) fn new(key: Option<IdempotencyKey>) -> Self {
        RetryReport {
            key,
            attempts: 0,
            elapsed: Duration::ZERO,
            history: Vec::new(),
            replayed: false,
            replay_body_missing: false,
            lease_wait: Duration::ZERO,
            unrecorded: None,
            refetched: false,
        }
    }

    /// How many attempts were sent (or tried to be sent), the first one included: every
    /// request of the operation, those answered "in progress"
    /// ([`in_progress_waits`](Self::in_progress_waits)) included. The policy's
    /// [`max_attempts`](crate::RetryPolicy::max_attempts) bounds the others only.
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// How many answers said the operation was still in progress at the receiver (a
    /// `409 Conflict` on a keyed request, [`FailureKind::InProgress`]) and were waited out.
    ///
    /// Each is a wait for the live operation, not a failed attempt: it is in
    /// [`attempts`](Self::attempts) and in [`history`](Self::history) (its `failure` is
    /// `InProgress`, its `wait` the wait that followed), but it does not count toward
    /// [`max_attempts`](crate::RetryPolicy::max_attempts). An in-progress answer that ended the
    /// operation ([`ErrorKind::StillInProgress`](crate::ErrorKind::StillInProgress)) was not
    /// waited out and is not counted here. 0 when there was none.
    #[must_use]
    pub fn in_progress_waits(&self) -> u32 {
        let waits = self.in_progress_history().count();
        u32::try_from(waits).unwrap_or(u32::MAX)
    }

    /// The sum of the waits after in-progress answers
    /// ([`in_progress_waits`](Self::in_progress_waits)): how long the operation slept waiting for
    /// the live operation. Part of [`total_wait`](Self::total_wait) and
    /// [`elapsed`](Self::elapsed); never more than
    /// [`max_in_progress_wait`](crate::RetryPolicy::max_in_progress_wait). Zero when there was
    /// none.
    #[must_use]
    pub fn in_progress_wait(&self) -> Duration {
        self.in_progress_history()
            .map(|wait| wait.delay)
            .fold(Duration::ZERO, Duration::saturating_add)
    }

    /// The waits that followed an in-progress answer.
    fn in_progress_history(&self) -> impl Iterator<Item = Wait> + '_ {
        self.history
            .iter()
            .filter(|a| a.failure == Some(FailureKind::InProgress))
            .filter_map(|a| a.wait)
    }

    /// The idempotency key every attempt carried, if the operation had one.
    #[must_use]
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.key.as_ref()
    }

    /// Time from the start of the first attempt to the end of the last one, waits included,
    /// plus the time the ledger's claim waited for another run ([`lease_wait`](Self::lease_wait)).
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.elapsed.saturating_add(self.lease_wait)
    }

    /// How long the operation waited, before anything was sent, for another run holding its
    /// key in the [`Ledger`](crate::ledger::Ledger)
    /// ([`LedgerOptions::on_lease_held`](crate::ledger::LedgerOptions::on_lease_held)): that
    /// run's answer replayed, or its lapsed lease taken over. Zero without a wait.
    #[must_use]
    pub fn lease_wait(&self) -> Duration {
        self.lease_wait
    }

    /// Why the answer returned was not recorded in the [`Ledger`](crate::ledger::Ledger) as
    /// this run's outcome, when it was not: another run took the key over while the answer
    /// arrived, or the ledger could not be written. The answer is still the operation's (same
    /// key, same receiver); a later run with the key is answered from the ledger (when the
    /// answer could be recorded as a resolution) or by the receiver's own store. `None`
    /// when the outcome was recorded, or there is no ledger.
    #[must_use]
    pub fn unrecorded(&self) -> Option<&str> {
        self.unrecorded.as_deref()
    }

    /// The delays waited between attempts, in order (the waits after in-progress answers
    /// included).
    #[must_use]
    pub fn delays(&self) -> Vec<Duration> {
        self.history
            .iter()
            .filter_map(|a| a.wait.map(|w| w.delay))
            .collect()
    }

    /// The sum of all delays waited: between attempts, and for another run's lease.
    #[must_use]
    pub fn total_wait(&self) -> Duration {
        self.history
            .iter()
            .filter_map(|a| a.wait.map(|w| w.delay))
            .fold(self.lease_wait, Duration::saturating_add)
    }

    /// Whether the response was replayed from the client's [`Ledger`](crate::ledger::Ledger): the
    /// operation had already succeeded, so no request was sent (and
    /// [`attempts`](Self::attempts) is 0).
    #[must_use]
    pub fn is_replayed(&self) -> bool {
        self.replayed
    }

    /// Whether a replayed response lacks its body. Always `false`: an answer whose body was
    /// longer than the ledger saves
    /// ([`LedgerOptions::max_body`](crate::ledger::LedgerOptions::max_body)) is fetched again
    /// ([`is_refetched`](Self::is_refetched)) or refused with
    /// [`ErrorKind::AnswerNotSaved`](crate::ErrorKind::AnswerNotSaved), never replayed empty.
    #[must_use]
    pub fn is_replay_body_missing(&self) -> bool {
        self.replay_body_missing
    }

    /// Whether the ledger held this operation as succeeded without its answer's body (longer
    /// than [`LedgerOptions::max_body`](crate::ledger::LedgerOptions::max_body)), so it was
    /// sent again with its key and this is the receiver's answer from its own store
    /// ([`LedgerOptions::fetch_unsaved_answers`](crate::ledger::LedgerOptions::fetch_unsaved_answers)).
    #[must_use]
    pub fn is_refetched(&self) -> bool {
        self.refetched
    }

    /// One record per attempt, in order.
    #[must_use]
    pub fn history(&self) -> &[AttemptRecord] {
        &self.history
    }
}

/// One attempt of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// 1 for the first attempt.
    pub number: u32,
    /// When the attempt started, measured from the start of the first attempt.
    pub started: Duration,
    /// The response status, when a response arrived.
    pub status: Option<StatusCode>,
    /// Why the attempt was not final, when it was not. [`FailureKind::InProgress`]: the
    /// receiver said the operation was still in progress, and the attempt was a wait for it,
    /// not counted toward `max_attempts`.
    pub failure: Option<FailureKind>,
    /// The wait that followed this attempt, when another attempt followed.
    pub wait: Option<Wait>,
}

/// A wait between two attempts and why it was that long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wait {
    /// How long the operation waited.
    pub delay: Duration,
    /// Why.
    pub reason: WaitReason,
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "waited {:?} ({})", self.delay, self.reason)
    }
}

/// Why a wait was as long as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitReason {
    /// Capped exponential backoff with full jitter, drawn below this ceiling.
    Backoff {
        /// `min(max_delay, base_delay * 2^retry)` for this retry.
        ceiling: Duration,
    },
    /// The server asked for at least this long (`Retry-After` or `retry-after-ms`), and that
    /// was longer than the backoff drawn.
    RetryAfter {
        /// What the server asked for.
        asked: Duration,
    },
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitReason::Backoff { ceiling } => {
                write!(f, "full-jitter backoff below {ceiling:?}")
            }
            WaitReason::RetryAfter { asked } => write!(f, "server asked for {asked:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(number: u32, failure: Option<FailureKind>, wait_ms: Option<u64>) -> AttemptRecord {
        AttemptRecord {
            number,
            started: Duration::ZERO,
            status: None,
            failure,
            wait: wait_ms.map(|ms| Wait {
                delay: Duration::from_millis(ms),
                reason: WaitReason::Backoff {
                    ceiling: Duration::from_millis(ms),
                },
            }),
        }
    }

    #[test]
    fn in_progress_waits_are_counted_apart_from_attempts() {
        let mut report = RetryReport::new(None);
        assert_eq!(report.in_progress_waits(), 0);
        assert_eq!(report.in_progress_wait(), Duration::ZERO);
        report.attempts = 5;
        report.history = vec![
            row(1, Some(FailureKind::ServerError), Some(100)),
            row(2, Some(FailureKind::InProgress), Some(40)),
            row(3, Some(FailureKind::InProgress), Some(60)),
            row(4, Some(FailureKind::Timeout), Some(300)),
            // The in-progress answer that ended the operation was not waited out.
            row(5, Some(FailureKind::InProgress), None),
        ];
        assert_eq!(report.attempts(), 5);
        assert_eq!(report.in_progress_waits(), 2);
        assert_eq!(report.in_progress_wait(), Duration::from_millis(100));
        assert_eq!(report.total_wait(), Duration::from_millis(500));
    }
}
