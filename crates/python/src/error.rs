//! The host layer's errors as Python's exceptions.

use idempotent_retry_host::{HostError, HostErrorKind};
use pyo3::PyErr;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};

/// `ValueError`, `FileNotFoundError`, `OSError` or `RuntimeError`, as `err`'s kind says.
pub(crate) fn to_py(err: HostError) -> PyErr {
    match err.kind {
        HostErrorKind::Value => PyValueError::new_err(err.message),
        HostErrorKind::NotFound => PyFileNotFoundError::new_err(err.message),
        HostErrorKind::Io => PyOSError::new_err(err.message),
        HostErrorKind::Runtime => PyRuntimeError::new_err(err.message),
    }
}
