//! A succeeded operation whose answer's body was longer than the ledger keeps: a later run
//! never replays it as an empty success. Inside the window it sends the operation again with
//! its key (the receiver answers from its store); with that turned off, or past the window, it
//! says so, naming the key, the size and the limit.

use std::time::Duration;

use idempotent_retry::ledger::{Ledger, LedgerOptions, MemoryLedger, OperationStatus};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, Outcome, RetryReport};

use crate::support::*;

/// 94 bytes: longer than the 16 the ledgers here keep.
const BIG: &str = "{\"id\":\"ch_1\",\"receipt\":\"....................................................................\"}";
const WINDOW: Duration = Duration::from_secs(3600);

fn client(ledger: &MemoryLedger, time: &VirtualTime, options: LedgerOptions) -> Client {
    Client::builder()
        .policy(fast().with_reconcile_window(WINDOW))
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger.clone())
        .ledger_options(options.max_body(16))
        .build()
        .expect("valid policy")
}

async fn charge(
    client: &Client,
    url: &str,
    key: &IdempotencyKey,
) -> Result<reqwest::Response, idempotent_retry::Error> {
    client
        .post(url)
        .idempotency_key(key.clone())
        .body("charge")
        .send()
        .await
}

#[tokio::test]
async fn an_answer_too_long_to_keep_is_fetched_again_with_its_key_not_replayed_empty() {
    assert_eq!(BIG.len(), 94);
    let server = TestServer::start_idempotent(vec![], Action::json(200, BIG)).await;
    let (ledger, time) = (MemoryLedger::new(), VirtualTime::new());
    let client = client(&ledger, &time, LedgerOptions::new());
    let key = IdempotencyKey::derive("tests.unsaved_answers", &["fetched"]);
    let url = server.url("/charges");

    let first = charge(&client, &url, &key).await.expect("answered");
    assert_eq!(first.text().await.expect("body"), BIG);
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
    let saved = row.response.expect("the answer's head is kept");
    assert_eq!(saved.body, None, "too long to keep");
    assert!(
        saved
            .headers
            .contains(&("content-length".to_owned(), "94".to_owned())),
        "its length is kept: {:?}",
        saved.headers
    );

    // The next run with the key: sent again, answered by the receiver's store.
    let again = charge(&client, &url, &key).await.expect("fetched again");
    let report = RetryReport::of(&again).expect("report").clone();
    assert!(report.is_refetched());
    assert!(!report.is_replayed());
    assert_eq!(report.attempts(), 1);
    assert_eq!(
        again.text().await.expect("body"),
        BIG,
        "never an empty body"
    );
    assert_eq!(server.keys(), vec![Some(key.to_string()); 2]);
    assert_eq!(server.effects(), 1, "the receiver answered from its store");
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(
        row.status,
        OperationStatus::Succeeded,
        "the row keeps its record"
    );
}

#[tokio::test]
async fn with_fetching_off_or_past_the_window_the_run_says_so_and_sends_nothing() {
    let server = TestServer::start_idempotent(vec![], Action::json(200, BIG)).await;
    let (ledger, time) = (MemoryLedger::new(), VirtualTime::new());
    let key = IdempotencyKey::derive("tests.unsaved_answers", &["refused"]);
    let url = server.url("/charges");
    let sender = client(&ledger, &time, LedgerOptions::new());
    charge(&sender, &url, &key).await.expect("answered");

    let strict = client(
        &ledger,
        &time,
        LedgerOptions::new().fetch_unsaved_answers(false),
    );
    let err = charge(&strict, &url, &key)
        .await
        .expect_err("no empty success");
    assert_eq!(err.kind(), ErrorKind::AnswerNotSaved, "{err}");
    assert_eq!(err.idempotency_key(), Some(&key));
    assert!(!err.is_outcome_unknown());
    assert_eq!(err.outcome().as_str(), "done");
    assert!(matches!(err.outcome(), Outcome::Done { status, .. } if status == 200));
    let text = err.to_string();
    for part in [
        "its answer's body (94 bytes) was longer than the ledger keeps (16 bytes, LedgerOptions::max_body)",
        "nothing was sent",
        "LedgerOptions::fetch_unsaved_answers(true)",
        key.as_str(),
    ] {
        assert!(text.contains(part), "{part:?} in {text}");
    }
    assert!(!text.contains("not executed"), "{text}");

    // Past the window the receiver may have forgotten the key: not sent, even when allowed.
    time.advance(WINDOW + Duration::from_secs(1));
    let err = charge(&sender, &url, &key)
        .await
        .expect_err("past the window");
    assert_eq!(err.kind(), ErrorKind::AnswerNotSaved, "{err}");
    assert!(
        err.to_string()
            .contains("look the answer up at the receiver under it"),
        "{err}"
    );
    assert_eq!(server.hits(), 1, "nothing sent after the first");
}

#[tokio::test]
async fn an_answer_the_ledger_keeps_replays_as_before() {
    let server = TestServer::start_idempotent(vec![], Action::json(200, "{\"id\":1}")).await;
    let (ledger, time) = (MemoryLedger::new(), VirtualTime::new());
    let client = client(&ledger, &time, LedgerOptions::new());
    let key = IdempotencyKey::derive("tests.unsaved_answers", &["kept"]);
    let url = server.url("/charges");
    charge(&client, &url, &key).await.expect("answered");
    let replayed = charge(&client, &url, &key).await.expect("replayed");
    let report = RetryReport::of(&replayed).expect("report").clone();
    assert!(report.is_replayed() && !report.is_refetched());
    assert_eq!(replayed.text().await.expect("body"), "{\"id\":1}");
    assert_eq!(server.hits(), 1);
}
