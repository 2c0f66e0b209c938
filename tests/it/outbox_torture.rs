//! The outbox under a crash torture: app processes (this test binary run again) place orders,
//! each order's row and its charge committed in one transaction of theirs or rolled back on
//! purpose; dispatcher processes send the charges through a fault proxy to an idempotent
//! receiver; and SIGKILLs land on both, at forced moments (an app with its transaction open
//! before the commit, an app just after its commit before anything sent it, a dispatcher while
//! the receiver holds the answer of a charge it committed) and at random ones (a dispatcher
//! anywhere: mid-attempt, mid-finish, idle). Killed dispatchers are started again. A final pass
//! in this process then sends whatever is left.
//!
//! What is checked, from the caller's own table and the receiver's own record:
//!
//! - every order in the `orders` table (committed) was charged exactly once, under its key;
//! - every order not in it (rolled back, or killed before its commit) was never charged, and
//!   has no ledger row;
//! - nothing is left queued, in flight, not sent or unknown after the final pass, and every
//!   committed order's row says done;
//! - the receiver saw no misuse of a key (the same key with another request).
//!
//! Both ledgers: SQLite (a file the apps share) and PostgreSQL (when a server is configured).
//! Sizes: `IDEMPOTENT_RETRY_OUTBOX_TORTURE_ROUNDS` rounds (default 2) of
//! `IDEMPOTENT_RETRY_OUTBOX_TORTURE_ORDERS` orders (default 12);
//! `IDEMPOTENT_RETRY_OUTBOX_TORTURE_SEED` replays a run's draws. `docs/outbox.md` has the soak
//! figures.
#![cfg(all(feature = "sqlite", feature = "postgres"))]
// Runs are driven by the real monotonic clock across processes.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::fault_proxy::{FaultProxy, ProxyOdds};
use crate::support::*;
use idempotent_retry::ledger::{LedgerOptions, OperationStatus, PostgresLedger, SqliteLedger};
use idempotent_retry::outbox::postgres::tokio_postgres::{self, NoTls};
use idempotent_retry::outbox::sqlite::rusqlite::{Connection, params};
use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
use idempotent_retry_testkit::{Fault, Receiver, When};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const ROLE: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_ROLE";
const STORE: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_STORE";
const TARGET: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_URL";
const ORDERS: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_ORDER_LIST";
const PAUSE: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_PAUSE";
const SEED: &str = "IDEMPOTENT_RETRY_OUTBOX_TORTURE_WORKER_SEED";

/// The dispatchers' lease: a killed one's rows are taken over this long after.
const LEASE: Duration = Duration::from_secs(2);

fn key_of(order: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.outbox.torture", &[order, "charge"])
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(8)
        .with_base_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(50))
        .with_attempt_timeout(Duration::from_secs(2))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }

    fn from_name(name: &str) -> Backend {
        if name == "postgres" {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }

    /// A client whose ledger is the store's, as `worker`.
    async fn client(self, store: &str, worker: &str) -> Client {
        let builder = Client::builder()
            .http(idempotent_retry_testkit::loopback_http().expect("a loopback client"))
            .policy(policy())
            .ledger_options(LedgerOptions::new().worker(worker).lease(LEASE));
        let builder = match self {
            Backend::Sqlite => builder.ledger(SqliteLedger::open(store).await.expect("open")),
            Backend::Postgres => {
                let ledger = PostgresLedger::connect(store).await.expect("connect");
                ledger.migrate().await.expect("migrate");
                builder.ledger(ledger)
            }
        };
        builder.build().expect("valid policy")
    }

    async fn create_orders(self, store: &str) {
        let table = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER)";
        match self {
            Backend::Sqlite => {
                Connection::open(store)
                    .expect("open")
                    .execute_batch(table)
                    .expect("orders");
            }
            Backend::Postgres => {
                pg(store).await.batch_execute(table).await.expect("orders");
            }
        }
    }

    async fn committed_orders(self, store: &str) -> Vec<String> {
        match self {
            Backend::Sqlite => {
                let conn = Connection::open(store).expect("open");
                let mut statement = conn.prepare("SELECT id FROM orders").expect("select");
                statement
                    .query_map([], |row| row.get(0))
                    .expect("rows")
                    .collect::<Result<Vec<String>, _>>()
                    .expect("ids")
            }
            Backend::Postgres => pg(store)
                .await
                .query("SELECT id FROM orders", &[])
                .await
                .expect("rows")
                .iter()
                .map(|row| row.get(0))
                .collect(),
        }
    }
}

async fn pg(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// An app process: places each order in `ORDERS` (`id:commit` pairs), one transaction each,
/// printing `enqueued ID` before its commit or rollback and `done ID` after; it stops for a
/// minute after the line `PAUSE` names, for the parent to kill it there.
async fn app(backend: Backend, store: &str, url: &str) {
    let orders = std::env::var(ORDERS).expect("orders");
    let pause = std::env::var(PAUSE).unwrap_or_default();
    let mut pg_client = match backend {
        Backend::Postgres => Some(pg(store).await),
        Backend::Sqlite => None,
    };
    for pair in orders.split(',') {
        let (order, commit) = pair.split_once(':').expect("id:commit");
        let commit = commit == "1";
        let charge = Enqueue::post(url)
            .key(key_of(order))
            .json(&serde_json::json!({"order": order, "amount": 1200}))
            .scope("shop.charge");
        let say = |line: String| {
            println!("{line}");
            if line == pause {
                std::thread::sleep(Duration::from_secs(60));
            }
        };
        match backend {
            Backend::Sqlite => {
                let mut conn = Connection::open(store).expect("open");
                conn.busy_timeout(Duration::from_secs(30))
                    .expect("busy timeout");
                let tx = conn.transaction().expect("begin");
                tx.execute(
                    "INSERT INTO orders (id, amount) VALUES (?1, 1200)",
                    params![order],
                )
                .expect("the order");
                outbox::sqlite::enqueue(&tx, &charge).expect("queued");
                say(format!("enqueued {order}"));
                if commit {
                    tx.commit().expect("commit");
                } else {
                    tx.rollback().expect("rollback");
                }
            }
            Backend::Postgres => {
                let client = pg_client.as_mut().expect("a client");
                let tx = client.transaction().await.expect("begin");
                tx.execute(
                    "INSERT INTO orders (id, amount) VALUES ($1, 1200)",
                    &[&order],
                )
                .await
                .expect("the order");
                outbox::postgres::enqueue(&tx, &charge)
                    .await
                    .expect("queued");
                say(format!("enqueued {order}"));
                if commit {
                    tx.commit().await.expect("commit");
                } else {
                    tx.rollback().await.expect("rollback");
                }
            }
        }
        say(format!("done {order}"));
    }
}

/// A dispatcher process: passes until killed.
async fn dispatcher(backend: Backend, store: &str, name: &str) {
    let dispatcher = Dispatcher::new(backend.client(store, name).await)
        .expect("a ledger")
        .idle_poll(Duration::from_millis(50))
        .not_sent_after(Duration::from_millis(200))
        .resend_unknown_after(Duration::from_millis(200))
        .on_outcome(|delivery| println!("delivered {} {:?}", delivery.key, delivery.outcome));
    dispatcher
        .run_until(std::future::pending())
        .await
        .expect("the ledger answers");
}

/// An app process and what the parent does with it.
struct App {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The line at which it is killed (empty: none, or already killed).
    pause: String,
    moment: Option<&'static str>,
    /// The orders after the one it is killed at, for the app started in its place.
    rest: Vec<(String, bool)>,
    exited: bool,
}

#[derive(Debug, Default)]
struct Tally {
    orders: usize,
    committed: usize,
    rolled_back_on_purpose: usize,
    kills: BTreeMap<String, usize>,
    faults: BTreeMap<&'static str, u64>,
    dispatcher_starts: usize,
    final_pass_sent: usize,
}

fn spawn(test: &str, envs: &[(&str, String)]) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(std::env::current_exe().expect("test binary"));
    command
        .args([
            test_name(module_path!(), test).as_str(),
            "--exact",
            "--nocapture",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("a worker process");
    let stdout = child.stdout.take().expect("its stdout");
    let (lines, read) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    (child, read)
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// One round on `backend`: apps, dispatchers, kills, the final pass, the checks.
async fn round(
    test: &str,
    backend: Backend,
    store: &str,
    rng: &mut StdRng,
    round: usize,
    tally: &mut Tally,
) {
    let orders_per_round: usize = std::env::var("IDEMPOTENT_RETRY_OUTBOX_TORTURE_ORDERS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12);
    // The ledger's table first (the client migrates the store), then the shop's.
    let check = backend.client(store, "checker").await;
    backend.create_orders(store).await;
    let receiver = Receiver::start().await.expect("receiver");
    let proxy = FaultProxy::start(
        receiver.addr(),
        rng.random(),
        ProxyOdds {
            reset_on_accept: 5,
            swallow_answer: 5,
            cut_answer: 5,
            delay_answer: 10,
            max_delay: Duration::from_millis(300),
        },
    )
    .await;
    let url = proxy.url("/v1/charges");
    let orders: Vec<(String, bool)> = (0..orders_per_round)
        .map(|n| (format!("r{round}-ord{n:03}"), rng.random_ratio(4, 5)))
        .collect();
    tally.orders += orders.len();
    tally.rolled_back_on_purpose += orders.iter().filter(|(_, commit)| !commit).count();
    // The receiver's own faults, per key: a 503 first, a reset after the charge, or the answer
    // held after the charge (the moment a dispatcher is killed).
    let mut held = Vec::new();
    for (order, _) in &orders {
        match rng.random_range(0..6) {
            0 => receiver.inject(When::key_attempt(key_of(order), 1), Fault::status(503)),
            1 => receiver.inject(When::key_attempt(key_of(order), 1), Fault::ResetAfterCommit),
            2 => {
                receiver.inject(
                    When::key_attempt(key_of(order), 1),
                    Fault::StallAfterCommit(Duration::from_secs(30)),
                );
                held.push(order.clone());
            }
            _ => {}
        }
    }

    // Two apps, half the orders each, each killed at a forced moment or left to finish.
    // Two apps, half the orders each; each killed at a forced moment or left to finish. A
    // killed app is started again with the orders after the one it was killed at.
    let start_app = |slice: &[(String, bool)], pause: &str| {
        let list = slice
            .iter()
            .map(|(order, commit)| format!("{order}:{}", u8::from(*commit)))
            .collect::<Vec<_>>()
            .join(",");
        spawn(
            test,
            &[
                (ROLE, "app".into()),
                (STORE, format!("{}:{store}", backend.name())),
                (TARGET, url.clone()),
                (ORDERS, list),
                (PAUSE, pause.to_owned()),
            ],
        )
    };
    let mut apps = Vec::new();
    for slice in orders.chunks(orders.len().div_ceil(2)) {
        let at = rng.random_range(0..slice.len());
        let target = &slice[at].0;
        let (pause, moment) = match rng.random_range(0..3) {
            0 => (
                format!("enqueued {target}"),
                Some("app: transaction open, before its commit"),
            ),
            1 => (
                format!("done {target}"),
                Some("app: after its commit, before any send"),
            ),
            _ => (String::new(), None),
        };
        let (child, lines) = start_app(slice, &pause);
        apps.push(App {
            child,
            lines,
            pause,
            moment,
            rest: slice[at + 1..].to_vec(),
            exited: false,
        });
    }
    let start_dispatcher = |n: usize, tally: &mut Tally| {
        tally.dispatcher_starts += 1;
        spawn(
            test,
            &[
                (ROLE, "dispatcher".into()),
                (STORE, format!("{}:{store}", backend.name())),
                (SEED, format!("d{round}-{n}")),
            ],
        )
    };
    let mut dispatchers: Vec<(Child, mpsc::Receiver<String>)> =
        (0..2).map(|n| start_dispatcher(n, tally)).collect();
    // A dispatcher killed while the receiver holds a committed charge's answer, then one at a
    // random moment, each started again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut held_kill_done = held.is_empty();
    let mut apps_done_at: Option<Instant> = None;
    let mut random_kill_at = Instant::now() + Duration::from_millis(rng.random_range(100..1500));
    let mut restarts = 0;
    loop {
        let mut restarted = Vec::new();
        for app in &mut apps {
            while let Ok(line) = app.lines.try_recv() {
                if !app.pause.is_empty() && line == app.pause {
                    kill(&mut app.child);
                    *tally
                        .kills
                        .entry(app.moment.expect("a moment").to_owned())
                        .or_default() += 1;
                    if !app.rest.is_empty() {
                        let (child, lines) = start_app(&app.rest, "");
                        restarted.push(App {
                            child,
                            lines,
                            pause: String::new(),
                            moment: None,
                            rest: Vec::new(),
                            exited: false,
                        });
                    }
                    app.pause.clear();
                }
            }
            if !app.exited && matches!(app.child.try_wait(), Ok(Some(_))) {
                app.exited = true;
            }
        }
        apps.extend(restarted);
        let apps_done = apps.iter().all(|app| app.exited);
        if apps_done && apps_done_at.is_none() {
            apps_done_at = Some(Instant::now());
        }
        // Done once every app has, two dispatchers were killed and started again, and the
        // held answer's dispatcher was killed, or no held charge came within 3 s of the apps'
        // end (its order was rolled back, or its app killed before the commit).
        let held_settled =
            held_kill_done || apps_done_at.is_some_and(|at| at.elapsed() > Duration::from_secs(3));
        if (apps_done && restarts >= 2 && held_settled) || Instant::now() >= deadline {
            break;
        }
        if !held_kill_done && receiver.arrivals() > 0 {
            // The first arrival of a held key is a charge committed whose answer is held.
            if held
                .iter()
                .any(|order| receiver.effects_for(key_of(order).as_str()) > 0)
            {
                let n = rng.random_range(0..dispatchers.len());
                kill(&mut dispatchers[n].0);
                *tally
                    .kills
                    .entry("dispatcher: receiver committed, answer held".to_owned())
                    .or_default() += 1;
                dispatchers[n] = start_dispatcher(n, tally);
                held_kill_done = true;
                restarts += 1;
            }
        }
        if Instant::now() >= random_kill_at && restarts < 3 {
            let n = rng.random_range(0..dispatchers.len());
            kill(&mut dispatchers[n].0);
            *tally
                .kills
                .entry("dispatcher: random moment".to_owned())
                .or_default() += 1;
            dispatchers[n] = start_dispatcher(n, tally);
            restarts += 1;
            random_kill_at = Instant::now() + Duration::from_millis(rng.random_range(100..1500));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for app in &mut apps {
        kill(&mut app.child);
    }
    // Every dispatcher dies last at whatever it was doing.
    tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
    for (child, _) in &mut dispatchers {
        kill(child);
        *tally
            .kills
            .entry("dispatcher: at the round's end".to_owned())
            .or_default() += 1;
    }

    // The final pass: no faults; dead leases lapse; everything due is sent until nothing is.
    proxy.set_odds(ProxyOdds::NONE);
    let last = Dispatcher::new(backend.client(store, "final").await)
        .expect("a ledger")
        .not_sent_after(Duration::ZERO)
        .resend_unknown_after(Duration::ZERO);
    let committed = backend.committed_orders(store).await;
    let check = check.ledger().expect("a ledger");
    let settle_by = Instant::now() + Duration::from_secs(60);
    loop {
        let pass = last.dispatch_due().await.expect("a pass");
        tally.final_pass_sent += pass.due;
        let mut open = 0;
        for order in &committed {
            let row = check.get(key_of(order).as_str()).await.expect("read");
            if row.is_none_or(|row| row.status != OperationStatus::Succeeded) {
                open += 1;
            }
        }
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < settle_by,
            "{open} committed orders still not done after a minute of final passes"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tally.committed += committed.len();

    for (order, _) in &orders {
        let key = key_of(order);
        let charged = receiver.effects_for(key.as_str());
        let row = check.get(key.as_str()).await.expect("read");
        if committed.contains(order) {
            assert_eq!(
                charged,
                1,
                "{} order {order}: charged {charged} times",
                backend.name()
            );
            let row = row.expect("a row");
            assert_eq!(row.status, OperationStatus::Succeeded, "{order}: {row:?}");
        } else {
            assert_eq!(
                charged,
                0,
                "{} order {order} was not committed but charged",
                backend.name()
            );
            assert!(
                row.is_none(),
                "{order} was not committed but has a row: {row:?}"
            );
        }
    }
    assert!(
        receiver.violations().is_empty(),
        "{:?}",
        receiver.violations()
    );
    for (fault, count) in proxy.counts() {
        *tally.faults.entry(fault).or_default() += count;
    }
}

fn report(backend: Backend, seed: u64, tally: &Tally) -> String {
    let mut text = format!(
        "outbox torture on {} (seed {seed}): {} orders, {} committed, {} rolled back on purpose \
         or killed before their commit; {} dispatcher processes; final pass sent {}\n",
        backend.name(),
        tally.orders,
        tally.committed,
        tally.orders - tally.committed,
        tally.dispatcher_starts,
        tally.final_pass_sent,
    );
    text.push_str(&format!(
        "  rolled back on purpose: {}\n",
        tally.rolled_back_on_purpose
    ));
    for (what, count) in &tally.kills {
        text.push_str(&format!("  kill, {what}: {count}\n"));
    }
    for (fault, count) in &tally.faults {
        text.push_str(&format!("  proxy, {fault}: {count}\n"));
    }
    text
}

async fn torture(test: &str, backend: Backend, store_for: impl AsyncFn(usize) -> String) {
    let rounds: usize = std::env::var("IDEMPOTENT_RETRY_OUTBOX_TORTURE_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let seed: u64 = std::env::var("IDEMPOTENT_RETRY_OUTBOX_TORTURE_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("outbox torture on {}: seed {seed}", backend.name());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    for n in 0..rounds {
        let store = store_for(n).await;
        round(test, backend, &store, &mut rng, n, &mut tally).await;
    }
    println!("{}", report(backend, seed, &tally));
}

/// The test binary as a worker, when the role is set: never returns then.
async fn as_worker() -> bool {
    let Ok(role) = std::env::var(ROLE) else {
        return false;
    };
    let store = std::env::var(STORE).expect("store");
    let (backend, store) = store.split_once(':').expect("backend:store");
    let backend = Backend::from_name(backend);
    match role.as_str() {
        "app" => app(backend, store, &std::env::var(TARGET).expect("url")).await,
        _ => dispatcher(backend, store, &std::env::var(SEED).unwrap_or_default()).await,
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_order_is_charged_once_and_no_other_across_sqlite_crashes() {
    if as_worker().await {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_owned();
    torture(
        "every_committed_order_is_charged_once_and_no_other_across_sqlite_crashes",
        Backend::Sqlite,
        async |n| {
            path.join(format!("shop-{n}.db"))
                .to_string_lossy()
                .into_owned()
        },
    )
    .await;
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_order_is_charged_once_and_no_other_across_postgres_crashes() {
    if as_worker().await {
        return;
    }
    let Some(base) = postgres_server_url() else {
        return;
    };
    torture(
        "every_committed_order_is_charged_once_and_no_other_across_postgres_crashes",
        Backend::Postgres,
        async |_| postgres_database_on(&base).await,
    )
    .await;
}
