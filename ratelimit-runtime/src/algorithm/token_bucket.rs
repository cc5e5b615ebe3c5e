//! Token bucket: `burst` tokens, refilled continuously at `count` per
//! `period`, starting full.

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let (tokens, last) = match *slot {
        // `min`: kept under a larger burst, before the rule was changed.
        Some(State::TokenBucket { tokens, last }) => (tokens.min(capacity), last),
        _ => (capacity, now),
    };
    let elapsed = now.saturating_sub(last);
    let tokens = if elapsed >= (capacity - tokens).div_ceil(count) {
        capacity
    } else {
        tokens + elapsed * count
    };
    let need = cost * period;
    let allowed = tokens >= need;
    let tokens = if allowed {
        *slot = Some(State::TokenBucket {
            tokens: tokens - need,
            last: now,
        });
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

/// Puts `units` tokens back, up to the burst (a full bucket is no state).
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64) {
    let (count, period) = (rule.count(), rule.period_us());
    let capacity = rule.burst() * period;
    let Some(State::TokenBucket { tokens, last }) = *slot else {
        return;
    };
    let tokens = tokens.min(capacity);
    let elapsed = now.saturating_sub(last);
    if elapsed >= (capacity - tokens).div_ceil(count) {
        return;
    }
    let tokens = (tokens + elapsed * count + units.min(rule.burst()) * period).min(capacity);
    *slot = (tokens < capacity).then_some(State::TokenBucket { tokens, last: now });
}
