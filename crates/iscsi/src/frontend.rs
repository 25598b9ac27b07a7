//! The iSCSI transport as the control plane drives it: the SCSI targets of
//! a configuration's exports become iSCSI targets, all in one portal group:
//! this node's target port group.

use std::sync::Arc;

use export::{Exports, Frontend, ScsiAccess};

use crate::access::{AccessList, Group, InitiatorPattern, SharedAccess, TargetAccess};
use crate::auth_chap::ChapAuthenticator;
use crate::{Server, ServerOptions, Target};

/// The portal group of a node that is not one of a pair. Its tag is also
/// the SCSI target port group and relative target port of every session
/// (an iSCSI target port is a portal group), so each node of a pair has
/// its own.
const PORTAL_GROUP: u16 = 1;

/// The iSCSI targets that carry `exports`' SCSI targets.
pub fn targets_of(exports: &Exports) -> Vec<Target> {
    exports
        .scsi_targets
        .iter()
        .map(|t| Target {
            name: t.name.clone(),
            alias: t.alias.clone(),
            portal_group: exports.target_port_group.unwrap_or(PORTAL_GROUP),
            portals: t.portals.clone(),
            scsi: Arc::clone(&t.scsi),
        })
        .collect()
}

/// The access rules `exports` give their targets.
pub fn access_of(exports: &Exports) -> AccessList {
    let mut list = AccessList::new();
    list.discovery_chap = exports.discovery_chap.clone();
    for target in &exports.scsi_targets {
        if let Some(access) = &target.access {
            list.set_target(&target.name, target_access(access));
        }
    }
    list
}

fn target_access(access: &ScsiAccess) -> TargetAccess {
    TargetAccess {
        groups: access
            .groups
            .iter()
            .map(|g| Group {
                name: g.name.clone(),
                members: g
                    .initiators
                    .iter()
                    .map(|i| InitiatorPattern::new(i))
                    .collect(),
                view: g.view.clone(),
                chap: g.chap.clone(),
            })
            .collect(),
        default_view: access.default_view.clone(),
        chap: access.chap.clone(),
    }
}

impl ServerOptions {
    /// Options whose access rules and CHAP come from the exports handed
    /// to the server ([`Frontend::replace_exports`]), starting with none.
    pub fn with_exported_access(self) -> ServerOptions {
        let shared = SharedAccess::new(AccessList::new());
        ServerOptions {
            authenticator: Arc::new(ChapAuthenticator::new(shared.clone())),
            access: shared.clone(),
            exported_access: Some(shared),
            ..self
        }
    }
}

impl Frontend for Server {
    fn transport(&self) -> &'static str {
        "iscsi"
    }

    /// The rules change first, so a login between the two steps is judged
    /// by the new rules against targets that may still be the old ones.
    fn replace_exports(&self, exports: &Exports) {
        if let Some(shared) = &self.options.exported_access {
            shared.replace(access_of(exports));
        }
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
