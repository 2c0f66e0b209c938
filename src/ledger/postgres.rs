//! The PostgreSQL ledger: one table shared by a fleet of workers.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls, Row};

use super::sql::{COLUMNS, RawRow, TABLE, index, probe, response_columns, schema};
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

    /// Creates the table and its index if they do not exist (see the schema in the
    /// [`Ledger`] docs), under an advisory lock so workers starting together do not collide,
    /// and checks that an existing table has every column.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when a table of another
    /// shape has the name; [`LedgerErrorKind::Unavailable`](super::LedgerErrorKind::Unavailable)
    /// when the statements fail (no connection, no permission to create tables).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let client = self.client().await?;
        let created = client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({MIGRATION_LOCK}); {}; {}; COMMIT;",
                schema("BYTEA"),
                index()
            ))
            .await;
        if let Err(err) = created {
            // A failed batch leaves its transaction open: end it, so the connection stays
            // usable (a failure here changes nothing: the first error is the one to report).
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(database(err, "cannot create the table"));
        }
        client.prepare(&probe()).await.map_err(|err| {
            LedgerError::corrupt(format!("table {TABLE} exists with another shape"))
                .with_source(err)
        })?;
        Ok(())
    }

    /// The live connection, or a new one when there is none or it closed.
    async fn client(&self) -> Result<Arc<Client>, LedgerError> {
        if let Some(client) = self.cached()
            && !client.is_closed()
        {
            return Ok(client);
        }
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
        let client = Arc::new(client);
        *self
            .client
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(client.clone());
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
                previous: OperationStatus::parse(&previous)?,
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

/// Classifies a PostgreSQL error: a missing table or column means the storage is not what
/// this crate wrote; everything else (a lost connection, a refused login, a full disk) means
/// it is unavailable.
fn database(err: tokio_postgres::Error, what: &str) -> LedgerError {
    let shape = err.code().is_some_and(|code| {
        *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_COLUMN
            || *code == SqlState::DATATYPE_MISMATCH
    });
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
                         response_headers = $5, response_body = $6 \
                         WHERE key = $1 AND lease_owner = $2 AND status = 'in_flight'"
                    ),
                    &[
                        &finish.key,
                        &finish.owner,
                        &finish.status.as_str(),
                        &status,
                        &headers,
                        &body,
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
    use crate::ledger::conformance;

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

    #[tokio::test]
    async fn postgres_ledger_conforms() {
        let Some(url) = url() else { return };
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        let prefix = format!("conformance-{}", crate::IdempotencyKey::random());
        conformance::check(&ledger, &prefix).await;
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
