//! The public `Receiver`, its builder, and the serve loop that takes one connection from the
//! request read to the answer written. The per-key bookkeeping the loop drives is in
//! `state.rs`; the values a test reads back are in `records.rs`.
//!
//! One request, start to finish:
//!
//! 1. The accept loop (`wire::accept_loop`) runs each connection on its own task; the request
//!    is read completely (`wire::read_request`), logged as an `Arrival` (number, key attempt)
//!    and its scripted fault, if any, is taken, all under one lock (`Shared::arrive`).
//! 2. A fault that acts before the handler (reset, close, canned status) ends it there.
//! 3. Otherwise `Shared::admit` looks the key up and claims it in the same critical section:
//!    new or `failed` -> `in_progress` and run; `in_progress` -> 409; `completed` -> replay;
//!    another fingerprint -> 422. Keyless requests always run. In batch mode each event id
//!    goes through the same `admit`.
//! 4. The handler runs in its own task (a panic becomes a 500) and calls `record_effect` for
//!    its effect; `Shared::finish` settles the row: an effect means `completed` with the reply
//!    saved; no effect and a 5xx means `failed`; `release_key` on a row with effects is refused
//!    and kept as a `Violation`.
//! 5. The answer goes out, unless a reset or a stall after commit was scripted.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::fault::{Fault, When};
use super::handler::{BoxHandler, Delivery, HandlerFuture, Reply};
use super::records::{
    Arrival, Compensated, Compensation, ForgetError, Handling, KeyRecord, Violation,
};
use super::state::{Admission, Shared, fingerprint};
use super::wire::{self, Incoming, find_header};
use idempotent_retry::time::{Clock, TokioClock};

/// Header added to an answer replayed from a completed key (Stripe's name for it).
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// An in-process HTTP/1.1 server on `127.0.0.1` that behaves like a Stripe-style idempotent
/// receiver, counts side effects, and fails on script.
///
/// Per key (the `Idempotency-Key` header unless [`ReceiverBuilder::key_header`] says
/// otherwise) it keeps a [`KeyRecord`]: scope, a SHA-256 fingerprint of the request, a status
/// and the saved response. The claim is atomic (the lookup and the insert happen under one
/// lock, as a unique constraint does it), so two concurrent deliveries never both run the
/// handler. It answers:
///
/// | delivery | answer |
/// |---|---|
/// | new key, or a `failed` one | the handler runs; its reply is saved (see [`Reply`]) |
/// | duplicate of a `completed` key, same request | the saved response, `Idempotent-Replayed: true` |
/// | duplicate while `in_progress` | 409 |
/// | same key, different method, target or body | 422 |
/// | no key | the handler runs, every time |
///
/// Faults are scripted with [`inject`](Self::inject) per request number or per key attempt.
/// One request per connection; every answer closes it. Dropping the receiver stops it and every
/// connection it is serving (a handler already running finishes on its own).
///
/// # Examples
///
/// ```
/// use idempotent_retry_testkit::{Fault, Receiver, When};
/// use idempotent_retry::{Client, IdempotencyKey, RetryPolicy};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let receiver = Receiver::start().await?; // the built-in counter as the handler
/// let key = IdempotencyKey::derive("example.charge", &["order_17"]);
/// // The first delivery commits its effect, then the connection is reset.
/// receiver.inject(When::key_attempt(&key, 1), Fault::ResetAfterCommit);
///
/// let client = Client::builder()
///     .http(reqwest::Client::builder().no_proxy().build()?)
///     .policy(RetryPolicy::default().with_base_delay(Duration::from_millis(5)))
///     .build()?;
/// let response = client
///     .post(receiver.url("/v1/charges"))
///     .idempotency_key(key.clone())
///     .json(&serde_json::json!({"amount": 500}))
///     .send()
///     .await?;
/// assert_eq!(response.status(), 200); // the saved response, replayed
/// assert_eq!(receiver.effects_for(key.as_str()), 1);
/// # Ok(()) }
/// ```
pub struct Receiver {
    addr: SocketAddr,
    serving: Arc<Serving>,
    task: JoinHandle<()>,
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("addr", &self.addr)
            .field("scope", &self.shared().scope())
            .field("key_header", &self.serving.key_header)
            .field("batch_id", &self.serving.batch_id)
            .finish_non_exhaustive()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // The accept loop owns every connection task (a JoinSet): aborting it aborts them all.
        self.task.abort();
    }
}

/// Configures a [`Receiver`].
///
/// # Default
///
/// | setting | default |
/// |---|---|
/// | handler | the built-in counter: records one effect, answers 200 `{"effect": n}` |
/// | key header | `Idempotency-Key` |
/// | scope | `default` |
/// | batch mode | off |
#[must_use = "a ReceiverBuilder does nothing until you `start` it"]
pub struct ReceiverBuilder {
    key_header: String,
    scope: String,
    handler: Option<BoxHandler>,
    batch_id: Option<String>,
}

impl fmt::Debug for ReceiverBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiverBuilder")
            .field("key_header", &self.key_header)
            .field("scope", &self.scope)
            .field("custom_handler", &self.handler.is_some())
            .field("batch_id", &self.batch_id)
            .finish()
    }
}

impl ReceiverBuilder {
    /// The header that carries the key, matched case-insensitively.
    ///
    /// Default: `Idempotency-Key`.
    pub fn key_header(mut self, name: impl Into<String>) -> Self {
        self.key_header = name.into();
        self
    }

    /// The scope stored with every key (`agent.send_email`, `stripe.charge`).
    ///
    /// Default: `default`.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = scope.into();
        self
    }

    /// The handler: user code that performs the side effect, calls
    /// [`Delivery::record_effect`] for it, and returns a [`Reply`].
    ///
    /// Default: the built-in counter.
    pub fn handler<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        self.handler = Some(Arc::new(move |delivery| -> HandlerFuture {
            Box::pin(handler(delivery))
        }));
        self
    }

    /// Batch mode: every POST carries a JSON array of events, each an object with its own id
    /// in member `id_field` (a string or a number), as SendGrid sends them. Each event is
    /// deduplicated on its id and runs the handler once; the request's key header is ignored.
    /// The answer is 200 `{"processed": n, "duplicates": m}`, or 500 when an event's handler
    /// failed (the batch can be sent again: events already done are skipped), or 400 when the
    /// body is not such an array.
    ///
    /// Default: off.
    pub fn batch(mut self, id_field: impl Into<String>) -> Self {
        self.batch_id = Some(id_field.into());
        self
    }

    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// The listener cannot be bound.
    pub async fn start(self) -> io::Result<Receiver> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let handler = self.handler.unwrap_or_else(|| {
            Arc::new(|delivery: Delivery| -> HandlerFuture {
                Box::pin(async move {
                    let n = delivery.record_effect();
                    Reply::json(200, &serde_json::json!({ "effect": n }))
                })
            })
        });
        let serving = Arc::new(Serving {
            key_header: self.key_header,
            batch_id: self.batch_id,
            handler,
            shared: Arc::new(Shared::new(self.scope)),
        });
        let task = tokio::spawn({
            let serving = serving.clone();
            wire::accept_loop(listener, move |stream| serve(serving.clone(), stream))
        });
        Ok(Receiver {
            addr,
            serving,
            task,
        })
    }
}

impl Receiver {
    /// A receiver with the built-in counter as its handler.
    ///
    /// # Errors
    ///
    /// The listener cannot be bound.
    pub async fn start() -> io::Result<Receiver> {
        Receiver::builder().start().await
    }

    /// Configure a receiver.
    pub fn builder() -> ReceiverBuilder {
        ReceiverBuilder {
            key_header: idempotent_retry::IDEMPOTENCY_KEY.as_str().to_owned(),
            scope: "default".to_owned(),
            handler: None,
            batch_id: None,
        }
    }

    /// `http://127.0.0.1:PORT` followed by `path` (a missing leading `/` is added).
    #[must_use]
    pub fn url(&self, path: &str) -> String {
        let slash = if path.starts_with('/') { "" } else { "/" };
        format!("http://{}{slash}{path}", self.addr)
    }

    /// The address it listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Scripts `fault` for the delivery `when` picks. A later script for the same delivery
    /// replaces an earlier one.
    pub fn inject(&self, when: When, fault: Fault) {
        self.shared().inject(when, fault);
    }

    /// Side effects recorded in total, keyed or not.
    #[must_use]
    pub fn effects(&self) -> u64 {
        self.shared().effects()
    }

    /// Side effects recorded under `key` (in batch mode: an event id).
    #[must_use]
    pub fn effects_for(&self, key: &str) -> u64 {
        self.shared().effects_for(key)
    }

    /// Side effects recorded by keyless requests.
    #[must_use]
    pub fn keyless_effects(&self) -> u64 {
        self.shared().keyless_effects()
    }

    /// Requests read completely so far.
    #[must_use]
    pub fn arrivals(&self) -> u64 {
        self.shared().arrivals()
    }

    /// Every request read completely, in arrival order.
    #[must_use]
    pub fn log(&self) -> Vec<Arrival> {
        self.shared().log()
    }

    /// The key header's value of each request, in arrival order.
    #[must_use]
    pub fn keys(&self) -> Vec<Option<String>> {
        self.shared().keys()
    }

    /// What the receiver keeps for `key`, if anything.
    #[must_use]
    pub fn record(&self, key: &str) -> Option<KeyRecord> {
        self.shared().record(key)
    }

    /// Misuses caught so far.
    #[must_use]
    pub fn violations(&self) -> Vec<Violation> {
        self.shared().violations()
    }

    /// Keys forgotten with a compensating record.
    #[must_use]
    pub fn compensations(&self) -> Vec<Compensated> {
        self.shared().compensations()
    }

    /// Forgets `key`, so the next delivery with it runs the handler as new.
    ///
    /// A key whose side effect committed is forgotten only with a `compensation` (the effect
    /// was refunded, retracted or otherwise accounted for), which is kept
    /// ([`compensations`](Self::compensations)); effects already recorded stay counted.
    ///
    /// # Errors
    ///
    /// - [`ForgetError::EffectCommitted`]: the key has committed effects and no compensation
    ///   was given. The key is kept.
    /// - [`ForgetError::InProgress`]: its handler is running.
    /// - [`ForgetError::UnknownKey`]: no such key.
    pub fn forget(&self, key: &str, compensation: Option<Compensation>) -> Result<(), ForgetError> {
        self.shared().forget(key, compensation)
    }

    /// Waits until at least `n` requests have arrived, or `within` has passed; returns how many
    /// have arrived.
    pub async fn wait_for_arrivals(&self, n: u64, within: Duration) -> u64 {
        let wait = async {
            loop {
                // Register before checking, so an arrival in between is not missed.
                let notified = self.shared().changed();
                if self.arrivals() >= n {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
        self.arrivals()
    }
}

impl Receiver {
    fn shared(&self) -> &Shared {
        &self.serving.shared
    }

    /// Waits until every request that has arrived has been dealt with (no handler running, no
    /// [`Handling::Pending`]), or `within` has passed; returns whether it is idle. Counts read
    /// after an idle receiver are final until the next request.
    pub async fn wait_until_idle(&self, within: Duration) -> bool {
        let idle = || self.shared().idle();
        let wait = async {
            loop {
                let notified = self.shared().changed();
                if idle() {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
        idle()
    }
}

/// What every connection task works with: how to find a request's key, the handler, and the
/// receiver's state. The configuration lives here rather than in [`Shared`], which holds only
/// what changes as requests come in.
struct Serving {
    key_header: String,
    batch_id: Option<String>,
    handler: BoxHandler,
    shared: Arc<Shared>,
}

impl Serving {
    /// Runs the handler for one delivery; a panicking handler answers 500 and records what it
    /// recorded before panicking.
    async fn run_handler(
        &self,
        number: u64,
        key: Option<String>,
        req: &Incoming,
        body: Vec<u8>,
    ) -> (Reply, u64) {
        let run = Arc::new(AtomicU32::new(0));
        let delivery = Delivery {
            number,
            key,
            method: req.method.clone(),
            path: req.path.clone(),
            headers: req.headers.clone(),
            body,
            recorder: self.shared.clone(),
            run: run.clone(),
        };
        let reply = match tokio::spawn((self.handler)(delivery)).await {
            Ok(reply) => reply,
            Err(_) => Reply::json(500, &serde_json::json!({"error": "the handler panicked"})),
        };
        (reply, u64::from(run.load(Ordering::SeqCst)))
    }
}
/// The answer to send, once the receiver knows it.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Answer {
    fn json(status: u16, value: &serde_json::Value) -> Answer {
        Answer {
            status,
            headers: vec![("Content-Type".to_owned(), "application/json".to_owned())],
            body: value.to_string().into_bytes(),
        }
    }
}

async fn serve(serving: Arc<Serving>, stream: TcpStream) {
    let shared = &serving.shared;
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream);
    // A client that hangs up mid-request or sends garbage: dropped, not logged.
    let Ok(req) = wire::read_request(&mut reader).await else {
        return;
    };
    let mut stream = reader.into_inner();
    let key = match &serving.batch_id {
        Some(_) => None,
        None => find_header(&req.headers, &serving.key_header).map(str::to_owned),
    };
    let (number, fault) = shared.arrive(&req.method, &req.path, key.as_deref());
    let head_only = req.method.eq_ignore_ascii_case("HEAD");

    match &fault {
        Some(Fault::ResetBeforeHandler) => {
            shared.set_outcome(number, Handling::Faulted);
            return wire::reset(stream);
        }
        Some(Fault::CloseWithoutReply) => {
            shared.set_outcome(number, Handling::Faulted);
            return wire::close(stream).await;
        }
        Some(Fault::Respond(canned)) => {
            shared.set_outcome(number, Handling::Faulted);
            let headers = canned.headers_at(TokioClock::new().wall());
            return wire::answer(stream, canned.status, &headers, b"", None, head_only).await;
        }
        _ => {}
    }
    if let Some(Fault::SlowHandler(delay)) = &fault {
        // Before the claim for a batch (it has no single key); after it otherwise (below).
        if serving.batch_id.is_some() {
            tokio::time::sleep(*delay).await;
        }
    }

    let (outcome, answer) = match &serving.batch_id {
        Some(field) => handle_batch(&serving, number, &req, field).await,
        None => handle_one(&serving, number, key, &req, fault.as_ref()).await,
    };
    shared.set_outcome(number, outcome);

    match fault {
        Some(Fault::ResetAfterCommit) => {
            shared.set_answer_fault(number, "then connection reset: answer lost".to_owned());
            wire::reset(stream);
        }
        Some(Fault::CutBodyAfterCommit(keep)) => {
            shared.set_answer_fault(
                number,
                format!("answer cut after {keep} bytes of its body: answer lost"),
            );
            wire::answer_cut(stream, answer.status, &answer.headers, &answer.body, keep).await;
        }
        Some(Fault::StallAfterCommit(delay)) => {
            if wire::stall(&mut stream, delay).await {
                shared.set_answer_fault(
                    number,
                    format!("answer held {}ms, then sent", delay.as_millis()),
                );
                let Answer {
                    status,
                    headers,
                    body,
                } = answer;
                wire::answer(stream, status, &headers, &body, None, head_only).await;
            } else {
                shared.set_answer_fault(
                    number,
                    format!(
                        "answer held {}ms; the client hung up first: answer lost",
                        delay.as_millis()
                    ),
                );
            }
        }
        _ => {
            wire::answer(
                stream,
                answer.status,
                &answer.headers,
                &answer.body,
                None,
                head_only,
            )
            .await;
        }
    }
}

async fn handle_one(
    serving: &Serving,
    number: u64,
    key: Option<String>,
    req: &Incoming,
    fault: Option<&Fault>,
) -> (Handling, Answer) {
    let slow = match fault {
        Some(Fault::SlowHandler(delay)) => Some(*delay),
        _ => None,
    };
    let Some(key) = key else {
        if let Some(delay) = slow {
            tokio::time::sleep(delay).await;
        }
        let (reply, effects) = serving
            .run_handler(number, None, req, req.body.clone())
            .await;
        return ran(reply, effects);
    };
    match serving
        .shared
        .admit(&key, fingerprint(&req.method, &req.path, &req.body))
    {
        Admission::Run => {
            if let Some(delay) = slow {
                tokio::time::sleep(delay).await;
            }
            let (reply, effects) = serving
                .run_handler(number, Some(key.clone()), req, req.body.clone())
                .await;
            serving.shared.finish(&key, number, &reply, effects);
            ran(reply, effects)
        }
        Admission::Replay(saved) => {
            let mut headers = saved.headers;
            headers.push((REPLAYED_HEADER.to_owned(), "true".to_owned()));
            let outcome = Handling::Replayed {
                status: saved.status,
            };
            let answer = Answer {
                status: saved.status,
                headers,
                body: saved.body,
            };
            (outcome, answer)
        }
        Admission::InProgress => (
            Handling::InProgress,
            Answer::json(
                409,
                &serde_json::json!({"error": "a request with this idempotency key is in progress"}),
            ),
        ),
        Admission::Mismatch => (
            Handling::Mismatch,
            Answer::json(
                422,
                &serde_json::json!({"error": "idempotency key reused with a different request"}),
            ),
        ),
    }
}

fn ran(reply: Reply, effects: u64) -> (Handling, Answer) {
    let outcome = Handling::Ran {
        status: reply.status,
        effects,
    };
    let answer = Answer {
        status: reply.status,
        headers: reply.headers,
        body: reply.body,
    };
    (outcome, answer)
}

async fn handle_batch(
    serving: &Serving,
    number: u64,
    req: &Incoming,
    field: &str,
) -> (Handling, Answer) {
    let events = serde_json::from_slice::<serde_json::Value>(&req.body)
        .ok()
        .and_then(|json| match json {
            serde_json::Value::Array(events) => Some(events),
            _ => None,
        })
        .and_then(|events| {
            events
                .into_iter()
                .map(|event| {
                    let id = match event.get(field)? {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Number(n) => n.to_string(),
                        _ => return None,
                    };
                    Some((id, event))
                })
                .collect::<Option<Vec<_>>>()
        });
    let Some(events) = events else {
        let error = format!("expected a JSON array of objects, each with an {field:?} id");
        return (
            Handling::BadRequest,
            Answer::json(400, &serde_json::json!({ "error": error })),
        );
    };

    let (mut processed, mut duplicates, mut failed) = (0, 0, false);
    for (id, event) in events {
        let body = event.to_string().into_bytes();
        match serving
            .shared
            .admit(&id, fingerprint("EVENT", field, &body))
        {
            Admission::Run => {
                let (reply, effects) = serving
                    .run_handler(number, Some(id.clone()), req, body)
                    .await;
                failed |= effects == 0 && reply.status >= 500;
                serving.shared.finish(&id, number, &reply, effects);
                processed += 1;
            }
            Admission::Replay(_) | Admission::InProgress | Admission::Mismatch => duplicates += 1,
        }
    }
    let summary = serde_json::json!({ "processed": processed, "duplicates": duplicates });
    let status = if failed { 500 } else { 200 };
    (
        Handling::Batch {
            processed,
            duplicates,
        },
        Answer::json(status, &summary),
    )
}
