//! Group commit: the claims of new keys and the finishes that arrive while the ledger's
//! batches are busy go to the server together, in one transaction, so that many operations
//! share one commit (one WAL flush) and one round trip per statement.
//!
//! A dispatcher task takes the first call waiting, waits for a free batch slot (a few batches
//! run at once, each on a pooled connection), then takes every other call already queued (at
//! most [`MAX_BATCH`]) and runs them on a task of their own: the new keys in one
//! `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING` (in key order, so two batches
//! racing for the same keys take their locks in the same order), the outcomes in one
//! `UPDATE ... FROM unnest(...)`, both in one transaction.
//!
//! How much is batched follows demand. A call goes out at once as its own single statement,
//! from the caller's own task (no hop to the dispatcher and back), while fewer calls than the
//! pool's connections less three are out that way and no batch runs or waits: at moderate
//! load the server groups the commits of concurrent sessions itself, and a batch of two or
//! three costs more statements than it saves. Past that limit, and while a batch is under way,
//! calls wait for the next batch, and the calls that queued while the slots were busy share
//! its commit: under heavy load, few large batches. Each caller is answered after the commit:
//! whether its row was inserted, whether its outcome was written.
//!
//! Each row of a batch is as atomic as the single statement it replaces: of any number of
//! workers inserting one key, exactly one gets the row, and an outcome is written only by the
//! lease holder. A key that appears twice in one batch (two runs of one key in this process)
//! goes in once, and its second call runs alone after the batch.
//!
//! Claims of different keys must not wait on each other, but a batch's statement waits for a
//! row lock another session holds on any of its keys (an open transaction that inserted one
//! of them). So a batch waits at most the lock timeout of [`BATCH_BEGIN`](super::statements::BATCH_BEGIN)
//! for a lock, and when that passes (or the server reports a deadlock) its calls run one by
//! one, each on a connection of its own, waiting for its own key alone.
//!
//! A batch whose transaction fails as a whole (a lost connection, a server error) gives every
//! call in it that error; none of its rows was written, unless the connection was lost after
//! the server committed, which a single statement risks the same way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::failure::{classify, database, pool as pool_failure};
use super::statements;
use idempotent_retry_ledger::LedgerError;

/// The most calls one batch holds.
pub(super) const MAX_BATCH: usize = 256;

/// A new key's row, as the claim inserts it.
#[derive(Debug)]
pub(super) struct NewRow {
    pub(super) key: String,
    pub(super) scope: String,
    pub(super) fingerprint: String,
    /// The claim's present for a ledger on the caller's clock; `None`: the database's.
    pub(super) now: Option<i64>,
    pub(super) owner: String,
    /// The lease's length, milliseconds.
    pub(super) lease: i64,
    /// How long the row is kept, milliseconds.
    pub(super) retention: i64,
    pub(super) method: Option<String>,
    pub(super) url: Option<String>,
}

/// An operation's outcome, as the lease holder writes it.
#[derive(Debug)]
pub(super) struct BatchAnswer {
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) status: &'static str,
    pub(super) response_status: Option<i32>,
    pub(super) response_headers: Option<String>,
    pub(super) response_body: Option<Vec<u8>>,
    /// The URL that answered, when it is not the request's.
    pub(super) response_url: Option<String>,
    /// The id of the key that sealed the saved answer, when it is sealed.
    pub(super) response_key_id: Option<String>,
    /// Whether the finish counts the run's last attempt (`Finish::last_attempt_at`).
    pub(super) counted: bool,
    /// The present its stamp is taken from, for a ledger on the caller's clock; `None`: the
    /// database's.
    pub(super) base: Option<i64>,
}

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

/// One call waiting for a batch.
#[derive(Debug)]
enum Job {
    /// The start of the inserted row's window (`None`: the key had one).
    Insert(NewRow, Reply<Option<i64>>),
    /// Whether the row changed (`false`: the lease was lost).
    Finish(BatchAnswer, Reply<bool>),
}

impl Job {
    fn fail(self, err: LedgerError) {
        // A caller that stopped waiting has nothing to hear.
        match self {
            Job::Insert(_, reply) => drop(reply.send(Err(err))),
            Job::Finish(_, reply) => drop(reply.send(Err(err))),
        }
    }
}

/// The ledger's side of the dispatcher: where calls are queued. Shared by the ledger's
/// clones.
#[derive(Debug)]
pub(super) struct Group {
    pool: Pool,
    /// The dispatcher's queue, started on first use (in the caller's tokio runtime) and
    /// started again if that runtime has gone.
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    /// The calls in the group's hands, whether sent alone or waiting for a batch.
    busy: Arc<AtomicUsize>,
    /// The calls out as statements of their own, and how many may be at once.
    alone: Arc<AtomicUsize>,
    alone_limit: usize,
}

/// One call counted in [`Group::busy`] until it is answered or its caller has gone.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    /// Counts a call in; how many were counted before it.
    fn enter(count: &Arc<AtomicUsize>) -> (Busy, usize) {
        let before = count.fetch_add(1, Ordering::AcqRel);
        (Busy(Arc::clone(count)), before)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Group {
    pub(super) fn new(pool: Pool) -> Group {
        Group {
            alone_limit: alone_limit(&pool),
            pool,
            jobs: Mutex::new(None),
            busy: Arc::new(AtomicUsize::new(0)),
            alone: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A turn to go out alone: while fewer calls than the limit are out alone and no batch
    /// runs or waits, a call is its own statement (the server groups the commits of
    /// concurrent sessions itself, and a small batch costs more statements than it saves);
    /// past it, calls wait for the next batch, which shares one commit among all of them.
    fn alone_turn(&self, alone_before: bool) -> Option<Busy> {
        let (turn, before) = Busy::enter(&self.alone);
        (alone_before || before < self.alone_limit && self.batching() == 0).then_some(turn)
    }

    /// The calls waiting for a batch or in one.
    fn batching(&self) -> usize {
        self.busy
            .load(Ordering::Acquire)
            .saturating_sub(self.alone.load(Ordering::Acquire))
    }

    /// Claims a new key in the next batch: the start of its row's window, as the database
    /// stored it, when it was inserted (`None` when the key already had one). A call that finds no other call in the group's hands shares nothing
    /// by waiting: it goes out at once as its own statement, from the caller's task, without
    /// the hop to the dispatcher and back.
    pub(super) async fn insert(&self, row: NewRow) -> Result<Option<i64>, LedgerError> {
        let (_busy, before) = Busy::enter(&self.busy);
        if let Some(_turn) = self.alone_turn(before == 0) {
            return insert_alone(&self.pool, &row).await;
        }
        let (reply, answer) = oneshot::channel();
        if let Err(job) = self.queue(Job::Insert(row, reply))
            && let Job::Insert(row, _) = *job
        {
            // No runtime to run a dispatcher on: the call goes out alone.
            return insert_alone(&self.pool, &row).await;
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Writes an outcome in the next batch: whether the lease holder's row changed. Alone, as
    /// for [`insert`](Self::insert), it goes out at once as its own statement.
    pub(super) async fn finish(&self, outcome: BatchAnswer) -> Result<bool, LedgerError> {
        let (_busy, before) = Busy::enter(&self.busy);
        if let Some(_turn) = self.alone_turn(before == 0) {
            return finish_alone(&self.pool, &outcome).await;
        }
        let (reply, answer) = oneshot::channel();
        if let Err(job) = self.queue(Job::Finish(outcome, reply))
            && let Job::Finish(outcome, _) = *job
        {
            return finish_alone(&self.pool, &outcome).await;
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Queues `job` for the dispatcher, starting one if none runs; gives the job back when
    /// there is no tokio runtime to start one on.
    fn queue(&self, job: Job) -> Result<(), Box<Job>> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs.as_ref().is_none_or(mpsc::UnboundedSender::is_closed) {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(Box::new(job));
            }
            *jobs = Some(dispatch(self.pool.clone()));
        }
        jobs.as_ref()
            .expect("a dispatcher was started above")
            .send(job)
            .map_err(|mpsc::error::SendError(job)| Box::new(job))
    }
}

/// The error of a call whose batch task ended without answering (its runtime shut down).
fn stopped() -> LedgerError {
    LedgerError::unavailable(
        "the ledger's batch task stopped before answering; the write may or may not have been \
         made",
    )
}

/// How many batches run at once: two (one when the pool has one connection), so that one
/// batch is on the wire while the calls behind it gather into the next; more would make
/// smaller batches and more commits, the cost batching exists to share. The rest of the pool
/// serves the statements that are not batched (take-overs, reads, attempts).
fn slots(pool: &Pool) -> usize {
    pool.status().max_size.clamp(1, 2)
}

/// How many calls may be out alone at once: the pool's connections less the batch slots and
/// one more for the statements that are never batched (reads, take-overs, renewals), at
/// least one.
fn alone_limit(pool: &Pool) -> usize {
    pool.status()
        .max_size
        .saturating_sub(slots(pool) + 1)
        .max(1)
}

/// Starts the dispatcher on the current runtime; it ends when the returned sender and its
/// clones are dropped.
fn dispatch(pool: Pool) -> mpsc::UnboundedSender<Job> {
    let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
    let free = Arc::new(Semaphore::new(slots(&pool)));
    tokio::spawn(async move {
        while let Some(first) = queue.recv().await {
            let slot = Arc::clone(&free)
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let pool = pool.clone();
            tokio::spawn(async move { run(&pool, batch, slot).await });
        }
    });
    jobs
}

/// Runs one batch and answers its calls. The batch's slot is given back as soon as its
/// transaction ends: the calls that then run alone (after a lock wait, or a key's second
/// call) hold none.
async fn run(pool: &Pool, mut jobs: Vec<Job>, slot: tokio::sync::OwnedSemaphorePermit) {
    if jobs.len() == 1 {
        // A batch of one shares nothing: its single statement, as with no batching at all
        // (one operation at a time costs what it did), holding no slot while it runs.
        drop(slot);
        return alone(pool, jobs.pop().expect("one job")).await;
    }
    let (mut inserts, mut finishes, mut again) = (Vec::new(), Vec::new(), Vec::new());
    for job in jobs {
        match job {
            Job::Insert(row, reply) => inserts.push((row, reply)),
            Job::Finish(outcome, reply) => finishes.push((outcome, reply)),
        }
    }
    // In key order; the sort is stable, so a key's first call stays first and the calls after
    // it leave the batch, to run alone once it is done.
    inserts.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    finishes.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    let inserts = first_of_each(
        inserts,
        |(row, _)| &row.key,
        &mut again,
        |(row, reply)| Job::Insert(row, reply),
    );
    let finishes = first_of_each(
        finishes,
        |(outcome, _)| &outcome.key,
        &mut again,
        |(outcome, reply)| Job::Finish(outcome, reply),
    );
    let together = together(pool, &inserts, &finishes).await;
    drop(slot);
    match together {
        Ok((mut inserted, mut changed)) => {
            inserted.sort_unstable();
            changed.sort_unstable();
            let held =
                |keys: &[String], key: &str| keys.binary_search_by(|k| k.as_str().cmp(key)).is_ok();
            let window = |key: &str| {
                inserted
                    .binary_search_by(|(k, _)| k.as_str().cmp(key))
                    .ok()
                    .map(|at| inserted[at].1)
            };
            for (row, reply) in inserts {
                let _ = reply.send(Ok(window(&row.key)));
            }
            for (outcome, reply) in finishes {
                let _ = reply.send(Ok(held(&changed, &outcome.key)));
            }
        }
        Err(Together::Waited) => {
            let mut each = tokio::task::JoinSet::new();
            let jobs = inserts
                .into_iter()
                .map(|(row, reply)| Job::Insert(row, reply))
                .chain(
                    finishes
                        .into_iter()
                        .map(|(outcome, reply)| Job::Finish(outcome, reply)),
                );
            for job in jobs {
                let pool = pool.clone();
                each.spawn(async move { alone(&pool, job).await });
            }
            while each.join_next().await.is_some() {}
        }
        Err(Together::Failed(err)) => {
            let jobs = inserts
                .into_iter()
                .map(|(row, reply)| Job::Insert(row, reply))
                .chain(
                    finishes
                        .into_iter()
                        .map(|(outcome, reply)| Job::Finish(outcome, reply)),
                );
            for job in jobs {
                job.fail(err());
            }
        }
    }
    for job in again {
        alone(pool, job).await;
    }
}

/// The first call of each key of `calls`, which are in key order; the others go to `again`,
/// in their order, as jobs made by `job`.
fn first_of_each<T>(
    calls: Vec<T>,
    key: impl Fn(&T) -> &String,
    again: &mut Vec<Job>,
    job: impl Fn(T) -> Job,
) -> Vec<T> {
    let mut first: Vec<T> = Vec::with_capacity(calls.len());
    for call in calls {
        if first.last().is_some_and(|last| key(last) == key(&call)) {
            again.push(job(call));
        } else {
            first.push(call);
        }
    }
    first
}

/// Why a batch's transaction did not commit.
enum Together {
    /// It waited for a row lock past the batch's lock timeout, or deadlocked.
    Waited,
    /// Anything else: makes the error each call gets.
    Failed(Box<dyn Fn() -> LedgerError + Send>),
}

/// The batch's two statements in one transaction, sent in one round trip: `BEGIN` with the
/// lock timeout, the insert, the update and `COMMIT` go out together (tokio-postgres pipelines
/// requests made at once), so a batch costs one round trip and one commit. Returns the keys
/// inserted and the keys whose outcome was written.
///
/// When a statement fails, PostgreSQL aborts the transaction and the `COMMIT` behind it rolls
/// it back: nothing of the batch is written. The connection is then closed rather than given
/// back to the pool, as it is when this future is dropped half-way (its runtime shutting
/// down): no pooled connection is ever left inside a transaction.
async fn together(
    pool: &Pool,
    inserts: &[(NewRow, Reply<Option<i64>>)],
    finishes: &[(BatchAnswer, Reply<bool>)],
) -> Result<(Vec<(String, i64)>, Vec<String>), Together> {
    let client = pool.get().await.map_err(|err| {
        let err = Arc::new(err);
        Together::Failed(Box::new(move || {
            LedgerError::unavailable("cannot get a pooled connection for the batch")
                .with_source(Arc::clone(&err))
        }))
    })?;
    let mut guard = Discard(Some(client));
    let client = guard.0.as_ref().expect("set above");
    let insert = client
        .prepare_cached(&statements::INSERT_MANY)
        .await
        .map_err(failed)?;
    let finish = client
        .prepare_cached(&statements::FINISH_MANY)
        .await
        .map_err(failed)?;

    let rows = || inserts.iter().map(|(row, _)| row);
    let keys: Vec<&str> = rows().map(|r| r.key.as_str()).collect();
    let scopes: Vec<&str> = rows().map(|r| r.scope.as_str()).collect();
    let fingerprints: Vec<&str> = rows().map(|r| r.fingerprint.as_str()).collect();
    let nows: Vec<Option<i64>> = rows().map(|r| r.now).collect();
    let owners: Vec<&str> = rows().map(|r| r.owner.as_str()).collect();
    let leases: Vec<i64> = rows().map(|r| r.lease).collect();
    let expiries: Vec<i64> = rows().map(|r| r.retention).collect();
    let methods: Vec<Option<&str>> = rows().map(|r| r.method.as_deref()).collect();
    let urls: Vec<Option<&str>> = rows().map(|r| r.url.as_deref()).collect();
    let new_rows: [&(dyn ToSql + Sync); 9] = [
        &keys,
        &scopes,
        &fingerprints,
        &nows,
        &owners,
        &leases,
        &expiries,
        &methods,
        &urls,
    ];
    let outcomes = || finishes.iter().map(|(outcome, _)| outcome);
    let finished: Vec<&str> = outcomes().map(|o| o.key.as_str()).collect();
    let holders: Vec<&str> = outcomes().map(|o| o.owner.as_str()).collect();
    let statuses: Vec<&str> = outcomes().map(|o| o.status).collect();
    let saved: Vec<Option<i32>> = outcomes().map(|o| o.response_status).collect();
    let headers: Vec<Option<&str>> = outcomes().map(|o| o.response_headers.as_deref()).collect();
    let bodies: Vec<Option<&[u8]>> = outcomes().map(|o| o.response_body.as_deref()).collect();
    let counted: Vec<bool> = outcomes().map(|o| o.counted).collect();
    let bases: Vec<Option<i64>> = outcomes().map(|o| o.base).collect();
    let answered_at: Vec<Option<&str>> = outcomes().map(|o| o.response_url.as_deref()).collect();
    let key_ids: Vec<Option<&str>> = outcomes().map(|o| o.response_key_id.as_deref()).collect();
    let outcome_rows: [&(dyn ToSql + Sync); 10] = [
        &finished,
        &holders,
        &statuses,
        &saved,
        &headers,
        &bodies,
        &counted,
        &bases,
        &answered_at,
        &key_ids,
    ];

    let (begun, inserted, changed, committed) = tokio::join!(
        client.batch_execute(statements::BATCH_BEGIN),
        async {
            if inserts.is_empty() {
                Ok(Vec::new())
            } else {
                client.query(&insert, &new_rows).await
            }
        },
        async {
            if finishes.is_empty() {
                Ok(Vec::new())
            } else {
                client.query(&finish, &outcome_rows).await
            }
        },
        client.batch_execute("COMMIT"),
    );
    // The first error is the cause; those after it only say the transaction was aborted.
    begun.map_err(failed)?;
    let (inserted, changed) = (inserted.map_err(failed)?, changed.map_err(failed)?);
    committed.map_err(failed)?;
    // Committed: the connection goes back to the pool.
    guard.keep();

    let keys = |rows: &[tokio_postgres::Row]| {
        rows.iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)
    };
    let windows = inserted
        .iter()
        .map(|row| Ok((row.try_get::<_, String>(0)?, row.try_get::<_, i64>(1)?)))
        .collect::<Result<Vec<_>, tokio_postgres::Error>>()
        .map_err(failed)?;
    Ok((windows, keys(&changed)?))
}

/// What a failed statement of a batch means: a lock waited for too long or a deadlock (run
/// the calls alone), or an error for every call.
fn failed(err: tokio_postgres::Error) -> Together {
    let waited = err.code().is_some_and(|code| {
        *code == SqlState::LOCK_NOT_AVAILABLE || *code == SqlState::T_R_DEADLOCK_DETECTED
    });
    if waited {
        return Together::Waited;
    }
    let err = Arc::new(err);
    Together::Failed(Box::new(move || {
        classify(&err, "cannot record the batch").with_source(Arc::clone(&err))
    }))
}

/// A pooled connection that is closed when dropped, unless [`keep`](Self::keep) gives it back
/// to the pool: one whose transaction may still be open never returns there.
struct Discard(Option<deadpool_postgres::Object>);

impl Discard {
    fn keep(&mut self) {
        self.0 = None;
    }
}

impl Drop for Discard {
    fn drop(&mut self) {
        if let Some(client) = self.0.take() {
            // Taken out of the pool: dropping the client closes the connection, and the server
            // rolls back whatever it left open.
            drop(deadpool_postgres::Object::take(client));
        }
    }
}

/// Runs one call alone, on a connection of its own, with no lock timeout: the way back for
/// the calls of a batch that waited on a lock, and for a key's second call in a batch.
async fn alone(pool: &Pool, job: Job) {
    // A caller that stopped waiting has nothing to hear.
    match job {
        Job::Insert(row, reply) => drop(reply.send(insert_alone(pool, &row).await)),
        Job::Finish(outcome, reply) => drop(reply.send(finish_alone(pool, &outcome).await)),
    }
}

/// One claim's insert, as its own statement: the start of the row's window when it was
/// inserted (`None` when the key had one).
async fn insert_alone(pool: &Pool, row: &NewRow) -> Result<Option<i64>, LedgerError> {
    let what = "cannot claim the operation";
    let client = pool.get().await.map_err(pool_failure)?;
    let statement = client
        .prepare_cached(&statements::INSERT)
        .await
        .map_err(|err| database(err, what))?;
    let params: [&(dyn ToSql + Sync); 9] = [
        &row.key,
        &row.scope,
        &row.fingerprint,
        &row.now,
        &row.owner,
        &row.lease,
        &row.retention,
        &row.method,
        &row.url,
    ];
    client
        .query_opt(&statement, &params)
        .await
        .map_err(|err| database(err, what))?
        .map(|inserted| inserted.try_get::<_, i64>(1))
        .transpose()
        .map_err(|err| database(err, what))
}

/// One outcome, as its own statement: whether the lease holder's row changed.
async fn finish_alone(pool: &Pool, outcome: &BatchAnswer) -> Result<bool, LedgerError> {
    let what = "cannot record the outcome";
    let client = pool.get().await.map_err(pool_failure)?;
    let statement = client
        .prepare_cached(&statements::FINISH)
        .await
        .map_err(|err| database(err, what))?;
    let params: [&(dyn ToSql + Sync); 10] = [
        &outcome.key,
        &outcome.owner,
        &outcome.status,
        &outcome.response_status,
        &outcome.response_headers,
        &outcome.response_body,
        &outcome.counted,
        &outcome.base,
        &outcome.response_url,
        &outcome.response_key_id,
    ];
    client
        .execute(&statement, &params)
        .await
        .map(|changed| changed > 0)
        .map_err(|err| database(err, what))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::PostgresLedger;
    use crate::testing::server_url;
    use crate::tests::fresh_database;

    fn new_row(key: &str, owner: &str) -> NewRow {
        NewRow {
            key: key.to_owned(),
            scope: String::new(),
            fingerprint: "fp".to_owned(),
            now: Some(1_704_067_200_000),
            owner: owner.to_owned(),
            lease: 60_000,
            retention: 3_600_000,
            method: None,
            url: None,
        }
    }

    fn outcome(key: &str, owner: &str) -> BatchAnswer {
        BatchAnswer {
            key: key.to_owned(),
            owner: owner.to_owned(),
            status: "succeeded",
            response_status: Some(200),
            response_headers: Some("[]".to_owned()),
            response_body: Some(b"ok".to_vec()),
            response_url: None,
            response_key_id: None,
            counted: true,
            base: Some(1_704_067_201_000),
        }
    }

    /// A migrated ledger on a new database, its pool, and a session of the test's own.
    async fn ledger(base: &str, pool_size: usize) -> (Pool, tokio_postgres::Client) {
        let (url, client) = fresh_database(base).await;
        let ledger = PostgresLedger::builder()
            .url(&url)
            .pool_size(pool_size)
            .build()
            .await
            .expect("connect");
        ledger.migrate().await.expect("migrate");
        (ledger.pool().clone(), client)
    }

    fn slot() -> tokio::sync::OwnedSemaphorePermit {
        Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a new semaphore has a permit")
    }

    /// A call that finds the group idle goes out from the caller's task: no dispatcher is
    /// started for it. One that finds another in flight waits for a batch, and the count of
    /// calls in hand falls back to zero once both are answered, or when a caller gives up.
    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_group_sends_a_call_alone_and_counts_every_call_out() {
        let Some(base) = server_url() else { return };
        let (pool, _) = ledger(&base, 4).await;
        let group = Group::new(pool);
        assert!(
            group
                .insert(new_row("alone", "run-a"))
                .await
                .expect("inserted")
                == Some(1_704_067_200_000)
        );
        assert!(
            group.jobs.lock().expect("lock").is_none(),
            "no dispatcher for a call alone"
        );
        assert!(
            group
                .finish(outcome("alone", "run-a"))
                .await
                .expect("written")
        );
        let (first, second) = tokio::join!(
            group.insert(new_row("x", "run-x")),
            group.insert(new_row("y", "run-y"))
        );
        assert!(first.expect("x").is_some() && second.expect("y").is_some());
        assert!(
            group.jobs.lock().expect("lock").is_some(),
            "the call that found another in flight went to the dispatcher"
        );
        assert_eq!(group.busy.load(Ordering::SeqCst), 0);
        // A caller that stops waiting is counted out too.
        let dropped =
            tokio::time::timeout(Duration::from_nanos(1), group.insert(new_row("z", "run-z")))
                .await;
        drop(dropped);
        assert_eq!(group.busy.load(Ordering::SeqCst), 0);
    }

    /// Below the pool's limit for calls out alone (16 connections: 13), concurrent calls
    /// each go out as their own statement and no dispatcher starts; past it, the calls left
    /// over wait for a batch.
    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_go_out_alone_up_to_the_limit_and_batch_past_it() {
        let Some(base) = server_url() else { return };
        let (pool, _) = ledger(&base, 16).await;
        let group = Group::new(pool);
        assert_eq!(group.alone_limit, 13);
        let some = futures_util::future::join_all(
            (0..8).map(|n| group.insert(new_row(&format!("some-{n}"), "run-some"))),
        )
        .await;
        assert!(
            some.into_iter()
                .all(|inserted| inserted.expect("inserted").is_some())
        );
        assert!(
            group.jobs.lock().expect("lock").is_none(),
            "eight calls at once, all alone: no dispatcher"
        );
        let many = futures_util::future::join_all(
            (0..40).map(|n| group.insert(new_row(&format!("many-{n}"), "run-many"))),
        )
        .await;
        assert!(
            many.into_iter()
                .all(|inserted| inserted.expect("inserted").is_some())
        );
        assert!(
            group.jobs.lock().expect("lock").is_some(),
            "forty calls at once: those past the limit went to a batch"
        );
        assert_eq!(group.busy.load(Ordering::SeqCst), 0);
        assert_eq!(group.alone.load(Ordering::SeqCst), 0);
    }

    /// One batch of inserts and finishes, a key twice among them and a finish whose lease is
    /// someone else's: every call gets its own answer, as its single statement would give.
    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_answers_each_call_with_its_own_row() {
        let Some(base) = server_url() else { return };
        let (pool, _) = ledger(&base, 4).await;
        let (held, answer) = oneshot::channel();
        run(
            &pool,
            vec![Job::Insert(new_row("done", "run-a"), held)],
            slot(),
        )
        .await;
        assert!(answer.await.expect("answered").expect("inserted").is_some());

        let mut replies = Vec::new();
        let mut jobs = Vec::new();
        for (key, owner) in [("b", "run-b"), ("a", "run-a"), ("b", "run-c")] {
            let (reply, answer) = oneshot::channel();
            jobs.push(Job::Insert(new_row(key, owner), reply));
            replies.push(answer);
        }
        let (mine, finished) = oneshot::channel();
        jobs.push(Job::Finish(outcome("done", "run-a"), mine));
        let (theirs, refused) = oneshot::channel();
        jobs.push(Job::Finish(outcome("a", "someone-else"), theirs));
        run(&pool, jobs, slot()).await;

        let mut inserted = Vec::new();
        for answer in replies {
            inserted.push(answer.await.expect("answered").expect("no error").is_some());
        }
        let owner: Option<String> = pool
            .get()
            .await
            .expect("connection")
            .query_one(
                &format!(
                    "SELECT lease_owner FROM {} WHERE key = 'b'",
                    idempotent_retry_ledger::sql::TABLE
                ),
                &[],
            )
            .await
            .expect("b's row")
            .get(0);
        assert_eq!(owner.as_deref(), Some("run-b"), "b's first call holds it");
        assert_eq!(
            inserted,
            [true, true, false],
            "the second call of key b finds the first's row"
        );
        assert!(finished.await.expect("answered").expect("written"));
        assert!(
            !refused.await.expect("answered").expect("answered"),
            "not the lease holder: nothing changed"
        );
    }

    /// Another session holds a key's row lock (it inserted the key and keeps its transaction
    /// open): the batch holding that key gives up after its lock timeout, and the other keys
    /// of the batch are claimed while the lock is still held; the held key is claimed once
    /// the lock is gone.
    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_whose_lock_is_held_holds_up_no_other_key_of_its_batch() {
        let Some(base) = server_url() else { return };
        let (pool, mut outside) = ledger(&base, 4).await;
        let tx = outside.transaction().await.expect("begin");
        tx.execute(
            "INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts, \
             first_attempt_at, expires_at) VALUES ('held', '', 'fp', 'unknown', 1, 0, 0)",
            &[],
        )
        .await
        .expect("insert, uncommitted");

        let mut jobs = Vec::new();
        let mut free = Vec::new();
        for key in ["free-a", "free-b", "free-c"] {
            let (reply, answer) = oneshot::channel();
            jobs.push(Job::Insert(new_row(key, "run"), reply));
            free.push(answer);
        }
        let (reply, held) = oneshot::channel();
        jobs.push(Job::Insert(new_row("held", "run"), reply));
        let batch = tokio::spawn({
            let pool = pool.clone();
            async move { run(&pool, jobs, slot()).await }
        });
        for answer in free {
            let claimed = tokio::time::timeout(Duration::from_secs(20), answer)
                .await
                .expect("claimed while the lock is held")
                .expect("answered")
                .expect("no error");
            assert!(claimed.is_some(), "a free key is inserted");
        }
        assert!(!batch.is_finished(), "the held key still waits");
        tx.rollback().await.expect("rollback");
        let claimed = held.await.expect("answered").expect("no error");
        assert!(claimed.is_some(), "inserted once the lock is gone");
        batch.await.expect("the batch ends");
    }

    /// A batch whose statement fails gives every call the error, and its connection is
    /// closed rather than pooled inside an aborted transaction: on a pool of one, the next
    /// batch gets a new connection and runs.
    #[cfg_attr(
        no_postgres_server,
        ignore = "needs PostgreSQL: set IDEMPOTENT_RETRY_PG_URL (bash .ci/run starts a server)"
    )]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_batch_fails_every_call_and_leaves_no_transaction_in_the_pool() {
        let Some(base) = server_url() else { return };
        let (pool, _) = ledger(&base, 1).await;
        let mut bad = new_row("bad", "run");
        // A NUL cannot be stored in a TEXT column: the server refuses the statement.
        bad.scope = "\0".to_owned();
        let (reply, failed) = oneshot::channel();
        let (other, also) = oneshot::channel();
        run(
            &pool,
            vec![
                Job::Insert(bad, reply),
                Job::Insert(new_row("good", "run"), other),
            ],
            slot(),
        )
        .await;
        for answer in [failed, also] {
            let err = answer
                .await
                .expect("answered")
                .expect_err("the batch failed");
            assert_eq!(
                err.kind(),
                idempotent_retry_ledger::LedgerErrorKind::Unavailable,
                "{err}"
            );
        }
        let (reply, answer) = oneshot::channel();
        run(
            &pool,
            vec![Job::Insert(new_row("good", "run"), reply)],
            slot(),
        )
        .await;
        assert!(
            answer.await.expect("answered").expect("inserted").is_some(),
            "nothing of the failed batch was written, and the pool is usable"
        );
    }
}
