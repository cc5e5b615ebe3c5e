//! Coalesced checks on one redis-server: many concurrent checks of mixed
//! algorithms and keys go out in fewer script calls than checks, and
//! each still gets exactly the answer it would get alone.

use std::sync::Arc;
use std::time::Duration;

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{RateLimiter, Rule};
use ratelimit_test_support::{RedisServer, calls_of, first_ok, script_calls};

const RULES: [Rule; 5] = [
    Rule::fixed_window(30, Duration::from_secs(60)),
    Rule::sliding_log(30, Duration::from_secs(60)),
    Rule::sliding_window(30, Duration::from_secs(60)),
    Rule::token_bucket(1, Duration::from_secs(60)).with_burst(30),
    Rule::gcra(1, Duration::from_secs(60)).with_burst(30),
];
const LEASES: Rule = Rule::concurrency(20, Duration::from_secs(60));

/// The key of rule `r` in the burst: a short one or, every other rule, one
/// longer than the batch queue keeps in place (so both ways of holding a
/// queued check's key go through batches, repeats of one key included).
fn key_of(r: usize) -> String {
    if r.is_multiple_of(2) {
        format!("co:{r}")
    } else {
        format!("co:{r}:{}", "long-key-part-".repeat(4))
    }
}

/// 100 concurrent checks per rule on one key each, plus 100
/// concurrent leases: every rule lets exactly 30 units through, the leases
/// never exceed 20 in flight, and keys all carry a TTL. Returns how many
/// script calls carried the checks.
async fn mixed_burst(limiter: &RateLimiter, server: &RedisServer) -> (u64, u64) {
    let before = script_calls(&mut server.connection());
    let mut tasks = Vec::new();
    for (r, rule) in RULES.iter().enumerate() {
        for _ in 0..100 {
            let limiter = limiter.clone();
            let rule = *rule;
            tasks.push(tokio::spawn(async move {
                let decision = limiter
                    .check(&rule, &key_of(r))
                    .await
                    .expect("Redis answers");
                (r, u64::from(decision.allowed))
            }));
        }
    }
    let in_flight = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut leases = Vec::new();
    for _ in 0..100 {
        let (limiter, in_flight, peak) = (limiter.clone(), in_flight.clone(), peak.clone());
        leases.push(tokio::spawn(async move {
            let permit = limiter.acquire(&LEASES, "co:leases", 1).await.unwrap();
            if permit.decision().allowed {
                let now = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                peak.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::task::yield_now().await;
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                permit.release().await.unwrap();
                1
            } else {
                0
            }
        }));
    }
    let mut used = [0u64; RULES.len()];
    for task in tasks {
        let (r, units) = task.await.unwrap();
        used[r] += units;
    }
    let mut granted = 0;
    for lease in leases {
        granted += lease.await.unwrap();
    }
    for (r, units) in used.iter().enumerate() {
        assert_eq!(*units, 30, "{:?}: allowed of 30", RULES[r].algorithm());
    }
    let peak = peak.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        granted >= 20 && peak <= 20,
        "{granted} leases, {peak} at once"
    );
    server.assert_all_keys_expire("co:*");
    let calls = script_calls(&mut server.connection()) - before;
    // 500 checks + up to 100 acquires and their releases.
    (calls, 500 + 100 + granted)
}

/// A limiter on `server` as built by default: concurrent checks coalesced.
async fn coalescing(server: &RedisServer) -> RateLimiter {
    RateLimiter::builder()
        .redis(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_share_script_calls_and_keep_their_answers() {
    let server = RedisServer::start();
    let limiter = coalescing(&server).await;
    let (calls, checks) = mixed_burst(&limiter, &server).await;
    assert!(
        calls * 2 < checks,
        "{checks} checks took {calls} script calls: not coalesced"
    );
    // The budgets are spent in Redis, not only in the answers.
    for (r, rule) in RULES.iter().enumerate() {
        let decision = limiter.check(rule, &key_of(r)).await.unwrap();
        assert!(!decision.allowed, "{:?} after 30", rule.algorithm());
        assert_eq!(decision.remaining, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_coalescing_every_check_is_its_own_call() {
    let server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url())
        .coalesce(false)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let (calls, checks) = mixed_burst(&limiter, &server).await;
    // Releases go alone too, one call each.
    assert_eq!(calls, checks, "one call per check and per release");
    assert_eq!(
        libraries(&server).len(),
        1,
        "each call goes by the library's function for one call"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_fails_each_of_its_checks_and_the_next_one_works() {
    let mut server = RedisServer::start();
    let limiter = RateLimiter::builder()
        .redis(server.url())
        .on_backend_error(ratelimit_runtime::OnError::Deny)
        .timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let rule = RULES[0];
    assert!(limiter.check(&rule, "co:f").await.unwrap().allowed);
    server.kill();
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(
            async move { limiter.check(&rule, "co:f").await },
        ));
    }
    for task in tasks {
        let answer = task.await.unwrap();
        assert!(
            matches!(answer, Err(ratelimit_runtime::Error::Backend(_))),
            "deny while Redis is down: {answer:?}"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered within the deadline"
    );
    server.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(decision) = limiter.check(&rule, "co:g").await {
            assert!(decision.allowed, "a fresh key");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Redis back, checks pass again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The defaults, with deadlines long enough for a loaded test machine.
fn patient() -> ConnectOptions {
    ConnectOptions {
        timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

/// A backend whose checks all go in batches.
async fn batching(url: &str, functions: bool) -> RedisBackend {
    let options = ConnectOptions {
        functions,
        ..patient()
    };
    RedisBackend::connect(url, options)
        .await
        .unwrap()
        .batch_every_check()
}

/// The names of the function libraries loaded in the server.
fn libraries(server: &RedisServer) -> Vec<String> {
    let listed: Vec<Vec<redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    listed
        .iter()
        .map(|library| match &library[1] {
            redis::Value::BulkString(name) => String::from_utf8(name.clone()).unwrap(),
            other => panic!("FUNCTION LIST: {other:?}"),
        })
        .collect()
}

/// Where the server has functions, a batch is one `FCALL` of the batch
/// script loaded as a library; after `FUNCTION FLUSH` (or a restart) the
/// batch that meets the library missing is sent again once by `EVALSHA`,
/// and the library is loaded again: the batches after it go by `FCALL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_call_the_function_library_and_reload_it_after_function_flush() {
    let server = RedisServer::start();
    let redis = batching(&server.url(), true).await;
    let rule = RULES[0];
    let check = || ratelimit_runtime::Backend::check(&redis, &rule, "co:function", 1);
    // The library was called when loaded (an empty batch, to see that
    // FCALL is allowed): one call more for the check.
    let loading = calls_of(&mut server.connection(), "fcall");
    assert_eq!(check().await.unwrap().remaining, 29);
    assert_eq!(calls_of(&mut server.connection(), "fcall"), loading + 1);
    assert_eq!(calls_of(&mut server.connection(), "evalsha"), 0);
    let loaded = libraries(&server);
    assert!(
        loaded.len() == 1 && loaded[0].starts_with("ratelimit_"),
        "{loaded:?}"
    );
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(check().await.unwrap().remaining, 28);
    assert_eq!(
        calls_of(&mut server.connection(), "evalsha"),
        1,
        "sent again by EVALSHA"
    );
    first_ok(
        "the library loaded again",
        Duration::from_millis(20),
        || {
            let listed = libraries(&server);
            let loaded = &loaded;
            async move {
                if listed == *loaded {
                    Ok(())
                } else {
                    Err(format!("{listed:?}"))
                }
            }
        },
    )
    .await;
    // Then batches go by FCALL again.
    let mut remaining = 27;
    first_ok("back to FCALL", Duration::from_millis(20), || {
        let before = calls_of(&mut server.connection(), "fcall");
        let expected = remaining;
        remaining -= 1;
        let check = check();
        let server = &server;
        async move {
            assert_eq!(check.await.unwrap().remaining, expected);
            let fcalls = calls_of(&mut server.connection(), "fcall") - before;
            if fcalls == 1 {
                Ok(())
            } else {
                Err(format!("{fcalls} FCALLs"))
            }
        }
    })
    .await;
    // The opt-out loads no library and sends EVALSHA.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    let scripts_only = batching(&server.url(), false).await;
    let evalshas = calls_of(&mut server.connection(), "evalsha");
    let decision = ratelimit_runtime::Backend::check(&scripts_only, &rule, "co:function", 1);
    assert_eq!(decision.await.unwrap().remaining, remaining);
    assert_eq!(calls_of(&mut server.connection(), "evalsha"), evalshas + 1);
    assert!(libraries(&server).is_empty());
}

/// A user whose ACL denies `FUNCTION` cannot load the library (as on a
/// server before Redis 7, which has none), or denies `FCALL`: batches go by
/// `EVALSHA`, and work.
#[tokio::test]
async fn without_functions_batches_go_by_evalsha() {
    let server = RedisServer::start();
    let redis = batching(&server.user_url("limited", "-function"), true).await;
    let rule = RULES[0];
    // The library was tried when connecting (missing, and not loaded).
    let tried = calls_of(&mut server.connection(), "fcall");
    for remaining in [29, 28, 27] {
        let decision = ratelimit_runtime::Backend::check(&redis, &rule, "co:acl", 1);
        assert_eq!(decision.await.unwrap().remaining, remaining);
    }
    assert_eq!(calls_of(&mut server.connection(), "evalsha"), 3);
    assert_eq!(calls_of(&mut server.connection(), "fcall"), tried);
    assert!(libraries(&server).is_empty());
    // A user who may load functions but not call them: the same.
    let redis = batching(&server.user_url("loader", "-fcall"), true).await;
    for remaining in [26, 25] {
        let decision = ratelimit_runtime::Backend::check(&redis, &rule, "co:acl", 1);
        assert_eq!(decision.await.unwrap().remaining, remaining);
    }
    assert_eq!(calls_of(&mut server.connection(), "evalsha"), 5);
}

/// Where the server has functions, a check or a release that goes alone
/// (nothing else on its way) is one `FCALL` of the library: each
/// algorithm's own driver and the release are functions there too, so the
/// server does not run the script's prelude at each call. After `FUNCTION
/// FLUSH` the library is loaded again. Without functions they go by
/// `EVALSHA` of the rule's script (the release: the batch script), loaded
/// again after `SCRIPT FLUSH`.
#[tokio::test]
async fn calls_alone_go_by_the_library_or_by_their_scripts() {
    use ratelimit_runtime::Backend as _;
    let server = RedisServer::start();
    let with_functions = RedisBackend::connect(&server.url(), patient())
        .await
        .unwrap();
    let without = ConnectOptions {
        functions: false,
        ..patient()
    };
    let scripts_only = RedisBackend::connect(&server.url(), without).await.unwrap();
    for (name, redis, by, flush) in [
        ("library", &with_functions, "fcall", "FUNCTION"),
        ("scripts", &scripts_only, "evalsha", "SCRIPT"),
    ] {
        let before = (
            calls_of(&mut server.connection(), "fcall"),
            calls_of(&mut server.connection(), "evalsha"),
        );
        for (i, rule) in RULES.iter().enumerate() {
            let decision = redis.check(rule, &format!("co:alone:{name}:{i}"), 1).await;
            assert_eq!(decision.unwrap().remaining, 29, "{name}: {rule:?}");
        }
        // A lease of three units taken and given back, alone: then the
        // whole capacity can be taken (each of its members was removed).
        let key = format!("co:alone:{name}:lease");
        let taken = redis.acquire(&LEASES, &key, 3, 11).await.unwrap();
        assert_eq!(taken.remaining, 17, "{name}");
        redis.release(&LEASES, &key, 3, 11).await.unwrap();
        let whole = redis.acquire(&LEASES, &key, 20, 12).await.unwrap();
        assert!(whole.allowed, "{name}: the released lease still counts");
        let calls = (
            calls_of(&mut server.connection(), "fcall"),
            calls_of(&mut server.connection(), "evalsha"),
        );
        let sent = RULES.len() as u64 + 3;
        match by {
            "fcall" => assert_eq!(calls, (before.0 + sent, before.1), "{name}"),
            _ => assert_eq!(calls, (before.0, before.1 + sent), "{name}"),
        }
        // The server loses what the calls use: loaded again, once.
        let _: () = redis::cmd(flush)
            .arg("FLUSH")
            .query(&mut server.connection())
            .unwrap();
        let again = redis
            .check(&RULES[0], &format!("co:alone:{name}:0"), 1)
            .await;
        assert_eq!(again.unwrap().remaining, 28, "{name}: after {flush} FLUSH");
        redis.release(&LEASES, &key, 20, 12).await.unwrap();
        let after = redis.acquire(&LEASES, &key, 20, 13).await.unwrap();
        assert!(after.allowed, "{name}: released after {flush} FLUSH");
    }
    first_ok(
        "the library loaded again",
        Duration::from_millis(20),
        || {
            let listed = libraries(&server);
            async move {
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

/// With the library off, a batch is an `EVALSHA`; after `SCRIPT FLUSH` the
/// batch script is loaded again and the batch re-sent once.
#[tokio::test]
async fn the_batch_script_is_reloaded_after_script_flush() {
    let server = RedisServer::start();
    let redis = batching(&server.url(), false).await;
    let rule = RULES[0];
    let check = || ratelimit_runtime::Backend::check(&redis, &rule, "co:flush", 1);
    assert_eq!(check().await.unwrap().remaining, 29);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    // NOSCRIPT: the batch script is loaded again and the batch re-sent once.
    assert_eq!(check().await.unwrap().remaining, 28);
}

/// Leases of one to three units, taken and given back by many tasks at
/// once while other checks run: batches mix checks, acquires and releases
/// of all sizes, and each release takes back exactly its own lease. When all
/// are done no lease is left, and the whole capacity can be taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_batches_release_exactly_their_own_leases() {
    let server = RedisServer::start();
    let limiter = coalescing(&server).await;
    let rule = Rule::concurrency(1_000, Duration::from_secs(60));
    let before = script_calls(&mut server.connection());
    let mut tasks = Vec::new();
    for t in 0..60u64 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..5u64 {
                let key = format!("co:units:{}", (t + round) % 3);
                let cost = 1 + (t + round) % 3;
                let permit = limiter.acquire(&rule, &key, cost).await.unwrap();
                assert!(permit.decision().allowed);
                let other = limiter.check(&RULES[0], &format!("co:other:{t}")).await;
                assert!(other.unwrap().allowed);
                permit.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // 300 acquires, 300 releases and 300 checks.
    let calls = script_calls(&mut server.connection()) - before;
    assert!(calls * 2 < 900, "{calls} script calls: not coalesced");
    for k in 0..3 {
        let key = format!("co:units:{k}");
        let live: u64 = redis::cmd("ZCOUNT")
            .arg(&key)
            .arg("(0")
            .arg("+inf")
            .query(&mut server.connection())
            .unwrap();
        assert_eq!(live, 0, "{key}: leases left behind");
        let all = limiter.acquire(&rule, &key, 1_000).await.unwrap();
        assert!(all.decision().allowed, "{key}: the whole capacity again");
        assert_eq!(all.decision().remaining, 0);
    }
}

/// A lease whose key another algorithm's state has taken over meanwhile (a
/// rule changed its algorithm by an override, or two versions of an app
/// share Redis): its release has nothing to give back and answers Ok, as
/// the memory backend does, batched or alone, and the checks that share
/// its batch are not failed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_another_algorithms_state_gives_back_nothing_and_fails_nothing() {
    use ratelimit_runtime::Backend as _;
    let server = RedisServer::start();
    let options = ConnectOptions {
        coalesce: false,
        ..patient()
    };
    let alone = RedisBackend::connect(&server.url(), options).await.unwrap();
    let batched = batching(&server.url(), true).await;
    let library = RedisBackend::connect(&server.url(), patient())
        .await
        .unwrap();
    for (name, redis) in [
        ("alone", &alone),
        ("batched", &batched),
        ("library", &library),
    ] {
        let key = format!("co:taken:{name}");
        for cost in [1, 3] {
            let taken = redis.acquire(&LEASES, &key, cost, 7).await.unwrap();
            assert!(taken.allowed);
            // The fixed window's string replaces the sorted set of leases.
            assert!(redis.check(&RULES[0], &key, 1).await.unwrap().allowed);
            let other = format!("co:taken:other:{name}:{cost}");
            let (released, checked) = tokio::join!(
                redis.release(&LEASES, &key, cost, 7),
                redis.check(&RULES[0], &other, 1),
            );
            released.unwrap_or_else(|e| panic!("{name}, cost {cost}: release: {e}"));
            assert!(checked.unwrap().allowed, "{name}: the check beside it");
            // The window's count is untouched: 30 - 1 (above) - 1 (now).
            let decision = redis.check(&RULES[0], &key, 1).await.unwrap();
            assert_eq!(decision.remaining, 28, "{name}, cost {cost}");
        }
    }
}
