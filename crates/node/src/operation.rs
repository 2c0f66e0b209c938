//! One operation started on the engine's runtime: awaited for its [`Answer`], cancelled (an
//! aborted `fetch`), and its streamed body read chunk by chunk.

use idempotent_retry_host::{Finished, next_chunk};
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;
use tokio::runtime::Runtime;
use tokio::sync::Mutex;
use tokio::task::{AbortHandle, JoinHandle};

use crate::answer::Answer;

/// An operation in flight, then the body of its answer when that is streamed.
#[napi]
#[derive(Debug)]
pub struct Operation {
    task: Mutex<Option<JoinHandle<Finished>>>,
    abort: AbortHandle,
    /// The answer's body still to read (no `Content-Length`, or a longer one than the
    /// engine's `answer_read_limit`).
    rest: Mutex<Option<reqwest::Response>>,
    runtime: &'static Runtime,
}

impl Operation {
    /// `operation` spawned on `runtime`.
    pub(crate) fn spawn(
        runtime: &'static Runtime,
        operation: impl Future<Output = Finished> + Send + 'static,
    ) -> Operation {
        let task = runtime.spawn(operation);
        Operation {
            abort: task.abort_handle(),
            task: Mutex::new(Some(task)),
            rest: Mutex::new(None),
            runtime,
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
        let task = self
            .task
            .lock()
            .await
            .take()
            .ok_or_else(|| failure("this operation's answer was already taken"))?;
        let mut finished = task
            .await
            .map_err(|_| failure("the operation was cancelled"))?;
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
        // Read on the engine's runtime, where the connection's tasks and timers live.
        let (chunk, response) = self
            .runtime
            .spawn(next_chunk(response))
            .await
            .map_err(|_| failure("the body's read was cancelled"))?;
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
        self.abort.abort();
        if let Ok(mut rest) = self.rest.try_lock() {
            rest.take();
        }
    }
}
