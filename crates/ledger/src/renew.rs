//! A lease renewed by the run that holds it, while the run is alive: the write that lets a
//! lease be short (seconds) without a live run ever losing its key.

use std::time::SystemTime;

use crate::{LedgerError, OperationRecord, require};

/// A lease to extend, by the run holding it.
///
/// A run renews its lease on its own timer (during an attempt, a wait, the finish), so the
/// lease's length says how soon a dead run's key is taken over, not how long a request may
/// take.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Renew {
    /// The idempotency key.
    pub key: String,
    /// The run's lease token.
    pub owner: String,
    /// When the renewal was asked for.
    pub at: SystemTime,
    /// The lease's new end.
    pub lease_until: SystemTime,
}

impl Renew {
    /// The lease of `key`, held by the run with lease token `owner`, renewed at `at` until
    /// `lease_until`.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::InvalidInput`](crate::LedgerErrorKind::InvalidInput) when the key or
    /// the lease token is empty, or when the lease would end before the renewal.
    pub fn new(
        key: impl Into<String>,
        owner: impl Into<String>,
        at: SystemTime,
        lease_until: SystemTime,
    ) -> Result<Self, LedgerError> {
        let renew = Renew {
            key: key.into(),
            owner: owner.into(),
            at,
            lease_until,
        };
        require("the key", &renew.key)?;
        require("the lease token", &renew.owner)?;
        if renew.lease_until < renew.at {
            return Err(LedgerError::invalid(format!(
                "the renewed lease of operation {} ends before its renewal",
                renew.key
            )));
        }
        Ok(renew)
    }

    /// Writes this renewal to `row` as [`Ledger::renew`](crate::Ledger::renew) describes, if
    /// this run holds the lease: `lease_expires_at` = [`lease_until`](Self::lease_until),
    /// nothing else.
    ///
    /// A lease that lapsed but that no other run took is still this run's
    /// ([`OperationRecord::check_held_by`]): renewing it is how a run that was slowed past its
    /// lease keeps its key.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::LeaseLost`](crate::LedgerErrorKind::LeaseLost) when the run does not
    /// hold the lease; the row is unchanged.
    pub fn apply(&self, row: &mut OperationRecord) -> Result<(), LedgerError> {
        row.check_held_by(&self.key, &self.owner)?;
        row.lease_expires_at = Some(self.lease_until);
        Ok(())
    }
}
