//! The public RFC 8785 test vectors from cyberphone/json-canonicalization (see
//! `tests/data/jcs/README.md`): every input, parsed with `serde_json` and canonicalized, must equal
//! its expected output byte for byte.
//!
//! `serde_json` (without `preserve_order`) keeps object members in a `BTreeMap`, sorted by UTF-8
//! bytes; `canonical_json` re-sorts them by UTF-16 code units, which the `weird` vectors check.
//!
//! The `values` vectors hold `333333333.33333329`. Without its `float_roundtrip` feature,
//! `serde_json`'s float parser is not correctly rounded and reads that as the double
//! 333333333.33333325 instead of 333333333.3333333 (the nearest one). The crate enables the
//! feature, so JSON text parses to the same doubles whatever else is in a build, and keys from
//! `for_tool_call` do not depend on it; `serde_json_parses_decimals_exactly` guards that.

use std::fs;
use std::path::{Path, PathBuf};

use idempotent_retry::canonical;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jcs")
}

fn vector_names() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(data_dir().join("input"))
        .expect("tests/data/jcs/input is readable")
        .map(|entry| entry.expect("directory entry").file_name())
        .filter_map(|name| name.to_str()?.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The number `serde_json` misreads without `float_roundtrip`, and its nearest double.
const MISREAD_INPUT: &str = "333333333.33333329";
const NEAREST: &str = "333333333.3333333";

/// Whether `serde_json` rounds decimal input to the nearest double (its `float_roundtrip` feature).
fn parser_is_correctly_rounded() -> bool {
    serde_json::from_str::<f64>(MISREAD_INPUT).ok() == MISREAD_INPUT.parse::<f64>().ok()
}

fn check(name: &str) {
    let dir = data_dir();
    let input = fs::read_to_string(dir.join("input").join(format!("{name}.json")))
        .unwrap_or_else(|error| panic!("{name}: input: {error}"));
    let expected = fs::read_to_string(dir.join("output").join(format!("{name}.json")))
        .unwrap_or_else(|error| panic!("{name}: expected output: {error}"));
    let value: serde_json::Value =
        serde_json::from_str(&input).unwrap_or_else(|error| panic!("{name}: parse: {error}"));
    let actual = canonical::to_string(&value);
    assert!(
        actual == expected,
        "{name}:\n  actual:   {actual:?}\n  expected: {expected:?}"
    );
}

#[test]
fn every_vector_matches_byte_for_byte() {
    let names = vector_names();
    assert!(
        names.len() >= 12,
        "expected the vector files, found {names:?}"
    );
    for name in &names {
        check(name);
    }
}

#[test]
fn weird_needs_utf16_member_order() {
    // The current upstream `weird` vector, whose expected output differs from serde_json's
    // own (UTF-8 byte) member order.
    check("weird");
    check("weird-77917fb");
    let input = fs::read_to_string(data_dir().join("input/weird.json")).expect("weird input");
    let value: serde_json::Value = serde_json::from_str(&input).expect("weird parses");
    let utf8_order = serde_json::to_string(&value).expect("serializes");
    assert_ne!(canonical::to_string(&value), utf8_order);
}

#[test]
fn canonical_output_is_a_fixed_point() {
    for name in vector_names() {
        let expected = fs::read_to_string(data_dir().join("output").join(format!("{name}.json")))
            .expect("expected output");
        let value: serde_json::Value = serde_json::from_str(&expected).expect("output parses");
        assert_eq!(canonical::to_string(&value), expected, "{name}");
    }
}

#[test]
fn serde_json_parses_decimals_exactly() {
    assert!(
        parser_is_correctly_rounded(),
        "serde_json's float_roundtrip feature must be on"
    );
}

#[test]
fn correctly_rounded_value_prints_as_upstream_expects() {
    let nearest: f64 = MISREAD_INPUT.parse().expect("std parses exactly");
    assert_eq!(
        canonical::to_string(&serde_json::Value::from(nearest)),
        NEAREST
    );
}

#[test]
fn each_vector_by_name() {
    for name in [
        "arrays",
        "french",
        "structures",
        "unicode",
        "values",
        "weird",
        "french-b01b023",
        "simpleString-987e82e",
        "structures-72a2163",
        "unicode-ff22567",
        "values-1e2733f",
        "weird-77917fb",
    ] {
        check(name);
    }
}
