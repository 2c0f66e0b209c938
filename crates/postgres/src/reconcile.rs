//! What reconciling does to the table: hold an unresolved row, write its resolution, list
//! rows. Each is one statement (the hold: one `UPDATE` that locks the row it reads, as the
//! take-over does), so two reconcilers racing for one key cannot both hold it.

use std::sync::LazyLock;

use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use std::time::SystemTime;

use super::failure::database;
use super::statements::{now, plus};
use super::{Clock, prepared, read_row, select};
use idempotent_retry_ledger::sql::{
    COLUMN_COUNT, COLUMNS, Dialect, Param, TABLE, list_query, response_columns,
};
use idempotent_retry_ledger::{
    Claimed, LedgerError, ListFilter, OperationRecord, OperationStatus, ReconcileClaim, Resolve,
    millis_after, to_millis,
};

static HOLD: LazyLock<String> = LazyLock::new(|| {
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $2, lease_expires_at = {} \
         FROM (SELECT key, status FROM {TABLE} WHERE key = $1 FOR UPDATE) AS old \
         WHERE t.key = old.key \
         AND (t.status = 'unknown' OR (t.status = 'in_flight' \
              AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= {}))) \
         RETURNING {columns}, old.status",
        plus("$4", "$3"),
        now("$4"),
    )
});

/// A resolution, its times given as offsets from the base (`$13`): a new window start (`$7`),
/// a retention's end (`$8`) and the note's time (`$11`), each absent when not written.
static RESOLVE: LazyLock<String> = LazyLock::new(|| {
    let from = format!(
        "first_attempt_at = CASE WHEN $7::BIGINT IS NULL THEN first_attempt_at ELSE {} END",
        plus("$13", "$7")
    );
    let keep = format!(
        "expires_at = CASE WHEN $8::BIGINT IS NULL THEN expires_at \
         ELSE GREATEST(expires_at, {}) END",
        plus("$13", "$8")
    );
    let at = format!(
        "resolved_at = CASE WHEN $9::TEXT IS NULL OR $11::BIGINT IS NULL THEN resolved_at \
         ELSE {} END",
        plus("$13", "$11")
    );
    let assignments = [
        "status = $3",
        "lease_owner = NULL",
        "lease_expires_at = NULL",
        "response_status = $4",
        "response_headers = $5",
        "response_body = $6",
        "response_url = $14",
        "response_key_id = $15",
        &from,
        &keep,
        "resolution = coalesce($9::TEXT, resolution)",
        "resolved_by = CASE WHEN $9::TEXT IS NULL THEN resolved_by ELSE $10 END",
        &at,
        "resolution_reason = CASE WHEN $9::TEXT IS NULL THEN resolution_reason ELSE $12 END",
    ]
    .join(", ");
    format!(
        "UPDATE {TABLE} SET {assignments} \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
    )
});

pub(super) async fn claim_unresolved(
    client: &Object,
    claim: &ReconcileClaim,
    clock: Clock,
) -> Result<Option<Claimed>, LedgerError> {
    let what = "cannot hold the operation to reconcile it";
    let held = client
        .query_opt(
            &prepared(client, &HOLD, what).await?,
            &[
                &claim.key,
                &claim.owner,
                &millis_after(claim.lease_until, claim.now),
                &clock.base(claim.now),
            ],
        )
        .await
        .map_err(|err| database(err, what))?;
    if let Some(row) = held {
        let previous: String = row
            .try_get(COLUMN_COUNT)
            .map_err(|err| database(err, "cannot decode the operation"))?;
        return Ok(Some(Claimed::TakenOver {
            record: read_row(&row)?,
            previous: previous.parse::<OperationStatus>()?,
        }));
    }
    Ok(select(client, &claim.key).await?.map(Claimed::Existing))
}

pub(super) async fn resolve(
    client: &Object,
    resolve: &Resolve,
    clock: Clock,
) -> Result<(), LedgerError> {
    let what = "cannot record the resolution";
    let response = response_columns(resolve.response.as_ref());
    let status = response.status.and_then(|s| i32::try_from(s).ok());
    let note = resolve.note.as_ref();
    let reference = resolve.reference_millis();
    let offset = |at: Option<SystemTime>| {
        at.zip(reference)
            .map(|(at, from)| to_millis(at).saturating_sub(from))
    };
    let base = match clock {
        Clock::Database => None,
        Clock::Caller => reference,
    };
    let changed = client
        .execute(
            &prepared(client, &RESOLVE, what).await?,
            &[
                &resolve.key,
                &resolve.owner,
                &resolve.status.as_str(),
                &status,
                &response.headers,
                &response.body,
                &offset(resolve.window_from),
                &offset(resolve.keep_until),
                &note.map(|n| n.kind.as_str()),
                &note.map(|n| n.by.as_str()),
                &offset(note.map(|n| n.at)),
                &note.and_then(|n| n.reason.as_deref()),
                &base,
                &response.url,
                &response.key_id,
            ],
        )
        .await
        .map_err(|err| database(err, what))?;
    if changed == 0 {
        return Err(LedgerError::lease_lost(&resolve.key));
    }
    Ok(())
}

pub(super) async fn list(
    client: &Object,
    filter: &ListFilter,
) -> Result<Vec<OperationRecord>, LedgerError> {
    filter.check()?;
    let what = "cannot list the operations";
    let (sql, params) = list_query(Dialect::Postgres, filter);
    let values: Vec<Box<dyn ToSql + Sync + Send>> = params
        .into_iter()
        .map(|param| -> Box<dyn ToSql + Sync + Send> {
            match param {
                Param::Text(text) => Box::new(text),
                Param::Int(int) => Box::new(int),
            }
        })
        .collect();
    let refs: Vec<&(dyn ToSql + Sync)> = values
        .iter()
        .map(|value| &**value as &(dyn ToSql + Sync))
        .collect();
    client
        .query(&prepared(client, &sql, what).await?, &refs)
        .await
        .map_err(|err| database(err, what))?
        .iter()
        .map(read_row)
        .collect()
}
