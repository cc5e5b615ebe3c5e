//! Token bucket: `burst` tokens, refilled continuously at `count` per
//! `period`, starting full.

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let (tokens, last, born) = match *slot {
        // `min`: kept under a larger burst, before the rule was changed.
        Some(State::TokenBucket(bucket)) => (
            bucket.tokens_under(period).min(capacity),
            bucket.last(),
            bucket.born(),
        ),
        _ => (capacity, now, now),
    };
    let elapsed = now.saturating_sub(last);
    // Full again: what was taken before is all back, and a bucket begins.
    let (tokens, born) = if elapsed >= (capacity - tokens).div_ceil(count) {
        (capacity, now)
    } else {
        (tokens + elapsed * count, born)
    };
    let need = cost * period;
    let allowed = tokens >= need;
    let tokens = if allowed {
        *slot = Some(State::TokenBucket(Bucket::new(
            tokens - need,
            now,
            period,
            born,
        )));
        tokens - need
    } else {
        tokens
    };
    Outcome {
        allowed,
        remaining: tokens / period,
        reset_after_us: (capacity - tokens).div_ceil(count),
        retry_after_us: if tokens >= need {
            0
        } else {
            (need - tokens).div_ceil(count)
        },
    }
}

/// Puts `units` tokens back, up to the burst (a full bucket is no state),
/// if the charge at `stamp` was taken from this bucket: not one that began
/// since (it was full again, or reset).
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64, stamp: u64) {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let Some(State::TokenBucket(bucket)) = *slot else {
        return;
    };
    if bucket.born() > stamp {
        return;
    }
    let tokens = bucket.tokens_under(period).min(capacity);
    let elapsed = now.saturating_sub(bucket.last());
    if elapsed >= (capacity - tokens).div_ceil(count) {
        return;
    }
    let tokens = (tokens + elapsed * count + units.min(rule.burst()) * period).min(capacity);
    *slot = (tokens < capacity)
        .then(|| State::TokenBucket(Bucket::new(tokens, now, period, bucket.born())));
}

/// A bucket's state in 24 bytes (so a store's entry stays one cache line):
/// its tokens in fixed point (`period` units per token, below 2^53), the
/// period they are counted under (ms, below 2^35: a change of period reads
/// them as tokens, not units), the last update (µs), and how long before it
/// the bucket began (`born`; up to 2^40 µs, about 12 days: past that it
/// reads as 2^40 µs, so a refund of an older charge is not made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Bucket {
    /// The tokens (53 bits), then the born offset's low 11 bits.
    tokens: u64,
    last: u64,
    /// The period in ms (35 bits), then the born offset's high 29 bits.
    period: u64,
}

const TOKEN_BITS: u32 = 53;
const PERIOD_BITS: u32 = 35;
const BORN_BITS: u32 = 64 - TOKEN_BITS + 64 - PERIOD_BITS;

impl Bucket {
    pub(crate) fn new(tokens: u64, last: u64, period_us: u64, born: u64) -> Bucket {
        let offset = last.saturating_sub(born).min((1 << BORN_BITS) - 1);
        let low = 64 - TOKEN_BITS;
        Bucket {
            tokens: tokens | (offset << TOKEN_BITS),
            last,
            period: (period_us / 1000) | ((offset >> low) << PERIOD_BITS),
        }
    }

    /// The tokens in fixed point under `period_us`: whole tokens carried
    /// over from another period (its fraction of a token is dropped).
    pub(crate) fn tokens_under(&self, period_us: u64) -> u64 {
        let tokens = self.tokens & ((1 << TOKEN_BITS) - 1);
        let stored = (self.period & ((1 << PERIOD_BITS) - 1)) * 1000;
        if stored == period_us || stored == 0 {
            tokens
        } else {
            (tokens / stored).saturating_mul(period_us)
        }
    }

    pub(crate) fn last(&self) -> u64 {
        self.last
    }

    /// When the bucket began (never later than it did).
    pub(crate) fn born(&self) -> u64 {
        let low = 64 - TOKEN_BITS;
        let offset = (self.tokens >> TOKEN_BITS) | ((self.period >> PERIOD_BITS) << low);
        self.last - offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_packs_what_it_keeps() {
        let period = (366 * 24 * 3600 * 1000) * 1000;
        let bucket = Bucket::new((1 << 52) + 7, 1 << 60, period, (1 << 60) - 123_456_789);
        assert_eq!(bucket.tokens_under(period), (1 << 52) + 7);
        assert_eq!(bucket.last(), 1 << 60);
        assert_eq!(bucket.born(), (1 << 60) - 123_456_789);
        let old = Bucket::new(5, 1 << 50, 1000, 0);
        assert_eq!(old.born(), (1 << 50) - ((1 << BORN_BITS) - 1), "read later");
        let hour = 3_600_000_000;
        let nine = Bucket::new(9 * hour + hour / 2, 0, hour, 0);
        assert_eq!(nine.tokens_under(1_000_000), 9_000_000, "whole tokens");
    }
}
