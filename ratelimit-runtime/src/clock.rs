//! Time for the in-memory backend: the system's monotonic clock, or a manual
//! one that tests advance instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonic clock: time elapsed since an arbitrary, fixed origin.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since this clock's origin. Never goes backwards.
    fn now(&self) -> Duration;
}

/// The system's monotonic clock; the default.
///
/// It reads the CPU's time-stamp counter through `quanta` where that is
/// reliable (invariant TSC, calibrated against the OS clock), which is several
/// times cheaper than `Instant::now()` on virtual machines, and the OS's
/// monotonic clock otherwise.
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: quanta::Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        let clock = quanta::Clock::new();
        let origin = clock.now();
        SystemClock { clock, origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.origin)
    }
}

/// A clock that only moves when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let seen_by_limiter = clock.clone();
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(seen_by_limiter.now(), Duration::from_secs(2));
/// ```
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}
