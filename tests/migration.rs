//! A slot moved from one master to another while the limiter uses it, on a
//! real cluster, step by step as `redis-cli --cluster reshard` moves it:
//! `CLUSTER SETSLOT .. IMPORTING` and `MIGRATING`, keys moved by `MIGRATE`,
//! then the slot given to the target. Nothing is lost: every check is
//! answered, each counted once, where its key is.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::RuleCheck;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{Backend, Rule};
use ratelimit_test_support::{Migration, RedisCluster, calls_of};

async fn cluster_backend(cluster: &RedisCluster) -> RedisBackend {
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    RedisBackend::connect(cluster.urls(), options)
        .await
        .expect("connecting to the test cluster")
}

/// A master other than the one on `port`.
fn another(cluster: &RedisCluster, port: u16) -> u16 {
    *cluster.masters().iter().find(|&&p| p != port).unwrap()
}

/// While a slot migrates, a key it does not hold yet is answered `ASK` by
/// the master the slot leaves: the check goes to the master it names,
/// after `ASKING`, and is counted there. Before, the redirect was not
/// followed and every check of such a key failed for the whole migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_new_to_a_migrating_slot_is_checked_where_it_goes() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    let from = cluster.master_for("limiter:{ask}:0");
    let to = another(&cluster, from);
    let migration = cluster.begin_migration("limiter:{ask}:0", to);
    for i in 0..10 {
        let key = format!("limiter:{{ask}}:{i}");
        for left in [9, 8] {
            let decision = redis.check(&rule, &key, 1).await.expect("answered");
            assert_eq!(decision.remaining, left, "{key}");
        }
    }
    let on_target: Vec<String> = redis::cmd("KEYS")
        .arg("limiter:{ask}:*")
        .query(&mut cluster.connection(to))
        .unwrap();
    assert_eq!(on_target.len(), 10, "{on_target:?}");
    cluster.finish_migration(&migration);
}

/// A sliding log that grows from 10 units to 30 while its slot migrates
/// (its key still on the master the slot leaves): earlier versions moved a
/// log past 16 units from a string to a sorted set by deleting the key and
/// writing it again, which that master refuses half way: the log was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_sliding_log_keeps_its_calls_while_its_slot_migrates() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    let rule = Rule::sliding_log(1_000, Duration::from_secs(60));
    let key = "limiter:{grow}:log";
    for _ in 0..10 {
        assert!(redis.check(&rule, key, 1).await.unwrap().allowed);
    }
    let from = cluster.master_for(key);
    let migration = cluster.begin_migration(key, another(&cluster, from));
    for call in 11..=30 {
        let decision = redis.check(&rule, key, 1).await.expect("answered");
        assert_eq!(decision.remaining, 1_000 - call, "call {call}");
    }
    while cluster.migrate_keys(&migration, 10) > 0 {}
    cluster.finish_migration(&migration);
    let next = redis.check(&rule, key, 1).await.unwrap();
    assert_eq!(next.remaining, 1_000 - 31, "the log's calls are all there");
}

/// Sixteen tasks check twelve keys of one slot (fixed windows and sliding
/// logs, alone and in per-master batches) while the slot moves to another
/// master, two keys at a time: every check is answered, and each key's
/// budget counts exactly the checks that were allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moved_under_load_loses_nothing() {
    let cluster = RedisCluster::start();
    let alone = cluster_backend(&cluster).await;
    let batched = cluster_backend(&cluster).await.batch_every_check();
    let keys: Arc<Vec<(String, Rule)>> = Arc::new(
        (0..12)
            .map(|i| {
                let rule = if i % 2 == 0 {
                    Rule::fixed_window(1_000_000, Duration::from_secs(60))
                } else {
                    Rule::sliding_log(1_000_000, Duration::from_secs(60))
                };
                (format!("limiter:{{moved}}:{i}"), rule)
            })
            .collect(),
    );
    let from = cluster.master_for(&keys[0].0);
    let to = another(&cluster, from);
    let load = common::load(16, 5, keys.clone(), |task| {
        if task % 2 == 0 { &alone } else { &batched }.clone()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let migration = cluster.begin_migration(&keys[0].0, to);
    while cluster.migrate_keys(&migration, 2) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.finish_migration(&migration);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let allowed = load.stop().await;
    assert_eq!(cluster.master_for(&keys[0].0), to, "the slot moved");
    for ((key, rule), allowed) in keys.iter().zip(allowed) {
        let next = alone.peek(rule, key).await.unwrap();
        assert_eq!(next.remaining, 1_000_000 - allowed - 1, "{key}");
    }
}

/// A set of keys of several slots of one master goes in one call of the
/// library's cross-slot function; while one of those slots migrates, a key
/// new to it is not on that master, and the call answers that nothing ran.
/// The set then goes a call per slot, which follows the move. Before, it
/// failed the same way every time, for the whole migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_over_a_masters_slots_is_answered_while_one_migrates() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    let moving = "limiter:{spread-moving}:a";
    let from = cluster.master_for(moving);
    let staying = (0..)
        .map(|i| format!("limiter:{{spread-{i}}}:b"))
        .find(|k| cluster.master_for(k) == from)
        .unwrap();
    // The slot map is known (one check), and every key is new.
    redis.check(&rule, &staying, 1).await.unwrap();
    let migration = cluster.begin_migration(moving, another(&cluster, from));
    let set = [
        RuleCheck {
            rule: &rule,
            key: moving,
            cost: 1,
            lease: 0,
        },
        RuleCheck {
            rule: &rule,
            key: &staying,
            cost: 1,
            lease: 0,
        },
    ];
    for call in 1..=5 {
        let decisions = redis.check_all(&set).await.expect("answered");
        let left: Vec<u64> = decisions.iter().map(|d| d.remaining).collect();
        assert_eq!(left, [10 - call, 9 - call], "call {call}");
    }
    cluster.finish_migration(&migration);
}

/// `key` holding someone else's string on its master, its slot then
/// migrating to another: a check that replaces the string (a sliding log's)
/// deletes it, and its write is refused half way.
fn held_by_someone_else(cluster: &RedisCluster, key: &str) -> Migration {
    let from = cluster.master_for(key);
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("someone else's")
        .query(&mut cluster.connection(from))
        .unwrap();
    cluster.begin_migration(key, another(cluster, from))
}

/// A cluster master's batch holding a key it cannot write: a sliding log's
/// key held someone else's string, which the check replaces (deleting it,
/// then writing the log), in a slot migrating away. The write is refused
/// half way; that check alone goes again (to where its key now goes, after
/// `ASK`), and the batch's other checks stand, answered and counted once.
/// Before, the batch failed as a whole: its other checks were counted in
/// Redis and every caller was told it failed.
///
/// On one thread, the nine checks are all queued before the batch task
/// runs: they go in one call, which the master's `FCALL` count shows (the
/// log check sent alone meets `ASK` there, which runs nothing).
#[tokio::test]
async fn a_write_refused_in_a_batch_fails_that_check_alone() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await.batch_every_check();
    let log = Rule::sliding_log(10, Duration::from_secs(60));
    let window = Rule::fixed_window(10, Duration::from_secs(60));
    let key = "limiter:{split}:log";
    let from = cluster.master_for(key);
    let others: Vec<String> = (0..)
        .map(|i| format!("limiter:split:{i}"))
        .filter(|k| cluster.master_for(k) == from && !k.contains("{split}"))
        .take(8)
        .collect();
    let migration = held_by_someone_else(&cluster, key);
    let mut admin = cluster.connection(from);
    let before = calls_of(&mut admin, "fcall");
    let logged = {
        let redis = redis.clone();
        tokio::spawn(async move { redis.check(&log, key, 1).await })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for other in others.clone() {
        let redis = redis.clone();
        tasks.spawn(async move { redis.check(&window, &other, 1).await });
    }
    for decision in tasks.join_all().await {
        let decision = decision.expect("every check answered");
        assert!(decision.allowed && decision.remaining == 9, "{decision:?}");
    }
    let checked = logged.await.unwrap().expect("answered");
    assert!(checked.allowed && checked.remaining == 9, "{checked:?}");
    assert_eq!(
        calls_of(&mut admin, "fcall") - before,
        1,
        "the nine checks in one call on their master"
    );
    cluster.finish_migration(&migration);
    for other in &others {
        let next = redis.peek(&window, other).await.unwrap();
        assert_eq!(next.remaining, 8, "{other}: counted once");
    }
}

/// A set of rules on one master whose keys are of several slots runs as one
/// call of the library's cross-slot function. When the master refuses the
/// write of one member half way (a sliding log's key holding someone
/// else's string, in a slot migrating away), the members written before it
/// are given back, and the set goes again a call per slot: it is answered,
/// each member counted once. Before, the fixed window kept the unit the
/// refused call had taken (and the set failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_write_is_refused_half_way_keeps_nothing() {
    let cluster = RedisCluster::start();
    let redis = cluster_backend(&cluster).await;
    let window = Rule::fixed_window(10, Duration::from_secs(60));
    let log = Rule::sliding_log(10, Duration::from_secs(60));
    let logged = "limiter:{half}:log";
    let from = cluster.master_for(logged);
    let counted = (0..)
        .map(|i| format!("limiter:{{half-{i}}}:window"))
        .find(|k| cluster.master_for(k) == from)
        .unwrap();
    let migration = held_by_someone_else(&cluster, logged);
    let check = |rule, key| RuleCheck {
        rule,
        key,
        cost: 1,
        lease: 0,
    };
    let set = [check(&window, &counted), check(&log, logged)];
    let mut admin = cluster.connection(from);
    let before = calls_of(&mut admin, "fcall");
    let decisions = redis
        .check_all(&set)
        .await
        .expect("answered a slot at a time");
    let left: Vec<u64> = decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(left, [9, 9], "each counted once: {decisions:?}");
    assert!(
        calls_of(&mut admin, "fcall") - before >= 3,
        "the set in one call, its give-back, then a call per slot"
    );
    let next = redis.peek(&window, &counted).await.unwrap();
    assert_eq!(
        next.remaining, 8,
        "nothing kept of the refused call: {next:?}"
    );
    cluster.finish_migration(&migration);
}
