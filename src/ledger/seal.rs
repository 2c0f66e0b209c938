//! Sealed answers: a saved response's headers and body encrypted at rest with keys the
//! application provides (XChaCha20-Poly1305, a random 24-byte nonce per answer), bound to the
//! row they belong to (its idempotency key, request fingerprint and status are the associated
//! data), so a blob copied onto another row does not open. The first key seals; every key
//! opens, so keys rotate without a flag day. Why and how: `docs/ledger.md`, "Secrets at rest".

use std::fmt;

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};

use super::{LedgerError, LedgerErrorKind, SavedResponse};

/// The first byte of every sealed blob: the layout below (nonce, then ciphertext and tag).
const FORMAT: u8 = 1;
/// XChaCha20-Poly1305's nonce: 24 bytes, random per answer (no counter to keep across
/// processes, and 192 bits make a collision negligible at any volume).
const NONCE_LEN: usize = 24;
/// The longest key id: it is stored in every sealed row and printed by `ledger show`.
const MAX_ID_LEN: usize = 64;

/// A key that seals saved answers: its id, stored with each answer it seals, and 32 secret
/// bytes. Made with [`SealKey::new`] or parsed from `ID:HEX` ([`FromStr`](std::str::FromStr)).
/// Its `Debug` shows the id only.
#[derive(Clone, PartialEq, Eq)]
pub struct SealKey {
    id: String,
    secret: [u8; 32],
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Drop for SealKey {
    fn drop(&mut self) {
        // Best effort: the secret does not outlive the key in this value's memory.
        self.secret.fill(0);
        std::hint::black_box(&self.secret);
    }
}

/// A seal key was refused: the message says which part and the form expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid seal key: {reason}")]
pub struct InvalidSealKey {
    reason: String,
}

impl SealKey {
    /// A key named `id` (1 to 64 characters among letters, digits, `-`, `_` and `.`) with the
    /// 32 bytes `secret` (from a key manager, or 32 random bytes: `openssl rand -hex 32`).
    ///
    /// # Errors
    ///
    /// [`InvalidSealKey`] when the id is empty, too long or has another character.
    pub fn new(id: impl Into<String>, secret: [u8; 32]) -> Result<Self, InvalidSealKey> {
        let id = id.into();
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if id.is_empty() || id.len() > MAX_ID_LEN || !id.chars().all(allowed) {
            return Err(InvalidSealKey {
                reason: format!(
                    "its id {id:?} must be 1 to {MAX_ID_LEN} letters, digits, '-', '_' or '.'"
                ),
            });
        }
        Ok(SealKey { id, secret })
    }

    /// The key's id, stored with each answer it seals.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> XChaCha20Poly1305 {
        XChaCha20Poly1305::new(&self.secret.into())
    }
}

/// `ID:HEX`: the id, a colon, and the secret as 64 hexadecimal digits (`2025-06:9f86…`), the
/// form the Python and Node packages and `idemcurl` read.
impl std::str::FromStr for SealKey {
    type Err = InvalidSealKey;

    /// # Errors
    ///
    /// [`InvalidSealKey`] without a colon, with an id [`SealKey::new`] refuses, or with a
    /// secret that is not 64 hexadecimal digits (the message never repeats the secret).
    fn from_str(text: &str) -> Result<Self, InvalidSealKey> {
        let text = text.trim();
        let Some((id, hex)) = text.split_once(':') else {
            return Err(InvalidSealKey {
                reason: "expected ID:HEX (an id, a colon, and 64 hexadecimal digits of secret)"
                    .to_owned(),
            });
        };
        let secret = decode_hex(hex).ok_or_else(|| InvalidSealKey {
            reason: format!(
                "the secret of key {id:?} is not 64 hexadecimal digits (32 bytes: `openssl rand \
                 -hex 32` makes one)"
            ),
        })?;
        SealKey::new(id, secret)
    }
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let digits = hex.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let mut secret = [0u8; 32];
    for (byte, pair) in secret.iter_mut().zip(digits.chunks_exact(2)) {
        let high = char::from(pair[0]).to_digit(16)?;
        let low = char::from(pair[1]).to_digit(16)?;
        *byte = u8::try_from(high * 16 + low).ok()?;
    }
    Some(secret)
}

/// The associated data of a sealed answer: what it belongs to, each part length-prefixed.
fn associated_data(key_id: &str, key: &str, fingerprint: &str, status: u16) -> Vec<u8> {
    let mut aad = Vec::with_capacity(48 + key_id.len() + key.len() + fingerprint.len());
    aad.extend_from_slice(b"idempotent-retry sealed answer v1");
    for part in [key_id.as_bytes(), key.as_bytes(), fingerprint.as_bytes()] {
        aad.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
        aad.extend_from_slice(part);
    }
    aad.extend_from_slice(&status.to_be_bytes());
    aad
}

/// The headers and body as one plaintext: the headers' JSON and its length, then whether a
/// body was kept, then the body.
fn plaintext(saved: &SavedResponse) -> Vec<u8> {
    // Serializing pairs of strings cannot fail.
    let headers = serde_json::to_vec(&saved.headers).unwrap_or_default();
    let body = saved.body.as_deref();
    let mut plain = Vec::with_capacity(headers.len() + 5 + body.map_or(0, <[u8]>::len));
    plain.extend_from_slice(
        &u32::try_from(headers.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    plain.extend_from_slice(&headers);
    plain.push(u8::from(body.is_some()));
    plain.extend_from_slice(body.unwrap_or_default());
    plain
}

/// The headers and body back from [`plaintext`]'s form; `None` when it is not that form.
type Opened = (Vec<(String, String)>, Option<Vec<u8>>);

fn from_plaintext(plain: &[u8]) -> Option<Opened> {
    let (length, rest) = plain.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_be_bytes(*length)).ok()?;
    let (headers, rest) = rest.split_at_checked(length)?;
    let headers = serde_json::from_slice(headers).ok()?;
    let (&kept, body) = rest.split_first()?;
    match kept {
        0 if body.is_empty() => Some((headers, None)),
        1 => Some((headers, Some(body.to_vec()))),
        _ => None,
    }
}

/// `saved` sealed with the first of `keys` for the row of idempotency key `key` and request
/// `fingerprint`; as it is when `keys` is empty or it is sealed already.
pub(crate) fn seal(
    keys: &[SealKey],
    key: &str,
    fingerprint: &str,
    saved: SavedResponse,
) -> SavedResponse {
    let Some(sealer) = keys.first() else {
        return saved;
    };
    if saved.sealed_with.is_some() {
        return saved;
    }
    let mut nonce = [0u8; NONCE_LEN];
    rand::Rng::fill_bytes(&mut rand::rng(), &mut nonce);
    let aad = associated_data(sealer.id(), key, fingerprint, saved.status);
    let plain = plaintext(&saved);
    let sealed = sealer
        .cipher()
        .encrypt(
            &XNonce::from(nonce),
            Payload {
                msg: &plain,
                aad: &aad,
            },
        )
        .expect("XChaCha20-Poly1305 seals any message shorter than 256 GiB");
    let mut blob = Vec::with_capacity(1 + NONCE_LEN + sealed.len());
    blob.push(FORMAT);
    blob.extend_from_slice(&nonce);
    blob.extend_from_slice(&sealed);
    let key_id = sealer.id().to_owned();
    saved.sealed(key_id, blob)
}

/// `saved` opened with whichever of `keys` has its key id, for the row of idempotency key
/// `key` and request `fingerprint`; as it is when it is not sealed.
///
/// # Errors
///
/// [`LedgerErrorKind::Sealed`], naming the key id the answer needs and how to configure it,
/// when no key of `keys` has that id (none configured included), or when the key with that id
/// does not open it (another secret under the same id, or a blob altered or copied from
/// another row).
pub(crate) fn open(
    keys: &[SealKey],
    key: &str,
    fingerprint: &str,
    saved: SavedResponse,
) -> Result<SavedResponse, LedgerError> {
    let Some(key_id) = saved.sealed_with.as_deref() else {
        return Ok(saved);
    };
    let Some(opener) = keys.iter().find(|candidate| candidate.id() == key_id) else {
        let have = if keys.is_empty() {
            "none is configured".to_owned()
        } else {
            let ids: Vec<&str> = keys.iter().map(SealKey::id).collect();
            format!("those configured are {}", ids.join(", "))
        };
        return Err(LedgerError::new(
            LedgerErrorKind::Sealed,
            format!(
                "the saved answer of operation {key} is sealed with key id {key_id:?}, and {have}: \
                 add the key {key_id:?} to LedgerOptions::seal_keys (keep a retired key there \
                 until the rows it sealed expire); nothing was sent"
            ),
        ));
    };
    let refused = || {
        LedgerError::new(
            LedgerErrorKind::Sealed,
            format!(
                "the saved answer of operation {key} does not open with key id {key_id:?}: the \
                 key's secret is not the one that sealed it, or the row was altered or copied \
                 from another operation; configure the secret that sealed it under that id; \
                 nothing was sent"
            ),
        )
    };
    let blob = saved.body.as_deref().unwrap_or_default();
    let Some((&FORMAT, rest)) = blob.split_first() else {
        return Err(refused());
    };
    let Some((nonce, sealed)) = rest.split_first_chunk::<NONCE_LEN>() else {
        return Err(refused());
    };
    let aad = associated_data(key_id, key, fingerprint, saved.status);
    let plain = opener
        .cipher()
        .decrypt(
            &XNonce::from(*nonce),
            Payload {
                msg: sealed,
                aad: &aad,
            },
        )
        .map_err(|_| refused())?;
    let (headers, body) = from_plaintext(&plain).ok_or_else(refused)?;
    let mut opened = SavedResponse::new(saved.status, headers, body);
    opened.url = saved.url;
    Ok(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, byte: u8) -> SealKey {
        SealKey::new(id, [byte; 32]).expect("a valid key")
    }

    fn answer() -> SavedResponse {
        SavedResponse::new(
            201,
            vec![
                ("content-type".into(), "application/json".into()),
                ("set-cookie".into(), "a=1".into()),
                ("set-cookie".into(), "b=2".into()),
            ],
            Some(br#"{"api_key":"sk_live_CREATED"}"#.to_vec()),
        )
        .answered_at("https://h/v1/keys/7")
    }

    #[test]
    fn a_sealed_answer_opens_to_the_same_answer_and_hides_it() {
        let keys = [key("k2", 2), key("k1", 1)];
        for saved in [
            answer(),
            SavedResponse::new(200, Vec::new(), Some(Vec::new())),
            SavedResponse::new(200, vec![("content-length".into(), "9".into())], None),
        ] {
            let sealed = seal(&keys, "order-1", "f00d", saved.clone());
            assert_eq!(sealed.sealed_with.as_deref(), Some("k2"));
            assert!(sealed.headers.is_empty());
            let blob = sealed.body.clone().expect("ciphertext");
            assert!(!blob.windows(7).any(|w| w == b"sk_live"), "{blob:?}");
            let opened = open(&keys, "order-1", "f00d", sealed).expect("opens");
            assert_eq!(opened, saved);
        }
    }

    #[test]
    fn two_seals_of_one_answer_differ() {
        let keys = [key("k1", 1)];
        let a = seal(&keys, "k", "f", answer());
        let b = seal(&keys, "k", "f", answer());
        assert_ne!(a.body, b.body, "a fresh nonce each time");
    }

    #[test]
    fn rotation_opens_old_rows_and_seals_new_ones_with_the_first_key() {
        let old = seal(&[key("k1", 1)], "k", "f", answer());
        let rotated = [key("k2", 2), key("k1", 1)];
        assert_eq!(
            open(&rotated, "k", "f", old).expect("the old key opens it"),
            answer()
        );
        let new = seal(&rotated, "k", "f", answer());
        assert_eq!(new.sealed_with.as_deref(), Some("k2"));
        let err = open(&[key("k1", 1)], "k", "f", new).expect_err("k2 retired too early");
        assert_eq!(err.kind(), LedgerErrorKind::Sealed);
        assert!(err.to_string().contains("key id \"k2\""), "{err}");
        assert!(err.to_string().contains("those configured are k1"), "{err}");
    }

    #[test]
    fn a_missing_or_wrong_key_and_a_copied_blob_are_refused() {
        let sealed = seal(&[key("k1", 1)], "order-1", "f00d", answer());
        let missing = open(&[], "order-1", "f00d", sealed.clone()).expect_err("no keys");
        assert_eq!(missing.kind(), LedgerErrorKind::Sealed);
        assert!(
            missing.to_string().contains("none is configured"),
            "{missing}"
        );
        assert!(
            missing.to_string().contains("LedgerOptions::seal_keys"),
            "{missing}"
        );
        let wrong = open(&[key("k1", 9)], "order-1", "f00d", sealed.clone()).expect_err("wrong");
        assert!(
            wrong.to_string().contains("does not open with key id"),
            "{wrong}"
        );
        for (row, fingerprint) in [("order-2", "f00d"), ("order-1", "beef")] {
            let err = open(&[key("k1", 1)], row, fingerprint, sealed.clone()).expect_err("copied");
            assert_eq!(err.kind(), LedgerErrorKind::Sealed);
        }
        let mut status = sealed.clone();
        status.status = 200;
        assert!(open(&[key("k1", 1)], "order-1", "f00d", status).is_err());
        let mut cut = sealed;
        cut.body.as_mut().expect("blob").truncate(10);
        assert!(open(&[key("k1", 1)], "order-1", "f00d", cut).is_err());
    }

    #[test]
    fn keys_parse_from_id_and_hex_and_refuse_anything_else() {
        let hex = "00".repeat(31) + "ff";
        let parsed: SealKey = format!("2025-06:{hex}").parse().expect("valid");
        assert_eq!(parsed.id(), "2025-06");
        assert_eq!(
            parsed,
            SealKey::new("2025-06", {
                let mut secret = [0u8; 32];
                secret[31] = 0xff;
                secret
            })
            .expect("valid")
        );
        assert!(!format!("{parsed:?}").contains("ff"), "{parsed:?}");
        for bad in [
            hex.clone(),
            format!(":{hex}"),
            format!("k 1:{hex}"),
            "k:abc".to_owned(),
            format!("k:{}", "zz".repeat(32)),
        ] {
            let err = bad.parse::<SealKey>().expect_err("refused");
            assert!(err.to_string().starts_with("invalid seal key: "), "{err}");
            assert!(!err.to_string().contains(&"zz".repeat(32)), "{err}");
        }
    }
}
