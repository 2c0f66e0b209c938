//! The tokio runtime every engine of a process shares (`idempotent_retry_host::runtime`, one
//! per process, a child of a `fork()` getting its own), as Python sees it.

use pyo3::PyResult;
use tokio::runtime::Runtime;

pub(crate) use idempotent_retry_host::Born;

/// This process's runtime, started on first use.
///
/// # Errors
///
/// `RuntimeError` when the operating system refused to start its threads.
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
    idempotent_retry_host::runtime().map_err(crate::error::to_py)
}
