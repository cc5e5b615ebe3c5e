//! Rules changed by name, at start-up or while running, without a restart
//! and without losing state (the keys stay the same, so counts carry over).
//!
//! Every `#[rate_limit]` rule has a name: its `key` as written (or the fn's
//! name when it has no key); a [`RateLimit`](crate::RateLimit) middleware's
//! is its `.name(..)`, known once the middleware is built (build it before
//! loading overrides, and clone it into the app factory). `count`, `period`, `burst` and `shadow` can be set:
//!
//! - from the environment: `RATELIMIT_OVERRIDES="ip_limit_test.count=10; search.period=1m; search.shadow=true"`
//!   ([`load_env`]);
//! - from a TOML file ([`load_toml`]):
//!
//!   ```toml
//!   [rules.ip_limit_test]
//!   count = 10
//!   period = "1m"      # or whole seconds: 60
//!
//!   [rules."login:{user}"]
//!   shadow = true
//!   ```
//! - from code, at any time: [`set`], [`clear`]; or by re-reading the file
//!   while running: [`reload_toml`] (the file becomes the whole truth of
//!   what the environment and files set);
//! - for the whole fleet, from a hash in Redis that every instance built
//!   with [`RateLimiterBuilder::fleet_overrides`](crate::RateLimiterBuilder::fleet_overrides)
//!   reads twice a second (see [`fleet`]):
//!   `redis-cli HSET limiter:overrides search.count 50 search.shadow true`.
//!
//! # Precedence
//!
//! Each setting of a rule is taken from the first of these that sets it:
//!
//! 1. [`set`] (this process's code: an admin endpoint, a test);
//! 2. the fleet's hash in Redis;
//! 3. the environment and files ([`load_env`], [`load_str`], [`load_toml`],
//!    [`reload_toml`]; a later load replaces an earlier one's rules);
//! 4. the rule as written.
//!
//! So a setting cleared in one source (`clear`, `HDEL`, a line removed from
//! the file) falls back to the next one's, and one source can set `count`
//! while another sets `shadow`. [`in_force`] says what applies now.
//!
//! An override naming no rule, or with a value the rule cannot take (a
//! `count` or `burst` under the `cost` of a call), is an [`Error::Config`]
//! that says which and why, and changes nothing. Where call sites and
//! middleware share a name with different rules, the override applies to
//! each and must suit every one. A bad entry in the fleet's hash is no
//! error of anyone's call: it is logged once and left out, the rest
//! applies.

use std::time::Duration;

use crate::error::Error;
use crate::registry::Source;

#[cfg(feature = "redis")]
pub mod fleet;
pub use crate::registry::{RuleOverride, clear, rule_names, set};

/// The override in force for rule `name` now, each setting taken from the
/// source that wins it (see [Precedence](self#precedence)); `None` when no
/// source sets any.
pub fn in_force(name: &str) -> Option<RuleOverride> {
    crate::registry::merged(name)
}

/// Parses a period: whole seconds, or a number with `ms`, `s`, `m` or `h`.
fn period(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a period (like 10, \"500ms\", \"1m\")"))?;
    let ms = match unit {
        "" | "s" => n.checked_mul(1000),
        "ms" => Some(n),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => return Err(format!("`{text}`: unknown unit `{unit}`")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("`{text}` is too long"))
}

fn field(change: &mut RuleOverride, name: &str, key: &str, value: &str) -> Result<(), Error> {
    let bad = |why: String| Error::Config(format!("override for `{name}`: {why}"));
    let number = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map_err(|_| bad(format!("`{key}` takes a whole number, not `{v}`")))
    };
    match key {
        "count" => change.count = Some(number(value)?),
        "burst" => change.burst = Some(number(value)?),
        "period" => change.period = Some(period(value).map_err(bad)?),
        "shadow" => {
            change.shadow = Some(match value.trim() {
                "true" => true,
                "false" => false,
                other => return Err(bad(format!("`shadow` takes true or false, not `{other}`"))),
            })
        }
        other => {
            return Err(bad(format!(
                "unknown setting `{other}`; expected count, period, burst or shadow"
            )));
        }
    }
    Ok(())
}

/// Applies every override in `text` (`name.setting=value`, separated by `;`
/// or new lines); all or nothing.
pub fn load_str(text: &str) -> Result<usize, Error> {
    let mut changes: Vec<(String, RuleOverride)> = Vec::new();
    for entry in text
        .split([';', '\n'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
    {
        let (target, value) = entry.split_once('=').ok_or_else(|| {
            Error::Config(format!("override `{entry}`: write name.setting=value"))
        })?;
        let (name, key) = target.trim().rsplit_once('.').ok_or_else(|| {
            Error::Config(format!("override `{entry}`: write name.setting=value"))
        })?;
        let position = match changes.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                changes.push((name.to_owned(), RuleOverride::default()));
                changes.len() - 1
            }
        };
        field(&mut changes[position].1, name, key.trim(), value)?;
    }
    apply_all(changes)
}

/// Applies `RATELIMIT_OVERRIDES` if set (see [`load_str`]); 0 if not set.
pub fn load_env() -> Result<usize, Error> {
    match std::env::var("RATELIMIT_OVERRIDES") {
        Ok(text) => load_str(&text),
        Err(_) => Ok(0),
    }
}

/// Applies the `[rules.NAME]` tables of a TOML file; all or nothing
/// (feature `toml`).
#[cfg(feature = "toml")]
pub fn load_toml(path: impl AsRef<std::path::Path>) -> Result<usize, Error> {
    apply_all(read_toml(path.as_ref())?)
}

/// Makes the TOML file the whole truth of the environment's and files'
/// overrides: checks every entry, then replaces what [`load_env`],
/// [`load_str`], [`load_toml`] and earlier reloads set with the file's
/// (those of [`set`] and the fleet's stay, above it). On error, nothing
/// changes. For a file watched while running (feature `toml`).
#[cfg(feature = "toml")]
pub fn reload_toml(path: impl AsRef<std::path::Path>) -> Result<usize, Error> {
    crate::registry::replace_all(Source::Config, read_toml(path.as_ref())?)
}

#[cfg(feature = "toml")]
fn read_toml(path: &std::path::Path) -> Result<Vec<(String, RuleOverride)>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("reading {}: {e}", path.display())))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let Some(rules) = doc.get("rules") else {
        return Ok(Vec::new());
    };
    let rules = rules
        .as_table()
        .ok_or_else(|| Error::Config(format!("{}: `rules` must be a table", path.display())))?;
    let mut changes = Vec::new();
    for (name, settings) in rules {
        let settings = settings.as_table().ok_or_else(|| {
            Error::Config(format!(
                "{}: `rules.{name}` must be a table",
                path.display()
            ))
        })?;
        let mut change = RuleOverride::default();
        for (key, value) in settings {
            let value = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(Error::Config(format!(
                        "{}: `rules.{name}.{key}` must be a number, a string or a boolean, not {}",
                        path.display(),
                        other.type_str()
                    )));
                }
            };
            field(&mut change, name, key, &value)?;
        }
        changes.push((name.clone(), change));
    }
    Ok(changes)
}

fn apply_all(changes: Vec<(String, RuleOverride)>) -> Result<usize, Error> {
    crate::registry::set_all(Source::Config, changes)
}
