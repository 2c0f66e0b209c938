//! What a ledger costs at a worker's throughput: keyed `POST`s sent with `send()` to one
//! keep-alive loopback hyper server, 1, 16 and 64 in flight at a time, with no ledger and with
//! each ledger. Every operation uses a new key, so each one pays a full claim and finish, never
//! a replay.
//!
//! The contenders take turns inside every round (the order rotating from round to round), so
//! a change in the machine's load falls on all of them alike; each figure is the median over
//! the rounds, and its ratio to no ledger is taken within each round before the median. Beside
//! the rates, the CPU time each operation took (this process's threads, and the local
//! PostgreSQL server's processes, read from `/proc`) is the figure that the machine's load
//! moves least; a second table splits this process's share by thread: the main thread (which
//! polls every operation's future), the runtime's workers (the client's connections and the
//! server) and the rest (the SQLite ledger's writer).
//!
//! Run: `cargo bench --all-features --bench ledger` (about a minute). The PostgreSQL contender
//! runs when `IDEMPOTENT_RETRY_PG_URL` is set (`source .ci/postgres.sh && start_postgres`
//! starts one). Options after `--`:
//!
//! - `--rounds N` (default 5), `--operations N` per contender and round (default 2000; a
//!   quarter of it at concurrency 1);
//! - `--concurrency 1,16,64` (the default) and `--only none,sqlite` to pick contenders;
//! - `--pool N`: the PostgreSQL ledger's pool size (default: the ledger's default, 16);
//! - `--svg PATH`: also draw throughput against concurrency per ledger (`docs/ledger.svg`);
//! - `--ledger-only`: each operation is the ledger's claim and finish alone, with no HTTP
//!   request between them (for profiling a ledger's own cost; `none` then measures the loop).

#[allow(
    dead_code,
    reason = "the keep-alive server is all this bench takes from it"
)]
mod common;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use idempotent_retry::ledger::{
    Claim, Claimed, Finish, Ledger, MemoryLedger, OperationStatus, SavedResponse,
};
use idempotent_retry::time::{Clock, TokioClock};
use idempotent_retry::{Client, IdempotencyKey};

/// The bench's settings, from its command line.
struct Options {
    rounds: usize,
    operations: u64,
    concurrency: Vec<usize>,
    only: Option<Vec<String>>,
    pool: Option<usize>,
    svg: Option<String>,
    ledger_only: bool,
}

impl Options {
    fn parse() -> Options {
        let mut options = Options {
            rounds: 5,
            operations: 2000,
            concurrency: vec![1, 16, 64],
            only: None,
            pool: None,
            svg: None,
            ledger_only: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .unwrap_or_else(|| panic!("{name} needs a value"))
            };
            match arg.as_str() {
                "--rounds" => options.rounds = value("--rounds").parse().expect("--rounds N"),
                "--operations" => {
                    options.operations = value("--operations").parse().expect("--operations N");
                }
                "--concurrency" => {
                    options.concurrency = value("--concurrency")
                        .split(',')
                        .map(|n| n.trim().parse().expect("--concurrency 1,16,64"))
                        .collect();
                }
                "--only" => {
                    options.only = Some(
                        value("--only")
                            .split(',')
                            .map(|s| s.trim().to_owned())
                            .collect(),
                    );
                }
                "--pool" => options.pool = Some(value("--pool").parse().expect("--pool N")),
                "--svg" => options.svg = Some(value("--svg")),
                "--ledger-only" => options.ledger_only = true,
                // `cargo bench` passes `--bench`; a filter criterion would take is ignored.
                _ => {}
            }
        }
        assert!(options.rounds > 0, "--rounds must be at least 1");
        options
    }

    fn wants(&self, name: &str) -> bool {
        // No ledger is always measured: every ratio is taken against it.
        name == "none"
            || self
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|o| o == name))
    }

    /// Operations per contender and round at `concurrency`: fewer one at a time, where each
    /// durable operation waits for its own commits.
    fn operations_at(&self, concurrency: usize) -> u64 {
        if concurrency == 1 {
            (self.operations / 4).max(1)
        } else {
            self.operations
        }
    }
}

fn client(ledger: Option<impl Ledger>) -> Client {
    let builder = Client::builder();
    match ledger {
        Some(ledger) => builder.ledger(ledger),
        None => builder,
    }
    .build()
    .expect("client")
}

/// One client per contender: no ledger, then each ledger, its SQLite file in `dir`.
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(unused_variables, reason = "the SQL ledgers alone need them")
)]
async fn contenders(options: &Options, dir: &Path) -> Vec<(&'static str, Client)> {
    let mut clients: Vec<(&str, Client)> = vec![("none", client(None::<MemoryLedger>))];
    if options.wants("memory") {
        clients.push(("memory", client(Some(MemoryLedger::new()))));
    }
    #[cfg(feature = "sqlite")]
    if options.wants("sqlite") {
        let ledger = idempotent_retry::ledger::SqliteLedger::open(dir.join("bench.db"))
            .await
            .expect("sqlite");
        clients.push(("sqlite", client(Some(ledger))));
    }
    #[cfg(feature = "postgres")]
    if options.wants("postgres")
        && let Ok(base) = std::env::var("IDEMPOTENT_RETRY_PG_URL")
    {
        let url = fresh_database(&base).await;
        let ledger = match options.pool {
            Some(pool) => idempotent_retry::ledger::PostgresLedger::builder()
                .url(&url)
                .pool_size(pool)
                .build()
                .await
                .expect("postgres"),
            None => idempotent_retry::ledger::PostgresLedger::connect(&url)
                .await
                .expect("postgres"),
        };
        ledger.migrate().await.expect("migrate");
        clients.push(("postgres", client(Some(ledger))));
    }
    clients
}

/// A new database on the server at `base`, so each run starts from an empty table whatever
/// else the server holds; returns its URL.
#[cfg(feature = "postgres")]
async fn fresh_database(base: &str) -> String {
    let (admin, connection) = idempotent_retry_postgres::tokio_postgres::connect(
        base,
        idempotent_retry_postgres::tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the PostgreSQL server");
    tokio::spawn(connection);
    let name = format!(
        "ir_bench_{}",
        IdempotencyKey::random().as_str().replace('-', "")
    );
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create the bench's database");
    let (prefix, _) = base.rsplit_once('/').expect("URL ends with /database");
    format!("{prefix}/{name}")
}

/// Drops the databases [`fresh_database`] made, this run's and any an interrupted run left.
#[cfg(feature = "postgres")]
async fn drop_bench_databases() {
    let Ok(base) = std::env::var("IDEMPOTENT_RETRY_PG_URL") else {
        return;
    };
    let (admin, connection) = idempotent_retry_postgres::tokio_postgres::connect(
        &base,
        idempotent_retry_postgres::tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the PostgreSQL server");
    tokio::spawn(connection);
    let names = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'ir\\_bench\\_%'",
            &[],
        )
        .await
        .expect("list the bench's databases");
    for row in names {
        let name: String = row.get(0);
        admin
            .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
            .await
            .expect("drop the bench's database");
    }
}

/// Sends one keyed POST under the `n`th key of `run` and checks the answer.
async fn send(client: &Client, url: &str, run: &IdempotencyKey, n: u64) {
    let key = IdempotencyKey::derive("bench.ledger", &[run.as_str(), &n.to_string()]);
    let response = client
        .post(url)
        .idempotency_key(key)
        .body("charge")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 200);
    let _ = response.bytes().await.expect("body");
}

/// The ledger's part of one operation alone: the claim of the `n`th key of `run`, then its
/// finish as done (nothing at all without a ledger).
async fn claim_and_finish(client: &Client, run: &IdempotencyKey, n: u64) {
    let Some(ledger) = client.ledger() else {
        return;
    };
    let key = IdempotencyKey::derive("bench.ledger", &[run.as_str(), &n.to_string()]);
    let now = TokioClock::new().wall();
    let owner = format!("bench-{n}");
    let claim = Claim::builder(
        key.as_str(),
        "fingerprint",
        owner.as_str(),
        now,
        now + Duration::from_secs(60),
    )
    .expires_at(now + Duration::from_secs(86_400))
    .window_cutoff(now - Duration::from_secs(86_400))
    .build()
    .expect("claim");
    let claimed = ledger.claim(&claim).await.expect("claimed");
    assert!(matches!(claimed, Claimed::New(_)), "{claimed:?}");
    let finish = Finish::new(
        key.as_str(),
        owner,
        OperationStatus::Succeeded,
        Some(SavedResponse::new(200, Vec::new(), Some(b"ok".to_vec()))),
    )
    .expect("finish")
    .with_last_attempt(now);
    ledger.finish(&finish).await.expect("finished");
}

/// Operations per second for `operations` operations, `concurrency` at a time.
async fn throughput(
    client: &Client,
    url: &str,
    run: &IdempotencyKey,
    counter: &AtomicU64,
    operations: u64,
    concurrency: usize,
    ledger_only: bool,
) -> f64 {
    let clock = TokioClock::new();
    let first = counter.fetch_add(operations, Ordering::Relaxed);
    let start = clock.now();
    let operations_done =
        futures_util::stream::iter(first..first + operations).map(|n| async move {
            if ledger_only {
                claim_and_finish(client, run, n).await;
            } else {
                send(client, url, run, n).await;
            }
        });
    operations_done
        .buffer_unordered(concurrency)
        .collect::<()>()
        .await;
    operations as f64 / (clock.now() - start).as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// One contender's figures at one concurrency.
struct Cell {
    name: &'static str,
    concurrency: usize,
    /// Operations per second, one per round.
    rates: Vec<f64>,
    /// Its rate over no ledger's in the same round, one per round.
    ratios: Vec<f64>,
    /// CPU time per operation, one per round: this process's, by [`Part`], then the
    /// PostgreSQL server's.
    cpu: Vec<([f64; PARTS], f64)>,
}

/// The threads of this process, grouped by what they run.
const PARTS: usize = 3;

/// Names of the [`PARTS`], in the order [`part_of`] numbers them.
const PART_NAMES: [&str; PARTS] = [
    "main thread (the operations' futures)",
    "runtime workers (connections, server)",
    "ledger writer and the rest",
];

/// Which part thread `tid` of process `pid`, named `comm`, belongs to.
fn part_of(pid: &str, tid: &str, comm: &str) -> usize {
    if tid == pid {
        0
    } else if comm.starts_with("tokio-") {
        1
    } else {
        2
    }
}

/// CPU time used so far, in nanoseconds: by this process's threads (by part), and by the
/// local PostgreSQL server's processes. Read from `/proc` (Linux; zero elsewhere), which
/// counts what the scheduler ran, whatever else the machine does: steadier than a rate on a
/// busy machine.
struct CpuTime {
    parts: [u64; PARTS],
    server: u64,
}

impl CpuTime {
    fn now() -> CpuTime {
        let pid = std::process::id().to_string();
        let mut parts = [0; PARTS];
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten() {
            let Ok(task) = task else { continue };
            let tid = task.file_name().to_string_lossy().into_owned();
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            parts[part_of(&pid, &tid, comm.trim_end())] += ran(&task.path());
        }
        CpuTime {
            parts,
            server: postgres_processes()
                .map(|pid| sum_schedstat(std::fs::read_dir(format!("/proc/{pid}/task")).ok()))
                .sum(),
        }
    }

    /// Microseconds per operation since `before`: (this process by part, the server).
    fn per_operation_since(&self, before: &CpuTime, operations: u64) -> ([f64; PARTS], f64) {
        let per = |now: u64, then: u64| now.saturating_sub(then) as f64 / 1e3 / operations as f64;
        (
            std::array::from_fn(|i| per(self.parts[i], before.parts[i])),
            per(self.server, before.server),
        )
    }
}

/// The first field of a thread's `schedstat`: nanoseconds it ran on a CPU.
fn ran(task: &Path) -> u64 {
    std::fs::read_to_string(task.join("schedstat"))
        .ok()
        .and_then(|line| line.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// What the threads in `tasks` ran, in nanoseconds.
fn sum_schedstat(tasks: Option<std::fs::ReadDir>) -> u64 {
    tasks
        .into_iter()
        .flatten()
        .filter_map(|task| Some(ran(&task.ok()?.path())))
        .sum()
}

/// The processes named `postgres` (the server and its backends), when one runs here.
fn postgres_processes() -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{name}/comm")).ok()?;
            (comm.trim_end() == "postgres").then_some(name)
        })
}

fn main() {
    let options = Options::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let cells = runtime.block_on(async {
        let url = common::start_server().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let clients = contenders(&options, dir.path()).await;
        let run = IdempotencyKey::random();
        let counter = AtomicU64::new(0);
        // Warm up every client's connections, statement caches and files.
        for (_, client) in &clients {
            throughput(client, &url, &run, &counter, 200, 16, options.ledger_only).await;
        }
        let mut cells = Vec::new();
        for &concurrency in &options.concurrency {
            let operations = options.operations_at(concurrency);
            let mut rates = vec![Vec::new(); clients.len()];
            let mut cpu = vec![Vec::new(); clients.len()];
            for round in 0..options.rounds {
                for turn in 0..clients.len() {
                    let which = (round + turn) % clients.len();
                    let before = CpuTime::now();
                    let rate = throughput(
                        &clients[which].1,
                        &url,
                        &run,
                        &counter,
                        operations,
                        concurrency,
                        options.ledger_only,
                    )
                    .await;
                    rates[which].push(rate);
                    cpu[which].push(CpuTime::now().per_operation_since(&before, operations));
                }
            }
            for (i, (name, _)) in clients.iter().enumerate() {
                let ratios = rates[i]
                    .iter()
                    .zip(&rates[0])
                    .map(|(rate, none)| rate / none)
                    .collect();
                cells.push(Cell {
                    name,
                    concurrency,
                    cpu: cpu[i].clone(),
                    rates: rates[i].clone(),
                    ratios,
                });
            }
        }
        drop(clients);
        #[cfg(feature = "postgres")]
        drop_bench_databases().await;
        cells
    });
    runtime.shutdown_timeout(Duration::from_secs(1));

    println!(
        "\n| in flight | ledger | ops/s (median of {} rounds) | min..max | ratio to no ledger (median) | min..max | CPU µs/op: bench process | + PostgreSQL server |",
        options.rounds
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for cell in &cells {
        let (mut rates, mut ratios) = (cell.rates.clone(), cell.ratios.clone());
        let rate = median(&mut rates);
        let ratio = median(&mut ratios);
        let mut process: Vec<f64> = cell.cpu.iter().map(|c| c.0.iter().sum()).collect();
        let mut server: Vec<f64> = cell.cpu.iter().map(|c| c.1).collect();
        println!(
            "| {} | {} | {:.0} | {:.0}..{:.0} | {:.3} | {:.3}..{:.3} | {:.1} | {:.1} |",
            cell.concurrency,
            cell.name,
            rate,
            rates[0],
            rates[rates.len() - 1],
            ratio,
            ratios[0],
            ratios[ratios.len() - 1],
            median(&mut process),
            median(&mut server),
        );
    }
    println!(
        "\nCPU µs per operation by thread (median of {} rounds):\n",
        options.rounds
    );
    println!(
        "| in flight | ledger | {} |\n|---:|---|{}",
        PART_NAMES.join(" | "),
        "---:|".repeat(PARTS)
    );
    for cell in &cells {
        let parts: Vec<String> = (0..PARTS)
            .map(|i| {
                let mut part: Vec<f64> = cell.cpu.iter().map(|c| c.0[i]).collect();
                format!("{:.1}", median(&mut part))
            })
            .collect();
        println!(
            "| {} | {} | {} |",
            cell.concurrency,
            cell.name,
            parts.join(" | ")
        );
    }
    if let Some(path) = &options.svg {
        std::fs::write(path, svg(&cells, &options)).expect("write the chart");
        println!("\nchart written to {path}");
    }
}

/// A grouped bar chart: one group per concurrency, one bar per ledger (its median ops/s), the
/// ratio to no ledger above each bar. Plain SVG text, no dependencies.
fn svg(cells: &[Cell], options: &Options) -> String {
    const GROUP_W: f64 = 300.0;
    const PLOT_H: f64 = 300.0;
    const TOP: f64 = 70.0;
    const LEFT: f64 = 70.0;
    const COLOURS: [(&str, &str); 4] = [
        ("none", "#9aa5b1"),
        ("memory", "#7fb77e"),
        ("sqlite", "#2f6f9f"),
        ("postgres", "#c2773a"),
    ];
    let names: Vec<&str> = COLOURS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| cells.iter().any(|c| c.name == *name))
        .collect();
    let colour = |name: &str| {
        COLOURS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("#555555", |(_, c)| *c)
    };
    let medians: Vec<(usize, &str, f64, f64)> = cells
        .iter()
        .map(|cell| {
            let (mut rates, mut ratios) = (cell.rates.clone(), cell.ratios.clone());
            (
                cell.concurrency,
                cell.name,
                median(&mut rates),
                median(&mut ratios),
            )
        })
        .collect();
    let max = medians.iter().map(|m| m.2).fold(1.0_f64, f64::max);
    // A round top of the scale: 1, 2 or 5 times a power of ten.
    let magnitude = 10f64.powf(max.log10().floor());
    let top = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|t| *t >= max)
        .unwrap_or(max);
    let scale = PLOT_H / top;
    let width = LEFT + GROUP_W * options.concurrency.len() as f64 + 30.0;
    let height = TOP + PLOT_H + 80.0;
    let base = TOP + PLOT_H;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="#ffffff"/>
<text x="{x}" y="24" text-anchor="middle" font-size="16">Keyed POSTs per second by ledger and operations in flight (ratio to no ledger above each bar)</text>"##,
        x = width / 2.0,
    );
    let legend_w = 110.0;
    let legend_x = width / 2.0 - legend_w * names.len() as f64 / 2.0;
    for (i, name) in names.iter().enumerate() {
        let x = legend_x + i as f64 * legend_w;
        let _ = writeln!(
            out,
            r##"<rect x="{x:.1}" y="38" width="12" height="12" fill="{c}"/><text x="{tx:.1}" y="48">{label}</text>"##,
            c = colour(name),
            tx = x + 16.0,
            label = if *name == "none" { "no ledger" } else { name },
        );
    }
    for tick in 0..=4 {
        let value = top * f64::from(tick) / 4.0;
        let y = base - value * scale;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{x2:.1}" y2="{y:.1}" stroke="#dddddd"/>
<text x="{tx}" y="{ty:.1}" text-anchor="end">{value:.0}</text>"##,
            x2 = width - 30.0,
            tx = LEFT - 6.0,
            ty = y + 4.0,
        );
    }
    let bar_w = (GROUP_W - 40.0) / names.len() as f64;
    for (g, concurrency) in options.concurrency.iter().enumerate() {
        let gx = LEFT + g as f64 * GROUP_W + 20.0;
        for (i, name) in names.iter().enumerate() {
            let Some(&(_, _, rate, ratio)) =
                medians.iter().find(|m| m.0 == *concurrency && m.1 == *name)
            else {
                continue;
            };
            let h = rate * scale;
            let x = gx + i as f64 * bar_w;
            let _ = writeln!(
                out,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{h:.1}" fill="{c}"/>
<text x="{tx:.1}" y="{ly:.1}" text-anchor="middle" font-size="11">{ratio:.2}</text>"##,
                y = base - h,
                w = bar_w - 6.0,
                c = colour(name),
                tx = x + (bar_w - 6.0) / 2.0,
                ly = base - h - 4.0,
            );
        }
        let _ = writeln!(
            out,
            r##"<text x="{x:.1}" y="{y}" text-anchor="middle" font-size="13">{concurrency} in flight</text>"##,
            x = gx + (GROUP_W - 40.0) / 2.0,
            y = base + 22.0,
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{base}" x2="{x2:.1}" y2="{base}" stroke="#333"/>
<text x="{x}" y="{y}" text-anchor="middle" font-size="11" fill="#555">a new key per operation, one keep-alive loopback server; median of {rounds} interleaved rounds; every write on disk before it is answered; benches/ledger.rs</text>
</svg>"##,
        x2 = width - 30.0,
        x = width / 2.0,
        y = base + 56.0,
        rounds = options.rounds,
    );
    out
}
