//! The public surface's contracts, as a user relies on them: every public value type can cross
//! threads and be printed, configuration is `Copy` and comparable, builders read back what they
//! were given, and the free functions live in the modules the docs name.

use std::fmt::Debug;
use std::time::Duration;

use http::HeaderValue;
use idempotent_retry::ledger::{
    Claim, Claimed, Finish, LeaseHeldPolicy, LedgerError, LedgerErrorKind, LedgerOptions,
    MemoryLedger, OperationRecord, OperationStatus, SavedResponse,
};
use idempotent_retry::ledger::{
    ListFilter, ReconcileClaim, ResolutionKind, ResolutionNote, Resolve,
};
use idempotent_retry::observe::LedgerVerdict;
use idempotent_retry::reconcile::{
    HttpProbe, ReconcileFn, Reconciled, Resolution, SendAgain, SweepReport,
};
use idempotent_retry::redirect::{RedirectChain, RedirectHop, RedirectStop};
use idempotent_retry::report::{AttemptRecord, Wait, WaitReason};
use idempotent_retry::time::{TokioClock, TokioSleeper};
use idempotent_retry::{
    Client, ClientBuilder, DerivationSecret, Error, ErrorKind, FailureKind, IdempotencyKey,
    InvalidKey, InvalidKeyReason, InvalidSecret, LedgerScope, Outcome, RedirectPolicy,
    RequestFingerprint, RetryBudget, RetryBudgetConfig, RetryPolicy, RetryReport,
    WithoutIdempotencyKey, backoff, canonical, retry_after,
};
use idempotent_retry_testkit::{self as testkit, KeyRecord, ReplayableResponse, Reply};
use serde_json::json;

fn shareable<T: Send + Sync + Debug + 'static>() {}

fn config<T: Copy + Eq + Debug + Default + Send + Sync + 'static>() {}

#[test]
fn every_public_value_type_is_send_sync_debug_and_static() {
    shareable::<AttemptRecord>();
    shareable::<Claim>();
    shareable::<Claimed>();
    shareable::<Client>();
    shareable::<ClientBuilder>();
    shareable::<DerivationSecret>();
    shareable::<Error>();
    shareable::<ErrorKind>();
    shareable::<FailureKind>();
    shareable::<Finish>();
    shareable::<IdempotencyKey>();
    shareable::<InvalidKey>();
    shareable::<InvalidKeyReason>();
    shareable::<InvalidSecret>();
    shareable::<LeaseHeldPolicy>();
    shareable::<LedgerError>();
    shareable::<LedgerErrorKind>();
    shareable::<LedgerOptions>();
    shareable::<LedgerScope>();
    shareable::<LedgerVerdict>();
    shareable::<MemoryLedger>();
    shareable::<OperationRecord>();
    shareable::<OperationStatus>();
    shareable::<Outcome>();
    shareable::<RedirectChain>();
    shareable::<RedirectHop>();
    shareable::<RedirectPolicy>();
    shareable::<RedirectStop>();
    shareable::<RequestFingerprint>();
    shareable::<RetryBudget>();
    shareable::<RetryBudgetConfig>();
    shareable::<RetryPolicy>();
    shareable::<RetryReport>();
    shareable::<SavedResponse>();
    shareable::<HttpProbe>();
    shareable::<ListFilter>();
    shareable::<ReconcileClaim>();
    shareable::<Reconciled>();
    shareable::<Resolution>();
    shareable::<ResolutionKind>();
    shareable::<ResolutionNote>();
    shareable::<Resolve>();
    shareable::<SendAgain>();
    shareable::<SweepReport>();
    type Lookup = fn(idempotent_retry::ledger::OperationRecord) -> std::future::Ready<Resolution>;
    shareable::<ReconcileFn<Lookup>>();
    shareable::<TokioClock>();
    shareable::<TokioSleeper>();
    shareable::<Wait>();
    shareable::<WaitReason>();
    shareable::<WithoutIdempotencyKey>();
    shareable::<KeyRecord>();
    shareable::<ReplayableResponse>();
    shareable::<Reply>();
}

#[test]
fn configuration_is_copy_comparable_and_defaulted() {
    config::<RetryPolicy>();
    config::<RetryBudgetConfig>();
    assert_eq!(RetryPolicy::default(), RetryPolicy::new());
    assert_eq!(RetryBudgetConfig::default(), RetryBudgetConfig::new());
}

#[test]
fn policy_getters_read_back_the_with_setters() {
    let policy = RetryPolicy::new()
        .with_max_attempts(3)
        .with_base_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_secs(2))
        .with_reconcile_window(Duration::from_secs(600))
        .with_attempt_timeout(Duration::from_secs(5))
        .with_max_retry_after(Duration::from_secs(9));
    assert_eq!(
        (
            policy.max_attempts(),
            policy.base_delay(),
            policy.max_delay(),
            policy.reconcile_window(),
            policy.attempt_timeout(),
            policy.max_retry_after(),
        ),
        (
            3,
            Duration::from_millis(20),
            Duration::from_secs(2),
            Duration::from_secs(600),
            Duration::from_secs(5),
            Duration::from_secs(9),
        )
    );
    let budget = RetryBudgetConfig::new()
        .with_capacity(40)
        .with_retry_cost(4)
        .with_timeout_cost(8)
        .with_success_reward(2);
    assert_eq!(
        (
            budget.capacity(),
            budget.retry_cost(),
            budget.timeout_cost(),
            budget.success_reward(),
        ),
        (40, 4, 8, 2)
    );
    let shared = RetryBudget::with_config(budget).expect("a valid budget");
    assert_eq!(shared.config(), budget);
    assert_eq!(shared.available(), 40);
}

#[test]
fn a_held_lease_reads_as_such_not_as_the_servers_in_progress() {
    assert_eq!(
        ErrorKind::LeaseHeld.to_string(),
        "operation lease held by another run"
    );
    assert_ne!(
        ErrorKind::LeaseHeld.to_string(),
        FailureKind::InProgress.to_string()
    );
    let waiting = LeaseHeldPolicy::Wait {
        poll: Duration::from_millis(50),
        max_wait: Duration::from_secs(2),
    };
    let options = LedgerOptions::new().on_lease_held(waiting);
    assert!(
        format!("{options:?}").contains("on_lease_held: Wait"),
        "{options:?}"
    );
}

#[test]
fn the_free_functions_live_in_their_modules_and_need_no_generator() {
    let (base, cap) = (Duration::from_millis(500), Duration::from_secs(30));
    assert_eq!(backoff::ceiling(2, base, cap), Duration::from_secs(2));
    assert_eq!(backoff::full_jitter(2, base, cap, 0), Duration::ZERO);
    assert_eq!(
        backoff::full_jitter(2, base, cap, u64::MAX),
        Duration::from_secs(2)
    );

    let now = std::time::UNIX_EPOCH;
    assert_eq!(
        retry_after::parse(&HeaderValue::from_static("7"), now),
        Some(Duration::from_secs(7))
    );
    assert_eq!(
        retry_after::parse_ms(&HeaderValue::from_static("250")),
        Some(Duration::from_millis(250))
    );
    let mut headers = http::HeaderMap::new();
    headers.insert("retry-after", HeaderValue::from_static("7"));
    assert_eq!(
        retry_after::requested_delay(&headers, now),
        Some(Duration::from_secs(7))
    );

    assert_eq!(
        canonical::to_string(&json!({ "b": 1.0, "a": [true, null] })),
        r#"{"a":[true,null],"b":1}"#
    );

    // A key from caller-supplied bytes: the same bytes, the same UUID v4 text.
    let key = IdempotencyKey::from_random_bytes([7; 16]);
    assert_eq!(key.as_str(), "07070707-0707-4707-8707-070707070707");
    assert_eq!(key, IdempotencyKey::from_random_bytes([7; 16]));
    assert_eq!(testkit::fixed_key(1), testkit::fixed_key(1));
}
