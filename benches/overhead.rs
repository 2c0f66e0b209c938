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

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use idempotent_retry::{Client, IdempotencyKey};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::net::TcpListener;

const BODY: &str = r#"{"to":"ada@example.com","subject":"hi"}"#;
const KEY: &str = "bench-key-0001";

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the whole request body, as a real handler would.
    let _ = request.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(
        b"{\"ok\":true}",
    ))))
}

/// An HTTP/1.1 keep-alive server on 127.0.0.1 that answers every request 200.
async fn start_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the bench server");
    let addr = listener.local_addr().expect("bench server address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(
                http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service_fn(answer)),
            );
        }
    });
    addr
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .build()
        .expect("a reqwest client")
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let addr = rt.block_on(start_server());
    let url = format!("http://{addr}/v1/emails");

    let bare = http();
    let ours = Client::builder().http(http()).build().expect("our client");
    let key = IdempotencyKey::new(KEY).expect("a valid key");
    let peer = reqwest_middleware::ClientBuilder::new(http())
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(4),
        ))
        .build();

    let mut group = c.benchmark_group("post");
    group.bench_function("bare reqwest", |b| {
        b.to_async(&rt).iter(|| async {
            let response = bare
                .post(&url)
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200");
            response.bytes().await.expect("body")
        })
    });
    group.bench_function("bare reqwest + timeout", |b| {
        b.to_async(&rt).iter(|| async {
            let response = bare
                .post(&url)
                .timeout(Duration::from_secs(30))
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200");
            response.bytes().await.expect("body")
        })
    });
    group.bench_function("idempotent-retry", |b| {
        b.to_async(&rt).iter(|| async {
            let response = ours
                .post(&url)
                .idempotency_key(key.clone())
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200");
            response.bytes().await.expect("body")
        })
    });
    group.bench_function("reqwest-middleware + reqwest-retry", |b| {
        b.to_async(&rt).iter(|| async {
            let response = peer
                .post(&url)
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200");
            response.bytes().await.expect("body")
        })
    });
    group.bench_function("idempotent-retry, random key", |b| {
        b.to_async(&rt).iter(|| async {
            let response = ours
                .post(&url)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200");
            response.bytes().await.expect("body")
        })
    });
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
