//! The PostgreSQL ledger as a fleet uses it, against a real server and real loopback
//! receivers: workers racing for one key, a connection lost mid-operation, the incident query.
//!
//! Needs `IDEMPOTENT_RETRY_PG_URL` (`.ci/run` starts a server and sets it). Without it the tests
//! are skipped, except under `CI`, where they fail.
#![cfg(feature = "postgres")]

mod support;

use std::time::Duration;

use idempotent_retry::{
    Client, ErrorKind, IdempotencyKey, InProgressPolicy, Ledger as _, LedgerOptions,
    OperationStatus, PostgresLedger, RetryPolicy, RetryReport,
};
use support::*;
use tokio_postgres::NoTls;

fn base_url() -> Option<String> {
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

/// A fresh database for one test, so tests never see each other's rows.
async fn fresh_database(base: &str) -> String {
    let (admin, connection) = tokio_postgres::connect(base, NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    let name = format!("ir_{}", IdempotencyKey::random().as_str().replace('-', ""));
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    format!("{prefix}/{name}")
}

async fn worker(url: &str, name: &str, in_progress: InProgressPolicy) -> Client {
    let ledger = PostgresLedger::connect(url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    Client::builder()
        .policy(
            RetryPolicy::default()
                .base_delay(Duration::from_millis(1))
                .max_delay(Duration::from_millis(5))
                .attempt_timeout(Duration::from_secs(5)),
        )
        .ledger(ledger)
        .ledger_options(LedgerOptions::new().worker(name).in_progress(in_progress))
        .build()
        .expect("valid policy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_eight_workers_racing_for_one_key_exactly_one_sends() {
    let Some(base) = base_url() else { return };
    let url = fresh_database(&base).await;
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
        workers.push(worker(&url, &format!("w{i}"), InProgressPolicy::Fail).await);
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
                assert_eq!(err.kind(), ErrorKind::InProgress, "{err}");
                assert_eq!(err.attempts(), 0);
                not_sent += 1;
            }
        }
    }
    assert_eq!((sent, not_sent), (1, 7));
    assert_eq!(server.hits(), 1, "exactly one worker sent");
    assert_eq!(server.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_workers_get_the_winner_s_response_without_sending() {
    let Some(base) = base_url() else { return };
    let url = fresh_database(&base).await;
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(
            Duration::from_millis(300),
            Action::ok("charged"),
        )],
        Action::ok("charged"),
    )
    .await;
    let wait = InProgressPolicy::Wait {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_lost_mid_operation_is_reopened_or_reported_never_lost() {
    let Some(base) = base_url() else { return };
    let url = fresh_database(&base).await;
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
    let ledger = PostgresLedger::connect(&format!("{url}?application_name={app}"))
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    let time = VirtualTime::new();
    let client = Client::builder()
        .policy(RetryPolicy::default().attempt_timeout(Duration::from_secs(5)))
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger.clone())
        .ledger_options(LedgerOptions::new().lease_slack(Duration::from_secs(10)))
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
    //    the attempt cannot be recorded, and the caller is told so, with the key.
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
    let mut err = sending
        .await
        .expect("task")
        .expect_err("the attempt could not be recorded");
    assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&second));
    assert!(err.take_response().is_some(), "the answer is not lost");
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
    assert_eq!(err.kind(), ErrorKind::InProgress);
    time.advance(Duration::from_secs(16));
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

#[tokio::test]
async fn the_incident_query_finds_double_charges_and_unresolved_operations() {
    let Some(base) = base_url() else { return };
    let url = fresh_database(&base).await;
    let server = TestServer::start(vec![Action::status(503)], Action::ok("charged")).await;
    let client = worker(&url, "w", InProgressPolicy::Fail).await;
    let send = |key: &str, body: &'static str, attempts: u32| {
        client
            .post(server.url("/charges"))
            .idempotency_key(IdempotencyKey::new(key).expect("key"))
            .policy(
                RetryPolicy::default()
                    .max_attempts(attempts)
                    .base_delay(Duration::from_millis(1)),
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
