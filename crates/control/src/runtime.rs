//! Builds the live objects a configuration describes: block devices,
//! logical units over them, SCSI targets and the iSCSI targets that carry
//! them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use block::{BlockDevice, FileDevice, FileOptions, MemDevice, NullDevice};
use scsi::{LogicalUnit, LuConfig, LuRegistry};

use crate::error::{ConfigError, Issue};
use crate::model::{Config, Device, DeviceKind};

/// Every iSCSI target of one configuration sits in one portal group.
const PORTAL_GROUP: u16 = 1;

pub struct Runtime {
    pub targets: Vec<iscsi::Target>,
    pub listen: Vec<SocketAddr>,
    pub options: iscsi::ServerOptions,
    /// Every logical unit by device name, to flush them on shutdown.
    units: Vec<(String, Arc<LogicalUnit>)>,
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

    /// The logical units, by the name of the device under each.
    pub fn logical_units(&self) -> impl Iterator<Item = (&str, &Arc<LogicalUnit>)> {
        self.units.iter().map(|(name, lu)| (name.as_str(), lu))
    }
}

fn open_device(dev: &Device) -> io::Result<Arc<dyn BlockDevice>> {
    Ok(match dev.kind {
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
        .flat_map(|t| t.luns.iter().map(|l| l.device.as_str()))
        .collect();
    let mut units: HashMap<&str, Arc<LogicalUnit>> = HashMap::new();
    for (i, dev) in config.devices.iter().enumerate() {
        if !used.contains(dev.name.as_str()) {
            tracing::warn!(device = %dev.name, "device is not mapped to any target; not opened");
            continue;
        }
        let field = if dev.kind == DeviceKind::File {
            format!("device[{i}].path")
        } else {
            format!("device[{i}]")
        };
        let device = match open_device(dev) {
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
        match LogicalUnit::new(device, lu_config(config, dev)) {
            Ok(lu) => {
                units.insert(dev.name.as_str(), lu);
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

    let registry = LuRegistry::new();
    let mut targets = Vec::with_capacity(config.targets.len());
    for target in &config.targets {
        let luns: BTreeMap<u64, Arc<LogicalUnit>> = target
            .luns
            .iter()
            .filter_map(|l| units.get(l.device.as_str()).map(|lu| (l.lun, lu.clone())))
            .collect();
        let scsi_target = scsi::Target::new(&target.name, luns, registry.clone());
        targets.push(iscsi::Target {
            name: target.name.clone(),
            alias: target.alias.clone(),
            portal_group: PORTAL_GROUP,
            portals: config.target_portals(target),
            scsi: scsi_target,
        });
    }

    let mut units: Vec<(String, Arc<LogicalUnit>)> = units
        .into_iter()
        .map(|(n, lu)| (n.to_string(), lu))
        .collect();
    units.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Runtime {
        targets,
        listen: config.portals.iter().map(|p| p.listen).collect(),
        options: iscsi::ServerOptions::default(),
        units,
    })
}
