//! An answer whose head arrived and whose body was then cut: a bounded one is a failed attempt,
//! retried with its key (the receiver answers from its store), so the caller gets the whole
//! answer; a streamed one fails while it is read, with the key and how to get it again.

use std::time::Duration;

use idempotent_retry::{Client, IdempotencyKey, RetryReport};
use idempotent_retry_testkit::{Fault, Receiver, When};

use crate::support::front::{Call, Kind};
use crate::support::*;

fn fast_builder() -> idempotent_retry::ClientBuilder {
    Client::builder().policy(fast())
}

#[tokio::test]
async fn a_bounded_answer_cut_mid_body_is_retried_and_whole_on_every_front_end() {
    for kind in Kind::LEDGERED {
        let receiver = Receiver::start().await.expect("receiver");
        let key = IdempotencyKey::derive("tests.cut_answers", &["bounded", &format!("{kind:?}")]);
        // The first delivery runs (one effect), then its answer's head goes out with five bytes
        // of its body, and the connection closes.
        receiver.inject(
            When::key_attempt(key.as_str(), 1),
            Fault::CutBodyAfterCommit(5),
        );
        let front = kind.build(fast_builder());
        let reply = front
            .send(
                Call::post(receiver.url("/v1/charges"))
                    .json(r#"{"amount":100,"currency":"eur"}"#)
                    .key(key.clone()),
            )
            .await
            .unwrap_or_else(|err| panic!("{}: the whole answer: {err}", front.name()));
        assert_eq!(reply.status, 200, "{}", front.name());
        let body: serde_json::Value = serde_json::from_str(&reply.body)
            .unwrap_or_else(|err| panic!("{}: a whole JSON body: {err}", front.name()));
        assert_eq!(body["effect"], 1, "{}: {body}", front.name());
        assert_eq!(reply.report.attempts(), 2, "{}", front.name());
        let first = &reply.report.history()[0];
        assert_eq!(
            first.failure.map(|kind| kind.as_str()),
            Some("connection_closed"),
            "{}: {first:?}",
            front.name()
        );
        assert_eq!(
            first.status.map(|status| status.as_u16()),
            Some(200),
            "{}: the cut answer's status is in the history",
            front.name()
        );
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{}", front.name());
    }
}

#[tokio::test]
async fn a_streamed_answer_cut_mid_body_names_the_key_and_the_same_request_gets_it_again() {
    let receiver = Receiver::start().await.expect("receiver");
    let key = IdempotencyKey::derive("tests.cut_answers", &["streamed"]);
    receiver.inject(
        When::key_attempt(key.as_str(), 1),
        Fault::CutBodyAfterCommit(3),
    );
    // Bodies longer than 4 bytes stream: this one is cut while the caller reads it.
    let client = fast_builder().answer_read_limit(4).build().expect("client");
    let send = || {
        client
            .post(receiver.url("/v1/charges"))
            .idempotency_key(key.clone())
            .json(&serde_json::json!({"amount": 100}))
            .send()
    };
    let response = send().await.expect("the head arrived");
    assert_eq!(response.status(), 200);
    let err = response.text().await.expect_err("the body was cut");
    let chain = error_chain(&err);
    assert!(
        chain.contains("the answer's body was cut after the receiver answered 200")
            && chain.contains(&format!("idempotency key {key}"))
            && chain.contains("effect may stand"),
        "{chain}"
    );
    // The same request, sent again with its key: the receiver answers from its store.
    let again = send().await.expect("answered again");
    let report = RetryReport::of(&again).expect("report").clone();
    assert_eq!(report.attempts(), 1);
    let body: serde_json::Value = again.json().await.expect("whole body");
    assert_eq!(body["effect"], 1);
    assert_eq!(receiver.effects_for(key.as_str()), 1);
}

#[tokio::test]
async fn a_bounded_answer_shorter_than_its_length_is_a_failed_attempt() {
    // The head arrives with a length the body never reaches: the attempt fails as a whole and
    // the retry, with the same key, gets the answer.
    let server = TestServer::start(
        vec![Action::partial_body("{\"id\":")],
        Action::json(200, r#"{"id":"ch_1"}"#),
    )
    .await;
    let key = IdempotencyKey::derive("tests.cut_answers", &["partial"]);
    let client = Client::builder()
        .policy(fast().with_attempt_timeout(Duration::from_secs(5)))
        .build()
        .expect("client");
    let response = client
        .post(server.url("/charges"))
        .idempotency_key(key.clone())
        .body("charge")
        .send()
        .await
        .expect("the retry's whole answer");
    let report = RetryReport::of(&response).expect("report").clone();
    assert_eq!(report.attempts(), 2);
    assert_eq!(response.text().await.expect("body"), r#"{"id":"ch_1"}"#);
    assert_eq!(server.keys(), vec![Some(key.to_string()); 2]);
}

/// `err` and its causes, one per line.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push('\n');
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
