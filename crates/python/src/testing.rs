//! `idempotent_retry._testing` (feature `testing`): the workspace's test receiver
//! (`idempotent_retry_testkit::Receiver`) on the shared runtime, with scripted faults, for the
//! package's pytest suite.

use std::time::Duration;

use idempotent_retry_host::testing::{self as host, fault};
use idempotent_retry_testkit::Receiver as Inner;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::error::to_py;
use crate::runtime::runtime;

/// A loopback HTTP/1.1 receiver that dedupes by idempotency key (Stripe's rules: a completed
/// key replays its answer, a key in progress answers 409, a key with another body 422),
/// counts side effects and fails on script. Stopped when dropped.
#[pyclass(module = "idempotent_retry._testing", frozen)]
#[derive(Debug)]
pub struct Receiver {
    inner: Inner,
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
        let when = host::when(request, key, attempt).map_err(to_py)?;
        self.inner.inject(
            when,
            fault(fault_name, status, seconds, retry_after, keep_bytes).map_err(to_py)?,
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
        host::log_lines(&self.inner)
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
/// A loopback HTTP/1.1 server that keeps connections alive and answers every request `200`
/// with the body `ok`, for measuring a client's own cost. Stopped when dropped.
#[pyclass(module = "idempotent_retry._testing", frozen)]
#[derive(Debug)]
pub struct KeepAliveServer {
    inner: host::KeepAliveServer,
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
        let inner = py.detach(host::KeepAliveServer::start).map_err(to_py)?;
        Ok(KeepAliveServer { inner })
    }

    /// The URL of `path` on this server.
    fn url(&self, path: &str) -> String {
        self.inner.url(path)
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
