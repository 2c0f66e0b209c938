//! Key validation: arbitrary bytes through every way a key is built.
//!
//! Checked: `IdempotencyKey::new`, `FromStr`, both `TryFrom`s and serde accept a string iff it is
//! 1..=255 bytes of visible ASCII (0x21..=0x7E), and agree with each other; a refusal names the
//! right reason (empty, too long, or the first bad byte and its index) and its message does not
//! repeat the key; an accepted key comes back unchanged through its header value, `Display`,
//! `as_str`, `into_string` and a serde round trip. Non-UTF-8 input is tried as a header value
//! and through a lossy conversion.

#![no_main]

use std::str::FromStr;

use http::HeaderValue;
use idempotent_retry::{IdempotencyKey, InvalidKeyReason};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(text) => check_text(text),
        Err(_) => check_text(&String::from_utf8_lossy(data)),
    }

    // Bytes set directly as a header value: a key only if they are visible ASCII.
    if let Ok(value) = HeaderValue::from_bytes(data)
        && let Ok(text) = value.to_str()
    {
        assert_eq!(IdempotencyKey::new(text).is_ok(), is_valid(text.as_bytes()));
    }

    // The raw bytes as a JSON document: whatever deserializes as a key is a valid one, and is
    // exactly the string the document holds.
    if let Ok(key) = serde_json::from_slice::<IdempotencyKey>(data) {
        assert!(is_valid(key.as_str().as_bytes()), "serde admitted {key:?}");
        let text: String = serde_json::from_slice(data).expect("a key deserializes as a string");
        assert_eq!(key.as_str(), text);
    }
});

fn is_valid(bytes: &[u8]) -> bool {
    (1..=255).contains(&bytes.len()) && bytes.iter().all(|byte| (0x21..=0x7e).contains(byte))
}

fn expected_reason(bytes: &[u8]) -> InvalidKeyReason {
    if bytes.is_empty() {
        return InvalidKeyReason::Empty;
    }
    if bytes.len() > 255 {
        return InvalidKeyReason::TooLong { len: bytes.len() };
    }
    let index = bytes
        .iter()
        .position(|byte| !(0x21..=0x7e).contains(byte))
        .expect("an invalid key of valid length has a bad byte");
    InvalidKeyReason::InvalidByte {
        byte: bytes[index],
        index,
    }
}

fn check_text(text: &str) {
    let valid = is_valid(text.as_bytes());
    let new = IdempotencyKey::new(text);
    assert_eq!(IdempotencyKey::from_str(text), new);
    assert_eq!(IdempotencyKey::try_from(text), new);
    assert_eq!(IdempotencyKey::try_from(text.to_owned()), new);
    let from_json = serde_json::from_value::<IdempotencyKey>(serde_json::Value::from(text));
    assert_eq!(
        from_json.is_ok(),
        valid,
        "serde and the rule disagree on {text:?}"
    );

    match new {
        Ok(key) => {
            assert!(valid, "accepted {text:?}");
            assert_eq!(key.as_str(), text);
            let displayed = key.to_string();
            assert_eq!(displayed, text);
            assert_eq!(key.to_header_value().as_bytes(), text.as_bytes());
            assert_eq!(key.to_header_value().to_str().ok(), Some(text));
            let json = serde_json::to_string(&key).expect("a key serializes");
            assert_eq!(
                json,
                serde_json::to_string(text).expect("a string serializes")
            );
            let back: IdempotencyKey = serde_json::from_str(&json).expect("a key deserializes");
            assert_eq!(back, key);
            assert_eq!(from_json.ok(), Some(key.clone()));
            assert_eq!(IdempotencyKey::from_str(&displayed), Ok(key.clone()));
            assert_eq!(key.into_string(), text);
        }
        Err(error) => {
            assert!(!valid, "refused {text:?}: {error}");
            assert_eq!(error.reason(), expected_reason(text.as_bytes()));
            let message = error.to_string();
            assert!(message.is_ascii() && !message.is_empty());
            if text.len() > message.len() / 2 {
                assert!(!message.contains(text), "the error repeats the key");
            }
        }
    }
}
