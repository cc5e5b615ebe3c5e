//! Token bucket: `burst` tokens, refilled continuously at `count` per
//! `period`, starting full.

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let (tokens, born) = tokens_at(slot, rule, now);
    let need = cost * period;
    let allowed = tokens >= need as i128;
    let tokens = if allowed {
        let tokens = tokens as u64 - need;
        *slot = Some(State::TokenBucket(Bucket::new(tokens, now, period, born)));
        tokens as i128
    } else {
        tokens
    };
    // `tokens` is below zero only while calls wait their turn (reserved).
    let short = |want: i128| ((want - tokens).max(0) as u64).div_ceil(count);
    Outcome {
        allowed,
        remaining: tokens.max(0) as u64 / period,
        reset_after_us: short(capacity as i128),
        retry_after_us: short(need as i128),
        limit: 0,
    }
}

/// The tokens at `now` (in fixed point; below zero while reserved calls
/// wait their turn: the last update is then ahead of now) and when the
/// bucket began: full again, it begins at `now`.
fn tokens_at(slot: &Option<State>, rule: &Rule, now: u64) -> (i128, u64) {
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
    if last > now {
        return (
            tokens as i128 - ((last - now) as i128 * count as i128),
            born,
        );
    }
    let elapsed = now - last;
    // Full again: what was taken before is all back, and a bucket begins.
    if elapsed >= (capacity - tokens).div_ceil(count) {
        (capacity as i128, now)
    } else {
        ((tokens + elapsed * count) as i128, born)
    }
}

/// The bucket holding `tokens` at `now` (below zero: its last update is
/// moved ahead to the first µs at which it holds none or more).
fn settled(tokens: i128, now: u64, count: u64, period: u64, born: u64) -> Bucket {
    if tokens >= 0 {
        return Bucket::new(tokens as u64, now, period, born);
    }
    let ahead = (-tokens) as u64;
    let wait = ahead.div_ceil(count);
    Bucket::new(wait * count - ahead, now + wait, period, born)
}

/// Reserves `cost` tokens for a call that may wait up to `max_wait` µs (see
/// [`super::reserve`]): a call the check refuses and that can go within
/// `max_wait` takes its tokens now, leaving the bucket below zero until it
/// goes, so that the next caller queues behind it.
pub(super) fn reserve(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    max_wait: u64,
) -> Outcome {
    let outcome = check(slot, rule, now, cost);
    if outcome.allowed {
        return super::at_once(outcome);
    }
    if outcome.retry_after_us > max_wait || slot.is_none() {
        return outcome;
    }
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let (tokens, born) = tokens_at(slot, rule, now);
    let tokens = tokens - (cost * period) as i128;
    *slot = Some(State::TokenBucket(settled(
        tokens, now, count, period, born,
    )));
    super::waiting(
        (capacity as i128 - tokens) as u64,
        count,
        outcome.retry_after_us,
    )
}

/// Gives back a reservation made at `at` that left the bucket `position`
/// units short of full (see [`super::cancel`]).
pub(super) fn cancel(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    at: u64,
    position: u64,
) {
    if !matches!(slot, Some(State::TokenBucket(_))) {
        return;
    }
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let (tokens, born) = tokens_at(slot, rule, now);
    let short = (capacity as i128 - tokens) as u64;
    let Some(back) = super::given_back(rule, now, cost, at, position, short, born) else {
        return;
    };
    let tokens = tokens + back as i128;
    *slot = (tokens < capacity as i128)
        .then(|| State::TokenBucket(settled(tokens, now, count, period, born)));
}

/// Puts `units` tokens back, up to the burst (a full bucket is no state),
/// if the charge at `stamp` was taken from this bucket: not one that began
/// since (it was full again, or reset).
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64, stamp: u64) {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = (rule.burst() * period) as i128;
    let Some(State::TokenBucket(bucket)) = *slot else {
        return;
    };
    if bucket.born() > stamp {
        return;
    }
    let (tokens, _) = tokens_at(slot, rule, now);
    if tokens >= capacity {
        return;
    }
    let tokens = (tokens + (units.min(rule.burst()) * period) as i128).min(capacity);
    *slot = (tokens < capacity)
        .then(|| State::TokenBucket(settled(tokens, now, count, period, bucket.born())));
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
