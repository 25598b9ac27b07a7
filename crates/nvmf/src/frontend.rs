//! The target as the control plane drives it: every committed change
//! hands it the exports (the namespaces' devices are found among their
//! devices by name), and its sessions are its controllers.

use std::time::{SystemTime, UNIX_EPOCH};

use export::{Exports, Frontend, TransportStatus};
use serde_json::json;

use crate::Server;

/// What an NVMe/TCP session's id starts with, apart from other
/// transports' ones.
const SESSION_PREFIX: &str = "nvme-";

/// One controller (a host association over its queues).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub cntlid: u16,
    pub peer: String,
    pub host_nqn: String,
    pub subsystem: String,
    /// Connected queues, the admin queue included.
    pub queues: usize,
    pub since: SystemTime,
}

impl Server {
    pub fn sessions(&self) -> Vec<Session> {
        self.context()
            .registry
            .controllers()
            .iter()
            .filter(|c| !c.is_ended())
            .map(|c| Session {
                cntlid: c.cntlid,
                peer: c.peer.clone(),
                host_nqn: c.host_nqn.clone(),
                subsystem: c.subsystem().nqn.clone(),
                queues: c.queues.load(std::sync::atomic::Ordering::Relaxed),
                since: c.since,
            })
            .collect()
    }

    /// Ends controller `cntlid` and closes its queues' connections.
    pub fn end_session(&self, cntlid: u16) -> bool {
        let reg = &self.context().registry;
        let found = reg.get(cntlid).is_some();
        reg.remove(cntlid);
        found
    }

    pub fn end_refused_sessions(&self) -> usize {
        self.context().registry.end_refused()
    }
}

fn session_json(s: &Session, now: SystemTime) -> serde_json::Value {
    let since = s.since.duration_since(UNIX_EPOCH).unwrap_or_default();
    serde_json::json!({
        "id": format!("{SESSION_PREFIX}{}", s.cntlid),
        "transport": "nvme-tcp",
        "peer": s.peer,
        "host_nqn": s.host_nqn,
        "subsystem": s.subsystem,
        "queues": s.queues,
        "login_time": export::utc(since.as_secs()),
        "login_time_unix": since.as_secs(),
        "connected_seconds": now.duration_since(s.since).unwrap_or_default().as_secs(),
    })
}

impl Frontend for Server {
    fn transport(&self) -> &'static str {
        "nvme-tcp"
    }

    fn replace_exports(&self, exports: &Exports) {
        self.replace_devices(exports);
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

    /// The listeners and subsystems; a namespace whose device is not
    /// open is a problem.
    fn status(&self) -> Option<TransportStatus> {
        let config = self.config();
        let table = self.context().registry.table();
        let controllers = Server::sessions(self);
        let mut problems = Vec::new();
        let subsystems: Vec<_> = config
            .subsystems
            .iter()
            .map(|s| {
                let served = table.get(&s.nqn);
                let namespaces: Vec<_> = s
                    .namespaces
                    .iter()
                    .map(|n| {
                        let ready = served.is_some_and(|t| t.namespaces.contains_key(&n.nsid));
                        if !ready {
                            problems.push((
                                format!("{} namespace {}", s.nqn, n.nsid),
                                format!("device {} is not open", n.device),
                            ));
                        }
                        json!({
                            "nsid": n.nsid,
                            "device": n.device,
                            "block_size": n.block_size,
                            "state": if ready { "ok" } else { "failed" },
                        })
                    })
                    .collect();
                json!({
                    "nqn": s.nqn,
                    "allow_hosts": s.allow_hosts,
                    "namespaces": namespaces,
                    "controllers": controllers.iter().filter(|c| c.subsystem == s.nqn).count(),
                })
            })
            .collect();
        let listen: Vec<String> = self.listening().iter().map(|a| a.to_string()).collect();
        Some(TransportStatus {
            summary: json!({ "listen": listen, "subsystems": subsystems }),
            problems,
        })
    }

    /// NVMe/TCP has no logout to ask for: the controller ends.
    fn end_session(&self, id: &str) -> Option<serde_json::Value> {
        let n: u16 = id.strip_prefix(SESSION_PREFIX)?.parse().ok()?;
        Server::end_session(self, n).then(|| serde_json::json!({ "id": id, "closed": true }))
    }
}
