//! Builds the live objects a configuration describes: block devices,
//! logical units over them, SCSI targets and the iSCSI targets that carry
//! them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use block::BlockDevice;
use scsi::{LogicalUnit, LuConfig, LuRegistry};

use crate::error::ConfigError;
use crate::kinds::VolumeSpec;
use crate::model::{Config, Device, PoolConfig};
use scsi_api::ScsiTarget;

pub struct Runtime {
    /// What the transports serve.
    pub exports: export::Exports,
    pub listen: Vec<SocketAddr>,
    /// I/O statistics per target, LUN and initiator; kept across changes.
    pub stats: Arc<stats::Registry>,
    /// Every logical unit by device name, to flush them on shutdown.
    units: Vec<(String, Arc<LogicalUnit>)>,
    /// The live objects a later configuration change reuses.
    live: Live,
    /// Changes to live objects made by [`Runtime::commit`].
    pending: Mutex<Option<Pending>>,
    /// The pools the configuration declares, open or not.
    pools: Vec<PoolConfig>,
}

/// Objects that outlive a configuration change when their settings stay.
#[derive(Default)]
struct Live {
    /// By device name: the settings it was opened with (without source
    /// positions), the device and its logical unit.
    devices: HashMap<String, LiveDevice>,
    /// Every device open, mapped or under another, by name.
    nodes: HashMap<String, OpenNode>,
    /// Read-only logical units by device name.
    read_only: HashMap<String, Arc<LogicalUnit>>,
    /// SCSI views by (target name in lower case, group name or "", own
    /// registry?).
    views: HashMap<ViewKey, Arc<scsi::Target>>,
    registry: Option<Arc<LuRegistry>>,
    /// The counting wrappers around views, by (target in lower case, group
    /// name or ""), so a view that stays keeps its wrapper and sessions
    /// hold the same object across a change.
    counted: HashMap<(String, String), CountedView>,
}

/// A view and the wrapper that counts its commands.
type CountedView = (Arc<scsi::Target>, Arc<dyn ScsiTarget>);

type ViewKey = (String, String, bool);

/// A device's settings (without source positions), the device and its LU.
type LiveDevice = (Device, Arc<dyn BlockDevice>, Arc<LogicalUnit>);

/// A reused view and the LUN map it gets on commit.
type ViewUpdate = (Arc<scsi::Target>, BTreeMap<u64, Arc<LogicalUnit>>);

/// A device's settings without where they were written.
fn settings(dev: &Device) -> Device {
    Device {
        at: None,
        ..dev.clone()
    }
}

impl Runtime {
    /// Flushes every logical unit, even after one fails; returns the first
    /// failure.
    pub fn flush_all(&self) -> io::Result<()> {
        let mut first = None;
        for (name, lu) in &self.units {
            if let Err(e) = lu.flush() {
                tracing::error!(device = %name, "flush failed: {e}");
                first.get_or_insert(io::Error::new(e.kind(), format!("device {name}: {e}")));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The pools the configuration declares.
    pub fn pool_configs(&self) -> &[PoolConfig] {
        &self.pools
    }

    /// The pool named `name`: the one open under this daemon's LUNs, else
    /// opened now (created on first use); a pool no LUN uses closes when
    /// its last user drops it.
    pub fn pool(&self, name: &str) -> io::Result<Arc<pool::Pool>> {
        let p = self.pools.iter().find(|p| p.name == name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no pool named {name}"))
        })?;
        let member = |device: &str| {
            self.live
                .nodes
                .get(device)
                .map(|n| n.device.clone())
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("`{device}` is not open"))
                })
        };
        crate::pools::open_pool_with(p, &member)
    }

    /// The device that serves volume `volume` of pool `pool` as a LUN.
    pub fn exporter_of(&self, pool: &str, volume: &str) -> Option<&str> {
        self.live.devices.iter().find_map(|(name, (dev, _, _))| {
            let v = dev.spec.as_kind::<VolumeSpec>()?;
            (v.pool == pool && v.volume == volume).then_some(name.as_str())
        })
    }

    /// The logical units, by the name of the device under each.
    pub fn logical_units(&self) -> impl Iterator<Item = (&str, &Arc<LogicalUnit>)> {
        self.units.iter().map(|(name, lu)| (name.as_str(), lu))
    }
}

/// The LU settings of a device; identifiers not given are derived from the
/// device name (or what its kind says identifies it), so they stay the same
/// across restarts.
fn lu_config(config: &Config, dev: &Device, device: &dyn BlockDevice) -> LuConfig {
    let id = &dev.identity;
    let seed = dev.spec.identity_seed(device);
    let naa = id
        .naa
        .unwrap_or_else(|| scsi::naa_from_seed(seed.as_deref().unwrap_or(&dev.name)));
    let serial = id
        .serial
        .clone()
        .unwrap_or_else(|| naa[8..].iter().map(|b| format!("{b:02x}")).collect());
    let defaults = LuConfig::default();
    LuConfig {
        product: id.product_id.clone().unwrap_or(defaults.product.clone()),
        serial,
        naa,
        block_size: id.block_size,
        physical_block_exponent: (id.physical_block_size / id.block_size).trailing_zeros() as u8,
        read_only: dev.read_only,
        write_cache: dev.write_cache,
        pr_state_file: config
            .daemon
            .state_dir
            .as_ref()
            .map(|dir| dir.join(format!("{}.pr", dev.name))),
        ..defaults
    }
}

/// Opens the devices the targets use and creates every live object.
/// Nothing is served yet; the caller binds `listen` and starts the server.
pub fn build(config: &Config) -> Result<Runtime, ConfigError> {
    let runtime = build::build_from(config, None)?;
    runtime.commit(None);
    Ok(runtime)
}

/// Builds `config` while `previous` is being served: devices whose
/// settings did not change keep their logical units (data, reservations,
/// sessions' I/O), and the SCSI views of targets and groups that remain are
/// updated in place, so their sessions see the new LUN map (with REPORTED
/// LUNS DATA HAS CHANGED) without logging in again. Nothing live changes
/// until [`Runtime::commit`]; a returned error leaves `previous` as it was.
pub fn rebuild(config: &Config, previous: &Runtime) -> Result<Runtime, ConfigError> {
    build::build_from(config, Some(previous))
}

/// Changes to live objects that wait for [`Runtime::commit`].
struct Pending {
    /// Existing views and their new LUN maps.
    updates: Vec<ViewUpdate>,
    /// Open devices that take new settings in place.
    live_changes: Vec<LiveChange>,
}

impl Runtime {
    /// Makes a rebuilt runtime live: existing views get their new LUN maps,
    /// and views `previous` had and this runtime dropped lose every LUN.
    /// The caller then hands the exports (with their access rules) to the
    /// transports. Committing twice does nothing.
    pub fn commit(&self, previous: Option<&Runtime>) {
        let taken = self
            .pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let Some(pending) = taken else {
            return;
        };
        for (view, luns) in pending.updates {
            view.set_luns(luns);
        }
        if let Some(previous) = previous {
            for (key, view) in &previous.live.views {
                if !self.live.views.contains_key(key) {
                    view.set_luns(BTreeMap::new());
                }
            }
        }
        for change in pending.live_changes {
            match change.spec.apply_live(&*change.device, &change.gained) {
                Ok(()) => tracing::info!(device = %change.name, "settings applied in place"),
                Err(e) => tracing::error!(device = %change.name, "applying settings: {e}"),
            }
        }
    }

    /// Closes every open device cleanly, those built on others first: for
    /// shutdown, once the logical units are flushed. Returns the first
    /// failure.
    pub fn close_all(&self) -> io::Result<()> {
        self.close_where(|_| true)
    }

    /// Closes the devices this runtime has open and `next` does not (it
    /// replaced or dropped them), those built on others first.
    pub fn close_replaced(&self, next: &Runtime) -> io::Result<()> {
        self.close_where(|name| {
            let mine = &self.live.nodes[name].device;
            !next
                .live
                .nodes
                .values()
                .any(|n| Arc::ptr_eq(&n.device, mine))
        })
    }

    fn close_where(&self, close: impl Fn(&str) -> bool) -> io::Result<()> {
        let mut first = None;
        for name in graph::parents_first(&self.live.nodes) {
            if !close(&name) {
                continue;
            }
            let node = &self.live.nodes[&name];
            if let Err(e) = node.settings.spec.close(&*node.device) {
                tracing::error!(device = %name, "close failed: {e}");
                first.get_or_insert(io::Error::new(e.kind(), format!("device {name}: {e}")));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

mod build;
mod devices;
mod graph;
mod health;
mod pair_access;
mod samples;
pub use devices::DeviceNode;
#[cfg(test)]
pub(crate) use graph::keeps_device;
pub(crate) use graph::{LiveChange, OpenNode, Opener};
pub use health::{problems_under, DeviceHealth};

#[cfg(test)]
#[path = "runtime_tests.rs"]
mod tests;
