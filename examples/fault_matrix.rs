//! The fault matrix: every fault the testkit can script, against three senders, with the side
//! effects each one caused.
//!
//! Run it with `cargo run --example fault_matrix`. For each fault it starts a fresh
//! `testkit::Receiver`, scripts the fault on the first request, and sends one logical
//! operation (a POST that sends an email):
//!
//! - **with a key**: this crate, the key derived once and sent on every attempt;
//! - **without a key**: this crate, `.without_idempotency_key()`: it resends only what provably
//!   never left, and says when the outcome is unknown;
//! - **naive keyless retry**: plain reqwest, resending on any transport error or 5xx, up to 3
//!   times: the pattern the key exists to replace.
//!
//! It prints a markdown table (the README's copy was produced by this command) and exits with
//! status 1 if a keyed operation ever caused more than one effect, or succeeded without one.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::Duration;

use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};
use serde_json::json;

const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(300);

fn faults() -> Vec<Fault> {
    let ms = Duration::from_millis;
    vec![
        Fault::ResetBeforeHandler,
        Fault::CloseWithoutReply,
        Fault::ResetAfterCommit,
        Fault::StallAfterCommit(ms(1_000)),
        Fault::SlowHandler(ms(450)),
        Fault::status(500),
        Fault::status(503),
        Fault::should_retry(503, false),
        Fault::should_retry(400, true),
        Fault::status(408),
        Fault::retry_after_secs(429, 1),
        Fault::retry_after_date(503, Duration::ZERO),
        Fault::retry_after_ms(429, 50),
        Fault::retry_after_secs(429, 120),
    ]
}

/// What one sender got, and what the receiver did.
struct Cell {
    result: String,
    attempts: u32,
    effects: u64,
    success: bool,
}

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn StdError>> {
    let policy = RetryPolicy::default()
        .with_max_attempts(6)
        .with_base_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(400))
        .with_attempt_timeout(ATTEMPT_TIMEOUT)
        .with_max_retry_after(Duration::from_secs(2));
    let client = Client::builder()
        .http(testkit::loopback_http()?)
        .policy(policy)
        .rng_seed(2024)
        .build()?;
    let naive = reqwest::Client::builder()
        .no_proxy()
        .timeout(ATTEMPT_TIMEOUT)
        .build()?;

    println!(
        "| fault on the first request | with a key | attempts | effects | without a key | attempts | effects | naive keyless retry: attempts | effects |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut broken = Vec::new();
    for (i, fault) in faults().into_iter().enumerate() {
        let key = IdempotencyKey::derive("fault_matrix", &[&i.to_string()]);
        let keyed = with_crate(&client, &fault, Some(key)).await?;
        let keyless = with_crate(&client, &fault, None).await?;
        let (naive_attempts, naive_effects) = with_naive_retry(&naive, &fault).await?;
        println!(
            "| {fault} | {} | {} | {} | {} | {} | {} | {naive_attempts} | {naive_effects} |",
            keyed.result,
            keyed.attempts,
            keyed.effects,
            keyless.result,
            keyless.attempts,
            keyless.effects,
        );
        if keyed.effects > 1 || (keyed.success && keyed.effects != 1) {
            broken.push(format!("{fault}: {} effects with a key", keyed.effects));
        }
    }
    println!();
    println!("effects: side effects the receiver recorded for the operation (the email sent).");
    println!(
        "policy: 6 attempts of 300ms each, full-jitter backoff from 50ms capped at 400ms, Retry-After honoured up to 2s."
    );
    if broken.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        for problem in broken {
            eprintln!("FAILED: {problem}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// One operation through this crate, with `key` or with none.
async fn with_crate(
    client: &Client,
    fault: &Fault,
    key: Option<IdempotencyKey>,
) -> Result<Cell, Box<dyn StdError>> {
    let receiver = Receiver::start().await?;
    receiver.inject(When::request(1), fault.clone());
    let request = client
        .post(receiver.url("/v1/emails"))
        .json(&json!({"to": "ada@example.com", "subject": "Your invoice"}));
    let request = match &key {
        Some(key) => request.idempotency_key(key.clone()),
        None => request.without_idempotency_key(),
    };
    let result = request.send().await;
    // A slow first run may still be sending its email: wait for it before counting.
    receiver.wait_until_idle(Duration::from_secs(10)).await;
    let (result, attempts, success) = match result {
        Ok(response) => {
            let attempts = idempotent_retry::RetryReport::of(&response)
                .map_or(0, idempotent_retry::RetryReport::attempts);
            let replayed = response.headers().contains_key(testkit::REPLAYED_HEADER);
            let status = response.status();
            let how = if replayed { " (replayed)" } else { "" };
            (
                format!("`{}`{how}", status.as_u16()),
                attempts,
                status.is_success(),
            )
        }
        Err(err) => {
            let truth = if err.is_outcome_unknown() {
                "outcome unknown"
            } else {
                "not executed"
            };
            (
                format!("error: {}, {truth}", err.kind()),
                err.attempts(),
                false,
            )
        }
    };
    Ok(Cell {
        result,
        attempts,
        effects: receiver.effects(),
        success,
    })
}

/// A keyless POST, resent on any transport error or 5xx, up to 3 times.
async fn with_naive_retry(
    http: &reqwest::Client,
    fault: &Fault,
) -> Result<(u32, u64), Box<dyn StdError>> {
    let receiver = Receiver::start().await?;
    receiver.inject(When::request(1), fault.clone());
    let mut attempts = 0;
    for _ in 0..3 {
        attempts += 1;
        let sent = http
            .post(receiver.url("/v1/emails"))
            .json(&json!({"to": "ada@example.com", "subject": "Your invoice"}))
            .send()
            .await;
        match sent {
            Ok(response) if !response.status().is_server_error() => break,
            _ => {}
        }
    }
    // A slow first run may still be sending its email: wait for it before counting.
    receiver.wait_until_idle(Duration::from_secs(10)).await;
    Ok((attempts, receiver.effects()))
}
