//! What the HTTP middlewares share (actix-web's `RateLimit`, the tower
//! `RateLimitLayer`): the rule, whose budget a request charges, the
//! allow-lists, and the key a request is checked under.

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

/// A middleware's `by_key` closure over the framework's request `R`: the
/// subject a request charges, `None` for a request it cannot name.
pub(crate) type KeyFn<R> = Arc<dyn Fn(&R) -> Option<String> + Send + Sync>;

/// Whose budget a middleware charges; `K` is the framework's key closure.
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

/// A middleware's configuration.
#[derive(Clone)]
pub(crate) struct Limit<K> {
    pub(crate) rule: Rule,
    pub(crate) name: &'static str,
    pub(crate) key: String,
    pub(crate) by: Subject<K>,
    pub(crate) cost: u64,
    pub(crate) on_error: Option<OnError>,
    exempt_paths: Vec<String>,
    exempt_keys: Vec<String>,
    /// The exempt keys that are addresses (for `by_ip`).
    exempt_ips: Vec<IpAddr>,
    /// Which response statuses give the request's units back.
    pub(crate) refund_if: Option<Arc<dyn Fn(u16) -> bool + Send + Sync>>,
    /// Rules chosen per request: the table, and what picks a tier's name.
    pub(crate) tiers: Option<(Tiers, K)>,
}

/// Rules chosen per request: named rules (a plan's, a tier's), one of which
/// a closure picks for each request (see the middlewares' `tiers`). Each
/// tier is a rule of its own to overrides, `reset_named` and the metrics,
/// under its name; its budgets are keyed `limiter:<tier>` plus the subject.
///
/// ```
/// use std::time::Duration;
/// use ratelimit_runtime::{Rule, http::Tiers};
///
/// let plans = Tiers::new()
///     .tier("free", Rule::fixed_window(100, Duration::from_secs(3600)))
///     .tier(String::from("pro"), Rule::fixed_window(10_000, Duration::from_secs(3600)));
/// ```
#[derive(Clone, Debug, Default)]
pub struct Tiers {
    tiers: Vec<(&'static str, Rule)>,
}

impl Tiers {
    /// An empty table.
    pub fn new() -> Tiers {
        Tiers::default()
    }

    /// Adds the tier `name` under `rule`. The name is kept for the life of
    /// the program (a table is made once, at start-up).
    pub fn tier(mut self, name: impl Into<String>, rule: Rule) -> Tiers {
        let name: &'static str = Box::leak(name.into().into_boxed_str());
        crate::registry::register(name, rule, 1);
        self.tiers.push((name, rule));
        self
    }

    /// Each tier's site, with the middleware's cost and failure policy.
    pub(crate) fn sites(&self, cost: u64, on_error: Option<OnError>) -> Vec<Site> {
        self.tiers
            .iter()
            .map(|&(name, rule)| site(name, rule, cost, on_error))
            .collect()
    }
}

/// The site of a middleware's rule (or a tier's).
fn site(name: &'static str, rule: Rule, cost: u64, on_error: Option<OnError>) -> Site {
    let site = Site::new(name, rule).with_cost(cost);
    match on_error {
        Some(on_error) => site.with_on_error(on_error),
        None => site,
    }
}

/// The sites a middleware decides through: its own rule's, and each tier's.
pub(crate) struct Sites {
    pub(crate) own: Arc<Site>,
    tiers: Vec<Arc<Site>>,
}

impl Sites {
    pub(crate) fn new<K>(limit: &Limit<K>) -> Sites {
        let tiers = limit
            .tiers
            .as_ref()
            .map(|(tiers, _)| tiers.sites(limit.cost, limit.on_error))
            .unwrap_or_default();
        Sites {
            own: Arc::new(limit.site()),
            tiers: tiers.into_iter().map(Arc::new).collect(),
        }
    }

    /// The site and key a request with `key` (its own rule's) is checked
    /// under: its tier's, when the picker names one in the table.
    pub(crate) fn choose<'a, K>(
        &'a self,
        limit: &Limit<K>,
        key: Cow<'a, str>,
        pick: impl FnOnce(&K) -> Option<String>,
    ) -> (&'a Arc<Site>, Cow<'a, str>) {
        let Some((_, picker)) = &limit.tiers else {
            return (&self.own, key);
        };
        let Some(tier) = pick(picker) else {
            return (&self.own, key);
        };
        match self.tiers.iter().find(|site| site.name == tier) {
            Some(site) => {
                let subject = keys::subject_of(&key, &limit.key);
                let key = keys::key(site.prefix, site.name, subject);
                (site, Cow::Owned(key))
            }
            None => {
                tracing::debug!(tier, "no such tier; the middleware's own rule applies");
                (&self.own, key)
            }
        }
    }
}

/// What a middleware does with a request.
pub(crate) enum Verdict<'a> {
    /// Let it through unlimited (an exempt path or subject, or no key).
    Pass,
    /// Check it under this key (a global budget's is the middleware's own:
    /// no copy of it).
    Check(Cow<'a, str>),
    /// Refuse it: its client is unknown, or its key needs a key secret the
    /// limiter lacks.
    Refuse(RateLimited),
}

impl<K> Limit<K> {
    /// One budget for all requests under `rule`, named `http` (key
    /// `limiter:http`), known to overrides under that name.
    pub(crate) fn new(rule: Rule) -> Limit<K> {
        crate::registry::register("http", rule, 1);
        Limit {
            rule,
            name: "http",
            key: keys::key(keys::DEFAULT_PREFIX, "http", ""),
            by: Subject::Global,
            cost: 1,
            on_error: None,
            exempt_paths: Vec::new(),
            exempt_keys: Vec::new(),
            exempt_ips: Vec::new(),
            refund_if: None,
            tiers: None,
        }
    }

    /// Gives back what a request under `key` took (`charge`) when its
    /// response's `status` says so (a concurrency rule's lease is given
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
        let rule = crate::registry::in_force(site.name, &self.rule);
        if let Err(error) = limiter.refund(&rule, key, charge).await {
            tracing::debug!(%error, key, "could not give back a request's units");
        }
    }

    /// The site its decisions go through.
    pub(crate) fn site(&self) -> Site {
        site(self.name, self.rule, self.cost, self.on_error)
    }

    /// Whether `path` is an exempt path or below one (whole segments).
    fn exempt_path(&self, path: &str) -> bool {
        self.exempt_paths.iter().any(|prefix| {
            path.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/')
            })
        })
    }

    fn exempt_key(&self, subject: &[u8]) -> bool {
        self.exempt_keys.iter().any(|k| k.as_bytes() == subject)
    }

    /// What to do with a request for `path` from `client` (as the options
    /// tell it) with `headers`; `key` runs the framework's key closure,
    /// `limiter` (the one the request is checked by) gives the key secret. Each
    /// kind of subject is compared with the allow-list as the request has it
    /// (not as rendered into the key, where long values are digested and
    /// IPv6 masked).
    #[allow(
        clippy::too_many_arguments,
        reason = "what a request is made of, each read only when needed"
    )]
    pub(crate) fn verdict(
        &self,
        site: &Site,
        path: &str,
        options: &HttpOptions,
        limiter: &RateLimiter,
        client: impl FnOnce() -> Option<IpAddr>,
        headers: &impl Headers,
        key: impl FnOnce(&K) -> Option<String>,
    ) -> Verdict<'_> {
        if self.exempt_path(path) {
            return Verdict::Pass;
        }
        let subject = match &self.by {
            Subject::Global => return Verdict::Check(Cow::Borrowed(&self.key)),
            Subject::Ip => {
                let ip = client();
                if ip.is_some_and(|ip| self.exempt_ips.contains(&ip)) {
                    return Verdict::Pass;
                }
                let secret = match limiter.key_secret() {
                    Ok(secret) => secret,
                    Err(error) if options.digest_ips => {
                        return Verdict::Refuse(site.misconfigured(&error));
                    }
                    // Not read: addresses are kept as they are.
                    Err(_) => &[],
                };
                match options.ip_subject(&self.key, secret, ip) {
                    Ok(key) => return Verdict::Check(Cow::Owned(key)),
                    Err(()) => return Verdict::Refuse(site.unknown_client()),
                }
            }
            Subject::Header(name) => {
                let value = headers.values(name).next();
                if value.is_some_and(|v| self.exempt_key(v)) {
                    return Verdict::Pass;
                }
                match limiter.key_secret() {
                    Ok(secret) => {
                        let key = options.header_key(&self.key, secret, name, value);
                        return Verdict::Check(Cow::Owned(key));
                    }
                    Err(error) => return Verdict::Refuse(site.misconfigured(&error)),
                }
            }
            Subject::Key(closure) => {
                let Some(k) = key(closure) else {
                    return Verdict::Pass;
                };
                if self.exempt_key(k.as_bytes()) {
                    return Verdict::Pass;
                }
                keys::closure_subject(&k)
            }
        };
        Verdict::Check(Cow::Owned([self.key.as_str(), &subject].concat()))
    }

    /// When a middleware is set up: `Err` (and the error logged) if its keys
    /// need a key secret that `limiter` (else the installed global one)
    /// lacks, with `options` if known (else only `by_header` tells). Its
    /// requests would be refused; better said at start-up.
    pub(crate) fn check_secret(
        &self,
        limiter: Option<&RateLimiter>,
        options: Option<&HttpOptions>,
    ) -> Result<(), Error> {
        let needs = match &self.by {
            Subject::Header(_) => true,
            Subject::Ip => options.is_some_and(|options| options.digest_ips),
            Subject::Global | Subject::Key(_) => false,
        };
        let Some(limiter) = limiter.or(RateLimiter::installed()) else {
            return Ok(());
        };
        if !needs || !limiter.lacks_key_secret() {
            return Ok(());
        }
        let error = Error::Config(format!(
            "the rate limit `{}`: {}",
            self.name,
            crate::secret::MISSING
        ));
        crate::secret::log_missing(&error, self.name);
        Err(error)
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

    pub(crate) fn exempt_path_prefix(&mut self, prefix: String) {
        self.exempt_paths.push(prefix);
    }

    pub(crate) fn exempt_subject(&mut self, subject: String) {
        if let Ok(ip) = subject.parse::<IpAddr>() {
            self.exempt_ips.push(canonical(ip));
        }
        self.exempt_keys.push(subject);
    }
}

/// Makes `limit`'s rule known to overrides under `name` with `cost`. This
/// value's registration so far is undone when nothing else holds it (a
/// builder renamed; not a clone's source, which keeps its own).
pub(crate) fn register_as<K: Clone>(limit: &mut Arc<Limit<K>>, name: &str, cost: u64) {
    let rule = limit.rule;
    if Arc::get_mut(limit).is_some() {
        crate::registry::unregister(limit.name, rule);
    }
    crate::registry::register(name, rule, cost);
}

/// The builder methods both middlewares share, on a type with a field
/// `inner: Arc<Limit<KeyFn<R>>>` for the framework's request `R` (the
/// framework's `by_key` is its own).
macro_rules! limit_builder {
    ($ty:ident, $request:ty) => {
        impl $ty {
            /// One budget for all requests under `rule`, named `http` (its
            /// key `limiter:http`; name it with [`name`](Self::name)).
            pub fn new(rule: $crate::rule::Rule) -> $ty {
                $ty::from_limit(::std::sync::Arc::new($crate::http::limit::Limit::new(rule)))
            }

            fn with(
                mut self,
                change: impl FnOnce(
                    &mut $crate::http::limit::Limit<$crate::http::limit::KeyFn<$request>>,
                ),
            ) -> $ty {
                change(::std::sync::Arc::make_mut(&mut self.inner));
                self
            }

            /// The rule's name: its budgets' keys are `limiter:<name>` plus
            /// the subject, the rate-limit headers and metrics name it so,
            /// and overrides and [`reset_named`](crate::RateLimiter::reset_named)
            /// address it by it.
            pub fn name(mut self, name: &'static str) -> $ty {
                let cost = self.inner.cost;
                $crate::http::limit::register_as(&mut self.inner, name, cost);
                self.with(|m| m.name(name))
            }

            /// The rule's name: [`name`](Self::name).
            #[deprecated(
                since = "0.1.1",
                note = "renamed `name`: a rule's identity is its name"
            )]
            pub fn key(self, name: &'static str) -> $ty {
                self.name(name)
            }

            /// A budget per client address (see
            /// [`HttpOptions`](crate::HttpOptions) for proxies and IPv6).
            pub fn by_ip(self) -> $ty {
                self.with(|m| m.by = $crate::http::limit::Subject::Ip)
            }

            /// A budget per value of a request header (requests without it
            /// share one).
            ///
            /// # Panics
            ///
            /// If `name` is not a valid header name (a programming error,
            /// caught at start-up).
            pub fn by_header(self, name: &str) -> $ty {
                self.with(|m| m.by_header(name))
            }

            /// Units one request takes (default 1).
            ///
            /// # Panics
            ///
            /// If `cost` is 0 or over what the rule holds (its `count`, or
            /// `burst` for `token_bucket` and `gcra`): no request could pass
            /// (a programming error, caught at start-up).
            pub fn cost(mut self, cost: u64) -> $ty {
                self.inner.check_cost(cost);
                let name = self.inner.name;
                $crate::http::limit::register_as(&mut self.inner, name, cost);
                self.with(|m| m.cost = cost)
            }

            /// What to do when the backend fails (default: the limiter's
            /// setting).
            pub fn on_error(self, on_error: $crate::error::OnError) -> $ty {
                self.with(|m| m.on_error = Some(on_error))
            }

            /// Give a request's units back when its response's status
            /// makes `refund_if` say so: `.refund_if(|status| status >= 500)`
            /// counts no request that failed on the server's side.
            pub fn refund_if(self, refund_if: impl Fn(u16) -> bool + Send + Sync + 'static) -> $ty {
                self.with(|m| m.refund_if = Some(::std::sync::Arc::new(refund_if)))
            }

            /// Requests for the path `prefix` or below it are not limited,
            /// by whole segments: `"/health"` exempts `/health` and
            /// `/health/db`, not `/healthz` or `/health-admin`. A prefix
            /// ending in `/` exempts what starts with it.
            pub fn exempt_path(self, prefix: impl Into<String>) -> $ty {
                let prefix = prefix.into();
                self.with(|m| m.exempt_path_prefix(prefix))
            }

            /// Requests whose subject is `subject` are not limited: an
            /// allow-list. The subject is the client's address for
            /// [`by_ip`](Self::by_ip) (`"10.0.0.1"`, `"2001:db8::1"`: the
            /// address, not the IPv6 prefix its budget is kept under), the
            /// header's value for [`by_header`](Self::by_header), the
            /// closure's key for [`by_key`](Self::by_key), each as the
            /// request has it, however long.
            pub fn exempt_key(self, subject: impl Into<String>) -> $ty {
                let subject = subject.into();
                self.with(|m| m.exempt_subject(subject))
            }
        }

        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("rule", &self.inner.rule)
                    .field("name", &self.inner.name)
                    .finish_non_exhaustive()
            }
        }
    };
}
pub(crate) use limit_builder;
