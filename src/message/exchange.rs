//! The request and response types the engine works with ([`RetryRequest`], [`RetryResponse`])
//! and their implementations for `reqwest` and `http` types, including what the ledger needs of
//! them: a request's fingerprint, and a response's body saved and rebuilt.
//!
//! `reqwest::Request` enforces the attempt timeout itself (from connecting until the body has
//! been read); `http::Request` has no such setting, so the engine bounds those attempts up to
//! the response head.
//!
//! `http::Request<B>` and `http::Response<B>` are generic over any body; the ledger can read and
//! build only bodies it knows. They are recognised by type (`Any`), because the traits cannot
//! ask more of `B` without narrowing which services the tower front end wraps: see
//! [`RetryRequest::fingerprint`] and [`RetryResponse::from_saved`] for the list.

use std::any::Any;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap};
use http::{Method, StatusCode};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Body;

use crate::keys::fingerprint::RequestFingerprint;
use crate::message::body::{Capped, read_capped};

type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// A request type the retry engine can send once per attempt.
///
/// Implemented for `reqwest::Request` and for `http::Request<B>` with a cloneable body
/// (`String`, `Bytes`, `http_body_util::Full<Bytes>`, ...). The tower front end accepts any
/// request type that implements it.
pub trait RetryRequest: Sized + Send + 'static {
    /// The request method: it decides whether a key is minted and whether a keyless retry is
    /// safe.
    fn method(&self) -> &Method;

    /// The target host, for the span, [per-host policies](crate::ClientBuilder::policy_for_host)
    /// and the default [ledger scope](crate::RequestBuilder::ledger_scope).
    fn host(&self) -> Option<&str>;

    /// The request headers, where the key (and the optional attempt number) travel.
    fn headers_mut(&mut self) -> &mut HeaderMap;

    /// A copy to send as one attempt, or `None` when the body cannot be sent twice (the
    /// request then gets one attempt, and a transient failure becomes
    /// [`ErrorKind::BodyNotReplayable`](crate::ErrorKind::BodyNotReplayable)).
    fn try_clone(&self) -> Option<Self>;

    /// Asks the request to carry its own timeout for this attempt. Returns `false` when it
    /// cannot; the engine then bounds the attempt itself, up to the response head.
    fn set_timeout(&mut self, timeout: Duration) -> bool;

    /// Extensions where a caller may put an [`IdempotencyKey`](crate::IdempotencyKey), a
    /// [`RetryPolicy`](crate::RetryPolicy), [`WithoutIdempotencyKey`](crate::WithoutIdempotencyKey)
    /// or a [`LedgerScope`](crate::LedgerScope) for this request only. `None` when the type has
    /// none the engine can read.
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// What a [`Ledger`](crate::ledger::Ledger) records the request by: its method, URL and buffered
    /// body ([`RequestFingerprint::new`]). `None` when the body is a stream that cannot be read
    /// without consuming it, or the type cannot tell: a front end with a ledger then refuses the
    /// keyed request with [`ErrorKind::Builder`](crate::ErrorKind::Builder) before claiming or
    /// sending anything.
    ///
    /// `reqwest::Request` gives it unless its body is a stream. `http::Request<B>` gives it for
    /// the body types `String`, `Vec<u8>`, `Bytes`, `&'static str`, `&'static [u8]`, `()`,
    /// `http_body_util::Full<Bytes>` and `http_body_util::Empty<Bytes>`. The default is `None`.
    fn fingerprint(&self) -> Option<RequestFingerprint> {
        None
    }

    /// The absolute URL the request goes to, for its attempt span's `url.full`,
    /// `server.address` and `server.port` ([traces](crate#traces)) and the same labels of its
    /// duration metric ([metrics](crate#metrics)). Asked only when the span is recorded or the
    /// feature `metrics` is on. The default is `None`.
    fn url(&self) -> Option<reqwest::Url> {
        None
    }

    /// The request's path (`/v1/charges`, no query), for the tower layer's ledger scopes by
    /// path prefix (`IdempotentRetryLayer::scope_for_path_prefix`, feature `tower`). The
    /// default is `None`: no rule by path applies to the request.
    fn path(&self) -> Option<&str> {
        None
    }
}

/// A response type the retry engine can classify and annotate.
///
/// Implemented for `reqwest::Response` and `http::Response<B>`.
pub trait RetryResponse: Send + 'static {
    /// The status.
    fn status(&self) -> StatusCode;

    /// The headers (for `Retry-After` and server retry hints).
    fn headers(&self) -> &HeaderMap;

    /// Where the final [`RetryReport`](crate::RetryReport) goes.
    fn extensions_mut(&mut self) -> &mut http::Extensions;

    /// Where the final [`RetryReport`](crate::RetryReport) is read back from
    /// ([`Outcome::of`](crate::Outcome::of)). The default is `None`.
    fn extensions(&self) -> Option<&http::Extensions> {
        None
    }

    /// The HTTP version of the response, for its attempt span's `network.protocol.version`.
    /// The default is `None`.
    fn version(&self) -> Option<http::Version> {
        None
    }

    /// The URL that gave this response: the last hop when redirects were followed. A ledger
    /// saves it with the answer when it is not the request's, and a replay reports it. The
    /// default is `None` (the request's URL).
    fn answered_url(&self) -> Option<&reqwest::Url> {
        None
    }

    /// The body's length when the response declares it (`Content-Length`). The default reads
    /// the header.
    fn body_length(&self) -> Option<u64> {
        self.headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse().ok())
    }

    /// Rebuilds a response a [`Ledger`](crate::ledger::Ledger) saved, to answer an operation that
    /// already succeeded without sending it again. `None` when this type cannot be built from
    /// bytes: a front end with a ledger then refuses keyed requests with
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) before claiming or sending anything.
    ///
    /// `reqwest::Response` can always be rebuilt. `http::Response<B>` can for the body types
    /// `String`, `Vec<u8>`, `Bytes`, `http_body_util::Full<Bytes>`, `reqwest::Body` and
    /// `http_body_util::combinators::{BoxBody, UnsyncBoxBody}<Bytes, Box<dyn Error + Send +
    /// Sync>>`; hyper's `Incoming` cannot: box it inside the tower layer with
    /// `IdempotentRetryLayer::box_response_body` (feature `tower`), or map it to one of those
    /// yourself (`body.map_err(Into::into).boxed()`). The default is `None`.
    fn from_saved(saved: http::Response<Bytes>) -> Option<Self>
    where
        Self: Sized,
    {
        let _ = saved;
        None
    }

    /// Reads the body so the ledger can save it, no further than `max` bytes, and gives the
    /// response back with a body that still yields every byte (`None` in place of the bytes
    /// when the body is longer than `max`: it is then not saved, and a replay says so with
    /// [`RetryReport::is_replay_body_missing`](crate::RetryReport::is_replay_body_missing)).
    ///
    /// # Errors
    ///
    /// The body's own error when it fails while being read (a cut connection, a timeout):
    /// the response is then lost, and the operation ends with outcome unknown.
    fn read_to_save(
        self,
        max: usize,
    ) -> impl Future<Output = Result<(Self, Option<Bytes>), BoxError>> + Send
    where
        Self: Sized,
    {
        let _ = max;
        std::future::ready(Ok((self, None)))
    }

    /// The response with a body whose errors, should it fail while the caller reads it, carry
    /// `note` (what a cut answer means for the operation and how to get it again). The
    /// default leaves the body as it is.
    fn note_body_errors(self, note: std::sync::Arc<str>) -> Self
    where
        Self: Sized,
    {
        let _ = note;
        self
    }
}

impl RetryRequest for reqwest::Request {
    fn method(&self) -> &Method {
        reqwest::Request::method(self)
    }

    fn host(&self) -> Option<&str> {
        self.url().host_str()
    }

    fn headers_mut(&mut self) -> &mut HeaderMap {
        reqwest::Request::headers_mut(self)
    }

    fn try_clone(&self) -> Option<Self> {
        reqwest::Request::try_clone(self)
    }

    fn set_timeout(&mut self, timeout: Duration) -> bool {
        *self.timeout_mut() = Some(timeout);
        true
    }

    fn url(&self) -> Option<reqwest::Url> {
        Some(reqwest::Request::url(self).clone())
    }

    fn path(&self) -> Option<&str> {
        Some(reqwest::Request::url(self).path())
    }

    fn fingerprint(&self) -> Option<RequestFingerprint> {
        let body = match self.body() {
            None => &[][..],
            Some(body) => body.as_bytes()?,
        };
        Some(RequestFingerprint::of_url(
            self.method(),
            self.url().clone(),
            self.headers().get(CONTENT_TYPE),
            body,
        ))
    }
}

impl RetryResponse for reqwest::Response {
    fn status(&self) -> StatusCode {
        reqwest::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        reqwest::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        reqwest::Response::extensions_mut(self)
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(reqwest::Response::extensions(self))
    }

    fn version(&self) -> Option<http::Version> {
        Some(reqwest::Response::version(self))
    }

    fn answered_url(&self) -> Option<&reqwest::Url> {
        Some(self.url())
    }

    /// From the body's size hint, which hyper sets from `Content-Length`: no header lookup.
    fn body_length(&self) -> Option<u64> {
        self.content_length()
    }

    fn from_saved(saved: http::Response<Bytes>) -> Option<Self> {
        Some(reqwest::Response::from(saved))
    }

    async fn read_to_save(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let url = self.url().clone();
        let (parts, body) = http::Response::<reqwest::Body>::from(self).into_parts();
        let (body, saved) = match read_capped(body, max).await? {
            Capped::Whole(bytes) => (reqwest::Body::from(bytes.clone()), Some(bytes)),
            Capped::Over(rest) => (reqwest::Body::wrap(rest), None),
        };
        Ok((rebuilt(url, parts, body), saved))
    }

    fn note_body_errors(self, note: std::sync::Arc<str>) -> Self {
        let url = self.url().clone();
        let (parts, body) = http::Response::<reqwest::Body>::from(self).into_parts();
        let body = reqwest::Body::wrap(crate::message::noted_body::NotedBody { inner: body, note });
        rebuilt(url, parts, body)
    }
}

/// A `reqwest::Response` from a response's parts and a new body. The URL is the one part the
/// conversion to an `http::Response` drops, and it rides back in an extension only reqwest's
/// `ResponseBuilderExt::url` can write: that one extension is moved from an otherwise unused
/// builder into the parts, whose status, headers and extensions (the report, the redirect
/// chain) move across as they are.
fn rebuilt(
    url: reqwest::Url,
    mut parts: http::response::Parts,
    body: reqwest::Body,
) -> reqwest::Response {
    use reqwest::ResponseBuilderExt as _;
    let mut carrier = http::response::Builder::new().url(url);
    if let Some(url) = carrier.extensions_mut() {
        parts.extensions.extend(std::mem::take(url));
    }
    reqwest::Response::from(http::Response::from_parts(parts, body))
}

impl<B: Clone + Send + 'static> RetryRequest for http::Request<B> {
    fn method(&self) -> &Method {
        http::Request::method(self)
    }

    fn host(&self) -> Option<&str> {
        self.uri().host()
    }

    fn headers_mut(&mut self) -> &mut HeaderMap {
        http::Request::headers_mut(self)
    }

    fn try_clone(&self) -> Option<Self> {
        Some(self.clone())
    }

    fn set_timeout(&mut self, _timeout: Duration) -> bool {
        false
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(http::Request::extensions(self))
    }

    fn url(&self) -> Option<reqwest::Url> {
        // Only an absolute URI names a server; a path alone leaves the attributes out.
        self.uri().scheme()?;
        reqwest::Url::parse(&self.uri().to_string()).ok()
    }

    fn path(&self) -> Option<&str> {
        Some(self.uri().path())
    }

    fn fingerprint(&self) -> Option<RequestFingerprint> {
        let body = buffered_body(self.body())?;
        Some(RequestFingerprint::new(
            http::Request::method(self),
            &self.uri().to_string(),
            self.headers().get(CONTENT_TYPE),
            &body,
        ))
    }
}

impl<B: Send + 'static> RetryResponse for http::Response<B> {
    fn status(&self) -> StatusCode {
        http::Response::status(self)
    }

    fn headers(&self) -> &HeaderMap {
        http::Response::headers(self)
    }

    fn extensions_mut(&mut self) -> &mut http::Extensions {
        http::Response::extensions_mut(self)
    }

    fn extensions(&self) -> Option<&http::Extensions> {
        Some(http::Response::extensions(self))
    }

    fn version(&self) -> Option<http::Version> {
        Some(http::Response::version(self))
    }

    fn from_saved(saved: http::Response<Bytes>) -> Option<Self> {
        let (parts, bytes) = saved.into_parts();
        Some(http::Response::from_parts(
            parts,
            body_from_bytes::<B>(bytes)?,
        ))
    }

    async fn read_to_save(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let (parts, body) = self.into_parts();
        let (body, saved) = read_body_to_save(body, max).await?;
        Ok((http::Response::from_parts(parts, body), saved))
    }
}

/// `value` as a `T`, when `B` is `T`; otherwise `value` back. Moves, never copies.
fn cast<B: 'static, T: 'static>(value: B) -> Result<T, B> {
    let mut slot = Some(value);
    match (&mut slot as &mut dyn Any).downcast_mut::<Option<T>>() {
        Some(same) => Ok(same.take().expect("the slot was just filled")),
        None => Err(slot.expect("the slot is untouched when the types differ")),
    }
}

/// The bytes of a request body the ledger knows how to read without consuming it.
fn buffered_body<B: Clone + 'static>(body: &B) -> Option<Bytes> {
    let any = body as &dyn Any;
    if let Some(bytes) = any.downcast_ref::<Bytes>() {
        return Some(bytes.clone());
    }
    if let Some(text) = any.downcast_ref::<String>() {
        return Some(Bytes::copy_from_slice(text.as_bytes()));
    }
    if let Some(bytes) = any.downcast_ref::<Vec<u8>>() {
        return Some(Bytes::copy_from_slice(bytes));
    }
    if let Some(text) = any.downcast_ref::<&'static str>() {
        return Some(Bytes::from_static(text.as_bytes()));
    }
    if let Some(bytes) = any.downcast_ref::<&'static [u8]>() {
        return Some(Bytes::from_static(bytes));
    }
    if any.is::<()>() || any.is::<Empty<Bytes>>() {
        return Some(Bytes::new());
    }
    if let Some(full) = any.downcast_ref::<Full<Bytes>>() {
        return ready_bytes(full.clone());
    }
    None
}

/// The data of a body whose frames are all ready at once (`Full`): polled with a waker that
/// is never woken, so a body that would wait gives `None` instead of blocking.
fn ready_bytes<B: Body<Data = Bytes> + Unpin>(mut body: B) -> Option<Bytes> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut data = Vec::new();
    loop {
        match Pin::new(&mut body).poll_frame(&mut cx) {
            Poll::Ready(None) => return Some(Bytes::from(data)),
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(chunk) = frame.into_data() {
                    data.extend_from_slice(&chunk);
                }
            }
            Poll::Ready(Some(Err(_))) | Poll::Pending => return None,
        }
    }
}

/// A response body type the ledger knows how to build from saved bytes and to read for saving
/// (the list in [`RetryResponse::from_saved`]).
trait KnownBody: Sized + Send + 'static {
    /// A body that yields `bytes`; `None` when they cannot be this type (not UTF-8 for `String`).
    fn from_bytes(bytes: Bytes) -> Option<Self>;

    /// The body read up to `max` bytes: a body that still yields every byte, and the bytes when
    /// they fit.
    fn read(
        self,
        max: usize,
    ) -> impl Future<Output = Result<(Self, Option<Bytes>), BoxError>> + Send;
}

/// The bytes, when there are at most `max` of them.
fn fits(bytes: &[u8], max: usize) -> Option<Bytes> {
    (bytes.len() <= max).then(|| Bytes::copy_from_slice(bytes))
}

impl KnownBody for Bytes {
    fn from_bytes(bytes: Bytes) -> Option<Self> {
        Some(bytes)
    }

    async fn read(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let saved = (self.len() <= max).then(|| self.clone());
        Ok((self, saved))
    }
}

impl KnownBody for String {
    fn from_bytes(bytes: Bytes) -> Option<Self> {
        String::from_utf8(bytes.to_vec()).ok()
    }

    async fn read(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let saved = fits(self.as_bytes(), max);
        Ok((self, saved))
    }
}

impl KnownBody for Vec<u8> {
    fn from_bytes(bytes: Bytes) -> Option<Self> {
        Some(bytes.to_vec())
    }

    async fn read(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let saved = fits(&self, max);
        Ok((self, saved))
    }
}

impl KnownBody for Full<Bytes> {
    fn from_bytes(bytes: Bytes) -> Option<Self> {
        Some(Full::new(bytes))
    }

    async fn read(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
        let bytes = self.collect().await.map(|whole| whole.to_bytes())?;
        let saved = (bytes.len() <= max).then(|| bytes.clone());
        Ok((Full::new(bytes), saved))
    }
}

/// The streamed body types: read frame by frame up to the cap, the rest passed on unread.
macro_rules! streamed_known_body {
    ($($body:ty: $whole:expr, $rest:expr;)*) => {$(
        impl KnownBody for $body {
            fn from_bytes(bytes: Bytes) -> Option<Self> {
                Some($whole(bytes))
            }

            async fn read(self, max: usize) -> Result<(Self, Option<Bytes>), BoxError> {
                Ok(match read_capped(self, max).await? {
                    Capped::Whole(bytes) => ($whole(bytes.clone()), Some(bytes)),
                    Capped::Over(rest) => ($rest(rest), None),
                })
            }
        }
    )*};
}

streamed_known_body! {
    reqwest::Body: reqwest::Body::from, reqwest::Body::wrap;
    BoxBody<Bytes, BoxError>: |bytes| BoxBody::new(whole_body(bytes)), BoxBody::new;
    UnsyncBoxBody<Bytes, BoxError>: |bytes| UnsyncBoxBody::new(whole_body(bytes)), UnsyncBoxBody::new;
}

/// Runs `$then` with `$known` naming `$body`'s type when it is one the ledger knows (the body
/// itself cast to that type); falls through otherwise.
macro_rules! as_known_body {
    ($b:ty, $known:ident => $then:expr) => {
        as_known_body!(@each $b, $known => $then; Bytes, String, Vec<u8>, Full<Bytes>,
            reqwest::Body, BoxBody<Bytes, BoxError>, UnsyncBoxBody<Bytes, BoxError>)
    };
    (@each $b:ty, $known:ident => $then:expr; $($t:ty),*) => {$(
        if is::<$b, $t>() {
            type $known = $t;
            return $then;
        }
    )*};
}

/// Why a front end with a ledger refuses a keyed request whose response type `R` cannot be
/// rebuilt from saved bytes: the type, the types that can be (the list in
/// [`RetryResponse::from_saved`], with their error types), and the way there from hyper's
/// `Incoming`.
pub(crate) fn not_replayable<R>() -> String {
    format!(
        "a ledger replays completed operations, and this front end's response body type cannot \
         be rebuilt from saved bytes: {}; a ledger rebuilds reqwest::Response, and \
         http::Response<B> for B one of Bytes, String, Vec<u8>, http_body_util::Full<Bytes>, \
         reqwest::Body, {BOX_BODY} and {UNSYNC_BOX_BODY}; over a hyper client, box its \
         Incoming inside the layer with IdempotentRetryLayer::box_response_body, or map it \
         yourself: response.map(|body| body.map_err(Into::into).boxed()); nothing was sent",
        std::any::type_name::<R>()
    )
}

/// The boxed response bodies a ledger rebuilds, spelled as a user writes them.
const BOX_BODY: &str =
    "http_body_util::combinators::BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>";
const UNSYNC_BOX_BODY: &str =
    "http_body_util::combinators::UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>";

/// A response body of type `B` holding `bytes`, for the body types the ledger can build.
fn body_from_bytes<B: 'static>(bytes: Bytes) -> Option<B> {
    as_known_body!(B, Known => Known::from_bytes(bytes).map(back));
    None
}

/// `bytes` as a body with the boxed bodies' error type (it never fails).
fn whole_body(bytes: Bytes) -> impl Body<Data = Bytes, Error = BoxError> + Send + Sync + Unpin {
    Full::new(bytes).map_err(|never| -> BoxError { match never {} })
}

fn is<B: 'static, T: 'static>() -> bool {
    std::any::TypeId::of::<B>() == std::any::TypeId::of::<T>()
}

/// Reads a response body of a type the ledger knows, up to `max` bytes; gives back a body that
/// still yields every byte, and the bytes when they fit. A body of another type is passed back
/// untouched, nothing saved.
async fn read_body_to_save<B: Send + 'static>(
    body: B,
    max: usize,
) -> Result<(B, Option<Bytes>), BoxError> {
    as_known_body!(B, Known => {
        let (body, saved) = back::<B, Known>(body).read(max).await?;
        Ok((back(body), saved))
    });
    Ok((body, None))
}

/// A body of a known type, back as the response's own type `B` it was cast from.
fn back<T: 'static, B: 'static>(body: T) -> B {
    cast::<T, B>(body)
        .ok()
        .expect("a body is cast back to the type it was cast from")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(body: &'static str) -> http::Response<Bytes> {
        let mut response = http::Response::new(Bytes::from_static(body.as_bytes()));
        *response.status_mut() = StatusCode::CREATED;
        response
    }

    /// A body's every byte, whatever its type.
    trait Whole: Sized + Send + 'static {
        fn whole(self) -> Pin<Box<dyn Future<Output = Bytes> + Send>>;
    }

    impl Whole for String {
        fn whole(self) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
            Box::pin(std::future::ready(Bytes::from(self)))
        }
    }

    impl Whole for Bytes {
        fn whole(self) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
            Box::pin(std::future::ready(self))
        }
    }

    impl Whole for Vec<u8> {
        fn whole(self) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
            Box::pin(std::future::ready(Bytes::from(self)))
        }
    }

    macro_rules! whole_by_collecting {
        ($($body:ty),*) => {$(
            impl Whole for $body {
                fn whole(self) -> Pin<Box<dyn Future<Output = Bytes> + Send>> {
                    Box::pin(async move {
                        self.collect().await.expect("the body").to_bytes()
                    })
                }
            }
        )*};
    }

    whole_by_collecting!(
        Full<Bytes>,
        reqwest::Body,
        BoxBody<Bytes, BoxError>,
        UnsyncBoxBody<Bytes, BoxError>
    );

    /// A response of body type `B` rebuilt from saved bytes, then read back to save.
    async fn round_trip<B: Whole>(cap: usize) -> (StatusCode, Option<Bytes>, String) {
        let response = http::Response::<B>::from_saved(saved("hello, ledger"))
            .unwrap_or_else(|| panic!("{} rebuilds", std::any::type_name::<B>()));
        let status = response.status();
        let (response, kept) = response.read_to_save(cap).await.expect("read");
        let rest = response.into_body().whole().await;
        (
            status,
            kept,
            String::from_utf8(rest.to_vec()).expect("utf-8"),
        )
    }

    async fn every_known_body(cap: usize) -> Vec<(StatusCode, Option<Bytes>, String)> {
        vec![
            round_trip::<String>(cap).await,
            round_trip::<Bytes>(cap).await,
            round_trip::<Vec<u8>>(cap).await,
            round_trip::<Full<Bytes>>(cap).await,
            round_trip::<reqwest::Body>(cap).await,
            round_trip::<BoxBody<Bytes, BoxError>>(cap).await,
            round_trip::<UnsyncBoxBody<Bytes, BoxError>>(cap).await,
        ]
    }

    #[tokio::test]
    async fn every_known_response_body_is_rebuilt_saved_and_handed_back_whole() {
        for (status, kept, rest) in every_known_body(64).await {
            assert_eq!(status, StatusCode::CREATED);
            assert_eq!(kept.as_deref(), Some(&b"hello, ledger"[..]));
            assert_eq!(rest, "hello, ledger");
        }
        // Over the cap: nothing saved, every byte still handed back.
        for (_, kept, rest) in every_known_body(5).await {
            assert_eq!(kept, None);
            assert_eq!(rest, "hello, ledger");
        }
    }

    #[test]
    fn the_refusal_names_the_response_type_and_every_body_type_a_ledger_rebuilds() {
        let message = not_replayable::<http::Response<hyper::body::Incoming>>();
        assert!(
            message.contains("hyper::body::incoming::Incoming"),
            "{message}"
        );
        // The types `every_known_response_body_is_rebuilt_saved_and_handed_back_whole` rebuilds.
        for known in [
            "reqwest::Response",
            "Bytes",
            "String",
            "Vec<u8>",
            "http_body_util::Full<Bytes>",
            "reqwest::Body",
            "BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>",
            "UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>",
            "IdempotentRetryLayer::box_response_body",
            "body.map_err(Into::into).boxed()",
        ] {
            assert!(message.contains(known), "{known}: {message}");
        }
    }

    #[test]
    fn a_body_type_the_ledger_does_not_know_is_not_rebuilt() {
        #[derive(Debug)]
        struct Opaque;
        assert!(http::Response::<Opaque>::from_saved(saved("x")).is_none());
        assert!(reqwest::Response::from_saved(saved("x")).is_some());
    }

    #[test]
    fn every_known_request_body_has_the_fingerprint_of_its_bytes() {
        fn of<B: Clone + Send + 'static>(body: B) -> Option<RequestFingerprint> {
            let request = http::Request::post("http://api.example.com/v1/charges")
                .header(CONTENT_TYPE, "application/json")
                .body(body)
                .expect("request");
            RetryRequest::fingerprint(&request)
        }
        let json = r#"{"amount":100}"#;
        let want = of(String::from(json)).expect("a String is buffered");
        assert_eq!(of(Bytes::from_static(json.as_bytes())), Some(want.clone()));
        assert_eq!(of(json.as_bytes().to_vec()), Some(want.clone()));
        assert_eq!(of(json), Some(want.clone()));
        assert_eq!(of(json.as_bytes()), Some(want.clone()));
        assert_eq!(
            of(Full::new(Bytes::from_static(json.as_bytes()))),
            Some(want.clone())
        );
        // The same request through reqwest: one fingerprint for every front end.
        let through_reqwest = reqwest::Client::new()
            .post("http://api.example.com/v1/charges")
            .header(CONTENT_TYPE, "application/json")
            .body(json)
            .build()
            .expect("request");
        assert_eq!(RetryRequest::fingerprint(&through_reqwest), Some(want));
        // No body, in every spelling of it.
        let empty = of(()).expect("no body");
        assert_eq!(of(Empty::<Bytes>::new()), Some(empty.clone()));
        assert_eq!(of(String::new()), Some(empty));
        // A body type the ledger cannot read.
        #[derive(Debug, Clone)]
        struct Opaque;
        assert_eq!(of(Opaque), None);
    }
}
