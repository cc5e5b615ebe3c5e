//! Where the budgets live: the [`Backend`] trait and its stores.

use std::future::Future;

use crate::decision::{Charge, Decision};
use crate::error::{Error, OnError};
use crate::rule::{Rule, SubjectLimit};
use hook::{Answered, BackendCall, LeaseRef, Reserved, RoundTrip, Sealed, Ticket};

mod breaker;
mod failover;
pub(crate) mod hook;
pub mod memory;
#[cfg(feature = "redis")]
mod over_limit;
#[cfg(feature = "redis")]
mod quota;
#[cfg(feature = "redis")]
pub mod redis;

pub(crate) use failover::Failover;
#[cfg(feature = "redis")]
pub(crate) use over_limit::OverLimitCache;
#[cfg(feature = "redis")]
pub(crate) use quota::LocalQuotas;

/// A store that checks and consumes rate-limit budgets.
///
/// One call of [`check`](Backend::check) is one atomic check-and-consume: it
/// either consumes `cost` units of `key`'s budget under `rule` and answers an
/// allowed [`Decision`], or consumes nothing and answers a rejecting one.
/// Implementations must give the same decisions as
/// [`MemoryBackend`](memory::MemoryBackend) for the same calls and times.
///
/// The limiter validates `cost` against the rule's capacity before calling a
/// backend, so `1 <= cost <= rule.capacity()` holds here.
///
/// A limiter built on a backend of yours
/// ([`RateLimiterBuilder::backend`](crate::RateLimiterBuilder::backend))
/// fails over as it does on Redis: when a call answers
/// [`Error::Backend`], the rule's failure policy decides
/// ([`OnError`]: check it in process memory, allow or
/// deny it), and after consecutive failures a circuit breaker stops
/// sending calls to the backend, but for one probe every
/// [`probe_interval`](crate::RateLimiterBuilder::probe_interval). Other
/// errors ([`Error::Unsupported`], say) reach the caller as they are.
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// Checks and consumes `cost` units of `key`'s budget under `rule`
    /// (any algorithm but `concurrency`).
    fn check(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Takes `cost` units of a `concurrency` rule under the lease id `lease`,
    /// until [`release`](Backend::release) or the rule's period passes.
    ///
    /// The default answers [`Error::Unsupported`].
    fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        let _ = (rule, key, cost, lease);
        async { Err(Error::Unsupported("concurrency rules")) }
    }

    /// Gives back the units of lease `lease` taken by [`acquire`](Backend::acquire).
    ///
    /// The default does nothing.
    fn release(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (rule, key, cost, lease);
        async { Ok(()) }
    }

    /// What a check of cost 1 of `key` under `rule` would answer now,
    /// without consuming anything (a concurrency rule: what an acquire
    /// would).
    ///
    /// The default answers [`Error::Unsupported`].
    fn peek(&self, rule: &Rule, key: &str) -> impl Future<Output = Result<Decision, Error>> + Send {
        let _ = (rule, key);
        async { Err(Error::Unsupported("peek")) }
    }

    /// Gives back what `charge` took from `key`'s budget under `rule`,
    /// where it is still counted (at most what the budget holds, so never
    /// above capacity), then answers as [`peek`](Backend::peek). Per
    /// algorithm, the built-in backends give back:
    ///
    /// - fixed window: units of the window the charge was counted in, while
    ///   it is the current one;
    /// - sliding window: units of the window's count that holds them (the
    ///   current or the previous window's);
    /// - sliding log: the charge's own entry, while it is in the window,
    ///   and while the calls the refund rewrites (its own entries and
    ///   every call logged after them: each is counted through fewer units)
    ///   number at most 1,024; past that, nothing (the work a refund does
    ///   is bounded), and the call stays counted until it leaves the window;
    /// - token bucket: tokens, up to the burst, into the bucket they were
    ///   taken from (not one begun since: full again, or reset);
    /// - GCRA: the theoretical arrival time moves back `charge.units()`
    ///   emission intervals, never before now, in the bucket it was charged
    ///   in;
    /// - concurrency: nothing, [`Error::Unsupported`] (a lease is given back
    ///   by its [`Permit`](crate::Permit)).
    ///
    /// Anywhere else (a reset came between, say) nothing is given back. A
    /// charge of a custom backend's check has no [`Charge::stamp`]: its
    /// refund gives back `charge.units()` as the backend can.
    /// `1 <= charge.units() <= rule.capacity()` holds here. The default
    /// answers [`Error::Unsupported`].
    fn refund(
        &self,
        rule: &Rule,
        key: &str,
        charge: Charge,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        let _ = (rule, key, charge);
        async { Err(Error::Unsupported("refund")) }
    }

    /// Forgets `key`'s state under `rule` (a concurrency rule's leases
    /// too), then answers as [`peek`](Backend::peek): the budget is whole.
    ///
    /// The default answers [`Error::Unsupported`].
    fn reset(
        &self,
        rule: &Rule,
        key: &str,
    ) -> impl Future<Output = Result<Decision, Error>> + Send {
        let _ = (rule, key);
        async { Err(Error::Unsupported("reset")) }
    }

    /// Sets (`Some`) or clears (`None`) the limit of its own that `key`'s
    /// subject has in place of its rule's `count` and `burst`, for rules
    /// built [`with_subject_limits`](Rule::with_subject_limits) (the
    /// limiter checks `limit` against `rule` first). Kept until cleared.
    ///
    /// The default answers [`Error::Unsupported`].
    fn set_limit(
        &self,
        rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (rule, key, limit);
        async { Err(Error::Unsupported("subject limits")) }
    }

    /// Checks one call under several rules at once, all or nothing: if
    /// every rule allows it, it takes its cost from every rule (a
    /// `concurrency` rule's under the check's lease); if any refuses,
    /// nothing is taken from any. Answers each rule's decision, in the
    /// order given, as that rule found it (a rule that would have let the
    /// call through says `allowed` even when another refused it: the
    /// limiter tells the two apart). No two checks share a key.
    ///
    /// The built-in backends decide the whole set in one atomic step. The
    /// default is not atomic: it takes from each rule in turn, in the order
    /// of their keys, and if one refuses gives back what the others took
    /// ([`refund`](Backend::refund), [`release`](Backend::release)), so a
    /// concurrent call may be refused by units that are then given back,
    /// and a give-back that fails leaves its units counted until the
    /// rule's period passes.
    fn check_all(
        &self,
        checks: &[RuleCheck<'_>],
    ) -> impl Future<Output = Result<Vec<Decision>, Error>> + Send {
        async move {
            let mut order: Vec<usize> = (0..checks.len()).collect();
            order.sort_by_key(|&i| checks[i].key);
            let mut decisions = vec![None; checks.len()];
            for &i in &order {
                let c = &checks[i];
                let decision = if crate::algorithm::spec(c.rule.algorithm()).leases {
                    self.acquire(c.rule, c.key, c.cost, c.lease).await
                } else {
                    self.check(c.rule, c.key, c.cost).await
                };
                match decision {
                    Ok(decision) => decisions[i] = Some(decision),
                    Err(error) => {
                        give_back(self, checks, &decisions).await;
                        return Err(error);
                    }
                }
            }
            if decisions.iter().flatten().any(|d| !d.allowed) {
                give_back(self, checks, &decisions).await;
            }
            Ok(decisions.into_iter().flatten().collect())
        }
    }

    // The crate's own hooks: sealed (their argument cannot be named
    // outside the crate), so a backend of yours keeps these defaults.

    /// The answer to `call` when the store can give it at once, in
    /// process (the memory store): no future, no allocation.
    #[doc(hidden)]
    fn __answer_now(&self, _: Sealed, call: &BackendCall<'_>) -> Option<Answered> {
        let _ = call;
        None
    }

    /// Checks `call` (acquires, with a lease), with the stamp of what it
    /// charged and who answered.
    #[doc(hidden)]
    fn __answer(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
    ) -> impl Future<Output = Result<Answered, Error>> + Send {
        async move {
            let decision = match call.lease {
                Some(id) => self.acquire(call.rule, call.key, call.cost, id).await?,
                None => self.check(call.rule, call.key, call.cost).await?,
            };
            Ok(Answered::by_backend(decision, None))
        }
    }

    /// Gives `lease` back at once when it is held in process; `false` when
    /// it takes a call to the backend.
    #[doc(hidden)]
    fn __release_now(&self, _: Sealed, lease: &LeaseRef<'_>) -> bool {
        let _ = lease;
        false
    }

    /// Gives `lease` back, where it was taken.
    #[doc(hidden)]
    fn __release(
        &self,
        _: Sealed,
        lease: LeaseRef<'_>,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        self.release(lease.rule, lease.key, lease.cost, lease.id)
    }

    /// The round trip a failed call failed in, so that the breaker counts
    /// a round trip shared by several calls once.
    #[doc(hidden)]
    fn __round_trip(&self, _: Sealed, error: &Error) -> RoundTrip {
        let _ = error;
        RoundTrip::Other
    }

    /// Reserves `call` for a caller that may wait up to `max_wait` (see
    /// [`RateLimiter::until_ready`](crate::RateLimiter::until_ready)),
    /// answered at once where the store is in process; `None` when it
    /// takes a call to the backend.
    #[doc(hidden)]
    fn __reserve_now(
        &self,
        _: Sealed,
        call: &BackendCall<'_>,
        max_wait: std::time::Duration,
    ) -> Option<Result<Reserved, Error>> {
        let _ = (call, max_wait);
        None
    }

    /// Reserves `call` for a caller that may wait up to `max_wait`. A
    /// backend of yours cannot: [`Error::Unsupported`].
    #[doc(hidden)]
    fn __reserve(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
        max_wait: std::time::Duration,
    ) -> impl Future<Output = Result<Reserved, Error>> + Send {
        let _ = (call, max_wait);
        async { Err(Error::Unsupported("waiting its turn on a custom backend")) }
    }

    /// Gives back a reservation that waits, at once where it is held in
    /// process; `false` when it takes a call to the backend.
    #[doc(hidden)]
    fn __cancel_now(&self, _: Sealed, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool {
        let _ = (rule, key, cost, ticket);
        false
    }

    /// Gives back a reservation that waits, where it was made.
    #[doc(hidden)]
    fn __cancel(
        &self,
        _: Sealed,
        rule: &Rule,
        key: &str,
        cost: u64,
        ticket: Ticket,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (rule, key, cost, ticket);
        async { Ok(()) }
    }

    /// The store's name, for [`RateLimiter::backend_name`](crate::RateLimiter::backend_name).
    #[doc(hidden)]
    fn __name(&self, _: Sealed) -> &'static str {
        "custom"
    }

    /// Checks a set all or nothing ([`check_all`](Backend::check_all)),
    /// with each rule's stamp and who answered; `on_error` is the set's
    /// failure policy (the failover's).
    #[doc(hidden)]
    fn __answer_all(
        &self,
        _: Sealed,
        checks: &[RuleCheck<'_>],
        on_error: OnError,
    ) -> impl Future<Output = Result<Vec<Answered>, Error>> + Send {
        let _ = on_error;
        async move {
            let decisions = self.check_all(checks).await?;
            if decisions.len() != checks.len() {
                return Err(Error::Unsupported(
                    "a custom backend's check_all answered another number of decisions",
                ));
            }
            Ok(decisions
                .into_iter()
                .map(|d| Answered::by_backend(d, None))
                .collect())
        }
    }
}

/// Gives back what the allowed checks of a set took (the default
/// [`Backend::check_all`] after a refusal).
async fn give_back<B: Backend + ?Sized>(
    backend: &B,
    checks: &[RuleCheck<'_>],
    decisions: &[Option<Decision>],
) {
    for (c, decision) in checks.iter().zip(decisions) {
        if !decision.is_some_and(|d| d.allowed) {
            continue;
        }
        let given = if crate::algorithm::spec(c.rule.algorithm()).leases {
            backend.release(c.rule, c.key, c.cost, c.lease).await
        } else {
            let charge = Charge::new(c.cost, None, false);
            backend.refund(c.rule, c.key, charge).await.map(drop)
        };
        if let Err(error) = given {
            tracing::warn!(%error, "could not give back a refused set's units; they stay counted");
        }
    }
}

/// One rule's part of a call checked under several rules at once
/// ([`Backend::check_all`], [`RateLimiter::check_all`](crate::RateLimiter::check_all)).
#[derive(Clone, Copy, Debug)]
pub struct RuleCheck<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// The key of its budget.
    pub key: &'a str,
    /// The units the call takes from it (`1..=rule.capacity()`).
    pub cost: u64,
    /// The lease id of a `concurrency` rule's units (0 for the others).
    pub lease: u64,
}

/// A key held by value, in place when short (up to 22 bytes; 24 in all, so
/// that a store's entry fits one cache line): a store's entry keeps one, so
/// a lookup does not chase a pointer, and so does a check queued for a Redis
/// batch, so queueing it allocates nothing for its key.
#[derive(Clone, Debug)]
pub(crate) enum StoredKey {
    Inline(u8, [u8; INLINE_KEY]),
    Heap(Box<str>),
}

pub(crate) const INLINE_KEY: usize = 22;

impl StoredKey {
    pub(crate) fn new(key: &str) -> StoredKey {
        let bytes = key.as_bytes();
        if bytes.len() <= INLINE_KEY {
            let mut inline = [0; INLINE_KEY];
            inline[..bytes.len()].copy_from_slice(bytes);
            StoredKey::Inline(bytes.len() as u8, inline)
        } else {
            StoredKey::Heap(key.into())
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            StoredKey::Inline(len, bytes) => &bytes[..usize::from(*len)],
            StoredKey::Heap(stored) => stored.as_bytes(),
        }
    }

    pub(crate) fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }
}
