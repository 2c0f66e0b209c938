//! A loopback server that answers with raw bytes, for responses the scripted server cannot
//! produce: status lines hyper refuses, heads or bodies that never end, huge bodies whose
//! progress is counted.
//!
//! Each request is read completely with the testkit's HTTP reader and its key recorded; then
//! the [`Reply`] is written. The server counts the bytes it managed to write on each
//! connection before the client hung up (or the reply ended), so a test can tell how much of a
//! response the client actually pulled in. Dropping the server aborts every connection.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::server::wire;

/// What the server writes after reading a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// These bytes, then a clean close.
    Bytes(Vec<u8>),
    /// `head`, then `chunk` again and again, `every` apart (zero: as fast as the client takes
    /// them), until `limit` bytes in all have been written (`None`: forever) or the client hangs
    /// up; then a clean close.
    Stream {
        head: Vec<u8>,
        chunk: Vec<u8>,
        every: Duration,
        limit: Option<u64>,
    },
}

impl Reply {
    /// A complete answer: this status line (the part after `HTTP/1.1 `), these header lines,
    /// an empty body.
    pub fn head(status_line: &str, headers: &[&str]) -> Reply {
        let mut head = format!("HTTP/1.1 {status_line}\r\n");
        for line in headers {
            head.push_str(line);
            head.push_str("\r\n");
        }
        head.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
        Reply::Bytes(head.into_bytes())
    }

    /// `status` with a body declared `declared` bytes long, of which one byte arrives every
    /// `every`, forever.
    pub fn trickle(status: u16, declared: u64, every: Duration) -> Reply {
        Reply::Stream {
            head: format!("HTTP/1.1 {status} X\r\nContent-Length: {declared}\r\n\r\n").into_bytes(),
            chunk: b"x".to_vec(),
            every,
            limit: None,
        }
    }

    /// `status` with a body of `len` bytes, written in 64 KiB chunks as fast as the client
    /// reads them.
    pub fn large_body(status: u16, len: u64) -> Reply {
        Reply::Stream {
            head: format!("HTTP/1.1 {status} X\r\nContent-Length: {len}\r\n\r\n").into_bytes(),
            chunk: vec![b'x'; 64 * 1024],
            every: Duration::ZERO,
            limit: Some(len),
        }
    }
}

#[derive(Debug, Default)]
struct Seen {
    keys: Vec<Option<String>>,
    /// Bytes written on each connection that has ended, head included.
    written: Vec<u64>,
    open: usize,
}

/// See the module docs.
pub struct RawServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    task: JoinHandle<()>,
}

impl Drop for RawServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawServer {
    /// Answers every request with `reply`.
    pub async fn start(reply: Reply) -> RawServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the raw server on 127.0.0.1:0");
        let addr = listener.local_addr().expect("raw server address");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let task = tokio::spawn({
            let seen = seen.clone();
            wire::accept_loop(listener, move |stream| {
                serve(seen.clone(), stream, reply.clone())
            })
        });
        RawServer { addr, seen, task }
    }

    /// `http://127.0.0.1:PORT/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// Requests read completely.
    pub fn hits(&self) -> usize {
        self.lock().keys.len()
    }

    /// The `Idempotency-Key` of each request, in arrival order.
    pub fn keys(&self) -> Vec<Option<String>> {
        self.lock().keys.clone()
    }

    /// Bytes written on each connection that has ended, in the order they ended.
    pub fn written(&self) -> Vec<u64> {
        self.lock().written.clone()
    }

    /// Connections whose request was read and whose reply has not ended yet.
    pub fn open(&self) -> usize {
        self.lock().open
    }

    /// Polls (every 10 ms, at most `within`) until no reply is being written; `true` if so.
    pub async fn wait_until_quiet(&self, within: Duration) -> bool {
        let polls = within.as_millis() / 10 + 1;
        for _ in 0..polls {
            if self.open() == 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.open() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Decrements the open count and records the bytes written when the connection ends, however
/// it ends (including an abort).
struct Tally {
    seen: Arc<Mutex<Seen>>,
    written: u64,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.open -= 1;
        seen.written.push(self.written);
    }
}

async fn serve(seen: Arc<Mutex<Seen>>, stream: TcpStream, reply: Reply) {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream);
    let Ok(request) = wire::read_request(&mut reader).await else {
        return;
    };
    let mut stream = reader.into_inner();
    {
        let mut guard = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        guard
            .keys
            .push(wire::find_header(&request.headers, "idempotency-key").map(str::to_owned));
        guard.open += 1;
    }
    let mut tally = Tally { seen, written: 0 };
    match reply {
        Reply::Bytes(bytes) => {
            if stream.write_all(&bytes).await.is_ok() {
                tally.written = bytes.len() as u64;
                wire::close(stream).await;
            }
        }
        Reply::Stream {
            head,
            chunk,
            every,
            limit,
        } => {
            if stream.write_all(&head).await.is_err() {
                return;
            }
            tally.written = head.len() as u64;
            let body_start = tally.written;
            loop {
                let left = limit.map(|l| l.saturating_sub(tally.written - body_start));
                if left == Some(0) {
                    wire::close(stream).await;
                    return;
                }
                let take = left.map_or(chunk.len(), |l| chunk.len().min(l as usize));
                // `write` rather than `write_all`: count what the socket really took.
                match stream.write(&chunk[..take]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => tally.written += n as u64,
                }
                if !every.is_zero() {
                    tokio::time::sleep(every).await;
                }
            }
        }
    }
}
