//! [`LocalQuotas`]: rules with a local quota ([`Rule::with_local_quota`])
//! served in process from blocks of units taken from the shared budget in
//! one call. It wraps the [`Failover`] around Redis; calls of every other
//! rule go straight through to it.
//!
//! Taking "up to N" units needs no script of its own: a refused block's
//! answer says how many units are left (`remaining`), so the next attempt
//! asks for those, and the last for the call's own cost. Near the end of a
//! budget that is at most three round trips, and the tail is not wasted.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::hook::{Answered, BackendCall, LeaseRef, Reserved, RoundTrip, Sealed, Ticket};
use super::{Backend, Failover, RuleCheck};
use crate::decision::{Charge, Decision};
use crate::error::{Error, OnError};
use crate::rule::{Algorithm, Rule, SubjectLimit};

const SHARDS: usize = 16;
const MIN_SWEEP_LEN: usize = 256;

/// The most round trips one call makes to take a block: the block it
/// wants, what the budget has left, then its own cost.
const ATTEMPTS: usize = 3;

/// How long a block of `rule` lives: a tenth of its period, between 10 ms
/// and 1 s.
fn lifetime(rule: &Rule) -> Duration {
    (rule.period() / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// A store whose quota rules are served from blocks held in process.
#[derive(Debug)]
pub(crate) struct LocalQuotas<B> {
    inner: Arc<Failover<B>>,
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    max_per_shard: usize,
}

#[derive(Debug, Default)]
struct Shard {
    entries: HashMap<Box<str>, Arc<Entry>>,
    sweep_at: usize,
}

/// One key's block, under one rule.
#[derive(Debug)]
struct Entry {
    rule: Rule,
    key: Box<str>,
    held: Mutex<Held>,
    /// Taken by the one call that asks the backend for a block; the others
    /// wait for it, then spend what it took.
    taking: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct Held {
    /// Units of the block not yet served.
    units: u64,
    /// Counts the blocks taken, so a block's timer knows its own.
    generation: u64,
    stamp: Option<u64>,
    /// When the block's time is up: served no more, what is left given back.
    expires: Instant,
    /// The block ends with its fixed window: nothing to give back then.
    ends_with_window: bool,
    /// What the backend had left once the block was taken, and when its
    /// budget is whole again.
    remaining: u64,
    reset_at: Instant,
    refused: Option<Refusal>,
    /// Units asked for since the last block was taken, and when that was.
    asked: u64,
    since: Instant,
    /// Units asked for per second, smoothed.
    rate: f64,
}

/// A refusal of the backend, answered in process until `until`.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    until: Instant,
    retry_at: Instant,
    reset_at: Instant,
    cost: u64,
    remaining: u64,
}

impl Entry {
    fn new(rule: &Rule, key: &str) -> Entry {
        let now = Instant::now();
        Entry {
            rule: *rule,
            key: key.into(),
            held: Mutex::new(Held {
                units: 0,
                generation: 0,
                stamp: None,
                expires: now,
                ends_with_window: false,
                remaining: 0,
                reset_at: now,
                refused: None,
                asked: 0,
                since: now,
                rate: 0.0,
            }),
            taking: tokio::sync::Mutex::new(()),
        }
    }

    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The answer to a call of `cost` from the block or a known refusal, if
    /// there is one now; `asked` counts the call toward the rate.
    fn serve(&self, cost: u64, asked: bool) -> Option<Answered> {
        let now = Instant::now();
        let mut held = self.held();
        if asked {
            held.asked += cost;
        }
        if now < held.expires && held.units >= cost {
            held.units -= cost;
            let decision = Decision {
                allowed: true,
                limit: self.rule.count(),
                remaining: held.remaining + held.units,
                reset_after: held.reset_at.saturating_duration_since(now),
                retry_after: Duration::ZERO,
            };
            return Some(Answered::by_backend(decision, held.stamp));
        }
        let refusal = held.refused.filter(|r| now < r.until && cost >= r.cost)?;
        let decision = Decision {
            allowed: false,
            limit: self.rule.count(),
            remaining: refusal.remaining,
            reset_after: refusal.reset_at.saturating_duration_since(now),
            retry_after: refusal.retry_at.saturating_duration_since(now),
        };
        Some(Answered::by_backend(decision, None))
    }

    /// The block to ask for next: what this instance was asked for in a
    /// quarter of a block's lifetime at its recent rate, at least `cost`,
    /// at most the rule's largest block.
    fn block_to_take(&self, cost: u64) -> u64 {
        let now = Instant::now();
        let mut held = self.held();
        let elapsed = now.duration_since(held.since).as_secs_f64();
        if elapsed > 0.0 {
            let sample = held.asked as f64 / elapsed;
            held.rate = if held.rate == 0.0 {
                sample
            } else {
                (held.rate + sample) / 2.0
            };
        }
        held.asked = 0;
        held.since = now;
        let max = self
            .rule
            .local_quota()
            .unwrap_or(1)
            .min(self.rule.capacity());
        let wanted = (held.rate * lifetime(&self.rule).as_secs_f64() / 4.0).ceil() as u64;
        wanted.clamp(1, max).max(cost)
    }

    /// Takes what is left of the current block, to be given back.
    fn leftover(&self) -> Option<Charge> {
        let mut held = self.held();
        let units = std::mem::take(&mut held.units);
        let give_back = units > 0 && !(held.ends_with_window && Instant::now() >= held.expires);
        give_back.then(|| Charge::new(units, held.stamp, false))
    }

    /// Holds the `units` a call left of the block `answer` took, the
    /// request having left at `sent`; answers the block's generation and
    /// when its time is up.
    fn hold(&self, units: u64, answer: &Answered, sent: Instant) -> (u64, Instant) {
        let decision = &answer.decision;
        let lifetime = lifetime(&self.rule);
        let window = self.rule.algorithm() == Algorithm::FixedWindow;
        let ends_with_window = window && decision.reset_after <= lifetime;
        let expires = sent
            + if ends_with_window {
                decision.reset_after
            } else {
                lifetime
            };
        let mut held = self.held();
        held.generation += 1;
        held.units = units;
        held.stamp = answer.stamp;
        held.expires = expires;
        held.ends_with_window = ends_with_window;
        held.remaining = decision.remaining;
        held.reset_at = sent + decision.reset_after;
        held.refused = None;
        (held.generation, expires)
    }

    /// Remembers the backend's refusal of a call of `cost`, sent at `sent`:
    /// refused in process until a call of that cost could pass, or for a
    /// block's lifetime (units given back elsewhere are found again).
    fn refuse(&self, cost: u64, decision: &Decision, sent: Instant) {
        if decision.retry_after.is_zero() {
            return;
        }
        let until = sent + decision.retry_after.min(lifetime(&self.rule));
        self.held().refused = Some(Refusal {
            until,
            retry_at: sent + decision.retry_after,
            reset_at: sent + decision.reset_after,
            cost,
            remaining: decision.remaining,
        });
    }

    /// Whether the entry still serves or refuses anything.
    fn live(&self, now: Instant) -> bool {
        let held = self.held();
        now < held.expires || held.refused.is_some_and(|r| now < r.until)
    }
}

impl<B: Backend> LocalQuotas<B> {
    /// Quotas in front of `inner`, for at most about `max_keys` keys.
    pub(crate) fn new(inner: Failover<B>, max_keys: usize) -> LocalQuotas<B> {
        LocalQuotas {
            inner: Arc::new(inner),
            max_per_shard: max_keys.div_ceil(SHARDS).max(MIN_SWEEP_LEN),
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: HashMap::new(),
                        sweep_at: MIN_SWEEP_LEN,
                    })
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of `key` under `rule`, if there is one.
    fn find(&self, rule: &Rule, key: &str) -> Option<Arc<Entry>> {
        let shard = self.shard(key);
        shard
            .entries
            .get(key)
            .filter(|e| e.rule == *rule)
            .map(Arc::clone)
    }

    /// The entry of `key` under `rule`, made if there is none (or it was
    /// under another rule: an override changed it).
    fn entry(&self, rule: &Rule, key: &str) -> Arc<Entry> {
        let mut shard = self.shard(key);
        if let Some(entry) = shard.entries.get(key).filter(|e| e.rule == *rule) {
            return Arc::clone(entry);
        }
        if shard.entries.len() >= shard.sweep_at {
            let now = Instant::now();
            shard.entries.retain(|_, e| e.live(now));
            if shard.entries.len() >= self.max_per_shard / 2 {
                // What the dropped entries hold is given back by their timers.
                shard.entries.clear();
            }
            shard.sweep_at = (shard.entries.len() * 2).clamp(MIN_SWEEP_LEN, self.max_per_shard);
        }
        let entry = Arc::new(Entry::new(rule, key));
        shard.entries.insert(key.into(), Arc::clone(&entry));
        entry
    }

    /// Forgets `key`'s entry: its block and what it refused.
    fn forget(&self, key: &str) -> Option<Arc<Entry>> {
        self.shard(key).entries.remove(key)
    }

    /// Gives `charge` back to `entry`'s budget, in the background.
    fn give_back(&self, entry: &Arc<Entry>, charge: Charge) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(&self.inner);
        let entry = Arc::clone(entry);
        runtime.spawn(async move {
            if let Err(error) = inner.refund(&entry.rule, &entry.key, charge).await {
                tracing::debug!(%error, "could not give back a local quota's unused units");
            }
        });
    }

    /// Gives back what is left of block `generation` when its time is up.
    fn give_back_when_up(&self, entry: &Arc<Entry>, generation: u64, expires: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::clone(&self.inner);
        let entry = Arc::clone(entry);
        runtime.spawn(async move {
            tokio::time::sleep_until(expires.into()).await;
            let charge = {
                let mut held = entry.held();
                if held.generation != generation || held.units == 0 || held.ends_with_window {
                    return;
                }
                Charge::new(std::mem::take(&mut held.units), held.stamp, false)
            };
            if let Err(error) = inner.refund(&entry.rule, &entry.key, charge).await {
                tracing::debug!(%error, "could not give back a local quota's unused units");
            }
        });
    }

    /// A quota rule's call that the block could not answer: takes a new
    /// block (the call's cost and what this instance will soon need), or
    /// learns that the key is empty.
    async fn take(&self, call: BackendCall<'_>) -> Result<Answered, Error> {
        let entry = self.entry(call.rule, call.key);
        let taking = entry.taking.lock().await;
        if let Some(answer) = entry.serve(call.cost, false) {
            return Ok(answer);
        }
        if let Some(charge) = entry.leftover() {
            self.give_back(&entry, charge);
        }
        let mut want = entry.block_to_take(call.cost);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let sent = Instant::now();
            // A failure comes back as an error, for the call's own policy
            // below: the insurance limiter must not hand out a block.
            let block = BackendCall { cost: want, ..call };
            let answer = match self.inner.answer_or_fail(block, call.on_error).await {
                Ok(answer) => answer,
                Err(error @ Error::Backend(_)) => {
                    // Answered by the call's own policy at once: sent again,
                    // it would wait as long again on a Redis that hangs.
                    drop(taking);
                    return self.inner.by_policy(&call, error);
                }
                Err(error) => return Err(error),
            };
            let decision = answer.decision;
            if decision.allowed {
                let left = want - call.cost;
                let (generation, expires) = entry.hold(left, &answer, sent);
                if left > 0 {
                    self.give_back_when_up(&entry, generation, expires);
                }
                return Ok(Answered {
                    decision: Decision {
                        remaining: decision.remaining + left,
                        ..decision
                    },
                    ..answer
                });
            }
            if want == call.cost || attempt == ATTEMPTS {
                entry.refuse(want, &decision, sent);
                return Ok(answer);
            }
            // Refused: what the budget has left, or (if that cannot pay for
            // this call) the call's own cost, for the exact answer.
            want = if decision.remaining >= call.cost && attempt + 1 < ATTEMPTS {
                decision.remaining.min(want - 1)
            } else {
                call.cost
            };
        }
    }
}

/// Whether `call` is served from a local quota.
fn quota_call(call: &BackendCall<'_>) -> bool {
    call.lease.is_none() && call.rule.local_quota().is_some()
}

impl<B: Backend> Backend for LocalQuotas<B> {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        self.inner.check(rule, key, cost).await
    }

    async fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        self.inner.acquire(rule, key, cost, lease).await
    }

    async fn release(&self, rule: &Rule, key: &str, cost: u64, lease: u64) -> Result<(), Error> {
        self.inner.release(rule, key, cost, lease).await
    }

    async fn peek(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.inner.peek(rule, key).await
    }

    async fn set_limit(
        &self,
        rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        self.inner.set_limit(rule, key, limit).await
    }

    /// Gives back to the backend, and forgets the key's refusal.
    async fn refund(&self, rule: &Rule, key: &str, charge: Charge) -> Result<Decision, Error> {
        let decision = self.inner.refund(rule, key, charge).await;
        if let Some(entry) = self.find(rule, key) {
            entry.held().refused = None;
        }
        decision
    }

    /// Drops the key's block too: its units were taken from the budget
    /// before the reset, and serving them after it would pass more than the
    /// rule allows.
    async fn reset(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        if let Some(entry) = self.forget(key) {
            entry.held().units = 0;
        }
        self.inner.reset(rule, key).await
    }

    async fn check_all(&self, checks: &[RuleCheck<'_>]) -> Result<Vec<Decision>, Error> {
        self.inner.check_all(checks).await
    }

    fn __answer_now(&self, _: Sealed, call: &BackendCall<'_>) -> Option<Answered> {
        if !quota_call(call) {
            return self.inner.__answer_now(Sealed::NEW, call);
        }
        match self.find(call.rule, call.key) {
            Some(entry) => entry.serve(call.cost, true),
            None => None,
        }
    }

    async fn __answer(&self, _: Sealed, call: BackendCall<'_>) -> Result<Answered, Error> {
        if quota_call(&call) {
            self.take(call).await
        } else {
            self.inner.__answer(Sealed::NEW, call).await
        }
    }

    async fn __answer_all(
        &self,
        _: Sealed,
        checks: &[RuleCheck<'_>],
        on_error: OnError,
    ) -> Result<Vec<Answered>, Error> {
        self.inner.__answer_all(Sealed::NEW, checks, on_error).await
    }

    fn __release_now(&self, _: Sealed, lease: &LeaseRef<'_>) -> bool {
        self.inner.__release_now(Sealed::NEW, lease)
    }

    async fn __release(&self, _: Sealed, lease: LeaseRef<'_>) -> Result<(), Error> {
        self.inner.__release(Sealed::NEW, lease).await
    }

    /// A call that waits its turn reserves in the shared budget itself: a
    /// block serves calls that go now, not turns in a queue.
    fn __reserve_now(
        &self,
        _: Sealed,
        call: &BackendCall<'_>,
        max_wait: Duration,
    ) -> Option<Result<Reserved, Error>> {
        self.inner.__reserve_now(Sealed::NEW, call, max_wait)
    }

    async fn __reserve(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
        max_wait: Duration,
    ) -> Result<Reserved, Error> {
        self.inner.__reserve(Sealed::NEW, call, max_wait).await
    }

    fn __cancel_now(&self, _: Sealed, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool {
        self.inner
            .__cancel_now(Sealed::NEW, rule, key, cost, ticket)
    }

    async fn __cancel(
        &self,
        _: Sealed,
        rule: &Rule,
        key: &str,
        cost: u64,
        ticket: Ticket,
    ) -> Result<(), Error> {
        self.inner
            .__cancel(Sealed::NEW, rule, key, cost, ticket)
            .await
    }

    fn __round_trip(&self, _: Sealed, error: &Error) -> RoundTrip {
        self.inner.__round_trip(Sealed::NEW, error)
    }

    fn __name(&self, _: Sealed) -> &'static str {
        self.inner.__name(Sealed::NEW)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_lives_a_tenth_of_the_period_between_10_ms_and_1_s() {
        let rule = |ms| Rule::fixed_window(10, Duration::from_millis(ms));
        assert_eq!(lifetime(&rule(1_000)), Duration::from_millis(100));
        assert_eq!(lifetime(&rule(20)), Duration::from_millis(10));
        assert_eq!(lifetime(&rule(3_600_000)), Duration::from_secs(1));
    }

    /// A block follows the rate asked, never under the call's cost, never
    /// over the rule's largest block or its capacity.
    #[test]
    fn a_block_follows_the_rate_within_its_bounds() {
        let rule = Rule::fixed_window(1_000, Duration::from_secs(1)).with_local_quota(300);
        let entry = Entry::new(&rule, "k");
        assert_eq!(entry.block_to_take(1), 1, "no rate seen yet");
        assert_eq!(entry.block_to_take(7), 7, "at least the call's cost");
        {
            let mut held = entry.held();
            held.asked = 1_000;
            held.since = Instant::now() - Duration::from_secs(1);
            held.rate = 0.0;
        }
        // 1,000 a second for a quarter of a 100 ms lifetime.
        assert_eq!(entry.block_to_take(1), 25);
        {
            let mut held = entry.held();
            held.asked = 1_000_000;
            held.since = Instant::now() - Duration::from_secs(1);
            held.rate = 0.0;
        }
        assert_eq!(entry.block_to_take(1), 300, "capped at the largest block");
    }
}
