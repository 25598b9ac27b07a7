//! Telling what follows the pair (ALUA) which node serves a mirror: a
//! watcher hears this node's role and the peer's after every change of
//! either.

use std::sync::Arc;

use super::{Inner, Mirror, Role};

/// This node's role and the peer's, as far as this node has heard it
/// (`None`: no peer state on the current session, or no session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    pub local: Role,
    pub peer: Option<Role>,
}

/// Told of the roles after a promotion, a demotion, and when the peer's
/// role is heard or lost.
pub trait RoleWatcher: Send + Sync {
    fn roles_changed(&self, roles: Roles);
}

#[derive(Default)]
pub(crate) struct Told {
    watcher: Option<Arc<dyn RoleWatcher>>,
    last: Option<Roles>,
}

impl Mirror {
    /// Makes `watcher` the one told of role changes (replacing any
    /// before it) and tells it the roles now.
    pub fn watch_roles(&self, watcher: Option<Arc<dyn RoleWatcher>>) {
        *self.inner.told.lock() = Told {
            watcher,
            last: None,
        };
        self.inner.tell_roles();
    }

    pub fn roles(&self) -> Roles {
        self.inner.roles_now()
    }
}

impl Inner {
    pub(super) fn roles_now(&self) -> Roles {
        let st = self.state.lock();
        Roles {
            local: st.role,
            peer: st.peer.as_ref().map(|p| p.role),
        }
    }

    /// Tells the watcher of a change. Never called with `state` held:
    /// the watcher takes locks of its own (the SCSI layer's). Reading the
    /// roles under `told` keeps two changes in order.
    pub(super) fn tell_roles(&self) {
        let mut told = self.told.lock();
        let now = self.roles_now();
        if told.last == Some(now) {
            return;
        }
        told.last = Some(now);
        if let Some(w) = told.watcher.clone() {
            w.roles_changed(now);
        }
    }
}
