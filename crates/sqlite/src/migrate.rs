//! Bringing a file to the crate's schema version: the steps from [`sql`](idempotent_retry_ledger::sql),
//! each in a `BEGIN IMMEDIATE` transaction of its own, run by the writer between batches.

use rusqlite::{Connection, TransactionBehavior};

use super::storage;
use idempotent_retry_ledger::LedgerError;
use idempotent_retry_ledger::sql::{
    Dialect, REDACT_SELECT, SCHEMA_VERSION, TABLE, add_column, next_step, probe, redact_update,
    redacted_urls, shape_error, version_from,
};

/// The file's `PRAGMA user_version`, as a schema version.
pub(super) fn read_version(conn: &Connection) -> Result<u32, LedgerError> {
    let stored: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|err| storage(err, "cannot read the schema version"))?;
    version_from(stored)
}

/// Fails unless the table has every column the crate reads.
pub(super) fn check_shape(conn: &Connection) -> Result<(), LedgerError> {
    conn.prepare(&probe())
        .map(drop)
        .map_err(|err| shape_error().with_source(err))
}

/// Runs every step the file is due, then checks its shape.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), LedgerError> {
    // A plain read decides whether to take the write lock: most calls find the file current
    // (`open` migrates on every start), and a newer file is refused before anything is written.
    while next_step(read_version(conn)?)?.is_some() {
        apply_next_step(conn)?;
    }
    check_shape(conn)
}

/// Runs the step the file is due, if it still is once the write lock is held, in one
/// transaction with the version it reaches.
fn apply_next_step(conn: &mut Connection) -> Result<(), LedgerError> {
    // IMMEDIATE takes the write lock before the version is read again: of two processes
    // migrating at once, the second waits here and then finds the step done, so no step runs
    // twice. A step, its check and its version commit together or not at all.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|err| storage(err, "cannot begin the migration"))?;
    let Some(step) = next_step(read_version(&tx)?)? else {
        return Ok(());
    };
    for &column in step.columns {
        let present: bool = tx
            .query_row(
                &format!("SELECT count(*) > 0 FROM pragma_table_info('{TABLE}') WHERE name = ?1"),
                [column.0],
                |row| row.get(0),
            )
            .map_err(|err| storage(err, "cannot read the table's columns"))?;
        if !present {
            tx.execute_batch(&add_column(Dialect::Sqlite, column))
                .map_err(|err| storage(err, "cannot migrate"))?;
        }
    }
    for statement in (step.statements)(Dialect::Sqlite) {
        if let Err(err) = tx.execute_batch(&statement) {
            // A statement over a table of another shape (the index on a missing column,
            // say) fails; name the shape, not the statement. A failed statement does not end
            // an SQLite transaction, so the check can still run.
            check_shape(&tx)?;
            return Err(storage(err, "cannot migrate"));
        }
    }
    if step.redact_urls {
        redact_urls(&tx)?;
    }
    // The columns the crate reads are those of the latest version only.
    if step.to() == SCHEMA_VERSION {
        check_shape(&tx)?;
    }
    tx.pragma_update(None, "user_version", step.to())
        .map_err(|err| storage(err, "cannot record the schema version"))?;
    tx.commit()
        .map_err(|err| storage(err, "cannot commit the migration"))
}

/// Redacts the query values of the URLs already stored, in the migration's transaction (the
/// rows a dispatcher may still send are left: [`REDACT_SELECT`]).
fn redact_urls(conn: &Connection) -> Result<(), LedgerError> {
    let failed = |err| storage(err, "cannot redact the stored URLs");
    let rows: Vec<(String, Option<String>, Option<String>)> = conn
        .prepare(REDACT_SELECT)
        .and_then(|mut statement| {
            statement
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                .collect()
        })
        .map_err(failed)?;
    let mut update = conn
        .prepare(&redact_update(Dialect::Sqlite))
        .map_err(failed)?;
    for (key, url, response_url) in rows {
        if let Some((url, response_url)) = redacted_urls(url.as_deref(), response_url.as_deref()) {
            update
                .execute(rusqlite::params![key, url, response_url])
                .map_err(failed)?;
        }
    }
    Ok(())
}
