//! Test helpers for the packages' own suites and benches (feature `testing`): the workspace's
//! test receiver's faults by name, and a keep-alive server answering `200 ok` for measuring a
//! client's own cost.

use std::time::Duration;

use idempotent_retry_testkit::{Fault, Receiver, When};

use crate::error::HostError;
use crate::runtime::runtime;

/// Each arrival at `receiver`, as a line for people: its number, method, path and key, and
/// what the receiver did with it.
pub fn log_lines(receiver: &Receiver) -> Vec<String> {
    receiver
        .log()
        .iter()
        .map(|arrival| {
            format!(
                "#{} {} {} key={:?}: {arrival}",
                arrival.number, arrival.method, arrival.path, arrival.key
            )
        })
        .collect()
}

/// When a fault strikes: the `request`th arrival, or the `attempt`th arrival with `key`.
///
/// # Errors
///
/// A value error when neither or both of `request` and `key` are given.
pub fn when(request: Option<u64>, key: Option<String>, attempt: u32) -> Result<When, HostError> {
    match (request, key) {
        (Some(n), None) => Ok(When::request(n)),
        (None, Some(key)) => Ok(When::key_attempt(key, attempt)),
        _ => Err(HostError::value(
            "give the request number or the key, one of them",
        )),
    }
}

/// The fault named `fault` with its parameters: `status` and `retry_after` (seconds) are a
/// canned answer's; `seconds` is how long a slow handler or a stall lasts; `keep_bytes` is how
/// many bytes of the answer's body `cut_body_after_commit` sends before it closes the
/// connection.
///
/// # Errors
///
/// A value error for an unknown fault or a duration that is not one.
pub fn fault(
    fault: &str,
    status: u16,
    seconds: f64,
    retry_after: Option<u64>,
    keep_bytes: usize,
) -> Result<Fault, HostError> {
    let duration = || {
        Duration::try_from_secs_f64(seconds)
            .map_err(|_| HostError::value(format!("{seconds} is not a number of seconds")))
    };
    Ok(match fault {
        "reset_before_handler" => Fault::ResetBeforeHandler,
        "close_without_reply" => Fault::CloseWithoutReply,
        "status" => match retry_after {
            Some(secs) => Fault::retry_after_secs(status, secs),
            None => Fault::status(status),
        },
        "slow_handler" => Fault::SlowHandler(duration()?),
        "reset_after_commit" => Fault::ResetAfterCommit,
        "stall_after_commit" => Fault::StallAfterCommit(duration()?),
        "cut_body_after_commit" => Fault::CutBodyAfterCommit(keep_bytes),
        other => {
            return Err(HostError::value(format!(
                "{other:?} is not a fault: reset_before_handler, close_without_reply, status, \
                 slow_handler, reset_after_commit, stall_after_commit or cut_body_after_commit"
            )));
        }
    })
}

/// The position just past the head of the request at the start of `buffer`, and the body's
/// length, once the head is complete.
fn head_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let end = buffer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0);
    Some((end, length))
}

/// Answers the requests of one connection until it closes.
async fn keep_alive(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const ANSWER: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok";
    let mut buffer = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    loop {
        while let Some((end, length)) = head_end(&buffer) {
            if buffer.len() < end + length {
                break;
            }
            buffer.drain(..end + length);
            if stream.write_all(ANSWER).await.is_err() {
                return;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A loopback HTTP/1.1 server that keeps connections alive and answers every request `200`
/// with the body `ok`, for measuring a client's own cost. Stopped when dropped.
#[derive(Debug)]
pub struct KeepAliveServer {
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KeepAliveServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KeepAliveServer {
    /// Starts the server on a free loopback port, on the shared runtime.
    ///
    /// # Errors
    ///
    /// A runtime error if no port can be bound.
    pub fn start() -> Result<KeepAliveServer, HostError> {
        let runtime = runtime()?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .map_err(|err| HostError::runtime(format!("cannot bind a port: {err}")))?;
        let addr = listener
            .local_addr()
            .map_err(|err| HostError::runtime(format!("cannot read the port: {err}")))?;
        let task = runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(keep_alive(stream));
            }
        });
        Ok(KeepAliveServer { addr, task })
    }

    /// The URL of `path` on this server.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}
