//! Fixed window: a counter that starts at a key's first call and ends
//! `period` later; refused calls do not count.

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
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
            limit: 0,
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
        limit: 0,
    }
}

/// Gives back `units` of the window the charge was counted in (its end is
/// the stamp), if that window is still the key's (never below none used).
/// A later window, or one started after a reset, is not it.
pub(super) fn refund(slot: &mut Option<State>, _rule: &Rule, now: u64, units: u64, stamp: u64) {
    if let Some(State::FixedWindow { used, ends }) = slot
        && now < *ends
        && *ends == stamp
    {
        *used = used.saturating_sub(units);
    }
}

/// An allowed check's window: its end.
pub(super) fn stamp(now: u64, _period: u64, outcome: &Outcome) -> u64 {
    now + outcome.reset_after_us
}
