//! Where the budgets live: the [`Backend`] trait and its stores.

use std::future::Future;
use std::time::Duration;

use crate::{Decision, Error, Rule};

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;

/// A store that checks and consumes rate-limit budgets.
///
/// One call of [`check`](Backend::check) is one atomic check-and-consume: it
/// either consumes `cost` units of `key`'s budget under `rule` and answers an
/// allowed [`Decision`], or consumes nothing and answers a rejecting one.
/// Implementations must give the same decisions as [`MemoryBackend`](memory::MemoryBackend)
/// for the same sequence of calls and times.
///
/// The limiter validates `cost` against the rule's capacity before calling a
/// backend, so `1 <= cost <= rule.capacity()` holds here.
pub trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// Checks and consumes `cost` units of `key`'s budget under `rule`.
    fn check(
        &self,
        rule: &Rule,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;
}

/// Builds a fixed-window decision from what every store knows after a check:
/// whether it passed, what is left, and when the window ends.
pub(crate) fn fixed_window_decision(
    rule: &Rule,
    allowed: bool,
    remaining: u64,
    reset_after: Duration,
    cost: u64,
) -> Decision {
    let retry_after = if remaining >= cost {
        Duration::ZERO
    } else if reset_after.is_zero() {
        // The window ends within this millisecond; never answer "retry now" to
        // a call that was just refused.
        Duration::from_millis(1)
    } else {
        reset_after
    };
    Decision {
        allowed,
        limit: rule.count(),
        remaining,
        reset_after,
        retry_after,
    }
}
