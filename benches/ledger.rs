//! What a ledger costs at a worker's throughput: keyed `POST`s sent with `send()` to one
//! keep-alive loopback hyper server, 1, 16 and 64 in flight at a time, with no ledger, with
//! each of the crate's ledgers, and with a ledger written by hand around bare reqwest. Every
//! operation uses a new key, so each one pays a full claim and finish, never a replay.
//!
//! The hand-written ledgers are what a careful user would write without the crate: a table of
//! their own with one index (the primary key), a claim (`INSERT ... ON CONFLICT (key) DO
//! NOTHING RETURNING key`; no row back is a key already claimed, and fails the bench) before
//! the same keyed POST through bare reqwest (with our client's 30 s timeout), and a finish
//! (`UPDATE ops SET status, response_status, response_body WHERE key`) after it.
//! `hand-sqlite`: rusqlite, one connection behind a `std::sync::Mutex`, WAL with `synchronous
//! = FULL`, every call in `spawn_blocking`. `hand-postgres`: a deadpool-postgres pool of 16
//! (`--pool` when given), the two statements `prepare_cached`, each in its own autocommit.
//! Before the rounds the bench prints the durability settings in effect for each durable
//! ledger (SQLite's `journal_mode` and `synchronous`, PostgreSQL's `synchronous_commit` and
//! `fsync`): a baseline that is not durable would not be a baseline.
//!
//! The contenders take turns inside every round (the order rotating from round to round), so
//! a change in the machine's load falls on all of them alike; each figure is the median over
//! the rounds, and its ratio to no ledger is taken within each round before the median, as is
//! the ratio of each crate ledger to its hand-written baseline (a table of its own). Beside
//! the rates, the CPU time each operation took (this process's threads, and the local
//! PostgreSQL server's processes, read from `/proc`) is the figure that the machine's load
//! moves least; a second table splits this process's share by thread: the main thread (which
//! polls every operation's future), the runtime's workers (the client's connections and the
//! server) and the rest (the SQLite ledger's writer), beside the process's context switches per
//! operation (each wait for another thread's answer costs one at least). Tokio names its
//! blocking threads as it names its workers, so `hand-sqlite`'s `spawn_blocking` calls count
//! among the workers.
//!
//! Run: `cargo bench --all-features --bench ledger` (a minute or two). The PostgreSQL
//! contenders run when `IDEMPOTENT_RETRY_PG_URL` is set (`source .ci/postgres.sh &&
//! start_postgres` starts one). Options after `--`:
//!
//! - `--rounds N` (default 5), `--operations N` per contender and round (default 2000; a
//!   quarter of it at concurrency 1);
//! - `--concurrency 1,16,64` (the default) and `--only none,sqlite,hand-sqlite` to pick
//!   contenders (`none`, `memory`, `sqlite`, `hand-sqlite`, `postgres`, `hand-postgres`,
//!   and, only when named, `memory-sealed`, `sqlite-sealed` and `postgres-sealed`: the same ledgers with
//!   `LedgerOptions::seal_keys`, every saved answer sealed, and `hand-postgres-indexed`: the
//!   hand-written PostgreSQL ledger with the two secondary indexes the crate's keeps, by
//!   status and by expiry, so its finish is no longer a HOT update);
//! - `--pool N`: the pool size of both PostgreSQL contenders (default 16, the ledger's
//!   default);
//! - `--svg PATH`: also draw throughput against concurrency per ledger (`docs/ledger.svg`);
//! - `--ledger-only`: each operation is the ledger's claim and finish alone, with no HTTP
//!   request between them (for profiling a ledger's own cost; `none` then measures the loop).

#[allow(
    dead_code,
    reason = "the keep-alive server is all this bench takes from it"
)]
mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idempotent_retry::ledger::{
    Claim, Claimed, Finish, Ledger, MemoryLedger, OperationStatus, SavedResponse,
};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{Client, IdempotencyKey};

/// The bench's settings, from its command line.
struct Options {
    rounds: usize,
    operations: u64,
    concurrency: Vec<usize>,
    only: Option<Vec<String>>,
    pool: Option<usize>,
    svg: Option<String>,
    ledger_only: bool,
}

impl Options {
    fn parse() -> Options {
        let mut options = Options {
            rounds: 5,
            operations: 2000,
            concurrency: vec![1, 16, 64],
            only: None,
            pool: None,
            svg: None,
            ledger_only: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .unwrap_or_else(|| panic!("{name} needs a value"))
            };
            match arg.as_str() {
                "--rounds" => options.rounds = value("--rounds").parse().expect("--rounds N"),
                "--operations" => {
                    options.operations = value("--operations").parse().expect("--operations N");
                }
                "--concurrency" => {
                    options.concurrency = value("--concurrency")
                        .split(',')
                        .map(|n| n.trim().parse().expect("--concurrency 1,16,64"))
                        .collect();
                }
                "--only" => {
                    options.only = Some(
                        value("--only")
                            .split(',')
                            .map(|s| s.trim().to_owned())
                            .collect(),
                    );
                }
                "--pool" => options.pool = Some(value("--pool").parse().expect("--pool N")),
                "--svg" => options.svg = Some(value("--svg")),
                "--ledger-only" => options.ledger_only = true,
                // `cargo bench` passes `--bench`; a filter criterion would take is ignored.
                _ => {}
            }
        }
        assert!(options.rounds > 0, "--rounds must be at least 1");
        options
    }

    /// Whether `--only` names `name` (the contenders left out by default).
    fn names(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_some_and(|only| only.iter().any(|o| o == name))
    }

    fn wants(&self, name: &str) -> bool {
        // No ledger is always measured: every ratio is taken against it.
        name == "none"
            || self
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|o| o == name))
    }

    /// Operations per contender and round at `concurrency`: fewer one at a time, where each
    /// durable operation waits for its own commits.
    fn operations_at(&self, concurrency: usize) -> u64 {
        if concurrency == 1 {
            (self.operations / 4).max(1)
        } else {
            self.operations
        }
    }
}

fn client(ledger: Option<impl Ledger>) -> Client {
    sealing_client(ledger, false)
}

/// [`client`], its saved answers sealed (`LedgerOptions::seal_keys`) when `sealed`.
fn sealing_client(ledger: Option<impl Ledger>, sealed: bool) -> Client {
    let mut builder = Client::builder();
    if sealed {
        let key = idempotent_retry::ledger::SealKey::new("bench", [7; 32]).expect("a seal key");
        builder =
            builder.ledger_options(idempotent_retry::ledger::LedgerOptions::new().seal_keys([key]));
    }
    match ledger {
        Some(ledger) => builder.ledger(ledger),
        None => builder,
    }
    .build()
    .expect("client")
}

/// One contender: a name for its rows, and what sends its operations.
struct Contender {
    name: &'static str,
    runner: Runner,
}

/// What sends a contender's operations: our client (with or without a ledger), or bare
/// reqwest beside a ledger written by hand.
enum Runner {
    Ours(Client),
    #[cfg(feature = "sqlite")]
    HandSqlite(hand::Sqlite),
    #[cfg(feature = "postgres")]
    HandPostgres(hand::Postgres),
}

impl Contender {
    fn ours(name: &'static str, client: Client) -> Contender {
        Contender {
            name,
            runner: Runner::Ours(client),
        }
    }

    /// One whole operation under the `n`th key of `run`: the keyed POST to `url`, with its
    /// claim and finish around it when there is a ledger.
    async fn send(&self, url: &str, run: &IdempotencyKey, n: u64) {
        match &self.runner {
            Runner::Ours(client) => send(client, url, run, n).await,
            #[cfg(feature = "sqlite")]
            Runner::HandSqlite(ledger) => ledger.send(url, &key_of(run, n)).await,
            #[cfg(feature = "postgres")]
            Runner::HandPostgres(ledger) => ledger.send(url, &key_of(run, n)).await,
        }
    }

    /// The ledger's part of one operation alone (`--ledger-only`).
    async fn claim_and_finish(&self, run: &IdempotencyKey, n: u64) {
        match &self.runner {
            Runner::Ours(client) => claim_and_finish(client, run, n).await,
            #[cfg(feature = "sqlite")]
            Runner::HandSqlite(ledger) => ledger.claim_and_finish(&key_of(run, n)).await,
            #[cfg(feature = "postgres")]
            Runner::HandPostgres(ledger) => ledger.claim_and_finish(&key_of(run, n)).await,
        }
    }
}

/// The `n`th key of `run`, the same for every contender.
fn key_of(run: &IdempotencyKey, n: u64) -> IdempotencyKey {
    IdempotencyKey::derive("bench.ledger", &[run.as_str(), &n.to_string()])
}

/// One contender per ledger, no ledger first, their SQLite files in `dir`; and, per durable
/// ledger, a line saying what durability settings are in effect for it.
#[cfg_attr(
    not(feature = "sqlite"),
    allow(
        unused_variables,
        reason = "the SQLite ledgers alone need the directory"
    )
)]
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unused_mut, reason = "the SQL ledgers alone print their durability")
)]
async fn contenders(options: &Options, dir: &Path) -> (Vec<Contender>, Vec<String>) {
    let mut contenders = vec![Contender::ours("none", client(None::<MemoryLedger>))];
    let mut durability = Vec::new();
    if options.wants("memory") {
        contenders.push(Contender::ours("memory", client(Some(MemoryLedger::new()))));
    }
    if options.names("memory-sealed") {
        contenders.push(Contender::ours(
            "memory-sealed",
            sealing_client(Some(MemoryLedger::new()), true),
        ));
    }
    #[cfg(feature = "sqlite")]
    if options.names("sqlite-sealed") {
        let ledger = idempotent_retry::ledger::SqliteLedger::open(dir.join("sealed.db"))
            .await
            .expect("sqlite");
        contenders.push(Contender::ours(
            "sqlite-sealed",
            sealing_client(Some(ledger), true),
        ));
    }
    #[cfg(feature = "sqlite")]
    if options.wants("sqlite") {
        let path = dir.join("bench.db");
        let ledger = idempotent_retry::ledger::SqliteLedger::open(&path)
            .await
            .expect("sqlite");
        durability.push(hand::sqlite_ours(&path));
        contenders.push(Contender::ours("sqlite", client(Some(ledger))));
    }
    #[cfg(feature = "sqlite")]
    if options.wants("hand-sqlite") {
        let ledger = hand::Sqlite::open(&dir.join("hand.db"));
        durability.push(ledger.durability());
        contenders.push(Contender {
            name: "hand-sqlite",
            runner: Runner::HandSqlite(ledger),
        });
    }
    #[cfg(feature = "postgres")]
    if let Ok(base) = std::env::var("IDEMPOTENT_RETRY_PG_URL") {
        if options.wants("postgres") {
            let url = fresh_database(&base).await;
            let ledger = match options.pool {
                Some(pool) => idempotent_retry::ledger::PostgresLedger::builder()
                    .url(&url)
                    .pool_size(pool)
                    .build()
                    .await
                    .expect("postgres"),
                None => idempotent_retry::ledger::PostgresLedger::connect(&url)
                    .await
                    .expect("postgres"),
            };
            ledger.migrate().await.expect("migrate");
            let connection = ledger.pool().get().await.expect("a pooled connection");
            durability.push(hand::postgres_settings("postgres", &connection).await);
            drop(connection);
            contenders.push(Contender::ours("postgres", client(Some(ledger))));
        }
        if options.names("postgres-sealed") {
            let url = fresh_database(&base).await;
            let ledger = idempotent_retry::ledger::PostgresLedger::connect(&url)
                .await
                .expect("postgres");
            ledger.migrate().await.expect("migrate");
            contenders.push(Contender::ours(
                "postgres-sealed",
                sealing_client(Some(ledger), true),
            ));
        }
        if options.wants("hand-postgres") {
            let url = fresh_database(&base).await;
            let ledger = hand::Postgres::connect(&url, options.pool.unwrap_or(16), false).await;
            durability.push(ledger.durability().await);
            contenders.push(Contender {
                name: "hand-postgres",
                runner: Runner::HandPostgres(ledger),
            });
        }
        if options.names("hand-postgres-indexed") {
            let url = fresh_database(&base).await;
            let ledger = hand::Postgres::connect(&url, options.pool.unwrap_or(16), true).await;
            contenders.push(Contender {
                name: "hand-postgres-indexed",
                runner: Runner::HandPostgres(ledger),
            });
        }
    }
    (contenders, durability)
}

/// A new database on the server at `base`, so each run starts from an empty table whatever
/// else the server holds; returns its URL.
#[cfg(feature = "postgres")]
async fn fresh_database(base: &str) -> String {
    let (admin, connection) = idempotent_retry_postgres::tokio_postgres::connect(
        base,
        idempotent_retry_postgres::tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the PostgreSQL server");
    tokio::spawn(connection);
    let name = format!(
        "ir_bench_{}",
        IdempotencyKey::random().as_str().replace('-', "")
    );
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create the bench's database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    format!("{prefix}/{name}")
}

/// Drops the databases [`fresh_database`] made, this run's and any an interrupted run left.
#[cfg(feature = "postgres")]
async fn drop_bench_databases() {
    let Ok(base) = std::env::var("IDEMPOTENT_RETRY_PG_URL") else {
        return;
    };
    let (admin, connection) = idempotent_retry_postgres::tokio_postgres::connect(
        &base,
        idempotent_retry_postgres::tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the PostgreSQL server");
    tokio::spawn(connection);
    let names = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'ir\\_bench\\_%'",
            &[],
        )
        .await
        .expect("list the bench's databases");
    for row in names {
        let name: String = row.get(0);
        admin
            .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .await
            .expect("drop the bench's database");
    }
}

/// The hand-written ledgers: what a careful user would write without the crate, one table of
/// their own, a claim before bare reqwest's keyed POST and a finish after it. The statements
/// are the constants below; `docs/performance.md` quotes them.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod hand {
    use std::fmt::Write as _;
    use std::time::{Duration, UNIX_EPOCH};

    use idempotent_retry::IdempotencyKey;
    use idempotent_retry::time::{Clock, TokioClock};
    use sha2::{Digest, Sha256};

    /// The body every contender sends.
    const BODY: &str = "charge";
    /// Bare reqwest's request timeout: our client's default per-attempt timeout, so both arm
    /// the same timer.
    const TIMEOUT: Duration = Duration::from_secs(30);
    /// The lease's owner every claim writes.
    const OWNER: &str = "bench-worker";

    /// What a claim writes: the key, a fingerprint of the request (SHA-256 of its method, URL
    /// and body, in hex), the lease's end and the record's, in milliseconds since the epoch.
    struct Row {
        key: String,
        fingerprint: String,
        lease_until: i64,
        expires_at: i64,
    }

    impl Row {
        fn new(key: &IdempotencyKey, url: &str) -> Row {
            let now = TokioClock::new()
                .wall()
                .duration_since(UNIX_EPOCH)
                .expect("after 1970");
            let millis = |d: Duration| i64::try_from(d.as_millis()).expect("milliseconds fit");
            let digest = Sha256::new()
                .chain_update("POST ")
                .chain_update(url)
                .chain_update("\n")
                .chain_update(BODY)
                .finalize();
            let mut fingerprint = String::with_capacity(64);
            for byte in digest.iter() {
                let _ = write!(fingerprint, "{byte:02x}");
            }
            Row {
                key: key.as_str().to_owned(),
                fingerprint,
                lease_until: millis(now + Duration::from_secs(60)),
                expires_at: millis(now + Duration::from_secs(86_400)),
            }
        }
    }

    /// A reqwest client of the contender's own (its own connection pool, as ours has).
    fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .build()
            .expect("a reqwest client")
    }

    /// The keyed POST every contender sends, through bare reqwest; its status and body.
    async fn post(http: &reqwest::Client, url: &str, key: &IdempotencyKey) -> (u16, Vec<u8>) {
        let response = http
            .post(url)
            .timeout(TIMEOUT)
            .header("idempotency-key", key.as_str())
            .body(BODY)
            .send()
            .await
            .expect("sent");
        assert_eq!(response.status(), 200);
        let status = response.status().as_u16();
        (status, response.bytes().await.expect("body").to_vec())
    }

    #[cfg(feature = "sqlite")]
    pub(super) use self::sqlite::{Sqlite, ours as sqlite_ours};

    #[cfg(feature = "sqlite")]
    mod sqlite {
        use std::path::Path;
        use std::sync::{Arc, Mutex, PoisonError};
        use std::time::Duration;

        use idempotent_retry::IdempotencyKey;
        use idempotent_retry_sqlite::rusqlite::{Connection, OpenFlags, OptionalExtension, params};

        use super::{OWNER, Row, http, post};

        /// The table, in a file of its own: one index, the primary key's.
        const TABLE: &str = "CREATE TABLE IF NOT EXISTS ops (
            key             TEXT PRIMARY KEY,
            fingerprint     TEXT NOT NULL,
            status          TEXT NOT NULL,
            lease_owner     TEXT NOT NULL,
            lease_until     INTEGER NOT NULL,
            expires_at      INTEGER NOT NULL,
            response_status INTEGER,
            response_body   BLOB
        )";
        /// The claim: no row back means the key was already claimed.
        const CLAIM: &str = "INSERT INTO ops (key, fingerprint, status, \
            lease_owner, lease_until, expires_at) VALUES (?1, ?2, 'in_flight', ?3, ?4, ?5) \
            ON CONFLICT(key) DO NOTHING RETURNING key";
        /// The finish.
        const FINISH: &str =
            "UPDATE ops SET status = ?1, response_status = ?2, response_body = ?3 WHERE key = ?4";

        /// One connection behind a mutex, in WAL mode with `synchronous = FULL` (every commit
        /// syncs the log before it returns); every call on a blocking thread.
        pub(in super::super) struct Sqlite {
            conn: Arc<Mutex<Connection>>,
            http: reqwest::Client,
        }

        impl Sqlite {
            pub(in super::super) fn open(path: &Path) -> Sqlite {
                let conn = Connection::open(path).expect("open the hand-written ledger's file");
                conn.pragma_update(None, "journal_mode", "WAL")
                    .expect("WAL");
                conn.pragma_update(None, "synchronous", "FULL")
                    .expect("synchronous = FULL");
                conn.busy_timeout(Duration::from_secs(5))
                    .expect("busy timeout");
                conn.execute_batch(TABLE).expect("the table");
                Sqlite {
                    conn: Arc::new(Mutex::new(conn)),
                    http: http(),
                }
            }

            /// The journal mode and `synchronous` of its connection.
            pub(in super::super) fn durability(&self) -> String {
                let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
                let (mode, synchronous) = pragmas(&conn);
                format!(
                    "hand-sqlite: journal_mode={mode}, synchronous={synchronous} ({}), read on \
                     its own connection",
                    synchronous_name(synchronous)
                )
            }

            async fn call<T: Send + 'static>(
                &self,
                f: impl FnOnce(&Connection) -> T + Send + 'static,
            ) -> T {
                let conn = Arc::clone(&self.conn);
                tokio::task::spawn_blocking(move || {
                    f(&conn.lock().unwrap_or_else(PoisonError::into_inner))
                })
                .await
                .expect("the blocking call")
            }

            async fn claim(&self, row: Row) -> bool {
                self.call(move |conn| {
                    conn.prepare_cached(CLAIM)
                        .expect("prepare the claim")
                        .query_row(
                            params![
                                row.key,
                                row.fingerprint,
                                OWNER,
                                row.lease_until,
                                row.expires_at
                            ],
                            |r| r.get::<_, String>(0),
                        )
                        .optional()
                        .expect("claim")
                })
                .await
                .is_some()
            }

            async fn finish(&self, key: &IdempotencyKey, status: u16, body: Vec<u8>) {
                let key = key.as_str().to_owned();
                let changed = self
                    .call(move |conn| {
                        conn.prepare_cached(FINISH)
                            .expect("prepare the finish")
                            .execute(params!["succeeded", status, body, key])
                            .expect("finish")
                    })
                    .await;
                assert_eq!(changed, 1, "the finish found its row");
            }

            pub(in super::super) async fn send(&self, url: &str, key: &IdempotencyKey) {
                let claimed = self.claim(Row::new(key, url)).await;
                assert!(claimed, "{}: already claimed", key.as_str());
                let (status, body) = post(&self.http, url, key).await;
                self.finish(key, status, body).await;
            }

            pub(in super::super) async fn claim_and_finish(&self, key: &IdempotencyKey) {
                let claimed = self.claim(Row::new(key, "")).await;
                assert!(claimed, "{}: already claimed", key.as_str());
                self.finish(key, 200, b"ok".to_vec()).await;
            }
        }

        /// The crate's `SqliteLedger` at `path`, as a plain read-only connection on its file
        /// sees it. `synchronous` is a connection's own setting, so that connection's value is
        /// not the ledger's: the line says what the ledger's writer does instead.
        pub(in super::super) fn ours(path: &Path) -> String {
            let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
                .expect("open the ledger's file");
            let (mode, synchronous) = pragmas(&conn);
            format!(
                "sqlite: journal_mode={mode} (the file's, read by a plain connection, which \
                 reads synchronous={synchronous} ({}) on itself); synchronous is per connection: \
                 in WAL mode the ledger's writer commits with NORMAL and fdatasyncs the -wal file \
                 before it answers the writes it committed (crates/sqlite/src/sync.rs), so a write \
                 is answered once on disk, as under FULL",
                synchronous_name(synchronous)
            )
        }

        fn pragmas(conn: &Connection) -> (String, i64) {
            let mode = conn
                .pragma_query_value(None, "journal_mode", |row| row.get(0))
                .expect("journal_mode");
            let synchronous = conn
                .pragma_query_value(None, "synchronous", |row| row.get(0))
                .expect("synchronous");
            (mode, synchronous)
        }

        fn synchronous_name(level: i64) -> &'static str {
            match level {
                0 => "OFF",
                1 => "NORMAL",
                2 => "FULL",
                3 => "EXTRA",
                _ => "unknown",
            }
        }
    }

    #[cfg(feature = "postgres")]
    pub(super) use self::postgres::{Postgres, settings as postgres_settings};

    #[cfg(feature = "postgres")]
    mod postgres {
        use idempotent_retry::IdempotencyKey;
        use idempotent_retry_postgres::deadpool_postgres::{
            Manager, ManagerConfig, Pool, RecyclingMethod, Runtime,
        };
        use idempotent_retry_postgres::tokio_postgres::{self, NoTls};

        use super::{OWNER, Row, http, post};

        /// `hand-postgres-indexed`: the two secondary indexes the crate's ledger keeps for its
        /// sweeps, `list` and purge (by status and time, by expiry), on the same table.
        const INDEXES: &str = "CREATE INDEX ops_status ON ops (status, lease_until);
            CREATE INDEX ops_expires_at ON ops (expires_at)";
        /// The table, in a database of its own: one index, the primary key's.
        const TABLE: &str = "CREATE TABLE ops (
            key             TEXT PRIMARY KEY,
            fingerprint     TEXT NOT NULL,
            status          TEXT NOT NULL,
            lease_owner     TEXT NOT NULL,
            lease_until     BIGINT NOT NULL,
            expires_at      BIGINT NOT NULL,
            response_status INTEGER,
            response_body   BYTEA
        )";
        /// The claim: no row back means the key was already claimed.
        const CLAIM: &str = "INSERT INTO ops (key, fingerprint, status, \
            lease_owner, lease_until, expires_at) VALUES ($1, $2, 'in_flight', $3, $4, $5) \
            ON CONFLICT (key) DO NOTHING RETURNING key";
        /// The finish.
        const FINISH: &str =
            "UPDATE ops SET status = $1, response_status = $2, response_body = $3 WHERE key = $4";

        /// A deadpool-postgres pool; each statement takes a connection for itself and
        /// `prepare_cached`s the statement on it, and commits on its own (autocommit).
        pub(in super::super) struct Postgres {
            pool: Pool,
            http: reqwest::Client,
        }

        impl Postgres {
            pub(in super::super) async fn connect(
                url: &str,
                size: usize,
                indexed: bool,
            ) -> Postgres {
                let config: tokio_postgres::Config = url.parse().expect("a PostgreSQL URL");
                let manager = Manager::from_config(
                    config,
                    NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                let pool = Pool::builder(manager)
                    .max_size(size)
                    .runtime(Runtime::Tokio1)
                    .build()
                    .expect("the pool");
                let connection = pool.get().await.expect("a pooled connection");
                connection.batch_execute(TABLE).await.expect("the table");
                if indexed {
                    connection
                        .batch_execute(INDEXES)
                        .await
                        .expect("the indexes");
                }
                drop(connection);
                Postgres { pool, http: http() }
            }

            pub(in super::super) async fn durability(&self) -> String {
                let connection = self.pool.get().await.expect("a pooled connection");
                settings("hand-postgres", &connection).await
            }

            async fn claim(&self, row: Row) -> bool {
                let connection = self.pool.get().await.expect("a pooled connection");
                let statement = connection
                    .prepare_cached(CLAIM)
                    .await
                    .expect("prepare the claim");
                connection
                    .query_opt(
                        &statement,
                        &[
                            &row.key,
                            &row.fingerprint,
                            &OWNER,
                            &row.lease_until,
                            &row.expires_at,
                        ],
                    )
                    .await
                    .expect("claim")
                    .is_some()
            }

            async fn finish(&self, key: &IdempotencyKey, status: u16, body: &[u8]) {
                let connection = self.pool.get().await.expect("a pooled connection");
                let statement = connection
                    .prepare_cached(FINISH)
                    .await
                    .expect("prepare the finish");
                let changed = connection
                    .execute(
                        &statement,
                        &[&"succeeded", &i32::from(status), &body, &key.as_str()],
                    )
                    .await
                    .expect("finish");
                assert_eq!(changed, 1, "the finish found its row");
            }

            pub(in super::super) async fn send(&self, url: &str, key: &IdempotencyKey) {
                let claimed = self.claim(Row::new(key, url)).await;
                assert!(claimed, "{}: already claimed", key.as_str());
                let (status, body) = post(&self.http, url, key).await;
                self.finish(key, status, &body).await;
            }

            pub(in super::super) async fn claim_and_finish(&self, key: &IdempotencyKey) {
                let claimed = self.claim(Row::new(key, "")).await;
                assert!(claimed, "{}: already claimed", key.as_str());
                self.finish(key, 200, b"ok").await;
            }
        }

        /// `synchronous_commit` and `fsync` as the server reports them to `connection`.
        pub(in super::super) async fn settings(
            name: &str,
            connection: &tokio_postgres::Client,
        ) -> String {
            let show = async |setting: &str| -> String {
                connection
                    .query_one(&format!("SHOW {setting}"), &[])
                    .await
                    .expect("SHOW")
                    .get(0)
            };
            format!(
                "{name}: synchronous_commit={}, fsync={}, read on one of its pooled connections",
                show("synchronous_commit").await,
                show("fsync").await
            )
        }
    }
}

/// Sends one keyed POST under the `n`th key of `run` and checks the answer.
async fn send(client: &Client, url: &str, run: &IdempotencyKey, n: u64) {
    let key = key_of(run, n);
    let response = client
        .post(url)
        .idempotency_key(key)
        .body("charge")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 200);
    let _ = response.bytes().await.expect("body");
}

/// The ledger's part of one operation alone: the claim of the `n`th key of `run`, then its
/// finish as done (nothing at all without a ledger).
async fn claim_and_finish(client: &Client, run: &IdempotencyKey, n: u64) {
    let Some(ledger) = client.ledger() else {
        return;
    };
    let key = key_of(run, n);
    let now = TokioClock::new().wall();
    let owner = format!("bench-{n}");
    let claim = Claim::builder(
        key.as_str(),
        "fingerprint",
        owner.as_str(),
        now,
        now + Duration::from_secs(60),
    )
    .expires_at(now + Duration::from_secs(86_400))
    .window_cutoff(now - Duration::from_secs(86_400))
    .build()
    .expect("claim");
    let claimed = ledger.claim(&claim).await.expect("claimed");
    assert!(matches!(claimed, Claimed::New(_)), "{claimed:?}");
    let finish = Finish::new(
        key.as_str(),
        owner,
        OperationStatus::Succeeded,
        Some(SavedResponse::new(200, Vec::new(), Some(b"ok".to_vec()))),
    )
    .expect("finish")
    .with_last_attempt(now);
    ledger.finish(&finish).await.expect("finished");
}

/// Operations per second for `operations` operations, `concurrency` at a time.
async fn throughput(
    contender: &Contender,
    url: &str,
    run: &IdempotencyKey,
    counter: &AtomicU64,
    operations: u64,
    concurrency: usize,
    ledger_only: bool,
) -> f64 {
    let clock = TokioClock::new();
    let first = counter.fetch_add(operations, Ordering::Relaxed);
    let start = clock.now();
    let operations_done =
        futures_util::stream::iter(first..first + operations).map(|n| async move {
            if ledger_only {
                contender.claim_and_finish(run, n).await;
            } else {
                contender.send(url, run, n).await;
            }
        });
    operations_done
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
    operations as f64 / (clock.now() - start).as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// One contender's figures at one concurrency.
struct Cell {
    name: &'static str,
    concurrency: usize,
    /// Operations per second, one per round.
    rates: Vec<f64>,
    /// Its rate over no ledger's in the same round, one per round.
    ratios: Vec<f64>,
    /// CPU time per operation, one per round: this process's, by [`Part`], then the
    /// PostgreSQL server's.
    cpu: Vec<([f64; PARTS], f64)>,
    /// This process's context switches per operation, one per round.
    switches: Vec<f64>,
}

/// The threads of this process, grouped by what they run.
const PARTS: usize = 3;

/// Names of the [`PARTS`], in the order [`part_of`] numbers them.
const PART_NAMES: [&str; PARTS] = [
    "main thread (the operations' futures)",
    "runtime workers (connections, server)",
    "ledger writer and the rest",
];

/// Which part thread `tid` of process `pid`, named `comm`, belongs to.
fn part_of(pid: &str, tid: &str, comm: &str) -> usize {
    if tid == pid {
        0
    } else if comm.starts_with("tokio-") {
        1
    } else {
        2
    }
}

/// CPU time used so far, in nanoseconds: by this process's threads (by part), and by the
/// local PostgreSQL server's processes. Read from `/proc` (Linux; zero elsewhere), which
/// counts what the scheduler ran, whatever else the machine does: steadier than a rate on a
/// busy machine.
struct CpuTime {
    parts: [u64; PARTS],
    server: u64,
    /// Context switches of this process's threads, voluntary and not: every wait for another
    /// thread (a ledger writer's answer, a blocking task's) is one at least.
    switches: u64,
}

impl CpuTime {
    fn now() -> CpuTime {
        let pid = std::process::id().to_string();
        let mut parts = [0; PARTS];
        let mut switches = 0;
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
            let Ok(task) = task else { continue };
            let tid = task.file_name().to_string_lossy().into_owned();
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            parts[part_of(&pid, &tid, comm.trim_end())] += ran(&task.path());
            switches += switched(&task.path());
        }
        CpuTime {
            parts,
            server: postgres_processes()
                .map(|pid| sum_schedstat(std::fs::read_dir(format!("/proc/{pid}/task")).ok()))
                .sum(),
            switches,
        }
    }

    /// Microseconds per operation since `before`: (this process by part, the server).
    fn per_operation_since(&self, before: &CpuTime, operations: u64) -> ([f64; PARTS], f64) {
        let per = |now: u64, then: u64| now.saturating_sub(then) as f64 / 1e3 / operations as f64;
        (
            std::array::from_fn(|i| per(self.parts[i], before.parts[i])),
            per(self.server, before.server),
        )
    }
}

/// A thread's context switches so far, voluntary and not, from its `status`.
fn switched(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("status"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("ctxt_switches:"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// The first field of a thread's `schedstat`: nanoseconds it ran on a CPU.
fn ran(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|line| line.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// What the threads in `tasks` ran, in nanoseconds.
fn sum_schedstat(tasks: Option<std::fs::ReadDir>) -> u64 {
    tasks
        .into_iter()
        .flatten()
        .filter_map(|task| Some(ran(&task.ok()?.path())))
        .sum()
}

/// The processes named `postgres` (the server and its backends), when one runs here.
fn postgres_processes() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{name}/comm")).ok()?;
            (comm.trim_end() == "postgres").then_some(name)
        })
}

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cells = runtime.block_on(async {
        let url = common::start_server().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let (clients, durability) = contenders(&options, dir.path()).await;
        if !durability.is_empty() {
            println!("Durability in effect:\n");
            for line in &durability {
                println!("- {line}");
            }
        }
        let run = IdempotencyKey::random();
        let counter = AtomicU64::new(0);
        // Warm up every contender's connections, statement caches and files.
        for contender in &clients {
            throughput(
                contender,
                &url,
                &run,
                &counter,
                200,
                16,
                options.ledger_only,
            )
            .await;
        }
        let mut cells = Vec::new();
        for &concurrency in &options.concurrency {
            let operations = options.operations_at(concurrency);
            let mut rates = vec![Vec::new(); clients.len()];
            let mut cpu = vec![Vec::new(); clients.len()];
            let mut switches = vec![Vec::new(); clients.len()];
            for round in 0..options.rounds {
                for turn in 0..clients.len() {
                    let which = (round + turn) % clients.len();
                    let before = CpuTime::now();
                    let rate = throughput(
                        &clients[which],
                        &url,
                        &run,
                        &counter,
                        operations,
                        concurrency,
                        options.ledger_only,
                    )
                    .await;
                    rates[which].push(rate);
                    let after = CpuTime::now();
                    cpu[which].push(after.per_operation_since(&before, operations));
                    switches[which].push(
                        after.switches.saturating_sub(before.switches) as f64 / operations as f64,
                    );
                }
            }
            for (i, contender) in clients.iter().enumerate() {
                let ratios = rates[i]
                    .iter()
                    .zip(&rates[0])
                    .map(|(rate, none)| rate / none)
                    .collect();
                cells.push(Cell {
                    name: contender.name,
                    concurrency,
                    cpu: cpu[i].clone(),
                    switches: switches[i].clone(),
                    rates: rates[i].clone(),
                    ratios,
                });
            }
        }
        drop(clients);
        #[cfg(feature = "postgres")]
        drop_bench_databases().await;
        cells
    });
    runtime.shutdown_timeout(Duration::from_secs(1));

    println!(
        "\n| in flight | ledger | ops/s (median of {} rounds) | min..max | ratio to no ledger (median) | min..max | CPU µs/op: bench process | + PostgreSQL server |",
        options.rounds
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for cell in &cells {
        let (mut rates, mut ratios) = (cell.rates.clone(), cell.ratios.clone());
        let rate = median(&mut rates);
        let ratio = median(&mut ratios);
        let mut process: Vec<f64> = cell.cpu.iter().map(|c| c.0.iter().sum()).collect();
        let mut server: Vec<f64> = cell.cpu.iter().map(|c| c.1).collect();
        println!(
            "| {} | {} | {:.0} | {:.0}..{:.0} | {:.3} | {:.3}..{:.3} | {:.1} | {:.1} |",
            cell.concurrency,
            cell.name,
            rate,
            rates[0],
            rates[rates.len() - 1],
            ratio,
            ratios[0],
            ratios[ratios.len() - 1],
            median(&mut process),
            median(&mut server),
        );
    }
    println!(
        "\nCPU µs per operation by thread (median of {} rounds):\n",
        options.rounds
    );
    println!(
        "| in flight | ledger | {} | context switches/op, bench process |\n|---:|---|{}---:|",
        PART_NAMES.join(" | "),
        "---:|".repeat(PARTS)
    );
    for cell in &cells {
        let parts: Vec<String> = (0..PARTS)
            .map(|i| {
                let mut part: Vec<f64> = cell.cpu.iter().map(|c| c.0[i]).collect();
                format!("{:.1}", median(&mut part))
            })
            .collect();
        let mut switches = cell.switches.clone();
        println!(
            "| {} | {} | {} | {:.1} |",
            cell.concurrency,
            cell.name,
            parts.join(" | "),
            median(&mut switches)
        );
    }
    vs_hand(&cells, &options);
    if let Some(path) = &options.svg {
        std::fs::write(path, svg(&cells, &options)).expect("write the chart");
        println!("\nchart written to {path}");
    }
}

/// Prints each crate ledger against its hand-written baseline, where both ran: the ratio of
/// their rates within each round (median and range over the rounds), and each one's CPU time
/// per operation (the bench process and the PostgreSQL server together, median over the
/// rounds).
fn vs_hand(cells: &[Cell], options: &Options) {
    let measured = |name: &str| cells.iter().any(|c| c.name == name);
    let pairs: Vec<(&str, &str)> = [("sqlite", "hand-sqlite"), ("postgres", "hand-postgres")]
        .into_iter()
        .filter(|(ours, hand)| measured(ours) && measured(hand))
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!(
        "\nOurs against the hand-written ledger (ratio within each round, median of {} rounds):\n",
        options.rounds
    );
    println!(
        "| in flight | ledgers | ops/s, ours / hand (median) | min..max | CPU µs/op with server: ours | hand |"
    );
    println!("|---:|---|---:|---:|---:|---:|");
    let cpu = |cell: &Cell| {
        let mut total: Vec<f64> = cell
            .cpu
            .iter()
            .map(|(process, server)| process.iter().sum::<f64>() + server)
            .collect();
        median(&mut total)
    };
    for &concurrency in &options.concurrency {
        for &(ours, hand) in &pairs {
            let cell = |name: &str| {
                cells
                    .iter()
                    .find(|c| c.concurrency == concurrency && c.name == name)
                    .expect("every contender runs at every concurrency")
            };
            let (ours_cell, hand_cell) = (cell(ours), cell(hand));
            let mut ratios: Vec<f64> = ours_cell
                .rates
                .iter()
                .zip(&hand_cell.rates)
                .map(|(ours, hand)| ours / hand)
                .collect();
            let ratio = median(&mut ratios);
            println!(
                "| {concurrency} | {ours} / {hand} | {ratio:.3} | {:.3}..{:.3} | {:.1} | {:.1} |",
                ratios[0],
                ratios[ratios.len() - 1],
                cpu(ours_cell),
                cpu(hand_cell),
            );
        }
    }
}

/// A grouped bar chart: one group per concurrency, one bar per ledger (its median ops/s), the
/// ratio to no ledger above each bar. Plain SVG text, no dependencies.
fn svg(cells: &[Cell], options: &Options) -> String {
    const GROUP_W: f64 = 300.0;
    const PLOT_H: f64 = 300.0;
    const TOP: f64 = 70.0;
    const LEFT: f64 = 70.0;
    const COLOURS: [(&str, &str); 6] = [
        ("none", "#9aa5b1"),
        ("memory", "#7fb77e"),
        ("sqlite", "#2f6f9f"),
        ("hand-sqlite", "#8db9dc"),
        ("postgres", "#c2773a"),
        ("hand-postgres", "#e6b98c"),
    ];
    let names: Vec<&str> = COLOURS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| cells.iter().any(|c| c.name == *name))
        .collect();
    let colour = |name: &str| {
        COLOURS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("#555555", |(_, c)| *c)
    };
    let medians: Vec<(usize, &str, f64, f64)> = cells
        .iter()
        .map(|cell| {
            let (mut rates, mut ratios) = (cell.rates.clone(), cell.ratios.clone());
            (
                cell.concurrency,
                cell.name,
                median(&mut rates),
                median(&mut ratios),
            )
        })
        .collect();
    let max = medians.iter().map(|m| m.2).fold(1.0_f64, f64::max);
    // A round top of the scale: 1, 2 or 5 times a power of ten.
    let magnitude = 10f64.powf(max.log10().floor());
    let top = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|t| *t >= max)
        .unwrap_or(max);
    let scale = PLOT_H / top;
    let width = LEFT + GROUP_W * options.concurrency.len() as f64 + 30.0;
    let height = TOP + PLOT_H + 80.0;
    let base = TOP + PLOT_H;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{x}" y="24" text-anchor="middle" font-size="16">Keyed POSTs per second by ledger and operations in flight (ratio to no ledger above each bar)</text>"##,
        x = width / 2.0,
    );
    let legend_w = 110.0;
    let legend_x = width / 2.0 - legend_w * names.len() as f64 / 2.0;
    for (i, name) in names.iter().enumerate() {
        let x = legend_x + i as f64 * legend_w;
        let _ = writeln!(
            out,
            r##"<rect x="{x:.1}" y="38" width="12" height="12" fill="{c}"/><text x="{tx:.1}" y="48">{label}</text>"##,
            c = colour(name),
            tx = x + 16.0,
            label = if *name == "none" { "no ledger" } else { name },
        );
    }
    for tick in 0..=4 {
        let value = top * f64::from(tick) / 4.0;
        let y = base - value * scale;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x2:.1}" y2="{y:.1}" stroke="#dddddd"/>
<text x="{tx}" y="{ty:.1}" text-anchor="end">{value:.0}</text>"##,
            x2 = width - 30.0,
            tx = LEFT - 6.0,
            ty = y + 4.0,
        );
    }
    let bar_w = (GROUP_W - 40.0) / names.len() as f64;
    for (g, concurrency) in options.concurrency.iter().enumerate() {
        let gx = LEFT + g as f64 * GROUP_W + 20.0;
        for (i, name) in names.iter().enumerate() {
            let Some(&(_, _, rate, ratio)) =
                medians.iter().find(|m| m.0 == *concurrency && m.1 == *name)
            else {
                continue;
            };
            let h = rate * scale;
            let x = gx + i as f64 * bar_w;
            let _ = writeln!(
                out,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"/>
<text x="{tx:.1}" y="{ly:.1}" text-anchor="middle" font-size="11">{ratio:.2}</text>"##,
                y = base - h,
                w = bar_w - 6.0,
                c = colour(name),
                tx = x + (bar_w - 6.0) / 2.0,
                ly = base - h - 4.0,
            );
        }
        let _ = writeln!(
            out,
            r##"<text x="{x:.1}" y="{y}" text-anchor="middle" font-size="13">{concurrency} in flight</text>"##,
            x = gx + (GROUP_W - 40.0) / 2.0,
            y = base + 22.0,
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{base}" x2="{x2:.1}" y2="{base}" stroke="#333"/>
<text x="{x}" y="{y}" text-anchor="middle" font-size="11" fill="#555">a new key per operation, one keep-alive loopback server; median of {rounds} interleaved rounds; every write on disk before it is answered; benches/ledger.rs</text>
</svg>"##,
        x2 = width - 30.0,
        x = width / 2.0,
        y = base + 56.0,
        rounds = options.rounds,
    );
    out
}
