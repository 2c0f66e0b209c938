//! The behavioural suite every front end must pass: the `Client`, the tower service over
//! `reqwest::Client`, the tower service over a hyper client, and the `reqwest-middleware`
//! middleware. Each case is written once (against `crate::support::front::FrontEnd`) and run against
//! each front end, on real loopback sockets; waits that a case asserts run on virtual time.

use std::error::Error as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::front::{Call, FrontEnd, front_ends};
use crate::support::*;
use http::HeaderName;
use idempotent_retry::observe::{AttemptEvent, OperationEvent, RetryRefusedEvent};
use idempotent_retry::{
    Client, ClientBuilder, ErrorKind, FailureKind, IdempotencyKey, Observer, RetryBudget,
    RetryBudgetConfig, RetryPolicy,
};

fn with_policy(policy: RetryPolicy) -> impl Fn() -> ClientBuilder {
    move || Client::builder().policy(policy)
}

/// Every front end, each with its own virtual timeline for waits.
fn virtual_front_ends(policy: RetryPolicy) -> Vec<(Box<dyn FrontEnd>, VirtualTime)> {
    (0..4)
        .map(|i| {
            let time = VirtualTime::new();
            let mut all = front_ends(|| {
                Client::builder()
                    .policy(policy)
                    .clock(time.clone())
                    .sleeper(time.clone())
                    .rng_seed(7)
            });
            (all.swap_remove(i), time)
        })
        .collect()
}

/// Every request carried the same, present key; returns it.
fn one_key(server: &TestServer, front: &str) -> String {
    let keys = server.keys();
    assert!(!keys.is_empty(), "{front}: no request reached the server");
    let first = keys[0]
        .clone()
        .unwrap_or_else(|| panic!("{front}: the first attempt carried no key"));
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(first.as_str())),
        "{front}: keys differ between attempts: {keys:?}"
    );
    first
}

#[tokio::test]
async fn transient_failures_are_retried_with_one_key_and_one_side_effect() {
    for front in front_ends(with_policy(fast())) {
        let name = front.name();
        let server = TestServer::start_idempotent(
            vec![Action::status(503), Action::Reset, Action::ResetAfterCommit],
            Action::ok("sent"),
        )
        .await;
        let reply = front
            .send(Call::post(server.url("/emails")).body(r#"{"to":"a@example.com"}"#))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(server.hits(), 4, "{name}");
        let key = one_key(&server, name);
        assert_eq!(key.len(), 36, "{name}: a UUID v4 key, got {key}");
        assert_eq!(server.effects(), 1, "{name}: exactly one side effect");
        assert_eq!(reply.body, "committed", "{name}: the saved result");
        assert_eq!(reply.report.attempts(), 4, "{name}");
        assert_eq!(
            reply.report.idempotency_key().map(IdempotencyKey::as_str),
            Some(key.as_str()),
            "{name}"
        );
        let bodies: Vec<String> = server.requests().iter().map(Recorded::body_str).collect();
        assert!(
            bodies.iter().all(|b| b == r#"{"to":"a@example.com"}"#),
            "{name}: the same body on every attempt: {bodies:?}"
        );
    }
}

#[tokio::test]
async fn each_transient_fault_alone_is_retried_with_exactly_one_side_effect() {
    let faults: Vec<(&str, Action)> = vec![
        ("reset before commit", Action::Reset),
        ("reset after commit", Action::ResetAfterCommit),
        ("close without reply", Action::Close),
        ("500", Action::status(500)),
        ("502", Action::status(502)),
        ("503", Action::status(503)),
        ("504", Action::status(504)),
        ("599", Action::status(599)),
        ("408", Action::status(408)),
        ("429", Action::status(429)),
        ("409 in progress", Action::status(409)),
    ];
    for front in front_ends(with_policy(fast())) {
        let name = front.name();
        for (fault, action) in &faults {
            let server =
                TestServer::start_idempotent(vec![action.clone()], Action::ok("done")).await;
            let reply = front
                .send(Call::post(server.url("/charges")))
                .await
                .unwrap_or_else(|err| panic!("{name}, {fault}: {err}"));
            assert_eq!(reply.status, 200, "{name}, {fault}");
            assert_eq!(server.hits(), 2, "{name}, {fault}");
            one_key(&server, name);
            assert_eq!(
                server.effects(),
                1,
                "{name}, {fault}: exactly one side effect"
            );
            assert_eq!(reply.report.attempts(), 2, "{name}, {fault}");
        }
    }
}

#[tokio::test]
async fn a_stalled_attempt_times_out_and_the_retry_meets_the_saved_result() {
    let policy = fast().with_attempt_timeout(ms(300));
    for front in front_ends(with_policy(policy)) {
        let name = front.name();
        let server = TestServer::start_idempotent(
            vec![Action::commit_then_stall(
                Duration::from_secs(3),
                Action::ok("done"),
            )],
            Action::ok("never"),
        )
        .await;
        let reply = front
            .send(Call::post(server.url("/charges")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(
            reply.body, "done",
            "{name}: the retry meets the first result"
        );
        assert!(reply.headers.contains_key(REPLAYED_HEADER), "{name}");
        assert_eq!(server.hits(), 2, "{name}");
        assert_eq!(server.effects(), 1, "{name}");
        one_key(&server, name);
        assert_eq!(
            reply.report.history()[0].failure,
            Some(FailureKind::Timeout),
            "{name}"
        );
    }
}

#[tokio::test]
async fn connect_failures_are_retried_and_mean_not_executed() {
    for front in front_ends(with_policy(fast().with_max_attempts(3))) {
        let name = front.name();
        let err = front
            .send(Call::post(format!("http://{}/", refused_addr())))
            .await
            .expect_err("nothing listens");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{name}: {err}");
        assert_eq!(err.failure(), Some(FailureKind::Connect), "{name}");
        assert_eq!(err.attempts(), 3, "{name}");
        assert!(!err.is_outcome_unknown(), "{name}: nothing was sent");
        assert!(err.idempotency_key().is_some(), "{name}");
        let source = err.source().expect("the transport error is kept");
        if name != "tower over hyper" {
            assert!(
                source
                    .downcast_ref::<reqwest::Error>()
                    .is_some_and(reqwest::Error::is_connect),
                "{name}: {source}"
            );
        }
    }
}

/// One look at an error tells what happened to which request: `Display` names the method, the
/// origin, what happened, the attempts, whether the operation may have run and the key; the
/// accessors give the method and the whole URL; none of them, nor `Debug`, shows the user name
/// or password the URL carried.
#[tokio::test]
async fn an_error_names_its_request_and_never_its_credentials() {
    let policy = fast().with_max_attempts(2).with_attempt_timeout(ms(300));
    for front in front_ends(with_policy(policy)) {
        let name = front.name();
        for (case, action, happened) in [
            (
                "503",
                Action::status(503),
                "(last status 503 Service Unavailable)",
            ),
            (
                "timeout",
                Action::hang(),
                "(last failure: attempt timed out)",
            ),
        ] {
            let server = TestServer::start(vec![], action).await;
            let plain = server.url("/v1/charges?order=17");
            let with_credentials = plain.replacen("http://", "http://alice:pa55word@", 1);
            let err = front
                .send(Call::post(with_credentials))
                .await
                .expect_err("never answered");
            assert_eq!(
                err.kind(),
                ErrorKind::AttemptsExhausted,
                "{name}, {case}: {err}"
            );
            assert!(err.is_outcome_unknown(), "{name}, {case}");
            assert_eq!(err.method(), Some("POST"), "{name}, {case}");
            assert_eq!(err.url(), Some(plain.as_str()), "{name}, {case}");
            let key = err
                .idempotency_key()
                .unwrap_or_else(|| panic!("{name}, {case}: a minted key"))
                .to_string();
            assert_eq!(
                err.to_string(),
                format!(
                    "POST http://{}/…: gave up after 2 attempts {happened}; outcome unknown: it \
                     may have run; idempotency key {key}",
                    server.addr()
                ),
                "{name}, {case}"
            );
            let debug = format!("{err:?}");
            assert!(
                debug.contains(&format!("url: Some({plain:?})")),
                "{name}, {case}: {debug}"
            );
            assert!(
                debug.contains(r#"method: Some("POST")"#),
                "{name}, {case}: {debug}"
            );
            for shown in [err.to_string(), debug, err.url().unwrap_or("").to_owned()] {
                assert!(
                    !shown.contains("pa55word") && !shown.contains("alice"),
                    "{name}, {case}: {shown}"
                );
            }
        }
    }
}

#[tokio::test]
async fn final_statuses_are_returned_after_one_attempt() {
    for front in front_ends(with_policy(fast())) {
        let name = front.name();
        for status in [200, 201, 204, 400, 401, 403, 404, 410, 422, 501, 505] {
            let server = TestServer::start(vec![], Action::status(status)).await;
            let reply = front
                .send(Call::post(server.url("/")))
                .await
                .unwrap_or_else(|err| panic!("{name} {status}: {err}"));
            assert_eq!(reply.status, status, "{name}");
            assert_eq!(server.hits(), 1, "{name} {status}");
            assert_eq!(reply.report.attempts(), 1, "{name}");
        }
    }
}

#[tokio::test]
async fn exhausted_attempts_keep_the_last_response_and_the_key() {
    for front in front_ends(with_policy(fast().with_max_attempts(3))) {
        let name = front.name();
        let server = TestServer::start(vec![], Action::respond(503, &[], "busy")).await;
        let mut err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("503 every time");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{name}");
        assert!(err.is_outcome_unknown(), "{name}");
        assert_eq!(err.attempts(), 3, "{name}");
        assert_eq!(server.hits(), 3, "{name}");
        let key = one_key(&server, name);
        assert_eq!(
            err.idempotency_key().map(IdempotencyKey::as_str),
            Some(key.as_str()),
            "{name}"
        );
        assert!(
            err.to_string().contains(&key),
            "{name}: the message names the key: {err}"
        );
        assert_eq!(err.status().map(|s| s.as_u16()), Some(503), "{name}");
        assert_eq!(
            front.take_last(&mut err).await,
            Some((503, "busy".to_owned())),
            "{name}"
        );
        assert_eq!(front.take_last(&mut err).await, None, "{name}: taken once");
    }
}

#[tokio::test]
async fn idempotent_methods_are_retried_without_a_key() {
    for front in front_ends(with_policy(fast())) {
        let name = front.name();
        let server =
            TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("")).await;
        let reply = front
            .send(Call::get(server.url("/items/1")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(server.keys(), vec![None, None, None], "{name}");
        assert!(reply.report.idempotency_key().is_none(), "{name}");
    }
}

#[tokio::test]
async fn without_automatic_keys_a_post_is_resent_only_when_it_never_left() {
    let settings = || Client::builder().policy(fast()).auto_keys(false);
    for front in front_ends(settings) {
        let name = front.name();
        let server = TestServer::start(vec![Action::ResetAfterCommit], Action::ok("")).await;
        let err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("not retried");
        assert_eq!(err.kind(), ErrorKind::Transport, "{name}");
        assert_eq!(err.failure(), Some(FailureKind::ConnectionReset), "{name}");
        assert!(err.is_outcome_unknown(), "{name}");
        assert!(
            err.to_string()
                .contains("not retried: it has no idempotency key"),
            "{name}: {err}"
        );
        assert_eq!(server.hits(), 1, "{name}");
        assert_eq!(server.keys(), vec![None], "{name}");
        // A 503 is handed back as it is.
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        let reply = front
            .send(Call::post(server.url("/")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(reply.status, 503, "{name}");
        assert_eq!(server.hits(), 1, "{name}");
        // Connection refused: nothing was sent, so every attempt is made.
        let err = front
            .send(Call::post(format!("http://{}/", refused_addr())))
            .await
            .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{name}");
        assert_eq!(err.attempts(), 5, "{name}");
        assert!(!err.is_outcome_unknown(), "{name}");
    }
}

#[tokio::test]
async fn one_request_can_opt_out_of_the_automatic_key() {
    let mut ran = 0;
    for front in front_ends(with_policy(fast())) {
        if !front.takes_request_options() {
            continue;
        }
        ran += 1;
        let name = front.name();
        // No key: a POST that may have reached the server is not sent again, whether the
        // reset came before or after the handler ran.
        for reset in [Action::Reset, Action::ResetAfterCommit] {
            let server = TestServer::start(vec![reset], Action::ok("")).await;
            let err = front
                .send(Call::post(server.url("/")).without_key())
                .await
                .expect_err("not retried");
            assert_eq!(err.kind(), ErrorKind::Transport, "{name}: {err}");
            assert_eq!(err.failure(), Some(FailureKind::ConnectionReset), "{name}");
            assert!(err.is_outcome_unknown(), "{name}");
            assert!(err.idempotency_key().is_none(), "{name}");
            assert_eq!(server.keys(), vec![None], "{name}");
        }
        // A key given with it is still sent, on every attempt.
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        let key = IdempotencyKey::derive("opt-out", &[name]);
        front
            .send(Call::post(server.url("/")).key(key.clone()).without_key())
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(server.hits(), 2, "{name}");
        assert_eq!(one_key(&server, name), key.as_str(), "{name}");
        // The next request on the same front end gets its automatic key again.
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        front
            .send(Call::post(server.url("/")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(one_key(&server, name).len(), 36, "{name}");
    }
    assert_eq!(ran, 3, "the client, tower over hyper and the middleware");
}

#[tokio::test]
async fn a_streamed_body_gets_one_attempt_and_a_clear_error() {
    let mut ran = 0;
    for front in front_ends(with_policy(fast())) {
        if !front.takes_streamed_body() {
            continue;
        }
        ran += 1;
        let name = front.name();
        let call =
            |server: &TestServer| Call::post(server.url("/")).body("hello stream").streamed();
        // A 503: no second attempt, and the one response is kept.
        let server = TestServer::start(vec![], Action::status(503)).await;
        let mut err = front.send(call(&server)).await.expect_err("cannot resend");
        assert_eq!(err.kind(), ErrorKind::BodyNotReplayable, "{name}: {err}");
        assert_eq!(server.hits(), 1, "{name}");
        assert_eq!(server.requests()[0].body, b"hello stream", "{name}");
        assert!(err.is_outcome_unknown(), "{name}");
        assert_eq!(one_key(&server, name).len(), 36, "{name}");
        assert_eq!(
            front.take_last(&mut err).await.map(|(status, _)| status),
            Some(503),
            "{name}"
        );
        // A reset: the transport error is the source.
        let server = TestServer::start(vec![], Action::Reset).await;
        let err = front.send(call(&server)).await.expect_err("cannot resend");
        assert_eq!(err.kind(), ErrorKind::BodyNotReplayable, "{name}");
        assert_eq!(err.failure(), Some(FailureKind::ConnectionReset), "{name}");
        let source = err.source().expect("the cause is kept");
        assert!(source.downcast_ref::<reqwest::Error>().is_some(), "{name}");
        assert_eq!(server.hits(), 1, "{name}");
        // On success a stream is fine.
        let server = TestServer::start(vec![], Action::ok("ok")).await;
        let reply = front.send(call(&server)).await.expect("ok");
        assert_eq!(reply.status, 200, "{name}");
        assert_eq!(reply.report.attempts(), 1, "{name}");
    }
    assert_eq!(ran, 3, "the client, tower over reqwest and the middleware");
}

#[tokio::test]
async fn a_given_key_is_sent_verbatim_on_every_attempt() {
    for front in front_ends(with_policy(fast())) {
        let name = front.name();
        let server =
            TestServer::start(vec![Action::Reset, Action::status(500)], Action::ok("")).await;
        let key = IdempotencyKey::derive("agent.send_email", &["conv_42", name]);
        let reply = front
            .send(Call::post(server.url("/")).key(key.clone()))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(server.hits(), 3, "{name}");
        assert_eq!(one_key(&server, name), key.as_str(), "{name}");
        assert_eq!(reply.report.idempotency_key(), Some(&key), "{name}");
    }
}

#[tokio::test]
async fn retry_after_is_waited_exactly_on_virtual_time() {
    for (front, time) in virtual_front_ends(RetryPolicy::default()) {
        let name = front.name();
        let server = TestServer::start(
            vec![Action::status_with(429, &[("Retry-After", "7")])],
            Action::ok(""),
        )
        .await;
        front
            .send(Call::post(server.url("/")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert_eq!(time.slept(), vec![Duration::from_secs(7)], "{name}");
        assert_eq!(server.hits(), 2, "{name}");
        one_key(&server, name);
    }
}

#[tokio::test]
async fn a_retry_after_beyond_the_limit_stops_at_once() {
    for (front, time) in virtual_front_ends(RetryPolicy::default()) {
        let name = front.name();
        let server =
            TestServer::start(vec![], Action::status_with(503, &[("Retry-After", "3600")])).await;
        let err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("too long");
        assert_eq!(err.kind(), ErrorKind::RetryAfterTooLong, "{name}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(3600)), "{name}");
        assert!(time.slept().is_empty(), "{name}");
        assert_eq!(server.hits(), 1, "{name}");
        // A 429 asking for longer than the limit: refused, so not executed.
        let server = TestServer::start(
            vec![],
            Action::respond(429, &[("Retry-After", "120")], "slow down"),
        )
        .await;
        let mut err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("too long");
        assert_eq!(err.kind(), ErrorKind::RetryAfterTooLong, "{name}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(120)), "{name}");
        assert_eq!(err.status().map(|s| s.as_u16()), Some(429), "{name}");
        assert_eq!(server.hits(), 1, "{name}");
        assert!(time.slept().is_empty(), "{name}: never slept");
        assert!(
            !err.is_outcome_unknown(),
            "{name}: a 429 was refused, not executed"
        );
        assert_eq!(
            front.take_last(&mut err).await,
            Some((429, "slow down".to_owned())),
            "{name}: the last response is kept"
        );
        assert_eq!(front.take_last(&mut err).await, None, "{name}: taken once");
    }
}

#[tokio::test]
async fn the_reconcile_window_ends_the_operation_before_a_wait_would_cross_it() {
    let window = Duration::from_secs(60);
    let policy = RetryPolicy::default()
        .with_max_attempts(1000)
        .with_base_delay(Duration::from_secs(8))
        .with_max_delay(Duration::from_secs(8))
        .with_reconcile_window(window);
    for (front, time) in virtual_front_ends(policy) {
        let name = front.name();
        let server = TestServer::start(vec![], Action::status(503)).await;
        let err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("window ends");
        assert_eq!(err.kind(), ErrorKind::ReconcileWindow, "{name}");
        assert!(err.is_outcome_unknown(), "{name}");
        assert!(err.idempotency_key().is_some(), "{name}");
        assert!(err.to_string().contains("reconcile"), "{name}: {err}");
        assert!(
            time.elapsed() < window,
            "{name}: slept {:?}",
            time.elapsed()
        );
        assert_eq!(server.hits() as u32, err.attempts(), "{name}");
        assert_eq!(time.slept().len() + 1, server.hits(), "{name}");
        assert!(
            server.hits() > 7,
            "{name}: at most 8 s per wait, so at least 8 attempts"
        );
    }
}

#[tokio::test]
async fn policies_apply_request_first_then_host_then_default() {
    let settings = || {
        Client::builder()
            .policy(fast().with_max_attempts(5))
            .policy_for_host("127.0.0.1", fast().with_max_attempts(2))
            .policy_for_host("localhost", fast().with_max_attempts(4))
    };
    for front in front_ends(settings) {
        let name = front.name();
        let server = TestServer::start(vec![], Action::status(503)).await;
        // The host's policy beats the default.
        let err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("503");
        assert_eq!(err.attempts(), 2, "{name}: the 127.0.0.1 policy");
        // Host names match case-insensitively; a host without a policy gets the default.
        let other = server.url("/").replace("127.0.0.1", "LOCALHOST");
        let err = front.send(Call::post(other)).await.expect_err("503");
        assert_eq!(err.attempts(), 4, "{name}: the localhost policy");
        let refused = format!("http://127.0.0.2:{}/", refused_addr().port());
        let err = front.send(Call::post(refused)).await.expect_err("refused");
        assert_eq!(err.attempts(), 5, "{name}: no host policy, the default");
        // The request's own policy beats the host's.
        if front.takes_request_options() {
            let err = front
                .send(Call::post(server.url("/")).policy(fast().with_max_attempts(3)))
                .await
                .expect_err("503");
            assert_eq!(err.attempts(), 3, "{name}: the request's policy");
        }
        assert_eq!(
            server.hits(),
            2 + 4 + if front.takes_request_options() { 3 } else { 0 }
        );
    }
}

#[tokio::test]
async fn the_attempt_header_is_off_by_default_and_counts_when_on() {
    for front in front_ends(with_policy(fast())) {
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        front.send(Call::post(server.url("/"))).await.expect("ok");
        assert!(
            server
                .requests()
                .iter()
                .all(|r| r.header("x-attempt").is_none()),
            "{}",
            front.name()
        );
    }
    let settings = || {
        Client::builder()
            .policy(fast())
            .attempt_header(HeaderName::from_static("x-attempt"))
    };
    for front in front_ends(settings) {
        let name = front.name();
        let server =
            TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("")).await;
        front.send(Call::post(server.url("/"))).await.expect("ok");
        let numbers: Vec<String> = server
            .requests()
            .iter()
            .map(|r| r.header("x-attempt").unwrap_or("none").to_owned())
            .collect();
        assert_eq!(numbers, ["1", "2", "3"], "{name}");
        one_key(&server, name);
    }
    let err = Client::builder()
        .attempt_header(idempotent_retry::IDEMPOTENCY_KEY)
        .build()
        .expect_err("the attempt number cannot replace the key");
    assert_eq!(err.kind(), ErrorKind::Builder);
}

/// One attempt event: number, failure, status, whether a wait follows, key.
type SeenAttempt = (u32, Option<FailureKind>, Option<u16>, bool, Option<String>);
/// One operation event: attempts, error kind, outcome unknown, key.
type SeenOperation = (u32, Option<ErrorKind>, bool, Option<String>);

/// What an observer saw, as plain values.
#[derive(Debug, Default, Clone)]
struct Seen {
    attempts: Vec<SeenAttempt>,
    operations: Vec<SeenOperation>,
}

#[derive(Debug, Default, Clone)]
struct Recorder(Arc<Mutex<Seen>>);

impl Observer for Recorder {
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        assert_eq!(event.method, http::Method::POST);
        assert_eq!(event.host, Some("127.0.0.1"));
        self.0.lock().unwrap().attempts.push((
            event.attempt,
            event.failure,
            event.status.map(|s| s.as_u16()),
            event.delay.is_some(),
            event.key.map(|k| k.as_str().to_owned()),
        ));
    }

    fn on_operation(&self, event: &OperationEvent<'_>) {
        self.0.lock().unwrap().operations.push((
            event.attempts,
            event.error,
            event.outcome_unknown,
            event.key.map(|k| k.as_str().to_owned()),
        ));
    }
}

#[tokio::test]
async fn the_observer_hears_every_attempt_and_every_operation() {
    let recorder = Recorder::default();
    let settings = || {
        Client::builder()
            .policy(fast().with_max_attempts(3))
            .observer(recorder.clone())
    };
    for front in front_ends(settings) {
        let name = front.name();
        *recorder.0.lock().unwrap() = Seen::default();
        let server =
            TestServer::start(vec![Action::status(503), Action::Reset], Action::ok("")).await;
        front.send(Call::post(server.url("/"))).await.expect("ok");
        let server2 = TestServer::start(vec![], Action::status(502)).await;
        front
            .send(Call::post(server2.url("/")))
            .await
            .expect_err("502s");
        let key = one_key(&server, name);
        let key2 = one_key(&server2, name);
        let seen = recorder.0.lock().unwrap().clone();
        let k = Some(key.clone());
        let k2 = Some(key2.clone());
        assert_eq!(
            seen.attempts,
            vec![
                (
                    1,
                    Some(FailureKind::ServerError),
                    Some(503),
                    true,
                    k.clone()
                ),
                (2, Some(FailureKind::ConnectionReset), None, true, k.clone()),
                (3, None, Some(200), false, k.clone()),
                (
                    1,
                    Some(FailureKind::ServerError),
                    Some(502),
                    true,
                    k2.clone()
                ),
                (
                    2,
                    Some(FailureKind::ServerError),
                    Some(502),
                    true,
                    k2.clone()
                ),
                (
                    3,
                    Some(FailureKind::ServerError),
                    Some(502),
                    false,
                    k2.clone()
                ),
            ],
            "{name}"
        );
        assert_eq!(
            seen.operations,
            vec![
                (3, None, false, k),
                (3, Some(ErrorKind::AttemptsExhausted), true, k2),
            ],
            "{name}"
        );
    }
}

#[tokio::test]
async fn an_invalid_request_policy_is_refused_with_nothing_sent() {
    for front in front_ends(with_policy(fast())) {
        if !front.takes_request_options() {
            continue;
        }
        let name = front.name();
        let server = TestServer::start(vec![], Action::ok("")).await;
        let err = front
            .send(Call::post(server.url("/")).policy(RetryPolicy::default().with_max_attempts(0)))
            .await
            .expect_err("invalid policy");
        assert_eq!(err.kind(), ErrorKind::Builder, "{name}");
        assert_eq!(err.attempts(), 0, "{name}");
        assert_eq!(server.hits(), 0, "{name}");
    }
}

/// An observer that writes what it hears into a shared log.
#[derive(Debug, Clone)]
struct Logger(Arc<Mutex<Vec<String>>>);

impl Observer for Logger {
    fn on_attempt(&self, event: &AttemptEvent<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("observer: attempt {}", event.attempt));
    }

    fn on_operation(&self, event: &OperationEvent<'_>) {
        self.0
            .lock()
            .unwrap()
            .push(format!("observer: operation {}", event.attempts));
    }

    fn on_retry_refused(&self, event: &RetryRefusedEvent<'_>) {
        let key = event.key.map_or("none", IdempotencyKey::as_str);
        self.0.lock().unwrap().push(format!(
            "observer: refused after attempt {} {:?} {} tokens, {} refused {key}",
            event.attempt, event.failure, event.available, event.refused
        ));
    }
}

#[tokio::test]
async fn a_retry_the_budget_refuses_is_counted_and_heard_by_every_observer_first() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).expect("valid");
    // Two failed retries elsewhere empty the shared bucket.
    idempotent_retry::internals::budget::charge_failed_retry(&budget, FailureKind::ServerError);
    idempotent_retry::internals::budget::charge_failed_retry(&budget, FailureKind::ServerError);
    let settings = || {
        Client::builder()
            .policy(fast())
            .retry_budget(budget.clone())
            .observer(Logger(Arc::clone(&log)))
            .observer(Logger(Arc::clone(&log)))
    };
    for (n, front) in front_ends(settings).into_iter().enumerate() {
        let name = front.name();
        log.lock().unwrap().clear();
        let server = TestServer::start(vec![], Action::status(503)).await;
        let err = front
            .send(Call::post(server.url("/")))
            .await
            .expect_err("503 and an empty budget");
        assert_eq!(err.kind(), ErrorKind::BudgetExhausted, "{name}");
        assert_eq!(server.hits(), 1, "{name}: the refused retry was not sent");
        assert!(err.is_outcome_unknown(), "{name}");
        let key = one_key(&server, name);
        assert!(err.to_string().contains(&key), "{name}: {err}");
        assert!(
            err.to_string().contains("RetryBudgetConfig::with_capacity"),
            "{name}: {err}"
        );
        let refused = n + 1;
        assert_eq!(budget.refused(), refused as u64, "{name}");
        let heard = format!(
            "observer: refused after attempt 1 ServerError 0 tokens, {refused} refused {key}"
        );
        assert_eq!(
            *log.lock().unwrap(),
            [
                heard.clone(),
                heard,
                "observer: attempt 1".to_owned(),
                "observer: attempt 1".to_owned(),
                "observer: operation 1".to_owned(),
                "observer: operation 1".to_owned(),
            ],
            "{name}"
        );
    }
}

#[tokio::test]
async fn closure_observers_and_observers_add_up_in_the_order_given() {
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let settings = || {
        let (a, o) = (Arc::clone(&log), Arc::clone(&log));
        Client::builder()
            .policy(fast())
            .on_attempt(move |event| {
                let key = event.key.map_or("none", IdempotencyKey::as_str);
                a.lock().unwrap().push(format!(
                    "closure: attempt {} {:?} {key}",
                    event.attempt, event.failure
                ));
            })
            .observer(Logger(Arc::clone(&log)))
            .on_operation(move |event| {
                let key = event.key.map_or("none", IdempotencyKey::as_str);
                o.lock().unwrap().push(format!(
                    "closure: operation {} {:?} {key}",
                    event.attempts, event.error
                ));
            })
    };
    for front in front_ends(settings) {
        let name = front.name();
        log.lock().unwrap().clear();
        let server = TestServer::start(vec![Action::status(503)], Action::ok("")).await;
        front
            .send(Call::post(server.url("/")))
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        let key = one_key(&server, name);
        assert_eq!(
            *log.lock().unwrap(),
            [
                format!("closure: attempt 1 Some(ServerError) {key}"),
                "observer: attempt 1".to_owned(),
                format!("closure: attempt 2 None {key}"),
                "observer: attempt 2".to_owned(),
                "observer: operation 2".to_owned(),
                format!("closure: operation 2 None {key}"),
            ],
            "{name}"
        );
    }
}
