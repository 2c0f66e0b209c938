//! The PostgreSQL ledger passes the conformance suite, on the throwaway server that
//! `.ci/run` starts (`IDEMPOTENT_RETRY_PG_URL`; skipped without it, except under `CI`).

use idempotent_retry_postgres::PostgresLedger;
use idempotent_retry_postgres::testing::{create_database, server_url};
use idempotent_retry_testkit::ledger_conformance;

/// Every case on a new database of its own, with the claims of the concurrent case
/// racing on two threads, each on a pooled connection of its own.
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledger_conforms() {
    let Some(base) = server_url() else { return };
    ledger_conformance(|| async {
        let url = create_database(&base)
            .await
            .unwrap_or_else(|err| panic!("a database on the test server: {err}"));
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        ledger
    })
    .await
    .assert_passed();
}
