//! A PostgreSQL database of its own for one test, on the server `IDEMPOTENT_RETRY_PG_URL`
//! names: tests never migrate or fill the server's shared database, which other checkouts of
//! the crate (at other schema versions) may be using. The rules (skipped without a server,
//! except under `CI`) are `idempotent_retry_postgres::testing`'s, which the backend's own tests
//! use too.

use idempotent_retry_postgres::testing;

/// The test server's URL, or `None` (skipped) without a server, except under `CI`, where the
/// server must be there.
pub fn postgres_server_url() -> Option<String> {
    testing::server_url()
}

/// The URL of a new, empty database on the server at `base`.
pub async fn postgres_database_on(base: &str) -> String {
    testing::create_database(base)
        .await
        .unwrap_or_else(|err| panic!("a database on the test server: {err}"))
}

/// The URL of a new, empty database, or `None` (skipped) without a server, except under `CI`,
/// where the server must be there.
pub async fn fresh_postgres_database() -> Option<String> {
    testing::fresh_database()
        .await
        .unwrap_or_else(|err| panic!("a database on the test server: {err}"))
}
