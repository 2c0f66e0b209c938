//! The client with a ledger, against real loopback servers: what reached the server, with which
//! key, what the ledger holds, what the caller was told. These run on the in-memory ledger;
//! `ledger_sqlite.rs` and `ledger_postgres.rs` cover durability and fleets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use std::sync::Mutex;

use crate::support::*;
use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, LeaseHeldPolicy, Ledger, LedgerError, LedgerErrorKind,
    LedgerFuture, LedgerOptions, ListFilter, MemoryLedger, OperationRecord, OperationStatus,
    ReconcileClaim, Renew, Resolve,
};
use idempotent_retry::observe::{LedgerVerdict, OperationEvent};
use idempotent_retry::redirect::RedirectChain;
use idempotent_retry::{
    Client, ErrorKind, FailureKind, IdempotencyKey, RedirectPolicy, RetryPolicy, RetryReport,
};
use tokio::sync::Semaphore;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Millisecond backoff; attempt timeouts long enough that hit counts are exact.
fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(ms(1))
        .with_max_delay(ms(5))
        .with_attempt_timeout(Duration::from_secs(5))
}

fn ledger_client(ledger: impl Ledger, options: LedgerOptions, policy: RetryPolicy) -> Client {
    Client::builder()
        .policy(policy)
        .ledger(ledger)
        .ledger_options(options)
        .build()
        .expect("valid policy")
}

/// A client on virtual time (waits and window), with a ledger.
fn virtual_ledger_client(
    ledger: impl Ledger,
    options: LedgerOptions,
    policy: RetryPolicy,
) -> (Client, VirtualTime) {
    let time = VirtualTime::new();
    let client = Client::builder()
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .rng_seed(7)
        .ledger(ledger)
        .ledger_options(options)
        .build()
        .expect("valid policy");
    (client, time)
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.ledger", &[name])
}

/// One keyed POST: the request most tests here send, with the key given explicitly.
async fn post_keyed(
    client: &Client,
    url: impl reqwest::IntoUrl,
    key: &IdempotencyKey,
    body: &'static str,
) -> Result<reqwest::Response, idempotent_retry::Error> {
    let request = client.post(url).idempotency_key(key.clone());
    let request = if body.is_empty() {
        request
    } else {
        request.body(body)
    };
    request.send().await
}

async fn row(ledger: &dyn Ledger, key: &IdempotencyKey) -> OperationRecord {
    ledger
        .get(key.as_str())
        .await
        .expect("ledger readable")
        .expect("the operation has a row")
}

#[tokio::test]
async fn a_succeeded_operation_is_replayed_without_a_request() {
    let server = TestServer::start_idempotent(
        vec![Action::status(503)],
        Action::respond(
            201,
            &[("Content-Type", "application/json")],
            r#"{"id":"ch_1"}"#,
        ),
    )
    .await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let k = key("replay");
    let body = serde_json::json!({"amount": 100});

    let first = client
        .post(server.url("/charges"))
        .idempotency_key(k.clone())
        .json(&body)
        .send()
        .await
        .expect("the second attempt succeeds");
    assert_eq!(first.status(), 201);
    assert!(!RetryReport::of(&first).expect("report").is_replayed());
    assert_eq!(first.text().await.expect("body"), r#"{"id":"ch_1"}"#);
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.attempts, 2);
    assert_eq!(stored.lease_owner, None);
    assert_eq!(stored.scope, "127.0.0.1");

    let again = client
        .post(server.url("/charges"))
        .idempotency_key(k.clone())
        .json(&body)
        .send()
        .await
        .expect("replayed");
    assert_eq!(server.hits(), 2, "the replay sent nothing");
    assert_eq!(server.effects(), 1);
    assert_eq!(again.status(), 201);
    assert_eq!(again.url().as_str(), server.url("/charges"));
    assert_eq!(
        again.headers().get("content-type").map(|v| v.to_str().ok()),
        Some(Some("application/json"))
    );
    let report = RetryReport::of(&again).expect("report").clone();
    assert!(report.is_replayed());
    assert!(!report.is_replay_body_missing());
    assert_eq!(report.attempts(), 0);
    assert_eq!(report.idempotency_key(), Some(&k));
    assert_eq!(again.text().await.expect("body"), r#"{"id":"ch_1"}"#);
}

#[tokio::test]
async fn a_body_over_the_limit_is_returned_and_fetched_again_never_replayed_empty() {
    let server = TestServer::start(vec![], Action::ok("0123456789")).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new().max_body(4), fast());
    let k = key("big-body");
    let first = post_keyed(&client, server.url("/x"), &k, "payload")
        .await
        .expect("ok");
    assert_eq!(first.text().await.expect("body"), "0123456789");
    let again = post_keyed(&client, server.url("/x"), &k, "payload")
        .await
        .expect("fetched again");
    assert_eq!(server.hits(), 2, "sent again with its key");
    assert_eq!(server.keys(), vec![Some(k.to_string()); 2]);
    let report = RetryReport::of(&again).expect("report").clone();
    assert!(report.is_refetched() && !report.is_replayed());
    assert_eq!(again.text().await.expect("body"), "0123456789");
}

#[tokio::test]
async fn the_same_key_for_another_request_is_refused_locally() {
    let server = TestServer::start(vec![], Action::ok("done")).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let k = key("reuse");
    client
        .post(server.url("/charges"))
        .idempotency_key(k.clone())
        .json(&serde_json::json!({"amount": 100}))
        .send()
        .await
        .expect("first");
    let err = client
        .post(server.url("/charges"))
        .idempotency_key(k.clone())
        .json(&serde_json::json!({"amount": 200}))
        .send()
        .await
        .expect_err("same key, different body");
    assert_eq!(err.kind(), ErrorKind::KeyReuse);
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.attempts(), 0);
    // The key's operation succeeded: the refusal says so, never "not done".
    assert!(err.is_outcome_unknown());
    assert_eq!(err.outcome().as_str(), "done");
    assert!(err.to_string().contains("nothing was sent"), "{err}");
    assert_eq!(server.hits(), 1, "the second request never left");
    // The same payload spelled differently is the same request: replayed.
    let replay = client
        .post(server.url("/charges"))
        .idempotency_key(k)
        .header("content-type", "application/json")
        .body(r#"{ "amount": 100.0 }"#)
        .send()
        .await
        .expect("same request");
    assert!(RetryReport::of(&replay).expect("report").is_replayed());
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn an_operation_in_flight_elsewhere_is_refused_then_waited_for() {
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(ms(400), Action::ok("charged"))],
        Action::ok("charged"),
    )
    .await;
    let ledger = MemoryLedger::new();
    let k = key("in-flight");
    let first = ledger_client(ledger.clone(), LedgerOptions::new().worker("a"), fast());
    let sending = tokio::spawn({
        let url = server.url("/charges");
        let k = k.clone();
        async move { first.post(url).idempotency_key(k).body("x").send().await }
    });
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(5)).await, 1);

    let impatient = ledger_client(
        ledger.clone(),
        LedgerOptions::new()
            .worker("b")
            .on_lease_held(LeaseHeldPolicy::Fail),
        fast(),
    );
    let err = post_keyed(&impatient, server.url("/charges"), &k, "x")
        .await
        .expect_err("the first run holds the lease");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert!(
        err.is_outcome_unknown(),
        "the other run may be executing it"
    );
    assert!(err.to_string().contains("held by worker a (run "), "{err}");

    let patient = ledger_client(
        ledger.clone(),
        LedgerOptions::new().on_lease_held(LeaseHeldPolicy::Wait {
            poll: ms(20),
            max_wait: Duration::from_secs(10),
        }),
        fast(),
    );
    let waited = post_keyed(&patient, server.url("/charges"), &k, "x")
        .await
        .expect("replayed once the first run finished");
    assert!(RetryReport::of(&waited).expect("report").is_replayed());
    assert_eq!(waited.text().await.expect("body"), "charged");
    let first = sending.await.expect("task").expect("first run");
    assert_eq!(first.status(), 200);
    assert_eq!(server.hits(), 1, "one request in all");
    assert_eq!(server.effects(), 1);
}

#[tokio::test]
async fn an_unknown_outcome_resumes_with_the_same_key_and_counts_attempts() {
    let server = TestServer::start_idempotent(
        vec![Action::status(503), Action::status(503)],
        Action::ok("ok"),
    )
    .await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(
        ledger.clone(),
        LedgerOptions::new(),
        fast().with_max_attempts(2),
    );
    let k = key("resume");
    let err = post_keyed(&client, server.url("/x"), &k, "b")
        .await
        .expect_err("two 503s");
    assert!(err.is_outcome_unknown());
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::Unknown);
    assert_eq!(stored.attempts, 2);
    let first_at = stored.first_attempt_at;

    let ok = post_keyed(&client, server.url("/x"), &k, "b")
        .await
        .expect("third attempt succeeds");
    assert_eq!(ok.status(), 200);
    assert_eq!(server.keys(), vec![Some(k.to_string()); 3]);
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.attempts, 3);
    assert_eq!(
        stored.first_attempt_at, first_at,
        "the window start is kept"
    );
}

#[tokio::test]
async fn a_later_run_that_cannot_connect_still_reports_the_earlier_unknown() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(
        ledger.clone(),
        LedgerOptions::new(),
        fast().with_max_attempts(1),
    );
    let k = key("earlier-unknown");
    let url = server.url("/x");
    let err = post_keyed(&client, &url, &k, "").await.expect_err("503");
    assert!(err.is_outcome_unknown());
    drop(server);
    // Same request (same URL), but nobody listens any more: this run cannot have executed
    // it, the first one may have.
    let err = post_keyed(&client, &url, &k, "")
        .await
        .expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert!(
        err.is_outcome_unknown(),
        "the earlier run's 503 may have executed"
    );
    assert_eq!(row(&ledger, &k).await.status, OperationStatus::Unknown);
}

#[tokio::test]
async fn a_definite_failure_is_failed_final_and_sent_again_later() {
    let server = TestServer::start(vec![Action::status(400)], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let k = key("failed-final");
    let bad = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("a 400 is a final answer");
    assert_eq!(bad.status(), 400);
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::FailedFinal);
    assert_eq!(stored.response.map(|r| r.status), Some(400));
    let ok = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("sent again");
    assert_eq!(ok.status(), 200);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn the_window_spans_runs_and_a_late_run_sends_nothing() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let ledger = MemoryLedger::new();
    let policy = fast()
        .with_max_attempts(2)
        .with_reconcile_window(Duration::from_secs(3600));
    let (client, time) = virtual_ledger_client(ledger.clone(), LedgerOptions::new(), policy);
    let k = key("window");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("503s");
    assert!(err.is_outcome_unknown());
    assert_eq!(server.hits(), 2);

    // 59 minutes later the window has one minute left: the run goes on, inside it.
    time.advance(Duration::from_secs(59 * 60));
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("503s");
    assert_eq!(server.hits(), 4);
    assert!(err.is_outcome_unknown());

    time.advance(Duration::from_secs(61));
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the window closed an hour after the first attempt");
    assert_eq!(err.kind(), ErrorKind::ReconcileWindow);
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    // 59 min + 61 s, plus the two millisecond backoff waits.
    assert!(
        err.to_string()
            .contains("first attempted at 2024-01-01T00:00:00Z, 1h 1s ago"),
        "{err}"
    );
    assert_eq!(server.hits(), 4, "nothing sent after the window");
}

#[tokio::test]
async fn a_crashed_run_leaves_a_lapsing_lease_and_the_next_run_takes_over() {
    let server = TestServer::start_idempotent(vec![Action::hang()], Action::ok("done")).await;
    let ledger = MemoryLedger::new();
    let options = LedgerOptions::new()
        .lease(Duration::from_secs(30))
        .on_lease_held(LeaseHeldPolicy::Fail);
    let (client, time) = virtual_ledger_client(ledger.clone(), options, fast());
    let k = key("crash");
    // The process dies mid-attempt: nothing after the send runs, no destructor either.
    die_when(
        client
            .post(server.url("/x"))
            .idempotency_key(k.clone())
            .send(),
        server.wait_for_hits(1, Duration::from_secs(5)),
    )
    .await;
    assert_eq!(server.hits(), 1);
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::InFlight);
    assert!(stored.lease_owner.is_some());

    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the lease is still live");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert_eq!(server.hits(), 1);

    // One lease (30 s) later, with no renewal from the dead run, the lease has lapsed.
    time.advance(Duration::from_secs(31));
    let ok = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("taken over");
    assert_eq!(ok.status(), 200);
    assert_eq!(server.keys(), vec![Some(k.to_string()); 2], "the same key");
    let stored = row(&ledger, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(
        stored.first_attempt_at,
        time.wall_now() - Duration::from_secs(31)
    );
    assert_eq!(
        stored.attempts, 2,
        "the dead run's request and the new run's, as the receiver saw them"
    );
}

#[tokio::test]
async fn requests_without_a_key_bypass_the_ledger_and_streams_are_refused() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    client
        .get(server.url("/x"))
        .send()
        .await
        .expect("a GET without a key");
    assert!(ledger.is_empty());
    let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("x"))]);
    let err = client
        .post(server.url("/x"))
        .idempotency_key(key("stream"))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect_err("a stream has no fingerprint");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert_eq!(server.hits(), 1);
    assert!(ledger.is_empty());
}

#[tokio::test]
async fn purge_deletes_expired_rows_in_batches_and_refuses_a_zero_limit() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let policy = fast().with_reconcile_window(Duration::from_secs(60));
    let options = LedgerOptions::new()
        .retention(Duration::from_secs(3600))
        .scope_retention("long", Duration::from_secs(7200));
    let (client, time) = virtual_ledger_client(ledger.clone(), options, policy);
    for i in 0..5 {
        client
            .post(server.url("/x"))
            .idempotency_key(key(&format!("purge-{i}")))
            .send()
            .await
            .expect("ok");
    }
    client
        .post(server.url("/x"))
        .idempotency_key(key("purge-long"))
        .ledger_scope("long")
        .send()
        .await
        .expect("ok");
    assert_eq!(ledger.len(), 6);
    assert_eq!(
        client.purge_expired(2).await.expect("nothing expired yet"),
        0
    );
    time.advance(Duration::from_secs(3600));
    assert_eq!(client.purge_expired(2).await.expect("purged"), 5);
    assert_eq!(ledger.len(), 1, "the long scope is kept");
    // The ledger's own error, not an operation error: no key, no attempts to report.
    let err: LedgerError = client.purge_expired(0).await.expect_err("zero limit");
    assert_eq!(err.kind(), LedgerErrorKind::InvalidInput);
    assert_eq!(ledger.len(), 1, "nothing deleted by a refused purge");
    time.advance(Duration::from_secs(3600));
    assert_eq!(client.purge_expired(100).await.expect("purged"), 1);
    assert!(ledger.is_empty());
}

#[tokio::test]
async fn retention_is_never_shorter_than_two_windows() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let ledger = MemoryLedger::new();
    let policy = fast().with_reconcile_window(Duration::from_secs(24 * 3600));
    let options = LedgerOptions::new().retention(Duration::from_secs(60));
    let (client, time) = virtual_ledger_client(ledger.clone(), options, policy);
    let k = key("retention-floor");
    post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("ok");
    let stored = row(&ledger, &k).await;
    assert_eq!(
        stored.expires_at,
        stored.first_attempt_at + Duration::from_secs(48 * 3600)
    );
    time.advance(Duration::from_secs(3600));
    assert_eq!(client.purge_expired(10).await.expect("purge"), 0);
}

/// A ledger whose writes can be made to fail, or the next attempt record to stall, around a
/// memory ledger.
#[derive(Debug, Clone, Default)]
struct Faulty {
    inner: MemoryLedger,
    /// Claims made so far; every claim after the hundredth fails, so a claim loop that never
    /// ends fails its test instead of hanging it.
    claims: Arc<AtomicU32>,
    fail_claim: Arc<AtomicBool>,
    fail_record: Arc<AtomicBool>,
    fail_finish: Arc<AtomicBool>,
    /// Renewals fail (the store is unreachable for them).
    fail_renew: Arc<AtomicBool>,
    /// Renewals written so far.
    renewals: Arc<AtomicU32>,
    pause: Arc<Pause>,
    /// `record_attempt` and `finish` calls so far.
    records: Arc<AtomicU32>,
    finishes: Arc<AtomicU32>,
}

/// Stalls the next write after an attempt (`record_attempt`, or the `finish` that counts the
/// last attempt) until the test resumes it: the worker is frozen between its attempt and that
/// write, for exactly as long as the test wants, whatever the machine's speed.
#[derive(Debug)]
struct Pause {
    armed: AtomicBool,
    reached: Semaphore,
    resume: Semaphore,
}

impl Default for Pause {
    fn default() -> Self {
        Pause {
            armed: AtomicBool::new(false),
            reached: Semaphore::new(0),
            resume: Semaphore::new(0),
        }
    }
}

impl Pause {
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until `run`'s write after its attempt has stalled. Fails the test if `run` ends
    /// first: it never wrote one.
    async fn reached<T: std::fmt::Debug>(&self, run: &mut tokio::task::JoinHandle<T>) {
        tokio::select! {
            permit = self.reached.acquire() => permit.expect("open").forget(),
            ended = run => panic!("the run ended without recording its attempt: {ended:?}"),
        }
    }

    fn resume(&self) {
        self.resume.add_permits(1);
    }

    async fn stall_if_armed(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.reached.add_permits(1);
            self.resume.acquire().await.expect("open").forget();
        }
    }
}

fn outage() -> LedgerError {
    LedgerError::new(LedgerErrorKind::Unavailable, "disk on fire")
}

impl Ledger for Faulty {
    fn clock(&self) -> LedgerFuture<'_, idempotent_retry::ledger::LedgerClock> {
        self.inner.clock()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        let earlier = self.claims.fetch_add(1, Ordering::SeqCst);
        if self.fail_claim.load(Ordering::SeqCst) || earlier >= 100 {
            return Box::pin(async { Err(outage()) });
        }
        self.inner.claim(claim)
    }
    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        self.records.fetch_add(1, Ordering::SeqCst);
        if self.fail_record.load(Ordering::SeqCst) {
            return Box::pin(async { Err(outage()) });
        }
        Box::pin(async move {
            self.pause.stall_if_armed().await;
            self.inner.record_attempt(update).await
        })
    }
    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        if self.fail_renew.load(Ordering::SeqCst) {
            return Box::pin(async { Err(outage()) });
        }
        Box::pin(async move {
            self.inner.renew(renew).await?;
            self.renewals.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
    }
    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        self.finishes.fetch_add(1, Ordering::SeqCst);
        if self.fail_finish.load(Ordering::SeqCst) {
            return Box::pin(async { Err(outage()) });
        }
        Box::pin(async move {
            if finish.last_attempt_at.is_some() {
                self.pause.stall_if_armed().await;
            }
            self.inner.finish(finish).await
        })
    }
    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        self.inner.get(key)
    }
    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        self.inner.purge_batch(now, limit)
    }
    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        self.inner.claim_unresolved(claim)
    }
    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        self.inner.resolve(resolve)
    }
    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        self.inner.list(filter)
    }
}

#[tokio::test]
async fn no_request_is_sent_without_its_claim_recorded() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let faulty = Faulty::default();
    faulty.fail_claim.store(true, Ordering::SeqCst);
    let client = ledger_client(faulty.clone(), LedgerOptions::new(), fast());
    let k = key("claim-fails");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the claim failed");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(!err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.attempts(), 0);
    assert_eq!(server.hits(), 0);
    assert!(err.to_string().contains("nothing was sent"), "{err}");
}

#[tokio::test]
async fn an_attempt_that_cannot_be_recorded_is_reported_as_unknown_with_its_key() {
    // The first attempt meets a 503 and a retry is decided: the retry is recorded before it is
    // sent, and that record fails, so it is not sent.
    let server =
        TestServer::start_idempotent(vec![Action::status(503)], Action::ok("charged")).await;
    let faulty = Faulty::default();
    faulty.fail_record.store(true, Ordering::SeqCst);
    let options = LedgerOptions::new().lease(Duration::from_secs(10));
    let (client, time) = virtual_ledger_client(faulty.clone(), options, fast());
    let k = key("record-fails");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the attempt could not be recorded");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.attempts(), 1);
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert!(
        err.to_string()
            .contains("attempt 2 could not be recorded, so it was not sent"),
        "{err}"
    );
    assert_eq!(server.hits(), 1, "no retry after a record that failed");
    // The finish went through, so the row says "unknown": the next run sends again with the
    // same key and the receiver deduplicates it.
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Unknown);

    faulty.fail_record.store(false, Ordering::SeqCst);
    time.advance(Duration::from_secs(1));
    let again = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("resumed");
    assert_eq!(again.status(), 200);
    assert_eq!(again.text().await.expect("body"), "charged");
    assert_eq!(server.effects(), 1, "exactly one side effect");
    assert_eq!(server.keys(), vec![Some(k.to_string()); 2]);
}

#[tokio::test]
async fn an_operation_of_one_attempt_writes_its_claim_and_its_finish_only() {
    let server = TestServer::start(vec![], Action::ok("done")).await;
    let faulty = Faulty::default();
    let (client, _time) = virtual_ledger_client(faulty.clone(), LedgerOptions::new(), fast());
    let one = key("one-attempt");
    let response = post_keyed(&client, server.url("/x"), &one, "")
        .await
        .expect("200");
    assert_eq!(response.status(), 200);
    let writes = |f: &Faulty| {
        (
            f.claims.load(Ordering::SeqCst),
            f.records.load(Ordering::SeqCst),
            f.finishes.load(Ordering::SeqCst),
        )
    };
    assert_eq!(writes(&faulty), (1, 0, 1), "claim, finish");
    let stored = row(&faulty, &one).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.attempts, 1, "the finish counted the only attempt");
    assert!(stored.last_attempt_at.is_some());

    // An attempt followed by a retry is recorded on its own (its lease must cover the wait).
    let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
    let two = key("two-attempts");
    post_keyed(&client, server.url("/x"), &two, "")
        .await
        .expect("503, then 200");
    assert_eq!(writes(&faulty), (2, 1, 2), "claim, record, finish");
    assert_eq!(row(&faulty, &two).await.attempts, 2);
}

#[tokio::test]
async fn an_outcome_that_cannot_be_recorded_returns_the_answer_and_the_lease_lapses() {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    faulty.fail_finish.store(true, Ordering::SeqCst);
    let options = LedgerOptions::new().lease(Duration::from_secs(10));
    let (client, time) = virtual_ledger_client(faulty.clone(), options, fast());
    let k = key("finish-fails");
    let response = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("the answer in hand is returned");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    let why = report
        .unrecorded()
        .expect("the report says it was not recorded");
    assert!(why.contains("ledger unavailable"), "{why}");
    assert_eq!(report.idempotency_key(), Some(&k));
    assert_eq!(response.text().await.expect("body"), "charged");
    // The row is still in flight: the lease lapses and the next run takes over. The count of
    // the only attempt rode on the finish that failed; the run that takes over counts it.
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::InFlight);
    assert_eq!(stored.attempts, 0);

    faulty.fail_finish.store(false, Ordering::SeqCst);
    time.advance(Duration::from_secs(11));
    let again = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("resumed");
    assert_eq!(again.status(), 200);
    assert_eq!(server.effects(), 1, "exactly one side effect");
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.attempts, 2);
}

/// What an observer saw of one operation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    key: Option<String>,
    attempts: u32,
    status: Option<u16>,
    error: Option<ErrorKind>,
    outcome_unknown: bool,
    verdict: Option<LedgerVerdict>,
}

/// Every `on_operation` event, in order.
#[derive(Debug, Clone, Default)]
struct Operations(Arc<Mutex<Vec<Seen>>>);

impl Operations {
    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }

    fn record(&self, event: &OperationEvent<'_>) {
        self.0.lock().expect("not poisoned").push(Seen {
            key: event.key.map(ToString::to_string),
            attempts: event.attempts,
            status: event.status.map(|s| s.as_u16()),
            error: event.error,
            outcome_unknown: event.outcome_unknown,
            verdict: event.ledger_verdict,
        });
    }
}

/// A client on `time` (shared by every "worker" of a test) whose observer records every
/// operation event.
fn observed_client(
    ledger: impl Ledger,
    worker: &str,
    policy: RetryPolicy,
    time: &VirtualTime,
) -> (Client, Operations) {
    let seen = Operations::default();
    let client = Client::builder()
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger)
        .ledger_options(
            LedgerOptions::new()
                .worker(worker)
                .on_lease_held(LeaseHeldPolicy::Fail),
        )
        .on_operation({
            let seen = seen.clone();
            move |event| seen.record(event)
        })
        .build()
        .expect("valid policy");
    (client, seen)
}

#[tokio::test]
async fn the_observer_sees_replays_and_refusals_settled_by_the_ledger() {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let time = VirtualTime::new();
    let (client, seen) = observed_client(MemoryLedger::new(), "a", fast(), &time);
    let k = key("observed");
    let send = |amount: u32| {
        client
            .post(server.url("/charges"))
            .idempotency_key(k.clone())
            .json(&serde_json::json!({ "amount": amount }))
            .send()
    };

    send(100).await.expect("sent");
    let ran = Seen {
        key: Some(k.to_string()),
        attempts: 1,
        status: Some(200),
        error: None,
        outcome_unknown: false,
        verdict: None,
    };
    assert_eq!(seen.take(), vec![ran], "a run that sends is no verdict");

    let replay = send(100).await.expect("replayed");
    assert!(RetryReport::of(&replay).expect("report").is_replayed());
    let replayed = Seen {
        attempts: 0,
        verdict: Some(LedgerVerdict::Replayed),
        ..seen_for(&k)
    };
    assert_eq!(
        seen.take(),
        vec![Seen {
            status: Some(200),
            ..replayed
        }]
    );

    let err = send(200).await.expect_err("another request under the key");
    assert_eq!(err.kind(), ErrorKind::KeyReuse);
    let refused = Seen {
        error: Some(ErrorKind::KeyReuse),
        verdict: Some(LedgerVerdict::Refused),
        // Nothing sent, but the key's operation ran: never reported as not executed.
        outcome_unknown: true,
        ..seen_for(&k)
    };
    assert_eq!(seen.take(), vec![refused]);
    assert_eq!(server.hits(), 1, "only the first run sent anything");
}

/// An event with the key and every other field empty.
fn seen_for(k: &IdempotencyKey) -> Seen {
    Seen {
        key: Some(k.to_string()),
        attempts: 0,
        status: None,
        error: None,
        outcome_unknown: false,
        verdict: None,
    }
}

#[tokio::test]
async fn the_observer_sees_a_lease_held_refusal_and_a_failed_claim() {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    let time = VirtualTime::new();
    let (holder, _) = observed_client(faulty.clone(), "a", fast(), &time);
    let (client, seen) = observed_client(faulty.clone(), "b", fast(), &time);
    let k = key("observed-in-progress");

    // Worker a sends, then stalls before recording its attempt: it holds a live lease.
    faulty.pause.arm();
    let mut holding = tokio::spawn({
        let (url, k) = (server.url("/x"), k.clone());
        async move { holder.post(url).idempotency_key(k).body("b").send().await }
    });
    faulty.pause.reached(&mut holding).await;
    let err = post_keyed(&client, server.url("/x"), &k, "b")
        .await
        .expect_err("held by worker a");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    let refused = Seen {
        error: Some(ErrorKind::LeaseHeld),
        outcome_unknown: true,
        verdict: Some(LedgerVerdict::Refused),
        ..seen_for(&k)
    };
    assert_eq!(seen.take(), vec![refused]);
    faulty.pause.resume();
    holding.await.expect("task").expect("worker a finishes");

    faulty.fail_claim.store(true, Ordering::SeqCst);
    let other = key("observed-claim-fails");
    let err = post_keyed(&client, server.url("/x"), &other, "")
        .await
        .expect_err("the claim fails");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    let failed = Seen {
        error: Some(ErrorKind::Ledger),
        verdict: Some(LedgerVerdict::Refused),
        ..seen_for(&other)
    };
    assert_eq!(seen.take(), vec![failed]);
    assert_eq!(server.hits(), 1, "only worker a sent anything");
}

#[tokio::test]
async fn a_patient_run_polls_until_its_max_wait_then_is_refused() {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    let time = VirtualTime::new();
    let (holder, _) = observed_client(faulty.clone(), "a", fast(), &time);
    let patient = Client::builder()
        .policy(fast())
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(faulty.clone())
        .ledger_options(
            LedgerOptions::new()
                .worker("b")
                .on_lease_held(LeaseHeldPolicy::Wait {
                    poll: Duration::from_secs(2),
                    max_wait: Duration::from_secs(5),
                }),
        )
        .build()
        .expect("valid policy");
    let k = key("patience-runs-out");

    // Worker a sends, then stalls before recording its attempt: its lease (5 s attempt
    // timeout + 30 s slack) outlasts worker b's patience.
    faulty.pause.arm();
    let mut holding = tokio::spawn({
        let (url, k) = (server.url("/x"), k.clone());
        async move { holder.post(url).idempotency_key(k).body("b").send().await }
    });
    faulty.pause.reached(&mut holding).await;
    let claims_before = faulty.claims.load(Ordering::SeqCst);
    let err = post_keyed(&patient, server.url("/x"), &k, "b")
        .await
        .expect_err("still held when the wait runs out");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert!(err.is_outcome_unknown(), "worker a may be executing it");
    assert!(err.to_string().contains("held by worker a (run "), "{err}");
    // Polled every 2 s, the last step cut to what was left of the 5 s.
    assert_eq!(
        time.slept(),
        vec![
            Duration::from_secs(2),
            Duration::from_secs(2),
            Duration::from_secs(1)
        ]
    );
    assert_eq!(
        faulty.claims.load(Ordering::SeqCst) - claims_before,
        4,
        "a look at 0, 2, 4 and 5 s"
    );
    faulty.pause.resume();
    holding.await.expect("task").expect("worker a finishes");
    assert_eq!(server.hits(), 1, "worker b sent nothing");
}

#[tokio::test]
async fn an_unrecorded_attempt_that_may_have_run_is_reported_as_unknown() {
    let server = TestServer::start(vec![], Action::Reset).await;
    let faulty = Faulty::default();
    faulty.fail_record.store(true, Ordering::SeqCst);
    let client = ledger_client(faulty.clone(), LedgerOptions::new(), fast());
    let k = key("reset-unrecorded");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("a reset, and the attempt could not be recorded");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert_eq!(err.failure(), Some(FailureKind::ConnectionReset));
    assert!(err.is_outcome_unknown(), "the reset request may have run");
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.attempts(), 1);
    assert_eq!(server.hits(), 1, "no retry after an unrecorded attempt");
    assert_eq!(row(&faulty, &k).await.status, OperationStatus::Unknown);
}

/// A ledger that answers every claim with the operation's row held by another run under a
/// lease that lapses at that very instant: what a claim sees when the row changes between
/// its statements. Counts the claims; every claim after the tenth fails, so a claim loop that
/// never ends fails its test instead of hanging it.
fn racing(claims: Arc<AtomicU32>) -> ClaimHook {
    ClaimHook::new(MemoryLedger::new(), move |claim, claimed| {
        if claims.fetch_add(1, Ordering::SeqCst) >= 10 {
            return Err(outage());
        }
        let mut row = match claimed {
            Claimed::New(row) | Claimed::Existing(row) => row,
            other => return Ok(other),
        };
        row.lease_owner = Some("elsewhere".to_owned());
        row.lease_expires_at = Some(claim.now);
        Ok(Claimed::Existing(row))
    })
}

#[tokio::test]
async fn a_claim_that_keeps_finding_the_row_changed_gives_up_after_three_looks() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let claims = Arc::new(AtomicU32::new(0));
    let client = ledger_client(racing(Arc::clone(&claims)), LedgerOptions::new(), fast());
    let k = key("row-keeps-changing");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("never claimed");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert!(err.is_outcome_unknown(), "the row was in flight");
    assert_eq!(err.idempotency_key(), Some(&k));
    assert!(err.to_string().contains("kept changing"), "{err}");
    assert_eq!(claims.load(Ordering::SeqCst), 3, "three looks");
    assert_eq!(server.hits(), 0, "nothing was sent");
}

#[tokio::test]
async fn an_unrecorded_attempt_whose_outcome_cannot_be_written_either_is_reported_once() {
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let url = server.url("/x");
    drop(server);
    let faulty = Faulty::default();
    faulty.fail_record.store(true, Ordering::SeqCst);
    faulty.fail_finish.store(true, Ordering::SeqCst);
    let client = ledger_client(faulty.clone(), LedgerOptions::new(), fast());
    let k = key("record-and-finish-fail");
    let err = post_keyed(&client, &url, &k, "")
        .await
        .expect_err("nobody listens, and the ledger is down");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.attempts(), 1);
    assert_eq!(
        err.failure(),
        Some(FailureKind::Connect),
        "how the attempt failed"
    );
    assert!(
        !err.is_outcome_unknown(),
        "a refused connection ran nothing"
    );
    let text = err.to_string();
    assert_eq!(text.matches("could not be recorded").count(), 1, "{text}");
    assert_eq!(row(&faulty, &k).await.status, OperationStatus::InFlight);
}

#[tokio::test]
async fn a_run_that_loses_its_lease_mid_run_returns_its_answer_and_says_it_was_not_recorded() {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    // Both workers share one timeline; a lease lasts 10 s unless renewed.
    let time = VirtualTime::new();
    let (a, seen_a) = observed_client(faulty.clone(), "a", fast(), &time);
    let (b, _) = observed_client(faulty.clone(), "b", fast(), &time);
    let k = key("lease-lost");
    let send = |client: &Client| {
        client
            .post(server.url("/charges"))
            .idempotency_key(k.clone())
            .body("charge 100")
            .send()
    };

    // Worker a's attempt reaches the server and commits; then a stalls before it can record
    // its answer (a frozen VM, whose renewals do not reach the store either), for longer than
    // its lease.
    faulty.fail_renew.store(true, Ordering::SeqCst);
    faulty.pause.arm();
    let mut a_run = tokio::spawn(send(&a));
    faulty.pause.reached(&mut a_run).await;
    time.advance(Duration::from_secs(11));

    // Worker b finds the lease lapsed, takes the operation over with the same key, and gets
    // the receiver's saved answer.
    let b_response = send(&b).await.expect("worker b takes over");
    assert_eq!(
        b_response
            .headers()
            .get(REPLAYED_HEADER)
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "the receiver recognised the key"
    );
    assert_eq!(b_response.text().await.expect("body"), "charged");
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.lease_owner, None);

    // Worker a wakes up: its finish is refused, but the answer it holds is the operation's
    // (same key, same receiver): it is returned, and the report says it was not recorded.
    faulty.pause.resume();
    let response = a_run
        .await
        .expect("task")
        .expect("worker a returns the answer in hand");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    assert_eq!(report.idempotency_key(), Some(&k));
    assert_eq!(report.attempts(), 1);
    let why = report.unrecorded().expect("not recorded as worker a's");
    assert!(why.contains("lease lost"), "{why}");
    assert_eq!(response.text().await.expect("body"), "charged");
    assert_eq!(
        seen_a.take(),
        vec![Seen {
            attempts: 1,
            status: Some(200),
            ..seen_for(&k)
        }]
    );

    // Worker a's late finish did not overwrite worker b's record.
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(
        stored.attempts, 2,
        "worker a's request (counted by b's take-over) and worker b's"
    );
    assert_eq!(server.keys(), vec![Some(k.to_string()); 2], "one key");
    assert_eq!(server.effects(), 1, "one charge");
}

#[tokio::test]
async fn the_observer_is_told_what_the_caller_gets_after_the_ledger_finish() {
    let server = TestServer::start_idempotent(vec![Action::status(503)], Action::ok("done")).await;
    let faulty = Faulty::default();
    let time = VirtualTime::new();
    let (client, seen) = observed_client(faulty.clone(), "a", fast().with_max_attempts(1), &time);

    // The response arrives, but its outcome cannot be written: the caller gets an error, and
    // so does the observer.
    faulty.fail_finish.store(true, Ordering::SeqCst);
    let k = key("observed-finish-fails");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("503, then the outcome could not be recorded");
    assert_eq!(err.kind(), ErrorKind::Ledger);
    let told = Seen {
        attempts: 1,
        status: Some(503),
        error: Some(ErrorKind::Ledger),
        outcome_unknown: true,
        ..seen_for(&k)
    };
    assert_eq!(seen.take(), vec![told]);
    faulty.fail_finish.store(false, Ordering::SeqCst);

    // A resumed run that cannot connect is unknown because of the earlier run's attempt: the
    // observer hears that too, not the connect failure's "nothing ran".
    let gone = TestServer::start(vec![], Action::status(503)).await;
    let url = gone.url("/x");
    let other = key("observed-prior-unknown");
    let send = || client.post(&url).idempotency_key(other.clone()).send();
    send().await.expect_err("503, one attempt");
    seen.take();
    drop(gone);
    let err = send().await.expect_err("nobody listens any more");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert!(err.is_outcome_unknown());
    let told = Seen {
        attempts: 1,
        error: Some(ErrorKind::AttemptsExhausted),
        outcome_unknown: true,
        ..seen_for(&other)
    };
    assert_eq!(seen.take(), vec![told]);
}

/// A redirect followed inside an attempt: the ledger saves the final hop's answer.
#[tokio::test]
async fn a_followed_redirect_saves_and_replays_the_final_answer() {
    let server = TestServer::start(
        vec![Action::status_with(307, &[("Location", "/v2/charges")])],
        Action::respond(
            201,
            &[("Content-Type", "application/json")],
            r#"{"id":"ch_7"}"#,
        ),
    )
    .await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let k = key("redirect-followed");

    let first = post_keyed(&client, server.url("/v1/charges"), &k, "{}")
        .await
        .expect("the 307 is followed to the 201");
    assert_eq!(first.status(), 201);
    // The response read for the ledger comes back whole: its URL, headers, report and chain.
    assert_eq!(first.url().path(), "/v2/charges");
    assert_eq!(first.headers()["content-type"], "application/json");
    assert_eq!(RetryReport::of(&first).expect("report").attempts(), 1);
    assert_eq!(
        RedirectChain::of(&first).hops().len(),
        1,
        "the 307 followed"
    );
    assert_eq!(server.hits(), 2, "the request and its hop");
    assert_eq!(
        server.keys(),
        vec![Some(k.to_string()), Some(k.to_string())],
        "the same-origin 307 resends the key"
    );
    let saved = row(&ledger, &k).await;
    assert_eq!(saved.status, OperationStatus::Succeeded);
    // The row keeps the request's URL, and the URL that answered beside the answer.
    assert_eq!(
        saved.url.as_deref(),
        Some(server.url("/v1/charges").as_str())
    );
    assert_eq!(
        saved.response.expect("saved").url.as_deref(),
        Some(server.url("/v2/charges").as_str())
    );

    let again = post_keyed(&client, server.url("/v1/charges"), &k, "{}")
        .await
        .expect("replayed");
    assert!(RetryReport::of(&again).expect("report").is_replayed());
    assert_eq!(again.status(), 201);
    assert_eq!(
        again.url().path(),
        "/v2/charges",
        "the replay says where the answer came from"
    );
    assert_eq!(again.text().await.expect("body"), r#"{"id":"ch_7"}"#);
    assert_eq!(server.hits(), 2, "the replay sent nothing");
}

/// An answer from the request's own URL keeps no second URL: the row says nothing it does
/// not need to.
#[tokio::test]
async fn an_answer_from_the_request_url_saves_no_answered_url() {
    let server = TestServer::start(vec![], Action::respond(201, &[], "ok")).await;
    let ledger = MemoryLedger::new();
    let client = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let k = key("answered-here");
    post_keyed(&client, server.url("/v1/charges"), &k, "{}")
        .await
        .expect("201");
    assert_eq!(row(&ledger, &k).await.response.expect("saved").url, None);
    let again = post_keyed(&client, server.url("/v1/charges"), &k, "{}")
        .await
        .expect("replayed");
    assert_eq!(again.url().path(), "/v1/charges");
}

/// A redirect the policy would not follow ran nothing: the ledger must not replay the 3xx
/// forever, so a later run allowed to follow it sends the operation, with the same key.
#[tokio::test]
async fn an_unfollowed_redirect_is_not_saved_as_done() {
    let target = TestServer::start(vec![], Action::respond(201, &[], "charged")).await;
    let origin = TestServer::start(
        vec![],
        Action::status_with(308, &[("Location", &target.url("/v1/charges"))]),
    )
    .await;
    let ledger = MemoryLedger::new();
    let k = key("redirect-refused");

    let strict = ledger_client(ledger.clone(), LedgerOptions::new(), fast());
    let refused = post_keyed(&strict, origin.url("/v1/charges"), &k, "{}")
        .await
        .expect("the 308 is the caller's answer");
    assert_eq!(refused.status(), 308);
    assert_eq!(target.hits(), 0, "the key did not go to the other origin");
    assert_eq!(row(&ledger, &k).await.status, OperationStatus::FailedFinal);

    let allowed_origin = target.url("");
    let trusting = Client::builder()
        .policy(fast())
        .ledger(ledger.clone())
        .redirects(RedirectPolicy::default().allow_key_to(allowed_origin.trim_end_matches('/')))
        .build()
        .expect("valid");
    let done = post_keyed(&trusting, origin.url("/v1/charges"), &k, "{}")
        .await
        .expect("sent again and followed");
    assert!(!RetryReport::of(&done).expect("report").is_replayed());
    assert_eq!(done.status(), 201);
    assert_eq!(origin.hits(), 2, "the second run sent the operation again");
    assert_eq!(
        target.keys(),
        vec![Some(k.to_string())],
        "with the same key"
    );
    assert_eq!(row(&ledger, &k).await.status, OperationStatus::Succeeded);
}

/// Waits (real time, bounded) until `done` holds for the row of `key`.
async fn row_becomes(
    ledger: &dyn Ledger,
    key: &IdempotencyKey,
    what: &str,
    done: impl Fn(&OperationRecord) -> bool,
) -> OperationRecord {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let row = row(ledger, key).await;
            if done(&row) {
                return row;
            }
            tokio::time::sleep(ms(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the row never came to this: {what}"))
}

#[tokio::test]
async fn a_run_stalled_past_its_lease_keeps_its_key_and_returns_its_answer() {
    // The answer is in hand and the finish stalls (a loaded machine, a slow store) far past
    // the lease: the run's keeper goes on renewing, so no other run takes the key, and the
    // answer is returned and recorded.
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    let options = LedgerOptions::new()
        .lease(Duration::from_millis(600))
        .on_lease_held(LeaseHeldPolicy::Fail);
    let (client, time) = virtual_ledger_client(faulty.clone(), options, fast());
    let k = key("stalled-finish");
    faulty.pause.arm();
    let mut run = tokio::spawn({
        let (client, url, k) = (client.clone(), server.url("/x"), k.clone());
        async move { post_keyed(&client, url, &k, "").await }
    });
    faulty.pause.reached(&mut run).await;
    // A minute later on the client's clock: the lease it claimed (600 ms) is long gone.
    time.advance(Duration::from_secs(60));
    let now = time.wall_now();
    row_becomes(
        &faulty,
        &k,
        "the lease renewed past the moved clock",
        |row| row.lease_expires_at.is_some_and(|until| until > now),
    )
    .await;
    assert!(faulty.renewals.load(Ordering::SeqCst) >= 1);
    let other = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the live run holds the key");
    assert_eq!(other.kind(), ErrorKind::LeaseHeld, "{other}");
    faulty.pause.resume();
    let response = run.await.expect("the run").expect("the answer in hand");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    assert_eq!(report.unrecorded(), None);
    assert_eq!(response.text().await.expect("body"), "charged");
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(stored.attempts, 1);
    assert_eq!(server.effects(), 1);
    assert_eq!(server.hits(), 1, "the second run sent nothing");
}

/// A run whose answer arrived and whose finish is stalled, on a store that refused its
/// renewals until its 300 ms lease lapsed (a frozen VM): the lease is free for the taking.
struct Frozen {
    server: TestServer,
    faulty: Faulty,
    client: Client,
    time: VirtualTime,
    key: IdempotencyKey,
    run: tokio::task::JoinHandle<Result<reqwest::Response, idempotent_retry::Error>>,
}

async fn frozen_past_its_lease(name: &str) -> Frozen {
    let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
    let faulty = Faulty::default();
    faulty.fail_renew.store(true, Ordering::SeqCst);
    let options = LedgerOptions::new()
        .lease(Duration::from_millis(300))
        .on_lease_held(LeaseHeldPolicy::Fail);
    let (client, time) = virtual_ledger_client(faulty.clone(), options, fast());
    let key = key(name);
    faulty.pause.arm();
    let mut run = tokio::spawn({
        let (client, url, key) = (client.clone(), server.url("/x"), key.clone());
        async move { post_keyed(&client, url, &key, "").await }
    });
    faulty.pause.reached(&mut run).await;
    time.advance(Duration::from_secs(1));
    faulty.fail_renew.store(false, Ordering::SeqCst);
    Frozen {
        server,
        faulty,
        client,
        time,
        key,
        run,
    }
}

#[tokio::test]
async fn an_answer_in_hand_is_returned_when_another_run_took_the_key() {
    // The store refuses renewals, the run freezes before its finish, and another run takes
    // the lapsed key over and sends it (the receiver replays). The first run's answer is
    // still its caller's: returned, never an error, with the report saying it was not
    // recorded as this run's.
    let Frozen {
        server,
        faulty,
        client,
        key: k,
        run,
        ..
    } = frozen_past_its_lease("taken-while-answered").await;
    let second = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("the lapsed key is taken over");
    assert_eq!(second.status(), 200);
    assert_eq!(second.text().await.expect("body"), "charged");
    faulty.pause.resume();
    let response = run
        .await
        .expect("the run")
        .expect("a 2xx in hand is returned, not an error");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    let why = report
        .unrecorded()
        .expect("the report says it was not recorded");
    assert!(why.contains("lease lost"), "{why}");
    assert_eq!(response.text().await.expect("body"), "charged");
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    assert_eq!(
        stored.attempts, 2,
        "the taken-over run's request and the new run's both counted"
    );
    assert_eq!(server.effects(), 1);
    assert_eq!(server.hits(), 2);
}

#[tokio::test]
async fn an_answer_in_hand_is_recorded_when_the_row_has_no_outcome_yet() {
    // As above, but the run that took the key over gave it up (its caller dropped it after its
    // request left): the row is unknown, so the first run's answer is written as the
    // operation's resolution, and the next run replays it.
    let Frozen {
        server,
        faulty,
        client,
        time,
        key: k,
        run,
    } = frozen_past_its_lease("answered-unknown").await;
    // Another run takes the key over, and is written off as unknown: what a run dropped
    // mid-attempt leaves.
    let owner = "other-worker/run";
    let claim = Claim::builder(
        k.as_str(),
        row(&faulty, &k).await.fingerprint,
        owner,
        time.wall_now(),
        time.wall_now() + Duration::from_secs(60),
    )
    .build()
    .expect("claim");
    assert!(matches!(
        faulty.inner.claim(&claim).await.expect("claim"),
        Claimed::TakenOver { .. }
    ));
    let written_off =
        Finish::new(k.as_str(), owner, OperationStatus::Unknown, None).expect("finish");
    faulty.inner.finish(&written_off).await.expect("finish");
    faulty.pause.resume();
    let response = run.await.expect("the run").expect("the answer in hand");
    assert_eq!(response.status(), 200);
    let why = RetryReport::of(&response)
        .and_then(RetryReport::unrecorded)
        .expect("not recorded as this run's")
        .to_owned();
    assert!(
        why.contains("recorded as the operation's resolution"),
        "{why}"
    );
    let stored = row(&faulty, &k).await;
    assert_eq!(stored.status, OperationStatus::Succeeded);
    let replayed = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect("replayed");
    assert!(RetryReport::of(&replayed).expect("report").is_replayed());
    assert_eq!(replayed.text().await.expect("body"), "charged");
    assert_eq!(server.hits(), 1);
}

#[tokio::test]
async fn a_run_that_cannot_renew_its_lease_sends_nothing_more() {
    // Every renewal fails while the first attempt is held at the server past the lease: the
    // run gives its key up. The attempt's answer (a 503) would be retried; it is not.
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(
            Duration::from_millis(1500),
            Action::status(503),
        )],
        Action::ok("charged"),
    )
    .await;
    let faulty = Faulty::default();
    faulty.fail_renew.store(true, Ordering::SeqCst);
    let options = LedgerOptions::new()
        .lease(Duration::from_millis(300))
        .on_lease_held(LeaseHeldPolicy::Fail);
    let client = ledger_client(faulty.clone(), options, fast());
    let k = key("cannot-renew");
    let err = post_keyed(&client, server.url("/x"), &k, "")
        .await
        .expect_err("the lease was lost");
    assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
    assert!(
        err.is_outcome_unknown(),
        "the 503's request reached the receiver"
    );
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    let text = err.to_string();
    assert!(
        text.contains("the run lost its lease, so attempt 2 was not sent")
            && text.contains("could not renew the lease"),
        "{text}"
    );
    assert_eq!(server.hits(), 1, "no retry once the lease was lost");
}
