//! A dispatcher reads ahead: while its slots are busy it holds the next rows under its lease,
//! so a slot that frees is filled at once. A row taken ahead is sent once, and one that is not
//! started (the dispatcher stopping, its pass dropped, a wait of a third of its lease) is given
//! back as it was: queued, no lease, no attempt counted.
#![cfg(feature = "sqlite")]

use std::path::Path;
use std::time::Duration;

use idempotent_retry::ledger::{Ledger as _, LedgerOptions, OperationStatus, SqliteLedger};
use idempotent_retry::outbox::sqlite::rusqlite::Connection;
use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
use idempotent_retry::{Client, IdempotencyKey};
use serde_json::json;

use crate::support::{Held, held_receiver};

/// Bound on every wait for something outside the test's own task.
const BOUND: Duration = Duration::from_secs(10);

/// Two charges queued and committed; their keys in queue order.
async fn two_queued(path: &Path, url: &str) -> (SqliteLedger, [IdempotencyKey; 2]) {
    let ledger = SqliteLedger::open(path).await.expect("open the ledger");
    let mut conn = Connection::open(path).expect("the caller's connection");
    let tx = conn.transaction().expect("begin");
    let mut keys = Vec::new();
    for order in ["ord_1", "ord_2"] {
        let charge = Enqueue::post(url)
            .key(IdempotencyKey::derive("tests.read_ahead", &[order]))
            .json(&json!({"order": order, "amount": 1200}))
            .scope("shop.charge");
        keys.push(outbox::sqlite::enqueue(&tx, &charge).expect("queued").0);
    }
    tx.commit().expect("commit");
    (ledger, keys.try_into().expect("two keys"))
}

fn one_at_a_time(ledger: &SqliteLedger, lease: Duration) -> Dispatcher {
    let client = Client::builder()
        .policy(crate::support::fast().with_max_attempts(2))
        .ledger(ledger.clone())
        .ledger_options(LedgerOptions::new().worker("read-ahead").lease(lease))
        .build()
        .expect("valid policy");
    Dispatcher::new(client).expect("a ledger").concurrency(1)
}

async fn status(ledger: &SqliteLedger, key: &IdempotencyKey) -> (OperationStatus, u32, bool) {
    let row = ledger
        .get(key.as_str())
        .await
        .expect("read")
        .expect("a row");
    (row.status, row.attempts, row.lease_owner.is_some())
}

/// Waits (bounded) until `key`'s row has `wanted` status.
async fn until_status(ledger: &SqliteLedger, key: &IdempotencyKey, wanted: OperationStatus) {
    tokio::time::timeout(BOUND, async {
        while status(ledger, key).await.0 != wanted {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} never became {wanted:?}", key.as_str()));
}

/// Two charges queued in a ledger of their own, a receiver that holds each request (at least
/// `hold`, then until the test lets it through) and a dispatcher of one slot under `lease`.
struct Shop {
    _dir: tempfile::TempDir,
    held: Held,
    ledger: SqliteLedger,
    keys: [IdempotencyKey; 2],
    dispatcher: Dispatcher,
}

async fn shop(hold: Duration, lease: Duration) -> Shop {
    let dir = tempfile::tempdir().expect("temp dir");
    let held = held_receiver(hold, 201).await;
    let (ledger, keys) = two_queued(
        &dir.path().join("shop.db"),
        &held.receiver.url("/v1/charges"),
    )
    .await;
    let dispatcher = one_at_a_time(&ledger, lease);
    Shop {
        _dir: dir,
        held,
        ledger,
        keys,
        dispatcher,
    }
}

impl Shop {
    /// Waits for the first send to reach the receiver: the index of its key, and the other
    /// key, the one taken ahead.
    async fn first_send(&self) -> (usize, &IdempotencyKey) {
        self.held.arrived().await;
        let first = self
            .held
            .receiver
            .keys()
            .into_iter()
            .flatten()
            .next()
            .expect("a keyed request");
        let sending = self
            .keys
            .iter()
            .position(|k| k.as_str() == first)
            .expect("one of ours");
        (sending, &self.keys[1 - sending])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_row_is_taken_while_one_is_sent_and_each_is_sent_once() {
    let shop = shop(Duration::ZERO, Duration::from_secs(30)).await;
    let Shop {
        held,
        ledger,
        keys,
        dispatcher,
        ..
    } = &shop;
    let pass = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move { dispatcher.dispatch_due().await }
    });

    let (_, ahead) = shop.first_send().await;
    // One slot, one send at the receiver; the other row is already this dispatcher's.
    assert_eq!(held.receiver.arrivals(), 1);
    assert_eq!(
        status(ledger, ahead).await,
        (OperationStatus::InFlight, 0, true)
    );

    held.gate.add_permits(2);
    let pass = tokio::time::timeout(BOUND, pass)
        .await
        .expect("the pass ends")
        .expect("joined")
        .expect("a pass");
    assert_eq!((pass.due, pass.done), (2, 2), "{pass:?}");
    for key in keys {
        assert_eq!(held.receiver.effects_for(key.as_str()), 1);
        assert_eq!(
            status(ledger, key).await,
            (OperationStatus::Succeeded, 1, false)
        );
    }
    assert_eq!(held.receiver.arrivals(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_gives_back_the_rows_taken_ahead_as_they_were() {
    let shop = shop(Duration::ZERO, Duration::from_secs(30)).await;
    let Shop {
        held,
        ledger,
        keys,
        dispatcher,
        ..
    } = &shop;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move {
            dispatcher
                .run_until(async move {
                    let _ = stopped.await;
                })
                .await
        }
    });

    let (sending, ahead) = shop.first_send().await;
    until_status(ledger, ahead, OperationStatus::InFlight).await;
    stop.send(()).expect("running");
    // Given back while the send in progress is still held at the receiver.
    until_status(ledger, ahead, OperationStatus::Queued).await;
    assert_eq!(
        status(ledger, ahead).await,
        (OperationStatus::Queued, 0, false)
    );

    held.gate.add_permits(1);
    tokio::time::timeout(BOUND, run)
        .await
        .expect("the dispatcher stops")
        .expect("joined")
        .expect("stopped cleanly");
    assert_eq!(held.receiver.arrivals(), 1);
    assert_eq!(
        status(ledger, &keys[sending]).await,
        (OperationStatus::Succeeded, 1, false)
    );

    // The next dispatcher sends the row given back, as a first attempt.
    held.gate.add_permits(1);
    let pass = dispatcher.dispatch_due().await.expect("a pass");
    assert_eq!((pass.due, pass.done), (1, 1), "{pass:?}");
    assert_eq!(held.receiver.effects_for(ahead.as_str()), 1);
    assert_eq!(
        status(ledger, ahead).await,
        (OperationStatus::Succeeded, 1, false)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_dropped_half_way_gives_back_the_rows_taken_ahead() {
    let shop = shop(Duration::ZERO, Duration::from_secs(30)).await;
    let Shop {
        held,
        ledger,
        dispatcher,
        ..
    } = &shop;
    let pass = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move { dispatcher.dispatch_due().await }
    });

    let (_, ahead) = shop.first_send().await;
    until_status(ledger, ahead, OperationStatus::InFlight).await;
    pass.abort();
    let _ = pass.await;

    // The row taken ahead is queued again, untouched; the abandoned send is left for a resend
    // under its key (its request reached the receiver).
    until_status(ledger, ahead, OperationStatus::Queued).await;
    assert_eq!(
        status(ledger, ahead).await,
        (OperationStatus::Queued, 0, false)
    );
    assert_eq!(held.receiver.arrivals(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_that_waited_a_third_of_its_lease_is_given_back_and_sent_by_a_later_take() {
    // The first send is held past a third of the lease: 400 ms of 900.
    let shop = shop(Duration::from_millis(400), Duration::from_millis(900)).await;
    let Shop {
        held,
        ledger,
        keys,
        dispatcher,
        ..
    } = &shop;
    held.gate.add_permits(2);
    let pass = tokio::time::timeout(BOUND, dispatcher.dispatch_due())
        .await
        .expect("the pass ends")
        .expect("a pass");

    // Sent once each, the one taken ahead as a first attempt of a later take: no attempt of a
    // dead run counted, as a row left to a lapsed lease would have had.
    assert_eq!((pass.due, pass.done), (2, 2), "{pass:?}");
    for key in keys {
        assert_eq!(held.receiver.effects_for(key.as_str()), 1);
        assert_eq!(
            status(ledger, key).await,
            (OperationStatus::Succeeded, 1, false)
        );
    }
    assert_eq!(held.receiver.arrivals(), 2);
}
