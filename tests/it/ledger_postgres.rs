//! The PostgreSQL ledger as a fleet uses it, against a real server and real loopback
//! receivers: workers racing for one key, a connection lost mid-operation, the incident query,
//! and `migrate` on new, 0.1 and newer databases, from many workers at once.
//!
//! The ledger's pool and TLS too: the conformance suite over a small pool, the caller's pool
//! and TLS, claims of many keys and of one key at once, a key waiting on a lock while others
//! go on, a killed connection replaced, a pool of one under concurrent operations, and an
//! untrusted certificate.
//!
//! Needs `IDEMPOTENT_RETRY_PG_URL`, and for TLS (feature `postgres-rustls`)
//! `IDEMPOTENT_RETRY_PG_TLS_URL` and `IDEMPOTENT_RETRY_PG_CA` (`.ci/run` starts a server and sets
//! them). Without them the tests are skipped, except under `CI`, where they fail.
#![cfg(feature = "postgres")]

use idempotent_retry_postgres::{deadpool_postgres, tokio_postgres};
#[cfg(feature = "postgres-rustls")]
use idempotent_retry_postgres::{rustls, tokio_postgres_rustls};
use std::time::Duration;

use crate::support::*;
use idempotent_retry::ledger::{
    LeaseHeldPolicy, Ledger, LedgerErrorKind, LedgerOptions, MemoryLedger, OperationStatus,
    PostgresLedger,
};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport};
use tokio_postgres::NoTls;

async fn worker(url: &str, name: &str, on_lease_held: LeaseHeldPolicy) -> Client {
    let ledger = PostgresLedger::connect(url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    Client::builder()
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5))
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .ledger(ledger)
        .ledger_options(
            LedgerOptions::new()
                .worker(name)
                .on_lease_held(on_lease_held),
        )
        .build()
        .expect("valid policy")
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_eight_workers_racing_for_one_key_exactly_one_sends() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(
            Duration::from_millis(300),
            Action::ok("charged"),
        )],
        Action::ok("charged"),
    )
    .await;
    let mut workers = Vec::new();
    for i in 0..8 {
        workers.push(worker(&url, &format!("w{i}"), LeaseHeldPolicy::Fail).await);
    }
    let key = IdempotencyKey::derive("tests.pg", &["race"]);
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(workers.len()));
    let mut tasks = tokio::task::JoinSet::new();
    for client in workers {
        let (barrier, key, url) = (barrier.clone(), key.clone(), server.url("/charges"));
        tasks.spawn(async move {
            barrier.wait().await;
            client
                .post(url)
                .idempotency_key(key)
                .body("charge")
                .send()
                .await
        });
    }
    // Every loser is told "in progress" (or, if it was slow enough to claim after the winner
    // finished, gets the winner's response replayed): none sends.
    let mut sent = 0;
    let mut not_sent = 0;
    while let Some(result) = tasks.join_next().await {
        match result.expect("task") {
            Ok(response) if RetryReport::of(&response).is_some_and(RetryReport::is_replayed) => {
                not_sent += 1;
            }
            Ok(_) => sent += 1,
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::LeaseHeld, "{err}");
                assert_eq!(err.attempts(), 0);
                not_sent += 1;
            }
        }
    }
    assert_eq!((sent, not_sent), (1, 7));
    assert_eq!(server.hits(), 1, "exactly one worker sent");
    assert_eq!(server.effects(), 1);
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_workers_get_the_winner_s_response_without_sending() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(
            Duration::from_millis(300),
            Action::ok("charged"),
        )],
        Action::ok("charged"),
    )
    .await;
    let wait = LeaseHeldPolicy::Wait {
        poll: Duration::from_millis(25),
        max_wait: Duration::from_secs(30),
    };
    let mut tasks = tokio::task::JoinSet::new();
    let key = IdempotencyKey::derive("tests.pg", &["wait"]);
    for i in 0..4 {
        let client = worker(&url, &format!("w{i}"), wait).await;
        let (key, url) = (key.clone(), server.url("/charges"));
        tasks.spawn(async move {
            let response = client
                .post(url)
                .idempotency_key(key)
                .body("charge")
                .send()
                .await?;
            let replayed = RetryReport::of(&response).is_some_and(RetryReport::is_replayed);
            Ok::<_, idempotent_retry::Error>((replayed, response.text().await.unwrap_or_default()))
        });
    }
    let mut replayed = 0;
    while let Some(result) = tasks.join_next().await {
        let (was_replayed, body) = result.expect("task").expect("every worker gets the answer");
        assert_eq!(body, "charged");
        replayed += usize::from(was_replayed);
    }
    assert_eq!(replayed, 3);
    assert_eq!(server.hits(), 1);
}

/// Kills every session of `app` from another connection; returns how many.
async fn terminate(admin: &tokio_postgres::Client, app: &str) -> i64 {
    admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("terminate")
        .get(0)
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_operation_is_reopened_or_reported_never_lost() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let database = url.rsplit_once('/').expect("database").1.to_owned();
    let app = format!(
        "ledger_{}",
        IdempotencyKey::random().as_str().replace('-', "")
    );
    let server = TestServer::start_idempotent(
        vec![
            Action::stall_then(Duration::from_millis(800), Action::ok("one")),
            Action::stall_then(Duration::from_millis(800), Action::ok("two")),
        ],
        Action::ok("two"),
    )
    .await;
    // On the caller's clock: the runs' leases are on the virtual timeline.
    let ledger = PostgresLedger::connect(&format!("{url}?application_name={app}"))
        .await
        .expect("connect")
        .on_caller_clock();
    ledger.migrate().await.expect("migrate");
    let time = VirtualTime::new();
    let client = Client::builder()
        .policy(RetryPolicy::default().with_attempt_timeout(Duration::from_secs(5)))
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger.clone())
        .ledger_options(
            LedgerOptions::new()
                .lease(Duration::from_secs(10))
                .on_lease_held(LeaseHeldPolicy::Fail),
        )
        .build()
        .expect("valid policy");
    let (admin, connection) = tokio_postgres::connect(&base, NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let send = |key: &IdempotencyKey| {
        let (client, key, url) = (client.clone(), key.clone(), server.url("/charges"));
        tokio::spawn(async move {
            client
                .post(url)
                .idempotency_key(key)
                .body("charge")
                .send()
                .await
        })
    };

    // 1. The connection dies while the request is in flight, and the server lets the ledger
    //    back in: it reconnects and records the attempt and the outcome.
    let first = IdempotencyKey::derive("tests.pg", &["lost", "1"]);
    let sending = send(&first);
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(5)).await, 1);
    assert_eq!(terminate(&admin, &app).await, 1);
    let response = sending
        .await
        .expect("task")
        .expect("recorded after reconnecting");
    assert_eq!(response.text().await.expect("body"), "one");
    let row = ledger
        .get(first.as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 1));

    // 2. The connection dies and the database refuses new ones until the request is over:
    //    the answer cannot be recorded; the caller gets it, and the report says so.
    let second = IdempotencyKey::derive("tests.pg", &["lost", "2"]);
    let sending = send(&second);
    assert_eq!(server.wait_for_hits(2, Duration::from_secs(5)).await, 2);
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {database} ALLOW_CONNECTIONS false"
        ))
        .await
        .expect("lock the database");
    assert_eq!(terminate(&admin, &app).await, 1);
    let answered = sending
        .await
        .expect("task")
        .expect("the answer in hand is returned");
    let report = RetryReport::of(&answered).expect("report").clone();
    assert_eq!(report.idempotency_key(), Some(&second));
    assert!(report.unrecorded().is_some(), "not recorded: {report:?}");
    assert_eq!(answered.text().await.expect("body"), "two");
    admin
        .batch_execute(&format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true"))
        .await
        .expect("unlock the database");

    // The claim survived: the row is in flight under the dead run's lease. Once the lease
    // lapses, the next run resends the same key and the receiver deduplicates it.
    let row = ledger
        .get(second.as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.status, OperationStatus::InFlight);
    let err = send(&second)
        .await
        .expect("task")
        .expect_err("lease still live");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    time.advance(Duration::from_secs(11));
    let response = send(&second).await.expect("task").expect("taken over");
    assert_eq!(response.text().await.expect("body"), "two");
    assert_eq!(server.effects_for(second.as_str()), 1);
    assert_eq!(server.effects(), 2);
    let row = ledger
        .get(second.as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
}

/// The query in the `Ledger` docs' "Incident queries" section, verbatim.
/// The schema version this release writes.
const LATEST: u32 = idempotent_retry_ledger::sql::SCHEMA_VERSION;

const INCIDENT_QUERY: &str = "
SELECT scope, fingerprint, status,
       count(*)               AS keys,
       array_agg(key)         AS which_keys,
       sum(attempts)          AS attempts,
       to_timestamp(min(first_attempt_at) / 1000.0) AS first_seen
FROM idempotent_operations
GROUP BY scope, fingerprint, status
HAVING (status = 'succeeded' AND count(*) > 1)
    OR status IN ('unknown', 'in_flight')
ORDER BY first_seen";

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn the_incident_query_finds_double_charges_and_unresolved_operations() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let server = TestServer::start(vec![Action::status(503)], Action::ok("charged")).await;
    let client = worker(&url, "w", LeaseHeldPolicy::Fail).await;
    let send = |key: &str, body: &'static str, attempts: u32| {
        client
            .post(server.url("/charges"))
            .idempotency_key(IdempotencyKey::new(key).expect("key"))
            .policy(
                RetryPolicy::default()
                    .with_max_attempts(attempts)
                    .with_base_delay(Duration::from_millis(1)),
            )
            .ledger_scope("stripe.charge")
            .body(body)
    };
    // One 503 and stop: unresolved.
    send("k-unresolved", "charge order 2", 1)
        .send()
        .await
        .expect_err("503");
    // The same charge under two keys (a retry that minted a new key): charged twice.
    send("k-first", "charge order 1", 1)
        .send()
        .await
        .expect("ok");
    send("k-second", "charge order 1", 1)
        .send()
        .await
        .expect("ok");
    // A healthy, single charge.
    send("k-alone", "charge order 3", 1)
        .send()
        .await
        .expect("ok");

    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    let rows = admin
        .query(INCIDENT_QUERY, &[])
        .await
        .expect("the documented query runs");
    let found: Vec<(String, i64, Vec<String>)> = rows
        .iter()
        .map(|row| {
            let mut keys: Vec<String> = row.get("which_keys");
            keys.sort();
            (row.get("status"), row.get("keys"), keys)
        })
        .collect();
    assert_eq!(
        found,
        vec![
            ("unknown".to_owned(), 1, vec!["k-unresolved".to_owned()]),
            (
                "succeeded".to_owned(),
                2,
                vec!["k-first".to_owned(), "k-second".to_owned()]
            ),
        ]
    );
}

/// A plain client on `url`, for looking at the tables from outside the ledger.
async fn inspector(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// Every row of the version table, each with its `xmin` (the transaction that last wrote it),
/// so a rewrite of the same version shows.
async fn version_rows(client: &tokio_postgres::Client) -> Vec<(i32, String)> {
    client
        .query(
            "SELECT version, xmin::text FROM idempotent_operations_schema",
            &[],
        )
        .await
        .expect("read the version table")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_new_database_is_at_the_latest_schema_version_and_migrating_again_changes_nothing() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    assert_eq!(
        ledger.schema_version().await.expect("version"),
        0,
        "nothing yet"
    );
    ledger.migrate().await.expect("migrate");
    assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
    let plain = inspector(&url).await;
    let before = version_rows(&plain).await;
    assert_eq!(before.len(), 1);
    assert_eq!(i64::from(before[0].0), i64::from(LATEST));
    ledger.migrate().await.expect("migrate again");
    let other = PostgresLedger::connect(&url).await.expect("connect");
    other.migrate().await.expect("another worker's migrate");
    assert_eq!(
        version_rows(&plain).await,
        before,
        "the version row was not rewritten"
    );
    assert_eq!(other.schema_version().await.expect("version"), LATEST);
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_database_never_migrated_is_named_with_the_fix_and_nothing_is_sent() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    let server = TestServer::start(vec![], Action::ok("charged")).await;
    let client = Client::builder().ledger(ledger).build().expect("client");
    let err = client
        .post(server.url("/charges"))
        .idempotency_key(IdempotencyKey::derive("tests.pg", &["unmigrated"]))
        .send()
        .await
        .expect_err("no table");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(!err.is_outcome_unknown());
    let text = err.to_string();
    assert!(
        text.contains(
            "table idempotent_operations is missing: run `PostgresLedger::migrate()` once"
        ),
        "{text}"
    );
    assert_eq!(server.hits(), 0, "nothing was sent");
}

/// A claim made at a time finer than a millisecond returns the row as the database keeps it:
/// what a later read gives, new row or take-over, times and all.
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_claim_returns_its_row_as_stored_to_the_millisecond() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    // On its own clock, the row holds the database's times: the claim answers them too.
    let own = idempotent_retry::ledger::Claim::builder(
        "own",
        "f",
        "run-a",
        std::time::SystemTime::UNIX_EPOCH + Duration::new(1_704_067_200, 123_456_789),
        std::time::SystemTime::UNIX_EPOCH + Duration::new(1_704_067_260, 987_654),
    )
    .build()
    .expect("valid claim");
    match ledger.claim(&own).await.expect("claim") {
        idempotent_retry::ledger::Claimed::New(record) => assert_eq!(
            Some(record),
            ledger.get("own").await.expect("read"),
            "the new row as a read gives it"
        ),
        other => panic!("a new row: {other:?}"),
    }
    // On the caller's clock, to the millisecond of the claim's own times.
    let ledger = ledger.on_caller_clock();
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::new(1_704_067_200, 123_456_789);
    let claim = |owner: &str, at: std::time::SystemTime| {
        idempotent_retry::ledger::Claim::builder(
            "fine",
            "f",
            owner,
            at,
            at + Duration::new(60, 987_654),
        )
        .expires_at(at + Duration::new(3600, 555_555))
        .request("POST", "https://api.example/v1/charges")
        .build()
        .expect("valid claim")
    };
    let new = match ledger.claim(&claim("run-a", now)).await.expect("claim") {
        idempotent_retry::ledger::Claimed::New(record) => record,
        other => panic!("a new row: {other:?}"),
    };
    let stored = ledger.get("fine").await.expect("read").expect("row");
    assert_eq!(new, stored, "the new row as a read gives it");
    assert_eq!(
        new.first_attempt_at,
        std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(1_704_067_200_123)
    );
    let later = now + Duration::from_secs(120);
    let taken = match ledger.claim(&claim("run-b", later)).await.expect("claim") {
        idempotent_retry::ledger::Claimed::TakenOver { record, .. } => record,
        other => panic!("a take-over of the lapsed lease: {other:?}"),
    };
    let stored = ledger.get("fine").await.expect("read").expect("row");
    assert_eq!(taken, stored, "the taken-over row as a read gives it");
}

/// A client that sends once per run, on `ledger` and the shared virtual timeline.
fn one_attempt_client(ledger: impl Ledger, time: &VirtualTime) -> Client {
    Client::builder()
        .policy(
            RetryPolicy::default()
                .with_max_attempts(1)
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger)
        .build()
        .expect("valid policy")
}

/// The row a 0.1 worker left (outcome unknown after a 503) is still the same operation after
/// the upgrade: the next run claims it under the same key and window and finishes it.
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_database_made_by_the_0_1_migrate_is_upgraded_and_its_row_claimed_and_finished() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let server =
        TestServer::start_idempotent(vec![Action::status(503)], Action::ok("charged")).await;
    let time = VirtualTime::new();
    let key = IdempotencyKey::derive("tests.pg", &["upgrade"]);
    // The first run, on a ledger that keeps the same record as the SQL ones, gives the row its
    // real fingerprint; it is then written into a database made with the 0.1 DDL by hand.
    let memory = MemoryLedger::new();
    let err = one_attempt_client(memory.clone(), &time)
        .post(server.url("/charges"))
        .idempotency_key(key.clone())
        .body("charge")
        .send()
        .await
        .expect_err("one 503");
    assert!(err.is_outcome_unknown());
    let left = memory.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!((left.status, left.attempts), (OperationStatus::Unknown, 1));
    let plain = inspector(&url).await;
    plain
        .batch_execute(&ddl_0_1("BYTEA"))
        .await
        .expect("the 0.1 schema");
    plain
        .execute(
            "INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts, \
             first_attempt_at, last_attempt_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &left.key,
                &left.scope,
                &left.fingerprint,
                &left.status.as_str(),
                &i32::try_from(left.attempts).expect("small"),
                &millis(left.first_attempt_at),
                &left.last_attempt_at.map(millis),
                &millis(left.expires_at),
            ],
        )
        .await
        .expect("the 0.1 row");

    // A new release's worker migrates ten minutes later: stamped, the row as it was.
    time.advance(Duration::from_secs(600));
    // On the caller's clock: the row and the run are on the virtual timeline.
    let ledger = PostgresLedger::connect(&url)
        .await
        .expect("connect")
        .on_caller_clock();
    assert_eq!(ledger.schema_version().await.expect("version"), 0);
    ledger.migrate().await.expect("upgrade");
    assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
    assert_eq!(version_rows(&plain).await.len(), 1);
    let row = ledger
        .get(key.as_str())
        .await
        .expect("read")
        .expect("the row survived");
    assert_eq!(
        (&row.fingerprint, row.status, row.attempts),
        (&left.fingerprint, OperationStatus::Unknown, 1)
    );

    let response = one_attempt_client(ledger.clone(), &time)
        .post(server.url("/charges"))
        .idempotency_key(key.clone())
        .body("charge")
        .send()
        .await
        .expect("the upgraded row is claimed and the second attempt succeeds");
    assert_eq!(response.text().await.expect("body"), "charged");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 2));
    assert_eq!(millis(row.first_attempt_at), millis(left.first_attempt_at));
    assert_eq!(server.keys(), vec![Some(key.to_string()); 2]);
    assert_eq!(server.effects(), 1);
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_database_from_a_newer_release_is_refused_with_both_versions_and_left_as_it_was() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let client = worker(&url, "w", LeaseHeldPolicy::Fail).await;
    client
        .post(server.url("/x"))
        .idempotency_key(IdempotencyKey::derive("tests.pg", &["newer"]))
        .send()
        .await
        .expect("healthy");
    // What a release with schema version 4 would leave.
    let plain = inspector(&url).await;
    plain
        .batch_execute(&format!(
            "UPDATE idempotent_operations_schema SET version = {}",
            LATEST + 1
        ))
        .await
        .expect("stamp a newer version");
    let before = version_rows(&plain).await;
    let tables = "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()";
    let table_count: i64 = plain.query_one(tables, &[]).await.expect("tables").get(0);

    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    let err = ledger.migrate().await.expect_err("too new");
    assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "ledger storage is corrupt: schema version {} is newer than {LATEST}, the latest \
             this release of idempotent-retry knows: upgrade idempotent-retry to use this store \
             (it was left unchanged)",
            LATEST + 1
        )
    );
    assert_eq!(ledger.schema_version().await.expect("version"), LATEST + 1);
    assert_eq!(
        version_rows(&plain).await,
        before,
        "the version row untouched"
    );
    let after: i64 = plain.query_one(tables, &[]).await.expect("tables").get(0);
    assert_eq!(after, table_count, "no table created");
    let rows: i64 = plain
        .query_one("SELECT count(*) FROM idempotent_operations", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 1, "the row kept");
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_migrating_a_new_database_at_once_all_succeed_and_leave_one_version_row() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    // A round per isolation level a database may default to, each on a new database: the
    // migration must not depend on the default.
    for isolation in ["read committed", "repeatable read", "serializable"] {
        let url = postgres_database_on(&base).await;
        let database = url.rsplit_once('/').expect("database").1;
        inspector(&base)
            .await
            .batch_execute(&format!(
                "ALTER DATABASE {database} SET default_transaction_isolation = '{isolation}'"
            ))
            .await
            .expect("set the default isolation");
        let mut ledgers = Vec::new();
        for _ in 0..6 {
            ledgers.push(PostgresLedger::connect(&url).await.expect("connect"));
        }
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ledgers.len()));
        let mut migrations = tokio::task::JoinSet::new();
        for ledger in ledgers {
            let barrier = barrier.clone();
            migrations.spawn(async move {
                barrier.wait().await;
                ledger.migrate().await.map(|()| ledger)
            });
        }
        while let Some(migrated) = migrations.join_next().await {
            let ledger = migrated
                .expect("task")
                .unwrap_or_else(|err| panic!("{isolation}: {err:?}"));
            assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
        }
        let rows = version_rows(&inspector(&url).await).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(i64::from(rows[0].0), i64::from(LATEST));
    }
}

// The pool and TLS.

#[cfg(feature = "postgres-rustls")]
/// The TLS URL and the CA file that signed the server's certificate, or `None` (skipped)
/// outside CI.
fn tls_settings() -> Option<(String, String)> {
    match (
        std::env::var("IDEMPOTENT_RETRY_PG_TLS_URL"),
        std::env::var("IDEMPOTENT_RETRY_PG_CA"),
    ) {
        (Ok(url), Ok(ca)) => Some((url, ca)),
        _ if std::env::var_os("CI").is_some() => panic!(
            "IDEMPOTENT_RETRY_PG_TLS_URL and IDEMPOTENT_RETRY_PG_CA must be set in CI \
             (.ci/postgres.sh sets them)"
        ),
        _ => {
            eprintln!("skipped: IDEMPOTENT_RETRY_PG_TLS_URL or IDEMPOTENT_RETRY_PG_CA is not set");
            None
        }
    }
}

#[cfg(feature = "postgres-rustls")]
/// `tls_url` pointed at the database of `plain_url` (a fresh one), its query kept.
fn on_database(tls_url: &str, plain_url: &str) -> String {
    let database = plain_url.rsplit_once('/').expect("database").1;
    let (path, query) = tls_url.split_once('?').unwrap_or((tls_url, ""));
    let (prefix, _) = path.rsplit_once('/').expect("URL ends with /database");
    format!("{prefix}/{database}?{query}")
}

/// The claim of `key` by `owner` at the fixed instant the concurrency tests use.
fn claim_of(key: &str, owner: &str) -> idempotent_retry::ledger::Claim {
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    idempotent_retry::ledger::Claim::builder(key, "fp", owner, now, now + Duration::from_secs(60))
        .expires_at(now + Duration::from_secs(86_400))
        .build()
        .expect("valid claim")
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes_over_a_small_pool_the_caller_s_pool_and_tls() {
    use idempotent_retry_testkit::ledger_conformance;
    let Some(base) = postgres_server_url() else {
        return;
    };
    ledger_conformance(|| async {
        let url = postgres_database_on(&base).await;
        let ledger = PostgresLedger::builder()
            .url(&url)
            .pool_size(3)
            .build()
            .await
            .expect("connect");
        ledger.migrate().await.expect("migrate");
        ledger
    })
    .await
    .assert_passed();

    ledger_conformance(|| async {
        let url = postgres_database_on(&base).await;
        let config: tokio_postgres::Config = url.parse().expect("url");
        let manager = deadpool_postgres::Manager::new(config, NoTls);
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(4)
            .build()
            .expect("pool");
        let ledger = PostgresLedger::from_pool(pool);
        ledger.migrate().await.expect("migrate");
        ledger
    })
    .await
    .assert_passed();

    #[cfg(feature = "postgres-rustls")]
    {
        let Some((tls_url, ca)) = tls_settings() else {
            return;
        };
        ledger_conformance(|| async {
            let url = on_database(&tls_url, &postgres_database_on(&base).await);
            let ledger = PostgresLedger::builder()
                .url(&url)
                .tls_ca_file(&ca)
                .build()
                .await
                .expect("connect over TLS");
            ledger.migrate().await.expect("migrate");
            ledger
        })
        .await
        .assert_passed();
    }
}

#[cfg(feature = "postgres-rustls")]
/// A rustls connector of the test's own, trusting `ca`: what a caller with its own TLS
/// settings hands the builder.
fn rustls_connector(ca: &str) -> tokio_postgres_rustls::MakeRustlsConnect {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(ca).expect("read the CA") {
        roots.add(certificate.expect("PEM")).expect("a CA");
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_postgres_rustls::MakeRustlsConnect::new(config)
}

#[cfg(feature = "postgres-rustls")]
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn over_tls_the_connection_is_encrypted_from_a_config_and_the_caller_s_connector() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let Some((tls_url, ca)) = tls_settings() else {
        return;
    };
    let url = on_database(&tls_url, &postgres_database_on(&base).await);
    let app = format!("tls_{}", IdempotencyKey::random().as_str().replace('-', ""));
    let mut config: tokio_postgres::Config = url.parse().expect("url");
    config.application_name(&app);
    let ledger = PostgresLedger::builder()
        .config(config)
        .tls(rustls_connector(&ca))
        .build()
        .await
        .expect("connect over TLS");
    ledger.migrate().await.expect("migrate");
    let server = TestServer::start(vec![], Action::ok("charged")).await;
    let key = IdempotencyKey::derive("tests.pg", &["tls"]);
    let client = Client::builder()
        .ledger(ledger.clone())
        .build()
        .expect("client");
    let response = client
        .post(server.url("/charges"))
        .idempotency_key(key.clone())
        .body("charge")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.text().await.expect("body"), "charged");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 1));
    // Seen from the server: every session of the ledger is encrypted.
    let (encrypted, plain): (i64, i64) = {
        let row = inspector(&base)
            .await
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
                 FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = $1",
                &[&app],
            )
            .await
            .expect("sessions");
        (row.get(0), row.get(1))
    };
    assert!(encrypted >= 1, "{encrypted} encrypted sessions");
    assert_eq!(plain, 0);
}

#[cfg(feature = "postgres-rustls")]
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn a_certificate_from_an_untrusted_ca_fails_the_build_with_a_typed_error() {
    let Some((tls_url, _)) = tls_settings() else {
        return;
    };
    let err = PostgresLedger::builder()
        .url(&tls_url)
        .tls_ca_file(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/tls/untrusted-ca.pem"
        ))
        .build()
        .await
        .expect_err("the server's CA is not in the file");
    assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
    assert_eq!(
        err.to_string(),
        "ledger unavailable: cannot connect: the server's TLS certificate is not trusted (see \
         the TLS certificates the ledger was given)"
    );
    // The driver's error stays reachable, down to rustls's reason.
    let mut chain = Vec::new();
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(source) = next {
        chain.push(source.to_string());
        next = source.source();
    }
    assert!(
        chain.iter().any(|s| s.contains("invalid peer certificate")),
        "{chain:?}"
    );

    // Asking for TLS in the URL without giving the ledger any is refused before connecting.
    let err = PostgresLedger::connect(&tls_url)
        .await
        .expect_err("no TLS setting");
    assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_64_keys_at_once_all_land_and_32_claims_of_one_key_have_one_winner() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::builder()
        .url(&url)
        .pool_size(8)
        .build()
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (ledger, barrier) = (ledger.clone(), barrier.clone());
        claims.spawn(async move {
            barrier.wait().await;
            ledger.claim(&claim_of(&format!("k{i}"), "run-a")).await
        });
    }
    let mut new = 0;
    while let Some(claimed) = claims.join_next().await {
        match claimed.expect("task").expect("claimed") {
            idempotent_retry::ledger::Claimed::New(record) => {
                assert_eq!(record.status, OperationStatus::InFlight);
                new += 1;
            }
            other => panic!("a key of its own was found taken: {other:?}"),
        }
    }
    assert_eq!(new, 64);
    for i in 0..64 {
        let row = ledger.get(&format!("k{i}")).await.expect("read");
        assert!(row.is_some(), "k{i} landed");
    }

    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(32));
    let mut claims = tokio::task::JoinSet::new();
    for i in 0..32 {
        let (ledger, barrier) = (ledger.clone(), barrier.clone());
        claims.spawn(async move {
            barrier.wait().await;
            ledger
                .claim(&claim_of("contended", &format!("run-{i}")))
                .await
        });
    }
    let mut winners = Vec::new();
    let mut existing = 0;
    while let Some(claimed) = claims.join_next().await {
        match claimed.expect("task").expect("claimed") {
            idempotent_retry::ledger::Claimed::New(record) => winners.push(record.lease_owner),
            idempotent_retry::ledger::Claimed::Existing(_) => existing += 1,
            other => panic!("a live lease was taken over: {other:?}"),
        }
    }
    assert_eq!((winners.len(), existing), (1, 31), "{winners:?}");
    let row = ledger.get("contended").await.expect("read").expect("row");
    assert_eq!(row.lease_owner, winners[0], "the row is the winner's");
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_on_one_key_s_lock_holds_up_no_other_key() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::builder()
        .url(&url)
        .pool_size(4)
        .build()
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    // Another session inserts the key and holds its transaction open: a claim of that key
    // must wait for it to end, as a racing worker's insert would.
    let mut outside = inspector(&url).await;
    let tx = outside.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts, \
         first_attempt_at, expires_at) VALUES ('held', '', 'fp', 'unknown', 1, 0, 0)",
        &[],
    )
    .await
    .expect("insert, uncommitted");
    let waiting = {
        let ledger = ledger.clone();
        tokio::spawn(async move { ledger.claim(&claim_of("held", "run-a")).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let others = async {
        for i in 0..16 {
            let claimed = ledger
                .claim(&claim_of(&format!("free{i}"), "run-a"))
                .await
                .expect("claimed");
            assert!(matches!(claimed, idempotent_retry::ledger::Claimed::New(_)));
        }
    };
    tokio::time::timeout(Duration::from_secs(20), others)
        .await
        .expect("the other keys are claimed while one key waits");
    assert!(
        !waiting.is_finished(),
        "the held key's claim waits for the lock"
    );
    tx.rollback().await.expect("rollback");
    let claimed = waiting
        .await
        .expect("task")
        .expect("claimed once the lock is gone");
    assert!(
        matches!(claimed, idempotent_retry::ledger::Claimed::New(_)),
        "{claimed:?}"
    );
}

/// The server processes of the sessions named `app`, sorted.
async fn session_pids(admin: &tokio_postgres::Client, app: &str) -> Vec<i32> {
    let mut pids: Vec<i32> = admin
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .expect("sessions")
        .iter()
        .map(|row| row.get(0))
        .collect();
    pids.sort_unstable();
    pids
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_fails_at_most_the_call_that_notices_and_is_replaced() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let app = format!(
        "kill_{}",
        IdempotencyKey::random().as_str().replace('-', "")
    );
    let ledger = PostgresLedger::builder()
        .url(&format!("{url}?application_name={app}"))
        .pool_size(2)
        .build()
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    ledger.get("warm").await.expect("read");
    let admin = inspector(&base).await;
    let before = session_pids(&admin, &app).await;
    assert!(!before.is_empty());
    assert_eq!(
        terminate(&admin, &app).await,
        i64::try_from(before.len()).expect("few")
    );

    // The pool hands out no connection it knows closed; one whose end it has not heard of yet
    // fails the one call that uses it, as unavailable.
    let mut failures = 0;
    for i in 0..4 {
        match ledger.claim(&claim_of(&format!("after{i}"), "run-a")).await {
            Ok(claimed) => assert!(matches!(claimed, idempotent_retry::ledger::Claimed::New(_))),
            Err(err) => {
                assert_eq!(err.kind(), LedgerErrorKind::Unavailable, "{err}");
                failures += 1;
            }
        }
    }
    assert!(
        failures <= 2,
        "{failures} calls failed, one per killed connection at most"
    );
    let after = session_pids(&admin, &app).await;
    assert!(!after.is_empty(), "a new connection serves the ledger");
    assert!(
        after.iter().all(|pid| !before.contains(pid)),
        "{before:?} were killed, {after:?} serve"
    );
    assert!(ledger.get("after3").await.expect("read").is_some());
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_serves_16_operations_at_once_in_turn() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let ledger = PostgresLedger::builder()
        .url(&url)
        .pool_size(1)
        .build()
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    let server = TestServer::start(vec![], Action::ok("charged")).await;
    let client = Client::builder()
        .ledger(ledger.clone())
        .build()
        .expect("client");
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (client, url) = (client.clone(), server.url("/charges"));
        sends.spawn(async move {
            let key = IdempotencyKey::derive("tests.pg", &["one", &i.to_string()]);
            let response = client
                .post(url)
                .idempotency_key(key.clone())
                .body("charge")
                .send()
                .await?;
            Ok::<_, idempotent_retry::Error>((key, response.text().await.unwrap_or_default()))
        });
    }
    let all = async {
        let mut done = Vec::new();
        while let Some(sent) = sends.join_next().await {
            done.push(sent.expect("task").expect("sent"));
        }
        done
    };
    let done = tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("16 operations on one connection finish: they queue, never deadlock");
    assert_eq!(done.len(), 16);
    for (key, body) in done {
        assert_eq!(body, "charged");
        let row = ledger.get(key.as_str()).await.expect("read").expect("row");
        assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 1));
    }
    assert_eq!(server.effects(), 16);
    let status = ledger.pool().status();
    assert_eq!((status.max_size, status.size), (1, 1));
}

/// The server processes serving `app`'s connections, stopped (SIGSTOP) until dropped: to the
/// ledger, a database frozen by a failover, a partition or a full disk. Only those backends,
/// so the other tests' connections carry on.
struct Frozen(Vec<i32>);

impl Frozen {
    async fn sessions_of(admin: &tokio_postgres::Client, app: &str) -> Frozen {
        let pids = session_pids(admin, app).await;
        assert!(!pids.is_empty(), "{app} has a connection to freeze");
        signal(&pids, "-STOP");
        Frozen(pids)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.0, "-CONT");
    }
}

fn signal(pids: &[i32], which: &str) {
    let status = std::process::Command::new("kill")
        .arg(which)
        .args(pids.iter().map(ToString::to_string))
        .status()
        .expect("run kill");
    assert!(
        status.success(),
        "kill {which} {pids:?} failed: the tests must run as the server's user or root"
    );
}

/// One worker with a pool of one connection under `app`, a short call timeout and a short
/// lease, so that a frozen connection freezes every ledger call and a dead run's row is taken
/// over soon after.
async fn frozen_worker(url: &str, app: &str) -> (Client, PostgresLedger) {
    let ledger = PostgresLedger::builder()
        .url(&format!("{url}?application_name={app}"))
        .pool_size(1)
        .build()
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    let client = Client::builder()
        .policy(
            RetryPolicy::default()
                .with_max_attempts(3)
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(2))
                .with_attempt_timeout(Duration::from_secs(1)),
        )
        .ledger(ledger.clone())
        .ledger_options(
            LedgerOptions::new()
                .call_timeout(Duration::from_millis(500))
                .lease(Duration::from_millis(1100))
                .on_lease_held(LeaseHeldPolicy::Fail),
        )
        .build()
        .expect("client");
    (client, ledger)
}

/// Sends until the row's lease has lapsed and the run takes it over, within a bound.
async fn send_until_taken_over(
    client: &Client,
    url: &str,
    key: &IdempotencyKey,
) -> reqwest::Response {
    for _ in 0..100 {
        match client
            .post(url)
            .idempotency_key(key.clone())
            .body("charge")
            .send()
            .await
        {
            Ok(response) => return response,
            Err(err) if err.kind() == ErrorKind::LeaseHeld => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => panic!("after the thaw: {err}"),
        }
    }
    panic!("the lease on {key} never lapsed");
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_database_bounds_every_stage_and_the_thaw_needs_no_restart() {
    use idempotent_retry_testkit::{Receiver, Reply};
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let (admin, connection) = tokio_postgres::connect(&base, NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let admin = std::sync::Arc::new(admin);
    let app = format!(
        "frozen_{}",
        IdempotencyKey::random().as_str().replace('-', "")
    );
    let (client, ledger) = frozen_worker(&url, &app).await;
    // The first delivery of `record_key` freezes the ledger's connection and answers 503 (the
    // retry's record meets the frozen database); the first of `finish_key` freezes it and
    // charges (the finish does).
    let record_key = IdempotencyKey::derive("tests.pg.frozen", &["record"]);
    let finish_key = IdempotencyKey::derive("tests.pg.frozen", &["finish"]);
    let freezer = std::sync::Arc::new(tokio::sync::Mutex::new(None::<Frozen>));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let receiver = {
        let (admin, app, freezer) = (admin.clone(), app.clone(), freezer.clone());
        let (record, finish) = (record_key.to_string(), finish_key.to_string());
        Receiver::builder()
            .handler(move |delivery| {
                let (admin, app, freezer) = (admin.clone(), app.clone(), freezer.clone());
                let key = delivery.key().unwrap_or_default().to_owned();
                let first = seen.lock().unwrap().insert(key.clone());
                let (record, finish) = (key == record, key == finish);
                async move {
                    if first && (record || finish) {
                        *freezer.lock().await = Some(Frozen::sessions_of(&admin, &app).await);
                        if record {
                            return Reply::status(503).release_key();
                        }
                    }
                    delivery.record_effect();
                    Reply::ok("charged")
                }
            })
            .start()
            .await
            .expect("receiver")
    };
    let charges = receiver.url("/charges");
    let bound = Duration::from_secs(30);

    // Warm: the pool's one connection is open, and delivery 1 is spent.
    client
        .post(&charges)
        .idempotency_key(IdempotencyKey::derive("tests.pg.frozen", &["warm"]))
        .body("charge")
        .send()
        .await
        .expect("healthy");

    // 1. The claim: frozen before it. Nothing sent, not executed.
    let frozen = Frozen::sessions_of(&admin, &app).await;
    let claim_key = IdempotencyKey::derive("tests.pg.frozen", &["claim"]);
    let err = tokio::time::timeout(
        bound,
        client
            .post(&charges)
            .idempotency_key(claim_key.clone())
            .body("charge")
            .send(),
    )
    .await
    .expect("the claim is bounded")
    .expect_err("the ledger is frozen");
    assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
    assert!(!err.is_outcome_unknown(), "{err}");
    assert!(
        err.to_string().contains("did not answer within 500ms"),
        "{err}"
    );
    assert_eq!(receiver.arrivals(), 1, "nothing was sent");
    drop(frozen);
    // The thaw: the same client sends it, no restart.
    let answer = send_until_taken_over(&client, &charges, &claim_key).await;
    assert_eq!(answer.status(), 200);

    // 2. The record before a retry: the first delivery freezes the database and answers 503.
    let err = tokio::time::timeout(
        bound,
        client
            .post(&charges)
            .idempotency_key(record_key.clone())
            .body("charge")
            .send(),
    )
    .await
    .expect("the record is bounded")
    .expect_err("the retry's record meets the frozen database");
    assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
    assert!(err.is_outcome_unknown(), "a 503 may have run: {err}");
    drop(freezer.lock().await.take());
    let answer = send_until_taken_over(&client, &charges, &record_key).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(receiver.effects_for(record_key.as_str()), 1);

    // 3. The finish after the answer: the first delivery freezes the database and charges.
    let response = tokio::time::timeout(
        bound,
        client
            .post(&charges)
            .idempotency_key(finish_key.clone())
            .body("charge")
            .send(),
    )
    .await
    .expect("the finish is bounded")
    .expect("the answer in hand is returned, though the finish met the frozen database");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    assert!(
        report
            .unrecorded()
            .is_some_and(|why| why.contains("did not answer within 500ms")),
        "{report:?}"
    );
    drop(freezer.lock().await.take());
    // The next run takes the row over once its lease lapses and gets the receiver's replay.
    let answer = send_until_taken_over(&client, &charges, &finish_key).await;
    assert_eq!(answer.status(), 200);
    assert_eq!(receiver.effects_for(finish_key.as_str()), 1, "charged once");
    let row = ledger
        .get(finish_key.as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
}
