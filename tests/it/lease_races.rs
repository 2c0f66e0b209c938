//! Eight runs racing for one key through a durable ledger, each its own client (a worker), with
//! a 3 s attempt timeout and a handler slower than a third of the lease, so the winner renews
//! its lease while its answer is on the way and the others wait for it under the default
//! `LeaseHeldPolicy::WAIT`. Every racer gets the answer; one request reaches the receiver.
//! Run under CPU load, this is the race where a fixed lease used to lapse under a live run.

use std::sync::Arc;
use std::time::Duration;

use idempotent_retry::ledger::{Ledger, LedgerOptions, PostgresLedger, SqliteLedger};
use idempotent_retry::{Client, IdempotencyKey, RetryPolicy, RetryReport};

use crate::support::*;

const RACERS: usize = 8;
/// Short enough that the winner renews several times while its request is answered.
const LEASE: Duration = Duration::from_millis(1500);
/// The handler's time: past the lease, inside the attempt timeout.
const HANDLER: Duration = Duration::from_millis(2000);

fn worker(ledger: impl Ledger, name: usize) -> Client {
    Client::builder()
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5))
                .with_attempt_timeout(Duration::from_secs(3)),
        )
        .ledger(ledger)
        .ledger_options(LedgerOptions::new().worker(format!("w{name}")).lease(LEASE))
        .build()
        .expect("valid policy")
}

/// Races `workers` for one key; asserts every racer got the answer and one request was sent.
async fn race(workers: Vec<Client>, name: &str) {
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(HANDLER, Action::ok("charged"))],
        Action::ok("charged"),
    )
    .await;
    let key = IdempotencyKey::derive("tests.lease_races", &[name]);
    let barrier = Arc::new(tokio::sync::Barrier::new(workers.len()));
    let mut tasks = tokio::task::JoinSet::new();
    for client in workers {
        let (barrier, key, url) = (barrier.clone(), key.clone(), server.url("/charges"));
        tasks.spawn(async move {
            barrier.wait().await;
            let response = client
                .post(url)
                .idempotency_key(key)
                .body("charge")
                .send()
                .await?;
            let report = RetryReport::of(&response).expect("report").clone();
            let body = response.text().await.expect("body");
            Ok::<_, idempotent_retry::Error>((report, body))
        });
    }
    let (mut sent, mut replayed) = (0, 0);
    while let Some(result) = tasks.join_next().await {
        let (report, body) = result
            .expect("task")
            .unwrap_or_else(|err| panic!("every racer gets the answer: {err}"));
        assert_eq!(body, "charged");
        assert_eq!(report.unrecorded(), None, "{report:?}");
        if report.is_replayed() {
            replayed += 1;
        } else {
            sent += 1;
        }
    }
    assert_eq!((sent, replayed), (1, RACERS - 1));
    assert_eq!(server.hits(), 1, "exactly one racer sent");
    assert_eq!(server.effects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_racers_on_sqlite_wait_for_the_live_winner_and_replay_its_answer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let mut workers = Vec::new();
    for i in 0..RACERS {
        let ledger = SqliteLedger::open(&path).await.expect("open");
        workers.push(worker(ledger, i));
    }
    race(workers, "sqlite").await;
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_racers_on_postgres_wait_for_the_live_winner_and_replay_its_answer() {
    let Some(base) = postgres_server_url() else {
        return;
    };
    let url = postgres_database_on(&base).await;
    let mut workers = Vec::new();
    for i in 0..RACERS {
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        workers.push(worker(ledger, i));
    }
    race(workers, "postgres").await;
}
