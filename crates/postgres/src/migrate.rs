//! Bringing a database to the crate's schema version, and reading the version it is at.

use tokio_postgres::{Client, IsolationLevel};

use super::failure::{database, is_shape};
use idempotent_retry_ledger::LedgerError;
use idempotent_retry_ledger::sql::{
    Dialect, REDACT_SELECT, SCHEMA_VERSION, VERSION_TABLE, add_column, next_step, probe,
    redact_update, redacted_urls, shape_error, version_from,
};

/// Key of the advisory lock that serializes concurrent migrations.
const MIGRATION_LOCK: i64 = 0x6964_656d_706f_7465;

/// Runs every step the database is due, then checks the table's columns.
pub(super) async fn migrate(client: &mut Client) -> Result<(), LedgerError> {
    while apply_next_step(client).await? {}
    client
        .prepare(&probe())
        .await
        .map(drop)
        .map_err(|err| shape_error().with_source(err))
}

/// Runs the step the database is due, in one transaction with the version it reaches; false
/// when none is due.
async fn apply_next_step(client: &mut Client) -> Result<bool, LedgerError> {
    // READ COMMITTED whatever the database's default: each statement after the lock then sees
    // what the worker before committed. Under REPEATABLE READ the snapshot would date from
    // before the wait, and a second worker would find no version and run the step again.
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(|err| database(err, "cannot begin the migration"))?;
    // Held to the end of the transaction: a second worker waits here, then reads the version
    // this one committed and has nothing to do. Without it, two workers could both find no
    // version and both run a step (and `CREATE TABLE IF NOT EXISTS` itself is not safe against
    // a concurrent create). An error return drops `tx`, which rolls back: a refused or failed
    // step leaves the database as it was.
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        .await
        .map_err(|err| database(err, "cannot lock the migration"))?;
    let Some(step) = next_step(read_version(tx.client()).await?)? else {
        tx.rollback()
            .await
            .map_err(|err| database(err, "cannot end the migration"))?;
        return Ok(false);
    };
    let columns = step
        .columns
        .iter()
        .map(|&column| add_column(Dialect::Postgres, column));
    for statement in columns.chain((step.statements)(Dialect::Postgres)) {
        tx.batch_execute(&statement).await.map_err(|err| {
            if is_shape(&err) {
                shape_error().with_source(err)
            } else {
                database(err, "cannot migrate")
            }
        })?;
    }
    if step.redact_urls {
        redact_urls(&tx).await?;
    }
    // The columns the crate reads are those of the latest version only.
    if step.to() == SCHEMA_VERSION {
        tx.prepare(&probe())
            .await
            .map_err(|err| shape_error().with_source(err))?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL); \
         DELETE FROM {VERSION_TABLE}; \
         INSERT INTO {VERSION_TABLE} (version) VALUES ({})",
        step.to()
    ))
    .await
    .map_err(|err| database(err, "cannot record the schema version"))?;
    tx.commit()
        .await
        .map_err(|err| database(err, "cannot commit the migration"))?;
    Ok(true)
}

/// Redacts the query values of the URLs already stored, in the migration's transaction (the
/// rows a dispatcher may still send are left: [`REDACT_SELECT`]).
async fn redact_urls(tx: &tokio_postgres::Transaction<'_>) -> Result<(), LedgerError> {
    let what = "cannot redact the stored URLs";
    let rows = tx
        .query(REDACT_SELECT, &[])
        .await
        .map_err(|err| database(err, what))?;
    let update = tx
        .prepare(&redact_update(Dialect::Postgres))
        .await
        .map_err(|err| database(err, what))?;
    for row in rows {
        let decode = |err| LedgerError::corrupt("cannot decode a stored URL").with_source(err);
        let key: String = row.try_get(0).map_err(decode)?;
        let url: Option<String> = row.try_get(1).map_err(decode)?;
        let response_url: Option<String> = row.try_get(2).map_err(decode)?;
        if let Some((url, response_url)) = redacted_urls(url.as_deref(), response_url.as_deref()) {
            tx.execute(&update, &[&key, &url, &response_url])
                .await
                .map_err(|err| database(err, what))?;
        }
    }
    Ok(())
}

/// The version in the version table, or 0 when there is none. Two statements, not one
/// transaction: [`migrate`] calls it under its lock, and a bare read that races a migration
/// sees either version, both true.
pub(super) async fn read_version(client: &Client) -> Result<u32, LedgerError> {
    let exists: bool = client
        .query_one(
            &format!("SELECT to_regclass('{VERSION_TABLE}') IS NOT NULL"),
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|err| database(err, "cannot read the schema version"))?;
    if !exists {
        return Ok(0);
    }
    let rows = client
        .query(&format!("SELECT version FROM {VERSION_TABLE}"), &[])
        .await
        .map_err(|err| database(err, "cannot read the schema version"))?;
    match rows.as_slice() {
        [row] => {
            let stored: i32 = row.try_get(0).map_err(|err| {
                LedgerError::corrupt(format!("cannot decode the version in {VERSION_TABLE}"))
                    .with_source(err)
            })?;
            version_from(i64::from(stored))
        }
        _ => Err(LedgerError::corrupt(format!(
            "table {VERSION_TABLE} holds {} rows, not one",
            rows.len()
        ))),
    }
}
