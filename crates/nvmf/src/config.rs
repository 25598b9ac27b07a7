//! The `[nvmf]` section of the configuration: where the target listens,
//! its subsystems, who may connect to each and the namespaces each
//! serves; and the checks that refuse a section that cannot work.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use serde::{Deserialize, Serialize};

/// The port NVMe/TCP hosts use when none is given (IANA).
pub const DEFAULT_PORT: u16 = 4420;
/// The port of a discovery controller when none is given (IANA).
pub const DISCOVERY_PORT: u16 = 8009;
/// The well-known NQN of the discovery subsystem (Base 2.0, 4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Highest namespace id a subsystem may use: what Identify reports as
/// the number of namespaces, and what one active namespace list holds.
pub const MAX_NSID: u32 = 1024;

/// `[nvmf]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// TCP addresses to listen on; a bare address gets port 4420.
    #[serde(default)]
    pub listen: Vec<String>,
    /// Addresses only the discovery controller answers on; a bare
    /// address gets port 8009. The `listen` addresses answer discovery
    /// connects as well.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discovery_listen: Vec<String>,
    #[serde(default, rename = "subsystem")]
    pub subsystems: Vec<SubsystemConfig>,
}

/// `[[nvmf.subsystem]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Host NQNs admitted, `*` wildcards allowed (`"*"`: every host).
    pub allow_hosts: Vec<String>,
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
    /// Hosts with settings of their own: DH-HMAC-CHAP secrets.
    #[serde(default, rename = "host", skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostConfig>,
}

/// `[[nvmf.subsystem.host]]`: a host that must authenticate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub nqn: String,
    /// A file holding the host's `DHHC-1:..` secret, readable by its
    /// owner only: the host must prove it knows it before any I/O.
    pub dhchap_secret_file: String,
    /// A file holding the controller's secret, for hosts that ask the
    /// target to prove itself too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret_file: Option<String>,
}

/// `[[nvmf.subsystem.namespace]]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    pub nsid: u32,
    /// A configured device's name.
    pub device: String,
    /// Logical block size in bytes: 512 or 4096.
    #[serde(default = "default_block_size")]
    pub block_size: u32,
}

fn default_block_size() -> u32 {
    512
}

/// One problem of the section: the field and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// As a path: `nvmf.subsystem[0].namespace[1].nsid`.
    pub field: String,
    pub why: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.why)
    }
}

impl std::error::Error for ConfigError {}

/// A listen address: `host:port`, or a bare address with port 4420.
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    parse_addr(s, DEFAULT_PORT)
}

/// A discovery listen address: `host:port`, or a bare address with
/// port 8009.
pub fn parse_discovery_listen(s: &str) -> Result<SocketAddr, String> {
    parse_addr(s, DISCOVERY_PORT)
}

fn parse_addr(s: &str, port: u16) -> Result<SocketAddr, String> {
    let with_port = match s.parse::<std::net::IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) if !s.contains(':') => format!("{s}:{port}"),
        Err(_) if s.starts_with('[') && s.ends_with(']') => format!("{s}:{port}"),
        Err(_) => s.to_string(),
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| format!("{s:?} is not an address: {e}"))?;
    addrs
        .next()
        .ok_or_else(|| format!("{s:?} resolves to no address"))
}

/// Whether `s` is an NVMe Qualified Name (Base 2.0, 4.5): at most 223
/// bytes, `nqn.yyyy-mm.` then a reverse domain name, then `:` and a
/// string of the domain owner's choosing.
pub fn nqn_problem(s: &str) -> Option<&'static str> {
    if s.len() > 223 {
        return Some("an NQN is at most 223 bytes");
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("an NQN has no spaces or control characters");
    }
    let Some(rest) = s.strip_prefix("nqn.") else {
        return Some("an NQN starts with `nqn.`");
    };
    let date = rest.as_bytes();
    let dated = date.len() > 8
        && date[..4].iter().all(u8::is_ascii_digit)
        && date[4] == b'-'
        && date[5..7].iter().all(u8::is_ascii_digit)
        && date[7] == b'.';
    if !dated {
        return Some("an NQN starts with `nqn.yyyy-mm.` and a domain name");
    }
    let (domain, tail) = rest[8..].split_once(':').unwrap_or((&rest[8..], ""));
    let domain_ok = !domain.is_empty()
        && domain
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
    if !domain_ok {
        return Some("the domain part of an NQN is letters, digits, dots and dashes");
    }
    if tail.is_empty() {
        return Some("an NQN names its subsystem after `:`");
    }
    None
}

/// Whether `pattern` (with `*` for any run of characters) matches `s`.
pub fn glob(pattern: &str, s: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == s;
    };
    let Some(mut left) = s.strip_prefix(head) else {
        return false;
    };
    let mut parts: Vec<&str> = rest.split('*').collect();
    let last = parts.pop().unwrap_or("");
    for part in parts {
        match left.find(part) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

impl Config {
    /// Every problem of the section, given the names of the configured
    /// devices; empty when it can be served.
    pub fn validate(&self, devices: &BTreeSet<String>) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut err = |field: String, why: String| errors.push(ConfigError { field, why });
        let mut addrs = BTreeSet::new();
        for (i, l) in self.listen.iter().enumerate() {
            match parse_listen(l) {
                Ok(a) if !addrs.insert(a) => {
                    err(format!("nvmf.listen[{i}]"), format!("{a} is listed twice"))
                }
                Ok(_) => {}
                Err(why) => err(format!("nvmf.listen[{i}]"), why),
            }
        }
        for (i, l) in self.discovery_listen.iter().enumerate() {
            match parse_discovery_listen(l) {
                Ok(a) if !addrs.insert(a) => err(
                    format!("nvmf.discovery_listen[{i}]"),
                    format!("{a} is listed twice (here or in nvmf.listen)"),
                ),
                Ok(_) => {}
                Err(why) => err(format!("nvmf.discovery_listen[{i}]"), why),
            }
        }
        let mut nqns = BTreeSet::new();
        for (i, s) in self.subsystems.iter().enumerate() {
            let at = format!("nvmf.subsystem[{i}]");
            if let Some(why) = nqn_problem(&s.nqn) {
                err(format!("{at}.nqn"), format!("{:?}: {why}", s.nqn));
            } else if s.nqn == DISCOVERY_NQN {
                err(
                    format!("{at}.nqn"),
                    "the discovery subsystem's NQN names no subsystem of namespaces".into(),
                );
            } else if !nqns.insert(s.nqn.as_str()) {
                err(
                    format!("{at}.nqn"),
                    format!("{:?} names another subsystem too", s.nqn),
                );
            }
            if s.allow_hosts.is_empty() {
                err(
                    format!("{at}.allow_hosts"),
                    "no host could connect; `[\"*\"]` admits every host".into(),
                );
            }
            for (j, h) in s.allow_hosts.iter().enumerate() {
                if h.contains('*') {
                    continue;
                }
                if let Some(why) = nqn_problem(h) {
                    err(format!("{at}.allow_hosts[{j}]"), format!("{h:?}: {why}"));
                }
            }
            let mut host_nqns = BTreeSet::new();
            for (j, h) in s.hosts.iter().enumerate() {
                let at = format!("{at}.host[{j}]");
                if let Some(why) = nqn_problem(&h.nqn) {
                    err(format!("{at}.nqn"), format!("{:?}: {why}", h.nqn));
                } else if !host_nqns.insert(h.nqn.as_str()) {
                    err(format!("{at}.nqn"), format!("{:?} is listed twice", h.nqn));
                } else if !s.allow_hosts.iter().any(|p| glob(p, &h.nqn)) {
                    err(
                        format!("{at}.nqn"),
                        format!("{:?} is not admitted by allow_hosts", h.nqn),
                    );
                }
                if let Err(why) = crate::auth::read_secret(&h.dhchap_secret_file) {
                    err(format!("{at}.dhchap_secret_file"), why);
                }
                if let Some(f) = &h.dhchap_ctrl_secret_file {
                    if let Err(why) = crate::auth::read_secret(f) {
                        err(format!("{at}.dhchap_ctrl_secret_file"), why);
                    }
                }
            }
            let mut nsids = BTreeSet::new();
            for (j, n) in s.namespaces.iter().enumerate() {
                let at = format!("{at}.namespace[{j}]");
                if n.nsid == 0 || n.nsid > MAX_NSID {
                    err(
                        format!("{at}.nsid"),
                        format!("{} is not between 1 and {MAX_NSID}", n.nsid),
                    );
                } else if !nsids.insert(n.nsid) {
                    err(
                        format!("{at}.nsid"),
                        format!("namespace {} is defined twice in this subsystem", n.nsid),
                    );
                }
                if !devices.contains(&n.device) {
                    err(
                        format!("{at}.device"),
                        format!("no device is named {:?}", n.device),
                    );
                }
                if n.block_size != 512 && n.block_size != 4096 {
                    err(
                        format!("{at}.block_size"),
                        format!("{} is neither 512 nor 4096", n.block_size),
                    );
                }
            }
        }
        errors
    }

    /// The listen addresses (of a validated section).
    pub fn listen_addrs(&self) -> Vec<SocketAddr> {
        self.listen
            .iter()
            .filter_map(|l| parse_listen(l).ok())
            .collect()
    }

    /// The discovery-only listen addresses (of a validated section).
    pub fn discovery_addrs(&self) -> Vec<SocketAddr> {
        self.discovery_listen
            .iter()
            .filter_map(|l| parse_discovery_listen(l).ok())
            .collect()
    }

    /// The devices the section serves.
    pub fn devices(&self) -> BTreeSet<&str> {
        self.subsystems
            .iter()
            .flat_map(|s| s.namespaces.iter().map(|n| n.device.as_str()))
            .collect()
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
