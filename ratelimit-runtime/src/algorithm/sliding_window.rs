//! Sliding window: the two-counter approximation, the previous window's
//! count weighted by its overlap plus the current one's.

use super::{Outcome, State};
use crate::rule::Rule;

/// `floor(count * span / period)`: the previous window's weight. Computed in
/// doubles, exactly as the Lua script does, so both round the same way.
fn weighted(count: u64, span: u64, period: u64) -> u64 {
    ((count as f64) * (span as f64) / (period as f64)).floor() as u64
}

/// The first offset `e` in `[0, period]` into a window at which a previous
/// window holding `count` weighs at most `at_most`.
fn first_offset(count: u64, at_most: u64, period: u64) -> u64 {
    let guess = (period as f64) - ((at_most + 1) as f64) * (period as f64) / (count as f64);
    let mut e = if guess < 0.0 {
        0
    } else {
        (guess.floor() as u64 + 1).min(period)
    };
    while e < period && weighted(count, period - e, period) > at_most {
        e += 1;
    }
    while e > 0 && weighted(count, period - (e - 1), period) <= at_most {
        e -= 1;
    }
    e
}

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let start = now - now % period;
    let (cur, prev) = match *slot {
        Some(State::SlidingWindow { start: s, cur, .. }) if s + period == start => (0, cur),
        Some(State::SlidingWindow {
            start: s,
            cur,
            prev,
        }) if s == start => (cur, prev),
        _ => (0, 0),
    };
    let elapsed = now - start;
    let used = cur + weighted(prev, period - elapsed, period);
    let allowed = used + cost <= count;
    let (cur, used) = if allowed {
        *slot = Some(State::SlidingWindow {
            start,
            cur: cur + cost,
            prev,
        });
        (cur + cost, used + cost)
    } else {
        (cur, used)
    };
    let remaining = count.saturating_sub(used);
    let reset_after_us = if cur > 0 {
        2 * period - elapsed
    } else if prev > 0 {
        period - elapsed
    } else {
        0
    };
    let retry_after_us = if remaining >= cost {
        0
    } else if cur + cost <= count {
        // The previous window's weight falls enough within this window.
        first_offset(prev, count - cost - cur, period) - elapsed
    } else {
        // This window's calls must fade in the next one.
        period - elapsed + first_offset(cur, count - cost, period)
    };
    Outcome {
        allowed,
        remaining,
        reset_after_us,
        retry_after_us,
    }
}

/// Gives back `units` of the current window's count (never below none).
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64) {
    let start = now - now % rule.period_us();
    if let Some(State::SlidingWindow { start: s, cur, .. }) = slot
        && *s == start
    {
        *cur = cur.saturating_sub(units);
    }
}
