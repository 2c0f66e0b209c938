//! The operators' command, `idempotent-retry-ledger`, run as a process on an SQLite ledger with
//! a row in every status: its text and JSON output against golden files in `tests/data/cli/`
//! (`UPDATE_GOLDEN=1` rewrites them; review the diff), its exit statuses, what `resolve`,
//! `release`, `purge` and `migrate` leave in the file, and that the commands that read leave
//! it as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use idempotent_retry::ledger::{
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

/// A ledger file with every status, two keys for one request, and one expired row, closed.
async fn ledger_with_every_status(path: &Path) {
    let ledger = SqliteLedger::open(path).await.expect("open");
    rows_in_every_status(&ledger).await;
    drop(ledger);
    closed(path).await;
}

/// Waits (a bounded while) for the ledger's writer thread, which ends on its own once the
/// ledger is dropped, to close the file: closing, it checkpoints the WAL and removes it.
async fn closed(path: &Path) {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    let wal = PathBuf::from(wal);
    for _ in 0..1000 {
        if !wal.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the ledger's writer did not close {} within 10 s",
        path.display()
    );
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
        "order-9: no such operation, and no key starts with it\n"
    );
}

#[tokio::test]
async fn show_masks_credential_headers_unless_revealed_and_names_a_seal_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    let ledger = SqliteLedger::open(&path).await.expect("open");
    let answers = [
        (
            "key-created",
            SavedResponse::new(
                201,
                vec![
                    ("content-type".into(), "application/json".into()),
                    ("set-cookie".into(), "session=COOKIESECRET".into()),
                    ("x-api-key".into(), "sk_live_HEADERSECRET".into()),
                    ("location".into(), "/v1/keys/7".into()),
                ],
                Some(br#"{"id":"key_7"}"#.to_vec()),
            ),
        ),
        (
            "key-sealed",
            SavedResponse::new(201, Vec::new(), None)
                .sealed("2025-06", vec![1, 0xde, 0xad, 0xbe, 0xef]),
        ),
    ];
    for (key, saved) in answers {
        succeed(&ledger, claim(key, "keys", "f-key", 0), saved).await;
    }
    drop(ledger);
    closed(&path).await;

    let masked = ok(&run(&path, &["show", "key-created"]));
    golden("show-masked.txt", &masked);
    let masked_json = ok(&run(&path, &["show", "key-created", "--json"]));
    golden("show-masked.json", &masked_json);
    for shown in [&masked, &masked_json] {
        assert!(!shown.contains("COOKIESECRET"), "{shown}");
        assert!(!shown.contains("HEADERSECRET"), "{shown}");
    }
    let listed = ok(&run(&path, &["list", "--json"]));
    assert!(!listed.contains("HEADERSECRET"), "{listed}");
    let revealed = ok(&run(&path, &["show", "key-created", "--reveal"]));
    assert!(
        revealed.contains("set-cookie: session=COOKIESECRET"),
        "{revealed}"
    );
    assert!(
        revealed.contains("x-api-key: sk_live_HEADERSECRET"),
        "{revealed}"
    );
    golden("show-sealed.txt", &ok(&run(&path, &["show", "key-sealed"])));
    golden(
        "show-sealed.json",
        &ok(&run(&path, &["show", "key-sealed", "--json"])),
    );
}

/// The file's bytes and modification time, and its schema version.
async fn state(path: &Path) -> (Vec<u8>, SystemTime, u32) {
    (
        std::fs::read(path).expect("read the file"),
        std::fs::metadata(path)
            .and_then(|meta| meta.modified())
            .expect("mtime"),
        SqliteLedger::file_schema_version(path)
            .await
            .expect("version"),
    )
}

#[tokio::test]
async fn list_show_and_duplicates_leave_the_file_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    let before = state(&path).await;
    for args in [
        &["list"][..],
        &["list", "--json", "--status", "unresolved"],
        &["show", "order-3"],
        &["show", "order-1-a", "--json"],
        &["duplicates"],
        &["duplicates", "--json"],
    ] {
        ok(&run(&path, args));
    }
    failed(&run(&path, &["show", "order-"]), 1);
    assert!(state(&path).await == before, "the file changed");
}

#[tokio::test]
async fn a_file_this_user_may_not_write_is_listed() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    golden("list.txt", &ok(&run(&path, &["list"])));
    golden("show-unknown.txt", &ok(&run(&path, &["show", "order-3"])));
    assert_eq!(
        std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777,
        0o444
    );
}

#[tokio::test]
async fn show_takes_a_unique_key_prefix_and_refuses_an_ambiguous_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    assert_eq!(
        ok(&run(&path, &["show", "order-1-a"])),
        ok(&run(&path, &["show", "order-1-again"]))
    );
    // A whole key is that key, even when another key starts with it.
    let exact: serde_json::Value =
        serde_json::from_str(&ok(&run(&path, &["show", "order-1", "--json"]))).expect("JSON");
    assert_eq!(exact["key"], "order-1");
    golden(
        "show-ambiguous.txt",
        &failed(&run(&path, &["show", "order-"]), 1),
    );
    assert_eq!(
        failed(&run(&path, &["show", "order-1-b"]), 1),
        "order-1-b: no such operation, and no key starts with it\n"
    );
    assert_eq!(
        failed(&run(&path, &["show", "order"]), 1),
        "order: no such operation (a key prefix needs 6 characters or more)\n"
    );
}

/// A ledger file with a response whose body is `body` under `key`.
async fn ledger_with_body(path: &Path, key: &str, body: Vec<u8>) {
    ledger_with_answer(path, key, SavedResponse::new(200, Vec::new(), Some(body))).await;
}

/// A succeeded row of `key` with the saved answer `saved`.
async fn ledger_with_answer(path: &Path, key: &str, saved: SavedResponse) {
    let ledger = SqliteLedger::open(path).await.expect("open");
    succeed(&ledger, claim(key, "exports", "f-body", 0), saved).await;
    drop(ledger);
    closed(path).await;
}

/// Claims `claim` as a new row and finishes it succeeded with `saved`, its last attempt at
/// second 30.
async fn succeed(ledger: &SqliteLedger, claim: Claim, saved: SavedResponse) {
    let claimed = ledger.claim(&claim).await.expect("claim");
    assert!(matches!(claimed, Claimed::New(_)), "{claimed:?}");
    ledger
        .finish(
            &Finish::new(
                claim.key.clone(),
                claim.owner.clone(),
                OperationStatus::Succeeded,
                Some(saved),
            )
            .expect("valid finish")
            .with_last_attempt(at(30)),
        )
        .await
        .expect("finish");
}

#[tokio::test]
async fn show_says_how_long_an_answer_the_ledger_did_not_keep_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("unsaved.db");
    let saved = SavedResponse::new(
        200,
        vec![("content-length".to_owned(), "2097152".to_owned())],
        None,
    );
    ledger_with_answer(&path, "export-big", saved).await;
    let shown = ok(&run(&path, &["show", "export-big"]));
    assert!(
        shown.contains(
            "status:        succeeded (done: its body was not kept, so the next run fetches it \
             again with the key)"
        ),
        "{shown}"
    );
    assert!(
        shown.contains("response:      200, body of 2097152 bytes not saved (over the limit"),
        "{shown}"
    );
}

#[tokio::test]
async fn show_prints_a_text_body_s_first_lines_and_another_in_hex() {
    let dir = tempfile::tempdir().expect("temp dir");
    let text = dir.path().join("text.db");
    let mut body = String::from("\u{1b}[31mred\u{1b}[0m\tand a tab\r\n");
    body.push_str(&"x".repeat(230));
    body.push('\n');
    for n in 3..=25 {
        body.push_str(&format!("line {n}\n"));
    }
    ledger_with_body(&text, "export-text", body.clone().into_bytes()).await;
    golden(
        "show-body-text.txt",
        &ok(&run(&text, &["show", "export-text"])),
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run(&text, &["show", "export-text", "--json"]))).expect("JSON");
    assert_eq!(
        json["response"]["body"],
        body.as_str(),
        "--json has all of it"
    );
    assert_eq!(json["response"]["body_hex"], serde_json::Value::Null);

    let binary = dir.path().join("binary.db");
    let bytes: Vec<u8> = (0..40u8).map(|n| n.wrapping_mul(37) ^ 0x80).collect();
    assert!(std::str::from_utf8(&bytes).is_err());
    ledger_with_body(&binary, "export-binary", bytes.clone()).await;
    golden(
        "show-body-binary.txt",
        &ok(&run(&binary, &["show", "export-binary"])),
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&run(&binary, &["show", "export-binary", "--json"])))
            .expect("JSON");
    assert_eq!(json["response"]["body"], serde_json::Value::Null);
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    assert_eq!(json["response"]["body_hex"], hex.as_str());
}

/// A file as a release at schema version 1 left it (its table and index, its version
/// recorded), with one row: the SQL of that version, as it shipped.
fn version_1_file(path: &Path) {
    let conn = rusqlite::Connection::open(path).expect("open");
    conn.execute_batch(&format!(
        "{}
        INSERT INTO idempotent_operations (key, scope, fingerprint, status, attempts,
            first_attempt_at, expires_at)
            VALUES ('order-old', 'charges', 'f-old', 'unknown', 2, 1704067200000, 1704153600000);
        PRAGMA user_version = 1;",
        idempotent_retry::ledger::sql::ddl_0_1("BLOB")
    ))
    .expect("the version 1 schema");
}

#[tokio::test]
async fn an_older_file_is_refused_by_every_command_until_migrate_upgrades_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("v1.db");
    version_1_file(&path);
    let before = state(&path).await;
    let current = SqliteLedger::SCHEMA_VERSION;
    let expected = format!(
        "error: {} is at schema version 1; this command reads version {current}: run \
         `idempotent-retry-ledger --sqlite {} migrate` once every process using it runs a \
         release that knows version {current} (an older release refuses a ledger newer than it \
         knows)\n",
        path.display(),
        path.display()
    );
    assert_eq!(failed(&run(&path, &["list"]), 4), expected);
    for args in [
        &["show", "order-old"][..],
        &["duplicates"],
        &["purge"],
        &[
            "resolve",
            "order-old",
            "--not-done",
            "--operator",
            "a",
            "--reason",
            "r",
        ],
        &["release", "order-old", "--operator", "a", "--reason", "r"],
    ] {
        assert_eq!(failed(&run(&path, args), 4), expected, "{args:?}");
    }
    assert!(state(&path).await == before, "the file changed");

    assert_eq!(
        ok(&run(&path, &["migrate"])),
        format!("migrated from schema version 1 to {current}\n")
    );
    assert_eq!(
        SqliteLedger::file_schema_version(&path)
            .await
            .expect("version"),
        current
    );
    assert_eq!(
        ok(&run(&path, &["migrate"])),
        format!("at schema version {current} already; nothing changed\n")
    );
    let listed = ok(&run(&path, &["list", "--status", "unknown"]));
    assert!(listed.contains("order-old"), "{listed}");

    // A file one version behind (the same table, an older version recorded) is refused too.
    let behind = dir.path().join("behind.db");
    drop(SqliteLedger::open(&behind).await.expect("open"));
    closed(&behind).await;
    rusqlite::Connection::open(&behind)
        .expect("open")
        .pragma_update(None, "user_version", current - 1)
        .expect("stamp");
    assert!(failed(&run(&behind, &["list"]), 4).contains(&format!(
        "is at schema version {}; this command reads version {current}",
        current - 1
    )));
    assert_eq!(
        ok(&run(&behind, &["migrate"])),
        format!(
            "migrated from schema version {} to {current}\n",
            current - 1
        )
    );
}

/// Each command's line, what it printed (stdout, then stderr) and its exit status, as an
/// operator's terminal shows them.
fn transcript(path: &Path, commands: &[&[&str]]) -> String {
    let mut out = String::new();
    for args in commands {
        let words: Vec<String> = args
            .iter()
            .map(|arg| {
                if arg.contains(' ') {
                    format!("\"{arg}\"")
                } else {
                    (*arg).to_owned()
                }
            })
            .collect();
        let output = run(path, args);
        out.push_str(&format!("$ idempotent-retry-ledger {}\n", words.join(" ")));
        out.push_str(&text(&output.stdout));
        out.push_str(&text(&output.stderr));
        out.push_str(&format!(
            "[exit {}]\n\n",
            output.status.code().expect("an exit status")
        ));
    }
    out
}

#[tokio::test]
async fn release_frees_a_key_by_hand_and_refuses_what_may_have_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    ledger_with_every_status(&path).await;
    let release = |key: &'static str, force: bool| -> Vec<&'static str> {
        let mut args = vec![
            "release",
            key,
            "--operator",
            "alice",
            "--reason",
            "INC-7: the gateway was down, nothing reached it",
        ];
        if force {
            args.push("--force");
        }
        args
    };
    let commands = [
        release("order-0", false),
        release("order-3", false),
        release("order-3", true),
        release("order-2", false),
        release("order-1", true),
        release("order-4", true),
        release("order-9", false),
        vec!["show", "order-3"],
    ];
    let commands: Vec<&[&str]> = commands.iter().map(Vec::as_slice).collect();
    golden("release.txt", &transcript(&path, &commands));

    let ledger = SqliteLedger::open_read_only(&path).await.expect("open");
    let released = ledger.get("order-3").await.expect("read").expect("a row");
    assert_eq!(released.status, OperationStatus::NotSent);
    let note = released.resolution.expect("recorded");
    assert_eq!(note.kind, ResolutionKind::Released);
    assert_eq!(note.by, "operator alice");
    assert_eq!(
        note.reason.as_deref(),
        Some("INC-7: the gateway was down, nothing reached it")
    );
    assert_eq!(note.at, at(7_200));
    for (key, status) in [
        ("order-0", OperationStatus::NotSent),
        ("order-2", OperationStatus::FailedFinal),
        ("order-1", OperationStatus::Succeeded),
        ("order-4", OperationStatus::InFlight),
    ] {
        let row = ledger.get(key).await.expect("read").expect("a row");
        assert_eq!(row.status, status, "{key}");
    }
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
    // Commands that change a row take the whole key, and say so to a prefix.
    assert_eq!(
        failed(&resolve("order-1-ag", &["--not-done"]), 1),
        "order-1-ag: no such operation; one key starts with it, but commands that change a row \
         take the whole key: `show order-1-ag` prints it\n"
    );
    assert_eq!(
        failed(&resolve("order-", &["--not-done"]), 1),
        "order-: no such operation; 7 keys start with it, but commands that change a row take \
         the whole key: `show order-` lists them\n"
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
        "release",
        "purge",
        "duplicates",
        "migrate",
        "Exit status:",
        "4  the ledger is at an older schema version than this command reads: run `migrate`",
        "--sqlite <PATH>",
    ] {
        assert!(help.contains(part), "--help lacks {part:?}:\n{help}");
    }
    let release = ok(&Command::new(BIN)
        .args(["release", "--help"])
        .output()
        .expect("run"));
    for part in [
        "becomes not_sent",
        "may have run",
        "--force",
        "run it twice",
        "always refuses a succeeded row",
        "Exit status:",
    ] {
        assert!(
            release.contains(part),
            "release --help lacks {part:?}:\n{release}"
        );
    }
    let nameless = Command::new(BIN)
        .args([
            "--sqlite",
            "x.db",
            "release",
            "k",
            "--operator",
            "",
            "--reason",
            "r",
        ])
        .output()
        .expect("run");
    failed(&nameless, 2);
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
    // On the caller's clock: the golden rows are written at fixed times in 2024.
    let ledger = idempotent_retry::ledger::PostgresLedger::connect(&url)
        .await
        .expect("connect")
        .on_caller_clock();
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
    // A key prefix is a range in byte order, whatever the database's collation: in ICU's
    // `en-US`, say, "order-Za" sorts after "order-[", the end of the prefix "order-Z".
    golden("show-ambiguous.txt", &failed(&run(&["show", "order-"]), 1));
    assert_eq!(
        ok(&run(&["show", "order-1-a", "--json"])),
        ok(&run(&["show", "order-1-again", "--json"]))
    );
    ledger
        .claim(&claim("order-Za", "charges", "f-za", 60))
        .await
        .expect("claim");
    let found: serde_json::Value =
        serde_json::from_str(&ok(&run(&["show", "order-Z", "--json"]))).expect("JSON");
    assert_eq!(found["key"], "order-Za");

    // A database at version 2 is read, but not released in (the workers of version 2 cannot
    // read a not_sent row) until migrate brings it to the version that has them.
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    tokio::spawn(connection);
    db.batch_execute("UPDATE idempotent_operations_schema SET version = 2")
        .await
        .expect("stamp version 2");
    ok(&run(&["list"]));
    let refused = failed(
        &run(&["release", "order-Za", "--operator", "a", "--reason", "r"]),
        4,
    );
    assert!(
        refused.contains("the database is at schema version 2; this command reads version 3")
            && refused.contains("`idempotent-retry-ledger --postgres URL migrate`"),
        "{refused}"
    );
    assert_eq!(
        ok(&run(&["migrate"])),
        format!(
            "migrated from schema version 2 to {}\n",
            SqliteLedger::SCHEMA_VERSION
        )
    );
    assert_eq!(
        ok(&run(&[
            "release",
            "order-0",
            "--operator",
            "alice",
            "--reason",
            "r"
        ])),
        "order-0: released by operator alice (it was failed_final)\n"
    );
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
