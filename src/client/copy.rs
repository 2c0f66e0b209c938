//! How the client copies its request for each attempt.
//!
//! `reqwest::Request::try_clone` sets the new request's timeout before it replaces the
//! request's extensions wholesale, so every copy allocates an extension map and drops it
//! again: on the happy path (one attempt) that was about 700 of the copy's 1 600 instructions.
//! A request built by [`RequestBuilder`](crate::RequestBuilder) is copied from its parts
//! instead. Its extensions are empty (reqwest's builder sets none but the timeout, which ours
//! never sets: a test below holds reqwest to it), and its buffered body's bytes are taken out
//! once, when the operation starts, to be shared by every copy: reqwest keeps a body's own
//! clone to itself and shows its bytes only as a slice, but a buffered body yields them whole,
//! without a copy, as its one frame. A request handed to
//! [`Client::execute`](crate::Client::execute) may carry extensions, which only reqwest can
//! copy: its copies are reqwest's.

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use hyper::body::Body as _;

use crate::body::Read;

/// How the copies of one operation's request are made.
pub(super) enum Copies {
    /// By `reqwest::Request::try_clone`.
    Reqwest,
    /// From the parts of a request without extensions, its buffered body's bytes (if any)
    /// shared.
    Parts(Option<Bytes>),
    /// None can be made: the body is a stream.
    Stream,
}

impl Copies {
    /// For a request built by [`RequestBuilder`](crate::RequestBuilder): takes the bytes of its
    /// buffered body out and puts back a body that shares them, so the request sends the same
    /// bytes as before.
    pub(super) fn of_built(request: &mut reqwest::Request) -> Copies {
        let Some(body) = request.body_mut() else {
            return Copies::Parts(None);
        };
        if body.as_bytes().is_none() {
            return Copies::Stream;
        }
        let bytes = take_buffered(body);
        *body = reqwest::Body::from(bytes.clone());
        Copies::Parts(Some(bytes))
    }

    /// A copy of `original`, the operation's request, to send as one attempt; `None` for a
    /// streamed body, as `reqwest::Request::try_clone` returns.
    pub(super) fn copy(&self, original: &reqwest::Request) -> Option<reqwest::Request> {
        let body = match self {
            Copies::Reqwest => return original.try_clone(),
            Copies::Stream => return None,
            Copies::Parts(body) => body.clone().map(reqwest::Body::from),
        };
        let mut copy = reqwest::Request::new(original.method().clone(), original.url().clone());
        *copy.headers_mut() = original.headers().clone();
        *copy.version_mut() = original.version();
        if let Some(timeout) = original.timeout() {
            *copy.timeout_mut() = Some(*timeout);
        }
        *copy.body_mut() = body;
        Some(copy)
    }
}

/// The bytes of a buffered body (`as_bytes` is `Some`), which it yields as one frame, at once.
/// Should a buffered body ever yield more than one frame, they are joined: the bytes are
/// always all of them.
fn take_buffered(body: &mut reqwest::Body) -> Bytes {
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Read::default();
    loop {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(None) => return read.into_bytes(),
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                read.push(data);
                if body.is_end_stream() {
                    return read.into_bytes();
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => {
                unreachable!("a buffered reqwest body is always ready and cannot fail")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::{HeaderValue, Method, Version};

    use super::*;

    fn request(body: Option<reqwest::Body>) -> reqwest::Request {
        let url = reqwest::Url::parse("https://api.example.com/v1/charges").expect("a URL");
        let mut request = reqwest::Request::new(Method::POST, url);
        request
            .headers_mut()
            .insert("idempotency-key", HeaderValue::from_static("k-1"));
        *request.version_mut() = Version::HTTP_11;
        *request.body_mut() = body;
        request
    }

    /// What a copy is made of, for comparing it with reqwest's own.
    type Parts = (
        Method,
        String,
        http::HeaderMap,
        Version,
        Option<Duration>,
        Option<Vec<u8>>,
    );

    fn parts(request: &reqwest::Request) -> Parts {
        (
            request.method().clone(),
            request.url().to_string(),
            request.headers().clone(),
            request.version(),
            request.timeout().copied(),
            request
                .body()
                .map(|body| body.as_bytes().expect("a buffered body").to_vec()),
        )
    }

    #[test]
    fn a_copy_from_parts_is_what_reqwest_would_copy_and_the_original_is_unchanged() {
        let bodies: [fn() -> Option<reqwest::Body>; 4] = [
            || None,
            || Some(reqwest::Body::from("{\"amount\":42}")),
            || Some(reqwest::Body::from(vec![0_u8, 1, 2, 255])),
            || Some(reqwest::Body::from(Bytes::new())),
        ];
        for body in bodies {
            for timeout in [None, Some(Duration::from_secs(7))] {
                let mut original = request(body());
                *original.timeout_mut() = timeout;
                let before = parts(&original.try_clone().expect("a buffered body clones"));
                let copies = Copies::of_built(&mut original);
                assert!(matches!(copies, Copies::Parts(_)));
                assert_eq!(parts(&original), before);
                for _ in 0..2 {
                    let copy = copies.copy(&original).expect("a buffered body is copied");
                    assert_eq!(parts(&copy), before);
                }
            }
        }
    }

    #[test]
    fn a_stream_is_left_alone_and_never_copied() {
        let stream = futures_util::stream::iter([Ok::<_, std::io::Error>(Bytes::from("x"))]);
        let mut original = request(Some(reqwest::Body::wrap_stream(stream)));
        let copies = Copies::of_built(&mut original);
        assert!(matches!(copies, Copies::Stream));
        assert!(copies.copy(&original).is_none());
        assert!(
            original
                .body()
                .is_some_and(|body| body.as_bytes().is_none())
        );
    }

    /// Copies from parts leave the extensions out: this holds reqwest's builder, through every
    /// method `RequestBuilder` calls on it, to building requests without any.
    #[test]
    fn reqwests_builder_sets_no_extensions() {
        #[derive(serde::Serialize)]
        struct Charge {
            amount: u32,
        }
        let mut headers = http::HeaderMap::new();
        headers.insert("x-two", HeaderValue::from_static("2"));
        let built = reqwest::Client::new()
            .post("https://api.example.com/v1/charges")
            .header("x-one", "1")
            .headers(headers)
            .query(&[("expand", "customer")])
            .json(&Charge { amount: 42 })
            .form(&Charge { amount: 42 })
            .body("{}")
            .version(Version::HTTP_11)
            .bearer_auth("token")
            .basic_auth("user", Some("password"))
            .build()
            .expect("a request");
        let http = http::Request::<reqwest::Body>::try_from(built).expect("an http request");
        assert!(http.extensions().is_empty());
    }
}
