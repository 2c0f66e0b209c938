//! `idempotent-retry-ledger`: the operators' command over a ledger (feature `cli`).
//!
//! `list`, `show KEY`, `resolve KEY --done/--not-done/--send-again`, `purge`, `duplicates`,
//! over an SQLite file (`--sqlite PATH`) or a PostgreSQL database (`--postgres URL`, with the
//! `postgres` feature). Run it with `--help` for the options and the exit statuses; the
//! README's "After outcome unknown" says when to reach for it.
//!
//! `args.rs` reads the command line (clap, builder API), `render.rs` prints rows; this file
//! opens the ledger and runs the command through the library's public API, the same calls a
//! client makes (a resolution by hand holds the row under a lease, as a run would).
#![forbid(unsafe_code)]

mod args;
mod render;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::SystemTime;

use args::{Action, Invocation, Location, Verdict};
use idempotent_retry::{
    Clock, Ledger, LedgerError, ListFilter, Reconciled, Resolution, SavedResponse, SqliteLedger,
    TokioClock, resolve_by_hand,
};

/// How a command ended, as its exit status says.
enum Ending {
    Done,
    /// Nothing to do (exit 1), and why.
    Nothing(String),
}

fn main() -> ExitCode {
    let matches = match args::command().try_get_matches() {
        Ok(matches) => matches,
        // `--help` and `--version` print to stdout and exit 0; usage errors exit 2.
        Err(err) => err.exit(),
    };
    let invocation = match args::invocation(&matches) {
        Ok(invocation) => invocation,
        Err(message) => {
            let _ = args::command()
                .error(clap::error::ErrorKind::ArgumentConflict, message)
                .print();
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(run(invocation)) {
        Ok(Ending::Done) => ExitCode::SUCCESS,
        Ok(Ending::Nothing(why)) => {
            eprintln!("{why}");
            ExitCode::from(1)
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(3)
        }
    }
}

/// The schema version that added the columns this command reads (see the `Ledger` docs'
/// "Versions").
#[cfg(feature = "postgres")]
const RECONCILING_SCHEMA: u32 = 2;

async fn open(location: &Location) -> Result<Box<dyn Ledger>, LedgerError> {
    match location {
        Location::Sqlite(path) => {
            // Opening creates a missing file: an operator's typo must not look like an empty
            // ledger.
            if !path.is_file() {
                return Err(LedgerError::new(
                    idempotent_retry::LedgerErrorKind::InvalidInput,
                    format!("no ledger file at {}", path.display()),
                ));
            }
            Ok(Box::new(SqliteLedger::open(path).await?))
        }
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => {
            let ledger = idempotent_retry::PostgresLedger::connect(url).await?;
            // The workers migrate their database (once all of them run a release that knows the
            // new version); an operator's command reads it as they left it, and says so when it
            // is older than what the command reads.
            let version = ledger.schema_version().await?;
            if version < RECONCILING_SCHEMA {
                return Err(LedgerError::new(
                    idempotent_retry::LedgerErrorKind::InvalidInput,
                    format!(
                        "the database is at schema version {version}; this command reads version \
                         {RECONCILING_SCHEMA} (the request and resolution columns): run \
                         PostgresLedger::migrate once every worker runs this release"
                    ),
                ));
            }
            Ok(Box::new(ledger))
        }
        #[cfg(not(feature = "postgres"))]
        Location::Postgres(_) => Err(LedgerError::new(
            idempotent_retry::LedgerErrorKind::InvalidInput,
            "this build has no PostgreSQL support: build with --features cli,postgres",
        )),
    }
}

async fn run(invocation: Invocation) -> Result<Ending, LedgerError> {
    let ledger = open(&invocation.location).await?;
    let ledger = &*ledger;
    let now = invocation.now.unwrap_or_else(|| TokioClock::new().wall());
    let mut out = std::io::stdout().lock();
    let print = |out: &mut std::io::StdoutLock<'_>, text: &str| {
        // A closed pipe (`| head`) ends the output, not the command's work.
        let _ = out.write_all(text.as_bytes());
    };
    match invocation.action {
        Action::List {
            status,
            unresolved,
            scope,
            older_than,
            limit,
            json,
        } => {
            let mut filter = ListFilter::new(limit);
            if let Some(status) = status {
                filter = filter.status(status);
            }
            if unresolved {
                filter = filter.unresolved();
            }
            if let Some(scope) = scope {
                filter = filter.scope(scope);
            }
            if let Some(age) = older_than {
                filter = filter.older_than(now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH));
            }
            let rows = ledger.list(&filter).await?;
            if json {
                let rows: Vec<_> = rows.iter().map(render::json).collect();
                print(
                    &mut out,
                    &format!("{}\n", pretty(&serde_json::Value::Array(rows))),
                );
            } else {
                print(&mut out, &render::table(&rows, now));
            }
            Ok(Ending::Done)
        }
        Action::Show { key, json } => {
            let Some(row) = ledger.get(&key).await? else {
                return Ok(Ending::Nothing(format!("{key}: no such operation")));
            };
            if json {
                print(&mut out, &format!("{}\n", pretty(&render::json(&row))));
            } else {
                print(&mut out, &render::record(&row, now));
            }
            Ok(Ending::Done)
        }
        Action::Resolve {
            key,
            verdict,
            operator,
            reason,
        } => {
            let resolution = match verdict {
                Verdict::Done { status, body } => {
                    Resolution::Done(SavedResponse::new(status, Vec::new(), Some(body)))
                }
                Verdict::NotDone => Resolution::NotDone,
                Verdict::SendAgain => Resolution::SendAgain,
            };
            let outcome =
                resolve_by_hand(ledger, &key, resolution, &operator, Some(&reason), now).await?;
            Ok(match outcome {
                Reconciled::Resolved(kind) => {
                    print(
                        &mut out,
                        &format!("{key}: resolved {kind} by operator {operator}\n"),
                    );
                    Ending::Done
                }
                Reconciled::Busy => Ending::Nothing(format!(
                    "{key}: a live lease holds it (a run is sending it, or a reconciler asking); \
                     nothing changed: run `show {key}` and try again once it lapses"
                )),
                Reconciled::Settled(status) => Ending::Nothing(format!(
                    "{key}: it is {status}, not unresolved; nothing changed"
                )),
                Reconciled::Missing => Ending::Nothing(format!("{key}: no such operation")),
                other => Ending::Nothing(format!("{key}: nothing changed ({other:?})")),
            })
        }
        Action::Purge { batch } => {
            let mut total = 0u64;
            loop {
                let deleted = ledger.purge_batch(now, batch).await?;
                total += deleted;
                if deleted > 0 {
                    eprintln!("purged {deleted} rows ({total} so far)");
                }
                if deleted < u64::from(batch) {
                    break;
                }
            }
            print(
                &mut out,
                &format!(
                    "purged {total} expired rows (expiry at or before {})\n",
                    render::time(now)
                ),
            );
            Ok(Ending::Done)
        }
        Action::Duplicates { json } => {
            // Every row is read: an incident query, not one for a hot path.
            let rows = ledger.list(&ListFilter::new(u32::MAX)).await?;
            let groups = render::duplicates(&rows);
            if json {
                print(
                    &mut out,
                    &format!("{}\n", pretty(&render::duplicates_json(&groups))),
                );
            } else {
                print(&mut out, &render::duplicates_text(&groups));
            }
            Ok(Ending::Done)
        }
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).expect("a JSON value always serializes")
}
