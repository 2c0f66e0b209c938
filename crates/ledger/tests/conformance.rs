//! The in-memory ledger passes the conformance suite, on one thread and on two.

use idempotent_retry_ledger::MemoryLedger;
use idempotent_retry_testkit::ledger_conformance;

#[tokio::test]
async fn memory_ledger_conforms() {
    ledger_conformance(|| async { MemoryLedger::new() })
        .await
        .assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_ledger_conforms_with_claims_racing_on_threads() {
    ledger_conformance(|| async { MemoryLedger::new() })
        .await
        .assert_passed();
}
