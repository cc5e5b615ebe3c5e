//! Hooks for this repository's tests (feature `testing`, not a stable API):
//! a [`RedisBackend`]'s calls as if the server's clock read a given time, so
//! tests hold the Redis and the memory backend side by side, and batches of
//! one check.

use std::time::Duration;

use super::RedisBackend;
use super::codec::{Op, TimeSource};
use crate::algorithm::Reservation;
use crate::backend::RuleCheck;
use crate::backend::hook::Ticket;
use crate::backend::memory::MemoryBackend;
use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::rule::Rule;

/// A [`RedisBackend`]'s calls on a fixed time (µs since the Unix epoch, as
/// `now`). Keys written this way get an hour's extra TTL, since their times
/// are not the server's. For this repository's tests only (feature
/// `testing`): it may change or go in any release.
#[allow(async_fn_in_trait)]
pub trait RedisTestHooks: Sized {
    /// [`Backend::check`](crate::Backend::check) as if the server's clock
    /// read `now` (time since the Unix epoch).
    async fn check_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Duration,
    ) -> Result<Decision, Error>;

    /// [`check_at`](Self::check_at), with what an allowed check charged (as
    /// [`MemoryBackend::charge_now`](crate::backend::memory::MemoryBackend::charge_now)).
    async fn charge_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Duration,
    ) -> Result<(Decision, Option<Charge>), Error>;

    /// [`Backend::acquire`](crate::Backend::acquire) as if the server's
    /// clock read `now`.
    async fn acquire_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
        now: Duration,
    ) -> Result<Decision, Error>;

    /// [`Backend::peek`](crate::Backend::peek) as if the server's clock
    /// read `now`.
    async fn peek_at(&self, rule: &Rule, key: &str, now: Duration) -> Result<Decision, Error>;

    /// [`Backend::refund`](crate::Backend::refund) as if the server's clock
    /// read `now`.
    async fn refund_at(
        &self,
        rule: &Rule,
        key: &str,
        charge: &Charge,
        now: Duration,
    ) -> Result<Decision, Error>;

    /// [`Backend::reset`](crate::Backend::reset) as if the server's clock
    /// read `now`.
    async fn reset_at(&self, rule: &Rule, key: &str, now: Duration) -> Result<Decision, Error>;

    /// [`Backend::check_all`](crate::Backend::check_all) as if the server's
    /// clock read `now`.
    async fn check_all_at(
        &self,
        checks: &[RuleCheck<'_>],
        now: Duration,
    ) -> Result<Vec<Decision>, Error>;

    /// A call that may wait up to `max_wait` (see
    /// [`RateLimiter::until_ready`](crate::RateLimiter::until_ready)),
    /// reserved as if the server's clock read `now`: its decision, its wait
    /// and, when it waits, the reservation that [`cancel_at`](Self::cancel_at)
    /// names.
    async fn reserve_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: Duration,
        now: Duration,
    ) -> Result<WaitAnswer, Error>;

    /// Gives back a reservation as if the server's clock read `now`, then
    /// answers as a peek.
    async fn cancel_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        reservation: (u64, u64),
        now: Duration,
    ) -> Result<Decision, Error>;

    /// Every check joins a batch, even when nothing is on its way (for
    /// tests of the batch script; without it, checks made one after another
    /// each go alone).
    fn batch_every_check(self) -> Self;
}

/// A reservation's answer: the decision, the wait, and when it waits, the
/// reservation (when it was made, µs, and its position).
pub type WaitAnswer = (Decision, Duration, Option<(u64, u64)>);

/// [`RedisTestHooks::reserve_at`] on the memory store, on its clock.
pub fn memory_reserve(
    store: &MemoryBackend,
    rule: &Rule,
    key: &str,
    cost: u64,
    max_wait: Duration,
) -> Result<WaitAnswer, Error> {
    let (reservation, now) = store
        .reserve_now(rule, key, cost, max_wait)
        .ok_or(Error::Unsupported(crate::backend::memory::UNWAITABLE))?;
    Ok(answer(rule, reservation, Some(now)))
}

/// [`RedisTestHooks::cancel_at`] on the memory store, on its clock.
pub fn memory_cancel(
    store: &MemoryBackend,
    rule: &Rule,
    key: &str,
    cost: u64,
    (at, position): (u64, u64),
) -> Decision {
    let ticket = Ticket {
        at,
        position,
        insurance: false,
    };
    store.cancel_now(rule, key, cost, ticket);
    store.peek_now(rule, key)
}

fn answer(rule: &Rule, reservation: Reservation, now: Option<u64>) -> WaitAnswer {
    let wait = reservation.wait_us;
    (
        reservation.outcome.decision(rule),
        Duration::from_micros(wait),
        now.filter(|_| wait > 0)
            .map(|at| (at, reservation.position)),
    )
}

fn fixed(now: Duration) -> TimeSource {
    TimeSource::Fixed(u64::try_from(now.as_micros()).unwrap_or(u64::MAX))
}

impl RedisTestHooks for RedisBackend {
    async fn check_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Duration,
    ) -> Result<Decision, Error> {
        Ok(self.charge_at(rule, key, cost, now).await?.0)
    }

    async fn charge_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        now: Duration,
    ) -> Result<(Decision, Option<Charge>), Error> {
        let (decision, stamp) = self.eval(rule, key, cost, fixed(now), None).await?;
        let charge = decision.allowed.then(|| Charge::new(cost, stamp, false));
        Ok((decision, charge))
    }

    async fn acquire_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
        now: Duration,
    ) -> Result<Decision, Error> {
        Ok(self.eval(rule, key, cost, fixed(now), Some(lease)).await?.0)
    }

    async fn peek_at(&self, rule: &Rule, key: &str, now: Duration) -> Result<Decision, Error> {
        let op = Op::Peek(rule.algorithm());
        self.look(op, rule, key, 1, fixed(now), None).await
    }

    async fn refund_at(
        &self,
        rule: &Rule,
        key: &str,
        charge: &Charge,
        now: Duration,
    ) -> Result<Decision, Error> {
        self.refund_on(rule, key, charge, fixed(now)).await
    }

    async fn reset_at(&self, rule: &Rule, key: &str, now: Duration) -> Result<Decision, Error> {
        let op = Op::Reset(rule.algorithm());
        self.look(op, rule, key, 1, fixed(now), None).await
    }

    async fn check_all_at(
        &self,
        checks: &[RuleCheck<'_>],
        now: Duration,
    ) -> Result<Vec<Decision>, Error> {
        let answers = self.check_all_on(checks, fixed(now)).await?;
        Ok(answers.into_iter().map(|(decision, _)| decision).collect())
    }

    async fn reserve_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        max_wait: Duration,
        now: Duration,
    ) -> Result<WaitAnswer, Error> {
        let max_wait = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let (reservation, at) = self
            .reserve_on(rule, key, cost, max_wait, fixed(now))
            .await?;
        Ok(answer(rule, reservation, at))
    }

    async fn cancel_at(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        reservation: (u64, u64),
        now: Duration,
    ) -> Result<Decision, Error> {
        self.cancel_on(rule, key, cost, reservation, fixed(now))
            .await
    }

    fn batch_every_check(mut self) -> RedisBackend {
        self.always_queue = true;
        self
    }
}
