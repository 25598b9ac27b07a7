//! The HA pair as the daemon runs it: `[ha]` (whose types and checks are
//! the ha crate's) joins the configuration language, the replication link
//! starts before any device opens (a `mirror` device needs it), and a
//! change of the section while running is refused: the peer would have
//! to follow it at the same moment, which a restart of both does.

use std::collections::BTreeSet;
use std::io;
use std::sync::Arc;

use control::sections::{Problem, SectionOwner};

/// The `[ha]` section, as the configuration reads it.
pub struct HaOwner;

impl SectionOwner for HaOwner {
    type Config = ha::config::HaSection;
    const NAME: &'static str = "ha";

    fn check(&self, config: &Self::Config, _devices: &BTreeSet<String>) -> Vec<Problem> {
        // The secret is read here too, so `check-config` finds a missing
        // or readable-by-others file before a start does.
        let errors = match config.link_settings() {
            Ok(_) => Vec::new(),
            Err(errors) => errors,
        };
        errors
            .into_iter()
            .map(|e| Problem {
                field: format!("ha.{}", e.field),
                reason: e.why,
            })
            .collect()
    }

    fn served_devices(&self, _config: &Self::Config) -> BTreeSet<String> {
        BTreeSet::new()
    }
}

/// The `[ha]` of `config`, if it has one.
pub fn section(config: &control::Config) -> Option<&ha::config::HaSection> {
    config
        .sections
        .get(HaOwner::NAME)
        .and_then(|s| s.get::<ha::config::HaSection>())
}

/// Starts this node's link from `config`'s `[ha]` and makes it the one
/// mirrors replicate over; nothing without the section. Within the I/O
/// runtime.
pub async fn start_link(config: &control::Config) -> io::Result<Option<Arc<ha::link::Link>>> {
    let Some(section) = section(config) else {
        return Ok(None);
    };
    let settings = section.link_settings().map_err(|errors| {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        io::Error::new(io::ErrorKind::InvalidInput, text.join("; "))
    })?;
    let failover = match section.failover_settings(&settings.secret) {
        Some(f) => {
            tracing::info!(witness = %f.witness.address, lease_ms = section.lease_ms, "HA failover with a witness");
            Some(ha::failover::Failover::start(f)?)
        }
        None => None,
    };
    let link = ha::link::Link::start(settings).await?;
    tracing::info!(
        node = %section.node,
        peer = %section.peer,
        listen = %link.local_addr(),
        port_group = section.port_groups().local,
        "HA link listening"
    );
    ha::pair::set_link(Some(link.clone()));
    ha::pair::set_failover(failover);
    ha::pair::set_port_groups(Some(section.port_groups()));
    Ok(Some(link))
}

/// Refuses a change of `[ha]` while running.
pub struct HaLive {
    pub running: Option<ha::config::HaSection>,
}

impl crate::LiveListeners for HaLive {
    fn prepare(&self, next: &control::Config) -> Result<Box<dyn crate::PreparedListeners>, String> {
        if section(next) != self.running.as_ref() {
            return Err(
                "ha: the pair's settings change at the next start of both nodes, not live \
                 (the peer would have to change with this node at once)"
                    .into(),
            );
        }
        Ok(Box::new(Unchanged))
    }
}

struct Unchanged;

impl crate::PreparedListeners for Unchanged {
    fn commit(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LiveListeners;
    use std::os::unix::fs::PermissionsExt;

    fn parse(text: &str) -> Result<control::Config, control::ConfigError> {
        control::sections::register(HaOwner);
        control::parse_config(text, "t.toml")
    }

    fn section_text(secret: &std::path::Path) -> String {
        format!(
            "[ha]\nnode = \"a\"\npeer = \"b\"\npeer_address = \"127.0.0.1:7790\"\nlisten = \"127.0.0.1:7791\"\nsecret_file = \"{}\"\n",
            secret.display()
        )
    }

    #[test]
    fn the_section_is_checked_with_its_secret_file() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("ha.secret");
        let text = section_text(&secret);
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("t.toml:6:1: ha.secret_file: secret_file"), "{e}");
        std::fs::write(&secret, "0123456789abcdef0123").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = parse(&text).unwrap_err().to_string();
        assert!(e.contains("ha.secret_file"), "{e}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = parse(&text).unwrap();
        assert_eq!(section(&c).unwrap().peer, "b");
        let e = parse(&text.replace("peer = \"b\"", "peer = \"a\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("t.toml:3:1: ha.peer: names this node"), "{e}");
    }

    #[test]
    fn a_change_of_the_pair_is_refused_while_running() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("ha.secret");
        std::fs::write(&secret, "0123456789abcdef0123").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = section_text(&secret);
        let c = parse(&text).unwrap();
        let live = HaLive {
            running: section(&c).cloned(),
        };
        assert!(live.prepare(&c).is_ok());
        let moved = parse(&text.replace("7790", "7792")).unwrap();
        let e = live.prepare(&moved).err().unwrap();
        assert!(e.starts_with("ha: "), "{e}");
    }
}
