//! The `[ha]` section of the configuration: who this node is, who its
//! peer is and where, the link's secret and heartbeat.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::link::{handshake::MAX_NAME, LinkSettings, Timing};

fn default_interval_ms() -> u64 {
    500
}

fn default_timeout_ms() -> u64 {
    5000
}

fn default_lease_ms() -> u64 {
    10000
}

/// The witness's lease: long enough for a few renewals, short enough
/// that a failover takes seconds.
const LEASE_MS: std::ops::RangeInclusive<u64> = 1000..=120_000;

/// ```toml
/// [ha]
/// node = "a"
/// peer = "b"
/// peer_address = "10.0.0.2:7790"
/// listen = "10.0.0.1:7790"
/// secret_file = "/etc/openarray/ha.secret"
/// heartbeat_interval_ms = 500
/// heartbeat_timeout_ms = 5000
/// witness = "10.0.0.3:7791"
/// lease_ms = 10000
/// port_group = 1
/// peer_port_group = 2
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HaSection {
    /// This node's name; the peer's `peer` names it.
    pub node: String,
    pub peer: String,
    /// The peer's link address, `host:port`.
    pub peer_address: String,
    /// This node's link listen address.
    pub listen: String,
    /// The shared secret, in a file of mode 0600.
    pub secret_file: PathBuf,
    #[serde(default = "default_interval_ms")]
    pub heartbeat_interval_ms: u64,
    #[serde(default = "default_timeout_ms")]
    pub heartbeat_timeout_ms: u64,
    /// The witness, `host:port`: with it, the survivor of a lost owner
    /// takes over, and a node without peer nor witness stops writing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub witness: Option<String>,
    /// How long the witness's grant lasts unless renewed.
    #[serde(default = "default_lease_ms")]
    pub lease_ms: u64,
    /// The target port group this node's portals form (ALUA). Default: 1
    /// on the node whose name sorts first, 2 on the other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_group: Option<u16>,
    /// The peer's target port group: its `port_group`. This node cannot
    /// read the peer's section, so a pair that sets one sets both, on
    /// both nodes, mirrored. Default: as for `port_group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_port_group: Option<u16>,
}

/// The target port groups of the pair, as this node sees them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortGroups {
    pub local: u16,
    pub peer: u16,
}

/// A problem with one field of the section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: &'static str,
    pub why: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[ha] {}: {}", self.field, self.why)
    }
}

fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    if name.len() > MAX_NAME {
        return Some(format!("is {} bytes long (at most {MAX_NAME})", name.len()));
    }
    let odd = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')));
    odd.map(|c| format!("{name:?} holds {c:?}: use letters, digits, '-', '_' and '.'"))
}

fn host_port_problem(addr: &str) -> Option<String> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => None,
        _ => Some(format!("{addr:?} is not host:port")),
    }
}

impl HaSection {
    /// Every problem of the section, each naming its field; reads
    /// nothing from disk.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut bad = |field: &'static str, why: Option<String>| {
            if let Some(why) = why {
                errors.push(FieldError { field, why });
            }
        };
        bad("node", name_problem(&self.node));
        bad("peer", name_problem(&self.peer));
        if self.node == self.peer && !self.node.is_empty() {
            bad(
                "peer",
                Some(format!("names this node ({:?}) itself", self.node)),
            );
        }
        bad("peer_address", host_port_problem(&self.peer_address));
        bad(
            "listen",
            self.listen
                .parse::<SocketAddr>()
                .err()
                .map(|_| format!("{:?} is not an IP address and port", self.listen)),
        );
        if let Some(w) = &self.witness {
            bad("witness", host_port_problem(w));
        }
        if !LEASE_MS.contains(&self.lease_ms) {
            bad(
                "lease_ms",
                Some(format!(
                    "{} ms is outside {} to {} ms",
                    self.lease_ms,
                    LEASE_MS.start(),
                    LEASE_MS.end()
                )),
            );
        }
        let groups = self.port_groups();
        for (field, set) in [
            ("port_group", self.port_group),
            ("peer_port_group", self.peer_port_group),
        ] {
            if set == Some(0) {
                bad(field, Some("must be 1 to 65535".into()));
            }
        }
        if groups.local == groups.peer && groups.local != 0 {
            bad(
                "peer_port_group",
                Some(format!(
                    "is this node's port_group ({}): each node is its own target port group",
                    groups.local
                )),
            );
        }
        if self.secret_file.as_os_str().is_empty() {
            bad("secret_file", Some("is empty".into()));
        }
        if self.heartbeat_interval_ms == 0 {
            bad("heartbeat_interval_ms", Some("must be above 0".into()));
        }
        if self.heartbeat_timeout_ms < 2 * self.heartbeat_interval_ms {
            bad(
                "heartbeat_timeout_ms",
                Some(format!(
                    "{} ms is less than two heartbeats ({} ms each): one late heartbeat would \
                     end the link",
                    self.heartbeat_timeout_ms, self.heartbeat_interval_ms
                )),
            );
        }
        errors
    }

    /// This node's target port group and the peer's: as configured, else
    /// 1 for the node whose name sorts first and 2 for the other, which
    /// both nodes work out alike.
    pub fn port_groups(&self) -> PortGroups {
        let (first, second) = if self.node <= self.peer {
            (1, 2)
        } else {
            (2, 1)
        };
        PortGroups {
            local: self.port_group.unwrap_or(first),
            peer: self.peer_port_group.unwrap_or(second),
        }
    }

    /// What failover with the witness needs, if the section names one;
    /// `secret` is the link's.
    pub fn failover_settings(&self, secret: &[u8]) -> Option<crate::failover::FailoverSettings> {
        let lease = Duration::from_millis(self.lease_ms);
        Some(crate::failover::FailoverSettings {
            witness: crate::witness::WitnessClient {
                address: self.witness.clone()?,
                node: self.node.clone(),
                secret: secret.to_vec(),
                // A lone write waits for this at most.
                timeout: (lease / 4).min(Duration::from_secs(2)),
            },
            peer: self.peer.clone(),
            lease,
        })
    }

    /// The link's settings, with the secret read from its file.
    pub fn link_settings(&self) -> Result<LinkSettings, Vec<FieldError>> {
        let errors = self.validate();
        if !errors.is_empty() {
            return Err(errors);
        }
        let secret = crate::secret::read_secret(&self.secret_file).map_err(|why| {
            vec![FieldError {
                field: "secret_file",
                why,
            }]
        })?;
        Ok(LinkSettings {
            node: self.node.clone(),
            peer: self.peer.clone(),
            peer_address: self.peer_address.clone(),
            listen: self.listen.parse().expect("validated"),
            secret,
            timing: Timing {
                heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms),
                heartbeat_timeout: Duration::from_millis(self.heartbeat_timeout_ms),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> HaSection {
        toml::from_str(text).unwrap()
    }

    const GOOD: &str = r#"
        node = "a"
        peer = "b"
        peer_address = "127.0.0.1:7790"
        listen = "127.0.0.1:7791"
        secret_file = "/etc/openarray/ha.secret"
    "#;

    #[test]
    fn a_good_section_has_no_problems_and_defaults_its_heartbeat() {
        let s = section(GOOD);
        assert_eq!(s.validate(), vec![]);
        assert_eq!(
            (s.heartbeat_interval_ms, s.heartbeat_timeout_ms),
            (500, 5000)
        );
    }

    #[test]
    fn each_problem_names_its_field() {
        let s = HaSection {
            node: "a b".into(),
            peer: "a b".into(),
            peer_address: "nowhere".into(),
            listen: "host:1".into(),
            secret_file: PathBuf::new(),
            heartbeat_interval_ms: 1000,
            heartbeat_timeout_ms: 1500,
            witness: Some(":7".into()),
            lease_ms: 10000,
            port_group: Some(0),
            peer_port_group: None,
        };
        let fields: Vec<_> = s.validate().iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            [
                "node",
                "peer",
                "peer",
                "peer_address",
                "listen",
                "witness",
                "port_group",
                "secret_file",
                "heartbeat_timeout_ms"
            ]
        );
        let e = s.validate()[8].to_string();
        assert!(e.starts_with("[ha] heartbeat_timeout_ms: 1500 ms"), "{e}");
        assert!(toml::from_str::<HaSection>(&format!("{GOOD}\nsecret = \"x\"")).is_err());
        let same = section(&format!("{GOOD}\nport_group = 2"));
        let e = same.validate();
        assert_eq!(e.len(), 1);
        assert!(e[0]
            .to_string()
            .starts_with("[ha] peer_port_group: is this node's port_group (2)"));
    }

    #[test]
    fn each_node_is_its_own_port_group_by_default() {
        let a = section(GOOD);
        assert_eq!(a.port_groups(), PortGroups { local: 1, peer: 2 });
        let b = HaSection {
            node: "b".into(),
            peer: "a".into(),
            ..a.clone()
        };
        assert_eq!(b.port_groups(), PortGroups { local: 2, peer: 1 });
        let set = section(&format!("{GOOD}\nport_group = 7\npeer_port_group = 9"));
        assert_eq!(set.port_groups(), PortGroups { local: 7, peer: 9 });
        assert_eq!(set.validate(), vec![]);
    }

    #[test]
    fn the_secret_file_is_read_only_from_an_owner_only_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ha.secret");
        std::fs::write(&path, "a-long-enough-secret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let s = HaSection {
            secret_file: path.clone(),
            ..section(GOOD)
        };
        let e = s.link_settings().unwrap_err();
        assert_eq!(e[0].field, "secret_file");
        assert!(e[0].why.contains("0640"), "{}", e[0]);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(s.link_settings().unwrap().secret, b"a-long-enough-secret");
    }
}
