//! What the outbox costs against what a user would write by hand, side by side in one run:
//!
//! 1. **Enqueue.** A caller's transaction (`BEGIN`, the order's row, the operation's row,
//!    `COMMIT`) with `outbox::*::enqueue`, against the same transaction with the operation
//!    inserted by hand into a table of its own (key, method, URL, headers as JSON, body, one
//!    primary key): the whole transaction (what the caller waits for, its commit's sync
//!    included) and, inside one long transaction, the insert alone (the CPU either costs).
//! 2. **Dispatch.** Operations already queued, sent by a `Dispatcher` at 1, 16 and 64 in
//!    flight (`run_until`, as a service runs it, stopped once it has delivered as many as were
//!    queued; its in-flight sends then finish and count), against the same number of keyed `send()`s through the same client and ledger at
//!    the same concurrency (each a new key: a claim, the request, a finish).
//! 3. **Delivery latency** (PostgreSQL): from an enqueue's commit to the request's arrival at
//!    the server, with a dispatcher woken by `LISTEN/NOTIFY`, and with one polling every
//!    100 ms.
//!
//! Contenders alternate inside every round (order rotating), each figure is the median over
//! the rounds, and each ratio is taken within a round before the median. SQLite always;
//! PostgreSQL when `IDEMPOTENT_RETRY_PG_URL` is set (`source .ci/postgres.sh &&
//! start_postgres`).
//!
//! Run: `cargo bench --all-features --bench outbox`. Options after `--`: `--rounds N`
//! (default 5), `--operations N` per contender and round (default 1000), `--dispatch-only C`
//! (part 2 alone at concurrency C, on SQLite, or on PostgreSQL with `--postgres`, there with
//! `--backlog N` operations queued before the rounds, as part 1 leaves them in a whole run),
//! `--only dispatcher|send` (one contender of part 2, for a profiler).

#[allow(
    dead_code,
    reason = "the keep-alive server is all this bench takes from it"
)]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use idempotent_retry::ledger::{Ledger, LedgerOptions, PostgresLedger, SqliteLedger};
use idempotent_retry::outbox::postgres::tokio_postgres::{self, NoTls};
use idempotent_retry::outbox::sqlite::rusqlite::{Connection, params};
use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{Client, IdempotencyKey};
use tokio::sync::Notify;

const BODY: &str = r#"{"order":"ord_000000","amount":1200,"currency":"eur"}"#;

fn now() -> tokio::time::Instant {
    TokioClock::new().now()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn enqueue_of(url: &str, n: usize, tag: &str) -> Enqueue {
    Enqueue::post(url)
        .key(IdempotencyKey::derive(
            "bench.outbox",
            &[tag, &n.to_string()],
        ))
        .header("content-type", "application/json")
        .body(BODY)
        .scope("bench")
}

const HAND_TABLE: &str = "CREATE TABLE IF NOT EXISTS outbox_by_hand (key TEXT PRIMARY KEY, \
     method TEXT NOT NULL, url TEXT NOT NULL, headers TEXT NOT NULL, body BLOB NOT NULL, \
     created_at BIGINT NOT NULL)";

fn sqlite_hand_insert(conn: &Connection, url: &str, n: usize, tag: &str) {
    let key = IdempotencyKey::derive("bench.outbox", &[tag, &n.to_string()]);
    conn.prepare_cached(
        "INSERT INTO outbox_by_hand (key, method, url, headers, body, created_at) \
         VALUES (?1, 'POST', ?2, ?3, ?4, ?5)",
    )
    .and_then(|mut statement| {
        statement.execute(params![
            key.as_str(),
            url,
            r#"[["content-type","application/json"]]"#,
            BODY.as_bytes(),
            i64::try_from(n).unwrap_or(0),
        ])
    })
    .expect("the hand insert");
}

/// Part 1 on SQLite: seconds per transaction and per insert, ours and by hand.
fn sqlite_enqueue(path: &Path, url: &str, operations: usize, round: usize) -> [f64; 4] {
    let mut conn = Connection::open(path).expect("open");
    let mut whole = [0.0; 2];
    let mut alone = [0.0; 2];
    let order = if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    };
    for contender in order {
        let tag = format!("{round}-{contender}-tx");
        let started = now();
        for n in 0..operations {
            let tx = conn.transaction().expect("begin");
            tx.execute(
                "INSERT INTO orders (id, amount) VALUES (?1, 1200)",
                params![format!("{tag}-{n}")],
            )
            .expect("the order");
            if contender == 0 {
                outbox::sqlite::enqueue(&tx, &enqueue_of(url, n, &tag)).expect("queued");
            } else {
                sqlite_hand_insert(&tx, url, n, &tag);
            }
            tx.commit().expect("commit");
        }
        whole[contender] = started.elapsed().as_secs_f64() / operations as f64;
        let tag = format!("{round}-{contender}-alone");
        let tx = conn.transaction().expect("begin");
        let started = now();
        for n in 0..operations {
            if contender == 0 {
                outbox::sqlite::enqueue(&tx, &enqueue_of(url, n, &tag)).expect("queued");
            } else {
                sqlite_hand_insert(&tx, url, n, &tag);
            }
        }
        alone[contender] = started.elapsed().as_secs_f64() / operations as f64;
        tx.rollback().expect("rollback");
    }
    [whole[0], whole[1], alone[0], alone[1]]
}

async fn pg_connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// Part 1 on PostgreSQL: the transactions as `BEGIN` and `COMMIT` on the connection, so one
/// connection serves both phases.
async fn pg_enqueue(
    conn: &tokio_postgres::Client,
    url: &str,
    operations: usize,
    round: usize,
) -> [f64; 4] {
    let mut figures = [0.0; 4];
    let order = if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    };
    let hand = "INSERT INTO outbox_by_hand (key, method, url, headers, body, created_at) \
                VALUES ($1, 'POST', $2, $3, $4, $5)";
    for contender in order {
        for phase in [0, 1] {
            let tag = format!("{round}-{contender}-{phase}");
            if phase == 1 {
                conn.batch_execute("BEGIN").await.expect("begin");
            }
            let started = now();
            for n in 0..operations {
                if phase == 0 {
                    conn.batch_execute("BEGIN").await.expect("begin");
                    conn.execute(
                        "INSERT INTO orders (id, amount) VALUES ($1, 1200)",
                        &[&format!("{tag}-{n}")],
                    )
                    .await
                    .expect("the order");
                }
                if contender == 0 {
                    outbox::postgres::enqueue(conn, &enqueue_of(url, n, &tag))
                        .await
                        .expect("queued");
                } else {
                    let key = IdempotencyKey::derive("bench.outbox", &[&tag, &n.to_string()]);
                    conn.execute(
                        hand,
                        &[
                            &key.as_str(),
                            &url,
                            &r#"[["content-type","application/json"]]"#,
                            &BODY.as_bytes(),
                            &i64::try_from(n).unwrap_or(0),
                        ],
                    )
                    .await
                    .expect("the hand insert");
                }
                if phase == 0 {
                    conn.batch_execute("COMMIT").await.expect("commit");
                }
            }
            figures[phase * 2 + contender] = started.elapsed().as_secs_f64() / operations as f64;
            if phase == 1 {
                conn.batch_execute("ROLLBACK").await.expect("rollback");
            }
        }
    }
    figures
}

fn client(ledger: impl Ledger) -> Client {
    Client::builder()
        .ledger(ledger)
        .ledger_options(LedgerOptions::new().worker("bench"))
        .build()
        .expect("valid policy")
}

/// Part 2: operations per second delivered by a dispatcher and sent with `send()`.
async fn dispatch_round(
    client: &Client,
    queue: &impl AsyncFn(usize, &str),
    url: &str,
    operations: usize,
    concurrency: usize,
    round: usize,
) -> [f64; 2] {
    let mut rates = [f64::NAN; 2];
    let order = if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    };
    // `--only dispatcher` or `--only send`: one contender, for a profiler.
    let only = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|name| usize::from(name == "send"));
    for contender in order {
        if only.is_some_and(|only| only != contender) {
            continue;
        }
        let tag = format!("{round}-{concurrency}-{contender}");
        let started;
        if contender == 0 {
            queue(operations, &tag).await;
            // As a dispatcher runs in a service: `run_until`, stopped once it has delivered
            // as many operations as were queued (each counted as its outcome is written).
            let delivered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let enough = Arc::new(Notify::new());
            let dispatcher = Dispatcher::new(client.clone())
                .expect("a ledger")
                .concurrency(concurrency)
                .on_outcome({
                    let (delivered, enough) = (Arc::clone(&delivered), Arc::clone(&enough));
                    move |delivery| {
                        assert!(
                            matches!(delivery.outcome, idempotent_retry::Outcome::Done { .. }),
                            "{delivery:?}"
                        );
                        let count = delivered.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                        if count + 1 == operations {
                            enough.notify_one();
                        }
                    }
                });
            started = now();
            dispatcher
                .run_until(async { enough.notified().await })
                .await
                .expect("the dispatcher ran");
            let sent = delivered.load(std::sync::atomic::Ordering::Acquire);
            rates[contender] = sent as f64 / started.elapsed().as_secs_f64();
            continue;
        } else {
            started = now();
            futures_util::stream::iter(0..operations)
                .map(|n| {
                    let key = IdempotencyKey::derive("bench.outbox", &[&tag, &n.to_string()]);
                    client
                        .post(url)
                        .header("content-type", "application/json")
                        .body(BODY)
                        .idempotency_key(key)
                        .ledger_scope("bench")
                        .send()
                })
                .buffer_unordered(concurrency)
                .for_each(|sent| async move {
                    sent.expect("sent");
                })
                .await;
        }
        rates[contender] = operations as f64 / started.elapsed().as_secs_f64();
    }
    rates
}

/// Part 2, `rounds` rounds of [`dispatch_round`] with a ledger's own way to `queue`.
async fn dispatch_against_send(
    client: &Client,
    queue: impl AsyncFn(usize, &str),
    url: &str,
    (operations, concurrency): (usize, usize),
    rounds: usize,
) -> Vec<[f64; 2]> {
    let mut pairs = Vec::new();
    for round in 0..rounds {
        pairs.push(dispatch_round(client, &queue, url, operations, concurrency, round).await);
    }
    pairs
}

/// The server of part 3: answers 200 and tells the bench when each request arrived.
async fn arrivals_server() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<tokio::time::Instant>,
) {
    use http_body_util::{BodyExt, Full};
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(now());
                        let _ = request.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(
                            bytes::Bytes::from_static(b"{}"),
                        )))
                    }
                }),
            ));
        }
    });
    (format!("http://{addr}/v1/charges"), rx)
}

/// Part 3: milliseconds from commit to arrival, `samples` times, with `listen` or a 100 ms
/// poll.
async fn latency(pg_url: &str, listen: bool, samples: usize) -> Vec<f64> {
    let (url, mut arrived) = arrivals_server().await;
    let ledger = PostgresLedger::connect(pg_url).await.expect("connect");
    let dispatcher = Dispatcher::new(client(ledger))
        .expect("a ledger")
        .idle_poll(if listen {
            Duration::from_secs(3600)
        } else {
            Duration::from_millis(100)
        });
    let _listener = if listen {
        Some(
            outbox::postgres::listen(pg_url, dispatcher.waker())
                .await
                .expect("LISTEN"),
        )
    } else {
        None
    };
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = pg_connect(pg_url).await;
    let mut figures = Vec::with_capacity(samples);
    for n in 0..samples {
        let tx = conn.transaction().await.expect("begin");
        outbox::postgres::enqueue(&tx, &enqueue_of(&url, n, &format!("latency-{listen}")))
            .await
            .expect("queued");
        tx.commit().await.expect("commit");
        let committed = now();
        let at = arrived.recv().await.expect("an arrival");
        figures.push(at.saturating_duration_since(committed).as_secs_f64() * 1000.0);
        // Apart, so each sample starts from an idle dispatcher.
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    stop.notify_one();
    running.await.expect("its task").expect("no ledger error");
    figures
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|at| args.get(at + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rounds = arg("--rounds", 5);
    let operations = arg("--operations", 1000);
    // `--dispatch-only C [--postgres]`: part 2 alone at concurrency C (for a profiler).
    let dispatch_only = arg("--dispatch-only", 0);
    let pg = std::env::var("IDEMPOTENT_RETRY_PG_URL").ok();
    let server = common::start_server().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.sqlite3");
    let sqlite = SqliteLedger::open(&path).await.expect("open");
    Connection::open(&path)
        .expect("open")
        .execute_batch(&format!(
            "CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER); {HAND_TABLE}"
        ))
        .expect("tables");
    println!("outbox bench: {rounds} rounds, {operations} operations per contender and round");

    if dispatch_only > 0 {
        let work = (operations, dispatch_only);
        if let Some(base) = pg
            .as_deref()
            .filter(|_| args.iter().any(|a| a == "--postgres"))
        {
            let (db, ledger) = pg_ledger(base).await;
            let backlog = arg("--backlog", 0);
            if backlog > 0 {
                let mut conn = pg_connect(&db).await;
                let tx = conn.transaction().await.expect("begin");
                for n in 0..backlog {
                    outbox::postgres::enqueue(&tx, &enqueue_of(&server, n, "backlog"))
                        .await
                        .expect("queued");
                }
                tx.commit().await.expect("commit");
            }
            let pairs = pg_dispatch(&db, &ledger, &server, work, rounds).await;
            print_dispatch("postgres", dispatch_only, &pairs);
        } else {
            let pairs = sqlite_dispatch(&sqlite, &path, &server, work, rounds).await;
            print_dispatch("sqlite", dispatch_only, &pairs);
        }
        return;
    }

    // Part 1.
    let mut figures: Vec<[f64; 4]> = Vec::new();
    for round in 0..rounds {
        figures.push(sqlite_enqueue(&path, &server, operations, round));
    }
    report_enqueue("sqlite", &figures);
    let mut pg_conn = None;
    if let Some(base) = &pg {
        let (db, ledger) = pg_ledger(base).await;
        let conn = pg_connect(&db).await;
        conn.batch_execute(&format!(
            "CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER); {}",
            HAND_TABLE.replace("BLOB", "BYTEA")
        ))
        .await
        .expect("tables");
        let mut figures = Vec::new();
        for round in 0..rounds {
            figures.push(pg_enqueue(&conn, &server, operations, round).await);
        }
        report_enqueue("postgres", &figures);
        pg_conn = Some((db, ledger));
    }

    // Part 2.
    println!("\ndispatch: operations per second, a dispatcher draining a queue against send()");
    println!("| ledger | in flight | dispatcher | send() | dispatcher / send() |");
    println!("|---|---|---|---|---|");
    for concurrency in [1, 16, 64] {
        let ops = if concurrency == 1 {
            operations / 4
        } else {
            operations
        };
        let pairs = sqlite_dispatch(&sqlite, &path, &server, (ops, concurrency), rounds).await;
        print_dispatch("sqlite", concurrency, &pairs);
    }
    if let Some((db, ledger)) = &pg_conn {
        for concurrency in [1, 16, 64] {
            let ops = if concurrency == 1 {
                operations / 4
            } else {
                operations
            };
            let pairs = pg_dispatch(db, ledger, &server, (ops, concurrency), rounds).await;
            print_dispatch("postgres", concurrency, &pairs);
        }
        // Part 3.
        let samples = (operations / 10).clamp(20, 200);
        let notified = latency(db, true, samples).await;
        let polled = latency(db, false, samples).await;
        println!("\ndelivery latency after commit (PostgreSQL), ms, {samples} samples");
        println!("| wake-up | median | p90 | max |");
        println!("|---|---|---|---|");
        for (name, mut values) in [("LISTEN/NOTIFY", notified), ("100 ms poll", polled)] {
            values.sort_by(f64::total_cmp);
            println!(
                "| {name} | {:.2} | {:.2} | {:.2} |",
                values[values.len() / 2],
                values[values.len() * 9 / 10],
                values[values.len() - 1]
            );
        }
    }
}

/// A new database on the server at `base`, with the ledger's tables.
async fn pg_ledger(base: &str) -> (String, PostgresLedger) {
    let db = idempotent_retry_postgres::testing::create_database(base)
        .await
        .expect("a database");
    let ledger = PostgresLedger::connect(&db).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    (db, ledger)
}

/// Part 2 on PostgreSQL: `rounds` rounds of `operations` at `concurrency`.
async fn pg_dispatch(
    db: &str,
    ledger: &PostgresLedger,
    server: &str,
    (operations, concurrency): (usize, usize),
    rounds: usize,
) -> Vec<[f64; 2]> {
    dispatch_against_send(
        &client(ledger.clone()),
        async |count, tag| {
            let mut conn = pg_connect(db).await;
            let tx = conn.transaction().await.expect("begin");
            for n in 0..count {
                outbox::postgres::enqueue(&tx, &enqueue_of(server, n, tag))
                    .await
                    .expect("queued");
            }
            tx.commit().await.expect("commit");
        },
        server,
        (operations, concurrency),
        rounds,
    )
    .await
}

/// Part 2 on SQLite: `rounds` rounds of `operations` at `concurrency`.
async fn sqlite_dispatch(
    sqlite: &SqliteLedger,
    path: &Path,
    server: &str,
    (operations, concurrency): (usize, usize),
    rounds: usize,
) -> Vec<[f64; 2]> {
    dispatch_against_send(
        &client(sqlite.clone()),
        async |count, tag| {
            let mut conn = Connection::open(path).expect("open");
            let tx = conn.transaction().expect("begin");
            for n in 0..count {
                outbox::sqlite::enqueue(&tx, &enqueue_of(server, n, tag)).expect("queued");
            }
            tx.commit().expect("commit");
        },
        server,
        (operations, concurrency),
        rounds,
    )
    .await
}

fn report_enqueue(ledger: &str, figures: &[[f64; 4]]) {
    let column = |i: usize| median(figures.iter().map(|f| f[i] * 1e6).collect());
    let ratio = |a: usize, b: usize| median(figures.iter().map(|f| f[a] / f[b]).collect());
    println!("\nenqueue on {ledger}: microseconds each (median of the rounds)");
    println!("| what | outbox::enqueue | by hand | enqueue / by hand |");
    println!("|---|---|---|---|");
    println!(
        "| transaction with the order, committed | {:.1} | {:.1} | {:.3} |",
        column(0),
        column(1),
        ratio(0, 1)
    );
    println!(
        "| the insert alone, in an open transaction | {:.1} | {:.1} | {:.3} |",
        column(2),
        column(3),
        ratio(2, 3)
    );
}

fn print_dispatch(ledger: &str, concurrency: usize, pairs: &[[f64; 2]]) {
    println!(
        "| {ledger} | {concurrency} | {:.0} | {:.0} | {:.3} |",
        median(pairs.iter().map(|p| p[0]).collect()),
        median(pairs.iter().map(|p| p[1]).collect()),
        median(pairs.iter().map(|p| p[0] / p[1]).collect()),
    );
}
