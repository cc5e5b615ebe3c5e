//! actix-web support (feature `actix`): who the client is, what a limited
//! response looks like, and the [`RateLimit`] middleware.
//!
//! - Client identity: the TCP peer address, unless the peer is a trusted
//!   proxy ([`HttpOptions::trust_proxies`]); then the forwarding header the
//!   proxies write ([`ClientHeader`]: `Forwarded`, `X-Forwarded-For` or
//!   `X-Real-IP`) is read from the right, and the right-most address that is
//!   not a trusted proxy is the client. IPv6 clients are grouped by prefix
//!   (/64 by default).
//! - Responses: a refused call answers `429 Too Many Requests` with
//!   `Retry-After` (whole seconds, rounded up); `503` when the backend failed
//!   under the `deny` policy; `400` when a per-client rule cannot tell who the
//!   client is. Limited responses, allowed or not, carry the IETF draft's
//!   `RateLimit-Policy` and `RateLimit` fields (and/or the widely deployed
//!   `X-RateLimit-*`).
//! - The limiter: the one in the app's data (`App::app_data(limiter)` or
//!   `web::Data<RateLimiter>`) when present, else the global one.

use std::fmt::Write as _;
use std::future::{Future, Ready, ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix_web::body::{BoxBody, EitherBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform, forward_ready};
use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{HttpRequest, HttpResponse, Responder, ResponseError, web};

use crate::{Cause, Decision, Error, OnError, RateLimited, RateLimiter, Rule};

/// How a limiter deals with HTTP: who the client is, and what limited
/// responses carry. Set it with [`RateLimiterBuilder::http`](crate::RateLimiterBuilder::http).
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
    trusted: Vec<Cidr>,
    ipv6_prefix: u8,
    client_header: ClientHeader,
    unknown_client: UnknownClient,
    headers: HeaderStyle,
    json: bool,
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

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            trusted: Vec::new(),
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
        for proxy in proxies {
            self.trusted
                .push(Cidr::parse(proxy).map_err(Error::Config)?);
        }
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
    pub fn client_ip(&self, req: &HttpRequest) -> Option<IpAddr> {
        self.resolve(req.peer_addr().map(|a| a.ip()), req.headers())
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|cidr| cidr.contains(ip))
    }

    fn resolve(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
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

    /// `ip:<address>` for the key of the client `ip` (IPv6 masked to the
    /// prefix).
    fn subject_of(&self, ip: IpAddr) -> String {
        let mut subject = String::with_capacity(48);
        subject.push_str(":ip:");
        match ip {
            IpAddr::V4(v4) => {
                let _ = write!(subject, "{v4}");
            }
            IpAddr::V6(v6) => {
                let bits = u32::from(self.ipv6_prefix);
                let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
                let masked = std::net::Ipv6Addr::from(u128::from(v6) & mask);
                let _ = write!(subject, "{masked}/{bits}");
            }
        }
        subject
    }

    /// The key's subject for `by = ip` of the client `ip` (as
    /// [`client_ip`](HttpOptions::client_ip) tells it); `Err` when there is
    /// none and such requests are refused.
    fn ip_subject(&self, ip: Option<IpAddr>) -> Result<String, ()> {
        match ip {
            Some(ip) => Ok(self.subject_of(ip)),
            None if self.unknown_client == UnknownClient::Shared => Ok(":ip:unknown".to_owned()),
            None => Err(()),
        }
    }
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`) is the IPv4 client it carries.
fn canonical(ip: IpAddr) -> IpAddr {
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
fn hops(headers: &HeaderMap, header: ClientHeader) -> Vec<Option<IpAddr>> {
    match header {
        ClientHeader::Forwarded => headers
            .get_all("forwarded")
            .flat_map(|value| split_list(value))
            .map(|element| {
                element
                    .split(';')
                    .filter_map(|pair| pair.split_once('='))
                    .find(|(name, _)| name.trim().eq_ignore_ascii_case("for"))
                    .and_then(|(_, value)| parse_node(value))
            })
            .collect(),
        ClientHeader::XForwardedFor => headers
            .get_all("x-forwarded-for")
            .flat_map(|value| split_list(value))
            .map(parse_node)
            .collect(),
        // One address a line; several lines (a proxy that adds its own
        // instead of replacing the client's) are a chain, the last nearest.
        ClientHeader::XRealIp => headers
            .get_all("x-real-ip")
            .map(|value| value.to_str().ok().and_then(parse_node))
            .collect(),
        // Not one header: read as each of EACH_HEADER.
        ClientHeader::Any => Vec::new(),
    }
}

fn split_list(value: &HeaderValue) -> Vec<&str> {
    match value.to_str() {
        Ok(text) => text.split(',').map(str::trim).collect(),
        // Not text: one hop nobody can read.
        Err(_) => vec![""],
    }
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

/// One rule's state, for the rate-limit headers.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    name: &'static str,
    limit: u64,
    period: Duration,
    remaining: u64,
    reset_after: Duration,
    /// Its call site's `RateLimit-Policy` item and quoted name, when the
    /// site keeps them rendered and the item fits this report.
    policy: Option<&'static Policy>,
}

impl Report {
    /// From a rule and its decision.
    pub fn new(name: &'static str, rule: &Rule, decision: &Decision) -> Report {
        Report {
            name,
            limit: decision.limit,
            period: rule.period(),
            remaining: decision.remaining,
            reset_after: decision.reset_after,
            policy: None,
        }
    }

    /// The same, with the `RateLimit-Policy` item that `policy` keeps
    /// rendered for a call site (rendered at the first report; used while the
    /// limit and period stay those, as they do unless an override changes
    /// them).
    pub(crate) fn with_policy(mut self, policy: &'static OnceLock<Policy>) -> Report {
        // Kept for the process's life (one per call site), so every response
        // takes them without copying or counting references.
        let policy = policy.get_or_init(|| {
            let (value, quoted) = Policy::render(&self);
            let leak = |bytes: Vec<u8>| Bytes::from_static(Box::leak(bytes.into_boxed_slice()));
            Policy::from_parts(&self, leak(value), leak(quoted))
        });
        if policy.fits(&self) {
            self.policy = Some(policy);
        }
        self
    }

    fn from_refusal(limited: &RateLimited) -> Report {
        Report {
            name: limited.policy,
            limit: limited.limit,
            period: limited.period,
            remaining: limited.remaining,
            reset_after: limited.reset_after,
            policy: None,
        }
    }
}

/// A call site's `RateLimit-Policy` item and its rule's name as a quoted
/// string (the start of its `RateLimit` item), rendered once.
#[derive(Debug)]
pub(crate) struct Policy {
    limit: u64,
    window: u64,
    value: Option<HeaderValue>,
    quoted: Bytes,
}

impl Policy {
    /// `report`'s `RateLimit-Policy` item and its quoted name.
    fn render(report: &Report) -> (Vec<u8>, Vec<u8>) {
        let value = draft_bytes(std::iter::once(report), [b";q=", b";w="], |r| {
            [r.limit, window(r)]
        });
        let mut quoted = Vec::with_capacity(sf_string_len(report.name));
        push_sf_string(&mut quoted, report.name);
        (value, quoted)
    }

    /// The policy of reports of `report`'s limit and window, from
    /// [`render`](Policy::render)'s bytes.
    fn from_parts(report: &Report, value: Bytes, quoted: Bytes) -> Policy {
        Policy {
            limit: report.limit,
            window: window(report),
            value: HeaderValue::from_maybe_shared(value).ok(),
            quoted,
        }
    }

    /// Rendered for `report`, in buffers of its own (a middleware's, per
    /// worker: its values' reference counts stay on the worker's thread).
    fn owned(report: &Report) -> Policy {
        let (value, quoted) = Policy::render(report);
        Policy::from_parts(report, Bytes::from(value), Bytes::from(quoted))
    }

    /// Whether this is `report`'s item (same limit and window; an override
    /// changes them).
    fn fits(&self, report: &Report) -> bool {
        (self.limit, self.window) == (report.limit, window(report)) && self.value.is_some()
    }
}

/// A report's window in whole seconds, at least 1 (the draft's `w`).
fn window(report: &Report) -> u64 {
    secs_up(report.period).max(1)
}

fn secs_up(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Whether a name is its own Structured Field string between quotes (nearly
/// always: printable ASCII without `"` or `\`).
fn plain(name: &str) -> bool {
    name.bytes()
        .all(|b| matches!(b, b' '..=b'~') && b != b'"' && b != b'\\')
}

/// The length of [`push_sf_string`]'s output.
fn sf_string_len(name: &str) -> usize {
    if plain(name) {
        return name.len() + 2;
    }
    2 + name
        .chars()
        .map(|c| if matches!(c, '"' | '\\') { 2 } else { 1 })
        .sum::<usize>()
}

/// A Structured Field string: `"` and `\` escaped, anything but printable
/// ASCII replaced.
fn push_sf_string(out: &mut Vec<u8>, name: &str) {
    out.push(b'"');
    if plain(name) {
        out.extend_from_slice(name.as_bytes());
    } else {
        for c in name.chars() {
            match c {
                '"' | '\\' => out.extend_from_slice(&[b'\\', c as u8]),
                ' '..='~' => out.push(c as u8),
                _ => out.push(b'?'),
            }
        }
    }
    out.push(b'"');
}

fn decimal_len(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |digits| digits as usize + 1)
}

/// A draft field's value: each report as its name and two parameters
/// (`"api";q=100;w=60, ...`), written into one buffer of exactly its length,
/// which the header value then owns (one allocation, no copy).
fn draft_value<'a>(
    reports: impl Iterator<Item = &'a Report> + Clone,
    params: [&[u8]; 2],
    numbers: impl Fn(&Report) -> [u64; 2],
) -> Option<HeaderValue> {
    let value = draft_bytes(reports, params, numbers);
    // Full, so the bytes become the value's without another allocation.
    debug_assert_eq!(value.len(), value.capacity());
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

/// The draft's two fields for one rule whose call site keeps its policy
/// rendered: that, and the state written from its quoted name.
fn append_kept(report: &Report, kept: &Policy, headers: &mut HeaderMap) {
    let state = state_value(&kept.quoted, report.remaining, secs_up(report.reset_after));
    if let (Some(policy), Some(state)) = (&kept.value, state) {
        headers.append(RATELIMIT_POLICY, policy.clone());
        headers.append(RATELIMIT, state);
    }
}

/// One rule's `RateLimit` value from its quoted name: `"api";r=5;t=30`.
///
/// Written into this thread's block of values, which many responses' values
/// share (counted references, as `Bytes` keeps them), so a response's value
/// costs no allocation of its own; a new block is taken when one is full,
/// and a block is freed when the last value in it is.
fn state_value(quoted: &[u8], remaining: u64, reset: u64) -> Option<HeaderValue> {
    const BLOCK: usize = 4096;
    thread_local! {
        static VALUES: std::cell::RefCell<Option<BytesMut>> = const { std::cell::RefCell::new(None) };
    }
    let (mut r, mut t) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (r, t) = (r.format(remaining).as_bytes(), t.format(reset).as_bytes());
    let len = quoted.len() + 3 + r.len() + 3 + t.len();
    #[inline(always)]
    fn write(block: &mut BytesMut, parts: [&[u8]; 5]) -> Bytes {
        for part in parts {
            block.extend_from_slice(part);
        }
        block.split().freeze()
    }
    let parts = [quoted, b";r=", r, b";t=", t];
    let value = VALUES
        .try_with(|values| {
            let mut values = values.borrow_mut();
            let block = match &mut *values {
                Some(block) if block.capacity() >= len => block,
                values => values.insert(BytesMut::with_capacity(BLOCK.max(len))),
            };
            write(block, parts)
        })
        // The thread is ending and its block is gone: a value of its own.
        .unwrap_or_else(|_| write(&mut BytesMut::with_capacity(len), parts));
    HeaderValue::from_maybe_shared(value).ok()
}

/// [`draft_value`]'s bytes.
fn draft_bytes<'a>(
    reports: impl Iterator<Item = &'a Report> + Clone,
    [first, second]: [&[u8]; 2],
    numbers: impl Fn(&Report) -> [u64; 2],
) -> Vec<u8> {
    let mut len = 0;
    for (i, report) in reports.clone().enumerate() {
        let [a, b] = numbers(report);
        len += if i > 0 { 2 } else { 0 }
            + sf_string_len(report.name)
            + first.len()
            + decimal_len(a)
            + second.len()
            + decimal_len(b);
    }
    let mut value = Vec::with_capacity(len);
    let mut digits = itoa::Buffer::new();
    for (i, report) in reports.enumerate() {
        if i > 0 {
            value.extend_from_slice(b", ");
        }
        push_sf_string(&mut value, report.name);
        let [a, b] = numbers(report);
        value.extend_from_slice(first);
        value.extend_from_slice(digits.format(a).as_bytes());
        value.extend_from_slice(second);
        value.extend_from_slice(digits.format(b).as_bytes());
    }
    value
}

const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Appends the header fields for these rules' reports to `headers`.
///
/// On every allowed response of a limited handler: each value is written
/// once, into a buffer of its exact size that the header map then owns, and
/// the reports are read where they are (no list collected).
pub(crate) fn append_rate_limit_headers<'a, I>(
    style: HeaderStyle,
    reports: I,
    headers: &mut HeaderMap,
) where
    I: IntoIterator<Item = &'a Report>,
    I::IntoIter: Clone,
{
    let reports = reports.into_iter();
    if reports.clone().next().is_none() {
        return;
    }
    if matches!(style, HeaderStyle::Draft | HeaderStyle::Both) {
        // One rule whose call site keeps its policy rendered (the usual
        // case): that, and its quoted name to start the state; else both
        // written here.
        let mut rest = reports.clone();
        let kept = rest
            .next()
            .and_then(|r| Some((r, r.policy?)))
            .filter(|_| rest.next().is_none());
        match kept {
            Some((report, kept)) => append_kept(report, kept, headers),
            None => {
                let policy =
                    draft_value(reports.clone(), [b";q=", b";w="], |r| [r.limit, window(r)]);
                let state = draft_value(reports.clone(), [b";r=", b";t="], |r| {
                    [r.remaining, secs_up(r.reset_after)]
                });
                if let (Some(policy), Some(state)) = (policy, state) {
                    headers.append(RATELIMIT_POLICY, policy);
                    headers.append(RATELIMIT, state);
                }
            }
        }
    }
    if matches!(style, HeaderStyle::Legacy | HeaderStyle::Both) {
        // One set of numbers: the rule closest to refusing.
        let tightest = reports
            .min_by_key(|r| (r.remaining, std::cmp::Reverse(r.reset_after)))
            .expect("not empty");
        headers.append(
            HeaderName::from_static("x-ratelimit-limit"),
            tightest.limit.into(),
        );
        headers.append(
            HeaderName::from_static("x-ratelimit-remaining"),
            tightest.remaining.into(),
        );
        headers.append(
            HeaderName::from_static("x-ratelimit-reset"),
            secs_up(tightest.reset_after).into(),
        );
    }
}

/// The response for a refusal: status by cause, `Retry-After`, rate-limit
/// headers, plain text or JSON.
fn refusal(limited: &RateLimited, reports: &[Report], options: &HttpOptions) -> HttpResponse {
    let status = limited.status_code();
    let mut response = HttpResponse::build(status);
    if limited.cause != Cause::UnknownClient {
        response.insert_header((RETRY_AFTER, HeaderValue::from(limited.retry_after_secs())));
    }
    let retry = limited.retry_after_secs();
    let (code, text) = match limited.cause {
        Cause::OverLimit => (
            "too_many_requests",
            format!("Too Many Requests: try again in {retry} s\n"),
        ),
        Cause::BackendUnavailable => (
            "rate_limiter_unavailable",
            "Service Unavailable: the rate limiter cannot decide; try again later\n".to_owned(),
        ),
        Cause::UnknownClient => (
            "unknown_client",
            "Bad Request: cannot tell who the client is\n".to_owned(),
        ),
    };
    let mut response = if options.json {
        response.insert_header((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        response.body(format!(
            "{{\"error\":\"{code}\",\"retry_after\":{retry},\"limit\":{},\"remaining\":{}}}",
            limited.limit, limited.remaining
        ))
    } else {
        response.insert_header((
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        ));
        response.body(text)
    };
    append_rate_limit_headers(options.headers, reports, response.headers_mut());
    response
}

/// `429 Too Many Requests` (`503` for a backend failure under `deny`, `400`
/// for an unknown client) with `Retry-After`, the draft rate-limit headers and
/// a plain text body. So `actix_web::Error: From<RateLimited>`, and a handler
/// returning `Result<_, actix_web::Error>` answers this when limited.
impl ResponseError for RateLimited {
    fn status_code(&self) -> StatusCode {
        match self.cause {
            Cause::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            Cause::BackendUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Cause::UnknownClient => StatusCode::BAD_REQUEST,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let report = (self.cause == Cause::OverLimit).then(|| Report::from_refusal(self));
        refusal(self, report.as_slice(), &HttpOptions::default())
    }
}

/// A `RateLimited` returned from a handler is its refusal response.
impl Responder for RateLimited {
    type Body = BoxBody;

    fn respond_to(self, _req: &HttpRequest) -> HttpResponse<Self::Body> {
        self.error_response()
    }
}

/// The limiter for this request: the app's (`app_data`) if it has one, else
/// the global one. A limited handler looks it up once per request.
pub fn limiter_for(req: &HttpRequest) -> &RateLimiter {
    req.app_data::<RateLimiter>()
        .or_else(|| {
            req.app_data::<web::Data<RateLimiter>>()
                .map(|data| &***data)
        })
        .unwrap_or_else(|| RateLimiter::global())
}

/// The key's subject for `by = ip`, under the limiter's options; `Err` when
/// the client cannot be told and such requests are refused.
pub(crate) fn ip_subject(limiter: &RateLimiter, req: &HttpRequest) -> Result<String, ()> {
    let options = limiter.http_options();
    options.ip_subject(options.client_ip(req))
}

/// The key's subject for `by = header("name")`: `:header:name:value` (empty
/// value when the request has none: such requests share one budget). The
/// value is the caller's: long or odd values are digested ([`crate::keys`]).
pub(crate) fn header_subject(req: &HttpRequest, name: &str) -> String {
    let value = req
        .headers()
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()))
        .unwrap_or_default();
    let mut subject =
        String::with_capacity(name.len() + 10 + value.len().min(crate::keys::MAX_PART));
    subject.push_str(":header:");
    subject.push_str(name);
    subject.push(':');
    crate::keys::push_part(&mut subject, &value);
    subject
}

/// Turns any responder into a response.
pub fn respond<R: Responder>(value: R, req: &HttpRequest) -> HttpResponse {
    value.respond_to(req).map_into_boxed_body()
}

/// A refusal from `#[rate_limit]` on a handler, with every rule's headers
/// (in the style of `app`, the request's limiter: [`limiter_for`]).
pub fn refused(limited: RateLimited, seen: &[Option<Report>], app: &RateLimiter) -> HttpResponse {
    let options = app.http_options();
    let mut reports: Vec<Report> = seen.iter().flatten().copied().collect();
    if limited.cause == Cause::OverLimit {
        reports.push(Report::from_refusal(&limited));
    }
    refusal(&limited, &reports, options)
}

/// A handler's own response with the rate-limit headers of the rules its
/// call passed (in the style of `app`, the request's limiter).
pub fn allowed<R: Responder>(
    value: R,
    seen: &[Option<Report>],
    req: &HttpRequest,
    app: &RateLimiter,
) -> HttpResponse {
    let mut response = respond(value, req);
    let style = app.http_options().headers;
    match seen {
        // The usual case, written straight: one rule, whose call site keeps
        // its policy rendered, and the draft's fields.
        [
            Some(
                report @ Report {
                    policy: Some(kept), ..
                },
            ),
        ] if style == HeaderStyle::Draft => {
            append_kept(report, kept, response.headers_mut());
        }
        _ => append_rate_limit_headers(style, seen.iter().flatten(), response.headers_mut()),
    }
    response
}

/// A fallback's response to a refusal, with every rule's headers (the
/// refusing one's included).
pub fn demoted<R: Responder>(
    value: R,
    limited: &RateLimited,
    seen: &[Option<Report>],
    req: &HttpRequest,
    app: &RateLimiter,
) -> HttpResponse {
    let refusing = Report::from_refusal(limited);
    let mut response = respond(value, req);
    let style = app.http_options().headers;
    let reports = seen.iter().flatten().chain(std::iter::once(&refusing));
    append_rate_limit_headers(style, reports, response.headers_mut());
    response
}

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
/// app factory.
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

    /// A budget per client address (see [`HttpOptions`] for proxies and IPv6).
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
        ready(Ok(RateLimitService {
            service: Rc::new(service),
            // A copy per worker: requests share no reference count across threads.
            config: Rc::new(Worker {
                middleware: Middleware::clone(&self.inner),
                policy: std::cell::OnceCell::new(),
                pinned: crate::limiter::PinCache::new(),
            }),
        }))
    }
}

/// The service [`RateLimit`] wraps around an app, scope or resource.
pub struct RateLimitService<S> {
    service: Rc<S>,
    config: Rc<Worker>,
}

/// A worker's copy of a [`RateLimit`], and its `RateLimit-Policy` item and
/// quoted name, rendered at its first allowed request.
struct Worker {
    middleware: Middleware,
    policy: std::cell::OnceCell<Policy>,
    /// A global budget's key, pinned in process memory at its first request
    /// (as a `#[rate_limit]` fixed key is).
    pinned: crate::limiter::PinCache,
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
        let worker = Rc::clone(&self.config);
        Box::pin(async move {
            let config = &worker.middleware;
            let pass = |req: ServiceRequest| {
                let service = Rc::clone(&service);
                async move { Ok(service.call(req).await?.map_into_left_body()) }
            };
            if config.exempt_path(req.path()) {
                return pass(req).await;
            }
            // Borrowed from the request (no reference count shared by the
            // workers is touched), until the request goes to the service.
            let limiter = limiter_for(req.request());
            // The subject of the key, after the allow-list: each kind of
            // subject is compared as the request has it (not as rendered
            // into the key, where long values are digested and IPv6 masked).
            let subject = match &config.by {
                By::Global => String::new(),
                By::Ip => {
                    let options = limiter.http_options();
                    let ip = options.client_ip(req.request());
                    if ip.is_some_and(|ip| config.exempt_ips.contains(&ip)) {
                        return pass(req).await;
                    }
                    match options.ip_subject(ip) {
                        Ok(subject) => subject,
                        Err(()) => {
                            let refusal = RateLimited::unknown_client(config.rule.count());
                            let response = refused(refusal, &[], limiter);
                            return Ok(req.into_response(response).map_into_right_body());
                        }
                    }
                }
                By::Header(name) => {
                    let value = req.headers().get(name);
                    if value.is_some_and(|v| config.exempt_key(v.as_bytes())) {
                        return pass(req).await;
                    }
                    header_subject(req.request(), name.as_str())
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
            let global = matches!(config.by, By::Global);
            let joined;
            let key = if global {
                // The key as it is.
                config.key.as_str()
            } else {
                joined = format!("{}{subject}", config.key);
                joined.as_str()
            };
            let on_error = config.on_error.unwrap_or(limiter.on_backend_error());
            let (rule, shadow) =
                crate::overrides::effective(config.name, &config.rule, limiter.is_shadow())
                    .unwrap_or((config.rule, limiter.is_shadow()));
            let pin = global.then_some(&worker.pinned);
            let permit = match limiter
                .acquire_pinned_with(&rule, key, config.cost, on_error, pin)
                .await
            {
                Ok(permit) => permit,
                Err(Error::Backend(_)) => {
                    let refusal = RateLimited::backend_unavailable(config.rule.count());
                    let response = refused(refusal, &[], limiter);
                    return Ok(req.into_response(response).map_into_right_body());
                }
                Err(error) => {
                    tracing::error!(%error, key, "rate limiter failed; letting the request through");
                    return pass(req).await;
                }
            };
            let decision = *permit.decision();
            if !decision.allowed && shadow {
                tracing::info!(
                    rule = config.name,
                    key,
                    "shadow rate limit exceeded; request allowed"
                );
            } else if !decision.allowed {
                let refusal =
                    RateLimited::from_decision(&decision).with_rule(rule.period(), config.name);
                let response = refused(refusal, &[], limiter);
                return Ok(req.into_response(response).map_into_right_body());
            }
            let report = Report::new(config.name, &rule, &decision);
            let style = limiter.http_options().headers;
            let mut response = service.call(req).await?;
            drop(permit);
            let headers = response.headers_mut();
            // As a limited handler's: the draft's item kept, the state
            // written from the kept quoted name.
            let kept = (style == HeaderStyle::Draft)
                .then(|| worker.policy.get_or_init(|| Policy::owned(&report)))
                .filter(|kept| kept.fits(&report));
            match kept {
                Some(kept) => append_kept(&report, kept, headers),
                None => append_rate_limit_headers(style, [&report], headers),
            }
            Ok(response.map_into_left_body())
        })
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::try_from(*name).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn ip(text: &str) -> Option<IpAddr> {
        Some(text.parse().unwrap())
    }

    #[test]
    fn forwarding_headers_count_only_from_trusted_proxies() {
        let open = HttpOptions::new();
        let spoofed = headers(&[("x-forwarded-for", "9.9.9.9")]);
        assert_eq!(open.resolve(ip("203.0.113.7"), &spoofed), ip("203.0.113.7"));

        let proxied = HttpOptions::new().trust_proxies(["10.0.0.0/8"]).unwrap();
        assert_eq!(proxied.resolve(ip("10.0.0.2"), &spoofed), ip("9.9.9.9"));
        // A client-sent address left of the real one is ignored: the
        // right-most untrusted hop wins.
        let chain = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.5")]);
        assert_eq!(proxied.resolve(ip("10.0.0.2"), &chain), ip("203.0.113.7"));
        // What the headers a request carries name, read with the default
        // (`ClientHeader::Any`).
        type Headers<'a> = &'a [(&'a str, &'a str)];
        let cases: [(Headers<'_>, Option<IpAddr>); 6] = [
            // Forwarded (RFC 7239), with quotes, ports and IPv6.
            (
                &[(
                    "forwarded",
                    "for=1.1.1.1, for=\"[2001:db8::17]:4711\";proto=https",
                )],
                ip("2001:db8::17"),
            ),
            (&[("x-real-ip", "198.51.100.4")], ip("198.51.100.4")),
            // Several that agree (nginx's X-Real-IP and X-Forwarded-For).
            (
                &[
                    ("x-forwarded-for", "1.1.1.1, 203.0.113.7"),
                    ("x-real-ip", "203.0.113.7"),
                ],
                ip("203.0.113.7"),
            ),
            // One whose hops are all trusted proxies names nobody.
            (
                &[
                    ("x-forwarded-for", "198.51.100.9, 10.0.0.7"),
                    ("x-real-ip", "10.0.0.7"),
                ],
                ip("198.51.100.9"),
            ),
            // Headers that name different clients: one of them is the
            // client's own (its proxy passed it on), so it cannot be told...
            (
                &[
                    ("forwarded", "for=5.5.5.5"),
                    ("x-forwarded-for", "203.0.113.7"),
                ],
                None,
            ),
            // ...nor from a hop that is not an address.
            (&[("forwarded", "for=unknown")], None),
        ];
        for (pairs, client) in cases {
            assert_eq!(
                proxied.resolve(ip("10.0.0.2"), &headers(pairs)),
                client,
                "{pairs:?}"
            );
        }
        // A client's own X-Real-IP, passed on by a proxy that adds its line
        // rather than replacing it, is not the client.
        let added = headers(&[
            ("x-real-ip", "5.5.5.5"),
            ("x-real-ip", "203.0.113.7"),
            ("x-forwarded-for", "203.0.113.7"),
        ]);
        for options in [
            &proxied,
            &proxied.clone().client_header(ClientHeader::XRealIp),
        ] {
            assert_eq!(options.resolve(ip("10.0.0.2"), &added), ip("203.0.113.7"));
        }
        // Headers that disagree name one client once the options say which
        // header the proxies write.
        let disagreeing = headers(cases[4].0);
        for (header, client) in [
            (ClientHeader::XForwardedFor, ip("203.0.113.7")),
            (ClientHeader::Forwarded, ip("5.5.5.5")),
            // Absent: the proxy itself is the client.
            (ClientHeader::XRealIp, ip("10.0.0.2")),
        ] {
            let pinned = proxied.clone().client_header(header);
            assert_eq!(
                pinned.resolve(ip("10.0.0.2"), &disagreeing),
                client,
                "{header:?}"
            );
        }
        assert_eq!(proxied.resolve(None, &spoofed), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// Whatever the forwarding headers say, resolving never panics, and an
        /// untrusted peer is always the client.
        #[test]
        fn forwarding_headers_never_panic(
            forwarded in "[ -~]{0,120}",
            xff in "[ -~]{0,120}",
            real in "[ -~]{0,60}",
            raw in proptest::collection::vec(0x80u8..=0xff, 0..40),
        ) {
            let mut map = headers(&[("forwarded", &forwarded), ("x-forwarded-for", &xff), ("x-real-ip", &real)]);
            map.append(HeaderName::from_static("x-forwarded-for"), HeaderValue::from_bytes(&raw).unwrap_or(HeaderValue::from_static("")));
            let trusted = HttpOptions::new().trust_proxies(["0.0.0.0/0", "::/0"]).unwrap();
            let _ = trusted.resolve(ip("10.0.0.1"), &map);
            let open = HttpOptions::new();
            proptest::prop_assert_eq!(open.resolve(ip("203.0.113.5"), &map), ip("203.0.113.5"));
        }

        #[test]
        fn header_values_never_escape_the_key(value in proptest::collection::vec(0x20u8..=0xff, 0..2000)) {
            let Ok(header) = HeaderValue::from_bytes(&value) else { return Ok(()); };
            let req = actix_web::test::TestRequest::default()
                .insert_header(("x-api-key", header))
                .to_http_request();
            let subject = header_subject(&req, "x-api-key");
            let part = subject.strip_prefix(":header:x-api-key:").unwrap();
            proptest::prop_assert!(part.len() <= crate::keys::MAX_PART);
            proptest::prop_assert!(!part.contains([':', '{', '}', '*', '\n', ' ']), "escaped: {:?}", part);
        }
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4() {
        let options = HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap();
        assert_eq!(
            options.resolve(ip("::ffff:203.0.113.9"), &HeaderMap::new()),
            ip("203.0.113.9")
        );
        assert_eq!(
            options.resolve(
                ip("::ffff:127.0.0.1"),
                &headers(&[("x-real-ip", "1.2.3.4")])
            ),
            ip("1.2.3.4")
        );
    }

    /// `ip:<address>` for the key of `req`'s client, or `None`.
    fn client_subject(options: &HttpOptions, req: &HttpRequest) -> Option<String> {
        options.client_ip(req).map(|ip| options.subject_of(ip))
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        let req = |peer: &str| {
            actix_web::test::TestRequest::default()
                .peer_addr(peer.parse().unwrap())
                .to_http_request()
        };
        let by_64 = HttpOptions::new();
        let a = client_subject(&by_64, &req("[2001:db8:1:2:aaaa::1]:443")).unwrap();
        let b = client_subject(&by_64, &req("[2001:db8:1:2:bbbb::9]:443")).unwrap();
        let c = client_subject(&by_64, &req("[2001:db8:1:3::1]:443")).unwrap();
        assert_eq!(a, ":ip:2001:db8:1:2::/64");
        assert_eq!(a, b, "one /64, one budget");
        assert_ne!(a, c);
        let alone = HttpOptions::new().ipv6_prefix(128);
        assert_ne!(
            client_subject(&alone, &req("[2001:db8:1:2:aaaa::1]:443")),
            client_subject(&alone, &req("[2001:db8:1:2:bbbb::9]:443"))
        );
        assert_eq!(
            client_subject(&by_64, &req("[::ffff:198.51.100.7]:80")).unwrap(),
            ":ip:198.51.100.7"
        );
        assert_eq!(
            client_subject(&by_64, &req("198.51.100.7:80")).unwrap(),
            ":ip:198.51.100.7"
        );
        let no_peer = actix_web::test::TestRequest::default().to_http_request();
        assert_eq!(client_subject(&by_64, &no_peer), None);
    }

    #[test]
    fn cidr_blocks() {
        let block = Cidr::parse("192.168.0.0/16").unwrap();
        assert!(block.contains("192.168.44.1".parse().unwrap()));
        assert!(!block.contains("192.169.0.1".parse().unwrap()));
        assert!(
            Cidr::parse("fd00::/8")
                .unwrap()
                .contains("fdab::1".parse().unwrap())
        );
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        for bad in ["10.0.0.0/33", "ten", "10.0.0.0/x", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        assert!(HttpOptions::new().trust_proxies(["nope"]).is_err());
    }

    #[test]
    fn a_call_site_renders_its_policy_once_and_only_for_its_rule() {
        static POLICY: OnceLock<Policy> = OnceLock::new();
        let decision = |limit| Decision {
            allowed: true,
            limit,
            remaining: 1,
            reset_after: Duration::from_secs(1),
            retry_after: Duration::ZERO,
        };
        let rule = Rule::fixed_window(10, Duration::from_millis(1500));
        let fields = |report: Report| {
            let mut headers = HeaderMap::new();
            append_rate_limit_headers(HeaderStyle::Draft, [&report], &mut headers);
            let field = |name| headers.get(name).unwrap().to_str().unwrap().to_owned();
            (field("ratelimit-policy"), field("ratelimit"))
        };
        let render = |report: Report| fields(report).0;
        let first = Report::new("site", &rule, &decision(10)).with_policy(&POLICY);
        let kept = first.policy.expect("rendered at the first report");
        assert_eq!(kept.value.as_ref().unwrap(), "\"site\";q=10;w=2");
        assert_eq!(kept.quoted, &b"\"site\""[..]);
        assert_eq!(
            fields(first),
            (
                "\"site\";q=10;w=2".to_owned(),
                "\"site\";r=1;t=1".to_owned()
            )
        );
        // A name that needs escaping, kept quoted as it is written.
        static ODD: OnceLock<Policy> = OnceLock::new();
        let odd = Report::new("a\"b\\c", &rule, &decision(10)).with_policy(&ODD);
        assert!(odd.policy.is_some());
        assert_eq!(
            fields(odd),
            (
                "\"a\\\"b\\\\c\";q=10;w=2".to_owned(),
                "\"a\\\"b\\\\c\";r=1;t=1".to_owned()
            )
        );
        let again = Report::new("site", &rule, &decision(10)).with_policy(&POLICY);
        assert!(std::ptr::eq(again.policy.unwrap(), kept), "rendered once");
        // Another limit (an override): written for that response, not kept.
        let overridden = Report::new("site", &rule, &decision(7)).with_policy(&POLICY);
        assert!(overridden.policy.is_none());
        assert_eq!(render(overridden), "\"site\";q=7;w=2");
        let longer = Rule::fixed_window(10, Duration::from_secs(60));
        let other = Report::new("site", &longer, &decision(10)).with_policy(&POLICY);
        assert_eq!(render(other), "\"site\";q=10;w=60");
        // With more than one rule the field lists them all.
        let mut headers = HeaderMap::new();
        append_rate_limit_headers(HeaderStyle::Draft, [&again, &other], &mut headers);
        assert_eq!(
            headers.get("ratelimit-policy").unwrap(),
            "\"site\";q=10;w=2, \"site\";q=10;w=60"
        );
    }

    #[test]
    fn state_values_share_blocks_and_stay_whole() {
        // Enough values to fill several blocks, all alive at once, then
        // checked: none is overwritten by a later one or by a new block.
        let values: Vec<HeaderValue> = (0..2_000u64)
            .map(|i| state_value(b"\"site\"", i * 1_000_003, i % 61).unwrap())
            .collect();
        for (i, value) in (0..2_000u64).zip(&values) {
            assert_eq!(value, &format!("\"site\";r={};t={}", i * 1_000_003, i % 61));
        }
        // A value longer than a block gets a block of its own.
        let long = vec![b'a'; 5_000];
        let value = state_value(&long, 1, 2).unwrap();
        assert_eq!(value.len(), 5_000 + 8);
    }

    #[test]
    fn draft_headers_are_structured_field_lists() {
        let reports = [
            Report {
                name: "burst",
                limit: 10,
                period: Duration::from_millis(1500),
                remaining: 3,
                reset_after: Duration::from_millis(200),
                policy: None,
            },
            Report {
                name: "say \"hi\"",
                limit: 1000,
                period: Duration::from_secs(3600),
                remaining: 999,
                reset_after: Duration::from_secs(3599),
                policy: None,
            },
            Report {
                name: "naïve\\",
                limit: u64::MAX,
                period: Duration::ZERO,
                remaining: 5,
                reset_after: Duration::ZERO,
                policy: None,
            },
        ];
        let mut headers = HeaderMap::new();
        append_rate_limit_headers(HeaderStyle::Both, &reports, &mut headers);
        let mut rendered: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        rendered.sort();
        let mut expected = [
            (
                "ratelimit-policy",
                r#""burst";q=10;w=2, "say \"hi\"";q=1000;w=3600, "na?ve\\";q=18446744073709551615;w=1"#,
            ),
            (
                "ratelimit",
                r#""burst";r=3;t=1, "say \"hi\"";r=999;t=3599, "na?ve\\";r=5;t=0"#,
            ),
            ("x-ratelimit-limit", "10"),
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()));
        expected.sort();
        assert_eq!(rendered, expected);
    }
}
