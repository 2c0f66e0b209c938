//! The SQLite ledger: a file on one machine, shared by every process that opens it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::{Connection, ErrorCode, OptionalExtension, TransactionBehavior, params};

use super::sql::{
    COLUMNS, Dialect, RawRow, SCHEMA_VERSION, TABLE, next_step, probe, response_columns,
    shape_error, version_from,
};
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
/// tokio's blocking pool (`spawn_blocking`), never on the async worker threads. The `sqlite`
/// feature links the system's SQLite (3.35 or later, checked by [`open`](Self::open));
/// `sqlite-bundled` compiles SQLite into the crate, so nothing needs installing.
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
    /// path that is a directory), or when the linked SQLite is older than 3.35.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        check_library(rusqlite::version_number(), rusqlite::version())?;
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let conn = blocking(move || {
            let conn = Connection::open(&opened).map_err(|err| storage(err, "cannot open"))?;
            conn.busy_timeout(DEFAULT_BUSY_TIMEOUT)
                .map_err(|err| storage(err, "cannot configure"))?;
            enable_wal(&conn)?;
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

    /// Brings the file to the crate's schema version, creating the table and its index in a
    /// new file, and checks that the table has every column. Safe to run on every start, and
    /// from several processes at once. What it does with older and newer files is in the
    /// [schema docs](super::Ledger#schema).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database, its table has another shape, or its schema version is newer than this
    /// release knows (the file is left as it was);
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) when it cannot be
    /// written (a read-only file system, another process holding the write lock past the
    /// [busy timeout](Self::set_busy_timeout)).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.with(migrate_in).await
    }

    /// The schema version the file is at, from its `PRAGMA user_version` (0 when none is
    /// recorded). [`open`](Self::open) migrates, so this is the crate's version unless the file
    /// changed since (a newer release migrated it, say).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database or holds a negative version;
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) when it cannot be
    /// read.
    pub async fn schema_version(&self) -> Result<u32, LedgerError> {
        self.with(|conn| read_version(conn)).await
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

/// The oldest SQLite the ledger's statements run on: the claim and the take-over are one
/// `INSERT .. ON CONFLICT .. RETURNING` / `UPDATE .. RETURNING` each, and `RETURNING` arrived
/// in SQLite 3.35.0 (2021-03-12).
const MIN_SQLITE: (i32, &str) = (3_035_000, "3.35.0");

/// Refuses an SQLite library older than [`MIN_SQLITE`] (a system SQLite, with the `sqlite`
/// feature) before any statement fails on it with a syntax error that names no cause.
fn check_library(number: i32, version: &str) -> Result<(), LedgerError> {
    if number >= MIN_SQLITE.0 {
        return Ok(());
    }
    Err(LedgerError::unavailable(format!(
        "the SQLite library is {version}, the ledger needs {} or later: upgrade the system's \
         SQLite or build with the `sqlite-bundled` feature",
        MIN_SQLITE.1
    )))
}

/// Puts the file in WAL mode (a no-op when it is already).
fn enable_wal(conn: &Connection) -> Result<(), LedgerError> {
    // Processes opening a new file at once all try to switch it, and SQLite refuses the ones
    // that find the switch under way with SQLITE_BUSY at once, without the busy timeout (it
    // would deadlock otherwise). Taking and dropping the write lock waits, within the timeout,
    // for the switch to end; trying again then finds the file in WAL mode already.
    let mut tries = 0;
    loop {
        match conn.pragma_update(None, "journal_mode", "WAL") {
            Err(err) if err.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) && tries < 3 => {
                tries += 1;
                conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK")
                    .map_err(|err| storage(err, "cannot enable WAL"))?;
            }
            done => return done.map_err(|err| storage(err, "cannot enable WAL")),
        }
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

/// The file's `PRAGMA user_version`, as a schema version.
fn read_version(conn: &Connection) -> Result<u32, LedgerError> {
    let stored: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|err| storage(err, "cannot read the schema version"))?;
    version_from(stored)
}

/// Fails unless the table has every column the crate reads.
fn check_shape(conn: &Connection) -> Result<(), LedgerError> {
    conn.prepare(&probe())
        .map(drop)
        .map_err(|err| shape_error().with_source(err))
}

fn migrate_in(conn: &mut Connection) -> Result<(), LedgerError> {
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
    for statement in (step.statements)(Dialect::Sqlite) {
        if let Err(err) = tx.execute_batch(&statement) {
            // A statement over a table of another shape (the index on a missing column,
            // say) fails; name the shape, not the statement. A failed statement does not end
            // an SQLite transaction, so the check can still run.
            check_shape(&tx)?;
            return Err(storage(err, "cannot migrate"));
        }
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
        if claim.may_take_over(&existing) {
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
                         response_headers = ?5, response_body = ?6, \
                         attempts = attempts + (?7 IS NOT NULL), \
                         last_attempt_at = coalesce(?7, last_attempt_at) \
                         WHERE key = ?1 AND lease_owner = ?2 AND status = 'in_flight'"
                    ),
                    params![
                        finish.key,
                        finish.owner,
                        finish.status.as_str(),
                        status,
                        headers,
                        body,
                        finish.last_attempt_at.map(to_millis)
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
    use crate::ledger::ledger_conformance;
    use crate::ledger::sql::STEPS;

    /// Every case on a new file of its own, with the claims of the concurrent case racing on
    /// two threads (each claim is a transaction on the ledger's connection).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_ledger_conforms() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = 0;
        ledger_conformance(|| {
            files += 1;
            let path = dir.path().join(format!("case-{files}.db"));
            async move { SqliteLedger::open(path).await.expect("open") }
        })
        .await
        .assert_passed();
    }

    #[test]
    fn an_sqlite_older_than_returning_is_refused_by_name() {
        let err = check_library(3_031_001, "3.31.1").expect_err("3.31 has no RETURNING");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable);
        let message = err.to_string();
        assert!(message.contains("3.31.1"), "{message}");
        assert!(message.contains("3.35.0 or later"), "{message}");
        assert!(message.contains("sqlite-bundled"), "{message}");
        check_library(3_035_000, "3.35.0").expect("the first version with RETURNING");
        check_library(rusqlite::version_number(), rusqlite::version())
            .expect("the library these tests link");
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

    fn user_version(path: &Path) -> i64 {
        Connection::open(path)
            .expect("open")
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("user_version")
    }

    #[tokio::test]
    async fn a_new_file_is_at_the_current_version_and_a_second_migrate_changes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("new.db");
        let ledger = SqliteLedger::open(&path).await.expect("open");
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
        assert_eq!(user_version(&path), i64::from(SCHEMA_VERSION));
        // SQLite bumps the schema cookie on every change to the schema, and `total_changes`
        // counts the rows this connection changed.
        let state = |conn: &mut Connection| {
            let cookie: i64 = conn
                .pragma_query_value(None, "schema_version", |row| row.get(0))
                .map_err(|err| storage(err, "cookie"))?;
            Ok((cookie, conn.total_changes()))
        };
        let before = ledger.with(state).await.expect("state");
        ledger.migrate().await.expect("again");
        assert_eq!(ledger.with(state).await.expect("state"), before);
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
    }

    #[tokio::test]
    async fn a_file_without_a_version_is_checked_and_stamped_with_its_rows_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("old.db");
        let conn = Connection::open(&path).expect("open");
        for statement in (STEPS[0].statements)(Dialect::Sqlite) {
            conn.execute_batch(&statement).expect("0.1 schema");
        }
        conn.execute_batch(&format!(
            "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
             first_attempt_at, expires_at) VALUES ('k', 's', 'f', 'unknown', 2, 1000, 9000)"
        ))
        .expect("a row");
        drop(conn);
        assert_eq!(user_version(&path), 0);
        let ledger = SqliteLedger::open(&path).await.expect("open");
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
        let row = ledger.get("k").await.expect("read").expect("row kept");
        assert_eq!((row.attempts, row.scope.as_str()), (2, "s"));
    }

    #[tokio::test]
    async fn a_newer_version_is_refused_and_the_file_left_as_it_was() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("newer.db");
        let newer = SCHEMA_VERSION + 1;
        Connection::open(&path)
            .expect("open")
            .pragma_update(None, "user_version", newer)
            .expect("stamp");
        let err = SqliteLedger::open(&path).await.expect_err("newer");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(
            err.to_string().contains("upgrade idempotent-retry"),
            "{err}"
        );
        assert_eq!(user_version(&path), i64::from(newer));
        let tables: i64 = Connection::open(&path)
            .expect("open")
            .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
            .expect("count");
        assert_eq!(tables, 0, "no table was created");
    }

    #[tokio::test]
    async fn a_negative_version_is_corrupt() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("negative.db");
        Connection::open(&path)
            .expect("open")
            .pragma_update(None, "user_version", -3)
            .expect("stamp");
        let err = SqliteLedger::open(&path).await.expect_err("negative");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("-3"), "{err}");
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
        assert_eq!(user_version(&path), 0, "not stamped");
    }
}
