//! The retry budget: a token bucket shared by every clone of a client.
//!
//! Retries multiply load exactly when a service is failing: five attempts per operation is five
//! times the traffic during an outage. A budget bounds the *extra* traffic retries add, across
//! all operations of a client, whatever each operation's policy allows.
//!
//! The numbers, and why this design over tower's ratio budget or gRPC's throttling, are in
//! [`RetryBudget`]'s docs.
//!
//! # Sharing
//!
//! [`RetryBudget`] is a handle: clones share one bucket. A [`Client`](crate::Client) gets one
//! of its own by default, shared by all its clones; pass the same handle to several clients
//! (or to another front end) to make them share it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::classify::FailureKind;
use crate::decide::{Decision, Stop};
use crate::error::Error;

/// The numbers a [`RetryBudget`] runs on. `Copy`; validated by [`RetryBudget::with_config`].
///
/// # Default
///
/// [`RetryBudgetConfig::new()`] holds the AWS SDKs' standard-mode numbers, listed with their
/// reasons in the crate's [defaults table](crate#defaults); the bucket starts full. A retry
/// after a 409 "still in progress" is free (see [`cost_of`](Self::cost_of)).
///
/// # Examples
///
/// ```
/// use idempotent_retry::{RetryBudget, RetryBudgetConfig};
///
/// // A smaller burst: 20 retries from full, refilled by 5 first-attempt successes each.
/// let budget = RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(100))?;
/// assert_eq!(budget.available(), 100);
///
/// let too_small = RetryBudgetConfig::new().with_capacity(4); // cannot pay for one retry
/// assert!(RetryBudget::with_config(too_small).is_err());
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub struct RetryBudgetConfig {
    capacity: u32,
    retry_cost: u32,
    timeout_cost: u32,
    success_reward: u32,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudgetConfig {
    /// The default numbers (see the crate's [defaults table](crate#defaults)).
    pub const fn new() -> Self {
        RetryBudgetConfig {
            capacity: 500,
            retry_cost: 5,
            timeout_cost: 10,
            success_reward: 1,
        }
    }

    /// The most tokens the bucket holds, and the level it starts at. Must be at least the
    /// larger of the two costs ([`validate`](Self::validate) refuses less, zero included).
    ///
    /// Any value up to `u32::MAX` is accepted; deposits and refunds saturate at the capacity,
    /// never wrap.
    ///
    /// Default: 500.
    pub const fn with_capacity(mut self, tokens: u32) -> Self {
        self.capacity = tokens;
        self
    }

    /// What a retry costs, unless the attempt before it timed out. Must be at least 1. A cost
    /// equal to the capacity lets one retry drain a full bucket.
    ///
    /// Default: 5.
    pub const fn with_retry_cost(mut self, tokens: u32) -> Self {
        self.retry_cost = tokens;
        self
    }

    /// What a retry after a timed-out attempt costs. Must be at least 1.
    ///
    /// Default: 10.
    pub const fn with_timeout_cost(mut self, tokens: u32) -> Self {
        self.timeout_cost = tokens;
        self
    }

    /// What an operation that succeeds on its first attempt deposits. Must be at least 1, or
    /// a drained bucket would never refill. A reward of `u32::MAX` refills the bucket with one
    /// success (the level saturates at the capacity).
    ///
    /// Default: 1.
    pub const fn with_success_reward(mut self, tokens: u32) -> Self {
        self.success_reward = tokens;
        self
    }

    /// The configured capacity (set with [`with_capacity`](Self::with_capacity)).
    #[must_use]
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The configured cost of a retry (set with [`with_retry_cost`](Self::with_retry_cost)).
    #[must_use]
    pub const fn retry_cost(&self) -> u32 {
        self.retry_cost
    }

    /// The configured cost of a retry after a timeout
    /// (set with [`with_timeout_cost`](Self::with_timeout_cost)).
    #[must_use]
    pub const fn timeout_cost(&self) -> u32 {
        self.timeout_cost
    }

    /// The configured deposit for a first-attempt success
    /// (set with [`with_success_reward`](Self::with_success_reward)).
    #[must_use]
    pub const fn success_reward(&self) -> u32 {
        self.success_reward
    }

    /// What a retry after a failure of this kind costs.
    ///
    /// A 409 that says the operation's own first attempt is still running
    /// ([`FailureKind::InProgress`]) costs nothing: the server is answering, quickly and
    /// correctly, and charging for it would let one slow operation (or many deliveries of one
    /// key) drain the bucket that protects everyone else from an outage. Those retries are
    /// still bounded by the policy's attempts and reconcile window.
    #[must_use]
    pub const fn cost_of(&self, failure: FailureKind) -> u32 {
        match failure {
            FailureKind::InProgress => 0,
            FailureKind::Timeout => self.timeout_cost,
            _ => self.retry_cost,
        }
    }

    /// Checks that the numbers make a working budget.
    ///
    /// # Errors
    ///
    /// An [`ErrorKind::Builder`](crate::ErrorKind::Builder) error naming the setting when a
    /// cost or the reward is 0, or the capacity cannot pay for a single retry of either kind.
    pub fn validate(&self) -> Result<(), Error> {
        if self.retry_cost == 0 || self.timeout_cost == 0 {
            return Err(Error::builder(
                "retry budget costs must be at least 1 token (turn the budget off instead)",
            ));
        }
        if self.success_reward == 0 {
            return Err(Error::builder(
                "retry budget success_reward must be at least 1 token, or the bucket never refills",
            ));
        }
        let dearest = self.retry_cost.max(self.timeout_cost);
        if self.capacity < dearest {
            return Err(Error::builder(format!(
                "retry budget capacity ({}) cannot pay for one retry ({dearest} tokens)",
                self.capacity
            )));
        }
        Ok(())
    }
}

/// A token bucket that limits retries across every operation that shares it.
///
/// A handle: clones share one bucket. Every [`Client`](crate::Client) has one by default
/// ([`ClientBuilder::retry_budget`](crate::ClientBuilder::retry_budget) replaces or shares it,
/// [`ClientBuilder::without_retry_budget`](crate::ClientBuilder::without_retry_budget) turns it
/// off). The numbers are set with [`RetryBudgetConfig`].
///
/// The two operations below are what the client's retry loop calls; they are public for
/// other front ends and simulations. The bucket is a single atomic counter, so it is cheap to
/// share across threads and never blocks.
///
/// # Why this design
///
/// This is the token bucket of the AWS SDKs' "standard" retry mode, with its numbers (the
/// crate's [defaults table](crate#defaults) lists them):
///
/// | event | tokens |
/// |---|---|
/// | capacity (and the starting level) | the capacity |
/// | a retry after a timeout | - the timeout cost |
/// | any other retry | - the retry cost |
/// | an operation succeeds after a retry | + the cost of that last retry (refund) |
/// | an operation succeeds on its first attempt | + the success reward, up to the capacity |
///
/// A retry the bucket cannot pay for is not sent; the operation ends with
/// [`ErrorKind::BudgetExhausted`](crate::ErrorKind::BudgetExhausted).
///
/// We chose it over the alternatives because of what it guarantees:
///
/// - **A hard bound, independent of time and speed.** A full bucket pays for
///   `b = capacity / retry_cost` retries. During a total outage, `n` operations send at most
///   `n + b` requests, however long the outage lasts, and no clock is read to enforce it (so
///   it is as deterministic as the rest of the loop). tower's ratio budget (retries up to 20%
///   of requests plus 10 per second, over a 10 s window) lets `1.2 n` requests and more through
///   and depends on the clock; gRPC's throttling (10 tokens, -1 per failure, +0.1 per
///   success, no retries at or below half) bounds an outage to 5 retries, which is so tight
///   that one unlucky burst of failures turns retries off for the next 50 successes.
/// - **Untouched in normal operation.** Under 10% random transient failures, each operation
///   deposits about `0.9` times the success reward and a retry that then succeeds is
///   refunded, so the bucket stays full and every retry the policy allows is sent.
/// - **It refills on its own once the service recovers.** Every first-attempt success adds
///   the success reward; `retry_cost / success_reward` of them pay for one retry again. No
///   timer is needed.
/// - **Timeouts cost double.** A timed-out attempt held a connection and server resources for
///   the whole timeout; retrying those is the first thing to cut.
///
/// Google's SRE book suggests retries stay under 10% of requests per client; the default
/// bucket sustains more than that (one retry per `retry_cost / success_reward` first-attempt
/// successes) plus a burst of `b`, and the cap (not the ratio) is what bounds an outage.
///
/// Counting "success": any response the client returns as `Ok` (a 2xx, or a final 4xx such as
/// 404 or 422) means the server is answering, so it deposits. Operations that end with an
/// error deposit nothing.
///
/// Measurements are in the crate's `docs/performance.md`.
///
/// # Examples
///
/// ```
/// use idempotent_retry::{FailureKind, RetryBudget};
///
/// let budget = RetryBudget::new();
/// let shared = budget.clone(); // same bucket
///
/// // An attempt answered 503: may we retry?
/// let cost = budget.try_withdraw(FailureKind::ServerError).expect("a full bucket pays");
/// assert_eq!(cost, 5);
/// assert_eq!(shared.available(), 495);
///
/// // The retry succeeded: refund it.
/// shared.record_success(Some(cost));
/// assert_eq!(budget.available(), 500);
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<Bucket>,
}

struct Bucket {
    config: RetryBudgetConfig,
    tokens: AtomicU32,
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("available", &self.available())
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Default for RetryBudget {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryBudget {
    /// A full bucket with the default numbers (the crate's [defaults table](crate#defaults)).
    #[must_use]
    pub fn new() -> Self {
        Self::unchecked(RetryBudgetConfig::new())
    }

    /// A full bucket with these numbers.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when the numbers do not make a
    /// working budget (see [`RetryBudgetConfig::validate`]).
    pub fn with_config(config: RetryBudgetConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self::unchecked(config))
    }

    fn unchecked(config: RetryBudgetConfig) -> Self {
        RetryBudget {
            inner: Arc::new(Bucket {
                config,
                tokens: AtomicU32::new(config.capacity),
            }),
        }
    }

    /// The numbers this bucket runs on.
    pub fn config(&self) -> RetryBudgetConfig {
        self.inner.config
    }

    /// Tokens in the bucket now.
    #[must_use]
    pub fn available(&self) -> u32 {
        self.inner.tokens.load(Ordering::Acquire)
    }

    /// Pays for one retry after a failure of this kind, if the bucket can: returns the cost
    /// withdrawn, to be refunded with [`record_success`](Self::record_success) if the retry
    /// succeeds. `None` means the retry must not be sent; nothing was withdrawn.
    #[must_use = "a withdrawal that is not used wastes tokens; `None` means do not retry"]
    pub fn try_withdraw(&self, failure: FailureKind) -> Option<u32> {
        let cost = self.inner.config.cost_of(failure);
        self.inner
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |tokens| {
                tokens.checked_sub(cost)
            })
            .ok()
            .map(|_| cost)
    }

    /// Gives back what a retry that was never sent cost. The bucket never rises above its
    /// capacity.
    pub(crate) fn refund(&self, cost: u32) {
        self.deposit(cost);
    }

    /// Records that an operation ended with a final answer. `last_cost` is what the retry
    /// that produced it cost (refunded), or `None` when the first attempt succeeded (the
    /// success reward is deposited). The bucket never rises above its capacity.
    pub fn record_success(&self, last_cost: Option<u32>) {
        self.deposit(last_cost.unwrap_or(self.inner.config.success_reward));
    }

    fn deposit(&self, tokens: u32) {
        let capacity = self.inner.config.capacity;
        // `fetch_update` with a closure that always returns `Some` cannot fail.
        let _ = self
            .inner
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(tokens).min(capacity))
            });
    }
}

/// One operation's dealings with the budget, kept by the attempt loop: the cost of its last
/// retry, so a success refunds exactly that, and whether that retry is still waiting to be
/// sent. An operation dropped before a retry it paid for goes out (its caller gave up during
/// the wait) gives the tokens back: a retry that never happened costs nothing.
#[derive(Debug)]
pub(crate) struct BudgetTab<'b> {
    budget: Option<&'b RetryBudget>,
    last_cost: Option<u32>,
    unsent: bool,
}

impl<'b> BudgetTab<'b> {
    /// A tab with `budget`, or with none (every retry goes ahead).
    pub(crate) fn new(budget: Option<&'b RetryBudget>) -> Self {
        BudgetTab {
            budget,
            last_cost: None,
            unsent: false,
        }
    }

    /// Asks the budget to pay for the retry `decide` chose; a refusal turns the decision into
    /// a stop.
    pub(crate) fn admit(&mut self, decision: Decision) -> Decision {
        match (self.budget, decision) {
            (Some(budget), Decision::Retry { kind, .. }) => match budget.try_withdraw(kind) {
                Some(cost) => {
                    self.last_cost = Some(cost);
                    self.unsent = true;
                    decision
                }
                None => Decision::Stop {
                    kind: Some(kind),
                    stop: Stop::BudgetExhausted,
                },
            },
            _ => decision,
        }
    }

    /// The retry paid for is being sent: its cost is spent.
    pub(crate) fn sending(&mut self) {
        self.unsent = false;
    }

    /// The operation ends with a final answer: refund its last retry or reward the success.
    pub(crate) fn settle_success(&mut self) {
        self.unsent = false;
        if let Some(budget) = self.budget {
            budget.record_success(self.last_cost);
        }
    }
}

impl Drop for BudgetTab<'_> {
    fn drop(&mut self) {
        if let (true, Some(budget), Some(cost)) = (self.unsent, self.budget, self.last_cost) {
            budget.refund(cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::report::WaitReason;

    fn retry(kind: FailureKind) -> Decision {
        Decision::Retry {
            kind,
            delay: Duration::from_millis(1),
            reason: WaitReason::Backoff {
                ceiling: Duration::from_millis(1),
            },
        }
    }

    /// Withdraws for `kind` until the bucket refuses; returns how many retries it paid for.
    /// Bounded by the capacity (every cost here is at least 1 token), so a bucket that never
    /// refuses fails the test instead of hanging it.
    fn drain(budget: &RetryBudget, kind: FailureKind) -> usize {
        let most = budget.config().capacity() as usize + 1;
        let paid = std::iter::from_fn(|| budget.try_withdraw(kind))
            .take(most)
            .count();
        assert!(paid < most, "the bucket never refused a {kind:?} retry");
        paid
    }

    #[test]
    fn default_numbers_are_the_aws_standard_ones() {
        let config = RetryBudgetConfig::default();
        assert_eq!(config.capacity(), 500);
        assert_eq!(config.retry_cost(), 5);
        assert_eq!(config.timeout_cost(), 10);
        assert_eq!(config.success_reward(), 1);
        assert_eq!(RetryBudget::default().available(), 500);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_bucket_runs_on_the_numbers_it_was_given() {
        let config = RetryBudgetConfig::new()
            .with_capacity(20)
            .with_retry_cost(3)
            .with_timeout_cost(7)
            .with_success_reward(2);
        assert_eq!(config.capacity(), 20);
        assert_eq!(config.retry_cost(), 3);
        assert_eq!(config.timeout_cost(), 7);
        assert_eq!(config.success_reward(), 2);
        let budget = RetryBudget::with_config(config).expect("valid");
        assert_eq!(budget.config(), config);

        assert_eq!(budget.try_withdraw(FailureKind::Timeout), Some(7));
        assert_eq!(budget.try_withdraw(FailureKind::ServerError), Some(3));
        assert_eq!(budget.available(), 10);
        budget.record_success(None);
        assert_eq!(budget.available(), 12, "a first-attempt success deposits 2");
    }

    #[test]
    fn a_full_bucket_pays_for_exactly_one_hundred_retries() {
        let budget = RetryBudget::new();
        assert_eq!(drain(&budget, FailureKind::ServerError), 100);
        assert_eq!(budget.available(), 0);
        assert_eq!(budget.try_withdraw(FailureKind::Connect), None);
    }

    #[test]
    fn timeouts_cost_double() {
        let budget = RetryBudget::new();
        assert_eq!(budget.try_withdraw(FailureKind::Timeout), Some(10));
        assert_eq!(budget.try_withdraw(FailureKind::ConnectionReset), Some(5));
        assert_eq!(budget.available(), 485);
    }

    #[test]
    fn a_refusal_withdraws_nothing() {
        let config = RetryBudgetConfig::new().with_capacity(12);
        let budget = RetryBudget::with_config(config).expect("valid");
        assert_eq!(budget.try_withdraw(FailureKind::Timeout), Some(10));
        assert_eq!(budget.try_withdraw(FailureKind::Timeout), None);
        assert_eq!(budget.available(), 2);
    }

    #[test]
    fn successes_refund_and_reward_up_to_capacity() {
        let budget = RetryBudget::new();
        budget.record_success(None);
        assert_eq!(budget.available(), 500, "never above capacity");
        let cost = budget.try_withdraw(FailureKind::Timeout);
        assert_eq!(budget.available(), 490);
        budget.record_success(cost);
        assert_eq!(budget.available(), 500);
        drain(&budget, FailureKind::ServerError);
        for _ in 0..4 {
            budget.record_success(None);
        }
        assert_eq!(budget.try_withdraw(FailureKind::ServerError), None);
        budget.record_success(None);
        assert_eq!(budget.try_withdraw(FailureKind::ServerError), Some(5));
    }

    #[test]
    fn clones_share_one_bucket() {
        let a = RetryBudget::new();
        let b = a.clone();
        let _ = a.try_withdraw(FailureKind::ServerError);
        assert_eq!(b.available(), 495);
        assert!(format!("{b:?}").contains("available: 495"));
    }

    #[test]
    fn a_conflict_in_progress_is_free_and_an_empty_bucket_still_allows_it() {
        let budget = RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10)).unwrap();
        assert_eq!(budget.try_withdraw(FailureKind::Timeout), Some(10));
        assert_eq!(budget.available(), 0);
        assert_eq!(budget.try_withdraw(FailureKind::ServerError), None);
        // The server is answering: waiting out our own first attempt is not outage load.
        assert_eq!(budget.try_withdraw(FailureKind::InProgress), Some(0));
        assert_eq!(budget.available(), 0);
        // A success after a free retry refunds nothing it did not take.
        budget.record_success(Some(0));
        assert_eq!(budget.available(), 0);
    }

    #[test]
    fn bad_numbers_are_typed_errors() {
        let cases = [
            (RetryBudgetConfig::new().with_retry_cost(0), "costs"),
            (RetryBudgetConfig::new().with_timeout_cost(0), "costs"),
            (RetryBudgetConfig::new().with_success_reward(0), "refills"),
            (RetryBudgetConfig::new().with_capacity(9), "capacity (9)"),
            (RetryBudgetConfig::new().with_capacity(0), "capacity (0)"),
        ];
        for (config, words) in cases {
            let err = RetryBudget::with_config(config).expect_err("invalid");
            assert_eq!(err.kind(), crate::ErrorKind::Builder);
            assert!(err.to_string().contains(words), "{err}");
        }
        let ok = RetryBudgetConfig::new()
            .with_capacity(10)
            .with_retry_cost(10)
            .with_timeout_cost(10);
        assert!(RetryBudget::with_config(ok).is_ok());
    }

    #[test]
    fn tab_turns_a_refused_retry_into_a_stop_and_refunds_the_last_cost() {
        let config = RetryBudgetConfig::new().with_capacity(15);
        let budget = RetryBudget::with_config(config).expect("valid");
        let mut tab = BudgetTab::new(Some(&budget));
        let decision = retry(FailureKind::Timeout);
        assert_eq!(tab.admit(decision), decision);
        tab.sending();
        let decision = retry(FailureKind::ServerError);
        assert_eq!(tab.admit(decision), decision);
        tab.sending();
        assert_eq!(budget.available(), 0);
        assert_eq!(
            tab.admit(retry(FailureKind::Throttled)),
            Decision::Stop {
                kind: Some(FailureKind::Throttled),
                stop: Stop::BudgetExhausted
            }
        );
        tab.settle_success();
        drop(tab);
        assert_eq!(budget.available(), 5, "the last retry's cost comes back");

        let mut tab = BudgetTab::new(Some(&budget));
        let untouched = Decision::Return;
        assert_eq!(tab.admit(untouched), untouched);
        let mut off = BudgetTab::new(None);
        assert_eq!(
            off.admit(retry(FailureKind::Timeout)),
            retry(FailureKind::Timeout)
        );
        assert_eq!(budget.available(), 5);
        tab.settle_success();
        assert_eq!(
            budget.available(),
            6,
            "a first-attempt success deposits the reward"
        );
    }

    #[test]
    fn a_retry_dropped_before_it_is_sent_gives_its_tokens_back() {
        let budget = RetryBudget::new();
        for _ in 0..300 {
            let mut tab = BudgetTab::new(Some(&budget));
            assert_eq!(
                tab.admit(retry(FailureKind::ServerError)),
                retry(FailureKind::ServerError)
            );
            assert_eq!(budget.available(), 495);
            // The caller gives up during the wait.
            drop(tab);
        }
        assert_eq!(budget.available(), 500);
        // A retry that went out keeps its cost until the operation ends.
        let mut tab = BudgetTab::new(Some(&budget));
        let _ = tab.admit(retry(FailureKind::ServerError));
        tab.sending();
        drop(tab);
        assert_eq!(budget.available(), 495);
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let budget = RetryBudget::new();
        let paid: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let budget = budget.clone();
                    scope.spawn(move || drain(&budget, FailureKind::ServerError))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .sum()
        });
        assert_eq!(paid, 100);
        assert_eq!(budget.available(), 0);
    }

    fn any_kind() -> impl Strategy<Value = FailureKind> {
        prop_oneof![
            Just(FailureKind::Timeout),
            Just(FailureKind::ServerError),
            Just(FailureKind::Throttled),
            Just(FailureKind::ConnectionReset),
        ]
    }

    proptest! {
        /// Whatever happens, the level stays within [0, capacity], and the retries paid for
        /// never exceed what the capacity plus the deposits can cover.
        #[test]
        fn prop_level_stays_in_bounds(
            capacity in 10u32..2_000,
            events in proptest::collection::vec(
                prop_oneof![
                    any_kind().prop_map(Some),
                    Just(None),
                ],
                0..500,
            ),
        ) {
            let config = RetryBudgetConfig::new().with_capacity(capacity);
            let budget = RetryBudget::with_config(config).expect("valid");
            let (mut spent, mut deposited) = (0u64, 0u64);
            for event in events {
                let before = budget.available();
                match event {
                    Some(kind) => {
                        if let Some(cost) = budget.try_withdraw(kind) {
                            spent += u64::from(cost);
                        } else {
                            prop_assert!(before < config.cost_of(kind));
                        }
                    }
                    None => {
                        budget.record_success(None);
                        deposited += u64::from(budget.available() - before);
                    }
                }
                prop_assert!(budget.available() <= capacity);
            }
            prop_assert_eq!(
                u64::from(budget.available()) + spent,
                u64::from(capacity) + deposited
            );
        }
    }
}
