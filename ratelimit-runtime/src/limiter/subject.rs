//! Subjects' own limits: [`RateLimiter::set_subject_limit`] and
//! [`RateLimiter::set_subject_limit_named`].

use super::RateLimiter;
use crate::error::Error;
use crate::registry;
use crate::rule::{Rule, SubjectLimit};

impl RateLimiter {
    /// Sets (`Some`) or clears (`None`) the limit that `key`'s subject has
    /// of its own under `rule`, in place of the rule's `count` and `burst`
    /// (the period stays the rule's). Only a rule built
    /// [`with_subject_limits`](Rule::with_subject_limits) (`subject_limits`
    /// in the attribute) reads it. It holds until cleared, whatever the
    /// rule's overrides.
    ///
    /// On Redis it is kept in Redis, for every instance at once: the check's
    /// own script reads it, so a change holds from the next check on. It is
    /// a hash beside the budget's key, which `redis-cli` can write too (see
    /// the README's "Limits per subject"). In process memory the limiter
    /// keeps it (and, on Redis, its insurance limiter, for the failure
    /// policy `local`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::{RateLimiter, Rule, SubjectLimit};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// const API: Rule = Rule::fixed_window(2, Duration::from_secs(60)).with_subject_limits();
    /// let limiter = RateLimiter::in_memory();
    /// limiter.set_subject_limit(&API, "api:tenant:42", Some(SubjectLimit::new(5))).await?;
    /// let decision = limiter.check(&API, "api:tenant:42").await?;
    /// assert_eq!((decision.limit, decision.remaining), (5, 4));
    /// assert_eq!(limiter.check(&API, "api:tenant:7").await?.limit, 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if the rule does not read subject limits or the
    /// limit does not fit it (a count or burst of 0 or over
    /// [`Rule::MAX_COUNT`], a bucket's burst × period over
    /// [`Rule::MAX_BURST_PERIOD_US`]); [`Error::Backend`] if Redis did not
    /// answer (nothing of the failure policy applies: this is an operator's
    /// call); [`Error::Unsupported`] from a backend of yours without
    /// [`Backend::set_limit`](crate::Backend::set_limit).
    pub async fn set_subject_limit(
        &self,
        rule: &Rule,
        key: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        if !rule.reads_subject_limits() {
            return Err(Error::Config(
                "this rule does not read subjects' own limits: build it with \
                 `.with_subject_limits()` (or `subject_limits` in #[rate_limit])"
                    .into(),
            ));
        }
        if let Some(limit) = &limit {
            rule.limited_to(limit)
                .map_err(|why| Error::Config(format!("a subject's own limit: {why}")))?;
        }
        self.store.set_limit(rule, key, limit).await
    }

    /// [`set_subject_limit`](RateLimiter::set_subject_limit) by the rule's
    /// name and the subject, as [`reset_named`](RateLimiter::reset_named)
    /// addresses a budget (`"arg:tenant:42"`, `"ip:1.2.3.4"`): for every
    /// rule of that name.
    ///
    /// # Errors
    ///
    /// As [`reset_named`](RateLimiter::reset_named) and
    /// [`set_subject_limit`](RateLimiter::set_subject_limit).
    pub async fn set_subject_limit_named(
        &self,
        name: &str,
        subject: &str,
        limit: Option<SubjectLimit>,
    ) -> Result<(), Error> {
        for (rule, key) in registry::named(name, subject)? {
            self.set_subject_limit(&rule, &key, limit).await?;
        }
        Ok(())
    }
}
