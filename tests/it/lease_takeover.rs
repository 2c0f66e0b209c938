//! A process killed mid-request, restarted at once with every default: the restarted run waits
//! out the dead run's lease (nobody renews it any more), takes the key over and finishes the
//! operation with one effect at the receiver, within about one lease.
//!
//! The test binary is run again as the two processes (`CHILD_LEDGER` set), as the torture test
//! runs its workers.

use std::process::Stdio;
use std::time::Duration;

use idempotent_retry::ledger::{Ledger, OperationStatus, SqliteLedger};
use idempotent_retry::time::{Clock as _, TokioClock};
use idempotent_retry::{Client, IdempotencyKey, RetryReport};
use tokio::io::AsyncReadExt;

use crate::support::*;

/// When set, the test binary is one of the processes: the ledger file it opens.
const CHILD_LEDGER: &str = "IDEMPOTENT_RETRY_LEASE_CHILD_LEDGER";
/// The receiver's charge URL, for a child.
const CHILD_URL: &str = "IDEMPOTENT_RETRY_LEASE_CHILD_URL";

fn charge_key() -> IdempotencyKey {
    IdempotencyKey::derive("tests.lease_takeover", &["charge", "1"])
}

/// One process: a client with every default and an SQLite ledger, one keyed charge; prints
/// the answer and the report's lease wait on stdout.
async fn child(path: String, url: String) {
    let ledger = SqliteLedger::open(&path).await.expect("open the ledger");
    let client = Client::builder()
        .ledger(ledger)
        .build()
        .expect("a client with the defaults");
    let response = client
        .post(url)
        .idempotency_key(charge_key())
        .body("charge 100")
        .send()
        .await
        .expect("the operation finishes");
    let report = RetryReport::of(&response).expect("report").clone();
    let status = response.status().as_u16();
    let body = response.text().await.expect("body");
    println!(
        "answer {status} {body} waited_ms {}",
        report.lease_wait().as_millis()
    );
}

fn spawn(path: &std::path::Path, url: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            crate::support::test_name(
                module_path!(),
                "a_process_killed_mid_request_is_taken_over_within_a_lease_with_the_defaults",
            )
            .as_str(),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_LEDGER, path)
        .env(CHILD_URL, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start a process")
}

#[tokio::test]
async fn a_process_killed_mid_request_is_taken_over_within_a_lease_with_the_defaults() {
    if let (Ok(path), Ok(url)) = (std::env::var(CHILD_LEDGER), std::env::var(CHILD_URL)) {
        return child(path, url).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    // The first request is charged, then its answer ("late") is held until the process is gone.
    let server = TestServer::start_idempotent(
        vec![Action::commit_then_stall(
            Duration::from_secs(120),
            Action::ok("late"),
        )],
        Action::ok("charged"),
    )
    .await;
    let url = server.url("/charges");
    let mut doomed = spawn(&path, &url);
    assert_eq!(server.wait_for_hits(1, Duration::from_secs(60)).await, 1);
    doomed.start_kill().expect("SIGKILL");
    let killed = tokio::time::timeout(Duration::from_secs(30), doomed.wait())
        .await
        .expect("the killed process is reaped")
        .expect("status");
    assert!(!killed.success(), "killed by a signal: {killed:?}");
    let clock = TokioClock::new();
    let kill = clock.now();

    let mut restarted = spawn(&path, &url);
    let mut stdout = restarted.stdout.take().expect("piped stdout");
    let status = tokio::time::timeout(Duration::from_secs(120), restarted.wait())
        .await
        .expect("the restarted process ends within the bound")
        .expect("status");
    let took = kill.elapsed();
    let mut said = String::new();
    stdout.read_to_string(&mut said).await.expect("stdout");
    assert!(status.success(), "{status:?}: {said}");
    // The receiver answers from its store: the first run's charge, whose answer it held.
    assert!(said.contains("answer 200 late"), "{said}");
    eprintln!("kill to answer: {took:?} ({})", said.trim());
    let waited: u64 = said
        .split("waited_ms ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|number| number.parse().ok())
        .expect("the wait is printed");
    assert!(
        waited > 0,
        "the restarted run waited for the dead run's lease: {said}"
    );

    assert_eq!(server.effects(), 1, "one charge");
    assert_eq!(server.keys(), vec![Some(charge_key().to_string()); 2]);
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let row = ledger
        .get(charge_key().as_str())
        .await
        .expect("read")
        .expect("row");
    assert_eq!(row.status, OperationStatus::Succeeded);
    assert_eq!(
        row.attempts, 2,
        "the dead run's request and the restarted run's"
    );
}
