//! The outbox in SQLite: an operation queued on the caller's own connection to the ledger's
//! file, inside the caller's transaction, and the due rows a dispatcher reads back.

use rusqlite::{Connection, OptionalExtension, params};

use idempotent_retry_ledger::outbox::{
    Backlog, DueQuery, Enqueued, QueuedOperation, key_taken, not_migrated,
};
use idempotent_retry_ledger::sql::{BACKLOG_QUERY, QueuedRow, TABLE, due_query};
use idempotent_retry_ledger::{LedgerError, OperationStatus, later, to_millis};

use super::storage;

/// Queues `operation` on `conn`: the caller's connection to the ledger's file, inside the
/// transaction that writes the caller's own rows (pass the `rusqlite::Transaction`; it
/// dereferences to a `Connection`). A rollback leaves nothing; once the transaction commits,
/// a dispatcher sends the operation under its key when it is due.
///
/// An enqueue of a key whose row is the same request (a retried transaction, or the operation
/// already sent) writes nothing and answers [`Enqueued::Already`] with the row's status.
///
/// # Errors
///
/// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput)
/// when the key's row is another request's;
/// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the
/// file's table is missing or older than the outbox (run `migrate()`: `SqliteLedger::open`
/// does); [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable)
/// when SQLite fails (a lock held past the connection's busy timeout).
pub fn enqueue(conn: &Connection, operation: &QueuedOperation) -> Result<Enqueued, LedgerError> {
    let queued_at = to_millis(operation.queued_at);
    let not_before = to_millis(operation.not_before.max(operation.queued_at));
    let expires_at = to_millis(later(
        operation.not_before.max(operation.queued_at),
        operation.retention,
    ));
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, first_attempt_at, \
             expires_at, method, url, queued_at, not_before, request_headers, request_body) \
             VALUES (?1, ?2, ?3, 'queued', 0, ?4, ?5, ?6, ?7, ?4, ?8, ?9, ?10) \
             ON CONFLICT (key) DO NOTHING"
        ))
        .and_then(|mut statement| {
            statement.execute(params![
                operation.key,
                operation.scope,
                operation.fingerprint,
                queued_at,
                expires_at,
                operation.method,
                operation.url,
                not_before,
                operation.headers_json(),
                operation.body,
            ])
        })
        .map_err(|err| match err {
            rusqlite::Error::SqliteFailure(_, Some(ref message))
                if message.contains("no such table") || message.contains("no column") =>
            {
                not_migrated(message)
            }
            other => storage(other, "cannot queue the operation"),
        })?;
    if inserted == 1 {
        return Ok(Enqueued::Queued);
    }
    let existing: Option<(String, String)> = conn
        .prepare_cached(&format!(
            "SELECT fingerprint, status FROM {TABLE} WHERE key = ?1"
        ))
        .and_then(|mut statement| {
            statement
                .query_row(params![operation.key], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(|err| storage(err, "cannot read the key's row"))?;
    match existing {
        Some((fingerprint, status)) if fingerprint == operation.fingerprint => {
            Ok(Enqueued::Already(status.parse::<OperationStatus>()?))
        }
        Some((_, status)) => Err(key_taken(&operation.key, &status)),
        // Deleted between the two statements: only a purge does that, and not inside the
        // caller's transaction, which holds the write lock.
        None => Err(LedgerError::unavailable(format!(
            "the row of {} vanished while it was queued: queue it again",
            operation.key
        ))),
    }
}

/// The operations `query` selects.
pub(super) fn due(
    conn: &Connection,
    query: &DueQuery,
) -> Result<Vec<QueuedOperation>, LedgerError> {
    let rows: Vec<QueuedRow> = conn
        .prepare_cached(&due_query("?1", "?2", "?3", "?4"))
        .and_then(|mut statement| {
            let bound = params![
                to_millis(query.now),
                i64::from(query.limit),
                query.not_sent_after_ms(),
                query.unknown_after_ms(),
            ];
            statement
                .query_map(bound, |row| {
                    Ok(QueuedRow {
                        key: row.get(0)?,
                        scope: row.get(1)?,
                        fingerprint: row.get(2)?,
                        method: row.get(3)?,
                        url: row.get(4)?,
                        request_headers: row.get(5)?,
                        request_body: row.get(6)?,
                        queued_at: row.get(7)?,
                        not_before: row.get(8)?,
                        expires_at: row.get(9)?,
                        status: row.get(10)?,
                    })
                })?
                .collect()
        })
        .map_err(|err| storage(err, "cannot read the due operations"))?;
    rows.into_iter().map(QueuedRow::into_operation).collect()
}

/// The backlog at `now`.
pub(super) fn backlog(
    conn: &Connection,
    now: std::time::SystemTime,
) -> Result<Backlog, LedgerError> {
    let (count, oldest): (i64, Option<i64>) = conn
        .prepare_cached(BACKLOG_QUERY)
        .and_then(|mut statement| statement.query_row([], |row| Ok((row.get(0)?, row.get(1)?))))
        .map_err(|err| storage(err, "cannot count the queued operations"))?;
    let now = to_millis(now);
    Ok(Backlog::new(
        u64::try_from(count).unwrap_or(0),
        oldest.map(|at| {
            std::time::Duration::from_millis(u64::try_from(now.saturating_sub(at)).unwrap_or(0))
        }),
    ))
}
