//! The crate's front ends behind one small trait, so each behavioural case is written once and
//! run against every one of them: the `Client`, the tower service over `reqwest::Client`, the
//! tower service over a hyper client (`http::Request`, with hyper's own response body or with
//! it boxed, which a ledger can save and rebuild), and the `reqwest-middleware` middleware.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::Method;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use idempotent_retry::{
    Client, ClientBuilder, Error, IdempotencyKey, IdempotentRetry, LedgerScope, RetryPolicy,
    RetryReport, WithoutIdempotencyKey,
};
use tower::{Service, ServiceBuilder, ServiceExt};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One logical request, in terms every front end can express.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: Method,
    pub url: String,
    pub body: String,
    pub key: Option<IdempotencyKey>,
    pub policy: Option<RetryPolicy>,
    /// `false`: no automatic key for this request.
    pub auto_key: bool,
    /// Send the body as a stream of chunks (not replayable).
    pub streamed: bool,
    /// The operation's scope in the ledger.
    pub scope: Option<String>,
    /// A `Content-Type` header.
    pub content_type: Option<&'static str>,
}

impl Call {
    pub fn new(method: Method, url: impl Into<String>) -> Call {
        Call {
            method,
            url: url.into(),
            body: String::new(),
            key: None,
            policy: None,
            auto_key: true,
            streamed: false,
            scope: None,
            content_type: None,
        }
    }

    pub fn post(url: impl Into<String>) -> Call {
        Call::new(Method::POST, url)
    }

    pub fn get(url: impl Into<String>) -> Call {
        Call::new(Method::GET, url)
    }

    pub fn body(mut self, body: impl Into<String>) -> Call {
        self.body = body.into();
        self
    }

    pub fn key(mut self, key: IdempotencyKey) -> Call {
        self.key = Some(key);
        self
    }

    pub fn policy(mut self, policy: RetryPolicy) -> Call {
        self.policy = Some(policy);
        self
    }

    pub fn without_key(mut self) -> Call {
        self.auto_key = false;
        self
    }

    pub fn streamed(mut self) -> Call {
        self.streamed = true;
        self
    }

    pub fn scope(mut self, scope: impl Into<String>) -> Call {
        self.scope = Some(scope.into());
        self
    }

    /// A JSON body, with its content type.
    pub fn json(mut self, body: impl Into<String>) -> Call {
        self.body = body.into();
        self.content_type = Some("application/json");
        self
    }
}

/// Which front end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Client,
    TowerReqwest,
    /// hyper's `Incoming` body: a ledger cannot rebuild it.
    TowerHyper,
    /// hyper's body boxed (`BoxBody<Bytes, BoxError>`): a ledger saves and rebuilds it.
    TowerHyperBoxed,
    Middleware,
}

impl Kind {
    /// Every front end a ledger works with.
    pub const LEDGERED: [Kind; 4] = [
        Kind::Client,
        Kind::TowerReqwest,
        Kind::TowerHyperBoxed,
        Kind::Middleware,
    ];

    /// The front end of this kind, with these settings.
    pub fn build(self, settings: ClientBuilder) -> Box<dyn FrontEnd> {
        match self {
            Kind::Client => Box::new(ClientFront(settings.build().expect("valid settings"))),
            Kind::TowerReqwest => Box::new(TowerReqwest::new(settings)),
            Kind::TowerHyper => Box::new(TowerHyper::new(settings)),
            Kind::TowerHyperBoxed => Box::new(TowerHyperBoxed::new(settings)),
            Kind::Middleware => Box::new(Middleware::new(settings)),
        }
    }
}

/// A final response, read completely.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
    pub report: RetryReport,
}

/// A front end under test.
pub trait FrontEnd: Send + Sync {
    fn name(&self) -> &'static str;

    /// Whether options can be given for one request: a policy, no automatic key (not through
    /// `reqwest::Request`, which has no public extensions).
    fn takes_request_options(&self) -> bool {
        true
    }

    /// Whether the body can be a stream (not with a body type that is always replayable).
    fn takes_streamed_body(&self) -> bool {
        true
    }

    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, Error>>;

    /// Takes the last response out of an error, as this front end's response type, and returns
    /// its status and body.
    fn take_last<'a>(&'a self, err: &'a mut Error) -> BoxFuture<'a, Option<(u16, String)>>;
}

/// Every front end, each built from a fresh builder made by `settings`.
pub fn front_ends(settings: impl Fn() -> ClientBuilder) -> Vec<Box<dyn FrontEnd>> {
    vec![
        Box::new(ClientFront(settings().build().expect("valid settings"))),
        Box::new(TowerReqwest::new(settings())),
        Box::new(TowerHyper::new(settings())),
        Box::new(Middleware::new(settings())),
    ]
}

/// Same as [`front_ends`] with a custom reqwest client for the reqwest-based front ends (the
/// hyper one is left out: it has its own connector).
pub fn reqwest_front_ends(
    settings: impl Fn() -> ClientBuilder,
    http: reqwest::Client,
) -> Vec<Box<dyn FrontEnd>> {
    vec![
        Box::new(ClientFront(
            settings().http(http.clone()).build().expect("valid"),
        )),
        Box::new(TowerReqwest::with_http(settings(), http.clone())),
        Box::new(Middleware::with_http(settings(), http)),
    ]
}

async fn read_reqwest(response: reqwest::Response) -> Reply {
    let report = RetryReport::of(&response)
        .cloned()
        .expect("every response carries a report");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.expect("body");
    Reply {
        status,
        headers,
        body,
        report,
    }
}

/// The status and body of a response taken out of an error.
async fn read_last(response: reqwest::Response) -> Option<(u16, String)> {
    let status = response.status().as_u16();
    Some((status, response.text().await.expect("body")))
}

/// The call's body: bytes, or the same bytes as a stream of two chunks.
fn reqwest_body(call: &Call) -> reqwest::Body {
    if call.streamed {
        let (head, tail) = call.body.split_at(call.body.len() / 2);
        let chunks = vec![
            Ok::<_, std::io::Error>(Bytes::from(head.to_owned())),
            Ok(Bytes::from(tail.to_owned())),
        ];
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
    } else {
        reqwest::Body::from(call.body.clone())
    }
}

fn reqwest_request(call: &Call) -> reqwest::Request {
    let mut request = reqwest::Request::new(
        call.method.clone(),
        call.url.parse().expect("valid url in test"),
    );
    *request.body_mut() = Some(reqwest_body(call));
    if let Some(content_type) = call.content_type {
        request.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(content_type),
        );
    }
    request
}

// The reqwest front end.

struct ClientFront(Client);

impl FrontEnd for ClientFront {
    fn name(&self) -> &'static str {
        "client"
    }

    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, Error>> {
        Box::pin(async move {
            let body = reqwest_body(&call);
            let mut builder = self.0.request(call.method, call.url).body(body);
            if let Some(content_type) = call.content_type {
                builder = builder.header(http::header::CONTENT_TYPE, content_type);
            }
            if let Some(scope) = call.scope {
                builder = builder.ledger_scope(scope);
            }
            if let Some(key) = call.key {
                builder = builder.idempotency_key(key);
            }
            if let Some(policy) = call.policy {
                builder = builder.policy(policy);
            }
            if !call.auto_key {
                builder = builder.without_idempotency_key();
            }
            Ok(read_reqwest(builder.send().await?).await)
        })
    }

    fn take_last<'a>(&'a self, err: &'a mut Error) -> BoxFuture<'a, Option<(u16, String)>> {
        Box::pin(async move { read_last(err.take_response()?).await })
    }
}

// The tower service over `reqwest::Client`.

struct TowerReqwest(IdempotentRetry<reqwest::Client>);

impl TowerReqwest {
    fn new(settings: ClientBuilder) -> Self {
        Self::with_http(settings, reqwest::Client::new())
    }

    fn with_http(settings: ClientBuilder, http: reqwest::Client) -> Self {
        let layer = settings.build_layer().expect("valid settings");
        TowerReqwest(ServiceBuilder::new().layer(layer).service(http))
    }
}

impl FrontEnd for TowerReqwest {
    fn name(&self) -> &'static str {
        "tower over reqwest"
    }

    fn takes_request_options(&self) -> bool {
        false
    }

    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, Error>> {
        let mut service = self.0.clone();
        Box::pin(async move {
            assert!(
                call.policy.is_none() && call.auto_key && call.scope.is_none(),
                "no per-request options here"
            );
            let mut request = reqwest_request(&call);
            if let Some(key) = &call.key {
                request
                    .headers_mut()
                    .insert(idempotent_retry::IDEMPOTENCY_KEY, key.to_header_value());
            }
            let response = service.ready().await?.call(request).await?;
            Ok(read_reqwest(response).await)
        })
    }

    fn take_last<'a>(&'a self, err: &'a mut Error) -> BoxFuture<'a, Option<(u16, String)>> {
        Box::pin(async move { read_last(err.take_response_as::<reqwest::Response>()?).await })
    }
}

// The tower service over a hyper client: `http::Request<Full<Bytes>>` in, and out either
// hyper's own `http::Response<Incoming>` or that body boxed (`BoxBody<Bytes, BoxError>`), which
// a ledger can save and rebuild.

type Hyper = HyperClient<HttpConnector, Full<Bytes>>;
type HyperResponse = http::Response<hyper::body::Incoming>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Boxed = http::Response<BoxBody<Bytes, BoxError>>;

fn boxed(response: HyperResponse) -> Boxed {
    response.map(|body| body.map_err(BoxError::from).boxed())
}

type BoxedHyper = tower::util::MapResponse<Hyper, fn(HyperResponse) -> Boxed>;

/// The tower service over `S`, a hyper client whose responses have the body `B`.
struct TowerHttp<S> {
    name: &'static str,
    service: IdempotentRetry<S>,
}

type TowerHyper = TowerHttp<Hyper>;
type TowerHyperBoxed = TowerHttp<BoxedHyper>;

impl TowerHyper {
    fn new(settings: ClientBuilder) -> Self {
        let hyper = HyperClient::builder(TokioExecutor::new()).build_http();
        let layer = settings.build_layer().expect("valid settings");
        TowerHttp {
            name: "tower over hyper",
            service: ServiceBuilder::new().layer(layer).service(hyper),
        }
    }
}

impl TowerHyperBoxed {
    fn new(settings: ClientBuilder) -> Self {
        let hyper = HyperClient::builder(TokioExecutor::new()).build_http();
        let layer = settings.build_layer().expect("valid settings");
        let to_boxed: fn(HyperResponse) -> Boxed = boxed;
        TowerHttp {
            name: "tower over hyper, body boxed",
            service: ServiceBuilder::new()
                .layer(layer)
                .map_response(to_boxed)
                .service(hyper),
        }
    }
}

/// An `http` response's whole body, as UTF-8 (hyper's own body or a boxed one).
async fn http_body<B>(response: http::Response<B>) -> String
where
    B: hyper::body::Body,
    B::Error: std::fmt::Debug,
{
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8(body.to_vec()).expect("utf-8 body")
}

/// An `http` response, read completely, with its report.
async fn http_reply<B>(response: http::Response<B>) -> Reply
where
    B: hyper::body::Body,
    B::Error: std::fmt::Debug,
{
    let report = RetryReport::from_extensions(response.extensions())
        .cloned()
        .expect("every response carries a report");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    Reply {
        status,
        headers,
        body: http_body(response).await,
        report,
    }
}

/// The call as an `http::Request<Full<Bytes>>`, its options in the extensions.
fn hyper_request(call: Call) -> http::Request<Full<Bytes>> {
    assert!(!call.streamed, "a Full<Bytes> body cannot be streamed");
    let mut builder = http::Request::builder().method(call.method).uri(call.url);
    if let Some(content_type) = call.content_type {
        builder = builder.header(http::header::CONTENT_TYPE, content_type);
    }
    let mut request = builder
        .body(Full::new(Bytes::from(call.body)))
        .expect("valid request in test");
    if let Some(key) = call.key {
        request.extensions_mut().insert(key);
    }
    if let Some(policy) = call.policy {
        request.extensions_mut().insert(policy);
    }
    if !call.auto_key {
        request.extensions_mut().insert(WithoutIdempotencyKey);
    }
    if let Some(scope) = call.scope {
        request.extensions_mut().insert(LedgerScope::new(scope));
    }
    request
}

impl<S, B> FrontEnd for TowerHttp<S>
where
    S: Service<http::Request<Full<Bytes>>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Debug + Send,
{
    fn name(&self) -> &'static str {
        self.name
    }

    /// `Full<Bytes>` is always replayable; a body type that is not `Clone` cannot reach the
    /// layer at all (`RetryRequest` needs it), so this front end has no streamed case.
    fn takes_streamed_body(&self) -> bool {
        false
    }

    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, Error>> {
        let mut service = self.service.clone();
        Box::pin(async move {
            let request = hyper_request(call);
            Ok(http_reply(service.ready().await?.call(request).await?).await)
        })
    }

    fn take_last<'a>(&'a self, err: &'a mut Error) -> BoxFuture<'a, Option<(u16, String)>> {
        Box::pin(async move {
            // Asking for the wrong type leaves the response in place.
            assert!(err.take_response().is_none());
            let response = err.take_response_as::<http::Response<B>>()?;
            Some((response.status().as_u16(), http_body(response).await))
        })
    }
}

// The `reqwest-middleware` middleware.

struct Middleware(reqwest_middleware::ClientWithMiddleware);

impl Middleware {
    fn new(settings: ClientBuilder) -> Self {
        Self::with_http(settings, reqwest::Client::new())
    }

    fn with_http(settings: ClientBuilder, http: reqwest::Client) -> Self {
        let middleware = settings.build_middleware().expect("valid settings");
        Middleware(
            reqwest_middleware::ClientBuilder::new(http)
                .with(middleware)
                .build(),
        )
    }
}

impl FrontEnd for Middleware {
    fn name(&self) -> &'static str {
        "middleware"
    }

    fn send(&self, call: Call) -> BoxFuture<'_, Result<Reply, Error>> {
        Box::pin(async move {
            let body = reqwest_body(&call);
            let mut builder = self.0.request(call.method, call.url).body(body);
            if let Some(content_type) = call.content_type {
                builder = builder.header(http::header::CONTENT_TYPE, content_type);
            }
            if let Some(scope) = call.scope {
                builder = builder.with_extension(LedgerScope::new(scope));
            }
            if let Some(key) = call.key {
                builder = builder.with_extension(key);
            }
            if let Some(policy) = call.policy {
                builder = builder.with_extension(policy);
            }
            if !call.auto_key {
                builder = builder.with_extension(WithoutIdempotencyKey);
            }
            match builder.send().await {
                Ok(response) => Ok(read_reqwest(response).await),
                Err(reqwest_middleware::Error::Middleware(err)) => {
                    Err(err.downcast::<Error>().expect("the crate's error"))
                }
                Err(other) => panic!("the middleware returns the crate's error, not {other:?}"),
            }
        })
    }

    fn take_last<'a>(&'a self, err: &'a mut Error) -> BoxFuture<'a, Option<(u16, String)>> {
        Box::pin(async move { read_last(err.take_response()?).await })
    }
}
