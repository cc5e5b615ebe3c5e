//! Every algorithm as a pure state machine on integer microseconds.
//!
//! The in-memory backend runs these; each Lua script in `src/scripts/` is
//! the same steps written again for Redis, so both backends give the same
//! decisions for the same calls and times (the equivalence tests hold them
//! side by side). Keep the two in step: change one, change the other.
//!
//! Token counts of the bucket algorithms are fixed point with `period_us`
//! units per token, so refilling at `count` per `period` adds exactly
//! `count` units per microsecond and nothing is ever rounded. Every product
//! stays below 2^53 (see [`Rule::MAX_BURST_PERIOD_US`]), where Lua's doubles
//! are still exact integers.

use std::collections::VecDeque;
use std::time::Duration;

use crate::{Algorithm, Decision, Rule};

/// What one check found, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
}

impl Outcome {
    pub(crate) fn decision(self, rule: &Rule) -> Decision {
        Decision {
            allowed: self.allowed,
            limit: rule.count(),
            remaining: self.remaining,
            reset_after: Duration::from_micros(self.reset_after_us),
            retry_after: Duration::from_micros(self.retry_after_us),
        }
    }
}

/// A concurrency lease: `cost` units held until `expires` unless released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) expires: u64,
    pub(crate) cost: u64,
}

/// What one key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow {
        used: u64,
        ends: u64,
    },
    /// Call times, oldest first; one entry per unit of cost.
    SlidingLog(Log),
    SlidingWindow {
        start: u64,
        cur: u64,
        prev: u64,
    },
    /// `tokens` in fixed point: `period_us` units per token.
    TokenBucket {
        tokens: u64,
        last: u64,
    },
    /// The theoretical arrival time `tat + rem / count` µs.
    Gcra {
        tat: u64,
        rem: u64,
    },
    /// Leases, in the order they were taken (so by expiry).
    Concurrency(Vec<Lease>),
}

impl State {
    /// When this state is worth nothing any more (the key can be dropped).
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        let period = rule.period_us();
        match self {
            State::FixedWindow { ends, .. } => *ends,
            State::SlidingLog(log) => log.back().map_or(0, |newest| newest + period),
            State::SlidingWindow { start, .. } => start + 2 * period,
            State::TokenBucket { tokens, last } => {
                last + (rule.burst() * period - tokens).div_ceil(rule.count())
            }
            State::Gcra { tat, rem } => tat + u64::from(*rem > 0),
            State::Concurrency(leases) => leases.iter().map(|l| l.expires).max().unwrap_or(0),
        }
    }
}

/// Checks and consumes `cost` units at time `now` (µs). `slot` is the key's
/// state (`None`: nothing stored); it is left alone when the call is refused.
///
/// `cost` is between 1 and `rule.capacity()`. Concurrency rules go through
/// [`acquire`] instead.
pub(crate) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    match rule.algorithm() {
        Algorithm::FixedWindow => fixed_window(slot, rule, now, cost),
        Algorithm::SlidingLog => sliding_log(slot, rule, now, cost),
        Algorithm::SlidingWindow => sliding_window(slot, rule, now, cost),
        Algorithm::TokenBucket => token_bucket(slot, rule, now, cost),
        Algorithm::Gcra => gcra(slot, rule, now, cost),
        Algorithm::Concurrency => acquire(slot, rule, now, cost, 0),
    }
}

fn fixed_window(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let count = rule.count();
    let (used, ends) = match *slot {
        Some(State::FixedWindow { used, ends }) if now < ends => (used, ends),
        _ => (0, now + rule.period_us()),
    };
    let reset = ends - now;
    if used + cost > count {
        return Outcome {
            allowed: false,
            remaining: count.saturating_sub(used),
            reset_after_us: reset,
            retry_after_us: reset,
        };
    }
    *slot = Some(State::FixedWindow {
        used: used + cost,
        ends,
    });
    let remaining = count - used - cost;
    Outcome {
        allowed: true,
        remaining,
        reset_after_us: reset,
        retry_after_us: if remaining >= cost { 0 } else { reset },
    }
}

fn sliding_log(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    if !matches!(slot, Some(State::SlidingLog(_))) {
        *slot = Some(State::SlidingLog(Log::default()));
    }
    let Some(State::SlidingLog(log)) = slot else {
        unreachable!("set just above")
    };
    // A call at time t counts while now < t + period.
    while log.front().is_some_and(|t| t + period <= now) {
        log.pop_front();
    }
    let held = log.len() as u64;
    let allowed = held + cost <= count;
    if allowed {
        log.push(now, cost as usize);
    }
    let held = log.len() as u64;
    let remaining = count.saturating_sub(held);
    let retry_after_us = if remaining >= cost {
        0
    } else {
        // The oldest `held + cost - count` calls must leave the window first.
        let oldest_needed = (held + cost - count - 1) as usize;
        log.get(oldest_needed) + period - now
    };
    Outcome {
        allowed,
        remaining,
        reset_after_us: log.back().map_or(0, |newest| newest + period - now),
        retry_after_us,
    }
}

/// A sliding log's call times, oldest first. The first few are kept in place
/// (most keys of a per-client limit hold one or two calls), so a new key
/// costs no allocation; longer logs move to the heap and stay there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Log {
    Inline {
        len: u8,
        times: [u64; INLINE_LOG],
    },
    /// Boxed, so a log stays 24 bytes, no more than the other states hold
    /// (a `VecDeque` is 32): the in-memory store's entries are smaller for it.
    #[expect(
        clippy::box_collection,
        reason = "keeps the state small; only logs past the inline calls pay the box"
    )]
    Heap(Box<VecDeque<u64>>),
}

/// How many call times a log keeps in place.
const INLINE_LOG: usize = 2;

impl Default for Log {
    fn default() -> Self {
        Log::Inline {
            len: 0,
            times: [0; INLINE_LOG],
        }
    }
}

impl Log {
    fn len(&self) -> usize {
        match self {
            Log::Inline { len, .. } => usize::from(*len),
            Log::Heap(log) => log.len(),
        }
    }

    /// The `i`th oldest time; `i` is below `len()`.
    fn get(&self, i: usize) -> u64 {
        match self {
            Log::Inline { times, .. } => times[i],
            Log::Heap(log) => log[i],
        }
    }

    fn front(&self) -> Option<u64> {
        (self.len() > 0).then(|| self.get(0))
    }

    fn back(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    fn pop_front(&mut self) {
        match self {
            Log::Inline { len, times } => {
                if *len > 0 {
                    times.copy_within(1.., 0);
                    *len -= 1;
                }
            }
            Log::Heap(log) => {
                log.pop_front();
            }
        }
    }

    /// Appends `n` calls at time `t`.
    fn push(&mut self, t: u64, n: usize) {
        if let Log::Inline { len, times } = self {
            let at = usize::from(*len);
            if at + n <= INLINE_LOG {
                times[at..at + n].fill(t);
                *len += n as u8;
                return;
            }
            let mut log = VecDeque::with_capacity((at + n).max(2 * INLINE_LOG));
            log.extend(&times[..at]);
            *self = Log::Heap(Box::new(log));
        }
        if let Log::Heap(log) = self {
            log.extend(std::iter::repeat_n(t, n));
        }
    }
}

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

fn sliding_window(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
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

fn token_bucket(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
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

fn gcra(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let tolerance = rule.burst() * period;
    // How far the theoretical arrival time is ahead of now, in 1/count µs.
    let ahead = match *slot {
        Some(State::Gcra { tat, rem }) if tat >= now => (tat - now) * count + rem,
        _ => 0,
    };
    let step = cost * period;
    let allowed = ahead + step <= tolerance;
    let ahead = if allowed {
        let ahead = ahead + step;
        *slot = Some(State::Gcra {
            tat: now + ahead / count,
            rem: ahead % count,
        });
        ahead
    } else {
        ahead
    };
    Outcome {
        allowed,
        // `ahead` exceeds the tolerance only if the rule was tightened since.
        remaining: tolerance.saturating_sub(ahead) / period,
        reset_after_us: ahead.div_ceil(count),
        retry_after_us: if tolerance.saturating_sub(ahead) >= step {
            0
        } else {
            (ahead + step - tolerance).div_ceil(count)
        },
    }
}

/// Takes `cost` units of a concurrency rule for lease `id` until
/// `now + period`, unless released sooner.
pub(crate) fn acquire(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    id: u64,
) -> Outcome {
    let count = rule.count();
    if !matches!(slot, Some(State::Concurrency(_))) {
        *slot = Some(State::Concurrency(Vec::new()));
    }
    let Some(State::Concurrency(leases)) = slot else {
        unreachable!("set just above")
    };
    leases.retain(|lease| lease.expires > now);
    let held: u64 = leases.iter().map(|l| l.cost).sum();
    let allowed = held + cost <= count;
    if allowed {
        leases.push(Lease {
            id,
            expires: now + rule.period_us(),
            cost,
        });
    }
    let held = if allowed { held + cost } else { held };
    let remaining = count.saturating_sub(held);
    let retry_after_us = if remaining >= cost {
        0
    } else {
        // Leases expire in the order taken; the one holding unit number
        // `held + cost - count` (1-based) must go first.
        let mut units = 0;
        leases
            .iter()
            .find(|lease| {
                units += lease.cost;
                units >= held + cost - count
            })
            .map_or(0, |lease| lease.expires - now)
    };
    Outcome {
        allowed,
        remaining,
        reset_after_us: leases.iter().map(|l| l.expires - now).max().unwrap_or(0),
        retry_after_us,
    }
}

/// Gives back lease `id`'s units.
pub(crate) fn release(slot: &mut Option<State>, id: u64) {
    if let Some(State::Concurrency(leases)) = slot {
        leases.retain(|lease| lease.id != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn run(rule: &Rule, calls: &[(u64, u64)]) -> Vec<Outcome> {
        let mut slot = None;
        calls
            .iter()
            .map(|&(now, cost)| check(&mut slot, rule, now, cost))
            .collect()
    }

    fn allowed(outcomes: &[Outcome]) -> Vec<bool> {
        outcomes.iter().map(|o| o.allowed).collect()
    }

    #[test]
    fn sliding_log_counts_calls_in_any_period() {
        let rule = Rule::sliding_log(2, Duration::from_secs(1));
        let out = run(
            &rule,
            &[(0, 1), (S / 2, 1), (S - 1, 1), (S, 1), (S + S / 2, 1)],
        );
        assert_eq!(allowed(&out), [true, true, false, true, true]);
        assert_eq!(
            out[2].retry_after_us, 1,
            "the first call leaves the window at 1 s"
        );
        assert_eq!(out[1].reset_after_us, S);
    }

    #[test]
    fn a_log_keeps_its_order_in_place_and_on_the_heap() {
        // Pushes and pops in every mix of lengths around the inline
        // capacity, held against a plain VecDeque.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut log = Log::default();
        let mut plain = VecDeque::new();
        let mut spilled = false;
        for t in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) {
                log.pop_front();
                plain.pop_front();
            } else {
                let n = (x >> 8) as usize % (INLINE_LOG + 2);
                log.push(t, n);
                plain.extend(std::iter::repeat_n(t, n));
            }
            if t.is_multiple_of(8) {
                // Back to an empty log, inline again: short runs try every
                // mix of pushes and pops in place.
                log = Log::default();
                plain.clear();
            }
            assert_eq!(log.len(), plain.len(), "at {t}");
            assert_eq!(log.front(), plain.front().copied(), "at {t}");
            assert_eq!(log.back(), plain.back().copied(), "at {t}");
            for (i, &time) in plain.iter().enumerate() {
                assert_eq!(log.get(i), time, "at {t}");
            }
            spilled |= matches!(log, Log::Heap(_));
        }
        assert!(spilled, "some runs spilled to the heap");
    }

    #[test]
    fn a_sliding_log_past_its_inline_calls_counts_them_all() {
        let rule = Rule::sliding_log(5, Duration::from_secs(1));
        let out = run(
            &rule,
            &[(0, 1), (1, 1), (2, 2), (3, 1), (4, 1), (S, 1), (S + 2, 3)],
        );
        assert_eq!(allowed(&out), [true, true, true, true, false, true, true]);
        assert_eq!(out[3].remaining, 0);
        assert_eq!(out[4].retry_after_us, S - 4, "the first call leaves at 1 s");
        assert_eq!(
            out[6].remaining, 0,
            "the calls at 1 and 2 µs left, 3 more fit"
        );
        assert_eq!(out[6].reset_after_us, S);
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let rule = Rule::sliding_window(10, Duration::from_secs(1));
        let mut slot = None;
        for _ in 0..10 {
            assert!(check(&mut slot, &rule, S / 2, 1).allowed);
        }
        // A quarter into the next window the previous one still weighs 7.5 -> 7.
        let o = check(&mut slot, &rule, S + S / 4, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, 2);
        let o = check(&mut slot, &rule, S + S / 4, 3);
        assert!(!o.allowed);
        // 3 more fit once the previous window weighs at most 10 - 3 - 1 = 6:
        // just past 0.3 s into the window (at exactly 0.3 s it weighs 7).
        assert_eq!(o.retry_after_us, 3 * S / 10 + 1 - S / 4);
        assert!(!check(&mut slot, &rule, S + 3 * S / 10, 3).allowed);
        assert!(check(&mut slot, &rule, S + 3 * S / 10 + 1, 3).allowed);
    }

    #[test]
    fn token_bucket_starts_full_and_refills_continuously() {
        let rule = Rule::token_bucket(3, Duration::from_secs(1)).with_burst(6);
        let mut slot = None;
        let o = check(&mut slot, &rule, 0, 6);
        assert!(o.allowed);
        assert_eq!(o.remaining, 0);
        assert_eq!(o.reset_after_us, 2 * S);
        let o = check(&mut slot, &rule, 0, 1);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 333_334, "a third of a second, rounded up");
        assert!(!check(&mut slot, &rule, 333_333, 1).allowed);
        assert!(check(&mut slot, &rule, 333_334, 1).allowed);
    }

    #[test]
    fn gcra_and_token_bucket_agree() {
        let mut now = 0;
        let calls: Vec<(u64, u64)> = (0..500u64)
            .map(|i| {
                now += i * 7_919 % 50_000;
                (now, 1 + i % 3)
            })
            .collect();
        let tb = Rule::token_bucket(7, Duration::from_millis(300)).with_burst(5);
        let gc = Rule::gcra(7, Duration::from_millis(300)).with_burst(5);
        assert_eq!(run(&tb, &calls), run(&gc, &calls));
    }

    #[test]
    fn gcra_retry_after_is_exact() {
        let rule = Rule::gcra(3, Duration::from_secs(1));
        let mut slot = None;
        for _ in 0..3 {
            assert!(check(&mut slot, &rule, 0, 1).allowed);
        }
        let o = check(&mut slot, &rule, 0, 1);
        assert_eq!(o.retry_after_us, 333_334);
        assert!(!check(&mut slot, &rule, o.retry_after_us - 1, 1).allowed);
        assert!(check(&mut slot, &rule, o.retry_after_us, 1).allowed);
    }

    #[test]
    fn concurrency_leases_are_released_or_expire() {
        let rule = Rule::concurrency(2, Duration::from_secs(10));
        let mut slot = None;
        assert!(acquire(&mut slot, &rule, 0, 1, 1).allowed);
        assert!(acquire(&mut slot, &rule, 0, 1, 2).allowed);
        let o = acquire(&mut slot, &rule, 5, 1, 3);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 10 * S - 5);
        release(&mut slot, 1);
        assert!(acquire(&mut slot, &rule, 6, 1, 4).allowed);
        assert!(!acquire(&mut slot, &rule, 7, 1, 5).allowed);
        assert!(
            acquire(&mut slot, &rule, 10 * S, 1, 6).allowed,
            "lease 2 expired"
        );
    }
}
