//! A streamed answer's body whose failure says what it means for the operation: the answer
//! was cut after the receiver answered, so its effect may stand, and the same request sent
//! again with its key gets the answer again (`engine/answer.rs` decides when).

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};

/// A boxed error, as `http_body` and reqwest carry them (the same as `transport::BoxError`,
/// spelled here so this module imports nothing of the engine's).
type BoxError = Box<dyn StdError + Send + Sync>;

/// `B`, whose errors carry `note`.
pub(crate) struct NotedBody<B> {
    pub(crate) inner: B,
    pub(crate) note: Arc<str>,
}

impl<B> Body for NotedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        Pin::new(&mut this.inner).poll_frame(cx).map(|frame| {
            frame.map(|frame| {
                frame.map_err(|source| {
                    Box::new(AnswerCut {
                        note: Arc::clone(&this.note),
                        source: source.into(),
                    }) as BoxError
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A streamed answer's body that failed midway, with what it means and what to do.
#[derive(Debug)]
pub(crate) struct AnswerCut {
    note: Arc<str>,
    source: BoxError,
}

impl fmt::Display for AnswerCut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.note)
    }
}

impl StdError for AnswerCut {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
