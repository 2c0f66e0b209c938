//! The request's body and headers as curl builds them from `-d`, `--data-*`, `--json`, `-F`
//! and `-H`: every file and stdin read before anything is sent, so every attempt sends the
//! same bytes.

use std::io::Read as _;
use std::path::Path;

use http::{HeaderName, HeaderValue};

use crate::args::{Data, DataKind};

/// The body, in memory.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    None,
    /// Data flags' bytes; `json` when one of them was `--json`.
    Bytes {
        bytes: Vec<u8>,
        json: bool,
    },
    /// `-F` parts, in order.
    Form(Vec<FormPart>),
}

/// One `-F` part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FormPart {
    pub(crate) name: String,
    pub(crate) content: Vec<u8>,
    pub(crate) file_name: Option<String>,
    pub(crate) content_type: Option<String>,
}

/// What one `-H` line asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderLine {
    /// Send this header.
    Set(HeaderName, HeaderValue),
    /// `Name:`: do not send this header (a default one, such as `Accept`).
    Remove(HeaderName),
}

/// Reads stdin at most once, for `@-`.
#[derive(Debug, Default)]
pub(crate) struct Stdin {
    read: Option<Vec<u8>>,
}

impl Stdin {
    fn bytes(&mut self) -> Result<Vec<u8>, String> {
        if let Some(read) = &self.read {
            return Ok(read.clone());
        }
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .map_err(|err| format!("cannot read stdin (@-): {err}"))?;
        self.read = Some(bytes.clone());
        Ok(bytes)
    }
}

fn read_file(path: &str, stdin: &mut Stdin, flag: &str) -> Result<Vec<u8>, String> {
    if path == "-" {
        return stdin.bytes();
    }
    std::fs::read(path).map_err(|err| format!("{flag} @{path}: cannot read the file: {err}"))
}

/// The body of the data flags, joined as curl joins them: `&` before each piece but a `--json`
/// one, which is appended as it is.
pub(crate) fn data(pieces: &[Data], stdin: &mut Stdin) -> Result<Payload, String> {
    if pieces.is_empty() {
        return Ok(Payload::None);
    }
    let mut bytes = Vec::new();
    let mut json = false;
    for (n, piece) in pieces.iter().enumerate() {
        let value = match (piece.kind, piece.value.strip_prefix('@')) {
            (DataKind::Raw, _) | (_, None) => piece.value.as_bytes().to_vec(),
            (DataKind::Ascii, Some(path)) => {
                let mut read = read_file(path, stdin, "--data")?;
                read.retain(|b| *b != b'\r' && *b != b'\n');
                read
            }
            (DataKind::Binary, Some(path)) => read_file(path, stdin, "--data-binary")?,
            (DataKind::Json, Some(path)) => read_file(path, stdin, "--json")?,
        };
        if piece.kind == DataKind::Json {
            json = true;
        } else if n > 0 {
            bytes.push(b'&');
        }
        bytes.extend_from_slice(&value);
    }
    Ok(Payload::Bytes { bytes, json })
}

/// The content type curl gives an uploaded file, from its name's extension.
fn guessed_type(file_name: &str) -> &'static str {
    let extension = file_name
        .rsplit_once('.')
        .map(|(_, ext)| ext.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "gif" => "image/gif",
        "jpg" | "jpeg" => "image/jpeg",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "txt" => "text/plain",
        "htm" | "html" => "text/html",
        "pdf" => "application/pdf",
        "xml" => "application/xml",
        _ => "application/octet-stream",
    }
}

/// One `-F name=value` part: `value`, `@file` (an upload: its name and a guessed type),
/// `<file` (its contents as the value); `;type=T` and `;filename=N` after it.
pub(crate) fn form_part(spec: &str, stdin: &mut Stdin) -> Result<FormPart, String> {
    let (name, rest) = spec
        .split_once('=')
        .ok_or_else(|| format!("-F {spec:?}: give name=value, name=@FILE or name=<FILE"))?;
    if name.is_empty() {
        return Err(format!("-F {spec:?}: the part needs a name before ="));
    }
    // `;type=` and `;filename=` end the value; any other `;` is part of it.
    let mut segments = rest.split(';');
    let mut value = segments.next().unwrap_or_default().to_owned();
    let mut content_type = None;
    let mut file_name = None;
    for segment in segments {
        if let Some(kind) = segment.strip_prefix("type=") {
            content_type = Some(kind.to_owned());
        } else if let Some(named) = segment.strip_prefix("filename=") {
            file_name = Some(named.to_owned());
        } else if segment.starts_with("headers=") || segment.starts_with("encoder=") {
            return Err(format!(
                "-F {spec:?}: ;{} is not supported by idemcurl",
                segment.split('=').next().unwrap_or_default()
            ));
        } else {
            value.push(';');
            value.push_str(segment);
        }
    }
    let content = if let Some(path) = value.strip_prefix('@') {
        let read = read_file(path, stdin, "-F")?;
        let own_name = Path::new(path)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.to_owned());
        // The type is guessed from the file's own name, as curl does, even under ;filename=.
        if content_type.is_none() {
            content_type = Some(guessed_type(&own_name).to_owned());
        }
        if file_name.is_none() && path != "-" {
            file_name = Some(own_name);
        }
        read
    } else if let Some(path) = value.strip_prefix('<') {
        read_file(path, stdin, "-F")?
    } else {
        value.into_bytes()
    };
    Ok(FormPart {
        name: name.to_owned(),
        content,
        file_name,
        content_type,
    })
}

/// The `-F` parts, in order.
pub(crate) fn form(specs: &[String], stdin: &mut Stdin) -> Result<Payload, String> {
    if specs.is_empty() {
        return Ok(Payload::None);
    }
    specs
        .iter()
        .map(|spec| form_part(spec, stdin))
        .collect::<Result<Vec<_>, _>>()
        .map(Payload::Form)
}

/// One `-H` line, as curl reads it.
pub(crate) fn header_line(line: &str) -> Result<HeaderLine, String> {
    if line.starts_with('@') {
        return Err(format!(
            "-H {line:?}: reading headers from a file is not supported by idemcurl; give each with -H"
        ));
    }
    let invalid_name =
        |name: &str| format!("-H {line:?}: {name:?} is not a header name (give \"Name: value\")");
    if let Some((name, value)) = line.split_once(':') {
        let name = HeaderName::try_from(name.trim()).map_err(|_| invalid_name(name))?;
        let value = value.trim();
        if value.is_empty() {
            return Ok(HeaderLine::Remove(name));
        }
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("-H {line:?}: the value has a character a header cannot carry"))?;
        return Ok(HeaderLine::Set(name, value));
    }
    if let Some(name) = line.strip_suffix(';') {
        let name = HeaderName::try_from(name.trim()).map_err(|_| invalid_name(name))?;
        return Ok(HeaderLine::Set(name, HeaderValue::from_static("")));
    }
    Err(format!(
        "-H {line:?}: give \"Name: value\" (\"Name:\" removes a default header, \"Name;\" sends it empty)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(kind: DataKind, value: &str) -> Data {
        Data {
            kind,
            value: value.to_owned(),
        }
    }

    #[test]
    fn data_pieces_join_as_curl_joins_them() {
        let mut stdin = Stdin::default();
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("f.txt");
        std::fs::write(&file, "l1\nl2\r\n").expect("write");
        let at = format!("@{}", file.display());
        let joined = |pieces: &[Data]| match data(pieces, &mut Stdin::default()) {
            Ok(Payload::Bytes { bytes, json }) => (String::from_utf8(bytes).expect("utf-8"), json),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            joined(&[piece(DataKind::Ascii, "a"), piece(DataKind::Ascii, "b")]),
            ("a&b".into(), false)
        );
        assert_eq!(
            joined(&[
                piece(DataKind::Json, "{\"a\":1}"),
                piece(DataKind::Json, "{\"b\":2}")
            ]),
            ("{\"a\":1}{\"b\":2}".into(), true)
        );
        assert_eq!(
            joined(&[piece(DataKind::Ascii, &at)]),
            ("l1l2".into(), false)
        );
        assert_eq!(
            joined(&[piece(DataKind::Binary, &at)]),
            ("l1\nl2\r\n".into(), false)
        );
        assert_eq!(
            joined(&[piece(DataKind::Ascii, "x"), piece(DataKind::Raw, "@z")]),
            ("x&@z".into(), false)
        );
        assert!(matches!(data(&[], &mut stdin), Ok(Payload::None)));
        let missing = data(&[piece(DataKind::Binary, "@/no/such/file")], &mut stdin)
            .expect_err("missing file");
        assert!(
            missing.contains("/no/such/file") && missing.contains("cannot read"),
            "{missing}"
        );
    }

    #[test]
    fn form_parts_read_files_names_and_types_as_curl() {
        let mut stdin = Stdin::default();
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("evidence.pdf");
        std::fs::write(&file, b"%PDF").expect("write");
        let upload = form_part(&format!("f=@{}", file.display()), &mut stdin).expect("upload");
        assert_eq!(upload.file_name.as_deref(), Some("evidence.pdf"));
        assert_eq!(upload.content_type.as_deref(), Some("application/pdf"));
        assert_eq!(upload.content, b"%PDF");
        let text = form_part(&format!("g=<{}", file.display()), &mut stdin).expect("text");
        assert_eq!((text.file_name, text.content_type), (None, None));
        let typed = form_part("h=v;type=text/x;filename=n.bin", &mut stdin).expect("typed");
        assert_eq!(typed.content, b"v");
        assert_eq!(typed.content_type.as_deref(), Some("text/x"));
        assert_eq!(typed.file_name.as_deref(), Some("n.bin"));
        let semicolon = form_part("q=a;b", &mut stdin).expect("value with ;");
        assert_eq!(semicolon.content, b"a;b");
        assert!(form_part("novalue", &mut stdin).is_err());
        assert!(form_part("=v", &mut stdin).is_err());
    }

    #[test]
    fn header_lines_set_remove_or_send_empty() {
        assert_eq!(
            header_line("X-A:  1 ").expect("set"),
            HeaderLine::Set(
                HeaderName::from_static("x-a"),
                HeaderValue::from_static("1")
            )
        );
        assert_eq!(
            header_line("Accept:").expect("remove"),
            HeaderLine::Remove(HeaderName::from_static("accept"))
        );
        assert_eq!(
            header_line("X-E;").expect("empty"),
            HeaderLine::Set(HeaderName::from_static("x-e"), HeaderValue::from_static(""))
        );
        for bad in ["novalue", "Bad Name: v", "@headers.txt"] {
            assert!(header_line(bad).is_err(), "{bad}");
        }
    }
}
