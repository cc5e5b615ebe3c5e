//! The request flow of both middlewares (actix-web's `RateLimit`, the tower
//! `RateLimitLayer`), written once: the verdict (exempt, unknown client or
//! the key to check), the tier's rule, the check, then a refusal or the
//! rate-limit fields, and after the response the refund its status asks
//! for. Each framework reads its request through [`LimitedRequest`] and
//! turns [`Refusal`]s and fields into its own responses.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use super::limit::{Limit, Sites, Verdict};
use super::{Field, Headers, HttpOptions, Refusal, rate_limit_headers, refusal};
use crate::limiter::RateLimiter;
use crate::pipeline::{self, Pass};
use crate::site::Site;

/// A request as the flow reads it; `K` is the framework's closure type (a
/// middleware's `by_key` and tier picker), which the request runs.
pub(crate) trait LimitedRequest<K> {
    /// The URL's path, for exempt paths.
    fn path(&self) -> &str;
    /// The header fields, for `by_header` and forwarding headers.
    fn headers(&self) -> &impl Headers;
    /// The client's address as `options` tell it (the peer, or behind
    /// trusted proxies the hop they name).
    fn client_ip(&self, options: &HttpOptions) -> Option<IpAddr>;
    /// What the framework's closure says of this request.
    fn run(&self, closure: &K) -> Option<String>;
}

/// What a middleware does with a request before its inner service runs.
pub(crate) enum Admission<'a> {
    /// Unlimited (an exempt path or subject, or no key): call the inner
    /// service as it is.
    Pass,
    /// Refused: answer with this, without calling the inner service.
    Refuse(Refusal),
    /// Allowed: call the inner service, then [`Admitted::finish`].
    Admit(Admitted<'a>),
}

/// An allowed request: what it holds while the inner service runs.
pub(crate) struct Admitted<'a> {
    /// The permit (a concurrency rule's lease), held until the response.
    held: Pass,
    site: Arc<Site>,
    key: Cow<'a, str>,
    /// The rate-limit fields of the allowed response.
    fields: Vec<Field>,
}

impl<K> Limit<K> {
    /// Decides `request` under this middleware's rule (or its tier's) on
    /// `limiter`.
    pub(crate) async fn admit<'a>(
        &'a self,
        sites: &Sites,
        limiter: &RateLimiter,
        options: &HttpOptions,
        request: &impl LimitedRequest<K>,
    ) -> Admission<'a> {
        let verdict = self.verdict(
            &sites.own,
            request.path(),
            options,
            limiter,
            || request.client_ip(options),
            request.headers(),
            |closure| request.run(closure),
        );
        let key = match verdict {
            Verdict::Pass => return Admission::Pass,
            Verdict::Check(key) => key,
            Verdict::Refuse(limited) => {
                return Admission::Refuse(refusal(&limited, &[], options));
            }
        };
        let (site, key) = sites.choose(self, key, |pick| request.run(pick));
        match pipeline::check_on(&site, Some(limiter), &key).await {
            Ok(held) => {
                let fields = rate_limit_headers(options.headers, [held.report()]);
                Admission::Admit(Admitted {
                    held,
                    site,
                    key,
                    fields,
                })
            }
            Err(limited) => Admission::Refuse(refusal(&limited, &[], options)),
        }
    }
}

impl Admitted<'_> {
    /// Once the inner service has answered with `status`: gives the permit
    /// back (a concurrency lease is held until the response is produced),
    /// gives back what the request took if the middleware says so for that
    /// status, and returns the fields to add to the response.
    pub(crate) async fn finish<K>(
        self,
        limit: &Limit<K>,
        limiter: &RateLimiter,
        status: u16,
    ) -> Vec<Field> {
        let charge = self.held.permit().charge();
        drop(self.held);
        limit
            .settle(&self.site, limiter, &self.key, charge, status)
            .await;
        self.fields
    }
}
