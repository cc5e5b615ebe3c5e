//! One lock's worth of the in-process store: its keys, kept in a dense list
//! with a small hash index, and how a full shard makes room (only from keys
//! whose budget has recovered, in sweeps paid for by the calls that ask).

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

use crate::algorithm::{self, State};
use crate::backend::StoredKey;
use crate::rule::Rule;

/// A shard sweeps out expired keys when it grows past this many (and then
/// past twice what survived the last sweep), so memory follows the live keys
/// without a background task.
pub(super) const MIN_SWEEP_LEN: usize = 1024;

/// What each call of a key the shard does not track adds to
/// [`ShardMap::credit`]: a sweep of a full shard visits every key, so one
/// may run once the calls since the last have paid for as many visits. A
/// call at the cap then costs at most this many key visits, amortised.
pub(super) const CREDIT_PER_CALL: usize = 8;

/// The most keys a shard holds whatever the cap (positions are `u32`).
pub(super) const MAX_PER_SHARD: usize = u32::MAX as usize;

/// The hasher of keys. Callers choose keys (header digests, addresses,
/// parameters), so it is keyed with a random secret per store and made to
/// resist finding collisions, also by someone timing the store: SipHash-1-3
/// (std's). A hasher that is only seeded (foldhash, "minimally
/// DoS-resistant") could let a patient attacker flood one bucket.
pub(super) type Hasher = std::hash::RandomState;

/// A key's hash: the one function every lookup, insert and index rebuild
/// uses, so a key stored and a key asked for always agree.
pub(super) fn key_hash(hasher: &Hasher, key: &[u8]) -> u64 {
    hasher.hash_one(key)
}

/// One lock's worth of keys, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(super) struct Shard {
    map: Mutex<ShardMap>,
}

impl Shard {
    /// A poisoned shard only means another thread panicked while holding
    /// it; the states in it are still whole, so keep serving.
    pub(super) fn lock(&self) -> MutexGuard<'_, ShardMap> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A shard's keys: the entries in a dense list in the order they arrived,
/// and a small hash index of their positions (as `indexmap` keeps them). The
/// index is 5 bytes a key, so a lookup's probing stays in the CPU's caches
/// even with many keys, and the one entry it lands on is the only memory
/// touched that may not be.
#[derive(Debug)]
pub(super) struct ShardMap {
    /// Positions in `entries`, keyed by the one hash computed per call (it
    /// also picked the shard).
    index: HashTable<u32>,
    entries: Vec<Entry>,
    sweep_at: usize,
    /// No entry expires before this (µs): exact after a sweep, lowered as
    /// keys arrive. A check only moves a key's expiry later, so it stays a
    /// lower bound; a full shard sweeps only once it has passed.
    earliest: u64,
    /// Key visits the calls of untracked keys have paid for since the last
    /// sweep ([`CREDIT_PER_CALL`] each).
    credit: usize,
    /// Keys visited by sweeps so far (tests count them).
    #[cfg(test)]
    pub(super) visited: usize,
}

impl Default for ShardMap {
    fn default() -> Self {
        ShardMap {
            index: HashTable::new(),
            entries: Vec::new(),
            sweep_at: MIN_SWEEP_LEN,
            earliest: u64::MAX,
            credit: 0,
            #[cfg(test)]
            visited: 0,
        }
    }
}

/// One key and its state. Its hash is not kept (the index tags each slot
/// with 7 bits of it; growing or rebuilding the index hashes the keys again).
#[derive(Debug)]
#[repr(align(64))] // 64 bytes: one cache line each (see the test)
pub(super) struct Entry {
    pub(super) key: StoredKey,
    pub(super) slot: Slot,
}

/// A budget's state and when it is worth nothing any more.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) state: Option<State>,
    /// When `state` is worth nothing any more (the budget is whole again),
    /// in µs of the clock.
    pub(super) expires_at: u64,
}

impl Slot {
    /// Runs one step of the key's algorithm on it.
    #[inline]
    pub(super) fn step(
        &mut self,
        rule: &Rule,
        now: u64,
        step: impl FnOnce(&mut Option<State>, u64) -> algorithm::Outcome,
    ) -> algorithm::Outcome {
        let outcome = step(&mut self.state, now);
        if let Some(state) = &self.state {
            self.expires_at = state.expires_at(rule);
        }
        outcome
    }
}

impl ShardMap {
    /// The entry of `key`, if the shard tracks it.
    #[inline]
    pub(super) fn find_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        let entries = &self.entries;
        let at = *self
            .index
            .find(hash, |&at| entries[at as usize].key.is(key))?;
        Some(&mut self.entries[at as usize])
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Notes that a key's state may now expire at `expires_at` (a refund
    /// moved it earlier), so a full shard knows it can sweep then.
    pub(super) fn expiry_moved(&mut self, expires_at: u64) {
        self.earliest = self.earliest.min(expires_at);
    }

    /// Whether a new key can be stored, below `max` keys: there is room, or
    /// a sweep made some from keys whose budget has recovered (expired). A
    /// key with state that still matters is never dropped, so a key that is
    /// refusing calls now is never forgotten to make room. Sweeping a full
    /// shard waits until a key can have expired and the calls of untracked
    /// keys since the last sweep have paid for visiting every key, so a
    /// call at the cap costs a small constant, not a scan.
    pub(super) fn room(&mut self, max: usize, now: u64, hasher: &Hasher) -> bool {
        self.credit = self.credit.saturating_add(CREDIT_PER_CALL);
        let len = self.len();
        if len < max {
            if len >= self.sweep_at {
                self.sweep(now, hasher);
            }
            return true;
        }
        if now < self.earliest || self.credit < len {
            return false;
        }
        self.sweep(now, hasher);
        self.len() < max
    }

    /// Stores a new key (after [`room`](ShardMap::room) said yes).
    pub(super) fn push(&mut self, hash: u64, entry: Entry, hasher: &Hasher) {
        // The cap keeps a shard under `MAX_PER_SHARD` (2^32) keys.
        let at = self.entries.len() as u32;
        // Grown by a quarter, not doubled: a shard's spare room (memory per
        // key) stays under a quarter of its keys' (benches/footprint.rs).
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact((self.entries.len() / 4).max(16));
        }
        self.earliest = self.earliest.min(entry.slot.expires_at);
        self.entries.push(entry);
        let entries = &self.entries;
        self.index.insert_unique(hash, at, |&at| {
            key_hash(hasher, entries[at as usize].key.as_bytes())
        });
    }

    /// Drops expired keys (the survivors keep their order) and rebuilds the
    /// index; shrinks both when they are mostly empty.
    pub(super) fn sweep(&mut self, now: u64, hasher: &Hasher) {
        let ShardMap {
            index,
            entries,
            sweep_at,
            earliest,
            credit,
            #[cfg(test)]
            visited,
        } = self;
        #[cfg(test)]
        {
            *visited += entries.len();
        }
        *earliest = u64::MAX;
        *credit = 0;
        entries.retain(|e| {
            let keep = e.slot.expires_at > now;
            if keep {
                *earliest = (*earliest).min(e.slot.expires_at);
            }
            keep
        });
        *sweep_at = (entries.len() * 2).max(MIN_SWEEP_LEN);
        // Room for the keys that arrive before the next sweep stays; more
        // than twice that is given back. (Shrinking to the survivors alone
        // made a steady churn of keys regrow both at every sweep.)
        if entries.capacity() > 2 * *sweep_at {
            entries.shrink_to(*sweep_at);
            *index = HashTable::with_capacity(*sweep_at);
        } else {
            index.clear();
        }
        let rehash = |entry: &Entry| key_hash(hasher, entry.key.as_bytes());
        for (at, entry) in entries.iter().enumerate() {
            // `at` is below the shard's cap, under 2^32.
            index.insert_unique(rehash(entry), at as u32, |&at| {
                rehash(&entries[at as usize])
            });
        }
    }
}

/// The budgets of calls a full store could not track: one per rule, shared
/// by every key it could not store, so a full store still limits them.
#[derive(Debug, Default)]
pub(super) struct Overflow {
    budgets: Mutex<Vec<(Rule, Slot)>>,
}

impl Overflow {
    /// Runs `f` on the overflow budget of `rule`, made when missing.
    pub(super) fn with<T>(&self, rule: &Rule, now: u64, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        let at = match budgets.iter().position(|(r, _)| r == rule) {
            Some(at) => at,
            None => {
                // Rules come from the program, so there are few; those whose
                // budget recovered go when another arrives.
                budgets.retain(|(_, slot)| slot.expires_at > now);
                budgets.push((*rule, Slot::default()));
                budgets.len() - 1
            }
        };
        f(&mut budgets[at].1)
    }

    /// The overflow budgets, locked (after any shard a caller holds: that
    /// is the one order the store takes its locks in).
    pub(super) fn lock(&self) -> MutexGuard<'_, Vec<(Rule, Slot)>> {
        self.budgets.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Gives back lease `id` if an overflow budget holds it.
    pub(super) fn release(&self, id: u64) {
        let mut budgets = self.budgets.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, slot) in budgets.iter_mut() {
            algorithm::release(&mut slot.state, id);
        }
    }
}
