//! A call under several rules on Redis, all or nothing: one script run (the
//! batch driver with `whole` set, `lua/batch.lua`) reads and decides every
//! rule's state, writing nothing, and writes only if every rule allows the
//! call. On a cluster, keys of one slot go in one call; keys of several
//! slots of one master in one call of the library's cross-slot function;
//! keys of several masters are taken one slot after another, in the order
//! of their slots, and what was taken is given back if one refuses (see
//! the README's "What a fault can still cost").
//!
//! With coalescing, a set checked while a call is on its way goes in the
//! next batch instead, as one unit of it (one queued job the batch never
//! splits, all or nothing on its own): on a cluster, when its keys are on
//! one master, in that master's batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::batch::{self, Batching, Job, NotHere, Unit, answered};
use super::codec::{self, Call, Op, ScriptAnswer, TimeSource};
use super::connection::{Busy, Conn, Endpoint, call_script, script_call};
use super::scripts::Scripts;
use super::{Expired, RedisBackend, TimedOut, nodes, within};
use crate::algorithm::{self, Outcome, spec};
use crate::backend::{RuleCheck, StoredKey};
use crate::decision::Decision;
use crate::error::Error;

/// Checks of a set that go in one script call, by their place in the set,
/// and whether they go as keys of several slots of one cluster master.
struct Group {
    members: Vec<usize>,
    cross_slot: bool,
}

impl RedisBackend {
    /// [`Backend::check_all`](crate::Backend::check_all), with the stamp of
    /// what each allowed check (not a lease) charged.
    pub(crate) async fn check_all_charged(
        &self,
        checks: &[RuleCheck<'_>],
    ) -> Result<Vec<(Decision, Option<u64>)>, Error> {
        self.check_all_on(checks, TimeSource::Server).await
    }

    pub(super) async fn check_all_on(
        &self,
        checks: &[RuleCheck<'_>],
        clock: TimeSource,
    ) -> Result<Vec<(Decision, Option<u64>)>, Error> {
        if checks.is_empty() {
            return Ok(Vec::new());
        }
        let calls: Vec<Call> = checks
            .iter()
            .map(|c| {
                let lease = spec(c.rule.algorithm()).leases.then_some(c.lease);
                Call::new(Op::Check(c.rule.algorithm()), c.rule, c.cost, clock, lease)
            })
            .collect();
        let keys: Vec<StoredKey> = checks.iter().map(|c| StoredKey::new(c.key)).collect();
        if let Some(batching) = self.queue_for_set(&keys) {
            match self.queued_set(batching, checks, &calls).await {
                Ok(ran) => return Ok(decided(ran.into_iter().map(Some), checks)),
                // Its batch met a slot that moved: nothing of it ran.
                Err(Error::Backend(error)) if error.is::<NotHere>() => {}
                Err(error) => return Err(error),
            }
        }
        let mut groups = self.groups(&keys);
        let mut ran: Vec<Option<(Outcome, Option<u64>)>> = vec![None; checks.len()];
        let mut failed = None;
        // What the groups sent so far took, given back if the caller goes
        // away before the set is decided.
        let mut holding = Taken {
            jobs: Vec::new(),
            conn: Arc::clone(&self.conn),
            scripts: Arc::clone(&self.scripts),
            timeout: self.timeout,
        };
        // Once a group refused, the later ones are only looked at (a peek
        // each): taking from them to give back at once would hold units
        // other calls are refused by meanwhile.
        let mut looks: Option<Vec<Call>> = None;
        let mut next = 0;
        while let Some(group) = groups.get(next) {
            next += 1;
            let sent = looks.as_deref().unwrap_or(&calls);
            match self.send_whole(group, &keys, sent).await {
                Ok((outcomes, now)) => {
                    // A group is all or nothing: a refused one took nothing.
                    let passed = outcomes.iter().all(|o| o.allowed);
                    for (&i, mut outcome) in group.members.iter().zip(outcomes) {
                        if looks.is_some() {
                            // A peek answers for a cost of 1: what a check
                            // of the call's cost would answer.
                            if outcome.allowed {
                                let left = outcome.remaining + 1;
                                outcome.allowed = left >= calls[i].cost;
                                outcome.remaining = if outcome.allowed {
                                    left - calls[i].cost
                                } else {
                                    left
                                };
                            }
                        } else if passed
                            && groups.len() > 1
                            && let Some(job) =
                                super::give_back::give_back_of(&keys[i], &calls[i], &outcome, now)
                        {
                            holding.jobs.push(job);
                        }
                        ran[i] = Some((outcome, now));
                    }
                    if !passed && looks.is_none() {
                        looks = Some(calls.iter().map(Call::looking).collect());
                    }
                }
                // The set is refused already: a look that failed says
                // nothing of its rule, which is then reported with nothing
                // left.
                Err(_) if looks.is_some() => {
                    for &i in &group.members {
                        ran[i] = Some((nothing_known(), None));
                    }
                }
                // One call for a master's several slots met one of them
                // migrating, and nothing of it stayed: a call per slot
                // follows the move (`ASK`).
                Err(Error::Backend(error)) if group.cross_slot && error.is::<SlotMoved>() => {
                    groups = slot_groups(&keys);
                    next = 0;
                }
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        // Several calls (keys of several masters): what some took is given
        // back if another refused (or failed), before the caller is
        // answered; by a task, so that it is made even if the caller goes
        // away meanwhile.
        let refused = ran.iter().flatten().any(|(outcome, _)| !outcome.allowed);
        let jobs = std::mem::take(&mut holding.jobs);
        if (refused || failed.is_some()) && !jobs.is_empty() {
            let (conn, scripts) = (Arc::clone(&self.conn), Arc::clone(&self.scripts));
            let _ = tokio::spawn(batch::give_back(jobs, conn, scripts, self.timeout)).await;
        }
        if let Some(error) = failed {
            return Err(error);
        }
        Ok(decided(ran, checks))
    }

    /// The queue a set goes in, as one unit of the next batch: when
    /// coalescing and a call is on its way (as for a lone check), on a
    /// single server, or on a cluster when the slot map puts all its keys
    /// on one master (its batch is that master's). A set whose keys the map
    /// spreads over masters keeps its own calls: in a batch it would make
    /// the master refuse the whole batch.
    fn queue_for_set(&self, keys: &[StoredKey]) -> Option<&Batching> {
        let batching = self.queue_for_now()?;
        if keys.len() > MAX_SET {
            return None;
        }
        if matches!(self.conn.endpoint, Endpoint::Cluster(_)) {
            let map = self.conn.slot_map()?;
            let (first, rest) = keys.split_first()?;
            let master = map.master_of(first.as_bytes())?;
            if !rest
                .iter()
                .all(|key| map.master_of(key.as_bytes()) == Some(master))
            {
                return None;
            }
        }
        Some(batching)
    }

    /// A set sent as one unit of the next batch: each member's outcome and
    /// the time it ran at, in the set's order.
    async fn queued_set(
        &self,
        batching: &Batching,
        checks: &[RuleCheck<'_>],
        calls: &[Call],
    ) -> Result<Vec<(Outcome, Option<u64>)>, Error> {
        // A number for the set, distinct from the others in its batch.
        static SETS: AtomicU32 = AtomicU32::new(1);
        let set = loop {
            let set = SETS.fetch_add(1, Ordering::Relaxed);
            if set != 0 {
                break set;
            }
        };
        let deadline = Instant::now() + self.timeout;
        let (jobs, answers): (Vec<Job>, Vec<batch::AnswerRx>) = checks
            .iter()
            .zip(calls)
            .map(|(check, call)| Job::new(check.key, call.in_set(set), deadline))
            .unzip();
        self.enqueue(batching, Unit::Set(jobs))?;
        let here = batching.home.answers_here();
        let mut ran = Vec::with_capacity(answers.len());
        // Answered together: a member's answer dropped unread (an error
        // met first) gives back what it holds.
        for answer in answers {
            ran.push(if here {
                answered(answer).await?
            } else {
                within(self.timeout, answered(answer)).await?
            });
        }
        Ok(ran)
    }

    /// The set's checks in the calls they go in: one, but on a cluster
    /// whose keys are on several masters (or of several slots where the
    /// library's functions are not loaded): one call per slot, in the
    /// order of the slots.
    fn groups(&self, keys: &[StoredKey]) -> Vec<Group> {
        let all = || (0..keys.len()).collect::<Vec<_>>();
        if !matches!(self.conn.endpoint, Endpoint::Cluster(_)) {
            return vec![Group {
                members: all(),
                cross_slot: false,
            }];
        }
        let slots: Vec<u16> = keys.iter().map(|k| nodes::slot(k.as_bytes())).collect();
        if slots.iter().all(|&s| s == slots[0]) {
            return vec![Group {
                members: all(),
                cross_slot: false,
            }];
        }
        let functions = self
            .conn
            .functions
            .load(std::sync::atomic::Ordering::Relaxed);
        if functions && let Some(map) = self.conn.slot_map() {
            let masters: Vec<Option<u16>> =
                keys.iter().map(|k| map.master_of(k.as_bytes())).collect();
            if masters[0].is_some() && masters.iter().all(|&m| m == masters[0]) {
                return vec![Group {
                    members: all(),
                    cross_slot: true,
                }];
            }
        }
        slot_groups(keys)
    }

    /// One script call of a group, all or nothing: each member's outcome,
    /// and the time it ran at (`None`: the server's, not read).
    async fn send_whole(
        &self,
        group: &Group,
        keys: &[StoredKey],
        calls: &[Call],
    ) -> Result<(Vec<Outcome>, Option<u64>), Error> {
        // The checks whose state is a string first, read ahead in one MGET
        // (the keys of a set are distinct), then the others.
        let mut order = group.members.clone();
        order.sort_by_key(|&i| calls[i].place());
        let read_ahead = order.iter().filter(|&&i| calls[i].place() == 0).count();
        let deadline = Instant::now() + self.timeout;
        let server_deadline = self.conn.server_deadline(deadline, self.timeout / 5);
        let wire: Vec<(StoredKey, Call)> = order
            .iter()
            .map(|&i| {
                let call = Call {
                    deadline: server_deadline,
                    ..calls[i]
                };
                (keys[i].clone(), call)
            })
            .collect();
        let cross_slot = group.cross_slot;
        let busy = Busy::enter(Arc::clone(&self.busy));
        let (conn, scripts) = (Arc::clone(&self.conn), Arc::clone(&self.scripts));
        let wire = Arc::new(wire);
        let sent = Arc::clone(&wire);
        let task = tokio::spawn(async move {
            let _busy = busy;
            let wire = sent;
            conn.restore_functions(&scripts);
            let mut live = conn.get(&scripts).await?;
            let route = cross_slot.then(|| wire[0].0.as_bytes());
            let call = |function: bool| {
                let mut cmd = if function && cross_slot {
                    let mut cmd = redis::cmd("FCALL");
                    cmd.arg(&scripts.library.whole_node).arg(0);
                    cmd
                } else {
                    script_call(function, &scripts.library.whole, &scripts.whole)
                };
                codec::encode(
                    &mut cmd,
                    wire.iter().map(|(key, call)| (key.as_bytes(), call)),
                    read_ahead,
                );
                cmd
            };
            let reply = call_script::<Vec<u8>>(
                &mut live,
                &conn,
                &scripts.library,
                &scripts.whole,
                route,
                call,
            )
            .await;
            conn.restore_functions(&scripts);
            match reply {
                Ok(reply) if codec::not_here(&reply) => {
                    if let Ok(mut live) = conn.get(&scripts).await {
                        conn.learn_slots(&mut live).await;
                    }
                    Err(Error::backend(SlotMoved))
                }
                Ok(reply) => codec::decode(&reply, wire.len()),
                Err(error) => {
                    conn.forget(&error);
                    Err(Error::backend(error))
                }
            }
        });
        // Dropped before the task ends (its caller gone, or out of time),
        // the guard gives back what the script allowed, if its answer
        // still comes.
        let mut running = Running {
            task: Some(task),
            wire,
            conn: Arc::clone(&self.conn),
            scripts: Arc::clone(&self.scripts),
            timeout: self.timeout,
        };
        let task = running.task.as_mut().expect("just set");
        let answer = match tokio::time::timeout(self.timeout, task).await {
            Ok(joined) => {
                running.task = None;
                joined.map_err(|_| Error::backend(TimedOut(self.timeout)))?
            }
            Err(_) => return Err(Error::backend(TimedOut(self.timeout))),
        };
        let (answers, time) = answer?;
        if let Some(time) = time {
            self.conn.saw_server_time(time);
        }
        if answers.iter().any(|a| matches!(a, ScriptAnswer::Refused)) {
            // The master refused a member's write after others were
            // written (a slot migrating): those are given back before the
            // caller hears that nothing of the set counted; by a task, so
            // that it is made even if the caller goes away meanwhile.
            let jobs = written(&answers, &running.wire, time);
            if !jobs.is_empty() {
                let (conn, scripts) = (Arc::clone(&self.conn), Arc::clone(&self.scripts));
                let _ = tokio::spawn(batch::give_back(jobs, conn, scripts, self.timeout)).await;
            }
            return Err(Error::backend(SlotMoved));
        }
        let mut outcomes = vec![None; calls.len()];
        for (answer, &i) in answers.into_iter().zip(&order) {
            match answer {
                ScriptAnswer::Ran(outcome) => outcomes[i] = Some(outcome),
                ScriptAnswer::Late => return Err(Error::backend(Expired(self.timeout))),
                ScriptAnswer::Refused => return Err(Error::backend(SlotMoved)),
            }
        }
        let now = match calls[group.members[0]].clock {
            TimeSource::Server => time,
            TimeSource::Fixed(now) => Some(now),
        };
        let outcomes = group
            .members
            .iter()
            .map(|&i| outcomes[i].expect("one answer per check"))
            .collect();
        Ok((outcomes, now))
    }
}

/// A script call's answers, and the server's time it ran at.
type Answers = (Vec<ScriptAnswer>, Option<u64>);

/// A group's script call, its answer not yet read. Dropped so (its caller
/// gone, or out of time), what the script allowed is given back when its
/// answer comes: the caller was not told it passed.
struct Running {
    task: Option<JoinHandle<Result<Answers, Error>>>,
    wire: Arc<Vec<(StoredKey, Call)>>,
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    timeout: Duration,
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (wire, conn, scripts, timeout) = (
            Arc::clone(&self.wire),
            Arc::clone(&self.conn),
            Arc::clone(&self.scripts),
            self.timeout,
        );
        runtime.spawn(async move {
            let Ok(Ok((answers, time))) = task.await else {
                return;
            };
            let jobs = written(&answers, &wire, time);
            if !jobs.is_empty() {
                batch::give_back(jobs, conn, scripts, timeout).await;
            }
        });
    }
}

/// What gives back the members a group's call wrote, from its answers (in
/// the wire's order): every member that ran allowed, if the group wrote at
/// all. A group is all or nothing: refused, it wrote nothing (its members
/// that would have passed say allowed all the same); one whose write the
/// master refused half way (see `lua/batch.lua`) wrote those that ran.
fn written(
    answers: &[ScriptAnswer],
    wire: &[(StoredKey, Call)],
    time: Option<u64>,
) -> Vec<(StoredKey, Call)> {
    let wrote = answers.iter().all(|answer| match answer {
        ScriptAnswer::Ran(outcome) => outcome.allowed,
        ScriptAnswer::Refused => true,
        ScriptAnswer::Late => false,
    });
    if !wrote {
        return Vec::new();
    }
    answers
        .iter()
        .zip(wire)
        .filter_map(|(answer, (key, call))| match answer {
            ScriptAnswer::Ran(outcome) if outcome.allowed => {
                let now = match call.clock {
                    TimeSource::Server => time,
                    TimeSource::Fixed(now) => Some(now),
                };
                super::give_back::give_back_of(key, call, outcome, now)
            }
            _ => None,
        })
        .collect()
}

/// What the groups of a set spread over masters took so far. Dropped with
/// some (its caller gone between two groups), it gives them back.
struct Taken {
    jobs: Vec<(StoredKey, Call)>,
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    timeout: Duration,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if self.jobs.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let jobs = std::mem::take(&mut self.jobs);
            let (conn, scripts) = (Arc::clone(&self.conn), Arc::clone(&self.scripts));
            runtime.spawn(batch::give_back(jobs, conn, scripts, self.timeout));
        }
    }
}

/// A rule of a refused set whose look failed: allowed with nothing left
/// (the set's verdict makes it not allowed, with the call's cost left).
fn nothing_known() -> Outcome {
    Outcome {
        allowed: true,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        limit: 0,
    }
}

/// The set's checks in one call per slot, in the order of the slots.
fn slot_groups(keys: &[StoredKey]) -> Vec<Group> {
    let mut by_slot: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = nodes::slot(key.as_bytes());
        match by_slot.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => by_slot.push((slot, vec![i])),
        }
    }
    by_slot.sort_by_key(|(slot, _)| *slot);
    by_slot
        .into_iter()
        .map(|(_, members)| Group {
            members,
            cross_slot: false,
        })
        .collect()
}

/// The most checks a set may have to go in a batch (more go alone).
const MAX_SET: usize = 32;
// A batch holds at most `MAX_BATCH` checks and a set's members more; the
// script numbers its rules in a byte, from 1.
const _: () = assert!(super::batch::MAX_BATCH + MAX_SET - 1 <= 255);

/// Each check's decision from what its rule's script run answered, and the
/// stamp of what an allowed check (not a lease) charged.
fn decided(
    ran: impl IntoIterator<Item = Option<(Outcome, Option<u64>)>>,
    checks: &[RuleCheck<'_>],
) -> Vec<(Decision, Option<u64>)> {
    ran.into_iter()
        .zip(checks)
        .map(|(ran, check)| {
            let (outcome, now) = ran.expect("every group ran");
            let stamp = now
                .filter(|_| outcome.allowed && !spec(check.rule.algorithm()).leases)
                .map(|now| {
                    algorithm::stamp(
                        check.rule.algorithm(),
                        check.rule.period_us(),
                        now,
                        &outcome,
                    )
                });
            (outcome.decision(check.rule), stamp)
        })
        .collect()
}

/// A key of a set was not on the cluster master its call went to (a slot
/// moved): nothing of that call counted.
#[derive(Debug)]
struct SlotMoved;

impl std::fmt::Display for SlotMoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key of a set of rules was not on the cluster master its call went to")
    }
}

impl std::error::Error for SlotMoved {}
