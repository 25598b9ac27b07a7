//! What a replica does once it knows its peer's state: stay in sync,
//! copy to the peer, take from it, or refuse (split brain, a primary
//! with older data, replicas of different sizes or histories).

use std::sync::atomic::Ordering;

use super::generations::{self, Relation};
use super::{resync, wire, Connection, Inner, Role, State};

impl Inner {
    /// Decides, from both replicas' states, what this one does now.
    pub(super) fn evaluate(&self, st: &mut State) {
        let (Some(session), Some(peer)) = (st.session.clone(), st.peer.clone()) else {
            return;
        };
        if matches!(
            st.connection,
            Connection::SyncSource | Connection::SyncTarget
        ) {
            return; // the resync under way ends first
        }
        if st.peer_failed {
            return; // alone until the next pairing: no copy would commit
        }
        if peer.data_size != self.layout.data_size {
            return self.refused(
                st,
                format!(
                    "{} serves {} bytes and this node {}: the replicas must be the same size",
                    self.peer_name, peer.data_size, self.layout.data_size
                ),
            );
        }
        let me = st.header.generations;
        let relation = generations::compare(&me, &peer.generations);
        let source = match relation {
            Relation::Same if st.connection == Connection::Connected => return,
            Relation::Same => self.same_generation_source(st, &peer),
            Relation::Newer { .. } if peer.role == Role::Primary => {
                return self.refused(
                    st,
                    format!(
                        "{} is primary but this node holds newer data: demote it to resync",
                        self.peer_name
                    ),
                )
            }
            Relation::Newer { .. } => true,
            Relation::Older { .. } if st.role == Role::Primary => {
                return self.refused(
                    st,
                    format!(
                        "this node is primary but {} holds newer data: demote this node to resync",
                        self.peer_name
                    ),
                )
            }
            Relation::Older { .. } => false,
            Relation::SplitBrain => {
                let why = format!(
                    "split brain: this node (generation {:016x}) and {} (generation {:016x}) both \
                     wrote while apart; nothing is resynced until an operator chooses which to keep",
                    me.current, self.peer_name, peer.generations.current
                );
                tracing::error!(mirror = %self.name, "{why}");
                st.connection = Connection::SplitBrain;
                st.problem = Some(why);
                return;
            }
            Relation::Unrelated => {
                return self.refused(
                    st,
                    format!(
                        "this node and {} share no generation: they hold different data sets",
                        self.peer_name
                    ),
                )
            }
        };
        st.problem = None;
        if source {
            let full = matches!(relation, Relation::Newer { full: true });
            st.connection = Connection::SyncSource;
            self.resync_total.store(0, Ordering::Relaxed);
            self.resync_done.store(0, Ordering::Relaxed);
            if let Some(me) = self.me.upgrade() {
                let epoch = st.epoch;
                std::thread::spawn(move || resync::run(me, session, epoch, full));
            }
        } else {
            st.connection = Connection::SyncTarget;
        }
    }

    /// With the same generation on both, only writes in flight at a
    /// crash can differ; either copy of them is valid, so the primary's
    /// (or the one last primary, or a consistent one) is copied.
    fn same_generation_source(&self, st: &State, peer: &wire::State) -> bool {
        let mine = (
            !st.header.inconsistent,
            st.role == Role::Primary,
            st.header.was_primary,
        );
        let theirs = (
            !peer.inconsistent,
            peer.role == Role::Primary,
            peer.was_primary,
        );
        if mine != theirs {
            return mine > theirs;
        }
        self.node < peer.node
    }

    fn refused(&self, st: &mut State, why: String) {
        tracing::warn!(mirror = %self.name, "not replicating: {why}");
        st.connection = Connection::Refused;
        st.problem = Some(why);
    }
}
