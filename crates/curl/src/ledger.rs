//! Where the ledger is, and opening it: an SQLite file in the user's state directory by
//! default, private to the user.

use std::path::{Path, PathBuf};

use idempotent_retry::ClientBuilder;
use idempotent_retry::ledger::{LedgerError, SqliteLedger};

use crate::args::LedgerArg;

/// The ledger's file name in its directory.
const FILE_NAME: &str = "ledger.sqlite3";
/// The directory the command keeps its state in, under the platform's state directory.
const DIRECTORY: &str = "idemcurl";

/// The platform's directory for a program's state: `$XDG_STATE_HOME` (or
/// `~/.local/state`) on Linux and other Unix systems, `~/Library/Application Support` on macOS,
/// `%LOCALAPPDATA%` on Windows. Written by hand: it is these three rules.
fn state_home(get: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let absolute =
        |value: Option<String>| value.map(PathBuf::from).filter(|path| path.is_absolute());
    if cfg!(windows) {
        return absolute(get("LOCALAPPDATA"));
    }
    let home = absolute(get("HOME"));
    if cfg!(target_os = "macos") {
        return home.map(|home| home.join("Library").join("Application Support"));
    }
    absolute(get("XDG_STATE_HOME")).or_else(|| home.map(|home| home.join(".local").join("state")))
}

/// The default ledger file, from the environment.
pub(crate) fn default_path() -> Option<PathBuf> {
    state_home(|name| std::env::var(name).ok()).map(|dir| dir.join(DIRECTORY).join(FILE_NAME))
}

/// Makes the ledger's directory, private to the user (mode 0700 on Unix) when it is made here.
fn make_directory(path: &Path) -> std::io::Result<()> {
    let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) else {
        return Ok(());
    };
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// An open ledger.
#[derive(Debug)]
pub(crate) enum Opened {
    Sqlite(SqliteLedger, PathBuf),
    #[cfg(feature = "postgres")]
    Postgres(idempotent_retry::ledger::PostgresLedger),
}

impl Opened {
    /// The ledger as the report names it: the file's path, or `postgres`.
    pub(crate) fn name(&self) -> String {
        match self {
            Opened::Sqlite(_, path) => path.display().to_string(),
            #[cfg(feature = "postgres")]
            Opened::Postgres(_) => "postgres".to_owned(),
        }
    }

    /// The client builder with this ledger (a handle of it: this one closes it).
    pub(crate) fn attach(&self, builder: ClientBuilder) -> ClientBuilder {
        match self {
            Opened::Sqlite(ledger, _) => builder.ledger(ledger.clone()),
            #[cfg(feature = "postgres")]
            Opened::Postgres(ledger) => builder.ledger(ledger.clone()),
        }
    }

    /// Closes the ledger once the client's handle is gone, for at most `limit`. An SQLite
    /// file keeps its WAL (`SqliteLedger::close_keeping_log`): every write of the run was
    /// synced into it before it was answered, and a checkpoint per run would cost two more
    /// syncs here and two in the next run, which would create the log again.
    pub(crate) async fn close(self, limit: std::time::Duration) {
        match self {
            Opened::Sqlite(ledger, _) => {
                ledger.close_keeping_log(limit).await;
            }
            #[cfg(feature = "postgres")]
            Opened::Postgres(_) => {}
        }
    }
}

/// Opens the ledger the command line asks for; `Ok(None)` for `--no-ledger`.
pub(crate) async fn open(arg: &LedgerArg) -> Result<Option<Opened>, String> {
    let path = match arg {
        LedgerArg::None => return Ok(None),
        LedgerArg::Sqlite(path) => path.clone(),
        LedgerArg::Default => default_path().ok_or(
            "no state directory: HOME (or XDG_STATE_HOME, or LOCALAPPDATA on Windows) is not set \
             to an absolute path; give --ledger PATH, or --no-ledger",
        )?,
        LedgerArg::Postgres(url) => return open_postgres(url).await,
    };
    if path.is_dir() {
        return Err(format!(
            "the ledger {} is a directory: give --ledger the path of a file in it (created if \
             missing), such as {}",
            path.display(),
            path.join("ledger.sqlite3").display()
        ));
    }
    make_directory(&path).map_err(|err| {
        format!(
            "cannot make the ledger's directory for {}: {err}; give --ledger PATH, or --no-ledger",
            path.display()
        )
    })?;
    let ledger = SqliteLedger::open(&path)
        .await
        .map_err(|err| describe(&err, &path.display().to_string()))?;
    Ok(Some(Opened::Sqlite(ledger, path)))
}

fn describe(err: &LedgerError, what: &str) -> String {
    format!("cannot open the ledger {what}: {err}")
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str) -> Result<Option<Opened>, String> {
    use idempotent_retry::ledger::PostgresLedger;
    // The URL may hold a password: it is never repeated.
    let ledger = PostgresLedger::connect(url)
        .await
        .map_err(|err| describe(&err, "at --postgres"))?;
    ledger
        .migrate()
        .await
        .map_err(|err| describe(&err, "at --postgres"))?;
    Ok(Some(Opened::Postgres(ledger)))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str) -> Result<Option<Opened>, String> {
    Err(
        "this build has no PostgreSQL support: build idempotent-retry-curl with its default \
         feature postgres"
            .into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_directory_follows_the_platform_rules() {
        let env = crate::test_env::env;
        if cfg!(all(unix, not(target_os = "macos"))) {
            assert_eq!(
                state_home(env(&[("HOME", "/home/ada")])),
                Some(PathBuf::from("/home/ada/.local/state"))
            );
            assert_eq!(
                state_home(env(&[("HOME", "/home/ada"), ("XDG_STATE_HOME", "/var/st")])),
                Some(PathBuf::from("/var/st"))
            );
            // A relative XDG_STATE_HOME is ignored, as the XDG rules say.
            assert_eq!(
                state_home(env(&[("HOME", "/home/ada"), ("XDG_STATE_HOME", "rel")])),
                Some(PathBuf::from("/home/ada/.local/state"))
            );
            assert_eq!(state_home(env(&[("HOME", "relative")])), None);
            assert_eq!(state_home(env(&[])), None);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_directory_made_for_the_ledger_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("a").join("b").join(FILE_NAME);
        make_directory(&file).expect("made");
        let mode = std::fs::metadata(file.parent().expect("parent"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
