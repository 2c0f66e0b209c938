//! The overhead comparison of `benches/overhead.rs`, made robust to a busy machine: the clients
//! take turns request by request (the order rotating every round), so they all run under the
//! same background load, and the median of each client's own latencies is compared.
//!
//! Criterion times one function after another; on a shared machine the load can change
//! between them by more than the few percent being measured. Interleaving removes that
//! (it cannot remove the noise, only make it the same for everyone).
//!
//! Run: `cargo bench --bench overhead_paired` (about 10 s). Prints a markdown table.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use idempotent_retry::{Client, Clock, IdempotencyKey, TokioClock};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::net::TcpListener;

const BODY: &str = r#"{"to":"ada@example.com","subject":"hi"}"#;
const KEY: &str = "bench-key-0001";
const WARM_UP_ROUNDS: usize = 2_000;
const ROUNDS: usize = 20_000;

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let _ = request.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(
        b"{\"ok\":true}",
    ))))
}

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

struct Clients {
    bare: reqwest::Client,
    timed: reqwest::Client,
    ours: Client,
    key: IdempotencyKey,
    peer: reqwest_middleware::ClientWithMiddleware,
}

const NAMES: [&str; 4] = [
    "bare reqwest",
    "bare reqwest + timeout",
    "idempotent-retry",
    "reqwest-middleware + reqwest-retry",
];

impl Clients {
    async fn send(&self, which: usize, url: &str) {
        let response = match which {
            0 => self
                .bare
                .post(url)
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200"),
            1 => self
                .timed
                .post(url)
                .timeout(Duration::from_secs(30))
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200"),
            2 => self
                .ours
                .post(url)
                .idempotency_key(self.key.clone())
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200"),
            _ => self
                .peer
                .post(url)
                .header("idempotency-key", KEY)
                .header("content-type", "application/json")
                .body(BODY)
                .send()
                .await
                .expect("200"),
        };
        let _ = response.bytes().await.expect("body");
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    rt.block_on(async {
        let addr = start_server().await;
        let url = format!("http://{addr}/v1/emails");
        let http = || {
            reqwest::Client::builder()
                .build()
                .expect("a reqwest client")
        };
        let clients = Clients {
            bare: http(),
            timed: http(),
            ours: Client::builder().http(http()).build().expect("our client"),
            key: IdempotencyKey::new(KEY).expect("a valid key"),
            peer: reqwest_middleware::ClientBuilder::new(http())
                .with(RetryTransientMiddleware::new_with_policy(
                    ExponentialBackoff::builder().build_with_max_retries(4),
                ))
                .build(),
        };
        let clock = TokioClock::new();
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); NAMES.len()];
        for round in 0..WARM_UP_ROUNDS + ROUNDS {
            for turn in 0..NAMES.len() {
                let which = (round + turn) % NAMES.len();
                let start = clock.now();
                clients.send(which, &url).await;
                if round >= WARM_UP_ROUNDS {
                    samples[which].push(clock.now() - start);
                }
            }
        }
        let medians: Vec<Duration> = samples
            .iter_mut()
            .map(|s| {
                s.sort_unstable();
                percentile(s, 0.5)
            })
            .collect();
        println!(
            "| client ({ROUNDS} interleaved requests each) | median | p90 | median / bare reqwest |"
        );
        println!("|---|---:|---:|---:|");
        for (i, name) in NAMES.iter().enumerate() {
            println!(
                "| {name} | {:.2} us | {:.2} us | {:.3} |",
                medians[i].as_secs_f64() * 1e6,
                percentile(&samples[i], 0.9).as_secs_f64() * 1e6,
                medians[i].as_secs_f64() / medians[0].as_secs_f64(),
            );
        }
    });
    rt.shutdown_background();
}
