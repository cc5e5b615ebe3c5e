//! A call under several rules at once, in process memory: every rule's state
//! is read and decided before any is written, under the locks of every
//! shard the keys live in (taken in the order of the shards, each once, so
//! two sets never wait for each other in a circle).

use std::sync::MutexGuard;

use super::shard::{Entry, ShardMap, Slot, key_hash};
use super::{MemoryBackend, SHARDS};
use crate::algorithm::{self, Outcome, State};
use crate::backend::hook::Answered;
use crate::backend::{RuleCheck, StoredKey};
use crate::rule::Rule;

/// Where a check's state lives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    /// A key of shard `.0` (tracked, or to be stored), by its hash.
    Key(usize, u64),
    /// Its rule's overflow budget (a full shard could not track the key).
    Overflow,
}

impl MemoryBackend {
    /// Checks one call under several rules, all or nothing (see
    /// [`Backend::check_all`](crate::Backend::check_all)): each rule's
    /// outcome, and the time (µs) they were decided at. Nothing is written
    /// unless every rule allows the call.
    /// [`check_all_now`](MemoryBackend::check_all_now) as the hooks answer
    /// it: each rule's decision, and the stamp of what an allowed check (not
    /// a lease) charged.
    pub(crate) fn answer_all(&self, checks: &[RuleCheck<'_>]) -> Vec<Answered> {
        // Rules that read subjects' own limits, as they hold for their keys.
        let in_force = self.sets_in_force(checks);
        let limited: Vec<RuleCheck<'_>>;
        let checks = match &in_force {
            Some(rules) => {
                limited = checks
                    .iter()
                    .zip(rules)
                    .map(|(c, rule)| RuleCheck { rule, ..*c })
                    .collect();
                if limited
                    .iter()
                    .any(|c| c.rule.reads_subject_limits() && c.cost > c.rule.capacity())
                {
                    return self.never_fit(&limited);
                }
                &limited[..]
            }
            None => checks,
        };
        let (outcomes, now) = self.check_all_now(checks);
        outcomes
            .iter()
            .zip(checks)
            .map(|(outcome, c)| {
                let spec = algorithm::spec(c.rule.algorithm());
                let stamp = (outcome.allowed && !spec.leases).then(|| {
                    algorithm::stamp(c.rule.algorithm(), c.rule.period_us(), now, outcome)
                });
                Answered::by_backend(outcome.decision(c.rule), stamp)
            })
            .collect()
    }

    /// A set with a check whose cost is over its subject's own capacity:
    /// refused by that rule, the others answering as a peek (nothing taken).
    fn never_fit(&self, checks: &[RuleCheck<'_>]) -> Vec<Answered> {
        checks
            .iter()
            .map(|c| {
                let decision = if c.rule.reads_subject_limits() && c.cost > c.rule.capacity() {
                    super::never_fits(c.rule)
                } else {
                    self.peek_now(c.rule, c.key)
                };
                Answered::by_backend(decision, None)
            })
            .collect()
    }

    pub(crate) fn check_all_now(&self, checks: &[RuleCheck<'_>]) -> (Vec<Outcome>, u64) {
        let inner = &self.inner;
        let hashes: Vec<u64> = checks
            .iter()
            .map(|c| key_hash(&inner.hasher, c.key.as_bytes()))
            .collect();
        let mut shards: Vec<usize> = hashes.iter().map(|&h| shard_of(h)).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, ShardMap>)> = shards
            .iter()
            .map(|&at| (at, inner.shards[at].lock()))
            .collect();
        // Taken after every shard's lock, as a lone check does.
        let mut overflow = None;
        let now = inner.clock.now_micros();

        // Each check on a copy of its state: (target, state after it).
        let mut tentative: Vec<(Target, Option<State>)> = Vec::with_capacity(checks.len());
        let mut outcomes = Vec::with_capacity(checks.len());
        for (i, check) in checks.iter().enumerate() {
            let at = shard_of(hashes[i]);
            let shard = &mut guards
                .iter_mut()
                .find(|(s, _)| *s == at)
                .expect("locked above")
                .1;
            let (target, mut state) = if let Some(entry) = shard.find_mut(hashes[i], check.key) {
                (Target::Key(at, hashes[i]), entry.slot.state.clone())
            } else if shard.room(inner.max_per_shard(), now, &inner.hasher) {
                (Target::Key(at, hashes[i]), None)
            } else {
                let budgets = overflow.get_or_insert_with(|| inner.overflow.lock());
                // A rule's overflow budget is shared: an earlier check of
                // the set may have drawn on it already.
                let earlier = checks[..i]
                    .iter()
                    .zip(&tentative)
                    .rev()
                    .find(|(c, (t, _))| *t == Target::Overflow && c.rule == check.rule);
                let state = match earlier {
                    Some((_, (_, state))) => state.clone(),
                    None => budgets
                        .iter()
                        .find(|(r, _)| r == check.rule)
                        .and_then(|(_, slot)| slot.state.clone()),
                };
                (Target::Overflow, state)
            };
            let outcome = if algorithm::spec(check.rule.algorithm()).leases {
                algorithm::acquire(&mut state, check.rule, now, check.cost, check.lease)
            } else {
                algorithm::check(&mut state, check.rule, now, check.cost)
            };
            outcomes.push(outcome);
            tentative.push((target, state));
        }
        if outcomes.iter().any(|o| !o.allowed) {
            return (outcomes, now);
        }

        for (check, (target, state)) in checks.iter().zip(tentative) {
            match target {
                Target::Key(at, hash) => {
                    let shard = &mut guards
                        .iter_mut()
                        .find(|(s, _)| *s == at)
                        .expect("locked above")
                        .1;
                    store(shard, hash, check, state, now, inner);
                }
                Target::Overflow => {
                    inner.note_overflow(now);
                    let budgets = overflow.as_mut().expect("locked above");
                    let at = match budgets.iter().position(|(r, _)| r == check.rule) {
                        Some(at) => at,
                        None => {
                            budgets.retain(|(_, slot)| slot.expires_at > now);
                            budgets.push((*check.rule, Slot::default()));
                            budgets.len() - 1
                        }
                    };
                    set(&mut budgets[at].1, check.rule, state);
                }
            }
        }
        (outcomes, now)
    }
}

/// The shard of a key's hash (as [`MemoryBackend::shard`] picks it).
fn shard_of(hash: u64) -> usize {
    (hash >> 51) as usize % SHARDS
}

/// Writes a check's state to its key: in place, or as a new key when it
/// has one worth keeping.
fn store(
    shard: &mut ShardMap,
    hash: u64,
    check: &RuleCheck<'_>,
    state: Option<State>,
    now: u64,
    inner: &super::Inner,
) {
    if let Some(entry) = shard.find_mut(hash, check.key) {
        set(&mut entry.slot, check.rule, state);
        return;
    }
    if let Some(state) = state.filter(|s| s.expires_at(check.rule) > now) {
        let expires_at = state.expires_at(check.rule);
        let entry = Entry {
            key: StoredKey::new(check.key),
            slot: Slot {
                state: Some(state),
                expires_at,
            },
        };
        shard.push(hash, entry, &inner.hasher);
    }
}

fn set(slot: &mut Slot, rule: &Rule, state: Option<State>) {
    if let Some(state) = &state {
        slot.expires_at = state.expires_at(rule);
    }
    slot.state = state;
}
