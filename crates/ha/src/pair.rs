//! This node's link to its peer, once the daemon has started it from the
//! `[ha]` section: what every mirror device of the node replicates over.
//! One per process, as a node has one peer.

use std::sync::{Arc, Mutex};

use crate::link::Link;

static LINK: Mutex<Option<Arc<Link>>> = Mutex::new(None);

/// Sets (or with `None`, clears) the node's link.
pub fn set_link(link: Option<Arc<Link>>) {
    *LINK.lock().unwrap_or_else(|p| p.into_inner()) = link;
}

/// The node's link, if the pair is configured and started.
pub fn link() -> Option<Arc<Link>> {
    LINK.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

static PORT_GROUPS: Mutex<Option<crate::config::PortGroups>> = Mutex::new(None);

/// Sets (or clears) the target port groups of the pair: this node's
/// portals form `local`, the peer's `peer`.
pub fn set_port_groups(groups: Option<crate::config::PortGroups>) {
    *PORT_GROUPS.lock().unwrap_or_else(|p| p.into_inner()) = groups;
}

/// The pair's target port groups, if the pair is configured.
pub fn port_groups() -> Option<crate::config::PortGroups> {
    *PORT_GROUPS.lock().unwrap_or_else(|p| p.into_inner())
}

static FAILOVER: Mutex<Option<Arc<crate::failover::Failover>>> = Mutex::new(None);

/// Sets (or clears) the node's failover with the witness.
pub fn set_failover(failover: Option<Arc<crate::failover::Failover>>) {
    *FAILOVER.lock().unwrap_or_else(|p| p.into_inner()) = failover;
}

/// The node's failover, if the pair names a witness.
pub fn failover() -> Option<Arc<crate::failover::Failover>> {
    FAILOVER.lock().unwrap_or_else(|p| p.into_inner()).clone()
}
