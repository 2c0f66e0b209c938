//! The dispatcher: reads the operations that are due from the client's ledger and sends each
//! through the client under its stored key, a bounded number at once, until told to stop.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Stream};
use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::sync::Notify;

use crate::client::Client;
use crate::keys::key::IdempotencyKey;
use crate::ledger::LedgerError;
use crate::ledger::outbox::{Backlog, DueQuery, QueuedOperation, TakeDue, Taken};
use crate::ledger::{Finish, HeldRow, LedgerHandle, OperationStatus};
use crate::outcome::error::{Error, ErrorKind};
use crate::outcome::operation_outcome::Outcome;
use crate::outcome::report::RetryReport;
use crate::telemetry::metrics;

/// Headers added to an operation at send time (its credentials).
type HeaderSource = Arc<dyn Fn(&QueuedOperation) -> HeaderMap + Send + Sync>;
/// Run after an operation's outcome is written.
type OutcomeHook = Arc<dyn Fn(&Delivery) + Send + Sync>;

/// How one queued operation's send ended, as the ledger recorded it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// Its idempotency key.
    pub key: String,
    /// Its ledger scope.
    pub scope: String,
    /// Done (with the final status), not done, or unknown (then the reconcilers resolve it).
    pub outcome: Outcome,
    /// Whether the answer was the ledger's, nothing sent (another dispatcher, or the caller,
    /// had sent it).
    pub replayed: bool,
    /// Why it ended without a final answer, for people.
    pub error: Option<String>,
    /// The error's kind, when it ended with one.
    pub error_kind: Option<ErrorKind>,
}

/// What one pass of [`Dispatcher::dispatch_due`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DispatchPass {
    /// Operations found due and sent (or answered from the ledger).
    pub due: usize,
    /// Ended with a final answer.
    pub done: usize,
    /// Ended certainly not done (no attempt can have run; sent again later when no receiver
    /// saw it).
    pub not_done: usize,
    /// Ended with the outcome unknown: the reconcilers' now.
    pub unknown: usize,
}

/// Sends the operations queued through the outbox ([`Enqueue`](super::Enqueue)) once their
/// transactions have committed: each under its stored key, through the client (its policy,
/// retry budget, `Retry-After`, window and ledger), the outcome written to its row.
///
/// Any number of dispatchers, in one process or many, may share a ledger: each takes the
/// rows it sends in one statement ([`Ledger::take_due`](crate::ledger::Ledger::take_due)),
/// holding each under its lease, so one row is sent by one dispatcher at a time; a row whose
/// dispatcher died is taken again once its lease lapses. A dispatcher reads ahead: it holds
/// up to twice its concurrency, the rows beyond its sends waiting for the next free slot while
/// the next read runs (a row that waits a third of its lease is given back as it was). Most reads ask for queued rows
/// alone; the rows under a lapsed lease, `not_sent` and unknown are read too by a pass's first
/// read, by the read after one that found the queued rows short, and at least once a second.
///
/// # Defaults
///
/// | setting | default |
/// |---|---|
/// | [`batch`](Self::batch) | 256 rows taken per [`dispatch_due`](Self::dispatch_due) pass |
/// | [`concurrency`](Self::concurrency) | 16 sends at once |
/// | [`idle_poll`](Self::idle_poll) | 1 s, once nothing is due and nothing in flight |
/// | [`not_sent_after`](Self::not_sent_after) | 30 s |
/// | [`resend_unknown_after`](Self::resend_unknown_after) | never |
/// | [`headers_for`](Self::headers_for) | none: the client's default headers only |
/// | [`on_outcome`](Self::on_outcome) | none |
#[derive(Clone)]
pub struct Dispatcher {
    client: Client,
    batch: u32,
    concurrency: usize,
    idle_poll: Duration,
    headers_for: Option<HeaderSource>,
    on_outcome: Option<OutcomeHook>,
    wake: Arc<Notify>,
    not_sent_after: Duration,
    unknown_after: Option<Duration>,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("batch", &self.batch)
            .field("concurrency", &self.concurrency)
            .field("idle_poll", &self.idle_poll)
            .field("not_sent_after", &self.not_sent_after)
            .field("resend_unknown_after", &self.unknown_after)
            .field("headers_for", &self.headers_for.is_some())
            .field("on_outcome", &self.on_outcome.is_some())
            .finish_non_exhaustive()
    }
}

impl Dispatcher {
    /// A dispatcher sending through `client`, whose ledger holds the queue.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Builder`] when the client has no ledger.
    pub fn new(client: Client) -> Result<Dispatcher, Error> {
        if client.ledger().is_none() {
            return Err(Error::builder(
                "a Dispatcher sends the operations queued in a ledger: build the client with \
                 ClientBuilder::ledger (the SqliteLedger or PostgresLedger the operations \
                 were queued in)",
            ));
        }
        Ok(Dispatcher {
            client,
            batch: 256,
            concurrency: 16,
            idle_poll: Duration::from_secs(1),
            headers_for: None,
            on_outcome: None,
            wake: Arc::new(Notify::new()),
            not_sent_after: Duration::from_secs(30),
            unknown_after: None,
        })
    }

    /// At most this many rows taken by one [`dispatch_due`](Self::dispatch_due) pass (at
    /// least 1). Default: 256.
    #[must_use]
    pub fn batch(mut self, rows: u32) -> Self {
        self.batch = rows.max(1);
        self
    }

    /// At most this many sends at once (at least 1). Default: 16.
    #[must_use]
    pub fn concurrency(mut self, sends: usize) -> Self {
        self.concurrency = sends.max(1);
        self
    }

    /// How long [`run_until`](Self::run_until) waits once nothing is due and nothing is in
    /// flight, unless [`waker`](Self::waker) is notified first. Default: 1 s.
    #[must_use]
    pub fn idle_poll(mut self, wait: Duration) -> Self {
        self.idle_poll = wait;
        self
    }

    /// How long after its last attempt an operation no receiver saw (every attempt failed to
    /// connect, or an operator released it) is sent again. Default: 30 s.
    #[must_use]
    pub fn not_sent_after(mut self, wait: Duration) -> Self {
        self.not_sent_after = wait;
        self
    }

    /// Sends an operation whose outcome is unknown again under its key, this long after its
    /// last attempt, as the client's own retries would: for a receiver that keeps its keys at
    /// least as long as the client's reconcile window (Stripe's keep them 24 hours), so the
    /// send is answered from its store if the first one ran. Past the window the client
    /// refuses (`ReconcileWindow`) and the row stays unknown. Default: never (unknown outcomes
    /// are the reconcilers', `Client::reconcile_unresolved`).
    #[must_use]
    pub fn resend_unknown_after(mut self, wait: Duration) -> Self {
        self.unknown_after = Some(wait);
        self
    }

    /// Headers added to each operation at send time: its credentials, which the ledger never
    /// stores (`Authorization` for its scope, say). They replace stored headers of the same
    /// name. Default: none.
    #[must_use]
    pub fn headers_for(
        mut self,
        source: impl Fn(&QueuedOperation) -> HeaderMap + Send + Sync + 'static,
    ) -> Self {
        self.headers_for = Some(Arc::new(source));
        self
    }

    /// Run after each operation's outcome is written to the ledger (so a hook that fails or
    /// a process that dies in it loses nothing: the row says what happened). Default: none.
    #[must_use]
    pub fn on_outcome(mut self, hook: impl Fn(&Delivery) + Send + Sync + 'static) -> Self {
        self.on_outcome = Some(Arc::new(hook));
        self
    }

    /// Wakes [`run_until`](Self::run_until) from its idle wait: notify it after a commit
    /// that queued something, or from a PostgreSQL `LISTEN` on
    /// `idempotent_retry_queued` (`outbox::postgres::listen`, feature `postgres`).
    #[must_use]
    pub fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// One pass: the rows due now, taken in reads of several rows (so each row sent is
    /// already this dispatcher's: no send pays a claim of its own), the next read made while
    /// the rows taken ahead wait for a slot, and sent through the client, at most
    /// [`concurrency`](Self::concurrency) at once, until none is due or a
    /// [`batch`](Self::batch) has been taken. Returns when every send has ended.
    /// Dropping the future abandons the sends in progress: each gives its lease back at once,
    /// its row left not sent (sent again 30 s later) or unknown (for the reconcilers); rows
    /// taken ahead are given back as they were; rows of a read still in progress are taken
    /// again when their lease lapses.
    ///
    /// # Errors
    ///
    /// The ledger's error when the first read fails (nothing was sent). A later read that
    /// fails ends the pass once the sends in progress have ended.
    pub async fn dispatch_due(&self) -> Result<DispatchPass, LedgerError> {
        let mut pump = Pump::new(self);
        let cap = usize::try_from(self.batch).unwrap_or(usize::MAX);
        loop {
            let left = cap.saturating_sub(pump.pass.due);
            if !pump.step(left).await? {
                return Ok(pump.pass);
            }
        }
    }

    /// How many operations wait (queued, not yet taken) and how long the oldest has waited.
    /// With the feature `metrics`, [`run_until`](Self::run_until) reads it whenever it goes
    /// idle and when it stops, for the gauges `idempotent_retry.outbox.queued` and
    /// `idempotent_retry.outbox.oldest_age`.
    ///
    /// # Errors
    ///
    /// The ledger's error when it cannot be read.
    pub async fn backlog(&self) -> Result<Backlog, LedgerError> {
        let Some(ledger) = self.client.ledger() else {
            return Ok(Backlog::default());
        };
        ledger
            .backlog(self.client.inner.settings.clock.wall())
            .await
    }

    /// Sends until `shutdown` completes: the due rows taken as slots free up (as
    /// [`dispatch_due`](Self::dispatch_due) does, without a pause between reads), and once
    /// none is due and nothing is in flight, a wait of [`idle_poll`](Self::idle_poll) or
    /// until the [`waker`](Self::waker) is notified. When `shutdown` completes, nothing more
    /// is taken, the rows taken ahead are given back as they were, and the sends in progress
    /// finish (each is bounded by the client's policy), so no lease is left behind.
    ///
    /// # Errors
    ///
    /// The ledger's error when a read fails with nothing in flight; the sends already made
    /// are written.
    pub async fn run_until(&self, shutdown: impl Future<Output = ()>) -> Result<(), LedgerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let mut pump = Pump::new(self);
        let mut stopping = false;
        loop {
            if !stopping && is_ready(shutdown.as_mut()).await {
                stopping = true;
                pump.give_back_ready().await;
            }
            let stepped = if stopping {
                pump.step(0).await
            } else {
                // A step is dropped safely between its events: the sends and the read it
                // waits on stay in the pump.
                let stop = {
                    let mut step = std::pin::pin!(pump.step(usize::MAX));
                    std::future::poll_fn(|cx| {
                        if let Poll::Ready(stepped) = step.as_mut().poll(cx) {
                            return Poll::Ready(Some(stepped));
                        }
                        if shutdown.as_mut().poll(cx).is_ready() {
                            return Poll::Ready(None);
                        }
                        Poll::Pending
                    })
                    .await
                };
                let Some(stepped) = stop else {
                    stopping = true;
                    pump.give_back_ready().await;
                    continue;
                };
                stepped
            };
            if stepped? {
                continue;
            }
            // Nothing in flight and no read pending.
            if stopping {
                self.gauges().await;
                return Ok(());
            }
            self.gauges().await;
            let mut idle = std::pin::pin!(self.client.inner.settings.sleeper.sleep(self.idle_poll));
            let mut woken = std::pin::pin!(self.wake.notified());
            let stop = std::future::poll_fn(|cx| {
                if shutdown.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(true);
                }
                if idle.as_mut().poll(cx).is_ready() || woken.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(false);
                }
                Poll::Pending
            })
            .await;
            if stop {
                return Ok(());
            }
            pump.more = true;
        }
    }

    /// The backlog gauges, with the feature `metrics`.
    async fn gauges(&self) {
        if metrics::OUTBOX_GAUGES {
            match self.backlog().await {
                Ok(backlog) => metrics::outbox_backlog(backlog.queued, backlog.oldest_age),
                Err(err) => tracing::warn!(
                    error = %err,
                    "could not read the outbox's backlog for its gauges"
                ),
            }
        }
    }

    /// What a take asks of the ledger: `limit` due rows, under a lease token of their own,
    /// by the client's lease, window and longest retention.
    fn take_of(&self, handle: &LedgerHandle, limit: usize, queued_only: bool) -> TakeDue {
        let settings = &self.client.inner.settings;
        let now = settings.clock.wall();
        let options = &handle.options;
        let window = self.client.policy().reconcile_window();
        let retention = options
            .scope_retention
            .values()
            .copied()
            .chain([options.retention])
            .max()
            .unwrap_or(options.retention)
            .max(window.saturating_mul(2));
        let query = DueQuery::new(now, u32::try_from(limit).unwrap_or(u32::MAX))
            .not_sent_after(self.not_sent_after)
            .unknown_after(self.unknown_after)
            .queued_only(queued_only);
        let owner = [options.worker.as_str(), IdempotencyKey::random().as_str()].join("/");
        TakeDue::new(query, owner, options.lease)
            .retention(retention)
            .window_cutoff(crate::ledger::window::cutoff(now, window))
    }
}

/// Whether `future` is ready now (polled once, without waiting).
async fn is_ready(future: std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
    let mut future = future;
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_ready())).await
}

/// What a read of due rows gave.
struct Took {
    taken: Result<Vec<Taken>, LedgerError>,
    /// The lease token its rows are held under.
    owner: String,
    /// How many rows it asked for: fewer found means what is due is drained.
    asked: usize,
    /// When its leases were set, at the latest (before the statement).
    set_at: tokio::time::Instant,
    /// Whether it asked for queued rows alone.
    queued_only: bool,
}

/// How long a dispatcher goes at most between reads of the rare due rows (under a lapsed
/// lease, `not_sent`, unknown): the reads between take queued rows alone, a statement
/// instead of four in SQLite. They are due seconds after their last attempt at the soonest
/// (a lease, [`Dispatcher::not_sent_after`]), so this adds at most this much to their wait.
const RARE_EVERY: Duration = Duration::from_secs(1);

/// A read of due rows in progress.
type PendingTake = std::pin::Pin<Box<dyn Future<Output = Took> + Send>>;

/// A dispatcher's sends in progress, the read of more rows beside them, and what they have
/// done.
struct Pump<'a> {
    dispatcher: &'a Dispatcher,
    /// Polled on the dispatcher's own task, as `buffer_unordered` would: no hop between
    /// threads per send.
    sending: FuturesUnordered<std::pin::Pin<Box<dyn Future<Output = Delivery> + Send>>>,
    /// The read of due rows in progress: it runs while the sends go on, so slots are filled
    /// again as soon as it returns.
    pending: Option<PendingTake>,
    /// Rows taken ahead of a free slot, oldest first: the next read runs while they wait, so
    /// a slot that frees is filled at once instead of after a read's round trip and commit.
    ready: VecDeque<Ready>,
    /// Rows taken ahead that waited too long, to give back (as they were) before the next read.
    returning: Vec<Finish>,
    /// The dispatcher is stopping: rows a read still brings back are given back, not sent.
    stopping: bool,
    pass: DispatchPass,
    /// Whether the last read found as many rows as it asked for: more may be due.
    more: bool,
    /// When the last read of every kind of due row started (`None`: none yet); a read of
    /// queued rows alone that came back short sets it back to `None`, so the next one reads
    /// them all.
    rare_read_at: Option<tokio::time::Instant>,
}

impl<'a> Pump<'a> {
    fn new(dispatcher: &'a Dispatcher) -> Self {
        Pump {
            dispatcher,
            sending: FuturesUnordered::new(),
            pending: None,
            ready: VecDeque::new(),
            returning: Vec::new(),
            stopping: false,
            pass: DispatchPass::default(),
            more: true,
            rare_read_at: None,
        }
    }

    fn free(&self) -> usize {
        self.dispatcher
            .concurrency
            .saturating_sub(self.sending.len())
    }

    /// How many more rows this dispatcher may hold: a slot's worth for each send, and as many
    /// again taken ahead.
    fn room(&self) -> usize {
        (self.dispatcher.concurrency * 2).saturating_sub(self.sending.len() + self.ready.len())
    }

    /// Whether to read now: fewer than half a round of rows wait for a slot, and there is room
    /// for an eighth of the slots (any at a low concurrency), so each read takes several rows
    /// at once.
    fn wants_rows(&self) -> bool {
        let room = self.room();
        let concurrency = self.dispatcher.concurrency;
        room > 0
            && self.ready.len() * 2 < concurrency.max(2)
            && (room * 8 >= concurrency || self.sending.is_empty())
    }

    /// Starts the rows taken ahead, oldest first, while slots are free. A row that waited a
    /// third of its lease (when its keeper would first renew it) is given back instead, its
    /// status as before, by the next read before it takes rows (so it may take it again).
    fn start_ready(&mut self) {
        let Some(handle) = self.dispatcher.client.inner.settings.ledger.as_ref() else {
            return;
        };
        let lease = handle.options.lease;
        while self.free() > 0
            && let Some(ready) = self.ready.pop_front()
        {
            let waited = crate::time::Clock::now(&crate::time::TokioClock::new())
                .saturating_duration_since(ready.set_at);
            if !lease.is_zero() && waited >= crate::ledger::renew_every(lease) {
                self.pass.due = self.pass.due.saturating_sub(1);
                self.returning.extend(given_back(ready));
                self.more = true;
                continue;
            }
            let Ready {
                taken,
                owner,
                set_at,
            } = ready;
            let held = HeldRow {
                owner,
                record: taken.record,
                previous: taken.previous,
                set_at,
            };
            self.sending.push(Box::pin(deliver(
                self.dispatcher.client.clone(),
                taken.operation,
                held,
                self.dispatcher.headers_for.clone(),
            )));
        }
    }

    /// The writes that give back every row taken ahead and not started, and those waiting to
    /// be given back; the rows taken ahead leave the pass's count.
    fn all_given_back(&mut self) -> Vec<Finish> {
        self.pass.due = self.pass.due.saturating_sub(self.ready.len());
        let mut writes = std::mem::take(&mut self.returning);
        writes.extend(self.ready.drain(..).filter_map(given_back));
        writes
    }

    /// Gives back every row taken ahead and not started (the dispatcher is stopping), once
    /// the writes are made.
    async fn give_back_ready(&mut self) {
        self.stopping = true;
        let Some(handle) = self.dispatcher.client.inner.settings.ledger.as_ref() else {
            return;
        };
        let writes = self.all_given_back();
        futures_util::future::join_all(
            writes
                .iter()
                .map(|finish| give_back_now(&*handle.ledger, finish)),
        )
        .await;
    }

    /// Starts a read of at most `limit` due rows, when there may be some, slots are free and
    /// none is in progress; then waits for the read to return (its rows' sends started) or
    /// for a send to end (counted). `false` when nothing is in flight and no read is pending.
    ///
    /// # Errors
    ///
    /// The ledger's error when a read fails with nothing in flight; with sends in flight it
    /// is logged and reading stops until they have ended.
    async fn step(&mut self, limit: usize) -> Result<bool, LedgerError> {
        self.start_ready();
        if self.pending.is_none() {
            let read = self.more && limit > 0 && self.wants_rows();
            if read || !self.returning.is_empty() {
                let rows = if read {
                    self.room().min(limit).min(256)
                } else {
                    0
                };
                self.pending = self.start_take(rows);
            }
        }
        if self.pending.is_none() && self.sending.is_empty() {
            // Nothing waits in `ready` either: with no send in flight every slot is free.
            return Ok(false);
        }
        enum Event {
            Took(Took),
            Ended(Delivery),
        }
        let event = std::future::poll_fn(|cx| {
            if let Some(pending) = self.pending.as_mut()
                && let Poll::Ready(took) = pending.as_mut().poll(cx)
            {
                return Poll::Ready(Event::Took(took));
            }
            if !self.sending.is_empty()
                && let Poll::Ready(Some(ended)) =
                    std::pin::Pin::new(&mut self.sending).poll_next(cx)
            {
                return Poll::Ready(Event::Ended(ended));
            }
            Poll::Pending
        })
        .await;
        match event {
            Event::Took(took) => {
                self.pending = None;
                self.started(took)?;
            }
            Event::Ended(ended) => self.settled(ended),
        }
        Ok(true)
    }

    /// The rows to give back written, then the read of at most `limit` due rows (none when
    /// `limit` is 0), under a lease token of its own; `None` without a ledger.
    fn start_take(&mut self, limit: usize) -> Option<PendingTake> {
        let handle = self.dispatcher.client.inner.settings.ledger.as_ref()?;
        let returning = std::mem::take(&mut self.returning);
        // Before the statement sets the leases: the keeper renews early, never late.
        let set_at = crate::time::Clock::now(&crate::time::TokioClock::new());
        let queued_only = self
            .rare_read_at
            .is_some_and(|at| set_at.saturating_duration_since(at) < RARE_EVERY);
        if !queued_only && limit > 0 {
            self.rare_read_at = Some(set_at);
        }
        let take = (limit > 0).then(|| self.dispatcher.take_of(handle, limit, queued_only));
        let ledger = Arc::clone(&handle.ledger);
        Some(Box::pin(async move {
            futures_util::future::join_all(
                returning
                    .iter()
                    .map(|finish| give_back_now(&*ledger, finish)),
            )
            .await;
            let (taken, owner) = match take {
                Some(take) => (ledger.take_due(&take).await, take.owner),
                None => (Ok(Vec::new()), String::new()),
            };
            Took {
                taken,
                owner,
                asked: limit,
                set_at,
                queued_only,
            }
        }))
    }

    /// Starts the sends of the rows a read took.
    fn started(&mut self, took: Took) -> Result<(), LedgerError> {
        let taken = match took.taken {
            Ok(taken) => taken,
            Err(err) if self.sending.is_empty() => return Err(err),
            Err(err) => {
                tracing::warn!(error = %err, "could not take due operations; taking none until the sends in progress end");
                self.more = false;
                return Ok(());
            }
        };
        if took.asked == 0 {
            // Only gave rows back: they are due again.
            self.more = true;
            return Ok(());
        }
        self.more = taken.len() >= took.asked;
        if took.queued_only && !self.more {
            // The queued rows ran short: read every kind before calling the queue drained.
            self.more = true;
            self.rare_read_at = None;
        }
        if self.stopping {
            self.returning.extend(taken.into_iter().filter_map(|taken| {
                given_back(Ready {
                    taken,
                    owner: took.owner.clone(),
                    set_at: took.set_at,
                })
            }));
            return Ok(());
        }
        self.pass.due += taken.len();
        self.ready.extend(taken.into_iter().map(|taken| Ready {
            taken,
            owner: took.owner.clone(),
            set_at: took.set_at,
        }));
        self.start_ready();
        Ok(())
    }

    /// Counts a send that ended, and runs the hook.
    fn settled(&mut self, delivery: Delivery) {
        let outcome = match delivery.outcome {
            Outcome::Done { .. } => {
                self.pass.done += 1;
                "done"
            }
            Outcome::NotDone { .. } => {
                self.pass.not_done += 1;
                "not_done"
            }
            Outcome::Unknown { .. } => {
                self.pass.unknown += 1;
                "unknown"
            }
        };
        metrics::outbox_delivered(outcome);
        if let Some(hook) = &self.dispatcher.on_outcome {
            hook(&delivery);
        }
    }
}

impl Drop for Pump<'_> {
    /// A pass dropped half-way gives back the rows it took ahead, as a dropped send gives
    /// back its own.
    fn drop(&mut self) {
        let writes = self.all_given_back();
        if let Some(handle) = self.dispatcher.client.inner.settings.ledger.as_ref() {
            for finish in writes {
                give_back(handle, finish);
            }
        }
    }
}

/// A row taken ahead of a free slot.
struct Ready {
    taken: Taken,
    /// The lease token it is held under.
    owner: String,
    /// When its lease was set, at the latest.
    set_at: tokio::time::Instant,
}

/// Gives back a row taken and never started, on a task of its own registered with the
/// client's releases (so a send of the key through this client waits for it).
fn give_back(handle: &LedgerHandle, finish: Finish) {
    let ledger = Arc::clone(&handle.ledger);
    handle.releases.spawn(finish.key.clone(), async move {
        give_back_now(&*ledger, &finish).await;
    });
}

/// The write that gives back a row taken and never started: a queued or `not_sent` row is
/// left as it was. `None` for a row taken over from a dead run: it is left to its lease,
/// which lapses, and the next take counts that run's attempt as it would have.
fn given_back(ready: Ready) -> Option<Finish> {
    let previous = ready.taken.previous;
    if !matches!(previous, OperationStatus::Queued | OperationStatus::NotSent) {
        return None;
    }
    let key = ready.taken.operation.key;
    match Finish::new(key.clone(), ready.owner, previous, None) {
        Ok(finish) => Some(finish),
        Err(err) => {
            tracing::warn!(key = key.as_str(), error = %err, "could not give back a taken operation; its lease will lapse");
            None
        }
    }
}

/// Writes `finish`, a give-back; a failure is logged (the lease lapses instead).
async fn give_back_now(ledger: &dyn crate::ledger::Ledger, finish: &Finish) {
    if let Err(err) = ledger.finish(finish).await {
        tracing::warn!(key = finish.key.as_str(), error = %err, "could not give back a taken operation; its lease will lapse");
    }
}

/// Sends one operation under its key; what its row now says.
async fn deliver(
    client: Client,
    operation: QueuedOperation,
    held: HeldRow,
    headers_for: Option<HeaderSource>,
) -> Delivery {
    let refused = |why: String| Delivery {
        key: operation.key.clone(),
        scope: operation.scope.clone(),
        outcome: Outcome::NotDone { key: None },
        replayed: false,
        error: Some(why),
        error_kind: Some(ErrorKind::Builder),
    };
    let Ok(method) = Method::from_bytes(operation.method.as_bytes()) else {
        return refused(format!(
            "stored method {:?} is not a method",
            operation.method
        ));
    };
    let key = match IdempotencyKey::new(operation.key.clone()) {
        Ok(key) => key,
        Err(err) => return refused(format!("stored key is not a key: {err}")),
    };
    let mut headers = HeaderMap::with_capacity(operation.headers.len());
    for (name, value) in &operation.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => return refused(format!("stored header {name:?} is not a valid header")),
        }
    }
    if let Some(source) = &headers_for {
        for (name, value) in source(&operation) {
            if let Some(name) = name {
                headers.insert(name, value);
            }
        }
    }
    let result = client
        .request(method, operation.url.as_str())
        .headers(headers)
        .body(operation.body.clone())
        .idempotency_key(key)
        .ledger_scope(operation.scope.clone())
        .held(held)
        .send()
        .await;
    let outcome = Outcome::of(&result);
    let (replayed, error, error_kind) = match &result {
        Ok(response) => (
            RetryReport::of(response).is_some_and(RetryReport::is_replayed),
            None,
            None,
        ),
        Err(err) => (false, Some(err.to_string()), Some(err.kind())),
    };
    Delivery {
        key: operation.key,
        scope: operation.scope,
        outcome,
        replayed,
        error,
        error_kind,
    }
}
