//! What the command prints: a row as text (a table line, or the whole record) and as JSON,
//! with times in RFC 3339 and ages as readable durations.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use idempotent_retry::ledger::{
    OperationRecord, OperationStatus, SavedResponse, looks_like_credential,
};
use serde_json::{Value, json};

/// RFC 3339, to the second when the time has no milliseconds, else to the millisecond.
pub(crate) fn time(at: SystemTime) -> String {
    let millis = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_millis());
    if millis == 0 {
        humantime::format_rfc3339_seconds(at).to_string()
    } else {
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// A duration to the second (`1h 2m 3s`), as a person reads it.
pub(crate) fn duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// How long ago `at` was, at `now` (`in the future` when after it).
fn ago(at: SystemTime, now: SystemTime) -> String {
    match now.duration_since(at) {
        Ok(since) => format!("{} ago", duration(since)),
        Err(_) => "in the future".to_owned(),
    }
}

/// One line per row under a header, each column as wide as its widest cell.
pub(crate) fn table(rows: &[OperationRecord], now: SystemTime) -> String {
    let header = [
        "KEY",
        "SCOPE",
        "STATUS",
        "ATTEMPTS",
        "FIRST ATTEMPT",
        "AGE",
        "RESOLUTION",
    ];
    let mut cells: Vec<[String; 7]> = vec![header.map(str::to_owned)];
    for row in rows {
        let age = now
            .duration_since(row.first_attempt_at)
            .map_or_else(|_| "-".to_owned(), duration);
        let resolution = row.resolution.as_ref().map_or_else(
            || "-".to_owned(),
            |note| format!("{} by {}", note.kind, note.by),
        );
        cells.push([
            row.key.clone(),
            row.scope.clone(),
            row.status.to_string(),
            row.attempts.to_string(),
            time(row.first_attempt_at),
            age,
            resolution,
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            cells
                .iter()
                .map(|line| line[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in &cells {
        let mut text = String::new();
        for (column, cell) in line.iter().enumerate() {
            if column + 1 == line.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[column]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// What a masked header value shows.
const MASKED: &str = "… (masked: --reveal prints it)";

/// A saved answer's headers, each value that looks like a credential's (see
/// `looks_like_credential`) replaced by `mask` unless `reveal`.
fn headers<'a>(
    saved: &'a SavedResponse,
    reveal: bool,
    mask: &'a str,
) -> impl Iterator<Item = (&'a str, &'a str)> {
    saved.headers.iter().map(move |(name, value)| {
        if reveal || !looks_like_credential(name) {
            (name.as_str(), value.as_str())
        } else {
            (name.as_str(), mask)
        }
    })
}

/// The whole record, one field a line; header values that look like credentials masked unless
/// `reveal`.
pub(crate) fn record(row: &OperationRecord, now: SystemTime, reveal: bool) -> String {
    let mut lines: Vec<(&str, String)> = vec![
        ("key", row.key.clone()),
        ("scope", row.scope.clone()),
        ("status", describe_status(row)),
        (
            "request",
            match (&row.method, &row.url) {
                (Some(method), Some(url)) => format!("{method} {url}"),
                // Rows written before schema version 2, or by a claim that did not say.
                _ => "not recorded".to_owned(),
            },
        ),
        ("fingerprint", row.fingerprint.clone()),
        (
            "attempts",
            // A run counts its first attempt when it finishes: while the row is in flight,
            // that attempt may be on the wire (or, after a crash, may have reached the
            // receiver) without being counted yet.
            if row.status == OperationStatus::InFlight {
                format!(
                    "{} recorded, and one more may be on the wire (counted when the run \
                     finishes, or by the run that takes the row over)",
                    row.attempts
                )
            } else {
                row.attempts.to_string()
            },
        ),
        (
            "first attempt",
            format!(
                "{} ({})",
                time(row.first_attempt_at),
                ago(row.first_attempt_at, now)
            ),
        ),
        (
            "last attempt",
            row.last_attempt_at.map_or_else(
                || "none recorded".to_owned(),
                |at| format!("{} ({})", time(at), ago(at, now)),
            ),
        ),
    ];
    lines.push((
        "lease",
        match (&row.lease_owner, row.lease_expires_at) {
            (Some(owner), Some(until)) if until > now => format!(
                "held by {owner} until {} ({} from now)",
                time(until),
                duration(until.duration_since(now).unwrap_or_default())
            ),
            (Some(owner), Some(until)) => {
                format!("held by {owner}, lapsed at {} (its run died)", time(until))
            }
            _ => "none".to_owned(),
        },
    ));
    lines.push((
        "response",
        row.response.as_ref().map_or_else(
            || "none".to_owned(),
            |saved| match &saved.body {
                Some(_) if saved.sealed_with.is_some() => format!(
                    "{}, sealed with key id {} (headers and body encrypted; the client's \
                     LedgerOptions::seal_keys open it)",
                    saved.status,
                    saved.sealed_with.as_deref().unwrap_or_default()
                ),
                Some(body) => format!("{}, {} bytes saved", saved.status, body.len()),
                None => match saved
                    .headers
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                {
                    Some((_, length)) => format!(
                        "{}, body of {length} bytes not saved (over the limit: the next run \
                         fetches it again with the key inside its window)",
                        saved.status
                    ),
                    None => format!(
                        "{}, body not saved (over the limit: the next run fetches it again \
                         with the key inside its window)",
                        saved.status
                    ),
                },
            },
        ),
    ));
    if let Some(answered) = row.response.as_ref().and_then(|saved| saved.url.as_deref()) {
        lines.push((
            "answered at",
            format!("{answered} (a redirect was followed)"),
        ));
    }
    if let Some(saved) = row
        .response
        .as_ref()
        .filter(|saved| !saved.headers.is_empty())
    {
        let lines_of: Vec<String> = headers(saved, reveal, MASKED)
            .map(|(name, value)| body_line(&format!("{name}: {value}")))
            .collect();
        lines.push(("headers", lines_of.join("\n")));
    }
    if let Some(body) = row
        .response
        .as_ref()
        .filter(|saved| saved.sealed_with.is_none())
        .and_then(|saved| saved.body.as_deref())
    {
        lines.push(("body", body_text(body)));
    }
    lines.push((
        "resolution",
        row.resolution.as_ref().map_or_else(
            || "none".to_owned(),
            |note| {
                let mut text = format!("{} by {} at {}", note.kind, note.by, time(note.at));
                if let Some(reason) = &note.reason {
                    let _ = write!(text, ": {reason}");
                }
                text
            },
        ),
    ));
    lines.push((
        "expires",
        format!(
            "{} ({})",
            time(row.expires_at),
            if row.expires_at <= now {
                "purgeable"
            } else {
                "kept until then"
            }
        ),
    ));
    let width = lines.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
    // A value of several lines continues under its first line.
    let continued = format!("\n{:width$} ", "");
    lines
        .iter()
        .map(|(name, value)| {
            format!(
                "{:<width$} {}\n",
                format!("{name}:"),
                value.replace('\n', &continued)
            )
        })
        .collect()
}

/// The lines of a UTF-8 body `show` prints; the rest is left to `--json`.
const BODY_LINES: usize = 20;
/// The characters of a body's line `show` prints.
const LINE_CHARS: usize = 200;
/// The bytes of a body that is not UTF-8 `show` prints in hex.
const HEX_BYTES: usize = 32;

/// A saved body as `show` prints it: a UTF-8 body as text, its first [`BODY_LINES`] lines
/// (control characters escaped, so a body cannot drive the terminal), any other as its size
/// and first bytes in hex.
fn body_text(body: &[u8]) -> String {
    if body.is_empty() {
        return "empty".to_owned();
    }
    let Ok(text) = std::str::from_utf8(body) else {
        let shown = &body[..body.len().min(HEX_BYTES)];
        let more = if shown.len() < body.len() { " …" } else { "" };
        return format!(
            "{} bytes, not UTF-8: {}{more} (--json for all)",
            body.len(),
            hex(shown, " ")
        );
    };
    let mut lines: Vec<String> = text.lines().take(BODY_LINES).map(body_line).collect();
    let rest = text.lines().count().saturating_sub(BODY_LINES);
    if rest > 0 {
        let s = if rest == 1 { "" } else { "s" };
        lines.push(format!("… {rest} more line{s}; --json for all"));
    }
    lines.join("\n")
}

/// One line of a body: control characters but tabs escaped, cut at [`LINE_CHARS`].
fn body_line(line: &str) -> String {
    let mut out = String::new();
    for (n, c) in line.chars().enumerate() {
        if n == LINE_CHARS {
            let rest = line.chars().count() - LINE_CHARS;
            let _ = write!(out, "… ({rest} more characters)");
            break;
        }
        if c.is_control() && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Bytes as lowercase hex pairs, `separator` between them.
fn hex(bytes: &[u8], separator: &str) -> String {
    let mut out = String::with_capacity(bytes.len() * (2 + separator.len()));
    for (n, byte) in bytes.iter().enumerate() {
        if n > 0 {
            out.push_str(separator);
        }
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn describe_status(row: &OperationRecord) -> String {
    use idempotent_retry::ledger::OperationStatus::*;
    let meaning = match row.status {
        Succeeded
            if row
                .response
                .as_ref()
                .is_some_and(|saved| saved.body.is_none()) =>
        {
            "done: its body was not kept, so the next run fetches it again with the key"
        }
        Succeeded => "done: replayed from the ledger",
        FailedFinal => "not done, or refused: the next run sends it again",
        Unknown => "outcome unknown: it may have run",
        InFlight => "a run holds it, or died holding it",
        NotSent => {
            "no attempt reached a receiver, or released by hand: the next request under the key is sent"
        }
        Queued => "queued in the caller's transaction: a dispatcher sends it when it is due",
        _ => "",
    };
    format!("{} ({meaning})", row.status)
}

/// The record as JSON, times in RFC 3339; header values that look like credentials masked
/// (`"…"`) unless `reveal`; a sealed answer's body left out, its key id given.
pub(crate) fn json(row: &OperationRecord, reveal: bool) -> Value {
    json!({
        "key": row.key,
        "scope": row.scope,
        "status": row.status.as_str(),
        "method": row.method,
        "url": row.url,
        "fingerprint": row.fingerprint,
        "attempts": row.attempts,
        "first_attempt_at": time(row.first_attempt_at),
        "last_attempt_at": row.last_attempt_at.map(time),
        "lease_owner": row.lease_owner,
        "lease_expires_at": row.lease_expires_at.map(time),
        "response": row.response.as_ref().map(|saved| {
            // A body that is not UTF-8 is given in hex, never altered to fit a JSON string.
            let body = saved.body.as_deref().filter(|_| saved.sealed_with.is_none());
            let text = body.and_then(|body| std::str::from_utf8(body).ok());
            let shown: Vec<(&str, &str)> = headers(saved, reveal, "…").collect();
            json!({
                "status": saved.status,
                "headers": shown,
                "body": text,
                "body_hex": body.filter(|_| text.is_none()).map(|body| hex(body, "")),
                "url": saved.url,
                "sealed_with": saved.sealed_with,
            })
        }),
        "resolution": row.resolution.as_ref().map(|note| json!({
            "kind": note.kind.as_str(),
            "by": note.by,
            "at": time(note.at),
            "reason": note.reason,
        })),
        "expires_at": time(row.expires_at),
    })
}

/// The keys a prefix matched, for a refusal: a line each, the first `shown` of them.
pub(crate) fn candidates(rows: &[OperationRecord], shown: usize) -> String {
    let width = rows
        .iter()
        .take(shown)
        .map(|row| row.key.chars().count())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for row in rows.iter().take(shown) {
        let _ = writeln!(
            out,
            "  {:<width$}  {:<12}  first attempted {}",
            row.key,
            row.status.as_str(),
            time(row.first_attempt_at)
        );
    }
    out
}

/// One request recorded under several keys.
#[derive(Debug)]
pub(crate) struct Duplicate<'a> {
    pub(crate) scope: &'a str,
    pub(crate) fingerprint: &'a str,
    pub(crate) rows: Vec<&'a OperationRecord>,
}

impl Duplicate<'_> {
    fn succeeded(&self) -> usize {
        self.rows
            .iter()
            .filter(|row| row.status == idempotent_retry::ledger::OperationStatus::Succeeded)
            .count()
    }
}

/// The groups of rows with the same scope and fingerprint and more than one key, in the
/// order of their first row.
pub(crate) fn duplicates(rows: &[OperationRecord]) -> Vec<Duplicate<'_>> {
    let mut groups: Vec<Duplicate<'_>> = Vec::new();
    for row in rows {
        match groups
            .iter_mut()
            .find(|group| group.scope == row.scope && group.fingerprint == row.fingerprint)
        {
            Some(group) => group.rows.push(row),
            None => groups.push(Duplicate {
                scope: &row.scope,
                fingerprint: &row.fingerprint,
                rows: vec![row],
            }),
        }
    }
    groups.retain(|group| group.rows.len() > 1);
    groups
}

/// The groups as text: a line per group, then its keys.
pub(crate) fn duplicates_text(groups: &[Duplicate<'_>]) -> String {
    if groups.is_empty() {
        return "no request is recorded under more than one key\n".to_owned();
    }
    let mut out = String::new();
    for group in groups {
        let warning = if group.succeeded() > 1 {
            " (succeeded more than once: charged twice?)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "scope {} fingerprint {}: {} keys, {} succeeded{warning}",
            group.scope,
            group.fingerprint,
            group.rows.len(),
            group.succeeded()
        );
        for row in &group.rows {
            let _ = writeln!(
                out,
                "  {}  {}  first attempted {}",
                row.key,
                row.status,
                time(row.first_attempt_at)
            );
        }
    }
    out
}

/// The groups as JSON.
pub(crate) fn duplicates_json(groups: &[Duplicate<'_>]) -> Value {
    Value::Array(
        groups
            .iter()
            .map(|group| {
                json!({
                    "scope": group.scope,
                    "fingerprint": group.fingerprint,
                    "succeeded": group.succeeded(),
                    "keys": group.rows.iter().map(|row| json!({
                        "key": row.key,
                        "status": row.status.as_str(),
                        "first_attempt_at": time(row.first_attempt_at),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
