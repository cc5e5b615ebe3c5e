//! The wire protocol of the batch script (`lua/batch.lua`), typed: one
//! encoder for what a call sends and one decoder for what it answers. Every
//! call uses them: a check that goes alone is a batch of one.
//!
//! A call is `FCALL <function> <n> KEYS.. ARGV..` (or `EVALSHA`):
//!
//! | argument | what |
//! |---|---|
//! | `KEYS` | one key per check, then one per release |
//! | `ARGV[1]` | the batch's distinct rules, 6 big-endian doubles each: [`Op`] id, count, burst, period (µs), [`TimeSource`] (µs; -1 for the server's `TIME`), flags: 1 if its checks carry a lease id, plus 2 or 4 if it reads subjects' own limits (capacity its count, or its burst) |
//! | `ARGV[2]` | one byte per check: the number (from 1) of its rule in `ARGV[1]` |
//! | `ARGV[3]` | the costs, one big-endian double per check then per release; empty when every cost is 1 |
//! | `ARGV[4]` | how many checks, first in `KEYS`, keep a string state and are the first of their key: the script reads them all in one `MGET` |
//! | `ARGV[5]` | the checks' deadlines in the server's time (µs), big-endian doubles: the earliest, then one per check; empty when none has one. A check the script reaches after its deadline is not run: its caller has stopped waiting, and counting it would be a phantom count |
//! | `ARGV[6]` | one byte per check: the number (from 1) of the set of rules it is a member of, 0 alone; empty when the batch holds no set. A set is one unit of the batch, all or nothing: every member read and decided before any is written, none written if one refuses |
//! | `ARGV[7..]` | the lease ids in decimal (64 bits do not fit a double): one per check whose rule carries one, in order, then one per release; a refund's is the stamp of the charge it gives back |
//!
//! A call that goes alone, where the function library is loaded, is an
//! `FCALL` of its function `one` instead (`lua/one.lua`, [`encode_one`]):
//! `KEYS[1]` its key, `ARGV[1]` 8 big-endian doubles (op id, count, burst,
//! period, clock, cost, deadline, 2^53 when none; subject limits 0, 1 or
//! 2, as the flags above halved), `ARGV[2]` its lease id
//! (or a refund's stamp) if it has one. It answers as a batch of one.
//!
//! Peeks, refunds and resets go as checks (with their own op ids; see
//! [`Op::id`]): each answers what a check of cost 1 would answer next.
//!
//! The answer is 4 big-endian doubles per check, packed in one string:
//! allowed (1/0, or 2: not run, past its deadline; or 3: a cluster master's
//! batch met a write the master refused, and the check is to go again
//! alone), remaining, reset after (µs), retry after (µs); then the server's
//! time (µs) as the script read it, or -1 if it read none; then, only
//! where a subject's own limit applied in the run, one double per check:
//! the count in force (0: its rule's). Releases answer nothing. Every number is a whole number below 2^53, exact as a double;
//! packing spares the server formatting and parsing text.
//!
//! What each algorithm keeps under its key (one key per rule and subject).
//! Every write sets a TTL. String states start with a 4-byte header, `"rl"`,
//! the format's version and the algorithm's tag, and have an exact length;
//! sorted sets carry a mark member. A value without them (someone's own key
//! under the prefix, or another algorithm's state) is never read as state:
//! it counts as no state, and the next write replaces it. A state of an
//! earlier version is read as it was written and written anew in the
//! current one. A key is written in place, never deleted and made again
//! within a call (a key made anew while its slot migrates is refused by the
//! master it was on).
//!
//! | algorithm | Redis type | value |
//! |---|---|---|
//! | fixed window | string | `"rl\x01F"` + (used, window end µs) |
//! | sliding log | sorted set | one member per call (units through it, its units) scored by its time, and the mark `"rl\x02S"` scored +inf |
//! | sliding window | string | `"rl\x02W"` + (window start µs, current count, previous count, when the counting began µs) |
//! | token bucket | string | `"rl\x02T"` + (tokens in fixed point, last update µs, the period µs the tokens are counted under, when the bucket began µs) |
//! | GCRA | string | `"rl\x02G"` + (theoretical arrival µs, remainder in 1/count µs, when the bucket began µs) |
//! | concurrency | sorted set | a member per lease (`"<id>"`, or `"<id>:<units>"`), scored by its expiry (µs); the marks `"rl\x01C"` (minus the units beyond one of the leases that take several) and `"rl\x01E"` (minus the end of the key's TTL) |
//!
//! Numbers after the header are big-endian doubles. No call's work grows
//! with its cost: a call is one member whatever it costs.

use redis::Cmd;

use crate::algorithm::{Outcome, REGISTRY, spec};
use crate::error::Error;
use crate::rule::{Algorithm, Rule};

/// What a job asks of the batch script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    /// A check (or a lease taken) under this algorithm.
    Check(Algorithm),
    /// A lease given back.
    Release,
    /// What a check of cost 1 would answer, without running it.
    Peek(Algorithm),
    /// Units given back (then answered as a peek).
    Refund(Algorithm),
    /// The key's state deleted (then answered as a peek).
    Reset(Algorithm),
    /// A call that may wait its turn (its lease id: the longest wait, µs);
    /// answered as `algorithm::reserve` answers.
    Reserve(Algorithm),
    /// A reservation given back (its lease id: when it was made, with
    /// [`Call::position`]), then answered as a peek.
    Cancel(Algorithm),
}

impl Op {
    /// Its id on the wire, from the algorithm's place `a` in the registry
    /// of `n` (the batch script's tables are written from the registry):
    /// a check `1 + a`, a release `n + 1`, a peek `n + 2 + a`, a refund
    /// `2n + 2 + a`, a reset `3n + 2 + a`, a reservation `4n + 2 + a`, its
    /// cancel `5n + 2 + a`.
    pub(super) fn id(self) -> u8 {
        let n = REGISTRY.len() as u8;
        match self {
            Op::Check(algorithm) => algorithm as u8 + 1,
            Op::Release => n + 1,
            Op::Peek(algorithm) => n + 2 + algorithm as u8,
            Op::Refund(algorithm) => 2 * n + 2 + algorithm as u8,
            Op::Reset(algorithm) => 3 * n + 2 + algorithm as u8,
            Op::Reserve(algorithm) => 4 * n + 2 + algorithm as u8,
            Op::Cancel(algorithm) => 5 * n + 2 + algorithm as u8,
        }
    }
}

/// The clock a check runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TimeSource {
    /// The server's `TIME`: every check of the limiter.
    Server,
    /// A fixed time (µs since the Unix epoch), for tests that hold Redis and
    /// the memory backend side by side. Keys written so get an hour's extra
    /// TTL, since their times are not the server's. Only the test hooks
    /// (feature `testing`) and the codec's tests make one.
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    Fixed(u64),
}

/// One job as the script sees it, but its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Call {
    pub(super) op: Op,
    /// The rule's algorithm (a release's too: it picks the script).
    pub(super) algorithm: Algorithm,
    pub(super) count: u64,
    pub(super) burst: u64,
    pub(super) period_us: u64,
    pub(super) cost: u64,
    pub(super) clock: TimeSource,
    pub(super) lease: Option<u64>,
    /// The latest server time (µs) at which the script may still run it.
    pub(super) deadline: Option<u64>,
    /// A cancel's reservation's position: its lease id goes as
    /// `"<lease>:<position>"`.
    pub(super) position: Option<u64>,
    /// The set of rules the check is a member of in a batch (see
    /// [`Call::in_set`]); 0: alone.
    pub(super) set: u32,
    /// Whether its rule reads subjects' own limits: 0 no, 1 with a capacity
    /// of its count, 2 of its burst (see `step` in `lua/prelude.lua`).
    pub(super) limits: u8,
}

impl Call {
    pub(super) fn new(
        op: Op,
        rule: &Rule,
        cost: u64,
        clock: TimeSource,
        lease: Option<u64>,
    ) -> Call {
        Call {
            op,
            algorithm: rule.algorithm(),
            count: rule.count(),
            burst: rule.burst(),
            period_us: rule.period_us(),
            cost,
            clock,
            lease,
            deadline: None,
            position: None,
            set: 0,
            limits: match (rule.reads_subject_limits(), rule.algorithm().has_burst()) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            },
        }
    }

    /// The same check as a member of set `set` (nonzero, the same for each
    /// member, distinct from every other set that may share a batch).
    pub(super) fn in_set(self, set: u32) -> Call {
        Call { set, ..self }
    }

    /// A look at the same rule and key instead (a peek: what a check of
    /// cost 1 would answer), writing nothing.
    pub(super) fn looking(&self) -> Call {
        Call {
            op: Op::Peek(self.algorithm),
            cost: 1,
            lease: None,
            position: None,
            ..*self
        }
    }

    /// Its lease id as the script reads it (a cancel's with its
    /// reservation's position).
    fn lease_arg(&self) -> Option<Vec<u8>> {
        let lease = self.lease?;
        Some(match self.position {
            Some(position) => format!("{lease}:{position}").into_bytes(),
            None => lease.to_string().into_bytes(),
        })
    }

    /// Where the call goes in a batch: 0 a check (or peek) whose state is
    /// a string (read ahead), 1 one whose state is a sorted set, 2 a
    /// refund or a reset, 3 a release. Refunds and resets after every
    /// check: a key they delete is not made again in the same call.
    pub(super) fn place(&self) -> u8 {
        match self.op {
            Op::Release => 3,
            Op::Reset(_) | Op::Refund(_) | Op::Cancel(_) => 2,
            _ if spec(self.algorithm).string => 0,
            _ => 1,
        }
    }

    /// What a check shares with the checks of the same rule in a batch.
    fn rule(&self) -> [u64; 6] {
        let now = match self.clock {
            TimeSource::Server => u64::MAX,
            TimeSource::Fixed(now) => now,
        };
        [
            u64::from(self.op.id()),
            self.count,
            self.burst,
            self.period_us,
            now,
            u64::from(self.lease.is_some()) + 2 * u64::from(self.limits),
        ]
    }
}

/// Appends a batch's keys and arguments to `cmd` (after the script or
/// function it calls). `calls` are in the batch's order: the checks
/// ([`Call::place`] 0, then 1), then the releases; the first `read_ahead`
/// checks keep string states and are each the first of its key.
pub(super) fn encode<'a>(
    cmd: &mut Cmd,
    calls: impl Iterator<Item = (&'a [u8], &'a Call)> + Clone,
    read_ahead: usize,
) {
    let checks = calls.clone().filter(|(_, c)| c.op != Op::Release).count();
    cmd.arg(calls.clone().count());
    for (key, _) in calls.clone() {
        cmd.arg(key);
    }
    // Each distinct rule once, then one byte per check: its rule's number.
    let mut rules: Vec<[u64; 6]> = Vec::new();
    let mut order = Vec::with_capacity(checks);
    for (_, call) in calls.clone().take(checks) {
        let rule = call.rule();
        let at = rules.iter().position(|r| *r == rule).unwrap_or_else(|| {
            rules.push(rule);
            rules.len() - 1
        });
        // A batch holds at most 159 checks (128 and a set's members), so as
        // many rules: one byte, from 1 (stacked.rs asserts it).
        order.push(u8::try_from(at + 1).unwrap_or(u8::MAX));
    }
    let mut packed = Vec::with_capacity(rules.len() * 6 * 8);
    for rule in &rules {
        for (i, &number) in rule.iter().enumerate() {
            // The clock's "server" is -1 on the wire.
            let number = if i == 4 && number == u64::MAX {
                -1.0
            } else {
                number as f64
            };
            packed.extend_from_slice(&number.to_be_bytes());
        }
    }
    let costs: Vec<u8> = if calls.clone().all(|(_, c)| c.cost == 1) {
        Vec::new()
    } else {
        calls
            .clone()
            .flat_map(|(_, c)| (c.cost as f64).to_be_bytes())
            .collect()
    };
    // The earliest deadline first: a batch in time (nearly every one) is
    // judged by it alone; then each check's (none: one never reached).
    let earliest = calls
        .clone()
        .take(checks)
        .filter_map(|(_, c)| c.deadline)
        .min();
    let deadlines: Vec<u8> = match earliest {
        Some(earliest) => std::iter::once(earliest)
            .chain(
                calls
                    .clone()
                    .take(checks)
                    .map(|(_, c)| c.deadline.unwrap_or(1 << 53)),
            )
            .flat_map(|deadline| (deadline as f64).to_be_bytes())
            .collect(),
        None => Vec::new(),
    };
    // Each check's set by number (from 1, in order of first member).
    let mut sets: Vec<u32> = Vec::new();
    let members: Vec<u8> = if calls.clone().take(checks).all(|(_, c)| c.set == 0) {
        Vec::new()
    } else {
        calls
            .clone()
            .take(checks)
            .map(|(_, c)| {
                if c.set == 0 {
                    return 0;
                }
                let at = sets.iter().position(|&s| s == c.set).unwrap_or_else(|| {
                    sets.push(c.set);
                    sets.len() - 1
                });
                u8::try_from(at + 1).unwrap_or(u8::MAX)
            })
            .collect()
    };
    cmd.arg(packed)
        .arg(order)
        .arg(costs)
        .arg(read_ahead)
        .arg(deadlines)
        .arg(members);
    for lease in calls.filter_map(|(_, c)| c.lease_arg()) {
        cmd.arg(lease);
    }
}

/// Appends one call's key and arguments to `cmd` (after the library's
/// function `one`, see `lua/one.lua`): what a batch of one says, in the
/// shape a lone call needs, which costs the server less to take apart.
pub(super) fn encode_one(cmd: &mut Cmd, key: &[u8], call: &Call) {
    let [op, count, burst, period, now, _] = call.rule();
    let now = if now == u64::MAX { -1.0 } else { now as f64 };
    let deadline = call.deadline.unwrap_or(1 << 53);
    let mut packed = [0u8; 8 * 8];
    let numbers = [
        op as f64,
        count as f64,
        burst as f64,
        period as f64,
        now,
        call.cost as f64,
        deadline as f64,
        f64::from(call.limits),
    ];
    for (chunk, number) in packed.chunks_exact_mut(8).zip(numbers) {
        chunk.copy_from_slice(&number.to_be_bytes());
    }
    cmd.arg(1).arg(key).arg(&packed[..]);
    if let Some(lease) = call.lease_arg() {
        cmd.arg(lease);
    }
}

/// Whether a batch's reply says that a key of it is not on the cluster
/// master it was sent to (`lua/batch.lua`: the time -2 alone), so nothing
/// of it ran.
pub(super) fn not_here(reply: &[u8]) -> bool {
    reply == (-2.0f64).to_be_bytes()
}

/// What a job that ran answers: its outcome, and the time it ran at (µs of
/// the server's clock, or the time it was given; `None` when unknown).
pub(super) type Ran = (Outcome, Option<u64>);

/// A check's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ScriptAnswer {
    /// It ran.
    Ran(Outcome),
    /// The script reached it after its deadline and did not run it.
    Late,
    /// A cluster master refused a write of it: it goes again alone.
    Refused,
}

/// The checks' answers from the script's reply, and the server's time as
/// the script read it.
///
/// # Errors
///
/// A reply that is not 4 numbers per check and the time (then, where a
/// subject's own limit applied, one count per check).
pub(super) fn decode(
    reply: &[u8],
    checks: usize,
) -> Result<(Vec<ScriptAnswer>, Option<u64>), Error> {
    let limited = reply.len() == 40 * checks + 8;
    if reply.len() != 32 * checks + 8 && !limited {
        return Err(Error::Config(format!(
            "the batch script answered {} bytes for {checks} checks",
            reply.len()
        )));
    }
    let number = |bytes: &[u8]| f64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
    let whole = |n: f64| if n > 0.0 { n as u64 } else { 0 };
    let (answers, rest) = reply.split_at(32 * checks);
    let (time, limits) = rest.split_at(8);
    let answers = answers
        .chunks_exact(32)
        .enumerate()
        .map(|(i, answer)| {
            let n = |i: usize| number(&answer[8 * i..8 * i + 8]);
            if n(0) == 2.0 {
                return ScriptAnswer::Late;
            }
            if n(0) == 3.0 {
                return ScriptAnswer::Refused;
            }
            ScriptAnswer::Ran(Outcome {
                allowed: n(0) == 1.0,
                remaining: whole(n(1)),
                reset_after_us: whole(n(2)),
                retry_after_us: whole(n(3)),
                limit: if limited {
                    whole(number(&limits[8 * i..8 * i + 8]))
                } else {
                    0
                },
            })
        })
        .collect();
    let time = number(time);
    Ok((answers, (time >= 0.0).then_some(time as u64)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn args(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn op_ids_follow_the_registry_and_a_release_comes_after_them() {
        for (i, algorithm) in Algorithm::ALL.iter().enumerate() {
            assert_eq!(usize::from(Op::Check(*algorithm).id()), i + 1);
        }
        assert_eq!(usize::from(Op::Release.id()), Algorithm::ALL.len() + 1);
    }

    #[test]
    fn rules_are_sent_once_and_checks_name_them_by_number() {
        let a = Rule::fixed_window(10, Duration::from_secs(1));
        let b = Rule::gcra(5, Duration::from_secs(2));
        let calls = [
            (
                &b"k1"[..],
                Call::new(Op::Check(a.algorithm()), &a, 1, TimeSource::Server, None),
            ),
            (
                &b"k2"[..],
                Call::new(Op::Check(b.algorithm()), &b, 1, TimeSource::Fixed(7), None),
            ),
            (
                &b"k3"[..],
                Call::new(Op::Check(a.algorithm()), &a, 1, TimeSource::Server, None),
            ),
            (
                &b"k4"[..],
                Call::new(Op::Release, &a, 1, TimeSource::Server, Some(42)),
            ),
        ];
        let mut cmd = redis::cmd("FCALL");
        encode(&mut cmd, calls.iter().map(|(k, c)| (*k, c)), 2);
        let args = args(&cmd);
        assert_eq!(args[1], b"4", "four keys");
        assert_eq!(&args[2..6], [b"k1", b"k2", b"k3", b"k4"]);
        let rules = &args[6];
        assert_eq!(rules.len(), 2 * 48, "two distinct rules");
        let number = |i: usize| f64::from_be_bytes(rules[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(number(0), 1.0, "fixed window's op id");
        assert_eq!(number(4), -1.0, "the server's clock");
        assert_eq!(number(6), 5.0, "gcra's op id");
        assert_eq!(number(10), 7.0, "a fixed clock");
        assert_eq!(args[7], [1, 2, 1], "each check's rule");
        assert!(args[8].is_empty(), "every cost is 1");
        assert_eq!(args[9], b"2");
        assert!(args[10].is_empty(), "no deadlines");
        assert!(args[11].is_empty(), "no sets");
        assert_eq!(args[12], b"42", "the release's lease id");
    }

    #[test]
    fn answers_decode_and_a_short_reply_is_an_error() {
        let mut reply = Vec::new();
        for n in [1.0f64, 9.0, 1000.0, 0.0, 2.0, 0.0, 0.0, 0.0, 1.7e15] {
            reply.extend_from_slice(&n.to_be_bytes());
        }
        let (answers, time) = decode(&reply, 2).unwrap();
        assert_eq!(
            answers,
            [
                ScriptAnswer::Ran(Outcome {
                    allowed: true,
                    remaining: 9,
                    reset_after_us: 1000,
                    retry_after_us: 0,
                    limit: 0,
                }),
                ScriptAnswer::Late
            ]
        );
        assert_eq!(time, Some(1_700_000_000_000_000));
        assert!(decode(&reply, 1).is_err());
        // A subject's own count where one applied: one per check.
        for n in [25.0f64, 0.0] {
            reply.extend_from_slice(&n.to_be_bytes());
        }
        let (answers, _) = decode(&reply, 2).unwrap();
        assert!(matches!(
            answers[0],
            ScriptAnswer::Ran(Outcome { limit: 25, .. })
        ));
        let (none, time) = decode(&(-1.0f64).to_be_bytes(), 0).unwrap();
        assert!(none.is_empty() && time.is_none());
    }

    #[test]
    fn a_lone_call_sends_its_rule_cost_and_deadline_in_one_argument() {
        let rule = Rule::gcra(5, Duration::from_secs(2));
        let mut call = Call::new(
            Op::Check(rule.algorithm()),
            &rule,
            3,
            TimeSource::Server,
            Some(42),
        );
        call.deadline = Some(9_000);
        let mut cmd = redis::cmd("FCALL");
        encode_one(&mut cmd, b"k", &call);
        let sent = args(&cmd);
        assert_eq!(&sent[1..3], [&b"1"[..], b"k"]);
        let packed = &sent[3];
        assert_eq!(packed.len(), 8 * 8);
        let number = |i: usize| f64::from_be_bytes(packed[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(number(0), f64::from(Op::Check(rule.algorithm()).id()));
        assert_eq!(number(1), 5.0, "count");
        assert_eq!(number(3), 2_000_000.0, "period in µs");
        assert_eq!(number(4), -1.0, "the server's clock");
        assert_eq!(number(5), 3.0, "cost");
        assert_eq!(number(6), 9_000.0, "deadline");
        assert_eq!(number(7), 0.0, "no subject limits");
        assert_eq!(sent[4], b"42", "the lease id");
        call.deadline = None;
        let mut cmd = redis::cmd("FCALL");
        encode_one(&mut cmd, b"k", &call);
        let last = &args(&cmd)[3][48..56];
        assert_eq!(
            f64::from_be_bytes(last.try_into().unwrap()),
            (1u64 << 53) as f64
        );
    }

    #[test]
    fn deadlines_go_per_check_when_any_has_one() {
        let rule = Rule::fixed_window(10, Duration::from_secs(1));
        let mut dated = Call::new(
            Op::Check(rule.algorithm()),
            &rule,
            1,
            TimeSource::Server,
            None,
        );
        dated.deadline = Some(5_000);
        let plain = Call::new(
            Op::Check(rule.algorithm()),
            &rule,
            1,
            TimeSource::Server,
            None,
        );
        let calls = [(&b"a"[..], dated), (&b"b"[..], plain)];
        let mut cmd = redis::cmd("FCALL");
        encode(&mut cmd, calls.iter().map(|(k, c)| (*k, c)), 0);
        let deadlines = &args(&cmd)[8];
        let deadline =
            |i: usize| f64::from_be_bytes(deadlines[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(deadlines.len(), 24);
        assert_eq!(deadline(0), 5_000.0, "the earliest");
        assert_eq!(deadline(1), 5_000.0);
        assert_eq!(deadline(2), (1u64 << 53) as f64, "none: never reached");
    }

    #[test]
    fn each_check_names_its_set_by_number() {
        let rule = Rule::fixed_window(10, Duration::from_secs(1));
        let check = Call::new(
            Op::Check(rule.algorithm()),
            &rule,
            1,
            TimeSource::Server,
            None,
        );
        let calls = [
            (&b"a"[..], check.in_set(77)),
            (&b"b"[..], check),
            (&b"c"[..], check.in_set(5)),
            (&b"d"[..], check.in_set(77)),
        ];
        let mut cmd = redis::cmd("FCALL");
        encode(&mut cmd, calls.iter().map(|(k, c)| (*k, c)), 0);
        assert_eq!(args(&cmd)[11], [1, 0, 2, 1]);
    }
}
