//! `--cacert` against a TLS server whose certificate only that file vouches for, through curl
//! and through `idemcurl`. Needs `openssl` and `python3` (`.ci/run` has both); skipped without
//! them, except under `CI`.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::{Scratch, idemcurl, run};

/// A one-file HTTPS server: answers every POST 201 with a JSON body.
const SERVER: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get('Content-Length', 0)); self.rfile.read(n)
        body = b'{"charged":true}'
        self.send_response(201); self.send_header('Content-Type', 'application/json')
        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args): pass
server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[1], sys.argv[2])
server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

fn tools_present() -> bool {
    let present = ["openssl", "python3", "curl"].iter().all(|tool| {
        std::process::Command::new(tool)
            .arg(if *tool == "openssl" {
                "version"
            } else {
                "--version"
            })
            .output()
            .is_ok_and(|output| output.status.success())
    });
    if !present {
        assert!(
            std::env::var_os("CI").is_none(),
            "openssl, python3 and curl must be installed in CI"
        );
        eprintln!("skipped: openssl, python3 or curl is not installed");
    }
    present
}

#[tokio::test]
async fn cacert_trusts_a_private_authority_as_curl_does() {
    if !tools_present() {
        return;
    }
    let scratch = Scratch::new();
    // A private authority and a server certificate it signed: what --cacert is for.
    let (ca, ca_key) = (scratch.path("ca.pem"), scratch.path("ca.key"));
    let (cert, key) = (scratch.path("server.pem"), scratch.path("server.key"));
    let (request, ext) = (scratch.path("server.csr"), scratch.path("server.ext"));
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write");
    let openssl = |args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new("openssl")
            .args(args)
            .stderr(Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    };
    let os = |text: &'static str| std::ffi::OsStr::new(text);
    openssl(&[
        os("req"),
        os("-x509"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-days"),
        os("1"),
        os("-subj"),
        os("/CN=test authority"),
        os("-keyout"),
        ca_key.as_os_str(),
        os("-out"),
        ca.as_os_str(),
    ]);
    openssl(&[
        os("req"),
        os("-newkey"),
        os("rsa:2048"),
        os("-nodes"),
        os("-subj"),
        os("/CN=localhost"),
        os("-keyout"),
        key.as_os_str(),
        os("-out"),
        request.as_os_str(),
    ]);
    openssl(&[
        os("x509"),
        os("-req"),
        os("-in"),
        request.as_os_str(),
        os("-CA"),
        ca.as_os_str(),
        os("-CAkey"),
        ca_key.as_os_str(),
        os("-CAcreateserial"),
        os("-days"),
        os("1"),
        os("-extfile"),
        ext.as_os_str(),
        os("-out"),
        cert.as_os_str(),
    ]);
    let mut server = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(SERVER)
        .arg(&cert)
        .arg(&key)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the server starts");
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    let port = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the server says its port in time")
        .expect("a line")
        .expect("a port");
    let url = format!("https://127.0.0.1:{port}/v1/charges");

    let mut curl = tokio::process::Command::new("curl");
    curl.args(["-s", "--cacert"])
        .arg(&ca)
        .args(["-d", "a=1", &url]);
    curl.stdout(Stdio::piped()).kill_on_drop(true);
    let theirs = run(curl).await;
    let mut ours = idemcurl(scratch.dir.path());
    ours.args(["--no-ledger", "-s", "--cacert"])
        .arg(&ca)
        .args(["-d", "a=1", &url]);
    let ours = run(ours).await;
    assert_eq!((theirs.code, ours.code), (0, 0), "{theirs:?} {ours:?}");
    assert_eq!(theirs.stdout, ours.stdout);
    assert_eq!(ours.stdout_text(), r#"{"charged":true}"#);

    // Without it, the certificate is refused before anything is sent: not done.
    let mut refused = idemcurl(scratch.dir.path());
    refused.args([
        "--no-ledger",
        "--retry",
        "0",
        "--report",
        "json",
        "-d",
        "a=1",
        &url,
    ]);
    let refused = run(refused).await;
    assert_eq!(refused.code, 75, "{refused:?}");
    assert_eq!(refused.report()["outcome"], "not_done");
    let error = refused.report()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(error.contains("certificate"), "the cause is named: {error}");

    // A file with no certificate in it is a usage error that names it.
    std::fs::write(scratch.path("empty.pem"), "").expect("write");
    let mut empty = idemcurl(scratch.dir.path());
    empty
        .args(["--no-ledger", "--cacert"])
        .arg(scratch.path("empty.pem"))
        .arg(&url);
    let empty = run(empty).await;
    assert_eq!(empty.code, 2, "{empty:?}");
    assert!(empty.stderr.contains("empty.pem"), "{}", empty.stderr);
    let _ = server.kill().await;
}
