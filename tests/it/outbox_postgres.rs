//! The outbox in PostgreSQL: an operation queued in the caller's transaction (tokio-postgres
//! and deadpool's), delivered once after the commit and never after a rollback, a dispatcher
//! woken by `LISTEN/NOTIFY` without polling, and dispatchers racing for one queue.
#![cfg(feature = "postgres")]

use std::time::Duration;

use idempotent_retry::ledger::{Ledger as _, LedgerOptions, OperationStatus, PostgresLedger};
use idempotent_retry::outbox::postgres::tokio_postgres::{self, NoTls};
use idempotent_retry::outbox::{self, Dispatcher, Enqueue, Enqueued};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey};
use idempotent_retry_testkit::Receiver;

use crate::support::*;

async fn ledger(url: &str) -> PostgresLedger {
    let ledger = PostgresLedger::connect(url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    ledger
}

fn client(ledger: &PostgresLedger, worker: &str) -> Client {
    Client::builder()
        .policy(fast())
        .ledger(ledger.clone())
        .ledger_options(LedgerOptions::new().worker(worker))
        .build()
        .expect("valid policy")
}

/// The caller's own connection and table.
async fn caller(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("the caller's connection");
    tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER)")
        .await
        .expect("the caller's table");
    client
}

fn charge(url: &str, order: &str) -> Enqueue {
    Enqueue::post(url)
        .key(IdempotencyKey::derive(
            "tests.outbox.pg",
            &[order, "charge"],
        ))
        .json(&serde_json::json!({"order": order, "amount": 1200}))
        .scope("shop.charge")
}

async fn place_order(
    conn: &mut tokio_postgres::Client,
    order: &str,
    url: &str,
    commit: bool,
) -> IdempotencyKey {
    let tx = conn.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO orders (id, amount) VALUES ($1, 1200)",
        &[&order],
    )
    .await
    .expect("the order");
    let (key, found) = outbox::postgres::enqueue(&tx, &charge(url, order))
        .await
        .expect("queued");
    assert_eq!(found, Enqueued::Queued);
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    key
}

async fn outcome(conn: &tokio_postgres::Client, key: &str) -> Option<(String, String)> {
    conn.query_opt(
        "SELECT status, outcome FROM idempotent_outbox WHERE key = $1",
        &[&key],
    )
    .await
    .expect("the view")
    .map(|row| (row.get(0), row.get(1)))
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_order_is_charged_once_and_a_rolled_back_one_never() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    let mut conn = caller(&url).await;
    let receiver = Receiver::start().await.expect("receiver");
    let target = receiver.url("/v1/charges");
    let kept = place_order(&mut conn, "ord_1", &target, true).await;
    let dropped = place_order(&mut conn, "ord_2", &target, false).await;
    assert_eq!(
        outcome(&conn, kept.as_str()).await,
        Some(("queued".into(), "pending".into()))
    );
    assert_eq!(outcome(&conn, dropped.as_str()).await, None);

    let pass = Dispatcher::new(client(&ledger, "d1"))
        .expect("a ledger")
        .dispatch_due()
        .await
        .expect("a pass");
    assert_eq!((pass.due, pass.done), (1, 1), "{pass:?}");
    assert_eq!(receiver.keys(), vec![Some(kept.to_string())]);
    assert_eq!(receiver.effects(), 1);
    assert_eq!(
        outcome(&conn, kept.as_str()).await,
        Some(("succeeded".into(), "done".into()))
    );

    // The same enqueue again (a retried transaction): nothing written; another request under
    // the key: refused.
    let (_, again) = outbox::postgres::enqueue(&conn, &charge(&target, "ord_1"))
        .await
        .expect("the same request");
    assert_eq!(again, Enqueued::Already(OperationStatus::Succeeded));
    let err = outbox::postgres::enqueue(
        &conn,
        &charge(&target, "ord_1").json(&serde_json::json!({"amount": 1})),
    )
    .await
    .expect_err("another request");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(err.to_string().contains("another request"), "{err}");
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadpool_transaction_queues_too() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    drop(caller(&url).await);
    let config: tokio_postgres::Config = url.parse().expect("a URL");
    let manager = idempotent_retry_postgres::deadpool_postgres::Manager::new(config, NoTls);
    let pool = idempotent_retry_postgres::deadpool_postgres::Pool::builder(manager)
        .max_size(2)
        .build()
        .expect("a pool");
    let mut object = pool.get().await.expect("a connection");
    let tx = object.transaction().await.expect("begin");
    tx.execute("INSERT INTO orders (id, amount) VALUES ('ord_3', 1)", &[])
        .await
        .expect("the order");
    let (key, found) = outbox::postgres::enqueue(&*tx, &charge("https://a.example.com/x", "ord_3"))
        .await
        .expect("queued");
    assert_eq!(found, Enqueued::Queued);
    tx.commit().await.expect("commit");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::Queued);
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_wakes_a_listening_dispatcher_without_polling() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    let mut conn = caller(&url).await;
    let receiver = Receiver::start().await.expect("receiver");
    // An idle poll of an hour: only the notification can wake it within the test's bound.
    let dispatcher = Dispatcher::new(client(&ledger, "listener"))
        .expect("a ledger")
        .idle_poll(Duration::from_secs(3600));
    let listener = outbox::postgres::listen(&url, dispatcher.waker())
        .await
        .expect("LISTEN");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move {
            dispatcher
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    // The first pass finds nothing and the dispatcher goes idle.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let key = place_order(&mut conn, "ord_4", &receiver.url("/v1/charges"), true).await;
    let arrived = receiver.wait_for_arrivals(1, Duration::from_secs(30)).await;
    assert_eq!(arrived, 1, "the commit's NOTIFY woke the dispatcher");
    assert!(listener.is_listening());
    stop.send(()).expect("the dispatcher runs");
    tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .expect("it stops")
        .expect("its task")
        .expect("no ledger error");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dispatchers_on_one_queue_send_each_operation_once() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    let mut conn = caller(&url).await;
    let receiver = Receiver::start().await.expect("receiver");
    let target = receiver.url("/v1/charges");
    let mut keys = Vec::new();
    for n in 0..30 {
        keys.push(place_order(&mut conn, &format!("ord_{n:02}"), &target, true).await);
    }
    let dispatchers: Vec<_> = (0..3)
        .map(|n| {
            Dispatcher::new(client(&ledger, &format!("d{n}")))
                .expect("a ledger")
                .batch(8)
                .concurrency(4)
        })
        .collect();
    // Every dispatcher reads the same due rows at once, until none is left.
    for _ in 0..20 {
        let passes =
            futures_util::future::join_all(dispatchers.iter().map(Dispatcher::dispatch_due)).await;
        if passes
            .iter()
            .all(|pass| pass.as_ref().expect("a pass").due == 0)
        {
            break;
        }
    }
    assert_eq!(receiver.effects(), 30);
    assert_eq!(receiver.arrivals(), 30, "no operation was sent twice");
    for key in &keys {
        assert_eq!(receiver.effects_for(key.as_str()), 1);
        assert_eq!(
            outcome(&conn, key.as_str()).await,
            Some(("succeeded".into(), "done".into()))
        );
    }
}

#[cfg(feature = "sqlx-postgres")]
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqlx_transaction_queues_and_rolls_back_like_the_others() {
    use idempotent_retry::outbox::sqlx::sqlx::{self, Connection as _};
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    drop(caller(&url).await);
    let receiver = Receiver::start().await.expect("receiver");
    let target = receiver.url("/v1/charges");
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("sqlx connects");
    let mut keys = Vec::new();
    for (order, commit) in [("ord_sqlx_1", true), ("ord_sqlx_2", false)] {
        let mut tx = conn.begin().await.expect("begin");
        sqlx::query("INSERT INTO orders (id, amount) VALUES ($1, 1200)")
            .bind(order)
            .execute(&mut *tx)
            .await
            .expect("the order");
        let (key, found) = outbox::sqlx::enqueue(&mut tx, &charge(&target, order))
            .await
            .expect("queued");
        assert_eq!(found, Enqueued::Queued);
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
        keys.push(key);
    }
    // The same request again: nothing written; another request under the key: refused.
    let (_, again) = outbox::sqlx::enqueue(&mut conn, &charge(&target, "ord_sqlx_1"))
        .await
        .expect("the same request");
    assert_eq!(again, Enqueued::Already(OperationStatus::Queued));
    let err = outbox::sqlx::enqueue(
        &mut conn,
        &charge(&target, "ord_sqlx_1").json(&serde_json::json!({"amount": 1})),
    )
    .await
    .expect_err("another request");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(ledger.get(keys[1].as_str()).await.expect("read").is_none());

    let pass = Dispatcher::new(client(&ledger, "d-sqlx"))
        .expect("a ledger")
        .dispatch_due()
        .await
        .expect("a pass");
    assert_eq!((pass.due, pass.done), (1, 1), "{pass:?}");
    assert_eq!(receiver.keys(), vec![Some(keys[0].to_string())]);
}

#[tokio::test]
async fn a_database_migrated_before_the_enqueue_function_says_to_migrate() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = ledger(&url).await;
    let conn = caller(&url).await;
    // A store as version 7 left it: the table, without the enqueue function.
    conn.batch_execute(
        "DROP FUNCTION idempotent_retry_enqueue(TEXT, TEXT, TEXT, BIGINT, BIGINT, TEXT, TEXT, \
         TEXT, BYTEA); UPDATE idempotent_operations_schema SET version = 7",
    )
    .await
    .expect("back to version 7");
    let err = outbox::postgres::enqueue(&conn, &charge("https://a.example.com/x", "ord_v7"))
        .await
        .expect_err("no function");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(
        err.to_string().contains("run `PostgresLedger::migrate()`"),
        "{err}"
    );
    // Migrating again puts it back, and the enqueue goes through.
    ledger.migrate().await.expect("migrate");
    outbox::postgres::enqueue(&conn, &charge("https://a.example.com/x", "ord_v7"))
        .await
        .expect("queued");
}
