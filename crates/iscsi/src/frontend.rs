//! The iSCSI transport as the control plane drives it: the SCSI targets of
//! a configuration's exports become iSCSI targets, all in one portal group.

use std::sync::Arc;

use export::{Exports, Frontend};

use crate::{Server, Target};

/// Every target of one configuration sits in one portal group.
const PORTAL_GROUP: u16 = 1;

/// The iSCSI targets that carry `exports`' SCSI targets.
pub fn targets_of(exports: &Exports) -> Vec<Target> {
    exports
        .scsi_targets
        .iter()
        .map(|t| Target {
            name: t.name.clone(),
            alias: t.alias.clone(),
            portal_group: PORTAL_GROUP,
            portals: t.portals.clone(),
            scsi: Arc::clone(&t.scsi),
        })
        .collect()
}

impl Frontend for Server {
    fn transport(&self) -> &'static str {
        "iscsi"
    }

    fn replace_exports(&self, exports: &Exports) {
        self.replace_targets(targets_of(exports));
    }

    fn end_refused_sessions(&self) -> usize {
        Server::end_refused_sessions(self)
    }

    fn sessions(&self) -> Vec<serde_json::Value> {
        let now = std::time::SystemTime::now();
        Server::sessions(self)
            .iter()
            .map(|s| crate::session_json::session_json(s, now))
            .collect()
    }

    /// iSCSI asks the initiator to log out (Async Message), closing the
    /// session if it has not within the logout timeout.
    fn end_session(&self, id: &str) -> Option<serde_json::Value> {
        let n: u64 = id.parse().ok()?;
        self.request_logout(n).then(|| {
            serde_json::json!({
                "id": n,
                "logout_requested": true,
                "logout_timeout_seconds": self.logout_timeout().as_secs_f64(),
            })
        })
    }
}
