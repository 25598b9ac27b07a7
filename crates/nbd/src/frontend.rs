//! The NBD transport as the control plane drives it: the device exports
//! of a configuration become the server's export table, each over the
//! [`export::Backing`] the other transports of that device share.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use export::{Exports, Frontend};

use crate::exports::Export;
use crate::{Server, Session};
use export::Allow;

/// The export table that serves `exports`' device exports. An export
/// whose allow list does not parse (the configuration is validated before
/// it gets here) is left out rather than offered to everybody.
pub fn exports_of(exports: &Exports) -> BTreeMap<String, Export> {
    exports
        .device_exports
        .iter()
        .filter_map(|e| {
            let allow = match Allow::parse(&e.allow) {
                Ok(allow) => allow,
                Err(why) => {
                    tracing::error!(export = %e.name, "nbd: export not offered: {why}");
                    return None;
                }
            };
            let export = Export {
                backing: e.backing.clone(),
                read_only: e.read_only,
                allow,
                description: e.description.clone(),
            };
            Some((e.name.clone(), export))
        })
        .collect()
}

impl Frontend for Server {
    fn transport(&self) -> &'static str {
        "nbd"
    }

    fn replace_exports(&self, exports: &Exports) {
        Server::replace_exports(self, exports_of(exports));
    }

    fn end_refused_sessions(&self) -> usize {
        Server::end_refused_sessions(self)
    }

    fn sessions(&self) -> Vec<serde_json::Value> {
        let now = SystemTime::now();
        Server::sessions(self)
            .iter()
            .map(|s| session_json(s, now))
            .collect()
    }

    /// NBD has no logout to ask for: the connection is closed.
    fn end_session(&self, id: &str) -> Option<serde_json::Value> {
        let n: u64 = id.strip_prefix(SESSION_PREFIX)?.parse().ok()?;
        Server::end_session(self, n).then(|| serde_json::json!({ "id": id, "closed": true }))
    }
}

/// What an NBD session's id starts with, apart from iSCSI ones.
const SESSION_PREFIX: &str = "nbd-";

/// One NBD connection in transmission as the admin API shows it.
pub fn session_json(s: &Session, now: SystemTime) -> serde_json::Value {
    let since = s.since.duration_since(UNIX_EPOCH).unwrap_or_default();
    serde_json::json!({
        "id": format!("{SESSION_PREFIX}{}", s.id),
        "transport": "nbd",
        "peer": s.peer,
        "export": s.export,
        "tls": s.tls,
        "structured_replies": s.structured_replies,
        "extended_headers": s.extended_headers,
        "login_time": export::utc(since.as_secs()),
        "login_time_unix": since.as_secs(),
        "connected_seconds": now.duration_since(s.since).unwrap_or_default().as_secs(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use block::MemDevice;
    use export::{Backing, DeviceExport};
    use std::sync::Arc;

    #[test]
    fn device_exports_become_exports_over_the_shared_backing() {
        let backing = Backing::new(Arc::new(MemDevice::new(1 << 20)), false);
        let export = |name: &str, allow: &[&str]| DeviceExport {
            name: name.into(),
            device: "mem0".into(),
            backing: backing.clone(),
            read_only: name == "ro",
            allow: allow.iter().map(|s| s.to_string()).collect(),
            description: format!("{name} export"),
        };
        let exports = Exports {
            device_exports: vec![
                export("vm", &["127.0.0.0/8"]),
                export("ro", &[]),
                export("bad", &["not an address"]),
            ],
            ..Exports::default()
        };
        let table = exports_of(&exports);
        assert_eq!(
            table.len(),
            2,
            "the export with a bad allow list is left out"
        );
        assert!(Arc::ptr_eq(&table["vm"].backing, &backing));
        assert!(table["ro"].read_only && !table["vm"].read_only);
        assert_eq!(table["vm"].description, "vm export");
        let local = crate::Peer::Ip("127.0.0.1".parse().unwrap());
        let far = crate::Peer::Ip("10.0.0.1".parse().unwrap());
        assert!(table["vm"].allow.admits(local) && !table["vm"].allow.admits(far));
        assert!(table["ro"].allow.admits(far));
    }
}
