//! Concurrency: at most `count` units held at once, each by a lease released
//! when its call ends or `period` after it was taken.

use super::{Lease, Outcome, State};
use crate::rule::Rule;

/// How many leases a retry time is looked for among (`LEASE_WALK` in
/// concurrency.lua).
const LEASE_WALK: usize = 1024;

/// The most dead leases one call removes, the oldest first (`TRIM` in
/// concurrency.lua): a dead lease of several units left for a later call
/// holds its units beyond the first until then, as in Redis.
const TRIM: usize = 1024;

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
    let mut trimmed = 0;
    leases.retain(|lease| {
        let dead = lease.expires <= now;
        trimmed += usize::from(dead);
        !dead || trimmed > TRIM
    });
    let held: u64 = leases
        .iter()
        .map(|l| if l.expires > now { l.cost } else { l.cost - 1 })
        .sum();
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
        // `held + cost - count` (1-based) must go first. It is looked for
        // among the first LEASE_WALK leases only (so is it in Redis); past
        // them, by when the last lease ends all have.
        let mut units = 0;
        let live = || leases.iter().filter(|lease| lease.expires > now);
        live()
            .take(LEASE_WALK)
            .find(|lease| {
                units += lease.cost;
                units >= held + cost - count
            })
            .or_else(|| live().max_by_key(|lease| lease.expires))
            .map_or(0, |lease| lease.expires - now)
    };
    Outcome {
        allowed,
        remaining,
        reset_after_us: leases
            .iter()
            .map(|l| l.expires.saturating_sub(now))
            .max()
            .unwrap_or(0),
        retry_after_us,
        limit: 0,
    }
}

/// Gives back lease `id`'s units.
pub(crate) fn release(slot: &mut Option<State>, id: u64) {
    if let Some(State::Concurrency(leases)) = slot {
        leases.retain(|lease| lease.id != id);
    }
}

/// A check with no lease to give back: the units expire after `period`.
pub(super) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    acquire(slot, rule, now, cost, 0)
}
