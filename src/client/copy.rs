//! How the client copies its request for each attempt.
//!
//! `reqwest::Request::try_clone` sets the new request's timeout before it replaces the
//! request's extensions wholesale, so every copy allocates an extension map and drops it
//! again: on the happy path (one attempt) that was about 700 of the copy's 1 600 instructions.
//! A request built by [`RequestBuilder`](crate::RequestBuilder) is copied from its parts
//! instead. Its extensions are empty (reqwest's builder sets none but the timeout, which ours
//! never sets: checked once a process, on a probe request built through every builder method
//! the crate calls, and a test below holds reqwest to it), and its buffered body's bytes are
//! taken out once, when the operation starts, to be shared by every copy: reqwest keeps a
//! body's own clone to itself and shows its bytes only as a slice, but a buffered body yields
//! them whole, without a copy, as its one frame. A request handed to
//! [`Client::execute`](crate::Client::execute) may carry extensions, which only reqwest can
//! copy: its copies are reqwest's.
//!
//! Should a later reqwest break either assumption (the probe carries extensions; a buffered
//! body's frame is pending, fails, or its bytes do not add up), the copies are reqwest's
//! `try_clone`, the body rebuilt from the bytes polled out: slower, never wrong, no panic.

use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use hyper::body::Body as _;

use crate::message::body::Read;

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
    /// For a request built by [`RequestBuilder`](crate::RequestBuilder) through `http` (the
    /// client's `reqwest::Client`): takes the bytes of its buffered body out and puts back a
    /// body that shares them, so the request sends the same bytes as before. The copies are
    /// reqwest's `try_clone` instead when reqwest's builder sets extensions or the body does
    /// not yield its bytes as expected.
    pub(super) fn of_built(request: &mut reqwest::Request, http: &reqwest::Client) -> Copies {
        Copies::of_request(request, builder_sets_no_extensions(http))
    }

    /// As [`of_built`](Self::of_built), for a request whose builder sets no extensions when
    /// `no_extensions`; reqwest's copies otherwise.
    fn of_request(request: &mut reqwest::Request, no_extensions: bool) -> Copies {
        if !no_extensions {
            return Copies::Reqwest;
        }
        let Some(body) = request.body_mut() else {
            return Copies::Parts(None);
        };
        let (copies, rebuilt) = of_buffered(body);
        if let Some(rebuilt) = rebuilt {
            *body = rebuilt;
        }
        copies
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

/// A request body as [`of_buffered`] reads it: reqwest's, or a test's.
trait Buffered: hyper::body::Body<Data = Bytes> + Unpin {
    /// The body's bytes, if it holds them all (reqwest's `as_bytes`).
    fn bytes(&self) -> Option<&[u8]>;
}

impl Buffered for reqwest::Body {
    fn bytes(&self) -> Option<&[u8]> {
        self.as_bytes()
    }
}

/// How a body's copies are made, and the body to put in its place (`None`: leave it).
///
/// A buffered body that yields its bytes, all of them, in ready data frames is shared:
/// [`Copies::Parts`] and a body over the same bytes. Anything else (a pending frame, an error,
/// trailers, fewer or more bytes than it held) falls back to [`Copies::Reqwest`], with a body
/// made of the bytes polled out followed by those the body still holds, or the body left as
/// it is when nothing was polled out or those do not add up to the bytes it held.
fn of_buffered<B: Buffered>(body: &mut B) -> (Copies, Option<reqwest::Body>) {
    let Some(held) = body.bytes().map(<[u8]>::len) else {
        return (Copies::Stream, None);
    };
    match take_buffered(body, held) {
        Ok(bytes) => {
            let shared = reqwest::Body::from(bytes.clone());
            (Copies::Parts(Some(bytes)), Some(shared))
        }
        Err(read) if read.len() == 0 => (Copies::Reqwest, None),
        Err(read) => {
            let rest = body.bytes().unwrap_or_default();
            if read.len() + rest.len() != held {
                return (Copies::Reqwest, None);
            }
            let mut all = Vec::with_capacity(held);
            all.extend_from_slice(&read.into_bytes());
            all.extend_from_slice(rest);
            (Copies::Reqwest, Some(reqwest::Body::from(all)))
        }
    }
}

/// The `held` bytes of a buffered body, which it yields as one frame, at once. Should it
/// yield more than one data frame, they are joined. `Err` with the bytes polled out so far
/// when it does anything else: a pending frame, an error, trailers, other than `held` bytes.
fn take_buffered<B: Buffered>(body: &mut B, held: usize) -> Result<Bytes, Read> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut read = Read::default();
    loop {
        match Pin::new(&mut *body).poll_frame(&mut cx) {
            Poll::Ready(None) if read.len() == held => return Ok(read.into_bytes()),
            Poll::Ready(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else {
                    return Err(read);
                };
                read.push(data);
                if read.len() > held {
                    return Err(read);
                }
                if read.len() == held && body.is_end_stream() {
                    return Ok(read.into_bytes());
                }
            }
            Poll::Ready(_) | Poll::Pending => return Err(read),
        }
    }
}

/// Whether reqwest's builder, through every method [`RequestBuilder`](crate::RequestBuilder)
/// calls on it, builds a request without extensions; probed once a process, with `client`.
fn builder_sets_no_extensions(client: &reqwest::Client) -> bool {
    static NONE: OnceLock<bool> = OnceLock::new();
    *NONE.get_or_init(|| {
        let mut headers = http::HeaderMap::new();
        headers.insert("x-two", http::HeaderValue::from_static("2"));
        let built = client
            .post("https://user:password@probe.invalid/v1/probe")
            .header("x-one", "1")
            .headers(headers)
            .query(&[("expand", "customer")])
            .json(&[42])
            .form(&[("amount", 42)])
            .body("{}")
            .version(http::Version::HTTP_11)
            .bearer_auth("token")
            .basic_auth("user", Some("password"))
            .build();
        built.is_ok_and(carries_no_extensions)
    })
}

/// Whether `request` carries no extensions (`reqwest::Request` shows them to nobody else).
fn carries_no_extensions(request: reqwest::Request) -> bool {
    http::Request::<reqwest::Body>::try_from(request)
        .is_ok_and(|request| request.extensions().is_empty())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use http::{HeaderValue, Method, Version};
    use hyper::body::Frame;

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
                let copies = Copies::of_request(&mut original, true);
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
        let copies = Copies::of_request(&mut original, true);
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

    /// One step of a [`Scripted`] body.
    enum Step {
        /// The next this many bytes, as a data frame.
        Data(usize),
        Pending,
        Fail,
        Trailers,
    }

    /// A buffered body that polls as scripted, then yields what it still holds as one frame.
    struct Scripted {
        held: Vec<u8>,
        steps: VecDeque<Step>,
    }

    impl Scripted {
        fn new(held: &[u8], steps: impl IntoIterator<Item = Step>) -> Self {
            Scripted {
                held: held.to_vec(),
                steps: steps.into_iter().collect(),
            }
        }
    }

    impl hyper::body::Body for Scripted {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            let step = self.steps.pop_front();
            match step {
                Some(Step::Data(n)) => {
                    let data: Vec<u8> = self.held.drain(..n).collect();
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(data)))))
                }
                Some(Step::Pending) => Poll::Pending,
                Some(Step::Fail) => Poll::Ready(Some(Err(std::io::Error::other("scripted")))),
                Some(Step::Trailers) => {
                    Poll::Ready(Some(Ok(Frame::trailers(http::HeaderMap::new()))))
                }
                None if self.held.is_empty() => Poll::Ready(None),
                None => {
                    let data = std::mem::take(&mut self.held);
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(data)))))
                }
            }
        }

        fn is_end_stream(&self) -> bool {
            self.held.is_empty() && self.steps.is_empty()
        }
    }

    impl Buffered for Scripted {
        fn bytes(&self) -> Option<&[u8]> {
            Some(&self.held)
        }
    }

    #[test]
    fn a_body_that_is_pending_fails_or_has_trailers_falls_back_to_reqwests_copy() {
        const BODY: &[u8] = b"{\"amount\":42}";
        let scripts: [fn() -> Vec<Step>; 7] = [
            || vec![Step::Pending],
            || vec![Step::Fail],
            || vec![Step::Trailers],
            || vec![Step::Data(5), Step::Pending],
            || vec![Step::Data(5), Step::Fail],
            || vec![Step::Data(5), Step::Data(3), Step::Trailers],
            || vec![Step::Data(0), Step::Data(7), Step::Pending],
        ];
        let expected = parts(&request(Some(reqwest::Body::from(BODY))));
        for script in scripts {
            let mut body = Scripted::new(BODY, script());
            let (copies, rebuilt) = of_buffered(&mut body);
            assert!(matches!(copies, Copies::Reqwest));
            // The body in the request: the rebuilt one, or the scripted one as it was left.
            let body = rebuilt.unwrap_or_else(|| reqwest::Body::from(body.held));
            let original = request(Some(body));
            assert_eq!(parts(&original), expected);
            for _ in 0..2 {
                let copy = copies.copy(&original).expect("a buffered body is copied");
                assert_eq!(parts(&copy), expected);
            }
        }
    }

    #[test]
    fn a_body_that_yields_its_bytes_in_ready_frames_is_shared() {
        const BODY: &[u8] = b"{\"amount\":42}";
        for script in [
            vec![],
            vec![Step::Data(5)],
            vec![Step::Data(5), Step::Data(8)],
        ] {
            let mut body = Scripted::new(BODY, script);
            let (copies, rebuilt) = of_buffered(&mut body);
            let Copies::Parts(Some(bytes)) = copies else {
                panic!("a well-behaved buffered body is copied from its parts");
            };
            assert_eq!(&bytes[..], BODY);
            let rebuilt = rebuilt.expect("a body sharing the bytes");
            assert_eq!(rebuilt.as_bytes(), Some(BODY));
        }
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Marker(u32);

    #[test]
    fn a_request_carrying_an_extension_is_copied_by_reqwest_with_it() {
        let mut built = http::Request::builder()
            .method(Method::POST)
            .uri("https://api.example.com/v1/charges")
            .header("idempotency-key", "k-1")
            .version(Version::HTTP_11)
            .body(reqwest::Body::from("{\"amount\":42}"))
            .expect("an http request");
        built.extensions_mut().insert(Marker(7));
        let mut original = reqwest::Request::try_from(built).expect("a reqwest request");
        let probe = original.try_clone().expect("a buffered body clones");
        assert!(!carries_no_extensions(probe));
        let before = parts(&original);
        let copies = Copies::of_request(&mut original, false);
        assert!(matches!(copies, Copies::Reqwest));
        assert_eq!(parts(&original), before);
        let copy = copies.copy(&original).expect("a buffered body is copied");
        assert_eq!(parts(&copy), before);
        let copy = http::Request::<reqwest::Body>::try_from(copy).expect("an http request");
        assert_eq!(copy.extensions().get::<Marker>(), Some(&Marker(7)));
    }

    /// The probe the fast path stands on finds no extensions in this reqwest.
    #[test]
    fn the_probe_finds_reqwests_builder_setting_no_extensions() {
        assert!(builder_sets_no_extensions(&reqwest::Client::new()));
    }
}
