//! Acknowledgement after the disk: committed writes are answered only once the write-ahead
//! log that holds them is synced, and one sync covers every write the writer committed since
//! the last one.
//!
//! In WAL mode a commit appends the transaction's pages to the `-wal` file, and
//! `synchronous = FULL` differs from `NORMAL` only in syncing that file before `COMMIT`
//! returns. The writer commits with `NORMAL`, holds the answers of what it committed here, and
//! at the end of each turn of its loop syncs the `-wal` file once and only then answers their
//! callers. A write is thus acknowledged exactly when it would have been under `FULL`: once it
//! is on the disk, one sync covering every write queued meanwhile. Checkpoints sync both files
//! themselves, so a restarted log never drops an unsynced commit. Why the sync runs on the
//! writer's own thread: `docs/sqlite.md`.
//!
//! A failed sync leaves the log's state on the disk unknown (the kernel may have dropped the
//! pages it could not write), so it is final: the writes it covered are told they may not have
//! been recorded, and every later write is refused, until the ledger is opened again.
//!
//! A file that is not in WAL mode (a file system without shared memory, say) keeps
//! `synchronous = FULL` and its writes are answered at their commit ([`Durability::AtCommit`]).

use std::fs::File;
use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::storage;
use idempotent_retry_ledger::LedgerError;

/// What the writer runs before each sync, given the number of answers it covers; an error
/// stands for a failed sync (tests hold or fail the sync there).
#[cfg(test)]
pub(super) type BeforeSync = Box<dyn FnMut(usize) -> std::io::Result<()> + Send>;

/// A write's result, held until its transaction is durable.
pub(super) trait Answer: Send {
    /// The write is durable: sends its own result.
    fn send(self: Box<Self>);
    /// The write was not recorded, or may not have been: sends `err` instead.
    fn fail(self: Box<Self>, err: LedgerError);
}

/// When a committed write is answered.
pub(super) enum Durability {
    /// After the writer synced the log (WAL mode, `synchronous = NORMAL`).
    AfterSync(LogSync),
    /// At `COMMIT`, which synced the file itself (`synchronous = FULL`).
    AtCommit,
}

impl std::fmt::Debug for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::AfterSync(log) => f
                .debug_struct("AfterSync")
                .field("waiting", &log.waiting.len())
                .field("failed", &log.failed)
                .finish(),
            Durability::AtCommit => f.write_str("AtCommit"),
        }
    }
}

impl Durability {
    /// Sets the connection up for its journal mode: in WAL mode, with the `-wal` file open
    /// for syncing, commits with `NORMAL`; otherwise with `FULL`.
    ///
    /// # Errors
    ///
    /// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when SQLite
    /// refuses the setting.
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
        Ok(Durability::AfterSync(LogSync {
            log,
            waiting: Vec::new(),
            failed: None,
            #[cfg(test)]
            hook,
        }))
    }

    /// Why writes are refused: a sync failed, so nothing written since can be promised.
    pub(super) fn refused(&self) -> Option<LedgerError> {
        match self {
            Durability::AfterSync(LogSync {
                failed: Some(why), ..
            }) => Some(LedgerError::unavailable(format!(
                "the ledger's log could not be synced to disk ({why}); writes are refused \
                 until the ledger is opened again"
            ))),
            Durability::AfterSync(_) | Durability::AtCommit => None,
        }
    }

    /// Takes the answers of a committed transaction: sent at once, or held for the next
    /// [`flush`](Self::flush).
    pub(super) fn committed(&mut self, answers: Vec<Box<dyn Answer>>) {
        match self {
            Durability::AfterSync(log) => log.waiting.extend(answers),
            Durability::AtCommit => answers.into_iter().for_each(Answer::send),
        }
    }

    /// Syncs the log once for every answer held, then sends them (or, if the sync failed, the
    /// failure). Nothing to do when nothing was committed since the last flush.
    pub(super) fn flush(&mut self) {
        if let Durability::AfterSync(log) = self {
            log.flush();
        }
    }
}

/// The `-wal` file SQLite keeps beside the database (`None` for an in-memory database).
fn wal_path(conn: &Connection) -> Option<PathBuf> {
    let path = conn.path().filter(|path| !path.is_empty())?;
    Some(Path::new(&format!("{path}-wal")).to_path_buf())
}

/// The `-wal` file, and the answers of the writes committed to it since its last sync.
pub(super) struct LogSync {
    log: File,
    waiting: Vec<Box<dyn Answer>>,
    /// Set once, by the first failed sync.
    failed: Option<String>,
    #[cfg(test)]
    hook: Option<BeforeSync>,
}

impl LogSync {
    fn flush(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let answers = std::mem::take(&mut self.waiting);
        if let Some(why) = &self.failed {
            fail(answers, why);
            return;
        }
        match self.sync(answers.len()) {
            Ok(()) => answers.into_iter().for_each(Answer::send),
            Err(err) => fail(answers, self.failed.insert(err.to_string())),
        }
    }

    fn sync(&mut self, covered: usize) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(hook) = &mut self.hook {
            hook(covered)?;
        }
        #[cfg(not(test))]
        let _ = covered;
        self.log.sync_data()
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

    /// A file in WAL mode is answered after the writer syncs its log; one that is not (an
    /// in-memory database here) keeps `synchronous = FULL` and is answered at its commit.
    #[test]
    fn only_a_file_in_wal_mode_is_synced_after_its_commit() {
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
        assert_eq!(
            synchronous(&wal),
            1,
            "NORMAL: the writer syncs the log itself"
        );

        let memory = Connection::open_in_memory().expect("open");
        let durability = Durability::for_connection(&memory, None).expect("durability");
        assert!(matches!(durability, Durability::AtCommit), "{durability:?}");
        assert_eq!(synchronous(&memory), 2, "FULL: the commit syncs");
    }
}
