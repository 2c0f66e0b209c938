//! The proof: replay deliveries through real faults and count side effects.
//!
//! Every test runs the crate's [`Client`] against the testkit's idempotent [`Receiver`] on
//! loopback and asserts what a user would: how many effects happened, which key each attempt
//! carried, what the caller was told. The guarantee under test:
//!
//! - the client returned success: exactly one effect;
//! - it returned an outcome-unknown error: zero or one;
//! - it returned a not-done error: zero;
//! - every attempt carried the same key, no more attempts than the policy allows, and no wait
//!   that ends past the reconcile window.
//!
//! The randomized part replays at least 500 fault schedules per run, concurrently, with
//! millisecond delays. It prints its seed; `REPLAY_SEED=<seed> REPLAY_SCHEDULES=1` replays one.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt as _;
use idempotent_retry::{Client, Error, IdempotencyKey, RetryPolicy, RetryReport};
use idempotent_retry_testkit::{
    self as testkit, Compensation, Delivery, Fault, ForgetError, KeyStatus, Receiver,
    RecordingSleeper, Reply, Violation, When,
};
use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde_json::json;

use crate::support::{Held, held_receiver};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Attempts of 300 ms or more, so that a timeout means the server was slow, not the machine.
/// Thirty attempts with waits up to 100 ms outlast a handler that runs 400 ms.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .with_max_attempts(30)
        .with_base_delay(ms(5))
        .with_max_delay(ms(100))
        .with_attempt_timeout(ms(300))
        .with_max_retry_after(ms(1_500))
}

/// One process sending one operation. Without a retry budget: the budget bounds what a
/// client's retries add across many operations (`tests/budget.rs` and `tests/budget_soak.rs`
/// prove it), and these tests are about one operation's attempts, not a shared allowance.
fn client(policy: RetryPolicy, seed: u64, sleeper: &RecordingSleeper) -> Client {
    Client::builder()
        .http(testkit::loopback_http().expect("a loopback reqwest client"))
        .policy(policy)
        .rng_seed(seed)
        .sleeper(sleeper.clone())
        .without_retry_budget()
        .build()
        .expect("a valid policy")
}

/// The key an agent runtime derives for step `step` of a conversation: the same in every
/// process.
fn step_key(conversation: &str, step: u32) -> IdempotencyKey {
    IdempotencyKey::derive("agent.send_email", &[conversation, &step.to_string()])
}

/// Waits (bounded) until no handler for `key` is still running, so effect counts are final.
async fn settle(receiver: &Receiver, key: &str) {
    for _ in 0..1_000 {
        if receiver
            .record(key)
            .is_none_or(|r| r.status != KeyStatus::InProgress)
        {
            return;
        }
        tokio::time::sleep(ms(5)).await;
    }
    panic!("the handler for {key} never finished");
}

fn email() -> serde_json::Value {
    json!({"to": "ada@example.com", "subject": "Your invoice"})
}

/// Sends the email to `url` with `key`: one logical operation.
async fn send_email(
    client: &Client,
    url: String,
    key: IdempotencyKey,
) -> Result<reqwest::Response, Error> {
    client
        .post(url)
        .idempotency_key(key)
        .json(&email())
        .send()
        .await
}

/// What one logical operation came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    Success,
    FinalOther(u16),
    Unknown,
    NotDone,
}

fn told(result: &Result<reqwest::Response, Error>) -> Told {
    match result {
        Ok(r) if r.status().is_success() => Told::Success,
        Ok(r) => Told::FinalOther(r.status().as_u16()),
        Err(e) if e.is_outcome_unknown() => Told::Unknown,
        Err(_) => Told::NotDone,
    }
}

fn report_of(result: &Result<reqwest::Response, Error>) -> RetryReport {
    match result {
        Ok(response) => RetryReport::of(response).cloned().expect("a report"),
        Err(err) => err.report().clone(),
    }
}

/// The guarantee, checked after one operation with `key` against a receiver that saw nothing
/// else. Returns a description of the first broken promise.
async fn check_guarantee(
    receiver: &Receiver,
    key: &IdempotencyKey,
    policy: &RetryPolicy,
    sleeper: &RecordingSleeper,
    result: &Result<reqwest::Response, Error>,
) -> Result<Told, String> {
    settle(receiver, key.as_str()).await;
    let effects = receiver.effects_for(key.as_str());
    let outcome = told(result);
    match outcome {
        Told::Success if effects != 1 => return Err(format!("success with {effects} effects")),
        Told::FinalOther(_) | Told::Unknown if effects > 1 => {
            return Err(format!("{outcome:?} with {effects} effects"));
        }
        Told::NotDone if effects != 0 => return Err(format!("not done with {effects} effects")),
        _ => {}
    }
    if receiver.effects() != effects {
        return Err(format!(
            "{} effects under other keys",
            receiver.effects() - effects
        ));
    }
    let keys = receiver.keys();
    if keys.iter().any(|k| k.as_deref() != Some(key.as_str())) {
        return Err(format!("an attempt carried another key: {keys:?}"));
    }
    let report = report_of(result);
    // Answers that said the operation was in progress were waits, not attempts.
    let max = policy
        .max_attempts()
        .saturating_add(report.in_progress_waits());
    if report.attempts() > max || keys.len() as u64 > u64::from(max) {
        return Err(format!(
            "{} attempts, {} arrivals, policy allows {max}",
            report.attempts(),
            keys.len()
        ));
    }
    if keys.len() as u64 > u64::from(report.attempts()) {
        return Err(format!(
            "{} arrivals for {} attempts",
            keys.len(),
            report.attempts()
        ));
    }
    if report.idempotency_key() != Some(key) {
        return Err("the report carries another key".to_owned());
    }
    let window = policy.reconcile_window();
    for attempt in report.history() {
        if attempt.started >= window {
            return Err(format!(
                "attempt {} started past the window",
                attempt.number
            ));
        }
        // The wait was chosen after the attempt started, so this is a lower bound of when it
        // ends: it must still be inside the window.
        if let Some(wait) = attempt.wait
            && attempt.started + wait.delay >= window
        {
            return Err(format!(
                "the wait after attempt {} ends past the window",
                attempt.number
            ));
        }
    }
    if sleeper.delays() != report.delays() {
        return Err(format!(
            "slept {:?}, the report says {:?}",
            sleeper.delays(),
            report.delays()
        ));
    }
    Ok(outcome)
}

// 1. Replays, sequential and concurrent.

#[tokio::test]
async fn a_delivery_replayed_sequentially_has_one_effect_and_one_answer() {
    let receiver = Receiver::start().await.expect("receiver");
    let sleeper = RecordingSleeper::new();
    let client = client(policy(), 1, &sleeper);
    let key = step_key("conv_seq", 3);
    let mut bodies = Vec::new();
    for _ in 0..20 {
        let response = send_email(&client, receiver.url("/v1/emails"), key.clone())
            .await
            .expect("a final answer");
        assert_eq!(response.status(), 200);
        bodies.push(response.text().await.expect("body"));
    }
    assert!(bodies.iter().all(|b| *b == bodies[0]), "{bodies:?}");
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    assert_eq!(receiver.effects(), 1);
    assert_eq!(receiver.arrivals(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_deliveries_of_one_key_have_one_effect_and_one_answer() {
    // The first run is held open until every task has been answered at least once, so most
    // meet 409 and retry through it.
    let Held { receiver, gate, .. } = held_receiver(Duration::ZERO, 200).await;
    // Patient enough for any machine: the 409s last until the slowest of the 50 tasks has
    // arrived, and a task that ran out of attempts first would fail the test for a slow start,
    // not for a wrong answer. The bounded waits below end a broken run instead.
    let patient = RetryPolicy::default()
        .with_max_attempts(100_000)
        .with_base_delay(ms(5))
        .with_max_delay(ms(20))
        // Longer than the wait for all 50 arrivals below: the held first run must not time out
        // however slowly a loaded machine starts the other 49.
        .with_attempt_timeout(Duration::from_secs(120));
    let key = step_key("conv_concurrent", 1);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let sleeper = RecordingSleeper::new();
        let client = client(patient, i, &sleeper);
        let (url, key) = (receiver.url("/v1/emails"), key.clone());
        tasks.spawn(async move {
            let response = send_email(&client, url, key).await?;
            let report = RetryReport::of(&response).cloned().expect("report");
            let status = response.status().as_u16();
            let body = response.text().await.unwrap_or_default();
            Ok::<_, Error>((status, body, report))
        });
    }
    assert!(
        receiver
            .wait_for_arrivals(50, Duration::from_secs(30))
            .await
            >= 50
    );
    gate.add_permits(1);
    // Bounded, so a broken client (one that let a second run start) fails instead of hanging
    // on a gate that opens once.
    let answers = tokio::time::timeout(Duration::from_secs(60), async {
        let mut answers = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            answers.push(
                joined
                    .expect("task")
                    .expect("every task gets the final answer"),
            );
        }
        answers
    })
    .await
    .expect("every delivery ends once the first run completes");
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    let first = &answers[0].1;
    for (status, body, report) in &answers {
        assert_eq!((*status, body), (200, first));
        // Every attempt before the last met the key in progress (409).
        for attempt in &report.history()[..report.history().len() - 1] {
            assert_eq!(attempt.status.map(|s| s.as_u16()), Some(409));
        }
    }
    assert!(answers.iter().any(|(_, _, r)| r.attempts() > 1));
    assert!(
        receiver
            .keys()
            .iter()
            .all(|k| k.as_deref() == Some(key.as_str()))
    );
}

// 2. Every fault alone.

/// Each fault on the first attempt of a keyed operation: the retry ends it with the saved
/// answer, one effect (or, where the fault is a final answer, none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_alone_keeps_the_guarantee() {
    let faults: Vec<(Fault, Told, u64)> = vec![
        (Fault::ResetBeforeHandler, Told::Success, 1),
        (Fault::ResetAfterCommit, Told::Success, 1),
        (Fault::StallAfterCommit(ms(1_500)), Told::Success, 1),
        (Fault::CloseWithoutReply, Told::Success, 1),
        (Fault::SlowHandler(ms(400)), Told::Success, 1),
        (Fault::status(500), Told::Success, 1),
        (Fault::status(503), Told::Success, 1),
        (Fault::status(408), Told::Success, 1),
        (Fault::retry_after_secs(429, 1), Told::Success, 1),
        (
            Fault::retry_after_date(503, Duration::ZERO),
            Told::Success,
            1,
        ),
        (Fault::retry_after_ms(429, 30), Told::Success, 1),
        (Fault::should_retry(500, false), Told::FinalOther(500), 0),
        (Fault::should_retry(400, true), Told::Success, 1),
        // Asked to wait longer than the policy allows: stop, never executed.
        (Fault::retry_after_secs(429, 30), Told::NotDone, 0),
    ];
    let runs = faults
        .into_iter()
        .enumerate()
        .map(|(i, (fault, want, effects))| async move {
            let receiver = Receiver::start().await.expect("receiver");
            let key = step_key("conv_alone", u32::try_from(i).expect("small"));
            receiver.inject(When::key_attempt(&key, 1), fault.clone());
            let sleeper = RecordingSleeper::new();
            let policy = policy();
            let result = send_email(
                &client(policy, 7, &sleeper),
                receiver.url("/v1/emails"),
                key.clone(),
            )
            .await;
            let outcome = check_guarantee(&receiver, &key, &policy, &sleeper, &result).await;
            (
                fault,
                want,
                effects,
                outcome,
                receiver.effects_for(key.as_str()),
            )
        });
    let results = futures_util::future::join_all(runs).await;
    for (fault, want, effects, outcome, got_effects) in results {
        assert_eq!(outcome, Ok(want), "{fault}");
        assert_eq!(got_effects, effects, "{fault}");
    }
}

// 2. Randomized schedules.

/// One randomized schedule: a policy and a fault (or none) for each attempt.
#[derive(Debug)]
struct Schedule {
    seed: u64,
    policy: RetryPolicy,
    faults: Vec<Option<Fault>>,
}

fn schedule(seed: u64) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let attempts = rng.random_range(1..=5u32);
    let window = match rng.random_range(0..3u8) {
        0 => ms(rng.random_range(300..1_500)),
        _ => Duration::from_secs(24 * 3600),
    };
    let policy = RetryPolicy::default()
        .with_max_attempts(attempts)
        .with_base_delay(ms(rng.random_range(1..20)))
        .with_max_delay(ms(rng.random_range(20..200)))
        .with_attempt_timeout(ms(300))
        .with_reconcile_window(window)
        .with_max_retry_after(ms(*[200, 1_500]
            .get(rng.random_range(0..2usize))
            .unwrap_or(&200)));
    let faults = (0..attempts)
        .map(|_| {
            if rng.random_bool(0.35) {
                return None;
            }
            Some(match rng.random_range(0..14u8) {
                0 => Fault::ResetBeforeHandler,
                1 => Fault::ResetAfterCommit,
                2 => Fault::StallAfterCommit(ms(rng.random_range(400..900))),
                3 => Fault::CloseWithoutReply,
                4 => Fault::SlowHandler(ms(rng.random_range(5..600))),
                5 => Fault::status(500),
                6 => Fault::status(503),
                7 => Fault::status(408),
                8 => Fault::retry_after_secs(429, rng.random_range(0..2)),
                9 => Fault::retry_after_date(503, Duration::from_secs(rng.random_range(0..2))),
                10 => Fault::retry_after_ms(429, rng.random_range(0..400)),
                11 => Fault::should_retry(503, false),
                12 => Fault::should_retry(409, true),
                _ => Fault::status(502),
            })
        })
        .collect();
    Schedule {
        seed,
        policy,
        faults,
    }
}

async fn run_schedule(schedule: &Schedule, http: reqwest::Client) -> Result<Told, String> {
    let receiver = Receiver::start().await.map_err(|e| e.to_string())?;
    let key = testkit::fixed_key(schedule.seed);
    for (i, fault) in schedule.faults.iter().enumerate() {
        if let Some(fault) = fault {
            let attempt = u32::try_from(i + 1).unwrap_or(u32::MAX);
            receiver.inject(When::key_attempt(&key, attempt), fault.clone());
        }
    }
    let sleeper = RecordingSleeper::new();
    let client = Client::builder()
        .http(http)
        .policy(schedule.policy)
        .rng_seed(schedule.seed)
        .sleeper(sleeper.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let result = send_email(&client, receiver.url("/v1/emails"), key.clone()).await;
    let checked = check_guarantee(&receiver, &key, &schedule.policy, &sleeper, &result).await;
    checked.map_err(|broken| {
        let log: Vec<String> = receiver.log().iter().map(|a| a.to_string()).collect();
        format!("{broken}\n  result: {result:?}\n  receiver: {log:#?}")
    })
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_fault_schedules_keep_the_guarantee() {
    let base = env_u64("REPLAY_SEED").unwrap_or_else(|| rand::rng().random());
    let count = env_u64("REPLAY_SCHEDULES").unwrap_or(520);
    println!("randomized schedules: REPLAY_SEED={base} REPLAY_SCHEDULES={count}");
    let http = testkit::loopback_http().expect("a loopback reqwest client");
    let outcomes: Vec<(u64, Result<Told, String>)> = futures_util::stream::iter(0..count)
        .map(|i| {
            let seed = base.wrapping_add(i);
            let http = http.clone();
            async move {
                let schedule = schedule(seed);
                (seed, run_schedule(&schedule, http).await)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;

    let mut tally = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    for (seed, outcome) in outcomes {
        match outcome {
            Ok(told) => {
                let class = match told {
                    Told::FinalOther(_) => "final non-2xx",
                    Told::Success => "success",
                    Told::Unknown => "outcome unknown",
                    Told::NotDone => "not done",
                };
                *tally.entry(class).or_insert(0u32) += 1;
            }
            Err(broken) => failures.push(format!(
                "schedule {seed} ({:?}): {broken}\n  replay: REPLAY_SEED={seed} REPLAY_SCHEDULES=1 cargo test --test replay_proof randomized",
                schedule(seed)
            )),
        }
    }
    println!("outcomes: {tally:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    if count >= 500 {
        // Not vacuous: every class of answer came up.
        for class in ["success", "outcome unknown", "not done"] {
            assert!(
                tally.get(class).is_some_and(|n| *n > 0),
                "no {class}: {tally:?}"
            );
        }
    }
}

// 3. Crash and resume.

/// Sends once from a "process" that dies after its request reached the receiver.
async fn crash_after_arrival<F: Future<Output = ()>>(
    receiver: &Receiver,
    key: &IdempotencyKey,
    until: impl FnOnce() -> F,
) {
    let sleeper = RecordingSleeper::new();
    let doomed = client(
        policy().with_attempt_timeout(Duration::from_secs(10)),
        1,
        &sleeper,
    );
    let task = tokio::spawn({
        let (url, key) = (receiver.url("/v1/emails"), key.clone());
        async move { send_email(&doomed, url, key).await }
    });
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(10)).await,
        1
    );
    until().await;
    // The process dies: the future is dropped mid-flight, its client with it.
    task.abort();
    assert!(task.await.is_err_and(|e| e.is_cancelled()));
}

#[tokio::test]
async fn a_crash_while_the_handler_runs_then_a_new_client_with_the_derived_key_has_one_effect() {
    // The handler is held in progress until the test lets it finish, whatever the machine's
    // speed.
    let Held {
        receiver,
        started,
        gate,
    } = held_receiver(Duration::ZERO, 200).await;
    let key = step_key("conv_crash", 4);
    crash_after_arrival(&receiver, &key, || async {
        started.acquire().await.expect("handler started").forget();
    })
    .await;
    assert_eq!(
        receiver.record(key.as_str()).map(|r| r.status),
        Some(KeyStatus::InProgress)
    );

    // The restarted process derives the same key from the conversation log.
    let resumed_key = step_key("conv_crash", 4);
    assert_eq!(resumed_key, key);
    let sleeper = RecordingSleeper::new();
    let resumed = tokio::spawn({
        let client = client(
            policy().with_max_attempts(200).with_max_delay(ms(20)),
            2,
            &sleeper,
        );
        let url = receiver.url("/v1/emails");
        async move { send_email(&client, url, resumed_key).await }
    });
    // The resumed attempt meets the first run in progress (409) before it finishes.
    assert_eq!(
        receiver.wait_for_arrivals(2, Duration::from_secs(10)).await,
        2
    );
    gate.add_permits(1);
    let response = tokio::time::timeout(Duration::from_secs(60), resumed)
        .await
        .expect("the resumed operation ends once the first run completes")
        .expect("task")
        .expect("the resumed operation completes");
    assert_eq!(response.status(), 200);
    let report = RetryReport::of(&response).cloned().expect("report");
    assert_eq!(report.history()[0].status.map(|s| s.as_u16()), Some(409));
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    assert_eq!(receiver.effects(), 1);
}

#[tokio::test]
async fn a_crash_after_the_effect_committed_then_a_new_client_gets_the_saved_answer() {
    let receiver = Receiver::start().await.expect("receiver");
    let key = step_key("conv_crash", 5);
    receiver.inject(
        When::key_attempt(&key, 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    crash_after_arrival(&receiver, &key, || async {
        settle(&receiver, key.as_str()).await;
    })
    .await;
    assert_eq!(receiver.effects_for(key.as_str()), 1);

    let sleeper = RecordingSleeper::new();
    let response = send_email(
        &client(policy(), 3, &sleeper),
        receiver.url("/v1/emails"),
        step_key("conv_crash", 5),
    )
    .await
    .expect("the resumed operation completes");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()[testkit::REPLAYED_HEADER], "true");
    assert_eq!(receiver.effects_for(key.as_str()), 1);
}

// 4. A key deleted on failure without a compensating record is caught.

#[tokio::test]
async fn releasing_a_committed_key_on_failure_is_caught_and_refused() {
    // The bug under test: the handler sends the email, fails afterwards, and deletes the key
    // so the sender "can retry".
    let receiver = Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            Reply::status(503).release_key()
        })
        .start()
        .await
        .expect("receiver");
    let key = step_key("conv_release", 1);
    let sleeper = RecordingSleeper::new();
    let policy = policy().with_max_attempts(3);
    let result = send_email(
        &client(policy, 4, &sleeper),
        receiver.url("/v1/emails"),
        key.clone(),
    )
    .await;
    // The receiver refused to forget: each retry got the saved 503, no second email.
    let err = result.expect_err("503 until the attempts run out");
    assert!(err.is_outcome_unknown());
    assert_eq!(err.attempts(), 3);
    assert_eq!(receiver.effects_for(key.as_str()), 1);
    assert_eq!(
        receiver.violations(),
        [Violation::ReleasedCommittedKey {
            key: key.to_string(),
            request: 1,
            effects: 1
        }]
    );
    // The operator path is refused too, until a compensating record is given.
    assert!(matches!(
        receiver.forget(key.as_str(), None),
        Err(ForgetError::EffectCommitted { effects: 1, .. })
    ));
    receiver
        .forget(key.as_str(), Some(Compensation::new("apology email sent")))
        .expect("forgotten with a compensating record");
    assert_eq!(receiver.compensations().len(), 1);
}

// 5. The contrast: keyless POSTs against the same faults.

/// A naive sender: a keyless POST, resent on any transport error or 5xx, up to 3 times.
async fn naive_keyless_send(http: &reqwest::Client, url: &str) -> u32 {
    let mut attempts = 0;
    for _ in 0..3 {
        attempts += 1;
        match http.post(url).json(&email()).send().await {
            Ok(response) if !response.status().is_server_error() => break,
            _ => {}
        }
    }
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_posts_duplicate_under_the_faults_keys_survive() {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(ms(300))
        .build()
        .expect("client");
    let lost_answers = [
        Fault::ResetAfterCommit,
        Fault::StallAfterCommit(ms(1_500)),
        Fault::SlowHandler(ms(400)),
    ];
    for fault in lost_answers {
        // Naive keyless retries: the effect happens twice.
        let naive = Receiver::start().await.expect("receiver");
        naive.inject(When::request(1), fault.clone());
        let attempts = naive_keyless_send(&http, &naive.url("/v1/emails")).await;
        assert_eq!(attempts, 2, "{fault}");
        tokio::time::sleep(ms(1)).await;
        // Give a slow handler the time to finish its (duplicate) run.
        for _ in 0..400 {
            if naive.effects() >= 2 {
                break;
            }
            tokio::time::sleep(ms(5)).await;
        }
        assert_eq!(naive.effects(), 2, "{fault}: the duplicate a key prevents");

        // This crate, keyless: it does not resend what may have run, and says so.
        let keyless = Receiver::start().await.expect("receiver");
        keyless.inject(When::request(1), fault.clone());
        let sleeper = RecordingSleeper::new();
        let err = client(policy(), 5, &sleeper)
            .post(keyless.url("/v1/emails"))
            .without_idempotency_key()
            .json(&email())
            .send()
            .await
            .expect_err("not retried");
        assert!(err.is_outcome_unknown(), "{fault}");
        assert_eq!(err.attempts(), 1, "{fault}");

        // This crate, keyed: retried, one effect, success.
        let keyed = Receiver::start().await.expect("receiver");
        let key = step_key("conv_contrast", 1);
        keyed.inject(When::request(1), fault.clone());
        let response = send_email(
            &client(policy(), 6, &sleeper),
            keyed.url("/v1/emails"),
            key.clone(),
        )
        .await
        .expect("success");
        assert_eq!(response.status(), 200, "{fault}");
        settle(&keyed, key.as_str()).await;
        assert_eq!(keyed.effects(), 1, "{fault}");
    }
}
