//! `ha failover`: moving a mirror to this node. Planned, the primary
//! peer is asked over the link to demote (flushing what it wrote) and
//! this replica, in sync, is promoted. Forced, this node is promoted
//! without the peer and without the witness's grant: the operator
//! vouches that the peer no longer writes.

use std::io;
use std::time::{Duration, Instant};

use block::ErrorClass;

use super::wire::{self, Request};
use super::{refuse, Connection, Mirror, Role};

impl Mirror {
    /// Makes this node primary, the peer stepping down first; with
    /// `force`, whatever the peer and the witness say.
    pub fn failover(&self, force: bool) -> io::Result<()> {
        let inner = &self.inner;
        if force {
            if let Some(f) = &inner.options.failover {
                f.force(&inner.name);
            }
            return inner.promote();
        }
        let (session, peer_role, connection) = {
            let st = inner.state.lock();
            (
                st.session.clone().filter(|s| !s.is_closed()),
                st.peer.as_ref().map(|p| p.role),
                st.connection,
            )
        };
        let Some(session) = session else {
            return Err(refuse(
                ErrorClass::NotReady,
                format!(
                    "{}: {} is not reachable; `ha failover --force` promotes without it",
                    inner.name, inner.peer_name
                ),
            ));
        };
        if connection != Connection::Connected {
            return Err(refuse(
                ErrorClass::NotReady,
                format!(
                    "{}: the pair is {connection:?}, not in sync: a planned failover waits for it",
                    inner.name
                ),
            ));
        }
        if peer_role == Some(Role::Primary) {
            let body = session
                .request(&inner.name, &Request::StepDown.encode())?
                .wait(inner.options.peer_timeout)?;
            wire::reply(&body, &inner.peer_name)?;
            // The peer's new state is sent before its reply; wait the
            // moment it may take to be handled here.
            let start = Instant::now();
            while inner.roles_now().peer == Some(Role::Primary) {
                if start.elapsed() > inner.options.peer_timeout {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{}: {} did not step down", inner.name, inner.peer_name),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        inner.promote()
    }
}
