//! What a PostgreSQL or pool failure means to the ledger's caller: the storage has another
//! shape than this crate wrote ([`Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt)), or it cannot
//! be reached as configured ([`Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable)).

use deadpool_postgres::{PoolError, TimeoutType};
use tokio_postgres::error::SqlState;

use idempotent_retry_ledger::LedgerError;

/// Whether the error says the storage has another shape than this crate wrote: a missing
/// table, column or function, a column of another type.
pub(super) fn is_shape(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_COLUMN
            || *code == SqlState::UNDEFINED_FUNCTION
            || *code == SqlState::DATATYPE_MISMATCH
    })
}

/// Classifies a statement's failure: a missing table or column means the storage is not what
/// this crate wrote; everything else (a lost connection, a refused login, a full disk) means
/// it is unavailable.
pub(super) fn database(err: tokio_postgres::Error, what: &str) -> LedgerError {
    classify(&err, what).with_source(err)
}

/// [`database`]'s classification, leaving the source to the caller (one error shared by the
/// calls of a batch).
pub(super) fn classify(err: &tokio_postgres::Error, what: &str) -> LedgerError {
    if let Some(message) = err.code().and_then(|code| shape_message(code, what)) {
        return LedgerError::corrupt(message);
    }
    let message = if err.is_closed() {
        format!("{what}: the connection is closed")
    } else {
        what.to_owned()
    };
    if is_shape(err) {
        LedgerError::corrupt(message)
    } else {
        LedgerError::unavailable(message)
    }
}

/// What a missing table or column means, and the fix, for a person: a database never
/// migrated, or migrated by an older release.
fn shape_message(code: &SqlState, what: &str) -> Option<String> {
    let table = idempotent_retry_ledger::sql::TABLE;
    if *code == SqlState::UNDEFINED_TABLE {
        Some(format!(
            "{what}: table {table} is missing: run `PostgresLedger::migrate()` once (or \
             `idempotent-retry-ledger --postgres URL migrate`)"
        ))
    } else if *code == SqlState::UNDEFINED_COLUMN {
        Some(format!(
            "{what}: table {table} lacks a column this release reads (an older schema): run \
             `PostgresLedger::migrate()` once every worker runs this release"
        ))
    } else if *code == SqlState::UNDEFINED_FUNCTION {
        Some(format!(
            "{what}: the database lacks the function idempotent_retry_enqueue (a schema \
             older than version 8): run `PostgresLedger::migrate()` once (or \
             `idempotent-retry-ledger --postgres URL migrate`)"
        ))
    } else {
        None
    }
}

/// Classifies a failure to get a connection from the pool: a new connection that could not
/// be opened (refused, login denied, an untrusted certificate, too slow), or a closed pool.
pub(super) fn pool(err: PoolError) -> LedgerError {
    match err {
        PoolError::Backend(err) => connect(err),
        PoolError::Timeout(TimeoutType::Create) => {
            LedgerError::unavailable("cannot connect: the connect timeout passed").with_source(err)
        }
        PoolError::Timeout(_) => {
            LedgerError::unavailable("no pooled connection came free in time").with_source(err)
        }
        PoolError::Closed => {
            LedgerError::unavailable("the connection pool is closed").with_source(err)
        }
        other => LedgerError::unavailable("cannot get a pooled connection").with_source(other),
    }
}

/// Classifies a failure to open a connection.
fn connect(err: tokio_postgres::Error) -> LedgerError {
    #[cfg(feature = "rustls")]
    if super::tls::is_untrusted_certificate(&err) {
        return LedgerError::unavailable(
            "cannot connect: the server's TLS certificate is not trusted (see the TLS \
             certificates the ledger was given)",
        )
        .with_source(err);
    }
    database(err, "cannot connect")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_table_or_column_names_the_fix() {
        assert_eq!(
            shape_message(&SqlState::UNDEFINED_TABLE, "cannot claim the operation").as_deref(),
            Some(
                "cannot claim the operation: table idempotent_operations is missing: run \
                 `PostgresLedger::migrate()` once (or `idempotent-retry-ledger --postgres URL \
                 migrate`)"
            )
        );
        let old = shape_message(&SqlState::UNDEFINED_COLUMN, "cannot list").expect("a message");
        assert!(old.contains("an older schema"), "{old}");
        assert_eq!(shape_message(&SqlState::UNIQUE_VIOLATION, "x"), None);
    }
}
