//! The operation ledger behind every front end: the `Client`, the tower service over
//! `reqwest::Client`, the tower service over a hyper client (its body boxed, so a replay can
//! rebuild it) and the `reqwest-middleware` middleware. Each case is written once and run on
//! each of them, on real loopback sockets, against the testkit's idempotent receiver counting
//! side effects: replay after a restart on the same SQLite file, racing workers (SQLite and
//! PostgreSQL) with one send, a key reused for another request, and cancellation (a dropped
//! send, mid-attempt, mid-wait and after the response head, then an immediate retry).

use std::sync::Arc;
use std::time::Duration;

use crate::support::front::{Call, Kind};
use crate::support::*;
use idempotent_retry::ledger::{
    LeaseHeldPolicy, Ledger, LedgerOptions, MemoryLedger, OperationRecord, OperationStatus,
    SqliteLedger,
};
use idempotent_retry::observe::{AttemptEvent, LedgerVerdict, OperationEvent};
use idempotent_retry::time::{Sleep, Sleeper};
use idempotent_retry::{
    Client, ClientBuilder, ErrorKind, IdempotencyKey, Observer, RetryBudget, RetryPolicy,
};
use idempotent_retry_testkit::{Fault, Receiver, When};
use tokio::sync::Notify;

/// Millisecond backoff, many attempts: enough to outlast a receiver still running the first
/// delivery (it answers 409 until then).
fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(100)
        .with_base_delay(Duration::from_millis(2))
        .with_max_delay(Duration::from_millis(10))
        .with_attempt_timeout(Duration::from_secs(5))
}

fn settings(ledger: impl Ledger + Clone, options: LedgerOptions) -> ClientBuilder {
    Client::builder()
        .policy(fast())
        .ledger(ledger)
        .ledger_options(options)
}

fn key_for(kind: Kind, what: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.front_end_ledger", &[what, &format!("{kind:?}")])
}

async fn sqlite(path: &std::path::Path) -> SqliteLedger {
    let ledger = SqliteLedger::open(path).await.expect("open the ledger");
    ledger.migrate().await.expect("migrate");
    ledger
}

async fn row(ledger: &dyn Ledger, key: &IdempotencyKey) -> OperationRecord {
    ledger
        .get(key.as_str())
        .await
        .expect("read the row")
        .expect("the operation has a row")
}

/// The row once no run holds it (an abandoned run gives its lease back on a task of its own).
async fn released(ledger: &dyn Ledger, key: &IdempotencyKey) -> OperationRecord {
    for _ in 0..1_000 {
        let record = row(ledger, key).await;
        if record.lease_owner.is_none() {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the lease on {key} was never released");
}

/// Wakes a test when an attempt ends the way `fires` says.
#[derive(Debug)]
struct OnAttempt {
    notify: Arc<Notify>,
    fires: fn(&AttemptEvent<'_>) -> bool,
}

impl Observer for OnAttempt {
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        if (self.fires)(event) {
            self.notify.notify_one();
        }
    }
}

fn retry_decided(event: &AttemptEvent<'_>) -> bool {
    event.delay.is_some()
}

fn final_answer_arrived(event: &AttemptEvent<'_>) -> bool {
    event.delay.is_none() && event.status.is_some()
}

/// A wait that never ends: a caller can only give up during it.
#[derive(Debug)]
struct Forever;

impl Sleeper for Forever {
    fn sleep(&self, _duration: Duration) -> Sleep {
        Box::pin(std::future::pending())
    }
}

#[tokio::test]
async fn a_completed_operation_is_replayed_after_a_restart_with_nothing_sent() {
    for kind in Kind::LEDGERED {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("operations.db");
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "restart");
        receiver.inject(When::key_attempt(&key, 1), Fault::status(503));
        let call = Call::post(receiver.url("/v1/charges"))
            .key(key.clone())
            .json(r#"{"amount": 100, "currency": "eur"}"#);

        let first = kind.build(settings(sqlite(&path).await, LedgerOptions::new()));
        let sent = first.send(call.clone()).await.expect("charged");
        assert_eq!(sent.status, 200, "{kind:?}");
        assert_eq!(sent.report.attempts(), 2, "{kind:?}");
        drop(first);

        // A new process on the same file: the answer comes from the ledger.
        let ledger = sqlite(&path).await;
        let again = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let replayed = again.send(call).await.expect("replayed");
        assert_eq!(replayed.status, 200, "{kind:?}");
        assert_eq!(replayed.body, sent.body, "{kind:?}: the saved body");
        assert!(replayed.report.is_replayed(), "{kind:?}");
        assert_eq!(replayed.report.attempts(), 0, "{kind:?}");
        assert_eq!(
            receiver.arrivals(),
            2,
            "{kind:?}: nothing sent after the restart"
        );
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}");
        let stored = row(&ledger, &key).await;
        assert_eq!(stored.status, OperationStatus::Succeeded, "{kind:?}");
        assert_eq!(stored.attempts, 2, "{kind:?}");
        assert_eq!(stored.scope, "127.0.0.1", "{kind:?}: the host by default");
    }
}

#[tokio::test]
async fn every_front_end_recognises_an_operation_another_one_recorded() {
    let receiver = Receiver::start().await.expect("receiver");
    let ledger = MemoryLedger::new();
    let key = key_for(Kind::Client, "shared");
    // Two spellings of one JSON body: the fingerprint is of the canonical form.
    let call = |body: &str| {
        Call::post(receiver.url("/v1/emails"))
            .key(key.clone())
            .json(body)
    };
    let client = Kind::Client.build(settings(ledger.clone(), LedgerOptions::new()));
    client
        .send(call(r#"{"to": "a@example.com", "n": 1}"#))
        .await
        .expect("sent");
    for kind in Kind::LEDGERED {
        let front = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let reply = front
            .send(call(r#"{"n":1.0,"to":"a@example.com"}"#))
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert!(reply.report.is_replayed(), "{kind:?}");
        assert_eq!(receiver.arrivals(), 1, "{kind:?}: nothing sent");
    }
}

/// Two workers sharing one ledger send the same key at once: one sends, the other waits for
/// its answer and replays it.
async fn racing_workers_send_once(kind: Kind, one: impl Ledger + Clone, two: impl Ledger + Clone) {
    let receiver = Receiver::start().await.expect("receiver");
    let key = key_for(kind, &format!("race-{}", IdempotencyKey::random()));
    receiver.inject(
        When::key_attempt(&key, 1),
        Fault::SlowHandler(Duration::from_millis(200)),
    );
    let patient = |name: &str| {
        LedgerOptions::new()
            .worker(name)
            .on_lease_held(LeaseHeldPolicy::Wait {
                poll: Duration::from_millis(10),
                max_wait: Duration::from_secs(20),
            })
    };
    let a = kind.build(settings(one, patient("a")));
    let b = kind.build(settings(two, patient("b")));
    let call = Call::post(receiver.url("/v1/tickets"))
        .key(key.clone())
        .body("open");
    let (ra, rb) = tokio::join!(a.send(call.clone()), b.send(call));
    let (ra, rb) = (ra.expect("worker a"), rb.expect("worker b"));
    assert_eq!((ra.status, rb.status), (200, 200), "{kind:?}");
    assert_eq!(ra.body, rb.body, "{kind:?}: one answer");
    assert_eq!(
        u8::from(ra.report.is_replayed()) + u8::from(rb.report.is_replayed()),
        1,
        "{kind:?}: one worker sent, the other replayed"
    );
    assert_eq!(receiver.arrivals(), 1, "{kind:?}: one send in all");
    assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}");
}

#[tokio::test]
async fn racing_workers_on_one_sqlite_file_send_a_key_once() {
    for kind in Kind::LEDGERED {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("operations.db");
        // Two connections to one file, as two processes on one machine have.
        racing_workers_send_once(kind, sqlite(&path).await, sqlite(&path).await).await;
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test]
async fn racing_workers_on_one_postgres_table_send_a_key_once() {
    for kind in Kind::LEDGERED {
        let Some(url) = fresh_postgres_database().await else {
            return;
        };
        let connect = || async {
            let ledger = idempotent_retry::ledger::PostgresLedger::connect(&url)
                .await
                .expect("connect");
            ledger.migrate().await.expect("migrate");
            ledger
        };
        racing_workers_send_once(kind, connect().await, connect().await).await;
    }
}

#[tokio::test]
async fn a_key_reused_for_another_request_is_refused_with_nothing_sent() {
    for kind in Kind::LEDGERED {
        let receiver = Receiver::start().await.expect("receiver");
        let verdicts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&verdicts);
        let front = kind.build(
            settings(MemoryLedger::new(), LedgerOptions::new()).on_operation(
                move |event: &OperationEvent<'_>| {
                    seen.lock().unwrap().push(event.ledger_verdict);
                },
            ),
        );
        let key = key_for(kind, "reuse");
        let call = Call::post(receiver.url("/v1/charges")).key(key.clone());
        front
            .send(call.clone().json(r#"{"amount": 100}"#))
            .await
            .expect("charged");
        let err = front
            .send(call.json(r#"{"amount": 200}"#))
            .await
            .expect_err("another request under the same key");
        assert_eq!(err.kind(), ErrorKind::KeyReuse, "{kind:?}");
        // Nothing was sent, and the key's operation is done: never "not done".
        assert!(err.is_outcome_unknown(), "{kind:?}");
        assert_eq!(
            err.outcome(),
            idempotent_retry::Outcome::Done {
                key: Some(key.clone()),
                status: http::StatusCode::OK
            },
            "{kind:?}"
        );
        let held = err.held_operation().expect("the ledger's record");
        assert_eq!(held.status, OperationStatus::Succeeded, "{kind:?}");
        assert_eq!(
            held.differs,
            Some(idempotent_retry::RequestPart::Body),
            "{kind:?}"
        );
        assert_eq!(err.idempotency_key(), Some(&key), "{kind:?}");
        assert_eq!(receiver.arrivals(), 1, "{kind:?}: nothing sent");
        assert_eq!(
            *verdicts.lock().unwrap(),
            vec![None, Some(LedgerVerdict::Refused)],
            "{kind:?}"
        );
    }
}

#[tokio::test]
async fn a_send_dropped_by_its_callers_timeout_is_retried_at_once_with_one_effect() {
    for kind in Kind::LEDGERED {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = sqlite(&dir.path().join("operations.db")).await;
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "agent-timeout");
        // The tool call is slow: the runtime's own timeout fires first.
        receiver.inject(
            When::key_attempt(&key, 1),
            Fault::SlowHandler(Duration::from_millis(300)),
        );
        // Default options: a run that finds the key held fails at once with `LeaseHeld`.
        let front = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let call = Call::post(receiver.url("/v1/emails"))
            .key(key.clone())
            .json(r#"{"to": "a@example.com"}"#);
        let timed_out =
            tokio::time::timeout(Duration::from_millis(50), front.send(call.clone())).await;
        assert!(timed_out.is_err(), "{kind:?}: the caller's timeout fired");

        // The same call again, straight away: it goes ahead with the same key and meets the
        // first delivery's result (409 while it runs, then its saved answer).
        let reply = front
            .send(call)
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(reply.status, 200, "{kind:?}");
        assert!(!reply.report.is_replayed(), "{kind:?}: sent, not replayed");
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}: one email");
        assert!(
            receiver
                .keys()
                .iter()
                .all(|k| k.as_deref() == Some(key.as_str())),
            "{kind:?}: one key on every attempt"
        );
        let stored = row(&ledger, &key).await;
        assert_eq!(stored.status, OperationStatus::Succeeded, "{kind:?}");
        assert!(stored.lease_owner.is_none(), "{kind:?}");
    }
}

#[tokio::test]
async fn a_send_dropped_while_its_claim_is_in_flight_leaves_the_key_free_for_the_next() {
    for kind in Kind::LEDGERED {
        let memory = MemoryLedger::new();
        // A store slow to answer claims and slower to write finishes.
        let slow = ClaimHook::new(memory.clone(), |_, claimed| Ok(claimed))
            .claim_delay(Duration::from_millis(100))
            .finish_delay(Duration::from_millis(200));
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "mid-claim");
        let call = Call::post(receiver.url("/v1/charges")).key(key.clone());
        let first = kind.build(settings(slow, LedgerOptions::new()));
        // The caller gives up while the claim is still on its way to the store.
        drop_when(
            first.send(call.clone()),
            tokio::time::sleep(Duration::from_millis(20)),
        )
        .await;
        // The claim lands for nobody: the row is held until it is given back.
        tokio::time::timeout(Duration::from_secs(10), async {
            while memory.get(key.as_str()).await.expect("read").is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{kind:?}: the dropped send's claim never reached the store"));
        // Another front end (a client of its own, as another process would be) sends the key
        // now: it finds the lease held until the claim is given back, waits for that, then
        // goes ahead. (Releases are the abandoning client's own business: a client never waits
        // on another client's registry.)
        let patient = LedgerOptions::new().on_lease_held(LeaseHeldPolicy::Wait {
            poll: Duration::from_millis(10),
            max_wait: Duration::from_secs(10),
        });
        let next = kind.build(settings(memory.clone(), patient));
        let reply = next
            .send(call)
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(reply.status, 200, "{kind:?}");
        assert_eq!(
            receiver.arrivals(),
            1,
            "{kind:?}: the dropped send sent nothing"
        );
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}");
        let stored = row(&memory, &key).await;
        assert_eq!(stored.status, OperationStatus::Succeeded, "{kind:?}");
        assert_eq!(stored.attempts, 1, "{kind:?}");
    }
}

#[tokio::test]
async fn a_send_dropped_mid_attempt_releases_its_lease_as_outcome_unknown() {
    for kind in Kind::LEDGERED {
        let ledger = MemoryLedger::new();
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "mid-attempt");
        // The effect commits, then the answer is held back.
        receiver.inject(
            When::key_attempt(&key, 1),
            Fault::StallAfterCommit(Duration::from_secs(10)),
        );
        let front = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let call = Call::post(receiver.url("/v1/charges")).key(key.clone());
        drop_when(
            front.send(call.clone()),
            receiver.wait_for_arrivals(1, Duration::from_secs(5)),
        )
        .await;
        let stored = released(&ledger, &key).await;
        assert_eq!(stored.status, OperationStatus::Unknown, "{kind:?}");
        let first_attempt_at = stored.first_attempt_at;

        let reply = front
            .send(call)
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(reply.status, 200, "{kind:?}");
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}");
        let stored = row(&ledger, &key).await;
        assert_eq!(stored.status, OperationStatus::Succeeded, "{kind:?}");
        assert_eq!(
            stored.first_attempt_at, first_attempt_at,
            "{kind:?}: the window counts from the first run"
        );
    }
}

#[tokio::test]
async fn a_send_dropped_mid_wait_releases_its_lease_and_its_budget() {
    for kind in Kind::LEDGERED {
        let ledger = MemoryLedger::new();
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "mid-wait");
        // Throttled: nothing ran, and the retry waits.
        receiver.inject(When::key_attempt(&key, 1), Fault::retry_after_secs(429, 30));
        let decided = Arc::new(Notify::new());
        let budget = RetryBudget::new();
        let front = kind.build(
            settings(ledger.clone(), LedgerOptions::new())
                .policy(fast().with_max_retry_after(Duration::from_secs(60)))
                .retry_budget(budget.clone())
                .observer(OnAttempt {
                    notify: Arc::clone(&decided),
                    fires: retry_decided,
                }),
        );
        let call = Call::post(receiver.url("/v1/charges")).key(key.clone());
        drop_when(front.send(call.clone()), decided.notified()).await;
        let stored = released(&ledger, &key).await;
        assert_eq!(
            stored.status,
            OperationStatus::FailedFinal,
            "{kind:?}: a 429 ran nothing"
        );
        assert_eq!(
            budget.available(),
            500,
            "{kind:?}: the retry's tokens came back"
        );

        let reply = front.send(call).await.expect("sent again at once");
        assert_eq!(reply.status, 200, "{kind:?}");
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{kind:?}");
        assert_eq!(receiver.arrivals(), 2, "{kind:?}");
    }
}

#[tokio::test]
async fn a_send_dropped_after_the_response_head_is_recorded_as_outcome_unknown() {
    for kind in Kind::LEDGERED {
        let ledger = MemoryLedger::new();
        // The head of a 200 arrives; its body trickles, and the ledger reads it to save it.
        let server = RawServer::start(Reply::trickle(200, 1_000, Duration::from_secs(10))).await;
        let key = key_for(kind, "after-head");
        let answered = Arc::new(Notify::new());
        // An answer the client streams (it reads none inside the attempt), so the drop lands
        // while the ledger reads it.
        let front = kind.build(
            settings(ledger.clone(), LedgerOptions::new())
                .answer_read_limit(0)
                .observer(OnAttempt {
                    notify: Arc::clone(&answered),
                    fires: final_answer_arrived,
                }),
        );
        let call = Call::post(server.url("/v1/charges")).key(key.clone());
        drop_when(front.send(call.clone()), answered.notified()).await;
        let stored = released(&ledger, &key).await;
        assert_eq!(
            stored.status,
            OperationStatus::Unknown,
            "{kind:?}: the receiver answered, the answer was never saved"
        );
        // The next run goes ahead at once with the same key.
        drop_when(front.send(call), async {
            while server.hits() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert_eq!(
            server.keys(),
            vec![Some(key.to_string()); 2],
            "{kind:?}: the same key"
        );
    }
}

#[tokio::test]
async fn the_budget_is_whole_after_300_cancelled_waits() {
    for kind in Kind::LEDGERED {
        let server = TestServer::start(vec![], Action::status(503)).await;
        let budget = RetryBudget::new();
        let decided = Arc::new(Notify::new());
        let front = kind.build(
            Client::builder()
                .policy(fast())
                .sleeper(Forever)
                .retry_budget(budget.clone())
                .observer(OnAttempt {
                    notify: Arc::clone(&decided),
                    fires: retry_decided,
                }),
        );
        for _ in 0..300 {
            drop_when(
                front.send(Call::post(server.url("/v1/charges"))),
                decided.notified(),
            )
            .await;
        }
        assert_eq!(server.hits(), 300, "{kind:?}: each run's first attempt");
        assert_eq!(
            budget.available(),
            500,
            "{kind:?}: every withdrawal came back"
        );
    }
}

/// A ledger over `inner` whose claims take `lag` of the client's (virtual) time, as a slow
/// store's would.
fn slow_claims(inner: &MemoryLedger, time: &VirtualTime, lag: Duration) -> ClaimHook {
    let time = time.clone();
    ClaimHook::new(inner.clone(), move |_, claimed| {
        time.advance(lag);
        Ok(claimed)
    })
}

#[tokio::test]
async fn a_take_over_at_the_end_of_the_window_ends_with_reconcile_window() {
    for kind in Kind::LEDGERED {
        let time = VirtualTime::new();
        let ledger = MemoryLedger::new();
        let window = Duration::from_secs(3_600);
        let policy = fast().with_max_attempts(1).with_reconcile_window(window);
        let build = |ledger: ClaimHook| {
            kind.build(
                settings(ledger, LedgerOptions::new())
                    .policy(policy)
                    .clock(time.clone())
                    .sleeper(time.clone()),
            )
        };
        let receiver = Receiver::start().await.expect("receiver");
        let key = key_for(kind, "window-end");
        receiver.inject(When::key_attempt(&key, 1), Fault::status(503));
        let call = Call::post(receiver.url("/v1/charges")).key(key.clone());
        let err = build(slow_claims(&ledger, &time, Duration::ZERO))
            .send(call.clone())
            .await
            .expect_err("one attempt, a 503");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{kind:?}");

        // The row is taken over a millisecond before the window ends, and the claim itself
        // takes longer than that.
        time.advance(window - Duration::from_millis(1));
        let err = build(slow_claims(&ledger, &time, Duration::from_millis(5)))
            .send(call)
            .await
            .expect_err("no window left");
        assert_eq!(err.kind(), ErrorKind::ReconcileWindow, "{kind:?}: {err}");
        assert!(err.is_outcome_unknown(), "{kind:?}: the 503 may have run");
        assert_eq!(err.attempts(), 0, "{kind:?}");
        assert_eq!(receiver.arrivals(), 1, "{kind:?}: nothing more sent");
        let stored = row(&ledger, &key).await;
        assert_eq!(stored.status, OperationStatus::Unknown, "{kind:?}");
        assert!(
            stored.lease_owner.is_none(),
            "{kind:?}: the take-over let go"
        );
    }
}

#[tokio::test]
async fn a_body_or_response_the_ledger_cannot_keep_is_refused_before_anything_is_claimed() {
    let receiver = Receiver::start().await.expect("receiver");
    // hyper's `Incoming` cannot be rebuilt from saved bytes.
    let ledger = MemoryLedger::new();
    let front = Kind::TowerHyper.build(settings(ledger.clone(), LedgerOptions::new()));
    let key = key_for(Kind::TowerHyper, "incoming");
    let err = front
        .send(Call::post(receiver.url("/v1/charges")).key(key))
        .await
        .expect_err("cannot replay this response type");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert!(err.to_string().contains("response body type"), "{err}");
    // A streamed request body cannot be fingerprinted.
    for kind in [Kind::Client, Kind::TowerReqwest, Kind::Middleware] {
        let front = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let err = front
            .send(
                Call::post(receiver.url("/v1/charges"))
                    .key(key_for(kind, "stream"))
                    .body("streamed body")
                    .streamed(),
            )
            .await
            .expect_err("cannot fingerprint a stream");
        assert_eq!(err.kind(), ErrorKind::Builder, "{kind:?}");
        assert!(err.to_string().contains("buffered body"), "{kind:?}: {err}");
    }
    assert_eq!(receiver.arrivals(), 0, "nothing sent");
    assert!(ledger.is_empty(), "nothing claimed");
}

#[tokio::test]
async fn a_scope_given_per_request_names_the_row() {
    for kind in [Kind::Client, Kind::TowerHyperBoxed, Kind::Middleware] {
        let receiver = Receiver::start().await.expect("receiver");
        let ledger = MemoryLedger::new();
        let front = kind.build(settings(ledger.clone(), LedgerOptions::new()));
        let key = key_for(kind, "scope");
        front
            .send(
                Call::post(receiver.url("/v1/charges"))
                    .key(key.clone())
                    .scope("stripe.charge"),
            )
            .await
            .expect("sent");
        assert_eq!(row(&ledger, &key).await.scope, "stripe.charge", "{kind:?}");
    }
}

#[tokio::test]
async fn an_answer_in_hand_is_returned_by_every_front_end_when_another_run_took_the_key() {
    for kind in Kind::LEDGERED {
        let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
        // A run frozen with its answer in hand, past a lease nobody renews.
        let gate = Arc::new(Gate::default());
        let ledger = ClaimHook::new(MemoryLedger::new(), |_, claimed| Ok(claimed))
            .renewals_fail()
            .finish_gate(Arc::clone(&gate));
        let key = key_for(kind, "answer-in-hand");
        let front = kind.build(settings(
            ledger.clone(),
            LedgerOptions::new().lease(Duration::from_millis(200)),
        ));
        let call = Call::post(server.url("/v1/charges")).key(key.clone());
        // The first run gets its answer, then freezes before its finish.
        let mut frozen = front.send(call.clone());
        tokio::select! {
            () = gate.reached.notified() => {}
            done = &mut frozen => panic!("{kind:?}: finished before its finish froze: {:?}", done.map(|r| r.status)),
        }
        // Another worker waits out the lapsed lease (nobody renews it), takes the key over and
        // gets the receiver's stored answer.
        let other = settings(ledger.inner.clone(), LedgerOptions::new())
            .build()
            .expect("client");
        let taken = other
            .post(server.url("/v1/charges"))
            .idempotency_key(key.clone())
            .send()
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: the other worker takes over: {err}"));
        assert_eq!(taken.status(), 200, "{kind:?}");
        // The frozen run wakes: its answer is its caller's, not an error.
        gate.open();
        let reply = frozen
            .await
            .unwrap_or_else(|err| panic!("{kind:?}: the answer in hand is returned: {err}"));
        assert_eq!(reply.status, 200, "{kind:?}");
        assert_eq!(reply.body, "charged", "{kind:?}");
        let why = reply
            .report
            .unrecorded()
            .unwrap_or_else(|| panic!("{kind:?}: the report says it was not recorded"));
        assert!(why.contains("lease lost"), "{kind:?}: {why}");
        assert_eq!(server.effects(), 1, "{kind:?}: one charge");
        let row = ledger
            .inner
            .get(key.as_str())
            .await
            .expect("read")
            .expect("row");
        assert_eq!(row.status, OperationStatus::Succeeded, "{kind:?}");
    }
}
