//! What each ledger call does to the file: its statements, their text built once, and the
//! steps that run them on a connection. The writes run inside the writer's batch transaction
//! (see [`writer`](super::writer)), so none of them begins or commits one of its own.

use std::sync::LazyLock;
use std::time::SystemTime;

use rusqlite::{Connection, OptionalExtension, params};

use super::storage;
use idempotent_retry_ledger::sql::{
    COLUMNS, Dialect, RawRow, TABLE, as_stored, limit_of, response_columns,
};
use idempotent_retry_ledger::{
    AttemptUpdate, Claim, Claimed, Finish, LedgerError, OperationRecord, Renew, to_millis,
};

/// One row by key.
static SELECT: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS} FROM {TABLE} WHERE key = ?1"));

/// A claim's insert: the row in flight under the claim's lease, or nothing when the key has
/// one already.
static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, first_attempt_at, \
         lease_owner, lease_expires_at, expires_at, method, url) \
         VALUES (?1, ?2, ?3, 'in_flight', 0, ?4, ?5, ?6, ?7, ?8, ?9) \
         ON CONFLICT (key) DO NOTHING"
    )
});

/// A claim's take-over of a row [`Claim::may_take_over`] allows, with the request columns
/// as [`Claim::take_over`] left them (changed only for a row that reached no receiver).
static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET status = 'in_flight', lease_owner = ?2, lease_expires_at = ?3, \
         response_status = NULL, response_headers = NULL, response_body = NULL, \
         response_url = NULL, response_key_id = NULL, scope = ?4, fingerprint = ?5, method = ?6, url = ?7, first_attempt_at = ?8, \
         expires_at = ?9 \
         WHERE key = ?1"
    )
});

/// One more attempt by the lease holder.
static RECORD_ATTEMPT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = ?3, \
         lease_expires_at = ?4 \
         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
    )
});

/// The lease extended, by its holder only. Parameters: key, owner, the new lease end.
static RENEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET lease_expires_at = ?3 \
         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
    )
});

/// The outcome, written by the lease holder, releasing the lease.
static FINISH: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET status = ?3, lease_owner = NULL, lease_expires_at = NULL, \
         response_status = ?4, response_headers = ?5, response_body = ?6, response_url = ?8, \
         response_key_id = ?9, \
         attempts = attempts + (?7 IS NOT NULL), last_attempt_at = coalesce(?7, last_attempt_at) \
         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
    )
});

/// At most `?2` rows expired at `?1`; never a queued one, which is not sent yet.
pub(super) static PURGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM {TABLE} WHERE key IN \
         (SELECT key FROM {TABLE} WHERE expires_at <= ?1 AND status <> 'queued' LIMIT {})",
        limit_of(Dialect::Sqlite, "?2")
    )
});

pub(super) fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        key: row.get(0)?,
        scope: row.get(1)?,
        fingerprint: row.get(2)?,
        status: row.get(3)?,
        attempts: row.get(4)?,
        first_attempt_at: row.get(5)?,
        last_attempt_at: row.get(6)?,
        lease_owner: row.get(7)?,
        lease_expires_at: row.get(8)?,
        response_status: row.get(9)?,
        response_headers: row.get(10)?,
        response_body: row.get(11)?,
        expires_at: row.get(12)?,
        method: row.get(13)?,
        url: row.get(14)?,
        resolution: row.get(15)?,
        resolved_by: row.get(16)?,
        resolved_at: row.get(17)?,
        resolution_reason: row.get(18)?,
        response_url: row.get(19)?,
        response_key_id: row.get(20)?,
    })
}

/// The row of `key`, if there is one.
pub(super) fn select(conn: &Connection, key: &str) -> Result<Option<OperationRecord>, LedgerError> {
    conn.prepare_cached(&SELECT)
        .and_then(|mut statement| statement.query_row(params![key], read_row).optional())
        .map_err(|err| storage(err, "cannot read the operation"))?
        .map(RawRow::into_record)
        .transpose()
}

/// The claim, inside the writer's transaction, which holds the write lock from its `BEGIN
/// IMMEDIATE` to its commit: no other process can insert or change the row in between, so the
/// insert, the read and the take-over are one step. Two claims of one key in one batch run
/// one after the other: the second finds the first's row.
///
/// At most one statement changes the file, and nothing can fail after it: the record
/// returned is the one the statement wrote, built here rather than read back (see the
/// [writer](super::writer)'s rule for writes).
pub(super) fn claim(conn: &Connection, claim: Claim) -> Result<Claimed, LedgerError> {
    let inserted = conn
        .prepare_cached(&INSERT)
        .and_then(|mut statement| {
            statement.execute(params![
                claim.key,
                claim.scope,
                claim.fingerprint,
                to_millis(claim.now),
                claim.owner,
                to_millis(claim.lease_until),
                to_millis(claim.expires_at),
                claim.method,
                claim.url,
            ])
        })
        .map_err(|err| storage(err, "cannot claim the operation"))?;
    if inserted == 1 {
        return Ok(Claimed::New(as_stored(claim.into_new_row())));
    }
    let mut record = select(conn, &claim.key)?.ok_or_else(|| {
        LedgerError::unavailable(format!("operation {} vanished during its claim", claim.key))
    })?;
    if !claim.may_take_over(&record) {
        return Ok(Claimed::Existing(record));
    }
    let previous = claim.take_over(&mut record);
    let changed = conn
        .prepare_cached(&TAKE_OVER)
        .and_then(|mut statement| {
            statement.execute(params![
                record.key,
                claim.owner,
                to_millis(claim.lease_until),
                record.scope,
                record.fingerprint,
                record.method,
                record.url,
                to_millis(record.first_attempt_at),
                to_millis(record.expires_at),
            ])
        })
        .map_err(|err| storage(err, "cannot take the operation over"))?;
    debug_assert_eq!(changed, 1, "the row read under the write lock is there");
    Ok(Claimed::TakenOver {
        record: as_stored(record),
        previous,
    })
}

/// Puts `record`, read under the writer's lock and already changed by the caller, in flight
/// under `owner`'s lease until `until` with `sql` (parameters: key, owner, lease end): the
/// take-over of a claim and the hold of a reconciler. Returns the record as the file keeps it.
pub(super) fn lease_row(
    conn: &Connection,
    sql: &str,
    record: OperationRecord,
    owner: &str,
    until: SystemTime,
    what: &str,
) -> Result<OperationRecord, LedgerError> {
    let changed = conn
        .prepare_cached(sql)
        .and_then(|mut statement| statement.execute(params![record.key, owner, to_millis(until)]))
        .map_err(|err| storage(err, what))?;
    debug_assert_eq!(changed, 1, "the row read under the write lock is there");
    Ok(as_stored(record))
}

/// One more attempt, if the update's owner holds the lease.
pub(super) fn record_attempt(conn: &Connection, update: &AttemptUpdate) -> Result<(), LedgerError> {
    let changed = conn
        .prepare_cached(&RECORD_ATTEMPT)
        .and_then(|mut statement| {
            statement.execute(params![
                update.key,
                update.owner,
                to_millis(update.at),
                to_millis(update.lease_until)
            ])
        })
        .map_err(|err| storage(err, "cannot record the attempt"))?;
    held(changed, &update.key)
}

/// The lease extended, if the renewal's owner holds it.
pub(super) fn renew(conn: &Connection, renew: &Renew) -> Result<(), LedgerError> {
    let changed = conn
        .prepare_cached(&RENEW)
        .and_then(|mut statement| {
            statement.execute(params![
                renew.key,
                renew.owner,
                to_millis(renew.lease_until)
            ])
        })
        .map_err(|err| storage(err, "cannot renew the lease"))?;
    held(changed, &renew.key)
}

/// The outcome, if the finish's owner holds the lease: one statement, so a finish that also
/// counts the run's last attempt is one more `SET` term here, not another write.
pub(super) fn finish(conn: &Connection, finish: &Finish) -> Result<(), LedgerError> {
    let response = response_columns(finish.response.as_ref());
    let changed = conn
        .prepare_cached(&FINISH)
        .and_then(|mut statement| {
            statement.execute(params![
                finish.key,
                finish.owner,
                finish.status.as_str(),
                response.status,
                response.headers,
                response.body,
                finish.last_attempt_at.map(to_millis),
                response.url,
                response.key_id,
            ])
        })
        .map_err(|err| storage(err, "cannot record the outcome"))?;
    held(changed, &finish.key)
}

/// At most `limit` rows expired at `now`; how many were deleted.
pub(super) fn purge(conn: &Connection, now: SystemTime, limit: u32) -> Result<u64, LedgerError> {
    let deleted = conn
        .prepare_cached(&PURGE)
        .and_then(|mut statement| statement.execute(params![to_millis(now), i64::from(limit)]))
        .map_err(|err| storage(err, "cannot purge"))?;
    Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
}

/// A lease holder's write changed no row: the run no longer holds the lease.
pub(super) fn held(changed: usize, key: &str) -> Result<(), LedgerError> {
    if changed == 0 {
        Err(LedgerError::lease_lost(key))
    } else {
        Ok(())
    }
}
