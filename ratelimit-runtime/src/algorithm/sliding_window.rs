//! Sliding window: the two-counter approximation, the previous window's
//! count weighted by its overlap plus the current one's.

use super::{Outcome, State};
use crate::rule::Rule;

/// `floor(count * span / period)`: the previous window's weight, exactly
/// (the product may pass 2^53, where doubles round; the Lua script works it
/// out in parts for that).
fn weighted(count: u64, span: u64, period: u64) -> u64 {
    (u128::from(count) * u128::from(span) / u128::from(period)) as u64
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
    let (cur, prev, born) = match *slot {
        Some(State::SlidingWindow {
            start: s,
            born,
            cur,
            ..
        }) if s + period == start => (0, u64::from(cur), born),
        Some(State::SlidingWindow {
            start: s,
            born,
            cur,
            prev,
        }) if s == start => (u64::from(cur), u64::from(prev), born),
        _ => (0, 0, now),
    };
    let elapsed = now - start;
    let used = cur + weighted(prev, period - elapsed, period);
    let allowed = used + cost <= count;
    let (cur, used) = if allowed {
        // Counts are at most the rule's count, at most `Rule::MAX_COUNT`.
        *slot = Some(State::SlidingWindow {
            start,
            born,
            cur: (cur + cost) as u32,
            prev: prev as u32,
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
        limit: 0,
    }
}

/// Gives back `units` of the window the charge at `stamp` (µs) was counted
/// in, where it still counts: the current window's count or the previous
/// one's (never below none). Not in a state begun after the charge (a
/// reset came between).
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64, stamp: u64) {
    let period = rule.period_us();
    let (start, charged) = (now - now % period, stamp - stamp % period);
    let Some(State::SlidingWindow {
        start: s,
        born,
        cur,
        prev,
    }) = slot
    else {
        return;
    };
    if *born > stamp || stamp > now {
        return;
    }
    let units = u32::try_from(units).unwrap_or(u32::MAX);
    if charged == *s && (*s == start || *s + period == start) {
        // Stored as this window's count (the previous one's, if the state
        // was last written a window ago).
        *cur = cur.saturating_sub(units);
    } else if charged + period == *s && *s == start {
        *prev = prev.saturating_sub(units);
    }
}
