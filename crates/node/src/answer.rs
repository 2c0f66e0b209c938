//! How one operation ended, as the JavaScript object `Operation.wait` resolves to.

use idempotent_retry_host::Finished;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

/// One attempt of an operation.
#[napi(object)]
#[derive(Debug)]
pub struct Attempt {
    /// Its number, 1 for the first.
    pub number: u32,
    /// When it started, in milliseconds from the first attempt's start.
    pub started_ms: f64,
    /// Its response's status, when it had one.
    pub status: Option<u16>,
    /// How it failed (`connect`, `timeout`, `connection_reset`, `server_error`, ...) when it
    /// was not final.
    pub failure: Option<String>,
    /// Milliseconds waited after it, when another attempt followed.
    pub wait_ms: Option<f64>,
}

/// The end of one operation: a response (`status` set) or a failure (`errorKind` set, and
/// possibly the last attempt's response too), with the report.
#[napi(object)]
// napi's `Buffer` has no `Debug`: a body is bytes nobody reads in a debug print.
#[allow(missing_debug_implementations)]
pub struct Answer {
    /// The response's status, or the last attempt's when the operation stopped on one.
    pub status: Option<u16>,
    /// The response's headers in order, `[name, value]`, values as byte strings.
    pub headers: Vec<Vec<String>>,
    /// The whole body, or nothing when `streamed` (read it with `Operation.readChunk`).
    pub body: Option<Buffer>,
    /// Whether the body is read with `Operation.readChunk` (no `Content-Length`, or a longer
    /// one than `answerReadLimit`).
    pub streamed: bool,
    /// Attempts sent, this run (0 for an answer replayed from the ledger).
    pub attempts: u32,
    /// The operation's idempotency key, if it had one.
    pub key: Option<String>,
    /// Whether the response was replayed from the ledger, nothing sent.
    pub replayed: bool,
    /// The URL that gave the response (the last hop of the redirects followed).
    pub url: Option<String>,
    /// Milliseconds from the first attempt to the end of the last, plus `leaseWaitMs`.
    pub elapsed_ms: f64,
    /// Milliseconds the ledger's claim waited for another run holding the key.
    pub lease_wait_ms: f64,
    /// Why the response was not recorded in the ledger as this run's outcome, when it was not.
    pub unrecorded: Option<String>,
    /// Answers that said the operation was still in progress at the receiver, waited out.
    pub in_progress_waits: u32,
    /// Whether the answer was fetched again with its key because the ledger had not saved it.
    pub refetched: bool,
    /// The status the error names when there is no response to carry it.
    pub error_status: Option<u16>,
    /// `"done"`, `"not_done"` or `"unknown"`.
    pub outcome: String,
    /// Why the operation stopped without a final answer (`attempts_exhausted`, `transport`,
    /// `key_reuse`, ...), absent when it has one.
    pub error_kind: Option<String>,
    /// How the last attempt failed, when it did.
    pub failure: Option<String>,
    /// The error's message for people, with its deepest cause.
    pub message: Option<String>,
    /// One entry per attempt, in order.
    pub history: Vec<Attempt>,
}

/// A byte string: one char per byte, as JavaScript's `Headers` hold them.
fn latin1(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| char::from(b)).collect()
}

impl Answer {
    /// The JavaScript object of how an operation ended; its body's rest, if `streamed`, was
    /// taken out first.
    pub(crate) fn from_finished(finished: Finished, streamed: bool) -> Answer {
        let (status, headers, body) = match finished.received {
            Some(received) => (
                Some(received.status),
                received
                    .headers
                    .iter()
                    .map(|(name, value)| vec![latin1(name), latin1(value)])
                    .collect(),
                Some(Buffer::from(received.body.to_vec())),
            ),
            None => (None, Vec::new(), None),
        };
        Answer {
            status,
            headers,
            body,
            streamed,
            attempts: finished.attempts,
            key: finished.key,
            replayed: finished.replayed,
            url: finished.url,
            elapsed_ms: finished.elapsed * 1000.0,
            lease_wait_ms: finished.lease_wait * 1000.0,
            unrecorded: finished.unrecorded,
            in_progress_waits: finished.in_progress_waits,
            refetched: finished.refetched,
            error_status: finished.error_status,
            outcome: finished.outcome.to_owned(),
            error_kind: finished.error_kind.map(str::to_owned),
            failure: finished.failure.map(str::to_owned),
            message: finished.message,
            history: finished
                .history
                .into_iter()
                .map(|(number, started, status, failure, wait)| Attempt {
                    number,
                    started_ms: started * 1000.0,
                    status,
                    failure: failure.map(str::to_owned),
                    wait_ms: wait.map(|wait| wait * 1000.0),
                })
                .collect(),
        }
    }
}
