//! The PostgreSQL ledger passes the conformance suite, on the throwaway server that
//! `.ci/run` starts (`IDEMPOTENT_RETRY_PG_URL`; skipped without it, except under `CI`).

use idempotent_retry_postgres::PostgresLedger;
use idempotent_retry_postgres::testing::{create_database, server_url};
use idempotent_retry_testkit::ledger_conformance;

/// Every fixed-time case on a new database of its own, the statements taking the present
/// from each request (the suite's times in 2024), with the claims of the concurrent case
/// racing on two threads, each on a pooled connection of its own.
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledger_conforms() {
    let Some(base) = server_url() else { return };
    let report = ledger_conformance(|| async { ledger(&base).await.on_caller_clock() }).await;
    report.assert_passed();
    assert_eq!(report.cases().len(), 24, "{report}");
}

/// The ledger as it ships, on the database's clock: the cases of callers whose clocks are a
/// minute ahead and a minute behind.
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledger_on_its_own_clock_conforms_for_skewed_callers() {
    let Some(base) = server_url() else { return };
    let report = ledger_conformance(|| ledger(&base)).await;
    report.assert_passed();
    let cases: Vec<&str> = report.cases().collect();
    assert_eq!(cases.len(), 3, "{report}");
    assert!(
        cases
            .iter()
            .any(|case| case.contains("whose clock is ahead"))
            && cases
                .iter()
                .any(|case| case.contains("whose clock is behind")),
        "{cases:?}"
    );
}

/// A migrated ledger on a new database of its own.
async fn ledger(base: &str) -> PostgresLedger {
    let url = create_database(base)
        .await
        .unwrap_or_else(|err| panic!("a database on the test server: {err}"));
    let ledger = PostgresLedger::connect(&url).await.expect("connect");
    ledger.migrate().await.expect("migrate");
    ledger
}
