//! The SQLite ledger passes the conformance suite.

use idempotent_retry_sqlite::SqliteLedger;
use idempotent_retry_testkit::ledger_conformance;

/// Every case on a new file of its own, with the claims of the concurrent case racing on
/// two threads (each claim is a transaction on the ledger's connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ledger_conforms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = 0;
    ledger_conformance(|| {
        files += 1;
        let path = dir.path().join(format!("case-{files}.db"));
        async move { SqliteLedger::open(path).await.expect("open") }
    })
    .await
    .assert_passed();
}
