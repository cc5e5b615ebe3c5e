//! Sliding log: the exact sliding window, a log of calls, each with its time
//! and its units of cost; at most `count` units in any interval of length
//! `period`. A call is one entry whatever it costs, so no call's work grows
//! with its cost.

use std::collections::VecDeque;

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    if !matches!(slot, Some(State::SlidingLog(_))) {
        *slot = Some(State::SlidingLog(Log::default()));
    }
    let Some(State::SlidingLog(log)) = slot else {
        unreachable!("set just above")
    };
    // A call at time t counts while now < t + period.
    log.expire(now, period);
    let held = log.len();
    let allowed = held + cost <= count;
    if allowed {
        // Times never go back in a log (a clock that did is read as standing
        // still), so calls leave it oldest first: Redis's log does the same.
        log.push(log.back().map_or(now, |newest| newest.max(now)), cost);
    }
    let held = log.len();
    let remaining = count.saturating_sub(held);
    let retry_after_us = if remaining >= cost {
        0
    } else {
        // The oldest `held + cost - count` units must leave the window first.
        (log.get(held + cost - count - 1) + period).saturating_sub(now)
    };
    Outcome {
        allowed,
        remaining,
        reset_after_us: log
            .back()
            .map_or(0, |newest| (newest + period).saturating_sub(now)),
        retry_after_us,
        limit: 0,
    }
}

/// Takes back `units` of the call logged at `stamp` (µs), while it is in
/// the window: the units logged at that time, newest first (calls logged at
/// one time are alike to every decision), never more than there are. A
/// refund that would rewrite more than [`REFUND_WALK`] calls (the ones at
/// its time and every one after) gives nothing back.
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64, stamp: u64) {
    let period = rule.period_us();
    if let Some(State::SlidingLog(log)) = slot
        && stamp + period > now
    {
        log.expire(now, period);
        log.take_at(stamp, units);
    }
}

/// An allowed check's entry: its time (the log's newest, `reset_after`
/// before it leaves the window).
pub(super) fn stamp(now: u64, period: u64, outcome: &Outcome) -> u64 {
    (now + outcome.reset_after_us).saturating_sub(period)
}

/// The most calls a refund rewrites (`REFUND_WALK` in sliding_log.lua).
pub(super) const REFUND_WALK: usize = 1024;

/// A sliding log's calls, oldest first. The first few units are kept in
/// place, one time each (most keys of a per-client limit hold one or two
/// calls), so a new key costs no allocation; longer logs move to the heap,
/// one entry per call, and stay there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Log {
    Inline {
        len: u8,
        times: [u64; INLINE_LOG],
    },
    /// Boxed, so a log stays 24 bytes, no more than the other states hold:
    /// the in-memory store's entries are smaller for it.
    Heap(Box<Calls>),
}

/// A log on the heap: each call's time and the units counted through it
/// (since the log began), so a call's units are the difference with the
/// call before, and the `i`th unit is found by a binary search.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Calls {
    calls: VecDeque<(u64, u64)>,
    /// The units counted through the last call that left.
    gone: u64,
}

/// How many units a log keeps in place.
pub(super) const INLINE_LOG: usize = 2;

impl Default for Log {
    fn default() -> Self {
        Log::Inline {
            len: 0,
            times: [0; INLINE_LOG],
        }
    }
}

impl Log {
    /// The units held.
    pub(super) fn len(&self) -> u64 {
        match self {
            Log::Inline { len, .. } => u64::from(*len),
            Log::Heap(log) => log.calls.back().map_or(log.gone, |&(_, n)| n) - log.gone,
        }
    }

    /// The time of the `i`th oldest unit; `i` is below `len()`.
    pub(super) fn get(&self, i: u64) -> u64 {
        match self {
            Log::Inline { times, .. } => times[i as usize],
            Log::Heap(log) => {
                let at = log.calls.partition_point(|&(_, n)| n <= log.gone + i);
                log.calls[at].0
            }
        }
    }

    pub(super) fn back(&self) -> Option<u64> {
        match self {
            Log::Inline { len, times } => usize::from(*len).checked_sub(1).map(|i| times[i]),
            Log::Heap(log) => log.calls.back().map(|&(t, _)| t),
        }
    }

    /// Drops the calls that left the window by `now`: those at `t` with
    /// `t + period <= now`.
    pub(super) fn expire(&mut self, now: u64, period: u64) {
        match self {
            Log::Inline { len, times } => {
                let gone = times[..usize::from(*len)]
                    .iter()
                    .take_while(|&&t| t + period <= now)
                    .count();
                times.copy_within(gone.., 0);
                *len -= gone as u8;
            }
            Log::Heap(log) => {
                while let Some(&(t, n)) = log.calls.front() {
                    if t + period > now {
                        break;
                    }
                    log.gone = n;
                    log.calls.pop_front();
                }
            }
        }
    }

    /// Takes back up to `units` of the units logged at time `t`, newest
    /// first; nothing when that rewrites more than [`REFUND_WALK`] calls.
    pub(super) fn take_at(&mut self, t: u64, units: u64) {
        match self {
            Log::Inline { len, times } => {
                let held = &times[..usize::from(*len)];
                let from = held.partition_point(|&time| time < t);
                let to = held.partition_point(|&time| time <= t);
                let take = (to - from).min(usize::try_from(units).unwrap_or(usize::MAX));
                times.copy_within(to..usize::from(*len), to - take);
                *len -= take as u8;
            }
            Log::Heap(log) => {
                let calls = &mut log.calls;
                let from = calls.partition_point(|&(time, _)| time < t);
                let to = calls.partition_point(|&(time, _)| time <= t);
                let before = |calls: &VecDeque<(u64, u64)>, i: usize| {
                    if i == 0 { log.gone } else { calls[i - 1].1 }
                };
                // The oldest call touched, and what it keeps.
                let (mut oldest, mut left) = (to, units);
                while oldest > from && left > 0 {
                    oldest -= 1;
                    let has = calls[oldest].1 - before(calls, oldest);
                    left -= has.min(left);
                }
                let taken = units - left;
                if taken == 0 || calls.len() - oldest > REFUND_WALK {
                    return;
                }
                // The newer calls at `t` go whole; the oldest touched gives
                // the rest.
                let newer = calls[to - 1].1 - calls[oldest].1;
                let kept = calls[oldest].1 - before(calls, oldest) - (taken - newer);
                let base = before(calls, oldest);
                let removed_from = if kept > 0 {
                    calls[oldest].1 = base + kept;
                    oldest + 1
                } else {
                    oldest
                };
                calls.drain(removed_from..to);
                for call in calls.range_mut(removed_from..) {
                    call.1 -= taken;
                }
            }
        }
    }

    /// Appends a call of `units` at time `t` (none: nothing).
    pub(super) fn push(&mut self, t: u64, units: u64) {
        if units == 0 {
            return;
        }
        if let Log::Inline { len, times } = self {
            let at = usize::from(*len);
            if let Some(end) = at.checked_add(units as usize).filter(|&e| e <= INLINE_LOG) {
                times[at..end].fill(t);
                *len = end as u8;
                return;
            }
            let calls = (1..).zip(&times[..at]).map(|(n, &t)| (t, n)).collect();
            *self = Log::Heap(Box::new(Calls { calls, gone: 0 }));
        }
        if let Log::Heap(log) = self {
            let through = log.calls.back().map_or(log.gone, |&(_, n)| n);
            log.calls.push_back((t, through + units));
        }
    }
}
