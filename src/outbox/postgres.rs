//! Queuing in PostgreSQL: inside the caller's own transaction, announced to listening
//! dispatchers when it commits.

use std::future::poll_fn;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;

use super::enqueue::not_queued;
use crate::keys::key::IdempotencyKey;
use crate::ledger::LedgerError;
use crate::ledger::outbox::Enqueued;
use crate::outcome::error::Error;
use crate::time::{Clock as _, TokioClock};

pub use idempotent_retry_postgres::outbox::QUEUED_CHANNEL;
pub use idempotent_retry_postgres::tokio_postgres;

/// Queues `operation` inside the caller's transaction (a `tokio_postgres::Transaction`, or a
/// `deadpool_postgres::Transaction` as `&*tx`), and returns its key with what was found. Its
/// times are the database's. A rollback leaves nothing; the commit wakes the dispatchers that
/// [`listen`].
///
/// ```no_run
/// # async fn run(client: &mut idempotent_retry::outbox::postgres::tokio_postgres::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use idempotent_retry::outbox::{self, Enqueue};
///
/// let tx = client.transaction().await?;
/// tx.execute("INSERT INTO orders (id, amount) VALUES ('ord_42', 1200)", &[]).await?;
/// let (key, _) = outbox::postgres::enqueue(
///     &tx,
///     &Enqueue::post("https://api.example.com/v1/charges").json(&serde_json::json!({"order": "ord_42"})),
/// )
/// .await?;
/// tx.commit().await?;
/// # let _ = key; Ok(()) }
/// ```
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) for an operation [`Enqueue`] refuses
/// (credentials, a URL that is not absolute); [`ErrorKind::Ledger`](crate::ErrorKind::Ledger)
/// when the key's row is another request's, when the table is missing or older than the
/// outbox (run `PostgresLedger::migrate`), or when the statement fails (PostgreSQL then aborts
/// the transaction).
///
/// [`Enqueue`]: super::Enqueue
pub async fn enqueue(
    client: &impl tokio_postgres::GenericClient,
    operation: &super::Enqueue,
) -> Result<(IdempotencyKey, Enqueued), Error> {
    let (key, row) = operation.operation(TokioClock::new().wall())?;
    let found = idempotent_retry_postgres::outbox::enqueue(client, &row)
        .await
        .map_err(|source| not_queued(&key, source))?;
    Ok((key, found))
}

/// A `LISTEN` on [`QUEUED_CHANNEL`] that wakes a dispatcher at each commit that queued an
/// operation; made by [`listen`] or [`listen_on`]. Dropping it closes its connection.
#[derive(Debug)]
pub struct Listener {
    _client: tokio_postgres::Client,
    driver: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// Whether its connection is still open (a dispatcher falls back to its idle poll when
    /// it is not).
    #[must_use]
    pub fn is_listening(&self) -> bool {
        !self.driver.is_finished()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Listens on a plain-TCP connection to `url` (a `postgresql://` URL) and notifies `waker`
/// ([`Dispatcher::waker`](super::Dispatcher::waker)) at each commit that queued an operation.
/// For TLS, connect yourself and use [`listen_on`].
///
/// # Errors
///
/// [`LedgerErrorKind::Unavailable`](crate::ledger::LedgerErrorKind::Unavailable) when the
/// connection or the `LISTEN` fails.
pub async fn listen(url: &str, waker: Arc<Notify>) -> Result<Listener, LedgerError> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|err| {
            LedgerError::unavailable("cannot connect to listen for queued operations")
                .with_source(err)
        })?;
    listen_on(client, connection, waker).await
}

/// [`listen`] on a connection made by the caller (with TLS, say): drives `connection`,
/// issues the `LISTEN` through `client`, and notifies `waker` at each notification.
///
/// # Errors
///
/// [`LedgerErrorKind::Unavailable`](crate::ledger::LedgerErrorKind::Unavailable) when the
/// `LISTEN` fails.
pub async fn listen_on<S, T>(
    client: tokio_postgres::Client,
    mut connection: tokio_postgres::Connection<S, T>,
    waker: Arc<Notify>,
) -> Result<Listener, LedgerError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let driver = tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => waker.notify_one(),
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, "the outbox's LISTEN connection failed; dispatchers fall back to their idle poll");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {QUEUED_CHANNEL}"))
        .await
        .map_err(|err| {
            LedgerError::unavailable("cannot LISTEN for queued operations").with_source(err)
        })?;
    Ok(Listener {
        _client: client,
        driver,
    })
}
