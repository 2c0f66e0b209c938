//! Redirects: the client follows them itself, and the key goes only where the caller sends it.
//!
//! Two loopback servers on different ports are two origins (and `localhost` is another origin
//! than `127.0.0.1`). Each test asserts which server got which request, with which method,
//! body and headers, and what the caller got back.
//!
//! A separate binary with one global `tracing` subscriber, as in `observability.rs`: the
//! warning about an inner client that redirects on its own is asserted from the log, each
//! test finding its lines by its own key.

mod support;

use std::future::Future;
use std::time::Duration;

use futures_util::stream;
use http::{Method, StatusCode};
use idempotent_retry::redirect::{RedirectChain, RedirectStop};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{
    Client, ErrorKind, FailureKind, IdempotencyKey, RedirectPolicy, RetryReport,
};
use support::*;

/// Every test's bound: a bug that hangs fails here instead.
const BOUND: Duration = Duration::from_secs(30);

async fn bounded<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(BOUND, test)
        .await
        .expect("the test finished within its bound")
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::new(name).expect("valid test key")
}

/// A client with the crate's own inner client (which follows no redirect by itself).
fn client(redirects: RedirectPolicy) -> Client {
    capture_log();
    Client::builder()
        .policy(fast())
        .redirects(redirects)
        .build()
        .expect("valid client")
}

/// `scheme://host:port` of a test server.
fn origin(server: &TestServer) -> String {
    format!("http://{}", server.addr())
}

/// A reqwest client built by the caller: following redirects itself (reqwest's default), or
/// with `Policy::none()`.
fn caller_reqwest(follows_redirects: bool) -> reqwest::Client {
    let builder = reqwest::Client::builder().no_proxy();
    let builder = if follows_redirects {
        builder
    } else {
        builder.redirect(reqwest::redirect::Policy::none())
    };
    builder.build().expect("valid reqwest client")
}

/// The warning that an inner client followed a redirect itself, logged with `key`.
fn inner_redirect_warning(key: &str) -> String {
    let lines = log_lines_with(key);
    lines
        .iter()
        .find(|l| l.contains("WARN") && l.contains("followed a redirect itself"))
        .cloned()
        .unwrap_or_else(|| panic!("a warning with the key: {lines:#?}"))
}

/// Whether nothing logged with `key` says an inner client followed a redirect.
fn no_inner_redirect_warning(key: &str) -> bool {
    log_lines_with(key)
        .iter()
        .all(|l| !l.contains("followed a redirect itself"))
}

fn redirect(status: u16, location: &str) -> Action {
    Action::status_with(status, &[("Location", location)])
}

fn chain(response: &reqwest::Response) -> RedirectChain {
    RedirectChain::of(response).clone()
}

fn report(response: &reqwest::Response) -> RetryReport {
    RetryReport::of(response)
        .expect("every response carries its report")
        .clone()
}

const BODY: &str = r#"{"amount":1200}"#;

#[tokio::test]
async fn a_307_on_the_same_origin_resends_method_body_and_key() {
    bounded(async {
        let a = TestServer::start(vec![redirect(307, "/v1/moved")], Action::ok("done")).await;
        let response = client(RedirectPolicy::default())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_307_same"))
            .bearer_auth("secret-token")
            .header("Content-Type", "application/json")
            .body(BODY)
            .send()
            .await
            .expect("followed to the final answer");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), a.url("/v1/moved"));

        let requests = a.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].method, "POST");
        assert_eq!(requests[1].path, "/v1/moved");
        assert_eq!(requests[1].body_str(), BODY);
        assert_eq!(requests[1].header("content-type"), Some("application/json"));
        assert_eq!(a.keys(), vec![Some("k_307_same".into()); 2]);
        // Same origin: credentials stay.
        assert_eq!(
            requests[1].header("authorization"),
            Some("Bearer secret-token")
        );

        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 1);
        let hop = &chain.hops()[0];
        assert_eq!(hop.status, StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(hop.method, Method::POST);
        assert!(hop.key_sent);
        assert_eq!(hop.from.as_str(), a.url("/v1/charges"));
        assert_eq!(hop.to.as_str(), a.url("/v1/moved"));
        assert_eq!(chain.stopped(), None);
        assert!(!chain.inner_client_redirected());
        // One attempt: the hop is part of it.
        let report = report(&response);
        assert_eq!(report.attempts(), 1);
        assert_eq!(report.idempotency_key(), Some(&key("k_307_same")));
    })
    .await;
}

#[tokio::test]
async fn a_308_to_another_origin_is_returned_to_the_caller_without_permission() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(308, &b.url("/v1/charges"))).await;
        let response = client(RedirectPolicy::default())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_308_denied"))
            .body(BODY)
            .send()
            .await
            .expect("the 308 is a final answer");
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.url().as_str(), a.url("/v1/charges"));
        assert_eq!(
            response.headers()["location"].to_str().expect("ascii"),
            b.url("/v1/charges")
        );
        let chain = chain(&response);
        assert!(chain.hops().is_empty());
        assert_eq!(chain.stopped(), Some(RedirectStop::KeyToOtherOrigin));
        let report = report(&response);
        assert_eq!(report.attempts(), 1, "a 3xx is final: not retried");
        assert_eq!(report.idempotency_key(), Some(&key("k_308_denied")));

        assert_eq!(a.hits(), 1);
        assert_eq!(b.hits(), 0, "the other origin saw nothing");
    })
    .await;
}

#[tokio::test]
async fn client_new_never_carries_the_key_to_another_origin_on_a_307() {
    bounded(async {
        capture_log();
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/v1/charges"))).await;
        // `Client::new()`, not the builder: the defaults alone keep the key at home.
        let response = Client::new()
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_new_307"))
            .bearer_auth("secret-token")
            .body(BODY)
            .send()
            .await
            .expect("the 307 is a final answer");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(response.url().as_str(), a.url("/v1/charges"));
        assert_eq!(
            response.headers()["location"].to_str().expect("ascii"),
            b.url("/v1/charges")
        );
        let chain = chain(&response);
        assert!(chain.hops().is_empty());
        assert_eq!(chain.stopped(), Some(RedirectStop::KeyToOtherOrigin));
        assert!(!chain.inner_client_redirected());
        assert_eq!(report(&response).attempts(), 1);
        assert!(no_inner_redirect_warning("k_new_307"));

        assert_eq!(a.keys(), vec![Some("k_new_307".into())]);
        assert!(
            b.requests().is_empty(),
            "the other origin got nothing: no key, no body"
        );
    })
    .await;
}

#[tokio::test]
async fn a_308_to_an_allowed_origin_carries_the_key_but_not_the_credentials() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(308, &b.url("/v2/charges"))).await;
        let policy = RedirectPolicy::default().allow_key_to(&origin(&b));
        let response = client(policy)
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_308_allowed"))
            .bearer_auth("secret-token")
            .header("Cookie", "session=1")
            .header("Content-Type", "application/json")
            .body(BODY)
            .send()
            .await
            .expect("followed to the allowed origin");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), b.url("/v2/charges"));

        let first = &a.requests()[0];
        assert_eq!(first.header("authorization"), Some("Bearer secret-token"));
        assert_eq!(first.header("cookie"), Some("session=1"));
        let requests = b.requests();
        assert_eq!(requests.len(), 1);
        let moved = &requests[0];
        assert_eq!(moved.method, "POST");
        assert_eq!(moved.body_str(), BODY);
        assert_eq!(moved.header("content-type"), Some("application/json"));
        assert_eq!(moved.header("idempotency-key"), Some("k_308_allowed"));
        assert_eq!(moved.header("authorization"), None);
        assert_eq!(moved.header("cookie"), None);
        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 1);
        assert!(chain.hops()[0].key_sent);
    })
    .await;
}

#[tokio::test]
async fn any_origin_may_be_allowed() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/x"))).await;
        let response = client(RedirectPolicy::default().allow_key_to_any_origin())
            .post(a.url("/x"))
            .idempotency_key(key("k_any_origin"))
            .body(BODY)
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(b.keys(), vec![Some("k_any_origin".into())]);
    })
    .await;
}

#[tokio::test]
async fn localhost_and_127_0_0_1_are_different_origins() {
    bounded(async {
        // `a` listens on 127.0.0.1; the redirect names the same port as `localhost`.
        let a = TestServer::start(vec![], redirect(307, "/unused")).await;
        let renamed = format!("http://localhost:{}/x", a.addr().port());
        let redirector = TestServer::start(vec![], redirect(307, &renamed)).await;
        let policy = RedirectPolicy::default().allow_key_to(&origin(&a));
        let response = client(policy)
            .post(redirector.url("/x"))
            .idempotency_key(key("k_localhost"))
            .body(BODY)
            .send()
            .await
            .expect("the 307 is a final answer");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(
            chain(&response).stopped(),
            Some(RedirectStop::KeyToOtherOrigin)
        );
        assert_eq!(redirector.hits(), 1);
        assert_eq!(a.hits(), 0, "allowing 127.0.0.1 does not allow localhost");
    })
    .await;
}

#[tokio::test]
async fn a_303_after_a_post_is_a_get_without_key_body_or_payload_headers() {
    bounded(async {
        let a =
            TestServer::start(vec![redirect(303, "/v1/charges/ch_1")], Action::ok("ch_1")).await;
        let response = client(RedirectPolicy::default())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_303"))
            .header("Content-Type", "application/json")
            .header("Content-Encoding", "identity")
            .body(BODY)
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), a.url("/v1/charges/ch_1"));

        let requests = a.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].header("idempotency-key"), Some("k_303"));
        let get = &requests[1];
        assert_eq!(get.method, "GET");
        assert_eq!(get.path, "/v1/charges/ch_1");
        assert!(get.body.is_empty());
        for header in [
            "idempotency-key",
            "content-type",
            "content-length",
            "content-encoding",
            "transfer-encoding",
        ] {
            assert_eq!(get.header(header), None, "{header} on the 303's GET");
        }
        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 1);
        assert_eq!(chain.hops()[0].method, Method::GET);
        assert!(!chain.hops()[0].key_sent);
        // The operation still reports its key.
        assert_eq!(report(&response).idempotency_key(), Some(&key("k_303")));
    })
    .await;
}

#[tokio::test]
async fn a_301_or_302_turns_a_post_into_a_keyless_get_even_across_origins() {
    bounded(async {
        for status in [301, 302] {
            let b = TestServer::start(vec![], Action::ok("result")).await;
            let a = TestServer::start(vec![], redirect(status, &b.url("/result"))).await;
            let name = format!("k_{status}_post");
            let response = client(RedirectPolicy::default())
                .post(a.url("/v1/emails"))
                .idempotency_key(key(&name))
                .bearer_auth("secret-token")
                .json(&serde_json::json!({"to": "ada@example.com"}))
                .send()
                .await
                .expect("followed");
            assert_eq!(response.status(), StatusCode::OK, "{status}");
            assert_eq!(a.keys(), vec![Some(name.clone())], "{status}");
            let requests = b.requests();
            assert_eq!(requests.len(), 1, "{status}");
            let get = &requests[0];
            assert_eq!(get.method, "GET", "{status}");
            assert!(get.body.is_empty(), "{status}");
            assert_eq!(get.header("idempotency-key"), None, "{status}");
            assert_eq!(get.header("content-type"), None, "{status}");
            assert_eq!(get.header("authorization"), None, "{status}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_301_on_a_put_resends_it_with_its_key() {
    bounded(async {
        let a = TestServer::start(vec![redirect(301, "/v2/doc")], Action::ok("stored")).await;
        let response = client(RedirectPolicy::default())
            .put(a.url("/v1/doc"))
            .idempotency_key(key("k_301_put"))
            .body("document")
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        let requests = a.requests();
        assert_eq!(requests[1].method, "PUT");
        assert_eq!(requests[1].body_str(), "document");
        assert_eq!(a.keys(), vec![Some("k_301_put".into()); 2]);
    })
    .await;
}

#[tokio::test]
async fn a_redirect_loop_ends_with_too_many_redirects_and_is_not_retried() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/loop")).await;
        let err = client(RedirectPolicy::default())
            .post(a.url("/start"))
            .idempotency_key(key("k_loop"))
            .body(BODY)
            .send()
            .await
            .expect_err("a loop never ends in a response");
        assert_eq!(err.kind(), ErrorKind::TooManyRedirects);
        assert_eq!(err.failure(), Some(FailureKind::TooManyRedirects));
        assert!(err.is_outcome_unknown());
        assert_eq!(err.attempts(), 1);
        assert_eq!(err.idempotency_key(), Some(&key("k_loop")));
        assert!(err.to_string().contains("too many redirects"), "{err}");
        // The first request and 10 hops; the 11th redirect is the error.
        assert_eq!(a.hits(), 11);
        assert_eq!(a.keys(), vec![Some("k_loop".into()); 11]);

        let b = TestServer::start(vec![], redirect(302, "/loop")).await;
        let err = client(RedirectPolicy::limited(2))
            .get(b.url("/start"))
            .send()
            .await
            .expect_err("a loop never ends in a response");
        assert_eq!(err.kind(), ErrorKind::TooManyRedirects);
        assert_eq!(b.hits(), 3);
    })
    .await;
}

#[tokio::test]
async fn a_307_then_a_503_is_retried_from_the_original_url_with_the_same_key() {
    bounded(async {
        let b = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/target"))).await;
        let client = Client::builder()
            .policy(fast())
            .redirects(RedirectPolicy::default().allow_key_to(&origin(&b)))
            .attempt_header(http::HeaderName::from_static("x-attempt"))
            .build()
            .expect("valid client");
        let response = client
            .post(a.url("/origin"))
            .idempotency_key(key("k_307_503"))
            .body(BODY)
            .send()
            .await
            .expect("the retry succeeded");
        assert_eq!(response.status(), StatusCode::OK);
        // Each attempt started at the original URL.
        assert_eq!(a.hits(), 2);
        assert!(a.requests().iter().all(|r| r.path == "/origin"));
        assert_eq!(b.hits(), 2);
        assert_eq!(a.keys(), vec![Some("k_307_503".into()); 2]);
        assert_eq!(b.keys(), vec![Some("k_307_503".into()); 2]);
        assert!(b.requests().iter().all(|r| r.body_str() == BODY));
        // A hop belongs to its attempt: it carries that attempt's number.
        assert_eq!(
            a.keys_in("x-attempt"),
            vec![Some("1".into()), Some("2".into())]
        );
        assert_eq!(
            b.keys_in("x-attempt"),
            vec![Some("1".into()), Some("2".into())]
        );
        let report = report(&response);
        assert_eq!(report.attempts(), 2);
        assert_eq!(report.history()[0].failure, Some(FailureKind::ServerError));
        assert_eq!(chain(&response).hops().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_redirect_target_is_retried_and_its_outcome_is_unknown() {
    bounded(async {
        let nowhere = refused_addr();
        let a = TestServer::start(vec![], redirect(307, &format!("http://{nowhere}/x"))).await;
        let err = client(RedirectPolicy::default().allow_key_to_any_origin())
            .post(a.url("/x"))
            .idempotency_key(key("k_unreachable"))
            .policy(fast().with_max_attempts(2))
            .body(BODY)
            .send()
            .await
            .expect_err("the target never answers");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
        assert_eq!(err.failure(), Some(FailureKind::RedirectTargetUnreachable));
        // The request reached `a`, which may have run it: not a "never sent" connect error.
        assert!(err.is_outcome_unknown());
        assert_eq!(a.hits(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_streamed_body_stops_at_a_307_and_the_caller_gets_it() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/again")).await;
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("stre"), Ok("amed")];
        let response = client(RedirectPolicy::default())
            .post(a.url("/upload"))
            .idempotency_key(key("k_stream"))
            .body(reqwest::Body::wrap_stream(stream::iter(chunks)))
            .send()
            .await
            .expect("the 307 is a final answer");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(
            chain(&response).stopped(),
            Some(RedirectStop::BodyNotReplayable)
        );
        assert_eq!(a.hits(), 1);
        assert_eq!(a.requests()[0].body_str(), "streamed");
    })
    .await;
}

#[tokio::test]
async fn a_streamed_body_still_follows_a_303_as_a_get() {
    bounded(async {
        let a = TestServer::start(vec![redirect(303, "/result")], Action::ok("result")).await;
        let chunks: Vec<Result<&'static str, std::io::Error>> = vec![Ok("stre"), Ok("amed")];
        let response = client(RedirectPolicy::default())
            .post(a.url("/upload"))
            .idempotency_key(key("k_stream_303"))
            .body(reqwest::Body::wrap_stream(stream::iter(chunks)))
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        let requests = a.requests();
        assert_eq!(requests[1].method, "GET");
        assert!(requests[1].body.is_empty());
        assert_eq!(requests[1].header("idempotency-key"), None);
    })
    .await;
}

#[tokio::test]
async fn redirects_without_a_usable_location_are_final() {
    bounded(async {
        let cases = [
            (Action::status(307), RedirectStop::MissingLocation),
            (
                redirect(307, "ftp://127.0.0.1/x"),
                RedirectStop::UnsupportedScheme,
            ),
            (redirect(302, "http://[::1"), RedirectStop::InvalidLocation),
            (
                redirect(303, "javascript:alert(1)"),
                RedirectStop::UnsupportedScheme,
            ),
        ];
        for (action, why) in cases {
            let a = TestServer::start(vec![], action).await;
            let response = client(RedirectPolicy::default())
                .post(a.url("/x"))
                .idempotency_key(key("k_bad_location"))
                .body(BODY)
                .send()
                .await
                .expect("the 3xx is a final answer");
            assert!(response.status().is_redirection(), "{why:?}");
            assert_eq!(chain(&response).stopped(), Some(why));
            assert_eq!(a.hits(), 1, "{why:?}");
        }
    })
    .await;
}

#[tokio::test]
async fn redirect_policy_none_returns_every_3xx() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/next")).await;
        let response = client(RedirectPolicy::none())
            .post(a.url("/x"))
            .idempotency_key(key("k_none"))
            .body(BODY)
            .send()
            .await
            .expect("the 3xx is a final answer");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(chain(&response).stopped(), Some(RedirectStop::Disabled));
        assert_eq!(a.hits(), 1);
        // A 3xx that is not a redirect to follow has no reason to stop.
        let b = TestServer::start(vec![], Action::status(304)).await;
        let response = client(RedirectPolicy::default())
            .get(b.url("/cached"))
            .send()
            .await
            .expect("final");
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(chain(&response).stopped(), None);
    })
    .await;
}

#[tokio::test]
async fn a_request_without_a_key_follows_across_origins_without_credentials() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("moved")).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/doc"))).await;
        let response = client(RedirectPolicy::default())
            .get(a.url("/doc"))
            .bearer_auth("secret-token")
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        let requests = b.requests();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].header("authorization"), None);
        assert_eq!(requests[0].header("idempotency-key"), None);
    })
    .await;
}

#[tokio::test]
async fn all_hops_share_the_attempt_timeout() {
    bounded(async {
        // Each hop alone fits in the 600 ms attempt timeout; both together cannot.
        let a = TestServer::start(
            vec![
                Action::stall_then(ms(400), redirect(307, "/slow")),
                Action::stall_then(ms(400), Action::ok("too late")),
            ],
            Action::ok("unused"),
        )
        .await;
        let err = client(RedirectPolicy::default())
            .post(a.url("/x"))
            .idempotency_key(key("k_hops_timeout"))
            .policy(fast().with_max_attempts(1).with_attempt_timeout(ms(600)))
            .body(BODY)
            .send()
            .await
            .expect_err("the attempt ran out of time");
        assert!(err.is_timeout(), "{err:?}");
        assert!(err.is_outcome_unknown());
        assert_eq!(err.idempotency_key(), Some(&key("k_hops_timeout")));
    })
    .await;
}

#[tokio::test]
async fn a_caller_client_that_redirects_itself_is_detected_and_logged() {
    bounded(async {
        capture_log();
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/v1/secret-path?token=abc"))).await;
        // reqwest's default policy follows redirects before this crate sees them.
        let own = caller_reqwest(true);
        let client = Client::builder()
            .policy(fast())
            .http(own)
            .build()
            .expect("valid client");
        let response = client
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_inner_redirect"))
            .body(BODY)
            .send()
            .await
            .expect("the inner client followed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), b.url("/v1/secret-path?token=abc"));
        let chain = chain(&response);
        assert!(chain.inner_client_redirected());
        assert!(chain.hops().is_empty(), "the crate followed nothing itself");
        // What the detection is for: the key did reach the other origin.
        assert_eq!(b.keys(), vec![Some("k_inner_redirect".into())]);

        let warning = inner_redirect_warning("k_inner_redirect");
        assert!(warning.contains(&origin(&a)), "{warning}");
        assert!(warning.contains(&origin(&b)), "{warning}");
        assert!(!warning.contains("secret-path"), "only origins: {warning}");
        assert!(!warning.contains("token=abc"), "only origins: {warning}");
    })
    .await;
}

#[cfg(feature = "middleware")]
#[tokio::test]
async fn the_middleware_detects_a_client_that_redirects_itself() {
    use idempotent_retry::IdempotentRetryMiddleware;

    bounded(async {
        capture_log();
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(308, &b.url("/other"))).await;
        let inner = caller_reqwest(true);
        let client = reqwest_middleware::ClientBuilder::new(inner)
            .with(IdempotentRetryMiddleware::new())
            .build();
        let response = client
            .post(a.url("/x"))
            .header("Idempotency-Key", "k_middleware_redirect")
            .body(BODY)
            .send()
            .await
            .expect("the inner client followed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(b.keys(), vec![Some("k_middleware_redirect".into())]);
        let warning = inner_redirect_warning("k_middleware_redirect");
        assert!(warning.contains(&origin(&b)), "{warning}");

        // Built with `Policy::none()`, the client hands the 308 back and nothing is logged.
        let strict = caller_reqwest(false);
        let client = reqwest_middleware::ClientBuilder::new(strict)
            .with(IdempotentRetryMiddleware::new())
            .build();
        let response = client
            .post(a.url("/x"))
            .header("Idempotency-Key", "k_middleware_strict")
            .body(BODY)
            .send()
            .await
            .expect("the 308 is final");
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(b.hits(), 1);
        assert!(no_inner_redirect_warning("k_middleware_strict"));
    })
    .await;
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn the_tower_layer_over_reqwest_detects_a_client_that_redirects_itself() {
    use idempotent_retry::IdempotentRetryLayer;
    use tower::{Layer, ServiceExt};

    bounded(async {
        capture_log();
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], redirect(308, &b.url("/other"))).await;
        let post = |key: &str| {
            let mut request =
                reqwest::Request::new(Method::POST, a.url("/x").parse().expect("url"));
            request.headers_mut().insert(
                "Idempotency-Key",
                http::HeaderValue::from_str(key).expect("valid"),
            );
            *request.body_mut() = Some(reqwest::Body::from(BODY));
            request
        };
        let follows = caller_reqwest(true);
        let response = IdempotentRetryLayer::new()
            .layer(follows)
            .oneshot(post("k_tower_redirect"))
            .await
            .expect("the inner client followed");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(b.keys(), vec![Some("k_tower_redirect".into())]);
        let warning = inner_redirect_warning("k_tower_redirect");
        assert!(warning.contains(&origin(&b)), "{warning}");

        let strict = caller_reqwest(false);
        let response = IdempotentRetryLayer::new()
            .layer(strict)
            .oneshot(post("k_tower_strict"))
            .await
            .expect("the 308 is final");
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(b.hits(), 1);
        assert!(no_inner_redirect_warning("k_tower_strict"));
    })
    .await;
}

#[tokio::test]
async fn an_invalid_allowed_origin_fails_the_build() {
    let err = Client::builder()
        .redirects(RedirectPolicy::default().allow_key_to("api.example.com"))
        .build()
        .expect_err("not an origin");
    assert_eq!(err.kind(), ErrorKind::Builder);
    assert!(err.to_string().contains("api.example.com"), "{err}");
}

/// tower-http's `FollowRedirect` around and inside the tower layer: what happens to the key in
/// each order (the crate's docs state these results).
#[cfg(feature = "tower")]
mod follow_redirect_with_the_tower_layer {
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::{ServiceBuilder, ServiceExt};
    use tower_http::follow_redirect::FollowRedirectLayer;
    use tower_http::follow_redirect::policy::{
        And, CloneBodyFn, Limited, PolicyExt, clone_body_fn,
    };

    use super::*;

    type Body = Full<Bytes>;

    fn hyper()
    -> hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Body>
    {
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<Body>()
    }

    type Followed = And<Limited, CloneBodyFn<fn(&Body) -> Option<Body>>>;

    fn clone_body(body: &Body) -> Option<Body> {
        Some(body.clone())
    }

    /// tower-http's standard limit, plus a body clone so a 307 can resend the `POST`.
    fn follow_redirects() -> FollowRedirectLayer<Followed> {
        let clone: fn(&Body) -> Option<Body> = clone_body;
        FollowRedirectLayer::with_policy(
            Limited::default().and::<_, Body, ()>(clone_body_fn(clone)),
        )
    }

    fn post(url: String) -> http::Request<Body> {
        http::Request::post(url)
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .expect("valid request")
    }

    #[tokio::test]
    async fn inside_the_layer_the_key_rides_along_to_another_origin() {
        bounded(async {
            let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
            let a = TestServer::start(vec![], redirect(307, &b.url("/x"))).await;
            let layer = Client::builder()
                .policy(fast())
                .build_layer()
                .expect("valid layer");
            let service = ServiceBuilder::new()
                .layer(layer)
                .layer(follow_redirects())
                .service(hyper());
            let response = service.oneshot(post(a.url("/x"))).await.expect("followed");
            assert_eq!(response.status(), StatusCode::OK);
            let minted = a.keys()[0].clone().expect("an automatic key");
            // The crate's rules do not apply below the layer: the key went cross-origin.
            assert_eq!(b.keys(), vec![Some(minted)]);
        })
        .await;
    }

    #[tokio::test]
    async fn outside_the_layer_each_hop_is_an_operation_with_a_fresh_automatic_key() {
        bounded(async {
            let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
            let a = TestServer::start(vec![], redirect(307, &b.url("/x"))).await;
            let layer = Client::builder()
                .policy(fast())
                .build_layer()
                .expect("valid layer");
            let service = ServiceBuilder::new()
                .layer(follow_redirects())
                .layer(layer)
                .service(hyper());
            let response = service
                .clone()
                .oneshot(post(a.url("/x")))
                .await
                .expect("followed");
            assert_eq!(response.status(), StatusCode::OK);
            let first = a.keys()[0].clone().expect("an automatic key");
            let second = b.keys()[0].clone().expect("another automatic key");
            assert_ne!(first, second, "one logical request, two keys");

            // A key set in the header is copied to every hop, other origins included.
            let mut request = post(a.url("/x"));
            request.headers_mut().insert(
                "idempotency-key",
                http::HeaderValue::from_static("k_tower_outside"),
            );
            service.oneshot(request).await.expect("followed");
            assert_eq!(a.keys()[1].as_deref(), Some("k_tower_outside"));
            assert_eq!(b.keys()[1].as_deref(), Some("k_tower_outside"));
        })
        .await;
    }
}

#[tokio::test]
async fn a_response_that_was_not_redirected_is_never_reported_as_one() {
    bounded(async {
        capture_log();
        let a = TestServer::start(vec![], Action::ok("here")).await;
        let own = caller_reqwest(true);
        let caller_built = Client::builder()
            .policy(fast())
            .http(own)
            .build()
            .expect("valid client");
        let base = format!("http://{}", a.addr());
        let targets = [
            base.clone(),
            format!("{base}/x?q=1&r=%20s#fragment"),
            format!("{base}/caf%C3%A9/../x"),
            format!("http://user:pw@{}/x", a.addr()),
        ];
        for (n, target) in targets.iter().enumerate() {
            for client in [client(RedirectPolicy::default()), caller_built.clone()] {
                let name = format!("k_not_redirected_{n}");
                let response = client
                    .post(target.as_str())
                    .idempotency_key(key(&name))
                    .body(BODY)
                    .send()
                    .await
                    .expect("answered");
                assert_eq!(response.status(), StatusCode::OK, "{target}");
                let chain = chain(&response);
                assert!(!chain.inner_client_redirected(), "{target}");
                assert!(chain.hops().is_empty(), "{target}");
                assert!(no_inner_redirect_warning(&name), "{target}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_307_after_a_303_stays_a_keyless_get_built_from_the_previous_hop() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("result")).await;
        let a = TestServer::start(
            vec![
                redirect(303, "/v1/charges/ch_1"),
                redirect(307, &b.url("/v1/charges/ch_1")),
            ],
            Action::ok("unused"),
        )
        .await;
        let response = client(RedirectPolicy::default())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_303_then_307"))
            .bearer_auth("secret-token")
            .header("Content-Type", "application/json")
            .body(BODY)
            .send()
            .await
            .expect("followed to the result");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), b.url("/v1/charges/ch_1"));

        let requests = a.requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].method, "GET");
        assert_eq!(requests[1].header("idempotency-key"), None);
        // The 307 resends the GET the 303 asked for, not the original POST: still no key, no
        // body, and (another origin) no credentials.
        let requests = b.requests();
        assert_eq!(requests.len(), 1);
        let get = &requests[0];
        assert_eq!(get.method, "GET");
        assert!(get.body.is_empty());
        for header in ["idempotency-key", "content-type", "authorization"] {
            assert_eq!(
                get.header(header),
                None,
                "{header} after the 303 and the 307"
            );
        }
        let chain = chain(&response);
        let hops: Vec<_> = chain
            .hops()
            .iter()
            .map(|hop| (hop.status.as_u16(), hop.method.clone(), hop.key_sent))
            .collect();
        assert_eq!(
            hops,
            vec![(303, Method::GET, false), (307, Method::GET, false)]
        );
        assert_eq!(chain.hops()[1].from.as_str(), a.url("/v1/charges/ch_1"));
        assert_eq!(chain.stopped(), None);
        assert!(!chain.inner_client_redirected());
    })
    .await;
}

#[tokio::test]
async fn the_key_may_return_to_the_original_origin_but_the_credentials_stay_dropped() {
    bounded(async {
        let a = TestServer::start(vec![], Action::ok("home")).await;
        let b = TestServer::start(vec![], redirect(307, &a.url("/v1/home"))).await;
        // The first answer names `b`, which had to exist first.
        a.push_script(redirect(307, &b.url("/v1/hop")));
        let response = client(RedirectPolicy::default().allow_key_to(&origin(&b)))
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_round_trip"))
            .bearer_auth("secret-token")
            .body(BODY)
            .send()
            .await
            .expect("followed back home");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), a.url("/v1/home"));
        // The key may go back to the original request's origin: it is checked against where
        // the operation was sent, not against the hop that redirected last.
        assert_eq!(a.keys(), vec![Some("k_round_trip".into()); 2]);
        assert_eq!(b.keys(), vec![Some("k_round_trip".into())]);
        let requests = a.requests();
        assert_eq!(requests[1].method, "POST");
        assert_eq!(requests[1].path, "/v1/home");
        assert_eq!(requests[1].body_str(), BODY);
        // Dropped when the chain left `a`, and not put back on the way home.
        assert_eq!(
            requests[0].header("authorization"),
            Some("Bearer secret-token")
        );
        assert_eq!(b.requests()[0].header("authorization"), None);
        assert_eq!(requests[1].header("authorization"), None);
        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 2);
        assert!(chain.hops().iter().all(|hop| hop.key_sent));
    })
    .await;
}

#[tokio::test]
async fn a_later_hop_to_an_origin_not_allowed_stops_there() {
    bounded(async {
        let c = TestServer::start(vec![], Action::ok("not allowed")).await;
        let b = TestServer::start(vec![], redirect(308, &c.url("/v1/charges"))).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/v1/charges"))).await;
        let response = client(RedirectPolicy::default().allow_key_to(&origin(&b)))
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_second_hop_denied"))
            .body(BODY)
            .send()
            .await
            .expect("the 308 is a final answer");
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.url().as_str(), b.url("/v1/charges"));
        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 1);
        assert_eq!(chain.stopped(), Some(RedirectStop::KeyToOtherOrigin));
        assert_eq!(report(&response).attempts(), 1);
        assert_eq!((a.hits(), b.hits(), c.hits()), (1, 1, 0));
    })
    .await;
}

#[tokio::test]
async fn a_redirect_target_that_times_out_is_a_timeout() {
    bounded(async {
        let b = TestServer::start(vec![], Action::hang()).await;
        let a = TestServer::start(vec![], redirect(307, &b.url("/slow"))).await;
        let err = client(RedirectPolicy::default().allow_key_to(&origin(&b)))
            .post(a.url("/x"))
            .idempotency_key(key("k_target_timeout"))
            .policy(fast().with_max_attempts(1).with_attempt_timeout(ms(2000)))
            .body(BODY)
            .send()
            .await
            .expect_err("the target never answers");
        // Only a target that could not be reached at all is `RedirectTargetUnreachable`.
        assert_eq!(err.failure(), Some(FailureKind::Timeout), "{err:?}");
        assert!(err.is_outcome_unknown());
        assert_eq!(err.idempotency_key(), Some(&key("k_target_timeout")));
        assert_eq!((a.hits(), b.hits()), (1, 1));
    })
    .await;
}

#[tokio::test]
async fn a_refused_connection_without_a_redirect_is_never_sent() {
    bounded(async {
        let err = client(RedirectPolicy::default())
            .post(format!("http://{}/x", refused_addr()))
            .idempotency_key(key("k_refused_direct"))
            .policy(fast().with_max_attempts(1))
            .body(BODY)
            .send()
            .await
            .expect_err("nothing listens");
        // No hop reached any server: the operation provably did not run.
        assert_eq!(err.failure(), Some(FailureKind::Connect), "{err:?}");
        assert!(!err.is_outcome_unknown());
    })
    .await;
}

#[tokio::test]
async fn a_limit_of_zero_makes_every_followed_redirect_an_error() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/next")).await;
        let err = client(RedirectPolicy::limited(0))
            .post(a.url("/x"))
            .idempotency_key(key("k_limit_zero"))
            .body(BODY)
            .send()
            .await
            .expect_err("no hop is allowed");
        assert_eq!(err.kind(), ErrorKind::TooManyRedirects);
        assert_eq!(a.hits(), 1);
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("more than 0 redirects in one attempt")
        );
        // A redirect that would not be followed anyway is still the final response.
        let b = TestServer::start(vec![], Action::status(307)).await;
        let response = client(RedirectPolicy::limited(0))
            .post(b.url("/x"))
            .idempotency_key(key("k_limit_zero_final"))
            .body(BODY)
            .send()
            .await
            .expect("the 3xx is a final answer");
        assert_eq!(
            chain(&response).stopped(),
            Some(RedirectStop::MissingLocation)
        );
    })
    .await;
}

/// A clock that moves `step` forward each time it is read: time spent between hops without
/// waiting on the real clock.
#[derive(Debug)]
struct SteppingClock {
    start: tokio::time::Instant,
    step: Duration,
    reads: std::sync::atomic::AtomicU32,
}

impl Clock for SteppingClock {
    fn now(&self) -> tokio::time::Instant {
        let reads = self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.start + self.step * reads
    }
    fn wall(&self) -> std::time::SystemTime {
        TokioClock::new().wall()
    }
}

#[tokio::test]
async fn a_hop_is_not_sent_once_the_attempt_time_is_spent() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/next")).await;
        // Each read of the clock is 3 s later: the first hop starts with 2 s of the 5 s
        // attempt left, the second would start with none.
        let client = Client::builder()
            .policy(fast().with_max_attempts(1))
            .clock(SteppingClock {
                start: TokioClock::new().now(),
                step: Duration::from_secs(3),
                reads: std::sync::atomic::AtomicU32::new(0),
            })
            .build()
            .expect("valid client");
        let err = client
            .post(a.url("/x"))
            .idempotency_key(key("k_hop_budget"))
            .body(BODY)
            .send()
            .await
            .expect_err("the attempt's time ran out between hops");
        assert_eq!(err.failure(), Some(FailureKind::Timeout), "{err:?}");
        assert!(err.is_outcome_unknown());
        assert_eq!(err.idempotency_key(), Some(&key("k_hop_budget")));
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("the attempt timed out while following redirects")
        );
        assert_eq!(a.hits(), 1, "the second hop was never sent");
    })
    .await;
}

#[tokio::test]
async fn redirect_logs_carry_the_key_and_origins_but_no_path_body_or_credentials() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(
            vec![redirect(307, &b.url("/v1/secret-path?token=abc"))],
            Action::ok("unused"),
        )
        .await;
        let response = client(RedirectPolicy::default().allow_key_to(&origin(&b)))
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_log_follow"))
            .bearer_auth("secret-token")
            .body(BODY)
            .send()
            .await
            .expect("followed");
        assert_eq!(response.status(), StatusCode::OK);
        let lines = log_lines_with("k_log_follow");
        let expected = format!(
            "following a redirect key=\"k_log_follow\" status=307 from={} to={} method=POST \
             key_sent=true",
            origin(&a),
            origin(&b)
        );
        assert_eq!(
            lines.iter().filter(|l| l.contains(&expected)).count(),
            1,
            "{expected} in {lines:#?}"
        );
        for secret in ["secret-path", "token=abc", "secret-token", "amount"] {
            assert!(lines.iter().all(|l| !l.contains(secret)), "{secret}");
        }

        // A redirect left unfollowed says why.
        let denied = TestServer::start(vec![], redirect(308, "http://127.0.0.2:9/x")).await;
        client(RedirectPolicy::default())
            .post(denied.url("/x"))
            .idempotency_key(key("k_log_denied"))
            .body(BODY)
            .send()
            .await
            .expect("the 308 is a final answer");
        let lines = log_lines_with("k_log_denied");
        assert!(
            lines.iter().any(|l| l.contains(
                "redirect not followed key=\"k_log_denied\" status=308 \
                 why=the key may not go to the location's origin"
            )),
            "{lines:#?}"
        );

        // A request without a key logs an empty one.
        let c = TestServer::start(vec![redirect(302, "/moved")], Action::ok("doc")).await;
        client(RedirectPolicy::default())
            .get(c.url("/doc"))
            .send()
            .await
            .expect("followed");
        let lines = log_lines_with(&format!("from={}", origin(&c)));
        assert!(
            lines
                .iter()
                .any(|l| l.contains("following a redirect key=\"\" status=302")),
            "{lines:#?}"
        );
    })
    .await;
}

/// A caller above the client that follows redirects itself (httpx's `follow_redirects`) got
/// a 308 from `/v1/charges` and re-issues the hop: the operation goes on from there, under
/// a policy that follows no live redirect.
#[tokio::test]
async fn an_operation_continued_after_a_redirect_sends_only_the_hop_with_its_key_and_body() {
    bounded(async {
        let a = TestServer::start(vec![], Action::ok("charged")).await;
        let response = client(RedirectPolicy::none())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_308"))
            .header("Content-Type", "application/json")
            .body(BODY)
            .after_redirect(
                StatusCode::PERMANENT_REDIRECT,
                a.url("/v1/charges/").parse().expect("valid test url"),
            )
            .send()
            .await
            .expect("the hop's answer");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.url().as_str(), a.url("/v1/charges/"));
        let chain = chain(&response);
        assert_eq!(chain.hops().len(), 1);
        assert_eq!(chain.hops()[0].from.as_str(), a.url("/v1/charges"));
        assert!(chain.hops()[0].key_sent);
        assert_eq!(report(&response).attempts(), 1);

        let requests = a.requests();
        assert_eq!(requests.len(), 1, "the answered request is not sent again");
        assert_eq!(requests[0].method, "POST");
        assert_eq!(requests[0].path, "/v1/charges/");
        assert_eq!(requests[0].body_str(), BODY);
        assert_eq!(a.keys(), vec![Some("k_after_308".into())]);
    })
    .await;
}

#[tokio::test]
async fn a_continued_operation_hands_a_further_redirect_back_under_redirect_policy_none() {
    bounded(async {
        let a = TestServer::start(vec![], redirect(307, "/v1/third")).await;
        let response = client(RedirectPolicy::none())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_twice"))
            .body(BODY)
            .after_redirect(
                StatusCode::PERMANENT_REDIRECT,
                a.url("/v1/second").parse().expect("valid test url"),
            )
            .send()
            .await
            .expect("the second redirect is the answer");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(response.url().as_str(), a.url("/v1/second"));
        assert_eq!(chain(&response).stopped(), Some(RedirectStop::Disabled));
        assert_eq!(a.hits(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_continued_hop_the_key_may_not_take_ends_on_the_answered_redirect_unsent() {
    bounded(async {
        let b = TestServer::start(vec![], Action::ok("elsewhere")).await;
        let a = TestServer::start(vec![], Action::ok("here")).await;
        let response = client(RedirectPolicy::none())
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_cross"))
            .body(BODY)
            .after_redirect(
                StatusCode::TEMPORARY_REDIRECT,
                b.url("/v1/charges").parse().expect("valid test url"),
            )
            .send()
            .await
            .expect("the answered 307 is final");
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        assert_eq!(
            chain(&response).stopped(),
            Some(RedirectStop::KeyToOtherOrigin)
        );
        assert_eq!((a.hits(), b.hits()), (0, 0), "nothing was sent");

        // Allowed there, the hop goes with its key.
        let response = client(RedirectPolicy::none().allow_key_to(&origin(&b)))
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_cross"))
            .body(BODY)
            .after_redirect(
                StatusCode::TEMPORARY_REDIRECT,
                b.url("/v1/charges").parse().expect("valid test url"),
            )
            .send()
            .await
            .expect("the other origin's answer");
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(b.keys(), vec![Some("k_after_cross".into())]);
        assert_eq!(a.hits(), 0);
    })
    .await;
}

#[tokio::test]
async fn after_redirect_refuses_what_is_not_a_redirect_and_cannot_be_built() {
    let client = client(RedirectPolicy::none());
    let to: reqwest::Url = "http://127.0.0.1:9/x".parse().expect("valid test url");
    let err = client
        .post("http://127.0.0.1:9/")
        .after_redirect(StatusCode::OK, to.clone())
        .send()
        .await
        .expect_err("200 is not a redirect");
    assert_eq!(err.kind(), ErrorKind::Builder);
    let err = client
        .post("http://127.0.0.1:9/")
        .after_redirect(StatusCode::FOUND, to)
        .build()
        .expect_err("a reqwest::Request cannot carry the hops");
    assert!(
        err.to_string()
            .contains("send it with RequestBuilder::send"),
        "{err}"
    );
}

/// The ledger's row is the operation's: the request as first sent, its answer the hop's.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_continued_operation_is_recorded_under_the_first_request_and_replayed() {
    use idempotent_retry::ledger::SqliteLedger;
    bounded(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = SqliteLedger::open(dir.path().join("ops.db"))
            .await
            .expect("open the ledger");
        capture_log();
        let client = Client::builder()
            .policy(fast())
            .redirects(RedirectPolicy::none())
            .ledger(ledger)
            .build()
            .expect("valid client");
        let a = TestServer::start(vec![redirect(308, "/v1/charges/")], Action::ok("charged")).await;
        let first = client
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_ledger"))
            .body(BODY)
            .send()
            .await
            .expect("the 308");
        assert_eq!(first.status(), StatusCode::PERMANENT_REDIRECT);
        let hop = client
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_ledger"))
            .body(BODY)
            .after_redirect(
                StatusCode::PERMANENT_REDIRECT,
                a.url("/v1/charges/").parse().expect("valid test url"),
            )
            .send()
            .await
            .expect("the hop's answer, not a key reuse");
        assert_eq!(hop.status(), StatusCode::OK);
        assert_eq!(hop.text().await.expect("body"), "charged");

        let again = client
            .post(a.url("/v1/charges"))
            .idempotency_key(key("k_after_ledger"))
            .body(BODY)
            .send()
            .await
            .expect("replayed");
        assert_eq!(again.status(), StatusCode::OK);
        assert!(report(&again).is_replayed());
        assert_eq!(again.text().await.expect("body"), "charged");
        assert_eq!(a.hits(), 2, "the 308 and the hop; the replay sent nothing");
    })
    .await;
}
