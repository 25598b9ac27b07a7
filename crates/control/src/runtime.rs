//! Builds the live objects a configuration describes: block devices,
//! logical units over them, SCSI targets and the iSCSI targets that carry
//! them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use block::{BlockDevice, FileDevice, FileOptions, MemDevice, NullDevice};
use scsi::{LogicalUnit, LuConfig, LuRegistry};

use crate::error::{ConfigError, Issue};
use crate::model::{Config, Device, DeviceKind, Lun, PoolConfig, DEFAULT_GROUP};
use iscsi::access::{AccessList, Group, InitiatorPattern, SharedAccess, TargetAccess};
use iscsi::auth_chap::ChapAuthenticator;
use scsi_api::ScsiTarget;

/// Every iSCSI target of one configuration sits in one portal group.
const PORTAL_GROUP: u16 = 1;

pub struct Runtime {
    pub targets: Vec<iscsi::Target>,
    pub listen: Vec<SocketAddr>,
    pub options: iscsi::ServerOptions,
    /// Who may use which target, and the CHAP they must pass; replaced on
    /// a live configuration change.
    pub access: Arc<SharedAccess>,
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
        crate::pools::open_pool(p)
    }

    /// The device that serves volume `volume` of pool `pool` as a LUN.
    pub fn exporter_of(&self, pool: &str, volume: &str) -> Option<&str> {
        self.live.devices.iter().find_map(|(name, (dev, _, _))| {
            let exported = dev.kind == DeviceKind::Volume
                && dev.pool.as_deref() == Some(pool)
                && dev.volume.as_deref().unwrap_or(name) == volume;
            exported.then_some(name.as_str())
        })
    }

    /// The logical units, by the name of the device under each.
    pub fn logical_units(&self) -> impl Iterator<Item = (&str, &Arc<LogicalUnit>)> {
        self.units.iter().map(|(name, lu)| (name.as_str(), lu))
    }
}

fn open_device(
    dev: &Device,
    pools: &HashMap<String, Arc<pool::Pool>>,
) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(match dev.kind {
        DeviceKind::Volume => crate::pools::open_volume(pools, dev)?,
        DeviceKind::Mem => Arc::new(MemDevice::new(
            dev.size.unwrap_or(crate::DEFAULT_DEVICE_SIZE),
        )),
        DeviceKind::Null => Arc::new(NullDevice::new(
            dev.size.unwrap_or(crate::DEFAULT_DEVICE_SIZE),
        )),
        DeviceKind::File => {
            let path = dev
                .path
                .as_deref()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no path"))?;
            let opts = FileOptions {
                direct: dev.direct,
                read_only: dev.read_only,
                create_size: dev.size,
            };
            Arc::new(FileDevice::open(path, opts)?)
        }
    })
}

/// The LU settings of a device; identifiers not given are derived from the
/// device name, so they stay the same across restarts.
fn lu_config(config: &Config, dev: &Device) -> LuConfig {
    let naa = dev.naa.unwrap_or_else(|| scsi::naa_from_seed(&dev.name));
    let serial = dev
        .serial
        .clone()
        .unwrap_or_else(|| naa[8..].iter().map(|b| format!("{b:02x}")).collect());
    let defaults = LuConfig::default();
    LuConfig {
        product: dev.product_id.clone().unwrap_or(defaults.product.clone()),
        serial,
        naa,
        block_size: dev.block_size,
        physical_block_exponent: (dev.physical_block_size / dev.block_size).trailing_zeros() as u8,
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

    let used: BTreeSet<&str> = config
        .targets
        .iter()
        .flat_map(|t| {
            t.luns
                .iter()
                .chain(t.groups.iter().flat_map(|g| g.luns.iter()))
                .map(|l| l.device.as_str())
        })
        .collect();
    let reusable = |dev: &Device| {
        previous
            .and_then(|p| p.live.devices.get(&dev.name))
            .filter(|(was, _, _)| *was == settings(dev))
            .map(|(_, device, lu)| (device.clone(), lu.clone()))
    };
    let to_open: BTreeSet<&str> = config
        .devices
        .iter()
        .filter(|d| used.contains(d.name.as_str()) && reusable(d).is_none())
        .map(|d| d.name.as_str())
        .collect();
    let (pools, pool_issues) = crate::pools::open_pools(config, &to_open);
    for issue in pool_issues {
        fail(issue.location, issue.field, issue.reason);
    }
    let mut units: HashMap<&str, Arc<LogicalUnit>> = HashMap::new();
    // The devices under the units, for read-only mappings of them.
    let mut opened: HashMap<&str, Arc<dyn BlockDevice>> = HashMap::new();
    for (i, dev) in config.devices.iter().enumerate() {
        if !used.contains(dev.name.as_str()) {
            tracing::warn!(device = %dev.name, "device is not mapped to any target; not opened");
            continue;
        }
        if let Some((device, lu)) = reusable(dev) {
            units.insert(dev.name.as_str(), lu);
            opened.insert(dev.name.as_str(), device);
            continue;
        }
        let field = if dev.kind == DeviceKind::File {
            format!("device[{i}].path")
        } else {
            format!("device[{i}]")
        };
        let device = match open_device(dev, &pools) {
            Ok(d) => d,
            Err(e) => {
                fail(dev.at, field, e.to_string());
                continue;
            }
        };
        let size = device.size();
        if size < dev.block_size as u64 {
            fail(
                dev.at,
                field,
                format!(
                    "{size} bytes is less than one {}-byte block",
                    dev.block_size
                ),
            );
            continue;
        }
        if size % dev.block_size as u64 != 0 {
            tracing::warn!(device = %dev.name, size, block_size = dev.block_size, "size is not a whole number of blocks; the tail is not used");
        }
        tracing::info!(device = %dev.name, backing = %device.describe(), size, "opened device");
        match LogicalUnit::new(device.clone(), lu_config(config, dev)) {
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
    if !issues.is_empty() {
        return Err(ConfigError::new(origin, issues));
    }

    let registry = previous
        .and_then(|p| p.live.registry.clone())
        .unwrap_or_default();
    let mut views = Views {
        config,
        units: &units,
        devices: &opened,
        read_only: HashMap::new(),
        error: None,
        previous: previous.map(|p| &p.live),
        built: HashMap::new(),
        updates: Vec::new(),
    };
    let mut access = AccessList::new();
    access.discovery_chap = config.discovery_chap.clone();
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
        let scsi_target = if target.groups.is_empty() {
            let view = counted(
                "",
                views.view(&target.name, "", &target.luns, Some(&registry)),
            );
            if target.chap.is_some() {
                access.set_target(
                    &target.name,
                    TargetAccess {
                        groups: Vec::new(),
                        default_view: Some(view.clone()),
                        chap: target.chap.clone(),
                    },
                );
            }
            view
        } else {
            let mut rules = TargetAccess {
                chap: target.chap.clone(),
                ..TargetAccess::default()
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
                rules.groups.push(Group {
                    name: group.name.clone(),
                    members: group
                        .initiators
                        .iter()
                        .map(|i| InitiatorPattern::new(i))
                        .collect(),
                    view,
                    chap: group.chap.clone(),
                });
            }
            access.set_target(&target.name, rules);
            // Sessions always get a group's view; this one is never used.
            let empty: Arc<dyn ScsiTarget> =
                scsi::Target::new(&target.name, BTreeMap::new(), LuRegistry::new());
            empty
        };
        targets.push(iscsi::Target {
            name: target.name.clone(),
            alias: target.alias.clone(),
            portal_group: PORTAL_GROUP,
            portals: config.target_portals(target),
            scsi: scsi_target,
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
    // A change keeps the server's access handle and replaces its rules
    // on commit; a first build starts with them.
    let (shared_access, pending_access) = match previous {
        Some(p) => (p.access.clone(), Some(access)),
        None => (SharedAccess::new(access), None),
    };
    let access = shared_access;
    let Views {
        read_only,
        built,
        updates,
        ..
    } = views;
    let defaults = iscsi::ServerOptions::default();
    let options = iscsi::ServerOptions {
        authenticator: Arc::new(ChapAuthenticator::new(access.clone())),
        access: access.clone(),
        max_sessions_per_initiator: config
            .daemon
            .max_sessions_per_initiator
            .unwrap_or(defaults.max_sessions_per_initiator),
        max_connections_per_portal: config
            .daemon
            .max_connections_per_portal
            .unwrap_or(defaults.max_connections_per_portal),
        auth_throttle: Arc::new(iscsi::AuthThrottle::new(
            config
                .daemon
                .auth_fail_delay
                .unwrap_or(iscsi::AuthThrottle::DEFAULT_DELAY),
            config
                .daemon
                .auth_fail_delay_max
                .unwrap_or(iscsi::AuthThrottle::DEFAULT_DELAY_MAX),
            stats.auth_failures_counter(),
        )),
        ..defaults
    };

    let units_by_name = units.clone();
    let mut units: Vec<(String, Arc<LogicalUnit>)> = units
        .into_iter()
        .map(|(n, lu)| (n.to_string(), lu))
        .collect();
    units.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Runtime {
        targets,
        listen: config.portals.iter().map(|p| p.listen).collect(),
        options,
        access,
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
            read_only,
            views: built,
            registry: Some(registry),
            counted: counted_views,
        },
        pending: Mutex::new(Some(Pending {
            updates,
            access: pending_access,
        })),
        pools: config.pools.clone(),
    })
}

/// Changes to live objects that wait for [`Runtime::commit`].
struct Pending {
    /// Existing views and their new LUN maps.
    updates: Vec<ViewUpdate>,
    /// New rules for the server's access handle.
    access: Option<AccessList>,
}

impl Runtime {
    /// Makes a rebuilt runtime live: existing views get their new LUN maps,
    /// views `previous` had and this runtime dropped lose every LUN, and the
    /// access rules are replaced. The caller then hands `targets` to the
    /// server. Committing twice does nothing.
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
        if let Some(list) = pending.access {
            self.access.replace(list);
        }
    }
}

/// Builds the SCSI views (LUN maps) of targets and groups.
struct Views<'a> {
    config: &'a Config,
    units: &'a HashMap<&'a str, Arc<LogicalUnit>>,
    devices: &'a HashMap<&'a str, Arc<dyn BlockDevice>>,
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
        let block = self.devices.get(device)?.clone();
        let dev = self.config.device(device)?;
        let config = LuConfig {
            read_only: true,
            pr_state_file: None,
            ..lu_config(self.config, dev)
        };
        match LogicalUnit::new(block, config) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{default_config, parse_config};

    /// The I_T nexus of `initiator` on `target` through portal group 1.
    fn nexus_of(initiator: &str, target: &str) -> scsi_api::Nexus {
        scsi_api::Nexus {
            initiator_name: initiator.into(),
            isid: [0; 6],
            target_name: target.into(),
            relative_port: 1,
            portal_group: 1,
        }
    }

    #[test]
    fn builds_the_default_configuration() {
        let runtime = build(&default_config()).unwrap();
        assert_eq!(runtime.listen, vec!["127.0.0.1:3260".parse().unwrap()]);
        assert_eq!(runtime.targets.len(), 1);
        let t = &runtime.targets[0];
        assert_eq!(t.name, "iqn.2026-11.org.openarray:default");
        assert_eq!(t.portals, runtime.listen);
        assert_eq!(t.portal_group, PORTAL_GROUP);
        let units: Vec<_> = runtime.logical_units().collect();
        assert_eq!(units.len(), 1);
        let lu = units[0].1.config();
        assert_eq!(lu.block_size, 512);
        assert_eq!(lu.naa, scsi::naa_from_seed("mem0"));
        assert_eq!(lu.serial.len(), 16);
        runtime.flush_all().unwrap();
    }

    #[test]
    fn shares_one_logical_unit_between_targets_and_keeps_settings() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
[daemon]
state_dir = "{state}"

[[portal]]
listen = "127.0.0.1:3260"
[[portal]]
listen = "[::1]:3260"

[[device]]
name = "img"
kind = "file"
path = "{image}"
size = "4M"
block_size = 4096
product_id = "FILE-LUN"
serial = "SER123"
naa = "6001405a1b2c3d4e5f60718293a4b5c6"
write_cache = false

[[device]]
name = "unused"
kind = "file"
path = "{unused}"
size = "4M"

[[target]]
name = "iqn.2026-11.org.example:a"
portals = ["[::1]:3260"]
[[target.lun]]
lun = 201
device = "img"

[[target]]
name = "iqn.2026-11.org.example:b"
alias = "second"
[[target.lun]]
lun = 0
device = "img"
"#,
            state = dir.path().join("state").display(),
            image = dir.path().join("img.raw").display(),
            unused = dir.path().join("unused.raw").display(),
        );
        let config = parse_config(&text, "t.toml").unwrap();
        let runtime = build(&config).unwrap();
        assert!(dir.path().join("state").is_dir());
        assert_eq!(
            std::fs::metadata(dir.path().join("img.raw")).unwrap().len(),
            4 << 20
        );
        // Devices no target uses are not opened (nor created).
        assert!(!dir.path().join("unused.raw").exists());
        let units: Vec<_> = runtime.logical_units().collect();
        assert_eq!(units.len(), 1);
        let lu = units[0].1.config();
        assert_eq!(lu.product, "FILE-LUN");
        assert_eq!(lu.serial, "SER123");
        assert_eq!(lu.naa[0], 0x60);
        assert_eq!(lu.block_size, 4096);
        assert!(!lu.write_cache);
        assert_eq!(
            lu.pr_state_file,
            Some(dir.path().join("state").join("img.pr"))
        );
        assert_eq!(
            runtime.targets[0].portals,
            vec!["[::1]:3260".parse().unwrap()]
        );
        assert_eq!(runtime.targets[1].portals.len(), 2);
        assert_eq!(runtime.targets[1].alias.as_deref(), Some("second"));
        runtime.flush_all().unwrap();
    }

    #[test]
    fn groups_become_views_and_access_rules() {
        use iscsi::access::{AccessPolicy, Admission};
        use iscsi::auth_chap::ChapPolicy;
        use scsi_api::{ScsiCommand, TaskAttr};

        let text = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:open"
[[target.lun]]
lun = 0
device = "d"
[[target]]
name = "iqn.2026-11.org.example:guarded"
chap = { user = "u", secret = "twelve-bytes" }
[[target.group]]
name = "hosts"
initiators = ["iqn.2026-11.org.example:host*"]
[[target.group.lun]]
lun = 201
device = "d"
read_only = true
[[target.group]]
name = "default"
[[target.group.lun]]
lun = 5
device = "d"
"#;
        let runtime = build(&parse_config(text, "t.toml").unwrap()).unwrap();
        let access = runtime.access.current();
        assert!(matches!(
            access.admit("iqn.any", "iqn.2026-11.org.example:open"),
            Admission::Open
        ));
        assert!(access
            .chap_for("iqn.any", Some("iqn.2026-11.org.example:open"))
            .is_none());
        assert!(access.chap_for("iqn.any", None).is_none());
        let guarded = "iqn.2026-11.org.example:guarded";
        assert_eq!(
            access
                .chap_for("iqn.any", Some(guarded))
                .unwrap()
                .initiator
                .user,
            "u"
        );
        let Admission::View(host) = access.admit("iqn.2026-11.org.example:host1", guarded) else {
            panic!("hosts are admitted")
        };
        let Admission::View(other) = access.admit("iqn.2026-11.org.example:other", guarded) else {
            panic!("the default group admits the rest")
        };
        let nexus = nexus_of("iqn.2026-11.org.example:host1", guarded);
        assert!(host.lun_exists(&nexus, 201));
        assert!(!host.lun_exists(&nexus, 5));
        assert!(other.lun_exists(&nexus, 5));
        // WRITE(10) of one block through the read-only mapping.
        let cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        let data = vec![0u8; 512];
        let cmd = ScsiCommand {
            lun: 201,
            cdb: &cdb,
            data_out: &data,
            data_in_len: 0,
            data_out_len: 512,
            task_attr: TaskAttr::Simple,
            tag: 1,
            zero_copy: false,
            data_out_parts: &[],
        };
        host.nexus_added(&nexus);
        // The first command reports the power-on unit attention.
        let mut r = host.execute(&nexus, &cmd);
        if r.sense.get(2).is_some_and(|k| k & 0x0f == 0x06) {
            r = host.execute(&nexus, &cmd);
        }
        assert_eq!(r.status, 0x02);
        // DATA PROTECT, WRITE PROTECTED.
        assert_eq!(r.sense[2] & 0x0f, 0x07);
        assert_eq!((r.sense[12], r.sense[13]), (0x27, 0x00));
    }

    #[test]
    fn rebuild_keeps_units_and_views_and_commits_at_once() {
        use iscsi::access::{AccessPolicy, Admission};

        let base = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d0"
kind = "mem"
size = "1M"
[[device]]
name = "d1"
kind = "mem"
size = "1M"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.group]]
name = "esx"
initiators = ["iqn.2026-11.org.example:esx"]
[[target.group.lun]]
lun = 201
device = "d0"
[[target.group]]
name = "old"
initiators = ["iqn.2026-11.org.example:old"]
[[target.group.lun]]
lun = 0
device = "d1"
"#;
        let t = "iqn.2026-11.org.example:t";
        let view_of = |r: &Runtime, i: &str| match r.access.admit(i, t) {
            Admission::View(v) => Some(v),
            _ => None,
        };
        let first = build(&parse_config(base, "t.toml").unwrap()).unwrap();
        let esx = view_of(&first, "iqn.2026-11.org.example:esx").unwrap();
        let old = view_of(&first, "iqn.2026-11.org.example:old").unwrap();
        let nexus = nexus_of("iqn.2026-11.org.example:esx", t);

        let changed = base
            .replace(
                "lun = 201\ndevice = \"d0\"",
                "lun = 201\ndevice = \"d0\"\n[[target.group.lun]]\nlun = 5\ndevice = \"d1\"",
            )
            .replace(
                "name = \"old\"\ninitiators = [\"iqn.2026-11.org.example:old\"]",
                "name = \"new\"\ninitiators = [\"iqn.2026-11.org.example:new\"]",
            );
        let second = rebuild(&parse_config(&changed, "t.toml").unwrap(), &first).unwrap();
        // Nothing is live before the commit.
        assert!(!esx.lun_exists(&nexus, 5));
        assert!(view_of(&first, "iqn.2026-11.org.example:new").is_none());
        second.commit(Some(&first));
        assert!(esx.lun_exists(&nexus, 5) && esx.lun_exists(&nexus, 201));
        // The same view object, so live sessions see the new map.
        let again = view_of(&second, "iqn.2026-11.org.example:esx").unwrap();
        assert!(Arc::ptr_eq(&again, &esx));
        // Units whose settings stayed are the same logical units.
        let units = |r: &Runtime| -> Vec<Arc<LogicalUnit>> {
            r.logical_units().map(|(_, lu)| lu.clone()).collect()
        };
        assert!(units(&first)
            .iter()
            .zip(units(&second).iter())
            .all(|(a, b)| Arc::ptr_eq(a, b)));
        // A dropped group's view loses its LUNs; the new group is admitted.
        assert!(!old.lun_exists(&nexus, 0));
        assert!(view_of(&second, "iqn.2026-11.org.example:old").is_none());
        assert!(view_of(&second, "iqn.2026-11.org.example:new").is_some());
    }

    #[test]
    fn device_open_failures_name_the_field() {
        let text = r#"
[[portal]]
listen = "127.0.0.1:3260"
[[device]]
name = "d"
kind = "file"
path = "/nonexistent/dir/disk.img"
[[target]]
name = "iqn.2026-11.org.example:a"
[[target.lun]]
lun = 0
device = "d"
"#;
        let err = build(&parse_config(text, "t.toml").unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.starts_with("t.toml:4:1: device[0].path: cannot open /nonexistent/dir/disk.img"),
            "{err}"
        );
    }

    #[test]
    fn no_portal_is_a_build_error() {
        let mut config = default_config();
        config.portals.clear();
        let err = build(&config).err().unwrap().to_string();
        assert!(err.contains("portal: no [[portal]] to listen on"), "{err}");
    }

    #[test]
    fn pools_are_reached_by_name_and_exported_volumes_are_known() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!(
            r#"
[[portal]]
listen = "127.0.0.1:3260"
[[pool]]
name = "tank"
devices = ["{d}/tank0.img"]
device_size = "8M"
[[pool]]
name = "spare"
devices = ["{d}/spare0.img"]
device_size = "8M"
[[device]]
name = "lun0"
kind = "volume"
pool = "tank"
volume = "vm1"
size = "1G"
[[target]]
name = "iqn.2026-11.org.example:t"
[[target.lun]]
lun = 0
device = "lun0"
"#,
            d = dir.path().display()
        );
        let runtime = build(&parse_config(&text, "t.toml").unwrap()).unwrap();
        let names: Vec<&str> = runtime
            .pool_configs()
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["tank", "spare"]);
        let tank = runtime.pool("tank").unwrap();
        // The pool under the LUN, not a second opener of its metadata.
        assert!(Arc::ptr_eq(&tank, &runtime.pool("tank").unwrap()));
        assert!(tank.volume_info("vm1").is_ok());
        assert_eq!(runtime.exporter_of("tank", "vm1"), Some("lun0"));
        assert_eq!(runtime.exporter_of("tank", "lun0"), None);
        assert_eq!(runtime.exporter_of("spare", "vm1"), None);
        // A pool no LUN uses is created on first use.
        assert_eq!(runtime.pool("spare").unwrap().volumes().len(), 0);
        assert!(dir.path().join("spare0.img.meta").exists());
        let err = runtime.pool("none").err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
