//! The crate docs' defaults table (`# Defaults` in `src/lib.rs`) read against the code: every
//! row names a setting and its default, each default is read back from what `new()` builds,
//! the setter's own "Default:" line must state it too, and every setting checked here has its
//! row, so neither the one table users read nor the lines that repeat it can drift.

use std::time::Duration;

use http::HeaderName;
use idempotent_retry::ledger::{LeaseHeldPolicy, LedgerOptions};
use idempotent_retry::{Client, RetryBudgetConfig, RetryPolicy};

/// The crate docs as rustdoc reads them.
const CRATE_SOURCE: &str = include_str!("../../src/lib.rs");

/// Every setting the table must have a row for.
const SETTINGS: &[&str] = &[
    "RetryPolicy::with_max_attempts",
    "RetryPolicy::with_base_delay",
    "RetryPolicy::with_max_delay",
    "RetryPolicy::with_reconcile_window",
    "RetryPolicy::with_attempt_timeout",
    "RetryPolicy::with_max_retry_after",
    "RetryPolicy::with_max_in_progress_wait",
    "RetryBudgetConfig::with_capacity",
    "RetryBudgetConfig::with_retry_cost",
    "RetryBudgetConfig::with_timeout_cost",
    "RetryBudgetConfig::with_success_reward",
    "ClientBuilder::retry_budget",
    "ClientBuilder::key_header",
    "ClientBuilder::auto_keys",
    "ClientBuilder::redirects",
    "ClientBuilder::attempt_header",
    "ClientBuilder::ledger",
    "ClientBuilder::key_in_spans",
    "ClientBuilder::reconciler",
    "ClientBuilder::reconciler_for_scope",
    "LedgerOptions::retention",
    "LedgerOptions::lease",
    "LedgerOptions::max_body",
    "LedgerOptions::saved_headers",
    "LedgerOptions::on_lease_held",
    "LedgerOptions::worker",
    "LedgerOptions::call_timeout",
];

/// One row of the table: the setting's intra-doc link target, its default, the reason.
#[derive(Debug)]
struct Row {
    setting: String,
    value: String,
    why: String,
}

/// The rows of the table under `# Defaults` in the `//!` docs of `source`.
fn defaults_table(source: &str) -> Result<Vec<Row>, String> {
    let docs: Vec<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect();
    let start = docs
        .iter()
        .position(|line| *line == "# Defaults")
        .ok_or("the crate docs have no `# Defaults` section")?;
    let table: Vec<&str> = docs[start + 1..]
        .iter()
        .take_while(|line| !line.starts_with('#'))
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .copied()
        .collect();
    if table.first() != Some(&"| setting | default | why |")
        || table.get(1) != Some(&"|---|---|---|")
    {
        return Err(format!(
            "the defaults table has an unexpected header: {table:?}"
        ));
    }
    table[2..]
        .iter()
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [setting, value, why] = cells[..] else {
                return Err(format!("a row without three cells: {line}"));
            };
            let setting = setting
                .strip_prefix("[`")
                .and_then(|s| s.strip_suffix("`]"))
                .ok_or_else(|| format!("a setting that is not an intra-doc link: {setting}"))?;
            Ok(Row {
                setting: setting.to_owned(),
                value: value.to_owned(),
                why: why.to_owned(),
            })
        })
        .collect()
}

/// `5`
fn count(value: &str) -> Result<u32, String> {
    value.parse().map_err(|_| format!("not a count: {value:?}"))
}

/// `500 ms`, `30 s`, `24 h`, `7 days`
fn duration(value: &str) -> Result<Duration, String> {
    let (n, unit) = value
        .split_once(' ')
        .ok_or_else(|| format!("not a duration: {value:?}"))?;
    let n: u64 = n
        .parse()
        .map_err(|_| format!("not a duration: {value:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "min" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        "day" | "days" => Ok(Duration::from_secs(n * 86_400)),
        _ => Err(format!("not a duration unit: {value:?}")),
    }
}

/// `500 tokens`, `1 token`
fn tokens(value: &str) -> Result<u32, String> {
    match value.split_once(' ') {
        Some((n, "tokens" | "token")) => count(n),
        _ => Err(format!("not a number of tokens: {value:?}")),
    }
}

/// `64 KiB`
fn bytes(value: &str) -> Result<usize, String> {
    let (n, unit) = value
        .split_once(' ')
        .ok_or_else(|| format!("not a size: {value:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("not a size: {value:?}"))?;
    match unit {
        "B" | "bytes" => Ok(n),
        "KiB" => Ok(n * 1024),
        "MiB" => Ok(n * 1024 * 1024),
        _ => Err(format!("not a size unit: {value:?}")),
    }
}

/// `` `Content-Type` ``, also in a list: `` `Content-Type`, `Location` ``
fn headers(value: &str) -> Result<Vec<HeaderName>, String> {
    value
        .split(", ")
        .map(|name| {
            let name = name
                .strip_prefix('`')
                .and_then(|n| n.strip_suffix('`'))
                .ok_or_else(|| format!("not a header name in backticks: {name:?}"))?;
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("{name:?}: {e}"))
        })
        .collect()
}

/// `on` or `off`
fn switch(value: &str) -> Result<bool, String> {
    match value {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("neither on nor off: {value:?}")),
    }
}

fn expect<T: PartialEq + std::fmt::Debug>(setting: &str, table: T, code: T) -> Result<(), String> {
    if table == code {
        Ok(())
    } else {
        Err(format!(
            "{setting}: the table says {table:?}, the code {code:?}"
        ))
    }
}

/// Options with a fixed worker name, so two of them compare equal.
fn ledger_options() -> LedgerOptions {
    LedgerOptions::new().worker("docs")
}

/// Checks one row against the code.
fn check(row: &Row) -> Result<(), String> {
    let policy = RetryPolicy::new();
    let budget = RetryBudgetConfig::new();
    let client = Client::builder()
        .build()
        .map_err(|e| format!("the default builder builds: {e}"))?;
    let (setting, value) = (row.setting.as_str(), row.value.as_str());
    match setting {
        "RetryPolicy::with_max_attempts" => expect(setting, count(value)?, policy.max_attempts()),
        "RetryPolicy::with_base_delay" => expect(setting, duration(value)?, policy.base_delay()),
        "RetryPolicy::with_max_delay" => expect(setting, duration(value)?, policy.max_delay()),
        "RetryPolicy::with_reconcile_window" => {
            expect(setting, duration(value)?, policy.reconcile_window())
        }
        "RetryPolicy::with_attempt_timeout" => {
            expect(setting, duration(value)?, policy.attempt_timeout())
        }
        "RetryPolicy::with_max_retry_after" => {
            expect(setting, duration(value)?, policy.max_retry_after())
        }
        "RetryPolicy::with_max_in_progress_wait" => {
            expect(setting, duration(value)?, policy.max_in_progress_wait())?;
            // The reason quotes the limit as a multiple of the attempt timeout.
            let twice = row.why.starts_with("twice the attempt timeout");
            expect(
                "max_in_progress_wait is twice the attempt timeout",
                twice,
                policy.max_in_progress_wait() == policy.attempt_timeout() * 2,
            )
        }
        "RetryBudgetConfig::with_capacity" => {
            expect(setting, tokens(value)?, budget.capacity())?;
            // The reason quotes how many retries a full bucket pays for.
            let retries = row
                .why
                .split_once("pays for ")
                .and_then(|(_, rest)| rest.split_once(" retries"))
                .ok_or_else(|| format!("{setting}: the reason says how many retries it pays for"))?
                .0;
            expect(
                "retries a full bucket pays for",
                count(retries)?,
                budget.capacity() / budget.retry_cost(),
            )
        }
        "RetryBudgetConfig::with_retry_cost" => {
            expect(setting, tokens(value)?, budget.retry_cost())
        }
        "RetryBudgetConfig::with_timeout_cost" => {
            expect(setting, tokens(value)?, budget.timeout_cost())
        }
        "RetryBudgetConfig::with_success_reward" => {
            expect(setting, tokens(value)?, budget.success_reward())
        }
        "ClientBuilder::retry_budget" => {
            let on = client.retry_budget().map(|b| (b.config(), b.available()));
            let table = switch(value)?.then_some((budget, budget.capacity()));
            expect(setting, table, on)
        }
        "ClientBuilder::key_header" => {
            let [header] = &headers(value)?[..] else {
                return Err(format!("{setting}: one header, not {value:?}"));
            };
            expect(setting, header, client.key_header())
        }
        "ClientBuilder::auto_keys" => {
            // Setting the table's value on a default builder changes nothing.
            let table = format!("{:?}", Client::builder().auto_keys(switch(value)?));
            expect(setting, table, format!("{:?}", Client::builder()))
        }
        "ClientBuilder::redirects" => {
            let hops = value
                .strip_suffix(" hops")
                .ok_or_else(|| format!("{setting}: not a number of hops: {value:?}"))?;
            expect(setting, Some(count(hops)?), client.redirects().max_hops())?;
            let original = reqwest::Url::parse("https://api.example.com/v1/charges").unwrap();
            let same = reqwest::Url::parse("https://api.example.com/v2/charges").unwrap();
            let other = reqwest::Url::parse("https://eu.example.com/v1/charges").unwrap();
            let to_origin_only = row.why.contains("the key to the original origin only");
            expect(
                "the key to the original origin only",
                to_origin_only,
                client.redirects().allows_key_to(&original, &same)
                    && !client.redirects().allows_key_to(&original, &other),
            )
        }
        "ClientBuilder::attempt_header" => {
            let builder = format!("{:?}", Client::builder());
            let none = builder.contains("attempt_header: None");
            expect(setting, value == "none", none)
        }
        "ClientBuilder::ledger" => expect(setting, value == "none", client.ledger().is_none()),
        "ClientBuilder::key_in_spans" => {
            // Setting the table's value on a default builder changes nothing.
            let table = format!("{:?}", Client::builder().key_in_spans(switch(value)?));
            expect(setting, table, format!("{:?}", Client::builder()))
        }
        "ClientBuilder::reconciler" | "ClientBuilder::reconciler_for_scope" => {
            // No reconciler: the builder's debug output lists none, by default or by scope.
            let builder = format!("{:?}", Client::builder());
            let none = builder.contains("reconcilers: Reconcilers { default: None, by_scope: {} }");
            expect(setting, value == "none", none)
        }
        "LedgerOptions::retention" => expect(
            setting,
            ledger_options().retention(duration(value)?),
            ledger_options(),
        ),
        "LedgerOptions::call_timeout" => expect(
            setting,
            ledger_options().call_timeout(duration(value)?),
            ledger_options(),
        ),
        "LedgerOptions::lease" => expect(
            setting,
            ledger_options().lease(duration(value)?),
            ledger_options(),
        ),
        "LedgerOptions::max_body" => expect(
            setting,
            ledger_options().max_body(bytes(value)?),
            ledger_options(),
        ),
        "LedgerOptions::saved_headers" => expect(
            setting,
            ledger_options().saved_headers(headers(value)?),
            ledger_options(),
        ),
        "LedgerOptions::on_lease_held" => {
            let policy = match value {
                "[`LeaseHeldPolicy::WAIT`]" => LeaseHeldPolicy::WAIT,
                _ => return Err(format!("{setting}: not a known policy: {value:?}")),
            };
            expect(
                setting,
                ledger_options().on_lease_held(policy),
                ledger_options(),
            )
        }
        "LedgerOptions::worker" => {
            if value != "a random UUID" {
                return Err(format!("{setting}: not a known default: {value:?}"));
            }
            let (a, b) = (LedgerOptions::new(), LedgerOptions::new());
            if a == b {
                return Err(format!("{setting}: two defaults share a worker name"));
            }
            let debug = format!("{a:?}");
            let name = debug
                .split_once("worker: \"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .ok_or_else(|| format!("{setting}: no worker in {debug}"))?
                .0;
            expect(setting, true, is_uuid_v4(name))
        }
        _ => Err(format!("{setting}: a row this test does not check")),
    }
}

fn is_uuid_v4(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.concat().bytes().all(|b| b.is_ascii_hexdigit())
        && groups[2].starts_with('4')
}

/// The source files of the types whose setters the table names.
const SETTER_SOURCES: &[(&str, &str)] = &[
    ("RetryPolicy", include_str!("../../src/decision/policy.rs")),
    (
        "RetryBudgetConfig",
        include_str!("../../src/decision/budget.rs"),
    ),
    ("ClientBuilder", include_str!("../../src/client/mod.rs")),
    ("LedgerOptions", include_str!("../../src/ledger/options.rs")),
];

/// The "Default: ..." sentence that ends the docs of `setting` (`Type::method`), as one line.
fn setter_default_line(setting: &str) -> Result<String, String> {
    let (ty, method) = setting
        .split_once("::")
        .ok_or_else(|| format!("{setting}: not a `Type::method` path"))?;
    let source = SETTER_SOURCES
        .iter()
        .find(|(name, _)| *name == ty)
        .ok_or_else(|| format!("{setting}: no source file for {ty}"))?
        .1;
    // The type's own impl block: `Client` has getters named like `ClientBuilder`'s setters.
    let lines: Vec<&str> = source
        .lines()
        .skip_while(|line| *line != format!("impl {ty} {{"))
        .collect();
    let signature = lines
        .iter()
        .position(|line| {
            let line = line.trim_start();
            line.starts_with(&format!("pub fn {method}("))
                || line.starts_with(&format!("pub const fn {method}("))
                || line.starts_with(&format!("pub fn {method}<"))
        })
        .ok_or_else(|| format!("{setting}: no `pub fn {method}` in the source"))?;
    let docs: Vec<&str> = lines[..signature]
        .iter()
        .rev()
        .skip_while(|line| line.trim_start().starts_with("#["))
        .take_while(|line| line.trim_start().starts_with("///"))
        .map(|line| line.trim_start().trim_start_matches("///").trim())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let start = docs
        .iter()
        .position(|line| line.starts_with("Default:"))
        .ok_or_else(|| format!("{setting}: its docs have no \"Default:\" line"))?;
    Ok(docs[start..]
        .iter()
        .take_while(|line| !line.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" "))
}

/// The numbers and the backticked spans of a table value: what the setter's own "Default:"
/// line must repeat (`500 tokens` -> `500`, `` `Content-Type`, `Location` `` -> both names).
fn value_facts(value: &str) -> Vec<String> {
    let mut facts: Vec<String> = value
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .collect();
    facts.extend(value.split('`').skip(1).step_by(2).map(str::to_owned));
    facts
}

/// Checks that the setter's "Default:" line states the table's value.
fn check_setter_line(row: &Row) -> Result<(), String> {
    let line = setter_default_line(&row.setting)?;
    match value_facts(&row.value)
        .into_iter()
        .find(|fact| !line.contains(fact.as_str()))
    {
        None => Ok(()),
        Some(fact) => Err(format!(
            "{}: the table says {:?}, its setter's docs {line:?} (no {fact:?})",
            row.setting, row.value
        )),
    }
}

/// Every failure of the table in `source`, and the settings it has no row for.
fn drift(source: &str) -> Vec<String> {
    let rows = match defaults_table(source) {
        Ok(rows) => rows,
        Err(e) => return vec![e],
    };
    let mut failures: Vec<String> = rows.iter().filter_map(|row| check(row).err()).collect();
    failures.extend(rows.iter().filter_map(|row| check_setter_line(row).err()));
    for setting in SETTINGS {
        match rows.iter().filter(|row| row.setting == *setting).count() {
            1 => {}
            0 => failures.push(format!("{setting}: no row in the defaults table")),
            n => failures.push(format!("{setting}: {n} rows in the defaults table")),
        }
    }
    failures
}

#[test]
fn the_defaults_table_matches_the_code() {
    let failures = drift(CRATE_SOURCE);
    assert!(
        failures.is_empty(),
        "the defaults table drifted:\n{}",
        failures.join("\n")
    );
    assert_eq!(defaults_table(CRATE_SOURCE).unwrap().len(), SETTINGS.len());
}

#[test]
fn a_changed_value_a_missing_row_and_an_unknown_row_are_caught() {
    let changed = CRATE_SOURCE.replacen(
        "| [`RetryPolicy::with_max_attempts`] | 5 |",
        "| [`RetryPolicy::with_max_attempts`] | 6 |",
        1,
    );
    assert_ne!(changed, CRATE_SOURCE, "the row to change is in the table");
    assert_eq!(
        drift(&changed),
        [
            "RetryPolicy::with_max_attempts: the table says 6, the code 5",
            "RetryPolicy::with_max_attempts: the table says \"6\", its setter's docs \"Default: 5.\" (no \"6\")",
        ]
    );

    let slack = CRATE_SOURCE.replacen(
        "| [`LedgerOptions::lease`] | 10 s |",
        "| [`LedgerOptions::lease`] | 11 s |",
        1,
    );
    let slack = drift(&slack);
    assert_eq!(slack.len(), 2, "{slack:?}");
    assert!(
        slack
            .iter()
            .all(|f| f.starts_with("LedgerOptions::lease: the table says"))
    );

    let bound = CRATE_SOURCE.replacen("pays for 100 retries", "pays for 50 retries", 1);
    assert_eq!(
        drift(&bound),
        ["retries a full bucket pays for: the table says 50, the code 100"]
    );

    let missing: String = CRATE_SOURCE
        .lines()
        .filter(|line| !line.starts_with("//! | [`LedgerOptions::max_body`]"))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        drift(&missing),
        ["LedgerOptions::max_body: no row in the defaults table"]
    );

    let unknown = CRATE_SOURCE.replacen(
        "//! | [`ClientBuilder::ledger`]",
        "//! | [`ClientBuilder::sleeper`] | tokio's | a reason |\n//! | [`ClientBuilder::ledger`]",
        1,
    );
    assert_eq!(
        drift(&unknown),
        ["ClientBuilder::sleeper: a row this test does not check"]
    );
}

#[test]
fn a_setter_line_that_disagrees_with_the_table_is_caught() {
    let row = |setting: &str, value: &str| Row {
        setting: setting.to_owned(),
        value: value.to_owned(),
        why: String::new(),
    };
    assert_eq!(
        check_setter_line(&row("RetryPolicy::with_max_attempts", "5")),
        Ok(())
    );
    let drifted = check_setter_line(&row("RetryPolicy::with_max_attempts", "6"));
    assert!(
        drifted
            .as_ref()
            .is_err_and(|e| e.contains("its setter's docs \"Default: 5.\"")),
        "{drifted:?}"
    );
    assert_eq!(
        check_setter_line(&row(
            "LedgerOptions::saved_headers",
            "`Content-Type`, `Location`"
        )),
        Ok(())
    );
    assert!(check_setter_line(&row("LedgerOptions::saved_headers", "`Content-Type`")).is_ok());
    assert!(check_setter_line(&row("LedgerOptions::saved_headers", "`Etag`")).is_err());
    assert!(check_setter_line(&row("RetryPolicy::with_no_such_setting", "5")).is_err());
    assert_eq!(value_facts("500 tokens"), ["500"]);
    assert_eq!(value_facts("on"), Vec::<String>::new());
}

#[test]
fn the_value_parsers_read_the_tables_spellings_and_refuse_others() {
    assert_eq!(duration("500 ms"), Ok(Duration::from_millis(500)));
    assert_eq!(duration("24 h"), Ok(Duration::from_secs(86_400)));
    assert_eq!(duration("7 days"), Ok(Duration::from_secs(7 * 86_400)));
    assert!(duration("30s").is_err());
    assert!(duration("30 weeks").is_err());
    assert_eq!(tokens("1 token"), Ok(1));
    assert!(tokens("500").is_err());
    assert_eq!(bytes("64 KiB"), Ok(65_536));
    assert!(bytes("64 KB").is_err());
    assert_eq!(
        headers("`Content-Type`, `Location`"),
        Ok(vec![http::header::CONTENT_TYPE, http::header::LOCATION])
    );
    assert!(headers("Content-Type").is_err());
    assert_eq!(switch("on"), Ok(true));
    assert!(switch("yes").is_err());
    assert!(is_uuid_v4("3f2b8c1e-9d4a-4b6f-8e2a-1c3d5e7f9a0b"));
    assert!(!is_uuid_v4("not-a-uuid"));
    assert!(defaults_table("//! # Defaults\n//!\n//! | a | b |\n//! |---|---|\n").is_err());
    assert!(defaults_table("//! no table here").is_err());
}
