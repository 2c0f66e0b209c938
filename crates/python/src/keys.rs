//! Key derivations for Python: the same functions as `IdempotencyKey::derive` and
//! `IdempotencyKey::for_tool_call`, so a Python worker and a Rust worker name one operation
//! with one key.

use pyo3::prelude::*;

use crate::error::to_py;

/// A key derived from a scope and parts that survive a restart (`IdempotencyKey::derive`):
/// 64 lowercase hex digits of a length-prefixed, domain-separated SHA-256.
#[pyfunction]
#[pyo3(signature = (scope, parts = Vec::new()))]
pub fn derive(scope: &str, parts: Vec<String>) -> String {
    idempotent_retry_host::derive(scope, &parts)
}

/// A key for one tool call (`IdempotencyKey::for_tool_call`): SHA-256 over the tool name and
/// the RFC 8785 canonical form of the arguments, given as JSON text (the Python wrapper
/// serializes them with `json.dumps`).
///
/// # Errors
///
/// `ValueError` if `args_json` is not JSON.
#[pyfunction]
pub fn for_tool_call(tool: &str, args_json: &str) -> PyResult<String> {
    idempotent_retry_host::for_tool_call(tool, args_json).map_err(to_py)
}
