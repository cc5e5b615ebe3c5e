//! The circuit breaker that stops sending every call to a backend that
//! fails, and probes it until it answers again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::hook::RoundTrip;
use crate::error::{Error, OnError};

/// Consecutive failures that open the circuit.
const FAILURES_TO_OPEN: u32 = 3;

/// Closed: calls go to the backend. Open (after consecutive failures):
/// calls are answered by the failure policy without a round trip, except one
/// probe every `probe_interval`; a probe that succeeds closes it. Each switch
/// is logged once, with the backend's name.
#[derive(Debug)]
pub(crate) struct Breaker {
    /// What the logs call the backend: "Redis", "the rate-limit backend".
    name: &'static str,
    origin: Instant,
    probe_interval_ms: u64,
    failures: AtomicU32,
    open: AtomicBool,
    next_probe_ms: AtomicU64,
    /// The last failed round trip counted: the checks of one failed batch
    /// count once.
    last_round_trip: AtomicU64,
}

impl Breaker {
    pub(crate) fn new(name: &'static str, probe_interval: Duration, start_open: bool) -> Breaker {
        #[cfg(feature = "metrics")]
        ::metrics::gauge!("ratelimit_circuit_open").set(if start_open { 1.0 } else { 0.0 });
        Breaker {
            name,
            origin: Instant::now(),
            probe_interval_ms: probe_interval.as_millis().max(1) as u64,
            failures: AtomicU32::new(if start_open { FAILURES_TO_OPEN } else { 0 }),
            open: AtomicBool::new(start_open),
            next_probe_ms: AtomicU64::new(0),
            last_round_trip: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    /// Whether this call may go to the backend: always while closed; while open,
    /// only the one call that takes the next probe slot.
    pub(crate) fn allow(&self) -> bool {
        if !self.open.load(Ordering::Relaxed) {
            return true;
        }
        let now = self.now_ms();
        let next = self.next_probe_ms.load(Ordering::Relaxed);
        now >= next
            && self
                .next_probe_ms
                .compare_exchange(
                    next,
                    now + self.probe_interval_ms,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Hands back the probe slot [`allow`](Self::allow) gave a call that
    /// never reached the backend (a store that cannot reserve turns), so
    /// the next call probes at once instead of after another interval.
    pub(crate) fn forgo_probe(&self) {
        if self.open.load(Ordering::Relaxed) {
            self.next_probe_ms.store(0, Ordering::Relaxed);
        }
    }

    pub(crate) fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
        if self.open.load(Ordering::Relaxed) && self.open.swap(false, Ordering::AcqRel) {
            tracing::info!("{} answers again; rate limits are shared again", self.name);
            #[cfg(feature = "metrics")]
            ::metrics::gauge!("ratelimit_circuit_open").set(0.0);
        }
    }

    /// Counts a failed call, which failed in `trip`: once per failed round
    /// trip (the checks of one batch share theirs), never for a check that
    /// expired in the client's queue without being sent.
    pub(crate) fn failed(&self, trip: RoundTrip, error: &Error, on_error: OnError) {
        match trip {
            RoundTrip::NotSent => return,
            RoundTrip::Failed(trip) => {
                if self.last_round_trip.swap(trip, Ordering::AcqRel) == trip {
                    return;
                }
            }
            RoundTrip::Other => {}
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures < FAILURES_TO_OPEN {
            return;
        }
        self.next_probe_ms
            .store(self.now_ms() + self.probe_interval_ms, Ordering::Relaxed);
        if !self.open.swap(true, Ordering::AcqRel) {
            #[cfg(feature = "metrics")]
            ::metrics::gauge!("ratelimit_circuit_open").set(1.0);
            let policy = match on_error {
                OnError::Local => "enforcing rate limits per process",
                OnError::Allow => "letting calls through (policy `allow`)",
                OnError::Deny => "refusing calls (policy `deny`)",
            };
            tracing::warn!(
                %error,
                "{} is unavailable; {policy} and probing every {} ms until it answers",
                self.name,
                self.probe_interval_ms
            );
        }
    }
}

/// Why a call did not go to the backend: the circuit is open.
#[derive(Debug)]
pub(crate) struct CircuitOpen;

impl std::fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the backend is unavailable (circuit open, probing)")
    }
}

impl std::error::Error for CircuitOpen {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_circuit_opens_after_failures_and_probes_at_intervals() {
        let breaker = Breaker::new("Redis", Duration::from_millis(300), false);
        let error = Error::backend(CircuitOpen);
        assert!(breaker.allow());
        breaker.failed(RoundTrip::Other, &error, OnError::Local);
        breaker.failed(RoundTrip::Other, &error, OnError::Local);
        assert!(breaker.allow(), "still closed after two failures");
        breaker.failed(RoundTrip::Other, &error, OnError::Local);
        assert!(!breaker.allow(), "open: no call goes to the backend");
        std::thread::sleep(Duration::from_millis(310));
        assert!(breaker.allow(), "one probe after the interval");
        assert!(!breaker.allow(), "and only one");
        breaker.succeeded();
        assert!(breaker.allow() && breaker.allow(), "closed again");
    }

    /// One failed batch is one failure however many checks it carried, and a
    /// check that expired in the client's queue is none; three failed round
    /// trips open the circuit. (Each caller's failure used to count, so one
    /// batch of three checks opened it.)
    #[cfg(feature = "redis")]
    #[test]
    fn the_circuit_counts_failed_round_trips_not_callers() {
        use crate::backend::redis::{expired_error, failed_batch_errors, round_trip};
        let breaker = Breaker::new("Redis", Duration::from_secs(60), false);
        let fail = |errors: Vec<Error>| {
            for error in errors {
                breaker.failed(round_trip(&error), &error, OnError::Deny);
            }
        };
        fail(failed_batch_errors(10));
        fail((0..10).map(|_| expired_error()).collect());
        assert!(breaker.allow(), "one round trip failed: still closed");
        fail(failed_batch_errors(4));
        assert!(breaker.allow(), "two round trips: still closed");
        fail(failed_batch_errors(1));
        assert!(!breaker.allow(), "three round trips: open");
    }
}
