//! The PostgreSQL ledger: one table shared by a fleet of workers.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, IsolationLevel, NoTls, Row};

use super::sql::{
    COLUMNS, Dialect, RawRow, SCHEMA_VERSION, TABLE, VERSION_TABLE, next_step, probe,
    response_columns, shape_error, version_from,
};
use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerFuture, OperationRecord,
    OperationStatus, to_millis,
};

/// Key of the advisory lock that serializes concurrent migrations.
const MIGRATION_LOCK: i64 = 0x6964_656d_706f_7465;

/// A [`Ledger`] in a PostgreSQL table, for fleets of workers sharing one record.
///
/// Every method is one statement, so the ledger shares a single connection between all the
/// client's concurrent operations (tokio-postgres pipelines them) and needs no transaction
/// state. The claim is `INSERT ... ON CONFLICT (key) DO NOTHING RETURNING`: the insert is the
/// lock, and of any number of workers racing for one key exactly one gets the row. A take-over
/// is one `UPDATE ... WHERE` stating the rule (same fingerprint, not succeeded, inside the
/// window, lease lapsed), which PostgreSQL re-checks against the latest row under concurrent
/// updates.
///
/// When the connection is lost, the call that notices fails with
/// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) and the next call
/// connects again. The connection is plain TCP (`NoTls`): use it on loopback, a private
/// network or through a TLS-terminating proxy.
///
/// # Examples
///
/// ```no_run
/// use idempotent_retry::{Client, LedgerOptions, PostgresLedger};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = PostgresLedger::connect("postgresql://app@db.internal/payments").await?;
/// ledger.migrate().await?; // once per deploy; safe to run concurrently
/// let client = Client::builder()
///     .ledger(ledger)
///     .ledger_options(LedgerOptions::new().worker("billing-7f9c"))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PostgresLedger {
    config: Config,
    client: Arc<Mutex<Option<Arc<Client>>>>,
}

impl PostgresLedger {
    /// Connects with a libpq-style connection string (`postgresql://user@host:port/db` or
    /// `host=... user=...`). Does not create the table: call [`migrate`](Self::migrate).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](super::LedgerErrorKind::InvalidInput) for a malformed
    /// string; [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) when the
    /// server cannot be reached or refuses the login.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        let config: Config = url.parse().map_err(|err| {
            LedgerError::invalid("malformed PostgreSQL connection string").with_source(err)
        })?;
        let ledger = PostgresLedger {
            config,
            client: Arc::new(Mutex::new(None)),
        };
        ledger.client().await?;
        Ok(ledger)
    }

    /// Brings the database to the crate's schema version, creating the table, its index and
    /// the version table in a new database, and checks that the table has every column. Safe
    /// to run on every start and from many workers at once: each step runs in a transaction
    /// of its own under an advisory lock, on a separate connection. What it does with older
    /// and newer databases is in the [schema docs](super::Ledger#schema).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when a table of another
    /// shape has the name, or the schema version is newer than this release knows (the
    /// database is left as it was);
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) when the
    /// statements fail (no connection, no permission to create tables).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        // A connection of its own: the shared one pipelines other tasks' statements, which
        // would run inside the migration's transactions, under its lock.
        let mut client = self.connect_new().await?;
        while apply_next_step(&mut client).await? {}
        client
            .prepare(&probe())
            .await
            .map(drop)
            .map_err(|err| shape_error().with_source(err))
    }

    /// The schema version the database is at, from the one row of the
    /// `idempotent_operations_schema` table: 0 when that table does not exist (a database not
    /// migrated yet, or migrated by the 0.1 `migrate`, which recorded no version), which
    /// [`migrate`](Self::migrate) brings up to date.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when the version table
    /// holds other than one row, or a negative version;
    /// [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable) when the database
    /// cannot be read.
    pub async fn schema_version(&self) -> Result<u32, LedgerError> {
        read_version(&*self.client().await?).await
    }

    /// The live connection, or a new one when there is none or it closed.
    async fn client(&self) -> Result<Arc<Client>, LedgerError> {
        if let Some(client) = self.cached()
            && !client.is_closed()
        {
            return Ok(client);
        }
        let client = Arc::new(self.connect_new().await?);
        *self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(client.clone());
        Ok(client)
    }

    /// A new connection, driven by a task of its own until the client is dropped.
    async fn connect_new(&self) -> Result<Client, LedgerError> {
        let (client, connection) = self
            .config
            .connect(NoTls)
            .await
            .map_err(|err| database(err, "cannot connect"))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "ledger connection ended");
            }
        });
        Ok(client)
    }

    fn cached(&self) -> Option<Arc<Client>> {
        self.client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    async fn claim_now(&self, claim: &Claim) -> Result<Claimed, LedgerError> {
        let client = self.client().await?;
        let inserted = client
            .query_opt(
                &format!(
                    "INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
                     first_attempt_at, lease_owner, lease_expires_at, expires_at) \
                     VALUES ($1, $2, $3, 'in_flight', 0, $4, $5, $6, $7) \
                     ON CONFLICT (key) DO NOTHING RETURNING {COLUMNS}"
                ),
                &[
                    &claim.key,
                    &claim.scope,
                    &claim.fingerprint,
                    &to_millis(claim.now),
                    &claim.owner,
                    &to_millis(claim.lease_until),
                    &to_millis(claim.expires_at),
                ],
            )
            .await
            .map_err(|err| database(err, "cannot claim the operation"))?;
        if let Some(row) = inserted {
            return Ok(Claimed::New(read_row(&row)?));
        }
        // The old status comes from the locked sub-select: RETURNING alone sees the new row.
        // The take-over rule is `Claim::may_take_over`'s, in SQL; `first_attempt_at > $5` is
        // the window's openness with the cutoff `window.rs` computed (`window::is_open`).
        let columns = COLUMNS
            .split(", ")
            .map(|c| format!("t.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        let taken = client
            .query_opt(
                &format!(
                    "UPDATE {TABLE} AS t SET status = 'in_flight', lease_owner = $2, \
                     lease_expires_at = $3, response_status = NULL, \
                     response_headers = NULL, response_body = NULL \
                     FROM (SELECT key, status FROM {TABLE} WHERE key = $1 FOR UPDATE) AS old \
                     WHERE t.key = old.key AND t.fingerprint = $4 \
                     AND t.status <> 'succeeded' AND t.first_attempt_at > $5 \
                     AND (t.status <> 'in_flight' OR t.lease_expires_at IS NULL \
                          OR t.lease_expires_at <= $6) \
                     RETURNING {columns}, old.status"
                ),
                &[
                    &claim.key,
                    &claim.owner,
                    &to_millis(claim.lease_until),
                    &claim.fingerprint,
                    &to_millis(claim.window_cutoff),
                    &to_millis(claim.now),
                ],
            )
            .await
            .map_err(|err| database(err, "cannot take the operation over"))?;
        if let Some(row) = taken {
            let previous: String = row
                .try_get(13)
                .map_err(|err| database(err, "cannot decode the operation"))?;
            return Ok(Claimed::TakenOver {
                record: read_row(&row)?,
                previous: previous.parse::<OperationStatus>()?,
            });
        }
        match self.select(&client, &claim.key).await? {
            Some(record) => Ok(Claimed::Existing(record)),
            None => Err(LedgerError::unavailable(format!(
                "operation {} vanished during its claim",
                claim.key
            ))),
        }
    }

    async fn select(
        &self,
        client: &Client,
        key: &str,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM {TABLE} WHERE key = $1"),
                &[&key],
            )
            .await
            .map_err(|err| database(err, "cannot read the operation"))?
            .map(|row| read_row(&row))
            .transpose()
    }
}

/// Runs the step the database is due, in one transaction with the version it reaches; false
/// when none is due.
async fn apply_next_step(client: &mut Client) -> Result<bool, LedgerError> {
    // READ COMMITTED whatever the database's default: each statement after the lock then sees
    // what the worker before committed. Under REPEATABLE READ the snapshot would date from
    // before the wait, and a second worker would find no version and run the step again.
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(|err| database(err, "cannot begin the migration"))?;
    // Held to the end of the transaction: a second worker waits here, then reads the version
    // this one committed and has nothing to do. Without it, two workers could both find no
    // version and both run a step (and `CREATE TABLE IF NOT EXISTS` itself is not safe against
    // a concurrent create). An error return drops `tx`, which rolls back: a refused or failed
    // step leaves the database as it was.
    tx.batch_execute(&format!("SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
        .await
        .map_err(|err| database(err, "cannot lock the migration"))?;
    let Some(step) = next_step(read_version(tx.client()).await?)? else {
        tx.rollback()
            .await
            .map_err(|err| database(err, "cannot end the migration"))?;
        return Ok(false);
    };
    for statement in (step.statements)(Dialect::Postgres) {
        tx.batch_execute(&statement).await.map_err(|err| {
            if is_shape(&err) {
                shape_error().with_source(err)
            } else {
                database(err, "cannot migrate")
            }
        })?;
    }
    // The columns the crate reads are those of the latest version only.
    if step.to() == SCHEMA_VERSION {
        tx.prepare(&probe())
            .await
            .map_err(|err| shape_error().with_source(err))?;
    }
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version INTEGER NOT NULL); \
         DELETE FROM {VERSION_TABLE}; \
         INSERT INTO {VERSION_TABLE} (version) VALUES ({})",
        step.to()
    ))
    .await
    .map_err(|err| database(err, "cannot record the schema version"))?;
    tx.commit()
        .await
        .map_err(|err| database(err, "cannot commit the migration"))?;
    Ok(true)
}

/// The version in the version table, or 0 when there is none. Two statements, not one
/// transaction: [`PostgresLedger::migrate`] calls it under its lock, and a bare read that
/// races a migration sees either version, both true.
async fn read_version(client: &Client) -> Result<u32, LedgerError> {
    let exists: bool = client
        .query_one(
            &format!("SELECT to_regclass('{VERSION_TABLE}') IS NOT NULL"),
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|err| database(err, "cannot read the schema version"))?;
    if !exists {
        return Ok(0);
    }
    let rows = client
        .query(&format!("SELECT version FROM {VERSION_TABLE}"), &[])
        .await
        .map_err(|err| database(err, "cannot read the schema version"))?;
    match rows.as_slice() {
        [row] => {
            let stored: i32 = row.try_get(0).map_err(|err| {
                LedgerError::corrupt(format!("cannot decode the version in {VERSION_TABLE}"))
                    .with_source(err)
            })?;
            version_from(i64::from(stored))
        }
        _ => Err(LedgerError::corrupt(format!(
            "table {VERSION_TABLE} holds {} rows, not one",
            rows.len()
        ))),
    }
}

/// Whether the error says the storage has another shape than this crate wrote: a missing
/// table or column, a column of another type.
fn is_shape(err: &tokio_postgres::Error) -> bool {
    err.code().is_some_and(|code| {
        *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_COLUMN
            || *code == SqlState::DATATYPE_MISMATCH
    })
}

/// Classifies a PostgreSQL error: a missing table or column means the storage is not what
/// this crate wrote; everything else (a lost connection, a refused login, a full disk) means
/// it is unavailable.
fn database(err: tokio_postgres::Error, what: &str) -> LedgerError {
    let shape = is_shape(&err);
    let message = if err.is_closed() {
        format!("{what}: the connection is closed")
    } else {
        what.to_owned()
    };
    if shape {
        LedgerError::corrupt(message).with_source(err)
    } else {
        LedgerError::unavailable(message).with_source(err)
    }
}

fn read_row(row: &Row) -> Result<OperationRecord, LedgerError> {
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
    };
    raw.into_record()
}

impl Ledger for PostgresLedger {
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        Box::pin(self.claim_now(claim))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            let changed = client
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = $3, \
                         lease_expires_at = $4 \
                         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
                    ),
                    &[
                        &update.key,
                        &update.owner,
                        &to_millis(update.at),
                        &to_millis(update.lease_until),
                    ],
                )
                .await
                .map_err(|err| database(err, "cannot record the attempt"))?;
            if changed == 0 {
                return Err(LedgerError::lease_lost(&update.key));
            }
            Ok(())
        })
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            let (status, headers, body) = response_columns(finish.response.as_ref());
            let status = status.and_then(|s| i32::try_from(s).ok());
            let changed = client
                .execute(
                    &format!(
                        "UPDATE {TABLE} SET status = $3, lease_owner = NULL, \
                         lease_expires_at = NULL, response_status = $4, \
                         response_headers = $5, response_body = $6, \
                         attempts = attempts + CASE WHEN $7::BIGINT IS NULL THEN 0 ELSE 1 END, \
                         last_attempt_at = coalesce($7::BIGINT, last_attempt_at) \
                         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
                    ),
                    &[
                        &finish.key,
                        &finish.owner,
                        &finish.status.as_str(),
                        &status,
                        &headers,
                        &body,
                        &finish.last_attempt_at.map(to_millis),
                    ],
                )
                .await
                .map_err(|err| database(err, "cannot record the outcome"))?;
            if changed == 0 {
                return Err(LedgerError::lease_lost(&finish.key));
            }
            Ok(())
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        Box::pin(async move {
            let client = self.client().await?;
            self.select(&client, key).await
        })
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let client = self.client().await?;
            client
                .execute(
                    &format!(
                        "DELETE FROM {TABLE} WHERE key IN \
                         (SELECT key FROM {TABLE} WHERE expires_at <= $1 LIMIT $2)"
                    ),
                    &[&to_millis(now), &i64::from(limit)],
                )
                .await
                .map_err(|err| database(err, "cannot purge"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LedgerErrorKind;
    use crate::ledger::ledger_conformance;

    /// The test server's URL, or `None` (the test is skipped) outside CI.
    pub(crate) fn url() -> Option<String> {
        match std::env::var("IDEMPOTENT_RETRY_PG_URL") {
            Ok(url) => Some(url),
            Err(_) if std::env::var_os("CI").is_some() => {
                panic!("IDEMPOTENT_RETRY_PG_URL must be set in CI (.ci/run starts PostgreSQL)")
            }
            Err(_) => {
                eprintln!("skipped: IDEMPOTENT_RETRY_PG_URL is not set");
                None
            }
        }
    }

    /// Every case on a new database of its own, with the claims of the concurrent case
    /// racing on two threads, their statements pipelined on the ledger's connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres_ledger_conforms() {
        let Some(base) = url() else { return };
        ledger_conformance(|| async {
            let (url, _) = fresh_database(&base).await;
            let ledger = PostgresLedger::connect(&url).await.expect("connect");
            ledger.migrate().await.expect("migrate");
            ledger
        })
        .await
        .assert_passed();
    }

    /// A new database on the test server, so a test sees no other test's tables; its URL and
    /// a plain client on it.
    async fn fresh_database(base: &str) -> (String, Client) {
        let (admin, connection) = tokio_postgres::connect(base, NoTls)
            .await
            .expect("connect to the test server");
        tokio::spawn(connection);
        let name = format!(
            "ir_unit_{}",
            crate::IdempotencyKey::random().as_str().replace('-', "")
        );
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create a database");
        let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
        let url = format!("{prefix}/{name}");
        let (client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("connect to the new database");
        tokio::spawn(connection);
        (url, client)
    }

    #[tokio::test]
    async fn a_new_database_gets_one_version_row_and_a_second_migrate_keeps_it() {
        let Some(base) = url() else { return };
        let (url, plain) = fresh_database(&base).await;
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        assert_eq!(ledger.schema_version().await.expect("version"), 0);
        ledger.migrate().await.expect("migrate");
        ledger.migrate().await.expect("again");
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION
        );
        let rows = plain
            .query(&format!("SELECT version FROM {VERSION_TABLE}"), &[])
            .await
            .expect("read");
        let versions: Vec<i32> = rows.iter().map(|row| row.get(0)).collect();
        assert_eq!(versions, vec![1]);
    }

    #[tokio::test]
    async fn a_version_table_without_exactly_one_valid_row_is_corrupt() {
        let Some(base) = url() else { return };
        let (url, plain) = fresh_database(&base).await;
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        for (contents, says) in [
            ("DELETE FROM {t}", "holds 0 rows"),
            ("INSERT INTO {t} VALUES (1), (1)", "holds 2 rows"),
            ("DELETE FROM {t}; INSERT INTO {t} VALUES (-1)", "-1"),
        ] {
            plain
                .batch_execute(&contents.replace("{t}", VERSION_TABLE))
                .await
                .expect("rewrite the version table");
            for err in [
                ledger.schema_version().await.expect_err("read"),
                ledger.migrate().await.expect_err("migrate"),
            ] {
                assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
                assert!(err.to_string().contains(says), "{err}");
            }
        }
    }

    #[tokio::test]
    async fn a_newer_version_is_refused_and_the_database_left_as_it_was() {
        let Some(base) = url() else { return };
        let (url, plain) = fresh_database(&base).await;
        let newer = i32::try_from(SCHEMA_VERSION + 1).expect("small");
        plain
            .batch_execute(&format!(
                "CREATE TABLE {VERSION_TABLE} (version INTEGER NOT NULL); \
                 INSERT INTO {VERSION_TABLE} VALUES ({newer})"
            ))
            .await
            .expect("stamp");
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        let err = ledger.migrate().await.expect_err("newer");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
        assert!(
            err.to_string().contains("upgrade idempotent-retry"),
            "{err}"
        );
        let exists: bool = plain
            .query_one(&format!("SELECT to_regclass('{TABLE}') IS NOT NULL"), &[])
            .await
            .expect("look")
            .get(0);
        assert!(!exists, "no table was created");
        assert_eq!(
            ledger.schema_version().await.expect("version"),
            SCHEMA_VERSION + 1
        );
    }

    #[tokio::test]
    async fn a_malformed_url_and_an_unreachable_server_are_typed() {
        let err = PostgresLedger::connect("host=/x port=notaport")
            .await
            .expect_err("malformed");
        assert_eq!(err.kind(), LedgerErrorKind::InvalidInput);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let err = PostgresLedger::connect(&format!("postgresql://x@127.0.0.1:{port}/x"))
            .await
            .expect_err("nobody listens");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable);
    }
}
