//! The command line: clap's builder (its `--help`, its usage errors with exit status 2),
//! read into a [`Invocation`].

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Arg, ArgAction, ArgGroup, ArgMatches, Command};
use idempotent_retry::ledger::OperationStatus;

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
        reveal: bool,
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
    Release {
        key: String,
        operator: String,
        reason: String,
        force: bool,
    },
    Migrate,
}

impl Action {
    /// Whether the command only reads the ledger, so it opens an SQLite file read-only.
    pub(crate) fn reads_only(&self) -> bool {
        matches!(
            self,
            Action::List { .. } | Action::Show { .. } | Action::Duplicates { .. }
        )
    }
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
  1  nothing to do: no such operation, an ambiguous key prefix (show), or a row the command
     refuses: not unresolved (resolve), succeeded or maybe run (release), held by a live lease
  2  usage error
  3  the ledger could not be opened, read or written
  4  the ledger is at an older schema version than this command reads: run `migrate`";

/// The fewest characters `show` takes as a key prefix.
pub(crate) const MIN_PREFIX: usize = 6;

/// The command's definition.
pub(crate) fn command(name: &'static str) -> Command {
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
    let operator = || {
        Arg::new("operator")
            .long("operator")
            .value_name("NAME")
            .required(true)
            .value_parser(clap::builder::NonEmptyStringValueParser::new())
    };
    let reason = || {
        Arg::new("reason")
            .long("reason")
            .value_name("TEXT")
            .required(true)
            .value_parser(clap::builder::NonEmptyStringValueParser::new())
    };
    Command::new(name)
        // The usage lines name the command as it is typed (`idemcurl ledger resolve ...`).
        .bin_name(name)
        .about("Inspect and settle the operations an idempotent-retry ledger records")
        .long_about(
            "Inspect and settle the operations an idempotent-retry ledger records: list them, \
             show one, resolve an unknown outcome by hand, release a key by hand, purge expired \
             rows, find the same request sent under several keys, and migrate the schema.",
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
                .help("The ledger's SQLite file (it must exist; list, show and duplicates open it read-only; only migrate changes its schema)"),
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
                .after_help(EXIT_CODES)
                .about("List operations, oldest first")
                .arg(
                    Arg::new("status")
                        .long("status")
                        .value_name("STATUS")
                        .value_parser(["in_flight", "succeeded", "failed_final", "unknown", "not_sent", "queued", "unresolved"])
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
                .after_help(EXIT_CODES)
                .about("Show one operation's record, its saved body too")
                .long_about(format!(
                    "Show one operation's record. KEY is the whole key, or a prefix of at least \
                     {MIN_PREFIX} characters that only one key starts with; an ambiguous prefix \
                     is refused with the first keys that start with it. The text shows the saved \
                     body's first lines (control characters escaped), or its size and first bytes \
                     in hex when it is not UTF-8; --json has all of it. The values of saved \
                     headers that look like credentials are masked unless --reveal is given; a \
                     sealed answer shows the id of the key that sealed it, never its contents."
                ))
                .arg(key().help(format!(
                    "The idempotency key, or a unique prefix of it ({MIN_PREFIX} characters or more)"
                )))
                .arg(json())
                .arg(
                    Arg::new("reveal")
                        .long("reveal")
                        .action(ArgAction::SetTrue)
                        .help(
                            "Print the values of saved headers that look like credentials \
                             (Set-Cookie, Authorization, names with token or key), masked by default",
                        ),
                ),
        )
        .subcommand(
            Command::new("resolve")
                .after_help(EXIT_CODES)
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
                .arg(operator().help("Who resolves it (recorded)"))
                .arg(reason().help("Why (recorded)")),
        )
        .subcommand(
            Command::new("purge")
                .after_help(EXIT_CODES)
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
                .after_help(EXIT_CODES)
                .about(
                    "Requests recorded under more than one key (the same scope and fingerprint): \
                     \"did we charge twice?\"",
                )
                .arg(json()),
        )
        .subcommand(
            Command::new("release")
                .after_help(EXIT_CODES)
                .about("Free one key by hand, recording who and why: the next request under it is sent")
                .long_about(
                    "Free one key by hand, recording who and why: its row becomes not_sent, with a \
                     resolution of kind released, so the next request sent under the key is sent \
                     (the same request or another) in a new window, instead of being replayed, \
                     refused as a key reuse or held for reconciling.\n\n\
                     Use it when you know what the ledger cannot: no attempt under the key reached \
                     the receiver (a wrong address, a receiver that was down), or the receiver has \
                     forgotten the key and nothing ran.\n\n\
                     It refuses a row whose operation may have run (unknown, in_flight under a \
                     lapsed lease, failed_final with a saved answer), because sending again could \
                     then run it twice, or be refused by a receiver that remembers the key: check \
                     the receiver first, then --force releases it anyway. It always refuses a \
                     succeeded row (it replays its saved answer; send a different request under a \
                     new key) and a row a live lease holds (a run is sending it: try again once it \
                     lapses). It takes the whole key, not a prefix.",
                )
                .arg(key())
                .arg(operator().help("Who releases it (recorded)"))
                .arg(reason().help("Why (recorded)"))
                .arg(
                    Arg::new("force")
                        .long("force")
                        .action(ArgAction::SetTrue)
                        .help("Release a row whose operation may have run (never a succeeded one)"),
                ),
        )
        .subcommand(
            Command::new("migrate")
                .after_help(EXIT_CODES)
                .about("Bring the ledger's schema to this release's version, saying from which to which")
                .long_about(
                    "Bring the ledger's schema to this release's version, saying from which to \
                     which. Only this command changes the schema: the others refuse a ledger at an \
                     older version (exit status 4). Run it once every process using the ledger \
                     runs a release that knows the new version: an older release refuses a ledger \
                     newer than it knows.",
                ),
        )
}

/// Reads the parsed arguments; `Err` is a usage error's message.
pub(crate) fn invocation(
    matches: &ArgMatches,
    default_sqlite: Option<&std::path::Path>,
) -> Result<Invocation, String> {
    let (name, sub) = matches.subcommand().ok_or(
        "a command is required (list, show, resolve, release, purge, duplicates, migrate)",
    )?;
    let location = match (
        sub.get_one::<PathBuf>("sqlite"),
        sub.get_one::<String>("postgres"),
    ) {
        (Some(path), None) => Location::Sqlite(path.clone()),
        (None, Some(url)) => Location::Postgres(url.clone()),
        (None, None) => match default_sqlite {
            Some(path) => Location::Sqlite(path.to_owned()),
            None => {
                return Err("say where the ledger is: --sqlite PATH or --postgres URL".into());
            }
        },
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
    let operator = || {
        sub.get_one::<String>("operator")
            .cloned()
            .unwrap_or_default()
    };
    let reason = || sub.get_one::<String>("reason").cloned().unwrap_or_default();
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
            reveal: sub.get_flag("reveal"),
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
            operator: operator(),
            reason: reason(),
        },
        "release" => Action::Release {
            key: key(),
            operator: operator(),
            reason: reason(),
            force: sub.get_flag("force"),
        },
        "migrate" => Action::Migrate,
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
