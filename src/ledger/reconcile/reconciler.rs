//! [`Reconciler`]: who finds out what happened to an operation whose outcome is unknown, and
//! the two that need no server of their own: [`reconcile_fn`] (a closure) and [`SendAgain`]
//! (for receivers that keep keys longer than the window). The HTTP probe is in `probe.rs`;
//! when and under which lease a reconciler is asked is in `reconcile.rs`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::ledger::{OperationRecord, Resolution};

/// A boxed, `Send` future of a [`Reconciler`]'s answer.
pub type ReconcileFuture<'a> = Pin<Box<dyn Future<Output = Resolution> + Send + 'a>>;

/// Finds out what happened to an operation whose outcome is unknown: asks the receiver (an
/// HTTP lookup, [`HttpProbe`](crate::ledger::reconcile::HttpProbe)), another system, or a person, and answers
/// with a [`Resolution`].
///
/// It is consulted while the operation's row is held under a lease, as a run holds it, so no
/// run sends the key and no other reconciler asks about it meanwhile: by a run that finds the
/// row unresolved after its reconcile window (before answering
/// [`ErrorKind::ReconcileWindow`](crate::ErrorKind::ReconcileWindow)), by
/// [`Client::reconcile`](crate::Client::reconcile) and by
/// [`Client::reconcile_unresolved`](crate::Client::reconcile_unresolved). Set one per client
/// ([`ClientBuilder::reconciler`](crate::ClientBuilder::reconciler)) and per scope
/// ([`ClientBuilder::reconciler_for_scope`](crate::ClientBuilder::reconciler_for_scope)).
///
/// The answer must be finished within the hold (the policy's attempt timeout plus
/// [`LedgerOptions::lease`](crate::ledger::LedgerOptions::lease)); after that another run
/// may take the row, and a late answer is refused and counted as failed. A call dropped while
/// its reconciler runs (a caller's timeout around `send`) leaves the hold to lapse the same
/// way, and the row as it was. A reconciler that
/// cannot tell (the lookup failed, timed out, or says nothing) answers
/// [`Resolution::Unknown`]: never guess `NotDone`, which lets the operation be sent again.
pub trait Reconciler: Send + Sync + fmt::Debug + 'static {
    /// What happened to `operation` (its row, as the lease holder sees it: key, scope,
    /// method, URL, fingerprint, attempts, first and last attempt times, status).
    fn reconcile<'a>(&'a self, operation: &'a OperationRecord) -> ReconcileFuture<'a>;

    /// The name recorded with a resolution (`resolved_by`), with the worker's.
    fn name(&self) -> &str;
}

/// A [`Reconciler`] from a closure that takes the row and returns a future of the answer:
/// see [`reconcile_fn`].
pub struct ReconcileFn<F> {
    name: String,
    f: F,
}

impl<F> fmt::Debug for ReconcileFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileFn")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A [`Reconciler`] named `name` that calls `f` with a copy of the operation's row.
///
/// # Examples
///
/// ```
/// use idempotent_retry::Client;
/// use idempotent_retry::ledger::MemoryLedger;
/// use idempotent_retry::reconcile::{reconcile_fn, Resolution};
///
/// // Charges are looked up in our own payments table, by key.
/// let client = Client::builder()
///     .ledger(MemoryLedger::new())
///     .reconciler_for_scope(
///         "payments.charge",
///         reconcile_fn("payments-table", |operation| async move {
///             let found = operation.key.starts_with("order-"); // your lookup here
///             if found { Resolution::NotDone } else { Resolution::Unknown }
///         }),
///     )
///     .build()?;
/// # Ok::<(), idempotent_retry::Error>(())
/// ```
pub fn reconcile_fn<F, Fut>(name: impl Into<String>, f: F) -> ReconcileFn<F>
where
    F: Fn(OperationRecord) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Resolution> + Send + 'static,
{
    ReconcileFn {
        name: name.into(),
        f,
    }
}

impl<F, Fut> Reconciler for ReconcileFn<F>
where
    F: Fn(OperationRecord) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Resolution> + Send + 'static,
{
    fn reconcile<'a>(&'a self, operation: &'a OperationRecord) -> ReconcileFuture<'a> {
        Box::pin((self.f)(operation.clone()))
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// The "retry with the same key" reconciler, for receivers whose key retention outlasts the
/// reconcile window (Stripe v2's 30 days against a 24 h window, say): every unknown outcome is
/// answered [`Resolution::SendAgain`], so the next run sends the request again with the same
/// key in a new window, and the receiver replays its saved answer if the first one ran.
///
/// Use it only where the receiver still holds the key when the new window ends: a key it has
/// forgotten makes the resend a new operation.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct SendAgain;

impl SendAgain {
    /// The reconciler.
    #[must_use]
    pub const fn new() -> Self {
        SendAgain
    }
}

impl Reconciler for SendAgain {
    fn reconcile<'a>(&'a self, _operation: &'a OperationRecord) -> ReconcileFuture<'a> {
        Box::pin(std::future::ready(Resolution::SendAgain))
    }

    fn name(&self) -> &str {
        "send-again"
    }
}
