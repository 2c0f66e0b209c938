//! The operators' command over an idempotent-retry ledger, as a library: the binary
//! `idempotent-retry-ledger` is [`main`], and another command embeds it (as `idemcurl ledger`
//! does) with [`run`].
//!
//! `list`, `show KEY`, `resolve KEY --done/--not-done/--send-again`, `release KEY`, `purge`,
//! `duplicates`, `migrate`, over an SQLite file (`--sqlite PATH`) or a PostgreSQL database
//! (`--postgres URL`, with the `postgres` feature). Run it with `--help` for the options and
//! the exit statuses; the README's "After outcome unknown" says when to reach for it.
//!
//! `args.rs` reads the command line (clap, builder API), `render.rs` prints rows; this file
//! opens the ledger and runs the command through the library's public API, the same calls a
//! client makes (a resolution or a release by hand holds the row under a lease, as a run
//! would). Only `migrate` changes the schema: the commands that read open an SQLite file
//! read-only, and every command refuses a ledger older than it reads.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod args;
mod render;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::SystemTime;

use args::{Action, Invocation, Location, MIN_PREFIX, Verdict};
use idempotent_retry::ledger::{
    Ledger, LedgerError, LedgerErrorKind, ListFilter, OperationRecord, OperationStatus,
    SavedResponse, SqliteLedger,
};
use idempotent_retry::reconcile::{
    Reconciled, Released, Resolution, release_by_hand, resolve_by_hand,
};
use idempotent_retry::time::{Clock, TokioClock};

/// How a command ended, as its exit status says.
enum Ending {
    Done,
    /// Nothing to do (exit 1), and why.
    Nothing(String),
}

/// Why a command could not run.
enum Failure {
    /// The ledger failed (exit 3).
    Ledger(LedgerError),
    /// The ledger is at an older schema version than the command reads (exit 4): the message,
    /// with the fix.
    Older(String),
}

impl From<LedgerError> for Failure {
    fn from(err: LedgerError) -> Self {
        Failure::Ledger(err)
    }
}

/// The keys a refused prefix lists.
const CANDIDATES: usize = 5;
/// The keys a prefix is counted up to.
const COUNTED: u32 = 100;

/// How the command is embedded: the name its messages and `--help` give it, and the SQLite
/// file it reads when neither `--sqlite` nor `--postgres` is given.
#[derive(Debug, Clone)]
pub struct Embedding {
    /// The command line that runs it, as `--help` and the fixes in messages spell it.
    pub name: &'static str,
    /// The ledger when the command line names none (none: one of the two is required).
    pub default_sqlite: Option<std::path::PathBuf>,
}

/// Runs `idempotent-retry-ledger` with the process's arguments.
pub fn main() -> ExitCode {
    run(
        &Embedding {
            name: "idempotent-retry-ledger",
            default_sqlite: None,
        },
        std::env::args_os(),
    )
}

/// Runs the command with these arguments (the first is the program's name, as in
/// `std::env::args_os`): its output on stdout and stderr, its exit status returned (0 done,
/// 1 nothing to do, 2 usage error, 3 ledger error, 4 older schema; `--help` lists them).
pub fn run(embedding: &Embedding, args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let matches = match args::command(embedding.name).try_get_matches_from(args) {
        Ok(matches) => matches,
        // `--help` and `--version` print to stdout and exit 0; usage errors exit 2.
        Err(err) => err.exit(),
    };
    let invocation = match args::invocation(&matches, embedding.default_sqlite.as_deref()) {
        Ok(invocation) => invocation,
        Err(message) => {
            let _ = args::command(embedding.name)
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
    match runtime.block_on(execute(embedding.name, invocation)) {
        Ok(Ending::Done) => ExitCode::SUCCESS,
        Ok(Ending::Nothing(why)) => {
            eprintln!("{why}");
            ExitCode::from(1)
        }
        Err(Failure::Ledger(err)) => {
            eprintln!("error: {err}");
            ExitCode::from(3)
        }
        Err(Failure::Older(why)) => {
            eprintln!("error: {why}");
            ExitCode::from(4)
        }
    }
}

/// The schema version that added the columns this command reads (docs/ledger.md,
/// "Versions").
#[cfg(feature = "postgres")]
const RECONCILING_SCHEMA: u32 = 2;

/// The schema version that added the `not_sent` status, which `release` writes: a database
/// reaches it only once its workers can read such a row (a worker that cannot refuses it).
#[cfg(feature = "postgres")]
const NOT_SENT_SCHEMA: u32 = 3;

/// `path` as a shell word, to paste into a command line.
fn shell_word(path: &std::path::Path) -> String {
    let text = path.display().to_string();
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c))
    {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// The refusal of a ledger at schema version `found`, older than `reads`; `fix` is the
/// migrate command line.
fn older(what: &str, found: u32, reads: u32, fix: &str) -> Failure {
    Failure::Older(format!(
        "{what} is at schema version {found}; this command reads version {reads}: run `{fix}` \
         once every process using it runs a release that knows version {reads} (an older \
         release refuses a ledger newer than it knows)"
    ))
}

/// Refuses a missing SQLite file before anything opens it: an operator's typo must not look
/// like an empty ledger, and `SqliteLedger::open` would create it.
fn existing(path: &std::path::Path) -> Result<(), Failure> {
    if path.is_file() {
        Ok(())
    } else {
        Err(LedgerError::new(
            LedgerErrorKind::InvalidInput,
            format!("no ledger file at {}", path.display()),
        )
        .into())
    }
}

/// Opens the ledger for `action`: an SQLite file read-only when the action only reads, and
/// never one at an older schema version (`migrate` opens it itself).
async fn open(
    name: &str,
    location: &Location,
    action: &Action,
) -> Result<Box<dyn Ledger>, Failure> {
    match location {
        Location::Sqlite(path) => {
            existing(path)?;
            let found = SqliteLedger::file_schema_version(path).await?;
            let reads = SqliteLedger::SCHEMA_VERSION;
            if found < reads {
                let fix = format!("{name} --sqlite {} migrate", shell_word(path));
                return Err(older(&path.display().to_string(), found, reads, &fix));
            }
            // A newer file is refused by the opening itself, with both versions.
            Ok(if action.reads_only() {
                Box::new(SqliteLedger::open_read_only(path).await?)
            } else {
                Box::new(SqliteLedger::open(path).await?)
            })
        }
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => {
            let ledger = idempotent_retry::ledger::PostgresLedger::connect(url).await?;
            // The workers migrate their database (once all of them run a release that knows the
            // new version); an operator's command reads it as they left it, and says so when it
            // is older than what the command reads or writes.
            let version = ledger.schema_version().await?;
            let reads = if matches!(action, Action::Release { .. }) {
                NOT_SENT_SCHEMA
            } else {
                RECONCILING_SCHEMA
            };
            if version < reads {
                // The URL may hold a password: it is not repeated.
                let fix = format!("{name} --postgres URL migrate");
                return Err(older("the database", version, reads, &fix));
            }
            Ok(Box::new(ledger))
        }
        #[cfg(not(feature = "postgres"))]
        Location::Postgres(_) => Err(no_postgres().into()),
    }
}

#[cfg(not(feature = "postgres"))]
fn no_postgres() -> LedgerError {
    LedgerError::new(
        LedgerErrorKind::InvalidInput,
        "this build has no PostgreSQL support: install it with its default features \
         (`cargo install idempotent-retry-cli`), or build it with --features postgres",
    )
}

/// Brings the ledger to this release's schema version: the versions before and after.
async fn migrate(location: &Location) -> Result<(u32, u32), Failure> {
    match location {
        Location::Sqlite(path) => {
            existing(path)?;
            let from = SqliteLedger::file_schema_version(path).await?;
            if from == SqliteLedger::SCHEMA_VERSION {
                return Ok((from, from));
            }
            // Opening migrates (and refuses a newer file, leaving it as it is).
            let ledger = SqliteLedger::open(path).await?;
            Ok((from, ledger.schema_version().await?))
        }
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => {
            let ledger = idempotent_retry::ledger::PostgresLedger::connect(url).await?;
            let from = ledger.schema_version().await?;
            ledger.migrate().await?;
            Ok((from, ledger.schema_version().await?))
        }
        #[cfg(not(feature = "postgres"))]
        Location::Postgres(_) => Err(no_postgres().into()),
    }
}

/// What `show` found for `key`: the row with that key, else the one row whose key starts with
/// it.
enum Found {
    Row(Box<OperationRecord>),
    Nothing(String),
}

async fn find(ledger: &dyn Ledger, key: &str) -> Result<Found, LedgerError> {
    if let Some(row) = ledger.get(key).await? {
        return Ok(Found::Row(Box::new(row)));
    }
    if key.chars().count() < MIN_PREFIX {
        return Ok(Found::Nothing(format!(
            "{key}: no such operation (a key prefix needs {MIN_PREFIX} characters or more)"
        )));
    }
    let mut rows = ledger
        .list(&ListFilter::new(COUNTED + 1).key_prefix(key))
        .await?;
    Ok(match rows.len() {
        0 => Found::Nothing(format!(
            "{key}: no such operation, and no key starts with it"
        )),
        1 => Found::Row(Box::new(rows.remove(0))),
        many => {
            let count = if many > COUNTED as usize {
                format!("more than {COUNTED} keys start with it")
            } else {
                format!("{many} keys start with it")
            };
            let shown = if many > CANDIDATES {
                format!(", the first {CANDIDATES} here")
            } else {
                String::new()
            };
            Found::Nothing(format!(
                "{key}: ambiguous key prefix: {count}{shown}; give more of the key\n{}",
                render::candidates(&rows, CANDIDATES).trim_end()
            ))
        }
    })
}

/// The answer of `resolve` and `release` for a key no row has: those commands write, so they
/// take the whole key, and say so when `key` is the prefix of one.
async fn missing(ledger: &dyn Ledger, key: &str) -> Result<Ending, LedgerError> {
    let starting = if key.chars().count() >= MIN_PREFIX {
        ledger
            .list(&ListFilter::new(COUNTED + 1).key_prefix(key))
            .await?
            .len()
    } else {
        0
    };
    Ok(Ending::Nothing(match starting {
        0 => format!("{key}: no such operation"),
        1 => format!(
            "{key}: no such operation; one key starts with it, but commands that change a row \
             take the whole key: `show {key}` prints it"
        ),
        many => format!(
            "{key}: no such operation; {} keys start with it, but commands that change a row \
             take the whole key: `show {key}` lists them",
            if many > COUNTED as usize {
                format!("more than {COUNTED}")
            } else {
                many.to_string()
            }
        ),
    }))
}

async fn execute(name: &str, invocation: Invocation) -> Result<Ending, Failure> {
    let mut out = std::io::stdout().lock();
    let print = |out: &mut std::io::StdoutLock<'_>, text: &str| {
        // A closed pipe (`| head`) ends the output, not the command's work.
        let _ = out.write_all(text.as_bytes());
    };
    if let Action::Migrate = invocation.action {
        let (from, to) = migrate(&invocation.location).await?;
        let text = if from == to {
            format!("at schema version {to} already; nothing changed\n")
        } else {
            format!("migrated from schema version {from} to {to}\n")
        };
        print(&mut out, &text);
        return Ok(Ending::Done);
    }
    let ledger = open(name, &invocation.location, &invocation.action).await?;
    let ledger = &*ledger;
    let now = invocation.now.unwrap_or_else(|| TokioClock::new().wall());
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
                let rows: Vec<_> = rows.iter().map(|row| render::json(row, false)).collect();
                print(
                    &mut out,
                    &format!("{}\n", pretty(&serde_json::Value::Array(rows))),
                );
            } else {
                print(&mut out, &render::table(&rows, now));
            }
            Ok(Ending::Done)
        }
        Action::Show { key, json, reveal } => {
            let row = match find(ledger, &key).await? {
                Found::Row(row) => row,
                Found::Nothing(why) => return Ok(Ending::Nothing(why)),
            };
            if json {
                print(
                    &mut out,
                    &format!("{}\n", pretty(&render::json(&row, reveal))),
                );
            } else {
                print(&mut out, &render::record(&row, now, reveal));
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
                Reconciled::Missing => missing(ledger, &key).await?,
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
        Action::Release {
            key,
            operator,
            reason,
            force,
        } => {
            let released = release_by_hand(ledger, &key, &operator, &reason, force, now).await?;
            Ok(match released {
                Released::Released(previous) => {
                    print(
                        &mut out,
                        &format!("{key}: released by operator {operator} (it was {previous})\n"),
                    );
                    Ending::Done
                }
                Released::MayHaveRun(status) => {
                    let what = if status == OperationStatus::FailedFinal {
                        "failed_final with a saved answer".to_owned()
                    } else {
                        status.to_string()
                    };
                    Ending::Nothing(format!(
                        "{key}: it is {what}, so it may have run, and a new request under the key \
                         could run it again or be refused by the receiver; nothing changed: \
                         check the receiver, then --force releases it"
                    ))
                }
                Released::Succeeded => Ending::Nothing(format!(
                    "{key}: it succeeded, and the receiver answers the key with its saved \
                     response; nothing changed: send a different request under a new key"
                )),
                Released::Busy => Ending::Nothing(format!(
                    "{key}: a live lease holds it (a run is sending it, or a reconciler asking); \
                     nothing changed: run `show {key}` and try again once it lapses"
                )),
                Released::Missing => missing(ledger, &key).await?,
                other => Ending::Nothing(format!("{key}: nothing changed ({other:?})")),
            })
        }
        Action::Migrate => unreachable!("migrate is run before the ledger is opened"),
    }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).expect("a JSON value always serializes")
}
