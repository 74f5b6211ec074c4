//! Where a registry may send streamd: its token realm and its redirects stay within the
//! registry's own hosts (the registry, the other endpoints of its registries.conf entry, and
//! the public registries' token and blob hosts of [`TRUSTED_HOSTS`]), and no connection goes
//! to a link-local or cloud-metadata address, whether a URL names it or a host name resolves
//! to it ([`GuardedResolver`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Hosts every registry may send streamd to (a realm or a redirect): the CDN that serves the
/// blobs of quay.io, registry.redhat.io and registry.access.redhat.com (`cdn.quay.io`,
/// `cdn01.quay.io` … `cdn06.quay.io`: OpenShift's "Configuring your firewall" allow-list), and
/// Docker Hub's token service and blob hosts (docker/docs:
/// content/manuals/desktop/setup/allow-list.md). `*.` matches any host below the domain.
pub const TRUSTED_HOSTS: [&str; 5] = [
    "*.quay.io",
    "auth.docker.io",
    "production.cloudflare.docker.com",
    "production.cloudfront.docker.com",
    "docker-images-prod.6aa30f8b08e16409b46e0173d6de2f56.r2.cloudflarestorage.com",
];

/// A host streamd refuses to contact, as the error source a connection or redirect carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{host}: {why}")]
pub(super) struct Refused {
    /// The host as named (or resolved).
    pub(super) host: String,
    /// Why.
    pub(super) why: String,
}

/// Why `ip` is never contacted, if it is not: link-local ranges (where every cloud's instance
/// metadata service lives) and the metadata addresses outside them.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_v4(v4);
            }
            let s = v6.segments();
            // NAT64's well-known prefix carries an IPv4 address in its last 32 bits.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                return forbidden_v4(Ipv4Addr::new(a, b, c, d));
            }
            if s[0] & 0xffc0 == 0xfe80 {
                return Some("an IPv6 link-local address (fe80::/10)");
            }
            METADATA_V6
                .iter()
                .find(|(a, _)| *a == v6)
                .map(|(_, why)| *why)
        }
    }
}

const METADATA_V6: [(Ipv6Addr, &str); 3] = [
    (
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
        "AWS instance metadata (IPv6)",
    ),
    (
        Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254),
        "Google Cloud instance metadata (IPv6)",
    ),
    (
        Ipv6Addr::new(0xfd00, 0xc1, 0, 0, 0, 0, 0xa9fe, 0xa9fe),
        "Oracle Cloud instance metadata (IPv6)",
    ),
];

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_link_local() {
        Some("a link-local address (169.254.0.0/16, where cloud instance metadata lives)")
    } else if ip == Ipv4Addr::new(100, 100, 100, 200) {
        Some("Alibaba Cloud instance metadata")
    } else if ip == Ipv4Addr::new(168, 63, 129, 16) {
        Some("the Azure WireServer")
    } else {
        None
    }
}

/// The host of `url` when it is an address streamd never contacts.
pub(super) fn forbidden_literal(url: &reqwest::Url) -> Option<Refused> {
    let host = url.host_str()?;
    let ip: IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()?;
    forbidden(ip).map(|why| Refused {
        host: ip.to_string(),
        why: format!("refused: {why}"),
    })
}

/// `host` (no port) matches `pattern` (`host`, or `*.domain` for any host below it).
pub(super) fn matches(pattern: &str, host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(domain) => host
            .strip_suffix(&domain.to_ascii_lowercase())
            .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
        None => host == pattern.to_ascii_lowercase(),
    }
}

/// `host[:port]` of a URL as a pull secret or registries.conf names it (the port only when it
/// is not the scheme's default).
pub(super) fn authority(url: &reqwest::Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    }
}

/// The host name of `host[:port]` (an IPv6 literal keeps its brackets).
pub(super) fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// Resolves names as the system does, and drops the addresses [`forbidden`] names; a name
/// that resolves to nothing else is refused with a [`Refused`] error.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct GuardedResolver;

/// The addresses of `name` that may be contacted.
pub(super) fn allowed_addresses(
    name: &str,
    addrs: impl IntoIterator<Item = SocketAddr>,
) -> Result<Vec<SocketAddr>, Refused> {
    let mut refused = None;
    let ok: Vec<SocketAddr> = addrs
        .into_iter()
        .filter(|a| match forbidden(a.ip()) {
            Some(why) => {
                refused.get_or_insert((a.ip(), why));
                false
            }
            None => true,
        })
        .collect();
    match (ok.is_empty(), refused) {
        (true, Some((ip, why))) => Err(Refused {
            host: name.to_string(),
            why: format!("refused: it resolves to {ip}, {why}"),
        }),
        _ => Ok(ok),
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((name.as_str(), 0)).await?;
            let ok = allowed_addresses(&name, addrs)?;
            Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_and_link_local_addresses_are_forbidden() {
        for ip in [
            "169.254.169.254",
            "169.254.170.2",
            "169.254.0.1",
            "100.100.100.200",
            "168.63.129.16",
            "fe80::1",
            "febf::1",
            "fd00:ec2::254",
            "fd20:ce::254",
            "fd00:c1::a9fe:a9fe",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert!(forbidden(ip).is_some(), "{ip}");
        }
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "100.100.100.201",
            "169.253.255.255",
            "::1",
            "fec0::1",
            "fd00:ec2::253",
            "2600:1f18::1",
        ] {
            let ip: IpAddr = ip.parse().expect("ip");
            assert_eq!(forbidden(ip), None, "{ip}");
        }
    }

    /// The unit denies the metadata addresses to the whole process too (issue 20 §6), IPv6
    /// included: every one the registry client refuses by name, except Azure's WireServer,
    /// which is the node's DNS resolver there.
    #[test]
    fn the_unit_denies_every_metadata_address() {
        let unit = include_str!("../../../systemd/streamd.service");
        let denied: Vec<IpAddr> = unit
            .lines()
            .filter_map(|l| l.strip_prefix("IPAddressDeny="))
            .flat_map(str::split_whitespace)
            .map(|a| a.parse().expect("an address"))
            .collect();
        let mut wanted: Vec<IpAddr> = METADATA_V6.iter().map(|(a, _)| IpAddr::V6(*a)).collect();
        wanted.extend(
            ["169.254.169.254", "100.100.100.200"].map(|a| a.parse::<IpAddr>().expect("ip")),
        );
        for ip in &wanted {
            assert!(
                denied.contains(ip),
                "{ip} is not in the unit's IPAddressDeny: {denied:?}"
            );
        }
        for ip in &denied {
            assert!(forbidden(*ip).is_some(), "{ip} is denied by the unit only");
        }
    }

    #[test]
    fn literals_in_urls_are_refused_by_address() {
        let url = |u: &str| reqwest::Url::parse(u).expect("url");
        let r =
            forbidden_literal(&url("http://169.254.169.254/latest/meta-data/")).expect("refused");
        assert_eq!(r.host, "169.254.169.254");
        assert!(forbidden_literal(&url("http://[fd00:ec2::254]/")).is_some());
        assert!(forbidden_literal(&url("https://[::ffff:a9fe:a9fe]:8443/")).is_some());
        assert!(forbidden_literal(&url("https://quay.io/v2/")).is_none());
        assert!(forbidden_literal(&url("http://127.0.0.1:5000/v2/")).is_none());
    }

    #[test]
    fn resolved_addresses_are_filtered() {
        let a = |s: &str| -> SocketAddr { s.parse().expect("addr") };
        let mixed = allowed_addresses("x.example", [a("169.254.169.254:0"), a("192.0.2.1:0")])
            .expect("one usable");
        assert_eq!(mixed, [a("192.0.2.1:0")]);
        let e = allowed_addresses("meta.example", [a("[fd00:ec2::254]:0")]).expect_err("none");
        assert_eq!(e.host, "meta.example");
        assert!(e.why.contains("fd00:ec2::254"), "{e}");
        assert_eq!(allowed_addresses("empty.example", []), Ok(vec![]));
    }

    #[test]
    fn host_patterns() {
        assert!(matches("*.quay.io", "cdn01.quay.io"));
        assert!(matches("*.quay.io", "CDN.Quay.IO"));
        assert!(!matches("*.quay.io", "quay.io"));
        assert!(!matches("*.quay.io", "evilquay.io"));
        assert!(matches("auth.docker.io", "auth.docker.io"));
        assert!(!matches("auth.docker.io", "auth.docker.io.evil"));
        assert_eq!(host_name("r.example:5000"), "r.example");
        assert_eq!(host_name("[::1]:5000"), "[::1]");
        let u = reqwest::Url::parse("https://R.example:443/x").expect("url");
        assert_eq!(authority(&u), "r.example");
        let u = reqwest::Url::parse("http://localhost:8080/x").expect("url");
        assert_eq!(authority(&u), "localhost:8080");
    }
}
