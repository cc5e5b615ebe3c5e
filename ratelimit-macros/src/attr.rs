//! Parse and validate `#[rate_limit(...)]`: raw tokens in, a checked
//! [`Config`] out, with every mistake reported at once, each at its token.

use std::fmt;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, ExprCall, ExprLit, ExprPath, ExprUnary, FnArg, Ident, ItemFn, Lit, LitStr,
    Pat, ReturnType, Type, UnOp,
};

/// An option's name, written once (serde's `Symbol` pattern).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Symbol(&'static str);

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

const KEY: Symbol = Symbol("key");
const PREFIX: Symbol = Symbol("prefix");
const COUNT: Symbol = Symbol("count");
const PERIOD: Symbol = Symbol("period");
const BY: Symbol = Symbol("by");
const ALGORITHM: Symbol = Symbol("algorithm");
const BURST: Symbol = Symbol("burst");
const COST: Symbol = Symbol("cost");
const FALLBACK: Symbol = Symbol("fallback");
const ON_ERROR: Symbol = Symbol("on_error");
const LIMITER: Symbol = Symbol("limiter");
const RULE: Symbol = Symbol("rule");
const SHADOW: Symbol = Symbol("shadow");
const CRATE: Symbol = Symbol("crate");

/// Every option, in the order the docs list them.
const OPTIONS: [Symbol; 14] = [
    KEY, PREFIX, COUNT, PERIOD, BY, ALGORITHM, BURST, COST, FALLBACK, ON_ERROR, LIMITER, RULE,
    SHADOW, CRATE,
];

/// The algorithms, by their attribute name and `Algorithm` variant.
const ALGORITHMS: [(&str, &str); 6] = [
    ("fixed_window", "FixedWindow"),
    ("sliding_window", "SlidingWindow"),
    ("sliding_log", "SlidingLog"),
    ("token_bucket", "TokenBucket"),
    ("gcra", "Gcra"),
    ("concurrency", "Concurrency"),
];

/// Mirrors `Rule::MAX_COUNT` in the runtime (a proc-macro crate cannot see
/// it); the runtime's const constructors reject larger values too.
const MAX_COUNT: u64 = 1_000_000_000;
/// Mirrors `Rule::MAX_PERIOD` (366 days), in milliseconds.
const MAX_PERIOD_MS: u64 = 366 * 24 * 60 * 60 * 1000;
/// Mirrors `Rule::MAX_BURST_PERIOD_US`.
const MAX_BURST_PERIOD_US: u64 = 1 << 52;

const DEFAULT_PREFIX: &str = "limiter:";
const DEFAULT_PERIOD_MS: u64 = 1000;

/// Collects errors so the user sees every mistake in one build (serde's `Ctxt`).
#[derive(Default)]
struct Ctxt {
    errors: Option<syn::Error>,
}

impl Ctxt {
    fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(errors) => errors.combine(error),
            None => self.errors = Some(error),
        }
    }

    fn error(&mut self, span: impl Spanned, message: impl fmt::Display) {
        self.push(syn::Error::new(span.span(), message));
    }

    fn error_tokens(&mut self, tokens: impl ToTokens, message: impl fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    fn finish(self) -> syn::Result<()> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// One attribute's options as written: each value with the span of its name.
struct RawArgs {
    span: Span,
    /// The stacked attribute's tokens (none for the outermost one), to span
    /// errors about the whole attribute.
    attr: Option<TokenStream>,
    values: Vec<(Symbol, Ident, Option<Expr>)>,
    /// An unknown option was written: likely a misspelt one, so "missing
    /// option" errors would only repeat the same mistake.
    unknown: bool,
}

impl RawArgs {
    fn get(&self, symbol: Symbol) -> Option<(&Ident, Option<&Expr>)> {
        self.values
            .iter()
            .find(|(s, ..)| *s == symbol)
            .map(|(_, name, value)| (name, value.as_ref()))
    }

    fn value(&self, symbol: Symbol) -> Option<&Expr> {
        self.get(symbol).and_then(|(_, value)| value)
    }
}

/// One piece of a key.
pub(crate) enum Part {
    /// Text used as written.
    Text(String),
    /// `module_path!()` (the default key).
    ModulePath,
    /// A value rendered with `Display`: a parameter, `self.field`, `arg(..)`.
    Value(TokenStream),
}

/// Whose budget: added to the key.
pub(crate) enum Subject {
    Global,
    Ip,
    Header(String),
}

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
    /// The rule's name in rate-limit headers: its `key` as written.
    pub(crate) name: String,
    pub(crate) fallback: Option<syn::Path>,
    pub(crate) on_error: Option<&'static str>,
    pub(crate) limiter: Option<String>,
    pub(crate) shadow: bool,
}

/// How the generated code reaches the actix `HttpRequest`.
pub(crate) enum Request {
    /// A parameter of the fn's own.
    Param(Ident),
    /// A parameter the expansion adds (`__ratelimit_req`).
    Injected,
}

/// A checked fn with one or more rules: codegen cannot get any of it wrong.
pub(crate) struct Config {
    pub(crate) krate: syn::Path,
    pub(crate) rules: Vec<RuleConfig>,
    pub(crate) request: Option<Request>,
    /// An actix handler whose response the expansion builds: a route
    /// attribute is in sight, or it returns `impl Responder`. It then returns
    /// `HttpResponse`, with rate-limit headers on allowed responses too.
    pub(crate) responder: bool,
    /// The fn's return type when the expansion replaces it (to type the body).
    pub(crate) original_output: Option<Type>,
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

        let routed = is_routed(func);
        let responder = match &func.sig.output {
            ReturnType::Type(_, ty) => match &**ty {
                Type::ImplTrait(imp) if mentions(imp.to_token_stream(), &["Responder"]) => true,
                _ if routed => true,
                Type::ImplTrait(imp) => {
                    cx.error_tokens(
                        imp,
                        "`#[rate_limit]` cannot report a rejection through an `impl Trait` return \
                         type; choose one: add `fallback = path` to the attribute, return \
                         `Result<_, E>` where `E: From<RateLimited>`, or make the fn an actix-web \
                         handler returning `impl Responder`",
                    );
                    false
                }
                _ => false,
            },
            ReturnType::Default => routed,
        };
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
        let mut seen: Vec<String> = Vec::new();
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

        let needs_request = responder
            || looks_like_handler(func)
            || rules
                .iter()
                .flatten()
                .any(|r| !matches!(r.subject, Subject::Global));
        let request = if needs_request {
            match request_param(func) {
                Some(ident) => Some(Request::Param(ident)),
                None if responder || looks_like_handler(func) => Some(Request::Injected),
                None => {
                    for raw in &raws {
                        if let Some(by) = raw.value(BY).filter(|by| !is_ident(by, "global")) {
                            if matches!(by, Expr::Call(_)) && !call_name_is(by, "header") {
                                continue;
                            }
                            cx.error_tokens(
                                by,
                                "this `by` needs the HTTP request: put `#[rate_limit]` on an \
                                 actix-web handler (above its `#[get(..)]`), or add a parameter \
                                 `req: actix_web::HttpRequest`",
                            );
                        }
                    }
                    None
                }
            }
        } else {
            None
        };

        cx.finish()?;
        Ok(Config {
            krate,
            // Every `None` was reported, so `finish` returned the error.
            rules: rules.into_iter().flatten().collect(),
            request,
            responder,
            original_output,
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

fn parse_raw(args: TokenStream, span: Span, attr: Option<TokenStream>, cx: &mut Ctxt) -> RawArgs {
    let mut raw = RawArgs {
        span,
        attr,
        values: Vec::new(),
        unknown: false,
    };
    let parser = syn::meta::parser(|meta| {
        let name = meta.path.get_ident().cloned();
        let symbol = name
            .as_ref()
            .and_then(|ident| OPTIONS.iter().copied().find(|s| ident == s.0));
        let value: Option<Expr> = if meta.input.peek(syn::Token![=]) {
            Some(meta.value()?.parse()?)
        } else {
            None
        };
        let (Some(name), Some(symbol)) = (name, symbol) else {
            raw.unknown = true;
            cx.push(syn::Error::new_spanned(
                &meta.path,
                unknown_option(&meta.path),
            ));
            return Ok(());
        };
        if value.is_none() && symbol != SHADOW {
            cx.error(
                &name,
                format_args!("`{symbol}` needs a value: `{symbol} = ...`"),
            );
            return Ok(());
        }
        if raw.get(symbol).is_some() {
            cx.error(&name, format_args!("duplicate option `{symbol}`"));
            return Ok(());
        }
        raw.values.push((symbol, name, value));
        Ok(())
    });
    if let Err(error) = parser.parse2(args) {
        cx.push(error);
    }
    raw
}

fn rule_config(raw: &RawArgs, func: &ItemFn, cx: &mut Ctxt) -> Option<RuleConfig> {
    let prefix = match raw.value(PREFIX) {
        Some(value) => string(value, PREFIX, cx).map(|s| s.value()),
        None => Some(DEFAULT_PREFIX.to_owned()),
    }
    .unwrap_or_default();

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

    let mut key = vec![Part::Text(prefix)];
    let mut name = func.sig.ident.to_string();
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
    if fallback.is_some() {
        check_forwardable(func, cx);
    }

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

    let shadow = match raw.get(SHADOW) {
        None | Some((_, None)) => raw.get(SHADOW).is_some(),
        Some((
            _,
            Some(Expr::Lit(ExprLit {
                lit: Lit::Bool(b), ..
            })),
        )) => b.value,
        Some((_, Some(other))) => {
            cx.error(
                other,
                "`shadow` is a flag: write `shadow` (or `shadow = true`)",
            );
            false
        }
    };

    Some(RuleConfig {
        key,
        subject,
        rule: rule?,
        cost: cost.0,
        cost_span: cost.1,
        name,
        fallback,
        on_error,
        limiter,
        shadow,
    })
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
        None => Some(("fixed_window", "FixedWindow")),
        Some(value) => {
            let found = ALGORITHMS
                .iter()
                .copied()
                .find(|(name, _)| is_ident(value, name));
            if found.is_none() {
                let written = value.to_token_stream().to_string();
                let names: Vec<&str> = ALGORITHMS.iter().map(|(n, _)| *n).collect();
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
            match algorithm {
                Some((name, _)) if !matches!(name, "token_bucket" | "gcra") => {
                    cx.error(
                        value,
                        format_args!(
                            "`burst` applies to `algorithm = token_bucket` or `gcra`; \
                             `{name}` has no burst"
                        ),
                    );
                }
                _ => {}
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

fn unknown_option(path: &syn::Path) -> String {
    let written = path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    let names: Vec<&str> = OPTIONS.iter().map(|s| s.0).collect();
    not_one_of("option", &written, &names)
}

/// "unknown X `y`; did you mean `z`? expected one of ..."
fn not_one_of(what: &str, written: &str, expected: &[&str]) -> String {
    let list = expected
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match expected
        .iter()
        .filter(|s| edit_distance(written, s) <= 2.max(s.len() / 3))
        .min_by_key(|s| edit_distance(written, s))
    {
        Some(close) => {
            format!("unknown {what} `{written}`; did you mean `{close}`? expected one of {list}")
        }
        None => format!("unknown {what} `{written}`; expected one of {list}"),
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

fn is_ident(value: &Expr, name: &str) -> bool {
    matches!(value, Expr::Path(p) if p.qself.is_none() && p.path.is_ident(name))
}

fn call_name_is(value: &Expr, name: &str) -> bool {
    matches!(value, Expr::Call(ExprCall { func, .. }) if is_ident(func, name))
}

fn string(value: &Expr, symbol: Symbol, cx: &mut Ctxt) -> Option<LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s.clone()),
        other => {
            cx.error(
                other,
                format_args!("`{symbol}` takes a string literal, e.g. `{symbol} = \"...\"`"),
            );
            None
        }
    }
}

fn plain_int(value: &Expr) -> Option<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if int.suffix().is_empty() => int.base10_parse::<u64>().ok(),
        _ => None,
    }
}

fn positive_int(value: &Expr, symbol: Symbol, cx: &mut Ctxt) -> Option<u64> {
    match plain_int(value) {
        Some(0) => cx.error(value, format_args!("`{symbol}` must be at least 1")),
        Some(n) => return Some(n),
        None if is_negative(value) => {
            cx.error(value, format_args!("`{symbol}` must be at least 1"))
        }
        None => cx.error(
            value,
            format_args!("`{symbol}` takes a whole number, e.g. `{symbol} = 2`"),
        ),
    }
    None
}

fn count(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
    match plain_int(value) {
        Some(0) => cx.error(value, "`count` must be at least 1"),
        Some(n) if n > MAX_COUNT => cx.error(
            value,
            format_args!("`count` must be at most {MAX_COUNT} (Rule::MAX_COUNT)"),
        ),
        Some(n) => return Some(n),
        None if is_negative(value) => cx.error(value, "`count` must be at least 1"),
        None => cx.error(
            value,
            "`count` takes a whole number of calls per period, e.g. `count = 10`",
        ),
    }
    None
}

fn is_negative(value: &Expr) -> bool {
    matches!(
        value,
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            ..
        })
    )
}

const PERIOD_HELP: &str = "write whole seconds (`period = 10`) or a string with a unit: \
                           \"500ms\", \"10s\", \"1m\", \"1h\"";

fn period(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
    let ms = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if int.suffix().is_empty() => int
            .base10_parse::<u64>()
            .ok()
            .and_then(|s| s.checked_mul(1000)),
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => match parse_duration_ms(&s.value()) {
            Ok(ms) => Some(ms),
            Err(why) => {
                cx.error(
                    value,
                    format_args!("invalid `period`: {why}; {PERIOD_HELP}"),
                );
                return None;
            }
        },
        _ if is_negative(value) => Some(0),
        _ => {
            cx.error(value, format_args!("invalid `period`; {PERIOD_HELP}"));
            return None;
        }
    };
    match ms {
        Some(0) => cx.error(value, "`period` must be greater than zero"),
        Some(ms) if ms <= MAX_PERIOD_MS => return Some(ms),
        _ => cx.error(value, "`period` must be at most 366 days"),
    }
    None
}

/// `"500ms"`, `"10s"`, `"1m"`, `"1h"` to milliseconds.
fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("`{text}` does not start with a number"));
    }
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "" => return Err(format!("`{text}` has no unit")),
        other => return Err(format!("unknown unit `{other}`")),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .ok_or_else(|| format!("`{text}` is too long"))
}

/// The fn's parameters that are plain names.
fn param_names(func: &ItemFn) -> Vec<&Ident> {
    func.sig
        .inputs
        .iter()
        .filter_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => Some(&pat.ident),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
        .collect()
}

fn has_receiver(func: &ItemFn) -> bool {
    matches!(func.sig.inputs.first(), Some(FnArg::Receiver(_)))
}

/// Splits `"login:{user}"` into text and values; `{{` and `}}` stand for
/// literal braces (as in `format!`), `{self.field}` reads the receiver.
fn key_template(lit: &LitStr, func: &ItemFn, parts: &mut Vec<Part>, cx: &mut Ctxt) {
    let text = lit.value();
    let params = param_names(func);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                push_text(parts, "{");
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                push_text(parts, "}");
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let name = name.trim();
                // Spanned at the key, so a type that is not `Display` is
                // reported where it was used.
                let span = lit.span();
                if let Some(field) = name.strip_prefix("self.") {
                    if !has_receiver(func) {
                        cx.error(
                            lit,
                            format_args!("`{{{name}}}` in `key` needs a `self` parameter"),
                        );
                    } else if syn::parse_str::<Ident>(field).is_err() {
                        cx.error(
                            lit,
                            format_args!(
                                "`{{{name}}}` in `key`: write `{{self.field}}` with a field name"
                            ),
                        );
                    } else {
                        let field = Ident::new(field, span);
                        let this = syn::Token![self](span);
                        parts.push(Part::Value(quote!(#this.#field)));
                    }
                    continue;
                }
                match params.iter().find(|p| **p == name) {
                    Some(param) => {
                        let ident = Ident::new(&param.to_string(), span);
                        parts.push(Part::Value(ident.into_token_stream()));
                    }
                    None => cx.error(lit, no_such_param(name, func, &params)),
                }
            }
            '}' => cx.error(
                lit,
                "unmatched `}` in `key`: write `}}` for a literal brace",
            ),
            c => push_text(parts, c.encode_utf8(&mut [0; 4])),
        }
    }
}

fn push_text(parts: &mut Vec<Part>, text: &str) {
    match parts.last_mut() {
        Some(Part::Text(t)) => t.push_str(text),
        _ => parts.push(Part::Text(text.to_owned())),
    }
}

fn no_such_param(name: &str, func: &ItemFn, params: &[&Ident]) -> String {
    let fn_name = &func.sig.ident;
    if name.is_empty() {
        return "empty placeholder `{}` in `key`: name a parameter, e.g. `{user_id}`, \
                or write `{{}}` for literal braces"
            .to_owned();
    }
    if params.is_empty() {
        return format!(
            "`{{{name}}}` in `key` names no parameter: `{fn_name}` has no named parameters"
        );
    }
    let list = params
        .iter()
        .map(|p| format!("`{p}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("`{{{name}}}` in `key` names no parameter of `{fn_name}`; its parameters are {list}")
}

/// `global`, `ip`, `header("name")` or `arg(param)` (added to the key).
fn subject(by: &Expr, func: &ItemFn, key: &mut Vec<Part>, cx: &mut Ctxt) -> Subject {
    const HELP: &str = "`by` takes `global`, `ip`, `header(\"name\")` or `arg(parameter)`";
    if is_ident(by, "global") {
        return Subject::Global;
    }
    if is_ident(by, "ip") {
        return Subject::Ip;
    }
    let Expr::Call(ExprCall {
        func: callee, args, ..
    }) = by
    else {
        cx.error_tokens(by, HELP);
        return Subject::Global;
    };
    let single = (args.len() == 1).then(|| &args[0]);
    if is_ident(callee, "header") {
        match single {
            Some(Expr::Lit(ExprLit {
                lit: Lit::Str(name),
                ..
            })) if is_header_name(&name.value()) => {
                return Subject::Header(name.value().to_ascii_lowercase());
            }
            Some(other) => cx.error(
                other,
                "`header(..)` takes a header name, e.g. `header(\"x-api-key\")`",
            ),
            None => cx.error_tokens(
                by,
                "`header(..)` takes a header name, e.g. `header(\"x-api-key\")`",
            ),
        }
        return Subject::Global;
    }
    if is_ident(callee, "arg") {
        match single {
            Some(Expr::Path(p)) if p.qself.is_none() && p.path.get_ident().is_some() => {
                let name = p.path.get_ident().expect("checked");
                let params = param_names(func);
                if params.contains(&name) {
                    push_text(key, &format!(":arg:{name}:"));
                    key.push(Part::Value(name.to_token_stream()));
                } else {
                    let list = params
                        .iter()
                        .map(|p| format!("`{p}`"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let which = if list.is_empty() {
                        format!("`{}` has no named parameters", func.sig.ident)
                    } else {
                        format!("its parameters are {list}")
                    };
                    cx.error(
                        name,
                        format_args!(
                            "`arg({name})` names no parameter of `{}`; {which}",
                            func.sig.ident
                        ),
                    );
                }
            }
            Some(other) => cx.error_tokens(
                other,
                "`arg(..)` takes a parameter name, e.g. `arg(user_id)`",
            ),
            None => cx.error_tokens(by, "`arg(..)` takes a parameter name, e.g. `arg(user_id)`"),
        }
        return Subject::Global;
    }
    cx.error_tokens(by, HELP);
    Subject::Global
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// What makes two rules' keys the same budget.
fn key_identity(rule: &RuleConfig) -> String {
    let mut identity = String::new();
    for part in &rule.key {
        match part {
            Part::Text(text) => identity.push_str(text),
            Part::ModulePath => identity.push_str("{module}"),
            Part::Value(tokens) => identity.push_str(&format!("{{{tokens}}}")),
        }
    }
    match &rule.subject {
        Subject::Global => {}
        Subject::Ip => identity.push_str(":ip"),
        Subject::Header(name) => identity.push_str(&format!(":header:{name}")),
    }
    identity
}

/// A fallback is called with the fn's own arguments, so each needs a name.
fn check_forwardable(func: &ItemFn, cx: &mut Ctxt) {
    for arg in &func.sig.inputs {
        if let FnArg::Typed(typed) = arg
            && !matches!(&*typed.pat, Pat::Ident(_))
        {
            cx.error(
                &typed.pat,
                "`fallback` is called with this fn's arguments, so each parameter needs a \
                 plain name: bind this pattern to a name and destructure it in the body",
            );
        }
    }
}

/// Whether `tokens` name any of `idents`.
pub(crate) fn mentions(tokens: TokenStream, idents: &[&str]) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => idents.iter().any(|name| ident == name),
        TokenTree::Group(group) => mentions(group.stream(), idents),
        _ => false,
    })
}

/// A parameter of type `HttpRequest` (or `&HttpRequest`) with a plain name.
fn request_param(func: &ItemFn) -> Option<Ident> {
    func.sig.inputs.iter().find_map(|arg| match arg {
        FnArg::Typed(typed) => {
            let ty = match &*typed.ty {
                Type::Reference(r) => &*r.elem,
                other => other,
            };
            let is_request = matches!(ty, Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "HttpRequest"));
            match &*typed.pat {
                Pat::Ident(pat) if is_request => Some(pat.ident.clone()),
                _ => None,
            }
        }
        FnArg::Receiver(_) => None,
    })
}

/// A route attribute is in sight (`#[rate_limit]` is written above it).
fn is_routed(func: &ItemFn) -> bool {
    const ROUTES: [&str; 11] = [
        "get", "post", "put", "delete", "patch", "head", "options", "trace", "connect", "route",
        "routes",
    ];
    func.attrs.iter().any(|attr| {
        attr.path()
            .segments
            .last()
            .is_some_and(|s| ROUTES.iter().any(|r| s.ident == r))
    })
}

/// An actix-web handler: a route attribute is in sight, or the return type
/// is actix's, or it takes an `HttpRequest`.
fn looks_like_handler(func: &ItemFn) -> bool {
    let routed = is_routed(func) || request_param(func).is_some();
    let actix_output = match &func.sig.output {
        ReturnType::Type(_, ty) => mentions(
            ty.to_token_stream(),
            &["HttpResponse", "Responder", "actix_web"],
        ),
        ReturnType::Default => false,
    };
    routed || actix_output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("1m"), Ok(60_000));
        assert_eq!(parse_duration_ms("2h"), Ok(7_200_000));
        assert!(parse_duration_ms("10").is_err());
        assert!(parse_duration_ms("ten s").is_err());
        assert!(parse_duration_ms("10d").is_err());
        assert!(parse_duration_ms("99999999999999999999s").is_err());
    }

    #[test]
    fn did_you_mean() {
        assert_eq!(edit_distance("cout", "count"), 1);
        assert_eq!(edit_distance("peroid", "period"), 2);
        let path: syn::Path = syn::parse_str("cout").unwrap();
        assert!(unknown_option(&path).contains("did you mean `count`?"));
        let path: syn::Path = syn::parse_str("zzzzzz").unwrap();
        assert!(!unknown_option(&path).contains("did you mean"));
        assert!(
            not_one_of("algorithm", "token_buket", &["token_bucket", "gcra"])
                .contains("did you mean `token_bucket`")
        );
    }

    #[test]
    fn header_names() {
        assert!(is_header_name("x-api-key"));
        assert!(!is_header_name("x api key"));
        assert!(!is_header_name(""));
    }
}
