//! Exact under concurrency across processes: 2 OS processes x 100 tasks
//! against one redis-server, `count = 50`, one key. Exactly 50 pass for
//! fixed_window, sliding_log, token_bucket and gcra (burst 50; the refill
//! over the test's duration is far below one token); `concurrency` never has
//! more than 50 calls in flight.
//!
//! The workers are this test binary run again: the ignored test `worker`,
//! told what to do through `RATELIMIT_EXACTNESS_WORKER`.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelimit_runtime::{Algorithm, RateLimiter, Rule};
use ratelimit_test_support::RedisServer;

const WORKER_ENV: &str = "RATELIMIT_EXACTNESS_WORKER";
const TASKS: u64 = 100;
const COUNT: u64 = 50;

fn rule(algorithm: Algorithm) -> Rule {
    match algorithm {
        Algorithm::Concurrency => Rule::concurrency(COUNT, Duration::from_secs(60)),
        // An hour: at most 0.1 token refills in the seconds this takes.
        _ => Rule::new(algorithm, COUNT, Duration::from_secs(3600)),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// What one worker process reports: calls that passed, and for
/// `concurrency` the most calls it saw in flight across both processes.
struct Report {
    passed: u64,
    max_in_flight: u64,
}

fn hammer(algorithm: Algorithm) -> Vec<Report> {
    let server = RedisServer::start();
    let start_at = unix_ms() + 1_500;
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "worker",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    WORKER_ENV,
                    format!("{} {} {start_at}", server.url(), algorithm.name()),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("running this test binary as a worker")
        })
        .collect();
    let reports = children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "worker failed: {stdout}");
            let line = stdout
                .lines()
                .find_map(|l| l.split_once("REPORT ").map(|(_, report)| report))
                .unwrap_or_else(|| panic!("no report from the worker: {stdout}"));
            let numbers: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
            Report {
                passed: numbers[0],
                max_in_flight: numbers[1],
            }
        })
        .collect();
    if algorithm == Algorithm::Concurrency {
        server.assert_no_key_without_ttl("limiter:*");
    } else {
        server.assert_all_keys_expire("limiter:*");
    }
    reports
}

fn exactly_count_pass(algorithm: Algorithm) {
    let reports = hammer(algorithm);
    let passed: u64 = reports.iter().map(|r| r.passed).sum();
    assert_eq!(
        passed, COUNT,
        "{algorithm:?}: 2 x {TASKS} calls, count {COUNT}"
    );
}

#[test]
fn fixed_window() {
    exactly_count_pass(Algorithm::FixedWindow);
}

#[test]
fn sliding_log() {
    exactly_count_pass(Algorithm::SlidingLog);
}

#[test]
fn token_bucket() {
    exactly_count_pass(Algorithm::TokenBucket);
}

#[test]
fn gcra() {
    exactly_count_pass(Algorithm::Gcra);
}

#[test]
fn concurrency_never_exceeds_count_in_flight() {
    let reports = hammer(Algorithm::Concurrency);
    let max = reports.iter().map(|r| r.max_in_flight).max().unwrap();
    let passed: u64 = reports.iter().map(|r| r.passed).sum();
    assert!(max <= COUNT, "{max} calls in flight, count {COUNT}");
    assert!(max > 0);
    assert!(
        passed > COUNT,
        "leases were released and taken again ({passed} passes)"
    );
}

/// Run by the tests above in child processes; does nothing on its own.
#[test]
#[ignore = "a worker process of the exactness tests"]
fn worker() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let mut parts = spec.split(' ');
    let url = parts.next().unwrap().to_owned();
    let name = parts.next().unwrap().to_owned();
    let start_at: u64 = parts.next().unwrap().parse().unwrap();
    let algorithm = *Algorithm::ALL.iter().find(|a| a.name() == name).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (passed, max_in_flight) = runtime.block_on(async move {
        let limiter = RateLimiter::builder()
            .redis(url.as_str())
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let counter = client.get_multiplexed_async_connection().await.unwrap();
        let rule = rule(algorithm);
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let limiter = limiter.clone();
                let mut counter = counter.clone();
                tokio::spawn(async move {
                    let (mut passed, mut max) = (0u64, 0u64);
                    // Concurrency calls come back a few times, so leases churn.
                    let attempts = if algorithm == Algorithm::Concurrency {
                        6
                    } else {
                        1
                    };
                    for _ in 0..attempts {
                        let permit = limiter.acquire(&rule, "limiter:hammer", 1).await.unwrap();
                        if !permit.decision().allowed {
                            tokio::time::sleep(Duration::from_millis(3)).await;
                            continue;
                        }
                        passed += 1;
                        if algorithm == Algorithm::Concurrency {
                            let now: u64 = redis::cmd("INCR")
                                .arg("in-flight")
                                .query_async(&mut counter)
                                .await
                                .unwrap();
                            max = max.max(now);
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            let _: i64 = redis::cmd("DECR")
                                .arg("in-flight")
                                .query_async(&mut counter)
                                .await
                                .unwrap();
                            permit.release().await.unwrap();
                        }
                    }
                    (passed, max)
                })
            })
            .collect();
        let (mut passed, mut max) = (0, 0);
        for task in tasks {
            let (p, m) = task.await.unwrap();
            passed += p;
            max = max.max(m);
        }
        (passed, max)
    });
    println!("REPORT {passed} {max_in_flight}");
}
