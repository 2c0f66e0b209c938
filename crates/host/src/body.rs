//! A request body streamed from the host language: chunks pushed as the caller's stream
//! yields them, read by the request as it goes out. The engine sends such a body once: a retry
//! it would need ends the operation with `body_not_replayable`.

use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::error::HostError;

/// One chunk of a streamed body, or why the stream failed.
type Chunk = Result<Bytes, std::io::Error>;

/// A request body fed from the host language: [`push`](Self::push) each chunk, then
/// [`finish`](Self::finish) (or [`fail`](Self::fail)); [`take_body`](Self::take_body) gives the
/// request its body once.
#[derive(Debug)]
pub struct BodyChannel {
    sender: Mutex<Option<UnboundedSender<Chunk>>>,
    receiver: Mutex<Option<UnboundedReceiver<Chunk>>>,
}

impl Default for BodyChannel {
    fn default() -> Self {
        BodyChannel::new()
    }
}

impl BodyChannel {
    /// An empty stream, nothing pushed yet.
    pub fn new() -> BodyChannel {
        let (sender, receiver) = unbounded_channel();
        BodyChannel {
            sender: Mutex::new(Some(sender)),
            receiver: Mutex::new(Some(receiver)),
        }
    }

    /// Adds `chunk` to the body.
    ///
    /// # Errors
    ///
    /// A value error once the stream is finished or failed.
    pub fn push(&self, chunk: Bytes) -> Result<(), HostError> {
        let guard = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let sender = guard
            .as_ref()
            .ok_or_else(|| HostError::runtime("the body stream is already finished"))?;
        // The request may have stopped reading (it failed, or was answered early).
        let _ = sender.send(Ok(chunk));
        Ok(())
    }

    /// Ends the body; pushing after this fails.
    pub fn finish(&self) {
        self.sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
    }

    /// Ends the body with an error (the caller's stream failed): the attempt sending it fails
    /// with `message`, and the body cannot be sent again.
    pub fn fail(&self, message: String) {
        let sender = self
            .sender
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(Err(std::io::Error::other(message)));
        }
    }

    /// The request body reading this stream; `None` once taken.
    pub fn take_body(&self) -> Option<reqwest::Body> {
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
