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

/// Where an override comes from. Each field of a rule's override is taken
/// from the first source, in this order, that sets it; a field none sets
/// keeps the rule's own value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// [`set`] and [`clear`]: this process's code.
    Api = 0,
    /// The fleet's hash in Redis (`RateLimiterBuilder::fleet_overrides`).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    Fleet = 1,
    /// The environment and files (`load_env`, `load_toml`, `reload_toml`).
    Config = 2,
}

/// The overrides of each source, and what they make together.
struct Table {
    layers: [Vec<(String, RuleOverride)>; 3],
    /// Each overridden rule's fields, merged by precedence.
    merged: Vec<(String, RuleOverride)>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static TABLE: RwLock<Table> = RwLock::new(Table {
    layers: [Vec::new(), Vec::new(), Vec::new()],
    merged: Vec::new(),
});

impl RuleOverride {
    /// Each field of `self`, or of `lower` where `self` has none.
    fn or(self, lower: RuleOverride) -> RuleOverride {
        RuleOverride {
            count: self.count.or(lower.count),
            period: self.period.or(lower.period),
            burst: self.burst.or(lower.burst),
            shadow: self.shadow.or(lower.shadow),
        }
    }
}

impl Table {
    /// `Ok` if each of `changes`, as its rule's entry in `source`, makes
    /// with the other sources' fields a rule its calls can pass.
    fn check_each(&self, source: Source, changes: &[(String, RuleOverride)]) -> Result<(), Error> {
        for (name, change) in changes {
            check(name, &self.merged_with(source, name, Some(*change)))?;
        }
        Ok(())
    }

    /// What `name`'s override would be with `change` as its entry in
    /// `source` (`None`: no entry there).
    fn merged_with(
        &self,
        source: Source,
        name: &str,
        change: Option<RuleOverride>,
    ) -> RuleOverride {
        let mut merged = RuleOverride::default();
        for (i, layer) in self.layers.iter().enumerate() {
            let entry = if i == source as usize {
                change
            } else {
                layer.iter().find(|(n, _)| n == name).map(|(_, c)| *c)
            };
            merged = merged.or(entry.unwrap_or_default());
        }
        merged
    }

    /// Sets (`Some`) or removes `name`'s entry in `source`.
    fn put(&mut self, source: Source, name: &str, change: Option<RuleOverride>) {
        let layer = &mut self.layers[source as usize];
        layer.retain(|(n, _)| n != name);
        layer.extend(change.map(|c| (name.to_owned(), c)));
        self.merge();
    }

    /// Makes `changes` the whole of `source`.
    fn replace(&mut self, source: Source, changes: Vec<(String, RuleOverride)>) {
        self.layers[source as usize] = changes;
        self.merge();
    }

    fn merge(&mut self) {
        let mut names: Vec<&str> = self
            .layers
            .iter()
            .flatten()
            .map(|(n, _)| n.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        let merged: Vec<(String, RuleOverride)> = names
            .into_iter()
            .map(|name| {
                let change = self
                    .layers
                    .iter()
                    .fold(RuleOverride::default(), |merged, layer| {
                        let entry = layer.iter().find(|(n, _)| n == name).map(|(_, c)| *c);
                        merged.or(entry.unwrap_or_default())
                    });
                (name.to_owned(), change)
            })
            .filter(|(_, change)| *change != RuleOverride::default())
            .collect();
        self.merged = merged;
        ACTIVE.store(!self.merged.is_empty(), Ordering::Release);
    }
}

fn table() -> std::sync::RwLockWriteGuard<'static, Table> {
    TABLE.write().unwrap_or_else(PoisonError::into_inner)
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
    Rule::try_new(base.algorithm(), count, period, burst).map(|rule| rule.keeping_options(base))
}

/// Sets (or replaces) the override of rule `name` made from code, effective
/// for the next call. It comes before every other source of overrides: each
/// field it sets wins over the fleet's (Redis) and the environment's or a
/// file's; a field it leaves `None` is theirs, or the rule's own.
///
/// # Errors
///
/// [`Error::Config`] if no rule has that name, the values (with the other
/// sources' fields it leaves) do not make a valid rule, or the rule would
/// hold fewer units than a call under it takes (its `cost`).
pub fn set(name: &str, change: RuleOverride) -> Result<(), Error> {
    set_in(Source::Api, name, change)
}

/// Sets `name`'s entry in `source`, if with the other sources' it makes a
/// rule its calls can pass.
pub(crate) fn set_in(source: Source, name: &str, change: RuleOverride) -> Result<(), Error> {
    let mut table = table();
    check(name, &table.merged_with(source, name, Some(change)))?;
    table.put(source, name, Some(change));
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

/// Removes the override of rule `name` made with [`set`]: the next source's
/// fields apply again (the fleet's, the environment's or a file's), or the
/// rule as written.
pub fn clear(name: &str) {
    table().put(Source::Api, name, None);
}

#[cfg_attr(not(feature = "toml"), allow(dead_code))]
/// Checks `changes` as the whole of `source` (each with the other sources'
/// fields), then makes them so; their number. On error, nothing changes.
pub(crate) fn replace_all(
    source: Source,
    changes: Vec<(String, RuleOverride)>,
) -> Result<usize, Error> {
    let mut table = table();
    table.check_each(source, &changes)?;
    let count = changes.len();
    table.replace(source, changes);
    Ok(count)
}

/// Sets each of `changes` in `source` (replacing its entry for that name),
/// if every one makes with the other sources' fields a rule its calls can
/// pass; their number. On error, nothing changes.
pub(crate) fn set_all(
    source: Source,
    changes: Vec<(String, RuleOverride)>,
) -> Result<usize, Error> {
    let mut table = table();
    table.check_each(source, &changes)?;
    let count = changes.len();
    for (name, change) in changes {
        table.put(source, &name, Some(change));
    }
    Ok(count)
}

/// Makes `changes` the whole of `source`, leaving out (and returning, with
/// why) each that does not make with the other sources' fields a rule its
/// calls can pass.
#[cfg(feature = "redis")]
pub(crate) fn replace_valid(
    source: Source,
    changes: Vec<(String, RuleOverride)>,
) -> Vec<(String, Error)> {
    let mut table = table();
    let mut refused = Vec::new();
    let mut kept = Vec::with_capacity(changes.len());
    for (name, change) in changes {
        match check(&name, &table.merged_with(source, &name, Some(change))) {
            Ok(()) => kept.push((name, change)),
            Err(why) => refused.push((name, why)),
        }
    }
    if table.layers[source as usize] != kept {
        table.replace(source, kept);
    }
    refused
}

/// The override in force for rule `name`, its fields merged from every
/// source by precedence; `None` when none sets any.
pub(crate) fn merged(name: &str) -> Option<RuleOverride> {
    let table = TABLE.read().unwrap_or_else(PoisonError::into_inner);
    let (_, change) = table.merged.iter().find(|(n, _)| n == name)?;
    Some(*change)
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
    let change = merged(name)?;
    Some((
        apply(rule, &change).unwrap_or(*rule),
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
