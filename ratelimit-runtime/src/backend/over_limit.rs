//! The over-limit cache: keys the backend said are over their limit until
//! some instant, refused locally until then without a round trip.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::decision::Decision;
use crate::rule::Rule;

const CACHE_SHARDS: usize = 16;
const MIN_SWEEP_LEN: usize = 256;

/// Keys Redis said are over their limit until some instant: refused locally
/// until then, with no round trip. It only ever refuses, and only until the
/// time Redis named, measured from before the request was sent (so never
/// later than Redis' own), and only calls that cost at least as much as the
/// refused one.
///
/// It holds at most about as many keys as the limiter's `max_keys`: a shard
/// still mostly full after dropping expired refusals starts over (it only
/// saves round trips; a key it forgot is asked of Redis again).
#[derive(Debug)]
pub(crate) struct OverLimitCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Box<str>, Refusal>,
    sweep_at: usize,
    /// When a refusal of the shard's keys was last forgotten: a refusal
    /// answered to a request sent before it may predate what was given
    /// back, and is not remembered.
    forgotten: Option<Instant>,
}

#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The rule Redis refused under: a call under another (an override
    /// changed it) asks Redis again.
    rule: Rule,
    until: Instant,
    reset_at: Instant,
    cost: u64,
    limit: u64,
    remaining: u64,
}

impl OverLimitCache {
    /// A cache of at most about `max_keys` keys.
    pub(crate) fn new(max_keys: usize) -> OverLimitCache {
        OverLimitCache {
            max_per_shard: max_keys.div_ceil(CACHE_SHARDS).max(MIN_SWEEP_LEN),
            shards: (0..CACHE_SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: HashMap::new(),
                        sweep_at: MIN_SWEEP_LEN,
                        forgotten: None,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % CACHE_SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A local refusal, if `key` is known to refuse a call of this cost
    /// under `rule` now.
    pub(crate) fn refused(&self, rule: &Rule, key: &str, cost: u64) -> Option<Decision> {
        let now = Instant::now();
        let shard = self.shard(key);
        let refusal = shard.entries.get(key)?;
        if now >= refusal.until || cost < refusal.cost || refusal.rule != *rule {
            return None;
        }
        Some(Decision {
            allowed: false,
            limit: refusal.limit,
            remaining: refusal.remaining,
            reset_after: refusal.reset_at.saturating_duration_since(now),
            retry_after: refusal.until - now,
        })
    }

    /// Forgets what Redis refused `key` under `rule` (its budget was reset
    /// or given back).
    pub(crate) fn forget(&self, rule: &Rule, key: &str) {
        let mut shard = self.shard(key);
        shard.forgotten = Some(Instant::now());
        if shard.entries.get(key).is_some_and(|r| r.rule == *rule) {
            shard.entries.remove(key);
        }
    }

    /// Forgets what Redis refused `key` under any rule (units of it were
    /// given back).
    pub(crate) fn forget_key(&self, key: &str) {
        let mut shard = self.shard(key);
        shard.forgotten = Some(Instant::now());
        shard.entries.remove(key);
    }

    /// Remembers a refusal Redis answered to a request sent at `sent`.
    pub(crate) fn remember(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        decision: &Decision,
        sent: Instant,
    ) {
        if decision.allowed || decision.retry_after.is_zero() {
            return;
        }
        let refusal = Refusal {
            rule: *rule,
            until: sent + decision.retry_after,
            reset_at: sent + decision.reset_after,
            cost,
            limit: decision.limit,
            remaining: decision.remaining,
        };
        let now = Instant::now();
        let mut shard = self.shard(key);
        if shard.forgotten.is_some_and(|forgotten| sent <= forgotten) {
            return;
        }
        if shard.entries.len() >= shard.sweep_at {
            shard.entries.retain(|_, r| r.until > now);
            if shard.entries.len() >= self.max_per_shard / 2 {
                shard.entries.clear();
            }
            shard.sweep_at = (shard.entries.len() * 2).clamp(MIN_SWEEP_LEN, self.max_per_shard);
        }
        shard.entries.insert(key.into(), refusal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const RULE: Rule = Rule::fixed_window(5, Duration::from_secs(60));

    /// The cache is bounded by the limiter's `max_keys`, however many keys
    /// Redis refuses for however long. (It used to grow with them.)
    #[test]
    fn the_cache_holds_at_most_about_max_keys() {
        let max_keys = CACHE_SHARDS * MIN_SWEEP_LEN;
        let cache = OverLimitCache::new(max_keys);
        let refused = Decision {
            allowed: false,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(3600),
            retry_after: Duration::from_secs(3600),
        };
        let sent = Instant::now();
        for i in 0..20 * max_keys {
            cache.remember(&RULE, &format!("flood:{i}"), 1, &refused, sent);
        }
        let held: usize = cache
            .shards
            .iter()
            .map(|s| s.lock().unwrap().entries.len())
            .sum();
        assert!(held <= max_keys, "{held} keys held, over {max_keys}");
        let last = format!("flood:{}", 20 * max_keys - 1);
        assert!(cache.refused(&RULE, &last, 1).is_some(), "still caching");
    }

    #[test]
    fn the_cache_refuses_only_until_the_time_redis_named() {
        let cache = OverLimitCache::new(1_000);
        let refused = |retry_ms| Decision {
            allowed: false,
            limit: 5,
            remaining: 1,
            reset_after: Duration::from_millis(2 * retry_ms),
            retry_after: Duration::from_millis(retry_ms),
        };
        let sent = Instant::now();
        cache.remember(&RULE, "k", 2, &refused(30_000), sent);
        let local = cache.refused(&RULE, "k", 2).expect("refused locally");
        assert!(local.retry_after <= Duration::from_secs(30));
        assert!(!local.allowed && local.remaining == 1 && local.limit == 5);
        assert!(
            cache.refused(&RULE, "k", 3).is_some(),
            "a costlier call too"
        );
        assert!(
            cache.refused(&RULE, "k", 1).is_none(),
            "a cheaper call may pass: ask Redis"
        );
        assert!(cache.refused(&RULE, "other", 2).is_none());
        let raised = Rule::fixed_window(50, Duration::from_secs(60));
        assert!(
            cache.refused(&raised, "k", 2).is_none(),
            "under another rule (an override): ask Redis"
        );

        let sent = Instant::now();
        cache.remember(&RULE, "short", 1, &refused(30), sent);
        while sent.elapsed() < Duration::from_millis(30) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            cache.refused(&RULE, "short", 1).is_none(),
            "never past the time Redis named"
        );
    }
}
