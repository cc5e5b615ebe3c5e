//! Rules changed by name, at start-up or while running, without a restart
//! and without losing state (the keys stay the same, so counts carry over).
//!
//! Every `#[rate_limit]` rule has a name: its `key` as written (or the fn's
//! name when it has no key); a [`RateLimit`](crate::RateLimit) middleware's
//! is its `.key(..)`, known once the middleware is built (build it before
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
//!   while running: [`reload_toml`] (the file becomes the whole truth).
//!
//! An override naming no rule, or with a value the rule cannot take (a
//! `count` or `burst` under the `cost` of a call), is an [`Error::Config`]
//! that says which and why, and changes nothing. Where call sites and
//! middleware share a name with different rules, the override applies to
//! each and must suit every one.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use crate::{Error, Rule};

/// What to change of a rule; `None` keeps the rule's own value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleOverride {
    /// Units per period.
    pub count: Option<u64>,
    /// The window (lease length for `concurrency`).
    pub period: Option<Duration>,
    /// The bucket of `token_bucket` / `gcra`.
    pub burst: Option<u64>,
    /// Check and record, never refuse.
    pub shadow: Option<bool>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static TABLE: RwLock<Vec<(String, RuleOverride)>> = RwLock::new(Vec::new());
/// Rules known by name besides the attribute's (middleware).
static REGISTERED: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// A rule under a name, as middleware built with it holds it.
struct Registered {
    name: String,
    rule: Rule,
    /// The most units one request under it takes.
    cost: u64,
    /// How many middleware values were built with it (and not renamed since).
    holders: usize,
}

/// Makes a rule known by name (the middleware does, when built), with the
/// units one request takes.
#[cfg_attr(not(feature = "actix"), allow(dead_code))]
pub(crate) fn register(name: &str, rule: Rule, cost: u64) {
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    match registered
        .iter_mut()
        .find(|r| r.name == name && r.rule == rule)
    {
        Some(r) => {
            r.cost = r.cost.max(cost);
            r.holders += 1;
        }
        None => registered.push(Registered {
            name: name.to_owned(),
            rule,
            cost,
            holders: 1,
        }),
    }
}

/// Undoes one [`register`]: a middleware renamed, or registered again with
/// another cost. A name no middleware holds any more is unknown again.
#[cfg_attr(not(feature = "actix"), allow(dead_code))]
pub(crate) fn unregister(name: &str, rule: Rule) {
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    if let Some(i) = registered
        .iter()
        .position(|r| r.name == name && r.rule == rule)
    {
        registered[i].holders -= 1;
        if registered[i].holders == 0 {
            registered.swap_remove(i);
        }
    }
}

/// Each rule written under `name` (call sites and middleware may share a
/// name with different rules), with the most units one call under it takes.
pub(crate) fn rules_named(name: &str) -> Vec<(Rule, u64)> {
    let mut found: Vec<(Rule, u64)> = Vec::new();
    let mut add = |rule: Rule, cost: u64| match found.iter_mut().find(|(r, _)| *r == rule) {
        Some((_, most)) => *most = (*most).max(cost),
        None => found.push((rule, cost)),
    };
    #[cfg(feature = "macros")]
    for site in crate::site::SITES.iter().filter(|s| s.name() == name) {
        add(*site.rule(), site.cost());
    }
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    for r in registered.iter().filter(|r| r.name == name) {
        add(r.rule, r.cost);
    }
    found
}

/// The names of every rule an override can name.
pub fn rule_names() -> Vec<String> {
    let mut names = BTreeSet::new();
    #[cfg(feature = "macros")]
    names.extend(crate::site::SITES.iter().map(|s| s.name().to_owned()));
    names.extend(
        REGISTERED
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|r| r.name.clone()),
    );
    names.into_iter().collect()
}

fn apply(base: &Rule, change: &RuleOverride) -> Result<Rule, String> {
    let count = change.count.unwrap_or(base.count());
    let period = change.period.unwrap_or(base.period());
    let burst = change
        .burst
        .unwrap_or(if change.count.is_some() && base.burst() == base.count() {
            count
        } else {
            base.burst()
        });
    if change.burst.is_some() && !base.algorithm().has_burst() {
        return Err(format!(
            "`burst` applies to token_bucket and gcra; this rule is {}",
            base.algorithm().name()
        ));
    }
    Rule::try_new(base.algorithm(), count, period, burst)
}

/// Sets (or replaces) the override of rule `name`, effective for the next call.
///
/// # Errors
///
/// [`Error::Config`] if no rule has that name, the values do not make a
/// valid rule, or the rule would hold fewer units than a call under it takes
/// (its `cost`).
pub fn set(name: &str, change: RuleOverride) -> Result<(), Error> {
    check(name, &change)?;
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    table.retain(|(n, _)| n != name);
    table.push((name.to_owned(), change));
    ACTIVE.store(true, Ordering::Release);
    Ok(())
}

/// Whether `change` makes a rule of `name` that its calls can pass: a rule
/// by that name exists, the values make a valid rule, and it holds the
/// units of its costliest call (one that could never pass would be let
/// through unchecked).
fn check(name: &str, change: &RuleOverride) -> Result<(), Error> {
    let rules = rules_named(name);
    if rules.is_empty() {
        return Err(Error::Config(format!(
            "override for `{name}`: no rule has that name (rules: {})",
            rule_names().join(", ")
        )));
    }
    let bad = |why: String| Error::Config(format!("override for `{name}`: {why}"));
    for (base, cost) in rules {
        let rule = apply(&base, change).map_err(bad)?;
        if rule.capacity() < cost {
            return Err(bad(format!(
                "a call takes {cost} units, more than the {} the rule would hold, so none could pass",
                rule.capacity()
            )));
        }
    }
    Ok(())
}

/// Removes the override of rule `name` (the rule as written applies again).
pub fn clear(name: &str) {
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    table.retain(|(n, _)| n != name);
    ACTIVE.store(!table.is_empty(), Ordering::Release);
}

/// The override in force for rule `name`, if any: the rule to use instead
/// and the shadow flag. `None` (one atomic load) when nothing is overridden.
#[inline]
pub(crate) fn effective(name: &str, rule: &Rule, shadow: bool) -> Option<(Rule, bool)> {
    if !ACTIVE.load(Ordering::Acquire) {
        return None;
    }
    overridden(name, rule, shadow)
}

#[cold]
fn overridden(name: &str, rule: &Rule, shadow: bool) -> Option<(Rule, bool)> {
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    let (_, change) = table.iter().find(|(n, _)| n == name)?;
    Some((
        apply(rule, change).unwrap_or(*rule),
        change.shadow.unwrap_or(shadow),
    ))
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

/// Makes the TOML file the whole truth: checks every entry, then replaces
/// all overrides (also ones set with [`set`]) with the file's. On error,
/// nothing changes. For a file watched while running (feature `toml`).
#[cfg(feature = "toml")]
pub fn reload_toml(path: impl AsRef<std::path::Path>) -> Result<usize, Error> {
    let changes = read_toml(path.as_ref())?;
    check_all(&changes)?;
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    *table = changes;
    ACTIVE.store(!table.is_empty(), Ordering::Release);
    Ok(table.len())
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
    check_all(&changes)?;
    let count = changes.len();
    for (name, change) in changes {
        set(&name, change)?;
    }
    Ok(count)
}

/// Checks every override: a bad one means none is applied.
fn check_all(changes: &[(String, RuleOverride)]) -> Result<(), Error> {
    changes
        .iter()
        .try_for_each(|(name, change)| check(name, change))
}
