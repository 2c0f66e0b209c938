//! Operations queued in the caller's own transaction (the outbox): the row a store inserts
//! beside the caller's data, and the due rows a dispatcher reads back to send.

use std::time::{Duration, SystemTime};

use super::{LedgerError, OperationRecord, OperationStatus};

/// An operation to queue: the request as it will be sent (its credentials excepted: those are
/// added at send time), under its key, for a store to insert in the caller's transaction and
/// for a dispatcher to read back when it is due.
///
/// Built by `idempotent_retry::outbox::Enqueue`, which computes the fingerprint the client
/// computes when it sends the request, so the dispatcher's send takes this row over.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedOperation {
    /// The idempotency key it is sent under.
    pub key: String,
    /// The ledger scope (retention, reconcilers).
    pub scope: String,
    /// The request's fingerprint, as the client computes it.
    pub fingerprint: String,
    /// The request's method.
    pub method: String,
    /// The request's absolute URL, without credentials.
    pub url: String,
    /// The headers sent with it, in order; never credentials.
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte (empty for none).
    pub body: Vec<u8>,
    /// When it was queued: on the store's clock when it has one
    /// ([`LedgerClock::Own`](super::LedgerClock::Own)), otherwise the caller's.
    pub queued_at: SystemTime,
    /// Not sent before this instant (on the same clock as `queued_at`).
    pub not_before: SystemTime,
    /// How long the row is kept after its due time, at least (it is never purged while
    /// queued).
    pub retention: Duration,
    /// Its status when it was read back: [`Queued`](OperationStatus::Queued), or
    /// [`InFlight`](OperationStatus::InFlight) under a lapsed lease (a dispatcher died sending
    /// it).
    pub status: OperationStatus,
}

impl QueuedOperation {
    /// An operation to queue now, due at once, kept a day after it is due.
    #[must_use]
    pub fn new(
        key: impl Into<String>,
        fingerprint: impl Into<String>,
        (method, url): (impl Into<String>, impl Into<String>),
        queued_at: SystemTime,
    ) -> Self {
        QueuedOperation {
            key: key.into(),
            scope: String::new(),
            fingerprint: fingerprint.into(),
            method: method.into(),
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            queued_at,
            not_before: queued_at,
            retention: Duration::from_secs(86_400),
            status: OperationStatus::Queued,
        }
    }

    /// The headers, as the store keeps them: JSON of `[name, value]` pairs.
    #[must_use]
    pub fn headers_json(&self) -> String {
        // Serializing pairs of strings cannot fail.
        serde_json::to_string(&self.headers).unwrap_or_else(|_| "[]".to_owned())
    }

    /// Headers as [`headers_json`](Self::headers_json) wrote them.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when the text is not
    /// such JSON.
    pub fn headers_from_json(key: &str, json: &str) -> Result<Vec<(String, String)>, LedgerError> {
        serde_json::from_str(json).map_err(|err| {
            LedgerError::corrupt(format!("queued row {key}: request headers")).with_source(err)
        })
    }
}

/// What an enqueue found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Enqueued {
    /// The row is inserted in the caller's transaction: delivered once that commits.
    Queued,
    /// The key already had a row for the same request (an enqueue retried with its
    /// transaction, or the operation already sent): nothing was written; its status now.
    Already(OperationStatus),
}

/// The error for a key whose row is another request's.
#[must_use]
pub fn key_taken(key: &str, status: &str) -> LedgerError {
    LedgerError::invalid(format!(
        "idempotency key {key} is already the ledger's for another request (status {status}): \
         queue this operation under a key of its own"
    ))
}

/// The error for a store whose table is missing or older than the outbox.
#[must_use]
pub fn not_migrated(source: impl std::fmt::Display) -> LedgerError {
    LedgerError::corrupt(format!(
        "cannot queue the operation: the ledger's table is missing or older than the outbox \
         ({source}); run the ledger's `migrate()` (or `idempotent-retry-ledger migrate`) once"
    ))
}

/// Which queued operations [`Ledger::due`](super::Ledger::due) returns.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`not_sent_after`](Self::not_sent_after) | 30 s |
/// | [`unknown_after`](Self::unknown_after) | never (unknown outcomes are the reconcilers') |
/// | [`queued_only`](Self::queued_only) | false: every kind of due row |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DueQuery {
    /// The present, on the caller's clock (a ledger with its own clock uses that instead).
    pub now: SystemTime,
    /// At most this many rows.
    pub limit: u32,
    /// A row no receiver has seen (`not_sent`: every attempt failed to connect, or it was
    /// released) is due again this long after its last attempt.
    pub not_sent_after: Duration,
    /// A row whose outcome is unknown is due again this long after its last attempt, to be
    /// sent again under its key; `None`: never.
    pub unknown_after: Option<Duration>,
    /// Only queued rows whose time has come: a ledger may then leave out the rows under a
    /// lapsed lease, the `not_sent` ones and the unknown ones (each a read of its own in
    /// SQLite; in PostgreSQL, reads through the status index, which keeps the entries of rows
    /// that have moved on until a vacuum), which a dispatcher reads now and then rather than
    /// at every read. Both SQL ledgers honour it.
    pub queued_only: bool,
}

impl DueQuery {
    /// At most `limit` rows due at `now`, with the defaults above.
    #[must_use]
    pub fn new(now: SystemTime, limit: u32) -> Self {
        DueQuery {
            now,
            limit,
            not_sent_after: Duration::from_secs(30),
            unknown_after: None,
            queued_only: false,
        }
    }

    /// See [`queued_only`](Self::queued_only).
    #[must_use]
    pub fn queued_only(mut self, only: bool) -> Self {
        self.queued_only = only;
        self
    }

    /// See [`not_sent_after`](Self::not_sent_after).
    #[must_use]
    pub fn not_sent_after(mut self, after: Duration) -> Self {
        self.not_sent_after = after;
        self
    }

    /// See [`unknown_after`](Self::unknown_after).
    #[must_use]
    pub fn unknown_after(mut self, after: Option<Duration>) -> Self {
        self.unknown_after = after;
        self
    }

    /// [`not_sent_after`](Self::not_sent_after) in milliseconds.
    #[must_use]
    pub fn not_sent_after_ms(&self) -> i64 {
        i64::try_from(self.not_sent_after.as_millis()).unwrap_or(i64::MAX)
    }

    /// [`unknown_after`](Self::unknown_after) in milliseconds.
    #[must_use]
    pub fn unknown_after_ms(&self) -> Option<i64> {
        self.unknown_after
            .map(|after| i64::try_from(after.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The operations waiting in the outbox: what [`Ledger::backlog`](super::Ledger::backlog)
/// answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Backlog {
    /// Rows queued and not yet taken by a dispatcher (due or not).
    pub queued: u64,
    /// How long the oldest of them has waited since it was queued; `None` without one.
    pub oldest_age: Option<Duration>,
}

impl Backlog {
    /// A backlog of `queued` rows, the oldest queued `oldest_age` ago.
    #[must_use]
    pub fn new(queued: u64, oldest_age: Option<Duration>) -> Self {
        Backlog { queued, oldest_age }
    }
}

/// Due operations to take in one step, each held under `owner`'s lease for a dispatcher's
/// sends: what [`Ledger::take_due`](super::Ledger::take_due) does with a [`DueQuery`].
///
/// A row is taken by the rule a claim takes a row over by
/// ([`Claim::may_take_over`](super::Claim::may_take_over)): a queued or not-sent row starts
/// its window at [`now`](DueQuery::now) and is kept at least until `now + retention`; a row
/// in flight under a lapsed lease, or unknown, is taken only inside its window (first
/// attempted after `window_cutoff`), its window kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TakeDue {
    /// Which rows, how many, at which present.
    pub query: DueQuery,
    /// The lease token every taken row is held under (one per dispatcher read).
    pub owner: String,
    /// Each taken row's lease ends this long after `query.now`.
    pub lease: Duration,
    /// A row whose window starts now is kept at least this long.
    pub retention: Duration,
    /// Rows first attempted at or before this instant are outside their window: not taken.
    pub window_cutoff: SystemTime,
}

impl TakeDue {
    /// Takes the rows `query` selects under `owner` for `lease`.
    #[must_use]
    pub fn new(query: DueQuery, owner: impl Into<String>, lease: Duration) -> Self {
        TakeDue {
            query,
            owner: owner.into(),
            lease,
            retention: Duration::from_secs(2 * 86_400),
            window_cutoff: SystemTime::UNIX_EPOCH,
        }
    }

    /// See [`retention`](Self::retention). Default: two days.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// See [`window_cutoff`](Self::window_cutoff). Default: the Unix epoch (every row is
    /// inside its window).
    #[must_use]
    pub fn window_cutoff(mut self, cutoff: SystemTime) -> Self {
        self.window_cutoff = cutoff;
        self
    }

    /// Whether a row whose status was `status` starts a new window when taken: nobody has
    /// seen its key.
    #[must_use]
    pub fn is_fresh(status: OperationStatus) -> bool {
        matches!(status, OperationStatus::Queued | OperationStatus::NotSent)
    }

    /// Takes `row` (one [`Ledger::due`](super::Ledger::due) selected under this take's
    /// query): in flight under this take's lease, its saved response dropped, a fresh row's
    /// window starting now. Returns its status before. A ledger that scans rows in memory
    /// applies this; the SQL ledgers state it in their `UPDATE`.
    pub fn take(&self, row: &mut OperationRecord) -> OperationStatus {
        let previous = row.status;
        if Self::is_fresh(previous) {
            row.first_attempt_at = self.query.now;
            row.expires_at = row
                .expires_at
                .max(super::later(self.query.now, self.retention));
        }
        row.status = OperationStatus::InFlight;
        row.lease_owner = Some(self.owner.clone());
        row.lease_expires_at = Some(super::later(self.query.now, self.lease));
        row.response = None;
        previous
    }
}

/// One row [`Ledger::take_due`](super::Ledger::take_due) took: the request to send, the row
/// as taken (in flight under the take's owner), and its status before.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Taken {
    /// The request, as it was queued.
    pub operation: QueuedOperation,
    /// The row as it is now.
    pub record: OperationRecord,
    /// Its status before it was taken.
    pub previous: OperationStatus,
}

impl Taken {
    /// A taken row.
    #[must_use]
    pub fn new(
        operation: QueuedOperation,
        record: OperationRecord,
        previous: OperationStatus,
    ) -> Self {
        Taken {
            operation,
            record,
            previous,
        }
    }
}
