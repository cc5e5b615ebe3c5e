//! actix-web (feature `actix`): `#[rate_limit]` on handlers ([`HttpCall`]
//! is an extractor here, [`Reply`] a responder), the [`RateLimit`]
//! middleware, and refusals as responses. A thin layer over
//! the decision pipeline and [`http`](crate::http)
//! (client identity, header fields).
//!
//! Per app, through its data:
//! - the limiter: `App::app_data(limiter)` or `web::Data<RateLimiter>`, else
//!   the global one;
//! - the [`HttpOptions`]: `App::app_data(options)` or `web::Data<HttpOptions>`,
//!   else the installed ones ([`HttpOptions::install`]), else the defaults
//!   (no trusted proxy, draft headers).

mod middleware;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::LazyLock;

use actix_web::body::BoxBody;
use actix_web::dev::Payload;
use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{FromRequest, HttpRequest, HttpResponse, Responder, ResponseError, web};

pub use middleware::{RateLimit, RateLimitFuture, RateLimitService};

use crate::decision::{Cause, RateLimited};
use crate::http::{Field, HttpCall, HttpOptions, NoFallback, Refusal, Reply, ReplyKind};
use crate::limiter::RateLimiter;
use crate::pipeline;

/// The limiter for this request: the app's (`app_data`) if it has one, else
/// the global one.
pub(crate) fn limiter_for(req: &HttpRequest) -> &RateLimiter {
    let app = req
        .app_data::<RateLimiter>()
        .or_else(|| req.app_data::<web::Data<RateLimiter>>().map(|d| &***d));
    match app {
        Some(limiter) => {
            RateLimiter::note_app_limiter();
            limiter
        }
        None => RateLimiter::global(),
    }
}

/// The HTTP options for this request: the app's (`app_data`) if it has
/// them, else the installed ones, else the defaults.
pub(crate) fn options_for(req: &HttpRequest) -> &HttpOptions {
    req.app_data::<HttpOptions>()
        .or_else(|| req.app_data::<web::Data<HttpOptions>>().map(|d| &***d))
        .unwrap_or_else(|| HttpOptions::default_ref())
}

/// The client's address as `options` tell it, from the TCP peer and the
/// forwarding headers.
pub(crate) fn client_ip(options: &HttpOptions, req: &HttpRequest) -> Option<std::net::IpAddr> {
    options.client_ip(req.peer_addr().map(|a| a.ip()), req.headers())
}

impl crate::http::Headers for actix_web::http::header::HeaderMap {
    fn values<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        self.get_all(name).map(|value| value.as_bytes())
    }
}

/// Turns any responder into a response.
pub(crate) fn respond<R: Responder>(value: R, req: &HttpRequest) -> HttpResponse {
    value.respond_to(req).map_into_boxed_body()
}

/// The request, for `#[rate_limit]` handlers.
impl FromRequest for HttpCall {
    type Error = Infallible;
    type Future = Ready<Result<HttpCall, Infallible>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let limiter = req
            .app_data::<RateLimiter>()
            .or_else(|| req.app_data::<web::Data<RateLimiter>>().map(|d| &***d))
            .cloned();
        let options = req
            .app_data::<HttpOptions>()
            .or_else(|| req.app_data::<web::Data<HttpOptions>>().map(|d| &***d))
            .cloned();
        let headers = req.headers();
        ready(Ok(HttpCall::new(
            limiter,
            options,
            req.peer_addr().map(|a| a.ip()),
            headers,
            |name| headers.get(name).map(|v| v.as_bytes()),
        )))
    }
}

/// A limited handler's response: its value's with the rate-limit fields,
/// or the refusal.
impl<T: Responder, F: Responder> Responder for Reply<T, F> {
    type Body = BoxBody;

    fn respond_to(self, req: &HttpRequest) -> HttpResponse {
        let mut response = match self.kind {
            ReplyKind::Allowed(value) => respond(value, req),
            ReplyKind::Demoted(value) => respond(value, req),
            ReplyKind::Refused(refusal) => return response(refusal),
        };
        append(&mut response, self.fields);
        response
    }
}

impl Responder for NoFallback {
    type Body = BoxBody;

    fn respond_to(self, _: &HttpRequest) -> HttpResponse {
        match self {}
    }
}

/// A framework-agnostic refusal as an actix-web response.
pub(crate) fn response(refusal: Refusal) -> HttpResponse {
    let status =
        StatusCode::from_u16(refusal.status.as_u16()).unwrap_or(StatusCode::TOO_MANY_REQUESTS);
    let mut response = HttpResponse::build(status).body(refusal.body);
    append(&mut response, refusal.headers);
    response
}

/// Adds header fields to an actix-web response. A name in any case is sent
/// lowercase; one that is not a field name (only possible from an app's own
/// refusal, checked when configured) is left out, never a panic.
pub(crate) fn append<B>(response: &mut HttpResponse<B>, fields: Vec<Field>) {
    let headers = response.headers_mut();
    for (name, value) in fields {
        let value = HeaderValue::from_maybe_shared(actix_web::web::Bytes::from(value));
        match (header_name(name), value) {
            (Some(name), Ok(value)) => headers.append(name, value),
            _ => crate::http::bad_field(name),
        }
    }
}

/// The actix-web name of a field: those the `http` module writes made once,
/// others as written, lowercased.
fn header_name(name: &'static str) -> Option<HeaderName> {
    static NAMES: LazyLock<Vec<(&str, HeaderName)>> = LazyLock::new(|| {
        crate::http::FIELD_NAMES
            .iter()
            .map(|&name| (name, HeaderName::from_static(name)))
            .collect()
    });
    if let Some((_, known)) = NAMES.iter().find(|(known, _)| *known == name) {
        return Some(known.clone());
    }
    if crate::http::is_plain_name(name) {
        return Some(HeaderName::from_static(name));
    }
    HeaderName::from_bytes(name.as_bytes()).ok()
}

/// `429 Too Many Requests` (`503` for a backend failure under `deny`, `400`
/// for an unknown client) with `Retry-After`, the rate-limit fields and the
/// body of the installed options ([`HttpOptions::install`]; by default the
/// draft's fields and plain text). So `actix_web::Error: From<RateLimited>`,
/// and a handler returning `Result<_, actix_web::Error>` answers this when
/// limited.
impl ResponseError for RateLimited {
    fn status_code(&self) -> StatusCode {
        match self.cause {
            Cause::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            Cause::BackendUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Cause::UnknownClient => StatusCode::BAD_REQUEST,
            Cause::Misconfigured => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        response(crate::http::refusal(self, &[], HttpOptions::default_ref()))
    }
}

/// A `RateLimited` returned from a handler is its refusal response.
impl Responder for RateLimited {
    type Body = BoxBody;

    fn respond_to(self, req: &HttpRequest) -> HttpResponse<Self::Body> {
        response(crate::http::refusal(&self, &[], options_for(req)))
    }
}

/// An actix handler returning `HttpResponse` answers 429 (or 503).
#[diagnostic::do_not_recommend]
impl pipeline::Reject for HttpResponse {
    fn reject(limited: RateLimited) -> Self {
        ResponseError::error_response(&limited)
    }
}
