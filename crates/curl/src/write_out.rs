//! `-w/--write-out`: curl's format, with the variables `idemcurl` knows, checked before
//! anything is sent.

use std::time::Duration;

/// One variable of the format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variable {
    HttpCode,
    UrlEffective,
    SizeDownload,
    ContentType,
    NumRedirects,
    TimeTotal,
    ExitCode,
    Key,
    Attempts,
    Outcome,
    Replayed,
}

const VARIABLES: &[(&str, Variable)] = &[
    ("http_code", Variable::HttpCode),
    ("response_code", Variable::HttpCode),
    ("url_effective", Variable::UrlEffective),
    ("size_download", Variable::SizeDownload),
    ("content_type", Variable::ContentType),
    ("num_redirects", Variable::NumRedirects),
    ("time_total", Variable::TimeTotal),
    ("exitcode", Variable::ExitCode),
    ("idempotency_key", Variable::Key),
    ("attempts", Variable::Attempts),
    ("outcome", Variable::Outcome),
    ("replayed", Variable::Replayed),
];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Variable(Variable),
}

/// A parsed `--write-out` format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteOut(Vec<Piece>);

/// What the variables stand for, once the command is done.
#[derive(Debug, Clone, Default)]
pub(crate) struct Facts {
    pub(crate) status: Option<u16>,
    pub(crate) url: String,
    pub(crate) size: u64,
    pub(crate) content_type: Option<String>,
    pub(crate) redirects: usize,
    pub(crate) elapsed: Duration,
    pub(crate) exit: u8,
    pub(crate) key: Option<String>,
    pub(crate) attempts: u32,
    pub(crate) outcome: &'static str,
    pub(crate) replayed: bool,
}

impl WriteOut {
    /// Parses `format`: `%{name}`, `%%`, and the escapes `\n`, `\r`, `\t`, `\\`. An unknown
    /// variable is an error that names it and the known ones.
    pub(crate) fn parse(format: &str) -> Result<WriteOut, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut chars = format.chars().peekable();
        while let Some(c) = chars.next() {
            match (c, chars.peek().copied()) {
                ('%', Some('%')) => {
                    chars.next();
                    text.push('%');
                }
                ('%', Some('{')) => {
                    chars.next();
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => {
                                return Err(format!("--write-out: %{{{name} has no closing brace"));
                            }
                        }
                    }
                    let Some((_, variable)) = VARIABLES.iter().find(|(known, _)| *known == name)
                    else {
                        let known: Vec<&str> = VARIABLES.iter().map(|(name, _)| *name).collect();
                        return Err(format!(
                            "--write-out: idemcurl does not know %{{{name}}}; it knows {}",
                            known.join(", ")
                        ));
                    };
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(Piece::Variable(*variable));
                }
                ('\\', Some(next @ ('n' | 'r' | 't' | '\\'))) => {
                    chars.next();
                    text.push(match next {
                        'n' => '\n',
                        'r' => '\r',
                        't' => '\t',
                        _ => '\\',
                    });
                }
                (c, _) => text.push(c),
            }
        }
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(WriteOut(pieces))
    }

    /// The format with the facts in place.
    pub(crate) fn render(&self, facts: &Facts) -> String {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Variable(variable) => out.push_str(&value(*variable, facts)),
            }
        }
        out
    }
}

fn value(variable: Variable, facts: &Facts) -> String {
    match variable {
        Variable::HttpCode => format!("{:03}", facts.status.unwrap_or(0)),
        Variable::UrlEffective => facts.url.clone(),
        Variable::SizeDownload => facts.size.to_string(),
        Variable::ContentType => facts.content_type.clone().unwrap_or_default(),
        Variable::NumRedirects => facts.redirects.to_string(),
        Variable::TimeTotal => format!("{:.6}", facts.elapsed.as_secs_f64()),
        Variable::ExitCode => facts.exit.to_string(),
        Variable::Key => facts.key.clone().unwrap_or_default(),
        Variable::Attempts => facts.attempts.to_string(),
        Variable::Outcome => facts.outcome.to_owned(),
        Variable::Replayed => facts.replayed.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_escapes_and_percent_render_as_curl_writes_them() {
        let format =
            WriteOut::parse("%{http_code} %% %{idempotency_key}\\n\\t%{replayed}%{size_download}")
                .expect("parses");
        let facts = Facts {
            status: Some(201),
            key: Some("k".into()),
            replayed: true,
            size: 12,
            ..Facts::default()
        };
        assert_eq!(format.render(&facts), "201 % k\n\ttrue12");
        let none = WriteOut::parse("%{http_code}").expect("parses");
        assert_eq!(none.render(&Facts::default()), "000");
    }

    #[test]
    fn an_unknown_variable_is_refused_by_name() {
        let err = WriteOut::parse("%{time_connect}").expect_err("unknown");
        assert!(
            err.contains("%{time_connect}") && err.contains("http_code"),
            "{err}"
        );
        let err = WriteOut::parse("%{http_code").expect_err("open");
        assert!(err.contains("closing brace"), "{err}");
    }
}
