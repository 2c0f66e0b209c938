//! The command line: curl's flags that `idemcurl` takes, and its own, read into an
//! [`Invocation`]. A flag outside the subset is a usage error that names it (clap's "unexpected
//! argument"), never ignored.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};

use crate::exit::EXIT_STATUSES;

/// How one data flag reads its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataKind {
    /// `-d`, `--data`, `--data-ascii`: `@file` (or `@-`) is read with CR and LF removed.
    Ascii,
    /// `--data-binary`: `@file` is read as it is.
    Binary,
    /// `--data-raw`: the value as it is, `@` included.
    Raw,
    /// `--json`: as `--data-binary`, joined without `&`, and JSON's content type and accept.
    Json,
}

/// One data flag, in command-line order.
#[derive(Debug, Clone)]
pub(crate) struct Data {
    pub(crate) kind: DataKind,
    pub(crate) value: String,
}

/// What `--fail` and `--fail-with-body` ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HttpErrors {
    /// A status of 400 or more is a final answer like any other (exit 0).
    Answer,
    /// Exit 22 for a status of 400 or more, without writing the body.
    Fail,
    /// Exit 22 for a status of 400 or more, after writing the body.
    FailWithBody,
}

/// Where the key comes from, as the command line asks.
#[derive(Debug, Clone)]
pub(crate) enum KeyArg {
    /// `--key K`.
    Given(String),
    /// `--key-from PART`, repeated.
    From(Vec<String>),
    /// Neither: the key header, the run's identity, or a fresh key.
    Auto,
}

/// Where the ledger is.
#[derive(Debug, Clone)]
pub(crate) enum LedgerArg {
    /// The SQLite file in the user's state directory.
    Default,
    /// `--ledger PATH`.
    Sqlite(PathBuf),
    /// `--postgres URL`.
    Postgres(String),
    /// `--no-ledger`.
    None,
}

/// How the report on stderr is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReportFormat {
    Text,
    Json,
}

/// One run of the command.
#[derive(Debug)]
pub(crate) struct Invocation {
    pub(crate) url: String,
    pub(crate) method: Option<String>,
    pub(crate) headers: Vec<String>,
    pub(crate) data: Vec<Data>,
    pub(crate) form: Vec<String>,
    pub(crate) user: Option<String>,
    pub(crate) output: Option<PathBuf>,
    pub(crate) silent: bool,
    pub(crate) include: bool,
    pub(crate) dump_header: Option<PathBuf>,
    pub(crate) write_out: Option<String>,
    pub(crate) max_time: Option<Duration>,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) fail: HttpErrors,
    pub(crate) location: bool,
    pub(crate) max_redirs: Option<u32>,
    pub(crate) cacert: Option<PathBuf>,
    pub(crate) retry: Option<u32>,
    pub(crate) key: KeyArg,
    pub(crate) key_header: Option<String>,
    pub(crate) scope: String,
    pub(crate) reconcile_window: Option<Duration>,
    pub(crate) ledger: LedgerArg,
    pub(crate) lease_wait: Duration,
    pub(crate) in_progress_wait: Duration,
    pub(crate) max_saved_body: usize,
    pub(crate) refetch: bool,
    pub(crate) seal_keys: Vec<idempotent_retry::ledger::SealKey>,
    pub(crate) report: ReportFormat,
}

/// The environment variable naming the file of seal keys when `--seal-keys` is not given.
pub(crate) const SEAL_KEYS_ENV: &str = "IDEMCURL_SEAL_KEYS";

/// The default `--scope`: the ledger scope and the `--key-from` derivation's.
pub(crate) const DEFAULT_SCOPE: &str = "idemcurl";

/// The default `--lease-wait`: the library's (`LeaseHeldPolicy::WAIT`), so idemcurl, Rust and
/// Python wait as long for a run holding the key.
const DEFAULT_LEASE_WAIT: &str = "4m";

/// The default `--in-progress-wait`: the library's (`RetryPolicy::max_in_progress_wait`), so
/// idemcurl, Rust and Python wait as long for a receiver that says "in progress".
const DEFAULT_IN_PROGRESS_WAIT: &str = "1m";

/// The default `--max-saved-body`: 1 MiB, the size of the answers idemcurl reads whole inside
/// their attempt. A command line's answers are often documents or reports larger than an
/// API's JSON (the library's 64 KiB), and one limit for both means every answer the ledger
/// can replay was read whole before anything was written out.
pub(crate) const DEFAULT_MAX_SAVED_BODY: usize = 1024 * 1024;

/// The command's definition.
pub(crate) fn command() -> Command {
    let value = |id: &'static str, long: &'static str, name: &'static str| {
        Arg::new(id)
            .long(long)
            .value_name(name)
            .allow_hyphen_values(true)
            .action(ArgAction::Set)
    };
    let many = |id: &'static str, long: &'static str, name: &'static str| {
        value(id, long, name).action(ArgAction::Append)
    };
    let flag =
        |id: &'static str, long: &'static str| Arg::new(id).long(long).action(ArgAction::SetTrue);
    Command::new("idemcurl")
        .about(
            "curl for side effects: one idempotency key per operation, retries only of what is \
             safe, and a ledger that answers a re-run instead of repeating it",
        )
        .version(env!("CARGO_PKG_VERSION"))
        .after_help(EXIT_STATUSES)
        .override_usage(
            "idemcurl [OPTIONS] URL\n       idemcurl ledger <list|show|resolve|release|purge|duplicates|migrate> ...",
        )
        .arg(
            Arg::new("url")
                .value_name("URL")
                .required(true)
                .help("The one URL to send to (http:// is assumed without a scheme)"),
        )
        .next_help_heading("curl's options")
        .arg(value("request", "request", "METHOD").short('X').help("The method (default GET, or POST with data or a form)"))
        .arg(many("header", "header", "LINE").short('H').help("A header, \"Name: value\"; \"Name:\" removes a default header; \"Name;\" sends it empty"))
        .arg(many("data", "data", "DATA").short('d').visible_alias("data-ascii").help("Form-encoded data; @FILE or @- reads it with CR and LF removed; repeated, joined with &"))
        .arg(many("data-raw", "data-raw", "DATA").help("As --data, with no special meaning for @"))
        .arg(many("data-binary", "data-binary", "DATA").help("As --data; @FILE or @- is read as it is"))
        .arg(many("json", "json", "DATA").help("JSON data (@FILE, @-), with JSON's Content-Type and Accept"))
        .arg(many("form", "form", "NAME=VALUE").short('F').help("A multipart part: name=value, name=@FILE (an upload), name=<FILE (its text); ;type= and ;filename= after"))
        .arg(value("user", "user", "USER:PASSWORD").short('u').help("Basic authentication (idemcurl never prompts for a password)"))
        .arg(value("output", "output", "FILE").short('o').value_parser(clap::value_parser!(PathBuf)).help("Write the body to FILE instead of stdout (- is stdout)"))
        .arg(flag("silent", "silent").short('s').help("No report line on stderr (errors are still written: they name the key)"))
        .arg(flag("show-error", "show-error").short('S').help("Accepted for curl's -sS: errors are always shown"))
        .arg(flag("include", "include").short('i').help("Write the status line and headers before the body"))
        .arg(value("dump-header", "dump-header", "FILE").short('D').value_parser(clap::value_parser!(PathBuf)).help("Write the status line and headers to FILE (- is stdout)"))
        .arg(value("write-out", "write-out", "FORMAT").short('w').help("Write FORMAT to stdout when done: %{http_code}, %{url_effective}, %{size_download}, %{content_type}, %{num_redirects}, %{time_total}, %{exitcode}, %{idempotency_key}, %{attempts}, %{outcome}, %{replayed}; @FILE reads it"))
        .arg(value("max-time", "max-time", "SECONDS").short('m').help("Each attempt's time limit, from connecting to the last byte (default 30)"))
        .arg(value("connect-timeout", "connect-timeout", "SECONDS").help("Each connection's time limit"))
        .arg(flag("fail", "fail").short('f').help("Exit 22 for a status of 400 or more, writing no body"))
        .arg(flag("fail-with-body", "fail-with-body").conflicts_with("fail").help("Exit 22 for a status of 400 or more, after writing the body"))
        .arg(flag("location", "location").short('L').help("Follow redirects (the key goes to the first origin only)"))
        .arg(value("max-redirs", "max-redirs", "N").value_parser(clap::value_parser!(u32)).help("With -L, at most N hops (default 10)"))
        .arg(value("cacert", "cacert", "FILE").value_parser(clap::value_parser!(PathBuf)).help("Trust the PEM certificates in FILE as well as the built-in roots"))
        .arg(value("retry", "retry", "N").value_parser(clap::value_parser!(u32)).help("Retry at most N times after the first attempt, only what is safe to retry (default 4)"))
        .next_help_heading("idemcurl's options")
        .arg(value("key", "key", "KEY").conflicts_with("key-from").help("The operation's idempotency key"))
        .arg(many("key-from", "key-from", "PART").help("Derive the key from these parts (repeat it), as IdempotencyKey::derive(SCOPE, PARTS)"))
        .arg(value("key-header", "key-header", "NAME").help("The key's header (default Idempotency-Key)"))
        .arg(value("scope", "scope", "NAME").default_value(DEFAULT_SCOPE).help("The operation's ledger scope, and --key-from's derivation scope"))
        .arg(value("reconcile-window", "reconcile-window", "DURATION").help("How long after the first attempt the operation may be sent again with its key (default 24h; 90s, 2h, 1day)"))
        .arg(value("ledger", "ledger", "PATH").value_parser(clap::value_parser!(PathBuf)).conflicts_with_all(["postgres", "no-ledger"]).help("The ledger's SQLite file (default: ledger.sqlite3 in the user's state directory)"))
        .arg(value("postgres", "postgres", "URL").conflicts_with("no-ledger").help("A PostgreSQL ledger shared by a fleet (postgres://user@host/db)"))
        .arg(flag("no-ledger", "no-ledger").help("Keep no ledger: retries in this run are safe, a re-run sends again"))
        .arg(value("lease-wait", "lease-wait", "DURATION").default_value(DEFAULT_LEASE_WAIT).help("How long to wait for another run sending the same key to finish"))
        .arg(value("in-progress-wait", "in-progress-wait", "DURATION").default_value(DEFAULT_IN_PROGRESS_WAIT).help("How long to wait out a receiver that answers \"in progress\" (a keyed 409: another request with the key, often an earlier attempt, still runs there); those answers are waits, not counted toward --retry; then exit 76, outcome unknown (0s: stop at the first)"))
        .arg(value("max-saved-body", "max-saved-body", "SIZE").default_value("1MiB").help("The longest answer body the ledger keeps for a re-run (bytes, or 64KiB, 1MiB, 8MiB). Default 1 MiB: what idemcurl reads whole inside an attempt, so an answer it replays was read whole first, with room for documents larger than an API's JSON. A longer answer is written out whole but not kept: a re-run sends it again with its key, for the receiver to answer from its store"))
        .arg(value("seal-keys", "seal-keys", "FILE").value_parser(clap::value_parser!(PathBuf)).help("Seal saved answers at rest with the keys in FILE, one ID:HEX a line (an id, a colon, 64 hex digits: `openssl rand -hex 32`; # comments): the first seals, every one opens the answers sealed under its id. Keys never go on the command line; IDEMCURL_SEAL_KEYS names the file when this is not given. Default: none, answers kept as they came"))
        .arg(flag("no-refetch", "no-refetch").help("On a re-run of an operation whose answer was longer than --max-saved-body, send nothing and exit 79 instead of sending it again with its key (for a receiver that does not answer a key from its store)"))
        .arg(value("report", "report", "FORMAT").value_parser(["text", "json"]).default_value("text").help("The report on stderr: a line of text, or a JSON object for programs"))
}

/// Reads the parsed arguments; `Err` is a usage error's message.
pub(crate) fn invocation(matches: &ArgMatches) -> Result<Invocation, String> {
    let text = |id: &str| matches.get_one::<String>(id).cloned();
    let path = |id: &str| matches.get_one::<PathBuf>(id).cloned();
    let all = |id: &str| -> Vec<String> {
        matches
            .get_many::<String>(id)
            .map(|values| values.cloned().collect())
            .unwrap_or_default()
    };
    let mut data = Vec::new();
    for (id, kind) in [
        ("data", DataKind::Ascii),
        ("data-raw", DataKind::Raw),
        ("data-binary", DataKind::Binary),
        ("json", DataKind::Json),
    ] {
        if let (Some(indices), Some(values)) =
            (matches.indices_of(id), matches.get_many::<String>(id))
        {
            for (index, value) in indices.zip(values) {
                data.push((
                    index,
                    Data {
                        kind,
                        value: value.clone(),
                    },
                ));
            }
        }
    }
    data.sort_by_key(|(index, _)| *index);
    let data: Vec<Data> = data.into_iter().map(|(_, data)| data).collect();
    let form = all("form");
    if !data.is_empty() && !form.is_empty() {
        return Err("give data (-d, --data-*, --json) or a form (-F), not both".into());
    }
    let key = match (text("key"), all("key-from")) {
        (Some(key), _) => KeyArg::Given(key),
        (None, parts) if !parts.is_empty() => KeyArg::From(parts),
        _ => KeyArg::Auto,
    };
    let ledger = if matches.get_flag("no-ledger") {
        LedgerArg::None
    } else if let Some(path) = path("ledger") {
        LedgerArg::Sqlite(path)
    } else if let Some(url) = text("postgres") {
        LedgerArg::Postgres(url)
    } else {
        LedgerArg::Default
    };
    let fail = if matches.get_flag("fail") {
        HttpErrors::Fail
    } else if matches.get_flag("fail-with-body") {
        HttpErrors::FailWithBody
    } else {
        HttpErrors::Answer
    };
    let scope = text("scope").unwrap_or_else(|| DEFAULT_SCOPE.to_owned());
    if scope.is_empty() {
        return Err("--scope must not be empty".into());
    }
    Ok(Invocation {
        url: text("url").unwrap_or_default(),
        method: text("request"),
        headers: all("header"),
        data,
        form,
        user: text("user"),
        output: path("output"),
        silent: matches.get_flag("silent"),
        include: matches.get_flag("include"),
        dump_header: path("dump-header"),
        write_out: text("write-out"),
        max_time: text("max-time")
            .map(|value| seconds("--max-time", &value))
            .transpose()?,
        connect_timeout: text("connect-timeout")
            .map(|value| seconds("--connect-timeout", &value))
            .transpose()?,
        fail,
        location: matches.get_flag("location"),
        max_redirs: matches.get_one::<u32>("max-redirs").copied(),
        cacert: path("cacert"),
        retry: matches.get_one::<u32>("retry").copied(),
        key,
        key_header: text("key-header"),
        scope,
        reconcile_window: text("reconcile-window")
            .map(|value| duration("--reconcile-window", &value))
            .transpose()?,
        ledger,
        lease_wait: duration(
            "--lease-wait",
            &text("lease-wait").unwrap_or_else(|| DEFAULT_LEASE_WAIT.to_owned()),
        )?,
        in_progress_wait: duration(
            "--in-progress-wait",
            &text("in-progress-wait").unwrap_or_else(|| DEFAULT_IN_PROGRESS_WAIT.to_owned()),
        )?,
        max_saved_body: match text("max-saved-body") {
            Some(value) => size("--max-saved-body", &value)?,
            None => DEFAULT_MAX_SAVED_BODY,
        },
        refetch: !matches.get_flag("no-refetch"),
        seal_keys: match path("seal-keys")
            .or_else(|| std::env::var_os(SEAL_KEYS_ENV).map(PathBuf::from))
        {
            Some(file) => seal_keys(&file)?,
            None => Vec::new(),
        },
        report: if text("report").as_deref() == Some("json") {
            ReportFormat::Json
        } else {
            ReportFormat::Text
        },
    })
}

/// The seal keys in `file`: one `ID:HEX` a line, blank lines and `#` comments skipped, the
/// first sealing. The message of an error names the file and the line, never the secret.
fn seal_keys(file: &std::path::Path) -> Result<Vec<idempotent_retry::ledger::SealKey>, String> {
    let text = std::fs::read_to_string(file).map_err(|err| {
        format!(
            "--seal-keys {}: cannot read it ({err}); give a file of ID:HEX lines",
            file.display()
        )
    })?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        keys.push(
            line.parse()
                .map_err(|err| format!("--seal-keys {} line {}: {err}", file.display(), n + 1))?,
        );
    }
    if keys.is_empty() {
        return Err(format!(
            "--seal-keys {}: no key in it; give one ID:HEX a line, the sealing key first",
            file.display()
        ));
    }
    Ok(keys)
}

/// A positive number of seconds, as curl takes them (`2`, `0.5`).
fn seconds(flag: &str, value: &str) -> Result<Duration, String> {
    let parsed: f64 = value
        .parse()
        .map_err(|_| format!("{flag} {value:?} is not a number of seconds (2, 0.5)"))?;
    if !parsed.is_finite() || parsed <= 0.0 || parsed > 31_536_000.0 {
        return Err(format!(
            "{flag} {value:?}: give a number of seconds above 0 and at most a year"
        ));
    }
    Ok(Duration::from_secs_f64(parsed))
}

/// A duration as humans write it (`90s`, `2h`, `1day`).
fn duration(flag: &str, value: &str) -> Result<Duration, String> {
    humantime::parse_duration(value)
        .map_err(|err| format!("{flag} {value:?} is not a duration (90s, 2h, 1day): {err}"))
}

/// A number of bytes as humans write it: `4096`, `64KiB`, `1MiB` (`K`, `KB`, `M`, `MB`, `G`,
/// `GB` are the same powers of 1024).
fn size(flag: &str, value: &str) -> Result<usize, String> {
    let refused = || {
        format!(
            "{flag} {value:?} is not a size: give bytes, or a number with KiB, MiB or GiB (4096, 64KiB, 1MiB)"
        )
    };
    let text = value.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| refused())?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(refused()),
    };
    number
        .checked_mul(scale)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| format!("{flag} {value:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Invocation, String> {
        let matches = command()
            .try_get_matches_from(std::iter::once("idemcurl").chain(args.iter().copied()))
            .map_err(|err| err.to_string())?;
        invocation(&matches)
    }

    #[test]
    fn seal_keys_come_from_a_file_never_echoing_a_secret() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("keys");
        let good = format!("k2:{}", "22".repeat(32));
        std::fs::write(
            &file,
            format!("# new first\n\n{good}\nk1:{}\n", "11".repeat(32)),
        )
        .expect("keys");
        let path = file.to_str().expect("UTF-8");
        let run = parse(&["--seal-keys", path, "http://h/"]).expect("valid keys");
        let ids: Vec<&str> = run.seal_keys.iter().map(|key| key.id()).collect();
        assert_eq!(ids, ["k2", "k1"]);
        std::fs::write(&file, format!("{good}\nk1:SECRETNOTHEX\n")).expect("keys");
        let err = parse(&["--seal-keys", path, "http://h/"]).expect_err("a bad key");
        assert!(err.contains("line 2: invalid seal key"), "{err}");
        assert!(!err.contains("SECRETNOTHEX"), "{err}");
        std::fs::write(&file, "# nothing\n").expect("keys");
        let err = parse(&["--seal-keys", path, "http://h/"]).expect_err("no key");
        assert!(err.contains("no key in it"), "{err}");
    }

    #[test]
    fn curl_habits_parse_as_curl_reads_them() {
        let run = parse(&[
            "-sSfL",
            "-XPOST",
            "-HX-A: 1",
            "-d",
            "a=1",
            "--json",
            "{}",
            "--data-raw",
            "@x",
            "-m",
            "2.5",
            "http://h/p",
        ])
        .expect("parses");
        assert!(run.silent && run.location);
        assert_eq!(run.fail, HttpErrors::Fail);
        assert_eq!(run.method.as_deref(), Some("POST"));
        assert_eq!(run.headers, ["X-A: 1"]);
        let kinds: Vec<_> = run.data.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, [DataKind::Ascii, DataKind::Json, DataKind::Raw]);
        assert_eq!(run.max_time, Some(Duration::from_millis(2500)));
        assert_eq!(run.url, "http://h/p");
    }

    #[test]
    fn a_flag_outside_the_subset_is_refused_by_name() {
        for flag in ["--insecure", "-k", "--compressed", "--retry-all-errors"] {
            let err = parse(&[flag, "http://h/"]).expect_err(flag);
            assert!(err.contains(flag), "{flag}: {err}");
        }
    }

    #[test]
    fn bad_values_are_usage_errors_that_say_what_to_give() {
        let err = parse(&["-m", "0", "http://h/"]).expect_err("zero");
        assert!(err.contains("above 0"), "{err}");
        let err = parse(&["-m", "soon", "http://h/"]).expect_err("text");
        assert!(err.contains("number of seconds"), "{err}");
        let err = parse(&["--reconcile-window", "a while", "http://h/"]).expect_err("text");
        assert!(err.contains("--reconcile-window"), "{err}");
        let err = parse(&["-d", "a", "-F", "b=c", "http://h/"]).expect_err("both");
        assert!(err.contains("not both"), "{err}");
        let err = parse(&["--key", "a", "--key-from", "b", "http://h/"]).expect_err("both keys");
        assert!(err.contains("--key"), "{err}");
        let err = parse(&["http://h/", "http://i/"]).expect_err("two urls");
        assert!(err.contains("http://i/"), "{err}");
        let err = parse(&["--in-progress-wait", "soon", "http://h/"]).expect_err("text");
        assert!(
            err.contains("--in-progress-wait") && err.contains("not a duration"),
            "{err}"
        );
        for bad in ["-1", "lots", "2TiB", "1.5MiB"] {
            let err = parse(&["--max-saved-body", bad, "http://h/"]).expect_err(bad);
            assert!(err.contains("--max-saved-body"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_in_progress_wait_and_the_saved_body_limit_read_as_written() {
        let run = parse(&["http://h/"]).expect("parses");
        assert_eq!(run.in_progress_wait, Duration::from_secs(60));
        assert_eq!(run.max_saved_body, 1024 * 1024);
        assert!(run.refetch);
        let run = parse(&[
            "--in-progress-wait",
            "0s",
            "--max-saved-body",
            "64KiB",
            "--no-refetch",
            "http://h/",
        ])
        .expect("parses");
        assert_eq!(run.in_progress_wait, Duration::ZERO);
        assert_eq!(run.max_saved_body, 64 * 1024);
        assert!(!run.refetch);
        for (text, bytes) in [
            ("4096", 4096),
            ("2M", 2 << 20),
            ("1 GiB", 1 << 30),
            ("0", 0),
        ] {
            let run = parse(&["--max-saved-body", text, "http://h/"]).expect(text);
            assert_eq!(run.max_saved_body, bytes, "{text}");
        }
    }
}
