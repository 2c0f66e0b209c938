//! What a ledger costs per operation: one keyed `POST` sent with `send()` to a loopback server
//! (one fresh connection per request), with no ledger, then with each ledger. Every iteration
//! uses a new key, so each one is a full claim, an attempt record and a finish, never a replay.
//!
//! A second group, `64 at once`, sends [`OPERATIONS`] such POSTs with [`CONCURRENCY`] in flight
//! at a time to a keep-alive loopback server, the way a busy worker does; its throughput
//! (elements per second) against `no ledger` is the ledger's cost at fleet throughput.
//!
//! Run: `cargo bench --all-features --bench ledger` (or `-- "64 at once"` for the second group
//! alone). The PostgreSQL case runs when
//! `IDEMPOTENT_RETRY_PG_URL` is set (`source .ci/postgres.sh && start_postgres` starts one).

#[allow(
    dead_code,
    reason = "the keep-alive server is all this bench takes from it"
)]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::StreamExt;
use idempotent_retry::{Client, IdempotencyKey, Ledger, MemoryLedger};
use support::{Action, TestServer};

fn client(ledger: Option<impl Ledger>) -> Client {
    let builder = Client::builder();
    match ledger {
        Some(ledger) => builder.ledger(ledger),
        None => builder,
    }
    .build()
    .expect("client")
}

/// Operations per timed iteration of the concurrent group.
const OPERATIONS: u64 = 2000;
/// How many of them are in flight at once.
const CONCURRENCY: usize = 64;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// One client per contender: no ledger, then each ledger, its SQLite file in `dir`.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unused_variables, reason = "the SQL ledgers alone need them")
)]
fn contenders(runtime: &tokio::runtime::Runtime, dir: &Path) -> Vec<(&'static str, Client)> {
    let mut clients: Vec<(&str, Client)> = vec![
        ("no ledger", client(None::<MemoryLedger>)),
        ("memory", client(Some(MemoryLedger::new()))),
    ];
    #[cfg(feature = "sqlite")]
    {
        let ledger = runtime
            .block_on(idempotent_retry::SqliteLedger::open(dir.join("bench.db")))
            .expect("sqlite");
        clients.push(("sqlite", client(Some(ledger))));
    }
    #[cfg(feature = "postgres")]
    if let Ok(pg) = std::env::var("IDEMPOTENT_RETRY_PG_URL") {
        let ledger = runtime.block_on(async {
            let ledger = idempotent_retry::PostgresLedger::connect(&pg)
                .await
                .expect("postgres");
            ledger.migrate().await.expect("migrate");
            ledger
        });
        clients.push(("postgres", client(Some(ledger))));
    }
    clients
}

/// Sends one keyed POST under the `n`th key of `run` and checks the answer.
async fn send(client: &Client, url: &str, run: &IdempotencyKey, n: u64) {
    let key = IdempotencyKey::derive("bench.ledger", &[run.as_str(), &n.to_string()]);
    let response = client
        .post(url)
        .idempotency_key(key)
        .body("charge")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 200);
}

fn ledger_cost(c: &mut Criterion) {
    let runtime = runtime();
    let server = runtime.block_on(TestServer::start(vec![], Action::ok("ok")));
    let url = server.url("/charges");
    let dir = tempfile::tempdir().expect("temp dir");
    let clients = contenders(&runtime, dir.path());

    let counter = AtomicU64::new(0);
    let run = IdempotencyKey::random();
    let mut group = c.benchmark_group("send with ledger");
    group.measurement_time(Duration::from_secs(5));
    for (name, client) in &clients {
        group.bench_function(*name, |b| {
            b.to_async(&runtime).iter(|| async {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                send(client, &url, &run, n).await;
            });
        });
    }
    group.finish();
    drop(server);
}

fn ledger_at_concurrency(c: &mut Criterion) {
    let runtime = runtime();
    let url = runtime.block_on(common::start_server());
    let dir = tempfile::tempdir().expect("temp dir");
    let clients = contenders(&runtime, dir.path());

    let counter = AtomicU64::new(0);
    let run = IdempotencyKey::random();
    let mut group = c.benchmark_group("64 at once");
    group.throughput(Throughput::Elements(OPERATIONS));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for (name, client) in &clients {
        group.bench_function(*name, |b| {
            b.to_async(&runtime).iter(|| async {
                let first = counter.fetch_add(OPERATIONS, Ordering::Relaxed);
                futures_util::stream::iter(first..first + OPERATIONS)
                    .map(|n| send(client, &url, &run, n))
                    .buffer_unordered(CONCURRENCY)
                    .collect::<()>()
                    .await;
            });
        });
    }
    group.finish();
}

criterion_group!(benches, ledger_cost, ledger_at_concurrency);
criterion_main!(benches);
