//! [`Permit`]: a call's decision, and the concurrency lease it holds.

use std::sync::Arc;

use super::Store;
use crate::backend::hook::LeaseRef;
use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::rule::Rule;

/// What [`RateLimiter::acquire`](super::RateLimiter::acquire) answers: the decision, and for an allowed
/// call of a `concurrency` rule, the lease it holds.
///
/// Dropping the permit releases the lease: at once in process memory, and
/// from a task spawned on the current Tokio runtime where Redis or a custom
/// backend holds it (without a runtime the lease is left to expire after the
/// rule's period). So a call that ends by error, panic or cancellation gives
/// its units back too. [`release`](Permit::release) does it now and
/// reports failures.
#[derive(Debug)]
#[must_use = "dropping the permit releases its lease at once"]
pub struct Permit {
    pub(super) decision: Decision,
    /// Boxed: only concurrency rules have one.
    pub(super) lease: Option<Box<HeldLease>>,
    /// What an allowed call of any other rule took.
    pub(super) charge: Option<Charge>,
    /// Answered by the in-process insurance limiter (the backend failed).
    pub(crate) local: bool,
    /// Not checked at all: the backend failed under the `allow` policy.
    pub(crate) unchecked: bool,
}

impl Permit {
    /// An allowed call the backend could not check (policy `allow`).
    pub(crate) fn allowed_unchecked(rule: &Rule) -> Permit {
        Permit {
            decision: Decision {
                allowed: true,
                limit: rule.count(),
                remaining: rule.count(),
                reset_after: std::time::Duration::ZERO,
                retry_after: std::time::Duration::ZERO,
            },
            lease: None,
            charge: None,
            local: false,
            unchecked: true,
        }
    }

    /// The decision.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// What the call took from its budget, for
    /// [`RateLimiter::refund`](super::RateLimiter::refund): `None` when it
    /// took nothing (refused, or let through unchecked) or holds a lease (a
    /// concurrency rule: drop or release the permit instead).
    pub fn charge(&self) -> Option<Charge> {
        self.charge
    }

    /// Releases the lease now (if any) and waits until it is released.
    ///
    /// # Errors
    ///
    /// The backend's, if it failed; the lease then expires after the rule's period.
    pub async fn release(mut self) -> Result<(), Error> {
        match self.lease.take() {
            Some(mut lease) => {
                lease.released = true;
                lease.store.release(lease.lease_ref()).await
            }
            None => Ok(()),
        }
    }
}

/// Units of a concurrency rule held by one call, and where to give them back.
#[derive(Debug)]
pub(super) struct HeldLease {
    pub(super) store: Arc<dyn Store>,
    pub(super) rule: Rule,
    pub(super) key: Box<str>,
    pub(super) cost: u64,
    pub(super) id: u64,
    /// Taken by the insurance limiter while the backend failed.
    pub(super) held_by_insurance: bool,
    pub(super) released: bool,
}

impl HeldLease {
    fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            rule: &self.rule,
            key: &self.key,
            cost: self.cost,
            id: self.id,
            insurance: self.held_by_insurance,
        }
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        // Held by the backend (Redis, custom): released from a task (without
        // a runtime, it expires after the rule's period).
        if !self.store.release_now(&self.lease_ref())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let lease = HeldLease {
                store: Arc::clone(&self.store),
                key: std::mem::take(&mut self.key),
                released: true,
                ..*self
            };
            runtime.spawn(async move {
                if let Err(error) = lease.store.release(lease.lease_ref()).await {
                    tracing::debug!(%error, "could not release a concurrency lease; it will expire");
                }
            });
        }
    }
}
