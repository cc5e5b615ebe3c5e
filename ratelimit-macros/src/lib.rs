//! The `#[rate_limit]` attribute. Use it through `ratelimit-runtime`, which
//! re-exports it; this crate holds no rate-limiting logic.
#![deny(missing_docs)]

mod attr;
mod expand;
mod fallback;
mod key;
mod options;

use proc_macro::TokenStream;

/// Limits how often an `async fn` runs: the budget is checked and consumed
/// before the body, and a rejected call is answered without running the body (an error, a 429, or the fallback).
///
/// # Syntax
///
/// ```text
/// #[rate_limit(count = N [, period = P] [, key = "..."] [, by = ...] [, algorithm = ...] [, ...])]
/// #[rate_limit(rule = CONST [, key = "..."] [, by = ...] [, ...])]
/// ```
///
/// # Arguments
///
/// - `key = "..."`: the rule's name; fns with the same key (and prefix) share
///   one budget. `{param}` placeholders render the fn's parameters with
///   `Display` (`key = "login:{user}"`), `{self.field}` a field of the
///   receiver; `{{` and `}}` are literal braces. Default: the fn's module
///   path and name. Two placeholders need a character that values never
///   hold between them, such as `:` (`"{a}:{b}"`, not `"{a}-{b}"`, where
///   `("x-y", "z")` and `("x", "y-z")` would share a budget): a compile
///   error says so. Values are used as they are, case included: `Bob` and
///   `bob` are two budgets, so normalise them before the call
///   (`login(&user.to_lowercase())`) where they name one thing.
/// - `prefix = "..."`: put before the key (the Redis key namespace).
///   Default `"limiter:"`.
/// - `count = N`: units allowed per period, 1 to 1,000,000,000 (for
///   `concurrency`: calls in flight). Required unless `rule` is given.
/// - `period = N` or `"500ms"`, `"10s"`, `"1m"`, `"1h"`: whole seconds or a
///   string with a unit. Default 1 s. For `concurrency`, how long a lease
///   lasts if its call never ends.
/// - `by = global | ip | header("name") | arg(param)`: whose budget. `global`
///   (the default) is one for all callers; `ip` is per client address and
///   `header("x-api-key")` per header value (HTTP handlers, below; requests
///   without the header share one budget; header values are compared as
///   sent, case included); `arg(user)` per value of a parameter (likewise). The subject is added to the key (`limiter:search:ip:1.2.3.4`).
/// - `algorithm = fixed_window | sliding_window | sliding_log | token_bucket | gcra | concurrency`:
///   default `fixed_window`. See the runtime's README for what each guarantees.
/// - `burst = N`: the bucket of `token_bucket` or `gcra` (default `count`);
///   an error for the other algorithms.
/// - `cost = N`: units one call takes (default 1); over the capacity
///   (`burst` or `count`) is a compile error.
/// - `fallback = path`: what a refused call answers instead of running the
///   body: an `async fn` called with the fn's own arguments (`self` first
///   for methods) and a `RateLimited`, returning the fn's return type. A
///   parameter written as a pattern (axum's `State(app): State<App>`) is
///   handed on whole: the fallback takes the same extractors. One that does
///   not fit is an error at the path that states the signature expected.
/// - `on_error = allow | deny | local`: when the backend fails or times out,
///   let the call through, refuse it (`RateLimited::is_backend_failure()`;
///   503 from an HTTP handler), or check it in process memory. Default:
///   the limiter's `on_backend_error` (`local`).
/// - `limiter = "name"`: use the limiter installed with
///   `RateLimiter::install_as("name")` instead of the global one. If none is
///   installed under that name, the call is treated as a backend failure.
/// - `rule = CONST`: a `const Rule` defined elsewhere, instead of `count`,
///   `period`, `algorithm` and `burst`.
/// - `shadow`: check and record (a `tracing` event), never refuse: for
///   rolling out a new limit.
/// - `wait = N` or `"500ms"`, `"2s"`: a call over the limit waits its
///   turn for up to that long, then runs, instead of being refused: for
///   calls *out* to a service with a limit of its own. The turn is
///   reserved atomically (one round trip to Redis): calls of every
///   process go in the order they reserved, spaced as the rule says. A
///   call that cannot go within the wait is refused at once, and a caller
///   that stops waiting (a dropped future, a timeout) gives its turn back.
///   Needs `algorithm = gcra` or `token_bucket` (a window or `concurrency`
///   keeps no turn to reserve); a compile error on an HTTP handler (its
///   client would wait on an open connection: refuse with 429 instead) and
///   on stacked rules. On a limiter with a custom `Backend` (it keeps no
///   turns) calls are checked without waiting, as in shadow mode: one over
///   the limit is refused (a `tracing` warning says so once). See
///   `RateLimiter::until_ready`.
/// - `local_quota = N`: on Redis, each instance takes blocks of up to `N`
///   units from the shared budget in one call and serves calls from them in
///   process (`Rule::with_local_quota`), for hot keys. `fixed_window`,
///   `token_bucket` and `gcra` only; at most the capacity (`burst` or
///   `count`).
/// - `subject_limits`: a check first reads the limit its subject may have
///   of its own, set with `RateLimiter::set_subject_limit_named` (or on
///   Redis with `redis-cli`), in place of `count` and `burst`
///   (`Rule::with_subject_limits`). Not with `local_quota`.
/// - `crate = "path"`: where the runtime is, for crates that re-export it or
///   depend on it under another name. Default `::ratelimit_runtime`.
///
/// # Notes
///
/// - Only `async fn`s (free, methods with `&self`/`&mut self`, in inherent
///   and trait impls, generic): the check awaits the limiter first.
/// - What a rejected call returns: the `fallback`'s value if there is one;
///   otherwise, for `Result<T, E>` with `E: From<RateLimited>` (`RateLimited`,
///   `Box<dyn Error + Send + Sync>`, `anyhow::Error`, `actix_web::Error`, ...),
///   `Err(RateLimited.into())`; for an HTTP handler, a `429 Too Many
///   Requests` with `Retry-After`; for `HttpResponse` (actix-web) or
///   `Response` (axum), the same. Any other return type is a compile error
///   listing these choices.
/// - HTTP handlers (features `actix`, `axum`): a fn whose rule charges a
///   client's budget (`by = ip`, `by = header(..)`), or that returns
///   `impl Responder` (actix-web) or `impl IntoResponse` (axum). The macro
///   adds an `HttpCall` extractor as its first parameter (or uses the fn's
///   own) and makes it return `Reply<T>`: the value, or the fallback's,
///   with the rate-limit headers of every rule, or the refusal. Its other
///   attributes (a route attribute, whatever its name) change nothing.
/// - Stacked attributes are one decision, checked before the body: the call
///   passes only if every rule allows it, and then takes from every rule;
///   if any refuses, none is charged, and the refusal is that rule's (the
///   one with the longest `retry_after`). Two rules of one fn may not share
///   a key, and all name the same `limiter` (or none).
/// - A `concurrency` rule holds its units while the body runs; they are
///   released when the call ends, also by error, panic or cancellation.
/// - HTTP handlers need the runtime's `actix` or `axum` feature; without
///   them, a handler is a compile error that names them.
/// - Mistakes are compile errors at the offending token, and the fn is still
///   emitted unchanged so the rest of the code type-checks. The expansion
///   fires no lint in the user's code (`-D warnings` builds).
///
/// # Examples
///
/// ```
/// use ratelimit_runtime::{rate_limit, RateLimited};
///
/// #[rate_limit(key = "report:{user_id}", count = 2, period = "1m")]
/// async fn report(user_id: u64) -> Result<String, RateLimited> {
///     Ok(format!("report for {user_id}"))
/// }
///
/// #[rate_limit(key = "export", count = 1, period = 60, fallback = export_later)]
/// async fn export(format: &str) -> String {
///     format!("exported as {format}")
/// }
///
/// async fn export_later(format: &str, limited: RateLimited) -> String {
///     format!("{format} export queued; next slot in {} s", limited.retry_after_secs())
/// }
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # assert!(report(7).await.is_ok());
/// # assert!(report(7).await.is_ok());
/// # assert!(report(7).await.is_err());
/// # assert!(report(8).await.is_ok());
/// # assert_eq!(export("csv").await, "exported as csv");
/// # assert!(export("csv").await.starts_with("csv export queued"));
/// # }
/// ```
///
/// An actix-web handler, limited per client address (feature `actix`):
///
/// ```
/// use actix_web::{get, Responder};
/// use ratelimit_runtime::rate_limit;
///
/// #[rate_limit(key = "ip_limit_test", period = 10, count = 3, by = ip)]
/// #[get("/limitTest3")]
/// async fn limit_test3() -> impl Responder {
///     "3"
/// }
/// # let _ = actix_web::App::new().service(limit_test3);
/// ```
///
/// # What it expands to
///
/// For `#[rate_limit(key = "report:{user_id}", count = 2, period = "1m")]`
/// the body becomes, in outline:
///
/// ```text
/// static __RATELIMIT_SITE_0: Site = Site::new("report:{user_id}",
///     Rule::new(Algorithm::FixedWindow, 2, Duration::from_millis(60000)));
///     // options other than the defaults follow: `.with_cost(..)`, `.with_prefix(..)`, ...
/// let __ratelimit_permit_0 = match check(&__RATELIMIT_SITE_0, &format!("limiter:report:{}", user_id)).await {
///     Ok(pass) => pass, // held until the body has run
///     Err(limited) => return <Result<String, RateLimited> as Reject>::reject(limited), // Err(limited.into())
/// };
/// /* the original body */
/// ```
///
/// `check` is the runtime's decision pipeline (crate-private, reached through
/// `__private`), the same one its HTTP middleware uses.
///
/// Paths are absolute (`::ratelimit_runtime::__private::...`). A key without
/// placeholders is one `&'static str` built at compile time, so a call
/// allocates nothing for it; the rule is a `static`. The attribute costs
/// about what the same check written by hand costs (`cargo bench -p
/// ratelimit-benches --bench attribute`). Everything else of the fn (attributes, docs, visibility,
/// generics, lifetimes) is kept as written.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::rate_limit(args.into(), item.into()).into()
}
