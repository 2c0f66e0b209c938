//! The retry middleware in a `reqwest-middleware` client.
//!
//! Run it with `cargo run --example middleware --features middleware`. The chain, outside in:
//!
//! 1. `IdempotentRetryMiddleware`: one key per logical request, retries by the crate's rules;
//! 2. an attempt logger standing where `reqwest-tracing`'s `TracingMiddleware` would go: below
//!    the retry middleware, so it sees (and would trace) every attempt;
//! 3. the reqwest client.
//!
//! The receiver (the crate's `testkit::Receiver`, on 127.0.0.1) answers 429 with `Retry-After: 1`
//! once, then takes the request: two attempts, one email. The middleware keeps an operation
//! ledger, so the same request sent again (a redelivered job) is answered from it: nothing goes
//! down the chain.

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use http::Extensions;
use idempotent_retry::ledger::MemoryLedger;
use idempotent_retry::{Client, Error, IdempotencyKey, LedgerScope, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{Fault, Receiver, When};
use reqwest_middleware::{ClientBuilder, Middleware, Next};

/// Prints each attempt as it goes down the chain.
struct AttemptLogger(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Middleware for AttemptLogger {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let n = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        let key = request
            .headers()
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        let result = next.run(request, extensions).await;
        match &result {
            Ok(response) => println!("  attempt {n} key={key}: {}", response.status()),
            Err(err) => println!("  attempt {n} key={key}: {err}"),
        }
        result
    }
}

/// A loopback address nothing listens on: bound, then released.
fn closed_port_url() -> std::io::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(format!("http://{}/v1/emails", listener.local_addr()?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn StdError>> {
    let server = Receiver::start().await?;
    let retry = Client::builder()
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(20))
                .with_max_delay(Duration::from_millis(200))
                .with_attempt_timeout(Duration::from_secs(2)),
        )
        .ledger(MemoryLedger::new())
        .build_middleware()?;
    let attempts = Arc::new(AtomicU32::new(0));
    let client = ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
        .with(retry)
        .with(AttemptLogger(attempts.clone()))
        .build();

    server.inject(When::request(1), Fault::retry_after_secs(429, 1));
    let key = IdempotencyKey::derive("example.send_email", &["ticket-77"]);
    let email = serde_json::json!({"to": "ada@example.com", "subject": "Ticket 77 closed"});
    let send = || {
        client
            .post(server.url("/v1/emails"))
            .json(&email)
            .with_extension(key.clone())
            .with_extension(LedgerScope::new("example.send_email"))
            .send()
    };
    println!("POST /v1/emails through the middleware:");
    let response = send().await?;
    let report = RetryReport::of(&response)
        .cloned()
        .ok_or("every response carries a report")?;
    println!(
        "{} after {} attempts, waited {:?}",
        response.status(),
        report.attempts(),
        report.total_wait()
    );
    assert_eq!(attempts.load(Ordering::Relaxed), 2);
    assert_eq!(server.effects_for(key.as_str()), 1, "exactly one email");

    // The job is redelivered: the ledger answers with the saved response.
    let again = send().await?;
    let replayed = RetryReport::of(&again).is_some_and(RetryReport::is_replayed);
    println!(
        "sent again: {} (replayed from the ledger: {replayed})",
        again.status()
    );
    assert!(replayed);
    assert_eq!(
        attempts.load(Ordering::Relaxed),
        2,
        "nothing went down the chain"
    );

    // An error comes back wrapped by reqwest-middleware; the crate's error is inside.
    let err = client
        .post(closed_port_url()?)
        .send()
        .await
        .expect_err("nothing listens there");
    let ours = Error::from_middleware(&err).ok_or("the crate's error")?;
    println!(
        "refused after {} attempts: {ours} (outcome unknown: {})",
        ours.attempts(),
        ours.is_outcome_unknown()
    );
    assert!(!ours.is_outcome_unknown());
    Ok(())
}
