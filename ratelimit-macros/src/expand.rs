//! Code generation for a checked [`Config`].

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType};

use crate::attr::{Config, Key, Part};

/// The attribute's entry point: on any error, the user's fn is emitted
/// unchanged next to the errors, so the IDE keeps working.
pub(crate) fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "`#[rate_limit]` goes on an `async fn`")
                .into_compile_error();
            return quote!(#item #error);
        }
    };
    match Config::parse(args, &func).and_then(|config| expand(config, func.clone())) {
        Ok(expanded) => expanded,
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#func #error)
        }
    }
}

fn expand(config: Config, mut func: ItemFn) -> syn::Result<TokenStream> {
    let rt = quote!(::ratelimit_runtime::__private);
    let count = config.count;
    let period_ms = config.period_ms;
    let key = key_expr(&config.key, &rt);
    let reject = reject(&config, &func, &rt)?;
    let body = &func.block;
    let block = quote!({
        const __RATELIMIT_RULE: #rt::Rule =
            #rt::Rule::fixed_window(#count, #rt::Duration::from_millis(#period_ms));
        if let #rt::Option::Some(__ratelimit_limited) =
            #rt::check(&__RATELIMIT_RULE, #key).await
        {
            #reject
        }
        #body
    });
    *func.block = syn::parse2(block)?;
    Ok(quote!(#func))
}

/// The call's full key: a `&'static str` when it is known at compile time.
fn key_expr(key: &Key, rt: &TokenStream) -> TokenStream {
    match key {
        Key::Static(text) => quote!(#text),
        Key::FnPath { prefix, name } => {
            quote!(::core::concat!(#prefix, ::core::module_path!(), "::", #name))
        }
        Key::Template(parts) => {
            let mut format = String::new();
            let mut args = Vec::new();
            for part in parts {
                match part {
                    Part::Text(text) => {
                        format.push_str(&text.replace('{', "{{").replace('}', "}}"))
                    }
                    Part::Param(param) => {
                        format.push_str("{}");
                        args.push(param);
                    }
                }
            }
            quote!(&#rt::format!(#format #(, #args)*))
        }
    }
}

/// What the fn returns when the call is rejected.
fn reject(config: &Config, func: &ItemFn, rt: &TokenStream) -> syn::Result<TokenStream> {
    if let Some(fallback) = &config.fallback {
        // The forwarded arguments carry the fallback's span, so a signature
        // that does not fit is reported at `fallback = path`.
        let span = fallback.span();
        let args = func.sig.inputs.iter().map(|arg| match arg {
            FnArg::Receiver(_) => quote_spanned!(span=> self),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => Ident::new(&pat.ident.to_string(), span).into_token_stream(),
                // `attr` rejected other patterns already.
                other => quote!(#other),
            },
        });
        return Ok(quote_spanned! {fallback.span()=>
            return #fallback(#(#args,)* __ratelimit_limited).await;
        });
    }
    let ty = match &func.sig.output {
        ReturnType::Type(_, ty) => quote!(#ty),
        ReturnType::Default => quote_spanned!(func.sig.ident.span()=> ()),
    };
    if names_impl_trait(ty.clone()) {
        return Err(syn::Error::new_spanned(
            &func.sig.output,
            "`#[rate_limit]` cannot report a rejection through a return type with `impl Trait`; \
             choose one: add `fallback = path` to the attribute, return `Result<_, E>` where \
             `E: From<RateLimited>`, or make the fn an actix-web handler",
        ));
    }
    Ok(quote_spanned! {ty.span()=>
        return <#ty as #rt::Reject>::reject(__ratelimit_limited);
    })
}

fn names_impl_trait(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|tree| match tree {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => names_impl_trait(group.stream()),
        _ => false,
    })
}
