//! The in-process store: the embedded default, and the insurance limiter
//! while Redis is unavailable.

mod set;
mod shard;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard, PoisonError, RwLock};

use super::hook::{Answered, BackendCall, LeaseRef, Reserved, Sealed, Ticket};
use super::{Backend, StoredKey};
use crate::algorithm::{self, State};
use crate::clock::{Clock, SystemClock};
use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::log_gate::LogGate;
use crate::rule::{Algorithm, Rule, SubjectLimit};
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
    /// Subjects' own limits, by key (read only for rules built
    /// [`with_subject_limits`](Rule::with_subject_limits)).
    limits: RwLock<HashMap<Box<str>, SubjectLimit>>,
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
                limits: RwLock::default(),
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

    /// `rule` as it holds for `key`: with the subject's own limit in place
    /// of its count and burst, where the rule reads them and the key has
    /// one.
    #[inline]
    fn in_force(&self, rule: &Rule, key: &str) -> Rule {
        if !rule.reads_subject_limits() {
            return *rule;
        }
        self.subject_rule(rule, key)
    }

    #[cold]
    fn subject_rule(&self, rule: &Rule, key: &str) -> Rule {
        let limits = self
            .inner
            .limits
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        limits
            .get(key)
            .and_then(|limit| rule.limited_to(limit).ok())
            .unwrap_or(*rule)
    }

    /// The rules of `checks` as they hold for their keys (see
    /// [`in_force`](Self::in_force)), where one reads subjects' limits.
    fn sets_in_force(&self, checks: &[super::RuleCheck<'_>]) -> Option<Vec<Rule>> {
        checks
            .iter()
            .any(|c| c.rule.reads_subject_limits())
            .then(|| {
                checks
                    .iter()
                    .map(|c| self.in_force(c.rule, c.key))
                    .collect()
            })
    }

    /// Sets or clears `key`'s own limit (see [`Backend::set_limit`]).
    pub(crate) fn set_limit_now(&self, key: &str, limit: Option<SubjectLimit>) {
        let mut limits = self
            .inner
            .limits
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match limit {
            Some(limit) => {
                limits.insert(key.into(), limit);
            }
            None => {
                limits.remove(key);
            }
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
        let rule = &self.in_force(rule, key);
        if rule.reads_subject_limits() && cost > rule.capacity() {
            return (never_fits(rule), None);
        }
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
        let rule = &self.in_force(rule, key);
        if rule.reads_subject_limits() && cost > rule.capacity() {
            return never_fits(rule);
        }
        let (outcome, _) = self.update(rule, key, |slot, now| {
            algorithm::acquire(slot, rule, now, cost, id)
        });
        outcome.decision(rule)
    }

    /// One call, answered at once, with the stamp of what it charged.
    pub(crate) fn answer(&self, call: &BackendCall<'_>) -> Answered {
        let BackendCall {
            rule, key, cost, ..
        } = *call;
        match call.lease {
            Some(id) => Answered::by_backend(self.acquire_now(rule, key, cost, id), None),
            None => {
                let (decision, charge) = self.charge_now(rule, key, cost);
                Answered::by_backend(decision, charge.and_then(|c| c.stamp()))
            }
        }
    }

    /// Reserves `cost` units for a call that may wait up to `max_wait`
    /// (see [`RateLimiter::until_ready`](crate::RateLimiter::until_ready)):
    /// its answer, read, and the time it was made at (µs of this store's
    /// clock); `None` where the rule's algorithm cannot wait.
    pub(crate) fn reserve_now(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: std::time::Duration,
    ) -> Option<(algorithm::Reservation, u64)> {
        algorithm::spec(rule.algorithm()).wait.as_ref()?;
        let rule = &self.in_force(rule, key);
        if rule.reads_subject_limits() && cost > rule.capacity() {
            let outcome = algorithm::Outcome {
                allowed: false,
                remaining: 0,
                reset_after_us: 0,
                retry_after_us: rule.period_us(),
                limit: 0,
            };
            return Some((
                algorithm::Reservation::read(outcome),
                self.inner.clock.now_micros(),
            ));
        }
        let max_wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let (outcome, now) = self.update(rule, key, |slot, now| {
            algorithm::reserve(slot, rule, now, cost, max_wait)
                .unwrap_or_else(|| algorithm::check(slot, rule, now, cost))
        });
        Some((algorithm::Reservation::read(outcome), now))
    }

    /// A reservation in the hooks' form (see [`reserve_now`](Self::reserve_now)).
    pub(crate) fn reserve(
        &self,
        call: &BackendCall<'_>,
        max_wait: std::time::Duration,
    ) -> Result<Reserved, Error> {
        let Some((reservation, now)) = self.reserve_now(call.rule, call.key, call.cost, max_wait)
        else {
            return Err(Error::Unsupported(UNWAITABLE));
        };
        let decision = reservation
            .outcome
            .decision(&self.in_force(call.rule, call.key));
        let stamp = (decision.allowed && reservation.wait_us == 0).then(|| {
            algorithm::stamp(
                call.rule.algorithm(),
                call.rule.period_us(),
                now,
                &reservation.outcome,
            )
        });
        Ok(Reserved {
            answered: Answered::by_backend(decision, stamp),
            wait: std::time::Duration::from_micros(reservation.wait_us),
            ticket: (reservation.wait_us > 0).then_some(Ticket {
                at: now,
                position: reservation.position,
                insurance: false,
            }),
        })
    }

    /// Gives back a reservation that waits (see `algorithm::cancel`).
    pub(crate) fn cancel_now(&self, rule: &Rule, key: &str, cost: u64, ticket: Ticket) {
        let rule = &self.in_force(rule, key);
        self.look(rule, key, true, |slot, now| {
            algorithm::cancel(slot, rule, now, cost, ticket.at, ticket.position);
        });
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
        let rule = &self.in_force(rule, key);
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
        let rule = &self.in_force(rule, key);
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
        let rule = &self.in_force(rule, key);
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
        Ok(self
            .answer_all(checks)
            .into_iter()
            .map(|answer| answer.decision)
            .collect())
    }

    async fn set_limit(
        &self,
        _rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        self.set_limit_now(key, limit);
        Ok(())
    }

    fn __answer_now(&self, _: Sealed, call: &BackendCall<'_>) -> Option<Answered> {
        Some(self.answer(call))
    }

    fn __answer(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
    ) -> impl Future<Output = Result<Answered, Error>> + Send {
        std::future::ready(Ok(self.answer(&call)))
    }

    fn __release_now(&self, _: Sealed, lease: &LeaseRef<'_>) -> bool {
        self.release_now(lease.key, lease.id);
        true
    }

    fn __reserve_now(
        &self,
        _: Sealed,
        call: &BackendCall<'_>,
        max_wait: std::time::Duration,
    ) -> Option<Result<Reserved, Error>> {
        Some(self.reserve(call, max_wait))
    }

    fn __reserve(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
        max_wait: std::time::Duration,
    ) -> impl Future<Output = Result<Reserved, Error>> + Send {
        std::future::ready(self.reserve(&call, max_wait))
    }

    fn __cancel_now(&self, _: Sealed, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool {
        self.cancel_now(rule, key, cost, ticket);
        true
    }

    fn __name(&self, _: Sealed) -> &'static str {
        "memory"
    }

    async fn __answer_all(
        &self,
        _: Sealed,
        checks: &[super::RuleCheck<'_>],
        _: crate::error::OnError,
    ) -> Result<Vec<Answered>, Error> {
        Ok(self.answer_all(checks))
    }
}

/// The answer to a call whose cost is over the capacity of its subject's
/// own limit: it never fits (as the scripts answer).
fn never_fits(rule: &Rule) -> Decision {
    algorithm::Outcome {
        allowed: false,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: rule.period_us(),
        limit: 0,
    }
    .decision(rule)
}

/// Why a call under a window or concurrency rule cannot wait its turn.
pub(crate) const UNWAITABLE: &str = "waiting its turn under a window or concurrency rule (only gcra and token_bucket reserve a future slot)";

#[cfg(test)]
mod tests;
