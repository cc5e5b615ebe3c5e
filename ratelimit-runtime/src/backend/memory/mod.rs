//! The in-process store: the embedded default, and the insurance limiter
//! while Redis is unavailable.

mod set;
mod shard;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use super::{Backend, StoredKey};
use crate::algorithm::{self, State};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::rule::{Algorithm, Rule};
use crate::site::LogGate;
use shard::{Entry, Hasher, MAX_PER_SHARD, Overflow, Shard, ShardMap, Slot, key_hash};

/// How many independently locked shards the keys are spread over, so tasks on
/// different keys rarely wait for each other.
const SHARDS: usize = 64;

/// The most keys a store tracks unless told otherwise
/// ([`MemoryBackend::with_max_keys`]): about 76 to 154 MB of keys, by their
/// length (see the README).
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// Budgets kept in process memory, sharded by key.
///
/// Cheap to clone (clones share the store). Expired keys are reclaimed as new
/// keys arrive; nothing needs to be called for that. It tracks at most about
/// [`DEFAULT_MAX_KEYS`] keys (see [`with_max_keys`](MemoryBackend::with_max_keys)
/// for what happens when full: calls stay limited). Time is the given
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
#[derive(Clone)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryBackend {
    /// The cap, not the keys (a store holds up to a million).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field(
                "max_keys",
                &self.inner.max_per_shard().saturating_mul(SHARDS),
            )
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// The most keys one shard tracks (`max_keys / SHARDS`).
    max_per_shard: AtomicUsize,
    /// The budgets of calls of keys a full shard could not track.
    overflow: Overflow,
    /// Set once a call was charged to the overflow.
    overflowed: AtomicBool,
    /// How often overflows are logged: at most one line per 10 s of the
    /// store's clock, so a flood days after the first is said again.
    overflow_log: LogGate,
    #[cfg(feature = "metrics")]
    overflow_counter: std::sync::OnceLock<::metrics::Counter>,
    /// Calls charged to the overflow (tests count them).
    #[cfg(test)]
    overflow_calls: AtomicUsize,
    /// Seeded per store: callers choose keys, so the hash must not be
    /// predictable (flooding one bucket).
    hasher: Hasher,
    clock: StoreClock,
}

impl Inner {
    fn max_per_shard(&self) -> usize {
        self.max_per_shard
            .load(Ordering::Relaxed)
            .min(MAX_PER_SHARD)
    }

    /// Counts a call charged to the overflow at `now` (µs of the store's
    /// clock), and says so now and then.
    fn note_overflow(&self, now: u64) {
        #[cfg(test)]
        self.overflow_calls.fetch_add(1, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        self.overflow_counter
            .get_or_init(|| ::metrics::counter!("ratelimit_memory_overflow_total"))
            .increment(1);
        if !self.overflowed.load(Ordering::Relaxed) {
            self.overflowed.store(true, Ordering::Relaxed);
        }
        if let Some(unlogged) = self.overflow_log.admit(now / 1_000) {
            tracing::warn!(
                max_keys = self.max_per_shard().saturating_mul(SHARDS),
                unlogged,
                "the in-memory rate limiter is full of keys whose budgets are in use; until \
                 some recover, calls of keys it cannot track share one budget per rule \
                 (at most one line per 10 s, `unlogged`: those since the last line; all \
                 counted in ratelimit_memory_overflow_total). Raise \
                 RateLimiterBuilder::max_keys if this is not a flood"
            );
        }
    }
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
        let store = MemoryBackend {
            inner: Arc::new(Inner {
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
                max_per_shard: AtomicUsize::new(usize::MAX),
                overflow: Overflow::default(),
                overflowed: AtomicBool::new(false),
                overflow_log: LogGate::new(),
                #[cfg(feature = "metrics")]
                overflow_counter: std::sync::OnceLock::new(),
                #[cfg(test)]
                overflow_calls: AtomicUsize::new(0),
                hasher: Hasher::default(),
                clock,
            }),
        };
        store.with_max_keys(DEFAULT_MAX_KEYS)
    }

    /// The same store with at most about `max_keys` keys tracked (default
    /// [`DEFAULT_MAX_KEYS`]; spread over 64 shards, so a shard may fill a
    /// little before the store holds `max_keys`). A full store never lets a
    /// call through unlimited and never forgets a key whose budget is in
    /// use:
    ///
    /// - a new key takes the place of one whose budget has recovered (its
    ///   state expired: the budget is whole again, so nothing is lost);
    /// - a key it cannot store is charged to an overflow budget of its rule,
    ///   one per rule (by its numbers), shared by every key it could not
    ///   store: under a flood of new keys those share one budget until keys
    ///   recover. Logged (`warn`) at most once per 10 s, counted in the metric
    ///   `ratelimit_memory_overflow_total` (feature `metrics`).
    ///
    /// A call at the cap costs a small constant more than one of a tracked
    /// key: the shard is swept only when a key in it can have expired, and
    /// at most once per a number of such calls proportional to its keys.
    /// The cap is the store's: its clones (sharing it) have it too. Keys it
    /// already tracks over a lowered cap stay until they expire.
    /// `usize::MAX` tracks every key.
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
            shard.lock().sweep(now, &self.inner.hasher);
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
        // Or taken from an overflow budget, before the key found room.
        if self.inner.overflowed.load(Ordering::Relaxed) {
            self.inner.overflow.release(id);
        }
    }

    /// What a check of cost 1 would answer now, without consuming
    /// anything.
    pub fn peek_now(&self, rule: &Rule, key: &str) -> Decision {
        self.look(rule, key, true, |_, _| ())
    }

    /// Gives back what `charge` took from `key`'s budget, where it is still
    /// counted (see [`Backend::refund`]), then answers as
    /// [`peek_now`](MemoryBackend::peek_now). A key a full store does not
    /// track was charged to its rule's overflow budget: that budget gets
    /// them back.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a `concurrency` rule (a lease is given
    /// back by its permit).
    pub fn refund_now(&self, rule: &Rule, key: &str, charge: &Charge) -> Result<Decision, Error> {
        if algorithm::spec(rule.algorithm()).refund.is_none() {
            return Err(Error::Unsupported("refunds under a concurrency rule"));
        }
        Ok(self.look(rule, key, true, |slot, now| {
            if let Some(stamp) = charge.stamp() {
                algorithm::refund(slot, rule, now, charge.units(), stamp);
            }
        }))
    }

    /// Forgets `key`'s state (its leases too), then answers as
    /// [`peek_now`](MemoryBackend::peek_now) (a full store's overflow
    /// budget is left alone: it is every untracked key's).
    pub fn reset_now(&self, rule: &Rule, key: &str) -> Decision {
        self.look(rule, key, false, |slot, _| *slot = None)
    }

    /// Runs `first` on the key's state, if it has one, then answers what a
    /// check of cost 1 would. A key a full shard does not track answers
    /// from its rule's overflow budget (`first` runs on it too when
    /// `overflow`).
    fn look(
        &self,
        rule: &Rule,
        key: &str,
        overflow: bool,
        first: impl FnOnce(&mut Option<State>, u64),
    ) -> Decision {
        let now = self.inner.clock.now_micros();
        let hash = key_hash(&self.inner.hasher, key.as_bytes());
        let mut shard = self.shard(hash);
        let outcome = if let Some(entry) = shard.find_mut(hash, key) {
            first(&mut entry.slot.state, now);
            if let Some(state) = &entry.slot.state {
                entry.slot.expires_at = state.expires_at(rule);
            }
            let (outcome, expires_at) = (
                algorithm::peek(&entry.slot.state, rule, now),
                entry.slot.expires_at,
            );
            shard.expiry_moved(expires_at);
            outcome
        } else if shard.len() >= self.inner.max_per_shard() {
            drop(shard);
            self.inner.overflow.with(rule, now, |slot| {
                if overflow {
                    slot.step(rule, now, |state, now| {
                        first(state, now);
                        algorithm::peek(state, rule, now)
                    })
                } else {
                    algorithm::peek(&slot.state, rule, now)
                }
            })
        } else {
            algorithm::peek(&None, rule, now)
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
        if let Some(entry) = shard.find_mut(hash, key) {
            return (entry.slot.step(rule, now, step), now);
        }
        let outcome = match () {
            () if shard.room(self.inner.max_per_shard(), now, &self.inner.hasher) => {
                let mut state = None;
                let outcome = step(&mut state, now);
                // A refused first call leaves nothing to keep.
                if let Some(state) = state.filter(|s| s.expires_at(rule) > now) {
                    let expires_at = state.expires_at(rule);
                    let entry = Entry {
                        key: StoredKey::new(key),
                        slot: Slot {
                            state: Some(state),
                            expires_at,
                        },
                    };
                    shard.push(hash, entry, &self.inner.hasher);
                }
                outcome
            }
            () => {
                drop(shard);
                self.inner.note_overflow(now);
                self.inner
                    .overflow
                    .with(rule, now, |slot| slot.step(rule, now, step))
            }
        };
        (outcome, now)
    }

    /// How many keys the store holds, expired ones not yet reclaimed included.
    pub fn len(&self) -> usize {
        self.inner.shards.iter().map(|s| s.lock().len()).sum()
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
        self.inner.shards[(hash >> 51) as usize % SHARDS].lock()
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

    async fn check_all(&self, checks: &[super::RuleCheck<'_>]) -> Result<Vec<Decision>, Error> {
        let (outcomes, _) = self.check_all_now(checks);
        Ok(outcomes
            .iter()
            .zip(checks)
            .map(|(outcome, check)| outcome.decision(check.rule))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::shard::{CREDIT_PER_CALL, MIN_SWEEP_LEN};
    use super::*;
    use crate::backend::INLINE_KEY;
    use crate::clock::ManualClock;

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

    /// A full store still limits the keys it cannot track: they share
    /// their rule's overflow budget. (They used to be allowed on every
    /// call, untracked: a flood of new keys made every new caller
    /// unlimited.)
    #[test]
    fn a_full_store_limits_the_keys_it_cannot_track() {
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * 16);
        let r = rule(3, 60_000);
        for i in 0..SHARDS * 64 {
            store.check_now(&r, &format!("flood-{i}"), 1);
        }
        assert!(store.len() <= SHARDS * 16, "{} keys held", store.len());
        let passed = |rule: &Rule, prefix: &str| {
            (0..1_000)
                .filter(|i| store.check_now(rule, &format!("{prefix}-{i}"), 1).allowed)
                .count()
        };
        assert_eq!(
            passed(&r, "fresh"),
            0,
            "the flood spent the overflow budget"
        );
        assert_eq!(
            passed(&rule(5, 60_000), "other"),
            5,
            "another rule: its own overflow budget, whole"
        );
        let peeked = store.peek_now(&r, "never-seen");
        assert!(
            !peeked.allowed,
            "a peek answers what the next check would: {peeked:?}"
        );

        // Once the flood's budgets recover, new keys are tracked again, each
        // with its own budget.
        clock.advance(Duration::from_secs(60));
        for key in ["late-1", "late-2"] {
            for _ in 0..3 {
                assert!(store.check_now(&r, key, 1).allowed, "{key}");
            }
            assert!(!store.check_now(&r, key, 1).allowed, "{key}");
        }
    }

    /// A lease taken from an overflow budget is given back there.
    #[test]
    fn leases_of_a_full_store_are_released() {
        let store = MemoryBackend::with_clock(ManualClock::new()).with_max_keys(SHARDS);
        let long = rule(1, 60_000);
        for i in 0..SHARDS * 32 {
            store.check_now(&long, &format!("live-{i}"), 1);
        }
        let leases = Rule::concurrency(2, Duration::from_secs(60));
        assert!(store.acquire_now(&leases, "a", 1, 1).allowed);
        assert!(store.acquire_now(&leases, "b", 1, 2).allowed);
        assert!(
            !store.acquire_now(&leases, "c", 1, 3).allowed,
            "one shared budget"
        );
        store.release_now("a", 1);
        assert!(store.acquire_now(&leases, "c", 1, 4).allowed);
        store.release_now("b", 2);
        store.release_now("c", 4);
        assert!(store.acquire_now(&leases, "d", 1, 5).allowed);
        assert!(
            store.acquire_now(&leases, "e", 1, 6).allowed,
            "both given back"
        );
    }

    /// Flooding cannot reset a budget in use: a key that refuses calls
    /// keeps its state however many new keys arrive, and while others'
    /// budgets recover and are replaced.
    #[test]
    fn a_full_store_never_forgets_a_key_in_use() {
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * 4);
        let long = rule(1, 3_600_000);
        assert!(store.check_now(&long, "flooder", 1).allowed);
        assert!(!store.check_now(&long, "flooder", 1).allowed);
        let brief = rule(1, 10);
        for wave in 0..5 {
            for i in 0..SHARDS * 32 {
                store.check_now(&brief, &format!("w{wave}-{i}"), 1);
            }
            clock.advance(Duration::from_millis(10));
        }
        assert!(store.len() <= SHARDS * 4, "{} keys held", store.len());
        assert!(!store.check_now(&long, "flooder", 1).allowed);
    }

    /// Keys visited by sweeps so far, over every shard.
    fn visited(store: &MemoryBackend) -> usize {
        store.inner.shards.iter().map(|s| s.lock().visited).sum()
    }

    /// A call at the cap costs a small constant, not a scan of its shard:
    /// with no key able to expire nothing is swept; with keys expiring all
    /// the time, sweeps visit at most `CREDIT_PER_CALL` keys per call. (A
    /// full shard used to be swept at every call of a new key.)
    #[test]
    fn calls_at_the_cap_do_not_scan_the_shard() {
        let per_shard = 64;
        let clock = ManualClock::new();
        let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * per_shard);
        let long = rule(1, 3_600_000);
        for i in 0..SHARDS * per_shard * 4 {
            store.check_now(&long, &format!("live-{i}"), 1);
        }
        let before = visited(&store);
        for i in 0..100_000 {
            store.check_now(&long, &format!("fresh-{i}"), 1);
        }
        assert_eq!(
            visited(&store),
            before,
            "no key can expire: nothing to sweep"
        );

        // Keys that expire one after another, fewer live at once than the
        // cap: the store is full of keys of which some can always have
        // expired.
        let store = MemoryBackend::with_clock(clock.clone()).with_max_keys(SHARDS * per_shard);
        let brief = rule(1, 100);
        let calls = 200_000;
        for i in 0..calls {
            clock.advance(Duration::from_micros(40));
            store.check_now(&brief, &format!("churn-{i}"), 1);
        }
        assert!(store.len() <= SHARDS * per_shard);
        let visits = visited(&store);
        assert!(
            visits <= CREDIT_PER_CALL * calls + SHARDS * per_shard,
            "{visits} keys visited by sweeps for {calls} calls"
        );
        // Room was made from keys that recovered: most new keys were tracked.
        let overflowed = store.inner.overflow_calls.load(Ordering::Relaxed);
        assert!(
            overflowed < calls / 10,
            "{overflowed} of {calls} calls overflowed"
        );
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
