//! The SQLite ledger: a file on one machine, shared by every process that opens it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use super::memory::may_take_over;
use super::sql::{COLUMNS, RawRow, TABLE, index, probe, response_columns, schema};
use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, OperationRecord,
    to_millis,
};

/// How long a statement waits for another process's write lock before failing.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Ledger`] in an SQLite file: the default for one machine.
///
/// Every process that opens the same file shares the rows; the claim runs in a `BEGIN
/// IMMEDIATE` transaction, so it is atomic across processes. The file is in WAL mode with
/// `synchronous = FULL`: a row written is a row kept, even across a power loss. Calls run on
/// tokio's blocking pool (`spawn_blocking`), never on the async worker threads. SQLite is
/// compiled into the crate (`rusqlite`'s `bundled` feature), so nothing needs installing.
///
/// # Examples
///
/// ```
/// use idempotent_retry::{Client, SqliteLedger};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("ir-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let ledger = SqliteLedger::open(dir.join("operations.db")).await?;
/// let client = Client::builder().ledger(ledger).build()?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl SqliteLedger {
    /// Opens (creating if needed) the ledger file at `path` and runs
    /// [`migrate`](Self::migrate).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database; [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable)
    /// when it cannot be opened or written (a missing directory, a read-only file system, a
    /// path that is a directory).
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let conn = blocking(move || {
            let conn = Connection::open(&opened).map_err(|err| storage(err, "cannot open"))?;
            conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
                .map_err(|err| storage(err, "cannot configure"))?;
            conn.pragma_update(None, "journal_mode", "WAL")
                .map_err(|err| storage(err, "cannot enable WAL"))?;
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(|err| storage(err, "cannot configure"))?;
            Ok(conn)
        })
        .await?;
        let ledger = SqliteLedger {
            conn: Arc::new(Mutex::new(conn)),
            path,
        };
        ledger.migrate().await?;
        Ok(ledger)
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long a statement waits for another process's write lock before failing with
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable).
    ///
    /// Default: 5 s.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) if SQLite
    /// refuses the setting.
    pub async fn set_busy_timeout(&self, timeout: Duration) -> Result<(), LedgerError> {
        self.with(move |conn| {
            conn.busy_timeout(timeout)
                .map_err(|err| storage(err, "cannot configure"))
        })
        .await
    }

    /// Creates the table and its index if they do not exist (see the schema in the
    /// [`Ledger`] docs). Safe to run on every start.
    ///
    /// # Errors
    ///
    /// As for [`open`](Self::open).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.with(|conn| {
            conn.execute_batch(&schema("BLOB"))
                .map_err(|err| storage(err, "cannot create the table"))?;
            conn.prepare(&probe()).map_err(|err| {
                LedgerError::corrupt(format!("table {TABLE} exists with another shape"))
                    .with_source(err)
            })?;
            conn.execute_batch(&index())
                .map_err(|err| storage(err, "cannot create the index"))
        })
        .await
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let conn = self.conn.clone();
        blocking(move || {
            // A panic inside a statement leaves SQLite's own state consistent (it rolls back
            // an open transaction when the `Transaction` is dropped), so a poisoned lock is
            // still usable.
            let mut conn = conn
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&mut conn)
        })
        .await
    }
}

/// Runs blocking SQLite work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, LedgerError> + Send + 'static,
) -> Result<T, LedgerError> {
    tokio::task::spawn_blocking(f).await.map_err(|err| {
        LedgerError::unavailable("the ledger's blocking task did not finish").with_source(err)
    })?
}

/// Classifies an SQLite error.
fn storage(err: rusqlite::Error, what: &str) -> LedgerError {
    let message = format!("{what} ({TABLE})");
    let error = match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => LedgerError::corrupt(message),
        Some(_) | None => match err {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => LedgerError::corrupt(message),
            _ => LedgerError::unavailable(message),
        },
    };
    error.with_source(err)
}

fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
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
    })
}

fn select(conn: &Connection, key: &str) -> Result<Option<OperationRecord>, LedgerError> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM {TABLE} WHERE key = ?1"),
        params![key],
        read_row,
    )
    .optional()
    .map_err(|err| storage(err, "cannot read the operation"))?
    .map(RawRow::into_record)
    .transpose()
}

fn claim_in(conn: &mut Connection, claim: &Claim) -> Result<Claimed, LedgerError> {
    // IMMEDIATE takes the write lock up front: from here to commit no other process can
    // insert or change the row, so the insert, the read and the take-over are one step.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|err| storage(err, "cannot begin the claim"))?;
    let inserted = tx
        .query_row(
            &format!(
                "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
                 first_attempt_at, lease_owner, lease_expires_at, expires_at) \
                 VALUES (?1, ?2, ?3, 'in_flight', 0, ?4, ?5, ?6, ?7) \
                 ON CONFLICT (key) DO NOTHING RETURNING {COLUMNS}"
            ),
            params![
                claim.key,
                claim.scope,
                claim.fingerprint,
                to_millis(claim.now),
                claim.owner,
                to_millis(claim.lease_until),
                to_millis(claim.expires_at),
            ],
            read_row,
        )
        .optional()
        .map_err(|err| storage(err, "cannot claim the operation"))?;
    let claimed = if let Some(row) = inserted {
        Claimed::New(row.into_record()?)
    } else {
        let existing = select(&tx, &claim.key)?.ok_or_else(|| {
            LedgerError::unavailable(format!("operation {} vanished during its claim", claim.key))
        })?;
        if may_take_over(&existing, claim) {
            let record = tx
                .query_row(
                    &format!(
                        "UPDATE {TABLE} SET status = 'in_flight', lease_owner = ?2, \
                         lease_expires_at = ?3, response_status = NULL, \
                         response_headers = NULL, response_body = NULL \
                         WHERE key = ?1 RETURNING {COLUMNS}"
                    ),
                    params![claim.key, claim.owner, to_millis(claim.lease_until)],
                    read_row,
                )
                .map_err(|err| storage(err, "cannot take the operation over"))?
                .into_record()?;
            Claimed::TakenOver {
                record,
                previous: existing.status,
            }
        } else {
            Claimed::Existing(existing)
        }
    };
    tx.commit()
        .map_err(|err| storage(err, "cannot commit the claim"))?;
    Ok(claimed)
}

impl Ledger for SqliteLedger {
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        let claim = claim.clone();
        Box::pin(self.with(move |conn| claim_in(conn, &claim)))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        let update = update.clone();
        Box::pin(self.with(move |conn| {
            let changed = conn
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = ?3, \
                         lease_expires_at = ?4 \
                         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
                    ),
                    params![
                        update.key,
                        update.owner,
                        to_millis(update.at),
                        to_millis(update.lease_until)
                    ],
                )
                .map_err(|err| storage(err, "cannot record the attempt"))?;
            if changed == 0 {
                return Err(LedgerError::lease_lost(&update.key));
            }
            Ok(())
        }))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        let finish = finish.clone();
        Box::pin(self.with(move |conn| {
            let (status, headers, body) = response_columns(finish.response.as_ref());
            let changed = conn
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET status = ?3, lease_owner = NULL, \
                         lease_expires_at = NULL, response_status = ?4, \
                         response_headers = ?5, response_body = ?6 \
                         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
                    ),
                    params![
                        finish.key,
                        finish.owner,
                        finish.status.as_str(),
                        status,
                        headers,
                        body
                    ],
                )
                .map_err(|err| storage(err, "cannot record the outcome"))?;
            if changed == 0 {
                return Err(LedgerError::lease_lost(&finish.key));
            }
            Ok(())
        }))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        let key = key.to_owned();
        Box::pin(self.with(move |conn| select(conn, &key)))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        Box::pin(self.with(move |conn| {
            let deleted = conn
                .execute(
                    &format!(
                        "DELETE FROM {TABLE} WHERE key IN \
                         (SELECT key FROM {TABLE} WHERE expires_at <= ?1 LIMIT ?2)"
                    ),
                    params![to_millis(now), i64::from(limit)],
                )
                .map_err(|err| storage(err, "cannot purge"))?;
            Ok(u64::try_from(deleted).unwrap_or(u64::MAX))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LedgerErrorKind;
    use crate::ledger::conformance;

    #[tokio::test]
    async fn sqlite_ledger_conforms() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = SqliteLedger::open(dir.path().join("ledger.db"))
            .await
            .expect("open");
        conformance::check(&ledger, "sqlite").await;
        let purge = SqliteLedger::open(dir.path().join("purge.db"))
            .await
            .expect("open");
        conformance::check_purge(&purge).await;
    }

    #[tokio::test]
    async fn a_file_that_is_not_a_database_is_corrupt() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("garbage.db");
        std::fs::write(&path, vec![0x5a_u8; 8192]).expect("write garbage");
        let err = SqliteLedger::open(&path).await.expect_err("not a database");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[tokio::test]
    async fn an_unopenable_path_is_unavailable() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A directory where the file should be, and a file under a missing directory.
        for path in [
            dir.path().to_path_buf(),
            dir.path().join("missing/dir/ledger.db"),
        ] {
            let err = SqliteLedger::open(&path).await.expect_err("cannot open");
            assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{path:?}: {err}");
        }
    }

    #[tokio::test]
    async fn a_table_of_another_shape_is_refused_with_a_typed_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).expect("open");
        conn.execute_batch(&format!(
            "CREATE TABLE {TABLE} (key TEXT PRIMARY KEY, n INTEGER)"
        ))
        .expect("create");
        drop(conn);
        let err = SqliteLedger::open(&path).await.expect_err("another shape");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("another shape"), "{err}");
    }
}
