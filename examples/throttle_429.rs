//! How three retrying clients treat a server that is throttling: for its first second, the
//! server answers every request `429 Too Many Requests` with `Retry-After: 1`; after that, 200.
//!
//! Run it with `cargo run --example throttle_429`. Each client sends one POST to its own copy
//! of the server (so the counts do not mix), and the table shows how many requests each sent
//! inside the throttled second, and in total:
//!
//! - **idempotent-retry** (this crate, default policy): waits at least what `Retry-After`
//!   asks, so one request lands in the throttled second;
//! - **reqwest-retry** 0.9 behind `reqwest-middleware` 0.5 (`ExponentialBackoff`, 4 retries):
//!   retries 429 on its own backoff schedule and does not read `Retry-After`;
//! - **naive loop**: the loop many services start with: up to 5 attempts, 100 ms apart.
//!
//! The counts of the two peers depend on their timing (and reqwest-retry's jitter); the
//! numbers recorded in `docs/performance.md` come from one run.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use idempotent_retry::Client;
use idempotent_retry::time::{Clock, TokioClock};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::net::TcpListener;
use tokio::time::Instant;

const THROTTLED_FOR: Duration = Duration::from_secs(1);

/// What one server saw.
#[derive(Debug, Default)]
struct Counts {
    throttled: AtomicU32,
    total: AtomicU32,
}

/// A keep-alive HTTP/1.1 server that throttles for [`THROTTLED_FOR`] from its first request.
async fn start_server() -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the throttling server");
    let addr = listener.local_addr().expect("server address");
    let counts = Arc::new(Counts::default());
    let first: Arc<std::sync::OnceLock<Instant>> = Arc::default();
    let served = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (counts, first) = (served.clone(), first.clone());
            let service = service_fn(move |request: Request<Incoming>| {
                let (counts, first) = (counts.clone(), first.clone());
                async move {
                    let _ = request.into_body().collect().await;
                    // The example's clock is the crate's own `Clock`.
                    let now = TokioClock::new().now();
                    let started = *first.get_or_init(|| now);
                    counts.total.fetch_add(1, Ordering::SeqCst);
                    let response = if now.duration_since(started) < THROTTLED_FOR {
                        counts.throttled.fetch_add(1, Ordering::SeqCst);
                        Response::builder()
                            .status(StatusCode::TOO_MANY_REQUESTS)
                            .header("retry-after", "1")
                            .body(Full::new(Bytes::from_static(b"slow down")))
                    } else {
                        Response::builder().body(Full::new(Bytes::from_static(b"ok")))
                    };
                    Ok::<_, Infallible>(response.expect("a valid response"))
                }
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
        }
    });
    (addr, counts)
}

async fn ours(url: String) -> String {
    let client = Client::new();
    match client.post(url).body("charge").send().await {
        Ok(response) => response.status().to_string(),
        Err(err) => err.to_string(),
    }
}

async fn peer(url: String) -> String {
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(4),
        ))
        .build();
    match client.post(url).body("charge").send().await {
        Ok(response) => response.status().to_string(),
        Err(err) => err.to_string(),
    }
}

async fn naive(url: String) -> String {
    let client = reqwest::Client::new();
    let mut last = String::new();
    for attempt in 1..=5 {
        match client.post(&url).body("charge").send().await {
            Ok(response) if response.status() != StatusCode::TOO_MANY_REQUESTS => {
                return response.status().to_string();
            }
            Ok(response) => last = response.status().to_string(),
            Err(err) => last = err.to_string(),
        }
        if attempt < 5 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    last
}

#[tokio::main]
async fn main() {
    let (ours_addr, ours_counts) = start_server().await;
    let (peer_addr, peer_counts) = start_server().await;
    let (naive_addr, naive_counts) = start_server().await;
    let url = |addr: SocketAddr| format!("http://{addr}/v1/charges");
    // The three run side by side, each against its own server.
    let (ours_end, peer_end, naive_end) = tokio::join!(
        ours(url(ours_addr)),
        peer(url(peer_addr)),
        naive(url(naive_addr)),
    );

    println!("| client | requests in the throttled second | requests in total | outcome |");
    println!("|---|---:|---:|---|");
    for (name, counts, end) in [
        ("idempotent-retry (default policy)", &ours_counts, ours_end),
        (
            "reqwest-middleware 0.5 + reqwest-retry 0.9 (4 retries)",
            &peer_counts,
            peer_end,
        ),
        (
            "naive loop (5 attempts, 100 ms apart)",
            &naive_counts,
            naive_end,
        ),
    ] {
        println!(
            "| {name} | {} | {} | {end} |",
            counts.throttled.load(Ordering::SeqCst),
            counts.total.load(Ordering::SeqCst),
        );
    }
}
