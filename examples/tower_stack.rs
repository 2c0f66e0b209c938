//! The retry layer in a tower `ServiceBuilder` stack over a hyper client.
//!
//! Run it with `cargo run --example tower_stack --features tower`. The stack, outside in:
//!
//! 1. `BoxCloneService`: one nameable, cloneable type for the whole stack;
//! 2. `timeout(30 s)`: an overall deadline for a logical request, waits included;
//! 3. `IdempotentRetryLayer`: one key per logical request, settled before the first attempt,
//!    retries by the crate's rules;
//! 4. `concurrency_limit(4)`: at most four attempts in flight; no permit is held while a
//!    retry waits;
//! 5. `SetRequestHeaderLayer`: a `User-Agent` on every attempt;
//! 6. a hyper client, taking `http::Request<Full<Bytes>>`.
//!
//! The receiver (the crate's `testkit::Receiver`, on 127.0.0.1) resets the first attempt after sending
//! the email, then answers 503: the third attempt meets the saved response, and exactly one
//! email is sent.
//!
//! Then the same layer over `reqwest::Client`, built to follow no redirect (below the layer
//! it would follow them with the key, to any origin), with a ledger: the row's scope comes
//! from the layer's rule for the path `/v1/refunds`, and a second send with the key is
//! answered from the ledger, nothing sent. (Over the hyper client, a ledger needs the body
//! boxed: `layer.box_response_body()`.)

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use idempotent_retry::ledger::{Ledger, MemoryLedger};
use idempotent_retry::observe::{AttemptEvent, OperationEvent};
use idempotent_retry::{
    Client, IDEMPOTENCY_KEY, IdempotencyKey, IdempotentRetryLayer, Observer, RetryPolicy,
    RetryReport,
};
use idempotent_retry_testkit::{Fault, Receiver, When};
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_http::set_header::SetRequestHeaderLayer;

/// Counts retries for a metrics system; here it only prints.
#[derive(Debug, Default)]
struct Metrics {
    retries: AtomicU32,
}

impl Observer for Metrics {
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        if let (Some(failure), Some(delay)) = (event.failure, event.delay) {
            self.retries.fetch_add(1, Ordering::Relaxed);
            println!(
                "  attempt {} failed ({failure}), next in {delay:?}",
                event.attempt
            );
        }
    }

    fn on_operation(&self, event: &OperationEvent<'_>) {
        println!(
            "  operation done: {} attempt(s), error {:?}, outcome unknown {}",
            event.attempts, event.error, event.outcome_unknown
        );
    }
}

type Stack = BoxCloneService<Request<Full<Bytes>>, Response<Incoming>, BoxError>;

fn stack(layer: IdempotentRetryLayer) -> Stack {
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    ServiceBuilder::new()
        .layer(BoxCloneService::layer())
        .map_err(BoxError::from)
        .timeout(Duration::from_secs(30))
        .layer(layer)
        .concurrency_limit(4)
        .layer(SetRequestHeaderLayer::overriding(
            http::header::USER_AGENT,
            HeaderValue::from_static("tower-stack-example/1"),
        ))
        .service(hyper)
}

/// A loopback address nothing listens on: bound, then released.
fn closed_port_url() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(format!("http://{}/v1/emails", listener.local_addr()?))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let server = Receiver::start().await?;
    let layer = Client::builder()
        .policy(
            RetryPolicy::default()
                .with_max_attempts(4)
                .with_base_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(200))
                .with_attempt_timeout(Duration::from_secs(2)),
        )
        .observer(Metrics::default())
        .build_layer()?;
    let service = stack(layer);

    // The email is sent by the first attempt, whose answer is lost; the second meets a 503.
    server.inject(When::request(1), Fault::ResetAfterCommit);
    server.inject(When::request(2), Fault::status(503));

    let key = IdempotencyKey::derive("example.send_email", &["order-1042"]);
    let mut request = Request::post(server.url("/v1/emails"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"to":"ada@example.com","subject":"Your receipt"}"#,
        )))?;
    // The key for this request only; without it, a POST gets a random key.
    request.extensions_mut().insert(key.clone());

    println!("POST /v1/emails through the stack:");
    let response = service.clone().oneshot(request).await?;
    let report = RetryReport::from_extensions(response.extensions())
        .cloned()
        .ok_or("every response carries a report")?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    println!(
        "{status} after {} attempts, key {}: {}",
        report.attempts(),
        key,
        String::from_utf8_lossy(&body)
    );
    for line in server.log() {
        println!("  server #{}: {line}", line.number);
    }
    assert_eq!(report.attempts(), 3);
    assert_eq!(server.effects_for(key.as_str()), 1, "exactly one email");

    // Nothing listens: the boxed error is the crate's error, and it says nothing was executed.
    let refused = Request::post(closed_port_url()?).body(Full::new(Bytes::new()))?;
    let err = service
        .oneshot(refused)
        .await
        .expect_err("nothing listens there");
    let err = err
        .downcast::<idempotent_retry::Error>()
        .map_err(|_| "the crate's error")?;
    println!(
        "refused: {err} (outcome unknown: {})",
        err.is_outcome_unknown()
    );
    assert!(!err.is_outcome_unknown());

    refund_through_reqwest(&server).await
}

/// The layer over `reqwest::Client` with a ledger: the refund's row is scoped by the layer's
/// rule for its path, and a second send with the key is answered from the ledger.
async fn refund_through_reqwest(server: &Receiver) -> Result<(), BoxError> {
    let ledger = MemoryLedger::new();
    let layer = Client::builder()
        .ledger(ledger.clone())
        .build_layer()?
        .scope_for_path_prefix("/v1/refunds", "shop.refund");
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let service = ServiceBuilder::new().layer(layer).service(http.clone());
    let key = IdempotencyKey::derive("example.refund", &["order-1042"]);
    let refund = || {
        http.post(server.url("/v1/refunds"))
            .header(IDEMPOTENCY_KEY, key.as_str())
            .json(&serde_json::json!({"order": "order-1042", "amount": 1200}))
            .build()
    };

    println!("POST /v1/refunds twice through reqwest, with a ledger:");
    let first = service.clone().oneshot(refund()?).await?;
    let second = service.oneshot(refund()?).await?;
    let replayed = RetryReport::of(&second).is_some_and(RetryReport::is_replayed);
    let row = ledger
        .get(key.as_str())
        .await?
        .ok_or("the refund has a row")?;
    println!(
        "  {} then {} (replayed from the ledger: {replayed}); row scope {:?}",
        first.status(),
        second.status(),
        row.scope
    );
    assert!(replayed);
    assert_eq!(row.scope, "shop.refund");
    assert_eq!(server.effects_for(key.as_str()), 1, "exactly one refund");
    Ok(())
}
