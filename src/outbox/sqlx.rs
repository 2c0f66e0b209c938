//! Queuing in PostgreSQL through sqlx: inside the caller's own `sqlx::Transaction<'_,
//! Postgres>`, announced to listening dispatchers when it commits. The statement is the one
//! `outbox::postgres::enqueue` runs; only the driver differs.

use super::enqueue::not_queued;
use crate::keys::key::IdempotencyKey;
use crate::ledger::LedgerError;
use crate::ledger::outbox::Enqueued;
use crate::outcome::error::Error;
use crate::time::{Clock as _, TokioClock};

use idempotent_retry_postgres::outbox::{EXISTING, EnqueueParams, enqueue_statement, found};

pub use sqlx;

/// Queues `operation` on `conn`: the connection of the caller's open transaction (pass
/// `&mut *tx` for a `sqlx::Transaction<'_, Postgres>`; a connection outside a transaction
/// queues it at once), and returns its key with what was found. Everything else is as
/// `outbox::postgres::enqueue`: the database's clock, a `NOTIFY` delivered at the commit.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotent_retry::outbox::{self, Enqueue};
///
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id, amount) VALUES ('ord_42', 1200)").execute(&mut *tx).await?;
/// let (key, _) = outbox::sqlx::enqueue(
///     &mut tx,
///     &Enqueue::post("https://api.example.com/v1/charges").json(&serde_json::json!({"order": "ord_42"})),
/// )
/// .await?;
/// tx.commit().await?;
/// # let _ = key; Ok(()) }
/// ```
///
/// # Errors
///
/// As `outbox::postgres::enqueue`: [`ErrorKind::Builder`](crate::ErrorKind::Builder) for an
/// operation `Enqueue` refuses; [`ErrorKind::Ledger`](crate::ErrorKind::Ledger) for another
/// request's key, a table missing or older than the outbox (run `PostgresLedger::migrate`),
/// or a failed statement (PostgreSQL then aborts the transaction).
pub async fn enqueue(
    conn: &mut sqlx::PgConnection,
    operation: &super::Enqueue,
) -> Result<(IdempotencyKey, Enqueued), Error> {
    let (key, row) = operation.operation(TokioClock::new().wall())?;
    let failed = |source: LedgerError| not_queued(&key, source);
    let bound = EnqueueParams::of(&row);
    let inserted = sqlx::query(enqueue_statement())
        .bind(&row.key)
        .bind(&row.scope)
        .bind(&row.fingerprint)
        .bind(bound.delay_ms)
        .bind(bound.kept_ms)
        .bind(&row.method)
        .bind(&row.url)
        .bind(&bound.headers)
        .bind(&row.body)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|err| failed(from_sqlx(err, "cannot queue the operation")))?;
    if inserted.is_some() {
        return Ok((key, Enqueued::Queued));
    }
    let existing: Option<(String, String)> = sqlx::query_as(EXISTING.as_str())
        .bind(&row.key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|err| failed(from_sqlx(err, "cannot read the key's row")))?;
    let found = found(&row, existing).map_err(failed)?;
    Ok((key, found))
}

/// A sqlx failure as the ledger's: a missing table or column (SQLSTATE 42P01, 42703) means
/// the store is not migrated; anything else that it is unavailable.
fn from_sqlx(err: sqlx::Error, what: &str) -> LedgerError {
    let code = err
        .as_database_error()
        .and_then(|db| db.code().map(|code| code.into_owned()));
    match code.as_deref() {
        Some("42P01" | "42703") => idempotent_retry_ledger::outbox::not_migrated(&err),
        _ => LedgerError::unavailable(what.to_owned()).with_source(err),
    }
}
