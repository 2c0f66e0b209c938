//! How the client uses its ledger: retention, leases, saved responses, concurrent runs.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use http::HeaderName;
use http::header::{CONTENT_TYPE, LOCATION};

use super::seal::SealKey;
use crate::keys::key::IdempotencyKey;

/// What a run does when another live run holds the operation's lease.
///
/// Default: [`LeaseHeldPolicy::WAIT`], a look every 100 ms for up to 4 minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseHeldPolicy {
    /// Fail at once with [`ErrorKind::LeaseHeld`](crate::ErrorKind::LeaseHeld); nothing is
    /// sent.
    Fail,
    /// Look again every `poll` until the other run finishes (then replay its response, or take
    /// the operation over) or its lease lapses, for at most `max_wait`; then fail with
    /// [`ErrorKind::LeaseHeld`](crate::ErrorKind::LeaseHeld). Waits go through the client's
    /// [`Sleeper`](crate::time::Sleeper).
    ///
    /// A zero `poll` or `max_wait` behaves as [`Fail`](Self::Fail). No wait is longer than
    /// what is left of `max_wait`, and the waits add up without overflow, so
    /// `Duration::MAX` is accepted (and waits as long as asked).
    Wait {
        /// How often to look again.
        poll: Duration,
        /// How long to wait in all.
        max_wait: Duration,
    },
}

impl LeaseHeldPolicy {
    /// The default: look again every 100 ms for up to 4 minutes. Four minutes outlast a live
    /// run under the default policy (five attempts of 30 s and their backoff waits, about
    /// 2 min 40 s, plus up to 1 min of waiting out a receiver's "in progress") plus the take-over
    /// of a dead one (one lease, 10 s), so a run that meets another gets that run's answer, not
    /// an error; a tenth of a second is a small delay beside the replayed request and one
    /// indexed read per look.
    pub const WAIT: LeaseHeldPolicy = LeaseHeldPolicy::Wait {
        poll: Duration::from_millis(100),
        max_wait: Duration::from_secs(240),
    };
}

impl Default for LeaseHeldPolicy {
    fn default() -> Self {
        LeaseHeldPolicy::WAIT
    }
}

/// How a [`Client`](crate::Client) uses its [`Ledger`](crate::ledger::Ledger).
///
/// # Default
///
/// [`LedgerOptions::new()`] holds the defaults listed, with their reasons, in the crate's
/// [defaults table](crate#defaults); no scope has a retention of its own, and the random worker
/// name is fixed for the options' lifetime.
#[derive(Clone, PartialEq, Eq)]
#[must_use]
pub struct LedgerOptions {
    pub(crate) retention: Duration,
    pub(crate) scope_retention: HashMap<String, Duration>,
    pub(crate) lease: Duration,
    pub(crate) max_body: usize,
    pub(crate) saved_headers: Vec<HeaderName>,
    pub(crate) on_lease_held: LeaseHeldPolicy,
    pub(crate) worker: String,
    pub(crate) call_timeout: Duration,
    pub(crate) fetch_unsaved_answers: bool,
    pub(crate) keep_query_params: Vec<String>,
    pub(crate) seal_keys: Vec<SealKey>,
}

impl fmt::Debug for LedgerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerOptions")
            .field("retention", &self.retention)
            .field("scope_retention", &self.scope_retention)
            .field("lease", &self.lease)
            .field("max_body", &self.max_body)
            .field("saved_headers", &self.saved_headers)
            .field("on_lease_held", &self.on_lease_held)
            .field("worker", &self.worker)
            .field("call_timeout", &self.call_timeout)
            .field("fetch_unsaved_answers", &self.fetch_unsaved_answers)
            .field("keep_query_params", &self.keep_query_params)
            .field("seal_keys", &self.seal_keys)
            .finish()
    }
}

impl Default for LedgerOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// Seven days: cheap to keep, and it covers manual replays and incident forensics.
const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Ten seconds: a dead run's key is taken over this soon after its last renewal, and a live run
/// renews every third of it, so two renewals can fail (or the process stall for 6 s) before
/// it loses its key.
const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Ten seconds: a thousand times a healthy commit, and past SQLite's five-second wait for
/// another process's write lock, whose own error names the cause.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl LedgerOptions {
    /// Every default.
    pub fn new() -> Self {
        LedgerOptions {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            retention: DEFAULT_RETENTION,
            scope_retention: HashMap::new(),
            lease: DEFAULT_LEASE,
            max_body: 64 * 1024,
            saved_headers: vec![CONTENT_TYPE, LOCATION],
            on_lease_held: LeaseHeldPolicy::WAIT,
            worker: IdempotencyKey::random().into_string(),
            fetch_unsaved_answers: true,
            keep_query_params: Vec::new(),
            seal_keys: Vec::new(),
        }
    }

    /// How long a row is kept after its first attempt, for scopes without their own
    /// retention. The rule: twice the longest window in which anyone may retry the operation.
    /// Whatever is set, a row is kept at least twice the request's reconcile window, so it
    /// cannot be purged while the operation may still be retried.
    ///
    /// Any value is accepted. Zero keeps a row for the two windows only; a retention too long to
    /// represent as a date (`Duration::MAX`) is clamped to the latest time a ledger stores
    /// (`i64::MAX` milliseconds after the epoch): the row is never purged.
    ///
    /// Default: 7 days.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The retention for one scope (a provider that replays for 30 days: 31 days for its
    /// scope, not for everything).
    ///
    /// Default: none; every scope uses [`retention`](Self::retention).
    pub fn scope_retention(mut self, scope: impl Into<String>, retention: Duration) -> Self {
        self.scope_retention.insert(scope.into(), retention);
        self
    }

    /// How long a lease lasts unless its run renews it. A live run renews its lease every
    /// third of this on its own timer (during an attempt, a wait, the finish), so the lease no
    /// longer depends on the attempt timeout; an operation shorter than a third of the lease
    /// writes no renewal. A run that dies (a crash, `SIGKILL`) is taken over by the next run
    /// with its key at most this long after its last renewal. A run whose caller drops it gives
    /// its lease back at once instead (`docs/ledger.md`).
    ///
    /// A renewal that fails is tried again within the lease; a run that cannot renew before
    /// its lease ends sends nothing more and reports what it knows
    /// ([`ErrorKind::Ledger`](crate::ErrorKind::Ledger)).
    ///
    /// The lease is compared on the ledger's clock: the database's for PostgreSQL, so workers'
    /// clocks need not agree; the host's for SQLite (`docs/ledger.md`, "Whose clock").
    ///
    /// Any value is accepted. Zero renews nothing, and any other run takes the key over at
    /// once; a lease too long to represent as a date (`Duration::MAX`) is clamped to the
    /// latest time a ledger stores, so a run that dies holding it is never taken over.
    ///
    /// Default: 10 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The longest response body saved for replay, and the most of a final response's body
    /// that `send` reads before returning. A longer body is returned to the caller as usual
    /// (the bytes read so far, then the rest, unread) but not saved (its `Content-Length` is
    /// kept with the saved headers, when it had one): a later run with the key fetches it
    /// again or says so ([`fetch_unsaved_answers`](Self::fetch_unsaved_answers)), never
    /// replays an empty body.
    ///
    /// Any value is accepted: 0 saves empty bodies only (`send` stops reading at the first
    /// non-empty chunk); `usize::MAX` reads and saves every final body whole, however long the
    /// server makes it, so keep a finite cap where servers are not trusted.
    ///
    /// Default: 64 KiB.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The response headers saved for replay (values that are not visible ASCII are skipped).
    ///
    /// Default: `Content-Type` and `Location`.
    pub fn saved_headers(mut self, headers: impl IntoIterator<Item = HeaderName>) -> Self {
        self.saved_headers = headers.into_iter().collect();
        self
    }

    /// What to do when another live run holds the lease: wait for its answer (and replay
    /// it), or for its lease to lapse (and take it over), or fail at once.
    ///
    /// Default: [`LeaseHeldPolicy::WAIT`] (every 100 ms, for up to 4 minutes).
    pub fn on_lease_held(mut self, policy: LeaseHeldPolicy) -> Self {
        self.on_lease_held = policy;
        self
    }

    /// The worker's name, the first part of every lease owner this client writes (each run
    /// adds a random suffix). Name workers after something an operator recognizes (a host
    /// name, a pod name) so `lease_owner` says who holds an in-flight row.
    ///
    /// Default: a random UUID.
    pub fn worker(mut self, name: impl Into<String>) -> Self {
        self.worker = name.into();
        self
    }

    /// The retention for a scope, before the two-windows floor.
    /// How long one ledger call may take before the client stops waiting for it: every claim,
    /// attempt record, finish, reconcile hold and resolve, read and purge batch, on every
    /// front end and ledger. A frozen database (a failover, a partition, a full disk) then
    /// costs an operation this long, never forever:
    ///
    /// - **the claim** times out with [`ErrorKind::Ledger`](crate::ErrorKind::Ledger), nothing
    ///   sent, not executed; a claim that lands later is given back as soon as it does;
    /// - **an attempt's record** (before a retry is sent) ends the operation with
    ///   [`ErrorKind::Ledger`](crate::ErrorKind::Ledger), the retry not sent, outcome as the
    ///   attempts so far say; the row's lease lapses and the next run takes it over with the
    ///   same key and window;
    /// - **a renewal** is tried again within the lease; one that cannot be written before the
    ///   lease ends stops the run before its next attempt;
    /// - **the finish** after an answer still returns the answer (`Ok`), with
    ///   [`RetryReport::unrecorded`](crate::RetryReport::unrecorded) saying it was not
    ///   recorded: the row, left in flight, is taken over once its lease lapses (the receiver
    ///   replays its answer to that run).
    ///
    /// Any value is accepted; zero fails every call.
    ///
    /// Default: 10 s.
    pub fn call_timeout(mut self, limit: Duration) -> Self {
        self.call_timeout = limit;
        self
    }

    /// What a run does when the ledger holds its operation as succeeded but not its answer's
    /// body (longer than [`max_body`](Self::max_body)): with `true`, inside the operation's
    /// reconcile window, it sends the operation again with its key, and the receiver answers
    /// from its own store (the same bet every retry makes: the window must be shorter than
    /// the receiver keeps keys); the report says so
    /// ([`RetryReport::is_refetched`](crate::RetryReport::is_refetched)) and the row keeps
    /// its record. With `false`, or past the window, the run fails with
    /// [`ErrorKind::AnswerNotSaved`](crate::ErrorKind::AnswerNotSaved), naming the key, the
    /// answer's size and the limit, and sends nothing. Never an empty body as the answer.
    ///
    /// Default: `true`.
    pub fn fetch_unsaved_answers(mut self, fetch: bool) -> Self {
        self.fetch_unsaved_answers = fetch;
        self
    }

    /// The query parameters whose values a row's URLs keep (compared by name as written in
    /// the URL, case included). Every other query value is stored as `…` (`?api_key=…`), in
    /// the row's URL and in the URL that answered; names stay, and the fragment is dropped. The
    /// request's fingerprint still covers the whole URL, so a changed query is still another
    /// request. Rows queued through the outbox keep the URL they are sent to (`docs/ledger.md`,
    /// "Secrets at rest").
    ///
    /// Default: none. The crate cannot tell which names carry secrets (`key`, `sig`, `code`,
    /// `state`, a provider's own), and a value kept by mistake stays readable for the row's
    /// retention, while one redacted by mistake costs only a detail an operator can find in
    /// the application's own records; list the harmless ones you want to read
    /// (`["page", "limit"]`).
    pub fn keep_query_params<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Self {
        self.keep_query_params = names.into_iter().map(Into::into).collect();
        self
    }

    /// Seals saved answers at rest: each final response's headers and body are encrypted
    /// (XChaCha20-Poly1305) with the first key before the ledger stores them, bound to their
    /// row (a blob copied onto another row does not open), and the row records that key's id.
    /// Every key opens the rows sealed with its id, so a rotation puts the new key first and
    /// keeps the old ones until the rows they sealed expire. The status and the URLs stay in
    /// the clear.
    ///
    /// A sealed answer that no configured key opens (none configured included) is never
    /// replayed: the run fails with [`ErrorKind::Ledger`](crate::ErrorKind::Ledger), nothing
    /// sent, its source a [`LedgerError`](crate::ledger::LedgerError) of kind
    /// [`Sealed`](crate::ledger::LedgerErrorKind::Sealed) naming the key id it needs.
    ///
    /// Each key's id must be its own: [`ClientBuilder::build`](crate::ClientBuilder::build)
    /// refuses two keys with one id.
    ///
    /// Default: none; answers are stored as they came.
    pub fn seal_keys(mut self, keys: impl IntoIterator<Item = SealKey>) -> Self {
        self.seal_keys = keys.into_iter().collect();
        self
    }

    /// A row's URL as it is stored: without credentials, its query values redacted but
    /// those of [`keep_query_params`](Self::keep_query_params), without a fragment.
    pub(crate) fn stored_url(&self, url: &reqwest::Url) -> String {
        let plain = crate::message::url::without_credentials(url);
        match idempotent_retry_ledger::redact_query(&plain, &self.keep_query_params) {
            std::borrow::Cow::Borrowed(_) => plain,
            std::borrow::Cow::Owned(redacted) => redacted,
        }
    }

    pub(crate) fn retention_for(&self, scope: &str) -> Duration {
        self.scope_retention
            .get(scope)
            .copied()
            .unwrap_or(self.retention)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_retention_overrides_the_default() {
        let options = LedgerOptions::new()
            .retention(Duration::from_secs(60))
            .scope_retention("stripe.v2", Duration::from_secs(31 * 86_400));
        assert_eq!(
            options.retention_for("stripe.v2"),
            Duration::from_secs(31 * 86_400)
        );
        assert_eq!(options.retention_for("other"), Duration::from_secs(60));
        assert_eq!(
            LedgerOptions::default().retention_for("x"),
            DEFAULT_RETENTION
        );
        assert_ne!(LedgerOptions::new().worker, LedgerOptions::new().worker);
        assert!(format!("{options:?}").contains("stripe.v2"));
    }

    #[test]
    fn a_stored_url_keeps_only_the_listed_query_values() {
        let url =
            reqwest::Url::parse("https://u:p@h.example/v1?api_key=S&page=2#frag").expect("a URL");
        assert_eq!(
            LedgerOptions::new().stored_url(&url),
            "https://h.example/v1?api_key=…&page=…"
        );
        assert_eq!(
            LedgerOptions::new()
                .keep_query_params(["page"])
                .stored_url(&url),
            "https://h.example/v1?api_key=…&page=2"
        );
        let plain = reqwest::Url::parse("https://h.example/v1").expect("a URL");
        assert_eq!(LedgerOptions::new().stored_url(&plain), plain.as_str());
    }
}
