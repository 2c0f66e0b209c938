//! The language-neutral half of idempotent-retry's packages for other languages (the Python
//! package's and the Node package's native modules): one shared tokio runtime
//! ([`runtime()`], fork-aware), an [`Engine`] made from [`Settings`] (an
//! `idempotent_retry::Client` with its policy, TLS and ledger), one request in raw parts
//! ([`Engine::outgoing`]) and its end as plain data ([`Finished`]), request bodies streamed
//! from the host language ([`BodyChannel`]), the key derivations ([`derive()`],
//! [`for_tool_call()`]) and, with the `testing` feature, the helpers of the packages' suites.
//!
//! Each package turns these into its language's objects and errors ([`HostError`]'s kind says
//! which); nothing of the engine's behaviour is written twice.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod body;
mod engine;
mod error;
mod finished;
mod keys;
mod runtime;
#[cfg(feature = "testing")]
pub mod testing;
mod tls;

pub use body::BodyChannel;
pub use engine::{DEFAULT_ANSWER_READ_LIMIT, Engine, Outgoing, Settings, absolute, seconds};
pub use error::{HostError, HostErrorKind, with_causes};
pub use finished::{AttemptRow, Finished, Received, next_chunk};
pub use keys::{derive, for_tool_call};
pub use runtime::{Born, runtime};
pub use tls::Connection;
