//! The PostgreSQL ledger passes the conformance suite, on the throwaway server that
//! `.ci/run` starts (`IDEMPOTENT_RETRY_PG_URL`; skipped without it, except under `CI`).

use idempotent_retry_postgres::PostgresLedger;
use idempotent_retry_testkit::ledger_conformance;
use tokio_postgres::NoTls;

/// The test server's URL, or `None` (the test is skipped) outside CI.
fn url() -> Option<String> {
    match std::env::var("IDEMPOTENT_RETRY_PG_URL") {
        Ok(url) => Some(url),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("IDEMPOTENT_RETRY_PG_URL must be set in CI (.ci/run starts PostgreSQL)")
        }
        Err(_) => {
            eprintln!("skipped: IDEMPOTENT_RETRY_PG_URL is not set");
            None
        }
    }
}

/// A new database on the test server, so a case sees no other case's table.
#[allow(clippy::disallowed_methods)]
async fn fresh_database(base: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (admin, connection) = tokio_postgres::connect(base, NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!("ir_conf_{}_{n}_{nanos}", std::process::id());
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    format!("{prefix}/{name}")
}

/// Every case on a new database of its own, with the claims of the concurrent case
/// racing on two threads, each on a pooled connection of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledger_conforms() {
    let Some(base) = url() else { return };
    ledger_conformance(|| async {
        let url = fresh_database(&base).await;
        let ledger = PostgresLedger::connect(&url).await.expect("connect");
        ledger.migrate().await.expect("migrate");
        ledger
    })
    .await
    .assert_passed();
}
