//! `#[rate_limit(..., wait = "...")]` across a fleet: 20 calls from two
//! processes sharing one Redis (a single server, then a cluster) on a rule
//! of 4 per second, burst 1, all pass, never more than `burst + rate × t`
//! in any interval of length `t`, spread over about `(n - 1) / rate`; the
//! same in process memory within one process.
//!
//! The workers are this test binary run again: the ignored test `worker`,
//! told what to do through `RATELIMIT_WAIT_WORKER`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
use ratelimit_test_support::{RedisCluster, RedisServer};

const WORKER_ENV: &str = "RATELIMIT_WAIT_WORKER";
const CALLS: usize = 20;
const RATE: f64 = 4.0;
const BURST: f64 = 1.0;

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// The paced call: what it records is when its body ran.
#[rate_limit(key = "partner", count = 4, algorithm = gcra, burst = 1, wait = "10s")]
async fn paced() -> Result<u64, RateLimited> {
    Ok(unix_us())
}

/// The same, on a token bucket.
#[rate_limit(key = "partner_tb", count = 4, algorithm = token_bucket, burst = 1, wait = "10s")]
async fn paced_bucket() -> Result<u64, RateLimited> {
    Ok(unix_us())
}

/// `n` calls at once, on tasks of this process: the times their bodies ran
/// (µs), or the refusals.
async fn calls(n: usize, bucket: bool) -> Vec<Result<u64, RateLimited>> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                if bucket {
                    paced_bucket().await
                } else {
                    paced().await
                }
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Every call passed, and their times keep to the rule: in any interval
/// `[a, b]` between two of them at most `burst + rate × (b - a + late)`
/// calls, where `late` is how much later than its turn a call may run on a
/// busy machine (a call never runs before its turn: it sleeps at least its
/// wait, from the moment the store answered); and the last ran about
/// `(n - 1) / rate` after the first.
fn assert_paced(results: Vec<Result<u64, RateLimited>>) {
    let late = 0.15;
    let mut times: Vec<u64> = results
        .into_iter()
        .map(|r| r.expect("every call passes"))
        .collect();
    times.sort_unstable();
    assert_eq!(times.len(), CALLS);
    let secs = |us: u64| us as f64 / 1e6;
    for i in 0..times.len() {
        for j in i + 1..times.len() {
            let t = secs(times[j] - times[i]);
            let calls = (j - i + 1) as f64;
            assert!(
                calls <= BURST + RATE * (t + late),
                "{calls} calls in {t:.3} s (calls {i}..={j}): {times:?}"
            );
        }
    }
    let spread = secs(times[CALLS - 1] - times[0]);
    let expected = (CALLS - 1) as f64 / RATE;
    assert!(
        spread >= expected - late && spread <= expected + 1.5,
        "spread over {spread:.3} s, expected about {expected} s"
    );
}

/// Two worker processes, each making `CALLS / 2` calls at once at the same
/// moment, on the limiter `target` names; every call's time.
fn fleet(target: &str, bucket: bool) -> Vec<Result<u64, RateLimited>> {
    let start_at = unix_us() / 1000 + 1_500;
    let children: Vec<_> = (0..2)
        .map(|_| {
            common::worker(
                "worker",
                WORKER_ENV,
                format!("{target} {bucket} {start_at}"),
            )
        })
        .collect();
    let mut results = Vec::new();
    for child in children {
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "a worker failed");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let line = stdout
            .lines()
            .find_map(|line| Some(line.split_once("TIMES ")?.1))
            .unwrap_or_else(|| panic!("no report from a worker: {stdout}"));
        for word in line.split_whitespace() {
            results.push(match word.parse::<u64>() {
                Ok(time) => Ok(time),
                Err(_) => Err(RateLimited::backend_unavailable(4)),
            });
        }
    }
    results
}

#[test]
fn two_processes_on_one_redis_take_turns() {
    let server = RedisServer::start();
    assert_paced(fleet(&server.url(), false));
    assert_paced(fleet(&server.url(), true));
    server.assert_no_key_without_ttl("limiter:*");
}

#[test]
fn two_processes_on_a_cluster_take_turns() {
    let cluster = RedisCluster::start();
    assert_paced(fleet(&cluster.urls().join(","), false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_one_process_take_turns_in_memory() {
    // The global limiter of this test binary: none installed, so the
    // in-memory default.
    let started = Instant::now();
    assert_paced(calls(CALLS, false).await);
    assert!(started.elapsed() >= Duration::from_secs(4));
    assert_paced(calls(CALLS, true).await);
}

/// A call that cannot go within its wait is refused at once.
#[tokio::test]
async fn a_call_that_cannot_go_in_time_is_refused_at_once() {
    #[rate_limit(key = "short", count = 1, period = "1m", algorithm = gcra, wait = "1s")]
    async fn rare() -> Result<(), RateLimited> {
        Ok(())
    }
    rare().await.unwrap();
    let started = Instant::now();
    let refused = rare().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(50));
    assert!(refused.retry_after > Duration::from_secs(58), "{refused}");
}

/// `wait` with `fallback`: a call that can wait its turn waits and runs the
/// body; one whose turn is beyond the wait gets the fallback, at once.
#[tokio::test]
async fn a_wait_that_cannot_be_met_calls_the_fallback() {
    #[rate_limit(
        key = "w_fallback",
        count = 10,
        algorithm = gcra,
        burst = 1,
        by = arg(who),
        wait = "250ms",
        fallback = busy
    )]
    async fn send(who: &str) -> String {
        format!("sent {who}")
    }
    async fn busy(who: &str, limited: RateLimited) -> String {
        assert!(!limited.is_backend_failure());
        format!("busy {who}")
    }
    // Four at once, spaced 100 ms apart: the first goes at once, the second
    // and third wait (100, 200 ms), the fourth's turn (300 ms) is beyond
    // the wait: its fallback answers at once.
    let started = Instant::now();
    let timed = |n: u32| async move {
        tokio::time::sleep(Duration::from_millis(u64::from(n))).await;
        let answer = send("a").await;
        (answer, started.elapsed())
    };
    let all = tokio::join!(timed(0), timed(1), timed(2), timed(3));
    let mut all = [all.0, all.1, all.2, all.3];
    all.sort_by_key(|(answer, _)| answer.clone());
    let [busy, sent @ ..] = &all;
    assert_eq!(busy.0, "busy a", "{all:?}");
    assert!(busy.1 < Duration::from_millis(150), "at once: {all:?}");
    assert!(sent.iter().all(|(answer, _)| answer == "sent a"), "{all:?}");
    let last = sent.iter().map(|(_, at)| *at).max().unwrap();
    assert!(
        last >= Duration::from_millis(190),
        "the others waited: {all:?}"
    );
    assert_eq!(send("b").await, "sent b", "another key's own budget");
}

/// `wait` with `shadow`: a shadow rule never refuses, so its calls never
/// wait either: all of them run at once.
#[tokio::test]
async fn a_shadow_rule_with_wait_never_waits_nor_refuses() {
    #[rate_limit(key = "w_shadow", count = 1, period = "1m", algorithm = gcra, shadow, wait = "10s")]
    async fn trial() -> Result<(), RateLimited> {
        Ok(())
    }
    let started = Instant::now();
    for _ in 0..20 {
        trial().await.expect("shadow never refuses");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "nothing waited: {took:?}");
}

/// `examples/outbound.rs`, built as the rest of the suite was (the
/// workspace with every feature, so nothing is built again), run on a Redis
/// of the harness: the fake third party answers all 20 paced calls of its
/// two processes with 200, not one with 429.
#[test]
fn the_outbound_example_gets_no_429() {
    let binary = common::example_binary("outbound");
    let server = RedisServer::start();
    let output = Command::new(&binary)
        .env("REDIS_URL", server.url())
        .env_remove("OUTBOUND_WORKER")
        .output()
        .expect("the example runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{output:?}");
    assert!(
        text.contains("2 processes: 20 answered 200, 0 answered 429"),
        "{text}"
    );
    assert!(!text.contains("refused"), "{text}");
}

/// Run by the tests above in child processes; does nothing on its own.
#[test]
#[ignore = "a worker process of the fleet tests"]
fn worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let target = parts.next().unwrap().to_owned();
    let bucket: bool = parts.next().unwrap().parse().unwrap();
    let start_at: u64 = parts.next().unwrap().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let results = runtime.block_on(async move {
        let urls: Vec<String> = target.split(',').map(str::to_owned).collect();
        let builder = RateLimiter::builder();
        let builder = if urls.len() == 1 {
            builder.redis(urls[0].as_str())
        } else {
            builder.redis(urls)
        };
        builder
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap()
            .install()
            .unwrap();
        let now_ms = unix_us() / 1000;
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(now_ms))).await;
        calls(CALLS / 2, bucket).await
    });
    let words: Vec<String> = results
        .iter()
        .map(|r| match r {
            Ok(time) => time.to_string(),
            Err(_) => "refused".to_owned(),
        })
        .collect();
    println!("TIMES {}", words.join(" "));
}
