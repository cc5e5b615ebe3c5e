//! Parse and validate `#[rate_limit(...)]`: raw tokens in, a checked
//! [`Config`] out, with every mistake reported at once, each at its token.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, ExprPath, FnArg, Ident, ItemFn, Lit, Pat, ReturnType, Type};

pub(crate) use crate::key::{Part, Subject};
use crate::key::{key_template, subject};
use crate::options::*;

/// The rule's numbers, inline or a `const Rule` of the user's.
pub(crate) enum RuleSource {
    Inline {
        variant: &'static str,
        count: u64,
        period_ms: u64,
        burst: Option<u64>,
    },
    Const(syn::Path),
}

/// One checked `#[rate_limit(...)]`.
pub(crate) struct RuleConfig {
    pub(crate) key: Vec<Part>,
    pub(crate) subject: Subject,
    pub(crate) rule: RuleSource,
    pub(crate) cost: u64,
    pub(crate) cost_span: Span,
    /// The rule's name (in overrides, rate-limit headers, metrics): its
    /// `key` as written, else the fn's name.
    pub(crate) name: String,
    /// `prefix`, if written (else the runtime's default).
    pub(crate) prefix: Option<String>,
    /// The name as keys hold it, when that is not `name` (a fn without
    /// `key`: its module path and name).
    pub(crate) keyed_as: Option<Vec<Part>>,
    pub(crate) fallback: Option<syn::Path>,
    pub(crate) on_error: Option<&'static str>,
    pub(crate) limiter: Option<String>,
    pub(crate) shadow: bool,
    /// `wait`: how long a call may wait its turn (ms), and its value's
    /// tokens (to report at).
    pub(crate) wait: Option<(u64, Expr)>,
    /// `local_quota = N`: the largest block, and the span of its value.
    pub(crate) local_quota: Option<(u64, Span)>,
    /// `subject_limits`: the rule reads subjects' own limits.
    pub(crate) subject_limits: bool,
}

/// How the generated code reaches the request's [`HttpCall`] (an extractor
/// in every framework the runtime adapts).
pub(crate) enum Request {
    /// A parameter of the fn's own.
    Param(Ident),
    /// A parameter the expansion adds first (`__ratelimit_call`): before a
    /// body extractor, which axum wants last.
    Injected,
}

/// What makes a fn an HTTP handler: the token to report at, and in words.
pub(crate) struct Handler {
    pub(crate) span: Span,
    pub(crate) why: String,
}

/// A checked fn with one or more rules: codegen cannot get any of it wrong.
pub(crate) struct Config {
    pub(crate) krate: syn::Path,
    pub(crate) rules: Vec<RuleConfig>,
    pub(crate) request: Option<Request>,
    /// An HTTP handler whose response the expansion builds: a rule charges
    /// a client's budget, it returns `impl Responder`/`impl IntoResponse`,
    /// or it takes an `HttpCall`.
    /// It then returns `Reply<..>`, with rate-limit headers on allowed
    /// responses too.
    pub(crate) responder: bool,
    /// The fn's return type when the expansion replaces it (to type the body).
    pub(crate) original_output: Option<Type>,
    /// Why the fn is an HTTP handler (when `responder`).
    pub(crate) handler: Option<Handler>,
}

impl Config {
    /// Parses the attribute's arguments, and those of any `#[rate_limit]`
    /// stacked below it (removed from `func`), checked against the fn.
    pub(crate) fn parse(args: TokenStream, func: &mut ItemFn) -> syn::Result<Config> {
        let mut cx = Ctxt::default();
        let mut raws = vec![parse_raw(args, Span::call_site(), None, &mut cx)];
        for attr in take_stacked(func) {
            let tokens = match &attr.meta {
                syn::Meta::List(list) => list.tokens.clone(),
                _ => TokenStream::new(),
            };
            raws.push(parse_raw(
                tokens,
                attr.span(),
                Some(attr.to_token_stream()),
                &mut cx,
            ));
        }

        if func.sig.asyncness.is_none() {
            cx.error(
                func.sig.fn_token,
                "`#[rate_limit]` goes on an `async fn`: the limit is checked with an `.await` \
                 before the body runs; write `async fn`",
            );
        }

        let krate = raws
            .iter()
            .find_map(|raw| raw.value(CRATE))
            .and_then(|value| {
                let lit = string(value, CRATE, &mut cx)?;
                match lit.parse::<syn::Path>() {
                    Ok(path) => Some(path),
                    Err(_) => {
                        cx.error(&lit, "`crate` takes the path of the crate that re-exports `ratelimit_runtime`, e.g. `crate = \"my_crate::ratelimit\"`");
                        None
                    }
                }
            })
            .unwrap_or_else(|| syn::parse_quote!(::ratelimit_runtime));

        // An HTTP handler: a rule charges a client's budget (`by = ip`,
        // `by = header(..)`), or the fn returns `impl Responder` (actix-web)
        // or `impl IntoResponse` (axum). Nothing else about the fn (its
        // other attributes, their names) changes the expansion: the
        // framework is the one whose extractor and response traits the
        // generated types meet.
        let client_by = raws
            .iter()
            .filter_map(|raw| raw.value(BY))
            .find(|by| match by {
                // `by = arg(p)`: a value of the call's, no client's.
                Expr::Call(_) => call_name_is(by, "header"),
                _ => !is_ident(by, "global"),
            });
        let by_client = client_by.is_some();
        let mut handler = client_by.map(|by| Handler {
            span: by.span(),
            why: format!("`by = {}`", crate::fallback::render(by.to_token_stream())),
        });
        // An `HttpCall` parameter of the fn's own: a handler whatever its
        // rules and return type, so a `by = global` rule on a handler
        // returning `HttpResponse` or `Result<_, E>` sees the app's limiter.
        let call = call_param(func);
        if let Some(ident) = &call {
            handler.get_or_insert_with(|| Handler {
                span: ident.span(),
                why: "an `HttpCall` parameter".to_owned(),
            });
        }
        let takes_call = call.is_some();
        let responds = match &func.sig.output {
            ReturnType::Type(_, ty) => match &**ty {
                Type::ImplTrait(imp)
                    if crate::fallback::mentions(imp.to_token_stream(), RESPONSE_TRAITS) =>
                {
                    handler.get_or_insert_with(|| Handler {
                        span: imp.span(),
                        why: format!(
                            "returning `{}`",
                            crate::fallback::render(imp.to_token_stream())
                        ),
                    });
                    true
                }
                Type::ImplTrait(imp) if !by_client && !takes_call => {
                    cx.error_tokens(
                        imp,
                        "`#[rate_limit]` cannot report a rejection through an `impl Trait` return \
                         type; choose one: add `fallback = path` to the attribute, return \
                         `Result<_, E>` where `E: From<RateLimited>`, or make the fn an HTTP \
                         handler returning `impl Responder` (actix-web) or `impl IntoResponse` \
                         (axum)",
                    );
                    false
                }
                _ => false,
            },
            ReturnType::Default => false,
        };
        let responder = responds || by_client || takes_call;
        let original_output = match &func.sig.output {
            ReturnType::Type(_, ty) if responder && !matches!(**ty, Type::ImplTrait(_)) => {
                Some((**ty).clone())
            }
            ReturnType::Default if responder => Some(syn::parse_quote!(())),
            _ => None,
        };

        let rules: Vec<Option<RuleConfig>> = raws
            .iter()
            .map(|raw| rule_config(raw, func, &mut cx))
            .collect();

        // Two rules of one fn on one key would share (and corrupt) a budget.
        let mut seen: Vec<(String, &Subject)> = Vec::new();
        for (raw, rule) in raws.iter().zip(&rules) {
            if let Some(rule) = rule {
                let identity = key_identity(rule);
                if seen.contains(&identity) {
                    let message = "two rules of this fn use the same key: give each its own \
                                   `key` (or a different `by`)";
                    match &raw.attr {
                        Some(tokens) => cx.error_tokens(tokens, message),
                        None => cx.error(raw.span, message),
                    }
                }
                seen.push(identity);
            }
        }

        // Stacked rules are one decision, asked of one limiter.
        let first_limiter = rules.iter().flatten().next().map(|r| r.limiter.clone());
        for (raw, rule) in raws.iter().zip(&rules).skip(1) {
            if let (Some(rule), Some(first)) = (rule, &first_limiter)
                && rule.limiter != *first
            {
                let message = "stacked rules are one decision, asked of one limiter: give every \
                               `#[rate_limit]` of this fn the same `limiter` (or none)";
                match (raw.value(LIMITER), &raw.attr) {
                    (Some(value), _) => cx.error_tokens(value, message),
                    (None, Some(tokens)) => cx.error_tokens(tokens, message),
                    (None, None) => cx.error(raw.span, message),
                }
            }
        }

        // A call that waits its turn is one paced call: a fn of its own,
        // never a handler holding its client's connection, never one of a
        // set checked all or nothing.
        for rule in rules.iter().flatten() {
            let Some((_, value)) = &rule.wait else {
                continue;
            };
            if let Some(handler) = &handler {
                cx.error(
                    value,
                    format_args!(
                        "`wait` holds a call until its turn, but this fn is an HTTP handler \
                         ({}): its client would wait on an open connection, and a 429 with \
                         `Retry-After` tells it when to come back; drop `wait`, or put it on a \
                         plain async fn that the handler calls",
                        handler.why
                    ),
                );
            } else if rules.len() > 1 {
                cx.error(
                    value,
                    "`wait` goes on a fn with one `#[rate_limit]`: stacked rules are checked \
                     all or nothing at once, and one rule's turn is not the others'",
                );
            }
        }

        let request = responder.then_some(match call {
            Some(ident) => Request::Param(ident),
            None => Request::Injected,
        });

        cx.finish()?;
        Ok(Config {
            krate,
            // Every `None` was reported, so `finish` returned the error.
            rules: rules.into_iter().flatten().collect(),
            request,
            responder,
            original_output,
            handler,
        })
    }
}

/// Removes the `#[rate_limit]` attributes stacked below this one, in the
/// order written.
fn take_stacked(func: &mut ItemFn) -> Vec<Attribute> {
    let (ours, others) = std::mem::take(&mut func.attrs)
        .into_iter()
        .partition(|attr| {
            attr.path()
                .segments
                .last()
                .is_some_and(|s| s.ident == "rate_limit")
        });
    func.attrs = others;
    ours
}

fn rule_config(raw: &RawArgs, func: &ItemFn, cx: &mut Ctxt) -> Option<RuleConfig> {
    // Without `prefix`, the runtime's default (the key grammar is the runtime's).
    let prefix = raw.value(PREFIX).map(|value| {
        string(value, PREFIX, cx)
            .map(|s| s.value())
            .unwrap_or_default()
    });

    let rule = rule_source(raw, cx);

    let cost = match raw.get(COST) {
        Some((name, value)) => {
            let value = value.expect("checked in parse_raw");
            match positive_int(value, COST, cx) {
                Some(cost) => (cost, value.span()),
                None => (1, name.span()),
            }
        }
        None => (1, raw.span),
    };
    if let (Some(RuleSource::Inline { count, burst, .. }), Some((_, Some(value)))) =
        (&rule, raw.get(COST))
    {
        let capacity = burst.unwrap_or(*count);
        if cost.0 > capacity {
            cx.error(
                value,
                format_args!(
                    "a call costing {} could never pass: the rule's capacity is {capacity}",
                    cost.0
                ),
            );
        }
    }

    let mut key = vec![match &prefix {
        Some(prefix) => Part::Text(prefix.clone()),
        None => Part::Runtime("DEFAULT_PREFIX"),
    }];
    let mut name = func.sig.ident.to_string();
    let mut keyed_as = None;
    match raw.value(KEY) {
        Some(value) => {
            if let Some(lit) = string(value, KEY, cx) {
                name = lit.value();
                key_template(&lit, func, &mut key, cx);
            }
        }
        None => {
            key.push(Part::ModulePath);
            key.push(Part::Text(format!("::{}", func.sig.ident)));
            keyed_as = Some(vec![
                Part::ModulePath,
                Part::Text(format!("::{}", func.sig.ident)),
            ]);
        }
    }

    let subject = match raw.value(BY) {
        None => Subject::Global,
        Some(by) => subject(by, func, &mut key, cx),
    };

    let fallback = raw.value(FALLBACK).and_then(|value| match value {
        Expr::Path(path) if path.qself.is_none() => Some(path.path.clone()),
        other => {
            cx.error(
                other,
                "`fallback` takes the path of an async fn, e.g. `fallback = too_many_requests`",
            );
            None
        }
    });

    let on_error = raw.value(ON_ERROR).and_then(|value| {
        match [("allow", "Allow"), ("deny", "Deny"), ("local", "Local")]
            .iter()
            .find(|(name, _)| is_ident(value, name))
        {
            Some((_, variant)) => Some(*variant),
            None => {
                cx.error_tokens(value, "`on_error` takes `allow`, `deny` or `local`");
                None
            }
        }
    });

    let limiter = raw.value(LIMITER).and_then(|value| {
        let lit = string(value, LIMITER, cx)?;
        if lit.value().is_empty() {
            cx.error(
                &lit,
                "`limiter` names a limiter installed with `RateLimiter::install_as`",
            );
            return None;
        }
        Some(lit.value())
    });

    let shadow = flag(raw, SHADOW, cx);
    let subject_limits = flag(raw, SUBJECT_LIMITS, cx);

    let wait = raw.value(WAIT).and_then(|value| {
        let ms = wait_ms(value, cx)?;
        if let Some(RuleSource::Inline { variant, .. }) = &rule
            && !matches!(*variant, "Gcra" | "TokenBucket")
        {
            cx.error(value, WAIT_ALGORITHM);
            return None;
        }
        Some((ms, value.clone()))
    });
    let local_quota = local_quota(raw, rule.as_ref(), cx);
    if subject_limits
        && local_quota.is_some()
        && let Some((name, _)) = raw.get(SUBJECT_LIMITS)
    {
        cx.error(
            name,
            "a rule reads its subjects' own limits or is served from local quotas, not both: \
             a block served locally cannot follow one subject's limit",
        );
    }

    Some(RuleConfig {
        key,
        subject,
        rule: rule?,
        wait,
        cost: cost.0,
        cost_span: cost.1,
        name,
        prefix,
        keyed_as,
        fallback,
        on_error,
        limiter,
        shadow,
        local_quota,
        subject_limits,
    })
}

/// A flag option (`shadow`, `subject_limits`): written alone or `= true`
/// (`= false`: off).
fn flag(raw: &RawArgs, symbol: Symbol, cx: &mut Ctxt) -> bool {
    match raw.get(symbol) {
        None => false,
        Some((_, None)) => true,
        Some((
            _,
            Some(Expr::Lit(ExprLit {
                lit: Lit::Bool(b), ..
            })),
        )) => b.value,
        Some((_, Some(other))) => {
            cx.error(
                other,
                format!("`{0}` is a flag: write `{0}` (or `{0} = true`)", symbol),
            );
            false
        }
    }
}

/// Why `wait` needs a bucket algorithm.
pub(crate) const WAIT_ALGORITHM: &str = "`wait` needs `algorithm = gcra` or `algorithm = token_bucket`: they reserve the call's \
     future slot, so callers queue in turn; a window or `concurrency` rule keeps no slot to \
     reserve (the default is `fixed_window`)";

/// `wait = "2s"` (or whole seconds) in milliseconds.
fn wait_ms(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
    duration_ms(
        value,
        "wait",
        "write how long a call may wait its turn as whole seconds (`wait = 2`) \
         or a string with a unit: \"500ms\", \"2s\", \"1m\"",
        "`wait` must be greater than zero (without `wait`, a call over the limit is refused at once)",
        cx,
    )
}

/// `local_quota = N`: at least 1, at most the rule's capacity, on an
/// algorithm a quota applies to (for `rule = CONST`, the const
/// `Rule::with_local_quota` checks these).
fn local_quota(raw: &RawArgs, rule: Option<&RuleSource>, cx: &mut Ctxt) -> Option<(u64, Span)> {
    let value = raw.value(LOCAL_QUOTA)?;
    let block = positive_int(value, LOCAL_QUOTA, cx)?;
    if let Some(RuleSource::Inline {
        variant,
        count,
        burst,
        ..
    }) = rule
    {
        let name = ALGORITHMS
            .iter()
            .find(|(_, v, _)| v == variant)
            .map_or("", |(n, ..)| *n);
        if !LOCAL_QUOTA_ALGORITHMS.contains(&name) {
            cx.error(
                value,
                format_args!(
                    "`local_quota` applies to `algorithm = {}`; `{name}` cannot be served from \
                     local quotas ({})",
                    LOCAL_QUOTA_ALGORITHMS.join("` or `"),
                    if name == "concurrency" {
                        "its units are held in flight, not spent"
                    } else {
                        "a unit served later than it was counted would shift the window"
                    }
                ),
            );
            return None;
        }
        let capacity = burst.unwrap_or(*count);
        if block > capacity {
            cx.error(
                value,
                format_args!(
                    "`local_quota` must be at most the rule's capacity ({capacity}), not {block}"
                ),
            );
            return None;
        }
    }
    Some((block, value.span()))
}

/// `count`/`period`/`algorithm`/`burst`, or `rule = CONST`.
fn rule_source(raw: &RawArgs, cx: &mut Ctxt) -> Option<RuleSource> {
    if let Some(value) = raw.value(RULE) {
        for symbol in [COUNT, PERIOD, ALGORITHM, BURST] {
            if let Some((name, _)) = raw.get(symbol) {
                cx.error(
                    name,
                    format_args!("`rule` already sets `{symbol}`: remove `{symbol}`, or `rule`"),
                );
            }
        }
        return match value {
            Expr::Path(ExprPath {
                qself: None, path, ..
            }) => Some(RuleSource::Const(path.clone())),
            other => {
                cx.error(
                    other,
                    "`rule` takes the path of a `const Rule`, e.g. `rule = SEARCH`",
                );
                None
            }
        };
    }

    let algorithm = match raw.value(ALGORITHM) {
        None => Some(ALGORITHMS[0]),
        Some(value) => {
            let found = ALGORITHMS
                .iter()
                .copied()
                .find(|(name, ..)| is_ident(value, name));
            if found.is_none() {
                let written = value.to_token_stream().to_string();
                let names: Vec<&str> = ALGORITHMS.iter().map(|(n, ..)| *n).collect();
                cx.error_tokens(value, not_one_of("algorithm", &written, &names));
            }
            found
        }
    };

    let count = match raw.value(COUNT) {
        Some(value) => count(value, cx),
        None => {
            if !raw.unknown {
                cx.error(
                    raw.span,
                    "missing `count`: say how many calls a period allows, e.g. `count = 10` \
                     (or name a `const Rule` with `rule = ...`)",
                );
            }
            None
        }
    };

    let period_ms = match raw.value(PERIOD) {
        Some(value) => period(value, cx),
        None => Some(DEFAULT_PERIOD_MS),
    };

    let burst = match raw.value(BURST) {
        None => None,
        Some(value) => {
            let burst = positive_int(value, BURST, cx);
            if let Some((name, _, false)) = algorithm {
                let bursting: Vec<&str> = ALGORITHMS
                    .iter()
                    .filter(|(.., burst)| *burst)
                    .map(|(n, ..)| *n)
                    .collect();
                cx.error(
                    value,
                    format_args!(
                        "`burst` applies to `algorithm = {}`; `{name}` has no burst",
                        bursting.join("` or `")
                    ),
                );
            }
            if let Some(b) = burst.filter(|b| *b > MAX_COUNT) {
                cx.error(
                    value,
                    format_args!("`burst` must be at most {MAX_COUNT} (Rule::MAX_COUNT), not {b}"),
                );
            }
            burst
        }
    };

    let (algorithm, count, period_ms) = (algorithm?, count?, period_ms?);
    if matches!(algorithm.0, "token_bucket" | "gcra") {
        let bucket = burst.unwrap_or(count);
        if (bucket as u128) * (period_ms as u128) * 1000 > MAX_BURST_PERIOD_US as u128 {
            let at = raw.value(BURST).or(raw.value(COUNT)).expect("count is set");
            cx.error(
                at,
                "burst × period (in µs) must be at most 2^52 for token_bucket and gcra: \
                 use a shorter period or a smaller burst",
            );
        }
    }
    Some(RuleSource::Inline {
        variant: algorithm.1,
        count,
        period_ms,
        burst,
    })
}

/// The traits whose `impl` in the return type makes a fn an HTTP handler.
const RESPONSE_TRAITS: &[&str] = &["Responder", "IntoResponse"];

/// A parameter of type `HttpCall` with a plain name (the handler's own).
fn call_param(func: &ItemFn) -> Option<Ident> {
    func.sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(typed) => {
            let is_call = matches!(&*typed.ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "HttpCall"));
            match &*typed.pat {
                Pat::Ident(pat) if is_call => Some(pat.ident.clone()),
                _ => None,
            }
        }
        FnArg::Receiver(_) => None,
    })
}

/// What makes two rules' keys the same budget: the name as written (its
/// placeholders by what they render) and the subject. Compared, never a
/// key: the key grammar is the runtime's (`keys.rs`).
fn key_identity(rule: &RuleConfig) -> (String, &Subject) {
    let mut name = String::new();
    for part in &rule.key {
        match part {
            Part::Text(text) => name.push_str(text),
            Part::ModulePath => name.push_str("{module}"),
            Part::Runtime(param) => name.push_str(&format!("{{{param}}}")),
            Part::Value(tokens) => name.push_str(&format!("{{{tokens}}}")),
        }
    }
    (name, &rule.subject)
}
