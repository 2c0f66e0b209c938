//! Metrics (feature `metrics`) as a recorder of the `metrics` facade sees them: the facade's
//! debugging recorder, installed for one test at a time on the thread that runs it (a
//! current-thread runtime, so the client, the loopback server and every task they spawn record
//! into it).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::support::*;
use idempotent_retry::ledger::MemoryLedger;
use idempotent_retry::{Client, IdempotencyKey, RetryBudget, RetryBudgetConfig, RetryPolicy};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// One metric as recorded: its name, labels, unit and value.
#[derive(Debug)]
struct Metric {
    name: String,
    labels: BTreeMap<String, String>,
    unit: Option<Unit>,
    value: DebugValue,
}

/// Runs `test` on a current-thread runtime with a fresh debugging recorder, and returns what
/// was recorded.
fn recorded<F, Fut>(test: F) -> Vec<Metric>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(test());
    });
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, unit, _description, value)| {
            let (_kind, key) = key.into_parts();
            let (name, labels) = key.into_parts();
            Metric {
                name: name.as_str().to_owned(),
                labels: labels
                    .into_iter()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                unit,
                value,
            }
        })
        .collect()
}

/// The metrics named `name` whose labels include every pair in `labels`.
fn find<'m>(metrics: &'m [Metric], name: &str, labels: &[(&str, &str)]) -> Vec<&'m Metric> {
    metrics
        .iter()
        .filter(|m| m.name == name)
        .filter(|m| {
            labels
                .iter()
                .all(|(k, v)| m.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// The value of the one counter named `name` with exactly these labels.
fn counter(metrics: &[Metric], name: &str, labels: &[(&str, &str)]) -> u64 {
    let found: Vec<&Metric> = find(metrics, name, labels)
        .into_iter()
        .filter(|m| m.labels.len() == labels.len())
        .collect();
    match found[..] {
        [
            Metric {
                value: DebugValue::Counter(n),
                ..
            },
        ] => *n,
        [] => 0,
        _ => panic!("one counter {name} {labels:?}: {found:#?}"),
    }
}

/// The durations recorded by the one histogram named `name` with these labels (among others).
fn samples(metrics: &[Metric], name: &str, labels: &[(&str, &str)]) -> usize {
    find(metrics, name, labels)
        .iter()
        .map(|m| match &m.value {
            DebugValue::Histogram(values) => {
                assert!(values.iter().all(|v| v.into_inner() >= 0.0));
                values.len()
            }
            other => panic!("{name} is a histogram, not {other:?}"),
        })
        .sum()
}

fn gauge(metrics: &[Metric], name: &str) -> Option<f64> {
    find(metrics, name, &[]).iter().find_map(|m| match m.value {
        DebugValue::Gauge(value) => Some(value.into_inner()),
        _ => None,
    })
}

fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .with_base_delay(Duration::from_millis(1))
        .with_max_delay(Duration::from_millis(5))
}

fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("valid key")
}

#[test]
fn each_request_on_the_wire_is_timed_with_the_conventions_labels() {
    let mut port = 0;
    let metrics = recorded(|| async {
        let server = TestServer::start(
            vec![
                Action::status(503),
                Action::Reset,
                Action::status_with(307, &[("Location", "/v1/moved")]),
            ],
            Action::ok("done"),
        )
        .await;
        port = server.addr().port();
        Client::builder()
            .policy(fast())
            .build()
            .expect("valid")
            .post(server.url("/v1/charges"))
            .idempotency_key(key("m_wire"))
            .body("{}")
            .send()
            .await
            .expect("the redirected third attempt answers");
    });
    let port = port.to_string();
    let common = [
        ("http.request.method", "POST"),
        ("server.address", "127.0.0.1"),
        ("server.port", port.as_str()),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut labels = common.to_vec();
        labels.extend_from_slice(extra);
        samples(&metrics, "http.client.request.duration", &labels)
    };
    assert_eq!(with(&[]), 4, "three attempts, the last one redirected once");
    assert_eq!(
        with(&[
            ("http.response.status_code", "503"),
            ("error.type", "503"),
            ("network.protocol.version", "1.1")
        ]),
        1
    );
    assert_eq!(with(&[("error.type", "connection_reset")]), 1);
    assert_eq!(with(&[("http.response.status_code", "307")]), 1);
    assert_eq!(with(&[("http.response.status_code", "200")]), 1);
    let histogram = find(&metrics, "http.client.request.duration", &[]);
    assert!(histogram.iter().all(|m| m.unit == Some(Unit::Seconds)));
    for metric in &histogram {
        let status = metric
            .labels
            .get("http.response.status_code")
            .map(|s| s.parse::<u16>().expect("a status code"));
        assert_eq!(
            metric.labels.contains_key("error.type"),
            status.is_none_or(|s| s >= 400),
            "error.type on failures and only there: {metric:#?}"
        );
    }

    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[("outcome", "done"), ("stop_reason", "answered")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.retries",
            &[("reason", "server_error")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.retries",
            &[("reason", "connection_reset")]
        ),
        1
    );
    // The second attempt, a retry, failed: charged 5 of 500 (the third, a retry that
    // succeeded, is not charged and earns nothing).
    assert_eq!(
        gauge(&metrics, "idempotent_retry.budget.tokens"),
        Some(495.0)
    );
}

#[test]
fn a_retry_the_budget_refuses_is_counted() {
    let metrics = recorded(|| async {
        let server = TestServer::start(vec![], Action::status(503)).await;
        let budget = RetryBudget::with_config(RetryBudgetConfig::new().with_capacity(10))
            .expect("valid budget");
        let err = Client::builder()
            .policy(fast())
            .retry_budget(budget)
            .build()
            .expect("valid")
            .post(server.url("/v1/charges"))
            .idempotency_key(key("m_budget"))
            .send()
            .await
            .expect_err("503 until the budget refuses");
        assert_eq!(err.attempts(), 3, "two retries fit in 10 tokens at 5 each");
    });
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.retries.refused",
            &[("reason", "server_error")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[("outcome", "unknown"), ("stop_reason", "budget_exhausted")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.retries",
            &[("reason", "server_error")]
        ),
        2
    );
    assert_eq!(gauge(&metrics, "idempotent_retry.budget.tokens"), Some(0.0));
}

#[test]
fn ledger_replays_and_refusals_are_counted_and_send_nothing() {
    let metrics = recorded(|| async {
        let server = TestServer::start_idempotent(vec![], Action::ok("done")).await;
        let client = Client::builder()
            .policy(fast())
            .ledger(MemoryLedger::new())
            .build()
            .expect("valid");
        let send = |body: &'static str| {
            client
                .post(server.url("/v1/charges"))
                .idempotency_key(key("m_ledger"))
                .body(body)
                .send()
        };
        send("a").await.expect("sent");
        send("a").await.expect("replayed");
        send("b")
            .await
            .expect_err("the key reused for another body");
        assert_eq!(server.hits(), 1);
    });
    assert_eq!(counter(&metrics, "idempotent_retry.ledger.replays", &[]), 1);
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.ledger.refusals",
            &[("reason", "key_reuse")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[("outcome", "done"), ("stop_reason", "replayed")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[("outcome", "done"), ("stop_reason", "key_reuse")]
        ),
        1
    );
    assert_eq!(
        samples(&metrics, "http.client.request.duration", &[]),
        1,
        "only the first operation sent anything"
    );
}

#[test]
fn a_connect_failure_is_timed_and_not_done() {
    let metrics = recorded(|| async {
        Client::builder()
            .policy(fast().with_max_attempts(2))
            .build()
            .expect("valid")
            .post(format!("http://{}/v1/charges", refused_addr()))
            .idempotency_key(key("m_refused"))
            .send()
            .await
            .expect_err("nothing listens");
    });
    assert_eq!(
        samples(
            &metrics,
            "http.client.request.duration",
            &[("error.type", "connect")]
        ),
        2
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[
                ("outcome", "not_done"),
                ("stop_reason", "attempts_exhausted")
            ]
        ),
        1
    );
}

/// The middleware opens no CLIENT span (`reqwest-tracing` under it does), but its attempts are
/// timed all the same.
#[cfg(feature = "middleware")]
#[test]
fn the_middleware_times_each_attempt() {
    let metrics = recorded(|| async {
        let server = TestServer::start(vec![Action::status(503)], Action::ok("done")).await;
        let retry = Client::builder()
            .policy(fast())
            .build_middleware()
            .expect("valid");
        reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(retry)
            .build()
            .post(server.url("/v1/charges"))
            .header("Idempotency-Key", "m_middleware")
            .send()
            .await
            .expect("answered");
    });
    assert_eq!(
        samples(
            &metrics,
            "http.client.request.duration",
            &[("http.response.status_code", "503")]
        ),
        1
    );
    assert_eq!(
        samples(
            &metrics,
            "http.client.request.duration",
            &[("http.response.status_code", "200")]
        ),
        1
    );
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.operations",
            &[("outcome", "done"), ("stop_reason", "answered")]
        ),
        1
    );
}

#[cfg(feature = "sqlite")]
#[test]
fn a_dispatcher_counts_what_it_sent_and_gauges_what_is_left() {
    use idempotent_retry::ledger::SqliteLedger;
    use idempotent_retry::outbox::{self, Dispatcher, Enqueue};
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("outbox.db");
    let metrics = recorded(|| async {
        let server = TestServer::start_idempotent(vec![], Action::ok("charged")).await;
        let ledger = SqliteLedger::open(&path).await.expect("open");
        let conn = outbox::sqlite::rusqlite::Connection::open(&path).expect("open");
        for (n, delay) in [(0, 0), (1, 0), (2, 3600)] {
            outbox::sqlite::enqueue(
                &conn,
                &Enqueue::post(server.url("/v1/charges"))
                    .key(key(&format!("m_outbox_{n}")))
                    .body("{}")
                    .delay(Duration::from_secs(delay)),
            )
            .expect("queued");
        }
        let client = Client::builder()
            .policy(fast())
            .ledger(ledger)
            .build()
            .expect("valid");
        // Stopped once both due operations are sent; the gauges are read as it stops.
        let sent = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let counted = std::sync::Arc::clone(&sent);
        Dispatcher::new(client)
            .expect("a ledger")
            .on_outcome(move |_| counted.add_permits(1))
            .run_until(async move {
                let _ = sent.acquire_many(2).await;
            })
            .await
            .expect("no ledger error");
        assert_eq!(server.hits(), 2);
    });
    assert_eq!(
        counter(
            &metrics,
            "idempotent_retry.outbox.delivered",
            &[("outcome", "done")]
        ),
        2
    );
    assert_eq!(gauge(&metrics, "idempotent_retry.outbox.queued"), Some(1.0));
    let age = gauge(&metrics, "idempotent_retry.outbox.oldest_age").expect("the age");
    assert!((0.0..3600.0).contains(&age), "{age}");
}
