//! What the limiter and the built-in stores pass through [`Backend`]'s
//! hidden hooks. The types are public in a private module: a backend of the
//! crate's users cannot name them, so it keeps the hooks' defaults.
//!
//! [`Backend`]: super::Backend

use crate::decision::Decision;
use crate::error::OnError;
use crate::rule::Rule;

/// The argument that seals the hooks: only this crate can make one.
#[derive(Clone, Copy, Debug)]
pub struct Sealed(());

impl Sealed {
    pub(crate) const NEW: Sealed = Sealed(());
}

/// One call to check and consume: its rule, key, cost, lease (a
/// concurrency rule's) and what to do when the backend fails.
#[derive(Clone, Copy, Debug)]
pub struct BackendCall<'a> {
    pub(crate) rule: &'a Rule,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) lease: Option<u64>,
    pub(crate) on_error: OnError,
}

/// A backend's answer to a [`BackendCall`]: the decision, the stamp of what
/// an allowed check charged (the built-in stores'), and who answered.
#[derive(Clone, Copy, Debug)]
pub struct Answered {
    pub(crate) decision: Decision,
    pub(crate) stamp: Option<u64>,
    pub(crate) by: ServedBy,
}

/// Who answered a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServedBy {
    /// The backend itself.
    Backend,
    /// The in-process insurance limiter, the backend having failed.
    Insurance,
    /// Nobody: the backend failed and the policy let the call through.
    Unchecked,
}

impl Answered {
    pub(crate) fn by_backend(decision: Decision, stamp: Option<u64>) -> Answered {
        Answered {
            decision,
            stamp,
            by: ServedBy::Backend,
        }
    }

    /// A call let through unchecked (the policy `allow`).
    pub(crate) fn unchecked(rule: &Rule) -> Answered {
        Answered {
            decision: Decision {
                allowed: true,
                limit: rule.count(),
                remaining: rule.count(),
                reset_after: std::time::Duration::ZERO,
                retry_after: std::time::Duration::ZERO,
            },
            stamp: None,
            by: ServedBy::Unchecked,
        }
    }
}

/// A lease to give back, and whether the insurance limiter took it.
#[derive(Clone, Copy, Debug)]
pub struct LeaseRef<'a> {
    pub(crate) rule: &'a Rule,
    pub(crate) key: &'a str,
    pub(crate) cost: u64,
    pub(crate) id: u64,
    pub(crate) insurance: bool,
}

/// What a failed call says of the backend, for the circuit breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundTrip {
    /// It failed in this round trip, shared by every call sent in it.
    Failed(u64),
    /// It never reached the backend (it expired in the client's queue).
    NotSent,
    /// Some other failure of this call alone.
    Other,
}

/// A call that may wait its turn, answered: the decision (allowed: the
/// call goes after `wait`), and the ticket that gives back a reservation
/// that waits.
#[derive(Clone, Copy, Debug)]
pub struct Reserved {
    pub(crate) answered: Answered,
    pub(crate) wait: std::time::Duration,
    pub(crate) ticket: Option<Ticket>,
}

impl Reserved {
    /// A call answered at once (refused, or going without waiting).
    pub(crate) fn at_once(answered: Answered) -> Reserved {
        Reserved {
            answered,
            wait: std::time::Duration::ZERO,
            ticket: None,
        }
    }
}

/// What names a reservation that waits, for its cancel: when it was made
/// (µs of the store's clock), the position it answered, and whether the
/// insurance limiter holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) at: u64,
    pub(crate) position: u64,
    pub(crate) insurance: bool,
}
