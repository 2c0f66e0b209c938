//! Property tests of the invariants the fuzz targets in `fuzz/` check, kept small enough for
//! every test run. The unit tests next to each module already cover the basic ones (parsers
//! never panic and round-trip numbers, keys are accepted iff valid, canonical JSON re-parses to
//! a fixed point, operations with moderate policies respect their limits); these add what the
//! fuzz targets check beyond them: any policy the builder accepts (zero delays, `Duration::MAX`,
//! `u32::MAX` attempts), hostile and repeated `Retry-After` headers, retry hints, unreplayable
//! bodies and fatal failures in the decision engine; `requested_delay` against an independent
//! reading of the header rules; key round trips through every representation; and
//! `for_tool_call` (plain and secret-keyed) agreeing across a canonical re-parse.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, StatusCode};
use idempotent_retry::internals::{self, DecideInput, DecideStep};
use idempotent_retry::report::WaitReason;
use idempotent_retry::{
    DerivationSecret, FailureKind, IdempotencyKey, RetryPolicy, backoff, canonical, retry_after,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Fri, 31 Dec 9999 23:59:59 GMT, the last second an HTTP-date can name.
const YEAR_9999_SECS: u64 = 253_402_300_799;

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// Durations from zero to `Duration::MAX`, with the small ones a policy usually holds.
fn span() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::MAX),
        (0u64..5_000).prop_map(Duration::from_millis),
        (0u64..100_000).prop_map(Duration::from_secs),
        any::<u64>().prop_map(Duration::from_nanos),
        any::<u64>().prop_map(Duration::from_secs),
    ]
}

/// One `Retry-After` or `retry-after-ms` value: well-formed, extreme or garbage.
fn wish(wall_secs: u64) -> impl Strategy<Value = (&'static str, String)> {
    prop_oneof![
        (0u64..120).prop_map(|secs| ("retry-after", secs.to_string())),
        any::<u64>().prop_map(|secs| ("retry-after", secs.to_string())),
        (0u64..120_000).prop_map(|ms| ("retry-after-ms", ms.to_string())),
        (any::<u64>(), any::<u32>())
            .prop_map(|(ms, fraction)| ("retry-after-ms", format!("{ms}.{fraction}"))),
        (-100_000i64..100_000).prop_map(move |offset| {
            let date = at(wall_secs.saturating_add_signed(offset));
            ("retry-after", httpdate::fmt_http_date(date))
        }),
        Just(("retry-after", "99999999999999999999".to_owned())),
        Just(("retry-after-ms", "99999999999999999999999".to_owned())),
        Just(("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT".to_owned())),
        Just(("retry-after", "Thu, 01 Jan 1970 00:00:00 GMT".to_owned())),
        "[-+0-9.eE a-z]{0,8}".prop_map(|text| ("retry-after", text)),
        "[-+0-9.eE a-z]{0,8}".prop_map(|text| ("retry-after-ms", text)),
    ]
}

fn hint() -> impl Strategy<Value = Option<(&'static str, &'static str)>> {
    prop::option::weighted(
        0.3,
        (
            prop::sample::select(vec!["stripe-should-retry", "x-should-retry"]),
            prop::sample::select(vec!["true", "false", " TRUE ", "maybe"]),
        ),
    )
}

#[derive(Debug, Clone)]
enum Outcome {
    Response {
        status: u16,
        wishes: Vec<(&'static str, String)>,
        hint: Option<(&'static str, &'static str)>,
    },
    Failure(FailureKind),
}

fn outcome(wall_secs: u64) -> impl Strategy<Value = Outcome> {
    let statuses = prop_oneof![
        prop::sample::select(vec![
            200u16, 201, 302, 400, 404, 408, 409, 422, 429, 500, 501, 502, 503, 504, 505, 599
        ]),
        100u16..1000,
    ];
    prop_oneof![
        3 => (statuses, prop::collection::vec(wish(wall_secs), 0..3), hint())
            .prop_map(|(status, wishes, hint)| Outcome::Response { status, wishes, hint }),
        1 => prop::sample::select(vec![
            FailureKind::Dns,
            FailureKind::Connect,
            FailureKind::Timeout,
            FailureKind::ConnectionReset,
            FailureKind::ConnectionClosed,
            FailureKind::Fatal,
            FailureKind::TooManyRedirects,
            FailureKind::RedirectTargetUnreachable,
        ])
        .prop_map(Outcome::Failure),
    ]
}

/// The documented retry hint: the first `true` or `false` (trimmed, any case),
/// `Stripe-Should-Retry` before `x-should-retry`.
fn hinted(headers: &HeaderMap) -> Option<bool> {
    ["stripe-should-retry", "x-should-retry"]
        .iter()
        .flat_map(|name| headers.get_all(*name))
        .find_map(|value| match value.to_str().ok()?.trim() {
            text if text.eq_ignore_ascii_case("true") => Some(true),
            text if text.eq_ignore_ascii_case("false") => Some(false),
            _ => None,
        })
}

#[derive(Debug, Clone)]
struct Operation {
    max_attempts: u32,
    base: Duration,
    cap: Duration,
    window: Duration,
    timeout: Duration,
    max_retry_after: Duration,
    keyed: bool,
    idempotent_method: bool,
    replayable: bool,
    seed: u64,
    attempts: Vec<(Duration, Outcome)>,
}

fn operation() -> impl Strategy<Value = Operation> {
    const WALL_SECS: u64 = 1_700_000_000;
    (
        prop_oneof![1u32..8, Just(u32::MAX)],
        (span(), span()),
        span().prop_filter("a valid window", |window| !window.is_zero()),
        span().prop_filter("a valid timeout", |timeout| !timeout.is_zero()),
        span(),
        (any::<bool>(), any::<bool>(), prop::bool::weighted(0.9)),
        any::<u64>(),
        prop::collection::vec((span(), outcome(WALL_SECS)), 1..12),
    )
        .prop_map(
            |(max_attempts, (a, b), window, timeout, max_retry_after, flags, seed, attempts)| {
                Operation {
                    max_attempts,
                    base: a.min(b),
                    cap: a.max(b),
                    window,
                    timeout,
                    max_retry_after,
                    keyed: flags.0,
                    idempotent_method: flags.1,
                    replayable: flags.2,
                    seed,
                    attempts,
                }
            },
        )
}

/// Drives one operation through the engine on virtual time and checks every decision.
fn run_operation(op: &Operation) -> Result<(), TestCaseError> {
    let policy = RetryPolicy::default()
        .with_max_attempts(op.max_attempts)
        .with_base_delay(op.base)
        .with_max_delay(op.cap)
        .with_reconcile_window(op.window)
        .with_attempt_timeout(op.timeout)
        .with_max_retry_after(op.max_retry_after);
    prop_assert!(policy.validate().is_ok());
    let wall_start = at(1_700_000_000);
    let mut rng = StdRng::seed_from_u64(op.seed);
    let mut elapsed = Duration::ZERO;
    let mut waited = Duration::ZERO;
    // Attempts counted toward max_attempts: an answer that says the operation is in progress
    // is a wait, not an attempt. The door decides each in-progress answer as the first one.
    let mut counted = 0u32;
    let in_progress_limit = policy.max_in_progress_wait();

    for (took, outcome) in &op.attempts {
        counted += 1;
        prop_assert!(counted <= op.max_attempts);
        prop_assert!(elapsed < op.window, "attempt starts at the window's end");
        elapsed += (*took).min(op.timeout).min(op.window - elapsed);
        let Some(wall) = wall_start.checked_add(elapsed) else {
            return Ok(());
        };
        let mut headers = HeaderMap::new();
        if let Outcome::Response { wishes, hint, .. } = outcome {
            for (name, value) in wishes {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.append(*name, value);
                }
            }
            if let Some((name, value)) = hint {
                headers.append(*name, HeaderValue::from_static(value));
            }
        }
        let observed = match outcome {
            Outcome::Response { status, .. } => {
                Ok((StatusCode::from_u16(*status).expect("100..=999"), &headers))
            }
            Outcome::Failure(kind) => Err(*kind),
        };
        let input = DecideInput {
            attempts: counted,
            keyed: op.keyed,
            idempotent_method: op.idempotent_method,
            replayable: op.replayable,
            elapsed,
        };
        let Some(step) = internals::decide(&policy, &input, observed, wall, rng.next_u64()) else {
            return Ok(());
        };

        let remaining = op.window - elapsed;
        let (asked, hint) = match observed {
            Ok((_, headers)) => (retry_after::requested_delay(headers, wall), hinted(headers)),
            Err(_) => (None, None),
        };
        if let Ok((status, _)) = observed {
            let code = status.as_u16();
            let transient = matches!(code, 408 | 429 | 500 | 502..=504 | 506..=999)
                || (code == 409 && op.keyed);
            let keyless_unsafe = !op.keyed && !op.idempotent_method;
            if hint == Some(false) || (hint.is_none() && (!transient || keyless_unsafe)) {
                prop_assert_eq!(
                    step,
                    DecideStep::Return,
                    "final answer {} not returned",
                    code
                );
            }
        }
        if observed.is_err_and(|kind| !kind.is_transient()) {
            prop_assert!(
                matches!(step, DecideStep::Stop { why: "fatal", .. }),
                "{:?}",
                step
            );
        }
        match step {
            DecideStep::Return => {
                prop_assert!(observed.is_ok());
                break;
            }
            DecideStep::Stop {
                why,
                asked: stop_asked,
                ..
            } => {
                match why {
                    "exhausted" => prop_assert!(counted >= op.max_attempts),
                    "in_progress" => {
                        prop_assert!(stop_asked.is_some_and(|asked| asked > in_progress_limit));
                    }
                    "not_replayable" => prop_assert!(!op.replayable),
                    "not_retry_safe" => prop_assert!(!op.keyed && !op.idempotent_method),
                    "retry_after_too_long" => {
                        prop_assert_eq!(stop_asked, asked);
                        let stop_asked = stop_asked.expect("asked");
                        prop_assert!(stop_asked > op.max_retry_after || stop_asked >= remaining);
                    }
                    "fatal" => prop_assert!(observed.is_err_and(|kind| !kind.is_transient())),
                    "window" => {}
                    other => prop_assert!(false, "unexpected stop {}", other),
                }
                break;
            }
            DecideStep::Retry {
                kind,
                delay,
                reason,
            } => {
                // A wait for an operation in progress is not an attempt, and its backoff is a
                // sequence of its own.
                let retry = if kind == FailureKind::InProgress {
                    prop_assert!(op.keyed);
                    prop_assert!(delay <= in_progress_limit);
                    counted -= 1;
                    0
                } else {
                    prop_assert!(counted < op.max_attempts);
                    counted - 1
                };
                prop_assert!(op.replayable);
                let safe = op.keyed
                    || op.idempotent_method
                    || matches!(observed, Err(kind) if kind.never_sent())
                    || hint == Some(true);
                prop_assert!(safe, "unsafe retry after {:?}", outcome);
                match reason {
                    WaitReason::Backoff { ceiling } => {
                        prop_assert_eq!(ceiling, backoff::ceiling(retry, op.base, op.cap));
                        prop_assert!(delay <= ceiling && ceiling <= op.cap);
                        if let Some(asked) = asked {
                            prop_assert!(asked < delay, "waited less than asked");
                        }
                    }
                    WaitReason::RetryAfter { asked: reported } => {
                        prop_assert_eq!(Some(reported), asked);
                        prop_assert_eq!(delay, reported);
                        prop_assert!(delay <= op.max_retry_after);
                    }
                    other => prop_assert!(false, "unknown reason {:?}", other),
                }
                prop_assert!(delay < remaining, "the wait crosses the window's end");
                elapsed += delay;
                waited += delay;
                prop_assert!(waited < op.window);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_valid_policy_keeps_every_limit_whatever_the_server_says(op in operation()) {
        run_operation(&op)?;
    }
}

// ---- Retry-After -------------------------------------------------------------------------

proptest! {
    #[test]
    fn a_date_at_or_before_now_is_zero_and_a_later_one_is_the_gap(
        date_secs in 0u64..=YEAR_9999_SECS,
        now_secs in 0u64..=YEAR_9999_SECS + 1_000_000,
        now_nanos in 0u32..1_000_000_000,
    ) {
        let value = HeaderValue::from_str(&httpdate::fmt_http_date(at(date_secs))).unwrap();
        let now = at(now_secs) + Duration::from_nanos(u64::from(now_nanos));
        let got = retry_after::parse(&value, now).expect("a valid date");
        let date = at(date_secs);
        if date <= now {
            prop_assert_eq!(got, Duration::ZERO);
        } else {
            prop_assert_eq!(now + got, date);
            prop_assert!(got <= Duration::from_secs(YEAR_9999_SECS));
        }
    }

    #[test]
    fn seconds_do_not_depend_on_the_clock(
        digits in "[0-9]{1,40}",
        one in any::<u32>(),
        two in any::<u32>(),
    ) {
        let value = HeaderValue::from_str(&digits).unwrap();
        let got = retry_after::parse(&value, at(u64::from(one)));
        prop_assert_eq!(got, retry_after::parse(&value, at(u64::from(two))));
        let expected = digits.parse::<u64>().map_or(Duration::MAX, Duration::from_secs);
        prop_assert_eq!(got, Some(expected));
    }

    #[test]
    fn milliseconds_match_an_independent_reading(
        whole in "[0-9]{0,25}",
        fraction in prop::option::of("[0-9]{0,10}"),
        pad in prop::sample::select(vec!["", " ", "\t", "x", "-", "+"]),
    ) {
        let text = match &fraction {
            Some(fraction) => format!("{pad}{whole}.{fraction}"),
            None => format!("{pad}{whole}"),
        };
        let got = retry_after::parse_ms(&HeaderValue::from_str(&text).unwrap());
        let well_formed = !whole.is_empty()
            && fraction.as_ref().is_none_or(|fraction| !fraction.is_empty())
            && matches!(pad, "" | " " | "\t");
        if !well_formed {
            prop_assert_eq!(got, None, "{:?}", text);
        } else {
            let expected = match whole.parse::<u64>() {
                Err(_) => Duration::MAX,
                Ok(millis) => {
                    let mut nanos = fraction.unwrap_or_default();
                    nanos.truncate(6);
                    while nanos.len() < 6 {
                        nanos.push('0');
                    }
                    Duration::from_millis(millis) + Duration::from_nanos(nanos.parse().unwrap())
                }
            };
            prop_assert_eq!(got, Some(expected), "{:?}", text);
        }
    }

    #[test]
    fn the_largest_parsable_wish_wins_in_any_order(
        wishes in prop::collection::vec(wish(1_700_000_000), 0..6),
        rotate in any::<prop::sample::Index>(),
    ) {
        let now = at(1_700_000_000);
        let values: Vec<(&str, HeaderValue)> = wishes
            .iter()
            .filter_map(|(name, text)| Some((*name, HeaderValue::from_str(text).ok()?)))
            .collect();
        let largest = |header: &str| {
            values
                .iter()
                .filter(|(name, _)| *name == header)
                .filter_map(|(name, value)| {
                    if *name == "retry-after-ms" {
                        retry_after::parse_ms(value)
                    } else {
                        retry_after::parse(value, now)
                    }
                })
                .max()
        };
        let expected = largest("retry-after-ms").or_else(|| largest("retry-after"));
        let mut rotated = values.clone();
        if !rotated.is_empty() {
            let by = rotate.index(rotated.len());
            rotated.rotate_left(by);
        }
        for order in [&values, &rotated] {
            let mut headers = HeaderMap::new();
            for (name, value) in order.iter() {
                headers.append(*name, value.clone());
            }
            prop_assert_eq!(retry_after::requested_delay(&headers, now), expected);
        }
    }
}

// ---- keys --------------------------------------------------------------------------------

proptest! {
    #[test]
    fn every_way_to_build_a_key_agrees_and_a_key_round_trips(
        text in prop_oneof![
            "[\\x21-\\x7e]{1,255}",
            "[\\x00-\\x7f]{0,8}",
            "[\\x20-\\x7f\u{e9}]{250,260}",
            any::<String>(),
        ],
    ) {
        let valid = (1..=255).contains(&text.len())
            && text.bytes().all(|byte| (0x21..=0x7e).contains(&byte));
        let new = IdempotencyKey::new(text.as_str());
        prop_assert_eq!(new.is_ok(), valid);
        prop_assert_eq!(&IdempotencyKey::from_str(&text), &new);
        prop_assert_eq!(&IdempotencyKey::try_from(text.clone()), &new);
        let json = serde_json::to_string(&text).unwrap();
        let from_json = serde_json::from_str::<IdempotencyKey>(&json);
        prop_assert_eq!(from_json.as_ref().ok(), new.as_ref().ok());
        if let Ok(key) = new {
            let header = key.to_header_value();
            prop_assert_eq!(header.as_bytes(), text.as_bytes());
            let displayed = key.to_string();
            prop_assert_eq!(displayed.as_str(), text.as_str());
            prop_assert_eq!(serde_json::to_string(&key).unwrap(), json);
            prop_assert_eq!(IdempotencyKey::from_str(&displayed), Ok(key.clone()));
            prop_assert_eq!(String::from(key), text);
        }
    }
}

// ---- canonical JSON ----------------------------------------------------------------------

fn json_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("null".to_owned()),
        Just("-0.0".to_owned()),
        Just("1.0".to_owned()),
        Just("1e21".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("-9223372036854775808".to_owned()),
        Just("9007199254740993".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        (any::<i32>(), -30i32..30).prop_map(|(m, e)| format!("{m}e{e}")),
        "\"[a-z\\\\n\u{e000}\u{1f600}]{0,4}\"".prop_map(|s| s.replace("\\\\n", "\\n")),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5)
                .prop_map(|items| format!("[ {} ]", items.join(" , "))),
            prop::collection::vec(("[a-c\u{e000}\u{1f600}]{0,2}", inner), 0..5).prop_map(
                |members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(name, value)| format!("\"{name}\" : {value}"))
                        .collect();
                    format!("{{ {} }}", members.join(" , "))
                }
            ),
        ]
    })
}

proptest! {
    #[test]
    fn a_tool_call_key_survives_a_canonical_re_parse(text in json_text(), tool in ".{0,12}") {
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
            return Ok(());
        };
        let canonical = canonical::to_string(&value);
        let reparsed: serde_json::Value = serde_json::from_str(&canonical).unwrap();
        prop_assert_eq!(canonical::to_string(&reparsed), canonical.as_str());
        prop_assert_eq!(
            IdempotencyKey::for_tool_call(&tool, &value),
            IdempotencyKey::for_tool_call(&tool, &reparsed)
        );
        let secret = DerivationSecret::new([0x5a; 32]).unwrap();
        prop_assert_eq!(
            secret.for_tool_call(&tool, &value),
            secret.for_tool_call(&tool, &reparsed)
        );
        // serde_json's own spelling of the value canonicalizes the same way.
        let plain: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&value).unwrap()).unwrap();
        prop_assert_eq!(canonical::to_string(&plain), canonical);
    }
}
