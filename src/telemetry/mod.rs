//! Traces by the OpenTelemetry HTTP client conventions, through `tracing` alone.
//!
//! One INTERNAL span per operation (`operation.rs`) and one CLIENT span per request on the
//! wire under it (`wire.rs`), with the fields `tracing-opentelemetry` maps (`otel.name`,
//! `otel.kind`, `otel.status_code`), so the library needs no OpenTelemetry crate to be
//! exported by one; with the feature `opentelemetry`, each request also carries its own span's
//! trace context (`propagate.rs`). The attribute table is in the crate docs
//! ([`crate#traces`]). With the feature `metrics`, the same points record metrics through the
//! `metrics` facade (`metrics.rs`, table in [`crate#metrics`]).
//!
//! May import: time, keys, rules, message, outcome, decision.

pub(crate) mod metrics;
pub(crate) mod operation;
#[cfg(feature = "opentelemetry")]
mod propagate;
mod wire;

pub(crate) use wire::WireTrace;
