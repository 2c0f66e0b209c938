//! The outbox in SQLite: an operation queued on the caller's own connection to the ledger's
//! file, inside the caller's transaction, and the due rows a dispatcher reads back.

use std::sync::LazyLock;

use rusqlite::{Connection, OptionalExtension, params};

use idempotent_retry_ledger::outbox::{
    Backlog, DueQuery, Enqueued, QueuedOperation, TakeDue, Taken, key_taken, not_migrated,
};
use idempotent_retry_ledger::sql::{
    BACKLOG_QUERY, COLUMN_COUNT, COLUMNS, Dialect, QUEUED_COLUMNS, QueuedRow, RawRow, TABLE,
    as_stored, due_branches,
};
use idempotent_retry_ledger::{LedgerError, OperationStatus, later, to_millis};

use super::statements::read_row;
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
        .prepare_cached(&ENQUEUE)
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
        .prepare_cached(&ENQUEUED)
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

/// An enqueue's insert: the row queued, or nothing when the key has one already. Its text is
/// built once, so each enqueue's statement is found in the connection's cache by a lookup
/// alone.
static ENQUEUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, first_attempt_at, \
         expires_at, method, url, queued_at, not_before, request_headers, request_body) \
         VALUES (?1, ?2, ?3, 'queued', 0, ?4, ?5, ?6, ?7, ?4, ?8, ?9, ?10) \
         ON CONFLICT (key) DO NOTHING"
    )
});

/// What an enqueue that inserted nothing reads of the key's row.
static ENQUEUED: LazyLock<String> =
    LazyLock::new(|| format!("SELECT fingerprint, status FROM {TABLE} WHERE key = ?1"));

/// The operations `query` selects.
pub(super) fn due(
    conn: &Connection,
    query: &DueQuery,
) -> Result<Vec<QueuedOperation>, LedgerError> {
    let values: [&dyn rusqlite::ToSql; 4] = [
        &to_millis(query.now),
        &i64::from(query.limit),
        &query.not_sent_after_ms(),
        &query.unknown_after_ms(),
    ];
    let mut rows: Vec<QueuedRow> = Vec::new();
    for branch in &DUE_SELECT[..branches(query)] {
        rows.extend(
            branch_rows(conn, branch, &values, |row| {
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
            })
            .map_err(|err| storage(err, "cannot read the due operations"))?,
        );
    }
    rows.sort_by(|a, b| (a.not_before, &a.key).cmp(&(b.not_before, &b.key)));
    rows.truncate(usize::try_from(query.limit).unwrap_or(usize::MAX));
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

/// The due rows `take` selects, taken in one statement (the writer's rule: the `SELECT`
/// before it changes nothing, and nothing after it can fail): each row built as the
/// statement left it, by [`TakeDue::take`].
pub(super) fn take_due(conn: &Connection, take: &TakeDue) -> Result<Vec<Taken>, LedgerError> {
    let query = &take.query;
    let now = to_millis(query.now);
    let cutoff = to_millis(take.window_cutoff);
    let values: [&dyn rusqlite::ToSql; 5] = [
        &now,
        &query.not_sent_after_ms(),
        &query.unknown_after_ms(),
        &i64::from(query.limit),
        &cutoff,
    ];
    let mut rows: Vec<(RawRow, QueuedExtra)> = Vec::new();
    for branch in &TAKE_SELECT[..branches(query)] {
        rows.extend(
            branch_rows(conn, branch, &values, |row| {
                Ok((
                    read_row(row)?,
                    QueuedExtra {
                        headers: row.get(COLUMN_COUNT)?,
                        body: row.get(COLUMN_COUNT + 1)?,
                        queued_at: row.get(COLUMN_COUNT + 2)?,
                        not_before: row.get(COLUMN_COUNT + 3)?,
                    },
                ))
            })
            .map_err(|err| storage(err, "cannot read the due operations"))?,
        );
    }
    rows.sort_by(|(a, x), (b, y)| (x.not_before, &a.key).cmp(&(y.not_before, &b.key)));
    rows.truncate(usize::try_from(query.limit).unwrap_or(usize::MAX));
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // Decoded before the write, so nothing can fail after it.
    let mut taken = Vec::with_capacity(rows.len());
    for (raw, extra) in rows {
        let operation = QueuedRow {
            key: raw.key.clone(),
            scope: raw.scope.clone(),
            fingerprint: raw.fingerprint.clone(),
            method: raw.method.clone(),
            url: raw.url.clone(),
            request_headers: extra.headers,
            request_body: extra.body,
            queued_at: extra.queued_at,
            not_before: extra.not_before,
            expires_at: raw.expires_at,
            status: raw.status.clone(),
        }
        .into_operation()?;
        taken.push((operation, raw.into_record()?));
    }
    // The keys as parameters ?5, ?6, ..., padded with NULLs (which match no key) to a power
    // of two: a handful of statement texts, each prepared once.
    let slots = taken.len().next_power_of_two();
    let placeholders = (0..slots)
        .map(|n| format!("?{}", n + 5))
        .collect::<Vec<_>>()
        .join(", ");
    let lease_until = to_millis(later(query.now, take.lease));
    let kept_until = to_millis(later(query.now, take.retention));
    let none: Option<&str> = None;
    let mut values: Vec<&dyn rusqlite::ToSql> = vec![&take.owner, &lease_until, &now, &kept_until];
    values.extend(
        taken
            .iter()
            .map(|(operation, _)| &operation.key as &dyn rusqlite::ToSql),
    );
    values.resize(4 + slots, &none);
    conn.prepare_cached(&format!(
        "UPDATE {TABLE} SET status = 'in_flight', lease_owner = ?1, lease_expires_at = ?2, \
         response_status = NULL, response_headers = NULL, response_body = NULL, \
         response_url = NULL, response_key_id = NULL, \
         first_attempt_at = CASE WHEN status IN ('queued', 'not_sent') THEN ?3 \
         ELSE first_attempt_at END, \
         expires_at = CASE WHEN status IN ('queued', 'not_sent') THEN max(expires_at, ?4) \
         ELSE expires_at END \
         WHERE key IN ({placeholders})"
    ))
    .and_then(|mut statement| statement.execute(values.as_slice()))
    .map_err(|err| storage(err, "cannot take the due operations"))?;
    Ok(taken
        .into_iter()
        .map(|(operation, mut record)| {
            let previous = take.take(&mut record);
            Taken::new(operation, as_stored(record), previous)
        })
        .collect())
}

/// The due rows [`due`] reads; its parameters are the present, the limit, the `not_sent`
/// delay and the `unknown` delay.
pub(super) static DUE_SELECT: LazyLock<[String; 4]> = LazyLock::new(|| {
    due_branches(
        Dialect::Sqlite,
        QUEUED_COLUMNS,
        ("?1", "?2"),
        ("?3", "?4"),
        None,
    )
});

/// The due rows a take reads, with the ledger's columns and the outbox's; its parameters are
/// the present, the `not_sent` delay, the `unknown` delay, the limit and the window's cutoff.
pub(super) static TAKE_SELECT: LazyLock<[String; 4]> = LazyLock::new(|| {
    due_branches(
        Dialect::Sqlite,
        &format!("{COLUMNS}, request_headers, request_body, queued_at, not_before"),
        ("?1", "?4"),
        ("?2", "?3"),
        Some("?5"),
    )
});

/// How many of [`due_branches`]' statements `query` runs: the first (queued rows) alone when
/// it asks for queued rows only.
fn branches(query: &DueQuery) -> usize {
    if query.queued_only { 1 } else { 4 }
}

/// The rows of one of [`due_branches`]' statements, its parameters bound by their numbers
/// from `values` (each branch uses some of them).
fn branch_rows<T>(
    conn: &Connection,
    sql: &str,
    values: &[&dyn rusqlite::ToSql],
    mut read: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let mut statement = conn.prepare_cached(sql)?;
    for index in 1..=statement.parameter_count() {
        let value = values
            .get(index - 1)
            .ok_or(rusqlite::Error::InvalidParameterCount(index, values.len()))?;
        statement.raw_bind_parameter(index, value)?;
    }
    let mut rows = statement.raw_query();
    let mut read_rows = Vec::new();
    while let Some(row) = rows.next()? {
        read_rows.push(read(row)?);
    }
    Ok(read_rows)
}

/// The outbox's columns of a row read with the ledger's.
struct QueuedExtra {
    headers: Option<String>,
    body: Option<Vec<u8>>,
    queued_at: i64,
    not_before: Option<i64>,
}
