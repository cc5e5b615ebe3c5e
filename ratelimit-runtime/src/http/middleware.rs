//! [`Middleware`]: the one type behind actix-web's [`RateLimit`](crate::RateLimit)
//! and the tower [`RateLimitLayer`](crate::RateLimitLayer), and its builder
//! methods.

use std::net::IpAddr;
use std::sync::Arc;

use super::HttpOptions;
use super::limit::{KeyFn, Limit, SetRule, Subject, Tiers, register_as};
use crate::error::OnError;
use crate::limiter::RateLimiter;
use crate::rule::Rule;

/// A closure that reads a request's peer address.
pub(crate) type PeerFn<R> = Arc<dyn Fn(&R) -> Option<IpAddr> + Send + Sync>;

/// Rate limiting for every request of an app, a scope or a router: one
/// rule, or a set of rules a request must all pass, with the same limiter
/// and decision pipeline as `#[rate_limit]` (overrides, shadow mode, the
/// failure policy and metrics apply alike). `R` is what the framework's
/// closures read of a request: actix-web's [`RateLimit`](crate::RateLimit)
/// is `Middleware<ServiceRequest>`, the tower
/// [`RateLimitLayer`](crate::RateLimitLayer) is `Middleware<Parts>` (the
/// request's head).
///
/// [`new`](Middleware::new) makes the first rule; [`and`](Middleware::and)
/// adds one. What a rule is keyed by and named
/// ([`name`](Middleware::name), [`by_ip`](Middleware::by_ip),
/// [`by_header`](Middleware::by_header), [`by_key`](Middleware::by_key),
/// [`cost`](Middleware::cost), [`exempt_key`](Middleware::exempt_key),
/// [`tiers`](Middleware::tiers)) applies to the last rule added; the rest
/// ([`on_error`](Middleware::on_error), [`refund_if`](Middleware::refund_if),
/// [`exempt_path`](Middleware::exempt_path)) to every request.
///
/// A request passes only if every rule of the set allows it, and then
/// takes from each; if one refuses, none is charged, and the `429` is the
/// refusing rule's (of those that refused, the one with the longest
/// `Retry-After`). The rate-limit fields list every rule. A `concurrency`
/// rule's lease is taken only when the whole set passes, and held until
/// the inner service has produced its response.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use ratelimit_runtime::{RateLimitLayer, Rule};
///
/// const PER_IP: Rule = Rule::gcra(10, Duration::from_secs(1));
/// const EVERYONE: Rule = Rule::fixed_window(1_000, Duration::from_secs(1));
/// let app: Router = Router::new().route("/api", get(|| async { "ok" })).layer(
///     // 10 a second per client, and 1,000 a second for all of them.
///     RateLimitLayer::new(PER_IP)
///         .name("per_ip")
///         .by_ip()
///         .and(EVERYONE)
///         .name("everyone"),
/// );
/// ```
///
/// Build it once, before the server (so its names are known when overrides
/// are loaded), and clone it where the framework wants one; it is `Send`
/// and `Sync`.
pub struct Middleware<R> {
    pub(crate) limit: Arc<Limit<KeyFn<R>>>,
    pub(crate) limiter: Option<RateLimiter>,
    pub(crate) options: Option<Arc<HttpOptions>>,
    pub(crate) peer: Option<PeerFn<R>>,
}

impl<R> Clone for Middleware<R> {
    fn clone(&self) -> Self {
        Middleware {
            limit: Arc::clone(&self.limit),
            limiter: self.limiter.clone(),
            options: self.options.clone(),
            peer: self.peer.clone(),
        }
    }
}

impl<R> std::fmt::Debug for Middleware<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rules: Vec<(&str, &Rule)> = self
            .limit
            .rules
            .iter()
            .map(|rule| (rule.name, &rule.rule))
            .collect();
        f.debug_struct("Middleware")
            .field("rules", &rules)
            .finish_non_exhaustive()
    }
}

impl<R> Middleware<R> {
    /// One budget for all requests under `rule`, named `http` (its key
    /// `limiter:http`; name it with [`name`](Self::name)).
    pub fn new(rule: Rule) -> Middleware<R> {
        Middleware {
            limit: Arc::new(Limit::new(rule)),
            limiter: None,
            options: None,
            peer: None,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Limit<KeyFn<R>>)) -> Middleware<R> {
        change(Arc::make_mut(&mut self.limit));
        self
    }

    fn with_rule(self, change: impl FnOnce(&mut SetRule<KeyFn<R>>)) -> Middleware<R> {
        self.with(|limit| change(limit.last()))
    }

    /// Adds `rule` to the set: a request passes only if every rule allows
    /// it. The methods that follow, up to the next `and`, say whose budget
    /// it charges and its name (until named, `http_2`, `http_3`, ...; a
    /// global budget until keyed).
    pub fn and(self, rule: Rule) -> Middleware<R> {
        self.with(|limit| limit.and(rule))
    }

    /// The rule's name: its budgets' keys are `limiter:<name>` plus the
    /// subject, the rate-limit headers and metrics name it so, and
    /// overrides and [`reset_named`](crate::RateLimiter::reset_named)
    /// address it by it.
    ///
    /// # Panics
    ///
    /// If another rule of the set has this name (a programming error,
    /// caught at start-up).
    pub fn name(mut self, name: &'static str) -> Middleware<R> {
        let rules = &self.limit.rules;
        assert!(
            !rules[..rules.len() - 1]
                .iter()
                .any(|rule| rule.name == name),
            "two rules of one middleware are named `{name}`: each rule needs a name of its own"
        );
        let cost = rules[rules.len() - 1].cost;
        register_as(&mut self.limit, name, cost);
        self.with_rule(|rule| rule.name(name))
    }

    /// The rule's name: [`name`](Self::name).
    #[deprecated(
        since = "0.1.1",
        note = "renamed `name`: a rule's identity is its name"
    )]
    pub fn key(self, name: &'static str) -> Middleware<R> {
        self.name(name)
    }

    /// A budget per client address (see [`HttpOptions`] for proxies and
    /// IPv6).
    pub fn by_ip(self) -> Middleware<R> {
        self.with_rule(|rule| rule.by = Subject::Ip)
    }

    /// A budget per value of a request header (requests without it share
    /// one).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, caught at
    /// start-up).
    pub fn by_header(self, name: &str) -> Middleware<R> {
        self.with_rule(|rule| rule.by_header(name))
    }

    /// A budget per key your closure computes from the request; `None`
    /// lets the request through unlimited by this rule.
    pub fn by_key(
        self,
        key: impl Fn(&R) -> Option<String> + Send + Sync + 'static,
    ) -> Middleware<R> {
        self.with_rule(|rule| rule.by = Subject::Key(Arc::new(key)))
    }

    /// Units one request takes (default 1).
    ///
    /// # Panics
    ///
    /// If `cost` is 0 or over what the rule holds (its `count`, or `burst`
    /// for `token_bucket` and `gcra`): no request could pass (a programming
    /// error, caught at start-up).
    pub fn cost(mut self, cost: u64) -> Middleware<R> {
        let last = self.limit.rules.last().expect("a middleware has a rule");
        last.check_cost(cost);
        let name = last.name;
        register_as(&mut self.limit, name, cost);
        self.with_rule(|rule| rule.cost = cost)
    }

    /// Requests whose subject is `subject` are not limited by the rule: an
    /// allow-list. The subject is the client's address for
    /// [`by_ip`](Self::by_ip) (`"10.0.0.1"`, `"2001:db8::1"`: the address,
    /// not the IPv6 prefix its budget is kept under), the header's value
    /// for [`by_header`](Self::by_header), the closure's key for
    /// [`by_key`](Self::by_key), each as the request has it, however long.
    pub fn exempt_key(self, subject: impl Into<String>) -> Middleware<R> {
        let subject = subject.into();
        self.with_rule(|rule| rule.exempt_subject(subject))
    }

    /// Rules chosen per request: `pick` names a tier of `tiers` (a plan
    /// from an API key, a header), whose rules then decide in the rule's
    /// place, each under its own name; `None`, or a name not in the table,
    /// leaves the rule. The subject (`by_ip`, `by_header`, `by_key`) is the
    /// rule's; the set's other rules (a global one) apply to every tier.
    pub fn tiers(
        self,
        tiers: Tiers,
        pick: impl Fn(&R) -> Option<String> + Send + Sync + 'static,
    ) -> Middleware<R> {
        self.with_rule(|rule| rule.tiers = Some((tiers, Arc::new(pick))))
    }

    /// What to do when the backend fails (default: the limiter's setting),
    /// for every rule.
    pub fn on_error(self, on_error: OnError) -> Middleware<R> {
        self.with(|limit| limit.on_error = Some(on_error))
    }

    /// Give a request's units back when its response's status makes
    /// `refund_if` say so: `.refund_if(|status| status >= 500)` counts no
    /// request that failed on the server's side. An inner service failing
    /// with an error has the error's status (actix-web: its response's;
    /// tower, which answers no response then: 500).
    pub fn refund_if(
        self,
        refund_if: impl Fn(u16) -> bool + Send + Sync + 'static,
    ) -> Middleware<R> {
        self.with(|limit| limit.refund_if = Some(Arc::new(refund_if)))
    }

    /// Requests for the path `prefix` or below it are not limited, by whole
    /// segments: `"/health"` exempts `/health` and `/health/db`, not
    /// `/healthz` or `/health-admin`. A prefix ending in `/` exempts what
    /// starts with it.
    pub fn exempt_path(self, prefix: impl Into<String>) -> Middleware<R> {
        let prefix = prefix.into();
        self.with(|limit| limit.exempt_path_prefix(prefix))
    }
}
