//! The stages of building a configuration's live objects, over the
//! running ones when there are: the checks that need no device, the
//! pools, the devices and their logical units, the SCSI targets' views,
//! the device exports, and the runtime that holds them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex};

use block::BlockDevice;
use scsi::{LogicalUnit, LuConfig, LuRegistry};
use scsi_api::ScsiTarget;

use super::{
    graph, lu_config, pair_access, settings, CountedView, Live, Opener, Pending, Runtime, ViewKey,
    ViewUpdate,
};
use crate::error::{ConfigError, Issue};
use crate::model::{Config, Lun, DEFAULT_GROUP};

/// The problems found so far, each at its line and field.
#[derive(Default)]
struct Issues(Vec<Issue>);

impl Issues {
    fn fail(&mut self, location: Option<crate::error::Location>, field: String, reason: String) {
        self.0.push(Issue {
            location,
            field,
            reason,
        })
    }
}

/// Logical units and the devices under them, by device name.
struct Units<'a> {
    units: HashMap<&'a str, Arc<LogicalUnit>>,
    /// The devices under the units, for read-only mappings of them.
    opened: HashMap<&'a str, Arc<dyn BlockDevice>>,
}

/// The SCSI side of a build: targets and what the views reuse or keep.
struct Scsi {
    targets: Vec<export::ScsiExport>,
    counted: HashMap<(String, String), CountedView>,
    read_only: HashMap<String, Arc<LogicalUnit>>,
    views: HashMap<ViewKey, Arc<scsi::Target>>,
    updates: Vec<ViewUpdate>,
}

pub(super) fn build_from(
    config: &Config,
    previous: Option<&Runtime>,
) -> Result<Runtime, ConfigError> {
    let mut issues = Issues::default();
    check_basics(config, &mut issues);
    let used = config.mapped_devices();
    let opener = Opener::new(config, previous.map(|p| &p.live.nodes));
    open_pools(config, &opener, &used, &mut issues);
    let units = open_units(config, &opener, previous, &used, &mut issues);
    let nodes = opener.nodes();
    for dev in &config.devices {
        if !used.contains(dev.name.as_str()) && !nodes.contains_key(&dev.name) {
            tracing::warn!(device = %dev.name, "device is not mapped to any target, not exported over NBD, and no other device uses it; not opened");
        }
    }
    if !issues.0.is_empty() {
        return Err(ConfigError::new(config.origin.as_str(), issues.0));
    }
    // Pools kept open under running LUNs take new limits too.
    crate::pools::apply_limits(&config.pools);
    let port_groups = ha::pair::port_groups();
    if let Some(groups) = port_groups {
        pair_access::follow_roles(config, groups, &units.units, &nodes);
    }
    let registry = previous
        .and_then(|p| p.live.registry.clone())
        .unwrap_or_default();
    // Counters outlive configuration changes: a LUN that stays keeps counting.
    let stats = previous.map_or_else(stats::Registry::new, |p| p.stats.clone());
    let scsi = scsi_targets(config, previous, &units.units, &registry, &stats)?;
    let devices: BTreeMap<String, Arc<export::Backing>> = units
        .units
        .iter()
        .map(|(name, lu)| (name.to_string(), lu.backing().clone()))
        .collect();
    let device_exports = device_exports(config, &devices);
    let live_devices = config
        .devices
        .iter()
        .filter_map(|d| {
            let lu = units.units.get(d.name.as_str())?.clone();
            let device = units.opened.get(d.name.as_str())?.clone();
            Some((d.name.clone(), (settings(d), device, lu)))
        })
        .collect();
    let mut sorted: Vec<(String, Arc<LogicalUnit>)> = units
        .units
        .into_iter()
        .map(|(n, lu)| (n.to_string(), lu))
        .collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Runtime {
        exports: export::Exports {
            devices,
            scsi_targets: scsi.targets,
            discovery_chap: config.discovery_chap.clone(),
            device_exports,
            target_port_group: port_groups.map(|g| g.local),
        },
        listen: config.portals.iter().map(|p| p.listen).collect(),
        stats,
        units: sorted,
        live: Live {
            devices: live_devices,
            nodes,
            read_only: scsi.read_only,
            views: scsi.views,
            registry: Some(registry),
            counted: scsi.counted,
        },
        pending: Mutex::new(Some(Pending {
            updates: scsi.updates,
            live_changes: opener.live_changes(),
        })),
        pools: config.pools.clone(),
    })
}

/// What is wrong before any device opens: nowhere to listen, a state
/// directory that cannot be made.
fn check_basics(config: &Config, issues: &mut Issues) {
    if config.portals.is_empty() {
        issues.fail(
            None,
            "portal".into(),
            "no [[portal]] to listen on (add one, or pass --listen)".into(),
        );
    }
    if let Some(dir) = &config.daemon.state_dir {
        if let Err(e) = std::fs::create_dir_all(dir) {
            issues.fail(
                None,
                "daemon.state_dir".into(),
                format!("cannot create {}: {e}", dir.display()),
            );
        }
    }
}

/// Pools open before their volumes, so that their problems are told
/// against the `[[pool]]`; a pool over configured devices opens with the
/// configuration, so those devices (and their faults) are live.
fn open_pools(config: &Config, opener: &Opener, used: &BTreeSet<&str>, issues: &mut Issues) {
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
            Err(e) => issues.fail(p.at, format!("pool[{i}]"), e.to_string()),
        }
    }
}

/// Opens the devices the configuration serves, each with its logical
/// unit: kept from `previous` where the device and its settings stay.
fn open_units<'a>(
    config: &'a Config,
    opener: &Opener,
    previous: Option<&Runtime>,
    used: &BTreeSet<&str>,
    issues: &mut Issues,
) -> Units<'a> {
    let mut units: HashMap<&str, Arc<LogicalUnit>> = HashMap::new();
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
                issues.fail(dev.at, field, e.to_string());
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
            issues.fail(
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
            Err(e) => issues.fail(
                dev.at,
                format!("device[{i}]"),
                format!("cannot create the logical unit: {e}"),
            ),
        }
    }
    Units { units, opened }
}

/// The SCSI view of every target (one per initiator group), counted, with
/// its access rules.
fn scsi_targets(
    config: &Config,
    previous: Option<&Runtime>,
    units: &HashMap<&str, Arc<LogicalUnit>>,
    registry: &Arc<LuRegistry>,
    stats: &Arc<stats::Registry>,
) -> Result<Scsi, ConfigError> {
    let mut views = Views {
        config,
        units,
        read_only: HashMap::new(),
        error: None,
        previous: previous.map(|p| &p.live),
        built: HashMap::new(),
        updates: Vec::new(),
    };
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
                views.view(&target.name, "", &target.luns, Some(registry)),
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
            config.origin.as_str(),
            vec![Issue {
                location: config.device(&name).and_then(|d| d.at),
                field: format!("device `{name}`"),
                reason: format!("cannot create the read-only logical unit: {e}"),
            }],
        ));
    }
    Ok(Scsi {
        targets,
        counted: counted_views,
        read_only: views.read_only,
        views: views.built,
        updates: views.updates,
    })
}

/// The NBD exports, over the logical units' backings: an NBD write of a
/// device takes the same range locks and write-cache policy as its LUNs.
fn device_exports(
    config: &Config,
    devices: &BTreeMap<String, Arc<export::Backing>>,
) -> Vec<export::DeviceExport> {
    config
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
        .collect()
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
