//! Client identity and key subjects, from hostile headers too.

use ::http::{HeaderMap, HeaderName, HeaderValue};

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
    assert_eq!(
        open.client_ip(ip("203.0.113.7"), &spoofed),
        ip("203.0.113.7")
    );

    let proxied = HttpOptions::new().trust_proxies(["10.0.0.0/8"]).unwrap();
    assert_eq!(proxied.client_ip(ip("10.0.0.2"), &spoofed), ip("9.9.9.9"));
    // A client-sent address left of the real one is ignored: the
    // right-most untrusted hop wins.
    let chain = headers(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7, 10.0.0.5")]);
    assert_eq!(proxied.client_ip(ip("10.0.0.2"), &chain), ip("203.0.113.7"));
    // What the headers a request carries name, read with the default
    // (`ClientHeader::Any`).
    type Pairs<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Pairs<'_>, Option<IpAddr>); 6] = [
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
            proxied.client_ip(ip("10.0.0.2"), &headers(pairs)),
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
        assert_eq!(options.client_ip(ip("10.0.0.2"), &added), ip("203.0.113.7"));
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
            pinned.client_ip(ip("10.0.0.2"), &disagreeing),
            client,
            "{header:?}"
        );
    }
    assert_eq!(proxied.client_ip(None, &spoofed), None);
}

/// Header lines of any bytes, as a server may pass them on.
struct Raw(Vec<(&'static str, Vec<u8>)>);

impl Headers for Raw {
    fn values<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        let name = name.to_owned();
        self.0
            .iter()
            .filter(move |(n, _)| *n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// A byte that is not text spoils only its own hop: the hop a trusted
/// proxy appended after it still names the client. (The whole line used
/// to become one unreadable hop, so the client was unknown: refused,
/// or put in the budget shared by unknown clients.)
#[test]
fn a_hop_that_is_not_text_spoils_only_itself() {
    let trusted = HttpOptions::new().trust_proxies(["10.0.0.0/8"]).unwrap();
    let line = Raw(vec![(
        "x-forwarded-for",
        b"1.1.1.1, \xff\xfe, 203.0.113.7, 10.0.0.5".to_vec(),
    )]);
    assert_eq!(trusted.client_ip(ip("10.0.0.1"), &line), ip("203.0.113.7"));
    // Nearest the proxy: that hop is the client, and it cannot be read.
    let nearest = Raw(vec![("x-forwarded-for", b"203.0.113.7, \xff".to_vec())]);
    assert_eq!(trusted.client_ip(ip("10.0.0.1"), &nearest), None);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

    /// Any bytes a client sends before the hop its trusted proxy
    /// appends: that hop is the client, in `X-Forwarded-For` and
    /// `Forwarded` alike, behind a chain of trusted proxies too.
    #[test]
    fn any_bytes_before_the_proxys_hop_leave_the_client_known(
        garbage in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        proxies in 0..3usize,
    ) {
        let trusted = HttpOptions::new().trust_proxies(["10.0.0.0/8"]).unwrap();
        for (name, header, hop, node) in [
            ("x-forwarded-for", ClientHeader::XForwardedFor, "203.0.113.7", ""),
            ("forwarded", ClientHeader::Forwarded, "for=203.0.113.7", "for="),
        ] {
            let mut value = garbage.clone();
            value.extend_from_slice(b", ");
            value.extend_from_slice(hop.as_bytes());
            for p in 0..proxies {
                value.extend_from_slice(format!(", {node}10.0.0.{p}").as_bytes());
            }
            let headers = Raw(vec![(name, value)]);
            let pinned = trusted.clone().client_header(header);
            proptest::prop_assert_eq!(pinned.client_ip(ip("10.0.0.9"), &headers), ip("203.0.113.7"));
        }
    }

    /// Any bytes in every forwarding header (control bytes, invalid
    /// UTF-8, commas, quotes): no panic, and an untrusted peer is
    /// always the client.
    #[test]
    fn forwarding_headers_of_any_bytes_never_panic(
        lines in proptest::collection::vec(
            (0..3usize, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..120)),
            0..6,
        ),
    ) {
        let names = ["forwarded", "x-forwarded-for", "x-real-ip"];
        let headers = Raw(lines.into_iter().map(|(n, v)| (names[n], v)).collect());
        let trusted = HttpOptions::new().trust_proxies(["0.0.0.0/0", "::/0"]).unwrap();
        for header in [ClientHeader::Any, ClientHeader::Forwarded, ClientHeader::XForwardedFor, ClientHeader::XRealIp] {
            let _ = trusted.clone().client_header(header).client_ip(ip("10.0.0.1"), &headers);
        }
        let open = HttpOptions::new();
        proptest::prop_assert_eq!(open.client_ip(ip("203.0.113.5"), &headers), ip("203.0.113.5"));
    }
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
        let _ = trusted.client_ip(ip("10.0.0.1"), &map);
        let open = HttpOptions::new();
        proptest::prop_assert_eq!(open.client_ip(ip("203.0.113.5"), &map), ip("203.0.113.5"));
    }

    #[test]
    fn header_values_never_escape_the_key(value in proptest::collection::vec(0x20u8..=0xff, 0..2000)) {
        let Ok(header) = HeaderValue::from_bytes(&value) else { return Ok(()); };
        let subject = HttpOptions::new().header_subject(b"secret", "x-api-key", Some(header.as_bytes()));
        let part = subject.strip_prefix(":header:x-api-key:").unwrap();
        proptest::prop_assert!(part.len() <= crate::keys::MAX_PART);
        proptest::prop_assert!(part.starts_with('#') && part.len() == 33);
        proptest::prop_assert!(!part.contains([':', '{', '}', '*', '\n', ' ']), "escaped: {:?}", part);
    }
}

/// An app's refusal fields are checked once, when configured: a name in
/// any case is fine, an invalid name or value a configuration error.
/// (Names went through `HeaderName::from_static` at every refusal,
/// which panics on `"X-Reason"`.)
#[test]
fn refusal_fields_are_checked_when_configured() {
    let with = |name: &'static str, value: &'static str| {
        HttpOptions::new().on_refusal(
            move |_| Refusal {
                status: StatusCode::TOO_MANY_REQUESTS,
                headers: vec![(name, value.to_owned())],
                body: String::new(),
            },
            false,
        )
    };
    for good in ["X-Reason", "x-reason", "Cache-Control", "X_Odd!Name"] {
        assert!(with(good, "slow down").is_ok(), "{good}");
    }
    for bad in ["X Reason", "", "x-reason:", "é", "x\n"] {
        let error = with(bad, "v").unwrap_err().to_string();
        assert!(error.contains("not a header field name"), "{bad}: {error}");
    }
    let error = with("X-Reason", "a\r\nb").unwrap_err().to_string();
    assert!(error.contains("cannot be sent"), "{error}");
}

#[test]
fn ipv4_mapped_addresses_are_ipv4() {
    let options = HttpOptions::new().trust_proxies(["127.0.0.1"]).unwrap();
    assert_eq!(
        options.client_ip(ip("::ffff:203.0.113.9"), &HeaderMap::new()),
        ip("203.0.113.9")
    );
    assert_eq!(
        options.client_ip(
            ip("::ffff:127.0.0.1"),
            &headers(&[("x-real-ip", "1.2.3.4")])
        ),
        ip("1.2.3.4")
    );
}

/// `:ip:<address>` for the key of the client behind `peer`, or `None`.
fn client_subject(options: &HttpOptions, peer: &str) -> Option<String> {
    let peer = peer.parse::<std::net::SocketAddr>().ok().map(|a| a.ip());
    options
        .client_ip(peer, &HeaderMap::new())
        .map(|ip| options.subject_with(b"secret", ip))
}

#[test]
fn ipv6_clients_are_grouped_by_prefix() {
    let by_64 = HttpOptions::new();
    let a = client_subject(&by_64, "[2001:db8:1:2:aaaa::1]:443").unwrap();
    let b = client_subject(&by_64, "[2001:db8:1:2:bbbb::9]:443").unwrap();
    let c = client_subject(&by_64, "[2001:db8:1:3::1]:443").unwrap();
    assert_eq!(a, ":ip:2001:db8:1:2::/64");
    assert_eq!(a, b, "one /64, one budget");
    assert_ne!(a, c);
    let alone = HttpOptions::new().ipv6_prefix(128);
    assert_ne!(
        client_subject(&alone, "[2001:db8:1:2:aaaa::1]:443"),
        client_subject(&alone, "[2001:db8:1:2:bbbb::9]:443")
    );
    assert_eq!(
        client_subject(&by_64, "[::ffff:198.51.100.7]:80").unwrap(),
        ":ip:198.51.100.7"
    );
    assert_eq!(
        client_subject(&by_64, "198.51.100.7:80").unwrap(),
        ":ip:198.51.100.7"
    );
    assert_eq!(client_subject(&by_64, "no peer"), None);
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
fn client_keys_write_addresses_as_display_does() {
    let readable = HttpOptions::new();
    let digested = HttpOptions::new().digest_client_ips(true);
    let v4 = [
        [0, 0, 0, 0],
        [1, 2, 3, 4],
        [9, 10, 99, 100],
        [199, 200, 249, 250],
        [255, 255, 255, 255],
        [10, 0, 100, 7],
    ];
    let v6 = ["2001:db8::1", "::1", "fe80::1:2:3:4", "::"];
    let ips = v4
        .into_iter()
        .map(IpAddr::from)
        .chain(v6.iter().map(|t| t.parse::<IpAddr>().unwrap()));
    for ip in ips {
        let shown = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => {
                let masked = u128::from(v6) & (u128::MAX << 64);
                format!("{}/64", std::net::Ipv6Addr::from(masked))
            }
        };
        assert_eq!(
            readable.ip_key("limiter:api", b"s", ip),
            format!("limiter:api:ip:{shown}")
        );
        let mut digest = String::from("limiter:api:ip:");
        keys::push_digest(&mut digest, b"s", shown.as_bytes());
        assert_eq!(digested.ip_key("limiter:api", b"s", ip), digest);
    }
}

/// An operator's subject for an IPv4-mapped address (as a dual-stack log
/// writes it) is the one its requests are counted under.
#[test]
fn the_subject_of_an_ipv4_mapped_address_is_its_ipv4_ones() {
    let limiter = crate::limiter::RateLimiter::in_memory();
    let options = HttpOptions::new();
    let mapped: IpAddr = "::ffff:1.2.3.4".parse().unwrap();
    assert_eq!(options.subject_of(&limiter, mapped).unwrap(), ":ip:1.2.3.4");
}
