//! One operation started on the engine's runtime: awaited for its [`Answer`], cancelled (an
//! aborted `fetch`), and its streamed body read chunk by chunk.

use std::pin::Pin;

use idempotent_retry_host::{Finished, next_chunk};
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use tokio::sync::{Mutex, oneshot};

use crate::answer::Answer;

/// The operation's future, run by `wait` on the runtime napi awaits its promises on.
type Running = Pin<Box<dyn Future<Output = Finished> + Send>>;

/// An operation not yet finished, then the body of its answer when that is streamed.
///
/// The operation runs inside `wait`'s own future: no hop to another runtime's thread and back
/// per request. `cancel` ends it through a channel `wait` listens to beside the operation, so
/// the operation is dropped (its lease's release registered) before `wait` rejects.
#[napi]
pub struct Operation {
    running: Mutex<Option<Running>>,
    /// `cancel`'s signal to `wait`; taken by the first `cancel`.
    cancel: std::sync::Mutex<Option<oneshot::Sender<()>>>,
    cancelled: Mutex<Option<oneshot::Receiver<()>>>,
    /// The answer's body still to read (no `Content-Length`, or a longer one than the
    /// engine's `answer_read_limit`).
    rest: Mutex<Option<reqwest::Response>>,
}

impl std::fmt::Debug for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operation").finish_non_exhaustive()
    }
}

impl Operation {
    /// `operation`, to be run by `wait`.
    pub(crate) fn new(operation: impl Future<Output = Finished> + Send + 'static) -> Operation {
        let (cancel, cancelled) = oneshot::channel();
        Operation {
            running: Mutex::new(Some(Box::pin(operation))),
            cancel: std::sync::Mutex::new(Some(cancel)),
            cancelled: Mutex::new(Some(cancelled)),
            rest: Mutex::new(None),
        }
    }
}

/// A JavaScript error with `message`.
fn failure(message: impl Into<String>) -> napi::Error {
    napi::Error::new(napi::Status::GenericFailure, message.into())
}

#[napi]
impl Operation {
    /// How the operation ended. Never rejects for the operation's own failure: the answer
    /// says how it ended.
    ///
    /// # Errors
    ///
    /// When called twice, or after `cancel` (the operation was dropped where it stood).
    #[napi]
    pub async fn wait(&self) -> napi::Result<Answer> {
        let running = self
            .running
            .lock()
            .await
            .take()
            .ok_or_else(|| failure("this operation's answer was already taken"))?;
        let cancelled = self.cancelled.lock().await.take();
        let mut finished = match cancelled {
            Some(cancelled) => {
                tokio::select! {
                    biased;
                    // A `cancel` (its sender sent or dropped with the operation) drops the
                    // operation here, before this rejects.
                    _ = cancelled => return Err(failure("the operation was cancelled")),
                    finished = running => finished,
                }
            }
            None => running.await,
        };
        let rest = finished
            .received
            .as_mut()
            .and_then(|received| received.rest.take());
        let streamed = rest.is_some();
        *self.rest.lock().await = rest;
        Ok(Answer::from_finished(finished, streamed))
    }

    /// The next chunk of a streamed body; `null` at its end (or when nothing is streamed).
    ///
    /// # Errors
    ///
    /// When the connection fails before the body's end: the message says the body was cut
    /// off, and why.
    #[napi]
    pub async fn read_chunk(&self) -> napi::Result<Option<Buffer>> {
        let mut rest = self.rest.lock().await;
        let Some(response) = rest.take() else {
            return Ok(None);
        };
        let (chunk, response) = next_chunk(response).await;
        *rest = response;
        match chunk {
            Ok(chunk) => Ok(chunk.map(|chunk| Buffer::from(chunk.to_vec()))),
            Err(message) => Err(failure(message)),
        }
    }

    /// Drops the operation where it stands, as a Rust caller's dropped `send` does: an attempt
    /// in flight is abandoned (the receiver may still run it) and the ledger's lease is given
    /// back; a streamed body still to read is dropped with its connection.
    #[napi]
    pub fn cancel(&self) {
        let cancel = self
            .cancel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(cancel) = cancel {
            let _ = cancel.send(());
        }
        if let Ok(mut running) = self.running.try_lock() {
            // Not started yet: dropped here.
            running.take();
        }
        if let Ok(mut rest) = self.rest.try_lock() {
            rest.take();
        }
    }
}
