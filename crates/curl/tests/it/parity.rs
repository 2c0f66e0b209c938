//! The same command line through real curl and through `idemcurl`: the server sees the same
//! method, target, headers that matter and body bytes (a form's parts compared part by part,
//! since each side draws its own boundary), and the caller the same output and exit status.
//!
//! Needs `curl` on the PATH (`.ci/run` installs it); skipped with a message without it, except
//! under `CI`, where its absence fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{Ran, Scratch, idemcurl, run};

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    method: String,
    target: String,
    /// Lowercased names, in a sorted map (order on the wire is each client's own).
    headers: BTreeMap<String, Vec<String>>,
    body: Vec<u8>,
}

/// A server that records every request and answers by path: `/redirect` 302 to `/final`,
/// `/see-other` 303 to `/final`, `/status/N` with status N, anything else 200 with a body.
struct Recorder {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

fn answer(target: &str) -> Vec<u8> {
    let (status, extra, body) = if target.starts_with("/redirect") {
        ("302 Found", "Location: /final\r\n", "moved")
    } else if target.starts_with("/see-other") {
        ("303 See Other", "Location: /final\r\n", "see other")
    } else if let Some(code) = target.strip_prefix("/status/") {
        let code = &code[..3.min(code.len())];
        return format!(
            "HTTP/1.1 {code} Whatever\r\nContent-Type: text/plain\r\nX-Answer: {code}\r\nContent-Length: 6\r\nConnection: close\r\n\r\nstatus"
        )
        .into_bytes();
    } else {
        ("200 OK", "", "{\"ok\":true}")
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nX-Answer: yes\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn parse(raw: &[u8]) -> Option<(Seen, usize)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let (method, target) = (first.next()?.to_owned(), first.next()?.to_owned());
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        headers
            .entry(name.trim().to_ascii_lowercase())
            .or_default()
            .push(value.trim().to_owned());
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|values| values.first())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0);
    let body_start = end + 4;
    if raw.len() < body_start + length {
        return None;
    }
    let body = raw[body_start..body_start + length].to_vec();
    Some((
        Seen {
            method,
            target,
            headers,
            body,
        },
        body_start + length,
    ))
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let record = Arc::clone(&record);
                tokio::spawn(async move {
                    let mut raw = Vec::new();
                    let mut buffer = [0u8; 16 * 1024];
                    let read = tokio::time::timeout(Duration::from_secs(20), async {
                        loop {
                            let n = stream.read(&mut buffer).await.ok()?;
                            if n == 0 {
                                return None;
                            }
                            raw.extend_from_slice(&buffer[..n]);
                            if let Some((seen, _)) = parse(&raw) {
                                return Some(seen);
                            }
                        }
                    })
                    .await;
                    if let Ok(Some(seen)) = read {
                        let reply = answer(&seen.target);
                        record.lock().expect("record").push(seen);
                        let _ = stream.write_all(&reply).await;
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        Recorder { addr, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().expect("record"))
    }
}

/// The headers compared: all but those each client spells its own way (its user agent, unless
/// the command line sets one; the key, which only `idemcurl` sends; a form's boundary and hence
/// its length).
fn comparable(seen: &Seen, user_agent_set: bool) -> BTreeMap<String, Vec<String>> {
    let multipart = seen
        .headers
        .get("content-type")
        .is_some_and(|values| values.iter().any(|v| v.starts_with("multipart/form-data")));
    seen.headers
        .iter()
        .filter(|(name, _)| {
            !(name.as_str() == "idempotency-key"
                || (name.as_str() == "user-agent" && !user_agent_set)
                || (name.as_str() == "content-length" && multipart))
        })
        .map(|(name, values)| {
            let values = values
                .iter()
                .map(|value| match value.split_once("; boundary=") {
                    Some((kind, _)) if name == "content-type" => kind.to_owned(),
                    _ => value.clone(),
                })
                .collect();
            (name.clone(), values)
        })
        .collect()
}

/// A multipart body's parts: each part's headers and content, in order.
fn parts(seen: &Seen) -> Vec<(Vec<String>, Vec<u8>)> {
    let boundary = seen
        .headers
        .get("content-type")
        .and_then(|values| values.first())
        .and_then(|value| value.split_once("boundary="))
        .map(|(_, boundary)| format!("--{}", boundary.trim_matches('"')))
        .expect("a boundary");
    let body = &seen.body;
    let mut found = Vec::new();
    let mut starts = Vec::new();
    let mut at = 0;
    while let Some(offset) = body[at..]
        .windows(boundary.len())
        .position(|w| w == boundary.as_bytes())
    {
        starts.push(at + offset);
        at += offset + boundary.len();
    }
    for pair in starts.windows(2) {
        let part = &body[pair[0] + boundary.len() + 2..pair[1] - 2];
        let split = part
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a part head");
        let mut head: Vec<String> = std::str::from_utf8(&part[..split])
            .expect("ascii head")
            .split("\r\n")
            .map(str::to_ascii_lowercase)
            .collect();
        head.sort();
        found.push((head, part[split + 4..].to_vec()));
    }
    found
}

fn curl_present() -> bool {
    let present = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success());
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "curl must be installed in CI (.ci/run installs it)"
        );
        eprintln!("skipped: curl is not installed");
    }
    present
}

/// Runs `args` through curl and through `idemcurl --no-ledger`, with `stdin` on both, from
/// `dir`.
async fn both(dir: &Path, args: &[String], stdin: Option<&[u8]>) -> (Ran, Ran) {
    let mut outcomes = Vec::new();
    for curl in [true, false] {
        let mut command = if curl {
            let mut command = tokio::process::Command::new("curl");
            command
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            command
        } else {
            let mut command = idemcurl(dir);
            command.args(["--no-ledger", "--retry", "0"]);
            command
        };
        command.current_dir(dir).args(args);
        let ran = match stdin {
            Some(bytes) => {
                command.stdin(std::process::Stdio::piped());
                let mut child = command.spawn().expect("starts");
                let mut pipe = child.stdin.take().expect("stdin");
                pipe.write_all(bytes).await.expect("stdin written");
                drop(pipe);
                crate::support::finish(child).await
            }
            None => run(command).await,
        };
        outcomes.push(ran);
    }
    let ours = outcomes.pop().expect("ours");
    let theirs = outcomes.pop().expect("curl's");
    (theirs, ours)
}

/// A case's name, its arguments (before `-s URL`) and what stdin holds.
type Case<'a> = (&'a str, Vec<&'a str>, Option<&'a [u8]>);

#[tokio::test]
async fn the_server_sees_the_same_request_from_curl_and_from_idemcurl() {
    if !curl_present() {
        return;
    }
    let server = Recorder::start().await;
    let scratch = Scratch::new();
    std::fs::write(scratch.path("lines.txt"), "l1\nl2\r\n").expect("write");
    std::fs::write(scratch.path("charge.json"), r#"{"amount": 1200}"#).expect("write");
    std::fs::write(scratch.path("evidence.pdf"), b"%PDF-1.4 \x00\x01\xff").expect("write");
    let url = server.url("/v1/items?a=1&b=two");
    let cases: Vec<Case<'_>> = vec![
        ("get", vec![], None),
        ("data joined with &", vec!["-d", "a=1", "-d", "b=2"], None),
        ("--data-ascii", vec!["--data-ascii", "x=1"], None),
        ("-d @file strips newlines", vec!["-d", "@lines.txt"], None),
        (
            "--data-binary @file",
            vec!["--data-binary", "@lines.txt"],
            None,
        ),
        (
            "--data-raw keeps @",
            vec!["--data-raw", "@lines.txt", "-d", "y"],
            None,
        ),
        ("-d @- reads stdin", vec!["-d", "@-"], Some(b"from\nstdin")),
        (
            "--data-binary @-",
            vec!["--data-binary", "@-"],
            Some(b"raw\r\nstdin"),
        ),
        (
            "--json twice",
            vec!["--json", r#"{"a":1}"#, "--json", r#"{"b":2}"#],
            None,
        ),
        ("--json @file", vec!["--json", "@charge.json"], None),
        (
            "-d then --json",
            vec!["-d", "x", "--json", r#"{"y":1}"#],
            None,
        ),
        ("-X PUT -d", vec!["-X", "PUT", "-d", "q=1"], None),
        ("-XPATCH --json", vec!["-XPATCH", "--json", "{}"], None),
        ("-X DELETE", vec!["-X", "DELETE"], None),
        (
            "-H set, empty, override",
            vec![
                "-H",
                "X-Trace: abc",
                "-H",
                "X-Empty;",
                "-H",
                "User-Agent: agent/1",
                "-H",
                "Content-Type: text/plain",
                "-H",
                "Accept: text/csv",
                "-d",
                "x",
            ],
            None,
        ),
        (
            "-H removes the user agent",
            vec!["-H", "User-Agent:", "-d", "x"],
            None,
        ),
        ("-u", vec!["-u", "ada:pa:ss"], None),
        (
            "--user with data",
            vec!["--user", "ada:secret", "--data", "a=1"],
            None,
        ),
        (
            "-F parts",
            vec![
                "-F",
                "a=1",
                "-F",
                "f=@evidence.pdf",
                "-F",
                "g=<lines.txt",
                "-F",
                "h=v;type=text/x",
                "-F",
                "i=@lines.txt;filename=n.bin",
            ],
            None,
        ),
        ("-F with -X PUT", vec!["-X", "PUT", "--form", "a=b"], None),
    ];
    for (name, args, stdin) in cases {
        let mut line: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
        line.extend(["-s".to_owned(), url.clone()]);
        let (theirs, ours) = both(scratch.dir.path(), &line, stdin).await;
        let seen = server.take();
        assert_eq!(seen.len(), 2, "{name}: one request each: {seen:?}");
        assert_eq!(
            (theirs.code, ours.code),
            (0, 0),
            "{name}: {theirs:?} {ours:?}"
        );
        let (curl, idem) = (&seen[0], &seen[1]);
        assert_eq!(curl.method, idem.method, "{name}: method");
        assert_eq!(curl.target, idem.target, "{name}: target");
        let user_agent_set = args.iter().any(|arg| arg.starts_with("User-Agent"));
        assert_eq!(
            comparable(curl, user_agent_set),
            comparable(idem, user_agent_set),
            "{name}: headers"
        );
        if args.iter().any(|arg| *arg == "-F" || *arg == "--form") {
            assert_eq!(parts(curl), parts(idem), "{name}: form parts");
        } else {
            assert_eq!(curl.body, idem.body, "{name}: body bytes");
        }
        assert_eq!(theirs.stdout, ours.stdout, "{name}: stdout");
        // A key on every method that is not idempotent, and only there.
        assert_eq!(
            idem.headers.contains_key("idempotency-key"),
            !matches!(idem.method.as_str(), "GET" | "PUT" | "DELETE"),
            "{name}: the key"
        );
    }
}

#[tokio::test]
async fn output_flags_write_what_curl_writes() {
    if !curl_present() {
        return;
    }
    let server = Recorder::start().await;
    let scratch = Scratch::new();
    let ok = server.url("/v1/items");
    let missing = server.url("/status/404");
    // Each case: the arguments, and the files it writes (compared too).
    let cases: Vec<(&str, Vec<String>, Vec<&str>)> = vec![
        (
            "-o",
            vec!["-o".into(), "out.body".into(), ok.clone()],
            vec!["out.body"],
        ),
        (
            "-w http_code",
            vec!["-w".into(), "%{http_code}\\n".into(), ok.clone()],
            vec![],
        ),
        (
            "-w on 404",
            vec!["-w".into(), "[%{response_code}]".into(), missing.clone()],
            vec![],
        ),
        ("-f on 404", vec!["-f".into(), missing.clone()], vec![]),
        (
            "--fail-with-body on 404",
            vec!["--fail-with-body".into(), missing.clone()],
            vec![],
        ),
        ("404 without -f", vec![missing.clone()], vec![]),
        (
            "-D file",
            vec!["-D".into(), "head.txt".into(), ok.clone()],
            vec!["head.txt"],
        ),
        ("-i", vec!["-i".into(), ok.clone()], vec![]),
        (
            "-L follows a 302",
            vec!["-L".into(), server.url("/redirect")],
            vec![],
        ),
        (
            "no -L: the 302 itself",
            vec![server.url("/redirect")],
            vec![],
        ),
        (
            "-L POST 303 becomes GET",
            vec![
                "-L".into(),
                "-d".into(),
                "a=1".into(),
                server.url("/see-other"),
            ],
            vec![],
        ),
        (
            "-w num_redirects",
            vec![
                "-L".into(),
                "-w".into(),
                " %{num_redirects}".into(),
                server.url("/redirect"),
            ],
            vec![],
        ),
    ];
    for (name, args, files) in cases {
        let mut line = vec!["-s".to_owned()];
        line.extend(args);
        let (theirs, ours) = both(scratch.dir.path(), &line, None).await;
        let seen = server.take();
        let half = seen.len() / 2;
        assert_eq!(seen.len() % 2, 0, "{name}: {seen:?}");
        for (curl, idem) in seen[..half].iter().zip(&seen[half..]) {
            assert_eq!(
                (&curl.method, &curl.target),
                (&idem.method, &idem.target),
                "{name}"
            );
        }
        assert_eq!(
            theirs.code, ours.code,
            "{name}: exit status: {theirs:?} {ours:?}"
        );
        let normalize = |bytes: &[u8]| {
            // Header names' case is each server library's: compare the head case-blind.
            String::from_utf8_lossy(bytes).to_ascii_lowercase()
        };
        if name == "-i" {
            let lines = |bytes: &[u8]| {
                let mut lines: Vec<String> =
                    normalize(bytes).split("\r\n").map(str::to_owned).collect();
                lines.sort();
                lines
            };
            assert_eq!(lines(&theirs.stdout), lines(&ours.stdout), "{name}");
        } else {
            assert_eq!(theirs.stdout_text(), ours.stdout_text(), "{name}: stdout");
        }
        for file in files {
            let read = |bytes: Vec<u8>| {
                let mut lines: Vec<String> =
                    normalize(&bytes).split("\r\n").map(str::to_owned).collect();
                lines.sort();
                lines
            };
            // curl writes the file first; idemcurl then writes over it: compare curl's copy.
            let ours_bytes = std::fs::read(scratch.path(file)).expect("idemcurl wrote it");
            let mut again = vec!["-s".to_owned()];
            again.extend(line[1..].iter().cloned());
            let curl_only = tokio::process::Command::new("curl")
                .current_dir(scratch.dir.path())
                .args(&again)
                .output()
                .await
                .expect("curl runs");
            assert!(curl_only.status.success(), "{name}");
            server.take();
            let theirs_bytes = std::fs::read(scratch.path(file)).expect("curl wrote it");
            assert_eq!(read(theirs_bytes), read(ours_bytes), "{name}: {file}");
        }
    }
}

#[tokio::test]
async fn retry_n_is_n_retries_after_the_first_attempt_as_in_curl() {
    if !curl_present() {
        return;
    }
    let server = Recorder::start().await;
    let scratch = Scratch::new();
    let line = vec![
        "-s".to_owned(),
        "--retry".to_owned(),
        "1".to_owned(),
        server.url("/status/503"),
    ];
    let mut curl = tokio::process::Command::new("curl");
    curl.args(&line).kill_on_drop(true);
    curl.stdout(std::process::Stdio::piped());
    let theirs = run(curl).await;
    let curl_attempts = server.take().len();
    let mut ours = idemcurl(scratch.dir.path());
    ours.args(["--no-ledger"]).args(&line);
    let ours = run(ours).await;
    let our_attempts = server.take().len();
    assert_eq!((curl_attempts, our_attempts), (2, 2), "{theirs:?} {ours:?}");
    // curl calls the last 503 a success (exit 0); idemcurl says it may have run.
    assert_eq!((theirs.code, ours.code), (0, 76), "{ours:?}");
    // curl writes every attempt's body to stdout, one after the other; idemcurl the last.
    assert_eq!(theirs.stdout, b"statusstatus");
    assert_eq!(ours.stdout, b"status");
}
