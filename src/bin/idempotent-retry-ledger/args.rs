//! The command line: clap's builder (its `--help`, its usage errors with exit status 2),
//! read into a [`Invocation`].

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use idempotent_retry::OperationStatus;

/// Where the ledger is.
#[derive(Debug)]
pub(crate) enum Location {
    Sqlite(PathBuf),
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres(String),
}

/// How a resolution by hand settles the operation.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// It ran: replay this status and body from now on.
    Done {
        status: u16,
        body: Vec<u8>,
    },
    NotDone,
    SendAgain,
}

/// What to do.
#[derive(Debug)]
pub(crate) enum Action {
    List {
        status: Option<OperationStatus>,
        unresolved: bool,
        scope: Option<String>,
        older_than: Option<Duration>,
        limit: u32,
        json: bool,
    },
    Show {
        key: String,
        json: bool,
    },
    Resolve {
        key: String,
        verdict: Verdict,
        operator: String,
        reason: String,
    },
    Purge {
        batch: u32,
    },
    Duplicates {
        json: bool,
    },
}

/// One run of the command.
#[derive(Debug)]
pub(crate) struct Invocation {
    pub(crate) location: Location,
    /// The time ages and expiry are reckoned at (the clock, unless `--now` says).
    pub(crate) now: Option<SystemTime>,
    pub(crate) action: Action,
}

const EXIT_CODES: &str = "\
Exit status:
  0  done
  1  nothing to do: no such operation, or it is not unresolved, or a live lease holds it
  2  usage error
  3  the ledger could not be opened, read or written";

/// The command's definition.
pub(crate) fn command() -> Command {
    let json = || {
        Arg::new("json")
            .long("json")
            .action(ArgAction::SetTrue)
            .help("Print JSON instead of text")
    };
    let key = || {
        Arg::new("key")
            .value_name("KEY")
            .required(true)
            .help("The idempotency key")
    };
    Command::new("idempotent-retry-ledger")
        .about("Inspect and settle the operations an idempotent-retry ledger records")
        .long_about(
            "Inspect and settle the operations an idempotent-retry ledger records: list them, \
             show one, resolve an unknown outcome by hand, purge expired rows, and find the \
             same request sent under several keys.",
        )
        .version(env!("CARGO_PKG_VERSION"))
        .after_help(EXIT_CODES)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .arg(
            Arg::new("sqlite")
                .long("sqlite")
                .value_name("PATH")
                .value_parser(clap::value_parser!(PathBuf))
                .global(true)
                .help("The ledger's SQLite file (it must exist; it is migrated to the current schema)"),
        )
        .arg(
            Arg::new("postgres")
                .long("postgres")
                .value_name("URL")
                .global(true)
                .help("The ledger's PostgreSQL database, as a URL (postgres://user@host/db); needs the postgres feature"),
        )
        .arg(
            Arg::new("now")
                .long("now")
                .value_name("TIME")
                .global(true)
                .help("Reckon ages and expiry at this RFC 3339 time instead of the clock's"),
        )
        .subcommand(
            Command::new("list")
                .about("List operations, oldest first")
                .arg(
                    Arg::new("status")
                        .long("status")
                        .value_name("STATUS")
                        .value_parser(["in_flight", "succeeded", "failed_final", "unknown", "unresolved"])
                        .help("Only this status (unresolved: unknown or in flight)"),
                )
                .arg(Arg::new("scope").long("scope").value_name("SCOPE").help("Only this scope"))
                .arg(
                    Arg::new("older-than")
                        .long("older-than")
                        .value_name("DURATION")
                        .help("Only operations first attempted at least this long ago (90s, 2h, 1day)"),
                )
                .arg(
                    Arg::new("limit")
                        .long("limit")
                        .value_name("N")
                        .default_value("100")
                        .value_parser(clap::value_parser!(u32).range(1..))
                        .help("At most this many"),
                )
                .arg(json()),
        )
        .subcommand(
            Command::new("show")
                .about("Show one operation's record")
                .arg(key())
                .arg(json()),
        )
        .subcommand(
            Command::new("resolve")
                .about("Settle an unresolved operation by hand, recording who and why")
                .arg(key())
                .arg(Arg::new("done").long("done").action(ArgAction::SetTrue).help(
                    "It ran: the next run replays --response-status and --body instead of sending",
                ))
                .arg(Arg::new("not-done").long("not-done").action(ArgAction::SetTrue).help(
                    "It did not run: the next run sends it with the same key in a new window",
                ))
                .arg(Arg::new("send-again").long("send-again").action(ArgAction::SetTrue).help(
                    "Unknown, but the receiver still holds the key: the next run sends it again \
                     with the same key in a new window",
                ))
                .group(
                    ArgGroup::new("verdict")
                        .args(["done", "not-done", "send-again"])
                        .required(true),
                )
                .arg(
                    Arg::new("response-status")
                        .long("response-status")
                        .value_name("CODE")
                        .default_value("200")
                        .value_parser(clap::value_parser!(u16).range(100..=599))
                        .requires("done")
                        .help("With --done: the status to replay"),
                )
                .arg(
                    Arg::new("body")
                        .long("body")
                        .value_name("TEXT")
                        .requires("done")
                        .help("With --done: the body to replay (empty by default)"),
                )
                .arg(
                    Arg::new("operator")
                        .long("operator")
                        .value_name("NAME")
                        .required(true)
                        .help("Who resolves it (recorded)"),
                )
                .arg(
                    Arg::new("reason")
                        .long("reason")
                        .value_name("TEXT")
                        .required(true)
                        .help("Why (recorded)"),
                ),
        )
        .subcommand(
            Command::new("purge")
                .about("Delete expired rows in batches, with a progress line per batch on stderr")
                .arg(
                    Arg::new("batch")
                        .long("batch")
                        .value_name("N")
                        .default_value("1000")
                        .value_parser(clap::value_parser!(u32).range(1..))
                        .help("Rows deleted per transaction"),
                ),
        )
        .subcommand(
            Command::new("duplicates")
                .about(
                    "Requests recorded under more than one key (the same scope and fingerprint): \
                     \"did we charge twice?\"",
                )
                .arg(json()),
        )
}

/// Reads the parsed arguments; `Err` is a usage error's message.
pub(crate) fn invocation(matches: &ArgMatches) -> Result<Invocation, String> {
    let (name, sub) = matches
        .subcommand()
        .ok_or("a command is required (list, show, resolve, purge, duplicates)")?;
    let location = match (
        sub.get_one::<PathBuf>("sqlite"),
        sub.get_one::<String>("postgres"),
    ) {
        (Some(path), None) => Location::Sqlite(path.clone()),
        (None, Some(url)) => Location::Postgres(url.clone()),
        (None, None) => {
            return Err("say where the ledger is: --sqlite PATH or --postgres URL".into());
        }
        (Some(_), Some(_)) => return Err("give --sqlite or --postgres, not both".into()),
    };
    let now = sub
        .get_one::<String>("now")
        .map(|text| {
            humantime::parse_rfc3339_weak(text)
                .map_err(|err| format!("--now {text:?} is not an RFC 3339 time: {err}"))
        })
        .transpose()?;
    let json = || sub.get_flag("json");
    let key = || sub.get_one::<String>("key").cloned().unwrap_or_default();
    let action = match name {
        "list" => {
            let status = sub.get_one::<String>("status").map(String::as_str);
            Action::List {
                status: match status {
                    None | Some("unresolved") => None,
                    Some(text) => Some(text.parse().map_err(|err| format!("--status: {err}"))?),
                },
                unresolved: status == Some("unresolved"),
                scope: sub.get_one::<String>("scope").cloned(),
                older_than: sub
                    .get_one::<String>("older-than")
                    .map(|text| {
                        humantime::parse_duration(text).map_err(|err| {
                            format!("--older-than {text:?} is not a duration: {err}")
                        })
                    })
                    .transpose()?,
                limit: *sub.get_one::<u32>("limit").expect("it has a default"),
                json: json(),
            }
        }
        "show" => Action::Show {
            key: key(),
            json: json(),
        },
        "resolve" => Action::Resolve {
            key: key(),
            verdict: if sub.get_flag("done") {
                Verdict::Done {
                    status: *sub
                        .get_one::<u16>("response-status")
                        .expect("it has a default"),
                    body: sub
                        .get_one::<String>("body")
                        .map(|body| body.clone().into_bytes())
                        .unwrap_or_default(),
                }
            } else if sub.get_flag("not-done") {
                Verdict::NotDone
            } else {
                Verdict::SendAgain
            },
            operator: sub
                .get_one::<String>("operator")
                .cloned()
                .unwrap_or_default(),
            reason: sub.get_one::<String>("reason").cloned().unwrap_or_default(),
        },
        "purge" => Action::Purge {
            batch: *sub.get_one::<u32>("batch").expect("it has a default"),
        },
        "duplicates" => Action::Duplicates { json: json() },
        other => return Err(format!("unknown command {other}")),
    };
    Ok(Invocation {
        location,
        now,
        action,
    })
}
