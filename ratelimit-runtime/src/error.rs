//! The runtime's error type.

use std::fmt;

/// What the limiter does with a call when its backend fails or times out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum OnError {
    /// Let the call through.
    Allow,
    /// Refuse the call with a [`RateLimited`](crate::RateLimited) whose
    /// cause is [`BackendUnavailable`](crate::Cause::BackendUnavailable)
    /// (an actix handler answers 503).
    Deny,
    /// Check the same rule in process memory until the backend answers again
    /// (the default): limits hold per process meanwhile.
    #[default]
    Local,
}

/// Why a limiter could not be built, installed or asked.
///
/// Being rate limited is not an `Error`: it is a [`Decision`](crate::Decision)
/// with `allowed == false`, or a [`RateLimited`](crate::RateLimited).
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// A call's cost is 0, or larger than the rule's capacity (so it could never pass).
    InvalidCost {
        /// The call's cost.
        cost: u64,
        /// The most one call may cost under the rule.
        capacity: u64,
    },
    /// The backend does not support this kind of rule.
    Unsupported(&'static str),
    /// A `concurrency` rule was checked with `check`: it holds a lease for
    /// the length of a call, so it needs `RateLimiter::acquire`.
    PermitRequired,
    /// [`RateLimiter::install`](crate::RateLimiter::install) was called when a
    /// global limiter was already in place (or `install_as` with a name
    /// already taken), or `HttpOptions::install` when options were.
    AlreadyInstalled,
    /// The limiter's configuration is invalid (for example a malformed Redis URL).
    Config(String),
    /// The backend failed: unreachable, timed out, or answered something unexpected.
    Backend(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    /// Wraps a backend's own error.
    pub fn backend(source: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Backend(Box::new(source))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidCost { cost: 0, .. } => f.write_str("a call's cost must be at least 1"),
            Error::InvalidCost { cost, capacity } => write!(
                f,
                "a call costing {cost} can never pass a rule whose capacity is {capacity}"
            ),
            Error::Unsupported(what) => {
                write!(f, "this rate limiter backend does not support {what}")
            }
            Error::PermitRequired => f.write_str(
                "a concurrency rule holds a lease while the call runs: use `RateLimiter::acquire`, \
                 whose permit releases it when dropped",
            ),
            Error::AlreadyInstalled => f.write_str(
                "a global rate limiter or the process's HTTP options are already in place: \
                 `install` was called before, or a rate-limited call ran first and took \
                 the default (the in-memory limiter, the default options); install at \
                 start-up, before any limited call",
            ),
            Error::Config(msg) => write!(f, "invalid rate limiter configuration: {msg}"),
            Error::Backend(source) => write!(f, "rate limiter backend failed: {source}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Backend(source) => Some(&**source),
            _ => None,
        }
    }
}
