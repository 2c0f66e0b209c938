//! The crate's one error type.
//!
//! An [`Error`] tells the caller the truth about the operation: its [`ErrorKind`], whether the
//! server may have executed it ([`Error::is_outcome_unknown`]), the idempotency key to
//! reconcile with, the request's method and URL (without credentials), how many attempts were
//! made, and the last response when there was one. Its `Display` says all of it in one line.

use std::any::Any;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use http::{Method, StatusCode};
use reqwest::Url;
use sync_wrapper::SyncWrapper;

use crate::keys::key::{IdempotencyKey, InvalidKey};
use crate::message::exchange::RetryRequest;
use crate::message::url::strip_credentials;
use crate::outcome::held::HeldOperation;
use crate::outcome::report::RetryReport;
use crate::rules::classify::FailureKind;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// What went wrong, broadly. Match on it with a wildcard arm: new kinds may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Every allowed attempt failed transiently. Check
    /// [`is_outcome_unknown`](Error::is_outcome_unknown): retry later with the same key, or
    /// reconcile.
    AttemptsExhausted,
    /// The next wait would have ended past the reconcile window. Do not retry: reconcile using
    /// the key (the receiver may soon forget it, and a retry would then be a new request).
    ReconcileWindow,
    /// The server asked to wait longer than `max_retry_after`, or longer than the reconcile
    /// window has left. [`retry_after`](Error::retry_after) says how long it asked for.
    RetryAfterTooLong,
    /// A retry was due, but the request body is a stream that cannot be sent twice. The one
    /// attempt's failure is the [`source`](std::error::Error::source).
    BodyNotReplayable,
    /// The idempotency key, or a key header set by the caller, is not a valid key.
    InvalidKey,
    /// A transport error that was not retried: not transient, or a request that may have
    /// reached the server and has neither a key nor an idempotent method.
    Transport,
    /// Invalid configuration or request: a bad policy, URL, or header, or conflicting keys.
    Builder,
    /// A retry was due, but the client's [`RetryBudget`](crate::RetryBudget) refused it: too
    /// many retries failed lately across the client, so the service is probably down. The
    /// operation was not retried; the refusal was counted
    /// ([`RetryBudget::refused`](crate::RetryBudget::refused)) and reported to observers
    /// ([`Observer::on_retry_refused`](crate::Observer::on_retry_refused)). Check
    /// [`is_outcome_unknown`](Error::is_outcome_unknown), then reconcile or retry later with
    /// the same key.
    BudgetExhausted,
    /// The ledger holds this key for a different request (another method, URL or body).
    /// Nothing was sent. [`held_operation`](Error::held_operation) is what the ledger holds
    /// and names the part that differs; [`outcome`](Error::outcome) is the key's operation's
    /// (done, unknown, or not done), never "not done" while the ledger holds it as done or
    /// possibly done.
    KeyReuse,
    /// Another run holds the operation's lease in the ledger and is sending it now. Nothing
    /// was sent; try again later with the same key.
    LeaseHeld,
    /// The ledger could not be read or written. Before the first attempt: nothing was sent.
    /// After an attempt: [`is_outcome_unknown`](Error::is_outcome_unknown) says whether it may
    /// have run, and the next run with the same key resumes once the lease lapses. The
    /// [`LedgerError`](crate::ledger::LedgerError) is the source.
    Ledger,
    /// A redirect chain was longer than the [`RedirectPolicy`](crate::RedirectPolicy) allows.
    /// Not retried (it would loop again). The outcome is reported unknown: the request reached
    /// at least one server, and a 303 answers a request that has run.
    TooManyRedirects,
    /// The receiver still said the operation was in progress (a `409 Conflict` on a keyed
    /// request: another request with the key, often one of this operation's own, is running
    /// there) when [`RetryPolicy::max_in_progress_wait`](crate::RetryPolicy::max_in_progress_wait)
    /// ran out, or it asked with `Retry-After` for a wait that would end past that limit
    /// ([`retry_after`](Error::retry_after) says how long). The outcome is unknown: the live
    /// operation may still complete. Send it again later with the same key (the receiver
    /// then answers with its result), or reconcile; to wait longer, raise the limit.
    StillInProgress,
    /// The ledger holds the operation as succeeded, but not its answer's body: it was longer
    /// than [`LedgerOptions::max_body`](crate::ledger::LedgerOptions::max_body). Nothing was
    /// sent, and no empty body is handed over as the answer. The outcome is done
    /// ([`Error::status`] is the answer's status). Inside the reconcile window the client sends
    /// it again with its key instead, unless
    /// [`LedgerOptions::fetch_unsaved_answers`](crate::ledger::LedgerOptions::fetch_unsaved_answers)
    /// is off; past it, look the answer up at the receiver under the key.
    AnswerNotSaved,
}

impl ErrorKind {
    /// A short stable name, for logs, metrics and the operation span's
    /// `idempotent_retry.stop_reason`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::AttemptsExhausted => "attempts_exhausted",
            ErrorKind::ReconcileWindow => "reconcile_window",
            ErrorKind::RetryAfterTooLong => "retry_after_too_long",
            ErrorKind::BodyNotReplayable => "body_not_replayable",
            ErrorKind::InvalidKey => "invalid_key",
            ErrorKind::Transport => "transport",
            ErrorKind::Builder => "builder",
            ErrorKind::BudgetExhausted => "budget_exhausted",
            ErrorKind::KeyReuse => "key_reuse",
            ErrorKind::LeaseHeld => "lease_held",
            ErrorKind::Ledger => "ledger",
            ErrorKind::TooManyRedirects => "too_many_redirects",
            ErrorKind::StillInProgress => "still_in_progress",
            ErrorKind::AnswerNotSaved => "answer_not_saved",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::AttemptsExhausted => "attempts exhausted",
            ErrorKind::ReconcileWindow => "reconcile window ended",
            ErrorKind::RetryAfterTooLong => "server asked to wait too long",
            ErrorKind::BodyNotReplayable => "request body cannot be replayed",
            ErrorKind::InvalidKey => "invalid idempotency key",
            ErrorKind::Transport => "transport error",
            ErrorKind::Builder => "invalid configuration",
            ErrorKind::BudgetExhausted => "retry budget exhausted",
            ErrorKind::KeyReuse => "idempotency key reused for a different request",
            ErrorKind::LeaseHeld => "operation lease held by another run",
            ErrorKind::Ledger => "ledger failure",
            ErrorKind::TooManyRedirects => "too many redirects",
            ErrorKind::StillInProgress => "operation still in progress at the receiver",
            ErrorKind::AnswerNotSaved => "the operation succeeded, but its answer was not saved",
        })
    }
}

/// The error returned when an operation ends without a final response.
///
/// `Error` is `Send + Sync + 'static` and keeps its source chain: the last transport error
/// (a `reqwest::Error`), or the [`InvalidKey`] reason.
///
/// Its `Display` is one line for a person: the request's method and origin, what happened,
/// after how many attempts, whether the operation may have run, and the key, as in
/// `POST https://api.example.com/…: gave up after 3 attempts (last status 503 Service
/// Unavailable); outcome unknown: it may have run; idempotency key 5f0c…`. The path and query
/// are left out of it (`/…`), since they may carry secrets and a message is what gets logged;
/// [`url`](Self::url) has them. Its `Debug` shows the method and the whole URL beside the
/// other facts. Neither ever shows a user name or password from the URL.
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    report: RetryReport,
    outcome_unknown: bool,
    failure: Option<FailureKind>,
    status: Option<StatusCode>,
    retry_after: Option<Duration>,
    window: Option<Duration>,
    /// For `StillInProgress`: the policy's limit, and the time since the first in-progress
    /// answer.
    in_progress: Option<InProgressWait>,
    message: Option<String>,
    /// For `KeyReuse`: the ledger's record of the key's operation.
    held: Option<HeldOperation>,
    /// The request the operation was for, once the front end has one.
    target: Option<Target>,
    // The last response, of whatever type the front end's transport returns (a
    // `reqwest::Response`, an `http::Response<B>`): one error type for every front end. In a
    // `SyncWrapper` so that `Error` is `Sync` whatever the response is: the wrapper gives its
    // value out only through `&mut self`, which no other reference can share.
    response: SyncWrapper<Option<Box<dyn Any + Send>>>,
    source: Option<BoxError>,
}

impl Error {
    fn new(kind: ErrorKind) -> Self {
        Error {
            inner: Box::new(Inner {
                kind,
                report: RetryReport::new(None),
                outcome_unknown: false,
                failure: None,
                status: None,
                retry_after: None,
                window: None,
                in_progress: None,
                message: None,
                held: None,
                target: None,
                response: SyncWrapper::new(None),
                source: None,
            }),
        }
    }

    pub(crate) fn builder(message: impl Into<String>) -> Self {
        let mut err = Error::new(ErrorKind::Builder);
        err.inner.message = Some(message.into());
        err
    }

    /// A builder error from reqwest, whose URL (shown by its `Debug`) loses its credentials.
    pub(crate) fn builder_from(mut source: reqwest::Error) -> Self {
        if let Some(url) = source.url_mut() {
            strip_credentials(url);
        }
        Error::new(ErrorKind::Builder).with_source(source)
    }

    /// A builder error whose source is already boxed.
    #[cfg(any(feature = "tower", feature = "middleware"))]
    pub(crate) fn builder_from_boxed(source: BoxError) -> Self {
        let mut err = Error::new(ErrorKind::Builder);
        err.inner.source = Some(source);
        err
    }

    /// The wrapped service could not take a request: nothing was sent.
    #[cfg(feature = "tower")]
    pub(crate) fn not_ready(source: BoxError) -> Self {
        Error::new(ErrorKind::Transport)
            .with_failure(Some(FailureKind::Fatal))
            .with_source(source)
    }

    pub(crate) fn invalid_key(reason: InvalidKey, context: &str) -> Self {
        let mut err = Error::new(ErrorKind::InvalidKey).with_source(reason);
        err.inner.message = Some(context.to_owned());
        err
    }

    pub(crate) fn operation(kind: ErrorKind, report: RetryReport, outcome_unknown: bool) -> Self {
        let mut err = Error::new(kind);
        err.inner.report = report;
        err.inner.outcome_unknown = outcome_unknown;
        err
    }

    /// A `KeyReuse` refusal: nothing was sent, and the outcome is the held operation's.
    pub(crate) fn key_reuse(report: RetryReport, held: HeldOperation) -> Self {
        let mut err = Error::operation(ErrorKind::KeyReuse, report, held.may_have_run());
        err.inner.held = Some(held);
        err
    }

    /// For [`ErrorKind::KeyReuse`]: what the ledger holds under the key (its status, request,
    /// first attempt and saved answer's status) and the part of this request that differs.
    /// `None` for every other kind.
    #[must_use]
    pub fn held_operation(&self) -> Option<&HeldOperation> {
        self.inner.held.as_ref()
    }

    /// Names the request the operation was for, unless a request is named already.
    pub(crate) fn for_request(mut self, target: Target) -> Self {
        if self.inner.target.is_none() {
            self.inner.target = Some(target);
        }
        self
    }

    pub(crate) fn with_message(mut self, message: impl Into<String>) -> Self {
        self.inner.message = Some(message.into());
        self
    }

    /// An earlier run of the same operation may have been executed.
    pub(crate) fn mark_outcome_unknown(&mut self) {
        self.inner.outcome_unknown = true;
    }

    pub(crate) fn with_source(
        mut self,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    pub(crate) fn with_failure(mut self, failure: Option<FailureKind>) -> Self {
        self.inner.failure = failure;
        self
    }

    pub(crate) fn with_response<R: Send + 'static>(
        mut self,
        status: StatusCode,
        response: R,
    ) -> Self {
        self.inner.status = Some(status);
        self.inner.response = SyncWrapper::new(Some(Box::new(response)));
        self
    }

    /// The last response's status, when the response itself is gone.
    pub(crate) fn with_status(mut self, status: Option<StatusCode>) -> Self {
        self.inner.status = status;
        self
    }

    pub(crate) fn with_retry_after(mut self, asked: Duration) -> Self {
        self.inner.retry_after = Some(asked);
        self
    }

    pub(crate) fn with_window(mut self, window: Duration) -> Self {
        self.inner.window = Some(window);
        self
    }

    /// For `StillInProgress`: the policy's `limit`, and how long since the first in-progress
    /// answer the operation stopped.
    pub(crate) fn with_in_progress(mut self, limit: Duration, waited: Duration) -> Self {
        self.inner.in_progress = Some(InProgressWait { limit, waited });
        self
    }

    /// What went wrong.
    #[must_use]
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// How many attempts were made (0 when the request was refused before sending).
    #[must_use]
    pub fn attempts(&self) -> u32 {
        self.inner.report.attempts()
    }

    /// The request's method (`"POST"`). `None` for an error that came before there was a
    /// request to send: a [`ClientBuilder`](crate::ClientBuilder) that could not build, a
    /// request that could not be built (an invalid URL or header), a tower service whose
    /// `poll_ready` failed before the call.
    #[must_use]
    pub fn method(&self) -> Option<&str> {
        self.inner
            .target
            .as_ref()
            .map(|target| target.method.as_str())
    }

    /// The URL the operation was sent to (before any redirect), without the user name and
    /// password it may carry and without a fragment; its path and query are kept, as a ledger
    /// row records them ([`HeldOperation::url`] is the same text for the same request).
    /// `None` when [`method`](Self::method) is, and for a tower request whose URI is not
    /// absolute (a path alone names no server).
    #[must_use]
    pub fn url(&self) -> Option<&str> {
        self.inner.target.as_ref()?.url.as_ref().map(Url::as_str)
    }

    /// The key every attempt carried: reconcile with it, or retry later with it.
    #[must_use]
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        self.inner.report.idempotency_key()
    }

    /// Whether the server may have executed the operation.
    ///
    /// `true` when any attempt was sent and then timed out, was reset or closed, or answered
    /// 5xx or 409 (in progress): the side effect may have happened. Reconcile using
    /// [`idempotency_key`](Self::idempotency_key), or retry later with the same key.
    ///
    /// `false` when no attempt can have been executed: every attempt failed to connect or
    /// resolve, or was refused (429, 408), or nothing was sent. It is then safe to try again
    /// later, even with a new key.
    ///
    /// For [`ErrorKind::KeyReuse`] (nothing sent) it answers for the operation the ledger
    /// holds under the key: `true` unless that one cannot have run
    /// ([`HeldOperation::may_have_run`]), so the key's operation is never taken for not done.
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        self.inner.outcome_unknown
    }

    /// The last response's status, when the last attempt got a response.
    #[must_use]
    pub fn status(&self) -> Option<StatusCode> {
        self.inner.status
    }

    /// What the server asked to wait (`Retry-After` or `retry-after-ms`), for
    /// [`ErrorKind::RetryAfterTooLong`], and for [`ErrorKind::StillInProgress`] when the wait
    /// asked for would have ended past the limit on waiting. `None` otherwise.
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// Whether the last attempt timed out.
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        self.inner.failure == Some(FailureKind::Timeout)
    }

    /// How the last attempt failed, when it did.
    #[must_use]
    pub fn failure(&self) -> Option<FailureKind> {
        self.inner.failure
    }

    /// Time from the first attempt to the end of the last one.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        self.inner.report.elapsed()
    }

    /// The full account of the operation.
    #[must_use]
    pub fn report(&self) -> &RetryReport {
        &self.inner.report
    }

    /// The error's message, followed by its deepest cause when the message does not already
    /// say it: `... (last failure: connect failed) ... (cause: invalid peer certificate:
    /// UnknownIssuer)`. For a person reading one line, as a command's report is.
    #[must_use]
    pub fn message_with_cause(&self) -> String {
        let message = self.to_string();
        let mut deepest: Option<&(dyn StdError + 'static)> = None;
        let mut next = StdError::source(self);
        while let Some(cause) = next {
            deepest = Some(cause);
            next = cause.source();
        }
        match deepest.map(ToString::to_string) {
            Some(cause) if !message.contains(&cause) => format!("{message} (cause: {cause})"),
            _ => message,
        }
    }

    /// Takes the last response out of the error, when the last attempt got one. Its body has
    /// not been read. Returns `None` on the second call.
    pub fn take_response(&mut self) -> Option<reqwest::Response> {
        self.take_response_as::<reqwest::Response>()
    }

    /// Takes the last response out of the error as the type the front end returns: an
    /// `http::Response<B>` from a tower service over `http::Request`s, a `reqwest::Response`
    /// from the client, the middleware or a tower service over `reqwest::Client`.
    ///
    /// Returns `None` when there is no response, when it was taken already, or when `R` is not
    /// its type (the response then stays in the error).
    pub fn take_response_as<R: Send + 'static>(&mut self) -> Option<R> {
        let slot = self.inner.response.get_mut();
        match slot.take()?.downcast::<R>() {
            Ok(response) => Some(*response),
            Err(other) => {
                *slot = Some(other);
                None
            }
        }
    }

    fn describe(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        if let Some(target) = &inner.target {
            write!(f, "{target}: ")?;
        }
        let attempts = inner.report.attempts();
        let plural = if attempts == 1 { "" } else { "s" };
        if let (ErrorKind::KeyReuse, Some(held)) = (inner.kind, &inner.held) {
            return self.describe_key_reuse(f, held);
        }
        match inner.kind {
            ErrorKind::Builder => {
                f.write_str("invalid configuration")?;
                if let Some(message) = &inner.message {
                    write!(f, ": {message}")?;
                }
                return Ok(());
            }
            ErrorKind::InvalidKey => {
                f.write_str("invalid idempotency key")?;
                if let Some(message) = &inner.message {
                    write!(f, " ({message})")?;
                }
                return Ok(());
            }
            // Done, not "not executed": it ran, only its answer's body is missing.
            ErrorKind::AnswerNotSaved => {
                write!(f, "{}", inner.kind)?;
                if let Some(message) = &inner.message {
                    write!(f, ": {message}")?;
                }
                if let Some(key) = inner.report.idempotency_key() {
                    write!(f, "; idempotency key {key}")?;
                }
                return Ok(());
            }
            ErrorKind::AttemptsExhausted => {
                write!(f, "gave up after {attempts} attempt{plural}")?;
                let waits = inner.report.in_progress_waits();
                if waits > 0 {
                    write!(
                        f,
                        ", {waits} of them answered \"in progress\" and waited out (not counted \
                         toward the limit)"
                    )?;
                }
            }
            ErrorKind::StillInProgress => self.describe_in_progress(f)?,
            ErrorKind::ReconcileWindow => {
                f.write_str("reconcile window")?;
                if let Some(window) = inner.window {
                    write!(f, " of {}", crate::time::readable::duration(window))?;
                }
                write!(
                    f,
                    " would end before the next attempt, after {attempts} attempt{plural}: reconcile, do not retry"
                )?;
                if let Some(message) = &inner.message {
                    write!(f, " ({message})")?;
                }
            }
            ErrorKind::RetryAfterTooLong => {
                f.write_str("server asked to wait")?;
                if let Some(asked) = inner.retry_after {
                    write!(f, " {}", crate::time::readable::duration(asked))?;
                }
                write!(f, ", longer than allowed, after {attempts} attempt{plural}")?;
            }
            ErrorKind::BodyNotReplayable => {
                f.write_str("request failed and its streamed body cannot be sent again")?;
            }
            ErrorKind::TooManyRedirects => {
                write!(f, "too many redirects, after {attempts} attempt{plural}")?;
            }
            ErrorKind::BudgetExhausted => {
                write!(
                    f,
                    "retry budget exhausted after {attempts} attempt{plural}, retry not sent: \
                     failed retries across the client used it up; if the service is healthy, \
                     size it with RetryBudgetConfig::with_capacity"
                )?;
            }
            ErrorKind::KeyReuse | ErrorKind::LeaseHeld | ErrorKind::Ledger => {
                write!(f, "{}", inner.kind)?;
                if let Some(message) = &inner.message {
                    write!(f, ": {message}")?;
                }
            }
            ErrorKind::Transport => {
                f.write_str("request failed")?;
                if self.inner.outcome_unknown && inner.report.idempotency_key().is_none() {
                    f.write_str(
                        " and was not retried: it has no idempotency key and may have reached the server",
                    )?;
                }
            }
        }
        if let Some(status) = inner.status {
            write!(f, " (last status {status})")?;
        } else if let Some(failure) = inner.failure {
            write!(f, " (last failure: {failure})")?;
        }
        if inner.outcome_unknown {
            f.write_str("; outcome unknown: it may have run")?;
        } else {
            f.write_str("; not executed")?;
        }
        if let Some(key) = inner.report.idempotency_key() {
            write!(f, "; idempotency key {key}")?;
        }
        Ok(())
    }
}

/// How long an operation waited for a receiver that reported it in progress, when it stopped.
#[derive(Debug, Clone, Copy)]
struct InProgressWait {
    /// `RetryPolicy::max_in_progress_wait`.
    limit: Duration,
    /// Since the first in-progress answer.
    waited: Duration,
}

impl Error {
    /// `the receiver still reported the operation in progress after 1m (14 attempts): …`, or
    /// why the wait it asked for was not taken.
    fn describe_in_progress(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::time::readable::duration;
        let inner = &self.inner;
        let attempts = inner.report.attempts();
        let plural = if attempts == 1 { "" } else { "s" };
        match (inner.in_progress, inner.retry_after) {
            (Some(wait), Some(asked)) => write!(
                f,
                "the receiver still reported the operation in progress after {} and asked to \
                 wait {} more, past the {} limit on waiting for it",
                duration(wait.waited),
                duration(asked),
                duration(wait.limit)
            )?,
            (Some(wait), None) if wait.limit.is_zero() => f.write_str(
                "the receiver reported the operation in progress, and waiting for it is off \
                 (max_in_progress_wait is 0)",
            )?,
            (Some(wait), None) => write!(
                f,
                "the receiver still reported the operation in progress after {}",
                duration(wait.limit)
            )?,
            (None, _) => f.write_str("the receiver still reported the operation in progress")?,
        }
        write!(
            f,
            " ({attempts} attempt{plural}): send it again later with the same key to get its \
             result, or reconcile; RetryPolicy::with_max_in_progress_wait sets how long to wait"
        )
    }

    /// `idempotency key reused for a different request: key K is recorded as …; nothing was
    /// sent; the key's operation is done: …`, each fact once.
    fn describe_key_reuse(&self, f: &mut fmt::Formatter<'_>, held: &HeldOperation) -> fmt::Result {
        use idempotent_retry_ledger::OperationStatus;
        let inner = &self.inner;
        f.write_str("idempotency key reused for a different request: ")?;
        if let Some(key) = inner.report.idempotency_key() {
            write!(f, "key {key} is ")?;
        }
        write!(f, "{held}; nothing was sent; ")?;
        match (held.status, held.answered) {
            (OperationStatus::Succeeded, _) => f.write_str(
                "the key's operation is done: do not send that operation again under a new \
                     key; a different operation needs a key of its own",
            ),
            (OperationStatus::FailedFinal, Some(answered)) => write!(
                f,
                "the key's operation was answered {}: act on that answer before sending \
                 anything under a new key",
                answered.as_u16()
            ),
            (OperationStatus::FailedFinal | OperationStatus::NotSent, _) => f.write_str(
                "the key's operation cannot have run: a new key for this request is safe",
            ),
            _ => f.write_str(
                "the key's operation may have run: reconcile it by this key, do not send that \
                 operation under a new key; a different operation needs a key of its own",
            ),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.describe(f)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("Error")
            .field("kind", &inner.kind)
            .field("method", &self.method())
            .field("url", &self.url())
            .field("attempts", &inner.report.attempts())
            .field("key", &inner.report.idempotency_key())
            .field("outcome_unknown", &inner.outcome_unknown)
            .field("failure", &inner.failure)
            .field("status", &inner.status)
            .field("retry_after", &inner.retry_after)
            .field("message", &inner.message)
            .field("held", &inner.held)
            .field("source", &inner.source)
            .finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.inner
            .source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

impl Error {
    /// An [`ErrorKind::Ledger`] error: the operation, as far as it got, with the ledger's
    /// failure as the source.
    pub(crate) fn ledger(
        report: RetryReport,
        outcome_unknown: bool,
        message: impl Into<String>,
        source: idempotent_retry_ledger::LedgerError,
    ) -> Self {
        // The ledger's own words in the message too: "table ... is missing: run migrate()"
        // must reach a person who prints the error, not only one who walks its sources.
        let message = format!("{} ({source})", message.into());
        Error::operation(ErrorKind::Ledger, report, outcome_unknown)
            .with_message(message)
            .with_source(source)
    }
}

/// The request an operation was for, as its error names it: the method, and the URL without
/// credentials or fragment (`None` for a request whose URI is not absolute).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    method: Method,
    url: Option<Url>,
}

impl Target {
    /// `request`'s method and URL. One copy of the URL, whose credentials are removed before
    /// anything can show it.
    pub(crate) fn of<Q: RetryRequest>(request: &Q) -> Self {
        let url = request.url().map(|mut url| {
            strip_credentials(&mut url);
            url.set_fragment(None);
            url
        });
        Target {
            method: request.method().clone(),
            url,
        }
    }
}

/// `POST https://api.example.com/…`: the method and the URL's origin, with `/…` where a path
/// other than `/` or a query was left out.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(url) = &self.url else {
            return write!(f, "{} request", self.method);
        };
        let origin = url.origin();
        if origin.is_tuple() {
            write!(f, "{} {}", self.method, origin.ascii_serialization())?;
            if url.path() != "/" || url.query().is_some() {
                f.write_str("/…")?;
            }
            Ok(())
        } else {
            write!(f, "{} {}:…", self.method, url.scheme())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync_static<T: Send + Sync + 'static>() {}

    #[test]
    fn message_with_cause_adds_the_deepest_cause_once() {
        let reason = crate::IdempotencyKey::new("").expect_err("an empty key is invalid");
        let cause = reason.to_string();
        let err = Error::invalid_key(reason, "--key");
        let line = err.message_with_cause();
        assert!(line.starts_with(&err.to_string()), "{line}");
        assert_eq!(line.matches(cause.as_str()).count(), 1, "{line}");
        // No source: the message alone.
        let plain = Error::builder("max_attempts must be at least 1");
        assert_eq!(plain.message_with_cause(), plain.to_string());
    }

    #[test]
    fn error_is_send_sync_static_and_small() {
        assert_send_sync_static::<Error>();
        assert_eq!(std::mem::size_of::<Error>(), std::mem::size_of::<usize>());
        assert_eq!(
            std::mem::size_of::<Result<(), Error>>(),
            std::mem::size_of::<usize>()
        );
    }

    #[test]
    fn kinds_have_lowercase_names() {
        let kinds = [
            (ErrorKind::AttemptsExhausted, "attempts exhausted"),
            (ErrorKind::ReconcileWindow, "reconcile window ended"),
            (
                ErrorKind::RetryAfterTooLong,
                "server asked to wait too long",
            ),
            (
                ErrorKind::BodyNotReplayable,
                "request body cannot be replayed",
            ),
            (ErrorKind::InvalidKey, "invalid idempotency key"),
            (ErrorKind::Transport, "transport error"),
            (ErrorKind::Builder, "invalid configuration"),
            (ErrorKind::BudgetExhausted, "retry budget exhausted"),
            (
                ErrorKind::KeyReuse,
                "idempotency key reused for a different request",
            ),
            (ErrorKind::LeaseHeld, "operation lease held by another run"),
            (ErrorKind::Ledger, "ledger failure"),
            (ErrorKind::TooManyRedirects, "too many redirects"),
            (
                ErrorKind::StillInProgress,
                "operation still in progress at the receiver",
            ),
        ];
        for (kind, name) in kinds {
            assert_eq!(kind.to_string(), name);
        }
    }

    #[test]
    fn messages_are_lowercase_without_period() {
        let key = IdempotencyKey::new("k_123").expect("valid key");
        let mut report = RetryReport::new(Some(key));
        report.attempts = 5;
        let err = Error::operation(ErrorKind::AttemptsExhausted, report, true)
            .with_failure(Some(FailureKind::ConnectionReset));
        let text = err.to_string();
        assert_eq!(
            text,
            "gave up after 5 attempts (last failure: connection reset); outcome unknown: it may \
             have run; idempotency key k_123"
        );
        assert!(!text.ends_with('.'));
        let text = Error::builder("max_attempts must be at least 1").to_string();
        assert_eq!(
            text,
            "invalid configuration: max_attempts must be at least 1"
        );
    }

    #[test]
    fn a_budget_refusal_says_how_to_size_the_budget() {
        let key = IdempotencyKey::new("k_9").expect("valid key");
        let mut report = RetryReport::new(Some(key));
        report.attempts = 1;
        let err = Error::operation(ErrorKind::BudgetExhausted, report, false)
            .with_failure(Some(FailureKind::Throttled));
        assert_eq!(
            err.to_string(),
            "retry budget exhausted after 1 attempt, retry not sent: failed retries across the \
             client used it up; if the service is healthy, size it with \
             RetryBudgetConfig::with_capacity (last failure: throttled); not executed; \
             idempotency key k_9"
        );
    }

    #[test]
    fn an_operation_still_in_progress_says_why_and_what_to_do() {
        let key = IdempotencyKey::new("k_11").expect("valid key");
        let mut report = RetryReport::new(Some(key));
        report.attempts = 14;
        let limit = Duration::from_secs(60);
        let err = Error::operation(ErrorKind::StillInProgress, report.clone(), true)
            .with_in_progress(limit, Duration::from_millis(60_250))
            .with_failure(Some(FailureKind::InProgress))
            .with_status(Some(StatusCode::CONFLICT));
        assert_eq!(
            err.to_string(),
            "the receiver still reported the operation in progress after 1m (14 attempts): \
             send it again later with the same key to get its result, or reconcile; \
             RetryPolicy::with_max_in_progress_wait sets how long to wait (last status 409 \
             Conflict); outcome unknown: it may have run; idempotency key k_11"
        );
        assert_eq!(err.kind().as_str(), "still_in_progress");
        let asked = Error::operation(ErrorKind::StillInProgress, report.clone(), true)
            .with_in_progress(limit, Duration::from_secs(40))
            .with_retry_after(Duration::from_secs(30));
        assert!(
            asked.to_string().starts_with(
                "the receiver still reported the operation in progress after 40s and asked to \
                 wait 30s more, past the 1m limit on waiting for it (14 attempts): "
            ),
            "{asked}"
        );
        assert_eq!(asked.retry_after(), Some(Duration::from_secs(30)));
        let off = Error::operation(ErrorKind::StillInProgress, report, true)
            .with_in_progress(Duration::ZERO, Duration::ZERO);
        assert!(
            off.to_string()
                .contains("waiting for it is off (max_in_progress_wait is 0)"),
            "{off}"
        );
    }

    #[test]
    fn exhausted_attempts_say_how_many_were_waits() {
        let mut report = RetryReport::new(None);
        report.attempts = 5;
        let row = |number, failure, waited: bool| crate::outcome::report::AttemptRecord {
            number,
            started: Duration::ZERO,
            status: None,
            failure: Some(failure),
            wait: waited.then_some(crate::outcome::report::Wait {
                delay: Duration::from_millis(1),
                reason: crate::outcome::report::WaitReason::Backoff {
                    ceiling: Duration::from_millis(1),
                },
            }),
        };
        report.history = vec![
            row(1, FailureKind::ServerError, true),
            row(2, FailureKind::InProgress, true),
            row(3, FailureKind::InProgress, true),
            row(4, FailureKind::ServerError, true),
            row(5, FailureKind::ServerError, false),
        ];
        let err = Error::operation(ErrorKind::AttemptsExhausted, report, true)
            .with_failure(Some(FailureKind::ServerError));
        assert_eq!(
            err.to_string(),
            "gave up after 5 attempts, 2 of them answered \"in progress\" and waited out (not \
             counted toward the limit) (last failure: server error); outcome unknown: it may \
             have run"
        );
    }

    fn exhausted(key: &str, attempts: u32) -> Error {
        let key = IdempotencyKey::new(key).expect("valid key");
        let mut report = RetryReport::new(Some(key));
        report.attempts = attempts;
        Error::operation(ErrorKind::AttemptsExhausted, report, true)
            .with_failure(Some(FailureKind::Timeout))
    }

    #[test]
    fn an_error_names_its_request_without_credentials() {
        let request = reqwest::Request::new(
            Method::POST,
            Url::parse("https://alice:pa55word@api.example.com:8443/v1/charges?order=17#receipt")
                .expect("a URL"),
        );
        let err = exhausted("k_7", 3).for_request(Target::of(&request));
        assert_eq!(err.method(), Some("POST"));
        assert_eq!(
            err.url(),
            Some("https://api.example.com:8443/v1/charges?order=17")
        );
        assert_eq!(
            err.to_string(),
            "POST https://api.example.com:8443/…: gave up after 3 attempts (last failure: \
             attempt timed out); outcome unknown: it may have run; idempotency key k_7"
        );
        let debug = format!("{err:?}");
        assert!(
            debug.contains(r#"method: Some("POST"), url: Some("https://api.example.com:8443/v1/charges?order=17")"#),
            "{debug}"
        );
        for shown in [err.to_string(), debug] {
            assert!(
                !shown.contains("pa55word") && !shown.contains("alice"),
                "{shown}"
            );
        }
    }

    #[test]
    fn the_origin_alone_has_no_ellipsis_and_a_relative_uri_no_url() {
        let root = reqwest::Request::new(
            Method::GET,
            Url::parse("https://api.example.com/").expect("a URL"),
        );
        let err = exhausted("k_8", 1).for_request(Target::of(&root));
        assert!(
            err.to_string()
                .starts_with("GET https://api.example.com: gave up after 1 attempt "),
            "{err}"
        );
        // The first request named stays.
        let other = http::Request::builder()
            .method(Method::PUT)
            .uri("/v1/charges")
            .body(())
            .expect("a request");
        let err = err.for_request(Target::of(&other));
        assert_eq!(err.method(), Some("GET"));
        let relative = exhausted("k_9", 2).for_request(Target::of(&other));
        assert_eq!(relative.method(), Some("PUT"));
        assert_eq!(relative.url(), None);
        assert!(
            relative
                .to_string()
                .starts_with("PUT request: gave up after 2 attempts "),
            "{relative}"
        );
    }

    #[test]
    fn an_error_before_any_request_names_none() {
        let err = Error::builder("max_attempts must be at least 1");
        assert_eq!((err.method(), err.url()), (None, None));
        assert_eq!(
            err.to_string(),
            "invalid configuration: max_attempts must be at least 1"
        );
        assert!(
            format!("{err:?}").contains("method: None, url: None"),
            "{err:?}"
        );
    }

    #[test]
    fn the_last_response_is_taken_once_and_only_as_its_own_type() {
        let response = http::Response::builder()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .body("busy")
            .expect("a response");
        let mut err = exhausted("k_10", 1).with_response(StatusCode::SERVICE_UNAVAILABLE, response);
        assert!(err.take_response().is_none(), "not a reqwest::Response");
        assert!(err.take_response_as::<http::Response<String>>().is_none());
        let taken = err
            .take_response_as::<http::Response<&str>>()
            .expect("still there after the wrong types");
        assert_eq!(*taken.body(), "busy");
        assert!(err.take_response_as::<http::Response<&str>>().is_none());
        assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    }
}
