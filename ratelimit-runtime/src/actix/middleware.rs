//! [`RateLimit`]: rate limiting for a whole actix-web app, scope or
//! resource, with the same rules, limiter and pipeline as `#[rate_limit]`.

use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};

use super::{append, client_ip, limiter_for, options_for, response};
use crate::http::flow::{Admission, LimitedRequest};
use crate::http::limit::{KeyFn, Limit, Sites, Subject, limit_builder};
use crate::http::{Headers, HttpOptions, Tiers};

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
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>>>>;

    forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let service = Rc::clone(&self.service);
        let sites = Arc::clone(&self.sites);
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let options = options_for(req.request());
            let limiter = limiter_for(req.request()).clone();
            let admitted = match config.admit(&sites, &limiter, options, &req).await {
                Admission::Pass => return Ok(service.call(req).await?.map_into_left_body()),
                Admission::Refuse(refusal) => {
                    return Ok(req.into_response(response(refusal)).map_into_right_body());
                }
                Admission::Admit(admitted) => admitted,
            };
            let mut response = service.call(req).await?;
            let status = response.status().as_u16();
            let fields = admitted.finish(&config, &limiter, status).await;
            append(response.response_mut(), fields);
            Ok(response.map_into_left_body())
        })
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
