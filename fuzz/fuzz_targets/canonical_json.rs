//! RFC 8785 canonical JSON compared against a re-parse.
//!
//! The input is parsed as JSON (what `serde_json` refuses is skipped). Checked: the canonical
//! form parses back to a value equal to the input once every number is read as the double it
//! denotes (so `1.0` and `1`, `-0.0` and `0`, and integers beyond 2^53 and their rounding
//! compare equal, and nothing else does); canonicalizing the re-parsed value gives the same bytes
//! (the canonical form is a fixed point); the form is also what re-serializing and re-parsing
//! through `serde_json` gives; and `for_tool_call`, plain and secret-keyed, gives the same key
//! for the value and its re-parse.

#![no_main]

use idempotent_retry::{DerivationSecret, IdempotencyKey, canonical};
use libfuzzer_sys::fuzz_target;
use serde_json::{Number, Value};

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let text = canonical::to_string(&value);
    let reparsed: Value = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("canonical form does not parse ({error}): {text}"));
    assert!(
        same_doubles(&value, &reparsed),
        "canonical form changed the value: {text}"
    );
    assert_eq!(canonical::to_string(&reparsed), text, "not a fixed point");

    // serde_json's own output for the value is another spelling of it.
    let plain = serde_json::to_string(&value).expect("a Value serializes");
    let plain: Value = serde_json::from_str(&plain).expect("serde_json reads its own output");
    assert_eq!(canonical::to_string(&plain), text);

    assert_eq!(
        IdempotencyKey::for_tool_call("fuzz.tool", &value),
        IdempotencyKey::for_tool_call("fuzz.tool", &reparsed)
    );
    let secret = DerivationSecret::new([0x5a; 32]).expect("32 bytes is long enough");
    assert_eq!(
        secret.for_tool_call("fuzz.tool", &value),
        secret.for_tool_call("fuzz.tool", &reparsed)
    );
});

/// Structural equality with numbers compared as doubles (`-0.0 == 0.0`, as IEEE-754 says).
/// Iterative, so deep values cannot overflow the stack.
fn same_doubles(left: &Value, right: &Value) -> bool {
    let mut pending = vec![(left, right)];
    while let Some(pair) = pending.pop() {
        match pair {
            (Value::Null, Value::Null) => {}
            (Value::Bool(a), Value::Bool(b)) if a == b => {}
            (Value::String(a), Value::String(b)) if a == b => {}
            (Value::Number(a), Value::Number(b)) if double(a) == double(b) => {}
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                pending.extend(a.iter().zip(b));
            }
            (Value::Object(a), Value::Object(b)) if a.len() == b.len() => {
                for (name, member) in a {
                    match b.get(name) {
                        Some(other) => pending.push((member, other)),
                        None => return false,
                    }
                }
            }
            _ => return false,
        }
    }
    true
}

/// The double a number denotes; integers round to the nearest one.
fn double(number: &Number) -> f64 {
    let double = number.as_f64().expect("serde_json numbers are finite");
    assert!(double.is_finite(), "non-finite number {number}");
    double
}
