//! `idempotent-retry-ledger`: list, show, resolve, release, purge, find duplicates and migrate
//! an idempotent-retry ledger. `--help` has the options and the exit statuses.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    idempotent_retry_cli::main()
}
