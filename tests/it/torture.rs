//! The ledger under a crash torture: worker processes (this test binary run again) send a
//! round of charges through a [`Client`] with an SQLite file or a PostgreSQL database as their
//! ledger, across a fault proxy to an idempotent receiver, and are killed with SIGKILL at
//! chosen moments (as they claim, between attempts, after the receiver committed but before
//! its answer got back, after the answer got back while it is recorded, at a random time) and
//! run again, one or two workers at a time; in half the rounds the last one runs to its end.
//! Between the client and the receiver, a fault proxy resets connections, swallows or cuts
//! answers, delays them, and now and then refuses connections; the receiver itself resets,
//! answers 503 or 429, or holds its answer after committing. A sweep with an HTTP probe then
//! resolves what is left (in half the rounds a worker process sweeps first, most often killed
//! as it writes the probe's answer), and a last pass sends every charge once more.
//!
//! What is checked, per charge (per key), from the receiver's own record of every execution:
//!
//! - it was executed at most once, and never sent again by a process started after another
//!   had reported it done;
//! - a run that reported it done got that execution's answer; a run that reported it not done
//!   neither executed it nor began after an execution of it;
//! - after the sweep no row is unresolved, and each row agrees with the receiver: succeeded
//!   with its one execution (and that execution's answer saved), failed or not sent with none;
//! - the last pass replays what succeeded without sending it and sends the rest, so every
//!   charge ends executed exactly once.
//!
//! The sizes: `IDEMPOTENT_RETRY_TORTURE_ROUNDS` rounds (default 3) of
//! `IDEMPOTENT_RETRY_TORTURE_OPS` charges (default 4); `IDEMPOTENT_RETRY_TORTURE_SEED` replays
//! a run's draws (kill plans, faults, orders; timing still varies). The seed is printed at the
//! start and in every failure. `docs/torture.md` has the soak figures.
#![cfg(feature = "sqlite")]
// The receiver's commits and a worker's "not done" are compared across processes: by the wall
// clock both processes read. Runs are driven by the real monotonic clock.
#![allow(clippy::disallowed_methods)]

// The receiver's HTTP/1.1 reading and its resets and stalls are the testkit's own.
use idempotent_retry_testkit::wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support::fault_proxy::{FaultProxy, ProxyOdds};
use bytes::Bytes;
use idempotent_retry::ledger::{
    LeaseHeldPolicy, Ledger, LedgerOptions, OperationStatus, SavedResponse, SqliteLedger,
};
use idempotent_retry::reconcile::{HttpProbe, Resolution, SweepReport};
use idempotent_retry::{Client, IdempotencyKey, Outcome, RetryPolicy};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The worker's variables: when set, the test binary is a worker, not the test.
const WORKER_LEDGER: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_LEDGER";
const WORKER_URL: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_URL";
const WORKER_KEYS: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_KEYS";
const WORKER_NAME: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_NAME";
const WORKER_SEED: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_SEED";
/// Set for a worker that sweeps (with a probe at this lookup URL) instead of sending.
const WORKER_LOOKUP: &str = "IDEMPOTENT_RETRY_TORTURE_WORKER_LOOKUP";

/// The header that names the worker process an attempt came from (the fingerprint leaves
/// headers out, so every process sends the same request).
const WORKER_HEADER: &str = "x-torture-worker";
const SCOPE: &str = "torture.charge";
/// What the workers print, and the parent reads, at the start of each of their lines.
const TAG: &str = "torture: ";

/// Each attempt's limit.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a dead worker's lease lives on (a live one renews it every third of this).
const LEASE: Duration = Duration::from_millis(1200);
/// The most a group of workers may take, kills and lease waits included.
const GROUP_LIMIT: Duration = Duration::from_secs(120);
/// The most the sweep may wait for the dead workers' leases to lapse.
const SWEEP_LIMIT: Duration = Duration::from_secs(60);
/// The longest a held answer is held.
const HOLD: Duration = Duration::from_secs(30);

fn worker_policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_millis(400))
        .with_attempt_timeout(ATTEMPT_TIMEOUT)
        .with_max_attempts(4)
        .with_reconcile_window(Duration::from_secs(600))
}

fn ledger_options(worker: &str) -> LedgerOptions {
    LedgerOptions::new()
        .worker(worker)
        .lease(LEASE)
        .on_lease_held(LeaseHeldPolicy::Wait {
            poll: Duration::from_millis(25),
            max_wait: Duration::from_secs(20),
        })
        .call_timeout(Duration::from_secs(10))
}

/// A loopback client with a bound on every exchange.
fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a loopback client")
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value} is not a valid value")),
        Err(_) => default,
    }
}

/// `work`, or a panic naming `what` if it takes longer than `limit`.
async fn within<T>(
    limit: Duration,
    what: impl std::fmt::Display,
    work: impl Future<Output = T>,
) -> T {
    tokio::time::timeout(limit, work)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?}"))
}

/// The bound on one ledger call the parent makes itself.
const LEDGER_LIMIT: Duration = Duration::from_secs(30);

fn unix_nanos(at: SystemTime) -> u128 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos()
}

// ---------------------------------------------------------------------------------------------
// The receiver

/// One execution of a charge: what a non-idempotent receiver's every arrival would be.
#[derive(Debug, Clone)]
struct Execution {
    key: String,
    worker: String,
    body: String,
    at: SystemTime,
}

/// One request to the charge endpoint, and what the receiver did with it.
#[derive(Debug, Clone)]
struct Arrival {
    key: String,
    worker: String,
    what: &'static str,
}

/// What the receiver tells the test as it happens, for a worker's request.
#[derive(Debug)]
struct BankEvent {
    worker: String,
    happened: Happened,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Happened {
    /// A new charge committed, and its answer is held back (the worker is meant to die
    /// waiting for it).
    ChargedAndHeld,
    /// A new charge committed, its answer not held.
    Charged,
    /// A 200 was written and the client closed the connection: it has its answer, and is
    /// recording it.
    Answered,
    /// A lookup was answered: the sweeper has the probe's answer, and is writing it.
    LookedUp,
}

struct BankState {
    rng: StdRng,
    faults: bool,
    /// The answer saved per key (a Stripe-style receiver's record).
    charges: HashMap<String, String>,
    executions: Vec<Execution>,
    arrivals: Vec<Arrival>,
    /// Keys the front door refuses with 429 most of the time (they end "not done").
    throttled: HashSet<String>,
    /// Workers whose next execution holds its answer back.
    hold_for: HashSet<String>,
    events: mpsc::UnboundedSender<BankEvent>,
}

/// An idempotent receiver: `POST /charges` with an `Idempotency-Key` charges once per key and
/// replays the saved answer after; `GET /lookup?key=KEY` answers 200 with the saved answer or
/// 404. It fails on a seeded draw per request: a reset before the charge, a 503 before it, a
/// reset after it committed, or an answer held back after it committed; a throttled key gets
/// 429s. The charge itself is one step under the state's lock, so it is atomic.
struct Bank {
    addr: SocketAddr,
    state: Arc<Mutex<BankState>>,
    accept: JoinHandle<()>,
}

/// What one request gets, decided under the lock.
enum Answer {
    Reset,
    Status(u16),
    Json(String),
    /// Stall until the client hangs up, then reset.
    Hold,
}

impl Bank {
    async fn start(seed: u64) -> (Bank, mpsc::UnboundedReceiver<BankEvent>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (events, receiver) = mpsc::unbounded_channel();
        let state = Arc::new(Mutex::new(BankState {
            rng: StdRng::seed_from_u64(seed),
            faults: false,
            charges: HashMap::new(),
            executions: Vec::new(),
            arrivals: Vec::new(),
            throttled: HashSet::new(),
            hold_for: HashSet::new(),
            events,
        }));
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(wire::accept_loop(listener, move |stream| {
            serve(stream, Arc::clone(&shared))
        }));
        (
            Bank {
                addr,
                state,
                accept,
            },
            receiver,
        )
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn set_faults(&self, on: bool) {
        self.state.lock().unwrap().faults = on;
    }

    fn throttle(&self, key: &str) {
        self.state.lock().unwrap().throttled.insert(key.to_owned());
    }

    fn hold_next(&self, worker: &str) {
        self.state
            .lock()
            .unwrap()
            .hold_for
            .insert(worker.to_owned());
    }

    fn executions(&self) -> Vec<Execution> {
        self.state.lock().unwrap().executions.clone()
    }

    fn arrivals(&self) -> Vec<Arrival> {
        self.state.lock().unwrap().arrivals.clone()
    }

    /// The probe the test's own sweep asks.
    fn probe(&self) -> HttpProbe {
        probe(self.url("/lookup"), "sweeper")
    }
}

/// The probe a sweep asks, sent as `worker`: a lookup by key at `lookup`; found is done (its
/// answer saved), 404 is not done, anything else unknown.
fn probe(lookup: String, worker: &str) -> HttpProbe {
    let mut headers = http::HeaderMap::new();
    headers.insert(WORKER_HEADER, worker.parse().expect("a header value"));
    let http = reqwest::Client::builder()
        .no_proxy()
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a loopback client");
    HttpProbe::new(
        http,
        move |operation| format!("{lookup}?key={}", operation.key),
        |_operation, answer: http::Response<Bytes>| match answer.status().as_u16() {
            200 => Resolution::Done(SavedResponse::new(
                200,
                vec![("content-type".into(), "application/json".into())],
                Some(answer.body().to_vec()),
            )),
            404 => Resolution::NotDone,
            _ => Resolution::Unknown,
        },
    )
}

/// A client that sweeps: every unresolved row is past a window of a millisecond, and the
/// probe answers for it.
fn sweeper<L: Ledger>(ledger: L, probe: HttpProbe, worker: &str) -> Client {
    Client::builder()
        .http(http())
        .policy(worker_policy().with_reconcile_window(Duration::from_millis(1)))
        .ledger(ledger)
        .ledger_options(ledger_options(worker))
        .reconciler_for_scope(SCOPE, probe)
        .build()
        .expect("valid settings")
}

impl Drop for Bank {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<BankState>>) {
    let mut reader = BufReader::new(stream);
    let Ok(Ok(request)) =
        tokio::time::timeout(Duration::from_secs(10), wire::read_request(&mut reader)).await
    else {
        return;
    };
    let mut stream = reader.into_inner();
    let json = [("content-type".to_owned(), "application/json".to_owned())];
    if let Some(key) = request.path.strip_prefix("/lookup?key=") {
        let (saved, events) = {
            let state = state.lock().unwrap();
            (state.charges.get(key).cloned(), state.events.clone())
        };
        match saved {
            Some(body) => wire::answer(stream, 200, &json, body.as_bytes(), None, false).await,
            None => wire::answer(stream, 404, &[], b"", None, false).await,
        }
        if let Some(worker) = wire::find_header(&request.headers, WORKER_HEADER) {
            let _ = events.send(BankEvent {
                worker: worker.to_owned(),
                happened: Happened::LookedUp,
            });
        }
        return;
    }
    let (Some(key), "POST", "/charges") = (
        wire::find_header(&request.headers, "idempotency-key"),
        request.method.as_str(),
        request.path.as_str(),
    ) else {
        wire::answer(stream, 400, &[], b"", None, false).await;
        return;
    };
    let worker = wire::find_header(&request.headers, WORKER_HEADER)
        .unwrap_or("?")
        .to_owned();
    let answer = state.lock().unwrap().decide(key, &worker);
    match answer {
        Answer::Reset => wire::reset(stream),
        Answer::Status(status) => wire::answer(stream, status, &[], b"", None, false).await,
        Answer::Json(body) => {
            wire::answer(stream, 200, &json, body.as_bytes(), None, false).await;
            let events = state.lock().unwrap().events.clone();
            let _ = events.send(BankEvent {
                worker,
                happened: Happened::Answered,
            });
        }
        Answer::Hold => {
            wire::stall(&mut stream, HOLD).await;
            wire::reset(stream);
        }
    }
}

impl BankState {
    /// The whole of one charge request: the draw, the charge (or the replay), the record.
    fn decide(&mut self, key: &str, worker: &str) -> Answer {
        let roll = if self.faults {
            self.rng.random_range(0..100u32)
        } else {
            100
        };
        let arrive = |state: &mut Self, what| {
            state.arrivals.push(Arrival {
                key: key.to_owned(),
                worker: worker.to_owned(),
                what,
            });
        };
        if self.faults && self.throttled.contains(key) && roll < 85 {
            arrive(self, "throttled: 429");
            return Answer::Status(429);
        }
        match roll {
            0..6 => {
                arrive(self, "reset before the charge");
                return Answer::Reset;
            }
            6..13 => {
                arrive(self, "503 before the charge");
                return Answer::Status(503);
            }
            _ => {}
        }
        let (body, fresh) = match self.charges.get(key) {
            Some(body) => (body.clone(), false),
            None => {
                let body = format!(
                    r#"{{"id":"ch_{}","key":"{key}"}}"#,
                    self.executions.len() + 1
                );
                self.charges.insert(key.to_owned(), body.clone());
                self.executions.push(Execution {
                    key: key.to_owned(),
                    worker: worker.to_owned(),
                    body: body.clone(),
                    at: SystemTime::now(),
                });
                (body, true)
            }
        };
        let held = fresh && self.hold_for.remove(worker);
        if fresh {
            let _ = self.events.send(BankEvent {
                worker: worker.to_owned(),
                happened: if held {
                    Happened::ChargedAndHeld
                } else {
                    Happened::Charged
                },
            });
        }
        let (what, answer) = match roll {
            _ if held => ("charged, answer held for a kill", Answer::Hold),
            13..20 => ("reset after the commit", Answer::Reset),
            20..26 => ("answer held after the commit", Answer::Hold),
            _ => ("answered", Answer::Json(body)),
        };
        arrive(
            self,
            match (fresh, what) {
                (true, what) => what,
                (false, "answered") => "replayed",
                (false, _) => "replay lost",
            },
        );
        answer
    }
}

// ---------------------------------------------------------------------------------------------
// The worker

/// The worker: sends its keys in its own order through a client with the ledger, printing a
/// line as it starts each one, before each retry, and as each ends.
async fn worker(spec: &str) {
    let var = |name| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (url, name) = (var(WORKER_URL), var(WORKER_NAME));
    let seed: u64 = var(WORKER_SEED).parse().expect("a seed");
    let mut keys: Vec<IdempotencyKey> = var(WORKER_KEYS)
        .split(',')
        .map(|key| IdempotencyKey::new(key).expect("a valid key"))
        .collect();
    keys.shuffle(&mut StdRng::seed_from_u64(seed));
    let lookup = std::env::var(WORKER_LOOKUP).ok();
    match spec.split_once(':') {
        Some(("sqlite", path)) => {
            let ledger = SqliteLedger::open(path).await.expect("open the ledger");
            work(ledger, &url, lookup, &name, seed, &keys).await;
        }
        #[cfg(feature = "postgres")]
        Some(("postgres", db)) => {
            let ledger = idempotent_retry::ledger::PostgresLedger::connect(db)
                .await
                .expect("connect to the ledger");
            work(ledger, &url, lookup, &name, seed, &keys).await;
        }
        _ => panic!("unknown ledger {spec}"),
    }
    println!("{TAG}finished");
}

/// Sweeps once, with a probe at `lookup`, or sends every key.
async fn work<L: Ledger>(
    ledger: L,
    url: &str,
    lookup: Option<String>,
    name: &str,
    seed: u64,
    keys: &[IdempotencyKey],
) {
    match lookup {
        Some(lookup) => {
            let report = sweeper(ledger, probe(lookup, name), name)
                .reconcile_unresolved(1000)
                .await
                .expect("sweep");
            println!("{TAG}swept {report}");
        }
        None => send_all(ledger, url, name, seed, keys).await,
    }
}

async fn send_all<L: Ledger>(ledger: L, url: &str, name: &str, seed: u64, keys: &[IdempotencyKey]) {
    let client = Client::builder()
        .http(http())
        .policy(worker_policy())
        .without_retry_budget()
        .rng_seed(seed)
        .ledger(ledger)
        .ledger_options(ledger_options(name))
        .on_attempt(|event| {
            if let (Some(key), Some(_)) = (event.key, event.delay) {
                println!("{TAG}retry {key} {}", event.attempt);
            }
        })
        .build()
        .expect("valid settings");
    for key in keys {
        // Before the claim: whatever executed earlier, this run must not call it not done.
        let started = SystemTime::now();
        println!("{TAG}claim {key}");
        let result = client
            .post(url)
            .idempotency_key(key.clone())
            .ledger_scope(SCOPE)
            .header(WORKER_HEADER, name)
            .json(&serde_json::json!({ "charge": key.as_str(), "amount": 1200 }))
            .send()
            .await;
        let outcome = Outcome::of(&result);
        let line = match (result, outcome) {
            (Ok(response), _) => {
                let status = response.status().as_u16();
                match response.text().await {
                    Ok(body) if !body.contains('\n') && !body.is_empty() => {
                        format!("done {status} {body}")
                    }
                    _ => format!("done {status} -"),
                }
            }
            (Err(err), Outcome::NotDone { .. }) => {
                format!("not-done {} {:?}", unix_nanos(started), err.kind())
            }
            (Err(err), Outcome::Done { .. }) => format!("refused {:?}", err.kind()),
            (Err(err), _) => format!("unknown {:?}", err.kind()),
        };
        println!("{TAG}outcome {key} {line}");
    }
}

// ---------------------------------------------------------------------------------------------
// The parent

/// When the parent kills a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    /// Never: the worker runs to its end.
    Never,
    /// As it claims its n-th key (the line printed just before `send`).
    AtClaim(u32),
    /// As its n-th retry waits.
    BetweenAttempts(u32),
    /// When the receiver has committed its first new charge and holds the answer back.
    AfterCommit,
    /// When the receiver has written its first 200 answer to it (charge or replay) and the
    /// worker has read it: while the worker records it.
    AfterAnswer,
    /// This long after it started.
    AtRandom(Duration),
    /// A sweeping worker, when the receiver has answered its first lookup: while it writes
    /// the probe's answer.
    DuringSweep,
}

impl Kill {
    fn name(self) -> &'static str {
        match self {
            Kill::Never => "never",
            Kill::AtClaim(_) => "at claim",
            Kill::BetweenAttempts(_) => "between attempts",
            Kill::AfterCommit => "after commit",
            Kill::AfterAnswer => "after answer",
            Kill::AtRandom(_) => "at random",
            Kill::DuringSweep => "during a sweep",
        }
    }

    fn draw(rng: &mut StdRng, ops: usize) -> Kill {
        let ops = u32::try_from(ops).expect("a few operations");
        match rng.random_range(0..100u32) {
            0..17 => Kill::AtClaim(rng.random_range(1..=ops)),
            17..34 => Kill::BetweenAttempts(rng.random_range(1..=3)),
            34..56 => Kill::AfterCommit,
            56..73 => Kill::AfterAnswer,
            73..93 => Kill::AtRandom(Duration::from_millis(rng.random_range(0..1500))),
            _ => Kill::Never,
        }
    }
}

/// What a worker said about a key, as the parent read it.
#[derive(Debug, Clone)]
#[allow(dead_code)] // `Refused`'s kind is read through `Debug`, in the violations' messages.
enum Said {
    Done {
        status: u16,
        body: Option<String>,
    },
    /// `started`: when the run began to send it.
    NotDone {
        started: SystemTime,
    },
    Unknown,
    Refused(String),
}

#[derive(Debug, Clone)]
struct Report {
    worker: String,
    group: usize,
    key: String,
    said: Said,
}

/// What a backend's torture did, for the summary line and `docs/torture.md`.
#[derive(Debug, Default)]
struct Stats {
    rounds: u64,
    operations: u64,
    workers: u64,
    ran_to_the_end: u64,
    kills: BTreeMap<&'static str, u64>,
    outcomes: BTreeMap<&'static str, u64>,
    executions: u64,
    arrivals: u64,
    arrivals_by_kind: BTreeMap<&'static str, u64>,
    swept: SweepReport,
    final_sent: u64,
    final_replayed: u64,
    /// Keys executed exactly once after the last pass (all of them, or a violation says why).
    charged_once: u64,
    violations: Vec<String>,
}

impl Stats {
    fn summary(&self, name: &str, seed: u64, proxy: &BTreeMap<&'static str, u64>) -> String {
        let mut out = format!(
            "{name}: seed {seed}; {} rounds, {} operations; {} workers ({} ran to the end), kills {:?}; \
             outcomes {:?}; receiver: {} executions, {} charge requests ({} would have charged \
             again without the receiver's own idempotency) {:?}; proxy {:?}; \
             sweep: {}; last pass: {} sent, {} replayed from the ledger, {} keys charged exactly \
             once; {} violations",
            self.rounds,
            self.operations,
            self.workers,
            self.ran_to_the_end,
            self.kills,
            self.outcomes,
            self.executions,
            self.arrivals,
            self.arrivals_by_kind.get("replayed").copied().unwrap_or(0)
                + self
                    .arrivals_by_kind
                    .get("replay lost")
                    .copied()
                    .unwrap_or(0),
            self.arrivals_by_kind,
            proxy,
            self.swept,
            self.final_sent,
            self.final_replayed,
            self.charged_once,
            self.violations.len(),
        );
        for violation in &self.violations {
            let _ = write!(out, "\n  {violation}");
        }
        out
    }
}

fn add_sweep(total: &mut SweepReport, report: &SweepReport) {
    total.unresolved += report.unresolved;
    total.done += report.done;
    total.not_done += report.not_done;
    total.send_again += report.send_again;
    total.still_unknown += report.still_unknown;
    total.busy += report.busy;
    total.settled += report.settled;
    total.no_reconciler += report.no_reconciler;
    total.failed += report.failed;
}

/// One backend's torture: its ledger (opened and migrated by the parent), how workers open it,
/// the receiver behind the proxy.
struct Torture<L> {
    name: &'static str,
    test: &'static str,
    spec: String,
    ledger: L,
    seed: u64,
    bank: Bank,
    events: mpsc::UnboundedReceiver<BankEvent>,
    proxy: FaultProxy,
    logs: tempfile::TempDir,
    stats: Stats,
    /// The last group had a worker killed after the receiver committed its charge.
    killed_after_commit: bool,
}

const FAULTY: ProxyOdds = ProxyOdds {
    reset_on_accept: 6,
    swallow_answer: 8,
    cut_answer: 8,
    delay_answer: 8,
    max_delay: Duration::from_millis(300),
};

/// A worker process as the parent drives it.
struct Running {
    name: String,
    plan: Kill,
    child: tokio::process::Child,
    started: Instant,
    killed: bool,
    finished: bool,
    claims: u32,
    retries: u32,
}

async fn torture<L: Ledger + Clone>(
    name: &'static str,
    test: &'static str,
    spec: String,
    ledger: L,
) {
    let seed = env_or(
        "IDEMPOTENT_RETRY_TORTURE_SEED",
        u64::try_from(unix_nanos(SystemTime::now()) % u128::from(u64::MAX)).expect("fits"),
    );
    let rounds: u32 = env_or("IDEMPOTENT_RETRY_TORTURE_ROUNDS", 3);
    let ops: usize = env_or("IDEMPOTENT_RETRY_TORTURE_OPS", 4);
    eprintln!(
        "torture {name}: seed {seed} (IDEMPOTENT_RETRY_TORTURE_SEED={seed} replays its draws)"
    );
    let (bank, events) = Bank::start(seed ^ 0xba4c).await;
    let proxy = FaultProxy::start(bank.addr, seed ^ 0x9e37, FAULTY).await;
    let mut t = Torture {
        name,
        test,
        spec,
        ledger,
        seed,
        bank,
        events,
        proxy,
        logs: tempfile::tempdir().expect("temp dir"),
        stats: Stats::default(),
        killed_after_commit: false,
    };
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..rounds {
        t.round(round, ops, &mut rng).await;
        if rounds > 10 && (round + 1) % 10 == 0 {
            eprintln!(
                "torture {name}: {} rounds, {} workers, {} violations so far",
                round + 1,
                t.stats.workers,
                t.stats.violations.len()
            );
        }
    }
    let summary = t.stats.summary(name, seed, &t.proxy.counts());
    eprintln!("torture {summary}");
    assert!(
        t.stats.violations.is_empty(),
        "the ledger broke a promise (replay with IDEMPOTENT_RETRY_TORTURE_SEED={seed}): {summary}"
    );
}

impl<L: Ledger + Clone> Torture<L> {
    fn violation(&mut self, round: u32, what: String) {
        self.stats.violations.push(format!("round {round}: {what}"));
    }

    async fn round(&mut self, round: u32, ops: usize, rng: &mut StdRng) {
        let keys: Vec<String> = (0..ops)
            .map(|op| {
                IdempotencyKey::derive(
                    "tests.torture",
                    &[
                        self.name,
                        &self.seed.to_string(),
                        &round.to_string(),
                        &op.to_string(),
                    ],
                )
                .into_string()
            })
            .collect();
        self.bank.throttle(&keys[rng.random_range(0..ops)]);
        self.bank.set_faults(true);
        self.proxy.set_odds(FAULTY);

        let mut reports = Vec::new();
        let mut group_of = HashMap::new();
        // Killing groups, then (in half the rounds) one that runs to its end; in the other
        // half the sweep finds what the last killed workers left in flight.
        let killing_groups = rng.random_range(2..=3usize);
        let run_to_the_end = rng.random_bool(0.5);
        for group in 0..=killing_groups {
            let workers = if rng.random_bool(0.3) { 2 } else { 1 };
            let plans: Vec<Kill> = (0..workers)
                .map(|_| {
                    if group == killing_groups && run_to_the_end {
                        Kill::Never
                    } else {
                        Kill::draw(rng, keys.len())
                    }
                })
                .collect();
            self.group(
                round,
                group,
                &plans,
                &keys,
                rng,
                &mut reports,
                &mut group_of,
                false,
            )
            .await;
        }

        // The network heals; what the dead left is swept.
        self.proxy.set_odds(ProxyOdds::NONE);
        self.bank.set_faults(false);
        if rng.random_bool(0.5) {
            // A worker process sweeps first, and is killed (most often) as it writes the
            // probe's first answer: the test's own sweep finds its hold.
            let plan = if rng.random_bool(0.7) {
                Kill::DuringSweep
            } else {
                Kill::Never
            };
            let (group, sweep) = (killing_groups + 1, true);
            self.group(
                round,
                group,
                &[plan],
                &keys,
                rng,
                &mut reports,
                &mut group_of,
                sweep,
            )
            .await;
        }
        self.sweep(round).await;
        self.check(round, &keys, &reports, &group_of).await;
        self.last_pass(round, &keys).await;
        self.stats.rounds += 1;
        self.stats.operations += keys.len() as u64;
    }

    /// Starts a group of workers on the round's keys, kills each by its plan, and reads them
    /// to their end.
    #[allow(clippy::too_many_arguments)]
    async fn group(
        &mut self,
        round: u32,
        group: usize,
        plans: &[Kill],
        keys: &[String],
        rng: &mut StdRng,
        reports: &mut Vec<Report>,
        group_of: &mut HashMap<String, usize>,
        sweep: bool,
    ) {
        let (lines_tx, mut lines) = mpsc::unbounded_channel::<(usize, Option<String>)>();
        let mut running = Vec::new();
        for (i, &plan) in plans.iter().enumerate() {
            let name = format!("r{round}g{group}w{i}");
            if plan == Kill::AfterCommit {
                self.bank.hold_next(&name);
            }
            let log = std::fs::File::create(self.logs.path().join(format!("{name}.stderr")))
                .expect("a log file");
            let mut command =
                tokio::process::Command::new(std::env::current_exe().expect("the test binary"));
            command
                .args([
                    crate::support::test_name(module_path!(), self.test).as_str(),
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(WORKER_LEDGER, &self.spec)
                .env(WORKER_URL, self.proxy.url("/charges"))
                .env(WORKER_KEYS, keys.join(","))
                .env(WORKER_NAME, &name)
                .env(WORKER_SEED, rng.random::<u64>().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(log))
                .kill_on_drop(true);
            if sweep {
                command.env(WORKER_LOOKUP, self.bank.url("/lookup"));
            }
            let mut child = command.spawn().expect("start a worker");
            let stdout = child.stdout.take().expect("piped stdout");
            let tx = lines_tx.clone();
            tokio::spawn(async move {
                let mut stdout = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = stdout.next_line().await {
                    if let Some(at) = line.find(TAG) {
                        let _ = tx.send((i, Some(line[at + TAG.len()..].to_owned())));
                    }
                }
                let _ = tx.send((i, None));
            });
            group_of.insert(name.clone(), group);
            running.push(Running {
                name,
                plan,
                child,
                started: Instant::now(),
                killed: false,
                finished: false,
                claims: 0,
                retries: 0,
            });
            self.stats.workers += 1;
        }
        drop(lines_tx);

        let limit = Instant::now() + GROUP_LIMIT;
        // Now and then the receiver's side is unreachable for a while (connections refused),
        // most often right after a worker died with a charge committed, so the run that takes
        // its row over cannot reach the receiver; never for the group that runs to its end.
        let mut up_at = None;
        let down_for = if sweep || plans.contains(&Kill::Never) {
            None
        } else if self.killed_after_commit && rng.random_bool(0.7) {
            Some(rng.random_range(1500..3000))
        } else if rng.random_bool(0.2) {
            Some(rng.random_range(300..2500))
        } else {
            None
        };
        if let Some(millis) = down_for {
            self.proxy.down().await;
            up_at = Some(Instant::now() + Duration::from_millis(millis));
        }
        self.killed_after_commit = false;
        let mut open = running.len();
        while open > 0 {
            let next_random = running
                .iter()
                .filter_map(|w| match w.plan {
                    Kill::AtRandom(after) if !w.killed => Some(w.started + after),
                    _ => None,
                })
                .min()
                .unwrap_or(limit);
            tokio::select! {
                Some((i, line)) = lines.recv() => {
                    let Some(line) = line else {
                        open -= 1;
                        continue;
                    };
                    let worker = &mut running[i];
                    let mut words = line.splitn(4, ' ');
                    match (words.next(), words.next(), words.next(), words.next()) {
                        (Some("claim"), Some(_), _, _) => {
                            worker.claims += 1;
                            if worker.plan == Kill::AtClaim(worker.claims) {
                                kill(worker, &mut self.stats);
                            }
                        }
                        (Some("retry"), Some(_), _, _) => {
                            worker.retries += 1;
                            if worker.plan == Kill::BetweenAttempts(worker.retries) {
                                kill(worker, &mut self.stats);
                            }
                        }
                        (Some("outcome"), Some(key), Some(kind), rest) => {
                            let said = parse_said(kind, rest).unwrap_or_else(|| {
                                panic!("seed {}: a worker line not understood: {line}", self.seed)
                            });
                            *self.stats.outcomes.entry(said_name(&said)).or_default() += 1;
                            reports.push(Report {
                                worker: worker.name.clone(),
                                group,
                                key: key.to_owned(),
                                said,
                            });
                        }
                        (Some("swept"), Some(_), _, _) => {}
                        (Some("finished"), None, _, _) => worker.finished = true,
                        _ => panic!("seed {}: a worker line not understood: {line}", self.seed),
                    }
                }
                Some(event) = self.events.recv() => {
                    if let Some(worker) = running.iter_mut().find(|w| w.name == event.worker) {
                        match (worker.plan, event.happened) {
                            (Kill::AfterCommit, Happened::ChargedAndHeld) => {
                                kill(worker, &mut self.stats);
                                self.killed_after_commit = true;
                            }
                            (Kill::AfterAnswer, Happened::Answered)
                            | (Kill::DuringSweep, Happened::LookedUp) => {
                                kill(worker, &mut self.stats);
                            }
                            _ => {}
                        }
                    }
                }
                () = tokio::time::sleep_until(next_random) => {
                    let now = Instant::now();
                    for worker in &mut running {
                        if let Kill::AtRandom(after) = worker.plan
                            && !worker.killed
                            && worker.started + after <= now
                        {
                            kill(worker, &mut self.stats);
                        }
                    }
                }
                () = tokio::time::sleep_until(up_at.unwrap_or(limit)), if up_at.is_some() => {
                    self.proxy.up().await;
                    up_at = None;
                }
                () = tokio::time::sleep_until(limit) => {
                    panic!(
                        "seed {}: round {round} group {group}: workers still running after {GROUP_LIMIT:?} (logs in {})",
                        self.seed,
                        self.logs.path().display()
                    );
                }
            }
        }
        self.proxy.up().await;
        for mut worker in running {
            let status = tokio::time::timeout(Duration::from_secs(30), worker.child.wait())
                .await
                .unwrap_or_else(|_| panic!("seed {}: {} does not exit", self.seed, worker.name))
                .expect("wait for a worker");
            if worker.killed {
                continue;
            }
            if !(status.success() && worker.finished) {
                let log = std::fs::read_to_string(
                    self.logs.path().join(format!("{}.stderr", worker.name)),
                )
                .unwrap_or_default();
                panic!(
                    "seed {}: worker {} (not killed) ended with {status} before its end:\n{log}",
                    self.seed, worker.name
                );
            }
            self.stats.ran_to_the_end += 1;
        }
    }

    /// Sweeps the unresolved rows until none is left under a live lease.
    async fn sweep(&mut self, round: u32) {
        let sweeper = sweeper(self.ledger.clone(), self.bank.probe(), "sweeper");
        let limit = Instant::now() + SWEEP_LIMIT;
        loop {
            let what = format!("seed {}: round {round}: the sweep", self.seed);
            let report = within(LEDGER_LIMIT, what, sweeper.reconcile_unresolved(1000))
                .await
                .unwrap_or_else(|err| panic!("seed {}: round {round}: sweep: {err}", self.seed));
            add_sweep(&mut self.stats.swept, &report);
            if report.failed + report.still_unknown + report.no_reconciler > 0 {
                self.violation(round, format!("the sweep could not resolve rows: {report}"));
            }
            if report.busy == 0 {
                break;
            }
            assert!(
                Instant::now() < limit,
                "seed {}: round {round}: rows still held after {SWEEP_LIMIT:?}: {report}",
                self.seed
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every promise, per key, against the receiver's record.
    async fn check(
        &mut self,
        round: u32,
        keys: &[String],
        reports: &[Report],
        group_of: &HashMap<String, usize>,
    ) {
        let executions = self.bank.executions();
        let arrivals = self.bank.arrivals();
        let round_keys: HashSet<&str> = keys.iter().map(String::as_str).collect();
        for arrival in arrivals
            .iter()
            .filter(|a| round_keys.contains(a.key.as_str()))
        {
            self.stats.arrivals += 1;
            *self.stats.arrivals_by_kind.entry(arrival.what).or_default() += 1;
        }
        for key in keys {
            let charged: Vec<&Execution> = executions.iter().filter(|e| &e.key == key).collect();
            self.stats.executions += charged.len() as u64;
            if charged.len() > 1 {
                self.violation(
                    round,
                    format!("{key} executed {} times: {charged:?}", charged.len()),
                );
            }
            let what = format!("seed {}: round {round}: read {key}", self.seed);
            let row = within(LEDGER_LIMIT, what, self.ledger.get(key))
                .await
                .unwrap_or_else(|err| {
                    panic!("seed {}: round {round}: read {key}: {err}", self.seed)
                });
            match (row.as_ref().map(|row| row.status), charged.len()) {
                (None, 0) => {}
                (Some(OperationStatus::Succeeded), 1) => {
                    let saved = row
                        .as_ref()
                        .and_then(|row| row.response.as_ref())
                        .and_then(|saved| saved.body.clone());
                    if saved.as_deref() != Some(charged[0].body.as_bytes()) {
                        self.violation(
                            round,
                            format!(
                                "{key} succeeded with a saved answer {:?}, not its execution's {}",
                                saved.map(|b| String::from_utf8_lossy(&b).into_owned()),
                                charged[0].body
                            ),
                        );
                    }
                }
                (Some(OperationStatus::FailedFinal | OperationStatus::NotSent), 0) => {}
                (status, n) => self.violation(
                    round,
                    format!("{key}: row {status:?} after the sweep, {n} execution(s): {row:?}"),
                ),
            }
        }
        let mut done_in: HashMap<&str, usize> = HashMap::new();
        for report in reports {
            let charged: Vec<&Execution> =
                executions.iter().filter(|e| e.key == report.key).collect();
            match &report.said {
                Said::Done { status: 200, body } => {
                    let group = done_in.entry(&report.key).or_insert(report.group);
                    *group = (*group).min(report.group);
                    let ok = match (charged.as_slice(), body) {
                        ([one], Some(body)) => &one.body == body,
                        ([_], None) => true,
                        _ => false,
                    };
                    if !ok {
                        self.violation(
                            round,
                            format!("{report:?}: reported done, the receiver has {charged:?}"),
                        );
                    }
                }
                Said::NotDone { started } => {
                    // Executed before the run began (by anyone), or by the run itself. (One
                    // that begins after this run ended may execute it: the key is free then.)
                    let before: Vec<_> = charged
                        .iter()
                        .filter(|e| e.at < *started || e.worker == report.worker)
                        .collect();
                    if !before.is_empty() {
                        self.violation(
                            round,
                            format!("{report:?}: reported not done, though {before:?}"),
                        );
                    }
                }
                Said::Unknown => {}
                Said::Done { .. } | Said::Refused(_) => {
                    self.violation(round, format!("{report:?}: an answer no run should get"));
                }
            }
        }
        // Once a run reported a key done, no process started after it sends the key again.
        for arrival in &arrivals {
            let (Some(&done), Some(&sender)) = (
                done_in.get(arrival.key.as_str()),
                group_of.get(&arrival.worker),
            ) else {
                continue;
            };
            if sender > done {
                self.violation(
                    round,
                    format!(
                        "{} sent by {} in group {sender}, after it was reported done in group {done} ({})",
                        arrival.key, arrival.worker, arrival.what
                    ),
                );
            }
        }
    }

    /// Every key once more, on a healed network: what succeeded replays from the ledger with
    /// nothing sent, the rest is sent; each ends executed once, answered with that execution.
    async fn last_pass(&mut self, round: u32, keys: &[String]) {
        let client = Client::builder()
            .http(http())
            .policy(worker_policy())
            .ledger(self.ledger.clone())
            .ledger_options(ledger_options(&format!("r{round}-last")))
            .build()
            .expect("valid settings");
        let url = self.proxy.url("/charges");
        for key in keys {
            let what = format!("seed {}: round {round}: read {key}", self.seed);
            let before = within(LEDGER_LIMIT, what, self.ledger.get(key))
                .await
                .expect("read")
                .map(|r| r.status);
            let sent_before = self
                .bank
                .arrivals()
                .iter()
                .filter(|a| &a.key == key)
                .count();
            let response = tokio::time::timeout(
                Duration::from_secs(60),
                client
                    .post(&url)
                    .idempotency_key(IdempotencyKey::new(key.clone()).expect("valid"))
                    .ledger_scope(SCOPE)
                    .header(WORKER_HEADER, "last")
                    .json(&serde_json::json!({ "charge": key, "amount": 1200 }))
                    .send(),
            )
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "seed {}: round {round}: {key}: the last pass hangs",
                    self.seed
                )
            });
            let sent = self
                .bank
                .arrivals()
                .iter()
                .filter(|a| &a.key == key)
                .count()
                - sent_before;
            let body = match response {
                Ok(response) if response.status() == 200 => response.text().await.ok(),
                other => {
                    self.violation(round, format!("{key}: the last pass got {other:?}"));
                    continue;
                }
            };
            let charged: Vec<Execution> = self
                .bank
                .executions()
                .into_iter()
                .filter(|e| &e.key == key)
                .collect();
            match (before, sent) {
                (Some(OperationStatus::Succeeded), 0) => self.stats.final_replayed += 1,
                (Some(OperationStatus::Succeeded), n) => self.violation(
                    round,
                    format!("{key} had succeeded, and the last pass sent it {n} time(s)"),
                ),
                (_, _) => self.stats.final_sent += 1,
            }
            if charged.len() == 1 {
                self.stats.charged_once += 1;
            }
            if charged.len() != 1 || body.as_deref() != Some(charged[0].body.as_str()) {
                self.violation(
                    round,
                    format!("{key}: after the last pass {charged:?}, answered {body:?}"),
                );
            }
        }
    }
}

fn kill(worker: &mut Running, stats: &mut Stats) {
    if worker.killed {
        return;
    }
    // SIGKILL: no destructor, no release, nothing but what the worker had committed.
    worker.child.start_kill().expect("SIGKILL a worker");
    worker.killed = true;
    *stats.kills.entry(worker.plan.name()).or_default() += 1;
}

fn parse_said(kind: &str, rest: Option<&str>) -> Option<Said> {
    Some(match kind {
        "done" => {
            let (status, body) = rest?.split_once(' ')?;
            Said::Done {
                status: status.parse().ok()?,
                body: (body != "-").then(|| body.to_owned()),
            }
        }
        "not-done" => {
            let nanos: u64 = rest?.split(' ').next()?.parse().ok()?;
            Said::NotDone {
                started: SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos),
            }
        }
        "unknown" => Said::Unknown,
        "refused" => Said::Refused(rest.unwrap_or_default().to_owned()),
        _ => return None,
    })
}

fn said_name(said: &Said) -> &'static str {
    match said {
        Said::Done { .. } => "done",
        Said::NotDone { .. } => "not done",
        Said::Unknown => "unknown",
        Said::Refused(_) => "refused",
    }
}

/// The proxy's faults do what the torture counts on: each one, alone, against the receiver
/// with its own faults off; then the port closed and opened again.
#[tokio::test]
async fn the_fault_proxy_breaks_connections_as_it_says() {
    let (bank, _events) = Bank::start(1).await;
    let always = |odds: ProxyOdds| ProxyOdds {
        max_delay: Duration::from_millis(50),
        ..odds
    };
    let cases = [
        ("pass", ProxyOdds::NONE, Some(200), false),
        (
            "reset on accept",
            always(ProxyOdds {
                reset_on_accept: 100,
                ..ProxyOdds::NONE
            }),
            None,
            false,
        ),
        (
            "answer swallowed",
            always(ProxyOdds {
                swallow_answer: 100,
                ..ProxyOdds::NONE
            }),
            None,
            true,
        ),
        (
            "answer cut",
            always(ProxyOdds {
                cut_answer: 100,
                ..ProxyOdds::NONE
            }),
            None,
            true,
        ),
        (
            "answer delayed",
            always(ProxyOdds {
                delay_answer: 100,
                ..ProxyOdds::NONE
            }),
            Some(200),
            true,
        ),
    ];
    let http = http();
    let send = |url: String, key: String| {
        let http = http.clone();
        async move {
            let response = http
                .post(url)
                .header("idempotency-key", key)
                .header(WORKER_HEADER, "selftest")
                .body("{}")
                .send()
                .await?;
            let status = response.status().as_u16();
            response.bytes().await.map(|_| status)
        }
    };
    for (name, odds, status, reached) in cases {
        let proxy = FaultProxy::start(bank.addr, 7, odds).await;
        let key = format!("selftest-{}", name.replace(' ', "-"));
        let got = within(
            Duration::from_secs(30),
            name,
            send(proxy.url("/charges"), key.clone()),
        )
        .await
        .ok();
        assert_eq!(got, status, "{name}");
        let arrived = bank.arrivals().iter().any(|a| a.key == key);
        assert_eq!(
            arrived,
            reached || status.is_some(),
            "{name}: reached the receiver"
        );
        assert_eq!(
            proxy.counts().get(name),
            Some(&1),
            "{name}: {:?}",
            proxy.counts()
        );
    }

    let proxy = FaultProxy::start(bank.addr, 7, ProxyOdds::NONE).await;
    proxy.down().await;
    let refused = within(
        Duration::from_secs(30),
        "down",
        send(proxy.url("/charges"), "selftest-down".into()),
    )
    .await
    .expect_err("the port is closed");
    assert!(refused.is_connect(), "{refused:?}");
    proxy.up().await;
    let again = within(
        Duration::from_secs(30),
        "up",
        send(proxy.url("/charges"), "selftest-up".into()),
    )
    .await
    .expect("the port is open again");
    assert_eq!(again, 200);
    assert!(!bank.arrivals().iter().any(|a| a.key == "selftest-down"));
}

fn worker_spec() -> Option<String> {
    std::env::var(WORKER_LEDGER).ok()
}

/// SQLite: workers on one file, killed at every point, against a faulty network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_ledger_keeps_its_promises_through_kills_and_faults() {
    if let Some(spec) = worker_spec() {
        return worker(&spec).await;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("operations.db");
    let ledger = open_sqlite(&path).await;
    torture(
        "sqlite",
        "sqlite_ledger_keeps_its_promises_through_kills_and_faults",
        format!("sqlite:{}", path.display()),
        ledger,
    )
    .await;
}

async fn open_sqlite(path: &Path) -> SqliteLedger {
    let ledger = within(LEDGER_LIMIT, "open the ledger", SqliteLedger::open(path))
        .await
        .expect("open the ledger");
    within(LEDGER_LIMIT, "migrate", ledger.migrate())
        .await
        .expect("migrate");
    ledger
}

/// PostgreSQL: workers on one database, as for SQLite. Needs `IDEMPOTENT_RETRY_PG_URL`
/// (skipped without it, except under `CI`, where it fails).
#[cfg(feature = "postgres")]
#[cfg_attr(
    no_postgres_server,
    ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledger_keeps_its_promises_through_kills_and_faults() {
    if let Some(spec) = worker_spec() {
        return worker(&spec).await;
    }
    let Some(url) = crate::support::fresh_postgres_database().await else {
        return;
    };
    let connect = idempotent_retry::ledger::PostgresLedger::connect(&url);
    let ledger = within(LEDGER_LIMIT, "connect", connect)
        .await
        .expect("connect");
    within(LEDGER_LIMIT, "migrate", ledger.migrate())
        .await
        .expect("migrate");
    torture(
        "postgres",
        "postgres_ledger_keeps_its_promises_through_kills_and_faults",
        format!("postgres:{url}"),
        ledger,
    )
    .await;
}
