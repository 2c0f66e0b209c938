//! The operators' command, `idempotent-retry-ledger`, run as a process on an SQLite ledger with
//! a row in every status: its text and JSON output against golden files in `tests/data/cli/`
//! (`UPDATE_GOLDEN=1` rewrites them; review the diff), its exit statuses, and what `resolve`
//! and `purge` leave in the file.
#![cfg(feature = "cli")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use idempotent_retry::{
    Claim, Claimed, Finish, Ledger, OperationStatus, ResolutionKind, SavedResponse, SqliteLedger,
};

const BIN: &str = env!("CARGO_BIN_EXE_idempotent-retry-ledger");
/// The time every command is run at: two hours after the first operation.
const NOW: &str = "2024-01-01T02:00:00Z";

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200 + secs)
}

/// A claim of `key` at `secs` for `fingerprint`, held for a minute, kept a day.
fn claim(key: &str, scope: &str, fingerprint: &str, secs: u64) -> Claim {
    Claim::builder(
        key,
        fingerprint,
        format!("worker-a/{key}"),
        at(secs),
        at(secs + 60),
    )
    .scope(scope)
    .expires_at(at(secs + 86_400))
    .request("POST", format!("https://api.example.com/v1/{scope}"))
    .build()
    .expect("valid claim")
}

/// A row to make: key, scope, fingerprint, when claimed, and how it ended (none: in flight).
type Row = (
    &'static str,
    &'static str,
    &'static str,
    u64,
    Option<(OperationStatus, Option<SavedResponse>)>,
);

/// A ledger file with every status, two keys for one request, and one expired row.
async fn ledger_with_every_status(path: &Path) {
    let ledger = SqliteLedger::open(path).await.expect("open");
    rows_in_every_status(&ledger).await;
}

/// Every status, two keys for one request, and one expired row, written to `ledger`.
async fn rows_in_every_status(ledger: &dyn Ledger) {
    let finish = |key: &str, status, response, secs: u64| {
        Finish::new(key, format!("worker-a/{key}"), status, response)
            .expect("valid finish")
            .with_last_attempt(at(secs + 30))
    };
    let charged = SavedResponse::new(
        201,
        vec![("content-type".into(), "application/json".into())],
        Some(br#"{"id":"ch_1"}"#.to_vec()),
    );
    let rows: [Row; 6] = [
        (
            "order-1",
            "charges",
            "f1",
            0,
            Some((OperationStatus::Succeeded, Some(charged.clone()))),
        ),
        (
            "order-2",
            "charges",
            "f2",
            600,
            Some((
                OperationStatus::FailedFinal,
                Some(SavedResponse::new(
                    402,
                    Vec::new(),
                    Some(b"declined".to_vec()),
                )),
            )),
        ),
        (
            "order-3",
            "charges",
            "f3",
            1200,
            Some((OperationStatus::Unknown, None)),
        ),
        ("order-4", "refunds", "f4", 7_170, None),
        ("order-5", "refunds", "f5", 1800, None),
        (
            "order-1-again",
            "charges",
            "f1",
            2400,
            Some((OperationStatus::Succeeded, Some(charged))),
        ),
    ];
    for (key, scope, fingerprint, secs, end) in rows {
        let claimed = ledger
            .claim(&claim(key, scope, fingerprint, secs))
            .await
            .expect("claim");
        assert!(matches!(claimed, Claimed::New(_)), "{claimed:?}");
        if let Some((status, response)) = end {
            ledger
                .finish(&finish(key, status, response, secs))
                .await
                .expect("finish");
        }
    }
    // A row long expired, for purge.
    let old = Claim::builder("order-0", "f0", "worker-a/order-0", at(0), at(60))
        .scope("charges")
        .expires_at(at(3_600))
        .build()
        .expect("valid");
    ledger.claim(&old).await.expect("claim");
    ledger
        .finish(
            &Finish::new(
                "order-0",
                "worker-a/order-0",
                OperationStatus::FailedFinal,
                None,
            )
            .expect("valid"),
        )
        .await
        .expect("finish");
}

fn run(path: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--sqlite")
        .arg(path)
        .args(["--now", NOW])
        .args(args)
        .output()
        .expect("run the command")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// Compares `actual` with the golden file `name`, or rewrites it under `UPDATE_GOLDEN`.
fn golden(name: &str, actual: &str) {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "data", "cli", name]
        .iter()
        .collect();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("mkdir");
        std::fs::write(&path, actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("{}: {err} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(actual, expected, "{name} differs from its golden file");
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}, stderr: {}",
        output.status.code(),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn failed(output: &Output, code: i32) -> String {
    assert_eq!(
        output.status.code(),
        Some(code),
        "stdout: {}",
        text(&output.stdout)
    );
    text(&output.stderr)
}

#[tokio::test]
async fn list_show_and_duplicates_print_every_status_as_the_golden_files_say() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;

    golden("list.txt", &ok(&run(&path, &["list"])));
    golden("list.json", &ok(&run(&path, &["list", "--json"])));
    golden(
        "list-unresolved.txt",
        &ok(&run(&path, &["list", "--status", "unresolved"])),
    );
    golden(
        "list-refunds-older.txt",
        &ok(&run(
            &path,
            &["list", "--scope", "refunds", "--older-than", "1h"],
        )),
    );
    golden("show-unknown.txt", &ok(&run(&path, &["show", "order-3"])));
    golden("show-dead.txt", &ok(&run(&path, &["show", "order-5"])));
    golden(
        "show-succeeded.json",
        &ok(&run(&path, &["show", "order-1", "--json"])),
    );
    golden("duplicates.txt", &ok(&run(&path, &["duplicates"])));
    golden(
        "duplicates.json",
        &ok(&run(&path, &["duplicates", "--json"])),
    );

    // Every JSON output parses, and says what the table says.
    let listed: serde_json::Value =
        serde_json::from_str(&ok(&run(&path, &["list", "--json"]))).expect("JSON");
    let statuses: Vec<&str> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|row| row["status"].as_str().expect("a status"))
        .collect();
    assert_eq!(
        statuses,
        [
            "failed_final",
            "succeeded",
            "failed_final",
            "unknown",
            "in_flight",
            "succeeded",
            "in_flight"
        ]
    );
    assert_eq!(
        failed(&run(&path, &["show", "order-9"]), 1),
        "order-9: no such operation\n"
    );
}

#[tokio::test]
async fn resolve_records_the_operator_and_refuses_what_is_not_unresolved() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    let resolve = |key: &str, verdict: &[&str]| {
        let mut args = vec!["resolve", key];
        args.extend_from_slice(verdict);
        args.extend_from_slice(&[
            "--operator",
            "alice",
            "--reason",
            "INC-42: charge found in the dashboard",
        ]);
        run(&path, &args)
    };
    assert_eq!(
        ok(&resolve(
            "order-3",
            &["--done", "--body", r#"{"id":"ch_3"}"#]
        )),
        "order-3: resolved done by operator alice\n"
    );
    // The dead run's row may be resolved too; the live one may not, nor a finished one.
    assert_eq!(
        ok(&resolve("order-5", &["--not-done"])),
        "order-5: resolved not_done by operator alice\n"
    );
    assert!(
        failed(&resolve("order-4", &["--not-done"]), 1)
            .starts_with("order-4: a live lease holds it")
    );
    assert_eq!(
        failed(&resolve("order-1", &["--not-done"]), 1),
        "order-1: it is succeeded, not unresolved; nothing changed\n"
    );
    assert_eq!(
        failed(&resolve("order-9", &["--send-again"]), 1),
        "order-9: no such operation\n"
    );

    let ledger = SqliteLedger::open(&path).await.expect("open");
    let done = ledger.get("order-3").await.expect("read").expect("a row");
    assert_eq!(done.status, OperationStatus::Succeeded);
    let saved = done.response.expect("the response to replay");
    assert_eq!(
        (saved.status, saved.body.as_deref()),
        (200, Some(&br#"{"id":"ch_3"}"#[..]))
    );
    let note = done.resolution.expect("recorded");
    assert_eq!(note.kind, ResolutionKind::Done);
    assert_eq!(note.by, "operator alice");
    assert_eq!(
        note.reason.as_deref(),
        Some("INC-42: charge found in the dashboard")
    );
    assert_eq!(note.at, at(7_200));
    let reopened = ledger.get("order-5").await.expect("read").expect("a row");
    assert_eq!(reopened.status, OperationStatus::FailedFinal);
    assert_eq!(
        reopened.first_attempt_at,
        at(7_200),
        "a new window from the resolution"
    );
    golden("show-resolved.txt", &ok(&run(&path, &["show", "order-3"])));
}

#[tokio::test]
async fn purge_deletes_expired_rows_in_batches_with_a_progress_line_each() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    let output = run(&path, &["purge", "--batch", "1"]);
    assert_eq!(
        ok(&output),
        "purged 1 expired rows (expiry at or before 2024-01-01T02:00:00Z)\n"
    );
    assert_eq!(text(&output.stderr), "purged 1 rows (1 so far)\n");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    assert!(ledger.get("order-0").await.expect("read").is_none());
    assert!(ledger.get("order-1").await.expect("read").is_some());
}

#[test]
fn usage_errors_exit_2_and_a_missing_file_exits_3() {
    let help = Command::new(BIN).arg("--help").output().expect("run");
    let help = ok(&help);
    for part in [
        "list",
        "show",
        "resolve",
        "purge",
        "duplicates",
        "Exit status:",
        "--sqlite <PATH>",
    ] {
        assert!(help.contains(part), "--help lacks {part:?}:\n{help}");
    }
    let none = Command::new(BIN).output().expect("run");
    assert_eq!(none.status.code(), Some(2));
    let nowhere = Command::new(BIN).arg("list").output().expect("run");
    assert!(failed(&nowhere, 2).contains("--sqlite PATH or --postgres URL"));
    let verdictless = Command::new(BIN)
        .args([
            "--sqlite",
            "x.db",
            "resolve",
            "k",
            "--operator",
            "a",
            "--reason",
            "r",
        ])
        .output()
        .expect("run");
    failed(&verdictless, 2);
    let bad_time = Command::new(BIN)
        .args(["--sqlite", "x.db", "--now", "yesterday", "list"])
        .output()
        .expect("run");
    assert!(failed(&bad_time, 2).contains("not an RFC 3339 time"));
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("nothing.db");
    let output = Command::new(BIN)
        .arg("--sqlite")
        .arg(&missing)
        .arg("list")
        .output()
        .expect("run");
    assert!(failed(&output, 3).contains("no ledger file at"));
    assert!(!missing.exists(), "a missing file is not created");
}

/// The same rows in a PostgreSQL database print the same table and JSON as in SQLite.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_ledger_prints_as_the_sqlite_one_does() {
    let Ok(base) = std::env::var("IDEMPOTENT_RETRY_PG_URL") else {
        eprintln!("skipped: IDEMPOTENT_RETRY_PG_URL is not set");
        return;
    };
    let (admin, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
        .await
        .expect("connect to the test server");
    tokio::spawn(connection);
    let name = format!(
        "ir_{}",
        idempotent_retry::IdempotencyKey::random()
            .as_str()
            .replace('-', "")
    );
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    let url = format!("{prefix}/{name}");
    let ledger = idempotent_retry::PostgresLedger::connect(&url)
        .await
        .expect("connect");
    ledger.migrate().await.expect("migrate");
    rows_in_every_status(&ledger).await;
    let run = |args: &[&str]| {
        Command::new(BIN)
            .args(["--postgres", &url, "--now", NOW])
            .args(args)
            .output()
            .expect("run the command")
    };
    golden("list.txt", &ok(&run(&["list"])));
    golden("list.json", &ok(&run(&["list", "--json"])));
    golden("duplicates.txt", &ok(&run(&["duplicates"])));
    assert_eq!(
        ok(&run(&[
            "resolve",
            "order-5",
            "--not-done",
            "--operator",
            "alice",
            "--reason",
            "r"
        ])),
        "order-5: resolved not_done by operator alice\n"
    );
}
