//! An order and its charge committed together (the outbox), a crash between the commit and the
//! send, and the next start delivering the charge once.
//!
//! Run it with `cargo run --example outbox_orders --features sqlite`: no setup. It starts the
//! crate's idempotent test receiver on 127.0.0.1 as the payment API, and an SQLite file in a
//! temporary folder holding both the shop's `orders` table and the operation ledger.
//!
//! 1. The shop (a child process) places order `ord_1`: the order row and its charge, queued
//!    with `outbox::sqlite::enqueue`, in one transaction, committed. It then crashes
//!    (`abort`) before anything sends the charge: without an outbox, the charge is lost.
//! 2. It also places `ord_2`, whose transaction rolls back: neither the order nor its charge
//!    exists.
//! 3. The next start runs a `Dispatcher`: it finds `ord_1`'s charge due and sends it under the
//!    key stored with it; the first attempt's answer is lost (the connection is reset after
//!    the charge commits), the retry is answered from the receiver's store. One charge.
//!
//! It exits with status 1 unless exactly one charge was made, under one key, and the shop's
//! own SQL (`idempotent_outbox`) says it is done.

use std::error::Error as StdError;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use idempotent_retry::ledger::SqliteLedger;
use idempotent_retry::outbox::sqlite::rusqlite::{Connection, params};
use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};
use serde_json::json;

const SHOP: &str = "--shop";

fn charge_key(order: &str) -> IdempotencyKey {
    IdempotencyKey::derive("shop.charge", &[order])
}

/// The shop: one transaction per order, its row and its charge together.
fn place(db: &Path, url: &str, order: &str, commit: bool) -> Result<(), Box<dyn StdError>> {
    let mut conn = Connection::open(db)?;
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO orders (id, amount_cents) VALUES (?1, 1200)",
        params![order],
    )?;
    let charge = Enqueue::post(url)
        .key(charge_key(order))
        .json(&json!({"order": order, "amount": 1200, "currency": "eur"}))
        .scope("shop.charge");
    let (key, _) = outbox::sqlite::enqueue(&tx, &charge)?;
    if commit {
        tx.commit()?;
        println!("shop: {order} committed with its charge queued under key {key}");
    } else {
        tx.rollback()?;
        println!("shop: {order} rolled back (the card form was invalid): no order, no charge");
    }
    Ok(())
}

/// A row of the view: key, status, outcome.
type OutboxRow = (String, String, String);

fn outbox_rows(db: &Path) -> Result<Vec<OutboxRow>, Box<dyn StdError>> {
    let conn = Connection::open(db)?;
    let mut statement =
        conn.prepare("SELECT key, status, outcome FROM idempotent_outbox ORDER BY key")?;
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(rows)
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn StdError>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, db, url] = args.as_slice()
        && flag == SHOP
    {
        place(Path::new(db), url, "ord_1", true)?;
        place(Path::new(db), url, "ord_2", false)?;
        println!("shop: crashing before anything sends the charge");
        std::process::abort();
    }

    let dir = tempfile::tempdir()?;
    let db = dir.path().join("shop.sqlite3");
    // The ledger's table (SqliteLedger::open migrates the file), then the shop's own.
    let ledger = SqliteLedger::open(&db).await?;
    Connection::open(&db)?.execute_batch(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL)",
    )?;
    let receiver = Receiver::builder().scope("shop.charge").start().await?;
    let url = receiver.url("/v1/charges");
    // The first attempt charges the card, then its answer is lost.
    receiver.inject(
        When::key_attempt(charge_key("ord_1"), 1),
        Fault::ResetAfterCommit,
    );

    let shop = std::process::Command::new(std::env::current_exe()?)
        .args([SHOP, &db.to_string_lossy(), &url])
        .status()?;
    println!(
        "shop: exited ({shop}); nothing was sent: {} requests at the payment API",
        receiver.arrivals()
    );
    for (key, status, outcome) in outbox_rows(&db)? {
        println!("outbox after the crash: {key} {status} ({outcome})");
    }

    println!("next start: a dispatcher sends what is due");
    let client = Client::builder()
        .http(testkit::loopback_http()?)
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(50))
                .with_attempt_timeout(Duration::from_secs(2)),
        )
        .ledger(ledger)
        .build()?;
    let dispatcher = Dispatcher::new(client)?.on_outcome(|delivery| {
        println!(
            "dispatcher: {} -> {:?}{}",
            delivery.key,
            delivery.outcome,
            delivery
                .error
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        );
    });
    let pass = dispatcher.dispatch_due().await?;
    let again = dispatcher.dispatch_due().await?;
    println!("first pass: {pass:?}; second pass: {again:?}");
    for arrival in receiver.log() {
        println!(
            "payment API: attempt {} with key {} -> {:?}{}",
            arrival.key_attempt,
            arrival.key.as_deref().unwrap_or("none"),
            arrival.outcome,
            arrival
                .answer_fault
                .as_deref()
                .map(|f| format!(", answer {f}"))
                .unwrap_or_default()
        );
    }
    let rows = outbox_rows(&db)?;
    for (key, status, outcome) in &rows {
        println!("outbox now: {key} {status} ({outcome})");
    }
    let key = charge_key("ord_1");
    let keys = receiver.keys();
    let ok = receiver.effects() == 1
        && receiver.effects_for(key.as_str()) == 1
        && keys.iter().all(|k| k.as_deref() == Some(key.as_str()))
        && rows == vec![(key.to_string(), "succeeded".into(), "done".into())]
        && again.due == 0;
    if ok {
        println!("ok: one charge for the committed order, none for the rolled-back one");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("FAILED: {} charges, keys {keys:?}", receiver.effects());
        Ok(ExitCode::FAILURE)
    }
}
