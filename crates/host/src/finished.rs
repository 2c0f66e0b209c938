//! How one operation ended, as plain data: the response's head and its body read whole or
//! kept to stream, the report's figures, and the error's kind and message when it failed.

use idempotent_retry::{Error, FailureKind, RetryReport};

use crate::error::with_causes;

/// One attempt of a [`Finished`]'s history: its number (1 for the first), when it started
/// (seconds from the first attempt's start), the status of its response, how it failed
/// (`FailureKind::as_str`) when it was not final, and the seconds waited after it when another
/// attempt followed.
pub type AttemptRow = (u32, f64, Option<u16>, Option<&'static str>, Option<f64>);

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

/// A response's head and body: read whole, or streamed (`rest`).
#[derive(Debug)]
pub struct Received {
    /// The response's status.
    pub status: u16,
    /// The response's headers in order, names and values as bytes.
    pub headers: Vec<(Vec<u8>, Vec<u8>)>,
    /// The body, or nothing yet when `rest` is set.
    pub body: bytes::Bytes,
    /// The response to stream a body from that was not read whole (no `Content-Length`, or a
    /// longer one than the limit), with [`next_chunk`].
    pub rest: Option<reqwest::Response>,
    /// The response's HTTP version.
    pub version: http::Version,
}

impl Received {
    /// Reads `response`'s body to its end when its length is known and at most `limit`, the
    /// engine's `answer_read_limit` (the engine reads a final answer's body of that length
    /// inside its attempt, so it is in memory already and cannot fail midway here; the last
    /// attempt's answer of an operation that stopped without a final one may still be on the
    /// wire); otherwise keeps the response to stream the body from (no length, or a longer
    /// one: chunked answers, server-sent events, downloads).
    ///
    /// # Errors
    ///
    /// reqwest's error when the body is cut or stalls while it is read.
    pub async fn read(
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

/// The next chunk of `response`, and the response to read the one after from.
pub async fn next_chunk(
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

/// How one operation ended, as plain data the package turns into its language's objects: a
/// response (`received`) or why there is none, with the engine's report either way.
/// `outcome` is `"done"` when a final answer came back, `"not_done"` when the operation
/// certainly did not run, `"unknown"` when it may have run and no answer says whether.
#[derive(Debug)]
pub struct Finished {
    /// The response, or the last attempt's when the operation stopped on one.
    pub received: Option<Received>,
    /// Attempts sent, this run (0 for an answer replayed from the ledger).
    pub attempts: u32,
    /// The operation's idempotency key, if it had one.
    pub key: Option<String>,
    /// Whether the response was replayed from the ledger, nothing sent.
    pub replayed: bool,
    /// The URL that gave the response: the request's, or the last hop of the redirects the
    /// engine followed. `None` without one.
    pub url: Option<String>,
    /// Seconds from the first attempt to the end of the last, plus `lease_wait`.
    pub elapsed: f64,
    /// Seconds the ledger's claim waited for another run holding the key. 0 without a wait.
    pub lease_wait: f64,
    /// Why the response was not recorded in the ledger as this run's outcome, when it was not.
    pub unrecorded: Option<String>,
    /// Answers that said the operation was still in progress at the receiver, waited out.
    pub in_progress_waits: u32,
    /// Seconds spent waiting those out (counted in `elapsed`).
    pub in_progress_wait: f64,
    /// Whether the answer was fetched again with its key because the ledger had not saved its
    /// body.
    pub refetched: bool,
    /// The status the error names when there is no response to carry it.
    pub error_status: Option<u16>,
    /// `"done"`, `"not_done"` or `"unknown"`.
    pub outcome: &'static str,
    /// Why the operation stopped without a final answer (`ErrorKind::as_str`, or `"body"`
    /// for a body cut while it was read here), `None` when it has one.
    pub error_kind: Option<&'static str>,
    /// How the last attempt failed (`FailureKind::as_str`), when it did.
    pub failure: Option<&'static str>,
    /// The error's message for people, with its deepest cause.
    pub message: Option<String>,
    /// One row per attempt, in order.
    pub history: Vec<AttemptRow>,
}

impl Finished {
    /// A response and its report, its body read when it is at most `limit` long; a body cut
    /// off is a failure of its own, the operation done (its answer's head came back).
    pub async fn from_response(response: reqwest::Response, limit: usize) -> Finished {
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
        let read = Received::read(response, limit).await;
        let mut finished = Finished {
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
            error_kind: None,
            failure: None,
            message: None,
            history,
        };
        match read {
            Ok(received) => finished.received = Some(received),
            Err(err) => {
                finished.error_kind = Some("body");
                finished.failure = Some(if err.is_timeout() {
                    "timeout"
                } else {
                    "connection_closed"
                });
                finished.message = Some(format!(
                    "the response's head arrived, then its body was cut off: {}",
                    with_causes(&err)
                ));
            }
        }
        finished
    }

    /// An error, with the last attempt's response when it has one (its body read when it is
    /// at most `limit` long; a response whose body is cut while it is read is left out).
    pub async fn from_error(mut err: Error, limit: usize) -> Finished {
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
}
