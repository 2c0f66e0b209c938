//! A response body read up to the ledger's size cap, and no further.
//!
//! The ledger saves a final response's body for replay, up to
//! [`LedgerOptions::max_body`](crate::ledger::LedgerOptions::max_body). Reading the whole body to find
//! out whether it fits would buffer however much the server sends; instead the body is read
//! frame by frame until it ends or passes the cap, and a body that passes it is handed back
//! unread past that point: the bytes already read, then the rest of the stream. Memory stays
//! within the cap plus one frame, whatever the body's size.
//!
//! `http-body-util` has no body that chains a buffered prefix with a live stream, so
//! [`Prefixed`] is the dozen lines it takes.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body, Bytes, Frame, SizeHint};

/// The bytes of an answer's body that the attempts stage read inside its attempt, kept in the
/// response's extensions when a ledger will save them (its finish then reads nothing again).
#[derive(Debug, Clone)]
pub(crate) struct ReadBody(pub(crate) Bytes);

/// A body read up to a cap.
pub(crate) enum Capped<B> {
    /// The whole body, no longer than the cap.
    Whole(Bytes),
    /// A body longer than the cap: the bytes read so far, then the rest, not read yet.
    Over(Prefixed<B>),
}

/// Reads `body` until it ends or holds more than `cap` bytes. A body that comes in one frame
/// (most small responses) is kept as that frame's bytes, not copied.
///
/// # Errors
///
/// The body's own error (a timeout, a connection cut) while reading up to the cap.
pub(crate) async fn read_capped<B>(mut body: B, cap: usize) -> Result<Capped<B>, B::Error>
where
    B: Body<Data = Bytes> + Unpin,
{
    let mut read = Read::Nothing;
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        let Some(frame) = frame.transpose()? else {
            return Ok(Capped::Whole(read.into_bytes()));
        };
        // Trailers are not saved (a whole-body read drops them too).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        read.push(data);
        if read.len() > cap {
            let head = Some(read.into_bytes());
            return Ok(Capped::Over(Prefixed { head, rest: body }));
        }
    }
}

/// A body's bytes gathered frame by frame: the first frame as it came, copied into one
/// buffer only when a second one follows.
#[derive(Default)]
pub(crate) enum Read {
    #[default]
    Nothing,
    One(Bytes),
    Several(Vec<u8>),
}

impl Read {
    /// Adds the next frame's bytes.
    pub(crate) fn push(&mut self, data: Bytes) {
        *self = match std::mem::replace(self, Read::Nothing) {
            Read::Nothing => Read::One(data),
            Read::One(first) => {
                let mut all = Vec::with_capacity(first.len() + data.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&data);
                Read::Several(all)
            }
            Read::Several(mut all) => {
                all.extend_from_slice(&data);
                Read::Several(all)
            }
        };
    }

    /// How many bytes were gathered.
    pub(crate) fn len(&self) -> usize {
        match self {
            Read::Nothing => 0,
            Read::One(bytes) => bytes.len(),
            Read::Several(all) => all.len(),
        }
    }

    /// Every byte gathered, in order.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self {
            Read::Nothing => Bytes::new(),
            Read::One(bytes) => bytes,
            Read::Several(all) => Bytes::from(all),
        }
    }
}

/// The bytes already read, then the rest of the body.
pub(crate) struct Prefixed<B> {
    head: Option<Bytes>,
    rest: B,
}

impl<B> Body for Prefixed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let rest = self.rest.size_hint();
        let head = self.head.as_ref().map_or(0, |h| h.len() as u64);
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower().saturating_add(head));
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper.saturating_add(head));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(chunks: &[&'static str]) -> reqwest::Body {
        struct Chunks(Vec<Bytes>);
        impl hyper::body::Body for Chunks {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(
                mut self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
                if self.0.is_empty() {
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(Frame::data(self.0.remove(0)))))
            }
        }
        reqwest::Body::wrap(Chunks(chunks.iter().map(|c| Bytes::from(*c)).collect()))
    }

    async fn collect<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Vec<u8>
    where
        B::Error: std::fmt::Debug,
    {
        let mut out = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if let Ok(data) = frame.expect("no error").into_data() {
                out.extend_from_slice(&data);
            }
        }
        out
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_read_whole() {
        for cap in [6, 7, 100] {
            match read_capped(stream(&["abc", "def"]), cap).await.expect("ok") {
                Capped::Whole(bytes) => assert_eq!(&bytes[..], b"abcdef", "{cap}"),
                Capped::Over(_) => panic!("within the cap of {cap}"),
            }
        }
        match read_capped(stream(&[]), 0).await.expect("ok") {
            Capped::Whole(bytes) => assert!(bytes.is_empty()),
            Capped::Over(_) => panic!("an empty body fits a zero cap"),
        }
    }

    /// A body of one frame is that frame's bytes, shared rather than copied.
    #[tokio::test]
    async fn a_body_of_one_frame_is_kept_without_a_copy() {
        let frame = Bytes::from_static(b"the whole answer");
        let body = http_body_util::Full::new(frame.clone());
        let Capped::Whole(bytes) = read_capped(body, 100).await.expect("ok") else {
            panic!("within the cap");
        };
        assert_eq!(bytes, frame);
        assert_eq!(bytes.as_ptr(), frame.as_ptr(), "the same memory");
    }

    #[tokio::test]
    async fn a_body_over_the_cap_stops_there_and_hands_back_every_byte() {
        let body = stream(&["ab", "cd", "ef", "gh"]);
        let Capped::Over(rest) = read_capped(body, 3).await.expect("ok") else {
            panic!("over the cap");
        };
        assert_eq!(collect(rest).await, b"abcdefgh");
        let Capped::Over(rest) = read_capped(stream(&["abcd", "ef"]), 3).await.expect("ok") else {
            panic!("over the cap in the first frame");
        };
        assert_eq!(collect(rest).await, b"abcdef");
        let Capped::Over(rest) = read_capped(stream(&["x"]), 0).await.expect("ok") else {
            panic!("over a zero cap");
        };
        assert_eq!(collect(rest).await, b"x");
    }
}
