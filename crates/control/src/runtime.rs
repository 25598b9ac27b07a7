//! Builds the live objects a configuration describes: block devices,
//! logical units over them, SCSI targets and the iSCSI targets that carry
//! them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use block::BlockDevice;
use scsi::{LogicalUnit, LuConfig, LuRegistry};

use crate::error::{ConfigError, Issue};
use crate::kinds::VolumeSpec;
use crate::model::{Config, Device, Lun, PoolConfig, DEFAULT_GROUP};
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
    let runtime = build_from(config, None)?;
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
    build_from(config, Some(previous))
}

fn build_from(config: &Config, previous: Option<&Runtime>) -> Result<Runtime, ConfigError> {
    let origin = config.origin.as_str();
    let mut issues = Vec::new();
    let mut fail = |location, field: String, reason: String| {
        issues.push(Issue {
            location,
            field,
            reason,
        })
    };

    if config.portals.is_empty() {
        fail(
            None,
            "portal".into(),
            "no [[portal]] to listen on (add one, or pass --listen)".into(),
        );
    }
    if let Some(dir) = &config.daemon.state_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            fail(
                None,
                "daemon.state_dir".into(),
                format!("cannot create {}: {e}", dir.display()),
            );
        }
    }

    let used = config.mapped_devices();
    let opener = Opener::new(config, previous.map(|p| &p.live.nodes));
    // Pools open before their volumes, so that their problems are told
    // against the `[[pool]]`; a pool over configured devices opens with
    // the configuration, so those devices (and their faults) are live.
    let wanted: BTreeSet<&str> = config
        .devices
        .iter()
        .filter(|d| used.contains(d.name.as_str()))
        .filter_map(|d| d.spec.pool())
        .collect();
    for (i, p) in config.pools.iter().enumerate() {
        let over_devices = p.member_devices().next().is_some();
        if !wanted.contains(p.name.as_str()) && !over_devices {
            continue;
        }
        match opener.pool(&p.name) {
            Ok(pool) => {
                let space = pool.space();
                tracing::info!(pool = %p.name, size = space.size(), used = space.used(), "opened pool");
            }
            Err(e) => fail(p.at, format!("pool[{i}]"), e.to_string()),
        }
    }
    let mut units: HashMap<&str, Arc<LogicalUnit>> = HashMap::new();
    // The devices under the units, for read-only mappings of them.
    let mut opened: HashMap<&str, Arc<dyn BlockDevice>> = HashMap::new();
    for (i, dev) in config.devices.iter().enumerate() {
        if !used.contains(dev.name.as_str()) {
            continue;
        }
        let field = match dev.spec.open_field() {
            Some(key) => format!("device[{i}].{key}"),
            None => format!("device[{i}]"),
        };
        let (device, reused) = match opener.open(&dev.name) {
            Ok(opened) => opened,
            Err(e) => {
                fail(dev.at, field, e.to_string());
                continue;
            }
        };
        let was = previous.and_then(|p| p.live.devices.get(&dev.name));
        if let (true, Some((settings_then, _, lu))) = (reused, was) {
            if graph::keeps_unit(settings_then, &settings(dev)) {
                units.insert(dev.name.as_str(), lu.clone());
                opened.insert(dev.name.as_str(), device);
                continue;
            }
        }
        let action = if reused {
            "new logical unit over the open device"
        } else {
            "opened device"
        };
        let block_size = dev.identity.block_size;
        let size = device.size();
        if size < block_size as u64 {
            fail(
                dev.at,
                field,
                format!("{size} bytes is less than one {block_size}-byte block"),
            );
            continue;
        }
        if size % block_size as u64 != 0 {
            tracing::warn!(device = %dev.name, size, block_size, "size is not a whole number of blocks; the tail is not used");
        }
        tracing::info!(device = %dev.name, backing = %device.describe(), size, "{action}");
        // A device that stays keeps its range locks and write cache, which
        // other transports may share.
        let backing = match (reused, was) {
            (true, Some((_, _, lu))) => lu.backing().clone(),
            _ => export::Backing::new(device.clone(), dev.write_cache),
        };
        match LogicalUnit::over(backing, lu_config(config, dev, &*device)) {
            Ok(lu) => {
                units.insert(dev.name.as_str(), lu);
                opened.insert(dev.name.as_str(), device);
            }
            Err(e) => fail(
                dev.at,
                format!("device[{i}]"),
                format!("cannot create the logical unit: {e}"),
            ),
        }
    }
    let nodes = opener.nodes();
    for dev in &config.devices {
        if !used.contains(dev.name.as_str()) && !nodes.contains_key(&dev.name) {
            tracing::warn!(device = %dev.name, "device is not mapped to any target, not exported over NBD, and no other device uses it; not opened");
        }
    }
    if !issues.is_empty() {
        return Err(ConfigError::new(origin, issues));
    }
    // Pools kept open under running LUNs take new limits too.
    crate::pools::apply_limits(&config.pools);
    let port_groups = ha::pair::port_groups();
    if let Some(groups) = port_groups {
        pair_access::follow_roles(config, groups, &units, &nodes);
    }

    let registry = previous
        .and_then(|p| p.live.registry.clone())
        .unwrap_or_default();
    let mut views = Views {
        config,
        units: &units,
        read_only: HashMap::new(),
        error: None,
        previous: previous.map(|p| &p.live),
        built: HashMap::new(),
        updates: Vec::new(),
    };
    // Counters outlive configuration changes: a LUN that stays keeps counting.
    let stats = previous.map_or_else(stats::Registry::new, |p| p.stats.clone());
    let mut counted_views = HashMap::new();
    let mut targets = Vec::with_capacity(config.targets.len());
    for target in &config.targets {
        let target_stats = stats.target(&target.name);
        let mut counted = |group: &str, view: Arc<scsi::Target>| -> Arc<dyn ScsiTarget> {
            let key = (target.name.to_ascii_lowercase(), group.to_string());
            let wrapper = previous
                .and_then(|p| p.live.counted.get(&key))
                .filter(|(inner, _)| Arc::ptr_eq(inner, &view))
                .map(|(_, wrapper)| wrapper.clone())
                .unwrap_or_else(|| stats::StatsTarget::new(view.clone(), target_stats.clone()));
            counted_views.insert(key, (view, wrapper.clone()));
            wrapper
        };
        let mut access = None;
        let scsi_target = if target.groups.is_empty() {
            let view = counted(
                "",
                views.view(&target.name, "", &target.luns, Some(&registry)),
            );
            if target.chap.is_some() {
                access = Some(export::ScsiAccess {
                    groups: Vec::new(),
                    default_view: Some(view.clone()),
                    chap: target.chap.clone(),
                });
            }
            view
        } else {
            let mut rules = export::ScsiAccess {
                chap: target.chap.clone(),
                ..export::ScsiAccess::default()
            };
            for group in &target.groups {
                // A group's EXTENDED COPY reaches only the LUs it sees.
                let view = counted(
                    &group.name,
                    views.view(&target.name, &group.name, &group.luns, None),
                );
                if group.name == DEFAULT_GROUP {
                    rules.default_view = Some(view);
                    continue;
                }
                rules.groups.push(export::ScsiGroup {
                    name: group.name.clone(),
                    initiators: group.initiators.clone(),
                    view,
                    chap: group.chap.clone(),
                });
            }
            access = Some(rules);
            // Sessions always get a group's view; this one is never used.
            let empty: Arc<dyn ScsiTarget> =
                scsi::Target::new(&target.name, BTreeMap::new(), LuRegistry::new());
            empty
        };
        targets.push(export::ScsiExport {
            name: target.name.clone(),
            alias: target.alias.clone(),
            portals: config.target_portals(target),
            scsi: scsi_target,
            access,
        });
    }
    if let Some((name, e)) = views.error.take() {
        return Err(ConfigError::new(
            origin,
            vec![Issue {
                location: config.device(&name).and_then(|d| d.at),
                field: format!("device `{name}`"),
                reason: format!("cannot create the read-only logical unit: {e}"),
            }],
        ));
    }
    let Views {
        read_only,
        built,
        updates,
        ..
    } = views;

    let units_by_name = units.clone();
    let mut units: Vec<(String, Arc<LogicalUnit>)> = units
        .into_iter()
        .map(|(n, lu)| (n.to_string(), lu))
        .collect();
    units.sort_by(|a, b| a.0.cmp(&b.0));
    let devices: BTreeMap<String, Arc<export::Backing>> = units_by_name
        .iter()
        .map(|(name, lu)| (name.to_string(), lu.backing().clone()))
        .collect();
    // Over the logical unit's backing: an NBD write of a device takes the
    // same range locks and write-cache policy as its LUNs.
    let device_exports = config
        .nbd_exports()
        .filter_map(|e| {
            // A read-only device refuses writes on every transport.
            let device_read_only = config.device(&e.device).is_some_and(|d| d.read_only);
            Some(export::DeviceExport {
                name: e.name.clone(),
                device: e.device.clone(),
                backing: devices.get(&e.device)?.clone(),
                read_only: e.read_only || device_read_only,
                allow: e.allow.clone(),
                description: e.description.clone(),
            })
        })
        .collect();
    Ok(Runtime {
        exports: export::Exports {
            devices,
            scsi_targets: targets,
            discovery_chap: config.discovery_chap.clone(),
            device_exports,
            target_port_group: port_groups.map(|g| g.local),
        },
        listen: config.portals.iter().map(|p| p.listen).collect(),
        stats,
        units,
        live: Live {
            devices: config
                .devices
                .iter()
                .filter_map(|d| {
                    let lu = units_by_name.get(d.name.as_str())?.clone();
                    let device = opened.get(d.name.as_str())?.clone();
                    Some((d.name.clone(), (settings(d), device, lu)))
                })
                .collect(),
            nodes,
            read_only,
            views: built,
            registry: Some(registry),
            counted: counted_views,
        },
        pending: Mutex::new(Some(Pending {
            updates,
            live_changes: opener.live_changes(),
        })),
        pools: config.pools.clone(),
    })
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

/// Builds the SCSI views (LUN maps) of targets and groups.
struct Views<'a> {
    config: &'a Config,
    units: &'a HashMap<&'a str, Arc<LogicalUnit>>,
    /// Read-only logical units over the devices of read-only mappings.
    read_only: HashMap<String, Arc<LogicalUnit>>,
    error: Option<(String, io::Error)>,
    /// What the running configuration has, to reuse.
    previous: Option<&'a Live>,
    /// Views of this configuration.
    built: HashMap<ViewKey, Arc<scsi::Target>>,
    /// Reused views and their new LUN maps, applied on commit.
    updates: Vec<ViewUpdate>,
}

impl Views<'_> {
    /// A SCSI target with `luns`. `shared` is the daemon-wide registry for
    /// EXTENDED COPY; without it, or when a mapping is read-only, the view
    /// gets a registry of its own LUs only, so a copy cannot reach around
    /// the mapping.
    fn view(
        &mut self,
        name: &str,
        group: &str,
        luns: &[Lun],
        shared: Option<&Arc<LuRegistry>>,
    ) -> Arc<scsi::Target> {
        let mut map = BTreeMap::new();
        for l in luns {
            let lu = if l.read_only {
                self.read_only_unit(&l.device)
            } else {
                self.units.get(l.device.as_str()).cloned()
            };
            if let Some(lu) = lu {
                map.insert(l.lun, lu);
            }
        }
        let shared = shared.filter(|_| !luns.iter().any(|l| l.read_only));
        let key = (
            name.to_ascii_lowercase(),
            group.to_string(),
            shared.is_none(),
        );
        if let Some(view) = self.previous.and_then(|p| p.views.get(&key)) {
            self.updates.push((view.clone(), map));
            self.built.insert(key, view.clone());
            return view.clone();
        }
        let registry = shared.cloned().unwrap_or_default();
        let view = scsi::Target::new(name, map, registry);
        self.built.insert(key, view.clone());
        view
    }

    /// The read-only logical unit of `device`: the same device and
    /// identity, refusing writes. It keeps its own reservations.
    fn read_only_unit(&mut self, device: &str) -> Option<Arc<LogicalUnit>> {
        if let Some(lu) = self.read_only.get(device) {
            return Some(lu.clone());
        }
        // Over the same device as before: keep it (and its state).
        if let Some(lu) = self.previous.and_then(|p| p.read_only.get(device)) {
            let same = self.units.get(device).is_some_and(|rw| {
                self.previous
                    .and_then(|p| p.devices.get(device))
                    .is_some_and(|(_, _, was)| Arc::ptr_eq(was, rw))
            });
            if same {
                self.read_only.insert(device.to_string(), lu.clone());
                return Some(lu.clone());
            }
        }
        // The same device as the writable unit, and its locks.
        let backing = self.units.get(device)?.backing().clone();
        let dev = self.config.device(device)?;
        let config = LuConfig {
            read_only: true,
            pr_state_file: None,
            ..lu_config(self.config, dev, &**backing.device())
        };
        match LogicalUnit::over(backing, config) {
            Ok(ro) => {
                self.read_only.insert(device.to_string(), ro.clone());
                Some(ro)
            }
            Err(e) => {
                self.error.get_or_insert((device.to_string(), e));
                None
            }
        }
    }
}

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
