//! The PostgreSQL ledger: one table shared by a fleet of workers, through a pool of
//! connections.
//!
//! `mod.rs` holds the ledger and its calls; `builder.rs` the construction (pool size, connect
//! timeout, TLS); `statements.rs` the text of each statement; `row.rs` a row's decoding;
//! `reconcile.rs` what reconciling does to the table; `migrate.rs` the schema steps and version; `failure.rs` what an error means to the caller;
//! `tls.rs` the rustls connector (feature `postgres-rustls`).
//!
//! The pool is deadpool-postgres: it keeps a statement cache per connection (each statement is
//! prepared once per connection, not once per call), replaces a connection found closed when
//! it hands one out, and is the pool tokio-postgres users most often already have, which
//! [`PostgresLedger::from_pool`] then takes as it is. bb8-postgres would serve as well but
//! leaves statement caching to the caller.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

// The drivers this crate links, for the workspace's own tests that reach the database behind
// the ledger's back: not covered by semver.
#[doc(hidden)]
pub use deadpool_postgres;
#[cfg(feature = "rustls")]
#[doc(hidden)]
pub use rustls;
#[doc(hidden)]
pub use tokio_postgres;
#[cfg(feature = "rustls")]
#[doc(hidden)]
pub use tokio_postgres_rustls;

// The workspace's own tests' throwaway databases: not covered by semver.
#[doc(hidden)]
pub mod testing;

mod builder;
mod failure;
mod group;
mod migrate;
pub mod outbox;
mod reconcile;
mod row;
mod statements;
#[cfg(feature = "rustls")]
mod tls;

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use deadpool_postgres::{Object, Pool};
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

pub use builder::PostgresLedgerBuilder;
use failure::database;
use group::{BatchAnswer, Group, NewRow};
use row::read_row;

use idempotent_retry_ledger::sql::{as_stored, response_columns};
use idempotent_retry_ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerClock, LedgerError, LedgerFuture,
    ListFilter, OperationRecord, OperationStatus, ReconcileClaim, Renew, Resolve, clock_reading,
    from_millis, millis_after, to_millis,
};

/// A [`Ledger`] in a PostgreSQL table, for fleets of workers sharing one record.
///
/// Every claim, take-over and write is one atomic statement (of workers racing for one key,
/// exactly one gets the row); under load, claims of new keys and finishes share one
/// transaction and commit ("group commit"). How, in detail: `docs/postgres.md`.
///
/// # Errors
///
/// A lost connection fails the calls it carried (one, or one batch) with
/// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable);
/// the pool replaces it for the next call.
///
/// Three ways to make one: [`connect`](Self::connect) with a connection string (plain TCP, a
/// pool of 16), [`builder`](Self::builder) to set the pool size, the connect timeout and TLS
/// or to start from a `tokio_postgres::Config`, and [`from_pool`](Self::from_pool) to use a
/// deadpool-postgres pool the application already has. Clones share the pool.
///
/// # Examples
///
/// ```no_run
/// use idempotent_retry::Client;
/// use idempotent_retry::ledger::{LedgerOptions, PostgresLedger};
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
#[derive(Clone)]
pub struct PostgresLedger {
    pool: Pool,
    /// The batches claims and finishes go out in (`group.rs`), shared by the clones.
    group: Arc<Group>,
    /// Whose clock the statements compare on: the database's, but for the workspace's
    /// fixed-time tests.
    clock: Clock,
}

/// Whose clock a [`PostgresLedger`]'s statements take the present from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clock {
    /// The database's (`statement_timestamp()`): the client sends lengths, never instants.
    Database,
    /// The caller's `now` in each request: for the workspace's tests that run the
    /// conformance suite's fixed times against the SQL.
    Caller,
}

impl Clock {
    /// The base a statement takes its present from: `at` on the caller's clock, `None` (the
    /// database's present) otherwise.
    fn base(self, at: SystemTime) -> Option<i64> {
        match self {
            Clock::Database => None,
            Clock::Caller => Some(to_millis(at)),
        }
    }
}

impl fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.pool.status();
        f.debug_struct("PostgresLedger")
            .field("pool_size", &status.max_size)
            .field("connections", &status.size)
            .field("idle", &status.available)
            .field("clock", &self.clock)
            .finish()
    }
}

impl PostgresLedger {
    /// Connects with a libpq-style connection string (`postgresql://user@host:port/db` or
    /// `host=... user=...`) over plain TCP, with a pool of up to 16 connections, and opens the
    /// first. For TLS, another pool size or a `tokio_postgres::Config`, use
    /// [`builder`](Self::builder). Does not create the table: call [`migrate`](Self::migrate).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput) for a malformed
    /// string, or one that requires TLS (`sslmode=require`);
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the server
    /// cannot be reached or refuses the login.
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::builder().url(url).build().await
    }

    /// A builder: connection string or config, pool size, connect timeout, TLS.
    pub fn builder() -> PostgresLedgerBuilder {
        PostgresLedgerBuilder::new()
    }

    /// A ledger on the caller's deadpool-postgres pool (0.14), used as it is: its size,
    /// timeouts, TLS and recycling are the caller's, and the ledger shares its connections
    /// and statement caches with the application. Opens nothing: a wrong address shows at
    /// the first call, as that call's
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable).
    ///
    /// A pool with a wait timeout turns a long queue for a connection into that error too; a
    /// pool of more than one connection lets claims of different keys run side by side.
    #[must_use]
    pub fn from_pool(pool: Pool) -> Self {
        PostgresLedger {
            group: Arc::new(Group::new(pool.clone())),
            pool,
            clock: Clock::Database,
        }
    }

    /// The same ledger comparing times on the caller's clock, as the conformance suite's
    /// fixed-time cases need: for the workspace's own tests, not covered by semver. A fleet
    /// must not use it (`docs/ledger.md`, "Whose clock").
    #[doc(hidden)]
    #[must_use]
    pub fn on_caller_clock(mut self) -> Self {
        self.clock = Clock::Caller;
        self
    }

    /// The pool the ledger draws its connections from, to read its
    /// [`status`](Pool::status) (say, for metrics) or to share it.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Brings the database to the crate's schema version, creating the table, its index and
    /// the version table in a new database, and checks that the table has every column. Safe
    /// to run on every start and from many workers at once: each step runs in a transaction
    /// of its own under an advisory lock, on a pooled connection held for the migration. What
    /// it does with older and newer databases: `docs/ledger.md`, "Versions".
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when a table of another
    /// shape has the name, or the schema version is newer than this release knows (the
    /// database is left as it was);
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the
    /// statements fail (no connection, no permission to create tables).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let mut client = self.connection().await?;
        migrate::migrate(&mut client).await
    }

    /// The schema version the database is at, from the one row of the
    /// `idempotent_operations_schema` table: 0 when that table does not exist (a database not
    /// migrated yet, or migrated by the 0.1 `migrate`, which recorded no version), which
    /// [`migrate`](Self::migrate) brings up to date.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](idempotent_retry_ledger::LedgerErrorKind::Corrupt) when the version table
    /// holds other than one row, or a negative version;
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the database
    /// cannot be read.
    pub async fn schema_version(&self) -> Result<u32, LedgerError> {
        let client = self.connection().await?;
        migrate::read_version(&client).await
    }

    /// A connection from the pool, held until dropped: a new one when none is idle and the
    /// pool has room, else the next one returned.
    async fn connection(&self) -> Result<Object, LedgerError> {
        self.pool.get().await.map_err(failure::pool)
    }

    async fn claim_now(&self, claim: &Claim) -> Result<Claimed, LedgerError> {
        let base = self.clock.base(claim.now);
        let lease = millis_after(claim.lease_until, claim.now);
        let retention = millis_after(claim.expires_at, claim.now);
        let inserted = self
            .group
            .insert(NewRow {
                key: claim.key.clone(),
                scope: claim.scope.clone(),
                fingerprint: claim.fingerprint.clone(),
                now: base,
                owner: claim.owner.clone(),
                lease,
                retention,
                method: claim.method.clone(),
                url: claim.url.clone(),
            })
            .await?;
        if let Some(first) = inserted {
            // The row as written: the claim's lengths from the present the database took,
            // in the whole milliseconds the statement added.
            let mut row = claim.on_clock(from_millis(first)).into_new_row();
            let at = |length: i64| from_millis(first.saturating_add(length));
            row.lease_expires_at = Some(at(lease));
            row.expires_at = at(retention);
            return Ok(Claimed::New(as_stored(row)));
        }
        let client = self.connection().await?;
        let taken = client
            .query_opt(
                &prepared(
                    &client,
                    &statements::TAKE_OVER,
                    "cannot take the operation over",
                )
                .await?,
                &[
                    &claim.key,
                    &claim.owner,
                    &millis_after(claim.lease_until, claim.now),
                    &claim.fingerprint,
                    &millis_after(claim.window_cutoff, claim.now),
                    &base,
                    &claim.scope,
                    &claim.method,
                    &claim.url,
                    &millis_after(claim.expires_at, claim.now),
                ],
            )
            .await
            .map_err(|err| database(err, "cannot take the operation over"))?;
        if let Some(row) = taken {
            let previous: String = row
                .try_get(statements::PREVIOUS_STATUS)
                .map_err(|err| database(err, "cannot decode the operation"))?;
            return Ok(Claimed::TakenOver {
                record: read_row(&row)?,
                previous: previous.parse::<OperationStatus>()?,
            });
        }
        match select(&client, &claim.key).await? {
            Some(record) => Ok(Claimed::Existing(record)),
            None => Err(LedgerError::unavailable(format!(
                "operation {} vanished during its claim",
                claim.key
            ))),
        }
    }

    /// Runs an `UPDATE` of one row held by `key`'s lease holder; a lost lease when it
    /// changed none.
    async fn update_held(
        &self,
        sql: &str,
        key: &str,
        params: &[&(dyn ToSql + Sync)],
        what: &str,
    ) -> Result<(), LedgerError> {
        let client = self.connection().await?;
        let changed = client
            .execute(&prepared(&client, sql, what).await?, params)
            .await
            .map_err(|err| database(err, what))?;
        if changed == 0 {
            return Err(LedgerError::lease_lost(key));
        }
        Ok(())
    }
}

/// The connection's prepared statement for `sql`, prepared on first use.
async fn prepared(client: &Object, sql: &str, what: &str) -> Result<Statement, LedgerError> {
    client
        .prepare_cached(sql)
        .await
        .map_err(|err| database(err, what))
}

async fn select(client: &Object, key: &str) -> Result<Option<OperationRecord>, LedgerError> {
    let what = "cannot read the operation";
    client
        .query_opt(&prepared(client, &statements::SELECT, what).await?, &[&key])
        .await
        .map_err(|err| database(err, what))?
        .map(|row| read_row(&row))
        .transpose()
}

impl Ledger for PostgresLedger {
    fn clock(&self) -> LedgerFuture<'_, LedgerClock> {
        Box::pin(async move {
            if self.clock == Clock::Caller {
                return Ok(LedgerClock::Caller);
            }
            let what = "cannot read the database's clock";
            let client = self.connection().await?;
            let now: i64 = client
                .query_one(&prepared(&client, statements::CLOCK, what).await?, &[])
                .await
                .and_then(|row| row.try_get(0))
                .map_err(|err| database(err, what))?;
            Ok(clock_reading(now))
        })
    }

    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        Box::pin(self.claim_now(claim))
    }

    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            self.update_held(
                &statements::RECORD_ATTEMPT,
                &update.key,
                &[
                    &update.key,
                    &update.owner,
                    &self.clock.base(update.at),
                    &millis_after(update.lease_until, update.at),
                ],
                "cannot record the attempt",
            )
            .await
        })
    }

    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            self.update_held(
                &statements::RENEW,
                &renew.key,
                &[
                    &renew.key,
                    &renew.owner,
                    &self.clock.base(renew.at),
                    &millis_after(renew.lease_until, renew.at),
                ],
                "cannot renew the lease",
            )
            .await
        })
    }

    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let response = response_columns(finish.response.as_ref());
            let changed = self
                .group
                .finish(BatchAnswer {
                    key: finish.key.clone(),
                    owner: finish.owner.clone(),
                    status: finish.status.as_str(),
                    response_status: response.status.and_then(|s| i32::try_from(s).ok()),
                    response_headers: response.headers,
                    response_body: response.body,
                    response_url: response.url,
                    response_key_id: response.key_id,
                    counted: finish.last_attempt_at.is_some(),
                    base: finish.last_attempt_at.and_then(|at| self.clock.base(at)),
                })
                .await?;
            if changed {
                Ok(())
            } else {
                Err(LedgerError::lease_lost(&finish.key))
            }
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        Box::pin(async move { select(&self.connection().await?, key).await })
    }

    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let what = "cannot purge";
            let client = self.connection().await?;
            client
                .execute(
                    &prepared(&client, &statements::PURGE, what).await?,
                    &[&self.clock.base(now), &i64::from(limit)],
                )
                .await
                .map_err(|err| database(err, what))
        })
    }
    fn due<'a>(
        &'a self,
        query: &'a idempotent_retry_ledger::outbox::DueQuery,
    ) -> LedgerFuture<'a, Vec<idempotent_retry_ledger::outbox::QueuedOperation>> {
        Box::pin(async move {
            outbox::due(&self.connection().await?, self.clock.base(query.now), query).await
        })
    }

    fn take_due<'a>(
        &'a self,
        take: &'a idempotent_retry_ledger::outbox::TakeDue,
    ) -> LedgerFuture<'a, Vec<idempotent_retry_ledger::outbox::Taken>> {
        Box::pin(async move {
            outbox::take_due(
                &self.connection().await?,
                self.clock.base(take.query.now),
                take,
            )
            .await
        })
    }

    fn backlog(
        &self,
        now: SystemTime,
    ) -> LedgerFuture<'_, idempotent_retry_ledger::outbox::Backlog> {
        Box::pin(
            async move { outbox::backlog(&self.connection().await?, self.clock.base(now)).await },
        )
    }

    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        Box::pin(async move {
            reconcile::claim_unresolved(&self.connection().await?, claim, self.clock).await
        })
    }

    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        Box::pin(
            async move { reconcile::resolve(&self.connection().await?, resolve, self.clock).await },
        )
    }

    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        Box::pin(async move { reconcile::list(&self.connection().await?, filter).await })
    }
}
#[cfg(test)]
mod tests {
    use tokio_postgres::{Client, NoTls};

    use super::*;
    use crate::testing::{create_database, server_url};
    use idempotent_retry_ledger::LedgerErrorKind;
    use idempotent_retry_ledger::sql::{SCHEMA_VERSION, TABLE, VERSION_TABLE};

    /// A new database on the test server, so a test sees no other test's tables; its URL and
    /// a plain client on it.
    pub(super) async fn fresh_database(base: &str) -> (String, Client) {
        let url = create_database(base)
            .await
            .unwrap_or_else(|err| panic!("a database on the test server: {err}"));
        let (client, connection) = tokio_postgres::connect(&url, NoTls)
            .await
            .expect("connect to the new database");
        tokio::spawn(connection);
        (url, client)
    }

    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test]
    async fn a_new_database_gets_one_version_row_and_a_second_migrate_keeps_it() {
        let Some(base) = server_url() else { return };
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
        assert_eq!(
            versions,
            vec![i32::try_from(SCHEMA_VERSION).expect("small")]
        );
    }

    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test]
    async fn a_version_table_without_exactly_one_valid_row_is_corrupt() {
        let Some(base) = server_url() else { return };
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

    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test]
    async fn a_newer_version_is_refused_and_the_database_left_as_it_was() {
        let Some(base) = server_url() else { return };
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

    #[tokio::test]
    async fn settings_that_cannot_work_are_refused_before_connecting() {
        // Nothing listens on port 1: each of these must fail before trying.
        for (builder, says) in [
            (
                PostgresLedger::builder(),
                "no PostgreSQL connection string or config given",
            ),
            (
                PostgresLedger::builder()
                    .url("postgresql://x@127.0.0.1:1/x")
                    .pool_size(0),
                "a pool of at least one connection",
            ),
            (
                PostgresLedger::builder().url("postgresql://x@127.0.0.1:1/x?sslmode=require"),
                "requires TLS (sslmode=require)",
            ),
        ] {
            let err = builder.build().await.expect_err("refused");
            assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[tokio::test]
    async fn the_builder_s_connect_timeout_bounds_a_server_that_never_answers() {
        // A listener that accepts and never speaks: the login cannot finish.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let _held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let err = PostgresLedger::builder()
            .url(&format!("postgresql://x@127.0.0.1:{port}/x"))
            .connect_timeout(std::time::Duration::from_millis(200))
            .build()
            .await
            .expect_err("silent server");
        assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
        assert!(
            err.to_string()
                .starts_with("ledger unavailable: cannot connect"),
            "{err}"
        );
    }
}
