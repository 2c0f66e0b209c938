//! The native half of the Python package `idempotent_retry`: the module
//! `idempotent_retry._native`, which the package's `Transport` and `AsyncTransport` (Python
//! classes over httpx) call into.
//!
//! It turns the language-neutral engine of `idempotent-retry-host` (the shared runtime, an
//! `idempotent_retry::Client` with its policy, TLS and ledger, one request in, how it ended
//! out) into Python's objects: [`Engine`], [`Answer`], request bodies streamed from Python
//! ([`BodyStream`]), and the key derivations ([`derive()`], [`for_tool_call()`]), byte for
//! byte those of `IdempotencyKey`. With the `testing` feature, the submodule `_testing` starts
//! the workspace's test receiver for the package's pytest suite.
//!
//! The module is built by maturin (`crates/python/pyproject.toml`) as an abi3 extension for
//! CPython 3.10 and later; the package's README says how it is used.
#![forbid(unsafe_code)]
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
mod runtime;
#[cfg(feature = "testing")]
mod testing;

use pyo3::prelude::*;

pub use answer::{Answer, ResponseBody};
pub use body::BodyStream;
pub use engine::{Engine, Pending};
pub use keys::{derive, for_tool_call};

/// The extension module `idempotent_retry._native`.
///
/// # Errors
///
/// Fails only if Python cannot add a class or function to the module.
#[pymodule]
pub fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Engine>()?;
    module.add_class::<Answer>()?;
    module.add_class::<Pending>()?;
    module.add_class::<ResponseBody>()?;
    module.add_class::<BodyStream>()?;
    module.add_function(wrap_pyfunction!(derive, module)?)?;
    module.add_function(wrap_pyfunction!(for_tool_call, module)?)?;
    #[cfg(feature = "testing")]
    testing::add_to(module)?;
    Ok(())
}
