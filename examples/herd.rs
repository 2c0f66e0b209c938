//! A thundering-herd simulation: N callers hit an overloaded server at once, and retry.
//!
//! Run it with `cargo run --release --example herd` (a markdown table), `-- --json` (one JSON
//! object per row) or `-- --svg docs/herd.svg` (the chart in the README). `-- --seed N` changes
//! the seed and `-- --ramp-ms N` spreads the first calls over N ms instead of sending them all
//! at once; the defaults give the numbers in `docs/performance.md`.
//!
//! Nothing sleeps: it is a discrete-event simulation on a simulated clock, so it runs in well
//! under a second and gives the same numbers on every machine.
//!
//! # The model
//!
//! - **Server**: time is cut into 10 ms slots and the server can take 5 requests per slot
//!   (500 requests per second). The first 5 calls to arrive in a slot succeed; every later call
//!   in that slot is refused with a 503 (it is overloaded). A response is instant.
//! - **Callers**: `clients` callers (100, then 1000) each need one operation to succeed. As in
//!   the AWS study, they all make their first call at the same instant (a failover, a restart,
//!   a cache expiry), so the server starts 20x (100 callers) or 200x (1000) over its slot
//!   capacity. With `--ramp-ms N` the first calls are spread uniformly over N ms instead.
//! - **Retries**: after a 503 a caller waits, then calls again, with no attempt limit (as in
//!   the AWS study), base 10 ms, cap 2 s. The waits come from the crate's own
//!   [`backoff::ceiling`] and [`backoff::full_jitter`]:
//!   - *none*: exactly `min(cap, base * 2^n)`;
//!   - *equal*: half of that, plus a uniform draw up to the other half;
//!   - *full*: a uniform draw in `[0, min(cap, base * 2^n)]` (the crate's default);
//!   - *decorrelated*: `min(cap, U(base, 3 * previous wait))`.
//! - **Budget**: with it, all callers share one [`RetryBudget`] with the crate's default
//!   numbers, as the clones of one `Client` in one service do: a retry that fails is charged, a
//!   first call that succeeds deposits, and a retry the budget refuses ends that caller's
//!   operation (it "gave up": `ErrorKind::BudgetExhausted` in the real client).
//!
//! # The columns
//!
//! `calls` is every call the server received; `completion_ms` the simulated time at which the
//! last operation ended (succeeded, or gave up); `peak` the most calls that arrived in any one
//! 10 ms slot (the server takes 5); `amplification` calls per operation. The markdown table
//! adds `gave_up`, the operations the budget ended. The JSON rows have exactly the keys
//! `strategy`, `budget`, `clients`, `calls`, `completion_ms`, `peak`, `amplification`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use idempotent_retry::internals::budget as charges;
use idempotent_retry::{FailureKind, RetryBudget, backoff};
use rand::rngs::StdRng;
use rand::{Rng, RngExt, SeedableRng};

/// The server's slot, and its capacity per slot.
const SLOT: Duration = Duration::from_millis(10);
const CAPACITY_PER_SLOT: u32 = 5;
const BASE: Duration = Duration::from_millis(10);
const CAP: Duration = Duration::from_secs(2);
const DEFAULT_SEED: u64 = 2015;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strategy {
    NoJitter,
    Equal,
    Full,
    Decorrelated,
}

impl Strategy {
    const ALL: [Strategy; 4] = [
        Strategy::NoJitter,
        Strategy::Equal,
        Strategy::Full,
        Strategy::Decorrelated,
    ];

    fn name(self) -> &'static str {
        match self {
            Strategy::NoJitter => "none",
            Strategy::Equal => "equal",
            Strategy::Full => "full",
            Strategy::Decorrelated => "decorrelated",
        }
    }

    /// The wait before retry `retry` (0 for the first), given the previous wait.
    fn wait(self, retry: u32, previous: Duration, rng: &mut StdRng) -> Duration {
        match self {
            Strategy::NoJitter => backoff::ceiling(retry, BASE, CAP),
            Strategy::Equal => {
                // ceiling/2 + U(0, ceiling/2), from the crate's full-jitter draw.
                backoff::ceiling(retry, BASE, CAP) / 2
                    + backoff::full_jitter(retry, BASE, CAP, rng.next_u64()) / 2
            }
            Strategy::Full => backoff::full_jitter(retry, BASE, CAP, rng.next_u64()),
            Strategy::Decorrelated => {
                // Not in the crate (its policy uses full jitter): the AWS study's formula.
                let high = previous.saturating_mul(3).max(BASE);
                let nanos = rng.random_range(nanos(BASE)..=nanos(high));
                Duration::from_nanos(nanos).min(CAP)
            }
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One row of results.
#[derive(Debug, Clone)]
struct Row {
    strategy: Strategy,
    budget: bool,
    clients: usize,
    calls: u64,
    completion_ms: u64,
    peak: u32,
    gave_up: usize,
}

impl Row {
    fn amplification(&self) -> f64 {
        self.calls as f64 / self.clients as f64
    }
}

/// Per caller: retries so far and the last wait.
#[derive(Debug, Clone, Copy, Default)]
struct Caller {
    retries: u32,
    last_wait: Duration,
}

/// What to simulate, besides the strategy and the budget.
#[derive(Debug, Clone, Copy)]
struct Setup {
    seed: u64,
    /// The first calls are spread uniformly over this long (zero: all at once).
    ramp: Duration,
}

fn simulate(strategy: Strategy, budget: bool, clients: usize, setup: Setup) -> Row {
    let mut rng = StdRng::seed_from_u64(setup.seed);
    let budget = budget.then(RetryBudget::new);
    // Events: (time in ns, sequence for a stable order, caller).
    let mut queue = BinaryHeap::new();
    for (caller, seq) in (0..clients).zip(0u64..) {
        let at = match nanos(setup.ramp) {
            0 => 0,
            ramp => rng.random_range(0..ramp),
        };
        queue.push(Reverse((at, seq, caller)));
    }
    let mut seq = clients as u64;
    let mut callers = vec![Caller::default(); clients];
    let mut per_slot: HashMap<u64, u32> = HashMap::new();
    let (mut calls, mut peak, mut gave_up, mut last_end) = (0u64, 0u32, 0usize, 0u64);

    while let Some(Reverse((at, _, id))) = queue.pop() {
        calls += 1;
        let arrived = per_slot.entry(at / nanos(SLOT)).or_insert(0);
        *arrived += 1;
        peak = peak.max(*arrived);
        let caller = &mut callers[id];
        if *arrived <= CAPACITY_PER_SLOT {
            if let (Some(budget), 0) = (&budget, caller.retries) {
                charges::record_first_attempt_success(budget);
            }
            last_end = last_end.max(at);
            continue;
        }
        // A 503: a retry that failed is charged; then the next retry is admitted, or the
        // caller gives up.
        if let Some(budget) = &budget {
            if caller.retries > 0 {
                charges::charge_failed_retry(budget, FailureKind::ServerError);
            }
            if !charges::try_admit(budget, FailureKind::ServerError) {
                gave_up += 1;
                last_end = last_end.max(at);
                continue;
            }
        }
        let wait = strategy.wait(caller.retries, caller.last_wait, &mut rng);
        caller.retries += 1;
        caller.last_wait = wait;
        queue.push(Reverse((at + nanos(wait), seq, id)));
        seq += 1;
    }

    Row {
        strategy,
        budget: budget.is_some(),
        clients,
        calls,
        completion_ms: last_end / 1_000_000,
        peak,
        gave_up,
    }
}

fn run_all(setup: Setup) -> Vec<Row> {
    let mut rows = Vec::new();
    for clients in [100, 1000] {
        for strategy in Strategy::ALL {
            for budget in [false, true] {
                rows.push(simulate(strategy, budget, clients, setup));
            }
        }
    }
    rows
}

fn markdown(rows: &[Row]) -> String {
    let mut out = String::from(
        "| strategy | budget | clients | calls | completion_ms | peak | amplification | gave_up |\n\
         |---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} |",
            r.strategy.name(),
            if r.budget { "yes" } else { "no" },
            r.clients,
            r.calls,
            r.completion_ms,
            r.peak,
            r.amplification(),
            r.gave_up
        );
    }
    out
}

fn json_lines(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows {
        let row = serde_json::json!({
            "strategy": r.strategy.name(),
            "budget": r.budget,
            "clients": r.clients,
            "calls": r.calls,
            "completion_ms": r.completion_ms,
            "peak": r.peak,
            "amplification": (r.amplification() * 100.0).round() / 100.0,
        });
        let _ = writeln!(out, "{row}");
    }
    out
}

/// A bar chart of amplification: one panel per client count, a pair of bars (without and
/// with the budget) per strategy. Plain SVG text, no dependencies.
fn svg(rows: &[Row], setup: Setup) -> String {
    const PANEL_W: f64 = 420.0;
    const PANEL_H: f64 = 260.0;
    const TOP: f64 = 60.0;
    const LEFT: f64 = 50.0;
    const BAR_W: f64 = 34.0;
    let width = LEFT + 2.0 * (PANEL_W + 30.0);
    let height = TOP + PANEL_H + 80.0;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"##
    );
    let _ = writeln!(
        out,
        r##"<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{x}" y="24" text-anchor="middle" font-size="16">Calls per operation (amplification) in a simulated herd; lower is better</text>
<rect x="{lx}" y="36" width="12" height="12" fill="#9aa5b1"/><text x="{lt}" y="46">no budget</text>
<rect x="{bx}" y="36" width="12" height="12" fill="#2f6f9f"/><text x="{bt}" y="46">retry budget (default)</text>"##,
        x = width / 2.0,
        lx = width / 2.0 - 150.0,
        lt = width / 2.0 - 134.0,
        bx = width / 2.0 - 40.0,
        bt = width / 2.0 - 24.0,
    );
    for (panel, clients) in [100usize, 1000].into_iter().enumerate() {
        let x0 = LEFT + panel as f64 * (PANEL_W + 30.0);
        let base_y = TOP + PANEL_H;
        let of = |s: Strategy, b: bool| {
            rows.iter()
                .find(|r| r.clients == clients && r.strategy == s && r.budget == b)
        };
        let max = rows
            .iter()
            .filter(|r| r.clients == clients)
            .map(Row::amplification)
            .fold(1.0_f64, f64::max);
        let scale = (PANEL_H - 30.0) / max;
        let _ = writeln!(
            out,
            r##"<line x1="{x0}" y1="{base_y}" x2="{x1}" y2="{base_y}" stroke="#333"/>
<text x="{cx}" y="{ty}" text-anchor="middle" font-size="14">{clients} clients</text>"##,
            x1 = x0 + PANEL_W,
            cx = x0 + PANEL_W / 2.0,
            ty = base_y + 44.0,
        );
        let group_w = PANEL_W / Strategy::ALL.len() as f64;
        for (i, strategy) in Strategy::ALL.into_iter().enumerate() {
            let gx = x0 + i as f64 * group_w + (group_w - 2.0 * BAR_W - 6.0) / 2.0;
            for (j, budget) in [false, true].into_iter().enumerate() {
                let Some(row) = of(strategy, budget) else {
                    continue;
                };
                let value = row.amplification();
                let h = value * scale;
                let bx = gx + j as f64 * (BAR_W + 6.0);
                let fill = if budget { "#2f6f9f" } else { "#9aa5b1" };
                let _ = writeln!(
                    out,
                    r##"<rect x="{bx:.1}" y="{y:.1}" width="{BAR_W}" height="{h:.1}" fill="{fill}"/>
<text x="{tx:.1}" y="{ly:.1}" text-anchor="middle" font-size="11">{value:.2}</text>"##,
                    y = base_y - h,
                    tx = bx + BAR_W / 2.0,
                    ly = base_y - h - 4.0,
                );
            }
            let _ = writeln!(
                out,
                r##"<text x="{x:.1}" y="{y}" text-anchor="middle">{name}</text>"##,
                x = gx + BAR_W + 3.0,
                y = base_y + 18.0,
                name = strategy.name(),
            );
        }
    }
    let _ = writeln!(
        out,
        r##"<text x="{x}" y="{y}" text-anchor="middle" font-size="11" fill="#555">server: 5 calls per 10 ms slot; {start}; backoff base 10 ms, cap 2 s; seed {seed}; examples/herd.rs</text>
</svg>"##,
        start = if setup.ramp.is_zero() {
            "all first calls at once".to_owned()
        } else {
            format!("first calls spread over {:?}", setup.ramp)
        },
        seed = setup.seed,
        x = width / 2.0,
        y = height - 10.0,
    );
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut json, mut svg_path) = (false, None);
    let mut setup = Setup {
        seed: DEFAULT_SEED,
        ramp: Duration::ZERO,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => json = true,
            "--svg" => svg_path = Some(args.next().ok_or("--svg needs a file path")?),
            "--seed" => {
                setup.seed = args
                    .next()
                    .ok_or("--seed needs a number")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?;
            }
            "--ramp-ms" => {
                let ms: u64 = args
                    .next()
                    .ok_or("--ramp-ms needs a number")?
                    .parse()
                    .map_err(|e| format!("--ramp-ms: {e}"))?;
                setup.ramp = Duration::from_millis(ms);
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: herd [--json] [--svg PATH] [--seed N] [--ramp-ms N]"
                )
                .into());
            }
        }
    }
    let rows = run_all(setup);
    if let Some(path) = svg_path {
        std::fs::write(&path, svg(&rows, setup))?;
        eprintln!("wrote {path}");
    }
    print!(
        "{}",
        if json {
            json_lines(&rows)
        } else {
            markdown(&rows)
        }
    );
    Ok(())
}
