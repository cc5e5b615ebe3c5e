//! The `#[rate_limit]` attribute. Use it through `ratelimit-runtime`, which
//! re-exports it; this crate holds no rate-limiting logic.
#![deny(missing_docs)]

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Limits how often an `async fn` runs: the budget is checked and consumed
/// before the body, and a rejected call takes the demote path instead.
///
/// # Syntax
///
/// ```text
/// #[rate_limit(count = N [, period = P] [, key = "..."] [, prefix = "..."] [, fallback = path])]
/// ```
///
/// # Arguments
///
/// - `count = N` (required): calls allowed per period, 1 to 1,000,000,000.
/// - `period = P`: the window, as whole seconds (`period = 10`) or a string
///   with a unit: `"500ms"`, `"10s"`, `"1m"`, `"1h"`. Default: 1 second.
/// - `key = "..."`: the rule's name, shared by every fn that uses it. It may
///   hold `{param}` placeholders naming the fn's parameters, rendered with
///   `Display` (`key = "login:{user}"` gives each user a budget); `{{` and
///   `}}` are literal braces. Default: the fn's module path and name.
/// - `prefix = "..."`: put before the key (the Redis key namespace).
///   Default: `"limiter:"`.
/// - `fallback = path`: the demote path. An `async fn` called with the fn's
///   own arguments (`self` first for methods) plus a `RateLimited`, returning
///   the fn's return type.
///
/// # Notes
///
/// - Only `async fn`s: the check awaits the limiter before the body runs.
/// - A rejected call returns the `fallback`'s value if there is one;
///   otherwise the fn must return `Result<T, E>` with `E: From<RateLimited>`
///   (`RateLimited` itself, `Box<dyn Error>`, `anyhow::Error`, ...) and gets
///   `Err(RateLimited.into())`. Any other return type is a compile error.
/// - A rejected call consumes nothing; its `RateLimited` says when to retry.
/// - The check uses the global limiter (`RateLimiter::install`), in memory
///   unless one was installed.
/// - Mistakes are compile errors at the offending token: `count = 0`, a bad
///   period, an unknown or repeated option, a placeholder naming no parameter.
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
///     format!("{format} export queued; next slot in {} s", limited.retry_after.as_secs())
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
/// # What it expands to
///
/// For `#[rate_limit(key = "report:{user_id}", count = 2, period = "1m")]`,
/// the body becomes, in outline:
///
/// ```text
/// const __RATELIMIT_RULE: Rule = Rule::fixed_window(2, Duration::from_millis(60000));
/// if let Some(limited) = check(&__RATELIMIT_RULE, &format!("limiter:report:{}", user_id)).await {
///     return <Result<String, RateLimited> as Reject>::reject(limited); // Err(limited.into())
/// }
/// /* the original body */
/// ```
///
/// A key without placeholders is a single `&'static str` and allocates
/// nothing per call; the rule is a `const`. Everything else of the fn
/// (attributes, docs, visibility, generics) is kept as written.
#[proc_macro_attribute]
pub fn rate_limit(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::rate_limit(args.into(), item.into()).into()
}
