//! The function library refused, lost or out of reach, against real
//! servers: an ACL that revokes `FCALL` under load, `FUNCTION` refused while
//! the library is missing, a cluster master whose functions are flushed
//! while batches are bound for it. Every call goes on by `EVALSHA`, none
//! fails, each is counted once, and calls go by `FCALL` again once the
//! library can be used.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{Backend, Rule};
use ratelimit_test_support::{RedisCluster, RedisServer, acl_server, calls_of, first_ok};

/// Sets the ACL rule `rule` (`-fcall`, `+function`, ..) of the user
/// `limiter`.
fn acl(server: &RedisServer, rule: &str) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("limiter")
        .arg(rule)
        .query(&mut server.connection())
        .unwrap();
}

async fn as_limiter(server: &RedisServer) -> RedisBackend {
    let url = format!("redis://limiter:s3cret@127.0.0.1:{}/", server.port());
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    RedisBackend::connect(&url, options).await.unwrap()
}

/// The units a fixed window's state holds.
fn counted(connection: &mut redis::Connection, key: &str) -> u64 {
    let bytes: Vec<u8> = redis::cmd("GET").arg(key).query(connection).unwrap();
    f64::from_be_bytes(bytes[4..12].try_into().unwrap()) as u64
}

/// Waits until a check goes by `FCALL` again.
async fn back_to_fcall(redis: &RedisBackend, node: &mut redis::Connection, rule: &Rule) {
    back_to_fcall_on(redis, node, rule, "limiter:fn:probe").await;
}

/// Waits until a check of `key` (on `node`) goes by `FCALL` again.
async fn back_to_fcall_on(
    redis: &RedisBackend,
    node: &mut redis::Connection,
    rule: &Rule,
    key: &str,
) {
    let node = std::sync::Mutex::new(node);
    first_ok("still by EVALSHA", Duration::from_millis(50), || async {
        let before = calls_of(&mut node.lock().unwrap(), "fcall");
        redis.check(rule, key, 1).await.unwrap();
        if calls_of(&mut node.lock().unwrap(), "fcall") > before {
            Ok(())
        } else {
            Err("no FCALL")
        }
    })
    .await;
}

/// An ACL that revokes `FCALL` while 16 tasks check, and restores it: every
/// check was answered (none failed with NOPERM), Redis counted each allowed
/// one once, the checks went by `EVALSHA` meanwhile, and by `FCALL` again
/// once allowed. Before, about half the checks failed while it was revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcall_revoked_under_load_fails_no_check() {
    let server = acl_server();
    let redis = as_limiter(&server).await;
    let rule = Rule::fixed_window(1_000_000_000, Duration::from_secs(60));
    let key = "limiter:fn:load";
    let (stop, allowed, failed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (redis, stop, allowed, failed) =
                (redis.clone(), stop.clone(), allowed.clone(), failed.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match redis.check(&rule, key, 1).await {
                        Ok(decision) => {
                            assert!(decision.allowed);
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            eprintln!("{error}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    let mut admin = server.connection();
    tokio::time::sleep(Duration::from_millis(500)).await;
    acl(&server, "-fcall");
    let revoked = calls_of(&mut admin, "evalsha");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let by_scripts = calls_of(&mut admin, "evalsha") - revoked;
    acl(&server, "+fcall");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "checks failed");
    assert!(
        by_scripts > 10,
        "{by_scripts} checks by EVALSHA while revoked"
    );
    assert_eq!(counted(&mut admin, key), allowed.load(Ordering::Relaxed));
    back_to_fcall(&redis, &mut admin, &rule).await;
}

/// The library lost (`FUNCTION FLUSH`) while the user may not load it: the
/// checks go by `EVALSHA`, and once `FUNCTION` is allowed again the library
/// is loaded and they go by `FCALL`. Before, the process stayed on `EVALSHA`
/// for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_lost_while_function_is_refused_comes_back() {
    let server = acl_server();
    let redis = as_limiter(&server).await;
    let rule = Rule::fixed_window(1_000, Duration::from_secs(60));
    let mut admin = server.connection();
    acl(&server, "-function");
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut admin)
        .unwrap();
    for left in (990..=999).rev() {
        let decision = redis.check(&rule, "limiter:fn:lost", 1).await.unwrap();
        assert_eq!(decision.remaining, left);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    acl(&server, "+function");
    back_to_fcall(&redis, &mut admin, &rule).await;
}

/// A cluster master's functions flushed while per-master batches are bound
/// for it: those batches meet "function not found", and each of their
/// checks goes again alone (by `EVALSHA`); none fails, each is counted
/// once, and the library is loaded on that master again. Before, the batch
/// came back as a type error and every check in it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_that_lost_its_library_fails_no_batch() {
    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(cluster.urls(), options)
        .await
        .unwrap()
        .batch_every_check();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let keys: Arc<Vec<(String, Rule)>> =
        Arc::new((0..30).map(|i| (format!("limiter:fn:{i}"), rule)).collect());
    let flushed = cluster.master_for(&keys[0].0);
    let load = common::load(32, 7, keys.clone(), |_| redis.clone());
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query(&mut cluster.connection(flushed))
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let allowed = load.stop().await;
    for ((key, _), allowed) in keys.iter().zip(allowed) {
        let master = cluster.master_for(key);
        assert_eq!(
            counted(&mut cluster.connection(master), key),
            allowed,
            "{key}"
        );
    }
    first_ok(
        "the library not loaded again",
        Duration::from_millis(50),
        || {
            let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .query(&mut cluster.connection(flushed))
                .unwrap();
            let probe = redis.check(&rule, &keys[0].0, 1);
            async move {
                probe.await.unwrap();
                if listed.is_empty() {
                    Err("none")
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
}

/// Waits until `manager` (the limiter's connection) answers `PING`: it has
/// connected again after a restart, and no check is spent on that.
async fn reconnected(manager: &redis::aio::ConnectionManager) {
    first_ok("no PONG", Duration::from_millis(50), || {
        let mut manager = manager.clone();
        async move { redis::cmd("PING").query_async::<String>(&mut manager).await }
    })
    .await;
}

/// A server restarted without `FCALL` (an older or proxied Redis, renamed
/// here) while the limiter is connected: the first `FCALL` meets "unknown
/// command" quoting the call's bytes, which the client cannot read; a call
/// of text then shows `FCALL` refused, so that check goes again by
/// `EVALSHA`. No check fails, each is counted once, and restarted with it,
/// the library is loaded and used again. Before, the first check failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_fcall_is_served_by_scripts() {
    let mut server = RedisServer::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let client = redis::Client::open(server.url()).unwrap();
    let manager = client.get_connection_manager().await.unwrap();
    let redis = RedisBackend::connect(manager.clone(), options)
        .await
        .unwrap();
    let rule = Rule::fixed_window(1_000, Duration::from_secs(60));
    let key = "limiter:fn:renamed";
    let mut admin = server.connection();
    let before = calls_of(&mut admin, "fcall");
    assert!(redis.check(&rule, key, 1).await.unwrap().allowed);
    assert_eq!(calls_of(&mut admin, "fcall"), before + 1, "by FCALL");
    server.restart_with_args(&["--rename-command", "FCALL", ""]);
    reconnected(&manager).await;
    let mut admin = server.connection();
    for left in (990..=999).rev() {
        let decision = redis.check(&rule, key, 1).await.expect("answered");
        assert_eq!(decision.remaining, left);
    }
    assert_eq!(counted(&mut admin, key), 10);
    assert!(calls_of(&mut admin, "evalsha") >= 10, "by EVALSHA");
    server.restart();
    reconnected(&manager).await;
    let mut admin = server.connection();
    back_to_fcall(&redis, &mut admin, &rule).await;
}

/// Sets the ACL rule `rule` of the default user on every node.
fn acl_everywhere(cluster: &RedisCluster, rule: &str) {
    for node in &cluster.nodes {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg("default")
            .arg(rule)
            .query(&mut node.connection())
            .unwrap();
    }
}

/// The `FCALL`s all masters ran so far.
fn cluster_fcalls(cluster: &RedisCluster) -> u64 {
    cluster
        .masters()
        .into_iter()
        .map(|port| calls_of(&mut cluster.connection(port), "fcall"))
        .sum()
}

/// On a cluster, an ACL that revokes `FCALL` while 16 tasks check keys of
/// every master, alone and in per-master batches, then restores it: every
/// check answered, each counted once, the library used again, and checks
/// coalesced per master again (fewer `FCALL`s than checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcall_revoked_on_a_cluster_fails_no_batch() {
    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let alone = RedisBackend::connect(cluster.urls(), options)
        .await
        .unwrap();
    let batched = alone.clone().batch_every_check();
    let rule = Rule::fixed_window(1_000_000, Duration::from_secs(60));
    let keys: Arc<Vec<(String, Rule)>> = Arc::new(
        (0..30)
            .map(|i| (format!("limiter:acl:{i}"), rule))
            .collect(),
    );
    let load = common::load(16, 7, keys.clone(), |task| {
        if task % 2 == 0 { &alone } else { &batched }.clone()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    acl_everywhere(&cluster, "-fcall");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    acl_everywhere(&cluster, "+fcall");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let allowed = load.stop().await;
    for ((key, _), allowed) in keys.iter().zip(allowed) {
        let master = cluster.master_for(key);
        assert_eq!(
            counted(&mut cluster.connection(master), key),
            allowed,
            "{key}"
        );
    }
    let cluster = &cluster;
    first_ok("still by EVALSHA", Duration::from_millis(50), || {
        let before = cluster_fcalls(cluster);
        let check = batched.check(&rule, &keys[0].0, 1);
        async move {
            check.await.unwrap();
            if cluster_fcalls(cluster) > before {
                Ok(())
            } else {
                Err("no FCALL")
            }
        }
    })
    .await;
    // Checks are coalesced per master again: some round of 30 checks at
    // once goes in fewer calls than checks (each alone, as many).
    first_ok(
        "no batch of several checks",
        Duration::from_millis(50),
        || {
            let before = cluster_fcalls(cluster);
            let mut checks = tokio::task::JoinSet::new();
            for (key, _) in keys.iter() {
                let (batched, key) = (batched.clone(), key.clone());
                checks.spawn(async move { batched.check(&rule, &key, 1).await });
            }
            let keys = keys.len() as u64;
            async move {
                for decision in checks.join_all().await {
                    assert!(decision.expect("every check answered").allowed);
                }
                let calls = cluster_fcalls(cluster) - before;
                if calls < keys {
                    Ok(())
                } else {
                    Err(format!("{calls} FCALLs for {keys} checks"))
                }
            }
        },
    )
    .await;
}

/// One master's library flushed at a time: a check bound for it meets
/// "function not found", and the library, tried again, is loaded there.
/// Every master is asked: before, one was, at random, and one that still
/// had it answered for the master that had lost it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_that_lost_its_library_gets_it_again() {
    let cluster = RedisCluster::start();
    let options = ConnectOptions {
        timeout: Duration::from_secs(2),
        ..ConnectOptions::default()
    };
    let redis = RedisBackend::connect(cluster.urls(), options)
        .await
        .unwrap();
    let rule = Rule::fixed_window(1_000, Duration::from_secs(60));
    let masters = cluster.masters();
    for round in 0..4 {
        let flushed = masters[round % masters.len()];
        let key = (0..)
            .map(|i| format!("limiter:lost:{i}"))
            .find(|key| cluster.master_for(key) == flushed)
            .unwrap();
        // The try of the library the round before made is over: checks go
        // by FCALL there.
        let mut node = cluster.connection(flushed);
        back_to_fcall_on(&redis, &mut node, &rule, &key).await;
        let _: () = redis::cmd("FUNCTION")
            .arg("FLUSH")
            .query(&mut node)
            .unwrap();
        assert!(redis.check(&rule, &key, 1).await.unwrap().allowed);
        first_ok("not loaded again", Duration::from_millis(50), || {
            let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .query(&mut cluster.connection(flushed))
                .unwrap();
            async move {
                if listed.is_empty() {
                    Err(format!("round {round}: none on {flushed}"))
                } else {
                    Ok(())
                }
            }
        })
        .await;
    }
}
