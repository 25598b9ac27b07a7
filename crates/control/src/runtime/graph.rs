//! Opens the device graph: each device after the devices it is built on,
//! pools before their volumes, reusing what a running configuration has
//! open when nothing under it changed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use block::BlockDevice;
use pool::Pool;

use crate::kinds::{OpenContext, Spec};
use crate::model::{Config, Device};

/// A device open in the running configuration, with the settings it was
/// opened with.
#[derive(Clone)]
pub(crate) struct OpenNode {
    pub settings: Device,
    pub device: Arc<dyn BlockDevice>,
}

/// An open device, and whether it is the running configuration's.
type Opened = (Arc<dyn BlockDevice>, bool);

/// Opens devices of `config` on demand, each once.
pub(crate) struct Opener<'a> {
    config: &'a Config,
    /// What the running configuration has open, to reuse.
    previous: Option<&'a HashMap<String, OpenNode>>,
    /// Opened (or reused) so far, and whether it was reused.
    opened: RefCell<HashMap<String, Opened>>,
    pools: RefCell<HashMap<String, Arc<Pool>>>,
    /// Devices being opened, to stop at a loop.
    opening: RefCell<Vec<String>>,
    /// Open devices kept with settings they take in place, applied when
    /// the configuration goes live.
    live_changes: RefCell<Vec<LiveChange>>,
}

/// An open device kept with new settings it takes in place.
pub(crate) struct LiveChange {
    pub name: String,
    pub spec: Spec,
    pub device: Arc<dyn BlockDevice>,
    /// Devices it is built on now and was not before, open.
    pub gained: Vec<crate::kinds::Named>,
}

impl<'a> Opener<'a> {
    pub fn new(config: &'a Config, previous: Option<&'a HashMap<String, OpenNode>>) -> Self {
        Opener {
            config,
            previous,
            opened: RefCell::default(),
            pools: RefCell::default(),
            opening: RefCell::default(),
            live_changes: RefCell::default(),
        }
    }

    /// Device `name`, open, and whether it is the one the running
    /// configuration had (its settings and everything under it the same).
    pub fn open(&self, name: &str) -> io::Result<Opened> {
        if let Some(done) = self.opened.borrow().get(name) {
            return Ok(done.clone());
        }
        let dev = self.config.device(name).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("no device `{name}`"))
        })?;
        if self.opening.borrow().iter().any(|n| n == name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device `{name}` is built on itself"),
            ));
        }
        self.opening.borrow_mut().push(name.to_string());
        let result = self.open_fresh_or_reuse(dev);
        self.opening.borrow_mut().retain(|n| n != name);
        let done = result?;
        self.opened
            .borrow_mut()
            .insert(name.to_string(), done.clone());
        Ok(done)
    }

    fn open_fresh_or_reuse(&self, dev: &Device) -> io::Result<Opened> {
        let mut children = Vec::new();
        let mut fresh = Vec::new();
        for child in dev.spec.children() {
            let (device, reused) = self
                .open(child)
                .map_err(|e| io::Error::new(e.kind(), format!("device `{child}`: {e}")))?;
            if !reused {
                fresh.push((device.clone(), child.to_string()));
            }
            children.push(device);
        }
        if let Some(node) = self.previous.and_then(|p| p.get(&dev.name)) {
            // A kept device may gain devices it takes in place (a RAID's
            // new spare); one it was built on that changed is another
            // device under it, and it opens anew.
            let had = node.settings.spec.children();
            let gained_only = fresh.iter().all(|(_, n)| !had.contains(&n.as_str()));
            if gained_only && keeps_device(&node.settings, dev) {
                if node.settings.spec != dev.spec {
                    self.live_changes.borrow_mut().push(LiveChange {
                        name: dev.name.clone(),
                        spec: dev.spec.clone(),
                        device: node.device.clone(),
                        gained: fresh,
                    });
                }
                return Ok((node.device.clone(), true));
            }
        }
        let pools = |name: &str| self.pool(name);
        let ctx = OpenContext::new(&dev.name, dev.read_only, children, &pools);
        Ok((dev.spec.open(&ctx)?, false))
    }

    /// Pool `name`, opened (or created) over its data devices.
    pub fn pool(&self, name: &str) -> io::Result<Arc<Pool>> {
        if let Some(pool) = self.pools.borrow().get(name) {
            return Ok(pool.clone());
        }
        let p = self
            .config
            .pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("no pool named {name}"))
            })?;
        // The configured data devices open first, so that they are live
        // (and their faults reachable) even when the pool is open already.
        let mut members = HashMap::new();
        for m in p.member_devices() {
            let (device, reused) = self.open(m)?;
            if !reused && crate::pools::is_open(p) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "pool `{name}` is open over device `{m}`, whose settings changed: \
                         stop serving the pool's volumes first"
                    ),
                ));
            }
            members.insert(m.to_string(), device);
        }
        let member = |m: &str| {
            members
                .get(m)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no device `{m}`")))
        };
        let pool = crate::pools::open_pool_with(p, &member)?;
        self.pools
            .borrow_mut()
            .insert(name.to_string(), pool.clone());
        Ok(pool)
    }

    /// The settings kept devices take in place.
    pub fn live_changes(&self) -> Vec<LiveChange> {
        self.live_changes.take()
    }

    /// Every device opened so far, with the settings it was opened with.
    pub fn nodes(&self) -> HashMap<String, OpenNode> {
        self.opened
            .borrow()
            .iter()
            .filter_map(|(name, (device, _))| {
                let settings = self.config.device(name)?;
                Some((
                    name.clone(),
                    OpenNode {
                        settings: Device {
                            at: None,
                            ..settings.clone()
                        },
                        device: device.clone(),
                    },
                ))
            })
            .collect()
    }
}

/// Whether a device open with `old`'s settings serves `new` as it is: the
/// same kind and settings (or settings it takes in place), a block size
/// that is not its data, and write access when `new` needs it.
pub(crate) fn keeps_device(old: &Device, new: &Device) -> bool {
    let spec = &old.spec;
    let block_size_kept =
        !spec.block_size_is_data() || old.identity.block_size == new.identity.block_size;
    let needs_write = spec.opened_read_only(old.read_only) && !new.read_only;
    same_or_live(spec, &new.spec) && block_size_kept && !needs_write
}

/// Whether `old` and `new` are the same settings but for some the open
/// device takes in place.
pub(crate) fn same_or_live(old: &Spec, new: &Spec) -> bool {
    *old == *new || old.applies_live(&**new)
}

/// Whether a logical unit over a device with `old`'s settings serves `new`
/// as it is: everything the same but device settings taken in place.
pub(crate) fn keeps_unit(old: &Device, new: &Device) -> bool {
    same_or_live(&old.spec, &new.spec)
        && Device {
            spec: new.spec.clone(),
            ..old.clone()
        } == *new
}

/// The names of `nodes`, each before the devices it is built on.
pub(crate) fn parents_first(nodes: &HashMap<String, OpenNode>) -> Vec<String> {
    fn visit(name: &str, nodes: &HashMap<String, OpenNode>, done: &mut Vec<String>, depth: usize) {
        if done.iter().any(|n| n == name) || depth > 64 {
            return;
        }
        let Some(node) = nodes.get(name) else {
            return;
        };
        for child in node.settings.spec.children() {
            visit(child, nodes, done, depth + 1);
        }
        done.push(name.to_string());
    }
    let mut names: Vec<&String> = nodes.keys().collect();
    names.sort();
    let mut children_first = Vec::new();
    for name in names {
        visit(name, nodes, &mut children_first, 0);
    }
    children_first.reverse();
    children_first
}
