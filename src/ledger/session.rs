//! A run's side of the ledger: claim before the first attempt, record after each, finish at
//! the end, release if abandoned. Generic over the front end's request and response types
//! (through [`RetryResponse`]), so every front end gets the same claim and the same replay;
//! the engine (`engine/mod.rs`) calls these stages, this file never calls the engine.

use std::any::TypeId;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use super::reconcilable;
use super::{
    AttemptUpdate, Claim, Claimed, Finish, Ledger, LedgerError, LedgerOptions, OperationRecord,
    OperationStatus, SavedResponse, later,
};
use crate::keys::fingerprint::RequestFingerprint;
use crate::keys::key::IdempotencyKey;
use crate::ledger::reconcile::{self, Context, Reconciled, Reconcilers};
use crate::message::exchange::RetryResponse;
use crate::outcome::error::{Error, ErrorKind};
use crate::outcome::exposure::Exposure;
use crate::outcome::held::HeldOperation;
use crate::outcome::report::RetryReport;
use crate::rules::classify::FailureKind;
use crate::rules::window;
use crate::time::readable::{duration as human, rfc3339};
use crate::time::{Clock, Sleeper};

use super::renewal::LeaseKeeper;

/// A front end's ledger and how it uses it.
#[derive(Debug, Clone)]
pub(crate) struct LedgerHandle {
    pub(crate) ledger: Arc<dyn Ledger>,
    pub(crate) options: Arc<LedgerOptions>,
    /// Asked about a row whose outcome is unknown once its window has ended.
    pub(crate) reconcilers: Arc<Reconcilers>,
    /// The releases of abandoned runs and claims still being written, by key.
    pub(crate) releases: Arc<super::release::Releases>,
    /// How far this worker's clock is from the ledger's (`offset.rs`).
    pub(crate) clock_offset: Arc<super::offset::ClockOffset>,
}

/// How many times a claim looks again when the row changes between its statements (another
/// run finished or its lease lapsed in that instant).
const CLAIM_ROUNDS: u32 = 3;

/// What the claim settled.
#[derive(Debug)]
pub(crate) enum Begin<R> {
    /// This run holds the operation: send, recording each attempt.
    Proceed(LedgerRun),
    /// The operation already succeeded: its saved response, nothing sent.
    Replay(R),
    /// The operation already succeeded, but its answer's body was not saved: send it again
    /// with its key, inside its window (what is left of it), without holding the row.
    Refetch {
        /// What is left of the operation's reconcile window.
        window_left: Duration,
    },
}

/// What a claim needs to know of the operation.
#[derive(Debug)]
pub(crate) struct Operation<'a> {
    pub(crate) key: &'a IdempotencyKey,
    /// The request's method, recorded in a new row.
    pub(crate) method: &'a str,
    pub(crate) scope: String,
    pub(crate) fingerprint: RequestFingerprint,
    /// The policy's reconcile window, counted from the operation's first attempt.
    pub(crate) window: Duration,
    pub(crate) attempt_timeout: Duration,
}

/// A run that holds an operation's lease. Dropped before [`finish`](Self::finish) has written
/// the outcome (the caller's future was dropped: a timeout around `send`, a `select!`), it
/// releases the lease at once on a spawned task, recording whether an attempt may have reached
/// the server, so the next run with the key goes ahead instead of waiting the lease out.
///
/// Attempts are counted when they start: the claim is followed by the first attempt, which
/// the finish counts (no write of its own); each later attempt is recorded before it is sent.
/// So a run that dies leaves exactly one attempt uncounted, and the run that takes its row
/// over counts it: the row's `attempts` is the number of requests that may have reached the
/// receiver.
#[derive(Debug)]
pub(crate) struct LedgerRun {
    handle: LedgerHandle,
    key: IdempotencyKey,
    owner: String,
    first_attempt_at: SystemTime,
    /// The request's URL as the row records it: an answer from another URL (a redirect was
    /// followed) is saved with the URL that gave it.
    url: Option<String>,
    /// The request's fingerprint, to which a sealed answer is bound.
    fingerprint: String,
    /// The lease's renewal, shared with the keeper polled beside the run.
    pub(crate) keeper: Arc<LeaseKeeper>,
    /// How long the claim waited for another run's lease.
    pub(crate) lease_wait: Duration,
    /// Whether the operation may have run, as the attempt loop reports it.
    pub(crate) exposure: Exposure,
    /// The outcome is written (or the write was refused): nothing to release on drop.
    settled: bool,
    /// When the run's latest attempt started, once its first attempt has: the first attempt
    /// is not counted until the finish (or the release on drop) counts it, stamped this time.
    uncounted: Mutex<Option<SystemTime>>,
}

/// A row a dispatcher already took for the operation ([`Ledger::take_due`]): the run holds it
/// from the start, with no claim of its own.
///
/// [`Ledger::take_due`]: idempotent_retry_ledger::Ledger::take_due
#[derive(Debug, Clone)]
pub(crate) struct HeldRow {
    /// The lease token it was taken under.
    pub(crate) owner: String,
    /// The row as taken: in flight under `owner`.
    pub(crate) record: OperationRecord,
    /// Its status before it was taken.
    pub(crate) previous: OperationStatus,
    /// When its lease was set, on tokio's clock: at or before the take's statement, so the
    /// keeper renews early rather than late.
    pub(crate) set_at: tokio::time::Instant,
}

/// Begins the run of an operation whose row a dispatcher already took (`held`), as a claim
/// that took it over would: the attempt a dead run left uncounted is counted, the exposure is
/// the previous status's.
///
/// # Errors
///
/// [`ErrorKind::Builder`](crate::ErrorKind::Builder) when the request is not the one the row
/// holds (another fingerprint): the row is given back, nothing is sent.
pub(crate) async fn resume<R: RetryResponse>(
    handle: &LedgerHandle,
    clocks: &Arc<dyn Clock>,
    operation: Operation<'_>,
    held: HeldRow,
) -> Result<Begin<R>, Error> {
    let clock = &**clocks;
    let offset = handle.clock_offset.current(&*handle.ledger, clock).await;
    let HeldRow {
        owner,
        record,
        previous,
        set_at,
    } = held;
    let record = offset.to_worker(record);
    let fingerprint_matches = record.fingerprint == operation.fingerprint.as_str();
    let run = taken_over(
        handle,
        clocks,
        (operation.key, owner),
        (record, previous),
        (clock.wall(), set_at, Duration::ZERO),
    )
    .await;
    if !fingerprint_matches {
        // Dropped unsettled: the row is given back at once, as exposed as it was.
        drop(run);
        return Err(Error::builder(format!(
            "the request sent for queued operation {} is not the one queued (its method, URL, \
             Content-Type or body differ; a Dispatcher's headers_for must not set \
             Content-Type); nothing was sent",
            operation.key
        )));
    }
    Ok(Begin::Proceed(run))
}

/// The run that holds a row it took over (by a claim, or by a dispatcher's take) from a run
/// that left it `previous`: the attempt a dead run left uncounted is counted, and the
/// exposure is the previous status's.
async fn taken_over(
    handle: &LedgerHandle,
    clocks: &Arc<dyn Clock>,
    (key, owner): (&IdempotencyKey, String),
    (mut record, previous): (OperationRecord, OperationStatus),
    (now, set_at, waited): (SystemTime, tokio::time::Instant, Duration),
) -> LedgerRun {
    if previous == OperationStatus::InFlight {
        // A run that died (or lost its lease) holding the row: one of its attempts started
        // and was never counted, and it may have reached the receiver.
        reconcile::count_dead_runs_attempt(
            &*handle.ledger,
            &mut record,
            &owner,
            now,
            handle.options.lease,
        )
        .await;
    }
    tracing::info!(
        key = key.as_str(),
        previous = previous.as_str(),
        attempts = record.attempts,
        "resuming an operation recorded in the ledger"
    );
    LedgerRun::new(
        handle,
        clocks,
        (key, owner),
        &record,
        (
            Exposure::after(previous.is_unresolved(), previous.reached_a_receiver()),
            set_at,
            waited,
        ),
    )
}

/// Claims the operation before its first attempt. Nothing may be sent unless this returns
/// `Proceed`. A row this run may not take answers here, with nothing sent: the saved response
/// (`Replay`), or `KeyReuse`, `LeaseHeld`, `ReconcileWindow`, `Ledger`.
///
/// # Errors
///
/// As above; each error carries the key.
pub(crate) async fn claim<R: RetryResponse>(
    handle: &LedgerHandle,
    clocks: &Arc<dyn Clock>,
    sleeper: &dyn Sleeper,
    observer: Option<&dyn crate::outcome::observe::Observer>,
    operation: Operation<'_>,
) -> Result<Begin<R>, Error> {
    let clock = &**clocks;
    let Operation {
        key,
        method,
        scope,
        fingerprint,
        window,
        attempt_timeout,
    } = operation;
    let options = &handle.options;
    let url = fingerprint.url().map(|url| options.stored_url(url));
    let retention = options.retention_for(&scope).max(window.saturating_mul(2));
    let owner = [options.worker.as_str(), IdempotencyKey::random().as_str()].join("/");
    // A run of this key abandoned in this process a moment ago may still be giving its lease
    // back: let it, so this run finds the row free.
    handle
        .releases
        .settled(key.as_str(), options.call_timeout)
        .await;
    // A claim that could not be built or written: nothing was sent.
    // How long this claim has waited for another run: measured on the client's clock from the
    // first wait, so the reads between the waits count too.
    let mut waited = Duration::ZERO;
    let mut wait_started = None;
    let report_of = |waited: Duration| {
        let mut report = RetryReport::new(Some(key.clone()));
        report.lease_wait = waited;
        report
    };
    let claim_failed = |source, waited| {
        Error::ledger(
            report_of(waited),
            false,
            "could not claim the operation; nothing was sent",
            source,
        )
    };
    let mut rounds = 0;
    // A row past its window is reconciled at most once per claim.
    let mut reconciled: Option<String> = None;
    loop {
        // The ledger compares on its own clock when it has one; what it answers is read here
        // on this worker's clock, moved by the measured offset.
        let offset = handle.clock_offset.current(&*handle.ledger, clock).await;
        let now = clock.wall();
        // The lease in the ledger ends one lease after this instant, on the keeper's timer.
        let set_at = super::renewal::real_now();
        let mut builder = Claim::builder(
            key.as_str(),
            fingerprint.as_str(),
            owner.clone(),
            now,
            later(now, options.lease),
        )
        .scope(scope.clone())
        .expires_at(later(now, retention))
        .window_cutoff(window::cutoff(now, window))
        .method(method);
        // A request whose URI is not absolute has no URL to record.
        if let Some(url) = &url {
            builder = builder.url(url.as_str());
        }
        let claim = builder
            .build()
            .map_err(|source| claim_failed(source, waited))?;
        let cutoff = claim.window_cutoff;
        // Bounded by the ledger's call timeout inside, so that the task that finishes a claim
        // whose caller has gone ends too.
        let claimed = claim_detached(handle, claim).await;
        if let Some(started) = wait_started {
            waited = clock.now().saturating_duration_since(started);
        }
        let claimed = claimed.map_err(|source| claim_failed(source, waited))?;
        let existing = match claimed {
            Claimed::New(record) => {
                let record = offset.to_worker(record);
                return Ok(Begin::Proceed(LedgerRun::new(
                    handle,
                    clocks,
                    (key, owner),
                    &record,
                    (Exposure::default(), set_at, waited),
                )));
            }
            Claimed::TakenOver { record, previous } => {
                let run = taken_over(
                    handle,
                    clocks,
                    (key, owner),
                    (offset.to_worker(record), previous),
                    (now, set_at, waited),
                )
                .await;
                return Ok(Begin::Proceed(run));
            }
            Claimed::Existing(record) => offset.to_worker(record),
        };
        let report = report_of(waited);
        if existing.fingerprint != fingerprint.as_str() {
            tracing::error!(
                key = key.as_str(),
                scope = existing.scope.as_str(),
                status = existing.status.as_str(),
                "idempotency key reused for a different request"
            );
            let held = HeldOperation::new(
                existing.status,
                existing.scope,
                (existing.method, existing.url),
                existing.first_attempt_at,
                existing.response.as_ref().map(|saved| saved.status),
                method,
                fingerprint.url(),
            );
            return Err(Error::key_reuse(report, held));
        }
        if existing.status == OperationStatus::Succeeded {
            let mut existing = existing;
            if let Some(saved) = existing.response.take() {
                let opened = super::seal::open(
                    &options.seal_keys,
                    &existing.key,
                    &existing.fingerprint,
                    saved,
                )
                .map_err(|source| {
                    Error::ledger(
                        report_of(waited),
                        false,
                        "could not open the operation's saved answer; nothing was sent",
                        source,
                    )
                })?;
                existing.response = Some(opened);
            }
            if let Some(saved) = existing
                .response
                .as_ref()
                .filter(|saved| saved.body.is_none())
            {
                return unsaved_answer(&existing, saved, options, (now, cutoff, window), report);
            }
            return replay(&existing, &fingerprint, key, waited).map(Begin::Replay);
        }
        let unresolved = existing.status.is_unresolved();
        if !window::is_open(existing.first_attempt_at, cutoff) {
            let reconciler = handle.reconcilers.for_scope(&existing.scope);
            if reconciled.is_none()
                && let Some(reconciler) = reconciler
                && reconcilable(&existing, now)
            {
                // Ask before answering `ReconcileWindow`: found done, the claim replays it;
                // found not done (or to send again), the row's window is new and the claim
                // takes it; still unknown, the answer below says so.
                let cx = Context {
                    ledger: &*handle.ledger,
                    options,
                    reconcilers: &handle.reconcilers,
                    clock,
                    attempt_timeout,
                    window,
                };
                let name = reconciler.name().to_owned();
                match reconcile::reconcile(cx, key.as_str()).await {
                    Ok(Reconciled::StillUnknown) => {
                        reconciled = Some(format!("; {name} could not tell"));
                    }
                    Err(err) => {
                        reconciled = Some(format!("; {name} could not reconcile it: {err}"));
                    }
                    // Settled, or held by another run: look again (a bounded number of times).
                    Ok(_) => rounds += 1,
                }
                if rounds < CLAIM_ROUNDS {
                    continue;
                }
            }
            // A run or a reconciler holding the row: with a reconciler to ask once it is
            // released, wait for it as for any held lease below.
            let held =
                existing.status == OperationStatus::InFlight && !reconcilable(&existing, now);
            if reconciled.is_some() || reconciler.is_none() || !held {
                return Err(
                    Error::operation(ErrorKind::ReconcileWindow, report, unresolved)
                        .with_window(window)
                        .with_message(format!(
                            "first attempted at {}, {} ago{}",
                            rfc3339(existing.first_attempt_at),
                            human(
                                now.duration_since(existing.first_attempt_at)
                                    .unwrap_or_default()
                            ),
                            reconciled.as_deref().unwrap_or("")
                        )),
                );
            }
        }
        // A ledger on its own clock refused the row only because its lease is live there; the
        // measured offset may be a few milliseconds off at the lease's edge.
        let lease = existing.lease_expires_at.filter(|until| {
            existing.status == OperationStatus::InFlight && (*until > now || offset.is_own())
        });
        if let Some(until) = lease {
            if let super::LeaseHeldPolicy::Wait { poll, max_wait } = options.on_lease_held
                && waited < max_wait
                && !poll.is_zero()
            {
                if let Some(observer) = observer {
                    observer.on_lease_wait(&crate::outcome::observe::LeaseWaitEvent {
                        key,
                        holder: existing.lease_owner.as_deref(),
                        lease_until: until,
                        waited,
                    });
                }
                let step = poll.min(max_wait - waited);
                wait_started.get_or_insert_with(|| clock.now());
                sleeper.sleep(step).await;
                continue;
            }
            let wait_hint = match options.on_lease_held {
                super::LeaseHeldPolicy::Wait { max_wait, .. } if !max_wait.is_zero() => {
                    format!(
                        "; waited {} (LedgerOptions::on_lease_held), wait longer with a larger \
                         max_wait",
                        human(waited)
                    )
                }
                _ => "; LedgerOptions::on_lease_held(LeaseHeldPolicy::WAIT) waits for it".into(),
            };
            return Err(
                Error::operation(ErrorKind::LeaseHeld, report, true).with_message(format!(
                    "held by {} until {} ({} from now); nothing was sent{wait_hint}",
                    holder(existing.lease_owner.as_deref()),
                    rfc3339(until),
                    human(until.duration_since(now).unwrap_or_default()),
                )),
            );
        }
        // The row changed between the claim's statements: look again.
        rounds += 1;
        if rounds >= CLAIM_ROUNDS {
            return Err(Error::operation(ErrorKind::LeaseHeld, report, unresolved)
                .with_message("the operation's row kept changing; nothing was sent"));
        }
    }
}

/// Runs the ledger's claim so that it is never lost: polled by the caller (no task spawned),
/// and if the caller is dropped while the claim is in flight, finished on a task of its own
/// that learns what the claim did and releases a lease it took, so the row is not left held by
/// a run that is gone.
async fn claim_detached(handle: &LedgerHandle, claim: Claim) -> Result<Claimed, LedgerError> {
    let key = claim.key.clone();
    let detached = Arc::clone(&handle.ledger);
    let limit = handle.options.call_timeout;
    let mut in_flight = ClaimInFlight {
        key,
        releases: Arc::clone(&handle.releases),
        pending: Some(Box::pin(async move {
            // Bounded here too, for the task that finishes it when its caller has gone.
            let claimed = super::bounded::within(
                &crate::time::TokioSleeper,
                limit,
                "cannot claim the operation",
                detached.claim(&claim),
            )
            .await;
            (claimed, claim, detached)
        })),
    };
    std::future::poll_fn(|cx| in_flight.poll(cx)).await
}

/// What a claim future yields: the ledger's answer, with the claim and the ledger for a
/// release.
type ClaimOutput = (Result<Claimed, LedgerError>, Claim, Arc<dyn Ledger>);

/// A claim the caller is polling. Dropped before it answered, it hands the claim to a task
/// registered as a release in flight (`release.rs`): a later claim of the same key in this
/// process waits for that claim to land and, its caller being gone, to be given back.
struct ClaimInFlight {
    key: String,
    releases: Arc<super::release::Releases>,
    pending: Option<std::pin::Pin<Box<dyn Future<Output = ClaimOutput> + Send>>>,
}

impl ClaimInFlight {
    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<Claimed, LedgerError>> {
        let pending = self
            .pending
            .as_mut()
            .expect("polled again only while the claim is pending");
        let Poll::Ready((claimed, _, _)) = pending.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        self.pending = None;
        Poll::Ready(claimed)
    }
}

impl Drop for ClaimInFlight {
    fn drop(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        // Without a tokio runtime nothing runs it: a lease it took lapses, as after a crash.
        self.releases
            .spawn(std::mem::take(&mut self.key), async move {
                let (claimed, claim, ledger) = pending.await;
                if let Ok(taken) = claimed {
                    release_unused_claim(&*ledger, &claim, &taken).await;
                }
            });
    }
}

/// Gives back a lease the claim took for a caller that has gone, leaving the row as it found
/// it: a new row as not executed, a row taken over with the status it had.
async fn release_unused_claim(ledger: &dyn Ledger, claim: &Claim, claimed: &Claimed) {
    let status = match claimed {
        Claimed::New(_) => OperationStatus::NotSent,
        Claimed::TakenOver { previous, .. } => {
            OperationStatus::unfinished(previous.is_unresolved(), previous.reached_a_receiver())
        }
        Claimed::Existing(_) => return,
    };
    let written = match Finish::new(claim.key.clone(), claim.owner.clone(), status, None) {
        Ok(finish) => ledger.finish(&finish).await,
        Err(err) => Err(err),
    };
    if let Err(err) = written {
        tracing::warn!(key = claim.key.as_str(), error = %err, "could not release an abandoned claim; its lease will lapse");
    }
}

/// A succeeded operation whose answer's body was not saved (longer than `max_body`): sent
/// again inside its window when the options allow it, refused with `AnswerNotSaved`
/// otherwise. Never an empty body as the answer.
fn unsaved_answer<R>(
    row: &OperationRecord,
    saved: &SavedResponse,
    options: &LedgerOptions,
    (now, cutoff, window): (SystemTime, SystemTime, Duration),
    report: RetryReport,
) -> Result<Begin<R>, Error> {
    let open = window::is_open(row.first_attempt_at, cutoff);
    if open && options.fetch_unsaved_answers {
        tracing::info!(
            key = row.key.as_str(),
            status = saved.status,
            "the ledger did not keep this succeeded operation's answer body: sending it again \
             with its key, for the receiver to answer from its store"
        );
        return Ok(Begin::Refetch {
            window_left: window::left_after_earlier_runs(window, row.first_attempt_at, now),
        });
    }
    let size = saved
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map_or_else(
            || format!("over {} bytes", options.max_body),
            |(_, length)| format!("{length} bytes"),
        );
    let how = if open {
        "send it with LedgerOptions::fetch_unsaved_answers(true) to have the receiver answer \
         it again under the key"
            .to_owned()
    } else {
        format!(
            "its reconcile window ended (first attempted at {}), so the receiver may have \
             forgotten the key: look the answer up at the receiver under it",
            rfc3339(row.first_attempt_at)
        )
    };
    Err(Error::operation(ErrorKind::AnswerNotSaved, report, false)
        .with_status(StatusCode::from_u16(saved.status).ok())
        .with_message(format!(
            "status {}; its answer's body ({size}) was longer than the ledger keeps ({} bytes, \
             LedgerOptions::max_body); nothing was sent; {how}",
            saved.status, options.max_body
        )))
}

/// The lease holder as a person reads it: the worker's name (set with
/// [`LedgerOptions::worker`]) and the run's token.
fn holder(owner: Option<&str>) -> String {
    match owner.and_then(|owner| owner.rsplit_once('/')) {
        Some((worker, run)) => format!("worker {worker} (run {run})"),
        None => format!("worker {}", owner.unwrap_or("unknown")),
    }
}

/// The saved response of a succeeded operation, as the front end's response; no request is
/// sent.
fn replay<R: RetryResponse>(
    record: &OperationRecord,
    fingerprint: &RequestFingerprint,
    key: &IdempotencyKey,
    waited: Duration,
) -> Result<R, Error> {
    use reqwest::ResponseBuilderExt as _;
    let corrupt = |what: String| {
        Error::ledger(
            RetryReport::new(Some(key.clone())),
            false,
            "could not replay the saved response; nothing was sent",
            LedgerError::corrupt(what),
        )
    };
    let Some(saved) = &record.response else {
        return Err(corrupt(format!(
            "succeeded operation {key} has no saved response"
        )));
    };
    let status = StatusCode::from_u16(saved.status)
        .map_err(|_| corrupt(format!("saved status {} is not a status", saved.status)))?;
    let mut builder = http::Response::builder().status(status);
    // A `reqwest::Response` built from this reports the URL that answered: the last hop of
    // the redirects the first run followed, or the request's own.
    let answered = saved
        .url
        .as_deref()
        .and_then(|url| reqwest::Url::parse(url).ok());
    if let Some(url) = answered.as_ref().or(fingerprint.url()) {
        builder = builder.url(url.clone());
    }
    for (name, value) in &saved.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| corrupt(format!("saved header name {name:?} is invalid")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| corrupt(format!("saved header value {value:?} is invalid")))?;
        builder = builder.header(name, value);
    }
    let body = saved.body.clone().map(Bytes::from).unwrap_or_default();
    let rebuilt = builder
        .body(body)
        .map_err(|err| corrupt(format!("saved response cannot be rebuilt: {err}")))?;
    let mut response = R::from_saved(rebuilt).ok_or_else(|| {
        corrupt(format!(
            "the saved body of {key} cannot be rebuilt as this front end's response body"
        ))
    })?;
    let mut report = RetryReport::new(Some(key.clone()));
    report.lease_wait = waited;
    report.replayed = true;
    report.replay_body_missing = saved.body.is_none();
    tracing::info!(
        key = key.as_str(),
        status = status.as_u16(),
        "replayed the saved response; no request sent"
    );
    response.extensions_mut().insert(report);
    Ok(response)
}

/// Whether the front end's response type can be rebuilt from a saved response, so a run may
/// claim an operation whose success it must later be able to replay.
///
/// A property of the type, asked of it once per thread: building a response to find out
/// (reqwest's parses a placeholder URL) would cost every keyed operation as much as its
/// claim's own bookkeeping.
pub(crate) fn can_replay<R: RetryResponse>() -> bool {
    thread_local! {
        /// The answers so far, by response type: one entry per front end in use.
        static KNOWN: std::cell::RefCell<Vec<(TypeId, bool)>> = const {
            std::cell::RefCell::new(Vec::new())
        };
    }
    let id = TypeId::of::<R>();
    KNOWN.with(|known| {
        if let Some(&(_, answer)) = known.borrow().iter().find(|(of, _)| *of == id) {
            return answer;
        }
        let answer = R::from_saved(http::Response::new(Bytes::new())).is_some();
        known.borrow_mut().push((id, answer));
        answer
    })
}

impl LedgerRun {
    /// The run that holds `key` under lease token `owner`, its lease set at `set_at` (tokio's
    /// clock) after `waited` for another run.
    fn new(
        handle: &LedgerHandle,
        clock: &Arc<dyn Clock>,
        (key, owner): (&IdempotencyKey, String),
        record: &OperationRecord,
        (exposure, set_at, waited): (Exposure, tokio::time::Instant, Duration),
    ) -> Self {
        let keeper = LeaseKeeper::new(
            Arc::clone(&handle.ledger),
            Arc::clone(clock),
            key.as_str().to_owned(),
            owner.clone(),
            handle.options.lease,
            set_at,
        );
        LedgerRun {
            handle: handle.clone(),
            key: key.clone(),
            owner,
            first_attempt_at: record.first_attempt_at,
            url: record.url.clone(),
            fingerprint: record.fingerprint.clone(),
            keeper: Arc::new(keeper),
            lease_wait: waited,
            exposure,
            settled: false,
            uncounted: Mutex::new(None),
        }
    }

    /// Why the run lost its lease, if it has: it sends nothing more.
    pub(crate) fn lease_lost(&self) -> Option<LedgerError> {
        self.keeper.lost()
    }

    /// What this run has left of the operation's reconcile window of `length`: the window
    /// counts from the first attempt, in earlier runs included.
    pub(crate) fn window_left(&self, length: Duration, now: SystemTime) -> Duration {
        window::left_after_earlier_runs(length, self.first_attempt_at, now)
    }

    /// Counts attempt `number`, which starts at `at`, before it is sent: the first is
    /// counted by the finish (no write); each later one is recorded now, renewing the lease.
    pub(crate) async fn attempt_starts(
        &self,
        number: u32,
        at: SystemTime,
    ) -> Result<(), LedgerError> {
        if number > 1 {
            self.write_attempt(at).await?;
        }
        *self
            .uncounted
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(at);
        Ok(())
    }

    /// One more attempt in the row, stamped `at`, and the lease renewed for a lease from now.
    async fn write_attempt(&self, at: SystemTime) -> Result<(), LedgerError> {
        let set_at = super::renewal::real_now();
        let update = AttemptUpdate::new(
            self.key.as_str(),
            self.owner.clone(),
            at,
            later(at, self.handle.options.lease),
        )?;
        self.handle.ledger.record_attempt(&update).await?;
        self.keeper.renewed(set_at);
        Ok(())
    }

    /// The finish that writes `status` and `response`, counting the last attempt if it was
    /// not recorded.
    fn finish_of(
        &mut self,
        status: OperationStatus,
        response: Option<SavedResponse>,
    ) -> Result<Finish, LedgerError> {
        let keys = &self.handle.options.seal_keys;
        let response = response
            .map(|saved| super::seal::seal(keys, self.key.as_str(), &self.fingerprint, saved));
        let finish = Finish::new(
            self.key.as_str(),
            std::mem::take(&mut self.owner),
            status,
            response,
        )?;
        let last = *self
            .uncounted
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(match last {
            Some(at) => finish.with_last_attempt(at),
            None => finish,
        })
    }

    /// Writes the run's outcome and releases the lease. A response's body is read to save it,
    /// up to [`LedgerOptions::max_body`] (a longer one is handed back unread past that point
    /// and not saved), then handed back. When the outcome cannot be written, the caller gets an
    /// [`ErrorKind::Ledger`] error carrying the key (and the response, when there was one).
    pub(crate) async fn finish<R: RetryResponse>(
        mut self,
        result: Result<R, Error>,
    ) -> Result<R, Error> {
        match result {
            Ok(response) => self.finish_response(response).await,
            Err(err) => self.finish_error(err).await,
        }
    }

    async fn finish_error<R: RetryResponse>(&mut self, mut err: Error) -> Result<R, Error> {
        self.exposure.mark(&mut err);
        let status = OperationStatus::unfinished(err.is_outcome_unknown(), self.exposure.reached());
        match self.write(status, None).await {
            Ok(()) => Err(err),
            // The run already failed over the ledger: that error says it all.
            Err(_) if err.kind() == ErrorKind::Ledger => Err(err),
            Err(source) => {
                let unknown = err.is_outcome_unknown();
                let response = err.take_response_as::<R>();
                let message = format!("the operation's outcome ({err}) could not be recorded");
                let ledger_err = Error::ledger(err.report().clone(), unknown, message, source);
                Err(match response {
                    Some(response) => ledger_err.with_response(response.status(), response),
                    None => ledger_err,
                })
            }
        }
    }

    async fn finish_response<R: RetryResponse>(&mut self, response: R) -> Result<R, Error> {
        let mut response = response;
        let report = response
            .extensions_mut()
            .remove::<RetryReport>()
            .unwrap_or_else(|| RetryReport::new(Some(self.key.clone())));
        let status = response.status();
        let max_body = self.handle.options.max_body;
        // A body the attempt already read: saved from those bytes, not read again.
        let read = match response
            .extensions_mut()
            .remove::<crate::message::body::ReadBody>()
        {
            Some(crate::message::body::ReadBody(bytes)) => {
                Ok((response, (bytes.len() <= max_body).then_some(bytes)))
            }
            None => response.read_to_save(max_body).await,
        };
        let (mut response, saved_body) = match read {
            Ok(read) => read,
            Err(source) => {
                // The server answered, but the answer was cut or stalled: it may well have run.
                let failure = match source.downcast_ref::<reqwest::Error>() {
                    Some(err) if err.is_timeout() => FailureKind::Timeout,
                    _ => crate::rules::classify::classify_source_chain(&*source)
                        .unwrap_or(FailureKind::ConnectionClosed),
                };
                let err = Error::operation(ErrorKind::Transport, report, true)
                    .with_failure(Some(failure))
                    .with_source(source);
                return self.finish_error(err).await;
            }
        };
        let headers = response.headers();
        let mut kept: Vec<(String, String)> = self
            .handle
            .options
            .saved_headers
            .iter()
            .flat_map(|name| {
                headers.get_all(name).iter().filter_map(move |value| {
                    value
                        .to_str()
                        .ok()
                        .map(|value| (name.as_str().to_owned(), value.to_owned()))
                })
            })
            .collect();
        // A body too long to keep: its length is, so a later run can say how long it was.
        if saved_body.is_none()
            && !kept
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            && let Some(length) = headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|value| value.to_str().ok())
        {
            kept.push(("content-length".to_owned(), length.to_owned()));
        }
        let mut saved = SavedResponse::new(
            status.as_u16(),
            kept,
            saved_body.map(|bytes| bytes.to_vec()),
        );
        // Answered at the end of a redirect: the row says where, so a replay reports the URL
        // the caller was answered from.
        // Compared as the response holds it first: no copy when the request's URL answered.
        if let Some(answered) = response.answered_url()
            && self.url.as_deref() != Some(answered.as_str())
        {
            let answered = self.handle.options.stored_url(answered);
            if self.url.as_deref() != Some(answered.as_str()) {
                saved = saved.answered_at(answered);
            }
        }
        let written = self.write_keeping(outcome_of(status), saved).await;
        let mut report = report;
        if let Err((source, saved)) = written {
            // The answer in hand is the operation's answer (same key, same receiver): it is
            // given, never an error. Recorded if the row has no outcome yet; otherwise the
            // row's lease lapses and the next run is answered by the receiver's own store.
            let recorded = match saved {
                Some(saved) if source.kind() == super::LedgerErrorKind::LeaseLost => {
                    self.record_after_losing_the_lease(saved).await
                }
                _ => false,
            };
            let note = format!(
                "the answer was not recorded by this run ({source}){}",
                if recorded {
                    "; recorded as the operation's resolution instead"
                } else {
                    ""
                }
            );
            tracing::warn!(
                key = self.key.as_str(),
                status = status.as_u16(),
                recorded,
                error = %source,
                "returning the answer received although the ledger did not record it as this \
                 run's"
            );
            report.unrecorded = Some(note);
        }
        response.extensions_mut().insert(report);
        Ok(response)
    }

    /// After a finish refused because another run holds (or held) the row: writes `saved` as
    /// the operation's answer if the row has no outcome yet (unknown, or in flight under a
    /// lapsed lease), through the reconcile hold and resolve a reconciler uses. Returns whether
    /// it was written.
    async fn record_after_losing_the_lease(&self, saved: SavedResponse) -> bool {
        use super::{ReconcileClaim, ResolutionKind, ResolutionNote, Resolve};
        let options = &self.handle.options;
        let now = self.keeper.wall();
        let owner = [options.worker.as_str(), IdempotencyKey::random().as_str()].join("/");
        let written = async {
            let hold = ReconcileClaim::new(
                self.key.as_str(),
                owner.clone(),
                now,
                later(now, options.lease),
            )?;
            let Some(Claimed::TakenOver { .. }) =
                self.handle.ledger.claim_unresolved(&hold).await?
            else {
                return Ok(false);
            };
            let note = ResolutionNote::new(
                ResolutionKind::Done,
                format!(
                    "the run that received the answer (worker {})",
                    options.worker
                ),
                now,
            )
            .with_reason("its lease was taken while the answer arrived");
            let resolve = Resolve::new(
                self.key.as_str(),
                owner,
                super::Resolution::Done(saved),
                Some(note),
                now,
                options.retention,
            )?;
            self.handle.ledger.resolve(&resolve).await?;
            Ok::<bool, LedgerError>(true)
        };
        written.await.unwrap_or_else(|err| {
            tracing::warn!(key = self.key.as_str(), error = %err, "could not record the answer after the lease was lost");
            false
        })
    }

    /// [`write`](Self::write) of a final response, which comes back when it was not written.
    async fn write_keeping(
        &mut self,
        status: OperationStatus,
        response: SavedResponse,
    ) -> Result<(), (LedgerError, Option<SavedResponse>)> {
        let finish = match self.finish_of(status, Some(response)) {
            Ok(finish) => finish,
            Err(err) => {
                self.settled = true;
                return Err((err, None));
            }
        };
        let written = self.handle.ledger.finish(&finish).await;
        self.settled = true;
        written.map_err(|err| (err, finish.response))
    }

    async fn write(
        &mut self,
        status: OperationStatus,
        response: Option<SavedResponse>,
    ) -> Result<(), LedgerError> {
        let written = match self.finish_of(status, response) {
            Ok(finish) => self.handle.ledger.finish(&finish).await,
            Err(err) => Err(err),
        };
        self.settled = true;
        written
    }
}

impl Drop for LedgerRun {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        // The run was abandoned before its outcome was written. Release the lease now, so the
        // next run with the key goes ahead with the same key and window; a process that dies
        // without getting here is still covered by the lease lapsing.
        let unknown = self.exposure.is_unknown();
        let status = OperationStatus::unfinished(unknown, self.exposure.reached());
        let finish = match self.finish_of(status, None) {
            Ok(finish) => finish,
            Err(err) => {
                tracing::warn!(key = self.key.as_str(), error = %err, "could not release an abandoned operation; its lease will lapse");
                return;
            }
        };
        tracing::info!(
            key = finish.key.as_str(),
            outcome_unknown = unknown,
            "operation abandoned by its caller; releasing its lease"
        );
        let ledger = Arc::clone(&self.handle.ledger);
        let key = finish.key.clone();
        self.handle.releases.spawn(key, async move {
            match ledger.finish(&finish).await {
                Ok(()) => {}
                // The outcome was written after all, or another run took the row over.
                Err(err) if err.kind() == super::LedgerErrorKind::LeaseLost => {}
                Err(err) => tracing::warn!(
                    key = finish.key.as_str(),
                    error = %err,
                    "could not release an abandoned operation; its lease will lapse"
                ),
            }
        });
    }
}

/// What a final response says about the operation. Below 400 it ran and is replayed from now
/// on, except a redirect that was not followed (301, 302, 307, 308: the policy refused the
/// hop, or it had no usable `Location`): that server only pointed elsewhere and ran nothing, so
/// a later run, perhaps allowed to follow it, sends the operation again with the same key. A
/// 303 points at the result of an operation that ran, so it counts as done.
fn outcome_of(status: StatusCode) -> OperationStatus {
    let unfollowed_redirect = matches!(
        status,
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    );
    if status.as_u16() < 400 && !unfollowed_redirect {
        OperationStatus::Succeeded
    } else {
        OperationStatus::FailedFinal
    }
}
