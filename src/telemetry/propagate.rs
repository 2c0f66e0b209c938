//! Trace context on the wire (feature `opentelemetry`): a request's headers get its own span's
//! context, written by the globally configured propagator (W3C `traceparent` and
//! `tracestate` with `TraceContextPropagator`).

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use opentelemetry::propagation::Injector;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writes `span`'s context into `headers`. Writes nothing when the subscriber has no
/// `tracing-opentelemetry` layer or the global propagator is the default no-op one.
pub(super) fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    let context = span.context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut Headers(headers));
    });
}

/// `HeaderMap` as a propagator's carrier.
struct Headers<'h>(&'h mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        // A propagator writes token names and visible-ASCII values; anything else is dropped
        // rather than sent malformed.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
