//! A pool: its devices, its metadata store, and the operations on volumes
//! (create, snapshot, clone, rollback, promote, delete, resize). Every such
//! operation is committed before it returns.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use block::BlockDevice;
use parking_lot::{Mutex, RwLock};

use crate::layout::{Layout, Superblock};
use crate::record::{VolumeInfo, VolumeKind, VolumeRecord};
use crate::sending::SendHolds;
use crate::space::Space;
use crate::store::{Delta, PoolMeta, Store};
use crate::unit_map::UnitMap;
use crate::usage::Limits;
use crate::volume::VolumeDevice;

mod volumes;

/// Allocation unit used when the creator names none.
pub const DEFAULT_UNIT_SIZE: u64 = 64 * 1024;
const MIN_UNIT_SIZE: u64 = 4096;
const MAX_UNIT_SIZE: u64 = 64 << 20;

/// Where the metadata store lives.
#[derive(Clone)]
pub enum MetadataLocation {
    /// A redb file, usually beside the data devices.
    File(PathBuf),
    /// A block device of its own.
    Device(Arc<dyn BlockDevice>),
}

/// Space of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSpace {
    pub unit_size: u64,
    pub total_units: u64,
    pub used_units: u64,
    /// Units freed since the last commit, reusable after it, and freed
    /// units whose pages still wait to be sent (sending.rs).
    pub held_units: u64,
    pub free_units: u64,
}

impl PoolSpace {
    pub fn size(&self) -> u64 {
        self.total_units * self.unit_size
    }
    pub fn used(&self) -> u64 {
        self.used_units * self.unit_size
    }
    pub fn free(&self) -> u64 {
        self.free_units * self.unit_size
    }
}

pub(crate) struct VolumeState {
    pub record: VolumeRecord,
    pub map: UnitMap,
}

/// Changes not yet committed.
#[derive(Default)]
pub(crate) struct Dirty {
    maps: BTreeMap<(u64, u64), Option<u64>>,
    refs: BTreeSet<u64>,
    volumes: BTreeMap<u64, Option<VolumeRecord>>,
    freed: Vec<u64>,
}

pub(crate) struct State {
    pub volumes: BTreeMap<u64, VolumeState>,
    pub next_volume_id: u64,
    pub space: Space,
    pub dirty: Dirty,
    pub limits: Limits,
}

impl State {
    /// Points `vunit` of volume `id` at `unit` (or nowhere), keeping counts.
    pub fn set_mapping(&mut self, id: u64, vunit: u64, unit: Option<u64>) {
        let Some(vol) = self.volumes.get_mut(&id) else {
            return;
        };
        let old = match unit {
            Some(u) => vol.map.insert(vunit, u),
            None => vol.map.remove(&vunit),
        };
        if old == unit {
            return;
        }
        if let Some(u) = unit {
            if self.space.increment(u) {
                self.limits.rose_to(self.space.used());
            }
            self.dirty.refs.insert(u);
        }
        if let Some(o) = old {
            if self.space.decrement(o) {
                self.dirty.freed.push(o);
            }
            self.dirty.refs.insert(o);
        }
        self.dirty.maps.insert((id, vunit), unit);
    }

    pub(crate) fn put_record(&mut self, id: u64, record: VolumeRecord) {
        self.dirty.volumes.insert(id, Some(record.clone()));
        match self.volumes.get_mut(&id) {
            Some(v) => v.record = record,
            None => {
                self.volumes.insert(
                    id,
                    VolumeState {
                        record,
                        map: UnitMap::default(),
                    },
                );
            }
        }
    }

    pub(crate) fn id_of(&self, name: &str) -> io::Result<u64> {
        self.volumes
            .iter()
            .find(|(_, v)| v.record.name == name)
            .map(|(&id, _)| id)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("no volume named {name}"))
            })
    }

    fn name_free(&self, name: &str) -> io::Result<()> {
        if name.is_empty() || name.len() > 200 {
            return Err(invalid("a volume name has 1 to 200 bytes"));
        }
        if self.volumes.values().any(|v| v.record.name == name) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a volume named {name} exists"),
            ));
        }
        Ok(())
    }

    fn new_id(&mut self) -> u64 {
        let id = self.next_volume_id;
        self.next_volume_id += 1;
        id
    }

    /// A new volume sharing every unit of `source`.
    fn copy_volume(&mut self, source: u64, id: u64, record: VolumeRecord) {
        let map: Vec<(u64, u64)> = self.volumes[&source].map.iter().collect();
        self.put_record(id, record);
        for (vunit, unit) in map {
            self.set_mapping(id, vunit, Some(unit));
        }
    }

    /// Make `vol` map exactly what `snap` maps.
    fn map_as(&mut self, vol: u64, snap: u64) {
        let old: Vec<u64> = self.volumes[&vol].map.keys().collect();
        let new: Vec<(u64, u64)> = self.volumes[&snap].map.iter().collect();
        // Take the snapshot's references first so shared units never pass
        // through zero.
        for &(vunit, unit) in &new {
            self.set_mapping(vol, vunit, Some(unit));
        }
        let keep: BTreeSet<u64> = new.iter().map(|&(v, _)| v).collect();
        for vunit in old {
            if !keep.contains(&vunit) {
                self.set_mapping(vol, vunit, None);
            }
        }
    }

    fn take_delta(&mut self) -> Delta {
        let dirty = std::mem::take(&mut self.dirty);
        Delta {
            refs: dirty
                .refs
                .iter()
                .map(|&u| (u, self.space.count(u)))
                .collect(),
            maps: dirty.maps,
            volumes: dirty.volumes,
            next_volume_id: self.next_volume_id,
            freed: dirty.freed,
        }
    }

    /// Puts back a delta whose commit failed, under any newer changes.
    fn restore_delta(&mut self, delta: Delta) {
        for (k, v) in delta.maps {
            self.dirty.maps.entry(k).or_insert(v);
        }
        for (id, rec) in delta.volumes {
            // A volume deleted since keeps its deletion.
            self.dirty.volumes.entry(id).or_insert(rec);
        }
        self.dirty.refs.extend(delta.refs.keys());
        self.dirty.freed.extend(delta.freed);
    }

    fn info_of(&self, id: u64) -> io::Result<VolumeInfo> {
        self.info(id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no volume {id}")))
    }

    pub fn info(&self, id: u64) -> Option<VolumeInfo> {
        let v = self.volumes.get(&id)?;
        Some(VolumeInfo {
            id,
            name: v.record.name.clone(),
            kind: v.record.kind,
            size: v.record.size,
            parent: v
                .record
                .parent
                .and_then(|p| self.volumes.get(&p))
                .map(|p| p.record.name.clone()),
            mapped_units: v.map.len() as u64,
            exclusive_units: v.map.values().filter(|&u| self.space.count(u) == 1).count() as u64,
        })
    }
}

fn invalid(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.to_string())
}

/// A pool of allocation units over data devices, holding thin volumes.
pub struct Pool {
    name: String,
    pub(crate) layout: Layout,
    store: Store,
    pub(crate) state: RwLock<State>,
    /// Serialises commits, so deltas reach the store in the order taken.
    commit_lock: Mutex<()>,
    /// Whether I/O may wait on storage: a data device or the metadata
    /// store does. A pool wholly in memory runs its volumes' commands on
    /// the caller's thread, like a file on tmpfs.
    may_block: bool,
    /// Units whose pages wait to be sent, kept from reuse meanwhile.
    pub(crate) send_holds: SendHolds,
    /// Writes refused because no unit was free, logged now and then.
    pub(crate) allocation_failures: peer_limits::EventLog,
}

/// Whether the metadata store may wait on storage: a file on a file
/// system other than tmpfs or ramfs, or a device that may block.
fn metadata_may_block(metadata: &MetadataLocation) -> bool {
    match metadata {
        MetadataLocation::Device(dev) => dev.capabilities().may_block,
        MetadataLocation::File(path) => !block::on_memory_file_system(path),
    }
}

fn new_pool_id() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let stack = &nanos as *const u128 as usize as u128;
    nanos ^ ((std::process::id() as u128) << 96) ^ (stack << 32)
}

impl Pool {
    /// Formats `devices` as a new pool with `unit_size`-byte allocation
    /// units and creates its metadata store.
    pub fn create(
        name: &str,
        devices: Vec<Arc<dyn BlockDevice>>,
        metadata: &MetadataLocation,
        unit_size: u64,
    ) -> io::Result<Arc<Pool>> {
        if !unit_size.is_power_of_two() || !(MIN_UNIT_SIZE..=MAX_UNIT_SIZE).contains(&unit_size) {
            return Err(invalid(
                "the allocation unit is a power of two from 4 KiB to 64 MiB",
            ));
        }
        if devices.is_empty() {
            return Err(invalid("a pool needs at least one data device"));
        }
        let store = match metadata {
            MetadataLocation::File(path) => {
                if path.exists() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("pool metadata {} exists", path.display()),
                    ));
                }
                Store::create_file(path)?
            }
            MetadataLocation::Device(dev) => Store::on_device(dev.clone())?,
        };
        if store.is_initialised()? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the metadata device already holds a pool",
            ));
        }
        let pool_id = new_pool_id();
        let mut units = Vec::new();
        for (i, dev) in devices.iter().enumerate() {
            if dev.capabilities().read_only {
                return Err(invalid("a pool data device must be writable"));
            }
            let n = Layout::units_for(dev.size(), unit_size);
            if n == 0 {
                return Err(invalid(&format!(
                    "data device {} is smaller than two allocation units",
                    dev.describe()
                )));
            }
            let sb = Superblock {
                pool_id,
                unit_size,
                index: i as u32,
                device_count: devices.len() as u32,
                units: n,
            };
            let mut first = vec![0u8; MIN_UNIT_SIZE as usize];
            let bytes = sb.encode();
            first[..bytes.len()].copy_from_slice(&bytes);
            dev.write_at(&first, 0, true)?;
            units.push(n);
        }
        store.initialise(&PoolMeta {
            pool_id,
            unit_size,
            devices: units,
        })?;
        Pool::assemble(name, devices, store, metadata_may_block(metadata))
    }

    /// Opens an existing pool; `devices` come in the order they were
    /// created with.
    pub fn open(
        name: &str,
        devices: Vec<Arc<dyn BlockDevice>>,
        metadata: &MetadataLocation,
    ) -> io::Result<Arc<Pool>> {
        let store = match metadata {
            MetadataLocation::File(path) => Store::open_file(path)?,
            MetadataLocation::Device(dev) => Store::on_device(dev.clone())?,
        };
        Pool::assemble(name, devices, store, metadata_may_block(metadata))
    }

    /// Opens the pool if its metadata exists, creates it otherwise.
    pub fn open_or_create(
        name: &str,
        devices: Vec<Arc<dyn BlockDevice>>,
        metadata: &MetadataLocation,
        unit_size: u64,
    ) -> io::Result<Arc<Pool>> {
        let exists = match metadata {
            MetadataLocation::File(path) => path.exists(),
            MetadataLocation::Device(dev) => Store::on_device(dev.clone())?.is_initialised()?,
        };
        if exists {
            Pool::open(name, devices, metadata)
        } else {
            Pool::create(name, devices, metadata, unit_size)
        }
    }

    fn assemble(
        name: &str,
        devices: Vec<Arc<dyn BlockDevice>>,
        store: Store,
        metadata_may_block: bool,
    ) -> io::Result<Arc<Pool>> {
        let loaded = store.load()?;
        let meta = &loaded.meta;
        if devices.len() != meta.devices.len() {
            return Err(invalid(&format!(
                "pool {name} has {} data devices, {} given",
                meta.devices.len(),
                devices.len()
            )));
        }
        let mut slots = Vec::new();
        for (i, (dev, &units)) in devices.into_iter().zip(&meta.devices).enumerate() {
            let sb = Superblock::read_from(&*dev)?;
            if sb.pool_id != meta.pool_id || sb.index as usize != i || sb.units != units {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "data device {} is not device {i} of pool {name}",
                        dev.describe()
                    ),
                ));
            }
            slots.push((dev, units));
        }
        let may_block = metadata_may_block || slots.iter().any(|(d, _)| d.capabilities().may_block);
        let layout = Layout::new(meta.unit_size, slots);
        let space = Space::new(layout.total_units(), loaded.refs.clone())?;
        let limits = Limits::new(name, layout.total_units(), meta.unit_size);
        let volumes = loaded
            .volumes
            .into_iter()
            .map(|(id, (record, map))| {
                let map = map.into_iter().collect();
                (id, VolumeState { record, map })
            })
            .collect();
        Ok(Arc::new(Pool {
            name: name.to_string(),
            layout,
            store,
            state: RwLock::new(State {
                volumes,
                next_volume_id: loaded.next_volume_id,
                space,
                dirty: Dirty::default(),
                limits,
            }),
            commit_lock: Mutex::new(()),
            may_block,
            send_holds: SendHolds::default(),
            allocation_failures: Pool::new_failure_log(),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether I/O to the pool's volumes may wait on storage.
    pub fn may_block(&self) -> bool {
        self.may_block
    }

    pub fn unit_size(&self) -> u64 {
        self.layout.unit_size()
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub fn space(&self) -> PoolSpace {
        let st = self.state.read();
        PoolSpace {
            unit_size: self.layout.unit_size(),
            total_units: st.space.total(),
            used_units: st.space.used(),
            held_units: st.space.held(),
            free_units: st.space.free(),
        }
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        let st = self.state.read();
        st.volumes.keys().filter_map(|&id| st.info(id)).collect()
    }

    pub fn volume_info(&self, name: &str) -> io::Result<VolumeInfo> {
        let st = self.state.read();
        let id = st.id_of(name)?;
        st.info_of(id)
    }

    /// The volume (or snapshot, read-only) as a block device.
    pub fn volume(self: &Arc<Self>, name: &str) -> io::Result<VolumeDevice> {
        let st = self.state.read();
        let id = st.id_of(name)?;
        let read_only = st.volumes[&id].record.kind == VolumeKind::Snapshot;
        Ok(VolumeDevice::new(self.clone(), id, read_only))
    }

    /// Makes every completed write durable: data devices first, then the
    /// mappings that point at the data.
    pub fn flush(&self) -> io::Result<()> {
        let _order = self.commit_lock.lock();
        let delta = self.state.write().take_delta();
        if delta.is_empty() {
            // Nothing to commit: in-place writes only need the data flush.
            return self.layout.flush();
        }
        if let Err(e) = self.layout.flush().and_then(|()| self.store.apply(&delta)) {
            self.state.write().restore_delta(delta);
            return Err(e);
        }
        self.finish_commit(&delta);
        Ok(())
    }

    fn finish_commit(&self, delta: &Delta) {
        let freed = self.release_freed(&delta.freed);
        self.state.write().space.committed(&delta.refs, &freed);
    }

    /// The units a commit freed that are free now, released to their
    /// devices; those whose pages wait to be sent stay held until then.
    fn release_freed(&self, freed: &[u64]) -> Vec<u64> {
        let now = self.send_holds.free_now(freed);
        for &unit in &now {
            // Only a hint to thin data devices; the unit is free either way.
            let _ = self.layout.release(unit);
        }
        now
    }

    /// A unit a commit freed while its pages waited to be sent: sent now.
    pub(crate) fn free_kept_back(&self, unit: u64) {
        let _ = self.layout.release(unit);
        self.state
            .write()
            .space
            .committed(&BTreeMap::new(), &[unit]);
    }

    /// Runs a volume operation and commits it before any I/O sees its
    /// effect. `op` must check everything before it changes anything.
    pub(crate) fn operate<R>(&self, op: impl FnOnce(&mut State) -> io::Result<R>) -> io::Result<R> {
        let _order = self.commit_lock.lock();
        let mut st = self.state.write();
        let out = op(&mut st)?;
        let delta = st.take_delta();
        if let Err(e) = self.layout.flush().and_then(|()| self.store.apply(&delta)) {
            st.restore_delta(delta);
            return Err(e);
        }
        let freed = self.release_freed(&delta.freed);
        st.space.committed(&delta.refs, &freed);
        Ok(out)
    }
}
