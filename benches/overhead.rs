//! The happy path, three ways in one run: the same small POST to the same in-process loopback
//! server (HTTP/1.1, keep-alive), sent by bare `reqwest`, by our `Client`, and by
//! `reqwest-middleware` with `reqwest-retry`. Every request carries the same
//! `Idempotency-Key` header and a 40-byte JSON body, and every response body (11 bytes) is
//! read. Two more lines: bare `reqwest` with a 30 s request timeout (our client sets a
//! per-attempt timeout on every attempt, so this is the like-for-like floor), and our client
//! minting a random key per request, as it does for a POST without one.
//!
//! Run: `cargo bench --bench overhead`. Results and the machine they came from are in
//! `docs/performance.md`.

mod common;

use std::time::Duration;

use common::{Clients, Contender, start_server};
use criterion::{Criterion, criterion_group, criterion_main};

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let url = rt.block_on(start_server());
    let clients = rt.block_on(async { Clients::new() });

    let mut group = c.benchmark_group("post");
    for contender in Contender::ALL {
        group.bench_function(contender.name(), |b| {
            b.to_async(&rt).iter(|| clients.send(contender, &url))
        });
    }
    group.finish();
    // The server's accept loop never ends: do not wait for it.
    rt.shutdown_background();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(6));
    targets = overhead
}
criterion_main!(benches);
