//! A fleet on one Redis: many limiter instances (separate `RateLimiter`s,
//! each with its own connection) share one global rule far above what one
//! Redis core checks call by call, served from local quotas
//! (`Rule::with_local_quota`).
//!
//! ```text
//! cargo bench -p ratelimit-benches --bench fleet                      # 20 instances, even and uneven load, with and without quotas
//! cargo bench -p ratelimit-benches --bench fleet -- --instances 40 --count 500000 --block 2000 --load 1.5
//! ```
//!
//! Each instance offers calls at a steady rate (paced every millisecond,
//! from `--tasks` tasks):
//! together `--load` times the rule's `count` a period, spread evenly, or
//! unevenly (instance `i` gets a share in proportion to `1 / (i + 1)`).
//! The rule is a fixed window of `--count` a `--period-ms`; a call that
//! passes is counted in the window it passed in (its end, from the
//! decision's `reset_after`). One JSON line per run:
//!
//! - `checks_per_sec`, `passes_per_sec`: calls answered, and passed;
//!   `errors_per_sec`: calls Redis did not answer in time (the failure
//!   policy is `deny`, so none is counted by an insurance limiter);
//! - `redis_calls_per_sec`: script calls Redis ran (`FCALL`, `EVALSHA`,
//!   `EVAL` in `INFO commandstats`: one per round trip of a check or a
//!   block), and `redis_commands_per_sec`: every command it ran (the
//!   scripts' own `GET`/`SET` included);
//! - `checks_per_redis_call`;
//! - `max_window_passes`: the most calls passed in any window (never over
//!   `count`), and `budget_used_mean`/`budget_used_min`: passes over
//!   `count` in the windows that lay wholly inside the run.
//!
//! `quota: false` lines are the same load checked call by call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimit_runtime::{OnError, RateLimiter, Rule};
use ratelimit_test_support::RedisServer;

struct Options {
    instances: usize,
    count: u64,
    period: Duration,
    block: u64,
    duration: Duration,
    load: f64,
    shapes: Vec<String>,
    compare: bool,
    tasks: usize,
}

const USAGE: &str = "\
usage: cargo bench -p ratelimit-benches --bench fleet -- [options]

  --instances N     limiter instances, each with its own connection (default 20)
  --count N         the global fixed window's count (default 1000000)
  --period-ms N     its period (default 1000)
  --block N         the local quota's largest block (default 5000)
  --duration-ms N   each run (default 5000)
  --load X          calls offered, as a multiple of count a period (default 1.2)
  --tasks N         tasks per instance sharing its rate, so calls checked one
                    by one have more in flight to coalesce (default 1)
  --shapes a,b      even, uneven (default both)
  --no-compare      skip the runs checked call by call
";

fn options() -> Options {
    let mut o = Options {
        instances: 20,
        count: 1_000_000,
        period: Duration::from_secs(1),
        block: 5_000,
        duration: Duration::from_secs(5),
        load: 1.2,
        shapes: vec!["even".into(), "uneven".into()],
        compare: true,
        tasks: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} takes a value"));
        match arg.as_str() {
            "--instances" => o.instances = value().parse().unwrap(),
            "--count" => o.count = value().parse().unwrap(),
            "--period-ms" => o.period = Duration::from_millis(value().parse().unwrap()),
            "--block" => o.block = value().parse().unwrap(),
            "--duration-ms" => o.duration = Duration::from_millis(value().parse().unwrap()),
            "--load" => o.load = value().parse().unwrap(),
            "--shapes" => o.shapes = value().split(',').map(str::to_owned).collect(),
            "--no-compare" => o.compare = false,
            "--tasks" => o.tasks = value().parse().unwrap(),
            "--bench" => {}
            "--help" | "-h" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            other => panic!("unknown option {other}\n{USAGE}"),
        }
    }
    o
}

/// Calls Redis ran: script calls, and every command.
fn redis_calls(server: &RedisServer) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    let (mut scripts, mut all) = (0, 0);
    for line in info.lines() {
        let Some((name, stats)) = line.split_once(':') else {
            continue;
        };
        let Some(calls) = stats
            .split("calls=")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .and_then(|s| s.parse::<u64>().ok())
        else {
            continue;
        };
        if name == "cmdstat_info" || name == "cmdstat_config|resetstat" {
            continue;
        }
        if ["cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval"].contains(&name) {
            scripts += calls;
        }
        all += calls;
    }
    (scripts, all)
}

/// What one instance saw: checks, and passes by the end of their window
/// (ms since the run's start).
struct Seen {
    checks: u64,
    errors: u64,
    passes: BTreeMap<u64, u64>,
}

async fn instance(
    limiter: RateLimiter,
    rule: Rule,
    key: String,
    rate: f64,
    start: Instant,
    duration: Duration,
) -> Seen {
    let mut seen = Seen {
        checks: 0,
        errors: 0,
        passes: BTreeMap::new(),
    };
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        let elapsed = start.elapsed();
        if elapsed >= duration {
            return seen;
        }
        let due = (rate * elapsed.as_secs_f64()) as u64;
        while seen.checks + seen.errors < due && start.elapsed() < duration {
            let Ok(decision) = limiter.check(&rule, &key).await else {
                seen.errors += 1;
                continue;
            };
            seen.checks += 1;
            // A request handler awaits I/O between checks: let the
            // limiter's connection (and the other instances) run.
            if seen.checks.is_multiple_of(64) {
                tokio::task::yield_now().await;
            }
            if decision.allowed {
                let end = (start.elapsed() + decision.reset_after).as_millis() as u64;
                *seen.passes.entry(end).or_default() += 1;
            }
        }
    }
}

async fn run(server: &RedisServer, o: &Options, shape: &str, quota: bool, run_id: usize) {
    let mut limiters = Vec::new();
    for _ in 0..o.instances {
        limiters.push(
            RateLimiter::builder()
                .redis(server.url().as_str())
                // A check Redis does not answer in time is an error, not a
                // pass of the in-process insurance limiter.
                .on_backend_error(OnError::Deny)
                .build()
                .await
                .expect("a limiter on the bench's redis-server"),
        );
    }
    let rule = Rule::fixed_window(o.count, o.period);
    let rule = if quota {
        rule.with_local_quota(o.block.min(o.count))
    } else {
        rule
    };
    let weights: Vec<f64> = (0..o.instances)
        .map(|i| match shape {
            "uneven" => 1.0 / (i as f64 + 1.0),
            _ => 1.0,
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let offered = o.load * o.count as f64 / o.period.as_secs_f64();
    let key = format!("limiter:fleet:{run_id}");
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
    let start = Instant::now() + Duration::from_millis(50);
    let tasks: Vec<_> = limiters
        .iter()
        .zip(&weights)
        .flat_map(|(limiter, w)| {
            let rate = offered * w / total / o.tasks as f64;
            (0..o.tasks).map(move |_| (limiter.clone(), rate))
        })
        .map(|(limiter, rate)| {
            tokio::spawn(instance(
                limiter,
                rule,
                key.clone(),
                rate,
                start,
                o.duration,
            ))
        })
        .collect();
    let (mut checks, mut errors) = (0, 0);
    let mut passes: BTreeMap<u64, u64> = BTreeMap::new();
    for task in tasks {
        let seen = task.await.unwrap();
        checks += seen.checks;
        errors += seen.errors;
        for (end, n) in seen.passes {
            *passes.entry(end).or_default() += n;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (scripts, commands) = redis_calls(server);

    // Windows by their end: Redis' windows of one key are a period or more
    // apart, and the ends seen of one window differ by a round trip.
    let period_ms = o.period.as_millis() as u64;
    let run_ms = o.duration.as_millis() as u64;
    let mut windows: Vec<(u64, u64)> = Vec::new();
    for (&end, &n) in &passes {
        match windows.last_mut() {
            Some((first, passed)) if end < *first + period_ms / 2 => *passed += n,
            _ => windows.push((end, n)),
        }
    }
    let whole: Vec<f64> = windows
        .iter()
        .filter(|(end, _)| *end >= period_ms && *end <= run_ms)
        .map(|(_, n)| *n as f64 / o.count as f64)
        .collect();
    let passed: u64 = passes.values().sum();
    let max_window = windows.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let mean = whole.iter().sum::<f64>() / whole.len().max(1) as f64;
    let min = whole.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{}",
        serde_json::json!({
            "shape": shape,
            "quota": quota,
            "instances": o.instances,
            "count": o.count,
            "period_ms": period_ms,
            "block": if quota { o.block } else { 0 },
            "offered_per_sec": offered.round(),
            "checks_per_sec": (checks as f64 / elapsed).round(),
            "passes_per_sec": (passed as f64 / elapsed).round(),
            "errors_per_sec": (errors as f64 / elapsed).round(),
            "redis_calls_per_sec": (scripts as f64 / elapsed).round(),
            "redis_commands_per_sec": (commands as f64 / elapsed).round(),
            "checks_per_redis_call": (checks as f64 / scripts.max(1) as f64 * 10.0).round() / 10.0,
            "max_window_passes": max_window,
            "over_count": max_window > o.count,
            "windows": whole.len(),
            "budget_used_mean": (mean * 1000.0).round() / 1000.0,
            "budget_used_min": if whole.is_empty() { 0.0 } else { (min * 1000.0).round() / 1000.0 },
        })
    );
}

fn main() {
    let o = options();
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let o = Arc::new(o);
    runtime.block_on(async {
        let mut run_id = 0;
        for shape in &o.shapes {
            for quota in [true, false] {
                if !quota && !o.compare {
                    continue;
                }
                run_id += 1;
                run(&server, &o, shape, quota, run_id).await;
            }
        }
    });
}
