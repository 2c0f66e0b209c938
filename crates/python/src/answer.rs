//! What one operation gave back, as Python reads it: a response, or why there is none, with
//! the engine's report either way.

use idempotent_retry::{Error, FailureKind, Outcome, RetryReport};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The end of one operation: a response (`status` set) or a failure (`error_kind` set, and
/// possibly the last attempt's response too), with the report.
///
/// `outcome` is `"done"` when a final answer came back, `"not_done"` when the operation
/// certainly did not run, `"unknown"` when it may have run and no answer says whether.
#[pyclass(module = "idempotent_retry._native", frozen, get_all)]
#[derive(Debug)]
pub struct Answer {
    /// The response's status, or the last attempt's when the operation stopped on one;
    /// `None` without a response.
    pub status: Option<u16>,
    /// The response's headers in order, names and values as bytes.
    pub headers: Vec<(Py<PyBytes>, Py<PyBytes>)>,
    /// The response's body.
    pub body: Option<Py<PyBytes>>,
    /// `"HTTP/1.1"`, `"HTTP/2"`, ...: the response's version.
    pub http_version: String,
    /// Attempts sent, this run (0 for an answer replayed from the ledger).
    pub attempts: u32,
    /// The operation's idempotency key, if it had one.
    pub key: Option<String>,
    /// Whether the response was replayed from the ledger, nothing sent.
    pub replayed: bool,
    /// Seconds from the first attempt to the end of the last.
    pub elapsed: f64,
    /// `"done"`, `"not_done"` or `"unknown"`.
    pub outcome: &'static str,
    /// Why the operation stopped without a final answer (`attempts_exhausted`, `transport`,
    /// `key_reuse`, ...: `ErrorKind::as_str`), `None` when it has one.
    pub error_kind: Option<&'static str>,
    /// How the last attempt failed (`connect`, `timeout`, `connection_reset`,
    /// `connection_closed`, `server_error`, ...), when it did.
    pub failure: Option<&'static str>,
    /// The error's message for people, with its deepest cause.
    pub message: Option<String>,
}

/// `"done"`, `"not_done"` or `"unknown"`; a variant added later reads as unknown.
fn outcome_name(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Done { .. } => "done",
        Outcome::NotDone { .. } => "not_done",
        _ => "unknown",
    }
}

/// A stable snake-case name for how an attempt failed.
fn failure_name(failure: FailureKind) -> &'static str {
    match failure {
        FailureKind::Dns => "dns",
        FailureKind::Connect => "connect",
        FailureKind::Timeout => "timeout",
        FailureKind::ConnectionReset => "connection_reset",
        FailureKind::ConnectionClosed => "connection_closed",
        FailureKind::ServerError => "server_error",
        FailureKind::Throttled => "throttled",
        FailureKind::InProgress => "in_progress",
        FailureKind::RequestTimeout => "request_timeout",
        FailureKind::ServerHint => "server_hint",
        FailureKind::TooManyRedirects => "too_many_redirects",
        FailureKind::RedirectTargetUnreachable => "redirect_target_unreachable",
        _ => "fatal",
    }
}

/// The error's message, and its deepest cause when that says more.
fn with_cause(err: &Error) -> String {
    let mut deepest: Option<&dyn std::error::Error> = None;
    let mut next = std::error::Error::source(err);
    while let Some(cause) = next {
        deepest = Some(cause);
        next = cause.source();
    }
    match deepest.map(ToString::to_string) {
        Some(cause) if !err.to_string().contains(&cause) => format!("{err} (cause: {cause})"),
        _ => err.to_string(),
    }
}

/// A response read to its end: head, body, the engine's report.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) body: bytes::Bytes,
    pub(crate) version: http::Version,
}

impl Received {
    /// Reads `response`'s body to its end.
    pub(crate) async fn read(response: reqwest::Response) -> Result<Received, reqwest::Error> {
        let status = response.status().as_u16();
        let version = response.version();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
            .collect();
        let body = response.bytes().await?;
        Ok(Received {
            status,
            headers,
            body,
            version,
        })
    }
}

/// What the engine's task hands back to Python, before Python objects are made of it.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) received: Option<Received>,
    pub(crate) attempts: u32,
    pub(crate) key: Option<String>,
    pub(crate) replayed: bool,
    pub(crate) elapsed: f64,
    pub(crate) outcome: &'static str,
    pub(crate) error_kind: Option<&'static str>,
    pub(crate) failure: Option<&'static str>,
    pub(crate) message: Option<String>,
}

impl Finished {
    /// A response and its report, its body read; a body cut off is a failure of its own, the
    /// operation done (its answer's head came back).
    pub(crate) async fn from_response(response: reqwest::Response) -> Finished {
        let report = RetryReport::of(&response).cloned();
        let (attempts, key, replayed, elapsed) =
            report.as_ref().map_or((0, None, false, 0.0), |r| {
                (
                    r.attempts(),
                    r.idempotency_key().map(|key| key.as_str().to_owned()),
                    r.is_replayed(),
                    r.elapsed().as_secs_f64(),
                )
            });
        match Received::read(response).await {
            Ok(received) => Finished {
                received: Some(received),
                attempts,
                key,
                replayed,
                elapsed,
                outcome: "done",
                error_kind: None,
                failure: None,
                message: None,
            },
            Err(err) => Finished {
                received: None,
                attempts,
                key,
                replayed,
                elapsed,
                outcome: "done",
                error_kind: Some("body"),
                failure: Some(if err.is_timeout() {
                    "timeout"
                } else {
                    "connection_closed"
                }),
                message: Some(format!(
                    "the response's head arrived, then its body was cut off: {err}"
                )),
            },
        }
    }

    /// An error, with the last attempt's response when it has one.
    pub(crate) async fn from_error(mut err: Error) -> Finished {
        let outcome = outcome_name(&err.outcome());
        let received = match err.take_response() {
            Some(response) => Received::read(response).await.ok(),
            None => None,
        };
        Finished {
            received,
            attempts: err.attempts(),
            key: err.idempotency_key().map(|key| key.as_str().to_owned()),
            replayed: false,
            elapsed: err.elapsed().as_secs_f64(),
            outcome,
            error_kind: Some(err.kind().as_str()),
            failure: err.failure().map(failure_name),
            message: Some(with_cause(&err)),
        }
    }

    /// The Python object.
    pub(crate) fn into_answer(self, py: Python<'_>) -> Answer {
        let (status, headers, body, http_version) = match self.received {
            Some(received) => (
                Some(received.status),
                received
                    .headers
                    .iter()
                    .map(|(name, value)| {
                        (
                            PyBytes::new(py, name).unbind(),
                            PyBytes::new(py, value).unbind(),
                        )
                    })
                    .collect(),
                Some(PyBytes::new(py, &received.body).unbind()),
                format!("{:?}", received.version),
            ),
            None => (None, Vec::new(), None, String::new()),
        };
        Answer {
            status,
            headers,
            body,
            http_version,
            attempts: self.attempts,
            key: self.key,
            replayed: self.replayed,
            elapsed: self.elapsed,
            outcome: self.outcome,
            error_kind: self.error_kind,
            failure: self.failure,
            message: self.message,
        }
    }
}
