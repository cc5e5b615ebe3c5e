//! [`RateLimit`]: rate limiting for a whole actix-web app, scope or
//! resource, with the same rules, limiter and pipeline as `#[rate_limit]`.

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};

use super::{append, client_ip, limiter_for, options_for, response};
use crate::http::flow::{Held, LimitedRequest, Prepared, Responding, admitted};
use crate::http::limit::{KeyFn, Limit, Sites, Subject, limit_builder};
use crate::http::{Headers, HttpOptions, Refusal, Tiers};

/// Rate limiting for a whole app, scope or resource, with the same rules and
/// limiter as `#[rate_limit]`.
///
/// ```
/// use std::time::Duration;
/// use actix_web::{App, web};
/// use ratelimit_runtime::{RateLimit, Rule};
///
/// const API: Rule = Rule::gcra(100, Duration::from_secs(60));
/// let app = App::new()
///     .wrap(RateLimit::new(API).name("api").by_ip().exempt_path("/health"))
///     .route("/health", web::get().to(|| async { "ok" }));
/// ```
///
/// A `RateLimit` is `Send` and `Sync`: build it once, before the server
/// (so its name is known when overrides are loaded), and clone it into the
/// app factory. Its decisions go through the same
/// decision pipeline as the attribute's: overrides, shadow mode,
/// the failure policy and metrics apply alike.
#[derive(Clone)]
pub struct RateLimit {
    inner: Arc<Limit<KeyFn<ServiceRequest>>>,
}

limit_builder!(RateLimit, ServiceRequest);

impl RateLimit {
    fn from_limit(inner: Arc<Limit<KeyFn<ServiceRequest>>>) -> Self {
        RateLimit { inner }
    }

    /// A budget per key your closure computes; `None` lets the request through
    /// unlimited.
    pub fn by_key(
        self,
        key: impl Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    ) -> RateLimit {
        self.with(|m| m.by = Subject::Key(Arc::new(key)))
    }

    /// Rules chosen per request: `pick` names a tier of `tiers` (a plan
    /// from an API key, a header), whose rule then decides, under its own
    /// name; `None`, or a name not in the table, leaves the middleware's own
    /// rule. The subject (`by_ip`, `by_header`, `by_key`) is the same.
    pub fn tiers(
        self,
        tiers: Tiers,
        pick: impl Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    ) -> RateLimit {
        self.with(|m| m.tiers = Some((tiers, Arc::new(pick))))
    }
}

impl<S, B> Transform<S, ServiceRequest> for RateLimit
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = actix_web::Error;
    type Transform = RateLimitService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    /// Fails (so the server does not start) when the middleware keys by a
    /// header and the installed global limiter keeps its budgets in a
    /// shared store without a key secret; a limiter from app data is
    /// checked by its requests (refused with 500).
    fn new_transform(&self, service: S) -> Self::Future {
        if self.inner.check_secret(None, None).is_err() {
            return ready(Err(()));
        }
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            sites: Arc::new(Sites::new(&self.inner)),
            config: Arc::clone(&self.inner),
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

    /// Decides before anything is awaited: the subject, the key and, in
    /// process memory, the check itself, so the inner service is called at
    /// once; a store that must be awaited is awaited in the future.
    fn call(&self, req: ServiceRequest) -> Self::Future {
        let options = options_for(req.request());
        let limiter = limiter_for(req.request());
        let (site, key) = match self.config.prepare(&self.sites, limiter, options, &req) {
            Prepared::Pass => return RateLimitFuture::inner(self.service.call(req), None),
            Prepared::Refuse(refusal) => return RateLimitFuture::ready(refuse(req, refusal)),
            Prepared::Check(site, key) => (site, key),
        };
        if !self.config.settles()
            && let Some(checked) = crate::pipeline::check_now(site, limiter, &key)
        {
            return match admitted(checked, options) {
                Ok(held) => RateLimitFuture::inner(self.service.call(req), Some(held)),
                Err(refusal) => RateLimitFuture::ready(refuse(req, refusal)),
            };
        }
        // The store must be awaited (or a refund after the response).
        let (site, key) = (Arc::clone(site), key.into_owned());
        let limiter = limiter.clone();
        let service = Rc::clone(&self.service);
        let config = Arc::clone(&self.config);
        RateLimitFuture::waiting(Box::pin(async move {
            let checked = crate::pipeline::check_on(&site, Some(&limiter), &key).await;
            let (held, fields) = match admitted(checked, options_for(req.request())) {
                Ok(held) => held,
                Err(refusal) => return Ok(refuse(req, refusal)),
            };
            let mut response = service.call(req).await?;
            let status = response.status().as_u16();
            config.finish(held, &site, &limiter, &key, status).await;
            append(response.response_mut(), fields);
            Ok(response.map_into_left_body())
        }))
    }
}

/// A refused request's response.
fn refuse<B>(req: ServiceRequest, refusal: Refusal) -> ServiceResponse<EitherBody<B>> {
    req.into_response(response(refusal)).map_into_right_body()
}

/// The middleware's answer, once the store has been awaited.
type Answer<B> = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>;

/// A check that waits for the store, and the response after it.
type Waiting<B> = Pin<Box<dyn Future<Output = Answer<B>>>>;

pin_project_lite::pin_project! {
    /// The future of a [`RateLimitService`]'s response.
    pub struct RateLimitFuture<F, B> {
        #[pin]
        stage: Responding<F, ServiceResponse<B>, ServiceResponse<EitherBody<B>>, actix_web::Error, Waiting<B>>,
    }
}

impl<F, B> RateLimitFuture<F, B> {
    fn inner(future: F, held: Option<Held>) -> Self {
        let finish = |mut response: ServiceResponse<B>, held: Option<Held>| {
            if let Some((permit, fields)) = held {
                drop(permit);
                append(response.response_mut(), fields);
            }
            response.map_into_left_body()
        };
        let stage = Responding::Inner {
            future,
            held,
            finish,
        };
        RateLimitFuture { stage }
    }

    fn ready(response: ServiceResponse<EitherBody<B>>) -> Self {
        let stage = Responding::Ready {
            answer: Some(Ok(response)),
        };
        RateLimitFuture { stage }
    }

    fn waiting(future: Waiting<B>) -> Self {
        let stage = Responding::Waiting { future };
        RateLimitFuture { stage }
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
    type Output = Answer<B>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().stage.poll(cx)
    }
}

/// An actix-web request, as the middleware flow reads it.
impl LimitedRequest<KeyFn<ServiceRequest>> for ServiceRequest {
    fn path(&self) -> &str {
        ServiceRequest::path(self)
    }

    fn headers(&self) -> &impl Headers {
        ServiceRequest::headers(self)
    }

    fn client_ip(&self, options: &HttpOptions) -> Option<std::net::IpAddr> {
        client_ip(options, self.request())
    }

    fn run(&self, closure: &KeyFn<ServiceRequest>) -> Option<String> {
        closure(self)
    }
}
