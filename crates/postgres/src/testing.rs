//! Throwaway databases for the workspace's own PostgreSQL tests (this crate's unit tests and
//! conformance test, the facade's tests through its `postgres` feature): one home for finding
//! the test server and making a database on it, so that every test runs against an empty
//! database of its own and never migrates or fills the server's shared one, which other
//! checkouts of the crate (at other schema versions) may be using. Not part of the documented
//! API, not covered by semver.

use std::collections::hash_map::RandomState;
use std::error::Error as StdError;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::NoTls;

/// What a test database could not be made of.
pub type TestDatabaseError = Box<dyn StdError + Send + Sync + 'static>;

/// The environment variable that names the test server (`.ci/postgres.sh` sets it).
pub const SERVER_URL_VARIABLE: &str = "IDEMPOTENT_RETRY_PG_URL";

/// The test server's URL, from [`SERVER_URL_VARIABLE`]. `None` when it is unset: the test is
/// skipped, and says so on stderr.
///
/// # Panics
///
/// When it is unset and `CI` is set: CI starts the server, so a missing URL is a broken run,
/// not a test to skip.
#[must_use]
pub fn server_url() -> Option<String> {
    match std::env::var(SERVER_URL_VARIABLE) {
        Ok(url) => Some(url),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("{SERVER_URL_VARIABLE} must be set in CI (.ci/run starts PostgreSQL)")
        }
        Err(_) => {
            eprintln!("skipped: {SERVER_URL_VARIABLE} is not set");
            None
        }
    }
}

/// Makes a new, empty database on the server at `base` (a URL ending in `/database`) and
/// returns the same URL naming it instead. Its name (`ir_test_…`) is unique to this call: the
/// process, a counter and 64 random bits.
///
/// # Errors
///
/// When `base` does not end in `/database`, when the server cannot be reached, or when it
/// refuses to create the database.
pub async fn create_database(base: &str) -> Result<String, TestDatabaseError> {
    let Some((prefix, _)) = base.rsplit_once('/') else {
        return Err(format!("the test server's URL {base} does not end in /database").into());
    };
    let (admin, connection) = tokio_postgres::connect(base, NoTls).await?;
    tokio::spawn(connection);
    let name = unique_name();
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    Ok(format!("{prefix}/{name}"))
}

/// [`server_url`], then [`create_database`] on it: the URL of a new, empty database, or `None`
/// when the test is skipped.
///
/// # Errors
///
/// As [`create_database`].
///
/// # Panics
///
/// As [`server_url`].
pub async fn fresh_database() -> Result<Option<String>, TestDatabaseError> {
    match server_url() {
        Some(base) => Ok(Some(create_database(&base).await?)),
        None => Ok(None),
    }
}

/// `ir_test_<process>_<counter>_<random>`: no other call's, in this process or any other, even
/// after a database of an earlier run was left on the server.
fn unique_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Every `RandomState` is seeded with fresh random keys: a random word without a random
    // number crate.
    let random = RandomState::new().hash_one(n);
    format!("ir_test_{}_{n}_{random:016x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_valid_identifiers() {
        let names: Vec<String> = (0..100).map(|_| unique_name()).collect();
        let mut distinct = names.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), names.len());
        for name in &names {
            assert!(
                name.len() <= 63,
                "PostgreSQL truncates longer names: {name}"
            );
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn a_url_without_a_database_is_refused_before_connecting() {
        let err = create_database("postgresql:")
            .await
            .expect_err("no /database");
        assert_eq!(
            err.to_string(),
            "the test server's URL postgresql: does not end in /database"
        );
    }
}
