//! A rate limit on log lines, so a flood of refusals or evictions writes a
//! line now and then, with how many it held back.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Milliseconds since the first call in this process.
pub(crate) fn process_millis() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A rate limit on log lines: one line, then none until
/// [`EVERY_MS`](LogGate::EVERY_MS) has passed, counting what it held back.
#[derive(Debug)]
pub(crate) struct LogGate {
    /// When the next line may go, in [`process_millis`].
    next_ms: AtomicU64,
    /// Lines held back since the last one.
    held: AtomicU64,
}

impl LogGate {
    /// At most one line per this many ms.
    pub(crate) const EVERY_MS: u64 = 10_000;

    pub(crate) const fn new() -> LogGate {
        LogGate {
            next_ms: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held back)` if a line may go at `now_ms`, else `None` (and
    /// this one is counted as held back).
    pub(crate) fn admit(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms + Self::EVERY_MS,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_gate_lets_one_line_through_per_period_and_counts_the_rest() {
        let gate = LogGate::new();
        assert_eq!(gate.admit(5), Some(0));
        for now in 6..1_006 {
            assert_eq!(gate.admit(now), None);
        }
        assert_eq!(gate.admit(5 + LogGate::EVERY_MS - 1), None);
        assert_eq!(gate.admit(5 + LogGate::EVERY_MS), Some(1_001));
        assert_eq!(gate.admit(6 + LogGate::EVERY_MS), None);
    }
}
