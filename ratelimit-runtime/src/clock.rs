//! Time for the in-memory backend: the system's monotonic clock, or a manual
//! one that tests advance instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A monotonic clock: time elapsed since an arbitrary, fixed origin.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since this clock's origin. Never goes backwards.
    fn now(&self) -> Duration;
}

/// The system's monotonic clock ([`Instant`]); the default.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }

    /// Whole µs since the origin: what the in-memory store reads at every
    /// check.
    pub(crate) fn now_micros(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
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
