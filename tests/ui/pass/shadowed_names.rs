// The expansion uses absolute paths only: items named like std's, core's or
// the runtime's own do not break it.
#![allow(dead_code, non_camel_case_types)]
use ratelimit_runtime::{rate_limit, RateLimited};

mod std {}
mod core {}
struct Option;
struct Some;
struct None;
struct Ok;
struct Err;
struct Duration;
struct Rule;
struct Site;
struct String;
type Result<T> = ::core::result::Result<T, RateLimited>;
fn format() {}
fn check() {}
fn concat() {}
fn module_path() {}

#[rate_limit(key = "shadow:{id}", count = 1, period = 1, algorithm = gcra, on_error = allow)]
async fn shadowed(id: u8) -> Result<u8> {
    ::core::result::Result::Ok(id)
}

#[rate_limit(count = 1)]
async fn default_key() -> Result<()> {
    ::core::result::Result::Ok(())
}

fn main() {
    let _ = shadowed(1);
    let _ = default_key();
}
