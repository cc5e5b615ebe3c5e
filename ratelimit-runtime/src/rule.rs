//! Rules: how many calls a key may make per period, and by which algorithm.

use std::time::Duration;

/// The algorithm a [`Rule`] is enforced with.
///
/// Every algorithm gives the same decisions on every backend. More algorithms
/// (sliding window, sliding log, token bucket, GCRA, concurrency) are planned;
/// the enum is `#[non_exhaustive]` so adding them is not a breaking change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A counter that starts at the first call and expires `period` later
    /// (the seeds' `INCR` + `PEXPIRE` counter). A rejected call consumes nothing.
    ///
    /// Cheap (one small integer per key) but lets up to `2 * count` calls
    /// through around a window edge.
    FixedWindow,
}

impl Algorithm {
    /// The name used in the attribute (`algorithm = fixed_window`) and in logs.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
        }
    }
}

/// A rate-limiting rule: at most `count` units per `period`, by an [`Algorithm`].
///
/// Rules are `const`-constructible and validated when built: a count of zero,
/// a count over [`Rule::MAX_COUNT`], or a period under one millisecond is a
/// panic, which in a `const` is a compile error.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::Rule;
///
/// const SEARCH: Rule = Rule::fixed_window(100, Duration::from_secs(60));
/// assert_eq!(SEARCH.count(), 100);
/// assert_eq!(SEARCH.period(), Duration::from_secs(60));
/// ```
///
/// ```compile_fail
/// use std::time::Duration;
/// use ratelimit_runtime::Rule;
///
/// const BROKEN: Rule = Rule::fixed_window(0, Duration::from_secs(1)); // count must be at least 1
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rule {
    algorithm: Algorithm,
    count: u64,
    period_ms: u64,
}

impl Rule {
    /// The largest `count` a rule may have (one billion per period).
    ///
    /// Larger values would lose precision in Redis' Lua numbers (doubles)
    /// once the algorithms that scale counts by time land.
    pub const MAX_COUNT: u64 = 1_000_000_000;

    /// The longest `period` a rule may have: 366 days.
    pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 60 * 60);

    /// A fixed-window rule: `count` calls per `period`, the window starting at
    /// the first call.
    ///
    /// # Panics
    ///
    /// If `count` is 0 or over [`Rule::MAX_COUNT`], or `period` is under 1 ms
    /// or over [`Rule::MAX_PERIOD`]. In a `const` this is a compile error.
    pub const fn fixed_window(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::FixedWindow, count, period)
    }

    /// A rule of any [`Algorithm`]; see [`Rule::fixed_window`] for the limits.
    ///
    /// # Panics
    ///
    /// As [`Rule::fixed_window`].
    pub const fn new(algorithm: Algorithm, count: u64, period: Duration) -> Rule {
        assert!(count >= 1, "a rate-limit rule's count must be at least 1");
        assert!(
            count <= Rule::MAX_COUNT,
            "a rate-limit rule's count must be at most Rule::MAX_COUNT (1_000_000_000)"
        );
        assert!(
            period.as_millis() >= 1,
            "a rate-limit rule's period must be at least 1 ms"
        );
        assert!(
            period.as_millis() <= Rule::MAX_PERIOD.as_millis(),
            "a rate-limit rule's period must be at most Rule::MAX_PERIOD (366 days)"
        );
        Rule {
            algorithm,
            count,
            // Whole milliseconds: the resolution Redis expires keys with.
            period_ms: period.as_millis() as u64,
        }
    }

    /// The algorithm this rule is enforced with.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// How many units (calls, unless a call has a cost) are allowed per period.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The window length, in whole milliseconds.
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    pub(crate) const fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The most units one call may cost under this rule.
    pub const fn capacity(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn const_rule_keeps_its_values() {
        const R: Rule = Rule::fixed_window(3, Duration::from_millis(1500));
        assert_eq!(R.count(), 3);
        assert_eq!(R.period(), Duration::from_millis(1500));
        assert_eq!(R.algorithm(), Algorithm::FixedWindow);
        assert_eq!(R.algorithm().name(), "fixed_window");
    }

    #[test]
    #[should_panic(expected = "count must be at least 1")]
    fn zero_count_panics() {
        let _ = Rule::fixed_window(0, Duration::from_secs(1));
    }

    #[test]
    #[should_panic(expected = "at most Rule::MAX_COUNT")]
    fn huge_count_panics() {
        let _ = Rule::fixed_window(Rule::MAX_COUNT + 1, Duration::from_secs(1));
    }

    #[test]
    #[should_panic(expected = "period must be at least 1 ms")]
    fn sub_millisecond_period_panics() {
        let _ = Rule::fixed_window(1, Duration::from_micros(999));
    }

    #[test]
    #[should_panic(expected = "at most Rule::MAX_PERIOD")]
    fn huge_period_panics() {
        let _ = Rule::fixed_window(1, Rule::MAX_PERIOD + Duration::from_millis(1));
    }
}
