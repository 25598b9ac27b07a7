//! Target-side negotiation limits and timers.

use std::sync::Arc;
use std::time::Duration;

use crate::access::{AccessPolicy, OpenAccess, SharedAccess};
use crate::auth::{Authenticator, NoAuthentication};
use crate::negotiation::TargetLimits;
use peer_limits::AuthThrottle;

/// Limits the target negotiates with and the timers it runs.
#[derive(Clone)]
pub struct ServerOptions {
    /// What the target offers in negotiation: its data segment, burst
    /// and R2T limits, digests and timers (clamped by [`Self::limits`]).
    pub negotiation: TargetLimits,
    /// Commands a session may have outstanding (CmdSN window).
    pub cmdsn_window: u32,
    /// Largest expected data transfer length accepted for one write command.
    pub max_command_data: u32,
    /// Write data one connection may have buffered or solicited at once.
    pub max_write_buffer: u64,
    /// Ping an initiator that has sent nothing for this long.
    pub nop_interval: Option<Duration>,
    /// Drop the connection when a ping is not answered within this time.
    pub nop_timeout: Duration,
    /// Time allowed for a whole login.
    pub login_timeout: Duration,
    /// On shutdown, time initiators get to log out after being asked to.
    pub logout_timeout: Duration,
    /// Most sessions (normal and discovery) served at once.
    pub max_sessions: usize,
    /// Most normal sessions one initiator name may hold at once (login
    /// status 0x0302 beyond), so one host cannot take every session.
    pub max_sessions_per_initiator: usize,
    /// Most logged-in connections one portal (listener) holds at once; a
    /// login beyond is refused with status 0x0302.
    pub max_connections_per_portal: usize,
    /// Most connections one source address may have logging in at once;
    /// more are closed as soon as they are accepted.
    pub max_logins_per_source: usize,
    /// Most connections logging in at once, all sources together; at this
    /// count the oldest is closed to make room for a new one.
    pub max_logins: usize,
    /// Most logged-in connections one source address may hold on all
    /// portals together; a login beyond is refused with status 0x0302.
    pub max_connections_per_source: usize,
    /// Bytes one connection may have queued toward its initiator.
    pub max_queued_output: usize,
    /// A connection whose initiator accepts no data for this long (its
    /// socket stays full, or its queue at `max_queued_output`) is dropped.
    pub write_timeout: Duration,
    /// The login authentication step.
    pub authenticator: Arc<dyn Authenticator>,
    /// The delays after failed CHAP proofs, and their count.
    pub auth_throttle: Arc<AuthThrottle>,
    /// Which initiators may log in to which targets, and what they see.
    pub access: Arc<dyn AccessPolicy>,
    /// The rules `access` reads, when they come from the exports
    /// ([`ServerOptions::with_exported_access`]).
    pub exported_access: Option<Arc<SharedAccess>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            negotiation: TargetLimits::default(),
            cmdsn_window: 128,
            max_command_data: 64 << 20,
            max_write_buffer: 256 << 20,
            nop_interval: Some(Duration::from_secs(15)),
            nop_timeout: Duration::from_secs(30),
            login_timeout: Duration::from_secs(15),
            logout_timeout: Duration::from_secs(5),
            max_sessions: 4096,
            max_sessions_per_initiator: 64,
            max_connections_per_portal: 4096,
            max_logins_per_source: 16,
            max_logins: 1024,
            max_connections_per_source: 256,
            max_queued_output: 4 << 20,
            write_timeout: Duration::from_secs(20),
            authenticator: Arc::new(NoAuthentication),
            auth_throttle: Arc::default(),
            access: Arc::new(OpenAccess),
            exported_access: None,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("negotiation", &self.negotiation)
            .field("cmdsn_window", &self.cmdsn_window)
            .field("max_command_data", &self.max_command_data)
            .field("nop_interval", &self.nop_interval)
            .field("nop_timeout", &self.nop_timeout)
            .field("max_queued_output", &self.max_queued_output)
            .field("write_timeout", &self.write_timeout)
            .field("auth_throttle", &self.auth_throttle)
            .finish_non_exhaustive()
    }
}

impl ServerOptions {
    /// Login attempts whose CHAP proof was wrong, since start.
    pub fn auth_failures(&self) -> u64 {
        self.auth_throttle.failures()
    }

    /// The negotiation limits these options describe, clamped to what the
    /// protocol allows.
    pub fn limits(&self) -> TargetLimits {
        let clamp = |v: u32| v.clamp(512, crate::pdu::MAX_DATA_SEGMENT_LIMIT);
        let n = &self.negotiation;
        let max_burst = clamp(n.max_burst_length);
        TargetLimits {
            max_recv_data_segment_length: clamp(n.max_recv_data_segment_length),
            max_burst_length: max_burst,
            first_burst_length: clamp(n.first_burst_length).min(max_burst),
            max_outstanding_r2t: n.max_outstanding_r2t.max(1),
            default_time2wait: n.default_time2wait.min(3600),
            default_time2retain: n.default_time2retain.min(3600),
            max_connections: 1,
            ..n.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_clamped() {
        let o = ServerOptions {
            negotiation: TargetLimits {
                max_burst_length: 100,
                first_burst_length: 1 << 30,
                max_outstanding_r2t: 0,
                max_connections: 4,
                ..TargetLimits::default()
            },
            ..Default::default()
        };
        let l = o.limits();
        assert_eq!(l.max_burst_length, 512);
        assert_eq!(l.first_burst_length, 512);
        assert_eq!(l.max_outstanding_r2t, 1);
        assert_eq!(l.max_connections, 1);
    }
}
