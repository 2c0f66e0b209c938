//! Secrets at rest: a keyed request carrying a query key, a bearer token, an API-key header, a
//! URL password and a secret body field, answered with a token, leaves none of them in the raw
//! SQLite file or the PostgreSQL table once its answer is sealed; replays give the answer byte
//! for byte, sealed or not; a missing or wrong key is refused with nothing sent; keys rotate;
//! and the schema step redacts the URLs already stored but those a dispatcher may still send.
#![cfg(all(feature = "sqlite", feature = "postgres"))]

use std::path::Path;

use http::header::{CONTENT_TYPE, SET_COOKIE};
use idempotent_retry::ledger::{
    Ledger, LedgerError, LedgerErrorKind, LedgerOptions, PostgresLedger, SealKey, SqliteLedger,
};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryReport};
use idempotent_retry_postgres::tokio_postgres;
use idempotent_retry_sqlite::rusqlite;
use idempotent_retry_testkit::{Receiver, Reply};

use crate::support::*;

/// Every secret the request and its answer carry; none may reach the ledger's storage.
const SECRETS: [&str; 7] = [
    "QUERYSECRET9",
    "BEARERSECRET",
    "HEADERSECRET",
    "PASSWORDSECRET",
    "BODYSECRET",
    "ANSWERTOKEN",
    "COOKIETOKEN",
];

fn key(id: &str, byte: u8) -> SealKey {
    SealKey::new(id, [byte; 32]).expect("a valid key")
}

/// A receiver that answers every charge with a created API key and a session cookie.
async fn receiver() -> Receiver {
    Receiver::builder()
        .handler(|delivery| async move {
            let n = delivery.record_effect();
            Reply::json(
                201,
                &serde_json::json!({ "api_key": "ANSWERTOKEN", "effect": n }),
            )
            .header("set-cookie", "session=COOKIETOKEN; HttpOnly")
        })
        .start()
        .await
        .expect("receiver")
}

fn client(ledger: impl Ledger, keys: Vec<SealKey>) -> Client {
    Client::builder()
        .policy(fast())
        .ledger(ledger)
        .ledger_options(
            LedgerOptions::new()
                .saved_headers([CONTENT_TYPE, SET_COOKIE])
                .seal_keys(keys),
        )
        .build()
        .expect("valid client")
}

/// The answer as the caller sees it: status, headers and body.
type Answer = (u16, Vec<(String, Vec<u8>)>, Vec<u8>);

/// Sends the planted request under `key` and returns its answer and whether it was replayed.
async fn charge(client: &Client, receiver: &Receiver, key: &str) -> (Answer, bool) {
    let url = receiver
        .url("/charges/ok?api_key=QUERYSECRET9&page=2")
        .replace("http://", "http://merchant:PASSWORDSECRET@");
    let response = client
        .post(url)
        .idempotency_key(IdempotencyKey::derive("tests.secrets", &[key]))
        .header("authorization", "Bearer BEARERSECRET")
        .header("x-api-key", "HEADERSECRET")
        .json(&serde_json::json!({ "amount": 1200, "card": "BODYSECRET" }))
        .send()
        .await
        .expect("answered");
    let replayed = RetryReport::of(&response).is_some_and(RetryReport::is_replayed);
    let status = response.status().as_u16();
    let mut headers: Vec<(String, Vec<u8>)> = response
        .headers()
        .iter()
        .filter(|(name, _)| *name == CONTENT_TYPE || *name == SET_COOKIE)
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    headers.sort();
    let body = response.bytes().await.expect("body").to_vec();
    ((status, headers, body), replayed)
}

/// The ledger error at the bottom of a client error's sources.
fn ledger_error(err: &idempotent_retry::Error) -> &LedgerError {
    let mut source = std::error::Error::source(err);
    while let Some(err) = source {
        if let Some(found) = err.downcast_ref::<LedgerError>() {
            return found;
        }
        source = err.source();
    }
    panic!("no ledger error under {err}")
}

fn assert_no_secret(stored: &[u8], place: &str) {
    for secret in SECRETS {
        assert!(
            !stored.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} is in the {place}"
        );
    }
    // Not vacuous: the row is there, with its URL redacted.
    let redacted = "api_key=\u{2026}&page=\u{2026}";
    assert!(
        stored
            .windows(redacted.len())
            .any(|w| w == redacted.as_bytes()),
        "the row's redacted URL is not in the {place}"
    );
}

/// The SQLite file and its WAL, as bytes.
fn raw_sqlite(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).expect("read the file");
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    bytes.extend(std::fs::read(wal).unwrap_or_default());
    bytes
}

#[tokio::test]
async fn a_sealed_sqlite_ledger_keeps_no_planted_secret_and_replays_byte_for_byte() {
    let receiver = receiver().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ops.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let client = client(ledger, vec![key("k1", 1)]);
    let (first, replayed) = charge(&client, &receiver, "sealed").await;
    assert!(!replayed);
    assert!(
        first.1.iter().any(|(name, _)| name == "set-cookie"),
        "{first:?}"
    );
    let (again, replayed) = charge(&client, &receiver, "sealed").await;
    assert!(replayed, "answered from the ledger");
    assert_eq!(again, first, "status, headers and body byte for byte");
    assert_eq!(receiver.effects(), 1);
    drop(client);
    assert_no_secret(&raw_sqlite(&path), "SQLite file");

    // A reader sees the redacted URL and the key id, never the answer.
    let reader = SqliteLedger::open(&path).await.expect("open");
    let key = IdempotencyKey::derive("tests.secrets", &["sealed"]);
    let row = reader.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(
        row.url.as_deref(),
        Some(
            receiver
                .url("/charges/ok?api_key=\u{2026}&page=\u{2026}")
                .as_str()
        )
    );
    let saved = row.response.expect("saved");
    assert_eq!(saved.sealed_with.as_deref(), Some("k1"));
    assert!(saved.headers.is_empty());
}

#[tokio::test]
async fn an_unsealed_answer_replays_byte_for_byte_and_its_request_leaves_no_secret() {
    let receiver = receiver().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ops.db");
    let client = client(SqliteLedger::open(&path).await.expect("open"), Vec::new());
    let (first, _) = charge(&client, &receiver, "plain").await;
    let (again, replayed) = charge(&client, &receiver, "plain").await;
    assert!(replayed);
    assert_eq!(again, first);
    drop(client);
    let stored = raw_sqlite(&path);
    for secret in &SECRETS[..5] {
        assert!(
            !stored.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} is in the file"
        );
    }
    // Unsealed, the answer is kept as it came: what sealing is for.
    assert!(stored.windows(11).any(|w| w == b"ANSWERTOKEN"));
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_postgres_ledger_keeps_no_planted_secret_in_its_table() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let receiver = receiver().await;
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    let client = client(ledger, vec![key("k1", 1)]);
    let (first, _) = charge(&client, &receiver, "pg").await;
    let (again, replayed) = charge(&client, &receiver, "pg").await;
    assert!(replayed);
    assert_eq!(again, first);
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let rows = db
        .query("SELECT t::text FROM idempotent_operations t", &[])
        .await
        .expect("select");
    assert_eq!(rows.len(), 1);
    let text: String = rows[0].get(0);
    assert_no_secret(text.as_bytes(), "PostgreSQL table");
    // `::text` shows a body in hex: the stored bytes themselves, searched too.
    let row = db
        .query_one(
            "SELECT response_body, response_headers, response_key_id FROM idempotent_operations",
            &[],
        )
        .await
        .expect("select");
    let (body, headers, key_id): (Vec<u8>, String, String) = (row.get(0), row.get(1), row.get(2));
    for secret in SECRETS {
        assert!(
            !body.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret}"
        );
        assert!(!headers.contains(secret), "{secret}");
    }
    assert_eq!(key_id, "k1");
}

#[tokio::test]
async fn rotation_opens_old_rows_and_a_missing_or_wrong_key_is_refused_with_nothing_sent() {
    let receiver = receiver().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ops.db");
    let open = || SqliteLedger::open(&path);
    let (old, _) = charge(
        &client(open().await.expect("open"), vec![key("k1", 1)]),
        &receiver,
        "old",
    )
    .await;

    // Rotated: k2 seals, k1 still opens.
    let rotated = client(
        open().await.expect("open"),
        vec![key("k2", 2), key("k1", 1)],
    );
    let (replayed_old, replayed) = charge(&rotated, &receiver, "old").await;
    assert!(replayed);
    assert_eq!(replayed_old, old);
    let (new, _) = charge(&rotated, &receiver, "new").await;
    let (replayed_new, replayed) = charge(&rotated, &receiver, "new").await;
    assert!(replayed);
    assert_eq!(replayed_new, new);
    let reader = open().await.expect("open");
    let sealed_with = |name: &str| {
        let key = IdempotencyKey::derive("tests.secrets", &[name]);
        let reader = &reader;
        async move {
            reader
                .get(key.as_str())
                .await
                .expect("read")
                .and_then(|row| row.response)
                .and_then(|saved| saved.sealed_with)
        }
    };
    assert_eq!(sealed_with("old").await.as_deref(), Some("k1"));
    assert_eq!(sealed_with("new").await.as_deref(), Some("k2"));
    assert_eq!(receiver.effects(), 2);

    // k1 retired too early, no key at all, and another secret under k1: refused, not sent.
    for (keys, says) in [
        (
            vec![key("k2", 2)],
            "sealed with key id \"k1\", and those configured are k2",
        ),
        (
            Vec::new(),
            "sealed with key id \"k1\", and none is configured",
        ),
        (vec![key("k1", 7)], "does not open with key id \"k1\""),
    ] {
        let refusing = client(open().await.expect("open"), keys);
        let url = receiver.url("/charges/ok?api_key=QUERYSECRET9&page=2");
        let err = refusing
            .post(url.replace("http://", "http://merchant:PASSWORDSECRET@"))
            .idempotency_key(IdempotencyKey::derive("tests.secrets", &["old"]))
            .header("authorization", "Bearer BEARERSECRET")
            .header("x-api-key", "HEADERSECRET")
            .json(&serde_json::json!({ "amount": 1200, "card": "BODYSECRET" }))
            .send()
            .await
            .expect_err("a sealed answer this client cannot open");
        assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
        assert_eq!(err.attempts(), 0);
        assert_eq!(ledger_error(&err).kind(), LedgerErrorKind::Sealed);
        assert!(err.to_string().contains(says), "{err}");
        assert!(err.to_string().contains("nothing was sent"), "{err}");
    }
    assert_eq!(receiver.effects(), 2, "nothing sent again");
}

/// Rows as a version-5 store holds them: a finished one with a key in its URLs, a queued one
/// a dispatcher will still send, and one without a query.
const OLD_ROWS: &str = "INSERT INTO idempotent_operations (key, scope, fingerprint, status, \
     attempts, first_attempt_at, expires_at, method, url, response_status, response_url, \
     queued_at) VALUES \
     ('done', 's', 'f1', 'succeeded', 1, 0, 9000000000000, 'POST', \
      'https://h.example/charges?api_key=OLDSECRET&page=2', 200, \
      'https://h.example/done?sig=OLDSIG#frag', NULL), \
     ('queued', 's', 'f2', 'queued', 0, 0, 9000000000000, 'POST', \
      'https://h.example/charges?page=2&token=QUEUED', NULL, NULL, 0), \
     ('plain', 's', 'f3', 'unknown', 1, 0, 9000000000000, 'POST', \
      'https://h.example/charges', NULL, NULL, NULL)";

async fn urls_of(ledger: &dyn Ledger, key: &str) -> (Option<String>, Option<String>) {
    let row = ledger.get(key).await.expect("read").expect("row");
    (row.url, row.response.and_then(|saved| saved.url))
}

async fn assert_redacted_but_queued(ledger: &dyn Ledger) {
    assert_eq!(
        urls_of(ledger, "done").await,
        (
            Some("https://h.example/charges?api_key=\u{2026}&page=\u{2026}".to_owned()),
            Some("https://h.example/done?sig=\u{2026}".to_owned())
        )
    );
    assert_eq!(
        urls_of(ledger, "queued").await.0.as_deref(),
        Some("https://h.example/charges?page=2&token=QUEUED"),
        "a queued row keeps the URL it is sent to"
    );
    assert_eq!(
        urls_of(ledger, "plain").await.0.as_deref(),
        Some("https://h.example/charges")
    );
}

#[tokio::test]
async fn the_schema_step_redacts_stored_urls_but_those_a_dispatcher_will_send() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ops.db");
    drop(SqliteLedger::open(&path).await.expect("create"));
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(OLD_ROWS).expect("old rows");
    conn.pragma_update(None, "user_version", 5)
        .expect("version 5");
    drop(conn);
    let ledger = SqliteLedger::open(&path).await.expect("migrate");
    assert_eq!(
        ledger.schema_version().await.expect("version"),
        idempotent_retry_ledger::sql::SCHEMA_VERSION
    );
    assert_redacted_but_queued(&ledger).await;
}

#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgres_schema_step_redacts_stored_urls_but_those_a_dispatcher_will_send() {
    let Some(url) = fresh_postgres_database().await else {
        return;
    };
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    db.batch_execute(OLD_ROWS).await.expect("old rows");
    db.batch_execute("UPDATE idempotent_operations_schema SET version = 5")
        .await
        .expect("version 5");
    ledger.migrate().await.expect("migrate again");
    assert_redacted_but_queued(&ledger).await;
}
