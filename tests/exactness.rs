//! Exact under concurrency across processes: 2 OS processes x 100 tasks
//! against one redis-server, `count = 50`, one key. Exactly 50 pass for
//! fixed_window, sliding_log, token_bucket and gcra (burst 50; the refill
//! over the test's duration is far below one token); `concurrency` never has
//! more than 50 calls in flight. Sets of a per-user and a global rule
//! (`check_all`), 2 processes x 60 tasks, on one redis-server and on a
//! 3-master cluster: exact passes, and every rule keeps its count less the
//! passes' cost.
//!
//! The workers are this test binary run again: the ignored tests `worker`
//! and `set_worker`, told what to do through `RATELIMIT_EXACTNESS_WORKER`
//! and `RATELIMIT_EXACTNESS_SETS_WORKER`.

mod common;

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
            common::worker(
                "worker",
                WORKER_ENV,
                format!("{} {} {start_at}", server.url(), algorithm.name()),
            )
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

const SETS_ENV: &str = "RATELIMIT_EXACTNESS_SETS_WORKER";
const SET_TASKS: usize = 60;
const USERS: usize = 4;

/// A set of a per-user and a global rule, as the set workers check it: the
/// Redis URLs, the global rule's count and cost, the per-user rule's count,
/// the global key and each user's key.
struct SetRun {
    urls: Vec<String>,
    global: u64,
    global_cost: u64,
    per_user: u64,
    global_key: String,
    user_keys: Vec<String>,
}

impl SetRun {
    /// A limiter on the run's one Redis, or on its cluster.
    async fn limiter(&self) -> RateLimiter {
        let builder = match &self.urls[..] {
            [url] => RateLimiter::builder().redis(url.as_str()),
            urls => RateLimiter::builder().redis(urls.to_vec()),
        };
        builder
            .timeout(Duration::from_secs(10))
            .build()
            .await
            .unwrap()
    }

    fn rules(&self) -> (Rule, Rule) {
        let hour = Duration::from_secs(3600);
        (
            Rule::fixed_window(self.global, hour),
            Rule::fixed_window(self.per_user, hour),
        )
    }
}

/// 2 processes x 60 tasks, each one call of the set for user `task % 4`
/// (in either order of its rules): the passes of each user, from both
/// processes, are exact, and every rule has its count less the passes'
/// cost left.
fn sets_across_processes(run: &SetRun, exact: u64) {
    let start_at = unix_ms() + 1_500;
    let spec = format!(
        "{} {start_at} {} {} {} {} {}",
        run.urls.join(","),
        run.global,
        run.global_cost,
        run.per_user,
        run.global_key,
        run.user_keys.join(" ")
    );
    let children: Vec<_> = (0..2)
        .map(|_| common::worker("set_worker", SETS_ENV, &spec))
        .collect();
    let mut by_user = [0u64; USERS];
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "worker failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("REPORT ").map(|(_, report)| report))
            .unwrap_or_else(|| panic!("no report from the worker: {stdout}"));
        for (user, passed) in by_user.iter_mut().zip(line.split(' ')) {
            *user += passed.parse::<u64>().unwrap();
        }
    }
    let total: u64 = by_user.iter().sum();
    assert_eq!(total, exact, "{by_user:?}");
    let (global, per_user) = run.rules();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let limiter = run.limiter().await;
        let left = |rule: Rule, key: String| {
            let limiter = limiter.clone();
            async move {
                let peek = limiter.peek(&rule, &key).await.unwrap();
                if peek.allowed { peek.remaining + 1 } else { 0 }
            }
        };
        assert_eq!(
            left(global, run.global_key.clone()).await,
            run.global - run.global_cost * total,
            "the global rule: {by_user:?}"
        );
        for (key, passed) in run.user_keys.iter().zip(by_user) {
            assert_eq!(
                left(per_user, key.clone()).await,
                run.per_user - passed,
                "{key}: {by_user:?}"
            );
        }
    });
}

/// Both rules refuse in turn (global 60 at cost 2, 10 per user, 30 calls
/// of each user): one atomic script run per set, so exactly 30 pass.
#[test]
fn sets_across_two_processes_on_one_redis() {
    let server = RedisServer::start();
    let run = SetRun {
        urls: vec![server.url()],
        global: 60,
        global_cost: 2,
        per_user: 10,
        global_key: "limiter:sets:global".into(),
        user_keys: (0..USERS)
            .map(|u| format!("limiter:sets:user:{u}"))
            .collect(),
    };
    sets_across_processes(&run, 30);
    server.assert_all_keys_expire("limiter:*");
}

/// On a 3-master cluster: a set on one slot (a hash tag) as on one Redis;
/// a set spread over two masters (taken master by master), exact where the
/// global rule alone refuses.
#[test]
fn sets_across_two_processes_on_a_cluster() {
    let cluster = ratelimit_test_support::RedisCluster::start();
    let tagged = SetRun {
        urls: cluster.urls(),
        global: 60,
        global_cost: 2,
        per_user: 10,
        global_key: "limiter:{sets}:global".into(),
        user_keys: (0..USERS)
            .map(|u| format!("limiter:{{sets}}:user:{u}"))
            .collect(),
    };
    sets_across_processes(&tagged, 30);
    let masters = cluster.masters();
    let on = |port: u16, prefix: String| {
        (0..)
            .map(|n| format!("{prefix}:{n}"))
            .find(|key| cluster.master_for(key) == port)
            .unwrap()
    };
    let spread = SetRun {
        urls: cluster.urls(),
        global: 60,
        global_cost: 2,
        per_user: 40,
        global_key: on(masters[0], "limiter:spread:global".into()),
        user_keys: (0..USERS)
            .map(|u| on(masters[1], format!("limiter:spread:user:{u}")))
            .collect(),
    };
    sets_across_processes(&spread, 30);
}

/// Run by the set tests above in child processes; does nothing on its own.
#[test]
#[ignore = "a worker process of the exactness tests"]
fn set_worker() {
    let Ok(spec) = std::env::var(SETS_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(' ').collect();
    let number = |i: usize| parts[i].parse::<u64>().unwrap();
    let run = SetRun {
        urls: parts[0].split(',').map(str::to_owned).collect(),
        global: number(2),
        global_cost: number(3),
        per_user: number(4),
        global_key: parts[5].to_owned(),
        user_keys: parts[6..].iter().map(|k| (*k).to_owned()).collect(),
    };
    let start_at = number(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let by_user = runtime.block_on(async move {
        let limiter = run.limiter().await;
        let (global, per_user) = run.rules();
        let run = std::sync::Arc::new(run);
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
        let tasks: Vec<_> = (0..SET_TASKS)
            .map(|i| {
                let (limiter, run) = (limiter.clone(), std::sync::Arc::clone(&run));
                tokio::spawn(async move {
                    let user = (&per_user, run.user_keys[i % USERS].as_str(), 1);
                    let all = (&global, run.global_key.as_str(), run.global_cost);
                    let set = if i % 2 == 0 { [user, all] } else { [all, user] };
                    let verdict = limiter.check_all(&set).await.unwrap();
                    (i % USERS, verdict.allowed())
                })
            })
            .collect();
        let mut by_user = [0u64; USERS];
        for task in tasks {
            let (user, passed) = task.await.unwrap();
            by_user[user] += u64::from(passed);
        }
        by_user
    });
    let line: Vec<String> = by_user.iter().map(u64::to_string).collect();
    println!("REPORT {}", line.join(" "));
}
