//! [`Site`]: one rule where it is applied (a `#[rate_limit]` call site or a
//! middleware's rule), and [`SITES`], every call site of the program.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::{OnError, RateLimited, RateLimiter, Rule};

/// Every `#[rate_limit]` rule of the program (gathered by the linker), so
/// overrides can be checked against their names at start-up.
#[linkme::distributed_slice]
pub static SITES: [&'static Site];

/// The header names of every `by = header(..)` rule of the program
/// (gathered by the linker): what a handler's request keeps of its headers.
#[linkme::distributed_slice]
pub static HEADER_SUBJECTS: [&'static str];

/// One rule where it is applied: a `#[rate_limit]` call site (a `static`
/// per site) or a middleware's rule. It keeps what every check of the rule
/// shares: its name, rule and options, the named limiter once looked up,
/// and its metrics handles.
#[derive(Debug)]
pub struct Site {
    pub(crate) name: &'static str,
    pub(crate) rule: Rule,
    pub(crate) cost: u64,
    pub(crate) limiter: Option<&'static str>,
    pub(crate) on_error: Option<OnError>,
    pub(crate) shadow: bool,
    named: OnceLock<RateLimiter>,
    /// How often its shadow refusals are logged.
    shadow_log: LogGate,
    #[cfg(feature = "metrics")]
    counters: OnceLock<[::metrics::Counter; 5]>,
}

impl Site {
    /// A rule and its options: `name` (the `key` as written, which overrides
    /// and headers name it by), the units one call takes, the limiter
    /// installed under `limiter` (else the caller's or the global one), the
    /// failure policy (else the limiter's), and shadow mode.
    pub const fn new(
        name: &'static str,
        rule: Rule,
        cost: u64,
        limiter: Option<&'static str>,
        on_error: Option<OnError>,
        shadow: bool,
    ) -> Site {
        Site {
            name,
            rule,
            cost,
            limiter,
            on_error,
            shadow,
            named: OnceLock::new(),
            shadow_log: LogGate::new(),
            #[cfg(feature = "metrics")]
            counters: OnceLock::new(),
        }
    }

    /// The rule's name (its `key` as written).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The rule as written.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The units one call takes.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The name of the limiter this rule must use, if it names one.
    pub fn limiter_name(&self) -> Option<&'static str> {
        self.limiter
    }

    /// The limiter this rule uses when the caller has none of its own: the
    /// named one (`None` if it is not installed), else the global one.
    pub fn limiter(&self) -> Option<&RateLimiter> {
        match self.limiter {
            None => Some(RateLimiter::global()),
            Some(name) => {
                if let Some(limiter) = self.named.get() {
                    return Some(limiter);
                }
                let limiter = RateLimiter::named(name)?;
                Some(self.named.get_or_init(|| limiter))
            }
        }
    }

    /// The refusal of a per-client rule whose client cannot be told.
    pub fn unknown_client(&self) -> RateLimited {
        self.record(Outcome::Limited);
        RateLimited::unknown_client(self.rule.count()).with_rule(self.rule.period(), self.name)
    }

    /// The refusal of a call whose key needs what the limiter lacks (a key
    /// secret for a shared store): `error` is logged, rate limited.
    pub fn misconfigured(&self, error: &crate::Error) -> RateLimited {
        self.record(Outcome::Limited);
        crate::secret::log_missing(error, self.name);
        RateLimited::misconfigured(self.rule.count()).with_rule(self.rule.period(), self.name)
    }

    /// Whether to log this shadow refusal: the first, then at most one
    /// every [`LogGate::EVERY_MS`]; `Some(n)` with the `n` left unlogged
    /// since the last line. (The counter `shadow_limited` counts them all.)
    pub(crate) fn log_shadow_refusal(&self) -> Option<u64> {
        self.shadow_log.admit(process_millis())
    }

    /// Counts one outcome of this rule (`ratelimit_calls_total{rule, outcome}`
    /// with the `metrics` feature; nothing without it).
    pub(crate) fn record(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        {
            let counters = self.counters.get_or_init(|| {
                Outcome::ALL.map(|o| {
                    ::metrics::counter!("ratelimit_calls_total", "rule" => self.name, "outcome" => o.label())
                })
            });
            counters[outcome as usize].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
}

/// What happened to a call, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Limited,
    ShadowLimited,
    BackendError,
    LocalFallback,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Outcome; 5] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::BackendError,
        Outcome::LocalFallback,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::BackendError => "backend_error",
            Outcome::LocalFallback => "local_fallback",
        }
    }
}

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
