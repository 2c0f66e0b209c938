//! A webhook relay: the provider's event id becomes the idempotency key of the call it triggers.
//!
//! Run it with `cargo run --example stripe_style` (add `RUST_LOG=idempotent_retry=info` to see
//! the crate's log line for every retry). The relay receives `charge.refunded` events from a
//! payment provider and, for each, asks a downstream API (a small receiver on 127.0.0.1,
//! the crate's `testkit::Receiver`) to send the customer a refund receipt. It shows:
//!
//! 1. the key: `IdempotencyKey::derive("stripe.refund", &[event_id])`, scoped per provider;
//! 2. a delivery that meets a 500 once, then succeeds: two attempts, one receipt;
//! 3. the provider redelivering the same event (webhooks are at least once): the receiver
//!    replays its saved answer, still one receipt;
//! 4. a relay bug that reuses the key with a different payload: 422, final, not retried, and
//!    logged by the crate at error level;
//! 5. what the relay does with an `Err`: retry later with the same key, or reconcile, decided
//!    from `err.kind()`, `is_outcome_unknown()` and `idempotency_key()`.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use idempotent_retry::{Client, Error, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};
use serde_json::{Value, json};
use tracing_subscriber::EnvFilter;

/// How long a failed event waits in the relay's queue before it is delivered again, unless the
/// receiver asked for longer.
const REQUEUE_DELAY: Duration = Duration::from_secs(60);

#[tokio::main]
async fn main() -> Result<(), Box<dyn StdError>> {
    // Show the crate's own error log (the 422 below); RUST_LOG overrides it.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("idempotent_retry=error"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .without_time()
        .init();

    let server = Receiver::start().await?;
    let relay = Relay {
        url: server.url("/v1/receipts"),
        client: loopback_client(
            RetryPolicy::default()
                .with_max_attempts(3)
                .with_base_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_millis(500))
                .with_attempt_timeout(Duration::from_secs(2)),
        )?,
    };

    // 1. The key. Event ids are unique only within one provider: `evt_123` from Stripe and
    // `evt_123` from another provider are different events. Without the scope they would share
    // a key, and the second refund's receipt would be answered with the first one's saved
    // response (or a 422) and silently never sent. The scope also names the operation, so one
    // event that triggers two different calls gets two keys.
    let event_id = "evt_3PqRsT2eZvKYlo2C1a2b3c4d";
    let key = IdempotencyKey::derive("stripe.refund", &[event_id]);
    let elsewhere = IdempotencyKey::derive("paypal.refund", &[event_id]);
    println!("1. the key, scoped per provider");
    println!("   derive(\"stripe.refund\", [\"{event_id}\"]) = {key}");
    println!("   derive(\"paypal.refund\", [\"{event_id}\"]) = {elsewhere}");
    assert_ne!(key, elsewhere);
    let event = refund_event(event_id, 1500);

    // 2. First delivery: the receiver fails once with a 500, then sends the receipt.
    println!("\n2. deliver {event_id}; the receiver answers 500 once");
    server.inject(When::request(server.arrivals() + 1), Fault::status(500));
    let (status, report) = relay.deliver(&event).await?;
    println!(
        "   -> {status} after {} attempts, receipts sent for this event: {}",
        report.attempts(),
        server.effects_for(key.as_str())
    );
    assert_eq!((status.as_u16(), report.attempts()), (200, 2));

    // 3. The provider did not see our acknowledgement and delivers the event again.
    println!("3. the provider redelivers {event_id}");
    let (status, _) = relay.deliver(&event).await?;
    println!(
        "   -> {status}, receipts sent for this event: {}",
        server.effects_for(key.as_str())
    );
    assert_eq!(server.effects_for(key.as_str()), 1);

    // 4. A relay bug: the same event, re-read after the amount was edited, sent under the same
    // key. The receiver refuses with 422; the crate returns it at once (it is final) and logs it
    // at error level.
    println!("4. a relay bug: {event_id} again, with a different amount");
    let (status, report) = relay.deliver(&refund_event(event_id, 2500)).await?;
    println!(
        "   -> {status} after {} attempt: final, not retried; fix the relay",
        report.attempts()
    );
    assert_eq!((status.as_u16(), report.attempts()), (422, 1));
    assert_eq!(server.effects_for(key.as_str()), 1);

    // 5. Deliveries that end in an `Err`, and what the relay does next.
    println!("5. deliveries that fail, and the relay's next step");
    let throttled = refund_event("evt_3PqRsT2eZvKYlo2C5e6f7g8h", 700);
    server.inject(
        When::request(server.arrivals() + 1),
        Fault::retry_after_secs(429, 120),
    );
    let err = relay
        .deliver(&throttled)
        .await
        .expect_err("asked to wait 120 s");
    println!("   {}: {err}", throttled["id"].as_str().unwrap_or_default());
    println!("   next step: {}", next_step(&err));

    let lost = refund_event("evt_3PqRsT2eZvKYlo2C9i0j1k2l", 4200);
    let next = server.arrivals() + 1;
    server.inject(When::request(next), Fault::ResetAfterCommit);
    server.inject(When::request(next + 1), Fault::status(503));
    server.inject(When::request(next + 2), Fault::status(503));
    let err = relay
        .deliver(&lost)
        .await
        .expect_err("three failed attempts");
    println!("   {}: {err}", lost["id"].as_str().unwrap_or_default());
    let step = next_step(&err);
    println!("   next step: {step}");

    // The requeued event comes back; the same key makes the retry safe: the receipt was in fact
    // sent by the first attempt, and the receiver replays that instead of sending another.
    let NextStep::RetryLater { key: requeued, .. } = step else {
        return Err("expected a retry".into());
    };
    let (status, _) = relay.deliver(&lost).await?;
    println!(
        "   requeued {} delivered: {status}; receipts sent for it: {}",
        lost["id"].as_str().unwrap_or_default(),
        server.effects_for(requeued.as_str())
    );
    assert_eq!(server.effects_for(requeued.as_str()), 1);
    println!("\nreceipts sent in total: {}", server.effects());
    Ok(())
}

/// Forwards provider events to the downstream API, one logical operation per event.
struct Relay {
    client: Client,
    url: String,
}

impl Relay {
    /// Delivers `event`, keyed by its provider and id. Any final status comes back as `Ok`.
    async fn deliver(&self, event: &Value) -> Result<(reqwest::StatusCode, RetryReport), Error> {
        let event_id = event["id"].as_str().unwrap_or_default();
        let key = IdempotencyKey::derive("stripe.refund", &[event_id]);
        let response = self
            .client
            .post(&self.url)
            .idempotency_key(key)
            .json(&event["data"])
            .send()
            .await?;
        let report = RetryReport::of(&response)
            .cloned()
            .expect("every response from send() carries a RetryReport");
        Ok((response.status(), report))
    }
}

/// What the relay does with an event whose delivery ended in an error.
#[derive(Debug)]
enum NextStep {
    /// Put the event back on the queue; deliver it again after `after`, with the same key.
    RetryLater {
        key: IdempotencyKey,
        after: Duration,
    },
    /// Look the operation up by its key before doing anything else.
    Reconcile { key: IdempotencyKey },
    /// A bug on our side: alert someone, do not retry.
    Alert(String),
}

/// The reconcile-vs-retry decision, as a relay would write it.
fn next_step(err: &Error) -> NextStep {
    let Some(key) = err.idempotency_key().cloned() else {
        // Every delivery carries a key; no key means the request never got built.
        return NextStep::Alert(err.to_string());
    };
    match err.kind() {
        // The receiver asked for a longer pause than we wait inline. It refused the request
        // (429), so nothing ran: come back when asked.
        ErrorKind::RetryAfterTooLong => NextStep::RetryLater {
            key,
            after: err.retry_after().unwrap_or(REQUEUE_DELAY),
        },
        // Out of attempts. If the outcome is unknown, the receipt may have been sent: only the
        // same key keeps the next delivery from sending a second one, and it does for as long as
        // the receiver remembers the key (Stripe v1: 24 hours). If nothing ran, a retry is
        // safe anyway.
        ErrorKind::AttemptsExhausted => NextStep::RetryLater {
            key,
            after: REQUEUE_DELAY,
        },
        // The reconcile window ended: the receiver may forget the key soon, and a retry after
        // that would be a new request. Find out what happened instead.
        ErrorKind::ReconcileWindow => NextStep::Reconcile { key },
        ErrorKind::InvalidKey | ErrorKind::Builder => NextStep::Alert(err.to_string()),
        // Anything else that may have reached the receiver: find out before sending again.
        _ if err.is_outcome_unknown() => NextStep::Reconcile { key },
        // It provably did not run (ErrorKind is non_exhaustive: new kinds land here too).
        _ => NextStep::RetryLater {
            key,
            after: REQUEUE_DELAY,
        },
    }
}

impl fmt::Display for NextStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NextStep::RetryLater { key, after } => {
                write!(f, "requeue, retry in {after:?} with the same key {key}")
            }
            NextStep::Reconcile { key } => write!(f, "reconcile: look up key {key}"),
            NextStep::Alert(why) => write!(f, "alert: {why}"),
        }
    }
}

/// A `charge.refunded` event as the provider sends it (trimmed).
fn refund_event(id: &str, amount: u64) -> Value {
    json!({
        "id": id,
        "type": "charge.refunded",
        "data": { "charge": "ch_3PqRsT2eZvKYlo2C", "amount_refunded": amount,
                  "currency": "eur", "email": "ada@example.com" },
    })
}

/// A client for the loopback receiver (proxy settings from the environment ignored).
fn loopback_client(policy: RetryPolicy) -> Result<Client, Box<dyn StdError>> {
    Ok(Client::builder()
        .http(testkit::loopback_http()?)
        .policy(policy)
        .build()?)
}
