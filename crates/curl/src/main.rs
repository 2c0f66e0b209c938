//! `idemcurl`: curl's habits for requests with side effects. One idempotency key per
//! operation, sent on every attempt; retries only of what is safe (the `idempotent-retry`
//! engine decides); a ledger, an SQLite file in the user's state directory by default, so that
//! running the same operation again is answered from it instead of repeating the effect; and an
//! exit status that says whether it happened. `idemcurl --help` has the flags and the exit
//! statuses; `idemcurl ledger --help` the operators' commands.
//!
//! `args.rs` reads the command line, `payload.rs` the body and headers, `key.rs` chooses the
//! key, `ledger.rs` opens the ledger, `operation.rs` sends through the library's `Client` and
//! writes the answer (`output.rs`, `write_out.rs`), `report.rs` says what happened on stderr,
//! `exit.rs` holds the exit statuses.
#![forbid(unsafe_code)]
#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]

mod args;
mod exit;
mod key;
mod ledger;
mod operation;
mod output;
mod payload;
mod report;
mod write_out;

use std::ffi::OsString;
use std::process::ExitCode;

use exit::Exit;
use report::Report;

fn main() -> ExitCode {
    let arguments: Vec<OsString> = std::env::args_os().collect();
    if arguments.get(1).is_some_and(|first| first == "ledger") {
        let embedding = idempotent_retry_cli::Embedding {
            name: "idemcurl ledger",
            default_sqlite: ledger::default_path(),
        };
        return idempotent_retry_cli::run(&embedding, arguments.into_iter().skip(1));
    }
    let matches = match args::command().try_get_matches_from(arguments) {
        Ok(matches) => matches,
        // A flag idemcurl does not take: clap's own tip ("to pass '-k' as a value, use
        // '-- -k'") would make it the URL. Say what it is instead.
        Err(err) if err.kind() == clap::error::ErrorKind::UnknownArgument => {
            let flag = err
                .get(clap::error::ContextKind::InvalidArg)
                .map(ToString::to_string)
                .unwrap_or_default();
            return usage(unknown_flag(&flag), args::ReportFormat::Text);
        }
        // `--help` and `--version` print to stdout and exit 0; usage errors exit 2.
        Err(err) => err.exit(),
    };
    let invocation = match args::invocation(&matches) {
        Ok(invocation) => invocation,
        Err(message) => return usage(message, args::ReportFormat::Text),
    };
    let format = invocation.report;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => return usage(format!("cannot start the runtime: {err}"), format),
    };
    let report = runtime.block_on(operation::run(invocation));
    report.exit.into()
}

/// Reports a usage error found before anything was sent.
/// What a flag idemcurl does not take is, and where the ones it takes are listed.
fn unknown_flag(flag: &str) -> String {
    format!(
        "{flag} is not a flag idemcurl takes (it takes a subset of curl's: `idemcurl --help` \
         lists them, docs/idemcurl.md says how each differs from curl's)"
    )
}

fn usage(message: String, format: args::ReportFormat) -> ExitCode {
    let report = Report::usage(message);
    eprintln!(
        "{}",
        match format {
            args::ReportFormat::Text => report.text(),
            args::ReportFormat::Json => report.json(),
        }
    );
    Exit::Usage.into()
}

#[cfg(test)]
mod test_env {
    /// An environment of these variables only, as `std::env::var(name).ok()` reads one.
    pub(crate) fn env(
        pairs: &'static [(&'static str, &'static str)],
    ) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }
}
