//! The spans as an OpenTelemetry backend receives them: `tracing-opentelemetry` exporting to
//! `opentelemetry_sdk`'s in-memory exporter, against loopback servers.
//!
//! One operation is one INTERNAL `idempotent_request` span; every request on the wire (each
//! attempt, and each redirect hop inside one) is a CLIENT child span named after its method,
//! with the HTTP client conventions' attributes and `http.request.resend_count` from the
//! operation's second request on. A ledger replay sends nothing, so it has no CLIENT span.
//!
//! One global subscriber per test binary (tracing caches per-callsite interest process-wide);
//! each test finds its own operations by their key, which the clients put in the span.

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use idempotent_retry::ledger::MemoryLedger;
use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use support::*;
use tracing_subscriber::layer::SubscriberExt as _;

/// The exporter behind the binary's one global subscriber.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("idempotent_retry=trace"))
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("otel_spans")));
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        #[cfg(feature = "opentelemetry")]
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        exporter
    })
}

/// One exported operation: its INTERNAL span and its CLIENT children, in the order sent.
struct Operation {
    span: SpanData,
    requests: Vec<SpanData>,
}

/// A span attribute as text (numbers printed), `None` when absent.
fn attr(span: &SpanData, name: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == name)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The operations whose span carries `key`, in the order they started, each with its children
/// ordered by resend count (the first request has none).
fn operations(key: &str) -> Vec<Operation> {
    let spans = exporter().get_finished_spans().expect("in-memory spans");
    let mut found: Vec<Operation> = spans
        .iter()
        .filter(|s| attr(s, "idempotent_retry.idempotency_key").as_deref() == Some(key))
        .map(|op| {
            let mut requests: Vec<SpanData> = spans
                .iter()
                .filter(|s| s.parent_span_id == op.span_context.span_id())
                .filter(|s| s.span_kind == SpanKind::Client)
                .cloned()
                .collect();
            requests.sort_by_key(resend_count);
            Operation {
                span: op.clone(),
                requests,
            }
        })
        .collect();
    found.sort_by_key(|op| op.span.start_time);
    found
}

fn resend_count(span: &SpanData) -> u32 {
    attr(span, "http.request.resend_count").map_or(0, |n| n.parse().expect("a count"))
}

/// A client builder with the key in spans and millisecond backoff, its spans exported.
fn builder() -> idempotent_retry::ClientBuilder {
    exporter();
    Client::builder().key_in_spans(true).policy(
        RetryPolicy::default()
            .with_base_delay(Duration::from_millis(1))
            .with_max_delay(Duration::from_millis(5)),
    )
}

fn client() -> Client {
    builder().build().expect("valid")
}

/// Sends one keyed POST to `server` through the tower front end, keyed `key`.
#[cfg(feature = "tower")]
async fn through_tower(server: &TestServer, key: &'static str) {
    use tower::ServiceExt as _;

    let layer = builder().build_layer().expect("valid");
    let service = tower::Layer::layer(&layer, reqwest::Client::new());
    let mut request = reqwest::Request::new(
        http::Method::POST,
        server.url("/v1/charges").parse().expect("url"),
    );
    request.headers_mut().insert(
        idempotent_retry::IDEMPOTENCY_KEY,
        http::HeaderValue::from_static(key),
    );
    service.oneshot(request).await.expect("answered");
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("valid key")
}

/// The attributes every CLIENT span carries, checked against the server it went to.
fn assert_request_span(span: &SpanData, server: &TestServer, path: &str) {
    assert_eq!(span.span_kind, SpanKind::Client, "{span:#?}");
    assert_eq!(span.name, "POST");
    assert_eq!(attr(span, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(attr(span, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        attr(span, "server.port"),
        Some(server.addr().port().to_string())
    );
    assert_eq!(attr(span, "url.full"), Some(server.url(path)));
}

#[tokio::test]
async fn an_operation_with_two_retries_is_one_internal_span_with_three_client_children() {
    let server = TestServer::start(
        vec![Action::status(503), Action::status(503)],
        Action::ok("done"),
    )
    .await;
    let response = client()
        .post(server.url("/v1/charges"))
        .idempotency_key(key("otel_503_503_200"))
        .body("{}")
        .send()
        .await
        .expect("the third attempt answers");
    assert_eq!(response.status(), 200);

    let [op] = &operations("otel_503_503_200")[..] else {
        panic!("one operation span");
    };
    assert_eq!(op.span.name, "idempotent_request");
    assert_eq!(op.span.span_kind, SpanKind::Internal);
    assert_eq!(op.span.status, Status::Unset);
    assert_eq!(
        attr(&op.span, "http.request.method").as_deref(),
        Some("POST")
    );
    assert_eq!(
        attr(&op.span, "server.address").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(
        attr(&op.span, "idempotent_retry.attempts").as_deref(),
        Some("3")
    );
    assert_eq!(
        attr(&op.span, "idempotent_retry.outcome").as_deref(),
        Some("done")
    );
    assert_eq!(
        attr(&op.span, "idempotent_retry.stop_reason").as_deref(),
        Some("answered")
    );

    assert_eq!(op.requests.len(), 3, "one CLIENT span per attempt");
    let counts: Vec<Option<String>> = op
        .requests
        .iter()
        .map(|s| attr(s, "http.request.resend_count"))
        .collect();
    assert_eq!(counts, [None, Some("1".into()), Some("2".into())]);
    let statuses: Vec<Option<String>> = op
        .requests
        .iter()
        .map(|s| attr(s, "http.response.status_code"))
        .collect();
    assert_eq!(
        statuses,
        [Some("503".into()), Some("503".into()), Some("200".into())]
    );
    for span in &op.requests {
        assert_request_span(span, &server, "/v1/charges");
        assert_eq!(
            attr(span, "network.protocol.version").as_deref(),
            Some("1.1")
        );
        assert_eq!(
            span.span_context.trace_id(),
            op.span.span_context.trace_id()
        );
    }
    for failed in &op.requests[..2] {
        assert_eq!(attr(failed, "error.type").as_deref(), Some("503"));
        assert!(matches!(failed.status, Status::Error { .. }), "{failed:#?}");
    }
    assert_eq!(attr(&op.requests[2], "error.type"), None);
    assert_eq!(op.requests[2].status, Status::Unset);

    // Each backoff wait is an event on the operation span, with its delay and reason.
    let waits: Vec<_> = op
        .span
        .events
        .iter()
        .filter(|e| e.name == "attempt failed, retrying with the same key")
        .collect();
    assert_eq!(waits.len(), 2, "{:#?}", op.span.events);
    for (n, wait) in waits.iter().enumerate() {
        let field = |name: &str| {
            wait.attributes
                .iter()
                .find(|kv| kv.key.as_str() == name)
                .map(|kv| kv.value.as_str().into_owned())
        };
        assert_eq!(field("attempt"), Some((n + 1).to_string()));
        assert_eq!(field("outcome").as_deref(), Some("server_error"));
        assert!(field("delay_ms").is_some(), "{wait:#?}");
        assert!(field("why").is_some(), "{wait:#?}");
    }
}

#[tokio::test]
async fn a_reset_is_an_attempt_span_with_its_error_type_and_no_status() {
    let server = TestServer::start(vec![Action::Reset], Action::ok("done")).await;
    client()
        .post(server.url("/v1/charges"))
        .idempotency_key(key("otel_reset"))
        .body("{}")
        .send()
        .await
        .expect("the retry answers");
    let [op] = &operations("otel_reset")[..] else {
        panic!("one operation span");
    };
    let [reset, answered] = &op.requests[..] else {
        panic!("two CLIENT spans: {:#?}", op.requests);
    };
    assert_request_span(reset, &server, "/v1/charges");
    assert_eq!(
        attr(reset, "error.type").as_deref(),
        Some("connection_reset")
    );
    assert_eq!(attr(reset, "http.response.status_code"), None);
    assert_eq!(attr(reset, "http.request.resend_count"), None);
    assert!(matches!(reset.status, Status::Error { .. }));
    assert_eq!(
        attr(answered, "http.request.resend_count").as_deref(),
        Some("1")
    );
    assert_eq!(
        attr(answered, "http.response.status_code").as_deref(),
        Some("200")
    );
}

/// A redirect hop is a request on the wire of its own: its own CLIENT span, and a resend.
#[tokio::test]
async fn a_redirect_hop_is_a_client_span_and_a_resend() {
    let server = TestServer::start(
        vec![
            Action::status(503),
            Action::status_with(307, &[("Location", "/v1/moved")]),
        ],
        Action::ok("done"),
    )
    .await;
    client()
        .post(server.url("/v1/charges"))
        .idempotency_key(key("otel_redirect"))
        .body("{}")
        .send()
        .await
        .expect("the hop answers");
    let [op] = &operations("otel_redirect")[..] else {
        panic!("one operation span");
    };
    assert_eq!(
        attr(&op.span, "idempotent_retry.attempts").as_deref(),
        Some("2"),
        "the hop is inside the second attempt"
    );
    let [first, redirected, hop] = &op.requests[..] else {
        panic!("three CLIENT spans: {:#?}", op.requests);
    };
    assert_request_span(first, &server, "/v1/charges");
    assert_request_span(redirected, &server, "/v1/charges");
    assert_request_span(hop, &server, "/v1/moved");
    assert_eq!(
        attr(redirected, "http.response.status_code").as_deref(),
        Some("307")
    );
    assert_eq!(redirected.status, Status::Unset);
    assert_eq!(
        attr(redirected, "http.request.resend_count").as_deref(),
        Some("1")
    );
    assert_eq!(attr(hop, "http.request.resend_count").as_deref(), Some("2"));
    assert_eq!(
        attr(hop, "http.response.status_code").as_deref(),
        Some("200")
    );
}

/// An operation continued after a redirect its caller followed sends only the hop: one CLIENT
/// span, for the hop's URL, not a resend.
#[tokio::test]
async fn a_continued_operation_has_one_client_span_for_the_hop() {
    let server = TestServer::start(vec![], Action::ok("done")).await;
    client()
        .post(server.url("/v1/charges"))
        .idempotency_key(key("otel_after_redirect"))
        .body("{}")
        .after_redirect(
            http::StatusCode::PERMANENT_REDIRECT,
            server.url("/v1/charges/").parse().expect("url"),
        )
        .send()
        .await
        .expect("the hop answers");
    let [op] = &operations("otel_after_redirect")[..] else {
        panic!("one operation span");
    };
    let [hop] = &op.requests[..] else {
        panic!("one CLIENT span: {:#?}", op.requests);
    };
    assert_request_span(hop, &server, "/v1/charges/");
    assert_eq!(attr(hop, "http.request.resend_count"), None);
    assert_eq!(
        attr(hop, "http.response.status_code").as_deref(),
        Some("200")
    );
}

/// A replay from the ledger sends nothing: an operation span, and no CLIENT span.
#[tokio::test]
async fn a_ledger_replay_has_no_client_span() {
    exporter();
    let server = TestServer::start_idempotent(vec![], Action::ok("done")).await;
    let client = Client::builder()
        .key_in_spans(true)
        .ledger(MemoryLedger::new())
        .build()
        .expect("valid");
    for _ in 0..2 {
        client
            .post(server.url("/v1/charges"))
            .idempotency_key(key("otel_replay"))
            .body("{}")
            .send()
            .await
            .expect("done, then replayed");
    }
    assert_eq!(server.hits(), 1);
    let [sent, replayed] = &operations("otel_replay")[..] else {
        panic!("two operation spans");
    };
    assert_eq!(sent.requests.len(), 1);
    assert_eq!(
        attr(&sent.span, "idempotent_retry.stop_reason").as_deref(),
        Some("answered")
    );
    assert!(replayed.requests.is_empty(), "{:#?}", replayed.requests);
    assert_eq!(replayed.span.span_kind, SpanKind::Internal);
    assert_eq!(
        attr(&replayed.span, "idempotent_retry.attempts").as_deref(),
        Some("0")
    );
    assert_eq!(
        attr(&replayed.span, "idempotent_retry.outcome").as_deref(),
        Some("done")
    );
    assert_eq!(
        attr(&replayed.span, "idempotent_retry.stop_reason").as_deref(),
        Some("replayed")
    );
}

/// An operation without an answer is an error span, and says whether it may have run.
#[tokio::test]
async fn failed_operations_say_unknown_or_not_done_and_why_they_stopped() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    client()
        .post(server.url("/v1/charges"))
        .idempotency_key(key("otel_unknown"))
        .policy(RetryPolicy::default().with_max_attempts(2))
        .send()
        .await
        .expect_err("503 twice");
    let [op] = &operations("otel_unknown")[..] else {
        panic!("one operation span");
    };
    assert!(matches!(op.span.status, Status::Error { .. }));
    assert_eq!(
        attr(&op.span, "idempotent_retry.outcome").as_deref(),
        Some("unknown")
    );
    assert_eq!(
        attr(&op.span, "idempotent_retry.stop_reason").as_deref(),
        Some("attempts_exhausted")
    );

    let refused = refused_addr();
    client()
        .post(format!("http://{refused}/v1/charges"))
        .idempotency_key(key("otel_not_done"))
        .policy(RetryPolicy::default().with_max_attempts(2))
        .send()
        .await
        .expect_err("nothing listens");
    let [op] = &operations("otel_not_done")[..] else {
        panic!("one operation span");
    };
    assert_eq!(
        attr(&op.span, "idempotent_retry.outcome").as_deref(),
        Some("not_done")
    );
    let types: Vec<Option<String>> = op.requests.iter().map(|s| attr(s, "error.type")).collect();
    assert_eq!(types, [Some("connect".into()), Some("connect".into())]);
}

/// `url.full` never carries the credentials a URL may hold, nor its query values. (reqwest moves
/// a URL's user name and password into an `Authorization` header before the request exists;
/// the `REDACTED:REDACTED` form for a URL that keeps them is unit-tested in
/// `src/message/url.rs`.)
#[tokio::test]
async fn url_full_is_redacted() {
    let server = TestServer::start(vec![], Action::ok("done")).await;
    let port = server.addr().port();
    client()
        .post(format!(
            "http://user:hunter2@127.0.0.1:{port}/v1/charges?api_key=sk_live_1&limit=3"
        ))
        .idempotency_key(key("otel_redacted"))
        .send()
        .await
        .expect("answered");
    let [op] = &operations("otel_redacted")[..] else {
        panic!("one operation span");
    };
    assert_eq!(
        attr(&op.requests[0], "url.full"),
        Some(format!(
            "http://127.0.0.1:{port}/v1/charges?api_key=REDACTED&limit=REDACTED"
        ))
    );
    let exported = format!("{:?}", operations("otel_redacted")[0].requests);
    assert!(!exported.contains("hunter2") && !exported.contains("sk_live_1"));
}

/// The tower front end runs the same engine: the same spans.
#[cfg(feature = "tower")]
#[tokio::test]
async fn the_tower_service_exports_the_same_spans() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
    through_tower(&server, "otel_tower").await;
    let [op] = &operations("otel_tower")[..] else {
        panic!("one operation span");
    };
    let [first, second] = &op.requests[..] else {
        panic!("two CLIENT spans: {:#?}", op.requests);
    };
    assert_request_span(first, &server, "/v1/charges");
    assert_eq!(attr(first, "error.type").as_deref(), Some("503"));
    assert_eq!(
        attr(second, "http.request.resend_count").as_deref(),
        Some("1")
    );
}

/// The middleware leaves each attempt's client span to `reqwest-tracing` under it: no request
/// gets two.
#[cfg(feature = "middleware")]
#[tokio::test]
async fn the_middleware_opens_no_client_span() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
    let retry = builder().build_middleware().expect("valid");
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(retry)
        .build();
    client
        .post(server.url("/v1/charges"))
        .header("Idempotency-Key", "otel_middleware")
        .send()
        .await
        .expect("answered");
    let [op] = &operations("otel_middleware")[..] else {
        panic!("one operation span");
    };
    assert_eq!(
        attr(&op.span, "idempotent_retry.attempts").as_deref(),
        Some("2")
    );
    assert!(op.requests.is_empty(), "{:#?}", op.requests);
}

/// Feature `opentelemetry`: each attempt carries the `traceparent` of its own CLIENT span.
#[cfg(feature = "opentelemetry")]
mod propagation {
    use super::*;

    /// The `traceparent` each CLIENT span would write (sampled).
    fn traceparent(span: &SpanData) -> String {
        format!(
            "00-{}-{}-01",
            span.span_context.trace_id(),
            span.span_context.span_id()
        )
    }

    #[tokio::test]
    async fn each_attempt_of_the_client_carries_its_own_span_context() {
        let server = TestServer::start(
            vec![
                Action::status(503),
                Action::status_with(307, &[("Location", "/v1/moved")]),
            ],
            Action::ok("done"),
        )
        .await;
        client()
            .post(server.url("/v1/charges"))
            .idempotency_key(key("otel_traceparent"))
            .body("{}")
            .send()
            .await
            .expect("answered");
        let [op] = &operations("otel_traceparent")[..] else {
            panic!("one operation span");
        };
        let sent: Vec<Option<String>> = server
            .requests()
            .iter()
            .map(|r| r.header("traceparent").map(str::to_owned))
            .collect();
        let expected: Vec<Option<String>> =
            op.requests.iter().map(|s| Some(traceparent(s))).collect();
        assert_eq!(sent.len(), 3, "two attempts, one of them redirected");
        assert_eq!(sent, expected);
    }

    #[cfg(feature = "tower")]
    #[tokio::test]
    async fn each_attempt_of_the_tower_service_carries_its_own_span_context() {
        let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
        through_tower(&server, "otel_tower_traceparent").await;
        let [op] = &operations("otel_tower_traceparent")[..] else {
            panic!("one operation span");
        };
        let sent: Vec<Option<String>> = server
            .requests()
            .iter()
            .map(|r| r.header("traceparent").map(str::to_owned))
            .collect();
        let expected: Vec<Option<String>> =
            op.requests.iter().map(|s| Some(traceparent(s))).collect();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent, expected);
    }
}
