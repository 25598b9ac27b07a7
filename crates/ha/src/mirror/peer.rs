//! The mirror's end of the link: sessions coming and going, the peer's
//! state, and the requests the peer sends (its writes as primary, a
//! resync's copies, the end of a resync).

use std::io;
use std::sync::Arc;

use block::{check_range_of, ErrorClass};
use regions::bitmap_bytes;

use super::wire::{self, Request};
use super::{meta, refuse, Connection, Inner, Role, State};
use crate::link::{Endpoint, Incoming, Session};

impl Endpoint for Inner {
    fn connected(&self, session: &Arc<Session>) {
        let mut st = self.state.lock();
        st.session = Some(session.clone());
        st.epoch += 1;
        st.peer = None;
        st.peer_failed = false;
        st.connection = Connection::Connecting;
        st.problem = None;
        self.send_state(&st);
        drop(st);
        self.tell_roles();
    }

    fn disconnected(&self, id: u64) {
        let mut st = self.state.lock();
        if st.session.as_ref().is_some_and(|s| s.id == id) {
            // Only an owner's loss is taken over: two secondaries apart
            // stay as an operator left them.
            let owner_lost = st.peer.as_ref().is_some_and(|p| p.role == Role::Primary);
            st.current_at_loss = st.role == Role::Primary
                || (owner_lost
                    && st.connection == Connection::Connected
                    && !st.header.inconsistent);
            st.session = None;
            st.peer = None;
            st.connection = Connection::Disconnected;
            // Whatever the peer took without a flush may be gone with it.
            st.intent.active_to_out_of_sync();
            tracing::warn!(mirror = %self.name, "lost the link to {}", self.peer_name);
        }
        drop(st);
        self.tell_roles();
    }

    fn notice(&self, session: &Arc<Session>, payload: Vec<u8>) {
        let peer = match wire::State::decode(&payload) {
            Ok(p) => p,
            Err(e) => return session.close(&format!("mirror {}: {e}", self.name)),
        };
        let mut st = self.state.lock();
        if st.session.as_ref().is_none_or(|s| s.id != session.id) {
            return;
        }
        if st
            .peer
            .as_ref()
            .is_some_and(|p| p.incarnation != peer.incarnation)
        {
            // The peer's mirror was opened again (after a crash, or a
            // changed setting): pair anew, as on a new session.
            tracing::info!(mirror = %self.name, "{}'s mirror was opened again", self.peer_name);
            st.epoch += 1;
            st.intent.active_to_out_of_sync();
            st.connection = Connection::Connecting;
            st.peer_failed = false;
            st.problem = None;
            self.send_state(&st);
        }
        if st.peer.is_none() {
            // The first state heard on this session: ours may have gone
            // out before the peer's mirror was open to hear it (the link
            // comes up before devices open). Sent again before anything
            // the decision below sends.
            self.send_state(&st);
        }
        st.peer = Some(peer);
        self.evaluate(&mut st);
        drop(st);
        self.tell_roles();
    }

    fn request(&self, request: Incoming) {
        let Some(me) = self.me.upgrade() else { return };
        // Device I/O blocks; the link's reader must not.
        tokio::task::spawn_blocking(move || {
            let body = match me.serve(&request.session, &request.payload) {
                Ok(data) => wire::ok(&data),
                Err(e) => wire::err(&e),
            };
            request.reply(&body);
        });
    }
}

impl Inner {
    fn serve(&self, session: &Session, payload: &[u8]) -> io::Result<Vec<u8>> {
        let request = Request::decode(payload)?;
        let current = |st: &State| st.session.as_ref().is_some_and(|s| s.id == session.id);
        match request {
            Request::Write {
                gen,
                offset,
                fua,
                resync,
                data,
            } => {
                check_range_of("mirror", self.layout.data_size, offset, data.len() as u64)?;
                self.admit_write(session, gen, resync)?;
                self.local.write_at(data, offset, fua)?;
            }
            Request::Zeroes { gen, offset, len } => {
                check_range_of("mirror", self.layout.data_size, offset, len)?;
                self.admit_write(session, gen, false)?;
                self.local.write_zeroes(offset, len)?;
            }
            Request::Flush => {
                if !current(&self.state.lock()) {
                    return Err(stale(session));
                }
                self.local.flush()?;
            }
            Request::Bitmap => {
                let st = self.state.lock();
                if !current(&st) || st.connection != Connection::SyncTarget {
                    return Err(stale(session));
                }
                return Ok(st
                    .intent
                    .differing()
                    .to_bytes(bitmap_bytes(self.layout.regions)));
            }
            Request::StepDown => {
                if !current(&self.state.lock()) {
                    return Err(stale(session));
                }
                tracing::info!(mirror = %self.name, "{} asked this node to step down (a planned failover)", self.peer_name);
                self.demote()?;
            }
            Request::ResyncDone { generations } => {
                if self.state.lock().connection != Connection::SyncTarget {
                    return Err(stale(session));
                }
                self.local.flush()?;
                let mut st = self.state.lock();
                if !current(&st) || st.connection != Connection::SyncTarget {
                    return Err(stale(session));
                }
                // The new generation first: a crash before the bitmap is
                // cleared leaves only needless bits.
                let mut header = st.header;
                header.generations.adopt(&generations);
                header.inconsistent = false;
                st.header = meta::write_header(&*self.local, &self.layout, &header)?;
                st.intent.clear_all();
                self.persist_bitmap(&st)?;
                st.connection = Connection::Connected;
                st.problem = None;
                // The source compares again with what this replica now is,
                // and so does this one with what the source said since
                // (a promotion during the copy moves it on).
                self.send_state(&st);
                self.evaluate(&mut st);
                tracing::info!(mirror = %self.name, "resync from {} ended: up to date", self.peer_name);
            }
        }
        Ok(Vec::new())
    }

    /// Whether the peer may write here now: a resync's copy while this
    /// replica is its target (marked inconsistent on disk first), or a
    /// primary's write of the generation this replica agreed to.
    fn admit_write(&self, session: &Session, gen: u64, resync: bool) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.session.as_ref().is_none_or(|s| s.id != session.id) {
            return Err(stale(session));
        }
        if resync {
            if st.connection != Connection::SyncTarget {
                return Err(refuse(
                    ErrorClass::Fenced,
                    format!("{}: not a resync target", self.name),
                ));
            }
            if !st.header.inconsistent {
                st.header.inconsistent = true;
                self.persist_header(&mut st)?;
            }
            return Ok(());
        }
        let peer_gen = st
            .peer
            .as_ref()
            .filter(|p| p.role == Role::Primary)
            .map(|p| p.generations.current);
        let agreed = matches!(
            st.connection,
            Connection::Connected | Connection::SyncTarget
        );
        if st.role != Role::Secondary || !agreed || peer_gen != Some(gen) {
            return Err(refuse(
                ErrorClass::Fenced,
                format!(
                    "{}: refused a write from {} (this node {:?}, pair {:?}, generation {gen:016x})",
                    self.name, self.peer_name, st.role, st.connection
                ),
            ));
        }
        Ok(())
    }
}

fn stale(session: &Session) -> io::Error {
    refuse(
        ErrorClass::Fenced,
        format!("a request of an ended session with {}", session.peer),
    )
}
