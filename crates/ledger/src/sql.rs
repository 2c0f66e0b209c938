//! What the SQL ledgers share: the table, the column list, the schema version and the steps
//! that reach it, and turning a row into a record.

use std::time::SystemTime;

use super::{
    LedgerError, OperationRecord, OperationStatus, ResolutionKind, ResolutionNote, SavedResponse,
    from_millis, to_millis,
};

/// The ledger's table.
pub const TABLE: &str = "idempotent_operations";

/// The schema version this crate reads and writes: the table shape `schema` creates is
/// version 1. A change to the shape raises it by one and appends a step to [`STEPS`].
pub const SCHEMA_VERSION: u32 = 8;

/// Where PostgreSQL keeps the version: a table of one row (SQLite uses `PRAGMA user_version`).
pub const VERSION_TABLE: &str = "idempotent_operations_schema";

/// The SQL details a migration step may depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// The type of a byte-string column.
    fn bytes_type(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }
}

/// One migration step: the statements that take a store from version `from` to `from + 1`.
/// Version 0 is a store with no version recorded: a new one, or one created by the 0.1
/// `migrate`, which did not record a version.
///
/// Each step runs in a transaction of its own that also records the version it reaches, so a
/// store is always at a version whose shape it has, even when a later step fails.
#[derive(Debug)]
pub struct Step {
    /// The version the step starts from.
    pub from: u32,
    /// Columns the step adds to the table, each only if it is missing (a store whose version
    /// was lost may have them already): name and type. They are added before the statements.
    pub columns: &'static [(&'static str, &'static str)],
    /// The statements, in order, for a dialect.
    pub statements: fn(Dialect) -> Vec<String>,
    /// Whether the step then redacts the URLs already stored ([`REDACT_SELECT`],
    /// [`redact_update`], [`redacted_urls`]), a rewrite SQL alone cannot do.
    pub redact_urls: bool,
}

impl Step {
    /// The version the step reaches.
    pub fn to(&self) -> u32 {
        self.from + 1
    }
}

/// Every step, oldest first: `STEPS[n]` goes from version `n` to `n + 1`, so the last one ends
/// at [`SCHEMA_VERSION`].
pub const STEPS: &[Step] = &[
    Step {
        from: 0,
        // `IF NOT EXISTS` makes one step serve both kinds of version-0 store: a new one gets the
        // table and the index; a 0.1 one already has both and keeps its rows. The columns are
        // checked with [`probe`] once the last step has run.
        columns: &[],
        statements: |dialect| vec![schema(dialect.bytes_type()), index()],
        redact_urls: false,
    },
    Step {
        from: 1,
        // Reconciling: what the request was (for reconcilers and operators), and the last
        // resolution of an unknown outcome (how, by whom, when, why). Every column may be
        // NULL, so the rows already there are kept as they are; and an index for sweeps of
        // unresolved rows.
        columns: &[
            ("method", "TEXT"),
            ("url", "TEXT"),
            ("resolution", "TEXT"),
            ("resolved_by", "TEXT"),
            ("resolved_at", "BIGINT"),
            ("resolution_reason", "TEXT"),
        ],
        statements: |_| {
            vec![format!(
                "CREATE INDEX IF NOT EXISTS {TABLE}_status ON {TABLE} (status, first_attempt_at)"
            )]
        },
        redact_urls: false,
    },
    Step {
        from: 2,
        // The `not_sent` status (no attempt reached a receiver: the key is free) and the
        // `released` resolution. The shape is the same; the version says that rows may hold
        // them, so a release that cannot read them refuses the store instead of failing on a
        // row.
        columns: &[],
        statements: |_| Vec::new(),
        redact_urls: false,
    },
    Step {
        from: 3,
        // The URL that answered when a redirect was followed to another one: NULL for every
        // row already there, whose answers came from their request's URL or were not kept.
        columns: &[("response_url", "TEXT")],
        statements: |_| Vec::new(),
        redact_urls: false,
    },
    Step {
        from: 4,
        // The outbox: a row queued in the caller's transaction keeps its request (credentials
        // excepted) and when it is due; NULL in every other row. The dispatchers' reads of
        // queued rows go through a partial index of the queued ones alone (small: a row leaves
        // it when it is taken), the other due rows through the status index of version 2;
        // the view is what callers read in their own SQL.
        columns: &[
            ("queued_at", "BIGINT"),
            ("not_before", "BIGINT"),
            ("request_headers", "TEXT"),
            ("request_body", BYTES),
        ],
        statements: |dialect| {
            vec![
                format!(
                    "CREATE INDEX IF NOT EXISTS {TABLE}_queued ON {TABLE} (not_before, key) \
                     WHERE status = 'queued'"
                ),
                outbox_view(dialect),
            ]
        },
        redact_urls: false,
    },
    Step {
        from: 5,
        // SQLite: the expiry and status indexes leave queued rows out (`status <> 'queued'`),
        // so an enqueue writes its row to the table, the key's index and the queued index
        // alone, and its commit writes two pages fewer; a row enters both when it is taken.
        // The purge already skips queued rows, and every statement that reads rows of another
        // status through the status index says `status <> 'queued'` (SQLite uses a partial
        // index only for a statement that repeats its condition). PostgreSQL keeps its
        // indexes: its statements bind the status as a parameter, which a partial index's
        // condition cannot be proved from.
        columns: &[],
        statements: |dialect| match dialect {
            Dialect::Sqlite => vec![
                format!("DROP INDEX IF EXISTS {TABLE}_expires_at"),
                format!(
                    "CREATE INDEX {TABLE}_expires_at ON {TABLE} (expires_at) WHERE {NOT_QUEUED}"
                ),
                format!("DROP INDEX IF EXISTS {TABLE}_status"),
                format!(
                    "CREATE INDEX {TABLE}_status ON {TABLE} (status, first_attempt_at) \
                     WHERE {NOT_QUEUED}"
                ),
            ],
            Dialect::Postgres => Vec::new(),
        },
        redact_urls: false,
    },
    Step {
        from: 6,
        // Secrets at rest: the id of the key that sealed a saved answer (NULL for one kept in
        // the clear, as every row already there is), and the query values of the URLs already
        // stored redacted, except in rows a dispatcher may still send (`REDACT_SELECT`).
        columns: &[("response_key_id", "TEXT")],
        statements: |_| Vec::new(),
        redact_urls: true,
    },
    Step {
        from: 7,
        // PostgreSQL's enqueue as a function: the caller's statement is a call the server
        // plans in microseconds, and the insert inside keeps its plan for the session
        // (PL/pgSQL caches it), where the statement it replaces was parsed and planned at
        // every enqueue. SQLite's enqueue is prepared on the caller's connection already.
        columns: &[],
        statements: |dialect| match dialect {
            Dialect::Postgres => vec![postgres_enqueue_function()],
            Dialect::Sqlite => Vec::new(),
        },
        redact_urls: false,
    },
];

/// The channel a queued operation is announced on at its transaction's commit (its key as
/// the payload), for dispatchers that `LISTEN` (PostgreSQL).
pub const QUEUED_CHANNEL: &str = "idempotent_retry_queued";

/// The database's present in PostgreSQL, in milliseconds since the epoch: the statement's
/// start, so every time one statement writes is the same instant.
pub const POSTGRES_NOW: &str = "floor(extract(epoch FROM statement_timestamp()) * 1000)::BIGINT";

/// PostgreSQL's enqueue (schema version 8): inserts a queued row on the database's clock and,
/// when it was inserted, announces its key on [`QUEUED_CHANNEL`] (delivered at the commit);
/// returns the key, or NULL when the key had a row. Arguments: key, scope, fingerprint, the
/// delay before it is due and the delay plus its retention (milliseconds), method, URL,
/// headers (JSON), body.
pub fn postgres_enqueue_function() -> String {
    format!(
        "CREATE OR REPLACE FUNCTION idempotent_retry_enqueue(\
         p_key TEXT, p_scope TEXT, p_fingerprint TEXT, p_delay BIGINT, p_kept BIGINT, \
         p_method TEXT, p_url TEXT, p_headers TEXT, p_body BYTEA) RETURNS TEXT \
         LANGUAGE plpgsql AS $enqueue$ \
         DECLARE \
           present BIGINT := {POSTGRES_NOW}; \
           inserted TEXT; \
         BEGIN \
           INSERT INTO {TABLE} (key, scope, fingerprint, status, attempts, \
             first_attempt_at, expires_at, method, url, queued_at, not_before, \
             request_headers, request_body) \
           VALUES (p_key, p_scope, p_fingerprint, 'queued', 0, present, present + p_kept, \
             p_method, p_url, present, present + p_delay, p_headers, p_body) \
           ON CONFLICT (key) DO NOTHING RETURNING key INTO inserted; \
           IF inserted IS NOT NULL THEN \
             PERFORM pg_notify('{QUEUED_CHANNEL}', inserted); \
           END IF; \
           RETURN inserted; \
         END $enqueue$"
    )
}

/// The condition of SQLite's expiry and status indexes (from version 6): every row but the
/// queued ones. A statement that reads through either repeats it, word for word.
pub const NOT_QUEUED: &str = "status <> 'queued'";

/// The rows whose stored URLs may hold a query value or a fragment, for the step that redacts
/// them: key, URL, answered URL. Left out: rows queued through the outbox that a dispatcher may
/// still send (queued, in flight, not sent or unknown), whose URL is the one it sends to.
pub const REDACT_SELECT: &str = "SELECT key, url, response_url FROM idempotent_operations \
     WHERE (url LIKE '%?%' OR url LIKE '%#%' OR response_url LIKE '%?%' \
            OR response_url LIKE '%#%') \
       AND NOT (queued_at IS NOT NULL \
                AND status IN ('queued', 'in_flight', 'not_sent', 'unknown'))";

/// The redacted URLs written back. Parameters: key, URL, answered URL (SQLite's `?N` and
/// PostgreSQL's `$N` alike).
pub fn redact_update(dialect: Dialect) -> String {
    match dialect {
        Dialect::Sqlite => {
            format!("UPDATE {TABLE} SET url = ?2, response_url = ?3 WHERE key = ?1")
        }
        Dialect::Postgres => {
            format!("UPDATE {TABLE} SET url = $2, response_url = $3 WHERE key = $1")
        }
    }
}

/// A row's URL and answered URL as the redacting step leaves them (every query value redacted:
/// the step knows no caller's list of names to keep); `None` when neither changes.
pub fn redacted_urls(
    url: Option<&str>,
    response_url: Option<&str>,
) -> Option<(Option<String>, Option<String>)> {
    let redact = |stored: Option<&str>| {
        stored.map(|stored| super::redact_query(stored, &[] as &[&str]).into_owned())
    };
    let (new_url, new_response_url) = (redact(url), redact(response_url));
    (new_url.as_deref() != url || new_response_url.as_deref() != response_url)
        .then_some((new_url, new_response_url))
}

/// A [`Step`] column's type that is the dialect's byte string (`BLOB` or `BYTEA`).
const BYTES: &str = "BYTES";

/// The view of queued operations callers read in their own SQL.
pub const OUTBOX_VIEW: &str = "idempotent_outbox";

/// The view of the operations queued through the outbox: one row per operation, with its
/// outcome as the client reports it (`pending` while queued or being sent, `done` with a
/// final answer, `not_done` when it certainly did not run, `unknown` when it may have).
fn outbox_view(dialect: Dialect) -> String {
    let create = match dialect {
        Dialect::Sqlite => "CREATE VIEW IF NOT EXISTS",
        Dialect::Postgres => "CREATE OR REPLACE VIEW",
    };
    format!(
        "{create} {OUTBOX_VIEW} AS SELECT key, scope, status, \
         CASE WHEN status IN ('queued', 'in_flight') THEN 'pending' \
              WHEN status = 'unknown' THEN 'unknown' \
              WHEN status = 'not_sent' THEN 'not_done' \
              WHEN response_status IS NULL THEN 'not_done' \
              ELSE 'done' END AS outcome, \
         method, url, queued_at, not_before, attempts, last_attempt_at, response_status, \
         response_body, resolution \
         FROM {TABLE} WHERE queued_at IS NOT NULL"
    )
}

/// The columns a dispatcher reads of a due row, in the order [`QueuedRow`] expects them.
pub const QUEUED_COLUMNS: &str = "key, scope, fingerprint, method, url, request_headers, \
     request_body, queued_at, not_before, expires_at, status";

/// The due rows, oldest due first, as four `SELECT`s of `columns` (which must include `key`
/// and `not_before`), each ordered and cut to `limit` on its own: queued ones whose time has
/// come (walking the partial index of queued rows in order, so a read stops after `limit`
/// rows however long the backlog); rows in flight under a lapsed lease; rows no receiver has
/// seen (`not_sent`) some time after their last attempt; and, when asked, rows whose outcome
/// is unknown some time after their last (each through the status index). The arguments are
/// the placeholders (or expressions) of the present, the limit, the `not_sent` delay and the
/// `unknown` delay in milliseconds (NULL: never), and, for a take, the window's cutoff: a row
/// in flight or unknown first attempted at or before it is not due (outside its window, it
/// is the reconcilers'). [`due_query`] joins them; SQLite runs them one by one (it would
/// read a compound's first branch whole).
pub fn due_branches(
    dialect: Dialect,
    columns: &str,
    (now, limit): (&str, &str),
    (not_sent_after, unknown_after): (&str, &str),
    cutoff: Option<&str>,
) -> [String; 4] {
    let window = cutoff.map_or_else(String::new, |cutoff| {
        format!(" AND first_attempt_at > {cutoff}")
    });
    // SQLite, without statistics, would rather read the status index and sort every queued
    // row: it is told which index walks them in order.
    // The other branches go through the status index, which in SQLite leaves queued rows
    // out: a statement that reads through it repeats its condition.
    let (queued_index, not_queued) = match dialect {
        Dialect::Sqlite => (
            format!(" INDEXED BY {TABLE}_queued"),
            format!(" AND {NOT_QUEUED}"),
        ),
        Dialect::Postgres => (String::new(), String::new()),
    };
    let limit = limit_of(dialect, limit);
    let branch = |from: String, condition: String| {
        format!(
            "SELECT {columns} FROM {from} WHERE {condition} ORDER BY not_before, key LIMIT {limit}"
        )
    };
    [
        branch(
            format!("{TABLE}{queued_index}"),
            format!("status = 'queued' AND not_before <= {now}"),
        ),
        branch(
            TABLE.to_owned(),
            format!(
                "status = 'in_flight'{not_queued} AND queued_at IS NOT NULL \
                 AND lease_expires_at <= {now}{window}"
            ),
        ),
        branch(
            TABLE.to_owned(),
            format!(
                "status = 'not_sent'{not_queued} AND queued_at IS NOT NULL \
                 AND coalesce(last_attempt_at, first_attempt_at) <= {now} - {not_sent_after}"
            ),
        ),
        branch(
            TABLE.to_owned(),
            format!(
                "status = 'unknown'{not_queued} AND queued_at IS NOT NULL \
                 AND {unknown_after} IS NOT NULL \
                 AND coalesce(last_attempt_at, first_attempt_at) <= {now} - {unknown_after}{window}"
            ),
        ),
    ]
}

/// A `LIMIT` of `limit` (a placeholder) in `dialect`. SQLite plans a statement whose limit is
/// a bare parameter for the value bound, and prepares it again whenever another value is
/// bound (tens of microseconds each time, on every dispatcher read); the limit as an
/// expression of the parameter keeps one plan.
pub fn limit_of(dialect: Dialect, limit: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("CAST({limit} AS INTEGER)"),
        Dialect::Postgres => limit.to_owned(),
    }
}

/// [`due_branches`] as one compound `SELECT`, oldest due first, at most `limit`.
pub fn due_query(
    dialect: Dialect,
    columns: &str,
    (now, limit): (&str, &str),
    delays: (&str, &str),
    cutoff: Option<&str>,
) -> String {
    let union = due_branches(dialect, columns, (now, limit), delays, cutoff)
        .into_iter()
        .enumerate()
        .map(|(n, branch)| format!("SELECT * FROM ({branch}) AS due_{n}"))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    format!("{union} ORDER BY not_before, key LIMIT {limit}")
}

/// The condition a due row meets, on one row ([`due_query`]'s, for a statement that checks a
/// row again as it locks it).
pub fn due_condition(
    now: &str,
    not_sent_after: &str,
    unknown_after: &str,
    cutoff: Option<&str>,
) -> String {
    let window = cutoff.map_or_else(String::new, |cutoff| {
        format!(" AND first_attempt_at > {cutoff}")
    });
    format!(
        "queued_at IS NOT NULL \
         AND ((status = 'queued' AND not_before <= {now}) \
              OR (status = 'not_sent' \
                  AND coalesce(last_attempt_at, first_attempt_at) <= {now} - {not_sent_after}) \
              OR (((status = 'in_flight' AND lease_expires_at <= {now}) \
                   OR (status = 'unknown' AND {unknown_after} IS NOT NULL \
                       AND coalesce(last_attempt_at, first_attempt_at) <= {now} - {unknown_after})){window}))"
    )
}

/// The outbox's backlog: how many rows are queued, and the earliest `queued_at` among them.
pub const BACKLOG_QUERY: &str = "SELECT count(*), min(queued_at) FROM idempotent_operations \
     WHERE queued_at IS NOT NULL AND status = 'queued'";

/// A due row as the drivers read it ([`QUEUED_COLUMNS`]), before validation.
#[derive(Debug)]
pub struct QueuedRow {
    pub key: String,
    pub scope: String,
    pub fingerprint: String,
    pub method: Option<String>,
    pub url: Option<String>,
    pub request_headers: Option<String>,
    pub request_body: Option<Vec<u8>>,
    pub queued_at: i64,
    pub not_before: Option<i64>,
    pub expires_at: i64,
    pub status: String,
}

impl QueuedRow {
    /// Validates the row.
    pub fn into_operation(self) -> Result<super::outbox::QueuedOperation, LedgerError> {
        let missing =
            |what: &str| LedgerError::corrupt(format!("queued row {}: no {what}", self.key));
        let method = self.method.clone().ok_or_else(|| missing("method"))?;
        let url = self.url.clone().ok_or_else(|| missing("URL"))?;
        let headers = match &self.request_headers {
            None => Vec::new(),
            Some(json) => super::outbox::QueuedOperation::headers_from_json(&self.key, json)?,
        };
        let not_before = self.not_before.unwrap_or(self.queued_at);
        let mut operation = super::outbox::QueuedOperation::new(
            self.key,
            self.fingerprint,
            (method, url),
            from_millis(self.queued_at),
        );
        operation.scope = self.scope;
        operation.headers = headers;
        operation.body = self.request_body.unwrap_or_default();
        operation.not_before = from_millis(not_before);
        operation.retention = std::time::Duration::from_millis(
            u64::try_from(self.expires_at.saturating_sub(not_before)).unwrap_or(0),
        );
        operation.status = self.status.parse::<OperationStatus>()?;
        Ok(operation)
    }
}

// A version without its step (or a step past the version) would leave stores stamped with a
// version whose shape they do not have.
const _: () = assert!(STEPS.len() == SCHEMA_VERSION as usize);

/// The step a store at version `found` takes next, or `None` when it is at [`SCHEMA_VERSION`].
///
/// # Errors
///
/// [`LedgerErrorKind::Corrupt`](super::LedgerErrorKind::Corrupt) when `found` is newer than
/// this crate knows: a later release wrote the store, and this one cannot tell what its rows
/// mean.
pub fn next_step(found: u32) -> Result<Option<&'static Step>, LedgerError> {
    if found > SCHEMA_VERSION {
        return Err(LedgerError::corrupt(format!(
            "schema version {found} is newer than {SCHEMA_VERSION}, the latest this release \
             of idempotent-retry knows: upgrade idempotent-retry to use this store (it was left \
             unchanged)"
        )));
    }
    // `STEPS[n]` starts from version `n` (a test checks it), and `found` is at most the
    // number of steps, where `get` gives `None`.
    Ok(usize::try_from(found).ok().and_then(|n| STEPS.get(n)))
}

/// A stored version that cannot be one (SQLite's `user_version` and PostgreSQL's `INTEGER`
/// are signed).
pub fn version_from(stored: i64) -> Result<u32, LedgerError> {
    u32::try_from(stored)
        .map_err(|_| LedgerError::corrupt(format!("schema version {stored} is not a version")))
}

/// The error for a table that lacks a column this crate reads.
pub fn shape_error() -> LedgerError {
    LedgerError::corrupt(format!(
        "table {TABLE} is missing or exists with another shape than schema version \
         {SCHEMA_VERSION}: run the ledger's `migrate()` (or `idempotent-retry-ledger migrate`); \
         a table of another shape is not this crate's, and is left as it is"
    ))
}

/// The columns, in the order [`RawRow`] expects them.
pub const COLUMNS: &str = "key, scope, fingerprint, status, attempts, first_attempt_at, \
     last_attempt_at, lease_owner, lease_expires_at, response_status, response_headers, \
     response_body, expires_at, method, url, resolution, resolved_by, resolved_at, \
     resolution_reason, response_url, response_key_id";

/// How many columns [`COLUMNS`] names: a statement that returns something after them reads it
/// at this index.
pub const COLUMN_COUNT: usize = 21;

/// The version-1 table, with the body column's type (`BLOB` or `BYTEA`) filled in.
fn schema(bytes_type: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {TABLE} (
            key               TEXT PRIMARY KEY,
            scope             TEXT NOT NULL,
            fingerprint       TEXT NOT NULL,
            status            TEXT NOT NULL,
            attempts          INTEGER NOT NULL,
            first_attempt_at  BIGINT NOT NULL,
            last_attempt_at   BIGINT,
            lease_owner       TEXT,
            lease_expires_at  BIGINT,
            response_status   INTEGER,
            response_headers  TEXT,
            response_body     {bytes_type},
            expires_at        BIGINT NOT NULL
        )"
    )
}

/// The index on `expires_at`, for purges.
/// `ALTER TABLE ... ADD COLUMN` of one of a [`Step`]'s columns; PostgreSQL's with `IF NOT
/// EXISTS` (SQLite has no such clause: its migration looks the column up first).
pub fn add_column(dialect: Dialect, (name, kind): (&str, &str)) -> String {
    let guard = match dialect {
        Dialect::Sqlite => "",
        Dialect::Postgres => "IF NOT EXISTS ",
    };
    let kind = if kind == BYTES {
        dialect.bytes_type()
    } else {
        kind
    };
    format!("ALTER TABLE {TABLE} ADD COLUMN {guard}{name} {kind}")
}

/// One value bound to a statement that [`list_query`] builds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Text(String),
    Int(i64),
}

/// The `SELECT` for [`Ledger::list`](super::Ledger::list) in `dialect`, with its parameters
/// in order; the limit is the last one.
pub fn list_query(dialect: Dialect, filter: &super::ListFilter) -> (String, Vec<Param>) {
    let mut conditions = Vec::new();
    let mut params = Vec::new();
    let bind = |param: Param, params: &mut Vec<Param>| {
        params.push(param);
        match dialect {
            Dialect::Sqlite => format!("?{}", params.len()),
            Dialect::Postgres => format!("${}", params.len()),
        }
    };
    // SQLite's status index leaves queued rows out, and serves only a statement that repeats
    // its condition; queued rows are read through the queued index, which names them.
    let status_index = |status: OperationStatus| match (dialect, status) {
        (Dialect::Postgres, _) => String::new(),
        (Dialect::Sqlite, OperationStatus::Queued) => " AND status = 'queued'".to_owned(),
        (Dialect::Sqlite, _) => format!(" AND {NOT_QUEUED}"),
    };
    if let Some(status) = filter.status {
        let at = bind(Param::Text(status.as_str().to_owned()), &mut params);
        conditions.push(format!("status = {at}{}", status_index(status)));
    }
    if filter.unresolved {
        conditions.push(format!(
            "status IN ('unknown', 'in_flight'){}",
            status_index(OperationStatus::Unknown)
        ));
    }
    if let Some(scope) = &filter.scope {
        let at = bind(Param::Text(scope.clone()), &mut params);
        conditions.push(format!("scope = {at}"));
    }
    if let Some(older_than) = filter.older_than {
        let at = bind(Param::Int(super::to_millis(older_than)), &mut params);
        conditions.push(format!("first_attempt_at <= {at}"));
    }
    if let Some(prefix) = &filter.key_prefix {
        // A range rather than LIKE, which has pattern characters to escape and, in SQLite,
        // folds ASCII case and skips the index. The keys with a prefix are contiguous in byte
        // order: SQLite's BINARY collation, PostgreSQL's "C" (its primary key's index serves
        // the range when the database's collation is C; otherwise the rows are scanned).
        let key = match dialect {
            Dialect::Sqlite => "key",
            Dialect::Postgres => "key COLLATE \"C\"",
        };
        let from = bind(Param::Text(prefix.clone()), &mut params);
        conditions.push(format!("{key} >= {from}"));
        if let Some(end) = prefix_end(prefix) {
            let to = bind(Param::Text(end), &mut params);
            conditions.push(format!("{key} < {to}"));
        }
    }
    let limit = limit_of(
        dialect,
        &bind(Param::Int(i64::from(filter.limit)), &mut params),
    );
    let conditions = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    (
        format!(
            "SELECT {COLUMNS} FROM {TABLE}{conditions} ORDER BY first_attempt_at, key LIMIT {limit}"
        ),
        params,
    )
}

/// The least string above every string that starts with `prefix`, in byte order (which in
/// UTF-8 is code point order): the prefix with its last character that is not the largest one
/// raised by one and what follows dropped; `None` when there is no such character.
fn prefix_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        // The surrogates are no characters: the one after U+D7FF is U+E000.
        let next = match last {
            '\u{d7ff}' => Some('\u{e000}'),
            other => char::from_u32(u32::from(other) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn index() -> String {
    format!("CREATE INDEX IF NOT EXISTS {TABLE}_expires_at ON {TABLE} (expires_at)")
}

/// A statement that fails unless the table has every column: run after `CREATE TABLE IF NOT
/// EXISTS`, which keeps a table of another shape as it is.
pub fn probe() -> String {
    format!("SELECT {COLUMNS} FROM {TABLE} WHERE 1 = 0")
}

/// A row as the drivers read it, before validation.
#[derive(Debug)]
pub struct RawRow {
    pub key: String,
    pub scope: String,
    pub fingerprint: String,
    pub status: String,
    pub attempts: i64,
    pub first_attempt_at: i64,
    pub last_attempt_at: Option<i64>,
    pub lease_owner: Option<String>,
    pub lease_expires_at: Option<i64>,
    pub response_status: Option<i64>,
    pub response_headers: Option<String>,
    pub response_body: Option<Vec<u8>>,
    pub expires_at: i64,
    pub method: Option<String>,
    pub url: Option<String>,
    pub resolution: Option<String>,
    pub resolved_by: Option<String>,
    pub resolved_at: Option<i64>,
    pub resolution_reason: Option<String>,
    pub response_url: Option<String>,
    pub response_key_id: Option<String>,
}

impl RawRow {
    /// Validates the row.
    pub fn into_record(self) -> Result<OperationRecord, LedgerError> {
        let attempts = u32::try_from(self.attempts).map_err(|_| {
            LedgerError::corrupt(format!("row {}: attempts {}", self.key, self.attempts))
        })?;
        let response = match self.response_status {
            None => None,
            Some(status) => {
                let status = u16::try_from(status)
                    .ok()
                    .filter(|s| (100..=999).contains(s))
                    .ok_or_else(|| {
                        LedgerError::corrupt(format!("row {}: response status {status}", self.key))
                    })?;
                let headers = match &self.response_headers {
                    None => Vec::new(),
                    Some(json) => serde_json::from_str(json).map_err(|err| {
                        LedgerError::corrupt(format!("row {}: response headers", self.key))
                            .with_source(err)
                    })?,
                };
                Some(SavedResponse {
                    status,
                    headers,
                    body: self.response_body,
                    url: self.response_url,
                    sealed_with: self.response_key_id,
                })
            }
        };
        let resolution = match (&self.resolution, &self.resolved_by, self.resolved_at) {
            (None, _, _) => None,
            (Some(kind), Some(by), Some(at)) => Some(ResolutionNote {
                kind: kind.parse::<ResolutionKind>()?,
                by: by.clone(),
                at: from_millis(at),
                reason: self.resolution_reason.clone(),
            }),
            (Some(_), _, _) => {
                return Err(LedgerError::corrupt(format!(
                    "row {}: a resolution without who made it or when",
                    self.key
                )));
            }
        };
        Ok(OperationRecord {
            status: self.status.parse::<OperationStatus>()?,
            attempts,
            first_attempt_at: from_millis(self.first_attempt_at),
            last_attempt_at: self.last_attempt_at.map(from_millis),
            lease_owner: self.lease_owner,
            lease_expires_at: self.lease_expires_at.map(from_millis),
            response,
            expires_at: from_millis(self.expires_at),
            method: self.method,
            url: self.url,
            resolution,
            key: self.key,
            scope: self.scope,
            fingerprint: self.fingerprint,
        })
    }
}

/// `record` with its times cut to the whole milliseconds the SQL ledgers keep: the record a
/// statement wrote, as reading it back would give, for a write that builds its record instead
/// of reading it back.
pub fn as_stored(mut record: OperationRecord) -> OperationRecord {
    let cut = |at: SystemTime| from_millis(to_millis(at));
    record.first_attempt_at = cut(record.first_attempt_at);
    record.last_attempt_at = record.last_attempt_at.map(cut);
    record.lease_expires_at = record.lease_expires_at.map(cut);
    record.expires_at = cut(record.expires_at);
    record
}

/// The saved response's columns, as a statement binds them: status, headers as JSON, body,
/// the URL that answered when it is not the request's, and the id of the key that sealed it.
#[derive(Debug, Default)]
pub struct ResponseColumns {
    pub status: Option<i64>,
    pub headers: Option<String>,
    pub body: Option<Vec<u8>>,
    pub url: Option<String>,
    pub key_id: Option<String>,
}

/// The saved response's columns (all `None` without one).
pub fn response_columns(response: Option<&SavedResponse>) -> ResponseColumns {
    match response {
        None => ResponseColumns::default(),
        Some(saved) => ResponseColumns {
            status: Some(i64::from(saved.status)),
            // Serializing pairs of strings cannot fail.
            headers: serde_json::to_string(&saved.headers).ok(),
            body: saved.body.clone(),
            url: saved.url.clone(),
            key_id: saved.sealed_with.clone(),
        },
    }
}

/// The table and index exactly as the 0.1 `migrate` created them (it recorded no schema
/// version), with `body_type` for the response body column (`BLOB` in SQLite, `BYTEA` in
/// PostgreSQL). Frozen: the shape a store made by 0.1 has, whatever the schema is now.
pub fn ddl_0_1(body_type: &str) -> String {
    format!(
        "
CREATE TABLE IF NOT EXISTS idempotent_operations (
    key               TEXT PRIMARY KEY,
    scope             TEXT NOT NULL,
    fingerprint       TEXT NOT NULL,
    status            TEXT NOT NULL,
    attempts          INTEGER NOT NULL,
    first_attempt_at  BIGINT NOT NULL,
    last_attempt_at   BIGINT,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    response_status   INTEGER,
    response_headers  TEXT,
    response_body     {body_type},
    expires_at        BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotent_operations_expires_at
    ON idempotent_operations (expires_at);"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LedgerErrorKind;

    fn raw() -> RawRow {
        RawRow {
            key: "k".into(),
            scope: "s".into(),
            fingerprint: "f".into(),
            status: "succeeded".into(),
            attempts: 2,
            first_attempt_at: 1_000,
            last_attempt_at: Some(2_000),
            lease_owner: None,
            lease_expires_at: None,
            response_status: Some(201),
            response_headers: Some(r#"[["content-type","text/plain"]]"#.into()),
            response_body: Some(b"ok".to_vec()),
            expires_at: 9_000,
            method: Some("POST".into()),
            url: Some("https://api.example.com/v1/charges".into()),
            resolution: Some("done".into()),
            resolved_by: Some("operator alice".into()),
            resolved_at: Some(5_000),
            resolution_reason: None,
            response_url: Some("https://api.example.com/v1/charges/".into()),
            response_key_id: None,
        }
    }

    #[test]
    fn a_valid_row_decodes_and_round_trips_its_response() {
        let record = raw().into_record().expect("valid");
        assert_eq!(record.attempts, 2);
        assert_eq!(COLUMNS.split(", ").count(), COLUMN_COUNT);
        let note = record.resolution.clone().expect("resolved");
        assert_eq!(
            (note.kind, note.by.as_str()),
            (ResolutionKind::Done, "operator alice")
        );
        assert_eq!(record.method.as_deref(), Some("POST"));
        let response = record.response.expect("saved");
        assert_eq!(response.status, 201);
        assert_eq!(
            response.url.as_deref(),
            Some("https://api.example.com/v1/charges/")
        );
        let columns = response_columns(Some(&response));
        assert_eq!(columns.status, Some(201));
        assert_eq!(
            columns.headers.as_deref(),
            Some(r#"[["content-type","text/plain"]]"#)
        );
        assert_eq!(columns.body.as_deref(), Some(&b"ok"[..]));
        assert_eq!(columns.url, response.url);
        assert_eq!(columns.key_id, None);
        let mut sealed = raw();
        sealed.response_key_id = Some("k2".into());
        let sealed = sealed
            .into_record()
            .expect("valid")
            .response
            .expect("saved");
        assert_eq!(sealed.sealed_with.as_deref(), Some("k2"));
        assert_eq!(
            response_columns(Some(&sealed)).key_id.as_deref(),
            Some("k2")
        );
    }

    #[test]
    fn the_redacting_step_changes_only_urls_with_a_query_or_a_fragment() {
        assert_eq!(
            redacted_urls(Some("https://h/v1/charges"), None),
            None,
            "nothing to redact"
        );
        assert_eq!(
            redacted_urls(
                Some("https://h/charges?api_key=S"),
                Some("https://h/done?sig=S#t")
            ),
            Some((
                Some("https://h/charges?api_key=…".to_owned()),
                Some("https://h/done?sig=…".to_owned())
            ))
        );
        assert_eq!(
            redacted_urls(None, Some("https://h/done?x=1")),
            Some((None, Some("https://h/done?x=…".to_owned())))
        );
        assert!(REDACT_SELECT.contains(TABLE));
        assert!(redact_update(Dialect::Postgres).contains("$3"));
    }

    #[test]
    fn steps_run_in_order_from_no_version_to_the_current_one() {
        for (n, step) in STEPS.iter().enumerate() {
            assert_eq!(
                usize::try_from(step.from).ok(),
                Some(n),
                "step {n} out of order"
            );
        }
        // Following the steps from "no version" reaches the current version, one at a time.
        let mut version = 0;
        while let Some(step) = next_step(version).expect("known") {
            assert_eq!(step.from, version);
            version = step.to();
        }
        assert_eq!(version, SCHEMA_VERSION);
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            let statements = (STEPS[0].statements)(dialect);
            assert!(
                statements[0].contains(dialect.bytes_type()),
                "{statements:?}"
            );
        }
    }

    #[test]
    fn a_list_binds_each_condition_once_and_the_limit_last() {
        let at = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2);
        let filter = super::super::ListFilter::new(5)
            .status(OperationStatus::Unknown)
            .scope("s")
            .older_than(at);
        let (sql, params) = list_query(Dialect::Postgres, &filter);
        assert!(
            sql.ends_with(
                "WHERE status = $1 AND scope = $2 AND first_attempt_at <= $3 \
                 ORDER BY first_attempt_at, key LIMIT $4"
            ),
            "{sql}"
        );
        assert_eq!(
            params,
            vec![
                Param::Text("unknown".into()),
                Param::Text("s".into()),
                Param::Int(2_000),
                Param::Int(5)
            ]
        );
        let (sql, params) = list_query(
            Dialect::Sqlite,
            &super::super::ListFilter::new(1).unresolved(),
        );
        assert!(
            sql.contains(
                "WHERE status IN ('unknown', 'in_flight') AND status <> 'queued' ORDER BY"
            ),
            "{sql}"
        );
        assert!(sql.ends_with("LIMIT CAST(?1 AS INTEGER)"), "{sql}");
        assert_eq!(params, vec![Param::Int(1)]);
        // SQLite's statuses other than queued repeat the status index's condition; queued
        // rows are named for the queued index.
        for (status, condition) in [
            (
                OperationStatus::Unknown,
                "status = ?1 AND status <> 'queued'",
            ),
            (OperationStatus::Queued, "status = ?1 AND status = 'queued'"),
        ] {
            let filter = super::super::ListFilter::new(1).status(status);
            let (sql, _) = list_query(Dialect::Sqlite, &filter);
            assert!(
                sql.contains(&format!("WHERE {condition} ORDER BY")),
                "{sql}"
            );
        }
    }

    #[test]
    fn a_key_prefix_is_a_byte_range() {
        let filter = super::super::ListFilter::new(3).key_prefix("ord%_");
        let (sql, params) = list_query(Dialect::Sqlite, &filter);
        assert!(
            sql.contains("WHERE key >= ?1 AND key < ?2 ORDER BY"),
            "{sql}"
        );
        assert_eq!(
            params,
            vec![
                Param::Text("ord%_".into()),
                Param::Text("ord%`".into()),
                Param::Int(3)
            ]
        );
        let filter = super::super::ListFilter::new(3)
            .scope("s")
            .key_prefix("\u{10ffff}");
        let (sql, params) = list_query(Dialect::Postgres, &filter);
        assert!(
            sql.contains(r#"WHERE scope = $1 AND key COLLATE "C" >= $2 ORDER BY"#),
            "{sql}"
        );
        assert_eq!(params.len(), 3, "no upper bound above the last character");
    }

    #[test]
    fn the_end_of_a_prefix_is_the_least_string_above_its_keys() {
        assert_eq!(prefix_end("order-").as_deref(), Some("order."));
        assert_eq!(prefix_end("a\u{10ffff}").as_deref(), Some("b"));
        assert_eq!(prefix_end("a\u{d7ff}").as_deref(), Some("a\u{e000}"));
        assert_eq!(prefix_end("\u{10ffff}\u{10ffff}"), None);
        assert_eq!(prefix_end(""), None);
        // Every key with the prefix is inside [prefix, end), in byte order, and the end is not.
        for (prefix, key) in [
            ("ab", "ab"),
            ("ab", "ab\u{10ffff}zz"),
            ("é", "éa"),
            ("a\u{7f}", "a\u{7f}\u{80}"),
        ] {
            let end = prefix_end(prefix).expect("an end");
            assert!(prefix.as_bytes() <= key.as_bytes(), "{prefix:?} {key:?}");
            assert!(
                key.as_bytes() < end.as_bytes(),
                "{prefix:?} {key:?} {end:?}"
            );
            assert!(!end.starts_with(prefix), "{end:?}");
        }
    }

    #[test]
    fn a_newer_version_is_refused_and_names_both_versions() {
        let err = next_step(SCHEMA_VERSION + 1).expect_err("newer");
        assert_eq!(err.kind(), LedgerErrorKind::Corrupt);
        let message = err.to_string();
        for part in [
            format!("schema version {}", SCHEMA_VERSION + 1),
            format!("newer than {SCHEMA_VERSION},"),
            "upgrade idempotent-retry".to_owned(),
        ] {
            assert!(message.contains(&part), "{message:?} lacks {part:?}");
        }
        assert!(!message.ends_with('.'), "{message:?}");
        assert_eq!(
            version_from(-1).expect_err("negative").kind(),
            LedgerErrorKind::Corrupt
        );
        assert_eq!(version_from(i64::from(u32::MAX) + 1).ok(), None);
        assert_eq!(version_from(1).ok(), Some(1));
    }

    #[test]
    fn impossible_values_are_corrupt_not_panics() {
        let cases: [fn(&mut RawRow); 6] = [
            |r| r.resolution = Some("maybe".into()),
            |r| r.resolved_at = None,
            |r| r.attempts = -1,
            |r| r.status = "done".into(),
            |r| r.response_status = Some(70_000),
            |r| r.response_headers = Some("{not json".into()),
        ];
        for break_it in cases {
            let mut row = raw();
            break_it(&mut row);
            let err = row.into_record().expect_err("corrupt");
            assert_eq!(err.kind(), LedgerErrorKind::Corrupt);
        }
    }
}
