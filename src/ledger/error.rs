//! The ledger's error type.

use std::error::Error as StdError;
use std::fmt;

use crate::error::{Error, ErrorKind};
use crate::report::RetryReport;

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
    /// this release knows (see the [schema docs](crate::Ledger#schema)).
    Corrupt,
    /// The run's lease lapsed and another run took the operation over.
    LeaseLost,
    /// An argument was refused (a purge limit of 0, say).
    InvalidInput,
    /// The ledger does not implement the method (a ledger written before it existed, which
    /// kept the trait's provided method).
    Unsupported,
}

impl fmt::Display for LedgerErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LedgerErrorKind::Unavailable => "ledger unavailable",
            LedgerErrorKind::Corrupt => "ledger storage is corrupt",
            LedgerErrorKind::LeaseLost => "lease lost",
            LedgerErrorKind::InvalidInput => "invalid ledger input",
            LedgerErrorKind::Unsupported => "not supported by this ledger",
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

    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn unavailable(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::Unavailable, message)
    }

    pub(crate) fn corrupt(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::Corrupt, message)
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        LedgerError::new(LedgerErrorKind::InvalidInput, message)
    }

    pub(crate) fn unsupported(method: &str) -> Self {
        LedgerError::new(
            LedgerErrorKind::Unsupported,
            format!("this ledger does not implement Ledger::{method}"),
        )
    }

    pub(crate) fn lease_lost(key: &str) -> Self {
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

impl Error {
    /// An [`ErrorKind::Ledger`] error: the operation, as far as it got, with the ledger's
    /// failure as the source.
    pub(crate) fn ledger(
        report: RetryReport,
        outcome_unknown: bool,
        message: impl Into<String>,
        source: LedgerError,
    ) -> Self {
        // The ledger's own words in the message too: "table ... is missing: run migrate()"
        // must reach a person who prints the error, not only one who walks its sources.
        let message = format!("{} ({source})", message.into());
        Error::operation(ErrorKind::Ledger, report, outcome_unknown)
            .with_message(message)
            .with_source(source)
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
