//! Multipart forms against real loopback servers: a form of in-memory parts is sent again byte
//! for byte, with one boundary and one key; a form with a streamed part is sent once and the
//! caller is told why it was not resent.

use crate::support::*;
use idempotent_retry::ledger::{Ledger, MemoryLedger, SqliteLedger};
use idempotent_retry::multipart::{Form, Part};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryReport};

fn client() -> Client {
    Client::builder()
        .policy(fast())
        .build()
        .expect("valid policy")
}

fn evidence() -> Form {
    Form::new().text("purpose", "dispute_evidence").part(
        "file",
        Part::bytes(b"%PDF-1.7 receipt".to_vec())
            .file_name("receipt.pdf")
            .mime_str("application/pdf")
            .expect("a mime type"),
    )
}

fn streamed_part() -> Part {
    let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("line 1\n"), Ok("line 2\n")];
    Part::stream(reqwest::Body::wrap_stream(futures_util::stream::iter(
        chunks,
    )))
    .file_name("app.log")
}

#[tokio::test]
async fn an_in_memory_form_is_sent_again_byte_for_byte_with_one_boundary_and_one_key() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("stored")).await;
    let form = evidence();
    assert!(form.is_replayable());
    let boundary = form.boundary().to_owned();
    let response = client()
        .post(server.url("/v1/files"))
        .multipart(form)
        .send()
        .await
        .expect("the second attempt succeeds");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).cloned().expect("a report");
    assert_eq!(report.attempts(), 2);
    let key = report
        .idempotency_key()
        .cloned()
        .expect("a random key for a POST");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let content_type = format!("multipart/form-data; boundary={boundary}");
    for request in &requests {
        assert_eq!(request.header("content-type"), Some(content_type.as_str()));
        assert_eq!(request.header("idempotency-key"), Some(key.as_str()));
        assert_eq!(
            request.header("content-length"),
            Some(request.body.len().to_string().as_str())
        );
    }
    assert_eq!(
        requests[0].body, requests[1].body,
        "byte-identical attempts"
    );
    let body = requests[0].body_str();
    assert!(body.starts_with(&format!("--{boundary}\r\n")), "{body}");
    assert!(
        body.contains("name=\"purpose\"\r\n\r\ndispute_evidence\r\n"),
        "{body}"
    );
    assert!(body.contains("filename=\"receipt.pdf\""), "{body}");
    assert!(body.contains("%PDF-1.7 receipt"), "{body}");
    assert!(body.ends_with(&format!("--{boundary}--\r\n")), "{body}");
}

#[tokio::test]
async fn a_form_with_a_streamed_part_is_sent_once_and_the_error_says_why() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("stored")).await;
    let form = evidence().part("log", streamed_part());
    assert!(!form.is_replayable());
    assert_eq!(form.streamed_parts().collect::<Vec<_>>(), ["log"]);
    let err = client()
        .post(server.url("/v1/files"))
        .idempotency_key(IdempotencyKey::new("k_streamed_form").expect("valid"))
        .multipart(form)
        .send()
        .await
        .expect_err("a 503 cannot be retried with a stream");
    assert_eq!(err.kind(), ErrorKind::BodyNotReplayable, "{err}");
    assert!(err.to_string().contains("cannot be sent again"), "{err}");
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert_eq!(
        err.idempotency_key().map(IdempotencyKey::as_str),
        Some("k_streamed_form")
    );
    assert_eq!(server.hits(), 1, "sent once");
    let body = server.requests()[0].body_str();
    assert!(
        body.contains("line 1\nline 2\n"),
        "the streamed part arrived: {body}"
    );
}

#[tokio::test]
async fn a_reqwest_form_is_passed_through_and_sent_once() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
    let form = Form::from(reqwest::multipart::Form::new().text("a", "b"));
    assert!(!form.is_replayable());
    let err = client()
        .post(server.url("/"))
        .multipart(form)
        .send()
        .await
        .expect_err("not replayable");
    assert_eq!(err.kind(), ErrorKind::BodyNotReplayable);
    assert_eq!(server.hits(), 1);
    assert!(
        server.requests()[0]
            .body_str()
            .contains("name=\"a\"\r\n\r\nb\r\n")
    );
}

#[tokio::test]
async fn an_in_memory_form_has_one_fingerprint_in_the_ledger_and_a_clone_is_answered_from_it() {
    let server = TestServer::start(vec![Action::status(503)], Action::ok("stored")).await;
    let ledger = MemoryLedger::new();
    let client = Client::builder()
        .policy(fast())
        .ledger(ledger.clone())
        .build()
        .expect("valid");
    let key = IdempotencyKey::new("k_form_ledger").expect("valid");
    let builder = client
        .post(server.url("/v1/files"))
        .idempotency_key(key.clone())
        .multipart(evidence());
    let again = builder.try_clone().expect("an encoded form can be cloned");
    let first = builder.send().await.expect("the second attempt succeeds");
    assert_eq!(RetryReport::of(&first).map(RetryReport::attempts), Some(2));
    let replayed = again.send().await.expect("answered from the ledger");
    assert!(RetryReport::of(&replayed).is_some_and(RetryReport::is_replayed));
    assert_eq!(replayed.text().await.expect("body"), "stored");
    assert_eq!(server.hits(), 2, "the clone sent nothing");
    let row = ledger
        .get("k_form_ledger")
        .await
        .expect("ledger")
        .expect("a row");
    assert_eq!(row.attempts, 2);
}

#[tokio::test]
async fn the_same_form_built_again_after_a_restart_is_answered_from_the_ledger() {
    let server = TestServer::start(vec![], Action::ok("stored")).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let key = IdempotencyKey::new("k_form_restart").expect("valid");
    let mut boundaries = Vec::new();
    for run in 0..2 {
        // A process of its own each time: a new client, the ledger file opened again, and the
        // form built again, so its random boundary differs.
        let client = Client::builder()
            .policy(fast())
            .ledger(SqliteLedger::open(&path).await.expect("open"))
            .build()
            .expect("valid");
        let form = evidence();
        boundaries.push(form.boundary().to_owned());
        let response = client
            .post(server.url("/v1/files"))
            .idempotency_key(key.clone())
            .multipart(form)
            .send()
            .await
            .unwrap_or_else(|err| panic!("run {run}: {err}"));
        let report = RetryReport::of(&response).expect("report").clone();
        assert_eq!(report.is_replayed(), run == 1, "run {run}");
        assert_eq!(response.text().await.expect("body"), "stored");
    }
    assert_ne!(boundaries[0], boundaries[1]);
    assert_eq!(server.hits(), 1, "the second run sent nothing");
}

#[tokio::test]
async fn a_streamed_form_with_a_ledger_is_refused_before_anything_is_sent() {
    let server = TestServer::start(vec![], Action::ok("")).await;
    let client = Client::builder()
        .policy(fast())
        .ledger(MemoryLedger::new())
        .build()
        .expect("valid");
    let err = client
        .post(server.url("/v1/files"))
        .idempotency_key(IdempotencyKey::new("k_form_stream_ledger").expect("valid"))
        .multipart(Form::new().part("log", streamed_part()))
        .send()
        .await
        .expect_err("a stream cannot be fingerprinted");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert!(err.to_string().contains("buffered body"), "{err}");
    assert_eq!(server.hits(), 0);
}
