//! What reconciling does to the file: hold an unresolved row, write its resolution, list rows.
//! The writes run inside the writer's batch transaction, as those in
//! [`statements`](super::statements) do.

use std::sync::LazyLock;

use rusqlite::{Connection, params, params_from_iter};

use super::statements::{held, lease_row, read_row, select};
use super::storage;
use idempotent_retry_ledger::sql::{Dialect, Param, RawRow, TABLE, list_query, response_columns};
use idempotent_retry_ledger::{
    Claimed, LedgerError, ListFilter, OperationRecord, ReconcileClaim, Resolve, to_millis,
};

static HOLD: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET status = 'in_flight', lease_owner = ?2, lease_expires_at = ?3 \
         WHERE key = ?1"
    )
});

static RESOLVE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET status = ?3, lease_owner = NULL, lease_expires_at = NULL, \
         response_status = ?4, response_headers = ?5, response_body = ?6, response_url = ?13, \
         response_key_id = ?14, \
         first_attempt_at = coalesce(?7, first_attempt_at), \
         expires_at = max(expires_at, coalesce(?8, expires_at)), \
         resolution = coalesce(?9, resolution), \
         resolved_by = CASE WHEN ?9 IS NULL THEN resolved_by ELSE ?10 END, \
         resolved_at = CASE WHEN ?9 IS NULL THEN resolved_at ELSE ?11 END, \
         resolution_reason = CASE WHEN ?9 IS NULL THEN resolution_reason ELSE ?12 END \
         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
    )
});

/// Holds the row if the claim may take it; the writer runs this alone in its batch's order, so
/// the read and the write are one step.
pub(super) fn claim_unresolved(
    conn: &Connection,
    claim: &ReconcileClaim,
) -> Result<Option<Claimed>, LedgerError> {
    let Some(mut record) = select(conn, &claim.key)? else {
        return Ok(None);
    };
    if !claim.may_take(&record) {
        return Ok(Some(Claimed::Existing(record)));
    }
    let previous = claim.hold(&mut record);
    let record = lease_row(
        conn,
        &HOLD,
        record,
        &claim.owner,
        claim.lease_until,
        "cannot hold the operation to reconcile it",
    )?;
    Ok(Some(Claimed::TakenOver { record, previous }))
}

pub(super) fn resolve(conn: &Connection, resolve: &Resolve) -> Result<(), LedgerError> {
    let response = response_columns(resolve.response.as_ref());
    let note = resolve.note.as_ref();
    let changed = conn
        .prepare_cached(&RESOLVE)
        .and_then(|mut statement| {
            statement.execute(params![
                resolve.key,
                resolve.owner,
                resolve.status.as_str(),
                response.status,
                response.headers,
                response.body,
                resolve.window_from.map(to_millis),
                resolve.keep_until.map(to_millis),
                note.map(|n| n.kind.as_str()),
                note.map(|n| n.by.as_str()),
                note.map(|n| to_millis(n.at)),
                note.and_then(|n| n.reason.as_deref()),
                response.url,
                response.key_id,
            ])
        })
        .map_err(|err| storage(err, "cannot record the resolution"))?;
    held(changed, &resolve.key)
}

pub(super) fn list(
    conn: &Connection,
    filter: &ListFilter,
) -> Result<Vec<OperationRecord>, LedgerError> {
    filter.check()?;
    let (sql, params) = list_query(Dialect::Sqlite, filter);
    let values = params.into_iter().map(|param| match param {
        Param::Text(text) => rusqlite::types::Value::Text(text),
        Param::Int(int) => rusqlite::types::Value::Integer(int),
    });
    let rows: Vec<RawRow> = conn
        .prepare(&sql)
        .and_then(|mut statement| {
            statement
                .query_map(params_from_iter(values), read_row)?
                .collect()
        })
        .map_err(|err| storage(err, "cannot list the operations"))?;
    rows.into_iter().map(RawRow::into_record).collect()
}
