//! `[iscsi]`: the settings only the iSCSI transport reads (sessions per
//! initiator, connections per portal). They were `[daemon]` keys, where
//! they are still read, with a warning, when `[iscsi]` does not set them;
//! the limits every listener shares (`write_timeout`, `login_timeout`,
//! `nop_interval`, `max_logins`...) stay in `[daemon]`.

use std::collections::BTreeSet;

use control::sections::{Problem, SectionOwner};
use serde::{Deserialize, Serialize};

/// ```toml
/// [iscsi]
/// max_sessions_per_initiator = 16
/// max_connections_per_portal = 256
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiSection {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_initiator: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_portal: Option<usize>,
}

/// The `[daemon]` keys that moved here.
pub const MOVED_KEYS: [&str; 2] = ["max_sessions_per_initiator", "max_connections_per_portal"];

pub struct IscsiOwner;

impl SectionOwner for IscsiOwner {
    type Config = IscsiSection;
    const NAME: &'static str = "iscsi";

    fn check(&self, c: &IscsiSection, _devices: &BTreeSet<String>) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut bad = |key: &str, reason: String| {
            problems.push(Problem {
                field: format!("iscsi.{key}"),
                reason,
            })
        };
        for (key, v) in [
            ("max_sessions_per_initiator", c.max_sessions_per_initiator),
            ("max_connections_per_portal", c.max_connections_per_portal),
        ] {
            if v == Some(0) {
                bad(key, "must be at least 1".into());
            }
        }
        problems
    }

    fn served_devices(&self, _c: &IscsiSection) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// The `[iscsi]` of `config`, if it has one.
pub fn section(config: &control::Config) -> Option<&IscsiSection> {
    config
        .sections
        .get(IscsiOwner::NAME)
        .and_then(|s| s.get::<IscsiSection>())
}

/// The moved keys `config` still sets in `[daemon]`, for a warning.
pub fn deprecated_keys(config: &control::Config) -> Vec<&'static str> {
    let d = &config.daemon;
    let set = [
        d.max_sessions_per_initiator.is_some(),
        d.max_connections_per_portal.is_some(),
    ];
    MOVED_KEYS
        .iter()
        .zip(set)
        .filter(|(_, set)| *set)
        .map(|(k, _)| *k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<control::Config, control::ConfigError> {
        control::sections::register(IscsiOwner);
        control::parse_config(text, "t.toml")
    }

    #[test]
    fn the_section_reads_and_checks_its_keys() {
        let c = parse("[iscsi]\nmax_sessions_per_initiator = 4\n").unwrap();
        let s = section(&c).unwrap();
        assert_eq!(s.max_sessions_per_initiator, Some(4));
        assert!(deprecated_keys(&c).is_empty());

        let e = parse("\n[iscsi]\nmax_sessions_per_initiator = 0\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:3:1: iscsi.max_sessions_per_initiator: must be at least 1"),
            "{e}"
        );
        let e = parse("[iscsi]\nmax_connections_per_portal = -1\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("t.toml:2:") && e.contains("iscsi.max_connections_per_portal"),
            "{e}"
        );
        let e = parse("[iscsi]\nwrite_timeout = \"1s\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `write_timeout`"), "{e}");
    }

    #[test]
    fn the_old_daemon_spellings_are_found() {
        let c = parse("[daemon]\nnop_timeout = \"3s\"\nmax_connections_per_portal = 2\n").unwrap();
        assert_eq!(deprecated_keys(&c), ["max_connections_per_portal"]);
    }
}
