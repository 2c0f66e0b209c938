//! The ledger's error type.

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Why a ledger operation failed. Match with a wildcard arm: new kinds may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LedgerErrorKind {
    /// The storage could not be reached or written: a lost connection, a locked or read-only
    /// database, a full disk, an I/O error. Usually transient.
    Unavailable,
    /// The storage holds something this crate cannot read: a file that is not a database, a
    /// table with another shape, a row with an impossible value, a schema version newer than
    /// this release knows (schema versions: `docs/ledger.md`).
    Corrupt,
    /// The run's lease lapsed and another run took the operation over.
    LeaseLost,
    /// An argument was refused (a purge limit of 0, say).
    InvalidInput,
    /// A saved answer is sealed and no configured key opens it: the message names the key id
    /// it needs and where to configure it. Nothing was sent.
    Sealed,
}

impl fmt::Display for LedgerErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LedgerErrorKind::Unavailable => "ledger unavailable",
            LedgerErrorKind::Corrupt => "ledger storage is corrupt",
            LedgerErrorKind::LeaseLost => "lease lost",
            LedgerErrorKind::InvalidInput => "invalid ledger input",
            LedgerErrorKind::Sealed => "sealed answer not opened",
        })
    }
}

/// A ledger operation failed. The [`source`](StdError::source) is the storage driver's error,
/// when there is one.
#[derive(Debug)]
pub struct LedgerError {
    kind: LedgerErrorKind,
    message: String,
    source: Option<BoxError>,
}

impl LedgerError {
    /// An error of `kind` with a message (lowercase, no trailing period).
    pub fn new(kind: LedgerErrorKind, message: impl Into<String>) -> Self {
        LedgerError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the underlying error.
    #[must_use]
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// An [`Unavailable`](LedgerErrorKind::Unavailable) error with a message.
    pub fn unavailable(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::Unavailable, message)
    }

    /// A [`Corrupt`](LedgerErrorKind::Corrupt) error with a message.
    pub fn corrupt(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::Corrupt, message)
    }

    /// An [`InvalidInput`](LedgerErrorKind::InvalidInput) error with a message.
    pub fn invalid(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::InvalidInput, message)
    }

    /// A [`LeaseLost`](LedgerErrorKind::LeaseLost) error: operation `key` is no longer held
    /// by the caller's run.
    pub fn lease_lost(key: &str) -> Self {
        LedgerError::new(
            LedgerErrorKind::LeaseLost,
            format!("operation {key} is no longer held by this run"),
        )
    }

    /// Why it failed.
    #[must_use]
    pub fn kind(&self) -> LedgerErrorKind {
        self.kind
    }

    /// What happened, in words (the display without the kind's prefix).
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl StdError for LedgerError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_message_and_keeps_the_source() {
        let io = std::io::Error::other("disk full");
        let err = LedgerError::unavailable("cannot record the attempt").with_source(io);
        assert_eq!(
            err.to_string(),
            "ledger unavailable: cannot record the attempt"
        );
        assert_eq!(
            err.source().map(ToString::to_string).as_deref(),
            Some("disk full")
        );
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<LedgerError>();
    }
}
