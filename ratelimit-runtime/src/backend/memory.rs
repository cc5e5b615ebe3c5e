//! The in-process store: the embedded default, and the insurance limiter
//! while Redis is unavailable.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hashbrown::HashTable;

use super::{Backend, StoredKey};
use crate::algorithm::{self, State};
use crate::clock::{Clock, SystemClock};
use crate::{Algorithm, Charge, Decision, Error, Rule};

/// How many independently locked shards the keys are spread over, so tasks on
/// different keys rarely wait for each other.
const SHARDS: usize = 64;

/// A shard sweeps out expired keys when it grows past this many (and then
/// past twice what survived the last sweep), so memory follows the live keys
/// without a background task.
const MIN_SWEEP_LEN: usize = 1024;

/// Budgets kept in process memory, sharded by key.
///
/// Cheap to clone (clones share the store). Expired keys are reclaimed as new
/// keys arrive; nothing needs to be called for that. Time is the given
/// [`Clock`]'s, in whole microseconds.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{ManualClock, Rule, backend::memory::MemoryBackend};
///
/// let clock = ManualClock::new();
/// let store = MemoryBackend::with_clock(clock.clone());
/// let rule = Rule::fixed_window(1, Duration::from_secs(1));
/// assert!(store.check_now(&rule, "k", 1).allowed);
/// assert!(!store.check_now(&rule, "k", 1).allowed);
/// clock.advance(Duration::from_secs(1));
/// assert!(store.check_now(&rule, "k", 1).allowed);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// The most keys one shard tracks (`max_keys / SHARDS`).
    max_per_shard: AtomicUsize,
    /// Set once the cap was reached (logged once).
    capped: AtomicBool,
    /// Seeded per store: callers choose keys, so the hash must not be
    /// predictable (flooding one bucket).
    hasher: Hasher,
    clock: StoreClock,
}

/// The store's clock. The system clock, the default, is read directly (a
/// check reads it every time); a clock given by the caller through its trait.
#[derive(Debug)]
enum StoreClock {
    System(SystemClock),
    Given(Box<dyn Clock>),
}

impl StoreClock {
    /// Whole µs of the clock.
    #[inline]
    fn now_micros(&self) -> u64 {
        match self {
            StoreClock::System(clock) => clock.now_micros(),
            StoreClock::Given(clock) => u64::try_from(clock.now().as_micros()).unwrap_or(u64::MAX),
        }
    }
}

type Hasher = foldhash::fast::RandomState;

/// A key's hash: the one function every lookup, insert and index rebuild
/// uses, so a key stored and a key asked for always agree.
fn key_hash(hasher: &Hasher, key: &[u8]) -> u64 {
    hasher.hash_one(key)
}

/// One lock's worth of keys, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Shard {
    map: Mutex<ShardMap>,
}

/// A shard's keys: the entries in a dense list in the order they arrived,
/// and a small hash index of their positions (as `indexmap` keeps them). The
/// index is 5 bytes a key, so a lookup's probing stays in the CPU's caches
/// even with many keys, and the one entry it lands on is the only memory
/// touched that may not be.
#[derive(Debug)]
struct ShardMap {
    /// Positions in `entries`, keyed by the one hash computed per call (it
    /// also picked the shard).
    index: HashTable<u32>,
    entries: Vec<Entry>,
    sweep_at: usize,
}

impl Default for ShardMap {
    fn default() -> Self {
        ShardMap {
            index: HashTable::new(),
            entries: Vec::new(),
            sweep_at: MIN_SWEEP_LEN,
        }
    }
}

impl ShardMap {
    /// The entry of `key`, if the shard tracks it.
    #[inline]
    fn find_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        let entries = &self.entries;
        let at = *self
            .index
            .find(hash, |&at| entries[at as usize].key.is(key))?;
        Some(&mut self.entries[at as usize])
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn push(&mut self, hash: u64, entry: Entry, hasher: &Hasher) {
        // `insert` keeps a shard under `MAX_PER_SHARD` (2^32) keys.
        let at = self.entries.len() as u32;
        // Grown by a quarter, not doubled: a shard's spare room (memory per
        // key) stays under a quarter of its keys' (benches/footprint.rs).
        if self.entries.len() == self.entries.capacity() {
            self.entries.reserve_exact((self.entries.len() / 4).max(16));
        }
        self.entries.push(entry);
        let entries = &self.entries;
        self.index.insert_unique(hash, at, |&at| {
            key_hash(hasher, entries[at as usize].key.as_bytes())
        });
    }
}

/// One key and its state. Its hash is not kept (the index tags each slot
/// with 7 bits of it; growing or rebuilding the index hashes the keys again).
#[derive(Debug)]
#[repr(align(64))] // 64 bytes: one cache line each (see the test)
struct Entry {
    key: StoredKey,
    slot: Slot,
}

#[derive(Debug, Default)]
struct Slot {
    state: Option<State>,
    /// When `state` is worth nothing any more, in µs of the clock.
    expires_at: u64,
}

impl Slot {
    /// Runs one step of the key's algorithm on it.
    #[inline]
    fn step(
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

impl MemoryBackend {
    /// A store on the system's monotonic clock.
    pub fn new() -> MemoryBackend {
        MemoryBackend::with_store_clock(StoreClock::System(SystemClock::new()))
    }

    /// A store on the given clock (a [`ManualClock`](crate::ManualClock) in tests).
    pub fn with_clock(clock: impl Clock) -> MemoryBackend {
        MemoryBackend::with_boxed_clock(Box::new(clock))
    }

    pub(crate) fn with_boxed_clock(clock: Box<dyn Clock>) -> MemoryBackend {
        MemoryBackend::with_store_clock(StoreClock::Given(clock))
    }

    fn with_store_clock(clock: StoreClock) -> MemoryBackend {
        MemoryBackend {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                max_per_shard: AtomicUsize::new(usize::MAX),
                capped: AtomicBool::new(false),
                hasher: foldhash::fast::RandomState::default(),
                clock,
            }),
        }
    }

    /// The same store with at most about `max_keys` keys tracked (spread over
    /// 64 shards). When a shard is full, expired keys are dropped first; if
    /// it is still full, a new key's call is decided as the key's first call
    /// (so allowed) and the key is not tracked: the store fails open for
    /// unseen keys instead of growing or forgetting keys it tracks. Logged
    /// once (`warn`). The cap is the store's: its clones (sharing it) have
    /// it too. Keys it already tracks over a lowered cap stay until they
    /// expire.
    pub fn with_max_keys(self, max_keys: usize) -> MemoryBackend {
        self.inner
            .max_per_shard
            .store(max_keys.div_ceil(SHARDS).max(1), Ordering::Relaxed);
        self
    }

    /// Drops every expired key now and gives their memory
    /// back (the tables shrink). Expired keys are also dropped as new keys arrive; this is for
    /// a periodic task after a burst of keys that will not come back.
    pub fn sweep(&self) {
        let now = self.inner.clock.now_micros();
        for shard in self.inner.shards.iter() {
            sweep(&mut lock(shard), now, &self.inner.hasher);
        }
    }

    /// Checks and consumes synchronously; this store never waits on I/O.
    ///
    /// `cost` must be between 1 and the rule's capacity (the limiter checks
    /// this). A concurrency rule takes a lease that is never released (it
    /// expires after the rule's period): use the limiter's `acquire` for those.
    pub fn check_now(&self, rule: &Rule, key: &str, cost: u64) -> Decision {
        self.charge_now(rule, key, cost).0
    }

    /// [`check_now`](MemoryBackend::check_now), with what an allowed call
    /// took: the [`Charge`] that [`refund_now`](MemoryBackend::refund_now)
    /// gives back.
    pub fn charge_now(&self, rule: &Rule, key: &str, cost: u64) -> (Decision, Option<Charge>) {
        let (outcome, now) = self.update(rule, key, |slot, now| {
            algorithm::check(slot, rule, now, cost)
        });
        let charge = outcome.allowed.then(|| {
            let stamp = algorithm::stamp(rule.algorithm(), rule.period_us(), now, &outcome);
            Charge::new(cost, Some(stamp), false)
        });
        (outcome.decision(rule), charge)
    }

    /// Takes `cost` units of a concurrency rule for lease `id`.
    pub(crate) fn acquire_now(&self, rule: &Rule, key: &str, cost: u64, id: u64) -> Decision {
        let (outcome, _) = self.update(rule, key, |slot, now| {
            algorithm::acquire(slot, rule, now, cost, id)
        });
        outcome.decision(rule)
    }

    /// Gives back lease `id` of a concurrency rule.
    pub(crate) fn release_now(&self, key: &str, id: u64) {
        let hash = key_hash(&self.inner.hasher, key.as_bytes());
        if let Some(entry) = self.shard(hash).find_mut(hash, key) {
            algorithm::release(&mut entry.slot.state, id);
        }
    }

    /// What a check of cost 1 would answer now, without consuming
    /// anything.
    pub fn peek_now(&self, rule: &Rule, key: &str) -> Decision {
        self.look(rule, key, |_, _| ())
    }

    /// Gives back what `charge` took from `key`'s budget, where it is still
    /// counted (see [`Backend::refund`]), then answers as
    /// [`peek_now`](MemoryBackend::peek_now).
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a `concurrency` rule (a lease is given
    /// back by its permit).
    pub fn refund_now(&self, rule: &Rule, key: &str, charge: &Charge) -> Result<Decision, Error> {
        if algorithm::spec(rule.algorithm()).refund.is_none() {
            return Err(Error::Unsupported("refunds under a concurrency rule"));
        }
        Ok(self.look(rule, key, |slot, now| {
            if let Some(stamp) = charge.stamp() {
                algorithm::refund(slot, rule, now, charge.units(), stamp);
            }
        }))
    }

    /// Forgets `key`'s state (its leases too), then answers as
    /// [`peek_now`](MemoryBackend::peek_now).
    pub fn reset_now(&self, rule: &Rule, key: &str) -> Decision {
        self.look(rule, key, |slot, _| *slot = None)
    }

    /// Runs `first` on the key's state, if it has one, then answers what a
    /// check of cost 1 would.
    fn look(
        &self,
        rule: &Rule,
        key: &str,
        first: impl FnOnce(&mut Option<State>, u64),
    ) -> Decision {
        let now = self.inner.clock.now_micros();
        let hash = key_hash(&self.inner.hasher, key.as_bytes());
        let mut shard = self.shard(hash);
        let outcome = match shard.find_mut(hash, key) {
            Some(entry) => {
                first(&mut entry.slot.state, now);
                if let Some(state) = &entry.slot.state {
                    entry.slot.expires_at = state.expires_at(rule);
                }
                algorithm::peek(&entry.slot.state, rule, now)
            }
            None => algorithm::peek(&None, rule, now),
        };
        outcome.decision(rule)
    }

    /// Runs `step` on the key's state: its outcome, and the time it ran at.
    fn update(
        &self,
        rule: &Rule,
        key: &str,
        step: impl FnOnce(&mut Option<State>, u64) -> algorithm::Outcome,
    ) -> (algorithm::Outcome, u64) {
        let now = self.inner.clock.now_micros();
        let hash = key_hash(&self.inner.hasher, key.as_bytes());
        let mut shard = self.shard(hash);
        let outcome = match shard.find_mut(hash, key) {
            Some(entry) => entry.slot.step(rule, now, step),
            None => {
                let mut state = None;
                let outcome = step(&mut state, now);
                if let Some(state) = state.filter(|s| s.expires_at(rule) > now) {
                    let expires_at = state.expires_at(rule);
                    let entry = Entry {
                        key: StoredKey::new(key),
                        slot: Slot {
                            state: Some(state),
                            expires_at,
                        },
                    };
                    if !insert(&mut shard, hash, entry, now, &self.inner)
                        && !self.inner.capped.swap(true, Ordering::Relaxed)
                    {
                        tracing::warn!(
                            "the in-memory rate limiter tracks its maximum of keys; \
                             calls of new keys are allowed untracked until keys expire"
                        );
                    }
                }
                outcome
            }
        };
        (outcome, now)
    }

    /// How many keys the store holds, expired ones not yet reclaimed included.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether the store holds no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard of a key's hash: 6 bits that the shard's table does not
    /// use. It indexes by the low bits and tags each slot with the top 7;
    /// taking the shard from those would leave keys of one shard sharing
    /// most of their tag, and each lookup would compare many keys.
    fn shard(&self, hash: u64) -> MutexGuard<'_, ShardMap> {
        lock(&self.inner.shards[(hash >> 51) as usize % SHARDS])
    }
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl Backend for MemoryBackend {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        Ok(self.check_now(rule, key, cost))
    }

    async fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        debug_assert_eq!(rule.algorithm(), Algorithm::Concurrency);
        Ok(self.acquire_now(rule, key, cost, lease))
    }

    async fn release(&self, _rule: &Rule, key: &str, _cost: u64, lease: u64) -> Result<(), Error> {
        self.release_now(key, lease);
        Ok(())
    }

    async fn peek(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        Ok(self.peek_now(rule, key))
    }

    async fn refund(&self, rule: &Rule, key: &str, charge: Charge) -> Result<Decision, Error> {
        self.refund_now(rule, key, &charge)
    }

    async fn reset(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        Ok(self.reset_now(rule, key))
    }
}

/// A poisoned shard only means another thread panicked while holding it; the
/// states in it are still whole, so keep serving.
fn lock(shard: &Shard) -> MutexGuard<'_, ShardMap> {
    shard.map.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Stores a new key, unless the shard is at its cap even after dropping
/// expired keys (then `false`).
fn insert(shard: &mut ShardMap, hash: u64, entry: Entry, now: u64, inner: &Inner) -> bool {
    let max = inner
        .max_per_shard
        .load(Ordering::Relaxed)
        .min(MAX_PER_SHARD);
    if shard.len() >= shard.sweep_at.min(max) {
        sweep(shard, now, &inner.hasher);
    }
    if shard.len() >= max {
        return false;
    }
    shard.push(hash, entry, &inner.hasher);
    true
}

/// The most keys a shard holds whatever the cap (positions are `u32`).
const MAX_PER_SHARD: usize = u32::MAX as usize;

/// Drops expired keys (the survivors keep their order) and rebuilds the
/// index; shrinks both when they are mostly empty.
fn sweep(shard: &mut ShardMap, now: u64, hasher: &Hasher) {
    let ShardMap {
        index,
        entries,
        sweep_at,
    } = shard;
    entries.retain(|e| e.slot.expires_at > now);
    *sweep_at = (entries.len() * 2).max(MIN_SWEEP_LEN);
    // Room for the keys that arrive before the next sweep stays; more than
    // twice that is given back. (Shrinking to the survivors alone made a
    // steady churn of keys regrow both at every sweep.)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ManualClock;
    use crate::backend::INLINE_KEY;

    fn rule(count: u64, period_ms: u64) -> Rule {
        Rule::fixed_window(count, Duration::from_millis(period_ms))
    }

    /// A key's entry is one cache line: a key of up to 22 bytes in place,
    /// its state and its expiry (memory per key, and one line to fetch per
    /// check).
    #[test]
    fn an_entry_is_one_cache_line() {
        assert_eq!(size_of::<Entry>(), 64);
        assert_eq!(align_of::<Entry>(), 64);
    }

    #[test]
    fn window_starts_at_first_call_and_rejections_consume_nothing() {
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone());
        let r = rule(3, 1000);
        clock.advance(Duration::from_millis(250));
        for expected_remaining in [2, 1, 0] {
            let d = store.check_now(&r, "k", 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
            assert_eq!(d.reset_after, Duration::from_millis(1000));
        }
        clock.advance(Duration::from_millis(400));
        for _ in 0..5 {
            let d = store.check_now(&r, "k", 1);
            assert!(!d.allowed);
            assert_eq!(d.remaining, 0);
            assert_eq!(d.retry_after, Duration::from_millis(600));
        }
        clock.advance(Duration::from_millis(599));
        assert!(!store.check_now(&r, "k", 1).allowed);
        clock.advance(Duration::from_millis(1));
        let d = store.check_now(&r, "k", 1);
        assert!(d.allowed, "a new window opens exactly at the period's end");
        assert_eq!(d.remaining, 2);
    }

    #[test]
    fn retry_after_is_zero_while_budget_remains() {
        let store = MemoryBackend::with_clock(ManualClock::new());
        let r = rule(2, 1000);
        assert_eq!(store.check_now(&r, "k", 1).retry_after, Duration::ZERO);
        let last = store.check_now(&r, "k", 1);
        assert!(last.allowed);
        assert_eq!(last.retry_after, Duration::from_secs(1));
    }

    #[test]
    fn keys_are_independent() {
        let store = MemoryBackend::with_clock(ManualClock::new());
        let r = rule(1, 1000);
        assert!(store.check_now(&r, "a", 1).allowed);
        assert!(store.check_now(&r, "b", 1).allowed);
        assert!(!store.check_now(&r, "a", 1).allowed);
    }

    #[test]
    fn expired_keys_are_reclaimed_without_being_asked() {
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone());
        let per_round = SHARDS * MIN_SWEEP_LEN;
        let rounds = 8;
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingLog,
            Algorithm::Gcra,
        ] {
            let r = Rule::new(algorithm, 1, Duration::from_millis(10));
            for round in 0..rounds {
                for i in 0..per_round {
                    store.check_now(&r, &format!("{round}-{i}"), 1);
                }
                // Every key written so far expires.
                clock.advance(Duration::from_millis(10));
            }
            // Kept without reclaiming: rounds * per_round keys.
            assert!(
                store.len() <= 3 * per_round,
                "{algorithm:?}: expired keys were not reclaimed: {} keys held after {} rounds of {}",
                store.len(),
                rounds,
                per_round
            );
        }
    }

    #[test]
    fn keys_that_outlive_sweeps_keep_their_state() {
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone());
        let kept = Rule::fixed_window(2, Duration::from_secs(3600));
        let brief = rule(1, 10);
        let keep: Vec<String> = (0..5_000).map(|i| format!("keep-{i}")).collect();
        for key in &keep {
            assert!(store.check_now(&kept, key, 1).allowed);
        }
        // Waves of short-lived keys: each wave expires, later ones sweep it
        // out (moving the survivors and rebuilding the index), and the last
        // sweeps shrink the tables.
        for wave in 0..6 {
            let n = if wave < 3 {
                SHARDS * MIN_SWEEP_LEN * 2
            } else {
                SHARDS * 4
            };
            for i in 0..n {
                assert!(
                    store
                        .check_now(&brief, &format!("brief-{wave}-{i}"), 1)
                        .allowed
                );
            }
            clock.advance(Duration::from_millis(10));
        }
        store.sweep();
        assert_eq!(store.len(), keep.len(), "only the long-lived keys are left");
        for key in &keep {
            let second = store.check_now(&kept, key, 1);
            assert!(second.allowed, "{key} lost its state");
            assert_eq!(second.remaining, 0, "{key} lost its first call");
            assert!(!store.check_now(&kept, key, 1).allowed, "{key}");
        }
    }

    #[test]
    fn keys_keep_their_state_as_the_index_grows() {
        // Fewer keys than a sweep needs: only growth moves them in the index.
        let store = MemoryBackend::with_clock(ManualClock::new());
        let r = rule(1, 1000);
        let keys: Vec<String> = (0..20_000).map(|i| format!("user:{i}")).collect();
        for key in &keys {
            assert!(store.check_now(&r, key, 1).allowed, "{key}");
        }
        for key in &keys {
            assert!(!store.check_now(&r, key, 1).allowed, "{key} lost its call");
        }
        assert_eq!(store.len(), keys.len());
    }

    #[test]
    fn short_and_long_keys_are_told_apart() {
        let store = MemoryBackend::with_clock(ManualClock::new());
        let r = rule(1, 1000);
        let keys: Vec<String> = (INLINE_KEY - 2..INLINE_KEY + 3)
            .map(|n| "k".repeat(n))
            .collect();
        for key in &keys {
            assert!(store.check_now(&r, key, 1).allowed, "{} bytes", key.len());
        }
        for key in &keys {
            assert!(!store.check_now(&r, key, 1).allowed, "{} bytes", key.len());
        }
        assert_eq!(store.len(), keys.len());
    }

    #[test]
    fn a_cap_set_on_a_shared_store_holds_for_every_clone() {
        let store = MemoryBackend::with_clock(ManualClock::new());
        let shared = store.clone();
        let store = store.with_max_keys(SHARDS); // about one key per shard
        let rule = rule(1, 60_000);
        for i in 0..10_000 {
            shared.check_now(&rule, &format!("k{i}"), 1);
        }
        assert!(shared.len() <= SHARDS, "{} keys held", shared.len());
        assert_eq!(store.len(), shared.len(), "one store");
    }

    #[test]
    fn refused_calls_on_unknown_keys_store_nothing() {
        let store = MemoryBackend::with_clock(ManualClock::new());
        let r = Rule::sliding_log(2, Duration::from_secs(1));
        assert!(store.check_now(&r, "k", 2).allowed);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn exact_under_threads() {
        let store = MemoryBackend::new();
        for algorithm in Algorithm::ALL {
            let r = Rule::new(algorithm, 500, Duration::from_secs(60));
            let passed: u64 = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8)
                    .map(|_| {
                        s.spawn(|| {
                            (0..200)
                                .filter(|_| store.check_now(&r, algorithm.name(), 1).allowed)
                                .count() as u64
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum()
            });
            assert_eq!(passed, 500, "{algorithm:?}");
        }
    }
}
