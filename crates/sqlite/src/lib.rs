//! The SQLite ledger: a file on one machine, shared by every process that opens it.
//!
//! One writer thread per ledger commits the writes in batches (`writer`); reads run on a
//! read-only connection of their own, beside it. `statements` holds what each call does to
//! the file, `reconcile` what reconciling does to it, `migrate` the schema steps.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

/// The SQLite driver this crate links, for the workspace's own tests that open the file
/// behind the ledger's back: not covered by semver.
#[doc(hidden)]
pub use rusqlite;

mod migrate;
pub mod outbox;
mod private;
mod reconcile;
mod statements;
mod sync;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};

use self::writer::Writer;
use idempotent_retry_ledger::sql::{SCHEMA_VERSION, TABLE, next_step};
use idempotent_retry_ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerClock, LedgerError, LedgerFuture,
    ListFilter, OperationRecord, ReconcileClaim, Renew, Resolve,
};

/// How long a statement waits for another process's write lock before failing.
const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A [`Ledger`] in an SQLite file: the default for one machine.
///
/// Every process that opens the same file shares the rows. The file is in WAL mode and a write
/// is answered only once it is on the disk (the guarantee of `synchronous = FULL`): a row
/// written is a row kept, even across a power loss. One writer thread per ledger commits the
/// queued writes in batches; reads go through a read-only connection beside it. The `sqlite`
/// feature links the system's SQLite (3.35 or later, checked by [`open`](Self::open));
/// `sqlite-bundled` compiles SQLite in. [`open_read_only`](Self::open_read_only) opens a file
/// with no writer.
///
/// # Errors
///
/// A batch whose transaction fails (lock not obtained within the
/// [busy timeout](Self::set_busy_timeout), full disk, I/O error) fails every write in it; after
/// a failed sync, or once the writer thread has died, every write fails with
/// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable).
///
/// Group commit, what is durable when, and the read-only mode: `docs/sqlite.md`.
///
/// # Examples
///
/// ```
/// use idempotent_retry::Client;
/// use idempotent_retry::ledger::SqliteLedger;
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
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Closed first (`Drop`): the write connection, closing last, checkpoints the WAL into
    /// the file and removes it, which a read-only connection cannot. `None` only once dropping.
    reader: Option<Arc<Mutex<Connection>>>,
    /// `None` when the ledger was opened read-only.
    writer: Option<Writer>,
    /// The writer thread, for [`SqliteLedger::close`] to wait for.
    thread: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
}

/// The longest WAL [`SqliteLedger::close_keeping_log`] leaves beside the file: the next
/// process reads it through when it opens the file.
const KEPT_LOG_LIMIT: u64 = 512 * 1024;

/// How long dropping the last handle waits for the writer thread to checkpoint the WAL into
/// the file and close it (milliseconds, as a rule): long enough that a process which exits
/// right after (the end of `main`) leaves no WAL behind, short enough to hold nobody up.
const CLOSE_ON_DROP: Duration = Duration::from_secs(1);

impl Drop for Inner {
    /// The last handle: the reader closed, then the writer thread told to close (it checkpoints
    /// the WAL into the file and removes it) and waited for, at most [`CLOSE_ON_DROP`].
    /// [`SqliteLedger::close`] waits as long as its caller says instead.
    fn drop(&mut self) {
        drop(self.reader.take());
        let Some(writer) = self.writer.take() else {
            return;
        };
        // `close` takes the thread to wait for it itself: then nothing is waited for here.
        if self.thread.is_none() {
            return;
        }
        if writer.end(CLOSE_ON_DROP)
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

impl SqliteLedger {
    /// The schema version this release reads and writes (the SQL ledgers share it; the schema:
    /// `docs/ledger.md`). [`open`](Self::open) and
    /// [`migrate`](Self::migrate) bring a file to it; [`open_read_only`](Self::open_read_only)
    /// opens only a file at it.
    pub const SCHEMA_VERSION: u32 = SCHEMA_VERSION;

    /// Opens (creating if needed) the ledger file at `path`, starts its writer thread and runs
    /// [`migrate`](Self::migrate).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database; [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable)
    /// when it cannot be opened or written (a missing directory, a read-only file system, a
    /// path that is a directory), when the linked SQLite is older than 3.35, or when the
    /// system refuses the writer thread.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        Self::open_with(path.as_ref(), Writer::spawn).await
    }

    /// [`open`](Self::open), with the writer thread started by `spawn`.
    async fn open_with(
        path: &Path,
        spawn: impl FnOnce(Connection) -> Result<(Writer, std::thread::JoinHandle<()>), LedgerError>,
    ) -> Result<Self, LedgerError> {
        check_library(rusqlite::version_number(), rusqlite::version())?;
        let path = path.to_path_buf();
        let opened = path.clone();
        let conn = blocking(move || open_writer(&opened)).await?;
        // The thread ends by itself once the last sender is dropped; only `close` waits for it.
        let (writer, thread) = spawn(conn)?;
        writer.alone(migrate::migrate).await?;
        // After the migration, so the file is in WAL mode with its `-shm` and `-wal` in place,
        // which a read-only connection needs.
        let opened = path.clone();
        let reader = blocking(move || open_reader(&opened)).await?;
        Ok(SqliteLedger {
            inner: Arc::new(Inner {
                reader: Some(Arc::new(Mutex::new(reader))),
                writer: Some(writer),
                thread: Some(thread),
                path,
            }),
        })
    }

    /// Opens the existing ledger file at `path` for reading only: [`get`](Ledger::get),
    /// [`list`](Ledger::list) and [`schema_version`](Self::schema_version) answer from it, and
    /// every write ([`claim`](Ledger::claim), [`finish`](Ledger::finish),
    /// [`migrate`](Self::migrate), ...) is refused. The file is never created, migrated or
    /// written; SQLite may create its missing `-wal` and `-shm` files beside it
    /// (`docs/sqlite.md`).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput) when the file
    /// is at an older schema version than [`SCHEMA_VERSION`](Self::SCHEMA_VERSION) (the
    /// message names both and the fix: [`migrate`](Self::migrate) it, or run
    /// `idempotent-retry-ledger --sqlite FILE migrate`);
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when it is not an SQLite
    /// database, holds no ledger table or one of another shape, or is at a newer version than
    /// this release knows;
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when there is no
    /// file at `path`, it cannot be read, or the linked SQLite is older than 3.35.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::ledger::{Ledger, LedgerErrorKind, ListFilter, SqliteLedger};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = std::env::temp_dir().join(format!("ir-doc-ro-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("operations.db");
    /// // A missing file is not created.
    /// let missing = SqliteLedger::open_read_only(&path).await.unwrap_err();
    /// assert_eq!(missing.kind(), LedgerErrorKind::Unavailable);
    /// assert!(!path.exists());
    ///
    /// drop(SqliteLedger::open(&path).await?); // a worker made the file
    /// let ledger = SqliteLedger::open_read_only(&path).await?;
    /// assert!(ledger.list(&ListFilter::new(10)).await?.is_empty());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(()) }
    /// ```
    pub async fn open_read_only(path: impl AsRef<Path>) -> Result<Self, LedgerError> {
        check_library(rusqlite::version_number(), rusqlite::version())?;
        let path = path.as_ref().to_path_buf();
        let opened = path.clone();
        let reader = blocking(move || {
            let conn = open_existing(&opened)?;
            check_readable(&conn, &opened, migrate::read_version(&conn)?)?;
            Ok(conn)
        })
        .await?;
        Ok(SqliteLedger {
            inner: Arc::new(Inner {
                reader: Some(Arc::new(Mutex::new(reader))),
                writer: None,
                thread: None,
                path,
            }),
        })
    }

    /// Closes the ledger when this is its last handle: the read connection, then the writer
    /// thread's, which checkpoints the WAL into the file and removes it. Waits for that for at
    /// most `limit`; returns `true` once the file is closed, `false` when another clone still
    /// holds the ledger (it closes when the last one is dropped) or `limit` passed first.
    ///
    /// Dropping the last handle closes the file too, waiting up to a second for the writer
    /// thread to checkpoint it, so a process that ends right after (the end of `main`) leaves
    /// no WAL behind; call this to wait longer, or to know that it closed.
    pub async fn close(self, limit: std::time::Duration) -> bool {
        self.close_with(limit, false).await
    }

    /// [`close`](Self::close), leaving the WAL beside the file instead of checkpointing it
    /// while it holds at most 512 KiB: for a short-lived process (idemcurl, a script) that
    /// opens the ledger for one operation. Every write it made is already on the disk in the
    /// WAL (each was synced before it was answered), so nothing is lost; the checkpoint's two
    /// syncs (the log's, the file's) are skipped, and so are the next process's two (the log's
    /// new header and its directory) for a log it would otherwise create again. The next
    /// process to open the file reads the kept log through once (SQLite's recovery of a log no
    /// open connection holds), which the 512 KiB bound keeps short; a longer log is
    /// checkpointed as by [`close`](Self::close). A copy of the ledger is then the file with
    /// its `-wal` (or one made with SQLite's `.backup`). Returns as [`close`](Self::close)
    /// does.
    pub async fn close_keeping_log(self, limit: std::time::Duration) -> bool {
        self.close_with(limit, true).await
    }

    async fn close_with(self, limit: std::time::Duration, keep_log: bool) -> bool {
        let short_log = || {
            std::fs::metadata(format!("{}-wal", self.inner.path.display()))
                .is_ok_and(|log| log.len() <= KEPT_LOG_LIMIT)
        };
        if keep_log
            && Arc::strong_count(&self.inner) == 1
            && let Some(writer) = &self.inner.writer
            && short_log()
        {
            // The writer's connection closes last, and closing is what checkpoints: told not to.
            // Should it refuse, the log is checkpointed as by `close`.
            let _ = writer
                .alone(|conn| {
                    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
                        .map_err(|err| storage(err, "cannot keep the log at close"))
                })
                .await;
        }
        let Ok(mut inner) = Arc::try_unwrap(self.inner) else {
            return false;
        };
        let thread = inner.thread.take();
        // The reader first: the writer's connection, closing last, is the one that checkpoints.
        drop(inner);
        let Some(thread) = thread else {
            return true;
        };
        let joined = tokio::task::spawn_blocking(move || thread.join().is_ok());
        matches!(tokio::time::timeout(limit, joined).await, Ok(Ok(true)))
    }

    /// The schema version of the existing ledger file at `path`, read without opening it as a
    /// ledger: nothing is created, migrated or written. It tells whether
    /// [`open_read_only`](Self::open_read_only) will take the file (at
    /// [`SCHEMA_VERSION`](Self::SCHEMA_VERSION)) and what [`migrate`](Self::migrate) will do.
    ///
    /// # Errors
    ///
    /// As [`schema_version`](Self::schema_version), and
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when there is no
    /// file at `path`.
    pub async fn file_schema_version(path: impl AsRef<Path>) -> Result<u32, LedgerError> {
        let path = path.as_ref().to_path_buf();
        blocking(move || migrate::read_version(&open_existing(&path)?)).await
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How long a statement waits for another process's write lock before failing with
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable). While the writer
    /// waits, the writes queued behind it wait too.
    ///
    /// Default: 5 s.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) if SQLite
    /// refuses the setting, or the writer thread stopped.
    pub async fn set_busy_timeout(&self, timeout: Duration) -> Result<(), LedgerError> {
        if let Some(writer) = &self.inner.writer {
            writer.alone(move |conn| configure(conn, timeout)).await?;
        }
        self.read(move |conn| configure(conn, timeout)).await
    }

    /// Brings the file to the crate's schema version, creating the table and its index in a
    /// new file, and checks that the table has every column. Safe to run on every start, and
    /// from several processes at once. What it does with older and newer files: `docs/ledger.md`,
    /// "Versions". It runs on the writer thread between two batches.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database, its table has another shape, or its schema version is newer than this
    /// release knows (the file is left as it was);
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when it cannot be
    /// written (a read-only file system, another process holding the write lock past the
    /// [busy timeout](Self::set_busy_timeout)), the writer thread stopped, or the ledger was
    /// [opened read-only](Self::open_read_only).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        self.writer()?.alone(migrate::migrate).await
    }

    /// The schema version the file is at, from its `PRAGMA user_version` (0 when none is
    /// recorded). [`open`](Self::open) migrates, so this is the crate's version unless the file
    /// changed since (a newer release migrated it, say).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the file is not an
    /// SQLite database or holds a negative version;
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when it cannot be
    /// read.
    pub async fn schema_version(&self) -> Result<u32, LedgerError> {
        self.read(migrate::read_version).await
    }

    /// The writer, unless the ledger was opened read-only.
    fn writer(&self) -> Result<&Writer, LedgerError> {
        self.inner.writer.as_ref().ok_or_else(|| {
            LedgerError::unavailable(format!(
                "{} was opened read-only: writes are refused",
                self.inner.path.display()
            ))
        })
    }

    /// Queues `write` for the next batch, or refuses it at once on a read-only ledger.
    fn batched<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> LedgerFuture<'_, T> {
        match self.writer() {
            Ok(writer) => Box::pin(writer.batched(write)),
            Err(refused) => Box::pin(std::future::ready(Err(refused))),
        }
    }

    /// Runs `f` on the read-only connection, on tokio's blocking pool.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let reader = Arc::clone(
            self.inner
                .reader
                .as_ref()
                .expect("the reader is open while a handle lives"),
        );
        blocking(move || {
            // A panic inside a read leaves no transaction open (a statement resets when it is
            // dropped), so a poisoned lock is still usable.
            let conn = reader
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            f(&conn)
        })
        .await
    }
}

/// The write connection: created if missing (owner-only, 0600), in WAL mode,
/// `synchronous = FULL`.
fn open_writer(path: &Path) -> Result<Connection, LedgerError> {
    // Owner-only before SQLite creates it (its -wal and -shm files take the same mode).
    private::create_private(path)?;
    let conn = Connection::open(path).map_err(|err| storage(err, "cannot open"))?;
    configure(&conn, DEFAULT_BUSY_TIMEOUT)?;
    enable_wal(&conn)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|err| storage(err, "cannot configure"))?;
    Ok(conn)
}

/// The read connection: read-only, on a file the write connection has already opened.
fn open_reader(path: &Path) -> Result<Connection, LedgerError> {
    let conn = read_only(path).map_err(|err| storage(err, "cannot open"))?;
    configure(&conn, DEFAULT_BUSY_TIMEOUT)?;
    Ok(conn)
}

/// A read-only connection (`SQLITE_OPEN_READ_ONLY`, which never creates the file).
fn read_only(path: &Path) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    Connection::open_with_flags(path, flags)
}

/// A read-only connection to an existing file, for [`SqliteLedger::open_read_only`]: never
/// created, and refused at once when it cannot be read.
fn open_existing(path: &Path) -> Result<Connection, LedgerError> {
    let cannot = |err: rusqlite::Error| {
        let what = if err.sqlite_error_code() == Some(ErrorCode::CannotOpen) && !path.exists() {
            format!("no ledger file at {}", path.display())
        } else {
            format!("cannot open {} read-only", path.display())
        };
        storage(err, &what)
    };
    let conn = read_only(path).map_err(cannot)?;
    configure(&conn, DEFAULT_BUSY_TIMEOUT)?;
    // Opening reads nothing: the first read finds a file that is not a database, or a WAL
    // file whose `-shm` and `-wal` SQLite may not create.
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
        .map_err(|err| {
            if err.sqlite_error_code() == Some(ErrorCode::ReadOnly) {
                storage(
                    err,
                    &format!(
                        "cannot read {} read-only: in WAL mode SQLite needs the -wal and -shm \
                         files beside it, and cannot create them there (copy the file to a \
                         directory this user may write)",
                        path.display()
                    ),
                )
            } else {
                cannot(err)
            }
        })?;
    Ok(conn)
}

/// Refuses a file [`SqliteLedger::open_read_only`] cannot read as it is: at another schema
/// version than this release's, or without the ledger's table of the right shape.
fn check_readable(conn: &Connection, path: &Path, version: u32) -> Result<(), LedgerError> {
    if version == 0 && !has_table(conn)? {
        return Err(LedgerError::corrupt(format!(
            "{} has no {TABLE} table: it is not a ledger file",
            path.display()
        )));
    }
    if version < SCHEMA_VERSION {
        return Err(LedgerError::invalid(format!(
            "{path} is at schema version {version}, older than {SCHEMA_VERSION}, the version \
             this release reads, and a read-only open does not migrate: migrate it with \
             SqliteLedger::migrate or `idempotent-retry-ledger --sqlite {path} migrate`, once \
             every process using it runs a release that knows version {SCHEMA_VERSION}",
            path = path.display()
        )));
    }
    // A newer version is refused by name, as `migrate` refuses it.
    next_step(version)?;
    migrate::check_shape(conn)
}

fn has_table(conn: &Connection) -> Result<bool, LedgerError> {
    conn.query_row(
        "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [TABLE],
        |row| row.get(0),
    )
    .map_err(|err| storage(err, "cannot read the file's tables"))
}

fn configure(conn: &Connection, timeout: Duration) -> Result<(), LedgerError> {
    // Room for every statement the ledger runs (the outbox's take has a few texts), so none
    // is parsed again after its first use.
    conn.set_prepared_statement_cache_capacity(64);
    conn.busy_timeout(timeout)
        .map_err(|err| storage(err, "cannot configure"))
}

/// The oldest SQLite the ledger supports, 3.35.0 (2021-03-12). Its statements need the upsert
/// of 3.24.0 (`INSERT .. ON CONFLICT DO NOTHING`); the floor stays where it was promised, at
/// the first release with `RETURNING`, so that a statement may use it without moving the
/// promise.
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

/// Classifies an SQLite error, leaving the source to the caller.
fn classify(err: &rusqlite::Error, what: &str) -> LedgerError {
    let message = format!("{what} ({TABLE})");
    match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => LedgerError::corrupt(message),
        Some(_) | None => match err {
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::InvalidColumnType(..)
            | rusqlite::Error::IntegralValueOutOfRange(..) => LedgerError::corrupt(message),
            _ => LedgerError::unavailable(message),
        },
    }
}

/// Classifies an SQLite error, with it as the source.
fn storage(err: rusqlite::Error, what: &str) -> LedgerError {
    classify(&err, what).with_source(err)
}

impl Ledger for SqliteLedger {
    fn clock(&self) -> LedgerFuture<'_, LedgerClock> {
        // One file on one host: its processes share the host's clock, the caller's.
        Box::pin(std::future::ready(Ok(LedgerClock::Caller)))
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        let claim = claim.clone();
        self.batched(move |conn| statements::claim(conn, claim))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        let update = update.clone();
        self.batched(move |conn| statements::record_attempt(conn, &update))
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        let renew = renew.clone();
        self.batched(move |conn| statements::renew(conn, &renew))
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        let finish = finish.clone();
        self.batched(move |conn| statements::finish(conn, &finish))
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        let key = key.to_owned();
        Box::pin(self.read(move |conn| statements::select(conn, &key)))
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        self.batched(move |conn| statements::purge(conn, now, limit))
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        let claim = claim.clone();
        self.batched(move |conn| reconcile::claim_unresolved(conn, &claim))
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        let resolve = resolve.clone();
        self.batched(move |conn| reconcile::resolve(conn, &resolve))
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        let filter = filter.clone();
        Box::pin(self.read(move |conn| reconcile::list(conn, &filter)))
    }

    fn due<'a>(
        &'a self,
        query: &'a idempotent_retry_ledger::outbox::DueQuery,
    ) -> LedgerFuture<'a, Vec<idempotent_retry_ledger::outbox::QueuedOperation>> {
        let query = *query;
        Box::pin(self.read(move |conn| outbox::due(conn, &query)))
    }

    fn backlog(
        &self,
        now: SystemTime,
    ) -> LedgerFuture<'_, idempotent_retry_ledger::outbox::Backlog> {
        Box::pin(self.read(move |conn| outbox::backlog(conn, now)))
    }

    fn take_due<'a>(
        &'a self,
        take: &'a idempotent_retry_ledger::outbox::TakeDue,
    ) -> LedgerFuture<'a, Vec<idempotent_retry_ledger::outbox::Taken>> {
        let take = take.clone();
        self.batched(move |conn| outbox::take_due(conn, &take))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idempotent_retry_ledger::from_millis;
    use idempotent_retry_ledger::sql::{Dialect, STEPS};
    use idempotent_retry_ledger::{LedgerErrorKind, OperationStatus, SavedResponse};

    #[test]
    fn an_sqlite_older_than_the_floor_is_refused_by_name() {
        let err = check_library(3_031_001, "3.31.1").expect_err("3.31 is below the floor");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable);
        let message = err.to_string();
        assert!(message.contains("3.31.1"), "{message}");
        assert!(message.contains("3.35.0 or later"), "{message}");
        assert!(message.contains("sqlite-bundled"), "{message}");
        check_library(3_035_000, "3.35.0").expect("the floor itself");
        check_library(rusqlite::version_number(), rusqlite::version())
            .expect("the library these tests link");
    }

    #[tokio::test]
    async fn close_checkpoints_the_wal_into_the_file_once_the_last_handle_goes() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("closed.db");
        let ledger = SqliteLedger::open(&path).await.expect("opens");
        let wal = dir.path().join("closed.db-wal");
        assert!(wal.exists(), "open in WAL mode");
        let clone = ledger.clone();
        assert!(
            !clone.close(Duration::from_secs(10)).await,
            "another handle holds it"
        );
        assert!(ledger.close(Duration::from_secs(10)).await, "closed");
        assert!(!wal.exists(), "the WAL was checkpointed and removed");
        // And it opens again, at its version.
        let again = SqliteLedger::open(&path).await.expect("opens again");
        assert_eq!(
            again.schema_version().await.expect("version"),
            SqliteLedger::SCHEMA_VERSION
        );
    }

    #[tokio::test]
    async fn close_keeping_log_leaves_a_short_wal_that_the_next_open_reads() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("kept.db");
        let wal = dir.path().join("kept.db-wal");
        let ledger = SqliteLedger::open(&path).await.expect("opens");
        ledger.claim(&claim_of("kept")).await.expect("claims");
        assert!(
            ledger.close_keeping_log(Duration::from_secs(10)).await,
            "closed"
        );
        assert!(wal.exists(), "the WAL is kept beside the file");
        // What the WAL holds is the ledger's: the next process reads it.
        let again = SqliteLedger::open(&path).await.expect("opens again");
        let row = again.get("kept").await.expect("reads").expect("the row");
        assert_eq!(row.key, "kept");
        // A log past the bound is checkpointed as by `close`.
        let long = vec![b'x'; 64 * 1024];
        for n in 0..12 {
            let key = format!("long-{n}");
            again.claim(&claim_of(&key)).await.expect("claims");
            let finish = Finish::new(
                key.clone(),
                format!("run-{key}"),
                OperationStatus::Succeeded,
                Some(SavedResponse::new(200, Vec::new(), Some(long.clone()))),
            )
            .expect("a finish");
            again.finish(&finish).await.expect("finishes");
        }
        assert!(std::fs::metadata(&wal).expect("the WAL").len() > KEPT_LOG_LIMIT);
        assert!(
            again.close_keeping_log(Duration::from_secs(10)).await,
            "closed"
        );
        assert!(!wal.exists(), "a long WAL is checkpointed and removed");
    }

    /// Work that writes nothing (the migration of a current file) is answered without a
    /// sync: a short-lived process opening the ledger pays for its writes only.
    #[tokio::test]
    async fn a_migration_that_finds_the_file_current_is_answered_without_a_sync() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("current.db");
        drop(SqliteLedger::open(&path).await.expect("creates"));
        let syncs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&syncs);
        let ledger = SqliteLedger::open_with(&path, move |conn| {
            writer::Writer::spawn_hooked(
                conn,
                None,
                Some(Box::new(move |_| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(())
                })),
            )
        })
        .await
        .expect("opens");
        ledger.migrate().await.expect("current");
        assert_eq!(
            syncs.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "nothing written, nothing synced"
        );
        ledger.claim(&claim_of("written")).await.expect("claims");
        assert_eq!(
            syncs.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "a write is synced"
        );
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
        let before = ledger
            .writer()
            .expect("writable")
            .alone(state)
            .await
            .expect("state");
        ledger.migrate().await.expect("again");
        assert_eq!(
            ledger
                .writer()
                .expect("writable")
                .alone(state)
                .await
                .expect("state"),
            before
        );
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
    }

    /// A file a release at schema version 1 left, with a row: migrated to version 2 with the
    /// row kept, its request and resolution unknown, and reconcilable.
    #[tokio::test]
    async fn a_version_1_file_gains_the_reconciling_columns_with_its_rows_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("v1.db");
        let conn = Connection::open(&path).expect("open");
        for statement in (STEPS[0].statements)(Dialect::Sqlite) {
            conn.execute_batch(&statement)
                .expect("the version 1 schema");
        }
        conn.execute_batch(&format!(
            "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, first_attempt_at, \
             expires_at) VALUES ('k', 's', 'f', 'unknown', 2, 1000, 9000); \
             PRAGMA user_version = 1"
        ))
        .expect("a version 1 row");
        drop(conn);
        let ledger = SqliteLedger::open(&path).await.expect("open and migrate");
        assert_eq!(user_version(&path), i64::from(SCHEMA_VERSION));
        let row = ledger.get("k").await.expect("read").expect("kept");
        assert_eq!((row.attempts, row.method, row.resolution), (2, None, None));
        let hold =
            ReconcileClaim::new("k", "r", from_millis(10_000), from_millis(70_000)).expect("valid");
        assert!(matches!(
            ledger.claim_unresolved(&hold).await.expect("hold"),
            Some(Claimed::TakenOver { .. })
        ));
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
    async fn a_version_5_file_keeps_its_rows_and_its_queued_ones_leave_two_indexes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("five.db");
        let conn = Connection::open(&path).expect("open");
        for step in &STEPS[..5] {
            for column in step.columns {
                conn.execute_batch(&idempotent_retry_ledger::sql::add_column(
                    Dialect::Sqlite,
                    *column,
                ))
                .ok();
            }
            for statement in (step.statements)(Dialect::Sqlite) {
                conn.execute_batch(&statement).expect("a step");
            }
        }
        conn.pragma_update(None, "user_version", 5).expect("stamp");
        conn.execute_batch(&format!(
            "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
             first_attempt_at, expires_at, method, url, queued_at, not_before) VALUES \
             ('q', 's', 'f', 'queued', 0, 1000, 9000, 'POST', 'https://a.example/x', 1000, \
             1000), ('u', 's', 'f', 'unknown', 1, 1000, 9000, 'POST', 'https://a.example/x', \
             NULL, NULL)"
        ))
        .expect("rows");
        drop(conn);
        let ledger = SqliteLedger::open(&path).await.expect("open");
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
        assert_eq!(
            ledger.get("q").await.expect("read").expect("kept").status,
            idempotent_retry_ledger::OperationStatus::Queued
        );
        let unresolved = ledger
            .list(&ListFilter::new(10).unresolved())
            .await
            .expect("list");
        assert_eq!(unresolved.len(), 1);
        assert_eq!(unresolved[0].key, "u");
        drop(ledger);
        let conn = Connection::open(&path).expect("open");
        assert_queued_rows_left_out(&conn);
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
    async fn a_read_only_ledger_reads_what_a_writer_writes_and_refuses_every_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("shared.db");
        let missing = SqliteLedger::open_read_only(&path)
            .await
            .expect_err("no file");
        assert_eq!(missing.kind(), LedgerErrorKind::Unavailable, "{missing}");
        assert!(
            missing.to_string().contains("no ledger file at"),
            "{missing}"
        );
        assert!(!path.exists(), "not created");
        assert_eq!(
            SqliteLedger::file_schema_version(&path)
                .await
                .expect_err("no file")
                .kind(),
            LedgerErrorKind::Unavailable
        );
        assert!(!path.exists(), "not created");

        let writer = SqliteLedger::open(&path).await.expect("open");
        let reader = SqliteLedger::open_read_only(&path)
            .await
            .expect("open read-only");
        assert_eq!(
            reader.schema_version().await.expect("version"),
            SqliteLedger::SCHEMA_VERSION
        );
        writer.claim(&claim_of("seen")).await.expect("claim");
        let row = reader.get("seen").await.expect("read").expect("committed");
        assert_eq!(row.lease_owner.as_deref(), Some("run-seen"));

        let refused = [
            reader.claim(&claim_of("refused")).await.map(drop),
            reader
                .purge_batch(SystemTime::UNIX_EPOCH, 10)
                .await
                .map(drop),
            reader.migrate().await,
        ];
        for result in refused {
            let err = result.expect_err("read-only");
            assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
            assert!(err.to_string().contains("opened read-only"), "{err}");
        }
        reader
            .set_busy_timeout(Duration::from_secs(1))
            .await
            .expect("the reader's own setting");
        assert!(writer.get("refused").await.expect("read").is_none());
    }

    #[tokio::test]
    async fn a_read_only_open_refuses_an_older_file_with_its_fix_and_leaves_it_as_it_was() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("v2.db");
        drop(SqliteLedger::open(&path).await.expect("open"));
        let older = SCHEMA_VERSION - 1;
        Connection::open(&path)
            .expect("open")
            .pragma_update(None, "user_version", older)
            .expect("stamp");
        assert_eq!(
            SqliteLedger::file_schema_version(&path)
                .await
                .expect("version"),
            older
        );
        let bytes = std::fs::read(&path).expect("read");
        let err = SqliteLedger::open_read_only(&path)
            .await
            .expect_err("older");
        assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
        let message = err.to_string();
        for part in [
            format!("schema version {older}, older than {SCHEMA_VERSION}"),
            "idempotent-retry-ledger --sqlite".to_owned(),
            "migrate".to_owned(),
        ] {
            assert!(message.contains(&part), "{message:?} lacks {part:?}");
        }
        assert_eq!(std::fs::read(&path).expect("read"), bytes, "not migrated");
        assert_eq!(user_version(&path), i64::from(older));
    }

    #[tokio::test]
    async fn a_read_only_open_refuses_a_newer_file_and_one_without_the_table() {
        let dir = tempfile::tempdir().expect("temp dir");
        let newer = dir.path().join("newer.db");
        Connection::open(&newer)
            .expect("open")
            .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .expect("stamp");
        let err = SqliteLedger::open_read_only(&newer)
            .await
            .expect_err("newer");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(
            err.to_string().contains("upgrade idempotent-retry"),
            "{err}"
        );

        let other = dir.path().join("other.db");
        Connection::open(&other)
            .expect("open")
            .execute_batch("CREATE TABLE notes (text TEXT)")
            .expect("create");
        let err = SqliteLedger::open_read_only(&other)
            .await
            .expect_err("not a ledger");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(err.to_string().contains("not a ledger file"), "{err}");

        let garbage = dir.path().join("garbage.db");
        std::fs::write(&garbage, vec![0x5a_u8; 8192]).expect("write garbage");
        let err = SqliteLedger::open_read_only(&garbage)
            .await
            .expect_err("not a database");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
    }

    /// A key prefix is read through the key's index (SQLite's plan says so), and finds the
    /// keys that start with it, pattern characters and all.
    #[tokio::test]
    async fn a_key_prefix_is_found_through_the_key_index() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("prefix.db");
        let ledger = SqliteLedger::open(&path).await.expect("open");
        for key in ["ab_1", "ab_2", "abc", "ab%", "aB_3", "ac"] {
            ledger.claim(&claim_of(key)).await.expect("claim");
        }
        let keys = |prefix: &str| {
            let ledger = ledger.clone();
            let filter = ListFilter::new(10).key_prefix(prefix);
            async move {
                let mut keys: Vec<String> = ledger
                    .list(&filter)
                    .await
                    .expect("list")
                    .into_iter()
                    .map(|row| row.key)
                    .collect();
                keys.sort();
                keys
            }
        };
        assert_eq!(keys("ab_").await, ["ab_1", "ab_2"]);
        assert_eq!(keys("ab").await, ["ab%", "ab_1", "ab_2", "abc"]);
        assert_eq!(keys("ab%").await, ["ab%"]);
        assert!(keys("b").await.is_empty());

        let (sql, _) = idempotent_retry_ledger::sql::list_query(
            Dialect::Sqlite,
            &ListFilter::new(10).key_prefix("ab"),
        );
        let conn = Connection::open(&path).expect("open");
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain")
            .query_map(rusqlite::params!["ab", "ac", 10], |row| row.get(3))
            .expect("plan")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert!(
            plan.iter()
                .any(|step| step.contains("USING INDEX sqlite_autoindex") && step.contains("key>?")),
            "{plan:?}"
        );
    }

    /// The plan of `sql`, one line per step.
    fn plan(conn: &Connection, sql: &str) -> Vec<String> {
        let mut statement = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let mut rows = statement.raw_query();
        let mut plan = Vec::new();
        while let Some(row) = rows.next().expect("a step") {
            plan.push(row.get::<_, String>(3).expect("its text"));
        }
        plan
    }

    #[tokio::test]
    async fn queued_rows_stay_out_of_the_expiry_and_status_indexes_and_every_sweep_is_indexed() {
        use idempotent_retry_ledger::OperationStatus;
        use idempotent_retry_ledger::sql::{BACKLOG_QUERY, list_query};
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("plans.db");
        drop(SqliteLedger::open(&path).await.expect("open"));
        let conn = Connection::open(&path).expect("open");
        assert_queued_rows_left_out(&conn);
        let uses = |sql: &str, index: &str| {
            let plan = plan(&conn, sql);
            assert!(
                plan.iter()
                    .any(|step| step.contains(&format!("USING INDEX {TABLE}_{index}"))),
                "{sql}: {plan:?}"
            );
        };
        uses(&statements::PURGE, "expires_at");
        uses(BACKLOG_QUERY, "queued");
        for branch in outbox::TAKE_SELECT.iter().chain(outbox::DUE_SELECT.iter()) {
            let index = if branch.contains("INDEXED BY") {
                "queued"
            } else {
                "status"
            };
            uses(branch, index);
        }
        uses(
            &list_query(Dialect::Sqlite, &ListFilter::new(10).unresolved()).0,
            "status",
        );
        for status in [
            OperationStatus::Unknown,
            OperationStatus::InFlight,
            OperationStatus::NotSent,
            OperationStatus::Succeeded,
        ] {
            uses(
                &list_query(Dialect::Sqlite, &ListFilter::new(10).status(status)).0,
                "status",
            );
        }
        uses(
            &list_query(
                Dialect::Sqlite,
                &ListFilter::new(10).status(OperationStatus::Queued),
            )
            .0,
            "queued",
        );
    }

    #[tokio::test]
    async fn the_reads_with_a_limit_keep_their_plan_whatever_limit_is_bound() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("limits.db");
        drop(SqliteLedger::open(&path).await.expect("open"));
        let conn = Connection::open(&path).expect("open");
        let list = idempotent_retry_ledger::sql::list_query(
            Dialect::Sqlite,
            &ListFilter::new(10).unresolved(),
        )
        .0;
        let statements = outbox::TAKE_SELECT
            .iter()
            .chain(outbox::DUE_SELECT.iter())
            .chain([&*statements::PURGE, &list]);
        for sql in statements {
            let mut statement = conn.prepare(sql).expect("prepare");
            for limit in 1..=3_i64 {
                for index in 1..=statement.parameter_count() {
                    statement.raw_bind_parameter(index, limit).expect("bind");
                }
                let mut rows = statement.raw_query();
                while rows.next().expect("a row").is_some() {}
            }
            assert_eq!(
                statement.get_status(rusqlite::StatementStatus::RePrepare),
                0,
                "{sql}"
            );
        }
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

    /// The expiry and status indexes leave queued rows out (schema version 6).
    fn assert_queued_rows_left_out(conn: &Connection) {
        for index in ["expires_at", "status"] {
            let sql: String = conn
                .query_row(
                    "SELECT sql FROM sqlite_master WHERE name = ?1",
                    [format!("{TABLE}_{index}")],
                    |row| row.get(0),
                )
                .expect("the index");
            assert!(sql.ends_with("WHERE status <> 'queued'"), "{sql}");
        }
    }

    fn claim_of(key: &str) -> Claim {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        Claim::builder(
            key,
            "f",
            format!("run-{key}"),
            now,
            now + Duration::from_secs(60),
        )
        .expires_at(now + Duration::from_secs(3600))
        .build()
        .expect("valid claim")
    }

    /// A claim made at a time finer than a millisecond returns the row as the file keeps it:
    /// what a later read gives, new row or take-over, times and all.
    #[tokio::test]
    async fn a_claim_returns_its_row_as_stored_to_the_millisecond() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = SqliteLedger::open(dir.path().join("fine.db"))
            .await
            .expect("open");
        let now = SystemTime::UNIX_EPOCH + Duration::new(1_704_067_200, 123_456_789);
        let claim = |owner: &str, at: SystemTime| {
            Claim::builder("fine", "f", owner, at, at + Duration::new(60, 987_654))
                .expires_at(at + Duration::new(3600, 555_555))
                .request("POST", "https://api.example/v1/charges")
                .build()
                .expect("valid claim")
        };
        let Claimed::New(new) = ledger.claim(&claim("run-a", now)).await.expect("claim") else {
            panic!("a new row");
        };
        let stored = ledger.get("fine").await.expect("read").expect("row");
        assert_eq!(new, stored, "the new row as a read gives it");
        assert_eq!(
            new.first_attempt_at,
            SystemTime::UNIX_EPOCH + Duration::from_millis(1_704_067_200_123)
        );
        let later = now + Duration::from_secs(120);
        let Claimed::TakenOver { record, .. } =
            ledger.claim(&claim("run-b", later)).await.expect("claim")
        else {
            panic!("a take-over of the lapsed lease");
        };
        let stored = ledger.get("fine").await.expect("read").expect("row");
        assert_eq!(record, stored, "the taken-over row as a read gives it");
    }

    /// The keys with a row, read with a connection of the test's own.
    fn rows(path: &Path) -> Vec<String> {
        let conn = Connection::open(path).expect("open");
        let mut statement = conn
            .prepare(&format!("SELECT key FROM {TABLE} ORDER BY key"))
            .expect("select");
        statement
            .query_map([], |row| row.get(0))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("keys")
    }

    /// The writer dies inside its second batch's transaction, before `COMMIT`: the first
    /// batch's claim was acknowledged and is in the file; no claim of the dead batch was told
    /// it was recorded, and none of them is in the file; every later write fails at once as
    /// unavailable instead of hanging, while reads still answer from the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_writer_that_dies_before_commit_acknowledges_nothing_of_its_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("dies.db");
        let mut batches = 0;
        let ledger = SqliteLedger::open_with(&path, |conn| {
            writer::Writer::spawn_with(
                conn,
                Box::new(move |_| {
                    batches += 1;
                    assert!(batches < 2, "the writer dies before its second commit");
                }),
            )
        })
        .await
        .expect("open");
        let first = ledger.claim(&claim_of("first")).await.expect("first batch");
        assert!(matches!(first, Claimed::New(_)), "{first:?}");

        let mut claims = tokio::task::JoinSet::new();
        for n in 0..50 {
            let ledger = ledger.clone();
            claims.spawn(async move { ledger.claim(&claim_of(&format!("doomed-{n:02}"))).await });
        }
        let mut refused = 0;
        while let Some(claimed) = claims.join_next().await {
            let err = claimed.expect("task").expect_err("never acknowledged");
            assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
            refused += 1;
        }
        assert_eq!(refused, 50);
        assert_eq!(rows(&path), ["first"], "nothing of the dead batch");

        let later = tokio::time::timeout(Duration::from_secs(5), ledger.claim(&claim_of("later")))
            .await
            .expect("answered, not hung");
        let err = later.expect_err("the writer is gone");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains("writer thread stopped"), "{err}");
        let row = ledger.get("first").await.expect("read").expect("row");
        assert_eq!(row.lease_owner.as_deref(), Some("run-first"));
    }

    /// A hook for the writer's commits or syncs: it says each call's count on the returned
    /// receiver, and holds the first call until the returned sender is sent to.
    pub(super) fn hold_first() -> (
        impl FnMut(usize) + Send + 'static,
        std::sync::mpsc::Receiver<usize>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (entered, inside) = std::sync::mpsc::channel::<usize>();
        let (gate, held) = std::sync::mpsc::channel::<()>();
        let mut calls = 0;
        let hook = move |count| {
            calls += 1;
            let _ = entered.send(count);
            if calls == 1 {
                let _ = held.recv();
            }
        };
        (hook, inside, gate)
    }

    /// `write` polled once, which queues it behind a held batch or sync, to be awaited later.
    pub(super) async fn queued<F: Future>(write: F) -> std::pin::Pin<Box<F>> {
        let mut write = Box::pin(write);
        std::future::poll_fn(|cx| {
            assert!(
                write.as_mut().poll(cx).is_pending(),
                "answered while queued"
            );
            std::task::Poll::Ready(())
        })
        .await;
        write
    }

    /// Opens a ledger whose writer runs `hook` before each sync once the ledger is open (the
    /// migration's own sync at open passes untouched).
    async fn with_sync_hook(
        path: &Path,
        mut hook: impl FnMut(usize) -> std::io::Result<()> + Send + 'static,
    ) -> SqliteLedger {
        let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = Arc::clone(&armed);
        let ledger = SqliteLedger::open_with(path, move |conn| {
            writer::Writer::spawn_hooked(
                conn,
                None,
                Some(Box::new(move |covered| {
                    if armed.load(std::sync::atomic::Ordering::SeqCst) {
                        hook(covered)
                    } else {
                        Ok(())
                    }
                })),
            )
        })
        .await
        .expect("open");
        open.store(true, std::sync::atomic::Ordering::SeqCst);
        ledger
    }

    /// A batch is committed before its log is synced, but nobody is told so until the sync:
    /// while the sync is held, the row is in the file (another connection reads it) and the
    /// claim is still unanswered; once the sync ends, the claim is acknowledged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_committed_write_is_acknowledged_only_after_its_log_is_synced() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("synced.db");
        let (entered, inside) = std::sync::mpsc::channel::<usize>();
        let (gate, held) = std::sync::mpsc::channel::<()>();
        let ledger = with_sync_hook(&path, move |covered| {
            let _ = entered.send(covered);
            let _ = held.recv();
            Ok(())
        })
        .await;
        let claim = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.claim(&claim_of("durable")).await }
        });
        let covered = tokio::task::spawn_blocking(move || {
            inside
                .recv_timeout(Duration::from_secs(10))
                .expect("the writer comes to sync the claim's batch")
        })
        .await
        .expect("task");
        assert_eq!(covered, 1);
        assert_eq!(rows(&path), ["durable"], "committed before the sync");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!claim.is_finished(), "not acknowledged before the sync");
        gate.send(()).expect("release the sync");
        let claimed = claim.await.expect("task").expect("acknowledged after it");
        assert!(matches!(claimed, Claimed::New(_)), "{claimed:?}");
    }

    /// Group commit: the claims that queue while the writer waits for the disk share the next
    /// transaction and the next sync, and none of them is answered before that sync.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_queued_during_a_sync_share_the_next_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("grouped.db");
        let (mut hook, inside, gate) = hold_first();
        let ledger = with_sync_hook(&path, move |covered| {
            hook(covered);
            Ok(())
        })
        .await;
        let first = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.claim(&claim_of("first")).await }
        });
        let inside = tokio::task::spawn_blocking(move || {
            let covered = inside
                .recv_timeout(Duration::from_secs(10))
                .expect("the first claim's sync");
            assert_eq!(covered, 1);
            inside
        })
        .await
        .expect("task");
        // Queued while the writer waits in the held sync: each polled once, which sends it.
        let claims = ["b", "c", "d"].map(claim_of);
        let mut waiting = Vec::new();
        for claim in &claims {
            waiting.push(queued(ledger.claim(claim)).await);
        }
        gate.send(()).expect("release the first sync");
        assert!(matches!(first.await.expect("task"), Ok(Claimed::New(_))));
        for claimed in waiting {
            assert!(matches!(claimed.await, Ok(Claimed::New(_))));
        }
        assert_eq!(
            inside.recv().expect("the second sync"),
            3,
            "one sync for the three claims queued during the first"
        );
    }

    /// A failed sync is final: the batch it covered is told its write may not be recorded,
    /// every later write is refused with the reason, and reads still answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_sync_fails_its_batch_and_refuses_every_later_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("unsynced.db");
        // The first claim's sync passes; every one after it fails.
        let mut synced = 0;
        let ledger = with_sync_hook(&path, move |_| {
            synced += 1;
            if synced == 1 {
                Ok(())
            } else {
                Err(std::io::Error::other("injected I/O error"))
            }
        })
        .await;
        let kept = ledger.claim(&claim_of("kept")).await.expect("synced");
        assert!(matches!(kept, Claimed::New(_)), "{kept:?}");

        let err = ledger
            .claim(&claim_of("unsynced"))
            .await
            .expect_err("its sync failed");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
        let message = err.to_string();
        assert!(message.contains("could not be synced"), "{message}");
        assert!(message.contains("injected I/O error"), "{message}");

        let later = tokio::time::timeout(Duration::from_secs(5), ledger.claim(&claim_of("later")))
            .await
            .expect("answered, not hung")
            .expect_err("refused after a failed sync");
        assert_eq!(later.kind(), LedgerErrorKind::Unavailable, "{later}");
        assert!(later.to_string().contains("writes are refused"), "{later}");
        assert!(!rows(&path).contains(&"later".to_owned()), "never written");
        let row = ledger.get("kept").await.expect("read").expect("row");
        assert_eq!(row.lease_owner.as_deref(), Some("run-kept"));
    }

    /// A caller that stops waiting while its claim is queued behind an open batch does not
    /// break the next batch: its claim lands, and the claims beside it are acknowledged.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_caller_leaves_its_batch_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("dropped.db");
        let (hook, inside, gate) = hold_first();
        let ledger = SqliteLedger::open_with(&path, |conn| {
            writer::Writer::spawn_with(conn, Box::new(hook))
        })
        .await
        .expect("open");
        let opener = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.claim(&claim_of("opener")).await }
        });
        let inside = tokio::task::spawn_blocking(move || {
            assert_eq!(inside.recv().expect("the first batch"), 1);
            inside
        })
        .await
        .expect("task");
        // Queued behind the open batch, then abandoned.
        let abandoned = claim_of("abandoned");
        let gave_up =
            tokio::time::timeout(Duration::from_millis(20), ledger.claim(&abandoned)).await;
        assert!(gave_up.is_err(), "still queued");
        let kept = tokio::spawn({
            let ledger = ledger.clone();
            async move { ledger.claim(&claim_of("kept")).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.send(()).expect("release");
        assert!(matches!(opener.await.expect("task"), Ok(Claimed::New(_))));
        assert!(matches!(kept.await.expect("task"), Ok(Claimed::New(_))));
        assert_eq!(
            inside.recv().expect("the second batch"),
            2,
            "one batch of two"
        );
        assert_eq!(rows(&path), ["abandoned", "kept", "opener"]);
    }
}
