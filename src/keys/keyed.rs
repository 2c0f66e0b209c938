//! Secret-keyed key derivation: HMAC-SHA-256 instead of plain SHA-256, so a key reveals
//! nothing about guessable inputs to someone without the secret (why: `docs/keys.md`).

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::keys::key::{IdempotencyKey, encode_derive, encode_tool_call};

/// Domain-separation tag of [`DerivationSecret::derive`]. Part of the compatibility promise.
const KEYED_DERIVE_TAG: &[u8] = b"idempotent-retry:hmac-derive:v1";
/// Domain-separation tag of [`DerivationSecret::for_tool_call`]. Part of the compatibility
/// promise.
const KEYED_TOOL_CALL_TAG: &[u8] = b"idempotent-retry:hmac-tool-call:v1";

/// A secret for deriving idempotency keys that reveal nothing about their inputs.
///
/// Use it where [`IdempotencyKey::derive`] or [`IdempotencyKey::for_tool_call`] would do,
/// when the inputs are guessable and the key is seen by someone who must not learn them. The
/// key is HMAC-SHA-256 keyed with the secret, over the unkeyed encoding with tags of its own:
/// 64 lowercase hex characters. The secret must be at least [`MIN_LEN`](Self::MIN_LEN) (32)
/// random bytes, shared by every process that derives the same keys; `Debug` never prints it.
///
/// A new secret gives new keys for the same inputs: rotate only between operations. Why
/// 32 bytes, and rotating while operations are in flight: `docs/keys.md`.
///
/// # Examples
///
/// ```
/// use idempotent_retry::{DerivationSecret, IdempotencyKey};
/// use serde_json::json;
///
/// // In production, 32 or more random bytes loaded from a secret store.
/// let secret = DerivationSecret::new([7u8; 32])?;
///
/// let key = secret.derive("agent.send_email", &["conv_42", "7"]);
/// assert_eq!(key, secret.derive("agent.send_email", &["conv_42", "7"]));
/// assert_eq!(key.as_str().len(), 64);
/// // Not the unkeyed key for the same inputs, which anyone can compute.
/// assert_ne!(key, IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]));
/// // Another secret, another key: rotate only between operations.
/// let rotated = DerivationSecret::new([8u8; 32])?;
/// assert_ne!(key, rotated.derive("agent.send_email", &["conv_42", "7"]));
///
/// let call = secret.for_tool_call("create_invoice", &json!({ "amount": 100, "to": "acme" }));
/// assert_eq!(call, secret.for_tool_call("create_invoice", &json!({ "to": "acme", "amount": 100.0 })));
///
/// // Short secrets are refused.
/// assert!(DerivationSecret::new(b"hunter2").is_err());
/// assert_eq!(format!("{secret:?}"), "DerivationSecret { .. }");
/// # Ok::<(), idempotent_retry::InvalidSecret>(())
/// ```
#[derive(Clone)]
pub struct DerivationSecret {
    /// HMAC-SHA-256 keyed with the secret, before any message: cloned for each key.
    mac: Hmac<Sha256>,
}

impl fmt::Debug for DerivationSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DerivationSecret { .. }")
    }
}

impl DerivationSecret {
    /// The shortest secret accepted, in bytes: 32, the size of a SHA-256 output (RFC 2104
    /// advises against HMAC keys shorter than the hash output).
    pub const MIN_LEN: usize = 32;

    /// Keys HMAC-SHA-256 with `secret`.
    ///
    /// Any length from [`MIN_LEN`](Self::MIN_LEN) up is accepted; a secret longer than
    /// SHA-256's 64-byte block is hashed first, as HMAC specifies.
    ///
    /// # Errors
    ///
    /// [`InvalidSecret`] when `secret` is shorter than [`MIN_LEN`](Self::MIN_LEN) bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::DerivationSecret;
    ///
    /// assert!(DerivationSecret::new([0x5au8; 32]).is_ok());
    /// let error = DerivationSecret::new([0x5au8; 31]).unwrap_err();
    /// assert_eq!(error.secret_len(), 31);
    /// assert_eq!(
    ///     error.to_string(),
    ///     "the derivation secret is 31 bytes long, at least 32 are needed"
    /// );
    /// ```
    pub fn new(secret: impl AsRef<[u8]>) -> Result<Self, InvalidSecret> {
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_LEN {
            return Err(InvalidSecret { len: secret.len() });
        }
        match Hmac::<Sha256>::new_from_slice(secret) {
            Ok(mac) => Ok(DerivationSecret { mac }),
            // Unreachable: HMAC takes keys of any length. Report it as a refused secret
            // rather than panic.
            Err(_) => Err(InvalidSecret { len: secret.len() }),
        }
    }

    /// The secret-keyed counterpart of [`IdempotencyKey::derive`].
    ///
    /// The same unambiguous encoding of `scope` and `parts` (so `["a", ""]`, `["a"]` and
    /// `["", "a"]` give different keys) behind the tag `idempotent-retry:hmac-derive:v1`,
    /// authenticated instead of hashed: 64 lowercase hex characters (the bytes:
    /// `docs/keys.md`). The same secret and inputs give the same key in every process, on every
    /// platform and in every version of this crate with the same major version.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::DerivationSecret;
    ///
    /// let secret = DerivationSecret::new(*b"0123456789abcdef0123456789abcdef")?;
    /// assert_eq!(
    ///     secret.derive("agent.send_email", &["conv_42", "7"]).as_str(),
    ///     "d8b515e64120a96a86e29b48037f79309ded05ed54bd7e76cef34534836a0e05"
    /// );
    /// # Ok::<(), idempotent_retry::InvalidSecret>(())
    /// ```
    #[must_use]
    pub fn derive(&self, scope: &str, parts: &[&str]) -> IdempotencyKey {
        let mut mac = self.mac.clone();
        encode_derive(&mut mac, KEYED_DERIVE_TAG, scope, parts);
        IdempotencyKey::from_digest(&mac.finalize().into_bytes())
    }

    /// The secret-keyed counterpart of [`IdempotencyKey::for_tool_call`].
    ///
    /// The arguments are normalized with RFC 8785 ([`canonical::to_string`](crate::keys::canonical::to_string))
    /// first, so member order, whitespace and number spelling do not matter. The key is 64
    /// lowercase hex characters, HMAC-SHA-256 behind the tag
    /// `idempotent-retry:hmac-tool-call:v1` (the bytes: `docs/keys.md`). Like
    /// [`derive`](Self::derive), this encoding is a compatibility promise.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::DerivationSecret;
    /// use serde_json::json;
    ///
    /// let secret = DerivationSecret::new(*b"0123456789abcdef0123456789abcdef")?;
    /// let one = secret.for_tool_call("create_invoice", &json!({ "a": 1, "b": 2 }));
    /// let two = secret.for_tool_call("create_invoice", &json!({ "b": 2, "a": 1.0 }));
    /// assert_eq!(one, two);
    /// # Ok::<(), idempotent_retry::InvalidSecret>(())
    /// ```
    #[must_use]
    pub fn for_tool_call(&self, tool: &str, args: &serde_json::Value) -> IdempotencyKey {
        let mut mac = self.mac.clone();
        encode_tool_call(&mut mac, KEYED_TOOL_CALL_TAG, tool, args);
        IdempotencyKey::from_digest(&mac.finalize().into_bytes())
    }
}

/// The error returned when a [`DerivationSecret`] is too short.
///
/// Its message gives the length, never the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the derivation secret is {len} bytes long, at least {min} are needed",
    min = DerivationSecret::MIN_LEN
)]
pub struct InvalidSecret {
    len: usize,
}

impl InvalidSecret {
    /// The length in bytes of the refused secret.
    #[must_use]
    pub fn secret_len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

    fn secret(bytes: &[u8]) -> DerivationSecret {
        DerivationSecret::new(bytes).expect("long enough")
    }

    // Golden vectors: a compatibility promise, like the unkeyed ones. The expected values were
    // computed independently of this crate, with Python's `hmac` and `hashlib` modules over the
    // documented encoding (`hmac.new(secret, tag + u64be(len(scope)) + scope + u64be(n) +
    // u64be(len(part)) + part ..., hashlib.sha256).hexdigest()`). If one fails, the derivation
    // changed: that needs a new major version and a new tag, not an updated literal.

    #[test]
    fn golden_keyed_derive() {
        let cases: [(&[u8], &str, &[&str], &str); 7] = [
            (
                SECRET,
                "agent.send_email",
                &["conv_42", "7"],
                "d8b515e64120a96a86e29b48037f79309ded05ed54bd7e76cef34534836a0e05",
            ),
            (
                SECRET,
                "",
                &[],
                "0d3bd6b0ee7765ec069c3bf6aeb4b1938eb9dd6cd46c80101269853ff209bba5",
            ),
            (
                SECRET,
                "",
                &[""],
                "09ea0a261942926fe1b0bffa5efcde323022f776c52a91e975516212a5339d08",
            ),
            (
                SECRET,
                "webhook.stripe",
                &["evt_123", "\u{e9}\u{1f600}"],
                "6d09e00f6e8810d510824a4da847ae05222605e091e11f2c5de5ab7fce20be11",
            ),
            (
                &[
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                    22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                ],
                "",
                &[],
                "dcf49892f9269d2ccdab85922365a01f83bd49d0b8976ebfe5e4685c7e7cd5d5",
            ),
            (
                &[
                    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                    22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                ],
                "webhook.stripe",
                &["evt_123", "\u{e9}\u{1f600}"],
                "00a0489742c8dd049a01f8be4e2ce153415aa031fb058284e5b10240ed4b0d6a",
            ),
            // A secret longer than SHA-256's 64-byte block is hashed first (RFC 2104).
            (
                &[0xa5; 100],
                "webhook.stripe",
                &["evt_123", "\u{e9}\u{1f600}"],
                "628a2425059f83d6dbb2e22bdbb18de51107bb0319843d7780793f4c609dccae",
            ),
        ];
        for (bytes, scope, parts, expected) in cases {
            assert_eq!(
                secret(bytes).derive(scope, parts).as_str(),
                expected,
                "{scope:?} {parts:?}"
            );
        }
    }

    #[test]
    fn golden_keyed_tool_call() {
        let args = json!({ "b": [true, null, "x"], "a": 1.0 });
        assert_eq!(
            secret(SECRET)
                .for_tool_call("create_invoice", &args)
                .as_str(),
            "ec1acf62e76d7dc8c8c56e33982b0632a6c84ceeda6363eb4df931f217c757c4"
        );
        assert_eq!(
            secret(SECRET).for_tool_call("", &json!(null)).as_str(),
            "4f9526f34b8c4ffe050ddb59b81d25ab2a43c6873010fb21c28370a4e2348875"
        );
        assert_eq!(
            secret(&[0xa5; 100])
                .for_tool_call("create_invoice", &args)
                .as_str(),
            "0481cefb6b018f657672b69aeeae8e787f84caa9da4988e65d7be057f5d46cac"
        );
        assert_eq!(
            secret(&[0xa5; 100])
                .for_tool_call("", &json!(null))
                .as_str(),
            "8e0b32e1b0c7cb3a01082fa8d065e14d310a0a82167f5bc2d6d7b92e8a82bf0a"
        );
    }

    #[test]
    fn keyed_keys_differ_from_unkeyed_and_between_secrets_and_tags() {
        let one = secret(SECRET);
        let two = secret(&[0x42; 32]);
        let key = one.derive("s", &["p"]);
        assert_ne!(key, IdempotencyKey::derive("s", &["p"]));
        assert_ne!(key, two.derive("s", &["p"]));
        assert_eq!(key, one.clone().derive("s", &["p"]));
        let args = json!({ "p": 1 });
        assert_ne!(
            one.for_tool_call("s", &args),
            IdempotencyKey::for_tool_call("s", &args)
        );
        // The same bytes under the two keyed tags give two keys.
        assert_ne!(
            one.for_tool_call("t", &json!("x")),
            one.derive("t", &["\"x\""])
        );
        // Empty, absent and repeated empty parts stay distinct, as in the unkeyed encoding.
        let empties = [
            one.derive("", &[]),
            one.derive("", &[""]),
            one.derive("", &["", ""]),
            one.derive("a", &[]),
            one.derive("", &["a"]),
        ];
        for (i, a) in empties.iter().enumerate() {
            for b in &empties[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }

    #[test]
    fn short_secrets_are_refused_with_their_length_only() {
        for len in [0, 1, 16, 31] {
            let error = DerivationSecret::new(vec![0x73; len]).expect_err("too short");
            assert_eq!(error.secret_len(), len);
            assert!(!error.to_string().contains("sss"), "{error}");
        }
        assert!(DerivationSecret::new([0u8; 32]).is_ok());
        assert!(DerivationSecret::new(vec![0u8; 1 << 20]).is_ok());
        assert_eq!(DerivationSecret::MIN_LEN, 32);
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let shown = format!("{:?} {:#?}", secret(SECRET), secret(SECRET));
        assert!(!shown.contains("0123"), "{shown}");
        assert!(!shown.contains("48"), "{shown}");
        assert_eq!(format!("{:?}", secret(SECRET)), "DerivationSecret { .. }");
    }

    #[test]
    fn types_are_send_sync() {
        fn check<T: Send + Sync + Clone + fmt::Debug + 'static>() {}
        check::<DerivationSecret>();
        check::<InvalidSecret>();
    }
}
