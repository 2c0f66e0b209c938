//! Twenty processes written as the quick start writes one (`SqliteLedger::open`, a `Client`
//! with it, one keyed request, the end of `main`) leave the ledger file tidy: no WAL that
//! grows with every run. The test binary is run again as each process (`CHILD_LEDGER` set).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use idempotent_retry::ledger::SqliteLedger;
use idempotent_retry::{Client, IdempotencyKey};

use crate::support::*;

const CHILD_LEDGER: &str = "IDEMPOTENT_RETRY_QUICK_START_LEDGER";
const CHILD_URL: &str = "IDEMPOTENT_RETRY_QUICK_START_URL";
const CHILD_RUN: &str = "IDEMPOTENT_RETRY_QUICK_START_RUN";

/// One process, as the quick start has it: nothing closed by hand.
async fn child(path: String, url: String, run: String) {
    let ledger = SqliteLedger::open(&path).await.expect("open the ledger");
    let client = Client::builder().ledger(ledger).build().expect("a client");
    let key = IdempotencyKey::derive("tests.quick_start_wal", &[&run]);
    let response = client
        .post(url)
        .idempotency_key(key)
        .body("charge")
        .send()
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
}

fn wal_len(path: &Path) -> u64 {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).map_or(0, |meta| meta.len())
}

#[tokio::test]
async fn twenty_quick_start_processes_leave_no_growing_wal() {
    if let (Ok(path), Ok(url), Ok(run)) = (
        std::env::var(CHILD_LEDGER),
        std::env::var(CHILD_URL),
        std::env::var(CHILD_RUN),
    ) {
        return child(path, url, run).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let server = TestServer::start(vec![], Action::ok("charged")).await;
    let mut sizes = Vec::new();
    for run in 0..20 {
        let status = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(std::env::current_exe().expect("the test binary"))
                .args([
                    crate::support::test_name(
                        module_path!(),
                        "twenty_quick_start_processes_leave_no_growing_wal",
                    )
                    .as_str(),
                    "--exact",
                    "--test-threads=1",
                ])
                .env(CHILD_LEDGER, &path)
                .env(CHILD_URL, server.url("/charges"))
                .env(CHILD_RUN, run.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status(),
        )
        .await
        .expect("the process ends within the bound")
        .expect("status");
        assert!(status.success(), "run {run}: {status:?}");
        sizes.push(wal_len(&path));
    }
    assert_eq!(server.hits(), 20);
    assert!(
        sizes.iter().all(|&len| len == 0),
        "the WAL after each run: {sizes:?}"
    );
}
