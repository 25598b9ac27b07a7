//! The validated configuration: what the daemon is told to serve.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::Location;
use crate::kinds::Spec;

/// Port used when a portal gives only an address.
pub const DEFAULT_ISCSI_PORT: u16 = 3260;

/// Size of `mem` and `null` devices that give none.
pub const DEFAULT_DEVICE_SIZE: u64 = 1 << 30;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where the configuration came from, for messages: a file name or
    /// `<built-in default>`.
    pub origin: String,
    pub daemon: Daemon,
    pub portals: Vec<Portal>,
    pub pools: Vec<PoolConfig>,
    pub schedules: Vec<Schedule>,
    pub devices: Vec<Device>,
    pub targets: Vec<Target>,
    /// CHAP every discovery session must pass.
    pub discovery_chap: Option<Chap>,
    /// The NBD transport, when `[nbd]` is given.
    pub nbd: Option<Nbd>,
    /// Sections other crates own (`[nvmf]`, `[ha]`), by name.
    pub sections: crate::sections::Sections,
}

/// Where NBD clients connect and what they may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nbd {
    /// [`DEFAULT_NBD_LISTEN`] when the section gives none.
    pub listen: Vec<export::ListenAddr>,
    pub tls: Option<export::TlsConfig>,
    pub exports: Vec<NbdExport>,
    pub at: Option<Location>,
}

/// Where NBD listens when `[nbd]` names no address.
pub const DEFAULT_NBD_LISTEN: &str = "127.0.0.1:10809";

/// Port used when an NBD listen address gives only a host.
pub const DEFAULT_NBD_PORT: u16 = 10809;

/// A device offered to NBD clients under a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdExport {
    /// The name clients ask for ("" reaches the one named `default`).
    pub name: String,
    /// Name of a [`Device`].
    pub device: String,
    pub read_only: bool,
    /// Addresses, CIDR networks or `unix`; empty admits every client.
    pub allow: Vec<String>,
    pub description: String,
    pub at: Option<Location>,
}

/// CHAP credentials (secrets are hidden from `Debug`).
pub type Chap = export::ChapRequirement;

/// Name of the group that serves initiators no other group names.
pub const DEFAULT_GROUP: &str = "default";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Daemon {
    /// Directory for state that must survive restarts (persistent
    /// reservations). Without it, APTPL reservations are not kept.
    pub state_dir: Option<PathBuf>,
    /// Most normal sessions one initiator may hold; the transport's
    /// default when absent.
    pub max_sessions_per_initiator: Option<usize>,
    /// Most connections one portal holds; the transport's default when
    /// absent.
    pub max_connections_per_portal: Option<usize>,
    /// Time a connection gets to complete its login.
    pub login_timeout: Option<Duration>,
    /// Ping (NOP-In) an initiator silent for this long; `Some(None)` when
    /// pings are turned off.
    pub nop_interval: Option<Option<Duration>>,
    /// Close a connection whose ping is not answered in this time.
    pub nop_timeout: Option<Duration>,
    /// Close a connection whose initiator accepts no data for this long.
    pub write_timeout: Option<Duration>,
    /// Most connections one address may have logging in at once.
    pub max_logins_per_source: Option<usize>,
    /// Most connections logging in at once; the oldest makes room.
    pub max_logins: Option<usize>,
    /// Most connections one address may hold past login or negotiation,
    /// on each listener (iSCSI, NBD, the TCP API).
    pub max_connections_per_source: Option<usize>,
    /// Bytes one connection may have queued toward its initiator.
    pub max_queued_output: Option<usize>,
    /// TCP address of the administration API, beside the unix socket.
    pub api_listen: Option<SocketAddr>,
    /// File holding the bearer token the TCP API requires.
    pub api_token_file: Option<PathBuf>,
    /// File holding a second token whose callers may read but not change.
    pub api_read_only_token_file: Option<PathBuf>,
    /// Time an administration API caller has to send its request head.
    pub api_header_timeout: Option<Duration>,
    /// Time an administration API caller has to send its request body.
    pub api_body_timeout: Option<Duration>,
    /// Delay after the first failed CHAP attempt of an initiator name or
    /// source address; it doubles with every further failure.
    pub auth_fail_delay: Option<Duration>,
    /// Longest delay between CHAP attempts after failures.
    pub auth_fail_delay_max: Option<Duration>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub listen: SocketAddr,
    pub at: Option<Location>,
}

/// A storage pool: data devices, a metadata store and the allocation unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub pool: String,
    /// What to snapshot, when, and how many to keep.
    pub spec: schedule::Spec,
    /// Clones of the volume re-pointed at each new snapshot.
    pub refresh: Vec<String>,
    pub at: Option<Location>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    pub name: String,
    /// Data devices, in pool order.
    pub devices: Vec<PoolMember>,
    /// Create or extend data files to this size.
    pub device_size: Option<u64>,
    pub metadata: PathBuf,
    /// Allocation unit used when the pool is created.
    pub unit_size: u64,
    /// Space in use at which initiators are told (a unit attention) and
    /// a warning is logged.
    pub soft_threshold: Option<pool::SoftThreshold>,
    /// Most the writable volumes' sizes may add up to per byte of pool,
    /// in hundredths (3.0 is 300).
    pub max_overcommit: Option<u32>,
    pub at: Option<Location>,
}

/// A data device of a pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolMember {
    /// A file or block device, opened by the pool.
    Path(PathBuf),
    /// A configured `[[device]]` (a name without `/`).
    Device(String),
}

impl std::fmt::Display for PoolMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolMember::Path(p) => write!(f, "{}", p.display()),
            PoolMember::Device(name) => write!(f, "{name}"),
        }
    }
}

impl PoolConfig {
    /// The configured devices among the pool's data devices.
    pub fn member_devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().filter_map(|m| match m {
            PoolMember::Device(name) => Some(name.as_str()),
            PoolMember::Path(_) => None,
        })
    }
}

/// A configured device: its kind and settings (what holds the data) and
/// the identity of the logical unit that serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub spec: Spec,
    pub identity: LuIdentity,
    pub read_only: bool,
    pub write_cache: bool,
    pub at: Option<Location>,
}

/// What a device's logical unit tells initiators of itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LuIdentity {
    pub product_id: Option<String>,
    pub serial: Option<String>,
    /// When absent, derived from the device name.
    pub naa: Option<[u8; 16]>,
    pub block_size: u32,
    /// Physical block size in bytes reported to initiators (a power of two
    /// multiple of `block_size`); equal to it unless configured.
    pub physical_block_size: u32,
}

impl Device {
    pub fn kind(&self) -> &'static str {
        self.spec.kind()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub alias: Option<String>,
    /// Portals this target is offered on; `None` means every portal.
    pub portals: Option<Vec<SocketAddr>>,
    /// LUNs every initiator sees; empty when the target has groups.
    pub luns: Vec<Lun>,
    /// CHAP every login to the target must pass, unless its group has its own.
    pub chap: Option<Chap>,
    /// Initiator groups; with any, initiators no group names are refused
    /// unless there is a group named [`DEFAULT_GROUP`].
    pub groups: Vec<Group>,
    pub at: Option<Location>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    /// Initiator names or patterns with `*` and `?`.
    pub initiators: Vec<String>,
    pub chap: Option<Chap>,
    pub luns: Vec<Lun>,
    pub at: Option<Location>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lun {
    pub lun: u64,
    /// Name of a [`Device`].
    pub device: String,
    /// Writes through this mapping fail with DATA PROTECT.
    pub read_only: bool,
    pub at: Option<Location>,
}

impl Config {
    /// Replaces the configured portals, e.g. from `--listen`; every target
    /// is then offered on all of them. Repeated addresses count once.
    pub fn override_listen(&mut self, listen: &[SocketAddr]) {
        self.portals.clear();
        for &addr in listen {
            if !self.portals.iter().any(|p| p.listen == addr) {
                self.portals.push(Portal {
                    listen: addr,
                    at: None,
                });
            }
        }
        for target in &mut self.targets {
            target.portals = None;
        }
    }

    /// Whether any CHAP secret is configured.
    pub fn has_secrets(&self) -> bool {
        self.discovery_chap.is_some()
            || self
                .targets
                .iter()
                .any(|t| t.chap.is_some() || t.groups.iter().any(|g| g.chap.is_some()))
    }

    /// Names of the devices served: mapped by some LUN, exported over
    /// NBD or served by a section. These are opened; the others only when a served one is over
    /// them.
    pub fn mapped_devices(&self) -> std::collections::BTreeSet<&str> {
        let mut served = mapped_devices(&self.targets);
        served.extend(self.nbd_exports().map(|e| e.device.as_str()));
        for s in self.sections.values() {
            served.extend(s.devices().iter().map(String::as_str));
        }
        served
    }

    pub fn nbd_exports(&self) -> impl Iterator<Item = &NbdExport> {
        self.nbd.iter().flat_map(|n| &n.exports)
    }

    /// The NBD exports of device `device`.
    pub fn nbd_exports_of(&self, device: &str) -> Vec<&str> {
        self.nbd_exports()
            .filter(|e| e.device == device)
            .map(|e| e.name.as_str())
            .collect()
    }

    /// Replaces where NBD listens, e.g. from `--nbd-listen`; a
    /// configuration without `[nbd]` gets one without exports.
    pub fn override_nbd_listen(&mut self, listen: &[export::ListenAddr]) {
        let nbd = self.nbd.get_or_insert_with(|| Nbd {
            listen: Vec::new(),
            tls: None,
            exports: Vec::new(),
            at: None,
        });
        nbd.listen.clear();
        for addr in listen {
            if !nbd.listen.contains(addr) {
                nbd.listen.push(addr.clone());
            }
        }
    }

    /// The targets with a LUN (of any group) served by device `device`.
    pub fn targets_serving(&self, device: &str) -> Vec<&str> {
        self.targets
            .iter()
            .filter(|t| {
                t.luns
                    .iter()
                    .chain(t.groups.iter().flat_map(|g| &g.luns))
                    .any(|l| l.device == device)
            })
            .map(|t| t.name.as_str())
            .collect()
    }

    pub fn device(&self, name: &str) -> Option<&Device> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// Addresses a target is offered on.
    pub fn target_portals(&self, target: &Target) -> Vec<SocketAddr> {
        match &target.portals {
            Some(list) => list.clone(),
            None => self.portals.iter().map(|p| p.listen).collect(),
        }
    }
}

/// Names of the devices some LUN of `targets` maps.
pub fn mapped_devices(targets: &[Target]) -> std::collections::BTreeSet<&str> {
    targets
        .iter()
        .flat_map(|t| t.luns.iter().chain(t.groups.iter().flat_map(|g| &g.luns)))
        .map(|l| l.device.as_str())
        .collect()
}
