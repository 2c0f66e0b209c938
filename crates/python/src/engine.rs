//! The engine Python sends through: an `idempotent_retry::Client` on the shared runtime, its
//! policy, key header and ledger set once, one operation per call.

use idempotent_retry_host as host;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::answer::Answer;
use crate::body::BodyStream;
use crate::error::to_py;
use crate::runtime::runtime;

/// What a refusal after a fork calls an engine.
const TRANSPORT: &str = "this transport";
/// What a child of a fork is told to make again.
const REMAKE: &str = "transport";

/// One client of the engine: sends operations with one key each, retries what is safe to
/// retry, and keeps them in a ledger when given one.
///
/// Every argument but `ledger`, `key_header`, `answer_read_limit` and `max_saved_body` is the
/// `RetryPolicy` or `LedgerOptions` setting of the same name, in seconds for durations; `None`
/// keeps the crate's default (5 attempts, 500 ms base delay, 30 s cap, 30 s attempt timeout,
/// 24 h reconcile window, 60 s longest `Retry-After`, 1 min of waiting out a receiver's "in
/// progress"; a 10 s lease; a lease held elsewhere waited for up to 4 min; answers saved up to
/// 64 KiB, a longer one fetched again with its key).
#[pyclass(module = "idempotent_retry._native", frozen)]
#[derive(Debug)]
pub struct Engine {
    inner: host::Engine,
}

/// A duration from Python's seconds.
///
/// # Errors
///
/// `ValueError` for a negative, infinite or NaN number.
fn seconds(name: &str, value: Option<f64>) -> PyResult<Option<std::time::Duration>> {
    value
        .map(|value| host::seconds(name, value))
        .transpose()
        .map_err(to_py)
}

/// A number of bytes from Python.
///
/// # Errors
///
/// `ValueError` for a negative one, naming the option and its default.
fn bytes(name: &str, value: Option<i64>, default: &str) -> PyResult<Option<usize>> {
    value
        .map(|bytes| {
            usize::try_from(bytes).map_err(|_| {
                pyo3::exceptions::PyValueError::new_err(format!(
                    "{name}: {bytes} is not a number of bytes; pass 0 or more (default {default})"
                ))
            })
        })
        .transpose()
}

#[pymethods]
impl Engine {
    /// A new engine. `ledger` is an SQLite file's path (created if missing) or a
    /// `postgres://` URL; `lease_wait` (seconds) makes a request whose key another run holds
    /// wait for it that long instead of failing at once; `worker` names this process in the
    /// ledger's rows; `ledger_scope` files every operation under that scope (default: the
    /// URL's host); `retry_budget=False` turns the client's retry budget off, and the
    /// `budget_*` arguments size it (`RetryBudgetConfig`: 500 tokens, a failed retry costs 5,
    /// a timed-out one 10, a first-attempt success gives 1 back). `verify=False` verifies no
    /// certificate; `ca_file` is a PEM file of the only roots trusted (default: the
    /// platform's); `cert_file` (with `key_file`, or holding the key too) is a PEM client
    /// certificate; `proxy` sends every request through that proxy (default: none).
    /// `answer_read_limit` (bytes) is the client's `ClientBuilder::answer_read_limit`: an
    /// answer whose `Content-Length` is at most this is read inside its attempt, so a body cut
    /// midway is a failed attempt, retried with the same key (default: 1 MiB); a longer one,
    /// or one without a length, is streamed. `max_in_progress_wait` (seconds) is
    /// `RetryPolicy::with_max_in_progress_wait`: how long a receiver's "in progress" (a keyed
    /// 409) is waited out, apart from the attempts (default 60; 0 stops at the first).
    /// `max_saved_body` (bytes) is `LedgerOptions::max_body`, the longest answer body the
    /// ledger keeps (default 65536, 64 KiB); `fetch_unsaved_answers` is
    /// `LedgerOptions::fetch_unsaved_answers`: a succeeded operation whose body was longer is
    /// sent again with its key inside its window (`True`, the default), or refused with
    /// `answer_not_saved` (`False`). `allow_key_to` are the origins besides a request's own
    /// that the key may go to on a redirect httpx follows (`RedirectPolicy::allow_key_to`;
    /// default: none). `seal_keys` (`ID:HEX` strings, the first sealing) is
    /// `LedgerOptions::seal_keys`: saved answers encrypted at rest (default: none);
    /// `keep_query_params` is `LedgerOptions::keep_query_params`: the query parameters whose
    /// values a row's URL keeps (default: none, every value stored as `…`).
    ///
    /// # Errors
    ///
    /// `ValueError` for an invalid policy, duration, header name, PEM file, proxy URL, seal
    /// key, origin in `allow_key_to`, `answer_read_limit` or `max_saved_body`; `FileNotFoundError`/`OSError` for a TLS file
    /// that cannot be read; `RuntimeError` when the ledger cannot be opened or the HTTP client cannot be built.
    #[new]
    #[pyo3(signature = (
        *,
        max_attempts = None,
        base_delay = None,
        max_delay = None,
        attempt_timeout = None,
        reconcile_window = None,
        max_retry_after = None,
        key_header = None,
        ledger = None,
        lease = None,
        lease_wait = None,
        worker = None,
        ledger_scope = None,
        retry_budget = true,
        budget_capacity = None,
        budget_retry_cost = None,
        budget_timeout_cost = None,
        budget_success_reward = None,
        verify = true,
        ca_file = None,
        cert_file = None,
        key_file = None,
        proxy = None,
        answer_read_limit = None,
        max_in_progress_wait = None,
        max_saved_body = None,
        fetch_unsaved_answers = true,
        allow_key_to = None,
        seal_keys = None,
        keep_query_params = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        max_attempts: Option<u32>,
        base_delay: Option<f64>,
        max_delay: Option<f64>,
        attempt_timeout: Option<f64>,
        reconcile_window: Option<f64>,
        max_retry_after: Option<f64>,
        key_header: Option<&str>,
        ledger: Option<String>,
        lease: Option<f64>,
        lease_wait: Option<f64>,
        worker: Option<String>,
        ledger_scope: Option<String>,
        retry_budget: bool,
        budget_capacity: Option<u32>,
        budget_retry_cost: Option<u32>,
        budget_timeout_cost: Option<u32>,
        budget_success_reward: Option<u32>,
        verify: bool,
        ca_file: Option<String>,
        cert_file: Option<String>,
        key_file: Option<String>,
        proxy: Option<String>,
        answer_read_limit: Option<i64>,
        max_in_progress_wait: Option<f64>,
        max_saved_body: Option<i64>,
        fetch_unsaved_answers: bool,
        allow_key_to: Option<Vec<String>>,
        seal_keys: Option<Vec<String>>,
        keep_query_params: Option<Vec<String>>,
    ) -> PyResult<Engine> {
        let settings = host::Settings {
            max_attempts,
            base_delay: seconds("base_delay", base_delay)?,
            max_delay: seconds("max_delay", max_delay)?,
            attempt_timeout: seconds("attempt_timeout", attempt_timeout)?,
            reconcile_window: seconds("reconcile_window", reconcile_window)?,
            max_retry_after: seconds("max_retry_after", max_retry_after)?,
            max_in_progress_wait: seconds("max_in_progress_wait", max_in_progress_wait)?,
            key_header: key_header.map(str::to_owned),
            ledger,
            lease: seconds("lease", lease)?,
            lease_wait: seconds("lease_wait", lease_wait)?,
            worker,
            ledger_scope,
            retry_budget,
            budget_capacity,
            budget_retry_cost,
            budget_timeout_cost,
            budget_success_reward,
            connection: host::Connection {
                verify,
                ca_file,
                cert_file,
                key_file,
                proxy,
            },
            answer_read_limit: bytes("answer_read_limit", answer_read_limit, "1048576, 1 MiB")?,
            max_saved_body: bytes("max_saved_body", max_saved_body, "65536, 64 KiB")?,
            fetch_unsaved_answers,
            allow_key_to: allow_key_to.unwrap_or_default(),
            seal_keys: seal_keys.unwrap_or_default(),
            keep_query_params: keep_query_params.unwrap_or_default(),
            // httpx follows redirects, or not (`follow_redirects`): the engine follows none
            // live, and continues an operation on the hop httpx re-issues (`after` in `send`).
            follow_redirects: false,
        };
        let inner = py.detach(|| host::Engine::new(settings)).map_err(to_py)?;
        Ok(Engine { inner })
    }

    /// The key header's name, lowercase.
    #[getter]
    fn key_header(&self) -> &str {
        self.inner.key_header()
    }

    /// Whether a redirect of an operation first sent to `original` may carry its key to
    /// `location`: the same origin, or one given in `allow_key_to`.
    ///
    /// # Errors
    ///
    /// `ValueError` when either is not an absolute URL.
    fn redirect_keeps_key(&self, original: &str, location: &str) -> PyResult<bool> {
        self.inner
            .redirect_keeps_key(original, location)
            .map_err(to_py)
    }

    /// Sends one operation and waits for its end, the GIL released meanwhile. `headers` are
    /// `(name, value)` byte pairs in order (the key header among them is the key, unless
    /// `key` is given); `body` is bytes, a `BodyStream` (sent once) or `None`; `timeout` is
    /// the attempt timeout in seconds (`None`: the policy's). `keyless` sends it without a
    /// key, none minted. `after` are the redirects (status, absolute `Location`) this request
    /// was answered with and that httpx followed, in order: the operation, recorded under this
    /// request as given, goes on from the last one (`RequestBuilder::after_redirect`).
    ///
    /// Never raises for the operation's failure: the `Answer` says how it ended.
    ///
    /// # Errors
    ///
    /// Only if Python's objects cannot be read (a header that is not bytes), or `after` holds
    /// a status that is not a redirect or a URL that is not absolute (`ValueError`).
    #[pyo3(signature = (
        method, url, headers, body = None, key = None, timeout = None, keyless = false,
        after = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn send(
        &self,
        py: Python<'_>,
        method: &str,
        url: String,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Option<&Bound<'_, PyAny>>,
        key: Option<String>,
        timeout: Option<f64>,
        keyless: bool,
        after: Option<Vec<(u16, String)>>,
    ) -> PyResult<Answer> {
        self.inner.born().check(TRANSPORT, REMAKE).map_err(to_py)?;
        let outgoing = self.outgoing(method, url, headers, body, key, timeout, keyless, after)?;
        let operation = self.inner.operate(outgoing);
        let runtime = runtime()?;
        let finished = py.detach(|| runtime.block_on(operation));
        Ok(Answer::from_finished(py, finished))
    }

    /// Starts one operation on the runtime and returns at once; `done(answer)` is called with
    /// its `Answer` from one of the runtime's threads (with the GIL held) when it ends, unless
    /// the returned `Pending` is cancelled first. The arguments are `send`'s.
    ///
    /// # Errors
    ///
    /// Only if Python's objects cannot be read.
    #[pyo3(signature = (
        method, url, headers, done, body = None, key = None, timeout = None, keyless = false,
        after = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        method: &str,
        url: String,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        done: Py<PyAny>,
        body: Option<&Bound<'_, PyAny>>,
        key: Option<String>,
        timeout: Option<f64>,
        keyless: bool,
        after: Option<Vec<(u16, String)>>,
    ) -> PyResult<Pending> {
        self.inner.born().check(TRANSPORT, REMAKE).map_err(to_py)?;
        let outgoing = self.outgoing(method, url, headers, body, key, timeout, keyless, after)?;
        let operation = self.inner.operate(outgoing);
        let task = runtime()?.spawn(async move {
            let finished = operation.await;
            Python::attach(|py| {
                let answer = Answer::from_finished(py, finished);
                if let Err(err) = done.call1(py, (answer,)) {
                    // The callback is the package's own; if it fails, say so where people look.
                    err.print(py);
                }
            });
        });
        Ok(Pending {
            task: task.abort_handle(),
        })
    }

    /// Closes the ledger (an SQLite file checkpoints its log, for up to 5 s). Requests after
    /// this still go out, without the file once its last handle is gone.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.close());
    }
}

/// An operation started by `Engine.start`.
#[pyclass(module = "idempotent_retry._native", frozen)]
#[derive(Debug)]
pub struct Pending {
    task: tokio::task::AbortHandle,
}

#[pymethods]
impl Pending {
    /// Drops the operation where it stands, as a Rust caller's dropped `send` does: an attempt
    /// in flight is abandoned (the receiver may still run it), the ledger's lease is given
    /// back, and `done` is never called. Nothing happens once it has ended.
    fn cancel(&self) {
        self.task.abort();
    }
}

impl Engine {
    /// Reads and checks one request's parts while the GIL is held.
    #[allow(clippy::too_many_arguments)]
    fn outgoing(
        &self,
        method: &str,
        url: String,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Option<&Bound<'_, PyAny>>,
        key: Option<String>,
        timeout: Option<f64>,
        keyless: bool,
        after: Option<Vec<(u16, String)>>,
    ) -> PyResult<host::Outgoing> {
        let body = match body {
            None => None,
            Some(body) => {
                if let Ok(bytes) = body.cast::<PyBytes>() {
                    Some(reqwest::Body::from(bytes::Bytes::copy_from_slice(
                        bytes.as_bytes(),
                    )))
                } else if let Ok(stream) = body.cast::<BodyStream>() {
                    Some(stream.get().take_body().ok_or_else(|| {
                        pyo3::exceptions::PyRuntimeError::new_err(
                            "this body stream was already sent",
                        )
                    })?)
                } else {
                    return Err(pyo3::exceptions::PyValueError::new_err(
                        "a body is bytes, a BodyStream, or None",
                    ));
                }
            }
        };
        let timeout = seconds("timeout", timeout)?;
        self.inner
            .outgoing(method, url, headers, body, key, timeout)
            .map_err(to_py)?
            .keyless(keyless)
            .after(after.unwrap_or_default())
            .map_err(to_py)
    }
}
