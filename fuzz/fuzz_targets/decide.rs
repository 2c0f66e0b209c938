//! The decision engine driven through whole operations on virtual time.
//!
//! The input is an arbitrary valid policy (zero and `Duration::MAX` included), whether the
//! request is keyed, idempotent and replayable, how the jitter draws fall, and a sequence of
//! attempt outcomes: statuses 100..=999 with arbitrary `Retry-After` / `retry-after-ms` values
//! (numbers, dates around the wall clock, raw text) and retry hints, or transport failures. Each
//! attempt takes a virtual time (clipped like the engine clips it to the timeout and the window);
//! each retry's wait is added to the clock.
//!
//! Checked after every decision: it is deterministic; no attempt past `max_attempts` (an answer
//! that says the operation is in progress is a wait, not counted) and none starting at or after
//! the window's end; every wait ends strictly inside the window, so the
//! sum of waits stays below it; a backoff wait is at most its ceiling, which is the documented
//! `min(max_delay, base * 2^retry)`, and is longer than any smaller server request; a longer wait
//! only ever comes from the server (exactly what it asked, within `max_retry_after`); a wait is
//! never shorter than what the server asked; a final answer (below 400, a non-transient 4xx
//! without a retry hint, or any response the server marked not retryable) is returned as is; a
//! non-transient failure stops; no retry of a body that cannot be replayed; no retry without a
//! key or an idempotent method after a failure where the request may have run; and a plain 5xx
//! on a keyed request is retried whenever the limits leave room for it.

#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arbitrary::Arbitrary;
use http::{HeaderMap, HeaderValue, StatusCode};
use idempotent_retry::internals::{self, DecideInput, DecideStep};
use idempotent_retry::report::WaitReason;
use idempotent_retry::{FailureKind, RetryPolicy, backoff, retry_after};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Span {
    Zero,
    Nanos(u64),
    Millis(u16),
    Secs(u32),
    Max,
}

impl Span {
    fn get(self) -> Duration {
        match self {
            Span::Zero => Duration::ZERO,
            Span::Nanos(nanos) => Duration::from_nanos(nanos),
            Span::Millis(millis) => Duration::from_millis(u64::from(millis)),
            Span::Secs(secs) => Duration::from_secs(u64::from(secs)),
            Span::Max => Duration::MAX,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Wish {
    Secs(u64),
    Millis(u64),
    MillisFraction(u64, u32),
    /// An HTTP-date this many seconds from the wall clock (negative: in the past).
    DateFromNow(i32),
    Raw(String),
    RawMillis(String),
}

#[derive(Arbitrary, Debug)]
enum Hint {
    True,
    False,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Kind {
    Dns,
    Connect,
    Timeout,
    ConnectionReset,
    ConnectionClosed,
    Fatal,
    TooManyRedirects,
    RedirectTargetUnreachable,
}

impl Kind {
    fn get(&self) -> FailureKind {
        match self {
            Kind::Dns => FailureKind::Dns,
            Kind::Connect => FailureKind::Connect,
            Kind::Timeout => FailureKind::Timeout,
            Kind::ConnectionReset => FailureKind::ConnectionReset,
            Kind::ConnectionClosed => FailureKind::ConnectionClosed,
            Kind::Fatal => FailureKind::Fatal,
            Kind::TooManyRedirects => FailureKind::TooManyRedirects,
            Kind::RedirectTargetUnreachable => FailureKind::RedirectTargetUnreachable,
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Outcome {
    Response {
        status: u16,
        wishes: Vec<Wish>,
        stripe_hint: Option<Hint>,
        x_hint: Option<Hint>,
    },
    Failure(Kind),
}

#[derive(Arbitrary, Debug)]
struct Attempt {
    took: Span,
    outcome: Outcome,
}

#[derive(Arbitrary, Debug)]
struct Input {
    max_attempts: u8,
    unlimited_attempts: bool,
    base: Span,
    cap: Span,
    window: Span,
    timeout: Span,
    max_retry_after: Span,
    keyed: bool,
    idempotent_method: bool,
    replayable: bool,
    wall_secs: u32,
    draws: Vec<u64>,
    attempts: Vec<Attempt>,
}

/// The server's retry hint as documented: the first `true` or `false` (trimmed, any case),
/// `Stripe-Should-Retry` before `x-should-retry`.
fn hint(headers: &HeaderMap) -> Option<bool> {
    ["stripe-should-retry", "x-should-retry"]
        .iter()
        .flat_map(|name| headers.get_all(*name))
        .find_map(|value| match value.to_str().ok()?.trim() {
            text if text.eq_ignore_ascii_case("true") => Some(true),
            text if text.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        })
}

fn headers_for(
    wishes: &[Wish],
    stripe: Option<&Hint>,
    x: Option<&Hint>,
    wall: SystemTime,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for wish in wishes {
        let (name, value) = match wish {
            Wish::Secs(secs) => ("retry-after", HeaderValue::from(*secs)),
            Wish::Millis(millis) => ("retry-after-ms", HeaderValue::from(*millis)),
            Wish::MillisFraction(millis, fraction) => {
                match HeaderValue::from_str(&format!("{millis}.{fraction}")) {
                    Ok(value) => ("retry-after-ms", value),
                    Err(_) => continue,
                }
            }
            Wish::DateFromNow(offset) => {
                let magnitude = Duration::from_secs(u64::from(offset.unsigned_abs()));
                let date = if *offset < 0 {
                    wall.checked_sub(magnitude)
                } else {
                    wall.checked_add(magnitude)
                };
                // An HTTP-date names 1970 to 9999 only.
                let last = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
                let Some(date) = date.filter(|date| (UNIX_EPOCH..=last).contains(date)) else {
                    continue;
                };
                match HeaderValue::from_str(&httpdate::fmt_http_date(date)) {
                    Ok(value) => ("retry-after", value),
                    Err(_) => continue,
                }
            }
            Wish::Raw(text) | Wish::RawMillis(text) => {
                let name = if matches!(wish, Wish::Raw(_)) {
                    "retry-after"
                } else {
                    "retry-after-ms"
                };
                match HeaderValue::from_str(text) {
                    Ok(value) => (name, value),
                    Err(_) => continue,
                }
            }
        };
        headers.append(name, value);
    }
    for (name, given) in [("stripe-should-retry", stripe), ("x-should-retry", x)] {
        let value = match given {
            None => continue,
            Some(Hint::True) => HeaderValue::from_static("true"),
            Some(Hint::False) => HeaderValue::from_static("false"),
            Some(Hint::Other(text)) => match HeaderValue::from_str(text) {
                Ok(value) => value,
                Err(_) => continue,
            },
        };
        headers.append(name, value);
    }
    headers
}

fuzz_target!(|input: Input| {
    let (base, cap) = {
        let (a, b) = (input.base.get(), input.cap.get());
        (a.min(b), a.max(b))
    };
    let max_attempts = if input.unlimited_attempts {
        u32::MAX
    } else {
        u32::from(input.max_attempts.max(1))
    };
    let policy = RetryPolicy::default()
        .with_max_attempts(max_attempts)
        .with_base_delay(base)
        .with_max_delay(cap)
        .with_reconcile_window(input.window.get())
        .with_attempt_timeout(input.timeout.get())
        .with_max_retry_after(input.max_retry_after.get());
    if policy.validate().is_err() {
        // A zero window or timeout: the builder refuses the policy, nothing to run.
        assert!(input.window.get().is_zero() || input.timeout.get().is_zero());
        return;
    }
    let window = policy.reconcile_window();
    let timeout = policy.attempt_timeout();
    let wall_start = UNIX_EPOCH + Duration::from_secs(1_000_000_000 + u64::from(input.wall_secs));
    // One jitter word per decision, taken from the input, then zeros.
    let mut draws = input.draws.iter().copied().chain(std::iter::repeat(0));

    let mut elapsed = Duration::ZERO;
    let mut waited = Duration::ZERO;
    // Attempts counted toward max_attempts: the door decides each in-progress answer as the
    // operation's first, which is not counted.
    let mut number = 0u32;
    let in_progress_limit = policy.max_in_progress_wait();
    for attempt in &input.attempts {
        number += 1;
        assert!(number <= max_attempts, "attempt {number} of {max_attempts}");
        assert!(
            elapsed < window,
            "attempt {number} starts at {elapsed:?}, window {window:?}"
        );
        // Like the engine: an attempt lasts at most the timeout and never outlives the window.
        elapsed += attempt.took.get().min(timeout).min(window - elapsed);
        let Some(wall) = wall_start.checked_add(elapsed) else {
            return;
        };

        let headers = match &attempt.outcome {
            Outcome::Response {
                wishes,
                stripe_hint,
                x_hint,
                ..
            } => headers_for(wishes, stripe_hint.as_ref(), x_hint.as_ref(), wall),
            Outcome::Failure(_) => HeaderMap::new(),
        };
        let outcome = match &attempt.outcome {
            Outcome::Response { status, .. } => {
                let status = StatusCode::from_u16(100 + status % 900).expect("100..=999");
                Ok((status, &headers))
            }
            Outcome::Failure(kind) => Err(kind.get()),
        };
        let state = DecideInput {
            attempts: number,
            keyed: input.keyed,
            idempotent_method: input.idempotent_method,
            replayable: input.replayable,
            elapsed,
        };
        let random = draws.next().expect("an endless supply of words");
        let Some(step) = internals::decide(&policy, &state, outcome, wall, random) else {
            return;
        };
        assert_eq!(
            internals::decide(&policy, &state, outcome, wall, random),
            Some(step),
            "not deterministic"
        );

        let remaining = window - elapsed;
        let (asked, hinted) = match outcome {
            Ok((_, headers)) => (retry_after::requested_delay(headers, wall), hint(headers)),
            Err(_) => (None, None),
        };
        let retry = number - 1;
        let ceiling = backoff::ceiling(retry, base, cap);
        // An in-progress wait backs off in a sequence of its own: the door's first.
        let wait_ceiling = backoff::ceiling(0, base, cap);

        // What must come back as the answer.
        if let Ok((status, _)) = outcome {
            let code = status.as_u16();
            let transient_4xx = code == 408 || code == 429 || (code == 409 && input.keyed);
            if code < 400
                || hinted == Some(false)
                || ((400..500).contains(&code) && !transient_4xx && hinted.is_none())
            {
                assert_eq!(step, DecideStep::Return, "final answer {code} not returned");
            }
            if (code == 501 || code == 505) && hinted.is_none() {
                assert_eq!(step, DecideStep::Return, "{code} is final");
            }
            // Without a key or an idempotent method, a response is the answer unless the
            // server itself says a retry is safe.
            if !input.keyed && !input.idempotent_method && hinted != Some(true) {
                assert_eq!(step, DecideStep::Return, "keyless {code} not returned");
            }
        }
        if let Err(kind) = outcome
            && !kind.is_transient()
        {
            assert!(
                matches!(step, DecideStep::Stop { why: "fatal", .. }),
                "{step:?}"
            );
        }

        match step {
            DecideStep::Return => {
                assert!(outcome.is_ok(), "a failure has no answer to return");
                break;
            }
            DecideStep::Stop {
                why,
                asked: stop_asked,
                ..
            } => {
                match why {
                    "exhausted" => assert!(number >= max_attempts),
                    "in_progress" => {
                        assert!(stop_asked.is_some_and(|asked| asked > in_progress_limit));
                    }
                    "retry_after_too_long" => {
                        let stop_asked = stop_asked.expect("the wait asked for");
                        assert_eq!(Some(stop_asked), asked);
                        assert!(stop_asked > policy.max_retry_after() || stop_asked >= remaining);
                    }
                    "not_replayable" => assert!(!input.replayable),
                    "not_retry_safe" => {
                        assert!(!input.keyed && !input.idempotent_method);
                    }
                    "fatal" => assert!(outcome.is_err_and(|kind| !kind.is_transient())),
                    "window" => {}
                    other => panic!("unexpected stop {other}"),
                }
                break;
            }
            DecideStep::Retry {
                kind,
                delay,
                reason,
            } => {
                let in_progress = kind == FailureKind::InProgress;
                let ceiling = if in_progress {
                    assert!(input.keyed, "in progress without a key");
                    assert!(
                        delay <= in_progress_limit,
                        "a wait past the in-progress limit"
                    );
                    number -= 1;
                    wait_ceiling
                } else {
                    assert!(number < max_attempts, "retry after the last attempt");
                    ceiling
                };
                assert!(
                    input.replayable,
                    "retry of a body that cannot be sent again"
                );
                assert!(kind.is_transient());
                let safe = input.keyed
                    || input.idempotent_method
                    || matches!(outcome, Err(kind) if kind.never_sent())
                    || hinted == Some(true);
                assert!(safe, "unsafe retry after {outcome:?}");
                match reason {
                    WaitReason::Backoff { ceiling: reported } => {
                        assert_eq!(reported, ceiling);
                        assert!(
                            delay <= ceiling && ceiling <= cap,
                            "{delay:?} over {ceiling:?}"
                        );
                        if let Some(asked) = asked {
                            assert!(asked < delay, "backoff {delay:?} below the asked {asked:?}");
                        }
                    }
                    WaitReason::RetryAfter { asked: reported } => {
                        assert_eq!(Some(reported), asked);
                        assert_eq!(delay, reported);
                        assert!(delay <= policy.max_retry_after());
                    }
                    other => panic!("unknown wait reason {other:?}"),
                }
                if delay > cap {
                    assert!(matches!(reason, WaitReason::RetryAfter { .. }));
                }
                assert!(
                    delay < remaining,
                    "wait {delay:?} crosses the window ({remaining:?} left)"
                );
                elapsed += delay;
                waited += delay;
                assert!(waited < window);
            }
        }
    }

    // A plain 5xx on a keyed, replayable request with attempts and window to spare is retried.
    let plain = HeaderMap::new();
    let state = DecideInput {
        attempts: 1,
        keyed: true,
        idempotent_method: false,
        replayable: true,
        elapsed: Duration::ZERO,
    };
    if max_attempts > 1 && backoff::ceiling(0, base, cap) < window {
        let step = internals::decide(
            &policy,
            &state,
            Ok((StatusCode::SERVICE_UNAVAILABLE, &plain)),
            wall_start,
            draws.next().expect("an endless supply of words"),
        );
        assert!(matches!(step, Some(DecideStep::Retry { .. })), "{step:?}");
    }
});
