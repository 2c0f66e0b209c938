//! The durable operation ledger: what must outlive the process that sends a request.
//!
//! A derived key survives a crash, a redelivered job and a rolling deploy; three facts about
//! the operation do not, unless they are written down outside process memory:
//!
//! - **when the operation first started**, so the reconcile window spans restarts;
//! - **whether it already completed**, so a finished operation is answered from the record
//!   instead of being sent again;
//! - **whether another worker is sending it right now**, so two workers do not race.
//!
//! A [`Ledger`] keeps one row per idempotency key. The client claims the row before the first
//! attempt (one atomic statement: the insert is the lock), records every attempt, and writes
//! the outcome at the end. An in-flight row carries a lease (owner and expiry); a process that
//! dies mid-operation leaves an expired lease, and the next run with the same key takes the
//! row over and goes on with the same key and the original start time.
//!
//! Three implementations ship: [`MemoryLedger`] (always available; one process),
//! `SqliteLedger` (feature `sqlite`; one machine) and `PostgresLedger` (feature `postgres`; a
//! fleet of workers sharing one table).
//!
//! The SQL ledgers' schema and the queries for incidents: `docs/ledger.md`.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

mod clock;
mod error;
mod memory;
pub mod outbox;
mod redact;
mod renew;
mod resolution;
#[doc(hidden)]
pub mod sql;
mod status;
pub mod window;

pub use clock::{LedgerClock, rebase};
#[doc(hidden)]
pub use clock::{clock_reading, millis_after};
pub use error::{LedgerError, LedgerErrorKind};
pub use memory::MemoryLedger;
pub use redact::{REDACTED_VALUE, looks_like_credential, redact_query};
pub use renew::Renew;
pub use resolution::{
    ReconcileClaim, Resolution, ResolutionKind, ResolutionNote, Resolve, reconcilable,
};
pub use status::OperationStatus;

/// A boxed, `Send` future returned by [`Ledger`] methods.
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

/// Parses a stored status name, as [`OperationStatus::as_str`] spells it.
///
/// ```
/// use idempotent_retry_ledger::{LedgerErrorKind, OperationStatus};
///
/// assert_eq!("unknown".parse::<OperationStatus>()?, OperationStatus::Unknown);
/// let err = "done".parse::<OperationStatus>().expect_err("not a status");
/// assert_eq!(err.kind(), LedgerErrorKind::Corrupt);
/// # Ok::<(), idempotent_retry_ledger::LedgerError>(())
/// ```
impl FromStr for OperationStatus {
    type Err = LedgerError;

    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`] for any other text: a stored status this release cannot
    /// read.
    fn from_str(text: &str) -> Result<Self, LedgerError> {
        match text {
            "in_flight" => Ok(OperationStatus::InFlight),
            "succeeded" => Ok(OperationStatus::Succeeded),
            "failed_final" => Ok(OperationStatus::FailedFinal),
            "unknown" => Ok(OperationStatus::Unknown),
            "not_sent" => Ok(OperationStatus::NotSent),
            "queued" => Ok(OperationStatus::Queued),
            other => Err(LedgerError::corrupt(format!("unknown status {other:?}"))),
        }
    }
}

/// A final response as the ledger keeps it, to replay without sending the request again.
///
/// A [`Ledger`] stores it as it is given and hands it back unchanged: the status, every
/// header pair in order (duplicates included), and the body byte for byte, where an empty
/// body (`Some(vec![])`) and an absent one (`None`) stay distinct.
///
/// A sealed response ([`sealed_with`](Self::sealed_with) set) holds no headers, and its body
/// is the ciphertext of the headers and body together: the client seals and opens it with
/// the keys in its `LedgerOptions`; a ledger stores it as any other.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SavedResponse {
    /// The status code.
    pub status: u16,
    /// The selected headers (`LedgerOptions::saved_headers`), in order.
    pub headers: Vec<(String, String)>,
    /// The body, or `None` when it was longer than `LedgerOptions::max_body`.
    pub body: Option<Vec<u8>>,
    /// The URL that gave this answer when it is not the request's: the last hop of the
    /// redirects the request followed. `None` when the request's own URL answered.
    pub url: Option<String>,
    /// The id of the key that sealed the headers and body into [`body`](Self::body), when
    /// they are sealed; `None` for a response kept in the clear.
    pub sealed_with: Option<String>,
}

impl SavedResponse {
    /// A saved response.
    #[must_use]
    pub fn new(status: u16, headers: Vec<(String, String)>, body: Option<Vec<u8>>) -> Self {
        SavedResponse {
            status,
            headers,
            body,
            url: None,
            sealed_with: None,
        }
    }

    /// The response, its headers and body sealed with the key `key_id` into `body`, the
    /// ciphertext ([`sealed_with`](Self::sealed_with)): what a ledger stores for a client
    /// that seals its answers. The headers are cleared.
    #[must_use]
    pub fn sealed(mut self, key_id: impl Into<String>, ciphertext: Vec<u8>) -> Self {
        self.headers = Vec::new();
        self.body = Some(ciphertext);
        self.sealed_with = Some(key_id.into());
        self
    }

    /// The response, answered at `url` rather than at the request's URL (a redirect was
    /// followed to it).
    #[must_use]
    pub fn answered_at(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }
}

/// Refuses an empty key or lease token: either would make two operations, or two runs, one.
#[doc(hidden)]
pub fn require(what: &str, value: &str) -> Result<(), LedgerError> {
    if value.is_empty() {
        Err(LedgerError::invalid(format!("{what} must not be empty")))
    } else {
        Ok(())
    }
}

/// One row of the ledger.
///
/// The fields are public to read; a [`Ledger`] outside this crate builds one with
/// [`OperationRecord::builder`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationRecord {
    /// The idempotency key (primary key).
    pub key: String,
    /// What kind of operation it is, e.g. `stripe.charge`; by default the request's host.
    pub scope: String,
    /// SHA-256 (hex) of the canonical request: method, URL and body.
    pub fingerprint: String,
    /// Where it stands.
    pub status: OperationStatus,
    /// Attempts recorded, over every run.
    pub attempts: u32,
    /// When the first run claimed it: the start of the reconcile window.
    pub first_attempt_at: SystemTime,
    /// When the last recorded attempt ended.
    pub last_attempt_at: Option<SystemTime>,
    /// The lease holder, while in flight.
    pub lease_owner: Option<String>,
    /// When the lease lapses, while in flight.
    pub lease_expires_at: Option<SystemTime>,
    /// The final response, when there was one.
    pub response: Option<SavedResponse>,
    /// When [`Ledger::purge_expired`] may delete the row.
    pub expires_at: SystemTime,
    /// The request's method, as the claim recorded it (`None` in rows written before schema
    /// version 2, or by a claim that did not say).
    pub method: Option<String>,
    /// The request's URL without credentials, as the claim recorded it (`None` as for
    /// [`method`](Self::method)).
    pub url: Option<String>,
    /// The last resolution of an unknown outcome, when there was one.
    pub resolution: Option<ResolutionNote>,
}

impl OperationRecord {
    /// Whether the run with lease token `owner` holds this row: in flight, under its lease.
    /// Only the holder writes ([`AttemptUpdate::apply`], [`Finish::apply`],
    /// [`Resolve::apply`] check it first).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`], naming `key`, when another run holds it or none does.
    pub fn check_held_by(&self, key: &str, owner: &str) -> Result<(), LedgerError> {
        if self.status == OperationStatus::InFlight && self.lease_owner.as_deref() == Some(owner) {
            Ok(())
        } else {
            Err(LedgerError::lease_lost(key))
        }
    }

    /// A record of the operation `key`, for the request with `fingerprint`, first claimed at
    /// `first_attempt_at` and purgeable from `expires_at`. Everything else is set on the
    /// builder; [`OperationRecordBuilder::build`] checks that the status and the lease agree.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry_ledger::{OperationRecord, OperationStatus};
    /// use std::time::{Duration, SystemTime};
    ///
    /// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    /// let record = OperationRecord::builder("order-42", "9f86d0…", now, now + Duration::from_secs(86_400))
    ///     .scope("shop.order")
    ///     .lease("worker-a/run-1", now + Duration::from_secs(60))
    ///     .build()?;
    /// assert_eq!(record.status, OperationStatus::InFlight);
    /// assert_eq!(record.lease_owner.as_deref(), Some("worker-a/run-1"));
    /// # Ok::<(), idempotent_retry_ledger::LedgerError>(())
    /// ```
    pub fn builder(
        key: impl Into<String>,
        fingerprint: impl Into<String>,
        first_attempt_at: SystemTime,
        expires_at: SystemTime,
    ) -> OperationRecordBuilder {
        OperationRecordBuilder {
            record: OperationRecord {
                key: key.into(),
                scope: String::new(),
                fingerprint: fingerprint.into(),
                status: OperationStatus::InFlight,
                attempts: 0,
                first_attempt_at,
                last_attempt_at: None,
                lease_owner: None,
                lease_expires_at: None,
                response: None,
                expires_at,
                method: None,
                url: None,
                resolution: None,
            },
        }
    }
}

/// Builds an [`OperationRecord`]; made by [`OperationRecord::builder`].
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | [`scope`](Self::scope) | empty |
/// | [`status`](Self::status) | [`OperationStatus::InFlight`] |
/// | [`attempts`](Self::attempts) | 0 |
/// | [`last_attempt_at`](Self::last_attempt_at) | none |
/// | [`lease`](Self::lease) | none |
/// | [`response`](Self::response) | none |
/// | [`request`](Self::request) | none |
/// | [`resolution`](Self::resolution) | none |
#[derive(Debug, Clone)]
#[must_use]
pub struct OperationRecordBuilder {
    record: OperationRecord,
}

impl OperationRecordBuilder {
    /// The operation's scope. Default: empty.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.record.scope = scope.into();
        self
    }

    /// Where the operation stands. Default: [`OperationStatus::InFlight`].
    pub fn status(mut self, status: OperationStatus) -> Self {
        self.record.status = status;
        self
    }

    /// Attempts recorded over every run. Default: 0.
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.record.attempts = attempts;
        self
    }

    /// When the last recorded attempt ended. Default: none.
    pub fn last_attempt_at(mut self, at: SystemTime) -> Self {
        self.record.last_attempt_at = Some(at);
        self
    }

    /// The lease: its holder's token and when it lapses. Only an in-flight record has one.
    /// Default: none.
    pub fn lease(mut self, owner: impl Into<String>, until: SystemTime) -> Self {
        self.record.lease_owner = Some(owner.into());
        self.record.lease_expires_at = Some(until);
        self
    }

    /// The final response. Default: none.
    pub fn response(mut self, response: SavedResponse) -> Self {
        self.record.response = Some(response);
        self
    }

    /// The request's method and URL. Default: none.
    pub fn request(mut self, method: impl Into<String>, url: impl Into<String>) -> Self {
        self.record.method = Some(method.into());
        self.record.url = Some(url.into());
        self
    }

    /// The last resolution. Default: none.
    pub fn resolution(mut self, note: ResolutionNote) -> Self {
        self.record.resolution = Some(note);
        self
    }

    /// The record.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the key or the lease holder is empty, when an
    /// in-flight record has no lease, or when a record that is not in flight has one (a
    /// finished run's lease is released).
    pub fn build(self) -> Result<OperationRecord, LedgerError> {
        let record = self.record;
        require("the key", &record.key)?;
        if let Some(owner) = &record.lease_owner {
            require("the lease holder", owner)?;
        }
        let in_flight = record.status == OperationStatus::InFlight;
        match (in_flight, record.lease_owner.is_some()) {
            (true, false) => Err(LedgerError::invalid(format!(
                "operation {} is in flight without a lease",
                record.key
            ))),
            (false, true) => Err(LedgerError::invalid(format!(
                "operation {} is {} but holds a lease",
                record.key, record.status
            ))),
            _ => Ok(record),
        }
    }
}

/// A request to claim an operation before its first attempt.
///
/// The fields are public to read; [`Claim::builder`] makes one (a ledger wrapper, a test).
/// [`may_take_over`](Self::may_take_over) states the take-over rule every [`Ledger`] keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The idempotency key.
    pub key: String,
    /// The operation's scope.
    pub scope: String,
    /// SHA-256 (hex) of the canonical request.
    pub fingerprint: String,
    /// This run's lease token: unique per run, so two runs in one process exclude each other.
    pub owner: String,
    /// The time of the claim.
    pub now: SystemTime,
    /// When this run's lease lapses unless renewed.
    pub lease_until: SystemTime,
    /// When a new row may be purged.
    pub expires_at: SystemTime,
    /// Rows first attempted at or before this instant are outside the reconcile window: they
    /// must not be taken over.
    pub window_cutoff: SystemTime,
    /// The request's method, recorded in a new row for reconcilers and operators.
    pub method: Option<String>,
    /// The request's URL without credentials, recorded in a new row.
    pub url: Option<String>,
}

impl Claim {
    /// A claim of `key` for the request with `fingerprint`, by the run with lease token
    /// `owner`, made at `now` and holding the lease until `lease_until`. The scope, the
    /// retention and the window are set on the builder.
    ///
    /// # Examples
    ///
    /// ```
    /// use idempotent_retry_ledger::Claim;
    /// use std::time::{Duration, SystemTime};
    ///
    /// let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
    /// let claim = Claim::builder("order-42", "9f86d0…", "worker-a/run-1", now, now + Duration::from_secs(60))
    ///     .scope("shop.order")
    ///     .expires_at(now + Duration::from_secs(7 * 86_400))
    ///     .window_cutoff(now - Duration::from_secs(600))
    ///     .build()?;
    /// assert_eq!(claim.key, "order-42");
    /// # Ok::<(), idempotent_retry_ledger::LedgerError>(())
    /// ```
    pub fn builder(
        key: impl Into<String>,
        fingerprint: impl Into<String>,
        owner: impl Into<String>,
        now: SystemTime,
        lease_until: SystemTime,
    ) -> ClaimBuilder {
        ClaimBuilder {
            claim: Claim {
                key: key.into(),
                scope: String::new(),
                fingerprint: fingerprint.into(),
                owner: owner.into(),
                now,
                lease_until,
                expires_at: lease_until,
                window_cutoff: SystemTime::UNIX_EPOCH,
                method: None,
                url: None,
            },
        }
    }

    /// Whether this claim may take `row` over:
    ///
    /// - a [`NotSent`](OperationStatus::NotSent) row, whatever its request and window: no
    ///   receiver has seen the key, so it is free;
    /// - a [`Queued`](OperationStatus::Queued) row, by the same request (fingerprint) only,
    ///   whatever its age: its window starts when it is first sent;
    /// - otherwise the same request (fingerprint), not
    ///   [`Succeeded`](OperationStatus::Succeeded), still inside the reconcile window
    ///   (`first_attempt_at` after [`window_cutoff`](Self::window_cutoff)), and not held by a
    ///   live lease (not in flight, or its lease lapsed at or before [`now`](Self::now)).
    ///
    /// A [`Ledger`] takes the row over exactly when this holds, checked and applied in one
    /// atomic step; the SQL ledgers state the same rule in their `UPDATE ... WHERE`.
    #[must_use]
    pub fn may_take_over(&self, row: &OperationRecord) -> bool {
        if row.status == OperationStatus::NotSent {
            return true;
        }
        if row.status == OperationStatus::Queued {
            // Its window starts at its first attempt, whenever that is.
            return row.fingerprint == self.fingerprint;
        }
        row.fingerprint == self.fingerprint
            && row.status != OperationStatus::Succeeded
            && crate::window::is_open(row.first_attempt_at, self.window_cutoff)
            && (row.status != OperationStatus::InFlight
                || row.lease_expires_at.is_none_or(|until| until <= self.now))
    }

    /// The row this claim inserts for a key that has none: in flight under its lease, no
    /// attempt yet. A [`Ledger`] outside this crate stores it when it finds no row.
    #[must_use]
    pub fn new_row(&self) -> OperationRecord {
        self.clone().into_new_row()
    }

    /// [`new_row`](Self::new_row), from a claim its ledger owns: the strings move into the
    /// row instead of being copied.
    #[must_use]
    pub fn into_new_row(self) -> OperationRecord {
        OperationRecord {
            key: self.key,
            scope: self.scope,
            fingerprint: self.fingerprint,
            status: OperationStatus::InFlight,
            attempts: 0,
            first_attempt_at: self.now,
            last_attempt_at: None,
            lease_owner: Some(self.owner),
            lease_expires_at: Some(self.lease_until),
            response: None,
            expires_at: self.expires_at,
            method: self.method,
            url: self.url,
            resolution: None,
        }
    }

    /// Takes `row` over (when [`may_take_over`](Self::may_take_over) allows it): in flight
    /// under this claim's lease, its saved response dropped. A
    /// [`NotSent`](OperationStatus::NotSent) or [`Queued`](OperationStatus::Queued) row
    /// becomes this claim's request: its scope,
    /// fingerprint, method and URL, a window from [`now`](Self::now), kept at least until
    /// [`expires_at`](Self::expires_at); its attempts and resolution stay. Such a row of the
    /// same request (fingerprint) keeps its own method and URL: a queued row's is the URL its
    /// dispatcher sends to, which a claim's (query values redacted) must not replace. Returns
    /// its status before. A [`Ledger`] outside this crate calls it on the row it stores, after
    /// [`may_take_over`](Self::may_take_over), in one atomic step.
    pub fn take_over(&self, row: &mut OperationRecord) -> OperationStatus {
        let previous = row.status;
        if matches!(previous, OperationStatus::NotSent | OperationStatus::Queued) {
            if row.fingerprint != self.fingerprint {
                row.method.clone_from(&self.method);
                row.url.clone_from(&self.url);
            }
            row.scope.clone_from(&self.scope);
            row.fingerprint.clone_from(&self.fingerprint);
            row.first_attempt_at = self.now;
            row.expires_at = row.expires_at.max(self.expires_at);
        }
        row.status = OperationStatus::InFlight;
        row.lease_owner = Some(self.owner.clone());
        row.lease_expires_at = Some(self.lease_until);
        row.response = None;
        previous
    }
}

/// Builds a [`Claim`]; made by [`Claim::builder`].
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | [`scope`](Self::scope) | empty |
/// | [`expires_at`](Self::expires_at) | the lease's end |
/// | [`window_cutoff`](Self::window_cutoff) | the Unix epoch (no row is outside the window) |
/// | [`request`](Self::request) ([`method`](Self::method), [`url`](Self::url)) | none |
#[derive(Debug, Clone)]
#[must_use]
pub struct ClaimBuilder {
    claim: Claim,
}

impl ClaimBuilder {
    /// The operation's scope. Default: empty.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.claim.scope = scope.into();
        self
    }

    /// When a row this claim inserts may be purged. Default: the lease's end.
    pub fn expires_at(mut self, at: SystemTime) -> Self {
        self.claim.expires_at = at;
        self
    }

    /// Rows first attempted at or before this instant are outside the reconcile window.
    /// Default: the Unix epoch.
    pub fn window_cutoff(mut self, cutoff: SystemTime) -> Self {
        self.claim.window_cutoff = cutoff;
        self
    }

    /// The request's method and URL (without credentials), for a new row: [`method`](Self::method)
    /// and [`url`](Self::url) at once. Default: none.
    pub fn request(self, method: impl Into<String>, url: impl Into<String>) -> Self {
        self.method(method).url(url)
    }

    /// The request's method, for a new row; alone, for a request whose URL a row cannot record
    /// (a relative URI names no server). Default: none.
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.claim.method = Some(method.into());
        self
    }

    /// The request's URL (without credentials), for a new row. Default: none.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.claim.url = Some(url.into());
        self
    }

    /// The claim.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the key or the lease token is empty, when the
    /// lease ends before the claim is made, or when the window cutoff is after it.
    pub fn build(self) -> Result<Claim, LedgerError> {
        let claim = self.claim;
        require("the key", &claim.key)?;
        require("the lease token", &claim.owner)?;
        if claim.lease_until < claim.now {
            return Err(LedgerError::invalid(format!(
                "the lease of operation {} ends before its claim",
                claim.key
            )));
        }
        if claim.window_cutoff > claim.now {
            return Err(LedgerError::invalid(format!(
                "the window cutoff of operation {} is after its claim",
                claim.key
            )));
        }
        Ok(claim)
    }
}

/// What a [`Ledger::claim`] found.
///
/// Its variants are built directly: `Claimed::New(record)`,
/// `Claimed::TakenOver { record, previous }`, `Claimed::Existing(record)`. The three are the
/// whole contract of a claim, so the enum is exhaustive: a match needs no wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// No row existed: one was inserted, in flight under this run's lease.
    New(OperationRecord),
    /// A row with the same fingerprint, not succeeded, inside the window, and either not in
    /// flight or under a lapsed lease, was taken over: it is now in flight under this run's
    /// lease, with its original `first_attempt_at` and `attempts`. `previous` is the status it
    /// had.
    TakenOver {
        /// The row after the take-over.
        record: OperationRecord,
        /// The status before the take-over.
        previous: OperationStatus,
    },
    /// A row exists that this run may not take: it is returned as it is.
    Existing(OperationRecord),
}

/// An attempt to record, by the run holding the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AttemptUpdate {
    /// The idempotency key.
    pub key: String,
    /// The run's lease token.
    pub owner: String,
    /// When the attempt ended.
    pub at: SystemTime,
    /// The renewed lease: past the wait and the next attempt, when one follows.
    pub lease_until: SystemTime,
}

impl AttemptUpdate {
    /// An attempt of `key` by the run holding lease token `owner`, ended `at`, renewing the
    /// lease until `lease_until`.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the key or the lease token is empty, or when the
    /// renewed lease ends before the attempt did.
    pub fn new(
        key: impl Into<String>,
        owner: impl Into<String>,
        at: SystemTime,
        lease_until: SystemTime,
    ) -> Result<Self, LedgerError> {
        let update = AttemptUpdate {
            key: key.into(),
            owner: owner.into(),
            at,
            lease_until,
        };
        require("the key", &update.key)?;
        require("the lease token", &update.owner)?;
        if update.lease_until < update.at {
            return Err(LedgerError::invalid(format!(
                "the renewed lease of operation {} ends before its attempt",
                update.key
            )));
        }
        Ok(update)
    }

    /// Writes this attempt to `row` as [`Ledger::record_attempt`] describes, if this run
    /// holds its lease: one more attempt, stamped, and the lease renewed.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`] when the run does not hold the lease (see
    /// [`OperationRecord::check_held_by`]); the row is unchanged.
    pub fn apply(&self, row: &mut OperationRecord) -> Result<(), LedgerError> {
        row.check_held_by(&self.key, &self.owner)?;
        row.attempts = row.attempts.saturating_add(1);
        row.last_attempt_at = Some(self.at);
        row.lease_expires_at = Some(self.lease_until);
        Ok(())
    }
}

/// The outcome of a run, written by the run holding the lease. Clears the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finish {
    /// The idempotency key.
    pub key: String,
    /// The run's lease token.
    pub owner: String,
    /// The operation's status now.
    pub status: OperationStatus,
    /// The final response, when there was one.
    pub response: Option<SavedResponse>,
    /// When the run's last attempt ended, if it was not written with
    /// [`record_attempt`](Ledger::record_attempt): the finish then counts it too (`attempts`
    /// one higher, `last_attempt_at` this time), in the same write. The run's last attempt
    /// is never followed by a wait, so no lease needs renewing for it: an operation of one
    /// attempt costs the claim and the finish, two writes.
    pub last_attempt_at: Option<SystemTime>,
}

impl Finish {
    /// The outcome of `key` written by the run holding lease token `owner`: its `status`, and
    /// the final `response` when there was one.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the key or the lease token is empty, or when the
    /// status is [`OperationStatus::InFlight`] (a finish releases the lease).
    pub fn new(
        key: impl Into<String>,
        owner: impl Into<String>,
        status: OperationStatus,
        response: Option<SavedResponse>,
    ) -> Result<Self, LedgerError> {
        let finish = Finish {
            key: key.into(),
            owner: owner.into(),
            status,
            response,
            last_attempt_at: None,
        };
        require("the key", &finish.key)?;
        require("the lease token", &finish.owner)?;
        if finish.status == OperationStatus::InFlight {
            return Err(LedgerError::invalid(format!(
                "operation {} cannot finish in flight",
                finish.key
            )));
        }
        Ok(finish)
    }

    /// This finish also counts the run's last attempt, which ended at `at` and was not
    /// recorded on its own (see [`last_attempt_at`](Self::last_attempt_at)).
    #[must_use]
    pub fn with_last_attempt(mut self, at: SystemTime) -> Self {
        self.last_attempt_at = Some(at);
        self
    }

    /// Writes this outcome to `row` as [`Ledger::finish`] describes, if this run holds its
    /// lease: the status and response, the last attempt counted when set, and the lease
    /// released.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`] when the run does not hold the lease (see
    /// [`OperationRecord::check_held_by`]); the row is unchanged.
    pub fn apply(&self, row: &mut OperationRecord) -> Result<(), LedgerError> {
        row.check_held_by(&self.key, &self.owner)?;
        row.status = self.status;
        row.lease_owner = None;
        row.lease_expires_at = None;
        row.response.clone_from(&self.response);
        if let Some(at) = self.last_attempt_at {
            row.attempts = row.attempts.saturating_add(1);
            row.last_attempt_at = Some(at);
        }
        Ok(())
    }
}

/// Durable storage for operations, one row per idempotency key.
///
/// [`MemoryLedger`] is the reference implementation; `SqliteLedger` and `PostgresLedger`
/// keep the same contract in SQL. Another store implements this trait and is proved with
/// `idempotent_retry_testkit::ledger_conformance`; `examples/map_ledger.rs` is a complete
/// implementation over a `HashMap`.
///
/// # The contract
///
/// - One row per key, one short transaction per method; no method waits on another run.
/// - [`claim`](Self::claim) is atomic: of concurrent claims of one key, at most one gets
///   [`Claimed::New`] or [`Claimed::TakenOver`], the others [`Claimed::Existing`].
/// - While a lease lasts only its holder writes; any other write fails with
///   [`LedgerErrorKind::LeaseLost`] and changes nothing. [`finish`](Self::finish) and
///   [`resolve`](Self::resolve) release it; [`claim_unresolved`](Self::claim_unresolved)
///   takes one as a claim does.
/// - A row is taken over only by a claim with the same fingerprint, inside its window, or
///   when it is [`NotSent`](OperationStatus::NotSent) ([`Claim::may_take_over`]);
///   `first_attempt_at`, `attempts` and `expires_at` survive take-overs (a `NotSent` row's
///   window starts again: [`claim`](Self::claim)).
/// - Only [`purge_batch`](Self::purge_batch) deletes rows, once `expires_at` has passed.
/// - A dropped call leaves the row as before the call or as the call would have, never
///   half-written.
/// - [`clock`](Self::clock) says whose clock the times are compared on: the caller's (the
///   instants in the requests, as they are) or the ledger's own (only the lengths between
///   them, from its own present; each request's `on_clock` is that view). A ledger shared by
///   hosts with clocks of their own compares on its own ([`LedgerClock`]).
///
/// # Errors
///
/// [`LedgerErrorKind::LeaseLost`] (the run does not hold the lease),
/// [`LedgerErrorKind::Unavailable`] (storage unreachable or unwritable, usually transient),
/// [`LedgerErrorKind::Corrupt`] (unreadable contents), [`LedgerErrorKind::InvalidInput`];
/// build them with [`LedgerError::new`] and [`with_source`](LedgerError::with_source).
///
/// The contract in full, the stages of one run, the SQL schema (version 3) and its
/// migrations: `docs/ledger.md`.
///
/// # Every method is required
///
/// A ledger that leaves out the reconciling and listing methods does not compile, so no
/// client finds out at run time that its ledger cannot settle an unknown outcome:
///
/// ```compile_fail,E0046
/// use idempotent_retry_ledger::{
///     AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerFuture, MemoryLedger,
///     OperationRecord, Renew,
/// };
/// use std::time::SystemTime;
///
/// #[derive(Debug)]
/// struct WithoutReconciling(MemoryLedger);
///
/// impl Ledger for WithoutReconciling {
///     fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed> {
///         self.0.claim(claim)
///     }
///     fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()> {
///         self.0.record_attempt(update)
///     }
///     fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()> {
///         self.0.renew(renew)
///     }
///     fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()> {
///         self.0.finish(finish)
///     }
///     fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>> {
///         self.0.get(key)
///     }
///     fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
///         self.0.purge_batch(now, limit)
///     }
///     fn clock(&self) -> LedgerFuture<'_, idempotent_retry_ledger::LedgerClock> {
///         self.0.clock()
///     }
///     // claim_unresolved, resolve and list missing: error E0046
/// }
/// ```
pub trait Ledger: Send + Sync + fmt::Debug + 'static {
    /// Whose clock this ledger compares times on: [`LedgerClock::Caller`], or
    /// [`LedgerClock::Own`] with its present as it answers. The client asks once when it first
    /// uses the ledger (and again now and then) to learn how far its own clock is from the
    /// ledger's. No default: a ledger says which it is.
    ///
    /// # Errors
    ///
    /// A [`LedgerError`] when an own clock cannot be read (the storage is unreachable).
    fn clock(&self) -> LedgerFuture<'_, LedgerClock>;

    /// Claims the operation, in one atomic step:
    ///
    /// - no row for the key: inserts one from the claim, in flight under its lease, with
    ///   `first_attempt_at` = [`now`](Claim::now), `attempts` 0, no response, and
    ///   [`expires_at`](Claim::expires_at); returns [`Claimed::New`];
    /// - a row [`Claim::may_take_over`] allows: sets it in flight under the claim's lease and
    ///   clears its response, keeping everything else, except that a
    ///   [`NotSent`](OperationStatus::NotSent) row also takes the claim's scope, fingerprint,
    ///   method and URL, `first_attempt_at` = [`now`](Claim::now) and `expires_at` = the later
    ///   of its own and the claim's; returns [`Claimed::TakenOver`] with the status it had;
    /// - any other row: changes nothing; returns it as [`Claimed::Existing`].
    ///
    /// # Errors
    ///
    /// A [`LedgerError`] when the storage cannot be read or written; nothing was claimed.
    fn claim<'a>(&'a self, claim: &'a Claim) -> LedgerFuture<'a, Claimed>;

    /// Counts one more attempt, stamps it, and renews the lease, if `owner` still holds it:
    /// `attempts` + 1 (saturating), `last_attempt_at` = [`at`](AttemptUpdate::at),
    /// `lease_expires_at` = [`lease_until`](AttemptUpdate::lease_until). The row stays in
    /// flight under the same holder.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`] when `owner` does not hold the lease (it lapsed and
    /// another run took the row, the run already finished, or there is no such row); the row
    /// is unchanged. Another [`LedgerError`] when the storage fails.
    fn record_attempt<'a>(&'a self, update: &'a AttemptUpdate) -> LedgerFuture<'a, ()>;

    /// Extends the lease, if `owner` still holds it: `lease_expires_at` =
    /// [`lease_until`](Renew::lease_until), nothing else. A lease that lapsed without another
    /// run taking the row is still held ([`Renew::apply`] is the rule). A run renews on its own
    /// timer while it is alive, so a short lease never expires under a live run.
    ///
    /// # Errors
    ///
    /// As for [`record_attempt`](Self::record_attempt).
    fn renew<'a>(&'a self, renew: &'a Renew) -> LedgerFuture<'a, ()>;

    /// Writes the outcome and releases the lease, if `owner` still holds it: `status` =
    /// [`Finish::status`], `response` = [`Finish::response`] (kept exactly: see
    /// [`SavedResponse`]), `lease_owner` and `lease_expires_at` cleared. With
    /// [`Finish::last_attempt_at`], also `attempts` + 1 (saturating) and `last_attempt_at` =
    /// that time, in the same write. The rest of the history (`first_attempt_at`, and
    /// `expires_at`) stays.
    ///
    /// # Errors
    ///
    /// As for [`record_attempt`](Self::record_attempt).
    fn finish<'a>(&'a self, finish: &'a Finish) -> LedgerFuture<'a, ()>;

    /// Reads one row, as the last write left it; `None` when there is none (never claimed,
    /// or purged).
    ///
    /// # Errors
    ///
    /// A [`LedgerError`] when the storage cannot be read, or [`LedgerErrorKind::Corrupt`]
    /// when a row cannot be decoded.
    fn get<'a>(&'a self, key: &'a str) -> LedgerFuture<'a, Option<OperationRecord>>;

    /// Deletes at most `limit` rows whose `expires_at` is at or before `now`, whatever their
    /// status, in one short transaction; returns how many. Rows not yet expired stay. A
    /// ledger on its [own clock](LedgerClock::Own) compares with its own present instead.
    ///
    /// # Errors
    ///
    /// A [`LedgerError`] when the storage fails; nothing was deleted.
    fn purge_batch(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64>;

    /// Deletes every row whose `expires_at` is at or before `now`, in batches of at most
    /// `limit` rows (each batch its own short transaction, so a large purge never holds a
    /// long lock), until a batch deletes fewer than `limit`. Returns how many were deleted.
    /// The provided method loops over [`purge_batch`](Self::purge_batch); an implementation
    /// that overrides it keeps the same result and errors.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when `limit` is 0; otherwise the first failing
    /// batch's error (earlier batches stay deleted).
    fn purge_expired(&self, now: SystemTime, limit: u32) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            if limit == 0 {
                return Err(LedgerError::invalid("purge limit must be at least 1"));
            }
            let mut total = 0u64;
            loop {
                let deleted = self.purge_batch(now, limit).await?;
                total = total.saturating_add(deleted);
                if deleted < u64::from(limit) {
                    return Ok(total);
                }
            }
        })
    }
    /// Holds an unresolved row while it is reconciled, in one atomic step, as
    /// [`claim`](Self::claim) holds a row while it is sent:
    ///
    /// - a row [`ReconcileClaim::may_take`] allows (unknown, or in flight under a lapsed lease):
    ///   sets it in flight under the claim's lease, keeping everything else (its response is
    ///   none already); returns [`Claimed::TakenOver`] with the status it had;
    /// - any other row: changes nothing; returns it as [`Claimed::Existing`];
    /// - no row: returns `None`.
    ///
    /// The lease then excludes every run and every other reconciler until
    /// [`resolve`](Self::resolve) (or [`finish`](Self::finish)) releases it, or it lapses.
    /// [`ReconcileClaim::may_take`] and [`ReconcileClaim::hold`] are the whole rule.
    ///
    /// # Errors
    ///
    /// A [`LedgerError`] when the storage fails, with nothing claimed.
    fn claim_unresolved<'a>(
        &'a self,
        claim: &'a ReconcileClaim,
    ) -> LedgerFuture<'a, Option<Claimed>>;

    /// Writes a reconciler's answer and releases the lease, if `owner` still holds it:
    /// `status` = [`Resolve::status`], `response` = [`Resolve::response`],
    /// `first_attempt_at` = [`Resolve::window_from`] when set, `expires_at` = the later of
    /// itself and [`Resolve::keep_until`] when set, the resolution = [`Resolve::note`] when set
    /// (kept as it was otherwise), `lease_owner` and `lease_expires_at` cleared; `attempts`
    /// and `last_attempt_at` stay ([`Resolve::apply`] is the rule).
    ///
    /// # Errors
    ///
    /// As for [`finish`](Self::finish).
    fn resolve<'a>(&'a self, resolve: &'a Resolve) -> LedgerFuture<'a, ()>;

    /// At most `limit` unresolved rows ([`Unknown`](OperationStatus::Unknown) or
    /// [`InFlight`](OperationStatus::InFlight), live leases included) first attempted at or
    /// before `older_than`, oldest first (ties by key). A read: nothing is held; a sweep holds
    /// each row with [`claim_unresolved`](Self::claim_unresolved) before it acts.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when `limit` is 0; a [`LedgerError`] when the
    /// storage cannot be read. The provided method asks [`list`](Self::list).
    fn unresolved(
        &self,
        limit: u32,
        older_than: SystemTime,
    ) -> LedgerFuture<'_, Vec<OperationRecord>> {
        let filter = ListFilter::new(limit).unresolved().older_than(older_than);
        Box::pin(async move { self.list(&filter).await })
    }

    /// The rows `filter` selects, oldest first (ties by key), at most its limit: what operators
    /// list ([`ListFilter::apply`] is the rule, for a store scanned in memory).
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the limit is 0; a [`LedgerError`] when the
    /// storage cannot be read.
    fn list<'a>(&'a self, filter: &'a ListFilter) -> LedgerFuture<'a, Vec<OperationRecord>>;

    /// The operations queued through the outbox that `query` selects, oldest due first, at
    /// most its limit ([`outbox::DueQuery`]: queued rows whose time has come, rows a
    /// dispatcher took and died sending, rows no receiver has seen some time after their last
    /// attempt, and when asked rows whose outcome is unknown). A dispatcher sends each through
    /// the client, whose claim takes the row.
    ///
    /// # Errors
    ///
    /// The default: [`LedgerErrorKind::InvalidInput`], for a ledger that keeps no outbox
    /// (`MemoryLedger`, which no caller's transaction can write). A [`LedgerError`] when the
    /// storage cannot be read.
    fn due<'a>(
        &'a self,
        query: &'a outbox::DueQuery,
    ) -> LedgerFuture<'a, Vec<outbox::QueuedOperation>> {
        let _ = query;
        Box::pin(std::future::ready(Err(LedgerError::invalid(
            "this ledger keeps no outbox: queue operations in a SqliteLedger or a \
             PostgresLedger, in the caller's own transaction",
        ))))
    }

    /// Takes the rows [`due`](Self::due) would select (at most the query's limit, oldest due
    /// first) in one atomic step, each held under `take.owner`'s lease by the rule of
    /// [`outbox::TakeDue`], skipping rows another dispatcher is taking at the same moment: a
    /// dispatcher's read, so that each row it sends is already its own and no send pays a
    /// claim of its own.
    ///
    /// # Errors
    ///
    /// As [`due`](Self::due); nothing is taken on an error.
    fn take_due<'a>(&'a self, take: &'a outbox::TakeDue) -> LedgerFuture<'a, Vec<outbox::Taken>> {
        let _ = take;
        Box::pin(std::future::ready(Err(LedgerError::invalid(
            "this ledger keeps no outbox: queue operations in a SqliteLedger or a \
             PostgresLedger, in the caller's own transaction",
        ))))
    }

    /// How many operations wait in the outbox (queued, not yet taken) and how long the oldest
    /// has waited, at `now` (on the ledger's clock when it has one): a dispatcher's metrics.
    ///
    /// # Errors
    ///
    /// As [`due`](Self::due).
    fn backlog(&self, now: SystemTime) -> LedgerFuture<'_, outbox::Backlog> {
        let _ = now;
        Box::pin(std::future::ready(Err(LedgerError::invalid(
            "this ledger keeps no outbox: queue operations in a SqliteLedger or a \
             PostgresLedger, in the caller's own transaction",
        ))))
    }
}

/// Which rows [`Ledger::list`] returns: every condition set must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// At most this many rows.
    pub limit: u32,
    /// Only rows with this status.
    pub status: Option<OperationStatus>,
    /// Only unresolved rows (unknown or in flight).
    pub unresolved: bool,
    /// Only rows of this scope.
    pub scope: Option<String>,
    /// Only rows first attempted at or before this time, on the ledger's clock (the times it
    /// shows).
    pub older_than: Option<SystemTime>,
    /// Only rows whose key starts with this.
    pub key_prefix: Option<String>,
}

impl ListFilter {
    /// Every row, at most `limit` of them.
    #[must_use]
    pub fn new(limit: u32) -> Self {
        ListFilter {
            limit,
            status: None,
            unresolved: false,
            scope: None,
            older_than: None,
            key_prefix: None,
        }
    }

    /// Only rows with `status`.
    #[must_use]
    pub fn status(mut self, status: OperationStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Only unresolved rows.
    #[must_use]
    pub fn unresolved(mut self) -> Self {
        self.unresolved = true;
        self
    }

    /// Only rows of `scope`.
    #[must_use]
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// Only rows first attempted at or before `at`.
    #[must_use]
    pub fn older_than(mut self, at: SystemTime) -> Self {
        self.older_than = Some(at);
        self
    }

    /// Only rows whose key starts with `prefix`, compared as bytes: no case folding, no
    /// pattern characters. The SQL ledgers read a range of the key's order (SQLite through the
    /// key's index), not every row.
    #[must_use]
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Whether `row` is selected (the limit aside): the rule every ledger applies.
    #[must_use]
    pub fn selects(&self, row: &OperationRecord) -> bool {
        self.status.is_none_or(|status| row.status == status)
            && (!self.unresolved || row.status.is_unresolved())
            && self.scope.as_ref().is_none_or(|scope| &row.scope == scope)
            && self.older_than.is_none_or(|at| row.first_attempt_at <= at)
            && self
                .key_prefix
                .as_ref()
                .is_none_or(|prefix| row.key.starts_with(prefix.as_str()))
    }

    /// Refuses a limit of 0.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the limit is 0.
    pub fn check(&self) -> Result<(), LedgerError> {
        if self.limit == 0 {
            Err(LedgerError::invalid("list limit must be at least 1"))
        } else {
            Ok(())
        }
    }

    /// What [`Ledger::list`] answers from `rows`, the whole store: the rows this filter
    /// [`selects`](Self::selects), oldest first (ties by key), at most its limit. For a
    /// ledger that can scan its storage in memory.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`] when the limit is 0.
    pub fn apply<'a>(
        &self,
        rows: impl IntoIterator<Item = &'a OperationRecord>,
    ) -> Result<Vec<OperationRecord>, LedgerError> {
        self.check()?;
        let mut listed: Vec<OperationRecord> = rows
            .into_iter()
            .filter(|row| self.selects(row))
            .cloned()
            .collect();
        listed.sort_by(|a, b| (a.first_attempt_at, &a.key).cmp(&(b.first_attempt_at, &b.key)));
        listed.truncate(usize::try_from(self.limit).unwrap_or(usize::MAX));
        Ok(listed)
    }
}

/// Milliseconds since the Unix epoch, saturating; negative before it.
#[doc(hidden)]
pub fn to_millis(at: SystemTime) -> i64 {
    match at.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    }
}

/// The inverse of [`to_millis`].
#[doc(hidden)]
pub fn from_millis(ms: i64) -> SystemTime {
    let magnitude = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        SystemTime::UNIX_EPOCH
            .checked_add(magnitude)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    } else {
        SystemTime::UNIX_EPOCH
            .checked_sub(magnitude)
            .unwrap_or(SystemTime::UNIX_EPOCH)
    }
}

/// The latest time a ledger stores: `i64::MAX` milliseconds after the epoch (the largest
/// [`to_millis`] value), or the latest the platform's `SystemTime` holds below that.
fn far_future() -> SystemTime {
    let mut ms = i64::MAX.unsigned_abs();
    loop {
        if let Some(at) = SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms)) {
            return at;
        }
        // A platform whose `SystemTime` ends sooner: halve until it fits (the epoch always does).
        ms /= 2;
    }
}

/// Adds a duration to a time, saturating at the latest time a ledger stores. A lease or a
/// retention too long to represent (`Duration::MAX`) therefore lasts "forever", as asked,
/// instead of panicking or wrapping to the present (which would expire the row at once).
#[doc(hidden)]
pub fn later(at: SystemTime, by: Duration) -> SystemTime {
    let cap = far_future().max(at);
    at.checked_add(by).map_or(cap, |sum| sum.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_trip_both_sides_of_the_epoch() {
        for ms in [0i64, 1, 1_704_067_200_123, -1, -86_400_000] {
            assert_eq!(to_millis(from_millis(ms)), ms);
        }
        assert_eq!(
            to_millis(SystemTime::UNIX_EPOCH + Duration::from_nanos(1_999_999)),
            1
        );
    }

    #[test]
    fn later_saturates_far_in_the_future_never_at_the_present() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        assert_eq!(
            later(now, Duration::from_secs(60)),
            now + Duration::from_secs(60)
        );
        assert_eq!(later(now, Duration::ZERO), now);
        let forever = later(now, Duration::MAX);
        assert!(forever > now + Duration::from_secs(1_000 * 365 * 86_400));
        assert_eq!(to_millis(forever), i64::MAX);
        assert_eq!(from_millis(to_millis(forever)), forever);
        // Beyond the cap, a sum is clamped to it; a time already past it stays put.
        assert_eq!(later(now, Duration::from_secs(u64::MAX / 2)), forever);
        assert_eq!(later(forever, Duration::MAX), forever);
        assert_eq!(later(forever, Duration::from_secs(1)), forever);
    }

    #[test]
    fn statuses_round_trip_and_refuse_garbage() {
        for status in [
            OperationStatus::InFlight,
            OperationStatus::Succeeded,
            OperationStatus::FailedFinal,
            OperationStatus::Unknown,
            OperationStatus::NotSent,
        ] {
            assert_eq!(
                status.as_str().parse::<OperationStatus>().ok(),
                Some(status)
            );
            assert_eq!(status.to_string(), status.as_str());
            assert_eq!(
                status.is_unresolved(),
                matches!(status, OperationStatus::Unknown | OperationStatus::InFlight)
            );
        }
        for reached in [true, false] {
            assert_eq!(
                OperationStatus::unfinished(true, reached),
                OperationStatus::Unknown
            );
        }
        assert_eq!(
            OperationStatus::unfinished(false, true),
            OperationStatus::FailedFinal
        );
        assert_eq!(
            OperationStatus::unfinished(false, false),
            OperationStatus::NotSent
        );
        let err = "done".parse::<OperationStatus>().expect_err("not a status");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt);
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
    }

    fn refused<T: fmt::Debug>(result: Result<T, LedgerError>, says: &str) {
        let err = result.expect_err(says);
        assert_eq!(err.kind(), LedgerErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }

    #[test]
    fn a_claim_defaults_to_no_scope_retention_to_its_lease_and_no_window_cutoff() {
        let claim = Claim::builder("k", "f", "w", t(0), t(0))
            .build()
            .expect("valid");
        assert_eq!(claim.scope, "");
        assert_eq!(claim.expires_at, t(0), "the lease's end");
        assert_eq!(claim.window_cutoff, SystemTime::UNIX_EPOCH);
        let claim = Claim::builder("k", "f", "w", t(0), t(60))
            .scope("s")
            .expires_at(t(3600))
            .window_cutoff(t(0))
            .build()
            .expect("valid");
        assert_eq!(
            (claim.scope.as_str(), claim.expires_at, claim.window_cutoff),
            ("s", t(3600), t(0))
        );
    }

    #[test]
    fn a_claim_records_no_request_by_default_and_the_method_without_a_url() {
        let request = |claim: Claim| (claim.method, claim.url);
        let build = |builder: ClaimBuilder| request(builder.build().expect("valid"));
        let builder = || Claim::builder("k", "f", "w", t(0), t(60));
        assert_eq!(build(builder()), (None, None));
        assert_eq!(
            build(builder().method("PUT")),
            (Some("PUT".to_owned()), None)
        );
        assert_eq!(
            build(builder().url("https://api.example.com/v1/charges")),
            (None, Some("https://api.example.com/v1/charges".to_owned()))
        );
        assert_eq!(
            build(builder().request("POST", "https://api.example.com/v1/charges")),
            build(
                builder()
                    .method("POST")
                    .url("https://api.example.com/v1/charges")
            )
        );
    }

    #[test]
    fn a_claim_refuses_empty_names_a_lease_before_it_and_a_cutoff_after_it() {
        refused(
            Claim::builder("", "f", "w", t(0), t(60)).build(),
            "the key must not be empty",
        );
        refused(
            Claim::builder("k", "f", "", t(0), t(60)).build(),
            "the lease token must not be empty",
        );
        refused(
            Claim::builder("k", "f", "w", t(10), t(9)).build(),
            "the lease of operation k ends before its claim",
        );
        refused(
            Claim::builder("k", "f", "w", t(10), t(60))
                .window_cutoff(t(11))
                .build(),
            "the window cutoff of operation k is after its claim",
        );
    }

    #[test]
    fn a_record_refuses_a_status_and_a_lease_that_disagree() {
        let record = OperationRecord::builder("k", "f", t(0), t(3600))
            .status(OperationStatus::Succeeded)
            .attempts(3)
            .last_attempt_at(t(20))
            .response(SavedResponse::new(200, Vec::new(), None))
            .build()
            .expect("valid");
        assert_eq!(record.attempts, 3);
        assert_eq!(record.last_attempt_at, Some(t(20)));
        assert_eq!(record.lease_owner, None);
        refused(
            OperationRecord::builder("k", "f", t(0), t(3600)).build(),
            "operation k is in flight without a lease",
        );
        refused(
            OperationRecord::builder("k", "f", t(0), t(3600))
                .status(OperationStatus::Unknown)
                .lease("w", t(60))
                .build(),
            "operation k is unknown but holds a lease",
        );
        refused(
            OperationRecord::builder("", "f", t(0), t(3600))
                .lease("w", t(60))
                .build(),
            "the key must not be empty",
        );
        refused(
            OperationRecord::builder("k", "f", t(0), t(3600))
                .lease("", t(60))
                .build(),
            "the lease holder must not be empty",
        );
    }

    #[test]
    fn updates_and_finishes_refuse_what_no_run_can_write() {
        let update =
            AttemptUpdate::new("k", "w", t(5), t(5)).expect("a lease to the attempt's end");
        assert_eq!((update.at, update.lease_until), (t(5), t(5)));
        refused(
            AttemptUpdate::new("k", "w", t(5), t(4)),
            "the renewed lease of operation k ends before its attempt",
        );
        refused(
            AttemptUpdate::new("k", "", t(5), t(6)),
            "the lease token must not be empty",
        );
        refused(
            AttemptUpdate::new("", "w", t(5), t(6)),
            "the key must not be empty",
        );
        let finish = Finish::new("k", "w", OperationStatus::FailedFinal, None).expect("valid");
        assert_eq!(finish.status, OperationStatus::FailedFinal);
        refused(
            Finish::new("k", "w", OperationStatus::InFlight, None),
            "operation k cannot finish in flight",
        );
        refused(
            Finish::new("k", "", OperationStatus::Unknown, None),
            "the lease token must not be empty",
        );
    }

    #[test]
    fn the_take_over_rule_at_its_edges() {
        let claim = |now: u64, cutoff: SystemTime, fingerprint: &str| {
            Claim::builder("k", fingerprint, "w2", t(now), t(now + 60))
                .window_cutoff(cutoff)
                .build()
                .expect("valid")
        };
        let held = OperationRecord::builder("k", "f", t(0), t(3600))
            .lease("w1", t(60))
            .build()
            .expect("valid");
        let open = t(0) - Duration::from_secs(1);
        assert!(!claim(59, open, "f").may_take_over(&held), "a live lease");
        assert!(
            claim(60, open, "f").may_take_over(&held),
            "lapsed at its expiry"
        );
        assert!(
            !claim(60, open, "g").may_take_over(&held),
            "another request"
        );
        assert!(
            !claim(60, t(0), "f").may_take_over(&held),
            "first attempted at the cutoff"
        );
        for (status, taken) in [
            (OperationStatus::Unknown, true),
            (OperationStatus::FailedFinal, true),
            (OperationStatus::Succeeded, false),
            (OperationStatus::NotSent, true),
        ] {
            let row = OperationRecord::builder("k", "f", t(0), t(3600))
                .status(status)
                .build()
                .expect("valid");
            assert_eq!(claim(1, open, "f").may_take_over(&row), taken, "{status}");
        }
    }

    #[test]
    fn a_row_that_reached_no_receiver_is_taken_by_any_request_in_a_new_window() {
        let row = OperationRecord::builder("k", "f", t(0), t(3600))
            .status(OperationStatus::NotSent)
            .scope("shop.charge")
            .build()
            .expect("valid");
        // Another request, long after the first one's window closed.
        let claim = Claim::builder("k", "g", "w2", t(7200), t(7260))
            .scope("shop.charge.eu")
            .window_cutoff(t(3600))
            .expires_at(t(90_000))
            .request("POST", "http://127.0.0.1:8081/charges")
            .build()
            .expect("valid");
        assert!(claim.may_take_over(&row));
        let mut taken = row.clone();
        taken.attempts = 3;
        assert_eq!(claim.take_over(&mut taken), OperationStatus::NotSent);
        assert_eq!(taken.status, OperationStatus::InFlight);
        assert_eq!(taken.fingerprint, "g");
        assert_eq!(taken.scope, "shop.charge.eu");
        assert_eq!(taken.url.as_deref(), Some("http://127.0.0.1:8081/charges"));
        assert_eq!(taken.first_attempt_at, t(7200), "a new window");
        assert_eq!(taken.expires_at, t(90_000));
        assert_eq!(taken.attempts, 3, "the history stays");
        // A queued row taken by its own request keeps the URL its dispatcher sends to.
        let queued = OperationRecord {
            status: OperationStatus::Queued,
            fingerprint: "g".to_owned(),
            url: Some("http://127.0.0.1:8081/charges?page=2".to_owned()),
            ..row.clone()
        };
        let mut taken = queued.clone();
        assert_eq!(claim.take_over(&mut taken), OperationStatus::Queued);
        assert_eq!(taken.url, queued.url);
        assert_eq!(taken.status, OperationStatus::InFlight);
        // A row that reached a receiver keeps its request.
        for status in [OperationStatus::FailedFinal, OperationStatus::Unknown] {
            let reached = OperationRecord {
                status,
                ..row.clone()
            };
            assert!(!claim.may_take_over(&reached), "{status}");
        }
    }
}
