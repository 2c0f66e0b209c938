//! The exit statuses: what each says about the operation, and what to do next.

use std::process::ExitCode;

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// A final answer, sent now or replayed from the ledger.
    Done,
    /// Usage error: nothing was sent.
    Usage,
    /// A final answer of 400 or more, with `--fail` or `--fail-with-body` (curl's 22).
    HttpError,
    /// A final answer arrived but was not written out whole (curl's 23): writing it failed, or
    /// its body was cut midway after the receiver answered (the effect stands).
    Write,
    /// The operation cannot have happened: safe to run again.
    NotDone,
    /// The operation may have happened: run again only with the same key, or reconcile.
    Unknown,
    /// The key belongs to a different request: nothing sent.
    KeyReused,
    /// The ledger could not be opened, read or written.
    Ledger,
    /// Done, but the ledger did not keep the answer's body (longer than `--max-saved-body`)
    /// and did not fetch it again (`--no-refetch`, or past the reconcile window): nothing was
    /// sent, nothing written out.
    AnswerNotSaved,
}

impl Exit {
    /// The status the process exits with.
    pub(crate) fn code(self) -> u8 {
        match self {
            Exit::Done => 0,
            Exit::Usage => 2,
            Exit::HttpError => 22,
            Exit::Write => 23,
            Exit::NotDone => 75,
            Exit::Unknown => 76,
            Exit::KeyReused => 77,
            Exit::Ledger => 78,
            Exit::AnswerNotSaved => 79,
        }
    }

    /// The word the JSON report and `%{outcome}` give.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            Exit::Done | Exit::HttpError | Exit::Write | Exit::AnswerNotSaved => "done",
            Exit::Usage => "usage_error",
            Exit::NotDone => "not_done",
            Exit::Unknown => "unknown",
            Exit::KeyReused => "key_reused",
            Exit::Ledger => "ledger_error",
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// The table `--help` ends with (the README has the same).
pub(crate) const EXIT_STATUSES: &str = "\
Exit status:
   0  done: a final answer (any status without -f), sent now or replayed from the ledger
  22  done, with -f or --fail-with-body: the answer's status is 400 or more
  23  done, but the answer could not be read or written out whole (its body was cut midway,
      or writing it failed): run it again with the same key (the report names it) to have
      it again
   2  usage error: nothing was sent
  75  not done: it cannot have happened; safe to run again
  76  outcome unknown: it may have happened; run again only with the same key (the report
      names it), or settle it with `idemcurl ledger resolve KEY --operator NAME --reason
      TEXT --done` (or --not-done, or --send-again)
  77  refused: the key belongs to a different request; nothing was sent (the same
      operation must keep its key; a different operation needs a key of its own)
  78  ledger error: the ledger could not be opened, read or written (the report says whether
      anything was sent)
  79  done, but its answer was not kept: the ledger holds the operation as done without the
      answer's body (longer than --max-saved-body), and --no-refetch or the end of the
      reconcile window kept it from being sent again; nothing was sent or written out: run
      it again without --no-refetch inside the window, or look the answer up at the receiver
      under the key (the report names it)

The key: --key, --key-from, an Idempotency-Key header, else derived from
IDEMPOTENT_RETRY_RUN (and IDEMPOTENT_RETRY_STEP) with the request, else fresh for this
invocation (its retries are safe; a re-run is a new operation).
`idemcurl ledger --help`: the operators' commands, on the same ledger by default.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_in_the_help_table_once() {
        for exit in [
            Exit::Done,
            Exit::Usage,
            Exit::HttpError,
            Exit::Write,
            Exit::NotDone,
            Exit::Unknown,
            Exit::KeyReused,
            Exit::Ledger,
            Exit::AnswerNotSaved,
        ] {
            let row = format!("{:>4}  ", exit.code());
            assert_eq!(
                EXIT_STATUSES.matches(&row).count(),
                1,
                "{exit:?} ({}) in the table",
                exit.code()
            );
        }
    }
}
