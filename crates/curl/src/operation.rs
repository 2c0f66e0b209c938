//! One invocation: read everything it needs, choose the key, send through the library's
//! `Client` (its ledger, retries and redirect policy), write the answer out, and report.

use std::time::{Duration, SystemTime};

use http::{HeaderName, HeaderValue, Method};
use idempotent_retry::ledger::{LeaseHeldPolicy, LedgerOptions, OperationStatus};
use idempotent_retry::multipart::{Form, Part};
use idempotent_retry::redirect::RedirectChain;
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{
    Client, ErrorKind, IDEMPOTENCY_KEY, IdempotencyKey, RedirectPolicy, RetryPolicy, RetryReport,
};

use crate::args::{HttpErrors, Invocation};
use crate::exit::Exit;
use crate::key::{self, KeyChoice, KeyInputs, KeySource};
use crate::ledger;
use crate::output::{self, Destination};
use crate::payload::{self, HeaderLine, Payload, Stdin};
use crate::report::Report;
use crate::write_out::{Facts, WriteOut};

/// The longest wait for the leases of a cancelled operation to be given back.
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// The longest wait for the ledger to close before the process exits.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// The longest answer body read inside its attempt (a body cut midway is then a failed
/// attempt, retried with the same key) unless `--max-saved-body` is larger: then that, so that
/// every answer the ledger can replay whole was read whole before anything was written out.
const ANSWER_READ_LIMIT: usize = crate::args::DEFAULT_MAX_SAVED_BODY;

/// What the invocation sends, read and checked before anything goes out.
struct Prepared {
    method: Method,
    url: reqwest::Url,
    headers: Vec<(HeaderName, HeaderValue)>,
    removed: Vec<HeaderName>,
    /// The request's own key header: `Some(None)` when `-H "Name:"` removed it.
    key_header_value: Option<Option<String>>,
    key_header: HeaderName,
    payload: Payload,
    user: Option<(String, String)>,
    write_out: Option<WriteOut>,
    out: Destination,
    dump: Option<Destination>,
    http: reqwest::Client,
    policy: RetryPolicy,
    redirects: RedirectPolicy,
}

/// The URL without user name and password, for reports.
fn shown(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

fn prepare(invocation: &Invocation) -> Result<Prepared, String> {
    let text = if invocation.url.contains("://") {
        invocation.url.clone()
    } else {
        format!("http://{}", invocation.url)
    };
    let url = reqwest::Url::parse(&text)
        .map_err(|err| format!("{:?} is not a URL: {err}", invocation.url))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "{}: idemcurl speaks http and https only",
            shown(&url)
        ));
    }
    let mut stdin = Stdin::default();
    let payload = if invocation.form.is_empty() {
        payload::data(&invocation.data, &mut stdin)?
    } else {
        payload::form(&invocation.form, &mut stdin)?
    };
    let method = match &invocation.method {
        Some(method) => Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("-X {method:?} is not a method"))?,
        None if matches!(payload, Payload::None) => Method::GET,
        None => Method::POST,
    };
    let key_header = match &invocation.key_header {
        Some(name) => HeaderName::try_from(name.as_str())
            .map_err(|_| format!("--key-header {name:?} is not a header name"))?,
        None => IDEMPOTENCY_KEY,
    };
    let mut headers = Vec::new();
    let mut removed = Vec::new();
    let mut key_header_value = None;
    for line in &invocation.headers {
        match payload::header_line(line)? {
            HeaderLine::Set(name, value) if name == key_header => {
                let value = value
                    .to_str()
                    .map_err(|_| format!("-H {line:?}: a key must be visible ASCII"))?;
                key_header_value = Some(Some(value.to_owned()));
            }
            HeaderLine::Remove(name) if name == key_header => key_header_value = Some(None),
            HeaderLine::Remove(name)
                if name == http::header::HOST
                    || name == http::header::CONTENT_LENGTH
                    || name == http::header::ACCEPT =>
            {
                return Err(format!(
                    "-H {line:?}: idemcurl cannot send a request without {name}"
                ));
            }
            HeaderLine::Set(name, value) => headers.push((name, value)),
            HeaderLine::Remove(name) => removed.push(name),
        }
    }
    let user = invocation
        .user
        .as_ref()
        .map(|user| {
            user.split_once(':')
                .map(|(name, password)| (name.to_owned(), password.to_owned()))
                .ok_or_else(|| {
                    "-u: give user:password (idemcurl never prompts for a password)".to_owned()
                })
        })
        .transpose()?;
    let write_out = match &invocation.write_out {
        Some(format) => {
            let format = match format.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|err| format!("-w @{path}: cannot read the file: {err}"))?,
                None => format.clone(),
            };
            Some(WriteOut::parse(&format)?)
        }
        None => None,
    };
    let out = Destination::open(invocation.output.as_deref(), "-o")?;
    let dump = invocation
        .dump_header
        .as_deref()
        .map(|path| Destination::open(Some(path), "-D"))
        .transpose()?;
    let mut http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(limit) = invocation.connect_timeout {
        http = http.connect_timeout(limit);
    }
    if let Some(path) = &invocation.cacert {
        let pem = std::fs::read(path)
            .map_err(|err| format!("--cacert {}: cannot read the file: {err}", path.display()))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|err| format!("--cacert {}: not PEM certificates: {err}", path.display()))?;
        if certificates.is_empty() {
            return Err(format!(
                "--cacert {}: the file holds no PEM certificate",
                path.display()
            ));
        }
        for certificate in certificates {
            http = http.add_root_certificate(certificate);
        }
    }
    let http = http
        .build()
        .map_err(|err| format!("cannot set up the HTTP client: {err}"))?;
    let mut policy = RetryPolicy::default();
    if let Some(retries) = invocation.retry {
        policy = policy.with_max_attempts(retries.saturating_add(1));
    }
    if let Some(limit) = invocation.max_time {
        policy = policy.with_attempt_timeout(limit);
    }
    if let Some(window) = invocation.reconcile_window {
        policy = policy.with_reconcile_window(window);
    }
    policy = policy.with_max_in_progress_wait(invocation.in_progress_wait);
    policy.validate().map_err(|err| err.to_string())?;
    let redirects = if invocation.location {
        match invocation.max_redirs {
            Some(hops) => RedirectPolicy::limited(hops),
            None => RedirectPolicy::new(),
        }
    } else {
        RedirectPolicy::none()
    };
    Ok(Prepared {
        method,
        url,
        headers,
        removed,
        key_header_value,
        key_header,
        payload,
        user,
        write_out,
        out,
        dump,
        http,
        policy,
        redirects,
    })
}

/// Waits for SIGINT, SIGTERM or SIGHUP (Ctrl-C elsewhere); never, if they cannot be watched.
async fn cancelled() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let watch = |kind| signal(kind).ok();
        let (mut int, mut term, mut hup) = (
            watch(SignalKind::interrupt()),
            watch(SignalKind::terminate()),
            watch(SignalKind::hangup()),
        );
        let next = |signal: &mut Option<tokio::signal::unix::Signal>| {
            let signal = signal.take();
            async move {
                match signal {
                    Some(mut signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
        };
        tokio::select! {
            () = next(&mut int) => {}
            () = next(&mut term) => {}
            () = next(&mut hup) => {}
        }
    }
    #[cfg(not(unix))]
    {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs the invocation; the report says how it ended.
pub(crate) async fn run(invocation: Invocation) -> Report {
    let mut opened = None;
    let report = operate(&invocation, &mut opened).await;
    // The client is gone: close the ledger before the process exits.
    if let Some(opened) = opened {
        opened.close(CLOSE_WAIT).await;
    }
    let silent_ok = invocation.silent && matches!(report.exit, Exit::Done | Exit::HttpError);
    match invocation.report {
        crate::args::ReportFormat::Json => eprintln!("{}", report.json()),
        crate::args::ReportFormat::Text if !silent_ok => eprintln!("{}", report.text()),
        crate::args::ReportFormat::Text => {}
    }
    report
}

async fn operate(invocation: &Invocation, slot: &mut Option<ledger::Opened>) -> Report {
    let mut prepared = match prepare(invocation) {
        Ok(prepared) => prepared,
        Err(message) => return Report::usage(message),
    };
    let mut report = Report::usage(String::new());
    report.error = None;
    report.method = prepared.method.to_string();
    report.url = shown(&prepared.url);
    report.ledger = "none".to_owned();
    report.max_saved_body = invocation.max_saved_body;

    let keyed_method = IdempotencyKey::is_minted_for(&prepared.method);
    let identity =
        || key::request_identity(&prepared.method, prepared.url.as_str(), &prepared.payload);
    let choice = key::choose(&KeyInputs {
        arg: &invocation.key,
        scope: &invocation.scope,
        header: prepared
            .key_header_value
            .as_ref()
            .map(|value| value.as_deref()),
        keyed_method,
        run: key::run_identity(|name| std::env::var(name).ok()),
        request: &identity,
    });
    let choice = match choice {
        Ok(choice) => choice,
        Err(message) => {
            report.exit = Exit::Usage;
            report.error = Some(message);
            return report;
        }
    };
    report.key = choice.key.as_ref().map(|key| key.as_str().to_owned());
    report.key_source = choice.source;

    // A request without a key has nothing for a ledger to hold: none is opened.
    let wanted = if choice.key.is_some() {
        &invocation.ledger
    } else {
        &crate::args::LedgerArg::None
    };
    let opened = match ledger::open(wanted).await {
        Ok(opened) => opened,
        Err(message) => {
            report.exit = Exit::Ledger;
            report.error = Some(message);
            return report;
        }
    };
    let options = LedgerOptions::new()
        .max_body(invocation.max_saved_body)
        .fetch_unsaved_answers(invocation.refetch)
        .seal_keys(invocation.seal_keys.iter().cloned())
        .on_lease_held(match LeaseHeldPolicy::WAIT {
            LeaseHeldPolicy::Wait { poll, .. } => LeaseHeldPolicy::Wait {
                poll,
                max_wait: invocation.lease_wait,
            },
            other => other,
        })
        .worker(format!("idemcurl-{}", std::process::id()));
    let mut builder = Client::builder()
        .http(prepared.http.clone())
        .policy(prepared.policy)
        .key_header(prepared.key_header.clone())
        .redirects(prepared.redirects.clone())
        .answer_read_limit(invocation.max_saved_body.max(ANSWER_READ_LIMIT));
    if matches!(invocation.report, crate::args::ReportFormat::Text) && !invocation.silent {
        builder = builder.observer(WaitNotice::default());
    }
    if let Some(opened) = opened {
        report.ledger = opened.name();
        builder = opened.attach(builder).ledger_options(options);
        *slot = Some(opened);
    }
    let client = match builder.build() {
        Ok(client) => client,
        Err(err) => {
            report.exit = Exit::Usage;
            report.error = Some(err.to_string());
            return report;
        }
    };
    let request = match request(&client, &mut prepared, &choice, &invocation.scope) {
        Ok(request) => request,
        Err(message) => {
            report.exit = Exit::Usage;
            report.error = Some(message);
            return report;
        }
    };
    let clock = TokioClock::new();
    let started = clock.now();
    let mut send = Box::pin(request.send());
    let sent = tokio::select! {
        sent = &mut send => Some(sent),
        () = cancelled() => None,
    };
    let Some(sent) = sent else {
        drop(send);
        return cancel(&client, &choice, report, started.elapsed()).await;
    };
    match sent {
        Ok(response) => {
            report.status = Some(response.status().as_u16());
            if let Some(retry) = RetryReport::of(&response) {
                report.attempts = retry.attempts();
                report.elapsed = retry.elapsed();
                report.replayed = retry.is_replayed();
                report.lease_wait = retry.lease_wait();
                report.in_progress_waits = retry.in_progress_waits();
                report.in_progress_wait = retry.in_progress_wait();
                report.unrecorded = retry.unrecorded().map(str::to_owned);
            }
            let written = tokio::select! {
                report = answered(invocation, &mut prepared, response, report.clone(), true) => report,
                () = cancelled() => {
                    report.exit = Exit::Write;
                    report.error = Some(
                        "a signal stopped it while the answer was being written out".into(),
                    );
                    report
                }
            };
            written
        }
        Err(mut err) => {
            report.exit = match err.kind() {
                ErrorKind::Builder | ErrorKind::InvalidKey => Exit::Usage,
                ErrorKind::KeyReuse => Exit::KeyReused,
                ErrorKind::Ledger => Exit::Ledger,
                // Done: the ledger holds it as succeeded, without the answer's body.
                ErrorKind::AnswerNotSaved => Exit::AnswerNotSaved,
                _ if err.is_outcome_unknown() => Exit::Unknown,
                _ => Exit::NotDone,
            };
            report.attempts = err.attempts();
            report.elapsed = err.elapsed();
            report.lease_wait = err.report().lease_wait();
            report.in_progress_waits = err.report().in_progress_waits();
            report.in_progress_wait = err.report().in_progress_wait();
            report.error = Some(command_line_hints(&err.message_with_cause()));
            if report.exit == Exit::AnswerNotSaved {
                // The saved answer's status: the operation is done.
                report.status = err.status().map(|status| status.as_u16());
            }
            if let Some(key) = err.idempotency_key() {
                report.key = Some(key.as_str().to_owned());
            }
            if report.exit == Exit::Unknown {
                report.window_ends =
                    window_end(&client, report.key.as_deref(), &prepared.policy).await;
            }
            if let Some(response) = err.take_response() {
                // The last attempt's answer, as curl would show it; the exit status is the
                // operation's. An answer that could not be written out whole turns a done
                // operation's status into 23, never one that may not have happened: that
                // status (and its message) says what to do next, the write failure is added.
                let exit = report.exit;
                let error = report.error.clone();
                report = answered(invocation, &mut prepared, response, report, false).await;
                if report.exit != Exit::Write {
                    report.exit = exit;
                } else if matches!(exit, Exit::Unknown | Exit::NotDone) {
                    report.exit = exit;
                    report.body_cut = false;
                    report.error = match (error, report.error.take()) {
                        (Some(error), Some(unwritten)) => {
                            Some(format!("{error}; and its last answer: {unwritten}"))
                        }
                        (error, unwritten) => error.or(unwritten),
                    };
                }
            }
            report
        }
    }
}

/// The library's message with the options it names (Rust's) turned into idemcurl's flags.
fn command_line_hints(message: &str) -> String {
    [
        (
            "send it with LedgerOptions::fetch_unsaved_answers(true) to have the receiver \
             answer it again under the key",
            "run it again without --no-refetch to have the receiver answer it again under the \
             key",
        ),
        ("LedgerOptions::max_body", "--max-saved-body"),
        ("LedgerOptions::seal_keys", "--seal-keys FILE"),
        (
            "RetryPolicy::with_max_in_progress_wait",
            "--in-progress-wait",
        ),
        ("(max_in_progress_wait is 0)", "(--in-progress-wait is 0)"),
        (
            " (LedgerOptions::on_lease_held), wait longer with a larger max_wait",
            ", wait longer with a larger --lease-wait",
        ),
        (
            "LedgerOptions::on_lease_held(LeaseHeldPolicy::WAIT) waits for it",
            "--lease-wait DURATION waits for it",
        ),
    ]
    .iter()
    .fold(message.to_owned(), |message, (rust, flag)| {
        message.replace(rust, flag)
    })
}

/// The request as the invocation asks it, on `client`.
fn request(
    client: &Client,
    prepared: &mut Prepared,
    choice: &KeyChoice,
    scope: &str,
) -> Result<idempotent_retry::RequestBuilder, String> {
    let mut request = client
        .request(prepared.method.clone(), prepared.url.as_str())
        .ledger_scope(scope);
    let set = |name: &HeaderName| prepared.headers.iter().any(|(set, _)| set == name);
    let removed = |name: &HeaderName| prepared.removed.contains(name);
    let json = matches!(prepared.payload, Payload::Bytes { json: true, .. });
    let defaults = [
        (
            http::header::USER_AGENT,
            concat!("idemcurl/", env!("CARGO_PKG_VERSION")),
        ),
        (
            http::header::ACCEPT,
            if json { "application/json" } else { "*/*" },
        ),
    ];
    for (name, value) in defaults {
        if !set(&name) && !removed(&name) {
            request = request.header(name, HeaderValue::from_static(value));
        }
    }
    if let Some((name, password)) = &prepared.user {
        request = request.basic_auth(name, Some(password));
    }
    // The body moves into the request: nothing reads the payload after this.
    match std::mem::replace(&mut prepared.payload, Payload::None) {
        Payload::None => {}
        Payload::Bytes { bytes, json } => {
            let content_type = http::header::CONTENT_TYPE;
            if !set(&content_type) && !removed(&content_type) {
                let kind = if json {
                    "application/json"
                } else {
                    "application/x-www-form-urlencoded"
                };
                request = request.header(content_type, HeaderValue::from_static(kind));
            }
            request = request.body(bytes);
        }
        Payload::Form(parts) => {
            let mut form = Form::new().percent_encode_noop();
            for part in parts {
                let mut made = Part::bytes(part.content);
                if let Some(name) = part.file_name {
                    made = made.file_name(name);
                }
                if let Some(kind) = &part.content_type {
                    made = made
                        .mime_str(kind)
                        .map_err(|err| format!("-F {}: type {kind:?}: {err}", part.name))?;
                }
                form = form.part(part.name, made);
            }
            request = request.multipart(form);
        }
    }
    for (name, value) in &prepared.headers {
        request = request.header(name.clone(), value.clone());
    }
    request = match (&choice.key, choice.source) {
        (_, KeySource::Refused) => request.without_idempotency_key(),
        (Some(key), _) => request.idempotency_key(key.clone()),
        (None, _) => request,
    };
    Ok(request)
}

/// Why an answer was not written out whole.
enum Unwritten {
    /// Its body was cut after `written` bytes (those were written out); `cause` is the
    /// connection's own error.
    Cut { written: u64, cause: String },
    /// Writing it failed.
    Write(String),
}

/// The deepest cause of `err`: what the connection itself said.
fn deepest_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = err;
    while let Some(cause) = deepest.source() {
        deepest = cause;
    }
    deepest.to_string()
}

/// What an answer whose body was cut after `written` of `total` bytes means, and how to have
/// it again: the receiver answered `status` (a final answer when `done`), so a keyed
/// operation's effect stands, and the same request sent with its key is answered again from
/// the receiver's store. A ledger cannot replay it: an answer streamed out (longer than
/// `max_saved_body`, or of unknown length) was recorded without its body, and a re-run with
/// the key sends it again.
fn cut_message(
    report: &Report,
    invocation: &Invocation,
    method: &Method,
    (written, total): (u64, Option<u64>),
    cause: &str,
    done: bool,
) -> String {
    let of = total
        .map(|total| format!(" of {total}"))
        .unwrap_or_default();
    let cut = format!(
        "the answer's body was cut after {written}{of} bytes, which were written out ({cause})"
    );
    if !done {
        return cut;
    }
    let status = report.status.unwrap_or(0);
    let again = match &report.key {
        Some(key) if report.ledger == "none" => format!(
            "so its effect stands: run it again with --key {key} to have the whole answer \
             again from the receiver's store"
        ),
        Some(key) if invocation.refetch => format!(
            "so its effect stands: run it again with --key {key} to have the whole answer \
             again from the receiver's store (the ledger keeps no body over {} bytes: it \
             sends the request again under the key)",
            invocation.max_saved_body
        ),
        Some(key) => format!(
            "so its effect stands: run it again with --key {key} (without --no-refetch) to \
             have the whole answer again from the receiver's store (the ledger keeps no body \
             over {} bytes)",
            invocation.max_saved_body
        ),
        None if IdempotencyKey::is_minted_for(method) => "and it was sent without a key, so a \
             re-run is a new operation: check with the server before sending it again"
            .to_owned(),
        None => format!("run it again to have it whole ({method} is safe to repeat)"),
    };
    format!("{cut}; the receiver answered {status}, {again}")
}

/// Writes a response out (head with `-i` or `-D`, body unless `--fail` refuses it, `-w`) and
/// fills in the report. `done`: the response is the operation's final answer, not the last
/// attempt's of an operation that ended without one.
async fn answered(
    invocation: &Invocation,
    prepared: &mut Prepared,
    mut response: reqwest::Response,
    mut report: Report,
    done: bool,
) -> Report {
    let status = response.status();
    report.status = Some(status.as_u16());
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    if let Some(retry) = RetryReport::of(&response) {
        report.replayed = retry.is_replayed();
        report.refetched = retry.is_refetched();
        report.attempts = retry.attempts();
        report.elapsed = retry.elapsed();
        if let Some(key) = retry.idempotency_key() {
            report.key = Some(key.as_str().to_owned());
        }
    }
    let redirects = RedirectChain::of(&response).hops().len();
    let final_url = shown(response.url());
    let failing = status.as_u16() >= 400 && invocation.fail != HttpErrors::Answer;
    report.exit = if failing { Exit::HttpError } else { Exit::Done };
    let head = output::head(response.version(), status, response.headers());
    let total = response.content_length();
    let mut size = 0u64;
    let written: Result<(), Unwritten> = async {
        let write_error =
            |err: std::io::Error| Unwritten::Write(format!("cannot write the answer: {err}"));
        if let Some(dump) = &mut prepared.dump {
            let dump_error = |err| Unwritten::Write(format!("-D: cannot write: {err}"));
            dump.write(&head).map_err(dump_error)?;
            dump.finish().map_err(dump_error)?;
        }
        if invocation.include {
            prepared.out.write(&head).map_err(write_error)?;
        }
        if !(failing && invocation.fail == HttpErrors::Fail) {
            // A body up to the answer read limit was read inside its attempt (a cut one was retried):
            // only a streamed one can fail here, after the receiver answered.
            while let Some(chunk) = response.chunk().await.map_err(|err| Unwritten::Cut {
                written: size,
                cause: deepest_cause(&err),
            })? {
                size += chunk.len() as u64;
                prepared.out.write(&chunk).map_err(write_error)?;
            }
        }
        prepared.out.finish().map_err(write_error)
    }
    .await;
    match written {
        Ok(()) => {}
        Err(Unwritten::Write(message)) => {
            report.exit = Exit::Write;
            report.error = Some(message);
        }
        Err(Unwritten::Cut { written, cause }) => {
            // What arrived is written out; what was not, is not: flush it, and never exit 0.
            let _ = prepared.out.finish();
            report.exit = Exit::Write;
            report.body_cut = true;
            report.error = Some(cut_message(
                &report,
                invocation,
                &prepared.method,
                (written, total),
                &cause,
                done,
            ));
        }
    }
    if let Some(format) = &prepared.write_out {
        let facts = Facts {
            status: Some(status.as_u16()),
            url: final_url,
            size,
            content_type,
            redirects,
            elapsed: report.elapsed,
            exit: report.exit.code(),
            key: report.key.clone(),
            attempts: report.attempts,
            outcome: report.exit.outcome(),
            replayed: report.replayed,
        };
        let text = format.render(&facts);
        let mut stdout = Destination::Stdout;
        if stdout
            .write(text.as_bytes())
            .and_then(|()| stdout.finish())
            .is_err()
            && report.exit != Exit::Write
        {
            report.exit = Exit::Write;
            report.error = Some("cannot write --write-out to stdout".into());
        }
    }
    report
}

/// When the operation under `key` may no longer be sent again: its first attempt, as the
/// ledger holds it, plus the window.
async fn window_end(
    client: &Client,
    key: Option<&str>,
    policy: &RetryPolicy,
) -> Option<SystemTime> {
    let record = client.ledger()?.get(key?).await.ok()??;
    record
        .first_attempt_at
        .checked_add(policy.reconcile_window())
}

/// After a signal: the dropped operation's lease given back, and whether it may have run, as
/// the ledger now says.
async fn cancel(
    client: &Client,
    choice: &KeyChoice,
    mut report: Report,
    elapsed: Duration,
) -> Report {
    report.cancelled = true;
    report.elapsed = elapsed;
    client.wait_for_releases(RELEASE_WAIT).await;
    let status = match (client.ledger(), &choice.key) {
        (Some(ledger), Some(key)) => ledger
            .get(key.as_str())
            .await
            .ok()
            .flatten()
            .map(|record| (record.status, record.attempts)),
        _ => None,
    };
    match status {
        Some((OperationStatus::NotSent, attempts)) => {
            report.exit = Exit::NotDone;
            report.attempts = attempts;
            report.error = Some("a signal stopped it before any attempt reached the server".into());
        }
        Some((_, attempts)) => {
            report.exit = Exit::Unknown;
            report.attempts = attempts;
            report.error = Some("a signal stopped it while the operation was under way".into());
        }
        None => {
            report.exit = Exit::Unknown;
            report.error = Some("a signal stopped it while the operation was under way".into());
        }
    }
    report
}

/// Tells the person at the terminal, once, that the command is waiting for another run that
/// holds its key: after a second of waiting, one line on stderr.
#[derive(Debug, Default)]
struct WaitNotice {
    told: std::sync::atomic::AtomicBool,
}

/// How long a wait goes untold.
const WAIT_NOTICE_AFTER: Duration = Duration::from_secs(1);

impl idempotent_retry::Observer for WaitNotice {
    fn on_lease_wait(&self, event: &idempotent_retry::observe::LeaseWaitEvent<'_>) {
        use std::sync::atomic::Ordering;
        if event.waited < WAIT_NOTICE_AFTER || self.told.swap(true, Ordering::Relaxed) {
            return;
        }
        let holder = event.holder.unwrap_or("unknown");
        let (worker, run) = holder.rsplit_once('/').unwrap_or((holder, "unknown"));
        eprintln!(
            "idemcurl: waiting for run {run} of worker {worker}, lease until {} (--lease-wait)",
            humantime::format_rfc3339_millis(event.lease_until)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::command_line_hints;

    #[test]
    fn the_library_s_options_are_named_as_idemcurl_s_flags() {
        let waited = "held by worker w (run r) until 2026-01-01T00:00:10Z (9s from now); nothing \
                      was sent; waited 4m (LedgerOptions::on_lease_held), wait longer with a \
                      larger max_wait";
        assert_eq!(
            command_line_hints(waited),
            "held by worker w (run r) until 2026-01-01T00:00:10Z (9s from now); nothing was \
             sent; waited 4m, wait longer with a larger --lease-wait"
        );
        let at_once = "nothing was sent; LedgerOptions::on_lease_held(LeaseHeldPolicy::WAIT) \
                       waits for it";
        assert_eq!(
            command_line_hints(at_once),
            "nothing was sent; --lease-wait DURATION waits for it"
        );
        assert!(!command_line_hints(waited).contains("LedgerOptions"));
    }
}
