//! Hostile and broken servers on loopback: `Retry-After` values that are absurd, negative,
//! enormous or contradictory, statuses outside the valid range, status lines hyper refuses,
//! heads and bodies that never end.
//!
//! Under each the client must not panic, must not hang, must not sleep on the server's say-so
//! beyond `max_retry_after` or the window, and must still report the key and whether the
//! outcome is known. Waits run on virtual time (a recording sleeper), so a server asking for an
//! hour costs nothing; every test is bounded by [`BOUND`] so a bug fails it instead of hanging.

use std::future::Future;
use std::time::Duration;

use crate::support::*;
use idempotent_retry::report::WaitReason;
use idempotent_retry::{
    Client, Error, ErrorKind, FailureKind, IdempotencyKey, RetryPolicy, RetryReport,
};
use idempotent_retry_testkit as testkit;

/// Fails a test that has not finished by then, instead of letting it hang.
const BOUND: Duration = Duration::from_secs(30);

/// Fri, 31 Dec 9999 23:59:59 GMT, as seconds since the epoch.
const YEAR_9999_SECS: u64 = 253_402_300_799;
/// [`VirtualTime`]'s wall clock at the start: 2024-01-01T00:00:00Z.
const VIRTUAL_WALL_SECS: u64 = 1_704_067_200;

async fn bounded<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after {BOUND:?}"))
}

/// One keyed POST with an empty body, bounded by [`BOUND`].
async fn post_keyed(
    what: &str,
    client: &Client,
    url: String,
    k: &IdempotencyKey,
) -> Result<reqwest::Response, Error> {
    bounded(what, client.post(url).idempotency_key(k.clone()).send()).await
}

/// Three attempts, millisecond backoff (below 5 ms), 5 s attempts, the default 60 s limit on
/// `Retry-After` and 24 h window.
fn policy() -> RetryPolicy {
    fast().with_max_attempts(3)
}

/// A client whose waits (and clock) are virtual and recorded.
fn virtual_client(policy: RetryPolicy) -> (Client, VirtualTime) {
    let time = VirtualTime::new();
    let client = Client::builder()
        .http(testkit::loopback_http().expect("loopback client"))
        .policy(policy)
        .clock(time.clone())
        .sleeper(time.clone())
        .rng_seed(7)
        .build()
        .expect("valid policy");
    (client, time)
}

fn key(name: &str) -> IdempotencyKey {
    IdempotencyKey::derive("tests.hostile_server", &[name])
}

/// What the client should make of one hostile answer, repeated on every attempt.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The header is ignored: every wait is the client's own backoff, all attempts are used.
    Backoff,
    /// Every wait is exactly this long, asked for by the server; all attempts are used.
    Honoured(Duration),
    /// The two waits were these, asked for by the server (an HTTP-date names a moment, so the
    /// second wait is what is left of it, or the other value once it has passed).
    HonouredEach(Duration, Duration),
    /// The operation stops after the first attempt, having slept nothing, and says what the
    /// server asked for.
    TooLong(Duration),
}

/// Sends a keyed POST to a server answering `status` with `headers` every time, and checks
/// what the client made of it.
async fn check(name: &str, status: u16, headers: &[(&str, &str)], expect: Expect) {
    let server = TestServer::start(vec![], Action::status_with(status, headers)).await;
    let (client, time) = virtual_client(policy());
    let k = key(name);
    let err = bounded(
        name,
        client
            .post(server.url("/charges"))
            .idempotency_key(k.clone())
            .body("{}")
            .send(),
    )
    .await
    .expect_err("never a final answer");

    // The key and the truth about the outcome, whatever the server said.
    assert_eq!(err.idempotency_key(), Some(&k), "{name}");
    let may_have_run = status != 429;
    assert_eq!(err.is_outcome_unknown(), may_have_run, "{name}");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(status), "{name}");
    let k_str = k.as_str().to_owned();
    assert!(
        server
            .keys()
            .iter()
            .all(|sent| sent.as_deref() == Some(&*k_str)),
        "{name}: the same key on every attempt: {:?}",
        server.keys()
    );
    let report = err.report().clone();
    assert_eq!(
        time.slept(),
        report.delays(),
        "{name}: the report tells every wait"
    );

    match expect {
        Expect::Backoff => {
            assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{name}: {err}");
            assert_eq!(server.hits(), 3, "{name}");
            assert_eq!(time.slept().len(), 2, "{name}");
            for record in &report.history()[..2] {
                let wait = record.wait.expect("a wait after each retried attempt");
                assert!(wait.delay <= ms(5), "{name}: {wait}");
                if let WaitReason::RetryAfter { asked } = wait.reason {
                    // Only a zero request can tie a zero backoff draw.
                    assert_eq!(asked, Duration::ZERO, "{name}: {wait}");
                }
            }
        }
        Expect::Honoured(asked) | Expect::HonouredEach(asked, _) => {
            let second = match expect {
                Expect::HonouredEach(_, second) => second,
                _ => asked,
            };
            assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{name}: {err}");
            assert_eq!(server.hits(), 3, "{name}");
            assert_eq!(time.slept(), [asked, second], "{name}");
            for (record, asked) in report.history().iter().zip([asked, second]) {
                let wait = record.wait.expect("a wait after each retried attempt");
                assert_eq!(wait.reason, WaitReason::RetryAfter { asked }, "{name}");
            }
        }
        Expect::TooLong(asked) => {
            assert_eq!(err.kind(), ErrorKind::RetryAfterTooLong, "{name}: {err}");
            assert_eq!(err.retry_after(), Some(asked), "{name}");
            assert_eq!(server.hits(), 1, "{name}");
            assert_eq!(err.attempts(), 1, "{name}");
            assert!(time.slept().is_empty(), "{name}: slept {:?}", time.slept());
            // The message is printable whatever the number.
            assert!(err.to_string().contains("wait"), "{name}: {err}");
        }
    }
}

#[tokio::test]
async fn retry_after_garbage_is_ignored_and_the_backoff_applies() {
    for (name, value) in [
        ("negative", "-1"),
        ("exponent", "1e10"),
        ("fraction", "1.5"),
        ("words", "soon"),
        ("empty", ""),
        ("date before 1970", "Wed, 31 Dec 1969 23:59:59 GMT"),
        (
            "date with the wrong weekday",
            "Tue, 01 Jan 2024 00:00:10 GMT",
        ),
    ] {
        check(name, 503, &[("Retry-After", value)], Expect::Backoff).await;
        // On a 429 the server refused the request: the outcome is known.
        check(name, 429, &[("Retry-After", value)], Expect::Backoff).await;
    }
}

#[tokio::test]
async fn retry_after_zero_or_a_past_date_means_no_wait_beyond_the_backoff() {
    check("zero", 503, &[("Retry-After", "0")], Expect::Backoff).await;
    check("zeros", 503, &[("Retry-After", "0000")], Expect::Backoff).await;
    check(
        "1970",
        503,
        &[("Retry-After", "Thu, 01 Jan 1970 00:00:00 GMT")],
        Expect::Backoff,
    )
    .await;
}

#[tokio::test]
async fn retry_after_too_large_for_a_duration_stops_without_sleeping() {
    check(
        "twenty digits",
        503,
        &[("Retry-After", "99999999999999999999")],
        Expect::TooLong(Duration::MAX),
    )
    .await;
    let twenty_kb = "9".repeat(20 * 1024);
    check(
        "20 KB of digits",
        429,
        &[("Retry-After", &twenty_kb)],
        Expect::TooLong(Duration::MAX),
    )
    .await;
    // 20 KB of leading zeros is still just 2 seconds.
    let zeros = format!("{}2", "0".repeat(20 * 1024));
    check(
        "20 KB of zeros, then 2",
        503,
        &[("Retry-After", &zeros)],
        Expect::Honoured(Duration::from_secs(2)),
    )
    .await;
}

#[tokio::test]
async fn retry_after_in_the_year_9999_stops_and_says_how_long_was_asked() {
    check(
        "9999",
        503,
        &[("Retry-After", "Fri, 31 Dec 9999 23:59:59 GMT")],
        Expect::TooLong(Duration::from_secs(YEAR_9999_SECS - VIRTUAL_WALL_SECS)),
    )
    .await;
}

#[tokio::test]
async fn retry_after_is_honoured_up_to_max_retry_after_and_no_further() {
    check(
        "60 s",
        503,
        &[("Retry-After", "60")],
        Expect::Honoured(Duration::from_secs(60)),
    )
    .await;
    check(
        "61 s",
        503,
        &[("Retry-After", "61")],
        Expect::TooLong(Duration::from_secs(61)),
    )
    .await;
}

#[tokio::test]
async fn disagreeing_retry_after_headers_the_longest_parsable_wins() {
    check(
        "three values",
        503,
        &[
            ("Retry-After", "2"),
            ("Retry-After", "garbage"),
            ("Retry-After", "7"),
            ("Retry-After", "Thu, 01 Jan 1970 00:00:00 GMT"),
        ],
        Expect::Honoured(Duration::from_secs(7)),
    )
    .await;
    // A date and a number: the date (30 s after the virtual wall clock) is longer at first;
    // once it has passed, the number is all that is left.
    check(
        "a date and a number",
        429,
        &[
            ("Retry-After", "5"),
            ("Retry-After", "Mon, 01 Jan 2024 00:00:30 GMT"),
        ],
        Expect::HonouredEach(Duration::from_secs(30), Duration::from_secs(5)),
    )
    .await;
    // One of them asks for forever: the operation stops rather than pick the shorter one.
    check(
        "one overflows",
        503,
        &[
            ("Retry-After", "1"),
            ("Retry-After", "99999999999999999999"),
        ],
        Expect::TooLong(Duration::MAX),
    )
    .await;
}

#[tokio::test]
async fn retry_after_ms_overflow_stops_and_garbage_falls_back() {
    for value in [
        "18446744073709551616",
        "99999999999999999999999",
        "99999999999999999999999.5",
    ] {
        check(
            value,
            503,
            &[("retry-after-ms", value)],
            Expect::TooLong(Duration::MAX),
        )
        .await;
    }
    // u64::MAX milliseconds fits in a Duration: too long, and said exactly.
    check(
        "u64::MAX ms",
        429,
        &[("retry-after-ms", "18446744073709551615")],
        Expect::TooLong(Duration::from_millis(u64::MAX)),
    )
    .await;
    check(
        "fraction",
        503,
        &[("retry-after-ms", "1500.5")],
        Expect::Honoured(Duration::from_micros(1_500_500)),
    )
    .await;
    for garbage in ["-1", "-0.5", "1e3", "NaN", "inf", "1500.", "soon"] {
        check(
            garbage,
            503,
            &[("retry-after-ms", garbage)],
            Expect::Backoff,
        )
        .await;
        // Unparsable `retry-after-ms` gives way to `Retry-After`.
        check(
            garbage,
            429,
            &[("retry-after-ms", garbage), ("Retry-After", "3")],
            Expect::Honoured(Duration::from_secs(3)),
        )
        .await;
    }
    // A parsable one wins over `Retry-After`, even when shorter; the longest of several wins.
    check(
        "ms over seconds",
        503,
        &[
            ("Retry-After", "30"),
            ("retry-after-ms", "250"),
            ("retry-after-ms", "x"),
            ("retry-after-ms", "400"),
        ],
        Expect::Honoured(ms(400)),
    )
    .await;
}

#[tokio::test]
async fn statuses_599_and_600_to_999_are_retried_as_server_errors() {
    for status in [599, 600, 999] {
        let name = format!("status {status}");
        check(&name, status, &[], Expect::Backoff).await;
    }
    // The last one is kept for the caller, invalid status and all.
    let server = TestServer::start(vec![], Action::respond(999, &[], "odd")).await;
    let (client, _) = virtual_client(policy());
    let mut err = bounded(
        "999",
        client
            .post(server.url("/x"))
            .idempotency_key(key("999"))
            .send(),
    )
    .await
    .expect_err("999 is never final");
    assert_eq!(err.failure(), Some(FailureKind::ServerError));
    let last = err.take_response().expect("the last response");
    assert_eq!(last.status().as_u16(), 999);
    assert_eq!(last.text().await.expect("body"), "odd");
}

#[tokio::test]
async fn a_server_hint_still_wins_over_an_invalid_status() {
    let server = TestServer::start(
        vec![],
        Action::status_with(999, &[("x-should-retry", "false")]),
    )
    .await;
    let (client, time) = virtual_client(policy());
    let response = bounded(
        "999 with a hint",
        client
            .post(server.url("/x"))
            .idempotency_key(key("hint"))
            .send(),
    )
    .await
    .expect("final: the server said not to retry");
    assert_eq!(response.status().as_u16(), 999);
    assert_eq!(server.hits(), 1);
    assert!(time.slept().is_empty());
}

#[tokio::test]
async fn status_lines_hyper_refuses_are_retried_as_broken_connections() {
    for status_line in [
        "000 Zero",
        "099 Low",
        "1000 Four Digits",
        "abc Letters",
        "20 Two",
        "200x OK",
    ] {
        let server = RawServer::start(Reply::head(status_line, &["Retry-After: 1"])).await;
        let (client, time) = virtual_client(policy());
        let k = key(status_line);
        let err = post_keyed(status_line, &client, server.url("/x"), &k)
            .await
            .expect_err("no response at all");
        assert_eq!(
            err.kind(),
            ErrorKind::AttemptsExhausted,
            "{status_line}: {err}"
        );
        assert_eq!(
            err.failure(),
            Some(FailureKind::ConnectionClosed),
            "{status_line}"
        );
        assert!(err.is_outcome_unknown(), "{status_line}");
        assert_eq!(err.idempotency_key(), Some(&k));
        assert_eq!(err.status(), None, "{status_line}");
        assert_eq!(server.hits(), 3, "{status_line}");
        assert!(
            server
                .keys()
                .iter()
                .all(|s| s.as_deref() == Some(k.as_str()))
        );
        // No head was understood, so its `Retry-After` was not either: the backoff applies.
        assert_eq!(time.slept().len(), 2, "{status_line}");
        assert!(time.slept().iter().all(|d| *d <= ms(5)), "{status_line}");
    }
}

#[tokio::test]
async fn a_head_that_never_ends_is_cut_off_and_retried() {
    let junk = format!("X-Junk: {}\r\n", "j".repeat(1000));
    let server = RawServer::start(Reply::Stream {
        head: b"HTTP/1.1 200 OK\r\n".to_vec(),
        chunk: junk.into_bytes(),
        every: Duration::ZERO,
        limit: None,
    })
    .await;
    let (client, _) = virtual_client(policy());
    let k = key("endless head");
    let err = post_keyed("endless head", &client, server.url("/x"), &k)
        .await
        .expect_err("no head ever completes");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{err}");
    assert_eq!(err.failure(), Some(FailureKind::ConnectionClosed));
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(server.hits(), 3);
    assert!(
        server.wait_until_quiet(BOUND).await,
        "connections still open"
    );
    let written = server.written();
    println!("bytes of head written per connection: {written:?}");
    // hyper gives up on a head past its buffer limit (about 400 KiB); the socket buffers hold
    // a few MiB more at most.
    assert!(
        written.iter().all(|&n| n < 16 << 20),
        "the client kept reading a head: {written:?}"
    );
}

/// One byte every 10 ms of a body declared 1 MB long: it would take hours to arrive.
/// A 200 whose body (longer than the client reads inside an attempt, so it streams) trickles.
fn trickle() -> Reply {
    Reply::trickle(200, 2_000_000, ms(10))
}

/// 500 ms attempts: long enough that the head always arrives in time on a loaded machine.
fn trickle_policy() -> RetryPolicy {
    policy().with_attempt_timeout(ms(500))
}

/// Reads a body to its end or its error.
async fn read_body(response: reqwest::Response) -> Result<usize, reqwest::Error> {
    response.bytes().await.map(|b| b.len())
}

#[tokio::test]
async fn a_trickling_body_after_a_2xx_is_the_callers_read_bounded_by_the_attempt_timeout() {
    let server = RawServer::start(trickle()).await;
    let (client, time) = virtual_client(trickle_policy());
    let k = key("trickle");
    let response = post_keyed("send", &client, server.url("/x"), &k)
        .await
        .expect("the head is final: send returns it");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).expect("report").clone();
    assert_eq!(report.attempts(), 1);
    assert_eq!(report.idempotency_key(), Some(&k));

    // The read fails (it does not hang), and nothing is retried: the operation was done.
    let read = bounded("body read", read_body(response)).await;
    let err = read.expect_err("the attempt timeout ends the read");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(server.hits(), 1);
    assert!(time.slept().is_empty());
}

#[tokio::test]
async fn a_trickling_bounded_body_after_a_2xx_is_an_attempt_that_timed_out_and_is_retried() {
    // 1 000 bytes: read inside each attempt, which its timeout ends.
    let server = RawServer::start(Reply::trickle(200, 1_000, ms(10))).await;
    let (client, _) = virtual_client(trickle_policy());
    let k = key("bounded trickle");
    let err = post_keyed("send", &client, server.url("/x"), &k)
        .await
        .expect_err("no attempt's body completes");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted, "{err}");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        err.is_outcome_unknown(),
        "the receiver answered 200 each time"
    );
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(server.hits(), 3);
    assert_eq!(server.keys(), vec![Some(k.to_string()); 3]);
}

#[tokio::test]
async fn a_trickling_body_on_a_503_does_not_hold_up_the_retries() {
    let server = RawServer::start(Reply::trickle(503, 1_000_000, ms(10))).await;
    let (client, _) = virtual_client(trickle_policy());
    let k = key("trickle 503");
    let mut err = post_keyed("send", &client, server.url("/x"), &k)
        .await
        .expect_err("503 on every attempt");
    // Decided on the head: the bodies were never waited for.
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    assert_eq!(server.hits(), 3);
    // The last response's body is the caller's, under the same limit.
    let last = err.take_response().expect("the last 503");
    let read = bounded("body read", read_body(last)).await;
    assert!(read.expect_err("times out").is_timeout());
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn a_trickling_body_through_the_tower_service_over_reqwest_is_bounded_too() {
    use tower::{Layer, ServiceExt};

    let server = RawServer::start(trickle()).await;
    let layer = Client::builder()
        .policy(trickle_policy())
        .sleeper(testkit::RecordingSleeper::instant())
        .build_layer()
        .expect("valid policy");
    let service = layer.layer(testkit::loopback_http().expect("loopback client"));
    let k = key("tower trickle");
    let mut request =
        reqwest::Request::new(http::Method::POST, server.url("/x").parse().expect("url"));
    request
        .headers_mut()
        .insert(idempotent_retry::IDEMPOTENCY_KEY, k.to_header_value());
    let response = bounded("call", service.oneshot(request))
        .await
        .expect("the head is final");
    assert_eq!(response.status(), 200);
    let read = bounded("body read", read_body(response)).await;
    assert!(read.expect_err("times out").is_timeout());
    assert_eq!(server.hits(), 1);
    assert_eq!(server.keys(), [Some(k.as_str().to_owned())]);
}

/// With a ledger, `send` reads the body to save it: a trickle then fails the operation itself,
/// under the attempt timeout, as an answer that may have run.
#[tokio::test]
async fn a_trickling_body_with_a_ledger_fails_send_within_the_attempt_timeout() {
    let server = RawServer::start(trickle()).await;
    let time = VirtualTime::new();
    let client = Client::builder()
        .http(testkit::loopback_http().expect("loopback client"))
        .policy(trickle_policy())
        .clock(time.clone())
        .sleeper(time.clone())
        .ledger(idempotent_retry::ledger::MemoryLedger::new())
        .build()
        .expect("valid policy");
    let k = key("ledger trickle");
    let err: Error = bounded(
        "send",
        client
            .post(server.url("/x"))
            .idempotency_key(k.clone())
            .body("{}")
            .send(),
    )
    .await
    .expect_err("the body never completes");
    assert_eq!(err.kind(), ErrorKind::Transport, "{err}");
    assert!(err.is_outcome_unknown());
    assert_eq!(err.idempotency_key(), Some(&k));
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(server.hits(), 1);
}
