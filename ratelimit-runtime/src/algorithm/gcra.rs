//! GCRA (the leaky bucket as a meter): one theoretical arrival time per key.

use super::{Outcome, State};
use crate::Rule;

pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
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
