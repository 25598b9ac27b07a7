//! What the administration may know of a live session: a snapshot type
//! that holds no handle into the session, and the little a session keeps
//! for it (login time, LUNs used, a logout asked for).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use scsi_api::LunHolding;

use crate::connection::SessionCtx;
use crate::negotiation::SessionParams;

/// Highest LUN number a session's [`LunSet`] records: the flat space
/// addressing limit; no target maps a higher one.
const MAX_TRACKED_LUN: u64 = 16383;
const WORDS: usize = (MAX_TRACKED_LUN as usize + 1) / 64;

/// The LUNs a session has sent commands to, as bits. A command costs one
/// relaxed load; only a LUN's first command writes.
pub(crate) struct LunSet {
    words: Box<[AtomicU64]>,
}

impl Default for LunSet {
    fn default() -> Self {
        LunSet {
            words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl LunSet {
    #[inline]
    pub fn note(&self, lun: u64) {
        if lun > MAX_TRACKED_LUN {
            return;
        }
        let word = &self.words[(lun / 64) as usize];
        let bit = 1u64 << (lun % 64);
        if word.load(Ordering::Relaxed) & bit == 0 {
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    pub fn list(&self) -> Vec<u64> {
        let mut luns = Vec::new();
        for (i, word) in self.words.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                let b = bits.trailing_zeros() as u64;
                luns.push(i as u64 * 64 + b);
                bits &= bits - 1;
            }
        }
        luns
    }
}

/// What a logged-in session keeps for the administration.
pub(crate) struct SessionUsage {
    pub login_time: SystemTime,
    pub luns: LunSet,
    /// A logout was asked for (Async Message sent or about to be).
    pub logout_requested: AtomicBool,
}

impl SessionUsage {
    pub fn new() -> SessionUsage {
        SessionUsage {
            login_time: SystemTime::now(),
            luns: LunSet::default(),
            logout_requested: AtomicBool::new(false),
        }
    }
}

/// One connection of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub cid: u16,
    /// The local address the initiator connected to.
    pub portal: SocketAddr,
    pub peer: SocketAddr,
}

/// A live session as the administration sees it, taken at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// Never reused while the server runs (TSIHs are); what
    /// [`crate::Server::request_logout`] takes.
    pub id: u64,
    pub tsih: u16,
    pub isid: [u8; 6],
    pub initiator: String,
    /// InitiatorAlias from the login, if it sent one.
    pub initiator_alias: Option<String>,
    /// `None` for a discovery session.
    pub target: Option<String>,
    /// Its connections: one, as MaxConnections is negotiated to 1.
    pub connections: Vec<ConnectionInfo>,
    /// What the login negotiated.
    pub params: SessionParams,
    pub login_time: SystemTime,
    /// LUNs the session has sent commands to, in order.
    pub luns_used: Vec<u64>,
    /// The LUN map the session sees now, with the reservations its I_T
    /// nexus holds on each LUN.
    pub luns: Vec<LunHolding>,
    /// The session was asked to log out and has not yet.
    pub logout_requested: bool,
}

impl SessionInfo {
    /// Takes each of the session's LUNs' state lock briefly.
    pub(crate) fn of(ctx: &SessionCtx) -> SessionInfo {
        let luns = match (&ctx.target, &ctx.nexus) {
            (Some(t), Some(n)) => t.scsi.nexus_luns(n),
            _ => Vec::new(),
        };
        SessionInfo {
            id: ctx.id,
            tsih: ctx.tsih,
            isid: ctx.isid,
            initiator: ctx.initiator_name.to_string(),
            initiator_alias: ctx.initiator_alias.clone(),
            target: ctx.target.as_ref().map(|t| t.name.clone()),
            connections: vec![ConnectionInfo {
                cid: ctx.cid,
                portal: ctx.local,
                peer: ctx.peer,
            }],
            params: ctx.params.clone(),
            login_time: ctx.usage.login_time,
            luns_used: ctx.usage.luns.list(),
            luns,
            logout_requested: ctx.usage.logout_requested.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_set_keeps_each_lun_once_in_order() {
        let set = LunSet::default();
        assert!(set.list().is_empty());
        for lun in [201, 0, 63, 64, 201, 16383, 16384, u64::MAX, 0] {
            set.note(lun);
        }
        assert_eq!(set.list(), vec![0, 63, 64, 201, 16383]);
    }
}
