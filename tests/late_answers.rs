//! Give-backs: a refund, and answers that come late or to callers that
//! left. A fault proxy in front of a real redis-server holds a reply back
//! while windows roll over and keys are reset. What Redis allowed a caller
//! that never heard of it is given back where it was counted (the same
//! window, the same state since a reset, the call's own log entry) and
//! nowhere else, whether the call went alone or in a batch, and whether its
//! caller timed out or went away; so is what a refund names.

use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::redis::{ConnectOptions, RedisBackend};
use ratelimit_runtime::{
    Algorithm, Backend, ManualClock, OnError, RateLimited, RateLimiter, Rule, rate_limit,
};
use ratelimit_test_support::{Proxy, RedisCluster, RedisServer, calls_of, first_ok};

/// How long the proxy holds a reply back: past the deadline (100 ms) and a
/// second-long window, within the two seconds a late answer is waited for.
const HELD: Duration = Duration::from_millis(1800);

/// A backend through `proxy`, with checks of `timeout`, that has made a
/// first call (the connection, the library, the server's time).
async fn through(proxy: &Proxy, timeout: Duration) -> RedisBackend {
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let redis = RedisBackend::connect(
        &url,
        ConnectOptions {
            timeout,
            connect_timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let warm = Rule::fixed_window(10, Duration::from_secs(60));
    assert!(redis.check(&warm, "limiter:warm", 1).await.unwrap().allowed);
    redis
}

/// Another instance, straight to the server.
async fn direct(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(
        &server.url(),
        ConnectOptions {
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap()
}

/// Waits until the server has run one more `FCALL` than `before`: the
/// give-back of the late answer (nothing else calls it meanwhile). Callers
/// count from before their other instance's own call, so a give-back that
/// a loaded machine runs early is counted too.
async fn given_back(server: &RedisServer, before: u64) {
    first_ok("no give-back", Duration::from_millis(20), || {
        let calls = calls_of(&mut server.connection(), "fcall");
        async move {
            if calls > before {
                Ok(())
            } else {
                Err("not yet")
            }
        }
    })
    .await;
}

/// The server's clock, in µs.
fn server_time(server: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    secs * 1_000_000 + micros
}

/// A late check of a fixed window of one per second: its window closes
/// while the answer is held back, another instance starts the next window,
/// then the answer comes. Its give-back named no window and landed in the
/// next one, which then let a second call through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_give_back_stays_out_of_the_next_fixed_window() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let late = through(&proxy, Duration::from_millis(100)).await;
    let other = direct(&server).await;
    let rule = Rule::fixed_window(1, Duration::from_secs(1));
    let key = "limiter:late:fixed";
    proxy.delay_reply_to(key.as_bytes(), HELD);
    let sent = Instant::now();
    assert!(
        late.check(&rule, key, 1).await.is_err(),
        "the answer is late"
    );
    tokio::time::sleep_until((sent + Duration::from_millis(1300)).into()).await;
    let before = calls_of(&mut server.connection(), "fcall");
    assert!(
        other.check(&rule, key, 1).await.unwrap().allowed,
        "a new window"
    );
    given_back(&server, before + 1).await;
    let next = other.check(&rule, key, 1).await.unwrap();
    assert!(!next.allowed, "two calls in one window of one: {next:?}");
}

/// The same after a reset between the late check and its answer: the
/// window begun since then is not the one it was counted in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_give_back_stays_out_of_a_window_begun_after_a_reset() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let late = through(&proxy, Duration::from_millis(100)).await;
    let other = direct(&server).await;
    for rule in [
        Rule::fixed_window(1, Duration::from_secs(60)),
        Rule::sliding_window(1, Duration::from_secs(60)),
        Rule::sliding_log(1, Duration::from_secs(60)),
        Rule::token_bucket(1, Duration::from_secs(60)),
        Rule::gcra(1, Duration::from_secs(60)),
    ] {
        let key = format!("limiter:late:reset:{:?}", rule.algorithm());
        proxy.delay_reply_to(key.as_bytes(), Duration::from_millis(500));
        assert!(
            late.check(&rule, &key, 1).await.is_err(),
            "the answer is late"
        );
        other.reset(&rule, &key).await.unwrap();
        assert!(other.check(&rule, &key, 1).await.unwrap().allowed);
        let before = calls_of(&mut server.connection(), "fcall");
        given_back(&server, before).await;
        let next = other.check(&rule, &key, 1).await.unwrap();
        assert!(
            !next.allowed,
            "{rule:?}: two calls under a count of one: {next:?}"
        );
    }
}

/// A late check of a sliding window of one per two seconds, answered in
/// the next window, where another instance's call counts: its give-back
/// took that call's unit, and a second call passed in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_give_back_of_a_sliding_window_takes_from_its_own_window() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let late = through(&proxy, Duration::from_millis(100)).await;
    let other = direct(&server).await;
    let period = 2_000_000;
    let rule = Rule::sliding_window(1, Duration::from_micros(period));
    let key = "limiter:late:sliding";
    // 1.5 s into a window (the server's clock aligns them).
    let into = server_time(&server) % period;
    let wait = (period + 1_500_000 - into) % period;
    tokio::time::sleep(Duration::from_micros(wait)).await;
    proxy.delay_reply_to(key.as_bytes(), HELD);
    let sent = Instant::now();
    assert!(
        late.check(&rule, key, 1).await.is_err(),
        "the answer is late"
    );
    // 0.2 s into the next window: the late call weighs nothing by then.
    tokio::time::sleep_until((sent + Duration::from_millis(700)).into()).await;
    let before = calls_of(&mut server.connection(), "fcall");
    assert!(other.check(&rule, key, 1).await.unwrap().allowed);
    given_back(&server, before + 1).await;
    let next = other.check(&rule, key, 1).await.unwrap();
    assert!(!next.allowed, "two calls in one window of one: {next:?}");
}

/// A late check of a sliding log of two per six seconds: its give-back took
/// the newest units (another instance's call) instead of its own entry, so
/// once the late call's time had left the window a third call passed
/// within six seconds of the other two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_give_back_of_a_sliding_log_takes_its_own_entry() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let late = through(&proxy, Duration::from_millis(100)).await;
    let other = direct(&server).await;
    let rule = Rule::sliding_log(2, Duration::from_secs(6));
    let key = "limiter:late:log";
    proxy.delay_reply_to(key.as_bytes(), HELD);
    let sent = Instant::now();
    assert!(
        late.check(&rule, key, 1).await.is_err(),
        "the answer is late"
    );
    tokio::time::sleep_until((sent + Duration::from_millis(1000)).into()).await;
    let first = Instant::now();
    let before = calls_of(&mut server.connection(), "fcall");
    assert!(other.check(&rule, key, 1).await.unwrap().allowed);
    given_back(&server, before + 1).await;
    assert!(
        other.check(&rule, key, 1).await.unwrap().allowed,
        "the late call is gone"
    );
    // Past the late call's time, before the other's leaves the window.
    tokio::time::sleep_until((sent + Duration::from_millis(6300)).into()).await;
    let third = other.check(&rule, key, 1).await.unwrap();
    assert!(
        first.elapsed() < Duration::from_secs(6),
        "the test ran too slowly to tell"
    );
    assert!(!third.allowed, "three calls within six seconds: {third:?}");
}

/// How long the proxy holds back the reply to a call whose caller leaves:
/// long enough to see that Redis ran it before its answer comes, within
/// the check's deadline (2 s).
const LEFT_HELD: Duration = Duration::from_millis(1000);

/// The rules a caller leaves a call of: a lease, a counted check, a bucket's
/// token, a logged call, each of one.
fn left_rules() -> [Rule; 4] {
    [
        Rule::concurrency(1, Duration::from_secs(60)),
        Rule::fixed_window(1, Duration::from_secs(60)),
        Rule::token_bucket(1, Duration::from_secs(60)),
        Rule::sliding_log(1, Duration::from_secs(60)),
    ]
}

/// A limiter built by `builder` (its Redis reached through a proxy), with
/// checks of 2 s, that has made a first call of `warm` (the connection, the
/// library, the server's time) and has nothing on its way since: its next
/// call goes alone.
async fn idle_limiter(builder: ratelimit_runtime::RateLimiterBuilder, warm: &str) -> RateLimiter {
    let limiter = builder
        .timeout(Duration::from_secs(2))
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(10, Duration::from_secs(60));
    assert!(limiter.check(&rule, warm).await.unwrap().allowed);
    limiter
}

/// A call of `rule` on `key` whose caller goes away (an outer timeout)
/// while the proxy holds its reply back: Redis ran it (`other` sees its
/// unit taken before the answer comes). Then whether what Redis granted is
/// given back once the answer comes: `Err` with what `other` still sees if
/// not within 5 s of the call.
async fn left_and_given_back(
    limiter: &RateLimiter,
    proxy: &Proxy,
    other: &RedisBackend,
    rule: &Rule,
    key: &str,
) -> Result<(), String> {
    proxy.delay_reply_to(key.as_bytes(), LEFT_HELD);
    let sent = Instant::now();
    let left = tokio::time::timeout(Duration::from_millis(50), limiter.acquire(rule, key, 1)).await;
    assert!(left.is_err(), "{rule:?}: the caller went away");
    first_ok("it never ran", Duration::from_millis(10), || async {
        let next = other.peek(rule, key).await.unwrap();
        if next.allowed {
            Err(format!("{rule:?}: {next:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    loop {
        let next = other.peek(rule, key).await.unwrap();
        if next.allowed {
            return Ok(());
        }
        if sent.elapsed() > Duration::from_secs(5) {
            return Err(format!("still held: {rule:?}: {next:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A caller that goes away (an outer timeout) while its call goes alone
/// (a limiter with nothing else on its way, with coalescing or without):
/// the call's future was dropped with it, and what Redis granted (a lease,
/// a counted check, a token, a logged call) stayed held, the lease for its
/// whole period. It is now given back once the answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_redis_granted_a_caller_that_left_is_given_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let other = direct(&server).await;
    let mut held = Vec::new();
    for coalesce in [true, false] {
        for rule in left_rules() {
            // A limiter of its own: no give-back of an earlier round is
            // on its way, so the call goes alone.
            let builder = RateLimiter::builder().redis(url.clone()).coalesce(coalesce);
            let limiter = idle_limiter(builder, "limiter:warm").await;
            let key = format!("limiter:left:{coalesce}:{:?}", rule.algorithm());
            held.extend(
                left_and_given_back(&limiter, &proxy, &other, &rule, &key)
                    .await
                    .err(),
            );
        }
    }
    assert!(held.is_empty(), "{held:#?}");
}

/// The same on a cluster of three masters, the master of the keys behind
/// the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_redis_granted_a_caller_that_left_is_given_back_on_a_cluster() {
    let cluster = RedisCluster::start();
    let master = cluster.master_for("limiter:{left}:warm");
    let proxy = Proxy::start(master);
    cluster.announce(master, proxy.port());
    let other = RedisBackend::connect(
        cluster.urls(),
        ConnectOptions {
            timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let mut held = Vec::new();
    for rule in left_rules() {
        let builder = RateLimiter::builder().redis(cluster.urls());
        let limiter = idle_limiter(builder, "limiter:{left}:warm").await;
        // The same slot as the warm key's (its hash tag).
        let key = format!("limiter:{{left}}:{:?}", rule.algorithm());
        held.extend(
            left_and_given_back(&limiter, &proxy, &other, &rule, &key)
                .await
                .err(),
        );
    }
    assert!(held.is_empty(), "{held:#?}");
}

/// A caller that goes away after its answer was handed to it, before it
/// read it (an outer timeout, or a client gone, while its task waited to
/// run): what Redis allowed it (a lease, a counted check, a logged call)
/// stayed held, the lease for its whole period. The answer, dropped unread,
/// now gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_left_unread_is_given_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let redis = through(&proxy, Duration::from_secs(2))
        .await
        .batch_every_check();
    let other = direct(&server).await;
    for rule in [
        Rule::concurrency(1, Duration::from_secs(60)),
        Rule::fixed_window(1, Duration::from_secs(60)),
        Rule::sliding_log(1, Duration::from_secs(60)),
    ] {
        let key = format!("limiter:unread:{:?}", rule.algorithm());
        let mut call: Pin<Box<dyn Future<Output = _> + Send + '_>> =
            if rule.algorithm() == Algorithm::Concurrency {
                Box::pin(redis.acquire(&rule, &key, 1, 7))
            } else {
                Box::pin(redis.check(&rule, &key, 1))
            };
        // One poll: the call is queued, and the batch task sends it; its
        // reply is held back a moment, so it is not read at once.
        proxy.delay_reply_to(key.as_bytes(), Duration::from_millis(300));
        let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "{polled:?}");
        // The answer has come back and been handed over by now, unread.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(!other.peek(&rule, &key).await.unwrap().allowed, "it ran");
        drop(call);
        first_ok("still held", Duration::from_millis(50), || async {
            let next = other.peek(&rule, &key).await.unwrap();
            if next.allowed {
                Ok(())
            } else {
                Err(format!("{next:?}"))
            }
        })
        .await;
    }
}

/// A refund whose answer came after its deadline ran once: it fails (its
/// caller is told so) but is not sent again, and nothing else gives the
/// units back a second time. (Its docs say: a retry may give back twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_that_timed_out_ran_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let limiter = RateLimiter::builder()
        .redis(url)
        .timeout(Duration::from_millis(100))
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let rule = Rule::fixed_window(5, Duration::from_secs(60));
    let key = "limiter:refund:late";
    let mut charges = Vec::new();
    for _ in 0..3 {
        let permit = limiter.acquire(&rule, key, 1).await.unwrap();
        charges.push(permit.charge().unwrap());
    }
    let used = || server.stored_state(key).expect("a fixed window").1[0];
    assert_eq!(used(), 3.0);
    proxy.delay_reply_to(key.as_bytes(), Duration::from_millis(400));
    let failed = limiter.refund(&rule, key, charges[0]).await;
    assert!(failed.is_err(), "the answer is late: {failed:?}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(used(), 2.0, "given back once");
}

/// The over-limit cache remembers Redis's refusal of a key while a call of
/// it holds its unit, whose caller went away; once that unit is given back,
/// the refusal no longer holds and is forgotten (it was kept, refusing the
/// key locally for a minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_clears_the_over_limit_cache() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let limiter = RateLimiter::builder()
        .redis(url)
        .timeout(Duration::from_secs(3))
        .over_limit_cache(true)
        .on_backend_error(OnError::Deny)
        .build()
        .await
        .unwrap();
    let warm = Rule::fixed_window(10, Duration::from_secs(60));
    assert!(limiter.check(&warm, "limiter:warm").await.unwrap().allowed);
    let rule = Rule::fixed_window(1, Duration::from_secs(60));
    let key = "limiter:cache:given-back";
    proxy.delay_reply_to(key.as_bytes(), Duration::from_millis(800));
    let left = tokio::time::timeout(Duration::from_millis(50), limiter.check(&rule, key)).await;
    assert!(left.is_err(), "the caller went away");
    // Behind it on the connection: refused (the unit is taken), and
    // remembered.
    let refused = limiter.check(&rule, key).await.unwrap();
    assert!(!refused.allowed && refused.retry_after > Duration::from_secs(50));
    let started = Instant::now();
    first_ok("still refused", Duration::from_millis(50), || async {
        let next = limiter.check(&rule, key).await.unwrap();
        if next.allowed {
            Ok(())
        } else {
            Err(format!("{next:?}"))
        }
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A refunded call's units can be used again, a refund gives back only what
/// its charge took (twice the same charge never raises a budget above its
/// capacity), and a reset gives the whole budget back: through the limiter,
/// on Redis and in memory, for every algorithm with a refund.
#[tokio::test]
async fn a_refunded_unit_is_used_again_and_never_raises_the_budget() {
    let server = RedisServer::start();
    let redis = RateLimiter::builder()
        .redis(server.url())
        .build()
        .await
        .unwrap();
    // Memory's clock moves a microsecond at each step, as Redis's does in
    // the time each call takes.
    let clock = ManualClock::new();
    let memory = RateLimiter::in_memory_with_clock(clock.clone());
    let tick = || clock.advance(Duration::from_micros(1));
    for (name, limiter) in [("memory", memory), ("redis", redis)] {
        for algorithm in Algorithm::ALL {
            let rule = Rule::new(algorithm, 3, Duration::from_secs(60));
            let key = format!("limiter:refund:{name}:{algorithm:?}");
            if algorithm == Algorithm::Concurrency {
                let permit = limiter.acquire(&rule, &key, 3).await.unwrap();
                assert!(permit.decision().allowed);
                assert!(
                    permit.charge().is_none(),
                    "a lease is given back by its permit"
                );
                let other = Rule::fixed_window(3, Duration::from_secs(60));
                let charge = limiter.acquire(&other, "limiter:refund:other", 1).await;
                let charge = charge.unwrap().charge().unwrap();
                let refused = limiter.refund(&rule, &key, charge).await;
                assert!(
                    matches!(refused, Err(ratelimit_runtime::Error::Unsupported(_))),
                    "{name}: {refused:?}"
                );
                assert!(!limiter.peek(&rule, &key).await.unwrap().allowed);
                let whole = limiter.reset(&rule, &key).await.unwrap();
                assert!(whole.allowed, "{name}: the leases are gone");
                continue;
            }
            let mut charges = Vec::new();
            for _ in 0..3 {
                tick();
                let permit = limiter.acquire(&rule, &key, 1).await.unwrap();
                assert!(permit.decision().allowed);
                charges.push(permit.charge().expect("an allowed call's charge"));
            }
            let refused = limiter.acquire(&rule, &key, 1).await.unwrap();
            assert!(!refused.decision().allowed && refused.charge().is_none());
            // One call's unit back: one call passes, the next does not.
            let after = limiter.refund(&rule, &key, charges[0]).await.unwrap();
            assert!(after.allowed, "{name} {algorithm:?}: {after:?}");
            assert!(limiter.check(&rule, &key).await.unwrap().allowed);
            assert!(!limiter.check(&rule, &key).await.unwrap().allowed);
            // Every charge back, one of them twice: the budget is whole, not
            // more (a charge given back twice gives back again where a
            // count holds it, nothing where its own log entry is gone).
            tick();
            for charge in [charges[1], charges[2], charges[2]] {
                limiter.refund(&rule, &key, charge).await.unwrap();
            }
            let mut passed = 0;
            while limiter.check(&rule, &key).await.unwrap().allowed {
                passed += 1;
                assert!(
                    passed <= 3,
                    "{name} {algorithm:?}: a refund raised the budget above its capacity"
                );
            }
            assert!(passed >= 2, "{name} {algorithm:?}: {passed} passed");
            tick();
            let whole = limiter.reset(&rule, &key).await.unwrap();
            assert_eq!(whole.remaining, 2, "{name} {algorithm:?}: reset");
            let peeked = limiter.peek(&rule, &key).await.unwrap();
            assert_eq!((peeked.allowed, peeked.remaining), (true, 2));
            // A charge from before the reset gives nothing back now.
            tick();
            assert!(limiter.check(&rule, &key).await.unwrap().allowed);
            let stale = limiter.refund(&rule, &key, charges[0]).await.unwrap();
            assert_eq!(stale.remaining, 1, "{name} {algorithm:?}: {stale:?}");
        }
    }
}

/// A reset made through another instance is not seen by this instance's
/// over-limit cache (its docs say so): the key stays refused here until the
/// time Redis named, and no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_reset_waits_for_the_time_redis_named() {
    let server = RedisServer::start();
    let cached = RateLimiter::builder()
        .redis(server.url())
        .over_limit_cache(true)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let other = direct(&server).await;
    let rule = Rule::fixed_window(1, Duration::from_secs(1));
    let key = "limiter:cache:elsewhere";
    assert!(cached.check(&rule, key).await.unwrap().allowed);
    let refused = cached.check(&rule, key).await.unwrap();
    assert!(!refused.allowed);
    let until = Instant::now() + refused.retry_after;
    other.reset(&rule, key).await.unwrap();
    assert!(
        !cached.check(&rule, key).await.unwrap().allowed,
        "refused here"
    );
    tokio::time::sleep_until((until + Duration::from_millis(50)).into()).await;
    assert!(cached.check(&rule, key).await.unwrap().allowed);
}

/// The same for a refund made through another instance: Redis has the
/// units back (the other instance is allowed), but this instance's
/// over-limit cache does not know, so the key stays refused here until the
/// time Redis named, and no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instances_refund_waits_for_the_time_redis_named() {
    let server = RedisServer::start();
    let cached = RateLimiter::builder()
        .redis(server.url())
        .over_limit_cache(true)
        .timeout(Duration::from_secs(2))
        .build()
        .await
        .unwrap();
    let other = direct(&server).await;
    let rule = Rule::fixed_window(1, Duration::from_secs(2));
    let key = "limiter:cache:refunded-elsewhere";
    let permit = cached.acquire(&rule, key, 1).await.unwrap();
    assert!(permit.decision().allowed);
    let charge = permit.charge().expect("an allowed call");
    let refused = cached.check(&rule, key).await.unwrap();
    assert!(!refused.allowed);
    let until = Instant::now() + refused.retry_after;
    let refunded = other.refund(&rule, key, charge).await.unwrap();
    assert!(refunded.allowed, "given back in Redis: {refunded:?}");
    assert!(
        !cached.check(&rule, key).await.unwrap().allowed,
        "refused here"
    );
    tokio::time::sleep_until((until + Duration::from_millis(50)).into()).await;
    assert!(cached.check(&rule, key).await.unwrap().allowed);
}

/// A set of rules (a lease and a counted check) whose caller goes away
/// while the proxy holds back the reply for `held`: once Redis ran it
/// (`other` sees a unit taken), what it took is given back, every rule's.
/// `Err` with what `other` still sees if not within 5 s.
async fn set_left_and_given_back(
    limiter: &RateLimiter,
    proxy: &Proxy,
    other: &RedisBackend,
    keys: [&str; 2],
    held: &str,
) -> Result<(), String> {
    let rules = [
        Rule::concurrency(1, Duration::from_secs(60)),
        Rule::fixed_window(1, Duration::from_secs(60)),
    ];
    proxy.delay_reply_to(held.as_bytes(), LEFT_HELD);
    let sent = Instant::now();
    let set = [(&rules[0], keys[0], 1), (&rules[1], keys[1], 1)];
    // Long enough for the call to be sent on a loaded machine, not for
    // the held reply.
    let left = tokio::time::timeout(Duration::from_millis(400), limiter.acquire_all(&set)).await;
    assert!(left.is_err(), "the caller went away");
    let taken = || async {
        let mut taken = Vec::new();
        for (rule, key) in rules.iter().zip(keys) {
            if !other.peek(rule, key).await.unwrap().allowed {
                taken.push(key);
            }
        }
        taken
    };
    // The held key seen taken: its call ran, so every key before it was
    // taken too (a set takes its keys in order, and only looks at those
    // after one that refused). A key taken before may be given back by now.
    loop {
        let taken = taken().await;
        if taken.contains(&held) {
            break;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(10),
            "it never ran: taken {taken:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    loop {
        let taken = taken().await;
        if taken.is_empty() {
            return Ok(());
        }
        if sent.elapsed() > Duration::from_secs(5) {
            return Err(format!("still held: {taken:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A set that goes alone (one script call) on one Redis, its caller gone
/// before the answer: given back, as a lone check is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_whose_caller_left_is_given_back() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let other = direct(&server).await;
    let limiter = idle_limiter(RateLimiter::builder().redis(url), "limiter:warm").await;
    let keys = ["limiter:set-left:lease", "limiter:set-left:count"];
    set_left_and_given_back(&limiter, &proxy, &other, keys, keys[1])
        .await
        .unwrap();
}

/// A set whose keys are on two masters of a cluster, taken one master
/// after the other: its caller goes away while the second master's reply
/// is held, after the first master's units were taken. Both are given
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_over_two_masters_whose_caller_left_is_given_back() {
    let cluster = RedisCluster::start();
    let masters = cluster.masters();
    let slot = |key: &str| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut cluster.connection(masters[0]))
            .unwrap()
    };
    let on = |port: u16, name: &str| {
        (0..)
            .map(|n| format!("limiter:set-left:{name}:{n}"))
            .find(|key| cluster.master_for(key) == port)
            .unwrap()
    };
    // The held master's key comes second in slot order (a slot of the
    // last third, the first key's of the first): the other master's unit
    // is taken first.
    let key_in = |name: &str, slots: std::ops::Range<u16>| {
        (0..)
            .map(|n| format!("limiter:set-left:{name}:{n}"))
            .find(|key| slots.contains(&slot(key)))
            .unwrap()
    };
    let second = key_in("count", 11_000..16_384);
    let first = key_in("lease", 0..5_000);
    let held = cluster.master_for(&second);
    assert_ne!(cluster.master_for(&first), held);
    let warm = on(held, "warm");
    let proxy = Proxy::start(held);
    cluster.announce(held, proxy.port());
    let other = RedisBackend::connect(
        cluster.urls(),
        ConnectOptions {
            timeout: Duration::from_secs(2),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let limiter = idle_limiter(RateLimiter::builder().redis(cluster.urls()), &warm).await;
    set_left_and_given_back(&limiter, &proxy, &other, [&first, &second], &second)
        .await
        .unwrap();
}

/// A set refused by one of its rules, its caller gone before the answer:
/// the rule that would have passed took nothing, so nothing of it is given
/// back (a give-back there would lower what earlier calls used).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_set_whose_caller_left_gives_back_nothing() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let url = format!("redis://127.0.0.1:{}/", proxy.port());
    let other = direct(&server).await;
    let limiter = idle_limiter(RateLimiter::builder().redis(url), "limiter:warm").await;
    let open = Rule::fixed_window(5, Duration::from_secs(60));
    let spent = Rule::fixed_window(1, Duration::from_secs(60));
    let (a, b) = ("limiter:refused-left:a", "limiter:refused-left:b");
    assert!(other.check(&open, a, 2).await.unwrap().allowed);
    assert!(other.check(&spent, b, 1).await.unwrap().allowed);
    proxy.delay_reply_to(b.as_bytes(), LEFT_HELD);
    let set = [(&open, a, 1), (&spent, b, 1)];
    let left = tokio::time::timeout(Duration::from_millis(400), limiter.check_all(&set)).await;
    assert!(left.is_err(), "the caller went away");
    // Past the held answer, and what a give-back would take.
    tokio::time::sleep(LEFT_HELD + Duration::from_millis(600)).await;
    let next = other.peek(&open, a).await.unwrap();
    assert_eq!(next.remaining, 2, "2 used, 3 left: {next:?}");
}

#[rate_limit(key = "late_enforced", count = 10, period = 60, limiter = "late_sets")]
#[rate_limit(
    key = "late_shadowed",
    count = 10,
    period = 60,
    limiter = "late_sets",
    shadow
)]
async fn with_a_shadow_rule() -> Result<(), RateLimited> {
    Ok(())
}

/// Stacked rules, one in shadow mode: the others are checked first, then
/// the shadow rule. A caller that goes away while the shadow rule is
/// checked (its reply held back) runs no body, so what the others took is
/// given back. Before, it stayed counted.
#[tokio::test]
async fn a_set_left_while_its_shadow_rule_is_checked_keeps_nothing() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    RateLimiter::builder()
        .redis(format!("redis://127.0.0.1:{}/", proxy.port()))
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
        .install_as("late_sets")
        .unwrap();
    proxy.delay_reply_to(b"late_shadowed", HELD);
    let left = tokio::time::timeout(Duration::from_millis(300), with_a_shadow_rule()).await;
    assert!(left.is_err(), "the shadow rule's reply is held back");
    let other = direct(&server).await;
    let enforced = Rule::fixed_window(10, Duration::from_secs(60));
    first_ok(
        "the enforced rule's unit is not given back",
        Duration::from_millis(20),
        || {
            let other = &other;
            let enforced = &enforced;
            async move {
                let next = other.peek(enforced, "limiter:late_enforced").await.unwrap();
                if next.remaining == 9 {
                    Ok(())
                } else {
                    Err(format!("{next:?}"))
                }
            }
        },
    )
    .await;
}
