//! No call's work on the server grows with what has piled up under its key:
//! 200,000 dead leases, or 200,000 calls logged after the one given back,
//! are worked through a bounded step at a time. Measured by Redis itself
//! (`INFO commandstats`: the µs its `FCALL`s took), against a real server.

mod common;

use std::time::Duration;

use common::{EPOCH_US, redis_backend};
use ratelimit_runtime::__testing::RedisTestHooks;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{ManualClock, Rule};
use ratelimit_test_support::{RedisServer, command_stat};

const PILED: u64 = 200_000;

/// Adds `members` (score, member) to the sorted set `key`, in chunks.
fn plant(server: &RedisServer, key: &str, members: impl Iterator<Item = (f64, Vec<u8>)>) {
    let mut conn = server.connection();
    let members: Vec<(f64, Vec<u8>)> = members.collect();
    for chunk in members.chunks(10_000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(key);
        for (score, member) in chunk {
            zadd.arg(*score).arg(member);
        }
        let _: u64 = zadd.query(&mut conn).unwrap();
    }
    let _: bool = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(3_600_000)
        .query(&mut conn)
        .unwrap();
}

/// A lease set with 200,000 dead leases of one unit each and `live` (id,
/// units) leases, marked as the script marks it.
fn leases(server: &RedisServer, key: &str, live: &[(&str, u64)]) {
    let extra: u64 = live.iter().map(|(_, units)| units - 1).sum();
    let ends = (EPOCH_US + 3_600_000_000) as f64;
    let marks = [
        (-(extra as f64), b"rl\x01C".to_vec()),
        (-ends, b"rl\x01E".to_vec()),
    ];
    let live = live.iter().map(|(id, units)| {
        let member = if *units == 1 {
            id.to_string()
        } else {
            format!("{id}:{units}")
        };
        ((EPOCH_US + 60_000_000) as f64, member.into_bytes())
    });
    let dead = (0..PILED).map(|i| ((1_000 + i) as f64, format!("d{i}").into_bytes()));
    plant(server, key, marks.into_iter().chain(live).chain(dead));
}

/// With a lease of several units held, every acquire removes the dead
/// leases first: all of them at once, 200,000 of them blocking Redis for
/// 200 ms. Now at most 1,024 a call; what is held is still exact.
#[tokio::test]
async fn dead_leases_go_a_bounded_step_at_a_time() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::concurrency(1_000, Duration::from_secs(60));
    let key = "limiter:piled:leases";
    leases(&server, key, &[("big", 3)]);
    let at = Duration::from_micros(EPOCH_US);
    let before = command_stat(&mut server.connection(), "fcall", "usec");
    let decision = redis.acquire_at(&rule, key, 1, 7, at).await.unwrap();
    let spent = command_stat(&mut server.connection(), "fcall", "usec") - before;
    assert!(
        decision.allowed && decision.remaining == 1_000 - 3 - 1,
        "{decision:?}"
    );
    assert!(spent < 20_000, "one acquire took {spent} µs of the server");
}

/// With leases of one unit only, dead ones are trimmed at a refusal: all
/// of them at once. Now at most 1,024 a call.
#[tokio::test]
async fn a_refusal_trims_a_bounded_step() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::concurrency(2, Duration::from_secs(60));
    let key = "limiter:piled:refused";
    leases(&server, key, &[("a", 1), ("b", 1)]);
    let at = Duration::from_micros(EPOCH_US);
    let before = command_stat(&mut server.connection(), "fcall", "usec");
    let decision = redis.acquire_at(&rule, key, 1, 7, at).await.unwrap();
    let spent = command_stat(&mut server.connection(), "fcall", "usec") - before;
    assert!(!decision.allowed, "{decision:?}");
    assert!(spent < 20_000, "one refusal took {spent} µs of the server");
}

/// A sliding log's refund of a call with 200,000 calls logged after it: it
/// would rewrite every one of them (each is counted through one unit
/// fewer), so it gives nothing back rather than hold the server; earlier
/// versions removed the newest calls, all of them at once.
#[tokio::test]
async fn a_sliding_log_refund_does_a_bounded_step() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::sliding_log(1_000_000_000, Duration::from_secs(60));
    let key = "limiter:piled:log";
    let at = Duration::from_micros(EPOCH_US);
    let (_, charge) = redis.charge_at(&rule, key, 1, at).await.unwrap();
    let charge = charge.expect("allowed");
    let later = (1..=PILED).map(|i| {
        let member = [(1 + i) as f64, 1.0]
            .iter()
            .flat_map(|n| n.to_be_bytes())
            .collect();
        ((EPOCH_US + i) as f64, member)
    });
    plant(&server, key, later);
    let then = at + Duration::from_secs(1);
    let before = command_stat(&mut server.connection(), "fcall", "usec");
    let refunded = redis.refund_at(&rule, key, &charge, then).await.unwrap();
    let spent = command_stat(&mut server.connection(), "fcall", "usec") - before;
    assert_eq!(
        refunded.remaining,
        1_000_000_000 - PILED - 1 - 1,
        "nothing given back"
    );
    assert!(spent < 20_000, "one refund took {spent} µs of the server");
}

/// The limit `Backend::refund` documents: a sliding log's refund rewrites
/// the call's entry and every call logged after it, at most 1,024 of them.
/// With 1,023 calls after it, the call is given back; with 1,024, nothing
/// is, and it stays counted. Memory and Redis alike.
#[tokio::test]
async fn a_sliding_log_refund_rewrites_at_most_1024_calls_alike() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await;
    let rule = Rule::sliding_log(10_000, Duration::from_secs(60));
    for (after, given_back) in [(1_023, true), (1_024, false)] {
        let key = format!("limiter:walk:{after}");
        let clock = ManualClock::new();
        clock.advance(Duration::from_micros(EPOCH_US));
        let memory = MemoryBackend::with_clock(clock.clone());
        let at = Duration::from_micros(EPOCH_US);
        let (_, in_memory) = memory.charge_now(&rule, &key, 1);
        let (_, in_redis) = redis.charge_at(&rule, &key, 1, at).await.unwrap();
        for i in 1..=after {
            clock.advance(Duration::from_micros(1));
            assert!(memory.check_now(&rule, &key, 1).allowed);
            let now = at + Duration::from_micros(i);
            assert!(redis.check_at(&rule, &key, 1, now).await.unwrap().allowed);
        }
        clock.advance(Duration::from_micros(1));
        let then = at + Duration::from_micros(after + 1);
        let memory = memory.refund_now(&rule, &key, &in_memory.unwrap()).unwrap();
        let redis = redis
            .refund_at(&rule, &key, &in_redis.unwrap(), then)
            .await
            .unwrap();
        // What a check would leave (a refund answers as a peek does).
        let left = 10_000 - (1 + after - u64::from(given_back)) - 1;
        assert_eq!(memory.remaining, left, "{after} after, memory");
        assert_eq!(redis.remaining, left, "{after} after, Redis");
    }
}

/// A sliding log keeps one entry per call in its window, whatever its cost:
/// in Redis no more than the bytes a call `Algorithm::SlidingLog`'s docs
/// give, about 130 (10,000 calls of one key, measured with `MEMORY
/// USAGE`).
#[tokio::test]
async fn a_sliding_log_costs_what_its_docs_say() {
    let server = RedisServer::start();
    let redis = redis_backend(&server).await.batch_every_check();
    let rule = Rule::sliding_log(1_000_000, Duration::from_secs(3600));
    let key = "limiter:log:footprint";
    let calls = 10_000u64;
    for call in 0..calls {
        let at = Duration::from_micros(EPOCH_US + call);
        assert!(
            redis
                .check_at(&rule, key, 1 + call % 3, at)
                .await
                .unwrap()
                .allowed
        );
    }
    let bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query(&mut server.connection())
        .unwrap();
    assert!(bytes / calls <= 140, "{} bytes a call", bytes / calls);
}
