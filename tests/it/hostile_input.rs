//! Hostile input from callers: every way a key enters the crate, derivations with huge, empty
//! and deeply nested inputs, and settings at zero and at their largest.
//!
//! Whatever a caller passes, the crate answers with a typed error before anything is sent, or
//! with a documented behaviour; never a panic, an arithmetic overflow, or a key header on the
//! wire that differs from the one the caller asked for. Keys and settings are sent through the
//! real front ends to a loopback server, which records what arrives.

use std::collections::HashSet;
use std::error::Error as _;
use std::future::Future;
use std::time::Duration;

use crate::support::*;
use http::{HeaderMap, HeaderName, HeaderValue};
use idempotent_retry::ledger::{LeaseHeldPolicy, LedgerOptions, MemoryLedger};
use idempotent_retry::time::{Sleeper, TokioSleeper};
use idempotent_retry::{
    Client, ClientBuilder, DerivationSecret, Error, ErrorKind, IdempotencyKey, InvalidKey,
    InvalidKeyReason, RetryBudget, RetryBudgetConfig, RetryPolicy, RetryReport, canonical,
};
use idempotent_retry_testkit::RecordingSleeper;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Every test runs under this bound, so a bug that hangs fails instead.
const BOUND: Duration = Duration::from_secs(60);

async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("the test finished within its bound")
}

/// The reason inside an `ErrorKind::InvalidKey` error.
fn key_reason(err: &Error) -> InvalidKeyReason {
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    err.source()
        .and_then(|source| source.downcast_ref::<InvalidKey>())
        .map(InvalidKey::reason)
        .expect("an InvalidKey error has the reason as its source")
}

/// An error raised before anything was sent: no attempt, no key, outcome known.
fn assert_refused_up_front(err: &Error) {
    assert_eq!(err.attempts(), 0, "{err}");
    assert!(!err.is_outcome_unknown(), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Keys through the constructors.

/// `ab?c` with `?` the byte `byte`; for a byte of 0x80 or more, the character U+00xx, whose
/// UTF-8 encoding starts with 0xC2 or 0xC3.
fn text_with(byte: u8) -> (String, u8) {
    let text = format!("ab{}c", char::from(byte));
    let first = text.as_bytes()[2];
    (text, first)
}

#[test]
fn every_byte_through_every_constructor() {
    for byte in 0u8..=255 {
        let (text, first) = text_with(byte);
        let visible = (0x21..=0x7e).contains(&byte);
        let expected = InvalidKeyReason::InvalidByte {
            byte: first,
            index: 2,
        };
        let results: [(&str, Result<IdempotencyKey, InvalidKeyReason>); 5] = [
            (
                "new",
                IdempotencyKey::new(text.as_str()).map_err(|e| e.reason()),
            ),
            (
                "from_str",
                text.parse::<IdempotencyKey>().map_err(|e| e.reason()),
            ),
            (
                "try_from &str",
                IdempotencyKey::try_from(text.as_str()).map_err(|e| e.reason()),
            ),
            (
                "try_from String",
                IdempotencyKey::try_from(text.clone()).map_err(|e| e.reason()),
            ),
            (
                "serde",
                serde_json::from_value::<IdempotencyKey>(Value::String(text.clone()))
                    .map_err(|_| expected),
            ),
        ];
        for (door, result) in results {
            if visible {
                assert_eq!(
                    result.map(IdempotencyKey::into_string).as_deref(),
                    Ok(text.as_str()),
                    "{door} {byte:#04x}"
                );
            } else {
                assert_eq!(result, Err(expected), "{door} {byte:#04x}");
            }
        }
        // JSON text with the byte escaped (`\u00XX`) reaches the same check.
        let escaped = format!("\"ab\\u{:04x}c\"", u32::from(byte));
        let parsed = serde_json::from_str::<IdempotencyKey>(&escaped);
        assert_eq!(parsed.is_ok(), visible, "serde text {escaped}");
        if let Err(error) = parsed {
            assert!(
                error
                    .to_string()
                    .contains(&format!("byte {first:#04x} at index 2")),
                "{error}"
            );
        }
    }
}

#[test]
fn lengths_and_invalid_utf8_through_every_constructor() {
    let max = "k".repeat(255);
    let over = "k".repeat(256);
    assert_eq!(
        IdempotencyKey::new(max.as_str()).map(|k| k.as_str().len()),
        Ok(255)
    );
    for (text, reason) in [
        ("", InvalidKeyReason::Empty),
        (over.as_str(), InvalidKeyReason::TooLong { len: 256 }),
    ] {
        assert_eq!(
            IdempotencyKey::new(text).map_err(|e| e.reason()),
            Err(reason)
        );
        assert_eq!(
            text.parse::<IdempotencyKey>().map_err(|e| e.reason()),
            Err(reason)
        );
        assert!(serde_json::from_value::<IdempotencyKey>(json!(text)).is_err());
    }
    assert_eq!(
        serde_json::from_value::<IdempotencyKey>(json!(max))
            .map(|k| k.as_str().len())
            .ok(),
        Some(255)
    );
    // Bytes that are not UTF-8 never reach the key type: the JSON parser refuses them.
    for raw in [&b"\"ab\x80c\""[..], b"\"\xff\xfe\"", b"\"ab\xc3\""] {
        assert!(serde_json::from_slice::<IdempotencyKey>(raw).is_err());
    }
    // A lone surrogate escape is not a Rust string either.
    assert!(serde_json::from_str::<IdempotencyKey>(r#""ab\ud800c""#).is_err());
    // A megabyte of key is refused on its length, without a scan, and not echoed.
    let huge = "\u{7f}".repeat(1 << 20);
    let error = IdempotencyKey::new(huge).expect_err("too long");
    assert_eq!(error.reason(), InvalidKeyReason::TooLong { len: 1 << 20 });
    assert!(error.to_string().len() < 100);
}

// ---------------------------------------------------------------------------------------------
// Keys through the front ends, on a loopback server.

/// A way a caller can hand the crate a key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    /// `RequestBuilder::header` on the `Client`.
    ClientHeader,
    /// `RequestBuilder::headers` on the `Client`.
    ClientHeaders,
    /// `RequestBuilder::header` on a `Client` with a ledger (the key is settled before the claim).
    LedgeredClient,
    /// An `http::Request` through the tower layer over a hyper client.
    #[cfg(feature = "tower")]
    TowerHyper,
    /// A `reqwest::Request` through the tower layer over `reqwest::Client`.
    #[cfg(feature = "tower")]
    TowerReqwest,
    /// `reqwest_middleware::RequestBuilder::header` through the middleware.
    #[cfg(feature = "middleware")]
    Middleware,
}

const DOORS: &[Door] = &[
    Door::ClientHeader,
    Door::ClientHeaders,
    Door::LedgeredClient,
    #[cfg(feature = "tower")]
    Door::TowerHyper,
    #[cfg(feature = "tower")]
    Door::TowerReqwest,
    #[cfg(feature = "middleware")]
    Door::Middleware,
];

fn settings() -> ClientBuilder {
    Client::builder().policy(fast())
}

/// A front end built once for one key header name, so each send reuses its connection pool.
// A handful are built per test; their size does not matter.
#[allow(clippy::large_enum_variant)]
enum Front {
    Client(Client, bool),
    #[cfg(feature = "tower")]
    TowerHyper(
        idempotent_retry::IdempotentRetry<
            hyper_util::client::legacy::Client<
                hyper_util::client::legacy::connect::HttpConnector,
                String,
            >,
        >,
    ),
    #[cfg(feature = "tower")]
    TowerReqwest(idempotent_retry::IdempotentRetry<reqwest::Client>),
    #[cfg(feature = "middleware")]
    Middleware(reqwest_middleware::ClientWithMiddleware),
}

impl Front {
    fn new(door: Door, name: &HeaderName) -> Front {
        let builder = || settings().key_header(name.clone());
        match door {
            Door::ClientHeader => Front::Client(builder().build().expect("valid"), false),
            Door::ClientHeaders => Front::Client(builder().build().expect("valid"), true),
            Door::LedgeredClient => Front::Client(
                builder()
                    .ledger(MemoryLedger::new())
                    .build()
                    .expect("valid"),
                false,
            ),
            #[cfg(feature = "tower")]
            Door::TowerHyper => {
                use tower::Layer;
                let hyper = hyper_util::client::legacy::Client::builder(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .build_http::<String>();
                Front::TowerHyper(builder().build_layer().expect("valid").layer(hyper))
            }
            #[cfg(feature = "tower")]
            Door::TowerReqwest => {
                use tower::Layer;
                Front::TowerReqwest(
                    builder()
                        .build_layer()
                        .expect("valid")
                        .layer(reqwest::Client::new()),
                )
            }
            #[cfg(feature = "middleware")]
            Door::Middleware => Front::Middleware(
                reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                    .with(builder().build_middleware().expect("valid"))
                    .build(),
            ),
        }
    }

    /// Sends one `POST` with `value` in header `name`; `Ok(status)` on a response.
    async fn send(&self, url: &str, name: &HeaderName, value: HeaderValue) -> Result<u16, Error> {
        match self {
            Front::Client(client, false) => {
                let response = client
                    .post(url)
                    .body("x")
                    .header(name, value)
                    .send()
                    .await?;
                Ok(response.status().as_u16())
            }
            Front::Client(client, true) => {
                let mut headers = HeaderMap::new();
                headers.insert(name.clone(), value);
                let response = client.post(url).body("x").headers(headers).send().await?;
                Ok(response.status().as_u16())
            }
            #[cfg(feature = "tower")]
            Front::TowerHyper(service) => {
                use tower::ServiceExt;
                let mut request = http::Request::post(url)
                    .body(String::from("x"))
                    .expect("valid request in test");
                request.headers_mut().insert(name.clone(), value);
                let response = service.clone().oneshot(request).await?;
                Ok(response.status().as_u16())
            }
            #[cfg(feature = "tower")]
            Front::TowerReqwest(service) => {
                use tower::ServiceExt;
                let mut request =
                    reqwest::Request::new(http::Method::POST, url.parse().expect("valid url"));
                *request.body_mut() = Some(reqwest::Body::from("x"));
                request.headers_mut().insert(name.clone(), value);
                let response = service.clone().oneshot(request).await?;
                Ok(response.status().as_u16())
            }
            #[cfg(feature = "middleware")]
            Front::Middleware(client) => {
                match client.post(url).body("x").header(name, value).send().await {
                    Ok(response) => Ok(response.status().as_u16()),
                    Err(reqwest_middleware::Error::Middleware(inner)) => {
                        Err(inner.downcast::<Error>().expect("the crate's error"))
                    }
                    Err(other) => panic!("the middleware's error is not the crate's: {other}"),
                }
            }
        }
    }
}

/// The key header values a caller can build with `HeaderValue::from_bytes`, with what the
/// crate must do with each: `None` to send it verbatim, `Some(reason)` to refuse it.
fn hostile_header_values() -> Vec<(Vec<u8>, Option<InvalidKeyReason>)> {
    let mut values = Vec::new();
    for byte in 0u8..=255 {
        let bytes = vec![b'a', b'b', byte, b'c'];
        if HeaderValue::from_bytes(&bytes).is_err() {
            // The `http` crate itself refuses every control byte but tab, and DEL: no caller
            // can put them in a `HeaderValue`, so they never reach the crate this way.
            assert!(
                byte < 0x20 && byte != b'\t' || byte == 0x7f,
                "HeaderValue refused {byte:#04x}"
            );
            continue;
        }
        let outcome = if (0x21..=0x7e).contains(&byte) {
            None
        } else {
            // Tab, space and obs-text (0x80 and up, not UTF-8 on its own).
            Some(InvalidKeyReason::InvalidByte { byte, index: 2 })
        };
        values.push((bytes, outcome));
    }
    values.push((Vec::new(), Some(InvalidKeyReason::Empty)));
    values.push((vec![b'k'; 255], None));
    values.push((
        vec![b'k'; 256],
        Some(InvalidKeyReason::TooLong { len: 256 }),
    ));
    values.push((
        b" padded".to_vec(),
        Some(InvalidKeyReason::InvalidByte {
            byte: b' ',
            index: 0,
        }),
    ));
    values.push((
        b"padded\t".to_vec(),
        Some(InvalidKeyReason::InvalidByte {
            byte: b'\t',
            index: 6,
        }),
    ));
    // UTF-8 text: refused on its first byte.
    values.push((
        "caf\u{e9}".as_bytes().to_vec(),
        Some(InvalidKeyReason::InvalidByte {
            byte: 0xc3,
            index: 3,
        }),
    ));
    values
}

async fn every_header_value_through(door: Door, name: HeaderName) {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let url = server.url("/");
    let front = Front::new(door, &name);
    let mut sent = Vec::new();
    for (bytes, outcome) in hostile_header_values() {
        let value = HeaderValue::from_bytes(&bytes).expect("buildable value");
        let result = front.send(&url, &name, value).await;
        match (outcome, result) {
            (None, Ok(status)) => {
                assert_eq!(status, 200, "{door:?} {bytes:?}");
                sent.push(Some(
                    String::from_utf8(bytes.clone()).expect("visible ASCII"),
                ));
            }
            (Some(reason), Err(err)) => {
                assert_eq!(key_reason(&err), reason, "{door:?} {bytes:?}");
                assert_refused_up_front(&err);
                assert_eq!(err.idempotency_key(), None);
            }
            (outcome, result) => {
                panic!("{door:?} {bytes:?}: expected {outcome:?}, got {result:?}")
            }
        }
        // Requests go one at a time, so the server has already read every one that was sent:
        // exactly the valid keys arrived, byte for byte, in order.
        assert_eq!(server.keys_in(name.as_str()), sent, "{door:?} {bytes:?}");
    }
    assert_eq!(
        sent.len(),
        94 + 1,
        "every visible ASCII byte and the 255-byte key"
    );
}

#[tokio::test]
async fn every_key_header_value_through_every_door() {
    bounded(async {
        for &door in DOORS {
            every_header_value_through(door, HeaderName::from_static("idempotency-key")).await;
        }
    })
    .await;
}

#[tokio::test]
async fn a_custom_key_header_is_checked_the_same_way() {
    bounded(async {
        let name = HeaderName::from_static("x-request-key");
        every_header_value_through(Door::ClientHeader, name.clone()).await;
        #[cfg(feature = "tower")]
        every_header_value_through(Door::TowerHyper, name.clone()).await;
        #[cfg(feature = "middleware")]
        every_header_value_through(Door::Middleware, name).await;
    })
    .await;
}

#[tokio::test]
async fn control_bytes_given_as_text_are_refused_before_sending() {
    bounded(async {
        let server = TestServer::start(vec![], Action::ok("")).await;
        let client = settings().build().expect("valid");
        for byte in (0u8..0x20).filter(|&b| b != b'\t').chain([0x7f]) {
            let text = format!("ab{}c", char::from(byte));
            // `http` refuses the value when the header is added; the crate reports it at
            // `send` as a builder error, before any attempt.
            let err = client
                .post(server.url("/"))
                .header("idempotency-key", text.as_str())
                .send()
                .await
                .expect_err("an invalid header value");
            assert_eq!(err.kind(), ErrorKind::Builder, "{byte:#04x}");
            assert_refused_up_front(&err);
            // CR LF cannot smuggle a second header in either.
            let injected = format!("ok{}X-Injected: 1", char::from(byte));
            let err = client
                .post(server.url("/"))
                .header("idempotency-key", injected.as_str())
                .send()
                .await
                .expect_err("an invalid header value");
            assert_eq!(err.kind(), ErrorKind::Builder, "{byte:#04x}");
        }
        assert_eq!(server.hits(), 0);
    })
    .await;
}

#[tokio::test]
async fn a_caller_key_header_is_sent_exactly_as_given_and_a_second_one_refused() {
    bounded(async {
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        let client = settings().build().expect("valid");
        let mut value = HeaderValue::from_static("caller-key-7");
        value.set_sensitive(true);
        let response = client
            .post(server.url("/"))
            .header("idempotency-key", value)
            .idempotency_key(IdempotencyKey::new("caller-key-7").expect("valid"))
            .send()
            .await
            .expect("the retry succeeds");
        let report = RetryReport::of(&response).expect("report");
        assert_eq!(
            report.idempotency_key().map(IdempotencyKey::as_str),
            Some("caller-key-7")
        );
        assert_eq!(
            server.keys(),
            vec![
                Some("caller-key-7".to_owned()),
                Some("caller-key-7".to_owned())
            ]
        );

        let mut headers = HeaderMap::new();
        headers.append("idempotency-key", HeaderValue::from_static("one"));
        headers.append("idempotency-key", HeaderValue::from_static("one"));
        let err = client
            .post(server.url("/"))
            .headers(headers)
            .send()
            .await
            .expect_err("two key headers, even equal ones");
        assert_eq!(err.kind(), ErrorKind::Builder);
        assert_refused_up_front(&err);
        assert_eq!(server.hits(), 2);
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// `derive` with huge, empty and many parts.

// Expected keys in this section were computed independently of this crate, with Python's
// `hashlib.sha256` (and `hmac` for the keyed ones) over the documented encoding:
// tag + u64be(len(scope)) + scope + u64be(number of parts) + (u64be(len(part)) + part)...

const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

#[test]
fn empty_scope_and_parts_are_distinct_and_pinned() {
    let cases: [(&[&str], &str); 3] = [
        (
            &[],
            "f704f87c0be523a3cdbee3a9b5cc68f50e842adf16de8987e5494d0e65722a94",
        ),
        (
            &[""],
            "ef688f0c3d8b083f0e7a04cafa44544e4cd4d4ad44961c9221c6a6ed99945b9b",
        ),
        (
            &["", ""],
            "cb30b39d69dfb9d1ba58140de0d89b8d037c62ee43324a5c1b42d15dd39b5b8e",
        ),
    ];
    for (parts, expected) in cases {
        assert_eq!(
            IdempotencyKey::derive("", parts).as_str(),
            expected,
            "{parts:?}"
        );
    }
    // Everything a plain concatenation would confuse stays apart, keyed or not.
    let secret = DerivationSecret::new(SECRET).expect("32 bytes");
    let inputs: [(&str, &[&str]); 7] = [
        ("", &[]),
        ("", &[""]),
        ("", &["", ""]),
        ("", &["", "", ""]),
        ("a", &[]),
        ("", &["a"]),
        ("a", &[""]),
    ];
    let plain: HashSet<_> = inputs
        .iter()
        .map(|(s, p)| IdempotencyKey::derive(s, p))
        .collect();
    let keyed: HashSet<_> = inputs.iter().map(|(s, p)| secret.derive(s, p)).collect();
    assert_eq!(plain.len(), inputs.len());
    assert_eq!(keyed.len(), inputs.len());
    assert!(plain.is_disjoint(&keyed));
}

#[test]
fn a_twenty_megabyte_part_is_hashed_whole() {
    let big = "a".repeat(20 * 1024 * 1024);
    assert_eq!(
        IdempotencyKey::derive("s", &[big.as_str()]).as_str(),
        "b14b99468511905fa4df3a285cbe57104d0acc892e9f487705fd6151d023f399"
    );
    let secret = DerivationSecret::new(SECRET).expect("32 bytes");
    assert_eq!(
        secret.derive("s", &[big.as_str()]).as_str(),
        "8a5b8a97564364fb9c76e9dccf862abb74a7e5b99a03870e73e1e58f5201c4a3"
    );
    // The same bytes as scope, or split in two parts, give other keys.
    let (head, tail) = big.split_at(big.len() / 2);
    assert_ne!(
        IdempotencyKey::derive("s", &[head, tail]),
        IdempotencyKey::derive("s", &[big.as_str()])
    );
    assert_ne!(
        IdempotencyKey::derive(&big, &[]),
        IdempotencyKey::derive("", &[big.as_str()])
    );
}

#[test]
fn a_hundred_thousand_parts() {
    let owned: Vec<String> = (0..100_000).map(|i| i.to_string()).collect();
    let parts: Vec<&str> = owned.iter().map(String::as_str).collect();
    assert_eq!(
        IdempotencyKey::derive("m", &parts).as_str(),
        "6e43d84111b01f74cac64d4543959f228abf99557c2519833abc02c1d318ce58"
    );
    let secret = DerivationSecret::new(SECRET).expect("32 bytes");
    assert_eq!(
        secret.derive("m", &parts).as_str(),
        "5a4642126d0b133b76f76c65695f0839a7abd7dc3228e2dfc94b8f44256c9295"
    );
    // 100 000 empty parts differ from 99 999.
    let empties = vec![""; 100_000];
    assert_ne!(
        IdempotencyKey::derive("m", &empties),
        IdempotencyKey::derive("m", &empties[1..])
    );
}

// ---------------------------------------------------------------------------------------------
// `for_tool_call` with deep nesting, huge numbers and all of Unicode.

const DEEP: usize = 100_000;

/// The documented encoding of `for_tool_call`, hashed here without the crate's key code.
fn expected_tool_key(tool: &str, canonical: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"idempotent-retry:tool-call:v1");
    hasher.update((tool.len() as u64).to_be_bytes());
    hasher.update(tool.as_bytes());
    hasher.update((canonical.len() as u64).to_be_bytes());
    hasher.update(canonical.as_bytes());
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Drops `value` without recursion: `serde_json::Value`'s own drop recurses once per level
/// and would overflow this thread's stack on a 100 000-deep value.
fn dismantle(value: Value) {
    let mut pending = vec![value];
    while let Some(mut value) = pending.pop() {
        match &mut value {
            Value::Array(items) => pending.append(items),
            Value::Object(map) => pending.extend(std::mem::take(map).into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
}

/// Runs `f` on a thread with a 256 KiB stack: a walk that recursed once per level of a
/// 100 000-deep value would need megabytes, so finishing there proves the walk is iterative.
fn on_a_small_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn_scoped(scope, f)
            .expect("thread spawns")
            .join()
            .expect("no stack overflow or panic")
    })
}

#[test]
fn a_hundred_thousand_nested_arrays() {
    let mut value = Value::Null;
    for _ in 0..DEEP {
        value = Value::Array(vec![value]);
    }
    let secret = DerivationSecret::new(SECRET).expect("32 bytes");
    let (key, keyed, canonical) = on_a_small_stack(|| {
        (
            IdempotencyKey::for_tool_call("deep", &value),
            secret.for_tool_call("deep", &value),
            canonical::to_string(&value),
        )
    });
    dismantle(value);
    let expected = format!("{}null{}", "[".repeat(DEEP), "]".repeat(DEEP));
    assert!(canonical == expected, "canonical form of the deep array");
    assert_eq!(key.as_str(), expected_tool_key("deep", &expected));
    assert_eq!(keyed.as_str().len(), 64);
    assert_ne!(keyed, key);
}

#[test]
fn a_hundred_thousand_nested_objects() {
    let mut value = json!("leaf");
    for level in 0..DEEP {
        let mut map = Map::new();
        map.insert("z\u{0}\"".to_owned(), Value::from(level));
        map.insert("a".to_owned(), value);
        value = Value::Object(map);
    }
    let (key, canonical) = on_a_small_stack(|| {
        (
            IdempotencyKey::for_tool_call("deep", &value),
            canonical::to_string(&value),
        )
    });
    dismantle(value);
    let mut expected = "{\"a\":".repeat(DEEP);
    expected.push_str("\"leaf\"");
    for level in 0..DEEP {
        // Innermost first: level 0 is the innermost object.
        expected.push_str(&format!(",\"z\\u0000\\\"\":{level}}}"));
    }
    assert!(canonical == expected, "canonical form of the deep object");
    assert_eq!(key.as_str(), expected_tool_key("deep", &expected));
}

#[test]
fn deep_json_text_is_refused_by_the_parser_before_it_reaches_the_crate() {
    // `serde_json` stops at 128 levels when parsing text, with an error, so arguments parsed
    // from JSON text never get this deep; a value built in code can, and is handled above.
    let text = format!("{}{}", "[".repeat(DEEP), "]".repeat(DEEP));
    let error = serde_json::from_str::<Value>(&text).expect_err("too deep");
    assert!(error.to_string().contains("recursion limit"), "{error}");
}

/// Parses `text`, checks the canonical form re-parses to the same doubles and is a fixed point,
/// and returns the canonical form and the key.
fn canonical_round_trip(text: &str) -> (String, IdempotencyKey) {
    let value: Value = serde_json::from_str(text).expect("valid JSON in test");
    let canonical = canonical::to_string(&value);
    let reparsed: Value = serde_json::from_str(&canonical)
        .unwrap_or_else(|error| panic!("{text}: canonical {canonical} does not parse: {error}"));
    assert_eq!(
        canonical::to_string(&reparsed),
        canonical,
        "{text}: not a fixed point"
    );
    if let (Some(a), Some(b)) = (value.as_f64(), reparsed.as_f64()) {
        assert_eq!(a, b, "{text}: the double changed");
    }
    let key = IdempotencyKey::for_tool_call("n", &value);
    assert_eq!(key.as_str(), expected_tool_key("n", &canonical));
    (canonical, key)
}

#[test]
fn huge_and_tiny_numbers() {
    for (text, canonical) in [
        ("1e308", "1e+308"),
        ("-1e308", "-1e+308"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("18446744073709551615", "18446744073709552000"),
        ("-9223372036854775808", "-9223372036854776000"),
        ("5e-324", "5e-324"),
        ("-5e-324", "-5e-324"),
        // Beyond u64 and i64: serde_json reads these as doubles.
        ("18446744073709551616", "18446744073709552000"),
        ("-9223372036854775809", "-9223372036854776000"),
        ("123456789012345678901234567890", "1.2345678901234568e+29"),
        // Below the smallest subnormal: rounds to zero.
        ("1e-400", "0"),
        ("-0.0", "0"),
    ] {
        assert_eq!(canonical_round_trip(text).0, canonical, "{text}");
    }
    // Integers that round to the same double give the same key: send such ids as strings.
    assert_eq!(
        canonical_round_trip("18446744073709551615").1,
        canonical_round_trip("18446744073709551616").1
    );
    assert_ne!(
        canonical_round_trip("\"18446744073709551615\"").1,
        canonical_round_trip("\"18446744073709551616\"").1
    );
    // Out of the double range: the parser refuses it, nothing reaches the crate.
    for text in ["1e309", "-1e400", "1.8e308"] {
        assert!(serde_json::from_str::<Value>(text).is_err(), "{text}");
    }
    // The extremes as values built in code.
    for value in [
        Value::from(u64::MAX),
        Value::from(i64::MIN),
        Value::from(f64::MAX),
        Value::from(f64::MIN),
        Value::from(f64::MIN_POSITIVE),
        Value::from(5e-324),
    ] {
        let canonical = canonical::to_string(&value);
        let reparsed: Value = serde_json::from_str(&canonical).expect("re-parses");
        assert_eq!(reparsed.as_f64(), value.as_f64(), "{canonical}");
    }
    // Non-finite doubles cannot be a JSON number: serde_json turns them into null.
    assert_eq!(Value::from(f64::NAN), Value::Null);
    assert_eq!(Value::from(f64::INFINITY), Value::Null);
}

/// Characters of one Unicode plane: the first, some letters, private-use and noncharacters.
fn plane_chars(plane: u32) -> String {
    let base = plane << 16;
    let mut offsets = vec![0x0000, 0x0041, 0x1234, 0xfffd, 0xfffe, 0xffff];
    if plane == 0 {
        // U+E000 and U+F8FF are private use, U+FDD0..=U+FDEF noncharacters; U+2028 and
        // U+2029 are line terminators JavaScript once choked on; U+7F and U+80 edges.
        // U+0000 is escaped, so it is left to the member names below, which escape C0 controls.
        offsets[0] = 0x20;
        offsets.extend([
            0x7f, 0x80, 0x2028, 0x2029, 0xd7ff, 0xe000, 0xf8ff, 0xfdd0, 0xfdef,
        ]);
    }
    offsets
        .into_iter()
        .filter_map(|offset| char::from_u32(base + offset))
        .collect()
}

#[test]
fn strings_from_every_plane_as_values_and_member_names() {
    let mut keys = HashSet::new();
    for plane in 0..=16 {
        let text = plane_chars(plane);
        let mut map = Map::new();
        map.insert(text.clone(), Value::String(text.clone()));
        map.insert(
            format!("{text}\u{0}\u{1f}\"\\/"),
            json!([text.clone(), null]),
        );
        let value = Value::Object(map);
        let canonical = canonical::to_string(&value);
        let reparsed: Value = serde_json::from_str(&canonical).expect("re-parses");
        assert!(reparsed == value, "plane {plane}: the value changed");
        assert_eq!(canonical::to_string(&reparsed), canonical, "plane {plane}");
        // Only the C0 controls, quote and backslash are escaped; the rest is kept raw.
        assert!(canonical.contains(&text), "plane {plane}");
        assert!(
            canonical.contains("\\u0000\\u001f\\\"\\\\/"),
            "plane {plane}"
        );
        let key = IdempotencyKey::for_tool_call("unicode", &value);
        assert_eq!(key.as_str(), expected_tool_key("unicode", &canonical));
        keys.insert(key);
    }
    assert_eq!(keys.len(), 17, "a key per plane");
}

#[test]
fn every_unicode_scalar_value_in_one_string_and_one_name() {
    let all: String = (0..=0x10_ffff).filter_map(char::from_u32).collect();
    assert_eq!(all.chars().count(), 0x11_0000 - 0x800);
    let mut map = Map::new();
    map.insert(all.clone(), Value::String(all.clone()));
    let value = Value::Object(map);
    let canonical = canonical::to_string(&value);
    let reparsed: Value = serde_json::from_str(&canonical).expect("re-parses");
    assert!(reparsed == value, "every scalar value survives");
    assert_eq!(canonical::to_string(&reparsed), canonical);
    let key = IdempotencyKey::for_tool_call("all", &value);
    assert_eq!(key.as_str(), expected_tool_key("all", &canonical));
    let secret = DerivationSecret::new(SECRET).expect("32 bytes");
    assert_eq!(secret.for_tool_call("all", &value).as_str().len(), 64);
}

#[test]
fn escapes_in_member_names_sort_and_round_trip() {
    let text = r#"{"\u0000":1,"\"":2,"\\":3,"\n":4,"\u001f":5,"\u007f":6,"\u2028":7,"\/":8,"\ud83d\ude00":9,"\ue000":10}"#;
    let (canonical, key) = canonical_round_trip(text);
    assert_eq!(
        canonical,
        "{\"\\u0000\":1,\"\\n\":4,\"\\u001f\":5,\"\\\"\":2,\"/\":8,\"\\\\\":3,\"\u{7f}\":6,\
         \"\u{2028}\":7,\"\u{1f600}\":9,\"\u{e000}\":10}"
    );
    // The same members spelled without escapes give the same key.
    let mut map = Map::new();
    for (name, n) in [
        ("\u{0}", 1),
        ("\"", 2),
        ("\\", 3),
        ("\n", 4),
        ("\u{1f}", 5),
        ("\u{7f}", 6),
        ("\u{2028}", 7),
        ("/", 8),
        ("\u{1f600}", 9),
        ("\u{e000}", 10),
    ] {
        map.insert(name.to_owned(), json!(n));
    }
    assert_eq!(IdempotencyKey::for_tool_call("n", &Value::Object(map)), key);
}

// ---------------------------------------------------------------------------------------------
// Settings at zero and at their largest.

#[test]
fn invalid_policies_are_builder_errors_naming_the_setting() {
    let cases = [
        (RetryPolicy::default().with_max_attempts(0), "max_attempts"),
        (
            RetryPolicy::default()
                .with_base_delay(ms(2))
                .with_max_delay(ms(1)),
            "base_delay",
        ),
        (
            RetryPolicy::default()
                .with_base_delay(Duration::MAX)
                .with_max_delay(ms(1)),
            "base_delay",
        ),
        (
            RetryPolicy::default().with_reconcile_window(Duration::ZERO),
            "reconcile_window",
        ),
        (
            RetryPolicy::default().with_attempt_timeout(Duration::ZERO),
            "attempt_timeout",
        ),
    ];
    for (policy, setting) in cases {
        let err = policy.validate().expect_err("invalid");
        assert_eq!(err.kind(), ErrorKind::Builder);
        assert!(err.to_string().contains(setting), "{err}");
        let err = Client::builder()
            .policy(policy)
            .build()
            .expect_err("invalid");
        assert_eq!(err.kind(), ErrorKind::Builder);
        let err = Client::builder()
            .policy_for_host("example.com", policy)
            .build()
            .expect_err("invalid");
        assert_eq!(err.kind(), ErrorKind::Builder);
        assert!(err.to_string().contains("example.com"), "{err}");
        #[cfg(feature = "tower")]
        assert!(Client::builder().policy(policy).build_layer().is_err());
        #[cfg(feature = "middleware")]
        assert!(Client::builder().policy(policy).build_middleware().is_err());
    }
    // The extremes that make sense are accepted.
    for policy in [
        RetryPolicy::default().with_max_attempts(u32::MAX),
        RetryPolicy::default().with_max_attempts(1),
        RetryPolicy::default()
            .with_base_delay(Duration::ZERO)
            .with_max_delay(Duration::ZERO),
        RetryPolicy::default()
            .with_base_delay(Duration::MAX)
            .with_max_delay(Duration::MAX),
        RetryPolicy::default()
            .with_reconcile_window(Duration::MAX)
            .with_attempt_timeout(Duration::MAX)
            .with_max_retry_after(Duration::MAX),
        RetryPolicy::default()
            .with_reconcile_window(Duration::from_nanos(1))
            .with_attempt_timeout(Duration::from_nanos(1))
            .with_max_retry_after(Duration::ZERO),
    ] {
        assert!(policy.validate().is_ok(), "{policy:?}");
    }
}

#[tokio::test]
async fn invalid_per_request_settings_send_nothing() {
    bounded(async {
        let server = TestServer::start(vec![], Action::ok("")).await;
        let client = settings().build().expect("valid");
        for policy in [
            RetryPolicy::default().with_max_attempts(0),
            RetryPolicy::default()
                .with_base_delay(Duration::MAX)
                .with_max_delay(ms(1)),
            RetryPolicy::default().with_reconcile_window(Duration::ZERO),
            RetryPolicy::default().with_attempt_timeout(Duration::ZERO),
        ] {
            let err = client
                .post(server.url("/"))
                .policy(policy)
                .send()
                .await
                .expect_err("invalid policy");
            assert_eq!(err.kind(), ErrorKind::Builder, "{policy:?}");
            assert_refused_up_front(&err);
            #[cfg(feature = "tower")]
            {
                use tower::{Layer, ServiceExt};
                let service = settings().build_layer().expect("valid").layer(
                    hyper_util::client::legacy::Client::builder(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .build_http::<String>(),
                );
                let mut request = http::Request::post(server.url("/"))
                    .body(String::new())
                    .expect("valid");
                request.extensions_mut().insert(policy);
                let err = service.oneshot(request).await.expect_err("invalid policy");
                assert_eq!(err.kind(), ErrorKind::Builder, "{policy:?}");
            }
            #[cfg(feature = "middleware")]
            {
                let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                    .with(settings().build_middleware().expect("valid"))
                    .build();
                let err = client
                    .post(server.url("/"))
                    .with_extension(policy)
                    .send()
                    .await
                    .expect_err("invalid policy");
                let err = Error::from_middleware(&err).expect("the crate's error");
                assert_eq!(err.kind(), ErrorKind::Builder, "{policy:?}");
            }
        }
        let err = client
            .post(server.url("/"))
            .timeout(Duration::ZERO)
            .send()
            .await
            .expect_err("zero timeout");
        assert_eq!(err.kind(), ErrorKind::Builder);
        assert!(err.to_string().contains("timeout"), "{err}");
        assert_refused_up_front(&err);
        assert_eq!(server.hits(), 0, "nothing was sent");
    })
    .await;
}

#[tokio::test]
async fn u32_max_attempts_retries_until_success() {
    bounded(async {
        let server = TestServer::start(
            vec![Action::status(503), Action::status(500), Action::Reset],
            Action::ok("done"),
        )
        .await;
        let client = settings()
            .policy(fast().with_max_attempts(u32::MAX))
            .build()
            .expect("valid");
        let response = client
            .post(server.url("/"))
            .body("x")
            .send()
            .await
            .expect("success");
        assert_eq!(response.status(), 200);
        assert_eq!(
            RetryReport::of(&response).map(RetryReport::attempts),
            Some(4)
        );
        let keys = server.keys();
        assert_eq!(keys.len(), 4);
        assert!(
            keys[0].is_some() && keys.iter().all(|k| *k == keys[0]),
            "{keys:?}"
        );
    })
    .await;
}

/// A policy with every duration at `Duration::MAX`.
fn unbounded_policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(u32::MAX)
        .with_base_delay(Duration::MAX)
        .with_max_delay(Duration::MAX)
        .with_reconcile_window(Duration::MAX)
        .with_attempt_timeout(Duration::MAX)
        .with_max_retry_after(Duration::MAX)
}

#[tokio::test]
async fn duration_max_everywhere_runs_without_overflow_on_every_front_end() {
    bounded(async {
        // The waits go through a sleeper that records them and returns at once, so waits of
        // centuries are taken without waiting; the attempts themselves run on real sockets
        // under timers armed with Duration::MAX.
        let server = TestServer::start(vec![], Action::ok("done")).await;
        let script = || {
            vec![
                Action::status(503),
                Action::status_with(503, &[("Retry-After", "99999999999")]),
                Action::status_with(429, &[("retry-after-ms", "18446744073709551615")]),
            ]
        };
        let builder = |sleeper: &RecordingSleeper| {
            Client::builder()
                .policy(unbounded_policy())
                .sleeper(sleeper.clone())
                .rng_seed(3)
                .without_retry_budget()
        };
        let mut sent = 0;

        let scripted = TestServer::start(script(), Action::ok("done")).await;
        let sleeper = RecordingSleeper::instant();
        let client = builder(&sleeper).build().expect("valid");
        let response = client
            .post(scripted.url("/"))
            .body("x")
            .send()
            .await
            .expect("done");
        assert_eq!(response.status(), 200);
        assert_eq!(scripted.hits(), 4);
        assert_unbounded_waits(&sleeper);

        #[cfg(feature = "tower")]
        {
            use tower::{Layer, ServiceExt};
            let scripted = TestServer::start(script(), Action::ok("done")).await;
            let sleeper = RecordingSleeper::instant();
            let service = builder(&sleeper).build_layer().expect("valid").layer(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http::<String>(),
            );
            let request = http::Request::post(scripted.url("/"))
                .body(String::from("x"))
                .expect("valid");
            let response = service.oneshot(request).await.expect("done");
            assert_eq!(response.status(), 200);
            assert_eq!(scripted.hits(), 4);
            assert_unbounded_waits(&sleeper);
        }
        #[cfg(feature = "middleware")]
        {
            let scripted = TestServer::start(script(), Action::ok("done")).await;
            let sleeper = RecordingSleeper::instant();
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(builder(&sleeper).build_middleware().expect("valid"))
                .build();
            let response = client
                .post(scripted.url("/"))
                .body("x")
                .send()
                .await
                .expect("done");
            assert_eq!(response.status(), 200);
            assert_eq!(scripted.hits(), 4);
            assert_unbounded_waits(&sleeper);
        }

        // A per-request timeout of Duration::MAX, on the client's own policy.
        let client = settings().build().expect("valid");
        let response = client
            .post(server.url("/"))
            .timeout(Duration::MAX)
            .send()
            .await
            .expect("done");
        assert_eq!(response.status(), 200);
        sent += 1;
        assert_eq!(server.hits(), sent);
    })
    .await;
}

/// The three waits of the unbounded script: a backoff drawn below 2^64 ns, then the server's
/// two requests (99 999 999 999 s; u64::MAX ms, saturated), each longer than any backoff.
fn assert_unbounded_waits(sleeper: &RecordingSleeper) {
    let delays = sleeper.delays();
    assert_eq!(delays.len(), 3, "{delays:?}");
    assert!(delays[0] <= Duration::from_nanos(u64::MAX), "{delays:?}");
    assert!(
        delays[1] >= Duration::from_secs(99_999_999_999),
        "{delays:?}"
    );
    assert!(delays[2] >= Duration::from_millis(u64::MAX), "{delays:?}");
}

#[tokio::test]
async fn a_backoff_past_the_window_stops_instead_of_sleeping() {
    bounded(async {
        let server = TestServer::start(vec![], Action::status(503)).await;
        let sleeper = RecordingSleeper::instant();
        let client = Client::builder()
            .policy(
                unbounded_policy()
                    .with_reconcile_window(Duration::from_secs(24 * 3600))
                    .with_attempt_timeout(Duration::from_secs(5)),
            )
            .sleeper(sleeper.clone())
            .rng_seed(3)
            .build()
            .expect("valid");
        let err = client
            .post(server.url("/"))
            .send()
            .await
            .expect_err("stops");
        // A wait drawn from up to 584 years ends past a 24 h window (the seed fixes the draw).
        assert_eq!(err.kind(), ErrorKind::ReconcileWindow, "{err}");
        assert_eq!(err.attempts(), 1);
        assert!(err.idempotency_key().is_some());
        assert!(sleeper.delays().is_empty());
        assert_eq!(server.hits(), 1);
    })
    .await;
}

#[tokio::test]
async fn zero_delays_and_a_zero_retry_after_limit() {
    bounded(async {
        let server = TestServer::start(
            vec![
                Action::status(503),
                Action::status_with(503, &[("Retry-After", "0")]),
                Action::status_with(429, &[("Retry-After", "1")]),
            ],
            Action::ok("done"),
        )
        .await;
        let sleeper = RecordingSleeper::instant();
        let client = Client::builder()
            .policy(
                fast()
                    .with_base_delay(Duration::ZERO)
                    .with_max_delay(Duration::ZERO)
                    .with_max_retry_after(Duration::ZERO),
            )
            .sleeper(sleeper.clone())
            .build()
            .expect("valid");
        let err = client
            .post(server.url("/"))
            .send()
            .await
            .expect_err("1 s is too long");
        assert_eq!(err.kind(), ErrorKind::RetryAfterTooLong);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(err.attempts(), 3);
        assert_eq!(sleeper.delays(), vec![Duration::ZERO, Duration::ZERO]);
        assert_eq!(server.hits(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_one_nanosecond_window_ends_with_a_typed_error() {
    bounded(async {
        let server = TestServer::start(vec![], Action::ok("")).await;
        let client = Client::builder()
            .policy(
                RetryPolicy::default()
                    .with_reconcile_window(Duration::from_nanos(1))
                    .with_attempt_timeout(Duration::from_nanos(1)),
            )
            .build()
            .expect("valid");
        let err = client
            .post(server.url("/"))
            .send()
            .await
            .expect_err("no time");
        // Either the window is over before the first attempt starts, or that attempt gets the
        // 1 ns that is left and times out; both report the key.
        assert!(
            matches!(
                err.kind(),
                ErrorKind::ReconcileWindow | ErrorKind::AttemptsExhausted
            ) || err.is_timeout(),
            "{err}"
        );
        assert!(err.idempotency_key().is_some());
        assert!(err.attempts() <= 1);
    })
    .await;
}

#[tokio::test]
async fn the_tokio_sleeper_takes_duration_max() {
    bounded(async {
        let sleep = TokioSleeper::new().sleep(Duration::MAX);
        assert!(
            tokio::time::timeout(ms(20), sleep).await.is_err(),
            "a wait of Duration::MAX is armed (capped far in the future) and does not end"
        );
    })
    .await;
}

#[test]
fn budget_config_extremes() {
    for config in [
        RetryBudgetConfig::new().with_capacity(0),
        RetryBudgetConfig::new().with_retry_cost(0),
        RetryBudgetConfig::new().with_timeout_cost(0),
        RetryBudgetConfig::new().with_success_reward(0),
        RetryBudgetConfig::new().with_capacity(9), // below the timeout cost of 10
        RetryBudgetConfig::new()
            .with_capacity(u32::MAX - 1)
            .with_retry_cost(u32::MAX),
    ] {
        let err = RetryBudget::with_config(config).expect_err("invalid");
        assert_eq!(err.kind(), ErrorKind::Builder, "{config:?}");
    }
    let max = RetryBudgetConfig::new()
        .with_capacity(u32::MAX)
        .with_retry_cost(u32::MAX)
        .with_timeout_cost(u32::MAX)
        .with_success_reward(u32::MAX);
    let budget = RetryBudget::with_config(max).expect("valid");
    assert_eq!(budget.available(), u32::MAX);
    idempotent_retry::internals::budget::record_first_attempt_success(&budget);
    idempotent_retry::internals::budget::record_first_attempt_success(&budget);
    assert_eq!(
        budget.available(),
        u32::MAX,
        "deposits saturate at the capacity"
    );
}

#[tokio::test]
async fn a_budget_at_u32_max_pays_one_retry_then_refills_in_one_success() {
    bounded(async {
        let server = TestServer::start(vec![], Action::status(503)).await;
        let budget = RetryBudget::with_config(
            RetryBudgetConfig::new()
                .with_capacity(u32::MAX)
                .with_retry_cost(u32::MAX)
                .with_timeout_cost(u32::MAX)
                .with_success_reward(u32::MAX),
        )
        .expect("valid");
        let client = settings()
            .retry_budget(budget.clone())
            .build()
            .expect("valid");
        let err = client.post(server.url("/")).send().await.expect_err("503s");
        assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
        assert_eq!(err.attempts(), 2, "the one retry the bucket could pay for");
        assert_eq!(server.hits(), 2);
        assert_eq!(budget.available(), 0);

        let ok = TestServer::start(vec![], Action::ok("")).await;
        client.post(ok.url("/")).send().await.expect("200");
        assert_eq!(budget.available(), u32::MAX);
    })
    .await;
}

/// A client with a memory ledger and these options.
fn ledgered(options: LedgerOptions, policy: RetryPolicy) -> Client {
    Client::builder()
        .policy(policy)
        .ledger(MemoryLedger::new())
        .ledger_options(options)
        .build()
        .expect("valid")
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn far_future_leases_and_retention_are_stored_in_sqlite() {
    bounded(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = idempotent_retry::ledger::SqliteLedger::open(dir.path().join("ops.db"))
            .await
            .expect("opens");
        let client = Client::builder()
            .policy(fast().with_reconcile_window(Duration::MAX))
            .ledger(ledger)
            .ledger_options(
                LedgerOptions::new()
                    .retention(Duration::MAX)
                    .lease(Duration::MAX),
            )
            .build()
            .expect("valid");
        let server = TestServer::start(vec![], Action::ok("stored")).await;
        let key = IdempotencyKey::new("sqlite-max-1").expect("valid");
        let send = || {
            client
                .post(server.url("/"))
                .body("x")
                .idempotency_key(key.clone())
                .send()
        };
        assert_eq!(
            send().await.expect("sent").text().await.expect("body"),
            "stored"
        );
        assert_eq!(client.purge_expired(100).await.expect("purge"), 0);
        let replay = send().await.expect("replayed");
        assert!(RetryReport::of(&replay).is_some_and(RetryReport::is_replayed));
        assert_eq!(replay.text().await.expect("body"), "stored");
        assert_eq!(server.hits(), 1);
    })
    .await;
}

/// Starts a keyed POST of `x` to `/` in its own task and returns once it has reached the
/// server, so a second run with the same key finds the first one's lease.
async fn first_run_in_flight(
    client: &Client,
    server: &TestServer,
    key: &IdempotencyKey,
) -> tokio::task::JoinHandle<Result<reqwest::Response, idempotent_retry::Error>> {
    let first = {
        let client = client.clone();
        let url = server.url("/");
        let key = key.clone();
        tokio::spawn(async move { client.post(url).body("x").idempotency_key(key).send().await })
    };
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(20)).await, 1);
    first
}

#[tokio::test]
async fn ledger_options_at_their_largest_keep_rows_and_leases_forever() {
    bounded(async {
        let server = TestServer::start(
            vec![Action::stall_then(ms(800), Action::ok("first"))],
            Action::ok("again"),
        )
        .await;
        let client = ledgered(
            LedgerOptions::new()
                .retention(Duration::MAX)
                .lease(Duration::MAX)
                .max_body(usize::MAX)
                .on_lease_held(LeaseHeldPolicy::Fail),
            fast().with_reconcile_window(Duration::MAX),
        );
        let key = IdempotencyKey::new("ledger-max-1").expect("valid");
        let first = first_run_in_flight(&client, &server, &key).await;
        // The first run's lease reaches "forever", not the present: a concurrent run with the
        // same key must not take the operation over and send it again.
        let err = client
            .post(server.url("/"))
            .body("x")
            .idempotency_key(key.clone())
            .send()
            .await
            .expect_err("the first run holds the lease");
        assert_eq!(err.kind(), ErrorKind::LeaseHeld, "{err}");
        let response = first.await.expect("task").expect("first run succeeds");
        assert_eq!(response.text().await.expect("body"), "first");

        // Retention reaches "forever" too: nothing is purged, and the next run is answered from
        // the ledger with the whole body.
        assert_eq!(client.purge_expired(100).await.expect("purge"), 0);
        let replay = client
            .post(server.url("/"))
            .body("x")
            .idempotency_key(key)
            .send()
            .await
            .expect("replayed");
        let report = RetryReport::of(&replay).expect("report").clone();
        assert!(report.is_replayed());
        assert!(!report.is_replay_body_missing());
        assert_eq!(replay.text().await.expect("body"), "first");
        assert_eq!(server.hits(), 1);
    })
    .await;
}

#[tokio::test]
async fn ledger_options_at_zero() {
    bounded(async {
        let server = TestServer::start(vec![], Action::ok("body")).await;
        let client = ledgered(
            LedgerOptions::new()
                .retention(Duration::ZERO)
                .lease(Duration::ZERO)
                .max_body(0)
                .on_lease_held(LeaseHeldPolicy::Wait {
                    poll: Duration::ZERO,
                    max_wait: Duration::MAX,
                }),
            fast(),
        );
        let key = IdempotencyKey::new("ledger-zero-1").expect("valid");
        let send = || {
            client
                .post(server.url("/"))
                .body("x")
                .idempotency_key(key.clone())
                .send()
        };
        let response = send().await.expect("sent");
        assert_eq!(response.text().await.expect("body"), "body");
        // Retention zero still keeps the row for twice the reconcile window: succeeded, without
        // the body a zero max_body could not save, so the next run fetches it again with its
        // key instead of replaying an empty body.
        assert_eq!(client.purge_expired(100).await.expect("purge"), 0);
        let again = send().await.expect("fetched again");
        let report = RetryReport::of(&again).expect("report").clone();
        assert!(report.is_refetched() && !report.is_replayed());
        assert_eq!(again.text().await.expect("body"), "body");
        assert_eq!(server.hits(), 2);
        assert_eq!(server.keys(), vec![Some(key.to_string()); 2]);
    })
    .await;
}

#[tokio::test]
async fn a_zero_poll_fails_at_once_and_a_huge_poll_is_cut_to_max_wait() {
    bounded(async {
        for (poll, max_wait) in [
            (Duration::ZERO, Duration::MAX),
            (Duration::MAX, ms(30)),
            (ms(10), Duration::ZERO),
        ] {
            let server = TestServer::start(
                vec![Action::stall_then(ms(1_500), Action::ok("first"))],
                Action::ok("again"),
            )
            .await;
            let client = ledgered(
                LedgerOptions::new().on_lease_held(LeaseHeldPolicy::Wait { poll, max_wait }),
                fast(),
            );
            let key = IdempotencyKey::new("ledger-poll-1").expect("valid");
            let first = first_run_in_flight(&client, &server, &key).await;
            let err = client
                .post(server.url("/"))
                .body("x")
                .idempotency_key(key)
                .send()
                .await
                .expect_err("still in progress");
            assert_eq!(err.kind(), ErrorKind::LeaseHeld, "{poll:?} {max_wait:?}");
            assert_eq!(err.attempts(), 0);
            first.await.expect("task").expect("first run succeeds");
            assert_eq!(server.hits(), 1);
        }
    })
    .await;
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn a_sensitive_key_header_stays_sensitive_on_every_attempt() {
    use tower::{Layer, ServiceExt};
    use tower_test::mock;

    bounded(async {
        let (inner, mut handle) = mock::pair::<http::Request<String>, http::Response<String>>();
        let service = settings().build_layer().expect("valid").layer(inner);
        let mut value = HeaderValue::from_static("secret-op-1");
        value.set_sensitive(true);
        let mut request = http::Request::post("http://example.invalid/")
            .body(String::new())
            .expect("valid");
        request.headers_mut().insert("idempotency-key", value);
        let call = tokio::spawn(service.oneshot(request));
        for (attempt, status) in [(1, 503), (2, 200)] {
            let (sent, reply) = handle.next_request().await.expect("an attempt");
            let header = sent.headers().get("idempotency-key").expect("the key");
            assert_eq!(header.as_bytes(), b"secret-op-1", "attempt {attempt}");
            assert!(header.is_sensitive(), "attempt {attempt}");
            assert_eq!(sent.headers().get_all("idempotency-key").iter().count(), 1);
            reply.send_response(
                http::Response::builder()
                    .status(status)
                    .body(String::new())
                    .expect("valid"),
            );
        }
        let response = call.await.expect("task").expect("200");
        assert_eq!(response.status(), 200);
    })
    .await;
}
