//! What the receiver reports: the request log, each key's record, refusals and misuses.
//!
//! These are plain values, copied out of the receiver's state when a test asks for them, so
//! reading them never holds the receiver's lock and they stay valid after it is dropped.

use std::fmt;
use std::time::Duration;

use super::fault::Fault;

/// A key's status, as a Stripe-style receiver keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// Claimed; the handler is running. Duplicates get 409.
    InProgress,
    /// The handler finished; duplicates get the saved response.
    Completed,
    /// The handler failed without an effect; the next delivery runs it again.
    Failed,
}

/// The response the receiver saved for a completed key and replays to its duplicates (the
/// receiver's own record, not the ledger's [`SavedResponse`](idempotent_retry::ledger::SavedResponse)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplayableResponse {
    /// The status the first run answered.
    pub status: u16,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}

/// What the receiver keeps for one key (or, in batch mode, one event id).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The receiver's scope ([`ReceiverBuilder::scope`](super::ReceiverBuilder::scope)).
    pub scope: String,
    /// Hex SHA-256 of the method, the target and the body (JSON in RFC 8785 canonical form)
    /// of the delivery that claimed the key.
    pub fingerprint: String,
    /// Where the key stands.
    pub status: KeyStatus,
    /// The saved response, once completed.
    pub response: Option<ReplayableResponse>,
    /// Side effects recorded under the key.
    pub effects: u64,
}

/// What the receiver did with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Handling {
    /// Still being handled.
    Pending,
    /// A scripted fault ended it before the handler ([`Fault::ResetBeforeHandler`],
    /// [`Fault::CloseWithoutReply`], [`Fault::Respond`]).
    Faulted,
    /// The handler ran and answered `status`, recording `effects` side effects.
    Ran {
        /// The handler's status.
        status: u16,
        /// Effects recorded by this run.
        effects: u64,
    },
    /// A duplicate of a completed key: the saved response was replayed.
    Replayed {
        /// The saved status.
        status: u16,
    },
    /// A duplicate while the key was in progress: 409.
    InProgress,
    /// The key was reused with a different request: 422.
    Mismatch,
    /// A batch: `processed` events ran the handler, `duplicates` had been seen before.
    Batch {
        /// Events that ran the handler.
        processed: usize,
        /// Events skipped as already seen.
        duplicates: usize,
    },
    /// A batch that was not a JSON array of objects with an id: 400.
    BadRequest,
}

/// One request as the receiver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Arrival {
    /// 1 for the first request to arrive.
    pub number: u64,
    /// When it had been read completely, since the receiver started.
    pub at: Duration,
    /// The method.
    pub method: String,
    /// The request target.
    pub path: String,
    /// The key header's value, if any.
    pub key: Option<String>,
    /// The how-manieth request with this key (0 without a key).
    pub key_attempt: u32,
    /// The scripted fault it met.
    pub fault: Option<Fault>,
    /// What the receiver did.
    pub outcome: Handling,
    /// What the answer did: `None` when it went out normally, else what happened to it.
    pub answer_fault: Option<String>,
}

impl fmt::Display for Arrival {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.fault, &self.outcome) {
            (Some(fault), Handling::Faulted) => write!(f, "{fault}; handler not run")?,
            (_, Handling::Pending) => f.write_str("in progress")?,
            (_, Handling::Ran { status, effects }) => {
                let keyed = if self.key.is_some() {
                    "key claimed"
                } else {
                    "no key"
                };
                match &self.fault {
                    Some(Fault::SlowHandler(slow)) => write!(
                        f,
                        "{keyed}, slow handler ran {}ms: {effects} effect(s), {status}",
                        slow.as_millis()
                    )?,
                    _ => write!(f, "{keyed}, handler ran: {effects} effect(s), {status}")?,
                }
            }
            (_, Handling::Replayed { status }) => {
                write!(f, "key completed: saved {status} replayed, no new effect")?;
            }
            (_, Handling::InProgress) => f.write_str("key in progress: 409")?,
            (_, Handling::Mismatch) => f.write_str("key reused with a different body: 422")?,
            (
                _,
                Handling::Batch {
                    processed,
                    duplicates,
                },
            ) => write!(f, "batch: {processed} new, {duplicates} duplicate(s)")?,
            (_, Handling::BadRequest) => f.write_str("not a batch: 400")?,
            (None, Handling::Faulted) => f.write_str("faulted")?,
        }
        if let Some(what) = &self.answer_fault {
            write!(f, "; {what}")?;
        }
        Ok(())
    }
}

/// A record that makes forgetting a committed key safe: the effect was undone (a refund, a
/// retraction) or is otherwise accounted for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compensation {
    reason: String,
}

impl Compensation {
    /// A compensation, with what was done to undo or account for the effect.
    #[must_use]
    pub fn new(reason: impl Into<String>) -> Compensation {
        Compensation {
            reason: reason.into(),
        }
    }

    /// What was done.
    #[must_use]
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// A forgotten key whose effects were compensated.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Compensated {
    /// The key.
    pub key: String,
    /// Effects it had recorded.
    pub effects: u64,
    /// The compensating record.
    pub compensation: Compensation,
}

/// Why [`Receiver::forget`](super::Receiver::forget) refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForgetError {
    /// The key is unknown (never claimed, or already forgotten).
    #[error("idempotency key {key} is unknown")]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// The key's handler is still running.
    #[error("idempotency key {key} is in progress")]
    InProgress {
        /// The key.
        key: String,
    },
    /// The key's side effect committed and no compensating record was given: forgetting it
    /// would let the next delivery run the effect again.
    #[error(
        "idempotency key {key} has {effects} committed effect(s): forgetting it without a compensating record would allow a duplicate"
    )]
    EffectCommitted {
        /// The key.
        key: String,
        /// Effects recorded under it.
        effects: u64,
    },
}

/// A misuse the receiver caught and refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A handler asked to release (forget) a key whose effect had committed
    /// ([`Reply::release_key`](super::Reply::release_key)); the key was kept.
    ReleasedCommittedKey {
        /// The key.
        key: String,
        /// The request that asked.
        request: u64,
        /// Effects recorded under the key.
        effects: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_read_as_what_happened() {
        let arrival = |fault: Option<Fault>, outcome: Handling, key: Option<&str>| Arrival {
            number: 1,
            at: Duration::ZERO,
            method: "POST".to_owned(),
            path: "/".to_owned(),
            key: key.map(str::to_owned),
            key_attempt: u32::from(key.is_some()),
            fault,
            outcome,
            answer_fault: None,
        };
        let ran = Handling::Ran {
            status: 200,
            effects: 1,
        };
        assert_eq!(
            arrival(None, ran.clone(), Some("k")).to_string(),
            "key claimed, handler ran: 1 effect(s), 200"
        );
        assert_eq!(
            arrival(None, ran.clone(), None).to_string(),
            "no key, handler ran: 1 effect(s), 200"
        );
        assert_eq!(
            arrival(
                Some(Fault::SlowHandler(Duration::from_millis(900))),
                ran,
                Some("k")
            )
            .to_string(),
            "key claimed, slow handler ran 900ms: 1 effect(s), 200"
        );
        assert_eq!(
            arrival(Some(Fault::status(503)), Handling::Faulted, Some("k")).to_string(),
            "503; handler not run"
        );
        let mut lost = arrival(None, Handling::Replayed { status: 200 }, Some("k"));
        lost.answer_fault = Some("then connection reset: answer lost".to_owned());
        assert_eq!(
            lost.to_string(),
            "key completed: saved 200 replayed, no new effect; then connection reset: answer lost"
        );
    }
}
