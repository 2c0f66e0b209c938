//! The reqwest transport: one attempt through the client's `reqwest::Client`, redirects
//! followed by the client's [`RedirectPolicy`](crate::RedirectPolicy) (`redirect/follow.rs`).

use super::redirect::follow;
use super::shared::ClientRef;
use crate::transport::{SendError, Transport};

/// Sends each attempt with the client's `reqwest::Client`.
pub(crate) struct ReqwestTransport<'a>(pub(crate) &'a ClientRef);

impl Transport<reqwest::Request> for ReqwestTransport<'_> {
    type Response = reqwest::Response;

    async fn send(&mut self, request: reqwest::Request) -> Result<reqwest::Response, SendError> {
        self.send_attempt(request, None).await
    }

    async fn send_attempt(
        &mut self,
        request: reqwest::Request,
        original: Option<&reqwest::Request>,
    ) -> Result<reqwest::Response, SendError> {
        let client = self.0;
        follow(
            &client.http,
            &client.redirects,
            &client.settings,
            request,
            original,
        )
        .await
    }
}
