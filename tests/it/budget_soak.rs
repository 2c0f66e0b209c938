//! The retry budget against the testkit's idempotent receiver, at the concurrencies where a
//! budget shared by many operations in flight is tested hardest:
//!
//! - a soak of 600 keyed POSTs through a mix of transient faults on each key's first attempt,
//!   every retry answerable: nothing may be lost to the budget, every effect happens once;
//! - a total outage: the requests the server receives stay within
//!   `1.1 x operations + 100 + operations in flight`;
//! - a half-failing service (every first attempt and every second retry fail): measured and
//!   printed, not asserted for speed.
//!
//! Real sockets, the real clock, millisecond backoff; the fault mix is drawn from a seeded RNG,
//! so every run scripts the same faults. Nothing here asserts a duration. Each test prints one
//! line of figures (`cargo test --all-features --test budget_soak -- --nocapture`), which
//! `docs/performance.md` quotes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use idempotent_retry::{Client, Error, ErrorKind, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{self as testkit, Delivery, Fault, Receiver, Reply, When};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The attempt timeout: long enough that an ordinary loopback answer never meets it on a busy
/// machine, short enough that the slow handler below always does.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the slow handler holds its key in progress before it runs.
const SLOW_HANDLER: Duration = Duration::from_millis(900);

/// Millisecond backoff, attempts enough to wait out the slow handler's 409s, `Retry-After`
/// honoured up to 2 s.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(30)
        .with_base_delay(ms(5))
        .with_max_delay(ms(100))
        .with_attempt_timeout(ATTEMPT_TIMEOUT)
        .with_max_retry_after(ms(2_000))
}

/// A client with the default budget, shared by every clone that sends.
fn client(policy: RetryPolicy) -> Client {
    Client::builder()
        .http(testkit::loopback_http().expect("a loopback reqwest client"))
        .policy(policy)
        .rng_seed(17)
        .build()
        .expect("a valid client")
}

fn key(test: &str, i: usize) -> IdempotencyKey {
    IdempotencyKey::derive("budget_soak", &[test, &i.to_string()])
}

/// The fault each key's first attempt meets, as the soak draws them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Mix {
    /// The effect commits, then the connection is reset: the answer is lost.
    ResetAfterCommit,
    /// 503 without running the handler.
    Unavailable,
    /// 429 with `Retry-After: 1`.
    Throttled,
    /// The handler holds the key in progress longer than the attempt timeout: the first
    /// attempt times out, the next ones meet 409 until it completes.
    SlowThen409,
    /// No fault.
    None,
}

impl Mix {
    const ALL: [Mix; 5] = [
        Mix::ResetAfterCommit,
        Mix::Unavailable,
        Mix::Throttled,
        Mix::SlowThen409,
        Mix::None,
    ];

    fn fault(self) -> Option<Fault> {
        match self {
            Mix::ResetAfterCommit => Some(Fault::ResetAfterCommit),
            Mix::Unavailable => Some(Fault::status(503)),
            Mix::Throttled => Some(Fault::retry_after_secs(429, 1)),
            Mix::SlowThen409 => Some(Fault::SlowHandler(SLOW_HANDLER)),
            Mix::None => None,
        }
    }
}

/// Sends one keyed POST per key through clones of `client`, `in_flight` at a time; the results
/// in key order.
async fn send_all(
    client: &Client,
    url: &str,
    keys: &[IdempotencyKey],
    in_flight: usize,
) -> Vec<Result<reqwest::Response, Error>> {
    let mut results: Vec<(usize, Result<reqwest::Response, Error>)> =
        futures_util::stream::iter(keys.iter().cloned().enumerate())
            .map(|(i, key)| {
                let client = client.clone();
                let url = url.to_owned();
                async move {
                    let sent = client
                        .post(url)
                        .idempotency_key(key)
                        .json(&serde_json::json!({ "op": i }))
                        .send()
                        .await;
                    (i, sent)
                }
            })
            .buffer_unordered(in_flight)
            .collect()
            .await;
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

fn report_of(result: &Result<reqwest::Response, Error>) -> RetryReport {
    match result {
        Ok(response) => RetryReport::of(response).cloned().expect("a report"),
        Err(err) => err.report().clone(),
    }
}

/// Requests that arrived at the receiver, per key.
fn arrivals_per_key(receiver: &Receiver) -> HashMap<String, u64> {
    let mut per_key = HashMap::new();
    for key in receiver.keys() {
        *per_key
            .entry(key.expect("every request carried a key"))
            .or_default() += 1;
    }
    per_key
}

/// The soak: 600 operations, a seeded fault on each key's first attempt, every later attempt
/// answerable. Prints one line of figures, then checks that nothing was lost.
async fn soak(in_flight: usize) {
    let ops = 600;
    let receiver = Receiver::start().await.expect("receiver");
    let mut rng = StdRng::seed_from_u64(0x50A4 + in_flight as u64);
    let test = format!("soak-{in_flight}");
    let keys: Vec<IdempotencyKey> = (0..ops).map(|i| key(&test, i)).collect();
    let mix: Vec<Mix> = keys
        .iter()
        .map(|key| {
            let drawn = Mix::ALL[rng.random_range(0..Mix::ALL.len())];
            if let Some(fault) = drawn.fault() {
                receiver.inject(When::key_attempt(key, 1), fault);
            }
            drawn
        })
        .collect();
    let client = client(policy());

    let results = send_all(&client, &receiver.url("/v1/charges"), &keys, in_flight).await;
    assert!(
        receiver.wait_until_idle(Duration::from_secs(30)).await,
        "the slow handlers finished"
    );

    let mut lost: HashMap<Mix, usize> = HashMap::new();
    let mut shed = 0;
    for ((result, drawn), key) in results.iter().zip(&mix).zip(&keys) {
        match result {
            Ok(response) => assert_eq!(response.status(), 200, "{key}: {drawn:?}"),
            Err(err) => {
                *lost.entry(*drawn).or_default() += 1;
                if err.kind() == ErrorKind::BudgetExhausted {
                    shed += 1;
                }
            }
        }
    }
    let duplicates: u64 = keys
        .iter()
        .map(|key| receiver.effects_for(key.as_str()).saturating_sub(1))
        .sum();
    let arrivals = receiver.arrivals();
    let mut lost_by_fault: Vec<_> = lost.iter().collect();
    lost_by_fault.sort();
    println!(
        "soak, {in_flight} in flight: {ops} operations, {} lost ({shed} BudgetExhausted; by \
         fault {lost_by_fault:?}), {duplicates} duplicate effects, {arrivals} requests",
        lost.values().sum::<usize>(),
    );

    // What a user checks: every operation succeeded, its effect ran once, every attempt
    // carried its key and reached the server no more often than the report says.
    let failures: Vec<String> = results
        .iter()
        .zip(&keys)
        .filter_map(|(r, key)| r.as_ref().err().map(|e| format!("{key}: {e}")))
        .take(5)
        .collect();
    assert!(failures.is_empty(), "operations lost: {failures:#?}");
    assert_eq!(duplicates, 0);
    assert_eq!(receiver.effects(), ops as u64, "one effect per operation");
    assert_eq!(receiver.keyless_effects(), 0);
    let per_key = arrivals_per_key(&receiver);
    assert_eq!(per_key.len(), ops, "no attempt carried a key of its own");
    for ((result, key), drawn) in results.iter().zip(&keys).zip(&mix) {
        assert_eq!(receiver.effects_for(key.as_str()), 1, "{key}: {drawn:?}");
        let report = report_of(result);
        assert_eq!(report.idempotency_key(), Some(key));
        let arrived = per_key.get(key.as_str()).copied().unwrap_or(0);
        assert!(
            arrived >= 1 && arrived <= u64::from(report.attempts()),
            "{key} ({drawn:?}): {arrived} arrivals for {} attempts",
            report.attempts()
        );
        if *drawn != Mix::None {
            assert!(report.attempts() >= 2, "{key} ({drawn:?}) was retried");
        }
    }
    assert!(
        receiver.violations().is_empty(),
        "{:?}",
        receiver.violations()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_transient_faults_at_48_in_flight_loses_nothing_to_the_default_budget() {
    soak(48).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_transient_faults_at_256_in_flight_loses_nothing_to_the_default_budget() {
    soak(256).await;
}

/// A receiver whose handler always answers 503 without an effect: a total outage that still
/// answers quickly.
async fn down() -> Receiver {
    Receiver::builder()
        .handler(|_delivery: Delivery| async { Reply::status(503) })
        .start()
        .await
        .expect("receiver")
}

/// 1 000 operations against a total outage, `in_flight` at a time, the default policy's five
/// attempts with millisecond backoff and the default budget.
async fn outage(in_flight: usize) {
    let ops = 1_000;
    let receiver = down().await;
    let test = format!("outage-{in_flight}");
    let keys: Vec<IdempotencyKey> = (0..ops).map(|i| key(&test, i)).collect();
    let client = client(
        RetryPolicy::default()
            .with_base_delay(ms(1))
            .with_max_delay(ms(5))
            .with_attempt_timeout(Duration::from_secs(10)),
    );

    let results = send_all(&client, &receiver.url("/v1/charges"), &keys, in_flight).await;

    let requests = receiver.arrivals() as usize;
    let bound = ops + ops / 10 + 100 + in_flight;
    let shed = results
        .iter()
        .filter(|r| {
            r.as_ref()
                .is_err_and(|e| e.kind() == ErrorKind::BudgetExhausted)
        })
        .count();
    println!(
        "outage, {in_flight} in flight: {ops} operations, {requests} requests ({} retries; \
         bound {bound}), {shed} BudgetExhausted",
        requests - ops
    );
    assert!(requests <= bound, "{requests} requests (bound {bound})");
    assert!(
        requests >= ops,
        "every operation's first attempt went out: {requests}"
    );
    assert_eq!(receiver.effects(), 0);
    let per_key = arrivals_per_key(&receiver);
    for (result, key) in results.iter().zip(&keys) {
        let err = result
            .as_ref()
            .expect_err("a total outage fails every operation");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::BudgetExhausted | ErrorKind::AttemptsExhausted
            ),
            "{err}"
        );
        assert_eq!(err.idempotency_key(), Some(key));
        assert!(err.is_outcome_unknown(), "a 503 may have run: {err}");
        assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
        assert_eq!(
            per_key.get(key.as_str()).copied(),
            Some(u64::from(err.attempts()))
        );
    }
    assert!(shed >= ops - 100 - in_flight, "{shed} shed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_outage_at_32_in_flight_stays_within_the_bound() {
    outage(32).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_total_outage_at_256_in_flight_stays_within_the_bound() {
    outage(256).await;
}

/// Every key's first attempt is a 503; of the retries that reach the handler, every second one
/// is a 503 too (no effect, so the key stays open), the others run and answer 200.
async fn half_failing(in_flight: usize) {
    let ops = 600;
    let retries_seen = Arc::new(AtomicU64::new(0));
    let receiver = Receiver::builder()
        .handler({
            let retries_seen = retries_seen.clone();
            move |delivery: Delivery| {
                let nth = retries_seen.fetch_add(1, Ordering::Relaxed);
                async move {
                    if nth.is_multiple_of(2) {
                        Reply::status(503)
                    } else {
                        let n = delivery.record_effect();
                        Reply::json(200, &serde_json::json!({ "effect": n }))
                    }
                }
            }
        })
        .start()
        .await
        .expect("receiver");
    let test = format!("half-{in_flight}");
    let keys: Vec<IdempotencyKey> = (0..ops).map(|i| key(&test, i)).collect();
    for key in &keys {
        receiver.inject(When::key_attempt(key, 1), Fault::status(503));
    }
    let client = client(
        RetryPolicy::default()
            .with_base_delay(ms(1))
            .with_max_delay(ms(5))
            .with_attempt_timeout(Duration::from_secs(10)),
    );

    let results = send_all(&client, &receiver.url("/v1/charges"), &keys, in_flight).await;

    let succeeded = results.iter().filter(|r| r.is_ok()).count();
    let count = |kind: ErrorKind| {
        results
            .iter()
            .filter(|r| r.as_ref().is_err_and(|e| e.kind() == kind))
            .count()
    };
    let (shed, exhausted) = (
        count(ErrorKind::BudgetExhausted),
        count(ErrorKind::AttemptsExhausted),
    );
    let requests = receiver.arrivals();
    println!(
        "half-failing, {in_flight} in flight: {ops} operations, {succeeded} succeeded, {shed} \
         BudgetExhausted, {exhausted} AttemptsExhausted, {requests} requests ({:.2} per \
         operation)",
        requests as f64 / ops as f64
    );
    // Correctness, whatever the figures: an effect per success, none for the others (their
    // last answer was a 503 that ran nothing), and every failure says why.
    assert_eq!(succeeded + shed + exhausted, ops);
    for (result, key) in results.iter().zip(&keys) {
        let effects = receiver.effects_for(key.as_str());
        match result {
            Ok(response) => {
                assert_eq!(response.status(), 200);
                assert_eq!(effects, 1, "{key}");
            }
            Err(err) => {
                assert_eq!(effects, 0, "{key}: {err}");
                assert_eq!(err.idempotency_key(), Some(key));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_failing_service_at_48_in_flight_is_measured() {
    half_failing(48).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_failing_service_at_256_in_flight_is_measured() {
    half_failing(256).await;
}
