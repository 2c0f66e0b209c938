//! A request body streamed from Python: chunks pushed from Python as the httpx request's
//! stream yields them, read by the request as it goes out. The engine sends such a body once:
//! a retry it would need ends the operation with `body_not_replayable`.

use bytes::Bytes;
use idempotent_retry_host::BodyChannel;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::error::to_py;

/// A request body fed from Python: `push` each chunk, then `finish` (or `fail`).
#[pyclass(module = "idempotent_retry._native", frozen)]
#[derive(Debug)]
pub struct BodyStream {
    channel: BodyChannel,
}

#[pymethods]
impl BodyStream {
    /// An empty stream.
    #[new]
    fn new() -> Self {
        BodyStream {
            channel: BodyChannel::new(),
        }
    }

    /// Adds `chunk` to the body.
    ///
    /// # Errors
    ///
    /// `RuntimeError` once the stream is finished or failed.
    fn push(&self, chunk: &Bound<'_, PyBytes>) -> PyResult<()> {
        self.channel
            .push(Bytes::copy_from_slice(chunk.as_bytes()))
            .map_err(to_py)
    }

    /// Ends the body.
    fn finish(&self) {
        self.channel.finish();
    }

    /// Ends the body with an error: the attempt sending it fails with `message`.
    fn fail(&self, message: String) {
        self.channel.fail(message);
    }
}

impl BodyStream {
    /// The request body reading this stream; `None` once taken.
    pub(crate) fn take_body(&self) -> Option<reqwest::Body> {
        self.channel.take_body()
    }
}
