//! `testing` (feature `testing`): the workspace's test receiver
//! (`idempotent_retry_testkit::Receiver`) on the shared runtime, with scripted faults, and a
//! keep-alive server, for the package's own suite and bench.

use std::time::Duration;

use idempotent_retry_host::testing::{self as host, fault};
use idempotent_retry_testkit::Receiver as Inner;
use napi_derive::napi;

use crate::error::to_js;

/// A fault to script on a [`Receiver`]: when it strikes (`request`, or `key` with `attempt`)
/// and its parameters.
#[napi(object)]
#[derive(Debug)]
pub struct FaultOptions {
    /// The `request`th arrival (1 for the first).
    pub request: Option<u32>,
    /// The `attempt`th arrival with this key.
    pub key: Option<String>,
    /// Which arrival with `key` (default 1).
    pub attempt: Option<u32>,
    /// A canned answer's status (default 503).
    pub status: Option<u16>,
    /// How long a slow handler or a stall lasts, in milliseconds.
    pub ms: Option<f64>,
    /// A canned answer's `Retry-After`, in seconds.
    pub retry_after: Option<u32>,
    /// How many bytes of the answer's body `cut_body_after_commit` sends before it closes.
    pub keep_bytes: Option<u32>,
}

/// A loopback HTTP/1.1 receiver that dedupes by idempotency key (Stripe's rules: a completed
/// key replays its answer, a key in progress answers 409, a key with another body 422),
/// counts side effects and fails on script. Stopped when dropped.
#[napi]
#[derive(Debug)]
pub struct Receiver {
    inner: Inner,
}

/// A runtime error with `message`.
fn failure(message: String) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, message)
}

#[napi]
impl Receiver {
    /// Starts a receiver on a free loopback port; `keyHeader` is the header it reads keys
    /// from (default `Idempotency-Key`).
    ///
    /// # Errors
    ///
    /// If no port can be bound.
    #[napi(constructor)]
    pub fn new(key_header: Option<String>) -> napi::Result<Receiver> {
        let runtime = idempotent_retry_host::runtime().map_err(to_js)?;
        let inner = runtime
            .block_on(async {
                let mut builder = Inner::builder();
                if let Some(name) = key_header {
                    builder = builder.key_header(name);
                }
                builder.start().await
            })
            .map_err(|err| failure(format!("cannot start the receiver: {err}")))?;
        Ok(Receiver { inner })
    }

    /// The URL of `path` on this receiver.
    #[napi]
    pub fn url(&self, path: String) -> String {
        self.inner.url(&path)
    }

    /// Scripts the fault named `name` (`reset_before_handler`, `close_without_reply`,
    /// `status`, `slow_handler`, `reset_after_commit`, `stall_after_commit`,
    /// `cut_body_after_commit`).
    ///
    /// # Errors
    ///
    /// `InvalidArg` for an unknown fault, or when neither or both of `request` and `key` are
    /// given.
    #[napi]
    pub fn inject(&self, name: String, options: FaultOptions) -> napi::Result<()> {
        let when = host::when(
            options.request.map(u64::from),
            options.key,
            options.attempt.unwrap_or(1),
        )
        .map_err(to_js)?;
        let fault = fault(
            &name,
            options.status.unwrap_or(503),
            options.ms.unwrap_or(0.0) / 1000.0,
            options.retry_after.map(u64::from),
            options.keep_bytes.unwrap_or(0) as usize,
        )
        .map_err(to_js)?;
        self.inner.inject(when, fault);
        Ok(())
    }

    /// Side effects committed, in all.
    #[napi]
    pub fn effects(&self) -> u32 {
        u32::try_from(self.inner.effects()).unwrap_or(u32::MAX)
    }

    /// Side effects committed under `key`.
    #[napi]
    pub fn effects_for(&self, key: String) -> u32 {
        u32::try_from(self.inner.effects_for(&key)).unwrap_or(u32::MAX)
    }

    /// Requests that arrived, in all.
    #[napi]
    pub fn arrivals(&self) -> u32 {
        u32::try_from(self.inner.arrivals()).unwrap_or(u32::MAX)
    }

    /// The key header of each arrival, in order (`null` for a request without one).
    #[napi]
    pub fn keys(&self) -> Vec<Option<String>> {
        self.inner.keys()
    }

    /// Each arrival, as a line for people (what the receiver did with it).
    #[napi]
    pub fn log(&self) -> Vec<String> {
        host::log_lines(&self.inner)
    }

    /// Waits until `n` requests have arrived or `withinMs` passed; resolves to how many
    /// arrived.
    ///
    /// # Errors
    ///
    /// `InvalidArg` for a duration that is not one.
    #[napi]
    pub async fn wait_for_arrivals(&self, n: u32, within_ms: f64) -> napi::Result<u32> {
        let within = Duration::try_from_secs_f64(within_ms / 1000.0).map_err(|_| {
            napi::Error::new(
                napi::Status::InvalidArg,
                format!("{within_ms} is not a number of milliseconds"),
            )
        })?;
        let arrived = self.inner.wait_for_arrivals(u64::from(n), within).await;
        Ok(u32::try_from(arrived).unwrap_or(u32::MAX))
    }
}

/// A loopback HTTP/1.1 server that keeps connections alive and answers every request `200`
/// with the body `ok`, for measuring a client's own cost. Stopped when dropped.
#[napi]
#[derive(Debug)]
pub struct KeepAliveServer {
    inner: host::KeepAliveServer,
}

#[napi]
impl KeepAliveServer {
    /// Starts the server on a free loopback port.
    ///
    /// # Errors
    ///
    /// If no port can be bound.
    #[napi(constructor)]
    pub fn new() -> napi::Result<KeepAliveServer> {
        Ok(KeepAliveServer {
            inner: host::KeepAliveServer::start().map_err(to_js)?,
        })
    }

    /// The URL of `path` on this server.
    #[napi]
    pub fn url(&self, path: String) -> String {
        self.inner.url(&path)
    }
}
