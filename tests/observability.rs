//! Observability in the log: a `tracing` span per operation (method, host, and the key when
//! asked for) and an event per attempt (number, outcome class, delay and why). The spans as an
//! OpenTelemetry exporter sees them are in `otel_spans.rs`.
//!
//! The log is captured by one global subscriber (`support::logs`); each test finds its own
//! lines by its unique key, which its client puts in the span (`key_in_spans`).

mod support;

use std::time::Duration;

use idempotent_retry::ledger::MemoryLedger;
use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
use support::*;

fn client() -> Client {
    Client::builder()
        .key_in_spans(true)
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .build()
        .expect("valid")
}

#[tokio::test]
async fn each_attempt_emits_an_event_inside_the_operation_span() {
    capture_log();
    let server = TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("")).await;
    let key = IdempotencyKey::new("evt_trace_1").expect("valid");
    client()
        .post(server.url("/"))
        .idempotency_key(key)
        .send()
        .await
        .expect("ok");
    let lines = log_lines_with("evt_trace_1");
    let retries: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("retrying with the same key"))
        .collect();
    assert_eq!(retries.len(), 2, "{lines:#?}");
    assert!(retries[0].contains("attempt=1") && retries[0].contains("server_error"));
    assert!(retries[1].contains("attempt=2") && retries[1].contains("connection_reset"));
    for line in &retries {
        assert!(
            line.contains("idempotent_request"),
            "inside the span: {line}"
        );
        assert!(
            line.contains("http.request.method=POST"),
            "the span names the method: {line}"
        );
        assert!(
            line.contains("server.address=\"127.0.0.1\""),
            "the span names the host: {line}"
        );
        assert!(line.contains("delay_ms="), "the delay is logged: {line}");
        assert!(line.contains("why="), "the reason is logged: {line}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("final response") && l.contains("attempt=3")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn a_failed_operation_ends_with_a_warning() {
    capture_log();
    let server = TestServer::start(vec![], Action::status(503)).await;
    let key = IdempotencyKey::new("evt_trace_2").expect("valid");
    client()
        .post(server.url("/"))
        .idempotency_key(key)
        .policy(RetryPolicy::default().with_max_attempts(1))
        .send()
        .await
        .expect_err("503");
    let lines = log_lines_with("evt_trace_2");
    assert!(
        lines.iter().any(|l| l.contains("WARN")
            && l.contains("operation stopped")
            && l.contains("outcome_unknown=true")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn a_422_on_a_keyed_request_is_logged_as_an_error() {
    capture_log();
    let server = TestServer::start(vec![], Action::status(422)).await;
    let key = IdempotencyKey::new("evt_trace_3").expect("valid");
    let response = client()
        .post(server.url("/"))
        .idempotency_key(key)
        .send()
        .await
        .expect("final");
    assert_eq!(response.status(), 422);
    let lines = log_lines_with("evt_trace_3");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("reused with a different payload")),
        "{lines:#?}"
    );
}

#[tokio::test]
async fn a_422_on_a_derived_or_header_key_is_logged_as_key_reuse_at_error() {
    capture_log();
    let server = TestServer::start(vec![], Action::status(422)).await;
    let derived = IdempotencyKey::derive("evt_trace_derived", &["order-7"]);
    let response = client()
        .post(server.url("/"))
        .idempotency_key(derived.clone())
        .send()
        .await
        .expect("final");
    assert_eq!(response.status(), 422);
    let response = client()
        .post(server.url("/"))
        .header("idempotency-key", "evt_trace_header")
        .send()
        .await
        .expect("final");
    assert_eq!(response.status(), 422);
    for key in [derived.as_str(), "evt_trace_header"] {
        let lines = log_lines_with(key);
        assert!(
            lines.iter().any(|l| l.contains("ERROR")
                && l.contains(
                    "422 on a keyed request: the key was reused with a different payload"
                )),
            "{key}: {lines:#?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("automatic key")),
            "{key}: {lines:#?}"
        );
    }
}

#[tokio::test]
async fn a_422_on_an_automatic_key_is_a_rejected_request_at_warn_not_key_reuse() {
    capture_log();
    let server = TestServer::start(vec![], Action::status(422)).await;
    let response = client().post(server.url("/")).send().await.expect("final");
    assert_eq!(response.status(), 422);
    let keys = server.keys();
    let [Some(key)] = keys.as_slice() else {
        panic!("one attempt with an automatic key on a POST: {keys:?}");
    };
    let lines = log_lines_with(key);
    assert!(
        lines.iter().any(|l| l.contains("WARN")
            && l.contains(
                "422 on a request with an automatic key: the server rejected the request"
            )
            && l.contains("check the payload")),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("ERROR") || l.contains("reused with a different payload")),
        "a minted key cannot have been reused: {lines:#?}"
    );
}

#[tokio::test]
async fn bodies_and_auth_headers_are_never_logged() {
    capture_log();
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let key = IdempotencyKey::new("evt_trace_4").expect("valid");
    client()
        .post(server.url("/"))
        .idempotency_key(key)
        .bearer_auth("sk_live_secret_token")
        .json(&serde_json::json!({"card": "4242424242424242"}))
        .send()
        .await
        .expect("ok");
    assert!(!log_lines_with("evt_trace_4").is_empty());
    assert!(log_lines_with("sk_live_secret_token").is_empty());
    assert!(log_lines_with("4242424242424242").is_empty());
}

/// The tower front end runs the same engine: the same span and events.
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_tower_service_emits_the_same_span_and_events() {
    use tower::ServiceExt;

    capture_log();
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let layer = Client::builder()
        .key_in_spans(true)
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .build_layer()
        .expect("valid");
    let service = tower::Layer::layer(&layer, reqwest::Client::new());
    let mut request =
        reqwest::Request::new(http::Method::POST, server.url("/").parse().expect("url"));
    request.headers_mut().insert(
        idempotent_retry::IDEMPOTENCY_KEY,
        http::HeaderValue::from_static("evt_trace_tower"),
    );
    service.oneshot(request).await.expect("ok");
    let lines = log_lines_with("evt_trace_tower");
    assert!(
        lines.iter().any(|l| l.contains("idempotent_request")
            && l.contains("attempt=1")
            && l.contains("server_error")
            && l.contains("retrying with the same key")),
        "{lines:#?}"
    );
}

/// With a ledger, the claim before the first attempt and the replay or refusal it decides are
/// logged inside the operation's span too, with its method, host and key.
#[tokio::test]
async fn ledger_events_are_inside_the_operation_span() {
    capture_log();
    let server = TestServer::start_idempotent(vec![Action::status(503)], Action::ok("done")).await;
    let client = Client::builder()
        .key_in_spans(true)
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .ledger(MemoryLedger::new())
        .build()
        .expect("valid");
    let key = IdempotencyKey::new("evt_trace_ledger").expect("valid");
    let send = |body: &'static str| {
        client
            .post(server.url("/"))
            .idempotency_key(key.clone())
            .policy(RetryPolicy::default().with_max_attempts(1))
            .body(body)
            .send()
    };
    send("a")
        .await
        .expect_err("503, one attempt: outcome unknown");
    send("a").await.expect("resumed from the ledger");
    send("a").await.expect("replayed from the ledger");
    send("b")
        .await
        .expect_err("the key is reused for another body");
    let lines = log_lines_with("evt_trace_ledger");
    let span = r#"idempotent_request{otel.kind="internal" http.request.method=POST server.address="127.0.0.1" idempotent_retry.idempotency_key="evt_trace_ledger"}"#;
    for message in [
        "resuming an operation recorded in the ledger",
        "replayed the saved response; no request sent",
        "idempotency key reused for a different request",
    ] {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(message)).collect();
        assert_eq!(found.len(), 1, "{message}: {lines:#?}");
        assert!(found[0].contains(span), "inside the span: {}", found[0]);
    }
}

/// Unless the client asks for it, the span does not carry the key (a derived key may reveal
/// its inputs to every trace backend); the events that end a failed operation still name it.
#[tokio::test]
async fn the_span_carries_the_key_only_when_asked() {
    capture_log();
    let server = TestServer::start(vec![Action::status(503)], Action::status(503)).await;
    let key = IdempotencyKey::new("evt_trace_no_key").expect("valid");
    Client::builder()
        .policy(
            RetryPolicy::default()
                .with_max_attempts(2)
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .build()
        .expect("valid")
        .post(server.url("/"))
        .idempotency_key(key)
        .send()
        .await
        .expect_err("503 twice");
    let lines = log_lines_with("evt_trace_no_key");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("operation stopped") && l.contains("key=\"evt_trace_no_key\"")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("idempotent_retry.idempotency_key")),
        "{lines:#?}"
    );
}
