//! The one tokio runtime every engine of the process shares.

use std::sync::OnceLock;

use pyo3::PyResult;
use pyo3::exceptions::PyRuntimeError;
use tokio::runtime::Runtime;

/// The runtime's worker threads: the HTTP work is I/O, and Python's threads wait on it.
const WORKERS: usize = 2;

/// The process's runtime, started on first use.
///
/// # Errors
///
/// `RuntimeError` when the operating system refused to start its threads (then every later
/// call says so again: nothing is left to run on).
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(WORKERS)
                .thread_name("idempotent-retry")
                .enable_all()
                .build()
                .map_err(|err| err.to_string())
        })
        .as_ref()
        .map_err(|err| {
            PyRuntimeError::new_err(format!(
                "cannot start the idempotent-retry runtime's threads: {err}"
            ))
        })
}
