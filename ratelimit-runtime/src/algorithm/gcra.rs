//! GCRA (the leaky bucket as a meter): one theoretical arrival time per key.

use super::{Outcome, State};
use crate::rule::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    let (count, period) = (rule.count(), rule.period_us());
    let tolerance = rule.burst() * period;
    let step = cost * period;
    // How far the theoretical arrival time is ahead of now, in 1/count µs;
    // a TAT reached is an empty bucket, where a new one begins.
    let (ahead, born) = match *slot {
        Some(State::Gcra { tat, rem, born }) if tat > now || (tat == now && rem > 0) => {
            let (whole, rem) = (tat - now, u64::from(rem));
            if whole > tolerance / count + 1 {
                // Further ahead than the tolerance allows (a rule whose count
                // was raised since): refused, and its numbers worked out
                // without `whole * count`, which may not fit in 64 bits (nor
                // in the doubles of the Lua script, which does the same).
                return far_ahead(whole, rem, count, step, tolerance);
            }
            (whole * count + rem, born)
        }
        _ => (0, now),
    };
    let allowed = ahead + step <= tolerance;
    let ahead = if allowed {
        let ahead = ahead + step;
        // The remainder is below the count, at most `Rule::MAX_COUNT`.
        *slot = Some(State::Gcra {
            tat: now + ahead / count,
            born,
            rem: (ahead % count) as u32,
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
        limit: 0,
    }
}

/// The refusal of a key whose TAT is `whole` µs (and `rem` / `count`) ahead,
/// more than the tolerance: `ceil((whole * count + rem + x) / count)` is
/// `whole + ceil((rem + x) / count)`, with no product that can overflow.
fn far_ahead(whole: u64, rem: u64, count: u64, step: u64, tolerance: u64) -> Outcome {
    let count = i128::from(count);
    let ceil = |n: i128| n.div_euclid(count) + i128::from(n.rem_euclid(count) > 0);
    let after = |x: i128| u64::try_from(i128::from(whole) + ceil(i128::from(rem) + x)).unwrap_or(0);
    Outcome {
        allowed: false,
        remaining: 0,
        reset_after_us: after(0),
        retry_after_us: after(i128::from(step) - i128::from(tolerance)),
        limit: 0,
    }
}

/// Moves the theoretical arrival time back by `units` emission intervals,
/// never before now, if the charge at `stamp` was counted in this bucket
/// (not one begun since: emptied, or reset). A TAT further ahead than the
/// rule's tolerance (its count was raised since) is left as it is.
pub(super) fn refund(slot: &mut Option<State>, rule: &Rule, now: u64, units: u64, stamp: u64) {
    let (count, period) = (rule.count(), rule.period_us());
    let Some(State::Gcra { tat, rem, born }) = *slot else {
        return;
    };
    if tat < now || born > stamp {
        return;
    }
    let rem = u64::from(rem);
    let whole = tat - now;
    if whole > rule.burst() * period / count + 1 {
        return;
    }
    let back = units.min(rule.burst()) * period;
    let ahead = whole * count + rem;
    *slot = (ahead > back).then(|| {
        let ahead = ahead - back;
        State::Gcra {
            tat: now + ahead / count,
            born,
            rem: (ahead % count) as u32,
        }
    });
}

/// Reserves `cost` units for a call that may wait up to `max_wait` µs (see
/// [`super::reserve`]): what a check answers, but a call the check refuses
/// and that can go within `max_wait` is recorded at the time it may go, so
/// that the next caller queues behind it.
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
    if outcome.retry_after_us > max_wait {
        return outcome;
    }
    let Some((ahead, born)) = ahead(slot, rule, now) else {
        return outcome;
    };
    let count = rule.count();
    let position = ahead + cost * rule.period_us();
    *slot = Some(State::Gcra {
        tat: now + position / count,
        born,
        rem: (position % count) as u32,
    });
    super::waiting(position, count, outcome.retry_after_us)
}

/// How far the TAT is ahead of `now` (in 1/count µs), and when the bucket
/// began; `None` for no state or one further ahead than any reservation
/// leaves it (a rule whose count was raised since).
fn ahead(slot: &Option<State>, rule: &Rule, now: u64) -> Option<(u64, u64)> {
    match *slot {
        Some(State::Gcra { tat, rem, born }) if tat > now || (tat == now && rem > 0) => {
            let whole = tat - now;
            let count = rule.count();
            let reach = rule.burst() * rule.period_us() / count + super::wait_cap(rule) + 2;
            (whole <= reach).then(|| (whole * count + u64::from(rem), born))
        }
        Some(State::Gcra { born, .. }) => Some((0, born)),
        _ => None,
    }
}

/// Gives back a reservation made at `at` that left the TAT `position`
/// ahead of it (see [`super::cancel`]).
pub(super) fn cancel(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    at: u64,
    position: u64,
) {
    let Some((ahead, born)) = ahead(slot, rule, now) else {
        return;
    };
    let Some(back) = super::given_back(rule, now, cost, at, position, ahead, born) else {
        return;
    };
    let count = rule.count();
    let ahead = ahead - back.min(ahead);
    *slot = (ahead > 0).then(|| State::Gcra {
        tat: now + ahead / count,
        born,
        rem: (ahead % count) as u32,
    });
}
