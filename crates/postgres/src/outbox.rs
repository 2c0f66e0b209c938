//! The outbox in PostgreSQL: an operation queued inside the caller's own transaction, announced
//! to listening dispatchers when that commits, and the due rows a dispatcher reads back.

use std::sync::LazyLock;
use std::time::Duration;

use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use idempotent_retry_ledger::outbox::{
    Backlog, DueQuery, Enqueued, QueuedOperation, TakeDue, Taken, key_taken,
};
use idempotent_retry_ledger::sql::{COLUMN_COUNT, QueuedRow, TABLE};
use idempotent_retry_ledger::{LedgerError, OperationStatus, later, millis_after, to_millis};

use super::failure::database;
use super::row::read_row;
use super::statements;
pub use super::statements::QUEUED_CHANNEL;

/// Queues `operation` inside the caller's transaction (a `tokio_postgres::Transaction`, or a
/// `deadpool_postgres::Transaction` through `&*tx`; a plain client queues it at once). Its
/// times are the database's: due `operation.not_before - operation.queued_at` after the
/// statement, kept `operation.retention` after that. A rollback leaves nothing; at commit,
/// dispatchers that listen on `idempotent_retry_queued` are woken, and one sends it under its
/// key.
///
/// An enqueue of a key whose row is the same request (a retried transaction, or the operation
/// already sent) writes nothing and answers [`Enqueued::Already`] with the row's status.
///
/// # Errors
///
/// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput)
/// when the key's row is another request's;
/// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the
/// table is missing or older than the outbox (run `PostgresLedger::migrate`);
/// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable)
/// when the statement fails (the transaction is then aborted, as PostgreSQL does).
pub async fn enqueue(
    client: &impl GenericClient,
    operation: &QueuedOperation,
) -> Result<Enqueued, LedgerError> {
    let what = "cannot queue the operation";
    let bound = EnqueueParams::of(operation);
    let params: [(&(dyn ToSql + Sync), Type); 9] = [
        (&operation.key, Type::TEXT),
        (&operation.scope, Type::TEXT),
        (&operation.fingerprint, Type::TEXT),
        (&bound.delay_ms, Type::INT8),
        (&bound.kept_ms, Type::INT8),
        (&operation.method, Type::TEXT),
        (&operation.url, Type::TEXT),
        (&bound.headers, Type::TEXT),
        (&operation.body, Type::BYTEA),
    ];
    let inserted = client
        .query_typed(statements::ENQUEUE, &params)
        .await
        .map_err(|err| database(err, what))?
        .pop();
    if inserted.is_some() {
        return Ok(Enqueued::Queued);
    }
    let existing = client
        .query_opt(EXISTING.as_str(), &[&operation.key])
        .await
        .map_err(|err| database(err, "cannot read the key's row"))?
        .map(|row| (row.get(0), row.get(1)));
    found(operation, existing)
}

/// The enqueue statement, for a driver of the caller's own (sqlx): parameters `$1` to `$9`
/// are the key, scope, fingerprint, [`EnqueueParams::delay_ms`], [`EnqueueParams::kept_ms`],
/// method, URL, [`EnqueueParams::headers`] and body; a row back means it was inserted.
#[must_use]
pub fn enqueue_statement() -> &'static str {
    statements::ENQUEUE
}

/// The statement that reads the fingerprint and status of a key's row (`$1`), after an
/// enqueue that inserted nothing.
pub static EXISTING: LazyLock<String> =
    LazyLock::new(|| format!("SELECT fingerprint, status FROM {TABLE} WHERE key = $1"));

/// The values [`enqueue_statement`] takes besides the operation's own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnqueueParams {
    /// Milliseconds from the statement until it is due (at most a century).
    pub delay_ms: i64,
    /// Milliseconds from the statement until the row may be purged once sent.
    pub kept_ms: i64,
    /// The headers as JSON.
    pub headers: String,
}

impl EnqueueParams {
    /// The values for `operation`.
    #[must_use]
    pub fn of(operation: &QueuedOperation) -> Self {
        let delay_ms = millis(
            operation
                .not_before
                .duration_since(operation.queued_at)
                .unwrap_or_default(),
        );
        EnqueueParams {
            delay_ms,
            kept_ms: delay_ms
                .saturating_add(millis(operation.retention))
                .min(CENTURY_MS),
            headers: operation.headers_json(),
        }
    }
}

/// What an enqueue that inserted nothing found: the key's row (fingerprint, status) is the
/// same request's ([`Enqueued::Already`]) or another's (refused).
///
/// # Errors
///
/// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput)
/// for another request's row; [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable)
/// when the row is gone (purged between the statements); a corrupt status.
pub fn found(
    operation: &QueuedOperation,
    existing: Option<(String, String)>,
) -> Result<Enqueued, LedgerError> {
    match existing {
        Some((fingerprint, status)) if fingerprint == operation.fingerprint => {
            Ok(Enqueued::Already(status.parse::<OperationStatus>()?))
        }
        Some((_, status)) => Err(key_taken(&operation.key, &status)),
        None => Err(LedgerError::unavailable(format!(
            "the row of {} vanished while it was queued (purged by hand?): queue it again",
            operation.key
        ))),
    }
}

/// A century in milliseconds: the longest delay or retention an enqueue stores, so the
/// statement's sums never leave BIGINT.
const CENTURY_MS: i64 = 100 * 365 * 86_400_000;

/// A length in milliseconds, at most a century.
fn millis(length: Duration) -> i64 {
    i64::try_from(length.as_millis())
        .unwrap_or(i64::MAX)
        .min(CENTURY_MS)
}

/// The operations `query` selects, at the present `base` (or the database's).
pub(super) async fn due(
    client: &deadpool_postgres::Object,
    base: Option<i64>,
    query: &DueQuery,
) -> Result<Vec<QueuedOperation>, LedgerError> {
    let what = "cannot read the due operations";
    let statement = client
        .prepare_cached(&statements::DUE)
        .await
        .map_err(|err| database(err, what))?;
    let rows = client
        .query(
            &statement,
            &[
                &base,
                &i64::from(query.limit),
                &query.not_sent_after_ms(),
                &query.unknown_after_ms(),
            ],
        )
        .await
        .map_err(|err| database(err, what))?;
    let decode = |err: tokio_postgres::Error| {
        LedgerError::corrupt("cannot decode a due operation's row").with_source(err)
    };
    rows.iter()
        .map(|row| {
            QueuedRow {
                key: row.try_get(0).map_err(decode)?,
                scope: row.try_get(1).map_err(decode)?,
                fingerprint: row.try_get(2).map_err(decode)?,
                method: row.try_get(3).map_err(decode)?,
                url: row.try_get(4).map_err(decode)?,
                request_headers: row.try_get(5).map_err(decode)?,
                request_body: row.try_get(6).map_err(decode)?,
                queued_at: row.try_get(7).map_err(decode)?,
                not_before: row.try_get(8).map_err(decode)?,
                expires_at: row.try_get(9).map_err(decode)?,
                status: row.try_get(10).map_err(decode)?,
            }
            .into_operation()
        })
        .collect()
}

/// The backlog at the present (`base`, or the database's).
pub(super) async fn backlog(
    client: &deadpool_postgres::Object,
    base: Option<i64>,
) -> Result<Backlog, LedgerError> {
    let what = "cannot count the queued operations";
    let statement = client
        .prepare_cached(&statements::BACKLOG)
        .await
        .map_err(|err| database(err, what))?;
    let row = client
        .query_one(&statement, &[&base])
        .await
        .map_err(|err| database(err, what))?;
    let count: i64 = row.try_get(0).map_err(|err| database(err, what))?;
    let age: Option<i64> = row.try_get(1).map_err(|err| database(err, what))?;
    Ok(Backlog::new(
        u64::try_from(count).unwrap_or(0),
        age.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
    ))
}

/// The due rows `take` selects, taken in one statement at the present (`base`, or the
/// database's): queued rows alone when the query asks for them alone.
pub(super) async fn take_due(
    client: &deadpool_postgres::Object,
    base: Option<i64>,
    take: &TakeDue,
) -> Result<Vec<Taken>, LedgerError> {
    let what = "cannot take the due operations";
    let query = &take.query;
    let text = if query.queued_only {
        &statements::TAKE_QUEUED
    } else {
        &statements::TAKE_DUE
    };
    let statement = client
        .prepare_cached(text)
        .await
        .map_err(|err| database(err, what))?;
    let rows = client
        .query(
            &statement,
            &[
                &base,
                &query.not_sent_after_ms(),
                &query.unknown_after_ms(),
                &i64::from(query.limit),
                &millis_after(take.window_cutoff, query.now),
                &take.owner,
                &millis_after(later(query.now, take.lease), query.now),
                &millis_after(later(query.now, take.retention), query.now),
            ],
        )
        .await
        .map_err(|err| database(err, what))?;
    let decode = |err: tokio_postgres::Error| {
        LedgerError::corrupt("cannot decode a taken operation's row").with_source(err)
    };
    rows.iter()
        .map(|row| {
            let record = read_row(row)?;
            let previous: String = row.try_get(COLUMN_COUNT).map_err(decode)?;
            let previous = previous.parse::<OperationStatus>()?;
            let operation = QueuedRow {
                key: record.key.clone(),
                scope: record.scope.clone(),
                fingerprint: record.fingerprint.clone(),
                method: record.method.clone(),
                url: record.url.clone(),
                request_headers: row.try_get(COLUMN_COUNT + 1).map_err(decode)?,
                request_body: row.try_get(COLUMN_COUNT + 2).map_err(decode)?,
                queued_at: row.try_get(COLUMN_COUNT + 3).map_err(decode)?,
                not_before: row.try_get(COLUMN_COUNT + 4).map_err(decode)?,
                expires_at: to_millis(record.expires_at),
                status: previous.as_str().to_owned(),
            }
            .into_operation()?;
            Ok(Taken::new(operation, record, previous))
        })
        .collect()
}
