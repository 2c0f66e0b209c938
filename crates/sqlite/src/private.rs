//! The ledger file is private to its owner: it holds replayable response bodies (receipts,
//! tokens, personal data) and the requests' URLs. A new file is created owner-only (0600)
//! whatever the umask, and SQLite gives its `-wal` and `-shm` companions the same mode; an
//! existing file that group or others can read is opened as it is, with one warning.

use std::path::Path;

use idempotent_retry_ledger::LedgerError;

fn storage_io(err: std::io::Error, path: &Path, what: &str) -> LedgerError {
    LedgerError::unavailable(format!("{what} {}: {err}", path.display())).with_source(err)
}

/// Creates `path` empty and owner-only when it does not exist yet; an existing file is left
/// as it is. Does nothing but report on platforms without Unix modes.
///
/// # Errors
///
/// [`LedgerErrorKind::Unavailable`](idempotent_retry_ledger::LedgerErrorKind::Unavailable) when the file cannot
/// be created (a missing directory, no permission).
pub(super) fn create_private(path: &Path) -> Result<(), LedgerError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(_) => {
                // The umask may only take bits away, never add them; set it exactly anyway.
                set_owner_only(path)?;
                return Ok(());
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(storage_io(err, path, "cannot create")),
        }
        warn_if_shared(path);
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(unix)]
fn set_owner_only(path: &Path) -> Result<(), LedgerError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|err| storage_io(err, path, "cannot make private"))
}

/// Warns, once per process and path, when group or others may read the file.
#[cfg(unix)]
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    static WARNED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return;
    }
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.iter().any(|seen| seen == path) {
        return;
    }
    warned.push(path.to_owned());
    tracing::warn!(
        path = %path.display(),
        mode = format_args!("{mode:04o}"),
        "the ledger file can be read by other users and holds replayable responses: \
         chmod 600 it (and its -wal and -shm files)"
    );
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn a_new_file_is_owner_only_and_an_existing_one_is_left_as_it_is() {
        let dir = tempfile::tempdir().expect("temp dir");
        let new = dir.path().join("new.db");
        create_private(&new).expect("create");
        assert_eq!(mode(&new), 0o600);
        let shared = dir.path().join("shared.db");
        std::fs::write(&shared, b"").expect("write");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        create_private(&shared).expect("exists");
        assert_eq!(mode(&shared), 0o644, "an operator's choice is kept");
        let missing = dir.path().join("no-such-dir").join("x.db");
        let err = create_private(&missing).expect_err("no directory");
        assert!(err.to_string().contains("no-such-dir"), "{err}");
    }
}
