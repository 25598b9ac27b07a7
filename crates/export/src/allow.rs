//! Who may use an export: client addresses and networks, and unix-socket
//! clients.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// Where a connection comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Ip(IpAddr),
    /// A unix-socket client: no address, only the socket's file permissions.
    Unix,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Ip(ip) => write!(f, "{ip}"),
            Peer::Unix => f.write_str("unix socket"),
        }
    }
}

/// One entry of an allow list: an address, a network in CIDR notation, or
/// `unix` for unix-socket clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Net { addr: IpAddr, prefix: u8 },
    Unix,
}

impl FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Rule, String> {
        if s == "unix" {
            return Ok(Rule::Unix);
        }
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?} is not an address, a CIDR network or \"unix\""))?;
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("{s:?} has a prefix length outside 0..={bits}"))?,
        };
        Ok(Rule::Net { addr, prefix })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Unix => f.write_str("unix"),
            Rule::Net { addr, prefix } => write!(f, "{addr}/{prefix}"),
        }
    }
}

/// An IPv4 client reached over an IPv6 socket counts as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (canonical(ip), net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - prefix as u32).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - prefix as u32).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

impl Rule {
    pub fn admits(&self, peer: Peer) -> bool {
        match (self, peer) {
            (Rule::Unix, Peer::Unix) => true,
            (Rule::Net { addr, prefix }, Peer::Ip(ip)) => in_net(ip, *addr, *prefix),
            _ => false,
        }
    }
}

/// An export's allow list; empty admits everyone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allow(pub Vec<Rule>);

impl Allow {
    /// Parses entries as the config writes them.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Allow, String> {
        entries
            .iter()
            .map(|e| e.as_ref().trim().parse())
            .collect::<Result<_, _>>()
            .map(Allow)
    }

    pub fn admits(&self, peer: Peer) -> bool {
        self.0.is_empty() || self.0.iter().any(|r| r.admits(peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Peer {
        Peer::Ip(s.parse().unwrap())
    }

    #[test]
    fn networks_addresses_and_unix() {
        let a = Allow::parse(&["127.0.0.0/8", "10.1.2.3", "fd00::/8", "unix"]).unwrap();
        assert!(a.admits(ip("127.4.5.6")));
        assert!(a.admits(ip("10.1.2.3")));
        assert!(!a.admits(ip("10.1.2.4")));
        assert!(a.admits(ip("fd12::1")));
        assert!(!a.admits(ip("fe80::1")));
        assert!(a.admits(Peer::Unix));
        // IPv4 through an IPv6 socket.
        assert!(a.admits(ip("::ffff:127.0.0.1")));
        let tcp_only = Allow::parse(&["0.0.0.0/0"]).unwrap();
        assert!(tcp_only.admits(ip("192.0.2.1")));
        assert!(!tcp_only.admits(Peer::Unix));
        assert!(Allow::default().admits(Peer::Unix));
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in ["127.0.0.0/33", "::/129", "host", "1.2.3.4/x", ""] {
            assert!(Allow::parse(&[bad]).is_err(), "{bad}");
        }
    }
}
