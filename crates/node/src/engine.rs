//! The engine Node sends through: the host crate's engine made from [`EngineOptions`], one
//! operation per [`Engine::start`].

use std::time::Duration;

use idempotent_retry_host as host;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::body::BodyStream;
use crate::error::to_js;
use crate::operation::Operation;

/// The engine's settings as the package's `createFetch` hands them over. Durations are in
/// milliseconds; an absent field keeps the crate's default (5 attempts, 500 ms base delay,
/// 30 s cap, 30 s attempt timeout, a 24 h reconcile window, 60 s longest `Retry-After`, 1 min
/// of waiting out a receiver's "in progress"; a 10 s lease, a lease held elsewhere waited for
/// up to 4 min; answers saved up to 64 KiB; answers read whole up to 1 MiB; the retry budget
/// on; redirects followed, the key kept on the same origin).
#[napi(object)]
#[derive(Debug, Default)]
pub struct EngineOptions {
    /// Attempts in all, the first included (`RetryPolicy::with_max_attempts`).
    pub attempts: Option<u32>,
    /// The backoff's base delay.
    pub base_delay_ms: Option<f64>,
    /// The backoff's cap.
    pub max_delay_ms: Option<f64>,
    /// One attempt's timeout.
    pub attempt_timeout_ms: Option<f64>,
    /// The reconcile window: how long a key is good for at the receiver.
    pub window_ms: Option<f64>,
    /// The longest `Retry-After` honoured.
    pub max_retry_after_ms: Option<f64>,
    /// How long a receiver's "in progress" (a keyed 409) is waited out.
    pub max_in_progress_wait_ms: Option<f64>,
    /// The key header's name (default `Idempotency-Key`).
    pub key_header: Option<String>,
    /// An SQLite file's path (created if missing) or a `postgres://` URL.
    pub ledger: Option<String>,
    /// The ledger's lease.
    pub lease_ms: Option<f64>,
    /// How long a request whose key another run holds waits for it.
    pub lease_wait_ms: Option<f64>,
    /// This process's name in the ledger's rows.
    pub worker: Option<String>,
    /// Every operation filed under this scope (default: the URL's host).
    pub scope: Option<String>,
    /// `false` turns the retry budget off.
    pub retry_budget: Option<bool>,
    /// The budget's tokens.
    pub budget_capacity: Option<u32>,
    /// Tokens a failed retry costs.
    pub budget_retry_cost: Option<u32>,
    /// Tokens a timed-out retry costs.
    pub budget_timeout_cost: Option<u32>,
    /// Tokens a first-attempt success gives back.
    pub budget_success_reward: Option<u32>,
    /// `false`: no certificate is verified.
    pub reject_unauthorized: Option<bool>,
    /// A PEM file of the only roots trusted.
    pub ca_file: Option<String>,
    /// A PEM file with a client certificate (and its key, without `key_file`).
    pub cert_file: Option<String>,
    /// A PEM file with the client certificate's key.
    pub key_file: Option<String>,
    /// Every request through this `http://` or `https://` proxy.
    pub proxy: Option<String>,
    /// Bytes up to which an answer with a `Content-Length` is read inside its attempt.
    pub answer_read_limit: Option<u32>,
    /// The longest answer body the ledger keeps, in bytes.
    pub max_saved_body: Option<u32>,
    /// Whether a succeeded operation whose body was not saved is fetched again with its key.
    pub fetch_unsaved_answers: Option<bool>,
    /// `"follow"` (the default): the engine follows redirects; `"manual"`: a redirect is the
    /// answer.
    pub redirect: Option<String>,
    /// Origins besides a request's own that its key may go to on a redirect.
    pub allow_key_to: Option<Vec<String>>,
    /// Keys that seal saved answers at rest, each `ID:HEX`, the first sealing.
    pub seal_keys: Option<Vec<String>>,
    /// Query parameters whose values a ledger row's URL keeps.
    pub keep_query_params: Option<Vec<String>>,
}

/// One request's parts as `fetch` normalized them.
#[napi(object)]
// napi's `Buffer` has no `Debug`: a body is bytes nobody reads in a debug print.
#[allow(missing_debug_implementations)]
pub struct RequestParts {
    /// The method, as given.
    pub method: String,
    /// The absolute URL.
    pub url: String,
    /// The headers in order, `[name, value]` (values are byte strings, one byte per char).
    pub headers: Vec<Vec<String>>,
    /// The whole body, sent again on every attempt; absent for none or a streamed one.
    pub body: Option<Buffer>,
    /// This request's attempt timeout (default: the engine's).
    pub timeout_ms: Option<f64>,
    /// Sent without a key, none minted.
    pub keyless: Option<bool>,
}

/// One client of the engine: sends operations with one key each, retries what is safe to
/// retry, and keeps them in a ledger when given one.
#[napi]
#[derive(Debug)]
pub struct Engine {
    inner: std::sync::Arc<host::Engine>,
}

/// A duration from milliseconds.
///
/// # Errors
///
/// `InvalidArg` for a negative, infinite or NaN number.
fn millis(name: &str, value: Option<f64>) -> napi::Result<Option<Duration>> {
    value
        .map(|ms| {
            Duration::try_from_secs_f64(ms / 1000.0).map_err(|_| {
                napi::Error::new(
                    napi::Status::InvalidArg,
                    format!("{name}: {ms} is not a number of milliseconds"),
                )
            })
        })
        .transpose()
}

/// A byte string's bytes: JavaScript's header strings hold one byte per char.
///
/// # Errors
///
/// `InvalidArg` for a char past 255, naming `what`.
fn latin1(text: String, what: &str) -> napi::Result<Vec<u8>> {
    text.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| {
                napi::Error::new(
                    napi::Status::InvalidArg,
                    format!(
                        "{what}: {c:?} is not a byte; header names and values are byte strings"
                    ),
                )
            })
        })
        .collect()
}

#[napi]
impl Engine {
    /// A new engine; its ledger, if any, is opened (and migrated) before this returns.
    ///
    /// # Errors
    ///
    /// `InvalidArg` for an invalid setting; `GenericFailure` when the ledger cannot be opened,
    /// a TLS file cannot be read or the HTTP client cannot be built, with the cause.
    #[napi(constructor)]
    pub fn new(options: EngineOptions) -> napi::Result<Engine> {
        let redirect = options.redirect.as_deref().unwrap_or("follow");
        let follow_redirects = match redirect {
            "follow" => true,
            "manual" => false,
            other => {
                return Err(napi::Error::new(
                    napi::Status::InvalidArg,
                    format!("redirect: {other:?} is not \"follow\" or \"manual\""),
                ));
            }
        };
        let settings = host::Settings {
            max_attempts: options.attempts,
            base_delay: millis("baseDelayMs", options.base_delay_ms)?,
            max_delay: millis("maxDelayMs", options.max_delay_ms)?,
            attempt_timeout: millis("attemptTimeoutMs", options.attempt_timeout_ms)?,
            reconcile_window: millis("windowMs", options.window_ms)?,
            max_retry_after: millis("maxRetryAfterMs", options.max_retry_after_ms)?,
            max_in_progress_wait: millis("maxInProgressWaitMs", options.max_in_progress_wait_ms)?,
            key_header: options.key_header,
            ledger: options.ledger,
            lease: millis("leaseMs", options.lease_ms)?,
            lease_wait: millis("leaseWaitMs", options.lease_wait_ms)?,
            worker: options.worker,
            ledger_scope: options.scope,
            retry_budget: options.retry_budget.unwrap_or(true),
            budget_capacity: options.budget_capacity,
            budget_retry_cost: options.budget_retry_cost,
            budget_timeout_cost: options.budget_timeout_cost,
            budget_success_reward: options.budget_success_reward,
            connection: host::Connection {
                verify: options.reject_unauthorized.unwrap_or(true),
                ca_file: options.ca_file,
                cert_file: options.cert_file,
                key_file: options.key_file,
                proxy: options.proxy,
            },
            answer_read_limit: options.answer_read_limit.map(|n| n as usize),
            max_saved_body: options.max_saved_body.map(|n| n as usize),
            fetch_unsaved_answers: options.fetch_unsaved_answers.unwrap_or(true),
            allow_key_to: options.allow_key_to.unwrap_or_default(),
            seal_keys: options.seal_keys.unwrap_or_default(),
            keep_query_params: options.keep_query_params.unwrap_or_default(),
            follow_redirects,
        };
        let inner = host::Engine::new(settings).map_err(to_js)?;
        Ok(Engine {
            inner: std::sync::Arc::new(inner),
        })
    }

    /// The key header's name, lowercase.
    #[napi(getter)]
    pub fn key_header(&self) -> String {
        self.inner.key_header().to_owned()
    }

    /// One operation, started by its `wait`; `stream` is the body
    /// when it is streamed (sent once). The key header among the headers is the key; without
    /// one, a request whose method is not idempotent gets one minted, the same on every
    /// attempt.
    ///
    /// # Errors
    ///
    /// `InvalidArg` for a method, header, key or timeout that is not valid, or a stream
    /// already sent.
    #[napi]
    pub fn start(
        &self,
        request: RequestParts,
        stream: Option<&BodyStream>,
    ) -> napi::Result<Operation> {
        let RequestParts {
            method,
            url,
            headers,
            body,
            timeout_ms,
            keyless,
        } = request;
        let mut pairs = Vec::with_capacity(headers.len());
        for pair in headers {
            let mut pair = pair.into_iter();
            let (Some(name), Some(value), None) = (pair.next(), pair.next(), pair.next()) else {
                return Err(napi::Error::new(
                    napi::Status::InvalidArg,
                    "a header is a [name, value] pair",
                ));
            };
            pairs.push((
                latin1(name, "a header name")?,
                latin1(value, "a header value")?,
            ));
        }
        let body = match (body, stream) {
            (Some(bytes), _) => Some(reqwest::Body::from(bytes.to_vec())),
            (None, Some(stream)) => Some(stream.take_body().ok_or_else(|| {
                napi::Error::new(
                    napi::Status::InvalidArg,
                    "this body stream was already sent",
                )
            })?),
            (None, None) => None,
        };
        let timeout = millis("timeoutMs", timeout_ms)?;
        let outgoing = self
            .inner
            .outgoing(&method, url, pairs, body, None, timeout)
            .map_err(to_js)?
            .keyless(keyless.unwrap_or(false));
        Ok(Operation::new(self.inner.operate(outgoing)))
    }

    /// Closes the ledger (an SQLite file checkpoints its log, for up to 5 s). Requests after
    /// this still go out, without the file once its last handle is gone.
    #[napi]
    pub fn close(&self) {
        self.inner.close();
    }
}
