//! An agent runtime's `send_email` tool call, through every fault a retry has to survive.
//!
//! Run it with `cargo run --example demo`. It starts the crate's idempotent test receiver
//! (`testkit::Receiver`) on 127.0.0.1 and sends two tool calls, each keyed by
//! `IdempotencyKey::derive("agent.send_email", &[conversation_id, step_index])`:
//!
//! 1. Step 7. The handler takes 900 ms, longer than the 300 ms attempt timeout, so attempt 1
//!    times out while the email is being sent. Attempt 2 meets the key still in progress (409),
//!    attempt 3 a 503, attempt 4 a 429 with `Retry-After: 1`. Attempt 5 gets the saved 200,
//!    replayed.
//! 2. Step 8. The email is sent but the connection is reset before the response arrives. The
//!    retry gets the saved 200.
//!
//! This is the worked example of a receiver whose handler outlives the sender's timeout: the key
//! is claimed first, so the slow run is never run twice; the sender meets 409 and later gets the
//! saved 200. Each operation prints a timeline (what the receiver did with each attempt, how the
//! client classified it, how long it waited and why), and the demo checks that each key sent
//! exactly one email and that every attempt of an operation carried the same key; otherwise it
//! exits with status 1.
//!
//! Last, the contrast: the same lost response on a POST sent without a key. The client cannot
//! retry it safely, so it does not, and reports the outcome as unknown.

use std::error::Error as StdError;
use std::process::ExitCode;
use std::time::Duration;

use idempotent_retry::{Client, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{self as testkit, Arrival, Delivery, Fault, Receiver, Reply, When};
use serde_json::json;

const CONVERSATION: &str = "conv_42";

#[tokio::main]
async fn main() -> Result<ExitCode, Box<dyn StdError>> {
    // The receiver answers each email it sends with that email's id (the n-th email it sent
    // is `email_n`): an id, not a count, beside the count of emails sent for each key below.
    let server = Receiver::builder()
        .scope("agent.send_email")
        .handler(|delivery: Delivery| async move {
            let n = delivery.record_effect();
            Reply::json(200, &json!({ "id": format!("email_{n}") }))
        })
        .start()
        .await?;
    let url = server.url("/v1/emails");
    // A short policy so the demo takes seconds: backoff ceilings 100 ms, 200 ms, 400 ms, ... up
    // to 1 s; each attempt may take 300 ms.
    let policy = RetryPolicy::default()
        .with_max_attempts(6)
        .with_base_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(1))
        .with_attempt_timeout(Duration::from_millis(300));
    let client = Client::builder()
        .http(testkit::loopback_http()?)
        .policy(policy)
        .build()?;

    println!("idempotent-retry demo: an agent's send_email tool call against a flaky receiver");
    println!("policy: up to 6 attempts, 300ms each, full-jitter backoff from 100ms, capped at 1s");
    let mut problems = Vec::new();

    // Step 7: slow handler (timeout), then 409, 503, 429; the replay ends it. Faults are
    // scripted per attempt of the step's key.
    let key = step_key(7);
    server.inject(
        When::key_attempt(&key, 1),
        Fault::SlowHandler(Duration::from_millis(900)),
    );
    // Attempt 2 needs no script: the slow handler still holds the key, so it gets 409.
    server.inject(When::key_attempt(&key, 3), Fault::status(503));
    server.inject(When::key_attempt(&key, 4), Fault::retry_after_secs(429, 1));
    send_email(&server, &client, &url, 7, &mut problems).await;

    // Step 8: the email is sent, then the connection is reset; the retry gets the saved 200.
    server.inject(When::key_attempt(step_key(8), 1), Fault::ResetAfterCommit);
    send_email(&server, &client, &url, 8, &mut problems).await;

    let total = server.effects();
    println!("\nsummary: 2 operations, {total} emails sent in total");
    if total != 2 {
        problems.push(format!("{total} emails sent for 2 operations"));
    }

    // The contrast: the same fault on a POST without a key.
    println!("\ncontrast: the same lost response, on a POST sent .without_idempotency_key()");
    let before = server.arrivals();
    server.inject(When::request(before + 1), Fault::ResetAfterCommit);
    let result = client
        .post(&url)
        .without_idempotency_key()
        .json(&json!({ "to": "ada@example.com", "subject": "Your invoice" }))
        .send()
        .await;
    print_server_lines(&server.log(), before);
    match result {
        Err(err) if err.is_outcome_unknown() && err.attempts() == 1 => {
            println!("  client: {err}");
            println!("  the email was sent, but the caller cannot know it: resending could send a");
            println!("  second one, not resending could lose it. With a key, the retry is safe.");
        }
        Err(err) => problems.push(format!("keyless POST: unexpected error: {err}")),
        Ok(response) => problems.push(format!("keyless POST: got {}", response.status())),
    }

    if problems.is_empty() {
        println!("\nok: every key sent exactly one email and every attempt carried its key");
        Ok(ExitCode::SUCCESS)
    } else {
        for problem in &problems {
            eprintln!("FAILED: {problem}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// Sends step `step`'s email as one logical operation, prints its timeline and records anything
/// that breaks the promise (one key for every attempt, one email per key).
async fn send_email(
    server: &Receiver,
    client: &Client,
    url: &str,
    step: u32,
    problems: &mut Vec<String>,
) {
    // The key comes from what identifies the tool call, not from the attempt: a retry, a second
    // replica or a restarted runtime derives the same one.
    let key = step_key(step);
    println!("\nsend_email, {CONVERSATION} step {step}");
    println!("  key derive(\"agent.send_email\", [\"{CONVERSATION}\", \"{step}\"])");
    println!("      = {key}");

    let before = server.arrivals();
    let result = client
        .post(url)
        .idempotency_key(key.clone())
        .json(&json!({ "to": "ada@example.com", "subject": "Your invoice", "step": step }))
        .send()
        .await;
    let log: Vec<Arrival> = server
        .log()
        .into_iter()
        .skip(usize::try_from(before).unwrap_or(usize::MAX))
        .collect();

    // The outcome, and the report the crate keeps of every attempt.
    let (report, outcome) = match result {
        Ok(response) => {
            let report = RetryReport::of(&response).cloned();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            if !status.is_success() {
                problems.push(format!("step {step}: final status {status}"));
            }
            let how = if replayed { "replayed" } else { "first answer" };
            (report, format!("{status} ({how}) {body}"))
        }
        Err(err) => {
            problems.push(format!("step {step}: {err}"));
            (Some(err.report().clone()), format!("error: {err}"))
        }
    };
    let Some(report) = report else {
        problems.push(format!("step {step}: no RetryReport on the response"));
        return;
    };

    for (i, attempt) in report.history().iter().enumerate() {
        let server_side = log.get(i).map_or_else(
            || "no request reached the server".to_owned(),
            |line| format!("server +{}ms: {line}", line.at.as_millis()),
        );
        println!("  attempt {}  {server_side}", attempt.number);
        let client_side = match (attempt.failure, attempt.status) {
            (Some(failure), Some(status)) => format!("{status}: {failure}"),
            (Some(failure), None) => failure.to_string(),
            (None, Some(status)) => format!("{status}: final"),
            (None, None) => "final".to_owned(),
        };
        match attempt.wait {
            Some(wait) => println!(
                "             client: {client_side}; wait {}ms ({})",
                wait.delay.as_millis(),
                wait.reason
            ),
            None => println!("             client: {client_side}"),
        }
    }
    let sent = server.effects_for(key.as_str());
    println!(
        "  outcome: {outcome}\n  {} attempts in {}ms; emails sent for this key: {sent}",
        report.attempts(),
        report.elapsed().as_millis()
    );

    if sent != 1 {
        problems.push(format!("step {step}: {sent} emails sent for one key"));
    }
    if report.idempotency_key() != Some(&key) {
        problems.push(format!("step {step}: the report carries another key"));
    }
    if log
        .iter()
        .any(|line| line.key.as_deref() != Some(key.as_str()))
    {
        problems.push(format!("step {step}: an attempt carried a different key"));
    }
    if log.len() != report.history().len() {
        problems.push(format!(
            "step {step}: {} requests reached the server for {} attempts",
            log.len(),
            report.history().len()
        ));
    }
}

/// The key of step `step` of the conversation: derived from what identifies the tool call, so
/// a retry, a second replica or a restarted runtime derives the same one.
fn step_key(step: u32) -> IdempotencyKey {
    IdempotencyKey::derive("agent.send_email", &[CONVERSATION, &step.to_string()])
}

/// The receiver's lines from arrival `after + 1` on.
fn print_server_lines(log: &[Arrival], after: u64) {
    for line in log.iter().filter(|line| line.number > after) {
        let key = line.key.as_deref().unwrap_or("none");
        println!(
            "  server #{} +{}ms key={key}: {line}",
            line.number,
            line.at.as_millis()
        );
    }
}
