//! A PostgreSQL database of its own for one test, on the server `IDEMPOTENT_RETRY_PG_URL`
//! names: tests never migrate or fill the server's shared database, which other checkouts of
//! the crate (at other schema versions) may be using.

use idempotent_retry::IdempotencyKey;
use idempotent_retry_postgres::tokio_postgres;
use tokio_postgres::NoTls;

/// The URL of a new, empty database, or `None` (skipped) without a server, except under `CI`,
/// where the server must be there.
pub async fn fresh_postgres_database() -> Option<String> {
    let base = match std::env::var("IDEMPOTENT_RETRY_PG_URL") {
        Ok(url) => url,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("IDEMPOTENT_RETRY_PG_URL must be set in CI (.ci/run starts PostgreSQL)")
        }
        Err(_) => {
            eprintln!("skipped: IDEMPOTENT_RETRY_PG_URL is not set");
            return None;
        }
    };
    let (admin, connection) = tokio_postgres::connect(&base, NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    let name = format!("ir_{}", IdempotencyKey::random().as_str().replace('-', ""));
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    Some(format!("{prefix}/{name}"))
}
