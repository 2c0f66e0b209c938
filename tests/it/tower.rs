//! The tower front end on its own: exact attempt sequences against `tower-test` mocks, and the
//! layer inside `ServiceBuilder` stacks (timeout, concurrency limit, `BoxCloneService`,
//! `tower-http`), a ledger under the layer over a hyper client and over `reqwest::Client`
//! (replay, and the ledger scope of requests without extensions). The fault cases shared with
//! the other front ends are in `front_ends.rs`.

use std::error::Error as _;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt as _;
use http_body_util::Full;
use idempotent_retry::ledger::{
    Ledger, MemoryLedger, OperationRecord, OperationStatus, ResolutionKind,
};
use idempotent_retry::reconcile::{Reconciled, Resolution, reconcile_fn};
use idempotent_retry::time::{Sleep, Sleeper};
use idempotent_retry::{
    Client, ErrorKind, FailureKind, IDEMPOTENCY_KEY, IdempotencyKey, IdempotentRetryLayer,
    LedgerScope, RetryPolicy, RetryReport,
};
use tower::util::BoxCloneService;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_test::mock;

type MockService = mock::Mock<Request<String>, Response<String>>;
type MockHandle = mock::Handle<Request<String>, Response<String>>;

/// A layer whose waits run on virtual time.
fn virtual_layer(policy: RetryPolicy) -> (IdempotentRetryLayer, VirtualTime) {
    let time = VirtualTime::new();
    let layer = Client::builder()
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .rng_seed(3)
        .build_layer()
        .expect("valid");
    (layer, time)
}

fn post(body: &str) -> Request<String> {
    Request::post("http://api.example.test/v1/charges")
        .body(body.to_owned())
        .expect("valid request")
}

fn status(code: u16) -> Response<String> {
    Response::builder()
        .status(code)
        .body(String::new())
        .expect("valid response")
}

fn key_of(request: &Request<String>) -> String {
    request
        .headers()
        .get("idempotency-key")
        .expect("every attempt carries the key")
        .to_str()
        .expect("ascii")
        .to_owned()
}

type Call = tokio::task::JoinHandle<Result<Response<String>, idempotent_retry::Error>>;

/// Spawns one call through the layer over a mock; returns its join handle and the mock handle.
fn spawn_call(layer: &IdempotentRetryLayer, request: Request<String>) -> (Call, MockHandle) {
    spawn_call_limited(layer, request, None)
}

/// [`spawn_call`] over a mock that is ready for `allowed` requests, if given; each further
/// one waits for `handle.allow(1)` (or fails readiness with `handle.send_error`).
fn spawn_call_limited(
    layer: &IdempotentRetryLayer,
    request: Request<String>,
    allowed: Option<u64>,
) -> (Call, MockHandle) {
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    if let Some(allowed) = allowed {
        handle.allow(allowed);
    }
    let mut service = layer.layer(mock);
    let call = tokio::spawn(async move { service.ready().await?.call(request).await });
    (call, handle)
}

#[tokio::test]
async fn one_key_for_the_whole_sequence_503_reset_200() {
    let (layer, time) = virtual_layer(RetryPolicy::default());
    let (call, mut handle) = spawn_call(&layer, post("amount=500"));

    let (first, reply) = handle.next_request().await.expect("attempt 1");
    let key = key_of(&first);
    assert_eq!(first.body(), "amount=500");
    reply.send_response(status(503));

    let (second, reply) = handle.next_request().await.expect("attempt 2");
    assert_eq!(key_of(&second), key);
    assert_eq!(second.body(), "amount=500");
    reply.send_error(io::Error::from(io::ErrorKind::ConnectionReset));

    let (third, reply) = handle.next_request().await.expect("attempt 3");
    assert_eq!(key_of(&third), key);
    reply.send_response(status(201));

    let response = call.await.expect("task").expect("201");
    assert_eq!(response.status(), 201);
    let report = RetryReport::from_extensions(response.extensions()).expect("report");
    assert_eq!(report.attempts(), 3);
    assert_eq!(
        report.idempotency_key().map(IdempotencyKey::as_str),
        Some(key.as_str())
    );
    let failures: Vec<_> = report.history().iter().map(|a| a.failure).collect();
    assert_eq!(
        failures,
        [
            Some(FailureKind::ServerError),
            Some(FailureKind::ConnectionReset),
            None
        ]
    );
    assert_eq!(time.slept().len(), 2);
}

#[tokio::test]
async fn an_unknown_service_error_is_final_and_kept_as_the_source() {
    let (layer, time) = virtual_layer(RetryPolicy::default());
    let (call, mut handle) = spawn_call(&layer, post(""));
    let (_, reply) = handle.next_request().await.expect("attempt 1");
    reply.send_error("the upstream pool is closed");
    let err = call.await.expect("task").expect_err("not retried");
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert_eq!(err.failure(), Some(FailureKind::Fatal));
    assert_eq!(err.attempts(), 1);
    assert!(
        err.source()
            .is_some_and(|s| s.to_string() == "the upstream pool is closed"),
        "{err:?}"
    );
    assert!(time.slept().is_empty());
}

#[tokio::test]
async fn exhausted_attempts_keep_the_last_http_response() {
    let (layer, _time) = virtual_layer(RetryPolicy::default().with_max_attempts(2));
    let (call, mut handle) = spawn_call(&layer, post(""));
    for code in [502, 504] {
        let (_, reply) = handle.next_request().await.expect("attempt");
        reply.send_response(status(code));
    }
    let mut err = call.await.expect("task").expect_err("two 5xx");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert!(err.is_outcome_unknown());
    assert!(err.take_response().is_none(), "not a reqwest::Response");
    let last = err
        .take_response_as::<Response<String>>()
        .expect("the last response, as the service's type");
    assert_eq!(last.status(), 504);
}

#[tokio::test]
async fn a_key_and_policy_in_the_extensions_are_used() {
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let key = IdempotencyKey::new("order_1234_capture").expect("valid");
    let mut request = post("");
    request.extensions_mut().insert(key.clone());
    request
        .extensions_mut()
        .insert(RetryPolicy::default().with_max_attempts(1));
    let (call, mut handle) = spawn_call(&layer, request);
    let (first, reply) = handle.next_request().await.expect("attempt 1");
    assert_eq!(key_of(&first), key.as_str());
    reply.send_response(status(503));
    let err = call.await.expect("task").expect_err("one attempt allowed");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.idempotency_key(), Some(&key));
}

#[tokio::test]
async fn a_key_header_set_by_the_caller_is_kept_and_an_invalid_one_refused() {
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let mut request = post("");
    request
        .headers_mut()
        .insert("idempotency-key", HeaderValue::from_static("caller-key-1"));
    let (call, mut handle) = spawn_call(&layer, request);
    let (first, reply) = handle.next_request().await.expect("attempt 1");
    assert_eq!(key_of(&first), "caller-key-1");
    reply.send_response(status(200));
    call.await.expect("task").expect("200");

    let mut request = post("");
    request
        .headers_mut()
        .insert("idempotency-key", HeaderValue::from_static(""));
    let (call, _handle) = spawn_call(&layer, request);
    let err = call.await.expect("task").expect_err("empty key");
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert_eq!(err.attempts(), 0);
}

#[tokio::test]
async fn a_timeout_layer_inside_bounds_each_attempt_and_the_retry_succeeds() {
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let mut service = ServiceBuilder::new()
        .layer(layer)
        .timeout(Duration::from_millis(300))
        .service(mock);
    let call = tokio::spawn(async move { service.ready().await?.call(post("")).await });
    // The first attempt is never answered: the inner timeout fires.
    let (first, hung) = handle.next_request().await.expect("attempt 1");
    let (second, reply) = handle.next_request().await.expect("attempt 2");
    assert_eq!(key_of(&first), key_of(&second));
    reply.send_response(status(200));
    let response = call.await.expect("task").expect("200");
    let report = RetryReport::from_extensions(response.extensions()).expect("report");
    assert_eq!(report.history()[0].failure, Some(FailureKind::Timeout));
    drop(hung);
}

type Body = Full<Bytes>;
type HyperResponse = Response<hyper::body::Incoming>;

/// The stack the docs recommend, boxed: compiles only if the layer, the service and its future
/// meet `ServiceBuilder`'s, `Timeout`'s, `ConcurrencyLimit`'s and `BoxCloneService`'s bounds.
fn boxed_stack(
    layer: IdempotentRetryLayer,
) -> BoxCloneService<Request<Body>, HyperResponse, BoxError> {
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Body>();
    ServiceBuilder::new()
        .layer(BoxCloneService::layer())
        .map_err(BoxError::from)
        // Outside the retry layer: an overall deadline for the whole operation.
        .timeout(Duration::from_secs(30))
        .layer(layer)
        // Inside: at most 8 attempts in flight; no permit is held while waiting to retry.
        .concurrency_limit(8)
        .layer(tower_http::set_header::SetRequestHeaderLayer::overriding(
            http::header::USER_AGENT,
            HeaderValue::from_static("stack-test"),
        ))
        .timeout(Duration::from_secs(5))
        .service(hyper)
}

#[tokio::test]
async fn the_layer_works_in_a_boxed_service_builder_stack() {
    let server =
        TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("ok")).await;
    let layer = Client::builder()
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .build_layer()
        .expect("valid");
    let service = boxed_stack(layer);
    let request = Request::post(server.url("/"))
        .body(Full::new(Bytes::from_static(b"x=1")))
        .expect("valid");
    let response = service
        .clone()
        .oneshot(request)
        .await
        .expect("third attempt");
    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 3);
    let keys = server.keys();
    assert!(
        keys[0].is_some() && keys.iter().all(|k| *k == keys[0]),
        "{keys:?}"
    );
    assert!(
        server
            .requests()
            .iter()
            .all(|r| r.header("user-agent") == Some("stack-test"))
    );
    // The boxed error downcasts to the crate's error.
    let err = service
        .oneshot(
            Request::post(format!("http://{}/", refused_addr()))
                .body(Full::new(Bytes::new()))
                .expect("valid"),
        )
        .await
        .expect_err("refused");
    let err = err
        .downcast::<idempotent_retry::Error>()
        .expect("the crate's error");
    assert_eq!(err.failure(), Some(FailureKind::Connect));
    assert!(!err.is_outcome_unknown());
}

#[test]
fn layer_and_service_are_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<IdempotentRetryLayer>();
    check::<idempotent_retry::IdempotentRetry<reqwest::Client>>();
    fn send<T: Send>(_: &T) {}
    let mut service = IdempotentRetryLayer::new().layer(reqwest::Client::new());
    let future = service.call(reqwest::Request::new(
        http::Method::GET,
        "http://127.0.0.1:9/".parse().expect("url"),
    ));
    send(&future);
}

#[test]
fn the_service_shows_its_settings_when_debug_printed() {
    let service = IdempotentRetryLayer::new().layer(reqwest::Client::new());
    let text = format!("{service:?}");
    assert!(text.contains("settings: Settings {"), "{text}");
    assert!(text.contains("idempotency-key"), "the key header: {text}");
}

#[tokio::test]
async fn every_retry_waits_for_the_inner_service_to_be_ready() {
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let (call, mut handle) = spawn_call_limited(&layer, post(""), Some(1));
    let (first, reply) = handle.next_request().await.expect("attempt 1");
    reply.send_response(status(503));
    // The retry is due at once (virtual time), but the inner service allows no second call:
    // however long the task runs, nothing is sent.
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(
        futures_util::FutureExt::now_or_never(handle.next_request()).is_none(),
        "a retry was sent to a service that was not ready"
    );
    handle.allow(1);
    let (second, reply) = handle.next_request().await.expect("attempt 2, once ready");
    assert_eq!(key_of(&first), key_of(&second));
    reply.send_response(status(200));
    call.await.expect("task").expect("200");
}

#[tokio::test]
async fn an_inner_service_that_fails_readiness_is_an_error_with_nothing_sent() {
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    handle.send_error("worker gone");
    let mut service = IdempotentRetryLayer::new().layer(mock);
    let err = service.ready().await.expect_err("not ready");
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert_eq!(err.attempts(), 0);
    assert!(!err.is_outcome_unknown());
    assert!(err.source().is_some_and(|s| s.to_string() == "worker gone"));
}

#[tokio::test(start_paused = true)]
async fn a_wait_for_readiness_is_not_counted_against_the_attempt_timeout() {
    // Paused tokio time with a mock (no sockets): the 300 ms attempt timeout would fire at
    // once if the wait for readiness ran under it.
    let (layer, _time) =
        virtual_layer(RetryPolicy::default().with_attempt_timeout(Duration::from_millis(300)));
    let (call, mut handle) = spawn_call_limited(&layer, post(""), Some(1));
    let (first, reply) = handle.next_request().await.expect("attempt 1");
    reply.send_response(status(503));
    // The inner service stays busy far longer than one attempt may take.
    tokio::time::sleep(Duration::from_secs(10)).await;
    handle.allow(1);
    let (second, reply) = handle.next_request().await.expect("attempt 2, once ready");
    assert_eq!(key_of(&first), key_of(&second));
    reply.send_response(status(200));
    let response = call.await.expect("task").expect("200");
    let report = RetryReport::from_extensions(response.extensions()).expect("report");
    let failures: Vec<_> = report.history().iter().map(|a| a.failure).collect();
    assert_eq!(failures, [Some(FailureKind::ServerError), None]);
}

#[tokio::test]
async fn a_readiness_failure_before_a_retry_is_not_an_attempt() {
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let (call, mut handle) = spawn_call_limited(&layer, post(""), Some(1));
    let (_, reply) = handle.next_request().await.expect("attempt 1");
    // 429: refused, so not executed.
    reply.send_response(status(429));
    handle.send_error("worker gone");
    let err = call.await.expect("task").expect_err("no second attempt");
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert_eq!(err.attempts(), 1, "the failed readiness check sent nothing");
    assert!(
        !err.is_outcome_unknown(),
        "only a refused attempt was sent: {err}"
    );
    assert!(err.idempotency_key().is_some());
    assert!(err.source().is_some_and(|s| s.to_string() == "worker gone"));
}

/// A header maker that mints a new key every time it is asked, as a careless layer would.
fn minting_key_maker() -> impl FnMut(&Request<String>) -> Option<HeaderValue> + Clone + Send + Sync
{
    let minted = Arc::new(AtomicU32::new(0));
    move |_: &Request<String>| {
        let n = minted.fetch_add(1, Ordering::Relaxed) + 1;
        Some(HeaderValue::from_str(&format!("minted-{n}")).expect("ascii"))
    }
}

/// Answers 503, 503, 200 and returns the key of each attempt.
async fn keys_of_three_attempts(call: Call, handle: &mut MockHandle) -> Vec<String> {
    let mut keys = Vec::new();
    for code in [503, 503, 200] {
        let (request, reply) = handle.next_request().await.expect("attempt");
        keys.push(key_of(&request));
        reply.send_response(status(code));
    }
    call.await.expect("task").expect("200");
    keys
}

#[tokio::test]
async fn no_layer_order_mints_a_key_per_attempt() {
    use tower_http::set_header::SetRequestHeaderLayer;

    // Below ours, a layer that would set the key on each request finds it already set.
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    let mut service = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(SetRequestHeaderLayer::if_not_present(
            IDEMPOTENCY_KEY,
            minting_key_maker(),
        ))
        .service(mock);
    let call = tokio::spawn(async move { service.ready().await?.call(post("")).await });
    let keys = keys_of_three_attempts(call, &mut handle).await;
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");
    assert!(!keys[0].starts_with("minted-"), "{keys:?}");

    // Above ours, it runs once per operation: its key goes out on every attempt.
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    let mut service = ServiceBuilder::new()
        .layer(SetRequestHeaderLayer::overriding(
            IDEMPOTENCY_KEY,
            minting_key_maker(),
        ))
        .layer(layer)
        .service(mock);
    let call = tokio::spawn(async move { service.ready().await?.call(post("")).await });
    let keys = keys_of_three_attempts(call, &mut handle).await;
    assert_eq!(keys, ["minted-1", "minted-1", "minted-1"]);
}

/// A sleeper whose waits never end; it says when one starts and keeps a token while it lasts.
#[derive(Debug, Clone, Default)]
struct EndlessSleeper {
    started: Arc<tokio::sync::Notify>,
    waiting: Arc<()>,
}

impl Sleeper for EndlessSleeper {
    fn sleep(&self, _duration: Duration) -> Sleep {
        let waiting = Arc::clone(&self.waiting);
        self.started.notify_one();
        Box::pin(async move {
            let _waiting = waiting;
            std::future::pending::<()>().await;
        })
    }
}

#[tokio::test]
async fn dropping_the_future_mid_wait_releases_the_wait_the_service_and_the_permit() {
    let sleeper = EndlessSleeper::default();
    let layer = Client::builder()
        .sleeper(sleeper.clone())
        .build_layer()
        .expect("valid");
    let (mock, mut handle): (MockService, MockHandle) = mock::pair();
    // Counts the clones of the inner stack that are alive.
    let token = Arc::new(());
    let held = Arc::clone(&token);
    let service = ServiceBuilder::new()
        .layer(layer)
        .concurrency_limit(1)
        .map_request(move |request: Request<String>| {
            let _ = &held;
            request
        })
        .service(mock);
    let baseline = Arc::strong_count(&token);
    let not_waiting = Arc::strong_count(&sleeper.waiting);

    let mut first = service.clone();
    let call = tokio::spawn(async move { first.ready().await?.call(post("")).await });
    let (_, reply) = handle.next_request().await.expect("attempt 1");
    reply.send_response(status(503));
    sleeper.started.notified().await;
    assert_eq!(Arc::strong_count(&sleeper.waiting), not_waiting + 1);

    // While it waits to retry, the operation holds no permit: another request gets it at once.
    let mut other = service.clone();
    let ready = futures_util::FutureExt::now_or_never(other.ready()).map(|r| r.is_ok());
    assert_eq!(
        ready,
        Some(true),
        "the waiting operation holds the only permit"
    );
    drop(other);

    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    assert_eq!(
        Arc::strong_count(&sleeper.waiting),
        not_waiting,
        "the wait was dropped"
    );
    assert_eq!(
        Arc::strong_count(&token),
        baseline,
        "the operation's copy of the service was dropped"
    );

    // The permit is free and the stack still works.
    let next = tokio::spawn(service.oneshot(post("")));
    let (_, reply) = handle.next_request().await.expect("next operation");
    reply.send_response(status(200));
    next.await.expect("task").expect("200");
}

/// Millisecond backoff, so a retry against a real socket does not slow the suite.
fn quick() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5))
}

fn hyper_client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

fn hyper_post(url: String, key: &IdempotencyKey) -> Request<Full<Bytes>> {
    let mut request = Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(br#"{"amount":1200}"#)))
        .expect("valid request");
    request.extensions_mut().insert(key.clone());
    request
}

async fn row(ledger: &dyn Ledger, key: &IdempotencyKey) -> OperationRecord {
    ledger
        .get(key.as_str())
        .await
        .expect("read the ledger")
        .expect("the operation has a row")
}

type BoxedResponse = Response<http_body_util::combinators::BoxBody<Bytes, BoxError>>;

/// A boxed response's status, whole body and report.
async fn body_of(response: BoxedResponse) -> (http::StatusCode, Bytes, RetryReport) {
    let report = RetryReport::from_extensions(response.extensions())
        .cloned()
        .expect("every response carries a report");
    let status = response.status();
    let body = response.into_body().collect().await.expect("body");
    (status, body.to_bytes(), report)
}

/// Sends one charge twice with one key through the layer over a real hyper client: the second
/// is answered from `ledger` with nothing sent.
async fn a_second_send_through_hyper_is_replayed(ledger: impl Ledger + Clone, name: &str) {
    let server = TestServer::start(
        vec![Action::json(201, r#"{"id":"ch_1"}"#)],
        Action::status(500),
    )
    .await;
    let layer = Client::builder()
        .policy(quick())
        .ledger(ledger.clone())
        .build_layer()
        .expect("valid");
    let service = ServiceBuilder::new()
        .layer(layer.box_response_body())
        .service(hyper_client());
    let key = IdempotencyKey::derive("tests.tower.hyper", &[name]);

    let first = service
        .clone()
        .oneshot(hyper_post(server.url("/v1/charges"), &key))
        .await
        .expect("sent");
    let (status, body, report) = body_of(first).await;
    assert_eq!(
        (status.as_u16(), &body[..]),
        (201, &br#"{"id":"ch_1"}"#[..]),
        "{name}"
    );
    assert!(!report.is_replayed(), "{name}");
    assert_eq!(
        row(&ledger, &key).await.status,
        OperationStatus::Succeeded,
        "{name}"
    );

    let second = service
        .oneshot(hyper_post(server.url("/v1/charges"), &key))
        .await
        .expect("replayed");
    let (status, body, report) = body_of(second).await;
    assert_eq!(
        (status.as_u16(), &body[..]),
        (201, &br#"{"id":"ch_1"}"#[..]),
        "{name}"
    );
    assert!(report.is_replayed(), "{name}: answered from the ledger");
    assert_eq!(
        server.hits(),
        1,
        "{name}: the second send never reached the server"
    );
}

#[tokio::test]
async fn a_ledger_over_a_hyper_client_replays_a_second_send_with_the_key() {
    a_second_send_through_hyper_is_replayed(MemoryLedger::new(), "memory").await;
    #[cfg(feature = "sqlite")]
    {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ledger = idempotent_retry::ledger::SqliteLedger::open(dir.path().join("operations.db"))
            .await
            .expect("open the ledger");
        a_second_send_through_hyper_is_replayed(ledger, "sqlite").await;
    }
}

#[tokio::test]
async fn a_ledger_over_hyper_incoming_is_refused_naming_the_bodies_it_rebuilds() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let layer = Client::builder()
        .ledger(ledger.clone())
        .build_layer()
        .expect("valid");
    let service = ServiceBuilder::new().layer(layer).service(hyper_client());
    let key = IdempotencyKey::derive("tests.tower.hyper", &["incoming"]);
    let err = service
        .oneshot(hyper_post(server.url("/v1/charges"), &key))
        .await
        .expect_err("hyper's Incoming cannot be rebuilt");
    assert_eq!(err.kind(), ErrorKind::Builder);
    let message = err.to_string();
    for named in [
        "http::response::Response<hyper::body::incoming::Incoming>",
        "http_body_util::Full<Bytes>",
        "http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>",
        "http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>",
        "IdempotentRetryLayer::box_response_body",
        "body.map_err(Into::into).boxed()",
        "nothing was sent",
    ] {
        assert!(message.contains(named), "{named}: {message}");
    }
    assert_eq!(server.hits(), 0);
    assert!(ledger.is_empty(), "nothing claimed");
}

fn reqwest_without_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client")
}

fn charge(url: String, key: &IdempotencyKey) -> reqwest::RequestBuilder {
    reqwest_without_redirects()
        .post(url)
        .header(IDEMPOTENCY_KEY, key.as_str())
        .body(r#"{"amount":1200}"#)
}

/// The scopes the reconcilers were asked about, by reconciler.
type Asked = Arc<std::sync::Mutex<Vec<(&'static str, String, String)>>>;

fn asking(name: &'static str, asked: &Asked) -> impl idempotent_retry::reconcile::Reconciler {
    let asked = Arc::clone(asked);
    reconcile_fn(name, move |operation| {
        asked.lock().expect("not poisoned").push((
            name,
            operation.scope.clone(),
            operation.key.clone(),
        ));
        async { Resolution::NotDone }
    })
}

#[tokio::test]
async fn requests_through_reqwest_get_the_scope_of_their_header_or_path_and_its_reconciler() {
    let server = TestServer::start(vec![Action::Reset], Action::json(201, "{}")).await;
    let ledger = MemoryLedger::new();
    let asked = Asked::default();
    let client = Client::builder()
        .policy(quick().with_max_attempts(1))
        .ledger(ledger.clone())
        .reconciler_for_scope("shop.charge", asking("charges", &asked))
        .reconciler_for_scope("shop.refund", asking("refunds", &asked))
        .build()
        .expect("valid");
    let layer = client
        .layer()
        .scope_for_path_prefix("/v1", "shop.api")
        .scope_for_path_prefix("/v1/charges", "shop.charge");
    let service = ServiceBuilder::new()
        .layer(layer)
        .service(reqwest_without_redirects());
    let key = |what: &str| IdempotencyKey::derive("tests.tower.scope", &[what]);

    // By path: the first charge's connection is reset, its outcome unknown.
    let unknown = key("unknown charge");
    let err = service
        .clone()
        .oneshot(
            charge(server.url("/v1/charges/ch_1"), &unknown)
                .build()
                .expect("request"),
        )
        .await
        .expect_err("reset, one attempt");
    assert!(err.is_outcome_unknown(), "{err}");
    let by_path = key("charge");
    service
        .clone()
        .oneshot(
            charge(server.url("/v1/charges"), &by_path)
                .build()
                .expect("request"),
        )
        .await
        .expect("sent");
    // By header, over the path's: the header is taken off before anything is sent.
    let by_header = key("refund");
    let request = charge(server.url("/v1/charges/ch_1/refunds"), &by_header)
        .header(IdempotentRetryLayer::SCOPE_HEADER, "shop.refund")
        .build()
        .expect("request");
    service.clone().oneshot(request).await.expect("sent");
    // No rule: the host.
    let by_host = key("other");
    service
        .clone()
        .oneshot(
            charge(server.url("/v2/charges"), &by_host)
                .build()
                .expect("request"),
        )
        .await
        .expect("sent");
    let under_v1 = key("v1");
    service
        .oneshot(
            charge(server.url("/v1/customers"), &under_v1)
                .build()
                .expect("request"),
        )
        .await
        .expect("sent");

    let scope = async |key: &IdempotencyKey| row(&ledger, key).await.scope;
    assert_eq!(scope(&unknown).await, "shop.charge");
    assert_eq!(scope(&by_path).await, "shop.charge");
    assert_eq!(scope(&by_header).await, "shop.refund");
    assert_eq!(scope(&by_host).await, "127.0.0.1");
    assert_eq!(scope(&under_v1).await, "shop.api");
    let requests = server.requests();
    assert_eq!(requests.len(), 5);
    assert!(
        requests.iter().all(|r| r
            .header(IdempotentRetryLayer::SCOPE_HEADER.as_str())
            .is_none()),
        "the scope header reached the server: {requests:?}"
    );

    // The unknown charge is reconciled by the charges' reconciler, and only by it.
    assert_eq!(
        row(&ledger, &unknown).await.status,
        OperationStatus::Unknown
    );
    let reconciled = client
        .reconcile(unknown.as_str())
        .await
        .expect("reconciled");
    assert_eq!(reconciled, Reconciled::Resolved(ResolutionKind::NotDone));
    assert_eq!(
        *asked.lock().expect("not poisoned"),
        [(
            "charges",
            "shop.charge".to_owned(),
            unknown.as_str().to_owned()
        )]
    );
}

#[tokio::test]
async fn the_scope_header_never_reaches_the_server_and_conflicts_are_refused() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    // Without a ledger the header means nothing, and is still taken off.
    let service = ServiceBuilder::new()
        .layer(IdempotentRetryLayer::new())
        .service(reqwest_without_redirects());
    let request = reqwest_without_redirects()
        .get(server.url("/v1/charges"))
        .header(IdempotentRetryLayer::SCOPE_HEADER, "shop.charge")
        .build()
        .expect("request");
    service.oneshot(request).await.expect("sent");
    assert_eq!(server.hits(), 1);
    assert_eq!(
        server.requests()[0].header(IdempotentRetryLayer::SCOPE_HEADER.as_str()),
        None
    );

    // An `http::Request` naming two scopes, or the header twice, is refused with nothing sent.
    let (layer, _time) = virtual_layer(RetryPolicy::default());
    let mut two = post("");
    two.headers_mut().insert(
        IdempotentRetryLayer::SCOPE_HEADER,
        HeaderValue::from_static("shop.refund"),
    );
    two.extensions_mut().insert(LedgerScope::new("shop.charge"));
    let mut twice = post("");
    for scope in ["a", "b"] {
        twice.headers_mut().append(
            IdempotentRetryLayer::SCOPE_HEADER,
            HeaderValue::from_static(scope),
        );
    }
    for (request, says) in [
        (two, "two different ledger scopes"),
        (twice, "more than once"),
    ] {
        let (call, mut handle) = spawn_call(&layer, request);
        let err = call.await.expect("task").expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::Builder);
        assert!(err.to_string().contains(says), "{err}");
        assert_eq!(err.attempts(), 0);
        // The call is over and its service dropped: the mock saw no request.
        assert!(handle.next_request().await.is_none(), "nothing sent");
    }
}
