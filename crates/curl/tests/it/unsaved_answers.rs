//! An answer longer than the ledger keeps (`--max-saved-body`, 1 MiB by default): a re-run
//! never writes out an empty body with exit 0. It sends the operation again with its key and
//! writes out the receiver's answer from its store; with `--no-refetch` it exits 79, naming the
//! key, the size and the limit, and sends nothing.

use idempotent_retry_testkit::{Delivery, Receiver, Reply};

use crate::support::{Ran, Scratch, idemcurl, run};

const CHARGE: &str = r#"{"amount":1200,"currency":"eur"}"#;
/// The issue's answer: 2 MiB of JSON, twice the default limit.
const LONG: usize = 2 * 1024 * 1024;

/// A 2 MiB JSON document.
fn long_answer() -> String {
    let mut answer = String::with_capacity(LONG);
    answer.push_str("{\"report\":\"");
    answer.push_str(&"x".repeat(LONG - 13));
    answer.push_str("\"}");
    assert_eq!(answer.len(), LONG);
    answer
}

/// A receiver whose handler records one effect and answers [`long_answer`].
async fn long_receiver() -> Receiver {
    Receiver::builder()
        .handler(|delivery: Delivery| async move {
            delivery.record_effect();
            Reply::ok(long_answer())
        })
        .start()
        .await
        .expect("receiver")
}

/// A keyed charge of `key` through the default ledger (the SQLite file in the state
/// directory), with `extra` arguments.
fn charge(
    scratch: &Scratch,
    receiver: &Receiver,
    key: &str,
    extra: &[&str],
) -> tokio::process::Command {
    let mut command = idemcurl(scratch.dir.path());
    command
        .args(["--json", CHARGE, "--key", key])
        .args(extra)
        .arg(receiver.url("/v1/charges"));
    command
}

/// The report's one text line (the last line of stderr).
fn line(ran: &Ran) -> &str {
    ran.stderr.lines().last().unwrap_or_default()
}

#[tokio::test]
async fn a_2mib_answer_through_the_default_ledger_is_written_whole_on_the_rerun_too() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    let out = scratch.path("out.json");
    let out_arg = out.to_str().expect("a UTF-8 path");

    let first = run(charge(&scratch, &receiver, "long-1", &["-o", out_arg])).await;
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(
        std::fs::read_to_string(&out).expect("out.json"),
        long_answer()
    );
    assert!(
        line(&first).starts_with("idemcurl: done: 200 from POST "),
        "{first:?}"
    );
    // The default ledger: the SQLite file in the state directory, and no other.
    assert!(!scratch.ledger().exists());
    let json = run(charge(
        &scratch,
        &receiver,
        "long-0",
        &["--report", "json", "-o", "/dev/null"],
    ))
    .await;
    let ledger = json.report()["ledger"]
        .as_str()
        .expect("a ledger")
        .to_owned();
    assert!(
        ledger.starts_with(scratch.dir.path().to_str().expect("UTF-8"))
            && ledger.ends_with(".sqlite3"),
        "{ledger}"
    );

    std::fs::write(&out, "").expect("empty it");
    let again = run(charge(&scratch, &receiver, "long-1", &["-o", out_arg])).await;
    assert_eq!(again.code, 0, "{again:?}");
    let written = std::fs::read_to_string(&out).expect("out.json");
    assert_eq!(written.len(), LONG, "the whole body, never an empty one");
    assert_eq!(written, long_answer());
    let said = line(&again);
    assert!(
        said.contains(
            "fetched again from the receiver under its key: the ledger keeps answers up to \
             1048576 bytes; 1 attempt in "
        ),
        "{said}"
    );
    assert!(!said.contains("empty"), "{said}");
    // The key on both requests, one effect: the receiver answered the second from its store.
    let keys = receiver.keys();
    let sent: Vec<_> = keys
        .iter()
        .filter(|key| key.as_deref() != Some("long-0"))
        .collect();
    assert_eq!(
        sent,
        [&Some("long-1".to_owned()), &Some("long-1".to_owned())]
    );
    assert_eq!(receiver.effects_for("long-1"), 1);

    // The JSON report says the same, for programs.
    let json = run(charge(
        &scratch,
        &receiver,
        "long-1",
        &["--report", "json", "-o", "/dev/null"],
    ))
    .await;
    assert_eq!(json.code, 0, "{json:?}");
    let report = json.report();
    assert_eq!(report["refetched"], true, "{report}");
    assert_eq!(report["replayed"], false, "{report}");
    assert_eq!(report["sent"], true, "{report}");
    assert_eq!(report["outcome"], "done", "{report}");
    assert_eq!(receiver.effects_for("long-1"), 1);
}

#[tokio::test]
async fn with_no_refetch_a_rerun_exits_79_naming_the_key_size_and_limit_and_sends_nothing() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    let first = run(charge(&scratch, &receiver, "long-2", &["-o", "/dev/null"])).await;
    assert_eq!(first.code, 0, "{first:?}");

    let out = scratch.path("kept.json");
    std::fs::write(&out, "what was there").expect("a file");
    let out_arg = out.to_str().expect("a UTF-8 path");
    let refused = run(charge(
        &scratch,
        &receiver,
        "long-2",
        &["--no-refetch", "-o", out_arg],
    ))
    .await;
    assert_eq!(refused.code, 79, "{refused:?}");
    let said = line(&refused);
    for part in [
        "idemcurl: done, answer not kept: 200 from POST ",
        "its answer's body (2097152 bytes) was longer than the ledger keeps (1048576 bytes, \
         --max-saved-body)",
        "nothing was sent",
        "run it again without --no-refetch to have the receiver answer it again under the key",
        "long-2",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
    assert!(!said.contains("LedgerOptions"), "{said}");
    assert_eq!(
        std::fs::read_to_string(&out).expect("the file"),
        "what was there",
        "nothing written out"
    );
    assert_eq!(receiver.arrivals(), 1, "nothing sent");

    let json = run(charge(
        &scratch,
        &receiver,
        "long-2",
        &["--no-refetch", "--report", "json"],
    ))
    .await;
    assert_eq!(json.code, 79, "{json:?}");
    assert!(json.stdout.is_empty(), "{json:?}");
    let report = json.report();
    assert_eq!(report["exit"], 79, "{report}");
    assert_eq!(report["outcome"], "done", "{report}");
    assert_eq!(report["status"], 200, "{report}");
    assert_eq!(report["sent"], false, "{report}");
    assert_eq!(report["key"], "long-2", "{report}");
    assert_eq!(receiver.arrivals(), 1, "nothing sent");
}

#[tokio::test]
async fn max_saved_body_decides_which_answers_the_ledger_replays() {
    let receiver = long_receiver().await;
    let scratch = Scratch::new();
    // Above the 2 MiB answer: the ledger keeps it, and the re-run replays it.
    for expect_replayed in [false, true] {
        let ran = run(charge(
            &scratch,
            &receiver,
            "long-3",
            &["--max-saved-body", "4MiB", "--report", "json"],
        ))
        .await;
        assert_eq!(ran.code, 0, "{ran:?}");
        assert_eq!(ran.stdout.len(), LONG);
        let report = ran.report();
        assert_eq!(report["replayed"], expect_replayed, "{report}");
        assert_eq!(report["refetched"], false, "{report}");
    }
    assert_eq!(receiver.arrivals(), 1, "replayed from the ledger");

    // Below a small answer: the ledger keeps none of it, and the re-run fetches it again.
    let small = Receiver::start().await.expect("receiver");
    let answer = r#"{"effect":1}"#;
    for expect_refetched in [false, true] {
        let ran = run(charge(
            &scratch,
            &small,
            "small-1",
            &["--max-saved-body", "8", "--report", "json"],
        ))
        .await;
        assert_eq!(ran.code, 0, "{ran:?}");
        assert_eq!(ran.stdout_text(), answer);
        assert_eq!(ran.report()["refetched"], expect_refetched, "{ran:?}");
    }
    assert_eq!(
        small.keys(),
        [Some("small-1".to_owned()), Some("small-1".to_owned())]
    );
    assert_eq!(small.effects_for("small-1"), 1);

    let refused = run(charge(
        &scratch,
        &small,
        "small-1",
        &["--max-saved-body", "8", "--no-refetch"],
    ))
    .await;
    assert_eq!(refused.code, 79, "{refused:?}");
    assert!(
        line(&refused).contains("its answer's body (12 bytes) was longer than the ledger keeps (8 bytes, --max-saved-body)"),
        "{refused:?}"
    );
    assert_eq!(small.arrivals(), 2);
}
