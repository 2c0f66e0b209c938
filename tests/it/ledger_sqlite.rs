//! The SQLite ledger across restarts and faults, against real loopback servers: a new client
//! on the same file keeps the key, the window and the outcome; a broken or locked file gives
//! typed errors and never an unrecorded request; `migrate` upgrades a file without a schema
//! version and refuses one from a newer release.
#![cfg(feature = "sqlite")]

use idempotent_retry_sqlite::rusqlite;
use std::path::Path;
use std::time::Duration;

use crate::support::*;
use idempotent_retry::ledger::{
    LeaseHeldPolicy, Ledger, LedgerErrorKind, LedgerOptions, MemoryLedger, OperationRecord,
    OperationStatus, SqliteLedger,
};
use idempotent_retry::{Client, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{Fault, Receiver, When};

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5))
        .with_attempt_timeout(Duration::from_secs(5))
        .with_max_attempts(2)
}

/// A "process": a client on the shared virtual timeline with its own connection to the file.
async fn process(path: &Path, time: &VirtualTime) -> (Client, SqliteLedger) {
    let ledger = SqliteLedger::open(path).await.expect("open the ledger");
    let client = Client::builder()
        .policy(policy())
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(ledger.clone())
        .ledger_options(
            LedgerOptions::new()
                .lease(Duration::from_secs(10))
                .on_lease_held(LeaseHeldPolicy::Fail),
        )
        .build()
        .expect("valid policy");
    (client, ledger)
}

/// The charge's row.
async fn stored(ledger: &SqliteLedger) -> OperationRecord {
    ledger
        .get(charge_key().as_str())
        .await
        .expect("read")
        .expect("the charge has a row")
}

fn charge_key() -> IdempotencyKey {
    IdempotencyKey::derive("tests.sqlite", &["order-17", "charge"])
}

#[tokio::test]
async fn a_restarted_process_keeps_the_key_the_window_and_the_outcome() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let server = TestServer::start_idempotent(
        vec![Action::status(503), Action::status(503)],
        Action::ok("charged"),
    )
    .await;
    let time = VirtualTime::new();
    let body = serde_json::json!({"order": 17, "amount": 100});

    // Run 1: two 503s, outcome unknown; the process then exits.
    let (client, ledger) = process(&path, &time).await;
    let err = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .json(&body)
        .send()
        .await
        .expect_err("two 503s");
    assert!(err.is_outcome_unknown());
    let first = stored(&ledger).await;
    assert_eq!(first.status, OperationStatus::Unknown);
    drop((client, ledger));

    // Run 2, a new process ten minutes later: same key, window start kept, succeeds.
    time.advance(Duration::from_secs(600));
    let (client, ledger) = process(&path, &time).await;
    let response = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .json(&body)
        .send()
        .await
        .expect("third attempt succeeds");
    assert_eq!(response.text().await.expect("body"), "charged");
    let row = stored(&ledger).await;
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(row.first_attempt_at, first.first_attempt_at);
    assert_eq!(row.attempts, 3);
    drop((client, ledger));

    // Run 3: the completed operation is answered from the file, not sent again.
    let (client, _ledger) = process(&path, &time).await;
    let replay = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .json(&body)
        .send()
        .await
        .expect("replayed");
    assert!(RetryReport::of(&replay).expect("report").is_replayed());
    assert_eq!(replay.text().await.expect("body"), "charged");
    assert_eq!(server.hits(), 3);
    assert_eq!(server.keys(), vec![Some(charge_key().to_string()); 3]);
    assert_eq!(server.effects(), 1);
}

#[tokio::test]
async fn a_process_that_dies_mid_attempt_is_taken_over_after_its_lease() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    // The first request commits, then the process dies before the answer arrives.
    let server = TestServer::start_idempotent(
        vec![Action::commit_then_stall(
            Duration::from_secs(10),
            Action::ok("late"),
        )],
        Action::ok("charged"),
    )
    .await;
    let time = VirtualTime::new();
    let (client, ledger) = process(&path, &time).await;
    // The process is killed mid-attempt: no destructor runs, the lease stays as it was.
    die_when(
        client
            .post(server.url("/charges"))
            .idempotency_key(charge_key())
            .body("charge")
            .send(),
        server.wait_for_hits(1, Duration::from_secs(5)),
    )
    .await;
    drop(client);
    drop(ledger);

    let (client, ledger) = process(&path, &time).await;
    let err = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .body("charge")
        .send()
        .await
        .expect_err("the dead run's lease is still live");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert_eq!(server.hits(), 1);

    // One lease (10 s) later, with no renewal from the dead process, the lease has lapsed.
    time.advance(Duration::from_secs(11));
    let response = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .body("charge")
        .send()
        .await
        .expect("taken over");
    assert_eq!(
        response
            .headers()
            .get(REPLAYED_HEADER)
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "the receiver recognised the key"
    );
    assert_eq!(server.effects(), 1, "one charge");
    assert_eq!(server.keys(), vec![Some(charge_key().to_string()); 2]);
    let row = stored(&ledger).await;
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(row.attempts, 2, "both requests that reached the receiver");
}

#[tokio::test]
async fn a_file_corrupted_under_a_running_client_sends_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let time = VirtualTime::new();
    let (client, _ledger) = process(&path, &time).await;
    client
        .post(server.url("/x"))
        .idempotency_key(IdempotencyKey::derive("t", &["before"]))
        .send()
        .await
        .expect("healthy");
    // Something overwrites the file (and its WAL) while the process runs.
    for suffix in ["", "-wal", "-shm"] {
        let file = dir.path().join(format!("operations.db{suffix}"));
        if file.exists() {
            std::fs::write(&file, vec![0xa5_u8; 64 * 1024]).expect("overwrite");
        }
    }
    let err = client
        .post(server.url("/x"))
        .idempotency_key(IdempotencyKey::derive("t", &["after"]))
        .send()
        .await
        .expect_err("the ledger is unreadable");
    assert_eq!(err.kind(), ErrorKind::Ledger, "{err}");
    assert!(!err.is_outcome_unknown());
    assert_eq!(err.attempts(), 0);
    assert_eq!(server.hits(), 1, "nothing sent without a recorded claim");
}

#[tokio::test]
async fn a_file_locked_mid_attempt_returns_the_answer_and_the_next_run_resolves_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    // Long enough for the test to take the lock between the claim and the record.
    let server = TestServer::start_idempotent(
        vec![Action::stall_then(
            Duration::from_secs(1),
            Action::ok("charged"),
        )],
        Action::ok("charged"),
    )
    .await;
    let time = VirtualTime::new();
    let (client, ledger) = process(&path, &time).await;
    ledger
        .set_busy_timeout(Duration::from_millis(50))
        .await
        .expect("configure");
    let sending = tokio::spawn({
        let (client, url) = (client.clone(), server.url("/charges"));
        async move {
            client
                .post(url)
                .idempotency_key(charge_key())
                .body("charge")
                .send()
                .await
        }
    });
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(5)).await, 1);
    // Another process takes the write lock and holds it: the file cannot be written.
    let blocker = rusqlite::Connection::open(&path).expect("open");
    blocker
        .execute_batch("BEGIN EXCLUSIVE")
        .expect("take the write lock");
    let answered = sending
        .await
        .expect("task")
        .expect("the answer in hand is returned, though it could not be recorded");
    assert_eq!(answered.status(), 200);
    let report = RetryReport::of(&answered).expect("report").clone();
    assert_eq!(report.idempotency_key(), Some(&charge_key()));
    let why = report
        .unrecorded()
        .expect("the report says it was not recorded");
    assert!(why.contains("ledger unavailable"), "{why}");
    assert_eq!(answered.text().await.expect("body"), "charged");
    blocker.execute_batch("ROLLBACK").expect("release");
    drop(blocker);

    // The row is still in flight; once its lease lapses the next run resends the same key
    // and the receiver deduplicates it.
    time.advance(Duration::from_secs(11));
    let response = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .body("charge")
        .send()
        .await
        .expect("resolved");
    assert_eq!(response.text().await.expect("body"), "charged");
    assert_eq!(server.effects(), 1);
    assert_eq!(server.keys(), vec![Some(charge_key().to_string()); 2]);
}

/// The crate's own idempotent receiver counts the effects: a charge whose answer was lost is
/// resumed by a restarted process under the same derived key and runs once, and once it is
/// recorded as done, a further restart answers from the file without a request.
#[tokio::test]
async fn a_restart_after_a_lost_answer_charges_once_and_then_replays_from_the_file() {
    use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let receiver = Receiver::builder()
        .scope("tests.charge")
        .start()
        .await
        .expect("receiver");
    let key = charge_key();
    // The charge commits but its answer is lost, and the retry cannot get through either.
    receiver.inject(When::key_attempt(&key, 1), Fault::ResetAfterCommit);
    receiver.inject(When::key_attempt(&key, 2), Fault::ResetBeforeHandler);
    let time = VirtualTime::new();
    let body = serde_json::json!({"order": 17, "amount": 100});
    let process = |ledger: SqliteLedger| {
        Client::builder()
            .http(testkit::loopback_http().expect("http client"))
            .policy(policy())
            .clock(time.clone())
            .sleeper(time.clone())
            .ledger(ledger)
            .build()
            .expect("valid policy")
    };
    let charge = |client: Client| {
        let (url, body) = (receiver.url("/charges"), body.clone());
        // Each run derives the key again from the same inputs, as a restarted job would.
        async move {
            client
                .post(url)
                .idempotency_key(charge_key())
                .json(&body)
                .send()
                .await
        }
    };

    let first = process(SqliteLedger::open(&path).await.expect("open"));
    let err = charge(first).await.expect_err("no answer arrived");
    assert!(err.is_outcome_unknown());
    assert_eq!(receiver.effects_for(key.as_str()), 1, "it ran, unseen");

    // The process restarts: a new client on the same file, the same key.
    let ledger = SqliteLedger::open(&path).await.expect("reopen");
    let response = charge(process(ledger.clone()))
        .await
        .expect("resumed with the same key");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response
            .headers()
            .get(testkit::REPLAYED_HEADER)
            .map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "the receiver recognised the key"
    );
    assert_eq!(
        response.text().await.expect("body"),
        r#"{"effect":1}"#,
        "the first run's answer"
    );
    assert_eq!(receiver.effects(), 1, "exactly one charge");
    assert_eq!(receiver.keys(), vec![Some(key.to_string()); 3]);
    let row = ledger.get(key.as_str()).await.expect("read").expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(row.attempts, 3);
    drop(ledger);

    // Another restart: the operation is done, so nothing reaches the receiver.
    let arrivals = receiver.arrivals();
    let replay = charge(process(SqliteLedger::open(&path).await.expect("reopen")))
        .await
        .expect("answered from the file");
    assert!(RetryReport::of(&replay).expect("report").is_replayed());
    assert_eq!(replay.text().await.expect("body"), r#"{"effect":1}"#);
    assert_eq!(receiver.arrivals(), arrivals, "no request at all");
    assert_eq!(receiver.effects(), 1);
}

/// The file's `user_version` and its schema cookie (which SQLite bumps on every DDL change),
/// and how many rows the ledger's table holds, read with a connection of the test's own.
fn file_state(path: &Path) -> (i64, i64, i64) {
    let conn = rusqlite::Connection::open(path).expect("open");
    let pragma = |name: &str| -> i64 {
        conn.pragma_query_value(None, name, |row| row.get(0))
            .expect("pragma")
    };
    let rows = conn
        .query_row("SELECT count(*) FROM idempotent_operations", [], |row| {
            row.get(0)
        })
        .expect("count");
    (pragma("user_version"), pragma("schema_version"), rows)
}

#[tokio::test]
async fn a_new_file_is_at_the_latest_schema_version_and_migrating_again_changes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
    let before = file_state(&path);
    assert_eq!(
        before.0,
        i64::from(LATEST),
        "the version is in user_version"
    );
    ledger.migrate().await.expect("migrate again");
    ledger.migrate().await.expect("and again");
    let reopened = SqliteLedger::open(&path).await.expect("reopen");
    assert_eq!(reopened.schema_version().await.expect("version"), LATEST);
    assert_eq!(file_state(&path), before, "no statement changed the file");
}

/// The row a 0.1 process left (outcome unknown after two 503s) is still the same operation
/// after the upgrade: the next run claims it under the same key and window and finishes it.
#[tokio::test]
async fn a_file_made_by_the_0_1_migrate_is_upgraded_and_its_row_claimed_and_finished() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let server = TestServer::start_idempotent(
        vec![Action::status(503), Action::status(503)],
        Action::ok("charged"),
    )
    .await;
    let time = VirtualTime::new();
    let body = serde_json::json!({"order": 17, "amount": 100});

    // The first run, on a ledger that keeps the same record as the SQL ones, gives the row its
    // real fingerprint; it is then written into a file made with the 0.1 DDL by hand.
    let memory = MemoryLedger::new();
    let client = Client::builder()
        .policy(policy())
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(memory.clone())
        .build()
        .expect("valid policy");
    let err = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .json(&body)
        .send()
        .await
        .expect_err("two 503s");
    assert!(err.is_outcome_unknown());
    let left: OperationRecord = memory
        .get(charge_key().as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!((left.status, left.attempts), (OperationStatus::Unknown, 2));
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(&ddl_0_1("BLOB"))
        .expect("the 0.1 schema");
    conn.execute(
        "INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts, \
         first_attempt_at, last_attempt_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        rusqlite::params![
            left.key,
            left.scope,
            left.fingerprint,
            left.status.as_str(),
            left.attempts,
            millis(left.first_attempt_at),
            left.last_attempt_at.map(millis),
            millis(left.expires_at),
        ],
    )
    .expect("the 0.1 row");
    drop(conn);
    assert_eq!(file_state(&path).0, 0, "no version recorded");

    // A new release opens the file ten minutes later: stamped, the row as it was.
    time.advance(Duration::from_secs(600));
    let (client, ledger) = process(&path, &time).await;
    assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
    let row = stored(&ledger).await;
    assert_eq!(
        (&row.fingerprint, row.status, row.attempts),
        (&left.fingerprint, OperationStatus::Unknown, 2)
    );
    assert_eq!(millis(row.first_attempt_at), millis(left.first_attempt_at));

    let response = client
        .post(server.url("/charges"))
        .idempotency_key(charge_key())
        .json(&body)
        .send()
        .await
        .expect("the upgraded row is claimed and the third attempt succeeds");
    assert_eq!(response.text().await.expect("body"), "charged");
    let row = stored(&ledger).await;
    assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 3));
    assert_eq!(millis(row.first_attempt_at), millis(left.first_attempt_at));
    assert_eq!(server.keys(), vec![Some(charge_key().to_string()); 3]);
    assert_eq!(server.effects(), 1);
}

#[tokio::test]
async fn a_file_from_a_newer_release_is_refused_with_both_versions_and_left_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let server = TestServer::start(vec![], Action::ok("ok")).await;
    let time = VirtualTime::new();
    let (client, ledger) = process(&path, &time).await;
    client
        .post(server.url("/x"))
        .idempotency_key(charge_key())
        .send()
        .await
        .expect("healthy");
    drop((client, ledger));
    // What a release with schema version 4 would leave.
    rusqlite::Connection::open(&path)
        .expect("open")
        .pragma_update(None, "user_version", LATEST + 1)
        .expect("stamp a newer version");
    let before = file_state(&path);

    let err = SqliteLedger::open(&path).await.expect_err("too new");
    assert_eq!(err.kind(), LedgerErrorKind::Corrupt, "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "ledger storage is corrupt: schema version {} is newer than {LATEST}, the latest \
             this release of idempotent-retry knows: upgrade idempotent-retry to use this store \
             (it was left unchanged)",
            LATEST + 1
        )
    );
    assert_eq!(
        file_state(&path),
        before,
        "version, schema and rows untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_migrating_a_new_file_at_once_all_succeed() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Many rounds, each on a new file, so the opens really overlap in some of them.
    for round in 0..20 {
        let path = dir.path().join(format!("operations-{round}.db"));
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(4));
        let mut opens = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (path, barrier) = (path.clone(), barrier.clone());
            opens.spawn(async move {
                barrier.wait().await;
                SqliteLedger::open(&path).await
            });
        }
        while let Some(opened) = opens.join_next().await {
            let ledger = opened
                .expect("task")
                .expect("every open migrates or finds it done");
            assert_eq!(ledger.schema_version().await.expect("version"), LATEST);
            assert_eq!(ledger.get("none").await.expect("usable"), None);
        }
        assert_eq!(file_state(&path).0, i64::from(LATEST));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledgers_migrating_a_0_1_file_at_once_all_succeed_and_keep_its_rows() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let conn = rusqlite::Connection::open(&path).expect("open");
    conn.execute_batch(&ddl_0_1("BLOB"))
        .expect("the 0.1 schema");
    conn.execute(
        "INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts, \
         first_attempt_at, expires_at) VALUES ('k', 's', 'f', 'failed_final', 1, 1000, 9000)",
        [],
    )
    .expect("a 0.1 row");
    let mut ledgers = Vec::new();
    for _ in 0..4 {
        ledgers.push(SqliteLedger::open(&path).await.expect("open"));
    }
    for round in 0..5 {
        // Back to "no version recorded" under ledgers already open, so the calls that overlap
        // are `migrate` alone, each on its own connection.
        conn.pragma_update(None, "user_version", 0).expect("reset");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(ledgers.len()));
        let mut migrations = tokio::task::JoinSet::new();
        for ledger in &ledgers {
            let (ledger, barrier) = (ledger.clone(), barrier.clone());
            migrations.spawn(async move {
                barrier.wait().await;
                ledger.migrate().await
            });
        }
        while let Some(migrated) = migrations.join_next().await {
            migrated
                .expect("task")
                .unwrap_or_else(|err| panic!("round {round}: {err}"));
        }
        assert_eq!(file_state(&path).0, i64::from(LATEST));
        let row = ledgers[0].get("k").await.expect("read").expect("row kept");
        assert_eq!(
            (row.status, row.attempts),
            (OperationStatus::FailedFinal, 1)
        );
    }
}

/// The worker of [`a_killed_process_leaves_its_lease_and_the_next_one_takes_over`]: when the
/// test binary is run again with these variables, it sends the charge and waits to be killed.
/// The schema version this release writes.
const LATEST: u32 = idempotent_retry_ledger::sql::SCHEMA_VERSION;

const WORKER_DB: &str = "IDEMPOTENT_RETRY_TEST_WORKER_DB";
const WORKER_URL: &str = "IDEMPOTENT_RETRY_TEST_WORKER_URL";

/// The killed worker's attempt timeout, and its lease: long enough that the parent's first
/// claim, made right after the kill, meets the lease still live however busy the machine (the
/// worker renewed it at most a third of a lease before), short enough that the patient claim
/// after it takes the key over within seconds.
const WORKER_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
const WORKER_LEASE: Duration = Duration::from_secs(3);

/// A real process, killed with SIGKILL mid-attempt: no destructor, no release, nothing but
/// what it had committed to the file. The next process finds the lease live, waits it out,
/// takes the row over with the same key and window, and the receiver still sees one charge.
#[tokio::test]
async fn a_killed_process_leaves_its_lease_and_the_next_one_takes_over() {
    if let (Ok(db), Ok(url)) = (std::env::var(WORKER_DB), std::env::var(WORKER_URL)) {
        // The worker: its send never ends (the answer is held back); the parent kills it.
        let ledger = SqliteLedger::open(&db).await.expect("open the ledger");
        let client = Client::builder()
            .policy(policy().with_attempt_timeout(WORKER_ATTEMPT_TIMEOUT))
            .ledger(ledger)
            .ledger_options(LedgerOptions::new().worker("doomed").lease(WORKER_LEASE))
            .build()
            .expect("valid policy");
        let sent = client
            .post(url)
            .idempotency_key(charge_key())
            .body("charge")
            .send()
            .await;
        panic!("the worker should have been killed mid-attempt, got {sent:?}");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    SqliteLedger::open(&path)
        .await
        .expect("open")
        .migrate()
        .await
        .expect("migrate");
    let receiver = Receiver::start().await.expect("receiver");
    // The charge commits, then its answer is held back until long after the kill.
    receiver.inject(
        When::key_attempt(charge_key(), 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    let url = receiver.url("/charges");
    let mut worker = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            crate::support::test_name(
                module_path!(),
                "a_killed_process_leaves_its_lease_and_the_next_one_takes_over",
            )
            .as_str(),
            "--exact",
            "--nocapture",
        ])
        .env(WORKER_DB, &path)
        .env(WORKER_URL, &url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the worker");
    let arrived = receiver.wait_for_arrivals(1, Duration::from_secs(30)).await;
    worker.kill().expect("SIGKILL the worker");
    worker.wait().expect("reap the worker");
    assert_eq!(arrived, 1, "the worker's attempt reached the receiver");

    let ledger = SqliteLedger::open(&path).await.expect("open the ledger");
    let left = stored(&ledger).await;
    assert_eq!(
        left.status,
        OperationStatus::InFlight,
        "nothing released it"
    );
    assert!(
        left.lease_owner
            .as_deref()
            .is_some_and(|owner| owner.starts_with("doomed/")),
        "{left:?}"
    );
    let client = |on_lease_held| {
        Client::builder()
            .policy(policy())
            .ledger(ledger.clone())
            .ledger_options(
                LedgerOptions::new()
                    .worker("next")
                    .on_lease_held(on_lease_held),
            )
            .build()
            .expect("valid policy")
    };
    let send = |client: Client| {
        client
            .post(&url)
            .idempotency_key(charge_key())
            .body("charge")
            .send()
    };
    let err = send(client(LeaseHeldPolicy::Fail))
        .await
        .expect_err("the dead worker's lease is still live");
    assert_eq!(err.kind(), ErrorKind::LeaseHeld);
    assert!(
        err.to_string().contains("held by worker doomed (run "),
        "{err}"
    );

    let patient = LeaseHeldPolicy::Wait {
        poll: Duration::from_millis(20),
        max_wait: Duration::from_secs(30),
    };
    let response = send(client(patient))
        .await
        .expect("taken over after the lease");
    assert_eq!(response.status(), 200);
    assert_eq!(receiver.effects_for(charge_key().as_str()), 1, "one charge");
    assert_eq!(
        receiver.keys(),
        vec![Some(charge_key().to_string()); 2],
        "the same key from both processes"
    );
    let row = stored(&ledger).await;
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(
        row.first_attempt_at, left.first_attempt_at,
        "the window kept"
    );
    assert!(
        row.lease_owner.is_none() && left.lease_expires_at.is_some(),
        "{row:?}"
    );
}

fn claim_of(key: &str, owner: &str) -> idempotent_retry::ledger::Claim {
    let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    idempotent_retry::ledger::Claim::builder(key, "f", owner, now, now + Duration::from_secs(60))
        .expires_at(now + Duration::from_secs(3600))
        .build()
        .expect("valid claim")
}

/// How many rows the file holds, read with a connection of the test's own.
fn row_count(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .expect("open")
        .query_row("SELECT count(*) FROM idempotent_operations", [], |row| {
            row.get(0)
        })
        .expect("count")
}

/// Sixty-four tasks claim one key at once (their claims share the writer's batches and run in
/// order inside them): exactly one gets the row, every other one sees that winner's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_one_key_have_exactly_one_winner() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let mut claims = tokio::task::JoinSet::new();
    for n in 0..64 {
        let (ledger, barrier) = (ledger.clone(), barrier.clone());
        claims.spawn(async move {
            barrier.wait().await;
            ledger
                .claim(&claim_of("contested", &format!("run-{n}")))
                .await
        });
    }
    let (mut winners, mut existing) = (Vec::new(), Vec::new());
    while let Some(claimed) = claims.join_next().await {
        match claimed.expect("task").expect("claimed") {
            idempotent_retry::ledger::Claimed::New(record) => winners.push(record.lease_owner),
            idempotent_retry::ledger::Claimed::Existing(record) => {
                existing.push(record.lease_owner)
            }
            other => panic!("nothing to take over: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    assert_eq!(existing.len(), 63);
    assert!(
        existing.iter().all(|owner| *owner == winners[0]),
        "{existing:?}"
    );
    assert_eq!(row_count(&path), 1);
}

/// Five hundred operations claimed, counted and finished at once all land, each with its own
/// result, and a new connection to the file finds every one of them finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_at_once_all_land() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let mut runs = tokio::task::JoinSet::new();
    for n in 0..500 {
        let ledger = ledger.clone();
        runs.spawn(async move {
            let (key, owner) = (format!("key-{n}"), format!("run-{n}"));
            let claim = claim_of(&key, &owner);
            assert!(matches!(
                ledger.claim(&claim).await.expect("claim"),
                idempotent_retry::ledger::Claimed::New(_)
            ));
            let update = idempotent_retry::ledger::AttemptUpdate::new(
                &key,
                &owner,
                claim.now,
                claim.lease_until,
            )
            .expect("valid update");
            ledger.record_attempt(&update).await.expect("attempt");
            let finish = idempotent_retry::ledger::Finish::new(
                &key,
                &owner,
                OperationStatus::Succeeded,
                None,
            )
            .expect("valid finish");
            ledger.finish(&finish).await.expect("finish");
        });
    }
    while let Some(run) = runs.join_next().await {
        run.expect("every operation recorded");
    }
    drop(ledger);
    let reopened = SqliteLedger::open(&path).await.expect("reopen");
    for n in [0, 123, 499] {
        let row = reopened
            .get(&format!("key-{n}"))
            .await
            .expect("read")
            .expect("landed");
        assert_eq!((row.status, row.attempts), (OperationStatus::Succeeded, 1));
    }
    let finished: i64 = rusqlite::Connection::open(&path)
        .expect("open")
        .query_row(
            "SELECT count(*) FROM idempotent_operations \
             WHERE status = 'succeeded' AND attempts = 1 AND lease_owner IS NULL",
            [],
            |row| row.get(0),
        )
        .expect("count");
    assert_eq!(finished, 500);
}

/// Dropping the last clone ends the writer thread once its queued writes are done, and the
/// file is closed: SQLite checkpoints the WAL into it and removes the `-wal` file when its last
/// connection closes, which a thread left running would prevent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_clone_writes_what_is_queued_and_closes_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let wal = dir.path().join("operations.db-wal");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let clone = ledger.clone();
    clone
        .claim(&claim_of("acknowledged", "run-a"))
        .await
        .expect("claimed");
    assert!(wal.exists(), "the file is open in WAL mode");
    // Queued, then abandoned by their callers just before the last clones go.
    for n in 0..20 {
        let claim = claim_of(&format!("queued-{n}"), "run-q");
        let polled = tokio::time::timeout(Duration::ZERO, ledger.claim(&claim)).await;
        drop(polled);
    }
    drop(clone);
    drop(ledger);
    // Up to ten seconds, in polls of 10 ms.
    for _ in 0..1000 {
        if !wal.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!wal.exists(), "the writer thread still holds the file");
    assert_eq!(row_count(&path), 21, "every queued write landed");
}

/// The worker of [`a_write_is_acknowledged_only_once_its_batch_committed`]: it claims new keys
/// from 64 tasks without end and prints each key once its claim is acknowledged.
const ACK_WORKER_DB: &str = "IDEMPOTENT_RETRY_TEST_ACK_DB";

/// A real process claiming keys as fast as its writer commits them is killed with SIGKILL,
/// mid-batch more often than not: every key it was told was recorded is in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_acknowledged_only_once_its_batch_committed() {
    use std::io::{BufRead, Write};

    if let Ok(db) = std::env::var(ACK_WORKER_DB) {
        let ledger = SqliteLedger::open(&db).await.expect("open the ledger");
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..64 {
            let ledger = ledger.clone();
            tasks.spawn(async move {
                for n in 0.. {
                    let key = format!("ack-{task}-{n}");
                    let claimed = ledger.claim(&claim_of(&key, "run")).await;
                    assert!(matches!(
                        claimed,
                        Ok(idempotent_retry::ledger::Claimed::New(_))
                    ));
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{key}")
                        .and_then(|()| out.flush())
                        .expect("report");
                }
            });
        }
        while let Some(task) = tasks.join_next().await {
            task.expect("the worker's task");
        }
        unreachable!("the worker claims until it is killed");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    SqliteLedger::open(&path).await.expect("create the file");
    let mut worker = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            crate::support::test_name(
                module_path!(),
                "a_write_is_acknowledged_only_once_its_batch_committed",
            )
            .as_str(),
            "--exact",
            "--nocapture",
        ])
        .env(ACK_WORKER_DB, &path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the worker");
    let mut lines = std::io::BufReader::new(worker.stdout.take().expect("piped")).lines();
    let mut acknowledged = Vec::new();
    // Let it run well past its first batches, then kill it without warning.
    while acknowledged.len() < 2000 {
        let line = lines
            .next()
            .expect("the worker is running")
            .expect("a line");
        if line.starts_with("ack-") {
            acknowledged.push(line);
        }
    }
    worker.kill().expect("SIGKILL the worker");
    // Whatever it printed before it died was acknowledged too.
    acknowledged.extend(
        lines
            .map_while(Result::ok)
            .filter(|line| line.starts_with("ack-")),
    );
    worker.wait().expect("reap the worker");

    let conn = rusqlite::Connection::open(&path).expect("open");
    let mut present = conn
        .prepare("SELECT 1 FROM idempotent_operations WHERE key = ?1")
        .expect("prepare");
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|key| !present.exists([key.as_str()]).expect("query"))
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged but not in the file: {missing:?}"
    );
    assert!(row_count(&path) >= i64::try_from(acknowledged.len()).expect("small"));
}
