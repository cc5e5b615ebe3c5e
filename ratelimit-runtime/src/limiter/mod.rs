//! The [`RateLimiter`] handle: where budgets are kept, and what happens when
//! that store fails. [`builder`] builds one, [`install`] makes it the global
//! or a named limiter, [`permit`] holds a call's decision and lease.

mod builder;
mod install;
mod permit;
mod stacked;
mod store;
mod subject;
mod wait;

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use once_cell::sync::OnceCell;

pub use builder::RateLimiterBuilder;
pub use permit::Permit;
pub use stacked::{Permits, Verdict};

use crate::backend::hook::{Answered, BackendCall, ServedBy};
use crate::backend::memory::MemoryBackend;
use crate::clock::Clock;
use crate::decision::{Charge, Decision};
use crate::error::{Error, OnError};
use crate::rule::Rule;
use crate::secret::KeySecret;
use permit::HeldLease;
use store::Store;

/// A rate limiter: a backend to keep budgets in, and what to do when it fails.
///
/// Cheap to clone (clones share everything). Build one at start-up with
/// [`RateLimiter::builder`], then [`install`](RateLimiter::install) it as the
/// global limiter that `#[rate_limit]` uses. With nothing installed, an
/// in-memory limiter serves.
///
/// ```no_run
/// use ratelimit_runtime::RateLimiter;
///
/// # async fn start() -> Result<(), ratelimit_runtime::Error> {
/// RateLimiter::builder()
///     .redis("redis://127.0.0.1:6379")
///     .build()
///     .await?
///     .install()?;
/// # Ok(()) }
/// ```
///
/// It can also be asked directly:
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{RateLimiter, Rule};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
/// const LOGIN: Rule = Rule::fixed_window(2, Duration::from_secs(60));
/// let limiter = RateLimiter::in_memory();
/// assert!(limiter.check(&LOGIN, "login:alice").await?.allowed);
/// assert!(limiter.check(&LOGIN, "login:alice").await?.allowed);
/// let third = limiter.check(&LOGIN, "login:alice").await?;
/// assert!(!third.allowed);
/// // The window started at the first call, a moment ago.
/// assert!(third.retry_after > Duration::from_secs(59));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimiter {
    /// The backend: the memory store, or a [`Failover`](crate::backend::Failover)
    /// around Redis or a backend of the application's.
    store: Arc<dyn Store>,
    on_error: OnError,
    shadow: bool,
    /// The secret of the keyed digests in its keys (its `Debug` is redacted).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    secret: KeySecret,
    /// The task that reads the fleet's overrides for it, stopped when the
    /// last clone is dropped.
    #[cfg(feature = "redis")]
    #[allow(dead_code)]
    fleet: Option<Arc<crate::overrides::fleet::Feed>>,
}

impl RateLimiter {
    /// Starts building a limiter; see [`RateLimiterBuilder`].
    pub fn builder() -> RateLimiterBuilder {
        RateLimiterBuilder::default()
    }

    /// An in-process limiter on the system clock: the embedded default.
    pub fn in_memory() -> RateLimiter {
        RateLimiter::from_store(Arc::new(MemoryBackend::new()))
    }

    /// An in-process limiter on the given clock (a [`ManualClock`](crate::ManualClock)
    /// in tests, so they advance time instead of sleeping).
    pub fn in_memory_with_clock(clock: impl Clock) -> RateLimiter {
        RateLimiter::from_store(Arc::new(MemoryBackend::with_clock(clock)))
    }

    fn from_store(store: Arc<dyn Store>) -> RateLimiter {
        RateLimiter {
            store,
            on_error: OnError::default(),
            shadow: false,
            secret: KeySecret::Process,
            #[cfg(feature = "redis")]
            fleet: None,
        }
    }

    /// The secret of the keyed digests that stand for header values (and
    /// client addresses, if the options say so) in this limiter's keys;
    /// [`Error::Config`] when its store is shared and none was chosen (see
    /// [`RateLimiterBuilder::key_secret`]).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn key_secret(&self) -> Result<&[u8], Error> {
        self.secret.bytes()
    }

    /// Whether this limiter's store is shared and it has no key secret, so
    /// requests whose keys need a digest are refused.
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn lacks_key_secret(&self) -> bool {
        self.secret.is_missing()
    }

    /// Whether every rule on this limiter is in shadow mode (checked and
    /// recorded, never refusing): [`RateLimiterBuilder::shadow`].
    pub fn is_shadow(&self) -> bool {
        self.shadow
    }

    /// What this limiter does with a call when its backend fails
    /// ([`RateLimiterBuilder::on_backend_error`]; a rule may say otherwise).
    pub fn on_backend_error(&self) -> OnError {
        self.on_error
    }

    /// The name of the backend: `"memory"`, `"redis"` or `"custom"`.
    pub fn backend_name(&self) -> &'static str {
        self.store.name()
    }

    /// Checks and consumes one unit of `key`'s budget under `rule`.
    ///
    /// Being over the limit is not an error: it is a [`Decision`] with
    /// `allowed == false`.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if the backend failed and the limiter's policy is
    /// [`OnError::Deny`] (with `Local`, the default, the same rule is checked
    /// in process memory instead; with `Allow`, the call is allowed), and
    /// [`Error::PermitRequired`] for a `concurrency` rule.
    pub async fn check(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.check_cost(rule, key, 1).await
    }

    /// Checks and consumes `cost` units of `key`'s budget under `rule`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCost`] if `cost` is 0 or over the rule's capacity (such
    /// a call could never pass), and as [`check`](RateLimiter::check).
    pub async fn check_cost(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        if holds_leases(rule) {
            return Err(Error::PermitRequired);
        }
        let permit = self.acquire_with(rule, key, cost, self.on_error).await?;
        Ok(*permit.decision())
    }

    /// Checks and consumes `cost` units of `key`'s budget under `rule`, for
    /// the length of a call: the returned [`Permit`] holds them for a
    /// `concurrency` rule until it is dropped or
    /// [released](Permit::release) (for the other algorithms it holds nothing).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const EXPORTS: Rule = Rule::concurrency(1, Duration::from_secs(60));
    /// let limiter = RateLimiter::in_memory();
    /// let first = limiter.acquire(&EXPORTS, "exports", 1).await?;
    /// assert!(first.decision().allowed);
    /// assert!(!limiter.acquire(&EXPORTS, "exports", 1).await?.decision().allowed);
    /// drop(first); // the call ended: its lease is released
    /// assert!(limiter.acquire(&EXPORTS, "exports", 1).await?.decision().allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check_cost`](RateLimiter::check_cost), and [`Error::Unsupported`]
    /// from a custom backend without concurrency support.
    pub async fn acquire(&self, rule: &Rule, key: &str, cost: u64) -> Result<Permit, Error> {
        self.acquire_with(rule, key, cost, self.on_error).await
    }

    /// What the next check of `key` under `rule` would answer (at cost 1;
    /// for a concurrency rule, the next acquire), without consuming
    /// anything: its `remaining`, `reset_after` and `retry_after` are the
    /// ones that check would get.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const LOGIN: Rule = Rule::fixed_window(2, Duration::from_secs(60));
    /// let limiter = RateLimiter::in_memory();
    /// limiter.check(&LOGIN, "login:alice").await?;
    /// let next = limiter.peek(&LOGIN, "login:alice").await?;
    /// assert!(next.allowed);
    /// assert_eq!(next.remaining, 0); // after that next call
    /// // Nothing consumed: the next check is that one.
    /// assert!(limiter.check(&LOGIN, "login:alice").await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if the backend failed (no failure policy applies:
    /// this is an operator's question), [`Error::Unsupported`] from a custom
    /// backend without it.
    pub async fn peek(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.store.peek(rule, key).await
    }

    /// Gives back what a call took from `key`'s budget under `rule`
    /// ([`Permit::charge`]), for example when the call it paid for failed
    /// downstream, then answers as [`peek`](RateLimiter::peek). It gives
    /// back only where the charge is still counted: the same fixed window,
    /// the sliding window's count that holds it, the sliding log's own
    /// entry, the bucket it was taken from; after a reset, in a later
    /// window, or once a bucket was full again, it gives nothing; nor does a
    /// sliding log's refund with more than 1,024 calls to rewrite (its own
    /// and the ones logged after it). What it means per algorithm is on
    /// [`Backend::refund`](crate::Backend::refund).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const SEND: Rule = Rule::fixed_window(1, Duration::from_secs(60));
    /// let limiter = RateLimiter::in_memory();
    /// let permit = limiter.acquire(&SEND, "sms:bob", 1).await?;
    /// assert!(permit.decision().allowed);
    /// // The SMS gateway failed: the call should not count.
    /// let charge = permit.charge().expect("an allowed call");
    /// limiter.refund(&SEND, "sms:bob", charge).await?;
    /// assert!(limiter.check(&SEND, "sms:bob").await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCost`] if the charge's units are over the rule's
    /// capacity (the rule was changed since), [`Error::Unsupported`] under a
    /// concurrency rule (drop or release the [`Permit`] instead), and as
    /// [`peek`](RateLimiter::peek). A refund that failed (it timed out) may
    /// still have been made by Redis: it is not retried, and a retry of
    /// yours may give the units back twice.
    pub async fn refund(&self, rule: &Rule, key: &str, charge: Charge) -> Result<Decision, Error> {
        validate_cost(rule, charge.units())?;
        self.store.refund(rule, key, charge).await
    }

    /// Forgets `key`'s state under `rule`, so its whole budget is there
    /// again (a concurrency rule's leases are dropped too), then answers
    /// as [`peek`](RateLimiter::peek). With Redis, the insurance limiter's
    /// state of the key is forgotten too.
    ///
    /// # Errors
    ///
    /// As [`peek`](RateLimiter::peek).
    pub async fn reset(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.store.reset(rule, key).await
    }

    /// [`acquire`](RateLimiter::acquire) under the failure policy `on_error`.
    ///
    /// A store in process memory answers at once; a backend's call is
    /// boxed, so the futures of in-memory checks stay small.
    pub(crate) async fn acquire_with(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        on_error: OnError,
    ) -> Result<Permit, Error> {
        validate_cost(rule, cost)?;
        let lease = holds_leases(rule).then(next_lease_id);
        let call = BackendCall {
            rule,
            key,
            cost,
            lease,
            on_error,
        };
        // `call` is moved into the backend's future, not kept beside it.
        let answer = match self.store.answer_now(&call) {
            Some(answer) => answer,
            None => self.store.answer(call).await?,
        };
        Ok(self.permit(rule, key, cost, lease, answer))
    }

    /// [`acquire_with`](Self::acquire_with) answered without waiting, when
    /// the store answers at once (process memory); `None` when the store
    /// must be awaited (nothing is checked then).
    pub(crate) fn acquire_now(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        on_error: OnError,
    ) -> Option<Result<Permit, Error>> {
        if let Err(error) = validate_cost(rule, cost) {
            return Some(Err(error));
        }
        let lease = holds_leases(rule).then(next_lease_id);
        let call = BackendCall {
            rule,
            key,
            cost,
            lease,
            on_error,
        };
        let answer = self.store.answer_now(&call)?;
        Some(Ok(self.permit(rule, key, cost, lease, answer)))
    }

    /// The permit for an answer: with a lease for an allowed concurrency
    /// call, else a charge for an allowed call.
    fn permit(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: Option<u64>,
        answer: Answered,
    ) -> Permit {
        let Answered {
            decision,
            stamp,
            by,
        } = answer;
        if by == ServedBy::Unchecked {
            return Permit::allowed_unchecked(rule);
        }
        let local = by == ServedBy::Insurance;
        let charge = (decision.allowed && lease.is_none()).then(|| Charge::new(cost, stamp, local));
        let lease = lease.filter(|_| decision.allowed).map(|id| {
            Box::new(HeldLease {
                store: Arc::clone(&self.store),
                rule: *rule,
                key: key.into(),
                cost,
                id,
                held_by_insurance: local,
                released: false,
            })
        });
        Permit {
            decision,
            lease,
            charge,
            local,
            unchecked: false,
        }
    }
}

/// Whether a call of `rule` holds its units until it ends (a lease).
fn holds_leases(rule: &Rule) -> bool {
    crate::algorithm::spec(rule.algorithm()).leases
}

fn validate_cost(rule: &Rule, cost: u64) -> Result<(), Error> {
    if cost == 0 || cost > rule.capacity() {
        return Err(Error::InvalidCost {
            cost,
            capacity: rule.capacity(),
        });
    }
    Ok(())
}

/// A lease id no other lease of this process, or (with 64 random bits)
/// of any other process, uses: a counter, hashed with a per-process seed.
fn next_lease_id() -> u64 {
    static SEED: OnceCell<RandomState> = OnceCell::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    SEED.get_or_init(RandomState::new).hash_one(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A custom backend with concurrency support: the units each lease
    /// holds, in a map.
    #[derive(Debug)]
    struct Leases(Arc<Mutex<HashMap<u64, u64>>>);

    impl Backend for Leases {
        async fn check(&self, _rule: &Rule, _key: &str, _cost: u64) -> Result<Decision, Error> {
            Err(Error::Unsupported("checks"))
        }

        async fn acquire(
            &self,
            rule: &Rule,
            _key: &str,
            cost: u64,
            lease: u64,
        ) -> Result<Decision, Error> {
            let mut held = self.0.lock().unwrap();
            let used: u64 = held.values().sum();
            let allowed = used + cost <= rule.count();
            if allowed {
                held.insert(lease, cost);
            }
            Ok(Decision {
                allowed,
                limit: rule.count(),
                remaining: rule.count() - used - if allowed { cost } else { 0 },
                reset_after: Duration::ZERO,
                retry_after: Duration::ZERO,
            })
        }

        async fn release(
            &self,
            _rule: &Rule,
            _key: &str,
            _cost: u64,
            lease: u64,
        ) -> Result<(), Error> {
            self.0.lock().unwrap().remove(&lease);
            Ok(())
        }
    }

    /// A dropped permit gives a custom backend's lease back from a task on
    /// the current runtime, with or without the `redis` feature; released
    /// explicitly, at once; dropped where no runtime runs, it is left held
    /// (to expire), and nothing panics.
    #[test]
    fn a_custom_backends_lease_is_released_when_its_permit_drops() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let held = Arc::new(Mutex::new(HashMap::new()));
        let limiter = runtime
            .block_on(RateLimiter::builder().backend(Leases(held.clone())).build())
            .unwrap();
        let rule = Rule::concurrency(2, Duration::from_secs(60));
        let units =
            |held: &Arc<Mutex<HashMap<u64, u64>>>| held.lock().unwrap().values().sum::<u64>();
        runtime.block_on(async {
            let first = limiter.acquire(&rule, "k", 1).await.unwrap();
            let second = limiter.acquire(&rule, "k", 1).await.unwrap();
            assert!(first.decision().allowed && second.decision().allowed);
            assert!(
                !limiter
                    .acquire(&rule, "k", 1)
                    .await
                    .unwrap()
                    .decision()
                    .allowed
            );
            assert_eq!(units(&held), 2);

            second.release().await.unwrap();
            assert_eq!(units(&held), 1, "released at once");

            drop(first);
            for _ in 0..100 {
                if units(&held) == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(units(&held), 0, "released by the dropped permit's task");
        });

        let outside = runtime.block_on(limiter.acquire(&rule, "k", 2)).unwrap();
        assert!(outside.decision().allowed);
        drop(outside);
        assert_eq!(units(&held), 2, "no runtime: left to expire");
    }

    /// No two leases share an id, across threads.
    #[test]
    fn lease_ids_are_unique_across_threads() {
        let per_thread = 10_000;
        let ids: Vec<u64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..3)
                .map(|_| s.spawn(|| (0..per_thread).map(|_| next_lease_id()).collect::<Vec<_>>()))
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect()
        });
        let distinct: std::collections::HashSet<u64> = ids.iter().copied().collect();
        assert_eq!(distinct.len(), 3 * per_thread);
    }
}
