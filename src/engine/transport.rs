//! How a front end sends one attempt ([`Transport`]) and how its failures reach the engine
//! ([`SendError`]): classification of reqwest errors and of errors from other layers.

use std::error::Error as StdError;
use std::future::Future;

use tokio::time::Instant;
use tracing::Instrument;

use crate::message::exchange::{RetryRequest, RetryResponse};
use crate::message::url::strip_credentials;
use crate::outcome::error::Error;
#[cfg(any(feature = "tower", feature = "middleware"))]
use crate::rules::classify::classify_source_chain;
use crate::rules::classify::{FailureKind, classify_reqwest_error};
use crate::telemetry::WireTrace;

pub(crate) type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// How one attempt failed, as a transport reports it.
pub(crate) enum SendError {
    /// Nothing was sent: the request is malformed (a configuration error, not an attempt).
    Refused(Error),
    /// The attempt failed on the way; `kind` says how.
    Failed { kind: FailureKind, source: BoxError },
}

/// Sends one attempt. The only thing a front end implements.
pub(crate) trait Transport<Q: RetryRequest> {
    /// What a successful send produces.
    type Response: RetryResponse;

    /// Whether the engine opens a CLIENT span per request on the wire, and writes its trace
    /// context into the request's headers (feature `opentelemetry`). `false` for a transport
    /// whose next layer does both (`reqwest-tracing` under the middleware), so no request gets
    /// two client spans.
    const WIRE_SPANS: bool = true;

    /// Waits until the transport can take the next attempt, sending nothing (a tower service's
    /// `poll_ready`). The engine awaits it before it starts the attempt's clock, so a wait for
    /// capacity is never mistaken for a slow attempt. An error means the transport will never
    /// be ready: the operation ends without another attempt.
    fn ready(&mut self) -> impl Future<Output = Result<(), BoxError>> + Send {
        std::future::ready(Ok(()))
    }

    /// A copy of the operation's request to send as one attempt, or `None` when its body
    /// cannot be sent twice. The default is the request's own
    /// [`try_clone`](RetryRequest::try_clone); a transport that knows a cheaper way to the same
    /// copy (the reqwest one) makes it its way.
    fn copy_for_attempt(&mut self, original: &Q) -> Option<Q> {
        original.try_clone()
    }

    /// Sends one attempt of the request.
    fn send(
        &mut self,
        request: Q,
    ) -> impl Future<Output = Result<Self::Response, SendError>> + Send;

    /// Sends one attempt, given the operation's request it was cloned from (`None` when the
    /// body could not be cloned and the attempt is that request). A transport that may need
    /// the request again within the attempt (the reqwest one, to follow a redirect) clones it
    /// from `original` only when it must, instead of copying every attempt up front.
    ///
    /// `started` is when the engine started the attempt, which its timeout counts from: a
    /// transport that spends that timeout over several requests (redirect hops) counts from it
    /// too, without a clock read of its own.
    ///
    /// `wire` holds the attempt's open CLIENT span: the default runs the send in it. A
    /// transport that sends more than one request per attempt (redirect hops) closes and opens
    /// one per request through `wire`.
    fn send_attempt(
        &mut self,
        request: Q,
        original: Option<&Q>,
        started: Instant,
        wire: &mut WireTrace,
    ) -> impl Future<Output = Result<Self::Response, SendError>> + Send {
        let _ = (original, started);
        self.send(request).instrument(wire.span())
    }
}

/// Turns a reqwest error into the engine's view of a failed attempt. The URL the error carries
/// loses its user name and password first: the error becomes the source of this crate's
/// [`Error`], whose `Debug` shows it.
pub(crate) fn reqwest_send_error(mut err: reqwest::Error) -> SendError {
    if let Some(url) = err.url_mut() {
        strip_credentials(url);
    }
    if err.is_builder() {
        // reqwest refused the request before sending anything (an unsupported scheme, say): a
        // configuration error, not an attempt.
        SendError::Refused(Error::builder_from(err))
    } else {
        SendError::Failed {
            kind: classify_reqwest_error(&err),
            source: Box::new(err),
        }
    }
}

/// Classifies an error from another layer (a tower service, a middleware below ours).
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) fn send_error(mut err: BoxError) -> SendError {
    // A reqwest error's URL loses its credentials, as in `reqwest_send_error`.
    if let Some(url) = err
        .downcast_mut::<reqwest::Error>()
        .and_then(reqwest::Error::url_mut)
    {
        strip_credentials(url);
    }
    if let Some(reqwest) = err.downcast_ref::<reqwest::Error>()
        && reqwest.is_builder()
    {
        return SendError::Refused(Error::builder_from_boxed(err));
    }
    SendError::Failed {
        kind: classify_boxed(&*err),
        source: err,
    }
}

/// Classifies an error of unknown type: a reqwest error anywhere in the chain is classified as
/// the client classifies it; a timeout layer's `Elapsed` is a timeout; hyper-util's connect
/// errors never left; otherwise the chain's `io` and hyper errors decide, and anything
/// unrecognised is fatal (not retried: the safe reading of an unknown failure).
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) fn classify_boxed(err: &(dyn StdError + 'static)) -> FailureKind {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(reqwest) = e.downcast_ref::<reqwest::Error>() {
            return classify_reqwest_error(reqwest);
        }
        if e.is::<tokio::time::error::Elapsed>() {
            return FailureKind::Timeout;
        }
        #[cfg(feature = "tower")]
        if e.is::<tower::timeout::error::Elapsed>() {
            return FailureKind::Timeout;
        }
        #[cfg(feature = "tower")]
        if let Some(legacy) = e.downcast_ref::<hyper_util::client::legacy::Error>()
            && legacy.is_connect()
        {
            return FailureKind::Connect;
        }
        current = e.source();
    }
    classify_source_chain(err).unwrap_or(FailureKind::Fatal)
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use std::io;

    use super::*;

    #[test]
    fn unknown_errors_are_fatal_and_known_shapes_are_found_anywhere() {
        let plain: BoxError = "something odd".into();
        assert_eq!(classify_boxed(&*plain), FailureKind::Fatal);
        let reset: BoxError = Box::new(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(classify_boxed(&*reset), FailureKind::ConnectionReset);
        let elapsed: BoxError = Box::new(tower::timeout::error::Elapsed::new());
        assert_eq!(classify_boxed(&*elapsed), FailureKind::Timeout);
    }
}
