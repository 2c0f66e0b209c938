//! A scripted HTTP/1.1 test server for the integration tests.
//!
//! What tests assert is what a user of the crate cares about: how many attempts reached the server
//! ([`TestServer::hits`]), that every attempt carried the same key ([`TestServer::keys`]), how many
//! side effects happened ([`TestServer::effects`]) and how long the client waited between attempts
//! ([`gaps`]).
//!
//! Ground rules:
//!
//! - The server listens on `127.0.0.1:0` and runs in the test's own tokio runtime (current-thread or
//!   multi-thread; every task is started with `tokio::spawn`), on the real clock.
//! - **One request per connection.** Every answer carries `Connection: close` and `Content-Length`,
//!   and the server closes after answering, so every attempt is a fresh connection and counts are
//!   exact. Keep-alive clients still work: they reconnect.
//! - Each request is **read completely** (head, then a `Content-Length` or chunked body) before
//!   anything else happens, so a recorded request was really "sent". It is then recorded (in arrival
//!   order, i.e. the order in which requests finished arriving), takes its action, and the action
//!   runs. A client that hangs up before its request is complete is dropped silently and is not
//!   recorded.
//! - A side effect ("commit") is counted when a request's action commits: a 2xx `Respond`
//!   (or `PartialBody`), a `ResetAfterCommit`, or a `StallThen { commit_first: true, .. }` before it
//!   stalls. A request commits at most once: after `commit_first`, the inner action no longer
//!   commits. The commit is counted before the answer is written, so it is visible to the test by
//!   the time the client sees any outcome.
//! - Dropping the [`TestServer`] aborts the accept loop and, with it, every connection task.
//! - Bookkeeping sits behind a `std::sync::Mutex` that is never held across an `.await`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::BufReader;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

// The HTTP/1.1 reading and the fault primitives (reset, clean close, stall) are the testkit's
// own (its doc-hidden `wire` module), so the two servers cannot drift apart; `raw.rs` uses them
// too.
pub(super) use idempotent_retry_testkit::wire;

use wire::{Incoming, accept_loop, answer, close, find_header, read_request, reset, stall};

/// The default idempotency key header (matched case-insensitively).
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Body saved for a commit that has no response body of its own (`ResetAfterCommit`, or
/// `StallThen { commit_first: true, .. }` whose inner action is not a 2xx answer). The idempotent
/// mode replays it with status 200.
pub const COMMITTED_BODY: &str = "committed";

/// Header added to a replayed answer in idempotent mode (Stripe's name for it).
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

/// What the server does with one request, after reading it completely and recording it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Answer with this status, headers and body (`Content-Length` and `Connection: close` are
    /// always added; the same names in `headers` are ignored). Counts as a side effect ("commit")
    /// when the status is 2xx. A `HEAD` request gets the head only.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// Reset the connection (`SO_LINGER` 0, then drop) without answering. No commit.
    Reset,
    /// Commit the side effect, then reset (the response is lost).
    ResetAfterCommit,
    /// Close cleanly (FIN) without answering. No commit.
    Close,
    /// Wait `delay` before running `then` (to trip client timeouts). If the client hangs up
    /// meanwhile, stop there: `then` never runs. `then`'s commit rule applies when it runs;
    /// `commit_first: true` commits before stalling instead (the side effect happens even though
    /// the client times out; `then` does not commit a second time).
    StallThen {
        delay: Duration,
        commit_first: bool,
        then: Box<Action>,
    },
    /// Send the status and headers with `Content-Length: declared_len`, then only `body` (which
    /// should be shorter), then close cleanly: the body is cut mid-read. Commits when 2xx (the
    /// server did the work; the answer got lost on the way).
    PartialBody {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
        declared_len: usize,
    },
}

impl Action {
    /// `status` with no extra headers and an empty body.
    pub fn status(status: u16) -> Action {
        Action::status_with(status, &[])
    }

    /// `status` with these headers and an empty body.
    pub fn status_with(status: u16, headers: &[(&str, &str)]) -> Action {
        Action::respond(status, headers, "")
    }

    /// 200 with this body.
    pub fn ok(body: impl Into<String>) -> Action {
        Action::respond(200, &[], body)
    }

    /// 200 with this body and `Content-Type: application/json`.
    pub fn json(status: u16, body: impl Into<String>) -> Action {
        Action::respond(status, &[("Content-Type", "application/json")], body)
    }

    /// Full control over the answer.
    pub fn respond(status: u16, headers: &[(&str, &str)], body: impl Into<String>) -> Action {
        Action::Respond {
            status,
            headers: owned(headers),
            body: body.into(),
        }
    }

    /// Stall `delay`, then close without answering; no commit. With a delay longer than the
    /// client's timeout this is "the server never answers".
    pub fn stall(delay: Duration) -> Action {
        Action::stall_then(delay, Action::Close)
    }

    /// Stall 10 s, then close without answering; no commit.
    pub fn hang() -> Action {
        Action::stall(Duration::from_secs(10))
    }

    /// Stall `delay`, then run `then` (which commits by its own rule when it runs).
    pub fn stall_then(delay: Duration, then: Action) -> Action {
        Action::StallThen {
            delay,
            commit_first: false,
            then: Box::new(then),
        }
    }

    /// Commit, stall `delay`, then run `then` (which does not commit again).
    pub fn commit_then_stall(delay: Duration, then: Action) -> Action {
        Action::StallThen {
            delay,
            commit_first: true,
            then: Box::new(then),
        }
    }

    /// A 200 whose body is cut: `Content-Length` says `body.len() + 100`, then `body` is sent and
    /// the connection closed.
    pub fn partial_body(body: impl Into<String>) -> Action {
        let body = body.into();
        Action::PartialBody {
            status: 200,
            headers: Vec::new(),
            declared_len: body.len() + 100,
            body,
        }
    }

    /// The (status, body) an idempotent receiver saves when this action commits up front.
    fn saved_answer(&self) -> (u16, String) {
        match self {
            Action::Respond { status, body, .. } | Action::PartialBody { status, body, .. }
                if is_2xx(*status) =>
            {
                (*status, body.clone())
            }
            Action::StallThen { then, .. } => then.saved_answer(),
            _ => (200, COMMITTED_BODY.to_owned()),
        }
    }
}

fn owned(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

fn is_2xx(status: u16) -> bool {
    (200..300).contains(&status)
}

/// One request as the server read it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// The request target as sent (origin form: path plus `?query` if any).
    pub path: String,
    /// In the order sent; names lowercased, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The complete body (chunked bodies are decoded).
    pub body: Vec<u8>,
    /// When the request had been read completely.
    pub at: Instant,
    /// Idempotent mode only: answered from the saved commit (a replay, or a 422 for a key reused
    /// with a different request) without taking a script step.
    pub replayed: bool,
}

impl Recorded {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as UTF-8 (lossy).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Gaps between consecutive request arrivals, for asserting waits. Real time: assert lower bounds
/// only.
pub fn gaps(reqs: &[Recorded]) -> Vec<Duration> {
    reqs.windows(2)
        .map(|w| w[1].at.saturating_duration_since(w[0].at))
        .collect()
}

/// A TCP address that refuses connections: a listener is bound on `127.0.0.1:0`, its port taken,
/// and the listener dropped.
pub fn refused_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a throwaway listener");
    listener
        .local_addr()
        .expect("local address of the throwaway listener")
}

/// A scripted server; see the module docs.
pub struct TestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // Dropping the accept loop drops its JoinSet, which aborts every connection task.
        self.task.abort();
    }
}

impl TestServer {
    /// Each request takes the next scripted action; when the script runs out, `fallback` repeats.
    pub async fn start(script: Vec<Action>, fallback: Action) -> TestServer {
        TestServer::launch(script, fallback, None).await
    }

    /// Like [`TestServer::start`], but the server behaves as an idempotent receiver keyed by the
    /// `Idempotency-Key` header (case-insensitive). A request whose key already committed:
    ///
    /// - with the same method, target and body as the committing request, is answered with the
    ///   saved answer of the commit (its 2xx status and body, or 200 and [`COMMITTED_BODY`] for a
    ///   commit without an answer of its own) plus `Idempotent-Replayed: true`;
    /// - with a different method, target or body, is answered 422.
    ///
    /// Either way: no new side effect, and **no script step is consumed** (the request is still
    /// recorded, with `replayed: true`, and counts in `hits`). Requests without a key, or whose
    /// key has not committed yet, take script steps as usual. Concurrent duplicates that arrive
    /// before the commit are not detected (script a 409 to simulate "in progress").
    pub async fn start_idempotent(script: Vec<Action>, fallback: Action) -> TestServer {
        TestServer::start_idempotent_with(IDEMPOTENCY_KEY, script, fallback).await
    }

    /// [`TestServer::start_idempotent`] keyed by another header (e.g. `PayPal-Request-Id`).
    /// [`TestServer::effects_for`] then counts by that header too.
    pub async fn start_idempotent_with(
        key_header: &str,
        script: Vec<Action>,
        fallback: Action,
    ) -> TestServer {
        TestServer::launch(script, fallback, Some(key_header)).await
    }

    async fn launch(script: Vec<Action>, fallback: Action, idem: Option<&str>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the test server on 127.0.0.1:0");
        let addr = listener.local_addr().expect("test server address");
        let shared = Arc::new(Shared {
            idempotent: idem.is_some(),
            key_header: idem.unwrap_or(IDEMPOTENCY_KEY).to_ascii_lowercase(),
            state: Mutex::new(State {
                script: script.into(),
                fallback,
                requests: Vec::new(),
                effects: 0,
                effects_by_key: HashMap::new(),
                saved: HashMap::new(),
            }),
        });
        let task = tokio::spawn({
            let shared = shared.clone();
            accept_loop(listener, move |stream| serve(shared.clone(), stream))
        });
        TestServer { addr, shared, task }
    }

    /// `http://127.0.0.1:PORT/path` (a missing leading `/` is added).
    pub fn url(&self, path: &str) -> String {
        if path.starts_with('/') {
            format!("http://{}{}", self.addr, path)
        } else {
            format!("http://{}/{}", self.addr, path)
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request read completely, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// Number of requests read completely (attempts that reached the server).
    pub fn hits(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// The `Idempotency-Key` of each request, in arrival order.
    pub fn keys(&self) -> Vec<Option<String>> {
        self.keys_in(IDEMPOTENCY_KEY)
    }

    /// The value of header `name` (case-insensitive) of each request, in arrival order.
    pub fn keys_in(&self, name: &str) -> Vec<Option<String>> {
        self.shared
            .lock()
            .requests
            .iter()
            .map(|r| r.header(name).map(str::to_owned))
            .collect()
    }

    /// Side effects committed in total.
    pub fn effects(&self) -> usize {
        self.shared.lock().effects
    }

    /// Side effects committed by requests carrying this key (in the server's key header:
    /// `Idempotency-Key` unless started with [`TestServer::start_idempotent_with`]).
    pub fn effects_for(&self, key: &str) -> usize {
        self.shared
            .lock()
            .effects_by_key
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Appends a step to the script, for answers that name a server started after this one.
    pub fn push_script(&self, action: Action) {
        self.shared.lock().script.push_back(action);
    }

    /// Script steps not taken yet (the fallback not counted).
    pub fn script_left(&self) -> usize {
        self.shared.lock().script.len()
    }

    /// Wait (polling every 5 ms, at most `within`) until at least `n` requests were recorded;
    /// returns the number recorded.
    pub async fn wait_for_hits(&self, n: usize, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let hits = self.hits();
            if hits >= n || Instant::now() >= deadline {
                return hits;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

struct Shared {
    idempotent: bool,
    /// Lowercased.
    key_header: String,
    state: Mutex<State>,
}

struct State {
    script: VecDeque<Action>,
    fallback: Action,
    requests: Vec<Recorded>,
    effects: usize,
    effects_by_key: HashMap<String, usize>,
    /// Idempotent mode: the saved answer per committed key.
    saved: HashMap<String, Saved>,
}

struct Saved {
    fingerprint: Fingerprint,
    status: u16,
    body: String,
}

#[derive(Clone, PartialEq, Eq)]
struct Fingerprint {
    method: String,
    path: String,
    body: Vec<u8>,
}

/// What to do with a request that was just recorded.
enum Admission {
    Act(Action),
    Replay { status: u16, body: String },
    KeyReused,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test panicking elsewhere must not turn every later call into a panic.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Record the request and decide what happens to it, atomically (so arrival order is script
    /// order).
    fn admit(&self, req: Incoming, key: Option<&str>, fingerprint: &Fingerprint) -> Admission {
        let mut st = self.lock();
        let admission = match key
            .filter(|_| self.idempotent)
            .and_then(|k| st.saved.get(k))
        {
            Some(saved) if saved.fingerprint == *fingerprint => Admission::Replay {
                status: saved.status,
                body: saved.body.clone(),
            },
            Some(_) => Admission::KeyReused,
            None => {
                let next = st.script.pop_front();
                Admission::Act(next.unwrap_or_else(|| st.fallback.clone()))
            }
        };
        st.requests.push(Recorded {
            method: req.method,
            path: req.path,
            headers: req.headers,
            body: req.body,
            at: Instant::now(),
            replayed: !matches!(admission, Admission::Act(_)),
        });
        admission
    }

    fn commit(&self, key: Option<&str>, fingerprint: &Fingerprint, status: u16, body: &str) {
        let mut st = self.lock();
        st.effects += 1;
        if let Some(key) = key {
            *st.effects_by_key.entry(key.to_owned()).or_insert(0) += 1;
            if self.idempotent {
                st.saved.insert(
                    key.to_owned(),
                    Saved {
                        fingerprint: fingerprint.clone(),
                        status,
                        body: body.to_owned(),
                    },
                );
            }
        }
    }
}

async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream);
    // A client that hangs up mid-request or sends garbage: drop the connection, record nothing.
    let Ok(req) = read_request(&mut reader).await else {
        return;
    };
    let stream = reader.into_inner();
    let key = find_header(&req.headers, &shared.key_header).map(str::to_owned);
    let fingerprint = Fingerprint {
        method: req.method.clone(),
        path: req.path.clone(),
        body: req.body.clone(),
    };
    let head_only = req.method.eq_ignore_ascii_case("HEAD");
    match shared.admit(req, key.as_deref(), &fingerprint) {
        Admission::Replay { status, body } => {
            let headers = [(REPLAYED_HEADER.to_owned(), "true".to_owned())];
            answer(stream, status, &headers, body.as_bytes(), None, head_only).await;
        }
        Admission::KeyReused => {
            let body = "idempotency key reused with a different request";
            answer(stream, 422, &[], body.as_bytes(), None, head_only).await;
        }
        Admission::Act(action) => {
            let ctx = Ctx {
                shared: &shared,
                key: key.as_deref(),
                fingerprint: &fingerprint,
                head_only,
            };
            act(ctx, stream, action).await;
        }
    }
}

struct Ctx<'a> {
    shared: &'a Shared,
    key: Option<&'a str>,
    fingerprint: &'a Fingerprint,
    head_only: bool,
}

impl Ctx<'_> {
    fn commit(&self, status: u16, body: &str) {
        self.shared.commit(self.key, self.fingerprint, status, body);
    }
}

async fn act(ctx: Ctx<'_>, mut stream: TcpStream, mut action: Action) {
    let mut committed = false;
    loop {
        match action {
            Action::Respond {
                status,
                headers,
                body,
            } => {
                if !committed && is_2xx(status) {
                    ctx.commit(status, &body);
                }
                answer(
                    stream,
                    status,
                    &headers,
                    body.as_bytes(),
                    None,
                    ctx.head_only,
                )
                .await;
                return;
            }
            Action::PartialBody {
                status,
                headers,
                body,
                declared_len,
            } => {
                if !committed && is_2xx(status) {
                    ctx.commit(status, &body);
                }
                let declared = Some(declared_len);
                answer(
                    stream,
                    status,
                    &headers,
                    body.as_bytes(),
                    declared,
                    ctx.head_only,
                )
                .await;
                return;
            }
            Action::Reset => {
                reset(stream);
                return;
            }
            Action::ResetAfterCommit => {
                if !committed {
                    ctx.commit(200, COMMITTED_BODY);
                }
                reset(stream);
                return;
            }
            Action::Close => {
                close(stream).await;
                return;
            }
            Action::StallThen {
                delay,
                commit_first,
                then,
            } => {
                if commit_first && !committed {
                    let (status, body) = then.saved_answer();
                    ctx.commit(status, &body);
                    committed = true;
                }
                if !stall(&mut stream, delay).await {
                    // The client hung up: stop here, the inner action never runs.
                    return;
                }
                action = *then;
            }
        }
    }
}
