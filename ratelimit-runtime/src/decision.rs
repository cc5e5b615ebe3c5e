//! What a check answers: [`Decision`], and the denial [`RateLimited`].

use std::fmt;
use std::time::Duration;

/// The outcome of one atomic check-and-consume.
///
/// The same sequence of calls and times gives the same `Decision`s on every
/// backend (to the millisecond: Redis expires keys in whole milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the call passed (and consumed its cost).
    pub allowed: bool,
    /// The rule's `count`: units allowed per period.
    pub limit: u64,
    /// Units left in the current period, after this call.
    pub remaining: u64,
    /// When the budget is whole again.
    pub reset_after: Duration,
    /// When the next call of the same cost can pass: zero if it can pass now.
    pub retry_after: Duration,
}

impl Decision {
    /// The denial this decision stands for, if it is one.
    pub fn rate_limited(&self) -> Option<RateLimited> {
        (!self.allowed).then(|| RateLimited::from_decision(self))
    }
}

/// What one allowed call took from its budget, from
/// [`Permit::charge`](crate::Permit::charge): its units, and what counted
/// them, so that [`RateLimiter::refund`](crate::RateLimiter::refund) gives
/// them back there and nowhere else: to the fixed window they were counted
/// in, to the sliding window's count that holds them, as the sliding log's
/// own entry, or into the bucket (token bucket, GCRA) they were taken from.
/// Once that has gone (a later window, a reset, a bucket full again, the
/// entry out of the window) a refund gives nothing back.
///
/// A refund that failed (a timeout, say) may still have been made: giving
/// the same charge back again may give its units back twice.
///
/// A state is told from the one it replaced by when it began, to the
/// microsecond: a reset and a new call within the microsecond of the
/// charged call (in process memory on a clock that stands still, say a
/// `ManualClock`) leave the new state taken for the charged one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    units: u64,
    stamp: Option<u64>,
    /// Counted by the in-process insurance limiter (the backend had failed).
    pub(crate) local: bool,
}

impl Charge {
    pub(crate) fn new(units: u64, stamp: Option<u64>, local: bool) -> Charge {
        Charge {
            units,
            stamp,
            local,
        }
    }

    /// The units taken: what a refund gives back.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// What counted them, in µs of the backend's clock: a fixed window's
    /// end, a sliding log entry's time, or (a sliding window, a bucket) the
    /// time of the call. `None` for a custom backend's charge: it is given
    /// the units alone.
    pub fn stamp(&self) -> Option<u64> {
        self.stamp
    }
}

/// Why a call was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// The key's budget is used up.
    OverLimit,
    /// The backend failed and the rule's failure policy is
    /// [`OnError::Deny`](crate::OnError::Deny): the limiter is broken, not the client.
    BackendUnavailable,
    /// A per-client rule could not tell who the client is (no usable
    /// address) and the limiter is set to refuse such requests.
    UnknownClient,
    /// The call's key needs what the limiter was not given: a key secret
    /// for the digests in keys of a store other instances share (see
    /// [`RateLimiterBuilder::key_secret`](crate::RateLimiterBuilder::key_secret)).
    /// The server is at fault, not the client (HTTP answers 500).
    Misconfigured,
}

/// The error of a call that was rate limited: what was exceeded, and when to
/// come back.
///
/// It implements [`std::error::Error`], so an application error type can wrap
/// it with `From<RateLimited>`; a fn returning `Result<T, E>` with
/// `E: From<RateLimited>` gets `Err(RateLimited.into())` from
/// `#[rate_limit]` when the limit is hit.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::RateLimited;
///
/// fn describe(limited: &RateLimited) -> String {
///     format!("{} of {} left, retry in {:?}", limited.remaining, limited.limit, limited.retry_after)
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RateLimited {
    /// The rule's `count`: units allowed per period.
    pub limit: u64,
    /// Units left in the current period (less than this call's cost).
    pub remaining: u64,
    /// When a call of the same cost can pass again.
    pub retry_after: Duration,
    /// When the budget is whole again.
    pub reset_after: Duration,
    /// Over the limit, or refused because the limiter's backend failed.
    pub cause: Cause,
    /// The rule's window (`period`), for rate-limit headers.
    pub period: Duration,
    /// The name of the rule that refused (an attribute's `key` as written,
    /// a middleware's [`name`](crate::RateLimit::name)), for rate-limit
    /// headers and logs.
    pub name: &'static str,
}

impl RateLimited {
    /// The denial described by a (rejecting) decision.
    pub fn from_decision(decision: &Decision) -> RateLimited {
        RateLimited {
            limit: decision.limit,
            remaining: decision.remaining,
            retry_after: decision.retry_after,
            reset_after: decision.reset_after,
            cause: Cause::OverLimit,
            period: Duration::ZERO,
            name: "default",
        }
    }

    /// The same refusal, naming the rule it came from.
    pub(crate) fn with_rule(self, period: Duration, name: &'static str) -> RateLimited {
        RateLimited {
            period,
            name,
            ..self
        }
    }

    /// A refusal because a per-client rule could not identify the client.
    pub(crate) fn unknown_client(limit: u64) -> RateLimited {
        RateLimited {
            cause: Cause::UnknownClient,
            ..RateLimited::backend_unavailable(limit)
        }
    }

    /// A refusal because the limiter lacks what the call's key needs (a key
    /// secret for a shared store): [`Cause::Misconfigured`].
    pub fn misconfigured(limit: u64) -> RateLimited {
        RateLimited {
            cause: Cause::Misconfigured,
            ..RateLimited::backend_unavailable(limit)
        }
    }

    /// A refusal because the backend failed under the `deny` policy. Retry
    /// after a second: the limiter, not the client, has to recover.
    pub fn backend_unavailable(limit: u64) -> RateLimited {
        RateLimited {
            limit,
            remaining: 0,
            retry_after: Duration::from_secs(1),
            reset_after: Duration::from_secs(1),
            cause: Cause::BackendUnavailable,
            period: Duration::ZERO,
            name: "default",
        }
    }

    /// Whether the call was refused because the limiter's backend failed
    /// (rather than because the client used up its budget).
    pub fn is_backend_failure(&self) -> bool {
        self.cause == Cause::BackendUnavailable
    }

    /// `retry_after` in whole seconds, rounded up (at least 1): the value of
    /// an HTTP `Retry-After` header.
    pub fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            Cause::BackendUnavailable => {
                return f.write_str("rate limiter unavailable; call refused by the `deny` policy");
            }
            Cause::UnknownClient => {
                return f.write_str("cannot tell who the client is; call refused");
            }
            Cause::Misconfigured => {
                return f.write_str(
                    "rate limiter misconfigured (no key secret for a shared store); call refused",
                );
            }
            Cause::OverLimit => {}
        }
        write!(
            f,
            "rate limit of {} exceeded; retry after {} ms",
            self.limit,
            self.retry_after.as_millis()
        )
    }
}

impl std::error::Error for RateLimited {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_limit_and_retry_after() {
        let d = Decision {
            allowed: false,
            limit: 3,
            remaining: 0,
            reset_after: Duration::from_millis(1200),
            retry_after: Duration::from_millis(1200),
        };
        let limited = d.rate_limited().expect("a rejection");
        assert_eq!(
            limited.to_string(),
            "rate limit of 3 exceeded; retry after 1200 ms"
        );
        assert!(Decision { allowed: true, ..d }.rate_limited().is_none());
    }
}
