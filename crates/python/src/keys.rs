//! Key derivations for Python: the same functions as `IdempotencyKey::derive` and
//! `IdempotencyKey::for_tool_call`, so a Python worker and a Rust worker name one operation
//! with one key.

use idempotent_retry::IdempotencyKey;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A key derived from a scope and parts that survive a restart (`IdempotencyKey::derive`):
/// 64 lowercase hex digits of a length-prefixed, domain-separated SHA-256.
#[pyfunction]
#[pyo3(signature = (scope, parts = Vec::new()))]
pub fn derive(scope: &str, parts: Vec<String>) -> String {
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    IdempotencyKey::derive(scope, &parts).into_string()
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
    let args: serde_json::Value = serde_json::from_str(args_json)
        .map_err(|err| PyValueError::new_err(format!("the tool call's arguments: {err}")))?;
    Ok(IdempotencyKey::for_tool_call(tool, &args).into_string())
}
