//! The text of every statement the ledger runs, built once. deadpool's statement cache keys
//! on the text, so each statement is parsed and planned once per connection, not per call.

use std::sync::LazyLock;

use crate::ledger::sql::{COLUMN_COUNT, COLUMNS, TABLE};

/// The claim of a new key: the insert is the lock, and of any number of workers racing for
/// one key exactly one gets the row. Parameters: key, scope, fingerprint, now, owner, lease
/// end, expiry.
pub(super) static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
         first_attempt_at, lease_owner, lease_expires_at, expires_at, method, url) \
         VALUES ($1, $2, $3, 'in_flight', 0, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (key) DO NOTHING RETURNING {COLUMNS}"
    )
});

/// The take-over of an existing key, one `UPDATE ... WHERE` stating the rule, which
/// PostgreSQL re-checks against the latest row under concurrent updates. The old status comes
/// from the locked sub-select: RETURNING alone sees the new row. The rule is
/// `Claim::may_take_over`'s, in SQL; `first_attempt_at > $5` is the window's openness with
/// the cutoff `window.rs` computed (`window::is_open`). Parameters: key, owner, lease end,
/// fingerprint, window cutoff, now. Returns the row's columns, then the old status.
pub(super) static TAKE_OVER: LazyLock<String> = LazyLock::new(|| {
    let columns = COLUMNS
        .split(", ")
        .map(|c| format!("t.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $2, \
         lease_expires_at = $3, response_status = NULL, \
         response_headers = NULL, response_body = NULL \
         FROM (SELECT key, status FROM {TABLE} WHERE key = $1 FOR UPDATE) AS old \
         WHERE t.key = old.key AND t.fingerprint = $4 \
         AND t.status <> 'succeeded' AND t.first_attempt_at > $5 \
         AND (t.status <> 'in_flight' OR t.lease_expires_at IS NULL \
              OR t.lease_expires_at <= $6) \
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
