//! `idempotent_retry._testing` (feature `testing`): the workspace's test receiver
//! (`idempotent_retry_testkit::Receiver`) on the shared runtime, with scripted faults, for the
//! package's pytest suite.

use std::time::Duration;

use idempotent_retry_testkit::{Fault, Receiver as Inner, When};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::runtime::runtime;

/// A loopback HTTP/1.1 receiver that dedupes by idempotency key (Stripe's rules: a completed
/// key replays its answer, a key in progress answers 409, a key with another body 422),
/// counts side effects and fails on script. Stopped when dropped.
#[pyclass(module = "idempotent_retry._testing", frozen)]
#[derive(Debug)]
pub struct Receiver {
    inner: Inner,
}

/// The fault named `fault` with its parameters.
fn fault(
    fault: &str,
    status: u16,
    seconds: f64,
    retry_after: Option<u64>,
    keep_bytes: usize,
) -> PyResult<Fault> {
    let duration = || {
        Duration::try_from_secs_f64(seconds)
            .map_err(|_| PyValueError::new_err(format!("{seconds} is not a number of seconds")))
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
            return Err(PyValueError::new_err(format!(
                "{other:?} is not a fault: reset_before_handler, close_without_reply, status, \
                 slow_handler, reset_after_commit, stall_after_commit or cut_body_after_commit"
            )));
        }
    })
}

#[pymethods]
impl Receiver {
    /// Starts a receiver on a free loopback port; `key_header` is the header it reads keys
    /// from (default `Idempotency-Key`).
    ///
    /// # Errors
    ///
    /// `RuntimeError` if no port can be bound.
    #[new]
    #[pyo3(signature = (key_header = None))]
    fn new(py: Python<'_>, key_header: Option<String>) -> PyResult<Receiver> {
        let runtime = runtime()?;
        let inner = py
            .detach(|| {
                runtime.block_on(async {
                    let mut builder = Inner::builder();
                    if let Some(name) = key_header {
                        builder = builder.key_header(name);
                    }
                    builder.start().await
                })
            })
            .map_err(|err| PyRuntimeError::new_err(format!("cannot start the receiver: {err}")))?;
        Ok(Receiver { inner })
    }

    /// The URL of `path` on this receiver.
    fn url(&self, path: &str) -> String {
        self.inner.url(path)
    }

    /// Scripts `fault` for the `request`th arrival, or for the `attempt`th arrival with `key`.
    /// `status` and `retry_after` (seconds) are a canned answer's; `seconds` is how long a
    /// slow handler or a stall lasts; `keep_bytes` is how many bytes of the answer's body
    /// `cut_body_after_commit` sends (after the whole head, its `Content-Length` the body's
    /// full length) before it closes the connection: never the whole body.
    ///
    /// # Errors
    ///
    /// `ValueError` for an unknown fault, or when neither or both of `request` and `key` are
    /// given.
    #[pyo3(signature = (fault_name, *, request = None, key = None, attempt = 1, status = 503, seconds = 0.0, retry_after = None, keep_bytes = 0))]
    #[allow(clippy::too_many_arguments)]
    fn inject(
        &self,
        fault_name: &str,
        request: Option<u64>,
        key: Option<String>,
        attempt: u32,
        status: u16,
        seconds: f64,
        retry_after: Option<u64>,
        keep_bytes: usize,
    ) -> PyResult<()> {
        let when = match (request, key) {
            (Some(n), None) => When::request(n),
            (None, Some(key)) => When::key_attempt(key, attempt),
            _ => {
                return Err(PyValueError::new_err(
                    "give the request number or the key, one of them",
                ));
            }
        };
        self.inner.inject(
            when,
            fault(fault_name, status, seconds, retry_after, keep_bytes)?,
        );
        Ok(())
    }

    /// Side effects committed, in all.
    fn effects(&self) -> u64 {
        self.inner.effects()
    }

    /// Side effects committed under `key`.
    fn effects_for(&self, key: &str) -> u64 {
        self.inner.effects_for(key)
    }

    /// Requests that arrived, in all.
    fn arrivals(&self) -> u64 {
        self.inner.arrivals()
    }

    /// The key header of each arrival, in order (`None` for a request without one).
    fn keys(&self) -> Vec<Option<String>> {
        self.inner.keys()
    }

    /// Each arrival, as a line for people (what the receiver did with it).
    fn log(&self) -> Vec<String> {
        self.inner
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

    /// Waits, the GIL released, until `n` requests have arrived or `within` seconds passed;
    /// returns how many arrived.
    fn wait_for_arrivals(&self, py: Python<'_>, n: u64, within: f64) -> PyResult<u64> {
        let within = Duration::try_from_secs_f64(within)
            .map_err(|_| PyValueError::new_err(format!("{within} is not a number of seconds")))?;
        let runtime = runtime()?;
        Ok(py.detach(|| runtime.block_on(self.inner.wait_for_arrivals(n, within))))
    }
}

/// A loopback HTTP/1.1 server that keeps connections alive and answers every request `200`
/// with the body `ok`, for measuring a client's own cost. Stopped when dropped.
#[pyclass(module = "idempotent_retry._testing", frozen)]
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

#[pymethods]
impl KeepAliveServer {
    /// Starts the server on a free loopback port.
    ///
    /// # Errors
    ///
    /// `RuntimeError` if no port can be bound.
    #[new]
    fn new(py: Python<'_>) -> PyResult<KeepAliveServer> {
        let runtime = runtime()?;
        let listener = py
            .detach(|| runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")))
            .map_err(|err| PyRuntimeError::new_err(format!("cannot bind a port: {err}")))?;
        let addr = listener
            .local_addr()
            .map_err(|err| PyRuntimeError::new_err(format!("cannot read the port: {err}")))?;
        let task = runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                tokio::spawn(keep_alive(stream));
            }
        });
        Ok(KeepAliveServer { addr, task })
    }

    /// The URL of `path` on this server.
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Adds the `_testing` submodule to `parent`.
pub(crate) fn add_to(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let module = PyModule::new(parent.py(), "_testing")?;
    module.add_class::<Receiver>()?;
    module.add_class::<KeepAliveServer>()?;
    parent.add_submodule(&module)?;
    Ok(())
}
