//! Idempotency keys: the validated key type, deterministic derivation and random keys.
//!
//! A key is chosen once, before the first attempt, and sent unchanged on every attempt:
//! [`IdempotencyKey::derive`] and [`IdempotencyKey::for_tool_call`] compute it from what
//! identifies the operation (the same on every replica and restart; plain SHA-256, so use a
//! [`DerivationSecret`](crate::DerivationSecret) when the inputs must not leak),
//! [`IdempotencyKey::random`] mints a UUID v4, [`IdempotencyKey::new`] accepts one chosen
//! elsewhere. Every key is 1 to 255 bytes of visible ASCII (0x21..=0x7E).
//!
//! Why, and the exact bytes each derivation hashes: `docs/keys.md`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::digest::Update;
use sha2::{Digest, Sha256};

use crate::keys::canonical;

/// Domain-separation tag of [`IdempotencyKey::derive`]. Part of the compatibility promise.
const DERIVE_TAG: &[u8] = b"idempotent-retry:derive:v1";
/// Domain-separation tag of [`IdempotencyKey::for_tool_call`]. Part of the compatibility promise.
const TOOL_CALL_TAG: &[u8] = b"idempotent-retry:tool-call:v1";

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// The key that makes retries of one logical operation safe to repeat.
///
/// The text is always 1 to [`MAX_LEN`](Self::MAX_LEN) bytes of visible ASCII (0x21..=0x7E);
/// every constructor guarantees it. `Display` and [`as_str`](Self::as_str) give the key text,
/// and serde reads and writes it as a plain string, refusing invalid text on deserialization.
///
/// # Examples
///
/// ```
/// use idempotent_retry::IdempotencyKey;
///
/// // A key chosen elsewhere, validated.
/// let key = IdempotencyKey::new("order-1234-capture")?;
/// assert_eq!(key.as_str(), "order-1234-capture");
///
/// // A key derived from what identifies the operation: the same on every replica and restart.
/// let derived = IdempotencyKey::derive("webhook.stripe", &["evt_123"]);
/// assert_eq!(derived, IdempotencyKey::derive("webhook.stripe", &["evt_123"]));
/// assert_ne!(derived, IdempotencyKey::derive("webhook.github", &["evt_123"]));
/// # Ok::<(), idempotent_retry::InvalidKey>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key accepted, in bytes: 255.
    pub const MAX_LEN: usize = 255;

    /// Validates `key` and wraps it.
    ///
    /// A valid key is 1 to [`MAX_LEN`](Self::MAX_LEN) (255) bytes long and every byte is visible
    /// ASCII, 0x21 (`!`) to 0x7E (`~`).
    ///
    /// # Errors
    ///
    /// Returns [`InvalidKey`] if the key is empty, longer than 255 bytes, or holds any other byte:
    /// space, CR, LF, NUL or any other control character, DEL, or any byte of a non-ASCII
    /// character. [`InvalidKey::reason`] says which, and where.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{IdempotencyKey, InvalidKeyReason};
    ///
    /// assert!(IdempotencyKey::new("9f2c1b7e-capture").is_ok());
    ///
    /// let error = IdempotencyKey::new("abc\r\nX-Injected: 1").unwrap_err();
    /// assert_eq!(error.reason(), InvalidKeyReason::InvalidByte { byte: b'\r', index: 3 });
    /// assert_eq!(
    ///     error.to_string(),
    ///     "idempotency key has byte 0x0d at index 3, only visible ASCII 0x21..=0x7e is allowed"
    /// );
    /// ```
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        match validate(key.as_bytes()) {
            Ok(()) => Ok(Self(key)),
            Err(reason) => Err(InvalidKey { reason }),
        }
    }

    /// Validates the raw bytes of a header value (which may hold obs-text, bytes 0x80 and up)
    /// as a key.
    pub(crate) fn from_header_bytes(bytes: &[u8]) -> Result<Self, InvalidKey> {
        validate(bytes).map_err(|reason| InvalidKey { reason })?;
        // Every byte is visible ASCII now, so this is valid UTF-8; never panic over it.
        String::from_utf8(bytes.to_vec())
            .map(Self)
            .map_err(|error| {
                let index = error.utf8_error().valid_up_to();
                InvalidKey {
                    reason: InvalidKeyReason::InvalidByte {
                        byte: bytes.get(index).copied().unwrap_or_default(),
                        index,
                    },
                }
            })
    }

    /// Derives a key from a scope and the parts that identify one operation within it.
    ///
    /// The scope names the kind of operation or the source of its identity (`"agent.send_email"`,
    /// `"webhook.stripe"`), so the same part from two sources (`evt_123` from two providers)
    /// gives two keys. The parts are the identity itself (`["conv_42", "7"]`). The encoding is
    /// unambiguous: `("ab", "c")` and `("a", "bc")`, scope `"a"` with part `"b"` and scope `"ab"`
    /// with no part, and `["a", ""]` and `["a"]` all give different keys.
    ///
    /// The key is 64 lowercase hex characters: the SHA-256 of the tag
    /// `idempotent-retry:derive:v1`, then `scope` and `parts`, each length-prefixed (the bytes:
    /// `docs/keys.md`). Strings are hashed as given, without Unicode normalization. The encoding
    /// is a compatibility promise: the same key in every process, platform and version of the
    /// same major version.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]);
    /// assert_eq!(
    ///     key.as_str(),
    ///     "c773f371188e7c30df068e84cff87cf4102e2ebe19bc21c186155202b0a911ac"
    /// );
    /// assert_ne!(
    ///     IdempotencyKey::derive("s", &["ab", "c"]),
    ///     IdempotencyKey::derive("s", &["a", "bc"])
    /// );
    /// ```
    #[must_use]
    pub fn derive(scope: &str, parts: &[&str]) -> Self {
        let mut hasher = Sha256::new();
        encode_derive(&mut hasher, DERIVE_TAG, scope, parts);
        Self::from_digest(&hasher.finalize())
    }

    /// Derives a key from a tool name and the tool call's JSON arguments.
    ///
    /// Meant for agents: the same tool called with the same arguments gets the same key, so a
    /// call repeated after a crash or a model retry is deduplicated by the server. The arguments
    /// are normalized with RFC 8785 ([`canonical::to_string`](crate::keys::canonical::to_string)) first, so member
    /// order, whitespace, escapes and number spelling do not matter: `{"a":1,"b":2}` and
    /// `{"b":2,"a":1.0}` give the same key.
    ///
    /// The key is 64 lowercase hex characters: the SHA-256 of the tag
    /// `idempotent-retry:tool-call:v1` (not [`derive`](Self::derive)'s), then `tool` and the
    /// canonical arguments, each length-prefixed; a compatibility promise like `derive`'s.
    /// Numbers enter as the double the `Value` holds (`serde_json`'s `float_roundtrip` is on):
    /// `docs/keys.md` has the bytes and what another parser can change.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    /// use serde_json::json;
    ///
    /// let one = IdempotencyKey::for_tool_call("create_invoice", &json!({ "a": 1, "b": 2 }));
    /// let two = IdempotencyKey::for_tool_call("create_invoice", &json!({ "b": 2, "a": 1.0 }));
    /// assert_eq!(one, two);
    /// assert_eq!(one.as_str().len(), 64);
    /// ```
    #[must_use]
    pub fn for_tool_call(tool: &str, args: &serde_json::Value) -> Self {
        let mut hasher = Sha256::new();
        encode_tool_call(&mut hasher, TOOL_CALL_TAG, tool, args);
        Self::from_digest(&hasher.finalize())
    }

    /// Whether a front end gives a request with this method a key of its own when none is
    /// given (with [`ClientBuilder::auto_keys`](crate::ClientBuilder::auto_keys) on): every
    /// method but RFC 9110's idempotent ones (`GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`,
    /// `TRACE`), which are retried without a key.
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    ///
    /// assert!(IdempotencyKey::is_minted_for(&http::Method::POST));
    /// assert!(!IdempotencyKey::is_minted_for(&http::Method::PUT));
    /// ```
    #[must_use]
    pub fn is_minted_for(method: &http::Method) -> bool {
        !is_idempotent_method(method)
    }

    /// Mints a random key: a UUID version 4 in its 36-character lowercase text form.
    ///
    /// The 122 random bits come from a cryptographically secure generator seeded from the
    /// operating system (rand's thread-local generator). Mint the key once per logical
    /// operation, before the first attempt; to make keys reproducible in tests, or to draw the
    /// bits from a generator of your own, use [`from_random_bytes`](Self::from_random_bytes).
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::random();
    /// assert_eq!(key.as_str().len(), 36);
    /// assert_eq!(key.as_str().as_bytes()[14], b'4');
    /// assert_ne!(key, IdempotencyKey::random());
    /// ```
    #[must_use]
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        rand::Rng::fill_bytes(&mut rand::rng(), &mut bytes);
        Self::from_random_bytes(bytes)
    }

    /// Lays out 16 random bytes as a UUID version 4 key, as [`random`](Self::random) does
    /// with the bytes it draws: 6 of the 128 bits are overwritten by the version and variant
    /// (RFC 9562), the other 122 are kept.
    ///
    /// The same bytes give the same key, which makes tests reproducible, and any generator
    /// can supply them. Outside tests, prefer [`random`](Self::random) or bytes from a
    /// cryptographically secure generator: keys from a predictable generator can collide across
    /// processes seeded alike.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::from_random_bytes([0xab; 16]);
    /// assert_eq!(key.as_str(), "abababab-abab-4bab-abab-abababababab");
    /// assert_eq!(key, IdempotencyKey::from_random_bytes([0xab; 16]));
    /// ```
    #[must_use]
    pub fn from_random_bytes(mut bytes: [u8; 16]) -> Self {
        // RFC 9562: version 4 in the high nibble of byte 6, variant 0b10 in the top bits of
        // byte 8.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        let mut text = String::with_capacity(36);
        for (index, byte) in bytes.into_iter().enumerate() {
            if matches!(index, 4 | 6 | 8 | 10) {
                text.push('-');
            }
            push_hex(&mut text, byte);
        }
        Self(text)
    }

    /// The key text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key text, by value.
    #[must_use]
    pub fn into_string(self) -> String {
        self.0
    }

    /// The key as an HTTP header value, ready for an `Idempotency-Key` header.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotencyKey;
    ///
    /// let key = IdempotencyKey::new("order-1234")?;
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("idempotency-key", key.to_header_value());
    /// assert_eq!(headers["idempotency-key"], "order-1234");
    /// # Ok::<(), idempotent_retry::InvalidKey>(())
    /// ```
    #[must_use]
    pub fn to_header_value(&self) -> http::HeaderValue {
        match http::HeaderValue::from_str(&self.0) {
            Ok(value) => value,
            // Unreachable: `HeaderValue` refuses only DEL and control bytes other than tab, and
            // every constructor of this type admits visible ASCII only. Should that invariant
            // ever break, send a value that is still distinct per key (64 bits of the key's
            // SHA-256, in decimal) rather than panic or send one shared sentinel, which would
            // make the server deduplicate unrelated operations.
            Err(_) => {
                let digest = Sha256::digest(self.0.as_bytes());
                let mut first = [0u8; 8];
                for (slot, byte) in first.iter_mut().zip(digest.iter()) {
                    *slot = *byte;
                }
                http::HeaderValue::from(u64::from_be_bytes(first))
            }
        }
    }

    /// Hex-encodes a SHA-256 digest: 64 lowercase hex digits, valid by construction.
    pub(crate) fn from_digest(digest: &[u8]) -> Self {
        let mut text = String::with_capacity(digest.len() * 2);
        for &byte in digest {
            push_hex(&mut text, byte);
        }
        Self(text)
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for IdempotencyKey {
    type Err = InvalidKey;

    fn from_str(key: &str) -> Result<Self, Self::Err> {
        Self::new(key)
    }
}

impl TryFrom<String> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(key: String) -> Result<Self, Self::Error> {
        Self::new(key)
    }
}

impl TryFrom<&str> for IdempotencyKey {
    type Error = InvalidKey;

    fn try_from(key: &str) -> Result<Self, Self::Error> {
        Self::new(key)
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The error returned when text is not a valid idempotency key.
///
/// Its message names the problem and, for a bad byte, its value and position, but never
/// repeats the key, which may be long or hold control characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidKey {
    reason: InvalidKeyReason,
}

impl InvalidKey {
    /// Why the key was refused.
    #[must_use]
    pub fn reason(&self) -> InvalidKeyReason {
        self.reason
    }
}

/// Why a key was refused; see [`InvalidKey::reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum InvalidKeyReason {
    /// The key is empty.
    Empty,
    /// The key is longer than [`IdempotencyKey::MAX_LEN`] (255) bytes.
    TooLong {
        /// The key's length in bytes.
        len: usize,
    },
    /// The key holds a byte outside visible ASCII (0x21..=0x7E): a space, a control character,
    /// DEL, or a byte of a non-ASCII character. Only the first such byte is reported.
    InvalidByte {
        /// The refused byte; for a non-ASCII character, the first byte of its UTF-8 encoding.
        byte: u8,
        /// The byte's offset from the start of the key.
        index: usize,
    },
}

impl fmt::Display for InvalidKeyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("idempotency key is empty"),
            Self::TooLong { len } => write!(
                f,
                "idempotency key is {len} bytes long, the limit is {}",
                IdempotencyKey::MAX_LEN
            ),
            Self::InvalidByte { byte, index } => write!(
                f,
                "idempotency key has byte {byte:#04x} at index {index}, \
                 only visible ASCII 0x21..=0x7e is allowed"
            ),
        }
    }
}

/// Checks the key rules; the length first, so an oversized key is refused without a scan.
fn validate(key: &[u8]) -> Result<(), InvalidKeyReason> {
    if key.is_empty() {
        return Err(InvalidKeyReason::Empty);
    }
    if key.len() > IdempotencyKey::MAX_LEN {
        return Err(InvalidKeyReason::TooLong { len: key.len() });
    }
    match key.iter().position(|byte| !matches!(byte, 0x21..=0x7e)) {
        Some(index) => Err(InvalidKeyReason::InvalidByte {
            byte: key[index],
            index,
        }),
        None => Ok(()),
    }
}

/// Feeds the documented encoding of [`IdempotencyKey::derive`] under `tag`: the tag, the
/// length-prefixed scope, the number of parts, each part length-prefixed. Shared with the
/// secret-keyed derivation, which differs only in its tag and in hashing with HMAC.
pub(crate) fn encode_derive<U: Update>(out: &mut U, tag: &[u8], scope: &str, parts: &[&str]) {
    out.update(tag);
    update_length_prefixed(out, scope.as_bytes());
    update_length(out, parts.len());
    for part in parts {
        update_length_prefixed(out, part.as_bytes());
    }
}

/// Feeds the documented encoding of [`IdempotencyKey::for_tool_call`] under `tag`: the tag,
/// the length-prefixed tool name, the length-prefixed canonical JSON of the arguments.
pub(crate) fn encode_tool_call<U: Update>(
    out: &mut U,
    tag: &[u8],
    tool: &str,
    args: &serde_json::Value,
) {
    out.update(tag);
    update_length_prefixed(out, tool.as_bytes());
    // The length goes before the bytes, so they are gathered first: into this thread's
    // scratch buffer, reused from call to call, so no string is allocated per key. (Counting
    // them in a first walk and hashing them in a second, with nothing gathered, costs two
    // walks: measured at twice the time in `benches/keys.rs`.)
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut bytes) => {
            bytes.clear();
            canonical::walk(args, &mut *bytes);
            update_length_prefixed(out, &bytes);
            if bytes.capacity() > SCRATCH_KEPT {
                *bytes = Vec::new();
            }
        }
        // Only a hasher that derives a key inside its own `update` could get here.
        Err(_) => {
            let mut bytes = Vec::new();
            canonical::walk(args, &mut bytes);
            update_length_prefixed(out, &bytes);
        }
    });
}

/// The largest scratch buffer a thread keeps between keys; one grown past it by large
/// arguments is freed after use.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    /// The canonical bytes of the arguments being hashed.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Feeds a length as the 8 bytes of a big-endian `u64`.
fn update_length<U: Update>(out: &mut U, len: usize) {
    // `usize` is at most 64 bits on every supported target, so this never saturates.
    let len = u64::try_from(len).unwrap_or(u64::MAX);
    out.update(&len.to_be_bytes());
}

/// Feeds `bytes` preceded by its length.
fn update_length_prefixed<U: Update>(out: &mut U, bytes: &[u8]) {
    update_length(out, bytes.len());
    out.update(bytes);
}

pub(crate) fn push_hex(text: &mut String, byte: u8) {
    text.push(char::from(HEX_DIGITS[usize::from(byte >> 4)]));
    text.push(char::from(HEX_DIGITS[usize::from(byte & 0x0f)]));
}

/// Whether `method` is idempotent by definition (RFC 9110 §9.2.2: `GET`, `HEAD`, `OPTIONS`,
/// `PUT`, `DELETE`, `TRACE`), so that a request with it is retried even without a key.
pub(crate) fn is_idempotent_method(method: &http::Method) -> bool {
    use http::Method;
    [
        Method::GET,
        Method::HEAD,
        Method::OPTIONS,
        Method::PUT,
        Method::DELETE,
        Method::TRACE,
    ]
    .contains(method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use serde_json::json;
    use std::collections::HashSet;

    fn is_lower_hex_64(key: &IdempotencyKey) -> bool {
        key.as_str().len() == 64
            && key
                .as_str()
                .bytes()
                .all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
    }

    fn reason(key: &str) -> Option<InvalidKeyReason> {
        IdempotencyKey::new(key).err().map(|error| error.reason())
    }

    // Golden vectors: these exact strings are a compatibility promise (SEMANTICS.md section 2).
    // They were computed once with this implementation and checked against an independent
    // implementation of the documented encoding (Python's hashlib). If one of these fails, the
    // derivation changed: that breaks every stored or in-flight key and needs a new major version
    // and a new domain tag, not an updated literal.

    #[test]
    fn golden_derive_with_parts() {
        assert_eq!(
            IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]).as_str(),
            "c773f371188e7c30df068e84cff87cf4102e2ebe19bc21c186155202b0a911ac"
        );
    }

    #[test]
    fn golden_derive_without_parts() {
        assert_eq!(
            IdempotencyKey::derive("stripe.charge", &[]).as_str(),
            "b0f423ac270e41fb773183f83c1db0480ae2fc248c7d7aec1dde2038addc7d4a"
        );
    }

    #[test]
    fn golden_derive_empty_strings() {
        assert_eq!(
            IdempotencyKey::derive("", &[""]).as_str(),
            "ef688f0c3d8b083f0e7a04cafa44544e4cd4d4ad44961c9221c6a6ed99945b9b"
        );
    }

    #[test]
    fn golden_derive_non_ascii() {
        // "café.ünïcödé" (precomposed), "日本語", "😀", spelled as escapes so no editor can
        // normalize them.
        let key = IdempotencyKey::derive(
            "caf\u{e9}.\u{fc}n\u{ef}c\u{f6}d\u{e9}",
            &["\u{65e5}\u{672c}\u{8a9e}", "\u{1f600}"],
        );
        assert_eq!(
            key.as_str(),
            "5bbf276a9b9c65a1e9db1c3f238f3670c43d21c5eaf70efc155e089cd0c77f7c"
        );
    }

    #[test]
    fn golden_tool_call() {
        let key = IdempotencyKey::for_tool_call(
            "send_email",
            &json!({"to": "a@example.com", "subject": "hi"}),
        );
        assert_eq!(
            key.as_str(),
            "279044b9ab0b0cf79c8744562eeb1f4d99ab999a0d602a5448a5205a1b42ff42"
        );
    }

    #[test]
    fn the_streamed_tool_call_encoding_is_the_length_prefixed_canonical_string() {
        // Long strings (past the staging buffer) and many small pieces (through it).
        let args = json!({
            "body": "x".repeat(1000),
            "items": (0..200).map(|i| json!({ "n": i, "s": "ü" })).collect::<Vec<_>>(),
            "\u{1f600}": "\u{e000}",
        });
        let text = crate::keys::canonical::to_string(&args);
        let mut hasher = Sha256::new();
        Digest::update(&mut hasher, TOOL_CALL_TAG);
        for part in ["send_email".as_bytes(), text.as_bytes()] {
            Digest::update(&mut hasher, (part.len() as u64).to_be_bytes());
            Digest::update(&mut hasher, part);
        }
        assert_eq!(
            IdempotencyKey::for_tool_call("send_email", &args),
            IdempotencyKey::from_digest(&hasher.finalize())
        );
    }

    #[test]
    fn golden_tool_call_non_ascii() {
        let key = IdempotencyKey::for_tool_call(
            "translate",
            &json!({"text": "Gr\u{fc}\u{df}e \u{1f600}", "\u{e000}": 1}),
        );
        assert_eq!(
            key.as_str(),
            "a53c276a9bab1ac3d5b865425ccb1c274ddb4fe64641d15f6fa2e8db95f494ff"
        );
    }

    /// Rebuilds the documented byte encoding by hand, without the helpers under test.
    #[test]
    fn derive_hashes_the_documented_encoding() {
        let mut message = Vec::new();
        message.extend_from_slice(b"idempotent-retry:derive:v1");
        message.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 16]);
        message.extend_from_slice(b"agent.send_email");
        message.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 2]);
        message.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7]);
        message.extend_from_slice(b"conv_42");
        message.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1]);
        message.extend_from_slice(b"7");
        let expected: String = Sha256::digest(&message)
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(
            IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]).as_str(),
            expected
        );
    }

    #[test]
    fn tool_call_hashes_the_documented_encoding() {
        let canonical = br#"{"subject":"hi","to":"a@example.com"}"#;
        let mut message = Vec::new();
        message.extend_from_slice(b"idempotent-retry:tool-call:v1");
        message.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 10]);
        message.extend_from_slice(b"send_email");
        message.extend_from_slice(&(canonical.len() as u64).to_be_bytes());
        message.extend_from_slice(canonical);
        let expected: String = Sha256::digest(&message)
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let key = IdempotencyKey::for_tool_call(
            "send_email",
            &json!({"to": "a@example.com", "subject": "hi"}),
        );
        assert_eq!(key.as_str(), expected);
    }

    #[test]
    fn derive_is_unambiguous() {
        let distinct = [
            IdempotencyKey::derive("s", &["ab", "c"]),
            IdempotencyKey::derive("s", &["a", "bc"]),
            IdempotencyKey::derive("s", &["abc"]),
            IdempotencyKey::derive("a", &["b"]),
            IdempotencyKey::derive("ab", &[]),
            IdempotencyKey::derive("s", &["a", ""]),
            IdempotencyKey::derive("s", &["a"]),
            IdempotencyKey::derive("s", &["", "a"]),
            IdempotencyKey::derive("s", &[""]),
            IdempotencyKey::derive("s", &[]),
            IdempotencyKey::derive("", &["s"]),
            IdempotencyKey::derive("provider_a", &["evt_123"]),
            IdempotencyKey::derive("provider_b", &["evt_123"]),
        ];
        let unique: HashSet<_> = distinct.iter().collect();
        assert_eq!(unique.len(), distinct.len());
    }

    #[test]
    fn derive_is_deterministic_and_valid() {
        let one = IdempotencyKey::derive("scope", &["x", "y"]);
        let two = IdempotencyKey::derive("scope", &["x", "y"]);
        assert_eq!(one, two);
        assert!(is_lower_hex_64(&one));
        assert_eq!(IdempotencyKey::new(one.as_str()), Ok(one));
    }

    #[test]
    fn tool_call_ignores_member_order_and_number_spelling() {
        let one = IdempotencyKey::for_tool_call("t", &json!({"a": 1, "b": 2}));
        let two = IdempotencyKey::for_tool_call("t", &json!({"b": 2, "a": 1.0}));
        let parsed: serde_json::Value = serde_json::from_str(r#"{ "b" : 2e0 , "a" : 1 }"#).unwrap();
        assert_eq!(one, two);
        assert_eq!(one, IdempotencyKey::for_tool_call("t", &parsed));
        assert!(is_lower_hex_64(&one));
    }

    #[test]
    fn tool_call_separates_tool_and_arguments() {
        let base = IdempotencyKey::for_tool_call("t", &json!({"a": 1}));
        assert_ne!(base, IdempotencyKey::for_tool_call("u", &json!({"a": 1})));
        assert_ne!(base, IdempotencyKey::for_tool_call("t", &json!({"a": 2})));
        assert_ne!(base, IdempotencyKey::for_tool_call("t", &json!({"a": "1"})));
        assert_ne!(base, IdempotencyKey::for_tool_call("t", &json!([{"a": 1}])));
        // The same bytes under derive's tag give another key.
        assert_ne!(base, IdempotencyKey::derive("t", &[r#"{"a":1}"#]));
        // Moving text between tool name and arguments changes the key.
        assert_ne!(
            IdempotencyKey::for_tool_call("ab", &json!("c")),
            IdempotencyKey::for_tool_call("a", &json!("bc"))
        );
    }

    #[test]
    fn validation_of_every_byte_value() {
        for byte in 0u8..=255 {
            let key = [b'a', b'b', byte, b'c'];
            let expected = if (0x21..=0x7e).contains(&byte) {
                Ok(())
            } else {
                Err(InvalidKeyReason::InvalidByte { byte, index: 2 })
            };
            assert_eq!(validate(&key), expected, "byte {byte:#04x}");
        }
    }

    #[test]
    fn new_refuses_every_char_outside_visible_ascii() {
        for code in 0u32..=0x2ff {
            let Some(ch) = char::from_u32(code) else {
                continue;
            };
            let key = format!("ab{ch}c");
            let result = IdempotencyKey::new(key.as_str());
            if (0x21..=0x7e).contains(&code) {
                assert_eq!(result.map(IdempotencyKey::into_string), Ok(key));
            } else {
                // For a non-ASCII character the first byte of its UTF-8 encoding is reported.
                let byte = key.as_bytes()[2];
                assert_eq!(
                    result.map_err(|error| error.reason()),
                    Err(InvalidKeyReason::InvalidByte { byte, index: 2 }),
                    "char {code:#x}"
                );
            }
        }
        assert_eq!(
            reason("\u{1f600}"),
            Some(InvalidKeyReason::InvalidByte {
                byte: 0xf0,
                index: 0
            })
        );
        assert_eq!(
            reason("ok\u{2028}"),
            Some(InvalidKeyReason::InvalidByte {
                byte: 0xe2,
                index: 2
            })
        );
    }

    #[test]
    fn named_bad_bytes() {
        for (key, byte, index) in [
            ("a b", b' ', 1),
            ("ab\r", b'\r', 2),
            ("\nab", b'\n', 0),
            ("a\0b", 0, 1),
            ("a\tb", b'\t', 1),
            ("ab\x7f", 0x7f, 2),
            ("caf\u{e9}", 0xc3, 3),
        ] {
            assert_eq!(
                reason(key),
                Some(InvalidKeyReason::InvalidByte { byte, index }),
                "{key:?}"
            );
        }
    }

    #[test]
    fn length_limits() {
        assert_eq!(reason(""), Some(InvalidKeyReason::Empty));
        assert_eq!(reason("a"), None);
        assert_eq!(reason(&"a".repeat(255)), None);
        assert_eq!(
            reason(&"a".repeat(256)),
            Some(InvalidKeyReason::TooLong { len: 256 })
        );
        // Length is checked before bytes, and counts bytes, not characters.
        assert_eq!(
            reason(&" ".repeat(300)),
            Some(InvalidKeyReason::TooLong { len: 300 })
        );
        assert_eq!(
            reason(&"\u{e9}".repeat(128)),
            Some(InvalidKeyReason::TooLong { len: 256 })
        );
        assert_eq!(IdempotencyKey::MAX_LEN, 255);
    }

    #[test]
    fn error_messages_name_the_problem_not_the_key() {
        let message = |key: &str| {
            IdempotencyKey::new(key)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(message(""), "idempotency key is empty");
        assert_eq!(
            message(&"x".repeat(256)),
            "idempotency key is 256 bytes long, the limit is 255"
        );
        assert_eq!(
            message("secret\0"),
            "idempotency key has byte 0x00 at index 6, only visible ASCII 0x21..=0x7e is allowed"
        );
        assert_eq!(
            message("secret\u{ff}"),
            "idempotency key has byte 0xc3 at index 6, only visible ASCII 0x21..=0x7e is allowed"
        );
        let huge = "k".repeat(1 << 20);
        let huge_message = message(&huge);
        assert!(!huge_message.contains("kk"));
        assert!(huge_message.len() < 100);
        assert!(!message("secret value").contains("secret"));
    }

    #[test]
    fn invalid_key_reason_display_matches_error() {
        let error = IdempotencyKey::new("").unwrap_err();
        assert_eq!(error.to_string(), error.reason().to_string());
        assert!(std::error::Error::source(&error).is_none());
    }

    #[test]
    fn conversions() {
        let key: IdempotencyKey = "abc-123".parse().unwrap();
        assert_eq!(key.as_str(), "abc-123");
        assert_eq!(key.to_string(), "abc-123");
        assert_eq!(format!("{key}"), "abc-123");
        assert_eq!(format!("{key:?}"), r#"IdempotencyKey("abc-123")"#);
        assert_eq!(AsRef::<str>::as_ref(&key), "abc-123");
        assert_eq!(String::from(key.clone()), "abc-123");
        assert_eq!(key.clone().into_string(), "abc-123");
        assert_eq!(IdempotencyKey::try_from("abc-123"), Ok(key.clone()));
        assert_eq!(IdempotencyKey::try_from(String::from("abc-123")), Ok(key));
        assert_eq!(
            "a b"
                .parse::<IdempotencyKey>()
                .map_err(|error| error.reason()),
            Err(InvalidKeyReason::InvalidByte {
                byte: b' ',
                index: 1
            })
        );
        assert!(IdempotencyKey::try_from("").is_err());
    }

    #[test]
    fn keys_order_and_hash_by_text() {
        let a = IdempotencyKey::new("a").unwrap();
        let b = IdempotencyKey::new("b").unwrap();
        assert!(a < b);
        let set: HashSet<_> = [a.clone(), a.clone(), b].into_iter().collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn serde_round_trip_as_plain_string() {
        let key = IdempotencyKey::new("order-42").unwrap();
        let text = serde_json::to_string(&key).unwrap();
        assert_eq!(text, r#""order-42""#);
        let back: IdempotencyKey = serde_json::from_str(&text).unwrap();
        assert_eq!(back, key);

        let derived = IdempotencyKey::derive("s", &["p"]);
        let value = serde_json::to_value(&derived).unwrap();
        assert_eq!(value, json!(derived.as_str()));
        assert_eq!(
            serde_json::from_value::<IdempotencyKey>(value).unwrap(),
            derived
        );
    }

    #[test]
    fn serde_refuses_invalid_keys() {
        for text in [
            r#""""#,
            r#""a b""#,
            r#""a\r\nb""#,
            r#""caf\u00e9""#,
            "42",
            "null",
        ] {
            assert!(
                serde_json::from_str::<IdempotencyKey>(text).is_err(),
                "{text}"
            );
        }
        let error = serde_json::from_str::<IdempotencyKey>(r#""a\nb""#).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("idempotency key has byte 0x0a at index 1"),
            "{error}"
        );
        let long = format!("\"{}\"", "a".repeat(256));
        assert!(serde_json::from_str::<IdempotencyKey>(&long).is_err());
    }

    #[test]
    fn header_value_is_the_key_text() {
        for key in [
            IdempotencyKey::new("!~abc-XYZ_09").unwrap(),
            IdempotencyKey::new("a".repeat(255)).unwrap(),
            IdempotencyKey::derive("s", &[]),
            IdempotencyKey::random(),
        ] {
            let value = key.to_header_value();
            assert_eq!(value.as_bytes(), key.as_str().as_bytes());
            assert!(!value.is_sensitive());
        }
    }

    fn assert_uuid_v4_text(key: &IdempotencyKey) {
        let text = key.as_str().as_bytes();
        assert_eq!(text.len(), 36, "{key}");
        for (index, &byte) in text.iter().enumerate() {
            if matches!(index, 8 | 13 | 18 | 23) {
                assert_eq!(byte, b'-', "{key}");
            } else {
                assert!(matches!(byte, b'0'..=b'9' | b'a'..=b'f'), "{key}");
            }
        }
        assert_eq!(text[14], b'4', "version nibble of {key}");
        assert!(
            matches!(text[19], b'8' | b'9' | b'a' | b'b'),
            "variant of {key}"
        );
    }

    #[test]
    fn random_keys_are_uuid_v4_text() {
        for _ in 0..200 {
            let key = IdempotencyKey::random();
            assert_uuid_v4_text(&key);
            assert_eq!(IdempotencyKey::new(key.as_str()), Ok(key));
        }
    }

    #[test]
    fn random_keys_differ() {
        let keys: HashSet<_> = (0..1000).map(|_| IdempotencyKey::random()).collect();
        assert_eq!(keys.len(), 1000);
    }

    #[test]
    fn the_same_random_bytes_give_the_same_key() {
        let mut rng = StdRng::seed_from_u64(42);
        let mut draw = || {
            let mut bytes = [0u8; 16];
            rand::Rng::fill_bytes(&mut rng, &mut bytes);
            bytes
        };
        let (first, second) = (draw(), draw());
        let one = IdempotencyKey::from_random_bytes(first);
        assert_eq!(one, IdempotencyKey::from_random_bytes(first));
        assert_ne!(one, IdempotencyKey::from_random_bytes(second));
        assert_uuid_v4_text(&one);
        assert_eq!(IdempotencyKey::new(one.as_str()), Ok(one));
    }

    #[test]
    fn from_random_bytes_lays_out_rfc_9562_version_and_variant() {
        let counting: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            IdempotencyKey::from_random_bytes(counting).as_str(),
            "00010203-0405-4607-8809-0a0b0c0d0e0f"
        );
        assert_eq!(
            IdempotencyKey::from_random_bytes([0xff; 16]).as_str(),
            "ffffffff-ffff-4fff-bfff-ffffffffffff"
        );
        assert_eq!(
            IdempotencyKey::from_random_bytes([0x00; 16]).as_str(),
            "00000000-0000-4000-8000-000000000000"
        );
    }

    #[test]
    fn types_are_send_sync_and_errors_are_static() {
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        fn assert_error<T: std::error::Error + Send + Sync + 'static>() {}
        assert_send_sync::<IdempotencyKey>();
        assert_send_sync::<InvalidKey>();
        assert_send_sync::<InvalidKeyReason>();
        assert_error::<InvalidKey>();
    }

    /// A mix of visible ASCII and everything else, with lengths around the limits.
    fn near_valid_text() -> impl Strategy<Value = String> {
        let ch = prop_oneof![
            8 => (0x21u8..=0x7e).prop_map(char::from),
            1 => (0u8..=0x20).prop_map(char::from),
            1 => Just('\u{7f}'),
            1 => any::<char>(),
        ];
        prop_oneof![
            prop::collection::vec(ch.clone(), 0..=8),
            prop::collection::vec(ch.clone(), 250..=260),
            prop::collection::vec(ch, 0..=300),
        ]
        .prop_map(|chars| chars.into_iter().collect())
    }

    proptest! {
        #[test]
        fn derive_always_gives_64_lowercase_hex(
            scope in any::<String>(),
            parts in prop::collection::vec(any::<String>(), 0..6),
        ) {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let key = IdempotencyKey::derive(&scope, &parts);
            prop_assert!(is_lower_hex_64(&key), "{}", key);
            prop_assert_eq!(IdempotencyKey::new(key.as_str()), Ok(key.clone()));
            prop_assert_eq!(IdempotencyKey::derive(&scope, &parts), key);
        }

        #[test]
        fn moving_a_boundary_changes_the_derived_key(
            text in "[a-z]{1,12}",
            one in any::<prop::sample::Index>(),
            shift in any::<prop::sample::Index>(),
        ) {
            // Two distinct split points among the text's len + 1 boundaries.
            let boundaries = text.len() + 1;
            let one = one.index(boundaries);
            let two = (one + 1 + shift.index(boundaries - 1)) % boundaries;
            let (head_one, tail_one) = text.split_at(one);
            let (head_two, tail_two) = text.split_at(two);
            prop_assert_ne!(
                IdempotencyKey::derive("s", &[head_one, tail_one]),
                IdempotencyKey::derive("s", &[head_two, tail_two])
            );
            prop_assert_ne!(
                IdempotencyKey::derive(head_one, &[tail_one]),
                IdempotencyKey::derive(head_two, &[tail_two])
            );
        }

        #[test]
        fn new_accepts_every_visible_ascii_string_up_to_255(key in "[\\x21-\\x7e]{1,255}") {
            let parsed = IdempotencyKey::new(key.as_str());
            prop_assert_eq!(parsed.map(IdempotencyKey::into_string), Ok(key));
        }

        #[test]
        fn new_accepts_exactly_the_valid_keys(key in near_valid_text()) {
            let valid = (1..=255).contains(&key.len())
                && key.bytes().all(|byte| (0x21..=0x7e).contains(&byte));
            match IdempotencyKey::new(key.as_str()) {
                Ok(parsed) => {
                    prop_assert!(valid, "accepted {:?}", key);
                    prop_assert_eq!(parsed.as_str(), key.as_str());
                }
                Err(error) => {
                    prop_assert!(!valid, "refused {:?}: {}", key, error);
                    let expected = if key.is_empty() {
                        InvalidKeyReason::Empty
                    } else if key.len() > 255 {
                        InvalidKeyReason::TooLong { len: key.len() }
                    } else {
                        let index = key
                            .bytes()
                            .position(|byte| !(0x21..=0x7e).contains(&byte))
                            .unwrap_or(usize::MAX);
                        InvalidKeyReason::InvalidByte { byte: key.as_bytes()[index], index }
                    };
                    prop_assert_eq!(error.reason(), expected);
                }
            }
        }
    }
}
