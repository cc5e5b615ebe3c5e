//! actix-web support (feature `actix`): a refused call answers `429 Too Many
//! Requests` (or `503` when the limiter's backend failed under the `deny`
//! policy) with `Retry-After`, and `by = ip` / `by = header(..)` read the
//! request.

use std::fmt::Write as _;

use actix_web::body::BoxBody;
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use actix_web::{HttpRequest, HttpResponse, Responder, ResponseError};

use crate::RateLimited;

/// `429 Too Many Requests` (`503 Service Unavailable` for a backend failure
/// under the `deny` policy), with `Retry-After` in whole seconds and a plain
/// text body. So `actix_web::Error: From<RateLimited>`, and a handler
/// returning `Result<_, actix_web::Error>` answers this when limited.
impl ResponseError for RateLimited {
    fn status_code(&self) -> StatusCode {
        if self.is_backend_failure() {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            StatusCode::TOO_MANY_REQUESTS
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.insert_header((RETRY_AFTER, HeaderValue::from(self.retry_after_secs())));
        response.insert_header((
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        ));
        if self.is_backend_failure() {
            response.body("Service Unavailable: the rate limiter cannot decide; try again later\n")
        } else {
            response.body(format!(
                "Too Many Requests: try again in {} s\n",
                self.retry_after_secs()
            ))
        }
    }
}

/// A `RateLimited` returned from a handler is its 429 (or 503) response.
impl Responder for RateLimited {
    type Body = BoxBody;

    fn respond_to(self, _req: &HttpRequest) -> HttpResponse<Self::Body> {
        self.error_response()
    }
}

/// The key of `by = ip`: `base` then `:ip:` and the TCP peer's address
/// (`unknown` when the connection has none, such as a Unix socket).
pub fn key_with_ip(base: &str, req: &HttpRequest) -> String {
    let mut key = String::with_capacity(base.len() + 44);
    key.push_str(base);
    key.push_str(":ip:");
    match req.peer_addr() {
        Some(addr) => {
            let _ = write!(key, "{}", addr.ip());
        }
        None => key.push_str("unknown"),
    }
    key
}

/// The key of `by = header("name")`: `base`, `:header:name:` and the
/// header's value (empty when the request has none: such requests share one
/// budget). Bytes that are not UTF-8 are replaced.
pub fn key_with_header(base: &str, req: &HttpRequest, name: &str) -> String {
    let value = req
        .headers()
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .unwrap_or_default();
    let mut key = String::with_capacity(base.len() + name.len() + value.len() + 9);
    key.push_str(base);
    key.push_str(":header:");
    key.push_str(name);
    key.push(':');
    key.push_str(&value);
    key
}

/// Turns any responder into a response (the rejection side of a handler
/// that returns `impl Responder`).
pub fn respond<R: Responder>(value: R, req: &HttpRequest) -> HttpResponse {
    value.respond_to(req).map_into_boxed_body()
}
