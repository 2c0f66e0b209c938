//! The tower `Layer` that wraps a service in [`IdempotentRetry`].

use std::fmt;
use std::sync::Arc;

use super::IdempotentRetry;
use crate::client::{Client, ClientBuilder};
use crate::error::Error;
use crate::settings::Settings;

/// Wraps a service in [`IdempotentRetry`]: one key per logical request, the crate's retry
/// rules for every attempt.
///
/// Cloning is cheap: clones share the settings (and a seeded RNG). Build it with
/// [`IdempotentRetryLayer::new`] for the defaults, from a [`ClientBuilder`] with
/// [`ClientBuilder::build_layer`] for any other setting, or from a [`Client`](crate::Client)
/// with [`Client::layer`](crate::Client::layer) to share that client's settings.
///
/// See the crate docs, "Using with tower", for where it goes in a `ServiceBuilder`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use idempotent_retry::{Client, IdempotentRetryLayer, RetryPolicy};
/// use tower::ServiceBuilder;
///
/// let layer = Client::builder()
///     .policy(RetryPolicy::default().with_max_attempts(3))
///     .build_layer()?;
/// let service = ServiceBuilder::new()
///     .layer(layer)
///     .service(reqwest::Client::new());
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotentRetryLayer {
    settings: Arc<Settings>,
}

impl fmt::Debug for IdempotentRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.settings.debug_as("IdempotentRetryLayer", f)
    }
}

impl Default for IdempotentRetryLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl IdempotentRetryLayer {
    /// A layer with every default (see [`ClientBuilder`]'s `# Default` table).
    pub fn new() -> Self {
        IdempotentRetryLayer {
            settings: Arc::new(ClientBuilder::new().settings_unchecked()),
        }
    }

    pub(crate) fn from_settings(settings: Arc<Settings>) -> Self {
        IdempotentRetryLayer { settings }
    }
}

impl<S> tower::Layer<S> for IdempotentRetryLayer {
    type Service = IdempotentRetry<S>;

    fn layer(&self, inner: S) -> IdempotentRetry<S> {
        IdempotentRetry::from_parts(inner, Arc::clone(&self.settings))
    }
}

impl ClientBuilder {
    /// Builds a tower layer with these settings instead of a client. The
    /// [`http`](Self::http) client, if any, is not used: the layer wraps whatever service it is
    /// given.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when a policy is invalid or the
    /// attempt header is the key header.
    pub fn build_layer(self) -> Result<IdempotentRetryLayer, Error> {
        Ok(IdempotentRetryLayer::from_settings(Arc::new(
            self.into_settings()?,
        )))
    }
}

impl Client {
    /// A tower layer sharing this client's settings (policies, key header, observer, clock,
    /// sleeper, RNG, retry budget and [`Ledger`](crate::Ledger)), for services other than this
    /// client. Operations sent through the layer and through the client are one set: a key
    /// claimed by one is in progress, replayed or refused for the other.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{Client, MemoryLedger};
    /// use tower::ServiceBuilder;
    ///
    /// let client = Client::builder().ledger(MemoryLedger::new()).build()?;
    /// let service = ServiceBuilder::new()
    ///     .layer(client.layer())
    ///     .service(reqwest::Client::new());
    /// # drop(service);
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn layer(&self) -> IdempotentRetryLayer {
        IdempotentRetryLayer::from_settings(self.front_end_settings())
    }
}
