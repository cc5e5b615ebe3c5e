//! Parse and validate `#[rate_limit(...)]`: raw tokens in, a checked
//! [`Config`] out, with every mistake reported at once, each at its token.

use std::fmt;

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, FnArg, Ident, ItemFn, Lit, LitStr, Pat, UnOp};

/// An option's name, written once (serde's `Symbol` pattern).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Symbol(&'static str);

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

const KEY: Symbol = Symbol("key");
const PREFIX: Symbol = Symbol("prefix");
const COUNT: Symbol = Symbol("count");
const PERIOD: Symbol = Symbol("period");
const FALLBACK: Symbol = Symbol("fallback");

/// Every option, in the order the docs list them.
const OPTIONS: [Symbol; 5] = [KEY, PREFIX, COUNT, PERIOD, FALLBACK];

/// Mirrors `Rule::MAX_COUNT` in the runtime (a proc-macro crate cannot see it);
/// the runtime's const constructor rejects larger values too.
const MAX_COUNT: u64 = 1_000_000_000;
/// Mirrors `Rule::MAX_PERIOD` (366 days), in milliseconds.
const MAX_PERIOD_MS: u64 = 366 * 24 * 60 * 60 * 1000;

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

    fn finish(self) -> syn::Result<()> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// The options as written: each value with the span of its name.
#[derive(Default)]
struct RawArgs {
    values: Vec<(Symbol, Ident, Expr)>,
    /// An unknown option was written: likely a misspelt one, so "missing
    /// option" errors would only repeat the same mistake.
    unknown: bool,
}

impl RawArgs {
    fn get(&self, symbol: Symbol) -> Option<(&Ident, &Expr)> {
        self.values
            .iter()
            .find(|(s, ..)| *s == symbol)
            .map(|(_, name, value)| (name, value))
    }
}

/// One piece of a key template.
#[derive(Debug)]
pub(crate) enum Part {
    /// Text used as written.
    Text(String),
    /// A `{param}` placeholder, rendered with `Display`.
    Param(Ident),
}

/// What a call's key is made of.
pub(crate) enum Key {
    /// Prefix and key known at compile time: one `&'static str`, no allocation.
    Static(String),
    /// The prefix, then the key template's parts.
    Template(Vec<Part>),
    /// No `key` option: the prefix, then the fn's module path and name.
    FnPath { prefix: String, name: String },
}

/// A checked `#[rate_limit]`: codegen cannot get any of it wrong.
pub(crate) struct Config {
    pub(crate) key: Key,
    pub(crate) count: u64,
    pub(crate) period_ms: u64,
    pub(crate) fallback: Option<syn::Path>,
}

impl Config {
    /// Parses the attribute's arguments and checks them against the fn.
    pub(crate) fn parse(args: TokenStream, func: &ItemFn) -> syn::Result<Config> {
        let mut cx = Ctxt::default();
        let raw = parse_raw(args, &mut cx);

        if func.sig.asyncness.is_none() {
            cx.error(
                func.sig.fn_token,
                "`#[rate_limit]` goes on an `async fn`: the limit is checked with an `.await` \
                 before the body runs; write `async fn`",
            );
        }

        let prefix = match raw.get(PREFIX) {
            Some((_, value)) => string(value, PREFIX, &mut cx).map(|s| s.value()),
            None => Some(DEFAULT_PREFIX.to_owned()),
        }
        .unwrap_or_default();

        let count = match raw.get(COUNT) {
            Some((_, value)) => count(value, &mut cx),
            None => {
                if !raw.unknown {
                    cx.error(
                        Span::call_site(),
                        "missing `count`: say how many calls a period allows, e.g. `count = 10`",
                    );
                }
                None
            }
        };

        let period_ms = match raw.get(PERIOD) {
            Some((_, value)) => period(value, &mut cx),
            None => Some(DEFAULT_PERIOD_MS),
        };

        let key = match raw.get(KEY) {
            Some((_, value)) => string(value, KEY, &mut cx)
                .and_then(|lit| key_template(&prefix, &lit, func, &mut cx)),
            None => Some(Key::FnPath {
                prefix,
                name: func.sig.ident.to_string(),
            }),
        };

        let fallback = raw.get(FALLBACK).and_then(|(_, value)| match value {
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
            check_forwardable(func, &mut cx);
        }

        cx.finish()?;
        // Every `None` above was reported, so `finish` returned the error.
        Ok(Config {
            key: key.expect("reported"),
            count: count.expect("reported"),
            period_ms: period_ms.expect("reported"),
            fallback,
        })
    }
}

fn parse_raw(args: TokenStream, cx: &mut Ctxt) -> RawArgs {
    let mut raw = RawArgs::default();
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
        let Some(value) = value else {
            cx.error(
                &name,
                format_args!("`{symbol}` needs a value: `{symbol} = ...`"),
            );
            return Ok(());
        };
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

fn unknown_option(path: &syn::Path) -> String {
    let written = path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::");
    let expected = OPTIONS
        .iter()
        .map(|s| format!("`{s}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match OPTIONS
        .iter()
        .filter(|s| edit_distance(&written, s.0) <= 2)
        .min_by_key(|s| edit_distance(&written, s.0))
    {
        Some(close) => format!(
            "unknown option `{written}`; did you mean `{close}`? expected one of {expected}"
        ),
        None => format!("unknown option `{written}`; expected one of {expected}"),
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

fn count(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
    let parsed = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if int.suffix().is_empty() => int.base10_parse::<u64>().ok(),
        _ => None,
    };
    match parsed {
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

/// The fn's parameters that are plain names, for placeholders and fallbacks.
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

/// Splits `"login:{user}"` into text and placeholders; `{{` and `}}` stand
/// for literal braces (as in `format!`).
fn key_template(prefix: &str, lit: &LitStr, func: &ItemFn, cx: &mut Ctxt) -> Option<Key> {
    let text = lit.value();
    let params = param_names(func);
    let mut parts = vec![Part::Text(prefix.to_owned())];
    let mut chars = text.chars().peekable();
    let mut ok = true;
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                push_text(&mut parts, '{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                push_text(&mut parts, '}');
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let name = name.trim();
                match params.iter().find(|p| **p == name) {
                    Some(param) => parts.push(Part::Param((*param).clone())),
                    None => {
                        ok = false;
                        cx.error(lit, no_such_param(name, func, &params));
                    }
                }
            }
            '}' => {
                ok = false;
                cx.error(
                    lit,
                    "unmatched `}` in `key`: write `}}` for a literal brace",
                );
            }
            c => push_text(&mut parts, c),
        }
    }
    if !ok {
        return None;
    }
    if let [Part::Text(whole)] = parts.as_slice() {
        return Some(Key::Static(whole.clone()));
    }
    Some(Key::Template(parts))
}

fn push_text(parts: &mut Vec<Part>, c: char) {
    match parts.last_mut() {
        Some(Part::Text(text)) => text.push(c),
        _ => parts.push(Part::Text(c.to_string())),
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
    }
}
