//! A receiver that says the operation is still in progress (a `409 Conflict` on a keyed
//! request) is waited out, not counted as a failed attempt: the waits do not use up
//! `max_attempts`, are bounded by `max_in_progress_wait` (and the window), honour the
//! receiver's `Retry-After`, cost the retry budget nothing, and are reported apart from the
//! attempts.
//!
//! The limits and the exact waits run on virtual time; the receivers that hold a key in
//! progress for a while run on the real clock, and assert no duration but upper bounds.

use std::time::Duration;

use crate::support::*;
use idempotent_retry::report::WaitReason;
use idempotent_retry::{
    Client, ErrorKind, FailureKind, IdempotencyKey, RetryBudget, RetryBudgetConfig, RetryPolicy,
    RetryReport,
};
use idempotent_retry_testkit::{self as testkit, Delivery, Handling, Receiver, Reply};
use serde_json::json;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.in_progress", &[name])
}

/// A client whose waits run on virtual time, with fixed jitter.
fn virtual_client(policy: RetryPolicy) -> (Client, VirtualTime) {
    let time = VirtualTime::new();
    let client = Client::builder()
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .rng_seed(7)
        .build()
        .expect("valid policy");
    (client, time)
}

/// A client on the real clock for the loopback receiver, with the jitter `seed` fixes.
fn real_client(policy: RetryPolicy, seed: u64) -> Client {
    Client::builder()
        .http(testkit::loopback_http().expect("a loopback reqwest client"))
        .policy(policy)
        .rng_seed(seed)
        .build()
        .expect("valid policy")
}

/// The policy of the reports that came with the issue: 50 ms base, 300 ms cap.
fn agent_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(max_attempts)
        .with_base_delay(ms(50))
        .with_max_delay(ms(300))
}

/// Every row but the last met the operation in progress, and was waited out.
fn assert_waits_then_answer(report: &RetryReport) {
    let (last, waits) = report.history().split_last().expect("attempts");
    for row in waits {
        assert_eq!(row.failure, Some(FailureKind::InProgress), "{row:?}");
        assert_eq!(row.status.map(|s| s.as_u16()), Some(409), "{row:?}");
        assert!(row.wait.is_some(), "{row:?}");
    }
    assert_eq!(last.failure, None, "{last:?}");
    assert_eq!(
        report.in_progress_waits(),
        u32::try_from(waits.len()).unwrap()
    );
    assert_eq!(report.attempts(), report.in_progress_waits() + 1);
    assert_eq!(
        report.in_progress_wait(),
        report.delays().iter().sum::<Duration>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_in_progress_for_3s_then_200_completes_with_one_effect_under_3_attempts() {
    let Held {
        receiver,
        started,
        gate,
    } = held_receiver(secs(3), 200).await;
    let k = key("three-seconds");
    // Another delivery of the operation holds the key: a plain send, not retried.
    let original = tokio::spawn({
        let url = receiver.url("/v1/charges");
        let k = k.clone();
        async move {
            testkit::loopback_http()
                .expect("a loopback reqwest client")
                .post(url)
                .header("Idempotency-Key", k.as_str())
                .body(r#"{"amount":500}"#)
                .send()
                .await
        }
    });
    started.acquire().await.expect("handler started").forget();

    let client = real_client(agent_policy(3), 7);
    let send = tokio::spawn({
        let (client, url, k) = (client.clone(), receiver.url("/v1/charges"), k.clone());
        async move {
            client
                .post(url)
                .idempotency_key(k)
                .body(r#"{"amount":500}"#)
                .send()
                .await
        }
    });
    // Four in-progress answers at least (more than the three attempts allow), however slowly
    // the machine runs, before the key completes.
    assert!(
        receiver.wait_for_arrivals(1 + 4, secs(30)).await >= 5,
        "the retries reached the receiver"
    );
    gate.add_permits(1);

    let response = tokio::time::timeout(secs(60), send)
        .await
        .expect("the operation ends once the key completes")
        .expect("task")
        .expect("waited out, not exhausted");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let report = RetryReport::of(&response).cloned().expect("report");
    assert_waits_then_answer(&report);
    assert!(report.in_progress_waits() >= 4, "{report:?}");
    assert!(report.in_progress_wait() <= RetryPolicy::default().max_in_progress_wait());
    assert_eq!(
        response.text().await.expect("body"),
        json!({"charge": 1}).to_string()
    );
    let first = original
        .await
        .expect("task")
        .expect("the original answered");
    assert_eq!(first.status(), 200);
    assert_eq!(receiver.effects_for(k.as_str()), 1);
    assert_eq!(receiver.effects(), 1);
}

#[tokio::test]
async fn the_in_progress_limit_is_respected_and_reported() {
    let server = TestServer::start(vec![], Action::status(409)).await;
    let policy = fast()
        .with_max_attempts(3)
        .with_base_delay(ms(500))
        .with_max_delay(secs(2))
        .with_max_in_progress_wait(secs(10));
    let (client, time) = virtual_client(policy);
    let k = key("bounded");
    let err = client
        .post(server.url("/v1/charges"))
        .idempotency_key(k.clone())
        .send()
        .await
        .expect_err("still in progress when the limit runs out");
    assert_eq!(err.kind(), ErrorKind::StillInProgress);
    assert_eq!(err.kind().as_str(), "still_in_progress");
    assert!(err.is_outcome_unknown(), "the live operation may complete");
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.status().map(|s| s.as_u16()), Some(409));
    assert_eq!(err.failure(), Some(FailureKind::InProgress));
    assert_eq!(err.retry_after(), None);
    let text = err.to_string();
    assert!(
        text.contains("the receiver still reported the operation in progress after 10s"),
        "{text}"
    );
    assert!(
        text.contains("RetryPolicy::with_max_in_progress_wait"),
        "the fix is named: {text}"
    );
    assert!(text.contains("outcome unknown"), "{text}");

    // Far more requests than the three attempts, every one a wait but the last.
    let report = err.report();
    let hits = server.hits();
    assert!(hits > 3, "{hits} requests");
    assert_eq!(report.attempts(), u32::try_from(hits).unwrap());
    assert_eq!(report.in_progress_waits(), report.attempts() - 1);
    // No wait ends past the limit; the last is cut to end on it, and the next answer stops.
    let slept = time.slept();
    assert!(slept.iter().all(|d| *d <= secs(2)), "{slept:?}");
    assert_eq!(slept.iter().sum::<Duration>(), secs(10));
    assert_eq!(report.in_progress_wait(), secs(10));
    assert_eq!(report.total_wait(), secs(10));
    let last = report.history().last().expect("rows");
    assert_eq!(
        (last.failure, last.wait),
        (Some(FailureKind::InProgress), None)
    );

    // The default limit: a minute.
    let (client, time) = virtual_client(RetryPolicy::default());
    let err = client
        .post(server.url("/v1/charges"))
        .idempotency_key(key("bounded-default"))
        .send()
        .await
        .expect_err("still in progress after a minute");
    assert_eq!(err.kind(), ErrorKind::StillInProgress);
    assert!(
        err.to_string()
            .contains("the receiver still reported the operation in progress after 1m ("),
        "{err}"
    );
    assert_eq!(time.elapsed(), secs(60));
    assert_eq!(err.report().in_progress_wait(), secs(60));
    assert!(err.attempts() > RetryPolicy::default().max_attempts());
}

#[tokio::test]
async fn a_zero_limit_waits_for_no_in_progress_answer() {
    let server = TestServer::start(vec![], Action::status(409)).await;
    let (client, time) = virtual_client(fast().with_max_in_progress_wait(Duration::ZERO));
    let err = client
        .post(server.url("/v1/charges"))
        .idempotency_key(key("zero"))
        .send()
        .await
        .expect_err("no waiting");
    assert_eq!(err.kind(), ErrorKind::StillInProgress);
    assert!(err.to_string().contains("waiting for it is off"), "{err}");
    assert_eq!(server.hits(), 1);
    assert!(time.slept().is_empty());
}

#[tokio::test]
async fn retry_after_on_an_in_progress_answer_is_honoured() {
    let server = TestServer::start(
        vec![
            Action::status_with(409, &[("Retry-After", "3")]),
            Action::status_with(409, &[("retry-after-ms", "1500")]),
            // 4.5 s have passed on the virtual clock (from 2024-01-01T00:00:00Z): 5.5 s more.
            Action::status_with(409, &[("Retry-After", "Mon, 01 Jan 2024 00:00:10 GMT")]),
        ],
        Action::ok("charged"),
    )
    .await;
    // One attempt allowed, millisecond backoff: every wait is the receiver's.
    let (client, time) = virtual_client(fast().with_max_attempts(1));
    let response = client
        .post(server.url("/v1/charges"))
        .idempotency_key(key("retry-after"))
        .send()
        .await
        .expect("the waits are the receiver's, and not attempts");
    assert_eq!(response.status(), 200);
    assert_eq!(time.slept(), [secs(3), ms(1500), ms(5500)]);
    let report = RetryReport::of(&response).expect("report");
    assert_waits_then_answer(report);
    let reasons: Vec<WaitReason> = report
        .history()
        .iter()
        .filter_map(|row| row.wait.map(|w| w.reason))
        .collect();
    assert_eq!(
        reasons,
        [
            WaitReason::RetryAfter { asked: secs(3) },
            WaitReason::RetryAfter { asked: ms(1500) },
            WaitReason::RetryAfter { asked: ms(5500) },
        ]
    );
    assert_eq!(report.in_progress_wait(), ms(10_000));

    // A wait asked past what the limit has left is not taken: the operation stops at once.
    let server = TestServer::start(
        vec![Action::status_with(409, &[("Retry-After", "20")])],
        Action::ok("charged"),
    )
    .await;
    let (client, time) = virtual_client(fast().with_max_in_progress_wait(secs(10)));
    let err = client
        .post(server.url("/v1/charges"))
        .idempotency_key(key("retry-after-too-long"))
        .send()
        .await
        .expect_err("asked past the limit");
    assert_eq!(err.kind(), ErrorKind::StillInProgress);
    assert_eq!(err.retry_after(), Some(secs(20)));
    assert!(
        err.to_string()
            .contains("asked to wait 20s more, past the 10s limit on waiting for it"),
        "{err}"
    );
    assert!(err.is_outcome_unknown());
    assert_eq!(server.hits(), 1);
    assert!(time.slept().is_empty());
}

#[tokio::test]
async fn the_retry_budget_is_unchanged_by_in_progress_waits() {
    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(20)).expect("valid budget");
    let policy = fast().with_max_attempts(3);
    let client = Client::builder()
        .policy(policy)
        .retry_budget(budget.clone())
        .build()
        .expect("valid client");
    let in_progress_then_ok = || async {
        let server = TestServer::start(vec![Action::status(409); 8], Action::ok("charged")).await;
        let response = client
            .post(server.url("/v1/charges"))
            .send()
            .await
            .expect("eight in-progress answers are waited out under three attempts");
        assert_eq!(response.status(), 200);
        assert_eq!(server.hits(), 9);
        let report = RetryReport::of(&response).cloned().expect("report");
        assert_eq!(report.in_progress_waits(), 8);
        assert_eq!(report.attempts(), 9);
    };

    // Two failed retries: 10 tokens of 20 left.
    let failing = TestServer::start(vec![], Action::status(503)).await;
    let err = client
        .post(failing.url("/v1/charges"))
        .send()
        .await
        .expect_err("503s");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(budget.available(), 10);

    in_progress_then_ok().await;
    assert_eq!(
        budget.available(),
        10,
        "waits cost nothing and deposit nothing"
    );
    assert_eq!(budget.refused(), 0);

    // A wait between failing attempts changes none of their charges: 503, two in-progress
    // answers, 503, then the answer is charged the one failed retry that [503, 503, 200]
    // would be.
    let mixed = TestServer::start(
        vec![
            Action::status(503),
            Action::status(409),
            Action::status(409),
            Action::status(503),
        ],
        Action::ok("charged"),
    )
    .await;
    let response = client
        .post(mixed.url("/v1/charges"))
        .send()
        .await
        .expect("two counted failures and the answer, under three attempts");
    assert_eq!(response.status(), 200);
    assert_eq!(mixed.hits(), 5);
    assert_eq!(budget.available(), 5);
    assert_eq!(budget.refused(), 0);

    // An empty bucket still lets the waits through, and stays empty.
    let err = client
        .post(failing.url("/v1/charges"))
        .send()
        .await
        .expect_err("503s");
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert_eq!((budget.available(), budget.refused()), (0, 1));
    in_progress_then_ok().await;
    assert_eq!(budget.available(), 0);
    assert_eq!(budget.refused(), 1, "no wait was refused");
}

/// The reported failure: a Stripe-like receiver (409 at once while a key is processing), a
/// keyed POST to a handler that takes 1.5 s, cancelled by its caller at 400 ms, then sent again
/// at once with the same key under 12 attempts, 50 ms base, 300 ms cap: the retry waits for
/// the first delivery's answer instead of ending with `AttemptsExhausted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_cancelled_by_its_caller_then_sent_again_waits_for_the_live_operation() {
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            tokio::time::sleep(ms(1500)).await;
            let n = delivery.record_effect();
            Reply::json(200, &json!({ "charge": n }))
        })
        .start()
        .await
        .expect("receiver");
    // With this seed the first eleven backoff waits add up to about 0.55 s, well under the
    // 1.1 s the key stays in progress: counted as attempts, the twelve would run out first, as
    // in the report.
    let client = real_client(agent_policy(12), 880);
    let k = key("cancelled-then-retried");
    let send = || {
        client
            .post(receiver.url("/v1/charges"))
            .idempotency_key(k.clone())
            .json(&json!({"amount": 500}))
            .send()
    };

    // The caller's own timeout drops the first send while the handler runs.
    let cancelled = tokio::time::timeout(ms(400), send()).await;
    assert!(cancelled.is_err(), "the handler is still running at 400 ms");
    assert_eq!(receiver.effects(), 0, "nothing committed yet");

    let response = send()
        .await
        .expect("the live operation's answer, not exhaustion");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).cloned().expect("report");
    assert_waits_then_answer(&report);
    assert!(report.in_progress_waits() >= 1, "{report:?}");
    assert_eq!(
        response.text().await.expect("body"),
        json!({"charge": 1}).to_string()
    );
    assert!(receiver.wait_until_idle(secs(10)).await);
    assert_eq!(receiver.effects_for(k.as_str()), 1);
    assert_eq!(receiver.effects(), 1);
    let log = receiver.log();
    assert_eq!(
        log.iter()
            .filter(|a| matches!(a.outcome, Handling::Ran { .. }))
            .count(),
        1,
        "the handler ran once: {log:?}"
    );
    assert!(
        log.iter()
            .any(|a| matches!(a.outcome, Handling::InProgress)),
        "{log:?}"
    );
}

/// One rule in the engine: every front end waits the in-progress answers out the same way.
#[cfg(all(feature = "tower", feature = "middleware"))]
#[tokio::test]
async fn every_front_end_waits_out_in_progress_answers() {
    use crate::support::front::{Call, front_ends};

    let policy = fast().with_max_attempts(2);
    for front in front_ends(|| Client::builder().policy(policy)) {
        let name = front.name();
        let server =
            TestServer::start_idempotent(vec![Action::status(409); 5], Action::ok("done")).await;
        let reply = front
            .send(Call::post(server.url("/v1/charges")).key(key(name)))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(server.hits(), 6, "{name}");
        assert_eq!(server.effects(), 1, "{name}");
        assert_eq!(reply.report.in_progress_waits(), 5, "{name}");
        assert_eq!(reply.report.attempts(), 6, "{name}");
        assert_waits_then_answer(&reply.report);
    }
}
