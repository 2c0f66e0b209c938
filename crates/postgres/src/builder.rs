//! Building a [`PostgresLedger`]: where to connect, over what, with how many connections.

use std::fmt;
#[cfg(feature = "rustls")]
use std::path::PathBuf;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, NoTls, Socket};

use super::{PostgresLedger, failure};
use idempotent_retry_ledger::LedgerError;

/// The pool size when none is set: see [`PostgresLedgerBuilder::pool_size`].
pub(super) const DEFAULT_POOL_SIZE: usize = 16;

/// How long a connection may go without an answer from the server before it is given up, and
/// how long a call waits for a pooled connection to come free.
const SILENT_SERVER: Duration = Duration::from_secs(30);

/// The connect timeout when neither the builder nor the connection string sets one.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Builds a [`PostgresLedger`] with its own pool of connections: from
/// [`PostgresLedger::builder`], then [`url`](Self::url) or [`config`](Self::config), then
/// [`build`](Self::build), which checks the settings and opens the first connection.
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | [`pool_size`](Self::pool_size) | 16 connections |
/// | [`connect_timeout`](Self::connect_timeout) | the connection string's `connect_timeout`, else 10 s |
/// | TLS | none: plain TCP (`NoTls`) |
///
/// Against a server that goes silent, whatever the connection string says otherwise: TCP
/// keepalive probes after 15 s idle, `tcp_user_timeout` 30 s (unacknowledged data closes the
/// connection, on Linux), a wait of at most 30 s for a pooled connection and of the connect
/// timeout to check one handed back. Above them every call is bounded by
/// `LedgerOptions::call_timeout` (in `idempotent-retry`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use idempotent_retry::ledger::PostgresLedger;
///
/// # async fn run() -> Result<(), idempotent_retry::ledger::LedgerError> {
/// let ledger = PostgresLedger::builder()
///     .url("postgresql://app@db.internal/payments")
///     .pool_size(32)
///     .connect_timeout(Duration::from_secs(3))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until build is called"]
pub struct PostgresLedgerBuilder {
    target: Target,
    pool_size: usize,
    connect_timeout: Option<Duration>,
    tls: Tls,
}

/// Where to connect.
#[derive(Debug)]
enum Target {
    None,
    Url(String),
    Config(Box<Config>),
}

/// A pool manager for a connection configuration, made with the TLS connector the caller
/// gave: the connector's type is erased here, so the builder has none.
type MakeManager = Box<dyn FnOnce(Config, ManagerConfig) -> Manager + Send + Sync>;

/// Over what.
enum Tls {
    None,
    Connector(MakeManager),
    #[cfg(feature = "rustls")]
    CaFile(PathBuf),
}

impl fmt::Debug for PostgresLedgerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tls = match &self.tls {
            Tls::None => "none".to_owned(),
            Tls::Connector(_) => "the caller's connector".to_owned(),
            #[cfg(feature = "rustls")]
            Tls::CaFile(path) => format!("rustls trusting {}", path.display()),
        };
        // The connection string or config may hold a password: shown only as set or not.
        let target = match &self.target {
            Target::None => "none",
            Target::Url(_) => "a connection string",
            Target::Config(_) => "a config",
        };
        f.debug_struct("PostgresLedgerBuilder")
            .field("target", &target)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("tls", &tls)
            .finish()
    }
}

impl PostgresLedgerBuilder {
    pub(super) fn new() -> Self {
        PostgresLedgerBuilder {
            target: Target::None,
            pool_size: DEFAULT_POOL_SIZE,
            connect_timeout: None,
            tls: Tls::None,
        }
    }

    /// Connects with a libpq-style connection string (`postgresql://user@host:port/db` or
    /// `host=... user=...`), parsed at [`build`](Self::build). Replaces an earlier
    /// [`config`](Self::config). With TLS, add `sslmode=require`, so that a server that
    /// offers no TLS is refused rather than spoken to in the clear.
    ///
    /// Default: none; `build` needs this or `config`.
    pub fn url(mut self, url: &str) -> Self {
        self.target = Target::Url(url.to_owned());
        self
    }

    /// Connects with a `tokio_postgres::Config` built by the caller. Replaces an earlier
    /// [`url`](Self::url).
    ///
    /// Default: none; `build` needs this or `url`.
    pub fn config(mut self, config: Config) -> Self {
        self.target = Target::Config(Box::new(config));
        self
    }

    /// The most connections the ledger opens. Two of them at a time carry the batches of
    /// claims and finishes (group commit: `docs/postgres.md`); the others serve
    /// take-overs, attempts, reads and the calls of a batch that waited on a lock. Calls
    /// beyond the pool's size queue for the next free connection rather than fail; a pool of
    /// 1 serializes everything.
    ///
    /// Connections are opened as they are needed, not up front. Why 16:
    /// `docs/postgres.md`.
    ///
    /// Default: 16.
    pub const fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// How long opening one connection may take (TCP, TLS and login together) before the call
    /// that needed it fails with
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable).
    ///
    /// Default: the connection string's `connect_timeout`, else 10 seconds.
    pub const fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Connects over TLS with the caller's connector: `tokio_postgres_rustls::MakeRustlsConnect`,
    /// `postgres_native_tls::MakeTlsConnector`, or any other `MakeTlsConnect`. Replaces an
    /// earlier TLS setting.
    ///
    /// Default: no TLS.
    pub fn tls<T>(mut self, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.tls = Tls::Connector(Box::new(move |config, manager| {
            Manager::from_config(config, tls, manager)
        }));
        self
    }

    /// Connects over TLS through rustls (with the aws-lc-rs provider), trusting the
    /// certificate authorities in the PEM file at `path` and no others: the usual shape of a
    /// database signed by a private CA. The file is read at [`build`](Self::build). Replaces
    /// an earlier TLS setting.
    ///
    /// Default: no TLS.
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls = Tls::CaFile(path.into());
        self
    }

    /// Checks the settings, builds the pool and opens its first connection, so that a wrong
    /// address, login or certificate fails here rather than at the first operation. Does not
    /// create the table: call [`migrate`](PostgresLedger::migrate).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](idempotent_retry_ledger::LedgerErrorKind::InvalidInput) for a
    /// malformed connection string, none given, a pool size of 0, a connection string that
    /// requires TLS (`sslmode=require`) without a TLS setting, or (`tls_ca_file`) a CA file
    /// that cannot be read or holds no certificate;
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the server
    /// cannot be reached in time, refuses the login, or presents a certificate that is not
    /// trusted.
    pub async fn build(self) -> Result<PostgresLedger, LedgerError> {
        let mut config = match self.target {
            Target::Url(url) => url.parse::<Config>().map_err(|err| {
                LedgerError::invalid("malformed PostgreSQL connection string").with_source(err)
            })?,
            Target::Config(config) => *config,
            Target::None => {
                return Err(LedgerError::invalid(
                    "no PostgreSQL connection string or config given",
                ));
            }
        };
        if self.pool_size == 0 {
            return Err(LedgerError::invalid(
                "a PostgreSQL ledger needs a pool of at least one connection",
            ));
        }
        let timeout = self
            .connect_timeout
            .or_else(|| config.get_connect_timeout().copied())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        config.connect_timeout(timeout);
        // A server that goes silent (frozen, partitioned, its host gone) is noticed by the
        // connection, not only by the call timeout above it: keepalive probes after 15 s idle,
        // and data unacknowledged for 30 s closes the socket (Linux), so the pool replaces it.
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(SILENT_SERVER);
        }
        if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
            config.keepalives_idle(Duration::from_secs(15));
        }
        // Fast: a connection is checked for being closed when it is handed out, without a
        // round trip. One the server dropped fails the statement that finds out, and the pool
        // replaces it.
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match self.tls {
            Tls::None => {
                if config.get_ssl_mode() == SslMode::Require {
                    return Err(LedgerError::invalid(
                        "the connection string requires TLS (sslmode=require) but the ledger \
                         was given no TLS setting",
                    ));
                }
                Manager::from_config(config, NoTls, manager_config)
            }
            Tls::Connector(make) => make(config, manager_config),
            #[cfg(feature = "rustls")]
            Tls::CaFile(path) => {
                Manager::from_config(config, super::tls::trusting(&path)?, manager_config)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(timeout))
            // Waiting for a connection to come free, and checking one handed back, are waits
            // on the database too.
            .wait_timeout(Some(SILENT_SERVER))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|err| {
                LedgerError::invalid("cannot build the connection pool").with_source(err)
            })?;
        drop(pool.get().await.map_err(failure::pool)?);
        Ok(PostgresLedger::from_pool(pool))
    }
}
