//! The native half of the npm package `idempotent-retry`: the module the package's `fetch`
//! (`index.js`) calls into. It turns the language-neutral engine of `idempotent-retry-host`
//! (the shared runtime, an `idempotent_retry::Client` with its policy, TLS and ledger, one
//! request in, how it ended out) into Node's values: [`Engine`], [`Operation`] (one operation
//! started, awaited, cancelled, its streamed body read), [`Answer`], request bodies streamed
//! from JavaScript ([`BodyStream`]), and the key derivations ([`derive()`],
//! [`for_tool_call()`]), byte for byte those of `IdempotencyKey`. With the `testing` feature,
//! the workspace's test receiver for the package's own suite.
//!
//! Built by `@napi-rs/cli` (`crates/node/package.json`); the package's README says how it is
//! used.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod answer;
mod body;
mod engine;
mod error;
mod keys;
mod operation;
#[cfg(feature = "testing")]
mod testing;

pub use answer::{Answer, Attempt};
pub use body::BodyStream;
pub use engine::{Engine, EngineOptions, RequestParts};
pub use keys::{derive, for_tool_call};
pub use operation::Operation;
