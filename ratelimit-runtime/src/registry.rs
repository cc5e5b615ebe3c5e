//! The rules of the program by name: every `#[rate_limit]` call site
//! ([`SITES`], gathered by the linker) and every middleware's rule
//! ([`register`]), the overrides in force for each, and what can be done to
//! a budget knowing only its rule's name and its subject
//! ([`RateLimiter::reset_named`], [`peek_named`](RateLimiter::peek_named),
//! [`refund_named`](RateLimiter::refund_named)).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use crate::decision::{Charge, Decision};
use crate::error::Error;
use crate::keys;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::site::Site;

/// Every `#[rate_limit]` rule of the program (gathered by the linker), so
/// overrides and the by-name operations find them by name.
#[linkme::distributed_slice]
pub static SITES: [&'static Site];

/// Rules known by name besides the attribute's (middleware).
static REGISTERED: RwLock<Vec<Registered>> = RwLock::new(Vec::new());

/// A rule under a name, as middleware built with it holds it (its keys are
/// under the default prefix).
struct Registered {
    name: String,
    rule: Rule,
    /// The most units one request under it takes.
    cost: u64,
    /// How many middleware values were built with it (and not renamed since).
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    holders: usize,
}

/// Makes a rule known by name (the middleware does, when built), with the
/// units one request takes.
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
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
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
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

/// One rule written under a name: where its budgets are kept, and the most
/// units one call under it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) rule: Rule,
    pub(crate) cost: u64,
    /// Its keys' prefix.
    pub(crate) prefix: &'static str,
    /// Its name as its keys hold it when that is not its name (a fn
    /// without `key`: its module path and name).
    pub(crate) keyed_as: Option<&'static str>,
}

/// Each rule written under `name` (call sites and middleware may share a
/// name with different rules or prefixes), with the most units one call
/// under it takes.
pub(crate) fn rules_named(name: &str) -> Vec<Written> {
    let mut found: Vec<Written> = Vec::new();
    let mut add = |written: Written| match found.iter_mut().find(|w| {
        w.rule == written.rule && w.prefix == written.prefix && w.keyed_as == written.keyed_as
    }) {
        Some(w) => w.cost = w.cost.max(written.cost),
        None => found.push(written),
    };
    for site in SITES.iter().filter(|s| s.name == name) {
        add(Written {
            rule: site.rule,
            cost: site.cost,
            prefix: site.prefix,
            keyed_as: site.keyed_as,
        });
    }
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    for r in registered.iter().filter(|r| r.name == name) {
        add(Written {
            rule: r.rule,
            cost: r.cost,
            prefix: keys::DEFAULT_PREFIX,
            keyed_as: None,
        });
    }
    found
}

/// The names of every rule an override or a by-name operation can name.
pub fn rule_names() -> Vec<String> {
    let mut names = BTreeSet::new();
    names.extend(SITES.iter().map(|s| s.name.to_owned()));
    names.extend(
        REGISTERED
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|r| r.name.clone()),
    );
    names.into_iter().collect()
}

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
    Rule::try_new(base.algorithm(), count, period, burst).map(|rule| rule.keeping_options(base))
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
pub(crate) fn check(name: &str, change: &RuleOverride) -> Result<(), Error> {
    let rules = rules_named(name);
    if rules.is_empty() {
        return Err(Error::Config(format!(
            "override for `{name}`: no rule has that name (rules: {})",
            rule_names().join(", ")
        )));
    }
    let bad = |why: String| Error::Config(format!("override for `{name}`: {why}"));
    for written in rules {
        let rule = apply(&written.rule, change).map_err(bad)?;
        if rule.capacity() < written.cost {
            return Err(bad(format!(
                "a call takes {} units, more than the {} the rule would hold, so none could pass",
                written.cost,
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

#[cfg_attr(not(feature = "toml"), allow(dead_code))]
/// Makes `changes` the whole table (each already [`check`]ed); their number.
pub(crate) fn replace_all(changes: Vec<(String, RuleOverride)>) -> usize {
    let mut table = TABLE.write().unwrap_or_else(PoisonError::into_inner);
    *table = changes;
    ACTIVE.store(!table.is_empty(), Ordering::Release);
    table.len()
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

/// The rule in force for rule `name` as written `rule` (overridden or not).
pub(crate) fn in_force(name: &str, rule: &Rule) -> Rule {
    effective(name, rule, false).map_or(*rule, |(rule, _)| rule)
}

/// The rules named `name` (as overrides make them now) and the key of
/// `subject` under each.
pub(crate) fn named(name: &str, subject: &str) -> Result<Vec<(Rule, String)>, Error> {
    if name.replace("{{", "").contains('{') {
        return Err(Error::Config(format!(
            "the rule {name:?} builds its key from the call's values, so a subject cannot \
             name its budget: use `reset`, `peek` or `refund` with the rule and the full key"
        )));
    }
    let rules = rules_named(name);
    if rules.is_empty() {
        return Err(Error::Config(format!(
            "no rate-limit rule is named {name:?}; the rules are {:?}",
            rule_names()
        )));
    }
    // A hash tag is written `{{tag}}` in an attribute's key, and kept as
    // `{tag}` in the key.
    let written = name.replace("{{", "{").replace("}}", "}");
    Ok(rules
        .into_iter()
        .map(|w| {
            let key = keys::key(w.prefix, w.keyed_as.unwrap_or(&written), subject);
            (in_force(name, &w.rule), key)
        })
        .collect())
}

impl RateLimiter {
    /// [`reset`](RateLimiter::reset) of the budget the rule named `name` keeps
    /// for `subject`, without knowing how keys are built: `name` is a
    /// `#[rate_limit]`'s `key` as written (its `prefix` is known) or a
    /// middleware's name, `subject` what follows it in the key: `""` for a
    /// global rule, `"ip:1.2.3.4"`, `"arg:user:bob"`, or for a header
    /// [`HttpOptions::subject_of_header`](crate::HttpOptions::subject_of_header)
    /// (header values are digests in keys). Every rule under that name is
    /// reset. A key with `{param}` placeholders has no subject: use
    /// `reset` with the full key (`reset_named` says so with an error).
    ///
    /// ```
    /// use ratelimit_runtime::{RateLimited, RateLimiter, rate_limit};
    ///
    /// #[rate_limit(key = "login", count = 1, period = 60, by = arg(user))]
    /// async fn login(user: &str) -> Result<(), RateLimited> { Ok(()) }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), ratelimit_runtime::Error> {
    /// login("ann").await.unwrap();
    /// assert!(login("ann").await.is_err());
    /// RateLimiter::global().reset_named("login", "arg:user:ann").await?;
    /// assert!(login("ann").await.is_ok());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] if no rule has that name (the message lists them)
    /// or its key has `{param}` placeholders, and as
    /// [`reset`](RateLimiter::reset).
    pub async fn reset_named(&self, name: &str, subject: &str) -> Result<Decision, Error> {
        let mut last = None;
        for (rule, key) in named(name, subject)? {
            last = Some(self.reset(&rule, &key).await?);
        }
        Ok(last.expect("named() finds at least one rule"))
    }

    /// [`peek`](RateLimiter::peek) by name and subject, as
    /// [`reset_named`](RateLimiter::reset_named) addresses a budget (the
    /// first rule of that name).
    ///
    /// # Errors
    ///
    /// As [`reset_named`](RateLimiter::reset_named).
    pub async fn peek_named(&self, name: &str, subject: &str) -> Result<Decision, Error> {
        let (rule, key) = named(name, subject)?.swap_remove(0);
        self.peek(&rule, &key).await
    }

    /// [`refund`](RateLimiter::refund) by name and subject, as
    /// [`reset_named`](RateLimiter::reset_named) addresses a budget (the
    /// first rule of that name).
    ///
    /// # Errors
    ///
    /// As [`reset_named`](RateLimiter::reset_named) and
    /// [`refund`](RateLimiter::refund).
    pub async fn refund_named(
        &self,
        name: &str,
        subject: &str,
        charge: Charge,
    ) -> Result<Decision, Error> {
        let (rule, key) = named(name, subject)?.swap_remove(0);
        self.refund(&rule, &key, charge).await
    }
}
