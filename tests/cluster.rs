//! Redis Cluster: six real redis-server processes (3 masters, 3 replicas)
//! that the test starts. Every algorithm runs on it; keys spread over all
//! masters; the limiter follows a failover.

mod common;

use std::time::{Duration, Instant};

use common::{Subject, count_pass_then_refused_then_budget_returns, same_decisions};
use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{Algorithm, Backend, OnError, RateLimiter, Rule};
use ratelimit_test_support::{RedisCluster, calls_of, first_ok};

async fn cluster_backend(cluster: &RedisCluster) -> RedisBackend {
    let options = ConnectOptions {
        timeout: Duration::from_secs(1),
        ..ConnectOptions::default()
    };
    RedisBackend::connect(cluster.urls(), options)
        .await
        .expect("connecting to the test cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_passes_its_scenario_and_equals_memory_on_a_cluster() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    for algorithm in Algorithm::ALL {
        same_decisions(&redis, algorithm).await;
    }
    let subject = Subject::cluster(cluster).await;
    for algorithm in Algorithm::ALL {
        count_pass_then_refused_then_budget_returns(&subject, algorithm).await;
    }
    subject.assert_ttls();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_different_subjects_spread_over_every_master() {
    let cluster = RedisCluster::start();
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let rule = Rule::gcra(5, Duration::from_secs(60));
    for user in 0..90 {
        let decision = limiter
            .check(&rule, &format!("limiter:spread:user:{user}"))
            .await
            .unwrap();
        assert!(decision.allowed);
    }
    let spread = cluster.keys_per_master("limiter:spread:*");
    assert_eq!(spread.len(), 3, "{spread:?}");
    assert_eq!(
        spread.iter().map(|(_, n)| n).sum::<usize>(),
        90,
        "{spread:?}"
    );
    assert!(
        spread.iter().all(|(_, n)| *n > 0),
        "every master holds some: {spread:?}"
    );
    assert!(
        cluster
            .keys_with_pttl("limiter:*")
            .iter()
            .all(|(_, pttl)| *pttl > 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_follows_a_master_failover() {
    let mut cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(10, Duration::from_secs(120));
    let key = "limiter:failover";
    for _ in 0..3 {
        assert!(limiter.check(&rule, key).await.unwrap().allowed);
    }
    // Let the replica catch up, then kill the key's master.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let master = cluster.master_for(key);
    cluster.kill(master);
    let killed = Instant::now();
    // The backend itself answers again once a replica is promoted.
    loop {
        match redis.check(&rule, key, 1).await {
            Ok(decision) => {
                // The promoted replica had the 3 calls before the kill.
                assert_eq!(decision.remaining, 10 - 3 - 1, "{decision:?}");
                break;
            }
            Err(_) => {
                assert!(
                    killed.elapsed() < Duration::from_secs(30),
                    "no failover in 30 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert_ne!(cluster.master_for(key), master, "a replica took over");
    // And so does the limiter (after its next probe), on the shared state.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let decision = limiter.check(&rule, key).await.unwrap();
        if decision.remaining <= 10 - 3 - 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the limiter stayed on its local insurance: {decision:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A cluster connection made on a runtime that then ended is made again on
/// the runtime that checks (it failed every call from then on).
#[test]
fn a_cluster_limiter_outlives_the_runtime_it_was_built_on() {
    let cluster = RedisCluster::start();
    let builder = RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_secs(2))
        .probe_interval(Duration::from_millis(100))
        .on_backend_error(OnError::Deny);
    let rounds = common::rounds_until_it_outlives_its_runtime(builder, "limiter:outlived:");
    assert!(rounds <= 3, "took {rounds} rounds");
    assert_eq!(cluster.keys_with_pttl("limiter:outlived:*").len(), 32);
}

/// `.redis(url)` pointed at a cluster node worked while checks went one at
/// a time, and once load rose, coalesced batches of keys of different slots
/// failed with CROSSSLOT (to the failure policy). Cluster mode is now found
/// at connect: `build()` fails and asks for the list of the cluster's nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_behind_one_url_fails_build_and_asks_for_its_nodes() {
    let cluster = RedisCluster::start();
    let node = cluster.urls()[0].clone();
    let error = RateLimiter::builder()
        .redis(node)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .expect_err("a cluster node is not a single server");
    let message = error.to_string();
    assert!(message.contains("list of its nodes"), "{message}");
    assert!(
        matches!(error, ratelimit_runtime::Error::Config(_)),
        "{error:?}"
    );
}

/// The units a fixed window's state on `port` has counted under `key`.
fn counted(cluster: &RedisCluster, port: u16, key: &str) -> f64 {
    let bytes: Vec<u8> = redis::cmd("GET")
        .arg(key)
        .query(&mut cluster.connection(port))
        .unwrap();
    let used: [u8; 8] = bytes[4..12].try_into().unwrap();
    f64::from_be_bytes(used)
}

/// A script call whose connection dropped after the node ran it is not
/// sent again. The cluster client re-sent it on a new connection, and the
/// check was counted twice for one caller; it is now an error (to the
/// failure policy), and the node counted it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_was_lost_is_not_sent_again() {
    let cluster = RedisCluster::start();
    let key = "limiter:lost-reply";
    let master = cluster.master_for(key);
    let proxy = ratelimit_test_support::Proxy::start(master);
    cluster.announce(master, proxy.port());
    let redis = cluster_backend(&cluster).await;
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    assert!(redis.check(&rule, key, 1).await.unwrap().allowed);
    assert_eq!(counted(&cluster, master, key), 1.0);

    proxy.lose_reply_to(key.as_bytes());
    let lost = redis.check(&rule, key, 1).await;
    assert!(lost.is_err(), "the reply was lost: {lost:?}");
    assert_eq!(
        counted(&cluster, master, key),
        2.0,
        "the node ran the check once"
    );
    // The next check goes through again, on a new connection.
    let decision = first_ok("no new connection", Duration::from_millis(50), || {
        redis.check(&rule, key, 1)
    })
    .await;
    assert_eq!(decision.remaining, 10 - 3);
}

/// A paused master counts, once it goes on, only the checks it reached
/// before their callers stopped waiting: checks carry their deadline on a
/// cluster too. Without it, each task's checks that timed out during a
/// pause (one per deadline) were all counted when the node woke up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_counts_only_the_checks_it_answered_in_time() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_millis(50),
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(cluster.urls(), options)
        .await
        .unwrap();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let key = "limiter:cluster-phantom";
    let master = cluster.master_for(key);
    let (stop, told) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    const TASKS: u64 = 16;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (redis, stop, told) = (redis.clone(), stop.clone(), told.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match redis.check(&rule, key, 1).await {
                        Ok(decision) => {
                            assert!(decision.allowed, "{decision:?}");
                            told.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        })
        .collect();
    // Shorter than the cluster's node timeout (1 s): no failover.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        cluster.node_on(master).pause();
        tokio::time::sleep(Duration::from_millis(400)).await;
        cluster.node_on(master).resume();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("no task panicked");
    }
    assert_eq!(cluster.master_for(key), master, "no failover");
    let told = told.load(Ordering::Relaxed);
    // A check run in time whose answer came back too late is refunded once
    // the answer is in: wait for those refunds (bounded).
    let settled = Instant::now() + Duration::from_secs(2);
    while counted(&cluster, master, key) as u64 != told && Instant::now() < settled {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        counted(&cluster, master, key) as u64,
        told,
        "the node counted other than the checks callers were told it allowed"
    );
}

/// `n` keys that the master on `port` serves, each of a slot of its own.
fn keys_on(cluster: &RedisCluster, port: u16, prefix: &str, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .filter(|key| cluster.master_for(key) == port)
        .take(n)
        .collect()
}

/// Checks of keys of many slots go in one call per master (not one per
/// check), and each is counted exactly: with 64 tasks on 60 keys of a
/// budget of 5, every key ends with 5 allowed, counted 5 in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_bound_for_one_master_share_a_call_and_are_counted_exactly() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await.batch_every_check();
    let calls = load_of_many_slots(&cluster, &redis).await;
    assert!(
        calls * 2 < 64 * 8,
        "{} checks took {calls} calls: not coalesced",
        64 * 8
    );
}

/// Without the function library (Redis 6.2, or a user who may not load
/// it) a cluster cannot take keys of several slots in one call: every
/// check is an `EVALSHA` of its own, none refused with `CROSSSLOT`, each
/// counted exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_each_cluster_check_is_its_own_call() {
    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(1),
        functions: false,
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(cluster.urls(), options)
        .await
        .expect("connecting to the test cluster")
        .batch_every_check();
    let evalshas = |cluster: &RedisCluster| -> u64 {
        cluster
            .masters()
            .iter()
            .map(|&port| calls_of(&mut cluster.connection(port), "evalsha"))
            .sum()
    };
    let before = evalshas(&cluster);
    let calls = load_of_many_slots(&cluster, &redis).await;
    assert_eq!(calls, 0, "no FCALL without the library");
    assert_eq!(evalshas(&cluster) - before, 64 * 8);
}

/// 64 tasks each checking 8 of 60 keys (of many slots) under a budget of
/// 5 per key; asserts that every key allowed exactly its first 5 checks and
/// that Redis counted as many. Answers how many `FCALL`s the masters ran.
async fn load_of_many_slots(cluster: &RedisCluster, redis: &RedisBackend) -> u64 {
    let rule = Rule::fixed_window(5, Duration::from_secs(60));
    let keys: Vec<String> = (0..60).map(|i| format!("limiter:node:{i}")).collect();
    let before: u64 = cluster
        .masters()
        .iter()
        .map(|&port| calls_of(&mut cluster.connection(port), "fcall"))
        .sum();
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..64 {
        let (redis, keys) = (redis.clone(), keys.clone());
        tasks.spawn(async move {
            let mut allowed = vec![0u32; keys.len()];
            for round in 0..8 {
                let i = (task * 7 + round * 13) % keys.len();
                if redis.check(&rule, &keys[i], 1).await.unwrap().allowed {
                    allowed[i] += 1;
                }
            }
            allowed
        });
    }
    let mut allowed = vec![0u32; keys.len()];
    for counts in tasks.join_all().await {
        for (total, n) in allowed.iter_mut().zip(counts) {
            *total += n;
        }
    }
    let calls: u64 = cluster
        .masters()
        .iter()
        .map(|&port| calls_of(&mut cluster.connection(port), "fcall"))
        .sum::<u64>()
        - before;
    for (key, allowed) in keys.iter().zip(allowed) {
        let master = cluster.master_for(key);
        let attempts = (0..64)
            .flat_map(|task| (0..8).map(move |round| (task * 7 + round * 13) % 60))
            .filter(|&i| keys[i] == *key)
            .count() as u32;
        assert_eq!(allowed, attempts.min(5), "{key}");
        assert_eq!(counted(cluster, master, key), f64::from(allowed), "{key}");
    }
    calls
}

/// A batch sent on an out-of-date slot map: a slot moved to another master
/// after the limiter learned the map, and its key went in one call with
/// keys of the old master. That master cannot touch the moved key: the
/// batch stops before it counts anything, each check goes again alone, and
/// every check is answered and counted once, where its key lives now.
/// (Had the batch written the keys it could before failing, those checks
/// would be counted and answered with an error.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_on_an_out_of_date_slot_map_counts_each_check_once() {
    let cluster = RedisCluster::start();
    let moved = "limiter:moved:key";
    let from = cluster.master_for(moved);
    let to = *cluster
        .masters()
        .iter()
        .find(|&&port| port != from)
        .unwrap();
    let stay = keys_on(&cluster, from, "limiter:stay", 8);
    let redis = cluster_backend(&cluster).await.batch_every_check();
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    cluster.move_empty_slot(moved, to);
    let before = calls_of(&mut cluster.connection(from), "fcall");
    let mut tasks = tokio::task::JoinSet::new();
    for key in stay.iter().map(String::as_str).chain([moved]) {
        let (redis, key) = (redis.clone(), key.to_owned());
        tasks.spawn(async move { redis.check(&rule, &key, 1).await });
    }
    for decision in tasks.join_all().await {
        let decision = decision.expect("every check answered");
        assert!(decision.allowed && decision.remaining == 9, "{decision:?}");
    }
    for key in &stay {
        assert_eq!(counted(&cluster, from, key), 1.0, "{key}");
    }
    assert_eq!(counted(&cluster, to, moved), 1.0);
    // The batch reached the old master, and its checks went again alone.
    assert!(
        calls_of(&mut cluster.connection(from), "fcall") - before > 1,
        "the stale batch was not sent"
    );
}
