//! [`Failover`]: what keeps a limiter up when its backend is not. It wraps
//! any [`Backend`] (Redis, or one of the crate's users) with a circuit
//! breaker and an insurance limiter in process memory, and answers a failed
//! call by the rule's failure policy.

#[cfg(feature = "redis")]
use std::sync::Arc;
use std::time::Duration;

use super::breaker::{Breaker, CircuitOpen};
use super::hook::{Answered, BackendCall, LeaseRef, Reserved, RoundTrip, Sealed, ServedBy, Ticket};
use super::memory::MemoryBackend;
#[cfg(feature = "redis")]
use super::over_limit::OverLimitCache;
use super::{Backend, RuleCheck};
use crate::decision::{Charge, Decision};
use crate::error::{Error, OnError};
use crate::rule::{Rule, SubjectLimit};

/// A backend, a circuit breaker in front of it, and the insurance limiter
/// that checks the same rules in process memory while it fails (policy
/// [`OnError::Local`]), so the service stays up and each instance still
/// enforces the limits.
///
/// Only [`Error::Backend`] fails over; other errors are the caller's. The
/// insurance limiter's leases and charges are given back to it, never to
/// the backend.
#[derive(Debug)]
pub(crate) struct Failover<B> {
    inner: B,
    insurance: MemoryBackend,
    breaker: Breaker,
    /// What the plain [`Backend`] calls do when the backend fails (the
    /// limiter passes each rule's own policy through the hooks).
    on_error: OnError,
    /// Keys the backend refused until a known time. It sits in front of the
    /// breaker (a refusal it answers neither takes a probe nor closes the
    /// circuit) and remembers only the backend's own refusals, never the
    /// insurance limiter's: the failover is where both are known.
    #[cfg(feature = "redis")]
    over_limit: Option<Arc<OverLimitCache>>,
}

impl<B: Backend> Failover<B> {
    /// `inner`, failing over to `insurance`, probing every `probe_interval`
    /// while its circuit is open; `on_error` for the plain [`Backend`] calls.
    pub(crate) fn new(
        inner: B,
        insurance: MemoryBackend,
        probe_interval: Duration,
        on_error: OnError,
    ) -> Failover<B> {
        let name = match inner.__name(Sealed::NEW) {
            "redis" => "Redis",
            _ => "the rate-limit backend",
        };
        Failover {
            inner,
            insurance,
            breaker: Breaker::new(name, probe_interval, false),
            on_error,
            #[cfg(feature = "redis")]
            over_limit: None,
        }
    }

    /// With an over-limit cache in front.
    #[cfg(feature = "redis")]
    pub(crate) fn with_over_limit(mut self, cache: Option<Arc<OverLimitCache>>) -> Failover<B> {
        self.over_limit = cache;
        self
    }

    /// Forgets what the over-limit cache knows of `key` under `rule`.
    fn forget(&self, rule: &Rule, key: &str) {
        #[cfg(feature = "redis")]
        if let Some(cache) = &self.over_limit {
            cache.forget(rule, key);
        }
        #[cfg(not(feature = "redis"))]
        let _ = (rule, key);
    }

    /// The backend's answer, timed, unless the circuit is open.
    async fn ask(&self, call: BackendCall<'_>) -> Result<Answered, Error> {
        if !self.breaker.allow() {
            return Err(Error::backend(CircuitOpen));
        }
        #[cfg(feature = "metrics")]
        let sent = std::time::Instant::now();
        let answer = self.inner.__answer(Sealed::NEW, call).await;
        #[cfg(feature = "metrics")]
        ::metrics::histogram!(
            "ratelimit_backend_seconds",
            "result" => if answer.is_ok() { "ok" } else { "error" }
        )
        .record(sent.elapsed().as_secs_f64());
        answer
    }

    /// `call` answered by the backend (or the over-limit cache); a failure
    /// of the backend is counted by the breaker, whose log names the
    /// failure policy `policy` will answer by, and returned as it is, not
    /// answered by that policy. A local quota's block sends its calls so:
    /// its failure is answered by the policy of the call it was for
    /// ([`by_policy`](Failover::by_policy)), not by a block handed out.
    pub(crate) async fn answer_or_fail(
        &self,
        call: BackendCall<'_>,
        policy: OnError,
    ) -> Result<Answered, Error> {
        #[cfg(feature = "redis")]
        let cache = self.over_limit.as_deref().filter(|_| call.lease.is_none());
        #[cfg(feature = "redis")]
        if let Some(decision) = cache.and_then(|c| c.refused(call.rule, call.key, call.cost)) {
            return Ok(Answered::by_backend(decision, None));
        }
        // The cache, with the time the request left (read only for it).
        #[cfg(feature = "redis")]
        let remembering = cache.map(|cache| (cache, std::time::Instant::now()));
        match self.ask(call).await {
            Ok(answer) => {
                self.breaker.succeeded();
                #[cfg(feature = "redis")]
                if let Some((cache, sent)) = remembering
                    && answer.by == ServedBy::Backend
                {
                    cache.remember(call.rule, call.key, call.cost, &answer.decision, sent);
                }
                Ok(answer)
            }
            Err(error @ Error::Backend(_)) => {
                if !matches!(&error, Error::Backend(e) if e.is::<CircuitOpen>()) {
                    let trip = self.inner.__round_trip(Sealed::NEW, &error);
                    self.breaker.failed(trip, &error, policy);
                }
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// `call` answered by its failure policy alone, for a failure the
    /// breaker has counted already (a local quota's block that failed: the
    /// call is not sent again).
    pub(crate) fn by_policy(
        &self,
        call: &BackendCall<'_>,
        error: Error,
    ) -> Result<Answered, Error> {
        match call.on_error {
            OnError::Local => {
                let mut answer = self.insurance.answer(call);
                answer.by = ServedBy::Insurance;
                Ok(answer)
            }
            OnError::Allow => Ok(Answered::unchecked(call.rule)),
            OnError::Deny => Err(error),
        }
    }
}

impl<B: Backend> Backend for Failover<B> {
    async fn check(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        let call = BackendCall {
            rule,
            key,
            cost,
            lease: None,
            on_error: self.on_error,
        };
        Ok(self.__answer(Sealed::NEW, call).await?.decision)
    }

    async fn acquire(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
        lease: u64,
    ) -> Result<Decision, Error> {
        let call = BackendCall {
            rule,
            key,
            cost,
            lease: Some(lease),
            on_error: self.on_error,
        };
        Ok(self.__answer(Sealed::NEW, call).await?.decision)
    }

    /// Plain releases go to the backend: only the hooks know which leases
    /// the insurance limiter holds.
    async fn release(&self, rule: &Rule, key: &str, cost: u64, lease: u64) -> Result<(), Error> {
        self.inner.release(rule, key, cost, lease).await
    }

    /// The backend's answer; no failure policy applies (this is an
    /// operator's question).
    async fn peek(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.inner.peek(rule, key).await
    }

    /// Gives back where the charge was taken: the insurance limiter's in
    /// process, the backend's there.
    async fn refund(&self, rule: &Rule, key: &str, charge: Charge) -> Result<Decision, Error> {
        if charge.local {
            return self.insurance.refund_now(rule, key, &charge);
        }
        let decision = self.inner.refund(rule, key, charge).await;
        self.forget(rule, key);
        decision
    }

    /// Sets it in the insurance limiter too (which answers for the
    /// backend while it is down), and forgets what the over-limit cache
    /// knows of the key: a refusal under the old limit may not hold.
    async fn set_limit(
        &self,
        rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        self.insurance.set_limit_now(key, limit);
        let set = self.inner.set_limit(rule, key, limit).await;
        self.forget(rule, key);
        set
    }

    /// Forgets the key in the insurance limiter too.
    async fn reset(&self, rule: &Rule, key: &str) -> Result<Decision, Error> {
        self.insurance.reset_now(rule, key);
        let decision = self.inner.reset(rule, key).await;
        self.forget(rule, key);
        decision
    }

    async fn __answer(&self, _: Sealed, call: BackendCall<'_>) -> Result<Answered, Error> {
        match self.answer_or_fail(call, call.on_error).await {
            Err(error @ Error::Backend(_)) => self.by_policy(&call, error),
            answer => answer,
        }
    }

    /// A set under the one policy of a single check: the circuit breaker,
    /// the insurance limiter for `on_error = local`, allow or deny.
    async fn __answer_all(
        &self,
        _: Sealed,
        checks: &[RuleCheck<'_>],
        on_error: OnError,
    ) -> Result<Vec<Answered>, Error> {
        let answer = if self.breaker.allow() {
            self.inner.__answer_all(Sealed::NEW, checks, on_error).await
        } else {
            Err(Error::backend(CircuitOpen))
        };
        match answer {
            Ok(answers) => {
                self.breaker.succeeded();
                Ok(answers)
            }
            Err(error @ Error::Backend(_)) => {
                if !matches!(&error, Error::Backend(e) if e.is::<CircuitOpen>()) {
                    let trip = self.inner.__round_trip(Sealed::NEW, &error);
                    self.breaker.failed(trip, &error, on_error);
                }
                match on_error {
                    OnError::Local => {
                        let mut answers = self.insurance.answer_all(checks);
                        for answer in &mut answers {
                            answer.by = ServedBy::Insurance;
                        }
                        Ok(answers)
                    }
                    OnError::Allow => {
                        Ok(checks.iter().map(|c| Answered::unchecked(c.rule)).collect())
                    }
                    OnError::Deny => Err(error),
                }
            }
            Err(error) => Err(error),
        }
    }

    fn __release_now(&self, _: Sealed, lease: &LeaseRef<'_>) -> bool {
        if lease.insurance {
            return self.insurance.__release_now(Sealed::NEW, lease);
        }
        self.inner.__release_now(Sealed::NEW, lease)
    }

    async fn __release(&self, _: Sealed, lease: LeaseRef<'_>) -> Result<(), Error> {
        if self.__release_now(Sealed::NEW, &lease) {
            return Ok(());
        }
        self.inner.__release(Sealed::NEW, lease).await
    }

    /// A reservation under the failure policy, at once when the backend
    /// fails: the insurance limiter reserves in process (`local`), the call
    /// goes unchecked (`allow`) or the error is the caller's (`deny`). The
    /// over-limit cache is not asked: a refused key may still be reserved.
    async fn __reserve(
        &self,
        _: Sealed,
        call: BackendCall<'_>,
        max_wait: Duration,
    ) -> Result<Reserved, Error> {
        let answer = if self.breaker.allow() {
            self.inner.__reserve(Sealed::NEW, call, max_wait).await
        } else {
            Err(Error::backend(CircuitOpen))
        };
        match answer {
            Ok(reserved) => {
                self.breaker.succeeded();
                Ok(reserved)
            }
            Err(error @ Error::Backend(_)) => {
                if !matches!(&error, Error::Backend(e) if e.is::<CircuitOpen>()) {
                    let trip = self.inner.__round_trip(Sealed::NEW, &error);
                    self.breaker.failed(trip, &error, call.on_error);
                }
                match call.on_error {
                    OnError::Local => {
                        let mut reserved = self.insurance.reserve(&call, max_wait)?;
                        reserved.answered.by = ServedBy::Insurance;
                        if let Some(ticket) = &mut reserved.ticket {
                            ticket.insurance = true;
                        }
                        Ok(reserved)
                    }
                    OnError::Allow => Ok(Reserved::at_once(Answered::unchecked(call.rule))),
                    OnError::Deny => Err(error),
                }
            }
            // The store keeps no turns: nothing reached it, so the probe
            // the breaker gave this call goes to the next one.
            Err(error @ Error::Unsupported(_)) => {
                self.breaker.forgo_probe();
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    fn __cancel_now(&self, _: Sealed, rule: &Rule, key: &str, cost: u64, ticket: Ticket) -> bool {
        if ticket.insurance {
            self.insurance.cancel_now(rule, key, cost, ticket);
            return true;
        }
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
        if self.__cancel_now(Sealed::NEW, rule, key, cost, ticket) {
            return Ok(());
        }
        let cancelled = self
            .inner
            .__cancel(Sealed::NEW, rule, key, cost, ticket)
            .await;
        self.forget(rule, key);
        cancelled
    }

    fn __round_trip(&self, _: Sealed, error: &Error) -> RoundTrip {
        self.inner.__round_trip(Sealed::NEW, error)
    }

    fn __name(&self, _: Sealed) -> &'static str {
        self.inner.__name(Sealed::NEW)
    }
}
