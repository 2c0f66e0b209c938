//! [`HttpProbe`]: a [`Reconciler`] that looks the operation up with a `GET` to the receiver
//! and lets a closure read the answer.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::reconciler::{ReconcileFuture, Reconciler};
use crate::ledger::{OperationRecord, Resolution};

/// The longest probe answer read: a lookup's JSON, with room to spare. A longer one is no
/// answer (the outcome stays unknown), so a hostile or broken server cannot fill memory.
const PROBE_BODY_LIMIT: usize = 1 << 20;

type UrlFor = dyn Fn(&OperationRecord) -> String + Send + Sync;
type Interpret = dyn Fn(&OperationRecord, http::Response<Bytes>) -> Resolution + Send + Sync;

/// A [`Reconciler`] that asks the receiver: a `GET` to a URL built from the operation's row
/// (`https://api.example.com/v1/charges?idempotency_key={key}`, say), and a closure that maps
/// the answer (status, headers, body) to a [`Resolution`].
///
/// The probe is sent once, through the `reqwest::Client` given (set its timeouts there; keep
/// them inside the reconcile lease), with no idempotency key and no retry: a probe that
/// cannot be sent, times out, or whose body cannot be read (or is over 1 MiB) answers
/// [`Resolution::Unknown`] (logged at `warn` with the key), and the row stays unknown for the
/// next attempt to reconcile it.
///
/// # Examples
///
/// ```
/// use idempotent_retry::Client;
/// use idempotent_retry::reconcile::{HttpProbe, Resolution};
/// use idempotent_retry::ledger::{MemoryLedger, SavedResponse};
///
/// let probe = HttpProbe::new(
///     reqwest::Client::new(),
///     |operation| format!("https://api.example.com/v1/charges?idempotency_key={}", operation.key),
///     |_operation, answer| match answer.status().as_u16() {
///         // Found: the charge ran; replay what the lookup returned.
///         200 => Resolution::Done(SavedResponse::new(200, Vec::new(), Some(answer.body().to_vec()))),
///         // The receiver has no charge under the key: it never ran.
///         404 => Resolution::NotDone,
///         _ => Resolution::Unknown,
///     },
/// );
/// let client = Client::builder()
///     .ledger(MemoryLedger::new())
///     .reconciler_for_scope("payments.charge", probe)
///     .build()?;
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Clone)]
pub struct HttpProbe {
    http: reqwest::Client,
    url: Arc<UrlFor>,
    interpret: Arc<Interpret>,
}

impl fmt::Debug for HttpProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProbe").finish_non_exhaustive()
    }
}

impl HttpProbe {
    /// A probe that sends `GET url(operation)` through `http` and answers
    /// `interpret(operation, answer)`.
    pub fn new<U, I>(http: reqwest::Client, url: U, interpret: I) -> Self
    where
        U: Fn(&OperationRecord) -> String + Send + Sync + 'static,
        I: Fn(&OperationRecord, http::Response<Bytes>) -> Resolution + Send + Sync + 'static,
    {
        HttpProbe {
            http,
            url: Arc::new(url),
            interpret: Arc::new(interpret),
        }
    }

    /// The probe's answer, or why there is none.
    async fn ask(&self, operation: &OperationRecord) -> Result<http::Response<Bytes>, String> {
        let url = (self.url)(operation);
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .map_err(|err| format!("the probe GET {url} failed: {err}"))?;
        let mut answer = http::Response::builder().status(response.status());
        for (name, value) in response.headers() {
            answer = answer.header(name, value);
        }
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|err| format!("the probe's answer from {url} could not be read: {err}"))?
        {
            if body.len() + chunk.len() > PROBE_BODY_LIMIT {
                return Err(format!(
                    "the probe's answer from {url} is longer than {PROBE_BODY_LIMIT} bytes"
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let body = Bytes::from(body);
        answer
            .body(body)
            .map_err(|err| format!("the probe's answer from {url} is not a response: {err}"))
    }
}

impl Reconciler for HttpProbe {
    fn reconcile<'a>(&'a self, operation: &'a OperationRecord) -> ReconcileFuture<'a> {
        Box::pin(async move {
            match self.ask(operation).await {
                Ok(answer) => (self.interpret)(operation, answer),
                Err(why) => {
                    tracing::warn!(key = operation.key.as_str(), error = %why, "probe failed; the outcome stays unknown");
                    Resolution::Unknown
                }
            }
        })
    }

    fn name(&self) -> &str {
        "http-probe"
    }
}
