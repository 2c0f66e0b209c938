//! A take of queued rows alone (`DueQuery::queued_only`) leaves the rare due rows (a row in
//! flight under a lapsed lease) to a take of every kind, in both SQL ledgers: a dispatcher's
//! most frequent read skips them, and its read of every kind still finds them.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::sync::Arc;
use std::time::Duration;

use idempotent_retry::IdempotencyKey;
use idempotent_retry::ledger::outbox::{DueQuery, TakeDue};
use idempotent_retry::ledger::{Ledger, OperationStatus, PostgresLedger, SqliteLedger};
use idempotent_retry::outbox::postgres::tokio_postgres::{self, NoTls};
use idempotent_retry::outbox::sqlite::rusqlite::Connection;
use idempotent_retry::outbox::{self, Enqueue};
use idempotent_retry::time::{Clock as _, TokioClock};

use crate::support::*;

fn key(order: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.queued_only", &[order])
}

fn charge(order: &str) -> Enqueue {
    Enqueue::post("http://127.0.0.1:9/v1/charges")
        .key(key(order))
        .json(&serde_json::json!({"order": order}))
        .scope("shop.charge")
}

/// A take of at most `limit` rows. SQLite compares on the query's present; PostgreSQL on the
/// database's, the query's giving only the lengths.
fn take(queued_only: bool, limit: u32, (owner, lease): (&str, Duration)) -> TakeDue {
    let now = TokioClock::new().wall();
    TakeDue::new(
        DueQuery::new(now, limit).queued_only(queued_only),
        owner,
        lease,
    )
}

/// The keys a take took, with the status each had before.
async fn took(ledger: &dyn Ledger, take: &TakeDue) -> Vec<(String, OperationStatus)> {
    let mut keys: Vec<_> = ledger
        .take_due(take)
        .await
        .expect("taken")
        .into_iter()
        .map(|taken| (taken.operation.key, taken.previous))
        .collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    keys
}

/// `first` taken by a dispatcher that died (a lease that has lapsed), `second` still queued:
/// a take of queued rows alone gets `second` only, a take of every kind then gets `first`.
async fn leaves_the_lapsed_row_to_a_full_take(ledger: Arc<dyn Ledger>) {
    let (first, second) = (key("a"), key("b"));
    let dead = took(&*ledger, &take(false, 1, ("dead", Duration::ZERO))).await;
    assert_eq!(dead, [(first.as_str().to_owned(), OperationStatus::Queued)]);
    // The lease ends the moment it is set: a few milliseconds on, it has lapsed.
    tokio::time::sleep(Duration::from_millis(5)).await;

    let live = ("next", Duration::from_secs(60));
    let queued = took(&*ledger, &take(true, 10, live)).await;
    assert_eq!(
        queued,
        [(second.as_str().to_owned(), OperationStatus::Queued)]
    );
    let rare = took(&*ledger, &take(false, 10, live)).await;
    assert_eq!(
        rare,
        [(first.as_str().to_owned(), OperationStatus::InFlight)]
    );
}

#[tokio::test]
async fn sqlite_leaves_a_lapsed_lease_to_a_full_take() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let conn = Connection::open(&path).expect("the caller's connection");
    // Queued a few milliseconds apart: `a` is the older, taken first.
    outbox::sqlite::enqueue(&conn, &charge("a")).expect("queued");
    tokio::time::sleep(Duration::from_millis(5)).await;
    outbox::sqlite::enqueue(&conn, &charge("b")).expect("queued");
    leaves_the_lapsed_row_to_a_full_take(Arc::new(ledger)).await;
}

#[tokio::test]
async fn postgres_leaves_a_lapsed_lease_to_a_full_take() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    let (conn, connection) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("the caller's connection");
    tokio::spawn(connection);
    outbox::postgres::enqueue(&conn, &charge("a"))
        .await
        .expect("queued");
    tokio::time::sleep(Duration::from_millis(5)).await;
    outbox::postgres::enqueue(&conn, &charge("b"))
        .await
        .expect("queued");
    leaves_the_lapsed_row_to_a_full_take(Arc::new(ledger)).await;
}
