//! `multipart/form-data` bodies that know whether they can be sent again (feature
//! `multipart`).
//!
//! A [`Form`] wraps reqwest's `multipart::Form` and records how each [`Part`] was made. Only
//! then can [`RequestBuilder::multipart`](crate::RequestBuilder::multipart) tell a form whose
//! bytes are all in memory, which it encodes once so that every attempt sends the same bytes
//! with the same boundary, from one with a streamed part, which can be read only once and is
//! sent as a stream: one attempt, and
//! [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable) if it fails
//! transiently, as for any streamed body.
//!
//! | part made with | replayable |
//! |---|---|
//! | [`Form::text`], [`Part::text`], [`Part::bytes`] | yes |
//! | [`Part::stream`] / [`Part::stream_with_length`] of a `reqwest::Body` made from bytes, a string or a vector | yes |
//! | [`Part::stream`] / [`Part::stream_with_length`] of a streamed body (`reqwest::Body::wrap_stream`, a file) | no |
//! | a `reqwest::multipart::Part` or `Form` converted with `From` (its bytes may not be in memory) | no |
//!
//! To retry an upload, read it into memory first and give it as bytes.
//!
//! The boundary is random, drawn once per [`Form`]: every attempt of a request, and every
//! [`try_clone`](crate::RequestBuilder::try_clone) of its builder, sends the same one, so a
//! [`Ledger`](crate::ledger::Ledger) sees one fingerprint. A form built again (after a restart, say)
//! has another boundary, hence other bytes on the wire, but the same
//! [fingerprint](crate::RequestFingerprint): the ledger hashes a multipart body with its
//! boundary replaced by a fixed one, so the same key finds the same operation.

use std::borrow::Cow;
use std::fmt;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use http::HeaderMap;

use crate::outcome::error::Error;

/// A `multipart/form-data` body: reqwest's `multipart::Form`, with a record of which parts
/// are in memory.
///
/// # Examples
///
/// ```
/// use idempotent_retry::multipart::{Form, Part};
///
/// let form = Form::new()
///     .text("purpose", "dispute_evidence")
///     .part("file", Part::bytes(vec![0x25, 0x50, 0x44, 0x46]).file_name("evidence.pdf"));
/// assert!(form.is_replayable());
///
/// let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("a"), Ok("b")];
/// let streamed = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
/// let form = form.part("log", Part::stream(streamed));
/// assert!(!form.is_replayable());
/// assert_eq!(form.streamed_parts().collect::<Vec<_>>(), ["log"]);
/// ```
pub struct Form {
    inner: reqwest::multipart::Form,
    /// The names of the parts whose bytes may not be in memory, in the order added.
    streamed: Vec<Cow<'static, str>>,
    /// Converted from a reqwest form, whose parts this type never saw.
    opaque: bool,
}

/// One field of a [`Form`]: reqwest's `multipart::Part`, with a record of whether its bytes
/// are in memory.
pub struct Part {
    inner: reqwest::multipart::Part,
    in_memory: bool,
}

impl Default for Form {
    fn default() -> Self {
        Form::new()
    }
}

impl Form {
    /// An empty form, with a new random boundary.
    #[must_use]
    pub fn new() -> Form {
        Form {
            inner: reqwest::multipart::Form::new(),
            streamed: Vec::new(),
            opaque: false,
        }
    }

    /// The boundary between the parts, in the body and in the `Content-Type`.
    #[must_use]
    pub fn boundary(&self) -> &str {
        self.inner.boundary()
    }

    /// Adds a text field (in memory).
    pub fn text<T, U>(self, name: T, value: U) -> Form
    where
        T: Into<Cow<'static, str>>,
        U: Into<Cow<'static, str>>,
    {
        self.part(name, Part::text(value))
    }

    /// Adds a field.
    pub fn part<T>(mut self, name: T, part: Part) -> Form
    where
        T: Into<Cow<'static, str>>,
    {
        let name = name.into();
        if !part.in_memory {
            self.streamed.push(name.clone());
        }
        self.inner = self.inner.part(name, part.inner);
        self
    }

    /// Percent-encodes field and file names by the `path-segment` rules.
    pub fn percent_encode_path_segment(self) -> Form {
        self.map(reqwest::multipart::Form::percent_encode_path_segment)
    }

    /// Percent-encodes field and file names by the `attr-char` rules.
    pub fn percent_encode_attr_chars(self) -> Form {
        self.map(reqwest::multipart::Form::percent_encode_attr_chars)
    }

    /// Leaves field and file names as they are.
    pub fn percent_encode_noop(self) -> Form {
        self.map(reqwest::multipart::Form::percent_encode_noop)
    }

    /// Whether every part is in memory, so that every attempt can send the same bytes (see
    /// the [module docs](self) for which parts are).
    #[must_use]
    pub fn is_replayable(&self) -> bool {
        self.streamed.is_empty() && !self.opaque
    }

    /// The names of the parts that are not in memory, in the order they were added (none for a
    /// form converted from a `reqwest::multipart::Form`, which is not replayable as a whole).
    pub fn streamed_parts(&self) -> impl Iterator<Item = &str> {
        self.streamed.iter().map(|name| &**name)
    }

    fn map(mut self, f: impl FnOnce(reqwest::multipart::Form) -> reqwest::multipart::Form) -> Self {
        self.inner = f(self.inner);
        self
    }

    /// The body to send: the encoded bytes of a replayable form, else reqwest's stream.
    pub(super) fn encode(self) -> Encoded {
        if !self.is_replayable() {
            return Encoded::Streamed(self.inner);
        }
        let content_type = format!("multipart/form-data; boundary={}", self.inner.boundary());
        // Every part is a body reqwest holds in memory, and reqwest's stream of the form's
        // bytes chains ready items only: one pass polls it to its end. A stream that is not
        // ready is reported rather than waited for, since a builder method cannot wait.
        let mut stream = pin!(self.inner.into_stream());
        let mut cx = Context::from_waker(Waker::noop());
        let mut body = BytesMut::new();
        loop {
            match stream.as_mut().poll_next(&mut cx) {
                Poll::Ready(Some(Ok(chunk))) => body.extend_from_slice(&chunk),
                Poll::Ready(Some(Err(err))) => return Encoded::Failed(Error::builder_from(err)),
                Poll::Ready(None) => break,
                Poll::Pending => {
                    return Encoded::Failed(Error::builder(
                        "a multipart form of in-memory parts did not encode at once",
                    ));
                }
            }
        }
        Encoded::Buffered {
            content_type,
            body: body.freeze(),
        }
    }
}

/// What [`Form::encode`] gives the request builder.
pub(super) enum Encoded {
    /// Every part in memory: the whole body, sent again on every attempt.
    Buffered { content_type: String, body: Bytes },
    /// A streamed part: reqwest's form, sent once.
    Streamed(reqwest::multipart::Form),
    /// The form could not be encoded; nothing is sent.
    Failed(Error),
}

impl From<reqwest::multipart::Form> for Form {
    /// Wraps a reqwest form as it is. Its parts were made without this crate seeing how, so
    /// the form is not replayable: it is sent once, as a stream.
    fn from(inner: reqwest::multipart::Form) -> Self {
        Form {
            inner,
            streamed: Vec::new(),
            opaque: true,
        }
    }
}

impl fmt::Debug for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Form")
            .field("inner", &self.inner)
            .field("streamed", &self.streamed)
            .field("opaque", &self.opaque)
            .finish()
    }
}

impl Part {
    /// A text field (in memory).
    pub fn text<T: Into<Cow<'static, str>>>(value: T) -> Part {
        Part {
            inner: reqwest::multipart::Part::text(value),
            in_memory: true,
        }
    }

    /// A field of bytes (in memory).
    pub fn bytes<T: Into<Cow<'static, [u8]>>>(value: T) -> Part {
        Part {
            inner: reqwest::multipart::Part::bytes(value),
            in_memory: true,
        }
    }

    /// A field from a `reqwest::Body`: in memory when the body was made from bytes, a string
    /// or a vector, streamed when it is a stream.
    pub fn stream<T: Into<reqwest::Body>>(value: T) -> Part {
        let body = value.into();
        let in_memory = body.as_bytes().is_some();
        Part {
            inner: reqwest::multipart::Part::stream(body),
            in_memory,
        }
    }

    /// As [`stream`](Self::stream), with the body's length in bytes known beforehand, so the
    /// request can declare a `Content-Length`.
    pub fn stream_with_length<T: Into<reqwest::Body>>(value: T, length: u64) -> Part {
        let body = value.into();
        let in_memory = body.as_bytes().is_some();
        Part {
            inner: reqwest::multipart::Part::stream_with_length(body, length),
            in_memory,
        }
    }

    /// The part's file name.
    pub fn file_name<T: Into<Cow<'static, str>>>(self, name: T) -> Part {
        self.map(|inner| inner.file_name(name))
    }

    /// The part's MIME type.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when `mime` is not a MIME type.
    pub fn mime_str(self, mime: &str) -> Result<Part, Error> {
        let Part { inner, in_memory } = self;
        Ok(Part {
            inner: inner.mime_str(mime).map_err(Error::builder_from)?,
            in_memory,
        })
    }

    /// Headers of the part's own.
    pub fn headers(self, headers: HeaderMap) -> Part {
        self.map(|inner| inner.headers(headers))
    }

    /// Whether the part's bytes are in memory, so it can be sent again.
    #[must_use]
    pub fn is_replayable(&self) -> bool {
        self.in_memory
    }

    fn map(mut self, f: impl FnOnce(reqwest::multipart::Part) -> reqwest::multipart::Part) -> Self {
        self.inner = f(self.inner);
        self
    }
}

impl From<reqwest::multipart::Part> for Part {
    /// Wraps a reqwest part as it is. How it was made cannot be seen, so it counts as
    /// streamed: a form with it is sent once.
    fn from(inner: reqwest::multipart::Part) -> Self {
        Part {
            inner,
            in_memory: false,
        }
    }
}

impl fmt::Debug for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Part")
            .field("inner", &self.inner)
            .field("in_memory", &self.in_memory)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(form: Form) -> (String, Bytes) {
        match form.encode() {
            Encoded::Buffered { content_type, body } => (content_type, body),
            Encoded::Streamed(_) => panic!("an in-memory form was streamed"),
            Encoded::Failed(err) => panic!("an in-memory form failed to encode: {err}"),
        }
    }

    #[test]
    fn an_in_memory_form_encodes_to_reqwests_bytes_with_its_boundary() {
        let form = Form::new()
            .text("a", "one")
            .part(
                "b",
                Part::bytes(&b"\x00\x01"[..])
                    .file_name("b.bin")
                    .mime_str("application/octet-stream")
                    .expect("a mime type"),
            )
            .part("c", Part::stream("in memory"));
        let boundary = form.boundary().to_owned();
        let (content_type, body) = encoded(form);
        assert_eq!(
            content_type,
            format!("multipart/form-data; boundary={boundary}")
        );
        let expected = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\none\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"b\"; filename=\"b.bin\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n\x00\x01\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"c\"\r\n\r\nin memory\r\n\
             --{boundary}--\r\n"
        );
        assert_eq!(body, expected.as_bytes());
    }

    #[test]
    fn an_empty_form_encodes_to_an_empty_body() {
        let (_, body) = encoded(Form::new());
        assert!(body.is_empty());
    }

    #[test]
    fn parts_from_reqwest_or_streams_are_not_replayable() {
        let from_reqwest = Form::new().part("raw", Part::from(reqwest::multipart::Part::text("x")));
        assert!(!from_reqwest.is_replayable());
        assert_eq!(from_reqwest.streamed_parts().collect::<Vec<_>>(), ["raw"]);
        assert!(matches!(from_reqwest.encode(), Encoded::Streamed(_)));
        let whole = Form::from(reqwest::multipart::Form::new().text("a", "b"));
        assert!(!whole.is_replayable());
        assert!(matches!(whole.encode(), Encoded::Streamed(_)));
        assert!(Part::bytes(vec![1, 2]).is_replayable());
        let err = Part::text("x").mime_str("not a mime").expect_err("invalid");
        assert_eq!(err.kind(), crate::ErrorKind::Builder);
    }
}
