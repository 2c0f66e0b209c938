//! The outbox in SQLite, against real loopback receivers and real processes: an operation
//! queued in the caller's own transaction is delivered once after its commit and never after a
//! rollback, under the key stored with it, whatever process dies where.
#![cfg(feature = "sqlite")]

use std::path::Path;
use std::time::Duration;

use idempotent_retry::ledger::{Ledger as _, LedgerOptions, OperationStatus, SqliteLedger};
use idempotent_retry::outbox::sqlite::rusqlite::{Connection, params};
use idempotent_retry::outbox::{self, DispatchPass, Dispatcher, Enqueue, Enqueued};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryPolicy};
use idempotent_retry_testkit::{Fault, Receiver, When};

fn policy() -> RetryPolicy {
    crate::support::fast().with_max_attempts(3)
}

/// The ledger's file, migrated, with the caller's own `orders` table beside it.
async fn shop(path: &Path) -> SqliteLedger {
    let ledger = SqliteLedger::open(path).await.expect("open the ledger");
    Connection::open(path)
        .expect("the caller's connection")
        .execute_batch("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER)")
        .expect("the caller's table");
    ledger
}

fn client(ledger: &SqliteLedger, worker: &str) -> Client {
    Client::builder()
        .policy(policy())
        .ledger(ledger.clone())
        .ledger_options(LedgerOptions::new().worker(worker))
        .build()
        .expect("valid policy")
}

fn charge(url: &str, order: &str) -> Enqueue {
    Enqueue::post(url)
        .key(IdempotencyKey::derive("tests.outbox", &[order, "charge"]))
        .json(&serde_json::json!({"order": order, "amount": 1200}))
        .scope("shop.charge")
}

/// The order and its charge in one transaction of the caller's, committed or rolled back.
fn place_order(path: &Path, order: &str, url: &str, commit: bool) -> IdempotencyKey {
    let mut conn = Connection::open(path).expect("the caller's connection");
    let tx = conn.transaction().expect("begin");
    tx.execute(
        "INSERT INTO orders (id, amount) VALUES (?1, 1200)",
        params![order],
    )
    .expect("the order");
    let (key, found) = outbox::sqlite::enqueue(&tx, &charge(url, order)).expect("queued");
    assert_eq!(found, Enqueued::Queued);
    if commit {
        tx.commit().expect("commit");
    } else {
        tx.rollback().expect("rollback");
    }
    key
}

/// One row of the outbox's view, as the caller reads it in SQL.
fn view_row(path: &Path, key: &str) -> Option<(String, String, Option<i64>)> {
    let conn = Connection::open(path).expect("open");
    conn.query_row(
        "SELECT status, outcome, response_status FROM idempotent_outbox WHERE key = ?1",
        params![key],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
    )
    .ok()
}

#[tokio::test]
async fn a_committed_order_is_charged_once_under_its_key_and_a_rolled_back_one_never() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let ledger = shop(&path).await;
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/v1/charges");

    let kept = place_order(&path, "ord_1", &url, true);
    let dropped = place_order(&path, "ord_2", &url, false);
    let conn = Connection::open(&path).expect("open");
    let orders: i64 = conn
        .query_row("SELECT count(*) FROM orders", [], |row| row.get(0))
        .expect("count");
    assert_eq!(orders, 1, "the rolled-back order is gone");
    assert_eq!(
        view_row(&path, kept.as_str()),
        Some(("queued".into(), "pending".into(), None))
    );
    assert_eq!(
        view_row(&path, dropped.as_str()),
        None,
        "nothing of it left"
    );
    assert_eq!(
        receiver.arrivals(),
        0,
        "nothing is sent before a dispatcher runs"
    );

    let dispatcher = Dispatcher::new(client(&ledger, "dispatcher")).expect("a ledger");
    let pass = dispatcher.dispatch_due().await.expect("a pass");
    assert_eq!((pass.due, pass.done), (1, 1), "{pass:?}");
    assert_eq!(receiver.effects(), 1);
    assert_eq!(receiver.keys(), vec![Some(kept.to_string())]);
    let arrival = &receiver.log()[0];
    assert_eq!(
        (arrival.method.as_str(), arrival.path.as_str()),
        ("POST", "/v1/charges")
    );
    assert_eq!(
        view_row(&path, kept.as_str()),
        Some(("succeeded".into(), "done".into(), Some(200)))
    );
    let row = ledger.get(kept.as_str()).await.expect("read").expect("row");
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 1));
    assert_eq!(row.scope, "shop.charge");

    let again = dispatcher.dispatch_due().await.expect("a pass");
    assert_eq!(again, DispatchPass::default(), "nothing is due twice");
    assert_eq!(receiver.arrivals(), 1);
}

#[tokio::test]
async fn a_503_then_a_reset_then_201_is_retried_under_the_stored_key_until_done() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let ledger = shop(&path).await;
    let receiver = Receiver::start().await.expect("receiver");
    let key = place_order(&path, "ord_3", &receiver.url("/v1/charges"), true);
    receiver.inject(When::key_attempt(key.clone(), 1), Fault::status(503));
    receiver.inject(When::key_attempt(key.clone(), 2), Fault::ResetAfterCommit);

    let dispatcher = Dispatcher::new(client(&ledger, "dispatcher")).expect("a ledger");
    let pass = dispatcher.dispatch_due().await.expect("a pass");
    assert_eq!(pass.done, 1, "{pass:?}");
    assert_eq!(receiver.keys(), vec![Some(key.to_string()); 3]);
    assert_eq!(
        receiver.effects(),
        1,
        "the reset came after the charge committed"
    );
    assert_eq!(view_row(&path, key.as_str()).expect("row").1, "done");
}

#[tokio::test]
async fn an_enqueue_retried_with_its_transaction_writes_nothing_twice_and_another_request_is_refused()
 {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let _ledger = shop(&path).await;
    let url = "https://api.example.com/v1/charges";
    let key = place_order(&path, "ord_4", url, true);

    let conn = Connection::open(&path).expect("open");
    let (_, found) = outbox::sqlite::enqueue(&conn, &charge(url, "ord_4")).expect("the same");
    assert_eq!(found, Enqueued::Already(OperationStatus::Queued));
    let other = charge(url, "ord_4").json(&serde_json::json!({"amount": 9999}));
    let err = outbox::sqlite::enqueue(&conn, &other).expect_err("another request");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(
        err.to_string().contains(&format!(
            "idempotency key {key} is already the ledger's for another request (status queued)"
        )),
        "{err}"
    );
}

#[tokio::test]
async fn credentials_are_refused_at_enqueue_and_added_at_send_time_never_stored() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let ledger = shop(&path).await;
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/v1/charges");
    let conn = Connection::open(&path).expect("open");
    let err = outbox::sqlite::enqueue(
        &conn,
        &charge(&url, "ord_5").header("Authorization", "Bearer sk_live_secret"),
    )
    .expect_err("a credential");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert!(err.to_string().contains("never stores"), "{err}");
    assert!(!err.to_string().contains("sk_live_secret"), "{err}");

    let key = place_order(&path, "ord_5", &url, true);
    let dispatcher = Dispatcher::new(client(&ledger, "dispatcher"))
        .expect("a ledger")
        .headers_for(|operation| {
            assert_eq!(operation.scope, "shop.charge");
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::AUTHORIZATION,
                http::HeaderValue::from_static("Bearer sk_live_secret"),
            );
            headers
        });
    assert_eq!(dispatcher.dispatch_due().await.expect("a pass").done, 1);
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    drop(ledger);
    let bytes = std::fs::read(&path).expect("the file");
    let wal = std::fs::read(path.with_extension("db-wal")).unwrap_or_default();
    for stored in [&bytes, &wal] {
        assert!(
            !stored.windows(14).any(|w| w == b"sk_live_secret"),
            "the credential reached the file"
        );
    }
}

#[tokio::test]
async fn a_delayed_operation_waits_for_its_time_on_the_dispatchers_clock() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    let ledger = shop(&path).await;
    let receiver = Receiver::start().await.expect("receiver");
    let conn = Connection::open(&path).expect("open");
    outbox::sqlite::enqueue(
        &conn,
        &charge(&receiver.url("/v1/charges"), "ord_6").delay(Duration::from_secs(3600)),
    )
    .expect("queued");
    let now = Dispatcher::new(client(&ledger, "now")).expect("a ledger");
    assert_eq!(now.dispatch_due().await.expect("a pass").due, 0);
    let later = Client::builder()
        .policy(policy())
        .ledger(ledger.clone())
        .clock(Ahead(Duration::from_secs(3601)))
        .build()
        .expect("valid policy");
    let later = Dispatcher::new(later).expect("a ledger");
    assert_eq!(later.dispatch_due().await.expect("a pass").done, 1);
    assert_eq!(receiver.effects(), 1);
}

/// The real clock, this far ahead on the wall.
#[derive(Debug)]
struct Ahead(Duration);

impl Clock for Ahead {
    fn now(&self) -> tokio::time::Instant {
        TokioClock::new().now()
    }
    fn wall(&self) -> std::time::SystemTime {
        TokioClock::new().wall() + self.0
    }
}

#[tokio::test]
async fn a_file_without_the_ledgers_table_says_to_migrate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("plain.db");
    let conn = Connection::open(&path).expect("open");
    let err = outbox::sqlite::enqueue(&conn, &charge("https://a.example.com/x", "ord_7"))
        .expect_err("no table");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(
        err.to_string().contains("run the ledger's `migrate()`"),
        "{err}"
    );
}

#[tokio::test]
async fn a_dispatcher_without_a_ledger_is_refused() {
    let err = Dispatcher::new(Client::new()).expect_err("no ledger");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert!(err.to_string().contains("ClientBuilder::ledger"), "{err}");
}

const APP_DB: &str = "IDEMPOTENT_RETRY_TEST_OUTBOX_APP_DB";
const APP_URL: &str = "IDEMPOTENT_RETRY_TEST_OUTBOX_APP_URL";

/// A real process commits an order and its charge and is killed before any dispatcher ran:
/// the next start's dispatcher delivers it, once.
#[tokio::test]
async fn an_app_killed_after_its_commit_has_its_charge_delivered_by_the_next_start() {
    if let (Ok(db), Ok(url)) = (std::env::var(APP_DB), std::env::var(APP_URL)) {
        place_order(Path::new(&db), "ord_8", &url, true);
        // Committed; the parent kills this process before it sends anything.
        std::thread::park();
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    drop(shop(&path).await);
    let receiver = Receiver::start().await.expect("receiver");
    let mut app = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            crate::support::test_name(
                module_path!(),
                "an_app_killed_after_its_commit_has_its_charge_delivered_by_the_next_start",
            )
            .as_str(),
            "--exact",
            "--nocapture",
        ])
        .env(APP_DB, &path)
        .env(APP_URL, receiver.url("/v1/charges"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the app");
    let key = IdempotencyKey::derive("tests.outbox", &["ord_8", "charge"]);
    let mut queued = false;
    for _ in 0..600 {
        if view_row(&path, key.as_str()).is_some() {
            queued = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.kill().expect("SIGKILL the app");
    app.wait().expect("reap the app");
    assert!(queued, "the app committed its order within 30 s");
    assert_eq!(receiver.arrivals(), 0);

    let ledger = SqliteLedger::open(&path).await.expect("open");
    let pass = Dispatcher::new(client(&ledger, "next"))
        .expect("a ledger")
        .dispatch_due()
        .await
        .expect("a pass");
    assert_eq!(pass.done, 1, "{pass:?}");
    assert_eq!(receiver.effects_for(key.as_str()), 1);
}

const DISPATCHER_DB: &str = "IDEMPOTENT_RETRY_TEST_OUTBOX_DISPATCHER_DB";
/// The killed dispatcher's lease: the next one takes the row over this long after the kill.
const DISPATCHER_LEASE: Duration = Duration::from_secs(3);

/// A dispatcher process killed mid-attempt, after the receiver committed the charge: its row
/// stays in flight under its lease; once that lapses the next dispatcher finds it due, sends it
/// again under the same key, and the receiver answers from its store: one charge.
#[tokio::test]
async fn a_dispatcher_killed_mid_attempt_is_taken_over_and_the_charge_made_once() {
    if let Ok(db) = std::env::var(DISPATCHER_DB) {
        let ledger = SqliteLedger::open(&db).await.expect("open the ledger");
        let client = Client::builder()
            .policy(policy().with_attempt_timeout(Duration::from_secs(60)))
            .ledger(ledger)
            .ledger_options(
                LedgerOptions::new()
                    .worker("doomed")
                    .lease(DISPATCHER_LEASE),
            )
            .build()
            .expect("valid policy");
        let pass = Dispatcher::new(client)
            .expect("a ledger")
            .dispatch_due()
            .await;
        panic!("the dispatcher should have been killed mid-attempt, got {pass:?}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("shop.db");
    drop(shop(&path).await);
    let receiver = Receiver::start().await.expect("receiver");
    let key = place_order(&path, "ord_9", &receiver.url("/v1/charges"), true);
    receiver.inject(
        When::key_attempt(key.clone(), 1),
        Fault::StallAfterCommit(Duration::from_secs(60)),
    );
    let mut doomed = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            crate::support::test_name(
                module_path!(),
                "a_dispatcher_killed_mid_attempt_is_taken_over_and_the_charge_made_once",
            )
            .as_str(),
            "--exact",
            "--nocapture",
        ])
        .env(DISPATCHER_DB, &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the dispatcher");
    let arrived = receiver.wait_for_arrivals(1, Duration::from_secs(30)).await;
    doomed.kill().expect("SIGKILL the dispatcher");
    doomed.wait().expect("reap the dispatcher");
    assert_eq!(arrived, 1, "its attempt reached the receiver");

    let ledger = SqliteLedger::open(&path).await.expect("open");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::InFlight, "nothing released it");
    let next = Dispatcher::new(client(&ledger, "next")).expect("a ledger");
    // Due only once the dead dispatcher's lease has lapsed (bounded: 60 looks, 100 ms apart,
    // beyond a 3 s lease).
    let mut delivered = DispatchPass::default();
    for _ in 0..600 {
        delivered = next.dispatch_due().await.expect("a pass");
        if delivered.due > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(delivered.done, 1, "{delivered:?}");
    assert_eq!(receiver.keys(), vec![Some(key.to_string()); 2]);
    assert_eq!(
        receiver.effects(),
        1,
        "the second attempt is answered from the store"
    );
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 2));
}
