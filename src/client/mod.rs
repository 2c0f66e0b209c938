//! The reqwest front end: [`Client`] (a `reqwest::Client` plus the shared settings) and its
//! [`ClientBuilder`], which also builds the tower layer and the middleware. Its requests
//! (`request.rs`, or a `reqwest::Request` given to [`Client::execute`], with the options it
//! carries, `carried.rs`) run through the engine's pipeline with the reqwest transport
//! (`transport.rs`), which follows redirects by the client's own rules (`redirect/`).
//! Multipart forms that know whether they can be sent again are in `multipart.rs`.
//!
//! May import: time, keys, rules, message, outcome, decision, telemetry, ledger, engine.

mod carried;
mod copy;
#[cfg(feature = "multipart")]
pub mod multipart;
mod redirect;
mod request;
mod shared;
mod transport;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use http::{HeaderName, Method};
use rand::SeedableRng;
use rand::rngs::StdRng;
use reqwest::IntoUrl;

use crate::decision::budget::RetryBudget;
use crate::decision::policy::RetryPolicy;
use crate::engine::settings::{Jitter, Settings};
use crate::ledger::reconcile::{
    Context as ReconcileContext, Reconciled, Reconciler, Reconcilers, SweepReport,
};
use crate::ledger::{Bounded, Ledger, LedgerError, LedgerHandle, LedgerOptions};
use crate::outcome::error::Error;
use crate::outcome::observe::{
    AttemptEvent, Chain, Observer, OnAttempt, OnOperation, OperationEvent,
};
use crate::time::{Clock, Sleeper, TokioClock, TokioSleeper};

use copy::Copies;
#[cfg(any(feature = "tower", feature = "middleware"))]
pub(crate) use redirect::warn_if_inner_redirected;
pub use redirect::{RedirectChain, RedirectHop, RedirectPolicy, RedirectStop};
pub use request::RequestBuilder;
use shared::ClientRef;

/// The default idempotency key header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A retrying HTTP client that sends one idempotency key per logical operation.
///
/// Cloning is cheap and clones share the connection pool, the policy, the RNG and the retry
/// budget.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), idempotent_retry::Error> {
/// use idempotent_retry::{Client, IdempotencyKey};
///
/// let client = Client::new();
/// let key = IdempotencyKey::derive("agent.send_email", &["conv_42", "7"]);
/// let response = client
///     .post("https://api.example.com/v1/emails")
///     .idempotency_key(key)
///     .json(&serde_json::json!({"to": "a@example.com"}))
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) inner: Arc<ClientRef>,
}

impl Client {
    /// A client with every default: the default policy, the `Idempotency-Key` header, and an
    /// inner `reqwest::Client` with reqwest's defaults except that it follows no redirect
    /// itself, so the client's [`RedirectPolicy`] decides every hop and where the key goes.
    ///
    /// To send through a `reqwest::Client` of your own (TLS, proxies, pools), or to change any
    /// setting, use [`Client::builder()`].
    ///
    /// # Panics
    ///
    /// As `reqwest::Client::new()` does, when the inner client cannot be built: the TLS back
    /// end cannot be initialised, or the system's resolver configuration cannot be loaded.
    /// [`Client::builder()`]`.build()` returns that failure as an error instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{Client, RedirectPolicy};
    ///
    /// let client = Client::new();
    /// assert_eq!(client.redirects(), &RedirectPolicy::default());
    /// ```
    #[must_use]
    pub fn new() -> Client {
        Client::builder()
            .build()
            .expect("the default client builds unless its TLS back end cannot be initialised")
    }

    /// A builder to configure the policy, key header and time sources.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::new()
    }

    fn from_settings(
        settings: Settings,
        http: reqwest::Client,
        redirects: RedirectPolicy,
    ) -> Client {
        Client {
            inner: Arc::new(ClientRef {
                http,
                settings: Arc::new(settings),
                redirects,
            }),
        }
    }

    /// The redirects the client follows, and where the key may go.
    pub fn redirects(&self) -> &RedirectPolicy {
        &self.inner.redirects
    }

    /// The client-wide policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.inner.settings.policy
    }

    /// The header the key travels in.
    #[must_use]
    pub fn key_header(&self) -> &HeaderName {
        &self.inner.settings.key_header
    }

    /// The retry budget shared by this client's clones, unless it was turned off. Read its
    /// [`available`](RetryBudget::available) tokens to watch how close the client is to
    /// refusing retries.
    #[must_use]
    pub fn retry_budget(&self) -> Option<&RetryBudget> {
        self.inner.settings.budget.as_ref()
    }

    /// The client's ledger, if it has one.
    #[must_use]
    pub fn ledger(&self) -> Option<&dyn Ledger> {
        self.inner
            .settings
            .ledger
            .as_ref()
            .map(|handle| &*handle.ledger)
    }

    /// Waits until every lease that an abandoned operation (a `send` future dropped before its
    /// outcome was written) gives back has been written to the ledger, for at most `limit`:
    /// call it before a process exits after cancelling its operations, so the next run of those
    /// keys goes ahead at once instead of waiting for the leases to lapse. Returns `true` when
    /// none is left in flight (at once without a ledger), `false` when `limit` passed first
    /// (those leases then lapse on their own, as after a crash).
    pub async fn wait_for_releases(&self, limit: std::time::Duration) -> bool {
        match &self.inner.settings.ledger {
            Some(handle) => handle.releases.all_settled(limit).await,
            None => true,
        }
    }

    /// Deletes the ledger's expired rows (`expires_at` before the client's wall clock), in
    /// batches of at most `limit` rows, until none remain; returns how many were deleted, 0
    /// without a ledger. Run it from a periodic job, off-peak.
    ///
    /// # Errors
    ///
    /// The [`LedgerError`]: [`LedgerErrorKind::InvalidInput`](crate::ledger::LedgerErrorKind::InvalidInput)
    /// for a `limit` of 0, or the storage failure (batches already deleted stay deleted).
    pub async fn purge_expired(&self, limit: u32) -> Result<u64, LedgerError> {
        let settings = &self.inner.settings;
        let Some(handle) = &settings.ledger else {
            return Ok(0);
        };
        handle
            .ledger
            .purge_expired(settings.clock.wall(), limit)
            .await
    }

    /// What reconciling needs of the client's settings, with its ledger.
    fn reconcile_context(&self) -> Result<ReconcileContext<'_>, LedgerError> {
        let settings = &self.inner.settings;
        let handle = settings.ledger.as_ref().ok_or_else(|| {
            LedgerError::new(
                crate::ledger::LedgerErrorKind::InvalidInput,
                "this client has no ledger to reconcile (see ClientBuilder::ledger)",
            )
        })?;
        Ok(ReconcileContext {
            ledger: &*handle.ledger,
            options: &handle.options,
            reconcilers: &handle.reconcilers,
            clock: &*settings.clock,
            attempt_timeout: settings.policy.attempt_timeout(),
            window: settings.policy.reconcile_window(),
        })
    }

    /// Reconciles the operation with `key` now: if its row is unresolved (unknown, or in
    /// flight under a lease that lapsed) and not held, holds it under a lease as a run would,
    /// asks the [`Reconciler`] of its scope, records the answer (with who and when) and
    /// releases it. Inside the reconcile window this is rarely needed: the next run with the
    /// key is the reconcile (the receiver replays).
    ///
    /// The hold lasts the client policy's attempt timeout plus the
    /// [`lease`](LedgerOptions::lease).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](crate::ledger::LedgerErrorKind::InvalidInput) when the client
    /// has no ledger; the ledger's error otherwise
    /// ([`LeaseLost`](crate::ledger::LedgerErrorKind::LeaseLost) when the reconciler answered after
    /// the hold lapsed: nothing was recorded).
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::Client;
    /// use idempotent_retry::ledger::MemoryLedger;
    /// use idempotent_retry::reconcile::{Reconciled, SendAgain};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = Client::builder()
    ///     .ledger(MemoryLedger::new())
    ///     .reconciler(SendAgain::new())
    ///     .build()?;
    /// assert_eq!(client.reconcile("order-17").await?, Reconciled::Missing);
    /// # Ok(()) }
    /// ```
    pub async fn reconcile(&self, key: &str) -> Result<Reconciled, LedgerError> {
        crate::ledger::reconcile::reconcile(self.reconcile_context()?, key).await
    }

    /// One batch of a sweep of unresolved operations: at most `limit` rows whose reconcile
    /// window (the client policy's) has ended and whose outcome is still unknown (or whose run
    /// died in flight), oldest first, each reconciled as [`reconcile`](Self::reconcile) does,
    /// under its own hold, so sweepers on several workers never ask about one key at once.
    /// Returns the counts by outcome; call it again (from a periodic job) for the next batch.
    ///
    /// # Errors
    ///
    /// As [`reconcile`](Self::reconcile), and [`LedgerErrorKind::InvalidInput`](crate::ledger::LedgerErrorKind::InvalidInput)
    /// for a `limit` of 0, when the rows cannot be listed. A failure on one row is counted in
    /// [`SweepReport::failed`] and the sweep goes on.
    pub async fn reconcile_unresolved(&self, limit: u32) -> Result<SweepReport, LedgerError> {
        let cx = self.reconcile_context()?;
        let older_than = crate::rules::window::cutoff(cx.clock.wall(), cx.window);
        // The rows' times are the ledger's: the cutoff on its clock.
        let older_than = match &self.inner.settings.ledger {
            Some(handle) => handle
                .clock_offset
                .current(cx.ledger, cx.clock)
                .await
                .to_ledger(older_than),
            None => older_than,
        };
        crate::ledger::reconcile::sweep(cx, limit, older_than).await
    }

    /// Runs a `reqwest::Request` as one logical operation, by the same rules as
    /// [`RequestBuilder::send`]: `client.execute(builder.build()?)` runs exactly as
    /// `builder.send()`.
    ///
    /// - The key: a key header (`Idempotency-Key`, or the client's
    ///   [`key_header`](ClientBuilder::key_header)) already on the request is the operation's
    ///   key, checked as `send` checks it; else an [`IdempotencyKey`](crate::IdempotencyKey) in
    ///   its extensions; else a random key for a non-idempotent method, unless the client's
    ///   [`auto_keys`](ClientBuilder::auto_keys) are off or the request carries
    ///   [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey).
    /// - A [`RetryPolicy`] or [`LedgerScope`](crate::LedgerScope) in its extensions applies to
    ///   this operation only.
    /// - The request's own `timeout()` is the timeout of each attempt, as
    ///   [`RequestBuilder::timeout`] sets it.
    ///
    /// A `reqwest::Request` has no public extensions: they come from
    /// [`RequestBuilder::build`], or from an `http::Request` converted with
    /// `reqwest::Request::try_from`.
    ///
    /// The returned future owns what it needs (a clone of the client's shared state), as
    /// `reqwest::Client::execute`'s does.
    ///
    /// # Errors
    ///
    /// As [`RequestBuilder::send`], and [`ErrorKind::Builder`](crate::ErrorKind::Builder) for a
    /// URL that cannot be an `http::Uri` (which reqwest could not send either).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), idempotent_retry::Error> {
    /// use idempotent_retry::{Client, LedgerScope};
    ///
    /// let client = Client::new();
    /// let mut request = http::Request::post("https://api.example.com/v1/charges")
    ///     .header("Idempotency-Key", "order-1187-charge")
    ///     .body(r#"{"amount":1200}"#)
    ///     .expect("a valid request");
    /// request.extensions_mut().insert(LedgerScope::new("payments.charge"));
    /// let request = reqwest::Request::try_from(request).expect("an absolute URL");
    /// let response = client.execute(request).await?;
    /// # Ok(()) }
    /// ```
    pub fn execute(
        &self,
        request: reqwest::Request,
    ) -> impl Future<Output = Result<reqwest::Response, Error>> + Send + use<> {
        let client = Arc::clone(&self.inner);
        async move {
            let (request, overrides) = carried::carried(request)?;
            transport::execute(&client, request, overrides, Copies::Reqwest, &[]).await
        }
    }

    /// Starts a `GET` request. Retried without a key; a key is sent only if given.
    pub fn get<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::GET, url)
    }

    /// Starts a `POST` request. Gets a random key unless one is given (or automatic keys are
    /// off).
    pub fn post<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::POST, url)
    }

    /// Starts a `PUT` request. Retried without a key; a key is sent only if given.
    pub fn put<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PUT, url)
    }

    /// Starts a `PATCH` request. Gets a random key unless one is given (or automatic keys are
    /// off).
    pub fn patch<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::PATCH, url)
    }

    /// Starts a `DELETE` request. Retried without a key; a key is sent only if given.
    pub fn delete<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::DELETE, url)
    }

    /// Starts a `HEAD` request.
    pub fn head<U: IntoUrl>(&self, url: U) -> RequestBuilder {
        self.request(Method::HEAD, url)
    }

    /// Starts a request with any method. Methods that are not idempotent by definition
    /// (everything but `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE`, `TRACE`) get a random key
    /// unless one is given.
    pub fn request<U: IntoUrl>(&self, method: Method, url: U) -> RequestBuilder {
        RequestBuilder::new(
            Arc::clone(&self.inner),
            self.inner.http.request(method, url),
        )
    }
}

impl Default for Client {
    /// [`Client::new()`], and like it panics when the TLS back end cannot be initialised.
    fn default() -> Self {
        Client::new()
    }
}

#[cfg(any(feature = "tower", feature = "middleware"))]
impl Client {
    /// This client's settings, for a tower layer or a middleware to share (its ledger
    /// included).
    pub(crate) fn front_end_settings(&self) -> Arc<Settings> {
        Arc::clone(&self.inner.settings)
    }
}

/// Configures a [`Client`].
///
/// # Default
///
/// The defaults that shape behaviour are listed, with their reasons, in the crate's
/// [defaults table](crate#defaults); each setter's docs end with its own default.
#[must_use]
pub struct ClientBuilder {
    http: Option<reqwest::Client>,
    policy: RetryPolicy,
    key_header: HeaderName,
    auto_keys: bool,
    clock: Arc<dyn Clock>,
    sleeper: Arc<dyn Sleeper>,
    rng_seed: Option<u64>,
    host_policies: HashMap<String, RetryPolicy>,
    observer: Option<Arc<dyn Observer>>,
    attempt_header: Option<HeaderName>,
    budget: Option<RetryBudget>,
    ledger: Option<Arc<dyn Ledger>>,
    ledger_options: LedgerOptions,
    reconcilers: Reconcilers,
    redirects: RedirectPolicy,
    key_in_spans: bool,
    answer_read_limit: usize,
}

/// One mebibyte: an API's JSON answer is a few kilobytes, and this bounds what one operation
/// holds in memory while streaming stays the rule for downloads and event streams.
const DEFAULT_ANSWER_READ_LIMIT: usize = 1024 * 1024;

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("policy", &self.policy)
            .field("key_header", &self.key_header)
            .field("auto_keys", &self.auto_keys)
            .field("rng_seed", &self.rng_seed)
            .field("host_policies", &self.host_policies)
            .field("observer", &self.observer)
            .field("attempt_header", &self.attempt_header)
            .field("budget", &self.budget)
            .field("ledger", &self.ledger)
            .field("reconcilers", &self.reconcilers)
            .field("redirects", &self.redirects)
            .field("key_in_spans", &self.key_in_spans)
            .field("answer_read_limit", &self.answer_read_limit)
            .finish_non_exhaustive()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ClientBuilder {
    /// A builder with every default.
    pub fn new() -> Self {
        ClientBuilder {
            http: None,
            policy: RetryPolicy::default(),
            key_header: IDEMPOTENCY_KEY,
            auto_keys: true,
            clock: Arc::new(TokioClock),
            sleeper: Arc::new(TokioSleeper),
            rng_seed: None,
            host_policies: HashMap::new(),
            observer: None,
            attempt_header: None,
            budget: Some(RetryBudget::new()),
            ledger: None,
            ledger_options: LedgerOptions::new(),
            reconcilers: Reconcilers::default(),
            redirects: RedirectPolicy::default(),
            key_in_spans: false,
            answer_read_limit: DEFAULT_ANSWER_READ_LIMIT,
        }
    }

    /// The `reqwest::Client` that sends each attempt. Configure TLS, proxies and pools there;
    /// leave its own retries at reqwest's default (HTTP/2 refusals only) or turn them off with
    /// `reqwest::retry::never()`, so retries are not stacked.
    ///
    /// **Build it with `.redirect(reqwest::redirect::Policy::none())`.** The crate follows
    /// redirects itself, by the [`redirects`](Self::redirects) policy, so the key never goes
    /// to another origin unless allowed and never rides on a 303's `GET`. A client that follows
    /// redirects itself (reqwest's default: up to 10, every header but credentials on every
    /// hop, to any origin) does so before this crate sees the 3xx. When that happens the
    /// crate logs a `warn` event with the key and both origins and sets
    /// [`RedirectChain::inner_client_redirected`](crate::redirect::RedirectChain::inner_client_redirected)
    /// on the response; it cannot undo where the key went.
    ///
    /// Default: a client with reqwest's defaults and `redirect::Policy::none()`, built by
    /// [`build`](Self::build): the one [`Client::new()`] has.
    pub fn http(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// The retry policy for every request, unless a request sets its own.
    ///
    /// Default: [`RetryPolicy::default()`].
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The header the key travels in, for providers that name it differently (for example
    /// `PayPal-Request-Id`).
    ///
    /// Default: `Idempotency-Key`.
    pub fn key_header(mut self, header: HeaderName) -> Self {
        self.key_header = header;
        self
    }

    /// Whether requests with a non-idempotent method (`POST`, `PATCH`, ...) get a random key
    /// when none is given. With `false`, such a request is retried only when no attempt can
    /// have reached the server (connect and DNS failures).
    ///
    /// Default: `true`.
    pub fn auto_keys(mut self, enabled: bool) -> Self {
        self.auto_keys = enabled;
        self
    }

    /// The clock that measures the reconcile window and dates `Retry-After`.
    ///
    /// Default: [`TokioClock`].
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// What waits between attempts.
    ///
    /// Default: [`TokioSleeper`].
    pub fn sleeper(mut self, sleeper: impl Sleeper) -> Self {
        self.sleeper = Arc::new(sleeper);
        self
    }

    /// Seeds the jitter RNG, shared by all clones, so the sequence of delays is reproducible.
    ///
    /// Default: none; the thread-local RNG seeded by the operating system.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.rng_seed = Some(seed);
        self
    }

    /// The policy for requests to `host` (matched case-insensitively against the URL's host,
    /// without the port), unless a request sets its own. Precedence: the request's policy,
    /// then its host's, then the client's [`policy`](Self::policy). Use it to match each
    /// provider's key retention: a short window for one that keeps keys 24 h, a long one for
    /// one that keeps them 30 days.
    ///
    /// Default: none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use idempotent_retry::{Client, RetryPolicy};
    ///
    /// let client = Client::builder()
    ///     .policy_for_host("api.stripe.com", RetryPolicy::default()) // 24 h window
    ///     .policy_for_host(
    ///         "api.example-bank.com",
    ///         RetryPolicy::default().with_reconcile_window(Duration::from_secs(29 * 24 * 3600)),
    ///     )
    ///     .build()?;
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn policy_for_host(mut self, host: impl Into<String>, policy: RetryPolicy) -> Self {
        self.host_policies
            .insert(host.into().to_ascii_lowercase(), policy);
        self
    }

    /// Receives an event per attempt and per operation, for metrics. For a single callback,
    /// [`on_attempt`](Self::on_attempt) and [`on_operation`](Self::on_operation) take a
    /// closure.
    ///
    /// Observers add up: every one given (with this method or the closure forms) is called,
    /// in the order they were given.
    ///
    /// Default: none.
    pub fn observer(mut self, observer: impl Observer) -> Self {
        let added: Arc<dyn Observer> = Arc::new(observer);
        self.observer = Some(match self.observer.take() {
            Some(earlier) => Arc::new(Chain(earlier, added)),
            None => added,
        });
        self
    }

    /// Sends the attempt number (1, 2, ...) in this header on every attempt, so the receiver
    /// can tell a retry from a first try. The key header is unaffected: it is the same on every
    /// attempt.
    ///
    /// Default: none (no header).
    pub fn attempt_header(mut self, header: HeaderName) -> Self {
        self.attempt_header = Some(header);
        self
    }

    /// Whether the operation's `idempotent_request` span carries the key, as the attribute
    /// `idempotent_retry.idempotency_key` ([traces](crate#traces)). Off unless asked for: a
    /// derived key can reveal what it was derived from (a plain SHA-256 of guessable inputs,
    /// see [`DerivationSecret`](crate::DerivationSecret)), and every trace backend that
    /// receives the span keeps it. Turn it on to find an operation's trace by its key. The
    /// `warn` and `error` events that end a failed operation name the key either way.
    ///
    /// Default: off.
    pub fn key_in_spans(mut self, enabled: bool) -> Self {
        self.key_in_spans = enabled;
        self
    }

    /// Reads an answer's body inside its attempt when its `Content-Length` is at most `bytes`,
    /// so that a body cut midway (a reset, a proxy that drops the connection after the
    /// headers) is a failed attempt, retried with the same key under the usual rules, instead
    /// of an `Ok` whose body then fails to read. The body is read within the attempt's
    /// timeout; `bytes()`, `text()` and `json()` then cost nothing more. An answer without a
    /// length (chunked, server-sent events) or longer than this is streamed as it arrives;
    /// when such a body fails midway, its error names the key and how to have the answer sent
    /// again (`docs/sending.md`).
    ///
    /// Any value is accepted: 0 reads only empty bodies inside the operation.
    ///
    /// Default: 1 MiB.
    pub fn answer_read_limit(mut self, bytes: usize) -> Self {
        self.answer_read_limit = bytes;
        self
    }

    /// Which redirects the [`Client`] follows and where the key may go: see
    /// [`RedirectPolicy`]. Only the `Client` follows redirects; the tower and middleware front
    /// ends built from this builder pass every 3xx through.
    ///
    /// Default: [`RedirectPolicy::default()`] (up to 10 hops; the key to the original
    /// request's origin only).
    pub fn redirects(mut self, policy: RedirectPolicy) -> Self {
        self.redirects = policy;
        self
    }

    /// Checks every policy.
    fn validate(&self) -> Result<(), Error> {
        self.policy.validate()?;
        self.redirects.validate()?;
        for (host, policy) in &self.host_policies {
            policy
                .validate()
                .map_err(|err| Error::builder(format!("policy for host {host}: {err}")))?;
        }
        if self.attempt_header.as_ref() == Some(&self.key_header) {
            return Err(Error::builder(
                "the attempt header and the key header must differ",
            ));
        }
        let keys = &self.ledger_options.seal_keys;
        if let Some((at, key)) = keys
            .iter()
            .enumerate()
            .find(|(at, key)| keys[..*at].iter().any(|earlier| earlier.id() == key.id()))
        {
            return Err(Error::builder(format!(
                "seal keys: the id {:?} is given twice (keys {} and {} of the list): the rows \
                 sealed under it would open with one of the two only; give each key an id of \
                 its own",
                key.id(),
                keys.iter()
                    .position(|earlier| earlier.id() == key.id())
                    .unwrap_or(0)
                    + 1,
                at + 1
            )));
        }
        Ok(())
    }

    /// A durable record of operations, consulted before the first attempt of every keyed
    /// request and written after each attempt and at the end: the reconcile window then spans
    /// restarts, a finished operation is replayed instead of sent, and two workers sharing the
    /// ledger never send one key at the same time. See [`Ledger`] for what is recorded.
    ///
    /// Every front end built from this builder uses it the same way: the [`Client`], the
    /// tower layer ([`build_layer`](Self::build_layer)) and the `reqwest-middleware` middleware
    /// ([`build_middleware`](Self::build_middleware)), and those taken from a client
    /// (`Client::layer`, `Client::middleware`) share its ledger. The claim fingerprints the
    /// request's buffered body and a replay rebuilds the front end's own response type; a
    /// request or response type that cannot be (a streamed body, hyper's `Incoming`) is refused
    /// with [`ErrorKind::Builder`](crate::ErrorKind::Builder) before anything is claimed or
    /// sent (see [`RetryRequest::fingerprint`](crate::RetryRequest::fingerprint) and
    /// [`RetryResponse::from_saved`](crate::RetryResponse::from_saved)).
    ///
    /// Default: none.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{Client, IdempotencyKey, RetryReport};
    /// use idempotent_retry::ledger::MemoryLedger;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let receiver = idempotent_retry_testkit::Receiver::start().await?;
    /// # let url = receiver.url("/v1/charges");
    /// let client = Client::builder()
    /// #   .http(idempotent_retry_testkit::loopback_http()?)
    ///     .ledger(MemoryLedger::new())
    ///     .build()?;
    /// let key = IdempotencyKey::derive("billing.charge", &["order-17"]);
    /// let charge = serde_json::json!({"amount": 1200, "currency": "eur"});
    /// for run in 0..2 {
    ///     let response = client
    ///         .post(&url)
    ///         .idempotency_key(key.clone())
    ///         .ledger_scope("billing.charge")
    ///         .json(&charge)
    ///         .send()
    ///         .await?;
    ///     assert!(response.status().is_success());
    ///     // The second run is answered from the ledger: nothing is sent.
    ///     let replayed = RetryReport::of(&response).is_some_and(RetryReport::is_replayed);
    ///     assert_eq!(replayed, run == 1);
    /// }
    /// # assert_eq!(receiver.arrivals(), 1);
    /// # Ok(()) }
    /// ```
    pub fn ledger(mut self, ledger: impl Ledger) -> Self {
        self.ledger = Some(Arc::new(ledger));
        self
    }

    /// How the ledger is used: retention, leases, saved responses, concurrent runs.
    ///
    /// Default: [`LedgerOptions::default()`].
    pub fn ledger_options(mut self, options: LedgerOptions) -> Self {
        self.ledger_options = options;
        self
    }

    /// Who is asked what happened to an operation whose outcome is unknown, for every scope
    /// without a reconciler of its own ([`reconciler_for_scope`](Self::reconciler_for_scope)):
    /// a run that finds its row unresolved after the reconcile window asks it before
    /// answering [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow), and
    /// [`Client::reconcile`] and [`Client::reconcile_unresolved`] ask it on demand. See
    /// [`Reconciler`]; it needs a [`ledger`](Self::ledger).
    ///
    /// Default: none.
    pub fn reconciler(mut self, reconciler: impl Reconciler) -> Self {
        self.reconcilers.default = Some(Arc::new(reconciler));
        self
    }

    /// The [`Reconciler`] for operations of `scope` (the request's
    /// [`ledger_scope`](crate::RequestBuilder::ledger_scope), by default its host), over the
    /// client's [`reconciler`](Self::reconciler).
    ///
    /// Default: none.
    pub fn reconciler_for_scope(
        mut self,
        scope: impl Into<String>,
        reconciler: impl Reconciler,
    ) -> Self {
        self.reconcilers
            .by_scope
            .insert(scope.into(), Arc::new(reconciler));
        self
    }

    /// The engine's settings: everything but the reqwest client.
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), for an invalid policy.
    #[cfg(any(feature = "tower", feature = "middleware"))]
    pub(crate) fn into_settings(self) -> Result<Settings, Error> {
        self.validate()?;
        Ok(self.settings_unchecked())
    }

    /// Calls `f` after every attempt, with the same [`AttemptEvent`] an [`Observer`] gets: the
    /// closure form of [`Observer::on_attempt`]. It runs inside the retry loop, so it must be
    /// quick and must not block.
    ///
    /// Observers add up: `f` is called along with every other observer and callback given to
    /// this builder, in the order they were given. The client, the tower layer and the
    /// middleware built from this builder all call it.
    ///
    /// Default: none.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::time::Duration;
    /// use idempotent_retry::{Client, RetryPolicy};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let retries = Arc::new(AtomicU32::new(0));
    /// let unknown = Arc::new(AtomicU32::new(0));
    /// let (r, u) = (Arc::clone(&retries), Arc::clone(&unknown));
    /// let client = Client::builder()
    ///     .policy(RetryPolicy::default().with_max_attempts(3).with_base_delay(Duration::from_millis(1)))
    ///     .on_attempt(move |event| {
    ///         if event.delay.is_some() {
    ///             r.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     })
    ///     .on_operation(move |event| {
    ///         if event.outcome_unknown {
    ///             u.fetch_add(1, Ordering::Relaxed);
    ///         }
    ///     })
    ///     .build()?;
    ///
    /// // Nothing listens on this port: every attempt is refused, so nothing can have run.
    /// let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    /// let err = client
    ///     .post(format!("http://127.0.0.1:{port}/"))
    ///     .send()
    ///     .await
    ///     .expect_err("connection refused");
    /// assert_eq!(err.attempts(), 3);
    /// assert_eq!(retries.load(Ordering::Relaxed), 2);
    /// assert_eq!(unknown.load(Ordering::Relaxed), 0);
    /// # Ok(()) }
    /// ```
    pub fn on_attempt<F>(self, f: F) -> Self
    where
        F: Fn(&AttemptEvent<'_>) + Send + Sync + 'static,
    {
        self.observer(OnAttempt(f))
    }

    /// Calls `f` once at the end of every operation, with the same [`OperationEvent`] an
    /// [`Observer`] gets: the closure form of [`Observer::on_operation`]. Quick and
    /// non-blocking, as for [`on_attempt`](Self::on_attempt), whose example shows both.
    ///
    /// Observers add up, as for [`on_attempt`](Self::on_attempt).
    ///
    /// Default: none.
    pub fn on_operation<F>(self, f: F) -> Self
    where
        F: Fn(&OperationEvent<'_>) + Send + Sync + 'static,
    {
        self.observer(OnOperation(f))
    }

    pub(crate) fn settings_unchecked(self) -> Settings {
        crate::telemetry::metrics::describe();
        let limit = self.ledger_options.call_timeout;
        Settings {
            policy: self.policy,
            host_policies: self.host_policies,
            observer: self.observer,
            attempt_header: self.attempt_header,
            budget: self.budget,
            key_header: self.key_header,
            auto_keys: self.auto_keys,
            clock: self.clock,
            sleeper: self.sleeper,
            rng: match self.rng_seed {
                Some(seed) => Jitter::Seeded(Box::new(Mutex::new(StdRng::seed_from_u64(seed)))),
                None => Jitter::Thread,
            },
            ledger: self.ledger.map(|inner| LedgerHandle {
                ledger: Arc::new(Bounded { inner, limit }),
                options: Arc::new(self.ledger_options),
                reconcilers: Arc::new(self.reconcilers),
                releases: Arc::default(),
                clock_offset: Arc::default(),
            }),
            key_in_spans: self.key_in_spans,
            answer_read_limit: self.answer_read_limit,
        }
    }

    /// The retry budget: a token bucket that admits every retry of every clone of the client
    /// and is charged for those that fail, so retries cannot multiply the load on a failing
    /// service (see [`RetryBudget`] for how it tells a blip from an outage). A retry it refuses
    /// ends the operation with [`ErrorKind::BudgetExhausted`](crate::ErrorKind::BudgetExhausted).
    /// Pass clones of one [`RetryBudget`] to several builders to share it between clients.
    /// A tower layer or middleware built from this builder gets the budget too, shared by its
    /// clones.
    ///
    /// Default: a new [`RetryBudget::new()`] for each client built (its numbers: the crate's
    /// [defaults table](crate#defaults)).
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry::{Client, RetryBudget, RetryBudgetConfig};
    ///
    /// let budget = RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(100))?;
    /// let payments = Client::builder().retry_budget(budget.clone()).build()?;
    /// let refunds = Client::builder().retry_budget(budget).build()?;
    /// // One bucket for both clients.
    /// assert_eq!(payments.retry_budget().map(|b| b.available()), Some(100));
    /// assert!(Client::builder().without_retry_budget().build()?.retry_budget().is_none());
    /// # Ok::<(), idempotent_retry::Error>(())
    /// ```
    pub fn retry_budget(mut self, budget: RetryBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Turns the retry budget off: every retry the policy allows is sent, however many
    /// operations are failing at once. Only for clients whose callers already bound retries.
    ///
    /// Default: the budget is on.
    pub fn without_retry_budget(mut self) -> Self {
        self.budget = None;
        self
    }

    /// Builds the client.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when a policy is invalid (see
    /// [`RetryPolicy::validate`]), when an origin given to
    /// [`RedirectPolicy::allow_key_to`] is not one, when the attempt header is the key header,
    /// when two of [`LedgerOptions::seal_keys`](crate::ledger::LedgerOptions::seal_keys)'s keys
    /// share an id, or when no
    /// `reqwest::Client` was given and the default one cannot be built (its TLS back end or
    /// resolver configuration failed to load).
    pub fn build(mut self) -> Result<Client, Error> {
        self.validate()?;
        let http = match self.http.take() {
            Some(http) => http,
            // `reqwest::Client::new()` would panic here; the builder reports the error instead.
            // Redirects are this crate's to follow (see `redirect/`).
            None => reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(Error::builder_from)?,
        };
        let redirects = std::mem::take(&mut self.redirects);
        Ok(Client::from_settings(
            self.settings_unchecked(),
            http,
            redirects,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_traits<T: Send + Sync + Clone + fmt::Debug + 'static>() {}

    #[test]
    fn client_is_send_sync_clone() {
        assert_traits::<Client>();
    }

    #[test]
    fn two_seal_keys_with_one_id_are_refused_at_build() {
        use crate::ledger::{LedgerOptions, SealKey};
        let key = |id: &str, byte: u8| SealKey::new(id, [byte; 32]).expect("a valid key");
        let err = Client::builder()
            .ledger_options(LedgerOptions::new().seal_keys([
                key("k2", 2),
                key("k1", 1),
                key("k2", 3),
            ]))
            .build()
            .expect_err("one id twice");
        assert_eq!(err.kind(), crate::ErrorKind::Builder);
        let said = err.to_string();
        assert!(
            said.contains("\"k2\" is given twice (keys 1 and 3"),
            "{said}"
        );
        Client::builder()
            .ledger_options(LedgerOptions::new().seal_keys([key("k2", 2), key("k1", 1)]))
            .build()
            .expect("two ids");
    }

    #[test]
    fn debug_output_names_the_settings_and_the_pending_key() {
        let client = Client::new();
        assert!(format!("{client:?}").contains("idempotency-key"));
        assert_eq!(client.policy(), &RetryPolicy::default());
        assert_eq!(client.key_header(), &IDEMPOTENCY_KEY);
        let builder = Client::builder().rng_seed(9);
        assert!(format!("{builder:?}").contains("rng_seed: Some(9)"));
        let key = crate::IdempotencyKey::new("k_debug").expect("valid");
        let builder = client.post("http://127.0.0.1:9/").idempotency_key(key);
        let text = format!("{builder:?}");
        assert!(
            text.starts_with("RequestBuilder") && text.contains("k_debug"),
            "{text}"
        );
    }

    #[test]
    fn build_refuses_an_invalid_policy() {
        let err = Client::builder()
            .policy(RetryPolicy::default().with_max_attempts(0))
            .build()
            .expect_err("zero attempts is invalid");
        assert_eq!(err.kind(), crate::ErrorKind::Builder);
        assert!(err.to_string().contains("max_attempts"));
    }
}
