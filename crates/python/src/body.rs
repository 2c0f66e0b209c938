//! A request body streamed from Python: chunks pushed from Python as the httpx request's
//! stream yields them, read by the request as it goes out. The engine sends such a body once:
//! a retry it would need ends the operation with `body_not_replayable`.

use std::sync::Mutex;

use bytes::Bytes;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// One chunk of the body, or the reason the stream failed.
pub(crate) type Chunk = Result<Bytes, std::io::Error>;

/// A body that Python writes and one request reads.
///
/// Push chunks with `push`, then `finish` it, or `fail` it when the source raised: the request then fails as a transport
/// error, and nothing is retried.
#[pyclass(module = "idempotent_retry._native", frozen)]
#[derive(Debug)]
pub struct BodyStream {
    sender: Mutex<Option<UnboundedSender<Chunk>>>,
    receiver: Mutex<Option<UnboundedReceiver<Chunk>>>,
}

#[pymethods]
impl BodyStream {
    /// An empty stream, open for chunks.
    #[new]
    fn new() -> Self {
        let (sender, receiver) = unbounded_channel();
        BodyStream {
            sender: Mutex::new(Some(sender)),
            receiver: Mutex::new(Some(receiver)),
        }
    }

    /// Adds a chunk. A chunk pushed after the request stopped reading is dropped.
    ///
    /// # Errors
    ///
    /// `RuntimeError` after `finish` or `fail`.
    fn push(&self, chunk: &Bound<'_, PyBytes>) -> PyResult<()> {
        let guard = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let sender = guard
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the body stream is already finished"))?;
        // The request may have stopped reading (it failed, or was answered early).
        let _ = sender.send(Ok(Bytes::copy_from_slice(chunk.as_bytes())));
        Ok(())
    }

    /// Ends the body: the request sends what was pushed and no more.
    fn finish(&self) {
        self.sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
    }

    /// Ends the body with an error (the source raised `message`): the request fails.
    fn fail(&self, message: String) {
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(Err(std::io::Error::other(message)));
        }
    }
}

impl BodyStream {
    /// The stream as a request body; `None` once a request has taken it.
    pub(crate) fn take_body(&self) -> Option<reqwest::Body> {
        let receiver = self
            .receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()?;
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|chunk| (chunk, receiver))
        });
        Some(reqwest::Body::wrap_stream(stream))
    }
}
