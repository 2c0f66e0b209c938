//! `Client::execute`, `RequestBuilder::build`, `try_clone` and `version`, against real loopback
//! servers: what reached the server on each attempt, with which key, and what the caller got.
//! A request built by `build` and run by `execute` must behave exactly as the same builder's
//! `send`: each parity case runs both ways, on two servers with the same script.

use std::time::Duration;

use crate::support::*;
use http::Version;
use idempotent_retry::ledger::{Ledger, MemoryLedger};
use idempotent_retry::{
    Client, ErrorKind, IdempotencyKey, LedgerScope, RequestBuilder, RetryPolicy, RetryReport,
    WithoutIdempotencyKey,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn client(policy: RetryPolicy) -> Client {
    Client::builder()
        .policy(policy)
        .build()
        .expect("valid policy")
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).expect("valid test key")
}

fn report(response: &reqwest::Response) -> RetryReport {
    RetryReport::of(response)
        .cloned()
        .expect("every response carries a report")
}

/// A `reqwest::Request` built by reqwest itself, as a caller who never saw this crate would.
fn plain(method: http::Method, url: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new().request(method, url)
}

/// What the caller saw of one operation, in a form two runs can be compared by (a random key
/// is compared by its presence, not its value).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    status: Option<u16>,
    error: Option<ErrorKind>,
    outcome_unknown: bool,
    attempts: u32,
    key: Option<String>,
    random_key: bool,
}

fn seen(result: &Result<reqwest::Response, idempotent_retry::Error>) -> Seen {
    let (status, error, outcome_unknown, attempts, key) = match result {
        Ok(response) => {
            let report = report(response);
            (
                Some(response.status().as_u16()),
                None,
                false,
                report.attempts(),
                report.idempotency_key().cloned(),
            )
        }
        Err(err) => (
            err.status().map(|s| s.as_u16()),
            Some(err.kind()),
            err.is_outcome_unknown(),
            err.attempts(),
            err.idempotency_key().cloned(),
        ),
    };
    let random_key = key.as_ref().is_some_and(|k| k.as_str().len() == 36);
    Seen {
        status,
        error,
        outcome_unknown,
        attempts,
        key: key.filter(|_| !random_key).map(|k| k.as_str().to_owned()),
        random_key,
    }
}

/// One attempt as the server got it: method, target, sorted headers, body.
type Arrival = (String, String, Vec<(String, String)>, Vec<u8>);

/// What the server got on each attempt, random keys as their presence.
fn arrivals(server: &TestServer) -> Vec<Arrival> {
    server
        .requests()
        .into_iter()
        .map(|r| {
            let mut headers: Vec<(String, String)> = r
                .headers
                .into_iter()
                .map(|(name, value)| {
                    if name == "idempotency-key" && value.len() == 36 {
                        (name, "<random>".to_owned())
                    } else {
                        (name, value)
                    }
                })
                .collect();
            headers.sort();
            (r.method, r.path, headers, r.body)
        })
        .collect()
}

/// Runs the builder `make` returns once with `send` and once as `execute(build()?)`, each
/// against its own server with `script` then `fallback`; asserts both runs looked the same to
/// the caller and to the server, and returns what they saw.
async fn send_and_execute_agree(
    client: &Client,
    script: Vec<Action>,
    fallback: Action,
    make: impl Fn(&Client, String) -> RequestBuilder,
) -> (Seen, Vec<Arrival>) {
    let by_send = TestServer::start(script.clone(), fallback.clone()).await;
    let by_execute = TestServer::start(script, fallback).await;
    let sent = make(client, by_send.url("/v1/op")).send().await;
    let built = make(client, by_execute.url("/v1/op"))
        .build()
        .expect("builds");
    let executed = client.execute(built).await;
    let (sent, executed) = (seen(&sent), seen(&executed));
    assert_eq!(sent, executed, "the caller sees the same");
    // The two servers listen on different ports: compare everything but the Host header.
    let strip = |server: &TestServer| {
        let mut all = arrivals(server);
        for (_, _, headers, _) in &mut all {
            headers.retain(|(name, _)| name != "host");
        }
        all
    };
    let (on_send, on_execute) = (strip(&by_send), strip(&by_execute));
    assert_eq!(on_send, on_execute, "the server gets the same");
    // One key on every attempt, whatever it is.
    let keys = by_execute.keys();
    assert!(
        keys.windows(2).all(|w| w[0] == w[1]),
        "keys differ between attempts: {keys:?}"
    );
    (executed, on_execute)
}

// Build, then execute: exactly as send.

#[tokio::test]
async fn a_built_request_with_every_override_runs_as_send_does() {
    let client = client(fast().with_max_attempts(5));
    let (seen, arrivals) = send_and_execute_agree(
        &client,
        vec![Action::status(503)],
        Action::status(503),
        |client, url| {
            client
                .post(url)
                .idempotency_key(key("k_parity"))
                .policy(fast().with_max_attempts(2))
                .timeout(Duration::from_secs(5))
                .header("x-request-source", "agent")
                .json(&serde_json::json!({"amount": 1200}))
        },
    )
    .await;
    assert_eq!(seen.error, Some(ErrorKind::AttemptsExhausted));
    assert_eq!(seen.attempts, 2, "the request's policy, not the client's 5");
    assert_eq!(seen.key.as_deref(), Some("k_parity"));
    assert_eq!(arrivals.len(), 2);
    for (method, path, headers, body) in &arrivals {
        assert_eq!((method.as_str(), path.as_str()), ("POST", "/v1/op"));
        assert!(headers.contains(&("idempotency-key".into(), "k_parity".into())));
        assert!(headers.contains(&("x-request-source".into(), "agent".into())));
        assert_eq!(body, br#"{"amount":1200}"#);
    }
}

#[tokio::test]
async fn a_built_request_gets_one_random_key_when_executed_as_send_does() {
    let client = client(fast());
    let (seen, arrivals) = send_and_execute_agree(
        &client,
        vec![Action::status(503), Action::Reset],
        Action::ok("done"),
        |client, url| client.post(url).body("charge"),
    )
    .await;
    assert_eq!(seen.status, Some(200));
    assert_eq!(seen.attempts, 3);
    assert!(seen.random_key, "{seen:?}");
    assert!(
        arrivals
            .iter()
            .all(|(_, _, h, _)| h.contains(&("idempotency-key".into(), "<random>".into())))
    );
}

#[tokio::test]
async fn without_idempotency_key_survives_the_build() {
    let client = client(fast());
    let (seen, arrivals) = send_and_execute_agree(
        &client,
        vec![Action::status(503)],
        Action::ok("done"),
        |client, url| client.post(url).without_idempotency_key().body("ping"),
    )
    .await;
    assert_eq!(seen.key, None);
    assert!(!seen.random_key);
    assert_eq!(
        seen.attempts, 1,
        "a keyless POST that reached the server is not resent"
    );
    assert_eq!(arrivals.len(), 1);
    assert!(
        arrivals[0]
            .2
            .iter()
            .all(|(name, _)| name != "idempotency-key")
    );
}

#[tokio::test]
async fn a_zero_timeout_and_conflicting_keys_are_refused_by_execute_as_by_send() {
    let client = client(fast());
    let (seen, arrivals) =
        send_and_execute_agree(&client, vec![], Action::ok(""), |client, url| {
            client.post(url).timeout(Duration::ZERO)
        })
        .await;
    assert_eq!(seen.error, Some(ErrorKind::Builder));
    assert!(arrivals.is_empty());
    let (seen, arrivals) =
        send_and_execute_agree(&client, vec![], Action::ok(""), |client, url| {
            client
                .post(url)
                .idempotency_key(key("k_one"))
                .header("Idempotency-Key", "k_two")
        })
        .await;
    assert_eq!(seen.error, Some(ErrorKind::Builder));
    assert!(arrivals.is_empty());
}

#[tokio::test]
async fn a_ledger_scope_survives_the_build() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let client = Client::builder()
        .policy(fast())
        .ledger(ledger.clone())
        .build()
        .expect("valid");
    let request = client
        .post(server.url("/v1/charges"))
        .idempotency_key(key("k_scoped"))
        .ledger_scope("payments.charge")
        .body("{}")
        .build()
        .expect("builds");
    client.execute(request).await.expect("ok");
    let row = ledger
        .get("k_scoped")
        .await
        .expect("the ledger answers")
        .expect("a row for the key");
    assert_eq!(row.scope, "payments.charge");
    assert_eq!(server.keys(), vec![Some("k_scoped".into())]);
}

// Execute: a reqwest::Request from anywhere.

#[tokio::test]
async fn a_key_header_on_a_plain_request_is_the_key_of_every_attempt() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
    let request = plain(http::Method::POST, &server.url("/v1/emails"))
        .header("Idempotency-Key", "evt_1NG8Du2eZvKYlo2C")
        .body("to=a@example.com")
        .build()
        .expect("a request");
    let response = client(fast())
        .execute(request)
        .await
        .expect("second attempt");
    assert_eq!(response.status(), 200);
    assert_eq!(server.keys(), vec![Some("evt_1NG8Du2eZvKYlo2C".into()); 2]);
    let report = report(&response);
    assert_eq!(report.attempts(), 2);
    assert_eq!(report.idempotency_key(), Some(&key("evt_1NG8Du2eZvKYlo2C")));
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.body_str() == "to=a@example.com")
    );
}

#[tokio::test]
async fn the_configured_key_header_is_read_from_a_plain_request() {
    let server = TestServer::start_idempotent_with(
        "PayPal-Request-Id",
        vec![Action::status(502)],
        Action::ok(""),
    )
    .await;
    let client = Client::builder()
        .policy(fast())
        .key_header(http::HeaderName::from_static("paypal-request-id"))
        .build()
        .expect("valid");
    let request = plain(http::Method::POST, &server.url("/v2/checkout/orders"))
        .header("PayPal-Request-Id", "order-7781")
        .build()
        .expect("a request");
    client.execute(request).await.expect("ok");
    assert_eq!(
        server.keys_in("paypal-request-id"),
        vec![Some("order-7781".into()); 2]
    );
    assert_eq!(server.keys_in("idempotency-key"), vec![None, None]);
}

#[tokio::test]
async fn an_invalid_key_header_on_a_plain_request_is_refused_with_nothing_sent() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let request = plain(http::Method::POST, &server.url("/"))
        .header("Idempotency-Key", "has a space")
        .build()
        .expect("a request");
    let err = client(fast())
        .execute(request)
        .await
        .expect_err("invalid key");
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert!(!err.is_outcome_unknown());
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_plain_post_gets_a_random_key_and_a_get_none() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let client = client(fast());
    let request = plain(http::Method::POST, &server.url("/"))
        .build()
        .expect("a request");
    let response = client.execute(request).await.expect("ok");
    let key = report(&response)
        .idempotency_key()
        .cloned()
        .expect("a random key");
    assert_eq!(key.as_str().len(), 36);
    assert_eq!(server.keys(), vec![Some(key.as_str().to_owned()); 2]);

    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let request = plain(http::Method::GET, &server.url("/"))
        .build()
        .expect("a request");
    let response = client.execute(request).await.expect("ok");
    assert_eq!(report(&response).idempotency_key(), None);
    assert_eq!(
        server.keys(),
        vec![None, None],
        "GET is retried without a key"
    );
}

#[tokio::test]
async fn extensions_on_an_http_request_are_honoured() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let mut request = http::Request::post(server.url("/v1/ping"))
        .body("ping")
        .expect("a request");
    request.extensions_mut().insert(fast().with_max_attempts(3));
    request.extensions_mut().insert(key("k_from_extension"));
    let request = reqwest::Request::try_from(request).expect("an absolute URL");
    let err = client(fast().with_max_attempts(6))
        .execute(request)
        .await
        .expect_err("503 every time");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(err.attempts(), 3, "the extension's policy");
    assert_eq!(server.keys(), vec![Some("k_from_extension".into()); 3]);

    let server = TestServer::start(vec![], Action::status(503)).await;
    let mut request = http::Request::post(server.url("/v1/ping"))
        .body("ping")
        .expect("a request");
    request.extensions_mut().insert(WithoutIdempotencyKey);
    let request = reqwest::Request::try_from(request).expect("an absolute URL");
    let response = client(fast())
        .execute(request)
        .await
        .expect("a keyless POST's 503 is its final answer");
    assert_eq!(response.status(), 503);
    assert_eq!(report(&response).idempotency_key(), None);
    assert_eq!(report(&response).attempts(), 1);
    assert_eq!(server.keys(), vec![None], "no key, so no resend");
}

#[tokio::test]
async fn a_ledger_scope_on_an_http_request_names_the_row() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let client = Client::builder()
        .policy(fast())
        .ledger(ledger.clone())
        .build()
        .expect("valid");
    let mut request = http::Request::post(server.url("/v1/charges"))
        .header("Idempotency-Key", "order-1187-charge")
        .body(r#"{"amount":1200}"#)
        .expect("a request");
    request
        .extensions_mut()
        .insert(LedgerScope::new("payments.charge"));
    let request = reqwest::Request::try_from(request).expect("an absolute URL");
    client
        .execute(request)
        .await
        .expect("the second attempt succeeds");
    let row = ledger
        .get("order-1187-charge")
        .await
        .expect("the ledger answers")
        .expect("a row for the key");
    assert_eq!(row.scope, "payments.charge");
    assert_eq!(row.attempts, 2);
    assert_eq!(server.keys(), vec![Some("order-1187-charge".into()); 2]);
}

#[tokio::test]
async fn a_plain_requests_timeout_is_the_timeout_of_each_attempt() {
    let server = TestServer::start(vec![], Action::hang()).await;
    let request = plain(http::Method::GET, &server.url("/"))
        .timeout(ms(300))
        .build()
        .expect("a request");
    let operation = client(
        fast()
            .with_max_attempts(2)
            .with_attempt_timeout(Duration::from_secs(60)),
    )
    .execute(request);
    // The policy's 60 s per attempt would overrun this bound: the request's 300 ms applies.
    let err = tokio::time::timeout(Duration::from_secs(30), operation)
        .await
        .expect("done within 30 s")
        .expect_err("times out long before 60 s");
    assert!(err.is_timeout(), "{err}");
    assert_eq!(err.attempts(), 2);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn the_future_of_execute_outlives_the_client() {
    let server = TestServer::start(vec![], Action::ok("done")).await;
    let client = client(fast());
    let request = client
        .post(server.url("/"))
        .idempotency_key(key("k_spawned"))
        .build()
        .expect("builds");
    let operation = tokio::spawn(client.execute(request));
    drop(client);
    let response = operation.await.expect("joined").expect("ok");
    assert_eq!(response.text().await.expect("body"), "done");
    assert_eq!(server.keys(), vec![Some("k_spawned".into())]);
}

// try_clone.

#[tokio::test]
async fn a_cloned_builder_keeps_its_key_policy_and_body() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let original = client(fast().with_max_attempts(5))
        .post(server.url("/v1/charges"))
        .idempotency_key(key("k_cloned"))
        .policy(fast().with_max_attempts(2))
        .body("amount=1200");
    let copy = original.try_clone().expect("a bytes body can be cloned");
    for builder in [original, copy] {
        let err = builder.send().await.expect_err("503 every time");
        assert_eq!(err.attempts(), 2);
        assert_eq!(err.idempotency_key(), Some(&key("k_cloned")));
    }
    assert_eq!(server.keys(), vec![Some("k_cloned".into()); 4]);
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.body_str() == "amount=1200")
    );
}

#[tokio::test]
async fn copies_of_a_builder_without_a_key_are_operations_with_their_own_keys() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let original = client(fast()).post(server.url("/")).body("x");
    let copy = original.try_clone().expect("cloneable");
    original.send().await.expect("ok");
    copy.send().await.expect("ok");
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_some() && keys[1].is_some());
    assert_ne!(keys[0], keys[1]);
}

#[test]
fn a_builder_with_a_streamed_body_cannot_be_cloned() {
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("a")];
    let streamed = Client::new()
        .post("http://127.0.0.1:9/")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )));
    assert!(streamed.try_clone().is_none());
    assert!(
        Client::new()
            .post("http://127.0.0.1:9/")
            .try_clone()
            .is_some()
    );
}

// version.

/// A raw loopback server that records each request line and answers `503` to the first
/// request and `200` to the rest, closing every connection.
async fn request_line_server() -> (String, tokio::task::JoinHandle<Vec<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut lines = Vec::new();
        for answer in ["503 Service Unavailable", "200 OK"] {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                stream
                    .read_exact(&mut byte)
                    .await
                    .expect("the request head");
                head.push(byte[0]);
            }
            let head = String::from_utf8(head).expect("ascii head");
            lines.push(head.lines().next().expect("a request line").to_owned());
            let key = head
                .lines()
                .find_map(|l| l.strip_prefix("idempotency-key: "))
                .unwrap_or("-")
                .to_owned();
            lines.push(key);
            let reply =
                format!("HTTP/1.1 {answer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            stream.write_all(reply.as_bytes()).await.expect("reply");
        }
        lines
    });
    (url, task)
}

#[tokio::test]
async fn the_version_reaches_the_wire_on_every_attempt() {
    let (url, server) = request_line_server().await;
    let builder = client(fast())
        .post(url)
        .idempotency_key(key("k_http10"))
        .version(Version::HTTP_10);
    let built = builder
        .try_clone()
        .expect("no body")
        .build()
        .expect("builds");
    assert_eq!(built.version(), Version::HTTP_10);
    let response = builder.send().await.expect("the second attempt succeeds");
    assert_eq!(response.status(), 200);
    assert_eq!(report(&response).attempts(), 2);
    let seen = server.await.expect("the server saw both attempts");
    assert_eq!(
        seen,
        ["POST / HTTP/1.0", "k_http10", "POST / HTTP/1.0", "k_http10"]
    );
}
