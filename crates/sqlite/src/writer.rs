//! The one writer: a thread of its own that owns the ledger's write connection and commits the
//! writes waiting for it together, one `BEGIN IMMEDIATE` transaction per batch.
//!
//! Every write is a closure sent down a channel with the sender of its own reply. The thread
//! takes the first write waiting, then every other one already queued (at most
//! [`MAX_BATCH`]), runs them in order inside one transaction, and commits. Each caller is
//! answered with its own result once the batch is durable: in WAL mode once this thread
//! [synced the log](super::sync) after the commit, otherwise at the commit. A write that
//! arrives while a batch runs or its log syncs goes into the next batch.
//!
//! **The rule for writes:** a write changes the file with at most one statement, and nothing
//! in it can fail once that statement succeeded, so a failed write has changed nothing and
//! needs no savepoint (why: `docs/sqlite.md`). A write that breaks the rule (the connection's
//! change count moved) has its whole batch rolled back and told so. A failure that ends the
//! whole transaction (SQLite rolls it back by itself on a full disk or an I/O error, or the
//! `COMMIT` fails) is told to every caller whose write was in it, so no caller hears of a
//! write the file does not hold. Work that cannot run inside a batch (the migration, which
//! runs transactions of its own; a connection setting) runs alone, between batches, and is
//! answered the same way once durable.
//!
//! The thread ends when every sender is gone (the last [`SqliteLedger`](super::SqliteLedger)
//! clone dropped) and the writes still queued are done and answered. If it dies (a panic), the
//! queued writes' reply senders are dropped with it: their callers, and every later one, get
//! [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable), never a hang.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::classify;
#[cfg(test)]
use super::sync::BeforeSync;
use super::sync::{Answer, Durability};
use idempotent_retry_ledger::LedgerError;

/// The most writes one transaction holds, so that a write waits at most for one batch of this
/// size ahead of it and for its own.
pub(super) const MAX_BATCH: usize = 256;

const BEGIN: &str = "BEGIN IMMEDIATE";
const COMMIT: &str = "COMMIT";
const ROLLBACK: &str = "ROLLBACK";

/// What the thread runs before each `COMMIT`, given the number of writes in the batch (tests
/// stop or kill the writer there).
#[cfg(test)]
pub(super) type BeforeCommit = Box<dyn FnMut(usize) + Send>;

/// The sending side: cheap to share, one per ledger (its clones share it).
#[derive(Debug)]
pub(super) struct Writer {
    jobs: mpsc::Sender<Job>,
    /// Disconnected once the writer thread has ended (its connection closed, the WAL
    /// checkpointed into the file and removed).
    ended: std::sync::Mutex<mpsc::Receiver<()>>,
}

impl Writer {
    /// Starts the writer thread on `conn`; returns the sender and the thread's handle.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the system
    /// refuses a new thread.
    pub(super) fn spawn(
        conn: Connection,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), LedgerError> {
        let durability = Durability::for_connection(
            &conn,
            #[cfg(test)]
            None,
        )?;
        Self::start(Batcher {
            conn,
            jobs: None,
            durability,
            #[cfg(test)]
            before_commit: None,
        })
    }

    /// [`spawn`](Self::spawn), with `hook` run before each `COMMIT`.
    #[cfg(test)]
    pub(super) fn spawn_with(
        conn: Connection,
        hook: BeforeCommit,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), LedgerError> {
        Self::spawn_hooked(conn, Some(hook), None)
    }

    /// [`spawn`](Self::spawn), with hooks before each `COMMIT` and before each sync.
    #[cfg(test)]
    pub(super) fn spawn_hooked(
        conn: Connection,
        before_commit: Option<BeforeCommit>,
        before_sync: Option<BeforeSync>,
    ) -> Result<(Writer, std::thread::JoinHandle<()>), LedgerError> {
        let durability = Durability::for_connection(&conn, before_sync)?;
        Self::start(Batcher {
            conn,
            jobs: None,
            durability,
            before_commit,
        })
    }

    fn start(mut batcher: Batcher) -> Result<(Writer, std::thread::JoinHandle<()>), LedgerError> {
        let (jobs, queue) = mpsc::channel();
        batcher.jobs = Some(queue);
        let (ending, ended) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("idempotent-retry-sqlite-writer".into())
            .spawn(move || {
                // Dropped when the thread ends, after the batcher's connection is closed.
                let _ending = ending;
                batcher.run();
            })
            .map_err(|err| {
                LedgerError::unavailable("cannot start the ledger's writer thread").with_source(err)
            })?;
        Ok((
            Writer {
                jobs,
                ended: std::sync::Mutex::new(ended),
            },
            thread,
        ))
    }

    /// Stops taking writes and waits, at most `limit`, for the thread to end; `true` once it
    /// has. The writes already queued run first.
    pub(super) fn end(self, limit: std::time::Duration) -> bool {
        drop(self.jobs);
        let ended = self
            .ended
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        matches!(
            ended.recv_timeout(limit),
            Err(mpsc::RecvTimeoutError::Disconnected)
        )
    }

    /// Runs `write` in the next batch and answers once the batch committed: its own result
    /// then, or the error that ended the transaction. `write` keeps the
    /// [rule for writes](self): at most one statement that changes the file, nothing that can
    /// fail after it.
    ///
    /// Dropping the returned future does not cancel the write once it is queued: it runs, and
    /// its answer is dropped.
    pub(super) async fn batched<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Batched(Box::new(Pending { write, reply })))?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs `work` alone, outside any batch and with no transaction open, and answers once
    /// what it wrote is durable.
    pub(super) async fn alone<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
    ) -> Result<T, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.send(Job::Alone(Box::new(move |conn: &mut Connection| {
            Box::new(Ran {
                result: work(conn),
                reply,
            }) as Box<dyn Answer>
        })))?;
        answer.await.map_err(|_| stopped())?
    }

    fn send(&self, job: Job) -> Result<(), LedgerError> {
        self.jobs.send(job).map_err(|_| stopped())
    }
}

/// What the connection has written, as far as SQLite counts it: rows changed, the schema's
/// cookie (any DDL) and the user version (a migration's step). The same before and after a
/// piece of work means it wrote nothing; `None` when SQLite cannot say, which counts as a
/// change.
fn written(conn: &Connection) -> Option<(u64, i64, i64)> {
    let pragma = |name| {
        conn.pragma_query_value(None, name, |row| row.get::<_, i64>(0))
            .ok()
    };
    Some((
        conn.total_changes(),
        pragma("schema_version")?,
        pragma("user_version")?,
    ))
}

/// The error of a call the writer thread can no longer answer: it died (a panic), so nothing
/// it had not acknowledged was written.
fn stopped() -> LedgerError {
    LedgerError::unavailable(
        "the ledger's writer thread stopped; writes it did not acknowledge were not committed",
    )
}

/// One unit of work for the writer thread.
enum Job {
    /// A write that joins the next batch.
    Batched(Box<dyn Write>),
    /// Work that runs alone between batches; its answer waits for durability like a batch's.
    Alone(AloneWork),
}

/// Work that runs alone, returning its answer to send once durable.
type AloneWork = Box<dyn FnOnce(&mut Connection) -> Box<dyn Answer> + Send>;

/// A queued write, type-erased: run it inside the batch's transaction, or answer it without
/// running when the transaction could not begin.
trait Write: Send {
    /// Runs the write; returns whether it failed and its answer, to send after the commit.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Answer>);
    /// Answers with `err` without running.
    fn refuse(self: Box<Self>, err: LedgerError);
}

struct Pending<F, T> {
    write: F,
    reply: oneshot::Sender<Result<T, LedgerError>>,
}

impl<F, T> Write for Pending<F, T>
where
    F: FnOnce(&Connection) -> Result<T, LedgerError> + Send,
    T: Send + 'static,
{
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Box<dyn Answer>) {
        let result = (self.write)(conn);
        (
            result.is_err(),
            Box::new(Ran {
                result,
                reply: self.reply,
            }),
        )
    }

    fn refuse(self: Box<Self>, err: LedgerError) {
        let _ = self.reply.send(Err(err));
    }
}

struct Ran<T> {
    result: Result<T, LedgerError>,
    reply: oneshot::Sender<Result<T, LedgerError>>,
}

impl<T: Send + 'static> Answer for Ran<T> {
    fn send(self: Box<Self>) {
        // A caller that stopped waiting has closed its channel; the write stands regardless.
        let _ = self.reply.send(self.result);
    }

    fn fail(self: Box<Self>, err: LedgerError) {
        let _ = self.reply.send(Err(err));
    }
}

/// The thread's state: the write connection, the queue and how committed batches are
/// answered.
struct Batcher {
    conn: Connection,
    jobs: Option<mpsc::Receiver<Job>>,
    durability: Durability,
    #[cfg(test)]
    before_commit: Option<BeforeCommit>,
}

impl Batcher {
    fn run(mut self) {
        let jobs = self
            .jobs
            .take()
            .expect("the queue is set before the thread starts");
        let mut next = None;
        loop {
            // Once every sender is gone, `recv` still hands out what was queued, then fails.
            let Some(job) = next.take().or_else(|| jobs.recv().ok()) else {
                // Every queued write is committed, synced and answered.
                return;
            };
            let first = match job {
                Job::Alone(work) => {
                    let before = written(&self.conn);
                    let answer = work(&mut self.conn);
                    if before.is_some() && before == written(&self.conn) {
                        // Nothing written (the migration of a current file, a setting): no sync
                        // to wait for, and every earlier write was synced at its own turn.
                        answer.send();
                    } else {
                        self.durability.committed(vec![answer]);
                        self.durability.flush();
                    }
                    continue;
                }
                Job::Batched(write) => write,
            };
            let mut batch = VecDeque::from([first]);
            while batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(Job::Batched(write)) => batch.push_back(write),
                    Ok(alone) => {
                        next = Some(alone);
                        break;
                    }
                    Err(_) => break,
                }
            }
            while !batch.is_empty() {
                self.transaction(&mut batch);
            }
            // One sync for every transaction of this turn; the writes that arrive meanwhile
            // wait in the queue for the next.
            self.durability.flush();
        }
    }

    fn execute(&self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(drop)
    }

    /// Runs the writes at the front of `queue` in one transaction and answers them. Writes
    /// left in `queue` (after a transaction SQLite rolled back by itself) go into another.
    fn transaction(&mut self, queue: &mut VecDeque<Box<dyn Write>>) {
        if self.durability.refused().is_some() {
            for write in queue.drain(..) {
                write.refuse(
                    self.durability
                        .refused()
                        .expect("a failed sync is never forgotten"),
                );
            }
            return;
        }
        if let Err(err) = self.execute(BEGIN) {
            let err = Arc::new(err);
            for write in queue.drain(..) {
                write.refuse(shared(&err, "cannot begin the write"));
            }
            return;
        }
        let mut done: Vec<Box<dyn Answer>> = Vec::with_capacity(queue.len());
        while let Some(write) = queue.pop_front() {
            let changes = self.conn.total_changes();
            let (failed, answer) = write.run(&self.conn);
            if self.conn.is_autocommit() {
                // SQLite rolled the whole transaction back (a full disk, an I/O error): the
                // writes before this one are undone too. This one carries its own error; had
                // it none, it was undone with the rest and is told so.
                if failed {
                    answer.send();
                } else {
                    done.push(answer);
                }
                return rolled_back(done);
            }
            if failed && self.conn.total_changes() != changes {
                // The write broke the rule: it failed after changing the file, and its change
                // cannot be undone alone. Its own error goes to its caller; the batch is
                // rolled back.
                answer.send();
                self.abandon_broken(done);
                return;
            }
            done.push(answer);
        }
        #[cfg(test)]
        if let Some(hook) = &mut self.before_commit {
            hook(done.len());
        }
        match self.execute(COMMIT) {
            Ok(()) => self.durability.committed(done),
            Err(err) => self.abandon(done, &Arc::new(err)),
        }
    }

    /// Rolls back a transaction a write left half applied, telling the others in it that
    /// they were not recorded.
    fn abandon_broken(&self, done: Vec<Box<dyn Answer>>) {
        if let Err(err) = self.execute(ROLLBACK) {
            // The changes stay uncommitted: the next BEGIN fails on the open transaction and
            // says so to its writes.
            return self.abandon(done, &Arc::new(err));
        }
        rolled_back(done);
    }

    /// Rolls back the open transaction and tells every write in it that it was not recorded.
    fn abandon(&self, done: Vec<Box<dyn Answer>>, err: &Arc<rusqlite::Error>) {
        if !self.conn.is_autocommit() {
            // Failing too leaves the transaction open until the connection closes; the next
            // BEGIN then fails and says so to its writes.
            let _ = self.execute(ROLLBACK);
        }
        for answer in done {
            answer.fail(shared(err, "cannot commit the write"));
        }
    }
}

/// Tells the writes of a transaction SQLite rolled back by itself that they were not recorded.
fn rolled_back(done: Vec<Box<dyn Answer>>) {
    for answer in done {
        answer.fail(LedgerError::unavailable(
            "the write was rolled back with its batch when a later write in it failed",
        ));
    }
}

/// The error of one write among several that one SQLite error failed, each with the error as
/// its source.
fn shared(err: &Arc<rusqlite::Error>, what: &str) -> LedgerError {
    classify(err, what).with_source(Arc::clone(err))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{hold_first, queued};
    use super::*;

    fn connection(path: &std::path::Path) -> Connection {
        let conn = Connection::open(path).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY)")
            .expect("table");
        conn
    }

    fn insert(key: &'static str) -> impl FnOnce(&Connection) -> Result<(), LedgerError> {
        move |conn| {
            conn.prepare_cached("INSERT INTO t (k) VALUES (?1)")
                .and_then(|mut statement| statement.execute([key]))
                .map(drop)
                .map_err(|err| super::super::storage(err, "insert"))
        }
    }

    fn keys(path: &std::path::Path) -> Vec<String> {
        let conn = Connection::open(path).expect("open");
        let mut statement = conn.prepare("SELECT k FROM t ORDER BY k").expect("select");
        statement
            .query_map([], |row| row.get(0))
            .expect("rows")
            .collect::<Result<_, _>>()
            .expect("keys")
    }

    /// A failing write changes nothing (SQLite undoes its statement); the writes beside it in
    /// the same batch still commit and hear of their own success.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_write_fails_alone_in_its_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("w.db");
        // Says how many writes each batch holds, and holds the first one open until the
        // others are queued behind it.
        let (hook, inside, gate) = hold_first();
        let (writer, thread) =
            Writer::spawn_with(connection(&path), Box::new(hook)).expect("spawn");
        let writer = Arc::new(writer);
        let write = |key| {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move { writer.batched(insert(key)).await })
        };
        let a = write("a");
        let inside = tokio::task::spawn_blocking(move || {
            let first = inside.recv().expect("the first batch");
            (first, inside)
        });
        let (first, inside) = inside.await.expect("task");
        assert_eq!(first, 1);
        // Queued behind the held batch before it is released: each is polled once, which
        // sends it (a spawned task might not have run yet when the gate opens).
        let b = queued(writer.batched(insert("b"))).await;
        let dup = queued(writer.batched(insert("a"))).await;
        let c = queued(writer.batched(insert("c"))).await;
        gate.send(()).expect("release");
        a.await.expect("task").expect("a");
        b.await.expect("b committed beside the failure");
        c.await.expect("c committed beside the failure");
        let err = dup.await.expect_err("a duplicate key");
        assert_eq!(
            err.kind(),
            idempotent_retry_ledger::LedgerErrorKind::Unavailable,
            "{err}"
        );
        assert_eq!(
            inside.recv().expect("the second batch"),
            3,
            "one batch of three"
        );
        assert_eq!(keys(&path), ["a", "b", "c"]);
        drop(writer);
        thread.join().expect("the thread ends without a panic");
    }

    /// A write that fails after its statement changed the file breaks the rule for writes:
    /// its change cannot be undone alone, so the whole batch is rolled back, the writes beside
    /// it are told they were not recorded, and the file holds none of them. The next batch
    /// commits as usual.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_fails_after_a_change_rolls_its_batch_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("w.db");
        let (hook, inside, gate) = hold_first();
        let (writer, thread) =
            Writer::spawn_with(connection(&path), Box::new(hook)).expect("spawn");
        let writer = Arc::new(writer);
        let write = |key| {
            let writer = Arc::clone(&writer);
            tokio::spawn(async move { writer.batched(insert(key)).await })
        };
        let opener = write("opener");
        let inside = tokio::task::spawn_blocking(move || {
            assert_eq!(inside.recv().expect("the first batch"), 1);
            inside
        })
        .await
        .expect("task");
        // Queued in this order behind the held batch: each is polled once, which sends it.
        let before = queued(writer.batched(insert("before"))).await;
        let broken = queued(writer.batched(|conn| {
            insert("half")(conn)?;
            Err::<(), _>(LedgerError::corrupt("failed after its insert"))
        }))
        .await;
        let after = queued(writer.batched(insert("after"))).await;
        gate.send(()).expect("release");
        opener
            .await
            .expect("task")
            .expect("the first batch committed");
        let err = broken.await.expect_err("its own error");
        assert!(err.to_string().contains("failed after its insert"), "{err}");
        let err = before.await.expect_err("rolled back with the batch");
        assert_eq!(
            err.kind(),
            idempotent_retry_ledger::LedgerErrorKind::Unavailable,
            "{err}"
        );
        assert!(err.to_string().contains("rolled back"), "{err}");
        // The broken batch never reached its commit; the write queued behind the broken one
        // went into a transaction of its own.
        assert_eq!(
            inside.recv().expect("the next commit"),
            1,
            "the write after alone"
        );
        match after.await {
            Ok(()) => {}
            Err(err) => panic!("the write after the broken batch: {err}"),
        }
        assert_eq!(keys(&path), ["after", "opener"]);
        drop(writer);
        thread.join().expect("the thread ends without a panic");
    }

    /// Once the sender is dropped, the thread finishes what is queued and exits.
    #[tokio::test]
    async fn the_thread_ends_with_its_last_sender_after_the_queued_writes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("w.db");
        let (writer, thread) = Writer::spawn(connection(&path)).expect("spawn");
        // Queued, then abandoned by their callers.
        for key in ["x", "y", "z"] {
            let write = writer.batched(insert(key));
            let polled = tokio::time::timeout(std::time::Duration::ZERO, write).await;
            drop(polled);
        }
        drop(writer);
        thread.join().expect("the thread ends without a panic");
        assert_eq!(keys(&path), ["x", "y", "z"]);
    }
}
