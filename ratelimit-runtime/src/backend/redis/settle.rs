//! A batch's answers handed out: each caller still waiting gets its own;
//! what was allowed a caller that is gone is given back; the calls of a
//! cluster batch that did not run go again.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Expired;
use super::batch::{AnswerTx, Job, NotHere, RELEASED, Shared, by_call, send_batch};
use super::codec::{self, Call, Op, TimeSource};
use super::connection::Conn;
use super::give_back::{self, Delivered, Settled};
use super::scripts::Scripts;
use crate::backend::StoredKey;
use crate::error::Error;

/// Hands each caller still waiting its answer from a batch's `reply`, and
/// gives back what an allowed check took for a caller no longer waiting.
pub(super) fn settle(
    reply: Result<Vec<u8>, Error>,
    wire: &Arc<[(StoredKey, Call)]>,
    checks: usize,
    replies: Vec<(Instant, Option<AnswerTx>)>,
    conn: &Arc<Conn>,
    scripts: &Arc<Scripts>,
    timeout: Duration,
) {
    if let Err(Error::Backend(error)) = &reply
        && error.is::<NotHere>()
    {
        let jobs = wire.iter().zip(replies);
        send_alone(
            jobs.map(|((key, call), sent)| (key, call, sent)),
            conn,
            scripts,
            timeout,
        );
        return;
    }
    match reply.and_then(|reply| codec::decode(&reply, checks)) {
        Ok((answers, server_time)) => {
            if let Some(time) = server_time {
                conn.saw_server_time(time);
            }
            let sets = SetsRan::new(wire, &answers);
            // The checks' answers, in order; the releases after them get none.
            let mut answers = answers.into_iter();
            let mut give_backs = Vec::new();
            let mut refused = Vec::new();
            // Made for the first answer that may be left unread.
            let mut batch: Option<Arc<Settled>> = None;
            for (i, ((key, call), (deadline, reply))) in wire.iter().zip(replies).enumerate() {
                let answer = answers.next().unwrap_or(codec::ScriptAnswer::Ran(RELEASED));
                let now = match call.clock {
                    TimeSource::Server => server_time,
                    TimeSource::Fixed(now) => Some(now),
                };
                if sets.broken(call) {
                    if let codec::ScriptAnswer::Ran(outcome) = answer
                        && outcome.allowed
                        && let Some(gift) = give_back::give_back_of(key, call, &outcome, now)
                    {
                        give_backs.push(gift);
                    }
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(Error::backend(SetBroken)));
                    }
                    continue;
                }
                let outcome = match answer {
                    codec::ScriptAnswer::Ran(outcome) => outcome,
                    codec::ScriptAnswer::Late => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(Error::backend(Expired(timeout))));
                        }
                        continue;
                    }
                    codec::ScriptAnswer::Refused => {
                        refused.push((key, call, (deadline, reply)));
                        continue;
                    }
                };
                // A member of a set that did not pass took nothing.
                let holds = outcome.allowed && sets.passed(call) && give_back::holds(call);
                match reply {
                    Some(reply) if !reply.is_closed() => {
                        // Left unread (its caller goes away before it reads
                        // it), the answer gives back what it holds.
                        let unread = holds.then(|| {
                            let batch = batch.get_or_insert_with(|| {
                                Arc::new(Settled {
                                    wire: Arc::clone(wire),
                                    conn: Arc::clone(conn),
                                    scripts: Arc::clone(scripts),
                                    timeout,
                                    send: give_back,
                                })
                            });
                            (Arc::clone(batch), i)
                        });
                        let _ = reply.send(Ok(Delivered::new((outcome, now), unread)));
                    }
                    _ if holds => {
                        if let Some(gift) = give_back::give_back_of(key, call, &outcome, now) {
                            tracing::debug!(
                                "Redis allowed a check whose caller had stopped waiting: given back"
                            );
                            give_backs.push(gift);
                        }
                    }
                    _ => {}
                }
            }
            if !refused.is_empty() {
                send_alone(refused.into_iter(), conn, scripts, timeout);
            }
            if !give_backs.is_empty() {
                tokio::spawn(give_back(
                    give_backs,
                    Arc::clone(conn),
                    Arc::clone(scripts),
                    timeout,
                ));
            }
        }
        Err(error) => {
            let error = Shared::new(error);
            for (_, reply) in replies {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(Error::backend(error.clone())));
                }
            }
        }
    }
}

/// The sets of rules of a batch that did not pass (a member refused, or
/// not run), and those a master refused a write of (see `lua/batch.lua`).
struct SetsRan {
    unpassed: Vec<u32>,
    broken: Vec<u32>,
}

impl SetsRan {
    fn new(wire: &[(StoredKey, Call)], answers: &[codec::ScriptAnswer]) -> SetsRan {
        let mut sets = SetsRan {
            unpassed: Vec::new(),
            broken: Vec::new(),
        };
        for ((_, call), answer) in wire.iter().zip(answers).filter(|((_, c), _)| c.set != 0) {
            match answer {
                codec::ScriptAnswer::Ran(outcome) if outcome.allowed => {}
                codec::ScriptAnswer::Refused => {
                    sets.unpassed.push(call.set);
                    sets.broken.push(call.set);
                }
                _ => sets.unpassed.push(call.set),
            }
        }
        sets
    }

    /// Whether `call` is alone, or a member of a set that passed.
    fn passed(&self, call: &Call) -> bool {
        call.set == 0 || !self.unpassed.contains(&call.set)
    }

    /// Whether `call` is a member of a set a master refused a write of.
    fn broken(&self, call: &Call) -> bool {
        call.set != 0 && self.broken.contains(&call.set)
    }
}

/// A cluster master refused a write of a set of rules (a slot moving) after
/// others of its members were written: what they took is given back.
#[derive(Debug)]
struct SetBroken;

impl fmt::Display for SetBroken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a cluster master refused a write of a set of rules; what it took is given back",
        )
    }
}

impl std::error::Error for SetBroken {}

/// Sends what is given back for callers that are gone: the releases of
/// their leases and the refunds of their checks (boxed: a batch that sends
/// them is itself a batch). Then a refusal remembered for their keys (the
/// limiter's over-limit cache) is forgotten.
pub(super) fn give_back(
    gifts: Vec<(StoredKey, Call)>,
    conn: Arc<Conn>,
    scripts: Arc<Scripts>,
    timeout: Duration,
) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(async move {
        let keys: Vec<StoredKey> = gifts.iter().map(|(key, _)| key.clone()).collect();
        let jobs = gifts
            .into_iter()
            .map(|(key, call)| Job::detached(key, call));
        for calls in by_call(jobs.collect(), &conn) {
            send_batch(calls, &conn, &scripts, timeout).await;
        }
        if let Some(forget) = conn.given_back.get() {
            for key in &keys {
                if let Ok(key) = std::str::from_utf8(key.as_bytes()) {
                    forget(key);
                }
            }
        }
    })
}

/// Sends each of these calls of a cluster batch that did not run (their
/// master did not serve all the batch's keys, or refused a write of
/// theirs) again, alone, routed by its own key, by its caller's deadline;
/// and asks the cluster for its slot map anew.
fn send_alone<'a>(
    jobs: impl Iterator<Item = (&'a StoredKey, &'a Call, (Instant, Option<AnswerTx>))>,
    conn: &Arc<Conn>,
    scripts: &Arc<Scripts>,
    timeout: Duration,
) {
    tracing::debug!(
        "a cluster batch reached a master that does not serve all its keys: sent again one by one"
    );
    for (key, call, (deadline, reply)) in jobs {
        // A check or a peek only for a caller who still waits; a release
        // or a give-back whether or not anyone does.
        if reply.is_none() && matches!(call.op, Op::Check(_) | Op::Peek(_) | Op::Reserve(_)) {
            continue;
        }
        // A set's members go together, by their caller (none ran).
        if call.set != 0 {
            if let Some(reply) = reply {
                let _ = reply.send(Err(Error::backend(NotHere)));
            }
            continue;
        }
        let job = Job {
            key: key.clone(),
            call: Call {
                deadline: None,
                ..*call
            },
            deadline,
            reply,
        };
        let (conn, scripts) = (Arc::clone(conn), Arc::clone(scripts));
        tokio::spawn(async move { send_batch(vec![job], &conn, &scripts, timeout).await });
    }
    let (conn, scripts) = (Arc::clone(conn), Arc::clone(scripts));
    tokio::spawn(async move {
        if let Ok(mut live) = conn.get(&scripts).await {
            conn.learn_slots(&mut live).await;
        }
    });
}
