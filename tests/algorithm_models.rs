//! Model tests: for each algorithm a reference model written plainly here,
//! and random call sequences (times, costs) on which the in-memory backend
//! must decide exactly as the model does.
//!
//! `remaining` and `allowed` are compared directly; `retry_after` and
//! `reset_after` are checked by asking the model at exactly that time (the
//! call must pass; the budget must be whole) and one microsecond earlier
//! (it must not yet).

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use ratelimit_runtime::backend::memory::MemoryBackend;
use ratelimit_runtime::{Algorithm, ManualClock, Rule};

trait Model: Clone {
    /// Units a call could take at `now`, without taking them.
    fn remaining(&self, now: u64) -> u64;
    /// Records an allowed call.
    fn take(&mut self, now: u64, cost: u64);
}

#[derive(Clone, Debug)]
struct Params {
    count: u64,
    burst: u64,
    period: u64,
}

#[derive(Clone)]
struct FixedWindow {
    p: Params,
    used: u64,
    ends: Option<u64>,
}

impl Model for FixedWindow {
    fn remaining(&self, now: u64) -> u64 {
        match self.ends {
            Some(ends) if now < ends => self.p.count - self.used,
            _ => self.p.count,
        }
    }
    fn take(&mut self, now: u64, cost: u64) {
        match self.ends {
            Some(ends) if now < ends => self.used += cost,
            _ => {
                self.used = cost;
                self.ends = Some(now + self.p.period);
            }
        }
    }
}

/// Every allowed unit's time, forever.
#[derive(Clone)]
struct SlidingLog {
    p: Params,
    times: Vec<u64>,
}

impl Model for SlidingLog {
    fn remaining(&self, now: u64) -> u64 {
        let in_window = self
            .times
            .iter()
            .filter(|&&t| t + self.p.period > now)
            .count() as u64;
        self.p.count.saturating_sub(in_window)
    }
    fn take(&mut self, now: u64, cost: u64) {
        self.times.extend((0..cost).map(|_| now));
    }
}

/// Units per clock-aligned window; the previous one weighted by overlap.
#[derive(Clone)]
struct SlidingWindow {
    p: Params,
    windows: BTreeMap<u64, u64>,
}

impl Model for SlidingWindow {
    fn remaining(&self, now: u64) -> u64 {
        let index = now / self.p.period;
        let into = now % self.p.period;
        let current = self.windows.get(&index).copied().unwrap_or(0);
        let previous = match index {
            0 => 0,
            i => self.windows.get(&(i - 1)).copied().unwrap_or(0),
        };
        let weighted =
            ((previous as f64) * ((self.p.period - into) as f64) / (self.p.period as f64)).floor();
        self.p.count.saturating_sub(current + weighted as u64)
    }
    fn take(&mut self, now: u64, cost: u64) {
        *self.windows.entry(now / self.p.period).or_default() += cost;
    }
}

/// Token bucket and GCRA: replays every allowed call, tokens as exact
/// rationals (`u128` numerators over `period`).
#[derive(Clone)]
struct Bucket {
    p: Params,
    calls: Vec<(u64, u64)>,
}

impl Model for Bucket {
    fn remaining(&self, now: u64) -> u64 {
        let full = self.p.burst as u128 * self.p.period as u128;
        let rate = self.p.count as u128;
        let mut tokens = full;
        let mut last: Option<u64> = None;
        for &(t, cost) in &self.calls {
            if let Some(last) = last {
                tokens = full.min(tokens + (t - last) as u128 * rate);
            }
            tokens -= cost as u128 * self.p.period as u128;
            last = Some(t);
        }
        if let Some(last) = last {
            tokens = full.min(tokens + (now - last) as u128 * rate);
        }
        (tokens / self.p.period as u128) as u64
    }
    fn take(&mut self, now: u64, cost: u64) {
        self.calls.push((now, cost));
    }
}

/// Leases that are never released: each expires `period` after it was taken.
#[derive(Clone)]
struct Concurrency {
    p: Params,
    leases: Vec<(u64, u64)>,
}

impl Model for Concurrency {
    fn remaining(&self, now: u64) -> u64 {
        let held: u64 = self
            .leases
            .iter()
            .filter(|(expires, _)| *expires > now)
            .map(|(_, cost)| cost)
            .sum();
        self.p.count.saturating_sub(held)
    }
    fn take(&mut self, now: u64, cost: u64) {
        self.leases.push((now + self.p.period, cost));
    }
}

fn rule(algorithm: Algorithm, p: &Params) -> Rule {
    let rule = Rule::new(algorithm, p.count, Duration::from_micros(p.period));
    if algorithm.has_burst() {
        rule.with_burst(p.burst)
    } else {
        rule
    }
}

fn capacity(algorithm: Algorithm, p: &Params) -> u64 {
    if algorithm.has_burst() {
        p.burst
    } else {
        p.count
    }
}

/// Runs `steps` (time advance in µs, raw cost) on the memory backend and the
/// model side by side.
fn same_as_model<M: Model>(algorithm: Algorithm, p: Params, mut model: M, steps: &[(u64, u64)]) {
    let rule = rule(algorithm, &p);
    let cap = capacity(algorithm, &p);
    let clock = ManualClock::new();
    let store = MemoryBackend::with_clock(clock.clone());
    let mut now = 0;
    for (i, &(advance, raw_cost)) in steps.iter().enumerate() {
        clock.advance(Duration::from_micros(advance));
        now += advance;
        let cost = 1 + raw_cost % cap;
        let decision = store.check_now(&rule, "k", cost);
        let expected = model.remaining(now) >= cost;
        if expected {
            model.take(now, cost);
        }
        let at = format!("{algorithm:?} step {i} at {now} µs, cost {cost}: {decision:?}");
        assert_eq!(decision.allowed, expected, "{at}");
        assert_eq!(decision.remaining, model.remaining(now), "{at}");

        let retry = decision.retry_after.as_micros() as u64;
        assert!(
            model.remaining(now + retry) >= cost,
            "retry_after too early: {at}"
        );
        if retry > 0 {
            assert!(
                model.remaining(now + retry - 1) < cost,
                "retry_after too late: {at}"
            );
        }
        let reset = decision.reset_after.as_micros() as u64;
        assert_eq!(
            model.remaining(now + reset),
            cap,
            "budget not whole at reset_after: {at}"
        );
        // The two-counter approximation rounds down, so its budget can be
        // whole a little before its windows have passed.
        if reset > 0 && algorithm != Algorithm::SlidingWindow {
            assert!(
                model.remaining(now + reset - 1) < cap,
                "reset_after too late: {at}"
            );
        }
    }
}

fn params() -> impl Strategy<Value = Params> {
    (
        1u64..=5,
        1u64..=6,
        prop_oneof![
            Just(1_000u64),
            Just(7_000),
            Just(1_000_000),
            Just(60_000_000)
        ],
    )
        .prop_map(|(count, burst, period)| Params {
            count,
            burst,
            period,
        })
}

/// Advances mostly within a period, sometimes zero, sometimes long jumps.
fn steps(max_period: u64) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let advance = prop_oneof![
        3 => Just(0u64),
        6 => 0..max_period / 2,
        2 => 0..=2 * max_period,
        1 => Just(1u64),
    ];
    prop::collection::vec((advance, 0u64..100), 1..60)
}

fn cases() -> impl Strategy<Value = (Params, Vec<(u64, u64)>)> {
    params().prop_flat_map(|p| {
        let period = p.period;
        (Just(p), steps(period))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn fixed_window((p, steps) in cases()) {
        same_as_model(Algorithm::FixedWindow, p.clone(), FixedWindow { p, used: 0, ends: None }, &steps);
    }

    #[test]
    fn sliding_log((p, steps) in cases()) {
        same_as_model(Algorithm::SlidingLog, p.clone(), SlidingLog { p, times: vec![] }, &steps);
    }

    #[test]
    fn sliding_window((p, steps) in cases()) {
        same_as_model(Algorithm::SlidingWindow, p.clone(), SlidingWindow { p, windows: BTreeMap::new() }, &steps);
    }

    #[test]
    fn token_bucket((p, steps) in cases()) {
        same_as_model(Algorithm::TokenBucket, p.clone(), Bucket { p, calls: vec![] }, &steps);
    }

    #[test]
    fn gcra((p, steps) in cases()) {
        same_as_model(Algorithm::Gcra, p.clone(), Bucket { p, calls: vec![] }, &steps);
    }

    #[test]
    fn concurrency((p, steps) in cases()) {
        same_as_model(Algorithm::Concurrency, p.clone(), Concurrency { p, leases: vec![] }, &steps);
    }
}
