//! What one operation gave back, as Python reads it: a response, or why there is none, with
//! the engine's report either way.

use std::sync::Mutex;

use idempotent_retry_host::{AttemptRow, Finished, next_chunk};
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::runtime::{Born, runtime};

/// What a child of a fork is told to make again.
const REMAKE: &str = "transport";

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
        self.born.check(BODY, REMAKE).map_err(crate::error::to_py)?;
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
        let runtime = match slf
            .get()
            .born
            .check(BODY, REMAKE)
            .map_err(crate::error::to_py)
            .and_then(|()| runtime())
        {
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

impl Answer {
    /// The Python object of how an operation ended.
    pub(crate) fn from_finished(py: Python<'_>, finished: Finished) -> Answer {
        let (status, headers, body, rest, http_version) = match finished.received {
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
            attempts: finished.attempts,
            key: finished.key,
            replayed: finished.replayed,
            url: finished.url,
            elapsed: finished.elapsed,
            lease_wait: finished.lease_wait,
            unrecorded: finished.unrecorded,
            in_progress_waits: finished.in_progress_waits,
            in_progress_wait: finished.in_progress_wait,
            refetched: finished.refetched,
            error_status: finished.error_status,
            outcome: finished.outcome,
            error_kind: finished.error_kind,
            failure: finished.failure,
            message: finished.message,
            history: finished.history,
        }
    }
}
