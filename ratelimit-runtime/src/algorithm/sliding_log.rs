//! Sliding log: the exact sliding window, a log of call times (one per unit
//! of cost); at most `count` units in any interval of length `period`.

use std::collections::VecDeque;

use super::{Outcome, State};
use crate::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
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
    pub(super) fn len(&self) -> usize {
        match self {
            Log::Inline { len, .. } => usize::from(*len),
            Log::Heap(log) => log.len(),
        }
    }

    /// The `i`th oldest time; `i` is below `len()`.
    pub(super) fn get(&self, i: usize) -> u64 {
        match self {
            Log::Inline { times, .. } => times[i],
            Log::Heap(log) => log[i],
        }
    }

    pub(super) fn front(&self) -> Option<u64> {
        (self.len() > 0).then(|| self.get(0))
    }

    pub(super) fn back(&self) -> Option<u64> {
        self.len().checked_sub(1).map(|i| self.get(i))
    }

    pub(super) fn pop_front(&mut self) {
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
    pub(super) fn push(&mut self, t: u64, n: usize) {
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
