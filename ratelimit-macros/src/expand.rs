//! Code generation for a checked [`Config`].

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, ReturnType};

use crate::attr::{Config, Handler, Part, Request, RuleConfig, RuleSource, Subject};
use crate::fallback;

/// The attribute's entry point: on any error, the user's fn is emitted
/// unchanged next to the errors, so the IDE keeps working.
pub(crate) fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new(Span::call_site(), "`#[rate_limit]` goes on an `async fn`")
                .into_compile_error();
            return quote!(#item #error);
        }
    };
    // `parse` takes the stacked `#[rate_limit]`s off `func`, so the fn
    // emitted on error does not report them again.
    match Config::parse(args, &mut func) {
        Ok(config) => expand(config, func),
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#func #error)
        }
    }
}

fn expand(config: Config, mut func: ItemFn) -> TokenStream {
    let krate = &config.krate;
    let rt = quote!(#krate::__private);
    // The fn as written (without its `#[rate_limit]`s), and what each
    // rule's fallback must look like, before the expansion changes it.
    let original = func.clone();
    let signatures: Vec<Option<String>> = config
        .rules
        .iter()
        .map(|rule| {
            let fallback = rule.fallback.as_ref()?;
            Some(fallback::expected_signature(&original, fallback))
        })
        .collect();
    // The fn's own arguments, for fallbacks (taken before a request
    // parameter is added); patterns are bound to hidden names.
    let (forwarded, keyed_by_ref) = if config.rules.iter().any(|r| r.fallback.is_some()) {
        fallback::bind_arguments(&mut func, &keyed_names(&config))
    } else {
        (Vec::new(), TokenStream::new())
    };
    let request = config.request.as_ref().map(|request| match request {
        Request::Param(ident) => ident.clone(),
        Request::Injected => {
            // First (after `self`): axum wants a body extractor last.
            let ident = Ident::new("__ratelimit_call", Span::call_site());
            let at = usize::from(matches!(func.sig.inputs.first(), Some(FnArg::Receiver(_))));
            func.sig
                .inputs
                .insert(at, syn::parse_quote!(#ident: #rt::http::HttpCall));
            ident
        }
    });

    let n = config.rules.len();
    let mut arms: Vec<TokenStream> = Vec::new();
    let mut entries: Vec<TokenStream> = Vec::new();
    let checks = config.rules.iter().enumerate().map(|(i, rule)| {
        let site = format_ident!("__RATELIMIT_SITE_{}", i);
        let permit = format_ident!("__ratelimit_permit_{}", i);
        let registered = format_ident!("__RATELIMIT_SITE_REGISTERED_{}", i);
        let cost = rule.cost;
        let site_expr = site_expr(rule, &rt);
        let cost_check = match &rule.rule {
            RuleSource::Const(path) => quote_spanned! {rule.cost_span=>
                const _: () = ::core::assert!(
                    #cost <= #path.capacity(),
                    "`cost` is over the rule's capacity: such a call could never pass"
                );
            },
            RuleSource::Inline { .. } => TokenStream::new(),
        };
        let wait_check = match (&rule.rule, &rule.wait) {
            (RuleSource::Const(path), Some((_, value))) => {
                let message = crate::attr::WAIT_ALGORITHM;
                quote_spanned! {value.span()=>
                    const _: () = ::core::assert!(#path.algorithm().has_burst(), #message);
                }
            }
            _ => TokenStream::new(),
        };
        let check = check_call(rule, &site, &rt, request.as_ref());
        let reject = reject(
            rule,
            &config,
            &original,
            &forwarded,
            signatures[i].as_deref(),
            &rt,
        );
        let passed = if config.responder {
            quote! {{
                __ratelimit_seen[#i] = #rt::Option::Some(*__ratelimit_permit.report());
                __ratelimit_permit
            }}
        } else {
            quote!(__ratelimit_permit)
        };
        // A header a rule is keyed by: a handler's request keeps its value.
        let header = match &rule.subject {
            Subject::Header(name) => {
                let registered = format_ident!("__RATELIMIT_HEADER_REGISTERED_{}", i);
                quote! {
                    #[#rt::linkme::distributed_slice(#rt::HEADER_SUBJECTS)]
                    #[linkme(crate = #rt::linkme)]
                    static #registered: &str = #name;
                }
            }
            _ => TokenStream::new(),
        };
        let statics = quote! {
            #cost_check
            #wait_check
            #header
            static #site: #rt::Site = #site_expr;
            // Registered by the linker, for overrides by name.
            #[#rt::linkme::distributed_slice(#rt::SITES)]
            #[linkme(crate = #rt::linkme)]
            static #registered: &#rt::Site = &#site;
        };
        if n == 1 {
            return quote! {
                #statics
                let #permit = match #check.await {
                    #rt::Result::Ok(__ratelimit_permit) => #passed,
                    #rt::Result::Err(__ratelimit_limited) => #reject,
                };
            };
        }
        // Stacked rules: the statics here, one check of the set below.
        let _ = permit;
        let place = if i + 1 == n { quote!(_) } else { quote!(#i) };
        arms.push(quote!(#rt::Result::Err((#place, __ratelimit_limited)) => #reject,));
        entries.push(set_entry(rule, &site, &rt, request.is_some()));
        statics
    });
    let mut checks: Vec<TokenStream> = checks.collect();
    if n > 1 {
        // One decision for every rule: all pass and all are charged, or
        // none is. The passes live until the body has run.
        let check = match &request {
            Some(call) => quote! {
                #rt::http::check_all(&[#(#entries),*], &#call, &mut __ratelimit_seen)
            },
            None => quote!(#rt::check_all(&[#(#entries),*], &mut [])),
        };
        checks.push(quote! {
            let __ratelimit_passes = match #check.await {
                #rt::Result::Ok(__ratelimit_passes) => __ratelimit_passes,
                #(#arms)*
            };
        });
    }

    let body = &func.block;
    // The permits live until the body has run: concurrency leases are
    // released when they drop.
    let block = if config.responder {
        let call = request.as_ref().expect("handlers always have the request");
        let typed = config.original_output.as_ref().map(|ty| quote!(: #ty));
        // The expansion answers `Reply<T>` (`Reply<T, F>` with a fallback
        // answering `F`): the body's value, or the fallback's, with the
        // rate-limit fields of every rule, or the refusal. `T` and `F` are
        // the fn's return type as written (`impl Trait` stays one each);
        // `Reply` is a response in each framework whose trait they meet.
        // The body runs in an async block, so `return` in it still gives
        // the body's value.
        let written = match &func.sig.output {
            ReturnType::Type(_, ty) => quote!(#ty),
            ReturnType::Default => quote!(()),
        };
        let output = if config.rules.iter().any(|rule| rule.fallback.is_some()) {
            quote!(#rt::http::Reply<#written, #written>)
        } else {
            quote!(#rt::http::Reply<#written>)
        };
        func.sig.output = syn::parse_quote!(-> #output);
        // The request for the response: the handler's own parameter may move
        // into the body, so a clone of it; one the expansion added is the
        // body's to use, so that itself.
        let reply_call = match config.request {
            Some(Request::Injected) => quote!(let __ratelimit_reply_call = &#call;),
            _ => quote!(let __ratelimit_reply_call = &::core::clone::Clone::clone(&#call);),
        };
        quote!({
            #reply_call
            #keyed_by_ref
            let mut __ratelimit_seen: [#rt::Option<#rt::http::Report>; #n] = [#rt::Option::None; #n];
            #(#checks)*
            let __ratelimit_out #typed = async move #body.await;
            #rt::http::Reply::allowed(__ratelimit_out, &__ratelimit_seen, __ratelimit_reply_call)
        })
    } else {
        // The body's statements follow the checks in the same block: the
        // body as a block of its own would be a block in tail position, and
        // a one-line fn's braces would be linted in the user's code
        // (`unused_braces`).
        let stmts = &body.stmts;
        quote!({
            #keyed_by_ref
            #(#checks)*
            #(#stmts)*
        })
    };
    *func.block = syn::parse2(block).expect("the expansion is a block");
    match &config.handler {
        Some(handler) => http_handler(handler, &rt, func, original),
        None => func.into_token_stream(),
    }
}

/// A handler's expansion goes through the runtime's `http_handler!`, which
/// keeps it with the `actix` or `axum` feature, and without them answers a
/// compile error naming them, next to the fn as written.
fn http_handler(
    handler: &Handler,
    rt: &TokenStream,
    func: ItemFn,
    original: ItemFn,
) -> TokenStream {
    let message = format!(
        "{} makes `{}` an HTTP handler, which needs the `actix` or `axum` feature of \
         `ratelimit-runtime`: add `features = [\"axum\"]` (or `\"actix\"`) to its entry in \
         Cargo.toml",
        handler.why, original.sig.ident
    );
    let span = handler.span;
    let mut group = proc_macro2::Group::new(
        proc_macro2::Delimiter::Brace,
        quote!(#message { #func } { #original }),
    );
    group.set_span(span);
    let path = respan(quote!(#rt::http_handler!), span);
    quote!(#path #group)
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tree| {
            if let proc_macro2::TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(group.stream(), span));
                inner.set_span(span);
                tree = inner.into();
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// The names the rules' keys take from the fn's parameters.
fn keyed_names(config: &Config) -> Vec<String> {
    let mut names = Vec::new();
    for rule in &config.rules {
        for part in &rule.key {
            if let Part::Value(tokens) = part
                && let Ok(ident) = syn::parse2::<Ident>(tokens.clone())
            {
                names.push(ident.to_string());
            }
        }
    }
    names
}

fn rule_expr(source: &RuleSource, rt: &TokenStream) -> TokenStream {
    match source {
        RuleSource::Const(path) => path.to_token_stream(),
        RuleSource::Inline {
            variant,
            count,
            period_ms,
            burst,
        } => {
            let variant = Ident::new(variant, Span::call_site());
            let burst = burst.map(|b| quote!(.with_burst(#b)));
            quote! {
                #rt::Rule::new(#rt::Algorithm::#variant, #count, #rt::Duration::from_millis(#period_ms))#burst
            }
        }
    }
}

/// The check of one rule: through the request for a handler (the app's
/// limiter, the client's address), else with the full key.
fn check_call(
    rule: &RuleConfig,
    site: &Ident,
    rt: &TokenStream,
    request: Option<&Ident>,
) -> TokenStream {
    let key = key_expr(rule, rt);
    match request {
        Some(call) => {
            let by = match &rule.subject {
                Subject::Global => quote!(#rt::http::By::Global),
                Subject::Ip => quote!(#rt::http::By::Ip),
                Subject::Header(name) => quote!(#rt::http::By::Header(#name)),
            };
            quote!(#rt::http::check(&#site, #key, #by, &#call))
        }
        None => quote!(#rt::check(&#site, #key)),
    }
}

/// One rule's entry in the check of stacked rules: its site and key (and
/// for a handler, whose subject).
fn set_entry(rule: &RuleConfig, site: &Ident, rt: &TokenStream, handler: bool) -> TokenStream {
    let key = key_expr(rule, rt);
    if !handler {
        return quote!((&#site, #key));
    }
    let by = match &rule.subject {
        Subject::Global => quote!(#rt::http::By::Global),
        Subject::Ip => quote!(#rt::http::By::Ip),
        Subject::Header(name) => quote!(#rt::http::By::Header(#name)),
    };
    quote!((&#site, #key, #by))
}

/// The rule's `Site`: its name and rule, and the options written.
fn site_expr(rule: &RuleConfig, rt: &TokenStream) -> TokenStream {
    let name = &rule.name;
    let mut rule_expr = rule_expr(&rule.rule, rt);
    if let Some((block, span)) = rule.local_quota {
        rule_expr = quote_spanned!(span=> #rule_expr.with_local_quota(#block));
    }
    if rule.subject_limits {
        rule_expr = quote!(#rule_expr.with_subject_limits());
    }
    let mut site = quote!(#rt::Site::new(#name, #rule_expr));
    if rule.cost != 1 {
        let cost = rule.cost;
        site.extend(quote!(.with_cost(#cost)));
    }
    if let Some(limiter) = &rule.limiter {
        site.extend(quote!(.with_limiter(#limiter)));
    }
    if let Some(variant) = rule.on_error {
        let variant = Ident::new(variant, Span::call_site());
        site.extend(quote!(.with_on_error(#rt::OnError::#variant)));
    }
    if rule.shadow {
        site.extend(quote!(.with_shadow(true)));
    }
    if let Some((ms, _)) = &rule.wait {
        site.extend(quote!(.with_wait(::core::time::Duration::from_millis(#ms))));
    }
    if let Some(prefix) = &rule.prefix {
        site.extend(quote!(.with_prefix(#prefix)));
    }
    if let Some(keyed_as) = &rule.keyed_as {
        let keyed_as = static_key(keyed_as, rt);
        site.extend(quote!(.keyed_as(#keyed_as)));
    }
    site
}

/// Whether the rule's key depends on the call (a placeholder's value).
fn is_dynamic(rule: &RuleConfig) -> bool {
    rule.key.iter().any(|part| matches!(part, Part::Value(_)))
}

/// The rule's key (before any `by = ip`/`header` subject), as a `&str`: one
/// `&'static str` built at compile time when nothing in it depends on the call.
fn key_expr(rule: &RuleConfig, rt: &TokenStream) -> TokenStream {
    if !is_dynamic(rule) {
        return static_key(&rule.key, rt);
    }
    let mut format = String::new();
    let mut args = Vec::new();
    for part in &rule.key {
        match part {
            Part::Text(text) => format.push_str(&text.replace('{', "{{").replace('}', "}}")),
            Part::ModulePath => {
                format.push_str("{}");
                args.push(quote!(::core::module_path!()));
            }
            Part::Runtime(name) => {
                format.push_str("{}");
                let name = Ident::new(name, Span::call_site());
                args.push(quote!(#rt::#name));
            }
            Part::Value(value) => {
                // The caller's value: long or odd ones are digested.
                format.push_str("{}");
                args.push(quote!(#rt::SafePart(#rt::format!("{}", #value))));
            }
        }
    }
    quote!(&#rt::format!(#format #(, #args)*))
}

/// Parts that do not depend on the call, as one `&'static str` made at
/// compile time.
fn static_key(parts: &[Part], rt: &TokenStream) -> TokenStream {
    let pieces = parts.iter().map(|part| match part {
        Part::Text(text) => quote!(#text),
        Part::ModulePath => quote!(::core::module_path!()),
        Part::Runtime(name) => {
            let name = Ident::new(name, Span::call_site());
            quote!(#rt::#name)
        }
        Part::Value(_) => unreachable!("not dynamic"),
    });
    quote!(#rt::static_key!(#(#pieces),*))
}

/// What the fn returns when the call is rejected (an expression of type `!`).
fn reject(
    rule: &RuleConfig,
    config: &Config,
    func: &ItemFn,
    forwarded: &[Ident],
    signature: Option<&str>,
    rt: &TokenStream,
) -> TokenStream {
    let value = match (&rule.fallback, signature) {
        (Some(fallback), Some(signature)) => {
            // What the fallback answers: the fn's return type as written,
            // named where it can be, so a wrong one is the fallback's error.
            let out = fallback::output(func);
            fallback::call(fallback, forwarded, &out, signature, &func.sig.ident)
        }
        _ if config.responder => {
            return quote! {
                return #rt::http::Reply::refused(__ratelimit_limited, &__ratelimit_seen, __ratelimit_reply_call)
            };
        }
        _ => {
            // Named, the return type carries the user's span: a type that
            // cannot report a rejection is an error there. A type with
            // `impl` in it cannot be named; inference finds it.
            return match &func.sig.output {
                ReturnType::Type(_, ty)
                    if crate::fallback::mentions(ty.to_token_stream(), &["impl"]) =>
                {
                    quote_spanned!(ty.span()=> return #rt::reject(__ratelimit_limited))
                }
                ReturnType::Type(_, ty) => {
                    quote_spanned!(ty.span()=> return <#ty as #rt::Reject>::reject(__ratelimit_limited))
                }
                ReturnType::Default => {
                    let unit = quote_spanned!(func.sig.ident.span()=> ());
                    quote!(return <#unit as #rt::Reject>::reject(__ratelimit_limited))
                }
            };
        }
    };
    if config.responder {
        quote! {
            return #rt::http::Reply::demoted(#value, &__ratelimit_limited, &__ratelimit_seen, __ratelimit_reply_call)
        }
    } else {
        quote!(return #value)
    }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        super::rate_limit(args, item).to_string()
    }

    #[test]
    fn crate_option_replaces_every_path_to_the_runtime() {
        let out = expand(
            quote!(crate = "my::limits", key = "k:{id}", count = 3, by = ip),
            quote!(
                #[actix_web::get("/")]
                async fn h(id: u32) -> impl Responder {
                    "x"
                }
            ),
        );
        assert!(out.contains("my :: limits :: __private"), "{out}");
        assert!(!out.contains("ratelimit_runtime"), "{out}");
    }

    #[test]
    fn a_static_key_is_one_literal_and_the_rule_is_a_static() {
        let out = expand(
            quote!(key = "k", count = 3),
            quote!(
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        // One `&'static str` made at compile time, under the runtime's
        // default prefix (the key grammar is written once, in the runtime).
        assert!(
            out.contains(
                r#"static_key ! (:: ratelimit_runtime :: __private :: DEFAULT_PREFIX , "k")"#
            ),
            "{out}"
        );
        assert!(
            !out.contains("format"),
            "no allocation for a static key: {out}"
        );
        assert!(out.contains("static __RATELIMIT_SITE_0"), "{out}");
    }

    /// The framework is not guessed from names: another framework's route
    /// attribute (rocket's, poem's `#[get]`) leaves the expansion as it is.
    #[test]
    fn an_attribute_named_get_changes_nothing() {
        for args in [
            quote!(key = "k", count = 3),
            quote!(key = "k", count = 3, by = ip),
        ] {
            let bare = expand(
                args.clone(),
                quote!(
                    async fn f() -> Result<String, E> {
                        Ok(String::new())
                    }
                ),
            );
            let routed = expand(
                args,
                quote!(
                    #[get("/")]
                    async fn f() -> Result<String, E> {
                        Ok(String::new())
                    }
                ),
            );
            assert_eq!(routed.replace(r#"# [get ("/")] "#, ""), bare);
        }
    }

    #[test]
    fn stacked_rules_are_checked_in_the_order_written() {
        let out = expand(
            quote!(key = "first", count = 1),
            quote!(
                #[rate_limit(key = "second", count = 2)]
                async fn f() -> Result<(), E> {
                    Ok(())
                }
            ),
        );
        let first = out
            .find(r#"DEFAULT_PREFIX , "first")"#)
            .expect("first rule");
        let second = out
            .find(r#"DEFAULT_PREFIX , "second")"#)
            .expect("second rule");
        assert!(first < second, "{out}");
        assert!(
            !out.contains("# [rate_limit"),
            "the stacked attribute is consumed: {out}"
        );
    }
}
