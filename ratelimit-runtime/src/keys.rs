//! The key grammar, in one place: a budget's storage key is
//!
//! ```text
//! prefix + name + subject
//! limiter:  login   :arg:user:ann
//! ```
//!
//! - the *prefix*: the rule's `prefix` ([`DEFAULT_PREFIX`] unless it says
//!   otherwise), a namespace in a shared Redis;
//! - the *name*: the rule's name as keys hold it: its `key` as written, with
//!   `{param}` placeholders rendered (for a fn without `key`, its module
//!   path and name);
//! - the *subject*, whose budget it is: empty for everyone, else `:` and a
//!   tag, [`IP`] (`:ip:1.2.3.4`), [`HEADER`] (`:header:x-api-key:#<digest>`),
//!   [`ARG`] (`:arg:user:ann`) or [`CLOSURE`] (`:key:<value>`).
//!
//! Parts that come from callers (parameters rendered into `{param}`,
//! `arg(..)`, header values, closure keys) are untrusted: they are kept as
//! they are only when short and made of safe characters, and replaced by a
//! digest otherwise. So no caller can make a key long (Redis memory, our
//! memory), reach outside its place in the key (`:`), touch a Redis Cluster
//! hash tag (`{`, `}`), a glob (`*`, `?`, `[`, `]`), or whitespace and
//! control characters. Keys reach Lua as data (`KEYS[1]`), never as code.

use std::fmt::{self, Write as _};
#[cfg(feature = "http")]
use std::net::IpAddr;

/// The prefix of a rule that names none.
pub const DEFAULT_PREFIX: &str = "limiter:";

/// The subject tag of `by = ip` (and a middleware's `by_ip`).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) const IP: &str = ":ip:";
/// The subject tag of `by = header(..)` (and a middleware's `by_header`).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) const HEADER: &str = ":header:";
/// The subject tag of `by = arg(..)`.
pub const ARG: &str = ":arg:";
/// The subject tag of a middleware's `by_key` closure.
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
pub(crate) const CLOSURE: &str = ":key:";

/// The header names of every `by = header(..)` rule of the program
/// (gathered by the linker): what a handler's request keeps of its
/// headers, and what tells a limiter it needs a key secret.
#[linkme::distributed_slice]
pub static HEADER_SUBJECTS: [&'static str];

/// The longest part kept as it is.
pub(crate) const MAX_PART: usize = 64;

/// `base` followed by the subject of the client `ip` (`:ip:1.2.3.4`, an
/// IPv6 address masked to its first `ipv6_prefix` bits and written with
/// them, `:ip:2001:db8::/64`), built in place: the address written straight
/// into the key (no formatting machinery, no intermediate strings), then
/// replaced by its keyed digest (`:ip:#<digest>`) under `digest`'s secret.
#[cfg(feature = "http")]
pub(crate) fn ip_key(base: &str, ip: IpAddr, ipv6_prefix: u8, digest: Option<&[u8]>) -> String {
    // The longest subject: `:ip:` and a masked IPv6 address with its
    // prefix (at most 39 + 4 characters), or a digest (33).
    let mut key = String::with_capacity(base.len() + IP.len() + 44);
    key.push_str(base);
    key.push_str(IP);
    let start = key.len();
    match ip {
        IpAddr::V4(v4) => push_ipv4(&mut key, v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            let masked = std::net::Ipv6Addr::from(u128::from(v6) & mask);
            let _ = write!(key, "{masked}/{bits}");
        }
    }
    if let Some(secret) = digest {
        let address = key.split_off(start);
        push_digest(&mut key, secret, address.as_bytes());
    }
    key
}

/// `base` followed by the subject of the clients a per-client rule cannot
/// tell, when they share one budget: `:ip:unknown`.
#[cfg(feature = "http")]
pub(crate) fn unknown_client_key(base: &str) -> String {
    [base, IP, "unknown"].concat()
}

/// `base` followed by the subject of `value` of the header `name`
/// (lowercase): `:header:name:#<digest>` under `secret`. The value itself
/// is never in a key.
#[cfg(feature = "http")]
pub(crate) fn header_key(base: &str, secret: &[u8], name: &str, value: &[u8]) -> String {
    let mut key = String::with_capacity(base.len() + HEADER.len() + name.len() + 34);
    key.push_str(base);
    key.push_str(HEADER);
    key.push_str(name);
    key.push(':');
    push_digest(&mut key, secret, value);
    key
}

/// Appends `ip` in dotted decimal, as its `Display` writes it.
#[cfg(feature = "http")]
fn push_ipv4(out: &mut String, ip: std::net::Ipv4Addr) {
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// The key of `subject`'s budget under the rule `name` kept under `prefix`.
/// `subject` is written as [`RateLimiter::reset_named`](crate::RateLimiter::reset_named)
/// takes it: `""` for everyone, else its tag without the leading `:`
/// (`"ip:1.2.3.4"`, `"arg:user:ann"`).
pub(crate) fn key(prefix: &str, name: &str, subject: &str) -> String {
    let subject = subject.trim_start_matches(':');
    let mut key = String::with_capacity(prefix.len() + name.len() + 1 + subject.len());
    key.push_str(prefix);
    key.push_str(name);
    if !subject.is_empty() {
        key.push(':');
        key.push_str(subject);
    }
    key
}

/// Where a subject's own limit (see
/// [`Rule::with_subject_limits`](crate::Rule::with_subject_limits)) is kept
/// on Redis for the budget `key`: a hash of `count` and `burst` at `key` and
/// `#limit`, with `key` braced first when it has no hash tag, so that both
/// live in one slot of a cluster; `None` for a key with a `}` but no hash
/// tag. `lua/prelude.lua` (`limit_key`) finds it the same way.
#[cfg(feature = "redis")]
pub(crate) fn limit_key(key: &str) -> Option<String> {
    if let Some(open) = key.find('{')
        && key[open + 1..].find('}').is_some_and(|close| close > 0)
    {
        return Some(format!("{key}#limit"));
    }
    (!key.contains('}')).then(|| format!("{{{key}}}#limit"))
}

/// The subject of `key`, a key of the rule whose keys start with `base`
/// (its prefix and name): what follows `base`, with its leading `:`.
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
pub(crate) fn subject_of<'k>(key: &'k str, base: &str) -> &'k str {
    key.strip_prefix(base).unwrap_or_default()
}

/// The subject of a middleware's `by_key` closure's `value`.
#[cfg_attr(not(any(feature = "actix", feature = "tower")), allow(dead_code))]
pub(crate) fn closure_subject(value: &str) -> String {
    let mut subject = String::with_capacity(CLOSURE.len() + value.len().min(MAX_PART + 1));
    subject.push_str(CLOSURE);
    push_part(&mut subject, value);
    subject
}

/// The bytes of `parts` one after the other, at compile time: what
/// [`static_key!`](crate::__rate_limit_static_key) builds a key with.
/// `N` is their length ([`len`]).
pub const fn concat<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut at = 0;
    let mut i = 0;
    while i < parts.len() {
        let bytes = parts[i].as_bytes();
        let mut j = 0;
        while j < bytes.len() {
            out[at] = bytes[j];
            at += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(at == N, "the parts' length");
    out
}

/// The length of `parts` one after the other.
pub const fn len(parts: &[&str]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < parts.len() {
        n += parts[i].len();
        i += 1;
    }
    n
}

/// `bytes` made of whole `&str`s ([`concat`]) as a `&str`.
pub const fn as_str(bytes: &[u8]) -> &str {
    match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(_) => panic!("parts of whole strings"),
    }
}

/// Bytes a part may hold and still be kept as it is. Not `:` (our
/// separator), `{` `}` (hash tags), `*` `?` `[` `]` (globs), `~` (marks a
/// digest), whitespace, controls, or anything outside ASCII.
fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_.@+=/!$%&()',;^|".contains(&b)
}

/// Appends `part` to `out`: as it is if short and safe, else `~` and 32 hex
/// digits of its SHA-1 (the same on every instance, so a shared Redis agrees;
/// `~` never appears in a kept part, so the two cannot collide).
pub(crate) fn push_part(out: &mut String, part: &str) {
    if part.len() <= MAX_PART && part.bytes().all(is_safe) {
        out.push_str(part);
        return;
    }
    let digest = sha1_smol::Sha1::from(part.as_bytes()).digest().bytes();
    out.push('~');
    for byte in &digest[..16] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// Appends `#` and 32 hex digits of HMAC-SHA1(`secret`, `value`): a value
/// that must not be readable in keys (a header's, an API key), the same on
/// every instance that shares the secret. `#` never appears in a kept part,
/// nor in a plain digest (`~`), so none collide.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) fn push_digest(out: &mut String, secret: &[u8], value: &[u8]) {
    let mac = hmac_sha1(secret, value);
    out.push('#');
    for byte in &mac[..16] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// HMAC-SHA1 (RFC 2104).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
fn hmac_sha1(secret: &[u8], message: &[u8]) -> [u8; 20] {
    const BLOCK: usize = 64;
    let mut key = [0u8; BLOCK];
    if secret.len() > BLOCK {
        key[..20].copy_from_slice(&sha1_smol::Sha1::from(secret).digest().bytes());
    } else {
        key[..secret.len()].copy_from_slice(secret);
    }
    let pad = |byte: u8| key.map(|k| k ^ byte);
    let mut inner = sha1_smol::Sha1::new();
    inner.update(&pad(0x36));
    inner.update(message);
    let mut outer = sha1_smol::Sha1::new();
    outer.update(&pad(0x5c));
    outer.update(&inner.digest().bytes());
    outer.digest().bytes()
}

/// A part already rendered, written as `push_part` would (what
/// `#[rate_limit]` puts in a key for a `{param}`: the rendering happens in
/// the user's code, so a type that is not `Display` is reported there).
#[derive(Debug)]
pub struct SafePart(pub String);

impl fmt::Display for SafePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::with_capacity(self.0.len().min(MAX_PART + 1));
        push_part(&mut out, &self.0);
        f.write_str(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha1_matches_rfc_2202() {
        let hex = |bytes: [u8; 20]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(
            hex(hmac_sha1(&[0x0b; 20], b"Hi There")),
            "b617318655057264e28bc0b6fb378c8ef146be00"
        );
        assert_eq!(
            hex(hmac_sha1(b"Jefe", b"what do ya want for nothing?")),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        assert_eq!(
            hex(hmac_sha1(
                &[0xaa; 80],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
    }

    fn part(text: &str) -> String {
        let mut out = String::new();
        push_part(&mut out, text);
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(5000))]

        /// Any input: no panic, a bounded part of safe characters, and the
        /// same output for the same input.
        #[test]
        fn any_part_comes_out_bounded_and_safe(text in ".{0,200}", bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            for input in [text, String::from_utf8_lossy(&bytes).into_owned()] {
                let out = part(&input);
                proptest::prop_assert!(out.len() <= MAX_PART);
                proptest::prop_assert!(out.bytes().all(|b| is_safe(b) || b == b'~'));
                proptest::prop_assert!(!out.contains([':', '{', '}', '*', '?', '[', ']']), "unsafe: {:?}", out);
                proptest::prop_assert_eq!(&out, &part(&input));
                if out.starts_with('~') {
                    proptest::prop_assert_eq!(out.len(), 33);
                } else {
                    proptest::prop_assert_eq!(&out, &input);
                }
            }
        }
    }

    #[test]
    fn short_safe_parts_stay_and_the_rest_is_digested() {
        assert_eq!(part("alice"), "alice");
        assert_eq!(part("user-42_x.y@z"), "user-42_x.y@z");
        for hostile in [
            "a:b",
            "{tag}",
            "a*",
            "line\nbreak",
            "sp ace",
            "é",
            "~x",
            &"x".repeat(65),
        ] {
            let out = part(hostile);
            assert!(
                out.starts_with('~') && out.len() == 33,
                "{hostile:?} -> {out}"
            );
        }
        assert_ne!(part("a:b"), part("a:c"));
        assert_eq!(
            part("a:b"),
            part("a:b"),
            "stable across calls and instances"
        );
        assert_eq!(part(""), "");
    }
}
