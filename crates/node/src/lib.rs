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

/// The runtime napi runs the module's promises on, where each operation runs (`Operation.wait`):
/// one worker thread, so an operation's task and its connection's task run on the same thread,
/// with no hand-off between two workers per request (on a 2-core machine, 8.4 context switches
/// per sequential request with napi's default of one worker per core). Node's one JavaScript
/// thread feeds it; a second worker would only help CPU-bound work the engine does not do.
#[napi_derive::module_init]
fn init() {
    // Without it (the threads refused), napi starts its own default runtime on first use.
    if let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("idempotent-retry-node")
        .enable_all()
        .build()
    {
        napi::bindgen_prelude::create_custom_tokio_runtime(runtime);
    }
}
