//! The facts a decision is made from, pure: what an attempt's outcome means (`classify.rs`),
//! how long to back off (`backoff.rs`), how long the server asked to wait (`retry_after.rs`),
//! whether the reconcile window is still open (`window.rs`), and a constant generator for
//! deterministic draws in tests and benches (`const_rng.rs`). No clock is read here: times
//! come in as arguments.
//!
//! May import: nothing.

pub mod backoff;
pub(crate) mod classify;
#[cfg(any(test, feature = "internals"))]
pub(crate) mod const_rng;
pub mod retry_after;
pub(crate) mod window;
