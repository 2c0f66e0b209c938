//! The tower `Layer` that wraps a service in [`IdempotentRetry`].

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use tower::layer::util::Stack;

use super::IdempotentRetry;
use super::boxed::BoxResponseBodyLayer;
use super::scope::{SCOPE_HEADER, ScopeRules};
use crate::client::{Client, ClientBuilder};
use crate::engine::settings::Settings;
use crate::outcome::error::Error;

/// Wraps a service in [`IdempotentRetry`]: one key per logical request, the crate's retry
/// rules for every attempt.
///
/// Cloning is cheap: clones share the settings (and a seeded RNG). Build it with
/// [`IdempotentRetryLayer::new`] for the defaults, from a [`ClientBuilder`] with
/// [`ClientBuilder::build_layer`] for any other setting, or from a [`Client`](crate::Client)
/// with [`Client::layer`](crate::Client::layer) to share that client's settings.
///
/// The service is [`IdempotentRetry`], its future [`ResponseFuture`](crate::service::ResponseFuture); its error is the crate's
/// [`Error`](crate::Error), with the last response available through
/// [`Error::take_response_as`](crate::Error::take_response_as) in the inner service's response
/// type, and the [`RetryReport`](crate::RetryReport) in the response's extensions
/// ([`RetryReport::from_extensions`](crate::RetryReport::from_extensions)).
///
/// It follows no redirect: a 3xx is a final answer. Over `reqwest::Client`, build that client
/// with `redirect::Policy::none()`. Where it goes among other layers, and why:
/// `docs/tower.md`.
///
/// # Ledger
///
/// With a [`Ledger`](crate::ledger::Ledger) in the settings, the response body must be one the ledger
/// can rebuild to replay a completed operation ([`RetryResponse::from_saved`](crate::RetryResponse::from_saved)):
/// over a hyper client, use [`box_response_body`](Self::box_response_body). Each row's scope
/// (what [`reconciler_for_scope`](crate::ClientBuilder::reconciler_for_scope) matches) is, first
/// found: the request's [`LedgerScope`](crate::LedgerScope) extension, its
/// [`SCOPE_HEADER`](Self::SCOPE_HEADER), the layer's
/// [`scope_for_path_prefix`](Self::scope_for_path_prefix), its host.
///
/// Default: every setting as the [`ClientBuilder`] has it; no
/// [`scope_for_path_prefix`](Self::scope_for_path_prefix), so a row's scope is its host.
///
/// # Examples
///
/// Over `reqwest::Client`, built to follow no redirect (see above):
///
/// ```
/// use idempotent_retry::{Client, RetryPolicy};
/// use tower::ServiceBuilder;
///
/// let layer = Client::builder()
///     .policy(RetryPolicy::default().with_max_attempts(3))
///     .build_layer()?;
/// let http = reqwest::Client::builder()
///     .redirect(reqwest::redirect::Policy::none())
///     .build()
///     .expect("a client");
/// let service = ServiceBuilder::new().layer(layer).service(http);
/// # drop(service);
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
///
/// Over a hyper client (which follows no redirect), with a per-attempt limit and concurrency
/// limit inside the layer (`examples/tower_stack.rs` runs a full stack against a local
/// receiver):
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use idempotent_retry::{Client, IdempotencyKey};
/// use tower::{BoxError, ServiceBuilder, util::BoxCloneService};
///
/// let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
///     .build_http::<Full<Bytes>>();
/// let layer = Client::builder().build_layer()?;
/// let service: BoxCloneService<_, _, BoxError> = ServiceBuilder::new()
///     .layer(BoxCloneService::layer())
///     .map_err(BoxError::from)
///     .layer(layer)
///     .concurrency_limit(16)
///     .timeout(Duration::from_secs(10))
///     .service(hyper);
///
/// // A key for one request rides in its extensions (or in the key header).
/// let mut request = http::Request::post("https://api.example.com/v1/emails")
///     .body(Full::new(Bytes::from_static(b"{}")))
///     .expect("valid request");
/// request
///     .extensions_mut()
///     .insert(IdempotencyKey::derive("send_email", &["conv_8f2c", "3"]));
/// // service.oneshot(request).await ...
/// # drop((service, request));
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Clone)]
#[must_use]
pub struct IdempotentRetryLayer {
    settings: Arc<Settings>,
    scopes: Arc<ScopeRules>,
}

impl fmt::Debug for IdempotentRetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentRetryLayer")
            .field("settings", &self.settings)
            .field("scopes", &self.scopes)
            .finish()
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
        Self::from_settings(Arc::new(ClientBuilder::new().settings_unchecked()))
    }

    pub(crate) fn from_settings(settings: Arc<Settings>) -> Self {
        IdempotentRetryLayer {
            settings,
            scopes: Arc::default(),
        }
    }

    /// The header a request names its ledger scope in (`Idempotent-Retry-Scope`), for request
    /// types without extensions (`reqwest::Request`). The layer takes it off the request before
    /// the first attempt: it never reaches the wire. It names the scope of the operation's row
    /// in the [`Ledger`](crate::ledger::Ledger) as a [`LedgerScope`](crate::LedgerScope) extension
    /// does, over the layer's [`scope_for_path_prefix`](Self::scope_for_path_prefix).
    ///
    /// # Errors
    ///
    /// The request is refused with [`ErrorKind::Builder`](crate::ErrorKind::Builder), nothing
    /// sent, when the header is set more than once, is not visible ASCII, or names another
    /// scope than the request's `LedgerScope` extension.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::IdempotentRetryLayer;
    ///
    /// let http = reqwest::Client::builder()
    ///     .redirect(reqwest::redirect::Policy::none())
    ///     .build()
    ///     .expect("a client");
    /// let request = http
    ///     .post("https://api.example.com/v1/charges")
    ///     .header(IdempotentRetryLayer::SCOPE_HEADER, "shop.charge")
    ///     .build()
    ///     .expect("a request");
    /// // service.oneshot(request).await: the row's scope is `shop.charge`.
    /// # drop(request);
    /// ```
    pub const SCOPE_HEADER: HeaderName = SCOPE_HEADER;

    /// Names the ledger scope of requests whose path is `prefix` or under it (`/v1/charges`
    /// covers `/v1/charges` and `/v1/charges/ch_1`, not `/v1/chargesx`), on any host, so their
    /// rows match [`reconciler_for_scope`](crate::ClientBuilder::reconciler_for_scope)`(scope)`.
    /// The longest matching prefix wins; a prefix given again takes the new scope; a leading
    /// `/` is implied and a trailing one ignored (`/` covers every path). A request's
    /// [`LedgerScope`](crate::LedgerScope) extension or [`SCOPE_HEADER`](Self::SCOPE_HEADER)
    /// wins over it. The path is [`RetryRequest::path`](crate::RetryRequest::path)'s
    /// (`reqwest::Request` and `http::Request` give it).
    ///
    /// Default: none; a row's scope is its request's host.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::Client;
    /// use idempotent_retry::ledger::MemoryLedger;
    /// use idempotent_retry::reconcile::SendAgain;
    ///
    /// let layer = Client::builder()
    ///     .ledger(MemoryLedger::new())
    ///     .reconciler_for_scope("shop.charge", SendAgain::new())
    ///     .build_layer()?
    ///     .scope_for_path_prefix("/v1/charges", "shop.charge");
    /// # drop(layer);
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn scope_for_path_prefix(
        mut self,
        prefix: impl AsRef<str>,
        scope: impl Into<String>,
    ) -> Self {
        Arc::make_mut(&mut self.scopes).insert(prefix.as_ref(), scope.into());
        self
    }

    /// This layer with a [`BoxResponseBodyLayer`] inside it: the response body of the service
    /// it wraps is boxed as `BoxBody<Bytes, Box<dyn Error + Send + Sync>>`, which a
    /// [`Ledger`](crate::ledger::Ledger) can save and rebuild to replay. Use it over a hyper client,
    /// whose `Incoming` body a ledger cannot rebuild: without it, a keyed request is refused
    /// with [`ErrorKind::Builder`](crate::ErrorKind::Builder). The service's response type is
    /// then `http::Response<BoxBody<Bytes, Box<dyn Error + Send + Sync>>>`.
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http_body_util::Full;
    /// use idempotent_retry::Client;
    /// use idempotent_retry::ledger::MemoryLedger;
    /// use tower::ServiceBuilder;
    ///
    /// let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
    ///     .build_http::<Full<Bytes>>();
    /// let layer = Client::builder().ledger(MemoryLedger::new()).build_layer()?;
    /// let service = ServiceBuilder::new()
    ///     .layer(layer.box_response_body())
    ///     .concurrency_limit(16)
    ///     .service(hyper);
    /// # drop(service);
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn box_response_body(self) -> Stack<BoxResponseBodyLayer, IdempotentRetryLayer> {
        Stack::new(BoxResponseBodyLayer::new(), self)
    }
}

impl<S> tower::Layer<S> for IdempotentRetryLayer {
    type Service = IdempotentRetry<S>;

    fn layer(&self, inner: S) -> IdempotentRetry<S> {
        IdempotentRetry::from_parts(inner, Arc::clone(&self.settings), Arc::clone(&self.scopes))
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
    /// sleeper, RNG, retry budget and [`Ledger`](crate::ledger::Ledger)), for services other than this
    /// client. Operations sent through the layer and through the client are one set: a key
    /// claimed by one is in progress, replayed or refused for the other.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::Client;
    /// use idempotent_retry::ledger::MemoryLedger;
    /// use tower::ServiceBuilder;
    ///
    /// let client = Client::builder().ledger(MemoryLedger::new()).build()?;
    /// let http = reqwest::Client::builder()
    ///     .redirect(reqwest::redirect::Policy::none())
    ///     .build()
    ///     .expect("a client");
    /// let service = ServiceBuilder::new().layer(client.layer()).service(http);
    /// # drop(service);
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn layer(&self) -> IdempotentRetryLayer {
        IdempotentRetryLayer::from_settings(self.front_end_settings())
    }
}
