//! Sets of rules with coalescing on (`RateLimiter::check_all`): many tasks
//! mixing sets and single checks at once, on one Redis and on a 3-master
//! cluster. On one Redis each set is one unit of a coalesced batch, all or
//! nothing: the sets go out in fewer script calls than there are sets. On
//! both, the passes are exact, every rule keeps its count less the passes'
//! cost, and a refused set takes nothing.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::{RateLimiter, Rule};
use ratelimit_test_support::{RedisCluster, RedisServer, script_calls};

const DAY: Duration = Duration::from_secs(86_400);
const GLOBAL: Rule = Rule::fixed_window(40, DAY);
const PER_USER: Rule = Rule::sliding_window(10, DAY);
const BUCKET: Rule = Rule::token_bucket(24, DAY);
/// Sets at once: a quarter per user, every other one with the user's bucket
/// too (cost 2 there).
const SETS: usize = 120;
/// Single checks of the global rule at once, among the sets.
const SINGLES: usize = 60;

/// The keys of one run.
struct Keys {
    global: String,
    users: Vec<String>,
    buckets: Vec<String>,
}

/// Units left of `key` under `rule`: what its peek says the next call
/// leaves, plus that call's unit.
async fn left(limiter: &RateLimiter, rule: &Rule, key: &str) -> u64 {
    let peek = limiter.peek(rule, key).await.unwrap();
    if peek.allowed { peek.remaining + 1 } else { 0 }
}

/// [`SETS`] sets (per user and global, some with the user's bucket, in
/// both orders) and [`SINGLES`] checks of the global rule, all at once:
/// exactly the global rule's 40 pass, each user's and bucket's budget is
/// its count less what the user's passed sets cost.
async fn mixed(limiter: &RateLimiter, keys: Keys) {
    let keys = Arc::new(keys);
    let mut sets = Vec::new();
    for i in 0..SETS {
        let (limiter, keys) = (limiter.clone(), Arc::clone(&keys));
        sets.push(tokio::spawn(async move {
            let user = i % keys.users.len();
            let mut set = vec![
                (&PER_USER, keys.users[user].as_str(), 1),
                (&GLOBAL, keys.global.as_str(), 1),
            ];
            let three = i % 2 == 1;
            if three {
                set.push((&BUCKET, keys.buckets[user].as_str(), 2));
            }
            if i % 3 == 0 {
                set.reverse();
            }
            let verdict = limiter.check_all(&set).await.expect("Redis answers");
            assert_eq!(verdict.decisions().len(), set.len());
            (user, three, verdict.allowed())
        }));
    }
    let mut singles = Vec::new();
    for _ in 0..SINGLES {
        let (limiter, keys) = (limiter.clone(), Arc::clone(&keys));
        singles.push(tokio::spawn(async move {
            let decision = limiter.check(&GLOBAL, &keys.global).await.unwrap();
            u64::from(decision.allowed)
        }));
    }
    let mut by_user = vec![0u64; keys.users.len()];
    let mut bucket_units = vec![0u64; keys.users.len()];
    for set in sets {
        let (user, three, passed) = set.await.unwrap();
        by_user[user] += u64::from(passed);
        bucket_units[user] += 2 * u64::from(passed && three);
    }
    let mut single_passes = 0;
    for single in singles {
        single_passes += single.await.unwrap();
    }
    let set_passes: u64 = by_user.iter().sum();
    assert_eq!(
        set_passes + single_passes,
        40,
        "{set_passes} sets and {single_passes} single checks passed"
    );
    assert_eq!(left(limiter, &GLOBAL, &keys.global).await, 0);
    for (user, key) in keys.users.iter().enumerate() {
        assert!(by_user[user] <= 10, "{by_user:?}");
        assert_eq!(
            left(limiter, &PER_USER, key).await,
            10 - by_user[user],
            "user {user}: a refused set took nothing ({by_user:?})"
        );
        assert_eq!(
            left(limiter, &BUCKET, &keys.buckets[user]).await,
            24 - bucket_units[user],
            "user {user}'s bucket"
        );
    }
}

/// A limiter as built by default (checks coalesced), with a deadline long
/// enough for a loaded test machine.
async fn coalescing(
    target: impl Into<ratelimit_runtime::backend::redis::RedisTarget>,
) -> RateLimiter {
    RateLimiter::builder()
        .redis(target)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_and_single_checks_share_batches_exactly_on_one_redis() {
    let server = RedisServer::start();
    let limiter = coalescing(server.url()).await;
    for run in 0..2 {
        let before = script_calls(&mut server.connection());
        mixed(
            &limiter,
            Keys {
                global: format!("limiter:{run}:global"),
                users: (0..4).map(|u| format!("limiter:{run}:user:{u}")).collect(),
                buckets: (0..4)
                    .map(|u| format!("limiter:{run}:bucket:{u}"))
                    .collect(),
            },
        )
        .await;
        let calls = script_calls(&mut server.connection()) - before;
        // Each set alone would be a script call of its own.
        assert!(
            (calls as usize) < SETS,
            "{SETS} sets and {SINGLES} checks took {calls} script calls: sets not coalesced"
        );
    }
    server.assert_all_keys_expire("limiter:*");
}

/// A key of the cluster master on `port`: `{prefix}:{n}`, the first such.
fn key_on(cluster: &RedisCluster, port: u16, prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}:{n}"))
        .find(|key| cluster.master_for(key) == port)
        .expect("a key of every master")
}

/// Script calls so far on every master of `cluster`.
fn cluster_script_calls(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|port| script_calls(&mut cluster.connection(port)))
        .sum()
}

/// Three runs at once on a 3-master cluster, `keys` naming each run's keys
/// (by its number and a name; a run's keys all on one master), single
/// checks coalesced among the sets: every run is exact, and the sets go in
/// masters' batches (fewer script calls than sets).
async fn cluster_runs(keys: impl Fn(&RedisCluster, usize, &str) -> String) {
    let cluster = RedisCluster::start();
    let limiter = coalescing(cluster.urls()).await;
    let before = cluster_script_calls(&cluster);
    let runs: Vec<_> = (0..3)
        .map(|run| {
            let on = |name: &str| keys(&cluster, run, name);
            let keys = Keys {
                global: on("global"),
                users: (0..4).map(|u| on(&format!("user:{u}"))).collect(),
                buckets: (0..4).map(|u| on(&format!("bucket:{u}"))).collect(),
            };
            let limiter = limiter.clone();
            tokio::spawn(async move { mixed(&limiter, keys).await })
        })
        .collect();
    for run in runs {
        run.await.unwrap();
    }
    let calls = cluster_script_calls(&cluster) - before;
    assert!(
        (calls as usize) < 3 * SETS,
        "{} sets and {} checks took {calls} script calls: sets not coalesced",
        3 * SETS,
        3 * SINGLES
    );
    let without: Vec<_> = cluster
        .keys_with_pttl("limiter:*")
        .into_iter()
        .filter(|(_, pttl)| *pttl == -1)
        .collect();
    assert!(without.is_empty(), "keys without a TTL: {without:?}");
}

/// Each run's keys in one slot (a hash tag).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_among_coalesced_checks_are_exact_on_a_cluster() {
    cluster_runs(|_, run, name| format!("limiter:{{run{run}}}:{name}")).await;
}

/// Each run's keys of several slots, all on one master (a master each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_among_coalesced_checks_of_several_slots_of_one_master() {
    cluster_runs(|cluster, run, name| {
        let port = cluster.masters()[run];
        key_on(cluster, port, &format!("limiter:{port}:{name}"))
    })
    .await;
}

/// Every check of a batch is decided under its own rule, however many
/// distinct rules the batch holds. A batch numbered its rules in one byte,
/// for the 128 checks it was thought to hold; but it takes 128 *units*,
/// and a set is one unit of several checks, so 200 sets of two rules each
/// brought 256 rules or more, and the later ones were all decided under
/// rule 255's count.
///
/// On one thread, the sets spawned at once are all queued before the batch
/// task runs.
#[tokio::test]
async fn each_check_of_a_batch_of_many_rules_is_decided_under_its_own() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let sets: Vec<_> = (0..200u64)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let (a, b) = (
                    Rule::fixed_window(1_000 + 2 * i, Duration::from_secs(60)),
                    Rule::fixed_window(1_001 + 2 * i, Duration::from_secs(60)),
                );
                let (ka, kb) = (format!("limiter:many:{i}:a"), format!("limiter:many:{i}:b"));
                let verdict = limiter
                    .check_all(&[(&a, &ka, 1), (&b, &kb, 1)])
                    .await
                    .unwrap();
                assert!(verdict.allowed());
                let left: Vec<u64> = verdict.decisions().iter().map(|d| d.remaining).collect();
                (left, vec![a.count() - 1, b.count() - 1])
            })
        })
        .collect();
    for set in sets {
        let (left, expected) = set.await.unwrap();
        assert_eq!(left, expected, "each check under its own rule");
    }
}
