//! A key the ledger holds, sent again with a different request: what the caller is told for
//! each stored status (succeeded, a final refusal, refused before running, unknown, in flight),
//! that a key no receiver has seen is free for the corrected request, and that an operator can
//! free one by hand. Real loopback sockets, the testkit's idempotent receiver counting side
//! effects, a real SQLite file.

use std::time::Duration;

use http::StatusCode;
use idempotent_retry::ledger::{Claim, Ledger, OperationStatus, ResolutionKind, SqliteLedger};
use idempotent_retry::reconcile::{Released, release_by_hand};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, Outcome, RequestPart, RetryPolicy};
use idempotent_retry_testkit::{Fault, Receiver, When};

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(attempts)
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(2))
        .with_attempt_timeout(Duration::from_secs(5))
}

async fn ledger(dir: &tempfile::TempDir) -> SqliteLedger {
    SqliteLedger::open(dir.path().join("ops.db"))
        .await
        .expect("open the ledger")
}

fn client(ledger: &SqliteLedger, attempts: u32) -> Client {
    Client::builder()
        .policy(policy(attempts))
        .ledger(ledger.clone())
        .build()
        .expect("client")
}

/// A loopback port nothing listens on: a connect there is refused.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    format!("http://{addr}")
}

fn order() -> serde_json::Value {
    serde_json::json!({"order": 17, "amount": 100})
}

#[tokio::test]
async fn a_charged_order_sent_to_another_origin_is_reported_done_never_not_done() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = ledger(&dir).await;
    let client = client(&ledger, 3);
    let (first, second) = (
        Receiver::start().await.expect("receiver"),
        Receiver::start().await.expect("receiver"),
    );
    let key = IdempotencyKey::derive("tests.key_reuse", &["origin"]);
    let charged = client
        .post(first.url("/charges"))
        .idempotency_key(key.clone())
        .json(&order())
        .send()
        .await
        .expect("charged");
    assert_eq!(charged.status(), StatusCode::OK);

    // The same order, the same key, another port: a config change, a test server on port 0.
    let err = client
        .post(second.url("/charges"))
        .idempotency_key(key.clone())
        .json(&order())
        .send()
        .await
        .expect_err("the ledger holds the key for the first origin");
    assert_eq!(err.kind(), ErrorKind::KeyReuse);
    assert_eq!(second.arrivals(), 0, "nothing was sent");
    assert_eq!(first.effects(), 1, "one charge");
    assert_eq!(
        err.outcome(),
        Outcome::Done {
            key: Some(key.clone()),
            status: StatusCode::OK
        }
    );
    assert!(
        err.is_outcome_unknown(),
        "a caller that only asks whether it may have run is told yes"
    );
    let held = err.held_operation().expect("the ledger's record");
    assert_eq!(held.status, OperationStatus::Succeeded);
    assert_eq!(held.differs, Some(RequestPart::Origin));
    assert_eq!(held.answered, Some(StatusCode::OK));
    assert_eq!(held.method.as_deref(), Some("POST"));
    assert_eq!(held.url.as_deref(), Some(first.url("/charges").as_str()));
    assert_eq!(err.method(), Some("POST"));
    assert_eq!(err.url(), Some(second.url("/charges").as_str()));
    let text = err.to_string();
    let expected_start = format!(
        "POST http://{}/…: idempotency key reused for a different request: key {key} is \
         recorded as succeeded (answered 200 OK) for POST {}, first attempted at ",
        second.addr(),
        first.url("/charges")
    );
    assert!(text.starts_with(&expected_start), "{text}");
    let origin = second.url("");
    let expected_end = format!(
        "(scope 127.0.0.1); this request goes to another origin, {} (a key belongs to one \
         receiver: the fingerprint includes the origin); nothing was sent; the key's operation \
         is done: do not send that operation again under a new key; a different operation \
         needs a key of its own",
        origin.trim_end_matches('/')
    );
    assert!(text.ends_with(&expected_end), "{text}");
    assert_eq!(
        text.matches(key.as_str()).count(),
        1,
        "the key once: {text}"
    );
}

#[tokio::test]
async fn each_stored_status_gives_its_own_truth() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = ledger(&dir).await;
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/charges");
    let differently = serde_json::json!({"order": 17, "amount": 200});

    // A final refusal: answered 422, saved. Done, with that status.
    let refused = IdempotencyKey::derive("tests.key_reuse", &["refused"]);
    receiver.inject(When::key_attempt(&refused, 1), Fault::status(422));
    let answer = client(&ledger, 3)
        .post(&url)
        .idempotency_key(refused.clone())
        .json(&order())
        .send()
        .await
        .expect("a final answer");
    assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);

    // Refused before running to the end (429 with Retry-After on both attempts): it cannot
    // have run, though the receiver saw the key.
    let throttled = IdempotencyKey::derive("tests.key_reuse", &["throttled"]);
    for attempt in 1..=2 {
        receiver.inject(
            When::key_attempt(&throttled, attempt),
            Fault::retry_after_secs(429, 0),
        );
    }
    let err = client(&ledger, 2)
        .post(&url)
        .idempotency_key(throttled.clone())
        .json(&order())
        .send()
        .await
        .expect_err("throttled to the end");
    assert!(!err.is_outcome_unknown(), "{err}");

    // Unknown: the charge committed, the answer was lost, no attempt left.
    let lost = IdempotencyKey::derive("tests.key_reuse", &["lost"]);
    receiver.inject(When::key_attempt(&lost, 1), Fault::ResetAfterCommit);
    let err = client(&ledger, 1)
        .post(&url)
        .idempotency_key(lost.clone())
        .json(&order())
        .send()
        .await
        .expect_err("the answer was lost");
    assert!(err.is_outcome_unknown(), "{err}");

    // In flight: another worker holds the key right now (its claim, for another request).
    let held = IdempotencyKey::derive("tests.key_reuse", &["held"]);
    let now = TokioClock::new().wall();
    let claim = Claim::builder(
        held.as_str(),
        "a-fingerprint",
        "worker-b/run-1",
        now,
        now + Duration::from_secs(600),
    )
    .scope("127.0.0.1")
    .request("POST", url.as_str())
    .build()
    .expect("claim");
    ledger
        .claim(&claim)
        .await
        .expect("claimed by another worker");

    let arrivals = receiver.arrivals();
    let cases = [
        (
            &refused,
            OperationStatus::FailedFinal,
            Outcome::Done {
                key: Some(refused.clone()),
                status: StatusCode::UNPROCESSABLE_ENTITY,
            },
            "the key's operation was answered 422: act on that answer before sending anything \
             under a new key",
        ),
        (
            &throttled,
            OperationStatus::FailedFinal,
            Outcome::NotDone {
                key: Some(throttled.clone()),
            },
            "the key's operation cannot have run: a new key for this request is safe",
        ),
        (
            &lost,
            OperationStatus::Unknown,
            Outcome::Unknown {
                key: Some(lost.clone()),
            },
            "the key's operation may have run: reconcile it by this key, do not send that \
             operation under a new key; a different operation needs a key of its own",
        ),
        (
            &held,
            OperationStatus::InFlight,
            Outcome::Unknown {
                key: Some(held.clone()),
            },
            "the key's operation may have run: reconcile it by this key, do not send that \
             operation under a new key; a different operation needs a key of its own",
        ),
    ];
    for (key, status, outcome, verdict) in cases {
        let err = client(&ledger, 3)
            .post(&url)
            .idempotency_key(key.clone())
            .json(&differently)
            .send()
            .await
            .expect_err("another request under a held key");
        assert_eq!(err.kind(), ErrorKind::KeyReuse, "{status}");
        let record = err.held_operation().expect("the ledger's record");
        assert_eq!(record.status, status);
        assert_eq!(err.outcome(), outcome, "{status}");
        assert_eq!(
            err.is_outcome_unknown(),
            !matches!(outcome, Outcome::NotDone { .. }),
            "{status}"
        );
        let text = err.to_string();
        assert!(
            text.ends_with(&format!("; nothing was sent; {verdict}")),
            "{text}"
        );
        if status != OperationStatus::InFlight {
            assert!(text.contains("this request's body differs"), "{text}");
        }
    }
    assert_eq!(receiver.arrivals(), arrivals, "no refusal sent anything");
}

#[tokio::test]
async fn an_order_that_never_reached_a_receiver_frees_its_key_for_the_corrected_url() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = ledger(&dir).await;
    let key = IdempotencyKey::derive("tests.key_reuse", &["wrong port"]);
    let wrong = format!("{}/charges", closed_port());
    let err = client(&ledger, 2)
        .post(&wrong)
        .idempotency_key(key.clone())
        .json(&order())
        .send()
        .await
        .expect_err("nothing listens there");
    assert!(!err.is_outcome_unknown(), "{err}");
    assert_eq!(err.outcome().as_str(), "not_done");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::NotSent);
    assert_eq!(row.attempts, 2);

    // The corrected URL (and a corrected body): sent under the same key, which nobody saw.
    let receiver = Receiver::start().await.expect("receiver");
    let charged = client(&ledger, 2)
        .post(receiver.url("/charges"))
        .idempotency_key(key.clone())
        .json(&serde_json::json!({"order": 17, "amount": 120}))
        .send()
        .await
        .expect("sent under the freed key");
    assert_eq!(charged.status(), StatusCode::OK);
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(
        row.attempts, 3,
        "the history stays: two refused connects, then the charge"
    );
    assert_eq!(row.url.as_deref(), Some(receiver.url("/charges").as_str()));

    // Now the key is the receiver's: another request under it is refused, and told done.
    let err = client(&ledger, 2)
        .post(&wrong)
        .idempotency_key(key.clone())
        .json(&order())
        .send()
        .await
        .expect_err("held now");
    assert_eq!(err.kind(), ErrorKind::KeyReuse);
    assert_eq!(err.outcome().as_str(), "done");
}

#[tokio::test]
async fn an_operator_frees_a_key_by_hand_only_where_nothing_can_have_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = ledger(&dir).await;
    let receiver = Receiver::start().await.expect("receiver");
    let url = receiver.url("/charges");
    let now = TokioClock::new().wall();

    // Throttled to the end: the receiver saw the key but ran nothing. Released without force.
    let throttled = IdempotencyKey::derive("tests.key_reuse", &["release throttled"]);
    for attempt in 1..=2 {
        receiver.inject(
            When::key_attempt(&throttled, attempt),
            Fault::retry_after_secs(429, 0),
        );
    }
    client(&ledger, 2)
        .post(&url)
        .idempotency_key(throttled.clone())
        .json(&order())
        .send()
        .await
        .expect_err("throttled");
    let released = release_by_hand(
        &ledger,
        throttled.as_str(),
        "alice",
        "INC-7: wrong amount",
        false,
        now,
    )
    .await
    .expect("release");
    assert_eq!(released, Released::Released(OperationStatus::FailedFinal));
    let row = ledger
        .get(throttled.as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.status, OperationStatus::NotSent);
    assert_eq!(row.attempts, 2, "its history stays");
    let note = row.resolution.expect("the release is recorded");
    assert_eq!(note.kind, ResolutionKind::Released);
    assert_eq!(note.by, "operator alice");
    assert_eq!(note.reason.as_deref(), Some("INC-7: wrong amount"));
    // The corrected request goes out under the key.
    client(&ledger, 2)
        .post(&url)
        .idempotency_key(throttled.clone())
        .json(&serde_json::json!({"order": 17, "amount": 120}))
        .send()
        .await
        .expect("sent after the release");
    assert_eq!(receiver.effects_for(throttled.as_str()), 1);

    // Unknown: refused unless forced.
    let lost = IdempotencyKey::derive("tests.key_reuse", &["release lost"]);
    receiver.inject(When::key_attempt(&lost, 1), Fault::ResetAfterCommit);
    client(&ledger, 1)
        .post(&url)
        .idempotency_key(lost.clone())
        .json(&order())
        .send()
        .await
        .expect_err("lost");
    let refused = release_by_hand(&ledger, lost.as_str(), "alice", "INC-8", false, now)
        .await
        .expect("asked");
    assert_eq!(refused, Released::MayHaveRun(OperationStatus::Unknown));
    let row = ledger.get(lost.as_str()).await.expect("read").expect("row");
    assert_eq!(
        (row.status, row.resolution),
        (OperationStatus::Unknown, None),
        "unchanged"
    );
    let forced = release_by_hand(
        &ledger,
        lost.as_str(),
        "alice",
        "INC-8: refunded",
        true,
        now,
    )
    .await
    .expect("forced");
    assert_eq!(forced, Released::Released(OperationStatus::Unknown));

    // Succeeded: never, forced or not.
    let done = IdempotencyKey::derive("tests.key_reuse", &["release done"]);
    client(&ledger, 1)
        .post(&url)
        .idempotency_key(done.clone())
        .json(&order())
        .send()
        .await
        .expect("charged");
    for force in [false, true] {
        let answer = release_by_hand(&ledger, done.as_str(), "alice", "INC-9", force, now)
            .await
            .expect("asked");
        assert_eq!(answer, Released::Succeeded);
    }
    assert_eq!(
        release_by_hand(&ledger, "no-such-key", "alice", "INC-9", false, now)
            .await
            .expect("asked"),
        Released::Missing
    );
    let err = release_by_hand(&ledger, done.as_str(), "alice", "", false, now)
        .await
        .expect_err("a reason is required");
    assert!(err.to_string().contains("reason"), "{err}");
}
