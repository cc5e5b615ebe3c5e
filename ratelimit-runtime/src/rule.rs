//! Rules: how many units a key may use per period, and by which algorithm.

use std::time::Duration;

/// The algorithm a [`Rule`] is enforced with.
///
/// Every algorithm gives the same decisions on every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A counter that starts at a key's first call and ends `period` later
    /// (the seeds' `INCR` + `PEXPIRE` counter). Cheapest, but lets up to
    /// `2 * count` calls through around a window edge.
    FixedWindow,
    /// Exact sliding window: a log of call times, at most `count` units in
    /// any interval of length `period`.
    ///
    /// Its memory grows with the calls in the window, up to `count` of
    /// them (a call is one entry whatever its cost): about 130 bytes a call
    /// in Redis (one sorted-set member) and 16 to 32 in process memory. A
    /// rule of 10^6 calls an hour may keep about 130 MB under one key; for
    /// large counts, [`SlidingWindow`](Algorithm::SlidingWindow) keeps
    /// three numbers.
    SlidingLog,
    /// The two-counter approximation of a sliding window: the previous fixed
    /// window's count, weighted by how much of it still overlaps, plus the
    /// current one's. O(1) memory; windows are aligned to the clock.
    SlidingWindow,
    /// A bucket of `burst` tokens (default `count`), refilled continuously at
    /// `count` per `period`, starting full.
    ///
    /// A bucket whose period or burst changes (an override, another rule on
    /// the key) keeps its whole tokens, up to the new burst, and drops the
    /// fraction of a token it had refilled.
    TokenBucket,
    /// The generic cell rate algorithm (leaky bucket as a meter): the same
    /// limit as the token bucket, kept as one timestamp per key.
    Gcra,
    /// At most `count` calls in flight; each holds a lease released when the
    /// call ends, or after `period` if its holder died.
    ///
    /// A call removes at most 1,024 expired leases, the oldest first: an
    /// expired lease of several units beyond those keeps its units past the
    /// first counted until a later call removes it (briefly stricter, never
    /// looser).
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in the order the docs list them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::Concurrency,
    ];
}

/// A rate-limiting rule: at most `count` units per `period`, by an [`Algorithm`].
///
/// Rules are `const`-constructible and validated when built: a bad value is a
/// panic, which in a `const` is a compile error.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::Rule;
///
/// const SEARCH: Rule = Rule::fixed_window(100, Duration::from_secs(60));
/// const UPLOADS: Rule = Rule::token_bucket(10, Duration::from_secs(1)).with_burst(50);
/// assert_eq!(SEARCH.count(), 100);
/// assert_eq!(UPLOADS.capacity(), 50);
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
    burst: u64,
    period_ms: u64,
    /// The largest block of a local quota ([`Rule::with_local_quota`]); 0:
    /// every check goes to the backend.
    local_quota: u64,
    /// Whether a check reads its subject's own limit first
    /// ([`Rule::with_subject_limits`]).
    subject_limits: bool,
}

impl Rule {
    /// The largest `count` (and `burst`) a rule may have: one billion.
    pub const MAX_COUNT: u64 = 1_000_000_000;

    /// The longest `period` a rule may have: 366 days.
    pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 60 * 60);

    /// For `token_bucket` and `gcra`, the most `burst × period` (in
    /// microseconds) may be: 2^52. The buckets are kept in fixed point with
    /// `period` units per token, and Redis' Lua numbers are exact integers
    /// only up to 2^53. It allows, for example, a burst of 1,000 over a
    /// 52-day period or a burst of 1,000,000 over 75 minutes.
    pub const MAX_BURST_PERIOD_US: u64 = 1 << 52;

    /// A fixed-window rule; see [`Algorithm::FixedWindow`].
    ///
    /// # Panics
    ///
    /// If `count` is 0 or over [`Rule::MAX_COUNT`], or `period` is under 1 ms
    /// or over [`Rule::MAX_PERIOD`]. In a `const` this is a compile error.
    pub const fn fixed_window(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::FixedWindow, count, period)
    }

    /// An exact sliding-window rule; see [`Algorithm::SlidingLog`] (and
    /// what it costs in memory: up to `count` entries a key).
    ///
    /// # Panics
    ///
    /// As [`Rule::fixed_window`].
    pub const fn sliding_log(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::SlidingLog, count, period)
    }

    /// An approximate sliding-window rule; see [`Algorithm::SlidingWindow`].
    ///
    /// # Panics
    ///
    /// As [`Rule::fixed_window`].
    pub const fn sliding_window(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::SlidingWindow, count, period)
    }

    /// A token bucket refilled at `count` per `period`, holding `count`
    /// tokens unless [`with_burst`](Rule::with_burst) says otherwise.
    ///
    /// # Panics
    ///
    /// As [`Rule::fixed_window`], and if `count × period` exceeds
    /// [`Rule::MAX_BURST_PERIOD_US`].
    pub const fn token_bucket(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::TokenBucket, count, period)
    }

    /// A GCRA rule: `count` per `period`, bursts of up to `count` unless
    /// [`with_burst`](Rule::with_burst) says otherwise.
    ///
    /// # Panics
    ///
    /// As [`Rule::token_bucket`].
    pub const fn gcra(count: u64, period: Duration) -> Rule {
        Rule::new(Algorithm::Gcra, count, period)
    }

    /// At most `count` calls in flight; a lease not released within `period`
    /// expires (its holder is taken for dead).
    ///
    /// # Panics
    ///
    /// As [`Rule::fixed_window`].
    pub const fn concurrency(count: u64, lease: Duration) -> Rule {
        Rule::new(Algorithm::Concurrency, count, lease)
    }

    /// A rule of any [`Algorithm`], with `burst` equal to `count`.
    ///
    /// # Panics
    ///
    /// As the constructor named after the algorithm.
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
        let rule = Rule {
            algorithm,
            count,
            burst: count,
            // Whole milliseconds: the resolution Redis expires keys with.
            period_ms: period.as_millis() as u64,
            local_quota: 0,
            subject_limits: false,
        };
        rule.check_burst_period();
        rule
    }

    /// A rule of any algorithm, with `burst` for the bucket algorithms
    /// (ignored, as `count`, for the others), or why these values are not a
    /// rule. For values read at run time (overrides).
    ///
    /// # Errors
    ///
    /// A message naming the value and its limit.
    pub fn try_new(
        algorithm: Algorithm,
        count: u64,
        period: Duration,
        burst: u64,
    ) -> Result<Rule, String> {
        let period_ms = period.as_millis();
        if count == 0 || count > Rule::MAX_COUNT {
            return Err(format!(
                "count must be between 1 and {}, not {count}",
                Rule::MAX_COUNT
            ));
        }
        if period_ms < 1 || period_ms > Rule::MAX_PERIOD.as_millis() {
            return Err(format!(
                "period must be between 1 ms and 366 days, not {period:?}"
            ));
        }
        let burst = if algorithm.has_burst() { burst } else { count };
        if burst == 0 || burst > Rule::MAX_COUNT {
            return Err(format!(
                "burst must be between 1 and {}, not {burst}",
                Rule::MAX_COUNT
            ));
        }
        if algorithm.has_burst()
            && u128::from(burst) * period_ms * 1000 > u128::from(Rule::MAX_BURST_PERIOD_US)
        {
            return Err(
                "burst × period (in µs) must be at most 2^52 for token_bucket and gcra".to_owned(),
            );
        }
        Ok(Rule {
            algorithm,
            count,
            burst,
            period_ms: period_ms as u64,
            local_quota: 0,
            subject_limits: false,
        })
    }

    /// The same rule with a bucket capacity of `burst` (`token_bucket` and
    /// `gcra` only).
    ///
    /// # Panics
    ///
    /// If the algorithm has no burst, `burst` is 0 or over
    /// [`Rule::MAX_COUNT`], or `burst × period` exceeds
    /// [`Rule::MAX_BURST_PERIOD_US`].
    pub const fn with_burst(self, burst: u64) -> Rule {
        assert!(
            self.algorithm.has_burst(),
            "`burst` applies to token_bucket and gcra rules only"
        );
        assert!(burst >= 1, "a rate-limit rule's burst must be at least 1");
        assert!(
            burst <= Rule::MAX_COUNT,
            "a rate-limit rule's burst must be at most Rule::MAX_COUNT (1_000_000_000)"
        );
        let rule = Rule { burst, ..self };
        rule.check_burst_period();
        rule
    }

    const fn check_burst_period(&self) {
        if self.algorithm.has_burst() {
            assert!(
                self.burst <= Rule::MAX_BURST_PERIOD_US / (self.period_ms * 1000),
                "burst × period (in µs) must be at most Rule::MAX_BURST_PERIOD_US (2^52) \
                 for token_bucket and gcra: use a shorter period or a smaller burst"
            );
        }
    }

    /// The same rule served from local quotas, on Redis: each instance
    /// takes a block of at most `max_block` units from the shared budget in
    /// one call, and serves calls from it in process until it is spent or
    /// its time is up. For hot keys (a global limit, one big tenant) that
    /// would otherwise cost a Redis round trip per call.
    ///
    /// - Exact: units are taken from the shared budget before they are
    ///   served, so the fleet never passes more than the rule allows (a
    ///   `fixed_window` block is served only within the window it was taken
    ///   in; a bucket's units are served at most a block's lifetime after
    ///   they were taken).
    /// - The price: units one instance holds while another is refused, at
    ///   most `max_block` per instance and key (`instances × max_block`
    ///   across the fleet). A block is sized to this instance's observed rate
    ///   of calls (about a fortieth of the period's worth, between 1 and
    ///   `max_block`), and lives a tenth of the period (10 ms to 1 s; a
    ///   `fixed_window` block no longer than its window); what is left of it
    ///   then is given back to the budget it was taken from.
    /// - A key Redis refused is refused in process, without a round trip,
    ///   until a call of that cost could pass (or for a block's lifetime,
    ///   whichever is shorter: units others give back are found again).
    /// - While Redis is down, a block already held is still spent; after
    ///   that the rule's failure policy answers.
    ///
    /// In process memory (no Redis) every check is local already and this
    /// does nothing; nor does it under several rules checked at once (the
    /// set is checked all or nothing in Redis).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::Rule;
    ///
    /// // 100,000 searches a second for the whole fleet, in blocks of up to 500.
    /// const SEARCH: Rule = Rule::fixed_window(100_000, Duration::from_secs(1)).with_local_quota(500);
    /// assert_eq!(SEARCH.local_quota(), Some(500));
    /// ```
    ///
    /// ```compile_fail
    /// use std::time::Duration;
    /// use ratelimit_runtime::Rule;
    ///
    /// // A concurrency rule's units are held in flight, not spent: no quota.
    /// const BROKEN: Rule = Rule::concurrency(10, Duration::from_secs(60)).with_local_quota(5);
    /// ```
    ///
    /// # Panics
    ///
    /// If `max_block` is 0 or over the rule's [`capacity`](Rule::capacity),
    /// or the algorithm is not `fixed_window`, `token_bucket` or `gcra`: a
    /// unit served later than it was counted would shift a sliding window
    /// (`sliding_log`, `sliding_window`), and a `concurrency` rule's units
    /// are held in flight, not spent. In a `const` this is a compile error.
    pub const fn with_local_quota(self, max_block: u64) -> Rule {
        assert!(
            Rule::takes_local_quota(self.algorithm),
            "a local quota applies to fixed_window, token_bucket and gcra rules only: \
             a unit served later than it was counted would shift a sliding window, \
             and a concurrency rule's units are held in flight, not spent"
        );
        assert!(
            max_block >= 1,
            "a local quota's block must be at least 1 unit"
        );
        assert!(
            max_block <= self.capacity(),
            "a local quota's block must be at most the rule's capacity (count, or burst)"
        );
        assert!(
            !self.subject_limits,
            "a rule reads its subjects' own limits or is served from local quotas, not both"
        );
        Rule {
            local_quota: max_block,
            ..self
        }
    }

    /// Whether rules of `algorithm` may be served from local quotas.
    pub(crate) const fn takes_local_quota(algorithm: Algorithm) -> bool {
        matches!(
            algorithm,
            Algorithm::FixedWindow | Algorithm::TokenBucket | Algorithm::Gcra
        )
    }

    /// The largest block of this rule's local quota, if it has one (see
    /// [`with_local_quota`](Rule::with_local_quota)).
    pub const fn local_quota(&self) -> Option<u64> {
        if self.local_quota == 0 {
            None
        } else {
            Some(self.local_quota)
        }
    }

    /// This rule with `base`'s options: its local quota (at most this
    /// rule's capacity) and whether it reads subject limits (an override of
    /// `base`'s numbers keeps them).
    pub(crate) fn keeping_options(self, base: &Rule) -> Rule {
        Rule {
            local_quota: base.local_quota.min(self.capacity()),
            subject_limits: base.subject_limits,
            ..self
        }
    }

    /// The same rule, but each check first reads the limit its subject may
    /// have of its own (set with
    /// [`RateLimiter::set_subject_limit`](crate::RateLimiter::set_subject_limit) or
    /// [`set_subject_limit_named`](crate::RateLimiter::set_subject_limit_named), on Redis
    /// also with `redis-cli`): "tenant 42 is on the enterprise plan, 1,000 a
    /// second". A subject without one has the rule's `count` and `burst`.
    /// On Redis the check's own script reads it, in the same round trip (at
    /// the cost of one more read in the script); in process memory the
    /// limiter keeps them. Rules without it read nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratelimit_runtime::Rule;
    ///
    /// const API: Rule = Rule::token_bucket(100, Duration::from_secs(1)).with_subject_limits();
    /// assert!(API.reads_subject_limits());
    /// ```
    ///
    /// # Panics
    ///
    /// If the rule has a local quota ([`Rule::with_local_quota`]): a block
    /// served locally cannot follow a subject's own limit. In a `const` this
    /// is a compile error.
    pub const fn with_subject_limits(self) -> Rule {
        assert!(
            self.local_quota == 0,
            "a rule reads its subjects' own limits or is served from local quotas, not both"
        );
        Rule {
            subject_limits: true,
            ..self
        }
    }

    /// Whether a check reads its subject's own limit first (see
    /// [`with_subject_limits`](Rule::with_subject_limits)).
    pub const fn reads_subject_limits(&self) -> bool {
        self.subject_limits
    }

    /// This rule with a subject's own `limit` in place of its count and
    /// burst, or why the limit does not fit it.
    pub(crate) fn limited_to(&self, limit: &SubjectLimit) -> Result<Rule, String> {
        Rule::try_new(
            self.algorithm,
            limit.count,
            self.period(),
            limit.burst.unwrap_or(limit.count),
        )
        .map(|rule| rule.keeping_options(self))
    }

    /// The algorithm this rule is enforced with.
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// How many units (calls, unless a call has a cost) are allowed per period;
    /// for `concurrency`, how many may be in flight.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The bucket capacity of `token_bucket` and `gcra` (equal to `count`
    /// for the other algorithms).
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// The window length (for `concurrency`, how long a lease lasts), in
    /// whole milliseconds.
    pub const fn period(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }

    pub(crate) const fn period_us(&self) -> u64 {
        self.period_ms * 1000
    }

    /// The most units one call may cost under this rule: `burst` for the
    /// bucket algorithms, else `count`. A costlier call could never pass and
    /// is an error.
    pub const fn capacity(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.burst
        } else {
            self.count
        }
    }
}

/// A subject's own limit, in place of its rule's `count` and `burst` (see
/// [`Rule::with_subject_limits`]). The period stays the rule's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubjectLimit {
    /// Units allowed per period.
    pub count: u64,
    /// The bucket's capacity (`token_bucket`, `gcra`); `None`: `count`.
    /// Ignored by the other algorithms.
    pub burst: Option<u64>,
}

impl SubjectLimit {
    /// A limit of `count` units per period, with a burst of `count`.
    pub const fn new(count: u64) -> SubjectLimit {
        SubjectLimit { count, burst: None }
    }

    /// The same limit with a bucket capacity of `burst`.
    pub const fn with_burst(self, burst: u64) -> SubjectLimit {
        SubjectLimit {
            burst: Some(burst),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn const_rules_keep_their_values() {
        const R: Rule = Rule::fixed_window(3, Duration::from_millis(1500));
        assert_eq!(R.count(), 3);
        assert_eq!(R.period(), Duration::from_millis(1500));
        assert_eq!(R.algorithm(), Algorithm::FixedWindow);
        assert_eq!(R.capacity(), 3);
        const B: Rule = Rule::gcra(10, Duration::from_secs(1)).with_burst(25);
        assert_eq!((B.count(), B.burst(), B.capacity()), (10, 25, 25));
        let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            [
                "fixed_window",
                "sliding_log",
                "sliding_window",
                "token_bucket",
                "gcra",
                "concurrency"
            ]
        );
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

    #[test]
    #[should_panic(expected = "applies to token_bucket and gcra rules only")]
    fn burst_without_bucket_panics() {
        let _ = Rule::sliding_log(1, Duration::from_secs(1)).with_burst(2);
    }

    #[test]
    #[should_panic(expected = "burst × period")]
    fn bucket_too_large_for_exact_arithmetic_panics() {
        let _ = Rule::token_bucket(1_000_000, Duration::from_secs(24 * 3600));
    }

    #[test]
    fn the_largest_exact_bucket_is_accepted() {
        let period_us = 75 * 60 * 1_000_000u64;
        let burst = Rule::MAX_BURST_PERIOD_US / period_us;
        let rule = Rule::gcra(1, Duration::from_micros(period_us)).with_burst(burst);
        assert_eq!(rule.burst(), burst);
    }
}
