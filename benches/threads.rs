//! Does throughput grow from 1 to 2 threads? The in-memory check over 100k
//! keys (the work of `memory/100k_keys` and `memory/100k_keys_2_threads`),
//! measured as pairs of back-to-back runs, one thread then two or two then
//! one (the order alternates), so a drift of the shared machine falls on
//! both halves of a pair alike.
//!
//! `cargo bench -p ratelimit-benches --bench threads [-- --rounds 21 --checks 1000000]`
//!
//! `cargo bench -p ratelimit-benches --bench threads -- --turns [--rounds 5]` measures instead
//! what one check costs when two threads take turns on one key, each check
//! finding the key's memory last written by the other core (as a global
//! limit's checks do on a server's workers): per turn, the turn alone, a
//! `#[rate_limit]` fn whose key is fixed (its state pinned to a cache line
//! of its own) and a check by hand of one key (through the store's shards).
//! One JSON line each: `{"turns", "ns_per_turn", "runs"}`, the median and
//! every round's.
//!
//! `cargo bench -p ratelimit-benches --bench threads -- --versus [--rounds 11] [--shapes]`
//! measures instead one thread's check over the 100k keys against
//! governor's, side by side: each round runs ours then governor's over
//! every key once, in fill order and in one fixed random order; with
//! `--shapes`, for each shape of key in turn (`common::SHAPES`: short keys,
//! IPv4, IPv6 /64 and header digests as well). One JSON line per algorithm
//! and order: `{"versus": "governor", "algorithm", "order", "ours_ns",
//! "governor_ns", "ratio", "ratios", "shape"}`, the medians of the rounds
//! and every round's ratio.
//!
//! Criterion's two rows of an algorithm run seconds apart, and on these two
//! shared cores a row on two threads needs both cores for its whole length:
//! one slow stretch in either row decides the comparison. Here each round is
//! a pair, its gain the 1-thread time per check over the 2-thread wall time
//! per check (above 1: throughput grows), and the median round is the
//! answer. Prints one JSON line per limiter: `{"limiter", "one_thread_ns",
//! "two_threads_ns", "gain", "gains", "handoff_ns"}`, the two times the medians of their
//! runs, `gain` the median round's, `gains` every round's in order, and
//! `handoff_ns` the machine's cost of handing a cache line from one thread
//! to the other, measured before and after the rounds (see [`handoff_ns`]):
//! on these shared cores it changes from one stretch of minutes to another,
//! and with it what two threads gain.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{KEYS, LASTING, SHAPES, governor, keys, keys_of, ours, ours_for, rule, shuffled};
use ratelimit_runtime::{Algorithm, RateLimited, RateLimiter, Rule, rate_limit};
use ratelimit_test_support::ready;

/// Runs `checks` checks on `threads` threads at once (each its own half of
/// the keys on two), `check(key)` each (a `&String`, as governor's keys are); the wall time.
fn run(
    keys: &[String],
    checks: usize,
    threads: usize,
    check: &(impl Fn(&String) + Sync),
) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let share = &keys[t * KEYS / threads..(t + 1) * KEYS / threads];
            s.spawn(move || {
                for i in 0..checks / threads {
                    check(&share[i % share.len()]);
                }
            });
        }
    });
    start.elapsed()
}

/// The machine's cost of handing one cache line from one thread to the
/// other: two threads take turns writing one atomic, each waiting for the
/// other's write (ns per handoff, one way). What a check pays for each line
/// both threads write: a lock, a shared entry.
fn handoff_ns() -> f64 {
    let turn = AtomicU64::new(0);
    let turns = 200_000u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for me in 0..2 {
            let turn = &turn;
            s.spawn(move || {
                let mut mine = me;
                while mine < turns {
                    while turn.load(Ordering::Acquire) != mine {
                        std::hint::spin_loop();
                    }
                    turn.store(mine + 1, Ordering::Release);
                    mine += 2;
                }
            });
        }
    });
    start.elapsed().as_nanos() as f64 / turns as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `rounds` pairs of runs of `check`; prints the limiter's line.
fn pairs(
    name: &str,
    keys: &[String],
    rounds: usize,
    checks: usize,
    check: impl Fn(&String) + Sync,
) {
    // Every key stored once, and the code warm.
    run(keys, KEYS, 1, &check);
    let before = handoff_ns();
    let (mut ones, mut twos, mut gains) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let per_check =
            |threads| run(keys, checks, threads, &check).as_nanos() as f64 / checks as f64;
        let (one, two) = if round % 2 == 0 {
            let one = per_check(1);
            (one, per_check(2))
        } else {
            let two = per_check(2);
            (per_check(1), two)
        };
        ones.push(one);
        twos.push(two);
        gains.push(one / two);
    }
    let after = handoff_ns();
    let all: Vec<String> = gains.iter().map(|g| format!("{g:.3}")).collect();
    println!(
        "{{\"limiter\":\"{name}\",\"one_thread_ns\":{:.1},\"two_threads_ns\":{:.1},\"gain\":{:.3},\"gains\":[{}],\"handoff_ns\":[{before:.1},{after:.1}]}}",
        median(ones),
        median(twos),
        median(gains),
        all.join(",")
    );
}

/// ns per check of `check` over `keys` in `order`, once each.
fn sweep(keys: &[String], order: &[usize], check: &impl Fn(&String)) -> f64 {
    let start = Instant::now();
    for &i in order {
        check(&keys[i]);
    }
    start.elapsed().as_nanos() as f64 / order.len() as f64
}

/// `--versus`: see the top of this file.
fn versus_main(rounds: usize, shapes: &[&str]) {
    for shape in shapes {
        versus_shape(rounds, shape);
    }
}

/// `--versus` over keys of one shape.
fn versus_shape(rounds: usize, shape: &str) {
    let keys = keys_of(shape);
    let fill: Vec<usize> = (0..KEYS).collect();
    let random = shuffled(KEYS);
    let gov = governor();
    let governor = |key: &String| {
        std::hint::black_box(gov.check_key(key).is_ok());
    };
    for algorithm in LASTING {
        let (store, limiter) = ours_for(&format!("versus-{shape}"), algorithm);
        let rule = rule(algorithm, true);
        let ours = |key: &String| ours(&store, &limiter, &rule, key);
        for (name, order) in [("fill", &fill), ("random", &random)] {
            // Every key stored once on both sides, and the code warm.
            sweep(&keys, order, &ours);
            sweep(&keys, order, &governor);
            let (mut mine, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            // Always ours then governor's: each sweep then follows one of
            // the other side, which found its own memory as far from the
            // cache as this one's. (Alternating the order puts a side after
            // itself every other round, and that sweep finds its memory
            // warm: a 30 % swing either way.)
            for _ in 0..rounds {
                let a = sweep(&keys, order, &ours);
                let b = sweep(&keys, order, &governor);
                mine.push(a);
                theirs.push(b);
                ratios.push(a / b);
            }
            let all: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
            println!(
                "{{\"versus\":\"governor\",\"algorithm\":\"{}\",\"order\":\"{name}\",\
                 \"ours_ns\":{:.1},\"governor_ns\":{:.1},\"ratio\":{:.3},\"ratios\":[{}],\
                 \"shape\":\"{shape}\"}}",
                algorithm.name(),
                median(mine),
                median(theirs),
                median(ratios),
                all.join(",")
            );
        }
    }
}

/// A check with a fixed key (pinned), for `--turns`.
#[rate_limit(key = "threads-turns", count = 1_000_000_000, period = 1)]
async fn fixed_key() -> Result<(), RateLimited> {
    Ok(())
}

/// The same rule, checked by hand.
static TURNS_RULE: Rule = Rule::fixed_window(1_000_000_000, Duration::from_secs(1));

/// Two threads taking `turns` turns, each running `work` in its turn; ns
/// per turn.
fn turns(turns: u64, work: &(impl Fn() + Sync)) -> f64 {
    let turn = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for me in 0..2 {
            let turn = &turn;
            s.spawn(move || {
                loop {
                    let t = turn.load(Ordering::Acquire);
                    if t >= turns {
                        break;
                    }
                    if t % 2 != me {
                        std::hint::spin_loop();
                        continue;
                    }
                    work();
                    turn.store(t + 1, Ordering::Release);
                }
            });
        }
    });
    start.elapsed().as_nanos() as f64 / turns as f64
}

/// `--turns`: see the top of this file.
fn turns_main(rounds: usize) {
    let global = RateLimiter::global();
    let kinds: [(&str, &(dyn Fn() + Sync)); 3] = [
        ("alone", &|| {}),
        ("fixed_key", &|| ready(fixed_key()).expect("never refused")),
        ("one_key_by_hand", &|| {
            let decision = ready(global.check(&TURNS_RULE, "limiter:threads-turns-by-hand"));
            assert!(decision.expect("in memory").allowed);
        }),
    ];
    let mut runs = vec![Vec::new(); kinds.len()];
    for _ in 0..rounds {
        for (i, (_, work)) in kinds.iter().enumerate() {
            runs[i].push(turns(400_000, work));
        }
    }
    for ((name, _), runs) in kinds.iter().zip(runs) {
        let all: Vec<String> = runs.iter().map(|r| format!("{r:.1}")).collect();
        println!(
            "{{\"turns\":\"{name}\",\"ns_per_turn\":{:.1},\"runs\":[{}]}}",
            median(runs.clone()),
            all.join(",")
        );
    }
}

fn main() {
    let (mut rounds, mut checks, mut turns, mut versus) = (None, 1_000_000, false, false);
    let mut shapes: &[&str] = &SHAPES[..1];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a whole number"))
        };
        match arg.as_str() {
            "--rounds" => rounds = Some(value("--rounds").max(1)),
            "--turns" => turns = true,
            "--versus" => versus = true,
            "--shapes" => shapes = &SHAPES,
            "--checks" => checks = value("--checks").max(2),
            // What `cargo bench` passes to every bench.
            "--bench" => {}
            other => panic!(
                "unknown argument {other}: --rounds N, --checks N, --turns, --versus [--shapes]"
            ),
        }
    }
    if turns {
        return turns_main(rounds.unwrap_or(5));
    }
    if versus {
        return versus_main(rounds.unwrap_or(11), shapes);
    }
    let rounds = rounds.unwrap_or(21);
    let keys = keys();
    for algorithm in Algorithm::ALL {
        let (store, limiter) = ours_for("threads", algorithm);
        let rule = rule(algorithm, true);
        pairs(algorithm.name(), &keys, rounds, checks, |key| {
            ours(&store, &limiter, &rule, key)
        });
    }
    let gov = governor();
    pairs("governor", &keys, rounds, checks, |key| {
        std::hint::black_box(gov.check_key(key).is_ok());
    });
}
