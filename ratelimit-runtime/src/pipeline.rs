//! The one decision path. Every entry point (the code `#[rate_limit]`
//! generates, the actix-web middleware, any other adapter) checks a call
//! here: the rule in force (overrides), the limiter (named, the app's or the
//! global one), the failure policy, shadow mode, metrics and tracing are
//! applied in this module and nowhere else. What comes out is a [`Pass`]
//! (the permit to hold while the call runs, and the numbers for rate-limit
//! headers) or a [`RateLimited`].

use std::sync::OnceLock;
use std::time::Duration;

use crate::decision::{Decision, RateLimited};
use crate::error::{Error, OnError};
use crate::limiter::{Permit, RateLimiter};
use crate::rule::Rule;
use crate::site::{Event, Site};

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
            name: limited.name,
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

/// Checks one call under `site` with the site's limiter (`Site::limiter`):
/// the attribute on a plain async fn.
pub async fn check(site: &Site, key: &str) -> Result<Pass, RateLimited> {
    check_on(site, site.limiter(), key).await
}

/// Checks one call under `site` with `limiter` (`None`: the site names a
/// limiter that is not installed, which is handled as a backend failure).
pub(crate) async fn check_on(
    site: &Site,
    limiter: Option<&RateLimiter>,
    key: &str,
) -> Result<Pass, RateLimited> {
    let Some(limiter) = limiter else {
        return missing_limiter(site, key).await;
    };
    let (rule, shadow) = in_force(site, limiter);
    let on_error = site.on_error.unwrap_or(limiter.on_backend_error());
    let answer = match site.wait {
        // A call that may wait its turn (`wait`), where the rule in force
        // keeps turns; in shadow mode calls never wait. Boxed, so the
        // futures of the calls that do not wait stay small.
        Some(wait) if !shadow && crate::algorithm::spec(rule.algorithm()).wait.is_some() => {
            let jitter = std::time::Duration::ZERO;
            let cost = site.cost;
            match Box::pin(limiter.wait_turn(
                &rule,
                key,
                cost,
                wait,
                jitter,
                on_error,
                Some(site.name),
            ))
            .await
            {
                // The store keeps no turns (a custom backend): the call is
                // checked without waiting, as in shadow mode.
                Err(Error::Unsupported(_)) => {
                    cannot_wait(site, limiter);
                    limiter.acquire_with(&rule, key, site.cost, on_error).await
                }
                answer => answer,
            }
        }
        _ => limiter.acquire_with(&rule, key, site.cost, on_error).await,
    };
    conclude(site, &rule, shadow, key, answer)
}

/// Says once per process that a rule's `wait` is not kept, because the
/// limiter's store (a custom backend) cannot reserve a turn; its calls are
/// checked without waiting.
fn cannot_wait(site: &Site, limiter: &RateLimiter) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            rule = site.name,
            backend = limiter.backend_name(),
            "this limiter's backend cannot reserve a turn, so `wait` is not kept: calls are \
             checked without waiting (one over the limit is refused); logged once"
        );
    }
}

/// [`check_on`] answered without waiting, when `limiter` keeps its budgets
/// in process memory; `None` when its store must be awaited (nothing is
/// checked or recorded then).
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
pub(crate) fn check_now(
    site: &Site,
    limiter: &RateLimiter,
    key: &str,
) -> Option<Result<Pass, RateLimited>> {
    if site.wait.is_some() {
        return None;
    }
    let (rule, shadow) = in_force(site, limiter);
    let on_error = site.on_error.unwrap_or(limiter.on_backend_error());
    let answer = limiter.acquire_now(&rule, key, site.cost, on_error)?;
    Some(conclude(site, &rule, shadow, key, answer))
}

/// The rule in force at `site` (overrides applied) and whether it is in
/// shadow mode on `limiter`.
/// Overrides that no call of the site's cost could pass (left when a
/// source above them was cleared) give way to the rule as written: a call
/// is never let through unchecked for them.
fn in_force(site: &Site, limiter: &RateLimiter) -> (Rule, bool) {
    let shadow = site.shadow || limiter.is_shadow();
    match crate::registry::effective(site.name, &site.rule, shadow) {
        Some((rule, shadow)) if rule.capacity() >= site.cost => (rule, shadow),
        Some((_, shadow)) => (site.rule, shadow),
        None => (site.rule, shadow),
    }
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
            site.record(Event::BackendError);
            if shadow {
                site.record(Event::Allowed);
                let permit = Permit::allowed_unchecked(rule);
                return Ok(pass(site, rule, permit));
            }
            site.record(Event::Limited);
            let refused =
                RateLimited::backend_unavailable(rule.count()).with_rule(rule.period(), site.name);
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
        site.record(Event::LocalFallback);
    }
    if permit.unchecked {
        site.record(Event::BackendError);
    }
    let decision = *permit.decision();
    if decision.allowed {
        site.record(Event::Allowed);
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
        site.record(Event::ShadowLimited);
        // A rule in shadow may refuse every call: a line now and then, with
        // how many it held back (the counter has them all).
        if let Some(unlogged) = site.log_shadow_refusal() {
            tracing::info!(
                rule = site.name,
                key,
                %refused,
                unlogged,
                "shadow rate limit exceeded; call allowed (at most one line per rule per 10 s; \
                 `unlogged`: those since the last line)"
            );
        }
        return Ok(pass(site, rule, permit));
    }
    site.record(Event::Limited);
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
            site.record(Event::BackendError);
            site.record(Event::Allowed);
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
            or make the fn an HTTP handler returning `impl Responder` (actix-web) or `impl IntoResponse` (axum)"
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

/// Checks one call under several rules at once, all or nothing, with the
/// first site's limiter (`Site::limiter`): stacked attributes on a plain
/// async fn. See `check_all_on`.
///
/// # Errors
///
/// The place of the rule that refused the call, and its refusal.
pub async fn check_all(
    sites: &[(&Site, &str)],
    seen: &mut [Option<Report>],
) -> Result<Vec<Pass>, (usize, RateLimited)> {
    let limiter = sites.first().and_then(|(site, _)| site.limiter());
    check_all_on(sites, limiter, seen).await
}

/// Checks one call under the rules of `sites` (each with the key of its
/// budget) with `limiter`, all or nothing: the call passes only if every
/// rule allows it, and then takes from each; if one refuses, none is
/// charged, and the refusal is of the refusing rule with the longest
/// `retry_after`. Rules in shadow mode are checked on their own once the
/// others passed (they never refuse). The set's failure policy is the
/// strictest of its rules' (`deny`, then `local`, then `allow`). `seen`,
/// when not empty, gets each rule's report, for headers (a refused call's
/// rules report what they have left; the refusing rule's is left `None`).
///
/// # Errors
///
/// The place of the rule that refused the call, and its refusal.
pub(crate) async fn check_all_on(
    sites: &[(&Site, &str)],
    limiter: Option<&RateLimiter>,
    seen: &mut [Option<Report>],
) -> Result<Vec<Pass>, (usize, RateLimited)> {
    let Some(limiter) = limiter else {
        // No limiter under the name the rules give: each as one rule.
        let mut passes = Vec::with_capacity(sites.len());
        for (i, (site, key)) in sites.iter().enumerate() {
            let pass = missing_limiter(site, key).await.map_err(|l| (i, l))?;
            note(seen, i, &pass);
            passes.push(pass);
        }
        return Ok(passes);
    };
    // Each rule in force, whether it is in shadow mode, and its cost.
    let rules: Vec<(Rule, bool)> = sites
        .iter()
        .map(|(site, _)| {
            let shadow = site.shadow || limiter.is_shadow();
            crate::registry::effective(site.name, &site.rule, shadow).unwrap_or((site.rule, shadow))
        })
        .collect();
    let enforced: Vec<usize> = (0..sites.len()).filter(|&i| !rules[i].1).collect();
    let on_error = sites
        .iter()
        .map(|(site, _)| site.on_error.unwrap_or(limiter.on_backend_error()))
        .min_by_key(|policy| match policy {
            OnError::Deny => 0,
            OnError::Local => 1,
            OnError::Allow => 2,
        })
        .unwrap_or(limiter.on_backend_error());
    let set: Vec<(&Rule, &str, u64)> = enforced
        .iter()
        .map(|&i| (&rules[i].0, sites[i].1, sites[i].0.cost))
        .collect();
    let mut passes: Vec<Option<Pass>> = (0..sites.len()).map(|_| None).collect();
    match limiter.acquire_all_with(&set, on_error).await {
        Ok(permits) => {
            let refused = permits.refused();
            let permits = permits.into_permits();
            for (at, permit) in permits.iter().enumerate() {
                let site = sites[enforced[at]].0;
                if permit.local {
                    site.record(Event::LocalFallback);
                }
                if permit.unchecked {
                    site.record(Event::BackendError);
                }
            }
            if let Some(r) = refused {
                let i = enforced[r];
                let (site, key) = sites[i];
                let rule = &rules[i].0;
                site.record(Event::Limited);
                let refused = RateLimited::from_decision(permits[r].decision())
                    .with_rule(rule.period(), site.name);
                tracing::debug!(rule = site.name, key, %refused, "rate limited");
                for (at, permit) in permits.iter().enumerate() {
                    let j = enforced[at];
                    if j != i && j < seen.len() {
                        let report = Report::new(sites[j].0.name, &rules[j].0, permit.decision());
                        seen[j] = Some(report);
                    }
                }
                return Err((i, refused));
            }
            for (at, permit) in permits.into_iter().enumerate() {
                let i = enforced[at];
                let site = sites[i].0;
                site.record(Event::Allowed);
                passes[i] = Some(pass(site, &rules[i].0, permit));
            }
        }
        Err(Error::Backend(_)) => {
            let i = enforced.first().copied().unwrap_or(0);
            for &j in &enforced {
                sites[j].0.record(Event::BackendError);
            }
            sites[i].0.record(Event::Limited);
            let refused = RateLimited::backend_unavailable(rules[i].0.count())
                .with_rule(rules[i].0.period(), sites[i].0.name);
            tracing::debug!(rule = sites[i].0.name, %refused, "rate limited");
            return Err((i, refused));
        }
        Err(error) => {
            // As for one rule: a bug of ours lets the call through.
            tracing::error!(%error, "rate limiter failed; letting the call through");
            for &i in &enforced {
                let rule = &rules[i].0;
                passes[i] = Some(pass(sites[i].0, rule, Permit::allowed_unchecked(rule)));
            }
        }
    }
    // Rules in shadow mode, now that the others passed. What the others
    // took is given back if the caller goes away meanwhile: its body never
    // runs.
    if rules.iter().any(|&(_, shadow)| shadow) {
        let mut taken = Untaken {
            limiter: limiter.clone(),
            charges: passes
                .iter()
                .enumerate()
                .filter_map(|(i, pass)| {
                    let charge = pass.as_ref()?.permit().charge()?;
                    Some((rules[i].0, sites[i].1.to_owned(), charge))
                })
                .collect(),
        };
        for (i, (site, key)) in sites.iter().enumerate() {
            if rules[i].1 {
                let (rule, shadow) = rules[i];
                let on_error = site.on_error.unwrap_or(limiter.on_backend_error());
                let answer = limiter.acquire_with(&rule, key, site.cost, on_error).await;
                passes[i] = Some(conclude(site, &rule, shadow, key, answer).map_err(|l| (i, l))?);
            }
        }
        taken.charges.clear();
    }
    let passes: Vec<Pass> = passes.into_iter().flatten().collect();
    for (i, pass) in passes.iter().enumerate() {
        note(seen, i, pass);
    }
    Ok(passes)
}

/// The charges of a set's enforced rules, given back when dropped unless
/// cleared: the set's caller went away before it was decided.
struct Untaken {
    limiter: RateLimiter,
    charges: Vec<(Rule, String, crate::decision::Charge)>,
}

impl Drop for Untaken {
    fn drop(&mut self) {
        if self.charges.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (limiter, charges) = (self.limiter.clone(), std::mem::take(&mut self.charges));
        runtime.spawn(async move {
            for (rule, key, charge) in charges {
                if let Err(error) = limiter.refund(&rule, &key, charge).await {
                    tracing::debug!(%error, "could not give back a set's charge");
                }
            }
        });
    }
}

/// Keeps a pass's report for headers.
fn note(seen: &mut [Option<Report>], i: usize, pass: &Pass) {
    if let Some(slot) = seen.get_mut(i) {
        *slot = Some(pass.report);
    }
}
