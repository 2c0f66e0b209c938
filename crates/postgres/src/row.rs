//! A row of the table as tokio-postgres returns it, turned into a record.

use tokio_postgres::Row;

use idempotent_retry_ledger::sql::RawRow;
use idempotent_retry_ledger::{LedgerError, OperationRecord};

/// Reads the columns of [`COLUMNS`](idempotent_retry_ledger::sql::COLUMNS), in order, from the start of
/// `row`, and validates them.
pub(super) fn read_row(row: &Row) -> Result<OperationRecord, LedgerError> {
    let decode = |err: tokio_postgres::Error| {
        LedgerError::corrupt("cannot decode the operation's row").with_source(err)
    };
    let raw = RawRow {
        key: row.try_get(0).map_err(decode)?,
        scope: row.try_get(1).map_err(decode)?,
        fingerprint: row.try_get(2).map_err(decode)?,
        status: row.try_get(3).map_err(decode)?,
        attempts: i64::from(row.try_get::<_, i32>(4).map_err(decode)?),
        first_attempt_at: row.try_get(5).map_err(decode)?,
        last_attempt_at: row.try_get(6).map_err(decode)?,
        lease_owner: row.try_get(7).map_err(decode)?,
        lease_expires_at: row.try_get(8).map_err(decode)?,
        response_status: row
            .try_get::<_, Option<i32>>(9)
            .map_err(decode)?
            .map(i64::from),
        response_headers: row.try_get(10).map_err(decode)?,
        response_body: row.try_get(11).map_err(decode)?,
        expires_at: row.try_get(12).map_err(decode)?,
        method: row.try_get(13).map_err(decode)?,
        url: row.try_get(14).map_err(decode)?,
        resolution: row.try_get(15).map_err(decode)?,
        resolved_by: row.try_get(16).map_err(decode)?,
        resolved_at: row.try_get(17).map_err(decode)?,
        resolution_reason: row.try_get(18).map_err(decode)?,
        response_url: row.try_get(19).map_err(decode)?,
        response_key_id: row.try_get(20).map_err(decode)?,
    };
    raw.into_record()
}
