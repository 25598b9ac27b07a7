//! A logical unit over a mirror (directly or through a stack of devices)
//! follows the HA pair's roles with ALUA: this node's target port group
//! and the peer's, each active/optimized while that node's mirror is
//! primary (docs/ha.md, "ALUA").

use std::collections::HashMap;
use std::sync::Arc;

use block::BlockDevice;
use export::{AccessState, AccessStates, Cause, PortGroup, PAIR_SUPPORTED};
use ha::config::PortGroups;
use ha::mirror::{RoleWatcher, Roles};
use ha::{Mirror, Role};
use scsi::LogicalUnit;

use super::graph::OpenNode;
use crate::kinds::as_mirror;
use crate::model::Config;

/// The states of (this node's group, the peer's) for `roles`. A node
/// whose mirror is secondary cannot serve it but becomes able to by a
/// promotion: standby (SPC-4's state for a group the target can make
/// active), not unavailable. A peer this node has not heard from on the
/// current session is unavailable as far as this node can tell.
pub(crate) fn states_for(roles: Roles) -> (AccessState, AccessState) {
    let of = |role| match role {
        Role::Primary => AccessState::ActiveOptimized,
        Role::Secondary => AccessState::Standby,
    };
    let peer = roles.peer.map_or(AccessState::Unavailable, of);
    (of(roles.local), peer)
}

struct PairAccess {
    states: Arc<AccessStates>,
    groups: PortGroups,
}

impl RoleWatcher for PairAccess {
    fn roles_changed(&self, roles: Roles) {
        let (local, peer) = states_for(roles);
        // `set` raises ASYMMETRIC ACCESS STATE CHANGED for what changes.
        self.states.set(
            &[(self.groups.local, local), (self.groups.peer, peer)],
            Cause::Implicit,
        );
    }
}

/// The mirror `name` is, or the first one under it.
fn mirror_under<'a>(
    config: &Config,
    nodes: &'a HashMap<String, OpenNode>,
    name: &str,
) -> Option<&'a Mirror> {
    // The configuration's device graph has no cycles (validated).
    let mut todo = vec![name];
    while let Some(n) = todo.pop() {
        let device: &Arc<dyn BlockDevice> = &nodes.get(n)?.device;
        if let Some(m) = as_mirror(&**device) {
            return Some(m);
        }
        if let Some(d) = config.device(n) {
            todo.extend(d.spec.children());
        }
    }
    None
}

/// Gives every unit over a mirror the pair's two groups, in the states
/// the mirror's roles call for, and makes the mirror move them. Done
/// again on every build: a unit and mirror that stay see no change.
pub(crate) fn follow_roles(
    config: &Config,
    groups: PortGroups,
    units: &HashMap<&str, Arc<LogicalUnit>>,
    nodes: &HashMap<String, OpenNode>,
) {
    for (name, lu) in units {
        let Some(mirror) = mirror_under(config, nodes, name) else {
            continue;
        };
        let states = lu.backing().access_states().clone();
        let (local, peer) = states_for(mirror.roles());
        states.configure(
            vec![
                PortGroup::new(groups.local, local, true).with_ports(&[groups.local]),
                PortGroup::new(groups.peer, peer, false).with_ports(&[groups.peer]),
            ],
            AccessState::Unavailable,
            PAIR_SUPPORTED,
        );
        mirror.watch_roles(Some(Arc::new(PairAccess { states, groups })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_primarys_group_is_active_and_the_others_wait() {
        let r = |local, peer| states_for(Roles { local, peer });
        use AccessState::*;
        use Role::*;
        assert_eq!(r(Primary, Some(Secondary)), (ActiveOptimized, Standby));
        assert_eq!(r(Secondary, Some(Primary)), (Standby, ActiveOptimized));
        assert_eq!(r(Secondary, Some(Secondary)), (Standby, Standby));
        assert_eq!(r(Primary, None), (ActiveOptimized, Unavailable));
        assert_eq!(r(Secondary, None), (Standby, Unavailable));
    }
}
