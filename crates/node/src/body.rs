//! A request body streamed from JavaScript (a `ReadableStream` given as `init.body`): chunks
//! pushed as the stream yields them, read by the request as it goes out. Sent once: a retry
//! it would need ends the operation with `body_not_replayable`.

use idempotent_retry_host::BodyChannel;
use napi::bindgen_prelude::Buffer;
use napi_derive::napi;

use crate::error::to_js;

/// A request body that JavaScript writes and one request reads: `push` chunks, then `finish`,
/// or `fail` when the source threw.
#[napi]
#[derive(Debug)]
pub struct BodyStream {
    channel: BodyChannel,
}

impl Default for BodyStream {
    fn default() -> Self {
        BodyStream::new()
    }
}

#[napi]
impl BodyStream {
    /// An empty stream, open for chunks.
    #[napi(constructor)]
    pub fn new() -> BodyStream {
        BodyStream {
            channel: BodyChannel::new(),
        }
    }

    /// Adds a chunk. A chunk pushed after the request stopped reading is dropped.
    ///
    /// # Errors
    ///
    /// After `finish` or `fail`.
    #[napi]
    pub fn push(&self, chunk: Buffer) -> napi::Result<()> {
        self.channel
            .push(bytes::Bytes::copy_from_slice(&chunk))
            .map_err(to_js)
    }

    /// Ends the body: the request sends what was pushed and no more.
    #[napi]
    pub fn finish(&self) {
        self.channel.finish();
    }

    /// Ends the body with an error (the source threw `message`): the request fails.
    #[napi]
    pub fn fail(&self, message: String) {
        self.channel.fail(message);
    }
}

impl BodyStream {
    /// The stream as a request body; `None` once a request has taken it.
    pub(crate) fn take_body(&self) -> Option<reqwest::Body> {
        self.channel.take_body()
    }
}
