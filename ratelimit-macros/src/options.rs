//! The attribute's options as written: each key named once, each value
//! parsed and checked at its token, every mistake collected in a [`Ctxt`].

use std::fmt;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, ExprCall, ExprLit, ExprUnary, Ident, Lit, LitStr, UnOp};

/// An option's name, written once (serde's `Symbol` pattern).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Symbol(&'static str);

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

pub(crate) const KEY: Symbol = Symbol("key");
pub(crate) const PREFIX: Symbol = Symbol("prefix");
pub(crate) const COUNT: Symbol = Symbol("count");
pub(crate) const PERIOD: Symbol = Symbol("period");
pub(crate) const BY: Symbol = Symbol("by");
pub(crate) const ALGORITHM: Symbol = Symbol("algorithm");
pub(crate) const BURST: Symbol = Symbol("burst");
pub(crate) const COST: Symbol = Symbol("cost");
pub(crate) const FALLBACK: Symbol = Symbol("fallback");
pub(crate) const ON_ERROR: Symbol = Symbol("on_error");
pub(crate) const LIMITER: Symbol = Symbol("limiter");
pub(crate) const RULE: Symbol = Symbol("rule");
pub(crate) const SHADOW: Symbol = Symbol("shadow");
pub(crate) const CRATE: Symbol = Symbol("crate");
pub(crate) const WAIT: Symbol = Symbol("wait");

pub(crate) const LOCAL_QUOTA: Symbol = Symbol("local_quota");
pub(crate) const SUBJECT_LIMITS: Symbol = Symbol("subject_limits");

/// Every option, in the order the docs list them.
pub(crate) const OPTIONS: [Symbol; 17] = [
    KEY,
    PREFIX,
    COUNT,
    PERIOD,
    BY,
    ALGORITHM,
    BURST,
    COST,
    FALLBACK,
    ON_ERROR,
    LIMITER,
    RULE,
    SHADOW,
    CRATE,
    WAIT,
    LOCAL_QUOTA,
    SUBJECT_LIMITS,
];

/// The algorithms a `local_quota` applies to (`Rule::with_local_quota`).
pub(crate) const LOCAL_QUOTA_ALGORITHMS: [&str; 3] = ["fixed_window", "token_bucket", "gcra"];

/// The algorithms: attribute name, `Algorithm` variant, whether it takes a
/// `burst`. The runtime's registry is the source of truth; a test there
/// (`tests/registry.rs`) holds this table to it.
pub(crate) const ALGORITHMS: [(&str, &str, bool); 6] = [
    ("fixed_window", "FixedWindow", false),
    ("sliding_log", "SlidingLog", false),
    ("sliding_window", "SlidingWindow", false),
    ("token_bucket", "TokenBucket", true),
    ("gcra", "Gcra", true),
    ("concurrency", "Concurrency", false),
];
/// Mirrors `Rule::MAX_COUNT` in the runtime (a proc-macro crate cannot see
/// it); the runtime's const constructors reject larger values too.
pub(crate) const MAX_COUNT: u64 = 1_000_000_000;
/// Mirrors `Rule::MAX_PERIOD` (366 days), in milliseconds.
pub(crate) const MAX_PERIOD_MS: u64 = 366 * 24 * 60 * 60 * 1000;
/// Mirrors `Rule::MAX_BURST_PERIOD_US`.
pub(crate) const MAX_BURST_PERIOD_US: u64 = 1 << 52;

pub(crate) const DEFAULT_PERIOD_MS: u64 = 1000;

/// Collects errors so the user sees every mistake in one build (serde's `Ctxt`).
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Option<syn::Error>,
}

impl Ctxt {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(errors) => errors.combine(error),
            None => self.errors = Some(error),
        }
    }

    pub(crate) fn error(&mut self, span: impl Spanned, message: impl fmt::Display) {
        self.push(syn::Error::new(span.span(), message));
    }

    pub(crate) fn error_tokens(&mut self, tokens: impl ToTokens, message: impl fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.errors.map_or(Ok(()), Err)
    }
}

/// One attribute's options as written: each value with the span of its name.
pub(crate) struct RawArgs {
    pub(crate) span: Span,
    /// The stacked attribute's tokens (none for the outermost one), to span
    /// errors about the whole attribute.
    pub(crate) attr: Option<TokenStream>,
    pub(crate) values: Vec<(Symbol, Ident, Option<Expr>)>,
    /// An unknown option was written: likely a misspelt one, so "missing
    /// option" errors would only repeat the same mistake.
    pub(crate) unknown: bool,
}

impl RawArgs {
    pub(crate) fn get(&self, symbol: Symbol) -> Option<(&Ident, Option<&Expr>)> {
        self.values
            .iter()
            .find(|(s, ..)| *s == symbol)
            .map(|(_, name, value)| (name, value.as_ref()))
    }

    pub(crate) fn value(&self, symbol: Symbol) -> Option<&Expr> {
        self.get(symbol).and_then(|(_, value)| value)
    }
}

pub(crate) fn parse_raw(
    args: TokenStream,
    span: Span,
    attr: Option<TokenStream>,
    cx: &mut Ctxt,
) -> RawArgs {
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
        if value.is_none() && symbol != SHADOW && symbol != SUBJECT_LIMITS {
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

pub(crate) fn unknown_option(path: &syn::Path) -> String {
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
pub(crate) fn not_one_of(what: &str, written: &str, expected: &[&str]) -> String {
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
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
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

pub(crate) fn is_ident(value: &Expr, name: &str) -> bool {
    matches!(value, Expr::Path(p) if p.qself.is_none() && p.path.is_ident(name))
}

pub(crate) fn call_name_is(value: &Expr, name: &str) -> bool {
    matches!(value, Expr::Call(ExprCall { func, .. }) if is_ident(func, name))
}

pub(crate) fn string(value: &Expr, symbol: Symbol, cx: &mut Ctxt) -> Option<LitStr> {
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

pub(crate) fn plain_int(value: &Expr) -> Option<u64> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if int.suffix().is_empty() => int.base10_parse::<u64>().ok(),
        _ => None,
    }
}

pub(crate) fn positive_int(value: &Expr, symbol: Symbol, cx: &mut Ctxt) -> Option<u64> {
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

pub(crate) fn count(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
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

pub(crate) fn is_negative(value: &Expr) -> bool {
    matches!(
        value,
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            ..
        })
    )
}

pub(crate) const PERIOD_HELP: &str = "write whole seconds (`period = 10`) or a string with a unit: \
                           \"500ms\", \"10s\", \"1m\", \"1h\"";

pub(crate) fn period(value: &Expr, cx: &mut Ctxt) -> Option<u64> {
    duration_ms(
        value,
        "period",
        PERIOD_HELP,
        "`period` must be greater than zero",
        cx,
    )
}

/// A duration option's value (`option = 10` whole seconds, or a string
/// with a unit) in milliseconds, from 1 ms to 366 days; `zero` says why 0
/// (or a negative number) is refused.
pub(crate) fn duration_ms(
    value: &Expr,
    option: &str,
    help: &str,
    zero: &str,
    cx: &mut Ctxt,
) -> Option<u64> {
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
                cx.error(value, format_args!("invalid `{option}`: {why}; {help}"));
                return None;
            }
        },
        _ if is_negative(value) => Some(0),
        _ => {
            cx.error(value, format_args!("invalid `{option}`; {help}"));
            return None;
        }
    };
    match ms {
        Some(0) => cx.error(value, zero),
        Some(ms) if ms <= MAX_PERIOD_MS => return Some(ms),
        _ => cx.error(value, format_args!("`{option}` must be at most 366 days")),
    }
    None
}

/// `"500ms"`, `"10s"`, `"1m"`, `"1h"` to milliseconds.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, String> {
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
}
