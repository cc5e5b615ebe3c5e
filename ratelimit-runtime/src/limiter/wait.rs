//! Waiting its turn: [`RateLimiter::until_ready`]. A call the rule would
//! refuse reserves the first slot it may have, in one atomic step of the
//! store (one round trip to Redis), and sleeps until then: nothing polls,
//! and callers of every process are served in the order they reserved.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use once_cell::sync::OnceCell;

use super::store::Store;
use super::{Permit, RateLimiter, validate_cost};
use crate::backend::hook::{BackendCall, Reserved, Ticket};
use crate::decision::Decision;
use crate::error::{Error, OnError};
use crate::rule::Rule;

impl RateLimiter {
    /// Waits until `cost` units of `key`'s budget under `rule` may be
    /// taken, for at most `max_wait`, then takes them: the allowed
    /// [`Decision`] of a call that may go now. A call that cannot go within
    /// `max_wait` is refused at once (`allowed: false`, with its
    /// `retry_after`), without sleeping.
    ///
    /// The wait is reserved, not polled: the store records the time the
    /// call may go, in the same atomic step that finds it (one round trip
    /// to Redis), so the next caller, in any process, queues behind it, and
    /// calls go in the order they reserved, spaced as the rule says. Only
    /// `gcra` and `token_bucket` rules can wait; a caller that goes away
    /// before its time (its future dropped, a timeout) gives back what it
    /// reserved (as golang.org/x/time/rate's `Reservation.Cancel`: all of
    /// it while nobody queued behind it, less what later reservations took
    /// after it, whose times stay, and nothing once its time has come).
    ///
    /// When the backend fails, the failure policy answers at once, as for
    /// [`check`](RateLimiter::check): `local` reserves in process memory,
    /// `allow` lets the call go without waiting, `deny` is the error.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const API: Rule = Rule::gcra(20, Duration::from_secs(1)).with_burst(1);
    /// let limiter = RateLimiter::in_memory();
    /// let start = Instant::now();
    /// for _ in 0..3 {
    ///     let go = limiter.until_ready(&API, "partner", 1, Duration::from_secs(1)).await?;
    ///     assert!(go.allowed);
    /// }
    /// assert!(start.elapsed() >= Duration::from_millis(100)); // 50 ms apart
    /// // A wait that cannot be met is refused at once.
    /// let late = limiter.until_ready(&API, "partner", 1, Duration::from_millis(1)).await?;
    /// assert!(!late.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] under a window or concurrency rule (they keep
    /// no future slot to reserve) and on a custom backend (it keeps no
    /// turns; the attribute's `wait` checks its calls there without
    /// waiting);
    /// [`Error::InvalidCost`] as [`check_cost`](RateLimiter::check_cost);
    /// [`Error::Backend`] when the backend failed and the policy is `deny`.
    pub async fn until_ready(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Decision, Error> {
        let permit = self
            .wait_turn(
                rule,
                key,
                cost,
                max_wait,
                Duration::ZERO,
                self.on_error,
                None,
            )
            .await?;
        Ok(*permit.decision())
    }

    /// [`until_ready`](RateLimiter::until_ready), then a further random
    /// wait of up to `jitter` (as governor's `until_ready_with_jitter`), so
    /// that callers let go together do not all hit the next service at
    /// once. Only `max_wait` decides whether the call can wait; the jitter
    /// comes after it, never before its reserved time, so it never lets
    /// calls closer together than the rule.
    ///
    /// # Errors
    ///
    /// As [`until_ready`](RateLimiter::until_ready).
    pub async fn until_ready_with_jitter(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: Duration,
        jitter: Duration,
    ) -> Result<Decision, Error> {
        let permit = self
            .wait_turn(rule, key, cost, max_wait, jitter, self.on_error, None)
            .await?;
        Ok(*permit.decision())
    }

    /// Reserves and waits (see [`until_ready`](Self::until_ready)) under
    /// the failure policy `on_error`: the permit of the call, once it may
    /// go, or of its refusal. `name` labels the wait's metric.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn wait_turn(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: Duration,
        jitter: Duration,
        on_error: OnError,
        name: Option<&'static str>,
    ) -> Result<Permit, Error> {
        validate_cost(rule, cost)?;
        if crate::algorithm::spec(rule.algorithm()).wait.is_none() {
            return Err(Error::Unsupported(crate::backend::memory::UNWAITABLE));
        }
        let call = BackendCall {
            rule,
            key,
            cost,
            lease: None,
            on_error,
        };
        let Reserved {
            answered,
            wait,
            ticket,
        } = match self.store.reserve_now(&call, max_wait) {
            Some(reserved) => reserved?,
            None => self.store.reserve(call, max_wait).await?,
        };
        let permit = self.permit(rule, key, cost, None, answered);
        if !permit.decision().allowed {
            return Ok(permit);
        }
        let pause = wait + jittered(jitter);
        if !pause.is_zero() {
            let held = ticket.map(|ticket| Held {
                store: &self.store,
                rule,
                key,
                cost,
                ticket: Some(ticket),
            });
            tokio::time::sleep(pause).await;
            if let Some(mut held) = held {
                held.ticket = None;
            }
        }
        record(name, pause);
        Ok(permit)
    }
}

/// A reservation that waits, until its caller's time has come: dropped
/// before (its caller gone), it is given back.
struct Held<'a> {
    store: &'a Arc<dyn Store>,
    rule: &'a Rule,
    key: &'a str,
    cost: u64,
    ticket: Option<Ticket>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(ticket) = self.ticket.take() else {
            return;
        };
        if self
            .store
            .cancel_now(self.rule, self.key, self.cost, ticket)
        {
            return;
        }
        let (store, rule, key, cost) = (
            Arc::clone(self.store),
            *self.rule,
            self.key.to_owned(),
            self.cost,
        );
        // Where no runtime runs the reservation is left to pass unused.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(error) = store.cancel(&rule, &key, cost, ticket).await {
                    tracing::warn!(%error, "could not give back a cancelled wait; its slot passes unused");
                }
            });
        }
    }
}

/// A random wait of up to `jitter`.
fn jittered(jitter: Duration) -> Duration {
    if jitter.is_zero() {
        return Duration::ZERO;
    }
    static SEED: OnceCell<RandomState> = OnceCell::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let random = SEED
        .get_or_init(RandomState::new)
        .hash_one(NEXT.fetch_add(1, Ordering::Relaxed));
    let nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random % nanos.saturating_add(1))
}

/// The time a call that went spent waiting, in the histogram
/// `ratelimit_wait_seconds` (feature `metrics`; labelled with its rule's
/// name where the attribute waited).
fn record(name: Option<&'static str>, waited: Duration) {
    #[cfg(feature = "metrics")]
    match name {
        Some(rule) => ::metrics::histogram!("ratelimit_wait_seconds", "rule" => rule)
            .record(waited.as_secs_f64()),
        None => ::metrics::histogram!("ratelimit_wait_seconds").record(waited.as_secs_f64()),
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (name, waited);
}
