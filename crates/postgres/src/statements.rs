//! The text of every statement the ledger runs, built once. deadpool's statement cache keys
//! on the text, so each statement is parsed and planned once per connection, not per call.

use std::sync::LazyLock;

use idempotent_retry_ledger::sql::{COLUMN_COUNT, COLUMNS, TABLE};

/// The claim of a new key: the insert is the lock, and of any number of workers racing for
/// one key exactly one gets the row. Parameters: key, scope, fingerprint, now, owner, lease
/// end, expiry, method, URL. Returns the key when the row was inserted (the caller builds the
/// record it wrote, rather than reading every column back), nothing when the key had one.
pub(super) static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
         first_attempt_at, lease_owner, lease_expires_at, expires_at, method, url) \
         VALUES ($1, $2, $3, 'in_flight', 0, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (key) DO NOTHING RETURNING key"
    )
});

/// The claims of new keys of one batch, one statement: [`INSERT`] for each row of the arrays,
/// in key order (so two batches racing for the same keys lock them in the same order and
/// cannot deadlock). Parameters: the arrays of keys, scopes, fingerprints, times, owners,
/// lease ends, expiries, methods and URLs. Returns the keys inserted; a key missing from them
/// already had a row.
pub(super) static INSERT_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
         first_attempt_at, lease_owner, lease_expires_at, expires_at, method, url) \
         SELECT u.key, u.scope, u.fingerprint, 'in_flight', 0, u.now, u.owner, u.lease, \
         u.expires, u.method, u.url \
         FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::BIGINT[], $5::TEXT[], \
         $6::BIGINT[], $7::BIGINT[], $8::TEXT[], $9::TEXT[]) \
         AS u(key, scope, fingerprint, now, owner, lease, expires, method, url) \
         ORDER BY u.key \
         ON CONFLICT (key) DO NOTHING RETURNING key"
    )
});

/// The take-over of an existing key, one `UPDATE ... WHERE` stating the rule, which
/// PostgreSQL re-checks against the latest row under concurrent updates. The old status comes
/// from the locked sub-select: RETURNING alone sees the new row. The rule is
/// `Claim::may_take_over`'s, in SQL: a row that reached no receiver (`not_sent`) is taken
/// whatever its request and window, and becomes the claim's request in a new window; any
/// other is taken by the same request only, inside its window (`first_attempt_at > $5`, the
/// cutoff `window.rs` computed: `window::is_open`). Parameters: key, owner, lease end,
/// fingerprint, window cutoff, now, scope, method, URL, expiry. Returns the row's columns,
/// then the old status.
pub(super) static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    let fresh = "old.status = 'not_sent'";
    format!(
        "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $2, \
         lease_expires_at = $3, response_status = NULL, \
         response_headers = NULL, response_body = NULL, fingerprint = $4, \
         scope = CASE WHEN {fresh} THEN $7 ELSE t.scope END, \
         method = CASE WHEN {fresh} THEN $8 ELSE t.method END, \
         url = CASE WHEN {fresh} THEN $9 ELSE t.url END, \
         first_attempt_at = CASE WHEN {fresh} THEN $6 ELSE t.first_attempt_at END, \
         expires_at = CASE WHEN {fresh} THEN GREATEST(t.expires_at, $10) ELSE t.expires_at END \
         FROM (SELECT key, status FROM {TABLE} WHERE key = $1 FOR UPDATE) AS old \
         WHERE t.key = old.key AND (t.status = 'not_sent' OR (t.fingerprint = $4 \
         AND t.status <> 'succeeded' AND t.first_attempt_at > $5 \
         AND (t.status <> 'in_flight' OR t.lease_expires_at IS NULL \
              OR t.lease_expires_at <= $6))) \
         RETURNING {columns}, old.status"
    )
});

/// The column of [`TAKE_OVER`]'s result that holds the old status: the one after the row's.
pub(super) const PREVIOUS_STATUS: usize = COLUMN_COUNT;

/// One attempt counted, by the lease holder only. Parameters: key, owner, the attempt's time,
/// the new lease end.
pub(super) static RECORD_ATTEMPT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = $3, \
         lease_expires_at = $4 \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
    )
});

/// The lease extended, by its holder only. Parameters: key, owner, the new lease end.
pub(super) static RENEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {TABLE} SET lease_expires_at = $3 \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
    )
});

/// The outcome written and the lease released, by the lease holder only. Parameters: key,
/// owner, status, then the saved response's status, headers and body. One assignment a line,
/// so counting an attempt in the same statement is one more line and one more parameter.
pub(super) static FINISH: LazyLock<String> = LazyLock::new(|| {
    let assignments = [
        "status = $3",
        "lease_owner = NULL",
        "lease_expires_at = NULL",
        "response_status = $4",
        "response_headers = $5",
        "response_body = $6",
        // The run's last attempt, when the finish carries it (`Finish::last_attempt_at`).
        "attempts = attempts + CASE WHEN $7::BIGINT IS NULL THEN 0 ELSE 1 END",
        "last_attempt_at = coalesce($7::BIGINT, last_attempt_at)",
    ]
    .join(", ");
    format!(
        "UPDATE {TABLE} SET {assignments} \
         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
    )
});

/// The outcomes of one batch, one statement: [`FINISH`] for each row of the arrays, each
/// applied only by its lease holder. Parameters: the arrays of keys, owners, statuses, saved
/// statuses, headers and bodies, and last attempts. Returns the keys whose row changed; a key
/// missing from them lost its lease.
pub(super) static FINISH_MANY: LazyLock<String> = LazyLock::new(|| {
    let assignments = [
        "status = u.status",
        "lease_owner = NULL",
        "lease_expires_at = NULL",
        "response_status = u.response_status",
        "response_headers = u.response_headers",
        "response_body = u.response_body",
        "attempts = t.attempts + CASE WHEN u.last_attempt_at IS NULL THEN 0 ELSE 1 END",
        "last_attempt_at = coalesce(u.last_attempt_at, t.last_attempt_at)",
    ]
    .join(", ");
    format!(
        "UPDATE {TABLE} AS t SET {assignments} \
         FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::INTEGER[], $5::TEXT[], \
         $6::BYTEA[], $7::BIGINT[]) \
         AS u(key, owner, status, response_status, response_headers, response_body, \
         last_attempt_at) \
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

/// At most `$2` expired rows deleted (expiry at or before `$1`).
pub(super) static PURGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM {TABLE} WHERE key IN \
         (SELECT key FROM {TABLE} WHERE expires_at <= $1 LIMIT $2)"
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_take_over_returns_the_old_status_after_the_row() {
        assert_eq!(COLUMNS.split(", ").count(), PREVIOUS_STATUS);
        assert!(
            TAKE_OVER.ends_with("t.resolution_reason, old.status"),
            "{}",
            *TAKE_OVER
        );
    }

    #[test]
    fn the_finish_touches_only_the_lease_holder_s_row_in_flight() {
        assert!(FINISH.starts_with(&format!(
            "UPDATE {TABLE} SET status = $3, lease_owner = NULL"
        )));
        assert!(FINISH.ends_with("WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"));
    }
}
