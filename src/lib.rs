//! placeholder crate docs (written last)
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
