//! The handler a [`Receiver`](super::Receiver) runs, what it is given and what it returns.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::de::DeserializeOwned;

use super::wire::find_header;

/// A boxed handler future.
pub(crate) type HandlerFuture = Pin<Box<dyn Future<Output = Reply> + Send + 'static>>;
/// A boxed handler.
pub(crate) type BoxHandler = Arc<dyn Fn(Delivery) -> HandlerFuture + Send + Sync + 'static>;

/// Where a [`Delivery`] counts its effect. A delivery needs one thing from the receiver, the
/// count, so it gets only that: the handler API then depends on no part of the receiver, and
/// the receiver's state stays behind its own methods.
pub(crate) trait EffectRecorder: Send + Sync {
    /// Counts one effect under `key` (`None`: keyless) and returns its number across the
    /// receiver (1 for the first effect).
    fn record_effect(&self, key: Option<&str>) -> u64;
}

/// One delivery the handler runs for: a request whose key was just claimed, a keyless request,
/// or one event of a batch.
///
/// The handler performs its side effect and reports it with
/// [`record_effect`](Self::record_effect): that is what the receiver counts.
pub struct Delivery {
    pub(crate) number: u64,
    pub(crate) key: Option<String>,
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) recorder: Arc<dyn EffectRecorder>,
    /// Effects this run recorded: what settles the key once the handler returns.
    pub(crate) run: Arc<AtomicU32>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("number", &self.number)
            .field("key", &self.key)
            .field("method", &self.method)
            .field("path", &self.path)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// The arrival number of the request this delivery came in (1 for the first request).
    #[must_use]
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The idempotency key (in batch mode: the event id), `None` for a keyless request.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The request method.
    #[must_use]
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The request target (path and query).
    #[must_use]
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body (in batch mode: this event's JSON).
    #[must_use]
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The body parsed as JSON.
    ///
    /// # Errors
    ///
    /// The body is not valid JSON for `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }

    /// Records one side effect for this delivery's key (or as keyless) and returns its number
    /// across the receiver (1 for the first effect). Call it where the real handler would
    /// perform the effect: send the email, charge the card.
    pub fn record_effect(&self) -> u64 {
        self.run.fetch_add(1, Ordering::SeqCst);
        self.recorder.record_effect(self.key.as_deref())
    }
}

/// What a handler answers.
///
/// The key's row follows from it: when the handler recorded an effect, the key is `completed`
/// and this reply is saved for replays, whatever its status (a committed effect must never run
/// twice). Without an effect, a 5xx leaves the key `failed` (the next delivery runs the handler
/// again) and any other status completes it with this reply saved.
/// [`release_key`](Self::release_key) asks to forget the key instead.
///
/// A builder, like reqwest's request builder: a handler's test compares the reply whole
/// (`assert_eq!(reply, Reply::status(503))`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
    pub(crate) release_key: bool,
}

impl Reply {
    /// This status with an empty body.
    #[must_use]
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            release_key: false,
        }
    }

    /// 200 with this text body.
    #[must_use]
    pub fn ok(body: impl Into<String>) -> Reply {
        Reply::status(200).body(body.into().into_bytes())
    }

    /// This status with a JSON body and `Content-Type: application/json`.
    #[must_use]
    pub fn json(status: u16, value: &serde_json::Value) -> Reply {
        Reply::status(status)
            .header("Content-Type", "application/json")
            .body(value.to_string().into_bytes())
    }

    /// Sets the body.
    #[must_use]
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Reply {
        self.body = body.into();
        self
    }

    /// Adds a header.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Asks the receiver to forget the key after this reply (the "release the key on error"
    /// pattern), so the next delivery runs the handler again. The receiver refuses when the
    /// handler recorded an effect for the key: that would open the door to a duplicate. The
    /// refusal is kept as a [`Violation`](super::Violation).
    #[must_use]
    pub fn release_key(mut self) -> Reply {
        self.release_key = true;
        self
    }
}
