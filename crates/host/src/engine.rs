//! The engine a package sends through: an `idempotent_retry::Client` on the shared runtime,
//! its policy, key header and ledger set once from [`Settings`], one operation per call.

use std::sync::Mutex;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use idempotent_retry::ledger::{LeaseHeldPolicy, LedgerOptions, SealKey, SqliteLedger};
use idempotent_retry::{
    Client, IDEMPOTENCY_KEY, IdempotencyKey, RedirectPolicy, RetryBudget, RetryBudgetConfig,
    RetryPolicy,
};

use crate::error::HostError;
use crate::finished::Finished;
use crate::runtime::{Born, runtime};
use crate::tls::Connection;

/// How long closing waits for an SQLite ledger to checkpoint its log.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The engine's `ClientBuilder::answer_read_limit` unless told otherwise: the crate's own
/// default, 1 MiB, set here so that the package's whole-body reads stop where the engine's do.
pub const DEFAULT_ANSWER_READ_LIMIT: usize = 1024 * 1024;

/// Everything an engine is made from; `None` (or the `Default`) keeps the crate's default
/// (5 attempts, 500 ms base delay, 30 s cap, 30 s attempt timeout, 24 h reconcile window, 60 s
/// longest `Retry-After`, 1 min of waiting out a receiver's "in progress"; a 10 s lease; a
/// lease held elsewhere waited for up to 4 min; answers saved up to 64 KiB, a longer one
/// fetched again with its key; the retry budget on, 500 tokens).
#[derive(Debug)]
pub struct Settings {
    /// `RetryPolicy::with_max_attempts`.
    pub max_attempts: Option<u32>,
    /// `RetryPolicy::with_base_delay`.
    pub base_delay: Option<Duration>,
    /// `RetryPolicy::with_max_delay`.
    pub max_delay: Option<Duration>,
    /// `RetryPolicy::with_attempt_timeout`.
    pub attempt_timeout: Option<Duration>,
    /// `RetryPolicy::with_reconcile_window`.
    pub reconcile_window: Option<Duration>,
    /// `RetryPolicy::with_max_retry_after`.
    pub max_retry_after: Option<Duration>,
    /// `RetryPolicy::with_max_in_progress_wait`.
    pub max_in_progress_wait: Option<Duration>,
    /// The key header's name (default `Idempotency-Key`).
    pub key_header: Option<String>,
    /// An SQLite file's path (created if missing) or a `postgres://` URL.
    pub ledger: Option<String>,
    /// `LedgerOptions::lease`.
    pub lease: Option<Duration>,
    /// How long a request whose key another run holds waits for it (default: the ledger's
    /// `LeaseHeldPolicy::WAIT`, 4 min).
    pub lease_wait: Option<Duration>,
    /// `LedgerOptions::worker`: this process's name in the ledger's rows.
    pub worker: Option<String>,
    /// Every operation filed under this scope (default: the URL's host).
    pub ledger_scope: Option<String>,
    /// `false` turns the client's retry budget off.
    pub retry_budget: bool,
    /// `RetryBudgetConfig::with_capacity`.
    pub budget_capacity: Option<u32>,
    /// `RetryBudgetConfig::with_retry_cost`.
    pub budget_retry_cost: Option<u32>,
    /// `RetryBudgetConfig::with_timeout_cost`.
    pub budget_timeout_cost: Option<u32>,
    /// `RetryBudgetConfig::with_success_reward`.
    pub budget_success_reward: Option<u32>,
    /// TLS and proxy.
    pub connection: Connection,
    /// `ClientBuilder::answer_read_limit` (default 1 MiB).
    pub answer_read_limit: Option<usize>,
    /// `LedgerOptions::max_body` (default 64 KiB).
    pub max_saved_body: Option<usize>,
    /// `LedgerOptions::fetch_unsaved_answers` (default `true`).
    pub fetch_unsaved_answers: bool,
    /// `LedgerOptions::seal_keys`, each as `ID:HEX` (`SealKey`'s text form), the first
    /// sealing (default: none, answers stored as they came).
    pub seal_keys: Vec<String>,
    /// `LedgerOptions::keep_query_params`: the query parameters whose values a row's URL
    /// keeps (default: none).
    pub keep_query_params: Vec<String>,
    /// Origins besides a request's own that its key may go to on a redirect
    /// (`RedirectPolicy::allow_key_to`).
    pub allow_key_to: Vec<String>,
    /// Whether the engine follows redirects itself (`RedirectPolicy::default`, up to 10 hops,
    /// the key kept on the same origin); `false` (httpx's case) leaves them to the caller, who
    /// continues the operation with `after`.
    pub follow_redirects: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_attempts: None,
            base_delay: None,
            max_delay: None,
            attempt_timeout: None,
            reconcile_window: None,
            max_retry_after: None,
            max_in_progress_wait: None,
            key_header: None,
            ledger: None,
            lease: None,
            lease_wait: None,
            worker: None,
            ledger_scope: None,
            retry_budget: true,
            budget_capacity: None,
            budget_retry_cost: None,
            budget_timeout_cost: None,
            budget_success_reward: None,
            connection: Connection {
                verify: true,
                ca_file: None,
                cert_file: None,
                key_file: None,
                proxy: None,
            },
            answer_read_limit: None,
            max_saved_body: None,
            fetch_unsaved_answers: true,
            seal_keys: Vec::new(),
            keep_query_params: Vec::new(),
            allow_key_to: Vec::new(),
            follow_redirects: false,
        }
    }
}

/// The ledger an engine opened, kept to close it.
#[derive(Debug)]
enum Opened {
    Sqlite(SqliteLedger),
    #[cfg(feature = "postgres")]
    Postgres,
}

/// One client of the engine: sends operations with one key each, retries what is safe to
/// retry, and keeps them in a ledger when given one.
#[derive(Debug)]
pub struct Engine {
    client: Client,
    key_header: HeaderName,
    scope: Option<String>,
    /// The client's `answer_read_limit`: a body of known length up to this is read whole.
    answer_read_limit: usize,
    opened: Mutex<Option<Opened>>,
    /// The process the client and its ledger were made in.
    born: Born,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.born.is_here() {
            // A child of a fork: the client's connections and the ledger's writer belong to
            // the parent, and tearing them down here would deregister the parent's sockets
            // from the event queue the two share. They are left as they are: a clone of the
            // client forgotten holds its shared state, so dropping the field tears nothing down.
            std::mem::forget(self.client.clone());
            std::mem::forget(
                self.opened
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .take(),
            );
        }
    }
}

/// Opens `ledger` (a PostgreSQL URL, or an SQLite file's path) and gives it to `builder`.
async fn open(
    ledger: &str,
    builder: idempotent_retry::ClientBuilder,
) -> Result<(idempotent_retry::ClientBuilder, Opened), String> {
    if ledger.starts_with("postgres://") || ledger.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            use idempotent_retry::ledger::PostgresLedger;
            // The URL may hold a password: it is never repeated.
            let opened = PostgresLedger::connect(ledger)
                .await
                .map_err(|err| format!("cannot open the PostgreSQL ledger: {err}"))?;
            opened
                .migrate()
                .await
                .map_err(|err| format!("cannot migrate the PostgreSQL ledger: {err}"))?;
            return Ok((builder.ledger(opened), Opened::Postgres));
        }
        #[cfg(not(feature = "postgres"))]
        return Err("this build of idempotent_retry has no PostgreSQL support".to_owned());
    }
    let opened = SqliteLedger::open(ledger)
        .await
        .map_err(|err| format!("cannot open the ledger {ledger}: {err}"))?;
    Ok((builder.ledger(opened.clone()), Opened::Sqlite(opened)))
}

/// One request as the package hands it over, checked.
#[derive(Debug)]
pub struct Outgoing {
    method: Method,
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Option<reqwest::Body>,
    key: Option<IdempotencyKey>,
    /// Sent without a key, none minted.
    keyless: bool,
    /// The redirects the request was answered with, that the caller followed: the operation
    /// goes on from the last one (`RequestBuilder::after_redirect`).
    after: Vec<(StatusCode, reqwest::Url)>,
    timeout: Option<Duration>,
    scope: Option<String>,
    answer_read_limit: usize,
}

impl Outgoing {
    /// Sends it without a key, none minted.
    pub fn keyless(mut self, keyless: bool) -> Outgoing {
        self.keyless = keyless;
        self
    }

    /// The redirects (status, absolute `Location`) this request was answered with and that
    /// the caller followed, in order: the operation, recorded under the request as first
    /// given, goes on from the last one.
    ///
    /// # Errors
    ///
    /// A value error for a status that is not a redirect's number or a URL that is not absolute.
    pub fn after(mut self, after: Vec<(u16, String)>) -> Result<Outgoing, HostError> {
        self.after = after
            .into_iter()
            .map(|(status, location)| {
                let status = StatusCode::from_u16(status).map_err(|_| {
                    HostError::value(format!("after: {status} is not an HTTP status"))
                })?;
                Ok((status, absolute(&location)?))
            })
            .collect::<Result<_, HostError>>()?;
        Ok(self)
    }
}

/// A duration from a number of seconds.
///
/// # Errors
///
/// A value error naming `name` for a negative, infinite or NaN number.
pub fn seconds(name: &str, value: f64) -> Result<Duration, HostError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| HostError::value(format!("{name}: {value} is not a number of seconds")))
}

/// An absolute URL.
///
/// # Errors
///
/// A value error naming the text when it is not one.
pub fn absolute(url: &str) -> Result<reqwest::Url, HostError> {
    reqwest::Url::parse(url)
        .map_err(|err| HostError::value(format!("{url:?} is not an absolute URL: {err}")))
}

impl Engine {
    /// A new engine from `settings`, its ledger opened (and migrated) on the shared runtime:
    /// this blocks until then.
    ///
    /// # Errors
    ///
    /// A value error for an invalid policy, header name, PEM file, proxy URL, origin in
    /// `allow_key_to` or seal key; not-found or I/O errors for a TLS file that cannot be read; a runtime
    /// error when the ledger cannot be opened or the HTTP client cannot be built.
    pub fn new(settings: Settings) -> Result<Engine, HostError> {
        let mut policy = RetryPolicy::default();
        if let Some(attempts) = settings.max_attempts {
            policy = policy.with_max_attempts(attempts);
        }
        if let Some(value) = settings.base_delay {
            policy = policy.with_base_delay(value);
        }
        if let Some(value) = settings.max_delay {
            policy = policy.with_max_delay(value);
        }
        if let Some(value) = settings.attempt_timeout {
            policy = policy.with_attempt_timeout(value);
        }
        if let Some(value) = settings.reconcile_window {
            policy = policy.with_reconcile_window(value);
        }
        if let Some(value) = settings.max_retry_after {
            policy = policy.with_max_retry_after(value);
        }
        if let Some(value) = settings.max_in_progress_wait {
            policy = policy.with_max_in_progress_wait(value);
        }
        policy
            .validate()
            .map_err(|err| HostError::value(err.to_string()))?;
        let key_header = match &settings.key_header {
            Some(name) => HeaderName::try_from(name.as_str())
                .map_err(|_| HostError::value(format!("{name:?} is not a header name")))?,
            None => IDEMPOTENCY_KEY,
        };
        let mut options = LedgerOptions::new();
        if let Some(value) = settings.lease {
            options = options.lease(value);
        }
        if let Some(max_wait) = settings.lease_wait {
            options = options.on_lease_held(match LeaseHeldPolicy::WAIT {
                LeaseHeldPolicy::Wait { poll, .. } => LeaseHeldPolicy::Wait { poll, max_wait },
                other => other,
            });
        }
        if let Some(name) = settings.worker {
            options = options.worker(name);
        }
        if let Some(bytes) = settings.max_saved_body {
            options = options.max_body(bytes);
        }
        options = options.fetch_unsaved_answers(settings.fetch_unsaved_answers);
        let seal_keys = settings
            .seal_keys
            .iter()
            .map(|text| text.parse::<SealKey>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| HostError::value(format!("seal_keys: {err}")))?;
        options = options
            .seal_keys(seal_keys)
            .keep_query_params(settings.keep_query_params.iter().cloned());
        let http = settings
            .connection
            .apply(reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()))?
            .build()
            .map_err(|err| Connection::build_error(&err))?;
        let answer_read_limit = settings
            .answer_read_limit
            .unwrap_or(DEFAULT_ANSWER_READ_LIMIT);
        let base = if settings.follow_redirects {
            RedirectPolicy::default()
        } else {
            RedirectPolicy::none()
        };
        let redirects = settings
            .allow_key_to
            .iter()
            .fold(base, |policy, origin| policy.allow_key_to(origin));
        let mut builder = Client::builder()
            .http(http)
            .policy(policy)
            .key_header(key_header.clone())
            .redirects(redirects)
            .answer_read_limit(answer_read_limit)
            .ledger_options(options);
        let mut budget = RetryBudgetConfig::new();
        if let Some(tokens) = settings.budget_capacity {
            budget = budget.with_capacity(tokens);
        }
        if let Some(tokens) = settings.budget_retry_cost {
            budget = budget.with_retry_cost(tokens);
        }
        if let Some(tokens) = settings.budget_timeout_cost {
            budget = budget.with_timeout_cost(tokens);
        }
        if let Some(tokens) = settings.budget_success_reward {
            budget = budget.with_success_reward(tokens);
        }
        builder = if settings.retry_budget {
            builder.retry_budget(
                RetryBudget::with_config(budget)
                    .map_err(|err| HostError::value(err.to_string()))?,
            )
        } else {
            builder.without_retry_budget()
        };
        let runtime = runtime()?;
        let mut opened = None;
        if let Some(ledger) = &settings.ledger {
            let (with_ledger, ledger) = runtime
                .block_on(open(ledger, builder))
                .map_err(HostError::runtime)?;
            builder = with_ledger;
            opened = Some(ledger);
        }
        // The client's connection pool belongs to the shared runtime.
        let client = {
            let _entered = runtime.enter();
            builder.build()
        }
        .map_err(|err| HostError::value(err.to_string()))?;
        Ok(Engine {
            client,
            key_header,
            scope: settings.ledger_scope,
            answer_read_limit,
            opened: Mutex::new(opened),
            born: Born::here(),
        })
    }

    /// The key header's name, lowercase.
    pub fn key_header(&self) -> &str {
        self.key_header.as_str()
    }

    /// The client's `answer_read_limit`.
    pub fn answer_read_limit(&self) -> usize {
        self.answer_read_limit
    }

    /// The process the engine was made in.
    pub fn born(&self) -> Born {
        self.born
    }

    /// Whether a redirect of an operation first sent to `original` may carry its key to
    /// `location`: the same origin, or one given in `allow_key_to`.
    ///
    /// # Errors
    ///
    /// A value error when either is not an absolute URL.
    pub fn redirect_keeps_key(&self, original: &str, location: &str) -> Result<bool, HostError> {
        Ok(self
            .client
            .redirects()
            .allows_key_to(&absolute(original)?, &absolute(location)?))
    }

    /// Checks one request's parts: `headers` are `(name, value)` byte pairs in order (the key
    /// header among them is the key, unless `key` is given; `Host`, `Content-Length`,
    /// `Transfer-Encoding`, `Connection` and `Keep-Alive` are the client's own and left out);
    /// `timeout` is the attempt timeout (`None`: the policy's).
    ///
    /// # Errors
    ///
    /// A value error for a method, header name or value, or key that is not valid.
    pub fn outgoing(
        &self,
        method: &str,
        url: String,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body: Option<reqwest::Body>,
        key: Option<String>,
        timeout: Option<Duration>,
    ) -> Result<Outgoing, HostError> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| HostError::value(format!("{method:?} is not an HTTP method")))?;
        let mut key = key;
        let mut parsed = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            let name = HeaderName::from_bytes(&name).map_err(|_| {
                HostError::value(format!(
                    "{:?} is not a header name",
                    String::from_utf8_lossy(&name)
                ))
            })?;
            if name == self.key_header {
                if key.is_none() {
                    key = Some(String::from_utf8(value).map_err(|_| {
                        HostError::value("an idempotency key must be visible ASCII")
                    })?);
                }
                continue;
            }
            // The client writes these from the body and the URL itself, and manages the
            // connection.
            if name == http::header::HOST
                || name == http::header::CONTENT_LENGTH
                || name == http::header::TRANSFER_ENCODING
                || name == http::header::CONNECTION
                || name.as_str() == "keep-alive"
            {
                continue;
            }
            let value = HeaderValue::from_bytes(&value).map_err(|_| {
                HostError::value(format!("the value of {name} is not a header value"))
            })?;
            parsed.push((name, value));
        }
        let key = key
            .map(|key| {
                IdempotencyKey::new(key)
                    .map_err(|err| HostError::value(format!("the idempotency key: {err}")))
            })
            .transpose()?;
        Ok(Outgoing {
            method,
            url,
            headers: parsed,
            body,
            key,
            keyless: false,
            after: Vec::new(),
            timeout,
            scope: self.scope.clone(),
            answer_read_limit: self.answer_read_limit,
        })
    }

    /// The future that runs one operation to its end; it owns what it needs, so it can be
    /// spawned on the runtime, and dropping it drops the operation where it stands (the
    /// ledger's lease given back).
    pub fn operate(&self, outgoing: Outgoing) -> impl Future<Output = Finished> + Send + 'static {
        operate(self.client.clone(), outgoing)
    }

    /// Closes the ledger (an SQLite file checkpoints its log, for up to 5 s), blocking until
    /// then. Requests after this still go out, without the file once its last handle is gone.
    pub fn close(&self) {
        if !self.born.is_here() {
            // The parent's ledger, closed by the parent (see `Drop`).
            return;
        }
        let opened = self
            .opened
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        // Without a runtime there is no writer thread to wait for: dropping the ledger is all.
        if let (Some(Opened::Sqlite(ledger)), Ok(runtime)) = (opened, runtime()) {
            runtime.block_on(ledger.close(CLOSE_WAIT));
        }
    }
}

/// Runs one operation to its end, the response's body read when it is bounded (see
/// `Received::read`).
async fn operate(client: Client, outgoing: Outgoing) -> Finished {
    let Outgoing {
        method,
        url,
        headers,
        body,
        key,
        keyless,
        after,
        timeout,
        scope,
        answer_read_limit,
    } = outgoing;
    let mut map = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        map.append(name, value);
    }
    let mut request = client.request(method, url.as_str()).headers(map);
    if let Some(body) = body {
        request = request.body(body);
    }
    if let Some(key) = key {
        request = request.idempotency_key(key);
    }
    if keyless {
        request = request.without_idempotency_key();
    }
    for (status, location) in after {
        request = request.after_redirect(status, location);
    }
    if let Some(timeout) = timeout {
        request = request.timeout(timeout);
    }
    if let Some(scope) = scope {
        request = request.ledger_scope(scope);
    }
    match request.send().await {
        Ok(response) => Finished::from_response(response, answer_read_limit).await,
        Err(err) => Finished::from_error(err, answer_read_limit).await,
    }
}
