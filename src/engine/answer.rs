//! The answer's body: read inside its attempt when it is bounded, annotated when it streams.
//!
//! For a Stripe-style call the body is the answer (the charge's id, the email's id). An answer
//! whose head arrived and whose body was then cut is a lost answer, and the cure for a lost
//! answer is a retry with the same key, which the receiver answers from its store. So a body
//! with a `Content-Length` of at most
//! [`ClientBuilder::answer_read_limit`](crate::ClientBuilder::answer_read_limit) is read as
//! part of the attempt, under its timeout: a failure midway is the attempt's failure
//! (`connection_closed`, or `timeout`), decided on like any other. A body without a length, or
//! a longer one, streams to the caller as it arrives; a failure midway then reaches the caller
//! from the body, with the key and the way to have the answer sent again.

use std::sync::Arc;

use crate::engine::transport::SendError;
use crate::keys::key::IdempotencyKey;
use crate::message::body::ReadBody;
use crate::message::exchange::RetryResponse;
use crate::rules::classify::{FailureKind, StatusClass, classify_source_chain, classify_status};

/// Whether `response`'s body is bounded by `limit`: it declares a length no longer than that.
fn bounded<R: RetryResponse>(response: &R, limit: usize) -> bool {
    response
        .body_length()
        .is_some_and(|length| u64::try_from(limit).map_or(true, |limit| length <= limit))
}

/// `response` with its body read (and, with `keep`, its bytes in its extensions as
/// [`ReadBody`] for the ledger), when it is a final answer (one that is not retried: a
/// retried answer is dropped unread) bounded by `limit`; otherwise as it came. `keyed` says
/// whether the request carried a key (a 409 is final without one).
///
/// # Errors
///
/// A [`SendError::Failed`] when the body fails midway: `timeout` when the attempt's timeout
/// ran out, otherwise what the error's causes say (`connection_closed` by default).
pub(super) async fn read_bounded<R: RetryResponse>(
    response: R,
    limit: usize,
    keyed: bool,
    keep: bool,
) -> Result<R, SendError> {
    let last = classify_status(response.status(), response.headers(), keyed) == StatusClass::Final;
    if !last || !bounded(&response, limit) {
        return Ok(response);
    }
    let status = response.status();
    match response.read_to_save(limit).await {
        Ok((mut response, bytes)) => {
            // The ledger's finish saves these instead of reading the body a second time.
            if keep && let Some(bytes) = bytes {
                response.extensions_mut().insert(ReadBody(bytes));
            }
            Ok(response)
        }
        Err(source) => {
            let kind = match source.downcast_ref::<reqwest::Error>() {
                Some(err) if err.is_timeout() => FailureKind::Timeout,
                _ => classify_source_chain(&*source).unwrap_or(FailureKind::ConnectionClosed),
            };
            let source = CutAnswer {
                status: status.as_u16(),
                source,
            };
            Err(SendError::Failed {
                kind,
                source: Box::new(source),
            })
        }
    }
}

/// `response` as the caller gets it: a body that streams (no length, or longer than `limit`)
/// of a keyed operation fails, if it fails, with the key and how to have the answer again.
pub(super) fn note_streamed<R: RetryResponse>(
    response: R,
    key: Option<&IdempotencyKey>,
    limit: usize,
) -> R {
    let Some(key) = key else {
        return response;
    };
    if bounded(&response, limit) {
        return response;
    }
    let note: Arc<str> = format!(
        "the answer's body was cut after the receiver answered {}, so the operation's effect \
         may stand; send the same request again with idempotency key {key} to have the answer \
         again (from the ledger, or from the receiver's own store)",
        response.status().as_u16()
    )
    .into();
    response.note_body_errors(note)
}

/// The status of the answer whose body was cut, when `source` is such a failure.
pub(super) fn cut_status(source: &(dyn std::error::Error + 'static)) -> Option<http::StatusCode> {
    source
        .downcast_ref::<CutAnswer>()
        .and_then(|cut| http::StatusCode::from_u16(cut.status).ok())
}

/// A bounded answer whose body failed midway: the attempt's failure.
#[derive(Debug)]
struct CutAnswer {
    status: u16,
    source: crate::engine::transport::BoxError,
}

impl std::fmt::Display for CutAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the answer's head arrived ({}), then its body was cut",
            self.status
        )
    }
}

impl std::error::Error for CutAnswer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
