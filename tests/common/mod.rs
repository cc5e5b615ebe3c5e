//! Scenarios shared by the single-node, cluster and memory tests.
#![allow(dead_code, unreachable_pub, unused_imports, unused_macros)]

use std::time::Duration;

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{
    Algorithm, Backend, Decision, ManualClock, RateLimiter, RateLimiterBuilder, Rule,
};
use ratelimit_test_support::{RedisCluster, RedisServer};

/// 2023-11-14 in µs since the Unix epoch: sixteen digits, as Redis' TIME.
pub const EPOCH_US: u64 = 1_700_000_000_000_000;

/// A small deterministic generator, so a failure names a reproducible seed.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub async fn redis_backend(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(
        &server.url(),
        ConnectOptions {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            ..ConnectOptions::default()
        },
    )
    .await
    .expect("connecting to the test redis-server")
}

/// A backend that loads no function library: checks alone go by `EVALSHA`
/// of their rule's script, as on a server before Redis 7.
pub async fn redis_backend_without_functions(server: &RedisServer) -> RedisBackend {
    let options = ConnectOptions {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        functions: false,
        ..ConnectOptions::default()
    };
    RedisBackend::connect(&server.url(), options)
        .await
        .expect("connecting to the test redis-server")
}

fn rules(algorithm: Algorithm) -> Vec<Rule> {
    let shapes = [
        (1, 1, 1_000),
        (3, 5, 7),
        (5, 2, 1_000),
        (50, 50, 60_000),
        (7, 3, 333),
    ];
    shapes
        .into_iter()
        .map(|(count, burst, period_ms)| {
            let rule = Rule::new(algorithm, count, Duration::from_millis(period_ms));
            if algorithm.has_burst() {
                rule.with_burst(burst)
            } else {
                rule
            }
        })
        .collect()
}

/// Runs 400 random calls (3 keys, random costs and time steps) per rule on
/// the memory backend and on `redis` (a single node or a cluster) and
/// compares every decision.
pub async fn same_decisions(redis: &RedisBackend, algorithm: Algorithm) {
    for (r, rule) in rules(algorithm).into_iter().enumerate() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_micros(EPOCH_US));
        let memory = MemoryBackend::with_clock(clock.clone());
        let mut now = EPOCH_US;
        let mut random = XorShift(0x9E37_79B9_7F4A_7C15 ^ r as u64);
        let period = rule.period().as_micros() as u64;
        let mut held: Vec<(String, u64, u64)> = Vec::new();
        let mut last: Option<Decision> = None;
        for step in 0..400 {
            let micros = |d: Duration| d.as_micros() as u64;
            // Random steps, and steps that land exactly on the boundaries the
            // last decision named (where off-by-one mistakes live).
            let advance = match (random.below(8), last) {
                (0, _) => 0,
                (1, _) => random.below(period / 4 + 1),
                (2, _) => random.below(period + 2),
                (3, _) => period,
                (4, Some(d)) => micros(d.retry_after),
                (5, Some(d)) => micros(d.reset_after),
                (6, Some(d)) => micros(d.reset_after).saturating_sub(1),
                _ => 1,
            };
            clock.advance(Duration::from_micros(advance));
            now += advance;
            let key = format!("limiter:{}:{r}:{}", algorithm.name(), random.below(3));
            let cost = 1 + random.below(rule.capacity().min(4));
            let at = Duration::from_micros(now);
            let (from_memory, from_redis): (Decision, Decision) =
                if algorithm == Algorithm::Concurrency {
                    let lease = step as u64 + 1;
                    let m = Backend::acquire(&memory, &rule, &key, cost, lease)
                        .await
                        .unwrap();
                    let d = redis
                        .acquire_at(&rule, &key, cost, lease, at)
                        .await
                        .unwrap();
                    if m.allowed {
                        held.push((key.clone(), cost, lease));
                    }
                    // Now and then a call ends and gives its lease back.
                    if !held.is_empty() && random.below(3) == 0 {
                        let (key, cost, lease) =
                            held.swap_remove(random.below(held.len() as u64) as usize);
                        Backend::release(&memory, &rule, &key, cost, lease)
                            .await
                            .unwrap();
                        Backend::release(redis, &rule, &key, cost, lease)
                            .await
                            .unwrap();
                    }
                    (m, d)
                } else {
                    (
                        memory.check_now(&rule, &key, cost),
                        redis.check_at(&rule, &key, cost, at).await.unwrap(),
                    )
                };
            assert_eq!(
                from_redis, from_memory,
                "{algorithm:?} {rule:?}: step {step}, key {key}, cost {cost}, now {now}"
            );
            last = Some(from_memory);
        }
    }
}

/// A limiter on a fresh redis-server or cluster, or in memory on a manual clock.
pub struct Subject {
    pub limiter: RateLimiter,
    clock: Option<ManualClock>,
    server: Option<RedisServer>,
    cluster: Option<RedisCluster>,
}

impl Subject {
    pub fn memory() -> Subject {
        let clock = ManualClock::new();
        Subject {
            limiter: RateLimiter::in_memory_with_clock(clock.clone()),
            clock: Some(clock),
            server: None,
            cluster: None,
        }
    }

    pub async fn cluster(cluster: RedisCluster) -> Subject {
        let limiter = RateLimiter::builder()
            .redis(cluster.urls())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        Subject {
            limiter,
            clock: None,
            server: None,
            cluster: Some(cluster),
        }
    }

    /// Waits until a window of `period` has just begun on the server's clock
    /// (a manual clock stands still: nothing to wait for), so that the calls
    /// that follow fall in one window.
    async fn at_start_of_window(&self, period: Duration) {
        let url = match (&self.server, &self.cluster) {
            (Some(server), _) => server.url(),
            (_, Some(cluster)) => cluster.urls()[0].clone(),
            _ => return,
        };
        let mut conn = redis::Client::open(url)
            .and_then(|client| client.get_connection())
            .expect("a connection to the test server");
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
        let period = period.as_micros() as u64;
        let into = (secs * 1_000_000 + micros) % period;
        tokio::time::sleep(Duration::from_micros(period - into + 20_000)).await;
    }

    /// Every key under the prefix has a TTL.
    pub fn assert_ttls(&self) {
        let keys = match (&self.server, &self.cluster) {
            (Some(server), _) => server.keys_with_pttl("limiter:*"),
            (_, Some(cluster)) => cluster.keys_with_pttl("limiter:*"),
            _ => return,
        };
        // -1: no TTL. (-2: gone between KEYS and PTTL, which is fine.)
        let without: Vec<_> = keys.iter().filter(|(_, pttl)| *pttl == -1).collect();
        assert!(without.is_empty(), "keys without a TTL: {without:?}");
    }

    pub async fn redis() -> Subject {
        let server = RedisServer::start();
        let limiter = RateLimiter::builder()
            .redis(server.url())
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        Subject {
            limiter,
            clock: None,
            server: Some(server),
            cluster: None,
        }
    }

    async fn wait(&self, by: Duration) {
        match &self.clock {
            Some(clock) => clock.advance(by),
            None => tokio::time::sleep(by).await,
        }
    }
}

/// Three calls per 600 ms pass, the fourth is refused, the budget returns;
/// keys stay with a TTL throughout.
pub async fn count_pass_then_refused_then_budget_returns(subject: &Subject, algorithm: Algorithm) {
    let period = Duration::from_millis(600);
    let rule = Rule::new(algorithm, 3, period);
    let key = format!("limiter:scenario:{}", algorithm.name());
    let limiter = &subject.limiter;
    if algorithm == Algorithm::SlidingWindow {
        // Its previous window's calls count less, by whole calls, as soon as
        // the next window begins: four calls across a window's start may
        // rightly all pass.
        subject.at_start_of_window(period).await;
    }
    let mut permits = Vec::new();
    for expected_remaining in [2, 1, 0] {
        let permit = limiter.acquire(&rule, &key, 1).await.unwrap();
        let decision = *permit.decision();
        assert!(decision.allowed, "{algorithm:?}: {decision:?}");
        assert_eq!(decision.remaining, expected_remaining, "{algorithm:?}");
        permits.push(permit);
    }
    let refused = *limiter.acquire(&rule, &key, 1).await.unwrap().decision();
    assert!(!refused.allowed, "{algorithm:?}: {refused:?}");
    assert!(
        refused.retry_after > Duration::ZERO && refused.retry_after <= 2 * period,
        "{algorithm:?}: {refused:?}"
    );
    subject.assert_ttls();
    if algorithm == Algorithm::Concurrency {
        // A call ends: its lease comes back at once.
        permits.pop().unwrap().release().await.unwrap();
    } else {
        // The two-counter window needs its previous window to fade too.
        let wait = if algorithm == Algorithm::SlidingWindow {
            2 * period
        } else {
            period
        };
        subject.wait(wait + Duration::from_millis(60)).await;
    }
    let again = *limiter.acquire(&rule, &key, 1).await.unwrap().decision();
    assert!(
        again.allowed,
        "{algorithm:?}: the budget returns: {again:?}"
    );
    if let Some(server) = &subject.server {
        server.assert_all_keys_expire("limiter:*");
    }
}

/// Builds a limiter on a runtime that then ends (a start-up runtime, or one
/// `#[tokio::test]` whose limiter the next one uses) and checks it from a new
/// one: rounds of 32 checks at once (on one server most wait for a batch),
/// keys `<prefix>0` to `<prefix>31`, until a round passes whole. Answers how
/// many rounds that took; panics if none of 20 did. The first check after
/// the runtime ended may fail (its connection is made again).
pub fn rounds_until_it_outlives_its_runtime(builder: RateLimiterBuilder, prefix: &str) -> usize {
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = first.block_on(builder.build()).unwrap();
    drop(first);
    let second = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    second.block_on(async {
        for round in 1..=20 {
            let checks: Vec<_> = (0..32)
                .map(|i| {
                    let (limiter, key) = (limiter.clone(), format!("{prefix}{i}"));
                    tokio::spawn(async move { limiter.check(&rule, &key).await })
                })
                .collect();
            let mut failed = 0;
            for check in checks {
                failed += usize::from(check.await.unwrap().is_err());
            }
            if failed == 0 {
                return round;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        panic!("no round of checks passed whole after the runtime it was built on ended");
    })
}

/// A structured-field list (RFC 8941) parsed: each item's string value and
/// its integer parameters.
pub fn sf_list(value: &str) -> Vec<(String, std::collections::BTreeMap<String, i64>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .expect("a structured field list");
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .expect("a string")
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_owned(),
                            v.as_integer().expect("an integer").into(),
                        )
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("no inner lists expected"),
        })
        .collect()
}

/// Integer parameters, to compare with [`sf_list`]'s.
pub fn params(pairs: &[(&str, i64)]) -> std::collections::BTreeMap<String, i64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Tasks checking keys round-robin until stopped (see [`load`]).
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Vec<u64>>>,
    keys: usize,
}

/// Starts `tasks` tasks, each checking the `keys` (each under its rule,
/// cost 1) round-robin, `step` keys at a time from its own place, on the
/// backend `backend(task)` gives it, until [`Load::stop`]. Every check
/// must be answered and allowed (the rules hold more than the load takes).
pub fn load(
    tasks: usize,
    step: usize,
    keys: std::sync::Arc<Vec<(String, Rule)>>,
    backend: impl Fn(usize) -> RedisBackend,
) -> Load {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count = keys.len();
    let tasks = (0..tasks)
        .map(|task| {
            let (redis, keys, stop) = (backend(task), keys.clone(), stop.clone());
            tokio::spawn(async move {
                let mut allowed = vec![0u64; keys.len()];
                let mut round = task;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    round += step;
                    let i = round % keys.len();
                    let (key, rule) = &keys[i];
                    let decision = Backend::check(&redis, rule, key, 1).await;
                    let decision = decision.unwrap_or_else(|e| panic!("{key}: {e}"));
                    assert!(decision.allowed, "{key}: {decision:?}");
                    allowed[i] += 1;
                }
                allowed
            })
        })
        .collect();
    Load {
        stop,
        tasks,
        keys: count,
    }
}

impl Load {
    /// Stops the tasks: how many checks of each key were allowed.
    pub async fn stop(self) -> Vec<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut allowed = vec![0u64; self.keys];
        for task in self.tasks {
            for (total, n) in allowed.iter_mut().zip(task.await.unwrap()) {
                *total += n;
            }
        }
        allowed
    }
}

/// Serves `app` on a free loopback port, with the peer address
/// (`ConnectInfo`).
pub async fn serve_axum(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Log lines, kept to be read.
#[derive(Clone, Default)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// A subscriber that writes the lines at `level` and above here.
    pub fn subscriber(
        &self,
        level: tracing_subscriber::filter::LevelFilter,
    ) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .finish()
    }

    /// Every line so far.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Serves the actix-web app `factory` makes (`HttpServer::new`'s argument)
/// on a free loopback port, with one worker: its address.
macro_rules! serve_actix {
    ($factory:expr) => {{
        let server = ::actix_web::HttpServer::new($factory)
            .workers(1)
            .bind((::std::net::Ipv4Addr::LOCALHOST, 0))
            .expect("binding a loopback port");
        let addr = server.addrs()[0];
        ::actix_web::rt::spawn(server.run());
        addr
    }};
}
pub(crate) use serve_actix;

/// The executable of `examples/<name>.rs`, built as the rest of the suite
/// was (the workspace with every feature, so nothing is built again).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let output = ratelimit_test_support::cargo(env!("CARGO"))
        .args([
            "build",
            "--workspace",
            "--all-features",
            "--example",
            name,
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let artifact = format!(r#""name":"{name}""#);
    let line = stdout
        .lines()
        .find(|line| line.contains(&artifact) && line.contains(r#""executable":""#))
        .expect("the example's artifact");
    let path = line.split(r#""executable":""#).nth(1).unwrap();
    std::path::PathBuf::from(&path[..path.find('"').unwrap()])
}

/// This test binary, to run only the ignored test `test`.
fn worker_command(test: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args([
        test,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    command
}

/// This test binary run again as a worker process: only the ignored test
/// `test`, told what to do through the environment variable `env`; its
/// standard output piped back (its report), its errors shown.
pub fn worker(test: &str, env: &str, value: impl AsRef<std::ffi::OsStr>) -> std::process::Child {
    worker_command(test)
        .env(env, value)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("running this test binary as a worker")
}

/// [`worker`] told what to do while it runs: its standard input piped (one
/// request a line), its environment given `envs`.
pub fn talking_worker(test: &str, envs: &[(&str, &str)]) -> std::process::Child {
    worker_command(test)
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("running this test binary as a worker")
}
