// A crate that depends on the runtime under another name, or re-exports it,
// says where it is with `crate = "..."`.
pub extern crate ratelimit_runtime as rl;

mod reexport {
    pub use ::rl as inner;
}

#[rl::rate_limit(crate = "rl", key = "renamed", count = 1)]
async fn renamed() -> Result<(), rl::RateLimited> {
    Ok(())
}

#[reexport::inner::rate_limit(crate = "crate::reexport::inner", key = "reexported", count = 1, by = ip)]
#[actix_web::get("/")]
async fn reexported() -> impl actix_web::Responder {
    "ok"
}

fn main() {
    let _ = renamed();
    let _ = actix_web::App::new().service(reexported);
}
