//! The command against the testkit's idempotent receiver: what the receiver saw, how many side
//! effects, and what the command said and exited with.

use std::time::Duration;

use idempotent_retry::time::{Clock as _, TokioClock};
use idempotent_retry_testkit::{Fault, Receiver, When};

use crate::support::{Scratch, finish, idemcurl, run};

const CHARGE: &str = r#"{"amount":1200,"currency":"eur"}"#;

/// A keyed charge on `receiver`, with the test's ledger and the JSON report.
fn charge(scratch: &Scratch, receiver: &Receiver, extra: &[&str]) -> tokio::process::Command {
    let mut command = idemcurl(scratch.dir.path());
    command
        .arg("--ledger")
        .arg(scratch.ledger())
        .args(["--report", "json", "--json", CHARGE])
        .args(extra)
        .arg(receiver.url("/v1/charges"));
    command
}

/// A keyed charge on `receiver` as a person runs it: the ledger of the test, the text report
/// on stderr (where a wait for another run is told).
fn charge_text(scratch: &Scratch, receiver: &Receiver, extra: &[&str]) -> tokio::process::Command {
    let mut command = idemcurl(scratch.dir.path());
    command
        .arg("--ledger")
        .arg(scratch.ledger())
        .args(["--json", CHARGE])
        .args(extra)
        .arg(receiver.url("/v1/charges"));
    command
}

/// The ledger's row for `key`, as `idemcurl ledger show KEY --json` prints it.
async fn ledger_row(scratch: &Scratch, key: &str) -> serde_json::Value {
    let mut show = idemcurl(scratch.dir.path());
    show.args(["ledger", "--sqlite"])
        .arg(scratch.ledger())
        .args(["show", key, "--json"]);
    let shown = run(show).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    serde_json::from_slice(&shown.stdout).expect("the row as JSON")
}

/// The wait the text report's line tells (`(of which 9.80s waiting for another run of the
/// key)`), zero when it tells none.
fn told_wait(line: &str) -> Duration {
    let Some((_, rest)) = line.split_once("(of which ") else {
        return Duration::ZERO;
    };
    let (amount, _) = rest
        .split_once(" waiting for another run of the key)")
        .unwrap_or_else(|| panic!("a wait phrase without its end: {line}"));
    if let Some(millis) = amount.strip_suffix("ms") {
        Duration::from_millis(millis.parse().expect("milliseconds"))
    } else if let Some(seconds) = amount.strip_suffix('s') {
        Duration::from_secs_f64(seconds.parse().expect("seconds"))
    } else {
        panic!("a wait in neither ms nor s: {line}")
    }
}

#[tokio::test]
async fn a_rerun_after_success_is_replayed_from_the_ledger_with_nothing_sent() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let first = run(charge(&scratch, &receiver, &["--key", "charge-1"])).await;
    let again = run(charge(&scratch, &receiver, &["--key", "charge-1"])).await;
    assert_eq!((first.code, again.code), (0, 0), "{first:?} {again:?}");
    assert_eq!(receiver.arrivals(), 1, "the re-run sent nothing");
    assert_eq!(receiver.effects_for("charge-1"), 1);
    assert_eq!(
        again.stdout, first.stdout,
        "the saved answer, byte for byte"
    );
    let report = again.report();
    assert_eq!(report["replayed"], true);
    assert_eq!(report["sent"], false);
    assert_eq!(report["status"], 200);
    assert_eq!(first.report()["sent"], true);
}

#[tokio::test]
async fn the_run_identity_makes_a_rerun_in_the_run_the_same_operation_and_another_run_a_new_one() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let in_run = |run_id: &'static str| {
        let mut command = charge(&scratch, &receiver, &[]);
        command.env("IDEMPOTENT_RETRY_RUN", run_id);
        command
    };
    let first = run(in_run("run-7")).await;
    let again = run(in_run("run-7")).await;
    let other = run(in_run("run-8")).await;
    for ran in [&first, &again, &other] {
        assert_eq!(ran.code, 0, "{ran:?}");
        assert_eq!(ran.report()["key_source"], "run");
    }
    assert_eq!(first.report()["key"], again.report()["key"]);
    assert_ne!(first.report()["key"], other.report()["key"]);
    assert_eq!(again.report()["replayed"], true);
    assert_eq!(receiver.arrivals(), 2, "one per run");
    assert_eq!(receiver.effects(), 2);
}

#[tokio::test]
async fn without_a_key_source_each_invocation_is_a_new_operation_and_says_so() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let mut text = idemcurl(scratch.dir.path());
    text.arg("--ledger")
        .arg(scratch.ledger())
        .args(["--json", CHARGE])
        .arg(receiver.url("/v1/charges"));
    let first = run(text).await;
    let second = run(charge(&scratch, &receiver, &[])).await;
    assert_eq!((first.code, second.code), (0, 0));
    assert_eq!(receiver.arrivals(), 2);
    assert!(
        first
            .stderr
            .contains("fresh for this invocation: a re-run is a new operation"),
        "{}",
        first.stderr
    );
    assert_eq!(second.report()["key_source"], "fresh");
}

#[tokio::test]
async fn a_changed_request_under_a_used_key_is_refused_with_nothing_sent() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let first = run(charge(&scratch, &receiver, &["--key", "charge-2"])).await;
    assert_eq!(first.code, 0);
    let mut changed = idemcurl(scratch.dir.path());
    changed
        .arg("--ledger")
        .arg(scratch.ledger())
        .args([
            "--key",
            "charge-2",
            "--json",
            r#"{"amount":9900,"currency":"eur"}"#,
        ])
        .arg(receiver.url("/v1/charges"));
    let refused = run(changed).await;
    assert_eq!(refused.code, 77, "{refused:?}");
    assert!(
        refused.stderr.contains("refused, nothing sent"),
        "{}",
        refused.stderr
    );
    assert!(
        refused.stderr.contains("body differs"),
        "{}",
        refused.stderr
    );
    assert!(refused.stdout.is_empty());
    assert_eq!(receiver.arrivals(), 1);
}

#[tokio::test]
async fn two_invocations_racing_on_one_key_send_once_and_the_second_replays() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    // The first holds the key while its handler runs: the second starts only once the first's
    // request has arrived, so it meets the first's lease.
    receiver.inject(
        When::key_attempt("race-1", 1),
        Fault::SlowHandler(Duration::from_millis(1500)),
    );
    let first = charge(&scratch, &receiver, &["--key", "race-1"])
        .spawn()
        .expect("first starts");
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(30)).await,
        1
    );
    let second = run(charge(&scratch, &receiver, &["--key", "race-1"])).await;
    let first = finish(first).await;
    assert_eq!((first.code, second.code), (0, 0), "{first:?} {second:?}");
    assert_eq!(receiver.arrivals(), 1, "sent once");
    assert_eq!(receiver.effects_for("race-1"), 1);
    assert_eq!(second.report()["replayed"], true);
    assert_eq!(second.stdout, first.stdout);
}

/// Kills `child` with SIGKILL.
fn kill(child: &tokio::process::Child) {
    let pid = child.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

#[tokio::test]
async fn a_run_killed_mid_request_is_taken_over_by_a_rerun_within_a_lease_with_the_defaults() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    // The charge commits, then its answer is held back: the process dies not knowing.
    receiver.inject(
        When::key_attempt("kill-1", 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    let doomed = charge_text(&scratch, &receiver, &["--key", "kill-1"])
        .spawn()
        .expect("starts");
    let worker = format!("idemcurl-{}", doomed.id().expect("running"));
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(30)).await,
        1
    );
    kill(&doomed);
    let clock = TokioClock::new();
    let killed_at = clock.now();
    let killed = finish(doomed).await;
    assert_eq!(killed.code, -1, "killed by a signal");
    let dead = ledger_row(&scratch, "kill-1").await;
    assert_eq!(dead["status"], "in_flight", "{dead}");
    let lease_until = dead["lease_expires_at"]
        .as_str()
        .and_then(|until| humantime::parse_rfc3339(until).ok())
        .unwrap_or_else(|| panic!("the dead run's lease: {dead}"));

    // The re-run, with the default --lease-wait (3 min), meets the dead run's lease, says once
    // that it waits, takes the operation over once the lease lapses (one lease, 10 s, after
    // the dead run's last renewal) and sends it with the same key; the receiver answers from
    // its own record.
    let started = clock.wall();
    let rerun = run(charge_text(&scratch, &receiver, &["--key", "kill-1"])).await;
    let kill_to_answer = clock.now().duration_since(killed_at);
    println!(
        "idemcurl kill to answer: {:.2}s; {}",
        kill_to_answer.as_secs_f64(),
        rerun.stderr.trim_end()
    );
    assert_eq!(rerun.code, 0, "{rerun:?}");
    assert!(
        kill_to_answer < Duration::from_secs(60),
        "a dead run's key is taken over within one lease (10 s): {kill_to_answer:?}"
    );
    assert!(
        rerun.stdout_text().contains("effect"),
        "the receiver's answer: {}",
        rerun.stdout_text()
    );
    assert_eq!(receiver.arrivals(), 2);
    assert_eq!(receiver.effects_for("kill-1"), 1, "one charge");
    assert!(
        receiver
            .keys()
            .iter()
            .all(|key| key.as_deref() == Some("kill-1"))
    );

    let lines: Vec<&str> = rerun.stderr.lines().collect();
    let last = lines.last().copied().unwrap_or_default();
    assert!(
        last.starts_with("idemcurl: done: 200 from POST ")
            && last.contains(", sent, 1 attempt in "),
        "{last}"
    );
    let waited = told_wait(last);
    let notices: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|line| line.contains("waiting for run"))
        .collect();
    // The line is printed once the wait reaches a second: it is there exactly when the
    // report's wait is longer than that.
    assert_eq!(
        notices.len(),
        usize::from(waited > Duration::from_secs(1)),
        "{}",
        rerun.stderr
    );
    if lease_until
        .duration_since(started)
        .is_ok_and(|left| left > Duration::from_secs(2))
    {
        // It started with the dead run's lease seconds from its end: it waited, and said so.
        assert!(waited > Duration::from_secs(1), "{}", rerun.stderr);
        let notice = notices[0];
        assert!(
            notice.starts_with("idemcurl: waiting for run ")
                && notice.contains(&format!(" of worker {worker}, lease until "))
                && notice.ends_with(" (--lease-wait)"),
            "{notice}"
        );
    }

    // The ledger counts both requests that may have reached the receiver: the dead run's,
    // counted by the run that took its row over, and the re-run's.
    let row = ledger_row(&scratch, "kill-1").await;
    assert_eq!(row["status"], "succeeded", "{row}");
    assert_eq!(row["attempts"], 2, "{row}");
    assert_eq!(row["lease_owner"], serde_json::Value::Null, "{row}");
}

#[tokio::test]
async fn past_the_window_a_killed_run_is_refused_and_the_report_says_how_to_reconcile() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    receiver.inject(
        When::key_attempt("late-1", 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    let args = ["--key", "late-1", "-m", "1", "--reconcile-window", "1s"];
    let doomed = charge(&scratch, &receiver, &args).spawn().expect("starts");
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(30)).await,
        1
    );
    kill(&doomed);
    let _ = finish(doomed).await;
    // The dead run's lease (10 s) outlasts the window (1 s): the re-run waits for it, and
    // finds the window over first.
    let mut text = idemcurl(scratch.dir.path());
    text.arg("--ledger")
        .arg(scratch.ledger())
        .args(["--json", CHARGE])
        .args(args)
        .arg(receiver.url("/v1/charges"));
    let late = run(text).await;
    assert_eq!(late.code, 76, "{late:?}");
    assert!(late.stderr.contains("outcome unknown"), "{}", late.stderr);
    // The command the report prints runs as printed, once its placeholders are filled.
    let printed = late
        .stderr
        .split("settle it with `")
        .nth(1)
        .and_then(|rest| rest.split('`').next())
        .unwrap_or_else(|| panic!("a resolve command: {}", late.stderr));
    assert!(
        printed.starts_with("idemcurl ledger --sqlite ")
            && printed.ends_with("resolve late-1 --operator NAME --reason TEXT --done"),
        "{printed}"
    );
    let filled = printed
        .replace("NAME", "ops")
        .replace("TEXT", "checked-at-the-receiver");
    // The dead run's lease (10 s) is still live: the command says so and changes nothing,
    // then goes through once it lapses.
    let resolved = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let mut resolve = idemcurl(scratch.dir.path());
            resolve.args(filled.split_whitespace().skip(1));
            let resolved = run(resolve).await;
            if resolved.code != 1 || !resolved.stderr.contains("a live lease holds it") {
                return resolved;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("the dead run's lease lapses");
    assert_eq!(resolved.code, 0, "{printed}: {resolved:?}");
    assert_eq!(receiver.arrivals(), 1, "nothing sent past the window");
    // The operators' command in the same binary reads the same ledger.
    let mut show = idemcurl(scratch.dir.path());
    show.args(["ledger", "--sqlite"])
        .arg(scratch.ledger())
        .args(["show", "late-1"]);
    let shown = run(show).await;
    assert_eq!(shown.code, 0, "{shown:?}");
    assert!(
        shown
            .stdout_text()
            .contains("resolution:    done by operator ops"),
        "{}",
        shown.stdout_text()
    );
    // Its help names it as it is typed.
    let mut help = idemcurl(scratch.dir.path());
    help.args(["ledger", "resolve", "--help"]);
    let help = run(help).await;
    assert_eq!(help.code, 0, "{help:?}");
    assert!(
        help.stdout_text()
            .contains("Usage: idemcurl ledger resolve"),
        "{}",
        help.stdout_text()
    );
}

#[tokio::test]
async fn a_cancelled_run_gives_its_lease_back_so_the_rerun_goes_at_once() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    receiver.inject(
        When::key_attempt("cancel-1", 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    // The attempt never times out by itself (-m 600); a lease left behind would hold the
    // re-run up for 10 s, past its --lease-wait, and it would fail instead of sending.
    let args = ["--key", "cancel-1", "-m", "600", "--lease-wait", "1s"];
    let cancelled = charge(&scratch, &receiver, &args).spawn().expect("starts");
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(30)).await,
        1
    );
    let pid = cancelled.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let cancelled = finish(cancelled).await;
    assert_eq!(cancelled.code, 76, "{cancelled:?}");
    let report = cancelled.report();
    assert_eq!(report["cancelled"], true);
    assert_eq!(report["outcome"], "unknown");
    let rerun = run(charge(&scratch, &receiver, &args)).await;
    assert_eq!(rerun.code, 0, "the lease was given back: {rerun:?}");
    assert_eq!(receiver.effects_for("cancel-1"), 1);
    assert_eq!(receiver.arrivals(), 2);
}

#[tokio::test]
async fn each_exit_status_says_what_happened() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let code = |ran: &crate::support::Ran| (ran.code, ran.report()["outcome"].clone());

    // 503 on every attempt: it may have run.
    receiver.inject(When::key_attempt("s-503", 1), Fault::status(503));
    receiver.inject(When::key_attempt("s-503", 2), Fault::status(503));
    let ran = run(charge(
        &scratch,
        &receiver,
        &["--key", "s-503", "--retry", "1"],
    ))
    .await;
    assert_eq!(code(&ran), (76, "unknown".into()), "{ran:?}");
    assert_eq!(ran.report()["attempts"], 2);

    // Nothing listens: it cannot have run.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a port")
        .local_addr()
        .expect("addr")
        .port();
    let mut refused = idemcurl(scratch.dir.path());
    refused
        .arg("--ledger")
        .arg(scratch.ledger())
        .args(["--report", "json", "--retry", "1", "-d", "a=1"])
        .arg(format!("http://127.0.0.1:{port}/"));
    let ran = run(refused).await;
    assert_eq!(code(&ran), (75, "not_done".into()), "{ran:?}");

    // A final 4xx: done, exit 22 with --fail and no body written.
    receiver.inject(When::key_attempt("s-404", 1), Fault::status(404));
    let ran = run(charge(&scratch, &receiver, &["--key", "s-404", "-f"])).await;
    assert_eq!(code(&ran), (22, "done".into()), "{ran:?}");
    assert!(ran.stdout.is_empty());
    // Without --fail the 404 is a final answer like any other; a rejected request is not
    // replayed (the ledger holds it as failed): a re-run sends it again, with its key.
    receiver.inject(When::key_attempt("s-404", 2), Fault::status(404));
    let ran = run(charge(&scratch, &receiver, &["--key", "s-404"])).await;
    assert_eq!(code(&ran), (0, "done".into()), "{ran:?}");
    assert_eq!(ran.report()["status"], 404);
    assert_eq!(ran.report()["sent"], true);

    // Usage errors: nothing sent.
    let before = receiver.arrivals();
    for bad in [
        &["-k"][..],
        &["--retry-all-errors"],
        &["-m", "0"],
        &["-w", "%{nope}"],
    ] {
        let mut command = charge(&scratch, &receiver, bad);
        command.arg("--key").arg("s-usage");
        let ran = run(command).await;
        assert_eq!(ran.code, 2, "{bad:?}: {ran:?}");
    }
    assert_eq!(receiver.arrivals(), before);

    // The ledger cannot be opened: a directory where the file should be.
    let mut broken = idemcurl(scratch.dir.path());
    broken
        .arg("--ledger")
        .arg(scratch.dir.path())
        .args(["--report", "json", "-d", "a=1"])
        .arg(receiver.url("/"));
    let ran = run(broken).await;
    assert_eq!(code(&ran), (78, "ledger_error".into()), "{ran:?}");
    assert_eq!(ran.report()["sent"], false);
    assert_eq!(receiver.arrivals(), before);
}

#[cfg(unix)]
#[tokio::test]
async fn the_default_ledger_is_a_private_file_in_the_state_directory() {
    use std::os::unix::fs::PermissionsExt as _;
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let mut command = idemcurl(scratch.dir.path());
    command.args(["-s", "-d", "a=1"]).arg(receiver.url("/"));
    let ran = run(command).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert!(ran.stderr.is_empty(), "-s: {}", ran.stderr);
    let dir = scratch.path("idemcurl");
    let file = dir.join("ledger.sqlite3");
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .expect("exists")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&file), 0o600);
    // Closed before the process ended, its WAL kept beside it (every write of the run was
    // synced into it; `SqliteLedger::close_keeping_log`): private too, and short.
    let wal = dir.join("ledger.sqlite3-wal");
    assert_eq!(mode(&wal), 0o600);
    assert!(std::fs::metadata(&wal).expect("the WAL").len() <= 512 * 1024);
    // `idemcurl ledger` reads it without being told where it is.
    let mut list = idemcurl(scratch.dir.path());
    list.args(["ledger", "list", "--json"]);
    let listed = run(list).await;
    assert_eq!(listed.code, 0, "{listed:?}");
    let rows: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON rows");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
}

#[tokio::test]
async fn an_attempt_past_max_time_is_cut_and_reported_as_maybe_done() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    receiver.inject(
        When::key_attempt("slow-1", 1),
        Fault::StallAfterCommit(Duration::from_secs(30)),
    );
    let ran = run(charge(
        &scratch,
        &receiver,
        &["--key", "slow-1", "-m", "0.5", "--retry", "0"],
    ))
    .await;
    assert_eq!(ran.code, 76, "{ran:?}");
    let report = ran.report();
    assert_eq!(report["attempts"], 1);
    assert!(
        report["error"]
            .as_str()
            .is_some_and(|error| error.contains("timed out")),
        "{report}"
    );
    assert_eq!(
        receiver.effects_for("slow-1"),
        1,
        "it did happen: the report said maybe"
    );
}

#[tokio::test]
async fn a_fleet_on_postgres_sends_once_across_processes_and_replays() {
    // A database of the test's own on the server `.ci/run` starts (skipped without one,
    // except under CI).
    let Some(url) = idempotent_retry_postgres::testing::fresh_database()
        .await
        .expect("a fresh database")
    else {
        return;
    };
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let key = "pg-1".to_owned();
    receiver.inject(
        When::key_attempt(&key, 1),
        Fault::SlowHandler(Duration::from_millis(1500)),
    );
    let on_postgres = || {
        let mut command = idemcurl(scratch.dir.path());
        command
            .args([
                "--postgres",
                &url,
                "--report",
                "json",
                "--key",
                &key,
                "--json",
                CHARGE,
            ])
            .arg(receiver.url("/v1/charges"));
        command
    };
    let first = on_postgres().spawn().expect("first starts");
    assert_eq!(
        receiver.wait_for_arrivals(1, Duration::from_secs(30)).await,
        1
    );
    let second = run(on_postgres()).await;
    let first = finish(first).await;
    let third = run(on_postgres()).await;
    for ran in [&first, &second, &third] {
        assert_eq!(ran.code, 0, "{ran:?}");
    }
    assert_eq!(receiver.arrivals(), 1, "sent once by three processes");
    assert_eq!(receiver.effects_for(&key), 1);
    assert_eq!(second.report()["replayed"], true);
    assert_eq!(third.report()["replayed"], true);
    assert_eq!(third.report()["ledger"], "postgres");
}

#[tokio::test]
async fn a_request_without_a_key_opens_no_ledger() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    let mut get = idemcurl(scratch.dir.path());
    get.args(["--report", "json"])
        .arg(receiver.url("/v1/charges/ch_1"));
    let ran = run(get).await;
    assert_eq!(ran.code, 0, "{ran:?}");
    assert_eq!(ran.report()["key_source"], "none");
    assert_eq!(ran.report()["ledger"], "none");
    assert!(
        !scratch.path("idemcurl").exists(),
        "no state directory made"
    );
    assert_eq!(receiver.keys(), [None]);
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn an_answer_that_cannot_be_written_is_kept_and_replayed_by_the_rerun() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    // /dev/full refuses every write (ENOSPC): the charge happens, its answer cannot be written.
    let full = run(charge(
        &scratch,
        &receiver,
        &["--key", "full-1", "-o", "/dev/full"],
    ))
    .await;
    assert_eq!(full.code, 23, "{full:?}");
    let report = full.report();
    assert_eq!(report["outcome"], "done");
    assert_eq!(report["sent"], true);
    let again = run(charge(&scratch, &receiver, &["--key", "full-1"])).await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(again.report()["replayed"], true);
    assert!(
        again.stdout_text().contains("effect"),
        "{}",
        again.stdout_text()
    );
    assert_eq!(receiver.effects_for("full-1"), 1);
    assert_eq!(receiver.arrivals(), 1);
}

#[tokio::test]
async fn in_progress_answers_are_waited_out_apart_from_retry_then_bounded_by_in_progress_wait() {
    let receiver = Receiver::start().await.expect("receiver");
    let scratch = Scratch::new();
    // Three "in progress" answers, then the answer: more than --retry 1 allows as attempts.
    for attempt in 1..=3 {
        receiver.inject(When::key_attempt("busy-1", attempt), Fault::status(409));
    }
    let ran = run(charge(
        &scratch,
        &receiver,
        &["--key", "busy-1", "--retry", "1"],
    ))
    .await;
    assert_eq!(ran.code, 0, "{ran:?}");
    let report = ran.report();
    assert_eq!(report["status"], 200, "{report}");
    assert_eq!(report["attempts"], 4, "{report}");
    assert_eq!(report["in_progress_waits"], 3, "{report}");
    assert_eq!(receiver.keys(), vec![Some("busy-1".to_owned()); 4]);
    assert_eq!(receiver.effects_for("busy-1"), 1);

    // Still in progress when --in-progress-wait runs out: outcome unknown, exit 76, and the
    // message names the flag that waits longer.
    for attempt in 1..=200 {
        receiver.inject(When::key_attempt("busy-2", attempt), Fault::status(409));
    }
    let ran = run(charge_text(
        &scratch,
        &receiver,
        &["--key", "busy-2", "--in-progress-wait", "300ms"],
    ))
    .await;
    assert_eq!(ran.code, 76, "{ran:?}");
    let said = ran.stderr.lines().last().unwrap_or_default();
    for part in [
        "idemcurl: outcome unknown: ",
        "the receiver still reported the operation in progress after 300ms",
        "--in-progress-wait sets how long to wait",
        "run it again only with --key busy-2",
    ] {
        assert!(said.contains(part), "{part:?} in {said}");
    }
    assert!(!said.contains("RetryPolicy"), "{said}");
    assert_eq!(receiver.effects_for("busy-2"), 0);

    // 0s: the first "in progress" ends it.
    receiver.inject(When::key_attempt("busy-3", 1), Fault::status(409));
    let ran = run(charge(
        &scratch,
        &receiver,
        &["--key", "busy-3", "--in-progress-wait", "0s"],
    ))
    .await;
    assert_eq!(ran.code, 76, "{ran:?}");
    let report = ran.report();
    assert_eq!(report["attempts"], 1, "{report}");
    let error = report["error"].as_str().expect("an error");
    assert!(error.contains("(--in-progress-wait is 0)"), "{error}");
}

#[tokio::test]
async fn a_curl_flag_idemcurl_does_not_take_is_named_as_such_and_nothing_is_sent() {
    let scratch = Scratch::new();
    let mut command = idemcurl(scratch.dir.path());
    command.args(["-k", "https://127.0.0.1:1/v1/charges"]);
    let ran = run(command).await;
    assert_eq!(ran.code, 2, "{ran:?}");
    assert!(
        ran.stderr.contains(
            "-k is not a flag idemcurl takes (it takes a subset of curl's: `idemcurl --help` \
             lists them"
        ) && ran.stderr.contains("nothing was sent"),
        "{}",
        ran.stderr
    );
    assert!(
        !ran.stderr.contains("'-- -k'"),
        "no tip to pass it as a value"
    );
}

#[tokio::test]
async fn a_directory_given_as_the_ledger_is_named_as_one_and_nothing_is_sent() {
    let scratch = Scratch::new();
    let mut command = idemcurl(scratch.dir.path());
    command.arg("--ledger").arg(scratch.dir.path()).args([
        "--key",
        "dir-1",
        "-d",
        "{}",
        "http://127.0.0.1:1/v1/charges",
    ]);
    let ran = run(command).await;
    assert_eq!(ran.code, 78, "{ran:?}");
    assert!(
        ran.stderr
            .contains("is a directory: give --ledger the path of a file in it")
            && ran.stderr.contains("nothing was sent"),
        "{}",
        ran.stderr
    );
}
