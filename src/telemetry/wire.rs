//! One CLIENT span per request on the wire: each attempt, and each redirect hop the client
//! follows inside an attempt, with the OpenTelemetry HTTP client attributes and
//! `http.request.resend_count` from the operation's second request on; with the feature
//! `metrics`, the same request's `http.client.request.duration`.
//!
//! The engine opens a span before each attempt and closes it with what came back; the
//! client's redirect loop closes one and opens the next per hop. A front end only attaches
//! the open span to its I/O ([`WireTrace::span`]), so no front end names an attribute.

use std::sync::Arc;

use http::{Method, StatusCode, Version};
use tracing::field::Empty;

#[cfg(feature = "metrics")]
use super::metrics::RequestTimer;
use crate::message::exchange::RetryRequest;
use crate::message::url::Redacted;
use crate::time::Clock;

/// The spans of one operation's requests on the wire, children of its operation span.
#[derive(Debug)]
pub(crate) struct WireTrace {
    parent: tracing::Span,
    /// Requests opened so far in this operation: the next one's resend count.
    sent: u32,
    current: Option<tracing::Span>,
    /// The open span's request, recorded on it when it goes out or closes.
    target: Option<Target>,
    /// Whether spans are opened, and the trace context goes into each request's headers
    /// (feature `opentelemetry`): `false` when the layer under the front end does both.
    traced: bool,
    /// The open request's duration metric and when it started (feature `metrics`).
    #[cfg(feature = "metrics")]
    timer: Option<(RequestTimer, tokio::time::Instant)>,
    #[cfg(feature = "metrics")]
    clock: Arc<dyn Clock>,
}

/// What a CLIENT span says of its request: kept until it goes out, since the request it was
/// opened for may be replaced before that (`WireTrace::retarget`).
#[derive(Debug)]
struct Target {
    method: &'static str,
    url: Option<reqwest::Url>,
    resends: u32,
}

impl WireTrace {
    /// Spans under `parent`, each request carrying its own span's trace context (feature
    /// `opentelemetry`, through the global propagator); none at all unless `traced`. Request
    /// durations (feature `metrics`) are read from `clock`, spans or not.
    pub(crate) fn new(parent: tracing::Span, traced: bool, clock: &Arc<dyn Clock>) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = clock;
        WireTrace {
            parent,
            sent: 0,
            current: None,
            target: None,
            traced,
            #[cfg(feature = "metrics")]
            timer: None,
            #[cfg(feature = "metrics")]
            clock: Arc::clone(clock),
        }
    }

    /// Opens the span of the next request on the wire, the one about to be sent.
    pub(crate) fn open<Q: RetryRequest>(&mut self, request: &mut Q) {
        let resends = self.sent;
        self.sent = self.sent.saturating_add(1);
        let method = method_label(request.method());
        let span = if self.traced {
            self.span_for(method)
        } else {
            tracing::Span::none()
        };
        self.current = Some(span);
        self.describe(method, resends, request);
    }

    /// Makes the open span `request`'s: the request it was opened for never went out (a
    /// redirect it was answered with before the operation stands in for its answer,
    /// `client/redirect/answered.rs`), and `request` goes in its place, not as a resend. Opens
    /// one when none is open.
    pub(crate) fn retarget<Q: RetryRequest>(&mut self, request: &mut Q) {
        let Some(span) = &self.current else {
            return self.open(request);
        };
        let method = method_label(request.method());
        if !span.is_disabled() {
            span.record("otel.name", method);
        }
        self.describe(method, self.sent.saturating_sub(1), request);
    }

    /// Keeps `request`'s method and target for the open span (its `resends`-th resend),
    /// recorded when it goes out ([`span`](Self::span)) or closes: a span describes the request
    /// that went out, once. Carries the span's context in the request's headers and starts its
    /// timer.
    fn describe<Q: RetryRequest>(&mut self, method: &'static str, resends: u32, request: &mut Q) {
        let span = self.current.as_ref().expect("describe follows open");
        let url = if !span.is_disabled() || cfg!(feature = "metrics") {
            request.url()
        } else {
            None
        };
        if !span.is_disabled() {
            #[cfg(feature = "opentelemetry")]
            super::propagate::inject(span, request.headers_mut());
            self.target = Some(Target {
                method,
                url: url.clone(),
                resends,
            });
        }
        #[cfg(feature = "metrics")]
        {
            self.timer = Some((RequestTimer::new(method, url), self.clock.now()));
        }
    }

    /// Records the open span's request, kept by `describe`, on it.
    fn record_target(&mut self) {
        let (Some(span), Some(target)) = (&self.current, self.target.take()) else {
            return;
        };
        span.record("http.request.method", target.method);
        if let Some(url) = &target.url {
            span.record("server.address", url.host_str().unwrap_or(""));
            if let Some(port) = url.port_or_known_default() {
                span.record("server.port", port);
            }
            span.record("url.full", tracing::field::display(Redacted(url)));
        }
        // Recommended if and only if the request was resent, whatever the cause.
        if target.resends > 0 {
            span.record("http.request.resend_count", target.resends);
        }
    }

    /// A CLIENT span for a request with this method, its other attributes still empty.
    fn span_for(&self, method: &'static str) -> tracing::Span {
        tracing::info_span!(
            parent: &self.parent,
            "http_request",
            otel.name = method,
            otel.kind = "client",
            otel.status_code = Empty,
            http.request.method = Empty,
            server.address = Empty,
            server.port = Empty,
            url.full = Empty,
            http.request.resend_count = Empty,
            http.response.status_code = Empty,
            error.type = Empty,
            network.protocol.version = Empty,
        )
    }

    /// The open request's span, for the front end to run its I/O in (a disabled span when
    /// none is open).
    pub(crate) fn span(&mut self) -> tracing::Span {
        self.record_target();
        self.current.clone().unwrap_or_else(tracing::Span::none)
    }

    /// Closes the open span with the response's status and protocol version; a status of 400
    /// or more is an error (its `error.type` is the status code, as the conventions say).
    pub(crate) fn answered(&mut self, status: StatusCode, version: Option<Version>) {
        self.record_target();
        let version = version.and_then(version_label);
        #[cfg(feature = "metrics")]
        if let Some((timer, started)) = self.timer.take() {
            timer.answered(
                status,
                version,
                self.clock.now().saturating_duration_since(started),
            );
        }
        let Some(span) = self.current.take() else {
            return;
        };
        span.record("http.response.status_code", status.as_u16());
        if let Some(version) = version {
            span.record("network.protocol.version", version);
        }
        if status.as_u16() >= 400 {
            span.record("error.type", status.as_str());
            span.record("otel.status_code", "error");
        }
    }

    /// Closes the open span as failed, `error_type` a low-cardinality name of the failure
    /// (a [`FailureKind`](crate::FailureKind)'s `as_str`).
    pub(crate) fn failed(&mut self, error_type: &'static str) {
        self.record_target();
        #[cfg(feature = "metrics")]
        if let Some((timer, started)) = self.timer.take() {
            timer.failed(
                error_type,
                self.clock.now().saturating_duration_since(started),
            );
        }
        let Some(span) = self.current.take() else {
            return;
        };
        span.record("error.type", error_type);
        span.record("otel.status_code", "error");
    }
}

/// The conventions' method value: one of the methods they know, `_OTHER` otherwise (a method
/// name is caller input; the set stays small).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "_OTHER",
    }
}

/// `network.protocol.version`: `1.0`, `1.1`, `2`, `3`.
fn version_label(version: Version) -> Option<&'static str> {
    match version {
        Version::HTTP_09 => Some("0.9"),
        Version::HTTP_10 => Some("1.0"),
        Version::HTTP_11 => Some("1.1"),
        Version::HTTP_2 => Some("2"),
        Version::HTTP_3 => Some("3"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_conventions_values() {
        assert_eq!(method_label(&Method::POST), "POST");
        assert_eq!(
            method_label(&Method::from_bytes(b"PURGE").expect("valid")),
            "_OTHER"
        );
        assert_eq!(version_label(Version::HTTP_11), Some("1.1"));
        assert_eq!(version_label(Version::HTTP_2), Some("2"));
    }
}
