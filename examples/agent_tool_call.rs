//! Idempotency keys for agent tool calls, and a crash between sending and recording.
//!
//! Run it with `cargo run --example agent_tool_call`. It shows:
//!
//! 1. the two ways to derive a key for a tool call, which arrives without an id of its own:
//!    from the conversation id and step index (`IdempotencyKey::derive`), or from the tool name
//!    and its arguments (`IdempotencyKey::for_tool_call`), normalized with RFC 8785 so member
//!    order and number spelling (`1.0` vs `1`) do not change the key;
//! 2. a tool call sent through a flaky receiver (one 503, then 200): two attempts, one key;
//! 3. a crash and restart: a fresh `Client` in a "new process" re-derives the same key from the
//!    conversation log and re-sends the call; the receiver replays its saved response, and the
//!    email is still sent only once.
//!
//! Everything runs against a small receiver on 127.0.0.1 (the crate's `testkit::Receiver`).

use std::error::Error as StdError;
use std::time::Duration;

use idempotent_retry::{Client, IdempotencyKey, RetryPolicy, RetryReport, canonical};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};
use serde_json::{Value, json};

/// The tool call as the conversation log stored it: the model's output, verbatim.
const LOGGED_CALL: &str = r#"{
    "tool": "send_email",
    "arguments": { "to": "ada@example.com", "subject": "Your invoice", "priority": 1.0 }
}"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn StdError>> {
    // 1. Two derivations.
    //
    // By position: "the tool call at step 7 of conversation conv_42". If the model re-plans the
    // step with different arguments, the key stays the same, and the receiver answers 422 instead
    // of sending a second, different email.
    let by_step = IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]);
    println!("derive(\"agent.send_email\", [\"conv_42\", \"7\"]) = {by_step}");

    // By content: "send_email with exactly these arguments". Needs no conversation state, but two
    // deliberate, identical calls would be deduplicated into one: add a distinguishing argument
    // (or use the step key) when the same call may legitimately happen twice.
    //
    // Two spellings of the same arguments, as two model runs might write them.
    let text_one = r#"{"to":"ada@example.com","subject":"Your invoice","priority":1}"#;
    let text_two = r#"{"priority":1.0,"subject":"Your invoice","to":"ada@example.com"}"#;
    let one: Value = serde_json::from_str(text_one)?;
    let two: Value = serde_json::from_str(text_two)?;
    let key_one = IdempotencyKey::for_tool_call("send_email", &one);
    let key_two = IdempotencyKey::for_tool_call("send_email", &two);
    println!("for_tool_call(\"send_email\", {text_one})\n  = {key_one}");
    println!("for_tool_call(\"send_email\", {text_two})\n  = {key_two}");
    println!(
        "both normalize (RFC 8785) to {}",
        canonical::to_string(&one)
    );
    assert_eq!(
        key_one, key_two,
        "member order and 1.0 vs 1 must not matter"
    );
    let other = json!({ "to": "bob@example.com", "subject": "Your invoice", "priority": 1 });
    assert_ne!(key_one, IdempotencyKey::for_tool_call("send_email", &other));
    println!("same key for both spellings; another recipient gives another key\n");

    // 2. Send the logged tool call through a receiver that fails once with a 503.
    let server = Receiver::start().await?;
    server.inject(When::request(1), Fault::status(503));
    let url = server.url("/v1/emails");

    let (key, args) = key_from_log(LOGGED_CALL)?;
    assert_eq!(key, key_one, "the logged call is the same call");
    let client = new_client()?;
    let response = client
        .post(&url)
        .idempotency_key(key.clone())
        .json(&args)
        .send()
        .await?;
    let report = RetryReport::of(&response)
        .cloned()
        .ok_or("every response carries a RetryReport")?;
    let reported_key = report.idempotency_key().map(IdempotencyKey::as_str);
    println!(
        "sent: {} after {} attempts, key {}",
        response.status(),
        report.attempts(),
        reported_key.unwrap_or("none")
    );
    for attempt in report.history() {
        let what = attempt
            .failure
            .map_or("final".to_owned(), |f| f.to_string());
        let status = attempt
            .status
            .map_or("no response".to_owned(), |s| s.to_string());
        match attempt.wait {
            Some(wait) => println!(
                "  attempt {}: {status}, {what}; waited {}ms ({})",
                attempt.number,
                wait.delay.as_millis(),
                wait.reason
            ),
            None => println!("  attempt {}: {status}, {what}", attempt.number),
        }
    }
    for line in server.log() {
        println!("  server #{}: {line}", line.number);
    }
    assert_eq!(report.attempts(), 2);
    assert_eq!(reported_key, Some(key.as_str()));
    assert_eq!(server.effects_for(key.as_str()), 1);

    // 3. The runtime crashes before it records that the step is done. Nothing in memory
    // survives: not the client, not the key. After the restart it replays the conversation log,
    // re-derives the key from the same logged call and sends the step again.
    drop((client, response, key, args));
    println!("\n-- crash before the step was marked done; restart, replay the conversation log --");
    let (key, args) = key_from_log(LOGGED_CALL)?;
    let before = server.arrivals();
    let response = new_client()?
        .post(&url)
        .idempotency_key(key.clone())
        .json(&args)
        .send()
        .await?;
    let replayed = response.headers().contains_key("idempotent-replayed");
    println!(
        "re-sent: {} (Idempotent-Replayed: {replayed}), key {key}",
        response.status()
    );
    for line in server.log().iter().skip(usize::try_from(before)?) {
        println!("  server #{}: {line}", line.number);
    }
    println!("  body: {}", response.text().await?);
    let sent = server.effects_for(key.as_str());
    println!("emails sent for this tool call: {sent}");
    assert!(replayed, "the receiver answered from its saved response");
    assert_eq!(sent, 1, "one email, although the call was sent three times");
    Ok(())
}

/// Parses a logged tool call and derives its key. The same log gives the same key in every
/// process, on every machine and in every version of the crate with the same major version.
fn key_from_log(logged: &str) -> Result<(IdempotencyKey, Value), Box<dyn StdError>> {
    let call: Value = serde_json::from_str(logged)?;
    let tool = call["tool"].as_str().ok_or("tool name missing")?;
    let args = call["arguments"].clone();
    Ok((IdempotencyKey::for_tool_call(tool, &args), args))
}

fn new_client() -> Result<Client, Box<dyn StdError>> {
    let policy = RetryPolicy::default()
        .with_base_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(1))
        .with_attempt_timeout(Duration::from_secs(2));
    loopback_client(policy)
}

/// A client for the loopback receiver (proxy settings from the environment ignored).
fn loopback_client(policy: RetryPolicy) -> Result<Client, Box<dyn StdError>> {
    Ok(Client::builder()
        .http(testkit::loopback_http()?)
        .policy(policy)
        .build()?)
}
