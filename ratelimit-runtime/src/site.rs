//! [`Site`]: one rule where it is applied (a `#[rate_limit]` call site or a
//! middleware's rule), and [`SITES`], every call site of the program.

use std::sync::OnceLock;

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
