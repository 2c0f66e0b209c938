//! A retrying HTTP client that keeps **one idempotency key per logical operation**.
//!
//! Services that call Stripe-style APIs, and agent runtimes making side-effecting HTTP calls
//! (send an email, charge a card, open a ticket), retry. A retry that goes out with a fresh key,
//! or with none, repeats the side effect. This crate wraps [`reqwest`] so that:
//!
//! - a key is derived from stable inputs ([`IdempotencyKey::derive`],
//!   [`IdempotencyKey::for_tool_call`]) or given, **once**, and sent on every attempt in the
//!   `Idempotency-Key` header (the name is configurable);
//! - only transient failures are retried, with capped exponential backoff and full jitter,
//!   honouring `Retry-After`;
//! - retrying stops after [`RetryPolicy::max_attempts`] or before the
//!   [`reconcile window`](RetryPolicy::reconcile_window) ends, and the error then says whether
//!   the outcome is unknown and carries the key to reconcile with.
//!
//! The same engine also runs as a tower layer and as a `reqwest-middleware` middleware, under a
//! retry budget, optionally with a durable ledger of operations.
//!
//! # Quick start
//!
//! ```no_run
//! use idempotent_retry::{Client, IdempotencyKey};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new();
//!
//! // One key per logical operation, derived from inputs that survive a restart.
//! let key = IdempotencyKey::derive("agent.send_email", &["conv_8f2c", "step-3"]);
//!
//! match client
//!     .post("https://api.example.com/v1/emails")
//!     .idempotency_key(key)
//!     .json(&serde_json::json!({"to": "ada@example.com", "subject": "Your invoice"}))
//!     .send()
//!     .await
//! {
//!     // Done (or a final answer such as 400 or 422: check the status).
//!     Ok(response) => println!("{}", response.status()),
//!     // The server may have run it: look it up by key, or retry later with the same key.
//!     Err(err) if err.is_outcome_unknown() => {
//!         eprintln!("reconcile {:?}: {err}", err.idempotency_key());
//!     }
//!     // Definitely not executed: safe to try again later.
//!     Err(err) => eprintln!("not sent ({}): {err}", err.kind()),
//! }
//! # Ok(()) }
//! ```
//!
//! Keys from stable inputs are deterministic across processes, machines and versions:
//!
//! ```
//! use idempotent_retry::IdempotencyKey;
//! use serde_json::json;
//!
//! let a = IdempotencyKey::for_tool_call("send_email", &json!({"to": "ada@example.com", "n": 1}));
//! let b = IdempotencyKey::for_tool_call("send_email", &json!({"n": 1.0, "to": "ada@example.com"}));
//! assert_eq!(a, b); // member order and number spelling do not matter
//! assert_ne!(
//!     IdempotencyKey::derive("scope", &["ab", "c"]),
//!     IdempotencyKey::derive("scope", &["a", "bc"]),
//! );
//! ```
//!
//! A derived key is a plain SHA-256 of its inputs: whoever sees it can test guesses of them.
//! When the inputs are guessable and must stay private, derive with a [`DerivationSecret`]
//! (HMAC-SHA-256) instead.
//!
//! # Retry semantics
//!
//! Each attempt is classified on its status and headers (never its body) or on the transport
//! error's type and `source()` chain:
//!
//! | outcome of an attempt | retried? | may the server have run it? |
//! |---|---|---|
//! | DNS failure, connect error, connect timeout | yes, even without a key | no |
//! | timeout after connecting | yes | **unknown** |
//! | connection reset / aborted / closed before a full response | yes | **unknown** |
//! | 500, 502, 503, 504 and every other 5xx but 501 and 505 | yes | **unknown** |
//! | an invalid status from 600 to 999 (handled as a 5xx, RFC 9110 section 15) | yes | **unknown** |
//! | a status line hyper refuses (`000`, `099`, `1000`, no digits) | yes, as a connection closed before a full response | **unknown** |
//! | 409 Conflict, on a request with a key (first attempt still running) | yes | **unknown** |
//! | 429 Too Many Requests, honouring `Retry-After` | yes | no |
//! | 408 Request Timeout | yes | no |
//! | 501, 505, every other 4xx, 1xx-3xx | no: returned as `Ok(response)` | (final) |
//! | a redirect chain longer than the [`RedirectPolicy`] allows | no: [`ErrorKind::TooManyRedirects`] | **unknown** |
//! | `Stripe-Should-Retry` / `x-should-retry` `true` or `false` | the hint wins over the status | |
//!
//! A 422 on a keyed request (the key was reused with a different payload) is final and is also
//! logged at error level.
//!
//! **Methods.** `GET`, `HEAD`, `OPTIONS`, `PUT`, `DELETE` and `TRACE` are idempotent by
//! definition (RFC 9110 §9.2.2): they are retried without a key and get one only if given.
//! Every other method (`POST`, `PATCH`, ...) gets a random UUID v4 key, minted once before the
//! first attempt, unless one is given ([`RequestBuilder::idempotency_key`] or the key header).
//! With automatic keys off ([`ClientBuilder::auto_keys`],
//! [`RequestBuilder::without_idempotency_key`], or the [`WithoutIdempotencyKey`] extension on
//! one request through the tower service or the middleware), such a request is retried only
//! when it provably never left (DNS and connect failures); any other failure is returned as
//! [`ErrorKind::Transport`].
//!
//! **Keys that outlive the process.** A random key protects the attempts inside one `send`
//! and dies with the process. When the operation must survive a crash, a redelivered job or a
//! rolling deploy, derive the key from stable inputs ([`IdempotencyKey::derive`],
//! [`IdempotencyKey::for_tool_call`]) or mint one and store it before the first attempt, then
//! send every later try with [`RequestBuilder::idempotency_key`]. The
//! [ledger](#durable-operations) also keeps when the operation started and whether it
//! completed.
//!
//! **Waiting.** Before retry `n` (0 for the first), the client waits
//! `U(0, min(max_delay, base_delay * 2^n))`: full jitter, drawn inside the cap. A server's
//! `Retry-After` (delay-seconds or any of the three HTTP-date forms) or `retry-after-ms` is a
//! floor: the wait is the longer of it and the jittered backoff. An unparsable value counts
//! as absent (`-1`, `1e10`, `1.5`, a date before 1970 or with the wrong weekday: the backoff
//! applies); `0` and a date already past ask for no wait (the backoff applies). A request to
//! wait longer than [`RetryPolicy::max_retry_after`], or longer than the window has left,
//! ends the operation at once with [`ErrorKind::RetryAfterTooLong`], the request in
//! [`Error::retry_after`]: the client never sleeps it. A number too large for a `Duration`
//! (`99999999999999999999`, 20 KB of digits) is such a request (`Duration::MAX`), not garbage,
//! and so is a date in the year 9999. When the header occurs several times the longest
//! parsable request wins, unparsable copies ignored; a `retry-after-ms` that parses (its
//! longest, if several) wins over `Retry-After`, and one that does not (`-5`, `NaN`) is
//! ignored in favour of `Retry-After`.
//!
//! **Stopping.** After `max_attempts` attempts the error is [`ErrorKind::AttemptsExhausted`],
//! keeping the last response ([`Error::take_response`]) or transport error
//! ([`std::error::Error::source`]). No wait ends past the reconcile window and no attempt
//! starts after it; when the next wait would cross it the error is
//! [`ErrorKind::ReconcileWindow`]: stop retrying and reconcile, because the receiver may soon
//! forget the key and a later "retry" would be a new request. A retry the
//! [budget](#retry-budget) refuses ends it with [`ErrorKind::BudgetExhausted`].
//!
//! **The truth about the outcome.** [`Error::is_outcome_unknown`] is `true` as soon as any
//! attempt may have been executed by the server (sent, then timed out, reset, closed, 5xx or
//! 409), and `false` when every attempt failed to connect or resolve, or was refused outright
//! (429, 408). An agent runtime uses it to choose between "look the operation up by its key"
//! and "simply try again later". Every response carries a [`RetryReport`] in
//! `response.extensions()` (attempts, key, elapsed, every wait and why).
//!
//! **Bodies.** Every attempt sends a clone of the same request, built once. Bodies from bytes,
//! strings, `json`, `form` are cloned cheaply. A streamed body (`reqwest::Body::wrap_stream`)
//! cannot be sent twice: it gets one attempt, and if that attempt fails transiently the error
//! is [`ErrorKind::BodyNotReplayable`] with the cause as its source, never a silent single
//! attempt and never an empty body. Buffer a payload into `bytes::Bytes` to make it
//! replayable.
//!
//! **Timeouts.** Each attempt runs under [`RetryPolicy::attempt_timeout`] (or
//! [`RequestBuilder::timeout`]), which reqwest applies from connecting until the response body
//! has been read, and which is shortened so no attempt outlives the reconcile window.
//!
//! **The body after the head.** Every decision is taken on the response head, so `send`
//! returns a final response as soon as its head arrives, and a retried response is dropped
//! unread. Reading a final response's body is the caller's: if it stalls or breaks (a server
//! that trickles it forever, a cut connection), that read fails with a `reqwest::Error`
//! (`is_timeout()` once the attempt timeout has run out), nothing is retried, and the
//! operation counts as done: the server answered, the [`RetryReport`] says so. To get the
//! body after all, send again with the same key: an idempotent receiver replays it. With a
//! [ledger](#durable-operations), `send` reads the body up to
//! [`LedgerOptions::max_body`] to save it, so there a stall or break within that much is an
//! [`ErrorKind::Transport`] error, outcome unknown; the rest of a longer body is the caller's,
//! as above. Through the tower service over `http::Request` the limit ends at the head (see
//! [Using with tower](#using-with-tower)).
//!
//! **Redirects** are followed by the [`Client`] itself, inside one attempt and under its
//! timeout, by its [`RedirectPolicy`] ([`ClientBuilder::redirects`]; the inner client it
//! builds follows none). A 307 or 308 resends the operation (method, body, key) to the same
//! origin, and to another only if the policy allows it; otherwise the caller gets the 3xx as
//! the final response, and the other origin sees nothing. A 303, and a 301 or 302 on a `POST`,
//! is followed as a `GET` without the body, the payload headers **or the key**: it reads a
//! result, it is not the operation. Credentials are dropped whenever a hop leaves its origin.
//! Only the final hop's status is classified: a 503 after a 307 is retried from the original
//! URL with the same key, and a redirect target that cannot be reached counts as
//! [`FailureKind::RedirectTargetUnreachable`] (the request did leave, so the outcome is
//! unknown). A 3xx without a usable `Location`, or whose streamed body cannot be resent, is
//! the final response; [`RedirectChain::of`] lists the hops and why one was not followed,
//! and `response.url()` is the final URL. With a [ledger](#durable-operations) the final hop's
//! answer is what is saved; a 301, 302, 307 or 308 left unfollowed is recorded as not done
//! (that server ran nothing), so a later run sends the operation again with the same key.
//! A `reqwest::Client` you
//! pass in keeps its own redirect setting: build it with `redirect::Policy::none()`, or
//! reqwest follows redirects itself with the key on every hop (the crate logs a warning when
//! it sees that happen). The tower and middleware front ends follow no redirects; see
//! [Using with tower](#using-with-tower) for `FollowRedirect`.
//!
//! **reqwest's own retries.** reqwest 0.13 retries on its own only what is provably safe
//! (HTTP/2 protocol refusals such as `REFUSED_STREAM`), inside one of our attempts; that
//! composes without stacking. Do not give the inner `reqwest::Client` a broader policy with
//! `ClientBuilder::retry`: retries would multiply (ours times its). `reqwest::retry::never()`
//! turns its retries off entirely.
//!
//! **Per request and per host.** One client often talks to several providers that keep keys
//! for different lengths of time. [`ClientBuilder::policy_for_host`] sets a policy per host; a
//! request's own policy ([`RequestBuilder::policy`], or a [`RetryPolicy`] in an
//! `http::Request`'s extensions or a `reqwest-middleware` extension) wins over its host's,
//! which wins over the client's [`ClientBuilder::policy`].
//!
//! ## Defaults
//!
//! | setting | default |
//! |---|---|
//! | attempts | 5 (the first and four retries) |
//! | backoff | full jitter, 500 ms doubling, capped at 30 s |
//! | reconcile window | 24 h from the first attempt (Stripe v1 may prune keys after 24 h) |
//! | per-attempt timeout | 30 s |
//! | longest honoured `Retry-After` | 60 s |
//! | key header | `Idempotency-Key` |
//! | automatic keys for non-idempotent methods | on |
//! | retry budget | on, one per client: 500 tokens, 5 per retry, 10 after a timeout |
//! | ledger | none |
//! | redirects (`Client`) | up to 10 per attempt; the key only to the original origin, never on a 303's `GET` |
//!
//! Match the window to the receiver: shorter than the time it keeps keys (PayPal's
//! `PayPal-Request-Id`: 6 h, so `reconcile_window(Duration::from_secs(5 * 3600))` and
//! `key_header(HeaderName::from_static("paypal-request-id"))`).
//!
//! # Using with tower
//!
//! With the `tower` feature, [`IdempotentRetryLayer`] wraps any tower `Service` over
//! `http::Request<B>` with a cloneable body (a hyper client with `Full<Bytes>` bodies, say)
//! or over `reqwest::Request` (`reqwest::Client` is one). The service is
//! [`IdempotentRetry`], its future [`ResponseFuture`]; its error is this crate's [`Error`],
//! with the last response available through [`Error::take_response_as`] in the inner
//! service's response type, and the [`RetryReport`] in the response's extensions
//! ([`RetryReport::from_extensions`]).
//!
//! The layer settles the key **before** the first attempt and clones the keyed request for
//! each attempt, so nothing below it can mint a key per attempt. Where it goes in a
//! `ServiceBuilder` (first listed = outermost):
//!
//! | layer | outside ours (listed before it) | inside ours (listed after it) |
//! |---|---|---|
//! | `tower::timeout` | a deadline for the whole operation, waits included; when it fires the caller gets no report and must treat the outcome as unknown: prefer [`RetryPolicy::reconcile_window`] | a per-attempt limit: `Elapsed` is classified as a timeout and retried (the policy's [`attempt_timeout`](RetryPolicy::attempt_timeout) applies anyway) |
//! | `ConcurrencyLimit` | limits logical operations; a permit is held through retries and waits | limits attempts in flight; readiness is awaited before every attempt and no permit is held while waiting (recommended) |
//! | `tower_http` header layers | once per operation: put a layer that sets the key header here | on every attempt (`User-Agent`, auth headers) |
//! | `tower_http` `TraceLayer` | one span per operation | one span per attempt |
//! | tower's own `Retry` | never: retries would multiply | never |
//! | `tower_http` `FollowRedirect` | every hop is a new operation: an automatic key is minted per hop, and a key set in the header is copied to every origin | one operation: each hop carries the key, to any origin (`FilterCredentials` drops only credentials) |
//!
//! The layer itself follows no redirect: a 3xx is a final answer. Neither place for
//! `FollowRedirect` keeps the key on its origin; for keyed requests that may be redirected,
//! leave it out and handle the 3xx, or use [`Client`], which applies its [`RedirectPolicy`].
//! Over `reqwest::Client`, build that client with `redirect::Policy::none()`: by default it
//! follows redirects below the layer, with the key (the layer logs a warning with the key and
//! both origins when the response comes from another URL than the one sent).
//!
//! ```
//! # #[cfg(feature = "tower")]
//! # fn main() -> Result<(), idempotent_retry::Error> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
//! use tower::{BoxError, ServiceBuilder, util::BoxCloneService};
//!
//! let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
//!     .build_http::<Full<Bytes>>();
//! let layer = Client::builder()
//!     .policy(RetryPolicy::default().with_max_attempts(4))
//!     .build_layer()?;
//! let service: BoxCloneService<_, _, BoxError> = ServiceBuilder::new()
//!     .layer(BoxCloneService::layer())
//!     .map_err(BoxError::from)
//!     .layer(layer)
//!     .concurrency_limit(16)
//!     .timeout(Duration::from_secs(10))
//!     .service(hyper);
//!
//! // A key for one request rides in its extensions (or in the key header).
//! let mut request = http::Request::post("https://api.example.com/v1/emails")
//!     .body(Full::new(Bytes::from_static(b"{}")))
//!     .expect("valid request");
//! request
//!     .extensions_mut()
//!     .insert(IdempotencyKey::derive("send_email", &["conv_8f2c", "3"]));
//! // service.oneshot(request).await ...
//! # drop((service, request));
//! # Ok(()) }
//! # #[cfg(not(feature = "tower"))]
//! # fn main() {}
//! ```
//!
//! **Per request**, an `http::Request`'s extensions may carry an [`IdempotencyKey`], a
//! [`RetryPolicy`] and [`WithoutIdempotencyKey`] (no automatic key), the counterparts of
//! [`RequestBuilder`]'s `idempotency_key`, `policy` and `without_idempotency_key`.
//! `reqwest::Request` has no public extensions: through the service over `reqwest::Client`,
//! use the key header, [`ClientBuilder::policy_for_host`] and [`ClientBuilder::auto_keys`].
//!
//! **Timeouts and readiness.** Before each retry the service waits for the inner service's
//! `poll_ready`; that wait is not part of the attempt, so a full `ConcurrencyLimit` never
//! turns into a timed-out attempt (whose outcome would be unknown), and a `poll_ready` error
//! ends the operation without counting an attempt. The crate does not bound the wait: a
//! timeout outside the layer does. The attempt itself runs under the policy's
//! [`attempt_timeout`](RetryPolicy::attempt_timeout), clipped to the window, and what that
//! covers depends on the request type:
//!
//! - `reqwest::Request`: the request carries the limit and reqwest applies it from connecting
//!   until the response body has been read, as with [`Client`]. A service of your own over
//!   `reqwest::Request` must honour `Request::timeout()` for the limit to hold.
//! - `http::Request`: the service bounds each attempt **up to the response head**. The body
//!   is streamed after the operation has returned and no limit of this crate applies to it:
//!   bound the read yourself (for example `tokio::time::timeout` around collecting it).
//!
//! `examples/tower_stack.rs` runs a full stack against a local receiver.
//!
//! # Using with reqwest-middleware
//!
//! With the `middleware` feature, add [`IdempotentRetryMiddleware`] to a
//! `reqwest_middleware::ClientBuilder`. Place it before (outside) `reqwest-tracing`'s
//! `TracingMiddleware`, so each attempt gets its own client span inside this crate's
//! operation span, and after anything that must run once per logical request. Per-request keys,
//! policies and [`WithoutIdempotencyKey`] go in with `.with_extension(..)`; a streamed body
//! gets one attempt, as with [`Client`]. Errors come back as
//! `reqwest_middleware::Error::Middleware`, unwrapped with [`Error::from_middleware`]. See
//! `examples/middleware.rs`. The middleware follows no redirect itself; build the
//! `reqwest::Client` under it with `redirect::Policy::none()`, since reqwest's default follows
//! redirects with the key on every hop, to any origin. When the response's URL is not the URL
//! sent, the middleware logs a `warn` event with the key and both origins.
//!
//! # Retry budget
//!
//! Every retry must also be paid for from a token bucket ([`RetryBudget`]) shared by all
//! clones of the client, and by a tower layer or middleware built from the same builder: 500
//! tokens, 5 per retry, 10 after a timeout, the cost refunded when the retry succeeds, 1 back
//! per first-attempt success; a retry after a 409 "still in progress" is free, since the server
//! is answering and only our own first attempt is running. During an outage it bounds the extra load retries add to about
//! 100 requests, however many operations fail; a retry it refuses ends the operation with
//! [`ErrorKind::BudgetExhausted`], with the key and the outcome-unknown flag. Configure it with
//! [`RetryBudgetConfig`], share one between clients with [`ClientBuilder::retry_budget`], turn
//! it off with [`ClientBuilder::without_retry_budget`]. Why a token bucket, and these numbers:
//! [`RetryBudget`].
//!
//! # Durable operations
//!
//! Without a ledger, what the client knows about an operation lives in memory for the length
//! of one `send`. A derived key survives a crash; when the operation started, whether it
//! completed and whether another worker is sending it right now do not, unless they are
//! written down. Give the client a [`Ledger`] ([`ClientBuilder::ledger`]) and every keyed
//! request is claimed in it before its first attempt (one atomic insert: the insert is the
//! lock), recorded after each attempt, and its outcome saved:
//!
//! | the ledger already holds the key... | `send` |
//! |---|---|
//! | for a different request (method, URL or canonical body) | [`ErrorKind::KeyReuse`], nothing sent |
//! | succeeded | the saved response, [`RetryReport::is_replayed`], nothing sent |
//! | in flight under another run's live lease | [`ErrorKind::LeaseHeld`], nothing sent (or waits: [`LeaseHeldPolicy`]) |
//! | first attempted longer ago than the reconcile window | [`ErrorKind::ReconcileWindow`], nothing sent |
//! | otherwise (unknown, failed, or a lapsed lease left by a crash) | sends with the same key, inside the original window |
//!
//! [`MemoryLedger`] serves one process; `SqliteLedger` (feature `sqlite`) one machine;
//! `PostgresLedger` (feature `postgres`) a fleet sharing one table. A ledger failure is
//! [`ErrorKind::Ledger`]: before the first attempt nothing is sent; after an attempt, the
//! error carries the key and says whether the outcome is unknown, and the claim left behind
//! lets the next run resume. Every front end runs the same claim, record and finish: the
//! [`Client`], the tower layer and the `reqwest-middleware` middleware built from one
//! [`ClientBuilder`] with a ledger (see [`ClientBuilder::ledger`] for the request and response
//! types each can fingerprint and replay). A `send` whose future is dropped (a timeout around
//! it, a `select!`) gives its lease back at once, recording whether an attempt may have reached
//! the server, so the next run of the key goes ahead straight away with the same key and
//! window; a process that dies is covered by the lease lapsing. [`Ledger`] has the schema and
//! the incident query.
//!
//! ```
//! use idempotent_retry::{Client, IdempotencyKey, MemoryLedger, RetryReport};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let receiver = idempotent_retry::testkit::Receiver::start().await?;
//! # let url = receiver.url("/v1/charges");
//! let client = Client::builder()
//! #   .http(idempotent_retry::testkit::loopback_http()?)
//!     .ledger(MemoryLedger::new())
//!     .build()?;
//! let key = IdempotencyKey::derive("billing.charge", &["order-17"]);
//! let charge = serde_json::json!({"amount": 1200, "currency": "eur"});
//! for run in 0..2 {
//!     let response = client
//!         .post(&url)
//!         .idempotency_key(key.clone())
//!         .ledger_scope("billing.charge")
//!         .json(&charge)
//!         .send()
//!         .await?;
//!     assert!(response.status().is_success());
//!     // The second run is answered from the ledger: nothing is sent.
//!     let replayed = RetryReport::of(&response).is_some_and(RetryReport::is_replayed);
//!     assert_eq!(replayed, run == 1);
//! }
//! # assert_eq!(receiver.arrivals(), 1);
//! # Ok(()) }
//! ```
//!
//! # Testing
//!
//! The retry loop reads time only through a [`Clock`] and waits only through a [`Sleeper`]
//! ([`ClientBuilder::clock`], [`ClientBuilder::sleeper`]), and draws jitter from an RNG that
//! [`ClientBuilder::rng_seed`] makes reproducible, so tests can assert exact delays without
//! waiting for them.
//!
//! The `testkit` feature adds [`testkit`]: an idempotent receiver on loopback that runs your
//! handler, counts its side effects per key, and fails on script (resets before and after the
//! effect, stalls, closes, any status with `Retry-After`), plus a recording sleeper, seeded
//! RNGs and fixed keys. Its module docs show a user testing their own handler with it.
//!
//! # Observability
//!
//! Each operation runs in a `tracing` span `idempotent_request` with the method, host and key;
//! each retried attempt emits an `info` event (attempt number, outcome class, status, chosen
//! delay and why), the end of a failed operation a `warn` event, and a 422 on a keyed request
//! an `error` event. Bodies and headers other than the key are never logged. Every front end
//! emits the same.
//!
//! For metrics, an [`Observer`] ([`ClientBuilder::observer`]) is called after every attempt
//! ([`AttemptEvent`]: key, attempt number, status, failure kind, delay, elapsed) and at the end
//! of every operation ([`OperationEvent`], including those a [ledger](#durable-operations)
//! settles without sending: attempts 0 and a [`LedgerVerdict`]); a closure will do for one
//! callback
//! ([`ClientBuilder::on_attempt`], [`ClientBuilder::on_operation`]), and every observer and
//! closure given is called, in the order given. [`ClientBuilder::attempt_header`] sends the
//! attempt number in a header of your choosing (off by default).
//!
//! # Features
//!
//! | feature | adds |
//! |---|---|
//! | `rustls` (default) | TLS through rustls, reqwest's default TLS back end. Without it the client speaks plain HTTP only, unless the `reqwest::Client` you pass enables TLS itself. |
//! | `tower` | [`IdempotentRetryLayer`], [`IdempotentRetry`], [`ResponseFuture`] |
//! | `middleware` | [`IdempotentRetryMiddleware`] for `reqwest-middleware` 0.5 |
//! | `sqlite` | `SqliteLedger`: the ledger in an SQLite file (`rusqlite`, SQLite compiled in: nothing to install) |
//! | `postgres` | `PostgresLedger`: the ledger in a PostgreSQL table shared by a fleet (`tokio-postgres`) |
//! | `testkit` | [`testkit`]: the loopback receiver with fault scripting and a side-effect recorder, and deterministic helpers, for tests |
//!
//! # Minimum supported Rust version
//!
//! 1.88 (edition 2024; `sha2` 0.11 needs 1.88).
#![forbid(unsafe_code)]
// The docs name the optional front ends and the testkit; built without their features, those
// links dangle.
#![cfg_attr(
    not(all(feature = "tower", feature = "middleware", feature = "testkit")),
    allow(rustdoc::broken_intra_doc_links)
)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod backoff;
mod body;
mod budget;
pub mod canonical;
mod classify;
mod client;
mod decide;
mod engine;
mod error;
mod exchange;
mod extension;
mod fingerprint;
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals;
mod key;
mod keyed;
mod ledger;
#[cfg(feature = "middleware")]
mod middleware;
mod observe;
mod outcome;
mod policy;
mod readable;
mod report;
pub mod retry_after;
#[cfg(feature = "tower")]
mod service;
mod settings;
#[cfg(feature = "testkit")]
#[cfg_attr(docsrs, doc(cfg(feature = "testkit")))]
pub mod testkit;
mod time;
mod transport;
mod window;

pub use budget::{RetryBudget, RetryBudgetConfig};
pub use classify::FailureKind;
#[cfg(feature = "multipart")]
pub use client::multipart;
pub use client::{
    Client, ClientBuilder, IDEMPOTENCY_KEY, RedirectChain, RedirectHop, RedirectPolicy,
    RedirectStop, RequestBuilder,
};
pub use error::{Error, ErrorKind};
pub use exchange::{RetryRequest, RetryResponse};
pub use extension::{LedgerScope, WithoutIdempotencyKey};
pub use fingerprint::RequestFingerprint;
pub use key::{IdempotencyKey, InvalidKey, InvalidKeyReason};
pub use keyed::{DerivationSecret, InvalidSecret};
#[cfg(feature = "postgres")]
pub use ledger::PostgresLedger;
#[cfg(feature = "sqlite")]
pub use ledger::SqliteLedger;
pub use ledger::{
    AttemptUpdate, Claim, ClaimBuilder, Claimed, Finish, LeaseHeldPolicy, Ledger, LedgerError,
    LedgerErrorKind, LedgerFuture, LedgerOptions, MemoryLedger, OperationRecord,
    OperationRecordBuilder, OperationStatus, SavedResponse,
};
#[cfg(feature = "middleware")]
pub use middleware::IdempotentRetryMiddleware;
pub use observe::{AttemptEvent, LedgerVerdict, Observer, OperationEvent};
pub use policy::RetryPolicy;
pub use report::{AttemptRecord, RetryReport, Wait, WaitReason};
#[cfg(feature = "tower")]
pub use service::{IdempotentRetry, IdempotentRetryLayer, ResponseFuture};
pub use time::{Clock, Sleep, Sleeper, TokioClock, TokioSleeper};

/// Deterministic generators for the unit tests and the `internals` door.
#[cfg(any(test, feature = "internals"))]
mod test_rng {
    use std::convert::Infallible;

    use rand::TryRng;

    /// A generator that returns the same word forever: all ones draws the top of every range,
    /// zero the bottom.
    #[derive(Debug)]
    pub(crate) struct ConstRng(pub(crate) u64);

    impl TryRng for ConstRng {
        type Error = Infallible;

        fn try_next_u32(&mut self) -> Result<u32, Infallible> {
            // Truncation keeps all-ones as all-ones and zero as zero.
            Ok(self.0 as u32)
        }

        fn try_next_u64(&mut self) -> Result<u64, Infallible> {
            Ok(self.0)
        }

        fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
            for chunk in dst.chunks_mut(8) {
                let bytes = self.0.to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
            Ok(())
        }
    }
}
