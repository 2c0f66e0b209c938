//! The text of every statement the ledger runs, built once. deadpool's statement cache keys
//! on the text, so each statement is parsed and planned once per connection, not per call.

use std::sync::LazyLock;

use idempotent_retry_ledger::sql::{COLUMN_COUNT, COLUMNS, TABLE};

/// The database's present in milliseconds since the epoch: the start of the statement, so
/// every time one statement writes is the same instant.
const DB_NOW: &str = idempotent_retry_ledger::sql::POSTGRES_NOW;

/// A statement's present: the parameter `base` when it is set (a ledger on the caller's clock
/// sends the caller's `now`), else the database's own ([`DB_NOW`]).
pub(super) fn now(base: &str) -> String {
    format!("coalesce({base}::BIGINT, {DB_NOW})")
}

/// The present plus `length` milliseconds (signed: a cutoff lies before it), held inside
/// BIGINT's range, so a lease "for ever" stays at the latest time rather than failing.
pub(super) fn plus(base: &str, length: &str) -> String {
    format!(
        "LEAST(GREATEST({}::NUMERIC + {length}::BIGINT, -9223372036854775808), \
         9223372036854775807)::BIGINT",
        now(base)
    )
}

/// The claim of a new key: the insert is the lock, and of any number of workers racing for
/// one key exactly one gets the row. Every time is the statement's present plus a length
/// (the client sends lengths, never instants, unless the ledger is on the caller's clock).
/// Parameters: key, scope, fingerprint, base (`now`), owner, lease length, retention, method,
/// URL. Returns the key and the start of its window when the row was inserted (the caller
/// builds the record it wrote, rather than reading every column back), nothing when the key
/// had one.
pub(super) static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
         first_attempt_at, lease_owner, lease_expires_at, expires_at, method, url) \
         VALUES ($1, $2, $3, 'in_flight', 0, {}, $5, {}, {}, $8, $9) \
         ON CONFLICT (key) DO NOTHING RETURNING key, first_attempt_at",
        now("$4"),
        plus("$4", "$6"),
        plus("$4", "$7"),
    )
});

/// The claims of new keys of one batch, one statement: [`INSERT`] for each row of the arrays,
/// in key order (so two batches racing for the same keys lock them in the same order and
/// cannot deadlock). Parameters: the arrays of keys, scopes, fingerprints, bases, owners,
/// lease lengths, retentions, methods and URLs. Returns the keys inserted with their windows'
/// starts; a key missing from them already had a row.
pub(super) static INSERT_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
         first_attempt_at, lease_owner, lease_expires_at, expires_at, method, url) \
         SELECT u.key, u.scope, u.fingerprint, 'in_flight', 0, {}, u.owner, {}, \
         {}, u.method, u.url \
         FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], \
         $6::BIGINT[], $7::BIGINT[], $8::TEXT[], $9::TEXT[]) \
         AS u(key, scope, fingerprint, now, owner, lease, expires, method, url) \
         ORDER BY u.key \
         ON CONFLICT (key) DO NOTHING RETURNING key, first_attempt_at",
        now("u.now"),
        plus("u.now", "u.lease"),
        plus("u.now", "u.expires"),
    )
});

/// The take-over of an existing key, one `UPDATE ... WHERE` stating the rule, which
/// PostgreSQL re-checks against the latest row under concurrent updates. The old status comes
/// from the locked sub-select: RETURNING alone sees the new row. The rule is
/// `Claim::may_take_over`'s, in SQL, on the statement's present: a row that reached no
/// receiver (`not_sent`) is taken whatever its request and window, and becomes the claim's
/// request in a new window; a `queued` one the same, by the same request only; any other is taken by the same request only, inside its window
/// (`first_attempt_at` after the present plus the cutoff's offset, which is negative:
/// `window::is_open`), and only once its lease has lapsed on the same clock. Parameters: key,
/// owner, lease length, fingerprint, the cutoff's offset, base (`now`), scope, method, URL,
/// retention. Returns the row's columns, then the old status.
pub(super) static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let fresh = "old.status IN ('not_sent', 'queued')";
    format!(
        "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $2, \
         lease_expires_at = {lease}, response_status = NULL, \
         response_headers = NULL, response_body = NULL, response_url = NULL, \
         response_key_id = NULL, fingerprint = $4, \
         scope = CASE WHEN {fresh} THEN $7 ELSE t.scope END, \
         method = CASE WHEN {fresh} AND t.fingerprint <> $4 THEN $8 ELSE t.method END, \
         url = CASE WHEN {fresh} AND t.fingerprint <> $4 THEN $9 ELSE t.url END, \
         first_attempt_at = CASE WHEN {fresh} THEN {now} ELSE t.first_attempt_at END, \
         expires_at = CASE WHEN {fresh} THEN GREATEST(t.expires_at, {retention}) \
         ELSE t.expires_at END \
         FROM (SELECT key, status FROM {TABLE} WHERE key = $1 FOR UPDATE) AS old \
         WHERE t.key = old.key AND (t.status = 'not_sent' \
         OR (t.status = 'queued' AND t.fingerprint = $4) OR (t.fingerprint = $4 \
         AND t.status <> 'succeeded' AND t.first_attempt_at > {cutoff} \
         AND (t.status <> 'in_flight' OR t.lease_expires_at IS NULL \
              OR t.lease_expires_at <= {now}))) \
         RETURNING {columns}, old.status",
        lease = plus("$6", "$3"),
        now = now("$6"),
        retention = plus("$6", "$10"),
        cutoff = plus("$6", "$5"),
    )
});

/// The column of [`TAKE_OVER`]'s result that holds the old status: the one after the row's.
pub(super) const PREVIOUS_STATUS: usize = COLUMN_COUNT;

/// One attempt counted, by the lease holder only, stamped with the statement's present.
/// Parameters: key, owner, base (the attempt's time), the lease length.
pub(super) static RECORD_ATTEMPT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = {}, \
         lease_expires_at = {} \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'",
        now("$3"),
        plus("$3", "$4"),
    )
});

/// The lease extended, by its holder only, for a length from the statement's present.
/// Parameters: key, owner, base (the renewal's time), the lease length.
pub(super) static RENEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET lease_expires_at = {} \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'",
        plus("$3", "$4"),
    )
});

/// The outcome written and the lease released, by the lease holder only. Parameters: key,
/// owner, status, then the saved response's status, headers and body, whether the finish
/// counts the last attempt, the base its stamp is taken from, and the URL that answered. One assignment a line, so
/// counting an attempt in the same statement is one more line.
pub(super) static FINISH: LazyLock<String> = LazyLock::new(|| {
    let stamp = format!(
        "last_attempt_at = CASE WHEN $7 THEN {} ELSE last_attempt_at END",
        now("$8")
    );
    let assignments = [
        "status = $3",
        "lease_owner = NULL",
        "lease_expires_at = NULL",
        "response_status = $4",
        "response_headers = $5",
        "response_body = $6",
        "response_url = $9",
        "response_key_id = $10",
        // The run's last attempt, when the finish carries it (`Finish::last_attempt_at`).
        "attempts = attempts + CASE WHEN $7 THEN 1 ELSE 0 END",
        &stamp,
    ]
    .join(", ");
    format!(
        "UPDATE {TABLE} SET {assignments} \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
    )
});

/// The outcomes of one batch, one statement: [`FINISH`] for each row of the arrays, each
/// applied only by its lease holder. Parameters: the arrays of keys, owners, statuses, saved
/// statuses, headers and bodies, whether each counts its last attempt, their bases and the
/// URLs that answered.
/// Returns the keys whose row changed; a key missing from them lost its lease.
pub(super) static FINISH_MANY: LazyLock<String> = LazyLock::new(|| {
    let stamp = format!(
        "last_attempt_at = CASE WHEN u.counted THEN {} ELSE t.last_attempt_at END",
        now("u.base")
    );
    let assignments = [
        "status = u.status",
        "lease_owner = NULL",
        "lease_expires_at = NULL",
        "response_status = u.response_status",
        "response_headers = u.response_headers",
        "response_body = u.response_body",
        "response_url = u.response_url",
        "response_key_id = u.response_key_id",
        "attempts = t.attempts + CASE WHEN u.counted THEN 1 ELSE 0 END",
        &stamp,
    ]
    .join(", ");
    format!(
        "UPDATE {TABLE} AS t SET {assignments} \
         FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::INTEGER[], $5::TEXT[], \
         $6::BYTEA[], $7::BOOLEAN[], $8::BIGINT[], $9::TEXT[], $10::TEXT[]) \
         AS u(key, owner, status, response_status, response_headers, response_body, \
         counted, base, response_url, response_key_id) \
         WHERE t.key = u.key AND t.lease_owner = u.owner AND t.status = 'in_flight' \
         RETURNING t.key"
    )
});

/// A batch's transaction, begun with how long its statements wait for a row lock (another
/// session's transaction on one of its keys) before the batch gives up and its calls run one
/// by one, each waiting for its own key alone.
pub(super) const BATCH_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '250ms'";

/// One row by key.
pub(super) static SELECT: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {COLUMNS} FROM {TABLE} WHERE key = $1"));

/// At most `$2` expired rows deleted: expiry at or before the present (`$1`, the base); never
/// a queued one, which is not sent yet.
pub(super) static PURGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM {TABLE} WHERE key IN \
         (SELECT key FROM {TABLE} WHERE expires_at <= {} AND status <> 'queued' LIMIT $2)",
        now("$1")
    )
});

/// An operation queued in the caller's transaction, on the database's clock, and announced
/// on [`QUEUED_CHANNEL`] (delivered at the transaction's commit): a call of the enqueue
/// function of schema version 8 (`sql::postgres_enqueue_function`), sent with its parameters'
/// types (no prepare: one round trip; the insert inside keeps its plan for the session).
/// Parameters: key, scope, fingerprint, the delay before it is due and the delay plus its
/// retention (milliseconds, held below a century by the caller, so the sums stay in BIGINT),
/// method, URL, headers (JSON), body. Returns the key when the row was inserted, nothing when
/// the key had one.
pub(super) const ENQUEUE: &str = "SELECT queued FROM \
     idempotent_retry_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS queued \
     WHERE queued IS NOT NULL";

pub use idempotent_retry_ledger::sql::QUEUED_CHANNEL;

/// The due rows, on the present (`$1`, the base), with a limit (`$2`), the `not_sent` delay
/// (`$3`) and the `unknown` one (`$4`, NULL: never), in milliseconds.
pub(super) static DUE: LazyLock<String> = LazyLock::new(|| {
    idempotent_retry_ledger::sql::due_query(
        idempotent_retry_ledger::sql::Dialect::Postgres,
        idempotent_retry_ledger::sql::QUEUED_COLUMNS,
        (&now("$1"), "$2"),
        ("$3::BIGINT", "$4::BIGINT"),
        None,
    )
});

/// The due rows taken in one statement, each locked as it is chosen and rows another
/// session is taking skipped (`SKIP LOCKED`), by [`TakeDue`]'s rule
/// (idempotent_retry_ledger::outbox::TakeDue). Parameters: base (`now`), the `not_sent` delay,
/// the `unknown` delay (NULL: never), the limit, the cutoff's offset (negative), owner, lease
/// length, retention. Returns the row's columns, then its old status, then the outbox's
/// columns (headers, body, queued at, not before).
pub(super) static TAKE_DUE: LazyLock<String> = LazyLock::new(|| take_due(false));

/// [`TAKE_DUE`] for queued rows alone (`DueQuery::queued_only`): the rare kinds (under a
/// lapsed lease, `not_sent`, unknown) are read through the status index, whose entries for
/// rows that have since moved on stay until a vacuum (a bitmap scan cannot mark them dead), so
/// most reads leave them out. Same parameters.
pub(super) static TAKE_QUEUED: LazyLock<String> = LazyLock::new(|| take_due(true));

/// The take, of every kind of due row or of queued rows alone.
fn take_due(queued_only: bool) -> String {
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let fresh = "old.status IN ('queued', 'not_sent')";
    let cutoff = plus("$1", "$5");
    let dialect = idempotent_retry_ledger::sql::Dialect::Postgres;
    let delays = ("$2::BIGINT", "$3::BIGINT");
    let chosen = if queued_only {
        let [queued, ..] = idempotent_retry_ledger::sql::due_branches(
            dialect,
            "key, not_before",
            (&now("$1"), "$4"),
            delays,
            Some(&cutoff),
        );
        queued
    } else {
        idempotent_retry_ledger::sql::due_query(
            dialect,
            "key, not_before",
            (&now("$1"), "$4"),
            delays,
            Some(&cutoff),
        )
    };
    // Checked again as each row is locked: a row another take has just committed (in flight
    // now, under its live lease) no longer meets it, and is left.
    let due = idempotent_retry_ledger::sql::due_condition(
        &now("$1"),
        "$2::BIGINT",
        "$3::BIGINT",
        Some(&cutoff),
    );
    format!(
        "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $6, \
         lease_expires_at = {lease}, response_status = NULL, response_headers = NULL, \
         response_body = NULL, response_url = NULL, response_key_id = NULL, \
         first_attempt_at = CASE WHEN {fresh} THEN {now} ELSE t.first_attempt_at END, \
         expires_at = CASE WHEN {fresh} THEN GREATEST(t.expires_at, {retention}) \
         ELSE t.expires_at END \
         FROM (SELECT key, status FROM {TABLE} \
               WHERE key IN (SELECT key FROM ({chosen}) AS due) AND {due} \
               FOR UPDATE SKIP LOCKED) AS old \
         WHERE t.key = old.key \
         RETURNING {columns}, old.status, t.request_headers, t.request_body, t.queued_at, \
         t.not_before",
        lease = plus("$1", "$7"),
        now = now("$1"),
        retention = plus("$1", "$8"),
    )
}

/// The backlog: how many rows are queued, and how long (milliseconds) the oldest has waited
/// at the present (`$1`, the base).
pub(super) static BACKLOG: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT count(*), {} - min(queued_at) FROM {TABLE} \
         WHERE queued_at IS NOT NULL AND status = 'queued'",
        now("$1")
    )
});

/// The database's clock, in milliseconds since the epoch, as it reads when asked.
pub(super) const CLOCK: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_take_over_returns_the_old_status_after_the_row() {
        assert_eq!(COLUMNS.split(", ").count(), PREVIOUS_STATUS);
        assert!(
            TAKE_OVER.ends_with("t.response_key_id, old.status"),
            "{}",
            *TAKE_OVER
        );
    }

    #[test]
    fn the_finish_touches_only_the_lease_holder_s_row_in_flight() {
        assert!(FINISH.starts_with(&format!(
            "UPDATE {TABLE} SET status = $3, lease_owner = NULL"
        )));
        assert!(FINISH.contains("CASE WHEN $7 THEN coalesce($8::BIGINT, floor("));
        assert!(FINISH.ends_with("WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"));
    }
}
