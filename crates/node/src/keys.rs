//! Key derivations for Node: the same functions as `IdempotencyKey::derive` and
//! `IdempotencyKey::for_tool_call`, so a Node worker, a Python worker and a Rust worker name
//! one operation with one key.

use napi_derive::napi;

use crate::error::to_js;

/// A key derived from a scope and parts that survive a restart (`IdempotencyKey::derive`):
/// 64 lowercase hex digits of a length-prefixed, domain-separated SHA-256.
#[napi]
pub fn derive(scope: String, parts: Vec<String>) -> String {
    idempotent_retry_host::derive(&scope, &parts)
}

/// A key for one tool call (`IdempotencyKey::for_tool_call`): SHA-256 over the tool name and
/// the RFC 8785 canonical form of the arguments, given as JSON text (the JavaScript wrapper
/// serializes them with `JSON.stringify`).
///
/// # Errors
///
/// `InvalidArg` if `args_json` is not JSON.
#[napi]
pub fn for_tool_call(tool: String, args_json: String) -> napi::Result<String> {
    idempotent_retry_host::for_tool_call(&tool, &args_json).map_err(to_js)
}
