//! [`RateLimit`]: rate limiting for a whole actix-web app, scope or
//! resource, with the same rules, limiter and pipeline as `#[rate_limit]`.

use std::future::{Future, Ready, ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::header::HeaderName;

use super::{append, client_ip, limiter_for, options_for, response};
use crate::http::{canonical, header_subject};
use crate::pipeline::{self, Site};
use crate::{OnError, Rule};

/// A closure that names a request's budget.
type KeyFn = Arc<dyn Fn(&ServiceRequest) -> Option<String> + Send + Sync>;

/// Whose budget a [`RateLimit`] middleware charges.
#[derive(Clone)]
enum By {
    Global,
    Ip,
    Header(HeaderName),
    Key(KeyFn),
}

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
///     .wrap(RateLimit::new(API).key("api").by_ip().exempt_path("/health"))
///     .route("/health", web::get().to(|| async { "ok" }));
/// ```
///
/// A `RateLimit` is `Send` and `Sync`: build it once, before the server
/// (so its name is known when overrides are loaded), and clone it into the
/// app factory. Its decisions go through the same
/// [`pipeline`](crate::pipeline) as the attribute's: overrides, shadow mode,
/// the failure policy and metrics apply alike.
#[derive(Clone)]
pub struct RateLimit {
    inner: Arc<Middleware>,
}

#[derive(Clone)]
struct Middleware {
    rule: Rule,
    name: &'static str,
    key: String,
    by: By,
    cost: u64,
    on_error: Option<OnError>,
    exempt_paths: Vec<String>,
    exempt_keys: Vec<String>,
    /// The exempt keys that are addresses (for `by_ip`).
    exempt_ips: Vec<IpAddr>,
}

impl Middleware {
    /// Whether `path` is an exempt path or below one (whole segments).
    fn exempt_path(&self, path: &str) -> bool {
        self.exempt_paths.iter().any(|prefix| {
            path.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('/') || prefix.ends_with('/')
            })
        })
    }

    fn exempt_key(&self, subject: &[u8]) -> bool {
        self.exempt_keys.iter().any(|k| k.as_bytes() == subject)
    }
}

impl std::fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("rule", &self.inner.rule)
            .field("key", &self.inner.key)
            .finish_non_exhaustive()
    }
}

impl RateLimit {
    /// One budget for all requests under `rule`, under the key `limiter:http`
    /// (set another with [`key`](RateLimit::key)).
    pub fn new(rule: Rule) -> RateLimit {
        crate::overrides::register("http", rule, 1);
        RateLimit {
            inner: Arc::new(Middleware {
                rule,
                name: "http",
                key: "limiter:http".to_owned(),
                by: By::Global,
                cost: 1,
                on_error: None,
                exempt_paths: Vec::new(),
                exempt_keys: Vec::new(),
                exempt_ips: Vec::new(),
            }),
        }
    }

    /// Makes the rule known to overrides under `name` with `cost`. This
    /// value's registration so far is undone when nothing else holds it (a
    /// builder renamed; not a clone's source, which keeps its own).
    fn registered_as(mut self, name: &str, cost: u64) -> RateLimit {
        let rule = self.inner.rule;
        if Arc::get_mut(&mut self.inner).is_some() {
            crate::overrides::unregister(self.inner.name, rule);
        }
        crate::overrides::register(name, rule, cost);
        self
    }

    fn with(mut self, change: impl FnOnce(&mut Middleware)) -> RateLimit {
        change(Arc::make_mut(&mut self.inner));
        self
    }

    /// The rule's name: the key is `limiter:<name>` plus the subject, and the
    /// rate-limit headers name the policy so.
    pub fn key(self, name: &'static str) -> RateLimit {
        let cost = self.inner.cost;
        self.registered_as(name, cost).with(|m| {
            m.name = name;
            m.key = format!("limiter:{name}");
        })
    }

    /// A budget per client address (see [`HttpOptions`](crate::HttpOptions)
    /// for proxies and IPv6).
    pub fn by_ip(self) -> RateLimit {
        self.with(|m| m.by = By::Ip)
    }

    /// A budget per value of a request header (requests without it share one).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (a programming error, caught at
    /// start-up).
    pub fn by_header(self, name: &str) -> RateLimit {
        let name = HeaderName::try_from(name).expect("a valid header name");
        self.with(|m| m.by = By::Header(name))
    }

    /// A budget per key your closure computes; `None` lets the request through
    /// unlimited.
    pub fn by_key(
        self,
        key: impl Fn(&ServiceRequest) -> Option<String> + Send + Sync + 'static,
    ) -> RateLimit {
        self.with(|m| m.by = By::Key(Arc::new(key)))
    }

    /// Units one request takes (default 1).
    ///
    /// # Panics
    ///
    /// If `cost` is 0 or over what the rule holds (its `count`, or `burst`
    /// for `token_bucket` and `gcra`): no request could pass (a programming
    /// error, caught at start-up).
    pub fn cost(self, cost: u64) -> RateLimit {
        let capacity = self.inner.rule.capacity();
        assert!(
            (1..=capacity).contains(&cost),
            "a request's cost must be between 1 and the rule's capacity ({capacity}), not {cost}"
        );
        let name = self.inner.name;
        self.registered_as(name, cost).with(|m| m.cost = cost)
    }

    /// What to do when the backend fails (default: the limiter's setting).
    pub fn on_error(self, on_error: OnError) -> RateLimit {
        self.with(|m| m.on_error = Some(on_error))
    }

    /// Requests for the path `prefix` or below it are not limited, by whole
    /// segments: `"/health"` exempts `/health` and `/health/db`, not
    /// `/healthz` or `/health-admin`. A prefix ending in `/` exempts what
    /// starts with it.
    pub fn exempt_path(self, prefix: impl Into<String>) -> RateLimit {
        let prefix = prefix.into();
        self.with(|m| m.exempt_paths.push(prefix))
    }

    /// Requests whose subject is `subject` are not limited: an allow-list.
    /// The subject is the client's address for [`by_ip`](RateLimit::by_ip)
    /// (`"10.0.0.1"`, `"2001:db8::1"`: the address, not the IPv6 prefix its
    /// budget is kept under), the header's value for
    /// [`by_header`](RateLimit::by_header), the closure's key for
    /// [`by_key`](RateLimit::by_key), each as the request has it, however
    /// long.
    pub fn exempt_key(self, subject: impl Into<String>) -> RateLimit {
        let subject = subject.into();
        self.with(|m| {
            if let Ok(ip) = subject.parse::<IpAddr>() {
                m.exempt_ips.push(canonical(ip));
            }
            m.exempt_keys.push(subject)
        })
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

    fn new_transform(&self, service: S) -> Self::Future {
        let m = &self.inner;
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            site: Arc::new(Site::new(m.name, m.rule, m.cost, None, m.on_error, false)),
            config: Arc::clone(&self.inner),
        }))
    }
}

/// The service [`RateLimit`] wraps around an app, scope or resource.
pub struct RateLimitService<S> {
    service: Rc<S>,
    site: Arc<Site>,
    config: Arc<Middleware>,
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
        let site = Arc::clone(&self.site);
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let pass = |req: ServiceRequest| {
                let service = Rc::clone(&service);
                async move { Ok(service.call(req).await?.map_into_left_body()) }
            };
            if config.exempt_path(req.path()) {
                return pass(req).await;
            }
            let options = options_for(req.request());
            // The subject of the key, after the allow-list: each kind of
            // subject is compared as the request has it (not as rendered
            // into the key, where long values are digested and IPv6 masked).
            let subject = match &config.by {
                By::Global => String::new(),
                By::Ip => {
                    let ip = client_ip(options, req.request());
                    if ip.is_some_and(|ip| config.exempt_ips.contains(&ip)) {
                        return pass(req).await;
                    }
                    match options.ip_subject(ip) {
                        Ok(subject) => subject,
                        Err(()) => {
                            let refusal =
                                crate::http::refusal(&site.unknown_client(), &[], options);
                            return Ok(req.into_response(response(refusal)).map_into_right_body());
                        }
                    }
                }
                By::Header(name) => {
                    let value = req.headers().get(name).map(|v| v.as_bytes());
                    if value.is_some_and(|v| config.exempt_key(v)) {
                        return pass(req).await;
                    }
                    header_subject(name.as_str(), value)
                }
                By::Key(key) => {
                    let Some(k) = key(&req) else {
                        return pass(req).await;
                    };
                    if config.exempt_key(k.as_bytes()) {
                        return pass(req).await;
                    }
                    let mut subject = String::from(":key:");
                    crate::keys::push_part(&mut subject, &k);
                    subject
                }
            };
            // A global budget's key is the middleware's own: no copy of it.
            let joined;
            let key = if subject.is_empty() {
                config.key.as_str()
            } else {
                joined = [config.key.as_str(), &subject].concat();
                joined.as_str()
            };
            let limiter = limiter_for(req.request());
            let checked = pipeline::check_on(&site, Some(limiter), key).await;
            let held = match checked {
                Ok(held) => held,
                Err(limited) => {
                    let refusal = crate::http::refusal(&limited, &[], options);
                    return Ok(req.into_response(response(refusal)).map_into_right_body());
                }
            };
            let fields = crate::http::rate_limit_headers(options.headers, [held.report()]);
            let mut response = service.call(req).await?;
            // A concurrency lease is held until the response is produced.
            drop(held);
            append(response.response_mut(), fields);
            Ok(response.map_into_left_body())
        })
    }
}
