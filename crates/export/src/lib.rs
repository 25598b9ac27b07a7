//! What every transport serves, whatever its protocol.
//!
//! A [`Backing`] is the device-facing half of a logical unit: the device,
//! the range locks every medium access holds, and the write-cache policy.
//! The SCSI logical units over a device and an NBD export of it share one
//! `Backing`, so a COMPARE AND WRITE excludes an NBD write to the same
//! blocks, and turning the write cache off (MODE SELECT) makes every
//! transport's writes stable before they complete.
//!
//! A [`Frontend`] is one transport (iSCSI, NBD): the control plane builds
//! [`Exports`] from the configuration and hands each frontend the new set
//! on every change; the frontend serves what concerns it.

mod access_state;
mod allow;
mod chap;
mod identity;
mod listen;
mod range_lock;
mod sessions;
pub mod thread_slots;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use block::BlockDevice;

pub use access_state::{
    AccessChange, AccessState, AccessStates, AccessWatcher, Cause, ExplicitMoves, MoveRefused,
    PortGroup, PAIR_SUPPORTED,
};
pub use allow::{Allow, Peer, Rule};
pub use chap::{ChapCredentials, ChapRequirement, Secret, MAX_SECRET_LEN, MIN_SECRET_LEN};
pub use identity::{naa_from_seed, NamespaceIds};
pub use listen::{ListenAddr, TlsConfig};
pub use range_lock::{RangeGuard, RangeLock};
pub use sessions::utc;

/// A device as the transports share it.
pub struct Backing {
    device: Arc<dyn BlockDevice>,
    /// Held over every medium access, in bytes.
    pub locks: RangeLock,
    /// Whether writes may complete before they are stable (the volatile
    /// cache is on); off, every write is forced to stable storage.
    write_cache: AtomicBool,
    /// The NAA designator the logical unit over the device reports, once
    /// one is built: what every transport names the device by.
    naa: parking_lot::Mutex<Option<[u8; 16]>>,
    /// Which target port groups may reach the device (ALUA, ANA): every
    /// transport over it reports and obeys the same states.
    access: Arc<AccessStates>,
}

impl Backing {
    pub fn new(device: Arc<dyn BlockDevice>, write_cache: bool) -> Arc<Backing> {
        Arc::new(Backing {
            device,
            locks: RangeLock::default(),
            write_cache: AtomicBool::new(write_cache),
            naa: parking_lot::Mutex::new(None),
            access: AccessStates::new(),
        })
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    pub fn write_cache(&self) -> bool {
        self.write_cache.load(Ordering::Relaxed)
    }

    pub fn set_write_cache(&self, on: bool) {
        self.write_cache.store(on, Ordering::Relaxed);
    }

    /// The asymmetric access states of the device's target port groups.
    pub fn access_states(&self) -> &Arc<AccessStates> {
        &self.access
    }

    /// The device's NAA designator, as its logical unit reports it.
    pub fn naa(&self) -> Option<[u8; 16]> {
        *self.naa.lock()
    }

    /// Records the designator the logical unit over the device reports,
    /// so the other transports identify the device the same way.
    pub fn set_naa(&self, naa: [u8; 16]) {
        *self.naa.lock() = Some(naa);
    }

    /// NVMe namespace identifiers of the device: those of the designator
    /// its logical unit reports, else derived from `seed` (the configured
    /// name) as the logical unit's would be.
    pub fn namespace_ids(&self, seed: &str) -> NamespaceIds {
        NamespaceIds::from_naa(self.naa().unwrap_or_else(|| naa_from_seed(seed)))
    }

    /// Whether a write must be stable before it completes.
    pub fn force_unit_access(&self, fua: bool) -> bool {
        fua || !self.write_cache()
    }
}

/// A SCSI target as a configuration exports it: the name initiators log
/// in to and the commands' target (LUN map, access view).
#[derive(Clone)]
pub struct ScsiExport {
    pub name: String,
    pub alias: Option<String>,
    /// Addresses the target is offered on.
    pub portals: Vec<SocketAddr>,
    pub scsi: Arc<dyn scsi_api::ScsiTarget>,
    /// Who may log in and what each initiator sees; `None` admits every
    /// initiator to `scsi` without authentication.
    pub access: Option<ScsiAccess>,
}

/// The initiator groups of a SCSI target and the CHAP they must pass.
#[derive(Clone, Default)]
pub struct ScsiAccess {
    /// An initiator named exactly by a group is in it, else in the first
    /// group with a matching wildcard pattern, else in none.
    pub groups: Vec<ScsiGroup>,
    /// What initiators no group names see; `None` refuses them.
    pub default_view: Option<Arc<dyn scsi_api::ScsiTarget>>,
    /// CHAP for every initiator of the target, unless its group has its own.
    pub chap: Option<ChapRequirement>,
}

/// A named set of initiators and the LUN map they see.
#[derive(Clone)]
pub struct ScsiGroup {
    pub name: String,
    /// Initiator names or patterns (`*` wildcards), as configured.
    pub initiators: Vec<String>,
    pub view: Arc<dyn scsi_api::ScsiTarget>,
    pub chap: Option<ChapRequirement>,
}

/// Everything one configuration exports, for every transport.
#[derive(Clone, Default)]
pub struct Exports {
    /// Every served device by its configured name (what a device export
    /// names is among them).
    pub devices: BTreeMap<String, Arc<Backing>>,
    /// SCSI targets, for transports that carry SCSI commands (iSCSI).
    pub scsi_targets: Vec<ScsiExport>,
    /// CHAP every discovery session must pass.
    pub discovery_chap: Option<ChapRequirement>,
    /// Devices offered by name to transports that serve devices
    /// directly (NBD).
    pub device_exports: Vec<DeviceExport>,
    /// This node's target port group when it is one of an HA pair, whose
    /// nodes each form their own; `None` on a node alone (group 1).
    pub target_port_group: Option<u16>,
}

/// The device export a client asking for no name ("") gets.
pub const DEFAULT_EXPORT: &str = "default";

/// A device offered under a name, as a configuration exports it.
#[derive(Clone)]
pub struct DeviceExport {
    /// The name clients ask for.
    pub name: String,
    /// The configured device served, and the one [`Backing`] every
    /// transport over it shares.
    pub device: String,
    pub backing: Arc<Backing>,
    /// Refuse writes even where the device takes them.
    pub read_only: bool,
    /// Client addresses, CIDR networks or `unix`; empty admits every
    /// client. Validated with the configuration.
    pub allow: Vec<String>,
    /// Shown to clients listing the exports.
    pub description: String,
}

/// One transport, as the control plane drives it.
pub trait Frontend: Send + Sync {
    /// "iscsi", "nbd": for logs and metrics labels.
    fn transport(&self) -> &'static str;

    /// Serves `exports` from now on; sessions on exports that stay keep
    /// going.
    fn replace_exports(&self, exports: &Exports);

    /// Ends the sessions the current access rules no longer admit.
    fn end_refused_sessions(&self) -> usize;

    /// The live sessions as `/v1/sessions` lists them: JSON objects with
    /// at least `id` (unique across transports), `transport` and `peer`,
    /// then what the transport negotiated.
    fn sessions(&self) -> Vec<serde_json::Value> {
        Vec::new()
    }

    /// Ends session `id`, or asks its initiator to, when it is one of
    /// this transport's; the answer says which.
    fn end_session(&self, id: &str) -> Option<serde_json::Value> {
        let _ = id;
        None
    }

    /// What `status` shows of the transport beyond its sessions: where it
    /// listens, what it serves, and what is wrong with it. `None` for a
    /// transport whose status the daemon composes itself.
    fn status(&self) -> Option<TransportStatus> {
        None
    }
}

/// A transport's part of the daemon's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TransportStatus {
    /// Listeners and what is served, as the transport shows them.
    pub summary: serde_json::Value,
    /// Each (what, why) makes the array degraded: `("nvmf namespace
    /// nqn...:1", "device vm is not open")`.
    pub problems: Vec<(String, String)>,
}
