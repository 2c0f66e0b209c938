//! Resource bounds under failure: what the client keeps, reads and leaves behind.
//!
//! - An operation that runs out of attempts keeps one response (the last) and never reads the
//!   bodies of the ones it retried: a server streaming 64 MiB per answer gets to write only
//!   what the socket buffers hold.
//! - With a ledger, a final body is read only up to `max_body` before `send` returns.
//! - A `send` dropped at any point (while connecting, mid-attempt, mid-wait), as a future or as
//!   an aborted task, leaves no task, no socket and no sleep behind, through the `Client` and
//!   through the tower service over `reqwest` and over hyper.
//!
//! The socket count is process-wide (`/proc/self/fd`), so the tests of this file run one at
//! a time ([`SERIAL`]).

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idempotent_retry::ledger::{LedgerOptions, MemoryLedger};
use idempotent_retry::time::{Sleep, Sleeper};
use idempotent_retry::{
    Client, ClientBuilder, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport,
};
use idempotent_retry_testkit as testkit;
use support::*;
#[cfg(feature = "tower")]
use tower::{Layer, ServiceExt};

/// Fails a test that has not finished by then, instead of letting it hang.
const BOUND: Duration = Duration::from_secs(60);

/// One test at a time: they count the whole process's sockets.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1 << 20;
/// The size of every body the servers here stream.
const HUGE: u64 = 64 * MIB;
/// Far below [`HUGE`], far above what the socket buffers and hyper's read buffer hold.
const NOT_READ: u64 = 16 * MIB;

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after {BOUND:?}"))
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.resources", &[name])
}

#[tokio::test]
async fn an_exhausted_operation_keeps_only_the_last_response_and_reads_no_body() {
    let _serial = SERIAL.lock().await;
    let server = RawServer::start(Reply::large_body(503, HUGE)).await;
    let client = Client::builder()
        .http(testkit::loopback_http().expect("loopback client"))
        .policy(fast().with_max_attempts(3))
        .sleeper(testkit::RecordingSleeper::instant())
        .build()
        .expect("valid policy");
    let k = key("exhausted");
    let mut err = bounded(
        "send",
        client
            .post(server.url("/x"))
            .idempotency_key(k.clone())
            .send(),
    )
    .await
    .expect_err("503 every time");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(err.idempotency_key(), Some(&k));
    assert!(err.is_outcome_unknown());
    assert_eq!(server.hits(), 3);

    // The two retried responses were dropped unread: their connections end. Only the last
    // one, kept in the error, is still open.
    bounded("the retried connections end", async {
        while server.written().len() < 2 {
            tokio::time::sleep(ms(10)).await;
        }
    })
    .await;
    assert_eq!(server.open(), 1, "one response kept: the last");
    assert!(err.take_response().is_some());
    drop(err);
    assert!(
        server.wait_until_quiet(BOUND).await,
        "the last connection ends"
    );
    let written = server.written();
    println!("bytes written per connection of a 64 MiB 503 body: {written:?}");
    assert_eq!(written.len(), 3);
    assert!(
        written.iter().all(|&n| n < NOT_READ),
        "a body was read: {written:?}"
    );
}

#[tokio::test]
async fn with_a_ledger_send_reads_a_final_body_only_up_to_max_body() {
    let _serial = SERIAL.lock().await;
    let server = RawServer::start(Reply::large_body(200, HUGE)).await;
    let client = Client::builder()
        .http(testkit::loopback_http().expect("loopback client"))
        .policy(fast().with_attempt_timeout(Duration::from_secs(30)))
        .ledger(MemoryLedger::new())
        .ledger_options(LedgerOptions::new().max_body(64 * 1024))
        .build()
        .expect("valid policy");

    // Dropped unread right after `send`: the server got to write little of it.
    let first = key("ledger, dropped");
    let response = bounded(
        "send",
        client
            .post(server.url("/a"))
            .idempotency_key(first.clone())
            .body("{}")
            .send(),
    )
    .await
    .expect("200");
    assert_eq!(response.status(), 200);
    drop(response);
    assert!(server.wait_until_quiet(BOUND).await);
    let written = server.written();
    println!("bytes written of a 64 MiB 200 body before send returned (ledger): {written:?}");
    assert!(written[0] < NOT_READ, "send read the body: {written:?}");

    // Read to the end by the caller: every byte is there, and it was not saved.
    let second = key("ledger, read");
    let mut response = bounded(
        "send",
        client
            .post(server.url("/b"))
            .idempotency_key(second.clone())
            .body("{}")
            .send(),
    )
    .await
    .expect("200");
    let mut len = 0u64;
    while let Some(chunk) = bounded("read", response.chunk()).await.expect("body") {
        len += chunk.len() as u64;
    }
    assert_eq!(len, HUGE);
    // The next run with the key: the ledger kept no body, so the operation is sent again with
    // its key (this server answers whatever comes), never replayed empty.
    let again = bounded(
        "send again",
        client
            .post(server.url("/b"))
            .idempotency_key(second)
            .body("{}")
            .send(),
    )
    .await
    .expect("fetched again");
    let report = RetryReport::of(&again).expect("report");
    assert!(report.is_refetched() && !report.is_replayed());
    assert_eq!(server.hits(), 3, "sent again");
}

// ---- nothing left behind by a dropped `send` ------------------------------------------------

/// A sleeper that really sleeps and counts the sleeps alive: a drop guard inside each sleep
/// future gives the count back when the future goes, finished or not.
#[derive(Debug, Clone, Default)]
struct CountingSleeper {
    live: Arc<AtomicUsize>,
    started: Arc<AtomicUsize>,
}

struct LiveSleep(Arc<AtomicUsize>);

impl Drop for LiveSleep {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Sleeper for CountingSleeper {
    fn sleep(&self, duration: Duration) -> Sleep {
        self.live.fetch_add(1, Ordering::SeqCst);
        self.started.fetch_add(1, Ordering::SeqCst);
        let guard = LiveSleep(Arc::clone(&self.live));
        Box::pin(async move {
            let _guard = guard;
            tokio::time::sleep(duration).await;
        })
    }
}

/// Open sockets of this process: the distinct `socket:[inode]` targets of `/proc/self/fd` (a
/// socket duplicated into several descriptors, as the test harness does with its output, counts
/// once).
fn open_sockets() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(Result::ok)
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|target| target.starts_with("socket:"))
        .collect::<std::collections::HashSet<_>>()
        .len()
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// The servers, on a runtime of their own in another thread, so that their tasks do not count
/// among the client's. Each URL answers every request the same way: a stall, a 503 asking for
/// a 1 s wait, a reset.
struct Servers {
    urls: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Servers {
    fn start() -> Servers {
        let (urls_tx, urls_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            runtime.block_on(async move {
                let stall = TestServer::start(vec![], Action::stall(Duration::from_secs(10))).await;
                let busy =
                    TestServer::start(vec![], Action::status_with(503, &[("Retry-After", "1")]))
                        .await;
                let reset = TestServer::start(vec![], Action::Reset).await;
                urls_tx
                    .send(vec![stall.url("/x"), busy.url("/x"), reset.url("/x")])
                    .expect("test alive");
                let _ = stopped.await;
            });
        });
        let urls = urls_rx.recv().expect("servers started");
        Servers {
            urls,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One operation against `url`, through some front end; its result is dropped.
type SendFn = Arc<dyn Fn(String) -> BoxFuture + Send + Sync>;

/// 20..50 ms backoff, 2 s attempts (the stall outlasts them), five attempts.
fn leak_policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(ms(20))
        .with_max_delay(ms(50))
        .with_attempt_timeout(Duration::from_secs(2))
}

fn settings(sleeper: &CountingSleeper) -> ClientBuilder {
    Client::builder()
        .policy(leak_policy())
        .sleeper(sleeper.clone())
        .without_retry_budget()
}

/// reqwest with no idle pool: a connection lives only as long as its request.
fn unpooled_reqwest() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("reqwest client")
}

/// Starts `send`s against every server and drops them at varied points: when first polled
/// (connecting), and 1 to 50 ms in (mid-attempt on the stall, mid-wait on the 503 and the
/// reset), half as futures dropped in place and half as spawned tasks aborted. Then checks
/// that tasks, sockets and sleeps return to their baseline.
async fn drop_sends_everywhere(name: &str, send: SendFn, sleeper: &CountingSleeper) {
    let before = open_sockets();
    let servers = Servers::start();
    // The baseline is exact: no task of the client's runtime, and no socket but the servers'
    // three listeners.
    let (tasks, sockets) = (0, before + servers.urls.len());
    // One complete operation first, so anything a client sets up once exists from here on.
    let warm_up = servers.urls[2].clone();
    bounded("warm-up", send(warm_up)).await;
    let started_before = sleeper.started.load(Ordering::SeqCst);
    assert_eq!(
        sleeper.live.load(Ordering::SeqCst),
        0,
        "{name}: warm-up sleeps"
    );

    let delays = [0, 1, 2, 5, 10, 20, 35, 50];
    const ROUNDS: usize = 30;
    const BATCH: usize = 10;
    for round in 0..ROUNDS {
        let spawned = round % 2 == 1;
        let mut batch = Vec::with_capacity(BATCH);
        for i in 0..BATCH {
            let n = round * BATCH + i;
            let url = servers.urls[n % servers.urls.len()].clone();
            let delay = ms(delays[n % delays.len()]);
            let send = Arc::clone(&send);
            batch.push(async move {
                if spawned {
                    let task = tokio::spawn(send(url));
                    tokio::time::sleep(delay).await;
                    task.abort();
                    let _ = task.await;
                } else {
                    // `timeout` polls the send once before looking at the clock, so a zero
                    // delay drops it right after it started connecting.
                    let _ = tokio::time::timeout(delay, send(url)).await;
                }
            });
        }
        bounded(name, futures_util::future::join_all(batch)).await;
    }

    let started = sleeper.started.load(Ordering::SeqCst) - started_before;
    assert!(started > 0, "{name}: no send was dropped mid-wait");
    assert_eq!(
        sleeper.live.load(Ordering::SeqCst),
        0,
        "{name}: a sleep outlived its operation"
    );
    // Connection tasks notice the drop on their next poll, and the servers see the close: poll
    // (bounded) until everything is back.
    let (back, now) = settle(tasks, sockets).await;

    println!(
        "{name}: {} sends dropped, {started} sleeps started; tasks {tasks} -> {}, sockets {sockets} -> {}",
        ROUNDS * BATCH,
        now.0,
        now.1
    );
    assert!(
        back,
        "{name}: tasks {} (baseline {tasks}), sockets {} (baseline {sockets})",
        now.0, now.1
    );
    drop(servers);
    assert_eq!(open_sockets(), before, "{name}: the servers' sockets");
}

/// Polls (every 20 ms, at most 20 s) until the client's runtime has `tasks` tasks alive and the
/// process `sockets` sockets open; returns whether it got there, and the last counts.
async fn settle(tasks: usize, sockets: usize) -> (bool, (usize, usize)) {
    let mut now = (alive_tasks(), open_sockets());
    for _ in 0..1000 {
        if now == (tasks, sockets) {
            return (true, now);
        }
        tokio::time::sleep(ms(20)).await;
        now = (alive_tasks(), open_sockets());
    }
    (false, now)
}

#[cfg(feature = "tower")]
fn reqwest_post(url: &str) -> reqwest::Request {
    let mut request = reqwest::Request::new(http::Method::POST, url.parse().expect("url"));
    *request.body_mut() = Some(reqwest::Body::from("{}"));
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_leaves_nothing_behind_client() {
    let _serial = SERIAL.lock().await;
    let sleeper = CountingSleeper::default();
    let client = settings(&sleeper)
        .http(unpooled_reqwest())
        .build()
        .expect("valid");
    let send: SendFn = Arc::new(move |url: String| -> BoxFuture {
        let request = client.post(url).body("{}");
        Box::pin(async move {
            let _ = request.send().await;
        })
    });
    drop_sends_everywhere("client", send, &sleeper).await;
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_leaves_nothing_behind_tower_over_reqwest() {
    let _serial = SERIAL.lock().await;
    let sleeper = CountingSleeper::default();
    let service = settings(&sleeper)
        .build_layer()
        .expect("valid")
        .layer(unpooled_reqwest());
    let send: SendFn = Arc::new(move |url: String| -> BoxFuture {
        let service = service.clone();
        Box::pin(async move {
            let _ = service.oneshot(reqwest_post(&url)).await;
        })
    });
    drop_sends_everywhere("tower over reqwest", send, &sleeper).await;
}

#[cfg(feature = "tower")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_leaves_nothing_behind_tower_over_hyper() {
    use bytes::Bytes;
    use http_body_util::Full;

    let _serial = SERIAL.lock().await;
    let sleeper = CountingSleeper::default();
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Full<Bytes>>();
    let service = settings(&sleeper)
        .build_layer()
        .expect("valid")
        .layer(hyper);
    let send: SendFn = Arc::new(move |url: String| -> BoxFuture {
        let service = service.clone();
        let request = http::Request::post(url)
            .body(Full::new(Bytes::from_static(b"{}")))
            .expect("request");
        Box::pin(async move {
            let _ = service.oneshot(request).await;
        })
    });
    drop_sends_everywhere("tower over hyper", send, &sleeper).await;
}

#[cfg(feature = "middleware")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_send_leaves_nothing_behind_middleware() {
    let _serial = SERIAL.lock().await;
    let sleeper = CountingSleeper::default();
    let middleware = settings(&sleeper).build_middleware().expect("valid");
    let client = reqwest_middleware::ClientBuilder::new(unpooled_reqwest())
        .with(middleware)
        .build();
    let send: SendFn = Arc::new(move |url: String| -> BoxFuture {
        let request = client.post(url).body("{}");
        Box::pin(async move {
            let _ = request.send().await;
        })
    });
    drop_sends_everywhere("middleware", send, &sleeper).await;
}
