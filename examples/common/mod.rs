//! A small idempotent receiver for the examples: a demo server, not production code.
//!
//! It listens on `127.0.0.1:0` and speaks just enough HTTP/1.1 for the examples: one request per
//! connection, bodies framed by `Content-Length` (chunked bodies are refused by dropping the
//! connection), and every answer carries `Connection: close`.
//!
//! Per `Idempotency-Key` it keeps what a Stripe-style receiver keeps: a status (in progress or
//! completed), a fingerprint of the request and the saved response. It answers:
//!
//! - a key seen for the first time: the handler runs (the side effect: it "sends an email", which
//!   here means incrementing a counter), and its 200 is saved and returned;
//! - a key already completed, same request: the saved response with `Idempotent-Replayed: true`,
//!   and no second email;
//! - a key whose first request is still running: 409;
//! - a key reused with a different request: 422;
//! - no key: the handler runs every time.
//!
//! A real receiver keeps these rows in the same database as the side effect, in one transaction;
//! this one keeps them in memory behind a mutex.
//!
//! [`Server::inject`] scripts a [`Fault`] for the Nth request to arrive, and [`Server::log`] gives
//! one [`LogLine`] per request: when it arrived and what the server did with it. Dropping the
//! [`Server`] stops it and every connection it is serving.

// The server stamps arrivals with the real clock, which the crate's clippy.toml bans (the crate
// reads time only through its injected `Clock`). A demo server needs real time; the examples'
// own code does not read the clock.
#![allow(clippy::disallowed_methods)]
// Each example uses a different part of this module.
#![allow(dead_code)]

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt::{self, Write as _};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep, timeout};

use idempotent_retry::{Client, RetryPolicy};

/// A client for the demo server with this policy. The server is on loopback: the inner reqwest
/// client never goes through a proxy from the environment.
pub fn loopback_client(policy: RetryPolicy) -> Result<Client, Box<dyn StdError>> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    Ok(Client::builder().http(http).policy(policy).build()?)
}

/// Limits that keep a misbehaving client from costing more than a little memory and time.
const MAX_HEAD: u64 = 16 * 1024;
const MAX_BODY: usize = 1024 * 1024;
const READ_LIMIT: Duration = Duration::from_secs(5);
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// What goes wrong with one scripted request.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// The connection is reset before the handler runs: nothing happened, no key was recorded.
    ResetBeforeHandler,
    /// The handler runs (the email is sent, the 200 saved), then the connection is reset: the
    /// side effect happened but the response is lost.
    ResetAfterCommit,
    /// The handler takes this long before it commits; the key stays in progress meanwhile. It
    /// finishes even if the client has given up.
    SlowHandler(Duration),
    /// This status and these headers, without running the handler (an overloaded front end, a
    /// rate limiter).
    Status(u16, &'static [(&'static str, &'static str)]),
}

/// What the server did with one request.
#[derive(Debug, Clone)]
pub struct LogLine {
    /// 1 for the first request to arrive.
    pub n: usize,
    /// When the request had been read, in milliseconds since the server started.
    pub at_ms: u128,
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    /// What the server did, in words.
    pub did: String,
}

impl fmt::Display for LogLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = self
            .key
            .as_deref()
            .map_or("none", |k| k.get(..8).unwrap_or(k));
        write!(
            f,
            "#{} +{}ms {} {} key={key}: {}",
            self.n, self.at_ms, self.method, self.path, self.did
        )
    }
}

/// The demo receiver. See the module docs.
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // The accept loop owns the connection tasks (a JoinSet): aborting it aborts them all.
        self.task.abort();
    }
}

impl Server {
    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    pub async fn start() -> std::io::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            started: Instant::now(),
            state: Mutex::default(),
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Server { addr, shared, task })
    }

    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Scripts `fault` for the `nth` request to arrive (1 for the first).
    pub fn inject(&self, nth: usize, fault: Fault) {
        self.shared.lock().faults.insert(nth, fault);
    }

    /// How many requests have arrived so far: the next one is `arrivals() + 1`.
    pub fn arrivals(&self) -> usize {
        self.shared.lock().log.len()
    }

    /// Emails sent by requests carrying `key`.
    pub fn sent(&self, key: &str) -> usize {
        self.shared
            .lock()
            .sent_by_key
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Emails sent in total, keyed or not.
    pub fn total_sent(&self) -> usize {
        self.shared.lock().sent_total
    }

    /// One line per request, in arrival order.
    pub fn log(&self) -> Vec<LogLine> {
        self.shared.lock().log.clone()
    }
}

struct Shared {
    started: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    faults: HashMap<usize, Fault>,
    log: Vec<LogLine>,
    keys: HashMap<String, KeyRecord>,
    sent_by_key: HashMap<String, usize>,
    sent_total: usize,
}

/// The receiver's row for one key.
struct KeyRecord {
    fingerprint: u64,
    /// `None` while the first request runs; the saved 200 body once it completed.
    saved: Option<String>,
}

/// What the idempotency check says about a request.
enum Admission {
    Run,
    InProgress,
    Mismatch,
    Replay(String),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Logs the arrival and takes the request's scripted fault, if any.
    fn arrive(&self, req: &Request) -> (usize, Option<Fault>) {
        let mut st = self.lock();
        let n = st.log.len() + 1;
        st.log.push(LogLine {
            n,
            at_ms: self.started.elapsed().as_millis(),
            method: req.method.clone(),
            path: req.path.clone(),
            key: req.key.clone(),
            did: String::new(),
        });
        (n, st.faults.remove(&n))
    }

    /// Appends to request `n`'s log line.
    fn note(&self, n: usize, what: impl fmt::Display) {
        if let Some(line) = self.lock().log.get_mut(n - 1) {
            if !line.did.is_empty() {
                line.did.push_str("; ");
            }
            line.did.push_str(&what.to_string());
        }
    }

    /// The idempotency check. The lookup and the insert happen under one lock, as a unique
    /// constraint would do it, so two concurrent requests cannot both run the handler.
    fn admit(&self, key: Option<&str>, fingerprint: u64) -> Admission {
        let Some(key) = key else {
            return Admission::Run;
        };
        let mut st = self.lock();
        match st.keys.get(key) {
            Some(row) if row.fingerprint != fingerprint => Admission::Mismatch,
            Some(KeyRecord { saved: None, .. }) => Admission::InProgress,
            Some(KeyRecord {
                saved: Some(body), ..
            }) => Admission::Replay(body.clone()),
            None => {
                let row = KeyRecord {
                    fingerprint,
                    saved: None,
                };
                st.keys.insert(key.to_owned(), row);
                Admission::Run
            }
        }
    }

    /// The handler's side effect: send the email, save the response, mark the key completed.
    fn commit(&self, key: Option<&str>) -> (usize, String) {
        let mut st = self.lock();
        st.sent_total += 1;
        let id = st.sent_total;
        let body = format!(r#"{{"id":"email_{id}","status":"sent"}}"#);
        if let Some(key) = key {
            *st.sent_by_key.entry(key.to_owned()).or_default() += 1;
            if let Some(row) = st.keys.get_mut(key) {
                row.saved = Some(body.clone());
            }
        }
        (id, body)
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(shared.clone(), stream));
                }
                // For example out of file descriptors: pause and keep serving.
                Err(_) => sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(shared: Arc<Shared>, stream: TcpStream) {
    let mut reader = BufReader::new(stream);
    // A client that sends garbage, too much, or too slowly is dropped and not logged.
    let Ok(Some(req)) = timeout(READ_LIMIT, read_request(&mut reader)).await else {
        return;
    };
    let stream = reader.into_inner();
    let (n, fault) = shared.arrive(&req);

    match fault {
        Some(Fault::ResetBeforeHandler) => {
            shared.note(n, "connection reset before the handler ran (nothing done)");
            return reset(stream);
        }
        Some(Fault::Status(status, headers)) => {
            let mut note = format!("injected {status}");
            for (name, value) in headers {
                let _ = write!(note, " {name}: {value}");
            }
            shared.note(n, format!("{note}, handler not run"));
            return respond(stream, status, headers, "").await;
        }
        _ => {}
    }

    let key = req.key.as_deref();
    match shared.admit(key, fingerprint(&req)) {
        Admission::Replay(body) => {
            shared.note(n, "key completed: saved 200 replayed, no new email");
            respond(stream, 200, &[("Idempotent-Replayed", "true")], &body).await;
        }
        Admission::InProgress => {
            shared.note(n, "key in progress: 409");
            let body = r#"{"error":"a request with this key is in progress"}"#;
            respond(stream, 409, &[], body).await;
        }
        Admission::Mismatch => {
            shared.note(n, "key reused with a different body: 422");
            let body = r#"{"error":"idempotency key reused with different parameters"}"#;
            respond(stream, 422, &[], body).await;
        }
        Admission::Run => {
            let started = if key.is_some() { "new key" } else { "no key" };
            if let Some(Fault::SlowHandler(delay)) = fault {
                shared.note(
                    n,
                    format!("{started}, handler takes {}ms", delay.as_millis()),
                );
                sleep(delay).await;
            } else {
                shared.note(n, started);
            }
            let (id, body) = shared.commit(key);
            let at = shared.started.elapsed().as_millis();
            let saved = if key.is_some() { ", 200 saved" } else { "" };
            shared.note(n, format!("email #{id} sent at +{at}ms{saved}"));
            if let Some(Fault::ResetAfterCommit) = fault {
                shared.note(n, "then connection reset: response lost");
                reset(stream);
            } else {
                respond(stream, 200, &[], &body).await;
            }
        }
    }
}

/// What identifies "the same request" for a key: method, path and body. A JSON body counts in its
/// RFC 8785 canonical form, so member order and number spelling do not matter (a real receiver
/// would store a SHA-256 of this; a std hash is enough for a demo).
fn fingerprint(req: &Request) -> u64 {
    let mut hasher = DefaultHasher::new();
    (&req.method, &req.path).hash(&mut hasher);
    match serde_json::from_slice::<serde_json::Value>(&req.body) {
        Ok(json) => idempotent_retry::canonical_json(&json).hash(&mut hasher),
        Err(_) => req.body.hash(&mut hasher),
    }
    hasher.finish()
}

/// A request as read off the wire.
struct Request {
    method: String,
    path: String,
    key: Option<String>,
    body: Vec<u8>,
}

/// Reads one request: the request line, headers up to the empty line, a `Content-Length` body.
/// `None` for anything else (end of stream, oversize, chunked, not HTTP/1.x).
async fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut head = reader.take(MAX_HEAD);
    let mut line = String::new();
    head.read_line(&mut line).await.ok()?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let (method, path) = (method.to_owned(), path.to_owned());

    let (mut key, mut length) = (None, 0);
    loop {
        line.clear();
        if head.read_line(&mut line).await.ok()? == 0 {
            return None; // the stream ended, or the head is too long
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("idempotency-key") {
            key = Some(value.to_owned());
        } else if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().ok().filter(|&len| len <= MAX_BODY)?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return None;
        }
    }

    let mut body = vec![0; length];
    head.into_inner().read_exact(&mut body).await.ok()?;
    Some(Request {
        method,
        path,
        key,
        body,
    })
}

/// Writes a complete answer, then closes the connection cleanly.
async fn respond(mut stream: TcpStream, status: u16, headers: &[(&str, &str)], body: &str) {
    let reason = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in headers {
        let _ = write!(out, "{name}: {value}\r\n");
    }
    if !body.is_empty() {
        out.push_str("Content-Type: application/json\r\n");
    }
    let _ = write!(
        out,
        "Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // The client may have gone (a slow handler outlived its timeout): nothing to do then.
    if stream.write_all(out.as_bytes()).await.is_err() || stream.shutdown().await.is_err() {
        return;
    }
    // Wait (briefly) for the client to close first, so the close is a FIN and not a reset.
    let mut scratch = [0; 512];
    let _ = timeout(DRAIN_LIMIT, async {
        while let Ok(1..) = stream.read(&mut scratch).await {}
    })
    .await;
}

/// A real TCP reset: `SO_LINGER` 0, then close.
fn reset(stream: TcpStream) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}
