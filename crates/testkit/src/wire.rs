//! Just enough HTTP/1.1 for a loopback test server, plus the ways a connection can go wrong.
//!
//! Public only for the test servers of the idempotent-retry workspace: not covered by semver.
//!
//! Hand-written on purpose: a production server (hyper) hides exactly the behaviours a fault
//! harness must produce on demand (a reset with `SO_LINGER` 0 after the request was read, a clean
//! close without an answer, a stall that notices the client hanging up). One request per
//! connection; every answer carries `Content-Length` and `Connection: close`.

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use socket2::SockRef;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Limits that keep a misbehaving client from growing memory without bound.
const MAX_HEAD: usize = 64 * 1024;
const MAX_CHUNK_LINE: usize = 4 * 1024;
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a closing connection waits for the client's FIN before dropping the socket.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Accepts connections for as long as the task runs, serving each with `serve` on its own
/// task; finished connections are reaped as they end, so a long run does not pile them up.
pub async fn accept_loop<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream));
                }
                // For example out of file descriptors: pause and keep serving.
                Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// A request as read off the wire.
#[derive(Debug)]
pub struct Incoming {
    pub method: String,
    /// The request target as sent (origin form).
    pub path: String,
    /// Names lowercased, values trimmed, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The complete body (chunked bodies decoded).
    pub body: Vec<u8>,
}

/// The first value of header `name` (case-insensitive).
pub fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Reads one request completely: request line, headers up to the empty line, then the body
/// (chunked, `Content-Length` bytes, or none). Answers `Expect: 100-continue`.
pub async fn read_request(reader: &mut BufReader<TcpStream>) -> io::Result<Incoming> {
    let mut budget = MAX_HEAD;
    // RFC 9112 2.2: ignore empty lines before the request line.
    let request_line = loop {
        let line = read_line(reader, &mut budget).await?;
        if !line.is_empty() {
            break line;
        }
    };
    let request_line = String::from_utf8(request_line).map_err(|_| invalid("request line"))?;
    let mut parts = request_line.split(' ').filter(|p| !p.is_empty());
    let (Some(method), Some(path), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(invalid("HTTP version"));
    }

    let mut headers = Vec::new();
    loop {
        let line = read_line(reader, &mut budget).await?;
        if line.is_empty() {
            break;
        }
        let line = String::from_utf8_lossy(&line);
        let (name, value) = line.split_once(':').ok_or_else(|| invalid("header line"))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }

    let expects_continue =
        find_header(&headers, "expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        reader
            .get_mut()
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await?;
    }

    let chunked = headers.iter().any(|(n, v)| {
        n == "transfer-encoding"
            && v.rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
    });
    let body = if chunked {
        read_chunked(reader).await?
    } else if let Some(len) = find_header(&headers, "content-length") {
        let len: usize = len.parse().map_err(|_| invalid("content-length"))?;
        if len > MAX_BODY {
            return Err(invalid("body too large"));
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).await?;
        body
    } else {
        Vec::new()
    };

    Ok(Incoming {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body,
    })
}

/// Decodes a chunked body: `size[;ext] CRLF data CRLF` ... `0 CRLF [trailers] CRLF`.
async fn read_chunked(reader: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut budget = MAX_CHUNK_LINE;
        let line = read_line(reader, &mut budget).await?;
        let line = String::from_utf8(line).map_err(|_| invalid("chunk size"))?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| invalid("chunk size"))?;
        if size == 0 {
            // Trailers (ignored) up to the empty line.
            let mut budget = MAX_HEAD;
            while !read_line(reader, &mut budget).await?.is_empty() {}
            return Ok(body);
        }
        if size > MAX_BODY - body.len() {
            return Err(invalid("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..]).await?;
        let mut budget = MAX_CHUNK_LINE;
        if !read_line(reader, &mut budget).await?.is_empty() {
            return Err(invalid("chunk terminator"));
        }
    }
}

/// Reads one line (up to LF; the CRLF or LF is stripped), charging its length to `budget`.
async fn read_line(reader: &mut BufReader<TcpStream>, budget: &mut usize) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let (take, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (available.len(), false),
        };
        if take > *budget {
            return Err(invalid("line too long"));
        }
        *budget -= take;
        line.extend_from_slice(&available[..take]);
        reader.consume(take);
        if done {
            break;
        }
    }
    line.pop(); // the LF
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(line)
}

/// Waits `delay` unless the client hangs up first; `true` when the full delay passed.
pub async fn stall(stream: &mut TcpStream, delay: Duration) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    let mut scratch = [0u8; 1024];
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            read = stream.read(&mut scratch) => match read {
                Ok(0) | Err(_) => return false,
                // Stray bytes from the client: ignore them.
                Ok(_) => {}
            },
        }
    }
}

/// A real TCP reset: `SO_LINGER` 0, then close the socket.
pub fn reset(stream: TcpStream) {
    let _ = SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

/// A clean close: FIN, then wait (bounded) for the client's FIN so that no unread byte turns the
/// close into a reset.
pub async fn close(mut stream: TcpStream) {
    let _ = stream.flush().await;
    let _ = stream.shutdown().await;
    let mut scratch = [0u8; 1024];
    let _ = tokio::time::timeout(DRAIN_LIMIT, async {
        loop {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
}

/// Writes an answer (`Content-Length` is `declared` or the body's length), then closes cleanly.
/// Framing headers in `headers` are ignored; `head_only` leaves the body out (a `HEAD` request).
/// The head and the body go out as two writes, as many servers send them (uvicorn, anything
/// that flushes its headers first), so a cut can land between them or inside the body.
pub async fn answer(
    stream: TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    declared: Option<usize>,
    head_only: bool,
) {
    let head = head(status, headers, declared.unwrap_or(body.len()));
    let body = if head_only { &[][..] } else { body };
    write_then_close(stream, &head, body).await;
}

/// Writes an answer's head (with the whole body's `Content-Length`) and then only the first
/// `keep` bytes of its body (never all of them), as two writes, then closes cleanly: the
/// answer is cut mid-body.
pub async fn answer_cut(
    stream: TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    keep: usize,
) {
    let declared = body.len().max(1);
    let head = head(status, headers, declared);
    write_then_close(stream, &head, &body[..keep.min(declared - 1)]).await;
}

/// An answer's head: the status line, `headers` without framing ones, and the framing.
fn head(status: u16, headers: &[(String, String)], length: usize) -> String {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let mut head = format!("HTTP/1.1 {status} {reason}\r\n");
    for (name, value) in headers {
        let framing = ["content-length", "connection", "transfer-encoding"]
            .iter()
            .any(|f| name.eq_ignore_ascii_case(f));
        if !framing {
            let _ = write!(head, "{name}: {value}\r\n");
        }
    }
    let _ = write!(
        head,
        "Content-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    head
}

/// `head`, flushed, then `body` (when not empty), then a clean close.
async fn write_then_close(mut stream: TcpStream, head: &str, body: &[u8]) {
    if stream.write_all(head.as_bytes()).await.is_err() || stream.flush().await.is_err() {
        return;
    }
    if !body.is_empty() && stream.write_all(body).await.is_err() {
        return;
    }
    close(stream).await;
}
