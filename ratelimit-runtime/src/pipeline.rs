//! The one decision path. Every entry point (the code `#[rate_limit]`
//! generates, the actix-web middleware, any other adapter) checks a call
//! here: the rule in force (overrides), the limiter (named, the app's or the
//! global one), the failure policy, shadow mode, metrics and tracing are
//! applied in this module and nowhere else. What comes out is a [`Pass`]
//! (the permit to hold while the call runs, and the numbers for rate-limit
//! headers) or a [`RateLimited`].
//!
//! ```
//! use std::time::Duration;
//! use ratelimit_runtime::pipeline::{self, Site};
//! use ratelimit_runtime::{RateLimiter, Rule};
//!
//! static EXPORTS: Site = Site::new(
//!     "exports",
//!     Rule::fixed_window(1, Duration::from_secs(60)),
//!     1,
//!     None,
//!     None,
//!     false,
//! );
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let limiter = RateLimiter::in_memory();
//! let pass = pipeline::check_on(&EXPORTS, Some(&limiter), "limiter:exports").await.unwrap();
//! assert_eq!(pass.report().remaining, 0);
//! let refused = pipeline::check_on(&EXPORTS, Some(&limiter), "limiter:exports").await;
//! assert!(refused.is_err());
//! # }
//! ```

use std::sync::OnceLock;
use std::time::Duration;

use crate::{Decision, Error, OnError, Permit, RateLimited, RateLimiter, Rule};

/// Every `#[rate_limit]` rule of the program (gathered by the linker), so
/// overrides can be checked against their names at start-up.
#[linkme::distributed_slice]
pub static SITES: [&'static Site];

/// One rule where it is applied: a `#[rate_limit]` call site (a `static`
/// per site) or a middleware's rule. It keeps what every check of the rule
/// shares: its name, rule and options, the named limiter once looked up,
/// and its metrics handles.
#[derive(Debug)]
pub struct Site {
    name: &'static str,
    rule: Rule,
    cost: u64,
    limiter: Option<&'static str>,
    on_error: Option<OnError>,
    shadow: bool,
    named: OnceLock<RateLimiter>,
    #[cfg(feature = "metrics")]
    counters: OnceLock<[::metrics::Counter; 5]>,
}

impl Site {
    /// A rule and its options: `name` (the `key` as written, which overrides
    /// and headers name it by), the units one call takes, the limiter
    /// installed under `limiter` (else the caller's or the global one), the
    /// failure policy (else the limiter's), and shadow mode.
    pub const fn new(
        name: &'static str,
        rule: Rule,
        cost: u64,
        limiter: Option<&'static str>,
        on_error: Option<OnError>,
        shadow: bool,
    ) -> Site {
        Site {
            name,
            rule,
            cost,
            limiter,
            on_error,
            shadow,
            named: OnceLock::new(),
            #[cfg(feature = "metrics")]
            counters: OnceLock::new(),
        }
    }

    /// The rule's name (its `key` as written).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The rule as written.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The units one call takes.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The name of the limiter this rule must use, if it names one.
    pub fn limiter_name(&self) -> Option<&'static str> {
        self.limiter
    }

    /// The rule in force: an override's, if one is set for this name.
    pub fn rule_in_force(&self) -> Rule {
        crate::overrides::effective(self.name, &self.rule, false).map_or(self.rule, |(r, _)| r)
    }

    /// The limiter this rule uses when the caller has none of its own: the
    /// named one (`None` if it is not installed), else the global one.
    pub fn limiter(&self) -> Option<&RateLimiter> {
        match self.limiter {
            None => Some(RateLimiter::global()),
            Some(name) => {
                if let Some(limiter) = self.named.get() {
                    return Some(limiter);
                }
                let limiter = RateLimiter::named(name)?;
                Some(self.named.get_or_init(|| limiter))
            }
        }
    }

    /// The refusal of a per-client rule whose client cannot be told.
    pub fn unknown_client(&self) -> RateLimited {
        self.record(Outcome::Limited);
        RateLimited::unknown_client(self.rule.count()).with_rule(self.rule.period(), self.name)
    }

    /// Counts one outcome of this rule (`ratelimit_calls_total{rule, outcome}`
    /// with the `metrics` feature; nothing without it).
    fn record(&self, outcome: Outcome) {
        #[cfg(feature = "metrics")]
        {
            let counters = self.counters.get_or_init(|| {
                Outcome::ALL.map(|o| {
                    ::metrics::counter!("ratelimit_calls_total", "rule" => self.name, "outcome" => o.label())
                })
            });
            counters[outcome as usize].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = outcome;
    }
}

/// What happened to a call, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Allowed,
    Limited,
    ShadowLimited,
    BackendError,
    LocalFallback,
}

impl Outcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Outcome; 5] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::BackendError,
        Outcome::LocalFallback,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::BackendError => "backend_error",
            Outcome::LocalFallback => "local_fallback",
        }
    }
}

/// One rule's state after a call, for rate-limit headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    /// The rule's name.
    pub name: &'static str,
    /// Units allowed per period.
    pub limit: u64,
    /// The rule's window.
    pub period: Duration,
    /// Units left.
    pub remaining: u64,
    /// When the budget is whole again.
    pub reset_after: Duration,
}

impl Report {
    /// The report of a rule in force and its decision.
    pub fn new(name: &'static str, rule: &Rule, decision: &Decision) -> Report {
        Report {
            name,
            limit: decision.limit,
            period: rule.period(),
            remaining: decision.remaining,
            reset_after: decision.reset_after,
        }
    }

    /// The report of the rule that refused a call.
    pub fn from_refusal(limited: &RateLimited) -> Report {
        Report {
            name: limited.policy,
            limit: limited.limit,
            period: limited.period,
            remaining: limited.remaining,
            reset_after: limited.reset_after,
        }
    }
}

/// A call that may go on: hold it while the call runs (a `concurrency`
/// rule's lease is released when it drops).
#[derive(Debug)]
#[must_use = "dropping the pass releases its lease at once"]
pub struct Pass {
    permit: Permit,
    report: Report,
}

impl Pass {
    /// The limiter's permit.
    pub fn permit(&self) -> &Permit {
        &self.permit
    }

    /// The rule's state after this call, for headers. Under shadow mode a
    /// call the rule would have refused passes, and this says so (0 left).
    pub fn report(&self) -> &Report {
        &self.report
    }
}

/// Checks one call under `site` with the site's limiter ([`Site::limiter`]):
/// the attribute on a plain async fn.
pub async fn check(site: &Site, key: &str) -> Result<Pass, RateLimited> {
    check_on(site, site.limiter(), key).await
}

/// Checks one call under `site` with `limiter` (`None`: the site names a
/// limiter that is not installed, which is handled as a backend failure).
pub async fn check_on(
    site: &Site,
    limiter: Option<&RateLimiter>,
    key: &str,
) -> Result<Pass, RateLimited> {
    let Some(limiter) = limiter else {
        return missing_limiter(site, key).await;
    };
    let shadow = site.shadow || limiter.is_shadow();
    let (rule, shadow) =
        crate::overrides::effective(site.name, &site.rule, shadow).unwrap_or((site.rule, shadow));
    let on_error = site.on_error.unwrap_or(limiter.on_backend_error());
    let answer = limiter.acquire_with(&rule, key, site.cost, on_error).await;
    conclude(site, &rule, shadow, key, answer)
}

/// The call's fate once the limiter has answered: counted, logged, and
/// turned into a pass or a refusal (shadow rules only log theirs).
fn conclude(
    site: &Site,
    rule: &Rule,
    shadow: bool,
    key: &str,
    answer: Result<Permit, Error>,
) -> Result<Pass, RateLimited> {
    let permit = match answer {
        Ok(permit) => permit,
        Err(Error::Backend(_)) => {
            site.record(Outcome::BackendError);
            let refused = RateLimited::backend_unavailable(rule.count());
            if shadow {
                let permit = Permit::allowed_unchecked(rule);
                return Ok(pass(site, rule, permit));
            }
            tracing::debug!(rule = site.name, key, %refused, "rate limited");
            return Err(refused);
        }
        // Costs are checked when the code is compiled (and overrides
        // against them when set); anything else is a bug of ours: let the
        // call through rather than fail it.
        Err(error) => {
            tracing::error!(%error, key, "rate limiter failed; letting the call through");
            return Ok(pass(site, rule, Permit::allowed_unchecked(rule)));
        }
    };
    if permit.local {
        site.record(Outcome::LocalFallback);
    }
    if permit.unchecked {
        site.record(Outcome::BackendError);
    }
    let decision = *permit.decision();
    if decision.allowed {
        site.record(Outcome::Allowed);
        tracing::debug!(
            rule = site.name,
            key,
            remaining = decision.remaining,
            "allowed"
        );
        return Ok(pass(site, rule, permit));
    }
    let refused = RateLimited::from_decision(&decision).with_rule(rule.period(), site.name);
    if shadow {
        site.record(Outcome::ShadowLimited);
        tracing::info!(rule = site.name, key, %refused, "shadow rate limit exceeded; call allowed");
        return Ok(pass(site, rule, permit));
    }
    site.record(Outcome::Limited);
    tracing::debug!(rule = site.name, key, %refused, "rate limited");
    Err(refused)
}

fn pass(site: &Site, rule: &Rule, permit: Permit) -> Pass {
    let report = Report::new(site.name, rule, permit.decision());
    Pass { permit, report }
}

/// `limiter = "name"` with no limiter installed under that name: handled
/// like a backend failure (the in-memory default answers for `local`).
async fn missing_limiter(site: &Site, key: &str) -> Result<Pass, RateLimited> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static FALLBACK: OnceLock<RateLimiter> = OnceLock::new();
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(
            limiter = site.limiter,
            "no rate limiter installed under this name (RateLimiter::install_as); \
             applying the rule's failure policy"
        );
    }
    let rule = &site.rule;
    match site.on_error.unwrap_or_default() {
        OnError::Local => {
            let limiter = FALLBACK.get_or_init(RateLimiter::in_memory);
            let answer = limiter
                .acquire_with(rule, key, site.cost, OnError::Local)
                .await;
            conclude(site, rule, site.shadow, key, answer)
        }
        OnError::Allow => {
            site.record(Outcome::BackendError);
            Ok(pass(site, rule, Permit::allowed_unchecked(rule)))
        }
        OnError::Deny => {
            let answer = Err(Error::backend(MissingLimiter));
            conclude(site, rule, site.shadow, key, answer)
        }
    }
}

/// The limiter a rule names is not installed.
#[derive(Debug)]
struct MissingLimiter;

impl std::fmt::Display for MissingLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no rate limiter is installed under the name the rule gives")
    }
}

impl std::error::Error for MissingLimiter {}

/// How a fn's return type reports a refusal when the attribute has no
/// `fallback`.
#[diagnostic::on_unimplemented(
    message = "`#[rate_limit]` cannot report a rejection through `{Self}`",
    label = "this return type cannot carry a `RateLimited`",
    note = "choose one: add `fallback = path` to the attribute, \
            return `Result<_, E>` where `E: From<RateLimited>`, \
            or make the fn an actix-web handler"
)]
pub trait Reject: Sized {
    /// The value the fn returns for this refusal.
    fn reject(limited: RateLimited) -> Self;
}

// Not recommended in diagnostics: a `Result` whose error type lacks
// `From<RateLimited>` then gets the message above, which says what to do.
#[diagnostic::do_not_recommend]
impl<T, E: From<RateLimited>> Reject for Result<T, E> {
    fn reject(limited: RateLimited) -> Self {
        Err(E::from(limited))
    }
}

/// The value a fn returns for a refusal, by its return type.
pub fn reject<R: Reject>(limited: RateLimited) -> R {
    R::reject(limited)
}
