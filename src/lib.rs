//! A retrying HTTP client that keeps **one idempotency key per logical operation**.
//!
//! Services that call Stripe-style APIs, and agent runtimes making side-effecting HTTP calls
//! (send an email, charge a card, open a ticket), retry. A retry that goes out with a fresh key,
//! or with none, repeats the side effect. This crate wraps [`reqwest`] so that the key is
//! settled **once**, before the first attempt, and sent on every attempt; only transient
//! failures are retried, with capped full-jitter backoff that honours `Retry-After`; and when it
//! stops, the caller learns whether the operation is done, definitely not done, or of unknown
//! outcome, with the key to reconcile with. The same engine runs as a tower layer and as a
//! `reqwest-middleware` middleware, under a [retry budget](#retry-budget), optionally with a
//! durable [ledger](#durable-operations) of operations.
//!
//! # Quick start
//!
//! ```no_run
//! use idempotent_retry::{Client, IdempotencyKey, Outcome};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new();
//!
//! // One key per logical operation, derived from inputs that survive a restart.
//! let key = IdempotencyKey::derive("agent.send_email", &["conv_8f2c", "step-3"]);
//!
//! let sent = client
//!     .post("https://api.example.com/v1/emails")
//!     .idempotency_key(key)
//!     .json(&serde_json::json!({"to": "ada@example.com", "subject": "Your invoice"}))
//!     .send()
//!     .await;
//! match sent {
//!     // A final answer: 2xx, or one such as 400 or 422 (check the status).
//!     Ok(response) => println!("{}", response.status()),
//!     Err(err) => match err.outcome() {
//!         // The operation has its answer: do not send it again.
//!         Outcome::Done { status, .. } => eprintln!("already answered {status}: {err}"),
//!         // Definitely not executed: safe to try again later.
//!         Outcome::NotDone { .. } => eprintln!("not sent: {err}"),
//!         // The server may have run it: look it up by key, or retry later with the same key.
//!         Outcome::Unknown { key } => eprintln!("reconcile {key:?}: {err}"),
//!         // A variant added later: read it as unknown.
//!         _ => eprintln!("may have run: {err}"),
//!     },
//! }
//! # Ok(()) }
//! ```
//!
//! [`Client::new`] takes every [default](#defaults). Its inner `reqwest::Client` follows no
//! redirects, so the crate's [`RedirectPolicy`] decides where the key goes; bring your own
//! reqwest client (TLS, proxies, pools) with [`ClientBuilder::http`].
//!
//! Keys from stable inputs ([`IdempotencyKey::derive`], [`IdempotencyKey::for_tool_call`] over
//! the RFC 8785 canonical form of JSON arguments) are the same across processes, machines and
//! versions. A derived key is a plain SHA-256 of its inputs: when they are guessable and must
//! stay private, derive with a [`DerivationSecret`] (HMAC-SHA-256) instead.
//!
//! # Retry semantics
//!
//! Each attempt is classified on its status and headers (never its body) or on the transport
//! error's type and `source()` chain, into a [`FailureKind`]:
//!
//! | outcome of an attempt | retried? | may the server have run it? |
//! |---|---|---|
//! | DNS failure, connect error, connect timeout | yes, even without a key | no |
//! | timeout after connecting | yes | **unknown** |
//! | connection reset / aborted / closed before a full response, a bounded answer's body cut midway included | yes | **unknown** |
//! | 500, 502, 503, 504 and every other 5xx but 501 and 505 | yes | **unknown** |
//! | an invalid status from 600 to 999 (handled as a 5xx, RFC 9110 section 15) | yes | **unknown** |
//! | a status line hyper refuses (`000`, `099`, `1000`, no digits) | yes, as a connection closed before a full response | **unknown** |
//! | 409 Conflict, on a request with a key (first attempt still running) | yes, as a wait for it: not counted toward `max_attempts` (below) | **unknown** |
//! | 429 Too Many Requests, honouring `Retry-After` | yes | no |
//! | 408 Request Timeout | yes | no |
//! | 501, 505, every other 4xx, 1xx-3xx | no: returned as `Ok(response)` | (final) |
//! | a redirect chain longer than the [`RedirectPolicy`] allows | no: [`ErrorKind::TooManyRedirects`] | **unknown** |
//! | `Stripe-Should-Retry` / `x-should-retry` `true` or `false` | the hint wins over the status | |
//!
//! A 422 on a keyed request is final. Under a key the caller gave or derived it is logged at
//! error level (the key was reused with a different payload); under a key the crate minted for
//! the operation, at warn, as a rejected request. The rules:
//!
//! - **Keys.** `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE` and `TRACE` are idempotent by
//!   definition (RFC 9110 §9.2.2): they are retried without a key and get one only if given.
//!   Every other method gets a random UUID v4 key, minted once before the first attempt, unless
//!   one is given ([`RequestBuilder::idempotency_key`] or the key header). Without one
//!   ([`ClientBuilder::auto_keys`], [`RequestBuilder::without_idempotency_key`],
//!   [`WithoutIdempotencyKey`]) such a request is retried only when it provably never left (DNS
//!   and connect failures); any other failure is [`ErrorKind::Transport`]. A random key dies
//!   with the process: for an operation that must survive a crash, a redelivered job or a
//!   rolling deploy, derive the key, or store one before the first attempt, and reuse it.
//! - **Waiting.** Before retry `n` (0 for the first) the client waits
//!   `U(0, min(max_delay, base_delay * 2^n))`: full jitter, drawn inside the cap. A server's
//!   `Retry-After` or `retry-after-ms` is a floor; an unparsable one counts as absent, never as
//!   zero. A request to wait longer than [`RetryPolicy::max_retry_after`], or than the window
//!   has left, ends the operation at once with [`ErrorKind::RetryAfterTooLong`]: the client
//!   never sleeps it. Every parsing rule: `docs/retry-after.md`.
//! - **In progress.** An answer that says the operation is still in progress at the receiver
//!   (a 409 on a keyed request: another request with the key, often one of this operation's
//!   own that timed out or whose caller dropped it, is running there) is a wait for the live
//!   operation, not a failed attempt. It does not count toward `max_attempts`; the waits back
//!   off with the same capped full jitter in a sequence of their own (retry `n` being the
//!   `n`-th such wait), or wait the receiver's `Retry-After`; and they are bounded by
//!   [`RetryPolicy::max_in_progress_wait`], counted from the first in-progress answer (a
//!   backoff wait is cut to end there), and by the reconcile window. When the limit runs out,
//!   or the receiver asks for a wait past it, the error is [`ErrorKind::StillInProgress`]
//!   ("the receiver still reported the operation in progress after 1m"), outcome unknown.
//!   [`RetryReport::in_progress_waits`] and [`RetryReport::in_progress_wait`] count them apart
//!   from the attempts; the retry budget charges nothing for them. Why: `docs/in-progress.md`.
//! - **Stopping.** After `max_attempts` attempts the error is [`ErrorKind::AttemptsExhausted`],
//!   with the last response ([`Error::take_response`]) or transport error (its `source()`). No
//!   wait ends past the reconcile window and no attempt starts after it: when the next wait
//!   would cross it the error is [`ErrorKind::ReconcileWindow`], because the receiver may soon
//!   forget the key and a later "retry" would be a new request. A retry the
//!   [budget](#retry-budget) refuses ends it with [`ErrorKind::BudgetExhausted`].
//! - **The outcome.** [`Error::is_outcome_unknown`] is `true` as soon as any attempt may have
//!   been executed (sent, then timed out, reset, closed, 5xx or 409), `false` when every attempt
//!   failed to connect or resolve or was refused outright (429, 408): look the operation up by
//!   its key, or simply try again later. Every response carries a [`RetryReport`].
//! - **Bodies.** Every attempt sends a clone of one request. A streamed body gets one attempt,
//!   then [`ErrorKind::BodyNotReplayable`]: never a silent single attempt, never an empty body.
//! - **Timeouts.** Each attempt runs under [`RetryPolicy::attempt_timeout`], shortened so that
//!   no attempt outlives the window.
//! - **Answers' bodies.** An answer whose `Content-Length` is at most
//!   [`ClientBuilder::answer_read_limit`] (1 MiB) is read inside its attempt, under its timeout:
//!   a body cut midway is a failed attempt, retried with the key (the receiver answers from its
//!   store), and the caller's `bytes()`, `text()` and `json()` cost nothing more. A longer answer,
//!   or one without a length (chunked, server-sent events), streams as it arrives; if it fails
//!   midway, the body's error names the key and says to send the same request again with it
//!   ([`RequestBuilder::send`]).
//! - **Redirects** are followed by the [`Client`] itself, inside one attempt, by its
//!   [`RedirectPolicy`]: the key stays on the original origin unless allowed, never rides on a
//!   303's `GET`, and only the final hop is classified. The other front ends follow none.
//! - **Policies.** A request's own policy ([`RequestBuilder::policy`], or a [`RetryPolicy`] in
//!   its extensions) wins over its host's ([`ClientBuilder::policy_for_host`]), which wins over
//!   the client's ([`ClientBuilder::policy`]).
//! - **reqwest's own retries** (HTTP/2 refusals, inside one of our attempts) compose without
//!   stacking; do not give the inner client broader ones ([`ClientBuilder::http`]).
//!
//! # Defaults
//!
//! Every default, with its reason (a test checks this table against the code):
//!
//! | setting | default | why |
//! |---|---|---|
//! | [`RetryPolicy::with_max_attempts`] | 5 | the first attempt and four retries |
//! | [`RetryPolicy::with_base_delay`] | 500 ms | the first backoff ceiling, as in the Stripe and OpenAI SDKs |
//! | [`RetryPolicy::with_max_delay`] | 30 s | the backoff cap; jitter is drawn inside it |
//! | [`RetryPolicy::with_reconcile_window`] | 24 h | Stripe v1 may prune a key after 24 h: a later retry would be a new request (keep it shorter than your receiver keeps keys; PayPal: 6 h) |
//! | [`RetryPolicy::with_attempt_timeout`] | 30 s | each attempt, from connecting until the response body has been read |
//! | [`RetryPolicy::with_max_retry_after`] | 60 s | the longest server-requested wait honoured, as in the Stainless SDKs |
//! | [`RetryPolicy::with_max_in_progress_wait`] | 1 min | twice the attempt timeout: the live operation is most often this operation's own attempt that timed out after 30 s, and a receiver's handler seldom runs much longer than its callers wait; long enough for the handlers that take a few seconds, short enough that an operation lost at the receiver is reported, not waited on for the whole window |
//! | [`RetryBudgetConfig::with_capacity`] | 500 tokens | the AWS SDKs' standard mode; the bucket starts full and pays for 100 retries that fail, the most an outage adds beyond one retry per operation in flight |
//! | [`RetryBudgetConfig::with_retry_cost`] | 5 tokens | the AWS SDKs' standard mode, charged when the retry fails |
//! | [`RetryBudgetConfig::with_timeout_cost`] | 10 tokens | a retry that timed out held the server for the whole timeout: those are cut first |
//! | [`RetryBudgetConfig::with_success_reward`] | 1 token | a drained bucket refills from first-attempt successes, with no timer |
//! | [`ClientBuilder::retry_budget`] | on | one new [`RetryBudget`] per built client, shared by its clones: retries multiply load exactly when a service fails |
//! | [`ClientBuilder::key_header`] | `Idempotency-Key` | the IETF draft's name and Stripe's; set `PayPal-Request-Id` and the like here |
//! | [`ClientBuilder::auto_keys`] | on | a `POST` without a key cannot be retried once it may have left |
//! | [`ClientBuilder::redirects`] | 10 hops | per attempt, as reqwest; the key to the original origin only |
//! | [`ClientBuilder::attempt_header`] | none | the key, not the attempt number, makes a retry safe |
//! | [`ClientBuilder::ledger`] | none | what the client knows lives for one `send` |
//! | [`ClientBuilder::key_in_spans`] | off | a derived key can reveal its inputs, and every trace backend keeps what it receives; failed operations' `warn` events name the key either way |
//! | [`ClientBuilder::reconciler`] | none | only your receiver can say whether an operation ran: past the window, a run answers `ReconcileWindow` |
//! | [`ClientBuilder::reconciler_for_scope`] | none | as for the client's reconciler; a scope's own takes precedence over it |
//! | [`LedgerOptions::retention`] | 7 days | cheap to keep, and covers manual replays and incident forensics; never less than twice the request's reconcile window |
//! | [`LedgerOptions::lease`] | 10 s | renewed every third of it while the run lives: a dead run's key is taken over within 10 s, and a live run survives two failed renewals or a 6 s stall |
//! | [`LedgerOptions::max_body`] | 64 KiB | an API's JSON answer; a longer body is passed through and not saved |
//! | [`LedgerOptions::saved_headers`] | `Content-Type`, `Location` | what a replayed answer needs to be read |
//! | [`LedgerOptions::on_lease_held`] | [`LeaseHeldPolicy::WAIT`] | every 100 ms for up to 4 min: a run that meets a live one gets its answer (a default run lasts at most about 3 min 40 s, in-progress waits included), and a dead one's key within a lease; the same default in Python and idemcurl |
//! | [`LedgerOptions::worker`] | a random UUID | name it after a host or pod, so `lease_owner` says who holds a row |
//! | [`LedgerOptions::call_timeout`] | 10 s | a thousand times a healthy commit and past SQLite's 5 s wait for another process's lock; a frozen database costs an operation this long, never forever |
//!
//! [`LeaseHeldPolicy::WAIT`]: crate::ledger::LeaseHeldPolicy::WAIT
//! [`LedgerOptions::retention`]: crate::ledger::LedgerOptions::retention
//! [`LedgerOptions::lease`]: crate::ledger::LedgerOptions::lease
//! [`LedgerOptions::max_body`]: crate::ledger::LedgerOptions::max_body
//! [`LedgerOptions::saved_headers`]: crate::ledger::LedgerOptions::saved_headers
//! [`LedgerOptions::on_lease_held`]: crate::ledger::LedgerOptions::on_lease_held
//! [`LedgerOptions::worker`]: crate::ledger::LedgerOptions::worker
//! [`LedgerOptions::call_timeout`]: crate::ledger::LedgerOptions::call_timeout
//!
//! # Front ends
//!
//! Besides the [`Client`]: [`IdempotentRetryLayer`] (feature `tower`) wraps any tower `Service`
//! of `http::Request<B>` with a cloneable body or of `reqwest::Request` (`docs/tower.md` says what
//! belongs outside and inside it in a `ServiceBuilder`); [`IdempotentRetryMiddleware`] (feature
//! `middleware`) goes in a `reqwest_middleware::ClientBuilder`. [`ClientBuilder::build_layer`]
//! and [`ClientBuilder::build_middleware`] give them the client's settings, budget, ledger and
//! observers; `examples/tower_stack.rs` and `examples/middleware.rs` run them.
//!
//! # Retry budget
//!
//! Every retry also answers to a token bucket ([`RetryBudget`], [`RetryBudgetConfig`]) shared
//! by a client's clones and the front ends built from its builder: a retry is sent while the
//! bucket holds its cost and is charged only if it fails, a first-attempt success deposits, a
//! wait after a 409 "still in progress" is free (and bounded by
//! [`RetryPolicy::max_in_progress_wait`] instead). A refused retry ends the operation with
//! [`ErrorKind::BudgetExhausted`], key and outcome flag included, and is counted
//! ([`RetryBudget::refused`], [`Observer::on_retry_refused`]). What it guarantees, why this
//! design, and how to size it: `docs/budget.md`.
//!
//! # Durable operations
//!
//! Give the client a [`Ledger`](crate::ledger::Ledger) ([`ClientBuilder::ledger`]) and every front end claims each
//! keyed request in it before the first attempt (one atomic insert under a lease), records each
//! attempt that a retry follows and saves the outcome (an operation of one attempt costs two
//! writes):
//!
//! | the ledger already holds the key... | `send` |
//! |---|---|
//! | never sent: no attempt reached a receiver (`not_sent`) | sends this request, whatever it is, under the key, in a new window |
//! | for a different request (method, URL **with its origin**, or canonical body) | [`ErrorKind::KeyReuse`], nothing sent; [`Error::held_operation`] names what differs and what the ledger holds, and [`Error::outcome`] is that operation's (`Done` when it succeeded: never "not done" while it may have run) |
//! | succeeded | the saved response, [`RetryReport::is_replayed`], nothing sent |
//! | under another run's live lease | [`ErrorKind::LeaseHeld`], nothing sent (or waits: [`LeaseHeldPolicy`](crate::ledger::LeaseHeldPolicy)) |
//! | first attempted longer ago than the reconcile window | [`ErrorKind::ReconcileWindow`], nothing sent; but an unresolved row is first settled by the scope's [`Reconciler`](crate::ledger::reconcile::Reconciler), if one is set (below) |
//! | otherwise (unknown, failed, or a lapsed lease left by a crash) | sends with the same key, inside the original window |
//!
//! The fingerprint includes the URL's origin (why, and how to move operations to a new base
//! URL: `docs/ledger.md`); an operator frees a key by hand with
//! [`release_by_hand`](crate::ledger::reconcile::release_by_hand) (`idempotent-retry-ledger release`).
//!
//! [`MemoryLedger`](crate::ledger::MemoryLedger) serves one process, `SqliteLedger` (feature `sqlite`) one machine,
//! `PostgresLedger` (feature `postgres`) a fleet sharing one table. A ledger failure is
//! [`ErrorKind::Ledger`]: before the first attempt nothing is sent; after one, the error
//! carries the key and the outcome flag. A dropped `send` gives its lease back at once, a dead
//! process's lease lapses. [`ClientBuilder::ledger`] has an example; `docs/ledger.md` the
//! contract, the stages of one run, the schema and the incident queries.
//!
//! # Reconciling unknown outcomes
//!
//! Inside the window, sending again with the same key is the reconcile: the receiver replays
//! what ran. After it, a [`Reconciler`](crate::ledger::reconcile::Reconciler) finds out what happened ([`HttpProbe`](crate::ledger::reconcile::HttpProbe) asks the
//! receiver with a `GET` built from the row, [`reconcile_fn`](crate::ledger::reconcile::reconcile_fn) runs your own lookup,
//! [`SendAgain`](crate::ledger::reconcile::SendAgain) trusts a receiver that keeps keys longer than the window) and answers a
//! [`Resolution`](crate::ledger::reconcile::Resolution): `Done` (the response to replay), `NotDone` (send it in a new window) or
//! `Unknown`. It runs under the row's lease, as a run does, and the row records who resolved
//! it and when: when a run finds the row past its window
//! ([`ClientBuilder::reconciler`], [`ClientBuilder::reconciler_for_scope`]), on demand
//! ([`Client::reconcile`]), and in sweeps of unresolved rows
//! ([`Client::reconcile_unresolved`]). Operators settle rows by hand with
//! [`resolve_by_hand`](crate::ledger::reconcile::resolve_by_hand), or with the `idempotent-retry-ledger` command (crate `idempotent-retry-cli`); the
//! README's "After outcome unknown" says what to do when.
//!
//! # Testing
//!
//! Time is read through a [`Clock`](crate::time::Clock), waits go through a [`Sleeper`](crate::time::Sleeper), [`ClientBuilder::rng_seed`]
//! fixes the jitter: tests assert exact delays without waiting. `idempotent-retry-testkit` has an idempotent
//! loopback receiver with fault scripting and a side-effect recorder, for senders and handlers.
//!
//! # Traces
//!
//! Spans follow the OpenTelemetry HTTP client conventions: each operation is one INTERNAL span
//! `idempotent_request`, and each request on the wire (every attempt, and every redirect hop
//! the [`Client`] follows inside one) is one CLIENT span under it, named after its method.
//! They are plain `tracing` spans with the fields `tracing-opentelemetry` maps (`otel.name`,
//! `otel.kind`, `otel.status_code`): add its layer to the application's subscriber and they
//! export as such, with no OpenTelemetry crate in this one. With the feature `opentelemetry`,
//! each request also carries its own CLIENT span's trace context (`traceparent`, written by
//! the globally configured propagator), from the [`Client`] and the tower layer. The
//! middleware opens no CLIENT span and writes no context: `reqwest-tracing` under it does both
//! per attempt.
//!
//! | span | attribute | value |
//! |---|---|---|
//! | operation (INTERNAL) | `http.request.method`, `server.address` | the request's |
//! | | `idempotent_retry.idempotency_key` | the key, only with [`ClientBuilder::key_in_spans`] |
//! | | `idempotent_retry.attempts` | attempts sent; 0 when the ledger answered |
//! | | `idempotent_retry.outcome` | `done`, `not_done` or `unknown` ([`Outcome`]) |
//! | | `idempotent_retry.stop_reason` | `answered`, `replayed`, or the error's [`ErrorKind::as_str`] (`attempts_exhausted`, `budget_exhausted`, ...) |
//! | | status | error when the operation ended without a response |
//! | request (CLIENT) | `http.request.method` | the method; `_OTHER` for one the conventions do not list |
//! | | `server.address`, `server.port`, `url.full` | from the URL; in `url.full` a user name and password are `REDACTED:REDACTED` and every query value is `REDACTED` (the crate cannot tell which parameter holds a secret) |
//! | | `http.request.resend_count` | from the operation's second request on: 1, 2, ..., whatever the cause (a retry, or a redirect hop) |
//! | | `http.response.status_code`, `network.protocol.version` | when a response arrived |
//! | | `error.type` | from 400 on, the status code; without a response, the [`FailureKind::as_str`] (`connection_reset`, `timeout`, `connect`, ...) |
//! | | status | error with `error.type` |
//!
//! Between two attempts, the operation span gets an `info` event "attempt failed, retrying with
//! the same key" (`attempt`, `outcome`, `status`, `delay_ms`, `why`): the wait and its reason;
//! after an answer that says the operation is in progress at the receiver, the event is
//! "operation in progress at the receiver, waiting for it with the same key", with the same
//! fields.
//! A failed operation ends with a `warn` event and a 422 under a caller's key with an `error`
//! event, both naming the key. Bodies and headers other than the key are never logged. For
//! code that reacts to events, an [`Observer`] ([`ClientBuilder::observer`], or a closure:
//! [`ClientBuilder::on_attempt`], [`ClientBuilder::on_operation`]) hears every attempt, every
//! operation and every retry the budget refuses.
//!
//! # Metrics
//!
//! With the feature `metrics`, every front end records through the
//! [`metrics`](https://docs.rs/metrics) facade, into whichever recorder the application
//! installs (a Prometheus or OpenTelemetry exporter, say); without a recorder nothing is kept.
//! Why the facade and not the OpenTelemetry metrics API: `docs/observability.md`.
//!
//! | name | kind | unit | labels | recorded |
//! |---|---|---|---|---|
//! | `http.client.request.duration` | histogram | s | `http.request.method`, `server.address`, `server.port`, `http.response.status_code`, `error.type`, `network.protocol.version` (as the [CLIENT span](#traces) has them) | per request on the wire (attempt or redirect hop), to its response head or failure (a request cancelled by dropping `send` records nothing); the middleware's attempts too |
//! | `idempotent_retry.operations` | counter | `{operation}` | `outcome` (`done`, `not_done`, `unknown`), `stop_reason` (as the operation span's) | per operation ended |
//! | `idempotent_retry.retries` | counter | `{retry}` | `reason`: the [`FailureKind::as_str`] of the failure retried | per retry decided, before its wait |
//! | `idempotent_retry.retries.refused` | counter | `{retry}` | `reason`, as above | per retry the [budget](#retry-budget) refused |
//! | `idempotent_retry.ledger.replays` | counter | `{operation}` | | per operation answered from the ledger, nothing sent |
//! | `idempotent_retry.ledger.refusals` | counter | `{operation}` | `reason`: the [`ErrorKind::as_str`] (`key_reuse`, `lease_held`, ...) | per operation the ledger refused, nothing sent |
//! | `idempotent_retry.budget.tokens` | gauge | `{token}` | | tokens in the retry budget after each attempt's charge or admission and each success; one gauge per process, so with several budgets it shows the one that moved last |
//! | `idempotent_retry.ledger.clock_offset` | gauge | `s` | | the ledger's clock minus this worker's, for a ledger on its own clock (PostgreSQL), measured when a client first claims and again once a minute; above 1 s it is also logged at WARN |
//! | `idempotent_retry.outbox.queued` | gauge | `{operation}` | | operations queued in the outbox and not yet taken, read by `outbox::Dispatcher::run_until` when it goes idle and when it stops |
//! | `idempotent_retry.outbox.oldest_age` | gauge | `s` | | how long the oldest of them has waited |
//! | `idempotent_retry.outbox.delivered` | counter | `{operation}` | `outcome` | queued operations a dispatcher sent: `done`, `not_done`, `unknown` |
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `rustls` (default) | TLS through rustls with the aws-lc-rs provider, reqwest's default; without a TLS feature the client speaks plain HTTP only, unless the `reqwest::Client` you pass enables TLS itself |
//! | `rustls-no-provider` | rustls without a crypto provider: install one before building a `Client`, and skip the aws-lc C build |
//! | `native-tls` | TLS through the platform's library (OpenSSL on Linux, which needs its headers to build) |
//! | `tower` | [`IdempotentRetryLayer`], [`IdempotentRetry`], [`ResponseFuture`](crate::service::ResponseFuture) |
//! | `middleware` | [`IdempotentRetryMiddleware`] for `reqwest-middleware` 0.5 |
//! | `multipart` | `multipart/form-data` bodies (`RequestBuilder::multipart`); a form of in-memory parts is sent again byte for byte |
//! | `sqlite` | `SqliteLedger`: the ledger in an SQLite file, linked against the system's SQLite (3.35 or later) |
//! | `sqlite-bundled` | `sqlite` with SQLite compiled in: nothing to install |
//! | `postgres` | `PostgresLedger`: the ledger in a PostgreSQL table shared by a fleet, through a pool of connections (`tokio-postgres`, `deadpool-postgres`); plain TCP, or the caller's TLS connector |
//! | `postgres-rustls` | `postgres` with TLS through rustls and the aws-lc-rs provider, trusting the CAs in a PEM file (`PostgresLedgerBuilder::tls_ca_file`) |
//! | `sqlx-postgres` | `postgres` and `outbox::sqlx::enqueue`: an operation queued in the caller's `sqlx::Transaction<'_, Postgres>` |
//! | `opentelemetry` | trace context on the wire: each request carries its own CLIENT span's `traceparent` ([traces](#traces)); needs a `tracing-opentelemetry` layer (0.34, OpenTelemetry 0.33) in the subscriber |
//! | `metrics` | [metrics](#metrics) through the `metrics` facade (0.24) |
//!
//! (`internals` is for the crate's own benches and fuzz targets, outside semver: leave it off.)
//!
//! # More
//!
//! In the package: `docs/ARCHITECTURE.md` (modules, the path of one request), `SECURITY.md`
//! (what a key reveals, hostile input), `docs/performance.md`, `CHANGELOG.md`. MSRV: 1.88.
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
// docs.rs builds with `--cfg docsrs` on nightly, where `doc(cfg(..))` below needs the feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The docs name the optional front ends; built without their features, those links dangle.
#![cfg_attr(
    not(all(feature = "tower", feature = "middleware")),
    allow(rustdoc::broken_intra_doc_links)
)]

// The folders by layer, bottom first; each one's `mod.rs` says what it holds and which folders
// below it it may import (`scripts/module_graph.py` checks it), and `docs/ARCHITECTURE.md`
// draws them.
mod client;
mod decision;
mod engine;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
mod keys;
pub mod ledger;
mod message;
#[cfg(feature = "middleware")]
mod middleware;
pub mod outbox;
mod outcome;
mod rules;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod service;
mod telemetry;
pub mod time;

pub use decision::budget::{RetryBudget, RetryBudgetConfig};
pub use keys::canonical;
pub use outcome::{observe, report};
pub use rules::{backoff, retry_after};

pub mod reconcile {
    //! Settling operations whose outcome is unknown: a [`Reconciler`] per scope (an
    //! [`HttpProbe`] that asks the receiver, or your own [`reconcile_fn`]), asked by
    //! [`Client::reconcile`](crate::Client::reconcile) for one key and
    //! [`Client::reconcile_unresolved`](crate::Client::reconcile_unresolved) for a sweep; and an
    //! operator's answer by hand, [`resolve_by_hand`] and [`release_by_hand`].
    //!
    //! Each row is held under a lease while it is reconciled (as a run holds it), the scope's
    //! reconciler is asked, its [`Resolution`] written, and the lease released. A run's claim
    //! (`ledger/session.rs`) and both client methods come here.

    pub use crate::ledger::reconcile::{
        HttpProbe, ReconcileFn, ReconcileFuture, Reconciled, Reconciler, Released, Resolution,
        ResolutionKind, ResolutionNote, SendAgain, SweepReport, reconcile_fn, release_by_hand,
        resolve_by_hand,
    };
}

/// Where a redirect may lead: the hops a [`RedirectPolicy`] followed and why it stopped.
pub mod redirect {
    pub use crate::client::{RedirectChain, RedirectHop, RedirectStop};
}

#[cfg(feature = "multipart")]
pub use client::multipart;
pub use client::{Client, ClientBuilder, IDEMPOTENCY_KEY, RedirectPolicy, RequestBuilder};
pub use decision::policy::RetryPolicy;
pub use engine::extension::{LedgerScope, WithoutIdempotencyKey};
pub use keys::fingerprint::RequestFingerprint;
pub use keys::key::{IdempotencyKey, InvalidKey, InvalidKeyReason};
pub use keys::keyed::{DerivationSecret, InvalidSecret};
pub use message::exchange::{RetryRequest, RetryResponse};
#[cfg(feature = "middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "middleware")))]
pub use middleware::IdempotentRetryMiddleware;
pub use outcome::error::{Error, ErrorKind};
pub use outcome::held::{HeldOperation, RequestPart};
pub use outcome::observe::Observer;
pub use outcome::operation_outcome::Outcome;
pub use outcome::report::RetryReport;
pub use rules::classify::FailureKind;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use service::{IdempotentRetry, IdempotentRetryLayer};

/// Compiles and runs every `rust` block of the README as a doc test, so its examples keep
/// building against the crate.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
