//! HTTP, for any framework: who the client is (the peer address, or behind
//! trusted proxies the `Forwarded`, `X-Forwarded-For` or `X-Real-IP` hop
//! they name; IPv6 grouped by prefix) and what limited responses carry (the
//! `RateLimit`/`RateLimit-Policy` fields, legacy `X-RateLimit-*`,
//! `Retry-After`). The framework adapters (`actix`) are thin layers over
//! this module.

// Alone, without an adapter, the feature builds what the adapters use.
#![cfg_attr(
    not(any(feature = "actix", feature = "tower")),
    allow(dead_code, unused_imports)
)]

#[cfg(any(feature = "actix", feature = "tower"))]
pub(crate) mod flow;
#[cfg(any(feature = "actix", feature = "axum"))]
pub(crate) mod handler;
#[cfg(any(feature = "actix", feature = "axum"))]
pub(crate) mod handler_set;
mod headers;
#[cfg(any(feature = "actix", feature = "tower"))]
pub(crate) mod limit;
#[cfg(any(feature = "actix", feature = "tower"))]
pub use limit::Tiers;
#[cfg(any(feature = "actix", feature = "tower"))]
pub(crate) mod middleware;
#[cfg(any(feature = "actix", feature = "tower"))]
pub use middleware::Middleware;

use std::net::IpAddr;

pub use ::http::StatusCode;
#[cfg(any(feature = "actix", feature = "axum"))]
pub(crate) use handler::ReplyKind;
#[cfg(any(feature = "actix", feature = "axum"))]
pub use handler::{HttpCall, NoFallback, Reply};
#[cfg(any(feature = "actix", feature = "tower"))]
pub(crate) use headers::FIELD_NAMES;
pub use headers::Refusal;
pub(crate) use headers::{Field, rate_limit_headers, refusal};
#[cfg(feature = "actix")]
pub(crate) use headers::{bad_field, is_plain_name};

use crate::error::Error;
use crate::keys;

/// A request's header fields, as the client identity reads them: each value
/// of a field, in order. Implemented for the `http` crate's `HeaderMap` and
/// for each framework's own.
pub trait Headers {
    /// The values of the field `name` (lowercase), in the order received.
    fn values<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]>;
}

impl Headers for ::http::HeaderMap {
    fn values<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        self.get_all(name).iter().map(|value| value.as_bytes())
    }
}

/// How an HTTP adapter deals with requests and responses: who the client is,
/// and what limited responses carry. Give it to the adapter: as app data on
/// actix-web (`App::app_data(options)`, read by `#[rate_limit]` handlers and
/// the [`RateLimit`](crate::RateLimit) middleware).
///
/// ```
/// use ratelimit_runtime::{HeaderStyle, HttpOptions};
///
/// let options = HttpOptions::new()
///     .trust_proxies(["10.0.0.0/8", "192.168.1.1"])
///     .unwrap()
///     .ipv6_prefix(56)
///     .headers(HeaderStyle::Both)
///     .json_body(true);
/// ```
#[derive(Clone, Debug)]
pub struct HttpOptions {
    /// Shared: options are cloned into every handler's request.
    trusted: std::sync::Arc<[Cidr]>,
    ipv6_prefix: u8,
    client_header: ClientHeader,
    unknown_client: UnknownClient,
    pub(crate) headers: HeaderStyle,
    pub(crate) json: bool,
    /// Client addresses as keyed digests in keys (under the limiter's key
    /// secret).
    pub(crate) digest_ips: bool,
    pub(crate) refusal: Option<headers::CustomRefusal>,
}

/// Which forwarding header names the client when the peer is a trusted
/// proxy. A header the proxies do not write reaches the app as the client
/// sent it; set the one they write, and the others are ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientHeader {
    /// Whichever of `Forwarded`, `X-Forwarded-For` and `X-Real-IP` the
    /// request carries (the default). If those it carries name different
    /// clients, the client cannot be told (see [`UnknownClient`]): a client
    /// that adds a header its proxy does not write cannot pick its own
    /// address. A header whose every hop is a trusted proxy names no client.
    #[default]
    Any,
    /// `Forwarded` (RFC 7239) only.
    Forwarded,
    /// `X-Forwarded-For` only.
    XForwardedFor,
    /// `X-Real-IP` only (several lines of it are read as a chain, the last
    /// nearest, like `X-Forwarded-For`).
    XRealIp,
}

/// Which rate-limit header fields limited responses carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers),
    /// the default.
    #[default]
    Draft,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`
    /// (seconds until the budget is whole again).
    Legacy,
    /// Both.
    Both,
    /// None (`Retry-After` is still sent with a refusal).
    None,
}

/// What a per-client rule (`by = ip`) does with a request whose client it
/// cannot tell (no peer address, or a forwarding header it cannot read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnknownClient {
    /// Refuse it with `400 Bad Request` (the default).
    #[default]
    Reject,
    /// Count it against one budget shared by all such requests.
    Shared,
}

/// The `http` names of [`FIELD_NAMES`], made once.
#[cfg(feature = "tower")]
static KNOWN_NAMES: [::http::HeaderName; 7] = [
    ::http::HeaderName::from_static(FIELD_NAMES[0]),
    ::http::HeaderName::from_static(FIELD_NAMES[1]),
    ::http::HeaderName::from_static(FIELD_NAMES[2]),
    ::http::HeaderName::from_static(FIELD_NAMES[3]),
    ::http::HeaderName::from_static(FIELD_NAMES[4]),
    ::http::HeaderName::from_static(FIELD_NAMES[5]),
    ::http::HeaderName::from_static(FIELD_NAMES[6]),
];

/// Adds header fields to an `http` header map (axum's and tower's). A
/// name in any case is sent lowercase; one that is not a field name (only
/// possible from an app's own refusal, checked when configured) is left
/// out, never a panic.
#[cfg(feature = "tower")]
pub(crate) fn append(headers: &mut ::http::HeaderMap, fields: Vec<Field>) {
    for (name, value) in fields {
        let Ok(value) = ::http::HeaderValue::try_from(value) else {
            headers::bad_field(name);
            continue;
        };
        let name = if let Some(at) = FIELD_NAMES.iter().position(|&known| known == name) {
            KNOWN_NAMES[at].clone()
        } else if headers::is_plain_name(name) {
            ::http::HeaderName::from_static(name)
        } else {
            match ::http::HeaderName::from_bytes(name.as_bytes()) {
                Ok(name) => name,
                Err(_) => {
                    headers::bad_field(name);
                    continue;
                }
            }
        };
        headers.append(name, value);
    }
}

/// Says once, when a per-client rule met a request without its peer's
/// address, how to give it one: never silently one shared budget.
pub(crate) fn no_peer() {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::error!(
            "a per-client rate limit met a request without its peer's address; with axum, \
             serve the router with `into_make_service_with_connect_info::<SocketAddr>()` \
             (other tower servers: `RateLimitLayer::peer`); until then such clients are \
             unknown: refused with 400, or one shared budget if HttpOptions::unknown_client \
             says so"
        );
    }
}

/// The options of adapters that have none of their own: the installed
/// ones, else the defaults.
static PROCESS_OPTIONS: std::sync::OnceLock<HttpOptions> = std::sync::OnceLock::new();

impl HttpOptions {
    /// Makes these the options of every `#[rate_limit]` handler, middleware
    /// and layer in the process that has none of its own (app data, a
    /// request extension or `RateLimitLayer::options` still win). With the
    /// limiter installed too
    /// ([`RateLimiter::install`](crate::RateLimiter::install)), an app needs
    /// nothing more: no app data, and in axum no `Extension` layers, each of
    /// which costs every request of the router a layer.
    ///
    /// A refusal built from a [`RateLimited`](crate::RateLimited) alone,
    /// with no request at hand (actix-web's `ResponseError`, axum's
    /// `IntoResponse`), uses the installed options.
    ///
    /// Call it once at start-up, before any request: the first request
    /// without options of its own takes the defaults.
    ///
    /// ```
    /// use ratelimit_runtime::{HttpOptions, RateLimiter};
    ///
    /// # fn main() -> Result<(), ratelimit_runtime::Error> {
    /// RateLimiter::in_memory().install()?;
    /// HttpOptions::new().trust_proxies(["10.0.0.0/8"])?.install()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyInstalled`] if options are already installed, or a
    /// request already took the defaults; those in place stay.
    pub fn install(self) -> Result<(), Error> {
        PROCESS_OPTIONS
            .set(self)
            .map_err(|_| Error::AlreadyInstalled)
    }

    /// The installed options, else the defaults (which from then on stay).
    pub(crate) fn default_ref() -> &'static HttpOptions {
        PROCESS_OPTIONS.get_or_init(HttpOptions::default)
    }

    /// The installed options, if any (not the defaults taken by a first
    /// request).
    #[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
    pub(crate) fn installed() -> Option<&'static HttpOptions> {
        PROCESS_OPTIONS.get()
    }
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            trusted: std::sync::Arc::new([]),
            digest_ips: false,
            refusal: None,
            ipv6_prefix: 64,
            client_header: ClientHeader::Any,
            unknown_client: UnknownClient::Reject,
            headers: HeaderStyle::Draft,
            json: false,
        }
    }
}

impl HttpOptions {
    /// The defaults: no trusted proxies, IPv6 grouped by /64, unknown clients
    /// refused, draft headers, plain text bodies.
    pub fn new() -> HttpOptions {
        HttpOptions::default()
    }

    /// Trusts forwarding headers from these proxies: addresses
    /// (`"10.0.0.1"`, `"::1"`) or CIDR blocks (`"10.0.0.0/8"`, `"fd00::/8"`).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the entry that is neither.
    pub fn trust_proxies<'a>(
        mut self,
        proxies: impl IntoIterator<Item = &'a str>,
    ) -> Result<HttpOptions, Error> {
        let mut trusted = self.trusted.to_vec();
        for proxy in proxies {
            trusted.push(Cidr::parse(proxy).map_err(Error::Config)?);
        }
        self.trusted = trusted.into();
        Ok(self)
    }

    /// The forwarding header that names the client behind a trusted proxy
    /// (default [`ClientHeader::Any`]). Set the one your proxies write:
    /// nginx's `$proxy_add_x_forwarded_for` and most load balancers write
    /// `X-Forwarded-For`.
    pub fn client_header(mut self, header: ClientHeader) -> HttpOptions {
        self.client_header = header;
        self
    }

    /// Groups IPv6 clients by this prefix length (default 64: one budget per
    /// /64, the smallest block a subscriber usually gets). 128 counts every
    /// address alone.
    pub fn ipv6_prefix(mut self, bits: u8) -> HttpOptions {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// What to do with requests whose client cannot be told.
    pub fn unknown_client(mut self, rule: UnknownClient) -> HttpOptions {
        self.unknown_client = rule;
        self
    }

    /// Which rate-limit header fields to send.
    pub fn headers(mut self, style: HeaderStyle) -> HttpOptions {
        self.headers = style;
        self
    }

    /// Refusals with a JSON body (`{"error": "...", "retry_after": ...}`)
    /// instead of plain text.
    pub fn json_body(mut self, json: bool) -> HttpOptions {
        self.json = json;
        self
    }

    /// The client's address: the TCP peer, or, when the peer is a trusted
    /// proxy, the right-most untrusted hop of the forwarding headers.
    /// IPv4-mapped IPv6 addresses are read as IPv4. `None` when there is no
    /// usable address.
    pub fn client_ip(&self, peer: Option<IpAddr>, headers: &impl Headers) -> Option<IpAddr> {
        let peer = canonical(peer?);
        if !self.trusted(peer) {
            return Some(peer);
        }
        // The header the proxies write, or (Any) each one, which must then
        // agree on the client.
        let read = match &self.client_header {
            ClientHeader::Any => &EACH_HEADER[..],
            one => std::slice::from_ref(one),
        };
        let mut client = None;
        let mut best_proxy = None;
        for &header in read {
            match self.behind(&hops(headers, header))? {
                Named::Client(ip) if client.is_some_and(|c| c != ip) => {
                    disagreeing_headers_seen();
                    return None;
                }
                Named::Client(ip) => client = Some(ip),
                // Every hop is a trusted proxy: the left-most is the best we know.
                Named::Proxy(ip) => best_proxy = best_proxy.or(Some(ip)),
                Named::Nobody => {}
            }
        }
        client.or(best_proxy).or(Some(peer))
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|cidr| cidr.contains(ip))
    }

    /// What a chain of hops (client first) says: the right-most hop that is
    /// not a trusted proxy; `None` when a hop on the way is not an address.
    fn behind(&self, hops: &[Option<IpAddr>]) -> Option<Named> {
        let mut named = Named::Nobody;
        for hop in hops.iter().rev() {
            let hop = canonical((*hop)?);
            if !self.trusted(hop) {
                return Some(Named::Client(hop));
            }
            named = Named::Proxy(hop);
        }
        Some(named)
    }

    /// `:ip:<address>` for the key of the client `ip` (IPv6 masked to the
    /// prefix), or `:ip:#<digest>` with [`digest_client_ips`](Self::digest_client_ips)
    /// (under `limiter`'s key secret).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] with digests, when the limiter keeps its budgets in
    /// a shared store and was given no key secret (such requests are
    /// refused, so no budget has a subject to name).
    pub fn subject_of(
        &self,
        limiter: &crate::limiter::RateLimiter,
        ip: IpAddr,
    ) -> Result<String, Error> {
        let secret = match limiter.key_secret() {
            Ok(secret) => secret,
            Err(error) if self.digest_ips => return Err(error),
            Err(_) => &[],
        };
        // As a request's address is: an IPv4-mapped one is its IPv4 one.
        Ok(self.subject_with(secret, canonical(ip)))
    }

    fn subject_with(&self, secret: &[u8], ip: IpAddr) -> String {
        self.ip_key("", secret, ip)
    }

    /// `base` followed by the subject of the client `ip`, as these options
    /// write it ([`keys::ip_key`]).
    fn ip_key(&self, base: &str, secret: &[u8], ip: IpAddr) -> String {
        let digest = self.digest_ips.then_some(secret);
        keys::ip_key(base, ip, self.ipv6_prefix, digest)
    }

    /// Build refusals yourself: `build` makes the response (any status,
    /// fields and body) from the `RateLimited`, for `#[rate_limit]` handlers
    /// without a fallback, the actix middleware and the tower layer. With
    /// `standard_headers`, `Retry-After` and the rate-limit fields are added
    /// to it (those it does not set itself). Field names may be written in
    /// any case (`"X-Reason"`; they are sent lowercase, as HTTP/2 requires).
    ///
    /// `build` is called here once for each [`Cause`](crate::Cause) of a
    /// refusal, and the fields it makes are checked, so a bad one is a
    /// configuration error at start-up, not a failure on a request.
    ///
    /// ```
    /// use ratelimit_runtime::HttpOptions;
    /// use ratelimit_runtime::http::{Refusal, StatusCode};
    ///
    /// let options = HttpOptions::new().on_refusal(
    ///     |limited| Refusal {
    ///         status: StatusCode::TOO_MANY_REQUESTS,
    ///         headers: vec![
    ///             ("Content-Type", "text/html".to_owned()),
    ///             ("X-Reason", format!("over {} a period", limited.limit)),
    ///         ],
    ///         body: format!("<p>Slow down: {} s</p>", limited.retry_after_secs()),
    ///     },
    ///     true,
    /// )?;
    /// # Ok::<(), ratelimit_runtime::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming a field whose name is not a header field
    /// name (`"X Reason"`, `""`), or whose value cannot be sent (a line
    /// break or another control character).
    pub fn on_refusal(
        mut self,
        build: impl Fn(&crate::decision::RateLimited) -> Refusal + Send + Sync + 'static,
        standard_headers: bool,
    ) -> Result<HttpOptions, Error> {
        let refusal = headers::CustomRefusal::new(build, standard_headers);
        refusal.check()?;
        self.refusal = Some(refusal);
        Ok(self)
    }

    /// Keep client addresses as keyed digests in keys too (personal data
    /// out of Redis key names and logs), under the limiter's
    /// [`key_secret`](crate::RateLimiterBuilder::key_secret); by default
    /// they are readable.
    pub fn digest_client_ips(mut self, digest: bool) -> HttpOptions {
        self.digest_ips = digest;
        self
    }

    /// The subject a `by = header("name")` rule keeps `value`'s budget
    /// under in `limiter`, for [`RateLimiter::reset_named`](crate::RateLimiter::reset_named)
    /// and the like: `header:name:#<digest>`, under the limiter's key
    /// secret.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the limiter keeps its budgets in a shared
    /// store and was given no key secret (such requests are refused, so no
    /// budget has a subject to name).
    pub fn subject_of_header(
        &self,
        limiter: &crate::limiter::RateLimiter,
        name: &str,
        value: &str,
    ) -> Result<String, Error> {
        let name = name.to_ascii_lowercase();
        let subject = self.header_subject(limiter.key_secret()?, &name, Some(value.as_bytes()));
        Ok(subject[1..].to_owned())
    }

    /// The key's subject for `by = header("name")`:
    /// `:header:name:#<digest>` of the value (empty value when the request
    /// has none: such requests share one budget). The value itself is never
    /// in a key or a log.
    pub(crate) fn header_subject(&self, secret: &[u8], name: &str, value: Option<&[u8]>) -> String {
        self.header_key("", secret, name, value)
    }

    /// `base` followed by [`header_subject`](Self::header_subject)
    /// ([`keys::header_key`]).
    pub(crate) fn header_key(
        &self,
        base: &str,
        secret: &[u8],
        name: &str,
        value: Option<&[u8]>,
    ) -> String {
        keys::header_key(base, secret, name, value.unwrap_or_default())
    }

    /// The key `base` plus the subject for `by = ip` of the client `ip` (as
    /// [`client_ip`](HttpOptions::client_ip) tells it); `Err` when there is
    /// none and such requests are refused.
    pub(crate) fn ip_subject(
        &self,
        base: &str,
        secret: &[u8],
        ip: Option<IpAddr>,
    ) -> Result<String, ()> {
        match ip {
            Some(ip) => Ok(self.ip_key(base, secret, ip)),
            None if self.unknown_client == UnknownClient::Shared => {
                Ok(keys::unknown_client_key(base))
            }
            None => Err(()),
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`) is the IPv4 client it carries.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Logs, once per process, that forwarding headers named different clients.
#[cold]
fn disagreeing_headers_seen() {
    static SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SEEN.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!(
            "a request's forwarding headers name different clients, so its client is unknown \
             (logged once); if your proxies write one of them, name it with \
             HttpOptions::client_header and the others are ignored"
        );
    }
}

/// What a forwarding header names.
enum Named {
    /// The right-most hop that is not a trusted proxy.
    Client(IpAddr),
    /// Only trusted proxies: the left-most of them.
    Proxy(IpAddr),
    /// No hop (the header is absent).
    Nobody,
}

/// Every forwarding header, in the order [`ClientHeader::Any`] reads them.
const EACH_HEADER: [ClientHeader; 3] = [
    ClientHeader::Forwarded,
    ClientHeader::XForwardedFor,
    ClientHeader::XRealIp,
];

/// The forwarding chain a header carries, client first (empty when the
/// request lacks it). `None` marks a hop that is not an address (`unknown`,
/// an obfuscated name, garbage).
fn hops(headers: &impl Headers, header: ClientHeader) -> Vec<Option<IpAddr>> {
    match header {
        ClientHeader::Forwarded => headers
            .values("forwarded")
            .flat_map(split_list)
            .map(|element| {
                element
                    .split(';')
                    .filter_map(|pair| pair.split_once('='))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                    .and_then(|(_, value)| parse_node(value))
            })
            .collect(),
        ClientHeader::XForwardedFor => headers
            .values("x-forwarded-for")
            .flat_map(split_list)
            .map(parse_node)
            .collect(),
        // One address a line; several lines (a proxy that adds its own
        // instead of replacing the client's) are a chain, the last nearest.
        ClientHeader::XRealIp => headers
            .values("x-real-ip")
            .map(|value| std::str::from_utf8(value).ok().and_then(parse_node))
            .collect(),
        // Not one header: read as each of EACH_HEADER.
        ClientHeader::Any => Vec::new(),
    }
}

/// A list header's elements: split on the byte `,` before each is read as
/// text, so bytes that are not text spoil only their own element (one hop
/// nobody can read), not the hops a trusted proxy added after them.
fn split_list(value: &[u8]) -> impl Iterator<Item = &str> {
    value
        .split(|&b| b == b',')
        .map(|element| std::str::from_utf8(element).map_or("", str::trim))
}

/// `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`, optionally quoted.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim().trim_matches('"');
    if let Some(rest) = node.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    if let Ok(ip) = node.parse() {
        return Some(ip);
    }
    let (host, port) = node.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// An address block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    fn parse(text: &str) -> Result<Cidr, String> {
        let bad = || format!("{text:?} is not an IP address or CIDR block (like \"10.0.0.0/8\")");
        let (addr, bits) = match text.trim().split_once('/') {
            Some((addr, bits)) => (addr, Some(bits.parse::<u8>().map_err(|_| bad())?)),
            None => (text.trim(), None),
        };
        let addr = canonical(addr.parse::<IpAddr>().map_err(|_| bad())?);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = bits.unwrap_or(max);
        if bits > max {
            return Err(bad());
        }
        Ok(Cidr { addr, bits })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.bits))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
