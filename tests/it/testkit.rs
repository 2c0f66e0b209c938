//! The testkit's receiver, checked on its own with a plain `reqwest` client (no retries), so each
//! assertion is about the receiver: what it answers, what it keeps, what it counts.
//!
//! Real sockets on the real clock; every delay is a few milliseconds and nothing asserts how long
//! anything took.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idempotent_retry::retry_after;
use idempotent_retry::time::{Clock, Sleeper};
use idempotent_retry_testkit::{
    self as testkit, Compensation, Delivery, Fault, ForgetError, Handling, KeyStatus,
    REPLAYED_HEADER, Receiver, RecordingSleeper, Reply, Violation, When,
};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn http() -> reqwest::Client {
    testkit::loopback_http().expect("a loopback client")
}

fn http_with_timeout(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .build()
        .expect("a loopback client")
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: &Value,
) -> reqwest::Result<reqwest::Response> {
    let mut request = http.post(url).json(body);
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    request.send().await
}

async fn status_and_body(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    (status, response.text().await.expect("a complete body"))
}

#[tokio::test]
async fn a_completed_key_replays_its_saved_response_without_a_new_effect() {
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/v1/charges");
    let body = json!({"amount": 500});
    let first = post(&http(), &url, Some("k1"), &body).await.expect("first");
    assert!(!first.headers().contains_key(REPLAYED_HEADER));
    let (status, saved) = status_and_body(first).await;
    assert_eq!(status, 200);

    for _ in 0..3 {
        let again = post(&http(), &url, Some("k1"), &body).await.expect("again");
        assert_eq!(again.headers()[REPLAYED_HEADER], "true");
        assert_eq!(status_and_body(again).await, (200, saved.clone()));
    }
    assert_eq!(receiver.effects_for("k1"), 1);
    assert_eq!(receiver.effects(), 1);
    let record = receiver.record("k1").expect("a record for k1");
    assert_eq!(record.status, KeyStatus::Completed);
    assert_eq!(record.scope, "default");
    assert_eq!(record.fingerprint.len(), 64);
    assert_eq!(record.effects, 1);
    assert_eq!(
        record.response.map(|r| r.body),
        Some(saved.clone().into_bytes())
    );
    let outcomes: Vec<Handling> = receiver.log().into_iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        [
            Handling::Ran {
                status: 200,
                effects: 1
            },
            Handling::Replayed { status: 200 },
            Handling::Replayed { status: 200 },
            Handling::Replayed { status: 200 },
        ]
    );
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_and_json_spelling_does_not_matter() {
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/v1/charges");
    let http = http();
    let sent = http
        .post(&url)
        .header("Idempotency-Key", "k")
        .body(r#"{"amount":500,"currency":"eur"}"#)
        .send()
        .await
        .expect("first");
    assert_eq!(sent.status(), 200);
    // Same JSON, other member order and number spelling: the same request.
    let same = http
        .post(&url)
        .header("Idempotency-Key", "k")
        .body(r#"{"currency":"eur","amount":500.0}"#)
        .send()
        .await
        .expect("same");
    assert_eq!(same.status(), 200);
    assert_eq!(same.headers()[REPLAYED_HEADER], "true");
    let other = post(&http, &url, Some("k"), &json!({"amount": 900}))
        .await
        .expect("other");
    assert_eq!(other.status(), 422);
    let other_path = post(
        &http,
        &receiver.url("/v1/refunds"),
        Some("k"),
        &json!({"amount": 500, "currency": "eur"}),
    )
    .await
    .expect("other path");
    assert_eq!(other_path.status(), 422);
    assert_eq!(receiver.effects(), 1);
    assert_eq!(receiver.log()[2].outcome, Handling::Mismatch);
}

/// The future a [`gated`] handler returns.
type BoxReply = std::pin::Pin<Box<dyn Future<Output = Reply> + Send>>;

/// A handler that reports when it starts (first semaphore) and waits for the test to let it
/// finish (second semaphore): "in progress" for exactly as long as the test wants, whatever the
/// machine's speed.
fn gated() -> (
    impl Fn(Delivery) -> BoxReply + Send + Sync + 'static,
    Arc<Semaphore>,
    Arc<Semaphore>,
) {
    let started = Arc::new(Semaphore::new(0));
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let (started, gate) = (started.clone(), gate.clone());
        move |delivery: Delivery| {
            let (started, gate) = (started.clone(), gate.clone());
            Box::pin(async move {
                started.add_permits(1);
                gate.acquire().await.expect("gate open").forget();
                let n = delivery.record_effect();
                Reply::ok(format!("effect {n}"))
            }) as BoxReply
        }
    };
    (handler, started, gate)
}

#[tokio::test]
async fn a_duplicate_during_the_first_run_gets_409_then_the_saved_response() {
    let (handler, started, gate) = gated();
    let receiver = Receiver::builder()
        .handler(handler)
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/v1/emails");
    let body = json!({"to": "ada@example.com"});
    let first = tokio::spawn({
        let url = url.clone();
        let body = body.clone();
        async move { post(&http(), &url, Some("k"), &body).await }
    });
    started.acquire().await.expect("handler started").forget();
    assert_eq!(
        receiver.record("k").map(|r| r.status),
        Some(KeyStatus::InProgress)
    );
    let during = post(&http(), &url, Some("k"), &body).await.expect("during");
    assert_eq!(during.status(), 409);
    gate.add_permits(1);
    let first = first.await.expect("task").expect("first");
    let (status, first_body) = status_and_body(first).await;
    assert_eq!((status, first_body.as_str()), (200, "effect 1"));
    let after = post(&http(), &url, Some("k"), &body).await.expect("after");
    assert_eq!(status_and_body(after).await, (200, first_body));
    assert_eq!(receiver.effects_for("k"), 1);
    assert_eq!(receiver.log()[1].outcome, Handling::InProgress);
}

#[tokio::test]
async fn fifty_concurrent_deliveries_of_one_key_run_the_handler_once() {
    let receiver = Arc::new(Receiver::start().await.expect("receiver"));
    // A slow first run, so that the others meet it in progress.
    receiver.inject(When::key_attempt("k", 1), Fault::SlowHandler(ms(50)));
    let url = receiver.url("/v1/emails");
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let url = url.clone();
        tasks.spawn(async move {
            let response = post(&http(), &url, Some("k"), &json!({"n": 1})).await?;
            Ok::<_, reqwest::Error>(status_and_body(response).await)
        });
    }
    let mut answers = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        answers.push(joined.expect("task").expect("answer"));
    }
    assert_eq!(receiver.effects_for("k"), 1);
    let ok: Vec<&String> = answers
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, b)| b)
        .collect();
    assert!(!ok.is_empty());
    assert!(ok.iter().all(|b| *b == ok[0]), "200s differ: {answers:?}");
    assert!(
        answers.iter().all(|(s, _)| *s == 200 || *s == 409),
        "{answers:?}"
    );
}

#[tokio::test]
async fn keyless_requests_run_the_handler_every_time() {
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/v1/emails");
    for _ in 0..3 {
        let response = post(&http(), &url, None, &json!({"n": 1}))
            .await
            .expect("sent");
        assert_eq!(response.status(), 200);
    }
    assert_eq!(receiver.effects(), 3);
    assert_eq!(receiver.keyless_effects(), 3);
    assert_eq!(receiver.keys(), [None, None, None]);
}

#[tokio::test]
async fn a_failed_key_stays_retriable_and_a_saved_failure_with_an_effect_is_replayed() {
    let fail_first = Arc::new(AtomicBool::new(true));
    let receiver = Receiver::builder()
        .scope("test.flaky")
        .handler({
            let fail_first = fail_first.clone();
            move |delivery: Delivery| {
                let fail = fail_first.swap(false, Ordering::SeqCst);
                async move {
                    if fail {
                        // The downstream call failed: no effect, a 503.
                        return Reply::status(503);
                    }
                    let n = delivery.record_effect();
                    Reply::ok(format!("done {n}"))
                }
            }
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/jobs");
    let first = post(&http(), &url, Some("k"), &json!({})).await.expect("1");
    assert_eq!(first.status(), 503);
    let record = receiver.record("k").expect("record");
    assert_eq!(record.status, KeyStatus::Failed);
    assert_eq!(record.scope, "test.flaky");
    let second = post(&http(), &url, Some("k"), &json!({})).await.expect("2");
    assert_eq!(status_and_body(second).await, (200, "done 1".to_owned()));
    assert_eq!(receiver.effects_for("k"), 1);
    assert_eq!(
        receiver.record("k").map(|r| r.status),
        Some(KeyStatus::Completed)
    );
}

#[tokio::test]
async fn a_500_after_the_effect_committed_is_saved_and_replayed_not_rerun() {
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            // The effect happened, then the handler failed to build its answer.
            Reply::status(500)
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/jobs");
    for _ in 0..3 {
        let response = post(&http(), &url, Some("k"), &json!({}))
            .await
            .expect("sent");
        assert_eq!(response.status(), 500);
    }
    assert_eq!(receiver.effects_for("k"), 1);
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_leaves_the_key_retriable() {
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            if delivery.number() == 1 {
                panic!("handler bug");
            }
            delivery.record_effect();
            Reply::ok("ok")
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/jobs");
    let first = post(&http(), &url, Some("k"), &json!({})).await.expect("1");
    assert_eq!(first.status(), 500);
    let second = post(&http(), &url, Some("k"), &json!({})).await.expect("2");
    assert_eq!(second.status(), 200);
    assert_eq!(receiver.effects_for("k"), 1);
}

#[tokio::test]
async fn faults_scripted_by_request_number_and_by_key_attempt() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::request(1), Fault::status(503));
    receiver.inject(When::key_attempt("b", 2), Fault::status(502));
    // Request 3 is b's second attempt too: the request-number script wins, b's stays armed.
    receiver.inject(When::request(3), Fault::status(504));
    let url = receiver.url("/x");
    let http = http();
    let mut statuses = Vec::new();
    for key in ["a", "b", "b", "c", "b"] {
        let response = post(&http, &url, Some(key), &json!({}))
            .await
            .expect("sent");
        statuses.push(response.status().as_u16());
    }
    // b's script names its second attempt: request 5 is its third, so it stays unused and b is
    // replayed.
    assert_eq!(statuses, [503, 200, 504, 200, 200]);
    let log = receiver.log();
    assert_eq!(
        log.iter().map(|a| a.key_attempt).collect::<Vec<_>>(),
        [1, 1, 2, 1, 3]
    );
    assert_eq!(log[0].fault, Some(Fault::status(503)));
    assert_eq!(log[0].outcome, Handling::Faulted);
    assert_eq!(receiver.effects(), 2);
}

#[tokio::test]
async fn reset_before_the_handler_claims_nothing() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::request(1), Fault::ResetBeforeHandler);
    let url = receiver.url("/x");
    let err = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect_err("reset");
    assert!(err.is_request() && !err.is_connect(), "{err:?}");
    assert_eq!(receiver.effects(), 0);
    assert!(receiver.record("k").is_none());
    let retry = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("retry");
    assert_eq!(retry.status(), 200);
    assert!(!retry.headers().contains_key(REPLAYED_HEADER));
    assert_eq!(receiver.effects_for("k"), 1);
}

#[tokio::test]
async fn reset_after_commit_loses_the_answer_but_keeps_the_effect() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::key_attempt("k", 1), Fault::ResetAfterCommit);
    let url = receiver.url("/x");
    let err = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect_err("reset");
    assert!(err.is_request(), "{err:?}");
    assert_eq!(receiver.effects_for("k"), 1);
    let retry = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("retry");
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(receiver.effects_for("k"), 1);
    assert!(receiver.log()[0].to_string().contains("answer lost"));
}

#[tokio::test]
async fn close_without_reply_is_an_incomplete_message() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::request(1), Fault::CloseWithoutReply);
    let err = post(&http(), &receiver.url("/x"), Some("k"), &json!({}))
        .await
        .expect_err("closed");
    assert!(err.is_request() && !err.is_timeout(), "{err:?}");
    assert_eq!(receiver.effects(), 0);
}

#[tokio::test]
async fn a_stall_after_commit_outlives_the_client_timeout() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::request(1), Fault::StallAfterCommit(ms(5_000)));
    receiver.inject(When::request(2), Fault::StallAfterCommit(ms(20)));
    let url = receiver.url("/x");
    let err = post(&http_with_timeout(ms(800)), &url, Some("k"), &json!({}))
        .await
        .expect_err("timed out");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(receiver.effects_for("k"), 1);
    // A short stall: the answer (a replay) arrives.
    let late = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("late");
    assert_eq!(late.headers()[REPLAYED_HEADER], "true");
    assert_eq!(receiver.effects_for("k"), 1);
}

#[tokio::test]
async fn canned_answers_carry_every_retry_after_form_and_hints() {
    let receiver = Receiver::start().await.expect("receiver");
    receiver.inject(When::request(1), Fault::retry_after_secs(429, 3));
    receiver.inject(
        When::request(2),
        Fault::retry_after_date(503, Duration::from_secs(30)),
    );
    receiver.inject(When::request(3), Fault::retry_after_ms(429, 250));
    receiver.inject(When::request(4), Fault::should_retry(500, false));
    let url = receiver.url("/x");
    let http = http();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let response = post(&http, &url, Some("k"), &json!({}))
            .await
            .expect("sent");
        answers.push((response.status().as_u16(), response.headers().clone()));
    }
    assert_eq!(answers[0].0, 429);
    assert_eq!(answers[0].1["retry-after"], "3");
    assert_eq!(answers[1].0, 503);
    let wall = idempotent_retry::time::TokioClock::new();
    let asked = retry_after::parse(&answers[1].1["retry-after"], Clock::wall(&wall))
        .expect("an HTTP-date the crate parses");
    assert!(asked <= Duration::from_secs(31), "{asked:?}");
    assert!(asked >= Duration::from_secs(25), "{asked:?}");
    assert_eq!(answers[2].1["retry-after-ms"], "250");
    assert_eq!(answers[3].0, 500);
    assert_eq!(answers[3].1["stripe-should-retry"], "false");
    assert_eq!(receiver.effects(), 0);
    assert!(receiver.record("k").is_none());
}

#[tokio::test]
async fn batches_are_deduplicated_per_event() {
    let receiver = Receiver::builder()
        .batch("sg_event_id")
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/webhooks/sendgrid");
    let http = http();
    let events = |ids: &[&str]| {
        Value::Array(
            ids.iter()
                .map(|id| json!({"sg_event_id": id, "event": "delivered"}))
                .collect(),
        )
    };
    let first = post(&http, &url, None, &events(&["e1", "e2", "e3"]))
        .await
        .expect("first");
    let (status, summary) = status_and_body(first).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&summary).expect("json"),
        json!({"processed": 3, "duplicates": 0})
    );
    // A batch of 5 where 3 already exist: 2 effects.
    let second = post(&http, &url, None, &events(&["e1", "e2", "e3", "e4", "e5"]))
        .await
        .expect("second");
    let (_, summary) = status_and_body(second).await;
    assert_eq!(
        serde_json::from_str::<Value>(&summary).expect("json"),
        json!({"processed": 2, "duplicates": 3})
    );
    assert_eq!(receiver.effects(), 5);
    for id in ["e1", "e2", "e3", "e4", "e5"] {
        assert_eq!(receiver.effects_for(id), 1, "{id}");
    }
    assert_eq!(
        receiver.log()[1].outcome,
        Handling::Batch {
            processed: 2,
            duplicates: 3
        }
    );
    let bad = post(&http, &url, None, &json!({"sg_event_id": "e9"}))
        .await
        .expect("bad");
    assert_eq!(bad.status(), 400);
    let missing_id = post(&http, &url, None, &json!([{"event": "open"}]))
        .await
        .expect("missing id");
    assert_eq!(missing_id.status(), 400);
    assert_eq!(receiver.effects(), 5);
}

#[tokio::test]
async fn a_batch_whose_event_fails_is_500_and_a_resend_runs_only_the_rest() {
    let receiver = Receiver::builder()
        .batch("id")
        .handler(|delivery: Delivery| async move {
            let event: Value = delivery.json().unwrap_or_default();
            if event["id"] == "bad" && delivery.number() == 1 {
                return Reply::status(503);
            }
            delivery.record_effect();
            Reply::status(200)
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/events");
    let batch = json!([{"id": "a"}, {"id": "bad"}, {"id": 7}]);
    let first = post(&http(), &url, None, &batch).await.expect("first");
    assert_eq!(first.status(), 500);
    assert_eq!(receiver.effects(), 2);
    let again = post(&http(), &url, None, &batch).await.expect("again");
    let (status, summary) = status_and_body(again).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&summary).expect("json"),
        json!({"processed": 1, "duplicates": 2})
    );
    for id in ["a", "bad", "7"] {
        assert_eq!(receiver.effects_for(id), 1, "{id}");
    }
}

#[tokio::test]
async fn forgetting_a_committed_key_needs_a_compensating_record() {
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/x");
    let sent = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("sent");
    assert_eq!(sent.status(), 200);

    assert_eq!(
        receiver.forget("k", None),
        Err(ForgetError::EffectCommitted {
            key: "k".to_owned(),
            effects: 1
        })
    );
    // Refused: the key is still there and a redelivery is still a replay.
    let again = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("again");
    assert_eq!(again.headers()[REPLAYED_HEADER], "true");
    assert_eq!(receiver.effects_for("k"), 1);
    assert_eq!(
        receiver.forget("nope", None),
        Err(ForgetError::UnknownKey {
            key: "nope".to_owned()
        })
    );

    receiver
        .forget("k", Some(Compensation::new("refunded")))
        .expect("forgotten with a compensation");
    let compensations = receiver.compensations();
    assert_eq!(compensations.len(), 1);
    assert_eq!(compensations[0].compensation.reason(), "refunded");
    assert_eq!(compensations[0].effects, 1);
    assert!(receiver.record("k").is_none());
}

#[tokio::test]
async fn a_key_without_effects_can_be_forgotten_but_not_while_in_progress() {
    let receiver = Receiver::builder()
        .handler(|_: Delivery| async { Reply::status(404) })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/x");
    let response = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("sent");
    assert_eq!(response.status(), 404);
    assert_eq!(receiver.forget("k", None), Ok(()));

    let (handler, started, gate) = gated();
    let gated_receiver = Receiver::builder()
        .handler(handler)
        .start()
        .await
        .expect("receiver");
    let slow = tokio::spawn({
        let url = gated_receiver.url("/x");
        async move { post(&http(), &url, Some("slow"), &json!({})).await }
    });
    started.acquire().await.expect("handler started").forget();
    assert_eq!(
        gated_receiver.forget("slow", None),
        Err(ForgetError::InProgress {
            key: "slow".to_owned()
        })
    );
    gate.add_permits(1);
    slow.await.expect("task").expect("answer");
}

#[tokio::test]
async fn a_handler_releasing_a_committed_key_is_caught() {
    // The misuse: the handler sends the email, then fails on its bookkeeping and "releases the
    // key on error" so the sender can retry. The retry would send a second email.
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            Reply::status(500).release_key()
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/emails");
    let first = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("first");
    assert_eq!(first.status(), 500);
    assert_eq!(
        receiver.violations(),
        [Violation::ReleasedCommittedKey {
            key: "k".to_owned(),
            request: 1,
            effects: 1
        }]
    );
    // The key was kept: the retry is answered from it, no second email.
    let retry = post(&http(), &url, Some("k"), &json!({}))
        .await
        .expect("retry");
    assert_eq!(retry.headers()[REPLAYED_HEADER], "true");
    assert_eq!(receiver.effects_for("k"), 1);
}

#[tokio::test]
async fn releasing_a_key_without_an_effect_lets_the_next_delivery_run() {
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            if delivery.number() == 1 {
                return Reply::status(400).release_key();
            }
            delivery.record_effect();
            Reply::ok("ok")
        })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/x");
    assert_eq!(
        post(&http(), &url, Some("k"), &json!({}))
            .await
            .expect("1")
            .status(),
        400
    );
    assert!(receiver.record("k").is_none());
    assert_eq!(
        post(&http(), &url, Some("k"), &json!({}))
            .await
            .expect("2")
            .status(),
        200
    );
    assert!(receiver.violations().is_empty());
}

#[tokio::test]
async fn another_key_header() {
    let receiver = Receiver::builder()
        .key_header("PayPal-Request-Id")
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/v2/orders");
    let http = http();
    for _ in 0..2 {
        http.post(&url)
            .header("paypal-request-id", "r1")
            .send()
            .await
            .expect("sent");
    }
    assert_eq!(receiver.effects_for("r1"), 1);
    assert_eq!(
        receiver.keys(),
        [Some("r1".to_owned()), Some("r1".to_owned())]
    );
}

#[tokio::test]
async fn recording_sleeper_records_and_instant_mode_does_not_wait() {
    let sleeper = RecordingSleeper::instant();
    let copy = sleeper.clone();
    copy.sleep(Duration::from_secs(3600)).await;
    copy.sleep(ms(5)).await;
    assert_eq!(sleeper.delays(), [Duration::from_secs(3600), ms(5)]);
    assert_eq!(sleeper.total(), Duration::from_secs(3600) + ms(5));

    let real = RecordingSleeper::new();
    real.sleep(ms(1)).await;
    assert_eq!(real.delays(), [ms(1)]);
}

#[test]
fn fixed_keys_are_reproducible() {
    assert_eq!(
        testkit::fixed_key(42).as_str(),
        "testkit-key-0000000000000042"
    );
    assert_eq!(testkit::fixed_key(7), testkit::fixed_key(7));
    assert_ne!(testkit::fixed_key(7), testkit::fixed_key(8));
}

#[tokio::test]
async fn dropping_the_receiver_stops_it() {
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/x");
    drop(receiver);
    // Give the runtime a moment to run the abort.
    tokio::task::yield_now().await;
    let err = post(&http(), &url, None, &json!({}))
        .await
        .expect_err("nobody listens");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
}
