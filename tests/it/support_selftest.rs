//! Self-test of the integration-test server (`tests/support`), and a record of how reqwest 0.13
//! reports each failure shape the server can produce. Run with
//! `cargo test --test support_selftest -- --nocapture` to see the printed error anatomy.
//!
//! What reqwest 0.13.5 (hyper 1.12, hyper-util 0.1.21 legacy client) reported on this machine,
//! predicates first, then the `{:?}` of each `source()` below the top-level error:
//!
//! - `Action::Reset` / `ResetAfterCommit` (`SO_LINGER` 0 after reading the request): `is_request()`
//!   only (not connect/timeout/body/decode/status). Chain:
//!   `hyper_util::client::legacy::Error(SendRequest, ..)` ->
//!   `hyper::Error(Io, ..)` -> `Os { code: 104, kind: ConnectionReset }` (an `io::Error`).
//! - `Action::Close` (FIN, no answer), and likewise a server dropped mid-stall: `is_request()`
//!   only. Chain: `hyper_util::client::legacy::Error(SendRequest, hyper::Error(IncompleteMessage))`
//!   -> `hyper::Error(IncompleteMessage)`. **No `io::Error` anywhere**: telling it apart needs
//!   `hyper::Error::is_incomplete_message()` (a downcast to `hyper::Error`, i.e. a direct `hyper`
//!   dependency; hyper 1.12 is already in the tree through reqwest).
//! - `Action::StallThen` past a 50 ms `ClientBuilder::timeout`: `is_timeout()` and `is_request()`.
//!   Chain: `TimedOut` (reqwest's private marker type). No `io::Error`.
//! - `refused_addr()`: `is_connect()` and `is_request()`. Chain:
//!   `hyper_util::client::legacy::Error(Connect, ConnectError("tcp connect error", ..))` ->
//!   `ConnectError("tcp connect error", ..)` -> `Os { code: 111, kind: ConnectionRefused }`.
//! - `Action::PartialBody` (status and headers arrive, the body is cut): `send()` succeeds; reading
//!   the body fails with `is_decode()` only (not `is_body()`, not `is_request()`). Chain:
//!   `hyper::Error(Body, Custom { kind: UnexpectedEof, error: IncompleteBody })` ->
//!   `Custom { kind: UnexpectedEof, error: IncompleteBody }` (an `io::Error`, kind `UnexpectedEof`).
//!
//! The assertions below pin every predicate and `io::ErrorKind` listed here; hyper's own kinds are
//! checked through `{:?}` only, because hyper is not a dependency of this crate.
// The server's self-test measures real elapsed time; the crate itself reads time only through `Clock`.
#![allow(clippy::disallowed_methods)]

use std::error::Error as _;
use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use crate::support::*;

/// The predicates reqwest offers, then every source in the chain with `{:?}`.
fn anatomy(err: &reqwest::Error) -> String {
    let mut out = format!(
        "is_connect={} is_timeout={} is_request={} is_body={} is_decode={} is_status={}\n  top: {:?}",
        err.is_connect(),
        err.is_timeout(),
        err.is_request(),
        err.is_body(),
        err.is_decode(),
        err.is_status(),
        err
    );
    let mut source = err.source();
    let mut depth = 1;
    while let Some(e) = source {
        let _ = write!(out, "\n  source[{depth}]: {e:?}");
        if let Some(io) = e.downcast_ref::<io::Error>() {
            let _ = write!(out, "  <- io::ErrorKind::{:?}", io.kind());
        }
        source = e.source();
        depth += 1;
    }
    out
}

/// Every `io::ErrorKind` found in the error's source chain.
fn io_kinds(err: &reqwest::Error) -> Vec<io::ErrorKind> {
    let mut kinds = Vec::new();
    let mut source = err.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            kinds.push(io.kind());
        }
        source = e.source();
    }
    kinds
}

/// The `{:?}` of every source, joined (for looking for hyper's kinds, which we cannot downcast).
fn chain_debug(err: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut source = err.source();
    while let Some(e) = source {
        let _ = write!(out, "{e:?} | ");
        source = e.source();
    }
    out
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

fn client_with_timeout(ms: u64) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_millis(ms))
        .build()
        .expect("client")
}

#[tokio::test]
async fn respond_sends_status_headers_and_body() {
    let server = TestServer::start(
        vec![Action::respond(
            201,
            &[("X-Thing", "one"), ("Content-Type", "text/plain")],
            "created",
        )],
        Action::status(500),
    )
    .await;
    let resp = client()
        .post(server.url("/orders?x=1"))
        .header("Idempotency-Key", "key-1")
        .body("payload")
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 201);
    assert_eq!(resp.headers()["x-thing"], "one");
    assert_eq!(resp.headers()["connection"], "close");
    assert_eq!(resp.headers()["content-length"], "7");
    assert_eq!(resp.text().await.expect("body"), "created");

    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].method, "POST");
    assert_eq!(reqs[0].path, "/orders?x=1");
    assert_eq!(reqs[0].body, b"payload");
    assert_eq!(reqs[0].header("IDEMPOTENCY-KEY"), Some("key-1"));
    assert!(reqs[0].headers.iter().all(|(n, _)| *n == n.to_lowercase()));
    assert!(!reqs[0].replayed);
    assert_eq!(server.effects(), 1);
    assert_eq!(server.effects_for("key-1"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_then_fallback_keys_and_effects() {
    let server = TestServer::start(
        vec![
            Action::status_with(503, &[("Retry-After", "1"), ("x-should-retry", "true")]),
            Action::status(409),
        ],
        Action::ok("done"),
    )
    .await;
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let resp = c
            .post(server.url("/pay"))
            .header("Idempotency-Key", "k1")
            .body("{}")
            .send()
            .await
            .expect("answer");
        if resp.status() == 503 {
            assert_eq!(resp.headers()["retry-after"], "1");
            assert_eq!(resp.headers()["x-should-retry"], "true");
        }
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses, [503, 409, 200, 200]);
    assert_eq!(server.hits(), 4);
    assert_eq!(server.keys(), vec![Some("k1".to_owned()); 4]);
    assert_eq!(server.keys_in("x-missing"), vec![None; 4]);
    assert_eq!(server.effects(), 2, "only the two 200s commit");
    assert_eq!(server.effects_for("k1"), 2);
    assert_eq!(server.effects_for("other"), 0);
    assert_eq!(server.script_left(), 0);
}

#[tokio::test]
async fn reset_is_connection_reset_and_not_connect() {
    let server = TestServer::start(vec![Action::Reset], Action::ok("later")).await;
    let err = client()
        .post(server.url("/"))
        .body("x")
        .send()
        .await
        .expect_err("reset");
    println!("Reset:\n{}", anatomy(&err));
    assert!(io_kinds(&err).contains(&io::ErrorKind::ConnectionReset));
    assert!(!err.is_connect());
    assert!(!err.is_timeout());
    assert!(err.is_request());
    assert!(!err.is_body() && !err.is_decode());
    assert_eq!(server.hits(), 1, "the request reached the server");
    assert!(chain_debug(&err).contains("hyper::Error(Io"));
    assert_eq!(server.effects(), 0);
    // The next request takes the fallback.
    let resp = client().get(server.url("/")).send().await.expect("answer");
    assert_eq!(resp.text().await.expect("body"), "later");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_commit_commits_and_resets() {
    let server = TestServer::start(vec![Action::ResetAfterCommit], Action::status(500)).await;
    let err = client()
        .post(server.url("/charge"))
        .header("idempotency-key", "abc")
        .body("x")
        .send()
        .await
        .expect_err("reset");
    println!("ResetAfterCommit:\n{}", anatomy(&err));
    assert!(io_kinds(&err).contains(&io::ErrorKind::ConnectionReset));
    assert!(!err.is_connect());
    assert_eq!(server.hits(), 1);
    assert_eq!(
        server.effects(),
        1,
        "the side effect happened, the answer was lost"
    );
    assert_eq!(server.effects_for("abc"), 1);
}

#[tokio::test]
async fn close_without_answer() {
    let server = TestServer::start(vec![Action::Close], Action::status(500)).await;
    let err = client()
        .post(server.url("/"))
        .body("x")
        .send()
        .await
        .expect_err("closed");
    println!("Close:\n{}", anatomy(&err));
    // reqwest 0.13.5: is_request() only; hyper::Error(IncompleteMessage) in the chain, no io::Error.
    assert!(err.is_request());
    assert!(!err.is_connect());
    assert!(!err.is_timeout());
    assert!(!err.is_body() && !err.is_decode());
    assert!(chain_debug(&err).contains("IncompleteMessage"));
    assert!(io_kinds(&err).is_empty(), "no io::Error in the chain");
    assert_eq!(server.hits(), 1);
    assert_eq!(server.effects(), 0);
}

// Client timeouts and counts: a timeout covers connecting and sending too, so on a loaded machine
// (2 cores, parallel test binaries) a 50 ms timeout sometimes fires before the request has fully
// reached the server, and then nothing is recorded. Tests that assert hits or effects after a
// client timeout use a timeout of a few hundred ms and a stall well past it.

#[tokio::test]
async fn stall_past_a_50ms_timeout_is_timeout() {
    let server = TestServer::start(
        vec![Action::stall_then(
            Duration::from_secs(2),
            Action::ok("late"),
        )],
        Action::status(500),
    )
    .await;
    let err = client_with_timeout(50)
        .post(server.url("/"))
        .body("x")
        .send()
        .await
        .expect_err("timeout");
    println!("StallThen past a 50 ms timeout:\n{}", anatomy(&err));
    assert!(err.is_timeout());
    assert!(err.is_request());
    assert!(!err.is_connect() && !err.is_body() && !err.is_decode());
    assert!(io_kinds(&err).is_empty());
    assert!(chain_debug(&err).contains("TimedOut"));
    assert!(server.hits() <= 1);
    assert_eq!(server.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_up_during_the_stall_stops_the_inner_action() {
    let server = TestServer::start(
        vec![Action::stall_then(
            Duration::from_millis(900),
            Action::ok("late"),
        )],
        Action::status(500),
    )
    .await;
    let err = client_with_timeout(300)
        .post(server.url("/"))
        .body("x")
        .send()
        .await
        .expect_err("timeout");
    assert!(err.is_timeout());
    assert_eq!(server.hits(), 1);
    // The client hung up during the stall, so the inner 200 never runs: no side effect.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(server.effects(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_first_counts_although_the_client_timed_out() {
    let server = TestServer::start(
        vec![Action::commit_then_stall(
            Duration::from_secs(3),
            Action::ok("receipt"),
        )],
        Action::status(500),
    )
    .await;
    let err = client_with_timeout(300)
        .post(server.url("/"))
        .header("Idempotency-Key", "k")
        .body("x")
        .send()
        .await
        .expect_err("timeout");
    assert!(err.is_timeout());
    assert_eq!(server.hits(), 1);
    assert_eq!(server.effects(), 1);
    assert_eq!(server.effects_for("k"), 1);
}

#[tokio::test]
async fn stall_then_answers_when_the_client_waits() {
    let server = TestServer::start(
        vec![Action::commit_then_stall(
            Duration::from_millis(30),
            Action::ok("slow"),
        )],
        Action::stall(Duration::from_millis(30)),
    )
    .await;
    let c = client();
    let started = tokio::time::Instant::now();
    let resp = c
        .post(server.url("/"))
        .body("x")
        .send()
        .await
        .expect("answer");
    assert!(started.elapsed() >= Duration::from_millis(30));
    assert_eq!(resp.text().await.expect("body"), "slow");
    assert_eq!(
        server.effects(),
        1,
        "commit_first commits once, not again for the 200"
    );
    // Fallback: stall 30 ms then close (no commit).
    let err = c.get(server.url("/")).send().await.expect_err("closed");
    assert!(err.is_request());
    assert_eq!(server.effects(), 1);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn refused_addr_is_connect() {
    let addr = refused_addr();
    let err = client()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .expect_err("refused");
    println!("refused_addr:\n{}", anatomy(&err));
    assert!(err.is_connect());
    assert!(err.is_request());
    assert!(!err.is_timeout());
    assert!(io_kinds(&err).contains(&io::ErrorKind::ConnectionRefused));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_streamed_body_is_recorded_completely() {
    let server = TestServer::start(vec![], Action::ok("thanks")).await;
    let big = vec![b'z'; 100_000];
    let chunks: Vec<Result<bytes::Bytes, io::Error>> = vec![
        Ok(bytes::Bytes::from_static(b"hello ")),
        Ok(bytes::Bytes::from_static(b"")),
        Ok(bytes::Bytes::from(big.clone())),
        Ok(bytes::Bytes::from_static(b" chunked world")),
    ];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let resp = client()
        .post(server.url("/upload"))
        .body(body)
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].header("transfer-encoding"), Some("chunked"));
    assert_eq!(reqs[0].header("content-length"), None);
    let mut expected = b"hello ".to_vec();
    expected.extend_from_slice(&big);
    expected.extend_from_slice(b" chunked world");
    assert_eq!(reqs[0].body.len(), expected.len());
    assert!(reqs[0].body == expected);
}

#[tokio::test]
async fn idempotent_mode_replays_without_a_new_effect_or_script_step() {
    let server = TestServer::start_idempotent(
        vec![Action::ResetAfterCommit, Action::ok("second")],
        Action::status(500),
    )
    .await;
    let c = client();
    let post = |key: &str, body: &str| {
        c.post(server.url("/charge"))
            .header("Idempotency-Key", key)
            .body(body.to_owned())
            .send()
    };

    // Attempt 1: committed, answer lost.
    let err = post("op-1", "amount=5").await.expect_err("reset");
    assert!(io_kinds(&err).contains(&io::ErrorKind::ConnectionReset));
    assert_eq!(server.effects(), 1);

    // Attempt 2, same key and payload: the saved answer, no new effect, no script step.
    let resp = post("op-1", "amount=5").await.expect("replay");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["idempotent-replayed"], "true");
    assert_eq!(resp.text().await.expect("body"), COMMITTED_BODY);
    assert_eq!(server.effects(), 1);
    assert_eq!(server.effects_for("op-1"), 1);
    assert_eq!(server.script_left(), 1);

    // Same key, different payload: 422, nothing else changes.
    let resp = post("op-1", "amount=6").await.expect("answer");
    assert_eq!(resp.status(), 422);
    assert_eq!(server.effects(), 1);
    assert_eq!(server.script_left(), 1);

    // A new key takes the next script step; its replay returns its own saved body.
    let resp = post("op-2", "amount=5").await.expect("answer");
    assert_eq!(resp.text().await.expect("body"), "second");
    let resp = post("op-2", "amount=5").await.expect("answer");
    assert_eq!(resp.text().await.expect("body"), "second");
    assert_eq!(server.effects_for("op-2"), 1);

    // No key: never replayed; takes the fallback.
    let resp = c.post(server.url("/charge")).send().await.expect("answer");
    assert_eq!(resp.status(), 500);

    let replayed: Vec<bool> = server.requests().iter().map(|r| r.replayed).collect();
    assert_eq!(replayed, [false, true, true, false, true, false]);
    assert_eq!(server.hits(), 6);
    assert_eq!(server.effects(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_mode_with_another_header_and_a_201() {
    let server = TestServer::start_idempotent_with(
        "PayPal-Request-Id",
        vec![Action::respond(201, &[], "order-1")],
        Action::status(503),
    )
    .await;
    let c = client();
    for _ in 0..3 {
        let resp = c
            .post(server.url("/v2/orders"))
            .header("paypal-request-id", "r-1")
            .body("{}")
            .send()
            .await
            .expect("answer");
        assert_eq!(resp.status(), 201);
        assert_eq!(resp.text().await.expect("body"), "order-1");
    }
    assert_eq!(server.effects_for("r-1"), 1);
    assert_eq!(
        server.keys_in("PayPal-Request-Id"),
        vec![Some("r-1".to_owned()); 3]
    );
    assert_eq!(server.keys(), vec![None; 3]);
}

#[tokio::test]
async fn partial_body_fails_while_reading_the_body() {
    let server =
        TestServer::start(vec![Action::partial_body("{\"id\":")], Action::status(500)).await;
    let resp = client()
        .get(server.url("/"))
        .send()
        .await
        .expect("the status arrives");
    assert_eq!(resp.status(), 200);
    let err = resp.bytes().await.expect_err("body cut");
    println!("PartialBody, reading the body:\n{}", anatomy(&err));
    assert!(err.is_decode());
    assert!(!err.is_body() && !err.is_request() && !err.is_connect() && !err.is_timeout());
    assert!(io_kinds(&err).contains(&io::ErrorKind::UnexpectedEof));
    assert!(chain_debug(&err).contains("IncompleteBody"));
    assert_eq!(server.effects(), 1);
}

#[tokio::test]
async fn keep_alive_client_reconnects_for_every_request() {
    let server = TestServer::start(vec![], Action::ok("x")).await;
    let c = client();
    for _ in 0..5 {
        let resp = c.get(server.url("/")).send().await.expect("answer");
        assert_eq!(resp.text().await.expect("body"), "x");
    }
    assert_eq!(server.hits(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_are_all_counted() {
    let server = TestServer::start(vec![], Action::ok("x")).await;
    let c = client();
    let mut tasks = Vec::new();
    for i in 0..20 {
        let c = c.clone();
        let url = server.url(&format!("/n/{i}"));
        tasks.push(tokio::spawn(
            async move { c.post(url).body("b").send().await },
        ));
    }
    for t in tasks {
        assert_eq!(t.await.expect("join").expect("answer").status(), 200);
    }
    assert_eq!(server.hits(), 20);
    assert_eq!(server.effects(), 20);
}

#[tokio::test]
async fn head_gets_no_body() {
    let server = TestServer::start(vec![], Action::ok("four")).await;
    let resp = client().head(server.url("/")).send().await.expect("answer");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-length"], "4");
    assert!(resp.bytes().await.expect("body").is_empty());
}

#[tokio::test]
async fn a_client_hanging_up_mid_request_is_not_recorded() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start(vec![], Action::ok("fine")).await;
    for partial in [
        &b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"[..],
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        b"GET / HTTP/1.1\r\nHost: x",
        b"garbage\r\n\r\n",
        b"",
    ] {
        let mut raw = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        raw.write_all(partial).await.expect("write");
        drop(raw);
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(server.hits(), 0);
    let resp = client().get(server.url("/")).send().await.expect("answer");
    assert_eq!(resp.text().await.expect("body"), "fine");
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn raw_http_details() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    // Expect: 100-continue, chunk extensions, trailers, LF-only line ends.
    let mut raw = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    raw.write_all(
        b"PUT /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\n\n\
          3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n",
    )
    .await
    .expect("write");
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"));
    assert!(answer.ends_with("\r\n\r\nok"));
    let reqs = server.requests();
    assert_eq!(reqs[0].method, "PUT");
    assert_eq!(reqs[0].body, b"abcde");
}

#[tokio::test]
async fn gaps_measure_waits_between_arrivals() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let c = client();
    for wait in [0u64, 40, 20] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        c.get(server.url("/")).send().await.expect("answer");
    }
    let g = gaps(&server.requests());
    assert_eq!(g.len(), 2);
    assert!(g[0] >= Duration::from_millis(40), "{g:?}");
    assert!(g[1] >= Duration::from_millis(20), "{g:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_server_stops_it() {
    let server = TestServer::start(vec![], Action::hang()).await;
    let addr = server.addr();
    let url = server.url("/");
    // A request stuck in a 10 s stall ends when the server is dropped.
    let pending = tokio::spawn(async move { client().get(url).send().await });
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(2)).await, 1);
    drop(server);
    let outcome = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .expect("the stalled request ends promptly")
        .expect("join");
    let err = outcome.expect_err("no answer");
    println!("server dropped during a stall:\n{}", anatomy(&err));
    // And nothing listens any more.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let err = client()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .expect_err("refused");
    assert!(err.is_connect());
}
