//! The SSRF guard of HTTP MCP servers: the node agent connects only to public addresses
//! unless the operator allows a range (`--mcp-allow-cidr`).
//!
//! A declared URL is attacker-chosen (the agent can edit `.mcp`; a server without secrets
//! needs no binding), and the node agent sits on the host network next to the replicas,
//! etcd, other node agents and the cloud metadata service. So:
//! - [`TargetPolicy::check_url`] resolves the host before the client starts and refuses a
//!   target none of whose addresses is allowed, with a typed error naming the address;
//! - the HTTP client connects only through [`GuardedResolver`], which resolves again and
//!   returns only allowed addresses: the address connected to is the address checked, so a
//!   name that resolves to a public address first and to 127.0.0.1 later (DNS rebinding)
//!   still reaches nothing private;
//! - an IP-literal URL never reaches a resolver, so its address is checked as written
//!   (and its redirects, see [`guarded_client`]);
//! - no proxy from the environment (a proxy would connect on our behalf, unchecked);
//! - redirects are followed only to the same origin (307/308, as rmcp's own client), and an
//!   IP-literal redirect target is checked too.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use berth_workspace::error::{McpRefusal, Result, WorkspaceError};

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// An address range, `address/prefix` (IPv4 or IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Whether `address` lies in the range (an IPv4-mapped IPv6 address counts as IPv4).
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address.to_canonical()) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                prefix_matches(&network.octets(), &address.octets(), self.prefix)
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                prefix_matches(&network.octets(), &address.octets(), self.prefix)
            }
            _ => false,
        }
    }
}

fn prefix_matches(network: &[u8], address: &[u8], prefix: u8) -> bool {
    let whole = usize::from(prefix / 8);
    let rest = prefix % 8;
    if network[..whole] != address[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        network[whole] & mask == address[whole] & mask
    }
}

impl FromStr for Cidr {
    type Err = String;

    /// `10.1.0.0/16`, `fd00::/8`; a bare address is a single host (`/32`, `/128`).
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address.parse().map_err(|_| format!("{text:?} is not an address/prefix range"))?;
        let network = network.to_canonical();
        let bits = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|prefix| *prefix <= bits)
                .ok_or_else(|| format!("{text:?}: the prefix must be 0..={bits}"))?,
        };
        Ok(Self { network, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}/{}", self.network, self.prefix)
    }
}

/// Which addresses the node connects to for HTTP MCP servers: public ones, plus the
/// operator's allowed ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetPolicy {
    pub allowed: Vec<Cidr>,
}

impl TargetPolicy {
    pub fn new(allowed: Vec<Cidr>) -> Self {
        Self { allowed }
    }

    /// `Err(class)` when `address` is in a refused class and no allowed range holds it.
    /// The node's own addresses (any class) are refused too ([`node_addresses`]).
    pub fn check(&self, address: IpAddr) -> std::result::Result<(), &'static str> {
        self.check_against(address, &node_addresses())
    }

    /// [`Self::check`] with the node's addresses read once by the caller (a resolver checks
    /// every address a name resolves to).
    fn check_against(&self, address: IpAddr, own: &[IpAddr]) -> std::result::Result<(), &'static str> {
        let class = non_public_class(address).or_else(|| {
            let canonical = address.to_canonical();
            own.iter().any(|own| own.to_canonical() == canonical).then_some("the node's own address")
        });
        match class {
            Some(class) if !self.allowed.iter().any(|range| range.contains(address)) => Err(class),
            _ => Ok(()),
        }
    }

    /// Resolves the host of `url` and refuses it (`McpRefused(TargetForbidden)`) when no
    /// address is allowed. The connection itself is guarded again by [`GuardedResolver`].
    pub async fn check_url(&self, server: &str, url: &str) -> Result<()> {
        let refused = |host: &str, address: IpAddr, class| WorkspaceError::McpRefused {
            server: server.to_owned(),
            reason: McpRefusal::TargetForbidden { host: host.to_owned(), address, class },
        };
        let parsed = reqwest::Url::parse(url)
            .map_err(|error| WorkspaceError::InvalidArgument(format!("mcp server {server:?}: url: {error}")))?;
        let port = parsed.port_or_known_default().unwrap_or(443);
        let Some(host) = parsed.host_str() else {
            return Err(WorkspaceError::InvalidArgument(format!("mcp server {server:?}: url has no host")));
        };
        let addresses: Vec<IpAddr> = match literal_address(&parsed) {
            Some(address) => vec![address],
            None => tokio::net::lookup_host((host, port))
                .await
                .map_err(|error| WorkspaceError::McpServerFailed {
                    server: server.to_owned(),
                    reason: format!("cannot resolve {host}: {error}"),
                })?
                .map(|socket| socket.ip())
                .collect(),
        };
        let own = node_addresses();
        let mut first_refusal = None;
        for address in addresses {
            match self.check_against(address, &own) {
                Ok(()) => return Ok(()),
                Err(class) => {
                    first_refusal.get_or_insert((address, class));
                }
            }
        }
        match first_refusal {
            Some((address, class)) => Err(refused(host, address, class)),
            None => Err(WorkspaceError::McpServerFailed {
                server: server.to_owned(),
                reason: format!("{host} resolves to no address"),
            }),
        }
    }
}

/// The node's own addresses, read from the kernel at each call (`/proc/net/fib_trie` for
/// IPv4, `/proc/net/if_inet6` for IPv6), so an address the node gains later counts too.
/// Replicas, node agents, etcd and metrics listen on them: a public-looking address of the
/// node is as much the cluster as loopback is.
pub fn node_addresses() -> Vec<IpAddr> {
    let mut found = std::fs::read_to_string("/proc/net/fib_trie").map(|trie| local_v4(&trie)).unwrap_or_default();
    found.extend(std::fs::read_to_string("/proc/net/if_inet6").map(|table| local_v6(&table)).unwrap_or_default());
    found
}

/// The `/32 host LOCAL` entries of a fib_trie dump: the leaf line (`|-- a.b.c.d`) names
/// the address, the line after it says it is one of this host's.
fn local_v4(trie: &str) -> Vec<IpAddr> {
    let mut found: Vec<IpAddr> = Vec::new();
    let mut leaf = None;
    for line in trie.lines().map(str::trim) {
        if let Some(address) = line.strip_prefix("|-- ") {
            leaf = address.parse::<Ipv4Addr>().ok();
        } else if line.starts_with("/32 host LOCAL")
            && let Some(address) = leaf.map(IpAddr::V4).filter(|address| !found.contains(address))
        {
            found.push(address);
        }
    }
    found
}

/// The addresses of `/proc/net/if_inet6` (32 hex digits first on each line).
fn local_v6(table: &str) -> Vec<IpAddr> {
    table
        .lines()
        .filter_map(|line| u128::from_str_radix(line.split_whitespace().next()?, 16).ok())
        .map(|bits| IpAddr::V6(Ipv6Addr::from(bits)))
        .collect()
}

/// The address of an IP-literal URL (`http://10.0.0.1/`, `http://[::1]/`): such a URL is
/// connected to without any resolver.
fn literal_address(url: &reqwest::Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')).unwrap_or(host).parse().ok()
}

/// The class of a non-public address, `None` for a public one. IPv4-mapped, IPv4-compatible,
/// NAT64 and 6to4 IPv6 addresses are judged by the IPv4 address they carry.
pub fn non_public_class(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(address) => v4_class(address),
        IpAddr::V6(address) => v6_class(address),
    }
}

fn v4_class(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = address.octets();
    Some(match (a, b, c) {
        (0, ..) => "unspecified",
        (127, ..) => "loopback",
        (10, ..) | (172, 16..=31, _) | (192, 168, _) => "private",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "carrier-grade NAT",
        (192, 0, 0) | (198, 18..=19, _) => "reserved",
        (224..=239, ..) => "multicast",
        (240..=255, ..) => "reserved",
        _ => return None,
    })
}

fn v6_class(address: Ipv6Addr) -> Option<&'static str> {
    let segments = address.segments();
    let embedded_v4 = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if address.is_unspecified() {
        return Some("unspecified");
    }
    if address.is_loopback() {
        return Some("loopback");
    }
    if let Some(v4) = address.to_ipv4_mapped() {
        return v4_class(v4);
    }
    Some(match segments {
        // IPv4-compatible (deprecated) and NAT64: the IPv4 address in the low 32 bits.
        [0, 0, 0, 0, 0, 0, high, low] | [0x64, 0xff9b, 0, 0, 0, 0, high, low] => {
            return v4_class(embedded_v4(high, low));
        }
        // 6to4: the IPv4 address in bits 16..48.
        [0x2002, high, low, ..] => return v4_class(embedded_v4(high, low)),
        [first, ..] if first & 0xfe00 == 0xfc00 => "private (unique local)",
        [first, ..] if first & 0xffc0 == 0xfe80 => "link-local",
        [first, ..] if first & 0xffc0 == 0xfec0 => "site-local",
        [first, ..] if first & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

/// A reqwest resolver that returns only the addresses `policy` allows: the HTTP client
/// connects to nothing else.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    policy: Arc<TargetPolicy>,
}

impl GuardedResolver {
    pub fn new(policy: Arc<TargetPolicy>) -> Self {
        Self { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = Arc::clone(&self.policy);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let own = node_addresses();
            let allowed: Vec<SocketAddr> =
                resolved.iter().copied().filter(|socket| policy.check_against(socket.ip(), &own).is_ok()).collect();
            if allowed.is_empty() {
                let first = resolved.first().map(|socket| socket.ip().to_string()).unwrap_or_default();
                let refusal = format!(
                    "{host} resolves to no address the node may connect to ({first}); allow it with --mcp-allow-cidr"
                );
                return Err(refusal.into());
            }
            let addresses: Addrs = Box::new(allowed.into_iter());
            Ok(addresses)
        })
    }
}

/// The HTTP client of HTTP MCP servers: guarded resolver, no proxy, same-origin 307/308
/// redirects only (as rmcp's default client), no idle pool (rmcp's default too).
pub fn guarded_client(policy: Arc<TargetPolicy>) -> Result<reqwest::Client> {
    let redirect_policy = Arc::clone(&policy);
    let redirects = reqwest::redirect::Policy::custom(move |attempt| {
        let preserves_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin =
            attempt.previous().first().is_some_and(|original| original.origin() == attempt.url().origin());
        if literal_address(attempt.url()).is_some_and(|address| redirect_policy.check(address).is_err()) {
            attempt.error("redirect to a refused address")
        } else if !preserves_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("exceeded {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .dns_resolver(GuardedResolver::new(policy))
        .no_proxy()
        .redirect(redirects)
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|error| WorkspaceError::Backend { backend: "mcp-http", message: format!("http client: {error}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn refuses_every_non_public_class() {
        let policy = TargetPolicy::default();
        for refused in [
            "0.0.0.0",
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "fd00::1",
            "fe80::1",
            "ff02::1",
        ] {
            assert!(policy.check(ip(refused)).is_err(), "{refused} was allowed");
        }
        for public in ["1.1.1.1", "172.32.0.1", "100.128.0.1", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert_eq!(policy.check(ip(public)), Ok(()), "{public}");
        }
        assert_eq!(non_public_class(ip("169.254.169.254")), Some("link-local"));
    }

    #[test]
    fn allowed_ranges_open_exactly_themselves() {
        let policy = TargetPolicy::new(vec!["127.0.0.1/32".parse().unwrap(), "fd00:1::/32".parse().unwrap()]);
        assert_eq!(policy.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(policy.check(ip("::ffff:127.0.0.1")), Ok(()));
        assert!(policy.check(ip("127.0.0.2")).is_err());
        assert_eq!(policy.check(ip("fd00:1:ffff::1")), Ok(()));
        assert!(policy.check(ip("fd00:2::1")).is_err());
        let wide: Cidr = "10.0.0.0/9".parse().unwrap();
        assert!(wide.contains(ip("10.127.0.1")));
        assert!(!wide.contains(ip("10.128.0.1")));
        assert_eq!("10.0.0.1".parse::<Cidr>().unwrap().to_string(), "10.0.0.1/32");
        for bad in ["10.0.0.0/33", "::/129", "x/8", "10.0.0.0/", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn urls_are_checked_before_any_connection() {
        let policy = TargetPolicy::default();
        for url in ["http://127.0.0.1:9/mcp", "http://169.254.169.254/latest", "http://[::1]:9/", "http://localhost:9/"]
        {
            let refused = policy.check_url("s", url).await;
            assert!(
                matches!(refused, Err(WorkspaceError::McpRefused { reason: McpRefusal::TargetForbidden { .. }, .. })),
                "{url}: {refused:?}"
            );
        }
        let allowed = TargetPolicy::new(vec!["127.0.0.0/8".parse().unwrap()]);
        allowed.check_url("s", "http://127.0.0.1:9/mcp").await.unwrap();
    }

    /// A listener that answers every request with `response` and counts connections.
    async fn listener(address: &str, response: String) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        // reqwest needs the process's rustls provider (the service installs it at start).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = tokio::net::TcpListener::bind((address, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut request = vec![0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(response.as_bytes()).await;
            }
        });
        (port, accepted)
    }

    const OK: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

    /// The connection itself is guarded, not just the pre-check: a name that resolves to a
    /// refused address (what a rebinding name does at connect time) reaches nothing.
    #[tokio::test]
    async fn the_client_connects_only_to_allowed_addresses() {
        let (port, accepted) = listener("127.0.0.1", OK.to_owned()).await;
        let refusing = guarded_client(Arc::new(TargetPolicy::default())).unwrap();
        let refused = refusing.get(format!("http://localhost:{port}/")).send().await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "the guarded client connected");
        let allowing = guarded_client(Arc::new(TargetPolicy::new(vec!["127.0.0.1/32".parse().unwrap()]))).unwrap();
        let answer = allowing.get(format!("http://localhost:{port}/")).send().await.unwrap();
        assert_eq!(answer.status(), 200);
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// The node's own addresses are the cluster's too (replicas, node agents, etcd and
    /// metrics listen there), public-looking or not: refused unless allowed.
    #[tokio::test]
    async fn the_nodes_own_addresses_are_refused() {
        let own: Vec<IpAddr> = node_addresses().into_iter().filter(|address| !address.is_loopback()).collect();
        assert!(!own.is_empty(), "this host has no address but loopback");
        let policy = TargetPolicy::default();
        for address in &own {
            // An IP literal is connected to without a resolver: `check_url` is its guard.
            let host = if address.is_ipv6() { format!("[{address}]") } else { address.to_string() };
            let url = format!("http://{host}:8080/mcp");
            let refused = policy.check_url("s", &url).await;
            assert!(
                matches!(refused, Err(WorkspaceError::McpRefused { reason: McpRefusal::TargetForbidden { .. }, .. })),
                "{url}: {refused:?}"
            );
        }
        let allowing = TargetPolicy::new(own.iter().map(|address| address.to_string().parse().unwrap()).collect());
        assert_eq!(allowing.check(own[0]), Ok(()), "an allowed range must open a node address");
    }

    #[test]
    fn node_address_tables_parse() {
        let trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     \
                    +-- 192.0.2.0/24 2 0 2\n        |-- 192.0.2.2\n           /32 host LOCAL\n        \
                    |-- 192.0.2.255\n           /32 link BROADCAST\n";
        assert_eq!(local_v4(trie), [ip("192.0.2.2")]);
        let inet6 = "fd000000000000000000000000000002 04 40 00 80     eth0\n\
                     00000000000000000000000000000001 01 80 10 80       lo\n";
        assert_eq!(local_v6(inet6), [ip("fd00::2"), ip("::1")]);
    }

    /// An allowed server redirecting to a refused address (same origin or not) is not
    /// followed there.
    #[tokio::test]
    async fn redirects_never_reach_a_refused_address() {
        let (inner_port, inner) = listener("127.0.0.2", OK.to_owned()).await;
        let policy = Arc::new(TargetPolicy::new(vec!["127.0.0.1/32".parse().unwrap()]));
        for target in [format!("http://127.0.0.2:{inner_port}/"), format!("http://[::ffff:127.0.0.2]:{inner_port}/")] {
            let redirect =
                format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n");
            let (outer_port, outer) = listener("127.0.0.1", redirect).await;
            let client = guarded_client(Arc::clone(&policy)).unwrap();
            let answer = client.post(format!("http://127.0.0.1:{outer_port}/")).body("{}").send().await;
            assert!(answer.as_ref().map_or(true, |response| response.status() == 307), "{answer:?}");
            assert_eq!(outer.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
        assert_eq!(inner.load(std::sync::atomic::Ordering::SeqCst), 0, "a redirect reached a refused address");
    }
}
