//! Fallbacks: the fn's arguments handed on (patterns such as axum's
//! `Path(id): Path<u32>` bound to hidden names first), and a call whose
//! mismatch is reported in our words: the signature the fallback must have.

use proc_macro2::{Delimiter, Spacing, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, PatIdent, PatWild, ReturnType, Type, TypeParamBound};

/// The fn's arguments as the fallback receives them: `self` first, then
/// each parameter by name. A parameter written as a pattern gets a hidden
/// name (`__ratelimit_arg_N`); the body starts by destructuring it as
/// written, so the body sees the same names. Returns the names and the
/// statements that bind, by reference, the pattern names `keyed` (the
/// key's placeholders), for the checks that run before the body.
pub(crate) fn bind_arguments(func: &mut ItemFn, keyed: &[String]) -> (Vec<Ident>, TokenStream) {
    let mut names = Vec::new();
    let mut by_ref = TokenStream::new();
    let mut destructure = Vec::new();
    for (i, arg) in func.sig.inputs.iter_mut().enumerate() {
        match arg {
            FnArg::Receiver(receiver) => names.push(Ident::new("self", receiver.self_token.span)),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) if pat.subpat.is_none() => names.push(pat.ident.clone()),
                pattern => {
                    let hidden = format_ident!("__ratelimit_arg_{}", i);
                    let (keyed_pattern, binds) = keyed_names(pattern, keyed);
                    if binds {
                        by_ref.extend(quote!(let #keyed_pattern = &#hidden;));
                    }
                    let pattern = pattern.clone();
                    destructure.push(syn::parse_quote!(let #pattern = #hidden;));
                    *typed.pat = Pat::Ident(PatIdent {
                        attrs: Vec::new(),
                        by_ref: None,
                        mutability: None,
                        ident: hidden.clone(),
                        subpat: None,
                    });
                    names.push(hidden);
                }
            },
        }
    }
    func.block.stmts.splice(0..0, destructure);
    (names, by_ref)
}

/// `pattern` with only the bindings in `keyed` kept, plain (no `mut`,
/// `ref`), the others `_`; and whether it binds anything.
fn keyed_names(pattern: &Pat, keyed: &[String]) -> (Pat, bool) {
    let mut binds = false;
    let mut pattern = pattern.clone();
    strip(&mut pattern, keyed, &mut binds);
    (pattern, binds)
}

fn strip(pattern: &mut Pat, keyed: &[String], binds: &mut bool) {
    match pattern {
        Pat::Ident(pat) if keyed.iter().any(|name| pat.ident == name) => {
            pat.by_ref = None;
            pat.mutability = None;
            pat.subpat = None;
            *binds = true;
        }
        Pat::Ident(pat) => match pat.subpat.take() {
            Some((_, mut sub)) => {
                strip(&mut sub, keyed, binds);
                *pattern = *sub;
            }
            None => {
                *pattern = Pat::Wild(PatWild {
                    attrs: Vec::new(),
                    underscore_token: Default::default(),
                })
            }
        },
        Pat::TupleStruct(pat) => pat.elems.iter_mut().for_each(|p| strip(p, keyed, binds)),
        Pat::Tuple(pat) => pat.elems.iter_mut().for_each(|p| strip(p, keyed, binds)),
        Pat::Struct(pat) => pat.fields.iter_mut().for_each(|f| {
            // A shorthand field (`Login { user, .. }`) prints its pattern
            // alone: written out, it stays a field when its binding goes.
            f.colon_token.get_or_insert_with(Default::default);
            strip(&mut f.pat, keyed, binds);
        }),
        Pat::Slice(pat) => pat.elems.iter_mut().for_each(|p| strip(p, keyed, binds)),
        Pat::Paren(pat) => strip(&mut pat.pat, keyed, binds),
        Pat::Reference(pat) => strip(&mut pat.pat, keyed, binds),
        _ => {}
    }
}

/// The signature a fallback must have, as the user would write it: the
/// fn's own parameters (taken before the expansion changes them), then
/// `limited: RateLimited`, returning the fn's return type.
pub(crate) fn expected_signature(func: &ItemFn, fallback: &syn::Path) -> String {
    let name = fallback.segments.last().map_or_else(
        || render(fallback.to_token_stream()),
        |s| s.ident.to_string(),
    );
    let mut params: Vec<String> = func
        .sig
        .inputs
        .iter()
        .map(|arg| match arg {
            FnArg::Receiver(receiver) => render(receiver.to_token_stream()),
            FnArg::Typed(typed) => {
                let (pat, ty) = (&typed.pat, &typed.ty);
                render(quote!(#pat: #ty))
            }
        })
        .collect();
    let taken = |name: &str| params.iter().any(|p| p.starts_with(&format!("{name}:")));
    let limited = if taken("limited") {
        "rate_limited"
    } else {
        "limited"
    };
    params.push(format!("{limited}: RateLimited"));
    // The parameters in `<..>`; a `where` clause is not repeated.
    let generics = render(func.sig.generics.to_token_stream());
    let output = match &func.sig.output {
        ReturnType::Default => String::new(),
        ReturnType::Type(_, ty) => format!(" -> {}", render(ty.to_token_stream())),
    };
    format!("async fn {name}{generics}({}){output}", params.join(", "))
}

/// What a fallback must return, as far as the expansion can name it.
pub(crate) enum Output {
    /// The fn's return type, as written.
    Named(Box<syn::Type>),
    /// Inferred (`impl Trait`), with the traits the value must implement
    /// that can be named in the fn's body (not those with its generics,
    /// `Self` or lifetimes).
    Inferred(Vec<syn::TraitBound>),
}

/// What `func`'s fallback must return.
pub(crate) fn output(func: &ItemFn) -> Output {
    let ty = match &func.sig.output {
        ReturnType::Default => return Output::Named(Box::new(syn::parse_quote!(()))),
        ReturnType::Type(_, ty) => &**ty,
    };
    if !mentions(ty.to_token_stream(), &["impl"]) {
        return Output::Named(Box::new(ty.clone()));
    }
    let Type::ImplTrait(imp) = ty else {
        return Output::Inferred(Vec::new());
    };
    let mut outer: Vec<String> = vec!["Self".to_owned()];
    outer.extend(func.sig.generics.type_params().map(|p| p.ident.to_string()));
    outer.extend(
        func.sig
            .generics
            .const_params()
            .map(|p| p.ident.to_string()),
    );
    let outer: Vec<&str> = outer.iter().map(String::as_str).collect();
    let bounds = imp
        .bounds
        .iter()
        .filter_map(|bound| match bound {
            TypeParamBound::Trait(bound)
                if bound.maybe.is_none()
                    && bound.lifetimes.is_none()
                    && !mentions(bound.to_token_stream(), &outer)
                    && !has_lifetime(bound.to_token_stream()) =>
            {
                Some(bound.clone())
            }
            _ => None,
        })
        .collect();
    Output::Inferred(bounds)
}

fn has_lifetime(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Punct(punct) => punct.as_char() == '\'',
        TokenTree::Group(group) => has_lifetime(group.stream()),
        _ => false,
    })
}

/// The call of the fallback, an expression of the fn's return type: `args`
/// moved in, then the `RateLimited`. The call goes through a trait of this
/// call site's own, implemented for every async fn of the right shape, whose
/// message is the signature expected: a fallback that does not fit is that
/// one error, at `fallback = path`, and not a type mismatch inside the
/// expansion.
pub(crate) fn call(
    fallback: &syn::Path,
    args: &[Ident],
    out: &Output,
    signature: &str,
    fn_name: &Ident,
) -> TokenStream {
    // The fallback's own name (`later` of `Self::later`): on stable, a
    // path's span is its first segment's, which names only where it is.
    let span = fallback
        .segments
        .last()
        .map_or_else(|| fallback.span(), |segment| segment.ident.span());
    let message = format!("the fallback must be `{signature}`");
    let label = format!(
        "`{}` is called with `{fn_name}`'s arguments and a `RateLimited`, and returns what \
         `{fn_name}` returns",
        render(fallback.to_token_stream())
    );
    let types: Vec<Ident> = (0..=args.len())
        .map(|i| format_ident!("__A{}", i))
        .collect();
    let values: Vec<Ident> = (0..=args.len())
        .map(|i| format_ident!("__a{}", i))
        .collect();
    let args = args
        .iter()
        .map(|ident| Ident::new(&ident.to_string(), span));
    let (out, bounds) = match out {
        Output::Named(ty) => (ty.to_token_stream(), Vec::new()),
        Output::Inferred(bounds) => (quote!(_), bounds.clone()),
    };
    // Named after the fn: the compiler's notes name the trait, and would
    // point at another fn's trait of the same name.
    let name = format_ident!("__RateLimitFallbackOf_{}", fn_name);
    // The call is reported at the fallback. Its callee is located there
    // but resolved in the expansion: clippy takes a callee spanned exactly
    // like an argument for a call of that argument, and would lint an
    // async fallback without `.await` as `unused_async`.
    let callee_span = span.resolved_at(Span::call_site());
    let callee = quote_spanned!(callee_span=> <_ as #name<_, #out, _>>::__ratelimit_call);
    let call = quote_spanned!(span=> #callee(__ratelimit_args, #fallback));
    quote! {{
        // Implemented by the arguments' tuple for a fallback `F` that takes
        // them: the arguments' types are known before `F` is looked at, so
        // a fallback that does not fit is this trait's error (the message
        // above), not a mismatch of the arguments.
        #[allow(non_camel_case_types)]
        #[diagnostic::on_unimplemented(message = #message, label = #label)]
        trait #name<F, Out, Marker> {
            type Future: ::core::future::Future<Output = Out>;
            fn __ratelimit_call(self, fallback: F) -> Self::Future;
        }
        // Two impls, told apart by a marker that is inferred: the compiler
        // then weighs both, and when neither holds it reports the trait,
        // not the bounds of the one impl.
        #[allow(dead_code)]
        struct __RateLimitFits;
        #[allow(dead_code)]
        struct __RateLimitNever;
        trait __RateLimitImpossible {}
        #[diagnostic::do_not_recommend]
        impl<__F, __Fut, #(#types),*> #name<__F, __Fut::Output, __RateLimitFits> for (#(#types,)*)
        where
            __F: ::core::ops::FnOnce(#(#types),*) -> __Fut,
            __Fut: ::core::future::Future,
            #(<__Fut as ::core::future::Future>::Output: #bounds,)*
        {
            type Future = __Fut;
            fn __ratelimit_call(self, fallback: __F) -> __Fut {
                let (#(#values,)*) = self;
                fallback(#(#values),*)
            }
        }
        #[diagnostic::do_not_recommend]
        impl<__F: __RateLimitImpossible, __Args, __Out> #name<__F, __Out, __RateLimitNever> for __Args {
            type Future = ::core::future::Pending<__Out>;
            fn __ratelimit_call(self, _: __F) -> Self::Future {
                ::core::future::pending()
            }
        }
        let __ratelimit_args = (#(#args,)* __ratelimit_limited,);
        #call.await
    }}
}

/// Whether `tokens` name any of `idents`.
pub(crate) fn mentions(tokens: TokenStream, idents: &[&str]) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => idents.iter().any(|name| ident == name),
        TokenTree::Group(group) => mentions(group.stream(), idents),
        _ => false,
    })
}

/// Tokens as a person writes them: `State(app): State<App>`, `&'a str`,
/// `impl Fn(u32) -> String + Send`.
pub(crate) fn render(tokens: TokenStream) -> String {
    let mut out = String::new();
    render_into(tokens, &mut out);
    out.trim().to_owned()
}

fn render_into(tokens: TokenStream, out: &mut String) {
    // Whether the previous token was a word (ident, literal, closing group),
    // so a word after it needs a space.
    let mut after_word = false;
    let mut joint_colon = false;
    for tree in tokens {
        match tree {
            TokenTree::Ident(ident) => {
                if after_word {
                    out.push(' ');
                }
                out.push_str(&ident.to_string());
                after_word = true;
            }
            TokenTree::Literal(lit) => {
                if after_word {
                    out.push(' ');
                }
                out.push_str(&lit.to_string());
                after_word = true;
            }
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                render_into(group.stream(), out);
                out.push_str(close);
                after_word = true;
            }
            TokenTree::Punct(punct) => {
                let c = punct.as_char();
                let joint = punct.spacing() == Spacing::Joint;
                match c {
                    ':' if joint || joint_colon => out.push(':'),
                    ':' | ',' | ';' => {
                        out.push(c);
                        out.push(' ');
                    }
                    '-' if joint => out.push_str(" -"),
                    '>' if out.ends_with(" -") => out.push_str("> "),
                    '=' | '+' | '@' | '|' => {
                        out.push(' ');
                        out.push(c);
                        out.push(' ');
                    }
                    _ => out.push(c),
                }
                joint_colon = c == ':' && joint;
                after_word = false;
                continue;
            }
        }
        joint_colon = false;
    }
    // Collapse the doubled spaces the rules above can leave.
    while out.contains("  ") {
        *out = out.replace("  ", " ");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_types_and_patterns_as_written() {
        let cases = [
            (quote!(State(app): State<App>), "State(app): State<App>"),
            (quote!(x: &'a str), "x: &'a str"),
            (quote!(&mut self), "&mut self"),
            (
                quote!(f: impl Fn(u32) -> String + Send),
                "f: impl Fn(u32) -> String + Send",
            ),
            (
                quote!(m: std::collections::HashMap<String, Vec<u8>>),
                "m: std::collections::HashMap<String, Vec<u8>>",
            ),
            (quote!(a: [u8; 4]), "a: [u8; 4]"),
            (
                quote!(i: impl Iterator<Item = u32>),
                "i: impl Iterator<Item = u32>",
            ),
            (
                quote!(Result<(), Box<dyn std::error::Error>>),
                "Result<(), Box<dyn std::error::Error>>",
            ),
        ];
        for (tokens, written) in cases {
            assert_eq!(render(tokens), written);
        }
    }

    #[test]
    fn the_expected_signature_is_the_fns_own_plus_the_refusal() {
        let func: ItemFn = syn::parse_quote! {
            async fn item<T: Clone>(State(app): State<App>, Path(id): Path<u32>) -> impl IntoResponse {}
        };
        let fallback: syn::Path = syn::parse_quote!(busy);
        assert_eq!(
            expected_signature(&func, &fallback),
            "async fn busy<T: Clone>(State(app): State<App>, Path(id): Path<u32>, \
             limited: RateLimited) -> impl IntoResponse"
        );
        let method: ItemFn = syn::parse_quote! {
            async fn read(&self, limited: u32) {}
        };
        let fallback: syn::Path = syn::parse_quote!(Self::later);
        assert_eq!(
            expected_signature(&method, &fallback),
            "async fn later(&self, limited: u32, rate_limited: RateLimited)"
        );
    }

    #[test]
    fn a_raw_fn_name_makes_a_trait_name() {
        let fallback: syn::Path = syn::parse_quote!(later);
        let name: Ident = syn::parse_quote!(r#type);
        let out = Output::Inferred(Vec::new());
        let tokens = call(&fallback, &[], &out, "async fn later()", &name).to_string();
        assert!(tokens.contains("__RateLimitFallbackOf_type"), "{tokens}");
    }

    #[test]
    fn patterns_get_hidden_names_and_keyed_names_are_bound_by_reference() {
        let mut func: ItemFn = syn::parse_quote! {
            async fn item(State(app): State<App>, Path((id, mut n)): Path<(u32, u32)>, plain: u8) {}
        };
        let (names, by_ref) = bind_arguments(&mut func, &["id".to_owned()]);
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["__ratelimit_arg_0", "__ratelimit_arg_1", "plain"]);
        assert_eq!(
            by_ref.to_string(),
            quote!(let Path((id, _)) = &__ratelimit_arg_1;).to_string()
        );
        let body = func.block.to_token_stream().to_string();
        assert!(
            body.contains(&quote!(let State(app) = __ratelimit_arg_0;).to_string()),
            "{body}"
        );
        assert!(
            body.contains(&quote!(let Path((id, mut n)) = __ratelimit_arg_1;).to_string()),
            "{body}"
        );
    }
}
