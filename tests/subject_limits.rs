//! Limits per subject (`Rule::with_subject_limits`): a subject's own count
//! and burst, set through the limiter or written into Redis by hand (as
//! `redis-cli` would), read by the check's own script: on memory, one Redis
//! (alone and in coalesced batches, from two limiters as two instances
//! would) and a 3-master cluster, with hash tags and without.

use std::time::Duration;

use ratelimit_runtime::{Error, RateLimited, RateLimiter, Rule, SubjectLimit, rate_limit};
use ratelimit_test_support::{RedisCluster, RedisServer, calls_of};

const MINUTE: Duration = Duration::from_secs(60);
const PLAN: Rule = Rule::fixed_window(2, MINUTE).with_subject_limits();
const BUCKET: Rule = Rule::token_bucket(3, MINUTE).with_subject_limits();

/// Passes of `calls` checks of `key` under `rule`, one after another, and
/// the limit the last decision reported.
async fn passes(limiter: &RateLimiter, rule: &Rule, key: &str, calls: usize) -> (usize, u64) {
    let mut passed = 0;
    let mut limit = 0;
    for _ in 0..calls {
        let decision = limiter.check(rule, key).await.unwrap();
        passed += usize::from(decision.allowed);
        limit = decision.limit;
    }
    (passed, limit)
}

/// What every backend must do: a subject with a limit of its own gets it,
/// the others the rule's; a cleared limit is the rule's again; a bucket's
/// own burst; a cost over the subject's capacity never fits.
async fn behaves(limiter: &RateLimiter, tag: &str) {
    let big = format!("limiter:{tag}:plan:tenant:42");
    let small = format!("limiter:{tag}:plan:tenant:7");
    limiter
        .set_subject_limit(&PLAN, &big, Some(SubjectLimit::new(5)))
        .await
        .unwrap();
    assert_eq!(passes(limiter, &PLAN, &big, 8).await, (5, 5));
    assert_eq!(passes(limiter, &PLAN, &small, 4).await, (2, 2));
    let peek = limiter.peek(&PLAN, &big).await.unwrap();
    assert_eq!((peek.allowed, peek.limit), (false, 5));

    // Cleared: the rule's count of 2, of which 5 are spent.
    limiter.set_subject_limit(&PLAN, &big, None).await.unwrap();
    let decision = limiter.check(&PLAN, &big).await.unwrap();
    assert_eq!((decision.allowed, decision.limit), (false, 2));

    // A bucket with its own count and burst: 10 at once, then empty.
    let bucket = format!("limiter:{tag}:bucket:tenant:42");
    let own = SubjectLimit::new(4).with_burst(10);
    limiter
        .set_subject_limit(&BUCKET, &bucket, Some(own))
        .await
        .unwrap();
    assert_eq!(passes(limiter, &BUCKET, &bucket, 12).await, (10, 4));

    // A cost the rule allows but over a small subject's capacity is
    // refused, and takes nothing.
    let tiny = format!("limiter:{tag}:bucket:tenant:1");
    limiter
        .set_subject_limit(&BUCKET, &tiny, Some(SubjectLimit::new(1)))
        .await
        .unwrap();
    let decision = limiter.check_cost(&BUCKET, &tiny, 3).await.unwrap();
    assert!(!decision.allowed && decision.retry_after > Duration::ZERO);
    assert!(limiter.check(&BUCKET, &tiny).await.unwrap().allowed);

    // A window's own count has no burst × period bound (a bucket's has):
    // 100,000 a day holds.
    let daily = Rule::fixed_window(10, Duration::from_secs(86_400)).with_subject_limits();
    let key = format!("limiter:{tag}:daily:tenant:42");
    let own = Some(SubjectLimit::new(100_000));
    limiter.set_subject_limit(&daily, &key, own).await.unwrap();
    assert_eq!(limiter.check(&daily, &key).await.unwrap().limit, 100_000);

    // A call that waits its turn under the subject's own rate (20 a second,
    // a burst of 1) reports its limit too.
    let paced = Rule::token_bucket(2, Duration::from_secs(1)).with_subject_limits();
    let key = format!("limiter:{tag}:paced:tenant:42");
    let own = Some(SubjectLimit::new(20).with_burst(1));
    limiter.set_subject_limit(&paced, &key, own).await.unwrap();
    let wait = Duration::from_secs(2);
    for _ in 0..2 {
        let decision = limiter.until_ready(&paced, &key, 1, wait).await.unwrap();
        assert!(decision.allowed);
        assert_eq!(decision.limit, 20);
    }
}

#[tokio::test]
async fn subjects_have_their_own_limits_in_memory() {
    behaves(&RateLimiter::in_memory(), "memory").await;
}

#[tokio::test]
async fn bad_subject_limits_are_errors() {
    let limiter = RateLimiter::in_memory();
    let plain = Rule::fixed_window(2, MINUTE);
    let error = limiter
        .set_subject_limit(&plain, "k", Some(SubjectLimit::new(5)))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::Config(why) if why.contains("with_subject_limits")),
        "{error}"
    );
    for bad in [SubjectLimit::new(0), SubjectLimit::new(Rule::MAX_COUNT + 1)] {
        let error = limiter
            .set_subject_limit(&PLAN, "k", Some(bad))
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Config(_)), "{bad:?}: {error}");
    }
    // A bucket's burst × period over 2^52 µs.
    let long = Rule::token_bucket(1, Duration::from_secs(300 * 86_400)).with_subject_limits();
    let error = limiter
        .set_subject_limit(&long, "k", Some(SubjectLimit::new(100_000)))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error}");
    // Nothing was set.
    assert_eq!(limiter.check(&PLAN, "k").await.unwrap().limit, 2);
}

#[rate_limit(key = "search", count = 1, period = 60, by = arg(tenant), subject_limits)]
async fn search(tenant: &str) -> Result<(), RateLimited> {
    let _ = tenant;
    Ok(())
}

#[tokio::test]
async fn the_attribute_reads_subject_limits_by_name() {
    let limiter = RateLimiter::global();
    limiter
        .set_subject_limit_named("search", "arg:tenant:big", Some(SubjectLimit::new(3)))
        .await
        .unwrap();
    let mut passed = 0;
    for _ in 0..5 {
        passed += usize::from(search("big").await.is_ok());
    }
    assert_eq!(passed, 3);
    assert!(search("small").await.is_ok());
    let refused = search("small").await.unwrap_err();
    assert_eq!(refused.limit, 1);
    let error = limiter
        .set_subject_limit_named("serch", "arg:tenant:big", Some(SubjectLimit::new(3)))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error}");
}

async fn redis_limiter(
    target: impl Into<ratelimit_runtime::backend::redis::RedisTarget>,
) -> RateLimiter {
    RateLimiter::builder()
        .redis(target)
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// By `FCALL` of the function library, and by `EVALSHA` for a user whose
/// ACL denies `FCALL` (as on a server without functions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subjects_have_their_own_limits_on_redis() {
    let server = RedisServer::start();
    behaves(&redis_limiter(server.url()).await, "redis").await;
    let url = server.user_url("scripts", "-fcall");
    behaves(&redis_limiter(url).await, "evalsha").await;
    assert!(
        calls_of(&mut server.connection(), "evalsha") > 0,
        "no check went by EVALSHA"
    );
}

/// Set by one instance, or by hand in Redis, seen by another at its next
/// check; a value that is not a limit is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_in_redis_holds_for_every_instance() {
    let server = RedisServer::start();
    let (one, two) = (
        redis_limiter(server.url()).await,
        redis_limiter(server.url()).await,
    );
    let key = "limiter:fleet:tenant:42";
    one.set_subject_limit(&PLAN, key, Some(SubjectLimit::new(4)))
        .await
        .unwrap();
    assert_eq!(passes(&two, &PLAN, key, 6).await, (4, 4));

    // By hand, as the README tells an operator to.
    let by_hand = "limiter:fleet:tenant:7";
    let mut conn = server.connection();
    let _: () = redis::cmd("HSET")
        .arg("{limiter:fleet:tenant:7}#limit")
        .arg("count")
        .arg(6)
        .query(&mut conn)
        .unwrap();
    assert_eq!(passes(&one, &PLAN, by_hand, 4).await, (4, 6));
    assert_eq!(passes(&two, &PLAN, by_hand, 4).await, (2, 6));

    // Not a limit: the rule's.
    let broken = "limiter:fleet:tenant:9";
    let _: () = redis::cmd("HSET")
        .arg("{limiter:fleet:tenant:9}#limit")
        .arg("count")
        .arg("lots")
        .query(&mut conn)
        .unwrap();
    assert_eq!(passes(&one, &PLAN, broken, 3).await, (2, 2));

    // Cleared by hand: the rule's again, from the next check.
    let _: () = redis::cmd("DEL")
        .arg("{limiter:fleet:tenant:7}#limit")
        .query(&mut conn)
        .unwrap();
    assert_eq!(two.check(&PLAN, by_hand).await.unwrap().limit, 2);
}

/// Many tasks at once, their checks coalesced into batches that mix
/// subjects with limits of their own and without: each passes exactly its
/// own count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_checks_keep_each_subjects_limit() {
    let server = RedisServer::start();
    let limiter = redis_limiter(server.url()).await;
    let plain = Rule::fixed_window(3, MINUTE);
    for tenant in 0..4u64 {
        let key = format!("limiter:batch:tenant:{tenant}");
        if tenant % 2 == 0 {
            limiter
                .set_subject_limit(&PLAN, &key, Some(SubjectLimit::new(10 + tenant)))
                .await
                .unwrap();
        }
    }
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            let tenant = i % 5;
            if tenant == 4 {
                let decision = limiter.check(&plain, "limiter:batch:plain").await.unwrap();
                return (tenant, decision.allowed, decision.limit);
            }
            let key = format!("limiter:batch:tenant:{tenant}");
            let decision = limiter.check(&PLAN, &key).await.unwrap();
            (tenant, decision.allowed, decision.limit)
        }));
    }
    let mut passed = [0u64; 5];
    for task in tasks {
        let (tenant, allowed, limit) = task.await.unwrap();
        let expected = match tenant {
            4 => 3,
            t if t % 2 == 0 => 10 + t,
            _ => 2,
        };
        assert_eq!(limit, expected, "tenant {tenant}");
        passed[tenant as usize] += u64::from(allowed);
    }
    assert_eq!(passed, [10, 2, 12, 2, 3]);
}

/// On a cluster: keys with a hash tag and without, set through the limiter
/// and by hand on the master of the limit's slot, which is the budget's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subjects_have_their_own_limits_on_a_cluster() {
    let cluster = RedisCluster::start();
    let limiter = redis_limiter(cluster.urls()).await;
    behaves(&limiter, "cluster").await;
    behaves(&limiter, "{tagged}").await;
    for key in ["limiter:hand:tenant:1", "limiter:{hand}:tenant:2"] {
        let at = if key.contains('{') {
            format!("{key}#limit")
        } else {
            format!("{{{key}}}#limit")
        };
        assert_eq!(cluster.master_for(&at), cluster.master_for(key), "{key}");
        let _: () = redis::cmd("HSET")
            .arg(&at)
            .arg("count")
            .arg(3)
            .query(&mut cluster.connection(cluster.master_for(&at)))
            .unwrap();
        assert_eq!(passes(&limiter, &PLAN, key, 5).await, (3, 3), "{key}");
    }
}

/// Several rules at once, one of them reading subjects' limits: the set is
/// decided with the subject's own count, on memory and on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_read_subject_limits() {
    let server = RedisServer::start();
    let global = Rule::fixed_window(100, MINUTE);
    for limiter in [RateLimiter::in_memory(), redis_limiter(server.url()).await] {
        let tenant = "limiter:set:tenant:42";
        limiter
            .set_subject_limit(&PLAN, tenant, Some(SubjectLimit::new(4)))
            .await
            .unwrap();
        let set = [(&PLAN, tenant, 1), (&global, "limiter:set:global", 1)];
        let mut passed = 0;
        for _ in 0..6 {
            let verdict = limiter.check_all(&set).await.unwrap();
            assert_eq!(verdict.decisions()[0].limit, 4);
            passed += usize::from(verdict.allowed());
        }
        assert_eq!(passed, 4);
        // The refused calls took nothing from the global rule.
        let peek = limiter.peek(&global, "limiter:set:global").await.unwrap();
        assert_eq!(peek.remaining, 100 - 4 - 1);
        limiter.reset(&global, "limiter:set:global").await.unwrap();
    }
}
