//! One call under several rules, all or nothing (`RateLimiter::check_all`):
//! on memory, one Redis (by `FCALL` and by `EVALSHA`) and a 3-master
//! cluster, a refused call takes nothing from any rule, concurrent calls
//! pass exactly as many times as the rules allow, and Redis decides sets as
//! memory does.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{EPOCH_US, Subject, XorShift};
use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::RuleCheck;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{Algorithm, Backend, ManualClock, OnError, RateLimiter, Rule};
use ratelimit_test_support::{RedisCluster, RedisServer};

const MINUTE: Duration = Duration::from_secs(60);

/// Passes of `calls` calls of the set, one after another.
async fn passes(limiter: &RateLimiter, set: &[(&Rule, &str, u64)], calls: usize) -> usize {
    let mut passed = 0;
    for _ in 0..calls {
        passed += usize::from(limiter.check_all(set).await.unwrap().allowed());
    }
    passed
}

/// Units left of `key` under `rule`: what its peek says the next call
/// leaves, plus that call's unit.
async fn left(limiter: &RateLimiter, rule: &Rule, key: &str) -> u64 {
    let peek = limiter.peek(rule, key).await.unwrap();
    if peek.allowed { peek.remaining + 1 } else { 0 }
}

/// The issue's two scenarios, with the rules in both orders, under `tag`
/// (so that one store serves every run).
async fn scenarios(limiter: &RateLimiter, tag: &str) {
    let per_user = Rule::fixed_window(5, MINUTE);
    let global = Rule::fixed_window(3, MINUTE);
    for order in ["user-first", "global-first"] {
        let user_key = format!("limiter:{tag}:{order}:user:ann");
        let global_key = format!("limiter:{tag}:{order}:global");
        let user = (&per_user, user_key.as_str(), 1);
        let all = (&global, global_key.as_str(), 1);
        let set = if order == "user-first" {
            [user, all]
        } else {
            [all, user]
        };
        assert_eq!(passes(limiter, &set, 10).await, 3, "{order}");
        assert_eq!(
            left(limiter, &per_user, &user_key).await,
            2,
            "{order}: the refused calls took nothing from Ann's budget"
        );
        assert_eq!(left(limiter, &global, &global_key).await, 0, "{order}");
        // The refusal names the global rule; Ann's rule says what she has.
        let verdict = limiter.check_all(&set).await.unwrap();
        let global_at = usize::from(order == "user-first");
        assert_eq!(verdict.refused(), Some(global_at), "{order}");
        assert_eq!(verdict.decisions()[1 - global_at].remaining, 2, "{order}");
        assert!(verdict.decisions().iter().all(|d| !d.allowed), "{order}");
        assert!(verdict.rate_limited().unwrap().retry_after > Duration::ZERO);
    }

    // Global 10, per-user 2: three users making 5 calls each pass 6 times
    // and leave 4 of the global budget, which the next user gets.
    let global = Rule::fixed_window(10, MINUTE);
    let per_user = Rule::fixed_window(2, MINUTE);
    for order in ["global-first", "user-first"] {
        let global_key = format!("limiter:{tag}:{order}:all");
        let mut passed = 0;
        for user in ["a", "b", "c", "d"] {
            let user_key = format!("limiter:{tag}:{order}:u:{user}");
            let g = (&global, global_key.as_str(), 1);
            let u = (&per_user, user_key.as_str(), 1);
            let set = if order == "global-first" {
                [g, u]
            } else {
                [u, g]
            };
            passed += passes(limiter, &set, 5).await;
            if user == "c" {
                assert_eq!(passed, 6, "{order}");
                assert_eq!(left(limiter, &global, &global_key).await, 4, "{order}");
            }
        }
        assert_eq!(passed, 8, "{order}: the fourth user got her 2");
    }

    // Both rules refuse: the refusal names the one whose budget comes back
    // later (the day's, not the minute's), in either order.
    let minute = Rule::fixed_window(1, MINUTE);
    let day = Rule::fixed_window(1, Duration::from_secs(86_400));
    let (m, d) = (
        format!("limiter:{tag}:both:m"),
        format!("limiter:{tag}:both:d"),
    );
    assert!(limiter.check(&minute, &m).await.unwrap().allowed);
    assert!(limiter.check(&day, &d).await.unwrap().allowed);
    for (set, day_at) in [
        ([(&minute, m.as_str(), 1), (&day, d.as_str(), 1)], 1),
        ([(&day, d.as_str(), 1), (&minute, m.as_str(), 1)], 0),
    ] {
        let verdict = limiter.check_all(&set).await.unwrap();
        assert_eq!(verdict.refused(), Some(day_at));
        let limited = verdict.rate_limited().unwrap();
        assert!(limited.retry_after > MINUTE, "{limited:?}");
    }
}

#[tokio::test]
async fn a_refused_call_charges_no_rule_in_memory() {
    scenarios(&Subject::memory().limiter, "m").await;
}

#[tokio::test]
async fn a_refused_call_charges_no_rule_on_redis() {
    let subject = Subject::redis().await;
    scenarios(&subject.limiter, "r").await;
    subject.assert_ttls();
    // By EVALSHA too, as on a server without functions.
    let server = RedisServer::start();
    let redis = common::redis_backend_without_functions(&server).await;
    let limiter = RateLimiter::builder().backend(redis).build().await.unwrap();
    scenarios(&limiter, "e").await;
}

/// 80 tasks of 4 users under a global rule of 30 and a per-user rule of 10
/// (and a third, per-user token bucket, on `three`): exactly 30 pass, and
/// every rule has its count less the passes left.
async fn exact_under_tasks(limiter: &RateLimiter, tag: &str, three: bool) {
    let global = Rule::fixed_window(30, MINUTE);
    let per_user = Rule::fixed_window(10, MINUTE);
    let bucket = Rule::token_bucket(12, Duration::from_secs(3600));
    let users = ["ann", "bob", "cyd", "dee"];
    let global_key = format!("limiter:{tag}:global");
    let limiter = Arc::new(limiter.clone());
    let tasks: Vec<_> = (0..80)
        .map(|i| {
            let limiter = Arc::clone(&limiter);
            let global_key = global_key.clone();
            let user = users[i % users.len()];
            let tag = tag.to_owned();
            tokio::spawn(async move {
                let user_key = format!("limiter:{tag}:user:{user}");
                let bucket_key = format!("limiter:{tag}:bucket:{user}");
                let mut set = vec![
                    (&per_user, user_key.as_str(), 1),
                    (&global, global_key.as_str(), 1),
                ];
                if three {
                    set.push((&bucket, bucket_key.as_str(), 1));
                }
                if i % 2 == 1 {
                    set.reverse();
                }
                (user, limiter.check_all(&set).await.unwrap().allowed())
            })
        })
        .collect();
    let mut by_user = std::collections::HashMap::new();
    for task in tasks {
        let (user, passed) = task.await.unwrap();
        *by_user.entry(user).or_insert(0u64) += u64::from(passed);
    }
    let total: u64 = by_user.values().sum();
    assert_eq!(total, 30, "{tag}: {by_user:?}");
    assert_eq!(
        left(&limiter, &global, &global_key).await,
        30 - total,
        "{tag}"
    );
    for user in users {
        let passed = by_user.get(user).copied().unwrap_or(0);
        assert!(passed <= 10, "{tag}: {user} passed {passed}");
        let user_key = format!("limiter:{tag}:user:{user}");
        assert_eq!(
            left(&limiter, &per_user, &user_key).await,
            10 - passed,
            "{tag}: {user}"
        );
        if three {
            let bucket_key = format!("limiter:{tag}:bucket:{user}");
            assert_eq!(
                left(&limiter, &bucket, &bucket_key).await,
                12 - passed,
                "{tag}: {user}'s bucket"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sets_are_exact_under_concurrent_tasks_in_memory() {
    let limiter = RateLimiter::in_memory();
    exact_under_tasks(&limiter, "two", false).await;
    exact_under_tasks(&limiter, "three", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sets_are_exact_under_concurrent_tasks_on_redis() {
    let subject = Subject::redis().await;
    exact_under_tasks(&subject.limiter, "two", false).await;
    exact_under_tasks(&subject.limiter, "three", true).await;
    subject.assert_ttls();
}

/// On a 3-master cluster, keys of one slot (a hash tag) are one atomic
/// call: the scenarios hold and sets are exact under tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sets_are_exact_on_a_cluster() {
    let subject = Subject::cluster(RedisCluster::start()).await;
    scenarios(&subject.limiter, "{tagged}").await;
    exact_under_tasks(&subject.limiter, "{two}", false).await;
    exact_under_tasks(&subject.limiter, "{three}", true).await;
    subject.assert_ttls();
}

/// A key of the cluster master on `port`: `{prefix}:{n}`, the first such.
fn key_on(cluster: &RedisCluster, port: u16, prefix: &str) -> String {
    (0..)
        .map(|n| format!("{prefix}:{n}"))
        .find(|key| cluster.master_for(key) == port)
        .expect("a key of every master")
}

/// A set spread over the three masters of `cluster` (a global rule on the
/// first, per-user rules on the second, per-user buckets on the third):
/// the rules of one run and what it should pass.
struct Spread<'a> {
    tag: &'a str,
    global: Rule,
    global_cost: u64,
    per_user: Rule,
    bucket: Option<Rule>,
    /// Passes of the 80 calls at once, when one rule alone can refuse (then
    /// no call is refused by units another holds for a moment); `None`:
    /// at most the global rule's, then calls one after another take what
    /// is left, to the exact total.
    exact: Option<u64>,
}

/// 80 tasks at once of 4 users under [`Spread`]'s rules, keys on three
/// masters (taken one master after another, given back on a refusal):
/// the passes are exact, and every rule has its count less the passes'
/// cost left: nothing a refused call took stays taken.
async fn spread_under_tasks(limiter: &RateLimiter, cluster: &RedisCluster, run: Spread<'_>) {
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3);
    let tag = run.tag;
    let users = ["ann", "bob", "cyd", "dee"];
    let global_key = key_on(cluster, masters[0], &format!("limiter:{tag}:global"));
    let user_keys: Vec<String> = users
        .iter()
        .map(|u| key_on(cluster, masters[1], &format!("limiter:{tag}:user:{u}")))
        .collect();
    let bucket_keys: Vec<String> = users
        .iter()
        .map(|u| key_on(cluster, masters[2], &format!("limiter:{tag}:bucket:{u}")))
        .collect();
    let set_of = |u: usize, reversed: bool| {
        let mut set = vec![
            (&run.per_user, user_keys[u].as_str(), 1),
            (&run.global, global_key.as_str(), run.global_cost),
        ];
        if let Some(bucket) = &run.bucket {
            set.push((bucket, bucket_keys[u].as_str(), 1));
        }
        if reversed {
            set.reverse();
        }
        set
    };
    let limit = run.global.count() / run.global_cost;
    let mut by_user = [0u64; 4];
    let start = Arc::new(tokio::sync::Barrier::new(80));
    let tasks: Vec<_> = (0..80)
        .map(|i| {
            let (limiter, start) = (limiter.clone(), Arc::clone(&start));
            let set: Vec<(Rule, String, u64)> = set_of(i % 4, i % 2 == 1)
                .into_iter()
                .map(|(rule, key, cost)| (*rule, key.to_owned(), cost))
                .collect();
            tokio::spawn(async move {
                let set: Vec<(&Rule, &str, u64)> =
                    set.iter().map(|(r, k, c)| (r, k.as_str(), *c)).collect();
                start.wait().await;
                limiter.check_all(&set).await.unwrap().allowed()
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        by_user[i % 4] += u64::from(task.await.unwrap());
    }
    let at_once: u64 = by_user.iter().sum();
    match run.exact {
        Some(exact) => assert_eq!(at_once, exact, "{tag}: {by_user:?}"),
        None => {
            assert!(at_once <= limit, "{tag}: {by_user:?}");
            // One call after another (no units held by another call): what
            // the calls at once left is all there, to the last unit.
            for (u, passed) in by_user.iter_mut().enumerate() {
                while limiter
                    .check_all(&set_of(u, false))
                    .await
                    .unwrap()
                    .allowed()
                {
                    *passed += 1;
                }
            }
            let total: u64 = by_user.iter().sum();
            assert_eq!(total, limit, "{tag}: {at_once} at once, then {by_user:?}");
        }
    }
    let total: u64 = by_user.iter().sum();
    assert_eq!(
        left(limiter, &run.global, &global_key).await,
        run.global.count() - run.global_cost * total,
        "{tag}: the global rule, {by_user:?}"
    );
    for (u, &passed) in by_user.iter().enumerate() {
        assert!(passed <= run.per_user.count(), "{tag}: {by_user:?}");
        assert_eq!(
            left(limiter, &run.per_user, &user_keys[u]).await,
            run.per_user.count() - passed,
            "{tag}: {}'s rule, {by_user:?}",
            users[u]
        );
        if let Some(bucket) = &run.bucket {
            assert_eq!(
                left(limiter, bucket, &bucket_keys[u]).await,
                bucket.burst() - passed,
                "{tag}: {}'s bucket, {by_user:?}",
                users[u]
            );
        }
    }
}

/// Keys spread over the masters (taken one master after another, given
/// back on a refusal): the scenarios hold; calls at once pass exactly as
/// many times as the rules allow, whichever rule refuses; and a refused
/// call leaves nothing taken (its caller is answered once what it took is
/// given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sets_spread_over_masters_leave_nothing_taken() {
    let cluster = RedisCluster::start();
    let limiter = &RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    scenarios(limiter, "spread").await;
    let bucket = Some(Rule::token_bucket(40, Duration::from_secs(3600)));
    // The global rule alone refuses: 30 calls of cost 2 pass.
    for (tag, bucket) in [("global-binds", None), ("global-binds-3", bucket)] {
        let run = Spread {
            tag,
            global: Rule::fixed_window(60, MINUTE),
            global_cost: 2,
            per_user: Rule::fixed_window(40, MINUTE),
            bucket,
            exact: Some(30),
        };
        spread_under_tasks(limiter, &cluster, run).await;
    }
    // The per-user rules alone refuse: 5 calls of each user pass.
    for (tag, bucket) in [("users-bind", None), ("users-bind-3", bucket)] {
        let run = Spread {
            tag,
            global: Rule::fixed_window(200, MINUTE),
            global_cost: 2,
            per_user: Rule::fixed_window(5, MINUTE),
            bucket,
            exact: Some(20),
        };
        spread_under_tasks(limiter, &cluster, run).await;
    }
    // Both refuse (a call may then be refused by units another call holds
    // for a moment): at most 30 at once, and nothing lost.
    for (tag, bucket) in [
        ("both-bind", None),
        (
            "both-bind-3",
            Some(Rule::token_bucket(12, Duration::from_secs(3600))),
        ),
    ] {
        let run = Spread {
            tag,
            global: Rule::fixed_window(60, MINUTE),
            global_cost: 2,
            per_user: Rule::fixed_window(10, MINUTE),
            bucket,
            exact: None,
        };
        spread_under_tasks(limiter, &cluster, run).await;
    }
    let keys = cluster.keys_with_pttl("limiter:*");
    assert!(keys.iter().all(|(_, pttl)| *pttl != -1), "{keys:?}");
}

/// A concurrency rule in a set takes its lease only when the whole set
/// passes, and holds it until the permits drop.
async fn leases_only_when_the_set_passes(limiter: &RateLimiter, tag: &str) {
    let in_flight = Rule::concurrency(2, MINUTE);
    let per_minute = Rule::fixed_window(3, MINUTE);
    let (lease_key, window_key) = (format!("limiter:{tag}:jobs"), format!("limiter:{tag}:w"));
    let set = [
        (&in_flight, lease_key.as_str(), 1),
        (&per_minute, window_key.as_str(), 1),
    ];
    assert!(
        limiter.check_all(&set).await.is_err(),
        "check_all needs permits"
    );
    let first = limiter.acquire_all(&set).await.unwrap();
    let second = limiter.acquire_all(&set).await.unwrap();
    assert!(first.allowed() && second.allowed());
    let third = limiter.acquire_all(&set).await.unwrap();
    assert_eq!(third.refused(), Some(0), "two in flight");
    assert_eq!(
        left(limiter, &per_minute, &window_key).await,
        1,
        "not charged"
    );
    first.release_all().await;
    let fourth = limiter.acquire_all(&set).await.unwrap();
    assert!(fourth.allowed(), "a lease was released");
    second.release_all().await;
    // The window is spent: refused, and the lease it would take is not taken.
    let fifth = limiter.acquire_all(&set).await.unwrap();
    assert_eq!(fifth.refused(), Some(1));
    drop(fourth);
    for _ in 0..100 {
        if left(limiter, &in_flight, &lease_key).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        left(limiter, &in_flight, &lease_key).await,
        2,
        "no lease held"
    );
}

#[tokio::test]
async fn a_concurrency_rule_leases_only_when_its_set_passes() {
    leases_only_when_the_set_passes(&RateLimiter::in_memory(), "m").await;
    let subject = Subject::redis().await;
    leases_only_when_the_set_passes(&subject.limiter, "r").await;
}

/// A set over two masters refused by the first: the second is only
/// looked at, and says what a check of the call's cost would (here: not
/// enough left for a cost of 3), as memory and one Redis do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_after_a_refusal_answers_for_the_calls_cost() {
    let cluster = RedisCluster::start();
    let limiter = RateLimiter::builder()
        .redis(cluster.urls())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let slot = |key: &str| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut cluster.connection(cluster.masters()[0]))
            .unwrap()
    };
    let key_in = |name: &str, slots: std::ops::Range<u16>| {
        (0..)
            .map(|n| format!("limiter:look:{name}:{n}"))
            .find(|key| slots.contains(&slot(key)))
            .unwrap()
    };
    // The spent rule's key first in slot order, on another master.
    let (first, second) = (
        key_in("spent", 0..5_000),
        key_in("two-left", 11_000..16_384),
    );
    assert_ne!(cluster.master_for(&first), cluster.master_for(&second));
    let spent = Rule::fixed_window(1, MINUTE);
    let five = Rule::fixed_window(5, MINUTE);
    assert!(limiter.check(&spent, &first).await.unwrap().allowed);
    assert!(limiter.check_cost(&five, &second, 3).await.unwrap().allowed);
    let verdict = limiter
        .check_all(&[(&spent, first.as_str(), 1), (&five, second.as_str(), 3)])
        .await
        .unwrap();
    assert_eq!(verdict.refused(), Some(0));
    let look = verdict.decisions()[1];
    assert!(!look.allowed, "{look:?}");
    assert_eq!(look.remaining, 2, "{look:?}");
    // Nothing was taken from either.
    assert_eq!(left(&limiter, &five, &second).await, 2);
}

#[tokio::test]
async fn bad_sets_are_errors() {
    let limiter = RateLimiter::in_memory();
    let rule = Rule::fixed_window(3, MINUTE);
    let shared = [(&rule, "k", 1), (&rule, "k", 1)];
    assert!(matches!(
        limiter.check_all(&shared).await,
        Err(ratelimit_runtime::Error::Config(_))
    ));
    let costly = [(&rule, "a", 1), (&rule, "b", 4)];
    assert!(matches!(
        limiter.check_all(&costly).await,
        Err(ratelimit_runtime::Error::InvalidCost { cost: 4, .. })
    ));
    let verdict = limiter.check_all(&[]).await.unwrap();
    assert!(verdict.allowed() && verdict.decisions().is_empty());
}

/// Random sets of three rules (every algorithm but concurrency, random
/// costs and times) decided alike by Redis and by memory.
async fn same_set_decisions(redis: &ratelimit_runtime::backend::redis::RedisBackend, seed: u64) {
    let clock = ManualClock::new();
    clock.advance(Duration::from_micros(EPOCH_US));
    let memory = MemoryBackend::with_clock(clock.clone());
    let mut random = XorShift(0x9E37_79B9_7F4A_7C15 ^ seed);
    let rules: Vec<Rule> = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
    ]
    .into_iter()
    .map(|algorithm| {
        let rule = Rule::new(algorithm, 5, Duration::from_millis(700));
        if algorithm.has_burst() {
            rule.with_burst(7)
        } else {
            rule
        }
    })
    .collect();
    let mut now = EPOCH_US;
    let mut allowed = 0;
    for step in 0..300 {
        let advance = match random.below(4) {
            0 => 0,
            1 => random.below(100_000),
            2 => random.below(800_000),
            _ => 1,
        };
        clock.advance(Duration::from_micros(advance));
        now += advance;
        let keys: Vec<String> = (0..rules.len())
            .map(|r| format!("limiter:same:{seed}:{r}:{}", random.below(2)))
            .collect();
        let picked: Vec<usize> = (0..rules.len()).filter(|_| random.below(2) == 0).collect();
        let checks: Vec<RuleCheck<'_>> = picked
            .iter()
            .map(|&r| RuleCheck {
                rule: &rules[r],
                key: &keys[r],
                cost: 1 + random.below(3),
                lease: 0,
            })
            .collect();
        let from_memory = Backend::check_all(&memory, &checks).await.unwrap();
        let from_redis = redis
            .check_all_at(&checks, Duration::from_micros(now))
            .await
            .unwrap();
        assert_eq!(from_redis, from_memory, "step {step}, now {now}");
        allowed += usize::from(from_memory.iter().all(|d| d.allowed) && !checks.is_empty());
    }
    assert!(allowed > 30, "the timeline passes now and then: {allowed}");
}

#[tokio::test]
async fn redis_decides_sets_as_memory_does() {
    let server = RedisServer::start();
    let redis = common::redis_backend(&server).await;
    same_set_decisions(&redis, 1).await;
    let redis = common::redis_backend_without_functions(&server).await;
    same_set_decisions(&redis, 2).await;
}

/// A set fails over as one check does: with Redis gone, `local` decides it
/// all or nothing in process memory (a refused call charges no rule there
/// either), `deny` answers the error, `allow` lets it through unchecked.
#[tokio::test]
async fn a_set_fails_over_as_a_single_check_does() {
    let mut server = RedisServer::start();
    let mut limiters = Vec::new();
    for policy in [OnError::Local, OnError::Deny, OnError::Allow] {
        let limiter = RateLimiter::builder()
            .redis(server.url())
            .on_backend_error(policy)
            .probe_interval(Duration::from_secs(600))
            .build()
            .await
            .unwrap();
        limiters.push(limiter);
    }
    server.kill();
    let per_user = Rule::fixed_window(5, MINUTE);
    let global = Rule::fixed_window(3, MINUTE);
    let set = [(&per_user, "fo:user:ann", 1), (&global, "fo:global", 1)];

    let local = &limiters[0];
    let mut passed = 0;
    for _ in 0..10 {
        passed += usize::from(local.check_all(&set).await.unwrap().allowed());
    }
    assert_eq!(passed, 3, "the insurance limiter holds the set");
    let rest = [(&per_user, "fo:user:ann", 2)];
    assert!(
        local.check_all(&rest).await.unwrap().allowed(),
        "the refused calls took nothing from Ann's own budget"
    );
    assert!(!local.check_all(&set[..1]).await.unwrap().allowed());

    assert!(matches!(
        limiters[1].check_all(&set).await,
        Err(ratelimit_runtime::Error::Backend(_))
    ));
    for _ in 0..10 {
        assert!(limiters[2].check_all(&set).await.unwrap().allowed());
    }
}

/// `examples/hierarchical.rs`, built as the rest of the suite was (the
/// workspace with every feature, so nothing is built again), run in memory
/// and on Redis: each of its three rules refuses once, taking nothing from
/// the others, and both stores answer alike.
#[test]
fn the_hierarchical_example_runs_in_memory_and_on_redis() {
    let binary = common::example_binary("hierarchical");
    let run = |redis: Option<String>| {
        let mut command = std::process::Command::new(&binary);
        command.env_remove("REDIS_URL");
        if let Some(url) = redis {
            command.env("REDIS_URL", url);
        }
        let output = command.output().expect("the example runs");
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        // The first line names the store; a token bucket's retry_after
        // depends on how fast the run went.
        text.lines()
            .skip(1)
            .map(|line| match line.split_once("retry in ") {
                Some((head, tail)) => {
                    let tail = tail.trim_start_matches(|c: char| c.is_ascii_digit());
                    format!("{head}retry in _{tail}")
                }
                None => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    let in_memory = run(None);
    for expected in [
        "call 5: 429 by the key rule, retry in _ s (key 0, org 2, global 5: nothing taken)",
        "call 3: 429 by the org rule, retry in _ s (key 2, org 0, global 3: nothing taken)",
        // initech's own limit, 8, not the rule's 6.
        "call 3: 200 (key 1, org 5, global 0)",
        "call 4: 429 by the global rule, retry in _ s (key 1, org 5, global 0: nothing taken)",
        "call 1: 401: unknown API key",
    ] {
        assert!(in_memory.contains(expected), "{expected}:\n{in_memory}");
    }
    let server = RedisServer::start();
    assert_eq!(run(Some(server.url())), in_memory);
    // Again on the budgets it left: it begins from whole ones.
    assert_eq!(run(Some(server.url())), in_memory);
}
