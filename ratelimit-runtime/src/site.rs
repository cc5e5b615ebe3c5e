//! [`Site`]: one rule where it is applied (a `#[rate_limit]` call site or a
//! middleware's rule).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::decision::RateLimited;
use crate::error::OnError;
use crate::keys;
use crate::limiter::RateLimiter;
use crate::log_gate::{LogGate, process_millis};
use crate::rule::Rule;

/// One rule where it is applied: a `#[rate_limit]` call site (a `static`
/// per site) or a middleware's rule. It keeps what every check of the rule
/// shares: its name, rule and options, where its keys are, the named
/// limiter once looked up, and its metrics handles.
///
/// Made by `#[rate_limit]`'s expansion: `Site::new(name, rule)` and the
/// `with_*` options it was written with.
#[derive(Debug)]
pub struct Site {
    /// The rule's name: its `key` as written (or the fn's name).
    pub(crate) name: &'static str,
    pub(crate) rule: Rule,
    pub(crate) cost: u64,
    pub(crate) limiter: Option<&'static str>,
    pub(crate) on_error: Option<OnError>,
    pub(crate) shadow: bool,
    /// How long a call may wait its turn (`wait`): `None`, refused at once.
    pub(crate) wait: Option<std::time::Duration>,
    /// Its keys' prefix.
    pub(crate) prefix: &'static str,
    /// Its name as its keys hold it, when that is not `name` (a fn
    /// without `key`: its module path and name).
    pub(crate) keyed_as: Option<&'static str>,
    named: OnceLock<RateLimiter>,
    /// Whether it said it counts apart from the apps' limiters.
    said_apart: AtomicBool,
    /// How often its shadow refusals are logged.
    shadow_log: LogGate,
    #[cfg(feature = "metrics")]
    counters: OnceLock<[::metrics::Counter; 5]>,
}

impl Site {
    /// The rule `rule` named `name`: one unit a call, the caller's or the
    /// global limiter, its failure policy, not in shadow mode, keys under
    /// the default prefix.
    pub const fn new(name: &'static str, rule: Rule) -> Site {
        Site {
            name,
            rule,
            cost: 1,
            limiter: None,
            on_error: None,
            shadow: false,
            wait: None,
            prefix: keys::DEFAULT_PREFIX,
            keyed_as: None,
            named: OnceLock::new(),
            said_apart: AtomicBool::new(false),
            shadow_log: LogGate::new(),
            #[cfg(feature = "metrics")]
            counters: OnceLock::new(),
        }
    }

    /// The units one call takes.
    pub const fn with_cost(mut self, cost: u64) -> Site {
        self.cost = cost;
        self
    }

    /// The limiter installed under `name`, instead of the caller's or the
    /// global one.
    pub const fn with_limiter(mut self, name: &'static str) -> Site {
        self.limiter = Some(name);
        self
    }

    /// A call over the limit waits its turn for up to `wait`, then runs
    /// (see [`RateLimiter::until_ready`]); one that cannot go within it is
    /// refused at once. Only `gcra` and `token_bucket` rules wait; in shadow
    /// mode, calls are checked as without it.
    pub const fn with_wait(mut self, wait: std::time::Duration) -> Site {
        self.wait = Some(wait);
        self
    }

    /// The failure policy, instead of the limiter's.
    pub const fn with_on_error(mut self, on_error: OnError) -> Site {
        self.on_error = Some(on_error);
        self
    }

    /// Shadow mode: checked and recorded, never refusing.
    pub const fn with_shadow(mut self, shadow: bool) -> Site {
        self.shadow = shadow;
        self
    }

    /// Its keys' prefix, instead of the default.
    pub const fn with_prefix(mut self, prefix: &'static str) -> Site {
        self.prefix = prefix;
        self
    }

    /// Its name as its keys hold it, when that is not its name.
    pub const fn keyed_as(mut self, name: &'static str) -> Site {
        self.keyed_as = Some(name);
        self
    }

    /// The limiter this rule uses when the caller has none of its own: the
    /// named one (`None` if it is not installed), else the global one.
    pub(crate) fn limiter(&self) -> Option<&RateLimiter> {
        match self.limiter {
            None => {
                let global = RateLimiter::global();
                if RateLimiter::defaulted_beside_app_limiters() {
                    self.say_apart();
                }
                Some(global)
            }
            Some(name) => {
                if let Some(limiter) = self.named.get() {
                    return Some(limiter);
                }
                let limiter = RateLimiter::named(name)?;
                Some(self.named.get_or_init(|| limiter))
            }
        }
    }

    /// Warns, once, that this rule counts in the in-memory default limiter
    /// while HTTP handlers count in their apps' own: it is on a fn that is
    /// not an HTTP handler for `#[rate_limit]`, so it never sees the app's
    /// limiter, and each instance counts it apart.
    #[cold]
    fn say_apart(&self) {
        if self.said_apart.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            rule = self.name,
            "rule checked in this process's in-memory default limiter, while HTTP \
             handlers use their app's own limiter: its fn is not an HTTP handler for \
             `#[rate_limit]` (no `by = ip` or `by = header(..)` rule, no `impl Responder` \
             or `impl IntoResponse` return), so it cannot see the app's limiter. Take an \
             `HttpCall` parameter to make it one, install the limiter with \
             `RateLimiter::install()`, or name it with `limiter = \"..\"`"
        );
    }

    /// The refusal of a per-client rule whose client cannot be told.
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn unknown_client(&self) -> RateLimited {
        self.record(Event::Limited);
        RateLimited::unknown_client(self.rule.count()).with_rule(self.rule.period(), self.name)
    }

    /// The refusal of a call whose key needs what the limiter lacks (a key
    /// secret for a shared store): `error` is logged, rate limited.
    pub fn misconfigured(&self, error: &crate::error::Error) -> RateLimited {
        self.record(Event::Limited);
        crate::secret::log_missing(error, self.name);
        RateLimited::misconfigured(self.rule.count()).with_rule(self.rule.period(), self.name)
    }

    /// Whether to log this shadow refusal: the first, then at most one
    /// every [`LogGate::EVERY_MS`]; `Some(n)` with the `n` left unlogged
    /// since the last line. (The counter `shadow_limited` counts them all.)
    pub(crate) fn log_shadow_refusal(&self) -> Option<u64> {
        self.shadow_log.admit(process_millis())
    }

    /// Counts one event of this rule (`ratelimit_calls_total{rule, outcome}`
    /// with the `metrics` feature; nothing without it).
    pub(crate) fn record(&self, event: Event) {
        #[cfg(feature = "metrics")]
        {
            let counters = self.counters.get_or_init(|| {
                Event::ALL.map(|e| {
                    ::metrics::counter!("ratelimit_calls_total", "rule" => self.name, "outcome" => e.label())
                })
            });
            counters[event as usize].increment(1);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = event;
    }
}

/// What happened to a call, for the counters (their `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    Allowed,
    Limited,
    ShadowLimited,
    BackendError,
    LocalFallback,
}

impl Event {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Event; 5] = [
        Event::Allowed,
        Event::Limited,
        Event::ShadowLimited,
        Event::BackendError,
        Event::LocalFallback,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Event::Allowed => "allowed",
            Event::Limited => "limited",
            Event::ShadowLimited => "shadow_limited",
            Event::BackendError => "backend_error",
            Event::LocalFallback => "local_fallback",
        }
    }
}
