//! What one operation gave back, as Python reads it: a response, or why there is none, with
//! the engine's report either way.

use std::sync::Mutex;

use idempotent_retry::{Error, FailureKind, RetryReport};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::runtime::{Born, runtime};

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
    /// The response's body, or its first part when `rest` is set.
    pub body: Option<Py<PyBytes>>,
    /// The rest of a body that is streamed (no `Content-Length`, or a long one), read with
    /// `ResponseBody.read_chunk` or `start_read`; `None` when `body` is all of it.
    pub rest: Option<Py<ResponseBody>>,
    /// `"HTTP/1.1"`, `"HTTP/2"`, ...: the response's version.
    pub http_version: String,
    /// Attempts sent, this run (0 for an answer replayed from the ledger).
    pub attempts: u32,
    /// The operation's idempotency key, if it had one.
    pub key: Option<String>,
    /// Whether the response was replayed from the ledger, nothing sent.
    pub replayed: bool,
    /// The URL that gave the response: the request's, or the last hop of the redirects the
    /// engine followed (for a replay, those its first run followed). `None` without one.
    pub url: Option<String>,
    /// Seconds from the first attempt to the end of the last, plus `lease_wait`.
    pub elapsed: f64,
    /// Seconds the ledger's claim waited, before anything was sent, for another run holding
    /// the key: that run's answer replayed, or its lapsed lease taken over. 0 without a wait.
    pub lease_wait: f64,
    /// Why the response was not recorded in the ledger as this run's outcome, when it was not
    /// (another run took the key over while the answer arrived); the response is still the
    /// operation's. `None` when it was recorded, or without a ledger.
    pub unrecorded: Option<String>,
    /// Answers that said the operation was still in progress at the receiver (a keyed 409),
    /// each waited out: counted in `attempts`, not toward `max_attempts`.
    pub in_progress_waits: u32,
    /// Seconds spent waiting those out (counted in `elapsed`).
    pub in_progress_wait: f64,
    /// Whether the ledger held the operation as succeeded without its answer's body (longer
    /// than `max_saved_body`), so it was sent again with its key and this is the receiver's
    /// answer from its own store.
    pub refetched: bool,
    /// The status the error names when there is no response to carry it: the saved answer's
    /// of an `answer_not_saved` (outcome done). `None` with a response, or without a status.
    pub error_status: Option<u16>,
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
    /// One `(number, started, status, failure, wait)` per attempt, in order: its number (1
    /// for the first), when it started (seconds from the first attempt's start), the status
    /// of its response, how it failed (`FailureKind::as_str`) when it was not final, and the
    /// seconds waited after it when another attempt followed.
    pub history: Vec<AttemptRow>,
}

/// One attempt of `Answer.history`.
pub(crate) type AttemptRow = (u32, f64, Option<u16>, Option<&'static str>, Option<f64>);

/// The rows of a report's history.
fn rows(report: &RetryReport) -> Vec<AttemptRow> {
    report
        .history()
        .iter()
        .map(|attempt| {
            (
                attempt.number,
                attempt.started.as_secs_f64(),
                attempt.status.map(|status| status.as_u16()),
                attempt.failure.map(FailureKind::as_str),
                attempt.wait.map(|wait| wait.delay.as_secs_f64()),
            )
        })
        .collect()
}

/// `err` and each of its causes that says more, joined with `: `: reqwest's own message for a
/// body that failed ("error reading a body from connection") says nothing of the cause, and
/// the engine's note on a streamed answer cut midway (its key, and how to have the answer
/// again) is one of the causes.
pub(crate) fn with_causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

/// A response's head and body: read whole, or streamed (`rest`).
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) body: bytes::Bytes,
    pub(crate) rest: Option<reqwest::Response>,
    pub(crate) version: http::Version,
}

impl Received {
    /// Reads `response`'s body to its end when its length is known and at most `limit`, the
    /// engine's `answer_read_limit` (the engine reads a final answer's body of that length
    /// inside its attempt, so it is in memory already and cannot fail midway here; the last
    /// attempt's answer of an operation that stopped without a final one may still be on the
    /// wire); otherwise keeps the response to stream the body from (no length, or a longer
    /// one: chunked answers, server-sent events, downloads).
    pub(crate) async fn read(
        response: reqwest::Response,
        limit: usize,
    ) -> Result<Received, reqwest::Error> {
        let status = response.status().as_u16();
        let version = response.version();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes().to_vec(), value.as_bytes().to_vec()))
            .collect();
        let whole = response
            .content_length()
            .is_some_and(|length| u64::try_from(limit).map_or(true, |limit| length <= limit));
        let (body, rest) = if whole {
            (response.bytes().await?, None)
        } else {
            (bytes::Bytes::new(), Some(response))
        };
        Ok(Received {
            status,
            headers,
            body,
            rest,
            version,
        })
    }
}

/// What a refusal after a fork calls a response body.
const BODY: &str = "this response's body";

/// The rest of a streamed response body, read from Python chunk by chunk.
#[pyclass(module = "idempotent_retry._native", frozen)]
#[derive(Debug)]
pub struct ResponseBody {
    response: Mutex<Option<reqwest::Response>>,
    /// The process the response's connection belongs to.
    born: Born,
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        if !self.born.is_here() {
            // A child of a fork: the connection is the parent's (see `Engine`'s `Drop`).
            std::mem::forget(self.take());
        }
    }
}

/// The next chunk of `response`, and the response to read the one after from.
async fn next_chunk(
    mut response: reqwest::Response,
) -> (
    Result<Option<bytes::Bytes>, String>,
    Option<reqwest::Response>,
) {
    match response.chunk().await {
        Ok(Some(chunk)) => (Ok(Some(chunk)), Some(response)),
        Ok(None) => (Ok(None), None),
        Err(err) => (
            Err(format!(
                "the response's body was cut off: {}",
                with_causes(&err)
            )),
            None,
        ),
    }
}

impl ResponseBody {
    fn take(&self) -> Option<reqwest::Response> {
        self.response
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    fn put(&self, response: Option<reqwest::Response>) {
        *self
            .response
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = response;
    }
}

/// Calls `done(chunk, error)`; an exception it raises is printed, as Python prints one raised
/// by a callback nobody can catch it from.
fn call_done(
    py: Python<'_>,
    done: &Py<PyAny>,
    chunk: Option<Bound<'_, PyBytes>>,
    error: Option<String>,
) {
    if let Err(err) = done.call1(py, (chunk, error)) {
        err.print(py);
    }
}

#[pymethods]
impl ResponseBody {
    /// The next chunk, waited for with the GIL released; `None` at the end.
    ///
    /// # Errors
    ///
    /// `OSError` when the connection fails before the body's end.
    fn read_chunk(&self, py: Python<'_>) -> PyResult<Option<Py<PyBytes>>> {
        self.born.check(BODY)?;
        // Before the response is taken: a refusal leaves it where it is.
        let runtime = runtime()?;
        let Some(response) = self.take() else {
            return Ok(None);
        };
        let (chunk, response) = py.detach(|| runtime.block_on(next_chunk(response)));
        self.put(response);
        match chunk {
            Ok(chunk) => Ok(chunk.map(|chunk| PyBytes::new(py, &chunk).unbind())),
            Err(message) => Err(PyOSError::new_err(message)),
        }
    }

    /// Reads the next chunk on the runtime; `done(chunk, error)` is called from a runtime
    /// thread with the chunk (`None` at the end) or the error's message.
    fn start_read(slf: Py<Self>, py: Python<'_>, done: Py<PyAny>) {
        let runtime = match slf.get().born.check(BODY).and_then(|()| runtime()) {
            Ok(runtime) => runtime,
            Err(err) => return call_done(py, &done, None, Some(err.to_string())),
        };
        let Some(response) = slf.get().take() else {
            return call_done(py, &done, None, None);
        };
        runtime.spawn(async move {
            let (chunk, response) = next_chunk(response).await;
            Python::attach(|py| {
                slf.get().put(response);
                match chunk {
                    Ok(chunk) => {
                        let chunk = chunk.map(|chunk| PyBytes::new(py, &chunk));
                        call_done(py, &done, chunk, None);
                    }
                    Err(message) => call_done(py, &done, None, Some(message)),
                }
            });
        });
    }

    /// Stops reading: the rest of the body is dropped with its connection.
    fn close(&self) {
        drop(self.take());
    }
}

/// What the engine's task hands back to Python, before Python objects are made of it.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) received: Option<Received>,
    pub(crate) attempts: u32,
    pub(crate) key: Option<String>,
    pub(crate) replayed: bool,
    pub(crate) url: Option<String>,
    pub(crate) elapsed: f64,
    pub(crate) lease_wait: f64,
    pub(crate) unrecorded: Option<String>,
    pub(crate) in_progress_waits: u32,
    pub(crate) in_progress_wait: f64,
    pub(crate) refetched: bool,
    pub(crate) error_status: Option<u16>,
    pub(crate) outcome: &'static str,
    pub(crate) error_kind: Option<&'static str>,
    pub(crate) failure: Option<&'static str>,
    pub(crate) message: Option<String>,
    pub(crate) history: Vec<AttemptRow>,
}

impl Finished {
    /// A response and its report, its body read when it is at most `limit` long; a body cut
    /// off is a failure of its own, the operation done (its answer's head came back).
    pub(crate) async fn from_response(response: reqwest::Response, limit: usize) -> Finished {
        let report = RetryReport::of(&response).cloned();
        let history = report.as_ref().map(rows).unwrap_or_default();
        let url = Some(response.url().as_str().to_owned());
        let (attempts, key, replayed, elapsed) =
            report.as_ref().map_or((0, None, false, 0.0), |r| {
                (
                    r.attempts(),
                    r.idempotency_key().map(|key| key.as_str().to_owned()),
                    r.is_replayed(),
                    r.elapsed().as_secs_f64(),
                )
            });
        let lease_wait = report
            .as_ref()
            .map_or(0.0, |r| r.lease_wait().as_secs_f64());
        let unrecorded = report
            .as_ref()
            .and_then(|r| r.unrecorded().map(str::to_owned));
        let (in_progress_waits, in_progress_wait, refetched) =
            report.as_ref().map_or((0, 0.0, false), |r| {
                (
                    r.in_progress_waits(),
                    r.in_progress_wait().as_secs_f64(),
                    r.is_refetched(),
                )
            });
        match Received::read(response, limit).await {
            Ok(received) => Finished {
                received: Some(received),
                attempts,
                key,
                replayed,
                url: url.clone(),
                elapsed,
                lease_wait,
                unrecorded,
                in_progress_waits,
                in_progress_wait,
                refetched,
                error_status: None,
                outcome: "done",
                error_kind: None,
                failure: None,
                message: None,
                history,
            },
            Err(err) => Finished {
                received: None,
                attempts,
                key,
                replayed,
                url,
                elapsed,
                lease_wait,
                unrecorded,
                in_progress_waits,
                in_progress_wait,
                refetched,
                error_status: None,
                outcome: "done",
                error_kind: Some("body"),
                failure: Some(if err.is_timeout() {
                    "timeout"
                } else {
                    "connection_closed"
                }),
                message: Some(format!(
                    "the response's head arrived, then its body was cut off: {}",
                    with_causes(&err)
                )),
                history,
            },
        }
    }

    /// An error, with the last attempt's response when it has one (its body read when it is
    /// at most `limit` long; a response whose body is cut while it is read is left out).
    pub(crate) async fn from_error(mut err: Error, limit: usize) -> Finished {
        let outcome = err.outcome().as_str();
        let received = match err.take_response() {
            Some(response) => Received::read(response, limit).await.ok(),
            None => None,
        };
        let error_status = if received.is_none() {
            err.status().map(|status| status.as_u16())
        } else {
            None
        };
        Finished {
            received,
            attempts: err.attempts(),
            key: err.idempotency_key().map(|key| key.as_str().to_owned()),
            replayed: false,
            url: None,
            elapsed: err.elapsed().as_secs_f64(),
            lease_wait: err.report().lease_wait().as_secs_f64(),
            unrecorded: err.report().unrecorded().map(str::to_owned),
            in_progress_waits: err.report().in_progress_waits(),
            in_progress_wait: err.report().in_progress_wait().as_secs_f64(),
            refetched: err.report().is_refetched(),
            error_status,
            outcome,
            error_kind: Some(err.kind().as_str()),
            failure: err.failure().map(FailureKind::as_str),
            message: Some(err.message_with_cause()),
            history: rows(err.report()),
        }
    }

    /// The Python object.
    pub(crate) fn into_answer(self, py: Python<'_>) -> Answer {
        let (status, headers, body, rest, http_version) = match self.received {
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
                received.rest.and_then(|response| {
                    Py::new(
                        py,
                        ResponseBody {
                            response: Mutex::new(Some(response)),
                            born: Born::here(),
                        },
                    )
                    .ok()
                }),
                format!("{:?}", received.version),
            ),
            None => (None, Vec::new(), None, None, String::new()),
        };
        Answer {
            status,
            headers,
            body,
            rest,
            http_version,
            attempts: self.attempts,
            key: self.key,
            replayed: self.replayed,
            url: self.url,
            elapsed: self.elapsed,
            lease_wait: self.lease_wait,
            unrecorded: self.unrecorded,
            in_progress_waits: self.in_progress_waits,
            in_progress_wait: self.in_progress_wait,
            refetched: self.refetched,
            error_status: self.error_status,
            outcome: self.outcome,
            error_kind: self.error_kind,
            failure: self.failure,
            message: self.message,
            history: self.history,
        }
    }
}
