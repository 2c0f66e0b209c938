//! The follow loop: one attempt through the client's `reqwest::Client`, each redirect the
//! [`RedirectPolicy`] allows followed as the next hop under the same timeout, with or without
//! the key, credentials stripped across origins.

use std::time::Duration;

use http::Method;
use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HeaderMap, HeaderName,
    HeaderValue, PROXY_AUTHORIZATION, TRANSFER_ENCODING, WWW_AUTHENTICATE,
};
use reqwest::Url;
use tokio::time::Instant;
use tracing::Instrument;

use super::answered::AnsweredRedirect;
use super::chain::{
    HopsTimedOut, RedirectChain, RedirectHop, TooManyRedirects, key_text, warn_if_inner_redirected,
};
use super::policy::{
    RedirectPolicy, RedirectStop, Rewrite, resolve_location, rewrite, same_origin,
};
use crate::engine::settings::Settings;
use crate::engine::transport::{SendError, reqwest_send_error};
use crate::rules::classify::FailureKind;
use crate::telemetry::WireTrace;

/// What is kept of a request while it is sent: a full copy for the next hop, one without its
/// streamed body, or (when no redirect is followed) only its URL.
enum Retained {
    Full(reqwest::Request),
    BodyLost(reqwest::Request),
    Url(Url),
}

impl Retained {
    fn of(request: &reqwest::Request, policy: &RedirectPolicy) -> Retained {
        if policy.max_hops.is_none() {
            return Retained::Url(request.url().clone());
        }
        match request.try_clone() {
            Some(copy) => Retained::Full(copy),
            None => {
                let mut copy =
                    reqwest::Request::new(request.method().clone(), request.url().clone());
                *copy.headers_mut() = request.headers().clone();
                *copy.version_mut() = request.version();
                Retained::BodyLost(copy)
            }
        }
    }

    /// The URL the request was sent to.
    fn url(&self) -> &Url {
        match self {
            Retained::Full(request) | Retained::BodyLost(request) => request.url(),
            Retained::Url(url) => url,
        }
    }
}

/// What to do with a response.
enum Step {
    /// Return it; `Some` when it is a redirect left unfollowed.
    Final(Option<RedirectStop>),
    /// One redirect more than allowed.
    TooMany(u32),
    /// Send this request next.
    Follow(Box<(reqwest::Request, RedirectHop)>),
}

/// Decides what follows `response` (status, headers, URL), given a copy of the request that
/// produced it.
fn next_step(
    policy: &RedirectPolicy,
    original: &Url,
    key_header: &HeaderName,
    hops_so_far: usize,
    response: &reqwest::Response,
    copy: Retained,
) -> Step {
    let status = response.status();
    let (sent, limit) = match (&copy, policy.max_hops) {
        (Retained::Full(request) | Retained::BodyLost(request), Some(limit)) => (request, limit),
        // Only `none()` keeps no copy.
        (Retained::Url(_), _) | (_, None) => {
            return Step::Final(rewrite(status, &Method::GET).map(|_| RedirectStop::Disabled));
        }
    };
    let Some(Rewrite { method, resend }) = rewrite(status, sent.method()) else {
        return Step::Final(None);
    };
    let current = response.url();
    let to = match resolve_location(current, response.headers()) {
        Ok(to) => to,
        Err(stop) => return Step::Final(Some(stop)),
    };
    let keyed = sent.headers().contains_key(key_header);
    if resend && keyed && !policy.allows_key_to(original, &to) {
        return Step::Final(Some(RedirectStop::KeyToOtherOrigin));
    }
    let mut next = match copy {
        Retained::Full(request) => request,
        Retained::BodyLost(_) if resend => {
            return Step::Final(Some(RedirectStop::BodyNotReplayable));
        }
        Retained::BodyLost(request) => request,
        Retained::Url(_) => return Step::Final(Some(RedirectStop::Disabled)),
    };
    if u32::try_from(hops_so_far).unwrap_or(u32::MAX) >= limit {
        return Step::TooMany(limit);
    }
    if !resend {
        *next.body_mut() = None;
        let headers = next.headers_mut();
        for name in [
            CONTENT_TYPE,
            CONTENT_LENGTH,
            CONTENT_ENCODING,
            TRANSFER_ENCODING,
        ] {
            headers.remove(name);
        }
        headers.remove(key_header);
    }
    if !same_origin(current, &to) {
        strip_credentials(next.headers_mut());
    }
    *next.method_mut() = method.clone();
    *next.url_mut() = to.clone();
    let hop = RedirectHop {
        status,
        from: current.clone(),
        to,
        method,
        key_sent: next.headers().contains_key(key_header),
    };
    Step::Follow(Box::new((next, hop)))
}

/// Removes what reqwest removes when a redirect leaves the origin.
fn strip_credentials(headers: &mut HeaderMap) {
    for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION, WWW_AUTHENTICATE] {
        headers.remove(name);
    }
    headers.remove("cookie2");
}

/// What is kept of a hop while it is sent, to build the next one from.
enum Kept<'o> {
    /// The operation's own request, which the engine keeps for later attempts: nothing is
    /// copied unless a redirect comes back. `attempt` is this attempt's attempt-header value.
    Original {
        request: &'o reqwest::Request,
        attempt: Option<HeaderValue>,
    },
    /// A copy made before sending: for later hops, and for a streamed body the engine could
    /// not keep.
    Copy(Box<Retained>),
}

impl Kept<'_> {
    /// The key the hop sent, when `copied` (its own, looked up before it was sent) does not
    /// have it: the operation's request carries the attempt's key, so on the first hop it is
    /// looked up there, and only when a line is logged.
    fn key(&self, copied: Option<&HeaderValue>, key_header: &HeaderName) -> Option<HeaderValue> {
        match self {
            Kept::Original { request, .. } => request.headers().get(key_header).cloned(),
            Kept::Copy(_) => copied.cloned(),
        }
    }

    /// The URL the hop was sent to.
    fn url(&self) -> &Url {
        match self {
            Kept::Original { request, .. } => request.url(),
            Kept::Copy(copy) => copy.url(),
        }
    }

    /// The request again, as this hop sent it.
    fn into_retained(
        self,
        policy: &RedirectPolicy,
        attempt_header: Option<&HeaderName>,
    ) -> Retained {
        match self {
            Kept::Copy(copy) => *copy,
            Kept::Original { request, attempt } => {
                let mut copy = Retained::of(request, policy);
                if let (Retained::Full(copy) | Retained::BodyLost(copy), Some(name), Some(value)) =
                    (&mut copy, attempt_header, attempt)
                {
                    copy.headers_mut().insert(name.clone(), value);
                }
                copy
            }
        }
    }
}

/// Sends one attempt through the client's `reqwest::Client` and follows its redirects by the
/// client's [`RedirectPolicy`], all within the attempt's timeout (the request's own, set by
/// the engine).
///
/// `original` is the operation's request the attempt was cloned from, when the engine has it:
/// the first hop is then rebuilt from it only if a redirect comes back, so an attempt without
/// redirects copies nothing.
///
/// `started` is when the attempt started (the engine's clock read for its timeout): a later
/// hop gets what the hops before it left of the timeout, counted from then.
///
/// `wire` holds the first hop's open span (the engine opened it); each hop followed closes the
/// span of the redirect it answers and opens its own, a resend by the conventions.
///
/// `answered` are the redirects the request was answered with before the operation, followed by
/// the caller (`answered.rs`): each attempt replays them through these rules without sending
/// the requests they answer, even under a policy that follows no live redirect, and sends the
/// last hop.
///
/// An `async` block rather than an `async fn`: an `async fn` keeps its arguments twice in its
/// state (the request as passed, and as the local it moves into), and the engine moves this
/// state whole into its own.
#[allow(
    clippy::manual_async_fn,
    reason = "an async fn would keep its arguments twice in the future's state"
)]
#[allow(
    clippy::too_many_arguments,
    reason = "each comes from a different owner: the client, the engine, the attempt, the caller"
)]
pub(crate) fn follow(
    http: &reqwest::Client,
    policy: &RedirectPolicy,
    settings: &Settings,
    mut request: reqwest::Request,
    original: Option<&reqwest::Request>,
    started: Instant,
    wire: &mut WireTrace,
    answered: &[AnsweredRedirect],
) -> impl Future<Output = Result<reqwest::Response, SendError>> + Send {
    async move {
        let key_header = &settings.key_header;
        let budget = request.timeout().copied();
        let mut chain = RedirectChain::default();
        // The answered hops are followed whatever the limit, and count toward it.
        let replaying = (!answered.is_empty()).then(|| policy.with_answered(answered.len()));
        loop {
            let replayed = answered.get(chain.hops.len());
            // A policy that follows no live redirect hands the first live one back as it is.
            let policy = match &replaying {
                Some(replaying) if replayed.is_some() || policy.max_hops.is_some() => replaying,
                _ => policy,
            };
            let kept = match original {
                Some(original) if chain.hops.is_empty() => Kept::Original {
                    request: original,
                    attempt: settings
                        .attempt_header
                        .as_ref()
                        .and_then(|name| request.headers().get(name).cloned()),
                },
                // Made before this hop consumes a streamed body.
                _ => Kept::Copy(Box::new(Retained::of(&request, policy))),
            };
            let copied_key = match &kept {
                Kept::Original { .. } => None,
                Kept::Copy(_) => request.headers().get(key_header).cloned(),
            };
            // The first hop carries the attempt's whole timeout, as the engine set it; a later hop
            // gets what the hops before it left.
            if let Some(budget) = budget
                && !chain.hops.is_empty()
            {
                let spent = settings.clock.now().saturating_duration_since(started);
                let left = budget.saturating_sub(spent);
                if left == Duration::ZERO {
                    return Err(SendError::Failed {
                        kind: FailureKind::Timeout,
                        source: Box::new(HopsTimedOut),
                    });
                }
                *request.timeout_mut() = Some(left);
            }
            let sent = match replayed {
                // Answered before the operation: nothing goes out for it.
                Some(answered) => Ok(answered.response(kept.url())),
                None => http.execute(request).instrument(wire.span()).await,
            };
            let response = match sent {
                Ok(response) => response,
                Err(err) => {
                    let mut failed = reqwest_send_error(err);
                    if let SendError::Failed { kind, .. } = &mut failed
                        && !chain.hops.is_empty()
                        && kind.never_sent()
                    {
                        // The request reached the server that redirected it, so this is no
                        // proof that the operation never ran.
                        *kind = FailureKind::RedirectTargetUnreachable;
                    }
                    return Err(failed);
                }
            };
            chain.inner_client_redirected |= replayed.is_none()
                && warn_if_inner_redirected(kept.url(), response.url(), || {
                    kept.key(copied_key.as_ref(), key_header)
                });
            let mut key = None;
            let step = if rewrite(response.status(), &Method::GET).is_none() {
                // Not a redirect: the common case, decided without building anything.
                Step::Final(None)
            } else {
                key = kept.key(copied_key.as_ref(), key_header);
                let first = chain
                    .hops
                    .first()
                    .map_or_else(|| kept.url().clone(), |hop| hop.from.clone());
                let copy = kept.into_retained(policy, settings.attempt_header.as_ref());
                next_step(
                    policy,
                    &first,
                    key_header,
                    chain.hops.len(),
                    &response,
                    copy,
                )
            };
            match step {
                Step::Final(stopped) => {
                    chain.stopped = stopped;
                    if let Some(stop) = stopped {
                        tracing::debug!(
                            key = key_text(key.as_ref()),
                            status = response.status().as_u16(),
                            why = %stop,
                            "redirect not followed"
                        );
                    }
                    let mut response = response;
                    // Only a chain with something in it costs an entry: `of` reads the rest as empty.
                    if !chain.is_empty() {
                        response.extensions_mut().insert(chain);
                    }
                    return Ok(response);
                }
                Step::TooMany(limit) => {
                    return Err(SendError::Failed {
                        kind: FailureKind::TooManyRedirects,
                        source: Box::new(TooManyRedirects { limit }),
                    });
                }
                Step::Follow(follow) => {
                    let (next, hop) = *follow;
                    let (status, version) = (response.status(), response.version());
                    tracing::debug!(
                        key = key_text(key.as_ref()),
                        status = hop.status.as_u16(),
                        from = %hop.from.origin().ascii_serialization(),
                        to = %hop.to.origin().ascii_serialization(),
                        method = %hop.method,
                        key_sent = hop.key_sent,
                        "following a redirect"
                    );
                    chain.hops.push(hop);
                    // Release the redirect's connection before the next hop.
                    drop(response);
                    request = next;
                    if replayed.is_some() {
                        // The span opened for a request that never went out is this one's.
                        wire.retarget(&mut request);
                    } else {
                        wire.answered(status, Some(version));
                        wire.open(&mut request);
                    }
                }
            }
        }
    }
}
