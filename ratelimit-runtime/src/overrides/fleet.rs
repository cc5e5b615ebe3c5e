//! Overrides for the whole fleet, kept in one Redis hash that every
//! instance reads.
//!
//! The hash is [`DEFAULT_KEY`] (`limiter:overrides`) unless the limiter
//! names another
//! ([`fleet_overrides_key`](crate::RateLimiterBuilder::fleet_overrides_key)).
//! Each field is `name.setting`, each value what [`RATELIMIT_OVERRIDES`](super::load_env)
//! takes after `=`: `count` and `burst` whole numbers, `period` whole seconds
//! or `500ms`, `10s`, `1m`, `1h`, `shadow` `true` or `false`.
//!
//! ```sh
//! redis-cli HSET limiter:overrides search.count 50 search.period 1m search.shadow true
//! redis-cli HDEL limiter:overrides search.shadow   # back to the next source's value
//! redis-cli DEL limiter:overrides                  # no fleet override at all
//! redis-cli HGETALL limiter:overrides
//! ```
//!
//! An instance reads it when [`build`](crate::RateLimiterBuilder::build)
//! returns its limiter and then twice a second ([`READ_EVERY`]; one `HGETALL`
//! on the limiter's own connection, so on a Cluster or through a Sentinel
//! failover it follows the limiter), so a change applies everywhere within
//! a second. A field cleared falls back to the next source (see
//! [Precedence](super#precedence)).
//!
//! - A bad entry (an unknown setting, a value that does not parse, a rule
//!   the values would make invalid, or that a call could never pass) is
//!   logged once (`warn`, naming the field and why) and left out; the rest
//!   applies. A name no rule of this program has is logged once at `info`
//!   (another service may share the hash) and applies if a middleware of
//!   that name is built later.
//! - While Redis cannot be read, the values last read stay in force; one
//!   `warn` says so, then one a minute at most, and one `info` when it is
//!   read again.
//! - The overrides are the process's, as all overrides are: they apply to a
//!   rule whichever limiter checks it. One limiter feeds them: the last one
//!   built with `fleet_overrides`. When it is dropped, reading stops and the
//!   fleet's values no longer apply. The reading runs on the Tokio runtime
//!   the limiter was built on; if that runtime ends first, the values last
//!   read stay.
//! - A rule named `overrides` with no subject would keep its budget at
//!   `limiter:overrides`: name it otherwise, or choose another key.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::backend::redis::RedisBackend;
use crate::log_gate::process_millis;
use crate::registry::{self, RuleOverride, Source};

/// The hash read by default: the default prefix and `overrides`.
pub const DEFAULT_KEY: &str = "limiter:overrides";

/// How often the hash is read.
pub const READ_EVERY: Duration = Duration::from_millis(500);

/// The longest field or value quoted in a log line.
const MAX_QUOTED: usize = 64;

/// How often, at most, a failing read is logged.
const FAILURE_LOG_EVERY_MS: u64 = 60_000;

/// The feed that writes the fleet's overrides now (0: none), held while it
/// writes them, so a feed dropped or replaced writes nothing after.
static OWNER: Mutex<u64> = Mutex::new(0);
static NEXT_FEED: AtomicU64 = AtomicU64::new(1);

fn owner() -> MutexGuard<'static, u64> {
    OWNER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One limiter's feed of the fleet's overrides: its reading task, stopped
/// (and the fleet's values dropped, unless a newer feed took over) when the
/// limiter and its clones are gone.
#[derive(Debug)]
pub(crate) struct Feed {
    id: u64,
    task: Option<tokio::task::AbortHandle>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        let mut owner = owner();
        if *owner == self.id {
            *owner = 0;
            registry::replace_valid(Source::Fleet, Vec::new());
        }
    }
}

/// Starts feeding the fleet's overrides from the hash at `key`: reads it
/// once now, then every [`READ_EVERY`] in a task on the current runtime.
pub(crate) async fn start(redis: &RedisBackend, key: &str) -> Feed {
    let id = NEXT_FEED.fetch_add(1, Ordering::Relaxed);
    *owner() = id;
    let mut reader = Reader::new(id);
    reader.read(redis, key).await;
    let task = match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let (redis, key) = (redis.clone(), key.to_owned());
            Some(
                runtime
                    .spawn(async move {
                        loop {
                            tokio::time::sleep(READ_EVERY).await;
                            if *owner() != id {
                                return;
                            }
                            reader.read(&redis, &key).await;
                        }
                    })
                    .abort_handle(),
            )
        }
        Err(_) => {
            tracing::warn!("fleet overrides read once: not on a Tokio runtime, so not read again");
            None
        }
    };
    Feed { id, task }
}

/// What one feed remembers between reads.
struct Reader {
    id: u64,
    /// The problems of the hash logged already (logged again if they go
    /// away and come back).
    logged: BTreeSet<Problem>,
    /// Since when reads fail (in [`process_millis`]), and when the next
    /// failure may be logged.
    failing: Option<u64>,
    next_failure_log: u64,
}

/// A problem with the hash, as logged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Problem {
    /// A bad entry: left out.
    Bad(String),
    /// A name no rule of the program has (yet).
    Unknown(String),
}

impl Reader {
    fn new(id: u64) -> Reader {
        Reader {
            id,
            logged: BTreeSet::new(),
            failing: None,
            next_failure_log: 0,
        }
    }

    /// Reads the hash and applies it; a failed read leaves the values in
    /// force.
    async fn read(&mut self, redis: &RedisBackend, key: &str) {
        match redis.read_hash(key).await {
            Ok(hash) => {
                let problems = {
                    let owner = owner();
                    if *owner != self.id {
                        return;
                    }
                    apply(&hash)
                };
                if let Some(since) = self.failing.take() {
                    // The next outage is logged at once.
                    self.next_failure_log = 0;
                    tracing::info!(
                        key,
                        failing_for_s = (process_millis() - since) / 1000,
                        "fleet overrides read from Redis again"
                    );
                }
                for problem in self.fresh(problems) {
                    match problem {
                        Problem::Bad(why) => tracing::warn!(key, "fleet override left out: {why}"),
                        Problem::Unknown(why) => {
                            tracing::info!(key, "fleet override not applied: {why}")
                        }
                    }
                }
            }
            Err(error) => {
                let now = process_millis();
                let since = *self.failing.get_or_insert(now);
                if now >= self.next_failure_log {
                    self.next_failure_log = now + FAILURE_LOG_EVERY_MS;
                    tracing::warn!(
                        key,
                        %error,
                        failing_for_s = (now - since) / 1000,
                        "fleet overrides cannot be read from Redis; the values last read stay in force"
                    );
                }
            }
        }
    }

    /// The problems of `problems` not logged before (to log now); the
    /// ones gone are forgotten, so they are logged again if they return.
    fn fresh(&mut self, problems: BTreeSet<Problem>) -> Vec<Problem> {
        let fresh = problems.difference(&self.logged).cloned().collect();
        self.logged = problems;
        fresh
    }
}

/// Makes the overrides of `hash` the fleet's, leaving out the bad entries;
/// what was wrong.
fn apply(hash: &BTreeMap<Vec<u8>, Vec<u8>>) -> BTreeSet<Problem> {
    let (changes, mut problems) = parse(hash);
    for (name, error) in registry::replace_valid(Source::Fleet, changes) {
        problems.insert(Problem::Bad(format!(
            "fields {}: {}",
            quoted(format!("{name}.*").as_bytes()),
            reason(&error)
        )));
    }
    problems
}

/// The overrides of `hash` by rule, and what was wrong with its fields.
fn parse(hash: &BTreeMap<Vec<u8>, Vec<u8>>) -> (Vec<(String, RuleOverride)>, BTreeSet<Problem>) {
    let mut changes: BTreeMap<String, RuleOverride> = BTreeMap::new();
    let mut problems = BTreeSet::new();
    let known = registry::rule_names();
    for (field, value) in hash {
        let shown = quoted(field);
        let Ok(field) = std::str::from_utf8(field) else {
            problems.insert(Problem::Bad(format!("field {shown} is not UTF-8")));
            continue;
        };
        let Some((name, setting)) = field.rsplit_once('.') else {
            problems.insert(Problem::Bad(format!(
                "field {shown}: write name.setting (count, period, burst or shadow)"
            )));
            continue;
        };
        if !known.iter().any(|n| n == name) {
            problems.insert(Problem::Unknown(format!(
                "field {shown}: no rule of this program is named {}",
                quoted(name.as_bytes())
            )));
            continue;
        }
        let value = match std::str::from_utf8(value) {
            Ok(value) if value.len() <= MAX_QUOTED => value,
            _ => {
                problems.insert(Problem::Bad(format!(
                    "field {shown}: a value of {} bytes is no setting",
                    value.len()
                )));
                continue;
            }
        };
        let mut change = changes.get(name).copied().unwrap_or_default();
        match super::field(&mut change, name, setting, value) {
            Ok(()) => {
                changes.insert(name.to_owned(), change);
            }
            Err(error) => {
                let why = reason(&error);
                // The field already names the rule.
                let why = why
                    .strip_prefix(&format!("override for `{name}`: "))
                    .unwrap_or(&why);
                problems.insert(Problem::Bad(format!("field {shown}: {why}")));
            }
        }
    }
    (changes.into_iter().collect(), problems)
}

/// What an override's error says, without the words every one starts with.
fn reason(error: &crate::error::Error) -> String {
    let text = error.to_string();
    match text.strip_prefix("invalid rate limiter configuration: ") {
        Some(reason) => reason.to_owned(),
        None => text,
    }
}

/// `text` in backquotes for a log line, or its length when long.
fn quoted(text: &[u8]) -> String {
    if text.len() > MAX_QUOTED {
        format!("of {} bytes", text.len())
    } else {
        format!("`{}`", String::from_utf8_lossy(text).escape_debug())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::Rule;

    /// The fleet's layer is the process's: one test at a time touches it.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    fn hash(pairs: &[(&str, &str)]) -> BTreeMap<Vec<u8>, Vec<u8>> {
        pairs
            .iter()
            .map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect()
    }

    fn bad(problems: &BTreeSet<Problem>, words: &[&str]) -> bool {
        problems.iter().any(|p| match p {
            Problem::Bad(why) => words.iter().all(|w| why.contains(w)),
            Problem::Unknown(_) => false,
        })
    }

    #[test]
    fn bad_entries_are_left_out_and_the_rest_applies() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        registry::register(
            "fleet-unit-a",
            Rule::fixed_window(10, Duration::from_secs(1)),
            1,
        );
        registry::register(
            "fleet-unit-b",
            Rule::fixed_window(10, Duration::from_secs(1)),
            1,
        );
        let long = "9".repeat(200);
        let problems = apply(&hash(&[
            ("fleet-unit-a.count", "20"),
            ("fleet-unit-a.shadow", "maybe"),
            ("fleet-unit-a.colour", "red"),
            ("fleet-unit-a.period", &long),
            ("fleet-unit-b.count", "0"),
            ("fleet-unit-b.period", "5"),
            ("no-such-rule.count", "3"),
            ("no-setting", "1"),
        ]));
        assert_eq!(
            registry::merged("fleet-unit-a"),
            Some(RuleOverride {
                count: Some(20),
                ..RuleOverride::default()
            })
        );
        assert_eq!(
            registry::merged("fleet-unit-b"),
            None,
            "a count of 0 leaves b out"
        );
        assert!(bad(
            &problems,
            &["`fleet-unit-a.shadow`", "true or false", "maybe"]
        ));
        assert!(bad(
            &problems,
            &["`fleet-unit-a.colour`", "unknown setting"]
        ));
        assert!(bad(&problems, &["`fleet-unit-a.period`", "200 bytes"]));
        assert!(!problems.iter().any(|p| format!("{p:?}").contains(&long)));
        assert!(bad(&problems, &["`fleet-unit-b.*`", "count"]));
        assert!(bad(&problems, &["`no-setting`", "name.setting"]));
        assert!(problems.contains(&Problem::Unknown(
            "field `no-such-rule.count`: no rule of this program is named `no-such-rule`".into()
        )));
        assert_eq!(problems.len(), 6, "{problems:?}");

        let mut reader = Reader::new(0);
        assert_eq!(reader.fresh(problems.clone()).len(), 6);
        assert!(
            reader.fresh(problems.clone()).is_empty(),
            "each is logged once"
        );
        let fewer: BTreeSet<Problem> = problems.iter().skip(1).cloned().collect();
        assert!(reader.fresh(fewer).is_empty());
        assert_eq!(
            reader.fresh(problems).len(),
            1,
            "one that came back is logged again"
        );
        registry::replace_valid(Source::Fleet, Vec::new());
    }

    #[test]
    fn each_setting_comes_from_the_first_source_that_sets_it() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let name = "fleet-unit-precedence";
        registry::register(name, Rule::token_bucket(10, Duration::from_secs(1)), 1);
        let only = |count, burst, shadow| RuleOverride {
            count,
            burst,
            shadow,
            period: None,
        };
        registry::set_all(
            Source::Config,
            vec![(name.into(), only(Some(3), None, Some(true)))],
        )
        .unwrap();
        apply(&hash(&[
            ("fleet-unit-precedence.count", "5"),
            ("fleet-unit-precedence.burst", "8"),
        ]));
        assert_eq!(
            registry::merged(name),
            Some(only(Some(5), Some(8), Some(true)))
        );
        registry::set(name, only(Some(7), None, None)).unwrap();
        assert_eq!(
            registry::merged(name),
            Some(only(Some(7), Some(8), Some(true)))
        );
        apply(&hash(&[("fleet-unit-precedence.burst", "9")]));
        assert_eq!(
            registry::merged(name),
            Some(only(Some(7), Some(9), Some(true)))
        );
        registry::clear(name);
        assert_eq!(
            registry::merged(name),
            Some(only(Some(3), Some(9), Some(true)))
        );
        apply(&hash(&[]));
        assert_eq!(
            registry::merged(name),
            Some(only(Some(3), None, Some(true)))
        );
        let rule = Rule::token_bucket(10, Duration::from_secs(1));
        let (rule, shadow) = registry::effective(name, &rule, false).unwrap();
        assert_eq!((rule.count(), rule.burst(), shadow), (3, 3, true));
        registry::set_all(Source::Config, vec![(name.into(), RuleOverride::default())]).unwrap();
        assert_eq!(registry::merged(name), None);
    }
}
