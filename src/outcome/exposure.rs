//! Whether an operation may have run: the outcome-unknown rule, in one place.
//!
//! An operation that ends without a final answer is *outcome unknown* when the receiver may have
//! executed it: some attempt of this run may have reached it and run (a timeout after sending,
//! a reset, a 5xx: [`FailureKind::may_have_executed`]), an attempt was on its way when the run
//! was abandoned, or an earlier run recorded in the ledger left it unresolved. Otherwise (only
//! connect and DNS failures, a refusal before sending) it is *definitely not done*. The engine
//! reports each attempt here; the error flags and the ledger's status are read from here.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::outcome::error::Error;
use crate::rules::classify::FailureKind;

/// What is known, so far, of whether one operation may have been executed.
///
/// Shared between the attempt loop, which reports each attempt, and the ledger's run, which
/// reads it when the run is abandoned mid-flight; atomics, so both can hold it across awaits.
#[derive(Debug, Default)]
pub(crate) struct Exposure {
    /// An earlier run left the operation unresolved.
    earlier: bool,
    /// An attempt of an earlier run reached a receiver.
    earlier_reached: bool,
    /// An attempt of this run reached a receiver (it was answered, or failed in a way that
    /// does not prove it never left: anything but a refused connect or a failed lookup).
    reached: AtomicBool,
    /// An attempt of this run may have been executed.
    executed: AtomicBool,
    /// An attempt is on its way: if the run ends now, it may have arrived.
    sending: AtomicBool,
}

impl Exposure {
    /// A run that follows earlier ones; `unresolved` when they may have executed the
    /// operation (the ledger's [`OperationStatus::is_unresolved`](crate::ledger::OperationStatus::is_unresolved)),
    /// `reached` when one of their attempts reached a receiver (any status but `NotSent`).
    pub(crate) fn after(unresolved: bool, reached: bool) -> Self {
        Exposure {
            earlier: unresolved,
            earlier_reached: reached || unresolved,
            ..Exposure::default()
        }
    }

    /// An attempt is being sent.
    pub(crate) fn sending(&self) {
        self.sending.store(true, Ordering::Relaxed);
    }

    /// The attempt being sent failed this way.
    pub(crate) fn failed(&self, kind: FailureKind) {
        self.sending.store(false, Ordering::Relaxed);
        if kind.may_have_executed() {
            self.executed.store(true, Ordering::Relaxed);
        }
        if !kind.never_sent() {
            self.reached.store(true, Ordering::Relaxed);
        }
    }

    /// The attempt was refused before anything went out (a malformed request).
    pub(crate) fn not_sent(&self) {
        self.sending.store(false, Ordering::Relaxed);
    }

    /// The attempt being sent got a response, judged by its status: `None` when it is the
    /// operation's final answer (the receiver has dealt with the operation), else the kind it
    /// was classified as (a 503 may have run, a 429 did not).
    pub(crate) fn answered(&self, retryable: Option<FailureKind>) {
        self.sending.store(false, Ordering::Relaxed);
        self.reached.store(true, Ordering::Relaxed);
        if retryable.is_none_or(FailureKind::may_have_executed) {
            self.executed.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the operation may have been executed (by this run or an earlier one).
    pub(crate) fn is_unknown(&self) -> bool {
        self.earlier
            || self.executed.load(Ordering::Relaxed)
            || self.sending.load(Ordering::Relaxed)
    }

    /// Whether an attempt of this run or an earlier one reached a receiver, or may have: an
    /// attempt on its way counts, since it may arrive.
    pub(crate) fn reached(&self) -> bool {
        self.is_unknown() || self.earlier_reached || self.reached.load(Ordering::Relaxed)
    }

    /// Marks `err` outcome unknown when the operation may have been executed, whatever raised
    /// the error (an earlier run may have run it even if nothing of this run could).
    pub(crate) fn mark(&self, err: &mut Error) {
        if self.is_unknown() {
            err.mark_outcome_unknown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_attempts_that_never_left_keep_an_operation_definitely_not_done() {
        let fresh = Exposure::default();
        assert!(!fresh.is_unknown());
        fresh.sending();
        assert!(fresh.is_unknown(), "an attempt on its way may arrive");
        fresh.failed(FailureKind::Connect);
        assert!(!fresh.is_unknown(), "a refused connect never left");
        fresh.sending();
        fresh.failed(FailureKind::Timeout);
        assert!(fresh.is_unknown());
        fresh.sending();
        fresh.failed(FailureKind::Dns);
        assert!(fresh.is_unknown(), "once unknown, always unknown");

        let answered = Exposure::default();
        answered.sending();
        answered.answered(Some(FailureKind::Throttled));
        assert!(!answered.is_unknown(), "a 429 did not run");
        assert!(answered.reached(), "but its receiver saw the key");
        answered.sending();
        answered.answered(Some(FailureKind::ServerError));
        assert!(answered.is_unknown(), "a 5xx may have run");
        let done = Exposure::default();
        done.sending();
        done.answered(None);
        assert!(
            done.is_unknown(),
            "a final answer: the receiver dealt with it"
        );
    }

    #[test]
    fn an_earlier_run_that_reached_a_receiver_is_remembered() {
        assert!(!Exposure::after(false, false).reached());
        assert!(Exposure::after(false, true).reached());
        assert!(
            Exposure::after(true, false).reached(),
            "unresolved: it may have"
        );
    }

    #[test]
    fn an_unresolved_earlier_run_makes_every_later_end_unknown() {
        for earlier in [true, false] {
            let run = Exposure::after(earlier, earlier);
            assert_eq!(run.is_unknown(), earlier);
            let mut err = Error::builder("refused before sending");
            run.mark(&mut err);
            assert_eq!(err.is_outcome_unknown(), earlier);
        }
    }
}
