//! Acknowledgement after the disk: committed batches are answered only once the write-ahead
//! log that holds them is synced, by a thread of its own, so that the writer can run the next
//! batch while the disk flushes the last ones.
//!
//! In WAL mode a commit appends the transaction's pages to the `-wal` file, and
//! `synchronous = FULL` differs from `NORMAL` only in syncing that file before `COMMIT`
//! returns. The writer commits with `NORMAL` and hands the batch's answers here; this thread
//! syncs the `-wal` file (every batch committed while it synced is covered by the next sync,
//! so one sync acknowledges several batches) and only then answers their callers. A write is
//! thus acknowledged exactly when it would have been under `FULL`: once it is on the disk.
//! Checkpoints (which copy the log into the database file) sync both files themselves under
//! `NORMAL`, so a log restarted after one never drops an unsynced commit.
//!
//! A failed sync leaves the log's state on the disk unknown (the kernel may have dropped the
//! pages it could not write), so it is final: the batches it covered are told they were not
//! recorded, and every later write is refused, until the ledger is opened again.
//!
//! A file that is not in WAL mode (a file system without shared memory, say) keeps
//! `synchronous = FULL` and its batches are answered at their commit ([`Durability::AtCommit`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, OnceLock};

use rusqlite::Connection;

use super::storage;
use crate::ledger::LedgerError;

/// What the syncer thread runs before each sync, given the number of answers it covers; an
/// error stands for a failed sync (tests hold or fail the sync there).
#[cfg(test)]
pub(super) type BeforeSync = Box<dyn FnMut(usize) -> std::io::Result<()> + Send>;

/// A write's result, held until its transaction is durable.
pub(super) trait Answer: Send {
    /// The write is durable: sends its own result.
    fn send(self: Box<Self>);
    /// The write was not recorded, or may not have been: sends `err` instead.
    fn fail(self: Box<Self>, err: LedgerError);
}

/// When a committed batch is answered.
#[derive(Debug)]
pub(super) enum Durability {
    /// After the syncer synced the log (WAL mode, `synchronous = NORMAL`).
    AfterSync(Syncer),
    /// At `COMMIT`, which synced the file itself (`synchronous = FULL`).
    AtCommit,
}

impl Durability {
    /// Sets the connection up for its journal mode: in WAL mode, with the `-wal` file open
    /// for syncing, commits with `NORMAL` and a syncer thread; otherwise with `FULL`.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Unavailable`](crate::LedgerErrorKind::Unavailable) when SQLite
    /// refuses the setting or the system refuses the thread.
    pub(super) fn for_connection(
        conn: &Connection,
        #[cfg(test)] hook: Option<BeforeSync>,
    ) -> Result<Durability, LedgerError> {
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .map_err(|err| storage(err, "cannot read the journal mode"))?;
        // SQLite creates the `-wal` file at the first read in WAL mode, not at the switch.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
            .map_err(|err| storage(err, "cannot read"))?;
        let log = (mode.eq_ignore_ascii_case("wal"))
            .then(|| wal_path(conn))
            .flatten()
            .and_then(|path| File::options().read(true).write(true).open(&path).ok());
        let Some(log) = log else {
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(|err| storage(err, "cannot configure"))?;
            return Ok(Durability::AtCommit);
        };
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(|err| storage(err, "cannot configure"))?;
        Syncer::spawn(
            log,
            #[cfg(test)]
            hook,
        )
        .map(Durability::AfterSync)
    }

    /// Why writes are refused: a sync failed, so nothing written since can be promised.
    pub(super) fn refused(&self) -> Option<LedgerError> {
        match self {
            Durability::AfterSync(syncer) => syncer.failed.get().map(|why| {
                LedgerError::unavailable(format!(
                    "the ledger's log could not be synced to disk ({why}); writes are refused \
                     until the ledger is opened again"
                ))
            }),
            Durability::AtCommit => None,
        }
    }

    /// Answers a committed batch: at once, or once the log is synced.
    pub(super) fn committed(&self, answers: Vec<Box<dyn Answer>>) {
        match self {
            Durability::AfterSync(syncer) => {
                if let Err(mpsc::SendError(answers)) = syncer.batches.send(answers) {
                    // The syncer died (a panic): nothing can vouch for these writes.
                    for answer in answers {
                        answer.fail(LedgerError::unavailable(
                            "the ledger's sync thread stopped; the write may not be on disk",
                        ));
                    }
                }
            }
            Durability::AtCommit => answers.into_iter().for_each(Answer::send),
        }
    }

    /// Waits until every batch handed over has been answered (the writer's last step, before
    /// it closes the connection).
    pub(super) fn finish(self) {
        if let Durability::AfterSync(Syncer {
            batches, thread, ..
        }) = self
        {
            drop(batches);
            // A panic in the syncer has already failed its callers (their senders dropped).
            let _ = thread.join();
        }
    }
}

/// The `-wal` file SQLite keeps beside the database (`None` for an in-memory database).
fn wal_path(conn: &Connection) -> Option<PathBuf> {
    let path = conn.path().filter(|path| !path.is_empty())?;
    Some(Path::new(&format!("{path}-wal")).to_path_buf())
}

/// The sending side of the syncer thread.
#[derive(Debug)]
pub(super) struct Syncer {
    batches: mpsc::Sender<Vec<Box<dyn Answer>>>,
    thread: std::thread::JoinHandle<()>,
    /// Set once, by the first failed sync.
    failed: Arc<OnceLock<String>>,
}

impl Syncer {
    fn spawn(log: File, #[cfg(test)] hook: Option<BeforeSync>) -> Result<Syncer, LedgerError> {
        let (batches, queue) = mpsc::channel::<Vec<Box<dyn Answer>>>();
        let failed = Arc::new(OnceLock::new());
        let mark = Arc::clone(&failed);
        let thread = std::thread::Builder::new()
            .name("idempotent-retry-sqlite-sync".into())
            .spawn(move || {
                #[cfg(test)]
                let mut hook = hook;
                let sync = |covered: usize| {
                    #[cfg(test)]
                    if let Some(hook) = &mut hook {
                        hook(covered)?;
                    }
                    #[cfg(not(test))]
                    let _ = covered;
                    log.sync_data()
                };
                run(&queue, &mark, sync);
            })
            .map_err(|err| {
                LedgerError::unavailable("cannot start the ledger's sync thread").with_source(err)
            })?;
        Ok(Syncer {
            batches,
            thread,
            failed,
        })
    }
}

/// The syncer's loop: takes every batch waiting, syncs once, answers them all.
fn run(
    queue: &mpsc::Receiver<Vec<Box<dyn Answer>>>,
    failed: &OnceLock<String>,
    mut sync: impl FnMut(usize) -> std::io::Result<()>,
) {
    while let Ok(mut answers) = queue.recv() {
        while let Ok(more) = queue.try_recv() {
            answers.extend(more);
        }
        if let Some(why) = failed.get() {
            fail(answers, why);
            continue;
        }
        match sync(answers.len()) {
            Ok(()) => answers.into_iter().for_each(Answer::send),
            Err(err) => {
                let why = failed.get_or_init(|| err.to_string());
                fail(answers, why);
            }
        }
    }
}

fn fail(answers: Vec<Box<dyn Answer>>, why: &str) {
    for answer in answers {
        answer.fail(LedgerError::unavailable(format!(
            "the ledger's log could not be synced to disk ({why}); the write may not have been \
             recorded"
        )));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in WAL mode is answered after the syncer's sync; one that is not (an in-memory
    /// database here) keeps `synchronous = FULL` and is answered at its commit.
    #[test]
    fn only_a_file_in_wal_mode_is_synced_apart() {
        let dir = tempfile::tempdir().expect("temp dir");
        let wal = Connection::open(dir.path().join("wal.db")).expect("open");
        wal.pragma_update(None, "journal_mode", "WAL").expect("wal");
        let synchronous = |conn: &Connection| -> i64 {
            conn.pragma_query_value(None, "synchronous", |row| row.get(0))
                .expect("synchronous")
        };
        let durability = Durability::for_connection(&wal, None).expect("durability");
        assert!(
            matches!(durability, Durability::AfterSync(_)),
            "{durability:?}"
        );
        assert_eq!(synchronous(&wal), 1, "NORMAL: the syncer syncs");
        durability.finish();

        let memory = Connection::open_in_memory().expect("open");
        let durability = Durability::for_connection(&memory, None).expect("durability");
        assert!(matches!(durability, Durability::AtCommit), "{durability:?}");
        assert_eq!(synchronous(&memory), 2, "FULL: the commit syncs");
    }
}
