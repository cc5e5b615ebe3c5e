//! Every algorithm as a pure state machine on integer microseconds, and the
//! [`REGISTRY`]: the one table that names each algorithm, says whether it
//! takes a burst or holds leases, and gives its state machine (run by the
//! in-memory backend) and its Lua function (run by Redis). Both give the same
//! decisions for the same calls and times; the equivalence tests hold them
//! side by side.
//!
//! Token counts of the bucket algorithms are fixed point with `period_us`
//! units per token, so refilling at `count` per `period` adds exactly
//! `count` units per microsecond and nothing is ever rounded. Every product
//! stays below 2^53 (see [`Rule::MAX_BURST_PERIOD_US`]), where Lua's doubles
//! are still exact integers.
//!
//! A check that consumes answers (through [`stamp`]) the identity of what it
//! was counted in: a window's end, a sliding log's entry (its time), or the
//! time of the call in a state that keeps when it began (`born`: a sliding
//! window's, a bucket's since it was last full or reset). A refund names it
//! and gives back only there; anywhere else it does nothing.

use std::time::Duration;

mod concurrency;
mod fixed_window;
mod gcra;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub(crate) use concurrency::{acquire, release};
pub(crate) use sliding_log::Log;
pub(crate) use token_bucket::Bucket;

use crate::decision::Decision;
use crate::rule::{Algorithm, Rule};

/// What one check found, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) allowed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_after_us: u64,
    pub(crate) retry_after_us: u64,
    /// The count of the subject's own limit that applied (see
    /// [`Rule::with_subject_limits`]); 0: the rule's.
    pub(crate) limit: u64,
}

impl Outcome {
    pub(crate) fn decision(self, rule: &Rule) -> Decision {
        Decision {
            allowed: self.allowed,
            limit: if self.limit > 0 {
                self.limit
            } else {
                rule.count()
            },
            remaining: self.remaining,
            reset_after: Duration::from_micros(self.reset_after_us),
            retry_after: Duration::from_micros(self.retry_after_us),
        }
    }
}

/// A concurrency lease: `cost` units held until `expires` unless released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) id: u64,
    pub(crate) expires: u64,
    pub(crate) cost: u64,
}

/// What one key holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    FixedWindow {
        used: u64,
        ends: u64,
    },
    /// Call times, oldest first; one entry per unit of cost.
    SlidingLog(Log),
    /// `born`: when the counting began (the first call since there was no
    /// state), kept across windows. Counts are at most `Rule::MAX_COUNT`.
    SlidingWindow {
        start: u64,
        born: u64,
        cur: u32,
        prev: u32,
    },
    /// Tokens in fixed point, under the period they were counted in.
    TokenBucket(Bucket),
    /// The theoretical arrival time `tat + rem / count` µs; `born`: when the
    /// bucket last started from empty (no state, or a TAT passed).
    Gcra {
        tat: u64,
        born: u64,
        rem: u32,
    },
    /// Leases, in the order they were taken (so by expiry).
    Concurrency(Vec<Lease>),
}

impl State {
    /// When this state is worth nothing any more (the key can be dropped).
    pub(crate) fn expires_at(&self, rule: &Rule) -> u64 {
        let period = rule.period_us();
        match self {
            State::FixedWindow { ends, .. } => *ends,
            State::SlidingLog(log) => log.back().map_or(0, |newest| newest + period),
            State::SlidingWindow { start, .. } => start + 2 * period,
            State::TokenBucket(bucket) => {
                let capacity = rule.burst() * period;
                let tokens = bucket.tokens_under(period).min(capacity);
                bucket.last() + (capacity - tokens).div_ceil(rule.count())
            }
            State::Gcra { tat, rem, .. } => tat + u64::from(*rem > 0),
            State::Concurrency(leases) => leases.iter().map(|l| l.expires).max().unwrap_or(0),
        }
    }
}

/// A refund: gives back `units` (the fourth argument) at `now` (µs) of the
/// charge whose stamp is the last argument (see [`stamp`]).
pub(crate) type Refund = fn(&mut Option<State>, &Rule, u64, u64, u64);

/// How an algorithm lets a call wait its turn: a reservation, recorded at
/// the time the call may go (the next caller queues behind it), and its
/// cancel.
#[derive(Debug)]
pub(crate) struct Waiting {
    /// Reserves `cost` units at `now` for a call that may wait up to the
    /// last argument (µs, at most [`wait_cap`]): see [`reserve`].
    pub(crate) reserve: fn(&mut Option<State>, &Rule, u64, u64, u64) -> Outcome,
    /// Gives back at `now` a reservation of `cost` units made at the fourth
    /// argument, answered the position in the fifth: see [`cancel`].
    pub(crate) cancel: fn(&mut Option<State>, &Rule, u64, u64, u64, u64),
}

/// One algorithm, as every part of the crate knows it.
#[derive(Debug)]
pub(crate) struct Spec {
    pub(crate) algorithm: Algorithm,
    /// Its name: in the attribute (`algorithm = gcra`), in logs, and as its
    /// Lua function's name.
    pub(crate) name: &'static str,
    /// Whether `burst` means something for it.
    pub(crate) burst: bool,
    /// Whether a call holds its units until it ends (a lease to release).
    pub(crate) leases: bool,
    /// Whether Redis keeps its state in a string (read ahead, with the
    /// batch's `MGET`), not a sorted set.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) string: bool,
    /// Its state machine: checks and consumes `cost` units at `now` (µs).
    pub(crate) check: fn(&mut Option<State>, &Rule, u64, u64) -> Outcome,
    /// Gives back units at `now` (µs); `None` where a refund means nothing
    /// (a lease is given back by its permit).
    pub(crate) refund: Option<Refund>,
    /// What an allowed check at `now` was counted in, from its outcome and
    /// the rule's period (µs): the stamp its refund names.
    pub(crate) stamp: fn(u64, u64, &Outcome) -> u64,
    /// Its reservation and the cancel of one, where a call may wait its
    /// turn (the buckets); `None` where waiting is refused.
    pub(crate) wait: Option<Waiting>,
    /// Its Lua source, defining `local function <name>(key, now, slack,
    /// count, burst, period, cost, id)` for the Redis scripts, and
    /// `<name>_refund(key, now, slack, count, burst, period, units, stamp)`
    /// where it has a refund (the stamp in decimal), and
    /// `<name>_reserve(key, now, slack, count, burst, period, cost,
    /// max_wait)` and `<name>_cancel(key, now, slack, count, burst, period,
    /// cost, "<at>:<position>")` where it has [`Spec::wait`].
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) lua: &'static str,
}

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("../backend/redis/lua/", $name, ".lua"))
    };
}

/// Every algorithm, in the order of [`Algorithm::ALL`] (checked below): its
/// place is its op id on the Redis wire (place + 1). Adding an algorithm is
/// a variant of [`Algorithm`], a Rust file and a Lua file, and a line here.
pub(crate) const REGISTRY: [Spec; 6] = [
    Spec {
        algorithm: Algorithm::FixedWindow,
        name: "fixed_window",
        burst: false,
        leases: false,
        string: true,
        check: fixed_window::check,
        refund: Some(fixed_window::refund),
        stamp: fixed_window::stamp,
        wait: None,
        lua: lua!("fixed_window"),
    },
    Spec {
        algorithm: Algorithm::SlidingLog,
        name: "sliding_log",
        burst: false,
        leases: false,
        string: false,
        check: sliding_log::check,
        refund: Some(sliding_log::refund),
        stamp: sliding_log::stamp,
        wait: None,
        lua: lua!("sliding_log"),
    },
    Spec {
        algorithm: Algorithm::SlidingWindow,
        name: "sliding_window",
        burst: false,
        leases: false,
        string: true,
        check: sliding_window::check,
        refund: Some(sliding_window::refund),
        stamp: at_the_call,
        wait: None,
        lua: lua!("sliding_window"),
    },
    Spec {
        algorithm: Algorithm::TokenBucket,
        name: "token_bucket",
        burst: true,
        leases: false,
        string: true,
        check: token_bucket::check,
        refund: Some(token_bucket::refund),
        stamp: at_the_call,
        wait: Some(Waiting {
            reserve: token_bucket::reserve,
            cancel: token_bucket::cancel,
        }),
        lua: lua!("token_bucket"),
    },
    Spec {
        algorithm: Algorithm::Gcra,
        name: "gcra",
        burst: true,
        leases: false,
        string: true,
        check: gcra::check,
        refund: Some(gcra::refund),
        stamp: at_the_call,
        wait: Some(Waiting {
            reserve: gcra::reserve,
            cancel: gcra::cancel,
        }),
        lua: lua!("gcra"),
    },
    Spec {
        algorithm: Algorithm::Concurrency,
        name: "concurrency",
        burst: false,
        leases: true,
        string: false,
        check: concurrency::check,
        refund: None,
        stamp: at_the_call,
        wait: None,
        lua: lua!("concurrency"),
    },
];

// Each algorithm's place in the registry is its place in `Algorithm::ALL`
// and its discriminant, so `spec` is an index.
const _: () = {
    assert!(REGISTRY.len() == Algorithm::ALL.len());
    let mut i = 0;
    while i < REGISTRY.len() {
        assert!(REGISTRY[i].algorithm as usize == i);
        assert!(Algorithm::ALL[i] as usize == i);
        i += 1;
    }
};

// The name and burst of an algorithm are the registry's: its methods live
// with the table, so the rule does not reach up to the algorithms.
impl Algorithm {
    /// The name used in the attribute (`algorithm = fixed_window`) and in logs.
    pub const fn name(self) -> &'static str {
        spec(self).name
    }

    /// Whether `burst` means something for this algorithm.
    pub const fn has_burst(self) -> bool {
        spec(self).burst
    }
}

/// The registry's entry of `algorithm`.
pub(crate) const fn spec(algorithm: Algorithm) -> &'static Spec {
    &REGISTRY[algorithm as usize]
}

/// Checks and consumes `cost` units at time `now` (µs). `slot` is the key's
/// state (`None`: nothing stored); it is left alone when the call is refused.
///
/// `cost` is between 1 and `rule.capacity()`. A concurrency check takes a
/// lease that is never released: use [`acquire`] for those.
pub(crate) fn check(slot: &mut Option<State>, rule: &Rule, now: u64, cost: u64) -> Outcome {
    (spec(rule.algorithm()).check)(slot, rule, now, cost)
}

/// What a check of cost 1 would answer at `now`, with nothing consumed.
pub(crate) fn peek(slot: &Option<State>, rule: &Rule, now: u64) -> Outcome {
    let mut state = slot.clone();
    if spec(rule.algorithm()).leases {
        acquire(&mut state, rule, now, 1, 0)
    } else {
        check(&mut state, rule, now, 1)
    }
}

/// Gives back `units` at `now` of the charge `stamp` names, where the rule's
/// algorithm has a refund; `false` where it has none.
pub(crate) fn refund(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    units: u64,
    stamp: u64,
) -> bool {
    let Some(refund) = spec(rule.algorithm()).refund else {
        return false;
    };
    refund(slot, rule, now, units, stamp);
    true
}

/// The stamp of an allowed check at `now` under `rule`: what its refund
/// names (see [`Spec::stamp`]).
pub(crate) fn stamp(algorithm: Algorithm, period_us: u64, now: u64, outcome: &Outcome) -> u64 {
    (spec(algorithm).stamp)(now, period_us, outcome)
}

/// The longest wait (µs) a reservation under `rule` may be made for: a
/// reserved position stays below 2^53 (exact in Lua's doubles), so
/// `2^52 / count` µs, at least 4.5 s (the largest count), over an hour for
/// a count up to a million.
pub(crate) fn wait_cap(rule: &Rule) -> u64 {
    ((1 << 52) - 1) / rule.count()
}

/// Reserves `cost` units of `slot` at `now` for a call that may wait up to
/// `max_wait` µs (cut to [`wait_cap`]), where the rule's algorithm lets
/// calls wait (`None` where not).
///
/// A call a check would allow is that check (with no `retry_after`). One it would refuse but that
/// may go within `max_wait` is recorded as if made at the time it may go,
/// so that the next caller queues behind it: the answer is allowed, its
/// `retry_after_us` the wait, and its `remaining` the *position*: how far
/// (in 1/count µs) the bucket was then short of full, counted from `now`,
/// what [`cancel`] names (the wire's form too; [`Reservation`] reads it).
/// Any other call is refused as a check refuses it, and nothing is recorded.
pub(crate) fn reserve(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    max_wait: u64,
) -> Option<Outcome> {
    let waiting = spec(rule.algorithm()).wait.as_ref()?;
    Some((waiting.reserve)(
        slot,
        rule,
        now,
        cost,
        max_wait.min(wait_cap(rule)),
    ))
}

/// A call a reservation lets go at once: as its check answered, but with
/// no `retry_after` (on the wire, an allowed answer with one is a call that
/// waits).
fn at_once(outcome: Outcome) -> Outcome {
    Outcome {
        retry_after_us: 0,
        ..outcome
    }
}

/// Gives back at `now` a reservation of `cost` units made at `at` and
/// answered `position`, as golang.org/x/time/rate's `Reservation.Cancel`:
/// nothing once its time to go has come; all of it while no later
/// reservation queued behind it; less by what later reservations took
/// after it (their times were set behind it and stay), so nothing when
/// they took as much. Not in the bucket it was made in (reset since, or
/// full again and begun anew): nothing.
pub(crate) fn cancel(
    slot: &mut Option<State>,
    rule: &Rule,
    now: u64,
    cost: u64,
    at: u64,
    position: u64,
) {
    if let Some(waiting) = &spec(rule.algorithm()).wait {
        (waiting.cancel)(slot, rule, now, cost, at, position);
    }
}

/// A waiting reservation's answer in the wire's form (see [`reserve`]).
fn waiting(position: u64, count: u64, wait: u64) -> Outcome {
    Outcome {
        allowed: true,
        remaining: position,
        reset_after_us: position.div_ceil(count),
        retry_after_us: wait,
        limit: 0,
    }
}

/// How much of a reservation of `cost` made at `at` and answered
/// `position` a cancel at `now` gives back, the bucket being `ahead` (in
/// 1/count µs) short of full now and begun at `born`; `None`: nothing.
fn given_back(
    rule: &Rule,
    now: u64,
    cost: u64,
    at: u64,
    position: u64,
    ahead: u64,
    born: u64,
) -> Option<u64> {
    let count = rule.count();
    let tolerance = rule.burst() * rule.period_us();
    if now < at || born > at || position <= tolerance {
        return None;
    }
    let go = at + (position - tolerance).div_ceil(count);
    if now >= go {
        return None;
    }
    let later = (ahead + (now - at) * count).checked_sub(position)?;
    let step = cost * rule.period_us();
    (later < step).then(|| step - later)
}

/// A reservation's answer, read from its wire form (see [`reserve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reservation {
    /// The decision: allowed (after `wait_us`), or refused.
    pub(crate) outcome: Outcome,
    /// How long the call waits before it goes (µs).
    pub(crate) wait_us: u64,
    /// The position [`cancel`] names (0 when it does not wait).
    pub(crate) position: u64,
}

impl Reservation {
    pub(crate) fn read(outcome: Outcome) -> Reservation {
        if !outcome.allowed || outcome.retry_after_us == 0 {
            return Reservation {
                outcome,
                wait_us: 0,
                position: 0,
            };
        }
        Reservation {
            outcome: Outcome {
                allowed: true,
                remaining: 0,
                // When the budget is whole, counted from when the call goes.
                reset_after_us: outcome.reset_after_us - outcome.retry_after_us,
                retry_after_us: 0,
                limit: outcome.limit,
            },
            wait_us: outcome.retry_after_us,
            position: outcome.remaining,
        }
    }
}

/// The stamp of the algorithms whose states keep when they began: the
/// time of the call.
fn at_the_call(now: u64, _period: u64, _outcome: &Outcome) -> u64 {
    now
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::sliding_log::INLINE_LOG;
    use super::*;

    const S: u64 = 1_000_000;

    fn run(rule: &Rule, calls: &[(u64, u64)]) -> Vec<Outcome> {
        let mut slot = None;
        calls
            .iter()
            .map(|&(now, cost)| check(&mut slot, rule, now, cost))
            .collect()
    }

    fn allowed(outcomes: &[Outcome]) -> Vec<bool> {
        outcomes.iter().map(|o| o.allowed).collect()
    }

    #[test]
    fn sliding_log_counts_calls_in_any_period() {
        let rule = Rule::sliding_log(2, Duration::from_secs(1));
        let out = run(
            &rule,
            &[(0, 1), (S / 2, 1), (S - 1, 1), (S, 1), (S + S / 2, 1)],
        );
        assert_eq!(allowed(&out), [true, true, false, true, true]);
        assert_eq!(
            out[2].retry_after_us, 1,
            "the first call leaves the window at 1 s"
        );
        assert_eq!(out[1].reset_after_us, S);
    }

    #[test]
    fn a_log_keeps_its_order_in_place_and_on_the_heap() {
        // Calls of every cost around the inline capacity, and expiries,
        // held against a plain VecDeque of one time per unit.
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut log = Log::default();
        let mut plain = VecDeque::new();
        let mut spilled = false;
        for t in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x.is_multiple_of(3) {
                let period = (x >> 8) % 4;
                log.expire(t, period);
                while plain.front().is_some_and(|&s| s + period <= t) {
                    plain.pop_front();
                }
            } else {
                let n = (x >> 8) % (INLINE_LOG as u64 + 2);
                log.push(t, n);
                plain.extend(std::iter::repeat_n(t, n as usize));
            }
            if t.is_multiple_of(8) {
                // Back to an empty log, inline again: short runs try every
                // mix of pushes and expiries in place.
                log = Log::default();
                plain.clear();
            }
            assert_eq!(log.len(), plain.len() as u64, "at {t}");
            assert_eq!(log.back(), plain.back().copied(), "at {t}");
            for (i, &time) in plain.iter().enumerate() {
                assert_eq!(log.get(i as u64), time, "at {t}");
            }
            spilled |= matches!(log, Log::Heap(_));
        }
        assert!(spilled, "some runs spilled to the heap");
    }

    #[test]
    fn a_call_is_one_entry_whatever_it_costs() {
        // A billion units is one entry: nothing is written per unit.
        let rule = Rule::sliding_log(Rule::MAX_COUNT, Duration::from_secs(1));
        let out = run(&rule, &[(0, Rule::MAX_COUNT - 1), (1, 1), (2, 1), (S, 1)]);
        assert_eq!(allowed(&out), [true, true, false, true]);
        assert_eq!(out[2].retry_after_us, S - 2, "the first call leaves at 1 s");
        assert_eq!(out[3].remaining, Rule::MAX_COUNT - 2);
    }

    #[test]
    fn a_sliding_log_past_its_inline_calls_counts_them_all() {
        let rule = Rule::sliding_log(5, Duration::from_secs(1));
        let out = run(
            &rule,
            &[(0, 1), (1, 1), (2, 2), (3, 1), (4, 1), (S, 1), (S + 2, 3)],
        );
        assert_eq!(allowed(&out), [true, true, true, true, false, true, true]);
        assert_eq!(out[3].remaining, 0);
        assert_eq!(out[4].retry_after_us, S - 4, "the first call leaves at 1 s");
        assert_eq!(
            out[6].remaining, 0,
            "the calls at 1 and 2 µs left, 3 more fit"
        );
        assert_eq!(out[6].reset_after_us, S);
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let rule = Rule::sliding_window(10, Duration::from_secs(1));
        let mut slot = None;
        for _ in 0..10 {
            assert!(check(&mut slot, &rule, S / 2, 1).allowed);
        }
        // A quarter into the next window the previous one still weighs 7.5 -> 7.
        let o = check(&mut slot, &rule, S + S / 4, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, 2);
        let o = check(&mut slot, &rule, S + S / 4, 3);
        assert!(!o.allowed);
        // 3 more fit once the previous window weighs at most 10 - 3 - 1 = 6:
        // just past 0.3 s into the window (at exactly 0.3 s it weighs 7).
        assert_eq!(o.retry_after_us, 3 * S / 10 + 1 - S / 4);
        assert!(!check(&mut slot, &rule, S + 3 * S / 10, 3).allowed);
        assert!(check(&mut slot, &rule, S + 3 * S / 10 + 1, 3).allowed);
    }

    #[test]
    fn token_bucket_starts_full_and_refills_continuously() {
        let rule = Rule::token_bucket(3, Duration::from_secs(1)).with_burst(6);
        let mut slot = None;
        let o = check(&mut slot, &rule, 0, 6);
        assert!(o.allowed);
        assert_eq!(o.remaining, 0);
        assert_eq!(o.reset_after_us, 2 * S);
        let o = check(&mut slot, &rule, 0, 1);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 333_334, "a third of a second, rounded up");
        assert!(!check(&mut slot, &rule, 333_333, 1).allowed);
        assert!(check(&mut slot, &rule, 333_334, 1).allowed);
    }

    #[test]
    fn gcra_and_token_bucket_agree() {
        let mut now = 0;
        let calls: Vec<(u64, u64)> = (0..500u64)
            .map(|i| {
                now += i * 7_919 % 50_000;
                (now, 1 + i % 3)
            })
            .collect();
        let tb = Rule::token_bucket(7, Duration::from_millis(300)).with_burst(5);
        let gc = Rule::gcra(7, Duration::from_millis(300)).with_burst(5);
        assert_eq!(run(&tb, &calls), run(&gc, &calls));
    }

    #[test]
    fn gcra_retry_after_is_exact() {
        let rule = Rule::gcra(3, Duration::from_secs(1));
        let mut slot = None;
        for _ in 0..3 {
            assert!(check(&mut slot, &rule, 0, 1).allowed);
        }
        let o = check(&mut slot, &rule, 0, 1);
        assert_eq!(o.retry_after_us, 333_334);
        assert!(!check(&mut slot, &rule, o.retry_after_us - 1, 1).allowed);
        assert!(check(&mut slot, &rule, o.retry_after_us, 1).allowed);
    }

    #[test]
    fn a_cancel_gives_back_what_no_later_reservation_built_on() {
        for rule in [
            Rule::gcra(1, Duration::from_secs(1)).with_burst(1),
            Rule::token_bucket(1, Duration::from_secs(1)).with_burst(1),
        ] {
            let mut slot = None;
            let reserve = |slot: &mut Option<State>, now| {
                let outcome = reserve(slot, &rule, now, 1, 5 * S).unwrap();
                Reservation::read(outcome)
            };
            assert_eq!(reserve(&mut slot, 0).wait_us, 0, "the first goes at once");
            let second = reserve(&mut slot, 0);
            let third = reserve(&mut slot, 0);
            assert_eq!((second.wait_us, third.wait_us), (S, 2 * S), "in turn");
            // The second is cancelled with the third queued behind it: the
            // third keeps its time, so nothing comes back.
            let before = slot.clone();
            cancel(&mut slot, &rule, S / 2, 1, 0, second.position);
            assert_eq!(slot, before, "{rule:?}");
            // The third, the last, comes back whole: the next caller takes
            // its turn (at 2 s, 1.5 s from now).
            cancel(&mut slot, &rule, S / 2, 1, 0, third.position);
            assert_eq!(reserve(&mut slot, S / 2).wait_us, 3 * S / 2, "{rule:?}");
            // Once its time has come, a cancel gives nothing back.
            let before = slot.clone();
            cancel(&mut slot, &rule, 2 * S, 1, S / 2, 5 * S / 2);
            assert_eq!(slot, before, "{rule:?}");
        }
    }

    #[test]
    fn concurrency_leases_are_released_or_expire() {
        let rule = Rule::concurrency(2, Duration::from_secs(10));
        let mut slot = None;
        assert!(acquire(&mut slot, &rule, 0, 1, 1).allowed);
        assert!(acquire(&mut slot, &rule, 0, 1, 2).allowed);
        let o = acquire(&mut slot, &rule, 5, 1, 3);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 10 * S - 5);
        release(&mut slot, 1);
        assert!(acquire(&mut slot, &rule, 6, 1, 4).allowed);
        assert!(!acquire(&mut slot, &rule, 7, 1, 5).allowed);
        assert!(
            acquire(&mut slot, &rule, 10 * S, 1, 6).allowed,
            "lease 2 expired"
        );
    }
}
