//! What the crate writes to `tracing`: the key, method, host, attempt numbers, statuses and
//! waits; never a request or response body, a credential header, a cookie, a path or a query
//! string.
//!
//! The log is captured at every level of the crate's own targets (`support::logs`). Every secret
//! below is a unique marker; the tests assert that the crate's own lines mention the key (so
//! the capture works) and none of the markers.

mod support;

use std::time::Duration;

use idempotent_retry::ledger::MemoryLedger;
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryPolicy};
use support::*;

/// Markers that must never reach the log. Each test appends its own suffix so parallel tests
/// cannot vouch for each other.
fn secrets(tag: &str) -> Vec<String> {
    [
        "AUTHSECRET",
        "COOKIESECRET",
        "QUERYSECRET",
        "PATHSECRET",
        "BODYSECRET",
        "RESPONSESECRET",
        "SETCOOKIESECRET",
        "APIKEYHEADERSECRET",
    ]
    .iter()
    .map(|s| format!("{s}{tag}"))
    .collect()
}

fn assert_clean(tag: &str, key: &str) {
    let logged = log_text();
    let mine: Vec<&str> = logged.lines().filter(|l| l.contains(key)).collect();
    assert!(
        !mine.is_empty(),
        "the crate logged its operation with the key {key}; got {mine:?}"
    );
    for secret in secrets(tag) {
        assert!(
            !logged.contains(&secret),
            "{secret} leaked into the log:\n{logged}"
        );
    }
}

fn client(attempts: u32) -> Client {
    Client::builder()
        .policy(
            RetryPolicy::default()
                .with_max_attempts(attempts)
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5))
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .build()
        .expect("valid")
}

/// A failing response that carries secrets in its body and a cookie.
fn leaky_503(tag: &str) -> Action {
    Action::respond(
        503,
        &[("Set-Cookie", &format!("s=SETCOOKIESECRET{tag}"))],
        format!("RESPONSESECRET{tag}"),
    )
}

async fn send_with_secrets(
    client: &Client,
    server: &TestServer,
    tag: &str,
    key: &str,
) -> Result<reqwest::Response, idempotent_retry::Error> {
    client
        .post(server.url(&format!(
            "/v1/PATHSECRET{tag}/charges?token=QUERYSECRET{tag}"
        )))
        .header("Authorization", format!("Bearer AUTHSECRET{tag}"))
        .header("Cookie", format!("session=COOKIESECRET{tag}"))
        .header("X-Api-Key", format!("APIKEYHEADERSECRET{tag}"))
        .idempotency_key(IdempotencyKey::new(key).expect("valid"))
        .body(format!("{{\"card\":\"BODYSECRET{tag}\"}}"))
        .send()
        .await
}

#[tokio::test]
async fn retries_then_exhaustion_log_no_body_header_path_or_query() {
    capture_log();
    let tag = "_exhausted";
    let key = "log_hygiene_exhausted";
    let server = TestServer::start(
        vec![leaky_503(tag), Action::Reset, leaky_503(tag)],
        Action::ok(""),
    )
    .await;
    let err = send_with_secrets(&client(3), &server, tag, key)
        .await
        .expect_err("three failures exhaust three attempts");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(server.hits(), 3);
    // The error's message is what callers log most often: it names the key, not the request.
    let message = err.to_string();
    for secret in secrets(tag) {
        assert!(!message.contains(&secret), "{secret} in {message}");
    }
    assert_clean(tag, key);
}

#[tokio::test]
async fn a_reused_key_logged_at_error_level_names_the_key_only() {
    capture_log();
    let tag = "_reused";
    let key = "log_hygiene_reused";
    let server = TestServer::start(
        vec![Action::respond(
            422,
            &[("Set-Cookie", &format!("s=SETCOOKIESECRET{tag}"))],
            format!("RESPONSESECRET{tag}"),
        )],
        Action::ok(""),
    )
    .await;
    let response = send_with_secrets(&client(3), &server, tag, key)
        .await
        .expect("a 422 is a final answer");
    assert_eq!(response.status(), 422);
    let logged = log_text();
    assert!(
        logged
            .lines()
            .any(|l| l.contains("ERROR") && l.contains(key)),
        "the 422 on a keyed request is logged at error level with its key:\n{logged}"
    );
    assert_clean(tag, key);
}

#[tokio::test]
async fn a_ledger_replay_logs_no_saved_body() {
    capture_log();
    let tag = "_ledger";
    let key = "log_hygiene_ledger";
    let server = TestServer::start(
        vec![leaky_503(tag)],
        Action::respond(200, &[], format!("RESPONSESECRET{tag}")),
    )
    .await;
    let client = Client::builder()
        .policy(
            RetryPolicy::default()
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5))
                .with_attempt_timeout(Duration::from_secs(5)),
        )
        .ledger(MemoryLedger::new())
        .build()
        .expect("valid");
    let first = send_with_secrets(&client, &server, tag, key)
        .await
        .expect("503 then 200");
    assert_eq!(first.status(), 200);
    let replayed = send_with_secrets(&client, &server, tag, key)
        .await
        .expect("the ledger replays the saved answer");
    assert_eq!(
        replayed.text().await.expect("saved body"),
        format!("RESPONSESECRET{tag}"),
        "the caller gets the saved body back"
    );
    assert_eq!(server.hits(), 2, "the replay sent nothing");
    assert_clean(tag, key);
}
