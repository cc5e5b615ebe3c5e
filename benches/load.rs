//! Throughput against Redis: every algorithm at several concurrencies over
//! 1,000 keys, next to the raw floor (the seeds' INCR + PEXPIRE script called
//! with redis-rs directly, for the fixed window) and the Rust peers (actix-extensible-rate-limit's Redis
//! backend, actix-limitation), in one run on a redis-server this starts.
//!
//! ```text
//! cargo bench -p ratelimit-benches --bench load                                   # single node, everything
//! cargo bench -p ratelimit-benches --bench load -- --cluster                      # also a local 3-master cluster
//! cargo bench -p ratelimit-benches --bench load -- --duration-ms 500 --algorithms fixed_window,gcra --concurrency 1,64
//! cargo bench -p ratelimit-benches --bench load -- --no-baselines --no-single     # only what is asked
//! cargo bench -p ratelimit-benches --bench load -- --slices 1                     # each side in one go
//! cargo bench -p ratelimit-benches --bench load -- --sets --concurrency 1,16,64   # stacked rules
//! ```
//!
//! At each concurrency, everything compared (every algorithm; ours, ours per
//! call, the floor, the peers) takes turns: `--slices` turns (4 unless said)
//! of a quarter of `--duration-ms` each, so a drift of the machine falls on
//! every side alike. Lines come out one concurrency after another.
//!
//! Each run prints one JSON line: `{"backend", "algorithm", "concurrency",
//! "ops", "ops_per_sec", "p50_us", "p99_us", "redis_usec_per_call"}`, the
//! last from `INFO commandstats`: the server's own CPU time per check, all
//! the commands a check takes together, counted once (FCALL for us, EVALSHA
//! where the library cannot be loaded, whose time includes the commands the
//! function calls; MULTI + EXEC for the peers, EXEC's time including the
//! queued commands). For `concurrency` an op is acquire + release.
//! `ratelimit` is the limiter as built by default (checks that wait at the
//! same moment coalesced into one call); `ratelimit-per-call` is the same
//! with `.coalesce(false)`, one call per check, the same shape of call as
//! the floor. With `--cluster`, `ratelimit-cluster` and
//! `ratelimit-cluster-per-call` are the same on a local 3-master cluster
//! (coalesced per master, and not).
//!
//! Last, `redis-benchmark` (from redis-tools) measures the server's own
//! ceiling for the simplest fixed-window script: the seeds' INCR + PEXPIRE
//! by EVALSHA, pipelined, 256 calls on their way (backend
//! `redis-benchmark-ceiling`).
//!
//! With `--sets`, instead: one rule (`check`) against sets of 2 and 3 rules
//! (`check_all`: a per-user, a per-organisation and a global rule), in
//! process memory (backend `ratelimit-memory`) and on a redis-server
//! (`ratelimit`), as algorithms `set-1`, `set-2` and `set-3`.
//!
//! Set `RATELIMIT_REDIS_CPUS=1` to run redis-server pinned to core 1 (with
//! `taskset`), and start the bench itself under `taskset -c 0` to give each
//! side its own core.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_extensible_rate_limit::backend::{Backend as _, SimpleInput};
use ratelimit_runtime::{Algorithm, RateLimiter, Rule};
use ratelimit_test_support::{RedisCluster, RedisServer};

const KEYS: usize = 1_000;

struct Options {
    duration: Duration,
    algorithms: Vec<Algorithm>,
    concurrency: Vec<usize>,
    single: bool,
    cluster: bool,
    baselines: bool,
    slices: u32,
    sets: bool,
}

/// The seeds' fixed-window counter: `INCR`, and `PEXPIRE` at a window's
/// first call; -1 when over the limit. The floor a fixed window is measured
/// against: one EVALSHA of the simplest script, through redis-rs.
const SEED_SCRIPT: &str = "local used = redis.call('INCR', KEYS[1])
if used == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if used > tonumber(ARGV[1]) then return -1 end
return used";

/// What `--help` prints.
const USAGE: &str = "\
usage: cargo bench -p ratelimit-benches --bench load -- [options]

Starts its own redis-server and prints one JSON line per run to stdout:
{backend, algorithm, concurrency, ops, ops_per_sec, p50_us, p99_us, redis_usec_per_call}

options:
  --duration-ms N        time per algorithm and side at each concurrency (default 2000)
  --algorithms A,B,...   fixed_window, sliding_log, sliding_window, token_bucket, gcra,
                         concurrency (default: all)
  --concurrency N,M,...  tasks at once (default 1,16,64,256)
  --slices N             turns the sides take, each of duration/N (default 4)
  --cluster              also a local 3-master Redis Cluster
  --no-single            not the single server (with --cluster: the cluster alone)
  --no-baselines         not the raw redis-rs floor nor the peers
  --sets                 only: one rule against sets of 2 and 3 rules, in memory and on Redis
  --help                 this text
";

/// Stops with `message` and the usage (exit status 2).
fn usage_error(message: &str) -> ! {
    eprintln!("error: {message}\n\n{USAGE}");
    std::process::exit(2)
}

fn options() -> Options {
    let mut options = Options {
        duration: Duration::from_millis(2000),
        algorithms: Algorithm::ALL.to_vec(),
        concurrency: vec![1, 16, 64, 256],
        single: true,
        cluster: false,
        baselines: true,
        slices: 4,
        sets: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage_error(&format!("{arg} needs a value")))
        };
        let number = |text: String, what: &str| -> u64 {
            text.parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                usage_error(&format!(
                    "{what}: expected a whole number above 0, got `{text}`"
                ))
            })
        };
        match arg.as_str() {
            "--duration-ms" => {
                options.duration = Duration::from_millis(number(value(), "--duration-ms"))
            }
            "--algorithms" => {
                options.algorithms = value()
                    .split(',')
                    .map(|name| {
                        *Algorithm::ALL
                            .iter()
                            .find(|a| a.name() == name)
                            .unwrap_or_else(|| usage_error(&format!("unknown algorithm `{name}`")))
                    })
                    .collect()
            }
            "--concurrency" => {
                options.concurrency = value()
                    .split(',')
                    .map(|n| number(n.to_owned(), "--concurrency") as usize)
                    .collect()
            }
            "--slices" => options.slices = number(value(), "--slices").min(1000) as u32,
            "--cluster" => options.cluster = true,
            "--no-single" => options.single = false,
            "--no-baselines" => options.baselines = false,
            "--sets" => options.sets = true,
            "--help" | "-h" => {
                print!("{USAGE}");
                std::process::exit(0)
            }
            // cargo bench passes --bench.
            "--bench" => {}
            unknown if unknown.starts_with('-') => {
                usage_error(&format!("unknown option `{unknown}`"))
            }
            // Criterion-style filters (as `cargo bench` passes to every bench) are ignored.
            _ => {}
        }
    }
    options
}

/// A rule that never refuses in a run, so every call is a full
/// check-and-consume (a write).
fn rule(algorithm: Algorithm) -> Rule {
    match algorithm {
        // Small windows keep the sliding log's sets short, as in real use.
        Algorithm::SlidingLog => Rule::new(algorithm, 1_000_000_000, Duration::from_millis(10)),
        _ => Rule::new(algorithm, 1_000_000_000, Duration::from_secs(1)),
    }
}

/// What one run measured.
#[derive(Default)]
struct Run {
    ops: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

impl Run {
    fn add(&mut self, slice: Run) {
        self.ops += slice.ops;
        self.elapsed += slice.elapsed;
        self.latencies_us.extend(slice.latencies_us);
    }
}

/// Runs `call(task, n)` from `concurrency` tasks for `duration`.
async fn drive<F, Fut>(concurrency: usize, duration: Duration, call: F) -> Run
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let call = Arc::new(call);
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let call = Arc::clone(&call);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(4096);
                let mut n = 0;
                while Instant::now() < deadline {
                    let started = Instant::now();
                    call(task, n).await;
                    latencies.push(started.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for task in tasks {
        latencies_us.extend(task.await.expect("a load task"));
    }
    Run {
        ops: latencies_us.len() as u64,
        elapsed: start.elapsed(),
        latencies_us,
    }
}

fn key(task: usize, n: usize) -> String {
    format!("limiter:load:{}", (task * 7919 + n) % KEYS)
}

/// The Redis side: where to reset and read command stats.
enum Server {
    Single(RedisServer),
    Cluster(RedisCluster),
}

impl Server {
    fn nodes(&self) -> Vec<&RedisServer> {
        match self {
            Server::Single(server) => vec![server],
            Server::Cluster(cluster) => cluster.nodes.iter().collect(),
        }
    }

    fn reset_stats(&self) {
        for node in self.nodes() {
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query(&mut node.connection())
                .expect("CONFIG RESETSTAT");
        }
    }

    /// The server's CPU time, in µs, over all nodes, in the commands the
    /// client sent itself (`sent`): the commands a script or a transaction
    /// runs are listed too, but their time is already in EVALSHA's or
    /// EXEC's, so they are not added again.
    fn usec_total(&self, sent: &[&str]) -> f64 {
        let mut usec = 0.0;
        for node in self.nodes() {
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut node.connection())
                .expect("INFO commandstats");
            for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
                let name = line.split(':').next().unwrap_or_default();
                if !sent
                    .iter()
                    .any(|s| name.strip_prefix("cmdstat_") == Some(s))
                {
                    continue;
                }
                let field = |key: &str| {
                    line.split(&[':', ','][..])
                        .find_map(|kv| kv.strip_prefix(key))
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0)
                };
                usec += field("usec=");
            }
        }
        usec
    }

    fn flush(&self) {
        for node in self.nodes() {
            let _ = redis::cmd("FLUSHALL").query::<()>(&mut node.connection());
        }
    }
}

/// One JSON line; `redis_usec_per_call` is the server's CPU time per check
/// (whatever commands a check takes).
fn report(backend: &str, algorithm: &str, concurrency: usize, mut run: Run, usec_total: f64) {
    let usec_per_call = if run.ops == 0 {
        0.0
    } else {
        usec_total / run.ops as f64
    };
    run.latencies_us.sort_unstable();
    let percentile = |p: f64| {
        let i = ((run.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        run.latencies_us.get(i).copied().unwrap_or(0)
    };
    println!(
        "{{\"backend\":\"{backend}\",\"algorithm\":\"{algorithm}\",\"concurrency\":{concurrency},\
         \"ops\":{},\"ops_per_sec\":{:.0},\"p50_us\":{},\"p99_us\":{},\"redis_usec_per_call\":{:.2}}}",
        run.ops,
        run.ops as f64 / run.elapsed.as_secs_f64(),
        percentile(0.50),
        percentile(0.99),
        usec_per_call,
    );
}

/// The server's own ceiling for the simplest fixed-window script:
/// `redis-benchmark` sending `EVALSHA` of the seeds' INCR + PEXPIRE script
/// over the same 1,000 keys, 16 connections each 16 calls deep (256 on
/// their way), for about `duration`. One JSON line, backend
/// `redis-benchmark-ceiling` (its concurrency: the calls on their way).
fn ceiling(server: &Server, redis: &RedisServer, duration: Duration) {
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SEED_SCRIPT)
        .query(&mut redis.connection())
        .expect("SCRIPT LOAD");
    // About 300k calls a second here: enough calls for the duration.
    let calls = (duration.as_secs_f64() * 300_000.0) as u64;
    server.flush();
    server.reset_stats();
    let output = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &redis.port().to_string(),
            "-c",
            "16",
            "-P",
            "16",
            "-r",
            "1000",
        ])
        .args(["-n", &calls.to_string(), "--csv", "EVALSHA", &sha, "1"])
        .args(["limiter:load:__rand_int__", "1000000000", "1000"])
        .output()
        .unwrap_or_else(|error| {
            eprintln!("error: redis-benchmark: {error}: apt-get install -y redis-tools");
            std::process::exit(1)
        });
    assert!(
        output.status.success(),
        "redis-benchmark failed: {output:?}"
    );
    // `"test","rps",...` then `"EVALSHA ...","312500.00",...`.
    let csv = String::from_utf8_lossy(&output.stdout);
    let rps: f64 = csv
        .lines()
        .nth(1)
        .and_then(|line| line.split(',').nth(1))
        .and_then(|rps| rps.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("redis-benchmark's CSV: {csv}"));
    let usec = server.usec_total(&["evalsha"]) / calls as f64;
    println!(
        "{{\"backend\":\"redis-benchmark-ceiling\",\"algorithm\":\"fixed_window\",\"concurrency\":256,\
         \"ops\":{calls},\"ops_per_sec\":{rps:.0},\"p50_us\":0,\"p99_us\":0,\"redis_usec_per_call\":{usec:.2}}}"
    );
}

/// What a check of ours sends: one FCALL of the function library (an
/// EVALSHA where it cannot be loaded), a release too; with coalescing, a
/// part of a batch, whose time includes it.
const OURS: &[&str] = &["evalsha", "fcall"];
/// What the peers send: a MULTI/EXEC transaction.
const TRANSACTION: &[&str] = &["multi", "exec"];

/// One side of a comparison.
enum Contender {
    /// This crate's limiter: acquire (a check) and release.
    Ours {
        name: &'static str,
        limiter: RateLimiter,
        sent: &'static [&'static str],
    },
    /// The floor: the algorithm's own script, called with redis-rs directly
    /// (one multiplexed connection, `Script::invoke_async`), no framework
    /// around it.
    Raw(redis::aio::MultiplexedConnection),
    /// actix-extensible-rate-limit's Redis backend, as its docs show it.
    Extensible(actix_extensible_rate_limit::backend::redis::RedisBackend),
    /// actix-limitation, as its docs show it.
    Limitation(Arc<actix_limitation::Limiter>),
}

impl Contender {
    fn name(&self) -> &'static str {
        match self {
            Contender::Ours { name, .. } => name,
            Contender::Raw(_) => "redis-rs-seed-script",
            Contender::Extensible(_) => "actix-extensible-rate-limit",
            Contender::Limitation(_) => "actix-limitation",
        }
    }

    /// The commands it sends itself (see [`Server::usec_total`]).
    fn sent(&self) -> &'static [&'static str] {
        match self {
            Contender::Ours { sent, .. } => sent,
            Contender::Raw(_) => &["evalsha"],
            Contender::Extensible(_) | Contender::Limitation(_) => TRANSACTION,
        }
    }

    /// Whether it can run `algorithm` (the peers have a fixed window only;
    /// a lease needs its release too, so no single script is its floor).
    fn runs(&self, algorithm: Algorithm) -> bool {
        match self {
            Contender::Ours { .. } => true,
            Contender::Raw(_) => algorithm == Algorithm::FixedWindow,
            Contender::Extensible(_) | Contender::Limitation(_) => {
                algorithm == Algorithm::FixedWindow
            }
        }
    }

    /// Load for `duration`.
    async fn drive(&self, algorithm: Algorithm, concurrency: usize, duration: Duration) -> Run {
        let rule = rule(algorithm);
        match self {
            Contender::Ours { limiter, .. } => {
                let limiter = limiter.clone();
                drive(concurrency, duration, move |task, n| {
                    let limiter = limiter.clone();
                    async move {
                        let key = key(task, n);
                        let permit = limiter.acquire(&rule, &key, 1).await.expect("a decision");
                        assert!(permit.decision().allowed, "the bench rule never refuses");
                        permit.release().await.expect("released");
                    }
                })
                .await
            }
            Contender::Raw(conn) => {
                let script = Arc::new(redis::Script::new(SEED_SCRIPT));
                let conn = conn.clone();
                drive(concurrency, duration, move |task, n| {
                    let (mut conn, script) = (conn.clone(), Arc::clone(&script));
                    async move {
                        let used: i64 = script
                            .key(key(task, n))
                            .arg(rule.count())
                            .arg(rule.period().as_millis() as u64)
                            .invoke_async(&mut conn)
                            .await
                            .expect("the script runs");
                        assert!(used > 0, "the bench rule never refuses");
                    }
                })
                .await
            }
            Contender::Extensible(backend) => {
                let backend = backend.clone();
                drive(concurrency, duration, move |task, n| {
                    let backend = backend.clone();
                    async move {
                        let input = SimpleInput {
                            interval: Duration::from_secs(1),
                            max_requests: 1_000_000_000,
                            key: key(task, n),
                        };
                        let (decision, _, _) = backend.request(input).await.expect("a decision");
                        assert!(decision.is_allowed());
                    }
                })
                .await
            }
            Contender::Limitation(limiter) => {
                let limiter = Arc::clone(limiter);
                drive(concurrency, duration, move |task, n| {
                    let limiter = Arc::clone(&limiter);
                    async move {
                        limiter.count(key(task, n)).await.expect("counted");
                    }
                })
                .await
            }
        }
    }
}

/// Runs, at one concurrency, every algorithm asked for on every contender
/// that can run it, for `duration` each, in `slices` turns (each its share
/// of the time, in the same order every turn, from empty keys), and prints
/// one line each. Taking turns spreads a drift of the machine, which here
/// moves throughput by 10-40 % within minutes, over all sides alike: the
/// ratios between contenders and between algorithms' server costs are
/// measured over the same stretch of time.
async fn compare(
    server: &Server,
    contenders: &[Contender],
    algorithms: &[Algorithm],
    concurrency: usize,
    duration: Duration,
    slices: u32,
) {
    let sides: Vec<(Algorithm, &Contender)> = algorithms
        .iter()
        .flat_map(|&algorithm| {
            contenders
                .iter()
                .filter(move |c| c.runs(algorithm))
                .map(move |c| (algorithm, c))
        })
        .collect();
    let mut totals: Vec<(Run, f64)> = sides.iter().map(|_| Default::default()).collect();
    for _ in 0..slices.max(1) {
        for (&(algorithm, contender), (run, usec)) in sides.iter().zip(&mut totals) {
            server.flush();
            server.reset_stats();
            run.add(
                contender
                    .drive(algorithm, concurrency, duration / slices.max(1))
                    .await,
            );
            *usec += server.usec_total(contender.sent());
        }
    }
    for ((algorithm, contender), (run, usec)) in sides.into_iter().zip(totals) {
        report(contender.name(), algorithm.name(), concurrency, run, usec);
    }
}

/// [`compare`] at every concurrency asked for.
async fn compare_all(server: &Server, contenders: &[Contender], options: &Options) {
    for &concurrency in &options.concurrency {
        compare(
            server,
            contenders,
            &options.algorithms,
            concurrency,
            options.duration,
            options.slices,
        )
        .await;
    }
}

async fn peers(url: &str) -> [Contender; 2] {
    let client = redis026::Client::open(url).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    [
        Contender::Extensible(
            actix_extensible_rate_limit::backend::redis::RedisBackend::builder(manager).build(),
        ),
        Contender::Limitation(Arc::new(
            actix_limitation::Limiter::builder(url)
                .limit(1_000_000_000)
                .period(Duration::from_secs(1))
                .build()
                .unwrap(),
        )),
    ]
}

async fn connect(builder: ratelimit_runtime::RateLimiterBuilder) -> RateLimiter {
    builder
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .expect("connecting")
}

/// `--sets`: at each concurrency, one rule (`check`) against a set of 2 and
/// of 3 rules (`check_all`), in memory and on Redis, taking turns as
/// [`compare`] does. A call of user `k` draws on `k`'s budget, on its
/// organisation's (one of 50) and on the global one.
async fn sets(options: &Options) {
    let server = Server::Single(RedisServer::start());
    let Server::Single(redis) = &server else {
        unreachable!()
    };
    let on_redis = connect(RateLimiter::builder().redis(redis.url().as_str())).await;
    let sides = [
        ("ratelimit-memory", RateLimiter::in_memory(), false),
        ("ratelimit", on_redis, true),
    ];
    let rule = rule(Algorithm::FixedWindow);
    for &concurrency in &options.concurrency {
        let mut totals: Vec<(Run, f64)> = (0..6).map(|_| Default::default()).collect();
        for _ in 0..options.slices.max(1) {
            for (side, (_, limiter, redis)) in sides.iter().enumerate() {
                for rules in 1..=3 {
                    if *redis {
                        server.flush();
                        server.reset_stats();
                    }
                    let limiter = limiter.clone();
                    let run = drive(
                        concurrency,
                        options.duration / options.slices.max(1),
                        move |task, n| {
                            let limiter = limiter.clone();
                            async move {
                                let user = key(task, n);
                                let allowed = if rules == 1 {
                                    limiter
                                        .check(&rule, &user)
                                        .await
                                        .expect("a decision")
                                        .allowed
                                } else {
                                    let org =
                                        format!("limiter:load:org:{}", (task * 7919 + n) % 50);
                                    let set = [
                                        (&rule, user.as_str(), 1),
                                        (&rule, org.as_str(), 1),
                                        (&rule, "limiter:load:global", 1),
                                    ];
                                    let verdict =
                                        limiter.check_all(&set[..rules]).await.expect("a verdict");
                                    verdict.allowed()
                                };
                                assert!(allowed, "the bench rule never refuses");
                            }
                        },
                    )
                    .await;
                    let (total, usec) = &mut totals[side * 3 + rules - 1];
                    total.add(run);
                    if *redis {
                        *usec += server.usec_total(OURS);
                    }
                }
            }
        }
        for (i, (run, usec)) in totals.into_iter().enumerate() {
            let algorithm = format!("set-{}", i % 3 + 1);
            report(sides[i / 3].0, &algorithm, concurrency, run, usec);
        }
    }
}

fn main() {
    let options = options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if options.sets {
            sets(&options).await;
            return;
        }
        if options.single {
            let server = Server::Single(RedisServer::start());
            let url = match &server {
                Server::Single(s) => s.url(),
                Server::Cluster(_) => unreachable!(),
            };
            let limiter = connect(RateLimiter::builder().redis(url.as_str())).await;
            let mut contenders = vec![Contender::Ours {
                name: "ratelimit",
                limiter: limiter.clone(),
                sent: OURS,
            }];
            if options.baselines {
                contenders.push(Contender::Ours {
                    name: "ratelimit-per-call",
                    limiter: connect(RateLimiter::builder().redis(url.as_str()).coalesce(false))
                        .await,
                    sent: OURS,
                });
                contenders.push(Contender::Raw(
                    redis::Client::open(url.as_str())
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap(),
                ));
                contenders.extend(peers(&url).await);
            }
            // A second of load first, not reported: the first runs of a
            // fresh process and server otherwise measure their warm-up
            // (seen as a third fewer checks per second).
            let warm = limiter.clone();
            let rule = rule(Algorithm::FixedWindow);
            drive(64, Duration::from_secs(1), move |task, n| {
                let limiter = warm.clone();
                async move {
                    limiter
                        .check(&rule, &key(task, n))
                        .await
                        .expect("a decision");
                }
            })
            .await;
            // What is compared runs in turns, so a drift of the machine
            // during the bench falls on all sides alike.
            compare_all(&server, &contenders, &options).await;
            if options.baselines
                && options.algorithms.contains(&Algorithm::FixedWindow)
                && let Server::Single(redis) = &server
            {
                ceiling(&server, redis, options.duration);
            }
        }
        if options.cluster {
            let cluster = RedisCluster::start();
            let urls = cluster.urls();
            let server = Server::Cluster(cluster);
            let contenders = [
                Contender::Ours {
                    name: "ratelimit-cluster",
                    limiter: connect(RateLimiter::builder().redis(urls.clone())).await,
                    sent: OURS,
                },
                Contender::Ours {
                    name: "ratelimit-cluster-per-call",
                    limiter: connect(RateLimiter::builder().redis(urls).coalesce(false)).await,
                    sent: OURS,
                },
            ];
            compare_all(&server, &contenders, &options).await;
        }
    });
}
