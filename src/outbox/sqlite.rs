//! Queuing in SQLite: on the caller's own connection to the ledger's file, inside the
//! transaction that writes the caller's rows.

use super::enqueue::not_queued;
use crate::keys::key::IdempotencyKey;
use crate::ledger::outbox::Enqueued;
use crate::outcome::error::Error;
use crate::time::{Clock as _, TokioClock};

pub use idempotent_retry_sqlite::rusqlite;

/// Queues `operation` in the caller's transaction on the ledger's file (a
/// [`rusqlite::Transaction`], which dereferences to the `Connection` taken here), and returns
/// its key with what was found. The caller's own tables live in the same file, so
/// its rows and the operation commit together or not at all.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use idempotent_retry::outbox::{self, Enqueue};
/// use idempotent_retry::outbox::sqlite::rusqlite::Connection;
///
/// let mut conn = Connection::open("orders.sqlite3")?;
/// let tx = conn.transaction()?;
/// tx.execute("INSERT INTO orders (id, amount) VALUES ('ord_42', 1200)", [])?;
/// let (key, _) = outbox::sqlite::enqueue(
///     &tx,
///     &Enqueue::post("https://api.example.com/v1/charges").json(&serde_json::json!({"order": "ord_42"})),
/// )?;
/// tx.commit()?;
/// # let _ = key; Ok(()) }
/// ```
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) for an operation [`Enqueue`] refuses
/// (credentials, a URL that is not absolute); [`ErrorKind::Ledger`](crate::ErrorKind::Ledger)
/// when the key's row is another request's, when the file has no ledger table of the outbox's
/// version (open it once with `SqliteLedger::open`, which migrates it), or when SQLite fails.
/// Nothing is written on an error; the caller's transaction is theirs to roll back or go on.
///
/// [`Enqueue`]: super::Enqueue
pub fn enqueue(
    conn: &rusqlite::Connection,
    operation: &super::Enqueue,
) -> Result<(IdempotencyKey, Enqueued), Error> {
    let (key, row) = operation.operation(TokioClock::new().wall())?;
    let found = idempotent_retry_sqlite::outbox::enqueue(conn, &row)
        .map_err(|source| not_queued(&key, source))?;
    Ok((key, found))
}
