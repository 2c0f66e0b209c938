//! The SQLite ledger's files are private whatever the umask: the database and its `-wal` and
//! `-shm` companions are created owner-only (0600). The umask is process-wide, so each case
//! runs this test binary again as a child under `sh -c 'umask ...'`.
#![cfg(all(unix, feature = "sqlite"))]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use idempotent_retry::ledger::{Claim, Ledger, SqliteLedger};

const CHILD: &str = "IDEMPOTENT_RETRY_LEDGER_FILES_DIR";

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|err| panic!("stat {}: {err}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// In the child: opens a new ledger, writes a row, and checks every file while it is open
/// (SQLite removes the companions when the last connection closes).
fn child(dir: &Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let path = dir.join("ops.db");
        let ledger = SqliteLedger::open(&path).await.expect("open");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200);
        let claim = Claim::builder("k", "f", "w/1", now, now + Duration::from_secs(60))
            .build()
            .expect("claim");
        ledger.claim(&claim).await.expect("claim");
        for file in ["ops.db", "ops.db-wal", "ops.db-shm"] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
    });
}

#[test]
fn the_files_are_owner_only_whatever_the_umask() {
    if let Some(dir) = std::env::var_os(CHILD) {
        child(Path::new(&dir));
        return;
    }
    let me = std::env::current_exe().expect("this test binary");
    for umask in ["022", "000", "077"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask} && exec \"$0\" --exact \"$1\""))
            .arg(&me)
            .arg(crate::support::test_name(
                module_path!(),
                "the_files_are_owner_only_whatever_the_umask",
            ))
            .env(CHILD, dir.path())
            // Captured, so the child's own test summary does not join this run's.
            .output()
            .expect("run the child");
        assert!(
            child.status.success(),
            "umask {umask}: {}\n{}{}",
            child.status,
            String::from_utf8_lossy(&child.stdout),
            String::from_utf8_lossy(&child.stderr)
        );
        assert_eq!(mode(&dir.path().join("ops.db")), 0o600, "umask {umask}");
    }
}
