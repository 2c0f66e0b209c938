//! Keys and fingerprints: the idempotency key type, its derivation (plain SHA-256 in `key.rs`,
//! secret-keyed HMAC in `keyed.rs`), canonical JSON (`canonical.rs`, RFC 8785) that tool-call
//! keys hash, and the request fingerprint that tells the ledger whether a key's request is the
//! same (`fingerprint.rs`). Pure: no clock, no I/O.
//!
//! May import: nothing.

pub mod canonical;
pub(crate) mod fingerprint;
pub(crate) mod key;
pub(crate) mod keyed;
