//! The engine Python sends through: an `idempotent_retry::Client` on the shared runtime, its
//! policy, key header and ledger set once, one operation per call.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use idempotent_retry::ledger::{LeaseHeldPolicy, LedgerOptions, SqliteLedger};
use idempotent_retry::{
    Client, IDEMPOTENCY_KEY, IdempotencyKey, RedirectPolicy, RetryBudget, RetryBudgetConfig,
    RetryPolicy,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::answer::{Answer, Finished};
use crate::body::BodyStream;
use crate::runtime::{Born, runtime};
use crate::tls::Connection;

/// What a refusal after a fork calls an engine.
const TRANSPORT: &str = "this transport";
/// How long closing waits for an SQLite ledger to checkpoint its log.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The engine's `ClientBuilder::answer_read_limit` unless told otherwise: the crate's own
/// default, 1 MiB, set here so that the transport's whole-body reads stop where the engine's do.
const DEFAULT_ANSWER_READ_LIMIT: usize = 1024 * 1024;

/// The ledger an engine opened, kept to close it.
#[derive(Debug)]
enum Opened {
    Sqlite(SqliteLedger),
    #[cfg(feature = "postgres")]
    Postgres,
}

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
    client: Client,
    key_header: HeaderName,
    scope: Option<String>,
    /// The client's `answer_read_limit`: a body of known length up to this is read whole.
    answer_read_limit: usize,
    opened: Mutex<Option<Opened>>,
    /// The process the client and its ledger were made in.
    born: Born,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.born.is_here() {
            // A child of a fork: the client's connections and the ledger's writer belong to
            // the parent, and tearing them down here would deregister the parent's sockets
            // from the event queue the two share. They are left as they are: a clone of the
            // client forgotten holds its shared state, so dropping the field tears nothing down.
            std::mem::forget(self.client.clone());
            std::mem::forget(
                self.opened
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take(),
            );
        }
    }
}

/// A duration from Python's seconds.
///
/// # Errors
///
/// `ValueError` for a negative, infinite or NaN number.
fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| PyValueError::new_err(format!("{name}: {value} is not a number of seconds")))
}

/// Opens `ledger` (a PostgreSQL URL, or an SQLite file's path) and gives it to `builder`.
async fn open(
    ledger: &str,
    builder: idempotent_retry::ClientBuilder,
) -> Result<(idempotent_retry::ClientBuilder, Opened), String> {
    if ledger.starts_with("postgres://") || ledger.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            use idempotent_retry::ledger::PostgresLedger;
            // The URL may hold a password: it is never repeated.
            let opened = PostgresLedger::connect(ledger)
                .await
                .map_err(|err| format!("cannot open the PostgreSQL ledger: {err}"))?;
            opened
                .migrate()
                .await
                .map_err(|err| format!("cannot migrate the PostgreSQL ledger: {err}"))?;
            return Ok((builder.ledger(opened), Opened::Postgres));
        }
        #[cfg(not(feature = "postgres"))]
        return Err("this build of idempotent_retry has no PostgreSQL support".to_owned());
    }
    let opened = SqliteLedger::open(ledger)
        .await
        .map_err(|err| format!("cannot open the ledger {ledger}: {err}"))?;
    Ok((builder.ledger(opened.clone()), Opened::Sqlite(opened)))
}

/// One request as Python hands it over, checked.
#[derive(Debug)]
struct Outgoing {
    method: Method,
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<reqwest::Body>,
    key: Option<IdempotencyKey>,
    /// Sent without a key, none minted.
    keyless: bool,
    /// The redirects the request was answered with, that httpx followed: the operation goes
    /// on from the last one (`RequestBuilder::after_redirect`).
    after: Vec<(StatusCode, reqwest::Url)>,
    timeout: Option<Duration>,
    scope: Option<String>,
    answer_read_limit: usize,
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
    /// default: none).
    ///
    /// # Errors
    ///
    /// `ValueError` for an invalid policy, duration, header name, PEM file, proxy URL,
    /// origin in `allow_key_to`, `answer_read_limit` or `max_saved_body`; `FileNotFoundError`/`OSError` for a TLS file
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
    ) -> PyResult<Engine> {
        let mut policy = RetryPolicy::default();
        if let Some(attempts) = max_attempts {
            policy = policy.with_max_attempts(attempts);
        }
        if let Some(value) = base_delay {
            policy = policy.with_base_delay(seconds("base_delay", value)?);
        }
        if let Some(value) = max_delay {
            policy = policy.with_max_delay(seconds("max_delay", value)?);
        }
        if let Some(value) = attempt_timeout {
            policy = policy.with_attempt_timeout(seconds("attempt_timeout", value)?);
        }
        if let Some(value) = reconcile_window {
            policy = policy.with_reconcile_window(seconds("reconcile_window", value)?);
        }
        if let Some(value) = max_retry_after {
            policy = policy.with_max_retry_after(seconds("max_retry_after", value)?);
        }
        if let Some(value) = max_in_progress_wait {
            policy = policy.with_max_in_progress_wait(seconds("max_in_progress_wait", value)?);
        }
        policy
            .validate()
            .map_err(|err| PyValueError::new_err(err.to_string()))?;
        let key_header = match key_header {
            Some(name) => HeaderName::try_from(name)
                .map_err(|_| PyValueError::new_err(format!("{name:?} is not a header name")))?,
            None => IDEMPOTENCY_KEY,
        };
        let mut options = LedgerOptions::new();
        if let Some(value) = lease {
            options = options.lease(seconds("lease", value)?);
        }
        if let Some(value) = lease_wait {
            let max_wait = seconds("lease_wait", value)?;
            options = options.on_lease_held(match LeaseHeldPolicy::WAIT {
                LeaseHeldPolicy::Wait { poll, .. } => LeaseHeldPolicy::Wait { poll, max_wait },
                other => other,
            });
        }
        if let Some(name) = worker {
            options = options.worker(name);
        }
        if let Some(bytes) = max_saved_body {
            options = options.max_body(usize::try_from(bytes).map_err(|_| {
                PyValueError::new_err(format!(
                    "max_saved_body: {bytes} is not a number of bytes; pass 0 or more \
                     (default 65536, 64 KiB)"
                ))
            })?);
        }
        options = options.fetch_unsaved_answers(fetch_unsaved_answers);
        let connection = Connection {
            verify,
            ca_file,
            cert_file,
            key_file,
            proxy,
        };
        let http = connection
            .apply(reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()))?
            .build()
            .map_err(|err| Connection::build_error(&err))?;
        let answer_read_limit = match answer_read_limit {
            None => DEFAULT_ANSWER_READ_LIMIT,
            Some(bytes) => usize::try_from(bytes).map_err(|_| {
                PyValueError::new_err(format!(
                    "answer_read_limit: {bytes} is not a number of bytes; pass 0 or more \
                     (default 1048576, 1 MiB)"
                ))
            })?,
        };
        // httpx follows redirects, or not (`follow_redirects`): the engine follows none live,
        // and continues an operation on the hop httpx re-issues (`after` in `send`).
        let redirects = allow_key_to
            .unwrap_or_default()
            .into_iter()
            .fold(RedirectPolicy::none(), |policy, origin| {
                policy.allow_key_to(&origin)
            });
        let mut builder = Client::builder()
            .http(http)
            .policy(policy)
            .key_header(key_header.clone())
            .redirects(redirects)
            .answer_read_limit(answer_read_limit)
            .ledger_options(options);
        let mut budget = RetryBudgetConfig::new();
        if let Some(tokens) = budget_capacity {
            budget = budget.with_capacity(tokens);
        }
        if let Some(tokens) = budget_retry_cost {
            budget = budget.with_retry_cost(tokens);
        }
        if let Some(tokens) = budget_timeout_cost {
            budget = budget.with_timeout_cost(tokens);
        }
        if let Some(tokens) = budget_success_reward {
            budget = budget.with_success_reward(tokens);
        }
        builder = if retry_budget {
            builder.retry_budget(
                RetryBudget::with_config(budget)
                    .map_err(|err| PyValueError::new_err(err.to_string()))?,
            )
        } else {
            builder.without_retry_budget()
        };
        let mut opened = None;
        if let Some(ledger) = ledger {
            let runtime = runtime()?;
            let (with_ledger, ledger) = py
                .detach(|| runtime.block_on(open(&ledger, builder)))
                .map_err(PyRuntimeError::new_err)?;
            builder = with_ledger;
            opened = Some(ledger);
        }
        // The client's connection pool belongs to the shared runtime.
        let client = {
            let _entered = runtime()?.enter();
            builder.build()
        }
        .map_err(|err| PyValueError::new_err(err.to_string()))?;
        Ok(Engine {
            client,
            key_header,
            scope: ledger_scope,
            answer_read_limit,
            opened: Mutex::new(opened),
            born: Born::here(),
        })
    }

    /// The key header's name, lowercase.
    #[getter]
    fn key_header(&self) -> &str {
        self.key_header.as_str()
    }

    /// Whether a redirect of an operation first sent to `original` may carry its key to
    /// `location`: the same origin, or one given in `allow_key_to`.
    ///
    /// # Errors
    ///
    /// `ValueError` when either is not an absolute URL.
    fn redirect_keeps_key(&self, original: &str, location: &str) -> PyResult<bool> {
        Ok(self
            .client
            .redirects()
            .allows_key_to(&absolute(original)?, &absolute(location)?))
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
        self.born.check(TRANSPORT)?;
        let mut outgoing = self.outgoing(method, url, headers, body, key, timeout)?;
        outgoing.keyless = keyless;
        outgoing.after = answered(after)?;
        let client = self.client.clone();
        let runtime = runtime()?;
        let finished = py.detach(|| runtime.block_on(operate(client, outgoing)));
        Ok(finished.into_answer(py))
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
        self.born.check(TRANSPORT)?;
        let mut outgoing = self.outgoing(method, url, headers, body, key, timeout)?;
        outgoing.keyless = keyless;
        outgoing.after = answered(after)?;
        let client = self.client.clone();
        let task = runtime()?.spawn(async move {
            let finished = operate(client, outgoing).await;
            Python::attach(|py| {
                let answer = finished.into_answer(py);
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
        if !self.born.is_here() {
            // The parent's ledger, closed by the parent (see `Drop`).
            return;
        }
        let opened = self
            .opened
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        // Without a runtime there is no writer thread to wait for: dropping the ledger is all.
        if let (Some(Opened::Sqlite(ledger)), Ok(runtime)) = (opened, runtime()) {
            py.detach(|| runtime.block_on(ledger.close(CLOSE_WAIT)));
        }
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
    fn outgoing(
        &self,
        method: &str,
        url: String,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Option<&Bound<'_, PyAny>>,
        key: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<Outgoing> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| PyValueError::new_err(format!("{method:?} is not an HTTP method")))?;
        let mut key = key;
        let mut parsed = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            let name = HeaderName::from_bytes(&name).map_err(|_| {
                PyValueError::new_err(format!(
                    "{:?} is not a header name",
                    String::from_utf8_lossy(&name)
                ))
            })?;
            if name == self.key_header {
                if key.is_none() {
                    key = Some(String::from_utf8(value).map_err(|_| {
                        PyValueError::new_err("an idempotency key must be visible ASCII")
                    })?);
                }
                continue;
            }
            // The client writes these from the body and the URL itself, and manages the
            // connection.
            if name == http::header::HOST
                || name == http::header::CONTENT_LENGTH
                || name == http::header::TRANSFER_ENCODING
                || name == http::header::CONNECTION
                || name.as_str() == "keep-alive"
            {
                continue;
            }
            let value = HeaderValue::from_bytes(&value).map_err(|_| {
                PyValueError::new_err(format!("the value of {name} is not a header value"))
            })?;
            parsed.push((name, value));
        }
        let key = key
            .map(|key| {
                IdempotencyKey::new(key)
                    .map_err(|err| PyValueError::new_err(format!("the idempotency key: {err}")))
            })
            .transpose()?;
        let body = match body {
            None => None,
            Some(body) => {
                if let Ok(bytes) = body.cast::<PyBytes>() {
                    Some(reqwest::Body::from(Bytes::copy_from_slice(
                        bytes.as_bytes(),
                    )))
                } else if let Ok(stream) = body.cast::<BodyStream>() {
                    Some(stream.get().take_body().ok_or_else(|| {
                        PyRuntimeError::new_err("this body stream was already sent")
                    })?)
                } else {
                    return Err(PyValueError::new_err(
                        "a body is bytes, a BodyStream, or None",
                    ));
                }
            }
        };
        let timeout = timeout.map(|value| seconds("timeout", value)).transpose()?;
        Ok(Outgoing {
            method,
            url,
            headers: parsed,
            body,
            key,
            keyless: false,
            after: Vec::new(),
            timeout,
            scope: self.scope.clone(),
            answer_read_limit: self.answer_read_limit,
        })
    }
}

/// An absolute URL from Python.
///
/// # Errors
///
/// `ValueError` naming the text when it is not one.
fn absolute(url: &str) -> PyResult<reqwest::Url> {
    reqwest::Url::parse(url)
        .map_err(|err| PyValueError::new_err(format!("{url:?} is not an absolute URL: {err}")))
}

/// The redirects of `send`'s `after`, checked.
///
/// # Errors
///
/// `ValueError` for a status that is not one, or a URL that is not absolute.
fn answered(after: Option<Vec<(u16, String)>>) -> PyResult<Vec<(StatusCode, reqwest::Url)>> {
    after
        .unwrap_or_default()
        .into_iter()
        .map(|(status, location)| {
            let status = StatusCode::from_u16(status).map_err(|_| {
                PyValueError::new_err(format!("after: {status} is not an HTTP status"))
            })?;
            Ok((status, absolute(&location)?))
        })
        .collect()
}

/// Runs one operation to its end, the response's body read when it is bounded (see
/// `Received::read`).
async fn operate(client: Client, outgoing: Outgoing) -> Finished {
    let Outgoing {
        method,
        url,
        headers,
        body,
        key,
        keyless,
        after,
        timeout,
        scope,
        answer_read_limit,
    } = outgoing;
    let mut map = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        map.append(name, value);
    }
    let mut request = client.request(method, url.as_str()).headers(map);
    if let Some(body) = body {
        request = request.body(body);
    }
    if let Some(key) = key {
        request = request.idempotency_key(key);
    }
    if keyless {
        request = request.without_idempotency_key();
    }
    for (status, location) in after {
        request = request.after_redirect(status, location);
    }
    if let Some(timeout) = timeout {
        request = request.timeout(timeout);
    }
    if let Some(scope) = scope {
        request = request.ledger_scope(scope);
    }
    match request.send().await {
        Ok(response) => Finished::from_response(response, answer_read_limit).await,
        Err(err) => Finished::from_error(err, answer_read_limit).await,
    }
}
