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
    /// The origin as the clock's raw reading (TSC ticks, or ns of the OS's
    /// clock where quanta falls back to it).
    origin: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        SystemClock { clock, origin }
    }

    /// Whole µs since the origin: what the in-memory store reads at every
    /// check. The raw reading is scaled once, straight to ns (no `Duration`
    /// made and taken apart again, no dynamic call when the store knows its
    /// clock is this one).
    #[inline]
    pub(crate) fn now_micros(&self) -> u64 {
        self.nanos() / 1000
    }

    /// Whole ns since the origin.
    #[inline]
    fn nanos(&self) -> u64 {
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos())
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn system_clock_micros_follow_the_os_clock() {
        let clock = SystemClock::new();
        let os = Instant::now();
        let first = clock.now_micros();
        std::thread::sleep(Duration::from_millis(20));
        let second = clock.now_micros();
        let os_elapsed = os.elapsed();
        let elapsed = Duration::from_micros(second - first);
        // Both readings lie between the two OS readings, so the clock's
        // elapsed time is at least the sleep and at most the OS's (plus a
        // wide margin for calibration error).
        assert!(elapsed >= Duration::from_millis(19), "{elapsed:?}");
        assert!(
            elapsed <= os_elapsed + Duration::from_millis(5),
            "{elapsed:?} > {os_elapsed:?}"
        );
        let through_trait = clock.now();
        let direct = clock.now_micros();
        assert!(direct >= u64::try_from(through_trait.as_micros()).unwrap());
        assert!(direct - u64::try_from(through_trait.as_micros()).unwrap() < 1_000_000);
    }
}
