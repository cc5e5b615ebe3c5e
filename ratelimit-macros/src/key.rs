//! Keys: the `key` template's `{param}` placeholders and the `by` subject,
//! checked against the fn's parameters.

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::{Expr, ExprCall, ExprLit, FnArg, Ident, ItemFn, Lit, LitStr, Pat};

use crate::options::{Ctxt, is_ident};

/// One piece of a key.
pub(crate) enum Part {
    /// Text used as written.
    Text(String),
    /// `module_path!()` (the default key).
    ModulePath,
    /// A constant of the runtime's key grammar (`__private::NAME`): the
    /// default prefix, a subject's tag.
    Runtime(&'static str),
    /// A value rendered with `Display`: a parameter, `self.field`, `arg(..)`.
    Value(TokenStream),
}

/// Whose budget: added to the key.
#[derive(PartialEq, Eq)]
pub(crate) enum Subject {
    Global,
    Ip,
    Header(String),
}

/// The names the fn's parameters bind: plain names, and those inside
/// patterns (axum's `Path(name): Path<String>`).
pub(crate) fn param_names(func: &ItemFn) -> Vec<&Ident> {
    let mut names = Vec::new();
    for arg in &func.sig.inputs {
        if let FnArg::Typed(typed) = arg {
            bound_names(&typed.pat, &mut names);
        }
    }
    names
}

fn bound_names<'a>(pat: &'a Pat, names: &mut Vec<&'a Ident>) {
    match pat {
        Pat::Ident(pat) => {
            names.push(&pat.ident);
            if let Some((_, sub)) = &pat.subpat {
                bound_names(sub, names);
            }
        }
        Pat::TupleStruct(pat) => pat.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Tuple(pat) => pat.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Struct(pat) => pat.fields.iter().for_each(|f| bound_names(&f.pat, names)),
        Pat::Reference(pat) => bound_names(&pat.pat, names),
        Pat::Paren(pat) => bound_names(&pat.pat, names),
        Pat::Slice(pat) => pat.elems.iter().for_each(|p| bound_names(p, names)),
        Pat::Type(pat) => bound_names(&pat.pat, names),
        _ => {}
    }
}

pub(crate) fn has_receiver(func: &ItemFn) -> bool {
    matches!(func.sig.inputs.first(), Some(FnArg::Receiver(_)))
}

/// The punctuation a rendered value keeps as it is (with ASCII letters and
/// digits): the runtime's `keys::is_safe`. A value holding anything else
/// is replaced by `~` and its digest. `tests/registry.rs` holds the two
/// to each other.
pub(crate) const KEPT_PUNCTUATION: &str = "-_.@+=/!$%&()',;^|";

/// Whether `c` never appears in a rendered value (kept values are made of
/// letters, digits and [`KEPT_PUNCTUATION`]; digests of `~` and hex
/// digits), so it can separate two of them.
fn separates_values(c: char) -> bool {
    !(c.is_ascii_alphanumeric() || KEPT_PUNCTUATION.contains(c) || c == '~')
}

/// Splits `"login:{user}"` into text and values; `{{` and `}}` stand for
/// literal braces (as in `format!`), `{self.field}` reads the receiver.
/// Two placeholders need a character values never hold between them (`:`),
/// or two different pairs of values could make one key.
pub(crate) fn key_template(lit: &LitStr, func: &ItemFn, parts: &mut Vec<Part>, cx: &mut Ctxt) {
    let text = lit.value();
    let params = param_names(func);
    let mut chars = text.chars().peekable();
    // The previous placeholder, and the text written since it.
    let mut since_value: Option<(String, String)> = None;
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                push_text(parts, "{");
                if let Some((_, between)) = &mut since_value {
                    between.push('{');
                }
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                push_text(parts, "}");
                if let Some((_, between)) = &mut since_value {
                    between.push('}');
                }
            }
            '{' => {
                let name: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let name = name.trim();
                if let Some((previous, between)) = &since_value
                    && !between.chars().any(separates_values)
                {
                    cx.error(lit, adjacent(previous, name, between));
                }
                since_value = Some((name.to_owned(), String::new()));
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
            c => {
                push_text(parts, c.encode_utf8(&mut [0; 4]));
                if let Some((_, between)) = &mut since_value {
                    between.push(c);
                }
            }
        }
    }
}

/// Why `{previous}` and `{name}` cannot stand with only `between` between
/// them.
fn adjacent(previous: &str, name: &str, between: &str) -> String {
    let why = match between {
        "" => "with nothing between them, values (\"ab\", \"c\") and (\"a\", \"bc\") make \
               the same key, so one caller could spend another's budget"
            .to_owned(),
        // `~` is never kept in a value: it only starts a digest (`~` and
        // hex digits), so no pair of values shows a collision.
        text if text.contains('~') => format!(
            "with only `{text}` between them: `~` is not kept in a value, but it starts \
             the digest (`~` and 32 hex digits) that replaces one, so it is no character \
             values never hold"
        ),
        text => format!(
            "with only `{text}` between them, values (\"a{text}b\", \"c\") and \
             (\"a\", \"b{text}c\") make the same key, so one caller could spend another's \
             budget"
        ),
    };
    format!(
        "`{{{previous}}}` and `{{{name}}}` in `key` need a separator between them, such as \
         `:`: {why}. A value is kept as written when made of letters, digits and \
         `{KEPT_PUNCTUATION}`, and replaced by its digest otherwise, so any other character \
         (`:`, `#`, a space) never appears in one: write `{{{previous}}}:{{{name}}}`"
    )
}

pub(crate) fn push_text(parts: &mut Vec<Part>, text: &str) {
    match parts.last_mut() {
        Some(Part::Text(t)) => t.push_str(text),
        _ => parts.push(Part::Text(text.to_owned())),
    }
}

pub(crate) fn no_such_param(name: &str, func: &ItemFn, params: &[&Ident]) -> String {
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
pub(crate) fn subject(by: &Expr, func: &ItemFn, key: &mut Vec<Part>, cx: &mut Ctxt) -> Subject {
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
                    key.push(Part::Runtime("ARG"));
                    push_text(key, &format!("{name}:"));
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

pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names() {
        assert!(is_header_name("x-api-key"));
        assert!(!is_header_name("x api key"));
        assert!(!is_header_name(""));
    }
}
