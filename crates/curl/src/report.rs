//! The report on stderr: one line for people (`idemcurl: done: ...`), or one JSON object for
//! programs (`--report json`).

use std::time::{Duration, SystemTime};

use crate::exit::Exit;
use crate::key::{KeySource, RUN_VARIABLE};

/// Everything the report says.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) exit: Exit,
    pub(crate) method: String,
    /// Without credentials.
    pub(crate) url: String,
    pub(crate) status: Option<u16>,
    pub(crate) attempts: u32,
    pub(crate) elapsed: Duration,
    pub(crate) key: Option<String>,
    pub(crate) key_source: KeySource,
    pub(crate) replayed: bool,
    /// The ledger held the operation as done without the answer's body (longer than
    /// `--max-saved-body`): it was sent again with its key, and this is the receiver's answer
    /// from its store.
    pub(crate) refetched: bool,
    /// `--max-saved-body`: the longest answer body the ledger keeps.
    pub(crate) max_saved_body: usize,
    /// The answer's body was cut midway, after the receiver answered (exit 23): `error` says
    /// how much was written out and how to have the answer again.
    pub(crate) body_cut: bool,
    /// Why it did not end with a final answer, or what else went wrong.
    pub(crate) error: Option<String>,
    /// The ledger, as the report names it (`none` without one).
    pub(crate) ledger: String,
    /// When the operation may no longer be sent again with its key.
    pub(crate) window_ends: Option<SystemTime>,
    /// The command was cancelled by a signal.
    pub(crate) cancelled: bool,
    /// How long it waited for another run holding the key (counted in `elapsed`).
    pub(crate) lease_wait: Duration,
    /// Answers that said the operation was still in progress at the receiver, each waited out
    /// (counted in `attempts`, not toward `--retry`).
    pub(crate) in_progress_waits: u32,
    /// The sum of those waits (counted in `elapsed`).
    pub(crate) in_progress_wait: Duration,
    /// Why the answer was not recorded in the ledger as this run's, when it was not.
    pub(crate) unrecorded: Option<String>,
}

impl Report {
    /// A usage error's report: nothing was sent.
    pub(crate) fn usage(message: String) -> Report {
        Report {
            exit: Exit::Usage,
            method: String::new(),
            url: String::new(),
            status: None,
            attempts: 0,
            elapsed: Duration::ZERO,
            key: None,
            key_source: KeySource::None,
            replayed: false,
            refetched: false,
            max_saved_body: 0,
            body_cut: false,
            error: Some(message),
            ledger: String::new(),
            window_ends: None,
            cancelled: false,
            lease_wait: Duration::ZERO,
            in_progress_waits: 0,
            in_progress_wait: Duration::ZERO,
            unrecorded: None,
        }
    }

    /// The `idemcurl ledger` options that name this invocation's ledger, so a printed command
    /// reads the same one: ` --sqlite PATH` (quoted when it needs it), ` --postgres URL` (the
    /// URL left out: it may hold a password), or nothing.
    fn ledger_args(&self) -> String {
        match self.ledger.as_str() {
            "" | "none" => String::new(),
            "postgres" => " --postgres URL".to_owned(),
            path if path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-+=:@,".contains(c)) =>
            {
                format!(" --sqlite {path}")
            }
            path => format!(" --sqlite '{}'", path.replace('\'', r"'\''")),
        }
    }

    /// The library's message without what the report line says itself: the outcome (`;
    /// outcome unknown: it may have run`, `; not executed`) and the key (`; idempotency key K`),
    /// so neither is said twice.
    fn untold(&self, error: &str) -> String {
        let mut told = vec![
            "; outcome unknown: it may have run".to_owned(),
            "; not executed".to_owned(),
        ];
        if let Some(key) = &self.key {
            told.push(format!("; idempotency key {key}"));
        }
        told.iter().fold(error.to_owned(), |error, said| {
            error.replacen(said.as_str(), "", 1)
        })
    }

    /// Whether anything went to the server in this invocation.
    fn sent(&self) -> bool {
        self.attempts > 0 && !self.replayed
    }

    fn key_phrase(&self) -> String {
        let Some(key) = &self.key else {
            return match self.key_source {
                KeySource::Refused => "no key (the key header was removed)".into(),
                _ => format!("no key ({} is idempotent)", self.method),
            };
        };
        let why = match self.key_source {
            KeySource::Given => "--key".to_owned(),
            KeySource::Derived => "--key-from".to_owned(),
            KeySource::Header => "the request's key header".to_owned(),
            KeySource::Run => format!(
                "derived from {RUN_VARIABLE} and the request: the same command in this run is this operation"
            ),
            KeySource::Fresh => format!(
                "fresh for this invocation: a re-run is a new operation; --key {key} makes it this one"
            ),
            KeySource::None | KeySource::Refused => String::new(),
        };
        format!("key {key} ({why})")
    }

    fn attempts_phrase(&self) -> String {
        if self.cancelled {
            return format!("cancelled after {}", readable(self.elapsed));
        }
        let plural = if self.attempts == 1 { "" } else { "s" };
        format!(
            "{} attempt{plural} in {}{}",
            self.attempts,
            readable(self.elapsed),
            self.waited_phrase()
        )
    }

    /// ` (of which 8.21s waiting for another run of the key; 12 answered "in progress",
    /// waited out for 2.90s)`, when it waited for either.
    fn waited_phrase(&self) -> String {
        let mut parts = Vec::new();
        if !self.lease_wait.is_zero() {
            parts.push(format!(
                "of which {} waiting for another run of the key",
                readable(self.lease_wait)
            ));
        }
        if self.in_progress_waits > 0 && !self.replayed {
            parts.push(format!(
                "{} answered \"in progress\" by the receiver, waited out for {} (not counted \
                 toward --retry)",
                self.in_progress_waits,
                readable(self.in_progress_wait)
            ));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join("; "))
        }
    }

    /// The line for people, without its newline.
    pub(crate) fn text(&self) -> String {
        let error = self.error.as_deref().unwrap_or("no answer");
        let key = self.key_phrase();
        match self.exit {
            Exit::AnswerNotSaved => format!(
                "idemcurl: done, answer not kept: {}{error}; nothing was sent or written out; \
                 {key}",
                self.status
                    .map(|status| format!("{status} from {} {}; ", self.method, self.url))
                    .unwrap_or_default(),
            ),
            Exit::Done | Exit::HttpError | Exit::Write => {
                let done = if self.exit == Exit::Write {
                    "done, answer incomplete"
                } else {
                    "done"
                };
                let status = self.status.unwrap_or(0);
                let how = if self.replayed {
                    format!(
                        "replayed from the ledger, nothing sent{}",
                        self.waited_phrase()
                    )
                } else if self.refetched {
                    format!(
                        "fetched again from the receiver under its key: the ledger keeps answers \
                         up to {} bytes; {}",
                        self.max_saved_body,
                        self.attempts_phrase()
                    )
                } else {
                    format!("sent, {}", self.attempts_phrase())
                };
                let how = match &self.unrecorded {
                    Some(why) => format!("{how} ({why})"),
                    None => how,
                };
                let tail = match self.exit {
                    Exit::HttpError => "; exit 22 (--fail: status 400 or more)".to_owned(),
                    // The message says what was written and how to have the answer again.
                    Exit::Write if self.body_cut => format!("; {error}"),
                    Exit::Write => match &self.key {
                        Some(key) => {
                            format!("; {error}: run it again with --key {key} to have it replayed")
                        }
                        None => format!("; {error}: run it again to have it again"),
                    },
                    _ => String::new(),
                };
                format!(
                    "idemcurl: {done}: {status} from {} {}, {how}; {key}{tail}",
                    self.method, self.url
                )
            }
            Exit::Usage => format!("idemcurl: {error} (nothing was sent)"),
            Exit::NotDone => format!(
                "idemcurl: not done: {}; it cannot have happened, so it is safe to run again; {}; {key}",
                self.untold(error),
                self.attempts_phrase()
            ),
            Exit::Unknown => {
                let window = self
                    .window_ends
                    .map(|end| {
                        format!(
                            " until {} (the reconcile window)",
                            humantime::format_rfc3339_seconds(end)
                        )
                    })
                    .unwrap_or_default();
                let next = match &self.key {
                    Some(key) => {
                        let again = match self.key_source {
                            KeySource::Run => format!(
                                "run the same command again in this run (or with --key {key}){window}"
                            ),
                            _ => format!("run it again only with --key {key}{window}"),
                        };
                        let on = self.ledger_args();
                        format!(
                            "{again}, or look it up with `idemcurl ledger{on} show {key}` and settle it with `idemcurl ledger{on} resolve {key} --operator NAME --reason TEXT --done` (or `--not-done`, or `--send-again`)"
                        )
                    }
                    None => "check with the server before sending it again".to_owned(),
                };
                format!(
                    "idemcurl: outcome unknown: {}; it may have happened; {}; {key}; {next}",
                    self.untold(error),
                    self.attempts_phrase()
                )
            }
            Exit::KeyReused => format!("idemcurl: refused, nothing sent: {error}"),
            Exit::Ledger => {
                let sent = if self.sent() {
                    "it may have been sent"
                } else {
                    "nothing was sent"
                };
                format!("idemcurl: ledger error: {error} ({sent}); {key}")
            }
        }
    }

    /// The JSON object for programs, on one line.
    pub(crate) fn json(&self) -> String {
        serde_json::json!({
            "outcome": self.exit.outcome(),
            "exit": self.exit.code(),
            "method": self.method,
            "url": self.url,
            "status": self.status,
            "attempts": self.attempts,
            "elapsed_ms": u64::try_from(self.elapsed.as_millis()).unwrap_or(u64::MAX),
            "key": self.key,
            "key_source": self.key_source.name(),
            "sent": self.sent(),
            "replayed": self.replayed,
            "refetched": self.refetched,
            "body_cut": self.body_cut,
            "cancelled": self.cancelled,
            "lease_wait_ms": u64::try_from(self.lease_wait.as_millis()).unwrap_or(u64::MAX),
            "in_progress_waits": self.in_progress_waits,
            "in_progress_wait_ms": u64::try_from(self.in_progress_wait.as_millis()).unwrap_or(u64::MAX),
            "unrecorded": self.unrecorded,
            "ledger": self.ledger,
            "window_ends": self.window_ends.map(|end| humantime::format_rfc3339_seconds(end).to_string()),
            "error": self.error,
        })
        .to_string()
    }
}

/// A duration for people: `12ms`, `1.25s`, `3m20s`.
fn readable(elapsed: Duration) -> String {
    if elapsed < Duration::from_secs(1) {
        format!("{}ms", elapsed.as_millis())
    } else if elapsed < Duration::from_secs(60) {
        format!("{:.2}s", elapsed.as_secs_f64())
    } else {
        humantime::format_duration(Duration::from_secs(elapsed.as_secs())).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(exit: Exit) -> Report {
        Report {
            exit,
            method: "POST".into(),
            url: "http://127.0.0.1:1/v1/charges".into(),
            status: Some(201),
            attempts: 2,
            elapsed: Duration::from_millis(1250),
            key: Some("k-1".into()),
            key_source: KeySource::Fresh,
            replayed: false,
            refetched: false,
            max_saved_body: 1024 * 1024,
            body_cut: false,
            error: Some("gave up after 2 attempts".into()),
            ledger: "none".into(),
            window_ends: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(86_400)),
            cancelled: false,
            lease_wait: Duration::ZERO,
            in_progress_waits: 0,
            in_progress_wait: Duration::ZERO,
            unrecorded: None,
        }
    }

    #[test]
    fn in_progress_waits_are_said_apart_from_the_attempts() {
        let mut waited = report(Exit::Done);
        waited.attempts = 14;
        waited.in_progress_waits = 12;
        waited.in_progress_wait = Duration::from_millis(2900);
        waited.elapsed = Duration::from_millis(3200);
        let text = waited.text();
        assert!(
            text.contains(
                "14 attempts in 3.20s (12 answered \"in progress\" by the receiver, waited out \
                 for 2.90s (not counted toward --retry))"
            ),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&waited.json()).expect("json");
        assert_eq!(json["in_progress_waits"], 12);
        assert_eq!(json["in_progress_wait_ms"], 2900);
        assert_eq!(json["attempts"], 14);

        // With a wait for another run as well, both are said.
        waited.lease_wait = Duration::from_millis(500);
        let text = waited.text();
        assert!(
            text.contains("(of which 500ms waiting for another run of the key; 12 answered"),
            "{text}"
        );
        // An operation that ended still in progress says how long it waited, as unknown.
        let mut unknown = report(Exit::Unknown);
        unknown.in_progress_waits = 3;
        unknown.in_progress_wait = Duration::from_millis(60_000);
        let text = unknown.text();
        assert!(
            text.contains("3 answered \"in progress\" by the receiver, waited out for 1m"),
            "{text}"
        );
        // None: the line is as before, and the JSON says zero.
        let plain = report(Exit::Done);
        assert!(!plain.text().contains("in progress"), "{}", plain.text());
        let json: serde_json::Value = serde_json::from_str(&plain.json()).expect("json");
        assert_eq!(json["in_progress_waits"], 0);
        assert_eq!(json["in_progress_wait_ms"], 0);
    }

    #[test]
    fn an_answer_cut_mid_body_is_never_said_to_be_whole() {
        let mut cut = report(Exit::Write);
        cut.status = Some(200);
        cut.body_cut = true;
        cut.error = Some(
            "the answer's body was cut after 1000 of 2097152 bytes, which were written out \
             (end of file); the receiver answered 200, so its effect stands: run it again with \
             --key k-1 to have the whole answer again from the receiver's store"
                .into(),
        );
        let text = cut.text();
        assert!(
            text.starts_with("idemcurl: done, answer incomplete: 200 from POST "),
            "{text}"
        );
        assert!(
            text.ends_with("run it again with --key k-1 to have the whole answer again from the receiver's store"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&cut.json()).expect("json");
        assert_eq!(json["exit"], 23);
        assert_eq!(json["outcome"], "done");
        assert_eq!(json["body_cut"], true);
        // A write that failed says so, with the key to run it again with.
        let mut full = report(Exit::Write);
        full.error = Some("cannot write the answer: No space left on device".into());
        let text = full.text();
        assert!(
            text.starts_with("idemcurl: done, answer incomplete: 201 from POST "),
            "{text}"
        );
        assert!(
            text.ends_with(
                "cannot write the answer: No space left on device: run it again with --key k-1 \
                 to have it replayed"
            ),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&full.json()).expect("json");
        assert_eq!(json["body_cut"], false);
    }

    #[test]
    fn an_answer_fetched_again_or_not_kept_is_said_so() {
        let mut fetched = report(Exit::Done);
        fetched.status = Some(200);
        fetched.attempts = 1;
        fetched.elapsed = Duration::from_millis(12);
        fetched.refetched = true;
        let text = fetched.text();
        assert!(
            text.starts_with(
                "idemcurl: done: 200 from POST http://127.0.0.1:1/v1/charges, fetched again \
                 from the receiver under its key: the ledger keeps answers up to 1048576 \
                 bytes; 1 attempt in 12ms; "
            ),
            "{text}"
        );
        assert!(!text.contains("empty"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&fetched.json()).expect("json");
        assert_eq!(json["refetched"], true);
        assert_eq!(json["sent"], true);
        assert_eq!(json["replayed"], false);

        let mut kept = report(Exit::AnswerNotSaved);
        kept.status = Some(200);
        kept.attempts = 0;
        kept.error =
            Some("its answer's body (2097152 bytes) was longer than the ledger keeps".into());
        let text = kept.text();
        assert!(
            text.starts_with(
                "idemcurl: done, answer not kept: 200 from POST http://127.0.0.1:1/v1/charges; \
                 its answer's body (2097152 bytes) was longer than the ledger keeps; nothing \
                 was sent or written out; key k-1"
            ),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&kept.json()).expect("json");
        assert_eq!(json["exit"], 79);
        assert_eq!(json["outcome"], "done");
        assert_eq!(json["status"], 200);
        assert_eq!(json["sent"], false);
    }

    #[test]
    fn a_wait_for_another_run_is_counted_and_said() {
        let mut waited = report(Exit::Done);
        waited.lease_wait = Duration::from_millis(8210);
        waited.elapsed = Duration::from_millis(9460);
        let text = waited.text();
        assert!(
            text.contains(
                "2 attempts in 9.46s (of which 8.21s waiting for another run of the key)"
            ),
            "{text}"
        );
        let json: serde_json::Value = serde_json::from_str(&waited.json()).expect("json");
        assert_eq!(json["lease_wait_ms"], 8210);
        assert_eq!(json["elapsed_ms"], 9460);
    }

    #[test]
    fn the_outcome_and_the_key_are_said_once() {
        let mut unknown = report(Exit::Unknown);
        unknown.error = Some(
            "POST http://127.0.0.1:1/v1/charges: gave up after 2 attempts (last status 503 \
             Service Unavailable); outcome unknown: it may have run; idempotency key k-1"
                .into(),
        );
        let text = unknown.text();
        assert_eq!(text.matches("outcome unknown").count(), 1, "{text}");
        assert!(!text.contains("it may have run"), "{text}");
        assert!(!text.contains("idempotency key k-1"), "{text}");
        assert!(
            text.contains("(last status 503 Service Unavailable); it may have happened"),
            "{text}"
        );
        let mut not_done = report(Exit::NotDone);
        not_done.error = Some(
            "gave up after 2 attempts (last failure: connect); not executed; idempotency key k-1"
                .into(),
        );
        let text = not_done.text();
        assert!(
            text.contains("(last failure: connect); it cannot have happened"),
            "{text}"
        );
    }

    #[test]
    fn each_outcome_says_what_to_do_next() {
        let done = report(Exit::Done).text();
        assert!(done.starts_with("idemcurl: done: 201 from POST http://127.0.0.1:1/v1/charges, sent, 2 attempts in 1.25s"), "{done}");
        assert!(
            done.contains("a re-run is a new operation; --key k-1 makes it this one"),
            "{done}"
        );
        let unknown = report(Exit::Unknown).text();
        assert!(
            unknown.contains("outcome unknown") && unknown.contains("may have happened"),
            "{unknown}"
        );
        assert!(
            unknown.contains("--key k-1 until 1970-01-02T00:00:00Z"),
            "{unknown}"
        );
        assert!(unknown.contains("idemcurl ledger resolve k-1"), "{unknown}");
        let not_done = report(Exit::NotDone).text();
        assert!(not_done.contains("safe to run again"), "{not_done}");
        let mut replayed = report(Exit::Done);
        replayed.replayed = true;
        assert!(
            replayed
                .text()
                .contains("replayed from the ledger, nothing sent")
        );
        let json: serde_json::Value =
            serde_json::from_str(&replayed.json()).expect("the JSON report parses");
        assert_eq!(json["outcome"], "done");
        assert_eq!(json["sent"], false);
        assert_eq!(json["key_source"], "fresh");
        assert_eq!(json["window_ends"], "1970-01-02T00:00:00Z");
    }
}
