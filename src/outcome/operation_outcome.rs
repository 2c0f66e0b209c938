//! The three-way outcome of one operation, for callers that must act on it: done, not done, or
//! unknown, each with the key to act with.

use std::fmt;

use http::StatusCode;

use crate::keys::key::IdempotencyKey;
use crate::message::exchange::RetryResponse;
use crate::outcome::error::Error;
use crate::outcome::report::RetryReport;

/// What a caller knows about an operation once `send` has returned: the answer to "did it
/// happen?", with the key every attempt carried.
///
/// An agent runtime turns it into the tool result it shows the model (`docs/agents.md`); a job
/// runner into done, retry later, or reconcile.
///
/// | variant | when | what to do |
/// |---|---|---|
/// | [`Done`](Outcome::Done) | a final response arrived (2xx, or a final answer such as 400 or 422: read the status); or a [`KeyReuse`](crate::ErrorKind::KeyReuse) refusal of a key whose operation the ledger holds as answered | use the response (for `KeyReuse`, [`Error::held_operation`]), do not send it again |
/// | [`NotDone`](Outcome::NotDone) | the operation cannot have run: nothing reached the server, or the server refused it outright (429, 408) | safe to try again later |
/// | [`Unknown`](Outcome::Unknown) | an attempt may have run (sent, then timed out, reset, 5xx, 409) | do **not** repeat it under a new key: retry later with the same key, or look it up by the key |
///
/// # Examples
///
/// ```no_run
/// use idempotent_retry::{Client, IdempotencyKey, Outcome};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new();
/// let key = IdempotencyKey::derive("agent.send_email", &["run_42", "step-3"]);
/// let result = client
///     .post("https://api.example.com/v1/emails")
///     .idempotency_key(key)
///     .send()
///     .await;
/// match Outcome::of(&result) {
///     Outcome::Done { status, .. } => println!("answered {status}"),
///     Outcome::NotDone { .. } => println!("not sent: try again later"),
///     Outcome::Unknown { key } => println!("may have happened: reconcile {key:?}, do not repeat"),
///     // A variant added later: read it as the careful answer.
///     _ => println!("may have happened: do not repeat"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// A final response arrived, with this status (a 4xx is final too: the operation has its
    /// answer).
    Done {
        /// The key every attempt carried, when the operation had one.
        key: Option<IdempotencyKey>,
        /// The final response's status.
        status: StatusCode,
    },
    /// The operation ended without a response and cannot have run
    /// ([`Error::is_outcome_unknown`] is `false`).
    NotDone {
        /// The key every attempt carried, when the operation had one.
        key: Option<IdempotencyKey>,
    },
    /// The operation ended without a response and may have run
    /// ([`Error::is_outcome_unknown`] is `true`).
    Unknown {
        /// The key every attempt carried: the one to retry or reconcile with.
        key: Option<IdempotencyKey>,
    },
}

impl Outcome {
    /// The outcome of what a front end returned: a response (with its
    /// [`RetryReport`](crate::RetryReport) for the key) or an [`Error`].
    #[must_use]
    pub fn of<R: RetryResponse>(result: &Result<R, Error>) -> Outcome {
        match result {
            Ok(response) => Outcome::Done {
                key: response
                    .extensions()
                    .and_then(RetryReport::from_extensions)
                    .and_then(RetryReport::idempotency_key)
                    .cloned(),
                status: response.status(),
            },
            Err(err) => err.outcome(),
        }
    }

    /// The key every attempt carried, when the operation had one.
    #[must_use]
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        match self {
            Outcome::Done { key, .. } | Outcome::NotDone { key } | Outcome::Unknown { key } => {
                key.as_ref()
            }
        }
    }

    /// `done`, `not_done` or `unknown`: the value of the operation span's
    /// `idempotent_retry.outcome` attribute.
    #[must_use]
    pub const fn as_str(&self) -> &'static str {
        match self {
            Outcome::Done { .. } => "done",
            Outcome::NotDone { .. } => "not_done",
            Outcome::Unknown { .. } => "unknown",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The operation's outcome: [`Outcome::Unknown`] when it may have run
    /// ([`is_outcome_unknown`](Self::is_outcome_unknown)), [`Outcome::NotDone`] otherwise, with
    /// the key.
    ///
    /// A [`KeyReuse`](crate::ErrorKind::KeyReuse) refusal sent nothing, and answers for the
    /// operation the ledger holds under the key ([`held_operation`](Self::held_operation)):
    /// [`Outcome::Done`] with its saved answer's status when it has one (succeeded, or a final
    /// refusal), [`Outcome::Unknown`] when it may have run, [`Outcome::NotDone`] only when it
    /// cannot have.
    #[must_use]
    pub fn outcome(&self) -> Outcome {
        let key = self.idempotency_key().cloned();
        if let Some(status) = self.held_operation().and_then(|held| held.final_answer()) {
            return Outcome::Done { key, status };
        }
        if self.kind() == crate::ErrorKind::AnswerNotSaved
            && let Some(status) = self.status()
        {
            return Outcome::Done { key, status };
        }
        if self.is_outcome_unknown() {
            Outcome::Unknown { key }
        } else {
            Outcome::NotDone { key }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::error::ErrorKind;

    #[test]
    fn a_response_is_done_and_an_error_is_unknown_or_not_done() {
        let key = IdempotencyKey::new("k_outcome").expect("valid");
        let mut response = http::Response::new(());
        *response.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
        response
            .extensions_mut()
            .insert(RetryReport::new(Some(key.clone())));
        let done: Result<_, Error> = Ok(response);
        assert_eq!(
            Outcome::of(&done),
            Outcome::Done {
                key: Some(key.clone()),
                status: StatusCode::UNPROCESSABLE_ENTITY
            }
        );
        let report = RetryReport::new(Some(key.clone()));
        let unknown: Result<http::Response<()>, Error> = Err(Error::operation(
            ErrorKind::AttemptsExhausted,
            report.clone(),
            true,
        ));
        assert_eq!(Outcome::of(&unknown).as_str(), "unknown");
        assert_eq!(Outcome::of(&unknown).idempotency_key(), Some(&key));
        let not_done: Result<http::Response<()>, Error> = Err(Error::operation(
            ErrorKind::AttemptsExhausted,
            report,
            false,
        ));
        assert_eq!(Outcome::of(&not_done), Outcome::NotDone { key: Some(key) });
    }
}
