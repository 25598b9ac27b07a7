//! The table of live sessions: TSIH allocation, lookup by
//! (InitiatorName, ISID, target) for reinstatement, and the control
//! channel through which one session (or the server) acts on another.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use peer_limits::OutgoingBudget;
use tokio::sync::{mpsc, oneshot, watch};

use crate::connection::SessionCtx;

/// Identifies a normal session for reinstatement (RFC 7143 6.3.5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub initiator_name: Arc<str>,
    pub isid: [u8; 6],
    pub target_name: Arc<str>,
}

/// Why a session is told to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CloseReason {
    /// A new login with the same key replaced it.
    Reinstated,
    /// TARGET COLD RESET.
    ColdReset,
    /// Server shutdown after the logout grace time.
    Shutdown,
}

/// Requests delivered to a session's connection loop.
#[derive(Debug)]
pub(crate) enum Control {
    /// End the session now.
    Close(CloseReason),
    /// Ask the initiator to log out (Async Message), close if it does not.
    RequestLogout,
    /// Abort this session's tasks (all, or those of one LUN) on behalf of
    /// another session's task management; answer once they have ended.
    AbortTasks {
        lun: Option<u64>,
        done: oneshot::Sender<()>,
    },
}

/// A live session as other parts of the server see it.
#[derive(Clone, Debug)]
pub(crate) struct SessionHandle {
    pub id: u64,
    pub tsih: u16,
    pub key: Option<SessionKey>,
    pub control: mpsc::UnboundedSender<Control>,
    /// Becomes true once the session is fully torn down (tasks ended,
    /// `nexus_lost` called).
    pub closed: watch::Receiver<bool>,
    /// What its connection may queue toward the initiator.
    pub outgoing: Arc<OutgoingBudget>,
}

/// How others reach a session: its control channel, its end, and its
/// outgoing budget.
pub(crate) struct SessionLink {
    pub control: mpsc::UnboundedSender<Control>,
    pub closed: watch::Receiver<bool>,
    pub outgoing: Arc<OutgoingBudget>,
}

impl SessionHandle {
    /// Wait until the session has been torn down.
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.clone();
        // An error means the sender is gone, which also means closed.
        let _ = rx.wait_for(|c| *c).await;
    }

    pub fn target_name(&self) -> Option<&str> {
        self.key.as_ref().map(|k| &*k.target_name)
    }

    /// End the session now. Closing its outgoing budget wakes a connection
    /// blocked on an initiator that stopped reading, which would otherwise
    /// not see the request until its write deadline.
    pub fn close(&self, reason: CloseReason) {
        let _ = self.control.send(Control::Close(reason));
        self.outgoing.close();
    }
}

/// Errors while registering a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegisterError {
    TooManySessions,
    NoFreeTsih,
}

#[derive(Default)]
pub(crate) struct Registry {
    sessions: HashMap<u64, SessionHandle>,
    by_key: HashMap<SessionKey, u64>,
    tsihs: HashSet<u16>,
    next_tsih: u16,
    /// What logged-in sessions are, for listings; a session appears here
    /// once its final Login Response is on its way.
    described: HashMap<u64, Arc<SessionCtx>>,
}

impl Registry {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// The normal session with this key, if any.
    pub fn find_key(&self, key: &SessionKey) -> Option<SessionHandle> {
        self.by_key
            .get(key)
            .and_then(|id| self.sessions.get(id))
            .cloned()
    }

    /// The session holding this TSIH, if any.
    pub fn find_tsih(&self, tsih: u16) -> Option<SessionHandle> {
        self.sessions.values().find(|s| s.tsih == tsih).cloned()
    }

    /// Every session logged in to `target`.
    pub fn for_target(&self, target: &str) -> Vec<SessionHandle> {
        self.sessions
            .values()
            .filter(|s| s.target_name() == Some(target))
            .cloned()
            .collect()
    }

    pub fn all(&self) -> Vec<SessionHandle> {
        self.sessions.values().cloned().collect()
    }

    /// Record what a registered session is; nothing if it is gone already.
    pub fn describe(&mut self, ctx: Arc<SessionCtx>) {
        if self.sessions.contains_key(&ctx.id) {
            self.described.insert(ctx.id, ctx);
        }
    }

    /// Every described session, by id.
    pub fn described(&self) -> Vec<Arc<SessionCtx>> {
        let mut all: Vec<_> = self.described.values().cloned().collect();
        all.sort_by_key(|c| c.id);
        all
    }

    /// The described session `id`, with its handle.
    pub fn described_one(&self, id: u64) -> Option<(Arc<SessionCtx>, SessionHandle)> {
        let ctx = self.described.get(&id)?.clone();
        Some((ctx, self.sessions.get(&id)?.clone()))
    }

    /// Pick an unused non-zero TSIH.
    fn allocate_tsih(&mut self) -> Option<u16> {
        for _ in 0..=u16::MAX {
            self.next_tsih = self.next_tsih.wrapping_add(1);
            if self.next_tsih != 0 && !self.tsihs.contains(&self.next_tsih) {
                return Some(self.next_tsih);
            }
        }
        None
    }

    /// Add a session. `tsih` reuses a TSIH (connection reinstatement); 0
    /// allocates a new one. A previous session with the same key must have
    /// been removed first.
    pub fn register(
        &mut self,
        id: u64,
        tsih: u16,
        key: Option<SessionKey>,
        link: SessionLink,
        max_sessions: usize,
    ) -> Result<SessionHandle, RegisterError> {
        if self.sessions.len() >= max_sessions {
            return Err(RegisterError::TooManySessions);
        }
        let tsih = if tsih != 0 && !self.tsihs.contains(&tsih) {
            tsih
        } else {
            self.allocate_tsih().ok_or(RegisterError::NoFreeTsih)?
        };
        let handle = SessionHandle {
            id,
            tsih,
            key: key.clone(),
            control: link.control,
            closed: link.closed,
            outgoing: link.outgoing,
        };
        self.tsihs.insert(tsih);
        if let Some(k) = key {
            self.by_key.insert(k, id);
        }
        self.sessions.insert(id, handle.clone());
        Ok(handle)
    }

    /// Remove session `id`; its key mapping goes only if it still points
    /// at this session (a reinstating login may already own the key).
    pub fn remove(&mut self, id: u64) {
        self.described.remove(&id);
        if let Some(h) = self.sessions.remove(&id) {
            self.tsihs.remove(&h.tsih);
            if let Some(k) = h.key {
                if self.by_key.get(&k) == Some(&id) {
                    self.by_key.remove(&k);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(isid: u8) -> SessionKey {
        SessionKey {
            initiator_name: "iqn.i".into(),
            isid: [isid; 6],
            target_name: "iqn.t".into(),
        }
    }

    fn link() -> SessionLink {
        let (control, _rx) = mpsc::unbounded_channel();
        let (_wtx, closed) = watch::channel(false);
        SessionLink {
            control,
            closed,
            outgoing: Arc::new(OutgoingBudget::new(1 << 20)),
        }
    }

    #[test]
    fn tsihs_are_unique_and_nonzero() {
        let mut r = Registry::default();
        let mut seen = HashSet::new();
        for id in 0..1000 {
            let h = r.register(id, 0, None, link(), usize::MAX).unwrap();
            assert_ne!(h.tsih, 0);
            assert!(seen.insert(h.tsih));
        }
        assert_eq!(r.len(), 1000);
    }

    #[test]
    fn lookup_and_removal() {
        let mut r = Registry::default();
        let a = r.register(1, 0, Some(key(1)), link(), 10).unwrap();
        assert_eq!(r.find_key(&key(1)).map(|h| h.id), Some(1));
        assert_eq!(r.find_tsih(a.tsih).map(|h| h.id), Some(1));
        assert_eq!(r.for_target("iqn.t").len(), 1);
        assert!(r.find_key(&key(2)).is_none());
        // A reinstating session takes over the key before the old one is gone.
        r.register(2, 0, Some(key(1)), link(), 10).unwrap();
        r.remove(1);
        assert_eq!(r.find_key(&key(1)).map(|h| h.id), Some(2));
        r.remove(2);
        assert!(r.find_key(&key(1)).is_none());
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn reuses_requested_tsih_when_free() {
        let mut r = Registry::default();
        assert_eq!(r.register(1, 77, None, link(), 10).unwrap().tsih, 77);
        assert_ne!(r.register(2, 77, None, link(), 10).unwrap().tsih, 77);
    }

    #[test]
    fn session_limit() {
        let mut r = Registry::default();
        r.register(1, 0, None, link(), 1).unwrap();
        assert_eq!(
            r.register(2, 0, None, link(), 1).unwrap_err(),
            RegisterError::TooManySessions
        );
    }
}
