//! Local quotas (`Rule::with_local_quota`) against a real redis-server:
//! exact across processes (never more than `count` pass, the whole budget
//! is used, and Redis sees far fewer calls than there are checks), a block
//! held is spent while Redis is down and then the failure policy answers,
//! what is left of a bucket's block is given back when its time is up, and
//! a reset drops the blocks held.
//!
//! The workers are this test binary run again: the ignored test `worker`,
//! told what to do through `RATELIMIT_QUOTA_WORKER`.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimit_runtime::{Algorithm, Error, OnError, RateLimiter, Rule};
use ratelimit_test_support::{RedisServer, script_calls};

const WORKER_ENV: &str = "RATELIMIT_QUOTA_WORKER";
/// Separate limiters (own connections) in each worker process.
const LIMITERS: usize = 2;
const TASKS: usize = 25;
const COUNT: u64 = 1_000;
const BLOCK: u64 = 50;
/// Ten hours: a bucket refills about 0.1 token in the seconds a test takes.
const PERIOD: Duration = Duration::from_secs(36_000);

fn rule(algorithm: Algorithm) -> Rule {
    Rule::new(algorithm, COUNT, PERIOD).with_local_quota(BLOCK)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Two processes of two limiters each, 50 tasks calling for a second and
/// a half: exactly `COUNT` pass in all, at most a third as many script
/// calls reach Redis as there were passes (and refused calls are answered
/// in process: the checks outnumber the script calls many times).
fn exact_across_processes(algorithm: Algorithm) {
    let server = RedisServer::start();
    let start_at = unix_ms() + 1_500;
    let before = script_calls(&mut server.connection());
    let children: Vec<_> = (0..2)
        .map(|_| {
            common::worker(
                "worker",
                WORKER_ENV,
                format!("{} {} {start_at}", server.url(), algorithm.name()),
            )
        })
        .collect();
    let (mut passed, mut checks) = (0u64, 0u64);
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "worker failed: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.split_once("REPORT ").map(|(_, report)| report))
            .unwrap_or_else(|| panic!("no report from the worker: {stdout}"));
        let numbers: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        passed += numbers[0];
        checks += numbers[1];
    }
    let calls = script_calls(&mut server.connection()) - before;
    assert_eq!(
        passed, COUNT,
        "{algorithm:?}: 4 limiters in 2 processes, count {COUNT}, blocks of up to {BLOCK}"
    );
    assert!(
        calls * 3 <= passed,
        "{algorithm:?}: {calls} script calls for {passed} passes: blocks were not used"
    );
    assert!(
        checks >= 10 * calls,
        "{algorithm:?}: {checks} checks, {calls} script calls: refusals reached Redis"
    );
    server.assert_all_keys_expire("limiter:*");
}

#[test]
fn fixed_window_blocks_are_exact_across_processes() {
    exact_across_processes(Algorithm::FixedWindow);
}

#[test]
fn token_bucket_blocks_are_exact_across_processes() {
    exact_across_processes(Algorithm::TokenBucket);
}

#[test]
fn gcra_blocks_are_exact_across_processes() {
    exact_across_processes(Algorithm::Gcra);
}

/// Run by the tests above in child processes; does nothing on its own.
#[test]
#[ignore = "a worker process of the local quota tests"]
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
    let (passed, checks) = runtime.block_on(async move {
        let mut limiters = Vec::new();
        for _ in 0..LIMITERS {
            let limiter = RateLimiter::builder()
                .redis(url.as_str())
                .timeout(Duration::from_secs(10))
                .build()
                .await
                .unwrap();
            limiters.push(limiter);
        }
        let rule = rule(algorithm);
        tokio::time::sleep(Duration::from_millis(start_at.saturating_sub(unix_ms()))).await;
        let until = Instant::now() + Duration::from_millis(1_500);
        let tasks: Vec<_> = (0..LIMITERS * TASKS)
            .map(|i| {
                let limiter = limiters[i % LIMITERS].clone();
                tokio::spawn(async move {
                    let (mut passed, mut checks) = (0u64, 0u64);
                    while Instant::now() < until {
                        let decision = limiter.check(&rule, "limiter:quota").await.unwrap();
                        checks += 1;
                        passed += u64::from(decision.allowed);
                        tokio::task::yield_now().await;
                    }
                    (passed, checks)
                })
            })
            .collect();
        let (mut passed, mut checks) = (0, 0);
        for task in tasks {
            let (p, c) = task.await.unwrap();
            passed += p;
            checks += c;
        }
        (passed, checks)
    });
    println!("REPORT {passed} {checks}");
}

/// A limiter on `server` that refuses when Redis fails (no insurance
/// limiter), so a call answered while Redis is down came from a block.
async fn denying_limiter(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .redis(server.url().as_str())
        .on_backend_error(OnError::Deny)
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap()
}

/// Units of `key` Redis has handed out under `rule` (a block's included).
async fn taken(limiter: &RateLimiter, rule: &Rule, key: &str) -> u64 {
    // `remaining` is what is left after one more call.
    rule.capacity() - 1 - limiter.peek(rule, key).await.unwrap().remaining
}

/// Redis is killed with a block held: the block's units still pass, every
/// one of them and no more, then the rule's policy (`deny`) answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_held_is_spent_while_redis_is_down_then_the_policy_answers() {
    let mut server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    let rule = Rule::fixed_window(COUNT, PERIOD).with_local_quota(100);
    let key = "limiter:down";
    // The first call takes a block of one; the second, at the rate seen,
    // the largest block.
    for _ in 0..2 {
        assert!(limiter.check(&rule, key).await.unwrap().allowed);
    }
    let held = taken(&limiter, &rule, key).await - 2;
    assert!(
        held >= 10,
        "the second call took a block: {held} units held"
    );
    let killed = Instant::now();
    server.kill();

    let mut passed = 0;
    let error = loop {
        match limiter.check(&rule, key).await {
            Ok(decision) => {
                assert!(decision.allowed, "no refusal from the block: {decision:?}");
                passed += 1;
                assert!(passed <= held, "more passed than the block held");
            }
            Err(error) => break error,
        }
    };
    assert!(matches!(error, Error::Backend(_)), "{error:?}");
    // A block lives a second at most; with a wide margin, all of it was
    // spent before its time was up.
    if killed.elapsed() < Duration::from_millis(900) {
        assert_eq!(passed, held, "the whole block was spent");
    }
    assert!(
        limiter.check(&rule, key).await.is_err(),
        "the policy answers from then on"
    );
}

/// Redis down while calls need blocks: the breaker opens, and its log line
/// names the policy the calls are answered by (`allow` here), not the one
/// a block's own call used to carry (`deny`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_names_the_calls_policy_when_blocks_fail() {
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url().as_str())
        .on_backend_error(OnError::Allow)
        .timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(COUNT, PERIOD).with_local_quota(100);
    assert!(limiter.check(&rule, "limiter:warm").await.unwrap().allowed);
    server.kill();
    let logs = common::Logs::default();
    let _logging = tracing::subscriber::set_default(
        logs.subscriber(tracing_subscriber::filter::LevelFilter::WARN),
    );
    // Each key's first call needs a block: every one fails, and is let
    // through by the policy.
    for n in 0..5 {
        let decision = limiter.check(&rule, &format!("limiter:gone:{n}")).await;
        assert!(decision.unwrap().allowed, "call {n}: the policy allows");
    }
    let logged = logs.text();
    assert!(
        logged.contains("unavailable") && logged.contains("policy `allow`"),
        "{logged}"
    );
    assert!(!logged.contains("policy `deny`"), "{logged}");
}

/// Redis hangs (paused) while a call needs a block: the call is answered
/// by its policy when the block's call times out (500 ms), not sent again
/// to wait as long once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_that_times_out_is_answered_by_the_policy_at_once() {
    let server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    let rule = Rule::fixed_window(COUNT, PERIOD).with_local_quota(100);
    assert!(limiter.check(&rule, "limiter:warm").await.unwrap().allowed);
    server.pause();
    let sent = Instant::now();
    let answer = limiter.check(&rule, "limiter:hang").await;
    let took = sent.elapsed();
    server.resume();
    assert!(matches!(answer, Err(Error::Backend(_))), "{answer:?}");
    // One deadline (500 ms), with a wide margin; sent again, two.
    assert!(took < Duration::from_millis(900), "took {took:?}");
}

/// What is left of a GCRA block when its time is up (a tenth of the
/// period, here 400 ms) is given back to the bucket: Redis ends with only
/// the units that passed taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_left_of_a_bucket_block_is_given_back_when_its_time_is_up() {
    let server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    // Refilled at one token every 4 s: what comes back is the block.
    let rule = Rule::gcra(1, Duration::from_secs(4))
        .with_burst(1_000)
        .with_local_quota(100);
    let key = "limiter:give-back";
    for _ in 0..2 {
        assert!(limiter.check(&rule, key).await.unwrap().allowed);
    }
    let held = taken(&limiter, &rule, key).await - 2;
    assert!(held >= 5, "the second call took a block: {held} units held");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let taken = taken(&limiter, &rule, key).await;
        if taken <= 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the block's {held} units were not given back: {taken} taken, 2 passed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reset drops the blocks held: the next call takes from the whole
/// budget in Redis, not from units taken before the reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_drops_the_block_held() {
    let server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    let rule = Rule::fixed_window(COUNT, PERIOD).with_local_quota(100);
    let key = "limiter:reset";
    for _ in 0..2 {
        assert!(limiter.check(&rule, key).await.unwrap().allowed);
    }
    assert!(taken(&limiter, &rule, key).await > 2, "a block is held");
    limiter.reset(&rule, key).await.unwrap();
    assert_eq!(taken(&limiter, &rule, key).await, 0);
    assert!(limiter.check(&rule, key).await.unwrap().allowed);
    assert!(
        taken(&limiter, &rule, key).await >= 1,
        "served from the dropped block"
    );
}

/// A key Redis refused is refused in process: no round trip per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_key_is_refused_without_a_round_trip() {
    let server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    let rule = Rule::fixed_window(3, PERIOD).with_local_quota(3);
    let key = "limiter:empty";
    let mut passed = 0;
    for _ in 0..5 {
        passed += u64::from(limiter.check(&rule, key).await.unwrap().allowed);
    }
    assert_eq!(passed, 3);
    let before = script_calls(&mut server.connection());
    for _ in 0..100 {
        let refused = limiter.check(&rule, key).await.unwrap();
        assert!(!refused.allowed);
        assert!(refused.retry_after > Duration::from_secs(3_000));
    }
    let calls = script_calls(&mut server.connection()) - before;
    assert!(calls <= 2, "{calls} script calls for 100 refusals");
}

#[ratelimit_runtime::rate_limit(
    key = "attribute-quota",
    count = 1_000,
    period = "1h",
    local_quota = 100,
    limiter = "quota"
)]
async fn hot() -> Result<(), ratelimit_runtime::RateLimited> {
    Ok(())
}

/// `local_quota = N` in the attribute reaches the limiter: the second call
/// takes a block from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_serves_from_local_quotas() {
    let server = RedisServer::start();
    let limiter = denying_limiter(&server).await;
    limiter.clone().install_as("quota").unwrap();
    for _ in 0..2 {
        hot().await.unwrap();
    }
    let rule = Rule::fixed_window(1_000, Duration::from_secs(3600));
    let held = taken(&limiter, &rule, "limiter:attribute-quota").await - 2;
    assert!(held >= 5, "the second call took a block: {held} units held");
}
