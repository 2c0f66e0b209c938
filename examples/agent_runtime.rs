//! An agent runtime executing HTTP tool calls: keys from the run, the step, the tool and its
//! canonical arguments; the runtime's own step timeout; a crash mid-run and a resume from a
//! SQLite ledger; the three-way outcome turned into the tool result the model reads; and the
//! mode for durable-execution engines. `docs/agents.md` explains each choice.
//!
//! Run it with `cargo run --features sqlite --example agent_runtime`. It exits non-zero if any
//! tool call had more than one effect at the receiver.
//!
//! 1. A run of eight planned tool calls starts in a **child process** (this program again, with
//!    `child` as its first argument), against the crate's idempotent loopback receiver
//!    (`testkit::Receiver`) and a ledger in a SQLite file.
//!    - step 2's answer is held by the receiver after the email went out: the runtime's step
//!      timeout cancels the call and runs the step again, with the same key;
//!    - the child dies right after step 3 (a refund) returned, before the runtime recorded the
//!      step as done: the request succeeded, the step's result was lost.
//! 2. This process **resumes the run** from the run log and the same SQLite file: step 3 is
//!    answered from the ledger without sending anything; step 4, the model re-planning the
//!    same refund, is recognised as the same call; steps 7 and 8 end unknown and not done, and
//!    their tool results tell the model what it may do.
//! 3. **Durable-execution mode**: an engine retries an activity; each execution sends one
//!    attempt, all of them with one key and inside one window, through the ledger; the
//!    execution after a success whose result the engine lost is answered from the ledger.

use std::error::Error as StdError;
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use idempotent_retry::ledger::SqliteLedger;
use idempotent_retry::{
    Client, Error, IdempotencyKey, Outcome, RetryPolicy, RetryReport, canonical,
};
use idempotent_retry_testkit::{self as testkit, Fault, Receiver, When};
use serde_json::{Value, json};

type BoxError = Box<dyn StdError + Send + Sync>;

/// The run every key is derived from: stable across restarts of the runtime.
const RUN_ID: &str = "run_7f3a";
/// The runtime's own limit on one step, shorter than the client's attempt timeout.
const STEP_TIMEOUT: Duration = Duration::from_millis(500);
/// How often the runtime runs a step whose call its step timeout cancelled.
const STEP_TRIES: u32 = 3;
/// The child's exit code when it "crashes" on purpose.
const CRASHED: i32 = 70;
/// The step after which the child dies, before recording it.
const CRASH_AFTER_STEP: u32 = 3;

/// One tool call as the model planned it.
struct ToolCall {
    step: u32,
    tool: &'static str,
    args: Value,
    /// At most once per run, whatever step the model (re-)plans it at: the key leaves the step
    /// out. Otherwise the step is part of the key, so a deliberate repeat is a new call.
    once_per_run: bool,
}

/// The model's plan. Steps 3 and 4 are the same refund (step 4 spells the amount `1999.0`, as
/// a re-planning model might); steps 5 and 6 are two deliberate, identical comments.
fn plan() -> Vec<ToolCall> {
    let call = |step, tool, args, once_per_run| ToolCall {
        step,
        tool,
        args,
        once_per_run,
    };
    vec![
        call(
            1,
            "create_ticket",
            json!({"title": "Refund order 42"}),
            false,
        ),
        call(
            2,
            "send_email",
            json!({"to": "ada@example.com", "subject": "Your refund"}),
            false,
        ),
        call(
            3,
            "refund_payment",
            json!({"order": 42, "amount_cents": 1999}),
            true,
        ),
        call(
            4,
            "refund_payment",
            json!({"amount_cents": 1999.0, "order": 42}),
            true,
        ),
        call(
            5,
            "post_comment",
            json!({"ticket": "T-1", "text": "Refund issued"}),
            false,
        ),
        call(
            6,
            "post_comment",
            json!({"ticket": "T-1", "text": "Refund issued"}),
            false,
        ),
        call(7, "open_incident", json!({"severity": "low"}), false),
        call(8, "page_oncall", json!({"team": "payments"}), false),
    ]
}

/// The call's key: run id, step (unless the call is once per run), tool name and the RFC 8785
/// canonical form of the arguments, so member order and `1999.0` vs `1999` do not matter. The
/// model's `tool_call_id` is not used: it changes every turn.
fn key_for(call: &ToolCall) -> IdempotencyKey {
    let args = canonical::to_string(&call.args);
    if call.once_per_run {
        IdempotencyKey::derive("agent.tool_call.per_run", &[RUN_ID, call.tool, &args])
    } else {
        let step = call.step.to_string();
        IdempotencyKey::derive(
            "agent.tool_call.per_step",
            &[RUN_ID, &step, call.tool, &args],
        )
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, url, pager, dir] = &args[..]
        && mode == "child"
    {
        // The first process of the run: it dies after step 3.
        let mut runtime = Runtime::start(url, pager, Path::new(dir)).await?;
        runtime.run(Some(CRASH_AFTER_STEP)).await?;
        return Err("the child was meant to crash".into());
    }

    let receiver = Receiver::start().await?;
    // The pager service (step 8) is down: nothing listens on its port.
    let pager = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://{}", listener.local_addr()?)
    };
    let dir = tempfile::tempdir()?;
    let calls = plan();
    // Step 2: the email goes out, then the answer is held past the step timeout.
    receiver.inject(
        When::key_attempt(key_for(&calls[1]), 1),
        Fault::StallAfterCommit(Duration::from_secs(10)),
    );
    // Step 7: the service answers 503 to every attempt; it may have run.
    for attempt in 1..=3 {
        receiver.inject(
            When::key_attempt(key_for(&calls[6]), attempt),
            Fault::status(503),
        );
    }

    println!("== 1. the run starts in a child process");
    let status = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "child",
            &receiver.url(""),
            &pager,
            &dir.path().display().to_string(),
        ])
        .status()
        .await?;
    if status.code() != Some(CRASHED) {
        return Err(format!("the child should have crashed, it exited with {status}").into());
    }
    println!("   (child died after step {CRASH_AFTER_STEP}, before recording it)\n");

    println!("== 2. the runtime restarts and resumes the run from its log and the ledger");
    let mut runtime = Runtime::start(&receiver.url(""), &pager, dir.path()).await?;
    runtime.run(None).await?;
    drop(runtime);

    println!("\n== 3. durable-execution mode: the engine retries, the crate sends once per retry");
    durable_execution(&receiver, dir.path()).await?;

    println!("\n== effects per tool call at the receiver");
    let mut failed = false;
    for call in &calls {
        let key = key_for(call);
        let effects = receiver.effects_for(key.as_str());
        println!("   step {} {:<15} {effects}", call.step, call.tool);
        failed |= effects > 1;
    }
    let key = IdempotencyKey::derive("workflow.activity", &["wf_91", "charge_card"]);
    let effects = receiver.effects_for(key.as_str());
    println!("   activity charge_card     {effects}");
    failed |= effects != 1;
    let expected = [1, 1, 1, 1, 1, 1, 0, 0];
    for (call, want) in calls.iter().zip(expected) {
        failed |= receiver.effects_for(key_for(call).as_str()) != want;
    }
    failed |= !receiver.violations().is_empty();
    if failed {
        eprintln!("a tool call had more (or fewer) effects than once");
        std::process::exit(1);
    }
    println!("every tool call had exactly the effects planned: one, or none when not done");
    Ok(())
}

/// The agent runtime: a client with a SQLite ledger, and a run log of finished steps.
struct Runtime {
    client: Client,
    /// Where the tools are served, and where the pager tool is.
    url: String,
    pager: String,
    log: PathBuf,
}

impl Runtime {
    async fn start(url: &str, pager: &str, dir: &Path) -> Result<Runtime, BoxError> {
        let ledger = SqliteLedger::open(dir.join("ledger.sqlite3")).await?;
        let client = Client::builder()
            .http(testkit::loopback_http()?)
            .ledger(ledger)
            .policy(
                RetryPolicy::default()
                    .with_max_attempts(3)
                    .with_base_delay(Duration::from_millis(20))
                    .with_max_delay(Duration::from_millis(200)),
            )
            .build()?;
        Ok(Runtime {
            client,
            url: url.trim_end_matches('/').to_owned(),
            pager: pager.to_owned(),
            log: dir.join("run.log"),
        })
    }

    /// The agent loop: every planned step not in the run log, in order.
    async fn run(&mut self, crash_after: Option<u32>) -> Result<(), BoxError> {
        let done = self.finished_steps()?;
        for call in plan() {
            if done.contains(&call.step) {
                println!("   step {}: in the run log, skipped", call.step);
                continue;
            }
            let result = self.execute(&call).await;
            println!("   step {} {}: {result}", call.step, call.tool);
            if crash_after == Some(call.step) {
                // Dies without running destructors, between the call and the run log.
                std::process::exit(CRASHED);
            }
            let mut log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)?;
            writeln!(log, "{}", json!({"step": call.step, "result": result}))?;
        }
        Ok(())
    }

    fn finished_steps(&self) -> Result<Vec<u32>, BoxError> {
        let Ok(file) = std::fs::File::open(&self.log) else {
            return Ok(Vec::new());
        };
        let mut steps = Vec::new();
        for line in BufReader::new(file).lines() {
            let entry: Value = serde_json::from_str(&line?)?;
            let step = entry["step"].as_u64().ok_or("a step number")?;
            steps.push(u32::try_from(step)?);
        }
        Ok(steps)
    }

    /// One tool call under the runtime's step timeout: a cancelled call is run again with the
    /// same key (the ledger gave its claim back when it was dropped).
    async fn execute(&self, call: &ToolCall) -> String {
        let key = key_for(call);
        // The body is the canonical form that was keyed: the same bytes on every try.
        let body = canonical::to_string(&call.args);
        let base = if call.tool == "page_oncall" {
            &self.pager
        } else {
            &self.url
        };
        for tried in 1..=STEP_TRIES {
            let send = self
                .client
                .post(format!("{base}/tools/{}", call.tool))
                .idempotency_key(key.clone())
                .header("content-type", "application/json")
                .body(body.clone())
                .send();
            match tokio::time::timeout(STEP_TIMEOUT, send).await {
                Ok(result) => return tool_result(result).await,
                Err(_) => println!(
                    "   step {}: the step timeout cancelled try {tried}; running the step again, same key",
                    call.step
                ),
            }
        }
        // Every try was cancelled: the call may have run.
        tool_result_for(&Outcome::Unknown { key: Some(key) }, None)
    }
}

/// What the model reads as the tool's result.
async fn tool_result(result: Result<reqwest::Response, Error>) -> String {
    let outcome = Outcome::of(&result);
    let replayed = result
        .as_ref()
        .ok()
        .and_then(RetryReport::of)
        .is_some_and(RetryReport::is_replayed);
    let body = match result {
        Ok(response) => response.text().await.ok(),
        Err(_) => None,
    };
    let text = tool_result_for(&outcome, body.as_deref());
    if replayed {
        format!("{text} [answered from the ledger, nothing sent]")
    } else {
        text
    }
}

/// The three-way outcome as the model must hear it: an unknown outcome tells it not to repeat
/// the action.
fn tool_result_for(outcome: &Outcome, body: Option<&str>) -> String {
    match outcome {
        Outcome::Done { status, .. } if status.is_success() => {
            format!("ok: {}", body.unwrap_or(""))
        }
        Outcome::Done { status, .. } => {
            format!(
                "failed with {status}: {}; the action was not performed",
                body.unwrap_or("")
            )
        }
        Outcome::NotDone { .. } => {
            "not performed: the service could not be reached; you may call this tool again"
                .to_owned()
        }
        Outcome::Unknown { key } => format!(
            "outcome unknown: the action may have been performed. Do NOT call this tool again \
             for it; it is being reconciled (key {})",
            key.as_ref().map_or("none", IdempotencyKey::as_str)
        ),
        _ => "outcome not understood; do not repeat the action".to_owned(),
    }
}

/// An engine (Temporal activity, Restate or DBOS step) retries the activity itself: each
/// execution sends one attempt, and every execution shares one key and one reconcile window
/// through the ledger, whichever worker runs it.
async fn durable_execution(receiver: &Receiver, dir: &Path) -> Result<(), BoxError> {
    let key = IdempotencyKey::derive("workflow.activity", &["wf_91", "charge_card"]);
    // First execution: 503. Second: the charge commits, the answer is lost.
    receiver.inject(When::key_attempt(&key, 1), Fault::status(503));
    receiver.inject(When::key_attempt(&key, 2), Fault::ResetAfterCommit);
    let url = receiver.url("/tools/charge_card");
    for execution in 1..=5 {
        match charge_card_activity(&url, dir, &key).await {
            Ok(text) => {
                println!("   execution {execution}: {text}");
                // The worker dies before the engine records the result: the engine runs the
                // activity once more, and the ledger answers it with nothing sent.
                let before = receiver.arrivals();
                let text = charge_card_activity(&url, dir, &key).await?;
                println!(
                    "   execution {} (the result was lost with its worker): {text}",
                    execution + 1
                );
                if receiver.arrivals() != before {
                    return Err("the ledger should have answered without sending".into());
                }
                return Ok(());
            }
            Err(text) => println!("   execution {execution}: {text}; the engine retries"),
        }
    }
    Err("the activity never completed".into())
}

/// One execution of the activity, as a fresh worker runs it: one attempt, the ledger in the
/// shared file.
async fn charge_card_activity(
    url: &str,
    dir: &Path,
    key: &IdempotencyKey,
) -> Result<String, String> {
    let setup = async {
        let ledger = SqliteLedger::open(dir.join("ledger.sqlite3")).await?;
        let client = Client::builder()
            .http(testkit::loopback_http()?)
            .ledger(ledger)
            .policy(RetryPolicy::default().with_max_attempts(1))
            .build()?;
        Ok::<_, BoxError>(client)
    };
    let client = setup.await.map_err(|e| e.to_string())?;
    let result = client
        .post(url)
        .idempotency_key(key.clone())
        .header("content-type", "application/json")
        .body(r#"{"amount_cents":500}"#)
        .send()
        .await;
    let attempts = match &result {
        Ok(response) => RetryReport::of(response).map_or(0, RetryReport::attempts),
        Err(err) => err.attempts(),
    };
    let replayed = result
        .as_ref()
        .ok()
        .and_then(RetryReport::of)
        .is_some_and(RetryReport::is_replayed);
    let outcome = Outcome::of(&result);
    let text = if replayed {
        format!("{outcome}, answered from the ledger, nothing sent")
    } else {
        format!("{outcome} after {attempts} attempt(s) in this execution")
    };
    match outcome {
        Outcome::Done { .. } => Ok(text),
        // Unknown or not done: the engine's retry sends again with the same key.
        _ => Err(text),
    }
}
