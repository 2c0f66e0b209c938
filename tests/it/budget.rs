//! The retry budget under load, counted at a loopback server: what an outage costs the
//! server, what random failures cost the callers, and that retries come back after recovery.
//!
//! Real sockets, the real clock and millisecond backoff; many operations run concurrently
//! through clones of one client (one shared budget). Random failures are drawn from a seeded
//! RNG into the server's script, so every run serves the same sequence of answers. Nothing here
//! asserts a duration.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;
use futures_util::StreamExt;
use idempotent_retry::observe::RetryRefusedEvent;
use idempotent_retry::{
    Client, Error, ErrorKind, FailureKind, Observer, RetryBudget, RetryBudgetConfig, RetryPolicy,
    RetryReport,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// How many operations are in flight at once.
const CONCURRENCY: usize = 32;

/// The default policy (5 attempts) with millisecond backoff and a generous attempt timeout,
/// so no attempt times out on a busy machine (a timeout would cost 10 tokens, not 5).
fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5))
        .with_attempt_timeout(Duration::from_secs(10))
}

fn client_with(builder: idempotent_retry::ClientBuilder) -> Client {
    builder.policy(fast()).build().expect("valid client")
}

/// Sends `n` POSTs to `url` through clones of `client`, `CONCURRENCY` at a time.
async fn post_many(client: &Client, url: &str, n: usize) -> Vec<Result<reqwest::Response, Error>> {
    futures_util::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let url = url.to_owned();
            async move { client.post(url).body(format!("op {i}")).send().await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await
}

/// One refused retry as the observer heard it: key, failure, attempt.
type Refusal = (Option<String>, FailureKind, u32);

/// Records every retry the budget refused.
#[derive(Debug, Default, Clone)]
struct Refusals {
    events: Arc<Mutex<Vec<Refusal>>>,
}

impl Observer for Refusals {
    fn on_retry_refused(&self, event: &RetryRefusedEvent<'_>) {
        self.events.lock().expect("not poisoned").push((
            event.key.map(ToString::to_string),
            event.failure,
            event.attempt,
        ));
    }
}

fn count_kind(results: &[Result<reqwest::Response, Error>], kind: ErrorKind) -> usize {
    results
        .iter()
        .filter(|r| r.as_ref().is_err_and(|e| e.kind() == kind))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_outage_of_1000_operations_sends_at_most_the_bucket_plus_one_retry_per_operation_in_flight()
 {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let refusals = Refusals::default();
    let client = client_with(Client::builder().observer(refusals.clone()));
    let ops = 1000;

    let results = post_many(&client, &server.url("/charge"), ops).await;

    let requests = server.hits();
    // A full bucket pays for 500 / 5 = 100 failed retries, and nothing refills it; retries
    // admitted before the last of those failed are at most one per operation in flight.
    let limit = ops + 100 + CONCURRENCY;
    assert!(
        requests <= limit,
        "{requests} requests for {ops} operations (limit {limit})"
    );
    assert!(requests >= ops + 100, "{requests} requests");
    let budget = client.retry_budget().expect("on by default");
    assert_eq!(budget.available(), 0);

    let refused = count_kind(&results, ErrorKind::BudgetExhausted);
    let exhausted = count_kind(&results, ErrorKind::AttemptsExhausted);
    assert_eq!(
        refused + exhausted,
        ops,
        "every operation failed, none silently"
    );
    assert!(
        refused >= ops - 100 - CONCURRENCY,
        "{refused} refused by the budget"
    );
    assert_eq!(
        budget.refused(),
        refused as u64,
        "one refusal counted per operation shed"
    );

    // A refused operation says what a caller needs to reconcile.
    let mut err = results
        .into_iter()
        .find_map(|r| r.err().filter(|e| e.kind() == ErrorKind::BudgetExhausted))
        .expect("at least one refusal");
    let key = err
        .idempotency_key()
        .expect("POSTs carry a key")
        .to_string();
    assert!(err.is_outcome_unknown(), "a 503 may have run");
    assert_eq!(err.failure(), Some(FailureKind::ServerError));
    assert_eq!(err.status().map(|s| s.as_u16()), Some(503));
    assert!(err.to_string().contains("retry budget exhausted"), "{err}");
    assert!(
        err.to_string().contains("RetryBudgetConfig::with_capacity"),
        "the message names the setting that sizes the budget: {err}"
    );
    assert!(err.to_string().contains(&key), "{err}");
    let sent_with_key = server
        .keys()
        .iter()
        .filter(|k| k.as_deref() == Some(key.as_str()))
        .count();
    assert_eq!(sent_with_key as u32, err.attempts());
    assert_eq!(err.report().history().len() as u32, err.attempts());
    let last = err.take_response().expect("the last 503 is kept");
    assert_eq!(last.status().as_u16(), 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_an_outage_gets_every_attempt_the_policy_allows() {
    let server = TestServer::start(vec![], Action::status(503)).await;
    let client = client_with(Client::builder().without_retry_budget());
    assert!(client.retry_budget().is_none());
    let ops = 100;

    let results = post_many(&client, &server.url("/charge"), ops).await;

    assert_eq!(
        server.hits(),
        ops * 5,
        "the budget is what bounded the outage"
    );
    assert_eq!(count_kind(&results, ErrorKind::AttemptsExhausted), ops);
}

/// A service that answers 10% of requests 503, at random: the budget sends every retry the
/// policy allows. Which operation meets which answer depends on the order the concurrent
/// requests arrive in, so the test counts what happened rather than predicting it: every
/// request the server saw is an attempt some operation reports, every operation either
/// succeeded or used up its attempts (a 503 on each, about one in a thousand), none was cut
/// short by the budget, and the bucket lost no more than its failed retries cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_percent_random_503s_leave_every_retry_to_the_policy() {
    let ops = 2000;
    // Seeded: the server answers the same sequence every run. 10% 503, the rest 200.
    let mut rng = StdRng::seed_from_u64(0x5EED_0503);
    let script: Vec<Action> = (0..ops * 2)
        .map(|_| {
            if rng.random_bool(0.10) {
                Action::status(503)
            } else {
                Action::ok("done")
            }
        })
        .collect();
    let server = TestServer::start(script.clone(), Action::ok("done")).await;
    // The default policy and budget; waits are recorded instead of slept, since the server's
    // answers do not depend on time.
    let client = Client::builder()
        .sleeper(VirtualTime::new())
        .build()
        .expect("default client");

    let results = post_many(&client, &server.url("/charge"), ops).await;

    let attempts: Vec<u32> = results
        .iter()
        .map(|result| match result {
            Ok(response) => RetryReport::of(response).map_or(1, RetryReport::attempts),
            Err(err) => err.attempts(),
        })
        .collect();
    let hits = server.hits();
    assert_eq!(
        hits,
        attempts.iter().map(|&n| n as usize).sum::<usize>(),
        "every request the server saw is an attempt an operation reports"
    );
    let served_503 = script[..hits]
        .iter()
        .filter(|a| **a == Action::status(503))
        .count();
    assert!(
        served_503 * 100 >= hits * 8,
        "the seeded script serves about 10% 503s: {served_503} of {hits}"
    );
    let succeeded = results
        .iter()
        .filter(|r| r.as_ref().is_ok_and(|resp| resp.status() == 200))
        .count();
    let exhausted = count_kind(&results, ErrorKind::AttemptsExhausted);
    assert_eq!(
        succeeded + exhausted,
        ops,
        "a success or every attempt used"
    );
    assert_eq!(count_kind(&results, ErrorKind::BudgetExhausted), 0);
    // An operation that used up its attempts met a 503 on each; one in a thousand does on
    // average (0.1 cubed), so more than ten of two thousand would mean retries went missing.
    assert!(
        exhausted <= 10,
        "{exhausted} operations exhausted their attempts"
    );
    assert!(attempts.iter().any(|&n| n > 1), "some operations retried");
    // Each 503 on a retry is a failed retry, charged its cost; 503s on first attempts and
    // successful retries cost nothing, and first-attempt successes refill up to capacity.
    let retries = hits - ops;
    let failed_retries = served_503 - (ops - attempts.iter().filter(|&&n| n == 1).count());
    assert!(failed_retries <= retries);
    let budget = client.retry_budget().expect("on");
    let capacity = budget.config().capacity();
    let level = budget.available();
    assert!(
        level <= capacity && level + 5 * u32::try_from(failed_retries).expect("few") >= capacity,
        "level {level} after {failed_retries} failed retries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_outage_the_budget_refills_and_retries_resume() {
    let client = client_with(Client::builder());
    let budget = client.retry_budget().expect("on by default").clone();

    // The outage drains the bucket.
    let outage = TestServer::start(vec![], Action::status(503)).await;
    let results = post_many(&client, &outage.url("/charge"), 150).await;
    assert!(results.iter().all(Result::is_err));
    let drained = budget.available();
    assert_eq!(drained, 0, "{drained} tokens left");

    // Still failing: a new operation gets one attempt and a typed refusal.
    let still_down = TestServer::start(vec![], Action::status(503)).await;
    let err = client
        .post(still_down.url("/charge"))
        .send()
        .await
        .expect_err("503 and an empty budget");
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert_eq!(still_down.hits(), 1);
    assert!(err.idempotency_key().is_some());

    // Recovery: every first-attempt success deposits one token.
    let healthy = TestServer::start(vec![], Action::ok("done")).await;
    let results = post_many(&client, &healthy.url("/charge"), 50).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(budget.available(), drained + 50);

    // A blip after recovery is retried again, and the retry's cost is refunded.
    let blip = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
    let response = client
        .post(blip.url("/charge"))
        .send()
        .await
        .expect("retried past the 503");
    assert_eq!(response.status(), 200);
    assert_eq!(blip.hits(), 2);
    let keys = blip.keys();
    assert_eq!(keys[0], keys[1], "the retry carried the same key");
    assert_eq!(budget.available(), drained + 50);
}

#[tokio::test]
async fn clients_given_one_budget_share_it() {
    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).expect("valid budget");
    let first = client_with(Client::builder().retry_budget(budget.clone()));
    let second = client_with(Client::builder().retry_budget(budget.clone()));
    let server = TestServer::start(vec![], Action::status(503)).await;

    // Two retries (5 tokens each) empty the shared bucket through the first client...
    let err = first
        .post(server.url("/a"))
        .policy(fast().with_max_attempts(3))
        .send()
        .await
        .expect_err("503 throughout");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(server.hits(), 3);
    assert_eq!(budget.available(), 0);

    // ...so the second client may not retry.
    let err = second
        .post(server.url("/b"))
        .send()
        .await
        .expect_err("503 and an empty shared budget");
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert_eq!(server.hits(), 4);
}

#[tokio::test]
async fn waiting_out_a_409_in_progress_costs_no_tokens() {
    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).expect("valid budget");
    let client = client_with(Client::builder().retry_budget(budget.clone()));
    // Empty the bucket, as failed retries elsewhere would.
    assert_eq!(
        idempotent_retry::internals::budget::charge_failed_retry(&budget, FailureKind::ServerError),
        5
    );
    assert_eq!(
        idempotent_retry::internals::budget::charge_failed_retry(&budget, FailureKind::ServerError),
        5
    );
    assert_eq!(budget.available(), 0);

    // Our own first attempt still running: three 409s, then the saved answer. An empty bucket
    // does not stop these retries.
    let server = TestServer::start(
        vec![
            Action::status(409),
            Action::status(409),
            Action::status(409),
        ],
        Action::status(200),
    )
    .await;
    let response = client
        .post(server.url("/charge"))
        .send()
        .await
        .expect("409s are waited out, not refused");
    assert_eq!(response.status(), 200);
    assert_eq!(server.hits(), 4);
    let keys = server.keys();
    assert_eq!(keys.len(), 4);
    assert!(keys[0].is_some(), "an automatic key on a POST");
    assert!(
        keys.windows(2).all(|w| w[0] == w[1]),
        "one key on every attempt"
    );
    assert_eq!(budget.available(), 0);
}

#[tokio::test]
async fn a_refused_throttled_retry_reports_the_outcome_as_not_executed() {
    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).expect("valid budget");
    while budget.available() > 0 {
        idempotent_retry::internals::budget::charge_failed_retry(&budget, FailureKind::ServerError);
    }
    let client = client_with(Client::builder().retry_budget(budget));
    let server = TestServer::start(vec![], Action::status(429)).await;

    let err = client
        .post(server.url("/charge"))
        .send()
        .await
        .expect_err("429 and an empty budget");

    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert!(!err.is_outcome_unknown(), "a 429 was refused, not executed");
    assert_eq!(err.failure(), Some(FailureKind::Throttled));
    assert_eq!(server.hits(), 1);
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn clones_of_a_tower_layer_share_its_budget() {
    use tower::{Layer, ServiceExt};

    let budget =
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).expect("valid budget");
    let layer = Client::builder()
        .policy(fast().with_max_attempts(3))
        .retry_budget(budget.clone())
        .build_layer()
        .expect("valid layer");
    let server = TestServer::start(vec![], Action::status(503)).await;
    let request = |path: &str| {
        reqwest::Request::new(http::Method::POST, server.url(path).parse().expect("url"))
    };

    let first = layer.clone().layer(reqwest::Client::new());
    let err = first
        .oneshot(request("/a"))
        .await
        .expect_err("503 throughout");
    assert_eq!(err.kind(), ErrorKind::AttemptsExhausted);
    assert_eq!(server.hits(), 3);
    assert_eq!(budget.available(), 0);

    let second = layer.layer(reqwest::Client::new());
    let err = second
        .oneshot(request("/b"))
        .await
        .expect_err("503 and an empty shared budget");
    assert_eq!(err.kind(), ErrorKind::BudgetExhausted);
    assert!(err.idempotency_key().is_some(), "the layer minted a key");
    assert_eq!(server.hits(), 4);
}
