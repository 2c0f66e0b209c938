//! A TCP proxy on loopback that stands between a client and a server and breaks connections on
//! a seeded script: each accepted connection passes through, is reset at once, has its answer
//! swallowed (the request reaches the server, the client gets a reset instead of the answer),
//! has its answer cut part-way, or has its answer held back for a while. It can also be taken
//! down, its port closed, so that connecting is refused.
//!
//! Faults act on the answer's direction only: a request is forwarded as soon as its bytes
//! arrive, so a request the server records was sent by a client that was still waiting for it.
//! A reset is a real one (`SO_LINGER` 0, then close). Every connection is bounded: one that
//! stays idle for [`IDLE_LIMIT`] is dropped.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use socket2::SockRef;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// How long a proxied connection may stay without a byte either way before it is dropped.
pub const IDLE_LIMIT: Duration = Duration::from_secs(30);

/// What the proxy does to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProxyFault {
    /// Bytes pass both ways untouched.
    Pass,
    /// The client's connection is reset as soon as it is accepted; nothing is forwarded.
    ResetOnAccept,
    /// The request is forwarded; the answer's first bytes are replaced by a reset.
    SwallowAnswer,
    /// The answer is gathered whole, then only its first bytes (this many thousandths of it,
    /// at least one byte and never all of them) are forwarded, then a reset: the cut lands in
    /// the head or anywhere in the body.
    CutAnswer(u16),
    /// The answer is held back this long, then passed.
    DelayAnswer(Duration),
}

impl ProxyFault {
    fn name(self) -> &'static str {
        match self {
            ProxyFault::Pass => "pass",
            ProxyFault::ResetOnAccept => "reset on accept",
            ProxyFault::SwallowAnswer => "answer swallowed",
            ProxyFault::CutAnswer(_) => "answer cut",
            ProxyFault::DelayAnswer(_) => "answer delayed",
        }
    }
}

/// The odds of each fault, per connection, in percent; the rest pass.
#[derive(Debug, Clone, Copy)]
pub struct ProxyOdds {
    /// [`ProxyFault::ResetOnAccept`].
    pub reset_on_accept: u32,
    /// [`ProxyFault::SwallowAnswer`].
    pub swallow_answer: u32,
    /// [`ProxyFault::CutAnswer`].
    pub cut_answer: u32,
    /// [`ProxyFault::DelayAnswer`], by up to `max_delay`.
    pub delay_answer: u32,
    /// The longest delay.
    pub max_delay: Duration,
}

impl ProxyOdds {
    /// No faults: every connection passes.
    pub const NONE: ProxyOdds = ProxyOdds {
        reset_on_accept: 0,
        swallow_answer: 0,
        cut_answer: 0,
        delay_answer: 0,
        max_delay: Duration::ZERO,
    };
}

struct State {
    rng: StdRng,
    odds: ProxyOdds,
    counts: BTreeMap<&'static str, u64>,
}

/// The proxy: listens on `127.0.0.1`, forwards to one upstream address. It can be taken down
/// (its port closed: connections are refused) and brought up again on the same port. Dropping
/// it stops the accept loop (connections already proxied run to their end).
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("counts", &self.counts())
            .finish()
    }
}

impl FaultProxy {
    /// A proxy to `upstream` whose faults are drawn from a generator seeded with `seed`.
    pub async fn start(upstream: SocketAddr, seed: u64, odds: ProxyOdds) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let state = Arc::new(Mutex::new(State {
            rng: StdRng::seed_from_u64(seed),
            odds,
            counts: BTreeMap::new(),
        }));
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&state)));
        FaultProxy {
            addr,
            upstream,
            state,
            accept: Mutex::new(Some(accept)),
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Changes the odds for the connections accepted from now on.
    pub fn set_odds(&self, odds: ProxyOdds) {
        self.state.lock().unwrap().odds = odds;
    }

    /// How many connections met each fault (and passed), by name.
    pub fn counts(&self) -> BTreeMap<&'static str, u64> {
        self.state.lock().unwrap().counts.clone()
    }

    /// Closes the port: from its return, connecting is refused until [`up`](Self::up).
    pub async fn down(&self) {
        let accept = self.accept.lock().unwrap().take();
        if let Some(accept) = accept {
            accept.abort();
            // The listener is closed once the aborted task is dropped.
            let _ = accept.await;
            *self.state.lock().unwrap().counts.entry("down").or_default() += 1;
        }
    }

    /// Listens on the same port again (after [`down`](Self::down)). Panics if the port cannot
    /// be had back within 5 s.
    pub async fn up(&self) {
        if self.accept.lock().unwrap().is_some() {
            return;
        }
        let mut tries = 0;
        let listener = loop {
            // tokio binds with SO_REUSEADDR: the closed connections' TIME_WAIT does not block it.
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(_) if tries < 500 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => panic!("the proxy cannot listen on {} again: {err}", self.addr),
            }
        };
        let accept = tokio::spawn(accept_loop(
            listener,
            self.upstream,
            Arc::clone(&self.state),
        ));
        *self.accept.lock().unwrap() = Some(accept);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(accept) = self.accept.lock().unwrap().take() {
            accept.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            // Out of descriptors, for example: pause and go on.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        };
        let fault = state.lock().unwrap().draw();
        tokio::spawn(proxy(client, upstream, fault));
    }
}

impl State {
    fn draw(&mut self) -> ProxyFault {
        let odds = self.odds;
        let mut roll = self.rng.random_range(0..100u32);
        let mut next = |odds: u32| {
            let hit = roll < odds;
            roll = roll.saturating_sub(odds);
            hit
        };
        let fault = if next(odds.reset_on_accept) {
            ProxyFault::ResetOnAccept
        } else if next(odds.swallow_answer) {
            ProxyFault::SwallowAnswer
        } else if next(odds.cut_answer) {
            ProxyFault::CutAnswer(self.rng.random_range(1..1000))
        } else if next(odds.delay_answer) && !odds.max_delay.is_zero() {
            let millis = u64::try_from(odds.max_delay.as_millis()).unwrap_or(u64::MAX);
            ProxyFault::DelayAnswer(Duration::from_millis(self.rng.random_range(1..=millis)))
        } else {
            ProxyFault::Pass
        };
        *self.counts.entry(fault.name()).or_default() += 1;
        fault
    }
}

/// A real TCP reset: `SO_LINGER` 0, then close.
fn reset(stream: TcpStream) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// Proxies one connection with `fault`.
async fn proxy(mut client: TcpStream, upstream: SocketAddr, fault: ProxyFault) {
    if fault == ProxyFault::ResetOnAccept {
        reset(client);
        return;
    }
    let Ok(Ok(mut server)) = tokio::time::timeout(IDLE_LIMIT, TcpStream::connect(upstream)).await
    else {
        reset(client);
        return;
    };
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    let mut client_open = true;
    let mut answer_started = false;
    loop {
        let step = tokio::time::timeout(IDLE_LIMIT, async {
            tokio::select! {
                read = client.read(&mut up), if client_open => Step::Up(read.unwrap_or(0)),
                read = server.read(&mut down) => Step::Down(read),
            }
        })
        .await;
        match step {
            Err(_) => {
                reset(client);
                return;
            }
            Ok(Step::Up(0)) => {
                client_open = false;
                let _ = server.shutdown().await;
            }
            Ok(Step::Up(n)) => {
                if server.write_all(&up[..n]).await.is_err() {
                    reset(client);
                    return;
                }
            }
            Ok(Step::Down(Err(_))) => {
                // The server reset: so does the client's side.
                reset(client);
                return;
            }
            Ok(Step::Down(Ok(0))) => {
                let _ = client.shutdown().await;
                // Give the client its FIN back, bounded, so no unread byte turns into a reset.
                let _ = tokio::time::timeout(Duration::from_secs(2), async {
                    while client_open {
                        client_open = matches!(client.read(&mut up).await, Ok(n) if n > 0);
                    }
                })
                .await;
                return;
            }
            Ok(Step::Down(Ok(n))) => {
                let chunk = &down[..n];
                if !answer_started {
                    answer_started = true;
                    match fault {
                        ProxyFault::SwallowAnswer => {
                            reset(client);
                            return;
                        }
                        ProxyFault::CutAnswer(thousandths) => {
                            let mut whole = chunk.to_vec();
                            let _ = tokio::time::timeout(IDLE_LIMIT, async {
                                while let Ok(n) = server.read(&mut down).await {
                                    if n == 0 {
                                        break;
                                    }
                                    whole.extend_from_slice(&down[..n]);
                                }
                            })
                            .await;
                            // At least one byte, never all of them.
                            let keep = (whole.len() * usize::from(thousandths) / 1000)
                                .clamp(1, whole.len().saturating_sub(1).max(1));
                            let _ = client.write_all(&whole[..keep]).await;
                            reset(client);
                            return;
                        }
                        ProxyFault::DelayAnswer(delay) => tokio::time::sleep(delay).await,
                        ProxyFault::Pass | ProxyFault::ResetOnAccept => {}
                    }
                }
                if client.write_all(chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

enum Step {
    Up(usize),
    Down(std::io::Result<usize>),
}
