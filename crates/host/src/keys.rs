//! Key derivations for the host language: the same functions as `IdempotencyKey::derive` and
//! `IdempotencyKey::for_tool_call`, so workers in every language name one operation with one
//! key.

use idempotent_retry::IdempotencyKey;

use crate::error::HostError;

/// A key derived from a scope and parts that survive a restart (`IdempotencyKey::derive`):
/// 64 lowercase hex digits of a length-prefixed, domain-separated SHA-256.
pub fn derive(scope: &str, parts: &[String]) -> String {
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    IdempotencyKey::derive(scope, &parts).into_string()
}

/// A key for one tool call (`IdempotencyKey::for_tool_call`): SHA-256 over the tool name and
/// the RFC 8785 canonical form of the arguments, given as JSON text.
///
/// # Errors
///
/// A value error if `args_json` is not JSON.
pub fn for_tool_call(tool: &str, args_json: &str) -> Result<String, HostError> {
    let args: serde_json::Value = serde_json::from_str(args_json)
        .map_err(|err| HostError::value(format!("the tool call's arguments: {err}")))?;
    Ok(IdempotencyKey::for_tool_call(tool, &args).into_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_derivations_are_the_crates() {
        assert_eq!(
            derive("run-1", &["step-2".to_owned()]),
            IdempotencyKey::derive("run-1", &["step-2"]).into_string()
        );
        assert_eq!(
            for_tool_call("send_email", r#"{"b":1,"a":[2,3]}"#).unwrap(),
            IdempotencyKey::for_tool_call("send_email", &serde_json::json!({"a":[2,3],"b":1}))
                .into_string()
        );
        let err = for_tool_call("send_email", "{not json").unwrap_err();
        assert!(
            err.message.starts_with("the tool call's arguments"),
            "{err}"
        );
    }
}
