//! Where the answer goes: the body to stdout or `-o`, the head with `-i` and `-D`, as curl
//! writes them.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A destination: stdout, or a file opened before anything is sent (so a path that cannot be
/// written is found out first) and emptied only when the answer is written to it.
#[derive(Debug)]
pub(crate) enum Destination {
    Stdout,
    File {
        path: PathBuf,
        file: File,
        emptied: bool,
    },
}

impl Destination {
    /// Opens `path` (`-` or none: stdout) for writing, without emptying it yet.
    pub(crate) fn open(path: Option<&Path>, flag: &str) -> Result<Destination, String> {
        match path {
            None => Ok(Destination::Stdout),
            Some(path) if path.as_os_str() == "-" => Ok(Destination::Stdout),
            Some(path) => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map(|file| Destination::File {
                    path: path.to_owned(),
                    // Only a regular file is emptied: `/dev/null` or a pipe has nothing to empty.
                    emptied: !file.metadata().is_ok_and(|meta| meta.is_file()),
                    file,
                })
                .map_err(|err| format!("{flag} {}: cannot write the file: {err}", path.display())),
        }
    }

    /// Writes `bytes`, emptying the file on the first write.
    pub(crate) fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Destination::Stdout => io::stdout().lock().write_all(bytes),
            Destination::File { file, emptied, .. } => {
                if !*emptied {
                    file.set_len(0)?;
                    *emptied = true;
                }
                file.write_all(bytes)
            }
        }
    }

    /// Empties a file that nothing was written to (curl leaves an empty `-o` file for an
    /// empty answer).
    pub(crate) fn finish(&mut self) -> io::Result<()> {
        match self {
            Destination::Stdout => io::stdout().lock().flush(),
            Destination::File {
                file,
                emptied,
                path,
                ..
            } => {
                if !*emptied {
                    file.set_len(0)?;
                    *emptied = true;
                }
                file.flush()
                    .map_err(|err| io::Error::new(err.kind(), format!("{}: {err}", path.display())))
            }
        }
    }
}

/// The status line and headers as curl's `-i` and `-D` write them, CRLF-terminated, with the
/// blank line after.
pub(crate) fn head(
    version: http::Version,
    status: http::StatusCode,
    headers: &http::HeaderMap,
) -> Vec<u8> {
    let version = match version {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    };
    let mut out = Vec::new();
    out.extend_from_slice(version.as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.as_str().as_bytes());
    if let Some(reason) = status.canonical_reason() {
        out.push(b' ');
        out.extend_from_slice(reason.as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_reads_as_curls() {
        let mut headers = http::HeaderMap::new();
        headers.insert("content-type", http::HeaderValue::from_static("text/plain"));
        let text = head(http::Version::HTTP_11, http::StatusCode::CREATED, &headers);
        assert_eq!(
            String::from_utf8(text).expect("ascii"),
            "HTTP/1.1 201 Created\r\ncontent-type: text/plain\r\n\r\n"
        );
    }

    #[test]
    fn a_file_is_emptied_only_when_the_answer_is_written() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("out");
        std::fs::write(&path, "earlier answer").expect("write");
        let destination = Destination::open(Some(&path), "-o").expect("opens");
        drop(destination);
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "earlier answer"
        );
        let mut destination = Destination::open(Some(&path), "-o").expect("opens");
        destination.write(b"new").expect("writes");
        destination.finish().expect("finishes");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        let err = Destination::open(Some(&dir.path().join("no/such/dir/out")), "-o")
            .expect_err("no directory");
        assert!(err.contains("cannot write the file"), "{err}");
    }
}
