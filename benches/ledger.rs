//! What a ledger costs per operation: one keyed `POST` sent with `send()` to a loopback server
//! (one fresh connection per request), with no ledger, then with each ledger. Every iteration
//! uses a new key, so each one is a full claim, an attempt record and a finish, never a replay.
//!
//! Run: `cargo bench --all-features --bench ledger`. The PostgreSQL case runs when
//! `IDEMPOTENT_RETRY_PG_URL` is set (`source .ci/postgres.sh && start_postgres` starts one).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
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

fn ledger_cost(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(TestServer::start(vec![], Action::ok("ok")));
    let url = server.url("/charges");
    let dir = tempfile::tempdir().expect("temp dir");

    let mut clients: Vec<(&str, Client)> = vec![
        ("no ledger", client(None::<MemoryLedger>)),
        ("memory", client(Some(MemoryLedger::new()))),
    ];
    #[cfg(feature = "sqlite")]
    {
        let ledger = runtime
            .block_on(idempotent_retry::SqliteLedger::open(
                dir.path().join("bench.db"),
            ))
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

    let counter = AtomicU64::new(0);
    let run = IdempotencyKey::random();
    let mut group = c.benchmark_group("send with ledger");
    group.measurement_time(Duration::from_secs(5));
    for (name, client) in &clients {
        group.bench_function(*name, |b| {
            b.to_async(&runtime).iter(|| async {
                let n = counter.fetch_add(1, Ordering::Relaxed).to_string();
                let key = IdempotencyKey::derive("bench.ledger", &[run.as_str(), &n]);
                let response = client
                    .post(&url)
                    .idempotency_key(key)
                    .body("charge")
                    .send()
                    .await
                    .expect("sent");
                assert_eq!(response.status(), 200);
            });
        });
    }
    group.finish();
    drop(server);
}

criterion_group!(benches, ledger_cost);
criterion_main!(benches);
