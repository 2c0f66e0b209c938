//! Unknown outcomes resolved after the reconcile window, against the testkit's idempotent
//! receiver and each ledger (memory, an SQLite file, a PostgreSQL database when
//! `IDEMPOTENT_RETRY_PG_URL` is set): a run killed after the charge committed is resolved
//! `Done` by an HTTP probe once the window has passed, and the next run replays with no
//! second charge; a probe that finds nothing lets the next run send once; a probe that fails
//! leaves the row unknown and sends nothing; two sweepers racing probe each key once.
//!
//! The retry loop runs on a virtual clock (the window passes in a call); the sockets are real.
//! With `IDEMPOTENT_RETRY_KEEP_LEDGER` set to a path, the crash case on SQLite copies its file
//! there as the killed run left it, for inspection (`idempotent-retry-ledger --sqlite PATH
//! list`).
#![cfg(feature = "sqlite")]

use idempotent_retry_sqlite::rusqlite;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support::*;
use bytes::Bytes;
use idempotent_retry::ledger::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerFuture, LedgerOptions, ListFilter,
    OperationRecord, OperationStatus, ReconcileClaim, Renew, ResolutionKind, Resolve,
    SavedResponse, SqliteLedger,
};
use idempotent_retry::reconcile::{HttpProbe, Reconciled, Resolution};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, Reply, When};

/// The window every case runs with: an hour, passed in one step of the virtual clock.
const WINDOW: Duration = Duration::from_secs(3600);

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5))
        .with_attempt_timeout(Duration::from_secs(5))
        .with_max_attempts(2)
        .with_reconcile_window(WINDOW)
}

/// A ledger shared behind one type, whatever its storage.
#[derive(Debug, Clone)]
struct Shared(Arc<dyn Ledger>);

impl Ledger for Shared {
    fn clock(&self) -> LedgerFuture<'_, idempotent_retry::ledger::LedgerClock> {
        self.0.clock()
    }
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
        self.0.claim(claim)
    }
    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
        self.0.record_attempt(update)
    }
    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
        self.0.renew(renew)
    }
    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
        self.0.finish(finish)
    }
    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
        self.0.get(key)
    }
    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        self.0.purge_batch(now, limit)
    }
    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>> {
        self.0.claim_unresolved(claim)
    }
    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()> {
        self.0.resolve(resolve)
    }
    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>> {
        self.0.list(filter)
    }
}

/// Where the operations are kept; each "process" opens its own handle on it.
enum Store {
    Memory(idempotent_retry::ledger::MemoryLedger),
    Sqlite(tempfile::TempDir),
    Postgres(String),
}

impl Store {
    /// Every store this machine has: memory, SQLite, and PostgreSQL when configured.
    async fn all() -> Vec<Store> {
        let mut stores = vec![
            Store::Memory(idempotent_retry::ledger::MemoryLedger::new()),
            Store::Sqlite(tempfile::tempdir().expect("temp dir")),
        ];
        if let Some(url) = postgres::fresh().await {
            stores.push(Store::Postgres(url));
        }
        stores
    }

    fn name(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    fn sqlite_path(&self) -> Option<PathBuf> {
        match self {
            Store::Sqlite(dir) => Some(dir.path().join("operations.db")),
            _ => None,
        }
    }

    async fn open(&self) -> Shared {
        Shared(match self {
            Store::Memory(ledger) => Arc::new(ledger.clone()),
            Store::Sqlite(_) => {
                let path = self.sqlite_path().expect("an SQLite store has a path");
                Arc::new(SqliteLedger::open(path).await.expect("open the file"))
            }
            Store::Postgres(url) => postgres::open(url).await,
        })
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::Arc;

    use idempotent_retry::ledger::{Ledger, PostgresLedger};

    /// A new database on the test server, or `None` without one.
    pub(super) async fn fresh() -> Option<String> {
        crate::support::fresh_postgres_database().await
    }

    /// On the caller's clock: the cases run on a virtual timeline that the database does not
    /// see (`fleet_clock.rs` runs PostgreSQL on its own clock).
    pub(super) async fn open(url: &str) -> Arc<dyn Ledger> {
        let ledger = PostgresLedger::connect(url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        Arc::new(ledger.on_caller_clock())
    }
}

#[cfg(not(feature = "postgres"))]
mod postgres {
    use std::sync::Arc;

    use idempotent_retry::ledger::Ledger;

    pub(super) async fn fresh() -> Option<String> {
        None
    }

    pub(super) async fn open(_url: &str) -> Arc<dyn Ledger> {
        unreachable!("no PostgreSQL store is made without the postgres feature")
    }
}

/// A receiver that charges on `POST /charges` and answers lookups on
/// `GET /lookup?key=KEY`: 200 with the charge's answer when it ran, 404 when it did not.
/// Counts lookups per key.
struct Provider {
    receiver: Receiver,
    lookups: Arc<Mutex<HashMap<String, u32>>>,
}

impl Provider {
    async fn start(lookup_delay: Duration) -> Provider {
        let charges: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let lookups: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
        let (charged, looked_up) = (Arc::clone(&charges), Arc::clone(&lookups));
        let receiver = Receiver::builder()
            .scope("shop.charge")
            .handler(move |delivery| {
                let (charges, lookups) = (Arc::clone(&charged), Arc::clone(&looked_up));
                async move {
                    if let Some(key) = delivery.path().strip_prefix("/lookup?key=") {
                        let key = key.to_owned();
                        *lookups.lock().unwrap().entry(key.clone()).or_default() += 1;
                        tokio::time::sleep(lookup_delay).await;
                        return match charges.lock().unwrap().get(&key) {
                            Some(body) => Reply::json(200, &serde_json::from_str(body).unwrap()),
                            None => Reply::status(404),
                        };
                    }
                    let n = delivery.record_effect();
                    let body = format!(r#"{{"id":"ch_{n}"}}"#);
                    let key = delivery.key().expect("charges carry a key").to_owned();
                    charges.lock().unwrap().insert(key, body.clone());
                    Reply::json(200, &serde_json::from_str(&body).unwrap())
                }
            })
            .start()
            .await
            .expect("receiver");
        Provider { receiver, lookups }
    }

    fn lookups(&self, key: &str) -> u32 {
        self.lookups.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Arrivals that were charges (not lookups).
    fn charge_arrivals(&self) -> usize {
        self.receiver
            .log()
            .iter()
            .filter(|arrival| arrival.path == "/charges")
            .count()
    }

    /// The probe: a lookup by key; found is done (its answer replayed), 404 is not done.
    fn probe(&self) -> HttpProbe {
        let base = self.receiver.url("/lookup");
        HttpProbe::new(
            testkit::loopback_http().expect("a loopback client"),
            move |operation| format!("{base}?key={}", operation.key),
            |_operation, answer: http::Response<Bytes>| match answer.status().as_u16() {
                200 => Resolution::Done(SavedResponse::new(
                    200,
                    vec![("content-type".into(), "application/json".into())],
                    Some(answer.body().to_vec()),
                )),
                404 => Resolution::NotDone,
                _ => Resolution::Unknown,
            },
        )
    }
}

/// A "process": a client on the shared virtual timeline with its own handle on the store.
fn client(ledger: Shared, time: &VirtualTime, worker: &str, probe: Option<HttpProbe>) -> Client {
    let builder = Client::builder()
        .http(testkit::loopback_http().expect("a loopback client"))
        .policy(policy())
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger)
        .ledger_options(
            LedgerOptions::new()
                .worker(worker)
                .lease(Duration::from_secs(10)),
        );
    match probe {
        Some(probe) => builder.reconciler_for_scope("shop.charge", probe),
        None => builder,
    }
    .build()
    .expect("valid settings")
}

async fn charge(
    client: &Client,
    provider: &Provider,
    key: &IdempotencyKey,
) -> Result<reqwest::Response, idempotent_retry::Error> {
    client
        .post(provider.receiver.url("/charges"))
        .idempotency_key(key.clone())
        .ledger_scope("shop.charge")
        .json(&serde_json::json!({"amount": 1200, "currency": "eur"}))
        .send()
        .await
}

async fn row(ledger: &Shared, key: &IdempotencyKey) -> OperationRecord {
    ledger
        .get(key.as_str())
        .await
        .expect("read")
        .expect("the operation has a row")
}

/// The run is killed after the charge committed (its answer held back): no finish, the row
/// left in flight. The window passes. The next run finds the row past its window, asks the
/// probe, which finds the charge: the run replays the probe's answer, with nothing charged
/// again and nothing sent but the lookup.
#[tokio::test]
async fn a_run_killed_after_the_charge_is_resolved_done_by_the_probe_and_replayed() {
    for store in Store::all().await {
        let name = store.name();
        let provider = Provider::start(Duration::ZERO).await;
        let time = VirtualTime::new();
        let key = IdempotencyKey::derive("tests.reconcile", &[name, "killed"]);
        provider.receiver.inject(
            When::key_attempt(&key, 1),
            Fault::StallAfterCommit(Duration::from_secs(30)),
        );
        let first = client(store.open().await, &time, "doomed", None);
        let receiver = &provider.receiver;
        die_when(charge(&first, &provider, &key), async {
            while receiver.effects_for(key.as_str()) == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        let ledger = store.open().await;
        let left = row(&ledger, &key).await;
        assert_eq!(
            left.status,
            OperationStatus::InFlight,
            "{name}: nothing released it"
        );
        assert_eq!(left.method.as_deref(), Some("POST"), "{name}");
        assert_eq!(
            left.attempts, 0,
            "{name}: a run counts its first attempt when it finishes"
        );
        assert_eq!(
            left.url.as_deref(),
            Some(receiver.url("/charges").as_str()),
            "{name}"
        );

        if let (Some(path), Some(keep)) = (
            store.sqlite_path(),
            std::env::var("IDEMPOTENT_RETRY_KEEP_LEDGER").ok(),
        ) {
            // The file as the killed run left it (WAL included), for the operators' command.
            rusqlite::Connection::open(path)
                .and_then(|conn| conn.execute("VACUUM INTO ?1", [keep]))
                .expect("copy the ledger file");
        }

        time.advance(WINDOW + Duration::from_secs(1));
        // Without a reconciler, the run past its window is refused, outcome unknown.
        let plain = client(store.open().await, &time, "plain", None);
        let err = charge(&plain, &provider, &key)
            .await
            .expect_err("past the window");
        assert_eq!(err.kind(), ErrorKind::ReconcileWindow, "{name}: {err}");
        assert!(err.is_outcome_unknown(), "{name}");

        let next = client(store.open().await, &time, "next", Some(provider.probe()));
        let response = charge(&next, &provider, &key).await.expect("replayed");
        assert_eq!(response.status(), 200, "{name}");
        assert!(
            RetryReport::of(&response).is_some_and(RetryReport::is_replayed),
            "{name}"
        );
        assert_eq!(
            response.text().await.expect("body"),
            r#"{"id":"ch_1"}"#,
            "{name}"
        );
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{name}: one charge");
        assert_eq!(
            provider.charge_arrivals(),
            1,
            "{name}: no charge sent again"
        );
        assert_eq!(provider.lookups(key.as_str()), 1, "{name}: one lookup");
        let resolved = row(&ledger, &key).await;
        assert_eq!(resolved.status, OperationStatus::Succeeded, "{name}");
        assert_eq!(
            resolved.attempts, 1,
            "{name}: the hold counted the dead run's request"
        );
        let note = resolved.resolution.expect("the resolution is recorded");
        assert_eq!(note.kind, ResolutionKind::Done, "{name}");
        assert_eq!(note.by, "http-probe (worker next)", "{name}");
        assert_eq!(millis(note.at), millis(time.wall_now()), "{name}");
        assert_eq!(
            resolved.first_attempt_at, left.first_attempt_at,
            "{name}: the window kept"
        );

        // A redelivery replays from the ledger with no lookup.
        charge(&next, &provider, &key)
            .await
            .expect("replayed again");
        assert_eq!(provider.lookups(key.as_str()), 1, "{name}");
    }
}

/// Every attempt of the first run is reset before the receiver runs it: outcome unknown,
/// nothing charged. Past the window, the probe finds no charge: the next run sends it once,
/// in a new window, with the same key.
#[tokio::test]
async fn a_probe_that_finds_nothing_lets_the_next_run_send_once() {
    for store in Store::all().await {
        let name = store.name();
        let provider = Provider::start(Duration::ZERO).await;
        let time = VirtualTime::new();
        let key = IdempotencyKey::derive("tests.reconcile", &[name, "not-done"]);
        for attempt in 1..=2 {
            provider
                .receiver
                .inject(When::key_attempt(&key, attempt), Fault::ResetBeforeHandler);
        }
        let ledger = store.open().await;
        let first = client(ledger.clone(), &time, "first", None);
        let err = charge(&first, &provider, &key)
            .await
            .expect_err("every attempt reset");
        assert!(err.is_outcome_unknown(), "{name}: {err}");
        assert_eq!(
            row(&ledger, &key).await.status,
            OperationStatus::Unknown,
            "{name}"
        );

        time.advance(WINDOW + Duration::from_secs(1));
        let resolved_at = time.wall_now();
        let next = client(store.open().await, &time, "next", Some(provider.probe()));
        let response = charge(&next, &provider, &key).await.expect("sent anew");
        assert_eq!(response.status(), 200, "{name}");
        assert!(
            !RetryReport::of(&response).is_some_and(RetryReport::is_replayed),
            "{name}"
        );
        assert_eq!(
            provider.receiver.effects_for(key.as_str()),
            1,
            "{name}: charged once"
        );
        assert_eq!(
            provider.charge_arrivals(),
            3,
            "{name}: two resets, then one send"
        );
        assert_eq!(provider.lookups(key.as_str()), 1, "{name}");
        assert_eq!(
            provider
                .receiver
                .keys()
                .into_iter()
                .flatten()
                .filter(|k| k == key.as_str())
                .count(),
            3,
            "{name}: the same key on every charge"
        );
        let settled = row(&ledger, &key).await;
        assert_eq!(settled.status, OperationStatus::Succeeded, "{name}");
        assert_eq!(
            millis(settled.first_attempt_at),
            millis(resolved_at),
            "{name}: a new window"
        );
        let note = settled.resolution.expect("recorded");
        assert_eq!(note.kind, ResolutionKind::NotDone, "{name}");
    }
}

/// The probe cannot reach the provider: the row stays unknown, the run is refused with the
/// reason, and nothing is sent.
#[tokio::test]
async fn a_failing_probe_leaves_the_row_unknown_and_sends_nothing() {
    for store in Store::all().await {
        let name = store.name();
        let provider = Provider::start(Duration::ZERO).await;
        let time = VirtualTime::new();
        let key = IdempotencyKey::derive("tests.reconcile", &[name, "probe-fails"]);
        for attempt in 1..=2 {
            provider
                .receiver
                .inject(When::key_attempt(&key, attempt), Fault::ResetBeforeHandler);
        }
        let ledger = store.open().await;
        let first = client(ledger.clone(), &time, "first", None);
        charge(&first, &provider, &key)
            .await
            .expect_err("every attempt reset");
        time.advance(WINDOW + Duration::from_secs(1));

        // Nothing listens on this port.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = closed.local_addr().expect("addr").port();
        drop(closed);
        let probe = HttpProbe::new(
            testkit::loopback_http().expect("client"),
            move |operation| format!("http://127.0.0.1:{port}/lookup?key={}", operation.key),
            |_, _| Resolution::NotDone,
        );
        let next = client(store.open().await, &time, "next", Some(probe));
        let err = charge(&next, &provider, &key)
            .await
            .expect_err("still unknown");
        assert_eq!(err.kind(), ErrorKind::ReconcileWindow, "{name}: {err}");
        assert!(err.is_outcome_unknown(), "{name}");
        assert!(
            err.to_string().contains("http-probe could not tell"),
            "{name}: {err}"
        );
        assert_eq!(provider.charge_arrivals(), 2, "{name}: nothing sent");
        let still = row(&ledger, &key).await;
        assert_eq!(still.status, OperationStatus::Unknown, "{name}");
        assert_eq!(
            (still.resolution, still.lease_owner),
            (None, None),
            "{name}"
        );
        assert_eq!(
            next.reconcile(key.as_str())
                .await
                .expect("reconcile on demand"),
            Reconciled::StillUnknown,
            "{name}"
        );
    }
}

/// Six charges left unknown past their window; two sweepers on two workers sweep at once.
/// Each key is looked up once, every row ends resolved, and the counts add up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sweepers_racing_probe_each_key_once() {
    for store in Store::all().await {
        let name = store.name();
        let provider = Provider::start(Duration::from_millis(20)).await;
        let time = VirtualTime::new();
        let keys: Vec<IdempotencyKey> = (0..6)
            .map(|n| IdempotencyKey::derive("tests.reconcile", &[name, "sweep", &n.to_string()]))
            .collect();
        let ledger = store.open().await;
        let first = client(ledger.clone(), &time, "first", None);
        for (n, key) in keys.iter().enumerate() {
            // Even keys charge and lose the answer; odd keys never reach the handler.
            let fault = if n % 2 == 0 {
                Fault::ResetAfterCommit
            } else {
                Fault::ResetBeforeHandler
            };
            provider.receiver.inject(When::key_attempt(key, 1), fault);
            provider
                .receiver
                .inject(When::key_attempt(key, 2), Fault::ResetBeforeHandler);
            charge(&first, &provider, key)
                .await
                .expect_err("answer lost");
        }
        time.advance(WINDOW + Duration::from_secs(1));
        let a = client(
            store.open().await,
            &time,
            "sweeper-a",
            Some(provider.probe()),
        );
        let b = client(
            store.open().await,
            &time,
            "sweeper-b",
            Some(provider.probe()),
        );
        let (ra, rb) = tokio::join!(a.reconcile_unresolved(100), b.reconcile_unresolved(100));
        let (ra, rb) = (ra.expect("sweep a"), rb.expect("sweep b"));
        for key in &keys {
            assert_eq!(
                provider.lookups(key.as_str()),
                1,
                "{name}: {key} looked up once"
            );
        }
        assert_eq!(ra.done + rb.done, 3, "{name}: {ra} / {rb}");
        assert_eq!(ra.not_done + rb.not_done, 3, "{name}: {ra} / {rb}");
        assert_eq!(
            ra.busy + rb.busy + ra.settled + rb.settled,
            6,
            "{name}: each key left to the other sweeper once: {ra} / {rb}"
        );
        assert_eq!(
            ra.failed + rb.failed + ra.still_unknown + rb.still_unknown,
            0,
            "{name}"
        );
        for (n, key) in keys.iter().enumerate() {
            let settled = row(&ledger, key).await;
            let want = if n % 2 == 0 {
                OperationStatus::Succeeded
            } else {
                OperationStatus::FailedFinal
            };
            assert_eq!(settled.status, want, "{name}: {key}");
        }
        // Nothing is left to sweep.
        let again = a.reconcile_unresolved(100).await.expect("sweep again");
        assert_eq!(again.unresolved, 0, "{name}: {again}");
    }
}

/// The "retry with the same key" reconciler: past the window, the run sends the charge again
/// with the same key, and the receiver (which still holds the key) replays its answer: one
/// charge, no lookup.
#[tokio::test]
async fn send_again_resends_with_the_same_key_and_the_receiver_replays() {
    for store in Store::all().await {
        let name = store.name();
        let provider = Provider::start(Duration::ZERO).await;
        let time = VirtualTime::new();
        let key = IdempotencyKey::derive("tests.reconcile", &[name, "send-again"]);
        provider
            .receiver
            .inject(When::key_attempt(&key, 1), Fault::ResetAfterCommit);
        provider
            .receiver
            .inject(When::key_attempt(&key, 2), Fault::ResetBeforeHandler);
        let ledger = store.open().await;
        let first = client(ledger.clone(), &time, "first", None);
        let err = charge(&first, &provider, &key)
            .await
            .expect_err("answers lost");
        assert!(err.is_outcome_unknown(), "{name}: {err}");
        time.advance(WINDOW + Duration::from_secs(1));
        let next = Client::builder()
            .http(testkit::loopback_http().expect("client"))
            .policy(policy())
            .clock(time.clone())
            .sleeper(time.clone())
            .ledger(store.open().await)
            .reconciler(idempotent_retry::reconcile::SendAgain::new())
            .build()
            .expect("valid");
        let response = charge(&next, &provider, &key).await.expect("sent again");
        assert_eq!(response.status(), 200, "{name}");
        assert_eq!(
            response
                .headers()
                .get(idempotent_retry_testkit::REPLAYED_HEADER)
                .and_then(|v| v.to_str().ok()),
            Some("true"),
            "{name}: the receiver replayed"
        );
        assert_eq!(provider.receiver.effects_for(key.as_str()), 1, "{name}");
        assert_eq!(provider.charge_arrivals(), 3, "{name}");
        let note = row(&ledger, &key).await.resolution.expect("recorded");
        assert_eq!(note.kind, ResolutionKind::SendAgain, "{name}");
        assert!(
            note.by.starts_with("send-again (worker "),
            "{name}: {}",
            note.by
        );
    }
}

/// A probe whose answer is over a mebibyte gets no answer: still unknown.
#[tokio::test]
async fn a_probe_answer_over_a_mebibyte_is_no_answer() {
    let receiver = Receiver::builder()
        .handler(|_| async { Reply::ok("x".repeat((1 << 20) + 1)) })
        .start()
        .await
        .expect("receiver");
    let url = receiver.url("/lookup");
    let probe = HttpProbe::new(
        testkit::loopback_http().expect("client"),
        move |_| url.clone(),
        |_, _| Resolution::NotDone,
    );
    let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    let record = OperationRecord::builder("k", "f", at, at + WINDOW)
        .status(OperationStatus::Unknown)
        .build()
        .expect("valid");
    use idempotent_retry::reconcile::Reconciler as _;
    assert_eq!(probe.reconcile(&record).await, Resolution::Unknown);
    assert_eq!(receiver.arrivals(), 1, "asked once");
}
