//! The outbox on PostgreSQL: orders and their charges committed together in the shop's own
//! transactions, a dispatcher woken by `LISTEN/NOTIFY` the moment each one commits, and the
//! outcome read back in the shop's own SQL.
//!
//! Run it with a PostgreSQL server it may create a database on:
//! `DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres cargo run --example outbox_postgres --features postgres`
//! (`source .ci/postgres.sh && start_postgres` starts one and sets `IDEMPOTENT_RETRY_PG_URL`,
//! which it also reads). It makes a database of its own, drops it at the end, and exits with
//! status 1 unless each committed order was charged exactly once and the rolled-back one never.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use idempotent_retry::ledger::PostgresLedger;
use idempotent_retry::outbox::postgres::tokio_postgres::{self, NoTls};
use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
use idempotent_retry::{Client, IdempotencyKey};
use idempotent_retry_testkit::{self as testkit, Receiver};
use serde_json::json;
use tokio::sync::Notify;

async fn connect(url: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// `url` with its database replaced by `name`.
fn on_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let server = base.rsplit_once('/').map_or(base, |(server, _)| server);
    if query.is_empty() {
        format!("{server}/{name}")
    } else {
        format!("{server}/{name}?{query}")
    }
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn StdError>> {
    let Some(server) = std::env::var("DATABASE_URL")
        .or_else(|_| std::env::var("IDEMPOTENT_RETRY_PG_URL"))
        .ok()
    else {
        eprintln!(
            "set DATABASE_URL to a PostgreSQL server this example may create a database on \
             (source .ci/postgres.sh && start_postgres starts one)"
        );
        return Ok(ExitCode::FAILURE);
    };
    let name = format!("outbox_example_{}", std::process::id());
    let admin = connect(&server).await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let url = on_database(&server, &name);
    let result = run(&url).await;
    admin
        .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
        .await?;
    result
}

async fn run(url: &str) -> Result<ExitCode, Box<dyn StdError>> {
    // The ledger's table (migrate once, at deploy), then the shop's own.
    let ledger = PostgresLedger::connect(url).await?;
    ledger.migrate().await?;
    let mut shop = connect(url).await?;
    shop.batch_execute(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL, \
         charge_key TEXT NOT NULL)",
    )
    .await?;
    let receiver = Receiver::builder().scope("shop.charge").start().await?;
    let payments = receiver.url("/v1/charges");

    // The dispatcher, listening: each commit that queued a charge wakes it at once (its poll
    // of an hour would be far too late).
    let client = Client::builder()
        .http(testkit::loopback_http()?)
        .ledger(ledger)
        .build()?;
    let dispatcher = Dispatcher::new(client)?.idle_poll(Duration::from_secs(3600));
    let _listening = outbox::postgres::listen(url, dispatcher.waker()).await?;
    let stop = Arc::new(Notify::new());
    let running = tokio::spawn({
        let dispatcher = dispatcher.clone();
        let stop = Arc::clone(&stop);
        async move {
            dispatcher
                .run_until(async move { stop.notified().await })
                .await
        }
    });

    // The shop: three orders, each with its charge in one transaction; the second rolls back.
    for (order, commit) in [("ord_1", true), ("ord_2", false), ("ord_3", true)] {
        let key = IdempotencyKey::derive("shop.charge", &[order]);
        let tx = shop.transaction().await?;
        tx.execute(
            "INSERT INTO orders (id, amount_cents, charge_key) VALUES ($1, 1200, $2)",
            &[&order, &key.as_str()],
        )
        .await?;
        outbox::postgres::enqueue(
            &tx,
            &Enqueue::post(&payments)
                .key(key)
                .json(&json!({"order": order, "amount": 1200, "currency": "eur"}))
                .scope("shop.charge"),
        )
        .await?;
        if commit {
            tx.commit().await?;
            println!("shop: {order} committed with its charge");
        } else {
            tx.rollback().await?;
            println!("shop: {order} rolled back: no order, no charge");
        }
    }
    let arrived = receiver.wait_for_arrivals(2, Duration::from_secs(30)).await;
    println!("payment API: {arrived} charges arrived, woken by NOTIFY");
    // Give the dispatcher a moment to write both outcomes, then stop it (its sends finish).
    let mut done = 0;
    for _ in 0..300 {
        let row = shop
            .query_one(
                "SELECT count(*) FROM orders o JOIN idempotent_outbox x ON x.key = o.charge_key \
                 WHERE x.outcome = 'done'",
                &[],
            )
            .await?;
        done = row.get::<_, i64>(0);
        if done == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.notify_one();
    running.await??;
    for row in shop
        .query(
            "SELECT o.id, x.status, x.outcome, x.response_status FROM orders o \
             JOIN idempotent_outbox x ON x.key = o.charge_key ORDER BY o.id",
            &[],
        )
        .await?
    {
        let (id, status, outcome, code): (String, String, String, Option<i32>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        println!("orders + idempotent_outbox: {id} {status} {outcome} {code:?}");
    }
    let once = ["ord_1", "ord_3"].iter().all(|order| {
        receiver.effects_for(IdempotencyKey::derive("shop.charge", &[order]).as_str()) == 1
    });
    let never =
        receiver.effects_for(IdempotencyKey::derive("shop.charge", &["ord_2"]).as_str()) == 0;
    if once && never && done == 2 {
        println!("ok: each committed order charged once, the rolled-back one never");
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "FAILED: {} charges, {done} outcomes done",
            receiver.effects()
        );
        Ok(ExitCode::FAILURE)
    }
}
