//! The client's behaviour against real loopback servers: what reached the server, with which
//! key, how many side effects happened, what the caller was told.
//!
//! Sockets run on the real clock with millisecond delays. Where a test needs to know exactly how
//! long the client chose to wait (Retry-After, windows), the waits run on [`VirtualTime`]
//! instead, so nothing here depends on the machine's speed.

use std::error::Error as _;
use std::time::Duration;

use crate::support::*;
use idempotent_retry::report::WaitReason;
use idempotent_retry::{Client, ErrorKind, FailureKind, IdempotencyKey, RetryPolicy, RetryReport};

fn client(policy: RetryPolicy) -> Client {
    Client::builder()
        .policy(policy)
        .build()
        .expect("valid policy")
}

/// A client whose waits run on virtual time.
fn virtual_client(policy: RetryPolicy) -> (Client, VirtualTime) {
    let time = VirtualTime::new();
    let client = Client::builder()
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .rng_seed(42)
        .build()
        .expect("valid policy");
    (client, time)
}

fn report(response: &reqwest::Response) -> RetryReport {
    RetryReport::of(response)
        .cloned()
        .expect("every response carries a report")
}

/// Every request carried the same, present key; returns it.
fn one_key(server: &TestServer) -> String {
    let keys = server.keys();
    assert!(!keys.is_empty(), "no request reached the server");
    let first = keys[0].clone().expect("the first attempt carried a key");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(first.as_str())),
        "keys differ between attempts: {keys:?}"
    );
    first
}

// 1. One key per logical operation, on every attempt.

#[tokio::test]
async fn post_gets_one_random_key_reused_on_every_attempt() {
    let server = TestServer::start_idempotent(
        vec![Action::status(503), Action::status(502)],
        Action::ok("sent"),
    )
    .await;
    let response = client(fast())
        .post(server.url("/emails"))
        .json(&serde_json::json!({"to": "a@example.com"}))
        .send()
        .await
        .expect("third attempt succeeds");
    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 3);
    let key = one_key(&server);
    assert!(IdempotencyKey::new(key.clone()).is_ok());
    assert_eq!(key.len(), 36, "a UUID v4: {key}");
    let report = report(&response);
    assert_eq!(report.attempts(), 3);
    assert_eq!(
        report.idempotency_key().map(IdempotencyKey::as_str),
        Some(key.as_str())
    );
    assert_eq!(report.delays().len(), 2);
    assert_eq!(server.effects(), 1);
    assert_eq!(response.text().await.expect("body"), "sent");
}

#[tokio::test]
async fn each_send_is_a_new_operation_with_a_new_key() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let client = client(fast());
    for _ in 0..2 {
        client.post(server.url("/")).send().await.expect("ok");
    }
    let keys = server.keys();
    assert_eq!(keys.len(), 2);
    assert!(keys[0].is_some() && keys[1].is_some());
    assert_ne!(keys[0], keys[1]);
}

#[tokio::test]
async fn a_key_header_set_by_the_caller_is_kept_verbatim() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let response = client(fast())
        .post(server.url("/"))
        .header("Idempotency-Key", "evt_1NG8Du2eZvKYlo2C")
        .send()
        .await
        .expect("ok");
    assert_eq!(server.hits(), 2);
    assert_eq!(one_key(&server), "evt_1NG8Du2eZvKYlo2C");
    assert_eq!(
        report(&response)
            .idempotency_key()
            .map(IdempotencyKey::as_str),
        Some("evt_1NG8Du2eZvKYlo2C")
    );
}

#[tokio::test]
async fn idempotent_methods_get_no_key_unless_given_one() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let client = client(fast());
    client.get(server.url("/")).send().await.expect("get");
    client
        .put(server.url("/"))
        .body("x")
        .send()
        .await
        .expect("put");
    client.delete(server.url("/")).send().await.expect("delete");
    client.head(server.url("/")).send().await.expect("head");
    client
        .request(reqwest::Method::OPTIONS, server.url("/"))
        .send()
        .await
        .expect("options");
    assert_eq!(server.keys(), vec![None; 5]);
    let key = IdempotencyKey::new("get-with-key").expect("valid");
    client
        .get(server.url("/"))
        .idempotency_key(key)
        .send()
        .await
        .expect("get");
    client.patch(server.url("/")).send().await.expect("patch");
    let keys = server.keys();
    assert_eq!(keys[5].as_deref(), Some("get-with-key"));
    assert!(keys[6].is_some(), "PATCH gets a key like POST");
}

#[tokio::test]
async fn the_key_header_name_is_configurable() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let client = Client::builder()
        .policy(fast())
        .key_header(reqwest::header::HeaderName::from_static(
            "paypal-request-id",
        ))
        .build()
        .expect("valid");
    client.post(server.url("/")).send().await.expect("ok");
    assert_eq!(server.hits(), 2);
    assert_eq!(server.keys(), vec![None, None], "no Idempotency-Key header");
    let ids = server.keys_in("PayPal-Request-Id");
    assert!(ids[0].is_some());
    assert_eq!(ids[0], ids[1]);
}

#[tokio::test]
async fn conflicting_or_invalid_keys_are_refused_before_sending() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let client = client(fast());
    let err = client
        .post(server.url("/"))
        .header("Idempotency-Key", "one")
        .idempotency_key(IdempotencyKey::new("two").expect("valid"))
        .send()
        .await
        .expect_err("two keys");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert_eq!(err.attempts(), 0);
    assert!(!err.is_outcome_unknown());

    let err = client
        .post(server.url("/"))
        .header("Idempotency-Key", "has space")
        .send()
        .await
        .expect_err("invalid header key");
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    assert!(err.source().is_some(), "the reason is the source");

    let err = client
        .post(server.url("/"))
        .header("Idempotency-Key", "a")
        .header("Idempotency-Key", "b")
        .send()
        .await
        .expect_err("two key headers");
    assert_eq!(err.kind(), ErrorKind::Builder);

    // The same key given twice is fine.
    client
        .post(server.url("/"))
        .header("Idempotency-Key", "same")
        .idempotency_key(IdempotencyKey::new("same").expect("valid"))
        .send()
        .await
        .expect("one key, given twice");
    assert_eq!(server.hits(), 1);
}

// 2. What is retried, and what is final.

// Which faults are retried, which statuses are final, timeouts, connect errors, `Retry-After`
// limits, exhausted attempts and the reconcile window are cases of the behavioural suite that
// every front end passes (`front_ends.rs`). What only the client's own response type shows
// stays here.

#[tokio::test]
async fn a_body_cut_short_is_a_failed_attempt_retried_with_the_key() {
    let server = TestServer::start(vec![Action::partial_body("partial")], Action::ok("done")).await;
    // The head arrived, then the body was cut: the answer is lost, so the attempt failed and
    // the retry, with the same key, gets the whole answer.
    let response = client(fast())
        .post(server.url("/charges"))
        .send()
        .await
        .expect("the retry's answer");
    let report = RetryReport::of(&response).expect("report").clone();
    assert_eq!(report.attempts(), 2);
    assert_eq!(response.text().await.expect("whole body"), "done");
    assert_eq!(server.hits(), 2);
    let keys = server.keys();
    assert!(keys[0].is_some() && keys[0] == keys[1], "one key: {keys:?}");
}

#[tokio::test]
async fn conflict_without_a_key_is_final() {
    let server = TestServer::start(vec![], Action::status(409)).await;
    let response = client(fast())
        .get(server.url("/"))
        .send()
        .await
        .expect("ok");
    assert_eq!(response.status(), 409);
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn server_hints_override_the_status_rules() {
    let server = TestServer::start(
        vec![],
        Action::status_with(503, &[("Stripe-Should-Retry", "false")]),
    )
    .await;
    let response = client(fast())
        .post(server.url("/"))
        .send()
        .await
        .expect("ok");
    assert_eq!(response.status(), 503);
    assert_eq!(server.hits(), 1);

    let server = TestServer::start(
        vec![Action::status_with(400, &[("x-should-retry", "true")])],
        Action::ok(""),
    )
    .await;
    let response = client(fast())
        .post(server.url("/"))
        .send()
        .await
        .expect("ok");
    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 2);
    one_key(&server);
}

/// A resolver that fails every lookup, to exercise the DNS path without a network.
struct NoDns;

impl reqwest::dns::Resolve for NoDns {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async {
            Err(Box::new(std::io::Error::other("no such host"))
                as Box<dyn std::error::Error + Send + Sync>)
        })
    }
}

#[tokio::test]
async fn dns_failures_are_retried_and_mean_not_executed() {
    let http = reqwest::Client::builder()
        .dns_resolver(std::sync::Arc::new(NoDns))
        .build()
        .expect("client");
    let client = Client::builder()
        .http(http)
        .policy(fast().with_max_attempts(2))
        .build()
        .expect("valid");
    let err = client
        .post("http://api.example.test/charges")
        .send()
        .await
        .expect_err("no dns");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(err.attempts(), 2);
    assert!(matches!(
        err.failure(),
        Some(FailureKind::Dns | FailureKind::Connect)
    ));
    assert!(!err.is_outcome_unknown());
}

// 3. Waiting: full jitter inside the cap; Retry-After as a floor; too long means stop.

#[tokio::test]
async fn backoff_delays_stay_under_the_doubling_ceiling() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let policy = RetryPolicy::default()
        .with_max_attempts(8)
        .with_base_delay(Duration::from_secs(1))
        .with_max_delay(Duration::from_secs(10));
    let (client, time) = virtual_client(policy);
    let err = client
        .post(server.url("/"))
        .send()
        .await
        .expect_err("always 503");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(server.hits(), 8);
    let slept = time.slept();
    assert_eq!(slept.len(), 7);
    for (retry, (delay, record)) in slept.iter().zip(err.report().history()).enumerate() {
        let ceiling = Duration::from_secs(1 << retry).min(Duration::from_secs(10));
        assert!(*delay <= ceiling, "retry {retry}: {delay:?} > {ceiling:?}");
        let wait = record.wait.expect("a wait after each retried attempt");
        assert_eq!(wait.delay, *delay);
        assert_eq!(wait.reason, WaitReason::Backoff { ceiling });
    }
    assert_eq!(err.report().delays(), slept);
    // Virtual time moves only while sleeping: the operation took exactly its waits.
    assert_eq!(err.elapsed(), time.elapsed());
    assert_eq!(err.report().elapsed(), err.report().total_wait());
    assert!(!err.is_timeout(), "a 503 is not a timeout");
    assert!(format!("{err:?}").contains("AttemptsExhausted"));
    // Each attempt starts after the previous one's wait (virtual time: exactly after).
    let history = err.report().history();
    assert_eq!(history[0].started, Duration::ZERO);
    for pair in history.windows(2) {
        let wait = pair[0].wait.expect("a wait between attempts");
        assert!(pair[1].started >= pair[0].started + wait.delay);
    }
    let shown = history[0].wait.expect("a wait").to_string();
    assert!(
        shown.starts_with("waited ") && shown.ends_with("(full-jitter backoff below 1s)"),
        "{shown}"
    );

    // The same seed gives the same delays.
    let server = TestServer::start(vec![], Action::status(503)).await;
    let (client, again) = virtual_client(policy);
    let _ = client.post(server.url("/")).send().await;
    assert_eq!(again.slept(), slept);
}

#[tokio::test]
async fn retry_after_seconds_and_dates_are_waited_at_least() {
    let time = VirtualTime::new();
    // Sent after the first 7 s wait: a date 37 s after the start asks for 30 s.
    let in_30s = httpdate::fmt_http_date(time.wall_now() + Duration::from_secs(37));
    let server = TestServer::start(
        vec![
            Action::status_with(429, &[("Retry-After", "7")]),
            Action::status_with(503, &[("Retry-After", in_30s.as_str())]),
            Action::status_with(429, &[("retry-after-ms", "1500"), ("Retry-After", "9")]),
            Action::status_with(503, &[("Retry-After", "garbage")]),
        ],
        Action::ok("ok"),
    )
    .await;
    let client = Client::builder()
        .policy(RetryPolicy::default().with_max_delay(ms(500)))
        .clock(time.clone())
        .sleeper(time.clone())
        .build()
        .expect("valid");
    let response = client.post(server.url("/")).send().await.expect("ok");
    assert_eq!(server.hits(), 5);
    let slept = time.slept();
    assert_eq!(
        &slept[..3],
        &[
            Duration::from_secs(7),
            Duration::from_secs(30),
            Duration::from_millis(1500),
        ]
    );
    assert!(slept[3] <= ms(500), "garbage is absent: plain backoff");
    let history = report(&response).history().to_vec();
    assert_eq!(
        history[0].wait.map(|w| w.reason),
        Some(WaitReason::RetryAfter {
            asked: Duration::from_secs(7)
        })
    );
    assert!(matches!(
        history[3].wait.map(|w| w.reason),
        Some(WaitReason::Backoff { .. })
    ));
}

#[tokio::test]
async fn retry_after_is_honoured_on_the_real_clock() {
    let server = TestServer::start(
        vec![Action::status_with(429, &[("retry-after-ms", "150")])],
        Action::ok(""),
    )
    .await;
    client(fast())
        .post(server.url("/"))
        .send()
        .await
        .expect("ok");
    let gaps = gaps(&server.requests());
    assert_eq!(gaps.len(), 1);
    assert!(gaps[0] >= ms(150), "waited {:?}", gaps[0]);
}

// 4. Stopping: attempts and the reconcile window.

#[tokio::test]
async fn a_retry_after_past_the_window_end_stops_at_once() {
    let server =
        TestServer::start(vec![], Action::status_with(503, &[("Retry-After", "50")])).await;
    let (client, time) =
        virtual_client(RetryPolicy::default().with_reconcile_window(Duration::from_secs(40)));
    let err = client
        .post(server.url("/"))
        .send()
        .await
        .expect_err("past the window");
    assert_eq!(err.kind(), ErrorKind::RetryAfterTooLong);
    assert_eq!(err.retry_after(), Some(Duration::from_secs(50)));
    assert!(time.slept().is_empty());
    assert_eq!(server.hits(), 1);
}

// 5. The truth about the outcome.

#[tokio::test]
async fn outcome_is_unknown_once_any_attempt_may_have_run() {
    // Only 503s: each may have run.
    let server = TestServer::start(vec![], Action::status(503)).await;
    let err = client(fast().with_max_attempts(2))
        .post(server.url("/"))
        .send()
        .await
        .expect_err("503");
    assert!(err.is_outcome_unknown());

    // Only 429s: refused outright, never run.
    let server = TestServer::start(vec![], Action::status(429)).await;
    let err = client(fast().with_max_attempts(3))
        .post(server.url("/"))
        .send()
        .await
        .expect_err("429");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert!(!err.is_outcome_unknown());

    // A 503, then only 429s: the 503 may have run, and that is not forgotten.
    let server = TestServer::start(vec![Action::status(503)], Action::status(429)).await;
    let err = client(fast().with_max_attempts(3))
        .post(server.url("/"))
        .send()
        .await
        .expect_err("429");
    assert_eq!(err.failure(), Some(FailureKind::Throttled));
    assert!(err.is_outcome_unknown());

    // 429 then a reset: the reset may have run.
    let server = TestServer::start(vec![Action::status(429)], Action::Reset).await;
    let err = client(fast().with_max_attempts(2))
        .post(server.url("/"))
        .send()
        .await
        .expect_err("reset");
    assert!(err.is_outcome_unknown());
    assert_eq!(err.failure(), Some(FailureKind::ConnectionReset));
}

#[tokio::test]
async fn timeouts_are_reported_as_such() {
    let server = TestServer::start(vec![], Action::hang()).await;
    let err = client(fast().with_max_attempts(2).with_attempt_timeout(ms(300)))
        .post(server.url("/"))
        .send()
        .await
        .expect_err("hangs");
    assert!(err.is_timeout());
    assert!(err.is_outcome_unknown());
    assert_eq!(server.hits(), 2);
    one_key(&server);
}

// 6. Bodies.

#[tokio::test]
async fn replayable_bodies_are_sent_identically_on_every_attempt() {
    let server = TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("")).await;
    let payload = serde_json::json!({"amount": 1999, "currency": "eur"});
    client(fast())
        .post(server.url("/"))
        .json(&payload)
        .send()
        .await
        .expect("ok");
    let bodies: Vec<Vec<u8>> = server.requests().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies.len(), 3);
    assert!(
        bodies
            .iter()
            .all(|b| serde_json::from_slice::<serde_json::Value>(b).ok() == Some(payload.clone()))
    );
}

// The streamed-body case runs for every front end in `front_ends.rs`.

// Configuration errors.

#[tokio::test]
async fn invalid_policies_and_urls_are_builder_errors() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let client = client(fast());
    let err = client
        .post(server.url("/"))
        .policy(RetryPolicy::default().with_max_attempts(0))
        .send()
        .await
        .expect_err("invalid policy");
    assert_eq!(err.kind(), ErrorKind::Builder);
    let err = client.post("not a url").send().await.expect_err("bad url");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert_eq!(server.hits(), 0);
}

#[tokio::test]
async fn a_per_request_policy_overrides_the_client_policy() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let err = client(fast().with_max_attempts(5))
        .post(server.url("/"))
        .policy(fast().with_max_attempts(2))
        .send()
        .await
        .expect_err("503");
    assert_eq!(err.attempts(), 2);
    assert_eq!(server.hits(), 2);
}

#[test]
fn client_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Client>();
    fn send<T: Send>(_: T) {}
    // The future of send() can move across threads.
    let client = Client::new();
    send(client.post("http://127.0.0.1:9/").send());
}

// Classification of each transport failure shape, one attempt each.

#[tokio::test]
async fn each_transport_failure_shape_is_classified() {
    let one = fast().with_max_attempts(1).with_attempt_timeout(ms(300));
    let cases = [
        (Action::Reset, FailureKind::ConnectionReset, true),
        (Action::Close, FailureKind::ConnectionClosed, true),
        (Action::hang(), FailureKind::Timeout, true),
    ];
    for (action, expected, unknown) in cases {
        let server = TestServer::start(vec![], action.clone()).await;
        let err = client(one)
            .post(server.url("/"))
            .send()
            .await
            .expect_err("fails");
        assert_eq!(err.failure(), Some(expected), "{action:?}");
        assert_eq!(err.is_outcome_unknown(), unknown, "{action:?}");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{action:?}");
    }
    let err = client(one)
        .post(format!("http://{}/", refused_addr()))
        .send()
        .await
        .expect_err("refused");
    assert_eq!(err.failure(), Some(FailureKind::Connect));
    let http = reqwest::Client::builder()
        .dns_resolver(std::sync::Arc::new(NoDns))
        .build()
        .expect("client");
    let err = Client::builder()
        .http(http)
        .policy(one)
        .build()
        .expect("valid")
        .post("http://api.example.test/")
        .send()
        .await
        .expect_err("no dns");
    assert_eq!(err.failure(), Some(FailureKind::Dns));
    assert!(!err.is_outcome_unknown());
}

#[tokio::test]
async fn request_options_reach_the_server_on_every_attempt() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    client(fast())
        .post(server.url("/v1/refunds"))
        .query(&[("expand", "charge")])
        .bearer_auth("sk_test_123")
        .header("x-request-source", "agent")
        .form(&[("amount", "500"), ("charge", "ch_1")])
        .send()
        .await
        .expect("ok");
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    for r in &requests {
        assert_eq!(r.path, "/v1/refunds?expand=charge");
        assert_eq!(r.header("authorization"), Some("Bearer sk_test_123"));
        assert_eq!(r.header("x-request-source"), Some("agent"));
        assert_eq!(r.body_str(), "amount=500&charge=ch_1");
    }
}

#[tokio::test]
async fn a_per_request_timeout_overrides_the_policy() {
    let server = TestServer::start(vec![], Action::hang()).await;
    let err = client(
        fast()
            .with_max_attempts(1)
            .with_attempt_timeout(Duration::from_secs(60)),
    )
    .get(server.url("/"))
    .timeout(ms(300))
    .send()
    .await
    .expect_err("times out long before 60 s");
    assert!(err.is_timeout());
}

#[tokio::test]
async fn an_unsupported_scheme_is_a_builder_error_with_nothing_sent() {
    let err = client(fast())
        .post("ftp://127.0.0.1/upload")
        .send()
        .await
        .expect_err("not http");
    assert_eq!(err.kind(), ErrorKind::Builder, "{err:?}");
    assert!(!err.is_outcome_unknown());
}

#[tokio::test]
async fn a_redirect_loop_is_final_and_not_retried() {
    let server =
        TestServer::start(vec![], Action::status_with(307, &[("Location", "/again")])).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::limited(2))
        .build()
        .expect("client");
    let err = Client::builder()
        .http(http)
        .policy(fast())
        .build()
        .expect("valid")
        .post(server.url("/"))
        .send()
        .await
        .expect_err("too many redirects");
    assert_eq!(err.kind(), ErrorKind::Transport);
    assert_eq!(err.failure(), Some(FailureKind::Fatal));
    assert_eq!(err.attempts(), 1);
    assert!(!err.to_string().contains("no idempotency key"), "{err}");
    assert_eq!(
        server.hits(),
        3,
        "the first request and two redirects, once"
    );
}

#[tokio::test]
async fn a_retry_after_exactly_at_the_limit_is_honoured() {
    let server = TestServer::start(
        vec![Action::status_with(429, &[("Retry-After", "60")])],
        Action::ok(""),
    )
    .await;
    let (client, time) = virtual_client(RetryPolicy::default());
    client.post(server.url("/")).send().await.expect("ok");
    assert_eq!(time.slept(), vec![Duration::from_secs(60)]);
}
