//! The reqwest transport: one attempt through the client's `reqwest::Client`, redirects
//! followed by the client's [`RedirectPolicy`](crate::RedirectPolicy) (`redirect/follow.rs`);
//! and [`execute`], the one way a client's request enters the engine's pipeline.

use tokio::time::Instant;

use super::copy::Copies;
use super::redirect::{AnsweredRedirect, follow};
use super::shared::ClientRef;
use crate::engine;
use crate::engine::settings::Overrides;
use crate::engine::transport::{SendError, Transport};
use crate::outcome::error::Error;
use crate::telemetry::WireTrace;

/// Runs `request` as one logical operation with `overrides`, through the engine's pipeline:
/// what [`RequestBuilder::send`](crate::RequestBuilder::send) and
/// [`Client::execute`](crate::Client::execute) both do.
///
/// # Errors
///
/// As [`RequestBuilder::send`](crate::RequestBuilder::send).
/// `copies` says how each attempt's copy of `request` is made (`copy.rs`); `answered` are the
/// redirects it was answered with before, that its caller followed (`redirect/answered.rs`).
pub(super) fn execute<'a>(
    client: &'a ClientRef,
    request: reqwest::Request,
    overrides: Overrides,
    copies: Copies,
    answered: &'a [AnsweredRedirect],
) -> impl Future<Output = Result<reqwest::Response, Error>> {
    // The engine's future itself, not one more level of state around it.
    engine::execute(
        &client.settings,
        request,
        overrides,
        ReqwestTransport {
            client,
            copies,
            answered,
        },
    )
}

/// Sends each attempt with the client's `reqwest::Client`.
struct ReqwestTransport<'a> {
    client: &'a ClientRef,
    /// How each attempt's copy of the request is made.
    copies: Copies,
    /// The redirects every attempt replays before it sends.
    answered: &'a [AnsweredRedirect],
}

impl Transport<reqwest::Request> for ReqwestTransport<'_> {
    type Response = reqwest::Response;

    fn copy_for_attempt(&mut self, original: &reqwest::Request) -> Option<reqwest::Request> {
        self.copies.copy(original)
    }

    /// The engine sends through `send_attempt`; this is the same, with the hops' spans under
    /// the current span.
    async fn send(
        &mut self,
        mut request: reqwest::Request,
    ) -> Result<reqwest::Response, SendError> {
        let clock = &self.client.settings.clock;
        let mut wire = WireTrace::new(tracing::Span::current(), true, clock);
        wire.open(&mut request);
        let started = clock.now();
        self.send_attempt(request, None, started, &mut wire).await
    }

    /// The follow loop's future itself, not one more level of state around it (that level
    /// would keep a second copy of the request).
    fn send_attempt(
        &mut self,
        request: reqwest::Request,
        original: Option<&reqwest::Request>,
        started: Instant,
        wire: &mut WireTrace,
    ) -> impl Future<Output = Result<reqwest::Response, SendError>> + Send {
        let client = self.client;
        follow(
            &client.http,
            &client.redirects,
            &client.settings,
            request,
            original,
            started,
            wire,
            self.answered,
        )
    }
}
