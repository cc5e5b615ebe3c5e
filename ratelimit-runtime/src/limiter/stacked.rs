//! One call under several rules: [`RateLimiter::check_all`] and
//! [`RateLimiter::acquire_all`], all or nothing.

use std::time::Duration;

use super::{Permit, RateLimiter, holds_leases, next_lease_id, validate_cost};
use crate::backend::RuleCheck;
use crate::backend::hook::Answered;
use crate::decision::{Decision, RateLimited};
use crate::error::{Error, OnError};
use crate::rule::Rule;

/// What [`RateLimiter::check_all`] answers: every rule's decision, in the
/// order the rules were given, and which refused the call.
///
/// The call passed (and took its cost from every rule) only if every rule
/// allowed it. If any refused, nothing was taken from any rule: then every
/// decision says `allowed == false`; a rule that would have let the call
/// through says what it has left (the call took nothing) with a zero
/// `retry_after`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    decisions: Vec<Decision>,
    refused: Option<usize>,
}

impl Verdict {
    /// Whether every rule allowed the call (and each was charged).
    pub fn allowed(&self) -> bool {
        self.refused.is_none()
    }

    /// Each rule's decision, in the order the rules were given.
    pub fn decisions(&self) -> &[Decision] {
        &self.decisions
    }

    /// The place of the rule that refused the call: of the rules that
    /// refused, the one with the longest `retry_after` (the first such).
    pub fn refused(&self) -> Option<usize> {
        self.refused
    }

    /// The denial of the refusing rule, if the call was refused.
    pub fn rate_limited(&self) -> Option<RateLimited> {
        Some(RateLimited::from_decision(&self.decisions[self.refused?]))
    }
}

/// What [`RateLimiter::acquire_all`] answers: every rule's [`Permit`], in
/// the order the rules were given, and which refused the call. Holding it
/// holds the leases of the set's `concurrency` rules (taken only when the
/// whole set passed); dropping it releases them.
#[derive(Debug)]
#[must_use = "dropping the permits releases their leases at once"]
pub struct Permits {
    permits: Vec<Permit>,
    refused: Option<usize>,
}

impl Permits {
    /// Whether every rule allowed the call.
    pub fn allowed(&self) -> bool {
        self.refused.is_none()
    }

    /// Each rule's permit, in the order the rules were given.
    pub fn permits(&self) -> &[Permit] {
        &self.permits
    }

    /// The place of the rule that refused the call, as
    /// [`Verdict::refused`].
    pub fn refused(&self) -> Option<usize> {
        self.refused
    }

    /// The permits, to hold or release one by one.
    pub fn into_permits(self) -> Vec<Permit> {
        self.permits
    }

    /// Releases every lease now and waits until they are released; a
    /// lease whose release failed expires after its rule's period.
    pub async fn release_all(self) {
        for permit in self.permits {
            if let Err(error) = permit.release().await {
                tracing::debug!(%error, "could not release a concurrency lease; it will expire");
            }
        }
    }

    /// Each rule's decision, as [`RateLimiter::check_all`] answers them.
    pub fn verdict(&self) -> Verdict {
        Verdict {
            decisions: self.permits.iter().map(|p| *p.decision()).collect(),
            refused: self.refused,
        }
    }
}

impl RateLimiter {
    /// Checks one call under several rules at once, all or nothing: each
    /// `(rule, key, cost)` is a rule, the key of its budget and what the
    /// call takes from it. The call passes only if every rule allows it,
    /// and then takes from every rule; if any refuses, no rule is charged.
    /// In process memory and on Redis the whole set is decided in one
    /// atomic step (one script run on Redis; see the README for a cluster
    /// whose keys live on several masters).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const PER_USER: Rule = Rule::fixed_window(5, Duration::from_secs(60));
    /// const GLOBAL: Rule = Rule::fixed_window(3, Duration::from_secs(60));
    /// let limiter = RateLimiter::in_memory();
    /// let set = [(&PER_USER, "user:ann", 1), (&GLOBAL, "global", 1)];
    /// let passed = {
    ///     let mut passed = 0;
    ///     for _ in 0..10 {
    ///         passed += usize::from(limiter.check_all(&set).await?.allowed());
    ///     }
    ///     passed
    /// };
    /// assert_eq!(passed, 3);
    /// // The 7 refused calls took nothing from Ann's own budget.
    /// assert_eq!(limiter.peek(&PER_USER, "user:ann").await?.remaining, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::PermitRequired`] if a rule is a `concurrency` rule (use
    /// [`acquire_all`](RateLimiter::acquire_all)), and as
    /// [`acquire_all`](RateLimiter::acquire_all).
    pub async fn check_all(&self, checks: &[(&Rule, &str, u64)]) -> Result<Verdict, Error> {
        if checks.iter().any(|(rule, _, _)| holds_leases(rule)) {
            return Err(Error::PermitRequired);
        }
        Ok(self.acquire_all(checks).await?.verdict())
    }

    /// [`check_all`](RateLimiter::check_all) for the length of a call: the
    /// set's `concurrency` rules take their leases only if the whole set
    /// passes, and hold them until the [`Permits`] drop.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidCost`] for a cost of 0 or over its rule's capacity,
    /// [`Error::Config`] if two rules of the set share a key, and as
    /// [`check`](RateLimiter::check) when the backend fails (one failure
    /// policy for the whole set).
    pub async fn acquire_all(&self, checks: &[(&Rule, &str, u64)]) -> Result<Permits, Error> {
        self.acquire_all_with(checks, self.on_error).await
    }

    /// [`acquire_all`](RateLimiter::acquire_all) under the failure policy
    /// `on_error`.
    pub(crate) async fn acquire_all_with(
        &self,
        checks: &[(&Rule, &str, u64)],
        on_error: OnError,
    ) -> Result<Permits, Error> {
        for (i, (rule, key, cost)) in checks.iter().enumerate() {
            validate_cost(rule, *cost)?;
            if checks[..i].iter().any(|(_, k, _)| k == key) {
                return Err(Error::Config(
                    "two rules of one set share a key: give each rule its own name".into(),
                ));
            }
        }
        let checks: Vec<RuleCheck<'_>> = checks
            .iter()
            .map(|&(rule, key, cost)| RuleCheck {
                rule,
                key,
                cost,
                lease: if holds_leases(rule) {
                    next_lease_id()
                } else {
                    0
                },
            })
            .collect();
        let raw = self.store.answer_all(&checks, on_error).await?;
        let (settled, refused) = settle(&checks, raw);
        let permits = checks
            .iter()
            .zip(settled)
            .map(|(c, answer)| {
                let lease = holds_leases(c.rule).then_some(c.lease);
                self.permit(c.rule, c.key, c.cost, lease, answer)
            })
            .collect();
        Ok(Permits { permits, refused })
    }
}

/// Each rule's answer as the backend found it, made the set's: if any rule
/// refused, none was charged. The refusing rule: the one with the longest
/// `retry_after`.
fn settle(checks: &[RuleCheck<'_>], mut raw: Vec<Answered>) -> (Vec<Answered>, Option<usize>) {
    let mut refused: Option<(usize, Duration)> = None;
    for (i, answer) in raw.iter().enumerate() {
        let decision = &answer.decision;
        if !decision.allowed && refused.is_none_or(|(_, longest)| decision.retry_after > longest) {
            refused = Some((i, decision.retry_after));
        }
    }
    if refused.is_some() {
        for (answer, check) in raw.iter_mut().zip(checks) {
            let decision = &mut answer.decision;
            if decision.allowed {
                decision.allowed = false;
                decision.remaining = decision.remaining.saturating_add(check.cost);
                decision.retry_after = Duration::ZERO;
                answer.stamp = None;
            }
        }
    }
    (raw, refused.map(|(i, _)| i))
}
