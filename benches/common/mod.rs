//! What the two overhead benches share: the in-process loopback server, the request every
//! contender sends, and the contenders themselves, so `overhead.rs` (criterion, one contender
//! after another) and `overhead_paired.rs` (interleaved) always time exactly the same work
//! (the peer with a timeout runs in the paired bench alone).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use idempotent_retry::{Client, IdempotencyKey};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::net::TcpListener;

/// The 40-byte JSON body of every request.
const BODY: &str = r#"{"to":"ada@example.com","subject":"hi"}"#;
/// The idempotency key every keyed contender sends.
const KEY: &str = "bench-key-0001";
/// The README quick start's order, whose derived key the quick-start contenders send.
const ORDER: &str = "order_17";

async fn answer(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the whole request body, as a real handler would.
    let _ = request.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::from_static(
        b"{\"ok\":true}",
    ))))
}

/// Starts an HTTP/1.1 keep-alive server on 127.0.0.1 that answers every request 200 with an
/// 11-byte body, and returns its URL.
pub async fn start_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the bench server");
    let addr: SocketAddr = listener.local_addr().expect("bench server address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(
                http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service_fn(answer)),
            );
        }
    });
    format!("http://{addr}/v1/emails")
}

/// One way of sending the benchmark's POST.
#[derive(Clone, Copy, Debug)]
pub enum Contender {
    /// Bare `reqwest`, no timeout.
    Bare,
    /// Bare `reqwest` with a 30 s request timeout: our client sets a per-attempt timeout on
    /// every attempt, so this is the like-for-like floor.
    BareWithTimeout,
    /// Our `Client` with a fixed key.
    Ours,
    /// `reqwest-middleware` with `reqwest-retry`.
    Peer,
    /// `reqwest-middleware` with `reqwest-retry` and the same 30 s request timeout as bare
    /// reqwest + timeout (measured by `overhead_paired.rs` alone).
    PeerWithTimeout,
    /// Our `Client` minting a random key per request, as it does for a POST without one.
    OursRandomKey,
    /// The README's quick start: bare reqwest with a 30 s timeout, the JSON body serialized by
    /// `.json()`, a key derived per request and sent as the header.
    QuickBare,
    /// The quick start's shape exactly: `Client::builder().build()`, `.json()`, the derived key
    /// through `idempotency_key`.
    QuickOurs,
    /// The same request through `reqwest-middleware` + `RetryTransientMiddleware`
    /// (`ExponentialBackoff`, 3 retries) over bare reqwest, the key as the header.
    QuickPeer,
    /// [`QuickPeer`](Self::QuickPeer) with the 30 s timeout our client sets on every attempt.
    QuickPeerTimeout,
}

/// The quick start's JSON body, serialized by each client's `.json()`.
#[derive(serde::Serialize)]
struct Charge {
    amount: u32,
    currency: &'static str,
}

/// The quick start's request body.
const CHARGE: Charge = Charge {
    amount: 100,
    currency: "eur",
};

impl Contender {
    /// Every contender, in the order the criterion bench runs them.
    #[allow(dead_code, reason = "only overhead.rs runs criterion's list")]
    pub const ALL: [Contender; 5] = [
        Contender::Bare,
        Contender::BareWithTimeout,
        Contender::Ours,
        Contender::Peer,
        Contender::OursRandomKey,
    ];

    /// Every contender `overhead_paired.rs --only` takes: [`ALL`](Self::ALL), and the peer
    /// with a timeout.
    #[allow(dead_code, reason = "only overhead_paired.rs has a command line")]
    pub const EVERY: [Contender; 10] = [
        Contender::Bare,
        Contender::BareWithTimeout,
        Contender::Ours,
        Contender::Peer,
        Contender::PeerWithTimeout,
        Contender::OursRandomKey,
        Contender::QuickBare,
        Contender::QuickOurs,
        Contender::QuickPeer,
        Contender::QuickPeerTimeout,
    ];

    /// The name a result row carries.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Bare => "bare reqwest",
            Contender::BareWithTimeout => "bare reqwest + timeout",
            Contender::Ours => "idempotent-retry",
            Contender::Peer => "reqwest-middleware + reqwest-retry",
            Contender::PeerWithTimeout => "reqwest-middleware + reqwest-retry + timeout",
            Contender::OursRandomKey => "idempotent-retry, random key",
            Contender::QuickBare => "bare reqwest + timeout, quick start",
            Contender::QuickOurs => "idempotent-retry, quick start",
            Contender::QuickPeer => "reqwest-middleware + reqwest-retry, quick start",
            Contender::QuickPeerTimeout => {
                "reqwest-middleware + reqwest-retry + timeout, quick start"
            }
        }
    }

    /// The name `overhead_paired.rs --only` takes.
    #[allow(dead_code, reason = "only overhead_paired.rs has a command line")]
    pub fn flag(self) -> &'static str {
        match self {
            Contender::Bare => "bare",
            Contender::BareWithTimeout => "bare-timeout",
            Contender::Ours => "ours",
            Contender::Peer => "peer",
            Contender::PeerWithTimeout => "peer-timeout",
            Contender::OursRandomKey => "ours-random-key",
            Contender::QuickBare => "quick-bare",
            Contender::QuickOurs => "quick-ours",
            Contender::QuickPeer => "quick-peer",
            Contender::QuickPeerTimeout => "quick-peer-timeout",
        }
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .build()
        .expect("a reqwest client")
}

/// One client per contender, each with its own connection pool.
pub struct Clients {
    bare: reqwest::Client,
    timed: reqwest::Client,
    ours: Client,
    key: IdempotencyKey,
    peer: reqwest_middleware::ClientWithMiddleware,
    peer_timed: reqwest_middleware::ClientWithMiddleware,
    quick_bare: reqwest::Client,
    quick_ours: Client,
    quick_peer: reqwest_middleware::ClientWithMiddleware,
}

/// The peer: `reqwest-middleware` with `reqwest-retry`'s `RetryTransientMiddleware` and an
/// `ExponentialBackoff` policy of 4 retries.
fn peer() -> reqwest_middleware::ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(http())
        .with(RetryTransientMiddleware::new_with_policy(
            ExponentialBackoff::builder().build_with_max_retries(4),
        ))
        .build()
}

/// The request timeout of the contenders that set one (our client's default per-attempt
/// timeout).
const TIMEOUT: Duration = Duration::from_secs(30);

impl Clients {
    /// Builds the clients (call inside a Tokio runtime).
    pub fn new() -> Self {
        Clients {
            bare: http(),
            timed: http(),
            // The bare contender's settings, deliberately (`Client::new()` would build its own
            // inner client that follows no redirect): the measured difference is the crate's.
            ours: Client::builder().http(http()).build().expect("our client"),
            key: IdempotencyKey::new(KEY).expect("a valid key"),
            peer: peer(),
            peer_timed: peer(),
            quick_bare: http(),
            // As the README's quick start builds it.
            quick_ours: Client::builder().build().expect("our client"),
            quick_peer: reqwest_middleware::ClientBuilder::new(http())
                .with(RetryTransientMiddleware::new_with_policy(
                    ExponentialBackoff::builder().build_with_max_retries(3),
                ))
                .build(),
        }
    }

    /// Sends the POST to `url` the way `contender` does and reads the whole response body.
    pub async fn send(&self, contender: Contender, url: &str) -> Bytes {
        let response = match contender {
            Contender::Bare | Contender::BareWithTimeout => {
                let (client, timeout) = match contender {
                    Contender::Bare => (&self.bare, None),
                    _ => (&self.timed, Some(TIMEOUT)),
                };
                let mut request = client.post(url);
                if let Some(timeout) = timeout {
                    request = request.timeout(timeout);
                }
                request
                    .header("idempotency-key", KEY)
                    .header("content-type", "application/json")
                    .body(BODY)
                    .send()
                    .await
                    .expect("200")
            }
            Contender::Ours | Contender::OursRandomKey => {
                let mut request = self.ours.post(url);
                if let Contender::Ours = contender {
                    request = request.idempotency_key(self.key.clone());
                }
                request
                    .header("content-type", "application/json")
                    .body(BODY)
                    .send()
                    .await
                    .expect("200")
            }
            Contender::Peer | Contender::PeerWithTimeout => {
                let request = match contender {
                    Contender::Peer => self.peer.post(url),
                    _ => self.peer_timed.post(url).timeout(TIMEOUT),
                };
                request
                    .header("idempotency-key", KEY)
                    .header("content-type", "application/json")
                    .body(BODY)
                    .send()
                    .await
                    .expect("200")
            }
            Contender::QuickBare => {
                let key = IdempotencyKey::derive("checkout.charge", &[ORDER]);
                self.quick_bare
                    .post(url)
                    .timeout(TIMEOUT)
                    .header("idempotency-key", key.as_str())
                    .json(&CHARGE)
                    .send()
                    .await
                    .expect("200")
            }
            Contender::QuickOurs => self
                .quick_ours
                .post(url)
                .idempotency_key(IdempotencyKey::derive("checkout.charge", &[ORDER]))
                .json(&CHARGE)
                .send()
                .await
                .expect("200"),
            Contender::QuickPeer | Contender::QuickPeerTimeout => {
                let key = IdempotencyKey::derive("checkout.charge", &[ORDER]);
                let mut request = self.quick_peer.post(url);
                if let Contender::QuickPeerTimeout = contender {
                    request = request.timeout(TIMEOUT);
                }
                request
                    .header("idempotency-key", key.as_str())
                    .json(&CHARGE)
                    .send()
                    .await
                    .expect("200")
            }
        };
        response.bytes().await.expect("body")
    }
}
