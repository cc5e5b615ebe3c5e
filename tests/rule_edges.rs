//! Rules that change under a key, and numbers at the edge of what doubles
//! hold, on both backends at the same times: Redis (a real server, with a
//! fixed "now") and memory decide alike, and both decide right.

mod common;

use std::time::Duration;

use common::{EPOCH_US, redis_backend};
use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{Decision, ManualClock, Rule};
use ratelimit_test_support::RedisServer;

const HOUR: Duration = Duration::from_secs(3600);
const SECOND: Duration = Duration::from_secs(1);

/// A token bucket keeps its tokens as tokens when its period changes (an
/// override, another rule on the key): stored in fixed point under the old
/// period, they were read under the new one. 10 an hour with 9 used, then
/// 10 a second: a cost of 10 passed at once (one token read as 3,600);
/// the other way round, the one token left read as none. A change of burst
/// keeps them too, up to the new burst.
#[tokio::test]
async fn a_token_bucket_keeps_its_tokens_when_its_rule_changes() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let at = Duration::from_micros(EPOCH_US);
    let cases = [
        (
            Rule::token_bucket(10, HOUR),
            Rule::token_bucket(10, SECOND),
            9,
            1,
        ),
        (
            Rule::token_bucket(10, SECOND),
            Rule::token_bucket(10, HOUR),
            9,
            1,
        ),
        (
            Rule::token_bucket(10, HOUR).with_burst(20),
            Rule::token_bucket(10, HOUR).with_burst(5),
            9,
            5,
        ),
        (
            Rule::token_bucket(10, HOUR),
            Rule::token_bucket(10, HOUR).with_burst(30),
            9,
            1,
        ),
    ];
    for (n, (before, after, used, left)) in cases.into_iter().enumerate() {
        let key = format!("limiter:bucket:changed:{n}");
        let clock = ManualClock::new();
        clock.advance(at);
        let memory = MemoryBackend::with_clock(clock);
        let decisions = |redis: Decision, memory: Decision, what: &str| {
            assert_eq!(redis, memory, "case {n}: {what}");
            redis
        };
        let taken = decisions(
            redis.check_at(&before, &key, used, at).await.unwrap(),
            memory.check_now(&before, &key, used),
            "taken",
        );
        assert!(taken.allowed);
        // The tokens left, all at once: no more.
        let all = decisions(
            redis.check_at(&after, &key, left + 1, at).await.unwrap(),
            memory.check_now(&after, &key, left + 1),
            "one more than is left",
        );
        assert!(!all.allowed, "case {n}: {all:?}");
        assert_eq!(all.remaining, left, "case {n}");
        let rest = decisions(
            redis.check_at(&after, &key, left, at).await.unwrap(),
            memory.check_now(&after, &key, left),
            "what is left",
        );
        assert!(rest.allowed && rest.remaining == 0, "case {n}: {rest:?}");
    }
    server.assert_no_key_without_ttl("limiter:*");
}

/// A token bucket's state of the format's first version (tokens and last
/// update, no period) is read as the tokens under the rule's period, and
/// written anew in the current version.
#[tokio::test]
async fn a_token_bucket_of_the_first_format_is_read() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::token_bucket(10, SECOND);
    let key = "limiter:bucket:v1";
    let period = 1_000_000.0f64;
    let mut v1 = b"rl\x01T".to_vec();
    v1.extend_from_slice(&(3.0 * period).to_be_bytes());
    v1.extend_from_slice(&(EPOCH_US as f64).to_be_bytes());
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(v1)
        .arg("PX")
        .arg(60_000)
        .query(&mut server.connection())
        .unwrap();
    let at = Duration::from_micros(EPOCH_US);
    let decision = redis.check_at(&rule, key, 1, at).await.unwrap();
    assert!(decision.allowed && decision.remaining == 2, "{decision:?}");
    let (tag, numbers) = server.stored_state(key).unwrap();
    assert_eq!((tag, numbers.len()), ('T', 4), "written anew: {numbers:?}");
    assert!(!redis.check_at(&rule, key, 3, at).await.unwrap().allowed);
}

/// The sliding window's weight of the previous window, `floor(n * span /
/// period)`, exact where the product passes 2^53: a full previous window
/// of 999,999,999 over 366 days, 57,400,000,243 µs of it left to weigh. In
/// doubles the quotient came out 1,815,169, one high, on both backends.
#[tokio::test]
async fn the_sliding_windows_weight_is_exact_past_2_to_the_53() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::sliding_window(999_999_999, Duration::from_secs(366 * 24 * 3600));
    let (count, period): (u64, u64) = (999_999_999, 366 * 24 * 3600 * 1_000_000);
    let span = 57_400_000_243u64;
    assert!(u128::from(count) * u128::from(span) > 1 << 53);
    let weight = (u128::from(count) * u128::from(span) / u128::from(period)) as u64;
    assert_eq!(weight, 1_815_168);
    let start = EPOCH_US - EPOCH_US % period;
    let first = start + 1_000;
    let then = start + period + (period - span);
    let clock = ManualClock::new();
    clock.advance(Duration::from_micros(first));
    let memory = MemoryBackend::with_clock(clock.clone());
    let key = "limiter:weight";
    let full = redis
        .check_at(&rule, key, count, Duration::from_micros(first))
        .await
        .unwrap();
    assert_eq!(full, memory.check_now(&rule, key, count));
    assert!(full.allowed);
    clock.advance(Duration::from_micros(then - first));
    let next = redis
        .check_at(&rule, key, 1, Duration::from_micros(then))
        .await
        .unwrap();
    assert_eq!(next, memory.check_now(&rule, key, 1));
    assert_eq!(next.remaining, count - weight - 1, "{next:?}");
}
