//! Retrying HTTP client that keeps one idempotency key per logical operation.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod backoff;
mod canonical;
mod classify;
mod client;
mod error;
mod key;
mod policy;
mod report;
mod request;
mod retry_after;
mod time;

pub use backoff::{backoff_ceiling, full_jitter};
pub use canonical::canonical_json;
pub use classify::FailureKind;
pub use client::{Client, ClientBuilder, IDEMPOTENCY_KEY};
pub use error::{Error, ErrorKind};
pub use key::{IdempotencyKey, InvalidKey, InvalidKeyReason};
pub use policy::RetryPolicy;
pub use report::{AttemptRecord, RetryReport, Wait, WaitReason};
pub use request::RequestBuilder;
pub use retry_after::{parse_retry_after, parse_retry_after_ms, requested_delay};
pub use time::{Clock, Sleep, Sleeper, TokioClock, TokioSleeper};
