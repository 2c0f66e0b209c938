//! An answer whose head arrived and whose body was then cut, after the effect: a bounded one
//! (a `Content-Length` up to 1 MiB) is a failed attempt, retried with the same key, and written
//! out whole; a streamed one (longer, or without a length) ends with exit 23 and a report
//! that says what was written and the `--key` to run it again with, and that re-run gets the
//! whole answer (through the ledger too: it sends an answer it did not keep again).

use idempotent_retry_testkit::{Delivery, Fault, Receiver, Reply, When};

use crate::support::{Ran, Scratch, idemcurl, run};

const CHARGE: &str = r#"{"amount":1200,"currency":"eur"}"#;
/// The built-in handler's answer to a key's first delivery.
const ANSWER: &str = r#"{"effect":1}"#;
/// A download-sized answer: longer than the 1 MiB idemcurl reads inside an attempt (and saves
/// in its ledger), so it is written out as it arrives.
const LONG: usize = 2 * 1024 * 1024;

/// A keyed charge of `key` on `receiver`, with `ledger` (`None`: `--no-ledger`) and `extra`
/// arguments.
fn charge(
    scratch: &Scratch,
    receiver: &Receiver,
    key: &str,
    ledger: bool,
    extra: &[&str],
) -> tokio::process::Command {
    let mut command = idemcurl(scratch.dir.path());
    if ledger {
        command.arg("--ledger").arg(scratch.ledger());
    } else {
        command.arg("--no-ledger");
    }
    command
        .args(["--json", CHARGE, "--key", key])
        .args(extra)
        .arg(receiver.url("/v1/charges"));
    command
}

/// A receiver whose handler records one effect and answers [`LONG`] bytes of `x`.
async fn long_receiver() -> Receiver {
    Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            Reply::ok("x".repeat(LONG))
        })
        .start()
        .await
        .expect("receiver")
}

/// The report's one text line (the last line of stderr).
fn line(ran: &Ran) -> &str {
    ran.stderr.lines().last().unwrap_or_default()
}

#[tokio::test]
async fn a_bounded_answer_cut_mid_body_is_retried_with_its_key_and_written_whole() {
    let scratch = Scratch::new();
    for (key, to_file) in [("cut-file", true), ("cut-stdout", false)] {
        let receiver = Receiver::start().await.expect("receiver");
        // The first delivery runs (one effect), then its answer's head goes out with 5 of its
        // 12 body bytes, and the connection closes.
        receiver.inject(When::key_attempt(key, 1), Fault::CutBodyAfterCommit(5));
        let out = scratch.path(&format!("{key}.json"));
        let mut extra = vec!["--report", "json"];
        if to_file {
            extra.extend(["-o", out.to_str().expect("a UTF-8 path")]);
        }
        let ran = run(charge(&scratch, &receiver, key, true, &extra)).await;
        assert_eq!(ran.code, 0, "{key}: {ran:?}");
        let written = if to_file {
            assert!(ran.stdout.is_empty(), "{key}: {ran:?}");
            std::fs::read_to_string(&out).expect("the output file")
        } else {
            ran.stdout_text()
        };
        assert_eq!(written, ANSWER, "{key}");
        let report = ran.report();
        assert_eq!(report["outcome"], "done", "{key}: {report}");
        assert_eq!(report["status"], 200, "{key}: {report}");
        assert_eq!(report["attempts"], 2, "{key}: {report}");
        assert_eq!(report["body_cut"], false, "{key}: {report}");
        assert_eq!(receiver.effects_for(key), 1, "{key}");
        // Both deliveries carried the one key.
        assert_eq!(
            receiver.keys(),
            [Some(key.to_owned()), Some(key.to_owned())]
        );
    }
}

#[tokio::test]
async fn a_streamed_answer_cut_mid_body_exits_23_naming_the_key_and_the_rerun_gets_it_whole() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    let out = scratch.path("download.bin");
    let out_arg = out.to_str().expect("a UTF-8 path");
    receiver.inject(
        When::key_attempt("cut-long", 1),
        Fault::CutBodyAfterCommit(1000),
    );

    let ran = run(charge(
        &scratch,
        &receiver,
        "cut-long",
        false,
        &["-o", out_arg],
    ))
    .await;
    assert_eq!(ran.code, 23, "{ran:?}");
    let said = line(&ran);
    assert!(
        said.starts_with("idemcurl: done, answer incomplete: 200 from POST "),
        "{said}"
    );
    assert!(
        said.contains("the answer's body was cut after 1000 of 2097152 bytes"),
        "{said}"
    );
    assert!(said.contains("its effect stands"), "{said}");
    assert!(
        said.contains("run it again with --key cut-long to have the whole answer again"),
        "{said}"
    );
    // Only what arrived was written out.
    assert_eq!(std::fs::metadata(&out).expect("the file").len(), 1000);
    assert_eq!(receiver.effects_for("cut-long"), 1);

    // The JSON report says the same, for programs.
    receiver.inject(
        When::key_attempt("cut-long-json", 1),
        Fault::CutBodyAfterCommit(1000),
    );
    let ran = run(charge(
        &scratch,
        &receiver,
        "cut-long-json",
        false,
        &["--report", "json", "-o", "/dev/null"],
    ))
    .await;
    assert_eq!(ran.code, 23, "{ran:?}");
    let report = ran.report();
    assert_eq!(report["exit"], 23, "{report}");
    assert_eq!(report["outcome"], "done", "{report}");
    assert_eq!(report["body_cut"], true, "{report}");
    assert_eq!(report["key"], "cut-long-json", "{report}");
    let error = report["error"].as_str().expect("an error");
    assert!(error.contains("--key cut-long-json"), "{error}");

    // The re-run the report names: the receiver answers it again from its store, whole.
    let again = run(charge(
        &scratch,
        &receiver,
        "cut-long",
        false,
        &["-o", out_arg],
    ))
    .await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(
        std::fs::metadata(&out).expect("the file").len(),
        LONG as u64
    );
    assert!(
        line(&again).starts_with("idemcurl: done: 200 from POST "),
        "{again:?}"
    );
    assert_eq!(receiver.effects_for("cut-long"), 1);
    assert_eq!(
        receiver.keys(),
        [
            Some("cut-long".to_owned()),
            Some("cut-long-json".to_owned()),
            Some("cut-long".to_owned())
        ]
    );
}

#[tokio::test]
async fn with_a_ledger_a_streamed_answer_cut_past_what_it_saves_names_the_rerun_that_gets_it() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    // Past the first MiB, which the ledger reads (to save it) before anything is written out:
    // the ledger holds the operation as done, without its body.
    let keep = 1024 * 1024 + 64 * 1024;
    receiver.inject(
        When::key_attempt("cut-ledger", 1),
        Fault::CutBodyAfterCommit(keep),
    );
    let ran = run(charge(
        &scratch,
        &receiver,
        "cut-ledger",
        true,
        &["-o", "/dev/null"],
    ))
    .await;
    assert_eq!(ran.code, 23, "{ran:?}");
    let said = line(&ran);
    assert!(
        said.contains(&format!(
            "the answer's body was cut after {keep} of 2097152 bytes"
        )),
        "{said}"
    );
    assert!(
        said.contains(
            "run it again with --key cut-ledger to have the whole answer again from the \
             receiver's store (the ledger keeps no body over 1048576 bytes: it sends the \
             request again under the key)"
        ),
        "{said}"
    );
    // The re-run it names, through the same ledger: sent again with the key, written whole.
    let again = run(charge(
        &scratch,
        &receiver,
        "cut-ledger",
        true,
        &["--report", "json"],
    ))
    .await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.stdout.len(), LONG);
    assert_eq!(again.report()["refetched"], true, "{again:?}");
    assert_eq!(receiver.effects_for("cut-ledger"), 1);
    assert_eq!(receiver.arrivals(), 2);
}

#[tokio::test]
async fn with_a_ledger_a_streamed_answer_cut_in_what_it_reads_is_unknown_and_the_rerun_gets_it() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    // Within the first MiB, which the ledger reads to save it: the operation ends there.
    receiver.inject(
        When::key_attempt("cut-early", 1),
        Fault::CutBodyAfterCommit(1000),
    );
    let ran = run(charge(
        &scratch,
        &receiver,
        "cut-early",
        true,
        &["-o", "/dev/null"],
    ))
    .await;
    // The answer's head said 200, but the operation ended before the ledger could record it:
    // outcome unknown, and the way out is the same key.
    assert_eq!(ran.code, 76, "{ran:?}");
    let said = line(&ran);
    assert!(said.starts_with("idemcurl: outcome unknown: "), "{said}");
    assert!(
        said.contains("run it again only with --key cut-early"),
        "{said}"
    );
    let again = run(charge(
        &scratch,
        &receiver,
        "cut-early",
        true,
        &["--report", "json"],
    ))
    .await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.stdout.len(), LONG);
    assert_eq!(again.report()["sent"], true);
    assert_eq!(receiver.effects_for("cut-early"), 1);
    assert_eq!(receiver.arrivals(), 2);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_last_answer_not_written_whole_leaves_the_outcome_unknown() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    for attempt in [1, 2] {
        receiver.inject(When::key_attempt("full-503", attempt), Fault::status(503));
    }
    // Every attempt answered 503, and that last answer (its head, with -i) cannot be written
    // (/dev/full): the operation may have happened, and the status says so, not "done".
    let ran = run(charge(
        &scratch,
        &receiver,
        "full-503",
        true,
        &["--retry", "1", "--report", "json", "-i", "-o", "/dev/full"],
    ))
    .await;
    assert_eq!(ran.code, 76, "{ran:?}");
    let report = ran.report();
    assert_eq!(report["outcome"], "unknown", "{report}");
    assert_eq!(report["status"], 503, "{report}");
    assert_eq!(report["attempts"], 2, "{report}");
    let error = report["error"].as_str().expect("an error");
    assert!(
        error.contains("outcome unknown") && error.contains("cannot write the answer"),
        "{error}"
    );
}
