//! What the HTTP middlewares share (actix-web's `RateLimit`, the tower
//! `RateLimitLayer`): the set of rules, whose budget a request charges under
//! each, the allow-lists, the tiers, and the keys a request is checked
//! under.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use super::{Headers, HttpOptions, canonical};
use crate::decision::{Charge, RateLimited};
use crate::error::{Error, OnError};
use crate::keys;
use crate::limiter::RateLimiter;
use crate::rule::Rule;
use crate::site::Site;

/// A middleware's closure over the framework's request `R` (`by_key`, a
/// tier picker): a request's subject or tier, `None` for none.
pub(crate) type KeyFn<R> = Arc<dyn Fn(&R) -> Option<String> + Send + Sync>;

/// Whose budget a rule of a middleware charges; `K` is the framework's key
/// closure.
pub(crate) enum Subject<K> {
    Global,
    Ip,
    /// A header's name, lowercase.
    Header(String),
    Key(K),
}

impl<K: Clone> Clone for Subject<K> {
    fn clone(&self) -> Self {
        match self {
            Subject::Global => Subject::Global,
            Subject::Ip => Subject::Ip,
            Subject::Header(name) => Subject::Header(name.clone()),
            Subject::Key(key) => Subject::Key(key.clone()),
        }
    }
}

/// A middleware's configuration: its set of rules (at least one; a request
/// passes only if every rule allows it) and what applies to every request.
#[derive(Clone)]
pub(crate) struct Limit<K> {
    pub(crate) rules: Vec<SetRule<K>>,
    pub(crate) on_error: Option<OnError>,
    exempt_paths: Vec<String>,
    /// Which response statuses give the request's units back.
    pub(crate) refund_if: Option<Arc<dyn Fn(u16) -> bool + Send + Sync>>,
}

/// One rule of a middleware's set: whose budget it charges, under which
/// name, the subjects it lets through, and its tiers.
#[derive(Clone)]
pub(crate) struct SetRule<K> {
    pub(crate) rule: Rule,
    pub(crate) name: &'static str,
    /// The keys' base: the prefix and the name.
    pub(crate) key: String,
    pub(crate) by: Subject<K>,
    pub(crate) cost: u64,
    exempt_keys: Vec<String>,
    /// The exempt keys that are addresses (for `by_ip`).
    exempt_ips: Vec<IpAddr>,
    /// Rules chosen per request: the table, and what picks a tier's name.
    pub(crate) tiers: Option<(Tiers, K)>,
}

/// Rules chosen per request: named rules (a plan's, a tier's), one of which
/// a closure picks for each request (see [`Middleware::tiers`](crate::http::Middleware::tiers)).
/// A tier is a rule, or a set of rules all of which a request must pass
/// ([`and`](Tiers::and)). Each rule of a tier is a rule of its own to
/// overrides, `reset_named` and the metrics, under its name; its budgets
/// are keyed `limiter:<name>` plus the subject.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Rule, http::Tiers};
///
/// const SECOND: Duration = Duration::from_secs(1);
/// const DAY: Duration = Duration::from_secs(86_400);
/// let plans = Tiers::new()
///     // The free plan: 10 a second and 1,000 a day.
///     .tier("free", Rule::fixed_window(10, SECOND))
///     .and("free_daily", Rule::fixed_window(1_000, DAY))
///     .tier(String::from("pro"), Rule::fixed_window(100, SECOND));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Tiers {
    /// Each tier's rules, its own name first.
    tiers: Vec<Vec<(&'static str, Rule)>>,
}

impl Tiers {
    /// An empty table.
    pub fn new() -> Tiers {
        Tiers::default()
    }

    /// Adds the tier `name` under `rule`. The name is kept for the life of
    /// the program (a table is made once, at start-up).
    pub fn tier(mut self, name: impl Into<String>, rule: Rule) -> Tiers {
        self.tiers.push(vec![named(name, rule)]);
        self
    }

    /// Adds `rule`, under the name `name`, to the last tier added: a
    /// request of that tier passes only if each of its rules allows it,
    /// and is charged by each.
    ///
    /// # Panics
    ///
    /// Before any [`tier`](Tiers::tier), or if `name` is one of the
    /// table's already (a programming error, caught at start-up).
    pub fn and(mut self, name: impl Into<String>, rule: Rule) -> Tiers {
        let name = name.into();
        assert!(
            !self.tiers.iter().flatten().any(|(known, _)| *known == name),
            "the rule name `{name}` is in the tiers' table already: each rule needs a name of its own"
        );
        let rule = named(name, rule);
        self.tiers
            .last_mut()
            .expect("`Tiers::and` adds a rule to the last tier: call `tier` first")
            .push(rule);
        self
    }

    /// Each tier's name and the sites of its rules, with `cost` and the
    /// failure policy.
    fn sites(&self, cost: u64, on_error: Option<OnError>) -> Vec<(&'static str, Vec<Arc<Site>>)> {
        self.tiers
            .iter()
            .map(|rules| {
                let sites = rules
                    .iter()
                    .map(|&(name, rule)| Arc::new(site(name, rule, cost, on_error)))
                    .collect();
                (rules[0].0, sites)
            })
            .collect()
    }
}

/// A tier's rule under `name`, known to overrides: the name is kept for
/// the life of the program.
fn named(name: impl Into<String>, rule: Rule) -> (&'static str, Rule) {
    let name: &'static str = Box::leak(name.into().into_boxed_str());
    crate::registry::register(name, rule, 1);
    (name, rule)
}

/// The site of a middleware's rule (or a tier's).
fn site(name: &'static str, rule: Rule, cost: u64, on_error: Option<OnError>) -> Site {
    let site = Site::new(name, rule).with_cost(cost);
    match on_error {
        Some(on_error) => site.with_on_error(on_error),
        None => site,
    }
}

/// The sites a middleware decides through: each rule's, and each of its
/// tiers'.
pub(crate) struct Sites {
    pub(crate) rules: Vec<RuleSites>,
}

/// The sites of one rule of a middleware: its own, and its tiers'.
pub(crate) struct RuleSites {
    pub(crate) own: Arc<Site>,
    tiers: Vec<(&'static str, Vec<Arc<Site>>)>,
}

/// The sites a rule of a request is checked under.
pub(crate) enum Chosen<'a> {
    /// One site, under this key.
    One(&'a Arc<Site>, Cow<'a, str>),
    /// A tier's set, each under its own name with this subject.
    Tier(&'a [Arc<Site>], Cow<'a, str>),
}

impl Sites {
    pub(crate) fn new<K>(limit: &Limit<K>) -> Sites {
        let rules = limit
            .rules
            .iter()
            .map(|rule| RuleSites {
                own: Arc::new(site(rule.name, rule.rule, rule.cost, limit.on_error)),
                tiers: rule
                    .tiers
                    .as_ref()
                    .map(|(tiers, _)| tiers.sites(rule.cost, limit.on_error))
                    .unwrap_or_default(),
            })
            .collect();
        Sites { rules }
    }
}

impl RuleSites {
    /// The sites a request with `key` (its own rule's) is checked under:
    /// its tier's, when the picker names one in the table.
    pub(crate) fn choose<'a, K>(
        &'a self,
        rule: &SetRule<K>,
        key: Cow<'a, str>,
        pick: impl FnOnce(&K) -> Option<String>,
    ) -> Chosen<'a> {
        let Some((_, picker)) = &rule.tiers else {
            return Chosen::One(&self.own, key);
        };
        let Some(tier) = pick(picker) else {
            return Chosen::One(&self.own, key);
        };
        match self.tiers.iter().find(|(name, _)| *name == tier) {
            Some((_, sites)) => {
                let subject = match key {
                    Cow::Borrowed(key) => Cow::Borrowed(keys::subject_of(key, &rule.key)),
                    Cow::Owned(key) => Cow::Owned(keys::subject_of(&key, &rule.key).to_owned()),
                };
                Chosen::Tier(sites, subject)
            }
            None => {
                tracing::debug!(tier, "no such tier; the middleware's own rule applies");
                Chosen::One(&self.own, key)
            }
        }
    }
}

/// What a rule of a middleware does with a request.
pub(crate) enum Admission<'a> {
    /// It does not apply (an exempt subject, or no key).
    Pass,
    /// Check it under this key (a global budget's is the rule's own: no
    /// copy of it).
    Check(Cow<'a, str>),
    /// Refuse it: its client is unknown, or its key needs a key secret the
    /// limiter lacks.
    Refuse(RateLimited),
}

impl<K> Limit<K> {
    /// One budget for all requests under `rule`, named `http` (key
    /// `limiter:http`), known to overrides under that name.
    pub(crate) fn new(rule: Rule) -> Limit<K> {
        Limit {
            rules: vec![SetRule::new(rule, "http")],
            on_error: None,
            exempt_paths: Vec::new(),
            refund_if: None,
        }
    }

    /// Gives back what a request under `key` took (`charge`) at `site` when
    /// its response's `status` says so (a concurrency rule's lease is given
    /// back anyway).
    pub(crate) async fn settle(
        &self,
        site: &Site,
        limiter: &RateLimiter,
        key: &str,
        charge: Option<Charge>,
        status: u16,
    ) {
        let (Some(refund_if), Some(charge)) = (&self.refund_if, charge) else {
            return;
        };
        if !refund_if(status) {
            return;
        }
        let rule = crate::registry::in_force(site.name, &site.rule);
        if let Err(error) = limiter.refund(&rule, key, charge).await {
            tracing::debug!(%error, key, "could not give back a request's units");
        }
    }

    /// Whether `path` is an exempt path or below one (whole segments).
    pub(crate) fn exempt_path(&self, path: &str) -> bool {
        self.exempt_paths.iter().any(|prefix| {
            path.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/')
            })
        })
    }

    /// When a middleware is set up: `Err` (and the error logged) if its keys
    /// need a key secret that `limiter` (else the installed global one)
    /// lacks, with `options` (else the installed ones) if known (else only
    /// `by_header` tells). Its requests would be refused; better said at
    /// start-up.
    pub(crate) fn check_secret(
        &self,
        limiter: Option<&RateLimiter>,
        options: Option<&HttpOptions>,
    ) -> Result<(), Error> {
        let Some(limiter) = limiter.or(RateLimiter::installed()) else {
            return Ok(());
        };
        let options = options.or(HttpOptions::installed());
        if !limiter.lacks_key_secret() {
            return Ok(());
        }
        for rule in &self.rules {
            let needs = match &rule.by {
                Subject::Header(_) => true,
                Subject::Ip => options.is_some_and(|options| options.digest_ips),
                Subject::Global | Subject::Key(_) => false,
            };
            if needs {
                let error = Error::Config(format!(
                    "the rate limit `{}`: {}",
                    rule.name,
                    crate::secret::MISSING
                ));
                crate::secret::log_missing(&error, rule.name);
                return Err(error);
            }
        }
        Ok(())
    }

    /// The rule the builder's rule-level methods change: the last added.
    pub(crate) fn last(&mut self) -> &mut SetRule<K> {
        self.rules.last_mut().expect("a middleware has a rule")
    }

    /// Adds `rule` to the set, named `http` (or `http_2`, `http_3`, ...:
    /// the first name the set has not taken) until it is named.
    pub(crate) fn and(&mut self, rule: Rule) {
        let name = if self.named("http") {
            let free = (2..)
                .map(|n| format!("http_{n}"))
                .find(|name| !self.named(name))
                .expect("a free name");
            Box::leak(free.into_boxed_str())
        } else {
            "http"
        };
        self.rules.push(SetRule::new(rule, name));
    }

    /// Whether a rule of the set is named `name`.
    pub(crate) fn named(&self, name: &str) -> bool {
        self.rules.iter().any(|rule| rule.name == name)
    }

    pub(crate) fn exempt_path_prefix(&mut self, prefix: String) {
        self.exempt_paths.push(prefix);
    }
}

impl<K> SetRule<K> {
    /// A global budget under `rule`, named `name`, known to overrides.
    fn new(rule: Rule, name: &'static str) -> SetRule<K> {
        crate::registry::register(name, rule, 1);
        SetRule {
            rule,
            name,
            key: keys::key(keys::DEFAULT_PREFIX, name, ""),
            by: Subject::Global,
            cost: 1,
            exempt_keys: Vec::new(),
            exempt_ips: Vec::new(),
            tiers: None,
        }
    }

    fn exempt_key(&self, subject: &[u8]) -> bool {
        self.exempt_keys.iter().any(|k| k.as_bytes() == subject)
    }

    /// What this rule does with a request from `client` (as the options
    /// tell it) with `headers`; `key` runs the framework's key closure,
    /// `limiter` (the one the request is checked by) gives the key secret. Each
    /// kind of subject is compared with the allow-list as the request has it
    /// (not as rendered into the key, where long values are digested and
    /// IPv6 masked).
    pub(crate) fn verdict(
        &self,
        site: &Site,
        options: &HttpOptions,
        limiter: &RateLimiter,
        client: impl FnOnce() -> Option<IpAddr>,
        headers: &impl Headers,
        key: impl FnOnce(&K) -> Option<String>,
    ) -> Admission<'_> {
        let subject = match &self.by {
            Subject::Global => return Admission::Check(Cow::Borrowed(&self.key)),
            Subject::Ip => {
                let ip = client();
                if ip.is_some_and(|ip| self.exempt_ips.contains(&ip)) {
                    return Admission::Pass;
                }
                let secret = match limiter.key_secret() {
                    Ok(secret) => secret,
                    Err(error) if options.digest_ips => {
                        return Admission::Refuse(site.misconfigured(&error));
                    }
                    // Not read: addresses are kept as they are.
                    Err(_) => &[],
                };
                match options.ip_subject(&self.key, secret, ip) {
                    Ok(key) => return Admission::Check(Cow::Owned(key)),
                    Err(()) => return Admission::Refuse(site.unknown_client()),
                }
            }
            Subject::Header(name) => {
                let value = headers.values(name).next();
                if value.is_some_and(|v| self.exempt_key(v)) {
                    return Admission::Pass;
                }
                match limiter.key_secret() {
                    Ok(secret) => {
                        let key = options.header_key(&self.key, secret, name, value);
                        return Admission::Check(Cow::Owned(key));
                    }
                    Err(error) => return Admission::Refuse(site.misconfigured(&error)),
                }
            }
            Subject::Key(closure) => {
                let Some(k) = key(closure) else {
                    return Admission::Pass;
                };
                if self.exempt_key(k.as_bytes()) {
                    return Admission::Pass;
                }
                keys::closure_subject(&k)
            }
        };
        Admission::Check(Cow::Owned([self.key.as_str(), &subject].concat()))
    }

    /// Names the rule `name`: the key is `limiter:<name>` plus the subject.
    pub(crate) fn name(&mut self, name: &'static str) {
        self.name = name;
        self.key = keys::key(keys::DEFAULT_PREFIX, name, "");
    }

    /// A budget per value of the header `name`.
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, caught at
    /// start-up).
    pub(crate) fn by_header(&mut self, name: &str) {
        let name = ::http::HeaderName::try_from(name).expect("a valid header name");
        self.by = Subject::Header(name.as_str().to_owned());
    }

    /// Units one request takes.
    ///
    /// # Panics
    ///
    /// If `cost` is 0 or over what the rule holds.
    pub(crate) fn check_cost(&self, cost: u64) {
        let capacity = self.rule.capacity();
        assert!(
            (1..=capacity).contains(&cost),
            "a request's cost must be between 1 and the rule's capacity ({capacity}), not {cost}"
        );
    }

    pub(crate) fn exempt_subject(&mut self, subject: String) {
        if let Ok(ip) = subject.parse::<IpAddr>() {
            self.exempt_ips.push(canonical(ip));
        }
        self.exempt_keys.push(subject);
    }
}

/// Makes the last rule of `limit` known to overrides under `name` with
/// `cost`. This value's registration so far is undone when nothing else
/// holds it (a builder renamed; not a clone's source, which keeps its own).
pub(crate) fn register_as<K: Clone>(limit: &mut Arc<Limit<K>>, name: &str, cost: u64) {
    let last = limit.rules.last().expect("a middleware has a rule");
    let (old, rule) = (last.name, last.rule);
    if Arc::get_mut(limit).is_some() {
        crate::registry::unregister(old, rule);
    }
    crate::registry::register(name, rule, cost);
}
