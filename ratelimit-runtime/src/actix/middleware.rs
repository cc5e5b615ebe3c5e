//! [`RateLimit`]: rate limiting for a whole actix-web app, scope or
//! resource, with the same rules, limiter and pipeline as `#[rate_limit]`.

use std::borrow::Borrow;
use std::future::{Future, Ready, ready};
use std::marker::PhantomData;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};

use super::{append, client_ip, limiter_for, options_for, response};
use crate::http::flow::{self, Deferred, Exchange, LimitedRequest, Responding};
use crate::http::limit::{KeyFn, Limit, Sites};
use crate::http::{Field, Headers, HttpOptions, Middleware, Refusal};
use crate::limiter::RateLimiter;

/// Rate limiting for a whole app, scope or resource, with the same rules and
/// limiter as `#[rate_limit]`: a [`Middleware`] over actix-web's
/// `ServiceRequest` (what its [`by_key`](Middleware::by_key) and tier
/// pickers read). The limiter and [`HttpOptions`] are the app's data, as
/// for `#[rate_limit]` handlers.
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, web};
/// use ratelimit_runtime::{RateLimit, Rule};
///
/// const API: Rule = Rule::gcra(100, Duration::from_secs(60));
/// const EVERYONE: Rule = Rule::fixed_window(10_000, Duration::from_secs(60));
/// let app = App::new()
///     .wrap(RateLimit::new(API).name("api").by_ip().exempt_path("/health"))
///     .route("/health", web::get().to(|| async { "ok" }));
/// // A set of rules: per client, and for all clients at once.
/// let both = RateLimit::new(API).name("api").by_ip().and(EVERYONE).name("everyone");
/// ```
pub type RateLimit = Middleware<ServiceRequest>;

impl<S, B> Transform<S, ServiceRequest> for Middleware<ServiceRequest>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = RateLimitService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    /// Fails (so the server does not start) when the middleware's keys need
    /// a digest (it keys by a header, or by address under installed options
    /// that digest addresses) and the installed global limiter keeps its
    /// budgets in a shared store without a key secret. Only what is
    /// installed is known here: a limiter or options from app data are
    /// checked by its requests (refused with 500).
    fn new_transform(&self, service: S) -> Self::Future {
        if self.limit.check_secret(None, None).is_err() {
            return ready(Err(()));
        }
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            sites: Arc::new(Sites::new(&self.limit)),
            config: Arc::clone(&self.limit),
        }))
    }
}

/// The service [`RateLimit`] wraps around an app, scope or resource.
pub struct RateLimitService<S> {
    service: Rc<S>,
    sites: Arc<Sites>,
    config: Arc<Limit<KeyFn<ServiceRequest>>>,
}

impl<S> std::fmt::Debug for RateLimitService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitService").finish_non_exhaustive()
    }
}

impl<S, B> Service<ServiceRequest> for RateLimitService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Future = RateLimitFuture<S::Future, B>;

    forward_ready!(service);

    /// The one request flow of both middlewares: decided before anything
    /// is awaited when it can be, so the inner service is called at once.
    fn call(&self, req: ServiceRequest) -> Self::Future {
        let exchange = ActixExchange {
            service: &self.service,
            req,
            kind: PhantomData,
        };
        RateLimitFuture {
            stage: flow::respond(exchange, &self.config, &self.sites),
        }
    }
}

/// The middleware's answer.
type ActixResult<B> = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

/// A check that waits for the store, and the response after it.
type ActixWaiting<B> = Pin<Box<dyn Future<Output = ActixResult<B>>>>;

pin_project_lite::pin_project! {
    /// The future of a [`RateLimitService`]'s response.
    pub struct RateLimitFuture<F, B> {
        #[pin]
        stage: Responding<F, ServiceResponse<B>, ServiceResponse<EitherBody<B>>, actix_web::Error, ActixWaiting<B>>,
    }
}

impl<F, B> std::fmt::Debug for RateLimitFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitFuture").finish_non_exhaustive()
    }
}

impl<F, B> Future for RateLimitFuture<F, B>
where
    F: Future<Output = Result<ServiceResponse<B>, actix_web::Error>>,
{
    type Output = ActixResult<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().stage.poll(cx)
    }
}

/// One request and the inner service: borrowed from the middleware (`H`
/// is `&Rc<S>`) while it is decided, owned (`Rc<S>`) by a response that
/// waits for the store.
struct ActixExchange<S, H> {
    service: H,
    req: ServiceRequest,
    kind: PhantomData<S>,
}

impl<S, H> LimitedRequest<KeyFn<ServiceRequest>> for ActixExchange<S, H> {
    fn path(&self) -> &str {
        self.req.path()
    }

    fn headers(&self) -> &impl Headers {
        self.req.headers()
    }

    fn client_ip(&self, options: &HttpOptions) -> Option<std::net::IpAddr> {
        client_ip(options, self.req.request())
    }

    fn run(&self, closure: &KeyFn<ServiceRequest>) -> Option<String> {
        closure(&self.req)
    }
}

impl<S, H, B> Exchange<KeyFn<ServiceRequest>> for ActixExchange<S, H>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    H: Borrow<Rc<S>>,
    B: 'static,
{
    type Response = ServiceResponse<B>;
    type Answer = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Inner = S::Future;
    type Waiting = ActixWaiting<B>;

    fn limiter(&self) -> &RateLimiter {
        limiter_for(self.req.request())
    }

    fn options(&self) -> &HttpOptions {
        options_for(self.req.request())
    }

    fn call(self) -> S::Future {
        self.service.borrow().call(self.req)
    }

    fn refuse(self, refusal: Refusal) -> Self::Answer {
        self.req
            .into_response(response(refusal))
            .map_into_right_body()
    }

    fn wait(self, checks: Deferred<KeyFn<ServiceRequest>>) -> ActixWaiting<B> {
        let owned = ActixExchange {
            service: Rc::clone(self.service.borrow()),
            req: self.req,
            kind: PhantomData,
        };
        Box::pin(flow::deferred(owned, checks))
    }

    fn status(response: &ServiceResponse<B>) -> u16 {
        response.status().as_u16()
    }

    fn error_status(error: &actix_web::Error) -> u16 {
        error.as_response_error().status_code().as_u16()
    }

    fn finish(mut response: ServiceResponse<B>, fields: Vec<Field>) -> Self::Answer {
        append(response.response_mut(), fields);
        response.map_into_left_body()
    }
}
