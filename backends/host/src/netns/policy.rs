//! What a networked sandbox may reach: CIDRs, the ranges blocked by default, and the
//! policy-routing rules that enforce them inside the sandbox's network namespace.
//!
//! The rules are `ip rule`s, not routes: pasta copies the host's addresses and routes into
//! the namespace, and a connected route (say 10.1.0.0/16 on a host in that range) is more
//! specific than any blackhole route we could add. Rules are evaluated before any table,
//! so a `prohibit` rule wins over every route; exceptions are `lookup main` rules at a
//! higher priority (a lower number).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

/// Priority of the rule that blocks everything while the others are (re)installed.
pub const GATE_PRIORITY: u32 = 1;
/// Priority of exceptions (operator allows, DNS to the host's resolvers).
pub const ALLOW_PRIORITY: u32 = 100;
/// Priority of the blocks.
pub const BLOCK_PRIORITY: u32 = 200;

/// IPv4 ranges no sandbox reaches unless the operator allows them: "this network",
/// private (RFC 1918), carrier-grade NAT, loopback, link-local (cloud metadata at
/// 169.254.169.254), IETF protocol assignments, benchmarking, multicast and reserved.
pub const BLOCKED_V4: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
];

/// An address range, `10.0.0.0/8` or a single address (`/32`, `/128`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn new(address: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(CidrError(format!("prefix /{prefix} is longer than {max}")));
        }
        Ok(Self { network: mask(address, prefix), prefix })
    }

    pub fn host(address: IpAddr) -> Self {
        Self { network: address, prefix: if address.is_ipv4() { 32 } else { 128 } }
    }

    pub fn is_ipv4(&self) -> bool {
        self.network.is_ipv4()
    }

    pub fn contains(&self, address: IpAddr) -> bool {
        address.is_ipv4() == self.network.is_ipv4() && mask(address, self.prefix) == self.network
    }
}

fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = if prefix == 0 { 0 } else { bits & (u32::MAX << (32 - u32::from(prefix))) };
            IpAddr::V4(Ipv4Addr::from(kept))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = if prefix == 0 { 0 } else { bits & (u128::MAX << (128 - u32::from(prefix))) };
            IpAddr::V6(kept.into())
        }
    }
}

/// Why a CIDR did not parse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrError(String);

impl fmt::Display for CidrError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for CidrError {}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, CidrError> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let address: IpAddr =
            address.parse().map_err(|_| CidrError(format!("{text:?} is not an address or address/prefix")))?;
        match prefix {
            None => Ok(Self::host(address)),
            Some(prefix) => {
                let prefix: u8 = prefix.parse().map_err(|_| CidrError(format!("{text:?} has a bad prefix length")))?;
                Self::new(address, prefix).map_err(|CidrError(reason)| CidrError(format!("{text:?}: {reason}")))
            }
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.network, self.prefix)
    }
}

/// The rules of one namespace, each as the arguments after `ip [-6] rule add`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    pub v4: Vec<Vec<String>>,
    pub v6: Vec<Vec<String>>,
}

/// Builds the rules: the operator's allows and DNS to the host's resolvers first, then
/// the default blocks and every address of the host itself (its services listen there);
/// all of IPv6 is blocked (the namespace gets no IPv6 either).
pub fn rules(allow: &[Cidr], resolvers: &[IpAddr], host_addresses: &[IpAddr]) -> RuleSet {
    let allow_priority = ALLOW_PRIORITY.to_string();
    let block_priority = BLOCK_PRIORITY.to_string();
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    for cidr in allow {
        let rule = strings(&["to", &cidr.to_string(), "lookup", "main", "priority", &allow_priority]);
        if cidr.is_ipv4() { v4.push(rule) } else { v6.push(rule) }
    }
    for resolver in resolvers.iter().filter(|resolver| resolver.is_ipv4() && !resolver.is_loopback()) {
        for protocol in ["udp", "tcp"] {
            v4.push(strings(&[
                "to",
                &Cidr::host(*resolver).to_string(),
                "ipproto",
                protocol,
                "dport",
                "53",
                "lookup",
                "main",
                "priority",
                &allow_priority,
            ]));
        }
    }
    let mut blocked: Vec<Cidr> = BLOCKED_V4.iter().filter_map(|cidr| cidr.parse().ok()).collect();
    for address in host_addresses.iter().filter(|address| address.is_ipv4()) {
        if !blocked.iter().any(|cidr| cidr.contains(*address)) {
            blocked.push(Cidr::host(*address));
        }
    }
    for cidr in blocked {
        v4.push(strings(&["prohibit", "to", &cidr.to_string(), "priority", &block_priority]));
    }
    v6.push(strings(&["prohibit", "priority", &block_priority]));
    RuleSet { v4, v6 }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// The `nameserver` addresses of a resolv.conf.
pub fn resolvers(resolv_conf: &str) -> Vec<IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|address| address.parse().ok())
        .collect()
}

/// The addresses in `ip -o addr show` output.
pub fn addresses(ip_output: &str) -> Vec<IpAddr> {
    ip_output
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|word| *word == "inet" || *word == "inet6")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_parse_mask_and_print() {
        let cidr: Cidr = "10.1.2.3/8".parse().unwrap();
        assert_eq!(cidr.to_string(), "10.0.0.0/8");
        assert!(cidr.contains("10.200.0.1".parse().unwrap()));
        assert!(!cidr.contains("11.0.0.1".parse().unwrap()));
        assert_eq!("203.0.113.7".parse::<Cidr>().unwrap().to_string(), "203.0.113.7/32");
        assert_eq!("fd00::1/8".parse::<Cidr>().unwrap().to_string(), "fd00::/8");
        assert_eq!("0.0.0.0/0".parse::<Cidr>().unwrap().to_string(), "0.0.0.0/0");
        for bad in ["10.0.0.0/33", "10.0.0/8", "x", "10.0.0.0/", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn allows_come_before_blocks_and_host_addresses_are_blocked() {
        let allow = vec!["10.9.0.0/16".parse().unwrap()];
        let resolvers = resolvers("# x\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nsearch local\n");
        let host = addresses(
            "1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\n2: eth0    inet6 fd00::2/64 scope global\n",
        );
        let set = rules(&allow, &resolvers, &host);
        let text: Vec<String> = set.v4.iter().map(|rule| rule.join(" ")).collect();
        assert_eq!(text[0], "to 10.9.0.0/16 lookup main priority 100");
        assert_eq!(text[1], "to 10.255.255.53/32 ipproto udp dport 53 lookup main priority 100");
        assert_eq!(text[2], "to 10.255.255.53/32 ipproto tcp dport 53 lookup main priority 100");
        assert!(text.contains(&"prohibit to 169.254.0.0/16 priority 200".to_owned()));
        assert!(text.contains(&"prohibit to 192.0.2.2/32 priority 200".to_owned()), "{text:?}");
        // 127.0.0.1 is inside 127/8 already; no loopback resolver exception.
        assert!(!text.iter().any(|rule| rule.contains("127.0.0.1/32") || rule.contains("127.0.0.53")));
        assert_eq!(set.v6, vec![strings(&["prohibit", "priority", "200"])]);
    }
}
