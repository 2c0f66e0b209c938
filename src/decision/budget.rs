//! The retry budget: a token bucket shared by every clone of a client, charged when a retry
//! fails.
//!
//! Retries multiply load exactly when a service is failing: five attempts per operation is five
//! times the traffic during an outage. A budget bounds the *extra* traffic retries add, across
//! all operations of a client, whatever each operation's policy allows, and lets through the
//! retries of a blip, which succeed.
//!
//! The numbers, and why this design over AWS's bucket as it is, tower's ratio budget or gRPC's
//! throttling, are in `docs/budget.md`.
//!
//! # Sharing
//!
//! [`RetryBudget`] is a handle: clones share one bucket. A [`Client`](crate::Client) gets one
//! of its own by default, shared by all its clones; pass the same handle to several clients
//! (or to another front end) to make them share it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::decision::decide::{Decision, Stop};
use crate::outcome::error::Error;
use crate::rules::classify::FailureKind;

/// The numbers a [`RetryBudget`] runs on. `Copy`; validated by [`RetryBudget::with_config`].
///
/// # Default
///
/// [`RetryBudgetConfig::new()`] holds the AWS SDKs' standard-mode numbers, listed with their
/// reasons in the crate's [defaults table](crate#defaults); the bucket starts full and is
/// charged when a retry fails. A retry after a 409 "still in progress" is free (see
/// [`cost_of`](Self::cost_of)).
///
/// # Examples
///
/// ```
/// use idempotent_retry::{RetryBudget, RetryBudgetConfig};
///
/// // A smaller allowance: 20 failed retries from full, each refilled by 5 first-attempt
/// // successes.
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

    /// What a retry that fails costs, unless it timed out. Must be at least 1. A cost equal to
    /// the capacity lets one failed retry drain a full bucket.
    ///
    /// Default: 5.
    pub const fn with_retry_cost(mut self, tokens: u32) -> Self {
        self.retry_cost = tokens;
        self
    }

    /// What a retry that timed out costs. Must be at least 1.
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

    /// The configured cost of a failed retry (set with [`with_retry_cost`](Self::with_retry_cost)).
    #[must_use]
    pub const fn retry_cost(&self) -> u32 {
        self.retry_cost
    }

    /// The configured cost of a retry that timed out
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

    /// What a retry that failed this way costs, and so the level the bucket must hold to admit
    /// a retry after a failure of this kind.
    ///
    /// A 409 that says the operation's own first attempt is still running
    /// ([`FailureKind::InProgress`]) costs nothing (why: `docs/budget.md`); those waits are
    /// bounded by the policy's
    /// [`max_in_progress_wait`](crate::RetryPolicy::max_in_progress_wait) and reconcile window
    /// instead.
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

/// A token bucket that limits retries across every operation that shares it: a retry is sent
/// only while the bucket can pay for it, a retry that fails is charged, and a first-attempt
/// success deposits. The client and the other front ends charge it themselves; a caller
/// creates it, shares it (clones share one bucket) and reads it.
///
/// # Errors
///
/// A retry the bucket refuses is not sent: the operation ends with
/// [`ErrorKind::BudgetExhausted`](crate::ErrorKind::BudgetExhausted), counted in
/// [`refused`](Self::refused) and heard by
/// [`Observer::on_retry_refused`](crate::Observer::on_retry_refused).
///
/// # Default
///
/// Every [`Client`](crate::Client) has one with [`RetryBudgetConfig::new()`]'s numbers (500
/// tokens, 5 per failed retry, 10 per timed-out one, +1 per first-attempt success);
/// [`ClientBuilder::retry_budget`](crate::ClientBuilder::retry_budget) replaces or shares it,
/// [`ClientBuilder::without_retry_budget`](crate::ClientBuilder::without_retry_budget) turns it
/// off. How it works, why this design, what it guarantees and how to size it:
/// `docs/budget.md` in the package.
///
/// # Examples
///
/// ```
/// use idempotent_retry::{Client, RetryBudget};
///
/// let budget = RetryBudget::new();
/// // Two clients in one service, one bucket: their failed retries drain it together.
/// let payments = Client::builder().retry_budget(budget.clone()).build()?;
/// let refunds = Client::builder().retry_budget(budget.clone()).build()?;
/// assert_eq!(payments.retry_budget().map(RetryBudget::available), Some(500));
/// assert_eq!(refunds.retry_budget().map(RetryBudget::refused), Some(0));
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    inner: Arc<Bucket>,
}

struct Bucket {
    config: RetryBudgetConfig,
    tokens: AtomicU32,
    refused: AtomicU64,
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("available", &self.available())
            .field("refused", &self.refused())
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
                refused: AtomicU64::new(0),
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

    /// Retries refused since the bucket was made, by every clone: each one ended an operation
    /// with [`ErrorKind::BudgetExhausted`](crate::ErrorKind::BudgetExhausted). A counter for
    /// metrics; a rising count against a healthy service means the capacity is too small.
    #[must_use]
    pub fn refused(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// May a retry after a failure of this kind be sent? Yes when the level is at least what
    /// the retry would cost if it failed ([`RetryBudgetConfig::cost_of`]); nothing is taken
    /// either way. A refusal is counted ([`refused`](Self::refused)); the retry must not be
    /// sent.
    #[must_use = "`false` means the retry must not be sent"]
    pub(crate) fn try_admit(&self, failure: FailureKind) -> bool {
        let admitted = self.available() >= self.inner.config.cost_of(failure);
        if !admitted {
            self.inner.refused.fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    /// A retry that was sent failed this way: takes its cost from the bucket (the level stops
    /// at zero) and returns the cost.
    pub(crate) fn charge_failed_retry(&self, failure: FailureKind) -> u32 {
        let cost = self.inner.config.cost_of(failure);
        self.charge(cost);
        cost
    }

    fn charge(&self, cost: u32) {
        if cost > 0 {
            // `fetch_update` with a closure that always returns `Some` cannot fail.
            let _ = self
                .inner
                .tokens
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                    Some(now.saturating_sub(cost))
                });
        }
    }

    /// An operation succeeded on its first attempt: deposits the success reward. The bucket
    /// never rises above its capacity. (A success after retries deposits nothing: its failed
    /// retries were charged, the one that succeeded was not.)
    pub(crate) fn record_first_attempt_success(&self) {
        let capacity = self.inner.config.capacity;
        let reward = self.inner.config.success_reward;
        // A full bucket (the usual case) is only read: no write to a line every core shares.
        if self.inner.tokens.load(Ordering::Relaxed) >= capacity {
            return;
        }
        // `fetch_update` with a closure that always returns `Some` cannot fail.
        let _ = self
            .inner
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(now.saturating_add(reward).min(capacity))
            });
    }
}

/// One operation's dealings with the budget, kept by the attempt loop: whether a retry was
/// admitted and not yet sent, whether one is in flight (so its failure is charged when the
/// loop learns of it), and whether the operation retried at all (a first-attempt success
/// deposits). An operation dropped while a retry it sent is in flight is charged for it, as a
/// failure: its outcome will never be known, and an outage must stay bounded even when callers
/// give up first.
#[derive(Debug)]
pub(crate) struct BudgetTab<'b> {
    budget: Option<&'b RetryBudget>,
    admitted: bool,
    in_flight: bool,
    retried: bool,
}

impl<'b> BudgetTab<'b> {
    /// A tab with `budget`, or with none (every retry goes ahead).
    pub(crate) fn new(budget: Option<&'b RetryBudget>) -> Self {
        BudgetTab {
            budget,
            admitted: false,
            in_flight: false,
            retried: false,
        }
    }

    /// Learns how the attempt just made ended (from `decide`'s decision about it), charges it
    /// if it was a retry that failed, and asks the budget to admit the retry `decide` chose: a
    /// refusal turns the decision into a stop.
    pub(crate) fn admit(&mut self, decision: Decision) -> Decision {
        let Some(budget) = self.budget else {
            return decision;
        };
        let failed = match decision {
            Decision::Return => None,
            Decision::Retry { kind, .. } => Some(kind),
            Decision::Stop { kind, .. } => kind,
        };
        if std::mem::take(&mut self.in_flight)
            && let Some(kind) = failed
        {
            budget.charge_failed_retry(kind);
        }
        match decision {
            Decision::Retry { kind, .. } if !budget.try_admit(kind) => Decision::Stop {
                kind: Some(kind),
                stop: Stop::BudgetExhausted,
            },
            Decision::Retry { .. } => {
                self.admitted = true;
                decision
            }
            Decision::Return | Decision::Stop { .. } => decision,
        }
    }

    /// An attempt is being sent: if it is the retry admitted last, it is now in flight.
    pub(crate) fn sending(&mut self) {
        if std::mem::take(&mut self.admitted) {
            self.in_flight = true;
            self.retried = true;
        }
    }

    /// The attempt being sent was refused before it left (the transport says nothing was
    /// sent): it is not in flight and costs nothing.
    pub(crate) fn not_sent(&mut self) {
        self.in_flight = false;
    }

    /// The operation ends with a final answer; on its first attempt, that deposits the reward.
    pub(crate) fn settle_success(&mut self) {
        self.in_flight = false;
        if let (Some(budget), false) = (self.budget, self.retried) {
            budget.record_first_attempt_success();
        }
    }
}

impl Drop for BudgetTab<'_> {
    fn drop(&mut self) {
        if let (true, Some(budget)) = (self.in_flight, self.budget) {
            // The retry went out and its outcome will never be known: charged as a failure.
            budget.charge(budget.inner.config.retry_cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::outcome::report::WaitReason;

    fn retry(kind: FailureKind) -> Decision {
        Decision::Retry {
            kind,
            delay: Duration::from_millis(1),
            reason: WaitReason::Backoff {
                ceiling: Duration::from_millis(1),
            },
        }
    }

    fn refused(kind: FailureKind) -> Decision {
        Decision::Stop {
            kind: Some(kind),
            stop: Stop::BudgetExhausted,
        }
    }

    fn budget_of(capacity: u32) -> RetryBudget {
        RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(capacity)).expect("valid")
    }

    #[test]
    fn default_numbers_are_the_aws_standard_ones() {
        let config = RetryBudgetConfig::default();
        assert_eq!(config.capacity(), 500);
        assert_eq!(config.retry_cost(), 5);
        assert_eq!(config.timeout_cost(), 10);
        assert_eq!(config.success_reward(), 1);
        assert_eq!(RetryBudget::default().available(), 500);
        assert_eq!(RetryBudget::default().refused(), 0);
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

        assert_eq!(budget.charge_failed_retry(FailureKind::Timeout), 7);
        assert_eq!(budget.charge_failed_retry(FailureKind::ServerError), 3);
        assert_eq!(budget.available(), 10);
        budget.record_first_attempt_success();
        assert_eq!(budget.available(), 12, "a first-attempt success deposits 2");
    }

    #[test]
    fn admitting_takes_nothing_and_a_full_bucket_pays_for_one_hundred_failed_retries() {
        let budget = RetryBudget::new();
        for _ in 0..1_000 {
            assert!(budget.try_admit(FailureKind::ServerError));
        }
        assert_eq!(budget.available(), 500, "admitting takes nothing");
        let mut failed = 0;
        while budget.try_admit(FailureKind::ServerError) {
            budget.charge_failed_retry(FailureKind::ServerError);
            failed += 1;
            assert!(failed <= 100, "the bucket never refused");
        }
        assert_eq!(failed, 100);
        assert_eq!(budget.available(), 0);
        assert!(!budget.try_admit(FailureKind::Connect));
        assert_eq!(budget.refused(), 2, "each refusal is counted");
    }

    #[test]
    fn timeouts_cost_double_and_need_double_to_be_admitted() {
        let budget = budget_of(14);
        assert!(budget.try_admit(FailureKind::Timeout));
        assert_eq!(budget.charge_failed_retry(FailureKind::Timeout), 10);
        assert_eq!(budget.available(), 4);
        assert!(!budget.try_admit(FailureKind::Timeout));
        assert!(!budget.try_admit(FailureKind::ServerError));
        budget.record_first_attempt_success();
        assert!(budget.try_admit(FailureKind::ServerError));
        assert!(!budget.try_admit(FailureKind::Timeout));
        assert_eq!(budget.refused(), 3);
    }

    #[test]
    fn the_level_stops_at_zero_and_deposits_at_the_capacity() {
        let budget = budget_of(12);
        budget.record_first_attempt_success();
        assert_eq!(budget.available(), 12, "never above capacity");
        budget.charge_failed_retry(FailureKind::Timeout);
        budget.charge_failed_retry(FailureKind::Timeout);
        assert_eq!(budget.available(), 0, "never below zero");
        for _ in 0..4 {
            budget.record_first_attempt_success();
        }
        assert!(!budget.try_admit(FailureKind::ServerError));
        budget.record_first_attempt_success();
        assert!(budget.try_admit(FailureKind::ServerError));
    }

    #[test]
    fn clones_share_one_bucket_and_one_counter() {
        let a = budget_of(10);
        let b = a.clone();
        a.charge_failed_retry(FailureKind::ServerError);
        assert_eq!(b.available(), 5);
        a.charge_failed_retry(FailureKind::ServerError);
        assert!(!a.try_admit(FailureKind::Throttled));
        assert_eq!(b.refused(), 1);
        let debug = format!("{b:?}");
        assert!(
            debug.contains("available: 0") && debug.contains("refused: 1"),
            "{debug}"
        );
    }

    #[test]
    fn a_conflict_in_progress_is_free_and_an_empty_bucket_still_admits_it() {
        let budget = budget_of(10);
        budget.charge_failed_retry(FailureKind::Timeout);
        assert_eq!(budget.available(), 0);
        assert!(!budget.try_admit(FailureKind::ServerError));
        // The server is answering: waiting out our own first attempt is not outage load.
        assert!(budget.try_admit(FailureKind::InProgress));
        assert_eq!(budget.charge_failed_retry(FailureKind::InProgress), 0);
        assert_eq!(budget.available(), 0);
        assert_eq!(budget.refused(), 1);
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
    fn a_tab_charges_a_retry_by_how_it_failed_and_never_one_that_succeeded() {
        let budget = budget_of(30);
        let mut tab = BudgetTab::new(Some(&budget));
        // The first attempt failed: not a retry, nothing charged.
        assert_eq!(
            tab.admit(retry(FailureKind::Timeout)),
            retry(FailureKind::Timeout)
        );
        tab.sending();
        assert_eq!(budget.available(), 30);
        // The retry timed out: 10.
        let decision = retry(FailureKind::ServerError);
        assert_eq!(
            tab.admit(retry(FailureKind::Timeout)),
            retry(FailureKind::Timeout)
        );
        assert_eq!(budget.available(), 20);
        tab.sending();
        // The next one met a 503: 5.
        assert_eq!(tab.admit(decision), decision);
        assert_eq!(budget.available(), 15);
        tab.sending();
        // The last one answered: nothing, and a success after retries deposits nothing.
        assert_eq!(tab.admit(Decision::Return), Decision::Return);
        tab.settle_success();
        drop(tab);
        assert_eq!(budget.available(), 15);

        // A first-attempt success deposits the reward.
        let mut tab = BudgetTab::new(Some(&budget));
        tab.sending();
        assert_eq!(tab.admit(Decision::Return), Decision::Return);
        tab.settle_success();
        assert_eq!(budget.available(), 16);
        assert_eq!(budget.refused(), 0);
    }

    #[test]
    fn a_tab_turns_a_refused_retry_into_a_stop_after_charging_the_retry_that_failed() {
        let budget = budget_of(10);
        let mut tab = BudgetTab::new(Some(&budget));
        tab.sending();
        assert_eq!(
            tab.admit(retry(FailureKind::Timeout)),
            retry(FailureKind::Timeout)
        );
        tab.sending();
        // The retry timed out: charged 10, which empties the bucket, so the next is refused.
        assert_eq!(
            tab.admit(retry(FailureKind::Timeout)),
            refused(FailureKind::Timeout)
        );
        assert_eq!(budget.available(), 0);
        assert_eq!(budget.refused(), 1);
        drop(tab);
        assert_eq!(budget.available(), 0, "nothing in flight at the end");

        let mut off = BudgetTab::new(None);
        assert_eq!(
            off.admit(retry(FailureKind::Timeout)),
            retry(FailureKind::Timeout)
        );
    }

    #[test]
    fn a_stop_after_a_failed_retry_still_charges_it() {
        let budget = budget_of(10);
        let mut tab = BudgetTab::new(Some(&budget));
        tab.sending();
        let _ = tab.admit(retry(FailureKind::ServerError));
        tab.sending();
        let exhausted = Decision::Stop {
            kind: Some(FailureKind::ServerError),
            stop: Stop::Exhausted,
        };
        assert_eq!(tab.admit(exhausted), exhausted);
        assert_eq!(budget.available(), 5);
        assert_eq!(budget.refused(), 0);
    }

    #[test]
    fn a_retry_dropped_in_flight_is_charged_and_one_never_sent_is_not() {
        let budget = RetryBudget::new();
        for _ in 0..300 {
            let mut tab = BudgetTab::new(Some(&budget));
            tab.sending();
            let _ = tab.admit(retry(FailureKind::ServerError));
            // The caller gives up during the wait.
            drop(tab);
        }
        assert_eq!(budget.available(), 500);
        // A retry that went out and whose caller gave up before it answered is a failure.
        let mut tab = BudgetTab::new(Some(&budget));
        tab.sending();
        let _ = tab.admit(retry(FailureKind::InProgress));
        tab.sending();
        drop(tab);
        assert_eq!(budget.available(), 495);
        // One the transport refused before it left is not.
        let mut tab = BudgetTab::new(Some(&budget));
        tab.sending();
        let _ = tab.admit(retry(FailureKind::ServerError));
        tab.sending();
        tab.not_sent();
        drop(tab);
        assert_eq!(budget.available(), 495);
    }

    #[test]
    fn a_blip_across_a_thousand_operations_in_flight_costs_nothing() {
        let budget = RetryBudget::new();
        let mut tabs: Vec<BudgetTab<'_>> =
            (0..1_000).map(|_| BudgetTab::new(Some(&budget))).collect();
        for tab in &mut tabs {
            tab.sending();
            assert_eq!(
                tab.admit(retry(FailureKind::ConnectionReset)),
                retry(FailureKind::ConnectionReset)
            );
            tab.sending();
        }
        // Every retry is in flight at once; then every one answers.
        for tab in &mut tabs {
            assert_eq!(tab.admit(Decision::Return), Decision::Return);
            tab.settle_success();
        }
        drop(tabs);
        assert_eq!(budget.available(), 500);
        assert_eq!(budget.refused(), 0);
    }

    #[test]
    fn concurrent_charges_never_go_below_zero_or_admit_after_the_drain() {
        let budget = RetryBudget::new();
        let failed: usize = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let budget = budget.clone();
                    scope.spawn(move || {
                        let mut failed = 0;
                        while budget.try_admit(FailureKind::ServerError) {
                            budget.charge_failed_retry(FailureKind::ServerError);
                            failed += 1;
                        }
                        failed
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .sum()
        });
        // Each thread has at most one admitted retry not yet charged when the bucket empties.
        assert!((100..=103).contains(&failed), "{failed} failed retries");
        assert_eq!(budget.available(), 0);
        assert_eq!(budget.refused(), 4);
    }

    fn any_kind() -> impl Strategy<Value = FailureKind> {
        prop_oneof![
            Just(FailureKind::Timeout),
            Just(FailureKind::ServerError),
            Just(FailureKind::Throttled),
            Just(FailureKind::ConnectionReset),
            Just(FailureKind::InProgress),
        ]
    }

    proptest! {
        /// Whatever happens, the level stays within [0, capacity], and it moves by exactly
        /// the charges and deposits that fit.
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
            for event in events {
                let before = budget.available();
                match event {
                    Some(kind) => {
                        prop_assert_eq!(
                            budget.try_admit(kind),
                            before >= config.cost_of(kind)
                        );
                        prop_assert_eq!(budget.available(), before, "admitting takes nothing");
                        let cost = budget.charge_failed_retry(kind);
                        prop_assert_eq!(cost, config.cost_of(kind));
                        prop_assert_eq!(budget.available(), before.saturating_sub(cost));
                    }
                    None => {
                        budget.record_first_attempt_success();
                        prop_assert_eq!(
                            budget.available(),
                            (before + config.success_reward()).min(capacity)
                        );
                    }
                }
            }
        }

        /// A total outage at any concurrency: `ops` operations of up to `attempts` attempts,
        /// `in_flight` at a time, stepped in any order. Every attempt fails; the retries sent
        /// stay within what a full bucket pays for plus one per operation in flight.
        #[test]
        fn prop_an_outage_sends_at_most_the_bucket_plus_one_retry_per_operation_in_flight(
            capacity in 10u32..600,
            ops in 1usize..400,
            in_flight in 1usize..300,
            attempts in 2u32..8,
            kind in any_kind().prop_filter("charged", |k| *k != FailureKind::InProgress),
            order in proptest::collection::vec(any::<prop::sample::Index>(), 4_000),
        ) {
            let config = RetryBudgetConfig::new().with_capacity(capacity);
            let budget = RetryBudget::with_config(config).expect("valid");
            // (tab, attempts sent); operations start as slots free up.
            let mut running: Vec<(BudgetTab<'_>, u32)> = Vec::new();
            let (mut started, mut retries) = (0usize, 0u64);
            let mut order = order.into_iter();
            while started < ops || !running.is_empty() {
                while running.len() < in_flight && started < ops {
                    let mut tab = BudgetTab::new(Some(&budget));
                    tab.sending();
                    running.push((tab, 1));
                    started += 1;
                }
                // The next attempt to come back, in the order drawn (then oldest first).
                let i = order.next().map_or(0, |ix| ix.index(running.len()));
                let (tab, sent) = &mut running[i];
                let decision = if *sent < attempts {
                    retry(kind)
                } else {
                    Decision::Stop { kind: Some(kind), stop: Stop::Exhausted }
                };
                match tab.admit(decision) {
                    Decision::Retry { .. } => {
                        tab.sending();
                        *sent += 1;
                        retries += 1;
                    }
                    _ => {
                        running.swap_remove(i);
                    }
                }
            }
            let bucket = u64::from(capacity / config.cost_of(kind));
            prop_assert!(
                retries <= bucket + in_flight.min(ops) as u64,
                "{} retries; bucket {}, in flight {}", retries, bucket, in_flight
            );
        }
    }
}
