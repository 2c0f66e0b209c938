//! Running the command as a process, every wait bounded.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The longest any one invocation may take in these tests.
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(60);

/// What one invocation did.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: String,
}

impl Ran {
    pub(crate) fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The `--report json` object (the last line of stderr).
    pub(crate) fn report(&self) -> serde_json::Value {
        let line = self.stderr.lines().last().unwrap_or_default();
        serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {:?}", self.stderr))
    }
}

/// A ledger file of the test's own.
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    pub(crate) fn ledger(&self) -> PathBuf {
        self.dir.path().join("ledger.sqlite3")
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The command with no run identity from the test's own environment, its state directory in
/// `state`.
pub(crate) fn idemcurl(state: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_idemcurl"));
    command
        .env_remove("IDEMPOTENT_RETRY_RUN")
        .env_remove("IDEMPOTENT_RETRY_STEP")
        .env_remove("IDEMCURL_SEAL_KEYS")
        .env("XDG_STATE_HOME", state)
        .env("HOME", state)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs it to the end, for at most [`RUN_LIMIT`].
pub(crate) async fn run(mut command: tokio::process::Command) -> Ran {
    let child = command.spawn().expect("idemcurl starts");
    finish(child).await
}

/// Waits for a started invocation, for at most [`RUN_LIMIT`].
pub(crate) async fn finish(child: tokio::process::Child) -> Ran {
    let output = tokio::time::timeout(RUN_LIMIT, child.wait_with_output())
        .await
        .expect("idemcurl ends within the limit")
        .expect("idemcurl's output");
    Ran {
        code: output.status.code().unwrap_or(-1),
        stdout: output.stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
