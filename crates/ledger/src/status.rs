//! Where an operation stands in the ledger: the row statuses, and what each says about
//! whether a receiver has seen the key and whether the operation may have run.

use std::fmt;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OperationStatus {
    /// Claimed: a worker holds the lease and is sending it (or died doing so, and the lease
    /// will expire).
    InFlight,
    /// A final response below 400 arrived; it is saved and replayed instead of sending again.
    /// A 301, 302, 307 or 308 left unfollowed (the redirect policy refused the hop) is not
    /// one: that server ran nothing.
    Succeeded,
    /// The last run ended with a final answer of 400 or more or an unfollowed redirect, or
    /// stopped when no attempt of any run can have been executed though one reached a
    /// receiver (a 429 or 408 to the end, a resolution of not done). A later run with the same
    /// request sends it again; a different request under the key is refused.
    FailedFinal,
    /// No attempt of any run reached a receiver (every one failed to connect or to resolve
    /// the host, or the run ended before its first attempt left): nobody has seen the key.
    /// The key is free: a later run sends its request under it, the same request or a
    /// corrected one (another URL, another body), with a new reconcile window, and the row
    /// keeps its attempt count. An operator frees a key by hand the same way
    /// (`reconcile::release_by_hand` in `idempotent-retry`).
    NotSent,
    /// A run stopped after an attempt that may have been executed (a timeout, a reset, a
    /// 5xx...). A later run goes on with the same key, inside the original window.
    Unknown,
    /// Enqueued in the caller's own transaction (the outbox) and not yet sent: the row holds
    /// the request, and a dispatcher sends it under its key once it is due. Nobody has seen
    /// the key. Only the same request takes it (a different one under the key is refused),
    /// with a window from its first attempt.
    Queued,
}

impl OperationStatus {
    /// Whether a run that left this status may have executed the operation without a final
    /// answer: [`Unknown`](Self::Unknown), or [`InFlight`](Self::InFlight) (a run that died or
    /// is still sending). A later run's errors are then outcome unknown too.
    #[must_use]
    pub const fn is_unresolved(self) -> bool {
        matches!(self, OperationStatus::Unknown | OperationStatus::InFlight)
    }

    /// The status a run that ends without a final answer leaves: `Unknown` when the operation
    /// may have run (`unknown`), `FailedFinal` when it certainly did not but some attempt
    /// reached a receiver (`reached`), `NotSent` when none did.
    #[must_use]
    pub const fn unfinished(unknown: bool, reached: bool) -> Self {
        if unknown {
            OperationStatus::Unknown
        } else if reached {
            OperationStatus::FailedFinal
        } else {
            OperationStatus::NotSent
        }
    }

    /// Whether a receiver may have seen the key under this status: every status but
    /// [`NotSent`](Self::NotSent) and [`Queued`](Self::Queued).
    #[must_use]
    pub const fn reached_a_receiver(self) -> bool {
        !matches!(self, OperationStatus::NotSent | OperationStatus::Queued)
    }

    /// The name stored in the `status` column.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            OperationStatus::InFlight => "in_flight",
            OperationStatus::Succeeded => "succeeded",
            OperationStatus::FailedFinal => "failed_final",
            OperationStatus::Unknown => "unknown",
            OperationStatus::NotSent => "not_sent",
            OperationStatus::Queued => "queued",
        }
    }
}

impl fmt::Display for OperationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
