//! Group commit: the claims of new keys and the finishes that arrive while the ledger's
//! batches are busy go to the server together, in one transaction, so that many operations
//! share one commit (one WAL flush) and one round trip per statement.
//!
//! A dispatcher task takes the first call waiting, waits for a free batch slot (a few batches
//! run at once, each on a pooled connection), then takes every other call already queued (at
//! most [`MAX_BATCH`]) and runs them on a task of their own: the new keys in one
//! `INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING` (in key order, so two batches
//! racing for the same keys take their locks in the same order), the outcomes in one
//! `UPDATE ... FROM unnest(...)`, both in one transaction. Under no load a call is a batch of
//! one and goes out at once; under load the calls that queued while the slots were busy share
//! the next commit. Each caller is answered after the commit, with its own row.
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

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::failure::{classify, database, pool as pool_failure};
use super::row::read_row;
use super::statements;
use crate::ledger::{LedgerError, OperationRecord};

/// The most calls one batch holds.
pub(super) const MAX_BATCH: usize = 256;

/// A new key's row, as the claim inserts it.
#[derive(Debug)]
pub(super) struct NewRow {
    pub(super) key: String,
    pub(super) scope: String,
    pub(super) fingerprint: String,
    pub(super) now: i64,
    pub(super) owner: String,
    pub(super) lease_until: i64,
    pub(super) expires_at: i64,
}

/// An operation's outcome, as the lease holder writes it.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) key: String,
    pub(super) owner: String,
    pub(super) status: &'static str,
    pub(super) response_status: Option<i32>,
    pub(super) response_headers: Option<String>,
    pub(super) response_body: Option<Vec<u8>>,
    pub(super) last_attempt_at: Option<i64>,
}

type Reply<T> = oneshot::Sender<Result<T, LedgerError>>;

/// One call waiting for a batch.
#[derive(Debug)]
enum Job {
    /// The inserted row, or `None` when the key had one.
    Insert(NewRow, Reply<Option<OperationRecord>>),
    /// Whether the row changed (`false`: the lease was lost).
    Finish(Outcome, Reply<bool>),
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
}

impl Group {
    pub(super) fn new(pool: Pool) -> Group {
        Group {
            pool,
            jobs: Mutex::new(None),
        }
    }

    /// Claims a new key in the next batch: the inserted row, or `None` when the key already
    /// had one.
    pub(super) async fn insert(&self, row: NewRow) -> Result<Option<OperationRecord>, LedgerError> {
        let (reply, answer) = oneshot::channel();
        if let Err(job) = self.queue(Job::Insert(row, reply))
            && let Job::Insert(row, _) = *job
        {
            // No runtime to run a dispatcher on: the call goes out alone.
            return insert_alone(&self.pool, &row).await;
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// Writes an outcome in the next batch: whether the lease holder's row changed.
    pub(super) async fn finish(&self, outcome: Outcome) -> Result<bool, LedgerError> {
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

/// How many batches run at once: a quarter of the pool (at least one), so that the calls
/// queued behind them make large batches while the rest of the pool serves the statements
/// that are not batched (take-overs, reads, attempts).
fn slots(pool: &Pool) -> usize {
    (pool.status().max_size / 4).max(1)
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
async fn run(pool: &Pool, jobs: Vec<Job>, slot: tokio::sync::OwnedSemaphorePermit) {
    let (mut inserts, mut finishes, mut again) = (Vec::new(), Vec::new(), Vec::new());
    let (mut inserting, mut finishing) = (HashSet::new(), HashSet::new());
    for job in jobs {
        match job {
            Job::Insert(row, reply) if inserting.insert(row.key.clone()) => {
                inserts.push((row, reply));
            }
            Job::Finish(outcome, reply) if finishing.insert(outcome.key.clone()) => {
                finishes.push((outcome, reply));
            }
            repeated => again.push(repeated),
        }
    }
    inserts.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    finishes.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    let together = together(pool, &inserts, &finishes).await;
    drop(slot);
    match together {
        Ok((mut inserted, changed)) => {
            for (row, reply) in inserts {
                let _ = reply.send(Ok(inserted.remove(&row.key)));
            }
            for (outcome, reply) in finishes {
                let _ = reply.send(Ok(changed.contains(&outcome.key)));
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

/// Why a batch's transaction did not commit.
enum Together {
    /// It waited for a row lock past the batch's lock timeout, or deadlocked.
    Waited,
    /// Anything else: makes the error each call gets.
    Failed(Box<dyn Fn() -> LedgerError + Send>),
}

/// The batch's two statements in one transaction, sent in one round trip: `BEGIN` with the
/// lock timeout, the insert, the update and `COMMIT` go out together (tokio-postgres pipelines
/// requests made at once), so a batch costs one round trip and one commit. Returns the
/// inserted rows by key and the keys whose outcome was written.
///
/// When a statement fails, PostgreSQL aborts the transaction and the `COMMIT` behind it rolls
/// it back: nothing of the batch is written. The connection is then closed rather than given
/// back to the pool, as it is when this future is dropped half-way (its runtime shutting
/// down): no pooled connection is ever left inside a transaction.
async fn together(
    pool: &Pool,
    inserts: &[(NewRow, Reply<Option<OperationRecord>>)],
    finishes: &[(Outcome, Reply<bool>)],
) -> Result<(HashMap<String, OperationRecord>, HashSet<String>), Together> {
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
    let nows: Vec<i64> = rows().map(|r| r.now).collect();
    let owners: Vec<&str> = rows().map(|r| r.owner.as_str()).collect();
    let leases: Vec<i64> = rows().map(|r| r.lease_until).collect();
    let expiries: Vec<i64> = rows().map(|r| r.expires_at).collect();
    let new_rows: [&(dyn ToSql + Sync); 7] = [
        &keys,
        &scopes,
        &fingerprints,
        &nows,
        &owners,
        &leases,
        &expiries,
    ];
    let outcomes = || finishes.iter().map(|(outcome, _)| outcome);
    let finished: Vec<&str> = outcomes().map(|o| o.key.as_str()).collect();
    let holders: Vec<&str> = outcomes().map(|o| o.owner.as_str()).collect();
    let statuses: Vec<&str> = outcomes().map(|o| o.status).collect();
    let saved: Vec<Option<i32>> = outcomes().map(|o| o.response_status).collect();
    let headers: Vec<Option<&str>> = outcomes().map(|o| o.response_headers.as_deref()).collect();
    let bodies: Vec<Option<&[u8]>> = outcomes().map(|o| o.response_body.as_deref()).collect();
    let last: Vec<Option<i64>> = outcomes().map(|o| o.last_attempt_at).collect();
    let outcome_rows: [&(dyn ToSql + Sync); 7] = [
        &finished, &holders, &statuses, &saved, &headers, &bodies, &last,
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

    let mut records = HashMap::with_capacity(inserted.len());
    for row in &inserted {
        let record = read_row(row).map_err(|err| {
            let message = err.to_string();
            Together::Failed(Box::new(move || LedgerError::corrupt(message.clone())))
        })?;
        records.insert(record.key.clone(), record);
    }
    let mut written = HashSet::with_capacity(changed.len());
    for row in &changed {
        written.insert(row.try_get::<_, String>(0).map_err(failed)?);
    }
    Ok((records, written))
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

/// One claim's insert, as its own statement: the row, or `None` when the key had one.
async fn insert_alone(pool: &Pool, row: &NewRow) -> Result<Option<OperationRecord>, LedgerError> {
    let what = "cannot claim the operation";
    let client = pool.get().await.map_err(pool_failure)?;
    let statement = client
        .prepare_cached(&statements::INSERT)
        .await
        .map_err(|err| database(err, what))?;
    let params: [&(dyn ToSql + Sync); 7] = [
        &row.key,
        &row.scope,
        &row.fingerprint,
        &row.now,
        &row.owner,
        &row.lease_until,
        &row.expires_at,
    ];
    client
        .query_opt(&statement, &params)
        .await
        .map_err(|err| database(err, what))?
        .map(|row| read_row(&row))
        .transpose()
}

/// One outcome, as its own statement: whether the lease holder's row changed.
async fn finish_alone(pool: &Pool, outcome: &Outcome) -> Result<bool, LedgerError> {
    let what = "cannot record the outcome";
    let client = pool.get().await.map_err(pool_failure)?;
    let statement = client
        .prepare_cached(&statements::FINISH)
        .await
        .map_err(|err| database(err, what))?;
    let params: [&(dyn ToSql + Sync); 7] = [
        &outcome.key,
        &outcome.owner,
        &outcome.status,
        &outcome.response_status,
        &outcome.response_headers,
        &outcome.response_body,
        &outcome.last_attempt_at,
    ];
    client
        .execute(&statement, &params)
        .await
        .map(|changed| changed > 0)
        .map_err(|err| database(err, what))
}
